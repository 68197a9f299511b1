// Q5_K (included by quant.wgsl): super-blocks of 256 = 4 groups of 64, 176 bytes: d, dmin (f16),
// 12 bytes of 6-bit scales and mins, qh (32 bytes), qs (128 bytes). Group g: qs byte 32g + l holds
// element 64g + l (low nibble, sub-block 2g; bit 4 = bit 2g of qh[l]) and 64g + 32 + l (high
// nibble, sub-block 2g + 1; bit 4 = bit 2g + 1 of qh[l]); x = d · scale · q - dmin · min. Plane 0 =
// the file's blocks (11 vec4 each: header, qh, qh, then qs). A unit is 16 qs bytes (vec4 3 + uu,
// uu = 2g + h: l = 16h .. 16h + 16) and their 16 qh bytes (vec4 1 + h).

const QK: u32 = 256u;
const QU: u32 = 32u;

struct QRaw {
    qs: vec4<u32>,
    qh: vec4<u32>,   // shifted right by 2g: bits 0 and 1 of each byte are the unit's
    dl: f32,
    dh: f32,         // / 16
    ml: f32,
    mh: f32,
}

alias QX = QXK;

fn q_raw(gu: u32) -> QRaw {
    let sb = 11u * (gu >> 3u);
    let uu = gu & 7u;
    let hdr = qw4(sb);
    let dd = unpack2x16float(hdr.x);
    let a = q_scale_min_k4(hdr, uu & 6u);
    let c = q_scale_min_k4(hdr, uu | 1u);
    let qh = qw4(sb + 1u + (uu & 1u)) >> vec4<u32>(uu & 6u);
    return QRaw(qw4(sb + 3u + uu), qh, dd.x * a.x, dd.x * c.x * 0.0625, dd.y * a.y, dd.y * c.y);
}

fn q_x(u: u32, xr: u32) -> QX {
    return q_x_k(u, xr);
}

// 2^23 + q of the low nibbles of word w (and qh word h), 2^23 + 16 q of the high ones.
fn q5k_lo(w: u32, h: u32) -> vec4<f32> {
    return q_f((q_bytes(w) & vec4<u32>(0xFu)) | ((q_bytes(h) << vec4<u32>(4u)) & vec4<u32>(0x10u)));
}

fn q5k_hi(w: u32, h: u32) -> vec4<f32> {
    return q_f((q_bytes(w) & vec4<u32>(0xF0u)) | ((q_bytes(h) << vec4<u32>(7u)) & vec4<u32>(0x100u)));
}

alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    let c = vec4<f32>(Q_2P23);
    return QV(mat4x4<f32>(q5k_lo(r.qs.x, r.qh.x) - c, q5k_lo(r.qs.y, r.qh.y) - c,
                          q5k_lo(r.qs.z, r.qh.z) - c, q5k_lo(r.qs.w, r.qh.w) - c),
              mat4x4<f32>(q5k_hi(r.qs.x, r.qh.x) - c, q5k_hi(r.qs.y, r.qh.y) - c,
                          q5k_hi(r.qs.z, r.qh.z) - c, q5k_hi(r.qs.w, r.qh.w) - c));
}

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
    let l4 = (j & 31u) >> 2u;
    let hdr = qw4(11u * b);
    let bytes = q_bytes(qw1(44u * b + 12u + 8u * g + l4));
    let nib = select(bytes & vec4<u32>(0xFu), (bytes >> vec4<u32>(4u)) & vec4<u32>(0xFu), hi);
    let sub = 2u * g + select(0u, 1u, hi);
    let hb = (q_bytes(qw1(44u * b + 4u + l4)) >> vec4<u32>(sub)) & vec4<u32>(1u);
    let sm = q_scale_min_k4(hdr, sub);
    let dd = unpack2x16float(hdr.x);
    let d1 = dd.x * sm.x;
    let m1 = dd.y * sm.y;
    return d1 * vec4<f32>(nib | (hb << vec4<u32>(4u))) - m1;
}
