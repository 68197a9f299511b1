//! Many sequences at once (`decode::batch`): every request gets exactly the tokens it gets alone
//! (greedy and seeded sampling, batches up to 8, prompts of different lengths, requests joining
//! and leaving mid-stream, cancelled ones, either sampler, pipelined or not), a batch step's
//! logits rows are bit for bit those of each sequence alone, and the queue and bad requests give
//! clear refusals. A request constrained by a JSON schema beside free ones gets what the
//! one-sequence constrained loop gives it, and leaves theirs unchanged. Small synthetic models
//! (random weights of real layouts) keep lavapipe fast.

mod common;

use std::collections::HashMap;
use wgpu_llm::decode::batch::{BatchEngine, BatchForm, BatchOptions, Event, Request, SeqId, SubmitError};
use wgpu_llm::decode::{constrained, generate_with, DecodeOptions, StopReason};
use wgpu_llm::gpu::Gpu;
use wgpu_llm::grammar::{Constraint, Vocabulary};
use wgpu_llm::loader::{synthetic, Checkpoint};
use wgpu_llm::model::arch;
use wgpu_llm::model::config::{LayerAttention, ModelConfig};
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, SamplingBackend, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;

/// A real preset's layout, shrunk: 3 layers of width 64, 4 q / 2 kv heads of 16.
fn tiny_config(preset: &str) -> ModelConfig {
    shrunk(preset, 1000)
}

/// [`tiny_config`] with a vocabulary of `vocab` tokens.
fn shrunk(preset: &str, vocab: usize) -> ModelConfig {
    let mut h = synthetic::preset_hyperparams(preset).unwrap();
    (h.vocab_size, h.hidden_size, h.intermediate_size) = (vocab, 64, 96);
    (h.num_attention_heads, h.num_key_value_heads, h.head_dim) = (4, 2, 16);
    h.layer_types = vec![LayerAttention::Full; 3];
    h.query_pre_attn_scalar = Some(16.0);
    h.max_position_embeddings = 256;
    arch::model_config(&h)
}

/// Gemma 4's layout, shrunk: 5 layers (sliding, full, sliding, full, sliding), window 8, head
/// dims 16 / 32, KV heads 2 / 1 with keys as values on the full layers, soft-capped logits; and
/// E2B's per-layer inputs (8 wide) with the last layer reading layer 2's KV cache.
fn tiny_gemma4() -> ModelConfig {
    let mut g = wgpu_llm::model::gemma4::Gemma4Config::gemma_4_31b();
    (g.vocab_size, g.hidden_size, g.intermediate_size) = (1000, 64, 96);
    (g.num_attention_heads, g.num_key_value_heads, g.num_global_key_value_heads) = (4, 2, Some(1));
    (g.head_dim, g.global_head_dim, g.sliding_window) = (16, 32, 8);
    g.full_attention = vec![false, true, false, true, false];
    (g.hidden_size_per_layer_input, g.vocab_size_per_layer_input) = (8, 1000);
    (g.num_kv_shared_layers, g.use_double_wide_mlp) = (1, true);
    g.max_position_embeddings = 256;
    g.model_config()
}

fn model(gpu: &Gpu, preset: &str, recipe: &str) -> Model {
    let config = if preset == "gemma-4-tiny" { tiny_gemma4() } else { tiny_config(preset) };
    let ck = synthetic::build(&config, recipe, "synthetic:tiny", 5).unwrap();
    Model::load(gpu, &ck, Some(96), &mut |_, _| {}).unwrap()
}

fn sampler(gpu: &Gpu, device: bool) -> Box<dyn SamplingBackend + Send> {
    if device {
        Box::new(DeviceSampler::new(gpu).unwrap())
    } else {
        Box::new(HostSampler)
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.05, seed }
}

/// Eight requests: prompts of 1 to 40 tokens, greedy and sampled, different lengths, one with
/// an eos that it meets early (its own first greedy token, found by a first run).
fn requests() -> Vec<Request> {
    (0..8u32)
        .map(|i| {
            let len = [5, 1, 17, 40, 3, 9, 26, 2][i as usize];
            let prompt = (0..len).map(|j| (i * 131 + j * 37 + 11) % 1000).collect();
            let params = if i % 3 == 0 { SamplingParams::greedy() } else { sampled(100 + u64::from(i)) };
            Request::new(prompt, params, [12, 20, 7, 15, 30, 9, 18, 25][i as usize], vec![])
        })
        .collect()
}

/// Copies of free requests (a constrained one's matcher is not copied: make it again).
fn copies(reqs: &[Request]) -> Vec<Request> {
    reqs.iter()
        .map(|r| {
            assert!(r.constraint.is_none(), "a constrained request is made again, not copied");
            Request::new(r.prompt.clone(), r.params, r.max_tokens, r.stop_ids.clone())
        })
        .collect()
}

/// What a run delivered: per request (in submission order), its tokens and how it ended.
type Outcome = Vec<(Vec<u32>, Option<StopReason>)>;

/// Runs `reqs` through `engine`, submitting request `i` before step `joins[i]`, cancelling
/// those in `cancel` (request, after that many of its tokens); steps until idle.
fn run(engine: &mut BatchEngine, reqs: Vec<Request>, joins: &[usize], cancel: &[(usize, usize)]) -> Outcome {
    let mut out: Outcome = vec![(Vec::new(), None); reqs.len()];
    let prompts: Vec<usize> = reqs.iter().map(|r| r.prompt.len()).collect();
    let mut reqs: Vec<Option<Request>> = reqs.into_iter().map(Some).collect();
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    let mut step = 0;
    loop {
        for (i, r) in reqs.iter_mut().enumerate() {
            if joins[i] == step {
                let id = engine.submit(r.take().expect("submitted once")).unwrap();
                ids.insert(id, i);
            }
        }
        let pending_joins = joins.iter().any(|&j| j > step);
        if engine.is_idle() && !pending_joins {
            break;
        }
        let mut events = Vec::new();
        engine.step(&mut |id, e| events.push((id, e))).unwrap();
        for (id, e) in events {
            let i = ids[&id];
            assert!(out[i].1.is_none(), "request {i}: an event after its end: {e:?}");
            match e {
                Event::Token(t, _) => out[i].0.push(t),
                Event::Finished { reason, prompt_tokens, generated_tokens } => {
                    assert_eq!(prompt_tokens, prompts[i]);
                    assert_eq!(generated_tokens, out[i].0.len());
                    out[i].1 = Some(reason);
                }
                Event::Failed(e) => panic!("request {i} failed: {e}"),
                Event::Started { .. } => {}
            }
        }
        for &(c, after) in cancel {
            if let Some((&id, _)) = ids.iter().find(|(_, &i)| i == c) {
                if out[c].0.len() >= after && out[c].1.is_none() && engine.cancel(id) {
                    out[c].1 = Some(StopReason::Caller);
                }
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine never went idle");
    }
    out
}

/// Each request alone through the same engine.
fn alone(engine: &mut BatchEngine, reqs: &[Request]) -> Outcome {
    copies(reqs).into_iter().map(|r| run(engine, vec![r], &[0], &[]).remove(0)).collect()
}

#[test]
fn each_request_gets_its_tokens_alone() {
    let gpu = common::gpu();
    let mut reqs = requests();
    for (preset, recipe) in
        [("smollm2-135m", "q8_0"), ("qwen2.5-0.5b", "f16"), ("gemma3-270m", "q4_0"), ("gemma-4-tiny", "q8_0")]
    {
        let mut engine =
            BatchEngine::new(model(&gpu, preset, recipe), sampler(&gpu, true), BatchOptions::new(8, 16), 3).unwrap();
        assert!(engine.is_batched());
        // Request 4 stops at eos: its own third token alone.
        reqs[4].stop_ids.clear();
        let first = alone(&mut engine, &reqs[4..5]);
        let eos = first[0].0[2];
        reqs[4].stop_ids = vec![eos];
        let want = alone(&mut engine, &reqs);
        let at = first[0].0.iter().position(|&t| t == eos).unwrap() + 1;
        assert_eq!((want[4].0.len(), want[4].1), (at, Some(StopReason::Eos)), "{preset}: eos ends request 4");
        for (i, (tokens, end)) in want.iter().enumerate() {
            assert!(end.is_some() && !tokens.is_empty(), "{preset}: request {i} alone: {end:?}");
        }
        let what = format!("{preset} {recipe}");
        // All at once.
        assert_eq!(run(&mut engine, copies(&reqs), &[0; 8], &[]), want, "{what}: all eight at once");
        // Joining mid-stream, the batch changing every few steps.
        let joins = [0, 0, 3, 3, 4, 10, 11, 25];
        assert_eq!(run(&mut engine, copies(&reqs), &joins, &[]), want, "{what}: joining mid-stream");
        // Cancelled mid-stream: the cancelled ones end early with a prefix of their tokens.
        let got = run(&mut engine, copies(&reqs), &joins, &[(1, 4), (6, 2)]);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if i == 1 || i == 6 {
                assert_eq!(g.1, Some(StopReason::Caller), "{what}: request {i}");
                assert!(w.0.starts_with(&g.0) && g.0.len() < w.0.len(), "{what}: request {i}: {g:?} vs {w:?}");
            } else {
                assert_eq!(g, w, "{what}: request {i} beside cancelled ones");
            }
        }
    }
}

/// In either batch form, the batch engine with fewer sequences than requests (they queue), not
/// pipelined, and with the host sampler: the same tokens as the pipelined device engine alone; and
/// in the one-token form every request (greedy or seeded) gets what the one-sequence loop
/// (`generate`) gives it.
#[test]
fn any_batch_size_loop_and_sampler_give_the_same_tokens() {
    let gpu = common::gpu();
    let reqs = requests();
    let joins = [0, 0, 0, 2, 2, 5, 9, 9];
    let mut one_token = Vec::new();
    for form in [BatchForm::OneToken, BatchForm::Batched] {
        let opts = BatchOptions { form: Some(form), ..BatchOptions::new(8, 16) };
        let mut reference =
            BatchEngine::new(model(&gpu, "smollm2-135m", "q8_0"), sampler(&gpu, true), opts, 3).unwrap();
        let want = alone(&mut reference, &reqs);
        for (max_batch, device, depth) in [(3, true, 3), (8, true, 0), (5, false, 3), (1, true, 2)] {
            let opts = BatchOptions { form: Some(form), ..BatchOptions::new(max_batch, 16) };
            let mut engine =
                BatchEngine::new(model(&gpu, "smollm2-135m", "q8_0"), sampler(&gpu, device), opts, depth).unwrap();
            let got = run(&mut engine, copies(&reqs), &joins, &[]);
            assert_eq!(got, want, "{form:?}: max_batch {max_batch}, device sampler {device}, depth {depth}");
        }
        if form == BatchForm::OneToken {
            one_token = want;
        }
    }
    let want = one_token;
    // The one-sequence loop (`generate`) gives every request the same tokens, greedy and seeded.
    let mut m = model(&gpu, "smollm2-135m", "q8_0");
    let mut s = DeviceSampler::new(&gpu).unwrap();
    for (i, r) in reqs.iter().enumerate() {
        let mut tokens = Vec::new();
        generate_with(
            &mut m,
            &mut s,
            &r.prompt,
            r.max_tokens,
            &r.params,
            &[],
            &mut |t| {
                tokens.push(t);
                Ok(true)
            },
            DecodeOptions::depth(3),
        )
        .unwrap();
        assert_eq!(tokens, want[i].0, "request {i}: generate vs the batch engine");
    }
}

/// A batch step's logits rows are bit for bit each sequence's logits in a batch of one, with
/// the sequences in any rows.
#[test]
fn batch_logits_rows_do_not_depend_on_the_batch() {
    let gpu = common::gpu();
    let mut m = model(&gpu, "qwen2.5-0.5b", "q8_0");
    m.set_sequences(4).unwrap();
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[9], &[100, 200, 300, 400, 500, 600, 700, 800]];
    let slots = [2u32, 0, 3];
    for (p, &s) in prompts.iter().zip(&slots) {
        m.prefill_slot(s as usize, p).unwrap();
    }
    let next = [17u32, 33, 999];
    let at: Vec<(u32, u32)> = prompts.iter().zip(&slots).map(|(p, &s)| (p.len() as u32, s)).collect();
    let step = |m: &mut Model, rows: &[usize]| -> Vec<f32> {
        let seqs: Vec<(u32, u32)> = rows.iter().map(|&r| at[r]).collect();
        let ids: Vec<u32> = rows.iter().map(|&r| next[r]).collect();
        let logits = m.stage_batch(&seqs).unwrap().submit_with(&gpu, &ids);
        gpu.read_f32(&logits).unwrap()
    };
    let v = m.config.vocab_size;
    let all = step(&mut m, &[2, 0, 1]);
    assert!(all.iter().all(|x| x.is_finite()));
    for (row, r) in [2usize, 0, 1].into_iter().enumerate() {
        let one = step(&mut m, &[r]);
        let same = one.iter().zip(&all[row * v..][..v]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "sequence {r}: its logits in row {row} of three differ from a batch of one");
    }
    // And different sequences give different logits (the rows are not one sequence's copies).
    assert_ne!(all[..v], all[v..2 * v]);
}

#[test]
fn queue_limit_and_bad_requests_are_refused() {
    let gpu = common::gpu();
    let opts = BatchOptions::new(2, 2);
    let mut engine = BatchEngine::new(model(&gpu, "smollm2-135m", "q8_0"), sampler(&gpu, true), opts, 3).unwrap();
    let ok = || Request::new(vec![1, 2, 3], SamplingParams::greedy(), 4, vec![]);
    // Two for the free sequences, two to wait: the fifth is refused.
    for _ in 0..4 {
        engine.submit(ok()).unwrap();
    }
    assert!(matches!(engine.submit(ok()), Err(SubmitError::QueueFull)));
    let mut bad = |r: Request| match engine.submit(r) {
        Err(SubmitError::Invalid(e)) => e.to_string(),
        other => panic!("accepted a bad request: {other:?}"),
    };
    let msg = bad(Request { prompt: vec![], ..ok() });
    assert!(msg.contains("empty"), "{msg}");
    let msg = bad(Request { prompt: vec![1; 96], ..ok() });
    assert!(msg.contains("context"), "{msg}");
    let msg = bad(Request { prompt: vec![1000], ..ok() });
    assert!(msg.contains("vocabulary"), "{msg}");
    let msg = bad(Request { params: SamplingParams { top_p: 1.5, ..SamplingParams::greedy() }, ..ok() });
    assert!(msg.contains("top_p"), "{msg}");
    // The queued ones still run to the end.
    let mut done = 0;
    while !engine.is_idle() {
        engine.step(&mut |_, e| done += usize::from(matches!(e, Event::Finished { .. }))).unwrap();
    }
    assert_eq!(done, 4);
    // Too many sequences for the model's batch kernels.
    let err = BatchEngine::new(model(&gpu, "smollm2-135m", "q8_0"), sampler(&gpu, true), BatchOptions::new(33, 1), 3)
        .err()
        .expect("33 sequences refused");
    assert!(err.to_string().contains("between 1 and 32"), "{err}");
}

/// In the one-token form, a batch step's logits rows are bit for bit the one-sequence pass's (what
/// `generate` runs), in a batch of one and of three, for every fixture layout and weight type: one set of numbers for
/// one sequence and for many. On a GPU with integer dot products and subgroups of 32 (the H100)
/// this covers the DP4 and mixed-type (Q4_K q/k beside a Q6_K v) projections too.
#[test]
fn batch_rows_are_the_one_sequence_pass() {
    let gpu = common::gpu();
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[9], &[100, 200, 300, 400, 500, 600, 700, 800]];
    let next = [17u32, 33, 999];
    let wide = |preset: &str| {
        // Rows of 256: whole K-quant super-blocks (Q4_K / Q6_K, as a Q4_K_M file's).
        let mut h = synthetic::preset_hyperparams(preset).unwrap();
        (h.vocab_size, h.hidden_size, h.intermediate_size) = (1000, 256, 512);
        (h.num_attention_heads, h.num_key_value_heads, h.head_dim) = (4, 2, 64);
        h.layer_types = vec![LayerAttention::Full; 2];
        h.max_position_embeddings = 256;
        arch::model_config(&h)
    };
    let cases = [
        ("smollm2-135m", "q8_0", tiny_config("smollm2-135m")),
        ("qwen2.5-0.5b", "f16", tiny_config("qwen2.5-0.5b")),
        ("gemma3-270m", "q4_0", tiny_config("gemma3-270m")),
        ("gemma-4-tiny", "q8_0", tiny_gemma4()),
        ("qwen2.5-0.5b", "q4_k_m", wide("qwen2.5-0.5b")),
        ("smollm2-135m", "q4_1", wide("smollm2-135m")),
    ];
    for (preset, recipe, config) in cases {
        let ck = synthetic::build(&config, recipe, "synthetic:tiny", 5).unwrap();
        let mut m = Model::load(&gpu, &ck, Some(96), &mut |_, _| {}).unwrap();
        m.set_batch_form(BatchForm::OneToken);
        let what = format!("{preset} {recipe} ({})", m.weights.summary());
        let alone: Vec<Vec<f32>> = prompts
            .iter()
            .zip(next)
            .map(|(p, n)| {
                m.reset();
                m.forward(p).unwrap();
                let logits = m.forward(&[n]).unwrap();
                gpu.read_f32(&logits).unwrap()
            })
            .collect();
        m.set_sequences(4).unwrap();
        let slots = [2u32, 0, 3];
        for (p, &s) in prompts.iter().zip(&slots) {
            m.prefill_slot(s as usize, p).unwrap();
        }
        let at: Vec<(u32, u32)> = prompts.iter().zip(&slots).map(|(p, &s)| (p.len() as u32, s)).collect();
        let v = m.config.vocab_size;
        for rows in [vec![2usize, 0, 1], vec![0], vec![1], vec![2]] {
            let seqs: Vec<(u32, u32)> = rows.iter().map(|&r| at[r]).collect();
            let ids: Vec<u32> = rows.iter().map(|&r| next[r]).collect();
            let logits = m.stage_batch(&seqs).unwrap().submit_with(&gpu, &ids);
            let got = gpu.read_f32(&logits).unwrap();
            for (row, &r) in rows.iter().enumerate() {
                let row_logits = &got[row * v..][..v];
                assert!(row_logits.iter().all(|x| x.is_finite()), "{what}: sequence {r} not finite");
                let differ = row_logits.iter().zip(&alone[r]).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(
                    differ,
                    0,
                    "{what}: sequence {r} in row {row} of {}: {differ} of {v} logits differ from the one-sequence pass",
                    rows.len()
                );
            }
        }
    }
}

/// A bounded JSON schema: every path through it ends well within [`constrained_beside_free`]'s
/// token limit.
const SCHEMA: &str = r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array", "maxItems": 2,
    "items": {"enum": ["a", "b"]}}}, "required": ["name", "age"], "additionalProperties": false}"#;

/// Two requests constrained by [`SCHEMA`] (greedy and seeded) beside three free ones, joining
/// mid-stream, in the one-token form with the pipelined device sampler and with the host
/// sampler: each constrained request gets the tokens the one-sequence constrained loop
/// (`constrained::generate`) gives it alone and ends complete with output that validates
/// against the schema, and the free requests get the tokens they get alone. The model is tiny
/// with SmolLM2's real vocabulary (random weights: only the mask keeps the output valid).
#[test]
fn constrained_beside_free() {
    let gpu = common::gpu();
    let ck = Checkpoint::open(&common::model("smollm2")).unwrap();
    let tokenizer = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id).unwrap();
    let eos = ck.config.eos_token_ids.clone();
    let vocab = Vocabulary::new(&tokenizer, ck.config.vocab_size, &eos).unwrap();
    let weights = synthetic::build(&shrunk("smollm2-135m", vocab.len()), "q8_0", "synthetic:tiny", 5).unwrap();
    let load = || Model::load(&gpu, &weights, Some(96), &mut |_, _| {}).unwrap();
    let schema = Constraint::JsonSchema(SCHEMA.into());
    let prompt = tokenizer.encode("Answer in JSON:", false).unwrap();
    let (max_tokens, params) = (64, [SamplingParams::greedy(), sampled(77)]);
    let constrained_req = |p: &SamplingParams| Request {
        constraint: Some(vocab.matcher(&schema).unwrap()),
        ..Request::new(prompt.clone(), *p, max_tokens, eos.clone())
    };
    // Each constrained request alone, through the one-sequence loop.
    let mut m = load();
    let mut s = DeviceSampler::new(&gpu).unwrap();
    let want: Vec<(Vec<u32>, Option<StopReason>)> = params
        .iter()
        .map(|p| {
            let mut matcher = vocab.matcher(&schema).unwrap();
            let mut tokens = Vec::new();
            let stats = constrained::generate(&mut m, &mut s, &prompt, max_tokens, p, &mut matcher, &eos, &mut |t| {
                tokens.push(t);
                Ok(true)
            })
            .unwrap();
            (tokens, Some(stats.stop))
        })
        .collect();
    let validator = jsonschema::validator_for(&serde_json::from_str(SCHEMA).unwrap()).unwrap();
    for (i, (tokens, stop)) in want.iter().enumerate() {
        assert_eq!(*stop, Some(StopReason::Eos), "constrained request {i} alone ends complete");
        let body: Vec<u32> = tokens.iter().copied().filter(|t| !eos.contains(t)).collect();
        let text = tokenizer.decode(&body).unwrap();
        let value: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("request {i}: {text:?} is not JSON: {e}"));
        assert!(validator.is_valid(&value), "request {i}: {text} does not follow the schema");
    }
    let free: Vec<Request> = requests().into_iter().take(3).collect();
    for device in [true, false] {
        let opts = BatchOptions { form: Some(BatchForm::OneToken), ..BatchOptions::new(4, 8) };
        let mut engine = BatchEngine::new(load(), sampler(&gpu, device), opts, 3).unwrap();
        let free_alone = alone(&mut engine, &free);
        let mut reqs = copies(&free);
        reqs.extend(params.iter().map(constrained_req));
        // The free ones start (pipelined), the constrained ones join mid-stream.
        let got = run(&mut engine, reqs, &[0, 0, 1, 3, 4], &[]);
        assert_eq!(got[..3], free_alone[..], "device sampler {device}: the free requests beside constrained ones");
        assert_eq!(got[3..], want[..], "device sampler {device}: the constrained requests vs the one-sequence loop");
    }
}
