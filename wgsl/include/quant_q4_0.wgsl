// Q4_0 (included by quant.wgsl): 32 elements, x = (nibble - 8) · d. Byte j of qs holds element j
// (low nibble) and j + 16 (high nibble). Planes: qs (vec4 b), d (f16 b of plane 1).

const QK: u32 = 32u;
const QU: u32 = 32u;

struct QRaw {
    qs: vec4<u32>,
    d: f32,
}

alias QX = QXB32;

fn q_raw(gu: u32) -> QRaw {
    return QRaw(qw4(gu), q_half(q_planes().x, gu));
}

fn q_x(u: u32, xr: u32) -> QX {
    return q_x_b32(u, xr);
}

alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    let cl = vec4<f32>(Q_2P23 + 8.0);
    let ch = vec4<f32>(Q_2P23 + 128.0);
    return QV(mat4x4<f32>(q_lo(r.qs.x) - cl, q_lo(r.qs.y) - cl,
                          q_lo(r.qs.z) - cl, q_lo(r.qs.w) - cl),
              mat4x4<f32>(q_hi(r.qs.x) - ch, q_hi(r.qs.y) - ch,
                          q_hi(r.qs.z) - ch, q_hi(r.qs.w) - ch));
}

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.l, v.h);
    return r.d * q_hsum(fma(s[1], vec4<f32>(0.0625), s[0]));
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let q = q_nibbles32(4u * b, j);
    return (vec4<f32>(q) - 8.0) * q_half(q_planes().x, b);
}

#ifdef DP4
// Unit u = block u: low nibbles are group 2u, high nibbles group 2u + 1; x = d · (n - 8).
fn q_dot_i(r: QRaw, u: u32) -> f32 {
    let m = vec4<u32>(0x0F0F0F0Fu);
    let i = qi_dot16(r.qs & m, 2u * u) + qi_dot16((r.qs >> vec4<u32>(4u)) & m, 2u * u + 1u);
    return r.d * (qi_d(u) * f32(i) - 8.0 * (qi_s(2u * u) + qi_s(2u * u + 1u)));
}
#endif
