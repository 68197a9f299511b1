//! A chat session ([`wgpu_llm::session::Session`]) keeps its history in the KV cache: a turn
//! prefills only what the conversation adds (the KV cache rolled back to the longest common
//! prefix), and its answer is the answer of a cold run of the whole conversation (greedy and
//! seeded). A model with recurrent layers (the tiny Qwen3.5-MoE) reuses its history where the
//! new conversation extends all of it and re-prefills otherwise; an attention-only one (the tiny
//! Gemma 4) rolls back to any common prefix.
//!
//! The fixtures are the tiny random-weight checkpoints of tests/fixtures/models (a word-level
//! vocabulary `t0`..`t1023`, which decodes and encodes back to the same ids) with a small chat
//! template written next to them; each answer is a few tokens, so lavapipe runs them quickly.
//! The real SmolLM2's session test is in tests/api.rs (which loads it once for all its tests).

mod common;

use std::path::PathBuf;
use wgpu_llm::chat::Message;
use wgpu_llm::decode::StopReason;
use wgpu_llm::engine::Sampling;
use wgpu_llm::{Engine, Error};

/// The tiny fixture `name` copied with a chat template: role words `t4` (system), `t1` (user),
/// `t3` (assistant) before each message, `t2` after it.
fn fixture(name: &str) -> PathBuf {
    // A folder per call: tests running at once never read a file another one is writing.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("wgpu-llm-chat-tests-{}/{name}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = common::fixture_dir().join("models").join(name);
    for f in std::fs::read_dir(&src).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), dir.join(f.file_name())).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), TEMPLATE).unwrap();
    dir
}

const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'system' %}t4{% elif m.role == 'user' %}t1\
{% else %}t3{% endif %} {{ m.content }} t2 {% endfor %}{% if add_generation_prompt %}t3 {% endif %}";

const MAX_TOKENS: usize = 6;

/// One turn as the session ran it.
struct Turn {
    /// The conversation it answered (ending with the user's message).
    conversation: Vec<Message>,
    tokens: Vec<u32>,
    cached: usize,
    prefilled: usize,
    stop: StopReason,
}

fn sampled(seed: u64) -> Sampling {
    Sampling { temperature: 0.9, top_k: 50, top_p: 0.95, min_p: 0.0, seed: Some(seed) }
}

/// The prompt length of `conversation` through the template.
fn prompt_len(engine: &Engine, conversation: &[Message]) -> usize {
    let req = wgpu_llm::engine::Request {
        chat: Some(wgpu_llm::engine::Chat { system: None, messages: conversation.to_vec() }),
        ..Default::default()
    };
    engine.prompt_ids(&req).unwrap().len()
}

/// Sends `text` and checks what the session reports; returns the turn and the positions the KV
/// cache held before it.
fn send(chat: &mut wgpu_llm::session::Session, text: &str) -> (Turn, usize) {
    let held = chat.cached_tokens();
    let mut conversation = chat.messages().to_vec();
    conversation.push(Message::user(text));
    let mut pieces = String::new();
    let answer = chat
        .send(text, |p| {
            pieces.push_str(p);
            Ok(true)
        })
        .unwrap();
    assert_eq!(pieces, answer.text);
    assert_eq!(chat.messages().last(), Some(&Message::assistant(answer.text.clone())));
    let s = &answer.stats;
    assert_eq!(s.cached_tokens + s.prompt_tokens, prompt_len(chat.engine(), &conversation));
    assert!(s.cached_tokens <= held);
    // The model holds the prompt and the answer but its last token.
    assert_eq!(chat.cached_tokens(), s.cached_tokens + s.prompt_tokens + answer.tokens.len() - 1);
    assert_eq!(chat.engine().model().pos, chat.cached_tokens());
    let turn =
        Turn { conversation, tokens: answer.tokens, cached: s.cached_tokens, prefilled: s.prompt_tokens, stop: s.stop };
    (turn, held)
}

/// Three turns, then a cleared conversation, then an edited earlier message; every turn's tokens
/// are checked against a cold run of its conversation afterwards, on the same engine.
fn session_matches_cold_runs(name: &str, sampling: Sampling) {
    let mut engine = Engine::builder(fixture(name)).ctx(256).load().unwrap();
    let recurrent = engine.model().is_recurrent();
    let mut turns = Vec::new();
    {
        let mut chat = engine.session().system("t9 t8").max_tokens(MAX_TOKENS).sampling(sampling);
        let (first, held) = send(&mut chat, "t5 t6 t7");
        assert_eq!((held, first.cached), (0, 0));
        turns.push(first);
        // The next turns extend the conversation: all the model holds is reused (the vocabulary
        // encodes an answer back to the tokens sampled), on either kind of model.
        for text in ["t10 t11", "t12"] {
            let (t, held) = send(&mut chat, text);
            assert_eq!(t.cached, held, "{name}: turn {} reuses the whole history", turns.len());
            assert!(t.prefilled < 8, "{name}: only the new message and the template's words are prefilled");
            turns.push(t);
        }
        // A cleared conversation shares the system message and the user's word with the history.
        chat.clear();
        assert_eq!(chat.messages(), [Message::system("t9 t8")]);
        turns.push(send(&mut chat, "t20 t21").0);
        // An edited earlier message: the common prefix ends inside the history.
        let mut edited = chat.messages().to_vec();
        edited[1].content = "t20 t22".into();
        chat.set_messages(edited);
        turns.push(send(&mut chat, "t30").0);
    }
    let [.., cleared, edited] = &turns[..] else { unreachable!() };
    if recurrent {
        // The common prefix is not where the model's recurrent state is kept: re-prefilled.
        assert_eq!((cleared.cached, edited.cached), (0, 0), "{name}");
    } else {
        // `t4 t9 t8 t2 t1` and then `t4 t9 t8 t2 t1 t20`.
        assert_eq!((cleared.cached, edited.cached), (5, 6), "{name}");
    }
    for (i, t) in turns.iter().enumerate() {
        assert_eq!(t.stop, StopReason::MaxTokens);
        let cold = engine.chat(&t.conversation).max_tokens(MAX_TOKENS).sampling(sampling).run().unwrap();
        assert_eq!(cold.stats.prompt_tokens, t.cached + t.prefilled);
        assert_eq!(t.tokens, cold.tokens, "{name}, turn {i} ({} reused): the cold run's tokens", t.cached);
    }
    // Seeded sampling draws from the distribution: not the greedy answer everywhere.
    if sampling.temperature > 0.0 {
        let greedy = engine.chat(&turns[0].conversation).max_tokens(MAX_TOKENS).temperature(0.0).run().unwrap();
        assert_ne!(greedy.tokens, turns[0].tokens, "{name}: the seeded answer is the greedy one");
    }
}

#[test]
fn attention_session_gives_the_cold_tokens() {
    for sampling in [Sampling::greedy(), sampled(7)] {
        session_matches_cold_runs("gemma4_tiny", sampling);
    }
}

#[test]
fn recurrent_session_gives_the_cold_tokens() {
    for sampling in [Sampling::greedy(), sampled(11)] {
        session_matches_cold_runs("qwen35moe_tiny", sampling);
    }
}

/// A turn that does not fit the context is an error that leaves the conversation as it was; the
/// session goes on after `/clear`, and an answer stopped by the caller joins the conversation.
#[test]
fn a_turn_past_the_context_is_an_error_and_the_session_goes_on() {
    let mut engine = Engine::builder(fixture("gemma4_tiny")).ctx(24).load().unwrap();
    let mut chat = engine.session().max_tokens(MAX_TOKENS).sampling(Sampling::greedy());
    chat.send("t5 t6", |_| Ok(true)).unwrap();
    let before = chat.messages().to_vec();
    let long = vec!["t7"; 30].join(" ");
    let err = chat.send(long, |_| Ok(true)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let msg = err.to_string();
    common::assert_clean_message(&msg);
    assert!(msg.contains("context"), "{msg}");
    assert_eq!(chat.messages(), before, "a failed turn changes nothing");
    assert_eq!(chat.cached_tokens(), 0, "and forgets the KV history");
    chat.clear();
    let mut n = 0;
    let stopped = chat
        .send("t8", |_| {
            n += 1;
            Ok(n < 2)
        })
        .unwrap();
    assert_eq!((stopped.stats.stop, stopped.tokens.len()), (StopReason::Caller, 2));
    assert_eq!(chat.messages().len(), 2);
    assert_eq!(chat.messages()[1], Message::assistant(stopped.text.clone()));
    // The next turn continues after the stopped answer (all of it reused).
    let next = chat.send("t9", |_| Ok(true)).unwrap();
    assert_eq!(next.stats.cached_tokens, stopped.stats.prompt_tokens + 1);
}

/// `wgpu-llm chat` at a terminal (a pseudo-terminal driven by tests/chat_pty.py).
#[cfg(feature = "cli")]
mod terminal {
    use super::fixture;
    use serde_json::Value;
    use std::process::{Command, Stdio};

    /// Runs `wgpu-llm chat --model DIR --verbose --temperature 0 ARGS` under a pseudo-terminal
    /// and plays `steps`; returns the driver's report.
    fn drive(args: &[&str], steps: Value) -> Value {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/chat_pty.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(env!("CARGO_BIN_EXE_wgpu-llm"))
            .args(["chat", "--verbose", "--temperature", "0", "--model"])
            .arg(fixture("gemma4_tiny"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), steps.to_string().as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "the driver failed: {}", String::from_utf8_lossy(&out.stdout));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(report.get("timeout").is_none(), "a step timed out: {report:#}");
        // Every step but the last (which leaves) ends at the prompt.
        let outputs = report["steps"].as_array().unwrap();
        assert_eq!(outputs.len(), steps.as_array().unwrap().len(), "{report:#}");
        for out in &outputs[..outputs.len() - 1] {
            assert!(out.as_str().unwrap().ends_with("\n> "), "a step did not end at the prompt: {report:#}");
        }
        report
    }

    fn step(report: &Value, i: usize) -> &str {
        report["steps"][i].as_str().unwrap_or_else(|| panic!("no step {i}: {report:#}"))
    }

    /// The numbers of a turn's `--verbose` line: (prefilled, reused, generated, stop).
    fn turn(out: &str) -> (usize, usize, usize, String) {
        let line = out.lines().find(|l| l.starts_with("[prefill ")).unwrap_or_else(|| panic!("no stats in {out:?}"));
        let number_after = |key: &str| -> usize {
            let at = line.find(key).unwrap_or_else(|| panic!("{key:?} not in {line:?}")) + key.len();
            line[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
        };
        let stop = line.split("stop: ").nth(1).unwrap().split(' ').next().unwrap().to_string();
        (number_after("[prefill "), number_after("tokens ("), number_after("generated "), stop)
    }

    /// The words of a turn's answer (the line after the echoed input, without the terminal's
    /// echo of a Ctrl-C).
    fn answer(out: &str) -> Vec<String> {
        out.lines().nth(1).unwrap_or("").replace("^C", "").split_whitespace().map(str::to_string).collect()
    }

    /// Two turns (the second prefills only its message: the first is still in the KV cache),
    /// `/save`, `/clear`, `/load`, `/help`, an unknown command, then Ctrl-D leaves.
    #[test]
    fn two_turns_save_clear_load_and_ctrl_d() {
        let dir = std::env::temp_dir().join(format!("wgpu-llm-chat-tests-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let saved = dir.join("conversation.json");
        let saved_arg = format!("/save {}", saved.display());
        let steps = serde_json::json!([
            {"line": "t5 t6 t7"},
            {"line": "t10 t11"},
            {"line": saved_arg},
            {"line": "/clear"},
            {"line": "t12"},
            {"line": format!("/load {}", saved.display())},
            {"line": "/help"},
            {"line": "/nonsense"},
            {"line": "/load /does/not/exist.json"},
            {"key": "\u{4}"},
        ]);
        let r = drive(&["--max-tokens", "8", "--system", "t9 t8"], steps);
        assert!(r["banner"].as_str().unwrap().contains("/help"), "{r:#}");
        let (p1, c1, g1, stop1) = turn(step(&r, 0));
        assert_eq!((c1, g1, stop1.as_str()), (0, 8, "MaxTokens"));
        assert_eq!(answer(step(&r, 0)).len(), 8, "{r:#}");
        // `t4 t9 t8 t2 t1 t5 t6 t7 t2 t3`: the system message, the user's, the assistant's header.
        assert_eq!(p1, 10);
        let (p2, c2, g2, _) = turn(step(&r, 1));
        assert_eq!(c2, p1 + g1 - 1, "the second turn reuses all the first left in the KV cache");
        // The first answer's end (`t2`), then `t1 t10 t11 t2 t3` and the last answer token.
        assert_eq!((p2, g2), (7, 8));
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
        let roles: Vec<&str> =
            json["messages"].as_array().unwrap().iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
        assert_eq!(json["messages"][3]["content"], "t10 t11");
        assert_eq!(
            json["messages"][2]["content"].as_str().unwrap().split(' ').collect::<Vec<_>>(),
            answer(step(&r, 0))
        );
        assert!(step(&r, 2).contains("saved 5 messages"), "{r:#}");
        assert!(step(&r, 3).contains("cleared"), "{r:#}");
        // After /clear the system message and the user's header are still in the KV cache.
        let (p3, c3, _, _) = turn(step(&r, 4));
        assert_eq!((p3, c3), (3, 5));
        assert!(step(&r, 5).contains("loaded 5 messages"), "{r:#}");
        assert!(step(&r, 6).contains("/save FILE"), "{r:#}");
        assert!(step(&r, 7).contains("error: unknown command /nonsense"), "{r:#}");
        assert!(step(&r, 8).contains("error: reading /does/not/exist.json"), "{r:#}");
        assert_eq!(r["status"], 0, "Ctrl-D leaves: {r:#}");
        let all = r.to_string();
        assert!(!all.contains("panicked"), "{r:#}");
    }

    /// Ctrl-C during an answer stops it and returns to the prompt; the next turn continues after
    /// the stopped answer; Ctrl-C twice at the prompt leaves.
    #[test]
    fn ctrl_c_stops_an_answer_and_twice_at_the_prompt_leaves() {
        let steps = serde_json::json!([
            {"line": "t5 t6 t7", "interrupt": true},
            {"line": "t10", "interrupt": true},
            {"key": "\u{3}"},
            {"key": "\u{3}"},
        ]);
        let r = drive(&["--max-tokens", "4000"], steps);
        let (p1, c1, g1, stop1) = turn(step(&r, 0));
        assert!(step(&r, 0).contains("[stopped]"), "{r:#}");
        assert_eq!((c1, stop1.as_str()), (0, "Caller"));
        assert!(g1 < 4000, "stopped early: {g1} tokens");
        assert_eq!(answer(step(&r, 0)).len(), g1, "{r:#}");
        let (_, c2, _, stop2) = turn(step(&r, 1));
        assert_eq!((c2, stop2.as_str()), (p1 + g1 - 1, "Caller"), "the stopped answer stays in the KV cache");
        assert!(step(&r, 2).contains("Ctrl-C again"), "{r:#}");
        assert_eq!(r["status"], 0, "the second Ctrl-C at the prompt leaves: {r:#}");
    }
}

/// Bad input: a clear error and a non-zero exit before any prompt.
#[cfg(feature = "cli")]
#[test]
fn chat_on_bad_input_fails_cleanly() {
    use std::process::Command;
    let run = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_wgpu-llm")).arg("chat").args(args).output().unwrap();
    let missing = run(&["--model", "/does/not/exist.gguf"]);
    let no_template = run(&["--model", common::fixture_dir().join("models/gemma4_tiny").to_str().unwrap()]);
    let bad_temperature = run(&["--model", fixture("gemma4_tiny").to_str().unwrap(), "--temperature", "-1"]);
    for (out, needle) in [(missing, "exist.gguf"), (no_template, "template"), (bad_temperature, "temperature")] {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.starts_with("error: ") && err.contains(needle) && !err.contains("panicked"), "{err}");
    }
}
