// Q4_1 (included by quant.wgsl): 32 elements, x = nibble · d + m. Byte j of qs holds element j
// (low nibble) and j + 16 (high nibble). Planes: qs (vec4 b), (d, m) (word b of plane 1).
//
// Also MLX's affine 4-bit (the loader puts its nibbles in this order): one (d, m) = (scale, bias)
// word per group of AFFINE_G blocks, as f16 or, with AFFINE_BF16, bf16 halves.

const QK: u32 = 32u;
const QU: u32 = 32u;


struct QRaw {
    qs: vec4<u32>,
    dm: vec2<f32>,
}

alias QX = QXB32;

fn q_raw(gu: u32) -> QRaw {
    return QRaw(qw4(gu), q_dm(gu));
}

fn q_x(u: u32, xr: u32) -> QX {
    return q_x_b32(u, xr);
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    let c = vec4<f32>(Q_2P23);
    var sl = (q_lo(r.qs.x) - c) * v.l[0];
    var sh = (q_hi(r.qs.x) - c) * v.h[0];
    sl = fma(q_lo(r.qs.y) - c, v.l[1], sl);
    sh = fma(q_hi(r.qs.y) - c, v.h[1], sh);
    sl = fma(q_lo(r.qs.z) - c, v.l[2], sl);
    sh = fma(q_hi(r.qs.z) - c, v.h[2], sh);
    sl = fma(q_lo(r.qs.w) - c, v.l[3], sl);
    sh = fma(q_hi(r.qs.w) - c, v.h[3], sh);
    return fma(r.dm.x, q_hsum(fma(sh, vec4<f32>(0.0625), sl)), r.dm.y * v.s);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let q = q_nibbles32(4u * b, j);
    let dm = q_dm(b);
    return vec4<f32>(q) * dm.x + dm.y;
}

#ifdef DP4
// Unit u = block u: low nibbles are group 2u, high nibbles group 2u + 1; x = d · n + m.
fn q_dot_i(r: QRaw, u: u32) -> f32 {
    let m = vec4<u32>(0x0F0F0F0Fu);
    let i = qi_dot16(r.qs & m, 2u * u) + qi_dot16((r.qs >> vec4<u32>(4u)) & m, 2u * u + 1u);
    return r.dm.x * qi_d(u) * f32(i) + r.dm.y * (qi_s(2u * u) + qi_s(2u * u + 1u));
}
#endif
