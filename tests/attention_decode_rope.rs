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
    let setup = common::reference::stage_every_row;
    common::reference::check_path_with(
        &path,
        "smollm2_chat",
        Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None },
        &setup,
    );
    // The one-token plan: every layer's attention is the decode kernel with the rotation fused
    // and its output staged (where the adapter has subgroups of 8+), and each o projection reads it.
    let plan = common::reference::one_token_plan(&path, &setup);
    let has = |v: &str, f: &str| v.split('+').any(|x| x == f);
    let attn: Vec<&(String, String)> = plan.iter().filter(|(n, _)| n.starts_with("attention")).collect();
    assert_eq!(attn.len(), 30, "{plan:?}");
    assert!(attn.iter().all(|(n, v)| n == "attention_decode:main" && has(v, "ROPE")), "{attn:?}");
    let gpu = common::gpu();
    if gpu.caps.shuffles8() {
        assert!(attn.iter().all(|(_, v)| has(v, "STAGE8")), "{attn:?}");
        let after: Vec<&(String, String)> =
            plan.windows(2).filter(|w| w[0].0 == "attention_decode:main").map(|w| &w[1]).collect();
        assert!(after.iter().all(|(n, v)| n == "matvec_quant:main" && has(v, "XG")), "{after:?}");
    }
}
