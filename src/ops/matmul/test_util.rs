//! Test support shared by the unit tests (`tests.rs` here, the quantized and expert ones) and the
//! timing loops of `benches/`: random f16 weights, the exact reference of a linear layer with its
//! tolerance, and the elementwise check against it.

use super::cpu;
use crate::gpu::tensor::test_util::random;
use half::f16;

/// Random f16 weights `[n, k]` and the same values widened to f32 for the reference.
pub fn weights(n: usize, k: usize, seed: u64) -> (Vec<f16>, Vec<f32>) {
    let h: Vec<f16> = random(n * k, seed, 1.0).into_iter().map(f16::from_f32).collect();
    let f = h.iter().map(|v| v.to_f32()).collect();
    (h, f)
}

/// Reference result and the per-element tolerance of `y (+)= x·Wᵀ (+ bias)`.
///
/// Tolerance: the reference sums in f64 over the same (f16-rounded) weights, so the only
/// error is the kernel's f32 rounding. Each addition of a K-term sum errs by at most
/// eps = 2^-24 ≈ 6e-8 of the running sum, which is at most S = Σ|terms| (Σ_k |x_k·w_k| plus
/// |bias| and |y_old|). The kernels sum in various orders (strided lanes, subgroup and tree
/// reductions, k-blocks), and rounding errors of random sign grow like sqrt(K), so the
/// expected error is ~eps·sqrt(K)·S / few. We allow 4·eps·sqrt(K)·S: with terms ~U(-1,1)²
/// (S ≈ K/4), K = 1536 gives 3.6e-3 against outputs of size ~sqrt(K)/3 ≈ 13 (~3e-4
/// relative), still far below one term's typical magnitude (~0.25), so a dropped, doubled or
/// misplaced term fails.
pub fn reference<W: RefWeight + ?Sized>(
    x: &[f32],
    w: &W,
    k: usize,
    bias: Option<&[f32]>,
    y0: &[f32],
    accumulate: bool,
) -> (Vec<f32>, Vec<f32>) {
    let mut want = y0.to_vec();
    w.linear(x, k, bias, &mut want, accumulate);
    (want, tolerance(x, &w.magnitudes(k), k, bias, y0, accumulate))
}

/// A weight [`reference`] multiplies by: f16 weights widened to f32 (a slice or a `Vec`), or a
/// quantized type's rows (`gguf::tests::Quant`).
pub trait RefWeight {
    /// `y (+)= x·Wᵀ (+ bias)` on the CPU, summed in f64.
    fn linear(&self, x: &[f32], k: usize, bias: Option<&[f32]>, y: &mut [f32], accumulate: bool);
    /// Per element of W, the magnitude of the terms a kernel sums for it ([`tolerance`]'s `w_mag`).
    fn magnitudes(&self, k: usize) -> Vec<f32>;
}

/// f16 weights widened to f32: the terms are x·w, their magnitudes |W|.
impl<T: AsRef<[f32]> + ?Sized> RefWeight for T {
    fn linear(&self, x: &[f32], k: usize, bias: Option<&[f32]>, y: &mut [f32], accumulate: bool) {
        cpu::linear(x, self.as_ref(), k, bias, y, accumulate);
    }
    fn magnitudes(&self, _k: usize) -> Vec<f32> {
        self.as_ref().iter().map(|a| a.abs()).collect()
    }
}

/// The tolerance of [`reference`] (and of the quantized tests' reference): 4·eps·sqrt(K)·S per
/// element, S = Σ_k |x_k|·w_mag_k + |bias| + |y_old|, with `w_mag` the magnitudes of the terms
/// the kernel sums for each weight (|W|, or more where a quantized type sums two terms apart).
pub fn tolerance(x: &[f32], w_mag: &[f32], k: usize, bias: Option<&[f32]>, y0: &[f32], accumulate: bool) -> Vec<f32> {
    let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
    let mut mag = abs(y0);
    let ab = bias.map(abs);
    cpu::linear(&abs(x), w_mag, k, ab.as_deref(), &mut mag, accumulate);
    let eps = f32::EPSILON / 2.0;
    mag.iter().map(|m| 4.0 * eps * (k as f32).sqrt() * m).collect()
}

/// Asserts |got - want| <= tol elementwise (NaN fails); returns the worst error / tolerance.
pub fn check(got: &[f32], want: &[f32], tol: &[f32], what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}");
    let mut worst = 0.0f32;
    for (i, ((g, w), t)) in got.iter().zip(want).zip(tol).enumerate() {
        let d = (g - w).abs();
        assert!(d <= *t, "{what}: element {i}: got {g}, want {w} (|diff| {d} > tol {t})");
        worst = worst.max(d / t);
    }
    worst
}
