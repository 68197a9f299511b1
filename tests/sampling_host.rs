//! The host sampler against the spec in `src/sampling/mod.rs`: RNG arithmetic, parameter
//! validation, greedy and degenerate outcomes, determinism, chi-square goodness of fit of the
//! draws (with a negative control), exact nucleus membership and tie rules, and a large
//! f16-range vocabulary; token masks (fixed outcomes, chi-square against the restricted
//! distribution). Every test uses fixed seeds.

use wgpu_llm::sampling::host::sample_rows;
use wgpu_llm::sampling::host::{self, distribution, distribution_masked, kept_tokens, plan_row, RowPlan};
use wgpu_llm::sampling::philox::{mulhilo32, mulhilo32_emulated};
use wgpu_llm::sampling::{sample_row, sample_row_masked, SamplingParams, TokenMask};
use wgpu_llm::Error;

mod common;

use common::stats::{chi_square, gamma_q, reference_distribution, Mix};

#[test]
fn chi_square_p_value_is_right() {
    // df = 2: Q(1, x/2) = exp(-x/2).
    for x in [0.5, 2.0, 7.0, 13.8] {
        assert!((gamma_q(1.0, x / 2.0) - (-x / 2.0f64).exp()).abs() < 1e-12);
    }
    // Tabulated critical values: df 10 at p = 0.01 is 23.209; df 49 at p = 0.001 is 85.351;
    // df 1 at p = 0.05 is 3.841.
    assert!((gamma_q(5.0, 23.209 / 2.0) - 0.01).abs() < 1e-4);
    assert!((gamma_q(24.5, 85.351 / 2.0) - 0.001).abs() < 1e-5);
    assert!((gamma_q(0.5, 3.841 / 2.0) - 0.05).abs() < 1e-4);
}

// ---------------------------------------------------------------------------------------
// RNG.

// The Random123 known-answer vectors are checked once, beside the generator
// (`src/sampling/philox.rs`, `philox_known_answers`).

#[test]
fn emulated_mulhilo_matches_u64_on_a_million_pairs() {
    let mut rng = Mix(1);
    for _ in 0..1_000_000 {
        let (a, b) = (rng.u32(), rng.u32());
        assert_eq!(mulhilo32_emulated(a, b), mulhilo32(a, b), "{a:#x} * {b:#x}");
    }
}

// ---------------------------------------------------------------------------------------
// Parameters.

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, seed }
}

#[test]
fn validate_rejects_each_bad_parameter() {
    let ok = SamplingParams::default();
    let cases: Vec<(SamplingParams, &str)> = vec![
        (SamplingParams { temperature: -0.5, ..ok }, "temperature"),
        (SamplingParams { temperature: f32::NAN, ..ok }, "temperature"),
        (SamplingParams { temperature: f32::INFINITY, ..ok }, "temperature"),
        (SamplingParams { temperature: 1e-40, ..ok }, "temperature"),
        (SamplingParams { top_p: 0.0, ..ok }, "top_p"),
        (SamplingParams { top_p: -0.1, ..ok }, "top_p"),
        (SamplingParams { top_p: 1.01, ..ok }, "top_p"),
        (SamplingParams { top_p: f32::NAN, ..ok }, "top_p"),
        (SamplingParams { min_p: -0.1, ..ok }, "min_p"),
        (SamplingParams { min_p: 1.0, ..ok }, "min_p"),
        (SamplingParams { min_p: f32::NAN, ..ok }, "min_p"),
    ];
    for (p, name) in cases {
        match p.validate() {
            Err(Error::InvalidArgument(msg)) => assert!(msg.contains(name), "{p:?}: {msg}"),
            other => panic!("{p:?} gave {other:?}"),
        }
    }
    for p in [
        ok,
        SamplingParams::greedy(),
        params(f32::MIN_POSITIVE, u32::MAX, 1.0, 0.0, u64::MAX),
        params(1e30, 1, 1e-7, 0.999_999, 7),
    ] {
        assert!(p.validate().is_ok(), "{p:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Greedy and defined outcomes.

fn reference_argmax(l: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in l.iter().enumerate() {
        let x = if x.is_nan() { f32::NEG_INFINITY } else { x };
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map_or(0, |(i, _)| i as u32)
}

#[test]
fn greedy_is_argmax_lowest_index_on_ties() {
    let mut rng = Mix(2);
    for trial in 0..500 {
        let v = 1 + (rng.u32() % 300) as usize;
        // Few distinct values, so ties at the maximum are common.
        let l: Vec<f32> = (0..v).map(|_| (rng.u32() % 7) as f32 - 3.0).collect();
        let want = reference_argmax(&l);
        let first_max = l.iter().position(|&x| x == l[want as usize]).unwrap();
        assert_eq!(want as usize, first_max);
        let p = SamplingParams { seed: rng.next(), ..SamplingParams::greedy() };
        assert_eq!(sample_row(&l, &p, trial, 3), want, "{l:?}");
    }
}

#[test]
fn greedy_nan_and_inf_outcomes() {
    let g = SamplingParams::greedy();
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let cases: [(&[f32], u32); 9] = [
        (&[nan, 1.0, nan], 1),
        (&[nan, nan, nan], 0),
        (&[f32::NEG_INFINITY, f32::NEG_INFINITY], 0),
        (&[nan, f32::NEG_INFINITY, -5.0], 2),
        (&[1.0, inf, inf, nan], 1),
        (&[nan, -inf, inf], 2),
        (&[f32::MAX, f32::MAX], 0),
        (&[-0.0, 0.0], 0),
        (&[], 0),
    ];
    for (l, want) in cases {
        assert_eq!(sample_row(l, &g, 0, 0), want, "{l:?}");
    }
}

#[test]
fn sampling_nan_and_inf_outcomes() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    for step in 0..50 {
        let p = params(0.7, 0, 0.9, 0.05, 11);
        // +inf scaled logit: the greedy token (the first +inf), deterministically.
        assert_eq!(sample_row(&[1.0, inf, 3.0, inf], &p, step, 0), 1);
        assert_eq!(sample_row(&[nan, 1.0, inf, 3.0, inf], &p, step, 0), 2);
        // NaN is never drawn; with one finite logit it is the only candidate.
        assert_eq!(sample_row(&[nan, 2.0, nan], &p, step, 0), 1);
        assert_eq!(sample_row(&[-inf, nan, -inf, -1.0e38], &p, step, 0), 3);
        // ... unless l / T overflows to -inf: then there is no candidate.
        assert_eq!(sample_row(&[-inf, nan, -inf, -3.0e38], &p, step, 0), 0);
        // No candidate at all: token 0.
        assert_eq!(sample_row(&[nan, -inf, nan], &p, step, 0), 0);
        assert_eq!(sample_row(&[], &p, step, 0), 0);
        // Overflow of l / T to +inf for a tiny temperature is the +inf rule: greedy, even
        // though tokens 1..=3 all overflow.
        let tiny = params(1e-37, 0, 1.0, 0.0, 5);
        assert_eq!(sample_row(&[1.0, 50.0, 60.0, 55.0, 60.0], &tiny, step, 0), 2);
        // d = s - max overflowing to -inf: weight 0, never drawn, no NaN.
        let wide = [-3.0e38f32, 3.0e38, 3.0e38];
        let t = sample_row(&wide, &params(1.0, 0, 1.0, 0.0, step as u64), step, 0);
        assert!(t == 1 || t == 2);
    }
}

// ---------------------------------------------------------------------------------------
// Determinism.

fn random_logits(rng: &mut Mix, v: usize, scale: f64) -> Vec<f32> {
    (0..v).map(|_| (rng.normal() * scale) as f32).collect()
}

#[test]
fn same_seed_same_tokens_different_seeds_differ() {
    let mut rng = Mix(3);
    let l = random_logits(&mut rng, 64, 0.5);
    let run = |seed: u64, row: u32| -> Vec<u32> {
        let p = params(1.0, 40, 0.95, 0.01, seed);
        (0..200).map(|step| sample_row(&l, &p, step, row)).collect()
    };
    let a = run(42, 0);
    assert_eq!(a, run(42, 0));
    let b = run(43, 0);
    assert_ne!(a, b);
    let c = run(42, 1);
    assert_ne!(a, c);
    // Steps vary the draw: far from a constant sequence.
    let distinct: std::collections::BTreeSet<_> = a.iter().collect();
    assert!(distinct.len() > 20, "{distinct:?}");
    // Agreement between different seeds is what chance predicts, not identity.
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 40, "{same} of 200 equal");
}

#[test]
fn sample_rows_rows_and_size_errors() {
    let mut rng = Mix(4);
    let vocab = 33;
    let rows = 3;
    let l = random_logits(&mut rng, rows * vocab, 1.0);
    let ps = [SamplingParams::greedy(), params(0.8, 5, 1.0, 0.0, 9), params(1.2, 0, 0.8, 0.02, 10)];
    let mut out = [0u32; 3];
    sample_rows(&l, vocab, &ps, 17, &mut out).unwrap();
    for r in 0..rows {
        let row = &l[r * vocab..(r + 1) * vocab];
        assert_eq!(out[r], sample_row(row, &ps[r], 17, r as u32));
    }
    assert!(sample_rows(&l, vocab + 1, &ps, 0, &mut out).is_err());
    assert!(sample_rows(&l, vocab, &ps, 0, &mut out[..2]).is_err());
    let bad = [ps[0], ps[1], params(1.0, 0, 0.0, 0.0, 0)];
    assert!(matches!(sample_rows(&l, vocab, &bad, 0, &mut out), Err(Error::InvalidArgument(_))));
}

// ---------------------------------------------------------------------------------------
// Goodness of fit.

/// Draw `n` tokens with `p`, varying the step (row 0), and count them.
fn histogram(l: &[f32], p: &SamplingParams, n: u32) -> Vec<u64> {
    let mut counts = vec![0u64; l.len()];
    for step in 0..n {
        counts[sample_row(l, p, step, 0) as usize] += 1;
    }
    counts
}

const DRAWS: u32 = 100_000;

/// Fit test logits: 50 tokens, spread so that the distribution is far from uniform.
fn fit_logits() -> Vec<f32> {
    random_logits(&mut Mix(5), 50, 1.5)
}

/// Chi-square of draws with `p` against the reference for `(t, k, top_p, min_p)`; also checks
/// that nothing outside the reference support is ever drawn and that the host's own
/// `distribution` agrees with the reference.
fn fit(l: &[f32], p: &SamplingParams, reference: &[f64]) -> f64 {
    let counts = histogram(l, p, DRAWS);
    for (i, (&c, &q)) in counts.iter().zip(reference).enumerate() {
        assert!(q > 0.0 || c == 0, "token {i} outside the kept set drawn {c} times");
    }
    let (stat, df, pv) = chi_square(&counts, reference);
    eprintln!("{p:?}: chi2 {stat:.1} df {df} p {pv:.4}");
    pv
}

fn check_fit(t: f32, k: u32, top_p: f32, min_p: f32, seed: u64) {
    let l = fit_logits();
    let p = params(t, k, top_p, min_p, seed);
    let reference = reference_distribution(&l, t as f64, k as usize, top_p as f64, min_p as f64);
    let host = distribution(&l, &p.prepare(0));
    for (i, (&a, &b)) in host.iter().zip(&reference).enumerate() {
        assert_eq!(a > 0.0, b > 0.0, "token {i}: kept sets differ");
        assert!((a - b).abs() < 1e-6, "token {i}: {a} vs {b}");
    }
    let pv = fit(&l, &p, &reference);
    assert!(pv > 0.001, "p-value {pv}");
}

#[test]
fn chi_square_temperature() {
    check_fit(1.0, 0, 1.0, 0.0, 100);
    check_fit(0.6, 0, 1.0, 0.0, 101);
}

#[test]
fn chi_square_top_k() {
    check_fit(0.9, 10, 1.0, 0.0, 102);
}

#[test]
fn chi_square_top_p() {
    // Guard: no level's mass is near the boundary, so the reference is unambiguous.
    let l = fit_logits();
    let top_p = 0.7;
    let r = reference_distribution(&l, 1.1, 0, 1.0, 0.0);
    let mut sorted = r.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let mut mass = 0.0;
    for q in sorted {
        mass += q;
        assert!((mass - top_p).abs() > 1e-3);
    }
    check_fit(1.1, 0, top_p as f32, 0.0, 103);
}

#[test]
fn chi_square_min_p() {
    check_fit(1.0, 0, 1.0, 0.05, 104);
}

#[test]
fn chi_square_all_filters() {
    check_fit(0.8, 20, 0.9, 0.02, 105);
}

#[test]
fn chi_square_rejects_wrong_temperature() {
    // Negative control: draws at 1.3 T tested against softmax(l / T) must fail.
    let l = fit_logits();
    let reference = reference_distribution(&l, 1.0, 0, 1.0, 0.0);
    let pv = fit(&l, &params(1.3, 0, 1.0, 0.0, 100), &reference);
    assert!(pv < 0.001, "wrong temperature not detected: p = {pv}");
    // Also subtler: 1.05 T.
    let pv = fit(&l, &params(1.05, 0, 1.0, 0.0, 100), &reference);
    assert!(pv < 0.001, "5% temperature error not detected: p = {pv}");
}

// ---------------------------------------------------------------------------------------
// Nucleus membership and tie rules (exact ties constructed).

fn kept(l: &[f32], p: SamplingParams) -> Vec<u32> {
    kept_tokens(l, &p.prepare(0))
}

/// Draws 20k tokens and checks they cover exactly `want`.
fn drawn_set_is(l: &[f32], p: SamplingParams, want: &[u32]) {
    let counts = histogram(l, &p, 20_000);
    let drawn: Vec<u32> = (0..l.len() as u32).filter(|&i| counts[i as usize] > 0).collect();
    assert_eq!(drawn, want, "{l:?} {p:?}: {counts:?}");
}

#[test]
fn top_k_keeps_every_tie_at_the_threshold() {
    let l = [5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, 3.0];
    let p = params(1.0, 3, 1.0, 0.0, 7);
    assert_eq!(kept(&l, p), [0, 1, 2, 3, 4, 7]);
    drawn_set_is(&l, params(2.0, 3, 1.0, 0.0, 7), &[0, 1, 2, 3, 4, 7]);
    // k = 2 with a three-way tie at the top keeps all three.
    assert_eq!(kept(&[1.0, 1.0, 1.0, 0.0], params(1.0, 2, 1.0, 0.0, 0)), [0, 1, 2]);
    // -0 and +0 are one value.
    assert_eq!(kept(&[1.0, -0.0, 0.0, -1.0], params(1.0, 2, 1.0, 0.0, 0)), [0, 1, 2]);
    // k = 1 keeps the maximum only; k >= vocab is off.
    assert_eq!(kept(&l, params(1.0, 1, 1.0, 0.0, 0)), [0]);
    assert_eq!(kept(&l, params(1.0, 8, 1.0, 0.0, 0)).len(), 8);
    assert_eq!(kept(&l, params(1.0, 1000, 1.0, 0.0, 0)).len(), 8);
    // NaN / -inf are not candidates and do not count toward k.
    let with_nan = [f32::NAN, 2.0, f32::NEG_INFINITY, 1.0, 1.0];
    assert_eq!(kept(&with_nan, params(1.0, 2, 1.0, 0.0, 0)), [1, 3, 4]);
    assert_eq!(kept(&with_nan, params(1.0, 3, 1.0, 0.0, 0)), [1, 3, 4]);
}

#[test]
fn top_p_keeps_whole_levels() {
    // p ∝ e², e, e, 1 = .535, .197, .197, .072.
    let l = [2.0, 1.0, 1.0, 0.0];
    assert_eq!(kept(&l, params(1.0, 0, 0.5, 0.0, 0)), [0]);
    assert_eq!(kept(&l, params(1.0, 0, 0.6, 0.0, 0)), [0, 1, 2]);
    assert_eq!(kept(&l, params(1.0, 0, 0.95, 0.0, 0)), [0, 1, 2, 3]);
    drawn_set_is(&l, params(1.0, 0, 0.6, 0.0, 8), &[0, 1, 2]);
    // All equal: the first level is everything.
    assert_eq!(kept(&[0.0; 4], params(1.0, 0, 0.1, 0.0, 0)), [0, 1, 2, 3]);
    // Top-p's softmax is over the top-k set: with k = 2 (keeping 0, 1, 2 by the tie), the
    // first level has .535/.929 = .576 of that mass.
    assert_eq!(kept(&l, params(1.0, 2, 0.55, 0.0, 0)), [0]);
    assert_eq!(kept(&l, params(1.0, 2, 0.6, 0.0, 0)), [0, 1, 2]);
    // Temperature applies before top-p: at T = 0.25 the top token alone has 0.98.
    assert_eq!(kept(&l, params(0.25, 0, 0.95, 0.0, 0)), [0]);
}

#[test]
fn min_p_threshold_is_inclusive() {
    let ln_min_p = (0.1f64).ln() as f32;
    let below = f32::from_bits(ln_min_p.to_bits() + 1); // one ulp more negative
    let l = [0.0, ln_min_p, below, -1.0];
    let p = params(1.0, 0, 1.0, 0.1, 9);
    assert_eq!(kept(&l, p), [0, 1, 3]);
    drawn_set_is(&l, p, &[0, 1, 3]);
    // Relative to the maximum after scaling: at T = 2 the gaps halve.
    assert_eq!(kept(&[0.0, -4.0, -5.0], params(2.0, 0, 1.0, 0.1, 0)), [0, 1]);
}

#[test]
fn plan_exposes_thresholds() {
    let l = [5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, 3.0];
    match plan_row(&l, &params(0.5, 3, 1.0, 0.0, 0).prepare(0)) {
        RowPlan::Draw(th) => {
            assert_eq!(th.max, 10.0);
            assert_eq!(th.top_k, 6.0);
            assert_eq!(th.top_p, 6.0);
            assert_eq!(th.ln_min_p, f32::NEG_INFINITY);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan_row(&l, &SamplingParams::greedy().prepare(0)), RowPlan::Fixed(0));
}

// ---------------------------------------------------------------------------------------
// Large vocabulary in the f16 range.

#[test]
fn large_vocab_f16_range() {
    const V: usize = 262_144;
    let mut rng = Mix(6);
    let f16 = |x: f64| half::f16::from_f64(x).to_f32();
    let mut l: Vec<f32> = (0..V).map(|_| f16((rng.unit() * 2.0 - 1.0) * 65504.0)).collect();
    // Saturated ends, as an f16 overflow clamp would produce: 300 tokens at +65504 scattered
    // over the vocabulary, and a block at -65504.
    for _ in 0..300 {
        l[(rng.u32() % V as u32) as usize] = 65504.0;
    }
    for x in &mut l[1000..2000] {
        *x = -65504.0;
    }
    let saturated: Vec<u32> = (0..V as u32).filter(|&i| l[i as usize] == 65504.0).collect();
    assert!(saturated.len() >= 290);
    assert!(l.iter().all(|x| x.is_finite()));

    // Greedy: the first saturated token.
    assert_eq!(sample_row(&l, &SamplingParams::greedy(), 0, 0), saturated[0]);

    // T = 1: every other token is >= 32 below the maximum (f16 spacing), so draws are uniform
    // over the saturated tokens; never a NaN, never a constant token.
    let p = params(1.0, 0, 1.0, 0.0, 12);
    let dist = distribution(&l, &p.prepare(0));
    assert!(dist.iter().all(|x| x.is_finite()));
    assert!((dist.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    let tokens: Vec<u32> = (0..40).map(|step| sample_row(&l, &p, step, 0)).collect();
    assert!(tokens.iter().all(|t| saturated.binary_search(t).is_ok()));
    let distinct: std::collections::BTreeSet<_> = tokens.iter().collect();
    assert!(distinct.len() > 30, "{distinct:?}");

    // A high temperature spreads over the whole range, with every filter on.
    let p = params(4096.0, 50_000, 0.9, 0.001, 13);
    let tokens: Vec<u32> = (0..8).map(|step| sample_row(&l, &p, step, 0)).collect();
    let kept = kept_tokens(&l, &p.prepare(0));
    // Exactly the tokens the independent f64 reference gives weight to (top-k, nucleus and min-p
    // at T = 4096: a set of a few thousand).
    let want: Vec<u32> = reference_distribution(&l, 4096.0, 50_000, 0.9, 0.001)
        .iter()
        .enumerate()
        .filter(|(_, &p)| p > 0.0)
        .map(|(i, _)| i as u32)
        .collect();
    assert_eq!(kept, want, "kept {} tokens, the reference {}", kept.len(), want.len());
    assert!(tokens.iter().all(|t| kept.binary_search(t).is_ok()));
    let distinct: std::collections::BTreeSet<_> = tokens.iter().collect();
    assert!(distinct.len() > 4, "{tokens:?}");

    // A tiny temperature overflows l / T to +inf for most tokens: greedy, by the +inf rule.
    let p = params(1e-36, 0, 1.0, 0.0, 14);
    assert_eq!(sample_row(&l, &p, 3, 0), saturated[0]);
    // Host helpers agree with the plan.
    assert_eq!(host::argmax(&l), saturated[0]);
}

// ---------------------------------------------------------------------------------------
// Token masks (src/sampling/mask.rs).

/// The mask of the fit tests: every token but those `i % 3 == 1` (a third of them).
fn fit_mask(v: usize) -> TokenMask {
    TokenMask::from_ids(v, (0..v as u32).filter(|i| i % 3 != 1))
}

/// The f64 reference restricted to `mask`: [`reference_distribution`] over the allowed logits
/// alone, 0 elsewhere.
fn masked_reference(l: &[f32], mask: &TokenMask, t: f64, k: usize, top_p: f64, min_p: f64) -> Vec<f64> {
    let allowed: Vec<usize> = (0..l.len()).filter(|&i| mask.allows(i as u32)).collect();
    let sub: Vec<f32> = allowed.iter().map(|&i| l[i]).collect();
    let mut full = vec![0.0; l.len()];
    for (&i, q) in allowed.iter().zip(reference_distribution(&sub, t, k, top_p, min_p)) {
        full[i] = q;
    }
    full
}

fn masked_fit(l: &[f32], mask: &TokenMask, p: &SamplingParams, reference: &[f64]) -> f64 {
    let mut counts = vec![0u64; l.len()];
    for step in 0..DRAWS {
        counts[sample_row_masked(l, &p.prepare(step), Some(mask)) as usize] += 1;
    }
    for (i, (&c, &q)) in counts.iter().zip(reference).enumerate() {
        assert!(q > 0.0 || c == 0, "token {i} outside the mask's kept set drawn {c} times");
    }
    let (stat, df, pv) = chi_square(&counts, reference);
    eprintln!("masked {p:?}: chi2 {stat:.1} df {df} p {pv:.4}");
    pv
}

#[test]
fn chi_square_masked() {
    let l = fit_logits();
    let mask = fit_mask(l.len());
    for (t, k, top_p, min_p, seed) in [(1.0f32, 0u32, 1.0f32, 0.0f32, 300u64), (0.8, 12, 0.9, 0.02, 301)] {
        let p = params(t, k, top_p, min_p, seed);
        let reference = masked_reference(&l, &mask, t as f64, k as usize, top_p as f64, min_p as f64);
        let host = distribution_masked(&l, &p.prepare(0), Some(&mask));
        for (i, (&a, &b)) in host.iter().zip(&reference).enumerate() {
            assert_eq!(a > 0.0, b > 0.0, "token {i}: kept sets differ");
            assert!((a - b).abs() < 1e-6, "token {i}: {a} vs {b}");
        }
        let pv = masked_fit(&l, &mask, &p, &reference);
        assert!(pv > 0.001, "p-value {pv}");
    }
    // Negative control: draws at 1.1 T against the masked reference at T = 1 must fail.
    let reference = masked_reference(&l, &mask, 1.0, 0, 1.0, 0.0);
    let pv = masked_fit(&l, &mask, &params(1.1, 0, 1.0, 0.0, 300), &reference);
    assert!(pv < 0.001, "10% temperature error under a mask not detected: p = {pv}");
}

#[test]
fn masked_greedy_and_fixed_outcomes() {
    let l = [0.5f32, 3.0, f32::NAN, 2.0, 2.0, f32::INFINITY, -1.0];
    let prep = |p: SamplingParams| p.prepare(0);
    let g = prep(SamplingParams::greedy());
    let s = prep(params(1.0, 0, 1.0, 0.0, 7));
    // The best allowed token, the lowest index on ties; an allowed +inf decides.
    assert_eq!(sample_row_masked(&l, &g, Some(&TokenMask::from_ids(7, [0, 3, 4, 6]))), 3);
    assert_eq!(sample_row_masked(&l, &g, Some(&TokenMask::from_ids(7, [0, 4, 5]))), 5);
    assert_eq!(sample_row_masked(&l, &s, Some(&TokenMask::from_ids(7, [0, 4, 5]))), 5);
    // Only a NaN and -inf allowed: the lowest allowed index, sampling or greedy.
    let dead = [f32::NEG_INFINITY, 1.0, f32::NAN, f32::NEG_INFINITY];
    let only = TokenMask::from_ids(4, [2, 3]);
    assert_eq!(sample_row_masked(&dead, &g, Some(&only)), 2);
    assert_eq!(sample_row_masked(&dead, &s, Some(&only)), 2);
    // One allowed token is drawn whatever the seed; no mask is the plain spec.
    for seed in 0..50 {
        let p = prep(params(1.0, 0, 1.0, 0.0, seed));
        assert_eq!(sample_row_masked(&l, &p, Some(&TokenMask::from_ids(7, [6]))), 6);
        assert_eq!(sample_row_masked(&l, &p, None), host::sample_row_prepared(&l, &p));
    }
}
