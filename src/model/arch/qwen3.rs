//! Qwen3, as transformers' `modeling_qwen3.py` writes it: Qwen2's block with a per-head RMSNorm
//! on q and k before RoPE (`q_norm`, `k_norm`) and no projection bias.

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `Qwen3Config`'s defaults.
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
    dense(h, DenseBlock { qk_norm: true, ..DenseBlock::llama(h) })
}

pub fn tensor_name(module: &str) -> Option<TensorName> {
    dense_tensor_name(module)
}
