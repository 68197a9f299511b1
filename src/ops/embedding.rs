//! Token embedding (`wgsl/embedding.wgsl`): `out[t, :] = table[ids[t], :] * scale`, and the
//! row chunks ([`crate::weights`]) that split a large table so that each fits one storage binding.
//!
//! A vocabulary table can exceed the device's max storage binding (Qwen2.5: 151936 × 896 f16 =
//! 272 MB; lavapipe binds at most 128 MiB), so big tables are uploaded as row chunks
//! ([`upload_row_chunks`]), one [`Tensor`] each, and the model records one [`embedding`] dispatch
//! per chunk: each writes only the tokens whose id falls in its rows. The tied / untied lm_head
//! uses the same chunks (the same helper): chunk row counts are multiples of
//! [`CHUNK_ROW_ALIGN`] = 64, so a chunk's slice of an f32 logits row starts at a multiple of
//! 256 bytes and can be bound as a view.

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Macros, Tensor};
/// The row chunks of a large table, from [`crate::weights`] (kept at their former path).
pub use crate::weights::{plan_row_chunks, upload_row_chunks, upload_row_chunks_max, CHUNK_ROW_ALIGN};
use crate::weights::{type_macros, QuantWeight};

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/embedding.wgsl`; its first five members begin every
    /// [`EmbeddingTable`] kernel's `Params`.
    pub struct EmbeddingUniform = "Params" {
        n_tokens: u32,
        cols: u32,
        row_start: u32,
        chunk_rows: u32,
        scale: f32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Gathers rows of one table chunk: for every token `t` with
/// `row_start <= ids[t] < row_start + chunk_rows`, `out[t, :] = table_chunk[ids[t] - row_start, :] * scale`.
/// Other rows of `out` are left as they are (other chunks' dispatches write them; an id ≥ vocab
/// is written by none, so the host must validate ids).
///
/// `table_chunk`: f16 `[chunk_rows, C]` ([`Tensor`], from [`upload_row_chunks`]; a whole table is
/// the chunk with `row_start` 0), or a GGUF quantized type ([`QuantWeight`], chunks from
/// [`QuantWeight::row_chunks`]: rows dequantized as `to_f32` does, bit for bit, then scaled);
/// `ids`: u32 `[T]`; `out`: f32 `[T, C]`.
pub fn embedding<W: EmbeddingTable + ?Sized>(
    gpu: &Gpu,
    table_chunk: &W,
    row_start: u32,
    ids: &Tensor,
    out: &Tensor,
    scale: f32,
) -> Result<Kernel> {
    let [chunk_rows, cols] = table_chunk.rows_cols()?;
    let (n_tokens, n) = check_ids_out(W::KERNEL, ids, out, cols, W::PER_THREAD)?;
    let head = EmbeddingUniform {
        n_tokens: n_tokens as u32,
        cols: cols as u32,
        row_start,
        chunk_rows: chunk_rows as u32,
        scale,
        ..Default::default()
    };
    let p = table_chunk.params(gpu, head);
    let mut bindings = table_chunk.bindings();
    bindings.extend([ids.binding(), out.binding(), p.as_entire_binding()]);
    gpu.kernel(W::KERNEL, "main", &table_chunk.macros(gpu), &bindings, grid((n as u32).div_ceil(256)))
}

/// A table chunk [`embedding`] gathers from, and the kernel that reads it.
pub trait EmbeddingTable {
    /// The lookup's kernel (`wgsl/<KERNEL>.wgsl`); errors are named after it.
    const KERNEL: &'static str;
    /// Columns of `out` each thread writes.
    const PER_THREAD: u64;
    /// The chunk's `[rows, cols]`, or why it is not a table.
    fn rows_cols(&self) -> Result<[usize; 2]>;
    /// The kernel's uniform: `head` (the members both kernels' `Params` begin with) and the
    /// table's own.
    fn params(&self, gpu: &Gpu, head: EmbeddingUniform) -> wgpu::Buffer;
    /// The kernel's macros.
    fn macros(&self, gpu: &Gpu) -> Macros;
    /// The table's bindings (before ids, out and the uniform).
    fn bindings(&self) -> Vec<wgpu::BindingResource<'_>>;
}

/// An f16 table (`wgsl/embedding.wgsl`).
impl EmbeddingTable for Tensor {
    const KERNEL: &'static str = "embedding";
    const PER_THREAD: u64 = 1;
    fn rows_cols(&self) -> Result<[usize; 2]> {
        match *self.shape {
            [rows, cols] if self.ty == ElemType::F16 => Ok([rows, cols]),
            _ => Err(Error::InvalidArgument(format!(
                "embedding: table must be f16 [rows, C], is {:?} {:?}",
                self.ty, self.shape
            ))),
        }
    }
    fn params(&self, gpu: &Gpu, head: EmbeddingUniform) -> wgpu::Buffer {
        gpu.uniform("embedding.params", &head)
    }
    fn macros(&self, gpu: &Gpu) -> Macros {
        gpu.macros()
    }
    fn bindings(&self) -> Vec<wgpu::BindingResource<'_>> {
        vec![self.binding()]
    }
}

/// A table in a GGUF quantized type (`wgsl/embedding_quant.wgsl`): four columns a thread.
impl EmbeddingTable for QuantWeight {
    const KERNEL: &'static str = "embedding_quant";
    const PER_THREAD: u64 = 4;
    fn rows_cols(&self) -> Result<[usize; 2]> {
        Ok(self.shape)
    }
    /// `head` with the planes' first words where embedding.wgsl's `Params` pads (the two twins
    /// have the same layout: `ops::uniform_registry` checks both against their kernels).
    fn params(&self, gpu: &Gpu, head: EmbeddingUniform) -> wgpu::Buffer {
        let [o1, o2] = [self.planes[0], self.planes[1]];
        gpu.uniform("embedding_quant.params", &EmbeddingQuantUniform { o1, o2, ..bytemuck::cast(head) })
    }
    fn macros(&self, gpu: &Gpu) -> Macros {
        type_macros(gpu.macros(), self.dtype)
    }
    fn bindings(&self) -> Vec<wgpu::BindingResource<'_>> {
        vec![self.buffer.as_entire_binding(); 2]
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/embedding_quant.wgsl`.
    pub(crate) struct EmbeddingQuantUniform = "Params" {
        n_tokens: u32,
        cols: u32,
        row_start: u32,
        chunk_rows: u32,
        scale: f32,
        o1: u32,
        o2: u32,
        _pad: u32,
    }
}

/// Checks a lookup's `ids` (u32 `[T]`) and `out` (f32 `[T, cols]`); returns T and the threads
/// of the lookup, `T · cols / per_thread`, which must fit u32 indexing; errors name `op`.
fn check_ids_out(op: &str, ids: &Tensor, out: &Tensor, cols: usize, per_thread: u64) -> Result<(usize, u64)> {
    let bad = |msg: String| Err(Error::InvalidArgument(format!("{op}: {msg}")));
    if ids.ty != ElemType::U32 {
        return bad(format!("ids must be u32, are {:?}", ids.ty));
    }
    let n_tokens = ids.numel();
    if out.ty != ElemType::F32 || out.numel() != n_tokens * cols {
        return bad(format!("out must be f32 [{n_tokens}, {cols}], is {:?} {:?}", out.ty, out.shape));
    }
    let n = n_tokens as u64 * cols as u64 / per_thread;
    if n > u32::MAX as u64 {
        return bad(format!("{n_tokens} tokens × {cols} columns overflow u32 indexing"));
    }
    Ok((n_tokens, n))
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/per_layer_inputs.wgsl`.
    pub(crate) struct PerLayerInputsUniform = "Params" {
        n_tokens: u32,
        layers: u32,
        dim: u32,
        slot: u32,
        scale: f32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

/// Floats per layer slot of [`per_layer_inputs`]' output for `rows` tokens of width `dim`: `rows`
/// rows of `2 dim`, rounded up to 64 floats (256 bytes) so every layer's slot can be bound.
pub fn per_layer_slot(rows: usize, dim: usize) -> usize {
    (rows * 2 * dim).div_ceil(64) * 64
}

/// Gemma 4's per-layer inputs into each layer's slot of `out` (f32 `[layers * slot]`, slot from
/// [`per_layer_slot`]): row t of layer l's slot gets `[.. | (proj + tok)[t, l] * scale]` in its
/// second half (`proj`, `tok`: f32 `[T, layers * dim]`); the first half is the layer's gate's.
pub fn per_layer_inputs(
    gpu: &Gpu,
    proj: &Tensor,
    tok: &Tensor,
    out: &Tensor,
    (layers, dim): (usize, usize),
    scale: f32,
) -> Result<Kernel> {
    let bad = |msg: String| Err(Error::InvalidArgument(format!("per_layer_inputs: {msg}")));
    let width = layers * dim;
    if width == 0 || !proj.numel().is_multiple_of(width) || tok.numel() != proj.numel() {
        return bad(format!("proj {:?} and tok {:?} must be [T, {layers} x {dim}]", proj.shape, tok.shape));
    }
    let n_tokens = proj.numel() / width;
    let slot = out.numel() / layers;
    if slot < n_tokens * 2 * dim || !slot.is_multiple_of(64) || out.numel() < layers * slot {
        return bad(format!(
            "out has {} floats for {layers} slots of {slot} ({n_tokens} rows of {})",
            out.numel(),
            2 * dim
        ));
    }
    if [proj, tok, out].iter().any(|t| t.ty != ElemType::F32) {
        return bad("proj, tok and out must be f32".into());
    }
    let p = gpu.uniform(
        "per_layer_inputs.params",
        &PerLayerInputsUniform {
            n_tokens: n_tokens as u32,
            layers: layers as u32,
            dim: dim as u32,
            slot: slot as u32,
            scale,
            ..Default::default()
        },
    );
    gpu.kernel(
        "per_layer_inputs",
        "main",
        &gpu.macros(),
        &[proj.binding(), tok.binding(), out.binding(), p.as_entire_binding()],
        grid(((n_tokens * width) as u32).div_ceil(256)),
    )
}

pub mod cpu {
    /// Reference of [`super::per_layer_inputs`] (f64 sum and scale).
    pub fn per_layer_inputs(
        proj: &[f32],
        tok: &[f32],
        out: &mut [f32],
        layers: usize,
        dim: usize,
        slot: usize,
        scale: f32,
    ) {
        let width = layers * dim;
        for t in 0..proj.len() / width {
            for l in 0..layers {
                for j in 0..dim {
                    let i = t * width + l * dim + j;
                    out[l * slot + t * 2 * dim + dim + j] = ((proj[i] as f64 + tok[i] as f64) * scale as f64) as f32;
                }
            }
        }
    }

    /// Reference: `out[t, :] = table[ids[t], :] * scale` (f16 table `[rows, cols]`); ids out of
    /// range leave their row of `out` as is.
    pub fn embedding(table: &[half::f16], cols: usize, ids: &[u32], out: &mut [f32], scale: f32) {
        let rows = table.len() / cols;
        for (t, &id) in ids.iter().enumerate() {
            if (id as usize) < rows {
                let src = &table[id as usize * cols..][..cols];
                for (o, v) in out[t * cols..][..cols].iter_mut().zip(src) {
                    *o = v.to_f32() * scale;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;
    use half::f16;

    /// Each layer's slot gets its tokens' combined inputs in the rows' second halves; the first
    /// halves (the gates') and the slots' padding are untouched.
    #[test]
    fn per_layer_inputs_match_cpu() {
        for gpu in gpu_variants() {
            for (t, layers, dim) in [(3usize, 5usize, 8usize), (1, 35, 256), (33, 4, 12)] {
                let slot = per_layer_slot(t, dim);
                let proj = random(t * layers * dim, 70, 2.0);
                let tok = random(t * layers * dim, 71, 2.0);
                let init = random(layers * slot, 72, 1.0);
                let (pt, tt) = (
                    gpu.upload_f32("proj", &[t, layers * dim], &proj).unwrap(),
                    gpu.upload_f32("tok", &[t, layers * dim], &tok).unwrap(),
                );
                let out = gpu.upload_f32("out", &[layers * slot], &init).unwrap();
                let k = per_layer_inputs(&gpu, &pt, &tt, &out, (layers, dim), std::f32::consts::FRAC_1_SQRT_2).unwrap();
                gpu.run(&[&k]).unwrap();
                let got = gpu.read_f32(&out).unwrap();
                let mut want = init.clone();
                cpu::per_layer_inputs(&proj, &tok, &mut want, layers, dim, slot, std::f32::consts::FRAC_1_SQRT_2);
                // One f32 add and multiply: within an ulp of the f64 reference.
                let (d, at) = max_abs_diff(&got, &want);
                assert!(d <= 4e-7 * (1.0 + want[at].abs()), "T={t} L={layers} P={dim}: {d} at {at}");
                assert!(
                    want.iter().zip(&init).filter(|(a, b)| a != b).count() == t * layers * dim,
                    "T={t}: the halves written"
                );
            }
        }
    }

    #[test]
    fn plan_is_balanced_and_aligned() {
        // Qwen2.5's table on a 128 MiB binding: 3 chunks of ~50k rows.
        let plan = plan_row_chunks(151936, 2 * 896, 128 << 20).unwrap();
        assert_eq!(plan.len(), 3);
        assert!(plan.iter().all(|r| r.start % CHUNK_ROW_ALIGN == 0 && r.len() as u64 * 1792 <= 128 << 20));
        assert_eq!(plan.last().unwrap().end, 151936);
        assert!(plan.windows(2).all(|w| w[0].end == w[1].start));
        assert_eq!(plan_row_chunks(1000, 100, 1 << 20).unwrap(), std::iter::once(0..1000).collect::<Vec<_>>());
        assert!(plan_row_chunks(1000, 100, 6399).is_err());
    }

    /// What `out` (f32 `[ids, cols]`, starting as `init`) holds after one [`embedding`] dispatch
    /// per chunk of `chunks` (row start, table chunk) gathers `ids` times `scale`.
    fn gather<W: EmbeddingTable>(
        gpu: &Gpu,
        chunks: &[(u32, W)],
        ids: &[u32],
        init: &[f32],
        cols: usize,
        scale: f32,
    ) -> Vec<f32> {
        let ids_t = gpu.upload_u32("ids", &[ids.len()], ids).unwrap();
        let out = gpu.upload_f32("out", &[ids.len(), cols], init).unwrap();
        let ks: Vec<Kernel> =
            chunks.iter().map(|(start, w)| embedding(gpu, w, *start, &ids_t, &out, scale).unwrap()).collect();
        gpu.run(&ks.iter().collect::<Vec<_>>()).unwrap();
        gpu.read_f32(&out).unwrap()
    }

    #[test]
    fn embedding_matches_cpu_across_chunks() {
        for gpu in gpu_variants() {
            // Odd column count too: rows do not start on a u32 boundary.
            for cols in [64usize, 896, 75] {
                let rows = 300usize;
                let table: Vec<f16> =
                    random(rows * cols, 61 + cols as u64, 2.0).into_iter().map(f16::from_f32).collect();
                // At most 128 rows per chunk: chunks [0, 128), [128, 256), [256, 300).
                let max = (128 * 2 * cols) as u64 + 2;
                let chunks = upload_row_chunks_max(&gpu, "emb", &table, rows, cols, max).unwrap();
                assert!(chunks.len() >= 2, "cols={cols}: {} chunk(s)", chunks.len());
                let ids: Vec<u32> = vec![0, 299, 5, 128, 127, 200, 64, 1, 299, 17, 256, 255];
                for (k, (start, t)) in chunks.iter().enumerate() {
                    assert_eq!(*start as usize % CHUNK_ROW_ALIGN, 0);
                    assert!(k + 1 == chunks.len() || t.shape[0] % CHUNK_ROW_ALIGN == 0);
                }
                let init = random(ids.len() * cols, 62, 1.0);
                let scale = 29.93;
                let got = gather(&gpu, &chunks, &ids, &init, cols, scale);
                let mut want = init.clone();
                cpu::embedding(&table, cols, &ids, &mut want, scale);
                // f16 → f32 is exact; one f32 multiply: bit-exact up to rounding mode (≤ 1 ulp).
                let (d, i) = max_abs_diff(&got, &want);
                assert!(d <= want[i].abs() * 1.2e-7, "cols={cols}: diff {d} at {i}");
            }
        }
    }

    #[test]
    fn embedding_quant_matches_cpu_across_chunks() {
        // Every GGUF and MLX type: random blocks (finite scales) in row chunks of at most 128 rows, ids
        // across the chunk edges and out of range; the gather equals to_f32's rows times the
        // scale (the same float operations: bit for bit).
        use crate::dtype::to_f32;
        let gpu = gpu();
        for ty in crate::ops::matmul::gguf::tests::TYPES {
            let (rows, cols) = (300usize, 512usize);
            let raw = crate::ops::matmul::gguf::tests::random_blocks(ty, rows, cols, 81);
            let max = 128 * ty.byte_size(cols).unwrap() as u64;
            let chunks = QuantWeight::row_chunks_max(&gpu, "emb", ty, [rows, cols], &raw, max).unwrap();
            assert!(chunks.len() >= 3, "{ty}: {} chunk(s)", chunks.len());
            let ids: Vec<u32> = vec![0, 299, 5, 128, 127, 200, 64, 1, 300, 17, 256, 255, u32::MAX];
            let init = random(ids.len() * cols, 82, 1.0);
            let scale = 22.63;
            let got = gather(&gpu, &chunks, &ids, &init, cols, scale);
            let table = to_f32(ty, &raw, rows * cols).unwrap();
            let mut want = init.clone();
            for (t, &id) in ids.iter().enumerate() {
                if (id as usize) < rows {
                    for c in 0..cols {
                        want[t * cols + c] = table[id as usize * cols + c] * scale;
                    }
                }
            }
            assert_eq!(got, want, "{ty}");
        }
    }

    /// Block scales in the f16 subnormal range (below 2^-14: every Q6_K `d` of the real Qwen2.5
    /// files is one, median 1.3e-5) decode exactly: each type's gather against `to_f32`, bit for
    /// bit. The kernels convert halves with `unpack2x16float`; a device that flushed subnormal
    /// halves to zero would zero whole blocks, and fail here (lavapipe and the H100 do not).
    #[test]
    fn subnormal_scales_decode_exactly() {
        use crate::dtype::{to_f32, DType};
        use crate::ops::matmul::gguf::tests::{random_blocks, scale_field_offsets, TYPES};
        let gpu = gpu();
        for ty in TYPES.into_iter().filter(|t| !matches!(t, DType::Affine { bf16: true, .. })) {
            let (rows, cols) = (8usize, 512usize);
            let mut raw = random_blocks(ty, rows, cols, 83);
            // Every scale field: a random subnormal half (1 ..= 0x3FF units of 2^-24), either sign.
            let mut k = 0u32;
            for blk in raw.chunks_exact_mut(ty.block_bytes()) {
                for off in scale_field_offsets(ty) {
                    k = k.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    let bits = (1 + (k >> 8) % 0x3FF) as u16 | (((k >> 20) & 1) as u16) << 15;
                    blk[off..off + 2].copy_from_slice(&bits.to_le_bytes());
                }
            }
            let table = to_f32(ty, &raw, rows * cols).unwrap();
            assert!(table.iter().any(|&x| x != 0.0 && x.abs() < 1e-3), "{ty}: tiny values expected");
            let w = QuantWeight::new(&gpu, "emb", ty, [rows, cols], &raw).unwrap();
            let ids: Vec<u32> = (0..rows as u32).collect();
            let ids_t = gpu.upload_u32("ids", &[rows], &ids).unwrap();
            let out = gpu.empty("out", &[rows, cols], ElemType::F32).unwrap();
            let kern = embedding(&gpu, &w, 0, &ids_t, &out, 1.0).unwrap();
            gpu.run(&[&kern]).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let bad = got.iter().zip(&table).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(
                bad,
                0,
                "{ty}: {bad} of {} values differ (first: {:?})",
                table.len(),
                got.iter().zip(&table).find(|(a, b)| a.to_bits() != b.to_bits())
            );
        }
    }

    #[test]
    fn embedding_skips_ids_out_of_range() {
        for gpu in gpu_variants() {
            let (rows, cols) = (70usize, 32usize);
            let table: Vec<f16> = random(rows * cols, 71, 1.0).into_iter().map(f16::from_f32).collect();
            let t = gpu.upload_f16("emb", &[rows, cols], &table).unwrap();
            let ids = [3u32, 70, u32::MAX, 69];
            let init = random(ids.len() * cols, 72, 1.0);
            let got = gather(&gpu, &[(0, t)], &ids, &init, cols, 1.0);
            let mut want = init.clone();
            cpu::embedding(&table, cols, &ids, &mut want, 1.0);
            assert_eq!(got, want);
            assert_eq!(got[cols..3 * cols], init[cols..3 * cols]);
        }
    }
}
