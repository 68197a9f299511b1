// Q6_K (included by quant.wgsl): super-blocks of 256 = 2 halves of 128, 210 bytes: ql (128), qh
// (64), scales (16 i8), d (f16). Half H, l < 32: ql[64H + l] low nibble + qh[32H + l] bits 0-1 ->
// element 128H + l; ql[64H + 32 + l] low + bits 2-3 -> 128H + 32 + l; ql[64H + l] high + bits 4-5
// -> 128H + 64 + l; ql[64H + 32 + l] high + bits 6-7 -> 128H + 96 + l; scale of element 128H +
// 32c + l is scales[8H + l / 16 + 2c]; x = d · scale · (q - 32). Planes: ql, qh, scales (13 vec4
// per super-block: ql 0..8, qh 8..12, scales 12), d (f16 b of plane 1). A unit is 64 elements:
// l = 16j .. 16j + 16 of half H (uu = 2H + j) in each of the 4 classes c.

const QK: u32 = 256u;
const QU: u32 = 64u;

struct QRaw {
    a: vec4<u32>,   // ql[64H + 16j ..]: classes 0 (low nibbles) and 2 (high)
    c: vec4<u32>,   // ql[64H + 32 + 16j ..]: classes 1 and 3
    h: vec4<u32>,   // qh[32H + 16j ..]
    s: vec4<f32>,   // d · scale of classes 0, 1, 2 / 16, 3 / 16
}

// c0[w] = elements 128H + 16j + 4w .. (class 0); c1, c2, c3: 32, 64, 96 further.
struct QX {
    c0: mat4x4<f32>,
    c1: mat4x4<f32>,
    c2: mat4x4<f32>,
    c3: mat4x4<f32>,
}

fn q_raw(gu: u32) -> QRaw {
    let sbi = gu >> 2u;
    let sb = 13u * sbi;
    let hh = (gu >> 1u) & 1u;
    let j = gu & 1u;
    let sc = qw4(sb + 12u);
    // scales[8H + j + 2c]: classes 0, 1 in word 2H (bytes j, j + 2), 2, 3 in word 2H + 1.
    let w0 = select(sc.x, sc.z, hh == 1u);
    let w1 = select(sc.y, sc.w, hh == 1u);
    let sh = vec4<u32>(24u, 8u, 24u, 8u) - vec4<u32>(8u * j);
    let s = vec4<f32>(bitcast<vec4<i32>>(vec4<u32>(w0, w0, w1, w1) << sh) >> vec4<u32>(24u));
    let d = q_half(q_planes().x, sbi);
    return QRaw(qw4(sb + 4u * hh + j), qw4(sb + 4u * hh + 2u + j), qw4(sb + 8u + 2u * hh + j),
                d * s * vec4<f32>(1.0, 1.0, 0.0625, 0.0625));
}

fn q_x(u: u32, xr: u32) -> QX {
    let uu = u & 3u;
    let i = xr + 64u * (u >> 2u) + 32u * (uu >> 1u) + 4u * (uu & 1u);
    return QX(q_x16(i), q_x16(i + 8u), q_x16(i + 16u), q_x16(i + 24u));
}

// The 16 quants of qs words a, c and qh word h (4 l values): 2^23 + q (classes 0, 1) or
// 2^23 + 16 q (classes 2, 3), offsets removed.
struct Q6W {
    f0: vec4<f32>,
    f1: vec4<f32>,
    f2: vec4<f32>,
    f3: vec4<f32>,
}

fn q6w(a: u32, c: u32, h: u32) -> Q6W {
    let ba = q_bytes(a);
    let bc = q_bytes(c);
    let bh = q_bytes(h);
    let cl = vec4<f32>(Q_2P23 + 32.0);
    let ch = vec4<f32>(Q_2P23 + 512.0);
    return Q6W(q_f((ba & vec4<u32>(0xFu)) | ((bh & vec4<u32>(0x3u)) << vec4<u32>(4u))) - cl,
               q_f((bc & vec4<u32>(0xFu)) | ((bh & vec4<u32>(0xCu)) << vec4<u32>(2u))) - cl,
               q_f((ba & vec4<u32>(0xF0u)) | ((bh & vec4<u32>(0x30u)) << vec4<u32>(4u))) - ch,
               q_f((bc & vec4<u32>(0xF0u)) | ((bh & vec4<u32>(0xC0u)) << vec4<u32>(2u))) - ch);
}

// The unit's quants by class, as in QX: c0[w] = q6w(a[w], c[w], h[w]).f0 (meets QX.c0[w]),
// c1 .. c3 its f1 .. f3.
struct Q6V {
    c0: mat4x4<f32>,
    c1: mat4x4<f32>,
    c2: mat4x4<f32>,
    c3: mat4x4<f32>,
}

alias QV = Q6V;

fn q_vals(r: QRaw) -> QV {
    let q0 = q6w(r.a.x, r.c.x, r.h.x);
    let q1 = q6w(r.a.y, r.c.y, r.h.y);
    let q2 = q6w(r.a.z, r.c.z, r.h.z);
    let q3 = q6w(r.a.w, r.c.w, r.h.w);
    return QV(mat4x4<f32>(q0.f0, q1.f0, q2.f0, q3.f0), mat4x4<f32>(q0.f1, q1.f1, q2.f1, q3.f1),
              mat4x4<f32>(q0.f2, q1.f2, q2.f2, q3.f2), mat4x4<f32>(q0.f3, q1.f3, q2.f3, q3.f3));
}

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    var s0 = w.c0[0] * v.c0[0];
    var s1 = w.c1[0] * v.c1[0];
    var s2 = w.c2[0] * v.c2[0];
    var s3 = w.c3[0] * v.c3[0];
    s0 = fma(w.c0[1], v.c0[1], s0);
    s1 = fma(w.c1[1], v.c1[1], s1);
    s2 = fma(w.c2[1], v.c2[1], s2);
    s3 = fma(w.c3[1], v.c3[1], s3);
    s0 = fma(w.c0[2], v.c0[2], s0);
    s1 = fma(w.c1[2], v.c1[2], s1);
    s2 = fma(w.c2[2], v.c2[2], s2);
    s3 = fma(w.c3[2], v.c3[2], s3);
    s0 = fma(w.c0[3], v.c0[3], s0);
    s1 = fma(w.c1[3], v.c1[3], s1);
    s2 = fma(w.c2[3], v.c2[3], s2);
    s3 = fma(w.c3[3], v.c3[3], s3);
    return dot(r.s, vec4<f32>(q_hsum(s0), q_hsum(s1), q_hsum(s2), q_hsum(s3)));
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let hh = j >> 7u;
    let cls = (j >> 5u) & 3u;
    let l = j & 31u;
    let body = 52u * b;
    let ql = q_bytes(qw1(body + 16u * hh + 8u * (cls & 1u) + (l >> 2u)));
    let nib = select(ql & vec4<u32>(0xFu), (ql >> vec4<u32>(4u)) & vec4<u32>(0xFu), cls >= 2u);
    let hb = (q_bytes(qw1(body + 32u + 8u * hh + (l >> 2u))) >> vec4<u32>(2u * cls)) & vec4<u32>(3u);
    let si = 8u * hh + (l >> 4u) + 2u * cls;
    let sc = f32(bitcast<i32>(qw1(body + 48u + (si >> 2u)) << (24u - 8u * (si & 3u))) >> 24u);
    let d = q_half(q_planes().x, b);
    return (d * sc) * (vec4<f32>(nib | (hb << vec4<u32>(4u))) - 32.0);
}

#ifdef DP4
// Unit u: class c is elements 256 (u / 4) + 128 H + 32 c + 16 j + l (group v0 + 2c); its 6-bit
// quant q is a nibble of a or c with two bits of h; x = d · sc · (q - 32) (QRaw.s: d · sc, classes
// 2 and 3 / 16).
fn q_dot_i(r: QRaw, u: u32) -> f32 {
    let m = vec4<u32>(0x0F0F0F0Fu);
    let v0 = 16u * (u >> 2u) + 8u * ((u >> 1u) & 1u) + (u & 1u);
    let q0 = (r.a & m) | ((r.h & vec4<u32>(0x03030303u)) << vec4<u32>(4u));
    let q1 = (r.c & m) | ((r.h & vec4<u32>(0x0C0C0C0Cu)) << vec4<u32>(2u));
    let q2 = ((r.a >> vec4<u32>(4u)) & m) | (r.h & vec4<u32>(0x30303030u));
    let q3 = ((r.c >> vec4<u32>(4u)) & m) | ((r.h >> vec4<u32>(2u)) & vec4<u32>(0x30303030u));
    let d = vec4<f32>(qi_d(v0 >> 1u), qi_d((v0 >> 1u) + 1u), qi_d((v0 >> 1u) + 2u), qi_d((v0 >> 1u) + 3u));
    let i = vec4<f32>(f32(qi_dot16(q0, v0)), f32(qi_dot16(q1, v0 + 2u)), f32(qi_dot16(q2, v0 + 4u)),
                      f32(qi_dot16(q3, v0 + 6u)));
    let sx = vec4<f32>(qi_s(v0), qi_s(v0 + 2u), qi_s(v0 + 4u), qi_s(v0 + 6u));
    return dot(r.s * vec4<f32>(1.0, 1.0, 16.0, 16.0), d * i - 32.0 * sx);
}
#endif
