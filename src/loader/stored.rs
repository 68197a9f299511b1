//! Where a checkpoint's tensors are stored: a tensor's file and byte range, or the stored
//! tensors it is gathered from (MLX affine parts, picked rows, stacked experts).

use super::dtype::DType;

#[derive(Clone, Debug)]
pub(crate) struct StoredTensor {
    /// Index into [`Checkpoint::files`].
    pub file: usize,
    /// Absolute byte offset in the file.
    pub offset: u64,
    /// Bytes of the tensor as [`Checkpoint::raw`] returns it (`dtype`'s size for `shape`).
    pub len: usize,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// An MLX affine tensor ([`DType::Affine`]) is three stored tensors, gathered into blocks by
    /// [`Checkpoint::raw`]; `file`/`offset` are then its packed `weight`'s.
    pub affine: Option<Box<AffineParts>>,
    /// This tensor is some of a stored tensor's rows ([`RowPick`]); `len`, `shape` are the
    /// picked ones.
    pub pick: Option<RowPick>,
    /// This tensor is these stored tensors stacked (one per expert, transformers' per-expert
    /// `experts.{e}.*_proj`): `shape` = [E, ..their shape], `len` their sum.
    pub stack: Option<Vec<StoredTensor>>,
}

/// Rows picked out of a stored tensor of `src_rows` rows (`src_len` bytes as [`Checkpoint::raw`]
/// reads it): in each group of `period` consecutive rows, rows `start .. start + take` (Qwen3.5's
/// `q_proj` = [q_h | gate_h] per head; transformers' fused `gate_up_proj` = [gate_e | up_e] per
/// expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowPick {
    pub src_rows: usize,
    pub src_len: usize,
    pub period: usize,
    pub start: usize,
    pub take: usize,
}

impl RowPick {
    pub(crate) fn apply(&self, src: &[u8]) -> Vec<u8> {
        let row = src.len() / self.src_rows;
        src.chunks(self.period * row)
            .flat_map(|g| &g[self.start * row..(self.start + self.take) * row])
            .copied()
            .collect()
    }
}

/// Where the `weight` (packed u32), `scales` and `biases` of an MLX quantized tensor are stored:
/// (file, absolute offset, bytes) each.
#[derive(Clone, Debug)]
pub(crate) struct AffineParts {
    pub weight: (usize, u64, usize),
    pub scales: (usize, u64, usize),
    pub biases: (usize, u64, usize),
}
