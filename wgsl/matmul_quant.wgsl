// matmul_quant: y = x · Wᵀ (+ bias) (+ y) for many tokens (prefill), with W in a GGUF quantized
// type (include/quant.wgsl: the type flag, the planes layout, the dequantization), tiled in
// workgroup memory as matmul.wgsl: W's tiles are dequantized (q_run, bit-identical to the CPU's
// to_f32) into workgroup memory as f32.
//
// A workgroup of 16 × 16 threads computes a BM × BN tile of y (BM = BN = 16·TILE: token rows ×
// output columns), stepping over K in slices of BK: each step stages x[BM, BK] and W[BN, BK] in
// workgroup memory, transposed to k-major, then every thread accumulates its TILE × TILE outputs
// in registers (thread (tx, ty): the 4 rows from 4·ty and the 4 columns from 4·tx; TILE 8: also
// the blocks 64 further in each direction).
// Staging: a slice of a tile is BM · BK / 4 runs of 4 consecutive k (512 for both tiles), 2 per
// thread; run e is row e % BM, k-run e / BM, so a warp's k-major stores land on consecutive words
// (conflict-free; a k-row is padded to BM + 4 words). Each thread loads (and dequantizes) the next
// slice's runs into registers right after the barrier, before computing the current one.
// K is a whole number of blocks (of 32 or 256: a multiple of BK); out-of-range rows (T, N tails)
// are staged as 0 and not stored.
// Workgroup memory: BK · (BM + 4 + BN + 4) f32 words: 17 KiB for TILE 4, BK 32 (64×64 tile);
// 16.5 KiB for TILE 8, BK 16 (128×128 tile).
// Grid: (ceil(N / BN), ceil(T / BM)). TILE is 4 or 8 (with the flag TILE8 set for 8).
// Rust: src/ops/matmul/gguf/matmul.rs matmul_quant
#define TILE 4
#define BK 32

#include "quant"

#include "matmul_quant_params"

@group(0) @binding(0) var<storage, read> ww: array<u32>;         // the planes
#define LIN_B 1
#define LIN_X vec4<f32>
#include "linear_bindings"

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

const BM: u32 = 16u * {{TILE}}u;
const BN: u32 = 16u * {{TILE}}u;
const XS4: u32 = BM / 4u + 1u;          // padded k-row of xs, in vec4
const WS4: u32 = BN / 4u + 1u;          // padded k-row of ws, in vec4

var<workgroup> xs: array<vec4<f32>, {{BK}} * (4 * {{TILE}} + 1)>;  // [k][m / 4], k-major
var<workgroup> ws: array<vec4<f32>, {{BK}} * (4 * {{TILE}} + 1)>;  // [k][n / 4], k-major

// Stores the 4 outputs of row m from column c (those inside T and N).
fn store4(m: u32, c: u32, v: vec4<f32>) {
    if (m >= p.t) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (c + j < p.n) {
            store(m, c + j, v[j]);
        }
    }
}

// Staging run s (of 2) of this thread: (row in the tile, k-run in the slice).
fn run_pos(lid: u32, s: u32, rows: u32) -> vec2<u32> {
    let e = lid + s * 256u;
    return vec2<u32>(e % rows, e / rows);
}

fn load_x(lid: u32, s: u32, m0: u32, k0: u32) -> vec4<f32> {
    let rq = run_pos(lid, s, BM);
    let m = m0 + rq.x;
    let kk = k0 + 4u * rq.y;
    if (m < p.t && kk < p.k) {
        return x[(m * p.k + kk) / 4u];
    }
    return vec4<f32>(0.0);
}

fn load_w(lid: u32, s: u32, n0: u32, k0: u32) -> vec4<f32> {
    let rq = run_pos(lid, s, BN);
    let n = n0 + rq.x;
    let kk = k0 + 4u * rq.y;
    if (n < p.n && kk < p.k) {
        return q_run(n * p.bpr + kk / QK, kk % QK);
    }
    return vec4<f32>(0.0);
}

// Run s's 4 values go to k-rows 4q .. 4q + 3, column r.
fn store_x(lid: u32, s: u32, v: vec4<f32>) {
    let rq = run_pos(lid, s, BM);
    let at = 4u * rq.y * XS4 + rq.x / 4u;
    let c = rq.x % 4u;
    xs[at][c] = v.x;
    xs[at + XS4][c] = v.y;
    xs[at + 2u * XS4][c] = v.z;
    xs[at + 3u * XS4][c] = v.w;
}

fn store_w(lid: u32, s: u32, v: vec4<f32>) {
    let rq = run_pos(lid, s, BN);
    let at = 4u * rq.y * WS4 + rq.x / 4u;
    let c = rq.x % 4u;
    ws[at][c] = v.x;
    ws[at + WS4][c] = v.y;
    ws[at + 2u * WS4][c] = v.z;
    ws[at + 3u * WS4][c] = v.w;
}

#include "linear_store"

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;

    // Accumulators cIJ: row block I, column block J, component = column.
    var c00 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0);
#ifdef TILE8
    var c01 = vec4<f32>(0.0);
    var c11 = vec4<f32>(0.0);
    var c21 = vec4<f32>(0.0);
    var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0);
    var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0);
    var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0);
    var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0);
    var c71 = vec4<f32>(0.0);
#endif

    var x0 = load_x(lid, 0u, m0, 0u);
    var x1 = load_x(lid, 1u, m0, 0u);
    var w0 = load_w(lid, 0u, n0, 0u);
    var w1 = load_w(lid, 1u, n0, 0u);

    for (var k0 = 0u; k0 < p.k; k0 += {{BK}}u) {
        store_x(lid, 0u, x0);
        store_x(lid, 1u, x1);
        store_w(lid, 0u, w0);
        store_w(lid, 1u, w1);
        workgroupBarrier();
        let next = k0 + {{BK}}u;
        if (next < p.k) {
            x0 = load_x(lid, 0u, m0, next);
            x1 = load_x(lid, 1u, m0, next);
            w0 = load_w(lid, 0u, n0, next);
            w1 = load_w(lid, 1u, n0, next);
        }

        for (var kk = 0u; kk < {{BK}}u; kk++) {
            let a0 = xs[kk * XS4 + l.y];
            let b0 = ws[kk * WS4 + l.x];
            c00 = fma(vec4<f32>(a0.x), b0, c00);
            c10 = fma(vec4<f32>(a0.y), b0, c10);
            c20 = fma(vec4<f32>(a0.z), b0, c20);
            c30 = fma(vec4<f32>(a0.w), b0, c30);
#ifdef TILE8
            let a1 = xs[kk * XS4 + l.y + 16u];
            let b1 = ws[kk * WS4 + l.x + 16u];
            c01 = fma(vec4<f32>(a0.x), b1, c01);
            c11 = fma(vec4<f32>(a0.y), b1, c11);
            c21 = fma(vec4<f32>(a0.z), b1, c21);
            c31 = fma(vec4<f32>(a0.w), b1, c31);
            c40 = fma(vec4<f32>(a1.x), b0, c40);
            c41 = fma(vec4<f32>(a1.x), b1, c41);
            c50 = fma(vec4<f32>(a1.y), b0, c50);
            c51 = fma(vec4<f32>(a1.y), b1, c51);
            c60 = fma(vec4<f32>(a1.z), b0, c60);
            c61 = fma(vec4<f32>(a1.z), b1, c61);
            c70 = fma(vec4<f32>(a1.w), b0, c70);
            c71 = fma(vec4<f32>(a1.w), b1, c71);
#endif
        }
        workgroupBarrier();
    }

    let m = m0 + 4u * l.y;
    let c = n0 + 4u * l.x;
    store4(m, c, c00);
    store4(m + 1u, c, c10);
    store4(m + 2u, c, c20);
    store4(m + 3u, c, c30);
#ifdef TILE8
    store4(m, c + 64u, c01);
    store4(m + 1u, c + 64u, c11);
    store4(m + 2u, c + 64u, c21);
    store4(m + 3u, c + 64u, c31);
    store4(m + 64u, c, c40);
    store4(m + 64u, c + 64u, c41);
    store4(m + 65u, c, c50);
    store4(m + 65u, c + 64u, c51);
    store4(m + 66u, c, c60);
    store4(m + 66u, c + 64u, c61);
    store4(m + 67u, c, c70);
    store4(m + 67u, c + 64u, c71);
#endif
}
