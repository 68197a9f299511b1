//! The engine against an independent implementation: Hugging Face transformers (CPU, f32) run
//! on the same GGUF weights (tools/make_reference.py wrote tests/fixtures/reference/).
//!
//! For each fixture: last-position logits of the prompt (max abs error, top-5), then the 16
//! greedy steps teacher-forced with the reference tokens: at every step the engine's argmax
//! must equal the reference token, unless the reference's own top-1/top-2 margin is within the
//! logit error bound (a near-tie that f16 weights may legitimately flip), which is reported.
//!
//! Error budget: the engine keeps weights in f16 (dequantized Q4/Q5/Q6/Q8 values rounded to
//! f16: relative error ≤ 2^-11 per weight) and the KV cache in f16, and accumulates in f32;
//! the reference is f32 throughout. Measured on lavapipe: 0.026 max abs error (SmolLM2 chat)
//! on logits of magnitude ~30; `MAX_ABS` = 0.1 leaves 4x margin, and a real bug (a wrong RoPE
//! pair, a missing norm offset, an off-by-one window) moves logits by whole units.

mod common;

use wgpu_llm::loader::Checkpoint;

const MAX_ABS: f32 = 0.1;

use common::reference::{check_path, Check};

fn check(model_name: &str, fixture: &str, steps: usize) {
    check_path(&common::model(model_name), fixture, Check { max_abs: MAX_ABS, steps, prefill_chunk: None });
}

#[test]
fn smollm2_chat() {
    check("smollm2", "smollm2_chat", 16);
}

#[test]
fn smollm2_long_prompt() {
    check("smollm2", "smollm2_long", 4);
}

#[test]
fn qwen05_chat() {
    check("qwen05", "qwen05_chat", 16);
}

/// `smollm2_chat` with the layer norms run apart and staging x for the projections after them (the
/// path of `WGPU_LLM_NORMS_APART=1` with the free rule at every row length: `rms_norm_staged`, then
/// the matvec's XG variant on x staged apart), against the same transformers fixture.
#[test]
fn smollm2_chat_norms_staged() {
    use wgpu_llm::ops::matmul::gguf::StageApart;
    // (SmolLM2's Q4_1 rows take the integer dot products; Qwen2.5-0.5B's Q5_0 / Q8_0 ones do not.)
    let path = common::model("smollm2");
    let rule = StageApart { k: usize::MAX, free_k: 32, free_n: 0 };
    let setup = |g: &wgpu_llm::gpu::Gpu| common::reference::staged(g, rule);
    common::reference::check_path_with(
        &path,
        "smollm2_chat",
        Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None },
        &setup,
    );
    // The one-token plan: the norms stage for the projections whose types take x staged apart.
    let plan = common::reference::one_token_plan(&path, &setup);
    let has = common::reference::has_flag;
    let staged_norms = plan.iter().filter(|(n, v)| n == "rms_norm:main" && has(v, "STAGE")).count();
    let xg = plan.iter().filter(|(n, v)| n == "matvec_quant:main" && has(v, "XG")).count();
    eprintln!("{staged_norms} norms stage, {xg} projections read x staged apart");
    assert!(staged_norms > 0 && xg >= staged_norms, "{plan:?}");
    assert!(!plan.iter().any(|(n, _)| n == "quantize_x16:main"), "{plan:?}");
}

#[test]
fn gemma3_plain() {
    check("gemma3", "gemma3_plain", 16);
}

#[test]
fn gemma3_long_prompt_sliding_window() {
    check("gemma3", "gemma3_long", 4);
}

/// MLX 4-bit (group 64) SmolLM2 made by mlx-lm's own converter (tests/common/mlx.rs), against
/// mlx-lm's own forward on that folder (tools/make_mlx_reference.py: f32 over the same quantized
/// weights; the chat prompt of `smollm2_chat`). The engine reads the packed weights, scales and
/// biases as they are (affine blocks on the GPU), including the quantized, tied embedding.
#[test]
fn smollm2_mlx4_matches_mlx_lm() {
    let dir = common::mlx::smollm2(4, 64);
    let ck = Checkpoint::open(&dir).unwrap();
    let q = ck.raw("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype.name(), "mlx4_g64_bf16", "the folder's weights are MLX 4-bit with bf16 scales");
    assert_eq!(ck.raw("token_embd.weight").unwrap().dtype, q.dtype, "the embedding is quantized too");
    check_path(&dir, "smollm2_mlx4", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
}
