//! The loaded checkpoint: what both loaders build ([`Checkpoint`]), its tensors read on demand
//! with their fixups applied.

use super::dtype::{self, DType};
use super::file::DataFile;
use super::gguf::GgufTokenizerData;
use super::stored::StoredTensor;
use super::validate::fmt_shape;
use crate::error::{shown, Error, Result};
use crate::model::config::ModelConfig;
use std::collections::HashMap;
use std::path::PathBuf;

/// A tensor's bytes, still in its stored type (read from the file by [`Checkpoint::raw`]).
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: DType,
    /// Row-major, outermost first.
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl TensorView<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// Dequantizes or converts to f32.
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        dtype::to_f32(self.dtype, &self.bytes, self.numel())
    }
    /// Dequantizes or converts to f16 (what the GPU weights are today).
    pub fn to_f16(&self) -> Result<Vec<half::f16>> {
        dtype::to_f16(self.dtype, &self.bytes, self.numel())
    }
}

/// Where the tokenizer comes from.
#[derive(Clone, Debug)]
pub enum TokenizerSource {
    /// A tokenizer.json file.
    Json(PathBuf),
    /// GGUF `tokenizer.ggml.*` metadata (owned copies).
    Gguf(GgufTokenizerData),
    /// None: a synthetic checkpoint ([`synthetic`]) runs on token ids alone.
    None,
}

/// A loaded checkpoint: config, tensor locations (validated against the files) and tokenizer
/// source.
///
/// Opening reads and validates only headers and metadata: every size in checked arithmetic
/// under a named limit, the config against the tensors present (every declared layer complete,
/// no tensor left over, each tensor's shape and type what its name implies), and each tensor's
/// byte range inside its file. Tensor data is read on demand ([`Checkpoint::raw`],
/// [`Checkpoint::f16`], [`Checkpoint::f32`]) with positioned reads, not a memory map: a file
/// that shrinks while it is being loaded then gives an error instead of `SIGBUS`, which no
/// length check before touching a map can rule out (the file can shrink between the check and
/// the access).
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
    pub(crate) files: Vec<DataFile>,
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
    /// `x -> ln(-x)`: llama.cpp stores a Gated DeltaNet's `ssm_a = -exp(A_log)`; the engine reads
    /// `A_log`.
    LnNeg,
}

impl Checkpoint {
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(|s| s.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The stored shape of `name`, without reading it.
    pub fn raw_shape(&self, name: &str) -> Result<Vec<usize>> {
        self.tensors
            .get(name)
            .map(|t| t.shape.clone())
            .ok_or_else(|| Error::Mismatch(format!("tensor {} is missing from {}", shown(name), self.path.display())))
    }

    /// The raw stored tensor (no fixups applied), read from its file.
    pub fn raw<'a>(&'a self, name: &'a str) -> Result<TensorView<'a>> {
        let t = self.tensors.get(name).ok_or_else(|| {
            Error::Mismatch(format!("tensor {} is missing from {}", shown(name), self.path.display()))
        })?;
        Ok(TensorView { name, dtype: t.dtype, shape: t.shape.clone(), bytes: self.read_stored(t)? })
    }

    /// The bytes of a stored (or picked, or stacked) tensor.
    fn read_stored(&self, t: &StoredTensor) -> Result<Vec<u8>> {
        if let Some(parts) = &t.stack {
            let mut out = Vec::with_capacity(t.len);
            for p in parts {
                out.extend(self.read_stored(p)?);
            }
            return Ok(out);
        }
        let src_len = t.pick.map_or(t.len, |p| p.src_len);
        let bytes = match &t.affine {
            None => self.files[t.file].read(t.offset, src_len)?,
            Some(parts) => {
                let read = |(f, o, l): (usize, u64, usize)| self.files[f].read(o, l);
                let (w, sc, b) = (read(parts.weight)?, read(parts.scales)?, read(parts.biases)?);
                let rows = t.pick.map_or(t.shape[..t.shape.len() - 1].iter().product(), |p| p.src_rows);
                let mut out = Vec::with_capacity(src_len);
                let (wr, sr) = (w.len() / rows, sc.len() / rows);
                for r in 0..rows {
                    let (wr, sr) = (r * wr..(r + 1) * wr, r * sr..(r + 1) * sr);
                    dtype::mlx_affine_blocks(t.dtype, &w[wr], &sc[sr.clone()], &b[sr], &mut out);
                }
                debug_assert_eq!(out.len(), src_len);
                out
            }
        };
        Ok(match t.pick {
            None => bytes,
            Some(p) => p.apply(&bytes),
        })
    }

    /// The tensor as f32 with fixups applied, after checking its shape. Non-finite values are an
    /// error.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        let mut data = v.to_f32()?;
        self.apply_fixup(name, &v.shape, &mut data);
        self.check_finite(name, data.iter().map(|x| x.is_finite()))?;
        Ok(data)
    }

    /// The tensor as f16 with fixups applied, after checking its shape. Values that are not
    /// finite (or overflow f16) are an error.
    pub fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>> {
        let v = self.raw(name)?;
        check_shape(&v, shape)?;
        let out = match self.fixups.get(name) {
            None => v.to_f16()?,
            Some(_) => {
                let mut data = v.to_f32()?;
                self.apply_fixup(name, &v.shape, &mut data);
                data.into_iter().map(half::f16::from_f32).collect()
            }
        };
        self.check_finite(name, out.iter().map(|x| x.is_finite()))?;
        Ok(out)
    }

    fn check_finite(&self, name: &str, mut finite: impl Iterator<Item = bool>) -> Result<()> {
        match finite.position(|ok| !ok) {
            None => Ok(()),
            Some(i) => Err(Error::corrupt(
                &self.path,
                format!("tensor {} has a value that is not finite (or out of f16 range) at element {i}", shown(name)),
            )),
        }
    }

    fn apply_fixup(&self, name: &str, shape: &[usize], data: &mut Vec<f32>) {
        match self.fixups.get(name) {
            None => {}
            Some(Fixup::AddConstant(c)) => data.iter_mut().for_each(|x| *x += c),
            Some(Fixup::LnNeg) => data.iter_mut().for_each(|x| *x = (-*x).ln()),
            Some(Fixup::UnpermuteRope { heads }) => {
                *data = unpermute_rope_rows(data, shape[0], shape[1], *heads);
            }
        }
    }
}

impl crate::model::TensorSource for Checkpoint {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn has(&self, name: &str) -> bool {
        Checkpoint::has(self, name)
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>> {
        self.raw_shape(name)
    }

    /// The stored bytes; llama.cpp's interleaved-RoPE row order undone on the raw rows (a
    /// permutation of whole rows, any block type); `None` for a value-changing fixup (Gemma's and
    /// Qwen3.5's `1 + w` norms).
    fn stored(&self, name: &str) -> Result<Option<(DType, Vec<u8>)>> {
        let v = self.raw(name)?;
        Ok(match self.fixups.get(name) {
            None => Some((v.dtype, v.bytes)),
            Some(Fixup::UnpermuteRope { heads }) => {
                let n: usize = v.shape[..v.shape.len() - 1].iter().product();
                let bytes = crate::ops::matmul::gguf::unpermute_rope_rows_raw(&v.bytes, n, v.bytes.len() / n, *heads);
                Some((v.dtype, bytes))
            }
            Some(Fixup::AddConstant(_) | Fixup::LnNeg) => None,
        })
    }

    fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Checkpoint::f32(self, name, shape)
    }

    fn f16(&self, name: &str, shape: &[usize]) -> Result<Vec<half::f16>> {
        Checkpoint::f16(self, name, shape)
    }
}

fn check_shape(v: &TensorView, want: &[usize]) -> Result<()> {
    if v.shape != want {
        return Err(Error::Mismatch(format!(
            "tensor {} has shape {}, the config implies {}",
            shown(v.name),
            fmt_shape(&v.shape),
            fmt_shape(want)
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
