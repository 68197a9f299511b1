//! The batch engine's prefix cache (`decode::prefix`): a request whose prompt starts with tokens
//! an earlier request left in the cache (a chat's next turn: the earlier prompt and its answer;
//! a system prompt shared by requests running together) prefills only the rest and gets the
//! tokens of a cold run of its prompt (the cache emptied first), greedy and seeded; the KV
//! entries it reuses are copied bit for bit; a prompt differing in one token is never served
//! KV past that token; under a small byte limit the least recently used entry goes and its
//! prompt is prefilled again; a model with recurrent layers (the tiny Qwen3.5-MoE) gets the cold
//! run's tokens whatever it reuses; and `serve` reports the reuse in `usage` and `/metrics`.
//!
//! Exactness: the reused entries were computed by other passes (the earlier request's prefill of
//! another length, its decode steps) than a cold run's one prefill, and prefill rows are not bit
//! for bit independent of the pass length (measured below on lavapipe), so a hit's tokens equal
//! a cold run's up to rounding: on these fixtures, every one of them.
//!
//! The fixtures are the tiny random-weight checkpoints of tests/fixtures/models (a word-level
//! vocabulary `t0`..`t1023`).

mod common;

use wgpu_llm::decode::batch::{BatchEngine, BatchForm, BatchOptions, Event, Request, SeqId};
use wgpu_llm::decode::prefix::{PrefixCache, MIN_REUSE};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};

const CTX: usize = 256;
const ON: u64 = 1 << 30;

fn load(name: &str) -> Model {
    let ck = Checkpoint::open(&common::fixture_dir().join("models").join(name)).unwrap();
    Model::load(&common::gpu(), &ck, Some(CTX), &mut |_, _| {}).unwrap()
}

/// An engine of `max_batch` sequences with a prefix cache of `bytes`, 3 steps in flight.
fn engine_of(model: Model, bytes: u64, max_batch: usize, form: BatchForm) -> BatchEngine {
    let sampler = Box::new(DeviceSampler::new(&model.gpu).unwrap());
    let opts = BatchOptions { prefix_cache_bytes: bytes, form: Some(form), ..BatchOptions::new(max_batch, 16) };
    BatchEngine::new(model, sampler, opts, 3).unwrap()
}

fn seeded(seed: u64) -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.0, seed }
}

/// `n` distinct-looking token ids from `seed`.
fn words(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (seed * 389 + i * 97 + 13) % 1000).collect()
}

/// What a request got: its tokens and the prompt positions it reused.
#[derive(Clone, Debug, PartialEq)]
struct Got {
    tokens: Vec<u32>,
    cached: usize,
}

/// Submits `prompts` together (each `max_tokens` long, `params`) and steps until idle.
fn run(engine: &mut BatchEngine, prompts: &[Vec<u32>], params: SamplingParams, max_tokens: usize) -> Vec<Got> {
    let ids: Vec<SeqId> =
        prompts.iter().map(|p| engine.submit(Request::new(p.clone(), params, max_tokens, vec![])).unwrap()).collect();
    let mut got = vec![Got { tokens: Vec::new(), cached: usize::MAX }; prompts.len()];
    while !engine.is_idle() {
        engine
            .step(&mut |id, e| {
                let g = &mut got[ids.iter().position(|&x| x == id).unwrap()];
                match e {
                    Event::Started { cached_tokens } => g.cached = cached_tokens,
                    Event::Token(t, _) => g.tokens.push(t),
                    Event::Finished { .. } => {}
                    Event::Failed(e) => panic!("a request failed: {e}"),
                }
            })
            .unwrap();
    }
    for g in &got {
        assert!(g.cached != usize::MAX && g.tokens.len() == max_tokens, "{g:?}");
    }
    got
}

/// `prompt` alone.
fn alone(engine: &mut BatchEngine, prompt: &[u32], params: SamplingParams, max_tokens: usize) -> Got {
    run(engine, &[prompt.to_vec()], params, max_tokens).remove(0)
}

/// `prompt` alone with the cache emptied first: a cold run.
fn cold(engine: &mut BatchEngine, prompt: &[u32], params: SamplingParams, max_tokens: usize) -> Got {
    engine.clear_prefix_cache();
    let g = alone(engine, prompt, params, max_tokens);
    assert_eq!(g.cached, 0, "a cold run reuses nothing");
    g
}

/// Positions `range` of `slot` in every KV cache of `m`, as f16 bits.
fn kv_bits(m: &Model, slot: usize, range: std::ops::Range<usize>) -> Vec<u16> {
    let mut out = Vec::new();
    for (k, v) in m.kv_caches() {
        for t in [k, v] {
            let all = m.gpu.read_f16(t).unwrap();
            let (heads, ctx, d) = (t.shape[1], t.shape[2], t.shape[3]);
            for h in 0..heads {
                let at = (slot * heads + h) * ctx * d;
                out.extend(all[at + range.start * d..at + range.end * d].iter().map(|x| x.to_bits()));
            }
        }
    }
    out
}

/// The cache copies KV entries out of one slot and into another bit for bit (every layer's
/// shape: Gemma 4's sliding layers of 2 KV heads of 16 and full ones of 1 of 32), and only the
/// common prefix. A prompt prefilled as a restored prefix plus the rest is close to, but not bit
/// for bit, the prompt prefilled whole: prefill rows depend on the pass length (printed).
#[test]
fn kv_entries_are_copied_bit_for_bit() {
    let mut m = load("gemma4_tiny");
    m.set_sequences(3).unwrap();
    let mut cache = PrefixCache::new(&m, ON);
    let first = words(1, 40);
    m.prefill_slot(0, &first).unwrap();
    cache.store(&m, 0, &first);
    assert_eq!(cache.stats().entries, 1);
    assert_eq!(cache.stats().bytes, 40 * cache.bytes_per_token());
    // A prompt sharing 30 tokens: 30 positions restored into slot 2.
    let mut second = first[..30].to_vec();
    second.extend(words(2, 12));
    let past = kv_bits(&m, 2, 30..CTX);
    assert_eq!(cache.restore(&m, 2, &second), 30);
    assert!(kv_bits(&m, 2, 0..30) == kv_bits(&m, 0, 0..30), "the restored positions are the source's");
    assert!(kv_bits(&m, 2, 30..CTX) == past, "nothing past the common prefix is touched");
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.cached_tokens), (1, 0, 30));
    // The rest of the prompt prefilled after the restored prefix, against the whole prompt cold.
    let vocab = m.config.vocab_size;
    let gpu = m.gpu.clone();
    let split = gpu.read_f32(&m.prefill_slot_at(2, 30, &second[30..]).unwrap()).unwrap();
    let whole = gpu.read_f32(&m.prefill_slot(1, &second).unwrap()).unwrap();
    let diff = split.iter().zip(&whole).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let argmax = |l: &[f32]| (0..vocab).max_by(|&i, &j| l[i].total_cmp(&l[j])).unwrap();
    eprintln!("30 + 12 tokens against 42 prefilled whole: logits differ by at most {diff:e}");
    assert_eq!(argmax(&split), argmax(&whole));
}

/// A chat's second turn (the first turn's prompt, its answer, a new message) reuses all the first
/// turn left (its prompt and its answer but the last token) and gets a cold run's tokens, greedy
/// and seeded, in either batch form. A short request submitted just before it takes the slot the
/// first turn freed, so the history is copied into another one.
#[test]
fn second_turn_reuses_the_first_and_gets_the_cold_tokens() {
    for (params, form) in [
        (SamplingParams::greedy(), BatchForm::Batched),
        (seeded(7), BatchForm::Batched),
        (seeded(8), BatchForm::OneToken),
    ] {
        let mut e = engine_of(load("gemma4_tiny"), ON, 4, form);
        let first = words(3, 30);
        let one = alone(&mut e, &first, params, 8);
        assert_eq!(one.cached, 0);
        let mut second = first.clone();
        second.extend(&one.tokens);
        second.extend(words(4, 5));
        let warm = run(&mut e, &[words(20, 8), second.clone()], params, 8).remove(1);
        assert_eq!(warm.cached, first.len() + one.tokens.len() - 1, "{form:?}: the first turn is reused");
        let stats = e.prefix_stats();
        assert_eq!((stats.hits, stats.cached_tokens as usize), (1, warm.cached));
        assert_eq!(warm.tokens, cold(&mut e, &second, params, 8).tokens, "{form:?} {params:?}: cached vs cold");
    }
}

/// Requests submitted together with a shared system prompt: the first prefills it, the others
/// copy it from the first's prompt (cached while it runs) and prefill their own message; each
/// gets its cold run's tokens.
#[test]
fn a_shared_system_prompt_serves_requests_running_together() {
    let mut e = engine_of(load("gemma4_tiny"), ON, 4, BatchForm::Batched);
    let system = words(5, 24);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut p = system.clone();
            p.extend(words(10 + i, 3 + i as usize));
            p
        })
        .collect();
    let params = seeded(11);
    let together = run(&mut e, &prompts, params, 6);
    let cached: Vec<usize> = together.iter().map(|g| g.cached).collect();
    assert_eq!(cached, [0, 24, 24, 24]);
    for (i, p) in prompts.iter().enumerate() {
        assert_eq!(together[i].tokens, cold(&mut e, p, params, 6).tokens, "request {i}");
    }
}

/// A prompt that differs from a cached one in one token reuses the positions before it and no
/// more (none when fewer than the minimum); a prompt equal to a cached one reuses all but its last
/// token. Each gets its cold run's tokens.
#[test]
fn a_different_token_ends_the_reuse() {
    let mut e = engine_of(load("gemma4_tiny"), ON, 2, BatchForm::Batched);
    let base = words(6, 40);
    let params = SamplingParams::greedy();
    for (changed, want) in [(None, 39), (Some(20), 20), (Some(MIN_REUSE - 1), 0)] {
        e.clear_prefix_cache();
        alone(&mut e, &base, params, 4);
        let mut p = base.clone();
        if let Some(i) = changed {
            p[i] = (p[i] + 1) % 1000;
        }
        let got = alone(&mut e, &p, params, 4);
        assert_eq!(got.cached, want, "token {changed:?} changed");
        assert_eq!(got.tokens, cold(&mut e, &p, params, 4).tokens, "token {changed:?} changed");
    }
}

/// Under a byte limit of 60 positions, a second conversation's prompt evicts the first
/// conversation's entry (the least recently used): the first's next turn is prefilled whole and
/// still gets its cold tokens, the second's reuses its own history.
#[test]
fn eviction_under_a_small_byte_limit() {
    let model = load("gemma4_tiny");
    let per_token = PrefixCache::new(&model, 1).bytes_per_token();
    let limit = 60 * per_token;
    let mut e = engine_of(model, limit, 2, BatchForm::Batched);
    let params = seeded(3);
    let (a, b) = (words(7, 40), words(8, 40));
    let ta = alone(&mut e, &a, params, 6).tokens;
    assert_eq!(e.prefix_stats().bytes, 45 * per_token, "a's prompt and answer but its last token");
    let tb = alone(&mut e, &b, params, 6).tokens;
    let stats = e.prefix_stats();
    assert_eq!((stats.entries, stats.bytes), (1, 45 * per_token), "b's entry evicted a's");
    let next = |p: &[u32], t: &[u32]| [p, t, &words(9, 5)[..]].concat();
    let b2 = run(&mut e, &[next(&b, &tb)], params, 6).remove(0);
    assert_eq!(b2.cached, 45);
    let a2 = run(&mut e, &[next(&a, &ta)], params, 6).remove(0);
    assert_eq!(a2.cached, 0, "a's history was evicted");
    assert!(e.prefix_stats().bytes <= limit);
    assert_eq!(a2.tokens, cold(&mut e, &next(&a, &ta), params, 6).tokens);
    assert_eq!(b2.tokens, cold(&mut e, &next(&b, &tb), params, 6).tokens);
    // A prompt longer than the limit is never kept.
    e.clear_prefix_cache();
    run(&mut e, &[words(10, 70)], params, 2);
    assert_eq!(e.prefix_stats().entries, 0);
}

/// The tiny Qwen3.5-MoE (Gated DeltaNet layers: a state per sequence, not KV per position).
/// While the engine runs it one request at a time on the model's own sequence, a next turn that
/// extends all of the sequence reuses it; a prompt that diverges inside it is prefilled whole.
/// Either way the tokens are the cold run's.
#[test]
fn a_recurrent_model_gets_the_cold_tokens() {
    let mut e = engine_of(load("qwen35moe_tiny"), ON, 4, BatchForm::Batched);
    let one_at_a_time = !e.is_batched();
    for params in [SamplingParams::greedy(), seeded(5)] {
        e.clear_prefix_cache();
        let first = words(12, 30);
        let one = alone(&mut e, &first, params, 6);
        let second = [&first[..], &one.tokens, &words(13, 4)].concat();
        let two = alone(&mut e, &second, params, 6);
        // Reused where the engine holds the model's own sequence (not in slots: no snapshots of the
        // recurrent state yet).
        let held = first.len() + one.tokens.len() - 1;
        assert_eq!(two.cached, if one_at_a_time { held } else { 0 });
        let mut diverged = second.clone();
        diverged[20] = (diverged[20] + 1) % 1000;
        let three = alone(&mut e, &diverged, params, 6);
        assert_eq!(three.cached, 0, "a recurrent state is reused whole or not at all");
        assert_eq!(two.tokens, cold(&mut e, &second, params, 6).tokens, "{params:?}");
        assert_eq!(three.tokens, cold(&mut e, &diverged, params, 6).tokens, "{params:?}");
        assert_eq!(one.tokens, cold(&mut e, &first, params, 6).tokens, "{params:?}");
    }
}

/// With the cache off (the library's default) nothing is reused or kept.
#[test]
fn the_cache_off_reuses_nothing() {
    let mut e = engine_of(load("gemma4_tiny"), 0, 2, BatchForm::Batched);
    let p = words(14, 40);
    alone(&mut e, &p, SamplingParams::greedy(), 3);
    let again = run(&mut e, &[p], SamplingParams::greedy(), 3).remove(0);
    assert_eq!(again.cached, 0);
    let s = e.prefix_stats();
    assert_eq!((s.hits, s.misses, s.entries, s.bytes, s.limit), (0, 0, 0, 0, 0));
    assert_eq!(BatchOptions::default().prefix_cache_bytes, 0);
}

/// `serve` with the cache (its default) and without: a chat's second turn reports the reused
/// positions in `usage.prompt_tokens_details.cached_tokens` (streamed too) and `/metrics`, and
/// answers what the server without the cache answers.
#[cfg(all(feature = "cli", feature = "serve"))]
mod serve {
    use serde_json::{json, Value};
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::{Child, Command, Stdio};

    /// A running server (killed when dropped) and its address.
    struct Server(Child, String);

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = (self.0.kill(), self.0.wait());
        }
    }

    /// The tiny Gemma 4 with a chat template (each message's words, then `t2`), in a folder of its own.
    fn model(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("prefix-serve-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in std::fs::read_dir(super::common::fixture_dir().join("models/gemma4_tiny")).unwrap() {
            let f = f.unwrap();
            std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
        }
        let template = json!({"chat_template": "{% for m in messages %}{{ m.content }} t2 {% endfor %}"});
        std::fs::write(dir.join("tokenizer_config.json"), template.to_string()).unwrap();
        dir
    }

    fn start(model: &std::path::Path, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", "0", "--ctx", "256", "--max-batch", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = err
            .by_ref()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("listening on http://").map(str::to_string))
            .expect("the server's address");
        std::thread::spawn(move || err.for_each(drop));
        Server(child, addr)
    }

    /// One HTTP/1.1 exchange (the connection closed after it): the response's body.
    fn call(s: &Server, method: &str, path: &str, body: &str) -> String {
        let mut c = std::net::TcpStream::connect(&s.1).unwrap();
        let head =
            format!("{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json");
        write!(c, "{head}\r\ncontent-length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        out.split_once("\r\n\r\n").unwrap().1.to_string()
    }

    fn chat(s: &Server, messages: &Value, stream: bool) -> Value {
        let body = json!({"messages": messages, "max_tokens": 6, "seed": 4, "temperature": 0.9, "stream": stream,
                          "stream_options": {"include_usage": true}});
        let out = call(s, "POST", "/v1/chat/completions", &body.to_string());
        if !stream {
            return serde_json::from_str(&out).unwrap();
        }
        // The events' content joined, and the last chunk's usage.
        let events: Vec<Value> = out
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let text: String =
            events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect::<Vec<_>>().concat();
        json!({"choices": [{"message": {"content": text}}], "usage": events.last().unwrap()["usage"]})
    }

    /// The second turn of a conversation whose system message is 30 words: (answer, cached).
    fn two_turns(s: &Server, stream: bool) -> (String, u64) {
        let system: Vec<String> = (100..130).map(|i| format!("t{i}")).collect();
        let mut messages =
            json!([{"role": "system", "content": system.join(" ")}, {"role": "user", "content": "t5 t6"}]);
        let first = chat(s, &messages, false);
        let answer = first["choices"][0]["message"]["content"].clone();
        messages
            .as_array_mut()
            .unwrap()
            .extend([json!({"role": "assistant", "content": answer}), json!({"role": "user", "content": "t7 t8 t9"})]);
        let second = chat(s, &messages, stream);
        let usage = &second["usage"];
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached < usage["prompt_tokens"].as_u64().unwrap(), "{usage}");
        (second["choices"][0]["message"]["content"].as_str().unwrap().to_string(), cached)
    }

    /// The value of the metric line `name` in `/metrics`.
    fn metric(s: &Server, name: &str) -> u64 {
        let m = call(s, "GET", "/metrics", "");
        let line = m.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name} in {m}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }

    #[test]
    fn serve_reports_cached_tokens_and_answers_as_without_the_cache() {
        let dir = model("on");
        let on = start(&dir, &[]);
        let off = start(&dir, &["--prefix-cache-bytes", "0"]);
        for stream in [false, true] {
            let (with, cached) = two_turns(&on, stream);
            let (without, none) = two_turns(&off, stream);
            // The system message, the first question and the answer but its last token.
            assert!(cached >= 30 + 2, "stream {stream}: {cached} cached tokens");
            assert_eq!(none, 0);
            assert_eq!(with, without, "stream {stream}");
        }
        assert_eq!(metric(&on, "wgpu_llm_prefix_cache_hits_total"), 3, "the first turn's again, two second turns");
        assert!(metric(&on, "wgpu_llm_prefix_cache_tokens_total") >= 3 * 32);
        assert!(metric(&on, "wgpu_llm_prefix_cache_bytes") > 0);
        assert_eq!(metric(&off, "wgpu_llm_prefix_cache_limit_bytes"), 0);
        assert_eq!(metric(&off, "wgpu_llm_prefix_cache_hits_total"), 0);
        drop((on, off));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `bench --history-tokens N --streams 1`: a conversation's next turn through the batching
/// engine, cold and with the history from the prefix cache, seeded: both times measured, the
/// history reused, the same first token.
#[cfg(feature = "cli")]
#[test]
fn bench_times_a_cached_turn_through_the_engine() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
        .args(["bench", "--synthetic", "smollm2-135m:q4_1", "--history-tokens", "40", "--prompt-tokens", "6"])
        .args(["--streams", "1", "--reps", "1", "--seed", "7", "--temperature", "0.8", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((v["engine"].as_str(), v["cached_tokens"].as_u64()), (Some("batch"), Some(40)), "{v}");
    assert_eq!(v["first_token_same"], true, "{v}");
    for k in ["ttft_cold_ms", "ttft_cached_ms"] {
        assert!(v[k].as_f64().is_some_and(|t| t > 0.0), "{k}: {v}");
    }
}
