// rms_norm_gated: Qwen3_5MoeRMSNormGated after the gated delta rule, in place per (token, head):
//   x[t, h, :] = x[t, h, :] * inverseSqrt(mean(x[t, h, :]^2) + eps) * w * silu(z[t, h, :])
// (w plain, not 1 + w). z is read from its columns of the in_proj output (row stride ld_z).
// Grid: one workgroup per (token, head), T * H workgroups, 2-D folded (gpu/kernel.rs); rows
// t >= step.n_tokens are skipped. Macros: WG (threads, a power of two).
// Rust: src/ops/deltanet.rs rms_norm_gated
#define WG 64

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 5
#include "step"

struct Params {
    heads: u32,   // H
    dim: u32,     // D: elements of a head
    ld_z: u32,    // row stride of z's buffer
    z_col: u32,   // first column of z
    n_rows: u32,  // T the kernel was recorded for
    eps: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;  // (T, H * D) normalized and gated in place
@group(0) @binding(1) var<storage, read> z: array<f32>;        // (T, ld_z): the gate at columns z_col .. z_col + H * D
@group(0) @binding(2) var<storage, read> w: array<f32>;        // (D)
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> red: array<f32, {{WG}}>;

#include "entry"
    let idx = wid.x + wid.y * nwg.x;
    let t = idx / p.heads;
    let h = idx % p.heads;
    if (t >= step.n_tokens || t >= p.n_rows) {
        return;  // uniform across the workgroup
    }
    let base = t * p.heads * p.dim + h * p.dim;
    var ss = 0.0;
    for (var i = lid; i < p.dim; i += {{WG}}u) {
        let v = x[base + i];
        ss += v * v;
    }
#define TREE red
#define TREE_V ss
#define TREE_H s
#include "tree_sum"
    let r = inverseSqrt(red[0] / f32(p.dim) + p.eps);
    let zb = t * p.ld_z + p.z_col + h * p.dim;
    for (var i = lid; i < p.dim; i += {{WG}}u) {
        let g = z[zb + i];
        x[base + i] = x[base + i] * r * w[i] * (g / (1.0 + exp(-g)));
    }
}
