//! The seed models decoding several sequences at once (`decode::batch`, issue 30): Qwen3.5-MoE
//! (Gated DeltaNet layers with a recurrent state per sequence slot, a mixture of experts routed over
//! the step's tokens) and Gemma 4. Batch invariance, bit for bit: a sequence's logits in a batch
//! step are those it gets alone, whatever the batch size (1, 2, 3, 5, 8), its row and its slot, in
//! both batch forms; a request's tokens through the batch engine (greedy and seeded) are those it
//! gets alone; and in the one-token form each row is the one-sequence pass's (`generate`'s
//! numbers, its tokens). On the tiny fixtures of tests/fixtures/models (transformers' layouts, f16
//! weights: the experts run per slot) and on a shrunk Qwen3.5-35B-A3B layout with Q8_0 weights
//! and a stacked shared expert (the batched form groups the step's expert slots by expert).

mod common;

use std::collections::HashMap;
use wgpu_llm::decode::batch::{BatchEngine, BatchForm, BatchOptions, Event, Request, SeqId};
use wgpu_llm::decode::{generate_with, DecodeOptions};
use wgpu_llm::gpu::Gpu;
use wgpu_llm::loader::{synthetic, Checkpoint};
use wgpu_llm::model::config::{Mixer, MlpSpec};
use wgpu_llm::model::qwen3_5_moe::Qwen35MoeConfig;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};

/// The models: the two fixtures and the quantized Qwen3.5 layout ([`load`]).
const MODELS: [&str; 3] = ["qwen35moe_tiny", "gemma4_tiny", "qwen35moe_q8_0"];

/// A model of [`MODELS`] with a context of 96 tokens.
fn load(gpu: &Gpu, name: &str) -> Model {
    if name == "qwen35moe_q8_0" {
        // Qwen3.5-35B-A3B's layout, shrunk: three DeltaNet layers and a full attention layer
        // (4 q / 2 kv heads of 16, half of them rotary), 8 experts, top 2, a shared expert of the
        // experts' size (stacked as a ninth: every token's slot in one group).
        let mut q = Qwen35MoeConfig::qwen3_5_35b_a3b();
        (q.vocab_size, q.hidden_size, q.max_position_embeddings) = (1000, 64, 256);
        (q.num_attention_heads, q.num_key_value_heads, q.head_dim, q.partial_rotary_factor) = (4, 2, 16, 0.5);
        q.full_attention = vec![false, false, false, true];
        (q.linear_num_key_heads, q.linear_num_value_heads) = (2, 4);
        (q.linear_key_head_dim, q.linear_value_head_dim) = (16, 16);
        (q.num_experts, q.num_experts_per_tok) = (8, 2);
        (q.moe_intermediate_size, q.shared_expert_intermediate_size) = (32, 32);
        let ck = synthetic::build(&q.model_config(), "q8_0", "synthetic:tiny", 5).unwrap();
        return Model::load(gpu, &ck, Some(96), &mut |_, _| {}).unwrap();
    }
    let ck = Checkpoint::open(&common::fixture_dir().join("models").join(name)).unwrap();
    Model::load(gpu, &ck, Some(96), &mut |_, _| {}).unwrap()
}

/// What the model has that the batch must keep per sequence: (recurrent layers, MoE layers).
fn kinds(m: &Model) -> (bool, bool) {
    let layers = 0..m.config.num_layers();
    let recurrent = layers.clone().any(|l| matches!(m.config.layer(l).mixer, Mixer::DeltaNet(_)));
    (recurrent, layers.into_iter().any(|l| matches!(m.config.layer(l).mlp, MlpSpec::Moe { .. })))
}

/// Eight prompts of 1 to 17 tokens.
fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let lens = [5usize, 1, 12, 3, 8, 2, 17, 6];
    (0..8).map(|i| (0..lens[i]).map(|j| ((i * 131 + j * 37 + 11) % vocab) as u32).collect()).collect()
}

/// Sequence `i`'s input token at decode step `s` (teacher-forced).
fn next_token(i: usize, s: usize, vocab: usize) -> u32 {
    ((i * 53 + s * 17 + 3) % vocab) as u32
}

/// Rows of the batch steps compared with each sequence alone: 2, 3, 5 and 8 sequences, in
/// different orders.
const ROWS: [&[usize]; 5] =
    [&[3, 1], &[6, 0, 4], &[2, 7, 5, 1, 3], &[7, 6, 5, 4, 3, 2, 1, 0], &[4, 0, 6, 2, 1, 7, 3, 5]];

/// The KV-cache slot of sequence i (not its index: rows, sequences and slots all differ).
const SLOTS: [usize; 8] = [5, 0, 7, 2, 6, 1, 3, 4];

/// Decode steps checked.
const STEPS: usize = 3;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Each sequence's logits through the one-sequence pass (the model's own sequence: prompt, then
/// [`STEPS`] one-token passes): `[step][sequence]`, bits.
fn one_sequence_logits(gpu: &Gpu, name: &str) -> Vec<Vec<Vec<u32>>> {
    let mut m = load(gpu, name);
    let vocab = m.config.vocab_size;
    let mut steps = vec![Vec::new(); STEPS];
    for (i, p) in prompts(vocab).iter().enumerate() {
        m.reset();
        m.forward(p).unwrap();
        for (s, step) in steps.iter_mut().enumerate() {
            step.push(bits(&gpu.read_f32(&m.forward(&[next_token(i, s, vocab)]).unwrap()).unwrap()));
        }
    }
    steps
}

/// A batch decode step's logits rows are bit for bit each sequence's alone (a batch of one), with
/// the sequences in any rows and slots, over several steps (the recurrent states carried per slot);
/// in the one-token form they are the one-sequence pass's too.
#[test]
fn batch_logits_rows_do_not_depend_on_the_batch() {
    let gpu = common::gpu();
    for name in MODELS {
        let reference = one_sequence_logits(&gpu, name);
        // The batched form with the quantized experts per slot (the table's choice on every
        // device today) and grouped by expert (`WGPU_LLM_MOE_GROUP=1`); the one-token form.
        for (form, group) in [(BatchForm::Batched, false), (BatchForm::Batched, true), (BatchForm::OneToken, false)] {
            let what = format!("{name} {form:?} grouped {group}");
            let mut tuning = gpu.tuning().clone();
            tuning.knobs.moe_group = Some(group);
            let gpu = gpu.with_tuning(tuning);
            let mut m = load(&gpu, name);
            let vocab = m.config.vocab_size;
            m.set_batch_form(form);
            m.set_sequences(8).unwrap();
            let prompts = prompts(vocab);
            for (p, &slot) in prompts.iter().zip(&SLOTS) {
                m.prefill_slot(slot, p).unwrap();
            }
            // The quantized experts' slots grouped by expert where asked (a grouping per MoE
            // layer), else each slot its one-token matvec; f16 experts per slot.
            let groupings = |m: &mut Model| {
                let kernels = m.stage_batch(&[(0, 0), (0, 1)]).unwrap().kernels();
                kernels.iter().filter(|(k, _)| k.starts_with("moe_group")).count()
            };
            let grouped = name == "qwen35moe_q8_0" && form == BatchForm::Batched && group;
            assert_eq!(groupings(&mut m), if grouped { m.config.num_layers() } else { 0 }, "{what}: groupings");
            for (s, reference) in reference.iter().enumerate() {
                let at: Vec<(u32, u32)> =
                    prompts.iter().zip(&SLOTS).map(|(p, &slot)| ((p.len() + s) as u32, slot as u32)).collect();
                // A step of `rows` (sequence indices): each row's logits, bits. A step at a position
                // rewrites what a step there wrote before (the same KV entries and recurrent state).
                let mut step = |rows: &[usize]| -> Vec<Vec<u32>> {
                    let seqs: Vec<(u32, u32)> = rows.iter().map(|&r| at[r]).collect();
                    let ids: Vec<u32> = rows.iter().map(|&r| next_token(r, s, vocab)).collect();
                    let logits = m.stage_batch(&seqs).unwrap().submit_with(&gpu, &ids);
                    bits(&gpu.read_f32(&logits).unwrap()).chunks(vocab).map(<[u32]>::to_vec).collect()
                };
                let alone: Vec<Vec<u32>> = (0..8).map(|r| step(&[r]).remove(0)).collect();
                for (r, row) in alone.iter().enumerate() {
                    assert!(row.iter().all(|&b| f32::from_bits(b).is_finite()), "{what}: sequence {r} step {s}");
                }
                assert_ne!(alone[0], alone[1], "{what}: different sequences, different logits");
                if form == BatchForm::OneToken {
                    for (r, row) in alone.iter().enumerate() {
                        let differ = row.iter().zip(&reference[r]).filter(|(a, b)| a != b).count();
                        assert_eq!(differ, 0, "{what}: sequence {r} step {s} alone vs the one-sequence pass");
                    }
                }
                for rows in ROWS {
                    let got = step(rows);
                    for (row, &r) in rows.iter().enumerate() {
                        let differ = got[row].iter().zip(&alone[r]).filter(|(a, b)| a != b).count();
                        assert_eq!(
                            differ,
                            0,
                            "{what}: sequence {r} (slot {}) step {s} in row {row} of {}: {differ} of {vocab} logits \
                             differ from a batch of one",
                            SLOTS[r],
                            rows.len()
                        );
                    }
                }
            }
        }
    }
}

fn sampled(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, min_p: 0.05, seed }
}

/// Eight requests over [`prompts`], greedy and seeded, 6 to 14 tokens each.
fn requests(vocab: usize) -> Vec<Request> {
    prompts(vocab)
        .into_iter()
        .enumerate()
        .map(|(i, prompt)| {
            let params = if i % 3 == 0 { SamplingParams::greedy() } else { sampled(200 + i as u64) };
            Request::new(prompt, params, [8, 14, 6, 10, 12, 7, 9, 11][i], vec![])
        })
        .collect()
}

/// Runs requests `which` of [`requests`] through `engine`, submitted in that order (so in those
/// rows), request `which[i]` joining before step `joins[i]`; steps until idle. Each request's
/// tokens, by its index.
fn run(engine: &mut BatchEngine, which: &[usize], joins: &[usize]) -> HashMap<usize, Vec<u32>> {
    let mut reqs: Vec<Option<Request>> = requests(engine.model().config.vocab_size).into_iter().map(Some).collect();
    let mut ids: HashMap<SeqId, usize> = HashMap::new();
    let mut out: HashMap<usize, Vec<u32>> = HashMap::new();
    let mut step = 0;
    loop {
        for (&i, &j) in which.iter().zip(joins) {
            if j == step {
                ids.insert(engine.submit(reqs[i].take().expect("submitted once")).unwrap(), i);
                out.insert(i, Vec::new());
            }
        }
        if engine.is_idle() && joins.iter().all(|&j| j <= step) {
            return out;
        }
        let mut events = Vec::new();
        engine.step(&mut |id, e| events.push((id, e))).unwrap();
        for (id, e) in events {
            match e {
                Event::Token(t, _) => out.get_mut(&ids[&id]).expect("submitted").push(t),
                Event::Finished { .. } | Event::Started { .. } => {}
                Event::Failed(e) => panic!("request {} failed: {e}", ids[&id]),
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine never went idle");
    }
}

/// Through the batch engine (the pipelined device sampler), every request (greedy and seeded) gets
/// the tokens it gets alone, in batches of 2, 3, 5 and 8 in different orders and joining mid-stream,
/// in both forms; in the one-token form those are `generate`'s tokens, as in an engine of one
/// sequence.
#[test]
fn batch_engine_tokens_do_not_depend_on_the_batch() {
    let gpu = common::gpu();
    for name in MODELS {
        // Each request alone through the one-sequence loop (`generate`).
        let mut m = load(&gpu, name);
        let mut sampler = DeviceSampler::new(&gpu).unwrap();
        let generated: Vec<Vec<u32>> = requests(m.config.vocab_size)
            .iter()
            .map(|r| {
                let mut tokens = Vec::new();
                let mut on_token = |t| {
                    tokens.push(t);
                    Ok(true)
                };
                let opts = DecodeOptions::depth(3);
                generate_with(&mut m, &mut sampler, &r.prompt, r.max_tokens, &r.params, &[], &mut on_token, opts)
                    .unwrap();
                tokens
            })
            .collect();
        // An engine of one sequence (the one-token form by default: `serve --max-batch 1`), the
        // requests queued: each gets generate's tokens.
        let mut engine = BatchEngine::new(
            load(&gpu, name),
            Box::new(DeviceSampler::new(&gpu).unwrap()),
            BatchOptions::new(1, 16),
            3,
        )
        .unwrap();
        let got = run(&mut engine, &[2, 0, 1], &[0, 0, 0]);
        for (i, tokens) in got {
            assert_eq!(tokens, generated[i], "{name}: request {i} through an engine of one sequence vs generate");
        }
        for form in [BatchForm::Batched, BatchForm::OneToken] {
            let what = format!("{name} {form:?}");
            let opts = BatchOptions { form: Some(form), ..BatchOptions::new(8, 16) };
            let model = load(&gpu, name);
            let (recurrent, moe) = kinds(&model);
            assert!(name == "gemma4_tiny" || (recurrent && moe), "{what}: a recurrent MoE model");
            let mut engine = BatchEngine::new(model, Box::new(DeviceSampler::new(&gpu).unwrap()), opts, 3).unwrap();
            assert!(engine.is_batched(), "{what}: decodes several sequences at once");
            let alone: Vec<Vec<u32>> = (0..8).map(|i| run(&mut engine, &[i], &[0]).remove(&i).unwrap()).collect();
            if form == BatchForm::OneToken {
                assert_eq!(alone, generated, "{what}: each request alone vs generate");
            }
            for rows in ROWS {
                let got = run(&mut engine, rows, &vec![0; rows.len()]);
                for &i in rows {
                    assert_eq!(got[&i], alone[i], "{what}: request {i} among {rows:?}");
                }
            }
            // Joining mid-stream: the batch grows and shrinks.
            let got = run(&mut engine, &[5, 2, 7, 0, 3], &[0, 0, 2, 3, 6]);
            for (i, tokens) in got {
                assert_eq!(tokens, alone[i], "{what}: request {i} joining mid-stream");
            }
        }
    }
}
