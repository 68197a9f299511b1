//! Logit controls (`logit_bias`, presence / frequency / repetition penalties) through the decode
//! loops on a small synthetic model: the device sampler (counts on the GPU, the pipelined loop)
//! gives the host sampler's tokens; the controls do what the spec says, checked against the host
//! twin run on logits read back step by step; a batch's rows keep their tokens whatever their
//! row or the batch size.

mod common;

use std::collections::HashMap;
use wgpu_llm::decode::batch::{BatchEngine, BatchForm, BatchOptions, Event, Request, SeqId};
use wgpu_llm::decode::{generate_controlled, DecodeOptions, Job};
use wgpu_llm::gpu::Gpu;
use wgpu_llm::loader::synthetic;
use wgpu_llm::model::arch;
use wgpu_llm::model::config::LayerAttention;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::host::argmax;
use wgpu_llm::sampling::penalty::REPEAT_ALL;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, LogitControls, SamplingBackend, SamplingParams, SeqControls};

const VOCAB: usize = 1000;

/// SmolLM2's layout shrunk (3 layers of width 64), random Q8_0 weights.
fn tiny(gpu: &Gpu, ctx: usize) -> Model {
    let mut h = synthetic::preset_hyperparams("smollm2-135m").unwrap();
    (h.vocab_size, h.hidden_size, h.intermediate_size) = (VOCAB, 64, 96);
    (h.num_attention_heads, h.num_key_value_heads, h.head_dim) = (4, 2, 16);
    h.layer_types = vec![LayerAttention::Full; 3];
    h.query_pre_attn_scalar = Some(16.0);
    h.max_position_embeddings = 256;
    let ck = synthetic::build(&arch::model_config(&h), "q8_0", "synthetic:tiny", 11).unwrap();
    Model::load(gpu, &ck, Some(ctx), &mut |_, _| {}).unwrap()
}

const PROMPT: [u32; 7] = [3, 141, 59, 265, 358, 979, 323];

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed }
}

/// Every control on at once.
fn all_on() -> LogitControls {
    LogitControls {
        logit_bias: vec![(17, 3.0), (400, -100.0), (5, 1.5)],
        presence_penalty: 0.7,
        frequency_penalty: 0.4,
        repeat_penalty: 1.8,
        repeat_last_n: 16,
    }
}

fn generate(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    params: &SamplingParams,
    controls: &LogitControls,
    max_tokens: usize,
    opts: DecodeOptions,
) -> Vec<u32> {
    let mut out = Vec::new();
    let job = Job { prompt: &PROMPT, max_tokens, params, eos: &[] };
    generate_controlled(
        model,
        sampler,
        job,
        controls,
        &mut |t| {
            out.push(t);
            Ok(true)
        },
        opts,
    )
    .unwrap();
    out
}

/// Greedy tokens with `controls`, computed outside the decode loops: each step's logits read
/// back, the host twin ([`SeqControls::apply`]) applied, the argmax taken and counted.
fn reference_greedy(model: &mut Model, controls: &LogitControls, max_tokens: usize) -> Vec<u32> {
    let mut seq = SeqControls::start(controls, VOCAB, 0, &PROMPT).unwrap();
    model.reset();
    let mut logits = model.forward(&PROMPT).unwrap();
    let mut out = Vec::new();
    for _ in 0..max_tokens {
        let mut l = model.gpu.read_f32(&logits).unwrap();
        if let Some(s) = &seq {
            s.apply(&mut l);
        }
        let t = argmax(&l);
        out.push(t);
        if let Some(s) = &mut seq {
            s.push(t);
        }
        logits = model.forward(&[t]).unwrap();
    }
    out
}

/// The tiny model (a context of 128) and a device sampler on the test GPU.
fn model_and_sampler() -> (Model, DeviceSampler) {
    let gpu = common::gpu();
    let device = DeviceSampler::new(&gpu).unwrap();
    (tiny(&gpu, 128), device)
}

#[test]
fn device_loops_match_the_host_sampler_with_controls() {
    let (mut model, mut device) = model_and_sampler();
    let n = 24;
    for controls in [all_on(), LogitControls { repeat_last_n: REPEAT_ALL, ..all_on() }] {
        for params in [SamplingParams::greedy(), sampled(5), sampled(6)] {
            let host = generate(&mut model, &mut HostSampler, &params, &controls, n, DecodeOptions::depth(0));
            // The pipelined loop (2 submissions of 4 steps in flight), one step a submission, and
            // the device sampler's readback loop.
            for opts in
                [DecodeOptions::default(), DecodeOptions { depth: 1, steps_per_submit: 1 }, DecodeOptions::depth(0)]
            {
                let got = generate(&mut model, &mut device, &params, &controls, n, opts);
                assert_eq!(got, host, "{params:?} {opts:?} {controls:?}");
            }
            let free =
                generate(&mut model, &mut device, &params, &LogitControls::default(), n, DecodeOptions::default());
            assert_ne!(free, host, "the controls change the output ({params:?})");
        }
    }
}

#[test]
fn logit_bias_of_100_forces_its_token() {
    let (mut model, mut device) = model_and_sampler();
    let controls = LogitControls { logit_bias: vec![(777, 100.0)], ..Default::default() };
    for sampler in [&mut device as &mut dyn SamplingBackend, &mut HostSampler] {
        for params in [SamplingParams::greedy(), sampled(9)] {
            let got = generate(&mut model, sampler, &params, &controls, 8, DecodeOptions::default());
            assert_eq!(got, vec![777; 8], "{} {params:?}", sampler.name());
        }
    }
    // -100 bans a token: greedy never picks what it picked without the bias.
    let free = generate(&mut model, &mut device, &SamplingParams::greedy(), &Default::default(), 1, Default::default());
    let ban = LogitControls { logit_bias: vec![(free[0], -100.0)], ..Default::default() };
    let got = generate(&mut model, &mut device, &SamplingParams::greedy(), &ban, 1, Default::default());
    assert_ne!(got[0], free[0]);
}

#[test]
fn repetition_penalty_changes_greedy_as_the_host_twin_predicts() {
    let (mut model, mut device) = model_and_sampler();
    let n = 32;
    let free = generate(&mut model, &mut device, &SamplingParams::greedy(), &Default::default(), n, Default::default());
    assert_eq!(free, reference_greedy(&mut model, &LogitControls::default(), n), "greedy without controls");
    // The random model loops; a strong penalty over the last 6 tokens breaks the loop.
    let repeats = |t: &[u32], w: usize| (0..t.len()).filter(|&i| t[i.saturating_sub(w)..i].contains(&t[i])).count();
    assert!(repeats(&free, 6) > 0, "the unpenalized output repeats within 6 tokens: {free:?}");
    let controls = LogitControls { repeat_penalty: 20.0, repeat_last_n: 6, ..Default::default() };
    let want = reference_greedy(&mut model, &controls, n);
    for opts in [DecodeOptions::default(), DecodeOptions::depth(0)] {
        assert_eq!(generate(&mut model, &mut device, &SamplingParams::greedy(), &controls, n, opts), want, "{opts:?}");
    }
    assert_eq!(
        generate(&mut model, &mut HostSampler, &SamplingParams::greedy(), &controls, n, Default::default()),
        want
    );
    assert_ne!(want, free);
    let window: Vec<u32> = PROMPT.iter().chain(&want).copied().collect();
    let generated_repeats = (PROMPT.len()..window.len()).filter(|&i| window[i - 6..i].contains(&window[i])).count();
    assert_eq!(generated_repeats, 0, "no token repeats one of the 6 before it: {want:?}");
    // Presence and frequency penalties count only generated tokens.
    let presence = LogitControls { presence_penalty: 2.0, frequency_penalty: 2.0, ..Default::default() };
    let want = reference_greedy(&mut model, &presence, n);
    assert_eq!(generate(&mut model, &mut device, &SamplingParams::greedy(), &presence, n, Default::default()), want);
    assert_ne!(want, free);
}

/// Runs `reqs` on `engine` (all submitted at once) and returns each one's tokens.
fn run_batch(engine: &mut BatchEngine, reqs: Vec<Request>) -> Vec<Vec<u32>> {
    let n = reqs.len();
    let ids: Vec<SeqId> = reqs.into_iter().map(|r| engine.submit(r).unwrap()).collect();
    let index: HashMap<SeqId, usize> = ids.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut out = vec![Vec::new(); n];
    while !engine.is_idle() {
        engine
            .step(&mut |id, e| match e {
                Event::Token(t, _) => out[index[&id]].push(t),
                Event::Failed(e) => panic!("request failed: {e}"),
                Event::Finished { .. } | Event::Started { .. } => {}
            })
            .unwrap();
    }
    out
}

fn batch_requests() -> Vec<Request> {
    (0..5u32)
        .map(|i| {
            let prompt = (0..[6, 11, 3, 20, 8][i as usize]).map(|j| (i * 97 + j * 31 + 5) % VOCAB as u32).collect();
            let params = if i % 2 == 0 { SamplingParams::greedy() } else { sampled(40 + u64::from(i)) };
            let mut r = Request::new(prompt, params, [14, 9, 18, 12, 16][i as usize], vec![]);
            r.controls = match i {
                0 => all_on(),
                1 => LogitControls::default(),
                2 => LogitControls { repeat_penalty: 5.0, repeat_last_n: 4, ..Default::default() },
                3 => LogitControls { presence_penalty: 1.5, logit_bias: vec![(12, 2.0)], ..Default::default() },
                _ => LogitControls {
                    frequency_penalty: -0.5,
                    repeat_penalty: 0.7,
                    repeat_last_n: REPEAT_ALL,
                    ..all_on()
                },
            };
            r
        })
        .collect()
}

#[test]
fn batch_rows_with_controls_keep_their_tokens() {
    let gpu = common::gpu();
    let engine = |max_batch: usize, device: bool| {
        let sampler: Box<dyn SamplingBackend + Send> =
            if device { Box::new(DeviceSampler::new(&gpu).unwrap()) } else { Box::new(HostSampler) };
        let opts = BatchOptions { form: Some(BatchForm::Batched), ..BatchOptions::new(max_batch, 16) };
        BatchEngine::new(tiny(&gpu, 96), sampler, opts, 3).unwrap()
    };
    // Each request alone, then all five together (device: steps in flight), in reverse order
    // (other rows and slots), and with the host sampler.
    let alone: Vec<Vec<u32>> =
        batch_requests().into_iter().map(|r| run_batch(&mut engine(1, true), vec![r]).remove(0)).collect();
    let together = run_batch(&mut engine(5, true), batch_requests());
    assert_eq!(together, alone, "B = 5");
    let mut reversed = run_batch(&mut engine(3, true), batch_requests().into_iter().rev().collect());
    reversed.reverse();
    assert_eq!(reversed, alone, "B = 3, rows reversed");
    assert_eq!(run_batch(&mut engine(5, false), batch_requests()), alone, "host sampler");
    // The controls act: request 0 without them differs.
    let mut free = batch_requests();
    free[0].controls = LogitControls::default();
    assert_ne!(run_batch(&mut engine(1, true), vec![free.remove(0)]).remove(0), alone[0]);
}
