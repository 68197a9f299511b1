//! The GPU side: adapter and device ([`Gpu`], in `device.rs`), shader preprocessing ([`shader`]),
//! the pipeline cache (`cache.rs`) and recorded dispatches ([`kernel`]), and GPU tensors
//! ([`tensor`]). This file only declares the files and names their items: each file imports its
//! siblings, never this one's own code, so no file and its parent import each other.

mod cache;
mod device;
pub mod kernel;
pub mod shader;
pub mod tensor;

pub use cache::PipelineCache;
pub use device::{list_adapters, AdapterReport, BackendChoice, Caps, Gpu, GpuOptions};
pub use kernel::Kernel;
pub use shader::Macros;
pub use tensor::{ElemType, Tensor};
