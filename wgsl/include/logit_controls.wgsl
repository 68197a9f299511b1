// logit_controls: what sample_penalty and token_counts share (src/sampling/penalty.rs): the
// uniform and the per-row record of a controlled row.

struct Info {
    rows: u32,    // controlled rows (records)
    vocab: u32,
    stride: u32,  // u32 words a slot (penalty::layout)
    hist: u32,    // ring length a slot (MAX_WINDOW)
    zero: u32,    // 0: the rounding barriers' operand
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

// penalty::ControlRow
struct Row {
    row: u32,       // the row of the logits and of the sampled ids
    slot: u32,      // the sequence's slot of the state
    flags: u32,     // 1 bias, 2 repetition, 4 presence / frequency
    window: u32,    // 0 off, 0xFFFFFFFF every token, else the window's length (<= hist)
    repeat: f32,
    inv_repeat: f32,  // 1 / repeat, from the host
    presence: f32,
    frequency: f32,
}
