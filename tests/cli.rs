//! The binary on bad input: a clear `error: …` on stderr, a non-zero exit, never a panic.
//! And once on good input: a real model answers through `wgpu-llm generate`.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};
use wgpu_llm::loader::gguf::GgufWriter;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wgpu-llm"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-llm-cli-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Asserts a clean failure whose message contains every one of `needles` (case-insensitive).
fn fails_with(out: Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
    assert!(!out.status.success(), "expected failure, got success; stderr:\n{err}");
    assert_eq!(out.status.code(), Some(1), "exit code; stderr:\n{err}");
    assert!(!err.contains("panicked"), "panic:\n{err}");
    assert!(err.contains("error:"), "no error line:\n{err}");
    for n in needles {
        assert!(err.contains(&n.to_lowercase()), "stderr lacks {n:?}:\n{err}");
    }
}

fn generate(model: &std::path::Path, extra: &[&str]) -> Output {
    bin()
        .args(["generate", "--quiet", "--max-tokens", "4", "--prompt", "hi", "--model"])
        .arg(model)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn missing_model_path() {
    let p = scratch("does-not-exist.gguf");
    fails_with(generate(&p, &[]), &["does-not-exist.gguf", "no such file"]);
}

#[test]
fn corrupt_gguf() {
    let p = scratch("garbage.gguf");
    std::fs::write(&p, b"this is not a gguf file at all, just text").unwrap();
    fails_with(generate(&p, &[]), &["corrupt", "garbage.gguf"]);
}

#[test]
fn truncated_real_gguf() {
    let real = std::fs::read(common::model("smollm2")).unwrap();
    let p = scratch("truncated.gguf");
    std::fs::write(&p, &real[..real.len() / 2]).unwrap();
    fails_with(generate(&p, &[]), &["corrupt", "truncated.gguf"]);
}

#[test]
fn unknown_architecture() {
    let p = scratch("mamba.gguf");
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "mamba");
    w.write(&p).unwrap();
    fails_with(generate(&p, &[]), &["unsupported", "mamba"]);
}

#[test]
fn hf_folder_without_config() {
    let d = scratch("empty-hf");
    std::fs::create_dir_all(&d).unwrap();
    fails_with(generate(&d, &[]), &["config.json"]);
}

#[test]
fn out_of_range_sampling_parameters() {
    // Rejected before any file is opened or GPU touched.
    let p = scratch("unused.gguf");
    for (flag, value, name) in [
        ("--temperature", "-1", "temperature"),
        ("--temperature", "NaN", "temperature"),
        ("--top-p", "0", "top_p"),
        ("--top-p", "1.5", "top_p"),
        ("--min-p", "1", "min_p"),
        ("--min-p", "-0.1", "min_p"),
    ] {
        fails_with(generate(&p, &[&format!("{flag}={value}")]), &[name]);
    }
}

#[test]
fn negative_values_reach_the_range_checks() {
    // `--temperature -1` (a separate value, not `=-1`) is a value the range check refuses, not an
    // unknown argument.
    let p = scratch("unused.gguf");
    fails_with(generate(&p, &["--temperature", "-1"]), &["temperature must be", "got -1"]);
    fails_with(generate(&p, &["--min-p", "-0.5"]), &["min_p must be"]);
}

#[test]
fn bench_arguments_are_validated() {
    // Each used to panic (median of no runs; prompt + gen + 1 wrapping) or is out of range; all are
    // refused before a model is built.
    let bench = |extra: &[&str]| {
        bin().args(["bench", "--synthetic", "smollm2-135m:q4_1", "--json"]).args(extra).output().unwrap()
    };
    fails_with(bench(&["--reps", "0"]), &["--reps 0"]);
    fails_with(bench(&["--prompt-tokens", "18446744073709551615"]), &["--prompt-tokens", "at most"]);
    fails_with(bench(&["--gen-tokens", "0"]), &["at least 1"]);
    fails_with(bench(&["--pipeline", "100"]), &["--pipeline 100"]);
    fails_with(bench(&["--submit-steps", "0"]), &["--submit-steps 0"]);
    fails_with(bench(&["--streams", "2", "--submit-steps", "2"]), &["--submit-steps is for one sequence"]);
    fails_with(bench(&["--top-p", "2"]), &["top_p"]);
    fails_with(bench(&["--profile", "0"]), &["--profile 0"]);
    let out = bin().args(["bench", "--synthetic", "llama-70b:q4_k_m"]).output().unwrap();
    fails_with(out, &["unknown synthetic model", "qwen2.5-1.5b"]);
}

/// `bench --json --reps 1` on a synthetic SmolLM2 with `extra`: its report (the run must succeed).
fn bench_json(extra: &[&str]) -> serde_json::Value {
    let out = bin()
        .args(["bench", "--synthetic", "smollm2-135m:q4_1", "--json", "--reps", "1"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_profile_times_every_dispatch() {
    // `--profile` times each dispatch of a decode step: one entry per (kernel, variant, grid), counts
    // adding up to the step's dispatches, every time positive.
    let v = bench_json(&["--prompt-tokens", "4", "--gen-tokens", "2", "--temperature", "0", "--profile", "1"]);
    let rows = v["profile"].as_array().expect("a profile array");
    let count: u64 = rows.iter().map(|r| r["count"].as_u64().unwrap()).sum();
    // The forward pass's dispatches: the step's, less the sampler's.
    let step = v["decode_step"]["dispatches"].as_u64().unwrap();
    assert!(count > 0 && count < step, "{count} profiled dispatches of a {step}-dispatch step");
    assert!(rows.iter().any(|r| r["name"] == "matvec_quant:main" && r["variant"].as_str().unwrap().contains("Q4_1")));
    assert!(rows.iter().all(|r| r["us_total"].as_f64().unwrap() > 0.0), "{rows:?}");
}

#[test]
fn bench_history_times_a_cached_turn() {
    // `--history-tokens`: the first token of a message after a held conversation, cold and with the
    // history kept in the KV cache; the bench itself fails unless both give the same token (seeded
    // sampling, so the RNG's step counter must also line up), and both times are measured.
    let v = bench_json(&["--history-tokens", "40", "--prompt-tokens", "6", "--seed", "7", "--temperature", "0.8"]);
    assert_eq!((v["history_tokens"].as_u64(), v["message_tokens"].as_u64()), (Some(40), Some(6)));
    for k in ["ttft_cold_ms", "ttft_cached_ms"] {
        assert!(v[k].as_f64().is_some_and(|t| t > 0.0), "{k}: {v}");
    }
    // Not with --streams.
    let out = bin()
        .args(["bench", "--synthetic", "smollm2-135m:q4_1", "--history-tokens", "8", "--streams", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--history-tokens") && err.contains("--streams"), "{err}");
}

#[test]
fn no_adapter_for_backend() {
    // This machine has Vulkan (lavapipe) but never Metal.
    if cfg!(target_os = "macos") {
        return;
    }
    let p = common::model("smollm2");
    fails_with(generate(&p, &["--backend", "metal"]), &["no usable gpu adapter"]);
    fails_with(generate(&p, &["--adapter", "99"]), &["--adapter 99"]);
}

#[test]
fn prompt_beyond_context() {
    let p = common::model("smollm2");
    let long = "word ".repeat(40);
    let out = bin()
        .args(["generate", "--quiet", "--temperature", "0", "--ctx", "16", "--prompt", &long, "--model"])
        .arg(&p)
        .output()
        .unwrap();
    fails_with(out, &["context"]);
    let out =
        bin().args(["generate", "--quiet", "--ctx", "100000", "--prompt", "hi", "--model"]).arg(&p).output().unwrap();
    fails_with(out, &["context length 100000"]);
}

#[test]
fn chat_without_template() {
    // Gemma 3 270m's GGUF ships no chat template.
    let p = common::model("gemma3");
    fails_with(generate(&p, &["--chat"]), &["no chat template"]);
}

#[test]
fn real_model_answers() {
    let p = common::model("smollm2");
    let out = bin()
        .args([
            "generate",
            "--temperature",
            "0",
            "--max-tokens",
            "16",
            "--chat",
            "--prompt",
            "What is 2+3? Answer briefly.",
            "--model",
        ])
        .arg(&p)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr:\n{stderr}");
    // transformers' greedy answer from the same weights (tests/fixtures/reference/smollm2_chat.json).
    assert_eq!(stdout.trim(), "The answer is 5.", "stderr:\n{stderr}");
    assert!(stderr.contains("prefill") && stderr.contains("decode") && stderr.contains("stop: Eos"), "{stderr}");
}

#[test]
fn output_errors_stop_generation() {
    let p = common::model("smollm2");
    let args = ["generate", "--seed", "1", "--max-tokens", "400", "--prompt", "Tell me a long story.", "--model"];
    // A full disk is an error.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").unwrap();
    let out = bin().args(args).arg(&p).stdout(full).output().unwrap();
    fails_with(out, &["standard output", "no space left"]);
    // A closed pipe ends generation early and quietly: the reader takes a few bytes and leaves.
    let mut child = bin()
        .args(args)
        .arg(&p)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a closed pipe is not an error; stderr:\n{stderr}");
    assert!(stderr.contains("stop: Caller"), "generation did not stop at the closed pipe:\n{stderr}");
}

#[test]
fn devices_lists_capabilities() {
    // Every adapter's line of capabilities, its limits and its cooperative-matrix configurations
    // (lavapipe has none: "none"; a GPU with tensor cores lists M×N×K and types).
    let out = bin().args(["devices", "--backend", "vulkan"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let adapters = text.lines().filter(|l| l.starts_with('[')).count();
    assert!(adapters >= 1, "{text}");
    for key in ["shader-f16:", "max storage binding:", "cooperative matrices (MxNxK, A/B -> C):"] {
        assert_eq!(text.matches(key).count(), adapters, "{key} once per adapter:\n{text}");
    }
}

#[test]
fn gl_only_when_asked_and_no_mesa_noise() {
    // Headless (no XDG_RUNTIME_DIR), as CI and servers are: the default backends list Vulkan
    // adapters only, and stderr stays empty (no EGL probing, no device-select layer lines).
    let out = bin().args(["devices"]).env_remove("XDG_RUNTIME_DIR").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(stderr.is_empty(), "devices printed on stderr: {stderr}");
    let adapters: Vec<&str> = stdout.lines().filter(|l| l.starts_with('[')).collect();
    assert!(!adapters.is_empty() && adapters.iter().all(|l| !l.contains("(Gl,")), "{stdout}");
    // With --backend gl, GL adapters and nothing else.
    let out = bin().args(["devices", "--backend", "gl"]).env_remove("XDG_RUNTIME_DIR").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().filter(|l| l.starts_with('[')).all(|l| l.contains("(Gl,")), "{stdout}");
}

#[test]
fn quantize_at_load() {
    // A bf16 Hugging Face folder (SmolLM2, written from the real GGUF): --quantize q8 keeps the
    // greedy answer and puts 8-bit affine weights on the GPU; q4 about half of those bytes.
    let hf = common::mlx::smollm2_hf();
    let run = |q: &str| {
        let out = bin()
            .args(["generate", "--chat", "--temperature", "0", "--max-tokens", "10", "--quantize", q])
            .args(["--prompt", "What is the capital of France?", "--model"])
            .arg(&hf)
            .output()
            .unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "--quantize {q}: {stderr}");
        (stdout.into_owned(), stderr.into_owned())
    };
    let mb = |stderr: &str| -> u64 {
        let at = stderr.find("weights ").expect("the summary names the weight bytes") + 8;
        stderr[at..].split(' ').next().unwrap().parse().unwrap()
    };
    let (text, summary) = run("q8");
    assert!(text.contains("Paris"), "{text}");
    assert!(summary.contains("mlx8_g64_f16"), "{summary}");
    let (_, summary4) = run("q4");
    assert!(summary4.contains("mlx4_g64_f16"), "{summary4}");
    // 4.5 and 8.5 bits a weight (f16 scale and bias per 64): 0.53x.
    let (q8, q4) = (mb(&summary), mb(&summary4));
    assert!(q4 * 100 < q8 * 56 && q4 * 100 > q8 * 50, "q4 {q4} MB, q8 {q8} MB");
    // Argument errors: clap's exit status 2 and one error line.
    for (args, needle) in
        [(&["--quantize", "q4", "--dequantize"][..], "cannot be used with"), (&["--quantize", "q3"], "q3")]
    {
        let out = generate(&hf, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.starts_with("error:") && err.contains(needle), "{err}");
    }
}

#[test]
fn generate_holds_its_output_to_a_schema() {
    // `--json-schema`: SmolLM2 answers within the schema (validated), greedy and seeded; a schema
    // that is not one, a missing file and two constraints at once are clear errors.
    let p = common::model("smollm2");
    let schema = r#"{"type":"object","properties":{"answer":{"type":"integer","minimum":0,"maximum":20},
        "unit":{"enum":["apples","pears"]}},"required":["answer","unit"],"additionalProperties":false}"#;
    let file = scratch("schema.json");
    std::fs::write(&file, schema).unwrap();
    let check = jsonschema::validator_for(&serde_json::from_str(schema).unwrap()).unwrap();
    for sampling in [&["--temperature", "0"][..], &["--seed", "3"][..]] {
        let out = bin()
            .args(["generate", "--quiet", "--chat", "--max-tokens", "48", "--prompt", "How many apples? 2+3."])
            .args(["--json-schema", file.to_str().unwrap(), "--model"])
            .arg(&p)
            .args(sampling)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        assert!(check.is_valid(&v), "{sampling:?}: {v} is not valid under the schema");
    }
    std::fs::write(&file, r##"{"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}"##).unwrap();
    fails_with(generate(&p, &["--json-schema", file.to_str().unwrap()]), &["nowhere"]);
    fails_with(generate(&p, &["--json-schema", "/no/such/schema.json"]), &["/no/such/schema.json"]);
    let out = generate(&p, &["--json-schema", file.to_str().unwrap(), "--regex", "a+"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--regex"));
}
