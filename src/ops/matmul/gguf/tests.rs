use super::batch::*;
use super::matmul::*;
use super::matvec::*;
use super::*;
use crate::dtype::to_f32;
use crate::error::Result;
use crate::gpu::tensor::test_util::*;
use crate::gpu::{ElemType, Gpu, Tensor};
use crate::ops::matmul::test_util::{check, reference, RefWeight};
use crate::ops::matmul::{check_operands, linear, linear_in, MatmulConfig, Operands, MATVEC_MAX_T};

pub(crate) use crate::weights::test_util::{random_blocks, scale_field_offsets, TYPES};

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

/// Quantized W for [`reference`]: a type's raw rows of `k` elements.
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
pub(crate) struct Quant<'a>(pub DType, pub &'a [u8]);

impl RefWeight for Quant<'_> {
    fn linear(&self, x: &[f32], k: usize, bias: Option<&[f32]>, y: &mut [f32], accumulate: bool) {
        cpu::linear_quant(x, self.0, self.1, k, bias, y, accumulate).unwrap();
    }
    fn magnitudes(&self, k: usize) -> Vec<f32> {
        let n = self.1.len() / self.0.byte_size(k).unwrap();
        magnitudes(self.0, self.1, n * k)
    }
}

/// Which kernel a case runs.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// What `linear` picks for a quantized W.
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
    let opts = LinearOpts { accumulate, ld_out: None, glu: None, batch: false, one_token: false, softcap: None };
    let s = check_operands("test", &x, n, k, bias, &y, opts);
    let op = Operands { bias, ..Operands::new(&x, &w, &y, opts) };
    let kern = match path {
        Path::Auto => linear(gpu, &x, &w, bias, &y, opts),
        Path::Matvec => matvec_quant(gpu, &op, &s, QMatvecConfig::new(gpu, ty, &s)),
        Path::MatvecFloat => {
            let c = QMatvecConfig::new(gpu, ty, &s).with(|s| s.dp4 = false);
            matvec_quant(gpu, &op, &s, c)
        }
        Path::MatvecDp4 => {
            let auto = QMatvecConfig::new(gpu, ty, &s);
            let c = auto.with(|s| s.dp4 = dp4_fits(gpu, ty, k, auto.shape.wg, auto.shape.tok));
            matvec_quant(gpu, &op, &s, c)
        }
        Path::NarrowMatvec => {
            let auto = QMatvecConfig::new(gpu, ty, &s);
            let sg = if auto.shape.subgroups { gpu.caps.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
            let tpr = (4 * auto.shape.tok).max(8).max(sg);
            matvec_quant(gpu, &op, &s, auto.with(|s| s.tpr = tpr))
        }
        Path::Matmul(cfg) => matmul_quant(gpu, &op, &s, cfg),
        Path::Wide(wg, tpr) => {
            assert!(stages_whole(gpu, ty, k, wg), "{ty} K = {k} does not stage whole at {wg} threads");
            let c = QMatvecConfig::new(gpu, ty, &s).with(|s| (s.wg, s.tpr, s.dp4) = (wg, tpr, true));
            matvec_quant(gpu, &op, &s, c)
        }
    }
    .unwrap();
    gpu.run(&[&kern]).unwrap();
    let got = gpu.read_f32(&y).unwrap();
    // The DP4 kernel meets x as staged (cpu::stage_x16).
    let dp4 = match path {
        Path::Auto | Path::Matvec | Path::NarrowMatvec => {
            (t <= MATVEC_MAX_T || !matches!(path, Path::Auto)) && QMatvecConfig::new(gpu, ty, &s).shape.dp4
        }
        Path::MatvecDp4 => {
            let auto = QMatvecConfig::new(gpu, ty, &s);
            dp4_fits(gpu, ty, k, auto.shape.wg, auto.shape.tok)
        }
        Path::MatvecFloat | Path::Matmul(_) => false,
        Path::Wide(..) => true,
    };
    let xs = if dp4 { cpu::stage_x16(&xv, k) } else { xv.clone() };
    let (want, tol) = reference(&xs, &Quant(ty, &raw), k, with_bias.then_some(&bv[..]), &y0, accumulate);
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
    use crate::ops::elementwise::Activation;
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
                let opts = LinearOpts {
                    accumulate: kind != 0,
                    ld_out: None,
                    glu: None,
                    batch: false,
                    one_token: false,
                    softcap: None,
                };
                // T = 1: the DP4 kernel where the type allows it (kind 0, 1), else as picked.
                let s = LinearShape { t, n, k, ld_out: n, cols: n };
                let auto = QMatvecConfig::new(&gpu, ty, &s);
                let dp4 = if t == 1 {
                    dp4_fits(&gpu, ty, k, auto.shape.wg, 1) && (kind < 2 || auto.shape.dp4)
                } else {
                    auto.shape.dp4
                };
                let kern = if t == 1 {
                    matvec_quant(
                        &gpu,
                        &Operands { input, bias: Some(&b), ..Operands::new(&x, &w, &y, opts) },
                        &s,
                        auto.with(|s| s.dp4 = dp4),
                    )
                } else {
                    linear_in(&gpu, &x, input, &w, Some(&b), &y, opts)
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
                let (want, mut tol) = reference(&xin, &Quant(ty, &raw), k, Some(&bv[..]), &y0, kind != 0);
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
/// (`cpu::round_f16`: x and W's values rounded to f16), every type, tails in T and N,
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
            let kern = matmul_quant_coop(&gpu, &Operands { bias, ..Operands::new(&x, &w, &y, opts) }, &s, &[]).unwrap();
            gpu.run(&[&kern]).unwrap();
            let got = gpu.read_f32(&y).unwrap();
            let mut want = y0.clone();
            let bias_v = with_bias.then_some(&bv[..]);
            let w16 = cpu::round_f16(&cpu::dequantize_rows(ty, &raw, k).unwrap());
            super::super::cpu::linear(&cpu::round_f16(&xv), &w16, k, bias_v, &mut want, acc);
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
    use crate::ops::elementwise;
    use crate::ops::elementwise::Activation;
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
                let opts = LinearOpts { accumulate: acc, glu: glu.then_some(act), batch: true, ..Default::default() };
                let kern = linear_in(&gpu, &x, input, &w, with_bias.then_some(&b), &y, opts).unwrap();
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
                    let (want, mut tol) = reference(&xin, &Quant(ty, &raw), k, None, &vec![0.0; t * n], false);
                    if kind > 0 {
                        let wf = to_f32(ty, &raw, n * k).unwrap();
                        add_input_rounding(&mut tol, &xin, &wf, k, if kind == 2 { 16.0 } else { 8.0 } * eps_f);
                    }
                    let (want, tol) = glu_expected(&want, &tol, act);
                    check(&got, &want, &tol, &what);
                } else {
                    let (want, mut tol) = reference(&xin, &Quant(ty, &raw), k, bias, &y0, acc);
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
            // (rw: the batch kernel's rows a workgroup, forced; None: as linear picks)
            let rows = |xs: &[f32], t: usize, rw: Option<u32>| {
                let x = gpu.upload_f32("x", &[t, k], xs).unwrap();
                let y = gpu.empty("y", &[t, n], ElemType::F32).unwrap();
                let opts = LinearOpts { batch: true, ..Default::default() };
                let kern = match rw {
                    None => linear_in(&gpu, &x, input, &w, None, &y, opts),
                    Some(rw) => {
                        let s = check_operands("test", &x, n, k, None, &y, opts);
                        matvec_quant_batch(&gpu, &Operands { input, ..Operands::new(&x, &w, &y, opts) }, &s, rw, None)
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
            for (t, rev, rw) in
                [(3, false, None), (5, false, Some(32)), (13, false, Some(16)), (32, false, None), (32, true, Some(32))]
            {
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
                let (want, tol) = reference(&xv[..k], &Quant(ty, &raw), k, None, &vec![0.0; n], false);
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
    act: crate::ops::elementwise::Activation,
) -> (Vec<f32>, Vec<f32>) {
    use crate::ops::elementwise::cpu::{gelu_tanh, silu};
    use crate::ops::elementwise::Activation;
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
    use crate::ops::elementwise::Activation;
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
                let dp4 = dp4 && dp4_fits(&gpu, ty, k, auto.shape.wg, auto.shape.tok);
                let kern = matvec_quant(
                    &gpu,
                    &Operands { input, ..Operands::new(&x, &w, &y, opts) },
                    &s,
                    auto.with(|s| s.dp4 = dp4),
                );
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
                let (want, mut tol) = reference(&xin, &Quant(ty, &raw), k, None, &vec![0.0; t * n], false);
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
                let whole = |t: DType| has_dp4(t) && stages_whole(&gpu, t, k, cfg.shape.wg);
                let mut modes = vec![(cfg.shape.dp4, auto_dp4), (false, false)];
                if whole(ta) && whole(tb) {
                    modes.push((true, true));
                }
                for (a_dp4, b_dp4) in modes {
                    mixed += 1;
                    let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
                    let (bm, ym, c) = (Some(&b), &y, cfg.with(|s| s.dp4 = a_dp4));
                    let kern = matvec_quant_mixed_with(
                        &gpu,
                        &Operands { input, bias: bm, ..Operands::new(&x, &wa, ym, opts) },
                        (&wb, na),
                        c,
                        b_dp4,
                    )
                    .unwrap();
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
                        let (want, mut tol) = reference(xp, &Quant(ty, raw), k, Some(&bv[c0..c1]), &y0[c0..c1], acc);
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
    assert!(mixed >= 4 * gpu_variants().len() && dp4_runs >= 2, "only {mixed} mixed dispatches ran, {dp4_runs} DP4");
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
                    worst = worst.max(run_case(&gpu, ty, 1, 70, k, with_bias, acc, Path::MatvecDp4, seed + i as u64));
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
                    let opts = LinearOpts { accumulate, ld_out: Some(v), glu: None, ..Default::default() };
                    keep.push(linear(&gpu, &x, w, None, &view, opts).unwrap());
                }
                gpu.run(&keep.iter().collect::<Vec<_>>()).unwrap();
                let got = gpu.read_f32(&logits).unwrap();
                let (want, tol) = reference(&xv, &Quant(ty, &raw), k, None, &y0, accumulate);
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
            let kern = linear(&gpu, &x, &w, Some(&b), &y, LinearOpts::default()).unwrap();
            gpu.run(&[&kern]).unwrap();
            let (want, tol) = reference(&xv, &Quant(ty, &raw), k, Some(&bv), &vec![0.0; t * 128], false);
            check(&gpu.read_f32(&y).unwrap(), &want, &tol, &format!("{ty} qkv T={t}"));
        }
    }
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
        assert!(cfg.shape.dp4 || gpu.info.backend != wgpu::Backend::Vulkan, "{ty}: no DP4 on Vulkan");
        let kern = matvec_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, cfg.with(|s| s.dp4 = true));
        gpu.run(&[&kern.unwrap()]).unwrap();
        let (want, tol) = reference(&staged, &Quant(ty, &raw), k, None, &vec![0.0; n], false);
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
                assert!(stages_whole(&gpu, ty, k, auto.shape.wg), "{ty} K = {k}");
                let mut outs = Vec::new();
                for prefetch in [false, true] {
                    let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
                    let cfg = auto.with(|s| (s.dp4, s.prefetch) = (true, prefetch));
                    let kern =
                        matvec_quant(&gpu, &Operands { input, ..Operands::new(&x, &w, &y, opts) }, &s, cfg).unwrap();
                    assert_eq!(kern.variant.contains("PREFETCH"), prefetch);
                    gpu.run(&[&kern]).unwrap();
                    outs.push(gpu.read_f32(&y).unwrap());
                }
                let what = format!("{ty} K = {k} norm = {norm} sg = {}", gpu.caps.subgroups);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&outs[0]), bits(&outs[1]), "{what}: PREFETCH changed the sums");
                if !norm {
                    let (want, tol) =
                        reference(&cpu::stage_x16(&xv, k), &Quant(ty, &raw), k, None, &vec![0.0; n], false);
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
                    let kern =
                        matvec_quant(&gpu, &Operands { input, ..Operands::new(&x, &w, &y, opts) }, &s, cfg).unwrap();
                    assert_eq!(kern.variant.contains("XG"), matches!(input, Input::Staged(_)), "{what}");
                    gpu.run(&[&stage, &kern]).unwrap();
                    gpu.read_f32(&y).unwrap()
                };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                let mut outs = Vec::new();
                for (wg, prefetch) in [(tpr, false), (tpr, true), (4 * tpr, false)] {
                    let cfg = auto.with(|s| (s.wg, s.tpr, s.tok, s.dp4, s.prefetch) = (wg, tpr, 1, true, prefetch));
                    outs.push(run(cfg, Input::Staged(&xs)));
                }
                assert_eq!(bits(&outs[0]), bits(&outs[1]), "{what}: PREFETCH changed the sums");
                assert_eq!(bits(&outs[0]), bits(&outs[2]), "{what}: the workgroup size changed the sums");
                if stages_whole(&gpu, ty, k, 4 * tpr) {
                    let cfg = auto.with(|s| (s.wg, s.tpr, s.tok, s.dp4, s.prefetch) = (4 * tpr, tpr, 1, true, false));
                    assert_eq!(bits(&outs[0]), bits(&run(cfg, Input::Plain)), "{what}: not the DP4 kernel's sums");
                }
                let (want, tol) = reference(&cpu::stage_x16(&xv, k), &Quant(ty, &raw), k, None, &vec![0.0; n], false);
                check(&outs[0], &want, &tol, &what);
                // The rule's own configuration (up to 128-lane row groups), with a bias and
                // accumulating into y (the binding after the bias).
                let cfg = QMatvecConfig::new(&gpu, ty, &s).for_input(&gpu, ty, &s, Input::Staged(&xs));
                let (bias_v, y0) = (random(n, seed + 3, 0.5), random(n, seed + 4, 0.5));
                let b = gpu.upload_f32("b", &[n], &bias_v).unwrap();
                let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
                let acc = LinearOpts { accumulate: true, ..opts };
                let kern = matvec_quant(
                    &gpu,
                    &Operands { input: Input::Staged(&xs), bias: Some(&b), ..Operands::new(&x, &w, &y, acc) },
                    &s,
                    cfg,
                )
                .unwrap();
                gpu.run(&[&stage, &kern]).unwrap();
                let (want, tol) = reference(&cpu::stage_x16(&xv, k), &Quant(ty, &raw), k, Some(&bias_v), &y0, true);
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
            let tok4 = QMatvecConfig::new(&gpu, ty, &s5).with(|s| s.dp4 = true);
            assert_eq!(tok4.shape.tok, 4);
            let one = tok4.with(|s| s.tok = 1);
            let run = |t: usize, cfg: QMatvecConfig| {
                let x = gpu.upload_f32("x", &[t, k], &xv[..t * k]).unwrap();
                let y = gpu.empty("y", &[t, n], ElemType::F32).unwrap();
                let s = LinearShape { t, n, k, ld_out: n, cols: n };
                let kern = matvec_quant(
                    &gpu,
                    &Operands { input, ..Operands::new(&x, &w, &y, LinearOpts::default()) },
                    &s,
                    cfg,
                )
                .unwrap();
                gpu.run(&[&kern]).unwrap();
                gpu.read_f32(&y).unwrap()
            };
            let whole = run(t, tok4);
            let chunked = run(t, QMatvecConfig { max_kc: 8, ..tok4 });
            assert!(dp4_chunk(&gpu, ty, k, tok4.shape.wg, 4).unwrap() > 8, "{ty}: the whole row was chunked anyway");
            let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(bits(&whole, &chunked), "{ty} norm={norm}: chunks of 8 blocks change the sums");
            for (j, row) in whole.chunks(n).enumerate() {
                let x1 = gpu.upload_f32("x", &[1, k], &xv[j * k..(j + 1) * k]).unwrap();
                let y1 = gpu.empty("y", &[1, n], ElemType::F32).unwrap();
                let s1 = LinearShape { t: 1, n, k, ld_out: n, cols: n };
                for cfg in [one, QMatvecConfig { max_kc: 8, ..one }] {
                    let kern = matvec_quant(
                        &gpu,
                        &Operands { input, ..Operands::new(&x1, &w, &y1, LinearOpts::default()) },
                        &s1,
                        cfg,
                    );
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
            let (want, mut tol) = reference(&xin, &Quant(ty, &raw), k, None, &vec![0.0; t * n], false);
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
        (c.shape.wg, c.shape.tpr, c.shape.dp4)
    };
    if !vulkan {
        for (ty, n, k) in [(DType::Q6_K, 1536, 8960), (DType::Q4_K, 1536, 1536)] {
            assert!(!pick(ty, n, k).2, "{ty} {n} x {k}: DP4 off Vulkan");
        }
        return;
    }
    // Q6_K rows of 8960: 512 threads where they stage whole there (the H100's 48 KiB, not 32).
    let w512 = gpu.limits.max_compute_invocations_per_workgroup >= 512 && stages_whole(&gpu, DType::Q6_K, 8960, 512);
    let down = if w512 { (512, 128, true) } else { (256, 64, true) };
    assert_eq!(pick(DType::Q6_K, 1536, 8960), down, "Qwen2.5-1.5B's Q6_K down");
    assert_eq!(pick(DType::Q6_K, 896, 4864), (256, 128, true), "Qwen2.5-0.5B's Q6_K down");
    assert_eq!(pick(DType::Q4_1, 576, 1536), (256, 64, true), "SmolLM2's Q4_1 down");
    assert_eq!(pick(DType::Q6_K, 256, 1536), (256, 32, true), "Qwen2.5-1.5B's Q6_K v");
    // Gemma-4-31B's Q4_K gate_up: 1024 threads where the row stages whole there (the H100's
    // 48 KiB; not lavapipe's 32), else 256; its o projection (5376 rows) stays at 256.
    let wide = gpu.limits.max_compute_invocations_per_workgroup >= 1024 && stages_whole(&gpu, DType::Q4_K, 5376, 1024);
    assert_eq!(pick(DType::Q4_K, 43008, 5376), (if wide { 1024 } else { 256 }, 32, true), "Gemma's gate_up");
    assert_eq!(pick(DType::Q4_K, 5376, 8192), (256, 32, true), "Gemma's o projection");
    // Gemma's wide DP4 rows load an iteration ahead; Qwen2.5's do not.
    let prefetch = |ty: DType, n: usize, k: usize| QMatvecConfig::new(&gpu, ty, &shape(n, k)).shape.prefetch;
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
        let c = QMatvecConfig::new(&gpu, DType::Q4_K, &shape(n, k)).for_input(&gpu, DType::Q4_K, &shape(n, k), norm);
        (c.shape.wg, c.shape.tpr, c.shape.dp4)
    };
    assert_eq!(normed(2048, 1536), (256, 64, true), "Qwen2.5-1.5B's q/k/v with its norm fused");
    assert!(!normed(1152, 896).2, "Qwen2.5-0.5B-like q/k/v with its norm fused");
    // The 1.5B's q/k (Q4_K) and Q6_K v mix, both DP4 in the q/k's configuration; the 0.5B's
    // Q5_0 q/k and Q8_0 v, both float.
    assert_eq!(
        mix_config(&gpu, DType::Q4_K, DType::Q6_K, &shape(1792, 1536), norm).map(|(c, b)| (
            c.shape.wg,
            c.shape.tpr,
            c.shape.dp4,
            b
        )),
        Some((256, 64, true, true))
    );
    assert_eq!(
        mix_config(&gpu, DType::Q5_0, DType::Q8_0, &shape(1024, 896), norm).map(|(c, b)| (c.shape.dp4, b)),
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
        let opts =
            LinearOpts { accumulate: true, ld_out: None, glu: None, batch: false, one_token: false, softcap: None };
        let s = check_operands("test", &x, n, k, None, &y, opts);
        let mut cfg = QMatvecConfig::new(&gpu, ty, &s);
        cfg.shape.tpr = if cfg.shape.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
        cfg.shape.wg = cfg.shape.tpr;
        let kern = matvec_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, cfg).unwrap();
        assert!(kern.workgroups[1] > 1, "{:?}", kern.workgroups);
        gpu.run(&[&kern]).unwrap();
        let xs = if cfg.shape.dp4 { cpu::stage_x16(&xv, k) } else { xv };
        let (want, tol) = reference(&xs, &Quant(ty, &raw), k, None, &y0, true);
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
    let _ = linear(&gpu, &x, &w, None, &y, LinearOpts::default());
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
