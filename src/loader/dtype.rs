//! (being written by the loader work) Stored tensor types and their conversion to f32/f16.
use crate::error::{Error, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    F16,
    BF16,
}

pub fn to_f32(dtype: DType, _bytes: &[u8], _n: usize) -> Result<Vec<f32>> {
    Err(Error::Unsupported(format!("{dtype:?}")))
}
pub fn to_f16(dtype: DType, _bytes: &[u8], _n: usize) -> Result<Vec<half::f16>> {
    Err(Error::Unsupported(format!("{dtype:?}")))
}
