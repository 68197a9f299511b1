//! Gemma 4 (text), as transformers' `modeling_gemma4.py` (`Gemma4ForCausalLM`, the text part of
//! `Gemma4ForConditionalGeneration`) and mlx-lm's `gemma4_text.py` write it.
//!
//! ```text
//! Gemma4TextModel:
//!     x = embed_tokens(ids) * sqrt(hidden)
//!     for layer in layers: x = Gemma4TextDecoderLayer(x)
//!     logits = lm_head(norm(x)); logits = cap * tanh(logits / cap)   # final_logit_softcapping
//! Gemma4TextDecoderLayer:
//!     h = x + post_attention_layernorm(self_attn(input_layernorm(x)))
//!     out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
//!     out = out * layer_scalar                                      # a learned scalar per layer
//! Gemma4TextAttention, by config.layer_types[i]:
//!     "sliding_attention": head_dim, num_key_value_heads, window sliding_window,
//!                          RoPE "default" at rope_parameters.sliding_attention.rope_theta
//!     "full_attention":    global_head_dim, num_global_key_value_heads (with attention_k_eq_v),
//!                          RoPE "proportional": pairs (i, i + D/2), the first
//!                          partial_rotary_factor * D / 2 at theta^(-2i/D), the rest unrotated;
//!                          with attention_k_eq_v no v_proj: v = k_proj(x)
//!     q = rope(q_norm(q_proj(x))); k = rope(k_norm(k)); v = v_norm(v)   # v_norm: no weight
//!     o_proj(softmax(q · kᵀ) v)                                      # scaling 1.0
//! Gemma4TextMLP: down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))
//! Gemma4RMSNorm: x * (mean(x²) + eps)^-0.5 * w                       # plain w, not (1 + w)
//! ```
//!
//! With per-layer inputs (`hidden_size_per_layer_input` P > 0: E2B/E4B):
//!
//! ```text
//! ple = embed_tokens_per_layer(ids) * sqrt(P)                              # [T, L, P]
//! pli = (per_layer_projection_norm(per_layer_model_projection(x0) / sqrt(hidden)) + ple) / sqrt(2)
//! after each layer's MLP, before layer_scalar:
//!     out = out + post_per_layer_input_norm(per_layer_projection(gelu_tanh(per_layer_input_gate(out)) * pli[l]))
//! ```
//!
//! and with `num_kv_shared_layers` the last layers have only q: they attend over the KV cache of
//! the last earlier unshared layer of their kind ([`Gemma4Config::kv_source`]), their MLPs twice as
//! wide with `use_double_wide_mlp`.
//!
//! The engine reads this as one [`LayerSpec`] per layer ([`Gemma4Config::layers`]) and the
//! tensors under the canonical names of [`tensor_name`]. Not supported yet (refused with a clear
//! error by the loaders): the MoE block (`enable_moe_block`, 26B-A4B).

use super::common::{Defaults, Hyperparams};
use crate::model::config::{
    Activation, Arch, AttentionSpec, LayerAttention, LayerSpec, Mixer, MlpSpec, ModelConfig, PerLayerInput, RopeSpec,
};

/// `Gemma4TextConfig`'s defaults, Gemma 3's (every 6th layer full; full layers' own defaults,
/// e.g. `global_head_dim` 512, are the loaders' to apply).
pub const DEFAULTS: Defaults = super::gemma3::DEFAULTS;

/// The model `h` describes (unchecked: [`validate`] first).
pub fn model_config(h: &Hyperparams) -> ModelConfig {
    Gemma4Config::from_hyperparams(h).model_config()
}

/// Gemma 4's checks of `h` ([`Gemma4Config::validate`]).
pub fn validate(h: &Hyperparams) -> Result<(), String> {
    Gemma4Config::from_hyperparams(h).validate()
}

/// RoPE of one layer type (`rope_parameters[layer_type]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma4Rope {
    pub theta: f32,
    /// `rope_type: proportional` (else `default`: every pair of the head turns).
    pub proportional: bool,
    /// `partial_rotary_factor` of proportional RoPE.
    pub partial_rotary_factor: f32,
}

/// The fields of `Gemma4TextConfig` the engine uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    /// KV heads of sliding layers (and of full ones without `attention_k_eq_v`).
    pub num_key_value_heads: usize,
    /// KV heads of full layers with `attention_k_eq_v` (`None`: `num_key_value_heads`).
    pub num_global_key_value_heads: Option<usize>,
    pub head_dim: usize,
    /// Head dim of full layers.
    pub global_head_dim: usize,
    pub attention_k_eq_v: bool,
    pub attention_bias: bool,
    /// `layer_types[i] == "full_attention"`.
    pub full_attention: Vec<bool>,
    pub sliding_window: u32,
    pub rope_sliding: Gemma4Rope,
    pub rope_full: Gemma4Rope,
    pub final_logit_softcapping: Option<f32>,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Per-layer input width (`hidden_size_per_layer_input`; 0 = none).
    pub hidden_size_per_layer_input: usize,
    /// Rows of the per-layer embedding table (`vocab_size_per_layer_input`).
    pub vocab_size_per_layer_input: usize,
    /// The last layers that read an earlier layer's KV cache (`num_kv_shared_layers`).
    pub num_kv_shared_layers: usize,
    /// Shared-KV layers' MLPs are twice as wide (`use_double_wide_mlp`).
    pub use_double_wide_mlp: bool,
}

impl Gemma4Config {
    /// Gemma 4's reading of the neutral hyperparameters: sliding layers at `head_dim`,
    /// `num_key_value_heads` and RoPE `rope_local_theta` (default 10000); full layers at
    /// `full_layers`' head dim and KV heads (with `k_eq_v`) and `rope_theta`, proportional by
    /// `full_layers.rope_proportional` / `partial_rotary_factor`.
    pub fn from_hyperparams(h: &Hyperparams) -> Self {
        let first_window = h.layer_types.iter().find_map(|t| match t {
            LayerAttention::Sliding { window } => Some(*window),
            _ => None,
        });
        Gemma4Config {
            vocab_size: h.vocab_size,
            hidden_size: h.hidden_size,
            intermediate_size: h.intermediate_size,
            num_attention_heads: h.num_attention_heads,
            num_key_value_heads: h.num_key_value_heads,
            num_global_key_value_heads: h.full_layers.kv_heads,
            head_dim: h.head_dim,
            global_head_dim: h.full_layers.head_dim.unwrap_or(h.head_dim),
            attention_k_eq_v: h.full_layers.k_eq_v,
            attention_bias: h.attention_bias,
            full_attention: h.layer_types.iter().map(|t| *t == LayerAttention::Full).collect(),
            sliding_window: h.sliding_window.or(first_window).unwrap_or(0),
            rope_sliding: Gemma4Rope {
                theta: h.rope_local_theta.unwrap_or(10_000.0),
                proportional: false,
                partial_rotary_factor: 1.0,
            },
            rope_full: Gemma4Rope {
                theta: h.rope_theta,
                proportional: h.full_layers.rope_proportional,
                partial_rotary_factor: h.partial_rotary_factor,
            },
            final_logit_softcapping: h.final_logit_softcapping,
            rms_norm_eps: h.rms_norm_eps,
            max_position_embeddings: h.max_position_embeddings,
            tie_word_embeddings: h.tie_word_embeddings,
            bos_token_id: h.bos_token_id,
            eos_token_ids: h.eos_token_ids.clone(),
            hidden_size_per_layer_input: h.per_layer_input.map_or(0, |p| p.dim),
            vocab_size_per_layer_input: h.per_layer_input.map_or(h.vocab_size, |p| p.vocab),
            num_kv_shared_layers: h.num_kv_shared_layers,
            use_double_wide_mlp: h.double_wide_mlp,
        }
    }

    /// google/gemma-4-31B's text config.
    pub fn gemma_4_31b() -> Self {
        Gemma4Config {
            vocab_size: 262_144,
            hidden_size: 5376,
            intermediate_size: 21_504,
            num_attention_heads: 32,
            num_key_value_heads: 16,
            num_global_key_value_heads: Some(4),
            head_dim: 256,
            global_head_dim: 512,
            attention_k_eq_v: true,
            attention_bias: false,
            full_attention: (0..60).map(|i| (i + 1) % 6 == 0).collect(),
            sliding_window: 1024,
            rope_sliding: Gemma4Rope { theta: 10_000.0, proportional: false, partial_rotary_factor: 1.0 },
            rope_full: Gemma4Rope { theta: 1_000_000.0, proportional: true, partial_rotary_factor: 0.25 },
            final_logit_softcapping: Some(30.0),
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            tie_word_embeddings: true,
            bos_token_id: Some(2),
            eos_token_ids: vec![1, 106],
            hidden_size_per_layer_input: 0,
            vocab_size_per_layer_input: 262_144,
            num_kv_shared_layers: 0,
            use_double_wide_mlp: false,
        }
    }

    /// The layer whose KV cache layer `l` reads (`Gemma4TextConfig.kv_sharing_modes`): for the
    /// last `num_kv_shared_layers` layers, the last earlier unshared layer of the same kind;
    /// `None` for the others, or when no such layer exists (the loaders refuse that config).
    pub fn kv_source(&self, l: usize) -> Option<usize> {
        let first_shared = self.full_attention.len().saturating_sub(self.num_kv_shared_layers);
        if l < first_shared {
            return None;
        }
        (0..first_shared).rev().find(|&s| self.full_attention[s] == self.full_attention[l])
    }

    /// What every loader checks before building specs from this config: a message naming the
    /// first problem (the loaders add the file).
    pub fn validate(&self) -> Result<(), String> {
        let layers = self.full_attention.len();
        let heads = self.num_attention_heads;
        let full_kv = match (self.attention_k_eq_v, self.num_global_key_value_heads) {
            (true, Some(n)) => n,
            _ => self.num_key_value_heads,
        };
        if layers == 0 {
            return Err("no layers".into());
        }
        if self.sliding_window == 0 {
            return Err("sliding_window is 0".into());
        }
        for (what, kv) in [("num_key_value_heads", self.num_key_value_heads), ("full layers' KV heads", full_kv)] {
            if kv == 0 || !heads.is_multiple_of(kv) {
                return Err(format!("{what} {kv} does not divide {heads} heads"));
            }
        }
        for (what, d) in [("head_dim", self.head_dim), ("global_head_dim", self.global_head_dim)] {
            if d == 0 || d % 2 != 0 {
                return Err(format!("{what} {d} (RoPE needs pairs)"));
            }
        }
        let rot = self.full_rotary_dim();
        if rot < 2 || rot > self.global_head_dim {
            return Err(format!("full attention RoPE turns {rot} dims of {}", self.global_head_dim));
        }
        if self.num_kv_shared_layers > layers {
            return Err(format!("num_kv_shared_layers {} of {layers} layers", self.num_kv_shared_layers));
        }
        if let Some(l) = (layers - self.num_kv_shared_layers..layers).find(|&l| self.kv_source(l).is_none()) {
            return Err(format!("shared KV layer {l} has no earlier unshared layer of its kind to read"));
        }
        if !self.hidden_size_per_layer_input.is_multiple_of(2) {
            return Err(format!("hidden_size_per_layer_input {} is odd", self.hidden_size_per_layer_input));
        }
        if self.hidden_size_per_layer_input > 0 && self.vocab_size_per_layer_input < self.vocab_size {
            // Token ids past the per-layer table would meet no row.
            return Err(format!(
                "the per-layer embedding has {} rows for a vocabulary of {}",
                self.vocab_size_per_layer_input, self.vocab_size
            ));
        }
        match self.final_logit_softcapping {
            Some(cap) if cap <= 0.0 => Err("final_logit_softcapping must be positive".into()),
            _ => Ok(()),
        }
    }

    /// Turning dims of a full layer's head: `2 * int(partial_rotary_factor * D // 2)`
    /// (transformers' `_compute_proportional_rope_parameters`), or D for `default` RoPE.
    pub fn full_rotary_dim(&self) -> usize {
        if self.rope_full.proportional {
            2 * (self.rope_full.partial_rotary_factor * self.global_head_dim as f32 / 2.0).floor() as usize
        } else {
            self.global_head_dim
        }
    }

    /// The engine's description: the model-wide fields and one spec per layer.
    pub fn model_config(&self) -> ModelConfig {
        let layers = self.layers();
        ModelConfig {
            arch: Arch::Gemma4,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            // Gemma4TextScaledWordEmbedding: embed_scale = hidden_size ** 0.5.
            embedding_scale: (self.hidden_size as f32).sqrt(),
            final_logit_softcapping: self.final_logit_softcapping,
            per_layer_input: (self.hidden_size_per_layer_input > 0).then_some(PerLayerInput {
                dim: self.hidden_size_per_layer_input,
                vocab: self.vocab_size_per_layer_input,
            }),
            bos_token_id: self.bos_token_id,
            eos_token_ids: self.eos_token_ids.clone(),
            add_bos: true,
            layers,
        }
    }

    pub fn layers(&self) -> Vec<LayerSpec> {
        self.full_attention
            .iter()
            .enumerate()
            .map(|(l, &full)| {
                let kv_from = self.kv_source(l);
                let wide = if self.use_double_wide_mlp && kv_from.is_some() { 2 } else { 1 };
                let mlp = MlpSpec::Dense {
                    intermediate: wide * self.intermediate_size,
                    activation: Activation::GeluTanhGated,
                };
                let attention = if full {
                    let k_eq_v = self.attention_k_eq_v;
                    let kv_heads = match (k_eq_v, self.num_global_key_value_heads) {
                        (true, Some(n)) => n,
                        _ => self.num_key_value_heads,
                    };
                    AttentionSpec {
                        heads: self.num_attention_heads,
                        kv_heads,
                        head_dim: self.global_head_dim,
                        window: None,
                        rope: RopeSpec {
                            rotary_dim: self.full_rotary_dim(),
                            proportional: self.rope_full.proportional,
                            ..RopeSpec::full(self.rope_full.theta, self.global_head_dim)
                        },
                        scale: 1.0,
                        bias: self.attention_bias,
                        qk_norm: true,
                        output_gate: false,
                        k_eq_v,
                        v_norm: true,
                        kv_from,
                    }
                } else {
                    AttentionSpec {
                        heads: self.num_attention_heads,
                        kv_heads: self.num_key_value_heads,
                        head_dim: self.head_dim,
                        window: Some(self.sliding_window),
                        rope: RopeSpec::full(self.rope_sliding.theta, self.head_dim),
                        scale: 1.0,
                        bias: self.attention_bias,
                        qk_norm: true,
                        output_gate: false,
                        k_eq_v: false,
                        v_norm: true,
                        kv_from,
                    }
                };
                LayerSpec { mixer: Mixer::Attention(attention), mlp, sandwich_norm: true, output_scale: true }
            })
            .collect()
    }
}

/// The canonical name (`blk.{i}.` + this) of a layer tensor by its module path after
/// `model.layers.{i}.` in transformers' and mlx-lm's names (with `.weight`, or the bare buffer
/// `layer_scalar`).
pub fn tensor_name(module: &str) -> Option<&'static str> {
    Some(match module {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        "post_attention_layernorm.weight" => "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight" => "ffn_norm.weight",
        "post_feedforward_layernorm.weight" => "post_ffw_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        "layer_scalar" => "layer_output_scale.weight",
        "per_layer_input_gate.weight" => "inp_gate.weight",
        "per_layer_projection.weight" => "proj.weight",
        "post_per_layer_input_norm.weight" => "post_norm.weight",
        _ => return None,
    })
}
