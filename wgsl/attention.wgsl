// attention: causal (optionally sliding-window) multi-head attention with grouped-query heads over
// the f16 KV cache; one kernel for prefill and decode (src/ops/attention.rs picks the tiling).
//
// Token t of the pass (t < step.n_tokens) is at position p = tok_pos(t) (step.pos + t, of KV-cache
// slot step.slot; with BATCH each token is a sequence of its own, at its own position and slot:
// include/step) and query head h
// (KV head g = h / G, G = H / Hkv) attends keys j in [lo(p), p], lo(p) = max(0, p + 1 - window)
// (window 0: lo = 0): out = softmax_j((q . k_j) * scale) v_j, softmax in f32 with max subtraction.
//
// Rows: a row is one (token t, query head h) pair. The G query heads sharing KV head g are rows
// t * G + (h - g * G) of that KV head, so the BQ rows of a workgroup share their K/V tiles.
// Workgroup (x, y, z) = (row block, KV head g, key split). The block walks its key range in tiles
// of BK keys staged in workgroup memory as packed f16 (K, then V in the same buffer), with a
// flash-attention online softmax (running max m and sum l per row, accumulator rescaled when m
// grows). Threads: WG = BQ * LPR, thread (r, j) = (tid / LPR, tid % LPR):
//   scores:  lane j of row r computes keys j + LPR * i, i < KPL (= BK / LPR <= 4), dot over D;
//   softmax: per-row max and sum through workgroup memory (no subgroup size is assumed);
//   P V:     lane j owns the 4-dim units j + LPR * s, s < NW (<= 8), accumulated in registers.
// Global loads are 16-byte vectors, LD (<= 8) per thread per tile, all issued before any is
// used, and early: the next K tile during this tile's P V, the V tile during the softmax.
// Per-thread state is named registers (slots 0..7 behind constant guards, which the compilers
// fold), never a dynamically indexed array: naga's loops are not unrolled by the drivers, and
// such an array would live in slow local memory.
// Masked scores are a finite NEG sentinel and masked probabilities exactly 0 (no infinities:
// fast-math compilers may assume there are none); K/V past the range are loaded as 0.
//
// BATCH (decode of many sequences, one token each): a row block is one token's G query heads
// (rows r >= G of the block idle), so a block reads one slot's keys; with the tiling of a
// one-token pass, each sequence's numbers are those it gets alone.
//
// SPLIT (NSPLIT > 1, flash decoding): the block's key range is cut into NSPLIT parts of whole
// tiles, one per workgroup z; each writes its unnormalized accumulator and (m, l), and the MERGE
// entry (this file compiled with MERGE) combines them. Without SPLIT the output is written here.
//
// ROPE (decode, one token, no q/k norm): q and k arrive unrotated and this kernel does what
// rope with KV_WRITE would have done before it: queries are rotated as they are loaded, and the
// one key at the token's position is taken from qkv (k rotated, v as is) instead of the caches, rounded to
// f16 as the cache holds it, and written to both caches for the steps after (by the one workgroup
// whose tile holds it: decode has one row block per KV head). A dispatch a layer fewer.
//
// Macros: D (multiple of 16, <= 512; above 256 with Q_F16), G, BQ, LPR, WG (= BQ * LPR), BK (= KPL * LPR), KPL, NW
// (= ceil(D / 4 / LPR)), LD (= ceil(BK * D / 8 / WG)), QL (= ceil(BQ * D / 4 / WG)), NSPLIT.
// All <= 8 where slots are used.
// Rust: src/ops/attention.rs attention_with

// Defaults (a valid tiling for D = 64, G = 3) for validation; src/ops/attention.rs sets every one.
#define D 64
#define G 3
#define BQ 4
#define LPR 32
#define WG 128
#define BK 32
#define KPL 1
#define NW 1
#define LD 2
#define QL 1
#define NSPLIT 1
#define RB 7

#include "attention_params"

#ifdef MERGE
// ---- merge of the NSPLIT partials: one workgroup per (token, head) row and 8-unit (32-dim)
// chunk of it. Each workgroup reads the row's NSPLIT (m, l) in parallel, then its chunk's
// partial outputs as (unit, split group) pairs, 4 independent loads per step, and reduces over
// the 16 split groups.
@group(0) @binding(0) var<storage, read> part_o: array<vec4<f32>>;    // (NSPLIT, T * H, D) unnormalized outputs
@group(0) @binding(1) var<storage, read> part_ml: array<vec2<f32>>;   // (NSPLIT, T * H) (running max m, sum l)
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>; // (T, H * D)
@group(0) @binding(3) var<uniform> step: Step;
@group(0) @binding(4) var<uniform> p: Params;

const MW: u32 = 128u;               // threads
const CU: u32 = 8u;                 // units per chunk
const NCH: u32 = (DU + CU - 1u) / CU; // chunks per row
const SG: u32 = MW / CU;            // split groups

var<workgroup> weight: array<f32, {{NSPLIT}}>;
var<workgroup> red: array<f32, MW>;
var<workgroup> o_s: array<vec4<f32>, MW>;

fn part(s: u32, n_rows: u32, row: u32, u: u32) -> vec4<f32> {
    var o = vec4<f32>(0.0);
    if (s < {{NSPLIT}}u) {
        o = part_o[(s * n_rows + row) * DU + u] * weight[s];
    }
    return o;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = wid.x + wid.y * nwg.x;
    let row = idx / NCH;
    let n_rows = p.n_rows * p.heads;
    if (row >= n_rows || row / p.heads >= min(step.n_tokens, p.n_rows)) {
        return;
    }
    var mx = NEG;
    for (var s = lid; s < {{NSPLIT}}u; s += MW) {
        mx = max(mx, part_ml[s * n_rows + row].x);
    }
    red[lid] = mx;
    workgroupBarrier();
    for (var k = MW / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            red[lid] = max(red[lid], red[lid + k]);
        }
        workgroupBarrier();
    }
    mx = red[0];
    workgroupBarrier();
    var l = 0.0;
    for (var s = lid; s < {{NSPLIT}}u; s += MW) {
        let ml = part_ml[s * n_rows + row];
        let w = exp(ml.x - mx);
        weight[s] = w;
        l += ml.y * w;
    }
    red[lid] = l;
    workgroupBarrier();
    for (var k = MW / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            red[lid] += red[lid + k];
        }
        workgroupBarrier();
    }
    let inv = select(0.0, 1.0 / red[0], red[0] > 0.0);
    let u = min((idx % NCH) * CU + lid % CU, DU - 1u);
    let grp = lid / CU;
    var o = vec4<f32>(0.0);
    for (var s = grp; s < {{NSPLIT}}u; s += 4u * SG) {
        o += (part(s, n_rows, row, u) + part(s + SG, n_rows, row, u))
            + (part(s + 2u * SG, n_rows, row, u) + part(s + 3u * SG, n_rows, row, u));
    }
    o_s[lid] = o;
    workgroupBarrier();
    for (var k = SG / 2u; k > 0u; k >>= 1u) {
        if (grp < k) {
            o_s[lid] += o_s[lid + k * CU];
        }
        workgroupBarrier();
    }
    if (grp == 0u && (idx % NCH) * CU + lid < DU) {
        out[row * DU + u] = o_s[lid] * inv;
    }
}

#else
// ---- attention ----
#include "attention_kv"
#ifdef SPLIT
@group(0) @binding(5) var<storage, read_write> part_o: array<vec4<f32>>;  // (NSPLIT, T * H, D) unnormalized
@group(0) @binding(6) var<storage, read_write> part_ml: array<vec2<f32>>; // (NSPLIT, T * H) (m, l)
#else
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;     // (T, H * D)
#endif

const QS: u32 = DU + 1u;           // padded row stride of q_s and kv_s (in units): no bank conflicts
const PS: u32 = {{BK}}u / 4u + 1u; // padded row stride of p_s (in vec4)
const RS: u32 = {{LPR}}u / 4u;     // row stride of red_m, red_l (in vec4)

#ifdef Q_F16
// Heads wider than 256 (Gemma 4's 512): the queries staged as f16 (rounded to nearest even, as the
// keys they meet), which halves their workgroup memory so a 16-key tile fits 32 KiB.
var<workgroup> q_s: array<vec2<u32>, {{BQ}} * QS>;  // (BQ, D) the block's queries, f16
#else
var<workgroup> q_s: array<vec4<f32>, {{BQ}} * QS>;  // (BQ, D) the block's queries
#endif
var<workgroup> kv_s: array<vec2<u32>, {{BK}} * QS>; // (BK, D) K tile, then V tile, f16
var<workgroup> p_s: array<vec4<f32>, {{BQ}} * PS>;  // (BQ, BK) probabilities of the tile
var<workgroup> red_m: array<vec4<f32>, {{WG}} / 4>; // (BQ, LPR) per-lane max
var<workgroup> red_l: array<vec4<f32>, {{WG}} / 4>; // (BQ, LPR) per-lane sum

#include "attention_f16"

#ifdef ROPE
#include "sincos"

// (sin, cos) of pos · inv_freq[i] for the D/2 frequencies: one sincos per frequency per
// workgroup (rope_table), shared by every rotation of the workgroup.
var<workgroup> rope_cs: array<vec2<f32>, {{D}} / 2>;
// This workgroup's KV head and its first cache row (set by main).
var<private> rope_g: u32;
var<private> rope_base: u32;
var<private> rope_pos: u32; // the token's position
var<private> rope_row: u32; // its first unit in qkv

fn rope_table(tid: u32) {
    for (var i = tid; i < {{D}}u / 2u; i += {{WG}}u) {
        rope_cs[i] = sincos(f32(rope_pos) * inv_freq[i]);
    }
    workgroupBarrier();
}

// Unit u (dims 4u .. 4u + 3) of the head whose first unit in qkv is `hb`, rotated to position
// rope_pos as the rope kernel rotates it (pairs (i, i + D/2)).
fn rope_unit(hb: u32, u: u32) -> vec4<f32> {
    let half = DU / 2u;
    let x = qkv[hb + u];
    let xp = qkv[hb + select(u + half, u - half, u >= half)];
    let i0 = 4u * (u % half);
    let s0 = rope_cs[i0];
    let s1 = rope_cs[i0 + 1u];
    let s2 = rope_cs[i0 + 2u];
    let s3 = rope_cs[i0 + 3u];
    let c = vec4<f32>(s0.y, s1.y, s2.y, s3.y);
    let sn = vec4<f32>(s0.x, s1.x, s2.x, s3.x);
    if (u < half) {
        return x * c - xp * sn;
    }
    return x * c + xp * sn;
}

// The 8 halves of cache unit w of this step's key (rotated) or value of KV head g, from qkv.
fn current_kv(g: u32, w: u32, value: bool) -> vec4<u32> {
    var a: vec4<f32>;
    var b: vec4<f32>;
    if (value) {
        let hb = rope_row + (p.heads + p.kv_heads + g) * DU;
        a = qkv[hb + 2u * w];
        b = qkv[hb + 2u * w + 1u];
    } else {
        let hb = rope_row + (p.heads + g) * DU;
        a = rope_unit(hb, 2u * w);
        b = rope_unit(hb, 2u * w + 1u);
    }
    return vec4<u32>(pack_rne(a.x, a.y), pack_rne(a.z, a.w), pack_rne(b.x, b.y), pack_rne(b.z, b.w));
}
#endif

// Slot s of this thread's share of a tile: 8 halves of key e / DV, starting at key `base` of the
// cache (rows past `nk` are zeros). With ROPE the key at rope_pos comes from qkv, and is stored.
fn load_k(s: u32, tid: u32, base: u32, nk: u32) -> vec4<u32> {
    let e = tid + {{WG}}u * s;
    var v = vec4<u32>(0u);
    if (e / DV < nk) {
        let at = (base + e / DV) * DV + e % DV;
#ifdef ROPE
        if (base + e / DV == rope_base + rope_pos) {
            v = current_kv(rope_g, e % DV, false);
            k_cache[at] = v;
            return v;
        }
#endif
        v = k_cache[at];
    }
    return v;
}

fn load_v(s: u32, tid: u32, base: u32, nk: u32) -> vec4<u32> {
    let e = tid + {{WG}}u * s;
    var v = vec4<u32>(0u);
    if (e / DV < nk) {
        let at = (base + e / DV) * DV + e % DV;
#ifdef ROPE
        if (base + e / DV == rope_base + rope_pos) {
            v = current_kv(rope_g, e % DV, true);
            v_cache[at] = v;
            return v;
        }
#endif
        v = v_cache[at];
    }
    return v;
}

fn store_kv(s: u32, tid: u32, v: vec4<u32>) {
    let e = tid + {{WG}}u * s;
    if (e < {{BK}}u * DV) {
        let i = (e / DV) * QS + 2u * (e % DV);
        kv_s[i] = v.xy;
        kv_s[i + 1u] = v.zw;
    }
}

// Slot s of this thread's share of the block's queries (zeros for rows past the tokens).
fn load_q(s: u32, tid: u32, row0: u32, g: u32, n_tok: u32, stride: u32) -> vec4<f32> {
    let e = tid + {{WG}}u * s;
    let rw = row0 + e / DU;
    let t = rw / {{G}}u;
    var q = vec4<f32>(0.0);
#ifdef BATCH
    let own = e / DU < {{G}}u; // the block's token's heads only
#else
    let own = true;
#endif
    if (e < {{BQ}}u * DU && t < n_tok && own) {
#ifdef ROPE
        q = rope_unit(t * stride + (g * {{G}}u + rw % {{G}}u) * DU, e % DU);
#else
        q = qkv[t * stride + (g * {{G}}u + rw % {{G}}u) * DU + e % DU];
#endif
    }
    return q;
}

fn store_q(s: u32, tid: u32, q: vec4<f32>) {
    let e = tid + {{WG}}u * s;
    if (e < {{BQ}}u * DU) {
#ifdef Q_F16
        q_s[(e / DU) * QS + e % DU] = vec2<u32>(pack_rne(q.x, q.y), pack_rne(q.z, q.w));
#else
        q_s[(e / DU) * QS + e % DU] = q;
#endif
    }
}

// Score of slot i (key kb + j + LPR * i) for a row seeing keys [lo, hi]: scaled dot, or NEG.
fn masked(d: f32, i: u32, live: bool, j: u32, kb: u32, nk: u32, lo: u32, hi: u32) -> f32 {
    let k = j + {{LPR}}u * i;
    let ok = i < {{KPL}}u && live && k < nk && kb + k >= lo && kb + k <= hi;
    return select(NEG, d * p.scale, ok);
}

// Unit i of q_s.
fn q_unit(i: u32) -> vec4<f32> {
#ifdef Q_F16
    return unpack4(q_s[i]);
#else
    return q_s[i];
#endif
}

// q . k over 4 units (16 dims) from q_s row unit q and kv_s key unit k.
fn kdot(q: u32, k: u32) -> f32 {
    return (dot(q_unit(q), unpack4(kv_s[k])) + dot(q_unit(q + 1u), unpack4(kv_s[k + 1u])))
        + (dot(q_unit(q + 2u), unpack4(kv_s[k + 2u])) + dot(q_unit(q + 3u), unpack4(kv_s[k + 3u])));
}

// sum_i p[i] v_(k + i) of one unit over 4 keys, from kv_s unit i of key k.
fn pv4(pk: vec4<f32>, i: u32) -> vec4<f32> {
    return (pk.x * unpack4(kv_s[i]) + pk.y * unpack4(kv_s[i + QS]))
        + (pk.z * unpack4(kv_s[i + 2u * QS]) + pk.w * unpack4(kv_s[i + 3u * QS]));
}

fn vmax(v: vec4<f32>) -> f32 {
    return max(max(v.x, v.y), max(v.z, v.w));
}

fn set_p(r: u32, k: u32, e: f32) {
    p_s[r * PS + k / 4u][k % 4u] = e;
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) tid: u32) {
    // The last row blocks have the most keys (causal): start them first.
    let blk = nwg.x - 1u - wid.x;
    let g = wid.y;
    let split = wid.z;
    let n_tok = min(step.n_tokens, p.n_rows);
#ifdef BATCH
    let row0 = blk * {{G}}u;
    let t_first = blk;
    let t_last = blk;
#else
    let row0 = blk * {{BQ}}u;
    let t_first = row0 / {{G}}u;
    let t_last = min((row0 + {{BQ}}u - 1u) / {{G}}u, n_tok - 1u);
#endif
    if (t_first >= n_tok) {
        return;
    }
    // Key range of the block, [blk_lo, blk_hi], and this split's share in whole tiles.
    let blk_lo = key_lo(tok_pos(t_first));
    let blk_hi = tok_pos(t_last);
    let n_tiles = (blk_hi - blk_lo) / {{BK}}u + 1u;
    let per = (n_tiles + {{NSPLIT}}u - 1u) / {{NSPLIT}}u;
    let k_begin = blk_lo + min(split * per, n_tiles) * {{BK}}u;
    let k_end = min(blk_lo + min((split + 1u) * per, n_tiles) * {{BK}}u, blk_hi + 1u);

    // This thread's row and lane.
    let r = tid / {{LPR}}u;
    let j = tid % {{LPR}}u;
    let row = row0 + r;
    let t = row / {{G}}u;
    let h = g * {{G}}u + row % {{G}}u;
#ifdef BATCH
    let live = t < n_tok && r < {{G}}u;
#else
    let live = t < n_tok;
#endif
    let hi = tok_pos(min(t, n_tok - 1u));
    let lo = key_lo(hi);
    let kv_base = (tok_slot(t_first) * p.kv_heads + g) * p.max_ctx;
    // PV units of this lane (clamped: lanes past D/4 duplicate the last unit, never written)
    let u0 = min(j, DU - 1u);
    let u1 = min(j + {{LPR}}u, DU - 1u);
    let u2 = min(j + 2u * {{LPR}}u, DU - 1u);
    let u3 = min(j + 3u * {{LPR}}u, DU - 1u);
    let u4 = min(j + 4u * {{LPR}}u, DU - 1u);
    let u5 = min(j + 5u * {{LPR}}u, DU - 1u);
    let u6 = min(j + 6u * {{LPR}}u, DU - 1u);
    let u7 = min(j + 7u * {{LPR}}u, DU - 1u);

#ifdef ROPE
    rope_g = g;
    rope_base = kv_base;
    rope_pos = tok_pos(t_first);
    rope_row = t_first * (p.heads + 2u * p.kv_heads) * DU;
    rope_table(tid);
#endif
    // Queries, and the first K tile, all loads in flight together.
    let stride = (p.heads + 2u * p.kv_heads) * DU;
    var q0 = load_q(0u, tid, row0, g, n_tok, stride);
    var q1 = vec4<f32>(0.0);
    var q2 = vec4<f32>(0.0);
    var q3 = vec4<f32>(0.0);
    var q4 = vec4<f32>(0.0);
    var q5 = vec4<f32>(0.0);
    var q6 = vec4<f32>(0.0);
    var q7 = vec4<f32>(0.0);
    if ({{QL}}u > 1u) { q1 = load_q(1u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 2u) { q2 = load_q(2u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 3u) { q3 = load_q(3u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 4u) { q4 = load_q(4u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 5u) { q5 = load_q(5u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 6u) { q6 = load_q(6u, tid, row0, g, n_tok, stride); }
    if ({{QL}}u > 7u) { q7 = load_q(7u, tid, row0, g, n_tok, stride); }
    var r0 = vec4<u32>(0u);
    var r1 = vec4<u32>(0u);
    var r2 = vec4<u32>(0u);
    var r3 = vec4<u32>(0u);
    var r4 = vec4<u32>(0u);
    var r5 = vec4<u32>(0u);
    var r6 = vec4<u32>(0u);
    var r7 = vec4<u32>(0u);
    if (k_begin < k_end) {
        let base = kv_base + k_begin;
        let nk = min({{BK}}u, k_end - k_begin);
        r0 = load_k(0u, tid, base, nk);
        if ({{LD}}u > 1u) { r1 = load_k(1u, tid, base, nk); }
        if ({{LD}}u > 2u) { r2 = load_k(2u, tid, base, nk); }
        if ({{LD}}u > 3u) { r3 = load_k(3u, tid, base, nk); }
        if ({{LD}}u > 4u) { r4 = load_k(4u, tid, base, nk); }
        if ({{LD}}u > 5u) { r5 = load_k(5u, tid, base, nk); }
        if ({{LD}}u > 6u) { r6 = load_k(6u, tid, base, nk); }
        if ({{LD}}u > 7u) { r7 = load_k(7u, tid, base, nk); }
    }
    store_q(0u, tid, q0);
    if ({{QL}}u > 1u) { store_q(1u, tid, q1); }
    if ({{QL}}u > 2u) { store_q(2u, tid, q2); }
    if ({{QL}}u > 3u) { store_q(3u, tid, q3); }
    if ({{QL}}u > 4u) { store_q(4u, tid, q4); }
    if ({{QL}}u > 5u) { store_q(5u, tid, q5); }
    if ({{QL}}u > 6u) { store_q(6u, tid, q6); }
    if ({{QL}}u > 7u) { store_q(7u, tid, q7); }

    var m_run = NEG;
    var l_run = 0.0;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    for (var kb = k_begin; kb < k_end; kb += {{BK}}u) {
        let nk = min({{BK}}u, k_end - kb);
        // K tile (loaded during the previous tile) into workgroup memory.
        store_kv(0u, tid, r0);
        if ({{LD}}u > 1u) { store_kv(1u, tid, r1); }
        if ({{LD}}u > 2u) { store_kv(2u, tid, r2); }
        if ({{LD}}u > 3u) { store_kv(3u, tid, r3); }
        if ({{LD}}u > 4u) { store_kv(4u, tid, r4); }
        if ({{LD}}u > 5u) { store_kv(5u, tid, r5); }
        if ({{LD}}u > 6u) { store_kv(6u, tid, r6); }
        if ({{LD}}u > 7u) { store_kv(7u, tid, r7); }
        workgroupBarrier();

        // Scores of this lane's keys.
        var d0 = 0.0;
        var d1 = 0.0;
        var d2 = 0.0;
        var d3 = 0.0;
        for (var u = 0u; u < DU; u += 4u) {
            let qu = r * QS + u;
            d0 += kdot(qu, j * QS + u);
            if ({{KPL}}u > 1u) { d1 += kdot(qu, (j + {{LPR}}u) * QS + u); }
            if ({{KPL}}u > 2u) { d2 += kdot(qu, (j + 2u * {{LPR}}u) * QS + u); }
            if ({{KPL}}u > 3u) { d3 += kdot(qu, (j + 3u * {{LPR}}u) * QS + u); }
        }
        d0 = masked(d0, 0u, live, j, kb, nk, lo, hi);
        d1 = masked(d1, 1u, live, j, kb, nk, lo, hi);
        d2 = masked(d2, 2u, live, j, kb, nk, lo, hi);
        d3 = masked(d3, 3u, live, j, kb, nk, lo, hi);
        red_m[tid / 4u][tid % 4u] = max(max(d0, d1), max(d2, d3));
        workgroupBarrier();

        // V tile loads in flight during the softmax.
        let base = kv_base + kb;
        r0 = load_v(0u, tid, base, nk);
        if ({{LD}}u > 1u) { r1 = load_v(1u, tid, base, nk); }
        if ({{LD}}u > 2u) { r2 = load_v(2u, tid, base, nk); }
        if ({{LD}}u > 3u) { r3 = load_v(3u, tid, base, nk); }
        if ({{LD}}u > 4u) { r4 = load_v(4u, tid, base, nk); }
        if ({{LD}}u > 5u) { r5 = load_v(5u, tid, base, nk); }
        if ({{LD}}u > 6u) { r6 = load_v(6u, tid, base, nk); }
        if ({{LD}}u > 7u) { r7 = load_v(7u, tid, base, nk); }
        // Online softmax: the row's new max, this tile's probabilities.
        var m_new = m_run;
        for (var i = 0u; i < RS; i += 2u) {
            m_new = max(m_new, max(vmax(red_m[r * RS + i]), vmax(red_m[r * RS + i + 1u])));
        }
        let alpha = exp(m_run - m_new);
        let e0 = prob(d0, m_new);
        let e1 = prob(d1, m_new);
        let e2 = prob(d2, m_new);
        let e3 = prob(d3, m_new);
        set_p(r, j, e0);
        if ({{KPL}}u > 1u) { set_p(r, j + {{LPR}}u, e1); }
        if ({{KPL}}u > 2u) { set_p(r, j + 2u * {{LPR}}u, e2); }
        if ({{KPL}}u > 3u) { set_p(r, j + 3u * {{LPR}}u, e3); }
        red_l[tid / 4u][tid % 4u] = (e0 + e1) + (e2 + e3);
        store_kv(0u, tid, r0);
        if ({{LD}}u > 1u) { store_kv(1u, tid, r1); }
        if ({{LD}}u > 2u) { store_kv(2u, tid, r2); }
        if ({{LD}}u > 3u) { store_kv(3u, tid, r3); }
        if ({{LD}}u > 4u) { store_kv(4u, tid, r4); }
        if ({{LD}}u > 5u) { store_kv(5u, tid, r5); }
        if ({{LD}}u > 6u) { store_kv(6u, tid, r6); }
        if ({{LD}}u > 7u) { store_kv(7u, tid, r7); }
        workgroupBarrier();

        // Next K tile loads in flight during P V.
        let kn = kb + {{BK}}u;
        if (kn < k_end) {
            let nbase = kv_base + kn;
            let nkn = min({{BK}}u, k_end - kn);
            r0 = load_k(0u, tid, nbase, nkn);
            if ({{LD}}u > 1u) { r1 = load_k(1u, tid, nbase, nkn); }
            if ({{LD}}u > 2u) { r2 = load_k(2u, tid, nbase, nkn); }
            if ({{LD}}u > 3u) { r3 = load_k(3u, tid, nbase, nkn); }
            if ({{LD}}u > 4u) { r4 = load_k(4u, tid, nbase, nkn); }
            if ({{LD}}u > 5u) { r5 = load_k(5u, tid, nbase, nkn); }
            if ({{LD}}u > 6u) { r6 = load_k(6u, tid, nbase, nkn); }
            if ({{LD}}u > 7u) { r7 = load_k(7u, tid, nbase, nkn); }
        }
        var bsum = 0.0;
        for (var i = 0u; i < RS; i += 2u) {
            let v = red_l[r * RS + i] + red_l[r * RS + i + 1u];
            bsum += (v.x + v.y) + (v.z + v.w);
        }
        l_run = l_run * alpha + bsum;
        m_run = m_new;
        a0 *= alpha;
        if ({{NW}}u > 1u) { a1 *= alpha; }
        if ({{NW}}u > 2u) { a2 *= alpha; }
        if ({{NW}}u > 3u) { a3 *= alpha; }
        if ({{NW}}u > 4u) { a4 *= alpha; }
        if ({{NW}}u > 5u) { a5 *= alpha; }
        if ({{NW}}u > 6u) { a6 *= alpha; }
        if ({{NW}}u > 7u) { a7 *= alpha; }
        // keys past nk have p = 0 and zero V rows: whole groups of 4
        for (var k = 0u; k < nk; k += 4u) {
            let pk = p_s[r * PS + k / 4u];
            let vr = k * QS;
            a0 += pv4(pk, vr + u0);
            if ({{NW}}u > 1u) { a1 += pv4(pk, vr + u1); }
            if ({{NW}}u > 2u) { a2 += pv4(pk, vr + u2); }
            if ({{NW}}u > 3u) { a3 += pv4(pk, vr + u3); }
            if ({{NW}}u > 4u) { a4 += pv4(pk, vr + u4); }
            if ({{NW}}u > 5u) { a5 += pv4(pk, vr + u5); }
            if ({{NW}}u > 6u) { a6 += pv4(pk, vr + u6); }
            if ({{NW}}u > 7u) { a7 += pv4(pk, vr + u7); }
        }
        workgroupBarrier();
    }

    if (!live) {
        return;
    }
#ifdef SPLIT
    let orow = (split * p.n_rows * p.heads + t * p.heads + h) * DU;
    if (j == 0u) {
        part_ml[split * p.n_rows * p.heads + t * p.heads + h] = vec2<f32>(m_run, l_run);
    }
    let scale = 1.0;
#else
    let orow = (t * p.heads + h) * DU;
    let scale = select(0.0, 1.0 / l_run, l_run > 0.0);
#endif
    if (j < DU) { write_out(orow + j, a0 * scale); }
    if ({{NW}}u > 1u && j + {{LPR}}u < DU) { write_out(orow + j + {{LPR}}u, a1 * scale); }
    if ({{NW}}u > 2u && j + 2u * {{LPR}}u < DU) { write_out(orow + j + 2u * {{LPR}}u, a2 * scale); }
    if ({{NW}}u > 3u && j + 3u * {{LPR}}u < DU) { write_out(orow + j + 3u * {{LPR}}u, a3 * scale); }
    if ({{NW}}u > 4u && j + 4u * {{LPR}}u < DU) { write_out(orow + j + 4u * {{LPR}}u, a4 * scale); }
    if ({{NW}}u > 5u && j + 5u * {{LPR}}u < DU) { write_out(orow + j + 5u * {{LPR}}u, a5 * scale); }
    if ({{NW}}u > 6u && j + 6u * {{LPR}}u < DU) { write_out(orow + j + 6u * {{LPR}}u, a6 * scale); }
    if ({{NW}}u > 7u && j + 7u * {{LPR}}u < DU) { write_out(orow + j + 7u * {{LPR}}u, a7 * scale); }
}

fn write_out(i: u32, v: vec4<f32>) {
#ifdef SPLIT
    part_o[i] = v;
#else
    out[i] = v;
#endif
}
#endif
