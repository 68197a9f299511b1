//! Model description and the layer loop.
pub mod config;
pub mod forward;
pub mod gemma4;
pub mod qwen3_5_moe;
pub mod source;
pub mod weights;

pub use forward::{Model, Plan};
pub use source::TensorSource;
pub use weights::WeightFormat;
