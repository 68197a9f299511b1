// matmul_quant_coop: matmul_quant.wgsl (y = x · Wᵀ (+ bias) (+ y) for many tokens, W in a GGUF /
// MLX quantized type) on cooperative matrices: the tensor cores, through wgpu's experimental
// `wgpu_cooperative_matrix` (Vulkan's VK_KHR_cooperative_matrix), 16 × 16 × 16 tiles of f16
// inputs with f32 sums. Only where the device has that configuration and subgroups of 32 (the
// host decides: src/ops/matmul/gguf.rs); Metal's simdgroup matrices are 8 × 8.
//
// x and W's dequantized values (q_run, as matmul_quant: bit-identical to to_f32) meet as f16
// (rounded to nearest even), every product and sum in f32: the CPU twin is
// src/ops/matmul/gguf.rs `cpu::round_f16` of both, met by `matmul::cpu::linear`.
//
// A workgroup of 8 subgroups of 32 computes a BM × BN = 128 × 64 tile of y (token rows × output
// columns; W's slices are dequantized once per 128 tokens), stepping over K in slices of BK = 32:
// each step stages x[BM, BK] (row-major: the A matrix) and W[BN, BK] (row n holds column n of the
// B matrix, K × N: B column-major) as f16 in workgroup memory, while each thread's share of the
// next slice is already loading into registers; subgroup s computes the 32 × 32 block (s % 4,
// s / 4) as 2 × 2 accumulator tiles. At the end each subgroup passes its tiles one at a time
// through 1 KiB of workgroup memory to the epilogue (bias, soft-capping, accumulation).
// K is a whole number of blocks (of 32 or 256: a multiple of BK); rows past T and N are staged as
// 0 and not stored.
// Grid: (ceil(N / BN), ceil(T / BM)).
// Measurement probes (tests only, `bench_coop`): PROBE_NOX, PROBE_NOW leave x's or W's loads
// out, PROBE_NOMMA the tensor-core ops.
// Rust: src/ops/matmul/gguf/matmul.rs matmul_quant_coop
enable f16;
enable wgpu_cooperative_matrix;

#include "quant"

#include "matmul_quant_params"

#include "quant_views"

#define LIN_B 2
#define LIN_X vec4<f32>
#include "linear_bindings"

fn qx4(i: u32) -> vec4<f32> {
    return x[i];
}

const WG: u32 = 256u;
const BM: u32 = 128u;
const BN: u32 = 64u;
const BK: u32 = 32u;
const LDA: u32 = BK + 8u;   // padded k-row of the staged tiles, in f16 (a 16-byte multiple)

var<workgroup> xa: array<f16, BM * LDA>;    // (BM, BK) x's slice, row-major (A)
var<workgroup> wb: array<f16, BN * LDA>;    // (BN, BK) W's slice: B (BK × BN) column-major
var<workgroup> ep: array<f32, 8u * 256u>;   // (8, 16, 16) each subgroup's tile on its way out

#include "linear_store"

// Run e of a slice (4 consecutive k of one row; BK / 4 runs a row): (row, k-run).
fn run_pos(e: u32) -> vec2<u32> {
    return vec2<u32>(e / (BK / 4u), e % (BK / 4u));
}

// x's run e of the slice at k0 (tile rows from m0); zeros past T.
fn load_x(e: u32, m0: u32, k0: u32) -> vec4<f32> {
#ifdef PROBE_NOX
    return vec4<f32>(1.0) + 0.0 * x[e % 4u];
#else
    let rq = run_pos(e);
    let m = m0 + rq.x;
    if (m < p.t) {
        return x[(m * p.k + k0) / 4u + rq.y];
    }
    return vec4<f32>(0.0);
#endif
}

// W's run e of the slice at k0 (tile columns from n0), dequantized; zeros past N.
fn load_w(e: u32, n0: u32, k0: u32) -> vec4<f32> {
#ifdef PROBE_NOW
    return vec4<f32>(1.0 + 0.0 * f32(ww[e % 4u] + wv[e % 4u].x));
#else
    let rq = run_pos(e);
    let n = n0 + rq.x;
    let kk = k0 + 4u * rq.y;
    if (n < p.n) {
        return q_run(n * p.bpr + kk / QK, kk % QK);
    }
    return vec4<f32>(0.0);
#endif
}

// Stores run e's 4 values as f16 into a staged tile.
fn put_x(e: u32, v: vec4<f32>) {
    let rq = run_pos(e);
    let at = rq.x * LDA + 4u * rq.y;
    let h = vec4<f16>(v);
    xa[at] = h.x;
    xa[at + 1u] = h.y;
    xa[at + 2u] = h.z;
    xa[at + 3u] = h.w;
}

fn put_w(e: u32, v: vec4<f32>) {
    let rq = run_pos(e);
    let at = rq.x * LDA + 4u * rq.y;
    let h = vec4<f16>(v);
    wb[at] = h.x;
    wb[at + 1u] = h.y;
    wb[at + 2u] = h.z;
    wb[at + 3u] = h.w;
}

// One accumulator tile of subgroup s out: rows from m, columns from n of y (those inside T, N).
fn emit(c: coop_mat16x16<f32, C>, s: u32, lane: u32, m: u32, n: u32) {
    coopStoreT(c, &ep[s * 256u], 16u);
    workgroupBarrier();
    for (var i = lane; i < 256u; i += 32u) {
        if (m + i / 16u < p.t && n + i % 16u < p.n) {
            store(m + i / 16u, n + i % 16u, ep[s * 256u + i]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) s: u32, @builtin(subgroup_invocation_id) lane: u32) {
    // q_run reads one view or both, by type: a (never taken) use keeps both in the bind group
    // layout for every type (p.n > 0).
    if (p.n == 0u) {
        y[0] = bitcast<f32>(ww[0] ^ wv[0].x);
    }
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let am = 32u * (s % 4u);   // the subgroup's rows of the tile
    let bn = 32u * (s / 4u);   // and columns
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    // This thread's runs of each tile (x: 4 of BM · BK / 4, W: 2 of BN · BK / 4), loaded a slice
    // ahead: in flight during the tensor-core ops.
    var x0 = load_x(lid, m0, 0u);
    var x1 = load_x(lid + WG, m0, 0u);
    var x2 = load_x(lid + 2u * WG, m0, 0u);
    var x3 = load_x(lid + 3u * WG, m0, 0u);
    var w0 = load_w(lid, n0, 0u);
    var w1 = load_w(lid + WG, n0, 0u);
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        put_x(lid, x0);
        put_x(lid + WG, x1);
        put_x(lid + 2u * WG, x2);
        put_x(lid + 3u * WG, x3);
        put_w(lid, w0);
        put_w(lid + WG, w1);
        workgroupBarrier();
        let next = k0 + BK;
        if (next < p.k) {
            x0 = load_x(lid, m0, next);
            x1 = load_x(lid + WG, m0, next);
            x2 = load_x(lid + 2u * WG, m0, next);
            x3 = load_x(lid + 3u * WG, m0, next);
            w0 = load_w(lid, n0, next);
            w1 = load_w(lid + WG, n0, next);
        }
#ifndef PROBE_NOMMA
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[am * LDA + kk], LDA);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[(am + 16u) * LDA + kk], LDA);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&wb[bn * LDA + kk], LDA);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&wb[(bn + 16u) * LDA + kk], LDA);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
#endif
        workgroupBarrier();
    }
    emit(c00, s, lane, m0 + am, n0 + bn);
    emit(c01, s, lane, m0 + am, n0 + bn + 16u);
    emit(c10, s, lane, m0 + am + 16u, n0 + bn);
    emit(c11, s, lane, m0 + am + 16u, n0 + bn + 16u);
}
