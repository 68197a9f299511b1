// attention_params: the uniform of the attention kernels (attention.wgsl, its merge included, and
// attention_decode.wgsl), filled by src/ops/attention.rs `AttnParams::uniform`, and the pass's
// Step. The including kernel defines D.

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 8
#include "step"

struct Params {
    heads: u32,       // H
    kv_heads: u32,    // Hkv
    max_ctx: u32,
    window: u32,      // 0: full causal
    scale: f32,
    n_rows: u32,      // T the kernel was recorded for (1 for attention_decode without BATCH)
    _pad0: u32,
    _pad1: u32,
}

const NEG: f32 = -1.0e30;
const DU: u32 = {{D}}u / 4u; // 4-dim units per head (vec4<f32> of q, vec2<u32> of f16)
