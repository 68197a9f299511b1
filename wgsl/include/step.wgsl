// The per-pass uniform: Rust's `ops::StepParams` (its layout is checked against this struct by the
// test in src/ops/uniform_registry.rs). One sequence per pass: token t of the pass is at position pos + t of
// KV-cache slot `slot`.
struct Step {
    pos: u32,      // position of the pass's first token
    n_tokens: u32, // tokens in the pass (T); kernels were recorded for at most this many
    slot: u32,     // the sequence's KV-cache slot
    _pad: u32,
}

#ifdef BATCH
// BATCH: each token of the pass is a sequence of its own (a decode step of many sequences):
// token t is at position seqs[t].x of slot seqs[t].y. Binding number: macro SEQS.
@group(0) @binding({{SEQS}}) var<storage, read> seqs: array<vec2<u32>>; // (T) (position, slot)

fn tok_pos(t: u32) -> u32 {
    return seqs[t].x;
}

fn tok_slot(t: u32) -> u32 {
    return seqs[t].y;
}
#else
fn tok_pos(t: u32) -> u32 {
    return step.pos + t;
}

fn tok_slot(t: u32) -> u32 {
    return step.slot;
}
#endif
