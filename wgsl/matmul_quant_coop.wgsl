// matmul_quant_coop: matmul_quant.wgsl (y = x · Wᵀ (+ bias) (+ y) for many tokens, W in a GGUF /
// MLX quantized type) on cooperative matrices: the tensor cores, through wgpu's experimental
// `wgpu_cooperative_matrix` (Vulkan's VK_KHR_cooperative_matrix), 16 × 16 × 16 tiles of f16
// inputs with f32 sums. Only where the device has that configuration and subgroups (the host
// sets nothing else here: src/ops/matmul/gguf.rs); Metal's simdgroup matrices are 8 × 8.
//
// x and W's dequantized values (q_run, as matmul_quant: bit-identical to to_f32) meet as f16
// (rounded to nearest even), every product and sum in f32: the CPU twin is
// src/ops/matmul/gguf.rs `cpu::linear_quant_f16`.
//
// A workgroup of 4 subgroups (WG = 4 · SG threads) computes a BM × BN = 64 × 64 tile of y (token
// rows × output columns), stepping over K in slices of BK: each step stages x[BM, BK] (row-major,
// as the A matrix) and W[BN, BK] (row n holds column n of the B matrix, K × N: B column-major) as
// f16 in workgroup memory, then subgroup s computes the 32 × 32 quarter (s / 2, s % 2) as 2 × 2
// accumulator tiles. At the end the accumulators go through workgroup memory to the epilogue
// (bias, soft-capping, accumulation), every thread storing 32 outputs.
// K is a whole number of blocks (of 32 or 256: a multiple of BK); rows past T and N are staged as
// 0 and not stored.
// Grid: (ceil(N / BN), ceil(T / BM)).
enable f16;
enable wgpu_cooperative_matrix;

#define BK 32
#define SG 32

#include "quant"

struct Params {
    t: u32,       // T, token rows of x and y
    n: u32,       // N, output columns
    k: u32,       // K
    ld_out: u32,  // row stride of y, in elements (>= N)
    o1: u32,      // first word of plane 1
    o2: u32,      // first word of plane 2
    bpr: u32,     // blocks per row: K / QK
    _pad: u32,
}

@group(0) @binding(0) var<storage, read> ww: array<u32>;         // the planes
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;    // (T, K)
@group(0) @binding(2) var<storage, read_write> y: array<f32>;    // (T, ld_out), columns [0, N) written
@group(0) @binding(3) var<uniform> p: Params;
#ifdef BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;       // (N)
#endif

// quant.wgsl's accessors: q_run reads words only.
fn qw4(i: u32) -> vec4<u32> {
    return vec4<u32>(ww[4u * i], ww[4u * i + 1u], ww[4u * i + 2u], ww[4u * i + 3u]);
}
fn qw1(i: u32) -> u32 {
    return ww[i];
}
fn qx4(i: u32) -> vec4<f32> {
    return x[i];
}
fn q_planes() -> vec2<u32> {
    return vec2<u32>(p.o1, p.o2);
}

const WG: u32 = 4u * {{SG}}u;
const BM: u32 = 64u;
const BN: u32 = 64u;
const LDA: u32 = {{BK}}u + 8u;   // padded k-row of the staged tiles, in f16 (16-byte multiple)
const LDC: u32 = BN + 4u;        // padded row of the output tile, in f32

var<workgroup> xa: array<f16, BM * LDA>;   // (BM, BK) x's slice, row-major (A)
var<workgroup> wb: array<f16, BN * LDA>;   // (BN, BK) W's slice: B (BK × BN) column-major
var<workgroup> cs: array<f32, BM * LDC>;   // (BM, BN) the output tile

#include "softcap"

// Stores output (token m, column n).
fn store(m: u32, n: u32, v: f32) {
    if (m >= p.t || n >= p.n) {
        return;
    }
    var o = v;
#ifdef BIAS
    o += bias[n];
#endif
#ifdef SOFTCAP
    o = softcap(o);
#endif
    let at = m * p.ld_out + n;
#ifdef ACCUMULATE
    o += y[at];
#endif
    y[at] = o;
}

// Run e (of BM · BK / 4 = BN · BK / 4) of a slice: (row, k-run of 4).
fn run_pos(e: u32) -> vec2<u32> {
    return vec2<u32>(e / ({{BK}}u / 4u), e % ({{BK}}u / 4u));
}

fn load_x(e: u32, m0: u32, k0: u32) -> vec4<f32> {
    let rq = run_pos(e);
    let m = m0 + rq.x;
    if (m < p.t) {
        return x[(m * p.k + k0) / 4u + rq.y];
    }
    return vec4<f32>(0.0);
}

fn load_w(e: u32, n0: u32, k0: u32) -> vec4<f32> {
    let rq = run_pos(e);
    let n = n0 + rq.x;
    let kk = k0 + 4u * rq.y;
    if (n < p.n) {
        return q_run(n * p.bpr + kk / QK, kk % QK);
    }
    return vec4<f32>(0.0);
}

// Where run e's 4 values go in a staged tile.
fn run_at(e: u32) -> u32 {
    let rq = run_pos(e);
    return rq.x * LDA + 4u * rq.y;
}

const RUNS: u32 = BM * {{BK}}u / 4u / WG;   // runs per thread per tile and slice

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_size) sg_size: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let s = lid / sg_size;
    let am = 32u * (s / 2u);   // the subgroup's rows of the tile
    let bn = 32u * (s % 2u);   // and columns
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += {{BK}}u) {
        for (var r = 0u; r < RUNS; r++) {
            let e = lid + r * WG;
            let at = run_at(e);
            let xv = vec4<f16>(load_x(e, m0, k0));
            let wv = vec4<f16>(load_w(e, n0, k0));
            xa[at] = xv.x;
            xa[at + 1u] = xv.y;
            xa[at + 2u] = xv.z;
            xa[at + 3u] = xv.w;
            wb[at] = wv.x;
            wb[at + 1u] = wv.y;
            wb[at + 2u] = wv.z;
            wb[at + 3u] = wv.w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < {{BK}}u; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xa[am * LDA + kk], LDA);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xa[(am + 16u) * LDA + kk], LDA);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&wb[bn * LDA + kk], LDA);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&wb[(bn + 16u) * LDA + kk], LDA);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    coopStoreT(c00, &cs[am * LDC + bn], LDC);
    coopStoreT(c01, &cs[am * LDC + bn + 16u], LDC);
    coopStoreT(c10, &cs[(am + 16u) * LDC + bn], LDC);
    coopStoreT(c11, &cs[(am + 16u) * LDC + bn + 16u], LDC);
    workgroupBarrier();
    for (var i = lid; i < BM * BN; i += WG) {
        store(m0 + i / BN, n0 + i % BN, cs[(i / BN) * LDC + i % BN]);
    }
}
