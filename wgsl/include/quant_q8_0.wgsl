// Q8_0 (included by quant.wgsl): 32 elements, x = q · d with q an i8. Planes: qs (vec4 2b and
// 2b + 1), d (f16 b of plane 1).

const QK: u32 = 32u;
const QU: u32 = 32u;

struct QRaw {
    a: vec4<u32>,   // elements 0..16
    b: vec4<u32>,   // 16..32
    d: f32,
}

// a[w] = elements 4w .. 4w + 3, b[w] = 16 + 4w ...
struct QX {
    a: mat4x4<f32>,
    b: mat4x4<f32>,
}

fn q_raw(gu: u32) -> QRaw {
    return QRaw(qw4(2u * gu), qw4(2u * gu + 1u), q_half(q_planes().x, gu));
}

fn q_x(u: u32, xr: u32) -> QX {
    let i = xr + 8u * u;
    return QX(q_x16(i), q_x16(i + 4u));
}

// The 4 signed bytes of w: (byte ^ 0x80) = q + 128 goes into the mantissa of 2^23.
fn q8(w: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>((q_bytes(w) & vec4<u32>(0xFFu)) ^ vec4<u32>(Q_MAGIC | 0x80u)) - vec4<f32>(Q_2P23 + 128.0);
}

alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    return QV(mat4x4<f32>(q8(r.a.x), q8(r.a.y), q8(r.a.z), q8(r.a.w)),
              mat4x4<f32>(q8(r.b.x), q8(r.b.y), q8(r.b.z), q8(r.b.w)));
}

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.a, v.b);
    return r.d * q_hsum(s[0] + s[1]);
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    return q8(qw1(8u * b + (j >> 2u))) * q_half(q_planes().x, b);
}
