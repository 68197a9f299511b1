//! Linear layers over GGUF quantized weights, read directly by the kernels: `y (+)= x · Wᵀ (+ bias)`
//! with W `[N, K]` in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K ([`QuantWeight`]), x f32
//! `[T, K]`, y f32 `[T, N]` (row stride `ld_out`, as [`super::linear`]), bias f32 `[N]`; the
//! weights are dequantized in registers (matvec) or into workgroup memory (matmul), and every sum
//! is f32. No f16 copy of the weight exists.
//!
//! [`linear_quant`] picks the kernel as [`super::linear`] does:
//! - up to [`MATVEC_MAX_T`] tokens, `wgsl/matvec_quant.wgsl`: lanes stream whole blocks (units of
//!   32 elements, 64 for Q6_K: one 16-byte load of quants plus the block's scales per row),
//!   dequantize them in registers and meet them with x; for one token over Q4_0, Q4_1, Q4_K and
//!   Q6_K on Vulkan, with 16 rows or more a workgroup, x is first staged in workgroup memory as
//!   16-bit fixed point per block (`DP4`) and the quants meet it in 4-wide integer dot products
//!   (exact sums; x rounded to 2^-14 of its block's largest |x|, [`cpu::stage_x16`]);
//! - a batch decode step ([`LinearOpts::batch`], up to [`MATVEC_MAX_T`] sequences, a token each),
//!   `wgsl/matvec_quant_batch.wgsl`: each unit of W dequantized once (`q_vals`) and met with the x
//!   of 8 tokens staged in workgroup memory, so that a token's sums do not depend on the batch;
//! - more tokens, `wgsl/matmul_quant.wgsl`: the f16 matmul's tiling, with W's tiles dequantized
//!   into workgroup memory as f32 (bit-identical to [`crate::dtype::to_f32`]); where the device
//!   has 16 × 16 cooperative matrices (`Caps::coop`: the H100 on Vulkan), `wgsl/matmul_quant_coop.wgsl`
//!   on the tensor cores instead (x and W's values met as f16, f32 sums; 2.3x the f32 matmul's
//!   prefill on Qwen2.5-1.5B, BENCHMARKS.md run 27).
//!
//! The dequantization lives in `wgsl/include/quant*.wgsl` (one file per type, shared by any kernel
//! that reads quantized rows). Its CPU twin is [`cpu::linear_quant`] (dequantizes with `to_f32`).
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
//!
//! # Measured (H100, Vulkan, driver 580.159.04; `bench_quant`, random blocks, one token)
//!
//! | (N, K) | Q4_0 | Q4_K | Q6_K | Q8_0 | f16 (`linear`) |
//! |---|---|---|---|---|---|
//! | 151936 × 1536 (lm_head) | 100 us, 1.31 TB/s | 109 us, 1.21 | 157 us, 1.22 | 115 us, 2.16 | 284 us, 1.6 |
//! | 17920 × 1536 (gate_up) | 18.5 us, 0.84 | 17.6 us, 0.88 | 23.3 us, 0.97 | 19.3 us, 1.5 | 24 us, 2.2 |
//! | 1536 × 8960 (down) | 10.6 us, 0.73 | 10.5 us, 0.74 | 14.7-15.3 us, 0.75 | 12.1 us, 1.2 | 8.1-8.8 us |
//! | 2048 × 1536 (qkv) | 6.2 us | 6.6 us | 7.5 us | 6.0 us | 5.6 us |
//!
//! With DP4 (`probe_quant`, same machine, W cold in L2): lm_head 151936 × 1536 Q4_0 101 → 56 us
//! (2.36 TB/s), Q4_K 109 → 69 us (1.90), Q6_K 159 → 109 us (1.76); gate_up 17920 × 1536 Q4_0
//! 19.1 → 12.2 us, Q4_K 18.8 → 13.9, Q6_K 25.3 → 19.4. Not used below 16 rows a workgroup (the
//! down projection's 4: staging K = 8960 per 4 rows made it 1.4x slower).
//!
//! Large shapes stream 1.0-1.4 TB/s for the 4- to 6-bit types (35-50% of the ~2.8 TB/s read
//! roofline) and 2.2 TB/s for Q8_0, 2-2.7x faster than the f16 copy on an lm_head; the weights
//! per second are about the same for every type, so the kernel is bound by the dequantization's
//! instructions and latency (occupancy), not by bytes. Small and mid shapes are latency-bound
//! (one wave of lanes), as fast as f16 or, for the 1536 × 8960 down projection, slower.
//! Prefill (T = 512, 17920 × 1536): 22-24.5 TFLOP/s for every type, 26 for f16. At T = 32
//! matvec (4 tokens per pass, dequantizing per token) takes 250-360 us (Q6_K 530) against
//! 410-460 us for the tiled matmul at T = 33, and matvec_quant_batch 137-157 us (17920 × 1536,
//! Q4_K / Q6_K, `bench_quant_batch`: W dequantized once per 8 tokens).

use super::{
    check_operands, common_macros, glu_macros, out_binding, Input, LinearOpts, LinearShape, MatmulConfig, MATVEC_MAX_T,
    MATVEC_WG,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Macros, Tensor};
use crate::ops::embedding::plan_row_chunks;
use crate::tuning::{InputKind, MatvecQuery, MatvecState};
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

/// Whether [`QuantWeight`] and [`linear_quant`] take this type (the GGUF block types).
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
fn unit_elems(dtype: DType) -> usize {
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
fn type_flag(dtype: DType) -> &'static str {
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
    assert!(raw.len() % bb == 0, "repack: {} bytes are not whole {dtype} blocks", raw.len());
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
/// a whole number of blocks) in the planes layout of the module docs.
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
    /// [`crate::ops::embedding::CHUNK_ROW_ALIGN`] = 64 rows, so that a chunk's columns of an f32
    /// logits row start on a 256-byte boundary (see [`super`]'s docs on output views). One chunk
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
        let many = plan.len() > 1;
        plan.into_iter()
            .map(|r| {
                let name = if many { format!("{label}[{}..{}]", r.start, r.end) } else { label.to_string() };
                let w = QuantWeight::new(gpu, &name, dtype, [r.len(), k], &raw[r.start * row..r.end * row])?;
                Ok((r.start as u32, w))
            })
            .collect()
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
    assert!(raw.len() == rows * row_bytes && heads > 0 && rows % (2 * heads) == 0, "unpermute_rope_rows_raw: shape");
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

/// Records `y (+)= x · Wᵀ (+ bias)` with a quantized W: matvec up to [`MATVEC_MAX_T`] tokens, the
/// tiled matmul for more. Shapes are checked as [`super::linear`] checks them (a mismatch
/// panics: shapes are fixed by the model); `y` may be a view with `opts.ld_out` (row chunks of an
/// lm_head writing one logits buffer).
pub fn linear_quant(
    gpu: &Gpu,
    x: &Tensor,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    linear_quant_in(gpu, x, Input::Plain, w, bias, y, opts)
}

/// [`linear_quant`] with a fused [`Input`] (matvec only: see [`super::fuses_input`]).
pub fn linear_quant_in(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    let s = check_operands("linear_quant", &input.checked_x(x, w.shape[1]), w.shape[0], w.shape[1], bias, y, opts);
    assert!(
        is_supported(w.dtype) && s.k % w.dtype.block_size() == 0,
        "linear_quant: K = {} is not whole {} blocks",
        s.k,
        w.dtype
    );
    if s.t <= MATVEC_MAX_T {
        assert!(
            matches!(input, Input::Plain) || super::fuses_input(s.t, s.k),
            "linear_quant: {input:?} cannot be fused at {s:?}"
        );
        if opts.batch {
            return matvec_quant_batch(gpu, x, input, w, bias, y, &s, opts, batch_rows(s.n, s.t), None);
        }
        matvec_quant(
            gpu,
            x,
            input,
            w,
            bias,
            y,
            &s,
            opts,
            QMatvecConfig::new(gpu, w.dtype, &super::tuned_shape(&s, &opts)).for_input(gpu, w.dtype, &s, input),
        )
    } else {
        assert!(matches!(input, Input::Plain), "linear_quant: {input:?} cannot be fused into the matmul ({s:?})");
        assert!(opts.glu.is_none(), "linear_quant: GLU is a matvec epilogue, not the matmul's ({s:?})");
        if gpu.caps.coop {
            return matmul_quant_coop(gpu, x, w, bias, y, &s, opts);
        }
        matmul_quant(gpu, x, w, bias, y, &s, opts, MatmulConfig::new(&s))
    }
}

/// How matvec_quant runs for one shape on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QMatvecConfig {
    /// Threads per workgroup.
    wg: u32,
    /// Threads per row group of 4 rows (a power of two dividing the workgroup).
    tpr: u32,
    /// Tokens per pass over W: 1 or 4.
    tok: u32,
    /// Reduce with subgroup operations.
    subgroups: bool,
    /// Stage x as 16-bit fixed point and sum with integer dot products (`DP4` in
    /// wgsl/matvec_quant.wgsl): Q4_0 / Q4_1 / Q4_K / Q6_K where the backend has the instructions;
    /// one token a pass with the whole row staged, or (Q6_K) passes of 4 tokens, staged in chunks
    /// where they do not fit workgroup memory ([`dp4_chunk`]).
    dp4: bool,
    /// With `dp4`, one token, the row staged whole: each unit's loads issued one iteration
    /// early (`PREFETCH`).
    prefetch: bool,
    /// Measurement probes (tests only): PROBE_NOX, PROBE_NOMATH.
    #[cfg(test)]
    probe: &'static str,
    /// At most this many blocks staged a chunk (tests only; 0: as many as fit).
    #[cfg(test)]
    max_kc: u32,
}

impl QMatvecConfig {
    /// The shape the tuning table's [`Op::Matvec`](crate::tuning::Op) rows choose for `dtype`
    /// and `s` on this device (src/tuning/table.rs: each rule with the measurement that chose it,
    /// e.g. Q6_K down projections of 128+ units in 512 threads, BENCHMARKS run 67), then the knobs.
    fn new(gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let subgroups = gpu.caps.subgroups && sg_max <= MATVEC_WG;
        let tok = if s.t >= 2 { 4 } else { 1 };
        let st = Self::query(gpu, dtype, s, tok, subgroups, InputKind::Plain, |q| gpu.tuning().matvec(q));
        Self::from_state(st).knob(gpu, dtype, s)
    }

    /// Runs `f` on what the tuning table's rows see of this projection ([`MatvecQuery`]): the
    /// type's units, the narrowest and widest row groups a pass allows (as the f16 matvec: every
    /// output of a pass, 4 rows x `tok` tokens, has a storing lane, the reduction without
    /// subgroups folds 8 lanes first, a row group covers whole subgroups), whether a row stages
    /// whole for DP4 ([`stages_whole`], [`dp4_fits`]).
    #[allow(clippy::too_many_arguments)]
    fn query<R>(
        gpu: &Gpu,
        dtype: DType,
        s: &LinearShape,
        tok: u32,
        subgroups: bool,
        input: InputKind,
        f: impl FnOnce(&MatvecQuery) -> R,
    ) -> R {
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let min_tpr = (4 * tok).max(8).max(if subgroups { sg_max } else { 1 });
        let units = (s.k / unit_elems(dtype)) as u32;
        let whole = |wg: u32| stages_whole(gpu, dtype, s.k, wg);
        let fits = |wg: u32, tok: u32| dp4_fits(gpu, dtype, s.k, wg, tok);
        f(&MatvecQuery {
            dtype,
            n: s.n,
            k: s.k,
            tok,
            units,
            min_tpr,
            widest: units.next_power_of_two().min(MATVEC_WG).max(min_tpr),
            max_wg: MATVEC_WG,
            subgroups,
            subgroup_max_size: gpu.caps.subgroup_max_size,
            max_invocations: gpu.limits.max_compute_invocations_per_workgroup,
            int_dot: gpu.tuning().int_dot(),
            input,
            whole: &whole,
            fits: &fits,
        })
    }

    fn from_state(st: MatvecState) -> Self {
        QMatvecConfig {
            wg: st.wg,
            tpr: st.tpr,
            tok: st.tok,
            subgroups: st.subgroups,
            dp4: st.dp4,
            prefetch: st.prefetch,
            #[cfg(test)]
            probe: "",
            #[cfg(test)]
            max_kc: 0,
        }
    }

    fn state(&self) -> MatvecState {
        let (wg, tpr, tok, subgroups, dp4, prefetch) =
            (self.wg, self.tpr, self.tok, self.subgroups, self.dp4, self.prefetch);
        MatvecState { wg, tpr, tok, subgroups, dp4, prefetch, ..Default::default() }
    }

    /// The measurement knobs (TUNING.md): `WGPU_LLM_QMV="TYPE:N:K:wg:tpr:dp4,..."` (TYPE as `Q4_K`,
    /// or `any`) sets one-token configurations by type and shape, for measuring them inside a
    /// step. Applied last, over every rule (a shape it names takes its configuration, the others
    /// their rules). `WGPU_LLM_QMV_PF=0` / `1` turns `prefetch` off / on wherever a row stages whole.
    fn knob(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let knobs = &gpu.tuning().knobs;
        let mut cfg = match knobs.qmv_pf {
            Some(false) => QMatvecConfig { prefetch: false, ..self },
            Some(true) => QMatvecConfig { prefetch: self.dp4 && self.tok == 1, ..self },
            None => self,
        };
        if cfg.tok != 1 {
            return cfg;
        }
        for e in &knobs.qmv {
            let ty_ok = e.ty == "any" || e.ty == format!("{dtype:?}");
            if ty_ok && e.n == s.n && e.k == s.k && (e.dp4 == 0 || stages_whole(gpu, dtype, s.k, e.wg)) {
                let dp4 = e.dp4 == 1 && gpu.tuning().int_dot();
                let prefetch = dp4 && knobs.qmv_pf == Some(true);
                cfg = QMatvecConfig { wg: e.wg, tpr: e.tpr, dp4, prefetch, ..cfg };
            }
        }
        cfg
    }
}

impl QMatvecConfig {
    /// The macros of wgsl/matvec_quant.wgsl every dispatch of this configuration sets: the fused
    /// input, the epilogue, W's type, where the norm weight binds, the workgroup shape and tokens a
    /// pass (`SUBGROUP` cleared where the configuration reduces without subgroups).
    fn macros(&self, gpu: &Gpu, dtype: DType, input: Input<'_>, bias: bool, opts: &LinearOpts) -> Macros {
        let mut m = type_macros(glu_macros(input.macros(common_macros(gpu, bias, opts)), opts.glu), dtype)
            .set("GB", if bias { 6 } else { 5 })
            .set("WG", self.wg)
            .set("TPR", self.tpr)
            .set("TOK", self.tok)
            .flag_if("TOK4", self.tok == 4);
        if !self.subgroups {
            m.0.remove("SUBGROUP");
        }
        m
    }

    /// The configuration for x read as `input`: one-token Q4_K rows of at most 1536 elements
    /// over at most 4096 rows, read plain (an o projection) or through the fused norm (q/k/v),
    /// take DP4 where the row stages whole. Rows of 1536 (Qwen2.5-1.5B's) in 256-thread
    /// workgroups of 64-lane row groups (H100, `WGPU_LLM_QMV` inside the step, BENCHMARKS run 65:
    /// its 1536 x 1536 o projection, the step 1741 -> 1710 us against 128 threads of 32 lanes; its
    /// q/k/v, N = 2048, with the norm, 1741 -> 1727 against the float path); shorter rows read
    /// plain in 128-thread workgroups of 32-lane row groups (measured against the float path with
    /// the 1.5B's o projection before the rule above, the step 1886 -> 1875 us and 1949 -> 1938 in
    /// two calls, and the 0.5B's 896 x 896 the same), through the norm the float path.
    fn for_input(self, gpu: &Gpu, dtype: DType, s: &LinearShape, input: Input) -> Self {
        if matches!(input, Input::Staged(_)) {
            return self.staged(gpu, dtype, s);
        }
        let kind = if matches!(input, Input::Norm { .. }) { InputKind::Norm } else { InputKind::Plain };
        match Self::query(gpu, dtype, s, self.tok, self.subgroups, kind, |q| gpu.tuning().matvec_input(q, self.state()))
        {
            Some(st) => Self::from_state(st).knob(gpu, dtype, s),
            None => self,
        }
    }
}

impl QMatvecConfig {
    /// The configuration for x staged apart ([`Input::Staged`], one token): DP4 without the
    /// kernel's own staging, so any workgroup size: row groups of about 2 units a lane (32 to 128
    /// lanes) in workgroups of one row group, at least 64 threads (`WGPU_LLM_XG_CFG="wg:tpr:prefetch"`
    /// sets it for measurement).
    fn staged(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        // (The table's row: H100, `bench_quant` (W cold, the staging apart not counted),
        // Gemma-4-31B's rows of 16384 and 21504 over 5376: Q4_K (32-element units) 26.5 / 35.9 us
        // at 128 lanes (30.0 / 39.0 at 64, 41.3 / 53.5 at 32; the kernel staging in workgroup
        // memory: 38.3 / 48.3), Q6_K (64-element units) 35.5 / 45.9 at 64 lanes (34.9 / 44.2 at
        // 32; before: 48.9 / 64.5).)
        let st = Self::query(gpu, dtype, s, self.tok, self.subgroups, InputKind::Staged, |q| {
            gpu.tuning().matvec_staged(q, self.state())
        });
        let mut cfg = Self::from_state(st);
        if let Some([w, t, pf]) = gpu.tuning().knobs.xg_cfg {
            let sg = if self.subgroups { gpu.caps.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
            let t = t.max(sg);
            (cfg.wg, cfg.tpr, cfg.prefetch) = (w.max(t), t, pf == 1);
        }
        cfg
    }
}

/// The matvec's (wg, tpr, dp4, prefetch) for `dtype` over `t` tokens of an N x K weight, x read
/// plain or through the fused norm (`norm`): what the tuning table's tests check.
#[cfg(test)]
pub(crate) fn tuned_matvec(
    gpu: &Gpu,
    dtype: DType,
    t: usize,
    n: usize,
    k: usize,
    norm: bool,
) -> (u32, u32, bool, bool) {
    let s = LinearShape { t, n, k, ld_out: n, cols: n };
    let g = gpu.upload_f32("g", &[k], &vec![1.0; k]).unwrap();
    let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
    let c = QMatvecConfig::new(gpu, dtype, &s).for_input(gpu, dtype, &s, input);
    (c.wg, c.tpr, c.dp4, c.prefetch)
}

/// Whether a one-token projection of `dtype` over rows of `k` reads x staged apart
/// ([`quantize_x16`] then [`Input::Staged`]): DP4 types on Vulkan, rows of `min_k` or more
/// ([`StageApart`]).
pub fn stages_apart(gpu: &Gpu, dtype: DType, t: usize, k: usize, min_k: usize) -> bool {
    t == 1 && k >= min_k && k % 32 == 0 && gpu.tuning().int_dot() && has_dp4(dtype)
}

/// Which one-token quantized projections read x staged apart ([`stages_apart`], [`Input::Staged`]).
/// The rule ([`StageApart::rule`]): rows of 16384 or more staged by [`quantize_x16`] (Gemma-4-31B's
/// down projections, K = 21504, and full-attention o projections, K = 16384), which the matvec
/// cannot stage in workgroup memory for many rows at once; rows of 4096 or more where the norm that
/// writes x stages it in the same dispatch (Gemma-4-31B's gate_up and q/k/v, K = 5376; the norm runs
/// as a dispatch of its own only above 4096, `fuses_norm`). Measured on the H100: BENCHMARKS.md
/// session 15.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageApart {
    /// Rows of at least this many elements, staged by a dispatch of their own.
    pub k: usize,
    /// Rows of at least this many elements, where the norm before them stages them.
    pub free_k: usize,
    /// ... for projections of at least this many output rows in all (the parts of q/k/v or gate_up).
    pub free_n: usize,
}

impl StageApart {
    /// No projection stages apart.
    pub const NEVER: StageApart = StageApart { k: usize::MAX, free_k: usize::MAX, free_n: usize::MAX };

    /// Every projection whose rows are whole 32-element blocks stages apart (tests: every path).
    pub const EVERY: StageApart = StageApart { k: 32, free_k: 32, free_n: 0 };

    /// The rule (see the type): the tuning table's [`Op::StageApart`](crate::tuning::Op) row for
    /// `gpu`, with the measurement knobs: `WGPU_LLM_XG=0` ([`Self::NEVER`]), `WGPU_LLM_XG_K`,
    /// `WGPU_LLM_XG_FREE_K` and `WGPU_LLM_XG_FREE_N` for the three fields.
    pub fn rule(gpu: &Gpu) -> StageApart {
        match gpu.tuning().stage_apart() {
            Some((k, free_k, free_n)) => StageApart { k, free_k, free_n },
            None => StageApart::NEVER,
        }
    }
}

/// u32 words of x staged by [`quantize_x16`] for `t` rows of `k` elements: five vec4 a 32-element
/// block (wgsl/quantize_x16.wgsl).
pub fn staged_x_words(t: usize, k: usize) -> usize {
    t * k / 32 * 20
}

/// Records x (f32 `[T, K]`, K a multiple of 32) staged as 16-bit fixed point into `xs` (any
/// 4-byte element type, at least [`staged_x_words`]): wgsl/quantize_x16.wgsl, CPU twin
/// [`cpu::quantize_x16`]. A quantized matvec then reads it as [`Input::Staged`].
pub fn quantize_x16(gpu: &Gpu, x: &Tensor, xs: &Tensor) -> Result<Kernel> {
    assert_eq!(x.ty, ElemType::F32, "quantize_x16: x must be f32, got {:?}", x.ty);
    let (t, k) = match x.shape[..] {
        [t, k] if k % 32 == 0 && t > 0 => (t, k),
        _ => panic!("quantize_x16: x must be [T, K] with K a multiple of 32, got {:?}", x.shape),
    };
    let need = 4 * staged_x_words(t, k) as u64;
    assert!(xs.size_bytes() >= need, "quantize_x16: xs must hold {need} bytes, got {:?} {:?}", xs.ty, xs.shape);
    let blocks = (t * k / 32) as u32;
    let params = gpu.uniform("quantize_x16.params", &[blocks, (k / 32) as u32, (k / 4) as u32, 0]);
    // Eight threads a block where subgroups are at least 8 wide (a block's threads one aligned run).
    let eight = gpu.caps.shuffles8();
    let threads = if eight { 8 * blocks } else { blocks };
    gpu.kernel(
        "quantize_x16",
        "main",
        &gpu.macros().flag_if("STAGE8", eight),
        &[x.binding(), xs.binding(), params.as_entire_binding()],
        grid(threads.div_ceil(64)),
    )
}

/// Blocks of 32 elements staged per token at a time for DP4 (`KC` in wgsl/matvec_quant.wgsl):
/// the whole row (K / 32 blocks) where `tok` tokens of it fit the workgroup memory the reductions
/// leave (`red`, WG · TOK vec4, and the fused norm's, WG vec4), else balanced chunks of whole
/// 256-element super-blocks. None for types without the DP4 form, or where not even one
/// super-block a token fits.
fn dp4_chunk(gpu: &Gpu, dtype: DType, k: usize, wg: u32, tok: u32) -> Option<u32> {
    if !has_dp4(dtype) {
        return None;
    }
    // A block a token: 32 low and 32 high bytes, two 16-element sums and the scale.
    let per_block = (2 * 32 + 2 * 4 + 4) * tok as usize;
    let reductions = 16 * wg as usize * (tok as usize + 1);
    let fit = (gpu.limits.max_compute_workgroup_storage_size as usize).checked_sub(reductions)? / per_block;
    let kb = k / 32;
    if kb <= fit {
        return Some(kb as u32);
    }
    let fit = fit / 8 * 8;
    if fit == 0 {
        return None;
    }
    Some(kb.div_ceil(kb.div_ceil(fit)).next_multiple_of(8) as u32)
}

/// Whether `dtype` has the integer-dot-product form (`DP4`: quants of at most 7 bits, blocks of
/// 32 or whole 256-element super-blocks).
fn has_dp4(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::Q6_K | DType::Affine { bits: 4, .. })
}

/// Whether one token's row of `k` elements stages whole for DP4 in workgroups of `wg` threads
/// ([`dp4_chunk`]: one chunk, the whole row).
fn stages_whole(gpu: &Gpu, dtype: DType, k: usize, wg: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, 1) == Some((k / 32) as u32)
}

/// Whether the DP4 matvec takes `dtype` at all for rows of `k` ([`dp4_chunk`]).
fn dp4_fits(gpu: &Gpu, dtype: DType, k: usize, wg: u32, tok: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, tok).is_some()
}

#[allow(clippy::too_many_arguments)]
fn matvec_quant(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
    cfg: QMatvecConfig,
) -> Result<Kernel> {
    matvec_quant_routed(gpu, x, input, w, bias, y, s, opts, cfg, None)
}

/// The matvec config of a quantized expert projection ([`super::experts_shape`]).
fn experts_config(gpu: &Gpu, dtype: DType, s: &LinearShape) -> QMatvecConfig {
    let cfg = QMatvecConfig::new(gpu, dtype, &super::experts_shape(s));
    assert!(cfg.tok == 1);
    cfg
}

#[cfg(test)]
/// Whether [`matvec_experts_quant`] stages x for the integer dot products (`DP4`): the test
/// references meet x as [`cpu::stage_x16`] stages it there.
pub(crate) fn experts_use_dp4(gpu: &Gpu, dtype: DType, s: &LinearShape) -> bool {
    experts_config(gpu, dtype, s).dp4
}

/// Records the quantized expert projection of [`crate::ops::moe::linear_experts`] (its checks
/// done): `s.t` slots of `s.n` rows (per expert) over K = `s.k`. Without `groups`, a slot a
/// workgroup column (the one-token matvec); with `groups` ([`crate::ops::moe::moe_group`]'s table
/// for these slots), the batch kernel (`wgsl/matvec_quant_batch.wgsl`, GROUPED) over tiles of up
/// to 8 slots of one expert, a unit of its rows dequantized once a tile (prefill's form: at many
/// tokens each expert has many slots).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matvec_experts_quant(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    route: super::Route<'_>,
    groups: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
) -> Result<Kernel> {
    assert!(
        is_supported(w.dtype) && s.k % w.dtype.block_size() == 0,
        "linear_experts: K = {} is not whole {} blocks",
        s.k,
        w.dtype
    );
    assert!(matches!(input, Input::Plain) || s.k % 4 == 0, "linear_experts: {input:?} cannot be fused at K = {}", s.k);
    match groups {
        None => {
            let cfg = experts_config(gpu, w.dtype, s);
            matvec_quant_routed(gpu, x, input, w, None, y, s, opts, cfg, Some(&route))
        }
        Some(g) => {
            let tiles = crate::ops::moe::group_tiles(s.t, route.experts as usize);
            matvec_quant_batch(gpu, x, input, w, None, y, s, opts, 32, Some((&route, g, tiles)))
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn matvec_quant_routed(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
    cfg: QMatvecConfig,
    route: Option<&super::Route<'_>>,
) -> Result<Kernel> {
    assert!(matches!(cfg.tok, 1 | 4));
    assert!(cfg.tpr.is_power_of_two() && cfg.wg % cfg.tpr == 0);
    assert!(cfg.tpr >= 8 && cfg.tpr >= 4 * cfg.tok);
    let mut macros = cfg.macros(gpu, w.dtype, input, bias.is_some(), &opts);
    if let Input::Staged(_) = input {
        assert!(
            cfg.dp4 && cfg.tok == 1 && s.t == 1,
            "linear_quant: x staged apart is one token's, DP4 ({cfg:?}, {s:?})"
        );
        assert!(route.is_none(), "linear_quant: no expert projection reads x staged apart");
        assert!(has_dp4(w.dtype), "linear_quant: {} has no DP4 form", w.dtype);
        macros = macros.flag("DP4").set("XB", if bias.is_some() { 6 } else { 5 }).flag_if("PREFETCH", cfg.prefetch);
    } else if cfg.dp4 {
        let kc = dp4_chunk(gpu, w.dtype, s.k, cfg.wg, cfg.tok);
        let kc = kc.unwrap_or_else(|| panic!("DP4 for {} K = {} ({cfg:?})", w.dtype, s.k));
        #[cfg(test)]
        let kc = if cfg.max_kc > 0 { kc.min(cfg.max_kc) } else { kc };
        // Chunks of whole 256-element super-blocks (the k-quants' units never straddle one).
        assert!(kc as usize == s.k / 32 || kc % 8 == 0, "DP4 chunks of {kc} blocks");
        let chunked = (kc as usize) < s.k / 32 || cfg.tok > 1;
        macros = macros
            .flag("DP4")
            .set("KC", kc)
            .flag_if("DP4X", chunked)
            .flag_if("STAGE8", cfg.subgroups && gpu.caps.shuffles8())
            .flag_if("PREFETCH", cfg.prefetch && !chunked);
    }
    #[cfg(test)]
    if !cfg.probe.is_empty() {
        macros = macros.flag(cfg.probe);
    }
    let rows_per_wg = 4 * cfg.wg / cfg.tpr;
    let params = matvec_quant_params(gpu, "matvec_quant.params", &input, w, s, route);
    let mut bindings = quant_bindings(gpu, w, x, y, s, &params, bias);
    bindings.extend(input.binding(s.k));
    let (macros, z) = super::Route::apply(route, macros, &mut bindings, s.t);
    let [gx, gy, _] = grid((s.n as u32).div_ceil(rows_per_wg));
    gpu.kernel("matvec_quant", "main", &macros, &bindings, [gx, gy, z])
}

/// Whether a projection of two quantized weights over the same x (the first writing columns
/// 0 .. N₁ of y, the second the rest) runs as one mixed-type dispatch ([`matvec_quant_mixed`]) for
/// `t` tokens read as `input`: one token, plain or normalized x, two different GGUF types (not
/// the MLX affine ones), rows of at most 1536 elements, paths that go together ([`mix_config`]):
/// a Q4_K_M file's q/k (Q4_K) and Q6_K v, two dispatches otherwise, each mostly its launch and
/// latency on the H100 (Qwen2.5-1.5B, K = 1536: +3.5 %, Qwen2.5-0.5B, K = 896: +6 %, BENCHMARKS
/// runs 64-66; Qwen3.5-35B-A3B's rows of 2048 lost 1.7 %, run 71). `WGPU_LLM_MIX=0` turns it off
/// (for measuring).
pub fn mixes(gpu: &Gpu, a: &QuantWeight, b: &QuantWeight, t: usize, input: Input<'_>, opts: &LinearOpts) -> bool {
    // (A QuantWeight's type has kernels and its rows are whole blocks.)
    let gguf = |d: DType| !matches!(d, DType::Affine { .. });
    let Some(max_k) = gpu.tuning().mix_max_k() else { return false };
    let [na, k] = a.shape;
    let ok = t == 1
        && k <= max_k
        && !opts.batch
        && opts.glu.is_none()
        && matches!(input, Input::Plain | Input::Norm { .. })
        && a.dtype != b.dtype
        && gguf(a.dtype)
        && gguf(b.dtype)
        && b.shape[1] == k;
    ok && mix_config(gpu, a.dtype, b.dtype, &LinearShape { t: 1, n: na, k, ld_out: na, cols: na }, input).is_some()
}

/// The mixed dispatch's configuration (None: the two weights do not mix): the first weight's own
/// (its rows are most of the work), and whether the second weight takes the integer dot products
/// against x staged whole in each of its workgroups (`DP4`). A first weight on its DP4 path mixes
/// with a second that has one (both DP4 in the first's workgroups); on its float path, with any
/// (`MIX_FLOAT_A`): the second takes DP4 where its type has it (the float path of a Q6_K v made
/// the 1.5B's mixed q/k/v 20.6 us, against 13.0 + 11.4 as two dispatches: BENCHMARKS run 63),
/// then in workgroups of 256 threads (the 1.5B's step 1741 us against 1756 with its 64-thread
/// workgroups, run 64). `WGPU_LLM_MIX_CFG="wg:tpr:b_dp4:a_dp4"` sets it for measuring.
fn mix_config(gpu: &Gpu, a: DType, b: DType, s: &LinearShape, input: Input<'_>) -> Option<(QMatvecConfig, bool)> {
    let cfg = QMatvecConfig::new(gpu, a, &super::tuned_shape(s, &LinearOpts::default())).for_input(gpu, a, s, input);
    let int_dot = gpu.tuning().int_dot();
    let dp4 = |t: DType, wg: u32| has_dp4(t) && int_dot && stages_whole(gpu, t, s.k, wg);
    if let Some([wg, tpr, bd, ad]) = gpu.tuning().knobs.mix_cfg {
        // (row groups of whole subgroups, whole row groups a workgroup)
        let tpr = tpr.max(cfg.tpr.min(gpu.caps.subgroup_max_size.max(8))).next_power_of_two();
        let wg = wg.max(tpr).next_multiple_of(tpr);
        let b_dp4 = bd == 1 && dp4(b, wg);
        let a_dp4 = ad == 1 && b_dp4 && dp4(a, wg);
        return Some((QMatvecConfig { wg, tpr, dp4: a_dp4, prefetch: false, ..cfg }, b_dp4));
    }
    if cfg.dp4 {
        // (a whole row staged: no chunks, no prefetch, one token)
        let whole = cfg.tok == 1 && !cfg.prefetch && dp4(a, cfg.wg);
        return (whole && dp4(b, cfg.wg)).then_some((cfg, true));
    }
    let wg = gpu.tuning().mix_float_wg();
    if !dp4(b, wg) || wg % cfg.tpr != 0 {
        return Some((cfg, dp4(b, cfg.wg)));
    }
    Some((QMatvecConfig { wg, ..cfg }, true))
}

/// Records `y (+)= input(x) · [A; B]ᵀ (+ bias)` for one token in one dispatch (`MIX` in
/// wgsl/matvec_quant.wgsl): `a` writes columns 0 .. N_A of y, `b` columns `col` = N_A .. N,
/// where y is `[1, N]` (row stride `opts.ld_out`) and the bias `[N]`. Each weight's columns are
/// the sums of its float or DP4 path ([`mix_config`]) in the dispatch's workgroup shape: those of
/// [`linear_quant_in`] for that weight alone in that shape ([`mixes`] says when it applies).
#[allow(clippy::too_many_arguments)]
pub fn matvec_quant_mixed(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    a: &QuantWeight,
    b: (&QuantWeight, usize),
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    let [na, k] = a.shape;
    let sa = LinearShape { t: 1, n: na, k, ld_out: na, cols: na };
    let (cfg, b_dp4) = mix_config(gpu, a.dtype, b.0.dtype, &sa, input).expect("mixes");
    matvec_quant_mixed_with(gpu, x, input, a, b, bias, y, opts, cfg, b_dp4)
}

/// [`matvec_quant_mixed`] with its configuration given.
#[allow(clippy::too_many_arguments)]
fn matvec_quant_mixed_with(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    a: &QuantWeight,
    (b, col): (&QuantWeight, usize),
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
    cfg: QMatvecConfig,
    b_dp4: bool,
) -> Result<Kernel> {
    let [na, k] = a.shape;
    let nb = b.shape[0];
    assert!(col == na && b.shape[1] == k, "linear_quant_mixed: parts {:?} at 0 and {:?} at {col}", a.shape, b.shape);
    let s = check_operands("linear_quant_mixed", &input.checked_x(x, k), na + nb, k, bias, y, opts);
    assert!(mixes(gpu, a, b, s.t, input, &opts), "linear_quant_mixed: {} + {} at {s:?} ({input:?})", a.dtype, b.dtype);
    assert!(cfg.tpr.is_power_of_two() && cfg.wg % cfg.tpr == 0 && cfg.tpr >= 8, "{cfg:?}");
    assert!(!b_dp4 || stages_whole(gpu, b.dtype, k, cfg.wg), "linear_quant_mixed: {} DP4 at K = {k}", b.dtype);
    let sa = LinearShape { n: na, cols: na, ..s };
    let params = matvec_quant_params(gpu, "matvec_quant.params", &input, a, &sa, None);
    let mut bindings = quant_bindings(gpu, a, x, y, &s, &params, bias);
    bindings.extend(input.binding(k));
    let rows_per_wg = 4 * cfg.wg / cfg.tpr;
    let wg0 = (na as u32).div_ceil(rows_per_wg);
    let units_b = (k / unit_elems(b.dtype)) as u32;
    let pb = gpu.uniform("matvec_quant.mix", &[wg0, nb as u32, units_b, col as u32, b.planes[0], b.planes[1], 0, 0]);
    let mb = bindings.len();
    let mut macros = cfg
        .macros(gpu, a.dtype, input, bias.is_some(), &opts)
        .flag("MIX")
        .flag(&format!("MIX_{}", type_flag(b.dtype)))
        .set("MB", mb)
        .set("MB1", mb + 1)
        .set("MB2", mb + 2);
    // DP4 for the second weight, and the first unless MIX_FLOAT_A (never the first alone).
    assert!(!cfg.dp4 || b_dp4, "linear_quant_mixed: DP4 for {} but not {}", a.dtype, b.dtype);
    if b_dp4 {
        macros = macros
            .flag("DP4")
            .flag_if("MIX_FLOAT_A", !cfg.dp4)
            .set("KC", k / 32)
            .flag_if("STAGE8", cfg.subgroups && gpu.caps.shuffles8());
    }
    bindings.extend([b.buffer.as_entire_binding(), b.buffer.as_entire_binding(), pb.as_entire_binding()]);
    let [gx, gy, _] = grid(wg0 + (nb as u32).div_ceil(rows_per_wg));
    gpu.kernel("matvec_quant", "main", &macros, &bindings, [gx, gy, 1])
}

/// The uniform of both quantized matvecs (`Params`, wgsl/include/matvec_quant_params.wgsl): the
/// shape, W's planes, the fused input and the routing.
fn matvec_quant_params(
    gpu: &Gpu,
    label: &str,
    input: &Input<'_>,
    w: &QuantWeight,
    s: &LinearShape,
    route: Option<&super::Route<'_>>,
) -> wgpu::Buffer {
    let units = s.k / unit_elems(w.dtype);
    gpu.uniform(
        label,
        &[
            s.n as u32,
            units as u32,
            s.t as u32,
            s.ld_out as u32,
            (s.k / 4) as u32,
            w.planes[0],
            w.planes[1],
            route.map_or(0, |r| r.experts),
            (input.x_cols(s.k) / 4) as u32,
            (s.k / 4) as u32,
            input.eps().to_bits(),
            route.map_or(0, |r| r.slots_per_row),
        ],
    )
}

/// The bindings the quantized kernels that read both views of W share, in order: W's 16-byte
/// and word views (wgsl/include/quant_views.wgsl), x, y, the uniform, then the bias where there
/// is one.
fn quant_bindings<'a>(
    gpu: &Gpu,
    w: &'a QuantWeight,
    x: &'a Tensor,
    y: &'a Tensor,
    s: &LinearShape,
    params: &'a wgpu::Buffer,
    bias: Option<&'a Tensor>,
) -> Vec<wgpu::BindingResource<'a>> {
    let mut bindings = vec![
        w.buffer.as_entire_binding(),
        w.buffer.as_entire_binding(),
        x.binding(),
        out_binding(gpu, y, s),
        params.as_entire_binding(),
    ];
    bindings.extend(bias.map(Tensor::binding));
    bindings
}

/// The uniform of both quantized matmuls (`Params`, wgsl/include/matmul_quant_params.wgsl).
fn matmul_quant_params(gpu: &Gpu, label: &str, w: &QuantWeight, s: &LinearShape) -> wgpu::Buffer {
    let bpr = s.k / kernel_block(w.dtype);
    gpu.uniform(label, &[s.t as u32, s.n as u32, s.k as u32, s.ld_out as u32, w.planes[0], w.planes[1], bpr as u32, 0])
}

/// Tokens a workgroup of `wgsl/matvec_quant_batch.wgsl` takes (the grid's z: groups of them).
const BATCH_TB: u32 = 8;

/// Rows of W a workgroup of `wgsl/matvec_quant_batch.wgsl` takes (its threads: RW · TB): 32 (a
/// subgroup's width on NVIDIA: a subgroup's rows share their x loads), or 16 where the grid would
/// have fewer than 264 workgroups (two an SM on the H100; `bench_quant_batch`, N = 1536 and 2048 at
/// 1-32 tokens: 16 rows 5-30 % faster than 32, and than 8 for Q6_K). The sums are the same
/// whatever RW, so the choice may depend on T.
fn batch_rows(n: usize, t: usize) -> u32 {
    let groups = (t as u32).div_ceil(BATCH_TB);
    if (n as u32).div_ceil(32) * groups >= 264 {
        32
    } else {
        16
    }
}

/// Records a batch step's projection (`LinearOpts::batch`, up to [`MATVEC_MAX_T`] tokens) with
/// `wgsl/matvec_quant_batch.wgsl`: each unit of W dequantized once for 8 tokens, the tokens' x in
/// workgroup memory; a token's sums do not depend on the batch (its size, the token's row, the
/// others). With `grouped` (the route, the groups table and its tiles) the tokens are the slots
/// of an expert projection grouped by expert ([`matvec_experts_quant`] with its groups), a tile a
/// workgroup.
#[allow(clippy::too_many_arguments)]
fn matvec_quant_batch(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
    rw: u32,
    grouped: Option<(&super::Route<'_>, &Tensor, usize)>,
) -> Result<Kernel> {
    assert!(matches!(rw, 16 | 32), "matvec_quant_batch: {rw} rows a workgroup");
    let mut macros =
        type_macros(glu_macros(input.macros(common_macros(gpu, bias.is_some(), &opts)), opts.glu), w.dtype)
            .set("GB", if bias.is_some() { 6 } else { 5 })
            .set("WG", rw * BATCH_TB)
            .set("RW", rw)
            .set("TB", BATCH_TB);
    let params = matvec_quant_params(gpu, "matvec_quant_batch.params", &input, w, s, grouped.map(|g| g.0));
    let mut bindings = quant_bindings(gpu, w, x, y, s, &params, bias);
    bindings.extend(input.binding(s.k));
    let mut z = (s.t as u32).div_ceil(BATCH_TB);
    if let Some((_, groups, tiles)) = grouped {
        assert!(
            groups.ty == ElemType::U32 && groups.numel() >= s.t + 3 * tiles,
            "linear_experts: the groups table must be u32 of {} elements, got {:?} {:?}",
            s.t + 3 * tiles,
            groups.ty,
            groups.shape
        );
        macros = macros.flag("GROUPED").set("EB", bindings.len());
        bindings.push(groups.binding());
        z = tiles as u32;
    }
    let [gx, gy, _] = grid((s.n as u32).div_ceil(rw));
    gpu.kernel("matvec_quant_batch", "main", &macros, &bindings, [gx, gy, z])
}

/// Records the matmul on cooperative matrices (`wgsl/matmul_quant_coop.wgsl`: tensor cores,
/// x and W's values met as f16, f32 sums) where the device has them (`Caps::coop`).
fn matmul_quant_coop(
    gpu: &Gpu,
    x: &Tensor,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
) -> Result<Kernel> {
    matmul_quant_coop_flags(gpu, x, w, bias, y, s, opts, &[])
}

/// [`matmul_quant_coop`] with extra flags (the measurement probes of the tests).
#[allow(clippy::too_many_arguments)]
fn matmul_quant_coop_flags(
    gpu: &Gpu,
    x: &Tensor,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
    flags: &[&str],
) -> Result<Kernel> {
    assert!(gpu.caps.coop, "matmul_quant_coop on a device without cooperative matrices");
    let macros = flags.iter().fold(type_macros(common_macros(gpu, bias.is_some(), &opts), w.dtype), |m, f| m.flag(f));
    let params = matmul_quant_params(gpu, "matmul_quant_coop.params", w, s);
    let bindings = quant_bindings(gpu, w, x, y, s, &params, bias);
    let groups = [(s.n as u32).div_ceil(64), (s.t as u32).div_ceil(128), 1];
    gpu.kernel("matmul_quant_coop", "main", &macros, &bindings, groups)
}

#[allow(clippy::too_many_arguments)]
fn matmul_quant(
    gpu: &Gpu,
    x: &Tensor,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
    cfg: MatmulConfig,
) -> Result<Kernel> {
    let MatmulConfig { tile, bk } = cfg;
    // Staging: 2 runs of 4 k per thread and slice; a slice never straddles a block (K is whole
    // blocks of 32 or 256, and bk divides 32).
    assert!(matches!(tile, 4 | 8) && 16 * tile * bk / 4 == 2 * 256 && 32 % bk == 0);
    let macros = type_macros(common_macros(gpu, bias.is_some(), &opts), w.dtype)
        .set("TILE", tile)
        .flag_if("TILE8", tile == 8)
        .set("BK", bk);
    let params = matmul_quant_params(gpu, "matmul_quant.params", w, s);
    let mut bindings =
        vec![w.buffer.as_entire_binding(), x.binding(), out_binding(gpu, y, s), params.as_entire_binding()];
    if let Some(b) = bias {
        bindings.push(b.binding());
    }
    let groups = [(s.n as u32).div_ceil(16 * tile), (s.t as u32).div_ceil(16 * tile), 1];
    gpu.kernel("matmul_quant", "main", &macros, &bindings, groups)
}

pub mod cpu {
    use crate::dtype::{to_f32, DType};
    use crate::error::Result;

    /// `y (+)= x · Wᵀ (+ bias)` with x `[T, K]` and W `[N, K]` stored as `dtype` in `raw` (the
    /// file's bytes, rows of K elements), dequantized with [`to_f32`]; sums in f64
    /// ([`super::super::cpu::linear`]), so it serves as the exact reference.
    pub fn linear_quant(
        x: &[f32],
        dtype: DType,
        raw: &[u8],
        k: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<()> {
        let w = dequantize_rows(dtype, raw, k)?;
        super::super::cpu::linear(x, &w, k, bias, y, accumulate);
        Ok(())
    }

    /// `raw` (the file's bytes of whole rows of `k` elements in `dtype`) as f32, with [`to_f32`];
    /// an error where K is not a whole number of blocks.
    pub fn dequantize_rows(dtype: DType, raw: &[u8], k: usize) -> Result<Vec<f32>> {
        let row = dtype
            .byte_size(k)
            .filter(|&r| r > 0)
            .ok_or_else(|| crate::error::Error::Mismatch(format!("K = {k} is not a whole number of {dtype} blocks")))?;
        to_f32(dtype, raw, raw.len() / row * k)
    }

    /// [`linear_quant`] as the tensor-core matmul computes it (wgsl/matmul_quant_coop.wgsl): x
    /// and W's dequantized values rounded to f16 (nearest even) before they meet; sums in f64.
    pub fn linear_quant_f16(
        x: &[f32],
        dtype: DType,
        raw: &[u8],
        k: usize,
        bias: Option<&[f32]>,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<()> {
        let h = |v: f32| half::f16::from_f32(v).to_f32();
        let w: Vec<f32> = dequantize_rows(dtype, raw, k)?.into_iter().map(h).collect();
        let xh: Vec<f32> = x.iter().map(|&v| h(v)).collect();
        super::super::cpu::linear(&xh, &w, k, bias, y, accumulate);
        Ok(())
    }

    /// x as the DP4 matvec stages it (wgsl/matvec_quant.wgsl), for rows of `k` elements: per
    /// 32-element block with largest |x| of biased exponent E, scale d = 2^(E - 140) and each
    /// element round(x / d) · d (nearest, ties to even: |x / d| < 2^14, so 15 bits and a sign
    /// survive; the error is at most d / 2 ≤ 2^-14 of the block's largest |x|). Blocks under
    /// 2^-113 become 0; a block with a non-finite value becomes NaN. Exact in f32 (d is a power of
    /// two), so the kernel's integer sums over these values equal the reference's.
    pub fn stage_x16(x: &[f32], k: usize) -> Vec<f32> {
        assert!(k % 32 == 0);
        let mut out = Vec::with_capacity(x.len());
        for blk in x.chunks(32) {
            match block_scale(blk) {
                (_, d) if d.is_nan() => out.extend(blk.iter().map(|_| f32::NAN)),
                (inv, d) => out.extend(blk.iter().map(|v| (v * inv).round_ties_even() * d)),
            }
        }
        out
    }

    /// A block's (1 / d, d) from its largest |x|'s biased exponent E: d = 2^(E - 140); (0, 0)
    /// under 2^-113, (0, NaN) with a NaN or an infinity (include/stage_x16.wgsl `stage_scale`).
    fn block_scale(blk: &[f32]) -> (f32, f32) {
        match block_exponent(blk) {
            255 => (0.0, f32::NAN),
            0..14 => (0.0, 0.0),
            e => (f32::from_bits((267 - e) << 23), f32::from_bits((e - 13) << 23)),
        }
    }

    /// The biased exponent of a block's largest |x| (NaN and infinities: 255).
    pub(crate) fn block_exponent(blk: &[f32]) -> u32 {
        (blk.iter().fold(0u32, |m, v| m.max(v.abs().to_bits())) >> 23) & 0xFF
    }

    /// x staged as wgsl/quantize_x16.wgsl writes it, as u32 words: per 32-element block b of a
    /// row, the low bytes of its 16-bit values (elements 0..15 in words 20b .. 20b + 4, 16..31 in
    /// the next 4; byte i of a word is element 4w + i of the 16), their high bytes (two's
    /// complement) in the next 8 words, then the bits of d · Σ q over each half, of d, and 0;
    /// q = round(x / d) and d as [`stage_x16`] (so q · d is its output).
    pub fn quantize_x16(x: &[f32], k: usize) -> Vec<u32> {
        assert!(k % 32 == 0 && x.len() % k == 0);
        let mut out = Vec::with_capacity(x.len() / 32 * 20);
        for blk in x.chunks(32) {
            let (inv, d) = block_scale(blk);
            // round(NaN) converts to 0 on the GPU (WGSL's saturating float -> int); the NaN
            // scale makes the block's sums NaN either way.
            let q: Vec<i32> = blk.iter().map(|v| (v * inv).round_ties_even() as i32).collect();
            let byte = |v: i32, shift: u32| ((v as u32) >> shift) & 0xFF;
            let word = |i: usize, shift: u32| (0..4).map(|j| byte(q[i + j], shift) << (8 * j)).sum::<u32>();
            for shift in [0, 8] {
                out.extend((0..8).map(|w| word(4 * w, shift)));
            }
            let sum = |h: usize| q[16 * h..16 * h + 16].iter().sum::<i32>() as f32;
            out.extend([(d * sum(0)).to_bits(), (d * sum(1)).to_bits(), d.to_bits(), 0]);
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::dtype::to_f32;
    use crate::gpu::tensor::test_util::*;
    use half::f16;

    /// Every GGUF type, and the MLX affine types in both scale formats and three group sizes.
    pub(crate) const TYPES: [DType; 12] = [
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
    pub(crate) fn scale_field_offsets(t: DType) -> Vec<usize> {
        scale_fields(t).iter().map(|&(off, _)| off).collect()
    }

    /// Deterministic pseudo-random bytes (xorshift).
    fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 32) as u8
            })
            .collect()
    }

    /// `rows` random rows of `k` elements of type `t`: every byte random (quants, high bits,
    /// sub-block scales and mins), then each f16 scale set to a random finite value of either
    /// sign, magnitude in [0.5, 1] × the type's (never zero, never NaN; bf16 for the affine types
    /// that store their scales so).
    pub(crate) fn random_blocks(t: DType, rows: usize, k: usize, seed: u64) -> Vec<u8> {
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

    /// Per element, the magnitude of the terms a kernel sums for it: |w|, and where the type has a
    /// min (w = d·q + m, or d·scale·q - dmin·min) |d·q| + |m|, which can exceed |w| since a kernel
    /// sums d·Σq·x and m·Σx apart. Computed by dequantizing the blocks with the signs of the f16
    /// scales set so that both terms are positive (quants, scales and mins are >= 0 there).
    fn magnitudes(t: DType, raw: &[u8], n: usize) -> Vec<f32> {
        let mut m = raw.to_vec();
        let signs: &[(usize, bool)] = match t {
            DType::Q4_1 | DType::Q5_1 | DType::Affine { .. } => &[(0, false), (2, false)],
            DType::Q4_K | DType::Q5_K => &[(0, false), (2, true)],
            _ => &[],
        };
        for blk in m.chunks_exact_mut(t.block_bytes()) {
            for &(off, negative) in signs {
                blk[off + 1] = (blk[off + 1] & 0x7F) | if negative { 0x80 } else { 0 };
            }
        }
        to_f32(t, &m, n).unwrap().into_iter().map(f32::abs).collect()
    }

    /// Reference result and per-element tolerance of `y (+)= x·Wᵀ (+ bias)` for quantized W.
    ///
    /// Tolerance: the reference dequantizes with `to_f32` (exact: the kernels' dequantized values
    /// are the same floats, or products of the same exact factors) and sums in f64, so the error
    /// is the kernels' f32 rounding. Each f32 addition or product errs by at most eps = 2^-24 of
    /// its result, which is at most S = Σ_k |x_k| · m_k + |bias| + |y_old|, with m_k the magnitude
    /// of the terms summed for element k ([`magnitudes`]: matvec sums d · Σ q·x and m · Σ x per
    /// block, so |d q| + |m| bounds them). The kernels sum in various orders (per block, strided
    /// lanes, subgroup and tree reductions, k-slices) with errors of random sign, which grow like
    /// sqrt(K): we allow 4 · eps · sqrt(K) · S, as the f16 tests do. With K = 896 that is 1.2e-5 · S
    /// (S ~ K/4 ~ 220 for |x|, |w| ~ U(0, 1): 2.7e-3, against outputs of ~sqrt(K)/3 ~ 10), far
    /// below one term's typical size (~0.25): a dropped, doubled, misplaced or mis-scaled term,
    /// or a wrong sub-block scale, fails.
    pub(crate) fn reference(
        x: &[f32],
        t: DType,
        raw: &[u8],
        k: usize,
        bias: Option<&[f32]>,
        y0: &[f32],
        accumulate: bool,
    ) -> (Vec<f32>, Vec<f32>) {
        let mut want = y0.to_vec();
        cpu::linear_quant(x, t, raw, k, bias, &mut want, accumulate).unwrap();
        let n = raw.len() / t.byte_size(k).unwrap();
        let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
        let mut mag = abs(y0);
        let ab = bias.map(abs);
        super::super::cpu::linear(&abs(x), &magnitudes(t, raw, n * k), k, ab.as_deref(), &mut mag, accumulate);
        let eps = f32::EPSILON / 2.0;
        let tol = mag.iter().map(|m| 4.0 * eps * (k as f32).sqrt() * m).collect();
        (want, tol)
    }

    /// Asserts |got - want| <= tol elementwise (NaN fails); returns the worst error / tolerance.
    fn check(got: &[f32], want: &[f32], tol: &[f32], what: &str) -> f32 {
        assert_eq!(got.len(), want.len(), "{what}");
        let mut worst = 0.0f32;
        for (i, ((g, w), t)) in got.iter().zip(want).zip(tol).enumerate() {
            let d = (g - w).abs();
            assert!(d <= *t, "{what}: element {i}: got {g}, want {w} (|diff| {d} > tol {t})");
            worst = worst.max(d / t);
        }
        worst
    }

    /// Which kernel a case runs.
    #[derive(Clone, Copy, Debug)]
    enum Path {
        /// What `linear_quant` picks.
        Auto,
        /// matvec with the narrowest row group the device allows (lanes loop over several units).
        NarrowMatvec,
        /// matvec even for many tokens.
        Matvec,
        /// matvec with the float dot products (no DP4), one token.
        MatvecFloat,
        /// matvec with DP4 where the type and K allow it, whatever the size heuristics say.
        MatvecDp4,
        /// The tiled matmul with a given tile, even for few tokens.
        Matmul(MatmulConfig),
        /// matvec in workgroups of .0 threads of .1-lane row groups, DP4 (the row staged whole).
        Wide(u32, u32),
    }
    const TILE4: MatmulConfig = MatmulConfig { tile: 4, bk: 32 };
    const TILE8: MatmulConfig = MatmulConfig { tile: 8, bk: 16 };

    /// Runs one case on `gpu` against the CPU twin; returns the worst error / tolerance.
    #[allow(clippy::too_many_arguments)]
    fn run_case(
        gpu: &Gpu,
        ty: DType,
        t: usize,
        n: usize,
        k: usize,
        with_bias: bool,
        accumulate: bool,
        path: Path,
        seed: u64,
    ) -> f32 {
        let raw = random_blocks(ty, n, k, seed);
        let xv = random(t * k, seed + 1, 1.0);
        let bv = random(n, seed + 2, 1.0);
        let y0 = random(t * n, seed + 3, 1.0);
        let w = QuantWeight::new(gpu, "w", ty, [n, k], &raw).unwrap();
        let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
        let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
        let y = gpu.upload_f32("y", &[t, n], &y0).unwrap();
        let bias = with_bias.then_some(&b);
        let opts = LinearOpts { accumulate, ld_out: None, glu: None, batch: false, softcap: None };
        let s = check_operands("test", &x, n, k, bias, &y, opts);
        let kern = match path {
            Path::Auto => linear_quant(gpu, &x, &w, bias, &y, opts),
            Path::Matvec => {
                matvec_quant(gpu, &x, Input::Plain, &w, bias, &y, &s, opts, QMatvecConfig::new(gpu, ty, &s))
            }
            Path::MatvecFloat => {
                let c = QMatvecConfig { dp4: false, ..QMatvecConfig::new(gpu, ty, &s) };
                matvec_quant(gpu, &x, Input::Plain, &w, bias, &y, &s, opts, c)
            }
            Path::MatvecDp4 => {
                let auto = QMatvecConfig::new(gpu, ty, &s);
                let c = QMatvecConfig { dp4: dp4_fits(gpu, ty, k, auto.wg, auto.tok), ..auto };
                matvec_quant(gpu, &x, Input::Plain, &w, bias, &y, &s, opts, c)
            }
            Path::NarrowMatvec => {
                let auto = QMatvecConfig::new(gpu, ty, &s);
                let sg = if auto.subgroups { gpu.caps.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
                let tpr = (4 * auto.tok).max(8).max(sg);
                matvec_quant(gpu, &x, Input::Plain, &w, bias, &y, &s, opts, QMatvecConfig { tpr, ..auto })
            }
            Path::Matmul(cfg) => matmul_quant(gpu, &x, &w, bias, &y, &s, opts, cfg),
            Path::Wide(wg, tpr) => {
                assert!(stages_whole(gpu, ty, k, wg), "{ty} K = {k} does not stage whole at {wg} threads");
                let c = QMatvecConfig { wg, tpr, dp4: true, ..QMatvecConfig::new(gpu, ty, &s) };
                matvec_quant(gpu, &x, Input::Plain, &w, bias, &y, &s, opts, c)
            }
        }
        .unwrap();
        gpu.run(&[&kern]).unwrap();
        let got = gpu.read_f32(&y).unwrap();
        // The DP4 kernel meets x as staged (cpu::stage_x16).
        let dp4 = match path {
            Path::Auto | Path::Matvec | Path::NarrowMatvec => {
                (t <= MATVEC_MAX_T || !matches!(path, Path::Auto)) && QMatvecConfig::new(gpu, ty, &s).dp4
            }
            Path::MatvecDp4 => {
                let auto = QMatvecConfig::new(gpu, ty, &s);
                dp4_fits(gpu, ty, k, auto.wg, auto.tok)
            }
            Path::MatvecFloat | Path::Matmul(_) => false,
            Path::Wide(..) => true,
        };
        let xs = if dp4 { cpu::stage_x16(&xv, k) } else { xv.clone() };
        let (want, tol) = reference(&xs, ty, &raw, k, with_bias.then_some(&bv[..]), &y0, accumulate);
        let what = format!(
            "{ty} T={t} N={n} K={k} bias={with_bias} acc={accumulate} {path:?} dp4={dp4} f16={} sg={}",
            gpu.caps.f16, gpu.caps.subgroups
        );
        check(&got, &want, &tol, &what)
    }

    /// x as a one-token matvec meets it behind the fused RMSNorm (weight `g`, eps 1e-6), row by
    /// row of `k`: x ⊙ g, staged as 16-bit fixed point ([`cpu::stage_x16`]) where `staged` (DP4),
    /// times the row's 1 / rms (the kernel scales its sums by it at the end).
    pub(crate) fn norm_scaled_input(x: &[f32], g: &[f32], k: usize, staged: bool) -> Vec<f32> {
        let mut out = Vec::with_capacity(x.len());
        for row in x.chunks(k) {
            let xg: Vec<f32> = row.iter().zip(g).map(|(a, b)| a * b).collect();
            let r = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / k as f32 + 1e-6).sqrt();
            let xg = if staged { cpu::stage_x16(&xg, k) } else { xg };
            out.extend(xg.into_iter().map(|v| v * r));
        }
        out
    }

    /// The 16-bit staging's step d at each element of `x` ([`cpu::stage_x16`]: 2^(E - 140) for its
    /// 32-element block's largest |x| of biased exponent E; the smallest normal below the floor):
    /// what one rounding flip in the staging moves an element by.
    pub(crate) fn stage_steps16(x: &[f32]) -> Vec<f32> {
        x.chunks(32)
            .flat_map(|b| {
                let e = cpu::block_exponent(b);
                std::iter::repeat_n(f32::from_bits(e.saturating_sub(13).max(1) << 23), 32)
            })
            .collect()
    }

    /// Adds `per_term · S` to each output's tolerance, S = Σ_k |x_in · w| over its token row of
    /// `xin` and weight row of `wf`: a fused input's own relative rounding per term (8·eps for
    /// NORM, 16·eps for GATED; derived in `super::super::tests::fused_inputs_match_cpu_ops`).
    fn add_input_rounding(tol: &mut [f32], xin: &[f32], wf: &[f32], k: usize, per_term: f32) {
        let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
        let mut s_terms = vec![0f32; tol.len()];
        super::super::cpu::linear(&abs(xin), &abs(wf), k, None, &mut s_terms, false);
        tol.iter_mut().zip(&s_terms).for_each(|(tl, s)| *tl += per_term * s);
    }

    /// K values per type: not powers of two (Qwen2.5-0.5B's hidden size for the 32-element types;
    /// 1.5B's hidden and 0.5B's MLP sizes for the k-quants), and the MLP width 4864 for all.
    fn ks(t: DType) -> &'static [usize] {
        if t.block_size() < 256 {
            &[896, 4864]
        } else {
            &[1536, 4864]
        }
    }

    const EPILOGUES: [(bool, bool); 4] = [(false, false), (true, false), (false, true), (true, true)];

    /// A fused input (RMSNorm, gated activation) against the CPU ops run one after the other, for
    /// every type: the tolerance of `reference` for the CPU's input plus the fused op's own
    /// relative rounding per term (derived in `super::super::tests::fused_inputs_match_cpu_ops`:
    /// 8·eps·S for NORM, 16·eps·S for GATED, S = Σ_k |x_in · w|).
    #[test]
    fn quant_fused_inputs_match_cpu_ops() {
        use crate::model::config::Activation;
        use crate::ops::{elementwise, norm};
        let eps_f = f32::EPSILON / 2.0;
        for gpu in gpu_variants() {
            let mut seed = 900;
            for ty in TYPES {
                let k = ks(ty)[0];
                for (t, kind) in [(1, 0), (5, 1), (3, 2), (1, 1)] {
                    seed += 10;
                    let n = 70;
                    let gated = kind > 0;
                    let act = if kind == 2 { Activation::GeluTanhGated } else { Activation::SiluGated };
                    let raw = random_blocks(ty, n, k, seed);
                    let xv = random(t * k * if gated { 2 } else { 1 }, seed + 1, 1.0);
                    let gv: Vec<f32> = random(k, seed + 4, 0.5).into_iter().map(|v| 1.0 + v).collect();
                    let bv = random(n, seed + 2, 1.0);
                    let y0 = random(t * n, seed + 3, 1.0);
                    let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                    let x = gpu.upload_f32("x", &[t, xv.len() / t], &xv).unwrap();
                    let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                    let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
                    let y = gpu.upload_f32("y", &[t, n], &y0).unwrap();
                    let input = if gated { Input::Gated(act) } else { Input::Norm { weight: &g, eps: 1e-6 } };
                    let opts =
                        LinearOpts { accumulate: kind != 0, ld_out: None, glu: None, batch: false, softcap: None };
                    // T = 1: the DP4 kernel where the type allows it (kind 0, 1), else as picked.
                    let s = LinearShape { t, n, k, ld_out: n, cols: n };
                    let auto = QMatvecConfig::new(&gpu, ty, &s);
                    let dp4 =
                        if t == 1 { dp4_fits(&gpu, ty, k, auto.wg, 1) && (kind < 2 || auto.dp4) } else { auto.dp4 };
                    let kern = if t == 1 {
                        matvec_quant(&gpu, &x, input, &w, Some(&b), &y, &s, opts, QMatvecConfig { dp4, ..auto })
                    } else {
                        linear_quant_in(&gpu, &x, input, &w, Some(&b), &y, opts)
                    }
                    .unwrap();
                    gpu.run(&[&kern]).unwrap();
                    let got = gpu.read_f32(&y).unwrap();
                    let mut xin = vec![0f32; t * k];
                    if gated {
                        elementwise::cpu::gated_act(&xv, &mut xin, k, act);
                        if dp4 {
                            xin = cpu::stage_x16(&xin, k);
                        }
                    } else if dp4 {
                        // The kernel stages x ⊙ g and scales the sums by the norm's r at the end.
                        xin = norm_scaled_input(&xv, &gv, k, true);
                    } else {
                        norm::cpu::rms_norm(&xv, &gv, &mut xin, 1e-6, false);
                    }
                    let (want, mut tol) = reference(&xin, ty, &raw, k, Some(&bv[..]), &y0, kind != 0);
                    let wf = to_f32(ty, &raw, n * k).unwrap();
                    add_input_rounding(&mut tol, &xin, &wf, k, if gated { 16.0 } else { 8.0 } * eps_f);
                    if dp4 && gated {
                        // The kernel's activation may differ from the CPU's by an ulp, and move an
                        // element to the next staged step d (a flip costs d · |w|): allow 4.
                        let d = stage_steps16(&xin);
                        for (i, tl) in tol.iter_mut().enumerate() {
                            let (tok, r) = (i / n, i % n);
                            let row = &wf[r * k..(r + 1) * k];
                            let dt = &d[tok * k..(tok + 1) * k];
                            *tl += 4.0 * row.iter().zip(dt).fold(0f32, |m, (w, d)| m.max(w.abs() * d));
                        }
                    }
                    let what = format!("{ty} {input:?} T={t} K={k} f16={} sg={}", gpu.caps.f16, gpu.caps.subgroups);
                    check(&got, &want, &tol, &what);
                }
            }
        }
    }

    /// The tensor-core matmul (`wgsl/matmul_quant_coop.wgsl`) against its CPU twin
    /// (`cpu::linear_quant_f16`: x and W's values rounded to f16), every type, tails in T and N,
    /// bias and accumulation. Tolerance: the products of f16 values are exact in f32; each of the
    /// tensor cores' f32 additions errs by at most an ulp of a partial sum (rounding or
    /// truncation), so K · 2^-23 · S with S = Σ_k |x_k w_k| + |bias| + |y_old| bounds the error
    /// (K = 1536: 1.8e-4 · S, against a term's typical 0.25: a dropped, doubled or misplaced term
    /// fails). Needs cooperative matrices: lavapipe has none, so this runs on such a GPU (the H100:
    /// BENCHMARKS.md) and fails anywhere else rather than pass having checked nothing.
    #[test]
    #[ignore = "needs cooperative matrices (tensor cores): cargo test --release --lib coop_matmul_matches_cpu -- --ignored"]
    fn coop_matmul_matches_cpu() {
        let gpu = gpu();
        assert!(gpu.caps.coop, "{} has no cooperative matrices of 16 x 16 x 16 f16 -> f32", gpu.info.name);
        let mut seed = 13000;
        for ty in TYPES {
            for (t, n, with_bias, acc) in [(33, 70, true, false), (130, 150, false, true), (64, 64, false, false)] {
                seed += 10;
                let k = ks(ty)[0];
                let raw = random_blocks(ty, n, k, seed);
                let xv = random(t * k, seed + 1, 1.0);
                let bv = random(n, seed + 2, 1.0);
                let y0 = random(t * n, seed + 3, 1.0);
                let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
                let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
                let y = gpu.upload_f32("y", &[t, n], &y0).unwrap();
                let bias = with_bias.then_some(&b);
                let opts = LinearOpts { accumulate: acc, ..Default::default() };
                let s = check_operands("test", &x, n, k, bias, &y, opts);
                let kern = matmul_quant_coop(&gpu, &x, &w, bias, &y, &s, opts).unwrap();
                gpu.run(&[&kern]).unwrap();
                let got = gpu.read_f32(&y).unwrap();
                let mut want = y0.clone();
                let bias_v = with_bias.then_some(&bv[..]);
                cpu::linear_quant_f16(&xv, ty, &raw, k, bias_v, &mut want, acc).unwrap();
                let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
                let mut mag = abs(&y0);
                let ab = bias_v.map(abs);
                let m = magnitudes(ty, &raw, n * k);
                super::super::cpu::linear(&abs(&xv), &m, k, ab.as_deref(), &mut mag, acc);
                let tol: Vec<f32> = mag.iter().map(|s| k as f32 * f32::EPSILON * s).collect();
                check(&got, &want, &tol, &format!("{ty} coop T={t} N={n} K={k} bias={with_bias} acc={acc}"));
            }
        }
    }

    /// The batch step's kernel (`wgsl/matvec_quant_batch.wgsl`) against the CPU, every type: 1-32
    /// tokens (token groups of 8 with a short last one), N not a multiple of the workgroup's rows,
    /// K with a short last chunk (Q6_K and the 32-element types at the second K), each fused input
    /// (plain, RMSNorm, gated activation), the GLU epilogue and bias / accumulation. Tolerances as
    /// `quant_fused_inputs_match_cpu_ops` and `quant_glu_epilogue_matches_cpu`.
    #[test]
    fn batch_kernel_matches_cpu() {
        use crate::model::config::Activation;
        use crate::ops::elementwise;
        let eps_f = f32::EPSILON / 2.0;
        for gpu in gpu_variants() {
            let mut seed = 11000;
            for ty in TYPES {
                // (tokens, input: 0 plain, 1 norm, 2 gated, GLU, bias, accumulate, which K)
                for (t, kind, glu, with_bias, acc, ki) in [
                    (1, 0, false, true, true, 0),
                    (5, 1, true, false, false, 0),
                    (13, 2, false, false, true, 1),
                    (32, 1, false, true, false, 1),
                    (9, 0, true, false, false, 1),
                ] {
                    seed += 10;
                    let (n, k) = (2 * 37, ks(ty)[ki]);
                    let act = Activation::SiluGated;
                    let raw = random_blocks(ty, n, k, seed);
                    let xv = random(t * k * if kind == 2 { 2 } else { 1 }, seed + 1, 1.0);
                    let gv: Vec<f32> = random(k, seed + 4, 0.5).into_iter().map(|v| 1.0 + v).collect();
                    let bv = random(n, seed + 2, 1.0);
                    let cols = if glu { n / 2 } else { n };
                    let y0 = random(t * cols, seed + 3, 1.0);
                    let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                    let x = gpu.upload_f32("x", &[t, xv.len() / t], &xv).unwrap();
                    let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                    let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
                    let y = gpu.upload_f32("y", &[t, cols], &y0).unwrap();
                    let input = match kind {
                        0 => Input::Plain,
                        1 => Input::Norm { weight: &g, eps: 1e-6 },
                        _ => Input::Gated(act),
                    };
                    let opts =
                        LinearOpts { accumulate: acc, glu: glu.then_some(act), batch: true, ..Default::default() };
                    let kern = linear_quant_in(&gpu, &x, input, &w, with_bias.then_some(&b), &y, opts).unwrap();
                    gpu.run(&[&kern]).unwrap();
                    let got = gpu.read_f32(&y).unwrap();
                    // The projection's input, as the CPU ops make it.
                    let mut xin = vec![0f32; t * k];
                    match kind {
                        0 => xin.copy_from_slice(&xv),
                        1 => crate::ops::norm::cpu::rms_norm(&xv, &gv, &mut xin, 1e-6, false),
                        _ => elementwise::cpu::gated_act(&xv, &mut xin, k, act),
                    }
                    let bias = with_bias.then_some(&bv[..]);
                    let what = format!("{ty} batch T={t} K={k} input={kind} glu={glu} bias={with_bias} acc={acc}");
                    if glu {
                        // The pair's sums (no bias / accumulation under GLU here), then act(g) · u.
                        assert!(!with_bias && !acc);
                        let (want, mut tol) = reference(&xin, ty, &raw, k, None, &vec![0.0; t * n], false);
                        if kind > 0 {
                            let wf = to_f32(ty, &raw, n * k).unwrap();
                            add_input_rounding(&mut tol, &xin, &wf, k, if kind == 2 { 16.0 } else { 8.0 } * eps_f);
                        }
                        let (want, tol) = glu_expected(&want, &tol, act);
                        check(&got, &want, &tol, &what);
                    } else {
                        let (want, mut tol) = reference(&xin, ty, &raw, k, bias, &y0, acc);
                        if kind > 0 {
                            let wf = to_f32(ty, &raw, n * k).unwrap();
                            add_input_rounding(&mut tol, &xin, &wf, k, if kind == 2 { 16.0 } else { 8.0 } * eps_f);
                        }
                        check(&got, &want, &tol, &what);
                    }
                }
            }
        }
    }

    /// `LinearOpts::batch`: a token's row of y is bit for bit the same alone and in a batch of 3,
    /// 5, 13 or 32 tokens, in whatever row of it, with 16 or 32 rows a workgroup (every type,
    /// plain and with the fused norm), and matches the CPU.
    #[test]
    fn batch_rows_do_not_depend_on_the_batch_size() {
        let gpu = gpu();
        for (i, ty) in TYPES.into_iter().enumerate() {
            let (n, k) = (72, ks(ty)[0]);
            let seed = 5000 + 10 * i as u64;
            let raw = random_blocks(ty, n, k, seed);
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
            let xv = random(32 * k, seed + 1, 1.0);
            let gv: Vec<f32> = random(k, seed + 2, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let g = gpu.upload_f32("g", &[k], &gv).unwrap();
            for norm in [false, true] {
                let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
                // (rw: the batch kernel's rows a workgroup, forced; None: as linear_quant picks)
                let rows = |xs: &[f32], t: usize, rw: Option<u32>| {
                    let x = gpu.upload_f32("x", &[t, k], xs).unwrap();
                    let y = gpu.empty("y", &[t, n], ElemType::F32).unwrap();
                    let opts = LinearOpts { batch: true, ..Default::default() };
                    let kern = match rw {
                        None => linear_quant_in(&gpu, &x, input, &w, None, &y, opts),
                        Some(rw) => {
                            let s = check_operands("test", &x, n, k, None, &y, opts);
                            matvec_quant_batch(&gpu, &x, input, &w, None, &y, &s, opts, rw, None)
                        }
                    };
                    gpu.run(&[&kern.unwrap()]).unwrap();
                    gpu.read_f32(&y).unwrap()
                };
                // Every token alone, then in batches of 3, 5, 13 and 32, the 32 also in reverse
                // order (each token in another row, beside other tokens), with each workgroup
                // height.
                let alone: Vec<Vec<f32>> = (0..32).map(|j| rows(&xv[j * k..(j + 1) * k], 1, None)).collect();
                let reversed: Vec<f32> = xv.chunks(k).rev().flatten().copied().collect();
                for (t, rev, rw) in [
                    (3, false, None),
                    (5, false, Some(32)),
                    (13, false, Some(16)),
                    (32, false, None),
                    (32, true, Some(32)),
                ] {
                    let many = rows(if rev { &reversed[..] } else { &xv[..t * k] }, t, rw);
                    for (j, row) in many.chunks(n).enumerate() {
                        let tok = if rev { t - 1 - j } else { j };
                        let same = alone[tok].iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(
                            same,
                            "{ty} norm={norm} rw={rw:?}: token {tok} in row {j} of a batch of {t} differs from alone"
                        );
                    }
                }
                if !norm {
                    let (want, tol) = reference(&xv[..k], ty, &raw, k, None, &vec![0.0; n], false);
                    check(&alone[0], &want, &tol, &format!("{ty} batch of 1"));
                }
            }
        }
    }

    /// The GLU epilogue (`LinearOpts::glu`): y[t, j] = act(g) · u from the pair (g, u) = outputs
    /// (2j, 2j + 1) of the plain projection, against the CPU: the pair's tolerances (tol_g,
    /// tol_u from `reference`) propagate as |act'| · tol_g · |u| + |act(g)| · tol_u (|act'| <=
    /// 1.13 for SiLU and GELU-tanh), plus the activation's own relative error (2e-5, see
    /// elementwise's tests) and the product's rounding.
    pub(crate) fn glu_expected(
        want: &[f32],
        tol: &[f32],
        act: crate::model::config::Activation,
    ) -> (Vec<f32>, Vec<f32>) {
        use crate::model::config::Activation;
        use crate::ops::elementwise::cpu::{gelu_tanh, silu};
        let a = match act {
            Activation::SiluGated => silu,
            Activation::GeluTanhGated => gelu_tanh,
        };
        want.chunks(2)
            .zip(tol.chunks(2))
            .map(|(w, t)| {
                let (g, u) = (w[0], w[1]);
                let v = a(g) * u;
                (v, 1.13 * t[0] * u.abs() + a(g).abs() * t[1] + t[0] * t[1] + 3e-5 * v.abs())
            })
            .unzip()
    }

    #[test]
    fn quant_glu_epilogue_matches_cpu() {
        use crate::model::config::Activation;
        for gpu in gpu_variants() {
            let mut seed = 7000;
            for ty in TYPES {
                let k = ks(ty)[0];
                for (t, act, norm, dp4) in [
                    (1, Activation::SiluGated, false, false),
                    (1, Activation::SiluGated, true, true),
                    (1, Activation::GeluTanhGated, true, false),
                    (3, Activation::SiluGated, true, false),
                    (5, Activation::SiluGated, true, true),
                ] {
                    seed += 10;
                    let n = 2 * 36;
                    let raw = random_blocks(ty, n, k, seed);
                    let xv = random(t * k, seed + 1, 1.0);
                    let gv: Vec<f32> = random(k, seed + 4, 0.5).into_iter().map(|v| 1.0 + v).collect();
                    let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                    let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
                    let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                    let y = gpu.upload_f32("y", &[t, n / 2], &random(t * n / 2, seed + 3, 1.0)).unwrap();
                    let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
                    let opts = LinearOpts { glu: Some(act), ..Default::default() };
                    let s = LinearShape { t, n, k, ld_out: n / 2, cols: n / 2 };
                    let auto = QMatvecConfig::new(&gpu, ty, &s);
                    let dp4 = dp4 && dp4_fits(&gpu, ty, k, auto.wg, auto.tok);
                    let kern = matvec_quant(&gpu, &x, input, &w, None, &y, &s, opts, QMatvecConfig { dp4, ..auto });
                    gpu.run(&[&kern.unwrap()]).unwrap();
                    let got = gpu.read_f32(&y).unwrap();
                    // The projection's input as the kernel meets it (see quant_fused_inputs_match_cpu_ops).
                    let xin: Vec<f32> = if norm {
                        norm_scaled_input(&xv, &gv, k, dp4)
                    } else if dp4 {
                        cpu::stage_x16(&xv, k)
                    } else {
                        xv.clone()
                    };
                    let (want, mut tol) = reference(&xin, ty, &raw, k, None, &vec![0.0; t * n], false);
                    if norm {
                        // The norm's own rounding (8 eps S, as in quant_fused_inputs_match_cpu_ops).
                        let wf = to_f32(ty, &raw, n * k).unwrap();
                        add_input_rounding(&mut tol, &xin, &wf, k, 8.0 * f32::EPSILON / 2.0);
                    }
                    let (want, tol) = glu_expected(&want, &tol, act);
                    let what = format!("{ty} GLU {act:?} norm={norm} dp4={dp4} T={t} K={k} sg={}", gpu.caps.subgroups);
                    check(&got, &want, &tol, &what);
                }
            }
        }
    }

    /// Two weights of different types in one dispatch (`matvec_quant_mixed`, the q/k/v of a
    /// Q4_K_M file): each part's columns against the CPU reference of that weight alone, through
    /// the fused norm or plain x, with a bias and accumulation, row counts off the row groups.
    #[test]
    fn quant_mixed_matvec_matches_cpu() {
        use crate::ops::norm;
        let eps_f = f32::EPSILON / 2.0;
        let pairs = [
            (DType::Q4_K, DType::Q6_K),
            (DType::Q4_0, DType::Q4_1),
            (DType::Q8_0, DType::Q5_0),
            (DType::Q5_0, DType::Q5_1),
            (DType::Q4_1, DType::Q8_0),
            (DType::Q5_K, DType::Q4_K),
            (DType::Q4_K, DType::Q5_K),
        ];
        let (mut mixed, mut dp4_runs) = (0, 0);
        for gpu in gpu_variants() {
            let mut seed = 8100;
            for (i, &(ta, tb)) in pairs.iter().enumerate() {
                let k = if ta.block_size() == 256 || tb.block_size() == 256 { 1536 } else { 896 };
                let (na, nb) = (70, 36);
                let n = na + nb;
                for norm in [true, false] {
                    seed += 10;
                    let acc = (i % 2 == 0) != norm;
                    let (ra, rb) = (random_blocks(ta, na, k, seed), random_blocks(tb, nb, k, seed + 1));
                    let xv = random(k, seed + 2, 1.0);
                    let gv: Vec<f32> = random(k, seed + 3, 0.5).into_iter().map(|v| 1.0 + v).collect();
                    let bv = random(n, seed + 4, 1.0);
                    let y0 = random(n, seed + 5, 1.0);
                    let wa = QuantWeight::new(&gpu, "a", ta, [na, k], &ra).unwrap();
                    let wb = QuantWeight::new(&gpu, "b", tb, [nb, k], &rb).unwrap();
                    let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
                    let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                    let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
                    let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
                    let opts = LinearOpts { accumulate: acc, ..Default::default() };
                    if !mixes(&gpu, &wa, &wb, 1, input, &opts) {
                        continue;
                    }
                    let sa = LinearShape { t: 1, n: na, k, ld_out: na, cols: na };
                    let (cfg, auto_dp4) = mix_config(&gpu, ta, tb, &sa, input).unwrap();
                    // As configured (B's integer dot products where its type has them), both
                    // weights' float paths, and both DP4 where both types have it.
                    let whole = |t: DType| has_dp4(t) && stages_whole(&gpu, t, k, cfg.wg);
                    let mut modes = vec![(cfg.dp4, auto_dp4), (false, false)];
                    if whole(ta) && whole(tb) {
                        modes.push((true, true));
                    }
                    for (a_dp4, b_dp4) in modes {
                        mixed += 1;
                        let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
                        let (bm, ym, c) = (Some(&b), &y, QMatvecConfig { dp4: a_dp4, ..cfg });
                        let kern =
                            matvec_quant_mixed_with(&gpu, &x, input, &wa, (&wb, na), bm, ym, opts, c, b_dp4).unwrap();
                        gpu.run(&[&kern]).unwrap();
                        let got = gpu.read_f32(&y).unwrap();
                        // x as a part meets it: normalized, or (DP4) x ⊙ g staged, then r.
                        let mut xin = xv.clone();
                        if norm {
                            norm::cpu::rms_norm(&xv, &gv, &mut xin, 1e-6, false);
                        }
                        let staged: Vec<f32> =
                            if norm { norm_scaled_input(&xv, &gv, k, true) } else { cpu::stage_x16(&xv, k) };
                        let (xa, xb) = (if a_dp4 { &staged } else { &xin }, if b_dp4 { &staged } else { &xin });
                        for (ty, raw, c0, c1, xp) in [(ta, &ra, 0, na, xa), (tb, &rb, na, n, xb)] {
                            let (want, mut tol) = reference(xp, ty, raw, k, Some(&bv[c0..c1]), &y0[c0..c1], acc);
                            if norm {
                                let wf = to_f32(ty, raw, (c1 - c0) * k).unwrap();
                                add_input_rounding(&mut tol, xp, &wf, k, 8.0 * eps_f);
                            }
                            let what = format!(
                                "{ta} + {tb}: the {ty} part, norm={norm} acc={acc} dp4={a_dp4}/{b_dp4} sg={}",
                                gpu.caps.subgroups
                            );
                            check(&got[c0..c1], &want, &tol, &what);
                        }
                        dp4_runs += usize::from(b_dp4) + usize::from(a_dp4);
                    }
                }
            }
        }
        // The q/k/v form it is for mixes everywhere (Q4_K q/k with the norm fused, Q6_K v).
        assert!(
            mixed >= 4 * gpu_variants().len() && dp4_runs >= 2,
            "only {mixed} mixed dispatches ran, {dp4_runs} DP4"
        );
        let gpu = &gpu_variants()[0];
        let (wa, wb) = (
            QuantWeight::new(gpu, "a", DType::Q4_K, [1792, 1536], &random_blocks(DType::Q4_K, 1792, 1536, 1)).unwrap(),
            QuantWeight::new(gpu, "b", DType::Q6_K, [256, 1536], &random_blocks(DType::Q6_K, 256, 1536, 2)).unwrap(),
        );
        let g = gpu.upload_f32("g", &[1536], &random(1536, 3, 1.0)).unwrap();
        let input = Input::Norm { weight: &g, eps: 1e-6 };
        assert!(mixes(gpu, &wa, &wb, 1, input, &LinearOpts::default()), "Qwen2.5-1.5B's q/k/v");
        // Rows of 2048 (Qwen3.5-35B-A3B's attention) stay two dispatches.
        let (wa, wb) = (
            QuantWeight::new(gpu, "a", DType::Q4_K, [64, 2048], &random_blocks(DType::Q4_K, 64, 2048, 4)).unwrap(),
            QuantWeight::new(gpu, "b", DType::Q6_K, [32, 2048], &random_blocks(DType::Q6_K, 32, 2048, 5)).unwrap(),
        );
        assert!(!mixes(gpu, &wa, &wb, 1, Input::Plain, &LinearOpts::default()), "rows of 2048");
    }

    /// The wide one-token DP4 configurations the H100 rules pick (Q6_K down projections: 512
    /// threads of 128 lanes; Q4_K rows of 1536: 256 threads of 64 lanes), at rows that stage
    /// whole here.
    #[test]
    fn quant_matvec_wide_workgroups_match_cpu() {
        let mut ran = 0;
        for gpu in gpu_variants() {
            for (i, (ty, wg, tpr)) in
                [(DType::Q6_K, 512, 128), (DType::Q4_K, 256, 64), (DType::Q6_K, 256, 64)].into_iter().enumerate()
            {
                // (a device that takes fewer threads, or stages less, never picks the shape)
                if gpu.limits.max_compute_invocations_per_workgroup < wg || !stages_whole(&gpu, ty, 1536, wg) {
                    continue;
                }
                for (n, bias, acc) in [(70, true, false), (1536 + 4, false, true)] {
                    run_case(&gpu, ty, 1, n, 1536, bias, acc, Path::Wide(wg, tpr), 9100 + i as u64 + n as u64);
                    ran += 1;
                }
            }
        }
        // lavapipe (1024 threads, 32 KiB) takes all three.
        assert!(ran >= 6, "only {ran} wide cases ran");
    }

    #[test]
    fn quant_matvec_matches_cpu() {
        let mut worst = 0.0f32;
        for gpu in gpu_variants() {
            let mut seed = 100;
            for ty in TYPES {
                for &k in ks(ty) {
                    for (i, t) in [1usize, 3, 32].into_iter().enumerate() {
                        // T = 1: every epilogue; otherwise one each, in turn.
                        let epis = if t == 1 { &EPILOGUES[..] } else { &EPILOGUES[(i + k / 32) % 4..][..1] };
                        for &(with_bias, acc) in epis {
                            seed += 10;
                            worst = worst.max(run_case(&gpu, ty, t, 70, k, with_bias, acc, Path::Auto, seed));
                        }
                    }
                    // Lanes looping over several units of each row; the float path where DP4 is the
                    // default.
                    seed += 10;
                    worst = worst.max(run_case(&gpu, ty, 1, 70, k, true, false, Path::NarrowMatvec, seed));
                    worst = worst.max(run_case(&gpu, ty, 1, 70, k, false, true, Path::MatvecFloat, seed + 7));
                    for (i, &(with_bias, acc)) in EPILOGUES.iter().enumerate() {
                        worst =
                            worst.max(run_case(&gpu, ty, 1, 70, k, with_bias, acc, Path::MatvecDp4, seed + i as u64));
                    }
                    worst = worst.max(run_case(&gpu, ty, 5, 70, k, false, true, Path::NarrowMatvec, seed + 5));
                    worst = worst.max(run_case(&gpu, ty, 5, 70, k, true, false, Path::MatvecFloat, seed + 9));
                }
            }
        }
        eprintln!("quant_matvec_matches_cpu: worst |error| / tolerance = {worst:.3}");
    }

    #[test]
    fn quant_matmul_matches_cpu() {
        let mut worst = 0.0f32;
        for gpu in gpu_variants() {
            let mut seed = 5000;
            for ty in TYPES {
                for &k in ks(ty) {
                    for (i, t) in [33usize, 100].into_iter().enumerate() {
                        let epis = if t == 33 && k < 2048 { &EPILOGUES[..] } else { &EPILOGUES[(i + k) % 4..][..1] };
                        for &(with_bias, acc) in epis {
                            seed += 10;
                            worst = worst.max(run_case(&gpu, ty, t, 70, k, with_bias, acc, Path::Auto, seed));
                        }
                    }
                }
                // The 128×128 tile, with sizes off its edges, and each kernel outside its T range.
                let k = ks(ty)[0];
                worst = worst.max(run_case(&gpu, ty, 130, 150, k, true, true, Path::Matmul(TILE8), 7));
                worst = worst.max(run_case(&gpu, ty, 2, 70, k, true, false, Path::Matmul(TILE4), 8));
                worst = worst.max(run_case(&gpu, ty, 37, 70, k, false, true, Path::Matvec, 9));
            }
        }
        eprintln!("quant_matmul_matches_cpu: worst |error| / tolerance = {worst:.3}");
    }

    #[test]
    fn quant_row_chunks_write_logit_views() {
        // An lm_head-like [V = 192, K] weight split into row chunks of 128 and 64 rows, each its
        // own QuantWeight, writing its columns of one [T, V] logits buffer through a view with
        // ld_out = V (T = 1 and 5: matvec; T = 40: matmul).
        for gpu in gpu_variants() {
            for (ty, k) in [(DType::Q6_K, 1536usize), (DType::Q8_0, 896), (DType::Q4_0, 896)] {
                for (t, accumulate) in [(1usize, false), (5, true), (40, false)] {
                    let v = 192;
                    let raw = random_blocks(ty, v, k, 11);
                    let row = ty.byte_size(k).unwrap();
                    let chunks =
                        QuantWeight::row_chunks_max(&gpu, "head", ty, [v, k], &raw, 128 * row as u64 + 48).unwrap();
                    let starts: Vec<(u32, usize)> = chunks.iter().map(|(r0, w)| (*r0, w.shape[0])).collect();
                    assert_eq!(starts, vec![(0, 128), (128, 64)], "{ty}");
                    let xv = random(t * k, 3, 1.0);
                    let y0 = random(t * v, 6, 1.0);
                    let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
                    let logits = gpu.upload_f32("logits", &[t, v], &y0).unwrap();
                    let mut keep = Vec::new();
                    for (r0, w) in &chunks {
                        let rows = w.shape[0];
                        let view = Tensor {
                            buffer: logits.buffer.clone(),
                            offset: logits.offset + 4 * *r0 as u64,
                            shape: vec![t, rows],
                            ty: ElemType::F32,
                        };
                        let opts = LinearOpts { accumulate, ld_out: Some(v), glu: None, batch: false, softcap: None };
                        keep.push(linear_quant(&gpu, &x, w, None, &view, opts).unwrap());
                    }
                    gpu.run(&keep.iter().collect::<Vec<_>>()).unwrap();
                    let got = gpu.read_f32(&logits).unwrap();
                    let (want, tol) = reference(&xv, ty, &raw, k, None, &y0, accumulate);
                    check(&got, &want, &tol, &format!("{ty} split T={t} acc={accumulate}"));
                }
            }
        }
    }

    #[test]
    fn quant_concat_rows_is_one_weight() {
        // [q; k; v] of one type uploaded as one weight: one dispatch computes all three.
        let gpu = gpu();
        for (ty, k) in [(DType::Q4_K, 1536usize), (DType::Q5_0, 896)] {
            let (q, kk, v) = (random_blocks(ty, 64, k, 1), random_blocks(ty, 32, k, 2), random_blocks(ty, 32, k, 3));
            let w = QuantWeight::concat_rows(&gpu, "qkv", ty, k, &[&q, &kk, &v]).unwrap();
            assert_eq!(w.shape, [128, k]);
            let raw = [q, kk, v].concat();
            for t in [1usize, 40] {
                let xv = random(t * k, 4, 1.0);
                let bv = random(128, 5, 1.0);
                let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
                let b = gpu.upload_f32("b", &[128], &bv).unwrap();
                let y = gpu.empty("y", &[t, 128], ElemType::F32).unwrap();
                let kern = linear_quant(&gpu, &x, &w, Some(&b), &y, LinearOpts::default()).unwrap();
                gpu.run(&[&kern]).unwrap();
                let (want, tol) = reference(&xv, ty, &raw, k, Some(&bv), &vec![0.0; t * 128], false);
                check(&gpu.read_f32(&y).unwrap(), &want, &tol, &format!("{ty} qkv T={t}"));
            }
        }
    }

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

    #[test]
    fn dp4_staging_edges() {
        // The DP4 matvec against the plain reference on x as cpu::stage_x16 stages it, with blocks
        // of zeros, of values under the staging's floor (2^-113), huge, and exactly on half-steps
        // (ties to even); and stage_x16 within its bound: |x - staged| <= 2^-14 · max |x| of the
        // block (blocks under the floor: 0).
        let gpu = gpu();
        let (n, k) = (70usize, 256usize);
        let mut xv = random(k, 11, 1.0);
        xv[..32].fill(0.0);
        xv[32..64].iter_mut().for_each(|v| *v *= 1e-35);
        xv[64..96].iter_mut().for_each(|v| *v *= 3e4);
        // Block 3: largest |x| 0.99, so d = 2^(126 - 140) = 2^-14, and x = ±(i + 0.5) · d are ties:
        // 0.5 d → 0, -1.5 d → -2 d, 2.5 d → 2 d, -3.5 d → -4 d.
        for (i, v) in xv[96..128].iter_mut().enumerate() {
            *v = (i as f32 + 0.5) * 2f32.powi(-14) * if i % 2 == 0 { 1.0 } else { -1.0 };
        }
        xv[127] = 0.99;
        let staged = cpu::stage_x16(&xv, k);
        for (b, (xb, sb)) in xv.chunks(32).zip(staged.chunks(32)).enumerate() {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (x, st) in xb.iter().zip(sb) {
                let floor = 2f32.powi(-113);
                assert!((x - st).abs() <= (amax * 2f32.powi(-14)).max(floor), "block {b}: {x} staged as {st}");
            }
        }
        assert!(staged[32..64].iter().all(|&v| v == 0.0));
        assert_eq!(&staged[96..100], &[0.0, -2f32.powi(-13), 2f32.powi(-13), -2f32.powi(-12)]);
        for ty in [DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K] {
            let raw = random_blocks(ty, n, k, 5);
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
            let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
            let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
            let opts = LinearOpts::default();
            let s = check_operands("test", &x, n, k, None, &y, opts);
            let cfg = QMatvecConfig::new(&gpu, ty, &s);
            assert!(cfg.dp4 || gpu.info.backend != wgpu::Backend::Vulkan, "{ty}: no DP4 on Vulkan");
            let kern = matvec_quant(&gpu, &x, Input::Plain, &w, None, &y, &s, opts, QMatvecConfig { dp4: true, ..cfg });
            gpu.run(&[&kern.unwrap()]).unwrap();
            let (want, tol) = reference(&staged, ty, &raw, k, None, &vec![0.0; n], false);
            check(&gpu.read_f32(&y).unwrap(), &want, &tol, &format!("{ty} DP4 edges"));
        }
    }

    /// PREFETCH (each unit's loads an iteration early) gives the plain loop's sums bit for bit
    /// (same sums, same order) for every DP4 type, with and without subgroups, rows of a few units
    /// per lane and of one (the last unit's loads clamped), plain and with the fused norm; the
    /// plain loop is held to the CPU by the other DP4 tests, and here once more.
    #[test]
    fn dp4_prefetch_keeps_the_sums() {
        for gpu in gpu_variants() {
            if gpu.info.backend != wgpu::Backend::Vulkan {
                panic!("DP4 runs on Vulkan only: this test needs lavapipe or a Vulkan GPU");
            }
            let dp4_types = TYPES.into_iter().filter(|&ty| has_dp4(ty));
            for (i, ty) in dp4_types.enumerate() {
                for (k, norm) in [(4864usize, false), (256, true)] {
                    let n = 70;
                    let seed = 500 + 10 * i as u64 + k as u64;
                    let raw = random_blocks(ty, n, k, seed);
                    let xv = random(k, seed + 1, 1.0);
                    let gv: Vec<f32> = random(k, seed + 2, 0.5).into_iter().map(|v| 1.0 + v).collect();
                    let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                    let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
                    let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                    let opts = LinearOpts::default();
                    let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
                    let s = LinearShape { t: 1, n, k, ld_out: n, cols: n };
                    let auto = QMatvecConfig::new(&gpu, ty, &s);
                    assert!(stages_whole(&gpu, ty, k, auto.wg), "{ty} K = {k}");
                    let mut outs = Vec::new();
                    for prefetch in [false, true] {
                        let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
                        let cfg = QMatvecConfig { dp4: true, prefetch, ..auto };
                        let kern = matvec_quant(&gpu, &x, input, &w, None, &y, &s, opts, cfg).unwrap();
                        assert_eq!(kern.variant.contains("PREFETCH"), prefetch);
                        gpu.run(&[&kern]).unwrap();
                        outs.push(gpu.read_f32(&y).unwrap());
                    }
                    let what = format!("{ty} K = {k} norm = {norm} sg = {}", gpu.caps.subgroups);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&outs[0]), bits(&outs[1]), "{what}: PREFETCH changed the sums");
                    if !norm {
                        let (want, tol) = reference(&cpu::stage_x16(&xv, k), ty, &raw, k, None, &vec![0.0; n], false);
                        check(&outs[1], &want, &tol, &what);
                    }
                }
            }
        }
    }

    /// quantize_x16 writes what its CPU twin writes, bit for bit: random rows whose blocks span
    /// magnitudes from 2^-130 (staged as 0) to 2^20, 3 tokens of 65 blocks (STAGE8's workgroups of
    /// eight blocks end in a partial one).
    #[test]
    fn quantize_x16_matches_cpu() {
        let (t, k) = (3, 2080);
        let mut xv = random(t * k, 77, 1.0);
        for (b, blk) in xv.chunks_mut(32).enumerate() {
            let scale = 2f32.powi((b % 31) as i32 * 5 - 130);
            blk.iter_mut().for_each(|v| *v *= scale);
        }
        let want = cpu::quantize_x16(&xv, k);
        // With subgroups (eight threads a block, STAGE8) and without (a thread a block).
        for gpu in gpu_variants() {
            let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
            let xs = gpu.empty("xs", &[staged_x_words(t, k)], ElemType::U32).unwrap();
            let kern = quantize_x16(&gpu, &x, &xs).unwrap();
            let eight = gpu.caps.shuffles8();
            assert_eq!(kern.variant.contains("STAGE8"), eight);
            gpu.run(&[&kern]).unwrap();
            let got = gpu.read_u32(&xs).unwrap();
            assert_eq!(got.len(), want.len());
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "STAGE8 = {eight}: word {i} (block {}, word {} of 20)", i / 20, i % 20);
            }
        }
        // The words say what stage_x16 says: q · d, element by element.
        let staged = cpu::stage_x16(&xv, k);
        for (b, words) in want.chunks(20).enumerate() {
            let d = f32::from_bits(words[18]);
            for e in 0..32 {
                let (w, byte) = ((e % 16) / 4 + 4 * (e / 16), 8 * (e % 4) as u32);
                let q = (((words[w] >> byte) & 0xFF) | (((words[8 + w] >> byte) & 0xFF) << 8)) as u16 as i16;
                assert_eq!(f32::from(q) * d, staged[32 * b + e], "block {b} element {e}");
            }
        }
    }

    /// The matvec on x staged apart (Input::Staged, XG) gives the DP4 kernel's sums bit for bit
    /// (rows that stage whole, the same row groups; with and without PREFETCH, workgroups of one
    /// and of several row groups), and on long rows matches the CPU on x as staged.
    #[test]
    fn staged_input_keeps_the_dp4_sums() {
        for gpu in gpu_variants() {
            if gpu.info.backend != wgpu::Backend::Vulkan {
                panic!("DP4 runs on Vulkan only: this test needs lavapipe or a Vulkan GPU");
            }
            let sg = if gpu.caps.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
            let dp4_types = TYPES.into_iter().filter(|&ty| has_dp4(ty));
            for (i, ty) in dp4_types.enumerate() {
                for k in [1536usize, 16384] {
                    let n = 70;
                    let seed = 900 + 10 * i as u64 + k as u64;
                    let raw = random_blocks(ty, n, k, seed);
                    let xv = random(k, seed + 1, 1.0);
                    let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                    let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
                    let xs = gpu.empty("xs", &[staged_x_words(1, k)], ElemType::U32).unwrap();
                    let stage = quantize_x16(&gpu, &x, &xs).unwrap();
                    let opts = LinearOpts::default();
                    let s = LinearShape { t: 1, n, k, ld_out: n, cols: n };
                    let auto = QMatvecConfig::new(&gpu, ty, &s);
                    let tpr = 32.max(sg);
                    let what = format!("{ty} K = {k} sg = {}", gpu.caps.subgroups);
                    let run = |cfg: QMatvecConfig, input: Input| {
                        let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
                        let kern = matvec_quant(&gpu, &x, input, &w, None, &y, &s, opts, cfg).unwrap();
                        assert_eq!(kern.variant.contains("XG"), matches!(input, Input::Staged(_)), "{what}");
                        gpu.run(&[&stage, &kern]).unwrap();
                        gpu.read_f32(&y).unwrap()
                    };
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    let mut outs = Vec::new();
                    for (wg, prefetch) in [(tpr, false), (tpr, true), (4 * tpr, false)] {
                        let cfg = QMatvecConfig { wg, tpr, tok: 1, dp4: true, prefetch, ..auto };
                        outs.push(run(cfg, Input::Staged(&xs)));
                    }
                    assert_eq!(bits(&outs[0]), bits(&outs[1]), "{what}: PREFETCH changed the sums");
                    assert_eq!(bits(&outs[0]), bits(&outs[2]), "{what}: the workgroup size changed the sums");
                    if stages_whole(&gpu, ty, k, 4 * tpr) {
                        let cfg = QMatvecConfig { wg: 4 * tpr, tpr, tok: 1, dp4: true, prefetch: false, ..auto };
                        assert_eq!(bits(&outs[0]), bits(&run(cfg, Input::Plain)), "{what}: not the DP4 kernel's sums");
                    }
                    let (want, tol) = reference(&cpu::stage_x16(&xv, k), ty, &raw, k, None, &vec![0.0; n], false);
                    check(&outs[0], &want, &tol, &what);
                    // The rule's own configuration (up to 128-lane row groups), with a bias and
                    // accumulating into y (the binding after the bias).
                    let cfg = QMatvecConfig::new(&gpu, ty, &s).for_input(&gpu, ty, &s, Input::Staged(&xs));
                    let (bias_v, y0) = (random(n, seed + 3, 0.5), random(n, seed + 4, 0.5));
                    let b = gpu.upload_f32("b", &[n], &bias_v).unwrap();
                    let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
                    let acc = LinearOpts { accumulate: true, ..opts };
                    let kern = matvec_quant(&gpu, &x, Input::Staged(&xs), &w, Some(&b), &y, &s, acc, cfg).unwrap();
                    gpu.run(&[&stage, &kern]).unwrap();
                    let (want, tol) = reference(&cpu::stage_x16(&xv, k), ty, &raw, k, Some(&bias_v), &y0, true);
                    check(&gpu.read_f32(&y).unwrap(), &want, &tol, &format!("{what}, the rule's {cfg:?}"));
                }
            }
        }
    }

    /// DP4 with the row staged a chunk at a time and with passes of 4 tokens: each token's row of
    /// y is bit for bit the same as with the whole row staged and with one token a pass (a lane
    /// meets its units in the same order), and matches the CPU on x as staged. Chunks of one
    /// super-block, the last one short (K = 896: 28 blocks in chunks of 8), with the fused norm.
    #[test]
    fn dp4_chunks_and_token_passes_keep_each_tokens_sums() {
        // With and without subgroups: the shuffle staging (STAGE8) and the thread-a-block one.
        for gpu in gpu_variants() {
            dp4_chunks_on(&gpu);
        }
    }

    fn dp4_chunks_on(gpu: &Gpu) {
        let gpu = gpu.clone();
        if gpu.info.backend != wgpu::Backend::Vulkan {
            panic!("DP4 runs on Vulkan only: this test needs lavapipe or a Vulkan GPU");
        }
        for (i, ty) in [DType::Q4_0, DType::Q4_1, DType::Q4_K, DType::Q6_K].into_iter().enumerate() {
            let (n, t) = (72, 5);
            let k = if ty.block_size() < 256 { 896 } else { 1536 };
            let seed = 8000 + 10 * i as u64;
            let raw = random_blocks(ty, n, k, seed);
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
            let xv = random(t * k, seed + 1, 1.0);
            let gv: Vec<f32> = random(k, seed + 2, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let g = gpu.upload_f32("g", &[k], &gv).unwrap();
            for norm in [false, true] {
                let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
                let s5 = LinearShape { t, n, k, ld_out: n, cols: n };
                let tok4 = QMatvecConfig { dp4: true, ..QMatvecConfig::new(&gpu, ty, &s5) };
                assert_eq!(tok4.tok, 4);
                let one = QMatvecConfig { tok: 1, tpr: tok4.tpr, wg: tok4.wg, ..tok4 };
                let run = |t: usize, cfg: QMatvecConfig| {
                    let x = gpu.upload_f32("x", &[t, k], &xv[..t * k]).unwrap();
                    let y = gpu.empty("y", &[t, n], ElemType::F32).unwrap();
                    let s = LinearShape { t, n, k, ld_out: n, cols: n };
                    let kern = matvec_quant(&gpu, &x, input, &w, None, &y, &s, LinearOpts::default(), cfg).unwrap();
                    gpu.run(&[&kern]).unwrap();
                    gpu.read_f32(&y).unwrap()
                };
                let whole = run(t, tok4);
                let chunked = run(t, QMatvecConfig { max_kc: 8, ..tok4 });
                assert!(dp4_chunk(&gpu, ty, k, tok4.wg, 4).unwrap() > 8, "{ty}: the whole row was chunked anyway");
                let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(bits(&whole, &chunked), "{ty} norm={norm}: chunks of 8 blocks change the sums");
                for (j, row) in whole.chunks(n).enumerate() {
                    let x1 = gpu.upload_f32("x", &[1, k], &xv[j * k..(j + 1) * k]).unwrap();
                    let y1 = gpu.empty("y", &[1, n], ElemType::F32).unwrap();
                    let s1 = LinearShape { t: 1, n, k, ld_out: n, cols: n };
                    for cfg in [one, QMatvecConfig { max_kc: 8, ..one }] {
                        let kern = matvec_quant(&gpu, &x1, input, &w, None, &y1, &s1, LinearOpts::default(), cfg);
                        gpu.run(&[&kern.unwrap()]).unwrap();
                        let alone = gpu.read_f32(&y1).unwrap();
                        assert!(bits(row, &alone), "{ty} norm={norm}: token {j} of 5 differs from one token a pass");
                    }
                }
                // Against the CPU on x as staged (with the norm: x ⊙ g staged, the sums scaled by r).
                let mut xin = Vec::with_capacity(t * k);
                for row in xv.chunks(k) {
                    if norm {
                        xin.extend(norm_scaled_input(row, &gv, k, true));
                    } else {
                        xin.extend(cpu::stage_x16(row, k));
                    }
                }
                let (want, mut tol) = reference(&xin, ty, &raw, k, None, &vec![0.0; t * n], false);
                if norm {
                    let wf = to_f32(ty, &raw, n * k).unwrap();
                    add_input_rounding(&mut tol, &xin, &wf, k, 8.0 * f32::EPSILON / 2.0);
                }
                check(&chunked, &want, &tol, &format!("{ty} norm={norm} DP4 chunks of 8, 4 tokens a pass"));
            }
        }
    }

    /// The one-token shapes measured inside a decode step (BENCHMARKS.md run 31) are the ones
    /// picked, on a Vulkan device with subgroups of at most 32 (lavapipe, the H100): (wg, tpr, dp4)
    /// for Qwen2.5's Q6_K down and v projections, SmolLM2's Q4_1 down, the Q4_K gate_up, and the
    /// Q4_K o projection (plain input only). Elsewhere no integer dot products.
    #[test]
    fn one_token_shapes_follow_the_step_measurements() {
        let gpu = gpu();
        let vulkan = gpu.info.backend == wgpu::Backend::Vulkan && gpu.caps.subgroup_max_size <= 32;
        let shape = |n: usize, k: usize| LinearShape { t: 1, n, k, ld_out: n, cols: n };
        let pick = |ty: DType, n: usize, k: usize| {
            let c = QMatvecConfig::new(&gpu, ty, &shape(n, k)).for_input(&gpu, ty, &shape(n, k), Input::Plain);
            (c.wg, c.tpr, c.dp4)
        };
        if !vulkan {
            for (ty, n, k) in [(DType::Q6_K, 1536, 8960), (DType::Q4_K, 1536, 1536)] {
                assert!(!pick(ty, n, k).2, "{ty} {n} x {k}: DP4 off Vulkan");
            }
            return;
        }
        // Q6_K rows of 8960: 512 threads where they stage whole there (the H100's 48 KiB, not 32).
        let w512 =
            gpu.limits.max_compute_invocations_per_workgroup >= 512 && stages_whole(&gpu, DType::Q6_K, 8960, 512);
        let down = if w512 { (512, 128, true) } else { (256, 64, true) };
        assert_eq!(pick(DType::Q6_K, 1536, 8960), down, "Qwen2.5-1.5B's Q6_K down");
        assert_eq!(pick(DType::Q6_K, 896, 4864), (256, 128, true), "Qwen2.5-0.5B's Q6_K down");
        assert_eq!(pick(DType::Q4_1, 576, 1536), (256, 64, true), "SmolLM2's Q4_1 down");
        assert_eq!(pick(DType::Q6_K, 256, 1536), (256, 32, true), "Qwen2.5-1.5B's Q6_K v");
        // Gemma-4-31B's Q4_K gate_up: 1024 threads where the row stages whole there (the H100's
        // 48 KiB; not lavapipe's 32), else 256; its o projection (5376 rows) stays at 256.
        let wide =
            gpu.limits.max_compute_invocations_per_workgroup >= 1024 && stages_whole(&gpu, DType::Q4_K, 5376, 1024);
        assert_eq!(pick(DType::Q4_K, 43008, 5376), (if wide { 1024 } else { 256 }, 32, true), "Gemma's gate_up");
        assert_eq!(pick(DType::Q4_K, 5376, 8192), (256, 32, true), "Gemma's o projection");
        // Gemma's wide DP4 rows load an iteration ahead; Qwen2.5's do not.
        let prefetch = |ty: DType, n: usize, k: usize| QMatvecConfig::new(&gpu, ty, &shape(n, k)).prefetch;
        assert!(prefetch(DType::Q4_K, 43008, 5376) && prefetch(DType::Q6_K, 262144, 5376), "Gemma's gate_up, lm_head");
        assert!(!prefetch(DType::Q4_K, 17920, 1536) && !prefetch(DType::Q6_K, 1536, 8960), "Qwen2.5-1.5B's");
        assert_eq!(pick(DType::Q4_K, 17920, 1536), (128, 32, true), "Qwen2.5-1.5B's gate_up");
        assert_eq!(pick(DType::Q4_K, 1536, 1536), (256, 64, true), "Qwen2.5-1.5B's o projection");
        assert_eq!(pick(DType::Q4_K, 896, 896), (128, 32, true), "Qwen2.5-0.5B's o projection");
        // Rows of 1536 through a fused norm likewise (the 1.5B's q/k/v); shorter ones keep their
        // float sums.
        let g = gpu.upload_f32("g", &[1536], &[1.0; 1536]).unwrap();
        let norm = Input::Norm { weight: &g, eps: 1e-6 };
        let normed = |n: usize, k: usize| {
            let c =
                QMatvecConfig::new(&gpu, DType::Q4_K, &shape(n, k)).for_input(&gpu, DType::Q4_K, &shape(n, k), norm);
            (c.wg, c.tpr, c.dp4)
        };
        assert_eq!(normed(2048, 1536), (256, 64, true), "Qwen2.5-1.5B's q/k/v with its norm fused");
        assert!(!normed(1152, 896).2, "Qwen2.5-0.5B-like q/k/v with its norm fused");
        // The 1.5B's q/k (Q4_K) and Q6_K v mix, both DP4 in the q/k's configuration; the 0.5B's
        // Q5_0 q/k and Q8_0 v, both float.
        assert_eq!(
            mix_config(&gpu, DType::Q4_K, DType::Q6_K, &shape(1792, 1536), norm).map(|(c, b)| (c.wg, c.tpr, c.dp4, b)),
            Some((256, 64, true, true))
        );
        assert_eq!(
            mix_config(&gpu, DType::Q5_0, DType::Q8_0, &shape(1024, 896), norm).map(|(c, b)| (c.dp4, b)),
            Some((false, false))
        );
    }

    #[test]
    fn quant_matvec_folded_grid() {
        // One row group (4 rows) per (small) workgroup: 65537 workgroups fold into a 2-D grid of
        // 32769 × 2, one of them padding.
        for gpu in gpu_variants() {
            let (n, k, ty) = (262_145usize, 32usize, DType::Q4_0);
            let raw = random_blocks(ty, n, k, 1);
            let xv = random(k, 2, 1.0);
            let y0 = random(n, 3, 1.0);
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
            let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
            let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
            let opts = LinearOpts { accumulate: true, ld_out: None, glu: None, batch: false, softcap: None };
            let s = check_operands("test", &x, n, k, None, &y, opts);
            let mut cfg = QMatvecConfig::new(&gpu, ty, &s);
            cfg.tpr = if cfg.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
            cfg.wg = cfg.tpr;
            let kern = matvec_quant(&gpu, &x, Input::Plain, &w, None, &y, &s, opts, cfg).unwrap();
            assert!(kern.workgroups[1] > 1, "{:?}", kern.workgroups);
            gpu.run(&[&kern]).unwrap();
            let xs = if cfg.dp4 { cpu::stage_x16(&xv, k) } else { xv };
            let (want, tol) = reference(&xs, ty, &raw, k, None, &y0, true);
            check(&gpu.read_f32(&y).unwrap(), &want, &tol, "folded grid");
        }
    }

    #[test]
    #[should_panic(expected = "linear_quant: x must be [T, K = 64]")]
    fn quant_shape_mismatch_panics() {
        let gpu = gpu();
        let w = QuantWeight::new(&gpu, "w", DType::Q8_0, [16, 64], &random_blocks(DType::Q8_0, 16, 64, 1)).unwrap();
        let x = gpu.empty("x", &[2, 32], ElemType::F32).unwrap();
        let y = gpu.empty("y", &[2, 16], ElemType::F32).unwrap();
        let _ = linear_quant(&gpu, &x, &w, None, &y, LinearOpts::default());
    }

    #[test]
    fn unpermute_raw_rows_matches_f32() {
        let (rows, k, heads) = (24usize, 64usize, 3usize);
        for ty in [DType::Q4_1, DType::Q8_0] {
            let raw = random_blocks(ty, rows, k, 4);
            let got = unpermute_rope_rows_raw(&raw, rows, ty.byte_size(k).unwrap(), heads);
            let want = crate::loader::unpermute_rope_rows(&to_f32(ty, &raw, rows * k).unwrap(), rows, k, heads);
            assert_eq!(to_f32(ty, &got, rows * k).unwrap(), want, "{ty}");
        }
    }

    #[test]
    fn quant_bad_input_is_an_error() {
        let gpu = gpu();
        let msg = |r: Result<QuantWeight>| format!("{}", r.expect_err("an error"));
        let m = msg(QuantWeight::new(&gpu, "blk.0.ffn_up.weight", DType::F16, [4, 64], &[0; 512]));
        assert!(m.contains("f16") && m.contains("blk.0.ffn_up.weight"), "{m}");
        let m = msg(QuantWeight::new(&gpu, "w", DType::Q4_K, [4, 100], &[0; 576]));
        assert!(m.contains("K = 100") && m.contains("q4_K"), "{m}");
        let m = msg(QuantWeight::new(&gpu, "w", DType::Q8_0, [4, 64], &[0; 100]));
        assert!(m.contains("272 bytes, got 100"), "{m}");
        let m = msg(QuantWeight::concat_rows(&gpu, "qkv", DType::Q4_0, 32, &[&[0; 18], &[0; 20]]));
        assert!(m.contains("part 1"), "{m}");
        gpu.check().unwrap();
    }

    /// Seconds per call of `encode`: the best of 3 batches encoded into one compute pass (each
    /// sized to about 30 ms), after 0.1 s of warm-up.
    fn time_per_call(gpu: &Gpu, encode: &dyn Fn(&mut wgpu::ComputePass<'_>)) -> f64 {
        let batch = |r: usize| {
            let t0 = std::time::Instant::now();
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..r {
                    encode(&mut pass);
                }
            }
            gpu.queue.submit([enc.finish()]);
            gpu.wait().unwrap();
            t0.elapsed().as_secs_f64()
        };
        let warm = std::time::Instant::now();
        let mut one = batch(2) / 2.0;
        while warm.elapsed().as_secs_f64() < 0.1 {
            let r = ((0.03 / one) as usize).clamp(1, 5000);
            one = batch(r) / r as f64;
        }
        let reps = ((0.03 / one) as usize).clamp(3, 5000);
        (0..3).map(|_| batch(reps) / reps as f64).fold(f64::INFINITY, f64::min)
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib ops::matmul::gguf::tests::probe_quant -- --ignored --nocapture"]
    fn probe_quant() {
        // Where a quantized matvec's time goes: the kernel as picked (DP4 where it applies), the
        // float path, without x (PROBE_NOX), and the weight loads alone (PROBE_NOMATH); with W hot in L2 (one copy) and cold (copies
        // rotated over > 256 MB).
        let gpu = gpu();
        let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
        let shapes: &[(usize, usize)] =
            if big { &[(2048, 1536), (17920, 1536), (1536, 8960), (151936, 1536)] } else { &[(256, 1536)] };
        let opts = LinearOpts::default();
        for ty in [DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q8_0] {
            for &(n, k) in shapes {
                let raw = random_blocks(ty, n, k, 2);
                let bytes = ty.byte_size(n * k).unwrap();
                let copies = if big { (256_000_000 / bytes).clamp(1, 64) } else { 2 };
                let ws: Vec<QuantWeight> =
                    (0..copies).map(|_| QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap()).collect();
                let x = gpu.upload_f32("x", &[1, k], &random(k, 1, 1.0)).unwrap();
                let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
                let s = check_operands("probe", &x, n, k, None, &y, opts);
                let auto = QMatvecConfig::new(&gpu, ty, &s);
                let mut line = format!(
                    "{ty} N={n} K={k} tpr {} wg {} dp4 {} ({:.1} MB x{copies}):",
                    auto.tpr,
                    auto.wg,
                    auto.dp4,
                    bytes as f64 / 1e6
                );
                let float = QMatvecConfig { dp4: false, ..auto };
                for (name, c) in [
                    ("auto", auto),
                    ("dp4", QMatvecConfig { dp4: dp4_fits(&gpu, ty, k, auto.wg, auto.tok), ..auto }),
                    ("float", float),
                    ("nox", QMatvecConfig { probe: "PROBE_NOX", ..float }),
                    ("nomath", QMatvecConfig { probe: "PROBE_NOMATH", ..float }),
                ] {
                    let ks: Vec<Kernel> = ws
                        .iter()
                        .map(|w| matvec_quant(&gpu, &x, Input::Plain, w, None, &y, &s, opts, c).unwrap())
                        .collect();
                    let hot = time_per_call(&gpu, &|pass| ks[0].encode(pass));
                    let cold = time_per_call(&gpu, &|pass| {
                        for k in &ks {
                            k.encode(pass);
                        }
                    }) / copies as f64;
                    line += &format!(
                        " {name} hot {:.1}us {:.2}TB/s cold {:.1}us {:.2}TB/s;",
                        hot * 1e6,
                        bytes as f64 / hot / 1e12,
                        cold * 1e6,
                        bytes as f64 / cold / 1e12
                    );
                }
                eprintln!("{line}");
            }
        }
    }

    /// The benches' shapes from QSHAPES="N:K,N:K", if set.
    fn bench_shapes() -> Option<Vec<(usize, usize)>> {
        std::env::var("QSHAPES").ok().map(|v| {
            v.split(',')
                .map(|nk| {
                    let (n, k) = nk.split_once(':').expect("QSHAPES entries are N:K");
                    (n.parse().unwrap(), k.parse().unwrap())
                })
                .collect()
        })
    }

    /// The benches' types: those of QTYPES="Q4_K,Q6_K" if set, else `default`.
    fn bench_types(default: &[DType]) -> Vec<DType> {
        match std::env::var("QTYPES") {
            Ok(v) => TYPES.into_iter().filter(|t| v.split(',').any(|n| n == t.name())).collect(),
            Err(_) => default.to_vec(),
        }
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib ops::matmul::gguf::tests::bench_quant -- --ignored --nocapture"]
    fn bench_quant() {
        // Qwen2.5-1.5B's linear layers (N, K): qkv, o, gate_up, down, lm_head.
        let gpu = gpu();
        let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
        let custom = bench_shapes();
        let shapes: &[(usize, usize)] = match (&custom, big) {
            (Some(c), _) => c,
            (None, true) => &[(2048, 1536), (256, 1536), (1536, 1536), (17920, 1536), (1536, 8960), (151936, 1536)],
            (None, false) => &[(2048, 1536)],
        };
        let types = bench_types(&TYPES);
        eprintln!(
            "{} f16={} sg={} (max {})",
            gpu.info.name, gpu.caps.f16, gpu.caps.subgroups, gpu.caps.subgroup_max_size
        );
        let opts = LinearOpts::default();
        // QBENCH=prefill: only the few/many-token part below.
        let matvecs = !std::env::var("QBENCH").is_ok_and(|v| v == "prefill");
        for &ty in types.iter().filter(|_| matvecs) {
            for &(n, k) in shapes {
                let raw = random_blocks(ty, n, k, 2);
                // W cold, as in a decode step: copies rotated over > 100 MB (the H100's L2 holds
                // 50), each dispatch behind a barrier (they all write y).
                let bytes = ty.byte_size(n * k).unwrap();
                let copies = if big { 100_000_000usize.div_ceil(bytes).clamp(1, 320) } else { 1 };
                let ws: Vec<QuantWeight> =
                    (0..copies).map(|_| QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap()).collect();
                let w = &ws[0];
                let x = gpu.upload_f32("x", &[1, k], &random(k, 1, 1.0)).unwrap();
                let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
                let s = check_operands("bench", &x, n, k, None, &y, opts);
                let auto = QMatvecConfig::new(&gpu, ty, &s);
                let mut line =
                    format!("matvec {ty} N={n} K={k} ({:.1} MB x{copies} cold):", w.gpu_bytes() as f64 / 1e6);
                let mut cfgs = vec![auto];
                // Every workgroup size from 32 threads, every row group width it holds, with and
                // without DP4 (WG_ALL=0: the auto workgroup size only).
                let wgs: Vec<u32> = if std::env::var("WG_ALL").is_ok_and(|v| v == "0") {
                    vec![auto.wg]
                } else {
                    vec![32, 64, 128, 256]
                };
                for wg in wgs {
                    for tpr in [16u32, 32, 64, 128, 256] {
                        let sg_ok = tpr >= gpu.caps.subgroup_max_size || !auto.subgroups;
                        if !sg_ok || tpr > wg {
                            continue;
                        }
                        for dp4 in [false, true] {
                            let c = QMatvecConfig { tpr, dp4, wg, ..auto };
                            if (dp4 && !dp4_fits(&gpu, ty, k, wg, auto.tok)) || c == auto {
                                continue;
                            }
                            cfgs.push(c);
                        }
                    }
                }
                let mut first = None;
                for (i, c) in cfgs.iter().enumerate() {
                    let ks: Vec<Kernel> = ws
                        .iter()
                        .map(|w| matvec_quant(&gpu, &x, Input::Plain, w, None, &y, &s, opts, *c).unwrap())
                        .collect();
                    let t = time_per_call(&gpu, &|pass| ks.iter().for_each(|k| k.encode(pass))) / copies as f64;
                    let out = gpu.read_f32(&y).unwrap();
                    let first = first.get_or_insert(out.clone());
                    let (d, at) = max_abs_diff(first, &out);
                    assert!(d < 1e-3 * (1.0 + first[at].abs()), "{ty} N={n} K={k} {c:?}: differs by {d} at {at}");
                    let dp = if c.dp4 { "+dp4" } else { "" };
                    let name = format!("{}wg {} tpr {}{dp}", if i == 0 { "auto " } else { "" }, c.wg, c.tpr);
                    line += &format!(" {name} {:.1}us {:.0}GB/s;", t * 1e6, w.gpu_bytes() as f64 / t / 1e9);
                }
                // x staged apart (quantize_x16, then XG), the staging counted once a call.
                if has_dp4(ty) && gpu.info.backend == wgpu::Backend::Vulkan {
                    let xs = gpu.empty("xs", &[staged_x_words(1, k)], ElemType::U32).unwrap();
                    let stage = quantize_x16(&gpu, &x, &xs).unwrap();
                    let ts = time_per_call(&gpu, &|pass| stage.encode(pass));
                    line += &format!(" | quantize_x16 {:.1}us;", ts * 1e6);
                    let sg = if auto.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
                    for (wg, tpr) in
                        [(32, 32), (64, 32), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64), (256, 256)]
                    {
                        for prefetch in [false, true] {
                            if tpr < sg || tpr > wg {
                                continue;
                            }
                            let c = QMatvecConfig { wg, tpr, tok: 1, dp4: true, prefetch, ..auto };
                            let ks: Vec<Kernel> = ws
                                .iter()
                                .map(|w| matvec_quant(&gpu, &x, Input::Staged(&xs), w, None, &y, &s, opts, c).unwrap())
                                .collect();
                            let t = time_per_call(&gpu, &|pass| ks.iter().for_each(|k| k.encode(pass))) / copies as f64;
                            let pf = if prefetch { "+pf" } else { "" };
                            line += &format!(
                                " xg wg {wg} tpr {tpr}{pf} {:.1}us {:.0}GB/s;",
                                t * 1e6,
                                w.gpu_bytes() as f64 / t / 1e9
                            );
                        }
                    }
                }
                eprintln!("{line}");
            }
        }
        // The same shapes in f16 (the path this replaces).
        for &(n, k) in shapes.iter().filter(|_| matvecs) {
            let wh: Vec<half::f16> = random(n * k, 2, 1.0).into_iter().map(f16::from_f32).collect();
            let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
            let x = gpu.upload_f32("x", &[1, k], &random(k, 1, 1.0)).unwrap();
            let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
            let kern = super::super::linear(&gpu, &x, &w, None, &y, opts).unwrap();
            let t = time_per_call(&gpu, &|pass| kern.encode(pass));
            eprintln!("matvec f16 N={n} K={k}: {:.1}us {:.0}GB/s", t * 1e6, (2 * n * k) as f64 / t / 1e9);
        }
        if std::env::var("QBENCH").is_ok_and(|v| v == "matvec") || custom.is_some() {
            return;
        }
        // Few tokens (matvec, 4 tokens per pass) and prefill (matmul).
        let (n, k) = if big { (17920usize, 1536usize) } else { (256, 1536) };
        let ts: &[usize] = if big { &[4, 32, 33, 128, 512] } else { &[4, 33] };
        for ty in TYPES {
            let raw = random_blocks(ty, n, k, 2);
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
            let mut line = format!("few/many tokens {ty} N={n} K={k}:");
            for &t in ts {
                let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
                let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
                let kern = linear_quant(&gpu, &x, &w, None, &y, opts).unwrap();
                let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                line += &format!(" T={t} {:.1}us {:.2}TFLOP/s", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
                if gpu.caps.coop && t > MATVEC_MAX_T {
                    // (the auto pick above is the tensor-core matmul: the f32 one beside it)
                    let s = check_operands("bench", &x, n, k, None, &y, opts);
                    let kern = matmul_quant(&gpu, &x, &w, None, &y, &s, opts, MatmulConfig::new(&s)).unwrap();
                    let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                    line += &format!(" (f32 matmul {:.1}us)", tm * 1e6);
                }
                line += ";";
            }
            eprintln!("{line}");
        }
        let wh: Vec<half::f16> = random(n * k, 2, 1.0).into_iter().map(f16::from_f32).collect();
        let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
        let mut line = format!("few/many tokens f16 N={n} K={k}:");
        for &t in ts {
            let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
            let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
            let kern = super::super::linear(&gpu, &x, &w, None, &y, opts).unwrap();
            let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
            line += &format!(" T={t} {:.1}us {:.2}TFLOP/s;", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
        }
        eprintln!("{line}");
    }

    /// The tensor-core matmul's time and where it goes: with the W loads, the x loads or the
    /// tensor-core ops left out (PROBE_NOW / NOX / NOMMA), against the f32 matmul, at 33, 128 and
    /// 512 tokens (QSHAPES, QTYPES; default Q4_K 17920 × 1536).
    #[test]
    #[ignore = "timing: cargo test --release --lib ops::matmul::gguf::tests::bench_coop -- --exact --ignored --nocapture"]
    fn bench_coop() {
        let gpu = gpu();
        assert!(gpu.caps.coop, "{} has no cooperative matrices", gpu.info.name);
        for (ty, (n, k)) in bench_types(&[DType::Q4_K])
            .into_iter()
            .flat_map(|ty| bench_shapes().unwrap_or(vec![(17920, 1536)]).into_iter().map(move |nk| (ty, nk)))
        {
            let w = QuantWeight::new(&gpu, "w", ty, [n, k], &random_blocks(ty, n, k, 2)).unwrap();
            for t in [33usize, 128, 512] {
                let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
                let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
                let opts = LinearOpts::default();
                let s = check_operands("bench", &x, n, k, None, &y, opts);
                let mut line = format!("coop {ty} N={n} K={k} T={t}:");
                let kern = matmul_quant(&gpu, &x, &w, None, &y, &s, opts, MatmulConfig::new(&s)).unwrap();
                let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                line += &format!(" f32 {:.1}us", tm * 1e6);
                for probe in ["", "PROBE_NOW", "PROBE_NOX", "PROBE_NOMMA"] {
                    let flags: Vec<&str> = if probe.is_empty() { vec![] } else { vec![probe] };
                    let kern = matmul_quant_coop_flags(&gpu, &x, &w, None, &y, &s, opts, &flags).unwrap();
                    let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                    let what = if probe.is_empty() { "coop" } else { probe };
                    line += &format!(" {what} {:.1}us {:.1}TFLOP/s", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
                }
                eprintln!("{line}");
            }
        }
    }

    /// The batch step's matvec (`LinearOpts::batch`: passes of 4 tokens at every batch size)
    /// with DP4 against the float sums, and the tiled matmul beside them, at batch sizes 1 to 32
    /// on Qwen2.5-1.5B's shapes (QSHAPES, QTYPES as bench_quant).
    #[test]
    #[ignore = "timing: cargo test --release --lib ops::matmul::gguf::tests::bench_quant_batch -- --ignored --nocapture"]
    fn bench_quant_batch() {
        let gpu = gpu();
        let shapes = bench_shapes().unwrap_or_else(|| vec![(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]);
        let types = bench_types(&[DType::Q4_K, DType::Q6_K]);
        eprintln!("{} sg={} (max {})", gpu.info.name, gpu.caps.subgroups, gpu.caps.subgroup_max_size);
        for &ty in &types {
            for &(n, k) in &shapes {
                let raw = random_blocks(ty, n, k, 2);
                let w = QuantWeight::new(&gpu, "w", ty, [n, k], &raw).unwrap();
                let mut line = format!("batch {ty} N={n} K={k} ({:.1} MB):", w.gpu_bytes() as f64 / 1e6);
                for t in [1usize, 4, 8, 16, 32] {
                    let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
                    let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
                    let opts = LinearOpts { batch: true, ..Default::default() };
                    let s = check_operands("bench", &x, n, k, None, &y, opts);
                    let auto = QMatvecConfig::new(&gpu, ty, &super::super::tuned_shape(&s, &opts));
                    line += &format!(" T={t}");
                    for dp4 in [true, false] {
                        if dp4 && !dp4_fits(&gpu, ty, k, auto.wg, auto.tok) {
                            continue;
                        }
                        let c = QMatvecConfig { dp4, ..auto };
                        let kern = matvec_quant(&gpu, &x, Input::Plain, &w, None, &y, &s, opts, c).unwrap();
                        let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                        line += &format!(" {}{:.1}us", if dp4 { "dp4 " } else { "float " }, tm * 1e6);
                    }
                    let kern = matmul_quant(&gpu, &x, &w, None, &y, &s, opts, MatmulConfig::new(&s)).unwrap();
                    let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                    line += &format!(" matmul {:.1}us", tm * 1e6);
                    for rw in [32, 16] {
                        let kern =
                            matvec_quant_batch(&gpu, &x, Input::Plain, &w, None, &y, &s, opts, rw, None).unwrap();
                        let tm = time_per_call(&gpu, &|pass| kern.encode(pass));
                        let auto = if rw == batch_rows(n, t) { "*" } else { "" };
                        line += &format!(" batch rw {rw}{auto} {:.1}us", tm * 1e6);
                    }
                    line += ";";
                }
                eprintln!("{line}");
            }
        }
    }
}
