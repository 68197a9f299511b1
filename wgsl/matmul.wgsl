// matmul: y = x · Wᵀ (+ bias) (+ y) for many tokens (prefill), tiled in workgroup memory.
//
// A workgroup of 16 × 16 threads computes a BM × BN tile of y (BM = BN = 16·TILE: token rows ×
// output columns), stepping over K in slices of BK: each step stages x[BM, BK] and W[BN, BK]
// (W unpacked to f32) in workgroup memory, transposed to k-major, then every thread accumulates
// its TILE × TILE outputs in registers.
// Compute: thread (tx, ty) owns the 4 rows from 4·ty and the 4 columns from 4·tx (TILE 8: also
// the blocks 64 further in each direction), so each k step reads one vec4 of xs per 4 rows (the
// same for the 16 threads of a row: broadcast) and one vec4 of ws per 4 columns (16 consecutive
// vec4 across a row of threads: conflict-free), for 16 FMAs per vec4 pair.
// Staging: element pair q (of BK/2 along K) of row r is read by the thread with e = q % 4 +
// 4·(r + BM·(q / 4)): 4 consecutive threads read 32 contiguous bytes of a row (whole memory
// sectors), and the k-major stores of a warp (4 pairs × 8 rows) land in 32 distinct banks, since
// a k-row of xs is padded to BM + 4 words (8·q + r mod 32).
// Each thread stages 4 pairs of x and 4 of W per slice (BM·BK/2 = 1024 for both tiles), and loads
// the next slice's into registers right after the barrier, before computing the current one, so
// that the global loads' latency hides behind the compute.
// Everything out of range (T, N, K tails) is staged as 0 and not stored.
// Workgroup memory: BK · (BM + 4 + BN + 4) f32 words: 17 KiB for TILE 4, BK 32 (64×64 tile);
// 16.5 KiB for TILE 8, BK 16 (128×128 tile).
// Grid: (ceil(N / BN), ceil(T / BM)).
// TILE is 4 or 8 (with the flag TILE8 set for 8).
// Rust: src/ops/matmul/mod.rs matmul
#define TILE 4
#define BK 32

struct Params {
    t: u32,       // T, token rows of x and y
    n: u32,       // N, output columns
    k: u32,       // K
    ld_out: u32,  // row stride of y, in elements (>= N)
}

@group(0) @binding(0) var<storage, read> w: array<u32>;          // (N, K) f16 packed, K/2 words per row
#define LIN_B 1
#define LIN_X vec2<f32>
#include "linear_bindings"

const BM: u32 = 16u * {{TILE}}u;
const BN: u32 = 16u * {{TILE}}u;
const BKP: u32 = {{BK}}u / 2u;          // K pairs (u32 words of W, vec2 of x) per slice
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

// Staging position of element e (see the header): (row, K pair) of the tile.
fn stage_pos(e: u32, rows: u32) -> vec2<u32> {
    let q = e % 4u + 4u * (e / (4u * rows));
    let r = (e / 4u) % rows;
    return vec2<u32>(r, q);
}

// Staging load s (of 4) of this thread: the x pair and the W pair of the K slice from pair kp0.
fn load_x(lid: u32, s: u32, m0: u32, kp0: u32) -> vec2<f32> {
    let rq = stage_pos(lid + s * 256u, BM);
    let m = m0 + rq.x;
    let kp = kp0 + rq.y;
    let kp_total = p.k / 2u;
    if (m < p.t && kp < kp_total) {
        return x[m * kp_total + kp];
    }
    return vec2<f32>(0.0);
}
fn load_w(lid: u32, s: u32, n0: u32, kp0: u32) -> vec2<f32> {
    let rq = stage_pos(lid + s * 256u, BN);
    let n = n0 + rq.x;
    let kp = kp0 + rq.y;
    let kp_total = p.k / 2u;
    if (n < p.n && kp < kp_total) {
        return unpack2x16float(w[n * kp_total + kp]);
    }
    return vec2<f32>(0.0);
}
fn store_x(lid: u32, s: u32, v: vec2<f32>) {
    let rq = stage_pos(lid + s * 256u, BM);
    let at = 2u * rq.y * XS4 + rq.x / 4u;
    xs[at][rq.x % 4u] = v.x;
    xs[at + XS4][rq.x % 4u] = v.y;
}
fn store_w(lid: u32, s: u32, v: vec2<f32>) {
    let rq = stage_pos(lid + s * 256u, BN);
    let at = 2u * rq.y * WS4 + rq.x / 4u;
    ws[at][rq.x % 4u] = v.x;
    ws[at + WS4][rq.x % 4u] = v.y;
}

#include "linear_store"

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let kp_total = p.k / 2u;

    // Accumulators cIJ: row block I, column block J, component = column; named vec4, not an
    // indexed array, so that they stay in registers on every compiler.
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

    // The next slice's staging loads, in registers: issued before the current slice's compute so
    // that their latency hides behind it.
    var x0 = load_x(lid, 0u, m0, 0u);
    var x1 = load_x(lid, 1u, m0, 0u);
    var x2 = load_x(lid, 2u, m0, 0u);
    var x3 = load_x(lid, 3u, m0, 0u);
    var w0 = load_w(lid, 0u, n0, 0u);
    var w1 = load_w(lid, 1u, n0, 0u);
    var w2 = load_w(lid, 2u, n0, 0u);
    var w3 = load_w(lid, 3u, n0, 0u);

    for (var kp0 = 0u; kp0 < kp_total; kp0 += BKP) {
        store_x(lid, 0u, x0);
        store_x(lid, 1u, x1);
        store_x(lid, 2u, x2);
        store_x(lid, 3u, x3);
        store_w(lid, 0u, w0);
        store_w(lid, 1u, w1);
        store_w(lid, 2u, w2);
        store_w(lid, 3u, w3);
        workgroupBarrier();
        let next = kp0 + BKP;
        if (next < kp_total) {
            x0 = load_x(lid, 0u, m0, next);
            x1 = load_x(lid, 1u, m0, next);
            x2 = load_x(lid, 2u, m0, next);
            x3 = load_x(lid, 3u, m0, next);
            w0 = load_w(lid, 0u, n0, next);
            w1 = load_w(lid, 1u, n0, next);
            w2 = load_w(lid, 2u, n0, next);
            w3 = load_w(lid, 3u, n0, next);
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
