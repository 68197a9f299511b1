//! Row chunks: a matrix larger than the device's max storage binding (a 151936-row vocabulary
//! table in f16 is 272 MB; lavapipe binds at most 128 MiB) is uploaded as row chunks, each its own
//! buffer. Chunk row counts are multiples of [`CHUNK_ROW_ALIGN`] = 64, so a chunk's slice of an f32
//! logits row starts at a multiple of 256 bytes and can be bound as a view (the lm_head's chunks
//! write one logits buffer; see [`crate::ops::matmul`]'s docs on output views).

use crate::error::{Error, Result};
use crate::gpu::{Gpu, Tensor};
use std::ops::Range;

/// Row counts of chunks (all but the last) are multiples of this.
pub const CHUNK_ROW_ALIGN: usize = 64;

/// Splits `rows` rows of `row_bytes` bytes into balanced chunks of at most `max_bytes` bytes,
/// each (but the last) a multiple of [`CHUNK_ROW_ALIGN`] rows. One chunk when everything fits.
pub fn plan_row_chunks(rows: usize, row_bytes: u64, max_bytes: u64) -> Result<Vec<Range<usize>>> {
    let fits = max_bytes.checked_div(row_bytes).map_or(rows, |n| n as usize);
    if rows <= fits {
        return Ok(std::iter::once(0..rows).collect());
    }
    let max_rows = fits / CHUNK_ROW_ALIGN * CHUNK_ROW_ALIGN;
    if max_rows == 0 {
        return Err(Error::Unsupported(format!(
            "{CHUNK_ROW_ALIGN} rows of {row_bytes} bytes exceed the max storage binding of {max_bytes} bytes"
        )));
    }
    let n_chunks = rows.div_ceil(max_rows);
    let chunk = rows.div_ceil(n_chunks).next_multiple_of(CHUNK_ROW_ALIGN).min(max_rows);
    Ok((0..rows).step_by(chunk).map(|s| s..(s + chunk).min(rows)).collect())
}

/// Uploads the f16 matrix `data` (`[rows, cols]`, row-major) as row chunks that each fit the
/// device's max storage binding (and max buffer size): `(first row, tensor [chunk_rows, cols])`.
/// General: the embedding table and the lm_head (tied or not) both use it.
pub fn upload_row_chunks(
    gpu: &Gpu,
    label: &str,
    data: &[half::f16],
    rows: usize,
    cols: usize,
) -> Result<Vec<(u32, Tensor)>> {
    let max = gpu.limits.max_storage_buffer_binding_size.min(gpu.limits.max_buffer_size);
    upload_row_chunks_max(gpu, label, data, rows, cols, max)
}

/// [`upload_row_chunks`] with an explicit byte limit per chunk (tests force small chunks).
pub fn upload_row_chunks_max(
    gpu: &Gpu,
    label: &str,
    data: &[half::f16],
    rows: usize,
    cols: usize,
    max_bytes: u64,
) -> Result<Vec<(u32, Tensor)>> {
    if data.len() != rows * cols {
        return Err(Error::Mismatch(format!("{label}: {} values for [{rows}, {cols}]", data.len())));
    }
    // A chunk of odd size is padded to a whole u32; the row bytes bound that with cols*2 + 2 / rows.
    let row_bytes = 2 * cols as u64;
    let plan = plan_row_chunks(rows, row_bytes, max_bytes.saturating_sub(2))?;
    upload_chunks(label, plan, |name, r| gpu.upload_f16(name, &[r.len(), cols], &data[r.start * cols..r.end * cols]))
}

/// Uploads the row ranges of `plan` with `upload(name, rows)` (`name`: `label`, or
/// `label[start..end]` when there are several): `(first row, chunk)` each.
pub(crate) fn upload_chunks<T>(
    label: &str,
    plan: Vec<Range<usize>>,
    upload: impl Fn(&str, Range<usize>) -> Result<T>,
) -> Result<Vec<(u32, T)>> {
    let many = plan.len() > 1;
    plan.into_iter()
        .map(|r| {
            let name = if many { format!("{label}[{}..{}]", r.start, r.end) } else { label.to_string() };
            let start = r.start as u32;
            Ok((start, upload(&name, r)?))
        })
        .collect()
}
