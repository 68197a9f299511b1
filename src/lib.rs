//! wgpu-llm: LLM inference whose layers and sampling head are WGSL compute shaders run through wgpu.
//!
//! Map of the crate:
//! - [`gpu`]: adapter/device selection, the shader preprocessor and pipeline cache, GPU tensors.
//! - [`ops`]: one module per kernel family; each GPU op sits next to its CPU reference and its test.
//! - [`dtype`]: the stored tensor types (GGUF blocks, MLX affine, floats) and their CPU (de)quantizers.
//! - [`loader`]: GGUF and Hugging Face (safetensors) checkpoints, memory-mapped.
//! - [`model`]: the model description ([`model::config::ModelConfig`]) and the one layer loop; it reads
//!   weights through [`model::source::TensorSource`], which [`loader::Checkpoint`] implements.
//! - [`sampling`]: the [`sampling::SamplingBackend`] trait with its host and device implementations.
//! - [`tokenizer`], [`chat`]: text in and out.
//! - [`decode`]: the decode loops, one sequence ([`decode::generate`]) or many ([`decode::batch`]).
//! - [`serve`]: the OpenAI-compatible HTTP server over the batching engine.

pub mod chat;
pub mod decode;
pub mod dtype;
pub mod error;
pub mod gpu;
pub mod loader;
pub mod model;
pub mod ops;
pub mod sampling;
pub mod serve;
pub mod tokenizer;
pub mod tuning;

pub use error::{Error, Result};
