//! Quantized weights on the GPU ([`QuantWeight`]): GGUF block types (Q4_0 ... Q6_K) and MLX
//! affine groups, uploaded from the file's bytes without an f16 copy, in the layout the kernels of
//! [`crate::ops::matmul::gguf`] and [`crate::ops::embedding`] read.
//!
//! # GPU layout: repacked planes, not byte loads
//!
//! Q4_0, Q5_0, Q8_0 and Q6_K blocks (18, 22, 34, 210 bytes) are not u32-aligned in the file, and
//! WGSL reads u32 words at best. Reading them in place takes byte loaders: two word loads, shifts
//! and a merge per misaligned word, and no 16-byte loads at all. Instead the upload repacks each
//! tensor once into *planes*: every field of a block (quants, high bits, scales) goes, for all
//! blocks, into its own array, each 16-byte aligned (see `wgsl/include/quant.wgsl` for the table).
//! Then a Q4_0 block's quants are exactly one aligned 16-byte load, its scale one half of a word,
//! consecutive lanes read consecutive 16-byte words, and the bytes read per weight are the
//! block's bytes. The planes hold the file's bytes and nothing else: GPU bytes = file bytes plus
//! at most 16 bytes of alignment per plane. Q4_K and Q5_K (144 and 176 bytes, multiples of 16)
//! stay as in the file; Q6_K moves only its trailing f16 `d` out of the 210 bytes. The cost is
//! one pass over the bytes on the CPU at load (a copy); the price of the choice is that splitting
//! and concatenating happen on the file's bytes, before upload ([`QuantWeight::row_chunks`],
//! [`QuantWeight::concat_rows`]), not on GPU buffers.

use super::chunks::{plan_row_chunks, upload_chunks};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Macros};
use std::sync::Arc;

/// One field of a block: (byte offset in the block, bytes).
type Field = (usize, usize);

/// The fields each plane gathers, in plane order (plane 0 first); `None`: no quantized kernel.
fn plane_fields(dtype: DType) -> Option<Vec<Field>> {
    Some(match dtype {
        DType::Q4_0 => vec![(2, 16), (0, 2)],
        DType::Q4_1 => vec![(4, 16), (0, 4)],
        DType::Q5_0 => vec![(6, 16), (2, 4), (0, 2)],
        DType::Q5_1 => vec![(8, 16), (4, 4), (0, 4)],
        DType::Q8_0 => vec![(2, 32), (0, 2)],
        DType::Q4_K => vec![(0, 144)],
        DType::Q5_K => vec![(0, 176)],
        DType::Q6_K => vec![(0, 208), (208, 2)],
        // Quants of a group (a multiple of 16 bytes), then its (scale, bias) word.
        DType::Affine { .. } => vec![(4, dtype.block_bytes() - 4), (0, 4)],
        DType::F32 | DType::F16 | DType::BF16 => return None,
    })
}

/// Whether [`QuantWeight`] and [`crate::ops::matmul::linear`] take this type (the GGUF block types).
pub fn is_supported(dtype: DType) -> bool {
    plane_fields(dtype).is_some()
}

/// Elements per block as the kernels count them (`QK` of the type's WGSL file): the type's block,
/// but 32 for the affine types, whose (scale, bias) the kernels find per group of such blocks.
pub(crate) fn kernel_block(dtype: DType) -> usize {
    match dtype {
        DType::Affine { .. } => 32,
        t => t.block_size(),
    }
}

/// Elements per matvec unit (`QU` of the type's WGSL file).
pub(crate) fn unit_elems(dtype: DType) -> usize {
    if dtype == DType::Q6_K {
        64
    } else {
        32
    }
}

/// The kernels' macros for the type (`wgsl/include/quant.wgsl`): its flag, and for the MLX affine
/// types the group (in 32-element units) and the scales' format. A4 is read by Q4_1's code (the
/// same `x = q · d + m` and, after the loader's reordering, the same nibble order).
pub(crate) fn type_macros(m: Macros, dtype: DType) -> Macros {
    match dtype {
        DType::Affine { bits, group, bf16 } => {
            m.flag(if bits == 4 { "Q4_1" } else { "A8" }).set("AFFINE_G", group / 32).flag_if("AFFINE_BF16", bf16)
        }
        _ => m.flag(type_flag(dtype)),
    }
}

/// The kernels' flag for a GGUF type (`wgsl/include/quant.wgsl`).
pub(crate) fn type_flag(dtype: DType) -> &'static str {
    match dtype {
        DType::Q4_0 => "Q4_0",
        DType::Q4_1 => "Q4_1",
        DType::Q5_0 => "Q5_0",
        DType::Q5_1 => "Q5_1",
        DType::Q8_0 => "Q8_0",
        DType::Q4_K => "Q4_K",
        DType::Q5_K => "Q5_K",
        DType::Q6_K => "Q6_K",
        other => unreachable!("{other} is not a quantized type"),
    }
}

/// Byte offsets of the planes of `blocks` blocks and the total (a multiple of 16).
fn plane_layout(fields: &[Field], blocks: usize) -> ([usize; 3], usize) {
    let mut starts = [0usize; 3];
    let mut at = 0usize;
    for (i, &(_, len)) in fields.iter().enumerate() {
        at = at.next_multiple_of(16);
        starts[i] = at;
        at += len * blocks;
    }
    (starts, at.next_multiple_of(16).max(16))
}

/// The planes of `raw` (whole blocks of `dtype`, in file order) and the first words of planes 1
/// and 2 (0 where the type has fewer planes).
pub fn repack(dtype: DType, raw: &[u8]) -> (Vec<u8>, [u32; 2]) {
    let fields = &plane_fields(dtype).expect("repack: not a quantized type")[..];
    let bb = dtype.block_bytes();
    assert!(raw.len().is_multiple_of(bb), "repack: {} bytes are not whole {dtype} blocks", raw.len());
    let blocks = raw.len() / bb;
    let (starts, total) = plane_layout(fields, blocks);
    let mut out = vec![0u8; total];
    for (i, &(off, len)) in fields.iter().enumerate() {
        let plane = &mut out[starts[i]..starts[i] + len * blocks];
        for (dst, blk) in plane.chunks_exact_mut(len).zip(raw.chunks_exact(bb)) {
            dst.copy_from_slice(&blk[off..off + len]);
        }
    }
    (out, [starts[1] as u32 / 4, starts[2] as u32 / 4])
}

/// The inverse of [`repack`]: the file's bytes of `blocks` blocks from their planes.
pub fn unpack(dtype: DType, planes: &[u8], blocks: usize) -> Vec<u8> {
    let fields = &plane_fields(dtype).expect("unpack: not a quantized type")[..];
    let bb = dtype.block_bytes();
    let (starts, _) = plane_layout(fields, blocks);
    let mut out = vec![0u8; blocks * bb];
    for (i, &(off, len)) in fields.iter().enumerate() {
        let plane = &planes[starts[i]..starts[i] + len * blocks];
        for (src, blk) in plane.chunks_exact(len).zip(out.chunks_exact_mut(bb)) {
            blk[off..off + len].copy_from_slice(src);
        }
    }
    out
}

/// A quantized weight `[N, K]` on the GPU: the blocks of a GGUF tensor (rows of K elements, each
/// a whole number of blocks) in the planes layout of the module docs ([`repack`]).
#[derive(Clone, Debug)]
pub struct QuantWeight {
    pub buffer: Arc<wgpu::Buffer>,
    pub dtype: DType,
    /// `[N, K]`: output features × input features.
    pub shape: [usize; 2],
    /// First u32 word of planes 1 and 2 (0 where the type has fewer planes).
    pub planes: [u32; 2],
}

impl QuantWeight {
    /// Bytes of one row of `k` elements in the file (`None` when `k` is not whole blocks).
    pub fn row_bytes(dtype: DType, k: usize) -> Option<usize> {
        dtype.byte_size(k)
    }

    /// Uploads a tensor `[N, K]` of `dtype` from the file's bytes (`raw`: N rows of
    /// `row_bytes(dtype, K)` bytes). Errors name `label`: a type without a quantized kernel, K
    /// not a whole number of blocks, `raw` of the wrong size, a tensor beyond the device's max
    /// storage binding (split it with [`QuantWeight::row_chunks`]), out of memory.
    pub fn new(gpu: &Gpu, label: &str, dtype: DType, shape: [usize; 2], raw: &[u8]) -> Result<QuantWeight> {
        let [n, k] = shape;
        let row = check_type(label, dtype, k)?;
        if n == 0 {
            return Err(Error::Mismatch(format!("{label}: no rows")));
        }
        if raw.len() != n * row {
            return Err(Error::Mismatch(format!(
                "{label}: [{n}, {k}] {dtype} takes {} bytes, got {}",
                n * row,
                raw.len()
            )));
        }
        let (bytes, planes) = repack(dtype, raw);
        let max = gpu.limits.max_storage_buffer_binding_size.min(gpu.limits.max_buffer_size);
        if bytes.len() as u64 > max {
            return Err(Error::Gpu(format!(
                "{label}: {} MiB of {dtype} exceed the device's max storage binding of {} MiB (split it by rows)",
                bytes.len() >> 20,
                max >> 20
            )));
        }
        let buffer = gpu.scoped(&format!("allocating {label} ({} MiB)", bytes.len() >> 20), || {
            gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes.len() as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            })
        })?;
        gpu.queue.write_buffer(&buffer, 0, &bytes);
        Ok(QuantWeight { buffer: Arc::new(buffer), dtype, shape, planes })
    }

    /// Uploads tensors of the same type and K stacked along their rows (`[q; k; v]`,
    /// `[gate; up]`): `parts` are their file bytes, each whole rows of `row_bytes(dtype, k)`.
    pub fn concat_rows(gpu: &Gpu, label: &str, dtype: DType, k: usize, parts: &[&[u8]]) -> Result<QuantWeight> {
        let row = check_type(label, dtype, k)?;
        let mut raw = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
        for (i, p) in parts.iter().enumerate() {
            if p.len() % row != 0 {
                return Err(Error::Mismatch(format!(
                    "{label}: part {i} has {} bytes, not whole rows of {row} ({k} {dtype} elements)",
                    p.len()
                )));
            }
            raw.extend_from_slice(p);
        }
        QuantWeight::new(gpu, label, dtype, [raw.len() / row, k], &raw)
    }

    /// Uploads a tensor `[N, K]` as row chunks that each fit the device's max storage binding (and
    /// max buffer size): `(first row, chunk [rows, K])`, chunks (but the last) a multiple of
    /// [`CHUNK_ROW_ALIGN`](super::CHUNK_ROW_ALIGN) = 64 rows, so that a chunk's columns of an f32
    /// logits row start on a 256-byte boundary (see [`crate::ops::matmul`]'s docs on output views). One chunk
    /// when the tensor fits.
    pub fn row_chunks(
        gpu: &Gpu,
        label: &str,
        dtype: DType,
        shape: [usize; 2],
        raw: &[u8],
    ) -> Result<Vec<(u32, QuantWeight)>> {
        let max = gpu.limits.max_storage_buffer_binding_size.min(gpu.limits.max_buffer_size);
        QuantWeight::row_chunks_max(gpu, label, dtype, shape, raw, max)
    }

    /// [`QuantWeight::row_chunks`] with an explicit byte limit per chunk (tests force small
    /// chunks).
    pub fn row_chunks_max(
        gpu: &Gpu,
        label: &str,
        dtype: DType,
        shape: [usize; 2],
        raw: &[u8],
        max_bytes: u64,
    ) -> Result<Vec<(u32, QuantWeight)>> {
        let [n, k] = shape;
        let row = check_type(label, dtype, k)?;
        if raw.len() != n * row {
            return Err(Error::Mismatch(format!(
                "{label}: [{n}, {k}] {dtype} takes {} bytes, got {}",
                n * row,
                raw.len()
            )));
        }
        // Planes add at most 16 bytes of alignment each (3 planes) to the file's bytes.
        let plan = plan_row_chunks(n, row as u64, max_bytes.saturating_sub(48))
            .map_err(|e| Error::Unsupported(format!("{label}: {e}")))?;
        upload_chunks(label, plan, |name, r| {
            QuantWeight::new(gpu, name, dtype, [r.len(), k], &raw[r.start * row..r.end * row])
        })
    }

    /// Bytes the weight takes on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.buffer.size()
    }
}

/// [`crate::loader::unpermute_rope_rows`] on a quantized tensor's file bytes: rows are whole
/// blocks, so llama.cpp's Q/K row permutation is undone by moving rows of `row_bytes` bytes (no
/// dequantization).
pub fn unpermute_rope_rows_raw(raw: &[u8], rows: usize, row_bytes: usize, heads: usize) -> Vec<u8> {
    assert!(
        raw.len() == rows * row_bytes && heads > 0 && rows.is_multiple_of(2 * heads),
        "unpermute_rope_rows_raw: shape"
    );
    let per_head = rows / heads;
    let half = per_head / 2;
    let mut out = vec![0u8; raw.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let src = h * per_head + 2 * i + j;
                let dst = h * per_head + j * half + i;
                out[dst * row_bytes..(dst + 1) * row_bytes]
                    .copy_from_slice(&raw[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// Checks that `dtype` has kernels and `k` is whole blocks; returns the bytes of a row.
fn check_type(label: &str, dtype: DType, k: usize) -> Result<usize> {
    if !is_supported(dtype) {
        return Err(Error::Unsupported(format!("{label}: tensor type {dtype} has no quantized kernel")));
    }
    match dtype.byte_size(k) {
        Some(row) if k > 0 => Ok(row),
        _ => Err(Error::Mismatch(format!(
            "{label}: K = {k} is not a whole number of {dtype} blocks of {}",
            dtype.block_size()
        ))),
    }
}

/// Random quantized blocks for the tests of every kernel that reads [`QuantWeight`]s and the
/// timing loops of `benches/`.
#[doc(hidden)]
pub mod test_util {
    use crate::dtype::DType;
    use crate::gpu::tensor::test_util::random;
    use half::f16;

    /// Every GGUF type, and the MLX affine types in both scale formats and three group sizes.
    pub const TYPES: [DType; 12] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Affine { bits: 4, group: 64, bf16: true },
        DType::Affine { bits: 4, group: 32, bf16: false },
        DType::Affine { bits: 8, group: 64, bf16: true },
        DType::Affine { bits: 8, group: 128, bf16: false },
    ];

    /// The f16 fields of a block that scale it, as (byte offset, magnitude): random quants times
    /// these land at |w| ~ 1 (Q4_K: d · scale (< 64) · nibble (< 16) ≈ 0.002 · 63 · 15 ≈ 1.9).
    fn scale_fields(t: DType) -> &'static [(usize, f32)] {
        match t {
            DType::Q4_0 => &[(0, 0.15)],
            DType::Q4_1 => &[(0, 0.15), (2, 1.0)],
            DType::Q5_0 => &[(0, 0.08)],
            DType::Q5_1 => &[(0, 0.08), (2, 1.0)],
            DType::Q8_0 => &[(0, 0.01)],
            DType::Q4_K => &[(0, 0.002), (2, 0.004)],
            DType::Q5_K => &[(0, 0.001), (2, 0.004)],
            DType::Q6_K => &[(208, 0.0003)],
            DType::Affine { bits: 4, .. } => &[(0, 0.15), (2, 1.0)],
            DType::Affine { .. } => &[(0, 0.01), (2, 1.0)],
            _ => unreachable!(),
        }
    }

    /// Byte offsets of the 16-bit scale fields of a block (see [`scale_fields`]).
    pub fn scale_field_offsets(t: DType) -> Vec<usize> {
        scale_fields(t).iter().map(|&(off, _)| off).collect()
    }

    /// Deterministic pseudo-random bytes (xorshift).
    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        crate::gpu::tensor::test_util::xorshift(seed).take(n).map(|s| (s >> 32) as u8).collect()
    }

    /// `rows` random rows of `k` elements of type `t`: every byte random (quants, high bits,
    /// sub-block scales and mins), then each f16 scale set to a random finite value of either
    /// sign, magnitude in [0.5, 1] × the type's (never zero, never NaN; bf16 for the affine types
    /// that store their scales so).
    pub fn random_blocks(t: DType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
        let mut raw = random_bytes(rows * t.byte_size(k).unwrap(), seed);
        let r = random(raw.len(), seed ^ 0x5555, 1.0);
        for (b, blk) in raw.chunks_exact_mut(t.block_bytes()).enumerate() {
            for (i, &(off, mag)) in scale_fields(t).iter().enumerate() {
                let u = r[(2 * b + i) % r.len()];
                let v = (0.5 + 0.5 * u.abs()) * mag * u.signum();
                let bytes = match t {
                    DType::Affine { bf16: true, .. } => half::bf16::from_f32(v).to_le_bytes(),
                    _ => f16::from_f32(v).to_le_bytes(),
                };
                blk[off..off + 2].copy_from_slice(&bytes);
            }
        }
        raw
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::{random_blocks, TYPES};
    use super::*;

    #[test]
    fn planes_hold_the_file_bytes() {
        for ty in TYPES {
            let blocks = 37;
            let raw = random_blocks(ty, 1, blocks * ty.block_size(), 9);
            let (planes, offs) = repack(ty, &raw);
            assert_eq!(unpack(ty, &planes, blocks), raw, "{ty}: repack / unpack round trip");
            assert!(planes.len() >= raw.len() && planes.len() <= raw.len() + 48, "{ty}: {} bytes", planes.len());
            assert!(offs.iter().all(|o| o % 4 == 0), "{ty}: planes start on 16-byte boundaries: {offs:?}");
            if matches!(ty, DType::Q4_K | DType::Q5_K) {
                assert_eq!(&planes[..raw.len()], &raw[..], "{ty} stays as in the file");
            }
        }
        // Q4_0: block 1's quants are the second 16 bytes, its d the second half of plane 1.
        let raw = random_blocks(DType::Q4_0, 1, 64, 3);
        let (planes, offs) = repack(DType::Q4_0, &raw);
        assert_eq!(&planes[16..32], &raw[20..36]);
        let d1 = 4 * offs[0] as usize + 2;
        assert_eq!(&planes[d1..d1 + 2], &raw[18..20]);
    }
}
