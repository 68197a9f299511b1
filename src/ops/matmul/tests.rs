use super::*;
use crate::gpu::tensor::test_util::*;

pub(crate) use super::test_util::{check, reference, weights};

/// The soft-capping epilogue on every kernel family (f16 and Q4_K weights, matvec for one and
/// three tokens, the matmul for 40): each output is its uncapped projection (same kernel, same
/// sums) through the CPU twin, within the epilogue's own rounding (a few ulp of the cap).
/// The projections reach over 4x the cap, so both tails and the linear middle are met.
#[test]
fn softcap_epilogue_matches_cpu() {
    use crate::dtype::DType;
    use crate::ops::matmul::gguf::{tests::random_blocks, QuantWeight};
    let (n, k, cap) = (96usize, 256usize, 1.5f32);
    for gpu in gpu_variants() {
        let (wh, _) = weights(n, k, 7);
        let w16 = gpu.upload_f16("w", &[n, k], &wh).unwrap();
        let wq = QuantWeight::new(&gpu, "wq", DType::Q4_K, [n, k], &random_blocks(DType::Q4_K, n, k, 8)).unwrap();
        for t in [1usize, 3, 40] {
            let x = gpu.upload_f32("x", &[t, k], &random(t * k, 9 + t as u64, 1.0)).unwrap();
            for quant in [false, true] {
                let run = |softcap: Option<f32>| {
                    let y = gpu.empty("y", &[t, n], ElemType::F32).unwrap();
                    let opts = LinearOpts { softcap, ..Default::default() };
                    let kern = if quant {
                        linear_in(&gpu, &x, Input::Plain, &wq, None, &y, opts)
                    } else {
                        linear_in(&gpu, &x, Input::Plain, &w16, None, &y, opts)
                    }
                    .unwrap();
                    gpu.run(&[&kern]).unwrap();
                    gpu.read_f32(&y).unwrap()
                };
                let (plain, capped) = (run(None), run(Some(cap)));
                let top = plain.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(top > 4.0 * cap, "T={t} quant={quant}: projections reach only {top}");
                for (i, (&p, &c)) in plain.iter().zip(&capped).enumerate() {
                    let want = cpu::softcap(p, cap);
                    assert!(
                        (c - want).abs() <= 8.0 * f32::EPSILON * cap,
                        "T={t} quant={quant} [{i}]: softcap({p}) = {c}, want {want}"
                    );
                }
            }
        }
    }
}

/// Which kernel a test case runs.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// matvec, even for many tokens.
    Matvec,
    /// The tiled matmul with a given tile, even for one token.
    Matmul(MatmulConfig),
}
const TILE4: MatmulConfig = MatmulConfig { tile: 4, bk: 32 };
const TILE8: MatmulConfig = MatmulConfig { tile: 8, bk: 16 };

/// Runs one linear layer on fresh random operands and checks it against the reference.
#[allow(clippy::too_many_arguments)]
fn run_case(gpu: &Gpu, t: usize, n: usize, k: usize, with_bias: bool, accumulate: bool, path: Path, seed: u64) -> f32 {
    let what = format!(
        "T={t} N={n} K={k} bias={with_bias} acc={accumulate} {path:?} f16={} sg={}",
        gpu.caps.f16, gpu.caps.subgroups
    );
    let xv = random(t * k, seed, 1.0);
    let (wh, wf) = weights(n, k, seed + 1);
    let bv = random(n, seed + 2, 1.0);
    let y0 = random(t * n, seed + 3, 1.0);
    let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
    let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
    let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
    let y = gpu.upload_f32("y", &[t, n], &y0).unwrap();
    let bias = with_bias.then_some(&b);
    let opts = LinearOpts { accumulate, ld_out: None, glu: None, batch: false, one_token: false, softcap: None };
    let s = check_shapes(&x, &w, bias, &y, opts);
    let op = Operands { bias, ..Operands::new(&x, &w, &y, opts) };
    let kern = match path {
        Path::Matvec => matvec(gpu, &op, &s, MatvecConfig::new(gpu, &s)),
        Path::Matmul(cfg) => matmul(gpu, &op, &s, cfg),
    }
    .unwrap();
    gpu.run(&[&kern]).unwrap();
    let got = gpu.read_f32(&y).unwrap();
    let (want, tol) = reference(&xv, &wf, k, with_bias.then_some(&bv[..]), &y0, accumulate);
    check(&got, &want, &tol, &what)
}

#[test]
fn linear_matches_cpu() {
    let mut worst = 0.0f32;
    for gpu in gpu_variants() {
        let mut seed = 10;
        // matvec takes T = 1 alone, T = 2 and 3 in one pass of 4 tokens (padded), T = 67 in
        // 17 passes.
        for t in [1usize, 2, 3, 67] {
            // (100, 70): K % 4 == 2 (one-word loads); (130, 68): K % 8 == 4 (two-word loads).
            for (n, k) in [(64usize, 64usize), (100, 70), (130, 68), (576, 1536)] {
                if t == 2 && n * k > 100_000 {
                    continue;
                }
                // Bias and accumulate only change the epilogue: every combination on the small
                // shapes, both on at once on the large one (slow on lavapipe).
                let epilogues: &[(bool, bool)] = if n * k > 100_000 {
                    &[(true, true)]
                } else {
                    &[(false, false), (true, false), (false, true), (true, true)]
                };
                for &(with_bias, accumulate) in epilogues {
                    // Both kernels for every T (`linear` picks by T: the split-view test
                    // goes through it).
                    for path in [Path::Matvec, Path::Matmul(TILE4)] {
                        seed += 10;
                        worst = worst.max(run_case(&gpu, t, n, k, with_bias, accumulate, path, seed));
                    }
                }
            }
        }
    }
    eprintln!("linear_matches_cpu: worst |error| / tolerance = {worst:.3}");
}

/// A fused input (the RMSNorm before a projection, the gated activation before the down
/// projection) against the CPU ops run one after the other. Tolerance: `reference`'s for the
/// projection of the CPU's input, plus the fused op's own rounding, which scales each term
/// by a relative error: for NORM, WGSL's inverseSqrt (2 ulp) and the products x·g·r in a
/// different order (2 ulp): 8·eps·S with margin; for GATED, act(x) = x / (1 + exp(-x)) with
/// |x| ≤ 1 here: exp errs by at most 3 + 2|x| ulp (Vulkan), the add and divide by 1 each,
/// so under 8 ulp a term: 16·eps·S. S = Σ|terms| as in `reference`.
#[test]
fn fused_inputs_match_cpu_ops() {
    use crate::ops::{elementwise, norm};
    let eps_f = f32::EPSILON / 2.0;
    for gpu in gpu_variants() {
        let mut seed = 500;
        // K = 1536: VEC4 (the models' widths); 12: VEC2; T = 3 and 5: passes of 4 tokens.
        for &(t, n, k) in &[(1, 67, 1536), (3, 130, 256), (5, 64, 96), (2, 33, 12)] {
            for input_kind in 0..3 {
                seed += 10;
                let (with_bias, accumulate) = (input_kind != 1, input_kind != 0);
                let act = if input_kind == 2 { Activation::GeluTanhGated } else { Activation::SiluGated };
                let gated = input_kind > 0;
                let xv = random(t * k * if gated { 2 } else { 1 }, seed, 1.0);
                let gv: Vec<f32> = random(k, seed + 4, 0.5).into_iter().map(|v| 1.0 + v).collect();
                let (wh, wf) = weights(n, k, seed + 1);
                let bv = random(n, seed + 2, 1.0);
                let y0 = random(t * n, seed + 3, 1.0);
                let x = gpu.upload_f32("x", &[t, xv.len() / t], &xv).unwrap();
                let g = gpu.upload_f32("g", &[k], &gv).unwrap();
                let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
                let b = gpu.upload_f32("bias", &[n], &bv).unwrap();
                let y = gpu.upload_f32("y", &[t, n], &y0).unwrap();
                let rms_eps = 1e-6;
                let input = if gated { Input::Gated(act) } else { Input::Norm { weight: &g, eps: rms_eps } };
                let opts =
                    LinearOpts { accumulate, ld_out: None, glu: None, batch: false, one_token: false, softcap: None };
                let kern = linear_in(&gpu, &x, input, &w, with_bias.then_some(&b), &y, opts).unwrap();
                gpu.run(&[&kern]).unwrap();
                let got = gpu.read_f32(&y).unwrap();
                let mut xin = vec![0f32; t * k];
                if gated {
                    elementwise::cpu::gated_act(&xv, &mut xin, k, act);
                } else {
                    norm::cpu::rms_norm(&xv, &gv, &mut xin, rms_eps, false);
                }
                let (want, mut tol) = reference(&xin, &wf, k, with_bias.then_some(&bv[..]), &y0, accumulate);
                // S for the extra term: Σ_k |x_in · w| (bias and y_old carry no fused error).
                let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
                let mut s_terms = vec![0f32; t * n];
                cpu::linear(&abs(&xin), &abs(&wf), k, None, &mut s_terms, false);
                let extra = if gated { 16.0 } else { 8.0 } * eps_f;
                tol.iter_mut().zip(&s_terms).for_each(|(tl, s)| *tl += extra * s);
                let what = format!("{input:?} T={t} N={n} K={k} f16={} sg={}", gpu.caps.f16, gpu.caps.subgroups);
                check(&got, &want, &tol, &what);
            }
        }
    }
}

#[test]
fn glu_epilogue_matches_cpu() {
    // The GLU epilogue over f16 rows (gate, up pairs), plain and with the fused norm, against
    // the plain projection's reference and act on the CPU (tolerance: gguf's glu_expected).
    use crate::ops::norm;
    for gpu in gpu_variants() {
        let mut seed = 800;
        for &(t, n, k, norm_in, act) in &[
            (1, 68, 1536, true, Activation::SiluGated),
            (3, 132, 256, false, Activation::GeluTanhGated),
            (5, 64, 96, true, Activation::SiluGated),
            (2, 36, 12, false, Activation::SiluGated),
        ] {
            seed += 10;
            let xv = random(t * k, seed, 1.0);
            let gv: Vec<f32> = random(k, seed + 4, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let (wh, wf) = weights(n, k, seed + 1);
            let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
            let g = gpu.upload_f32("g", &[k], &gv).unwrap();
            let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
            let y = gpu.upload_f32("y", &[t, n / 2], &random(t * n / 2, seed + 3, 1.0)).unwrap();
            let input = if norm_in { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
            let opts = LinearOpts { glu: Some(act), ..Default::default() };
            let kern = linear_in(&gpu, &x, input, &w, None, &y, opts).unwrap();
            gpu.run(&[&kern]).unwrap();
            let got = gpu.read_f32(&y).unwrap();
            let mut xin = xv.clone();
            if norm_in {
                norm::cpu::rms_norm(&xv, &gv, &mut xin, 1e-6, false);
            }
            let (want, mut tol) = reference(&xin, &wf, k, None, &vec![0.0; t * n], false);
            if norm_in {
                let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
                let mut s_terms = vec![0f32; t * n];
                cpu::linear(&abs(&xin), &abs(&wf), k, None, &mut s_terms, false);
                tol.iter_mut().zip(&s_terms).for_each(|(tl, s)| *tl += 8.0 * f32::EPSILON / 2.0 * s);
            }
            let (want, tol) = gguf::tests::glu_expected(&want, &tol, act);
            let what = format!("GLU {act:?} norm={norm_in} T={t} N={n} K={k} sg={}", gpu.caps.subgroups);
            check(&got, &want, &tol, &what);
        }
    }
}

#[test]
fn large_tiles_match_cpu() {
    // The 128×128 tile (picked for large T·N), with sizes off the tile edges.
    for gpu in gpu_variants() {
        run_case(&gpu, 130, 260, 96, true, true, Path::Matmul(TILE8), 7);
        run_case(&gpu, 20, 100, 70, false, false, Path::Matmul(TILE8), 8);
    }
}

#[test]
fn split_weight_writes_logit_views() {
    // A [V = 192, K] weight split into row chunks of 128 and 64, each its own tensor, writing
    // its columns of one [T, V] logits buffer through a view with ld_out = V.
    for gpu in gpu_variants() {
        // T = 1 and 5 run matvec, T = 70 the tiled matmul.
        for (t, k, accumulate) in [(1usize, 70usize, false), (5, 64, false), (70, 70, true), (1, 64, true)] {
            let v = 192;
            let chunks = [(0usize, 128usize), (128, 64)];
            let xv = random(t * k, 3, 1.0);
            let (wh, wf) = weights(v, k, 4);
            let bv = random(v, 5, 1.0);
            let y0 = random(t * v, 6, 1.0);
            let x = gpu.upload_f32("x", &[t, k], &xv).unwrap();
            let logits = gpu.upload_f32("logits", &[t, v], &y0).unwrap();
            let mut keep = Vec::new();
            for (r0, rows) in chunks {
                let w = gpu.upload_f16("w chunk", &[rows, k], &wh[r0 * k..(r0 + rows) * k]).unwrap();
                let b = gpu.upload_f32("bias chunk", &[rows], &bv[r0..r0 + rows]).unwrap();
                let view = Tensor {
                    buffer: logits.buffer.clone(),
                    offset: logits.offset + 4 * r0 as u64,
                    shape: vec![t, rows],
                    ty: ElemType::F32,
                };
                let opts = LinearOpts {
                    accumulate,
                    ld_out: Some(v),
                    glu: None,
                    batch: false,
                    one_token: false,
                    softcap: None,
                };
                keep.push(linear(&gpu, &x, &w, Some(&b), &view, opts).unwrap());
            }
            gpu.run(&keep.iter().collect::<Vec<_>>()).unwrap();
            let got = gpu.read_f32(&logits).unwrap();
            let (want, tol) = reference(&xv, &wf, k, Some(&bv), &y0, accumulate);
            check(&got, &want, &tol, &format!("split T={t} K={k} acc={accumulate}"));
        }
    }
}

#[test]
fn matvec_folded_grid() {
    // One row group (4 rows) per (small) workgroup: 65537 workgroups fold into a 2-D grid of
    // 32769 × 2, one of them padding.
    for gpu in gpu_variants() {
        let (n, k) = (262_145usize, 8usize);
        let xv = random(k, 1, 1.0);
        let (wh, wf) = weights(n, k, 2);
        let y0 = random(n, 3, 1.0);
        let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
        let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
        let y = gpu.upload_f32("y", &[1, n], &y0).unwrap();
        let opts = LinearOpts::default();
        let s = check_shapes(&x, &w, None, &y, opts);
        let mut cfg = MatvecConfig::new(&gpu, &s);
        cfg.tpr = if cfg.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
        cfg.wg = cfg.tpr;
        let kern = matvec(&gpu, &Operands::new(&x, &w, &y, opts), &s, cfg).unwrap();
        assert!(kern.workgroups[1] > 1, "{:?}", kern.workgroups);
        gpu.run(&[&kern]).unwrap();
        let got = gpu.read_f32(&y).unwrap();
        let (want, tol) = reference(&xv, &wf, k, None, &y0, false);
        check(&got, &want, &tol, "folded grid");
    }
}

#[test]
#[should_panic(expected = "x must be [T, K = 64]")]
fn shape_mismatch_panics() {
    let gpu = gpu();
    let x = gpu.empty("x", &[2, 32], ElemType::F32).unwrap();
    let w = gpu.empty("w", &[16, 64], ElemType::F16).unwrap();
    let y = gpu.empty("y", &[2, 16], ElemType::F32).unwrap();
    let _ = linear(&gpu, &x, &w, None, &y, LinearOpts::default());
}
