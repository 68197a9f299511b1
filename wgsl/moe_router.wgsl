// moe_router: the top-k softmax router of a mixture-of-experts layer (src/ops/moe.rs), one
// workgroup per token. Row t of `logits` (stride p.ld) holds the E = p.e experts' logits in columns
// 0 .. E (later columns, e.g. a shared expert's gate logit, are not read). The kernel picks the
// k = p.k experts of largest logit (= of largest probability: exp is monotonic; ranking the
// logits keeps apart what exp's rounding would tie), larger first, equal logits lower index first,
// and writes their ids and weights to row t of `ids` and `weights` (T, k):
//   NORM_TOPK: w_j = exp(l_j - m) / sum over the chosen i of exp(l_i - m)   (renormalized top-k)
//   else:      w_j = exp(l_j - m) / sum over all E of exp(l_i - m)          (softmax probability)
// with m the largest logit, in f32 (exp: q_exp below, within 2 ulp of exp on every driver).
//
// SHARED_SLOT: rows of `ids` / `weights` have k + 1 slots; the last is the shared expert, stacked
// after the E routed ones (id E), weighted sigmoid(logit in column E) (Qwen3.5's
// `sigmoid(shared_expert_gate(x)) * shared_expert(x)`, run by the experts' own matvecs).
//
// Thread i holds experts i and i + WG (E <= 2 · WG). Two ways to pick (the host chooses by E):
// - RANK (measured faster up to E = 256): the logits go to workgroup memory and each thread counts
//   the experts that beat each of its own (E comparisons each; RANK2: both of its experts, E > WG);
//   the expert of rank r < k is the r-th pick. No rounds, two barriers.
// - otherwise, k rounds, each taking the best untaken (logit, index) of the workgroup: with
//   SUBGROUP by subgroupMax / subgroupMin, then each thread reads the WG / sg_size subgroup winners
//   from workgroup memory (double-buffered by round, so one barrier a round; subgroups are
//   contiguous runs of local_invocation_index, their size divides WG); without, a tree through
//   workgroup memory. Thread j < k keeps round j's winner.
// Rust: src/ops/moe.rs router
#define WG 256

struct Params {
    t: u32,    // T, tokens
    ld: u32,   // row stride of logits, in elements
    e: u32,    // E, experts (<= 2 · WG)
    k: u32,    // k, experts per token (<= E, <= WG)
}

@group(0) @binding(0) var<storage, read> logits: array<f32>;     // (T, ld)
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;  // (T, k), SHARED_SLOT: (T, k + 1)
@group(0) @binding(2) var<storage, read_write> weights: array<f32>; // (T, k), SHARED_SLOT: (T, k + 1)
@group(0) @binding(3) var<uniform> p: Params;

// The index of a taken (or absent) candidate: loses to every expert, whatever its logit.
const TAKEN: u32 = 0xFFFFFFFFu;
// The lowest f32: logits are clamped to it (an -inf logit ranks as the lowest finite one), and
// taken candidates bid it in the subgroup rounds.
const LOWEST: f32 = -3.4028234663852886e38;

var<workgroup> red_v: array<f32, {{WG}}>;
var<workgroup> red_i: array<u32, {{WG}}>;
#ifdef SUBGROUP
var<workgroup> win_v: array<array<f32, {{WG}}>, 2>;
var<workgroup> win_i: array<array<u32, {{WG}}>, 2>;
#endif
var<workgroup> sel_e: array<f32, {{WG}}>;
#ifdef RANK
var<workgroup> lg: array<vec4<f32>, {{WG}} / 2>;   // the E logits (2 · WG slots)
var<workgroup> sel_v: array<f32, {{WG}}>;          // the pick of rank r: its logit
var<workgroup> sel_i: array<u32, {{WG}}>;          // and its index
#endif

// Whether candidate (va, ia) ranks before (vb, ib): larger logit, then lower index; a taken
// candidate (index TAKEN) ranks last.
fn before(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    if (ia == TAKEN || ib == TAKEN) {
        return ia < ib;
    }
    return va > vb || (va == vb && ia < ib);
}

// exp(x) for x <= 0 within 2 ulp, independent of the driver's exp (whose error grows with |x|):
// x = n ln2 + r, |r| <= ln2 / 2 (Cody-Waite: n · LN2_HI is exact), exp(r) by its Taylor series to
// r^7 (truncation < 1e-8 relative), times 2^n. Below -87.3 (where exp leaves f32's normal range):
// 0; the largest logit's term is 1, so the sums are at least 1.
fn q_exp(x: f32) -> f32 {
    if (x < -87.3) {
        return 0.0;
    }
    let n = round(x * 1.4426950408889634);
    let r = (x - n * 0.693145751953125) - n * 1.4286068203094172e-6;
    var s = 1.0 / 5040.0;
    s = s * r + 1.0 / 720.0;
    s = s * r + 1.0 / 120.0;
    s = s * r + 1.0 / 24.0;
    s = s * r + 1.0 / 6.0;
    s = s * r + 0.5;
    s = s * r + 1.0;
    s = s * r + 1.0;
    return ldexp(s, i32(n));
}

// Sum over the workgroup of v (every thread gets it; call from uniform control flow).
fn wg_sum(v: f32, lid: u32) -> f32 {
#define TREE red_v
#define TREE_V v
#define TREE_H h
#include "tree_sum"
    let s = red_v[0];
    workgroupBarrier();
    return s;
}

// Entry point (opened by the include: wid, nwg, lid; sg_size, sg_lane with SUBGROUP):
#include "entry_subgroup"
    let t = wid.x + wid.y * nwg.x;
    if (t >= p.t) {
        return;
    }
    let row = t * p.ld;
    let i0 = lid;
    let i1 = lid + {{WG}}u;
    let v0 = select(LOWEST, max(logits[row + min(i0, p.e - 1u)], LOWEST), i0 < p.e);
    let v1 = select(LOWEST, max(logits[row + min(i1, p.e - 1u)], LOWEST), i1 < p.e);
    // Pick j, kept by thread j; pick 0's logit (the largest) by every thread.
    var mine_v = 0.0;
    var mine_i = 0u;
    var top = 0.0;
#ifdef RANK
    // Rank of each expert: how many beat it (a larger logit, or an equal one of lower index).
    lg[i0 >> 2u][i0 & 3u] = v0;
    lg[i1 >> 2u][i1 & 3u] = v1;
    workgroupBarrier();
    var r0 = 0u;
    var r1 = 0u;
    let one = vec4<u32>(1u);
    for (var c = 0u; c < (p.e + 3u) / 4u; c++) {
        let v = lg[c];
        let j = vec4<u32>(4u * c) + vec4<u32>(0u, 1u, 2u, 3u);
        r0 += dot(select(vec4<u32>(0u), one, select(v > vec4<f32>(v0), v >= vec4<f32>(v0), j < vec4<u32>(i0))), one);
#ifdef RANK2
        r1 += dot(select(vec4<u32>(0u), one, select(v > vec4<f32>(v1), v >= vec4<f32>(v1), j < vec4<u32>(i1))), one);
#endif
    }
    if (i0 < p.e && r0 < p.k) {
        sel_v[r0] = v0;
        sel_i[r0] = i0;
    }
#ifdef RANK2
    if (i1 < p.e && r1 < p.k) {
        sel_v[r1] = v1;
        sel_i[r1] = i1;
    }
#endif
    workgroupBarrier();
    top = sel_v[0];
    if (lid < p.k) {
        mine_v = sel_v[lid];
        mine_i = sel_i[lid];
    }
#else
    // Untaken candidates: their index, or TAKEN.
    var c0 = select(TAKEN, i0, i0 < p.e);
    var c1 = select(TAKEN, i1, i1 < p.e);
    for (var j = 0u; j < p.k; j++) {
        // This thread's best: expert i0 ranks before i1 on equal logits.
        let first = before(v0, c0, v1, c1);
        var bv = select(v1, v0, first);
        var bi = select(c1, c0, first);
#ifdef SUBGROUP
        // A subgroup's winner: its largest logit among untaken candidates, then the lowest index
        // with it (taken candidates bid LOWEST with index TAKEN, so an untaken one always wins).
        let m = subgroupMax(select(bv, LOWEST, bi == TAKEN));
        let mi = subgroupMin(select(TAKEN, bi, bv == m));
        let buf = j & 1u;
        if (sg_lane == 0u) {
            win_v[buf][lid / sg_size] = m;
            win_i[buf][lid / sg_size] = mi;
        }
        workgroupBarrier();
        bv = win_v[buf][0];
        bi = win_i[buf][0];
        for (var s = 1u; s < {{WG}}u / sg_size; s++) {
            let sv = win_v[buf][s];
            let si = win_i[buf][s];
            if (before(sv, si, bv, bi)) {
                bv = sv;
                bi = si;
            }
        }
#else
        red_v[lid] = bv;
        red_i[lid] = bi;
        workgroupBarrier();
        for (var h = {{WG}}u / 2u; h > 0u; h >>= 1u) {
            if (lid < h && before(red_v[lid + h], red_i[lid + h], red_v[lid], red_i[lid])) {
                red_v[lid] = red_v[lid + h];
                red_i[lid] = red_i[lid + h];
            }
            workgroupBarrier();
        }
        bv = red_v[0];
        bi = red_i[0];
        // red_v / red_i are rewritten by the next round.
        workgroupBarrier();
#endif
        if (j == 0u) {
            top = bv;
        }
        if (lid == j) {
            mine_v = bv;
            mine_i = bi;
        }
        c0 = select(c0, TAKEN, c0 == bi);
        c1 = select(c1, TAKEN, c1 == bi);
    }
#endif

    let e = select(0.0, q_exp(mine_v - top), lid < p.k);
#ifdef NORM_TOPK
    // The chosen experts' sum, added in one order by every thread (k <= WG terms).
    sel_e[lid] = e;
    workgroupBarrier();
    var total = 0.0;
    for (var j = 0u; j < p.k; j++) {
        total += sel_e[j];
    }
#else
    let a = select(0.0, q_exp(v0 - top), i0 < p.e);
    let b = select(0.0, q_exp(v1 - top), i1 < p.e);
    let total = wg_sum(a + b, lid);
#endif
#ifdef SHARED_SLOT
    let out_k = p.k + 1u;
    if (lid == p.k) {
        ids[t * out_k + p.k] = p.e;
        weights[t * out_k + p.k] = 1.0 / (1.0 + exp(-logits[row + p.e]));
    }
#else
    let out_k = p.k;
#endif
    if (lid < p.k) {
        ids[t * out_k + lid] = mine_i;
        weights[t * out_k + lid] = e / total;
    }
}
