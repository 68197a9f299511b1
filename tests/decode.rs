//! The decode loops: the GPU-resident pipelined loop gives exactly the step-by-step tokens
//! (greedy and seeded sampling, any depth, either sampler), stops where it does with its
//! overshoot rolled back, rebuilds nothing when sampling parameters change, and turns
//! non-finite logits into an error instead of tokens.
//!
//! The model is a small synthetic one (random Q8_0 weights, llama layout) so lavapipe runs many
//! steps quickly; the loops never look at the architecture, except that a recurrent model
//! (Qwen3.5's Gated DeltaNet layers) rolls back only a few passes: the pipelined and rollback
//! tests run on a small synthetic Qwen3.5-MoE too.

mod common;

use wgpu_llm::decode::{generate_with, DecodeOptions, Stats, StopReason};
use wgpu_llm::gpu::Gpu;
use wgpu_llm::loader::synthetic;
use wgpu_llm::model::arch;
use wgpu_llm::model::config::{LayerAttention, Mixer, ModelConfig};
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, SamplingBackend, SamplingParams};

/// SmolLM2's layout (llama, tied embeddings), shrunk: 3 layers of width 64, 4 q / 2 kv heads.
fn tiny_config() -> ModelConfig {
    let mut h = synthetic::preset_hyperparams("smollm2-135m").unwrap();
    (h.vocab_size, h.hidden_size, h.intermediate_size) = (1000, 64, 96);
    (h.num_attention_heads, h.num_key_value_heads, h.head_dim) = (4, 2, 16);
    h.layer_types = vec![LayerAttention::Full; 3];
    h.query_pre_attn_scalar = Some(16.0);
    h.max_position_embeddings = 256;
    arch::model_config(&h)
}

fn model_of(gpu: &Gpu, config: &ModelConfig, ctx: usize) -> Model {
    let ck = synthetic::build(config, "q8_0", "synthetic:tiny", 11).unwrap();
    Model::load(gpu, &ck, Some(ctx), &mut |_, _| {}).unwrap()
}

fn tiny(gpu: &Gpu) -> Model {
    model_of(gpu, &tiny_config(), 128)
}

/// Qwen3.5-MoE's layout (Gated DeltaNet and gated attention layers, 8 experts top 2 with a
/// shared expert), shrunk.
fn tiny_recurrent(gpu: &Gpu) -> Model {
    let mut q = wgpu_llm::model::qwen3_5_moe::Qwen35MoeConfig::qwen3_5_35b_a3b();
    (q.vocab_size, q.hidden_size, q.max_position_embeddings) = (1000, 64, 256);
    (q.num_attention_heads, q.num_key_value_heads, q.head_dim) = (4, 2, 32);
    q.full_attention = vec![false, false, true];
    (q.linear_num_key_heads, q.linear_num_value_heads, q.linear_key_head_dim, q.linear_value_head_dim) = (2, 4, 16, 16);
    (q.num_experts, q.num_experts_per_tok, q.moe_intermediate_size, q.shared_expert_intermediate_size) = (8, 2, 32, 64);
    model_of(gpu, &q.model_config(), 128)
}

const PROMPT: [u32; 7] = [3, 141, 59, 265, 358, 979, 323];

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed }
}

/// Runs one generation and returns its tokens and stats; `opts`: a depth (one step a
/// submission) or [`DecodeOptions`].
fn run(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    opts: impl Into<Opts>,
) -> (Vec<u32>, Stats) {
    let Opts(opts) = opts.into();
    let mut tokens = Vec::new();
    let stats = generate_with(
        model,
        sampler,
        prompt,
        max_tokens,
        params,
        eos,
        &mut |t| {
            tokens.push(t);
            Ok(true)
        },
        opts,
    )
    .unwrap();
    (tokens, stats)
}

/// [`run`]'s loop options: a depth alone, or (depth, steps a submission).
struct Opts(DecodeOptions);

impl From<usize> for Opts {
    fn from(depth: usize) -> Self {
        Opts(DecodeOptions { depth, steps_per_submit: 1 })
    }
}

impl From<(usize, usize)> for Opts {
    fn from((depth, steps_per_submit): (usize, usize)) -> Self {
        Opts(DecodeOptions { depth, steps_per_submit })
    }
}

#[test]
fn pipelined_loop_gives_the_step_by_step_tokens() {
    pipelined_equals_step_by_step(tiny);
}

#[test]
fn pipelined_loop_gives_the_step_by_step_tokens_recurrent() {
    pipelined_equals_step_by_step(tiny_recurrent);
}

fn pipelined_equals_step_by_step(build: fn(&Gpu) -> Model) {
    let gpu = common::gpu();
    let mut model = build(&gpu);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    for params in [SamplingParams::greedy(), sampled(7), sampled(8)] {
        let (reference, s) = run(&mut model, &mut HostSampler, &PROMPT, 24, &params, &[], 0);
        assert_eq!(reference.len(), 24);
        assert_eq!((s.depth, s.stop), (0, StopReason::MaxTokens));
        // A sampled run must not be one repeated token, or the comparison proves little.
        if !params.is_greedy() {
            let distinct = reference.iter().collect::<std::collections::HashSet<_>>().len();
            assert!(distinct > 4, "{params:?}: only {distinct} distinct tokens in {reference:?}");
        }
        // Several steps a submission too: 23 decode steps are not a multiple of 3 or 4, so the
        // last submission holds fewer.
        for (depth, steps) in [(0, 1), (1, 1), (2, 1), (4, 1), (1, 3), (2, 4), (3, 2)] {
            let (tokens, s) = run(&mut model, &mut device, &PROMPT, 24, &params, &[], (depth, steps));
            assert_eq!(tokens, reference, "{params:?}, depth {depth}, {steps} steps a submission");
            assert_eq!((s.stop, s.discarded_steps), (StopReason::MaxTokens, 0));
            assert_eq!(s.steps.len(), 23, "one timing per decode step");
            assert_eq!(model.pos, PROMPT.len() + 23, "depth {depth}: every token but the last was fed");
            // A recurrent model keeps no more steps in flight than its state ring rolls back.
            let ring = model.max_rollback().saturating_add(1);
            if depth == 0 {
                assert_eq!(s.depth, 0);
            } else if depth * steps <= ring {
                // One submission and one blocking wait per `steps` decode steps.
                let per_step = 23usize.div_ceil(steps) as f64 / 23.0;
                assert_eq!((s.depth, s.steps_per_submit), (depth, steps));
                assert_eq!((s.submits_per_step, s.waits_per_step), (per_step, per_step));
            } else {
                assert!(s.depth >= 1 && s.depth * s.steps_per_submit <= ring, "{} x {}", s.depth, s.steps_per_submit);
            }
        }
    }
    // Different seeds draw different tokens (the seed reaches the pipelined sampler).
    let a = run(&mut model, &mut device, &PROMPT, 24, &sampled(7), &[], 3).0;
    let b = run(&mut model, &mut device, &PROMPT, 24, &sampled(8), &[], 3).0;
    assert_ne!(a, b);
}

#[test]
fn eos_overshoot_is_rolled_back() {
    eos_rollback(tiny);
}

/// The recurrent states roll back with the KV cache: the state ring keeps the states of the steps
/// in flight.
#[test]
fn eos_overshoot_is_rolled_back_recurrent() {
    eos_rollback(tiny_recurrent);
}

fn eos_rollback(build: fn(&Gpu) -> Model) {
    let gpu = common::gpu();
    let mut model = build(&gpu);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    let params = sampled(21);
    let (free, _) = run(&mut model, &mut device, &PROMPT, 20, &params, &[], 0);
    // An eos that first appears a few tokens in.
    let (cut, eos) =
        free.iter().enumerate().skip(2).find(|(i, t)| !free[..*i].contains(t)).map(|(i, &t)| (i, t)).unwrap();
    let want = &free[..=cut];
    // Four submissions of one step, or two of three steps, in flight.
    for (depth, steps) in [(4, 1), (2, 3)] {
        eos_rollback_with(build, &gpu, &mut device, &params, want, eos, depth, steps);
    }
}

#[allow(clippy::too_many_arguments)]
fn eos_rollback_with(
    build: fn(&Gpu) -> Model,
    gpu: &Gpu,
    device: &mut DeviceSampler,
    params: &SamplingParams,
    want: &[u32],
    eos: u32,
    depth: usize,
    steps: usize,
) {
    let mut model = build(gpu);
    let (tokens, s) = run(&mut model, device, &PROMPT, 20, params, &[eos], (depth, steps));
    assert_eq!(tokens, want);
    assert_eq!(s.stop, StopReason::Eos);
    // A recurrent model keeps fewer steps in flight (its state ring): what the loop ran.
    let (depth, steps) = (s.depth, s.steps_per_submit);
    assert!(depth >= 1 && steps >= 1);
    if steps == 1 {
        assert_eq!(s.discarded_steps, (depth - 1).min(20 - tokens.len()), "steps in flight past the eos");
    } else {
        // Submissions of `steps` go out when a whole one fits: between depth · steps - steps and
        // depth · steps - 1 steps are in flight past the one read.
        let (lo, hi) = (((depth - 1) * steps).min(20 - tokens.len()), depth * steps - 1);
        assert!((lo..=hi).contains(&s.discarded_steps), "{} steps discarded, not in {lo}..={hi}", s.discarded_steps);
    }
    assert_eq!(model.pos, PROMPT.len() + tokens.len() - 1, "the overshoot's positions are rolled back");

    // Continuing from there sees no trace of the discarded steps: the logits of one more token
    // equal those of a model that ran the step-by-step loop to the same eos.
    let next = [17u32];
    let after_pipelined = gpu.read_f32(&model.forward(&next).unwrap()).unwrap();
    let mut fresh = build(gpu);
    let (tokens0, s0) = run(&mut fresh, device, &PROMPT, 20, params, &[eos], 0);
    assert_eq!((tokens0.as_slice(), s0.discarded_steps), (want, 0));
    let after_step_by_step = gpu.read_f32(&fresh.forward(&next).unwrap()).unwrap();
    assert!(after_pipelined.iter().all(|l| l.is_finite()));
    assert_eq!(after_pipelined, after_step_by_step);

    // A second prompt on the same model gives what it gives on a fresh one.
    let other = [5u32, 6, 7, 8, 9];
    let (second, _) = run(&mut model, device, &other, 12, params, &[], (depth, steps));
    let (fresh_second, _) = run(&mut build(gpu), device, &other, 12, params, &[], 0);
    assert_eq!(second, fresh_second);
}

#[test]
fn caller_stop_and_a_full_context_match_the_step_by_step_loop() {
    let gpu = common::gpu();
    let ctx = PROMPT.len() + 6;
    let mut model = model_of(&gpu, &tiny_config(), ctx);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    let params = sampled(3);
    let (reference, s0) = run(&mut model, &mut device, &PROMPT, 100, &params, &[], 0);
    assert_eq!((s0.stop, reference.len()), (StopReason::ContextFull, 7), "one token per free position, plus one");
    for (depth, steps) in [(1, 1), (3, 1), (8, 1), (2, 3)] {
        let (tokens, s) = run(&mut model, &mut device, &PROMPT, 100, &params, &[], (depth, steps));
        assert_eq!((tokens.as_slice(), s.stop, s.discarded_steps), (reference.as_slice(), StopReason::ContextFull, 0));
        assert_eq!(model.pos, ctx);
        // The caller stops after the third token.
        let mut seen = Vec::new();
        let s = generate_with(
            &mut model,
            &mut device,
            &PROMPT,
            100,
            &params,
            &[],
            &mut |t| {
                seen.push(t);
                Ok(seen.len() < 3)
            },
            DecodeOptions { depth, steps_per_submit: steps },
        )
        .unwrap();
        assert_eq!((seen.as_slice(), s.stop), (&reference[..3], StopReason::Caller));
        assert_eq!(model.pos, PROMPT.len() + 2);
    }
}

#[test]
fn new_sampling_parameters_rebuild_nothing() {
    // A device of its own: the pipeline cache it counts is per device, and the tests beside it
    // compile pipelines on the shared one at the same time.
    let gpu = Gpu::new(&wgpu_llm::gpu::GpuOptions::default()).unwrap();
    let mut model = tiny(&gpu);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    // Warm up greedy and sampling once (pipelines for both paths, plans for both lengths).
    run(&mut model, &mut device, &PROMPT, 4, &SamplingParams::greedy(), &[], 3);
    run(&mut model, &mut device, &PROMPT, 4, &sampled(1), &[], 3);
    let pipelines = gpu.pipelines().len();
    let bind_groups = device.bind_groups_built();
    for params in [
        SamplingParams { temperature: 1.3, top_k: 0, top_p: 0.5, min_p: 0.0, seed: 99 },
        SamplingParams { temperature: 0.2, top_k: 5, top_p: 1.0, min_p: 0.2, seed: 5 },
        SamplingParams::greedy(),
    ] {
        run(&mut model, &mut device, &PROMPT, 6, &params, &[], 3);
    }
    assert_eq!(gpu.pipelines().len(), pipelines, "a pipeline was compiled for new parameters");
    assert_eq!(device.bind_groups_built(), bind_groups, "bind groups were rebuilt for new parameters");
}

/// A caller's error at a later token ends the run with that error, with steps in flight past it
/// (a recurrent model too, more of them than its state ring rolls back when the error is at the
/// first step of a submission): the model is left usable, the next run as on a fresh model.
#[test]
fn a_callers_error_mid_run_leaves_the_model_usable() {
    for build in [tiny as fn(&Gpu) -> Model, tiny_recurrent] {
        let gpu = common::gpu();
        let mut model = build(&gpu);
        let mut device = DeviceSampler::new(&gpu).unwrap();
        let params = sampled(5);
        for (at, (depth, steps)) in [(1, (2, 2)), (2, (2, 2)), (3, (3, 1)), (5, (2, 4))] {
            let mut seen = 0;
            let err = generate_with(
                &mut model,
                &mut device,
                &PROMPT,
                20,
                &params,
                &[],
                &mut |_| {
                    seen += 1;
                    if seen > at {
                        Err(wgpu_llm::Error::InvalidArgument("the caller gave up".into()))
                    } else {
                        Ok(true)
                    }
                },
                DecodeOptions { depth, steps_per_submit: steps },
            )
            .unwrap_err();
            assert!(err.to_string().contains("the caller gave up"), "{err}");
            assert_eq!(seen, at + 1);
            let (after, _) = run(&mut model, &mut device, &PROMPT, 8, &params, &[], (depth, steps));
            let (fresh, _) = run(&mut build(&gpu), &mut device, &PROMPT, 8, &params, &[], 0);
            assert_eq!(after, fresh, "error at token {at}, {depth} x {steps}");
        }
    }
}

#[test]
fn non_finite_logits_are_an_error_not_tokens() {
    let gpu = common::gpu();
    // Scores of q·k times 3e38 overflow to infinities and the softmax turns them into NaN.
    let mut config = tiny_config();
    for layer in &mut config.layers {
        if let Mixer::Attention(a) = &mut layer.mixer {
            a.scale = 3e38;
        }
    }
    let mut model = model_of(&gpu, &config, 64);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    for (sampler, depth) in [(&mut device as &mut dyn SamplingBackend, 3), (&mut HostSampler, 0)] {
        let mut delivered = 0;
        let err = generate_with(
            &mut model,
            sampler,
            &PROMPT,
            8,
            &SamplingParams::greedy(),
            &[],
            &mut |_| {
                delivered += 1;
                Ok(true)
            },
            DecodeOptions::depth(depth),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("not finite") && err.contains("prompt's last position"), "{err}");
        assert_eq!(delivered, 0, "no token comes from non-finite logits");
    }
    let step = wgpu_llm::decode::non_finite_error(5, 40).to_string();
    assert!(step.contains("decode step 5") && step.contains("position 40"), "{step}");
}

/// Prompts of many distinct lengths keep at most `MAX_PLANS` plans and one set of activation
/// buffers (sized for a prefill chunk), and a length whose plan was evicted and recorded again
/// gives the same logits bit for bit as the first time (on the shared buffers).
#[test]
fn plan_cache_is_bounded_across_prompt_lengths() {
    use wgpu_llm::model::forward::MAX_PLANS;
    let gpu = common::gpu();
    let mut model = tiny(&gpu);
    let prompt: Vec<u32> = (0..40u32).map(|i| (i * 37 + 11) % 1000).collect();
    let logits_of = |model: &mut Model, n: usize| {
        model.reset();
        let l = model.forward(&prompt[..n]).unwrap();
        gpu.read_f32(&l).unwrap()
    };
    let first = logits_of(&mut model, 5);
    assert!(first.iter().all(|x| x.is_finite()));
    let (_, bytes) = model.plan_cache();
    assert!(bytes > 0);
    for n in 6..=30 {
        logits_of(&mut model, n);
        let (plans, b) = model.plan_cache();
        assert!(plans <= MAX_PLANS, "{plans} plans after {n} lengths");
        assert_eq!(b, bytes, "activation bytes grew at length {n}");
    }
    // Length 5 was evicted long ago: recorded again, same numbers.
    assert_eq!(logits_of(&mut model, 5), first);
    // A chunk longer than any before grows the shared buffers once.
    model.prefill_chunk = 1024;
    let prompt_long: Vec<u32> = (0..100u32).collect();
    model.reset();
    let l = model.forward(&prompt_long).unwrap();
    assert_eq!(model.plan_cache().1, bytes, "100 tokens fit the 512-row buffers");
    // (Read back: the pass has finished before the test does, and its logits are finite.)
    assert!(gpu.read_f32(&l).unwrap().iter().all(|x| x.is_finite()), "100-token chunk: non-finite logits");
}

/// A context whose KV cache one layer cannot bind is refused before anything is uploaded, with
/// the largest `--ctx` that fits (lavapipe and most GPUs: 128 MiB; the tiny model's cache takes
/// 2 kv heads x 16 dims x 2 bytes = 64 bytes a position).
#[test]
fn context_beyond_the_binding_limit_names_the_largest_ctx() {
    let gpu = common::gpu();
    let mut c = tiny_config();
    c.max_position_embeddings = 1 << 30;
    let max_bind = gpu.limits.max_storage_buffer_binding_size;
    let fits = (max_bind / 64) as usize;
    let ck = wgpu_llm::loader::synthetic::build(&c, "q8_0", "synthetic:tiny", 11).unwrap();
    let err = match Model::load(&gpu, &ck, Some(fits + 1), &mut |_, _| {}) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a context of {} tokens was accepted", fits + 1),
    };
    common::assert_clean_message(&err);
    assert!(err.contains(&format!("lower --ctx to at most {fits}")), "{err}");
}
