//! Checkpoint loaders. Both formats end in the same place: a [`Checkpoint`] holding a
//! [`ModelConfig`], memory-mapped tensors under canonical (GGUF-style) names, and what the
//! tokenizer needs.
//!
//! Canonical tensor names (the GGUF ones; the Hugging Face loader maps onto them):
//! `token_embd.weight`, `output_norm.weight`, `output.weight` (absent when tied),
//! `blk.{i}.attn_norm.weight`, `blk.{i}.attn_{q,k,v}.{weight,bias}`, `blk.{i}.attn_output.weight`,
//! `blk.{i}.attn_{q,k}_norm.weight`, `blk.{i}.post_attention_norm.weight`, `blk.{i}.ffn_norm.weight`,
//! `blk.{i}.post_ffw_norm.weight`, `blk.{i}.ffn_{gate,up,down}.weight`.
//!
//! Shapes are row-major, outermost first: a linear weight is `[out_features, in_features]`.
//! Every tensor here is in the layout the engine computes with: llama.cpp's Q/K row permutation
//! is already undone and Gemma's RMSNorm `(1 + w)` is already folded into the weights.

/// The stored types, at the crate root ([`crate::dtype`]); here for the loaders' paths.
pub use crate::dtype;
mod checkpoint;
mod file;
pub mod gguf;
pub mod hf;
mod open;
mod stored;
pub mod synthetic;
mod validate;

pub use checkpoint::{unpermute_rope_rows, Checkpoint, Fixup, TensorView, TokenizerSource};
pub use dtype::DType;
pub(crate) use file::{open_regular, read_small_file, side_file_exists, DataFile, DataSource};
pub(crate) use stored::{AffineParts, StoredTensor};
pub use validate::limits;
pub(crate) use validate::{
    capped, check_layer_count, check_tensors, drop_shared_kv_tensors, expected_tensors, fmt_shape, split_halves,
    validate_config, Role, END_OF_TURN_TOKENS,
};
