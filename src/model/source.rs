//! Where a model's weights come from: the one interface the model reads checkpoints through, so
//! that `model` does not depend on how (or from which file format) `loader` reads them.
//! [`crate::loader::Checkpoint`] implements it; a test or a converter may bring its own.

use super::config::ModelConfig;
use crate::dtype::DType;
use crate::error::Result;

/// Tensors by canonical (GGUF-style) name: `token_embd.weight`, `blk.{i}.attn_q.weight`, ...
pub trait TensorSource {
    /// The model the tensors describe.
    fn config(&self) -> &ModelConfig;

    fn has(&self, name: &str) -> bool;

    /// The tensor's shape as stored (stacked experts: `[E, rows, cols]`).
    fn shape(&self, name: &str) -> Result<Vec<usize>>;

    /// The tensor's bytes in its stored type, for kernels that read that type: rows in the
    /// order the model computes with (a conversion that only reorders rows is applied); `None`
    /// when the checkpoint's values must change first (then read it through [`Self::f32`] or
    /// [`Self::f16`]).
    fn stored(&self, name: &str) -> Result<Option<(DType, Vec<u8>)>>;

    /// The tensor as f32 values, every conversion applied, after checking its shape.
    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>>;

    /// The tensor as f16 values, every conversion applied, after checking its shape.
    fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>>;
}
