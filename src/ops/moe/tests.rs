use super::*;
use crate::dtype::to_f32;
use crate::dtype::DType;
use crate::gpu::tensor::test_util::*;
use crate::ops::elementwise::Activation;
use crate::ops::matmul::gguf::tests as qt;
use crate::ops::matmul::tests as ft;
use crate::ops::{elementwise, norm};

const EPS: f32 = f32::EPSILON / 2.0;

/// Per token, `top_k` distinct experts of `experts` in a random order (as a router picks them).
fn random_ids(t: usize, experts: usize, top_k: usize, seed: u64) -> Vec<u32> {
    let r = random(t * experts, seed, 1.0);
    (0..t)
        .flat_map(|ti| {
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| r[ti * experts + a].total_cmp(&r[ti * experts + b]));
            order.into_iter().take(top_k).map(|e| e as u32)
        })
        .collect()
}

/// Relative error bound of a router weight: each exp (q_exp) within 2 ulp, the sum's
/// additions (k - 1 in a row with `norm_topk`; else a thread's pair and a tree of log2(256)
/// levels: 9 per term) one rounding each of the running sum (<= the total), the division 2.5
/// ulp (Vulkan's bound); ulp = 2^-24 relative. 1e-6 or less for k <= 8.
fn router_tol(top_k: usize, norm_topk: bool) -> f32 {
    let adds = if norm_topk { top_k - 1 } else { 9 };
    (2.0 + 2.0 + 2.5 + adds as f32) * EPS * 1.0001
}

#[test]
fn router_matches_cpu() {
    let mut worst = 0f32;
    for gpu in gpu_variants() {
        let mut seed = 10;
        for (experts, top_k) in [(8usize, 2usize), (64, 8), (256, 8), (512, 16), (60, 4), (300, 1)] {
            for (t, rank) in [(1usize, false), (1, true), (5, experts <= RANK_MAX_EXPERTS)] {
                for norm_topk in [true, false] {
                    seed += 10;
                    // Rows of E + 1: column E holds a shared expert's gate logit, larger than
                    // every expert's (it must not be picked).
                    let ld = experts + 1;
                    let mut lv = random(t * ld, seed, 4.0);
                    for ti in 0..t {
                        lv[ti * ld + experts] = 100.0;
                    }
                    let logits = gpu.upload_f32("logits", &[t, ld], &lv).unwrap();
                    let ids = gpu.upload_u32("ids", &[t, top_k], &vec![7777; t * top_k]).unwrap();
                    let weights = gpu.upload_f32("weights", &[t, top_k], &vec![-1.0; t * top_k]).unwrap();
                    let kern =
                        router(&gpu, &logits, ld, experts, top_k, &ids, &weights, norm_topk, rank, false).unwrap();
                    gpu.run(&[&kern]).unwrap();
                    let (got_i, got_w) = (gpu.read_u32(&ids).unwrap(), gpu.read_f32(&weights).unwrap());
                    let mut want_i = vec![0u32; t * top_k];
                    let mut want_w = vec![0f32; t * top_k];
                    cpu::moe_router(&lv, ld, experts, top_k, &mut want_i, &mut want_w, norm_topk, false);
                    let what =
                        format!("E={experts} k={top_k} T={t} norm={norm_topk} rank={rank} sg={}", gpu.caps.subgroups);
                    assert_eq!(got_i, want_i, "{what}: ids");
                    let tol = router_tol(top_k, norm_topk);
                    for (i, (g, w)) in got_w.iter().zip(&want_w).enumerate() {
                        let rel = (g - w).abs() / w.abs();
                        assert!(rel <= tol, "{what}: weight {i}: got {g}, want {w} (rel {rel:e} > {tol:e})");
                        worst = worst.max(rel / tol);
                    }
                }
            }
        }
    }
    eprintln!("router_matches_cpu: worst relative error / tolerance = {worst:.3}");
}

/// The shared expert's slot: id E after the routed top-k, weight sigmoid(gate logit).
#[test]
fn router_shared_slot_matches_cpu() {
    for gpu in gpu_variants() {
        for (experts, top_k, t) in [(8usize, 2usize, 3usize), (256, 8, 1), (300, 4, 2)] {
            let ld = experts + 1;
            let lv = random(t * ld, 5 + experts as u64, 4.0);
            let logits = gpu.upload_f32("logits", &[t, ld], &lv).unwrap();
            let n = t * (top_k + 1);
            let ids = gpu.upload_u32("ids", &[n], &vec![7777; n]).unwrap();
            let weights = gpu.upload_f32("weights", &[n], &vec![-1.0; n]).unwrap();
            let kern = moe_router_shared(&gpu, &logits, ld, experts, top_k, &ids, &weights, true).unwrap();
            gpu.run(&[&kern]).unwrap();
            let (mut want_i, mut want_w) = (vec![0u32; n], vec![0f32; n]);
            cpu::moe_router(&lv, ld, experts, top_k, &mut want_i, &mut want_w, true, true);
            assert_eq!(gpu.read_u32(&ids).unwrap(), want_i, "E={experts} k={top_k}");
            // The routed weights as in router_matches_cpu; the gate's sigmoid: exp within
            // 3 + 2|x| ulps (Vulkan), then 1 + e and a division.
            let tol = router_tol(top_k, true).max((6.0 + 2.0 * 12.0) * EPS);
            for (i, (g, w)) in gpu.read_f32(&weights).unwrap().iter().zip(&want_w).enumerate() {
                assert!((g - w).abs() / w.abs() <= tol, "E={experts} k={top_k} slot {i}: {g} vs {w}");
            }
        }
        let (logits, ids, weights) = (
            gpu.upload_f32("l", &[1, 8], &[0.5; 8]).unwrap(),
            gpu.empty("i", &[3], ElemType::U32).unwrap(),
            gpu.empty("w", &[3], ElemType::F32).unwrap(),
        );
        assert!(moe_router_shared(&gpu, &logits, 8, 8, 2, &ids, &weights, true).is_err(), "no gate column");
    }
}

#[test]
fn router_ties_and_extremes() {
    // Equal logits rank lower index first; an -inf logit ranks last but still counts as an
    // expert (weight 0); large spreads (exp underflows) stay finite.
    let gpu = gpu();
    let (experts, top_k, t) = (40usize, 6usize, 3usize);
    let mut lv = vec![0f32; t * experts];
    for (i, v) in lv.iter_mut().enumerate() {
        *v = ((i * 7) % 5) as f32;
    }
    lv[experts + 3] = f32::NEG_INFINITY;
    for v in &mut lv[2 * experts..] {
        *v = -200.0;
    }
    lv[2 * experts + 11] = 0.0;
    for (norm_topk, rank) in [(true, false), (false, false), (true, true), (false, true)] {
        let logits = gpu.upload_f32("logits", &[t, experts], &lv).unwrap();
        let ids = gpu.empty("ids", &[t, top_k], ElemType::U32).unwrap();
        let weights = gpu.empty("weights", &[t, top_k], ElemType::F32).unwrap();
        let kern = router(&gpu, &logits, experts, experts, top_k, &ids, &weights, norm_topk, rank, false).unwrap();
        gpu.run(&[&kern]).unwrap();
        let mut want_i = vec![0u32; t * top_k];
        let mut want_w = vec![0f32; t * top_k];
        cpu::moe_router(&lv, experts, experts, top_k, &mut want_i, &mut want_w, norm_topk, false);
        assert_eq!(gpu.read_u32(&ids).unwrap(), want_i, "norm={norm_topk} rank={rank}");
        let got_w = gpu.read_f32(&weights).unwrap();
        for (g, w) in got_w.iter().zip(&want_w) {
            assert!((g - w).abs() <= router_tol(top_k, norm_topk) * w.abs(), "{g} vs {w}");
        }
    }
    // Errors, not device failures.
    let logits = gpu.upload_f32("logits", &[1, 8], &[0.5; 8]).unwrap();
    let ids = gpu.empty("ids", &[1, 4], ElemType::U32).unwrap();
    let weights = gpu.empty("weights", &[1, 4], ElemType::F32).unwrap();
    assert!(moe_router(&gpu, &logits, 8, 8, 9, &ids, &weights, true).is_err());
    assert!(moe_router(&gpu, &logits, 4, 8, 4, &ids, &weights, true).is_err());
    assert!(moe_router(&gpu, &ids, 8, 8, 4, &ids, &weights, true).is_err());
}

/// The weight types of the expert tests.
#[derive(Clone, Copy, Debug)]
enum Wt {
    F16,
    Q(DType),
}

/// Which projection a case runs.
#[derive(Clone, Copy, Debug)]
enum Proj {
    /// x (T, K), slots_per_row = k: the fused norm and/or the GLU epilogue.
    GateUp { norm: bool, glu: Option<Activation> },
    /// x (T·k, K) (or (T·k, 2K) [gate | up] with `gated`), slots_per_row = 1.
    Down { gated: bool, accumulate: bool },
}

/// One case of the expert projections: `t` tokens, `top_k` slots each over a stack of
/// `experts`, N × K per expert, with `grouped` the slots grouped by expert first
/// ([`moe_group`]; the batch kernel, which meets x as it is: no DP4 staging).
#[derive(Clone, Copy)]
struct Case {
    wt: Wt,
    t: usize,
    top_k: usize,
    experts: usize,
    n: usize,
    k: usize,
    proj: Proj,
    seed: u64,
    grouped: bool,
}

impl Case {
    /// Runs one expert projection of random operands against the CPU twin; returns the worst
    /// error / tolerance. Tolerance per slot: the plain projection's of the matmul tests (f16:
    /// `ft::reference`; quantized: `qt::reference` over the dequantized expert), plus the fused
    /// input's own rounding (8·eps·S for the norm, 16·eps·S for the activation, S = Σ|x_in · w|,
    /// as in `fused_inputs_match_cpu_ops`), through `qt::glu_expected` for GLU. Where the
    /// quantized kernel stages x for DP4, the reference meets x as `stage_x16` stages it (and the
    /// gated case allows an activation ulp to move an element by one staging step, as the gguf
    /// tests do).
    fn run(self, gpu: &Gpu) -> f32 {
        let Case { wt, t, top_k, experts, n, k, proj, seed, grouped } = self;
        let (spr, xrows, xcols, glu, acc) = match proj {
            Proj::GateUp { glu, .. } => (top_k, t, k, glu, false),
            Proj::Down { gated, accumulate } => (1, t * top_k, if gated { 2 * k } else { k }, None, accumulate),
        };
        let slots = t * top_k;
        let cols = if glu.is_some() { n / 2 } else { n };
        let mut idv = random_ids(t, experts, top_k, seed);
        if slots > 2 {
            // An id past the stack reads its last expert.
            idv[slots - 1] = experts as u32 + 3;
        }
        let xv = random(xrows * xcols, seed + 1, 1.0);
        let gv: Vec<f32> = random(k, seed + 2, 0.5).into_iter().map(|v| 1.0 + v).collect();
        let y0 = random(slots * cols, seed + 3, 1.0);
        let x = gpu.upload_f32("x", &[xrows, xcols], &xv).unwrap();
        let g = gpu.upload_f32("g", &[k], &gv).unwrap();
        let ids = gpu.upload_u32("ids", &[t, top_k], &idv).unwrap();
        let y = gpu.upload_f32("y", &[slots, cols], &y0).unwrap();
        let input = match proj {
            Proj::GateUp { norm: true, .. } => Input::Norm { weight: &g, eps: 1e-6 },
            Proj::Down { gated: true, .. } => Input::Gated(Activation::SiluGated),
            _ => Input::Plain,
        };
        let opts = LinearOpts { accumulate: acc, ld_out: None, glu, batch: false, one_token: false, softcap: None };
        // The weights, as the kernel reads them and as f32 (an expert's [N, K] rows at e·N·K).
        let rows = experts * n;
        let shape = LinearShape { t: slots, n, k, ld_out: cols, cols };
        let (wf, raw, quant, fw, dp4): (Vec<f32>, Vec<u8>, Option<QuantWeight>, Option<Tensor>, bool) = match wt {
            Wt::F16 => {
                let (h, f) = ft::weights(rows, k, seed + 4);
                (f, Vec::new(), None, Some(gpu.upload_f16("w", &[rows, k], &h).unwrap()), false)
            }
            Wt::Q(ty) => {
                let raw = qt::random_blocks(ty, rows, k, seed + 4);
                let wf = to_f32(ty, &raw, rows * k).unwrap();
                let q = QuantWeight::new(gpu, "w", ty, [rows, k], &raw).unwrap();
                (wf, raw, Some(q), None, !grouped && matmul::gguf::experts_use_dp4(gpu, ty, &shape))
            }
        };
        let w = match wt {
            Wt::F16 => ExpertWeight::F16 { w: fw.as_ref().unwrap(), experts },
            Wt::Q(_) => ExpertWeight::Quant { w: quant.as_ref().unwrap(), experts },
        };
        let got = if grouped {
            // The table starts dirty: every entry must be written.
            let len = groups_len(slots, experts);
            let groups = gpu.upload_u32("groups", &[len], &vec![0xdead_beef; len]).unwrap();
            let group = moe_group(gpu, &ids, experts, &groups).unwrap();
            let kern = linear_experts(gpu, &x, input, &w, &ids, Some(&groups), spr, &y, opts).unwrap();
            gpu.run(&[&group, &kern]).unwrap();
            gpu.read_f32(&y).unwrap()
        } else {
            let kern = linear_experts(gpu, &x, input, &w, &ids, None, spr, &y, opts).unwrap();
            gpu.run(&[&kern]).unwrap();
            gpu.read_f32(&y).unwrap()
        };

        let what = format!(
            "{wt:?} {proj:?} T={t} k={top_k} E={experts} N={n} K={k} dp4={dp4} grouped={grouped} f16={} sg={}",
            gpu.caps.f16, gpu.caps.subgroups
        );
        // x as the kernel meets it, per x row.
        let xin: Vec<f32> = match input {
            Input::Norm { .. } if dp4 => {
                // The kernel stages x ⊙ g and scales the sums by the norm's r at the end.
                let xg: Vec<f32> = xv.iter().zip(gv.iter().cycle()).map(|(a, b)| a * b).collect();
                let staged = matmul::gguf::cpu::stage_x16(&xg, k);
                let r: Vec<f32> = xv
                    .chunks(k)
                    .map(|row| 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / k as f32 + 1e-6).sqrt())
                    .collect();
                staged.iter().enumerate().map(|(i, v)| v * r[i / k]).collect()
            }
            Input::Norm { .. } => {
                let mut o = vec![0f32; xv.len()];
                norm::cpu::rms_norm(&xv, &gv, &mut o, 1e-6, false);
                o
            }
            Input::Gated(act) => {
                let mut o = vec![0f32; xrows * k];
                elementwise::cpu::gated_act(&xv, &mut o, k, act);
                if dp4 {
                    matmul::gguf::cpu::stage_x16(&o, k)
                } else {
                    o
                }
            }
            Input::Plain if dp4 => matmul::gguf::cpu::stage_x16(&xv, k),
            Input::Plain => xv.clone(),
            Input::Staged(_) => unreachable!("the expert tests stage no x apart"),
        };
        // The twin (pre-GLU when GLU: glu_expected applies it with its tolerance).
        let mut pre = if glu.is_some() { vec![0f32; slots * n] } else { y0.clone() };
        cpu::linear_experts(&xin, &wf, experts, k, &idv, spr, None, &mut pre, acc);
        if let Some(act) = glu {
            // The twin's own GLU is what glu_expected computes.
            let mut direct = vec![0f32; slots * cols];
            cpu::linear_experts(&xin, &wf, experts, k, &idv, spr, glu, &mut direct, false);
            let (via, _) = qt::glu_expected(&pre, &vec![0.0; pre.len()], act);
            assert_eq!(direct, via, "the CPU twin's GLU");
        }
        let mut tol = Vec::with_capacity(slots * n);
        let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
        for s in 0..slots {
            let e = (idv[s] as usize).min(experts - 1);
            let xr = &xin[s / spr * k..][..k];
            let we = &wf[e * n * k..(e + 1) * n * k];
            let y0s: Vec<f32> = if acc { y0[s * n..(s + 1) * n].to_vec() } else { vec![0.0; n] };
            let (want_s, mut tol_s) = match wt {
                Wt::F16 => ft::reference(xr, we, k, None, &y0s, acc),
                Wt::Q(ty) => {
                    let rb = ty.byte_size(k).unwrap();
                    ft::reference(xr, &qt::Quant(ty, &raw[e * n * rb..(e + 1) * n * rb]), k, None, &y0s, acc)
                }
            };
            assert_eq!(want_s, pre[s * n..(s + 1) * n], "{what}: the CPU twin, slot {s}");
            if !matches!(input, Input::Plain) {
                let mut s_terms = vec![0f32; n];
                matmul::cpu::linear(&abs(xr), &abs(we), k, None, &mut s_terms, false);
                let extra = if matches!(input, Input::Gated(_)) { 16.0 } else { 8.0 } * EPS;
                tol_s.iter_mut().zip(&s_terms).for_each(|(tl, s)| *tl += extra * s);
            }
            if dp4 && matches!(input, Input::Gated(_)) {
                let d = qt::stage_steps16(xr);
                for (r, tl) in tol_s.iter_mut().enumerate() {
                    *tl += 4.0 * we[r * k..(r + 1) * k].iter().zip(&d).fold(0f32, |m, (w, d)| m.max(w.abs() * d));
                }
            }
            tol.extend(tol_s);
        }
        let (want, tol) = match glu {
            Some(act) => qt::glu_expected(&pre, &tol, act),
            None => (pre, tol),
        };
        ft::check(&got, &want, &tol, &what)
    }
}

#[test]
fn linear_experts_match_cpu() {
    let mut worst = 0f32;
    for gpu in gpu_variants() {
        let mut seed = 100;
        let types =
            [Wt::F16, Wt::Q(DType::Q4_K), Wt::Q(DType::Q8_0), Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false })];
        // A small Qwen3.5-MoE: hidden H = 256, expert intermediate I = 256 (K of the down
        // projection: whole Q4_K blocks), 12 experts.
        let (h, inter, experts) = (256usize, 256usize, 12usize);
        for wt in types {
            for t in [1usize, 5] {
                for top_k in [2usize, 8] {
                    let projs = [
                        (Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }, 2 * inter, h),
                        (Proj::GateUp { norm: false, glu: None }, 2 * inter, h),
                        (Proj::Down { gated: false, accumulate: false }, h, inter),
                    ];
                    for (proj, n, k) in projs {
                        seed += 10;
                        worst = worst.max(Case { wt, t, top_k, experts, n, k, proj, seed, grouped: false }.run(&gpu));
                    }
                }
            }
            // The fused activation before the down projection, accumulating; GELU-tanh GLU
            // with the norm.
            seed += 10;
            let down = Proj::Down { gated: true, accumulate: true };
            worst = worst
                .max(Case { wt, t: 3, top_k: 4, experts, n: h, k: inter, proj: down, seed, grouped: false }.run(&gpu));
            let gelu = Proj::GateUp { norm: true, glu: Some(Activation::GeluTanhGated) };
            worst = worst.max(
                Case { wt, t: 2, top_k: 3, experts, n: 2 * inter, k: h, proj: gelu, seed: seed + 5, grouped: false }
                    .run(&gpu),
            );
        }
        // f16 off the models' shapes: N not a multiple of 4, K % 8 == 4 (two-word loads) and
        // K % 4 == 2 (one-word loads), a 1-expert stack.
        for (n, k, proj) in [
            (70usize, 68usize, Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }),
            (33, 70, Proj::Down { gated: false, accumulate: true }),
            (130, 96, Proj::GateUp { norm: false, glu: None }),
        ] {
            seed += 10;
            worst =
                worst.max(Case { wt: Wt::F16, t: 5, top_k: 2, experts: 3, n, k, proj, seed, grouped: false }.run(&gpu));
        }
        worst = worst.max(
            Case {
                wt: Wt::F16,
                t: 2,
                top_k: 1,
                experts: 1,
                n: 64,
                k: 64,
                proj: Proj::GateUp { norm: false, glu: None },
                seed: 7,
                grouped: false,
            }
            .run(&gpu),
        );
    }
    eprintln!("linear_experts_match_cpu: worst |error| / tolerance = {worst:.3}");
}

/// The grouping against its twin: the tile table exactly, the order as each expert's set of
/// slots (its order within an expert is the GPU's); skewed routing (most slots on a few
/// experts: many full tiles and a partial one), unused experts, ids past the stack, one expert.
#[test]
fn moe_group_matches_cpu() {
    let gpu = gpu();
    for (slots, experts, seed) in [(37usize, 5usize, 1u64), (300, 12, 2), (4608, 257, 3), (9, 1, 4), (1, 3, 5)] {
        let r = random(slots, seed, 1.0);
        // Skewed: |r|^3 crowds the ids toward expert 0; every 7th id past the stack.
        let ids: Vec<u32> = r
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 7 == 3 { experts as u32 + 2 } else { (v.abs().powi(3) * experts as f32) as u32 })
            .collect();
        let len = groups_len(slots, experts);
        let idt = gpu.upload_u32("ids", &[slots], &ids).unwrap();
        let groups = gpu.upload_u32("groups", &[len], &vec![0xdead_beef; len]).unwrap();
        gpu.run(&[&moe_group(&gpu, &idt, experts, &groups).unwrap()]).unwrap();
        let got = gpu.read_u32(&groups).unwrap();
        let (order, tiles) = cpu::moe_group(&ids, experts);
        let got_tiles: Vec<[u32; 3]> = got[slots..].chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        assert_eq!(got_tiles, tiles, "tiles, S={slots} E={experts}");
        // Each tile's slots (as sets) are its expert's, and the order is a permutation.
        let mut seen = vec![false; slots];
        for [e, first, count] in tiles.iter().copied().filter(|t| t[2] > 0) {
            for &s in &got[first as usize..(first + count) as usize] {
                assert!(!seen[s as usize], "slot {s} twice (S={slots} E={experts})");
                seen[s as usize] = true;
                assert_eq!((ids[s as usize] as usize).min(experts - 1), e as usize, "slot {s} in expert {e}'s tile");
            }
        }
        assert!(seen.iter().all(|&v| v), "every slot placed (S={slots} E={experts})");
        let mut sorted = got[..slots].to_vec();
        sorted.sort_unstable();
        let mut want = order.clone();
        want.sort_unstable();
        assert_eq!(sorted, want);
    }
}

/// The grouped expert projections (prefill's) against the CPU twin: enough tokens that experts
/// have several tiles (full and partial), every fused input and epilogue, the quantized types
/// of the real checkpoints.
#[test]
fn grouped_experts_match_cpu() {
    let mut worst = 0f32;
    for gpu in gpu_variants() {
        let mut seed = 500;
        let (h, inter, experts) = (256usize, 256usize, 12usize);
        for wt in [
            Wt::Q(DType::Q4_K),
            Wt::Q(DType::Q6_K),
            Wt::Q(DType::Q8_0),
            Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false }),
        ] {
            for (t, top_k) in [(40usize, 3usize), (13, 8)] {
                let projs = [
                    (Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }, 2 * inter, h),
                    (Proj::GateUp { norm: false, glu: None }, 2 * inter, h),
                    (Proj::Down { gated: false, accumulate: false }, h, inter),
                    (Proj::Down { gated: true, accumulate: true }, h, inter),
                ];
                for (proj, n, k) in projs {
                    seed += 10;
                    worst = worst.max(Case { wt, t, top_k, experts, n, k, proj, seed, grouped: true }.run(&gpu));
                }
            }
        }
    }
    eprintln!("grouped_experts_match_cpu: worst |error| / tolerance = {worst:.3}");
}

#[test]
fn combine_matches_cpu() {
    // Tolerance: the kernel adds k products and the gated shared term into an f32 sum, then
    // adds it to x: each of those k + 2 roundings errs by at most eps of S = Σ|terms| + |x|
    // (sigmoid's exp within 3 + 2|g| ulp for |g| <= 4 here, the add and divide 2.5 each: 16 ulp
    // of the shared term): (k + 2 + 16)·eps·S, doubled for margin.
    for gpu in gpu_variants() {
        let mut seed = 300;
        for (t, top_k) in [(1usize, 2usize), (1, 8), (5, 8), (3, 1)] {
            for with_shared in [false, true] {
                seed += 10;
                let (h, experts) = (256usize, 16usize);
                let ld = experts + 1;
                let yv = random(t * top_k * h, seed, 2.0);
                let wv: Vec<f32> = random(t * top_k, seed + 1, 0.5).into_iter().map(|v| v + 0.5).collect();
                let sv = random(t * h, seed + 2, 2.0);
                let gv = random(t * ld, seed + 3, 4.0);
                let xv = random(t * h, seed + 4, 1.0);
                let y = gpu.upload_f32("y", &[t * top_k, h], &yv).unwrap();
                let w = gpu.upload_f32("w", &[t, top_k], &wv).unwrap();
                let so = gpu.upload_f32("shared", &[t, h], &sv).unwrap();
                let gate = gpu.upload_f32("gate", &[t, ld], &gv).unwrap();
                let x = gpu.upload_f32("x", &[t, h], &xv).unwrap();
                let shared =
                    with_shared.then_some(SharedExpert { out: &so, gate: &gate, gate_ld: ld, gate_col: experts });
                let kern = moe_combine(&gpu, &y, &w, shared, &x).unwrap();
                gpu.run(&[&kern]).unwrap();
                let got = gpu.read_f32(&x).unwrap();
                let mut want = xv.clone();
                let sh = with_shared.then_some((&sv[..], &gv[..], ld, experts));
                cpu::moe_combine(&yv, &wv, sh, &mut want, h);
                let mut mag = xv.iter().map(|v| v.abs()).collect::<Vec<_>>();
                let ya: Vec<f32> = yv.iter().map(|v| v.abs()).collect();
                let sa: Vec<f32> = sv.iter().map(|v| v.abs()).collect();
                cpu::moe_combine(&ya, &wv, with_shared.then_some((&sa[..], &gv[..], ld, experts)), &mut mag, h);
                let tol: Vec<f32> = mag.iter().map(|m| 2.0 * (top_k + 18) as f32 * EPS * m).collect();
                let what = format!("T={t} k={top_k} shared={with_shared} sg={}", gpu.caps.subgroups);
                ft::check(&got, &want, &tol, &what);
            }
        }
    }
}

#[test]
fn moe_block_routes_on_the_gpu() {
    // A whole sparse MoE block as the model records it (norm fused into the router linear and
    // the experts' gate_up, the shared expert's gate in the router's column E): the expert ids
    // go from the router to the projections in a GPU buffer. Against the CPU twins chained on
    // the GPU's routing (its ids, checked against the CPU router's on the GPU's logits).
    for gpu in gpu_variants() {
        let (t, h, inter, experts, top_k) = (3usize, 128usize, 64usize, 16usize, 4usize);
        let seed = 900;
        let xv = random(t * h, seed, 1.0);
        let gv: Vec<f32> = random(h, seed + 1, 0.5).into_iter().map(|v| 1.0 + v).collect();
        let (rh, rf) = ft::weights(experts + 1, h, seed + 2);
        let (guh, guf) = ft::weights(experts * 2 * inter, h, seed + 3);
        let (dh, df) = ft::weights(experts * h, inter, seed + 4);
        let (sgh, sgf) = ft::weights(2 * inter, h, seed + 5);
        let (sdh, sdf) = ft::weights(h, inter, seed + 6);
        let x = gpu.upload_f32("x", &[t, h], &xv).unwrap();
        let g = gpu.upload_f32("g", &[h], &gv).unwrap();
        let router_w = gpu.upload_f16("router", &[experts + 1, h], &rh).unwrap();
        let gu_w = gpu.upload_f16("gate_up_exps", &[experts * 2 * inter, h], &guh).unwrap();
        let d_w = gpu.upload_f16("down_exps", &[experts * h, inter], &dh).unwrap();
        let sg_w = gpu.upload_f16("shared gate_up", &[2 * inter, h], &sgh).unwrap();
        let sd_w = gpu.upload_f16("shared down", &[h, inter], &sdh).unwrap();
        let logits = gpu.empty("logits", &[t, experts + 1], ElemType::F32).unwrap();
        let ids = gpu.empty("ids", &[t, top_k], ElemType::U32).unwrap();
        let weights = gpu.empty("weights", &[t, top_k], ElemType::F32).unwrap();
        let act = gpu.empty("act", &[t * top_k, inter], ElemType::F32).unwrap();
        let ys = gpu.empty("ys", &[t * top_k, h], ElemType::F32).unwrap();
        let sact = gpu.empty("shared act", &[t, inter], ElemType::F32).unwrap();
        let sout = gpu.empty("shared out", &[t, h], ElemType::F32).unwrap();
        let norm = Input::Norm { weight: &g, eps: 1e-6 };
        let glu = LinearOpts { glu: Some(Activation::SiluGated), ..Default::default() };
        let plain = LinearOpts::default();
        let gu = ExpertWeight::F16 { w: &gu_w, experts };
        let dn = ExpertWeight::F16 { w: &d_w, experts };
        let kernels = [
            matmul::linear_in(&gpu, &x, norm, &router_w, None, &logits, plain).unwrap(),
            moe_router(&gpu, &logits, experts + 1, experts, top_k, &ids, &weights, true).unwrap(),
            linear_experts(&gpu, &x, norm, &gu, &ids, None, top_k, &act, glu).unwrap(),
            linear_experts(&gpu, &act, Input::Plain, &dn, &ids, None, 1, &ys, plain).unwrap(),
            matmul::linear_in(&gpu, &x, norm, &sg_w, None, &sact, glu).unwrap(),
            matmul::linear(&gpu, &sact, &sd_w, None, &sout, plain).unwrap(),
            moe_combine(
                &gpu,
                &ys,
                &weights,
                Some(SharedExpert { out: &sout, gate: &logits, gate_ld: experts + 1, gate_col: experts }),
                &x,
            )
            .unwrap(),
        ];
        gpu.run(&kernels.iter().collect::<Vec<_>>()).unwrap();
        let got = gpu.read_f32(&x).unwrap();

        let lg = gpu.read_f32(&logits).unwrap();
        let (gi, gw) = (gpu.read_u32(&ids).unwrap(), gpu.read_f32(&weights).unwrap());
        let mut want_i = vec![0u32; t * top_k];
        let mut want_w = vec![0f32; t * top_k];
        cpu::moe_router(&lg, experts + 1, experts, top_k, &mut want_i, &mut want_w, true, false);
        assert_eq!(gi, want_i, "router on the GPU's logits");
        let mut xn = vec![0f32; t * h];
        norm::cpu::rms_norm(&xv, &gv, &mut xn, 1e-6, false);
        let mut lw = vec![0f32; t * (experts + 1)];
        matmul::cpu::linear(&xn, &rf, h, None, &mut lw, false);
        let (d, _) = max_abs_diff(&lg, &lw);
        assert!(d < 1e-3, "router logits differ by {d}");
        let mut a = vec![0f32; t * top_k * inter];
        cpu::linear_experts(&xn, &guf, experts, h, &gi, top_k, Some(Activation::SiluGated), &mut a, false);
        let mut yv = vec![0f32; t * top_k * h];
        cpu::linear_experts(&a, &df, experts, inter, &gi, 1, None, &mut yv, false);
        let mut sa = vec![0f32; t * 2 * inter];
        matmul::cpu::linear(&xn, &sgf, h, None, &mut sa, false);
        let mut sact_v = vec![0f32; t * inter];
        elementwise::cpu::gated_act_interleaved(&sa, &mut sact_v, inter, Activation::SiluGated);
        let mut so = vec![0f32; t * h];
        matmul::cpu::linear(&sact_v, &sdf, inter, None, &mut so, false);
        let mut want = xv.clone();
        cpu::moe_combine(&yv, &gw, Some((&so, &lg, experts + 1, experts)), &mut want, h);
        // Four f32 projections chained, each within 4·eps·sqrt(K)·S of its f64 twin (the
        // matmul tests' bound: 2.7e-6 of S = Σ|terms| at K = 128), S a few times the outputs'
        // scale: 1e-5 of the largest output bounds the chain, and a misrouted expert or weight
        // moves outputs by about their scale.
        let (d, at) = max_abs_diff(&got, &want);
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("moe block: max |diff| {d:e} at {at}, outputs up to {scale} (sg={})", gpu.caps.subgroups);
        assert!(d <= 1e-5 * scale, "moe block: got {} want {} at {at}", got[at], want[at]);
    }
}

/// A batch decode step's expert projections ([`LinearOpts::batch`], ids `(T, k)`): a token's slots
/// give the same bits whatever the batch (T, the token's row, the other tokens' experts, some
/// shared with it). Per slot (each slot's matvec tuned as for one token's k slots) they are the
/// bits of the one-token pass (`batch` unset, T = 1: checked against the CPU twin by
/// `linear_experts_match_cpu`); grouped (quantized stacks: [`moe_group`] and the batch kernel)
/// those of the token grouped alone (the grouped kernel's twin test: `grouped_experts_match_cpu`).
/// Both projections: gate_up with the fused norm and GLU, down plain.
#[test]
fn batch_slots_do_not_depend_on_the_batch() {
    let (h, inter, experts, top_k) = (2048usize, 256usize, 6usize, 3usize);
    for gpu in gpu_variants() {
        let xv = random(h, 31, 1.0);
        let gv: Vec<f32> = random(h, 32, 0.5).into_iter().map(|v| 1.0 + v).collect();
        let g = gpu.upload_f32("g", &[h], &gv).unwrap();
        let token_ids: Vec<u32> = vec![4, 1, 5];
        for wt in [Wt::F16, Wt::Q(DType::Q8_0), Wt::Q(DType::Q4_K)] {
            let (f16_gu, f16_dn, q_gu, q_dn);
            let (gu, dn) = match wt {
                Wt::F16 => {
                    f16_gu =
                        gpu.upload_f16("gu", &[experts * 2 * inter, h], &ft::weights(experts * 2 * inter, h, 33).0);
                    f16_dn = gpu.upload_f16("dn", &[experts * h, inter], &ft::weights(experts * h, inter, 34).0);
                    let (gu, dn) = (f16_gu.as_ref().unwrap(), f16_dn.as_ref().unwrap());
                    (ExpertWeight::F16 { w: gu, experts }, ExpertWeight::F16 { w: dn, experts })
                }
                Wt::Q(ty) => {
                    let blocks = |rows, k, seed| qt::random_blocks(ty, rows, k, seed);
                    q_gu =
                        QuantWeight::new(&gpu, "gu", ty, [experts * 2 * inter, h], &blocks(experts * 2 * inter, h, 35));
                    q_dn = QuantWeight::new(&gpu, "dn", ty, [experts * h, inter], &blocks(experts * h, inter, 36));
                    let (gu, dn) = (q_gu.as_ref().unwrap(), q_dn.as_ref().unwrap());
                    (ExpertWeight::Quant { w: gu, experts }, ExpertWeight::Quant { w: dn, experts })
                }
            };
            // The token's slots' (gate_up, down) outputs as row `row` of a step of `t` tokens (the
            // others random, their experts random), bits.
            let run = |t: usize, row: usize, batch: bool, grouped: bool| -> (Vec<u32>, Vec<u32>) {
                let mut ids = random_ids(t, experts, top_k, 40 + t as u64);
                ids[row * top_k..][..top_k].copy_from_slice(&token_ids);
                let mut x = random(t * h, 50 + t as u64, 1.0);
                x[row * h..][..h].copy_from_slice(&xv);
                let x = gpu.upload_f32("x", &[t, h], &x).unwrap();
                let ids = gpu.upload_u32("ids", &[t, top_k], &ids).unwrap();
                let act = gpu.empty("act", &[t * top_k, inter], ElemType::F32).unwrap();
                let y = gpu.empty("y", &[t * top_k, h], ElemType::F32).unwrap();
                let len = groups_len(t * top_k, experts);
                let groups = gpu.empty("groups", &[len], ElemType::U32).unwrap();
                let table = grouped.then_some(&groups);
                let glu = LinearOpts { glu: Some(Activation::SiluGated), batch, ..Default::default() };
                let plain = LinearOpts { batch, ..Default::default() };
                let norm = Input::Norm { weight: &g, eps: 1e-6 };
                let mut kernels = Vec::new();
                if grouped {
                    kernels.push(moe_group(&gpu, &ids, experts, &groups).unwrap());
                }
                kernels.push(linear_experts(&gpu, &x, norm, &gu, &ids, table, top_k, &act, glu).unwrap());
                kernels.push(linear_experts(&gpu, &act, Input::Plain, &dn, &ids, table, 1, &y, plain).unwrap());
                gpu.run(&kernels.iter().collect::<Vec<_>>()).unwrap();
                let bits =
                    |v: Vec<f32>, n: usize| v[row * top_k * n..][..top_k * n].iter().map(|x| x.to_bits()).collect();
                (bits(gpu.read_f32(&act).unwrap(), inter), bits(gpu.read_f32(&y).unwrap(), h))
            };
            let grouping: &[bool] = if matches!(wt, Wt::F16) { &[false] } else { &[false, true] };
            for &grouped in grouping {
                let what = format!("{wt:?} grouped={grouped} sg={}", gpu.caps.subgroups);
                let alone = run(1, 0, true, grouped);
                if !grouped {
                    assert!(alone == run(1, 0, false, false), "{what}: a batch of one vs the one-token pass");
                }
                for (t, row) in [(2, 1), (3, 0), (5, 3), (8, 7), (32, 17)] {
                    assert!(alone == run(t, row, true, grouped), "{what}: row {row} of {t} vs alone");
                }
            }
        }
    }
}
