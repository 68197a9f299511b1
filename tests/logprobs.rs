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
                Event::Finished { .. } | Event::Started { .. } => {}
            })
            .unwrap();
    }
    panic!("the engine never went idle")
}

/// Exact bits of one token's logprobs: the sampled token's, then the top (id, bits).
type Bits = (u32, Vec<(u32, u32)>);

fn bits(t: &TokenLogprobs) -> Bits {
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
    let mine = |t: Tokens| -> Vec<(u32, Bits)> {
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

/// With logit controls the logprobs are those of the controlled logits, the same bits on the
/// device sampler (which rewrites the row in place) and on the host sampler (which writes its
/// controlled row back), pipelined or not; and not the uncontrolled row's.
#[test]
fn logprobs_follow_the_logit_controls_on_both_samplers() {
    let gpu = common::gpu();
    let controls = wgpu_llm::sampling::LogitControls {
        logit_bias: vec![(7, 3.0), (500, -2.5)],
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        repeat_penalty: 1.3,
        repeat_last_n: 16,
    };
    let x = |controlled: bool| {
        let r = request(2, Some(5), true);
        if controlled {
            Request { controls: controls.clone(), ..r }
        } else {
            r
        }
    };
    let mine = |t: Tokens| -> Vec<(u32, Bits)> {
        t.into_iter().filter(|e| e.0 == 0).map(|(_, t, lp)| (t, bits(&lp.expect("asked")))).collect()
    };
    let device = |depth| {
        let s = Box::new(DeviceSampler::new(&gpu).unwrap());
        BatchEngine::new(small_model(&gpu), s, BatchOptions::new(2, 8), depth).unwrap()
    };
    let pipelined = mine(run(&mut device(3), vec![x(true)], &[0]));
    assert_eq!(pipelined.len(), 8);
    assert_eq!(pipelined, mine(run(&mut device(0), vec![x(true)], &[0])), "no steps in flight");
    let mut host = BatchEngine::new(small_model(&gpu), Box::new(HostSampler), BatchOptions::new(2, 8), 2).unwrap();
    assert_eq!(pipelined, mine(run(&mut host, vec![x(true)], &[0])), "host sampler");
    let free = mine(run(&mut device(3), vec![x(false)], &[0]));
    assert_ne!(free, pipelined, "the controls change the logprobs");
}

#[test]
fn too_many_top_logprobs_are_refused() {
    let gpu = common::gpu();
    let mut engine = BatchEngine::new(small_model(&gpu), Box::new(HostSampler), BatchOptions::new(1, 1), 0).unwrap();
    let e = engine.submit(request(0, Some(21), true)).unwrap_err();
    assert!(e.to_string().contains("at most 20"), "{e}");
}

// ---------------------------------------------------------------------------------------
// The server, on the tiny Gemma 4 fixture (a chat template that joins the messages' content).

/// A running `wgpu-llm serve` and its address; killed on drop.
struct Served(std::process::Child, String);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve() -> Served {
    use std::io::BufRead;
    let dir = std::env::temp_dir().join(format!("logprobs-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(common::fixture_dir().join("models/gemma4_tiny")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = r#"{"chat_template": "{% for m in messages %}{{ m.content }} {% endfor %}"}"#;
    std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
        .args(["serve", "--port", "0", "--ctx", "128", "--max-batch", "2", "--model"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("listening on http://").map(|a| a.trim().to_string()));
    let served = Served(child, addr.unwrap_or_default());
    assert!(!served.1.is_empty(), "the server did not start");
    std::thread::spawn(move || lines.for_each(drop));
    served
}

/// POSTs `body` over HTTP/1.0 (no chunked encoding): the status and the body.
fn post(s: &Served, path: &str, body: &serde_json::Value) -> (u16, String) {
    use std::io::{Read, Write};
    let body = body.to_string();
    let mut c = std::net::TcpStream::connect(&s.1).unwrap();
    write!(c, "POST {path} HTTP/1.0\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}", body.len())
        .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    (head.split(' ').nth(1).and_then(|c| c.parse().ok()).expect("a status"), body.to_string())
}

fn answer(s: &Served, path: &str, body: serde_json::Value) -> serde_json::Value {
    let (status, text) = post(s, path, &body);
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// The streamed chunks' `choices[0].logprobs` that are not null.
fn streamed(s: &Served, path: &str, mut body: serde_json::Value) -> Vec<serde_json::Value> {
    body["stream"] = true.into();
    let (status, text) = post(s, path, &body);
    assert_eq!(status, 200, "{text}");
    let data = text.lines().filter_map(|l| l.strip_prefix("data: ")).filter(|d| *d != "[DONE]");
    let chunks: Vec<serde_json::Value> = data.map(|d| serde_json::from_str(d).unwrap()).collect();
    chunks.iter().map(|c| c["choices"][0]["logprobs"].clone()).filter(|l| !l.is_null()).collect()
}

/// `{token, logprob, bytes}` as OpenAI shapes it: the token is the bytes' text.
fn check_token(v: &serde_json::Value) -> (String, f64) {
    let token = v["token"].as_str().unwrap_or_else(|| panic!("token: {v}")).to_string();
    let logprob = v["logprob"].as_f64().unwrap_or_else(|| panic!("logprob: {v}"));
    assert!(logprob <= 0.0, "{v}");
    let bytes: Vec<u8> = serde_json::from_value(v["bytes"].clone()).unwrap_or_else(|e| panic!("bytes ({e}): {v}"));
    assert_eq!(String::from_utf8_lossy(&bytes), token, "{v}");
    (token, logprob)
}

#[test]
fn the_server_answers_logprobs_as_openai_does() {
    use serde_json::json;
    let s = serve();
    let chat = "/v1/chat/completions";
    let ask = json!({"messages": [{"role": "user", "content": "one two"}], "max_tokens": 6, "temperature": 0,
                     "logprobs": true, "top_logprobs": 3});
    let v = answer(&s, chat, ask.clone());
    let lp = &v["choices"][0]["logprobs"];
    let content = lp["content"].as_array().unwrap_or_else(|| panic!("{v}"));
    let generated = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    // The end-of-sequence token, if one ended it, has no entry.
    assert!(!content.is_empty() && (generated - 1..=generated).contains(&content.len()), "{v}");
    assert!(lp["refusal"].is_null(), "{v}");
    for e in content {
        let (token, logprob) = check_token(e);
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        let top: Vec<(String, f64)> = top.iter().map(check_token).collect();
        assert!(top.windows(2).all(|w| w[0].1 >= w[1].1), "best first: {e}");
        assert_eq!(top[0], (token, logprob), "greedy: the token is the top-1: {e}");
    }
    // Streamed: the chunks' entries make the same list.
    let parts = streamed(&s, chat, ask);
    let joined: Vec<serde_json::Value> = parts.iter().flat_map(|p| p["content"].as_array().unwrap().clone()).collect();
    assert_eq!(&joined, content);
    // Not asked: null.
    let plain = json!({"messages": [{"role": "user", "content": "one"}], "max_tokens": 2});
    assert!(answer(&s, chat, plain.clone())["choices"][0]["logprobs"].is_null());
    assert!(streamed(&s, chat, plain).is_empty());

    // Completions: logprobs: 2, with the prompt echoed.
    let done = "/v1/completions";
    let ask = json!({"prompt": "one two", "max_tokens": 5, "temperature": 0, "logprobs": 2, "echo": true});
    let v = answer(&s, done, ask.clone());
    let lp = &v["choices"][0]["logprobs"];
    let column = |k: &str| lp[k].as_array().unwrap_or_else(|| panic!("{k}: {v}")).clone();
    let (tokens, token_logprobs, top, offsets) =
        (column("tokens"), column("token_logprobs"), column("top_logprobs"), column("text_offset"));
    assert!(!tokens.is_empty(), "{v}");
    let mut offset = "one two".chars().count() as u64;
    for i in 0..tokens.len() {
        let (token, logprob) = (tokens[i].as_str().unwrap(), token_logprobs[i].as_f64().unwrap());
        let map = top[i].as_object().unwrap();
        assert!((1..=3).contains(&map.len()), "at most n + 1 entries: {v}");
        assert_eq!(map[token].as_f64(), Some(logprob), "greedy: the token is in its map: {v}");
        assert!(map.values().all(|l| l.as_f64().unwrap() <= logprob), "greedy: the token is the best: {v}");
        assert_eq!(offsets[i].as_u64(), Some(offset), "{v}");
        offset += token.chars().count() as u64;
    }
    let parts = streamed(&s, done, ask);
    for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        let joined: Vec<serde_json::Value> = parts.iter().flat_map(|p| p[k].as_array().unwrap().clone()).collect();
        assert_eq!(joined, column(k), "streamed {k}");
    }

    // Bad values: a 400 in OpenAI's shape naming the field.
    let user = json!([{"role": "user", "content": "x"}]);
    for (path, body, param) in [
        (chat, json!({"messages": user, "logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (chat, json!({"messages": user, "top_logprobs": 2}), "top_logprobs"),
        (chat, json!({"messages": user, "logprobs": 2}), "logprobs"),
        (done, json!({"prompt": "x", "logprobs": 6}), "logprobs"),
        (done, json!({"prompt": "x", "logprobs": -1}), "logprobs"),
    ] {
        let (status, text) = post(&s, path, &body);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let e = &v["error"];
        assert_eq!((status, e["param"].as_str()), (400, Some(param)), "{body}: {text}");
        assert!(e["message"].as_str().is_some_and(|m| m.contains(param)) && e["type"].is_string(), "{text}");
    }
}
