// kv_cache_write: copies the k and v parts of qkv rows t < step.n_tokens into the f16 K/V caches
// of the token's slot at its position (include/step). One thread per pair of halves (one u32 word
// of each cache).
// f32 -> f16 is done in integer arithmetic with round-to-nearest-even (as torch's .half()), so the
// stored bits are the same on every device (drivers may round pack2x16float either way).
// Grid: ceil(T * Hkv * D/2 / WG) workgroups, 2-D folded (gpu/kernel.rs).
// Rust: src/ops/attention.rs kv_cache_write
#define WG 256

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 5
#include "step"

struct Params {
    kv_heads: u32,    // Hkv
    half_dim: u32,    // D / 2
    q_dim: u32,       // H * D: offset of k in a qkv row
    row_stride: u32,  // (H + 2 Hkv) * D
    max_ctx: u32,
    n_rows: u32,      // T the kernel was recorded for
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;            // (T, (H + 2 Hkv) * D): [q | k | v]
@group(0) @binding(1) var<storage, read_write> k_cache: array<u32>;  // (S, Hkv, max_ctx, D) f16, packed pairs
@group(0) @binding(2) var<storage, read_write> v_cache: array<u32>;  // (S, Hkv, max_ctx, D) f16, packed pairs
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

#include "attention_f16"

#include "entry_thread"
    let per_token = p.kv_heads * p.half_dim;
    let t = i / per_token;
    let r = i % per_token;
    let pos = tok_pos(t);
    if (t >= step.n_tokens || t >= p.n_rows || pos >= p.max_ctx) {
        return;
    }
    let g = r / p.half_dim;
    let w = r % p.half_dim;
    let src = t * p.row_stride + p.q_dim + 2u * r; // k head g, dims 2w, 2w + 1
    let vsrc = src + p.kv_heads * p.half_dim * 2u;
    let dst = ((tok_slot(t) * p.kv_heads + g) * p.max_ctx + pos) * p.half_dim + w;
    k_cache[dst] = pack_rne(qkv[src], qkv[src + 1u]);
    v_cache[dst] = pack_rne(qkv[vsrc], qkv[vsrc + 1u]);
}
