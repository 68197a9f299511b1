// Q4_K (included by quant.wgsl): super-blocks of 256 = 4 groups of 64, 144 bytes: d, dmin (f16),
// 12 bytes of 6-bit scales and mins (8 sub-blocks of 32), qs (128 bytes). Group g: qs bytes
// 32g + l hold element 64g + l (low nibble, sub-block 2g) and 64g + 32 + l (high nibble, sub-block
// 2g + 1); x = d · scale · nibble - dmin · min. Plane 0 = the file's blocks (9 vec4 each: header,
// then qs). A unit is 16 qs bytes (vec4 1 + uu, uu = 2g + h: l = 16h .. 16h + 16).

const QK: u32 = 256u;
const QU: u32 = 32u;

struct QRaw {
    qs: vec4<u32>,
    dl: f32,   // d · scale of the low nibbles' sub-block
    dh: f32,   // the high nibbles', / 16
    ml: f32,   // dmin · min of the low nibbles' sub-block
    mh: f32,
}

alias QX = QXK;

fn q_raw(gu: u32) -> QRaw {
    let sb = 9u * (gu >> 3u);
    let uu = gu & 7u;
    let hdr = qw4(sb);
    let dd = unpack2x16float(hdr.x);
    let a = q_scale_min_k4(hdr, uu & 6u);
    let c = q_scale_min_k4(hdr, uu | 1u);
    return QRaw(qw4(sb + 1u + uu), dd.x * a.x, dd.x * c.x * 0.0625, dd.y * a.y, dd.y * c.y);
}

fn q_x(u: u32, xr: u32) -> QX {
    return q_x_k(u, xr);
}

#include "quant_nibble_vals"

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.l, v.h);
    return fma(r.dl, q_hsum(s[0]), r.dh * q_hsum(s[1])) - fma(r.ml, v.sl, r.mh * v.sh);
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let g = j >> 6u;
    let hi = (j & 32u) != 0u;
    let hdr = qw4(9u * b);
    let bytes = q_bytes(qw1(36u * b + 4u + 8u * g + ((j & 31u) >> 2u)));
    let q = select(bytes & vec4<u32>(0xFu), (bytes >> vec4<u32>(4u)) & vec4<u32>(0xFu), hi);
    let sm = q_scale_min_k4(hdr, 2u * g + select(0u, 1u, hi));
    let dd = unpack2x16float(hdr.x);
    let d1 = dd.x * sm.x;
    let m1 = dd.y * sm.y;
    return d1 * vec4<f32>(q) - m1;
}

#ifdef DP4
// Unit u: the low nibbles are elements 256 (u / 8) + 64 g + 16 h + l (group vl), the high ones 32
// further (group vl + 2); x = d · sc · n - dmin · m (QRaw.dh holds d · sc / 16).
fn q_dot_i(r: QRaw, u: u32) -> f32 {
    let m = vec4<u32>(0x0F0F0F0Fu);
    let vl = 16u * (u >> 3u) + 4u * ((u & 7u) >> 1u) + (u & 1u);
    let il = qi_dot16(r.qs & m, vl);
    let ih = qi_dot16((r.qs >> vec4<u32>(4u)) & m, vl + 2u);
    let s = r.dl * qi_d(vl >> 1u) * f32(il) + (16.0 * r.dh) * qi_d((vl + 2u) >> 1u) * f32(ih);
    return s - fma(r.ml, qi_s(vl), r.mh * qi_s(vl + 2u));
}
#endif
