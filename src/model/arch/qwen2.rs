//! Qwen2 / Qwen2.5, as transformers' `modeling_qwen2.py` writes it: Llama's block with a bias on
//! the q, k and v projections (`attention_bias`, read from the tensors present), sliding-window
//! layers past `max_window_layers` when `use_sliding_window`.

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `Qwen2Config`'s defaults: Llama's but for the context, the RoPE base and sliding layers by
/// `use_sliding_window`.
pub const DEFAULTS: Defaults = Defaults {
    max_position_embeddings: 32768,
    rope_theta: 1_000_000.0,
    use_sliding_window: true,
    ..super::llama::DEFAULTS
};

pub fn model_config(h: &Hyperparams) -> ModelConfig {
    dense(h, DenseBlock::llama(h))
}

pub fn tensor_name(module: &str) -> Option<TensorName> {
    dense_tensor_name(module)
}
