//! Stored tensor types and their conversion to f32/f16.
//!
//! The quantized block layouts are ggml's (`ggml-common.h`), dequantized with the exact float
//! operations of ggml's reference `dequantize_row_*` (no fused multiply-add), so results are
//! bit-identical to llama.cpp's CPU reference and to gguf-py's numpy port
//! (`tests/fixtures/dequant/`, made by `tools/make_dequant_fixtures.py`, checks this).
//!
//! | type | elements/block | bytes/block | layout |
//! |------|---------------:|------------:|--------|
//! | Q4_0 | 32  | 18  | `d: f16, qs: [u8; 16]` — `x = (nibble - 8) * d` |
//! | Q4_1 | 32  | 20  | `d: f16, m: f16, qs: [u8; 16]` — `x = nibble * d + m` |
//! | Q5_0 | 32  | 22  | `d: f16, qh: u32, qs: [u8; 16]` — `x = ((nibble \| hbit << 4) - 16) * d` |
//! | Q5_1 | 32  | 24  | `d: f16, m: f16, qh: u32, qs: [u8; 16]` — `x = (nibble \| hbit << 4) * d + m` |
//! | Q8_0 | 32  | 34  | `d: f16, qs: [i8; 32]` — `x = q * d` |
//! | Q4_K | 256 | 144 | `d: f16, dmin: f16, scales: [u8; 12], qs: [u8; 128]` |
//! | Q5_K | 256 | 176 | `d: f16, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]` |
//! | Q6_K | 256 | 210 | `ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16` |
//!
//! | A4 (MLX 4-bit) | group g (32, 64, 128) | 4 + g/2 | `scale, bias: f16 or bf16, qs: [u8; g/2]` — `x = nibble * scale + bias` |
//! | A8 (MLX 8-bit) | group g | 4 + g | `scale, bias: f16 or bf16, qs: [u8; g]` — `x = q * scale + bias` |
//!
//! In the 32-element types, byte `j` of `qs` holds element `j` in its low nibble and element
//! `j + 16` in its high nibble. The affine types are MLX's group-wise quantization (mlx-lm's
//! `weight` (packed u32), `scales`, `biases`), gathered by the loader into one block per group
//! ([`mlx_affine_blocks`]): A4's quants in the same nibble order as Q4_1, per 32-element
//! sub-block, so that Q4_1's kernels read them; A8's as unsigned bytes in element order.

use crate::error::{Error, Result};
use half::f16;
use half::slice::HalfFloatSliceExt;

/// A tensor's stored element type.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// MLX affine quantization: `bits` (4 or 8) per weight, one scale and bias per `group` (32,
    /// 64 or 128) elements, stored as bf16 (`bf16`) or f16.
    Affine {
        bits: u8,
        group: u16,
        bf16: bool,
    },
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q4_K,
    Q5_K,
    Q6_K,
}

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;

impl DType {
    /// Every supported type.
    pub const ALL: [DType; 11] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// The type's id in ggml's `enum ggml_type` (what GGUF tensor infos store); `None` for the
    /// MLX affine types, which GGUF has not.
    pub fn ggml_type(self) -> Option<u32> {
        Some(match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q8_0 => 8,
            DType::Q4_K => 12,
            DType::Q5_K => 13,
            DType::Q6_K => 14,
            DType::BF16 => 30,
            DType::Affine { .. } => return None,
        })
    }

    /// The type with this ggml id, if this engine reads it.
    pub fn from_ggml_type(id: u32) -> Option<DType> {
        DType::ALL.into_iter().find(|t| t.ggml_type() == Some(id))
    }

    /// The MLX affine type for `bits` and `group` with scales and biases stored as `scale` (f16
    /// or bf16), or why there is none.
    pub fn affine(bits: u64, group: u64, scale: DType) -> std::result::Result<DType, String> {
        if bits != 4 && bits != 8 {
            return Err(format!("{bits}-bit quantization (4 and 8 are supported)"));
        }
        if ![32, 64, 128].contains(&group) {
            return Err(format!("quantization group size {group} (32, 64 and 128 are supported)"));
        }
        let bf16 = match scale {
            DType::BF16 => true,
            DType::F16 => false,
            other => return Err(format!("{other} quantization scales (f16 and bf16 are supported)")),
        };
        Ok(DType::Affine { bits: bits as u8, group: group as u16, bf16 })
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => QK_K,
            DType::Affine { group, .. } => group as usize,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::Affine { bits, group, .. } => 4 + group as usize * bits as usize / 8,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// ggml's name of the type (`"q4_K"`, `"f16"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q4_K => "q4_K",
            DType::Q5_K => "q5_K",
            DType::Q6_K => "q6_K",
            DType::Affine { bits, group, bf16 } => {
                const NAMES: [&str; 12] = [
                    "mlx4_g32_f16",
                    "mlx4_g64_f16",
                    "mlx4_g128_f16",
                    "mlx8_g32_f16",
                    "mlx8_g64_f16",
                    "mlx8_g128_f16",
                    "mlx4_g32_bf16",
                    "mlx4_g64_bf16",
                    "mlx4_g128_bf16",
                    "mlx8_g32_bf16",
                    "mlx8_g64_bf16",
                    "mlx8_g128_bf16",
                ];
                let g = (group as usize / 32).trailing_zeros() as usize;
                NAMES[usize::from(bf16) * 6 + usize::from(bits == 8) * 3 + g]
            }
        }
    }

    /// Bytes that `n` elements take, or `None` when `n` is not a whole number of blocks
    /// (or the size overflows).
    pub fn byte_size(self, n: usize) -> Option<usize> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Converts `n` elements stored as `dtype` in `bytes` to f32.
/// Errors when `n` is not a whole number of blocks or `bytes` is not exactly their size.
pub fn to_f32(dtype: DType, bytes: &[u8], n: usize) -> Result<Vec<f32>> {
    check_len(dtype, bytes, n)?;
    let mut out = vec![0f32; n];
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            par_chunks(&mut out, bytes, 1, 2, |dst, src| {
                let mut tmp = [f16::ZERO; 4096];
                for (d, s) in dst.chunks_mut(4096).zip(src.chunks(8192)) {
                    let t = &mut tmp[..d.len()];
                    for (x, c) in t.iter_mut().zip(s.chunks_exact(2)) {
                        *x = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
                    }
                    t.convert_to_f32_slice(d);
                }
            });
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        q => par_chunks(&mut out, bytes, q.block_size(), q.block_bytes(), |dst, src| {
            for (d, s) in dst.chunks_exact_mut(q.block_size()).zip(src.chunks_exact(q.block_bytes())) {
                dequant_block(q, s, d);
            }
        }),
    }
    Ok(out)
}

/// Converts `n` elements stored as `dtype` in `bytes` to f16 (round to nearest even).
/// Quantized types are dequantized to f32 first, exactly as [`to_f32`], then rounded.
pub fn to_f16(dtype: DType, bytes: &[u8], n: usize) -> Result<Vec<f16>> {
    check_len(dtype, bytes, n)?;
    let mut out = vec![f16::ZERO; n];
    match dtype {
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_bits(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        DType::F32 | DType::BF16 => {
            let eb = dtype.block_bytes();
            par_chunks(&mut out, bytes, 1, eb, |dst, src| {
                let mut tmp = [0f32; 4096];
                for (d, s) in dst.chunks_mut(4096).zip(src.chunks(4096 * eb)) {
                    let t = &mut tmp[..d.len()];
                    if eb == 4 {
                        for (x, c) in t.iter_mut().zip(s.chunks_exact(4)) {
                            *x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                        }
                    } else {
                        for (x, c) in t.iter_mut().zip(s.chunks_exact(2)) {
                            *x = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
                        }
                    }
                    d.convert_from_f32_slice(t);
                }
            });
        }
        q => par_chunks(&mut out, bytes, q.block_size(), q.block_bytes(), |dst, src| {
            let mut tmp = [0f32; QK_K];
            let bs = q.block_size();
            for (d, s) in dst.chunks_exact_mut(bs).zip(src.chunks_exact(q.block_bytes())) {
                let t = &mut tmp[..bs];
                dequant_block(q, s, t);
                d.convert_from_f32_slice(t);
            }
        }),
    }
    Ok(out)
}

/// Stores f32 values as `dtype`: the inverse of [`to_f32`], for building test and benchmark
/// checkpoints (see `GgufWriter`). F32, F16, BF16 (round to nearest even) and the 32-element
/// quants Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 with ggml's reference quantizers (bit-identical to
/// gguf-py's); the k-quants are [`Error::Unsupported`]. `data.len()` must be a whole number of
/// blocks.
pub fn quantize(dtype: DType, data: &[f32]) -> Result<Vec<u8>> {
    let Some(size) = dtype.byte_size(data.len()) else {
        return Err(Error::InvalidArgument(format!(
            "{} values are not a whole number of {dtype} blocks of {}",
            data.len(),
            dtype.block_size()
        )));
    };
    let mut out = Vec::with_capacity(size);
    match dtype {
        DType::F32 => data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        DType::F16 => data.iter().for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
        DType::BF16 => data.iter().for_each(|&x| out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes())),
        DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            for x in data.chunks_exact(32) {
                quantize_block(dtype, x.try_into().unwrap(), &mut out);
            }
        }
        DType::Q4_K | DType::Q5_K | DType::Q6_K => return Err(Error::Unsupported(format!("quantizing to {dtype}"))),
        DType::Affine { .. } => return quantize_affine(dtype, data),
    }
    debug_assert_eq!(out.len(), size);
    Ok(out)
}

/// ggml's `quantize_row_*_ref` for one block of 32.
fn quantize_block(t: DType, x: &[f32; 32], out: &mut Vec<u8>) {
    let inv = |d: f32| if d == 0.0 { 0.0 } else { 1.0 / d };
    // The element of largest magnitude, with its sign (the first one on ties).
    let signed_absmax = || x.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let (min, max) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let nibbles = |q: &[u8; 32], out: &mut Vec<u8>| {
        for j in 0..16 {
            out.push((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        }
    };
    let high_bits = |q: &[u8; 32]| -> u32 { (0..32).fold(0u32, |h, j| h | (((q[j] as u32 >> 4) & 1) << j)) };
    let mut q = [0u8; 32];
    match t {
        DType::Q8_0 => {
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = inv(d);
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            // roundf: half away from zero.
            out.extend(x.iter().map(|&v| (v * id).round() as i8 as u8));
        }
        DType::Q4_0 | DType::Q5_0 => {
            let (levels, offset) = if t == DType::Q4_0 { (-8.0, 8.5) } else { (-16.0, 16.5) };
            let top = if t == DType::Q4_0 { 15 } else { 31 };
            let d = signed_absmax() / levels;
            let id = inv(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                *qj = ((v * id + offset).trunc() as u8).min(top);
            }
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            if t == DType::Q5_0 {
                out.extend_from_slice(&high_bits(&q).to_le_bytes());
            }
            nibbles(&q, out);
        }
        DType::Q4_1 | DType::Q5_1 => {
            let top = if t == DType::Q4_1 { 15u8 } else { 31 };
            let d = (max - min) / top as f32;
            let id = inv(d);
            for (qj, &v) in q.iter_mut().zip(x) {
                *qj = (((v - min) * id + 0.5).trunc() as u8).min(top);
            }
            out.extend_from_slice(&f16::from_f32(d).to_le_bytes());
            out.extend_from_slice(&f16::from_f32(min).to_le_bytes());
            if t == DType::Q5_1 {
                out.extend_from_slice(&high_bits(&q).to_le_bytes());
            }
            nibbles(&q, out);
        }
        _ => unreachable!("only 32-element quants"),
    }
}

fn check_len(dtype: DType, bytes: &[u8], n: usize) -> Result<()> {
    let Some(want) = dtype.byte_size(n) else {
        return Err(Error::Mismatch(format!(
            "{n} elements are not a whole number of {dtype} blocks of {}",
            dtype.block_size()
        )));
    };
    if bytes.len() != want {
        return Err(Error::Mismatch(format!("{n} {dtype} elements take {want} bytes, got {}", bytes.len())));
    }
    Ok(())
}

/// Elements below which conversion stays on the calling thread.
const PAR_MIN_ELEMS: usize = 1 << 16;

/// Splits `dst` (elements) and `src` (bytes) at block boundaries over the available cores
/// and runs `f` on each pair. `src` must hold exactly `dst.len() / block` blocks.
fn par_chunks<T: Send>(
    dst: &mut [T],
    src: &[u8],
    block: usize,
    block_bytes: usize,
    f: impl Fn(&mut [T], &[u8]) + Sync,
) {
    let blocks = dst.len() / block;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    if threads <= 1 || dst.len() < PAR_MIN_ELEMS {
        f(dst, src);
        return;
    }
    let per = blocks.div_ceil(threads);
    std::thread::scope(|s| {
        let f = &f;
        for (d, b) in dst.chunks_mut(per * block).zip(src.chunks(per * block_bytes)) {
            s.spawn(move || f(d, b));
        }
    });
}

#[inline(always)]
fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// The 32 5-bit quants of a Q5_0 / Q5_1 block from its `qh: u32` and `qs: [u8; 16]` (`b`): quant
/// `j` is nibble `j` (the low nibbles of `qs`, then the high ones) with bit `j` of `qh` above it.
#[inline(always)]
fn q5_quants(b: &[u8]) -> [u32; 32] {
    let qh = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    std::array::from_fn(|j| {
        let q = b[4 + j % 16] as u32;
        let nibble = if j < 16 { q & 0xF } else { q >> 4 };
        nibble | (((qh >> j) << 4) & 0x10)
    })
}

/// Dequantizes one block `b` (exactly `block_bytes` long) into `y` (exactly `block_size` long).
#[inline]
fn dequant_block(t: DType, b: &[u8], y: &mut [f32]) {
    match t {
        DType::Q8_0 => {
            let b: &[u8; 34] = b.try_into().unwrap();
            let y: &mut [f32; 32] = y.try_into().unwrap();
            let d = rd_f16(b, 0);
            for j in 0..32 {
                y[j] = (b[2 + j] as i8) as f32 * d;
            }
        }
        DType::Q4_0 => {
            let b: &[u8; 18] = b.try_into().unwrap();
            let y: &mut [f32; 32] = y.try_into().unwrap();
            let d = rd_f16(b, 0);
            for j in 0..16 {
                let q = b[2 + j];
                y[j] = ((q & 0xF) as i32 - 8) as f32 * d;
                y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        DType::Q4_1 => {
            let b: &[u8; 20] = b.try_into().unwrap();
            let y: &mut [f32; 32] = y.try_into().unwrap();
            let d = rd_f16(b, 0);
            let m = rd_f16(b, 2);
            for j in 0..16 {
                let q = b[4 + j];
                y[j] = (q & 0xF) as f32 * d + m;
                y[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
        DType::Q5_0 => {
            let b: &[u8; 22] = b.try_into().unwrap();
            let d = rd_f16(b, 0);
            for (y, q) in y.iter_mut().zip(q5_quants(&b[2..])) {
                *y = (q as i32 - 16) as f32 * d;
            }
        }
        DType::Q5_1 => {
            let b: &[u8; 24] = b.try_into().unwrap();
            let (d, m) = (rd_f16(b, 0), rd_f16(b, 2));
            for (y, q) in y.iter_mut().zip(q5_quants(&b[4..])) {
                *y = q as f32 * d + m;
            }
        }
        DType::Q4_K => {
            let b: &[u8; 144] = b.try_into().unwrap();
            let y: &mut [f32; 256] = y.try_into().unwrap();
            let qs = &b[16..144];
            for g in 0..4 {
                let [(d1, m1), (d2, m2)] = k4_group(b, g);
                let q = &qs[32 * g..32 * g + 32];
                let out = &mut y[64 * g..64 * g + 64];
                for l in 0..32 {
                    out[l] = d1 * (q[l] & 0xF) as f32 - m1;
                    out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
                }
            }
        }
        DType::Q5_K => {
            let b: &[u8; 176] = b.try_into().unwrap();
            let y: &mut [f32; 256] = y.try_into().unwrap();
            let qh = &b[16..48];
            let qs = &b[48..176];
            for g in 0..4 {
                let [(d1, m1), (d2, m2)] = k4_group(b, g);
                let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
                let q = &qs[32 * g..32 * g + 32];
                let out = &mut y[64 * g..64 * g + 64];
                for l in 0..32 {
                    let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                    let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                    out[l] = d1 * ((q[l] & 0xF) + h1) as f32 - m1;
                    out[l + 32] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
                }
            }
        }
        DType::Q6_K => {
            let b: &[u8; 210] = b.try_into().unwrap();
            let y: &mut [f32; 256] = y.try_into().unwrap();
            let d = rd_f16(b, 208);
            for half in 0..2 {
                let ql = &b[64 * half..64 * half + 64];
                let qh = &b[128 + 32 * half..128 + 32 * half + 32];
                let sc = &b[192 + 8 * half..192 + 8 * half + 8];
                let out = &mut y[128 * half..128 * half + 128];
                for l in 0..32 {
                    let is = l / 16;
                    let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                    let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                    let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                    let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                    out[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                    out[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                    out[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                    out[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                }
            }
        }
        DType::Affine { bits, bf16, .. } => {
            let rd = |at: usize| if bf16 { rd_bf16(b, at) } else { rd_f16(b, at) };
            let (scale, bias) = (rd(0), rd(2));
            let qs = &b[4..];
            if bits == 4 {
                for (y, q) in y.chunks_exact_mut(32).zip(qs.chunks_exact(16)) {
                    for j in 0..16 {
                        y[j] = (q[j] & 0xF) as f32 * scale + bias;
                        y[j + 16] = (q[j] >> 4) as f32 * scale + bias;
                    }
                }
            } else {
                for (y, &q) in y.iter_mut().zip(qs) {
                    *y = q as f32 * scale + bias;
                }
            }
        }
        DType::F32 | DType::F16 | DType::BF16 => {
            unreachable!("float types are not block-quantized")
        }
    }
}

fn rd_bf16(b: &[u8], at: usize) -> f32 {
    f32::from_bits((u16::from_le_bytes([b[at], b[at + 1]]) as u32) << 16)
}

/// MLX's affine quantization of one row as [`DType::Affine`] blocks: `weight` is the row's packed
/// u32 words as mlx-lm stores them (little-endian; element `j` in bits `bits · (j % (32 / bits))`
/// of word `j / (32 / bits)`), `scales` and `biases` the row's 16-bit values (2 bytes per
/// group). Appends `K / group` blocks to `out`. The caller checks the lengths.
pub fn mlx_affine_blocks(t: DType, weight: &[u8], scales: &[u8], biases: &[u8], out: &mut Vec<u8>) {
    let DType::Affine { bits, group, .. } = t else { panic!("{t} is not an affine type") };
    let (g, per_word, mask) = (group as usize, 32 / bits as usize, (1u32 << bits) - 1);
    let mut q = [0u8; 128]; // a group's quants, one a byte (groups are at most 128)
    for ((words, s), b) in
        weight.chunks_exact(g * bits as usize / 8).zip(scales.chunks_exact(2)).zip(biases.chunks_exact(2))
    {
        for (w, qw) in words.chunks_exact(4).zip(q[..g].chunks_exact_mut(per_word)) {
            let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
            for (i, qi) in qw.iter_mut().enumerate() {
                *qi = ((w >> (bits as usize * i)) & mask) as u8;
            }
        }
        out.extend_from_slice(s);
        out.extend_from_slice(b);
        push_affine_quants(bits, &q[..g], out);
    }
}

/// Appends a group's quants (one per byte, in element order) as an affine block stores them: 4-bit
/// quants in Q4_1's order per 32 elements (byte j = element j in the low nibble, j + 16 in the
/// high), 8-bit as they are.
fn push_affine_quants(bits: u8, q: &[u8], out: &mut Vec<u8>) {
    if bits == 4 {
        for sub in q.chunks_exact(32) {
            out.extend((0..16).map(|j| sub[j] | (sub[j + 16] << 4)));
        }
    } else {
        out.extend_from_slice(q);
    }
}

/// Quantizes `data` (whole groups) to the affine type `t` (MLX's layout; `--quantize`): per group
/// scale = (max - min) / (2^bits - 1) and bias = min, rounded to the type's 16-bit format, then
/// quants `round((x - bias) / scale)` from the rounded values, clamped to the levels: at most half
/// a step from x plus the 16-bit rounding. (mx.quantize keeps the end of larger magnitude exact
/// instead and can lose a whole step at the other end.)
pub fn quantize_affine(t: DType, data: &[f32]) -> Result<Vec<u8>> {
    let DType::Affine { bits, group, bf16 } = t else {
        return Err(Error::InvalidArgument(format!("{t} is not an affine type")));
    };
    let g = group as usize;
    if !data.len().is_multiple_of(g) {
        return Err(Error::InvalidArgument(format!("{} values are not whole groups of {g}", data.len())));
    }
    let levels = ((1u32 << bits) - 1) as f32;
    let store = |v: f32| -> (f32, [u8; 2]) {
        if bf16 {
            let h = half::bf16::from_f32(v);
            (h.to_f32(), h.to_le_bytes())
        } else {
            let h = f16::from_f32(v);
            (h.to_f32(), h.to_le_bytes())
        }
    };
    let mut out = Vec::with_capacity(data.len() / g * t.block_bytes());
    for x in data.chunks_exact(g) {
        let (lo, hi) = x.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
        let (scale, bias) = ((hi - lo) / levels, lo);
        let (scale, sb) = store(scale);
        let (bias, bb) = store(bias);
        out.extend_from_slice(&sb);
        out.extend_from_slice(&bb);
        let inv = if scale == 0.0 { 0.0 } else { 1.0 / scale };
        let q: Vec<u8> = x.iter().map(|&v| ((v - bias) * inv).round().clamp(0.0, levels) as u8).collect();
        push_affine_quants(bits, &q, &mut out);
    }
    Ok(out)
}

/// The (scale, min) of both 32-element halves of group `g` (of 4) of a Q4_K or Q5_K super-block
/// `b`: its f16 `d` and `dmin`, times the group's 6-bit scales and mins.
fn k4_group(b: &[u8], g: usize) -> [(f32, f32); 2] {
    let (d, dmin) = (rd_f16(b, 0), rd_f16(b, 2));
    let scales: &[u8; 12] = b[4..16].try_into().unwrap();
    [2 * g, 2 * g + 1].map(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        (d * sc as f32, dmin * m as f32)
    })
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> Vec<u8> {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dequant").join(name);
        std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e} (run tools/make_dequant_fixtures.py)", p.display()))
    }

    fn le_f32(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }

    fn le_f16(b: &[u8]) -> Vec<f16> {
        b.chunks_exact(2).map(|c| f16::from_bits(u16::from_le_bytes([c[0], c[1]]))).collect()
    }

    const FIXTURES: [(DType, &str); 11] = [
        (DType::F32, "f32"),
        (DType::F16, "f16"),
        (DType::BF16, "bf16"),
        (DType::Q8_0, "q8_0"),
        (DType::Q4_0, "q4_0"),
        (DType::Q4_1, "q4_1"),
        (DType::Q5_0, "q5_0"),
        (DType::Q5_1, "q5_1"),
        (DType::Q4_K, "q4_k"),
        (DType::Q5_K, "q5_k"),
        (DType::Q6_K, "q6_k"),
    ];

    /// What `convert` makes of each fixture's blocks (`{name}.bin`) and gguf-py's values
    /// (`{name}.{ext}`, read by `read`), checked to be as many, with the fixture's name.
    fn converted<T>(
        ext: &'static str,
        read: fn(&[u8]) -> Vec<T>,
        convert: fn(DType, &[u8], usize) -> Result<Vec<T>>,
    ) -> impl Iterator<Item = (&'static str, Vec<T>, Vec<T>)> {
        FIXTURES.into_iter().map(move |(t, name)| {
            let want = read(&fixture(&format!("{name}.{ext}")));
            let got = convert(t, &fixture(&format!("{name}.bin")), want.len()).unwrap();
            assert_eq!(got.len(), want.len(), "{name}");
            (name, got, want)
        })
    }

    /// Bit-exact against gguf-py's numpy dequantization (an independent implementation).
    #[test]
    fn dequant_matches_gguf_py() {
        for (name, got, want) in converted("f32", le_f32, to_f32) {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: got {g}, want {w}");
            }
            assert!(want.iter().any(|&x| x != 0.0), "{name}: degenerate fixture");
        }
    }

    /// f16 output: at most 1 ulp from numpy's rounding of the f32 reference (exact in practice).
    #[test]
    fn to_f16_matches_gguf_py() {
        for (name, got, want) in converted("f16", le_f16, to_f16) {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let (g, w) = (g.to_bits() as i32, w.to_bits() as i32);
                assert!((g - w).abs() <= 1, "{name}[{i}]: got {g:#x}, want {w:#x}");
            }
        }
    }

    /// The multi-threaded path (large tensors) gives what the single-threaded one does.
    #[test]
    fn parallel_path_matches() {
        for (t, name) in FIXTURES {
            let raw = fixture(&format!("{name}.bin"));
            let want = le_f32(&fixture(&format!("{name}.f32")));
            let reps = PAR_MIN_ELEMS / want.len() * 3 + 7;
            let big: Vec<u8> = raw.iter().copied().cycle().take(raw.len() * reps).collect();
            let got = to_f32(t, &big, want.len() * reps).unwrap();
            let got16 = to_f16(t, &big, want.len() * reps).unwrap();
            for (r, (c, c16)) in got.chunks(want.len()).zip(got16.chunks(want.len())).enumerate() {
                assert!(c.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} rep {r}");
                assert!(c16.iter().zip(&want).all(|(a, b)| *a == f16::from_f32(*b)), "{name} rep {r} f16");
            }
        }
    }

    /// quantize() reproduces gguf-py's quantizers bit for bit (and f16/bf16 rounding).
    #[test]
    fn quantize_matches_gguf_py() {
        // Every type quantize() writes has gguf-py's input (.src) and output (.bin) committed;
        // f32 is stored as is and the k-quants have no quantizer here.
        for (t, name) in
            FIXTURES.into_iter().filter(|(t, _)| !matches!(t, DType::F32 | DType::Q4_K | DType::Q5_K | DType::Q6_K))
        {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/dequant/{name}.src"));
            let src = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let got = quantize(t, &le_f32(&src)).unwrap();
            assert_eq!(got, fixture(&format!("{name}.bin")), "{name}");
        }
        for t in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
            assert!(matches!(quantize(t, &[0.0; 256]), Err(Error::Unsupported(_))));
        }
        assert!(matches!(quantize(DType::Q8_0, &[0.0; 33]), Err(Error::InvalidArgument(_))));
        let zeros = quantize(DType::Q4_1, &[0.0; 64]).unwrap();
        assert_eq!(to_f32(DType::Q4_1, &zeros, 64).unwrap(), vec![0.0; 64]);
    }

    /// `quantize_affine` loses at most half a step per element, plus the 16-bit rounding of scale
    /// and bias (2^-11 relative for f16, 2^-8 for bf16, times the largest level and the bias); the
    /// blocks decode through `to_f32`; a constant group is exact.
    #[test]
    fn quantize_affine_error_is_half_a_step() {
        let mut s = 0x1234_5678u64;
        let mut x = Vec::new();
        for g in 0..256 {
            // Groups of various spreads and offsets, one of them constant.
            let (scale, offset) = (0.01 + (g % 7) as f32 * 0.3, (g % 5) as f32 - 2.0);
            for _ in 0..128 {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                x.push(if g == 3 { 0.75 } else { offset + u * scale });
            }
        }
        for (bits, group, bf16) in [(4u8, 64u16, false), (4, 32, true), (8, 128, false), (8, 64, true)] {
            let t = DType::Affine { bits, group, bf16 };
            let q = quantize_affine(t, &x).unwrap();
            let y = to_f32(t, &q, x.len()).unwrap();
            let rel = if bf16 { 2f32.powi(-8) } else { 2f32.powi(-11) };
            let levels = ((1u32 << bits) - 1) as f32;
            for (gi, ((xg, yg), blk)) in
                x.chunks(group as usize).zip(y.chunks(group as usize)).zip(q.chunks(t.block_bytes())).enumerate()
            {
                let rd = |at: usize| if bf16 { rd_bf16(blk, at) } else { rd_f16(blk, at) };
                let (scale, bias) = (rd(0).abs(), rd(2).abs());
                let bound = 0.5 * scale + (levels * scale + bias) * rel + 4.0 * f32::EPSILON * bias.max(1.0);
                if xg.iter().all(|&v| v == xg[0]) {
                    assert!(xg.iter().zip(yg).all(|(a, b)| a == b), "{t}: a constant group is exact");
                }
                for (j, (a, b)) in xg.iter().zip(yg).enumerate() {
                    assert!((a - b).abs() <= bound, "{t} group {gi} element {j}: {a} -> {b} (bound {bound})");
                }
            }
        }
        assert!(quantize_affine(DType::Q4_0, &x).is_err());
        assert!(quantize_affine(DType::Affine { bits: 4, group: 64, bf16: false }, &x[..100]).is_err());
    }

    #[test]
    fn length_mismatch_is_an_error() {
        for t in DType::ALL {
            let n = t.block_size() * 3;
            let bytes = vec![0u8; t.block_bytes() * 3];
            assert!(to_f32(t, &bytes, n).is_ok());
            assert!(matches!(to_f32(t, &bytes[1..], n), Err(Error::Mismatch(_))), "{t}");
            assert!(matches!(to_f16(t, &bytes, n + t.block_size()), Err(Error::Mismatch(_))), "{t}");
            if t.is_quantized() {
                assert!(matches!(to_f32(t, &bytes, n - 1), Err(Error::Mismatch(_))), "{t}");
            }
        }
        assert!(to_f32(DType::Q4_K, &[], 0).unwrap().is_empty());
    }

    #[test]
    fn ggml_type_ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_ggml_type(t.ggml_type().unwrap()), Some(t));
        }
        assert_eq!(DType::from_ggml_type(12), Some(DType::Q4_K));
        assert_eq!(DType::from_ggml_type(30), Some(DType::BF16));
        for id in [4, 5, 9, 10, 11, 15, 16, 29, 31, 1000, u32::MAX] {
            assert_eq!(DType::from_ggml_type(id), None, "{id}");
        }
    }
}
