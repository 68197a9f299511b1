// sample_mask: the per-row token mask of the sampler's per-group passes (sample_stats,
// sample_histogram; src/sampling/mask.rs has the spec). The including kernel binds
// `token_mask: array<u32>`: the masked rows' masks, ceil(vocab / 32) words each, bit i % 32 of
// word i / 32 set = token i allowed. A row without a mask (p.mask == 0) reads nothing.

// The allowed bits of tokens i0 .. i0 + 3 (i0 a multiple of 4, so one word holds them; bit j
// for token i0 + j): all four for a row without a mask.
fn mask_bits4(p: Params, i0: u32, vocab: u32) -> u32 {
    if (p.mask == 0u || i0 >= vocab) {
        return 0xFu;
    }
    let words = (vocab + 31u) / 32u;
    return (token_mask[(p.mask - 1u) * words + (i0 >> 5u)] >> (i0 & 31u)) & 0xFu;
}
