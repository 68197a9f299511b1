//! Gemma 3 (text), as transformers' `modeling_gemma3.py` writes it.
//!
//! ```text
//! x = embed_tokens(ids) * sqrt(hidden)
//! Gemma3DecoderLayer:
//!     h = x + post_attention_layernorm(self_attn(input_layernorm(x)))
//!     out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)))
//! self_attn: q = rope(q_norm(q_proj(x))); k = rope(k_norm(k_proj(x)))   # scaled query_pre_attn_scalar^-0.5
//!     sliding layers (all but every sliding_window_pattern-th): window sliding_window, RoPE base
//!     rope_local_base_freq (10k); full layers: rope_theta with its scaling
//! mlp: down_proj(gelu_tanh(gate_proj(x)) * up_proj(x))
//! Gemma3RMSNorm: x * (mean(x²) + eps)^-0.5 * (1 + w)                     # the 1 folded in at load
//! ```
//!
//! A transformers checkpoint stores the norms' `w` (the loader adds the 1: [`hf_norm_offset`]);
//! llama.cpp's GGUF stores `1 + w`.

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `Gemma3TextConfig`'s defaults.
pub const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    rms_norm_eps: 1e-6,
    max_position_embeddings: 131072,
    rope_theta: 1_000_000.0,
    activation_key: "hidden_activation",
    activation: "gelu_pytorch_tanh",
    tie_word_embeddings: true,
    sliding_window_pattern: Some(SLIDING_WINDOW_PATTERN),
    use_sliding_window: false,
};

/// Every 6th layer is full attention (also llama.cpp's fixed pattern for Gemma 3 GGUF files).
pub const SLIDING_WINDOW_PATTERN: usize = 6;

/// RoPE base of the sliding layers when the checkpoint does not say (`rope_local_base_freq`).
pub const ROPE_LOCAL_THETA: f32 = 10_000.0;

pub fn model_config(h: &Hyperparams) -> ModelConfig {
    // A GGUF file has no query_pre_attn_scalar: llama.cpp takes head_dim, except for the 27B
    // model (62 layers), where it is hidden / heads.
    let scalar = h.query_pre_attn_scalar.unwrap_or(if h.layer_types.len() == 62 {
        (h.hidden_size / h.num_attention_heads) as f32
    } else {
        h.head_dim as f32
    });
    dense(
        h,
        DenseBlock {
            qk_norm: true,
            sandwich_norm: true,
            scaled_embedding: true,
            attention_scale: 1.0 / scalar.sqrt(),
            rope_local_theta: h.rope_local_theta.unwrap_or(ROPE_LOCAL_THETA),
        },
    )
}

/// Gemma's `post_attention_layernorm` is the sandwich norm after attention (Llama's is the
/// pre-MLP norm).
pub fn tensor_name(module: &str) -> Option<TensorName> {
    match module {
        "post_attention_layernorm.weight" => Some(TensorName::One("post_attention_norm.weight")),
        "post_attention_layernorm.bias" => Some(TensorName::One("post_attention_norm.bias")),
        _ => dense_tensor_name(module),
    }
}

/// The constant a transformers checkpoint's norm weights need added (`(1 + w)`), for every
/// canonical tensor ending in `norm.weight`.
pub fn hf_norm_offset(canonical: &str) -> Option<f32> {
    canonical.ends_with("norm.weight").then_some(1.0)
}
