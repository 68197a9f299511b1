// quant: GGUF and MLX quantized weights read directly by the kernels (matvec_quant, matmul_quant,
// and any kernel that gathers quantized rows). One type per pipeline, picked by a flag: Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, A8; none of them: Q4_0. MLX's affine 4-bit is Q4_1 with
// AFFINE_G (blocks per scale) and AFFINE_BF16 set; its 8-bit is A8. The host side
// (src/ops/matmul/gguf.rs) writes the layout these read and is their CPU twin's home.
//
// GPU layout ("planes", one buffer per tensor, made at upload from the file's bytes): each block
// is cut into its fields, and each field of every block (row-major: block b = row · blocks per row
// + column block) goes to its own plane, so that every load is aligned (WGSL reads u32 words at
// best; 18-, 22-, 34- and 210-byte blocks are not word-aligned in the file). Plane 0 starts at
// word 0, planes 1 and 2 at words q_planes().x and .y (16-byte aligned). Bytes on the GPU = bytes
// in the file (plus at most 16 of alignment per plane). Per type (fields of ggml's block):
//   Q4_0: plane 0 qs (16 B/block), plane 1 d (f16, two per word)
//   Q4_1: plane 0 qs (16 B), plane 1 (d, m) (one word: d low half, m high half)
//   Q5_0: plane 0 qs (16 B), plane 1 qh (one word), plane 2 d (f16)
//   Q5_1: plane 0 qs (16 B), plane 1 qh (one word), plane 2 (d, m)
//   Q8_0: plane 0 qs (32 B), plane 1 d (f16)
//   Q4_K: plane 0 the blocks as in the file (144 B = 9 x 16 B: already aligned)
//   Q5_K: plane 0 the blocks as in the file (176 B = 11 x 16 B)
//   Q6_K: plane 0 ql, qh, scales (208 B = 13 x 16 B), plane 1 d (f16)
//   A4 / A8 (MLX, group g): plane 0 qs (g/2 or g B per group), plane 1 (scale, bias) (one word
//   per group)
//
// The including kernel defines the accessors (so this file names no binding):
//   fn qw4(i: u32) -> vec4<u32>   16-byte word i of the weight buffer (q_raw)
//   fn qw1(i: u32) -> u32         4-byte word i of the weight buffer
//   fn qx4(i: u32) -> vec4<f32>   x[4i .. 4i + 4] (q_x)
//   fn q_planes() -> vec2<u32>    first words of planes 1 and 2
//
// Each type file provides:
//   QK                        elements per block (32 or 256)
//   QU                        elements per unit, a matvec lane's work item (32; Q6_K 64);
//                             units tile a row, so unit gu of the tensor is unit gu % (K / QU)
//                             of row gu / (K / QU)
//   QRaw, q_raw(gu)           a unit's quantized data (loads only, plus its scales)
//   QX, q_x(u, xr)            the x values that unit u of a row meets (xr: x's row start, in vec4)
//   QV, q_vals(r)             the unit's quants as floats (dequantized without its scales)
//   q_dot_v(r, w, v) -> f32   sum over the unit of w · x, in f32, with w = q_vals(r)
//   q_dot(r, v) -> f32        q_dot_v(r, q_vals(r), v)
//   q_run(b, j) -> vec4<f32>  elements j .. j + 3 (j % 4 == 0) of block b, dequantized with the
//                             float operations of src/loader/dtype.rs (bit-identical to to_f32)
//
// Dequantization in registers: quants become floats without int-to-float conversions (a quarter
// rate or less on NVIDIA): a value v < 2^23 OR'ed into the mantissa of 2^23 is the float 2^23 + v,
// and subtracting 2^23 (+ the type's offset) is exact. High nibbles are taken in place (16 · v) and
// their sums scaled by 1/16 once. q_dot_v sums q · x per scale and applies the scale (and the min:
// min · sum x) once per unit, so a weight costs about 4 ALU operations (mask, float, offset in
// q_vals, FMA in q_dot_v), and a kernel that meets a unit with several tokens' x pays q_vals once.

const Q_MAGIC: u32 = 0x4B000000u;   // bits of 2^23
const Q_2P23: f32 = 8388608.0;

// The 4 bytes of w, byte k in the low 8 bits of lane k (the bits above are the following bytes:
// mask them).
fn q_bytes(w: u32) -> vec4<u32> {
    return vec4<u32>(w) >> vec4<u32>(0u, 8u, 16u, 24u);
}

// 2^23 + v for every lane (v < 2^23).
fn q_f(v: vec4<u32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(Q_MAGIC));
}

// 2^23 + the low nibbles of the 4 bytes of w.
fn q_lo(w: u32) -> vec4<f32> {
    return q_f(q_bytes(w) & vec4<u32>(0xFu));
}

// 2^23 + 16 · the high nibbles of the 4 bytes of w.
fn q_hi(w: u32) -> vec4<f32> {
    return q_f(q_bytes(w) & vec4<u32>(0xF0u));
}

fn q_hsum(v: vec4<f32>) -> f32 {
    return (v.x + v.y) + (v.z + v.w);
}

// Sum of all 16 entries.
fn q_msum(m: mat4x4<f32>) -> f32 {
    return q_hsum((m[0] + m[1]) + (m[2] + m[3]));
}

// x[4i .. 4i + 16] as 4 columns.
fn q_x16(i: u32) -> mat4x4<f32> {
    return mat4x4<f32>(qx4(i), qx4(i + 1u), qx4(i + 2u), qx4(i + 3u));
}

// Q4_1 and the MLX affine types: the (d, m) = (scale, bias) of block b, one word per group of
// AFFINE_G blocks (1 for Q4_1), as f16 halves or, with AFFINE_BF16, bf16 halves.
#define AFFINE_G 1
const Q_GROUP: u32 = {{AFFINE_G}}u;

fn q_dm(b: u32) -> vec2<f32> {
    let w = qw1(q_planes().x + b / Q_GROUP);
#ifdef AFFINE_BF16
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xFFFF0000u));
#else
    return unpack2x16float(w);
#endif
}

// f16 number i of a plane of packed halves starting at word o.
fn q_half(o: u32, i: u32) -> f32 {
    let v = unpack2x16float(qw1(o + (i >> 1u)));
    return select(v.x, v.y, (i & 1u) == 1u);
}

// The x of one 32-element block (Q4_0, Q4_1, Q5_0, Q5_1): l[w] = elements 4w .. 4w + 3 (the low
// nibbles of qs word w), h[w] = elements 16 + 4w .. (its high nibbles); s = sum of all 32 (for the
// min of Q4_1 / Q5_1; dead code elsewhere).
struct QXB32 {
    l: mat4x4<f32>,
    h: mat4x4<f32>,
    s: f32,
}

fn q_x_b32(u: u32, xr: u32) -> QXB32 {
    let i = xr + 8u * u;
    let l = q_x16(i);
    let h = q_x16(i + 4u);
    return QXB32(l, h, q_msum(l) + q_msum(h));
}

// Q5_0 / Q5_1: 2^23 + (low nibble | bit 4) for elements 4w .. 4w + 3 of the block (qh4 = qh << 4:
// bit e of qh, e < 16, lands on bit 4 after the shift right by e), and 2^23 + 16 · (high nibble |
// bit 4) for elements 16 + 4w .. (bit 16 + e of qh lands on bit 8).
fn q5_lo(w: u32, qh4: u32, wi: u32) -> vec4<f32> {
    let h = vec4<u32>(qh4) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(4u * wi));
    return q_f((q_bytes(w) & vec4<u32>(0xFu)) | (h & vec4<u32>(0x10u)));
}

fn q5_hi(w: u32, qh: u32, wi: u32) -> vec4<f32> {
    let h = vec4<u32>(qh) >> (vec4<u32>(8u, 9u, 10u, 11u) + vec4<u32>(4u * wi));
    return q_f((q_bytes(w) & vec4<u32>(0xF0u)) | (h & vec4<u32>(0x100u)));
}

// Elements j .. j + 3 of a 32-element block: the nibbles (j < 16: low, else high) of qs word
// (j % 16) / 4, whose first word is w0.
fn q_nibbles32(w0: u32, j: u32) -> vec4<u32> {
    let b = q_bytes(qw1(w0 + ((j & 15u) >> 2u)));
    return select(b & vec4<u32>(0xFu), (b >> vec4<u32>(4u)) & vec4<u32>(0xFu), j >= 16u);
}

// Bit 4 of the 5-bit quants j .. j + 3 of a Q5 block: bit j + i of qh.
fn q_qh_bits(qh: u32, j: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(0u, 1u, 2u, 3u) + vec4<u32>(j))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

// ggml's get_scale_min_k4 (Q4_K, Q5_K): the 6-bit (scale, min) of sub-block j (0..8), from the
// 12 scale bytes in words s.y, s.z, s.w of the block's first 16 bytes.
fn q_scale_min_k4(s: vec4<u32>, j: u32) -> vec2<f32> {
    let k = (j & 3u) * 8u;
    let b0 = (s.y >> k) & 0xFFu;   // scales[j % 4]
    let b1 = (s.z >> k) & 0xFFu;   // scales[j % 4 + 4]
    let b2 = (s.w >> k) & 0xFFu;   // scales[j % 4 + 8]
    let lo = vec2<u32>(b0 & 63u, b1 & 63u);
    let hi = vec2<u32>((b2 & 15u) | ((b0 >> 6u) << 4u), (b2 >> 4u) | ((b1 >> 6u) << 4u));
    return vec2<f32>(select(lo, hi, j >= 4u));
}

// The x of one Q4_K / Q5_K unit u (16 qs bytes: l = 16h .. 16h + 16 of group g, sub-blocks 2g
// (low nibbles, elements 64g + l) and 2g + 1 (high nibbles, 64g + 32 + l)), with their sums.
struct QXK {
    l: mat4x4<f32>,
    h: mat4x4<f32>,
    sl: f32,
    sh: f32,
}

fn q_x_k(u: u32, xr: u32) -> QXK {
    let uu = u & 7u;
    let i = xr + 64u * (u >> 3u) + 16u * (uu >> 1u) + 4u * (uu & 1u);
    let l = q_x16(i);
    let h = q_x16(i + 8u);
    return QXK(l, h, q_msum(l), q_msum(h));
}

// A 32-value unit's quants as floats (q_vals: the dequantization without the unit's scales), in
// the two halves of 16 its x comes in (QXB32 / QXK's l and h; Q8_0 / A8's a and b): l[w] = values
// 4w .. 4w + 3 of the first half, h[w] of the second.
struct QV32 {
    l: mat4x4<f32>,
    h: mat4x4<f32>,
}

// The halves' partial sums (4 lanes each) of w against x halves xl, xh: columns 0 (first half)
// and 1.
fn q_fma32(w: QV32, xl: mat4x4<f32>, xh: mat4x4<f32>) -> mat2x4<f32> {
    var sl = w.l[0] * xl[0];
    var sh = w.h[0] * xh[0];
    sl = fma(w.l[1], xl[1], sl);
    sh = fma(w.h[1], xh[1], sh);
    sl = fma(w.l[2], xl[2], sl);
    sh = fma(w.h[2], xh[2], sh);
    sl = fma(w.l[3], xl[3], sl);
    sh = fma(w.h[3], xh[3], sh);
    return mat2x4<f32>(sl, sh);
}

// DP4: x staged by the kernel as 16-bit fixed point (per 32-element block b a power-of-two scale
// qi_d(b), |q| < 2^14 + 1), split into an unsigned low byte and a signed high byte, so that the
// types with quants of at most 7 bits (Q4_0, Q4_1, Q4_K, Q6_K) sum q_w · q_x with 4-wide integer
// dot products (4 multiply-adds an instruction, exact). The kernel stages a chunk of KC blocks
// (of a row of K / 32) for each of TOK tokens (the including kernel defines TOK), per token j and
// 16-element group v of the chunk (elements 16v .. 16v + 15 of the chunk):
//   xs_lo[2·KC·j + v]   the low bytes of q_x (byte i of word w: element 16v + 4w + i)
//   xs_hi[2·KC·j + v]   the high bytes (signed)
//   xs_s[2·KC·j + v]    qi_d · Σ q_x over the group (exact)
//   xs_d[KC·j + v / 2]  the scale of the block
// and sets qi_g0 (the chunk's first group in the row) and qi_t (2·KC·j, the current token's
// groups) before the dot products; the qi_ accessors take v, b in the whole row (DP4X: the kernel
// stages chunks or several tokens; without it the offsets are 0 and the accessors index directly,
// as the one-token whole-row kernel did before chunks existed: kept so that kernel's code stays
// what was measured, not because the offsets were shown to cost anything). Each such type file
// provides q_dot_i(r, u): q_dot of unit u against the staged x.
#ifdef DP4
#define KC 8
#define TOK 1
var<private> qi_g0: u32;
var<private> qi_t: u32;
#ifdef XG
// x staged apart (wgsl/quantize_x16.wgsl; one token): the including kernel binds it as
// `xg: array<vec4<u32>>`, five vec4 per block b: the low bytes of groups 2b and 2b + 1, their high
// bytes, then (qi_s of group 2b, of 2b + 1, qi_d of b, 0) as bits.
fn qi_lo(v: u32) -> vec4<u32> {
    return xg[5u * (v >> 1u) + (v & 1u)];
}
fn qi_hi(v: u32) -> vec4<u32> {
    return xg[5u * (v >> 1u) + 2u + (v & 1u)];
}
fn qi_d(b: u32) -> f32 {
    return bitcast<f32>(xg[5u * b + 4u].z);
}
fn qi_s(v: u32) -> f32 {
    return bitcast<f32>(xg[5u * (v >> 1u) + 4u][v & 1u]);
}
#else
var<workgroup> xs_lo: array<vec4<u32>, {{KC}} * 2 * {{TOK}}>;   // (TOK, 2·KC)
var<workgroup> xs_hi: array<vec4<u32>, {{KC}} * 2 * {{TOK}}>;   // (TOK, 2·KC)
var<workgroup> xs_s: array<f32, {{KC}} * 2 * {{TOK}}>;          // (TOK, 2·KC)
var<workgroup> xs_d: array<f32, {{KC}} * {{TOK}}>;              // (TOK, KC)
#ifdef DP4X
fn qi_lo(v: u32) -> vec4<u32> {
    return xs_lo[qi_t + v - qi_g0];
}
fn qi_hi(v: u32) -> vec4<u32> {
    return xs_hi[qi_t + v - qi_g0];
}
fn qi_d(b: u32) -> f32 {
    return xs_d[(qi_t + 2u * b - qi_g0) >> 1u];
}
fn qi_s(v: u32) -> f32 {
    return xs_s[qi_t + v - qi_g0];
}
#else
// One token, the whole row staged (DP4X unset: qi_g0 = qi_t = 0): the plain indices.
fn qi_lo(v: u32) -> vec4<u32> {
    return xs_lo[v];
}
fn qi_hi(v: u32) -> vec4<u32> {
    return xs_hi[v];
}
fn qi_d(b: u32) -> f32 {
    return xs_d[b];
}
fn qi_s(v: u32) -> f32 {
    return xs_s[v];
}
#endif
#endif

// Σ n · q_x over group v, for 16 unsigned quants n < 128 (byte j of word i: element 4i + j):
// exact in i32 (|Σ| < 16 · 127 · 2^14 < 2^25), and in f32 below 2^24 (quants < 64).
fn qi_dot16(n: vec4<u32>, v: u32) -> i32 {
    let lo = qi_lo(v);
    let hi = qi_hi(v);
    let sl = (dot4U8Packed(n.x, lo.x) + dot4U8Packed(n.y, lo.y)) + (dot4U8Packed(n.z, lo.z) + dot4U8Packed(n.w, lo.w));
    let sh = (dot4I8Packed(n.x, hi.x) + dot4I8Packed(n.y, hi.y)) + (dot4I8Packed(n.z, hi.z) + dot4I8Packed(n.w, hi.w));
    return sh * 256 + i32(sl);
}
#endif

#ifdef Q4_1
#include "quant_q4_1"
#else
#ifdef Q5_0
#include "quant_q5_0"
#else
#ifdef Q5_1
#include "quant_q5_1"
#else
#ifdef Q8_0
#include "quant_q8_0"
#else
#ifdef Q4_K
#include "quant_q4_k"
#else
#ifdef Q5_K
#include "quant_q5_k"
#else
#ifdef Q6_K
#include "quant_q6_k"
#else
#ifdef A8
#include "quant_a8"
#else
#include "quant_q4_0"
#endif
#endif
#endif
#endif
#endif
#endif
#endif
#endif
