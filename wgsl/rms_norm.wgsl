// rms_norm: for each of `rows` rows of n f32,
//   out[r, i] = x[r, i] * inverseSqrt(mean_i(x[r, i]^2) + eps) * w[i]
// (Gemma's (1 + w) is folded into w at load). With ACCUMULATE: out[r, i] = (out[r, i] + that) *
// out_scale instead (Gemma's sandwich norms: x_resid += rms_norm(tmp) * w; Gemma 4 then scales the
// layer's output by its layer_scalar; out_scale = 1 elsewhere, the same bits as a plain add). With
// ACCUMULATE and NEXT, the same workgroup then normalizes the updated row for the next projection:
// out2[r, i] = out[r, i] * inverseSqrt(mean_i(out[r, i]^2) + eps) * w2[i] (out2 in out's row
// layout): a post-norm's residual add and the next pre-norm in one dispatch; with STAGE (n a
// multiple of 32) it also writes out2's rows staged as wgsl/quantize_x16.wgsl writes them, for the
// next projection's integer-dot-product matvec (matvec_quant XG): once out2 is written, the
// workgroup re-reads it a thread a block, or (STAGE8, with REG and subgroups of 8 or more) stages
// each block from the registers as it writes them, the block's eight threads meeting by shuffles.
// STAGE without NEXT stages out's rows the same way (a pre-norm of its own staging the input of the
// projections after it). With IN_PLACE: x is normalized in place (binding 0 is both input and output; there is no out binding; out_stride is
// ignored).
//
// Row r starts at element r * x_stride of x and r * out_stride of out, so x and out may be
// strided (or views: Tensor.offset, 256-byte aligned).
// Grid: one workgroup per row, 2-D folded (see gpu/kernel.rs); WG threads stride over the row,
// four elements a step where n is a multiple of 4 (a row alone is one workgroup: the loads'
// latency, not bandwidth, sets its time); REG (not with IN_PLACE): rows of up to 4 · WG · RV
// elements held in registers, RV vec4 a thread. Sum of squares: per-thread partial sums, then a
// workgroup reduction (subgroupAdd per subgroup + shared memory under SUBGROUP, a shared-memory
// tree otherwise).
// Rust: src/ops/norm.rs rms_norm_with, rms_norm_in_place
#define WG 256
#define RV 1
// STAGE: the binding number of xs (6 with NEXT, else 4).
#define XSB 6

#ifdef STAGE
#define XS_STORE
#include "stage_x16"
#endif

struct Params {
    rows: u32,
    n: u32,
    x_stride: u32,
    out_stride: u32,
    eps: f32,
    out_scale: f32,   // ACCUMULATE: (out + norm(x)) * out_scale
    _pad1: u32,
    _pad2: u32,
}

#ifdef IN_PLACE
@group(0) @binding(0) var<storage, read_write> x: array<f32>;  // (rows, x_stride) normalized in place
@group(0) @binding(1) var<storage, read> w: array<f32>;        // (n)
@group(0) @binding(2) var<uniform> p: Params;
#else
@group(0) @binding(0) var<storage, read> x: array<f32>;        // (rows, x_stride) first n of each row used
@group(0) @binding(1) var<storage, read> w: array<f32>;        // (n)
@group(0) @binding(2) var<storage, read_write> out: array<f32>; // (rows, out_stride) first n of each row written
@group(0) @binding(3) var<uniform> p: Params;
#ifdef NEXT
@group(0) @binding(4) var<storage, read> w2: array<f32>;          // (n) the next norm's weight
@group(0) @binding(5) var<storage, read_write> out2: array<f32>;  // (rows, out_stride) the updated rows, normalized
#endif
#ifdef STAGE
@group(0) @binding({{XSB}}) var<storage, read_write> xs: array<u32>; // (rows, n / 32, 20) out2 (NEXT) or out staged as quantize_x16 does
#endif
#endif

// One slot per thread: enough for any subgroup count (subgroup size >= 1).
var<workgroup> partial: array<f32, {{WG}}>;

// The workgroup's sum of every thread's `s` (each thread gets it). Starts with a barrier, so a
// second call may reuse `partial` once every thread has read the first result.
fn row_sum(s: f32, lid: u32
#ifdef SUBGROUP
        , sg_lane: u32, sg_id: u32, sg_count: u32
#endif
        ) -> f32 {
    workgroupBarrier();
#ifdef SUBGROUP
    // Never assume a subgroup size: one partial per subgroup, summed by every thread.
    let sg_sum = subgroupAdd(s);
    if (sg_lane == 0u) {
        partial[sg_id] = sg_sum;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var k = 0u; k < sg_count; k++) {
        total += partial[k];
    }
    return total;
#else
#define TREE partial
#define TREE_V s
#define TREE_H stride
#include "tree_sum"
    return partial[0];
#endif
}

// Four consecutive elements (the row length a multiple of 4), and the sum of their squares.
fn x4(at: u32) -> vec4<f32> {
    return vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
}

fn w4(i: u32) -> vec4<f32> {
    return vec4<f32>(w[i], w[i + 1u], w[i + 2u], w[i + 3u]);
}

fn sq4(a: vec4<f32>) -> f32 {
    return (a.x * a.x + a.y * a.y) + (a.z * a.z + a.w * a.w);
}

#ifndef IN_PLACE
// What out[at ..] holds before the update: the residual with ACCUMULATE (else unused: 0).
fn prev4(at: u32) -> vec4<f32> {
#ifdef ACCUMULATE
    return vec4<f32>(out[at], out[at + 1u], out[at + 2u], out[at + 3u]);
#else
    return vec4<f32>(0.0);
#endif
}

// Writes out[at ..] for x elements xv4 (weights wv): xv4 · scale · wv, or with ACCUMULATE
// (prev + that) · out_scale; returns what it wrote.
fn update4(at: u32, wv: vec4<f32>, xv4: vec4<f32>, scale: f32, prev: vec4<f32>) -> vec4<f32> {
    let v = xv4 * scale * wv;
#ifdef ACCUMULATE
    let o = (prev + v) * p.out_scale;
#else
    let o = v;
#endif
    out[at] = o.x;
    out[at + 1u] = o.y;
    out[at + 2u] = o.z;
    out[at + 3u] = o.w;
    return o;
}
#endif

#ifndef IN_PLACE
#ifdef STAGE
// Element i of the rows the dispatch ends with: out2 with NEXT, else out.
fn last(i: u32) -> f32 {
#ifdef NEXT
    return out2[i];
#else
    return out[i];
#endif
}

// Those rows' row `row` (written by this workgroup) staged for the integer-dot-product matvec, a
// thread a 32-element block (include/stage_x16.wgsl), once every thread's writes are visible.
fn stage_rows(row: u32, ob: u32, lid: u32) {
#ifdef SUBGROUP
#ifdef STAGE8
    // (REG with STAGE8: staged from the registers as the rows were written, stage_vec.)
    return;
#endif
#endif
    storageBarrier();
    let bpr = p.n / 32u;
    for (var blk = lid; blk < bpr; blk += {{WG}}u) {
        var v: array<vec4<f32>, 8>;
        for (var j = 0u; j < 8u; j++) {
            let i = ob + 32u * blk + 4u * j;
            v[j] = vec4<f32>(last(i), last(i + 1u), last(i + 2u), last(i + 3u));
        }
        let b = stage_block(v);
        let o = 20u * (row * bpr + blk);
        for (var j = 0u; j < 20u; j++) {
            xs[o + j] = b[j / 4u][j % 4u];
        }
    }
}

#ifdef SUBGROUP
#ifdef STAGE8
// REG: vec4 j of this thread (elements 4 (lid + j WG) ..), v as written, staged with the other
// seven of its block (lanes lid & ~7 .. + 7 hold them: WG is a multiple of 8) by shuffles; every
// thread runs it, those past n (inside false) store nothing.
fn stage_vec(row: u32, lid: u32, j: u32, v: vec4<f32>, inside: bool) {
    stage_store8(20u * (row * (p.n / 32u) + (lid + j * {{WG}}u) / 8u), lid & 7u, v, inside);
}
#endif
#endif
#endif
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#ifdef SUBGROUP
        , @builtin(subgroup_invocation_id) sg_lane: u32
        , @builtin(subgroup_id) sg_id: u32
        , @builtin(num_subgroups) sg_count: u32
#endif
        ) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) {
        return;  // uniform across the workgroup
    }
    let n = p.n;
    let xb = row * p.x_stride;

#ifdef REG
    // The row in registers (n % 4 == 0, n <= 4 · WG · RV): every thread issues all its loads (x,
    // the residual with ACCUMULATE, the weights) before any use, so the row costs one memory round
    // trip instead of one per loop step and phase. Same sums, same order, as the loops below.
    let ob = row * p.out_stride;
    var xv: array<vec4<f32>, {{RV}}>;
    var res: array<vec4<f32>, {{RV}}>;
    var wv: array<vec4<f32>, {{RV}}>;
#ifdef NEXT
    var w2v: array<vec4<f32>, {{RV}}>;
#endif
    for (var j = 0u; j < {{RV}}u; j++) {
        let i = 4u * (lid + j * {{WG}}u);
        if (i < n) {
            xv[j] = x4(xb + i);
            res[j] = prev4(ob + i);
            wv[j] = w4(i);
#ifdef NEXT
            w2v[j] = vec4<f32>(w2[i], w2[i + 1u], w2[i + 2u], w2[i + 3u]);
#endif
        }
    }
    var s = 0.0;
    for (var j = 0u; j < {{RV}}u; j++) {
        if (4u * (lid + j * {{WG}}u) < n) {
            s += sq4(xv[j]);
        }
    }
    let total = row_sum(s, lid
#ifdef SUBGROUP
        , sg_lane, sg_id, sg_count
#endif
        );
    let scale = inverseSqrt(total / f32(n) + p.eps);
    var s2 = 0.0;
    for (var j = 0u; j < {{RV}}u; j++) {
        let i = 4u * (lid + j * {{WG}}u);
        if (i < n) {
            xv[j] = update4(ob + i, wv[j], xv[j], scale, res[j]);
            s2 += sq4(xv[j]);
        }
    }
#ifdef NEXT
#include "rms_norm_next_scale"
    for (var j = 0u; j < {{RV}}u; j++) {
        let i = 4u * (lid + j * {{WG}}u);
        let v2 = xv[j] * scale2 * w2v[j];
        if (i < n) {
            out2[ob + i] = v2.x;
            out2[ob + i + 1u] = v2.y;
            out2[ob + i + 2u] = v2.z;
            out2[ob + i + 3u] = v2.w;
        }
#ifdef STAGE
#ifdef SUBGROUP
#ifdef STAGE8
        stage_vec(row, lid, j, v2, i < n);
#endif
#endif
#endif
    }
#endif
#ifdef STAGE
#ifndef NEXT
#ifdef SUBGROUP
#ifdef STAGE8
    for (var j = 0u; j < {{RV}}u; j++) {
        stage_vec(row, lid, j, xv[j], 4u * (lid + j * {{WG}}u) < n);
    }
#endif
#endif
#endif
    stage_rows(row, ob, lid);
#endif
    return;
#else
    var s = 0.0;
    let quad = n % 4u == 0u;
    if (quad) {
        for (var i = 4u * lid; i < n; i += 4u * {{WG}}u) {
            s += sq4(x4(xb + i));
        }
    } else {
        for (var i = lid; i < n; i += {{WG}}u) {
            let v = x[xb + i];
            s += v * v;
        }
    }
    let total = row_sum(s, lid
#ifdef SUBGROUP
        , sg_lane, sg_id, sg_count
#endif
        );

    let scale = inverseSqrt(total / f32(n) + p.eps);
#ifdef IN_PLACE
    for (var i = lid; i < n; i += {{WG}}u) {
        x[xb + i] = x[xb + i] * scale * w[i];
    }
#else
    let ob = row * p.out_stride;
    var s2 = 0.0;
    if (quad) {
        for (var i = 4u * lid; i < n; i += 4u * {{WG}}u) {
            s2 += sq4(update4(ob + i, w4(i), x4(xb + i), scale, prev4(ob + i)));
        }
    } else {
        for (var i = lid; i < n; i += {{WG}}u) {
            let v = x[xb + i] * scale * w[i];
#ifdef ACCUMULATE
            let o = (out[ob + i] + v) * p.out_scale;
#else
            let o = v;
#endif
            out[ob + i] = o;
            s2 += o * o;
        }
    }
#ifdef NEXT
    // The updated row, normalized: each thread rereads the elements it wrote.
#include "rms_norm_next_scale"
    let step = select(1u, 4u, quad);
    for (var i0 = step * lid; i0 < n; i0 += step * {{WG}}u) {
        for (var j = 0u; j < step; j++) {
            out2[ob + i0 + j] = out[ob + i0 + j] * scale2 * w2[i0 + j];
        }
    }
#endif
#ifdef STAGE
    stage_rows(row, ob, lid);
#endif
#endif
#endif
}
