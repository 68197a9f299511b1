// matmul: y = x · Wᵀ (+ bias) (+ y) for T > 1 tokens (prefill), tiled in workgroup memory.
//
// A workgroup of 16 × 16 threads computes a BM × BN tile of y (BM = BN = 16·TILE: token rows ×
// output columns), stepping over K in slices of BK: each step stages x[BM, BK] and W[BN, BK]
// (unpacked to f32) in workgroup memory, transposed to k-major, then every thread accumulates its
// TILE × TILE outputs in registers. Thread (tx, ty) owns rows ty + 16·i and columns tx + 16·j
// (strided, so the 16 threads of a row read 16 consecutive words of workgroup memory and write
// 16 consecutive columns of y). Staging loads: 16 consecutive threads read one row's K slice
// (contiguous); the k-major store is padded by one word per row so those 16 threads hit distinct
// banks. Everything out of range (T, N, K tails) is staged as 0 and not stored.
// Workgroup memory: BK · (BM + 1 + BN + 1) f32 words: 16.3 KiB for TILE 4, BK 32 (64×64 tile);
// 16.1 KiB for TILE 8, BK 16 (128×128 tile).
// Grid: (ceil(N / BN), ceil(T / BM)).
// TILE is 4 or 8 (with the flag TILE8 set for 8).
#define TILE 4
#define BK 32

struct Params {
    t: u32,       // T, token rows of x and y
    n: u32,       // N, output columns
    k: u32,       // K
    ld_out: u32,  // row stride of y, in elements (>= N)
}

@group(0) @binding(0) var<storage, read> w: array<u32>;          // (N, K) f16 packed, K/2 words per row
@group(0) @binding(1) var<storage, read> x: array<vec2<f32>>;    // (T, K)
@group(0) @binding(2) var<storage, read_write> y: array<f32>;    // (T, ld_out), columns [0, N) written
@group(0) @binding(3) var<uniform> p: Params;
#ifdef BIAS
@group(0) @binding(4) var<storage, read> bias: array<f32>;       // (N)
#endif

const BM: u32 = 16u * {{TILE}}u;
const BN: u32 = 16u * {{TILE}}u;
const BKP: u32 = {{BK}}u / 2u;          // K pairs (u32 words of W, vec2 of x) per slice
const XS: u32 = BM + 1u;                // padded row length of xs
const WS: u32 = BN + 1u;                // padded row length of ws
const X_LOADS: u32 = BM * BKP / 256u;   // staging loads per thread
const W_LOADS: u32 = BN * BKP / 256u;

var<workgroup> xs: array<f32, {{BK}} * (16 * {{TILE}} + 1)>;  // [k][m], k-major
var<workgroup> ws: array<f32, {{BK}} * (16 * {{TILE}} + 1)>;  // [k][n], k-major

// Stores 4 outputs of row m: columns c, c + 16, c + 32, c + 48.
fn store4(m: u32, c: u32, v: vec4<f32>) {
    if (m >= p.t) {
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        let n = c + 16u * j;
        if (n < p.n) {
            var o = v[j];
#ifdef BIAS
            o += bias[n];
#endif
            let at = m * p.ld_out + n;
#ifdef ACCUMULATE
            o += y[at];
#endif
            y[at] = o;
        }
    }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) l: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let n0 = wid.x * BN;
    let m0 = wid.y * BM;
    let kp_total = p.k / 2u;

    // Accumulators as named vec4 (row i, columns 4jb..4jb+3 of the thread's TN), not an indexed
    // array, so that they stay in registers on every compiler.
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

    for (var kp0 = 0u; kp0 < kp_total; kp0 += BKP) {
        // Stage x[m0.., kp0..] and W[n0.., kp0..].
        for (var s = 0u; s < X_LOADS; s++) {
            let e = lid + s * 256u;
            let r = e / BKP;
            let q = e % BKP;
            let m = m0 + r;
            let kp = kp0 + q;
            var v = vec2<f32>(0.0);
            if (m < p.t && kp < kp_total) {
                v = x[m * kp_total + kp];
            }
            xs[(2u * q) * XS + r] = v.x;
            xs[(2u * q + 1u) * XS + r] = v.y;
        }
        for (var s = 0u; s < W_LOADS; s++) {
            let e = lid + s * 256u;
            let r = e / BKP;
            let q = e % BKP;
            let n = n0 + r;
            let kp = kp0 + q;
            var v = vec2<f32>(0.0);
            if (n < p.n && kp < kp_total) {
                v = unpack2x16float(w[n * kp_total + kp]);
            }
            ws[(2u * q) * WS + r] = v.x;
            ws[(2u * q + 1u) * WS + r] = v.y;
        }
        workgroupBarrier();

        for (var kk = 0u; kk < {{BK}}u; kk++) {
            let xo = kk * XS + l.y;
            let wo = kk * WS + l.x;
            let b0 = vec4<f32>(ws[wo], ws[wo + 16u], ws[wo + 32u], ws[wo + 48u]);
            c00 = fma(vec4<f32>(xs[xo]), b0, c00);
            c10 = fma(vec4<f32>(xs[xo + 16u]), b0, c10);
            c20 = fma(vec4<f32>(xs[xo + 32u]), b0, c20);
            c30 = fma(vec4<f32>(xs[xo + 48u]), b0, c30);
#ifdef TILE8
            let b1 = vec4<f32>(ws[wo + 64u], ws[wo + 80u], ws[wo + 96u], ws[wo + 112u]);
            c01 = fma(vec4<f32>(xs[xo]), b1, c01);
            c11 = fma(vec4<f32>(xs[xo + 16u]), b1, c11);
            c21 = fma(vec4<f32>(xs[xo + 32u]), b1, c21);
            c31 = fma(vec4<f32>(xs[xo + 48u]), b1, c31);
            let a4 = vec4<f32>(xs[xo + 64u]);
            let a5 = vec4<f32>(xs[xo + 80u]);
            let a6 = vec4<f32>(xs[xo + 96u]);
            let a7 = vec4<f32>(xs[xo + 112u]);
            c40 = fma(a4, b0, c40);
            c41 = fma(a4, b1, c41);
            c50 = fma(a5, b0, c50);
            c51 = fma(a5, b1, c51);
            c60 = fma(a6, b0, c60);
            c61 = fma(a6, b1, c61);
            c70 = fma(a7, b0, c70);
            c71 = fma(a7, b1, c71);
#endif
        }
        workgroupBarrier();
    }

    let m = m0 + l.y;
    let c = n0 + l.x;
    store4(m, c, c00);
    store4(m + 16u, c, c10);
    store4(m + 32u, c, c20);
    store4(m + 48u, c, c30);
#ifdef TILE8
    store4(m, c + 64u, c01);
    store4(m + 16u, c + 64u, c11);
    store4(m + 32u, c + 64u, c21);
    store4(m + 48u, c + 64u, c31);
    store4(m + 64u, c, c40);
    store4(m + 64u, c + 64u, c41);
    store4(m + 80u, c, c50);
    store4(m + 80u, c + 64u, c51);
    store4(m + 96u, c, c60);
    store4(m + 96u, c + 64u, c61);
    store4(m + 112u, c, c70);
    store4(m + 112u, c + 64u, c71);
#endif
}
