// token_counts: after a draw, each controlled row's sampled id is counted into its sequence's
// slot of the logit-control state (spec and layout: src/sampling/penalty.rs): the generated
// count c[t], and for the repetition penalty the window count w[t] with a ring of the last
// `window` ids (the id leaving the window is uncounted first). It reads the id from the buffer
// the sampler wrote, so the next step's sample_penalty sees it without a readback.
// One thread a controlled row (rows hold distinct slots).
// Rust: src/sampling/penalty.rs token_counts
#define WG 64

#include "logit_controls"

@group(0) @binding(0) var<storage, read> ids: array<u32>;         // the sampled ids, one a row
@group(0) @binding(1) var<storage, read_write> state: array<u32>;  // [slots, stride]
@group(0) @binding(2) var<storage, read> rows: array<Row>;
@group(0) @binding(3) var<uniform> info: Info;

#include "entry_thread"
    if (i >= info.rows) {
        return;
    }
    let r = rows[i];
    let t = ids[r.row];
    if (t >= info.vocab) {
        return;
    }
    let slot = r.slot * info.stride;
    let c = slot + 4u;
    let w = c + info.vocab;
    let ring = c + 3u * info.vocab;
    let len = state[slot];
    state[c + t] = state[c + t] + 1u;
    if (r.window == 0xFFFFFFFFu) {
        state[w + t] = state[w + t] + 1u;
    } else if (r.window > 0u) {
        if (len >= r.window) {
            let old = state[ring + (len - r.window) % info.hist];
            state[w + old] = state[w + old] - 1u;
        }
        state[ring + len % info.hist] = t;
        state[w + t] = state[w + t] + 1u;
    }
    state[slot] = len + 1u;
}
