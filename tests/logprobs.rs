//! Logprobs (`Request::logprobs`, `wgsl/sample_logprobs.wgsl`) through the batch engine and the
//! server: each token's logprobs equal the CPU twin's computed from the very logits the engine
//! sampled from (read back on the host by a recording sampler), a greedy token is its own top-1,
//! a row's logprobs are the same bits whatever the batch and its row (and read back through the
//! pipelined ring or not); the server's answers have OpenAI's shapes, streamed or not, and bad
//! values are 400s naming their field.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wgpu_llm::decode::batch::{BatchEngine, BatchOptions, Event, Request, SeqId};
use wgpu_llm::gpu::{Gpu, Tensor};
use wgpu_llm::loader::synthetic;
use wgpu_llm::model::config::LayerAttention;
use wgpu_llm::model::{arch, Model};
use wgpu_llm::sampling::logprobs::cpu;
use wgpu_llm::sampling::{DeviceSampler, Draw, HostSampler, Rows, SamplingBackend, SamplingParams, TokenLogprobs};

/// SmolLM2's layout with 2 layers of width 64 and an odd vocabulary.
fn small_model(gpu: &Gpu) -> Model {
    let mut h = synthetic::preset_hyperparams("smollm2-135m").unwrap();
    h.vocab_size = 1003;
    (h.hidden_size, h.intermediate_size, h.head_dim) = (64, 96, 16);
    (h.num_attention_heads, h.num_key_value_heads) = (4, 2);
    h.layer_types = vec![LayerAttention::Full; 2];
    h.max_position_embeddings = 128;
    let ck = synthetic::build(&arch::model_config(&h), "q8_0", "synthetic:logprobs", 11).unwrap();
    Model::load(gpu, &ck, Some(64), &mut |_, _| {}).unwrap()
}

/// Rows a sampler drew: each row's logits (read back) and token.
type Drawn = Arc<Mutex<Vec<(Vec<f32>, u32)>>>;

/// A sampler that reads back the logits it samples from.
struct Recording {
    inner: Box<dyn SamplingBackend + Send>,
    drawn: Drawn,
}

impl SamplingBackend for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn draw_masked(&mut self, gpu: &Gpu, logits: &Tensor, rows: Rows<'_>) -> wgpu_llm::Result<Draw> {
        let d = self.inner.draw_masked(gpu, logits, rows)?;
        let all = gpu.read_f32(logits)?;
        let vocab = all.len() / d.ids.len();
        let mut drawn = self.drawn.lock().unwrap();
        drawn.extend(all.chunks(vocab).map(<[f32]>::to_vec).zip(d.ids.iter().copied()));
        Ok(d)
    }
}

fn request(i: u32, logprobs: Option<u32>, greedy: bool) -> Request {
    let prompt = (0..3 + i * 5).map(|j| (i * 97 + j * 13 + 5) % 1003).collect();
    let params = match greedy {
        true => SamplingParams::greedy(),
        false => SamplingParams { temperature: 0.8, top_k: 50, top_p: 0.9, min_p: 0.0, seed: 40 + u64::from(i) },
    };
    Request { logprobs, ..Request::new(prompt, params, 6 + i as usize, vec![]) }
}

/// Every token event of a run, in order: (request index, token, logprobs).
type Tokens = Vec<(usize, u32, Option<TokenLogprobs>)>;

/// Submits `reqs` (request `i` before step `joins[i]`) and steps until idle.
fn run(engine: &mut BatchEngine, reqs: Vec<Request>, joins: &[usize]) -> Tokens {
    let mut reqs: Vec<Option<Request>> = reqs.into_iter().map(Some).collect();
    let mut index: HashMap<SeqId, usize> = HashMap::new();
    let mut out = Tokens::new();
    for step in 0..10_000 {
        for (i, r) in reqs.iter_mut().enumerate().filter(|(i, _)| joins[*i] == step) {
            index.insert(engine.submit(r.take().unwrap()).unwrap(), i);
        }
        if engine.is_idle() && joins.iter().all(|&j| j <= step) {
            return out;
        }
        engine
            .step(&mut |id, e| match e {
                Event::Token(t, lp) => out.push((index[&id], t, lp)),
                Event::Failed(e) => panic!("request {} failed: {e}", index[&id]),
                Event::Finished { .. } => {}
            })
            .unwrap();
    }
    panic!("the engine never went idle")
}

/// Exact bits of one token's logprobs.
fn bits(t: &TokenLogprobs) -> (u32, Vec<(u32, u32)>) {
    (t.logprob.to_bits(), t.top.iter().map(|&(i, l)| (i, l.to_bits())).collect())
}

#[test]
fn engine_logprobs_match_the_twin_on_the_sampled_logits() {
    let gpu = common::gpu();
    let asks = [Some(5), None, Some(20), Some(0)];
    for device in [false, true] {
        let drawn = Drawn::default();
        let inner: Box<dyn SamplingBackend + Send> = match device {
            true => Box::new(DeviceSampler::new(&gpu).unwrap()),
            false => Box::new(HostSampler),
        };
        let sampler = Box::new(Recording { inner, drawn: drawn.clone() });
        let mut engine = BatchEngine::new(small_model(&gpu), sampler, BatchOptions::new(4, 8), 2).unwrap();
        let reqs = (0..4).map(|i| request(i, asks[i as usize], i % 2 == 0)).collect();
        let tokens = run(&mut engine, reqs, &[0, 0, 1, 3]);
        let drawn = drawn.lock().unwrap();
        // Every drawn row was delivered, in order (no request stops early).
        assert_eq!(tokens.len(), drawn.len(), "device {device}");
        let mut checked = 0;
        for ((i, t, lp), (row, id)) in tokens.iter().zip(drawn.iter()) {
            assert_eq!(t, id, "device {device}: request {i}'s token is the one drawn");
            let Some(n) = asks[*i] else {
                assert!(lp.is_none(), "request {i} did not ask");
                continue;
            };
            let got = lp.as_ref().expect("asked");
            let want = cpu::logprobs(row, *t, n as usize);
            let ids = |t: &TokenLogprobs| t.top.iter().map(|p| p.0).collect::<Vec<_>>();
            assert_eq!(ids(got), ids(&want), "device {device}, request {i}: top ids");
            let pairs = std::iter::once((got.logprob, want.logprob))
                .chain(got.top.iter().zip(&want.top).map(|(a, b)| (a.1, b.1)));
            for (a, b) in pairs {
                assert!((a - b).abs() <= cpu::tolerance(row, b), "device {device}, request {i}: {a} vs {b}");
            }
            if *i % 2 == 0 && n > 0 {
                // Greedy: the token is the top-1, with the same bits.
                assert_eq!((got.top[0].0, got.top[0].1.to_bits()), (*t, got.logprob.to_bits()), "request {i}");
            }
            checked += 1;
        }
        assert!(checked >= 20, "device {device}: {checked} tokens checked");
    }
}

#[test]
fn logprobs_do_not_depend_on_the_batch_or_the_path() {
    let gpu = common::gpu();
    let x = || request(2, Some(20), true);
    let mine = |t: Tokens| -> Vec<(u32, (u32, Vec<(u32, u32)>))> {
        t.into_iter().filter(|e| e.0 == 0).map(|(_, t, lp)| (t, bits(&lp.expect("asked")))).collect()
    };
    let device = |depth| {
        let s = Box::new(DeviceSampler::new(&gpu).unwrap());
        BatchEngine::new(small_model(&gpu), s, BatchOptions::new(4, 8), depth).unwrap()
    };
    // Alone, through the pipelined ring (3 steps in flight).
    let alone = mine(run(&mut device(3), vec![x()], &[0]));
    assert_eq!(alone.len(), 8);
    // Third row of three, the others asking for other counts or nothing, joining later.
    let others = vec![x(), request(1, Some(3), false), request(3, None, true)];
    let batched = mine(run(&mut device(3), others, &[2, 0, 0]));
    assert_eq!(alone, batched, "the same bits in a batch, in another row");
    // Read back at every step (no steps in flight), and with the host sampler.
    assert_eq!(alone, mine(run(&mut device(0), vec![x()], &[0])), "no steps in flight");
    let mut host = BatchEngine::new(small_model(&gpu), Box::new(HostSampler), BatchOptions::new(2, 8), 2).unwrap();
    assert_eq!(alone, mine(run(&mut host, vec![x(), request(0, None, false)], &[0, 0])), "host sampler");
}

#[test]
fn too_many_top_logprobs_are_refused() {
    let gpu = common::gpu();
    let mut engine = BatchEngine::new(small_model(&gpu), Box::new(HostSampler), BatchOptions::new(1, 1), 0).unwrap();
    let e = engine.submit(request(0, Some(21), true)).unwrap_err();
    assert!(e.to_string().contains("at most 20"), "{e}");
}
