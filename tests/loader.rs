//! Loader integration tests (CPU only): GGUF writer/reader round trips, Hugging Face folders,
//! every kind of bad input giving the right error (and never a panic), and, when the fetched
//! real checkpoints are present under $WGPU_LLM_MODELS, their configs.

mod common;

use common::assert_clean_message;
use half::f16;
use std::path::{Path, PathBuf};
use wgpu_llm::error::Error;
use wgpu_llm::loader::gguf::{self, GgufFile, GgufTokenizerData, GgufValue, GgufWriter};
use wgpu_llm::loader::{unpermute_rope_rows, Checkpoint, DType, TokenizerSource};
use wgpu_llm::model::arch::{self, Hyperparams};
use wgpu_llm::model::config::{Activation, Arch, AttentionSpec, LayerAttention, MlpSpec, ModelConfig};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A fresh scratch path under the system temp dir, unique per test and process.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wgpu-llm-loader-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    let _ = std::fs::remove_dir_all(&p);
    let _ = std::fs::remove_file(&p);
    p
}

fn write(path: &Path, bytes: &[u8]) -> PathBuf {
    std::fs::write(path, bytes).unwrap();
    path.to_path_buf()
}

fn err_of<T>(r: wgpu_llm::error::Result<T>) -> Error {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 2.0 - 1.0
        })
        .collect()
}

fn tiny_hp(arch: Arch) -> Hyperparams {
    Hyperparams {
        arch,
        vocab_size: 64,
        hidden_size: 32,
        intermediate_size: 64,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        rms_norm_eps: 1e-5,
        rope_theta: 10000.0,
        rope_local_theta: None,
        rope_scaling_factor: 1.0,
        max_position_embeddings: 128,
        layer_types: vec![LayerAttention::Full; 2],
        tie_word_embeddings: true,
        attention_bias: false,
        activation: Activation::SiluGated,
        query_pre_attn_scalar: None,
        final_logit_softcapping: None,
        ..Hyperparams::default()
    }
}

/// The model `h` describes, with the tiny tokenizer's special tokens.
fn config_of(h: &Hyperparams) -> ModelConfig {
    ModelConfig { bos_token_id: Some(1), eos_token_ids: vec![2], ..arch::model_config(h) }
}

fn tiny_config(arch: Arch) -> ModelConfig {
    config_of(&tiny_hp(arch))
}

/// A dense model's per-layer facts, read back from its layer specs.
struct Dense {
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
    intermediate_size: usize,
    rope_theta: f32,
    rope_local_theta: Option<f32>,
    rope_scaling_factor: f32,
    layer_attention: Vec<LayerAttention>,
    attention_bias: bool,
    qk_norm: bool,
    sandwich_norm: bool,
    activation: Activation,
    attention_scale: f32,
}

impl Dense {
    fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

fn dense(c: &ModelConfig) -> Dense {
    let att: Vec<AttentionSpec> = (0..c.num_layers()).map(|l| *c.attention(l).expect("attention layers")).collect();
    let full = att.iter().find(|a| a.window.is_none()).unwrap_or(&att[0]);
    let MlpSpec::Dense { intermediate, activation } = c.layer(0).mlp else { panic!("a dense MLP") };
    Dense {
        num_heads: full.heads,
        num_kv_heads: full.kv_heads,
        head_dim: full.head_dim,
        intermediate_size: intermediate,
        rope_theta: full.rope.theta,
        rope_local_theta: att.iter().find(|a| a.window.is_some()).map(|a| a.rope.theta),
        rope_scaling_factor: full.rope.scaling,
        layer_attention: att
            .iter()
            .map(|a| match a.window {
                Some(window) => LayerAttention::Sliding { window },
                None => LayerAttention::Full,
            })
            .collect(),
        attention_bias: full.bias,
        qk_norm: full.qk_norm,
        sandwich_norm: c.layer(0).sandwich_norm,
        activation,
        attention_scale: full.scale,
    }
}

fn tiny_tokenizer(vocab: usize) -> GgufTokenizerData {
    let mut tokens: Vec<String> = (0..vocab).map(|i| format!("tok{i}")).collect();
    tokens[0] = "<unk>".into();
    tokens[1] = "<|im_start|>".into();
    tokens[2] = "<|im_end|>".into();
    tokens[3] = "<|endoftext|>".into();
    GgufTokenizerData {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        scores: (0..vocab).map(|i| -(i as f32)).collect(),
        token_types: (0..vocab).map(|i| if i < 4 { 3 } else { 1 }).collect(),
        merges: vec!["t o".into(), "to k".into()],
        tokens,
        bos_token_id: Some(1),
        eos_token_id: Some(2),
        eot_token_id: None,
        eom_token_id: None,
        unknown_token_id: Some(0),
        padding_token_id: None,
        add_bos_token: false,
        add_eos_token: false,
        add_space_prefix: Some(false),
    }
}

/// The tensors of a model with `cfg` (f32 norms, f16 matrices, Q8_0 embedding), row-major.
fn add_model_tensors(w: &mut GgufWriter, cfg: &ModelConfig) {
    let d = dense(cfg);
    let (h, q, kv, f, v) = (cfg.hidden_size, d.q_dim(), d.kv_dim(), d.intermediate_size, cfg.vocab_size);
    // Q8_0 embedding: scale 1/64, quants counting up.
    let mut emb = Vec::new();
    for b in 0..v * h / 32 {
        emb.extend_from_slice(&f16::from_f32(1.0 / 64.0).to_le_bytes());
        emb.extend((0..32).map(|j| ((b + j) % 50) as u8));
    }
    w.add_tensor("token_embd.weight", DType::Q8_0, &[v, h], emb).unwrap();
    w.add_f32("output_norm.weight", &[h], &values(h, 1)).unwrap();
    if !cfg.tie_word_embeddings {
        w.add_f32_as_f16("output.weight", &[v, h], &values(v * h, 2)).unwrap();
    }
    for i in 0..cfg.num_layers() {
        let s = 100 * (i as u32 + 1);
        w.add_f32(format!("blk.{i}.attn_norm.weight"), &[h], &values(h, s)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.attn_q.weight"), &[q, h], &values(q * h, s + 1)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.attn_k.weight"), &[kv, h], &values(kv * h, s + 2)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.attn_v.weight"), &[kv, h], &values(kv * h, s + 3)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.attn_output.weight"), &[h, q], &values(h * q, s + 4)).unwrap();
        w.add_f32(format!("blk.{i}.ffn_norm.weight"), &[h], &values(h, s + 5)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.ffn_gate.weight"), &[f, h], &values(f * h, s + 6)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.ffn_up.weight"), &[f, h], &values(f * h, s + 7)).unwrap();
        w.add_f32_as_f16(format!("blk.{i}.ffn_down.weight"), &[h, f], &values(h * f, s + 8)).unwrap();
        if d.attention_bias {
            w.add_f32(format!("blk.{i}.attn_q.bias"), &[q], &values(q, s + 9)).unwrap();
            w.add_f32(format!("blk.{i}.attn_k.bias"), &[kv], &values(kv, s + 10)).unwrap();
            w.add_f32(format!("blk.{i}.attn_v.bias"), &[kv], &values(kv, s + 11)).unwrap();
        }
        if d.qk_norm {
            let d = d.head_dim;
            w.add_f32(format!("blk.{i}.attn_q_norm.weight"), &[d], &values(d, s + 12)).unwrap();
            w.add_f32(format!("blk.{i}.attn_k_norm.weight"), &[d], &values(d, s + 13)).unwrap();
        }
        if d.sandwich_norm {
            w.add_f32(format!("blk.{i}.post_attention_norm.weight"), &[h], &values(h, s + 14)).unwrap();
            w.add_f32(format!("blk.{i}.post_ffw_norm.weight"), &[h], &values(h, s + 15)).unwrap();
        }
    }
}

fn tiny_gguf(cfg: &ModelConfig) -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_tokenizer(&tiny_tokenizer(cfg.vocab_size));
    w.add_model_config(cfg);
    w.add_metadata("tokenizer.chat_template", "{{ messages }}");
    add_model_tensors(&mut w, cfg);
    w
}

fn rounded_f16(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
}

// ---------------------------------------------------------------------------------------------
// GGUF round trips
// ---------------------------------------------------------------------------------------------

#[test]
fn gguf_llama_round_trip() {
    let cfg = tiny_config(Arch::Llama);
    let path = tiny_gguf(&cfg).write_to(&scratch("llama.gguf"));
    let ck = Checkpoint::open(&path).unwrap();

    // eos ids: the GGUF eos plus <|endoftext|> found in the vocabulary.
    let want = ModelConfig { eos_token_ids: vec![2, 3], ..cfg.clone() };
    assert_eq!(ck.config, want);
    assert_eq!(ck.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!(ck.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(ck.eos_token.as_deref(), Some("<|im_end|>"));
    match &ck.tokenizer {
        TokenizerSource::Gguf(t) => assert_eq!(*t, tiny_tokenizer(64)),
        other => panic!("{other:?}"),
    }

    let (h, q, kv) = (cfg.hidden_size, dense(&cfg).q_dim(), dense(&cfg).kv_dim());
    assert!(!ck.has("output.weight"));
    assert_eq!(ck.f32("output_norm.weight", &[h]).unwrap(), values(h, 1));
    assert_eq!(ck.raw("blk.1.ffn_down.weight").unwrap().shape, vec![h, 64]);
    assert_eq!(ck.raw("blk.1.ffn_down.weight").unwrap().dtype, DType::F16);
    let down = ck.f16("blk.0.ffn_down.weight", &[h, 64]).unwrap();
    assert_eq!(down, values(h * 64, 108).iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>());
    // Q8_0 embedding: q * d.
    let emb = ck.f32("token_embd.weight", &[64, h]).unwrap();
    assert_eq!(emb[0], 0.0);
    assert_eq!(emb[33], 2.0 / 64.0);
    // Llama Q/K rows are un-permuted on reading, with q and kv head counts.
    let q_stored = rounded_f16(&values(q * h, 101));
    assert_eq!(ck.f32("blk.0.attn_q.weight", &[q, h]).unwrap(), unpermute_rope_rows(&q_stored, q, h, 4));
    let k_stored = rounded_f16(&values(kv * h, 102));
    let k = ck.f16("blk.0.attn_k.weight", &[kv, h]).unwrap();
    let k: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
    assert_eq!(k, unpermute_rope_rows(&k_stored, kv, h, 2));
    assert_ne!(k, k_stored);
    // ...and raw() gives the stored rows.
    assert_eq!(ck.raw("blk.0.attn_k.weight").unwrap().to_f32().unwrap(), k_stored);
}

#[test]
fn gguf_qwen2_qwen3_gemma3_configs() {
    // Qwen2: bias detected from blk.0.attn_q.bias; untied.
    let cfg = config_of(&Hyperparams { attention_bias: true, tie_word_embeddings: false, ..tiny_hp(Arch::Qwen2) });
    let ck = Checkpoint::open(&tiny_gguf(&cfg).write_to(&scratch("qwen2.gguf"))).unwrap();
    assert_eq!(ck.config, ModelConfig { eos_token_ids: vec![2, 3], ..cfg.clone() });
    let qb = ck.f32("blk.1.attn_q.bias", &[32]).unwrap();
    assert_eq!(qb, values(32, 209));
    // No permutation outside llama.
    let q = ck.f32("blk.0.attn_q.weight", &[32, 32]).unwrap();
    assert_eq!(q, rounded_f16(&values(32 * 32, 101)));

    // Qwen3: q/k norm; rope scaling and softcapping read back.
    let cfg = config_of(&Hyperparams {
        head_dim: 16,
        rope_scaling_factor: 4.0,
        final_logit_softcapping: Some(30.0),
        ..tiny_hp(Arch::Qwen3)
    });
    // Qwen3's q/k norm, scores scaled by 1/sqrt(16).
    assert!(dense(&cfg).qk_norm && dense(&cfg).attention_scale == 0.25);
    let ck = Checkpoint::open(&tiny_gguf(&cfg).write_to(&scratch("qwen3.gguf"))).unwrap();
    assert_eq!(ck.config, ModelConfig { eos_token_ids: vec![2, 3], ..cfg.clone() });
    assert!(ck.f32("blk.0.attn_k_norm.weight", &[16]).is_ok());

    // Gemma 3: 8 layers, every 6th global; the rest implied by the architecture.
    let mut h = tiny_hp(Arch::Gemma3);
    h.head_dim = 16;
    h.layer_types =
        (0..8).map(|i| if i == 5 { LayerAttention::Full } else { LayerAttention::Sliding { window: 16 } }).collect();
    h.activation = Activation::GeluTanhGated;
    h.rope_theta = 1e6;
    h.rope_scaling_factor = 8.0;
    let cfg = ModelConfig { add_bos: true, ..config_of(&h) };
    let d = dense(&cfg);
    assert!(d.qk_norm && d.sandwich_norm && cfg.embedding_scale == 32f32.sqrt());
    assert_eq!((d.attention_scale, d.rope_local_theta), (0.25, Some(10000.0)));
    let ck = Checkpoint::open(&tiny_gguf(&cfg).write_to(&scratch("gemma3.gguf"))).unwrap();
    assert_eq!(ck.config, ModelConfig { eos_token_ids: vec![2, 3], ..cfg.clone() });
    // GGUF Gemma norms already include the +1: no fixup.
    assert_eq!(ck.f32("blk.0.post_ffw_norm.weight", &[32]).unwrap(), values(32, 115));
}

#[test]
fn gguf_metadata_value_types_round_trip() {
    let mut w = GgufWriter::new();
    let vals: Vec<(&str, GgufValue)> = vec![
        ("a.u8", 7u8.into()),
        ("a.i8", (-7i8).into()),
        ("a.u16", 700u16.into()),
        ("a.i16", (-700i16).into()),
        ("a.u32", 70000u32.into()),
        ("a.i32", (-70000i32).into()),
        ("a.f32", 1.5f32.into()),
        ("a.bool", true.into()),
        ("a.str", "héllo ▁ world".into()),
        ("a.u64", (1u64 << 40).into()),
        ("a.i64", (-(1i64 << 40)).into()),
        ("a.f64", 2.25f64.into()),
        ("a.strs", vec!["x", "", "zz"].into()),
        ("a.f32s", vec![1.0f32, -2.0].into()),
        ("a.empty", GgufValue::Array(vec![])),
        ("a.nested", GgufValue::Array(vec![vec![1i32, 2].into(), vec![3i32].into()])),
    ];
    for (k, v) in &vals {
        w.add_metadata(*k, v.clone());
    }
    w.set_alignment(64).unwrap();
    w.add_f32("t", &[3], &[1.0, 2.0, 3.0]).unwrap();
    w.add_tensor("q", DType::Q4_K, &[2, 256], vec![0u8; 2 * 144]).unwrap();
    let bytes = w.to_bytes();
    let g = GgufFile::parse(&bytes, Path::new("mem")).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    for (k, v) in &vals {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    assert_eq!(g.get("a.u32").unwrap().as_u64(), Some(70000));
    assert_eq!(g.get("a.i8").unwrap().as_u64(), None);
    assert_eq!(g.get("a.f32").unwrap().as_f64(), Some(1.5));
    let t = g.tensor("q").unwrap();
    assert_eq!((t.dtype, t.shape.clone(), t.len), (DType::Q4_K, vec![2, 256], 288));
    assert_eq!(t.offset % 64, 0);
    let t = g.tensor("t").unwrap();
    let o = t.offset as usize;
    assert_eq!(&bytes[o..o + 4], &1f32.to_le_bytes());
}

// ---------------------------------------------------------------------------------------------
// Against gguf-py (llama.cpp's Python writer): not our writer against our reader
// ---------------------------------------------------------------------------------------------

/// The file gguf-py wrote: tests/fixtures/gguf/gguf_py.gguf, made by tools/make_gguf_py_fixture.py
/// with `gguf==0.19.0` from PyPI. Regenerate: `python3 -m venv /tmp/gguf-env &&
/// /tmp/gguf-env/bin/pip install gguf==0.19.0 && /tmp/gguf-env/bin/python tools/make_gguf_py_fixture.py`.
fn gguf_py_fixture() -> Vec<u8> {
    let p = common::fixture_dir().join("gguf/gguf_py.gguf");
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run tools/make_gguf_py_fixture.py)", p.display()))
}

/// The Q8_0 fixture tensor: two blocks, scale 0.25 (f16 0x3400), quants (i - 16 + b) as i8.
fn gguf_py_q8_0() -> Vec<u8> {
    let mut b = Vec::new();
    for blk in 0..2i32 {
        b.extend_from_slice(&[0x00, 0x34]);
        b.extend((0..32).map(|i| (i - 16 + blk) as i8 as u8));
    }
    b
}

/// The Q4_K fixture tensor: one block, byte j = (7j + 3) mod 256.
fn gguf_py_q4_k() -> Vec<u8> {
    (0..144u32).map(|j| ((7 * j + 3) % 256) as u8).collect()
}

/// The same content as tools/make_gguf_py_fixture.py, line by line, with our writer.
fn gguf_py_fixture_content() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", "llama");
    w.add_metadata("t.u8", 7u8);
    w.add_metadata("t.i8", -7i8);
    w.add_metadata("t.u16", 700u16);
    w.add_metadata("t.i16", -700i16);
    w.add_metadata("t.u32", 70000u32);
    w.add_metadata("t.i32", -70000i32);
    w.add_metadata("t.f32", 1.5f32);
    w.add_metadata("t.bool", true);
    w.add_metadata("t.str", "héllo ▁ world");
    w.add_metadata("t.u64", 1u64 << 40);
    w.add_metadata("t.i64", -(1i64 << 40));
    w.add_metadata("t.f64", 2.25f64);
    w.add_metadata("t.strs", vec!["x", "", "zz"]);
    w.add_metadata("t.f32s", vec![1.0f32, -2.0, 0.1]);
    w.add_metadata("t.u8s", vec![0u8, 255, 7]);
    w.add_metadata("t.i64s", vec![-1i64, 1 << 50]);
    w.add_metadata("t.bools", vec![true, false]);
    w.add_metadata("t.nested", GgufValue::Array(vec![vec![1i32, 2].into(), vec![3i32].into()]));
    w.set_alignment(64).unwrap();
    w.add_metadata("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}");
    w.add_f32("f32", &[3], &[1.0, -2.5, 3.25]).unwrap();
    let f16s: Vec<f16> = (0..6).map(|i| f16::from_f32(i as f32 * 0.5 - 1.0)).collect();
    w.add_f16("f16", &[2, 3], &f16s).unwrap();
    let bf16: Vec<u8> = [0x3F80u16, 0xC000, 0x3F00, 0x4040].iter().flat_map(|b| b.to_le_bytes()).collect();
    w.add_tensor("bf16", DType::BF16, &[4], bf16).unwrap();
    w.add_tensor("q8_0", DType::Q8_0, &[2, 32], gguf_py_q8_0()).unwrap();
    w.add_tensor("q4_k", DType::Q4_K, &[1, 256], gguf_py_q4_k()).unwrap();
    w
}

/// Our writer gives gguf-py's bytes, byte for byte, for the same content: key and tensor-info
/// encoding, array element types, alignment padding of the header and of every tensor.
#[test]
fn gguf_writer_matches_gguf_py() {
    let theirs = gguf_py_fixture();
    let ours = gguf_py_fixture_content().to_bytes();
    if let Some(i) = (0..ours.len().min(theirs.len())).find(|&i| ours[i] != theirs[i]) {
        let near = |b: &[u8]| format!("{:02x?}", &b[i.saturating_sub(8)..(i + 8).min(b.len())]);
        panic!("first difference at byte {i}: ours {} gguf-py {}", near(&ours), near(&theirs));
    }
    assert_eq!(ours.len(), theirs.len(), "same bytes up to the shorter; lengths differ");
}

/// Our reader on gguf-py's file: every field as the script wrote it (values from its formulas,
/// not from our writer).
#[test]
fn gguf_reader_reads_gguf_py_file() {
    let bytes = gguf_py_fixture();
    let g = GgufFile::parse(&bytes, Path::new("gguf_py.gguf")).unwrap();
    assert_eq!((g.version, g.alignment), (3, 64));
    assert_eq!(g.data_offset % 64, 0);
    let v = |k: &str| g.get(k).unwrap_or_else(|| panic!("{k} missing")).clone();
    assert_eq!(v("general.architecture"), GgufValue::String("llama".into()));
    assert_eq!(v("t.u8"), GgufValue::U8(7));
    assert_eq!(v("t.i8"), GgufValue::I8(-7));
    assert_eq!(v("t.u16"), GgufValue::U16(700));
    assert_eq!(v("t.i16"), GgufValue::I16(-700));
    assert_eq!(v("t.u32"), GgufValue::U32(70000));
    assert_eq!(v("t.i32"), GgufValue::I32(-70000));
    assert_eq!(v("t.f32"), GgufValue::F32(1.5));
    assert_eq!(v("t.bool"), GgufValue::Bool(true));
    assert_eq!(v("t.str"), GgufValue::String("héllo ▁ world".into()));
    assert_eq!(v("t.u64"), GgufValue::U64(1 << 40));
    assert_eq!(v("t.i64"), GgufValue::I64(-(1 << 40)));
    assert_eq!(v("t.f64"), GgufValue::F64(2.25));
    let s = |x: &str| GgufValue::String(x.into());
    assert_eq!(v("t.strs"), GgufValue::Array(vec![s("x"), s(""), s("zz")]));
    assert_eq!(v("t.f32s"), GgufValue::Array(vec![GgufValue::F32(1.0), GgufValue::F32(-2.0), GgufValue::F32(0.1)]));
    assert_eq!(v("t.u8s"), GgufValue::Array(vec![GgufValue::U8(0), GgufValue::U8(255), GgufValue::U8(7)]));
    assert_eq!(v("t.i64s"), GgufValue::Array(vec![GgufValue::I64(-1), GgufValue::I64(1 << 50)]));
    assert_eq!(v("t.bools"), GgufValue::Array(vec![GgufValue::Bool(true), GgufValue::Bool(false)]));
    let i = GgufValue::I32;
    assert_eq!(v("t.nested"), GgufValue::Array(vec![GgufValue::Array(vec![i(1), i(2)]), GgufValue::Array(vec![i(3)])]));
    assert_eq!(v("general.alignment"), GgufValue::U32(64));
    assert_eq!(g.metadata.len(), 21);
    assert_eq!(g.metadata[0].0, "general.architecture");

    let names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["f32", "f16", "bf16", "q8_0", "q4_k"]);
    let data = |name: &str| {
        let t = g.tensor(name).unwrap();
        assert_eq!(t.offset % 64, 0, "{name}");
        (t.clone(), &bytes[t.offset as usize..t.offset as usize + t.len])
    };
    let to_f32 = |t: &gguf::GgufTensorInfo, b: &[u8]| {
        wgpu_llm::loader::dtype::to_f32(t.dtype, b, t.shape.iter().product()).unwrap()
    };
    let (t, b) = data("f32");
    assert_eq!((t.dtype, t.shape.clone()), (DType::F32, vec![3]));
    assert_eq!(to_f32(&t, b), [1.0, -2.5, 3.25]);
    let (t, b) = data("f16");
    assert_eq!((t.dtype, t.shape.clone()), (DType::F16, vec![2, 3]));
    assert_eq!(to_f32(&t, b), [-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]);
    let (t, b) = data("bf16");
    assert_eq!((t.dtype, t.shape.clone()), (DType::BF16, vec![4]));
    assert_eq!(to_f32(&t, b), [1.0, -2.0, 0.5, 3.0]);
    let (t, b) = data("q8_0");
    assert_eq!((t.dtype, t.shape.clone(), t.len), (DType::Q8_0, vec![2, 32], 68));
    let want: Vec<f32> = (0..64).map(|k| 0.25 * ((k % 32) as f32 - 16.0 + (k / 32) as f32)).collect();
    assert_eq!(to_f32(&t, b), want);
    let (t, b) = data("q4_k");
    assert_eq!((t.dtype, t.shape.clone(), t.len), (DType::Q4_K, vec![1, 256], 144));
    assert_eq!(b, &gguf_py_q4_k()[..]);
    // The file ends with the last tensor padded to the alignment, as both writers do.
    assert_eq!(bytes.len() as u64, (t.offset + 144).div_ceil(64) * 64);
}

#[test]
fn gguf_v2_is_accepted() {
    let mut bytes = tiny_gguf(&tiny_config(Arch::Qwen2)).to_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let ck = Checkpoint::open(&write(&scratch("v2.gguf"), &bytes)).unwrap();
    assert_eq!(ck.config.arch, Arch::Qwen2);
}

#[test]
fn gguf_writer_rejects_bad_tensors() {
    let mut w = GgufWriter::new();
    assert!(matches!(err_of(w.add_f32("x", &[4], &[0.0; 3])), Error::InvalidArgument(_)));
    assert!(matches!(err_of(w.add_tensor("x", DType::Q8_0, &[2, 16], vec![0; 34])), Error::InvalidArgument(_)));
    w.add_f32("x", &[2], &[0.0; 2]).unwrap();
    assert!(matches!(err_of(w.add_f32("x", &[2], &[0.0; 2])), Error::InvalidArgument(_)));
    assert!(w.set_alignment(48).is_err());
}

/// Extension used by these tests: write and return the path.
trait WriteTo {
    fn write_to(&self, path: &Path) -> PathBuf;
}
impl WriteTo for GgufWriter {
    fn write_to(&self, path: &Path) -> PathBuf {
        self.write(path).unwrap();
        path.to_path_buf()
    }
}

// ---------------------------------------------------------------------------------------------
// GGUF bad input
// ---------------------------------------------------------------------------------------------

/// Byte offset of the tensor-info fields that follow tensor `name`'s name:
/// (n_dims at, type at, offset at).
fn tensor_info_fields(bytes: &[u8], name: &str) -> (usize, usize, usize) {
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name.as_bytes());
    needle.extend_from_slice(&2u32.to_le_bytes()); // the test tensors are 2-D
    let at = bytes.windows(needle.len()).position(|w| w == needle).expect("tensor info") + needle.len() - 4;
    (at, at + 4 + 16, at + 4 + 16 + 4)
}

#[test]
fn missing_path_is_io_error() {
    let e = err_of(Checkpoint::open(Path::new("/definitely/not/here.gguf")));
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("/definitely/not/here.gguf"));
}

#[test]
fn folder_without_config_is_io_error() {
    let dir = scratch("empty-folder");
    std::fs::create_dir_all(&dir).unwrap();
    let e = err_of(Checkpoint::open(&dir));
    assert!(matches!(e, Error::Io { .. }), "{e}");
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn bad_magic_is_corrupt() {
    let mut bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    bytes[..4].copy_from_slice(b"GGML");
    let e = err_of(Checkpoint::open(&write(&scratch("magic.gguf"), &bytes)));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    let e = err_of(Checkpoint::open(&write(&scratch("empty.gguf"), b"")));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn unsupported_versions() {
    for v in [1u32, 4, 3u32.swap_bytes()] {
        let mut bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        let e = err_of(GgufFile::parse(&bytes, Path::new("mem")));
        assert!(matches!(e, Error::Unsupported(_)), "{v}: {e}");
    }
}

#[test]
fn every_truncation_is_corrupt() {
    let w = tiny_gguf(&tiny_config(Arch::Llama));
    let bytes = w.to_bytes();
    let g = GgufFile::parse(&bytes, Path::new("mem")).unwrap();
    // Every cut inside the header, and a sample of cuts inside the tensor data.
    let data = g.data_offset as usize;
    let cuts = (0..data).chain((data..bytes.len()).step_by(97));
    for cut in cuts {
        let e = err_of(GgufFile::parse(&bytes[..cut], Path::new("mem")));
        assert!(matches!(e, Error::Corrupt { .. }), "cut at {cut}: {e}");
    }
    // Through the file system: a file cut in the middle of the last tensor.
    let path = write(&scratch("cut.gguf"), &bytes[..bytes.len() - 10]);
    let e = err_of(Checkpoint::open(&path));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("past the end"), "{e}");
}

#[test]
fn tensor_offset_beyond_file_is_corrupt() {
    let mut bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    let (_, _, off) = tensor_info_fields(&bytes, "blk.0.attn_q.weight");
    for bad in [bytes.len() as u64 / 32 * 32, u64::MAX / 64 * 32, 1u64 << 40] {
        bytes[off..off + 8].copy_from_slice(&bad.to_le_bytes());
        let e = err_of(Checkpoint::open(&write(&scratch("offset.gguf"), &bytes)));
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("blk.0.attn_q.weight"), "{e}");
    }
    // Misaligned.
    bytes[off..off + 8].copy_from_slice(&3u64.to_le_bytes());
    let e = err_of(GgufFile::parse(&bytes, Path::new("mem")));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
}

#[test]
fn unknown_ggml_type_is_unsupported() {
    let mut bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    let (_, ty, _) = tensor_info_fields(&bytes, "blk.1.ffn_up.weight");
    for id in [16u32, 39, 1234] {
        bytes[ty..ty + 4].copy_from_slice(&id.to_le_bytes());
        let e = err_of(Checkpoint::open(&write(&scratch("type.gguf"), &bytes)));
        assert!(matches!(e, Error::Unsupported(_)), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("blk.1.ffn_up.weight") && msg.contains(&id.to_string()), "{msg}");
    }
}

#[test]
fn bad_dims_are_corrupt() {
    let bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    let (nd, _, _) = tensor_info_fields(&bytes, "blk.0.attn_v.weight");
    let mut b = bytes.clone();
    b[nd..nd + 4].copy_from_slice(&9u32.to_le_bytes());
    assert!(matches!(err_of(GgufFile::parse(&b, Path::new("m"))), Error::Corrupt { .. }));
    let mut b = bytes.clone();
    b[nd + 4..nd + 12].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(err_of(GgufFile::parse(&b, Path::new("m"))), Error::Corrupt { .. }));
}

#[test]
fn unknown_architecture_is_unsupported() {
    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.add_metadata("general.architecture", "mamba");
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("arch.gguf"))));
    assert!(matches!(&e, Error::Unsupported(m) if m.contains("architecture mamba")), "{e}");
}

#[test]
fn inconsistent_metadata_is_reported() {
    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.add_metadata("llama.attention.head_count_kv", 3u32);
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("kv.gguf"))));
    assert!(matches!(e, Error::Mismatch(_)), "{e}");

    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.remove_metadata("llama.embedding_length");
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("missing.gguf"))));
    assert!(matches!(&e, Error::Corrupt { msg, .. } if msg.contains("embedding_length")), "{e}");

    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.add_metadata("llama.block_count", "two");
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("type-key.gguf"))));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");

    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.add_metadata("tokenizer.ggml.eos_token_id", 640u32);
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("eos.gguf"))));
    assert!(matches!(e, Error::Mismatch(_)), "{e}");

    let mut w = tiny_gguf(&tiny_config(Arch::Llama));
    w.add_metadata("llama.rope.scaling.type", "yarn");
    w.add_metadata("llama.rope.scaling.factor", 4.0f32);
    let e = err_of(Checkpoint::open(&w.write_to(&scratch("yarn.gguf"))));
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
}

#[test]
fn shape_mismatch_is_reported() {
    let cfg = tiny_config(Arch::Qwen2);
    let ck = Checkpoint::open(&tiny_gguf(&cfg).write_to(&scratch("shape.gguf"))).unwrap();
    // The config implies [ffn, hidden] for ffn_up; ask with a wrong config shape.
    let f = dense(&cfg).intermediate_size;
    let e = err_of(ck.f16("blk.0.ffn_up.weight", &[f + 1, cfg.hidden_size]));
    assert!(matches!(&e, Error::Mismatch(m) if m.contains("blk.0.ffn_up.weight")), "{e}");
    assert!(ck.f16("blk.0.ffn_up.weight", &[f, cfg.hidden_size]).is_ok());
    let e = err_of(ck.f32("blk.9.ffn_up.weight", &[1]));
    assert!(matches!(e, Error::Mismatch(_)), "{e}");
}

/// Random corruption of a small valid file: parsing returns Ok or Err, never panics, and an
/// Ok file's tensors all lie inside it.
#[test]
fn random_corruption_never_panics() {
    let bytes = tiny_gguf(&config_of(&Hyperparams { layer_types: vec![LayerAttention::Full], ..tiny_hp(Arch::Llama) }))
        .to_bytes();
    let g = GgufFile::parse(&bytes, Path::new("m")).unwrap();
    let header = g.data_offset as usize;
    let mut rng = 0x9e3779b9u32;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 17;
        rng ^= rng << 5;
        rng as usize
    };
    for _ in 0..3000 {
        let mut b = bytes.clone();
        for _ in 0..1 + next() % 4 {
            let at = next() % header;
            b[at] = match next() % 3 {
                0 => next() as u8,
                1 => 0xff,
                _ => b[at] ^ (1 << (next() % 8)),
            };
        }
        if let Ok(g) = GgufFile::parse(&b, Path::new("m")) {
            for t in &g.tensors {
                let o = t.offset as usize;
                assert!(o + t.len <= b.len());
                let _ = wgpu_llm::loader::dtype::to_f32(t.dtype, &b[o..o + t.len], t.shape.iter().product());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face folders
// ---------------------------------------------------------------------------------------------

/// (name, dtype, shape, bytes) of a safetensors tensor.
type StTensor = (String, &'static str, Vec<usize>, Vec<u8>);

/// A safetensors file from (name, dtype, shape, bytes).
fn safetensors(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !(h.len() + 8).is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

fn f32_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}
fn bf16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect()
}
fn f16_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect()
}

/// HF tensors of a tiny model (hidden 32, 2 layers, 4/2 heads of 8, ffn 64, vocab 64).
fn hf_tensors(prefix: &str, gemma: bool, lm_head: bool) -> Vec<StTensor> {
    let mut t = vec![
        (format!("{prefix}embed_tokens.weight"), "BF16", vec![64, 32], bf16_bytes(&values(64 * 32, 1))),
        (format!("{prefix}norm.weight"), "F32", vec![32], f32_bytes(&values(32, 2))),
    ];
    if lm_head {
        t.push(("lm_head.weight".into(), "F16", vec![64, 32], f16_bytes(&values(64 * 32, 3))));
    }
    for i in 0..2 {
        let p = format!("{prefix}layers.{i}.");
        let s = 10 * (i as u32 + 1);
        let mut add = |n: &str, shape: Vec<usize>, seed: u32| {
            let n_el = shape.iter().product();
            t.push((format!("{p}{n}"), "F32", shape, f32_bytes(&values(n_el, seed))));
        };
        add("input_layernorm.weight", vec![32], s);
        add("self_attn.q_proj.weight", vec![32, 32], s + 1);
        add("self_attn.k_proj.weight", vec![16, 32], s + 2);
        add("self_attn.v_proj.weight", vec![16, 32], s + 3);
        add("self_attn.o_proj.weight", vec![32, 32], s + 4);
        add("post_attention_layernorm.weight", vec![32], s + 5);
        add("mlp.gate_proj.weight", vec![64, 32], s + 6);
        add("mlp.up_proj.weight", vec![64, 32], s + 7);
        add("mlp.down_proj.weight", vec![32, 64], s + 8);
        if gemma {
            add("self_attn.q_norm.weight", vec![8], s + 9);
            add("self_attn.k_norm.weight", vec![8], s + 9);
            add("pre_feedforward_layernorm.weight", vec![32], s + 10);
            add("post_feedforward_layernorm.weight", vec![32], s + 11);
        }
    }
    t
}

fn write_st(path: &Path, t: &[StTensor]) {
    let refs: Vec<(&str, &str, Vec<usize>, Vec<u8>)> =
        t.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
    std::fs::write(path, safetensors(&refs)).unwrap();
}

fn tokenizer_json(extra: &[(u32, &str)]) -> String {
    let mut added = vec![
        serde_json::json!({"id": 0, "content": "<pad>", "special": true}),
        serde_json::json!({"id": 1, "content": "<eos>", "special": true}),
        serde_json::json!({"id": 2, "content": "<bos>", "special": true}),
    ];
    for (id, s) in extra {
        added.push(serde_json::json!({"id": id, "content": s, "special": true}));
    }
    serde_json::json!({
        "version": "1.0",
        "added_tokens": added,
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
        "model": {"type": "BPE", "vocab": {"a": 3}, "merges": []}
    })
    .to_string()
}

#[test]
fn hf_gemma3_multimodal_folder() {
    let dir = scratch("hf-gemma3");
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "model_type": "gemma3",
        "architectures": ["Gemma3ForConditionalGeneration"],
        "eos_token_id": [1, 60],
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "sliding_window": 16, "layer_types": ["sliding_attention", "full_attention"],
            "query_pre_attn_scalar": 16, "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "max_position_embeddings": 1024, "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": null
        }
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut t = hf_tensors("model.language_model.", true, false);
    t.push(("model.vision_tower.patch.weight".into(), "I64", vec![2], vec![0; 16]));
    write_st(&dir.join("model.safetensors"), &t);
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(&[(50, "<end_of_turn>")])).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        serde_json::json!({"bos_token": {"content": "<bos>"}, "eos_token": "<eos>", "add_bos_token": true,
            "chat_template": "{{ bos_token }}"})
        .to_string(),
    )
    .unwrap();

    let ck = Checkpoint::open(&dir).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!((c.hidden_size, c.num_layers(), d.num_heads, d.num_kv_heads, d.head_dim), (32, 2, 4, 2, 8));
    assert_eq!(d.layer_attention, vec![LayerAttention::Sliding { window: 16 }, LayerAttention::Full]);
    assert_eq!((d.rope_theta, d.rope_local_theta, d.rope_scaling_factor), (1e6, Some(1e4), 8.0));
    assert_eq!(d.attention_scale, 0.25);
    assert_eq!(c.embedding_scale, 32f32.sqrt());
    assert!(d.qk_norm && d.sandwich_norm && c.tie_word_embeddings && !d.attention_bias && c.add_bos);
    assert_eq!(d.activation, Activation::GeluTanhGated);
    assert_eq!(c.final_logit_softcapping, None);
    assert_eq!(c.bos_token_id, Some(2));
    assert_eq!(c.eos_token_ids, vec![1, 60, 50]);
    assert_eq!(ck.bos_token.as_deref(), Some("<bos>"));
    assert_eq!(ck.eos_token.as_deref(), Some("<eos>"));
    assert_eq!(ck.chat_template.as_deref(), Some("{{ bos_token }}"));
    assert!(matches!(&ck.tokenizer, TokenizerSource::Json(p) if p.ends_with("tokenizer.json")));

    // Names mapped; Gemma's (1 + w) folded into every norm; post_attention_layernorm is the
    // sandwich norm here.
    let plus1 = |s: u32, n: usize| values(n, s).iter().map(|x| x + 1.0).collect::<Vec<_>>();
    assert_eq!(ck.f32("output_norm.weight", &[32]).unwrap(), plus1(2, 32));
    assert_eq!(ck.f32("blk.1.attn_norm.weight", &[32]).unwrap(), plus1(20, 32));
    assert_eq!(ck.f32("blk.1.post_attention_norm.weight", &[32]).unwrap(), plus1(25, 32));
    assert_eq!(ck.f32("blk.1.ffn_norm.weight", &[32]).unwrap(), plus1(30, 32));
    assert_eq!(ck.f32("blk.1.post_ffw_norm.weight", &[32]).unwrap(), plus1(31, 32));
    assert_eq!(ck.f32("blk.0.attn_q_norm.weight", &[8]).unwrap(), plus1(19, 8));
    let f16n: Vec<f32> = ck.f16("blk.0.attn_k_norm.weight", &[8]).unwrap().iter().map(|x| x.to_f32()).collect();
    assert_eq!(f16n, rounded_f16(&plus1(19, 8)));
    // Matrices untouched (no permutation for HF), BF16 embedding converted.
    assert_eq!(ck.f32("blk.0.attn_k.weight", &[16, 32]).unwrap(), values(16 * 32, 12));
    let emb = ck.f32("token_embd.weight", &[64, 32]).unwrap();
    let want: Vec<f32> = values(64 * 32, 1).iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect();
    assert_eq!(emb, want);
    assert!(!ck.has("output.weight"));
    assert!(ck.tensor_names().all(|n| !n.contains("vision")));
}

#[test]
fn hf_sharded_llama_folder() {
    let dir = scratch("hf-llama");
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0, "max_position_embeddings": 512, "tie_word_embeddings": false,
        "bos_token_id": 2, "eos_token_id": 1, "hidden_act": "silu", "rope_scaling": null
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let t = hf_tensors("model.", false, true);
    let (a, b) = t.split_at(t.len() / 2);
    write_st(&dir.join("model-00001-of-00002.safetensors"), a);
    write_st(&dir.join("model-00002-of-00002.safetensors"), b);
    let mut map = serde_json::Map::new();
    for (n, ..) in a {
        map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
    }
    for (n, ..) in b {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    std::fs::write(
        dir.join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(&[(40, "<|eot_id|>")])).unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [1, 7]}"#).unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{% for m in messages %}{{ m }}{% endfor %}").unwrap();

    let ck = Checkpoint::open(&dir).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!((d.head_dim, d.rope_theta, c.max_position_embeddings), (8, 1e5, 512));
    assert!(!c.tie_word_embeddings && !d.qk_norm && !d.sandwich_norm);
    assert_eq!(d.layer_attention, vec![LayerAttention::Full; 2]);
    assert_eq!(c.bos_token_id, Some(2));
    assert_eq!(c.eos_token_ids, vec![1, 7, 40]);
    // No add_bos_token anywhere: the tokenizer.json post-processor prepends <bos>.
    assert!(c.add_bos);
    assert_eq!(ck.bos_token.as_deref(), Some("<bos>"));
    assert_eq!(ck.eos_token.as_deref(), Some("<eos>"));
    assert!(ck.chat_template.as_deref().unwrap().starts_with("{% for"));
    // Llama HF rows are already in rotate-half order; norms untouched.
    assert_eq!(ck.f32("blk.1.attn_q.weight", &[32, 32]).unwrap(), values(32 * 32, 21));
    assert_eq!(ck.f32("blk.1.ffn_norm.weight", &[32]).unwrap(), values(32, 25));
    let out: Vec<f32> = ck.f16("output.weight", &[64, 32]).unwrap().iter().map(|x| x.to_f32()).collect();
    assert_eq!(out, rounded_f16(&values(64 * 32, 3)));

    // A shard missing a tensor its index names.
    write_st(&dir.join("model-00002-of-00002.safetensors"), &b[1..]);
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Mismatch(_)));
}

/// A minimal valid Qwen2 folder, returned with its tensors so tests can break it.
fn qwen2_folder(name: &str) -> (PathBuf, Vec<StTensor>) {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let config = serde_json::json!({
        "model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true, "eos_token_id": 1, "use_sliding_window": false, "sliding_window": 32
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(&[(5, "<|im_end|>")])).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), r#"{"add_bos_token": false, "bos_token": null}"#).unwrap();
    let mut t = hf_tensors("model.", false, false);
    for i in 0..2 {
        for (p, n) in [("q", 32), ("k", 16), ("v", 16)] {
            t.push((format!("model.layers.{i}.self_attn.{p}_proj.bias"), "F32", vec![n], f32_bytes(&values(n, 7))));
        }
    }
    write_st(&dir.join("model.safetensors"), &t);
    (dir, t)
}

#[test]
fn hf_qwen2_folder() {
    let (dir, _) = qwen2_folder("hf-qwen2");
    let ck = Checkpoint::open(&dir).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Qwen2);
    assert!(d.attention_bias && c.tie_word_embeddings && !c.add_bos);
    assert_eq!(d.rope_theta, 1e6);
    assert_eq!(d.layer_attention, vec![LayerAttention::Full; 2]);
    assert_eq!(c.eos_token_ids, vec![1, 5]);
    assert_eq!(c.bos_token_id, None);
    assert_eq!(ck.f32("blk.0.attn_k.bias", &[16]).unwrap(), values(16, 7));
}

#[test]
fn hf_bad_inputs() {
    // Corrupt header JSON.
    let (dir, t) = qwen2_folder("hf-bad-json");
    let mut st = std::fs::read(dir.join("model.safetensors")).unwrap();
    st[8] = b'[';
    std::fs::write(dir.join("model.safetensors"), &st).unwrap();
    let e = err_of(Checkpoint::open(&dir));
    assert!(matches!(&e, Error::Corrupt { msg, .. } if msg.contains("JSON")), "{e}");

    // Header length past the end; file shorter than the length prefix.
    let mut st2 = safetensors(&[("model.norm.weight", "F32", vec![2], vec![0; 8])]);
    let n = st2.len() as u64;
    st2[..8].copy_from_slice(&n.to_le_bytes());
    std::fs::write(dir.join("model.safetensors"), &st2).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Corrupt { .. }));
    std::fs::write(dir.join("model.safetensors"), [1u8, 2, 3]).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Corrupt { .. }));

    // Offsets out of range (and inconsistent with the shape).
    let json =
        serde_json::json!({"model.norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}}).to_string();
    let mut st3 = (json.len() as u64).to_le_bytes().to_vec();
    st3.extend(json.as_bytes());
    st3.extend([0u8; 64]);
    std::fs::write(dir.join("model.safetensors"), &st3).unwrap();
    let e = err_of(Checkpoint::open(&dir));
    assert!(matches!(&e, Error::Corrupt { msg, .. } if msg.contains("model.norm.weight")), "{e}");
    let json =
        serde_json::json!({"model.norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 64]}}).to_string();
    let mut st4 = (json.len() as u64).to_le_bytes().to_vec();
    st4.extend(json.as_bytes());
    st4.extend([0u8; 64]);
    std::fs::write(dir.join("model.safetensors"), &st4).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Corrupt { .. }));

    // Truncated data.
    let full = safetensors(&t.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect::<Vec<_>>());
    std::fs::write(dir.join("model.safetensors"), &full[..full.len() - 4]).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Corrupt { .. }));
    std::fs::write(dir.join("model.safetensors"), &full).unwrap();
    assert!(Checkpoint::open(&dir).is_ok());

    // Unsupported dtype on a used tensor.
    let mut t2 = t.clone();
    t2[1] = ("model.norm.weight".into(), "I64", vec![32], vec![0; 256]);
    write_st(&dir.join("model.safetensors"), &t2);
    let e = err_of(Checkpoint::open(&dir));
    assert!(matches!(&e, Error::Unsupported(m) if m.contains("I64") && m.contains("model.norm.weight")), "{e}");

    // Unknown model_type; bad config JSON; missing tokenizer; untied without lm_head.
    write_st(&dir.join("model.safetensors"), &t);
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), cfg.replace("qwen2", "bert")).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Unsupported(m) if m.contains("bert")));
    std::fs::write(dir.join("config.json"), "{not json").unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Corrupt { .. }));
    std::fs::write(
        dir.join("config.json"),
        cfg.replace("\"tie_word_embeddings\":true", "\"tie_word_embeddings\":false"),
    )
    .unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Mismatch(m) if m.contains("lm_head")));
    std::fs::write(dir.join("config.json"), cfg.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3"))
        .unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Mismatch(_)));
    std::fs::write(dir.join("config.json"), &cfg).unwrap();
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Io { .. }));
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    assert!(matches!(err_of(Checkpoint::open(&dir)), Error::Io { .. }));
}

// ---------------------------------------------------------------------------------------------
// Validation before allocation, file kinds, messages
// ---------------------------------------------------------------------------------------------

/// Opens and expects an error whose message is clean; returns it.
fn open_err(path: &Path) -> Error {
    let t0 = std::time::Instant::now();
    let e = err_of(Checkpoint::open(path));
    assert!(t0.elapsed().as_secs_f64() < 2.0, "took {:?}: {e}", t0.elapsed());
    assert_clean_message(&e.to_string());
    e
}

/// Absurd layer counts fail at once, before anything is sized by them (no multi-terabyte
/// vectors), and a count that differs by one from the tensors present is a mismatch in both
/// directions: no layer is ignored, none is invented.
#[test]
fn layer_count_checked_against_tensors_before_use() {
    for n in [1u64 << 40, 1 << 32, 1_000_000_000, u64::MAX, 5000] {
        let mut w = tiny_gguf(&tiny_config(Arch::Llama));
        w.add_metadata("llama.block_count", n);
        let e = open_err(&w.write_to(&scratch("layers-absurd.gguf")));
        assert!(e.to_string().contains("block_count"), "{e}");
    }
    for n in [1u32, 3] {
        let mut w = tiny_gguf(&tiny_config(Arch::Llama));
        w.add_metadata("llama.block_count", n);
        let e = open_err(&w.write_to(&scratch("layers-off-by-one.gguf")));
        assert!(
            matches!(&e, Error::Mismatch(m) if m.contains(&format!("says {n} layers")) && m.contains("tensors for 2")),
            "{e}"
        );
    }
    // A tensor the config does not use; a layer with a tensor missing.
    let cfg = tiny_config(Arch::Llama);
    let mut full = tiny_gguf(&cfg);
    full.add_f32("blk.1.attn_rot_embd", &[4], &[0.0; 4]).unwrap();
    let e = open_err(&full.write_to(&scratch("extra-tensor.gguf")));
    assert!(matches!(&e, Error::Mismatch(m) if m.contains("blk.1.attn_rot_embd")), "{e}");
    let mut w = GgufWriter::new();
    w.add_tokenizer(&tiny_tokenizer(64));
    w.add_model_config(&cfg);
    let mut tmp = GgufWriter::new();
    add_model_tensors(&mut tmp, &cfg);
    let tb = tmp.to_bytes();
    for t in &GgufFile::parse(&tb, Path::new("m")).unwrap().tensors {
        if t.name != "blk.1.ffn_up.weight" {
            w.add_tensor(&t.name, t.dtype, &t.shape, tb[t.offset as usize..t.offset as usize + t.len].to_vec())
                .unwrap();
        }
    }
    let e = open_err(&w.write_to(&scratch("missing-tensor.gguf")));
    assert!(matches!(&e, Error::Mismatch(m) if m.contains("blk.1.ffn_up.weight is missing")), "{e}");
    // HF: the same for num_hidden_layers.
    let (dir, _) = qwen2_folder("hf-layers");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    for n in ["1099511627776", "18446744073709551615", "1", "3"] {
        std::fs::write(
            dir.join("config.json"),
            cfg.replace("\"num_hidden_layers\":2", &format!("\"num_hidden_layers\":{n}")),
        )
        .unwrap();
        let e = open_err(&dir);
        assert!(e.to_string().contains("num_hidden_layers"), "{e}");
    }
}

/// Every size from a config in checked arithmetic, capped with the field and the limit named.
#[test]
fn absurd_sizes_name_the_field_and_limit() {
    let (dir, _) = qwen2_folder("hf-caps");
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let with = |key: &str, v: &str| {
        let mut j: serde_json::Value = serde_json::from_str(&cfg).unwrap();
        j[key] = serde_json::from_str(v).unwrap();
        std::fs::write(dir.join("config.json"), j.to_string()).unwrap();
        open_err(&dir).to_string()
    };
    // 2^63 + 2^62: would wrap a KV-cache size computed unchecked.
    let m = with("max_position_embeddings", "13835058055282163712");
    assert!(m.contains("max_position_embeddings") && m.contains("limit"), "{m}");
    for key in
        ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "vocab_size", "head_dim"]
    {
        let m = with(key, "1099511627776");
        assert!(m.contains(key) && m.contains("limit"), "{key}: {m}");
        let m = with(key, "-1");
        assert!(m.contains(key), "{key}: {m}");
    }
    let m = with("rms_norm_eps", "1e300");
    assert!(m.contains("rms_norm_eps"), "{m}");
    // GGUF: the same through metadata.
    for (key, v) in [
        ("llama.context_length", 1u64 << 63),
        ("llama.embedding_length", 1 << 40),
        ("llama.attention.head_count", 1 << 33),
    ] {
        let mut w = tiny_gguf(&tiny_config(Arch::Llama));
        w.add_metadata(key, v);
        let m = open_err(&w.write_to(&scratch("cap.gguf"))).to_string();
        assert!(m.contains(key) && m.contains("limit"), "{m}");
    }
}

/// Tensor byte ranges: overlapping, gapped, retyped or resized tensors break the tiling of the
/// data section and are refused, naming a tensor.
#[test]
fn overlapping_and_retyped_tensors_are_corrupt() {
    let bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    let g = GgufFile::parse(&bytes, Path::new("m")).unwrap();
    let rel = |n: &str| g.tensor(n).unwrap().offset - g.data_offset;
    // blk.0.attn_k.weight pointed at attn_q's data (same size class, aligned, inside the file).
    let (_, _, off) = tensor_info_fields(&bytes, "blk.0.attn_k.weight");
    let mut b = bytes.clone();
    b[off..off + 8].copy_from_slice(&rel("blk.0.attn_q.weight").to_le_bytes());
    let e = open_err(&write(&scratch("overlap.gguf"), &b));
    assert!(matches!(&e, Error::Corrupt { msg, .. } if msg.contains("overlaps")), "{e}");
    // An offset moved one alignment step further: a gap, then an overlap.
    let mut b = bytes.clone();
    b[off..off + 8].copy_from_slice(&(rel("blk.0.attn_k.weight") + 32).to_le_bytes());
    let e = open_err(&write(&scratch("gap.gguf"), &b));
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");
    // Types swapped for others that fit the row length: the byte size changes, the tiling breaks.
    let (_, ty, _) = tensor_info_fields(&bytes, "token_embd.weight");
    for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::F16, DType::F32] {
        let mut b = bytes.clone();
        b[ty..ty + 4].copy_from_slice(&t.ggml_type().unwrap().to_le_bytes());
        let e = open_err(&write(&scratch("retype.gguf"), &b));
        assert!(matches!(e, Error::Corrupt { .. }), "{t}: {e}");
    }
    // A norm stored quantized is not what the architecture expects for that name.
    let cfg = tiny_config(Arch::Llama);
    let mut q = GgufWriter::new();
    q.add_tokenizer(&tiny_tokenizer(64));
    q.add_model_config(&cfg);
    let mut tmp = GgufWriter::new();
    add_model_tensors(&mut tmp, &cfg);
    let tb = tmp.to_bytes();
    for t in &GgufFile::parse(&tb, Path::new("m")).unwrap().tensors {
        let data = &tb[t.offset as usize..t.offset as usize + t.len];
        if t.name == "output_norm.weight" {
            let x: Vec<f32> = data.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            q.add_quantized(&t.name, DType::Q8_0, &t.shape, &x).unwrap();
        } else {
            q.add_tensor(&t.name, t.dtype, &t.shape, data.to_vec()).unwrap();
        }
    }
    let e = open_err(&q.write_to(&scratch("quantized-norm.gguf")));
    assert!(matches!(&e, Error::Mismatch(m) if m.contains("output_norm.weight") && m.contains("q8_0")), "{e}");
}

/// The embedding has exactly one row per token of the vocabulary.
#[test]
fn embedding_rows_equal_vocabulary() {
    let cfg = tiny_config(Arch::Llama);
    for vocab in [60, 65] {
        let mut w = tiny_gguf(&cfg);
        w.add_tokenizer(&tiny_tokenizer(vocab));
        let e = open_err(&w.write_to(&scratch("vocab.gguf")));
        assert!(
            matches!(&e, Error::Mismatch(m) if m.contains(&format!("{vocab} tokens")) && m.contains("64 rows")),
            "{e}"
        );
    }
    // An empty vocabulary is reported as such.
    let mut w = tiny_gguf(&cfg);
    w.add_metadata("tokenizer.ggml.tokens", GgufValue::Array(vec![]));
    let e = open_err(&w.write_to(&scratch("no-vocab.gguf")));
    assert!(e.to_string().contains("no vocabulary"), "{e}");
    let (dir, _) = qwen2_folder("hf-empty-vocab");
    let mut tj: serde_json::Value = serde_json::from_str(&tokenizer_json(&[])).unwrap();
    tj["model"]["vocab"] = serde_json::json!({});
    std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
    let e = open_err(&dir);
    assert!(e.to_string().contains("vocabulary is empty"), "{e}");
    // HF: config vocab_size against the embedding.
    let (dir, _) = qwen2_folder("hf-vocab-rows");
    let c = std::fs::read_to_string(dir.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), c.replace("\"vocab_size\":64", "\"vocab_size\":65")).unwrap();
    let e = open_err(&dir);
    assert!(matches!(&e, Error::Mismatch(m) if m.contains("token_embd.weight")), "{e}");
}

/// general.alignment must be a power of two of at least 8 (the spec: a multiple of 8; ggml: a
/// power of two); a smaller valid-looking alignment on a file written with 32 moves the data
/// section and is caught by the range checks.
#[test]
fn wrong_alignment_is_caught() {
    // Pad the header so that its length is 1 more than a multiple of 32: aligning to 8 then
    // starts the data 24 bytes earlier than the writer put it.
    let mut pad = 0;
    let (bytes, field) = loop {
        let mut w = tiny_gguf(&tiny_config(Arch::Llama));
        w.add_metadata("general.alignment", 32u32);
        w.add_metadata("zz.pad", "x".repeat(pad));
        let bytes = w.to_bytes();
        let g = GgufFile::parse(&bytes, Path::new("m")).unwrap();
        if g.header_len % 32 == 1 {
            let mut needle = 17u64.to_le_bytes().to_vec();
            needle.extend_from_slice(b"general.alignment");
            needle.extend_from_slice(&4u32.to_le_bytes());
            let at = bytes.windows(needle.len()).position(|x| x == needle).unwrap() + needle.len();
            break (bytes, at);
        }
        pad += 1;
    };
    assert!(Checkpoint::open(&write(&scratch("align32.gguf"), &bytes)).is_ok());
    for a in [0u32, 1, 2, 4, 3, 48, 1 << 31] {
        let mut b = bytes.clone();
        b[field..field + 4].copy_from_slice(&a.to_le_bytes());
        let e = open_err(&write(&scratch("align.gguf"), &b));
        assert!(e.to_string().contains("general.alignment"), "{a}: {e}");
    }
    for a in [8u32, 16] {
        let mut b = bytes.clone();
        b[field..field + 4].copy_from_slice(&a.to_le_bytes());
        let e = open_err(&write(&scratch("align.gguf"), &b));
        assert!(matches!(e, Error::Corrupt { .. }), "{a}: {e}");
    }
}

/// FIFOs, devices and directories are refused by what they are, without blocking.
#[cfg(unix)]
#[test]
fn only_regular_files_are_opened() {
    let fifo = scratch("model.fifo");
    let ok = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(ok.success());
    let e = open_err(&fifo);
    assert!(e.to_string().contains("FIFO"), "{e}");
    let e = open_err(Path::new("/dev/null"));
    assert!(e.to_string().contains("character device"), "{e}");
    // A FIFO as a shard, a directory as tokenizer.json, a directory as config.json.
    let (dir, _) = qwen2_folder("hf-kinds");
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    std::fs::rename(&fifo, dir.join("model.safetensors")).unwrap();
    let e = open_err(&dir);
    assert!(e.to_string().contains("FIFO") && e.to_string().contains("model.safetensors"), "{e}");
    let (dir, _) = qwen2_folder("hf-kinds2");
    std::fs::remove_file(dir.join("tokenizer.json")).unwrap();
    std::fs::create_dir(dir.join("tokenizer.json")).unwrap();
    let e = open_err(&dir);
    assert!(e.to_string().contains("tokenizer.json: is a directory, not a regular file"), "{e}");
    std::fs::remove_file(dir.join("config.json")).unwrap();
    std::fs::create_dir(dir.join("config.json")).unwrap();
    let e = open_err(&dir);
    assert!(e.to_string().contains("config.json: is a directory"), "{e}");
}

/// A file that shrinks after it was opened gives an error when its tensors are read (positioned
/// reads, no memory map: no SIGBUS).
#[test]
fn file_shrinking_while_loading_is_an_error() {
    let cfg = tiny_config(Arch::Llama);
    let p = tiny_gguf(&cfg).write_to(&scratch("shrink.gguf"));
    let ck = Checkpoint::open(&p).unwrap();
    assert!(ck.f16("blk.1.ffn_down.weight", &[32, 64]).is_ok());
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len / 2).unwrap();
    let e = err_of(ck.f16("blk.1.ffn_down.weight", &[32, 64]));
    assert!(matches!(&e, Error::Corrupt { msg, .. } if msg.contains("changed while it was being loaded")), "{e}");
    assert_clean_message(&e.to_string());
    // The same for a safetensors shard.
    let (dir, _) = qwen2_folder("hf-shrink");
    let ck = Checkpoint::open(&dir).unwrap();
    let st = dir.join("model.safetensors");
    let len = std::fs::metadata(&st).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&st).unwrap().set_len(len - 100).unwrap();
    let e = err_of(ck.f32("blk.1.ffn_down.weight", &[32, 64]));
    assert!(e.to_string().contains("changed while"), "{e}");
}

/// Messages: a corrupted key length does not put the bytes it covers into the message; an OS
/// error is said once; no `Debug` output.
#[test]
fn messages_are_short_single_lines() {
    // A key of 60,000 bytes of NULs and newlines (under the spec's 65,535) that then fails.
    let mut w = GgufWriter::new();
    w.add_metadata("k".repeat(60_000), 1u32);
    w.add_metadata("\0\n".repeat(30_000), 1u32);
    let mut bytes = w.to_bytes();
    // Both keys equal after this: a duplicate key error that names it.
    let second = bytes.windows(2).position(|x| x == b"\0\n").unwrap();
    bytes[second..second + 60_000].copy_from_slice(&b"\0\n".repeat(30_000));
    let first = bytes.windows(3).position(|x| x == b"kkk").unwrap();
    bytes[first..first + 60_000].copy_from_slice(&b"\0\n".repeat(30_000));
    let e = err_of(GgufFile::parse(&bytes, Path::new("m")));
    assert!(e.to_string().contains("duplicate metadata key"), "{e}");
    assert_clean_message(&e.to_string());
    // A key length of 25 MB in a file that long.
    let mut big = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    big.resize(30 << 20, 0);
    big[24..32].copy_from_slice(&(25u64 << 20).to_le_bytes());
    let e = err_of(GgufFile::parse(&big, Path::new("m")));
    assert!(e.to_string().contains("limit"), "{e}");
    assert_clean_message(&e.to_string());
    // OS errors once, and no source() repeating them.
    let e = open_err(Path::new("/definitely/not/here.gguf"));
    assert_eq!(e.to_string().matches("os error 2").count(), 1, "{e}");
    assert!(std::error::Error::source(&e).is_none());
    // No Debug output in writer errors.
    let m = err_of(GgufWriter::new().add_f32("x", &[4], &[0.0; 3])).to_string();
    assert_clean_message(&m);
    let m = err_of(GgufWriter::new().add_tensor("x", DType::Q8_0, &[1, 32], vec![0; 3])).to_string();
    assert!(m.contains("needs 34 bytes, got 3"), "{m}");
    assert_clean_message(&m);
}

// ---------------------------------------------------------------------------------------------
// Real checkpoints (fetched by tools/fetch-model.sh into $WGPU_LLM_MODELS on first use)
// ---------------------------------------------------------------------------------------------

fn finite_sample(ck: &Checkpoint, name: &str, dtype: DType) {
    let v = ck.raw(name).unwrap();
    assert_eq!(v.dtype, dtype, "{name}");
    let shape = v.shape.clone();
    let x = ck.f32(name, &shape).unwrap();
    assert_eq!(x.len(), shape.iter().product::<usize>());
    assert!(x.iter().all(|v| v.is_finite()), "{name}");
    assert!(x.iter().any(|&v| v != 0.0), "{name}");
}

#[test]
fn real_smollm2() {
    let path = common::model("smollm2");
    let ck = Checkpoint::open(&path).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Llama);
    assert_eq!((c.num_layers(), c.hidden_size, d.intermediate_size), (30, 576, 1536));
    assert_eq!((d.num_heads, d.num_kv_heads, d.head_dim, c.vocab_size), (9, 3, 64, 49152));
    assert_eq!(d.rope_theta, 1e5);
    assert!(c.tie_word_embeddings && !c.add_bos);
    assert_eq!(c.eos_token_ids[0], 2);
    assert_eq!(ck.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(ck.chat_template.as_deref().unwrap_or("").contains("im_start"));
    let TokenizerSource::Gguf(t) = &ck.tokenizer else { panic!() };
    assert_eq!((t.model.as_str(), t.tokens.len()), ("gpt2", 49152));
    assert!(!t.merges.is_empty());
    finite_sample(&ck, "blk.3.ffn_up.weight", DType::Q4_1);
    finite_sample(&ck, "blk.0.attn_q.weight", DType::Q4_1);
    finite_sample(&ck, "token_embd.weight", DType::Q8_0);
}

#[test]
fn real_gemma3() {
    let path = common::model("gemma3");
    let ck = Checkpoint::open(&path).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Gemma3);
    assert_eq!((c.num_layers(), c.hidden_size, d.num_heads, d.num_kv_heads, d.head_dim), (18, 640, 4, 1, 256));
    assert_eq!(d.layer_attention[0], LayerAttention::Sliding { window: 512 });
    assert_eq!(d.layer_attention[5], LayerAttention::Full);
    assert_eq!(d.layer_attention[11], LayerAttention::Full);
    assert_eq!(d.layer_attention.iter().filter(|a| **a == LayerAttention::Full).count(), 3);
    assert_eq!(d.rope_local_theta, Some(10000.0));
    assert!(c.tie_word_embeddings && c.add_bos && d.qk_norm && d.sandwich_norm);
    assert_eq!(d.attention_scale, 1.0 / 16.0);
    assert_eq!(ck.bos_token.as_deref(), Some("<bos>"));
    assert!(c.eos_token_ids.contains(&1) && c.eos_token_ids.contains(&106));
    finite_sample(&ck, "blk.0.attn_output.weight", DType::Q4_K);
    finite_sample(&ck, "blk.0.ffn_down.weight", DType::Q6_K);
    finite_sample(&ck, "blk.0.attn_q.weight", DType::Q5_0);
    // GGUF Gemma norms already hold (1 + w): mostly well above zero.
    let n = ck.f32("output_norm.weight", &[640]).unwrap();
    assert!(n.iter().sum::<f32>() / 640.0 > 0.5);
}

#[test]
fn real_qwen05() {
    let path = common::model("qwen05");
    let ck = Checkpoint::open(&path).unwrap();
    let c = &ck.config;
    let d = dense(c);
    assert_eq!(c.arch, Arch::Qwen2);
    assert_eq!((c.num_layers(), c.hidden_size, d.num_heads, d.num_kv_heads), (24, 896, 14, 2));
    assert!(d.attention_bias && !c.tie_word_embeddings);
    assert_eq!(d.rope_theta, 1e6);
    assert!(c.eos_token_ids.contains(&151645));
    finite_sample(&ck, "blk.0.attn_q.bias", DType::F32);
    finite_sample(&ck, "blk.0.ffn_down.weight", DType::Q6_K);
    finite_sample(&ck, "blk.0.attn_v.weight", DType::Q8_0);
}

/// Reading a GGUF header reads the header and nothing after it: the parser consumes exactly
/// `header_len` bytes, garbage in the tensor data changes nothing, and a file whose one tensor is
/// 32 GiB (a sparse file: holes, no disk) is inspected at once.
#[test]
fn gguf_inspect_reads_header_only() {
    struct Counting<'a> {
        inner: &'a [u8],
        read: usize,
    }
    impl std::io::Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read += n;
            Ok(n)
        }
    }
    let bytes = tiny_gguf(&tiny_config(Arch::Llama)).to_bytes();
    let mut src = Counting { inner: &bytes, read: 0 };
    let g = GgufFile::parse_from(&mut src, bytes.len() as u64, Path::new("mem")).unwrap();
    assert_eq!(src.read as u64, g.header_len);
    assert!(g.header_len <= g.data_offset && g.data_offset < bytes.len() as u64);
    assert_eq!(g.data_offset % gguf::DEFAULT_ALIGNMENT as u64, 0);
    assert_eq!(g.get("general.architecture").and_then(|v| v.as_str()), Some("llama"));
    assert_eq!(g.tensors.len(), 1 + 1 + 2 * 9);
    let mut garbage = bytes.clone();
    garbage[g.data_offset as usize..].fill(0xa5);
    assert_eq!(GgufFile::parse(&garbage, Path::new("mem")).unwrap().tensors, g.tensors);

    // One f32 tensor of 2^33 elements, its data a hole.
    let mut w = GgufWriter::new();
    w.add_f32("big", &[1, 8], &[0.0; 8]).unwrap();
    let mut head = w.to_bytes();
    let (nd, _, _) = tensor_info_fields(&head, "big");
    head[nd + 4..nd + 12].copy_from_slice(&(1u64 << 33).to_le_bytes());
    let g0 = GgufFile::parse(&w.to_bytes(), Path::new("m")).unwrap();
    head.truncate(g0.data_offset as usize);
    let p = scratch("sparse.gguf");
    std::fs::write(&p, &head).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(g0.data_offset + (4u64 << 33)).unwrap();
    drop(f);
    let t0 = std::time::Instant::now();
    let g = GgufFile::read(&p).unwrap();
    assert!(t0.elapsed().as_secs_f64() < 2.0, "{:?}", t0.elapsed());
    let t = g.tensor("big").unwrap();
    assert_eq!((t.shape.clone(), t.len), (vec![1, 1 << 33], 4usize << 33));
    std::fs::remove_file(&p).unwrap();
}

#[test]
fn gguf_writer_quantizes() {
    let x = values(4 * 64, 77);
    let mut w = GgufWriter::new();
    for t in [DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::BF16, DType::F16] {
        w.add_quantized(format!("w.{}", t.name()), t, &[4, 64], &x).unwrap();
    }
    assert!(w.add_quantized("bad", DType::Q4_K, &[1, 256], &[0.0; 256]).is_err());
    assert!(w.add_quantized("bad", DType::Q8_0, &[2, 32], &x).is_err());
    let g = GgufFile::parse(&w.to_bytes(), Path::new("m")).unwrap();
    let bytes = w.to_bytes();
    let mut checked = 0;
    for t in &g.tensors {
        let o = t.offset as usize;
        let y = wgpu_llm::loader::dtype::to_f32(t.dtype, &bytes[o..o + t.len], 256).unwrap();
        for (blk, (xb, yb)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let bound = round_trip_bound(t.dtype, xb);
            for (j, ((a, b), tol)) in xb.iter().zip(yb).zip(&bound).enumerate() {
                let err = (a - b).abs();
                assert!(err <= *tol, "{}: block {blk} element {j}: {a} -> {b}, error {err} > {tol}", t.name);
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 7);
}

/// What ggml's reference quantizers can lose on each element of a 32-element block, from the
/// block's own values: half a step (d = amax/127, amax/8, amax/16 or (max - min)/levels), a
/// whole step for Q4_0/Q5_0 elements past the last positive level (their `min(15)` clamp: the
/// scale is set by the largest magnitude, which may be negative), and the f16 rounding of the
/// stored scale and minimum (2^-11 relative, times the largest level) — or the 2^-11 / 2^-8
/// relative rounding of f16 / bf16, plus a few f32 ulps of the largest magnitude.
fn round_trip_bound(t: DType, x: &[f32]) -> Vec<f32> {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
    let f16_rel = 2f32.powi(-11);
    // The quantizers' own f32 arithmetic (v / d, v - min) rounds too.
    let f32_slack = 4.0 * f32::EPSILON * amax;
    x.iter()
        .map(|&v| {
            f32_slack
                + match t {
                    DType::F16 => v.abs() * f16_rel,
                    DType::BF16 => v.abs() * 2f32.powi(-8),
                    DType::Q8_0 => amax / 127.0 / 2.0 + amax * f16_rel,
                    DType::Q4_0 | DType::Q5_0 => {
                        let levels = if t == DType::Q4_0 { 8.0 } else { 16.0 };
                        let d = amax / levels;
                        let clamped = v.abs() > (levels - 0.5) * d && v.signum() != signed_absmax(x).signum();
                        (if clamped { d } else { d / 2.0 }) + amax * f16_rel
                    }
                    DType::Q4_1 | DType::Q5_1 => {
                        let top = if t == DType::Q4_1 { 15.0 } else { 31.0 };
                        (hi - lo) / top / 2.0 + ((hi - lo) + lo.abs()) * f16_rel
                    }
                    other => panic!("no round-trip bound for {other}"),
                }
        })
        .collect()
}

fn signed_absmax(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m })
}

/// MLX's affine quantization written independently of the engine: per group, scale = (max -
/// min) / (2^bits - 1), bias = min, q = round((x - bias) / scale); quants packed as mlx-lm stores
/// them (element j in bits `bits · (j % per_word)` of u32 word `j / per_word`). Returns the
/// packed weight, scales and biases (bf16) and the values they decode to.
fn mlx_quantize(x: &[f32], k: usize, bits: u32, group: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
    let per_word = 32 / bits as usize;
    let levels = ((1u32 << bits) - 1) as f32;
    let (mut words, mut scales, mut biases, mut dq) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for row in x.chunks(k) {
        let mut q_row = Vec::with_capacity(k);
        for g in row.chunks(group) {
            let (lo, hi) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let scale = half::bf16::from_f32((hi - lo) / levels);
            let bias = half::bf16::from_f32(lo);
            scales.extend(scale.to_le_bytes());
            biases.extend(bias.to_le_bytes());
            let (s, b) = (scale.to_f32(), bias.to_f32());
            for &v in g {
                let q = ((v - b) / s).round().clamp(0.0, levels) as u32;
                q_row.push(q);
                dq.push(q as f32 * s + b);
            }
        }
        for w in q_row.chunks(per_word) {
            let word = w.iter().enumerate().fold(0u32, |acc, (i, &q)| acc | (q << (bits as usize * i)));
            words.extend(word.to_le_bytes());
        }
    }
    (words, scales, biases, dq)
}

/// A tiny MLX folder (llama, hidden 32, 2 layers): every projection and the embedding quantized
/// (4-bit group 32; layer 1's down projection 8-bit group 64 by a per-module override), norms in
/// f32. Returns the dequantized values the engine must read for each quantized tensor.
fn mlx_folder(
    dir: &Path,
    config_edit: impl Fn(&mut serde_json::Value),
    tensor_edit: impl Fn(&mut Vec<StTensor>),
) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    std::fs::create_dir_all(dir).unwrap();
    let mut config = serde_json::json!({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 64,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128,
        "tie_word_embeddings": true,
        "quantization": {"group_size": 32, "bits": 4, "mode": "affine",
            "model.layers.1.mlp.down_proj": {"group_size": 64, "bits": 8}}
    });
    config_edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let mut t = Vec::new();
    let mut want = Vec::new();
    for (name, dtype, shape, bytes) in hf_tensors("model.", false, false) {
        if shape.len() == 1 {
            t.push((name, dtype, shape, bytes));
            continue;
        }
        let (n, k) = (shape[0], shape[1]);
        let x = values(n * k, (name.len() * 7 + n) as u32);
        let (bits, group) = if name.contains("layers.1.mlp.down_proj") { (8, 64) } else { (4, 32) };
        let (w, s, b, dq) = mlx_quantize(&x, k, bits, group);
        let stem = name.strip_suffix("weight").unwrap();
        t.push((name.clone(), "U32", vec![n, k * bits as usize / 32], w));
        t.push((format!("{stem}scales"), "BF16", vec![n, k / group], s));
        t.push((format!("{stem}biases"), "BF16", vec![n, k / group], b));
        let canonical = wgpu_llm::loader::hf::canonical_name(&name, Arch::Llama).unwrap();
        want.push((canonical, shape, dq));
    }
    tensor_edit(&mut t);
    write_st(&dir.join("model.safetensors"), &t);
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json(&[])).unwrap();
    want
}

#[test]
fn hf_mlx_affine_folder() {
    let dir = scratch("hf-mlx");
    let want = mlx_folder(&dir, |_| {}, |_| {});
    let ck = Checkpoint::open(&dir).unwrap();
    assert_eq!(want.len(), 15, "7 projections x 2 layers + the embedding");
    for (name, shape, dq) in &want {
        let raw = ck.raw(name).unwrap();
        let expect = if name == "blk.1.ffn_down.weight" { "mlx8_g64_bf16" } else { "mlx4_g32_bf16" };
        assert_eq!((raw.dtype.name(), &raw.shape), (expect, shape), "{name}");
        assert_eq!(&raw.to_f32().unwrap(), dq, "{name}: the engine's blocks decode to MLX's values");
    }
}

#[test]
fn hf_mlx_bad_folders_are_clear_errors() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    type TEdit = Box<dyn Fn(&mut Vec<StTensor>)>;
    let none_c: fn() -> Edit = || Box::new(|_| {});
    let none_t: fn() -> TEdit = || Box::new(|_| {});
    let q = |f: fn(&mut serde_json::Map<String, serde_json::Value>)| -> Edit {
        Box::new(move |c| f(c["quantization"].as_object_mut().unwrap()))
    };
    let cases: Vec<(&str, Edit, TEdit, &str)> = vec![
        (
            "no config",
            Box::new(|c| {
                c.as_object_mut().unwrap().remove("quantization");
            }),
            none_t(),
            "has no quantization",
        ),
        (
            "no group size",
            q(|m| {
                m.remove("group_size");
            }),
            none_t(),
            "no integer group_size",
        ),
        (
            "no bits",
            q(|m| {
                m.remove("bits");
            }),
            none_t(),
            "no integer bits",
        ),
        (
            "mode",
            q(|m| {
                m.insert("mode".into(), "mxfp4".into());
            }),
            none_t(),
            "quantization mode",
        ),
        (
            "3 bits",
            q(|m| {
                m.insert("bits".into(), 3.into());
            }),
            none_t(),
            "3-bit quantization",
        ),
        (
            "group 16",
            q(|m| {
                m.insert("group_size".into(), 16.into());
            }),
            none_t(),
            "group size 16",
        ),
        (
            "override false",
            q(|m| {
                m.insert("model.layers.0.self_attn.q_proj".into(), false.into());
            }),
            none_t(),
            "is not quantized",
        ),
        (
            "no biases",
            none_c(),
            Box::new(|t| t.retain(|x| x.0 != "model.layers.0.mlp.up_proj.biases")),
            "has no biases",
        ),
        (
            "no scales",
            none_c(),
            Box::new(|t| t.retain(|x| x.0 != "model.layers.1.self_attn.k_proj.scales")),
            "has no scales",
        ),
        (
            "scales shape",
            none_c(),
            Box::new(|t| {
                let s = t.iter_mut().find(|x| x.0 == "model.layers.0.mlp.gate_proj.scales").unwrap();
                s.2 = vec![32, 2]; // the same 64 values, the wrong shape
            }),
            "needs scales and biases [64, 1]",
        ),
        (
            "f32 scales",
            none_c(),
            Box::new(|t| {
                for x in t.iter_mut().filter(|x| x.0.starts_with("model.layers.0.self_attn.v_proj.")) {
                    if x.1 == "BF16" {
                        x.1 = "F32";
                        x.3 =
                            x.3.chunks(2)
                                .flat_map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                                .collect();
                    }
                }
            }),
            "f32 quantization scales",
        ),
        (
            "stray scales",
            none_c(),
            Box::new(|t| {
                t.push(("model.layers.0.input_layernorm.scales".into(), "BF16", vec![1], vec![0, 0x3f]));
            }),
            "belongs to no quantized weight",
        ),
    ];
    for (what, c, t, needle) in cases {
        let dir = scratch(&format!("hf-mlx-bad-{}", what.replace(' ', "-")));
        mlx_folder(&dir, c, t);
        let msg = err_of(Checkpoint::open(&dir)).to_string();
        common::assert_clean_message(&msg);
        assert!(msg.contains(needle), "{what}: {msg}");
    }
}
