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

fn q_dot(r: QRaw, v: QX) -> f32 {
    var s = q8(r.a.x) * v.a[0];
    var t = q8(r.b.x) * v.b[0];
    s = fma(q8(r.a.y), v.a[1], s);
    t = fma(q8(r.b.y), v.b[1], t);
    s = fma(q8(r.a.z), v.a[2], s);
    t = fma(q8(r.b.z), v.b[2], t);
    s = fma(q8(r.a.w), v.a[3], s);
    t = fma(q8(r.b.w), v.b[3], t);
    return r.d * q_hsum(s + t);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    return q8(qw1(8u * b + (j >> 2u))) * q_half(q_planes().x, b);
}
