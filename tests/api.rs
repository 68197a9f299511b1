//! The library's high-level API ([`wgpu_llm::Engine`]) on the real SmolLM2-135M-Instruct: the same
//! tokens as the command line's `generate` and as the parts assembled by hand, streamed pieces
//! that add up to the answer, seeded runs that repeat, and bad input refused with an `Err` that
//! says what was wrong. One engine is loaded for all the tests (lavapipe is slow); each
//! generation is at most 16 tokens.

mod common;

use std::sync::{Mutex, MutexGuard, OnceLock};
use wgpu_llm::chat::{apply_chat_template, Message};
use wgpu_llm::decode::{generate_with, DecodeOptions, StopReason};
use wgpu_llm::engine::{Chat, Request, SamplerChoice, Sampling};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;
use wgpu_llm::{Engine, Error};

const QUESTION: &str = "What is 2+3? Answer briefly.";

/// SmolLM2 loaded once through the API, shared by the tests in turn.
fn engine() -> MutexGuard<'static, Engine> {
    static ENGINE: OnceLock<Mutex<Engine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| Mutex::new(Engine::load(common::model("smollm2")).expect("SmolLM2 loads")))
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn greedy_chat_answer_is_the_cli_answer() {
    let path = common::model("smollm2");
    let mut engine = engine();
    let answer = engine.generate(QUESTION).chat(true).temperature(0.0).max_tokens(16).run().unwrap();
    // transformers' greedy answer from the same weights (tests/fixtures/reference/smollm2_chat.json),
    // as tests/cli.rs's real_model_answers has it.
    assert_eq!(answer.text, "The answer is 5.");
    assert_eq!(answer.stats.stop, StopReason::Eos);
    assert_eq!(answer.tokens.last(), Some(&engine.stop_ids()[0]), "the eos token ends the tokens");

    // The parts assembled by hand, as `generate` did before the API: the template rendered, the
    // prompt encoded, the decode loop run on the same weights.
    let ck = Checkpoint::open(&path).unwrap();
    let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id).unwrap();
    let text = apply_chat_template(
        ck.chat_template.as_deref().unwrap(),
        &[Message::user(QUESTION)],
        true,
        ck.bos_token.as_deref(),
        ck.eos_token.as_deref(),
    )
    .unwrap();
    let ids = tok.encode(&text, true).unwrap();
    assert_eq!(engine.prompt_ids(&Request { chat: Some(Chat::default()), ..Request::new(QUESTION) }).unwrap(), ids);
    assert_eq!(answer.stats.prompt_tokens, ids.len());
    let mut sampler = DeviceSampler::new(engine.gpu()).unwrap();
    let mut tokens = Vec::new();
    let eos = ck.config.eos_token_ids.clone();
    let params = SamplingParams::greedy();
    let model = engine.model_mut();
    let mut on_token = |t| {
        tokens.push(t);
        Ok(true)
    };
    generate_with(model, &mut sampler, &ids, 16, &params, &eos, &mut on_token, DecodeOptions::default()).unwrap();
    assert_eq!(answer.tokens, tokens, "the API's tokens and the hand-assembled loop's, bit for bit");

    // The binary's `generate` (which runs this API) prints the same text, then a newline.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
        .args(["generate", "--quiet", "--temperature", "0", "--max-tokens", "16", "--chat", "--prompt", QUESTION])
        .arg("--model")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{}\n", answer.text));
}

#[test]
fn streamed_pieces_make_the_text() {
    let mut engine = engine();
    let mut pieces = Vec::new();
    let answer = engine
        .generate("Tell me a story about a cat.")
        .system("You are a storyteller.")
        .seed(3)
        .max_tokens(12)
        .stream(|p| {
            pieces.push(p.to_string());
            true
        })
        .unwrap();
    assert_eq!(answer.stats.generated_tokens, answer.tokens.len());
    assert!(pieces.len() > 1 && pieces.iter().all(|p| !p.is_empty()), "{pieces:?}");
    assert_eq!(pieces.concat(), answer.text);
    let stop = engine.stop_ids().to_vec();
    let kept: Vec<u32> = answer.tokens.iter().copied().filter(|t| !stop.contains(t)).collect();
    assert_eq!(engine.tokenizer().decode_skip_special(&kept).unwrap(), answer.text);
    // The system message went through the template.
    let chat = Chat { system: Some("You are a storyteller.".into()), messages: vec![] };
    let req = Request { chat: Some(chat), ..Request::new("Tell me a story about a cat.") };
    let prompt = engine.prompt_ids(&req).unwrap();
    assert_eq!(prompt.len(), answer.stats.prompt_tokens);
    assert!(engine.tokenizer().decode(&prompt).unwrap().contains("You are a storyteller."));

    // Returning false stops: the pieces so far are the text.
    let mut first = Vec::new();
    let stopped = engine
        .generate("Tell me a story about a cat.")
        .chat(true)
        .seed(3)
        .max_tokens(12)
        .stream(|p| {
            first.push(p.to_string());
            false
        })
        .unwrap();
    assert_eq!(stopped.stats.stop, StopReason::Caller);
    assert!(stopped.tokens.len() < answer.tokens.len(), "{} tokens", stopped.tokens.len());
    assert_eq!(first.concat(), stopped.text);
}

#[test]
fn seeded_sampling_repeats() {
    let mut engine = engine();
    let mut run = |seed: Option<u64>| {
        let g = engine.generate("Once upon a time").temperature(1.0).top_k(0).top_p(1.0).min_p(0.0).max_tokens(10);
        let g = match seed {
            Some(s) => g.seed(s),
            None => g,
        };
        g.run().unwrap()
    };
    let a = run(Some(11));
    let b = run(Some(11));
    assert_eq!(a.seed, 11);
    assert_eq!((&a.tokens, &a.text), (&b.tokens, &b.text));
    // Without a seed, a random one is drawn and reported; running with it repeats the tokens.
    let c = run(None);
    let d = run(Some(c.seed));
    assert_eq!(c.tokens, d.tokens);
    let e = run(None);
    assert_ne!(c.seed, e.seed, "two random seeds");
    // A request through Engine::run and the host sampler: the greedy answer.
    let req = Request {
        prompt: QUESTION.into(),
        chat: Some(Chat::default()),
        max_tokens: 8,
        sampling: Sampling::greedy(),
        sampler: SamplerChoice::Host,
        controls: Default::default(),
    };
    let host = engine.run(&req, &mut |_| Ok(true)).unwrap();
    assert!(host.text.starts_with("The answer is"), "{}", host.text);
}

/// A session ([`Engine::session`]) keeps its history in the KV cache: the second turn reuses at
/// least the first turn's prompt, prefills the rest, and answers what a cold run of the whole
/// conversation answers (greedy and seeded).
#[test]
fn a_session_reuses_its_history_and_answers_as_a_cold_run() {
    let mut engine = engine();
    for sampling in [Sampling::greedy(), Sampling { seed: Some(5), ..Sampling::default() }] {
        let (messages, answers) = {
            let mut chat = engine.session().system("Answer briefly.").max_tokens(8).sampling(sampling);
            let first = chat.send(QUESTION, |_| Ok(true)).unwrap();
            let held = chat.cached_tokens();
            let second = chat.send("And 4+4?", |_| Ok(true)).unwrap();
            assert_eq!(first.stats.cached_tokens, 0);
            let reused = second.stats.cached_tokens;
            assert!(reused >= first.stats.prompt_tokens && reused <= held, "{reused} reused of {held}");
            (chat.messages().to_vec(), [first, second])
        };
        assert_eq!(messages.len(), 5);
        assert_eq!(messages[2], Message::assistant(answers[0].text.clone()));
        // (The first turn ran from position 0, as a cold run does: the second is the one to check.)
        let cold = engine.chat(&messages[..4]).max_tokens(8).sampling(sampling).run().unwrap();
        let second = &answers[1];
        assert_eq!(cold.stats.prompt_tokens, second.stats.prompt_tokens + second.stats.cached_tokens);
        assert_eq!(cold.tokens, second.tokens, "{sampling:?}: the cold run's tokens");
        assert_eq!(messages[4], Message::assistant(cold.text));
    }
}

/// The error's message, checked fit for a user.
fn message(e: Error) -> String {
    let m = e.to_string();
    common::assert_clean_message(&m);
    m
}

#[test]
fn bad_input_is_an_error() {
    // A missing file: the path and the OS's reason.
    let missing = std::env::temp_dir().join("wgpu-llm-api-test-missing.gguf");
    let e = Engine::load(&missing).err().expect("a missing file is an error");
    assert!(matches!(e, Error::Io { .. }), "{e:?}");
    let m = message(e);
    assert!(m.contains("wgpu-llm-api-test-missing.gguf") && m.to_lowercase().contains("no such file"), "{m}");

    let mut engine = engine();
    // Sampling parameters out of range.
    let e = engine.generate("hi").temperature(-1.0).run().expect_err("temperature < 0 is an error");
    assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
    let m = message(e);
    assert!(m.contains("temperature must be a finite number >= 0") && m.contains("got -1"), "{m}");
    let d = Sampling::default();
    for (sampling, needle) in [
        (Sampling { temperature: f32::NAN, ..d }, "temperature must be"),
        (Sampling { top_p: 0.0, ..d }, "top_p must be"),
        (Sampling { min_p: 1.0, ..d }, "min_p must be"),
    ] {
        let req = Request { sampling, ..Request::new("hi") };
        let e = engine.run(&req, &mut |_| Ok(true)).expect_err("out-of-range sampling is an error");
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        let m = message(e);
        assert!(m.contains(needle), "{m}");
    }
    // A prompt longer than the context (4096 positions by default).
    let long = "word ".repeat(5000);
    let e = engine.generate(long).max_tokens(4).run().expect_err("a prompt beyond the context is an error");
    let m = message(e);
    assert!(m.contains("context holds 4096"), "{m}");
    drop(engine);

    // A context beyond the model's.
    let e = Engine::builder(common::model("smollm2")).ctx(100_000).load().err().expect("ctx beyond the model's");
    let m = message(e);
    assert!(m.contains("context length 100000"), "{m}");
    // Chat with a model that ships no template (Gemma 3 270m's GGUF), refused before a GPU is used.
    let opened = Engine::builder(common::model("gemma3")).open().unwrap();
    let e = opened.prompt_ids(&Request { chat: Some(Chat::default()), ..Request::new("hi") }).expect_err("no template");
    assert!(matches!(e, Error::Template(_)), "{e:?}");
    let m = message(e);
    assert!(m.contains("no chat template"), "{m}");
    assert!(opened.prompt_ids(&Request::new("hi")).is_ok(), "plain text needs no template");
}
