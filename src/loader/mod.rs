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

pub mod dtype;
pub mod gguf;
pub mod hf;
pub mod synthetic;

pub use dtype::DType;

use crate::error::{Error, Result};
use crate::model::config::ModelConfig;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A tensor's bytes, still in its stored type.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<usize>,
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Dequantizes or converts to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        dtype::to_f32(self.dtype, self.bytes, self.numel())
    }
    /// Dequantizes or converts to f16 (what the GPU weights are today).
    pub fn to_f16(&self) -> Result<Vec<half::f16>> {
        dtype::to_f16(self.dtype, self.bytes, self.numel())
    }
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A tokenizer.json file.
    Json(PathBuf),
    /// GGUF `tokenizer.ggml.*` metadata (owned copies).
    Gguf(gguf::GgufTokenizerData),
    /// None: a synthetic checkpoint ([`synthetic`]) runs on token ids alone.
    None,
}

/// A loaded checkpoint: config, tensors (memory-mapped) and tokenizer source.
pub struct Checkpoint {
    pub path: PathBuf,
    pub config: ModelConfig,
    pub tokenizer: TokenizerSource,
    /// The model's chat template (Jinja), if it ships one.
    pub chat_template: Option<String>,
    /// Strings of special tokens used by templates (`bos_token`, `eos_token`).
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub(crate) tensors: HashMap<String, StoredTensor>,
    pub(crate) maps: Vec<memmap2::Mmap>,
    /// Row permutations / offsets applied on conversion (see module docs).
    pub(crate) fixups: HashMap<String, Fixup>,
}

/// A conversion step applied when a tensor is read out of the file.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fixup {
    /// Undo llama.cpp's interleaved-RoPE row permutation of a Q or K projection with this many heads.
    UnpermuteRope { heads: usize },
    /// Add a constant to every element (Gemma's `(1 + w)` RMSNorm in a Hugging Face checkpoint).
    AddConstant(f32),
}

#[derive(Clone, Debug)]
pub(crate) struct StoredTensor {
    pub map: usize,
    pub offset: usize,
    pub len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Checkpoint {
    /// Opens a GGUF file or a Hugging Face folder, by what `path` is.
    pub fn open(path: &Path) -> Result<Checkpoint> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            hf::open(path)
        } else {
            gguf::open(path)
        }
    }

    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The raw stored tensor (no fixups applied).
    pub fn raw<'a>(&'a self, name: &'a str) -> Result<TensorView<'a>> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| Error::Mismatch(format!("tensor {name} is missing from {}", self.path.display())))?;
        Ok(TensorView {
            name,
            dtype: t.dtype,
            shape: t.shape.clone(),
            bytes: &self.maps[t.map][t.offset..t.offset + t.len],
        })
    }

    /// The tensor as f32 with fixups applied, after checking its shape.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        let mut data = v.to_f32()?;
        self.apply_fixup(name, &v.shape, &mut data);
        Ok(data)
    }

    /// The tensor as f16 with fixups applied, after checking its shape.
    pub fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        match self.fixups.get(name) {
            None => v.to_f16(),
            Some(_) => {
                let mut data = v.to_f32()?;
                self.apply_fixup(name, &v.shape, &mut data);
                Ok(data.into_iter().map(half::f16::from_f32).collect())
            }
        }
    }

    fn apply_fixup(&self, name: &str, shape: &[usize], data: &mut Vec<f32>) {
        match self.fixups.get(name) {
            None => {}
            Some(Fixup::AddConstant(c)) => data.iter_mut().for_each(|x| *x += c),
            Some(Fixup::UnpermuteRope { heads }) => {
                *data = unpermute_rope_rows(data, shape[0], shape[1], *heads);
            }
        }
    }
}

fn check_shape(v: &TensorView, want: &[usize]) -> Result<()> {
    if v.shape != want {
        return Err(Error::Mismatch(format!(
            "tensor {} has shape {:?}, the config implies {:?}",
            v.name, v.shape, want
        )));
    }
    Ok(())
}

/// Undoes llama.cpp's `permute` of Q/K rows: within each head of `rows / heads` rows, llama.cpp
/// stores row `2*i + j` (j in {0,1}) of the interleaved layout at HF row `j * half + i`;
/// this returns the Hugging Face (rotate-half) row order.
pub fn unpermute_rope_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let per_head = rows / heads;
    let half = per_head / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                // GGUF row (interleaved) -> HF row (halves)
                let src = h * per_head + 2 * i + j;
                let dst = h * per_head + j * half + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's converter: `w.reshape(heads, 2, half, cols).swapaxes(1, 2).reshape(rows, cols)`.
    fn permute_like_llama_cpp(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
        let half = rows / heads / 2;
        let mut out = vec![0f32; w.len()];
        for h in 0..heads {
            for a in 0..2 {
                for b in 0..half {
                    // source index (h, a, b) -> destination index (h, b, a)
                    let src = h * 2 * half + a * half + b;
                    let dst = h * 2 * half + b * 2 + a;
                    out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (rows, cols, heads) = (24, 5, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = permute_like_llama_cpp(&w, rows, cols, heads);
        assert_ne!(p, w);
        assert_eq!(unpermute_rope_rows(&p, rows, cols, heads), w);
    }
}
