//! Hugging Face checkpoint folders: `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` and, when present,
//! `generation_config.json` / `chat_template.jinja`.
//!
//! Tensor names are mapped onto the canonical GGUF names (see the module docs of
//! [`crate::loader`]); tensors that map to nothing (vision towers, rotary caches, ...) are left
//! out. Safetensors headers are read and validated by the `safetensors` crate (offsets contiguous
//! from 0, sizes matching dtype × shape, no overflow) and the data must end exactly at the end of
//! the file. Stored types F32, F16 and BF16 are read; a used tensor of any other type is
//! [`Error::Unsupported`]. Every file is opened only if it is a regular file.
//!
//! MLX quantized folders (mlx-lm's `convert -q`, mlx-community checkpoints): config.json's
//! `quantization` (`group_size`, `bits`, `mode` "affine", and per-module overrides: an object with
//! its own `group_size`/`bits`, or `false` for a module left in floats) says how each linear
//! layer's `weight` (packed U32), `scales` and `biases` (f16 or bf16) encode it; the three become
//! one [`DType::Affine`] tensor of the logical shape `[N, K]` (see `mlx_affine`).

mod config;
mod json;
mod mlx;
mod open;
mod safetensors;

pub use open::open;
pub use safetensors::{canonical_name, MAX_SAFETENSORS_HEADER};
