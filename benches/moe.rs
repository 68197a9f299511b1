//! A mixture-of-experts layer's kernels at Qwen3.5-35B-A3B's shape (H = 2048, 256 experts of
//! I = 512, top 8, a shared expert of 512; on a CPU device, lavapipe, a small one): the experts'
//! gate_up and down matvecs (f16, Q4_K, Q8_0, MLX 4-bit) against dense matvecs of the same bytes,
//! the per-slot prefill form, the router's two forms, the combine, and a whole f16 layer. Stacks of
//! one random expert repeated; each timed call routes to other experts (the weights come from
//! memory, not L2, as in a decode step). (Formerly the `#[ignore]`d unit test `bench_moe`.)
//!
//! ```text
//! cargo bench --bench moe
//! ```

mod common;

use common::{time_per_call, SLOW};
use wgpu_llm::dtype::DType;
use wgpu_llm::gpu::tensor::test_util::{gpu, random};
use wgpu_llm::gpu::{ElemType, Kernel, Tensor};
use wgpu_llm::ops::elementwise::Activation;
use wgpu_llm::ops::matmul::test_util::weights;
use wgpu_llm::ops::matmul::{linear, linear_in, Input, LinearOpts};
use wgpu_llm::ops::moe::{linear_experts, moe_combine, moe_router, router, ExpertWeight, SharedExpert};
use wgpu_llm::weights::test_util::random_blocks;
use wgpu_llm::weights::QuantWeight;

/// The experts' weight type.
#[derive(Clone, Copy, Debug)]
enum Wt {
    F16,
    Q(DType),
}

fn main() {
    // Qwen3.5-35B-A3B's MoE layer: H = 2048, 256 experts of I = 512, top 8, a shared expert of
    // 512. Stacks of one random expert repeated (the bytes each expert holds do not matter);
    // each timed call routes to other experts (R id sets / inputs), so that the weights come
    // from memory, not L2, as in a decode step.
    let gpu = gpu();
    let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
    let (h, inter, experts, top_k) = if big { (2048usize, 512usize, 256usize, 8usize) } else { (256, 256, 16, 4) };
    let reps = if big { 32usize } else { 2 };
    eprintln!(
        "{} f16={} sg={}: H={h} I={inter} E={experts} k={top_k}",
        gpu.info.name, gpu.caps.f16, gpu.caps.subgroups
    );
    let id_sets: Vec<Tensor> = (0..reps)
        .map(|r| {
            let v: Vec<u32> = (0..top_k).map(|j| ((r * top_k + j * 37) % experts) as u32).collect();
            gpu.upload_u32("ids", &[1, top_k], &v).unwrap()
        })
        .collect();
    let x1 = gpu.upload_f32("x", &[1, h], &random(h, 1, 1.0)).unwrap();
    let g = gpu.upload_f32("g", &[h], &random(h, 2, 0.5).into_iter().map(|v| 1.0 + v).collect::<Vec<_>>()).unwrap();
    let norm = Input::Norm { weight: &g, eps: 1e-6 };
    let glu = LinearOpts { glu: Some(Activation::SiluGated), ..Default::default() };
    let plain = LinearOpts::default();
    let act = gpu.empty("act", &[top_k, inter], ElemType::F32).unwrap();
    let ys = gpu.empty("ys", &[top_k, h], ElemType::F32).unwrap();
    let act_in = gpu.upload_f32("act in", &[top_k, inter], &random(top_k * inter, 3, 1.0)).unwrap();
    let time =
        |ks: &[Kernel]| time_per_call(&gpu, SLOW, &|pass| ks.iter().for_each(|k| k.encode(pass))) / ks.len() as f64;
    let us = |t: f64| t * 1e6;
    for wt in
        [Wt::F16, Wt::Q(DType::Q4_K), Wt::Q(DType::Q8_0), Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false })]
    {
        // One expert's gate_up [2I, H] and down [H, I], repeated E times.
        let stack = |n: usize, k: usize, seed: u64| -> (Option<Tensor>, Option<QuantWeight>, u64) {
            match wt {
                Wt::F16 => {
                    let (one, _) = weights(n, k, seed);
                    let all: Vec<half::f16> = one.iter().copied().cycle().take(experts * n * k).collect();
                    (Some(gpu.upload_f16("w", &[experts * n, k], &all).unwrap()), None, 2 * (n * k) as u64)
                }
                Wt::Q(ty) => {
                    let one = random_blocks(ty, n, k, seed);
                    let all: Vec<u8> = one.iter().copied().cycle().take(experts * one.len()).collect();
                    let q = QuantWeight::new(&gpu, "w", ty, [experts * n, k], &all).unwrap();
                    (None, Some(q), one.len() as u64)
                }
            }
        };
        let (gf, gq, gbytes) = stack(2 * inter, h, 5);
        let (df, dq, dbytes) = stack(h, inter, 6);
        let (gw, dw) = match wt {
            Wt::F16 => (
                ExpertWeight::F16 { w: gf.as_ref().unwrap(), experts },
                ExpertWeight::F16 { w: df.as_ref().unwrap(), experts },
            ),
            Wt::Q(_) => (
                ExpertWeight::Quant { w: gq.as_ref().unwrap(), experts },
                ExpertWeight::Quant { w: dq.as_ref().unwrap(), experts },
            ),
        };
        // We'd stream k experts' rows: bytes per call.
        let (gu_b, dn_b) = (top_k as u64 * gbytes, top_k as u64 * dbytes);
        let gu: Vec<Kernel> = id_sets
            .iter()
            .map(|ids| linear_experts(&gpu, &x1, norm, &gw, ids, None, top_k, &act, glu).unwrap())
            .collect();
        let dn: Vec<Kernel> = id_sets
            .iter()
            .map(|ids| linear_experts(&gpu, &act_in, Input::Plain, &dw, ids, None, 1, &ys, plain).unwrap())
            .collect();
        let (tg, td) = (time(&gu), time(&dn));
        // The same bytes as one dense matvec of k·N rows (the baseline), weights rotated too.
        // One x row (the down baseline's: random), y one row of k·N (GLU: k·N / 2) columns.
        let dense = |n: usize, k: usize, x: &Tensor, input: Input<'_>, opts: LinearOpts, seed: u64| -> f64 {
            let cols = if opts.glu.is_some() { top_k * n / 2 } else { top_k * n };
            let y = gpu.empty("y", &[1, cols], ElemType::F32).unwrap();
            let xk = gpu.upload_f32("xk", &[1, k], &random(k, 4, 1.0)).unwrap();
            let x = if x.shape[0] == 1 { x } else { &xk };
            let ks: Vec<Kernel> = (0..reps)
                .map(|r| match wt {
                    Wt::F16 => {
                        let (one, _) = weights(n, k, seed);
                        let all: Vec<half::f16> = one.iter().copied().cycle().take(top_k * n * k).collect();
                        let w = gpu.upload_f16("dense", &[top_k * n, k], &all).unwrap();
                        let _ = r;
                        linear_in(&gpu, x, input, &w, None, &y, opts).unwrap()
                    }
                    Wt::Q(ty) => {
                        let one = random_blocks(ty, n, k, seed);
                        let all: Vec<u8> = one.iter().copied().cycle().take(top_k * one.len()).collect();
                        let w = QuantWeight::new(&gpu, "dense", ty, [top_k * n, k], &all).unwrap();
                        linear_in(&gpu, x, input, &w, None, &y, opts).unwrap()
                    }
                })
                .collect();
            time(&ks)
        };
        let tgd = dense(2 * inter, h, &x1, norm, glu, 5);
        let tdd = dense(h, inter, &act_in, Input::Plain, LinearOpts::default(), 6);
        eprintln!(
            "{wt:?} decode: experts gate_up (norm+GLU) {:.1} us ({:.2} TB/s; dense {}x{h} {:.1} us), down {:.1} us ({:.2} TB/s; dense {}x{inter} {:.1} us)",
            us(tg),
            gu_b as f64 / tg / 1e12,
            top_k * 2 * inter,
            us(tgd),
            us(td),
            dn_b as f64 / td / 1e12,
            top_k * h,
            us(tdd)
        );
        // Prefill in the per-slot form.
        for t in [4usize, 32, 512] {
            if !big && t > 32 {
                continue;
            }
            let x = gpu.upload_f32("x", &[t, h], &random(t * h, 7, 1.0)).unwrap();
            let v: Vec<u32> = (0..t * top_k).map(|s| ((s * 37 + s / top_k) % experts) as u32).collect();
            let ids = gpu.upload_u32("ids", &[t, top_k], &v).unwrap();
            let y = gpu.empty("y", &[t * top_k, inter], ElemType::F32).unwrap();
            let k = linear_experts(&gpu, &x, norm, &gw, &ids, None, top_k, &y, glu).unwrap();
            let tt = time(std::slice::from_ref(&k));
            eprintln!("{wt:?} T={t}: experts gate_up {:.1} us ({:.2} us/token)", us(tt), us(tt) / t as f64);
        }
    }
    // Router, combine, and a whole layer (f16, 7 dispatches), inputs rotated.
    let ld = experts + 1;
    let logits: Vec<Tensor> =
        (0..reps).map(|r| gpu.upload_f32("logits", &[1, ld], &random(ld, 10 + r as u64, 4.0)).unwrap()).collect();
    let wts = gpu.empty("w", &[1, top_k], ElemType::F32).unwrap();
    let ids = gpu.empty("ids", &[1, top_k], ElemType::U32).unwrap();
    let rk: Vec<Kernel> =
        logits.iter().map(|l| moe_router(&gpu, l, ld, experts, top_k, &ids, &wts, true).unwrap()).collect();
    let so = gpu.upload_f32("shared", &[1, h], &random(h, 8, 1.0)).unwrap();
    let xr = gpu.upload_f32("x", &[1, h], &random(h, 9, 1.0)).unwrap();
    let ys_v = gpu.upload_f32("ys", &[top_k, h], &random(top_k * h, 11, 1.0)).unwrap();
    let ck = moe_combine(
        &gpu,
        &ys_v,
        &wts,
        Some(SharedExpert { out: &so, gate: &logits[0], gate_ld: ld, gate_col: experts }),
        &xr,
    )
    .unwrap();
    eprintln!(
        "router E={experts} k={top_k}: {:.1} us; combine: {:.1} us",
        us(time(&rk)),
        us(time(std::slice::from_ref(&ck)))
    );
    // The router's two forms (k rounds of an arg-max; ranks) over E and k, inputs rotated.
    for (e, k) in [(64usize, 8usize), (128, 8), (256, 8), (256, 16), (512, 10), (512, 16)] {
        let lgs: Vec<Tensor> = (0..reps)
            .map(|r| gpu.upload_f32("logits", &[1, e + 1], &random(e + 1, 50 + r as u64, 4.0)).unwrap())
            .collect();
        let ids = gpu.empty("ids", &[1, k], ElemType::U32).unwrap();
        let wts = gpu.empty("w", &[1, k], ElemType::F32).unwrap();
        let mut line = format!("router E={e} k={k}:");
        for rank in [false, true] {
            let ks: Vec<Kernel> =
                lgs.iter().map(|l| router(&gpu, l, e + 1, e, k, &ids, &wts, true, rank, false).unwrap()).collect();
            line += &format!(" {} {:.2} us;", if rank { "rank" } else { "rounds" }, us(time(&ks)));
        }
        eprintln!("{line}");
    }
    let (rh, _) = weights(ld, h, 12);
    let router_w = gpu.upload_f16("router", &[ld, h], &rh).unwrap();
    let (one, _) = weights(2 * inter, h, 13);
    let gu_w = gpu
        .upload_f16(
            "gu",
            &[experts * 2 * inter, h],
            &one.iter().copied().cycle().take(experts * 2 * inter * h).collect::<Vec<_>>(),
        )
        .unwrap();
    let (one, _) = weights(h, inter, 14);
    let d_w = gpu
        .upload_f16(
            "d",
            &[experts * h, inter],
            &one.iter().copied().cycle().take(experts * h * inter).collect::<Vec<_>>(),
        )
        .unwrap();
    let sg_w = gpu.upload_f16("sg", &[2 * inter, h], &weights(2 * inter, h, 15).0).unwrap();
    let sd_w = gpu.upload_f16("sd", &[h, inter], &weights(h, inter, 16).0).unwrap();
    let lg = gpu.empty("logits", &[1, ld], ElemType::F32).unwrap();
    let sact = gpu.empty("sact", &[1, inter], ElemType::F32).unwrap();
    let sout = gpu.empty("sout", &[1, h], ElemType::F32).unwrap();
    let (gu, dn) = (ExpertWeight::F16 { w: &gu_w, experts }, ExpertWeight::F16 { w: &d_w, experts });
    let xs: Vec<Tensor> =
        (0..reps).map(|r| gpu.upload_f32("x", &[1, h], &random(h, 100 + r as u64, 1.0)).unwrap()).collect();
    let mut layer = Vec::new();
    for x in &xs {
        layer.push(linear_in(&gpu, x, norm, &router_w, None, &lg, plain).unwrap());
        layer.push(moe_router(&gpu, &lg, ld, experts, top_k, &ids, &wts, true).unwrap());
        layer.push(linear_experts(&gpu, x, norm, &gu, &ids, None, top_k, &act, glu).unwrap());
        layer.push(linear_experts(&gpu, &act, Input::Plain, &dn, &ids, None, 1, &ys, plain).unwrap());
        layer.push(linear_in(&gpu, x, norm, &sg_w, None, &sact, glu).unwrap());
        layer.push(linear(&gpu, &sact, &sd_w, None, &sout, plain).unwrap());
        let sh = SharedExpert { out: &sout, gate: &lg, gate_ld: ld, gate_col: experts };
        layer.push(moe_combine(&gpu, &ys, &wts, Some(sh), x).unwrap());
    }
    let tl = time(&layer) * 7.0;
    eprintln!("f16 MoE layer, 7 dispatches: {:.1} us", us(tl));
}
