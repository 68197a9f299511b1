// sincos: shared by the kernels that rotate (rope, attention with ROPE).

// (sin a, cos a) for an f32 angle 0 <= a < 2^20, absolute error ~1e-7.
// Range reduction is exact integer arithmetic (so fast-math cannot spoil it): a = n + fa with n
// an integer; a / (2 pi) mod 1 as 32-bit fixed point (2^32 = one turn), using 1/(2 pi) in base
// 4096 (digits 651, 3680, 3513, 913; the rest is below 2^-53 per unit of n). Then the nearest
// quarter turn q and the remainder x in [-pi/4, pi/4], and minimax polynomials (Cephes sinf/cosf).
fn sincos(a: f32) -> vec2<f32> {
    let n = u32(a);
    let fa = a - f32(n);
    var f = ((n * 651u) << 20u) + ((n * 3680u) << 8u) + ((n * 3513u) >> 4u) + ((n * 913u) >> 16u);
    f += u32(fa * 683565275.6); // fa / (2 pi) * 2^32
    let q = (f + 0x20000000u) >> 30u;
    let x = f32(bitcast<i32>(f - (q << 30u))) * 1.4629180793e-9; // 2 pi / 2^32
    let z = x * x;
    let s = x + x * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    let c = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    switch (q & 3u) {
        case 0u: { return vec2<f32>(s, c); }
        case 1u: { return vec2<f32>(c, -s); }
        case 2u: { return vec2<f32>(-s, -c); }
        default: { return vec2<f32>(-c, s); }
    }
}
