//! [`GgufWriter`]: GGUF files for synthetic test and benchmark models.

use super::file::{limits, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_DIMS};
use super::tokenizer::GgufTokenizerData;
use super::value::{GgufType, GgufValue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::loader::fmt_shape;
use crate::model::config::{MlpSpec, ModelConfig};
use std::path::{Path, PathBuf};

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

/// Builds a GGUF v3 file in memory: metadata, then tensors (row-major shapes, outermost first,
/// as everywhere in this crate).
///
/// ```no_run
/// use wgpu_llm::loader::gguf::GgufWriter;
/// # fn main() -> wgpu_llm::error::Result<()> {
/// let mut w = GgufWriter::new();
/// w.add_metadata("general.architecture", "qwen2");
/// w.add_metadata("qwen2.block_count", 1u32);
/// w.add_f32("output_norm.weight", &[8], &[1.0; 8])?;
/// w.add_f32_as_f16("token_embd.weight", &[16, 8], &vec![0.5; 128])?;
/// w.write(std::path::Path::new("/tmp/tiny.gguf"))?;
/// # Ok(()) }
/// ```
/// [`GgufWriter::add_model_config`] writes all the `{arch}.*` keys that [`open`](super::open) reads from a
/// [`ModelConfig`], so a synthetic model needs only that plus its tensors.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    alignment: usize,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter { alignment: DEFAULT_ALIGNMENT, metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Data alignment (a power of two); written as `general.alignment` when not 32.
    pub fn set_alignment(&mut self, alignment: usize) -> Result<&mut Self> {
        if alignment < 8 || !alignment.is_power_of_two() || alignment as u64 > limits::MAX_ALIGNMENT {
            return Err(Error::InvalidArgument(format!(
                "GGUF alignment {alignment}: a power of two from 8 to {} is needed",
                limits::MAX_ALIGNMENT
            )));
        }
        self.alignment = alignment;
        if alignment != DEFAULT_ALIGNMENT {
            self.add_metadata("general.alignment", alignment as u32);
        }
        Ok(self)
    }

    /// Sets a metadata key (replacing an earlier value of the same key).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: impl Into<GgufValue>) -> &mut Self {
        let (key, value) = (key.into(), value.into());
        match self.metadata.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.metadata.push((key, value)),
        }
        self
    }

    /// Removes a metadata key, if set.
    pub fn remove_metadata(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Adds a tensor from its stored bytes (any [`DType`], quantized blocks included).
    /// `shape` is row-major, outermost first; its last dimension must be a whole number of blocks.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[usize],
        bytes: impl Into<Vec<u8>>,
    ) -> Result<&mut Self> {
        let (name, bytes) = (name.into(), bytes.into());
        if shape.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!("tensor {name}: {} dimensions", shape.len())));
        }
        if dtype.ggml_type().is_none() {
            return Err(Error::InvalidArgument(format!("tensor {name}: GGUF has no type {dtype}")));
        }
        let row = shape.last().copied().unwrap_or(1);
        if row % dtype.block_size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "tensor {name}: row length {row} is not a multiple of the {dtype} block size {}",
                dtype.block_size()
            )));
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        match numel.and_then(|n| dtype.byte_size(n)) {
            Some(want) if want == bytes.len() => {}
            Some(want) => {
                return Err(Error::InvalidArgument(format!(
                    "tensor {name}: shape {} of {dtype} needs {want} bytes, got {}",
                    fmt_shape(shape),
                    bytes.len()
                )))
            }
            None => return Err(Error::InvalidArgument(format!("tensor {name}: shape {} overflows", fmt_shape(shape)))),
        }
        if self.tensors.iter().any(|t| t.0 == name) {
            return Err(Error::InvalidArgument(format!("tensor {name} added twice")));
        }
        self.tensors.push((name, dtype, shape.to_vec(), bytes));
        Ok(self)
    }

    /// Adds an f32 tensor.
    pub fn add_f32(&mut self, name: impl Into<String>, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, DType::F32, shape, bytes)
    }

    /// Adds an f16 tensor.
    pub fn add_f16(&mut self, name: impl Into<String>, shape: &[usize], data: &[half::f16]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.add_tensor(name, DType::F16, shape, bytes)
    }

    /// Adds f32 data stored as f16.
    pub fn add_f32_as_f16(&mut self, name: impl Into<String>, shape: &[usize], data: &[f32]) -> Result<&mut Self> {
        let bytes: Vec<u8> = data.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect();
        self.add_tensor(name, DType::F16, shape, bytes)
    }

    /// Adds f32 data quantized to `dtype` with [`super::dtype::quantize`] (F32, F16, BF16,
    /// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
    pub fn add_quantized(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        shape: &[usize],
        data: &[f32],
    ) -> Result<&mut Self> {
        let name = name.into();
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel != Some(data.len()) {
            return Err(Error::InvalidArgument(format!(
                "tensor {name}: shape {} does not hold {} values",
                fmt_shape(shape),
                data.len()
            )));
        }
        let bytes = crate::dtype::quantize(dtype, data)?;
        self.add_tensor(name, dtype, shape, bytes)
    }

    /// Writes `general.architecture` and every `{arch}.*` key [`open`](super::open) reads, from `cfg`.
    /// Token ids (`bos_token_id`, the first of `eos_token_ids`) and `add_bos` go to the
    /// `tokenizer.ggml.*` keys. Things GGUF cannot express are implied by the architecture
    /// on reading (Gemma 3's layer pattern, scales, norms), so `open` reproduces `cfg` only when
    /// `cfg` follows them. Note that `open` un-permutes Llama Q/K rows (see [`Fixup`](crate::loader::Fixup)).
    pub fn add_model_config(&mut self, cfg: &ModelConfig) -> &mut Self {
        let a = cfg.arch.name();
        let k = |s: &str| format!("{a}.{s}");
        // A dense model's layers share their shape: the first full-attention layer says it.
        let attn: Vec<_> = (0..cfg.num_layers()).filter_map(|l| cfg.attention(l).copied()).collect();
        let full = attn.iter().find(|a| a.window.is_none()).or(attn.first()).copied();
        let intermediate = cfg.layers.first().map_or(0, |s| match s.mlp {
            MlpSpec::Dense { intermediate, .. } | MlpSpec::Moe { intermediate, .. } => intermediate,
        });
        self.add_architecture(a, cfg);
        self.add_metadata(k("feed_forward_length"), intermediate as u32);
        if let Some(f) = full {
            self.add_metadata(k("attention.head_count"), f.heads as u32);
            self.add_metadata(k("attention.head_count_kv"), f.kv_heads as u32);
            self.add_metadata(k("attention.key_length"), f.head_dim as u32);
            self.add_metadata(k("attention.value_length"), f.head_dim as u32);
        }
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        if let Some(f) = full {
            self.add_metadata(k("rope.freq_base"), f.rope.theta);
            if f.rope.scaling != 1.0 {
                self.add_metadata(k("rope.scaling.type"), "linear");
                self.add_metadata(k("rope.scaling.factor"), f.rope.scaling);
            }
        }
        if let Some(w) = attn.iter().find_map(|a| a.window) {
            self.add_metadata(k("attention.sliding_window"), w);
        }
        if let Some(c) = cfg.final_logit_softcapping {
            self.add_metadata(k("final_logit_softcapping"), c);
        }
        if let Some(b) = cfg.bos_token_id {
            self.add_metadata("tokenizer.ggml.bos_token_id", b);
        }
        if let Some(&e) = cfg.eos_token_ids.first() {
            self.add_metadata("tokenizer.ggml.eos_token_id", e);
        }
        self.add_metadata("tokenizer.ggml.add_bos_token", cfg.add_bos);
        self
    }

    /// Writes `general.architecture` (`arch`) and the sizes every architecture states:
    /// `{arch}.block_count`, `context_length` and `embedding_length`.
    fn add_architecture(&mut self, arch: &str, cfg: &ModelConfig) {
        let k = |s: &str| format!("{arch}.{s}");
        self.add_metadata("general.architecture", arch);
        self.add_metadata(k("block_count"), cfg.num_layers() as u32);
        self.add_metadata(k("context_length"), cfg.max_position_embeddings as u32);
        self.add_metadata(k("embedding_length"), cfg.hidden_size as u32);
    }

    /// Writes the `qwen35moe.*` keys of llama.cpp's Qwen3.5-MoE that [`open`](super::open) reads back into
    /// `cfg` (a Qwen3.5-MoE config: [`crate::model::qwen3_5_moe::Qwen35MoeConfig::model_config`]):
    /// the layer pattern as `full_attention_interval` when it is every n-th layer, else as
    /// `attention.recurrent_layers`; `vocab_size` for files without a tokenizer.
    pub fn add_qwen35moe_config(&mut self, cfg: &ModelConfig) -> Result<&mut Self> {
        use crate::model::config::{Mixer, MlpSpec};
        let bad = || Error::InvalidArgument("add_qwen35moe_config: not a Qwen3.5-MoE config".into());
        let specs: Vec<_> = (0..cfg.num_layers()).map(|l| cfg.layer(l)).collect();
        let full: Vec<bool> = specs.iter().map(|s| matches!(s.mixer, Mixer::Attention(_))).collect();
        let att = specs.iter().find_map(|s| match s.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        });
        let dn = specs.iter().find_map(|s| match s.mixer {
            Mixer::DeltaNet(d) => Some(d),
            Mixer::Attention(_) => None,
        });
        let (Some(a), Some(d), Some(MlpSpec::Moe { experts, top_k, intermediate, shared_intermediate, .. })) =
            (att, dn, specs.first().map(|s| s.mlp))
        else {
            return Err(bad());
        };
        let k = |s: &str| format!("qwen35moe.{s}");
        let u = |v: usize| GgufValue::U32(v as u32);
        self.add_architecture("qwen35moe", cfg);
        self.add_metadata(k("vocab_size"), u(cfg.vocab_size));
        self.add_metadata(k("attention.head_count"), u(a.heads));
        self.add_metadata(k("attention.head_count_kv"), u(a.kv_heads));
        self.add_metadata(k("attention.key_length"), u(a.head_dim));
        self.add_metadata(k("attention.value_length"), u(a.head_dim));
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        self.add_metadata(k("rope.freq_base"), a.rope.theta);
        self.add_metadata(k("rope.dimension_count"), u(a.rope.rotary_dim));
        // Qwen3.5's interleaved M-RoPE sections (11, 11, 10 of 32 pairs at the 35B-A3B's 64
        // rotary dims); text positions make it the plain rotary embedding.
        let pairs = (a.rope.rotary_dim / 2) as i32;
        let (s0, s1) = (pairs * 11 / 32, pairs * 11 / 32);
        self.add_metadata(k("rope.dimension_sections"), vec![s0, s1, pairs - s0 - s1, 0]);
        match (1..=cfg.num_layers()).find(|&n| full.iter().enumerate().all(|(i, &f)| f == ((i + 1) % n == 0))) {
            Some(n) => self.add_metadata(k("full_attention_interval"), u(n)),
            None => self.add_metadata(
                k("attention.recurrent_layers"),
                GgufValue::Array(full.iter().map(|&f| GgufValue::Bool(!f)).collect()),
            ),
        };
        self.add_metadata(k("expert_count"), u(experts));
        self.add_metadata(k("expert_used_count"), u(top_k));
        self.add_metadata(k("expert_feed_forward_length"), u(intermediate));
        if shared_intermediate > 0 {
            self.add_metadata(k("expert_shared_feed_forward_length"), u(shared_intermediate));
        }
        self.add_metadata(k("ssm.conv_kernel"), u(d.conv_kernel));
        self.add_metadata(k("ssm.state_size"), u(d.k_dim));
        self.add_metadata(k("ssm.group_count"), u(d.k_heads));
        self.add_metadata(k("ssm.time_step_rank"), u(d.v_heads));
        self.add_metadata(k("ssm.inner_size"), u(d.value_dim()));
        Ok(self)
    }

    /// Writes the `gemma4.*` keys of llama.cpp's Gemma 4 that [`open`](super::open) reads back into `cfg` (a
    /// Gemma 4 config: [`crate::model::gemma4::Gemma4Config::model_config`]), and returns the
    /// `rope_freqs.weight` factors its full layers need (proportional RoPE: 1 for the pairs that
    /// turn, 1e30 for the rest; `None` for full rotary), for the caller to add as an F32 tensor.
    pub fn add_gemma4_config(&mut self, cfg: &ModelConfig) -> Result<Option<Vec<f32>>> {
        use crate::model::config::{AttentionSpec, Mixer, MlpSpec};
        let bad = |what: &str| Error::InvalidArgument(format!("add_gemma4_config: {what}"));
        let att: Vec<AttentionSpec> = (0..cfg.num_layers())
            .map(|l| match cfg.layer(l) {
                spec if spec.output_scale && spec.sandwich_norm => match (spec.mixer, spec.mlp) {
                    (Mixer::Attention(a), MlpSpec::Dense { .. }) => Ok(a),
                    _ => Err(bad("not a Gemma 4 layer")),
                },
                _ => Err(bad("not a Gemma 4 layer")),
            })
            .collect::<Result<_>>()?;
        let sliding = att.iter().find(|a| a.window.is_some()).ok_or_else(|| bad("no sliding layer"))?;
        let full = att.iter().find(|a| a.window.is_none()).ok_or_else(|| bad("no full layer"))?;
        let k = |s: &str| format!("gemma4.{s}");
        let u = |v: usize| GgufValue::U32(v as u32);
        self.add_architecture("gemma4", cfg);
        let ffn: Vec<usize> = (0..cfg.num_layers())
            .map(|l| match cfg.layer(l).mlp {
                MlpSpec::Dense { intermediate, .. } => intermediate,
                MlpSpec::Moe { .. } => 0,
            })
            .collect();
        if ffn.iter().all(|&f| f == ffn[0]) {
            self.add_metadata(k("feed_forward_length"), u(ffn[0]));
        } else {
            self.add_metadata(k("feed_forward_length"), GgufValue::Array(ffn.iter().map(|&f| u(f)).collect()));
        }
        self.add_metadata(k("embedding_length_per_layer_input"), u(cfg.per_layer_input.map_or(0, |p| p.dim)));
        self.add_metadata(k("attention.head_count"), u(sliding.heads));
        self.add_metadata(k("attention.head_count_kv"), GgufValue::Array(att.iter().map(|a| u(a.kv_heads)).collect()));
        self.add_metadata(k("attention.key_length"), u(full.head_dim));
        self.add_metadata(k("attention.value_length"), u(full.head_dim));
        self.add_metadata(k("attention.key_length_swa"), u(sliding.head_dim));
        self.add_metadata(k("attention.value_length_swa"), u(sliding.head_dim));
        self.add_metadata(k("attention.sliding_window"), u(sliding.window.unwrap_or(0) as usize));
        self.add_metadata(
            k("attention.sliding_window_pattern"),
            GgufValue::Array(att.iter().map(|a| GgufValue::Bool(a.window.is_some())).collect()),
        );
        self.add_metadata(k("attention.layer_norm_rms_epsilon"), cfg.rms_norm_eps);
        let shared = att.iter().filter(|a| a.kv_from.is_some()).count();
        self.add_metadata(k("attention.shared_kv_layers"), u(shared));
        self.add_metadata(k("rope.freq_base"), full.rope.theta);
        self.add_metadata(k("rope.freq_base_swa"), sliding.rope.theta);
        // llama.cpp rotates every dim (NEOX pairs over the head); partial rotation is in rope_freqs.
        self.add_metadata(k("rope.dimension_count"), u(full.head_dim));
        self.add_metadata(k("rope.dimension_count_swa"), u(sliding.head_dim));
        self.add_metadata(k("final_logit_softcapping"), cfg.final_logit_softcapping.unwrap_or(0.0));
        if sliding.rope.rotary_dim != sliding.head_dim
            || (!full.rope.proportional && full.rope.rotary_dim != full.head_dim)
        {
            return Err(bad("partial rotary other than proportional RoPE on full layers"));
        }
        Ok(full
            .rope
            .proportional
            .then(|| (0..full.head_dim / 2).map(|i| if i < full.rope.rotary_dim / 2 { 1.0 } else { 1e30 }).collect()))
    }

    /// Writes the `tokenizer.ggml.*` keys of `t` (empty vectors and `None`s are left out).
    pub fn add_tokenizer(&mut self, t: &GgufTokenizerData) -> &mut Self {
        let p = |s: &str| format!("tokenizer.ggml.{s}");
        if !t.model.is_empty() {
            self.add_metadata(p("model"), t.model.as_str());
        }
        if let Some(pre) = &t.pre {
            self.add_metadata(p("pre"), pre.as_str());
        }
        if !t.tokens.is_empty() {
            self.add_metadata(p("tokens"), t.tokens.clone());
        }
        if !t.scores.is_empty() {
            self.add_metadata(p("scores"), t.scores.clone());
        }
        if !t.token_types.is_empty() {
            self.add_metadata(p("token_type"), t.token_types.clone());
        }
        if !t.merges.is_empty() {
            self.add_metadata(p("merges"), t.merges.clone());
        }
        for (name, id) in [
            ("bos", t.bos_token_id),
            ("eos", t.eos_token_id),
            ("eot", t.eot_token_id),
            ("eom", t.eom_token_id),
            ("unknown", t.unknown_token_id),
            ("padding", t.padding_token_id),
        ] {
            match id {
                Some(id) => self.add_metadata(p(&format!("{name}_token_id")), id),
                None => self.remove_metadata(&p(&format!("{name}_token_id"))),
            };
        }
        self.add_metadata(p("add_bos_token"), t.add_bos_token);
        self.add_metadata(p("add_eos_token"), t.add_eos_token);
        if let Some(s) = t.add_space_prefix {
            self.add_metadata(p("add_space_prefix"), s);
        }
        self
    }

    /// The whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            write_string(&mut out, k);
            out.extend_from_slice(&v.type_id().to_le_bytes());
            write_value(&mut out, v);
        }
        let align = |n: usize| n.div_ceil(self.alignment) * self.alignment;
        let mut offset = 0usize;
        for (name, dtype, shape, bytes) in &self.tensors {
            write_string(&mut out, name);
            out.extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for &d in shape.iter().rev() {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&dtype.ggml_type().expect("add_tensor checks the type").to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = align(offset + bytes.len());
        }
        out.resize(align(out.len()), 0);
        for (_, _, _, bytes) in &self.tensors {
            out.extend_from_slice(bytes);
            out.resize(align(out.len()), 0);
        }
        out
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_bytes()).map_err(|e| Error::io(PathBuf::from(path), e))
    }
}

fn write_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => write_string(out, s),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Array(a) => {
            // An empty array has no element to take the type from: call it u8.
            let elem = a.first().map_or(GgufType::U8 as u32, |e| e.type_id());
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                assert_eq!(e.type_id(), elem, "GGUF arrays hold elements of one type");
                write_value(out, e);
            }
        }
    }
}
