//! The one-dispatch decode attention with the rotation fused and its output staged for the o
//! projection (`ops::attention::attention_staged` with `rope`: `attention_decode`'s ROPE and
//! STAGE8 together) in a real model, against transformers. SmolLM2 has 3 KV heads, no q/k norm and
//! full rotary; the kernel is chosen for it with `WGPU_LLM_ATTN_DECODE_MIN_KV=1` (by default from
//! 8 KV heads), set here for this test binary's process alone (a file of its own for that), and
//! every row reads x staged apart, so the o projections read what the attention staged.

mod common;

use common::reference::Check;

/// The transformers fixture's tolerance (tests/reference.rs: `MAX_ABS`).
const MAX_ABS: f32 = 0.1;

#[test]
fn smollm2_decode_attention_rope_staged_matches_transformers() {
    // The only test of this binary: no other thread reads the environment.
    std::env::set_var("WGPU_LLM_ATTN_DECODE_MIN_KV", "1");
    let path = common::model("smollm2");
    let check = Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None };
    common::reference::check_path_with(&path, "smollm2_chat", check, &common::reference::stage_every_row);
    // Every layer's attention is the decode kernel with the rotation fused and, where the adapter
    // has subgroups of 8+, its output staged for the o projection after it (XG).
    let plan = common::reference::one_token_plan(&path, &common::reference::stage_every_row);
    let flagged = |i: usize, name: &str, flag: &str| plan[i].0 == name && common::reference::has_flag(&plan[i].1, flag);
    let layers: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].0.starts_with("attention")).collect();
    assert_eq!(layers.len(), 30, "{plan:?}");
    assert!(layers.iter().all(|&i| flagged(i, "attention_decode:main", "ROPE")), "{plan:?}");
    if common::gpu().caps.shuffles8() {
        assert!(layers.iter().all(|&i| flagged(i, "attention_decode:main", "STAGE8")), "{plan:?}");
        assert!(layers.iter().all(|&i| flagged(i + 1, "matvec_quant:main", "XG")), "{plan:?}");
    }
}
