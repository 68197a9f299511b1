// mul_sigmoid: x *= sigmoid(g), elementwise over n f32 values (Qwen3.5's attention output gate:
// `attn_output * torch.sigmoid(gate)` before o_proj). sigmoid as 1 / (1 + exp(-g)): exp overflows
// to +inf for g < -88, giving exactly 0, never NaN.
// Grid: 1-D over ceil(n / WG) workgroups, 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/elementwise.rs mul_sigmoid
#define WG 256

struct Params {
    n: u32,
    _pad0: u32,  // the host writes 16 bytes (Rust: the struct's twin, checked by a test)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;  // (T, C) scaled in place
@group(0) @binding(1) var<storage, read> g: array<f32>;        // (T, C) gate logits
@group(0) @binding(2) var<uniform> p: Params;

#include "entry_thread"
    if (i < p.n) {
        x[i] = x[i] / (1.0 + exp(-g[i]));
    }
}
