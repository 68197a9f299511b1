//! MLX quantized checkpoints for the tests, made by mlx-lm's own converter from the real SmolLM2
//! GGUF: the GGUF's weights are written as a Hugging Face folder (bf16 safetensors, the
//! tokenizer built from the GGUF's metadata as tokenizer.json), then `tools/make_mlx_model.py`
//! runs `mlx_lm.convert(quantize=True)` on it. Cached beside the GGUF files.

use std::path::{Path, PathBuf};
use std::process::Command;
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::tokenizer::Tokenizer;

/// The model cache of tools/fetch-model.sh.
pub fn cache_dir() -> PathBuf {
    match std::env::var_os("WGPU_LLM_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/wgpu-llm/models"),
    }
}

/// One folder built at a time: tests of one binary that want the same folder would otherwise
/// both build it, the second replacing the folder while the first reads it (a clean cache).
fn one_build() -> std::sync::MutexGuard<'static, ()> {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    BUILDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// SmolLM2-135M-Instruct quantized by mlx-lm (`bits`, `group`), built on first use. Needs
/// `pip install "mlx[cpu]==0.32.4" "mlx-lm==0.32.2"` (fails with that command otherwise).
pub fn smollm2(bits: u32, group: u32) -> PathBuf {
    let _one = one_build();
    let cache = cache_dir();
    let out = cache.join(format!("smollm2-mlx-{bits}bit-g{group}"));
    if out.join("config.json").is_file() && out.join("model.safetensors").is_file() {
        return out;
    }
    let hf = smollm2_hf_built();
    let root = env!("CARGO_MANIFEST_DIR");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&py)
        .arg(format!("{root}/tools/make_mlx_model.py"))
        .args([hf.as_os_str(), out.as_os_str()])
        .args(["--bits", &bits.to_string(), "--group", &group.to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running {py} tools/make_mlx_model.py: {e}"));
    assert!(
        status.status.success(),
        "tools/make_mlx_model.py failed (it needs mlx-lm: pip install \"mlx[cpu]==0.32.4\" \"mlx-lm==0.32.2\"):\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    out
}

/// Runs tools/`script` with `args` under `$PYTHON` (python3), failing loudly with its stderr and what
/// the tools need (numpy, safetensors, mlx-lm).
pub fn run_tool(script: &str, args: &[&std::ffi::OsStr]) {
    let root = env!("CARGO_MANIFEST_DIR");
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&py)
        .arg(format!("{root}/tools/{script}"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {py} tools/{script}: {e}"));
    assert!(
        status.status.success(),
        "tools/{script} failed (it needs numpy, safetensors and mlx-lm: \
         pip install \"mlx[cpu]==0.32.4\" \"mlx-lm==0.32.2\"):\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// transformers' config.json of a llama checkpoint with `c` (bf16 weights).
pub fn llama_hf_config(c: &wgpu_llm::model::config::ModelConfig) -> serde_json::Value {
    use wgpu_llm::model::config::MlpSpec;
    let a = *c.attention(0).expect("an attention layer");
    let MlpSpec::Dense { intermediate, .. } = c.layer(0).mlp else { panic!("a dense MLP") };
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": intermediate,
        "num_hidden_layers": c.num_layers(),
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": a.rope.theta,
        "rope_scaling": null,
        "tie_word_embeddings": c.tie_word_embeddings,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_ids[0],
        "torch_dtype": "bfloat16",
    })
}

/// SmolLM2-135M-Instruct as a Hugging Face folder with bf16 weights (from the real GGUF), built
/// on first use.
pub fn smollm2_hf() -> PathBuf {
    let _one = one_build();
    smollm2_hf_built()
}

/// [`smollm2_hf`] for a caller that holds [`one_build`].
fn smollm2_hf_built() -> PathBuf {
    let hf = cache_dir().join("smollm2-hf-bf16");
    if !hf.join("model.safetensors").is_file() {
        write_hf_folder(&super::model("smollm2"), &hf);
    }
    hf
}

/// Writes the GGUF checkpoint (llama architecture) as a Hugging Face folder: transformers'
/// tensor names (Q/K rows back in HF order: the loader's fixups), bf16, tied embeddings stored
/// once; config.json, tokenizer.json (from the GGUF metadata), tokenizer_config.json.
pub fn write_hf_folder(gguf: &Path, dir: &Path) {
    let ck = Checkpoint::open(gguf).unwrap();
    let c = &ck.config;
    let tmp = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    let a = *c.attention(0).expect("an attention layer");
    let wgpu_llm::model::config::MlpSpec::Dense { intermediate: f, .. } = c.layer(0).mlp else { panic!("a dense MLP") };
    let (h, q, kv) = (c.hidden_size, a.q_dim(), a.kv_dim());
    let mut names: Vec<(String, String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![c.vocab_size, h]),
        ("model.norm.weight".into(), "output_norm.weight".into(), vec![h]),
    ];
    for i in 0..c.num_layers() {
        for (hf, gg, shape) in [
            ("input_layernorm", "attn_norm", vec![h]),
            ("self_attn.q_proj", "attn_q", vec![q, h]),
            ("self_attn.k_proj", "attn_k", vec![kv, h]),
            ("self_attn.v_proj", "attn_v", vec![kv, h]),
            ("self_attn.o_proj", "attn_output", vec![h, q]),
            ("post_attention_layernorm", "ffn_norm", vec![h]),
            ("mlp.gate_proj", "ffn_gate", vec![f, h]),
            ("mlp.up_proj", "ffn_up", vec![f, h]),
            ("mlp.down_proj", "ffn_down", vec![h, f]),
        ] {
            names.push((format!("model.layers.{i}.{hf}.weight"), format!("blk.{i}.{gg}.weight"), shape));
        }
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = names
        .into_iter()
        .map(|(hf, gg, shape)| {
            let v = ck.f32(&gg, &shape).unwrap();
            let bytes = v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect();
            (hf, shape, bytes)
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = data
        .iter()
        .map(|(n, s, b)| {
            (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::BF16, s.clone(), b).unwrap())
        })
        .collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(meta), &tmp.join("model.safetensors")).unwrap();
    let config = llama_hf_config(c);
    std::fs::write(tmp.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let tok = Tokenizer::from_source(&ck.tokenizer, c.add_bos, c.bos_token_id).unwrap();
    std::fs::write(tmp.join("tokenizer.json"), tok.inner().to_string(false).unwrap()).unwrap();
    let tcfg = serde_json::json!({
        "add_bos_token": c.add_bos,
        "bos_token": ck.bos_token,
        "eos_token": ck.eos_token,
        "chat_template": ck.chat_template,
        "model_max_length": c.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
    });
    std::fs::write(tmp.join("tokenizer_config.json"), tcfg.to_string()).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    std::fs::rename(&tmp, dir).unwrap();
}

/// The tiny Qwen3.5-MoE fixture (tests/fixtures/models/qwen35moe_tiny) in another layout, built
/// on first use by tools/make_qwen35moe_mlx.py: `"fused"` (transformers' names with the experts
/// fused as Qwen3.5's published checkpoints store them; numpy + safetensors only), `"mlx"`
/// (mlx-lm's converter, bf16), `"mlx4"` (mlx-lm's converter, 4-bit group 64; the routers 8-bit) or
/// `"mlx4g32"` (4-bit group 32: the experts' down projections, 32 wide, quantized too).
pub fn qwen35moe_tiny(layout: &str) -> PathBuf {
    tiny_converted("qwen35moe_tiny", "make_qwen35moe_mlx.py", "fused", layout)
}

/// The tiny Gemma 4 fixture (tests/fixtures/models/gemma4_tiny) in another layout, built on first
/// use by tools/make_gemma4_mlx.py: `"google"` (Google's multimodal layout: names
/// `model.language_model.*`, the text config under `text_config`; numpy + safetensors only),
/// `"mlx"` (mlx-lm's converter, bf16) or `"mlx4"` (mlx-lm's converter, 4-bit group 64).
pub fn gemma4_tiny(layout: &str) -> PathBuf {
    tiny_converted("gemma4_tiny", "make_gemma4_mlx.py", "google", layout)
}

/// tests/fixtures/models/`model` converted by tools/`script` into `layout`: `plain` (the script's
/// layout without mlx-lm), `"mlx"`, `"mlx4"` or `"mlx4g32"`; cached under a key of the source's content, so a
/// changed fixture model is never met by a stale conversion.
fn tiny_converted(model: &str, script: &str, plain: &str, layout: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let _one = one_build();
    let root = env!("CARGO_MANIFEST_DIR");
    let src = format!("{root}/tests/fixtures/models/{model}");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::read(format!("{src}/{f}")).unwrap_or_else(|e| panic!("{src}/{f}: {e}")).hash(&mut h);
    }
    let out = cache_dir().join(format!("{}-{layout}-{:016x}", model.replace('_', "-"), h.finish()));
    if out.join("config.json").is_file() && out.join("model.safetensors").is_file() {
        return out;
    }
    let py = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut cmd = Command::new(&py);
    cmd.arg(format!("{root}/tools/{script}")).arg(&src).arg(&out);
    match layout {
        l if l == plain => {}
        "mlx" => {
            cmd.args(["--mlx", "--float"]);
        }
        "mlx4" => {
            cmd.args(["--mlx", "--bits", "4", "--group", "64"]);
        }
        "mlx4g32" => {
            cmd.args(["--mlx", "--bits", "4", "--group", "32"]);
        }
        other => panic!("no layout {other}"),
    }
    std::fs::create_dir_all(cache_dir()).unwrap();
    let status = cmd.output().unwrap_or_else(|e| panic!("running {py} tools/{script}: {e}"));
    assert!(
        status.status.success(),
        "tools/{script} failed (it needs numpy, safetensors and for MLX layouts mlx-lm: \
         pip install \"mlx[cpu]==0.32.4\" \"mlx-lm==0.32.2\"):\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    out
}
