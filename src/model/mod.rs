//! Model description and the layer loop.
pub mod arch;
pub mod config;
pub mod forward;
pub mod pass;
pub mod source;
pub mod weights;

pub use arch::{gemma4, qwen3_5_moe};
pub use forward::{Model, Plan};
pub use source::TensorSource;
pub use weights::WeightFormat;
