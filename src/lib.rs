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
//! - [`tokenizer`], [`chat`]: text in and out; [`grammar`]: structured output (JSON schema, regex,
//!   Lark) as a token mask the samplers apply.
//! - [`decode`]: the decode loops, one sequence ([`decode::generate_with`]) or many ([`decode::batch`]).
//! - [`engine`]: what a program embedding the engine starts from: [`Engine::load`] (model,
//!   tokenizer, chat template and stop tokens in one call), then [`Engine::generate`]'s builder,
//!   streaming text as it comes; [`session`]: a multi-turn chat whose history stays in the KV
//!   cache ([`Engine::session`]).
//! - `serve` (feature `serve`, on by default): the OpenAI-compatible HTTP server over the
//!   batching engine, on tokio and axum. A library user who needs neither the server nor the
//!   command line builds with `default-features = false` and compiles neither tokio, axum nor clap.

pub mod chat;
pub mod decode;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod gpu;
pub mod grammar;
pub mod loader;
pub mod model;
pub mod ops;
pub mod sampling;
#[cfg(feature = "serve")]
pub mod serve;
pub mod session;
pub mod tokenizer;
pub mod tuning;
pub mod weights;

pub use engine::{Engine, Generation};
pub use error::{Error, Result};
