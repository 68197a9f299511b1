//! Shared by the fuzz targets: a scratch path per process, and the corpus's loading path.

#[path = "../../tests/mutation/load.rs"]
pub mod load;

use std::path::PathBuf;

/// A scratch file or folder under the system temp dir, private to this process.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-llm-fuzz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("creating the fuzz scratch folder");
    dir.join(name)
}

/// Loads `path` as `wgpu-llm generate --chat` would before the GPU opens. Any error value is a
/// fine outcome; what the fuzzer looks for is a panic, an abort (allocation past libFuzzer's
/// `-rss_limit_mb`), or a hang (`-timeout`). An error message must still be one short line.
pub fn check(path: &std::path::Path) {
    if let Err(msg) = load::load(path) {
        assert!(msg.len() < 1024 && !msg.is_empty(), "bad message length {}: {:.200}", msg.len(), msg);
        assert!(!msg.chars().any(char::is_control), "control character in {msg:.200?}");
    }
}
