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

#include "quant_nibble_vals"

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.l, v.h);
    return fma(r.dm.x, q_hsum(fma(s[1], vec4<f32>(0.0625), s[0])), r.dm.y * v.s);
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
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
