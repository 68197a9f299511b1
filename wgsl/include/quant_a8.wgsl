// A8 (included by quant.wgsl): MLX's affine 8-bit, x = q · scale + bias with q an unsigned byte;
// one (scale, bias) word per group of AFFINE_G 32-element blocks, as f16 or, with AFFINE_BF16,
// bf16 halves. Planes: qs (vec4 2b and 2b + 1: bytes in element order), (scale, bias) (word
// b / AFFINE_G of plane 1).

const QK: u32 = 32u;
const QU: u32 = 32u;

struct QRaw {
    a: vec4<u32>,   // elements 0..16
    b: vec4<u32>,   // 16..32
    dm: vec2<f32>,
}

// a[w] = elements 4w .. 4w + 3, b[w] = 16 + 4w ...; s = their sum (for the bias).
struct QX {
    a: mat4x4<f32>,
    b: mat4x4<f32>,
    s: f32,
}

fn q_raw(gu: u32) -> QRaw {
    return QRaw(qw4(2u * gu), qw4(2u * gu + 1u), q_dm(gu));
}

fn q_x(u: u32, xr: u32) -> QX {
    let i = xr + 8u * u;
    let a = q_x16(i);
    let b = q_x16(i + 4u);
    return QX(a, b, q_msum(a) + q_msum(b));
}

// 2^23 + the 4 unsigned bytes of w.
fn q_u8(w: u32) -> vec4<f32> {
    return q_f(q_bytes(w) & vec4<u32>(0xFFu));
}

alias QV = QV32;

fn q_vals(r: QRaw) -> QV {
    let c = vec4<f32>(Q_2P23);
    return QV(mat4x4<f32>(q_u8(r.a.x) - c, q_u8(r.a.y) - c, q_u8(r.a.z) - c, q_u8(r.a.w) - c),
              mat4x4<f32>(q_u8(r.b.x) - c, q_u8(r.b.y) - c, q_u8(r.b.z) - c, q_u8(r.b.w) - c));
}

fn q_dot_v(r: QRaw, w: QV, v: QX) -> f32 {
    let s = q_fma32(w, v.a, v.b);
    return fma(r.dm.x, q_hsum(s[0] + s[1]), r.dm.y * v.s);
}

fn q_dot(r: QRaw, v: QX) -> f32 {
    return q_dot_v(r, q_vals(r), v);
}

fn q_run(b: u32, j: u32) -> vec4<f32> {
    let q = q_bytes(qw1(8u * b + (j >> 2u))) & vec4<u32>(0xFFu);
    let dm = q_dm(b);
    return vec4<f32>(q) * dm.x + dm.y;
}
