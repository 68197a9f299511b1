// moe_combine: the end of a mixture-of-experts layer (src/ops/moe.rs), added to the residual
// stream:
//   x[t, h] += sum_j w[t, j] · y[t · k + j, h]  (+ sigmoid(gate[t · gate_ld + gate_col]) · shared[t, h])
// with y (T · k, H) the experts' outputs (slot t · k + j: token t's j-th chosen expert), w (T, k)
// their weights, and with SHARED the shared expert's output (T, H) gated by a logit read from a
// strided column of another buffer (e.g. the router's logits, whose column E holds it: a view
// there would break the 256-byte storage offset alignment). Sums in f32, in the order written.
// One thread per element of x; grid 2-D folded (see gpu/kernel.rs).
// Rust: src/ops/moe.rs moe_combine
#define WG 256

struct Params {
    t: u32,         // T, tokens
    h: u32,         // H, x's columns
    k: u32,         // k, experts per token
    gate_ld: u32,   // SHARED: row stride of gate, in elements
    gate_col: u32,  // SHARED: the gate logit's column
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> x: array<f32>;   // (T, H)
@group(0) @binding(1) var<storage, read> y: array<f32>;         // (T · k, H)
@group(0) @binding(2) var<storage, read> w: array<f32>;         // (T, k)
@group(0) @binding(3) var<uniform> p: Params;
#ifdef SHARED
@group(0) @binding(4) var<storage, read> shared_out: array<f32>; // (T, H)
@group(0) @binding(5) var<storage, read> gate: array<f32>;       // (T, gate_ld)
#endif

#include "entry_thread"
    if (i >= p.t * p.h) {
        return;
    }
    let t = i / p.h;
    let h = i % p.h;
    var acc = 0.0;
    for (var j = 0u; j < p.k; j++) {
        let s = t * p.k + j;
        acc += w[s] * y[s * p.h + h];
    }
#ifdef SHARED
    let g = gate[t * p.gate_ld + p.gate_col];
    // sigmoid(g) = 1 / (1 + exp(-g)), the exp argument clamped (exp(80) is finite in f32).
    acc += shared_out[i] / (1.0 + exp(clamp(-g, -80.0, 80.0)));
#endif
    x[i] += acc;
}
