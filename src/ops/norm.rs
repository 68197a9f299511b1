//! RMSNorm (`wgsl/rms_norm.wgsl`): `out = x * rsqrt(mean(x²) + eps) * w` per row.
//!
//! Gemma's `(1 + w)` is folded into `w` at load, so one kernel serves every architecture. Three
//! forms, all one workgroup per row:
//! - [`rms_norm`]: `out = norm(x)` (pre-attention / pre-MLP norms, the final norm);
//! - `accumulate = true`: `out += norm(x)` (Gemma's post-attention / post-MLP sandwich norms fused
//!   with the residual add: `x_resid += rms_norm(tmp) * w`);
//! - [`rms_norm_in_place`]: `x = norm(x)` (per-head q/k norms).
//!
//! Rows may be strided ([`RowLayout`]), and `x`/`out` may be views (a [`Tensor`] with an offset
//! aligned to the device's `min_storage_buffer_offset_alignment`, 256 bytes at most), e.g. the
//! final norm of the last token only.

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};
use crate::ops::signature::shared_params;

/// Which elements form the rows: row `r` is `x[r * x_stride .. r * x_stride + n]`, written to
/// `out[r * out_stride ..][..n]` (strides in elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    pub rows: u32,
    pub n: u32,
    pub x_stride: u32,
    pub out_stride: u32,
}

impl RowLayout {
    /// Contiguous rows of `n` (strides = n).
    pub fn contiguous(rows: u32, n: u32) -> Self {
        RowLayout { rows, n, x_stride: n, out_stride: n }
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/rms_norm.wgsl`.
    pub(crate) struct RmsNormUniform = "Params" {
        rows: u32,
        n: u32,
        x_stride: u32,
        out_stride: u32,
        eps: f32,
        out_scale: f32,
        _pad1: u32,
        _pad2: u32,
    }
}

fn check(gpu: &Gpu, what: &str, t: &Tensor, rows: u32, n: u32, stride: u32) -> Result<()> {
    if t.ty != ElemType::F32 {
        return Err(Error::InvalidArgument(format!("rms_norm: {what} must be f32, is {:?}", t.ty)));
    }
    let need = if rows == 0 { 0 } else { (rows as usize - 1) * stride as usize + n as usize };
    if t.numel() < need {
        return Err(Error::InvalidArgument(format!(
            "rms_norm: {what} has {} elements, the row layout needs {need}",
            t.numel()
        )));
    }
    let align = gpu.limits.min_storage_buffer_offset_alignment as u64;
    if !t.offset.is_multiple_of(align) {
        return Err(Error::InvalidArgument(format!(
            "rms_norm: {what} view offset {} is not a multiple of {align} bytes",
            t.offset
        )));
    }
    Ok(())
}

fn checks(gpu: &Gpu, x: &Tensor, w: &Tensor, out: Option<&Tensor>, l: &RowLayout) -> Result<()> {
    if l.n == 0 || l.x_stride < l.n || (out.is_some() && l.out_stride < l.n) {
        return Err(Error::InvalidArgument(format!("rms_norm: bad row layout {l:?}")));
    }
    check(gpu, "x", x, l.rows, l.n, l.x_stride)?;
    check(gpu, "w", w, 1, l.n, l.n)?;
    if let Some(out) = out {
        check(gpu, "out", out, l.rows, l.n, l.out_stride)?;
    }
    Ok(())
}

fn params(gpu: &Gpu, l: &RowLayout, eps: f32, out_scale: f32) -> wgpu::Buffer {
    gpu.uniform(
        "rms_norm.params",
        &RmsNormUniform {
            rows: l.rows,
            n: l.n,
            x_stride: l.x_stride,
            out_stride: l.out_stride,
            eps,
            out_scale,
            ..Default::default()
        },
    )
}

shared_params! {
    (gpu: &Gpu, x: &Tensor, w: &Tensor, out: &Tensor)

    /// `out[r, :] = x[r, :] * rsqrt(mean(x[r, :]²) + eps) * w` over contiguous rows of `n = w.numel()`
    /// (rows = `x.numel() / n`); with `accumulate`, `out[r, :] += …` instead. `x` and `out` must not
    /// share a buffer (use [`rms_norm_in_place`]).
    pub fn rms_norm(eps: f32, accumulate: bool) -> Result<Kernel> {
        rms_norm_with(gpu, x, w, out, whole_rows(x, w)?, eps, accumulate, 1.0, None, None)
    }

    /// [`rms_norm`] over an explicit (possibly strided) [`RowLayout`].
    pub fn rms_norm_rows(layout: RowLayout, eps: f32, accumulate: bool) -> Result<Kernel> {
        rms_norm_with(gpu, x, w, out, layout, eps, accumulate, 1.0, None, None)
    }

    /// The residual add through a post-norm, then the layer's output scale:
    /// `out = (out + norm(x) * w) * scale` over contiguous rows of `n = w.numel()` (Gemma 4's last
    /// sandwich norm and `layer_scalar`). With `next = Some((w2, out2))` the same dispatch then writes
    /// `out2 = norm(out) * w2` (the next projection's pre-norm, same epsilon; `out2` shaped as `out`).
    pub fn rms_norm_residual(eps: f32, scale: f32, next: Option<(&Tensor, &Tensor)>) -> Result<Kernel> {
        rms_norm_with(gpu, x, w, out, whole_rows(x, w)?, eps, true, scale, next, None)
    }

    /// [`rms_norm_residual`] with the next norm, whose rows (out2) the same dispatch also writes
    /// staged into `xs` as [`crate::ops::matmul::gguf::quantize_x16`] would (n a multiple of 32): the
    /// input of the next projection's matvec on x staged apart, without a dispatch of its own.
    pub fn rms_norm_residual_staged(
        eps: f32, scale: f32, next: (&Tensor, &Tensor), xs: &Tensor
    ) -> Result<Kernel> {
        rms_norm_with(gpu, x, w, out, whole_rows(x, w)?, eps, true, scale, Some(next), Some(xs))
    }

    /// [`rms_norm`] (no accumulation) that also writes `out`'s rows staged into `xs` as
    /// [`crate::ops::matmul::gguf::quantize_x16`] would (n a multiple of 32): a pre-norm of its own
    /// staging the input of the projections after it (their matvec on x staged apart), without a
    /// dispatch of its own.
    pub fn rms_norm_staged(eps: f32, xs: &Tensor) -> Result<Kernel> {
        rms_norm_with(gpu, x, w, out, whole_rows(x, w)?, eps, false, 1.0, None, Some(xs))
    }
}

/// Every form but IN_PLACE: with `next`, the next norm after the residual add; with `stage`,
/// the rows the dispatch ends with also staged.
#[allow(clippy::too_many_arguments)]
fn rms_norm_with(
    gpu: &Gpu,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    layout: RowLayout,
    eps: f32,
    accumulate: bool,
    out_scale: f32,
    next: Option<(&Tensor, &Tensor)>,
    stage: Option<&Tensor>,
) -> Result<Kernel> {
    checks(gpu, x, w, Some(out), &layout)?;
    let p = params(gpu, &layout, eps, out_scale);
    let mut bindings = vec![x.binding(), w.binding(), out.binding(), p.as_entire_binding()];
    if let Some((w2, out2)) = next {
        assert!(accumulate, "rms_norm: the next norm follows a residual add");
        checks(gpu, out, w2, Some(out2), &layout)?;
        bindings.extend([w2.binding(), out2.binding()]);
    }
    // The rows the dispatch ends with (out2, else out) staged: whole 32-element blocks.
    if let Some(xs) = stage {
        let need = 4 * crate::ops::matmul::gguf::staged_x_words(layout.rows as usize, layout.n as usize) as u64;
        if !layout.n.is_multiple_of(32) || xs.size_bytes() < need {
            return Err(Error::InvalidArgument(format!(
                "rms_norm: staging rows of {} needs a multiple of 32 and {need} bytes, got {:?}",
                layout.n, xs.shape
            )));
        }
    }
    let xsb = bindings.len();
    bindings.extend(stage.map(Tensor::binding));
    let (wg, rv) = norm_shape(gpu, layout.n);
    let reg = rv.is_some();
    gpu.kernel(
        "rms_norm",
        "main",
        &gpu.macros()
            .flag_if("ACCUMULATE", accumulate)
            .flag_if("NEXT", next.is_some())
            .flag_if("STAGE", stage.is_some())
            .set("XSB", xsb)
            // Staged from the registers where a block's eight threads can shuffle.
            .flag_if("STAGE8", stage.is_some() && reg && gpu.caps.shuffles8())
            .flag_if("REG", reg)
            .set("WG", wg)
            .set("RV", rv.unwrap_or(1)),
        &bindings,
        grid(layout.rows),
    )
}

/// Contiguous rows of `n = w.numel()` covering x.
fn whole_rows(x: &Tensor, w: &Tensor) -> Result<RowLayout> {
    let n = w.numel() as u32;
    if n == 0 || !x.numel().is_multiple_of(n as usize) {
        return Err(Error::InvalidArgument(format!(
            "rms_norm: x has {} elements, not a whole number of rows of {n}",
            x.numel()
        )));
    }
    let layout = RowLayout::contiguous((x.numel() / n as usize) as u32, n);
    Ok(layout)
}

/// Threads of an `rms_norm` workgroup (`WG` in wgsl/rms_norm.wgsl).
const NORM_WG: u32 = 256;

/// The workgroup size of `rms_norm` (every form but IN_PLACE) for rows of `n`: [`NORM_WG`], 512
/// threads for rows of more than 4096 elements (where the adapter allows: three vec4 a thread at
/// Gemma-4-31B's 5376 instead of six; that step 12,489 -> 12,396 us on the H100, 1024 threads
/// 12,509: BENCHMARKS session 16), or `WGPU_LLM_NORM_WG` (256, 512 or 1024, within the adapter's
/// limits; measurement).
fn norm_wg(gpu: &Gpu, n: u32) -> u32 {
    let l = &gpu.limits;
    // (the tuning table's `NormWideRows` row)
    gpu.tuning()
        .norm_wg(n, NORM_WG, |wg| wg <= l.max_compute_invocations_per_workgroup && wg <= l.max_compute_workgroup_size_x)
}

/// `rms_norm`'s workgroup size for rows of `n` ([`norm_wg`]) and, where it holds the rows in
/// registers (REG: a multiple of 4, at most 8 vec4 a thread), the vec4 a thread.
fn norm_shape(gpu: &Gpu, n: u32) -> (u32, Option<u32>) {
    let wg = norm_wg(gpu, n);
    let rv = n.div_ceil(4 * wg);
    (wg, (n.is_multiple_of(4) && rv <= 8).then_some(rv))
}

/// `x[r * stride ..][..n] = norm(x[r * stride ..][..n]) * w` in place (`layout.out_stride` is
/// ignored), e.g. the per-head q/k norm with rows = tokens × heads and n = head_dim.
pub fn rms_norm_in_place(gpu: &Gpu, x: &Tensor, w: &Tensor, layout: RowLayout, eps: f32) -> Result<Kernel> {
    checks(gpu, x, w, None, &layout)?;
    let p = params(gpu, &layout, eps, 1.0);
    gpu.kernel(
        "rms_norm",
        "main",
        &gpu.macros().flag("IN_PLACE"),
        &[x.binding(), w.binding(), p.as_entire_binding()],
        grid(layout.rows),
    )
}

pub mod cpu {
    use super::RowLayout;

    /// Reference of [`super::rms_norm_rows`] (computed in f64, rounded to f32 at the end).
    pub fn rms_norm_rows(x: &[f32], w: &[f32], out: &mut [f32], l: RowLayout, eps: f32, accumulate: bool) {
        let n = l.n as usize;
        for r in 0..l.rows as usize {
            let row = &x[r * l.x_stride as usize..][..n];
            let scale = rms_scale(row, eps);
            let o = &mut out[r * l.out_stride as usize..][..n];
            for i in 0..n {
                let v = (row[i] as f64 * scale * w[i] as f64) as f32;
                if accumulate {
                    o[i] += v;
                } else {
                    o[i] = v;
                }
            }
        }
    }

    /// Reference of [`super::rms_norm_residual`]: `out = (out + norm(x) * w) * scale`, then with
    /// `next = Some((w2, out2))` `out2 = norm(out) * w2`.
    pub fn rms_norm_residual(
        x: &[f32],
        w: &[f32],
        out: &mut [f32],
        eps: f32,
        scale: f32,
        next: Option<(&[f32], &mut [f32])>,
    ) {
        rms_norm(x, w, out, eps, true);
        out.iter_mut().for_each(|o| *o *= scale);
        if let Some((w2, out2)) = next {
            rms_norm(out, w2, out2, eps, false);
        }
    }

    /// Contiguous rows of `w.len()`.
    pub fn rms_norm(x: &[f32], w: &[f32], out: &mut [f32], eps: f32, accumulate: bool) {
        let n = w.len() as u32;
        let l = RowLayout::contiguous(x.len() as u32 / n, n);
        rms_norm_rows(x, w, out, l, eps, accumulate);
    }

    /// Reference of [`super::rms_norm_in_place`].
    pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], l: RowLayout, eps: f32) {
        let n = l.n as usize;
        for r in 0..l.rows as usize {
            let row = &mut x[r * l.x_stride as usize..][..n];
            let scale = rms_scale(row, eps);
            for i in 0..n {
                row[i] = (row[i] as f64 * scale * w[i] as f64) as f32;
            }
        }
    }

    fn rms_scale(row: &[f32], eps: f32) -> f64 {
        let ss: f64 = row.iter().map(|&v| v as f64 * v as f64).sum();
        1.0 / (ss / row.len() as f64 + eps as f64).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;

    /// Random rows `xs` (`rows × n`) and weights `ws` (`n`) of the given seeds and scales, and
    /// their uploads `x`, `w`.
    fn rows_and_weights(
        gpu: &Gpu,
        rows: usize,
        n: usize,
        (x_seed, w_seed): (u64, u64),
        (x_scale, w_scale): (f32, f32),
    ) -> (Vec<f32>, Vec<f32>, Tensor, Tensor) {
        let xs = random(rows * n, x_seed, x_scale);
        let ws = random(n, w_seed, w_scale);
        let x = gpu.upload_f32("x", &[rows, n], &xs).unwrap();
        let w = gpu.upload_f32("w", &[n], &ws).unwrap();
        (xs, ws, x, w)
    }

    /// Whether `rms_norm` holds rows of `n` in registers (REG; [`norm_shape`]).
    fn in_registers(gpu: &Gpu, n: u32) -> bool {
        norm_shape(gpu, n).1.is_some()
    }

    /// Max error relative to the row's scale: |got - want| / (max |want| + 1e-30), per case.
    fn rel_err(got: &[f32], want: &[f32]) -> f32 {
        let (d, _) = max_abs_diff(got, want);
        let m = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        d / (m + 1e-30)
    }

    /// f32 accumulation of n ≤ 16416 squares and inverseSqrt (≤ 2 ulp in WGSL) against an f64
    /// reference: ≤ 2e-7 of the row's max observed on lavapipe; the bound leaves margin for other
    /// reduction orders and fast-math rsqrt.
    const TOL: f32 = 2e-6;

    #[test]
    fn rms_norm_matches_cpu() {
        for gpu in gpu_variants() {
            for (case, &n) in [64usize, 576, 640, 1000, 8192, 8200, 16400].iter().enumerate() {
                let rows = if n >= 8192 { 2 } else { 5 };
                let xs = random(rows * n, 10 + case as u64, 4.0);
                let ws = random(n, 20 + case as u64, 1.5);
                let init = random(rows * n, 30 + case as u64, 2.0);
                for accumulate in [false, true] {
                    let x = gpu.upload_f32("x", &[rows, n], &xs).unwrap();
                    let w = gpu.upload_f32("w", &[n], &ws).unwrap();
                    let out = gpu.upload_f32("out", &[rows, n], &init).unwrap();
                    let k = rms_norm(&gpu, &x, &w, &out, 1e-6, accumulate).unwrap();
                    gpu.run(&[&k]).unwrap();
                    let got = gpu.read_f32(&out).unwrap();
                    let mut want = init.clone();
                    cpu::rms_norm(&xs, &ws, &mut want, 1e-6, accumulate);
                    let e = rel_err(&got, &want);
                    eprintln!("rms_norm n={n} acc={accumulate} subgroups={}: rel err {e:e}", gpu.caps.subgroups);
                    assert!(e < TOL, "n={n} acc={accumulate} subgroups={} rel err {e}", gpu.caps.subgroups);
                }
            }
        }
    }

    /// Gemma 4's last post-norm with the layer's output scale.
    #[test]
    fn rms_norm_residual_matches_cpu() {
        for gpu in gpu_variants() {
            let (rows, n) = (3usize, 640usize);
            let (xs, ws, x, w) = rows_and_weights(&gpu, rows, n, (61, 62), (4.0, 1.5));
            let init = random(rows * n, 63, 2.0);
            let out = gpu.upload_f32("out", &[rows, n], &init).unwrap();
            let k = rms_norm_residual(&gpu, &x, &w, &out, 1e-6, 0.37, None).unwrap();
            gpu.run(&[&k]).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let mut want = init.clone();
            cpu::rms_norm_residual(&xs, &ws, &mut want, 1e-6, 0.37, None);
            let e = rel_err(&got, &want);
            assert!(e < TOL, "subgroups={} rel err {e}", gpu.caps.subgroups);
            // With the next pre-norm in the same dispatch (rows of 640, 5376 and 8200 held in
            // registers (256 threads, or 512 over 4096 elements), of 16400 too long for them, and of
            // 70, not a multiple of 4): the residual as before, and its norm. STAGE (5376 and 8224:
            // in registers; 16416: not): the next norm's rows also staged for the
            // integer-dot-product matvec, word for word what quantize_x16's twin makes of them (from
            // the registers by shuffles, or re-read a thread a block).
            for (n, stage) in [
                (640usize, false),
                (5376, false),
                (8200, false),
                (16400, false),
                (70, false),
                (5376, true),
                (8224, true),
                (16416, true),
            ] {
                let seed = if stage { 68 } else { 64 };
                let xs = random(rows * n, seed, 4.0);
                let (ws, w2s) = (random(n, seed + 1, 1.5), random(n, seed + 2, 1.5));
                let init = random(rows * n, seed + 3, 2.0);
                let (x, w, w2) = (
                    gpu.upload_f32("x", &[rows, n], &xs).unwrap(),
                    gpu.upload_f32("w", &[n], &ws).unwrap(),
                    gpu.upload_f32("w2", &[n], &w2s).unwrap(),
                );
                let out = gpu.upload_f32("out", &[rows, n], &init).unwrap();
                let out2 = gpu.upload_f32("out2", &[rows, n], &vec![7.0; rows * n]).unwrap();
                let words = crate::ops::matmul::gguf::staged_x_words(rows, n);
                let staged = gpu.upload_u32("xs", &[words], &vec![7; words]).unwrap();
                let k = if stage {
                    rms_norm_residual_staged(&gpu, &x, &w, &out, 1e-6, 0.37, (&w2, &out2), &staged).unwrap()
                } else {
                    rms_norm_residual(&gpu, &x, &w, &out, 1e-6, 0.37, Some((&w2, &out2))).unwrap()
                };
                assert_eq!(k.variant.split('+').any(|f| f == "STAGE"), stage);
                // In registers with subgroups of 8+: staged by shuffles (STAGE8).
                let eight = stage && in_registers(&gpu, n as u32) && gpu.caps.shuffles8();
                assert_eq!(k.variant.split('+').any(|f| f == "STAGE8"), eight, "n={n}");
                gpu.run(&[&k]).unwrap();
                let (got, got2) = (gpu.read_f32(&out).unwrap(), gpu.read_f32(&out2).unwrap());
                let (mut want, mut want2) = (init.clone(), vec![0.0; rows * n]);
                cpu::rms_norm_residual(&xs, &ws, &mut want, 1e-6, 0.37, Some((&w2s, &mut want2)));
                assert!(rel_err(&got, &want) < TOL, "n={n} stage={stage}: the residual");
                // The second norm meets the first's f32 rounding: twice the bound.
                let e = rel_err(&got2, &want2);
                assert!(
                    e < 2.0 * TOL,
                    "n={n} stage={stage} subgroups={}: the next norm, rel err {e}",
                    gpu.caps.subgroups
                );
                if stage {
                    let got_xs = gpu.read_u32(&staged).unwrap();
                    assert_eq!(got_xs, crate::ops::matmul::gguf::cpu::quantize_x16(&got2, n), "n={n}: the staged rows");
                }
            }
            // Scale 1 is the plain residual add, bit for bit.
            let a = gpu.upload_f32("a", &[rows, n], &init).unwrap();
            let b = gpu.upload_f32("b", &[rows, n], &init).unwrap();
            let ka = rms_norm_residual(&gpu, &x, &w, &a, 1e-6, 1.0, None).unwrap();
            let kb = rms_norm(&gpu, &x, &w, &b, 1e-6, true).unwrap();
            gpu.run(&[&ka, &kb]).unwrap();
            assert_eq!(gpu.read_f32(&a).unwrap(), gpu.read_f32(&b).unwrap());
        }
    }

    /// A pre-norm staging its own output (STAGE without NEXT): out as rms_norm writes it, bit for
    /// bit, and xs word for word what quantize_x16's twin makes of that out; rows in registers
    /// (640; 5376 at 512 threads), staged from them by shuffles where subgroups allow, and rows too
    /// long for them (16416: re-read a thread a block).
    #[test]
    fn rms_norm_staged_matches_cpu() {
        for gpu in gpu_variants() {
            for (case, &n) in [640usize, 5376, 16416].iter().enumerate() {
                let rows = 3;
                let (xs, ws, x, w) = rows_and_weights(&gpu, rows, n, (90 + case as u64, 95 + case as u64), (4.0, 1.5));
                let (a, b) = (
                    gpu.upload_f32("a", &[rows, n], &vec![7.0; rows * n]).unwrap(),
                    gpu.upload_f32("b", &[rows, n], &vec![7.0; rows * n]).unwrap(),
                );
                let words = crate::ops::matmul::gguf::staged_x_words(rows, n);
                let staged = gpu.upload_u32("xs", &[words], &vec![7; words]).unwrap();
                let k = rms_norm_staged(&gpu, &x, &w, &a, 1e-6, &staged).unwrap();
                let has = |f: &str| k.variant.split('+').any(|v| v == f);
                assert!(has("STAGE") && !has("NEXT"), "{}", k.variant);
                let eight = in_registers(&gpu, n as u32) && gpu.caps.shuffles8();
                assert_eq!(has("STAGE8"), eight, "n={n}");
                let plain = rms_norm(&gpu, &x, &w, &b, 1e-6, false).unwrap();
                gpu.run(&[&k, &plain]).unwrap();
                let got = gpu.read_f32(&a).unwrap();
                assert_eq!(got, gpu.read_f32(&b).unwrap(), "n={n}: out as the plain norm writes it");
                let mut want = vec![0.0; rows * n];
                cpu::rms_norm(&xs, &ws, &mut want, 1e-6, false);
                let e = rel_err(&got, &want);
                assert!(e < TOL, "n={n} subgroups={}: rel err {e}", gpu.caps.subgroups);
                let got_xs = gpu.read_u32(&staged).unwrap();
                assert_eq!(got_xs, crate::ops::matmul::gguf::cpu::quantize_x16(&got, n), "n={n}: the staged rows");
            }
            // Rows not of whole 32-element blocks are refused.
            let x = gpu.upload_f32("x", &[2, 48], &random(96, 99, 1.0)).unwrap();
            let w = gpu.upload_f32("w", &[48], &random(48, 98, 1.0)).unwrap();
            let out = gpu.upload_f32("o", &[2, 48], &[0.0; 96]).unwrap();
            let xs = gpu.upload_u32("xs", &[64], &[0; 64]).unwrap();
            assert!(rms_norm_staged(&gpu, &x, &w, &out, 1e-6, &xs).is_err());
        }
    }

    #[test]
    fn rms_norm_strided_and_views() {
        for gpu in gpu_variants() {
            let n = 576usize;
            let rows = 4usize;
            // x: rows of stride 640 (padding never read); out: stride 600 (padding never written).
            let (xs_stride, out_stride) = (640usize, 600usize);
            let xs = random(rows * xs_stride, 41, 3.0);
            let ws = random(n, 42, 1.0);
            let init = random(rows * out_stride, 43, 1.0);
            let layout =
                RowLayout { rows: rows as u32, n: n as u32, x_stride: xs_stride as u32, out_stride: out_stride as u32 };
            for accumulate in [false, true] {
                let x = gpu.upload_f32("x", &[rows, xs_stride], &xs).unwrap();
                let w = gpu.upload_f32("w", &[n], &ws).unwrap();
                let out = gpu.upload_f32("out", &[rows, out_stride], &init).unwrap();
                let k = rms_norm_rows(&gpu, &x, &w, &out, layout, 1e-6, accumulate).unwrap();
                gpu.run(&[&k]).unwrap();
                let got = gpu.read_f32(&out).unwrap();
                let mut want = init.clone();
                cpu::rms_norm_rows(&xs, &ws, &mut want, layout, 1e-6, accumulate);
                assert!(rel_err(&got, &want) < TOL, "strided acc={accumulate}");
                // Padding untouched.
                for r in 0..rows {
                    assert_eq!(
                        got[r * out_stride + n..(r + 1) * out_stride],
                        init[r * out_stride + n..(r + 1) * out_stride]
                    );
                }
            }

            // The final norm on the last row only: x is a view (offset 3 * 640 * 4 = 7680 bytes,
            // a multiple of 256), out a 1-row tensor.
            let x_full = gpu.upload_f32("x", &[rows, xs_stride], &xs).unwrap();
            let x_last = x_full.view((rows - 1) * xs_stride, &[1, n]);
            let w = gpu.upload_f32("w", &[n], &ws).unwrap();
            let out = gpu.upload_f32("out", &[1, n], &init[..n]).unwrap();
            let k = rms_norm(&gpu, &x_last, &w, &out, 1e-6, false).unwrap();
            gpu.run(&[&k]).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let mut want = vec![0.0; n];
            cpu::rms_norm(&xs[(rows - 1) * xs_stride..][..n], &ws, &mut want, 1e-6, false);
            assert!(rel_err(&got, &want) < TOL, "last-row view");

            // A misaligned view is an error, not a device validation failure.
            let bad = x_full.view(1, &[1, n]);
            assert!(rms_norm(&gpu, &bad, &w, &out, 1e-6, false).is_err());
        }
    }

    #[test]
    fn rms_norm_in_place_matches_cpu() {
        for gpu in gpu_variants() {
            // Per-head norm: 3 tokens x 4 heads of 64 (q of a fused qkv row would use strides).
            let (rows, n) = (12usize, 64usize);
            let (xs, ws, x, w) = rows_and_weights(&gpu, rows, n, (51, 52), (5.0, 1.0));
            let layout = RowLayout::contiguous(rows as u32, n as u32);
            let k = rms_norm_in_place(&gpu, &x, &w, layout, 1e-6).unwrap();
            gpu.run(&[&k]).unwrap();
            let got = gpu.read_f32(&x).unwrap();
            let mut want = xs.clone();
            cpu::rms_norm_in_place(&mut want, &ws, layout, 1e-6);
            assert!(rel_err(&got, &want) < TOL);
        }
    }
}
