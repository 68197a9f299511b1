// matvec: y = x · Wᵀ (+ bias) (+ y) for one token, or a few (T small): the decode hot path,
// bound by the bandwidth of streaming W once.
//
// Fused input (include/linear_input.wgsl): with NORM the RMSNorm before the projection, with GATED
// the gated activation before the down projection, is computed here instead of in a dispatch of
// its own (VEC4 / VEC2 only: K % 4 == 0).
//
// W is f16, packed two per u32, row-major (N, K). Each load takes VEC u32 words (2·VEC halves) of
// one row; the host picks the widest VEC with K % (2·VEC) == 0, so rows start on a whole load and
// no K tail exists (K is even): VEC4 (K % 8 == 0), VEC1 (K % 4 != 0: one u32) or, with neither flag, VEC2 (K % 4 == 0).
//
// Work split: a workgroup of WG threads is cut into WG / TPR row groups of TPR threads; a row
// group computes 4 consecutive output rows. Lane l of a row group reads loads l, l + TPR, ... of
// each of its 4 rows (consecutive lanes read consecutive 16-byte words: coalesced), unpacks them
// once and meets them with the matching x chunk of each of TOK tokens (TOK = 1, or 4 with the flag
// TOK4), so it keeps 4 loads in flight and 4·TOK sums in registers. The TPR partial sums of an
// output are then reduced: with SUBGROUP by subgroupAdd, then the per-subgroup sums through
// workgroup memory (the host guarantees TPR is a multiple of every possible subgroup size, and
// subgroups are assumed to be contiguous runs of local_invocation_index); without, in two levels
// of 8 and TPR / 8 through workgroup memory (TPR >= 8). Lane r + 4·j of the row group stores row
// r of token j.
// More than TOK tokens: the workgroup repeats this over the same rows for each TOK tokens, so
// only the first pass streams W from memory (a row group's 4 rows, 8·K bytes, stay in cache).
// Grid: ceil(N / (4 · WG / TPR)) workgroups, 2-D folded (see gpu/kernel.rs). Rows past N (last
// workgroup, folded grid padding) and tokens past T (last pass) read a clamped row or token and
// store nothing, so every thread reaches the barriers.
//
// EXPERTS (the mixture-of-experts projections, src/ops/moe.rs): W is a stack of p.experts weights
// of N rows each ((E·N, K), expert e's rows e·N .. e·N + N), and the grid's z is the slot s (one
// per (token, chosen expert)): the workgroups of slot s read expert ids[s]'s rows (an id past the
// stack is clamped to its last expert), meet them with x row s / p.spr (spr: slots per x row) and
// write y row s. One token a pass (TOK = 1, p.t ignored): only the chosen experts' rows are read.
// Rust: src/ops/matmul/mod.rs matvec
#define WG 256
#define TPR 64
#define TOK 1
#define GB 4
#define EB 4

struct Params {
    n: u32,       // N, output rows
    kv: u32,      // loads per row: K / (2 · VEC)
    t: u32,       // T, tokens
    ld_out: u32,  // row stride of y, in elements
    xs: u32,      // row stride of x, in XVec: K / (2 · VEC) · XPL (GATED: twice that)
    half: u32,    // GATED: the up half's offset in x's row, in XVec
    eps: f32,     // NORM: the RMSNorm epsilon
    k4: u32,      // K / 4
    experts: u32, // EXPERTS: E, the experts in W's stack
    spr: u32,     // EXPERTS: slots per x row
    _pad0: u32,
    _pad1: u32,
}

#ifdef VEC4
alias WVec = vec4<u32>;           // one load: 8 halves
alias WF = array<vec4<f32>, 2>;   // a load unpacked
alias XVec = vec4<f32>;
const XPL: u32 = 2u;              // XVec per load
#else
#ifdef VEC1
alias WVec = u32;                 // 2 halves
alias WF = vec2<f32>;
alias XVec = vec2<f32>;
const XPL: u32 = 1u;
#else
alias WVec = vec2<u32>;           // VEC2: 4 halves
alias WF = vec4<f32>;
alias XVec = vec4<f32>;
const XPL: u32 = 1u;
#endif
#endif

@group(0) @binding(0) var<storage, read> w: array<WVec>;         // (N, K) f16 packed, K / (2·VEC) loads per row
#define LIN_B 1
#define LIN_X XVec
#include "linear_bindings"
#ifdef NORM
@group(0) @binding({{GB}}) var<storage, read> g: array<vec4<f32>>; // (K) the RMSNorm weight
#endif
#ifdef EXPERTS
@group(0) @binding({{EB}}) var<storage, read> ids: array<u32>;   // (slots) the expert of each slot
#endif

#ifdef VEC1

fn x_at(row: u32, i: u32, half: u32) -> XVec {
    return x[row + i];
}
#else
#include "linear_input"
fn x_at(row: u32, i: u32, half: u32) -> XVec {
    return li_load(row, i, half);
}
#endif

const NGROUPS: u32 = {{WG}}u / {{TPR}}u;

#include "matvec_reduce"

#ifdef VEC4
fn unpack(wv: vec4<u32>) -> WF {
    return WF(vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y)),
              vec4<f32>(unpack2x16float(wv.z), unpack2x16float(wv.w)));
}
// The chunk's XVec start at o of the token row starting at XVec `row`.
fn dot_x(u: WF, row: u32, o: u32) -> f32 {
    return dot(u[0], x_at(row, o, p.half)) + dot(u[1], x_at(row, o + 1u, p.half));
}
#else
#ifdef VEC1
fn unpack(wv: u32) -> WF {
    return unpack2x16float(wv);
}
#else
fn unpack(wv: vec2<u32>) -> WF {
    return vec4<f32>(unpack2x16float(wv.x), unpack2x16float(wv.y));
}
#endif
fn dot_x(u: WF, row: u32, o: u32) -> f32 {
    return dot(u, x_at(row, o, p.half));
}
#endif

// The 4 rows' loads against one token's x chunk (XVec o of the row starting at XVec `row`).
fn dot4(u0: WF, u1: WF, u2: WF, u3: WF, row: u32, o: u32) -> vec4<f32> {
    return vec4<f32>(dot_x(u0, row, o), dot_x(u1, row, o), dot_x(u2, row, o), dot_x(u3, row, o));
}

#include "linear_store"

// Entry point (opened by the include: wid, nwg, lid; sg_size, sg_lane with SUBGROUP):
#include "entry_subgroup"
    let wg = wid.x + wid.y * nwg.x;
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
    let row0 = (wg * NGROUPS + grp) * 4u;
    let kv = p.kv;
#ifdef EXPERTS
    // The slot's expert (its first row in the stack), x row and y row; one token.
    let slot = wid.z;
    let wrow = min(ids[slot], p.experts - 1u) * p.n;
    let xt0 = slot / p.spr;
    let yt0 = slot;
    let nt = 1u;
#else
    let wrow = 0u;
    let xt0 = 0u;
    let yt0 = 0u;
    let nt = p.t;
#endif
    // First load of each of the row group's rows (clamped: rows past N compute garbage, unstored).
    let base = (min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u)) + vec4<u32>(wrow)) * kv;
    // The token this lane stores after the reduction (token j = lane / 4 of the pass).
    let out_j = lane / 4u;

    for (var t0 = 0u; t0 < nt; t0 += {{TOK}}u) {
        // First XVec of each token's x row (clamped: tokens past T compute garbage, unstored).
        let xr = (min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nt - 1u)) + vec4<u32>(xt0)) * p.xs;
        // acc_j: token j, component r for row r (named vectors, not an indexed array, so that
        // they stay in registers on every compiler).
        // (acc1..3 stay 0 without TOK4.)
        var acc0 = vec4<f32>(0.0);
        var acc1 = vec4<f32>(0.0);
        var acc2 = vec4<f32>(0.0);
        var acc3 = vec4<f32>(0.0);
        for (var i = lane; i < kv; i += {{TPR}}u) {
            let u0 = unpack(w[base.x + i]);
            let u1 = unpack(w[base.y + i]);
            let u2 = unpack(w[base.z + i]);
            let u3 = unpack(w[base.w + i]);
            let xo = i * XPL;
            acc0 += dot4(u0, u1, u2, u3, xr.x, xo);
#ifdef TOK4
            acc1 += dot4(u0, u1, u2, u3, xr.y, xo);
            acc2 += dot4(u0, u1, u2, u3, xr.z, xo);
            acc3 += dot4(u0, u1, u2, u3, xr.w, xo);
#endif
        }

#ifdef SUBGROUP
        var sums = mv_reduce(acc0, acc1, acc2, acc3, lid, sg_size, sg_lane);
#else
        var sums = mv_reduce(acc0, acc1, acc2, acc3, lid, 1u, 0u);
#endif
#ifdef NORM
        // The norm's scale last: the weights did not wait for its reduction.
#ifdef SUBGROUP
        let rn = li_norm_scales(xr, p.k4, p.eps, lid, sg_size, sg_lane);
#else
        let rn = li_norm_scales(xr, p.k4, p.eps, lid, 1u, 0u);
#endif
        sums *= rn[min(out_j, 3u)];
#endif
        mv_store(sums, lane, yt0 + t0, row0, p.n, yt0 + nt);
        // `red` is rewritten by the next pass.
        workgroupBarrier();
    }
}
