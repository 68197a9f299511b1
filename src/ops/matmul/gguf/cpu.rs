//! The CPU twins of the quantized linear layer and of the staging of x.

use crate::dtype::{to_f32, DType};
use crate::error::Result;

/// `y (+)= x · Wᵀ (+ bias)` with x `[T, K]` and W `[N, K]` stored as `dtype` in `raw` (the
/// file's bytes, rows of K elements), dequantized with [`to_f32`]; sums in f64
/// ([`super::super::cpu::linear`]), so it serves as the exact reference.
pub fn linear_quant(
    x: &[f32],
    dtype: DType,
    raw: &[u8],
    k: usize,
    bias: Option<&[f32]>,
    y: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    let w = dequantize_rows(dtype, raw, k)?;
    super::super::cpu::linear(x, &w, k, bias, y, accumulate);
    Ok(())
}

/// `raw` (the file's bytes of whole rows of `k` elements in `dtype`) as f32, with [`to_f32`];
/// an error where K is not a whole number of blocks.
pub fn dequantize_rows(dtype: DType, raw: &[u8], k: usize) -> Result<Vec<f32>> {
    let row = dtype
        .byte_size(k)
        .filter(|&r| r > 0)
        .ok_or_else(|| crate::error::Error::Mismatch(format!("K = {k} is not a whole number of {dtype} blocks")))?;
    to_f32(dtype, raw, raw.len() / row * k)
}

/// Values as the tensor-core matmul (wgsl/matmul_quant_coop.wgsl) meets them: rounded to f16
/// (nearest even). Its CPU twin is [`super::super::cpu::linear`] over x and W's dequantized values
/// ([`dequantize_rows`]) so rounded, sums in f64.
pub fn round_f16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
}

/// x as the DP4 matvec stages it (wgsl/matvec_quant.wgsl), for rows of `k` elements: per
/// 32-element block with largest |x| of biased exponent E, scale d = 2^(E - 140) and each
/// element round(x / d) · d (nearest, ties to even: |x / d| < 2^14, so 15 bits and a sign
/// survive; the error is at most d / 2 ≤ 2^-14 of the block's largest |x|). Blocks under
/// 2^-113 become 0; a block with a non-finite value becomes NaN. Exact in f32 (d is a power of
/// two), so the kernel's integer sums over these values equal the reference's.
pub fn stage_x16(x: &[f32], k: usize) -> Vec<f32> {
    assert!(k.is_multiple_of(32));
    let mut out = Vec::with_capacity(x.len());
    for blk in x.chunks(32) {
        match block_scale(blk) {
            (_, d) if d.is_nan() => out.extend(blk.iter().map(|_| f32::NAN)),
            (inv, d) => out.extend(blk.iter().map(|v| (v * inv).round_ties_even() * d)),
        }
    }
    out
}

/// A block's (1 / d, d) from its largest |x|'s biased exponent E: d = 2^(E - 140); (0, 0)
/// under 2^-113, (0, NaN) with a NaN or an infinity (include/stage_x16.wgsl `stage_scale`).
fn block_scale(blk: &[f32]) -> (f32, f32) {
    match block_exponent(blk) {
        255 => (0.0, f32::NAN),
        0..14 => (0.0, 0.0),
        e => (f32::from_bits((267 - e) << 23), f32::from_bits((e - 13) << 23)),
    }
}

/// The biased exponent of a block's largest |x| (NaN and infinities: 255).
pub(crate) fn block_exponent(blk: &[f32]) -> u32 {
    (blk.iter().fold(0u32, |m, v| m.max(v.abs().to_bits())) >> 23) & 0xFF
}

/// x staged as wgsl/quantize_x16.wgsl writes it, as u32 words: per 32-element block b of a
/// row, the low bytes of its 16-bit values (elements 0..15 in words 20b .. 20b + 4, 16..31 in
/// the next 4; byte i of a word is element 4w + i of the 16), their high bytes (two's
/// complement) in the next 8 words, then the bits of d · Σ q over each half, of d, and 0;
/// q = round(x / d) and d as [`stage_x16`] (so q · d is its output).
pub fn quantize_x16(x: &[f32], k: usize) -> Vec<u32> {
    assert!(k.is_multiple_of(32) && x.len().is_multiple_of(k));
    let mut out = Vec::with_capacity(x.len() / 32 * 20);
    for blk in x.chunks(32) {
        let (inv, d) = block_scale(blk);
        // round(NaN) converts to 0 on the GPU (WGSL's saturating float -> int); the NaN
        // scale makes the block's sums NaN either way.
        let q: Vec<i32> = blk.iter().map(|v| (v * inv).round_ties_even() as i32).collect();
        let byte = |v: i32, shift: u32| ((v as u32) >> shift) & 0xFF;
        let word = |i: usize, shift: u32| (0..4).map(|j| byte(q[i + j], shift) << (8 * j)).sum::<u32>();
        for shift in [0, 8] {
            out.extend((0..8).map(|w| word(4 * w, shift)));
        }
        let sum = |h: usize| q[16 * h..16 * h + 16].iter().sum::<i32>() as f32;
        out.extend([(d * sum(0)).to_bits(), (d * sum(1)).to_bits(), d.to_bits(), 0]);
    }
    out
}
