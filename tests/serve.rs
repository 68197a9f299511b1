//! `wgpu-llm serve` with real clients: the `openai` Python package (tests/serve_client.py:
//! chat and text completions, streamed and not, concurrent requests, a disconnect mid-stream,
//! bad requests, the queue limit) and curl (malformed and oversized bodies, raw server-sent
//! events), on SmolLM2-135M. What the server writes is held to what `wgpu-llm generate` writes
//! for the same prompt, parameters and seed, and the server must still answer at the end.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_wgpu-llm");
const CTX: &str = "512";

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the server on a free port and waits for its `listening on` line.
fn start(model: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(BIN)
        .args(["serve", "--model"])
        .arg(model)
        .args(["--port", "0", "--ctx", CTX])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting wgpu-llm serve");
    let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
    let mut seen = String::new();
    let base = loop {
        let line = match lines.next() {
            Some(Ok(l)) => l,
            _ => {
                let _ = child.kill();
                panic!("the server stopped before listening:\n{seen}");
            }
        };
        seen.push_str(&line);
        seen.push('\n');
        if let Some(addr) = line.strip_prefix("listening on ") {
            break addr.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, base }
}

/// `wgpu-llm generate`'s text for the same model and context.
fn generate(model: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["generate", "-q", "--model"])
        .arg(model)
        .args(["--ctx", CTX])
        .args(args)
        .output()
        .expect("running wgpu-llm generate");
    assert!(out.status.success(), "generate failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    text.strip_suffix('\n').expect("generate ends with a newline").to_string()
}

/// curl's response: HTTP status and body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl's status line");
    (
        code.trim().parse().unwrap_or_else(|_| panic!("curl: {text} {}", String::from_utf8_lossy(&out.stderr))),
        body.into(),
    )
}

/// POSTs `data` (curl's `-d`: a string, or `@file`) as JSON.
fn post(url: &str, data: &str, extra: &[&str]) -> (u16, String) {
    curl(&[extra, &[url, "-H", "content-type: application/json", "-d", data]].concat())
}

fn error_of(body: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let err = v["error"].clone();
    assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()) && err["type"].is_string(), "{body}");
    err
}

#[test]
fn openai_clients_against_the_server() {
    let model = common::model("smollm2");
    let server = start(&model, &["--max-batch", "2", "--max-queue", "2", "--max-body-bytes", "65536"]);
    let base = server.base.clone();
    let chat_url = format!("{base}/v1/chat/completions");

    // curl: raw server-sent events end with [DONE].
    let body = r#"{"messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"temperature":0,"stream":true}"#;
    let (code, text) = post(&chat_url, body, &["-N"]);
    assert_eq!(code, 200, "{text}");
    let data: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    assert!(data.len() >= 3, "{text}");
    // Malformed JSON, a body of the wrong shape, an oversized body, an unknown route.
    for bad in [r#"{"messages": [{"role": "user", "content": "hi"}"#, r#"{"messages": 5}"#, "not json", ""] {
        let (code, text) = post(&chat_url, bad, &[]);
        assert_eq!(code, 400, "{bad}: {text}");
        error_of(&text);
    }
    let huge = format!(r#"{{"prompt":"{}","max_tokens":1}}"#, "a".repeat(100_000));
    let file = std::env::temp_dir().join(format!("serve-huge-{}.json", std::process::id()));
    std::fs::write(&file, huge).unwrap();
    let (code, text) = post(&format!("{base}/v1/completions"), &format!("@{}", file.display()), &[]);
    let _ = std::fs::remove_file(&file);
    assert_eq!(code, 413, "{text}");
    error_of(&text);
    let (code, text) = curl(&[&format!("{base}/v1/nothing")]);
    assert_eq!(code, 404, "{text}");
    error_of(&text);

    // The OpenAI client: every check of tests/serve_client.py.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_client.py");
    let out = Command::new("python3").arg(script).arg(&base).output().expect("python3");
    assert!(
        out.status.success(),
        "tests/serve_client.py failed (pip install openai):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the client's JSON");

    // The server's text is `generate`'s, greedy and seeded.
    let q = "What is 2+3? Answer briefly.";
    assert_eq!(
        got["chat_greedy"],
        generate(&model, &["--chat", "--prompt", q, "--temperature", "0", "--max-tokens", "12"])
    );
    let sampled = ["--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--min-p", "0.05", "--seed", "11"];
    assert_eq!(
        got["chat_sampled"],
        generate(&model, &[&["--chat", "--prompt", q, "--max-tokens", "16"][..], &sampled].concat())
    );
    let p = "The capital of France is";
    assert_eq!(
        got["completion_greedy"],
        generate(&model, &["--prompt", p, "--temperature", "0", "--max-tokens", "10"])
    );
    for (prompt, text) in got["concurrent"].as_object().expect("the concurrent texts") {
        let alone = generate(&model, &[&["--chat", "--prompt", prompt, "--max-tokens", "10"][..], &sampled].concat());
        assert_eq!(text, &alone, "{prompt}");
    }

    // Still up, nothing running.
    let (code, text) = curl(&[&format!("{base}/health")]);
    assert_eq!(code, 200, "{text}");
    let h: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!((h["status"].as_str(), h["active"].as_u64(), h["queued"].as_u64()), (Some("ok"), Some(0), Some(0)));
}

#[test]
fn bad_serve_options_are_errors() {
    let model = common::model("smollm2");
    for (args, msg) in [
        (&["--seed", "3"][..], "no --seed"),
        (&["--max-batch", "0"][..], "at least 1"),
        (&["--temperature", "-1"][..], "temperature"),
        (&["--max-batch", "33"][..], "between 1 and 32"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--port", "0", "--model"])
            .arg(&model)
            .args(args)
            .output()
            .expect("running serve");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(msg), "{args:?}: {err}");
        common::assert_clean_message(err.trim());
    }
}
