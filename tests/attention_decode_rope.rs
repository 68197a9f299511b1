//! The one-dispatch decode attention with the rotation fused and its output staged for the o
//! projection (`ops::attention::attention_staged` with `rope`: `attention_decode`'s ROPE and
//! STAGE8 together) in a real model, against transformers. SmolLM2 has 3 KV heads, no q/k norm and
//! full rotary; the kernel is chosen for it by a tuning whose `attn_decode_min_kv` knob is 1 (by
//! default from 8 KV heads), set on a device of this test's own (`Gpu::with_tuning`: no
//! environment), and every row reads x staged apart, so the o projections read what the
//! attention staged.

mod common;

use common::reference::Check;

/// The transformers fixture's tolerance (tests/reference.rs: `MAX_ABS`).
const MAX_ABS: f32 = 0.1;

#[test]
fn smollm2_decode_attention_rope_staged_matches_transformers() {
    let shared = common::gpu();
    let mut tuning = shared.tuning().clone();
    tuning.knobs.attn_decode_min_kv = Some(1);
    let gpu = shared.with_tuning(tuning);
    let path = common::model("smollm2");
    let check = Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None };
    let dir = common::fixture_dir().join("reference");
    common::reference::check_path_on(&gpu, &path, &dir, "smollm2_chat", check, &common::reference::stage_every_row);
    // Every layer's attention is the decode kernel with the rotation fused and, where the adapter
    // has subgroups of 8+, its output staged for the o projection after it (XG).
    let plan = common::reference::one_token_plan_on(&gpu, &path, &common::reference::stage_every_row);
    let flagged = |i: usize, name: &str, flag: &str| plan[i].0 == name && common::reference::has_flag(&plan[i].1, flag);
    let layers: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].0.starts_with("attention")).collect();
    assert_eq!(layers.len(), 30, "{plan:?}");
    assert!(layers.iter().all(|&i| flagged(i, "attention_decode:main", "ROPE")), "{plan:?}");
    if gpu.caps.shuffles8() {
        assert!(layers.iter().all(|&i| flagged(i, "attention_decode:main", "STAGE8")), "{plan:?}");
        assert!(layers.iter().all(|&i| flagged(i + 1, "matvec_quant:main", "XG")), "{plan:?}");
    }
}
