//! One module per architecture, each written like its modeling file: it turns a checkpoint's
//! hyperparameters (the neutral view both loaders fill, [`Hyperparams`]) into the
//! model-wide fields and one [`LayerSpec`](super::config::LayerSpec) per layer, and names its
//! tensors. The loaders only parse formats: they map config.json keys / GGUF `{arch}.*` keys onto
//! this vocabulary and call [`try_model_config`].
//!
//! Adding an architecture: a module here, a variant of [`Arch`] (its names in [`Arch::parse`]),
//! and its row in [`defaults`] / [`model_config`] / [`tensor_name`].

pub mod common;
pub mod gemma3;
pub mod gemma4;
pub mod llama;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3_5_moe;

use super::config::{Arch, ModelConfig};
pub use common::{activation, Defaults, DeltaNetParams, FullLayers, GgufTensor, Hyperparams, MoeParams, TensorName};

/// The defaults of `arch`'s config class (dense families).
pub fn defaults(arch: Arch) -> Defaults {
    match arch {
        Arch::Llama => llama::DEFAULTS,
        Arch::Qwen2 => qwen2::DEFAULTS,
        Arch::Qwen3 => qwen3::DEFAULTS,
        Arch::Gemma3 => gemma3::DEFAULTS,
        Arch::Qwen35Moe => qwen3_5_moe::DEFAULTS,
        Arch::Gemma4 => gemma4::DEFAULTS,
    }
}

/// The model a checkpoint's hyperparameters describe, by its architecture's module (unchecked:
/// see [`try_model_config`]).
pub fn model_config(h: &Hyperparams) -> ModelConfig {
    match h.arch {
        Arch::Llama => llama::model_config(h),
        Arch::Qwen2 => qwen2::model_config(h),
        Arch::Qwen3 => qwen3::model_config(h),
        Arch::Gemma3 => gemma3::model_config(h),
        Arch::Qwen35Moe => qwen3_5_moe::model_config(h),
        Arch::Gemma4 => gemma4::model_config(h),
    }
}

/// [`model_config`] after the architecture's own checks of `h` (a message naming the first
/// problem; the loaders add the file).
pub fn try_model_config(h: &Hyperparams) -> Result<ModelConfig, String> {
    if h.arch == Arch::Gemma4 {
        gemma4::validate(h)?;
    }
    Ok(model_config(h))
}

/// The engine's name of a GGUF tensor (after `blk.{i}.`, or outside layers) by `arch`'s mapping
/// of llama.cpp's names; `full` = the tensor is of a full-attention layer.
pub fn gguf_tensor(arch: Arch, name: &str, full: bool) -> GgufTensor<'_> {
    match arch {
        Arch::Qwen35Moe => qwen3_5_moe::gguf_tensor(name, full),
        _ => GgufTensor { name, neg_exp: false, as_row: false },
    }
}

/// Whether llama.cpp's GGUF converter stored this architecture's q and k rows with their rotary
/// halves interleaved (its `permute`), which the loader undoes on reading.
pub fn gguf_permuted_qk(arch: Arch) -> bool {
    arch == Arch::Llama
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
