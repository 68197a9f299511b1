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

/// Starts the server on a free port and waits for its `listening on` line (`--ctx` is [`CTX`]
/// unless `extra` has one).
fn start(model: &Path, extra: &[&str]) -> Server {
    let ctx: &[&str] = if extra.contains(&"--ctx") { &[] } else { &["--ctx", CTX] };
    let mut child = Command::new(BIN)
        .args(["serve", "--model"])
        .arg(model)
        .args(["--port", "0"])
        .args(ctx)
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

/// `response_format` on SmolLM2-135M: a JSON schema holds a chat completion's content (it parses
/// and validates, `finish_reason` "stop"), cut short by `max_tokens` it says "length";
/// `json_object` gives an object; an invalid schema, or a schema that is no schema, is a 400 naming `response_format`.
#[test]
fn response_format_holds_the_output() {
    let model = common::model("smollm2");
    let server = start(&model, &["--max-batch", "2"]);
    let url = format!("{}/v1/chat/completions", server.base);
    let schema = serde_json::json!({"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "rank": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city", "rank"], "additionalProperties": false});
    let ask = |format: serde_json::Value, max_tokens: u32| {
        let body = serde_json::json!({"messages": [{"role": "user", "content": "Name a big city and its rank."}],
            "max_tokens": max_tokens, "temperature": 0, "response_format": format});
        post(&url, &body.to_string(), &[])
    };
    let format = serde_json::json!({"type": "json_schema",
        "json_schema": {"name": "city", "schema": schema, "strict": true}});
    let (code, text) = ask(format.clone(), 64);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let value: serde_json::Value =
        serde_json::from_str(content).unwrap_or_else(|e| panic!("{content:?} is not JSON: {e}"));
    assert!(jsonschema::validator_for(&schema).unwrap().is_valid(&value), "{content} does not follow {schema}");
    // Too few tokens for the schema's two fields: never reported complete.
    let (code, text) = ask(format, 3);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    // Any JSON object.
    let (code, text) = ask(serde_json::json!({"type": "json_object"}), 32);
    assert_eq!(code, 200, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(serde_json::from_str::<serde_json::Value>(content).is_ok_and(|o| o.is_object()), "{content:?}");
    for (format, says) in [
        (
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nowhere"}}}),
            "nowhere",
        ),
        (serde_json::json!({"type": "json_schema", "json_schema": {"name": "x", "schema": [1, 2]}}), "JSON schema"),
        (serde_json::json!({"type": "json_schema", "json_schema": {"name": "x"}}), "schema is missing"),
    ] {
        let (code, text) = ask(format.clone(), 8);
        assert_eq!(code, 400, "{format}: {text}");
        let err = error_of(&text);
        assert_eq!(err["param"], "response_format", "{format}: {text}");
        assert!(err["message"].as_str().unwrap().contains(says), "{format}: {text}");
    }
}

/// `logit_bias` and the penalties change a completion as `generate`'s flags do; bad values are
/// 400s naming the field (a biased token past the vocabulary too).
#[test]
fn logit_controls_match_generate() {
    let model = tiny_model("controls");
    let server = start(&model, &["--max-batch", "1"]);
    let url = format!("{}/v1/completions", server.base);
    let prompt = "Once upon a time";
    let complete = |extra: serde_json::Value| {
        let mut body = serde_json::json!({"prompt": prompt, "max_tokens": 12, "temperature": 0});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, text) = post(&url, &body.to_string(), &[]);
        assert_eq!(code, 200, "{body}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let gen = |flags: &[&str]| {
        generate(&model, &[&["--prompt", prompt, "--max-tokens", "12", "--temperature", "0"], flags].concat())
    };
    let free = complete(serde_json::json!({}));
    assert_eq!(free, gen(&[]));
    let penalized = complete(serde_json::json!({"repeat_penalty": 3, "repeat_last_n": 8, "presence_penalty": 1,
        "frequency_penalty": 0.5, "logit_bias": {"5": 3}}));
    let flags =
        ["--repeat-penalty", "3", "--repeat-last-n", "8", "--presence-penalty", "1", "--frequency-penalty", "0.5"];
    assert_eq!(penalized, gen(&[&flags[..], &["--logit-bias", "5=3"]].concat()));
    assert_ne!(penalized, free);
    let forced = complete(serde_json::json!({"logit_bias": {"70": 100}}));
    assert_eq!(forced, gen(&["--logit-bias", "70=100"]));
    assert_ne!(forced, free);
    for (extra, param) in [
        (serde_json::json!({"logit_bias": {"70": 101}}), "logit_bias"),
        (serde_json::json!({"logit_bias": {"999999999": 1}}), "logit_bias"),
        (serde_json::json!({"presence_penalty": 2.5}), "presence_penalty"),
        (serde_json::json!({"frequency_penalty": "high"}), "frequency_penalty"),
        (serde_json::json!({"repeat_penalty": 0}), "repeat_penalty"),
        (serde_json::json!({"repeat_last_n": -3}), "repeat_last_n"),
    ] {
        let mut body = serde_json::json!({"prompt": prompt, "max_tokens": 4});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (code, text) = post(&url, &body.to_string(), &[]);
        assert_eq!(code, 400, "{body}: {text}");
        assert_eq!(error_of(&text)["param"], param, "{body}: {text}");
    }
}

#[test]
fn bad_serve_options_are_errors() {
    let model = common::model("smollm2");
    for (args, msg) in [
        (&["--seed", "3"][..], "no --seed"),
        (&["--max-batch", "0"][..], "at least 1"),
        (&["--temperature", "-1"][..], "temperature"),
        (&["--max-batch", "33"][..], "between 1 and 32"),
        (&["--header-timeout", "0"][..], "--header-timeout 0: a number of seconds above 0"),
        (&["--shutdown-timeout", "inf"][..], "--shutdown-timeout inf"),
        (&["--max-connections", "0"][..], "--max-connections must be at least 1"),
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

// ---------------------------------------------------------------------------------------------
// `serve` under load and at shutdown, on the tiny Gemma 4 fixture (8 layers of width 64, a
// word-level vocabulary `t0`..`t1023`, no end-of-sequence token: every completion runs to its
// max_tokens), with a chat template added.

/// The tiny fixture in a folder of its own with a chat template (its content, word by word).
fn tiny_model(tag: &str) -> std::path::PathBuf {
    let src = common::fixture_dir().join("models/gemma4_tiny");
    let dir = std::env::temp_dir().join(format!("serve-tiny-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap_or_else(|e| panic!("copying {f}: {e}"));
    }
    let template = r#"{"chat_template": "{% for m in messages %}{{ m.content }} {% endfor %}"}"#;
    std::fs::write(dir.join("tokenizer_config.json"), template).unwrap();
    dir
}

/// A response read off a raw socket.
#[derive(Debug)]
struct Raw {
    status: u16,
    head: String,
    body: String,
}

impl Raw {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    /// The `data:` payloads of a server-sent event stream.
    fn events(&self) -> Vec<&str> {
        self.body.lines().filter_map(|l| l.strip_prefix("data: ")).collect()
    }
}

fn addr(base: &str) -> &str {
    base.strip_prefix("http://").expect("http://")
}

/// An HTTP/1.1 request with `Connection: close`; `body` goes in `pieces` writes `pause` apart.
fn request_text(method: &str, path: &str, body: &str) -> String {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Parses a whole response (a chunked body de-chunked); `None` if the server closed the
/// connection without one.
fn parse_response(bytes: &[u8]) -> Option<Raw> {
    let text = String::from_utf8_lossy(bytes);
    let (head, rest) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked {
        let (mut body, mut rest) = (String::new(), rest);
        loop {
            let (size, after) = rest.split_once("\r\n").expect("a chunk size line");
            let n = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
            if n == 0 {
                break body;
            }
            body.push_str(&after[..n]);
            rest = &after[n + 2..];
        }
    } else {
        rest.to_string()
    };
    Some(Raw { status, head: head.to_string(), body })
}

fn connect(base: &str) -> std::net::TcpStream {
    let s = std::net::TcpStream::connect(addr(base)).expect("connecting to the server");
    s.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
    s
}

/// Sends `body` in `pieces` writes `pause` apart and reads the whole response.
fn exchange(base: &str, method: &str, path: &str, body: &str, pieces: usize, pause: std::time::Duration) -> Raw {
    use std::io::{Read, Write};
    let mut s = connect(base);
    let req = request_text(method, path, body);
    let head_len = req.len() - body.len();
    s.write_all(&req.as_bytes()[..head_len]).unwrap();
    let step = body.len().div_ceil(pieces.max(1)).max(1);
    for part in body.as_bytes().chunks(step) {
        std::thread::sleep(pause);
        s.write_all(part).unwrap();
    }
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes).expect("reading the response");
    parse_response(&bytes).unwrap_or_else(|| panic!("no response to {method} {path} {body}"))
}

fn send(base: &str, method: &str, path: &str, body: &str) -> Raw {
    exchange(base, method, path, body, 1, std::time::Duration::ZERO)
}

/// Starts a stream and reads until its first token; the socket is returned open.
fn stream_started(base: &str, body: &str) -> Result<std::net::TcpStream, String> {
    use std::io::{Read, Write};
    let mut s = connect(base);
    s.write_all(request_text("POST", "/v1/completions", body).as_bytes()).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\":\"t") {
        let n = s.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(String::from_utf8_lossy(&seen).into_owned());
        }
        seen.extend_from_slice(&buf[..n]);
    }
    Ok(s)
}

fn health(base: &str) -> serde_json::Value {
    let r = send(base, "GET", "/health", "");
    assert_eq!(r.status, 200, "{r:?}");
    serde_json::from_str(&r.body).expect("/health's JSON")
}

/// The server's resident memory (Linux), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Asserts an OpenAI error body with status `status` (and `param` when given).
fn assert_error(r: &Raw, status: u16, param: Option<&str>) {
    assert_eq!(r.status, status, "{r:?}");
    let err = error_of(&r.body);
    if let Some(p) = param {
        assert_eq!(err["param"].as_str(), Some(p), "{r:?}");
    }
}

/// Waits until `/health` says nothing runs or waits (a cancelled request frees its sequence at
/// the engine's next step), at most 30 s.
fn wait_idle(base: &str) -> serde_json::Value {
    let t = std::time::Instant::now();
    loop {
        let h = health(base);
        if (h["active"].as_u64(), h["queued"].as_u64()) == (Some(0), Some(0)) || t.elapsed().as_secs() > 30 {
            return h;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Fields of OpenAI's API the server refuses by name (`n` above the 8 sequences, a tool whose
/// name OpenAI does not allow, `tool_choice` without tools: refused by the field's name too).
const UNSUPPORTED: [(&str, &str); 6] = [
    ("suffix", r#""end""#),
    ("best_of", "2"),
    ("n", "9"),
    ("response_format", r#"{"type": "grammar"}"#),
    ("tools", r#"[{"type": "function", "function": {"name": "f g", "parameters": {}}}]"#),
    ("tool_choice", r#""required""#),
];

/// The routes and shapes a client meets before any load: a fresh server's `/health`, the
/// model by id, 404/405/414 bodies, the seed of an unseeded request given back and reproducing
/// its answer, unsupported fields refused by name, fields OpenAI's clients add accepted.
fn check_routes(base: &str) {
    let h = health(base);
    assert_eq!((h["status"].as_str(), h["free_sequences"].as_u64()), (Some("ok"), Some(8)), "{h}");
    let r = send(base, "GET", "/v1/models", "");
    let id = serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["data"][0]["id"].as_str().unwrap().to_string();
    let r = send(base, "GET", &format!("/v1/models/{id}"), "");
    assert_eq!(
        (r.status, serde_json::from_str::<serde_json::Value>(&r.body).unwrap()["id"].as_str()),
        (200, Some(&*id))
    );
    let r = send(base, "GET", "/v1/models/no-such-model", "");
    assert_error(&r, 404, Some("model"));
    assert_error(&send(base, "GET", "/v1/completions", ""), 405, None);
    assert_error(&send(base, "DELETE", "/health", ""), 405, None);
    assert_error(&send(base, "GET", &format!("/v1/models?q={}", "a".repeat(9000)), ""), 414, None);
    assert_error(&send(base, "GET", "/nothing", ""), 404, None);

    let ask = r#"{"prompt": "t1 t2 t3", "max_tokens": 6, "temperature": 1.0, "user": "u", "stream_options": null}"#;
    let r = send(base, "POST", "/v1/completions", ask);
    assert_eq!(r.status, 200, "{r:?}");
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    let seed = r.header("x-seed").expect("an x-seed header").to_string();
    assert_eq!(v["system_fingerprint"].as_str(), Some(&*format!("seed-{seed}")), "{v}");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(0), "{v}");
    let again = ask.replace(r#""user""#, &format!(r#""seed": {seed}, "user""#));
    let r2 = send(base, "POST", "/v1/completions", &again);
    let v2: serde_json::Value = serde_json::from_str(&r2.body).unwrap();
    assert_eq!(v2["choices"][0]["text"], v["choices"][0]["text"], "the seed {seed} did not reproduce {v}: {v2}");

    for (field, value) in UNSUPPORTED {
        let body = format!(r#"{{"prompt": "t1", "max_tokens": 2, "{field}": {value}}}"#);
        assert_error(&send(base, "POST", "/v1/completions", &body), 400, Some(field));
        let body = format!(r#"{{"messages": [{{"role": "user", "content": "t1"}}], "{field}": {value}}}"#);
        assert_error(&send(base, "POST", "/v1/chat/completions", &body), 400, Some(field));
    }
}

/// Slow clients do not starve the others: 64 sockets stalled in their headers and 16 in their
/// bodies while `/health` answers at once; then the first are dropped after the header timeout
/// and the others answered 408.
fn check_slow_sockets(base: &str) {
    use std::io::{Read, Write};
    let t = std::time::Instant::now();
    let mut stalled = Vec::new();
    for i in 0..80 {
        let mut s = connect(base);
        if i < 64 {
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: test\r\ncontent-le").unwrap();
        } else {
            s.write_all(
                b"POST /v1/completions HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"pro",
            )
            .unwrap();
        }
        stalled.push(s);
    }
    for _ in 0..5 {
        let q = std::time::Instant::now();
        health(base);
        assert!(q.elapsed().as_secs_f64() < 2.0, "/health took {:?} beside 80 slow sockets", q.elapsed());
    }
    for (i, mut s) in stalled.into_iter().enumerate() {
        let mut bytes = Vec::new();
        let _ = s.read_to_end(&mut bytes);
        let r = parse_response(&bytes);
        if i < 64 {
            assert!(r.is_none(), "a stalled header got {r:?}");
        } else {
            assert_error(&r.expect("a 408"), 408, None);
        }
    }
    // --header-timeout and --body-timeout are 2 s.
    assert!(t.elapsed().as_secs() < 15, "slow sockets were dropped after {:?}", t.elapsed());
}

/// One request of the load test, by its number: what it sends and what it must get back.
fn load_request(base: &str, i: usize) -> Result<(), String> {
    use std::io::Write;
    let ms = std::time::Duration::from_millis;
    let complete_stream = |r: &Raw| {
        let events = r.events();
        if r.status != 200 || events.last() != Some(&"[DONE]") {
            return Err(format!("an incomplete stream: {r:?}"));
        }
        for e in &events[..events.len() - 1] {
            serde_json::from_str::<serde_json::Value>(e).map_err(|err| format!("{err}: {e}"))?;
        }
        Ok(())
    };
    let prompt = format!("t{} t{} t{}", i % 1000, (i * 7) % 1000, (i * 13) % 1000);
    let (r, want) = match i % 20 {
        0..=5 => {
            let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 4}}"#);
            let r = send(base, "POST", "/v1/completions", &body);
            if r.status == 200 {
                let v: serde_json::Value = serde_json::from_str(&r.body).map_err(|e| format!("{e}: {r:?}"))?;
                if v["usage"]["completion_tokens"].as_u64() != Some(4) {
                    return Err(format!("not 4 tokens: {v}"));
                }
            }
            (r, 200)
        }
        6..=9 => {
            let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 4, "stream": true}}"#);
            let r = send(base, "POST", "/v1/completions", &body);
            if r.status == 200 {
                complete_stream(&r)?;
            }
            (r, 200)
        }
        10..=12 => {
            let body = format!(
                r#"{{"messages": [{{"role": "user", "content": "{prompt}"}}], "max_tokens": 4, "stream": true,
                    "stream_options": {{"include_usage": true}}}}"#
            );
            let r = send(base, "POST", "/v1/chat/completions", &body);
            if r.status == 200 {
                complete_stream(&r)?;
                if !r.body.contains(r#""completion_tokens":4"#) {
                    return Err(format!("no usage: {r:?}"));
                }
            }
            (r, 200)
        }
        13 => {
            let body = format!(r#"{{"messages": [{{"role": "user", "content": "{prompt}"}}], "max_tokens": 3}}"#);
            (send(base, "POST", "/v1/chat/completions", &body), 200)
        }
        14 | 15 => {
            // Cancelled mid-stream: the client goes away after the first token.
            let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 64, "stream": true}}"#);
            return match stream_started(base, &body) {
                Ok(s) => {
                    let _ = s.shutdown(std::net::Shutdown::Both);
                    Ok(())
                }
                // A full queue's 429 ends it too.
                Err(seen) if seen.starts_with("HTTP/1.1 429") => Ok(()),
                Err(seen) => Err(format!("request {i}: the stream ended before its first token: {seen}")),
            };
        }
        16 => (send(base, "POST", "/v1/completions", r#"{"prompt": "t1", "max_tokens": "#), 400),
        17 => {
            let (field, value) = UNSUPPORTED[(i / 20) % UNSUPPORTED.len()];
            let body = format!(r#"{{"prompt": "{prompt}", "{field}": {value}}}"#);
            (send(base, "POST", "/v1/completions", &body), 400)
        }
        18 => {
            // A slow sender, within the body timeout.
            let body = format!(r#"{{"prompt": "{prompt}", "max_tokens": 2}}"#);
            (exchange(base, "POST", "/v1/completions", &body, 4, ms(50)), 200)
        }
        _ => {
            // A client that sends half its headers and goes away.
            let mut s = connect(base);
            s.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n").unwrap();
            drop(s);
            (send(base, "GET", "/health", ""), 200)
        }
    };
    // 429 is a full queue, which a burst may meet.
    if r.status == want || (want == 200 && r.status == 429) {
        if r.status >= 400 {
            error_of(&r.body);
        }
        Ok(())
    } else {
        Err(format!("request {i}: want {want}, got {r:?}"))
    }
}

#[test]
fn serve_under_load() {
    const REQUESTS: usize = 2000;
    const CLIENTS: usize = 32;
    let model = tiny_model("load");
    let server = start(
        &model,
        &["--max-batch", "8", "--max-queue", "64", "--ctx", "256", "--header-timeout", "2", "--body-timeout", "2"],
    );
    let base = server.base.clone();
    let pid = server.child.id();
    check_routes(&base);
    check_slow_sockets(&base);

    // 2,000 requests from 32 clients; the server's memory after the first 100 and the last.
    let t = std::time::Instant::now();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicUsize::new(0);
    let rss_first = std::sync::Mutex::new(None);
    let errors = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= REQUESTS {
                    return;
                }
                if let Err(e) = load_request(&base, i) {
                    errors.lock().unwrap().push(e);
                }
                if done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 == 100 {
                    *rss_first.lock().unwrap() = Some(rss_kib(pid));
                }
            });
        }
    });
    let errors = errors.into_inner().unwrap();
    assert!(errors.is_empty(), "{} failed requests, e.g.:\n{}", errors.len(), errors[..errors.len().min(5)].join("\n"));
    let h = wait_idle(&base);
    assert_eq!((h["active"].as_u64(), h["queued"].as_u64(), h["free_sequences"].as_u64()), (Some(0), Some(0), Some(8)));
    let (first, last) = (rss_first.into_inner().unwrap().unwrap(), rss_kib(pid));
    eprintln!(
        "{REQUESTS} requests in {:.1} s; server RSS after 100: {first} KiB, after {REQUESTS}: {last} KiB",
        t.elapsed().as_secs_f64()
    );
    // Flat: at most 5 % + 8 MiB above the RSS after the first 100 requests (lavapipe, 2,000
    // requests: 192 KiB more).
    assert!(last <= first + first / 20 + 8 * 1024, "RSS grew from {first} KiB to {last} KiB");

    let m = send(&base, "GET", "/metrics", "").body;
    let value = |name: &str| -> f64 {
        let line = m.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} in\n{m}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert!(value("wgpu_llm_generated_tokens_total ") >= 2.0 * REQUESTS as f64, "{m}");
    assert!(value("wgpu_llm_time_to_first_token_seconds_count ") >= 0.7 * REQUESTS as f64, "{m}");
    assert_eq!(value("wgpu_llm_sequences_free "), 8.0, "{m}");
    assert!(value(r#"wgpu_llm_requests_total{route="/v1/completions",code="400"}"#) >= 0.1 * REQUESTS as f64, "{m}");
    let _ = std::fs::remove_dir_all(&model);
}

/// Sends SIGINT (or SIGTERM) to the server.
#[cfg(unix)]
fn signal(server: &Server, sig: libc::c_int) {
    let pid = server.child.id() as libc::pid_t;
    // SAFETY: kill(2) on a child process this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Waits up to `secs` for the server to exit; its status.
#[cfg(unix)]
fn exited_within(server: &mut Server, secs: f64) -> Option<std::process::ExitStatus> {
    let t = std::time::Instant::now();
    while t.elapsed().as_secs_f64() < secs {
        if let Some(st) = server.child.try_wait().unwrap() {
            return Some(st);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    None
}

#[cfg(unix)]
#[test]
fn shutdown_drains_then_a_second_signal_stops_at_once() {
    use std::io::Read;
    let model = tiny_model("shutdown");
    let long = r#"{"prompt": "t1 t2", "max_tokens": 4000, "stream": true}"#;

    // The first signal lets a running stream finish, then the server exits cleanly.
    let mut server = start(&model, &["--ctx", "512"]);
    let mut s =
        stream_started(&server.base, r#"{"prompt": "t1 t2", "max_tokens": 100, "stream": true}"#).expect("a stream");
    signal(&server, libc::SIGINT);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(String::from_utf8_lossy(&rest).contains("data: [DONE]"), "{}", String::from_utf8_lossy(&rest));
    let st = exited_within(&mut server, 10.0).expect("the server did not exit after draining");
    assert!(st.success(), "{st}");

    // A second signal during a long stream ends the server within seconds.
    let mut server = start(&model, &["--ctx", "4096"]);
    let mut s = stream_started(&server.base, long).expect("a stream");
    signal(&server, libc::SIGINT);
    std::thread::sleep(std::time::Duration::from_secs(1));
    assert!(server.child.try_wait().unwrap().is_none(), "the server left without draining");
    let mut buf = [0u8; 4096];
    assert!(s.read(&mut buf).unwrap() > 0, "the stream stopped at the first signal");
    let t = std::time::Instant::now();
    signal(&server, libc::SIGTERM);
    let st = exited_within(&mut server, 5.0).expect("the server still runs 5 s after a second signal");
    assert!(!st.success(), "a forced stop is not a clean exit: {st}");
    eprintln!("exited {:.2} s after the second signal", t.elapsed().as_secs_f64());

    // The drain deadline ends a stream that outlasts it.
    let mut server = start(&model, &["--ctx", "4096", "--shutdown-timeout", "1"]);
    let _s = stream_started(&server.base, long).expect("a stream");
    let t = std::time::Instant::now();
    signal(&server, libc::SIGTERM);
    let st = exited_within(&mut server, 6.0).expect("the server outlived --shutdown-timeout 1 by 5 s");
    assert!(!st.success() && t.elapsed().as_secs_f64() >= 1.0, "{st} after {:?}", t.elapsed());
    let _ = std::fs::remove_dir_all(&model);
}
