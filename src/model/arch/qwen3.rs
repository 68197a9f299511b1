//! Qwen3, as transformers' `modeling_qwen3.py` writes it: Qwen2's block with a per-head RMSNorm
//! on q and k before RoPE (`q_norm`, `k_norm`) and no projection bias.

use super::common::{dense, dense_tensor_name, Defaults, DenseBlock, Hyperparams, TensorName};
use crate::model::config::ModelConfig;

/// `Qwen3Config`'s defaults, as the engine reads them: Qwen2's.
pub const DEFAULTS: Defaults = super::qwen2::DEFAULTS;

pub fn model_config(h: &Hyperparams) -> ModelConfig {
    dense(h, DenseBlock { qk_norm: true, ..DenseBlock::llama(h) })
}

pub fn tensor_name(module: &str) -> Option<TensorName> {
    dense_tensor_name(module)
}
