// causal_conv1d: the depthwise causal convolution of Gated DeltaNet (Qwen3.5's
// `causal_conv1d_fn` / `causal_conv1d_update`), SiLU after it:
//   out[t, c] = silu(sum_{j < K} w[c, j] * xx[t + j, c]),  xx = [state (K-1 rows) ; x (T rows)]
// then the state becomes the last K-1 rows of xx. Token t of the pass is at position step.pos + t.
//
// The state is a ring of R states per sequence slot of the caches (the buffer is (slots * R, K-1,
// C), sequence slot s's ring at s * R): the state after position p (the last K-1 inputs before p)
// lives in ring state p % R. A pass at pos with n tokens reads pos % R of its slot (zeros when
// pos == 0: a new sequence needs no reset) and writes (pos + n) % R, so rolling back to a recent
// pass end finds its state intact (src/model/forward.rs keeps the bookkeeping). A pass of one
// sequence is in slot step.slot.
//
// Grid: one thread per channel, ceil(C / WG) workgroups, 2-D folded (gpu/kernel.rs); each thread
// walks the pass's tokens with the window in registers, so the state it reads and the one it
// writes (possibly the same) are its own. BATCH (a decode step of many sequences): grid z is the
// step's row, a sequence of its own at (tok_pos(row), tok_slot(row)) (include/step.wgsl): one
// token from its own state, the arithmetic of a one-token pass. Macros: K (taps, <= 8), WG.
// Rust: src/ops/deltanet.rs causal_conv1d
#define WG 64
#define K 4

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 6
#include "step"

struct Params {
    channels: u32,  // C
    ld_x: u32,      // row stride of x (the in_proj output: C = its first columns)
    n_rows: u32,    // T the kernel was recorded for
    ring: u32,      // R
}

@group(0) @binding(0) var<storage, read> x: array<f32>;           // (T, ld_x), columns 0..C
@group(0) @binding(1) var<storage, read> w: array<f32>;           // (C, K)
@group(0) @binding(2) var<storage, read_write> state: array<f32>; // (slots * R, K-1, C)
@group(0) @binding(3) var<storage, read_write> out: array<f32>;   // (T, C)
@group(0) @binding(4) var<uniform> step: Step;
@group(0) @binding(5) var<uniform> p: Params;

#include "entry"
    let c = (wid.x + wid.y * nwg.x) * {{WG}}u + lid;
    if (c >= p.channels) {
        return;
    }
    var n = min(step.n_tokens, p.n_rows);
    var t0 = 0u;
    var pos = step.pos;
    var slot = step.slot;
#ifdef BATCH
    // This workgroup's row of the step.
    t0 = wid.z;
    if (t0 >= n) {
        return;
    }
    n = 1u;
    pos = tok_pos(t0);
    slot = tok_slot(t0);
#endif
    let slot_size = ({{K}}u - 1u) * p.channels;
    let src = (slot * p.ring + pos % p.ring) * slot_size;
    let dst = (slot * p.ring + (pos + n) % p.ring) * slot_size;
    var win: array<f32, {{K}}>;
    var taps: array<f32, {{K}}>;
    for (var j = 0u; j < {{K}}u; j++) {
        taps[j] = w[c * {{K}}u + j];
    }
    for (var j = 0u; j + 1u < {{K}}u; j++) {
        win[j] = select(state[src + j * p.channels + c], 0.0, pos == 0u);
    }
    for (var t = t0; t < t0 + n; t++) {
        win[{{K}}u - 1u] = x[t * p.ld_x + c];
        var acc = 0.0;
        for (var j = 0u; j < {{K}}u; j++) {
            acc += taps[j] * win[j];
        }
        out[t * p.channels + c] = acc / (1.0 + exp(-acc));
        for (var j = 0u; j + 1u < {{K}}u; j++) {
            win[j] = win[j + 1u];
        }
    }
    for (var j = 0u; j + 1u < {{K}}u; j++) {
        state[dst + j * p.channels + c] = win[j];
    }
}
