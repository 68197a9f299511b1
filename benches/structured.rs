//! Structured output's cost per token: decode tok/s of one model with a JSON-schema constraint
//! against without, on the device sampler and on the host sampler, and the host's grammar work
//! alone (the matcher's mask and advance per token, replayed over the constrained run's tokens).
//!
//! ```text
//! cargo bench --bench structured -- MODEL.gguf                    # the built-in schema
//! cargo bench --bench structured -- MODEL.gguf --schema FILE.json # another schema
//! cargo bench --bench structured -- MODEL.gguf --tokens 256 --reps 3 --json
//! ```
//!
//! Every run is greedy from the same chat prompt, `--tokens` at most (default 128). The free run
//! uses the engine's default GPU-resident loop; the constrained run [`constrained`]'s loop
//! (one sampler submission and one wait a token, the mask computed while the next forward pass
//! runs). Columns: tok/s (decode, after the first token), tokens generated, why it stopped, and
//! for the constrained runs the host's mean mask + advance time per token (µs). On lavapipe (a
//! CPU driver) the numbers only mean something as ratios.
//!
//! [`constrained`]: wgpu_llm::decode::constrained

use std::time::Instant;
use wgpu_llm::engine::SamplerChoice;
use wgpu_llm::grammar::{Constraint, Vocabulary};
use wgpu_llm::Engine;

/// An answer shaped like a tool call: nested, an array, enums, bounded numbers, free strings.
const SCHEMA: &str = r#"{"type": "object", "properties": {
  "name": {"type": "string"}, "city": {"type": "string"},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "skills": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "level": {"enum": ["junior", "senior", "lead"]},
  "address": {"type": "object", "properties": {"street": {"type": "string"}, "zip": {"type": "string"}},
              "required": ["street", "zip"]}},
  "required": ["name", "city", "age", "skills", "level", "address"]}"#;

const PROMPT: &str = "Invent a software engineer and describe them as JSON with their name, city, age, \
                      skills, level and address. Make every field long and detailed.";

struct Args {
    model: String,
    schema: String,
    tokens: usize,
    reps: usize,
    json: bool,
}

fn args() -> Args {
    let mut a = Args { model: String::new(), schema: SCHEMA.into(), tokens: 128, reps: 1, json: false };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--schema" => {
                a.schema = std::fs::read_to_string(it.next().expect("--schema FILE")).expect("reading the schema")
            }
            "--tokens" => a.tokens = it.next().and_then(|v| v.parse().ok()).expect("--tokens N"),
            "--reps" => a.reps = it.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--json" => a.json = true,
            "--bench" => {}
            m if !m.starts_with("--") => a.model = m.to_string(),
            other => panic!("unknown argument {other}"),
        }
    }
    a
}

fn main() {
    let a = args();
    if a.model.is_empty() {
        eprintln!("usage: cargo bench --bench structured -- MODEL [--schema FILE] [--tokens N] [--reps N] [--json]");
        return;
    }
    let mut engine = Engine::load(&a.model).expect("loading the model");
    let constraint = Constraint::JsonSchema(a.schema.clone());
    let vocab = Vocabulary::new(engine.tokenizer(), engine.model().config.vocab_size, engine.stop_ids()).unwrap();
    let mut rows = Vec::new();
    for rep in 0..a.reps {
        for sampler in [SamplerChoice::Device, SamplerChoice::Host] {
            for constrained in [false, true] {
                let mut g = engine.generate(PROMPT).chat(true).temperature(0.0).max_tokens(a.tokens).sampler(sampler);
                if constrained {
                    g = g.constraint(constraint.clone());
                }
                let out = g.run().expect("generation");
                // The host's grammar work alone: the same tokens through a fresh matcher.
                let mask_us = constrained.then(|| {
                    let mut m = vocab.matcher(&constraint).unwrap();
                    let t = Instant::now();
                    let mut n = 0;
                    for &tok in &out.tokens {
                        m.mask().unwrap();
                        m.advance(tok).unwrap();
                        n += 1;
                    }
                    t.elapsed().as_secs_f64() * 1e6 / n.max(1) as f64
                });
                let row = serde_json::json!({
                    "rep": rep, "sampler": format!("{sampler:?}").to_lowercase(), "constrained": constrained,
                    "decode_tok_s": out.stats.decode_tok_s(), "tokens": out.stats.generated_tokens,
                    "stop": format!("{:?}", out.stats.stop), "mask_us_per_token": mask_us,
                });
                println!(
                    "{:<7} {:<12} {:>9.1} tok/s  {:>4} tokens  {:<10} mask+advance {}",
                    row["sampler"].as_str().unwrap(),
                    if constrained { "json-schema" } else { "free" },
                    out.stats.decode_tok_s(),
                    out.stats.generated_tokens,
                    row["stop"].as_str().unwrap(),
                    mask_us.map_or("-".to_string(), |us| format!("{us:.0} µs/token")),
                );
                if constrained && rep == 0 && sampler == SamplerChoice::Device {
                    eprintln!("constrained output: {}", out.text);
                }
                rows.push(row);
            }
        }
    }
    if a.json {
        println!("{}", serde_json::json!({"model": a.model, "device": engine.gpu().info.name, "runs": rows}));
    }
}
