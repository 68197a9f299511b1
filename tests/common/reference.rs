//! The engine against a reference implementation's fixture (tests/fixtures/reference/NAME.json
//! and NAME.logits.f32): last-position logits of the prompt, then the reference's greedy steps
//! teacher-forced, each engine argmax equal to the reference token unless the reference's own
//! top-1/top-2 margin is within the error bound (a near-tie), which is reported.

use serde_json::Value;
use wgpu_llm::gpu::Gpu;
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::ops::matmul::gguf::StageApart;
use wgpu_llm::sampling::host::argmax;

/// A setup: the device a model is loaded on, made from the shared one (for [`check_path_with`],
/// [`one_token_plan`]).
pub type Setup<'a> = &'a dyn Fn(&Gpu) -> Gpu;

/// No setup: the device as it is.
pub fn as_is(gpu: &Gpu) -> Gpu {
    gpu.clone()
}

/// A setup (for [`check_path_with`], [`one_token_plan`]): the layers' norms run apart and every
/// one-token projection of whole 32-element blocks reads x staged apart ([`StageApart::EVERY`]).
pub fn stage_every_row(gpu: &Gpu) -> Gpu {
    staged(gpu, StageApart::EVERY)
}

/// `gpu` with its tuning's knobs set so that the layers' norms run apart and the one-token
/// projections `rule` takes read x staged apart (TUNING.md: `norms_apart`, `xg_k`, `xg_free_k`,
/// `xg_free_n`).
pub fn staged(gpu: &Gpu, rule: StageApart) -> Gpu {
    let mut t = gpu.tuning().clone();
    t.knobs.norms_apart = true;
    (t.knobs.xg_off, t.knobs.xg_k, t.knobs.xg_free_k, t.knobs.xg_free_n) =
        (false, Some(rule.k), Some(rule.free_k), Some(rule.free_n));
    gpu.with_tuning(t)
}

/// Whether a kernel's variant (its flags joined by '+', as `Model::plan_kernels` gives them) has
/// `flag`.
pub fn has_flag(variant: &str, flag: &str) -> bool {
    variant.split('+').any(|f| f == flag)
}

/// The kernels (name, variant) of the one-token plan of the model at `path` loaded on the device
/// `setup` makes (64 positions), a two-token prompt and one decode step run.
pub fn one_token_plan(path: &std::path::Path, setup: Setup) -> Vec<(String, String)> {
    one_token_plan_on(&super::gpu(), path, setup)
}

/// [`one_token_plan`] from `gpu` instead of the shared device.
pub fn one_token_plan_on(gpu: &wgpu_llm::gpu::Gpu, path: &std::path::Path, setup: Setup) -> Vec<(String, String)> {
    let gpu = setup(gpu);
    let ck = Checkpoint::open(path).unwrap();
    let mut model = Model::load(&gpu, &ck, Some(64), &mut |_, _| {}).unwrap();
    model.forward(&[2, 3]).unwrap();
    model.forward(&[4]).unwrap();
    model.plan_kernels(1).expect("the one-token plan")
}

/// How one fixture is checked.
#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// Bound on |engine logit - reference logit|.
    pub max_abs: f32,
    /// How many of the reference's greedy steps to teacher-force.
    pub steps: usize,
    /// Prefill in chunks of this many tokens (None: the engine's default).
    pub prefill_chunk: Option<usize>,
}

fn top5(v: &[f32]) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    idx.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    idx.truncate(5);
    idx
}

/// `steps`: how many of the reference's 16 greedy steps to teacher-force (long prompts check
/// prefill and the window; their decode steps cost lavapipe minutes and add nothing new).
/// Checks the engine on `model_path` against fixture `fixture`; returns the max |logit error|.
pub fn check_path(model_path: &std::path::Path, fixture: &str, c: Check) -> f32 {
    check_path_with(model_path, fixture, c, &as_is)
}

/// [`check_path`] on the device `setup` makes from the shared one.
pub fn check_path_with(model_path: &std::path::Path, fixture: &str, c: Check, setup: Setup) -> f32 {
    check_path_in(model_path, &super::fixture_dir().join("reference"), fixture, c, setup)
}

/// [`check_path_with`] against the fixture `fixture` in `dir` (e.g. one a test made itself).
pub fn check_path_in(
    model_path: &std::path::Path,
    dir: &std::path::Path,
    fixture: &str,
    c: Check,
    setup: Setup,
) -> f32 {
    check_path_on(&super::gpu(), model_path, dir, fixture, c, setup)
}

/// [`check_path_in`] from `gpu` (e.g. a device emulating another family) instead of the shared device.
pub fn check_path_on(
    gpu: &wgpu_llm::gpu::Gpu,
    model_path: &std::path::Path,
    dir: &std::path::Path,
    fixture: &str,
    c: Check,
    setup: Setup,
) -> f32 {
    let (steps, max_abs) = (c.steps, c.max_abs);
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{fixture}.json"))).unwrap()).unwrap();
    let ids: Vec<u32> = meta["prompt_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let greedy: Vec<u32> =
        meta["greedy_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let step_vals: Vec<Vec<f64>> = meta["step_logits_top5_values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect())
        .collect();
    let bytes = std::fs::read(dir.join(format!("{fixture}.logits.f32"))).unwrap();
    let want: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);

    let gpu = setup(gpu);
    let ck = Checkpoint::open(model_path).unwrap();
    let mut model = Model::load(&gpu, &ck, Some(ids.len() + 32), &mut |_, _| {}).unwrap();
    if let Some(chunk) = c.prefill_chunk {
        model.prefill_chunk = chunk;
    }
    let logits = model.forward(&ids).unwrap();
    let got = gpu.read_f32(&logits).unwrap();
    assert_eq!(got.len(), want.len());
    let (mut max_err, mut at) = (0f32, 0);
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        let e = (a - b).abs();
        assert!(a.is_finite(), "{fixture}: logit {i} is {a}");
        if e > max_err {
            (max_err, at) = (e, i);
        }
    }
    let (g5, w5) = (top5(&got), top5(&want));
    eprintln!(
        "{fixture}: {} prompt tokens, max |logit error| {max_err:.4} at {at}, top5 engine {g5:?} reference {w5:?}",
        ids.len()
    );
    assert!(max_err < max_abs, "{fixture}: max abs logit error {max_err} at token {at} exceeds {max_abs}");
    // Top-5 agree as sets, except entries whose reference value is within the error bound of
    // the 5th (they may trade places with the 6th).
    let fifth = want[w5[4] as usize];
    for t in &w5 {
        let v = want[*t as usize];
        assert!(
            g5.contains(t) || v - fifth < 2.0 * max_abs,
            "{fixture}: reference top-5 token {t} ({v}) missing from engine top-5 {g5:?}"
        );
    }

    // Greedy, teacher-forced with the reference tokens; where the fixture has every step's logits
    // (`step_logits_file`: row i is what greedy token i is the argmax of), each step's are held
    // to the same bound as the prompt's.
    let all_steps: Option<Vec<f32>> =
        meta["step_logits_file"].as_str().map(|f| bytemuck::pod_collect_to_vec(&std::fs::read(dir.join(f)).unwrap()));
    let mut flips = Vec::new();
    let mut step_err = 0f32;
    let mut step_logits = got;
    for (i, &tok) in greedy.iter().take(steps).enumerate() {
        if let Some(rows) = &all_steps {
            let want = &rows[i * step_logits.len()..][..step_logits.len()];
            let (e, at) = step_logits
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .enumerate()
                .fold((0f32, 0), |m, (j, e)| if e > m.0 { (e, j) } else { m });
            assert!(e < max_abs, "{fixture}: greedy step {i}: max |logit error| {e} at {at} exceeds {max_abs}");
            step_err = step_err.max(e);
        }
        let mine = argmax(&step_logits);
        if mine != tok {
            let margin = step_vals[i][0] - step_vals[i][1];
            assert!(
                margin < 2.0 * max_abs as f64,
                "{fixture}: greedy step {i}: engine picks {mine}, reference {tok} with margin {margin:.3}"
            );
            flips.push((i, mine, tok, margin));
        }
        let l = model.forward(&[tok]).unwrap();
        step_logits = gpu.read_f32(&l).unwrap();
    }
    eprintln!(
        "{fixture}: {steps} greedy steps agree{}{}",
        if flips.is_empty() { String::new() } else { format!(" except near-ties {flips:?}") },
        if all_steps.is_some() { format!("; every step's logits within {step_err:.4}") } else { String::new() }
    );
    max_err
}
