// attention_decode: attention of one decode token (one sequence) in a single dispatch
// (src/ops/attention.rs `attention_decode`; its CPU twin is `attention::cpu::attention`).
//
// The token is at position p = step.pos of KV-cache slot step.slot; query head h (KV head
// g = h / G, G = H / Hkv) attends keys j in [lo, p], lo = max(0, p + 1 - window) (window 0:
// lo = 0): out = softmax_j((q . k_j) * scale) v_j, softmax in f32 with max subtraction.
//
// BATCH (a decode step of many sequences, include/step.wgsl): token t of the pass is a sequence of
// its own, at its own position and slot (grid z = t), with its own partial results and counters;
// its numbers are those it gets alone.
//
// Grid (NSPLIT, Hkv, T): workgroup (s, g) takes the G query heads of KV head g over run s of the
// keys. The n = p + 1 - lo keys are cut into runs of `per` keys (the fewest whole chunks that make
// at most NSPLIT runs); runs s >= used = ceil(n / per) are empty. A run is walked in chunks of CK
// keys (CK * D = CE elements, 8 or 4 Ki f16 of K and as many of V), each chunk's K and V loaded in
// one go, the next chunk's loads in flight during this chunk's math:
//   scores:  thread (key k = tid / KP, part = tid % KP) holds its key's D / KP dims of K in
//            registers (KL 16-byte words: the chunk's words tid * KL ..., contiguous) and dots
//            them with the G queries, staged in workgroup memory by part (padded: the KP parts
//            read distinct banks); a key's KP partial dots are summed in part order by the
//            softmax threads;
//   softmax: thread (head h = tid / 32, lane) takes keys lane, lane + 32, ...; online over the
//            chunks (running max m and sum l per head, the accumulators rescaled by
//            alpha = e^(m_old - m_new)); the max and the sum over the 32 lanes through workgroup
//            memory, in lane order;
//   P V:     thread (head h, 4-dim unit u) (NP pairs a thread) sums p_k v_k over the chunk's keys,
//            the values staged in workgroup memory as f16.
// Masked scores are a finite NEG sentinel and masked probabilities exactly 0 (no infinities:
// fast-math compilers may assume there are none); keys outside the run load as 0.
//
// SPLIT (NSPLIT > 1): a workgroup with keys writes its unnormalized output and (m, l) to `part`,
// then counts itself on its KV head's counter (after them in `part`); the last of the NSPLIT
// workgroups of a KV head to count (it reads NSPLIT - 1) merges the runs in run order, writes
// out and resets the counter for the next dispatch. Partial results go through atomics
// (device-coherent) and a storage barrier (device-scope acquire-release) stands on each side of
// the counter, so no merge dispatch is needed. Without SPLIT the workgroup writes out itself.
// Every order of summation is fixed: the output does not depend on which workgroup is last.
//
// ROPE (no q/k norm): q and k arrive unrotated. Queries are rotated as they are staged, and the
// key at p is taken from qkv (rotated, rounded to f16 as the cache holds it) and written with its
// value to both caches by the one thread that loads each of its words: the arithmetic of
// attention.wgsl's ROPE and of rope_kv_write (the same bits in the caches). A dispatch a layer
// fewer.
//
// STAGE8 (one token, no BATCH; subgroups of 8 or more, D a multiple of 32): the output is also
// written staged into xs for the o projection (matvec_quant XG), as quantize_x16 would.
//
// Macros: D (16 .. 256, dividing CE), G (<= 8), CK (= CE / D), KP (= 256 / CK), KL (= D / KP / 8
// = CE / 2048: 4 or 2), VL (= KL), NP (= ceil(G * D / 4 / 256) <= 2), NSPLIT, PB and RB (binding
// numbers of `part` and of the rope table), XB (of xs).
// Rust: src/ops/attention.rs attention_decode

#define D 128
#define G 6
#define CK 64
#define KP 4
#define KL 4
#define VL 4
#define NP 1
#define NSPLIT 2
#define PB 6
#define RB 7
#define XB 8

#ifdef STAGE8
#define XS_STORE
#include "stage_x16"
#endif

// SG32 (set where subgroups are exactly 32 wide: a head's 32 softmax lanes are one subgroup): the
// softmax's max and sum over the lanes by subgroup operations, without workgroup memory and a
// barrier. Only with SUBGROUP:
#ifdef SUBGROUP
#ifdef SG32
#define SUB32
#endif
#endif

#include "attention_kv"

@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>; // (T, H * D)
#ifdef STAGE8
@group(0) @binding({{XB}}) var<storage, read_write> xs: array<u32>;   // (H * D / 32, 20) one token's out, staged
#endif
#ifdef SPLIT
// Per token, f32 bits: (NSPLIT, H, D) unnormalized outputs, (NSPLIT, H, 2) (m, l), (Hkv) counters.
@group(0) @binding({{PB}}) var<storage, read_write> part: array<atomic<u32>>;
#endif

const WG: u32 = 256u;
const QP: u32 = 2u * {{KL}}u + 1u;        // units per (head, part) run of q_s, padded
const KS: u32 = ({{CK}}u + 31u) / 32u;    // keys per softmax lane
const NU: u32 = {{G}}u * DU;              // (head, unit) pairs

var<workgroup> q_s: array<vec4<f32>, {{G}} * {{KP}} * QP>;  // (G, KP, D / KP + pad) the queries
var<workgroup> v_s: array<vec2<u32>, {{CK}} * DU>;           // (CK, D) the chunk's values, f16
var<workgroup> s_part: array<f32, {{G}} * {{CK}} * {{KP}}>;  // (G, CK, KP) partial dots; SPLIT's merge: (G, NSPLIT) run weights
var<workgroup> p_s: array<vec4<f32>, {{G}} * {{CK}} / 4>;    // (G, CK) scores, then probabilities
#ifndef SUB32
var<workgroup> red_m: array<f32, WG>;                         // (8, 32) per-lane max
var<workgroup> red_l: array<f32, WG>;                         // (8, 32) per-lane sum
#endif
var<workgroup> alpha_s: array<f32, 8>;                        // (G) the chunk's rescale
var<workgroup> l_s: array<f32, 8>;                            // (G) the run's sum l
var<workgroup> last: u32;
// The token's first unit in qkv (set by main).
var<private> tok_row: u32;

#ifdef ROPE
#include "attention_f16"
#include "sincos"

// (sin, cos) of p · inv_freq[i] for the D / 2 frequencies.
var<workgroup> rope_cs: array<vec2<f32>, {{D}} / 2>;
// This step's key (rotated) and value of the KV head, as the cache holds them.
var<workgroup> cur_k: array<vec4<u32>, {{D}} / 8>;
var<workgroup> cur_v: array<vec4<u32>, {{D}} / 8>;

// The unit of a head's D / 4 that unit u rotates with (pairs (i, i + D / 2)).
fn partner(u: u32) -> u32 {
    let half = DU / 2u;
    return select(u + half, u - half, u >= half);
}

// Unit u (dims 4u .. 4u + 3) of a head, x, rotated with its partner unit xp as rope rotates it.
fn rope_rot(x: vec4<f32>, xp: vec4<f32>, u: u32) -> vec4<f32> {
    let half = DU / 2u;
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

// Cache word w (8 halves) of this step's key (rotated) or value of KV head g, from qkv.
fn current_kv(g: u32, w: u32, value: bool) -> vec4<u32> {
    var a: vec4<f32>;
    var b: vec4<f32>;
    if (value) {
        let hb = tok_row + (p.heads + p.kv_heads + g) * DU;
        a = qkv[hb + 2u * w];
        b = qkv[hb + 2u * w + 1u];
    } else {
        let hb = tok_row + (p.heads + g) * DU;
        a = rope_rot(qkv[hb + 2u * w], qkv[hb + partner(2u * w)], 2u * w);
        b = rope_rot(qkv[hb + 2u * w + 1u], qkv[hb + partner(2u * w + 1u)], 2u * w + 1u);
    }
    return vec4<u32>(pack_rne(a.x, a.y), pack_rne(a.z, a.w), pack_rne(b.x, b.y), pack_rne(b.z, b.w));
}
#endif

// This thread's K word i of the chunk at key position kb (its key tid / KP, dims of its part);
// zeros past the run's end.
fn load_k(i: u32, tid: u32, kv_base: u32, kb: u32, k_end: u32) -> vec4<u32> {
    var v = vec4<u32>(0u);
    if (kb + tid / {{KP}}u < k_end) {
        v = k_cache[(kv_base + kb) * DV + tid * {{KL}}u + i];
    }
    return v;
}

// This thread's V word i of the chunk (word tid + 256 i of the chunk's CK * D / 8).
fn load_v(i: u32, tid: u32, kv_base: u32, kb: u32, k_end: u32) -> vec4<u32> {
    let e = tid + WG * i;
    var v = vec4<u32>(0u);
    if (kb + e / DV < k_end) {
        v = v_cache[(kv_base + kb) * DV + e];
    }
    return v;
}

// ROPE: word `at` of the chunk at key position kb as it is at p: this step's key or value (cur_k,
// cur_v) at p, else w as loaded from the cache.
fn fix_kv(w: vec4<u32>, at: u32, kb: u32, pos: u32, value: bool) -> vec4<u32> {
#ifdef ROPE
    if (kb + at / DV == pos) {
        return select(cur_k[at % DV], cur_v[at % DV], value);
    }
#endif
    return w;
}

fn store_v(i: u32, tid: u32, w: vec4<u32>) {
    let e = tid + WG * i;
    let at = (e / DV) * DU + 2u * (e % DV);
    v_s[at] = w.xy;
    v_s[at + 1u] = w.zw;
}

// Head h's partial dot over K word i of this thread's part (2 units of the queries).
fn kdot(h: u32, part: u32, i: u32, w: vec4<u32>) -> f32 {
    let qb = (h * {{KP}}u + part) * QP + 2u * i;
    return dot(q_s[qb], unpack4(w.xy)) + dot(q_s[qb + 1u], unpack4(w.zw));
}

// Query unit e (head e / DU, unit e % DU) of KV head g: its place in qkv.
fn q_at(e: u32, g: u32) -> u32 {
    return tok_row + (g * {{G}}u + e / DU) * DU + e % DU;
}

fn store_q(e: u32, q: vec4<f32>) {
    let h = e / DU;
    let u = e % DU;
    q_s[(h * {{KP}}u + u / (2u * {{KL}}u)) * QP + u % (2u * {{KL}}u)] = q;
}

// sum_k p_k v_k over 4 keys from key k of the chunk, for head h and unit u.
fn pv4(h: u32, u: u32, k: u32) -> vec4<f32> {
    let pk = p_s[(h * {{CK}}u + k) / 4u];
    let vr = k * DU + u;
    return (pk.x * unpack4(v_s[vr]) + pk.y * unpack4(v_s[vr + DU]))
        + (pk.z * unpack4(v_s[vr + 2u * DU]) + pk.w * unpack4(v_s[vr + 3u * DU]));
}

#ifdef SPLIT
// The token's first word in `part` (set by main).
var<private> part0: u32;

fn part_o(s: u32, hg: u32, u: u32) -> vec4<f32> {
    let at = part0 + ((s * p.heads + hg) * DU + u) * 4u;
    return vec4<f32>(bitcast<f32>(atomicLoad(&part[at])), bitcast<f32>(atomicLoad(&part[at + 1u])),
                     bitcast<f32>(atomicLoad(&part[at + 2u])), bitcast<f32>(atomicLoad(&part[at + 3u])));
}

fn store_part_o(s: u32, hg: u32, u: u32, v: vec4<f32>) {
    let at = part0 + ((s * p.heads + hg) * DU + u) * 4u;
    atomicStore(&part[at], bitcast<u32>(v.x));
    atomicStore(&part[at + 1u], bitcast<u32>(v.y));
    atomicStore(&part[at + 2u], bitcast<u32>(v.z));
    atomicStore(&part[at + 3u], bitcast<u32>(v.w));
}

// Run s's output for head hg (local head h), weighted by e^(m_s - M) (runs past `used` weigh
// nothing and are not read).
fn run_o(h: u32, hg: u32, u: u32, s: u32, used: u32, m: f32) -> vec4<f32> {
    var o = vec4<f32>(0.0);
    if (s < used) {
        o = part_o(s, hg, u) * exp(s_part[h * {{NSPLIT}}u + s] - m);
    }
    return o;
}
#endif

#ifdef SUBGROUP
#ifdef STAGE8
// One token's output unit u of head h (its 4 values o) staged for the o projection's
// integer-dot-product matvec, as wgsl/quantize_x16.wgsl lays it out: a block's 32 values are 8
// consecutive units of a head (D a multiple of 32), held by 8 consecutive threads (pairs e = tid
// or tid + WG), which meet by shuffles; every thread calls it, those without a unit store nothing.
fn stage_unit(h: u32, u: u32, inside: bool, o: vec4<f32>) {
    stage_store8(20u * ((h * DU + u) / 8u), u & 7u, o, inside);
}
#endif
#endif

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) tid: u32) {
    let split = wid.x;
    let g = wid.y;
    let t = wid.z;
    if (t >= min(step.n_tokens, p.n_rows)) {
        return;
    }
    tok_row = t * (p.heads + 2u * p.kv_heads) * DU;
    let pos = tok_pos(t);
    let lo = key_lo(pos);
    let n = pos + 1u - lo;
    // The runs: whole chunks each, at most NSPLIT of them.
    let per = ((n + {{NSPLIT}}u - 1u) / {{NSPLIT}}u + {{CK}}u - 1u) / {{CK}}u * {{CK}}u;
    let used = (n + per - 1u) / per;
    let k_begin = lo + min(split * per, n);
    let k_end = lo + min(split * per + per, n);
    let kv_base = (tok_slot(t) * p.kv_heads + g) * p.max_ctx;

    // Thread roles: scores (key sk, part sp), softmax (head sh, lane sl), P V (pairs e0, e1).
    let sk = tid / {{KP}}u;
    let sp = tid % {{KP}}u;
    let sh = tid / 32u;
    let sl = tid % 32u;
    let e0 = tid;
    let e1 = tid + WG;
    let h0 = min(e0 / DU, {{G}}u - 1u);
    let h1 = min(e1 / DU, {{G}}u - 1u);
    let u0 = e0 % DU;
    let u1 = e1 % DU;

    // The queries (and with ROPE their partner units) and the first chunk, all loads in flight.
    var qa0 = vec4<f32>(0.0);
    var qa1 = vec4<f32>(0.0);
    if (e0 < NU) { qa0 = qkv[q_at(e0, g)]; }
    if ({{NP}}u > 1u && e1 < NU) { qa1 = qkv[q_at(e1, g)]; }
#ifdef ROPE
    var qb0 = vec4<f32>(0.0);
    var qb1 = vec4<f32>(0.0);
    if (e0 < NU) { qb0 = qkv[q_at(e0 - u0 + partner(u0), g)]; }
    if ({{NP}}u > 1u && e1 < NU) { qb1 = qkv[q_at(e1 - u1 + partner(u1), g)]; }
#endif
    var k0 = vec4<u32>(0u);
    var k1 = vec4<u32>(0u);
    var k2 = vec4<u32>(0u);
    var k3 = vec4<u32>(0u);
    var v0 = vec4<u32>(0u);
    var v1 = vec4<u32>(0u);
    var v2 = vec4<u32>(0u);
    var v3 = vec4<u32>(0u);
    if (k_begin < k_end) {
        k0 = load_k(0u, tid, kv_base, k_begin, k_end);
        k1 = load_k(1u, tid, kv_base, k_begin, k_end);
        if ({{KL}}u > 2u) { k2 = load_k(2u, tid, kv_base, k_begin, k_end); }
        if ({{KL}}u > 3u) { k3 = load_k(3u, tid, kv_base, k_begin, k_end); }
        v0 = load_v(0u, tid, kv_base, k_begin, k_end);
        v1 = load_v(1u, tid, kv_base, k_begin, k_end);
        if ({{VL}}u > 2u) { v2 = load_v(2u, tid, kv_base, k_begin, k_end); }
        if ({{VL}}u > 3u) { v3 = load_v(3u, tid, kv_base, k_begin, k_end); }
    }
#ifdef ROPE
    for (var i = tid; i < {{D}}u / 2u; i += WG) {
        rope_cs[i] = sincos(f32(pos) * inv_freq[i]);
    }
    workgroupBarrier();
    qa0 = rope_rot(qa0, qb0, u0);
    qa1 = rope_rot(qa1, qb1, u1);
    // The run holding p: this step's key and value, once, into workgroup memory and the caches.
    if (k_begin <= pos && pos < k_end && tid < 2u * DV) {
        let w = tid % DV;
        let c = current_kv(g, w, tid >= DV);
        let at = (kv_base + pos) * DV + w;
        if (tid < DV) {
            cur_k[w] = c;
            k_cache[at] = c;
        } else {
            cur_v[w] = c;
            v_cache[at] = c;
        }
    }
#endif
    if (e0 < NU) { store_q(e0, qa0); }
    if ({{NP}}u > 1u && e1 < NU) { store_q(e1, qa1); }
    workgroupBarrier();

    var m_run = NEG; // softmax threads: head sh's running max and sum
    var l_run = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    for (var kb = k_begin; kb < k_end; kb += {{CK}}u) {
        let nk = min({{CK}}u, k_end - kb);
        // The values into workgroup memory; the partial dots of this thread's key part.
        store_v(0u, tid, fix_kv(v0, tid, kb, pos, true));
        store_v(1u, tid, fix_kv(v1, tid + WG, kb, pos, true));
        if ({{VL}}u > 2u) { store_v(2u, tid, fix_kv(v2, tid + 2u * WG, kb, pos, true)); }
        if ({{VL}}u > 3u) { store_v(3u, tid, fix_kv(v3, tid + 3u * WG, kb, pos, true)); }
        let w0 = fix_kv(k0, tid * {{KL}}u, kb, pos, false);
        let w1 = fix_kv(k1, tid * {{KL}}u + 1u, kb, pos, false);
        var w2 = k2;
        var w3 = k3;
        if ({{KL}}u > 2u) {
            w2 = fix_kv(k2, tid * {{KL}}u + 2u, kb, pos, false);
            w3 = fix_kv(k3, tid * {{KL}}u + 3u, kb, pos, false);
        }
        for (var h = 0u; h < {{G}}u; h++) {
            var d = kdot(h, sp, 0u, w0) + kdot(h, sp, 1u, w1);
            if ({{KL}}u > 2u) {
                d += kdot(h, sp, 2u, w2) + kdot(h, sp, 3u, w3);
            }
            s_part[(h * {{CK}}u + sk) * {{KP}}u + sp] = d;
        }
        workgroupBarrier();

        // The next chunk's loads in flight during the softmax and P V.
        let kn = kb + {{CK}}u;
        if (kn < k_end) {
            k0 = load_k(0u, tid, kv_base, kn, k_end);
            k1 = load_k(1u, tid, kv_base, kn, k_end);
            if ({{KL}}u > 2u) { k2 = load_k(2u, tid, kv_base, kn, k_end); }
            if ({{KL}}u > 3u) { k3 = load_k(3u, tid, kv_base, kn, k_end); }
            v0 = load_v(0u, tid, kv_base, kn, k_end);
            v1 = load_v(1u, tid, kv_base, kn, k_end);
            if ({{VL}}u > 2u) { v2 = load_v(2u, tid, kv_base, kn, k_end); }
            if ({{VL}}u > 3u) { v3 = load_v(3u, tid, kv_base, kn, k_end); }
        }
        // Softmax, 1: each key's score (its parts in order), the lane's max, the head's.
        var mx = NEG;
        if (sh < {{G}}u) {
            for (var i = 0u; i < KS; i++) {
                let k = sl + 32u * i;
                if (k < {{CK}}u) {
                    var s = NEG;
                    if (k < nk) {
                        var d = 0.0;
                        for (var q = 0u; q < {{KP}}u; q++) {
                            d += s_part[(sh * {{CK}}u + k) * {{KP}}u + q];
                        }
                        s = d * p.scale;
                    }
                    p_s[(sh * {{CK}}u + k) / 4u][k % 4u] = s;
                    mx = max(mx, s);
                }
            }
        }
#ifdef SUB32
        // (a head's 32 lanes are one subgroup)
        var m_new = max(m_run, subgroupMax(mx));
#else
        red_m[tid] = mx;
        workgroupBarrier();
        var m_new = m_run;
        for (var i = 0u; i < 32u; i++) {
            m_new = max(m_new, red_m[min(sh, 7u) * 32u + i]);
        }
#endif
        // 2: the probabilities, the lane's sum.
        var sum = 0.0;
        if (sh < {{G}}u) {
            for (var i = 0u; i < KS; i++) {
                let k = sl + 32u * i;
                if (k < {{CK}}u) {
                    let e = prob(p_s[(sh * {{CK}}u + k) / 4u][k % 4u], m_new);
                    p_s[(sh * {{CK}}u + k) / 4u][k % 4u] = e;
                    sum += e;
                }
            }
            if (sl == 0u) {
                alpha_s[sh] = exp(m_run - m_new);
            }
        }
#ifdef SUB32
        let bsum = subgroupAdd(sum);
#else
        red_l[tid] = sum;
#endif
        workgroupBarrier();
        // 3: the head's sum; P V.
#ifndef SUB32
        var bsum = 0.0;
        for (var i = 0u; i < 32u; i++) {
            bsum += red_l[min(sh, 7u) * 32u + i];
        }
#endif
        l_run = l_run * exp(m_run - m_new) + bsum;
        m_run = m_new;
        acc0 *= alpha_s[h0];
        acc1 *= alpha_s[h1];
        for (var k = 0u; k < nk; k += 4u) {
            acc0 += pv4(h0, u0, k);
            if ({{NP}}u > 1u) { acc1 += pv4(h1, u1, k); }
        }
        workgroupBarrier();
    }
    if (sh < {{G}}u && sl == 0u) {
        l_s[sh] = l_run;
    }

#ifdef SPLIT
    part0 = t * ({{NSPLIT}}u * p.heads * ({{D}}u + 2u) + p.kv_heads);
    let mlo = part0 + {{NSPLIT}}u * p.heads * {{D}}u; // first word of the (m, l) region
    let co = mlo + {{NSPLIT}}u * p.heads * 2u; // the counters
    if (split < used) {
        if (e0 < NU) { store_part_o(split, g * {{G}}u + h0, u0, acc0); }
        if ({{NP}}u > 1u && e1 < NU) { store_part_o(split, g * {{G}}u + h1, u1, acc1); }
        if (sh < {{G}}u && sl == 0u) {
            let at = mlo + (split * p.heads + g * {{G}}u + sh) * 2u;
            atomicStore(&part[at], bitcast<u32>(m_run));
            atomicStore(&part[at + 1u], bitcast<u32>(l_run));
        }
    }
    // Release this workgroup's partials, count it; the last one acquires them all and merges.
    storageBarrier();
    if (tid == 0u) {
        last = select(0u, 1u, atomicAdd(&part[co + g], 1u) == {{NSPLIT}}u - 1u);
    }
    if (workgroupUniformLoad(&last) == 0u) {
        return;
    }

    if (tid == 0u) {
        atomicStore(&part[co + g], 0u);
    }
    storageBarrier();
    // The runs' (m, l) of the KV head's G heads into workgroup memory (s_part: m at h · NSPLIT + s,
    // l after the G heads' m), then each pair's output over the runs in order: M the runs' max,
    // o = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s.
    for (var e = tid; e < {{G}}u * used; e += WG) {
        let h = e / used;
        let s = e % used;
        let at = mlo + (s * p.heads + g * {{G}}u + h) * 2u;
        s_part[h * {{NSPLIT}}u + s] = bitcast<f32>(atomicLoad(&part[at]));
        s_part[({{G}}u + h) * {{NSPLIT}}u + s] = bitcast<f32>(atomicLoad(&part[at + 1u]));
    }
    workgroupBarrier();
    var mx0 = NEG;
    var mx1 = NEG;
    for (var s = 0u; s < used; s++) {
        mx0 = max(mx0, s_part[h0 * {{NSPLIT}}u + s]);
        mx1 = max(mx1, s_part[h1 * {{NSPLIT}}u + s]);
    }
    var l0 = 0.0;
    var l1 = 0.0;
    for (var s = 0u; s < used; s++) {
        l0 += exp(s_part[h0 * {{NSPLIT}}u + s] - mx0) * s_part[({{G}}u + h0) * {{NSPLIT}}u + s];
        l1 += exp(s_part[h1 * {{NSPLIT}}u + s] - mx1) * s_part[({{G}}u + h1) * {{NSPLIT}}u + s];
    }
    // Four runs' loads a step in flight.
    var o0 = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    for (var s = 0u; s < used; s += 4u) {
        if (e0 < NU) {
            let hg = g * {{G}}u + h0;
            o0 += (run_o(h0, hg, u0, s, used, mx0) + run_o(h0, hg, u0, s + 1u, used, mx0))
                + (run_o(h0, hg, u0, s + 2u, used, mx0) + run_o(h0, hg, u0, s + 3u, used, mx0));
        }
        if ({{NP}}u > 1u && e1 < NU) {
            let hg = g * {{G}}u + h1;
            o1 += (run_o(h1, hg, u1, s, used, mx1) + run_o(h1, hg, u1, s + 1u, used, mx1))
                + (run_o(h1, hg, u1, s + 2u, used, mx1) + run_o(h1, hg, u1, s + 3u, used, mx1));
        }
    }
    acc0 = o0;
    acc1 = o1;
#else
    workgroupBarrier();
    let l0 = l_s[h0];
    let l1 = l_s[h1];
#endif
    let orow = t * p.heads * DU;
    let out0 = acc0 * select(0.0, 1.0 / l0, l0 > 0.0);
    let out1 = acc1 * select(0.0, 1.0 / l1, l1 > 0.0);
    if (e0 < NU) {
        out[orow + (g * {{G}}u + h0) * DU + u0] = out0;
    }
    if ({{NP}}u > 1u && e1 < NU) {
        out[orow + (g * {{G}}u + h1) * DU + u1] = out1;
    }
#ifdef SUBGROUP
#ifdef STAGE8
    stage_unit(g * {{G}}u + h0, u0, e0 < NU, out0);
    if ({{NP}}u > 1u) {
        stage_unit(g * {{G}}u + h1, u1, e1 < NU, out1);
    }
#endif
#endif
}
