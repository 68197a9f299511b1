// Q5_0 (included by quant.wgsl): 32 elements, x = ((nibble | bit << 4) - 16) · d. Byte j of qs
// holds element j (low nibble) and j + 16 (high nibble); bit e of qh is bit 4 of element e.
// Planes: qs (vec4 b), qh (word b of plane 1), d (f16 b of plane 2).

const QK: u32 = 32u;
const QU: u32 = 32u;

struct QRaw {
    qs: vec4<u32>,
    qh: u32,
    d: f32,
}

alias QX = QXB32;

fn q_raw(gu: u32) -> QRaw {
    let o = q_planes();
    return QRaw(qw4(gu), qw1(o.x + gu), q_half(o.y, gu));
}

fn q_x(u: u32, xr: u32) -> QX {
    return q_x_b32(u, xr);
}

alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    let cl = vec4<f32>(Q_2P23 + 16.0);
    let ch = vec4<f32>(Q_2P23 + 256.0);
    let qh4 = r.qh << 4u;
    return QV(mat4x4<f32>(q5_lo(r.qs.x, qh4, 0u) - cl, q5_lo(r.qs.y, qh4, 1u) - cl,
                          q5_lo(r.qs.z, qh4, 2u) - cl, q5_lo(r.qs.w, qh4, 3u) - cl),
              mat4x4<f32>(q5_hi(r.qs.x, r.qh, 0u) - ch, q5_hi(r.qs.y, r.qh, 1u) - ch,
                          q5_hi(r.qs.z, r.qh, 2u) - ch, q5_hi(r.qs.w, r.qh, 3u) - ch));
}

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.l, v.h);
    return r.d * q_hsum(fma(s[1], vec4<f32>(0.0625), s[0]));
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let o = q_planes();
    let q = q_nibbles32(4u * b, j) | q_qh_bits(qw1(o.x + b), j);
    return (vec4<f32>(q) - 16.0) * q_half(o.y, b);
}
