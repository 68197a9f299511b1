//! Qwen2 / Qwen2.5, as transformers' `modeling_qwen2.py` writes it: Llama's block with a bias on
//! the q, k and v projections (`attention_bias`, read from the tensors present), sliding-window
//! layers past `max_window_layers` when `use_sliding_window`.

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `Qwen2Config`'s defaults.
pub const DEFAULTS: Defaults = Defaults {
    head_dim: None,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 32768,
    rope_theta: 1_000_000.0,
    activation_key: "hidden_act",
    activation: "silu",
    tie_word_embeddings: false,
    sliding_window_pattern: None,
    use_sliding_window: true,
};

pub fn model_config(h: &Hyperparams) -> ModelConfig {
    dense(h, DenseBlock::llama(h))
}

pub fn tensor_name(module: &str) -> Option<TensorName> {
    dense_tensor_name(module)
}
