// rope: rotary position embedding, NeoX / Hugging Face `rotate_half` style (pairs (i, i + ROT/2)
// over the first ROT dims of a head; the other D - ROT dims pass through: partial rotary, Qwen3.5),
// in place on the first H + Hkv heads (q heads, then k heads) of each qkv row; token t of the
// pass is at position tok_pos(t) (step.pos + t; with BATCH its own sequence's: include/step).
// With QK_NORM, each head is first RMS-normalized over D with
// its weight (q_norm for q heads, k_norm for k heads): Qwen3 / Gemma 3 q/k norm in the same pass.
//
// Angles as Hugging Face computes them, in f32: angle_i = f32(pos) * inv_freq_i, with inv_freq
// (already divided by the linear scaling factor) from the host. sin/cos come from `sincos`
// below, which is accurate at any position (the drivers' sin/cos are only specified on [-pi, pi]).
//
// KV_WRITE: also writes the rotated k head and its v head to the f16 KV caches of the token's slot
// (S slots of Hkv heads) at its position (what kv_cache_write does, fused to save a dispatch per layer).
// With KV_WRITE, K_EQ_V takes each value head from its k head as the projection wrote it (before
// the norm and the rotation: Gemma 4's `attention_k_eq_v`; the row's v part is not read), and
// V_NORM writes the value head RMS-normalized without a weight (Gemma 4's `v_norm`).
//
// Proportional RoPE (Gemma 4) is this kernel with ROT = D and an inv_freq table whose entries past
// the turning pairs are 0 (angle 0: cos 1, sin 0, the pair passes through unchanged).
//
// Grid: one workgroup per (token, head), T * (H + Hkv) workgroups, 2-D folded (gpu/kernel.rs);
// rows t >= step.n_tokens are skipped. Macros: D (head dim, even), ROT (rotated dims, even, <= D),
// WG (threads); with KV_WRITE,
// KC and VC (binding numbers of the caches).
// Rust: src/ops/rope.rs record
#define WG 64
// Defaults for validation; src/ops/rope.rs sets them.
#define D 64
#define ROT 64
#define KC 6
#define VC 7

// BATCH (include/step.wgsl): the binding of the pass's (position, slot) per token.
#define SEQS 8
#include "step"

struct Params {
    heads: u32,       // H + Hkv: heads rotated in each row
    q_heads: u32,     // H: heads below this are q heads
    row_stride: u32,  // (H + 2 Hkv) * D
    n_rows: u32,      // T the kernel was recorded for
    eps: f32,         // QK_NORM epsilon
    max_ctx: u32,     // KV_WRITE: positions in the caches
    _pad1: u32,
    _pad2: u32,
}

const HALF: u32 = {{ROT}}u / 2u;
const DHALF: u32 = {{D}}u / 2u;

@group(0) @binding(0) var<storage, read_write> qkv: array<f32>;  // (T, (H + 2 Hkv) * D): [q | k | v], q and k rotated in place
@group(0) @binding(1) var<storage, read> inv_freq: array<f32>;   // (ROT / 2)
@group(0) @binding(2) var<uniform> step: Step;
@group(0) @binding(3) var<uniform> p: Params;
#ifdef QK_NORM
@group(0) @binding(4) var<storage, read> q_norm: array<f32>;     // (D)
@group(0) @binding(5) var<storage, read> k_norm: array<f32>;     // (D)
#endif

// The norms' reductions (QK_NORM, V_NORM).
var<workgroup> red: array<f32, {{WG}}>;

// The sum over the workgroup of each thread's `v` (every thread gets it).
fn workgroup_sum(lid: u32, v: f32) -> f32 {
    workgroupBarrier();
#define TREE red
#define TREE_V v
#define TREE_H s
#include "tree_sum"
    return red[0];
}
#ifdef KV_WRITE
@group(0) @binding({{KC}}) var<storage, read_write> k_cache: array<u32>; // (S, Hkv, max_ctx, D) f16, packed pairs
@group(0) @binding({{VC}}) var<storage, read_write> v_cache: array<u32>; // (S, Hkv, max_ctx, D) f16, packed pairs

var<workgroup> row_s: array<f32, {{D}}>; // the rotated head
var<workgroup> row_v: array<f32, {{D}}>; // the value head as written to the cache

#include "attention_f16"
#endif

#include "sincos"

#include "entry"
    let idx = wid.x + wid.y * nwg.x;
    let t = idx / p.heads;
    let head = idx % p.heads;
    if (t >= step.n_tokens || t >= p.n_rows) {
        return;
    }
    let base = t * p.row_stride + head * {{D}}u;
    let pos = f32(tok_pos(t));
#ifdef KV_WRITE
    // The value head, before this workgroup changes the row: from the k head itself (K_EQ_V) or
    // from the row's v part.
    if (head >= p.q_heads) {
#ifdef K_EQ_V
        let vbase = base;
#else
        let vbase = base + (p.heads - p.q_heads) * {{D}}u;
#endif
        for (var i = lid; i < {{D}}u; i += {{WG}}u) {
            row_v[i] = qkv[vbase + i];
        }
#ifdef V_NORM
        var vs = 0.0;
        for (var i = lid; i < {{D}}u; i += {{WG}}u) {
            vs += row_v[i] * row_v[i];
        }
        let v_inv_rms = inverseSqrt(workgroup_sum(lid, vs) / f32({{D}}u) + p.eps);
        for (var i = lid; i < {{D}}u; i += {{WG}}u) {
            row_v[i] = row_v[i] * v_inv_rms;
        }
#endif
        workgroupBarrier();
    }
#endif
#ifdef QK_NORM
    var ss = 0.0;
    for (var i = lid; i < {{D}}u; i += {{WG}}u) {
        let x = qkv[base + i];
        ss += x * x;
    }
    let inv_rms = inverseSqrt(workgroup_sum(lid, ss) / f32({{D}}u) + p.eps);
    let is_q = head < p.q_heads;
#endif
    for (var i = lid; i < HALF; i += {{WG}}u) {
        var x1 = qkv[base + i];
        var x2 = qkv[base + i + HALF];
#ifdef QK_NORM
        var w1 = k_norm[i];
        var w2 = k_norm[i + HALF];
        if (is_q) {
            w1 = q_norm[i];
            w2 = q_norm[i + HALF];
        }
        x1 = x1 * inv_rms * w1;
        x2 = x2 * inv_rms * w2;
#endif
        let sc = sincos(pos * inv_freq[i]);
        let y1 = x1 * sc.y - x2 * sc.x;
        let y2 = x2 * sc.y + x1 * sc.x;
        qkv[base + i] = y1;
        qkv[base + i + HALF] = y2;
#ifdef KV_WRITE
        row_s[i] = y1;
        row_s[i + HALF] = y2;
#endif
    }
    // Dims past ROT: normalized (QK_NORM), not rotated.
    for (var i = {{ROT}}u + lid; i < {{D}}u; i += {{WG}}u) {
        var x = qkv[base + i];
#ifdef QK_NORM
        var w = k_norm[i];
        if (is_q) {
            w = q_norm[i];
        }
        x = x * inv_rms * w;
        qkv[base + i] = x;
#endif
#ifdef KV_WRITE
        row_s[i] = x;
#endif
    }
#ifdef KV_WRITE
    if (head >= p.q_heads) {
        workgroupBarrier();
        let g = head - p.q_heads;
        let kv_pos = tok_pos(t);
        let kv_heads = p.heads - p.q_heads;
        if (kv_pos < p.max_ctx) {
            let dst = ((tok_slot(t) * kv_heads + g) * p.max_ctx + kv_pos) * DHALF;
            for (var w = lid; w < DHALF; w += {{WG}}u) {
                k_cache[dst + w] = pack_rne(row_s[2u * w], row_s[2u * w + 1u]);
                v_cache[dst + w] = pack_rne(row_v[2u * w], row_v[2u * w + 1u]);
            }
        }
    }
#endif
}
