//! Qwen3.5-MoE (Gated DeltaNet + gated attention + sparse MoE with a shared expert) against
//! transformers' own forward: a tiny random `Qwen3_5MoeForCausalLM` (8 layers: three DeltaNet
//! layers, then full attention, twice; 8 experts, top 2, a shared expert of the experts' size as
//! in the 35B-A3B, and a 4-layer variant with a shared expert of another size; partial rotary; GQA)
//! saved by `save_pretrained` (per-expert tensors, (1 + w) norms, conv taps [C, 1, K]) and its f32
//! CPU forward, made by tools/make_qwen35moe_fixture.py (committed: the folder and the fixture).
//!
//! Error budget: the fixture's matrices are f16-representable (the engine's weight type), so both
//! sides compute with the same weights; what differs is the f16 KV cache and the order of f32
//! sums. Logits have standard deviation ~1. The prompt was chosen (of 16 candidates) so that the
//! router top-k choices are as far from a tie as it gets: 0.016 (the 48-token prompt: 0.005), the
//! fixture's min_router_logit_margin, far above the engine's logit errors (~0.0002). Every decode
//! step's logits are checked, not only its argmax (the fixtures' `.steps.f32`).

mod common;

use common::reference::{check_path, check_path_with, Check};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::config::{Arch, Mixer, MlpSpec};

/// Observed on lavapipe: 0.0003 (f16 KV cache, f32 sums in another order); 10x that.
const MAX_ABS: f32 = 0.003;

fn tiny() -> std::path::PathBuf {
    common::fixture_dir().join("models/qwen35moe_tiny")
}

/// The folder reads as its config says: the layer kinds, the stacked experts (from per-expert
/// tensors) and q_proj's rows split into q and the output gate.
#[test]
fn tiny_checkpoint_layout() {
    let ck = Checkpoint::open(&tiny()).unwrap();
    let c = &ck.config;
    assert_eq!(c.arch, Arch::Qwen35Moe);
    let kinds: Vec<bool> = (0..c.num_layers()).map(|l| matches!(c.layer(l).mixer, Mixer::Attention(_))).collect();
    assert_eq!(kinds, [false, false, false, true, false, false, false, true]);
    assert!(matches!(
        c.layer(0).mlp,
        MlpSpec::Moe { experts: 8, top_k: 2, intermediate: 32, shared_intermediate: 32, .. }
    ));
    assert_eq!(ck.raw("blk.0.ffn_gate_exps.weight").unwrap().shape, [8, 32, 64]);
    assert_eq!(ck.raw("blk.0.ffn_down_exps.weight").unwrap().shape, [8, 64, 32]);
    assert_eq!(ck.raw("blk.3.attn_q.weight").unwrap().shape, [128, 64]);
    assert_eq!(ck.raw("blk.3.attn_out_gate.weight").unwrap().shape, [128, 64]);
    match c.layer(3).mixer {
        Mixer::Attention(a) => assert_eq!((a.rope.rotary_dim, a.output_gate, a.qk_norm), (8, true, true)),
        Mixer::DeltaNet(_) => unreachable!(),
    }
}

/// Prompt logits and 16 greedy steps (decode through the recurrent states and the KV cache).
#[test]
fn tiny_matches_transformers() {
    let err = check_path(&tiny(), "qwen35moe_tiny", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
    eprintln!("max |logit error| {err}");
}

/// A 48-token prompt: prefill past `MATVEC_MAX_T` (32) runs the matmul kernels with the norms
/// as dispatches of their own; then as chunks of 40 + 8 (matmul, then matvec, states carried).
#[test]
fn tiny_long_prompt_matches_transformers() {
    check_path(&tiny(), "qwen35moe_tiny_long", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
    check_path(&tiny(), "qwen35moe_tiny_long", Check { max_abs: MAX_ABS, steps: 2, prefill_chunk: Some(40) });
}

/// A shared expert of another size than the experts' runs as its own MLP (the 35B-A3B's, of the
/// experts' size, runs as one more expert of the stack: the tests above).
#[test]
fn separate_shared_expert_matches_transformers() {
    let dir = common::fixture_dir().join("models/qwen35moe_tiny_shared48");
    check_path(&dir, "qwen35moe_tiny_shared48", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
}

/// The same through a chunked prefill (5 tokens a pass: the recurrent states and the conv window
/// carried across passes).
#[test]
fn tiny_chunked_prefill_matches_transformers() {
    check_path(&tiny(), "qwen35moe_tiny", Check { max_abs: MAX_ABS, steps: 2, prefill_chunk: Some(5) });
}

/// Qwen3.5's published layout: experts fused (`experts.gate_up_proj` [E, 2I, H] split into gate
/// and up at load), the multimodal config with the text config nested: the same logits.
#[test]
fn fused_experts_folder_matches_transformers() {
    let dir = common::mlx::qwen35moe_tiny("fused");
    check_path(&dir, "qwen35moe_tiny", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
}

/// mlx-lm's converted folder (its names: stacked `switch_mlp` experts, conv taps [C, K, 1], the
/// norms' 1 already added; bf16) against mlx-lm's own forward in f32 over the same weights.
#[test]
fn mlx_folder_matches_mlx_lm() {
    let dir = common::mlx::qwen35moe_tiny("mlx");
    check_path(&dir, "qwen35moe_tiny_mlx", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
}

/// mlx-lm's 4-bit conversion (group 64; routers 8-bit; layers too narrow for a group stay bf16)
/// against mlx-lm's own forward over the same quantized weights. mlx's quantized matmul sums in
/// another order (scale times the quants' dot product, plus bias times the input's sum): observed
/// 0.003 on the prompt and 0.001-0.010 over the 16 decode steps (no drift, no flipped expert: a
/// flip moves logits by ~0.1), so its bound is 2x the largest.
#[test]
fn mlx4_folder_matches_mlx_lm() {
    let dir = common::mlx::qwen35moe_tiny("mlx4");
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(ck.raw("blk.0.ffn_gate_exps.weight").unwrap().dtype.name(), "mlx4_g64_bf16");
    assert_eq!(ck.raw("blk.0.ffn_gate_inp.weight").unwrap().dtype.name(), "mlx8_g64_bf16");
    check_path(&dir, "qwen35moe_tiny_mlx4", Check { max_abs: 0.02, steps: 16, prefill_chunk: None });
}

/// The same folder with every one-token projection that can read x staged apart doing so (the
/// norms run apart and stage their rows): the full-attention layers' q/k/v and output gate read one
/// staging (a projection that cannot, e.g. an 8-bit router, keeps its input as it is); still
/// mlx-lm's forward, with the bound of the test above, through 9 decode steps. (At the 10th a
/// router meets a near-tie that the norm's rounding decides: the same model with its norms apart
/// and fused, nothing staged, differs by 0.001-0.009 in the logits before it, 1.15 at it, then
/// 0.63, 0.17, 0.07: a flipped expert whose trace fades.)
#[test]
fn mlx4_staged_inputs_match_mlx_lm() {
    let dir = common::mlx::qwen35moe_tiny("mlx4");
    let setup = common::reference::stage_every_row;
    let plan = common::reference::one_token_plan(&dir, &setup);
    assert!(plan.iter().any(|(n, v)| n == "matvec_quant:main" && v.split('+').any(|f| f == "XG")), "{plan:?}");
    check_path_with(&dir, "qwen35moe_tiny_mlx4", Check { max_abs: 0.02, steps: 9, prefill_chunk: None }, &setup);
}

/// mlx-lm's 4-bit conversion at group 32, so the experts' down projections (32 wide) are quantized
/// too: the 24-token prefill runs both expert projections grouped by expert (`ops::moe::moe_group`,
/// 72 slots over 9 experts), decode per slot; against mlx-lm's own 4-bit forward, the bound of
/// the group-64 test.
#[test]
fn mlx4_g32_folder_matches_mlx_lm() {
    let dir = common::mlx::qwen35moe_tiny("mlx4g32");
    let ck = Checkpoint::open(&dir).unwrap();
    for t in ["blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight"] {
        assert_eq!(ck.raw(t).unwrap().dtype.name(), "mlx4_g32_bf16", "{t}");
    }
    let err = check_path(&dir, "qwen35moe_tiny_mlx4g32", Check { max_abs: 0.02, steps: 16, prefill_chunk: None });
    eprintln!("max |logit error| {err}");
}

/// The tiny model written as llama.cpp's converter writes a `qwen35moe` GGUF (its names, the
/// `(1 + w)` norms with the 1 added, `ssm_a = -exp(A_log)`, q and gate fused per head, conv taps
/// [C, K], the linear layers' value heads reordered so that GGUF head `i·Hk + g` is
/// transformers' head `g·r + i`, r = Hv / Hk: in qkv's and z's rows, b, a, A_log, dt_bias, the
/// conv's value channels and out_proj's columns), all f32; no tokenizer.
fn tiny_as_gguf(path: &std::path::Path) {
    use wgpu_llm::loader::gguf::{GgufValue, GgufWriter};
    let ck = Checkpoint::open(&tiny()).unwrap();
    let c = &ck.config;
    let f = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let shape = ck.raw_shape(name).unwrap();
        let v = ck.f32(name, &shape).unwrap();
        // The conv taps [C, 1, K] as llama.cpp stores them: [C, K].
        let shape = if name.ends_with("ssm_conv1d.weight") { vec![shape[0], shape[2]] } else { shape };
        (shape, v)
    };
    let Mixer::DeltaNet(d) = c.layer(0).mixer else { panic!("layer 0 is a Gated DeltaNet layer") };
    let (hk, hv, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
    let r = hv / hk;
    // GGUF value head j = i·Hk + g holds transformers' head g·r + i.
    let hf_head = |j: usize| (j % hk) * r + j / hk;
    // Rows in blocks of `block` per value head from `start`, reordered.
    let reorder_rows = |v: &[f32], cols: usize, start: usize, block: usize| -> Vec<f32> {
        let mut out = v.to_vec();
        for j in 0..hv {
            let (dst, src) = (start + j * block, start + hf_head(j) * block);
            out[dst * cols..(dst + block) * cols].copy_from_slice(&v[src * cols..(src + block) * cols]);
        }
        out
    };
    let mut w = GgufWriter::new();
    w.add_qwen35moe_config(c).unwrap();
    // The layer kinds as a per-layer list, as llama.cpp's newer converters write them (the
    // writer chose full_attention_interval 4, which the reader also takes).
    w.remove_metadata("qwen35moe.full_attention_interval");
    let recurrent: Vec<GgufValue> =
        (0..c.num_layers()).map(|l| GgufValue::Bool(matches!(c.layer(l).mixer, Mixer::DeltaNet(_)))).collect();
    w.add_metadata("qwen35moe.attention.recurrent_layers", GgufValue::Array(recurrent));
    w.add_metadata("tokenizer.ggml.model", "none");
    let put = |w: &mut GgufWriter, name: &str, (shape, v): (Vec<usize>, Vec<f32>)| {
        w.add_f32(name, &shape, &v).unwrap();
    };
    for name in ["token_embd.weight", "output_norm.weight", "output.weight"] {
        if ck.has(name) {
            put(&mut w, name, f(name));
        }
    }
    for l in 0..c.num_layers() {
        let b = |s: &str| format!("blk.{l}.{s}");
        put(&mut w, &b("attn_norm.weight"), f(&b("attn_norm.weight")));
        put(&mut w, &b("post_attention_norm.weight"), f(&b("ffn_norm.weight")));
        match c.layer(l).mixer {
            Mixer::Attention(at) => {
                let ((qs, qv), (_, gv)) = (f(&b("attn_q.weight")), f(&b("attn_out_gate.weight")));
                let head = at.head_dim * qs[1];
                let mut fused = Vec::new();
                for h in 0..at.heads {
                    fused.extend_from_slice(&qv[h * head..(h + 1) * head]);
                    fused.extend_from_slice(&gv[h * head..(h + 1) * head]);
                }
                put(&mut w, &b("attn_q.weight"), (vec![2 * qs[0], qs[1]], fused));
                for s in
                    ["attn_k.weight", "attn_v.weight", "attn_output.weight", "attn_q_norm.weight", "attn_k_norm.weight"]
                {
                    put(&mut w, &b(s), f(&b(s)));
                }
            }
            Mixer::DeltaNet(_) => {
                let (s, v) = f(&b("ssm_in_qkv.weight"));
                put(&mut w, &b("attn_qkv.weight"), (s.clone(), reorder_rows(&v, s[1], 2 * hk * dk, dv)));
                let (s, v) = f(&b("ssm_in_z.weight"));
                put(&mut w, &b("attn_gate.weight"), (s.clone(), reorder_rows(&v, s[1], 0, dv)));
                for n in ["ssm_beta.weight", "ssm_alpha.weight"] {
                    let (s, v) = f(&b(n));
                    put(&mut w, &b(n), (s.clone(), reorder_rows(&v, s[1], 0, 1)));
                }
                let (s, v) = f(&b("ssm_conv1d.weight"));
                put(&mut w, &b("ssm_conv1d.weight"), (s.clone(), reorder_rows(&v, s[1], 2 * hk * dk, dv)));
                let (s, v) = f(&b("ssm_dt_bias.weight"));
                put(&mut w, &b("ssm_dt.bias"), (s, reorder_rows(&v, 1, 0, 1)));
                let (s, v) = f(&b("ssm_a_log.weight"));
                let a: Vec<f32> = reorder_rows(&v, 1, 0, 1).iter().map(|x| -x.exp()).collect();
                put(&mut w, &b("ssm_a"), (s, a));
                put(&mut w, &b("ssm_norm.weight"), f(&b("ssm_norm.weight")));
                // out_proj's columns: transpose, reorder the rows, transpose back.
                let (s, v) = f(&b("ssm_out.weight"));
                let (rows, cols) = (s[0], s[1]);
                let t: Vec<f32> = (0..cols * rows).map(|i| v[(i % rows) * cols + i / rows]).collect();
                let t = reorder_rows(&t, rows, 0, dv);
                let back: Vec<f32> = (0..rows * cols).map(|i| t[(i % cols) * rows + i / cols]).collect();
                put(&mut w, &b("ssm_out.weight"), (s, back));
            }
        }
        for s in ["ffn_gate_inp.weight", "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight"] {
            put(&mut w, &b(s), f(&b(s)));
        }
        let (s, v) = f(&b("ffn_gate_inp_shexp.weight"));
        put(&mut w, &b("ffn_gate_inp_shexp.weight"), (vec![s[1]], v));
        for s in ["ffn_gate_shexp.weight", "ffn_up_shexp.weight", "ffn_down_shexp.weight"] {
            put(&mut w, &b(s), f(&b(s)));
        }
    }
    w.write(path).unwrap();
}

/// The same model from a GGUF in llama.cpp's `qwen35moe` layout matches transformers as the
/// folder does (the value heads run in llama.cpp's order, tiled over the key heads).
#[test]
fn tiny_gguf_matches_transformers() {
    let path = std::env::temp_dir().join(format!("qwen35moe_tiny_{}.gguf", std::process::id()));
    tiny_as_gguf(&path);
    let ck = Checkpoint::open(&path).unwrap();
    match ck.config.layer(0).mixer {
        Mixer::DeltaNet(d) => assert!(d.kv_tiled && d.v_heads > d.k_heads, "{d:?}"),
        Mixer::Attention(_) => unreachable!(),
    }
    let err = check_path(&path, "qwen35moe_tiny", Check { max_abs: MAX_ABS, steps: 16, prefill_chunk: None });
    let _ = std::fs::remove_file(&path);
    eprintln!("max |logit error| {err}");
}
