//! The model paths with Apple silicon's profile forced on the test adapter (lavapipe):
//! `GpuOptions::emulate` requests the device with Apple's limits (32 KiB of workgroup memory, 31
//! storage bindings a stage, storage bindings under 4 GiB, buffers of at most 4 GiB) and selects
//! the Apple rows of the tuning table (no integer dot products: Metal has no instruction for them,
//! so neither the DP4 matvec nor x staged apart runs), then checks the model's logits against the
//! transformers fixtures tests/reference.rs checks the default device against. What cannot be
//! emulated here: subgroups stay the adapter's size (Apple's are 32 lanes), and MSL is not run
//! (tests/shaders.rs translates every kernel to MSL).

mod common;

use common::reference::{as_is, check_path_on, has_flag, one_token_plan_on, Check};
use wgpu_llm::gpu::{Gpu, GpuOptions};
use wgpu_llm::tuning::Family;

/// The transformers fixtures' tolerance (tests/reference.rs: `MAX_ABS`).
const MAX_ABS: f32 = 0.1;

fn apple() -> Gpu {
    let gpu = Gpu::new(&GpuOptions { emulate: Some(Family::Apple), ..Default::default() })
        .expect("GPU tests need an adapter; install lavapipe: apt-get install mesa-vulkan-drivers libvulkan1");
    let p = &gpu.tuning().profile;
    assert_eq!(p.family, Family::Apple);
    assert!(p.emulated && p.one_pass_per_step && !gpu.tuning().int_dot(), "{p}");
    let l = &gpu.limits;
    assert!(l.max_compute_workgroup_storage_size <= 32 << 10, "{l:?}");
    assert!(l.max_storage_buffers_per_shader_stage <= 31, "{l:?}");
    assert!(l.max_storage_buffer_binding_size < 4 << 30 && l.max_buffer_size <= 4 << 30, "{l:?}");
    gpu
}

fn check(gpu: &Gpu, model: &str, fixture: &str, steps: usize) {
    let dir = common::fixture_dir().join("reference");
    let c = Check { max_abs: MAX_ABS, steps, prefill_chunk: None };
    check_path_on(gpu, &common::model(model), &dir, fixture, c, &as_is);
    // The one-token step takes none of the integer-dot-product paths.
    let plan = one_token_plan_on(gpu, &common::model(model), &as_is);
    assert!(plan.iter().all(|(_, v)| !has_flag(v, "DP4") && !has_flag(v, "XG")), "{plan:?}");
    assert!(!plan.iter().any(|(n, _)| n == "quantize_x16:main"), "{plan:?}");
}

/// SmolLM2 (Q4_1: on the default device its down projections take DP4).
#[test]
fn smollm2_chat_on_apples_profile() {
    check(&apple(), "smollm2", "smollm2_chat", 16);
}

/// Qwen2.5-0.5B (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 rows, mixed-type q/k/v).
#[test]
fn qwen05_chat_on_apples_profile() {
    check(&apple(), "qwen05", "qwen05_chat", 4);
}
