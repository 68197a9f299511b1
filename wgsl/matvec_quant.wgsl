// matvec_quant: y = x · Wᵀ (+ bias) (+ y) for one token, or a few (T small), with W in a GGUF
// quantized type (include/quant.wgsl: the type flag, the planes layout, the dequantization): the
// decode hot path, bound by streaming W's blocks once, dequantized in registers, summed in f32.
//
// Work split (as matvec.wgsl, with a "unit" of QU elements in place of a 16-byte load): a
// workgroup of WG threads is cut into WG / TPR row groups of TPR threads; a row group computes 4
// consecutive output rows. Lane l of a row group takes units l, l + TPR, ... of each of its 4 rows
// (consecutive lanes read consecutive 16-byte words of a plane: coalesced), loading the 4 rows'
// units first (4 loads in flight, plus their scales), then meeting them with the unit's x (loaded
// once per token, shared by the 4 rows) of each of TOK tokens (TOK = 1, or 4 with the flag TOK4).
// The TPR partial sums of an output are reduced: with SUBGROUP by subgroupAdd, then the
// per-subgroup sums through workgroup memory (TPR is a multiple of every possible subgroup size,
// and subgroups are contiguous runs of local_invocation_index); without, in two levels of 8 and
// TPR / 8 through workgroup memory (TPR >= 8). Lane r + 4·j of the row group stores row r of
// token j.
// More than TOK tokens: the workgroup repeats this over the same rows for each TOK tokens, so
// only the first pass streams W from memory.
// DP4 (Q4_0, Q4_1, Q4_K, Q6_K): the workgroup first stages each token's x (the fused input
// included) in workgroup memory as 16-bit fixed point per 32-element block (a power-of-two scale
// under its largest |x|, so |q| < 2^14 + 1, round to nearest even; split into low and high bytes,
// with the scaled sums of each 16 elements; eight threads a block with subgroup shuffles under
// STAGE8, else a thread a block), while the first unit of every row is already loading; then each
// unit is q_dot_i: 4-wide integer dot products of the quants against those bytes
// (include/quant.wgsl), exact, scaled once. A row longer than the staging arrays (KC blocks a
// token) is staged a chunk at a time; a lane still meets its units in order, so a token's sums are
// the same whatever KC, TOK and the other tokens of the pass. PREFETCH (one token, the whole row
// staged) issues each unit's loads one iteration early. XG (one token): x was staged once
// for every workgroup by quantize_x16 into a buffer, which the dot products read in place of
// workgroup memory (no staging nor its barrier, any workgroup size: rows too long to stage in
// workgroup memory). The CPU twin is src/ops/matmul/gguf.rs `cpu::stage_x16` followed by the
// plain reference.
// Grid: ceil(N / (4 · WG / TPR)) workgroups, 2-D folded (see gpu/kernel.rs). Rows past N and
// tokens past T read a clamped row or token and store nothing (DP4 neither stages nor meets
// tokens past T), so every thread reaches the barriers.
//
// EXPERTS (the mixture-of-experts projections, src/ops/moe.rs), as in matvec.wgsl: W is a stack of
// p.experts weights of N rows each ((E·N, K), expert e's rows e·N .. e·N + N: its units follow
// those of expert e - 1), the grid's z is the slot s; slot s reads expert ids[s]'s rows (clamped
// to the stack), meets them with x row s / p.spr and writes y row s. TOK = 1, p.t ignored.
//
// MIX (one token, x staged by the kernel whole or not at all, no EXPERTS / GLU / XG / PREFETCH):
// two weights of different types in one dispatch, writing different columns of y (a q/k/v
// projection whose v is Q6_K beside Q4_K q and k): the workgroups before pb.wg0 compute the first
// weight's rows (columns 0 .. p.n), those from pb.wg0 on the second's (pb.n rows, columns pb.col
// ..), with its type's functions (MIX_<type>: the b_ names below) and its planes (the accessors
// below switch on q_part). Each weight's outputs are the sums this kernel computes for that weight
// alone in the same workgroup shape. With DP4 both weights take the integer dot products, or only
// the second with MIX_FLOAT_A (a first weight on its float path, e.g. Qwen2.5-0.5B-like Q5_0
// beside a DP4 type).
// Rust: src/ops/matmul/gguf/matvec.rs matvec_quant, matvec_quant_mixed_with
#define WG 256
#define TPR 32
#define TOK 1
#define GB 5
#define EB 5
#define XB 5

#include "quant"

#ifdef DP4
#include "stage_x16"
#endif

#include "matvec_quant_params"

// The weight's loop takes the integer dot products (DP4), but for the first weight of MIX with
// MIX_FLOAT_A (the float path there, DP4 for the second weight).
#ifdef DP4
#ifndef MIX_FLOAT_A
#define DP4_A 1
#endif
#endif

#ifdef MIX
// The second weight's type by one flag MIX_<type> (none: Q4_0), its names prefixed b_ (b_QRaw,
// b_q_raw, b_q_dot, ...); GGUF types only (the MLX affine types' AFFINE_G would be the first
// weight's).
#ifdef MIX_Q4_1
#include "quant_q4_1" as b_
#else
#ifdef MIX_Q5_0
#include "quant_q5_0" as b_
#else
#ifdef MIX_Q5_1
#include "quant_q5_1" as b_
#else
#ifdef MIX_Q8_0
#include "quant_q8_0" as b_
#else
#ifdef MIX_Q4_K
#include "quant_q4_k" as b_
#else
#ifdef MIX_Q5_K
#include "quant_q5_k" as b_
#else
#ifdef MIX_Q6_K
#include "quant_q6_k" as b_
#else
#include "quant_q4_0" as b_
#endif
#endif
#endif
#endif
#endif
#endif
#endif

#define MB 7
#define MB1 8
#define MB2 9
// The second weight: where its rows start in the grid and in y, its shape and planes.
struct MixParams {
    wg0: u32,     // its first workgroup (the first weight's workgroups come before)
    n: u32,       // its rows
    units: u32,   // units per row: K / b_QU
    col: u32,     // the column of y its row 0 writes
    o1: u32,      // first word of its plane 1
    o2: u32,      // first word of its plane 2
    _pad0: u32,
    _pad1: u32,
}
@group(0) @binding(0) var<storage, read> wv: array<vec4<u32>>;          // the first weight's planes (16-byte view)
@group(0) @binding(1) var<storage, read> ww: array<u32>;                // the same buffer (word view)
@group(0) @binding({{MB}}) var<storage, read> wv_b: array<vec4<u32>>;   // the second weight's planes (16-byte view)
@group(0) @binding({{MB1}}) var<storage, read> ww_b: array<u32>;        // the same buffer (word view)
@group(0) @binding({{MB2}}) var<uniform> pb: MixParams;

// include/quant.wgsl's accessors over the weight of the current workgroup: q_part 0 (the first)
// or 1 (the second), set once by the kernel (workgroup-uniform).
var<private> q_part: u32;

fn qw4(i: u32) -> vec4<u32> {
    if (q_part != 0u) {
        return wv_b[i];
    }
    return wv[i];
}
fn qw1(i: u32) -> u32 {
    if (q_part != 0u) {
        return ww_b[i];
    }
    return ww[i];
}
fn q_planes() -> vec2<u32> {
    return select(vec2<u32>(p.o1, p.o2), vec2<u32>(pb.o1, pb.o2), q_part != 0u);
}
#else
#include "quant_views"
#endif

#ifdef EXPERTS
@group(0) @binding({{EB}}) var<storage, read> ids: array<u32>;   // (slots) the expert of each slot
#endif
#ifdef XG
@group(0) @binding({{XB}}) var<storage, read> xg: array<vec4<u32>>; // (K / 32, 5) x staged (quantize_x16, a norm's STAGE)
#endif

// The fused input (include/linear_input.wgsl): x as the kernel meets it. q_row is the current
// token's row start (vec4), set before each token's dot products.
var<private> q_row: u32;

#include "linear_input"

fn qx4(i: u32) -> vec4<f32> {
    return li_load(q_row, i - q_row, p.half);
}


const NGROUPS: u32 = {{WG}}u / {{TPR}}u;

#include "matvec_reduce"

#ifdef DP4
#ifndef XG
#ifdef STAGE8
// Stages blocks cb .. cb + nb of the token row starting at vec4 q_row into the token's arrays
// from group dst: eight threads a block, a vec4 each, the block's largest |x| and the 16-element
// sums by subgroup shuffles (the host sets STAGE8 where subgroups are at least 8 wide: a block's
// eight threads are one aligned run of a subgroup). Every thread runs every round (the shuffles
// need them; nb is uniform), storing only in range.
fn stage_x(cb: u32, nb: u32, dst: u32, lid: u32) {
#ifdef DP4X
    let n4 = nb * 8u;
#else
    // The whole row (nb = KC): a constant trip count, unrolled (the loads issued together).
    let n4 = {{KC}}u * 8u;
#endif
    let x0 = q_row + 8u * cb;
    for (var r = 0u; r < (n4 + {{WG}}u - 1u) / {{WG}}u; r++) {
        let ci = r * {{WG}}u + lid;
        // (tail: d · Σq of this thread's half of the block, of the other half, d)
        let st = stage_lanes8(qx4(x0 + min(ci, n4 - 1u)));
        if (ci < n4) {
            let gi = dst + (ci >> 2u);
            xs_lo[gi][ci & 3u] = st.lo;
            xs_hi[gi][ci & 3u] = st.hi;
            if ((ci & 3u) == 0u) {
                xs_s[gi] = bitcast<f32>(st.tail.x);
            }
            if ((ci & 7u) == 0u) {
                xs_d[(dst >> 1u) + (ci >> 3u)] = bitcast<f32>(st.tail.z);
            }
        }
    }
}
#else
// Stages blocks cb .. cb + nb of the token row starting at vec4 q_row into the token's arrays
// from group dst: a thread a block, its 8 vec4 at once (include/stage_x16.wgsl stage_block).
fn stage_x(cb: u32, nb: u32, dst: u32, lid: u32) {
#ifdef DP4X
    let n = nb;
#else
    let n = {{KC}}u;
#endif
    for (var b = lid; b < n; b += {{WG}}u) {
        let i = q_row + 8u * (cb + b);
        var v: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            v[j] = qx4(i + j);
        }
        let st = stage_block(v);
        let g = dst + 2u * b;
        xs_lo[g] = st[0];
        xs_lo[g + 1u] = st[1];
        xs_hi[g] = st[2];
        xs_hi[g + 1u] = st[3];
        xs_s[g] = bitcast<f32>(st[4].x);
        xs_s[g + 1u] = bitcast<f32>(st[4].y);
        xs_d[(dst >> 1u) + b] = bitcast<f32>(st[4].z);
    }
}
#endif

// Stages chunk blocks cb .. cb + nb of each of the pass's tokens (those before nt; the others'
// arrays keep stale values, never read).
fn stage_tokens(xr: vec4<u32>, t0: u32, nt: u32, cb: u32, nb: u32, lid: u32) {
    q_row = xr.x;
    stage_x(cb, nb, 0u, lid);
#ifdef TOK4
    for (var j = 1u; j < 4u; j++) {
        if (t0 + j < nt) {
            q_row = xr[j];
            stage_x(cb, nb, 2u * {{KC}}u * j, lid);
        }
    }
#endif
}
#endif
#endif

#ifdef PROBE_NOMATH
// Measurement probes (tests only): the loads without the dequantization and x.
#ifdef Q4_K
fn q_probe(r: QRaw) -> f32 {
    return bitcast<f32>((r.qs.x ^ r.qs.y ^ r.qs.z ^ r.qs.w) & 0x3FFFFFFFu) + r.dl + r.dh + r.ml + r.mh;
}
#endif
#ifdef Q6_K
fn q_probe(r: QRaw) -> f32 {
    let w = r.a ^ r.c ^ r.h;
    return bitcast<f32>((w.x ^ w.y ^ w.z ^ w.w) & 0x3FFFFFFFu) + dot(r.s, r.s);
}
#endif
#ifdef Q8_0
fn q_probe(r: QRaw) -> f32 {
    let w = r.a ^ r.b;
    return bitcast<f32>((w.x ^ w.y ^ w.z ^ w.w) & 0x3FFFFFFFu) + r.d;
}
#endif
#ifdef Q4_1
#else
#ifdef Q5_0
#else
#ifdef Q5_1
#else
#ifdef Q8_0
#else
#ifdef Q4_K
#else
#ifdef Q5_K
#else
#ifdef Q6_K
#else
fn q_probe(r: QRaw) -> f32 {
    return bitcast<f32>((r.qs.x ^ r.qs.y ^ r.qs.z ^ r.qs.w) & 0x3FFFFFFFu) + r.d;
}
#endif
#endif
#endif
#endif
#endif
#endif
#endif
#endif

// The 4 rows' units against one token's x.
fn dot4(r0: QRaw, r1: QRaw, r2: QRaw, r3: QRaw, u: u32, xr: u32) -> vec4<f32> {
#ifdef PROBE_NOMATH
    return vec4<f32>(q_probe(r0), q_probe(r1), q_probe(r2), q_probe(r3));
#else
#ifdef PROBE_NOX
    let v = q_x(0u, 0u);
#else
    let v = q_x(u, xr);
#endif
    return vec4<f32>(q_dot(r0, v), q_dot(r1, v), q_dot(r2, v), q_dot(r3, v));
#endif
}

#include "linear_store"

// Entry point (opened by the include: wid, nwg, lid; sg_size, sg_lane with SUBGROUP):
#include "entry_subgroup"
    // Q4_K and Q5_K read only the 16-byte view: a (never taken) use keeps the word view in the
    // bind group layout for every type (p.n > 0).
    if (p.n == 0u) {
        y[0] = bitcast<f32>(ww[0]);
#ifdef MIX
        y[0] = bitcast<f32>(ww_b[0] ^ wv_b[0].x);
#endif
#ifdef PROBE_NOMATH
        y[0] = x[0].x;
#endif
#ifdef XG
        // (x itself is not read: its binding stays in the layout.)
        y[0] = x[0].x + bitcast<f32>(xg[0].x);
#endif
    }
    let wg = wid.x + wid.y * nwg.x;
    let grp = lid / {{TPR}}u;
    let lane = lid % {{TPR}}u;
#ifdef MIX
    if (wg >= pb.wg0) {
        // The second weight's rows (clamped past pb.n: computed, not stored), one token.
        q_part = 1u;
        let row0b = ((wg - pb.wg0) * NGROUPS + grp) * 4u;
        let bb = min(vec4<u32>(row0b) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(pb.n - 1u)) * pb.units;
        q_row = 0u;
        var acc = vec4<f32>(0.0);
#ifdef DP4
        // The integer dot products against x staged whole (the first units load meanwhile).
        let uf = min(lane, pb.units - 1u);
        var r0 = b_q_raw(bb.x + uf);
        var r1 = b_q_raw(bb.y + uf);
        var r2 = b_q_raw(bb.z + uf);
        var r3 = b_q_raw(bb.w + uf);
        stage_x(0u, {{KC}}u, 0u, lid);
        workgroupBarrier();
        for (var u = lane; u < pb.units; u += {{TPR}}u) {
            if (u != lane) {
                r0 = b_q_raw(bb.x + u);
                r1 = b_q_raw(bb.y + u);
                r2 = b_q_raw(bb.z + u);
                r3 = b_q_raw(bb.w + u);
            }
            acc += vec4<f32>(b_q_dot_i(r0, u), b_q_dot_i(r1, u), b_q_dot_i(r2, u), b_q_dot_i(r3, u));
        }
#else
        for (var u = lane; u < pb.units; u += {{TPR}}u) {
            let r0 = b_q_raw(bb.x + u);
            let r1 = b_q_raw(bb.y + u);
            let r2 = b_q_raw(bb.z + u);
            let r3 = b_q_raw(bb.w + u);
            let v = b_q_x(u, 0u);
            acc += vec4<f32>(b_q_dot(r0, v), b_q_dot(r1, v), b_q_dot(r2, v), b_q_dot(r3, v));
        }
#endif
        let z = vec4<f32>(0.0);
#ifdef SUBGROUP
        var sums = mv_reduce(acc, z, z, z, lid, sg_size, sg_lane);
#else
        var sums = mv_reduce(acc, z, z, z, lid, 1u, 0u);
#endif
#ifdef NORM
#ifdef SUBGROUP
        sums *= li_norm_scales(vec4<u32>(0u), p.xk, p.eps, lid, sg_size, sg_lane)[0];
#else
        sums *= li_norm_scales(vec4<u32>(0u), p.xk, p.eps, lid, 1u, 0u)[0];
#endif
#endif
        // (columns pb.col + row0b .., below pb.col + pb.n)
        mv_store(sums, lane, 0u, pb.col + row0b, pb.col + pb.n, 1u);
        return;
    }
#endif
    let row0 = (wg * NGROUPS + grp) * 4u;
    let units = p.units;
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
    // First unit of each of the row group's rows (clamped: rows past N compute garbage, unstored).
    let base = (min(vec4<u32>(row0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u)) + vec4<u32>(wrow)) * units;
    // The token this lane stores after the reduction (token j = lane / 4 of the pass).
    let out_j = lane / 4u;

    for (var t0 = 0u; t0 < nt; t0 += {{TOK}}u) {
        // Each token's x row start (clamped: tokens past T compute garbage, unstored).
        let xr = (min(vec4<u32>(t0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(nt - 1u)) + vec4<u32>(xt0)) * p.xs;
        // (acc1..3 stay 0 without TOK4.)
        var acc0 = vec4<f32>(0.0);
        var acc1 = vec4<f32>(0.0);
        var acc2 = vec4<f32>(0.0);
        var acc3 = vec4<f32>(0.0);
#ifdef DP4_A
        // The first unit of each row loads while x is staged. The row is staged KC blocks at a
        // time (one chunk when it fits); each lane meets its units u = lane + i · TPR in order,
        // chunk after chunk, as in one pass over the row.
        let uf = min(lane, units - 1u);
        var r0 = q_raw(base.x + uf);
        var r1 = q_raw(base.y + uf);
        var r2 = q_raw(base.z + uf);
        var r3 = q_raw(base.w + uf);
#ifndef DP4X
#ifndef XG
        // One token, the whole row staged at once.
        q_row = xr.x;
        stage_x(0u, {{KC}}u, 0u, lid);
        workgroupBarrier();
#endif
#ifdef PREFETCH
        // The next unit's loads issued before this unit's math (the same sums in the same order;
        // 4 more QRaw live a lane).
        for (var u = lane; u < units; u += {{TPR}}u) {
            let un = min(u + {{TPR}}u, units - 1u);
            let n0 = q_raw(base.x + un);
            let n1 = q_raw(base.y + un);
            let n2 = q_raw(base.z + un);
            let n3 = q_raw(base.w + un);
            acc0 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
            r0 = n0;
            r1 = n1;
            r2 = n2;
            r3 = n3;
        }
#else
        for (var u = lane; u < units; u += {{TPR}}u) {
            if (u != lane) {
                r0 = q_raw(base.x + u);
                r1 = q_raw(base.y + u);
                r2 = q_raw(base.z + u);
                r3 = q_raw(base.w + u);
            }
            acc0 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
        }
#endif
#else
        let kb = p.xk / 8u;
        for (var cb = 0u; cb < kb; cb += {{KC}}u) {
            if (cb > 0u) {
                // Every lane is done with the previous chunk.
                workgroupBarrier();
            }
            let nb = min({{KC}}u, kb - cb);
            stage_tokens(xr, t0, nt, cb, nb, lid);
            workgroupBarrier();
            qi_g0 = 2u * cb;
            let ub = cb * 32u / QU;
            let ue = (cb + nb) * 32u / QU;
            for (var u = ub + (lane + {{TPR}}u - ub % {{TPR}}u) % {{TPR}}u; u < ue; u += {{TPR}}u) {
                if (u != lane) {
                    r0 = q_raw(base.x + u);
                    r1 = q_raw(base.y + u);
                    r2 = q_raw(base.z + u);
                    r3 = q_raw(base.w + u);
                }
                qi_t = 0u;
                acc0 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
#ifdef TOK4
                if (t0 + 1u < nt) {
                    qi_t = 2u * {{KC}}u;
                    acc1 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
                }
                if (t0 + 2u < nt) {
                    qi_t = 4u * {{KC}}u;
                    acc2 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
                }
                if (t0 + 3u < nt) {
                    qi_t = 6u * {{KC}}u;
                    acc3 += vec4<f32>(q_dot_i(r0, u), q_dot_i(r1, u), q_dot_i(r2, u), q_dot_i(r3, u));
                }
#endif
            }
        }
#endif
#else
        for (var u = lane; u < units; u += {{TPR}}u) {
            let r0 = q_raw(base.x + u);
            let r1 = q_raw(base.y + u);
            let r2 = q_raw(base.z + u);
            let r3 = q_raw(base.w + u);
            q_row = xr.x;
            acc0 += dot4(r0, r1, r2, r3, u, xr.x);
#ifdef TOK4
            // Tokens past T (a pass of fewer than 4) are skipped: uniform branches, and a token's
            // sums are the same code whichever others the pass has.
            if (t0 + 1u < nt) {
                q_row = xr.y;
                acc1 += dot4(r0, r1, r2, r3, u, xr.y);
            }
            if (t0 + 2u < nt) {
                q_row = xr.z;
                acc2 += dot4(r0, r1, r2, r3, u, xr.z);
            }
            if (t0 + 3u < nt) {
                q_row = xr.w;
                acc3 += dot4(r0, r1, r2, r3, u, xr.w);
            }
#endif
        }
#endif

#ifdef SUBGROUP
        var sums = mv_reduce(acc0, acc1, acc2, acc3, lid, sg_size, sg_lane);
#else
        var sums = mv_reduce(acc0, acc1, acc2, acc3, lid, 1u, 0u);
#endif
#ifdef NORM
        // The norm's scale last: the weights did not wait for its reduction.
#ifdef SUBGROUP
        let rn = li_norm_scales(xr, p.xk, p.eps, lid, sg_size, sg_lane);
#else
        let rn = li_norm_scales(xr, p.xk, p.eps, lid, 1u, 0u);
#endif
        sums *= rn[min(out_j, 3u)];
#endif
        mv_store(sums, lane, yt0 + t0, row0, p.n, yt0 + nt);
        // `red` is rewritten by the next pass.
        workgroupBarrier();
    }
}
