// gated_act: the gated MLP activation after the fused gate+up projection.
//   out[t, f] = act(gu[t, f]) * gu[t, F + f]      (rows of gu = [gate: F | up: F])
//   INTERLEAVED: out[t, f] = act(gu[t, 2f]) * gu[t, 2f + 1]   (rows of gu = (gate, up) pairs, the
//   layout of a GLU projection's weight: src/ops/matmul/mod.rs `LinearOpts::glu`)
// act: include/activation.wgsl (SiLU, or GELU-tanh with the macro GELU_TANH), NaN-free.
// Grid: 1-D over ceil(n_tokens * F / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/elementwise.rs gated_act_in
#define WG 256
#include "activation"

struct Params {
    n_tokens: u32,
    f: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> gu: array<f32>;         // (T, 2F): [gate | up] or pairs
@group(0) @binding(1) var<storage, read_write> out: array<f32>;  // (T, F)
@group(0) @binding(2) var<uniform> p: Params;

#include "entry_thread"
    if (i >= p.n_tokens * p.f) {
        return;
    }
    let t = i / p.f;
    let j = i - t * p.f;
#ifdef INTERLEAVED
    let g = gu[t * 2u * p.f + 2u * j];
    let u = gu[t * 2u * p.f + 2u * j + 1u];
#else
    let g = gu[t * 2u * p.f + j];
    let u = gu[t * 2u * p.f + p.f + j];
#endif
    out[i] = act(g) * u;
}
