//! Structured output's cost per token: decode tok/s of one model with a JSON-schema constraint
//! against without, on the device sampler and on the host sampler, and the host's grammar work
//! alone (the matcher's mask and advance per token, replayed over the constrained run's tokens).
//!
//! ```text
//! cargo bench --bench structured -- MODEL.gguf                    # the built-in schema
//! cargo bench --bench structured -- MODEL.gguf --schema FILE.json # another schema
//! cargo bench --bench structured -- MODEL.gguf --tokens 256 --reps 3 --json
//! # random weights of a real shape, a real tokenizer (no download on the GPU machine):
//! cargo bench --bench structured -- --synthetic qwen2.5-1.5b:q4_k_m --tokenizer qwen.json
//! cargo bench --bench structured -- QWEN.gguf --save-tokenizer qwen.json  # the file above, once
//! ```
//!
//! Every run is greedy from the same prompt (plain text), `--tokens` at most (default 128). The
//! free run is [`generate_with`]'s default GPU-resident loop; the constrained run is
//! [`constrained`]'s loop (one sampler submission and one wait a token, the mask computed while
//! the next forward pass runs). Columns: decode tok/s (after the first token), tokens generated,
//! why it stopped, and for the constrained runs the host's mean mask + advance time per token
//! (µs). With random weights the text is noise but the work per token is the real shape's. On
//! lavapipe (a CPU driver) the numbers only mean something as ratios.
//!
//! [`generate_with`]: wgpu_llm::decode::generate_with
//! [`constrained`]: wgpu_llm::decode::constrained

use std::time::Instant;
use wgpu_llm::decode::{constrained, generate_with, DecodeOptions, Stats};
use wgpu_llm::gpu::{Gpu, GpuOptions};
use wgpu_llm::grammar::{Constraint, Vocabulary};
use wgpu_llm::loader::{synthetic, Checkpoint};
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, SamplingBackend, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;

/// An answer shaped like a tool call: nested, an array, enums, bounded numbers, free strings.
const SCHEMA: &str = include_str!("structured_schema.json");

const PROMPT: &str = "Invent a software engineer and describe them as JSON with their name, city, age, \
                      skills, level and address. Make every field long and detailed.";

struct Args {
    model: String,
    synthetic: Option<String>,
    tokenizer: Option<String>,
    save_tokenizer: Option<String>,
    schema: String,
    tokens: usize,
    reps: usize,
    json: bool,
}

fn args() -> Args {
    let mut a = Args {
        model: String::new(),
        synthetic: None,
        tokenizer: None,
        save_tokenizer: None,
        schema: SCHEMA.into(),
        tokens: 128,
        reps: 1,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().unwrap_or_else(|| panic!("{arg} {what}"));
        match arg.as_str() {
            "--schema" => a.schema = std::fs::read_to_string(value("FILE")).expect("reading the schema"),
            "--synthetic" => a.synthetic = Some(value("NAME:RECIPE")),
            "--tokenizer" => a.tokenizer = Some(value("FILE")),
            "--save-tokenizer" => a.save_tokenizer = Some(value("FILE")),
            "--tokens" => a.tokens = value("N").parse().expect("--tokens N"),
            "--reps" => a.reps = value("N").parse().expect("--reps N"),
            "--json" => a.json = true,
            "--bench" => {}
            m if !m.starts_with("--") => a.model = m.to_string(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

/// The checkpoint, its tokenizer and end-of-sequence tokens.
fn open(a: &Args) -> (Checkpoint, Tokenizer, Vec<u32>) {
    match (&a.synthetic, &a.tokenizer) {
        (Some(spec), Some(file)) => {
            let ck = synthetic::open(spec).expect("the synthetic model");
            let tok = Tokenizer::from_json_file(file.as_ref()).expect("the tokenizer");
            // A tokenizer.json alone names no end-of-sequence token: the usual ones it has.
            let ends = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<eos>", "<end_of_turn>"];
            let eos = tok.eos_id().into_iter().chain(ends.iter().filter_map(|t| tok.token_to_id(t))).collect();
            (ck, tok, eos)
        }
        (None, _) if !a.model.is_empty() => {
            let ck = Checkpoint::open(a.model.as_ref()).expect("the model");
            let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id).unwrap();
            let eos = ck.config.eos_token_ids.clone();
            (ck, tok, eos)
        }
        _ => {
            eprintln!(
                "usage: cargo bench --bench structured -- (MODEL | --synthetic NAME:RECIPE --tokenizer FILE) \
                 [--schema FILE] [--tokens N] [--reps N] [--json]"
            );
            std::process::exit(2);
        }
    }
}

fn main() {
    let a = args();
    let (ck, tokenizer, eos) = open(&a);
    if let Some(out) = &a.save_tokenizer {
        let json = tokenizer.inner().to_string(false).expect("serializing the tokenizer");
        std::fs::write(out, json).expect("writing the tokenizer");
        eprintln!("wrote {out}");
        return;
    }
    let gpu = Gpu::new(&GpuOptions::default()).expect("a GPU");
    let prompt = tokenizer.encode(PROMPT, true).unwrap();
    let ctx = prompt.len() + a.tokens + 8;
    let mut model = Model::load(&gpu, &ck, Some(ctx), &mut |_, _| {}).expect("loading the model");
    let vocab = Vocabulary::new(&tokenizer, model.config.vocab_size, &eos).unwrap();
    let constraint = Constraint::JsonSchema(a.schema.clone());
    let params = SamplingParams::greedy();
    let mut device = DeviceSampler::new(&gpu).unwrap();
    // Warm-up (pipelines compiled, plans recorded), unmeasured: a few tokens of each loop.
    let mut warm = vocab.matcher(&constraint).unwrap();
    let (few, mut sink) = (4.min(a.tokens), |_| Ok(true));
    generate_with(&mut model, &mut device, &prompt, few, &params, &eos, &mut sink, DecodeOptions::default()).unwrap();
    constrained::generate(&mut model, &mut device, &prompt, few, &params, &mut warm, &eos, &mut sink).unwrap();
    let mut rows = Vec::new();
    for rep in 0..a.reps {
        for name in ["device", "host"] {
            for constrained in [false, true] {
                let sampler: &mut dyn SamplingBackend = if name == "device" { &mut device } else { &mut HostSampler };
                let mut tokens = Vec::new();
                let mut on_token = |t| {
                    tokens.push(t);
                    Ok(true)
                };
                let stats: Stats = if constrained {
                    let mut m = vocab.matcher(&constraint).expect("the schema");
                    constrained::generate(&mut model, sampler, &prompt, a.tokens, &params, &mut m, &eos, &mut on_token)
                } else {
                    let opts = DecodeOptions::default();
                    generate_with(&mut model, sampler, &prompt, a.tokens, &params, &eos, &mut on_token, opts)
                }
                .expect("generation");
                // The host's grammar work alone: the same tokens through a fresh matcher.
                let mask_us = constrained.then(|| {
                    let mut m = vocab.matcher(&constraint).unwrap();
                    let t = Instant::now();
                    for &tok in &tokens {
                        m.mask().unwrap();
                        m.advance(tok).unwrap();
                    }
                    t.elapsed().as_secs_f64() * 1e6 / tokens.len().max(1) as f64
                });
                let row = serde_json::json!({
                    "rep": rep, "sampler": name, "constrained": constrained,
                    "decode_tok_s": stats.decode_tok_s(), "tokens": stats.generated_tokens,
                    "stop": format!("{:?}", stats.stop), "mask_us_per_token": mask_us,
                });
                println!(
                    "{name:<7} {:<12} {:>9.1} tok/s  {:>4} tokens  {:<10} mask+advance {}",
                    if constrained { "json-schema" } else { "free" },
                    stats.decode_tok_s(),
                    stats.generated_tokens,
                    row["stop"].as_str().unwrap(),
                    mask_us.map_or("-".to_string(), |us| format!("{us:.0} µs/token")),
                );
                if constrained && rep == 0 && name == "device" {
                    eprintln!("constrained output: {}", tokenizer.decode(&tokens).unwrap_or_default());
                }
                rows.push(row);
            }
        }
    }
    if a.json {
        let source = a.synthetic.clone().unwrap_or(a.model.clone());
        println!("{}", serde_json::json!({"model": source, "device": gpu.info.name, "runs": rows}));
    }
}
