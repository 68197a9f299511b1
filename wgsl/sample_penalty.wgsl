// sample_penalty: a decode step's logit controls (logit_bias, the repetition penalty over a
// window, frequency and presence penalties; spec: src/sampling/penalty.rs) applied in place to
// the rows of f32 logits that have them, before the sampler reads them. Each row's counts come
// from its sequence's slot of the state buffer (kept by token_counts). Bit for bit
// penalty::control_logit: every f32 operation is rounded through include/philox's fr (no FMA,
// no reassociation), and the kernel never divides (1 / repeat comes from the host).
// Grid: (ceil(V / WG), controlled rows); one logit a thread.
// Rust: src/sampling/penalty.rs sample_penalty
#define WG 256
#include "philox"

#include "logit_controls"

@group(0) @binding(0) var<storage, read_write> logits: array<f32>;  // [rows, V], rewritten in place
@group(0) @binding(1) var<storage, read> state: array<u32>;         // [slots, stride] (penalty::layout)
@group(0) @binding(2) var<storage, read> rows: array<Row>;
@group(0) @binding(3) var<uniform> info: Info;

#include "entry"
    fr_zero = info.zero;
    let i = wid.x * {{WG}}u + lid;
    let k = wid.y;
    if (i >= info.vocab || k >= info.rows) {
        return;
    }
    let r = rows[k];
    let base = r.slot * info.stride + 4u;  // c[V], then w[V], then the bias bits b[V]
    let at = r.row * info.vocab + i;
    var l = logits[at];
    if ((r.flags & 1u) != 0u) {
        let b = bitcast<f32>(state[base + 2u * info.vocab + i]);
        if (b != 0.0) {
            l = fr(l + b);
        }
    }
    if ((r.flags & 2u) != 0u && state[base + info.vocab + i] > 0u) {
        l = fr(l * select(r.repeat, r.inv_repeat, l > 0.0));
    }
    if ((r.flags & 4u) != 0u) {
        let c = state[base + i];
        if (c > 0u) {
            l = fr(l - fr(r.frequency * f32(c)));
            l = fr(l - r.presence);
        }
    }
    logits[at] = l;
}
