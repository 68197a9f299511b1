//! What a sampling head takes and gives back: the user's per-row [`SamplingParams`], their
//! kernel form [`PreparedParams`], a row's place in the random streams ([`RowKey`]) and the
//! [`Draw`]; the checks both samplers run on them. See the [module docs](super) for the spec.

use crate::error::{Error, Result};
use crate::gpu::Tensor;

/// Per-row sampling parameters as the user gives them. See the [module docs](super) for the
/// exact semantics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    /// `0` = greedy (argmax); otherwise logits are multiplied by `1/temperature`.
    pub temperature: f32,
    /// Keep the `top_k` highest-scoring tokens (plus ties at the threshold); `0` = off.
    pub top_k: u32,
    /// Nucleus: smallest top set of probability mass `≥ top_p`, ties kept; `1` = off.
    pub top_p: f32,
    /// Keep tokens with probability `≥ min_p · p_max`; `0` = off.
    pub min_p: f32,
    /// Philox key; the same seed, logits and steps give the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Plain sampling at temperature 1 with every filter off and seed 0.
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 0 }
    }
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// Whether this is greedy decoding (`temperature == 0`).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Check every parameter's range ([module docs](super)); NaN is always rejected.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::InvalidArgument(msg));
        let t = self.temperature;
        if !t.is_finite() || t < 0.0 {
            return bad(format!("temperature must be a finite number >= 0 (0 = greedy), got {t}"));
        }
        if t > 0.0 && t < f32::MIN_POSITIVE {
            return bad(format!("temperature {t:e} is too small (below {:e}); use 0 for greedy", f32::MIN_POSITIVE));
        }
        let p = self.top_p;
        if p.is_nan() || p <= 0.0 || p > 1.0 {
            return bad(format!("top_p must be in (0, 1] (1 = off), got {p}"));
        }
        let m = self.min_p;
        if m.is_nan() || !(0.0..1.0).contains(&m) {
            return bad(format!("min_p must be in [0, 1) (0 = off), got {m}"));
        }
        Ok(())
    }

    /// The derived per-row values both implementations use, for decode step `step` and stream
    /// 0 (see [`prepare_stream`](Self::prepare_stream)). Call [`validate`](Self::validate)
    /// first; invalid parameters give unspecified (but memory-safe) results.
    pub fn prepare(&self, step: u32) -> PreparedParams {
        self.prepare_stream(step, 0)
    }

    /// [`prepare`](Self::prepare) for Philox stream `stream` (the counter's second word): a
    /// row's index in a logits matrix by default, so rows with one seed draw differently; a
    /// request's own constant when rows of different requests share a batch, so its tokens do
    /// not depend on its row.
    pub fn prepare_stream(&self, step: u32, stream: u32) -> PreparedParams {
        let greedy = self.is_greedy();
        PreparedParams {
            mode: if greedy { MODE_GREEDY } else { MODE_SAMPLE },
            inv_temperature: if greedy { 0.0 } else { 1.0 / self.temperature },
            top_k: self.top_k,
            top_p: self.top_p,
            ln_min_p: if self.min_p > 0.0 { (self.min_p as f64).ln() as f32 } else { f32::NEG_INFINITY },
            seed_lo: self.seed as u32,
            seed_hi: (self.seed >> 32) as u32,
            step,
            stream,
            mask: 0,
        }
    }
}

/// [`PreparedParams::mode`]: argmax of the raw logits.
pub const MODE_GREEDY: u32 = 0;
/// [`PreparedParams::mode`]: scale, filter, Gumbel-max draw.
pub const MODE_SAMPLE: u32 = 1;

/// One row's parameters in the form the kernel reads (40 bytes, ten 4-byte fields, no
/// padding: a WGSL `struct` of `u32`/`f32` members in this order matches it), computed by
/// [`SamplingParams::prepare`]. The host implementation reads the same struct, so derived
/// values (`1/T`, `ln(min_p)`) are bit-identical on both sides.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PreparedParams {
    /// [`MODE_GREEDY`] or [`MODE_SAMPLE`].
    pub mode: u32,
    /// `1.0f32 / temperature` (0 in greedy mode).
    pub inv_temperature: f32,
    /// `0` = off.
    pub top_k: u32,
    /// `1` = off.
    pub top_p: f32,
    /// `f32(ln(f64(min_p)))`, `-inf` when off.
    pub ln_min_p: f32,
    /// Philox key word 0 (seed bits 0..32).
    pub seed_lo: u32,
    /// Philox key word 1 (seed bits 32..64).
    pub seed_hi: u32,
    /// Philox counter word 2.
    pub step: u32,
    /// Philox counter word 1: the row's stream ([`SamplingParams::prepare_stream`]).
    pub stream: u32,
    /// `0`: no token mask; `1 + j`: the row's mask is the `j`-th of the device sampler's
    /// uploaded masks ([`super::mask`]). The host sampler takes the mask itself.
    pub mask: u32,
}

impl PreparedParams {
    /// The 64-bit seed these were prepared from.
    pub fn seed(&self) -> u64 {
        (u64::from(self.seed_hi) << 32) | u64::from(self.seed_lo)
    }
}

/// What a [`SamplingBackend`](super::SamplingBackend) returns for a batch of rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Draw {
    /// One token per row (the spec's token, also for rows with non-finite logits).
    pub ids: Vec<u32>,
    /// Per row: whether its logits held a NaN or an infinity. The spec still defines a token for
    /// such a row, but a model that wrote them has failed: decode loops report it.
    pub non_finite: Vec<bool>,
}

/// A row's place in the random streams: the decode step and the Philox stream its draw uses
/// ([`SamplingParams::prepare_stream`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowKey {
    pub step: u32,
    pub stream: u32,
}

/// Validates each row's parameters and that there is one key per row.
pub fn check_keys(params: &[SamplingParams], keys: &[RowKey]) -> Result<()> {
    if keys.len() != params.len() {
        return Err(Error::InvalidArgument(format!(
            "sampling: {} row keys for {} rows of parameters",
            keys.len(),
            params.len()
        )));
    }
    params.iter().try_for_each(SamplingParams::validate)
}

/// Decode step `step` for `rows` rows, row `r` on Philox stream `r`.
pub fn row_keys(rows: usize, step: u32) -> Vec<RowKey> {
    (0..rows as u32).map(|row| RowKey { step, stream: row }).collect()
}

/// The rows' parameters as the kernels read them (validated, each with its step and stream).
pub fn prepare_rows(params: &[SamplingParams], keys: &[RowKey]) -> Result<Vec<PreparedParams>> {
    check_keys(params, keys)?;
    Ok(params.iter().zip(keys).map(|(p, k)| p.prepare_stream(k.step, k.stream)).collect())
}

/// Rows and vocabulary of `logits` for `params.len()` rows.
pub fn logits_shape(logits: &Tensor, params: &[SamplingParams]) -> Result<(usize, usize)> {
    let rows = params.len();
    if rows == 0 || !logits.numel().is_multiple_of(rows) {
        return Err(Error::InvalidArgument(format!("{} logits do not split into {rows} rows", logits.numel())));
    }
    Ok((rows, logits.numel() / rows))
}
