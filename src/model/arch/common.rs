//! What the architecture modules share: the neutral hyperparameters both loaders fill
//! ([`Hyperparams`]), transformers' config defaults ([`Defaults`]), the dense decoder block
//! ([`dense`]) and the tensor-name vocabulary ([`TensorName`]).

use crate::model::config::{
    Activation, Arch, AttentionSpec, LayerAttention, LayerSpec, Mixer, MlpSpec, ModelConfig, PerLayerInput, RopeSpec,
};

/// The hyperparameters of a checkpoint in one vocabulary, whatever its format: transformers'
/// config names, read from config.json or from the GGUF `{arch}.*` keys that say the same (the
/// loaders apply [`Defaults`] where a config.json leaves a key out). The dense families read the
/// first block of fields; Gemma 4 and Qwen3.5-MoE also the ones after `final_logit_softcapping`
/// (left at [`Default`] by the others).
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

    /// The sliding layers' window as the checkpoint says it, also where no layer slides (Gemma 4
    /// checks it); `None` = the windows of `layer_types`.
    pub sliding_window: Option<u32>,
    /// How full-attention layers differ from the others (Gemma 4).
    pub full_layers: FullLayers,
    /// `partial_rotary_factor` of full-attention layers (1 = the whole head).
    pub partial_rotary_factor: f32,
    /// A sparse mixture of experts in every layer.
    pub moe: Option<MoeParams>,
    /// The Gated DeltaNet of `linear_attention` layers.
    pub delta_net: Option<DeltaNetParams>,
    /// Per-layer input embeddings (`hidden_size_per_layer_input`, `vocab_size_per_layer_input`).
    pub per_layer_input: Option<PerLayerInput>,
    /// The last layers that read an earlier layer's KV cache (`num_kv_shared_layers`).
    pub num_kv_shared_layers: usize,
    /// Shared-KV layers' MLPs are twice as wide (`use_double_wide_mlp`).
    pub double_wide_mlp: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

impl Default for Hyperparams {
    /// Zero sizes and no optional part: a base for `..Default::default()`.
    fn default() -> Self {
        Hyperparams {
            arch: Arch::Llama,
            vocab_size: 0,
            hidden_size: 0,
            intermediate_size: 0,
            num_attention_heads: 0,
            num_key_value_heads: 0,
            head_dim: 0,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_local_theta: None,
            rope_scaling_factor: 1.0,
            max_position_embeddings: 0,
            layer_types: Vec::new(),
            tie_word_embeddings: false,
            attention_bias: false,
            activation: Activation::SiluGated,
            query_pre_attn_scalar: None,
            final_logit_softcapping: None,
            sliding_window: None,
            full_layers: FullLayers::default(),
            partial_rotary_factor: 1.0,
            moe: None,
            delta_net: None,
            per_layer_input: None,
            num_kv_shared_layers: 0,
            double_wide_mlp: false,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
        }
    }
}

impl Hyperparams {
    /// Rotated dims of a full-attention head by `partial_rotary_factor`:
    /// `int(head_dim * partial_rotary_factor)` (transformers' `compute_default_rope_parameters`).
    pub fn partial_rotary_dim(&self) -> usize {
        (self.head_dim as f32 * self.partial_rotary_factor) as usize
    }
}

/// How a model's full-attention layers differ from its others (Gemma 4's `global_*` keys); the
/// default: not at all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FullLayers {
    /// Head dim where it differs from `head_dim` (`global_head_dim`).
    pub head_dim: Option<usize>,
    /// KV heads with `k_eq_v` (`num_global_key_value_heads`).
    pub kv_heads: Option<usize>,
    /// No v projection: values are k_proj's output (`attention_k_eq_v`).
    pub k_eq_v: bool,
    /// Proportional RoPE (`rope_type: proportional`); else default.
    pub rope_proportional: bool,
}

/// A sparse MoE block's sizes (`num_experts`, `num_experts_per_tok`, `moe_intermediate_size`,
/// `shared_expert_intermediate_size`: 0 = no shared expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeParams {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
}

/// A Gated DeltaNet's sizes (`linear_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetParams {
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    /// The value heads are in llama.cpp's GGUF order (tiled over the key heads).
    pub value_heads_tiled: bool,
}

/// A GGUF tensor under the engine's name, by its architecture's mapping of llama.cpp's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgufTensor<'a> {
    /// The canonical name after `blk.{i}.` (or the whole name outside layers); `a|b` = a tensor
    /// split into halves by rows (see [`TensorName::Halves`]).
    pub name: &'a str,
    /// Stored as `-exp(x)` of the engine's `x` (llama.cpp's `ssm_a` = `-exp(A_log)`).
    pub neg_exp: bool,
    /// A vector the engine reads as a one-row matrix.
    pub as_row: bool,
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

/// A gated MLP's activation by its transformers name (`hidden_act` / `hidden_activation`).
pub fn activation(name: &str) -> Option<Activation> {
    match name {
        "silu" | "swish" => Some(Activation::SiluGated),
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Some(Activation::GeluTanhGated),
        _ => None,
    }
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

impl DenseBlock {
    /// Llama's block: no q/k norm, no sandwich norms, an unscaled embedding, scores scaled by
    /// 1/sqrt(head_dim), sliding layers (if any) at the checkpoint's local RoPE base or the global one.
    pub(crate) fn llama(h: &Hyperparams) -> DenseBlock {
        DenseBlock {
            qk_norm: false,
            sandwich_norm: false,
            scaled_embedding: false,
            attention_scale: 1.0 / (h.head_dim as f32).sqrt(),
            rope_local_theta: h.rope_local_theta.unwrap_or(h.rope_theta),
        }
    }
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
                LayerAttention::Full | LayerAttention::Linear => {
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
