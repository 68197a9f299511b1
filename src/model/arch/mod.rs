//! One module per architecture, each written like its modeling file: it turns a checkpoint's
//! hyperparameters (the neutral view both loaders fill: [`Hyperparams`] for the dense
//! families, [`gemma4::Gemma4Config`] and [`qwen3_5_moe::Qwen35MoeConfig`] for theirs) into the
//! model-wide fields and one [`LayerSpec`](super::config::LayerSpec) per layer, and names its
//! tensors. The loaders only parse formats: they map config.json keys / GGUF `{arch}.*` keys onto
//! this vocabulary and call [`model_config`].
//!
//! Adding an architecture: a module here, a variant of [`Arch`] (its names in [`Arch::parse`]),
//! and its row in [`defaults`] / [`model_config`].

pub mod gemma3;
pub mod gemma4;
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5_moe;

use super::config::{
    Activation, Arch, AttentionSpec, LayerAttention, LayerSpec, Mixer, MlpSpec, ModelConfig, RopeSpec,
};

/// The hyperparameters of a dense decoder (Llama, Qwen2, Qwen3, Gemma 3) in one vocabulary:
/// transformers' config names, read from config.json or from the GGUF `{arch}.*` keys that say
/// the same (the loaders apply [`Defaults`] where a config.json leaves a key out).
#[derive(Clone, Debug, PartialEq)]
pub struct Hyperparams {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// RoPE base of full-attention layers.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers when the checkpoint says it (Gemma 3's
    /// `rope_local_base_freq`); `None` = the architecture's default.
    pub rope_local_theta: Option<f32>,
    /// Linear RoPE scaling factor of full-attention layers; 1 = none.
    pub rope_scaling_factor: f32,
    pub max_position_embeddings: usize,
    /// Each layer's attention span (`layer_types` / the sliding window pattern), one per layer.
    pub layer_types: Vec<LayerAttention>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias.
    pub attention_bias: bool,
    pub activation: Activation,
    /// Gemma's `query_pre_attn_scalar` (scores scaled by its inverse square root) when the
    /// checkpoint says it; `None` = the architecture's rule.
    pub query_pre_attn_scalar: Option<f32>,
    pub final_logit_softcapping: Option<f32>,
}

/// transformers' config-class defaults of an architecture, for the config.json keys a checkpoint
/// leaves out (a GGUF file carries its keys).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Defaults {
    /// `head_dim`; `None` = hidden_size / num_attention_heads.
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub rope_theta: f32,
    /// The activation's key (`hidden_act` or Gemma's `hidden_activation`) and its default.
    pub activation_key: &'static str,
    pub activation: &'static str,
    pub tie_word_embeddings: bool,
    /// Sliding layers without `layer_types`: every `n`-th layer full (Gemma's
    /// `sliding_window_pattern`), with `rope_local_base_freq` and `query_pre_attn_scalar` read.
    pub sliding_window_pattern: Option<usize>,
    /// Sliding layers by `use_sliding_window` / `max_window_layers` (Qwen2, Qwen3).
    pub use_sliding_window: bool,
}

/// The defaults of `arch`'s config class (dense families).
pub fn defaults(arch: Arch) -> Defaults {
    match arch {
        Arch::Llama => llama::DEFAULTS,
        Arch::Qwen2 => qwen2::DEFAULTS,
        Arch::Qwen3 => qwen3::DEFAULTS,
        Arch::Gemma3 => gemma3::DEFAULTS,
        // Their own hyperparameters (Qwen35MoeConfig, Gemma4Config), read with their own defaults.
        Arch::Qwen35Moe | Arch::Gemma4 => unreachable!("{} has its own config", arch.name()),
    }
}

/// The model a dense checkpoint's hyperparameters describe, by its architecture's module.
pub fn model_config(h: &Hyperparams) -> ModelConfig {
    match h.arch {
        Arch::Llama => llama::model_config(h),
        Arch::Qwen2 => qwen2::model_config(h),
        Arch::Qwen3 => qwen3::model_config(h),
        Arch::Gemma3 => gemma3::model_config(h),
        // Their own hyperparameters (Qwen35MoeConfig, Gemma4Config); the loaders fill those.
        Arch::Qwen35Moe | Arch::Gemma4 => unreachable!("{} has its own config", h.arch.name()),
    }
}

/// A gated MLP's activation by its transformers name (`hidden_act` / `hidden_activation`).
pub fn activation(name: &str) -> Option<Activation> {
    match name {
        "silu" | "swish" => Some(Activation::SiluGated),
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some(Activation::GeluTanhGated),
        _ => None,
    }
}

/// Whether llama.cpp's GGUF converter stored this architecture's q and k rows with their rotary
/// halves interleaved (its `permute`), which the loader undoes on reading.
pub fn gguf_permuted_qk(arch: Arch) -> bool {
    arch == Arch::Llama
}

/// What differs between the dense architectures' blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DenseBlock {
    /// Per-head RMSNorm on q and k before RoPE.
    pub qk_norm: bool,
    /// RMSNorms after attention and after the MLP, before each residual add.
    pub sandwich_norm: bool,
    /// The embedding is multiplied by sqrt(hidden).
    pub scaled_embedding: bool,
    /// The attention score scale.
    pub attention_scale: f32,
    /// RoPE base of sliding-window layers.
    pub rope_local_theta: f32,
}

/// The dense decoder: every layer softmax attention (full or sliding) and a gated MLP.
pub(crate) fn dense(h: &Hyperparams, b: DenseBlock) -> ModelConfig {
    let d = h.head_dim;
    let layers = h
        .layer_types
        .iter()
        .map(|kind| {
            let (window, rope) = match *kind {
                LayerAttention::Sliding { window } => (Some(window), RopeSpec::full(b.rope_local_theta, d)),
                LayerAttention::Full => {
                    (None, RopeSpec { scaling: h.rope_scaling_factor, ..RopeSpec::full(h.rope_theta, d) })
                }
            };
            LayerSpec {
                mixer: Mixer::Attention(AttentionSpec {
                    heads: h.num_attention_heads,
                    kv_heads: h.num_key_value_heads,
                    head_dim: d,
                    window,
                    rope,
                    scale: b.attention_scale,
                    bias: h.attention_bias,
                    qk_norm: b.qk_norm,
                    output_gate: false,
                    k_eq_v: false,
                    v_norm: false,
                    kv_from: None,
                }),
                mlp: MlpSpec::Dense { intermediate: h.intermediate_size, activation: h.activation },
                sandwich_norm: b.sandwich_norm,
                output_scale: false,
            }
        })
        .collect();
    ModelConfig {
        arch: h.arch,
        vocab_size: h.vocab_size,
        hidden_size: h.hidden_size,
        rms_norm_eps: h.rms_norm_eps,
        max_position_embeddings: h.max_position_embeddings,
        tie_word_embeddings: h.tie_word_embeddings,
        embedding_scale: if b.scaled_embedding { (h.hidden_size as f32).sqrt() } else { 1.0 },
        final_logit_softcapping: h.final_logit_softcapping,
        per_layer_input: None,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        add_bos: false,
        layers,
    }
}

/// How a checkpoint tensor of a layer becomes the engine's: its canonical name (`blk.{i}.` +
/// this), or a tensor split in two by rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorName {
    One(&'static str),
    /// Rows in groups of `2 n`: the first n of each group are `.0`, the rest `.1`. `q_proj` =
    /// [q_h | gate_h] per head; transformers' fused `experts.gate_up_proj` = [gate_e | up_e] per
    /// expert.
    Halves(&'static str, &'static str),
    /// One expert's matrix of a stack (`experts.{e}.gate_proj` in transformers' checkpoints):
    /// stacked in expert order into the canonical `[E, rows, cols]` tensor.
    Expert(&'static str, usize),
}

/// The canonical name of a layer tensor (`blk.{i}.` + this) by its module path after
/// `model.layers.{i}.` in transformers' and mlx-lm's names, for `arch`.
pub fn tensor_name(arch: Arch, module: &str) -> Option<TensorName> {
    match arch {
        Arch::Llama => llama::tensor_name(module),
        Arch::Qwen2 => qwen2::tensor_name(module),
        Arch::Qwen3 => qwen3::tensor_name(module),
        Arch::Gemma3 => gemma3::tensor_name(module),
        Arch::Qwen35Moe => qwen3_5_moe::tensor_name(module),
        Arch::Gemma4 => gemma4::tensor_name(module).map(TensorName::One),
    }
}

/// The dense decoders' layer tensors (`mlp.*`, `self_attn.*`; Llama's pre-MLP norm is
/// `post_attention_layernorm`).
pub(crate) fn dense_tensor_name(module: &str) -> Option<TensorName> {
    let (module, suffix) = module.rsplit_once('.')?;
    let name = match (module, suffix) {
        ("input_layernorm", "weight") => "attn_norm.weight",
        ("self_attn.q_proj", "weight") => "attn_q.weight",
        ("self_attn.q_proj", "bias") => "attn_q.bias",
        ("self_attn.k_proj", "weight") => "attn_k.weight",
        ("self_attn.k_proj", "bias") => "attn_k.bias",
        ("self_attn.v_proj", "weight") => "attn_v.weight",
        ("self_attn.v_proj", "bias") => "attn_v.bias",
        ("self_attn.o_proj", "weight") => "attn_output.weight",
        ("self_attn.o_proj", "bias") => "attn_output.bias",
        ("self_attn.q_norm", "weight") => "attn_q_norm.weight",
        ("self_attn.q_norm", "bias") => "attn_q_norm.bias",
        ("self_attn.k_norm", "weight") => "attn_k_norm.weight",
        ("self_attn.k_norm", "bias") => "attn_k_norm.bias",
        ("post_attention_layernorm", "weight") => "ffn_norm.weight",
        ("post_attention_layernorm", "bias") => "ffn_norm.bias",
        ("pre_feedforward_layernorm", "weight") => "ffn_norm.weight",
        ("pre_feedforward_layernorm", "bias") => "ffn_norm.bias",
        ("post_feedforward_layernorm", "weight") => "post_ffw_norm.weight",
        ("post_feedforward_layernorm", "bias") => "post_ffw_norm.bias",
        ("mlp.gate_proj", "weight") => "ffn_gate.weight",
        ("mlp.gate_proj", "bias") => "ffn_gate.bias",
        ("mlp.up_proj", "weight") => "ffn_up.weight",
        ("mlp.up_proj", "bias") => "ffn_up.bias",
        ("mlp.down_proj", "weight") => "ffn_down.weight",
        ("mlp.down_proj", "bias") => "ffn_down.bias",
        _ => return None,
    };
    Some(TensorName::One(name))
}
