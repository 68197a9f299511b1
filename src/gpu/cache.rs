//! The pipeline cache: each compiled compute pipeline kept by (shader, entry point, macros, bounds
//! checks compiled in), so that [`Gpu::pipeline`](super::Gpu::pipeline) compiles a variant once per device.

use super::Macros;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A pipeline's key: (shader, entry point, macros, bounds checks compiled in).
pub(super) type PipelineKey = (String, String, Macros, bool);

/// Compiled pipelines keyed by [`PipelineKey`].
#[derive(Default)]
pub struct PipelineCache {
    pub(super) map: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
}

impl PipelineCache {
    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
