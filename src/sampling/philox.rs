//! The sampler's random numbers: Philox4x32-10, its mapping to a uniform in (0, 1), Gumbel noise,
//! and the portable natural logarithm both halves (host and WGSL) evaluate identically.
//!
//! Everything here uses only operations a WGSL kernel has with identical results: `u32`
//! wrapping arithmetic, shifts, xor, bitcasts, exact integer→float conversions, and individually
//! rounded `f32` add/sub/mul (no division, no libm). See the module docs of
//! [`crate::sampling`] for the full sampling spec.

/// Philox4x32 round multiplier for counter word 0 (Salmon et al. 2011, Random123).
pub const PHILOX_M0: u32 = 0xD251_1F53;
/// Philox4x32 round multiplier for counter word 2.
pub const PHILOX_M1: u32 = 0xCD9E_8D57;
/// Philox key schedule increment for key word 0 (golden ratio).
pub const PHILOX_W0: u32 = 0x9E37_79B9;
/// Philox key schedule increment for key word 1 (sqrt(3) - 1).
pub const PHILOX_W1: u32 = 0xBB67_AE85;

/// The full 64-bit product `a * b` as `(hi, lo)` 32-bit halves (reference, via `u64`).
#[inline]
pub fn mulhilo32(a: u32, b: u32) -> (u32, u32) {
    let p = u64::from(a) * u64::from(b);
    ((p >> 32) as u32, p as u32)
}

/// [`mulhilo32`] using only 32-bit wrapping arithmetic on 16-bit halves: the form the WGSL
/// kernel uses, since WGSL has no 64-bit integers. Equal to [`mulhilo32`] for all inputs
/// (tested on random pairs and the edge cases).
///
/// With `a = a1·2^16 + a0`, `b = b1·2^16 + b0`: the four partial products fit in `u32`;
/// `mid = (a0b0 >> 16) + lo16(a0b1) + lo16(a1b0) < 3·2^16` carries into the high word.
#[inline]
pub fn mulhilo32_emulated(a: u32, b: u32) -> (u32, u32) {
    let (a0, a1) = (a & 0xFFFF, a >> 16);
    let (b0, b1) = (b & 0xFFFF, b >> 16);
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16) + (p01 & 0xFFFF) + (p10 & 0xFFFF);
    let hi = p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16);
    (hi, a.wrapping_mul(b))
}

/// One Philox4x32 round (Random123 `_philox4x32round`).
#[inline]
fn philox_round(x: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo32(PHILOX_M0, x[0]);
    let (hi1, lo1) = mulhilo32(PHILOX_M1, x[2]);
    [hi1 ^ x[1] ^ k[0], lo1, hi0 ^ x[3] ^ k[1], lo0]
}

/// Philox4x32 with 10 rounds: the counter-based generator of Salmon, Moraes, Dror & Shaw,
/// "Parallel Random Numbers: As Easy as 1, 2, 3" (SC11), bit-identical to Random123's
/// `philox4x32_R(10, ctr, key)` (checked against its `kat_vectors`).
pub fn philox4x32_10(ctr: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut x = ctr;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k = [k[0].wrapping_add(PHILOX_W0), k[1].wrapping_add(PHILOX_W1)];
        }
        x = philox_round(x, k);
    }
    x
}

/// The Philox key for a 64-bit seed: `(seed low 32 bits, seed high 32 bits)`.
#[inline]
pub fn seed_key(seed: u64) -> [u32; 2] {
    [seed as u32, (seed >> 32) as u32]
}

/// The Philox counter block holding vocab entry `index`: `(index >> 2, row, step, 0)`.
/// Entry `index` uses output word `index & 3` of this block.
#[inline]
pub fn counter_block(step: u32, row: u32, index: u32) -> [u32; 4] {
    [index >> 2, row, step, 0]
}

/// The 32 random bits of vocab entry `index` of logits row `row` at decode step `step`:
/// word `index & 3` of `philox4x32_10((index >> 2, row, step, 0), (seed_lo, seed_hi))`.
/// Depends on nothing else (no thread, workgroup or subgroup counts).
#[inline]
pub fn uniform_bits(seed: u64, step: u32, row: u32, index: u32) -> u32 {
    philox4x32_10(counter_block(step, row, index), seed_key(seed))[(index & 3) as usize]
}

/// Map 32 random bits to a uniform `f32` strictly inside (0, 1):
/// `u = (f32(bits >> 9) + 0.5) * 2^-23`.
///
/// Uses the top 23 bits so that every step is exact in `f32` (`bits >> 9 < 2^23`, so adding
/// 0.5 is exact, and the power-of-two scale is exact): `u ∈ {(2j + 1)·2^-24 : 0 ≤ j < 2^23}`,
/// from `2^-24` to `1 - 2^-24`. (With 24 bits, `(2^24 - 1) + 0.5` is not representable and
/// rounds up to `2^24`, giving `u = 1` and an infinite Gumbel value.)
#[inline]
pub fn bits_to_unit(bits: u32) -> f32 {
    ((bits >> 9) as f32 + 0.5) * UNIT_SCALE
}

/// `2^-23`.
const UNIT_SCALE: f32 = 1.0 / 8_388_608.0;

/// Standard Gumbel noise from a uniform `u ∈ (0, 1)`: `g = -ln(-ln(u))`, both logarithms by
/// [`ln_portable`]. For the `u` of [`bits_to_unit`], `g ∈ [-2.82, 16.64]`, always finite.
#[inline]
pub fn gumbel(u: f32) -> f32 {
    -ln_portable(-ln_portable(u))
}

/// `ln(2)` high part: 16 significant bits, so `e * LN2_HI` is exact for `|e| < 256`.
pub const LN2_HI: f32 = f32::from_bits(0x3F31_7180); // 0.6931381
/// `ln(2) - LN2_HI`.
pub const LN2_LO: f32 = f32::from_bits(0x3717_F7D1); // 9.058001e-6

/// Coefficients `c0..c8` of `P(f) ≈ (ln(1+f) - f + f²/2) / f³` on `f ∈ [√½ - 1, √2 - 1]`
/// (interpolation at the 9 Chebyshev nodes, rounded to `f32`; approximation error < 0.06 ulp
/// of the result). The decimals in the comments are the shortest that parse to these exact bits.
pub const LN_POLY: [f32; 9] = [
    f32::from_bits(0x3EAA_AAAA), // 0.3333333
    f32::from_bits(0xBE7F_FFFE), // -0.24999997
    f32::from_bits(0x3E4C_CEAD), // 0.20000716
    f32::from_bits(0xBE2A_ADA5), // -0.16667803
    f32::from_bits(0x3E11_E90D), // 0.14249058
    f32::from_bits(0xBDFE_7A63), // -0.12425687
    f32::from_bits(0x3DEF_5141), // 0.1168542
    f32::from_bits(0xBDEB_1ADE), // -0.11479734
    f32::from_bits(0x3D8E_C752), // 0.06971611
];

/// Natural logarithm of a positive, normal, finite `f32`, evaluated with a fixed sequence of
/// individually rounded `f32` operations so the WGSL twin gives identical bits (WGSL's `log`
/// is not correctly rounded and differs between drivers). Accuracy: within 1 ulp of `ln(x)`
/// (worst 0.83 ulp over every input the sampler produces and a sweep of all normal floats;
/// tested). Not for zero, subnormals, infinities or NaN (the sampler never passes
/// them: its inputs are `u ∈ [2^-24, 1 - 2^-24]` and `-ln(u) ∈ [5.9e-8, 16.7]`).
///
/// Algorithm (each line one rounded `f32` op unless marked exact):
/// ```text
/// e = (bits >> 23) - 127;  m = bitcast((bits & 0x7FFFFF) | 0x3F800000)    m ∈ [1, 2)
/// if bits(m) > 0x3FB504F3 { m = m / 2 (exponent bits - 1, exact); e += 1 }  m ∈ [√½, √2]
/// f  = m - 1                      (exact, Sterbenz)
/// p  = c8;  p = p*f + c7;  ...;  p = p*f + c0      (Horner, mul then add, 8 steps)
/// z  = f*f;  hf = 0.5*z (exact);  q = (z*f)*p
/// r  = (((q + E*LN2_LO) - hf) + f) + E*LN2_HI     with E = f32(e) (exact), E*LN2_HI exact
/// ```
#[inline]
pub fn ln_portable(x: f32) -> f32 {
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32) - 127;
    let mut mbits = (bits & 0x007F_FFFF) | 0x3F80_0000;
    if mbits > 0x3FB5_04F3 {
        mbits -= 0x0080_0000;
        e += 1;
    }
    let f = f32::from_bits(mbits) - 1.0;
    let mut p = LN_POLY[8];
    for &c in LN_POLY[..8].iter().rev() {
        p = p * f + c;
    }
    let z = f * f;
    let hf = 0.5 * z;
    let q = (z * f) * p;
    let ef = e as f32;
    (((q + ef * LN2_LO) - hf) + f) + ef * LN2_HI
}

/// A fresh 64-bit seed for when the user gives none: the current time, the process id and a
/// per-process counter, hashed with std's randomly keyed SipHash (`RandomState`).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123 `tests/kat_vectors`, the three `philox4x32 10` lines
    /// (columns: ctr[4], key[2], expected[4]).
    const KAT: [([u32; 4], [u32; 2], [u32; 4]); 3] = [
        ([0, 0, 0, 0], [0, 0], [0x6627_E8D5, 0xE169_C58D, 0xBC57_AC4C, 0x9B00_DBD8]),
        ([0xFFFF_FFFF; 4], [0xFFFF_FFFF; 2], [0x408F_276D, 0x41C8_3B0E, 0xA20B_C7C6, 0x6D54_51FD]),
        (
            [0x243F_6A88, 0x85A3_08D3, 0x1319_8A2E, 0x0370_7344],
            [0xA409_3822, 0x299F_31D0],
            [0xD16C_FE09, 0x94FD_CCEB, 0x5001_E420, 0x2412_6EA1],
        ),
    ];

    #[test]
    fn philox_known_answers() {
        for (ctr, key, want) in KAT {
            assert_eq!(philox4x32_10(ctr, key), want, "ctr {ctr:08x?} key {key:08x?}");
        }
    }

    #[test]
    fn mulhilo_emulation_edges() {
        let edges = [
            0u32,
            1,
            2,
            0xFFFF,
            0x1_0000,
            0x1_0001,
            0x7FFF_FFFF,
            0x8000_0000,
            0xFFFF_FFFE,
            0xFFFF_FFFF,
            PHILOX_M0,
            PHILOX_M1,
        ];
        for &a in &edges {
            for &b in &edges {
                assert_eq!(mulhilo32_emulated(a, b), mulhilo32(a, b), "{a:#x} * {b:#x}");
            }
        }
    }

    #[test]
    fn unit_is_strictly_inside_and_exact() {
        assert_eq!(bits_to_unit(0), 2f32.powi(-24));
        assert_eq!(bits_to_unit(u32::MAX), 1.0 - 2f32.powi(-24));
        assert!(bits_to_unit(u32::MAX) < 1.0);
        for bits in [0u32, 511, 512, 0x8000_0000, 0xFFFF_FE00, u32::MAX] {
            let exact = ((bits >> 9) as f64 + 0.5) / 8_388_608.0;
            assert_eq!(bits_to_unit(bits) as f64, exact);
        }
        assert!(gumbel(bits_to_unit(0)).is_finite());
        assert!(gumbel(bits_to_unit(u32::MAX)).is_finite());
    }

    #[test]
    fn ln_constants_roundtrip_decimal() {
        let decimals: [f32; 9] = [
            0.3333333,
            -0.24999997,
            0.20000716,
            -0.16667803,
            0.14249058,
            -0.12425687,
            0.1168542,
            -0.11479734,
            0.06971611,
        ];
        assert_eq!(LN_POLY, decimals);
        assert_eq!(LN2_HI, 0.693_138_1);
        assert_eq!(LN2_LO, 9.058_001e-6);
        assert!(((LN2_HI as f64 + LN2_LO as f64) - std::f64::consts::LN_2).abs() < 1e-12);
    }

    fn ulp_error(got: f32, x: f32) -> f64 {
        let exact = (x as f64).ln();
        let ulp = if exact == 0.0 {
            f32::MIN_POSITIVE as f64
        } else {
            let e = exact.abs().log2().floor();
            2f64.powf(e - 23.0)
        };
        (got as f64 - exact).abs() / ulp
    }

    #[test]
    fn ln_portable_accuracy_over_every_unit_value() {
        // Every u the sampler can produce (2^23 values, stride 7 to stay fast) and the
        // corresponding -ln(u) inputs of the second logarithm.
        let mut worst = 0f64;
        let mut j = 0u32;
        while j < (1 << 23) {
            let u = bits_to_unit(j << 9);
            worst = worst.max(ulp_error(ln_portable(u), u));
            let y = -ln_portable(u);
            worst = worst.max(ulp_error(ln_portable(y), y));
            j += 7;
        }
        // The extremes exactly.
        for u in [bits_to_unit(0), bits_to_unit(u32::MAX)] {
            worst = worst.max(ulp_error(ln_portable(u), u));
        }
        assert!(worst < 1.0, "ln_portable worst error {worst} ulp");
    }

    #[test]
    fn ln_portable_accuracy_wide_range() {
        let mut worst = 0f64;
        let mut bits = f32::MIN_POSITIVE.to_bits();
        while bits < f32::MAX.to_bits() {
            let x = f32::from_bits(bits);
            worst = worst.max(ulp_error(ln_portable(x), x));
            bits += 997;
        }
        assert!(worst < 1.0, "ln_portable worst error {worst} ulp");
        assert_eq!(ln_portable(1.0), 0.0);
    }

    #[test]
    fn gumbel_mean_and_variance() {
        // E[g] = Euler–Mascheroni γ, Var[g] = π²/6.
        let n = 200_000u32;
        let (mut s, mut s2) = (0f64, 0f64);
        for i in 0..n {
            let g = gumbel(bits_to_unit(uniform_bits(0x1234_5678_9ABC_DEF0, 3, 1, i))) as f64;
            s += g;
            s2 += g * g;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!((mean - 0.577_215_664_9).abs() < 0.01, "mean {mean}");
        assert!((var - std::f64::consts::PI.powi(2) / 6.0).abs() < 0.03, "var {var}");
    }

    #[test]
    fn uniform_bits_layout() {
        let seed = 0xDEAD_BEEF_0123_4567u64;
        let block = philox4x32_10([5, 7, 9, 0], [0x0123_4567, 0xDEAD_BEEF]);
        for w in 0..4 {
            assert_eq!(uniform_bits(seed, 9, 7, 20 + w), block[w as usize]);
        }
    }

    #[test]
    fn random_seeds_differ() {
        assert_ne!(random_seed(), random_seed());
    }
}
