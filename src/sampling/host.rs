//! The host (CPU) sampler: the reference implementation of the spec in the
//! [module docs](super). Pure functions of `(logits, params, step, row)`.

use super::mask::TokenMask;
use super::params::{PreparedParams, SamplingParams, MODE_GREEDY};
use super::philox::{bits_to_unit, counter_block, gumbel, philox4x32_10};
use crate::error::{Error, Result};

/// Sample one token from one row of logits. The single source of truth for sampling: the
/// device kernel is tested against this.
///
/// `params` must be valid ([`SamplingParams::validate`]; checked in debug builds); invalid
/// parameters give an unspecified token, never a panic in release builds. Returns `0` for an
/// empty row.
pub fn sample_row(logits: &[f32], params: &SamplingParams, step: u32, row: u32) -> u32 {
    debug_assert!(params.validate().is_ok(), "invalid sampling parameters {params:?}");
    sample_row_prepared(logits, &params.prepare_stream(step, row))
}

/// [`sample_row`] with the parameters already in their kernel form (the step and the stream are
/// inside).
pub fn sample_row_prepared(logits: &[f32], params: &PreparedParams) -> u32 {
    match plan_row(logits, params) {
        RowPlan::Fixed(token) => token,
        RowPlan::Draw(thresholds) => draw(logits, params, &thresholds),
    }
}

/// [`sample_row_prepared`] restricted to the tokens `mask` allows ([`super::mask`]'s spec; no
/// mask: the plain spec). The mask must allow some token of the row ([`TokenMask::check`]).
pub fn sample_row_masked(logits: &[f32], params: &PreparedParams, mask: Option<&TokenMask>) -> u32 {
    let Some(mask) = mask else { return sample_row_prepared(logits, params) };
    let masked = mask_logits(logits, mask);
    match plan_row(&masked, params) {
        RowPlan::Fixed(_) => masked_argmax(logits, mask),
        RowPlan::Draw(thresholds) => draw(&masked, params, &thresholds),
    }
}

/// The row with `-inf` for every token `mask` disallows.
pub fn mask_logits(logits: &[f32], mask: &TokenMask) -> Vec<f32> {
    logits.iter().enumerate().map(|(i, &l)| if mask.allows(i as u32) { l } else { f32::NEG_INFINITY }).collect()
}

/// The masked argmax: the lowest allowed index of the largest allowed logit (NaN as `-inf`);
/// the lowest allowed index when every allowed logit is NaN or `-inf`; 0 when none is allowed.
pub fn masked_argmax(logits: &[f32], mask: &TokenMask) -> u32 {
    let mut best: Option<(u32, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        let l = if l.is_nan() { f32::NEG_INFINITY } else { l };
        if mask.allows(i as u32) && best.is_none_or(|(_, b)| l > b) {
            best = Some((i as u32, l));
        }
    }
    best.map_or(0, |(i, _)| i)
}

/// Sample every row of a row-major `params.len() × vocab` matrix into `tokens`
/// (row `r` uses row index `r` in the Philox counter). Validates sizes and parameters.
pub fn sample_rows(
    logits: &[f32],
    vocab: usize,
    params: &[SamplingParams],
    step: u32,
    tokens: &mut [u32],
) -> Result<()> {
    let rows = params.len();
    if u32::try_from(vocab).is_err() || u32::try_from(rows).is_err() {
        return Err(Error::InvalidArgument(format!(
            "sampling: {rows} rows of {vocab} logits exceed the u32 index range"
        )));
    }
    if rows.checked_mul(vocab) != Some(logits.len()) {
        return Err(Error::InvalidArgument(format!(
            "sampling: {} logits are not {rows} rows of {vocab}",
            logits.len()
        )));
    }
    if tokens.len() != rows {
        return Err(Error::InvalidArgument(format!("sampling: {} token slots for {rows} rows", tokens.len())));
    }
    for p in params {
        p.validate()?;
    }
    for (r, (p, out)) in params.iter().zip(tokens.iter_mut()).enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        *out = sample_row(row, p, step, r as u32);
    }
    Ok(())
}

/// Greedy decoding: the lowest index of the maximum logit, NaN treated as `-inf`; `0` when
/// every logit is NaN or `-inf` (or the row is empty).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0u32;
    let mut best_value = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        // NaN compares false, so it never replaces the incumbent.
        if l > best_value {
            best = i as u32;
            best_value = l;
        }
    }
    best
}

/// Step 1 of the spec: `l * inv_temperature`, NaN mapped to `-inf`.
#[inline]
pub fn scale(logit: f32, inv_temperature: f32) -> f32 {
    let s = logit * inv_temperature;
    if s.is_nan() {
        f32::NEG_INFINITY
    } else {
        s
    }
}

/// Order-preserving map from non-NaN `f32` to `u32`: `a < b ⇔ key(a) < key(b)` and
/// `a == b ⇔ key(a) == key(b)` (so `-0` and `+0` share a key). The form a kernel's bitwise
/// threshold search works on; undefined for NaN.
#[inline]
pub fn order_key(x: f32) -> u32 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b & 0x8000_0000 != 0 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Inverse of [`order_key`] (zero comes back as `+0`).
#[inline]
pub fn from_order_key(k: u32) -> f32 {
    f32::from_bits(if k & 0x8000_0000 != 0 { k & 0x7FFF_FFFF } else { !k })
}

/// What a row's filters decided, before any randomness.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RowPlan {
    /// The token is determined: greedy mode, a `+inf` scaled logit (→ greedy), or no
    /// candidate at all (→ 0).
    Fixed(u32),
    /// Draw among the tokens [`Thresholds::keeps`].
    Draw(Thresholds),
}

/// The thresholds of spec steps 2–5, all on scaled logits `s`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds {
    /// `m`: the largest scaled logit (finite).
    pub max: f32,
    /// `t_k`: the `k`-th largest scaled logit, `-inf` when top-k is off.
    pub top_k: f32,
    /// `t_p ≥ t_k`: the top-p level, equal to `top_k` when top-p is off.
    pub top_p: f32,
    /// `ln(min_p)`, `-inf` when min-p is off: keep `s - max ≥ ln_min_p`.
    pub ln_min_p: f32,
}

impl Thresholds {
    /// Whether the token with scaled logit `s` is in the final kept set `K`.
    #[inline]
    pub fn keeps(&self, s: f32) -> bool {
        s > f32::NEG_INFINITY && s >= self.top_p && s - self.max >= self.ln_min_p
    }
}

/// Spec steps 1–5: everything but the draw.
pub fn plan_row(logits: &[f32], params: &PreparedParams) -> RowPlan {
    if params.mode == MODE_GREEDY {
        return RowPlan::Fixed(argmax(logits));
    }
    let inv_t = params.inv_temperature;

    // Step 2: +inf, candidates, maximum.
    let mut max = f32::NEG_INFINITY;
    let mut candidates = 0usize;
    for &l in logits {
        let s = scale(l, inv_t);
        if s == f32::INFINITY {
            // Scaling is monotone, so the greedy token has s = +inf too.
            return RowPlan::Fixed(argmax(logits));
        }
        if s > f32::NEG_INFINITY {
            candidates += 1;
            if s > max {
                max = s;
            }
        }
    }
    if candidates == 0 {
        return RowPlan::Fixed(0);
    }
    let scaled_candidates = || logits.iter().map(|&l| scale(l, inv_t)).filter(|&s| s > f32::NEG_INFINITY);

    // Step 3: top-k, the k-th largest value with multiplicity.
    let k = params.top_k as usize;
    let top_k = if k > 0 && k < candidates {
        let mut v: Vec<f32> = scaled_candidates().collect();
        let (_, kth, _) = v.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
        *kth
    } else {
        f32::NEG_INFINITY
    };

    // Step 4: top-p over the top-k set, masses in f64.
    let top_p = if params.top_p < 1.0 {
        top_p_threshold(scaled_candidates().filter(|&s| s >= top_k), max, params.top_p)
    } else {
        top_k
    };

    RowPlan::Draw(Thresholds { max, top_k, top_p, ln_min_p: params.ln_min_p })
}

/// `t_p`: the largest level `v` among `kept` with `Σ_{s ≥ v} exp(s - max) ≥ top_p · Z`.
fn top_p_threshold(kept: impl Iterator<Item = f32>, max: f32, top_p: f32) -> f32 {
    // (s, w) with w = exp(f64(s - max)); d = s - max is the spec's f32 subtraction.
    let mut v: Vec<(f32, f64)> = kept.map(|s| (s, f64::from(s - max).exp())).collect();
    // Descending by value; -0 and +0 compare equal, as the spec's IEEE comparisons do.
    v.sort_unstable_by(|a, b| b.0.partial_cmp(&a.0).expect("no NaN after scaling"));
    // Z is summed in the same order as the running mass below, so the last level's mass is
    // exactly Z and the search always ends (top_p ≤ 1).
    let mut z = 0f64;
    for &(_, w) in &v {
        z += w;
    }
    let target = f64::from(top_p) * z;
    let mut mass = 0f64;
    let mut i = 0;
    loop {
        let level = v[i].0;
        while i < v.len() && v[i].0 == level {
            mass += v[i].1;
            i += 1;
        }
        if mass >= target || i == v.len() {
            return level;
        }
    }
}

/// Spec step 6: Gumbel-max among the kept tokens.
fn draw(logits: &[f32], params: &PreparedParams, th: &Thresholds) -> u32 {
    let key = [params.seed_lo, params.seed_hi];
    let mut best: Option<(u32, f32)> = None;
    for (b, chunk) in logits.chunks(4).enumerate() {
        let mut block: Option<[u32; 4]> = None;
        for (j, &l) in chunk.iter().enumerate() {
            let s = scale(l, params.inv_temperature);
            if !th.keeps(s) {
                continue;
            }
            let i = (b * 4 + j) as u32;
            let words = block.get_or_insert_with(|| philox4x32_10(counter_block(params.step, params.stream, i), key));
            let k = (s - th.max) + gumbel(bits_to_unit(words[j]));
            if best.is_none_or(|(_, bk)| k > bk) {
                best = Some((i, k));
            }
        }
    }
    // The maximum is always kept, so `best` is set whenever the plan says Draw.
    best.map_or(0, |(i, _)| i)
}

/// The final kept set `K` (spec steps 1–5), ascending; the one token for a fixed outcome.
pub fn kept_tokens(logits: &[f32], params: &PreparedParams) -> Vec<u32> {
    match plan_row(logits, params) {
        RowPlan::Fixed(t) => vec![t],
        RowPlan::Draw(th) => {
            (0..logits.len() as u32).filter(|&i| th.keeps(scale(logits[i as usize], params.inv_temperature))).collect()
        }
    }
}

/// The distribution the draw samples from: `exp(d[i]) / Σ_K exp(d)` on `K`, 0 elsewhere
/// (one-hot for a fixed outcome), in `f64`. For statistical tests of both implementations.
pub fn distribution(logits: &[f32], params: &PreparedParams) -> Vec<f64> {
    distribution_masked(logits, params, None)
}

/// [`distribution`] restricted to the tokens `mask` allows.
pub fn distribution_masked(logits: &[f32], params: &PreparedParams, mask: Option<&TokenMask>) -> Vec<f64> {
    let masked;
    let logits = match mask {
        Some(m) => {
            masked = mask_logits(logits, m);
            &masked[..]
        }
        None => logits,
    };
    let mut p = vec![0f64; logits.len()];
    match plan_row(logits, params) {
        RowPlan::Fixed(t) => {
            let t = mask.map_or(t, |m| masked_argmax(logits, m));
            if let Some(x) = p.get_mut(t as usize) {
                *x = 1.0;
            }
        }
        RowPlan::Draw(th) => {
            let mut z = 0f64;
            for (x, &l) in p.iter_mut().zip(logits) {
                let s = scale(l, params.inv_temperature);
                if th.keeps(s) {
                    *x = f64::from(s - th.max).exp();
                    z += *x;
                }
            }
            for x in &mut p {
                *x /= z;
            }
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_key_is_monotone_and_merges_zeros() {
        let xs = [
            f32::NEG_INFINITY,
            -f32::MAX,
            -1.5,
            -f32::MIN_POSITIVE,
            -1e-45,
            -0.0,
            0.0,
            1e-45,
            f32::MIN_POSITIVE,
            1.0,
            f32::MAX,
            f32::INFINITY,
        ];
        for w in xs.windows(2) {
            let (a, b) = (w[0], w[1]);
            assert_eq!(a < b, order_key(a) < order_key(b), "{a} {b}");
            assert_eq!(a == b, order_key(a) == order_key(b), "{a} {b}");
        }
        for &x in &xs {
            let back = from_order_key(order_key(x));
            assert_eq!(back, x);
            if x != 0.0 {
                assert_eq!(back.to_bits(), x.to_bits());
            }
        }
    }

    #[test]
    fn top_p_threshold_levels() {
        // p ∝ e^2, e, e, 1: the first level has 0.534 of the mass, the second brings 0.928.
        let s = [2.0f32, 1.0, 1.0, 0.0];
        assert_eq!(top_p_threshold(s.into_iter(), 2.0, 0.5), 2.0);
        assert_eq!(top_p_threshold(s.into_iter(), 2.0, 0.6), 1.0);
        assert_eq!(top_p_threshold(s.into_iter(), 2.0, 0.95), 0.0);
        assert_eq!(top_p_threshold(s.into_iter(), 2.0, 1.0), 0.0);
    }
}
