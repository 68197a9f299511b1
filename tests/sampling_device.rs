//! The device sampler (`DeviceSampler`, `wgsl/sample_*.wgsl`) against the spec in
//! `src/sampling/mod.rs` and the host twin: Philox/Gumbel bits, greedy and defined outcomes,
//! determinism, chi-square fits (with a negative control), nucleus exactness, large f16-range
//! vocabularies, host/device parity, batches with mixed parameters, bad input and bind-group
//! / pipeline reuse, token masks (bit for bit against the host, fixed outcomes, a chi-square
//! fit against the restricted distribution, bad masks). Fixed seeds throughout. Draws are batched: one call of B rows holding the
//! same logits gives B independent draws (the row index is a Philox counter word).

mod common;

use common::stats::{chi_square, reference_distribution, Mix};
use common::{gpu, gpu_variants};
use std::collections::BTreeSet;
use wgpu_llm::gpu::{Gpu, Tensor};
use wgpu_llm::sampling::device::{philox_bits, DeviceSampler};
use wgpu_llm::sampling::host::{self, distribution, distribution_masked, kept_tokens, plan_row, RowPlan};
use wgpu_llm::sampling::philox::{bits_to_unit, gumbel, uniform_bits};
use wgpu_llm::sampling::{
    sample_row, sample_row_masked, HostSampler, Rows, SamplingBackend, SamplingParams, TokenMask,
};
use wgpu_llm::Error;

// ---------------------------------------------------------------------------------------
// Helpers.

fn random_logits(rng: &mut Mix, v: usize, scale: f64) -> Vec<f32> {
    (0..v).map(|_| (rng.normal() * scale) as f32).collect()
}

fn params(temperature: f32, top_k: u32, top_p: f32, min_p: f32, seed: u64) -> SamplingParams {
    SamplingParams { temperature, top_k, top_p, min_p, seed }
}

/// `rows` copies of `row`, uploaded as `[rows, V]`.
fn upload_rows(gpu: &Gpu, row: &[f32], rows: usize) -> Tensor {
    let mut all = Vec::with_capacity(row.len() * rows);
    for _ in 0..rows {
        all.extend_from_slice(row);
    }
    gpu.upload_f32("logits", &[rows, row.len()], &all).unwrap()
}

/// Device tokens for `rows` copies of `row` with the same parameters at `step`.
fn device_draws(
    s: &mut DeviceSampler,
    gpu: &Gpu,
    logits: &Tensor,
    p: SamplingParams,
    rows: usize,
    step: u32,
) -> Vec<u32> {
    s.sample(gpu, logits, &vec![p; rows], step).unwrap()
}

/// Host tokens for the same draws (row r of the batch = Philox row r).
fn host_draws(row: &[f32], p: &SamplingParams, rows: usize, step: u32) -> Vec<u32> {
    (0..rows as u32).map(|r| sample_row(row, p, step, r)).collect()
}

// ---------------------------------------------------------------------------------------
// Random numbers.

#[test]
fn philox_bits_and_gumbel_match_the_host_bit_for_bit() {
    let gpu = gpu();
    // 2^20 consecutive counters, then a few far-away ones (high index bits, other rows/steps).
    let cases: [(u64, u32, u32, u32, u32); 4] = [
        (0x0123_4567_89AB_CDEF, 7, 3, 0, 1 << 20),
        (u64::MAX, u32::MAX, u32::MAX, u32::MAX - 4095, 4096),
        (0, 0, 0, 0, 4096),
        (0xDEAD_BEEF, 123_456, 999, 262_144 - 2048, 2048),
    ];
    let mut total = 0usize;
    for (seed, step, row, first, n) in cases {
        let (bits, noise) = philox_bits(&gpu, seed, step, row, first, n).unwrap();
        for j in 0..n {
            let i = first.wrapping_add(j);
            let want = uniform_bits(seed, step, row, i);
            assert_eq!(bits[j as usize], want, "bits: seed {seed:#x} step {step} row {row} i {i}");
            let g = gumbel(bits_to_unit(want));
            assert_eq!(
                noise[j as usize].to_bits(),
                g.to_bits(),
                "gumbel: seed {seed:#x} step {step} row {row} i {i}: device {} host {g}",
                noise[j as usize]
            );
        }
        total += n as usize;
    }
    eprintln!("{total} Philox counters and Gumbel values bit-identical");
}

// ---------------------------------------------------------------------------------------
// Goodness of fit.

/// Rows per call and calls per fit: 10 steps of 10,000 rows = 100,000 draws.
const FIT_ROWS: usize = 10_000;
const FIT_STEPS: u32 = 10;

/// Fit test logits: 50 tokens, spread so that the distribution is far from uniform.
fn fit_logits() -> Vec<f32> {
    random_logits(&mut Mix(5), 50, 1.5)
}

/// 100,000 device draws with `p` (FIT_STEPS calls of FIT_ROWS rows), counted per token.
fn device_histogram(gpu: &Gpu, l: &[f32], p: SamplingParams) -> Vec<u64> {
    let mut s = DeviceSampler::new(gpu).unwrap();
    let t = upload_rows(gpu, l, FIT_ROWS);
    let mut counts = vec![0u64; l.len()];
    for step in 0..FIT_STEPS {
        for tok in device_draws(&mut s, gpu, &t, p, FIT_ROWS, step) {
            counts[tok as usize] += 1;
        }
    }
    counts
}

/// Chi-square p-value of device draws with `p` against `reference`; asserts that nothing
/// outside the reference support is ever drawn.
fn device_fit(gpu: &Gpu, l: &[f32], p: SamplingParams, reference: &[f64]) -> f64 {
    let started = std::time::Instant::now();
    let counts = device_histogram(gpu, l, p);
    for (i, (&c, &q)) in counts.iter().zip(reference).enumerate() {
        assert!(q > 0.0 || c == 0, "token {i} outside the kept set drawn {c} times ({p:?})");
    }
    let (stat, df, pv) = chi_square(&counts, reference);
    eprintln!(
        "device {p:?}: {} draws, chi2 {stat:.1} df {df} p {pv:.4} ({:.1?})",
        counts.iter().sum::<u64>(),
        started.elapsed()
    );
    pv
}

fn check_fit(t: f32, k: u32, top_p: f32, min_p: f32, seed: u64) {
    let gpu = gpu();
    let l = fit_logits();
    let p = params(t, k, top_p, min_p, seed);
    let reference = reference_distribution(&l, t as f64, k as usize, top_p as f64, min_p as f64);
    let host = distribution(&l, &p.prepare(0));
    for (i, (&a, &b)) in host.iter().zip(&reference).enumerate() {
        assert_eq!(a > 0.0, b > 0.0, "token {i}: kept sets differ");
        assert!((a - b).abs() < 1e-6, "token {i}: {a} vs {b}");
    }
    let pv = device_fit(&gpu, &l, p, &reference);
    assert!(pv > 0.001, "p-value {pv}");
}

#[test]
fn chi_square_temperature() {
    check_fit(1.0, 0, 1.0, 0.0, 100);
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
fn chi_square_rejects_wrong_temperature() {
    // Negative control: the same test on draws at 1.1 T must fail.
    let gpu = gpu();
    let l = fit_logits();
    let reference = reference_distribution(&l, 1.0, 0, 1.0, 0.0);
    let pv = device_fit(&gpu, &l, params(1.1, 0, 1.0, 0.0, 100), &reference);
    assert!(pv < 0.001, "10% temperature error not detected: p = {pv}");
}

// ---------------------------------------------------------------------------------------
// Greedy and defined outcomes.

/// Greedy reference straight from the spec: lowest index of the max, NaN as -inf, 0 if none.
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
    for gpu in gpu_variants() {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        let mut rng = Mix(2);
        // Vocabulary sizes around every workgroup configuration and chunk boundary.
        for (v, rows) in [(1usize, 8usize), (3, 8), (50, 64), (65, 16), (257, 16), (1025, 16), (4099, 8), (20_000, 4)] {
            // Few distinct values, so ties at the maximum are common; a NaN or two.
            let mut l: Vec<f32> = (0..v * rows).map(|_| (rng.u32() % 7) as f32 - 3.0).collect();
            for _ in 0..rows {
                let i = (rng.u32() as usize) % l.len();
                l[i] = f32::NAN;
            }
            let t = gpu.upload_f32("logits", &[rows, v], &l).unwrap();
            let ps: Vec<SamplingParams> =
                (0..rows).map(|r| SamplingParams { seed: r as u64, ..SamplingParams::greedy() }).collect();
            assert_eq!(s.dispatches(), 2, "a greedy batch is two dispatches");
            let got = s.sample(&gpu, &t, &ps, 3).unwrap();
            for r in 0..rows {
                let row = &l[r * v..(r + 1) * v];
                assert_eq!(got[r], reference_argmax(row), "V={v} row {r} subgroups={}", gpu.caps.subgroups);
                assert_eq!(got[r], host::argmax(row));
            }
        }
    }
}

/// Each case is one row; every row of the batch is checked against the host and the spec.
#[test]
fn nan_and_inf_get_the_defined_outcomes() {
    let nan = f32::NAN;
    let inf = f32::INFINITY;
    let g = SamplingParams::greedy();
    let p = params(0.7, 0, 0.9, 0.05, 11);
    let tiny = params(1e-37, 0, 1.0, 0.0, 5);
    let cases: Vec<(Vec<f32>, SamplingParams, Option<u32>)> = vec![
        (vec![nan, 1.0, nan], g, Some(1)),
        (vec![nan, nan, nan], g, Some(0)),
        (vec![f32::NEG_INFINITY, f32::NEG_INFINITY], g, Some(0)),
        (vec![nan, f32::NEG_INFINITY, -5.0], g, Some(2)),
        (vec![1.0, inf, inf, nan], g, Some(1)),
        (vec![nan, -inf, inf], g, Some(2)),
        (vec![f32::MAX, f32::MAX], g, Some(0)),
        (vec![-0.0, 0.0], g, Some(0)),
        // +inf scaled logit: the greedy token (the first +inf).
        (vec![1.0, inf, 3.0, inf], p, Some(1)),
        (vec![nan, 1.0, inf, 3.0, inf], p, Some(2)),
        // NaN is never drawn; one finite logit is the only candidate.
        (vec![nan, 2.0, nan], p, Some(1)),
        (vec![-inf, nan, -inf, -1.0e38], p, Some(3)),
        // ... unless l / T overflows to -inf: no candidate, token 0.
        (vec![-inf, nan, -inf, -3.0e38], p, Some(0)),
        (vec![nan, -inf, nan], p, Some(0)),
        // l / T overflowing to +inf for a tiny T: the +inf rule, the greedy token.
        (vec![1.0, 50.0, 60.0, 55.0, 60.0], tiny, Some(2)),
        // d = s - max overflowing to -inf: weight 0, never drawn, no NaN.
        (vec![-3.0e38, 3.0e38, 3.0e38], params(1.0, 0, 1.0, 0.0, 3), None),
        (vec![-3.0e38, 3.0e38, 3.0e38, nan, -inf], params(1.0, 2, 0.5, 0.5, 4), None),
    ];
    for gpu in gpu_variants() {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        for (l, p, want) in &cases {
            let rows = 64;
            let t = upload_rows(&gpu, l, rows);
            for step in [0u32, 7] {
                let got = device_draws(&mut s, &gpu, &t, *p, rows, step);
                let host = host_draws(l, p, rows, step);
                assert_eq!(got, host, "{l:?} {p:?} step {step}");
                if let Some(w) = want {
                    assert!(got.iter().all(|t| t == w), "{l:?} {p:?}: {got:?}, want {w}");
                } else {
                    assert!(got.iter().all(|&t| t == 1 || t == 2), "{l:?}: {got:?}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Determinism.

#[test]
fn same_seed_same_tokens_different_seeds_differ() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let l = random_logits(&mut Mix(3), 64, 0.5);
    let rows = 200;
    let t = upload_rows(&gpu, &l, rows);
    let run = |s: &mut DeviceSampler, seed: u64, step: u32| {
        device_draws(s, &gpu, &t, params(1.0, 40, 0.95, 0.01, seed), rows, step)
    };
    let a = run(&mut s, 42, 0);
    assert_eq!(a, run(&mut s, 42, 0), "same seed, same tokens");
    assert_eq!(a, host_draws(&l, &params(1.0, 40, 0.95, 0.01, 42), rows, 0));
    let b = run(&mut s, 43, 0);
    let c = run(&mut s, 42, 1);
    for (name, other) in [("seed", &b), ("step", &c)] {
        let same = a.iter().zip(other.iter()).filter(|(x, y)| x == y).count();
        assert!(same < 40, "another {name}: {same} of {rows} tokens equal");
    }
    // Rows are independent streams: far from a constant column.
    let distinct: BTreeSet<_> = a.iter().collect();
    assert!(distinct.len() > 20, "{distinct:?}");
}

// ---------------------------------------------------------------------------------------
// Nucleus membership and tie rules (exact ties constructed).

/// 1,000 device draws (rows) with `p`; asserts they cover exactly `want` and match the host.
fn drawn_set_is(gpu: &Gpu, s: &mut DeviceSampler, l: &[f32], p: SamplingParams, want: &[u32]) {
    let rows = 1000;
    let t = upload_rows(gpu, l, rows);
    let got = device_draws(s, gpu, &t, p, rows, 5);
    assert_eq!(got, host_draws(l, &p, rows, 5), "{l:?} {p:?}");
    let drawn: Vec<u32> = got.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
    assert_eq!(drawn, want, "{l:?} {p:?}");
    assert_eq!(kept_tokens(l, &p.prepare(5)), want, "host kept set");
}

#[test]
fn nucleus_is_exact_with_ties() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    // Top-k keeps every tie at the threshold.
    let l = [5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, 3.0];
    drawn_set_is(&gpu, &mut s, &l, params(2.0, 3, 1.0, 0.0, 7), &[0, 1, 2, 3, 4, 7]);
    drawn_set_is(&gpu, &mut s, &[1.0, 1.0, 1.0, 0.0], params(1.0, 2, 1.0, 0.0, 1), &[0, 1, 2]);
    // -0 and +0 are one value.
    drawn_set_is(&gpu, &mut s, &[1.0, -0.0, 0.0, -1.0], params(0.3, 2, 1.0, 0.0, 2), &[0, 1, 2]);
    // NaN / -inf are not candidates and do not count toward k.
    let with_nan = [f32::NAN, 2.0, f32::NEG_INFINITY, 1.0, 1.0];
    drawn_set_is(&gpu, &mut s, &with_nan, params(1.0, 2, 1.0, 0.0, 3), &[1, 3, 4]);
    // Top-p keeps whole levels: p ∝ e², e, e, 1 = .535, .197, .197, .072.
    let l = [2.0, 1.0, 1.0, 0.0];
    drawn_set_is(&gpu, &mut s, &l, params(1.0, 0, 0.5, 0.0, 4), &[0]);
    drawn_set_is(&gpu, &mut s, &l, params(1.0, 0, 0.6, 0.0, 8), &[0, 1, 2]);
    drawn_set_is(&gpu, &mut s, &l, params(1.0, 0, 0.95, 0.0, 9), &[0, 1, 2, 3]);
    // Top-p's softmax is over the top-k set.
    drawn_set_is(&gpu, &mut s, &l, params(1.0, 2, 0.55, 0.0, 10), &[0]);
    drawn_set_is(&gpu, &mut s, &l, params(1.0, 2, 0.6, 0.0, 11), &[0, 1, 2]);
    // All equal: the first level is everything.
    drawn_set_is(&gpu, &mut s, &[0.0; 4], params(1.0, 0, 0.1, 0.0, 12), &[0, 1, 2, 3]);
    // Min-p is inclusive: d = ln(min_p) exactly is kept, one ulp below is not.
    let ln_min_p = (0.1f64).ln() as f32;
    let below = f32::from_bits(ln_min_p.to_bits() + 1);
    drawn_set_is(&gpu, &mut s, &[0.0, ln_min_p, below, -1.0], params(1.0, 0, 1.0, 0.1, 13), &[0, 1, 3]);
}

/// Many tokens tied at the top-k / top-p thresholds, in bins larger than a workgroup (the radix
/// selection path), for every workgroup configuration.
#[test]
fn nucleus_is_exact_in_crowded_bins() {
    for gpu in gpu_variants() {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        for v in [3000usize, 40_000] {
            let mut rng = Mix(14 + v as u64);
            // Values on a 1/1024 grid in [0, 0.5): ~250 distinct levels, all within four bins.
            let l: Vec<f32> = (0..v).map(|_| (rng.u32() % 512) as f32 / 1024.0).collect();
            let rows = 16;
            let t = upload_rows(&gpu, &l, rows);
            for p in [
                params(1.0, 700, 1.0, 0.0, 1),
                params(1.0, 0, 0.35, 0.0, 2),
                params(0.01, 0, 0.5, 0.0, 3),
                params(1.0, 1500, 0.6, 0.0, 4),
                params(0.02, 100, 0.9, 0.2, 5),
            ] {
                let got = device_draws(&mut s, &gpu, &t, p, rows, 9);
                let host = host_draws(&l, &p, rows, 9);
                let kept = kept_tokens(&l, &p.prepare(9));
                assert!(kept.len() > 1, "{p:?}");
                for (r, (&g, &h)) in got.iter().zip(&host).enumerate() {
                    assert!(kept.binary_search(&g).is_ok(), "V={v} {p:?} row {r}: {g} not kept");
                    assert_eq!(g, h, "V={v} {p:?} row {r} subgroups={}", gpu.caps.subgroups);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Large vocabularies in the f16 range.

fn f16_range_logits(v: usize, seed: u64) -> (Vec<f32>, Vec<u32>) {
    let mut rng = Mix(seed);
    let f16 = |x: f64| half::f16::from_f64(x).to_f32();
    let mut l: Vec<f32> = (0..v).map(|_| f16((rng.unit() * 2.0 - 1.0) * 65504.0)).collect();
    // Saturated ends, as an f16 overflow clamp would produce.
    for _ in 0..300 {
        l[(rng.u32() % v as u32) as usize] = 65504.0;
    }
    for x in &mut l[1000..2000] {
        *x = -65504.0;
    }
    let saturated: Vec<u32> = (0..v as u32).filter(|&i| l[i as usize] == 65504.0).collect();
    (l, saturated)
}

#[test]
fn large_vocab_f16_range() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    for (v, seed) in [(262_144usize, 6u64), (248_320, 7)] {
        let (l, saturated) = f16_range_logits(v, seed);
        assert!(saturated.len() >= 290);
        let rows = 4;
        let t = upload_rows(&gpu, &l, rows);
        // Greedy: the first saturated token.
        let got = device_draws(&mut s, &gpu, &t, SamplingParams::greedy(), rows, 0);
        assert!(got.iter().all(|&t| t == saturated[0]), "{got:?}");
        // T = 1: uniform over the saturated tokens; never NaN, never a constant token.
        let p = params(1.0, 0, 1.0, 0.0, 12);
        let mut tokens = Vec::new();
        for step in 0..4 {
            let got = device_draws(&mut s, &gpu, &t, p, rows, step);
            assert_eq!(got, host_draws(&l, &p, rows, step), "V={v} step {step}");
            tokens.extend(got);
        }
        assert!(tokens.iter().all(|t| saturated.binary_search(t).is_ok()));
        let distinct: BTreeSet<_> = tokens.iter().collect();
        assert!(distinct.len() > 12, "V={v}: {distinct:?}");
        // A high temperature spreads over the whole range, with every filter on.
        for p in [params(4096.0, 50_000, 0.9, 0.001, 13), params(8192.0, 40, 0.95, 0.0, 15)] {
            let kept = kept_tokens(&l, &p.prepare(2));
            let got = device_draws(&mut s, &gpu, &t, p, rows, 2);
            assert_eq!(got, host_draws(&l, &p, rows, 2), "V={v} {p:?}");
            assert!(got.iter().all(|t| kept.binary_search(t).is_ok()));
            assert!(got.iter().all(|&t| l[t as usize].is_finite()));
        }
        // A tiny temperature overflows l / T to +inf for most tokens: greedy by the +inf rule.
        let got = device_draws(&mut s, &gpu, &t, params(1e-36, 0, 1.0, 0.0, 14), rows, 3);
        assert!(got.iter().all(|&t| t == saturated[0]), "{got:?}");
    }
}

// ---------------------------------------------------------------------------------------
// Host/device parity.

/// Describes why host and device disagree on one row (printed for every mismatch).
fn explain(l: &[f32], p: &SamplingParams, step: u32, row: u32, host: u32, device: u32) -> String {
    let prepared = p.prepare(step);
    let plan = plan_row(l, &prepared);
    let mut why = format!("{p:?} step {step} row {row}: host {host} device {device}; plan {plan:?}");
    if let RowPlan::Draw(th) = plan {
        // The top-p margin: the f64 mass at the chosen level and one level up, against top_p·Z.
        let s: Vec<f32> = l.iter().map(|&x| host::scale(x, prepared.inv_temperature)).collect();
        let w = |x: f32| f64::from(x - th.max).exp();
        let k1: Vec<f32> = s.iter().copied().filter(|&x| x > f32::NEG_INFINITY && x >= th.top_k).collect();
        let z: f64 = k1.iter().map(|&x| w(x)).sum();
        let m_at: f64 = k1.iter().filter(|&&x| x >= th.top_p).map(|&x| w(x)).sum();
        let m_above: f64 = k1.iter().filter(|&&x| x > th.top_p).map(|&x| w(x)).sum();
        why += &format!(
            "; top-p margins (M/Z - top_p): at t_p {:+.3e}, one level up {:+.3e}",
            m_at / z - f64::from(p.top_p),
            m_above / z - f64::from(p.top_p)
        );
    }
    why
}

#[test]
fn host_device_parity() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let mut rng = Mix(20);
    let settings = [
        params(1.0, 0, 1.0, 0.0, 1),
        params(0.7, 0, 1.0, 0.0, 2),
        params(1.5, 0, 1.0, 0.0, 3),
        params(1.0, 50, 1.0, 0.0, 4),
        params(0.8, 5, 1.0, 0.0, 5),
        params(1.0, 0, 0.9, 0.0, 6),
        params(0.6, 0, 0.5, 0.0, 7),
        params(1.2, 0, 0.99, 0.0, 8),
        params(1.0, 40, 0.95, 0.05, 9),
        params(0.9, 0, 1.0, 0.1, 10),
    ];
    // Logit rows of different shapes: LLM-like (a peak over a normal bulk), flat, ties, big V.
    let mut rows_logits: Vec<Vec<f32>> = Vec::new();
    let mut peaked = random_logits(&mut rng, 2000, 2.0);
    for i in 0..10 {
        peaked[(i * 37) % 2000] += 8.0 - i as f32 * 0.5;
    }
    rows_logits.push(peaked);
    rows_logits.push(random_logits(&mut rng, 2000, 0.3));
    rows_logits.push((0..2000).map(|_| (rng.u32() % 40) as f32 * 0.25).collect());
    rows_logits.push(random_logits(&mut rng, 20_000, 3.0));
    // Rows per (logits, setting): 10 settings × (3 × 300 + 100) = 10,000 draws.
    let reps = [300usize, 300, 300, 100];
    let (mut total, mut agree) = (0usize, 0usize);
    let mut mismatches = Vec::new();
    for (l, &rows) in rows_logits.iter().zip(&reps) {
        let t = upload_rows(&gpu, l, rows);
        for (k, p) in settings.iter().enumerate() {
            let step = k as u32;
            let got = device_draws(&mut s, &gpu, &t, *p, rows, step);
            let host = host_draws(l, p, rows, step);
            for r in 0..rows {
                total += 1;
                if got[r] == host[r] {
                    agree += 1;
                } else {
                    mismatches.push(explain(l, p, step, r as u32, host[r], got[r]));
                }
            }
        }
    }
    let rate = agree as f64 / total as f64;
    eprintln!("host/device parity: {agree} of {total} draws identical ({:.3} %)", rate * 100.0);
    for m in &mismatches {
        eprintln!("  mismatch: {m}");
    }
    assert!(total >= 10_000);
    assert!(rate >= 0.999, "parity {rate}: {mismatches:#?}");
}

// ---------------------------------------------------------------------------------------
// Batches, the encode API, bind groups and pipelines, bad input.

/// Rows of every parameter kind in turn: greedy, temperature, top-k, top-p, all filters, min-p.
fn mixed_params(rows: usize) -> Vec<SamplingParams> {
    (0..rows)
        .map(|r| match r % 6 {
            0 => SamplingParams::greedy(),
            1 => params(1.0, 0, 1.0, 0.0, r as u64),
            2 => params(0.5, 10, 1.0, 0.0, r as u64),
            3 => params(1.3, 0, 0.8, 0.0, r as u64),
            4 => params(0.9, 30, 0.9, 0.05, r as u64),
            _ => params(2.0, 0, 1.0, 0.2, r as u64),
        })
        .collect()
}

#[test]
fn batch_rows_with_different_params_match_the_host() {
    for gpu in gpu_variants() {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        let mut rng = Mix(30);
        for v in [777usize, 17_000] {
            let rows = 24;
            let l = random_logits(&mut rng, rows * v, 1.5);
            let t = gpu.upload_f32("logits", &[rows, v], &l).unwrap();
            let ps = mixed_params(rows);
            for step in [0u32, 5] {
                let got = s.sample(&gpu, &t, &ps, step).unwrap();
                assert_eq!(s.dispatches(), 3);
                for r in 0..rows {
                    let want = sample_row(&l[r * v..(r + 1) * v], &ps[r], step, r as u32);
                    assert_eq!(got[r], want, "V={v} row {r} {:?} subgroups={}", ps[r], gpu.caps.subgroups);
                }
            }
        }
    }
}

#[test]
fn encode_writes_ids_into_a_gpu_tensor() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let l = random_logits(&mut Mix(31), 3 * 500, 1.0);
    let t = gpu.upload_f32("logits", &[3, 500], &l).unwrap();
    // The next step's input ids: a u32 tensor the sampler writes in place (no readback).
    let ids = gpu.upload_u32("ids", &[8], &[99; 8]).unwrap();
    let ps = [params(1.0, 20, 0.9, 0.0, 1), SamplingParams::greedy(), params(0.5, 0, 1.0, 0.0, 3)];
    s.set_params(&gpu, &ps, 4).unwrap();
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    s.encode(&gpu, &mut enc, &t, 3, &ids).unwrap();
    gpu.queue.submit([enc.finish()]);
    let got = gpu.read_u32(&ids).unwrap();
    for r in 0..3 {
        assert_eq!(got[r], sample_row(&l[r * 500..(r + 1) * 500], &ps[r], 4, r as u32));
    }
    assert_eq!(&got[3..], &[99; 5], "only the first rows ids are written");
    // Mismatched rows are refused.
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    assert!(matches!(s.encode(&gpu, &mut enc, &t, 2, &ids), Err(Error::InvalidArgument(_))));
}

#[test]
fn new_params_never_rebuild_pipelines_or_bind_groups() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let l = random_logits(&mut Mix(32), 4 * 3000, 1.0);
    let t = gpu.upload_f32("logits", &[4, 3000], &l).unwrap();
    s.sample(&gpu, &t, &[SamplingParams::default(); 4], 0).unwrap();
    let pipelines = gpu.pipelines().len();
    let built = s.bind_groups_built();
    let mut rng = Mix(33);
    for step in 1..12 {
        let ps: Vec<SamplingParams> = (0..4)
            .map(|_| match rng.u32() % 4 {
                0 => SamplingParams::greedy(),
                1 => params(0.5 + (rng.u32() % 100) as f32 / 50.0, rng.u32() % 100, 1.0, 0.0, rng.next()),
                2 => params(1.0, 0, 0.05 + (rng.u32() % 95) as f32 / 100.0, 0.0, rng.next()),
                _ => params(1.0, rng.u32() % 50, 0.9, (rng.u32() % 50) as f32 / 100.0, rng.next()),
            })
            .collect();
        let got = s.sample(&gpu, &t, &ps, step).unwrap();
        for r in 0..4 {
            assert_eq!(got[r], sample_row(&l[r * 3000..(r + 1) * 3000], &ps[r], step, r as u32));
        }
    }
    assert_eq!(gpu.pipelines().len(), pipelines, "parameters recompiled a pipeline");
    assert_eq!(s.bind_groups_built(), built, "parameters rebuilt bind groups");
}

#[test]
fn large_grids_fold_into_two_dimensions() {
    // 70,000 rows of 16: more workgroups than one grid dimension holds (greedy: 2 dispatches).
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let (rows, v) = (70_000usize, 16usize);
    let l: Vec<f32> = (0..rows * v).map(|i| ((i * 7919) % 1009) as f32).collect();
    let t = gpu.upload_f32("logits", &[rows, v], &l).unwrap();
    let got = s.sample(&gpu, &t, &vec![SamplingParams::greedy(); rows], 0).unwrap();
    for r in 0..rows {
        assert_eq!(got[r], host::argmax(&l[r * v..(r + 1) * v]), "row {r}");
    }
}

#[test]
fn bad_input_is_an_error_before_anything_runs() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let t = gpu.upload_f32("logits", &[2, 10], &[0.5; 20]).unwrap();
    let pipelines = gpu.pipelines().len();
    let built = s.bind_groups_built();
    let ok = SamplingParams::default();
    let bad = [
        SamplingParams { temperature: -1.0, ..ok },
        SamplingParams { temperature: f32::NAN, ..ok },
        SamplingParams { temperature: 1e-40, ..ok },
        SamplingParams { top_p: 0.0, ..ok },
        SamplingParams { top_p: 1.5, ..ok },
        SamplingParams { min_p: 1.0, ..ok },
        SamplingParams { min_p: f32::NAN, ..ok },
    ];
    for b in bad {
        for ps in [[b, ok], [ok, b]] {
            assert!(matches!(s.sample(&gpu, &t, &ps, 0), Err(Error::InvalidArgument(_))), "{ps:?}");
            assert!(matches!(s.set_params(&gpu, &ps, 0), Err(Error::InvalidArgument(_))), "{ps:?}");
        }
    }
    // Shapes: rows that do not divide the logits, a non-f32 tensor, no rows.
    assert!(matches!(s.sample(&gpu, &t, &[ok; 3], 0), Err(Error::InvalidArgument(_))));
    let ints = gpu.upload_u32("ints", &[2, 10], &[0; 20]).unwrap();
    assert!(matches!(s.sample(&gpu, &ints, &[ok; 2], 0), Err(Error::InvalidArgument(_))));
    assert!(matches!(s.sample(&gpu, &t, &[], 0), Err(Error::InvalidArgument(_))));
    assert_eq!(gpu.pipelines().len(), pipelines);
    assert_eq!(s.bind_groups_built(), built, "nothing was bound");
    // The sampler still works afterwards, and agrees with the host backend.
    let ps = [params(1.0, 3, 0.9, 0.0, 1), SamplingParams::greedy()];
    let dev = s.sample(&gpu, &t, &ps, 0).unwrap();
    let host = HostSampler.sample(&gpu, &t, &ps, 0).unwrap();
    assert_eq!(dev, host);
    assert_eq!(s.name(), "device");
}

/// Rows keyed by their request (stream 0, each its own step: a batch of requests) draw what
/// each request draws alone as row 0 of a one-row call at its step, on the device and on the
/// host; and stream 0 is not row 1's stream (keys change the draw).
#[test]
fn rows_keyed_by_request_draw_as_alone() {
    use wgpu_llm::sampling::RowKey;
    let gpu = gpu();
    let mut rng = Mix(77);
    let v = 3000;
    let rows = 6;
    let logits: Vec<Vec<f32>> = (0..rows).map(|_| random_logits(&mut rng, v, 2.0)).collect();
    let all = gpu.upload_f32("logits", &[rows, v], &logits.concat()).unwrap();
    let ps: Vec<SamplingParams> =
        (0..rows as u64).map(|r| params(0.9 + 0.1 * r as f32, 50, 0.95, 0.01, 1000 + r)).collect();
    let keys: Vec<RowKey> = (0..rows as u32).map(|r| RowKey { step: 3 * r + 1, stream: 0 }).collect();
    let mut dev = DeviceSampler::new(&gpu).unwrap();
    let batch = dev.draw_rows(&gpu, &all, &ps, &keys).unwrap().ids;
    let hosted = HostSampler.draw_rows(&gpu, &all, &ps, &keys).unwrap().ids;
    let mut differs = 0;
    for r in 0..rows {
        let one = gpu.upload_f32("row", &[1, v], &logits[r]).unwrap();
        let alone = dev.sample(&gpu, &one, &ps[r..r + 1], keys[r].step).unwrap()[0];
        assert_eq!(batch[r], alone, "row {r}: the batch's draw is not the request's own");
        assert_eq!(hosted[r], sample_row(&logits[r], &ps[r], keys[r].step, 0), "row {r}: host");
        assert_eq!(batch[r], hosted[r], "row {r}: device vs host");
        differs += usize::from(sample_row(&logits[r], &ps[r], keys[r].step, 1) != alone);
    }
    assert!(differs > 0, "stream 1 drew stream 0's tokens in every row");
}

// ---------------------------------------------------------------------------------------
// Token masks (src/sampling/mask.rs).

/// A random mask over `v` tokens allowing about `density` of them (at least one).
fn random_mask(rng: &mut Mix, v: usize, density: f64) -> TokenMask {
    let mut m = TokenMask::from_ids(v, (0..v as u32).filter(|_| rng.unit() < density));
    if m.count() == 0 {
        m.allow(rng.u32() % v as u32);
    }
    m
}

/// Masked and free rows in one batch, every parameter kind, three vocabulary sizes (the three
/// workgroup configurations), every device variant: the device's tokens are the host's, bit for
/// bit, and always allowed.
#[test]
fn masked_rows_match_the_host_bit_for_bit() {
    for gpu in gpu_variants() {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        let mut rng = Mix(90);
        for v in [50usize, 777, 17_000] {
            let rows = 24;
            let mut l = random_logits(&mut rng, rows * v, 2.0);
            // A disallowed token with the row's largest logit, and a disallowed +inf and NaN:
            // the mask must hide all three.
            for r in 0..rows {
                l[r * v + 1] = 30.0;
            }
            l[2 * v + 2] = f32::INFINITY;
            l[4 * v + 3] = f32::NAN;
            let t = gpu.upload_f32("logits", &[rows, v], &l).unwrap();
            let ps = mixed_params(rows);
            // Rows 0..4 free; the rest masked: one token, a few, half, nearly all.
            let masks: Vec<Option<TokenMask>> = (0..rows)
                .map(|r| {
                    let mut m = match r {
                        0..4 => return None,
                        4..8 => TokenMask::from_ids(v, [(r as u32 * 7) % v as u32]),
                        8..14 => random_mask(&mut rng, v, 0.02),
                        14..20 => random_mask(&mut rng, v, 0.5),
                        _ => random_mask(&mut rng, v, 0.98),
                    };
                    for bad in [1, 2, 3] {
                        m = TokenMask::from_ids(v, (0..v as u32).filter(|&i| i != bad && m.allows(i)));
                    }
                    if m.count() == 0 {
                        m.allow(0);
                    }
                    Some(m)
                })
                .collect();
            let refs: Vec<Option<&TokenMask>> = masks.iter().map(Option::as_ref).collect();
            for step in [0u32, 9] {
                let keys = row_keys(rows, step);
                let input = Rows { params: &ps, keys: &keys, masks: &refs };
                let got = s.draw_masked(&gpu, &t, input).unwrap().ids;
                let host = HostSampler.draw_masked(&gpu, &t, input).unwrap().ids;
                for r in 0..rows {
                    let prepared = ps[r].prepare_stream(step, r as u32);
                    let want = sample_row_masked(&l[r * v..(r + 1) * v], &prepared, refs[r]);
                    assert_eq!(host[r], want, "host backend V={v} row {r}");
                    assert_eq!(got[r], want, "V={v} row {r} {:?} subgroups={}", ps[r], gpu.caps.subgroups);
                    if let Some(m) = refs[r] {
                        assert!(m.allows(got[r]), "V={v} row {r}: token {} is not allowed", got[r]);
                    }
                }
            }
        }
    }
}

fn row_keys(rows: usize, step: u32) -> Vec<wgpu_llm::sampling::RowKey> {
    (0..rows as u32).map(|stream| wgpu_llm::sampling::RowKey { step, stream }).collect()
}

/// The masked spec's fixed outcomes on the device: greedy is the best allowed token; an
/// allowed +inf decides; a row whose allowed logits are all -inf / NaN gives the lowest allowed
/// token (never 0 when 0 is not allowed).
#[test]
fn masked_fixed_outcomes() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let v = 300;
    let base: Vec<f32> = (0..v).map(|i| (i % 17) as f32 * 0.1).collect();
    let mut none_left = base.clone();
    for (i, x) in none_left.iter_mut().enumerate().take(200).skip(100) {
        *x = if i % 2 == 0 { f32::NEG_INFINITY } else { f32::NAN };
    }
    let mut inf = base.clone();
    inf[150] = f32::INFINITY;
    inf[10] = f32::INFINITY;
    let mask = TokenMask::from_ids(v, 120..180);
    let cases = [
        (base, SamplingParams::greedy(), 135u32), // i % 17 == 16 first at 135
        (inf, params(1.0, 0, 1.0, 0.0, 2), 150),
        (none_left.clone(), params(1.0, 0, 1.0, 0.0, 3), 120),
        (none_left, SamplingParams::greedy(), 120),
    ];
    for (l, p, want) in cases {
        let t = gpu.upload_f32("logits", &[1, v], &l).unwrap();
        let keys = row_keys(1, 0);
        let input = Rows { params: &[p], keys: &keys, masks: &[Some(&mask)] };
        let dev = s.draw_masked(&gpu, &t, input).unwrap().ids[0];
        let host = HostSampler.draw_masked(&gpu, &t, input).unwrap().ids[0];
        assert_eq!((dev, host), (want, want), "{p:?}");
    }
}

/// 100,000 masked device draws fit the model's distribution restricted to the mask and
/// renormalized (an f64 reference over the allowed tokens alone), with top-k and min-p too; a
/// draw at the wrong temperature fails the same test.
#[test]
fn chi_square_masked() {
    let gpu = gpu();
    let l = fit_logits();
    let mask = TokenMask::from_ids(l.len(), (0..l.len() as u32).filter(|i| i % 3 != 1));
    let allowed: Vec<u32> = (0..l.len() as u32).filter(|&i| mask.allows(i)).collect();
    let sub: Vec<f32> = allowed.iter().map(|&i| l[i as usize]).collect();
    let reference = |t: f64, k: usize, min_p: f64| {
        let r = reference_distribution(&sub, t, k, 1.0, min_p);
        let mut full = vec![0.0; l.len()];
        for (&i, &q) in allowed.iter().zip(&r) {
            full[i as usize] = q;
        }
        full
    };
    let fit = |p: SamplingParams, reference: &[f64]| {
        let mut s = DeviceSampler::new(&gpu).unwrap();
        let t = upload_rows(&gpu, &l, FIT_ROWS);
        let masks = vec![Some(&mask); FIT_ROWS];
        let ps = vec![p; FIT_ROWS];
        let mut counts = vec![0u64; l.len()];
        for step in 0..FIT_STEPS {
            let keys = row_keys(FIT_ROWS, step);
            for tok in s.draw_masked(&gpu, &t, Rows { params: &ps, keys: &keys, masks: &masks }).unwrap().ids {
                counts[tok as usize] += 1;
            }
        }
        for (i, (&c, &q)) in counts.iter().zip(reference).enumerate() {
            assert!(q > 0.0 || c == 0, "token {i} outside the mask's kept set drawn {c} times ({p:?})");
        }
        let (stat, df, pv) = chi_square(&counts, reference);
        eprintln!("masked {p:?}: chi2 {stat:.1} df {df} p {pv:.4}");
        pv
    };
    // (The host's fit at T = 1 is in tests/sampling_host.rs; here the filters, then the control.)
    for (t, k, min_p, seed) in [(0.8f32, 12u32, 0.02f32, 201u64)] {
        let want = reference(t as f64, k as usize, min_p as f64);
        let host = distribution_masked(&l, &params(t, k, 1.0, min_p, seed).prepare(0), Some(&mask));
        for (i, (&a, &b)) in host.iter().zip(&want).enumerate() {
            assert!((a - b).abs() < 1e-6, "token {i}: host {a} vs reference {b}");
        }
        let pv = fit(params(t, k, 1.0, min_p, seed), &want);
        assert!(pv > 0.001, "p-value {pv}");
    }
    // Negative control: draws at 1.1 T against the reference at T = 1.
    let pv = fit(params(1.1, 0, 1.0, 0.0, 200), &reference(1.0, 0, 0.0));
    assert!(pv < 0.001, "10% temperature error under a mask not detected: p = {pv}");
}

/// A mask that allows nothing, or was made for another vocabulary, is an error before anything
/// runs, on both samplers; step parameters cannot carry masks.
#[test]
fn bad_masks_are_errors() {
    let gpu = gpu();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let t = gpu.upload_f32("logits", &[2, 40], &[0.5; 80]).unwrap();
    let ps = [SamplingParams::default(); 2];
    let keys = row_keys(2, 0);
    let empty = TokenMask::none(40);
    let other = TokenMask::all(41);
    let ok = TokenMask::from_ids(40, [7]);
    for masks in [[Some(&empty), None], [None, Some(&other)], [Some(&ok), Some(&empty)]] {
        let input = Rows { params: &ps, keys: &keys, masks: &masks };
        let dev = s.draw_masked(&gpu, &t, input).unwrap_err();
        let host = HostSampler.draw_masked(&gpu, &t, input).unwrap_err();
        for e in [dev, host] {
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            common::assert_clean_message(&e.to_string());
        }
    }
    assert!(s.draw_masked(&gpu, &t, Rows { params: &ps, keys: &keys, masks: &[Some(&ok)] }).is_err(), "one mask");
    let got = s.draw_masked(&gpu, &t, Rows { params: &ps, keys: &keys, masks: &[Some(&ok), None] }).unwrap().ids;
    assert_eq!(got[0], 7);
    assert!(s.step_params(&ps, 1).is_err(), "step parameters after masks");
}
