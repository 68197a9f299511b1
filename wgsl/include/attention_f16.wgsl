// f32 -> f16 with round-to-nearest-even in integer arithmetic (as torch's .half()): the same bits
// on every device, where drivers may round pack2x16float either way. Shared by the KV-cache writers.

// IEEE binary16 bits of x, round to nearest even; overflow -> inf, NaN stays NaN.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) {
        return sign | 0x7c00u | select(0u, 0x200u, a > 0x7f800000u);
    }
    if (a >= 0x477ff000u) { // >= 65520 rounds to inf
        return sign | 0x7c00u;
    }
    if (a >= 0x38800000u) { // normal half: rebias the exponent (127 -> 15), round 13 bits away
        let m = a - 0x38000000u;
        return sign | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
    }
    if (a < 0x33000000u) { // below 2^-25 (2^-25 itself is a tie to 0)
        return sign;
    }
    // subnormal half: units of 2^-24
    let e = a >> 23u;
    let mant = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e; // 14..24
    let q = mant >> shift;
    let rem = mant & ((1u << shift) - 1u);
    let halfway = 1u << (shift - 1u);
    let up = rem > halfway || (rem == halfway && (q & 1u) == 1u);
    return sign | (q + select(0u, 1u, up));
}

fn pack_rne(a: f32, b: f32) -> u32 {
    return f16_bits(a) | (f16_bits(b) << 16u);
}
