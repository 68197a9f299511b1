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

fn q_dot(r: QRaw, v: QX) -> f32 {
    let cl = vec4<f32>(Q_2P23 + 16.0);
    let ch = vec4<f32>(Q_2P23 + 256.0);
    let qh4 = r.qh << 4u;
    var sl = (q5_lo(r.qs.x, qh4, 0u) - cl) * v.l[0];
    var sh = (q5_hi(r.qs.x, r.qh, 0u) - ch) * v.h[0];
    sl = fma(q5_lo(r.qs.y, qh4, 1u) - cl, v.l[1], sl);
    sh = fma(q5_hi(r.qs.y, r.qh, 1u) - ch, v.h[1], sh);
    sl = fma(q5_lo(r.qs.z, qh4, 2u) - cl, v.l[2], sl);
    sh = fma(q5_hi(r.qs.z, r.qh, 2u) - ch, v.h[2], sh);
    sl = fma(q5_lo(r.qs.w, qh4, 3u) - cl, v.l[3], sl);
    sh = fma(q5_hi(r.qs.w, r.qh, 3u) - ch, v.h[3], sh);
    return r.d * q_hsum(fma(sh, vec4<f32>(0.0625), sl));
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let o = q_planes();
    let q = q_nibbles32(4u * b, j) | q_qh_bits(qw1(o.x + b), j);
    return (vec4<f32>(q) - 16.0) * q_half(o.y, b);
}
