//! Llama (SmolLM2), as transformers' `modeling_llama.py` writes it.
//!
//! ```text
//! LlamaDecoderLayer:
//!     h = x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   # n = input_layernorm(x)
//!     out = h + down_proj(silu(gate_proj(m)) * up_proj(m))                      # m = post_attention_layernorm(h)
//! ```
//!
//! Every layer full attention, scores scaled by 1/sqrt(head_dim), RoPE over the whole head
//! (linear scaling by `rope_scaling.factor`). llama.cpp's GGUF converter interleaves the rotary
//! halves of the q and k rows; the loader undoes it ([`super::gguf_permuted_qk`]).

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `LlamaConfig`'s defaults.
pub const DEFAULTS: Defaults = Defaults {
    head_dim: None,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 2048,
    rope_theta: 10_000.0,
    activation_key: "hidden_act",
    activation: "silu",
    tie_word_embeddings: false,
    sliding_window_pattern: None,
    use_sliding_window: false,
};

pub fn model_config(h: &Hyperparams) -> ModelConfig {
    dense(h, DenseBlock::llama(h))
}

pub fn tensor_name(module: &str) -> Option<TensorName> {
    dense_tensor_name(module)
}
