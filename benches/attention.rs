//! The attention kernels on the models' shapes (decode, prefill, chunks, sliding windows): each
//! tiling the kernel takes, the one-dispatch decode kernel's run counts and chunk sizes, with the
//! choice marked `(auto)`; then the rotation and the KV-cache write for scale. Each case runs its
//! kernels in passes of about 10 ms, the best of 5. (Formerly the `#[ignore]`d unit test
//! `ops::attention::tests::bench`, its BENCH_ONLY now `--only`.)
//!
//! ```text
//! cargo bench --bench attention                          # every case
//! cargo bench --bench attention -- --only "gemma3-1b"    # the cases whose name contains this
//! ```

mod common;

use common::Args;
use half::f16;
use wgpu_llm::gpu::tensor::test_util::{gpu, random};
use wgpu_llm::gpu::{ElemType, Kernel};
use wgpu_llm::ops::attention::{
    attention_decode, attention_with, kv_cache, kv_cache_write, sg32, AttnParams, DecodeTiling, Tiling,
};
use wgpu_llm::ops::rope::{inv_freq, rope, rope_kv_write, RopeParams};
use wgpu_llm::ops::StepParams;

/// A layer's attention shape at one token a pass.
fn params(heads: usize, kv_heads: usize, head_dim: usize, max_ctx: usize, window: usize) -> AttnParams {
    AttnParams::one_token(heads, kv_heads, head_dim, max_ctx, window)
}

/// Elements of a token's row of the fused q|k|v projection.
fn row_stride(p: &AttnParams) -> usize {
    (p.heads + 2 * p.kv_heads) * p.head_dim
}

fn main() {
    let gpu = gpu();
    eprintln!("adapter: {} ({:?})", gpu.info.name, gpu.info.backend);
    let time = |kernels: &[&Kernel], iters: usize| -> f64 {
        gpu.run(kernels).unwrap();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..iters {
                for k in kernels {
                    k.encode(&mut pass);
                }
            }
        }
        let t0 = std::time::Instant::now();
        gpu.queue.submit([enc.finish()]);
        gpu.wait().unwrap();
        t0.elapsed().as_secs_f64() / iters as f64
    };
    // best of 5 passes of about 10 ms
    let time = |kernels: &[&Kernel]| -> f64 {
        let once = time(kernels, 3);
        let iters = ((0.01 / once) as usize).clamp(3, 300);
        (0..5).map(|_| time(kernels, iters)).fold(f64::INFINITY, f64::min)
    };
    let only = Args::new().value("only").map(str::to_string);
    // name, H, Hkv, D, context after the pass, T, window
    let cases: &[(&str, usize, usize, usize, usize, usize, usize)] = &[
        ("qwen2.5-1.5b decode", 12, 2, 128, 641, 1, 0),
        ("qwen2.5-1.5b decode", 12, 2, 128, 4096, 1, 0),
        ("llama3-8b decode", 32, 8, 128, 1024, 1, 0),
        ("llama3-8b decode", 32, 8, 128, 4096, 1, 0),
        ("llama3-8b decode", 32, 8, 128, 16384, 1, 0),
        ("qwen2.5-0.5b decode", 14, 2, 64, 4096, 1, 0),
        ("gemma3-1b decode", 4, 1, 256, 4096, 1, 0),
        ("gemma3-1b decode", 4, 1, 256, 32768, 1, 0),
        ("gemma3-1b decode sliding", 4, 1, 256, 32768, 1, 512),
        ("llama3-8b prefill", 32, 8, 128, 512, 512, 0),
        ("llama3-8b prefill", 32, 8, 128, 2048, 2048, 0),
        ("llama3-8b chunk", 32, 8, 128, 4096, 64, 0),
        ("gemma3-1b prefill", 4, 1, 256, 2048, 2048, 0),
        ("gemma3-4b prefill sliding", 8, 4, 256, 4096, 4096, 1024),
    ];
    for &(name, h, hkv, d, ctx, t, window) in cases {
        if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let p = AttnParams { n_tokens: t, window, ..params(h, hkv, d, ctx, 0) };
        let n = hkv * ctx * d;
        let kv: Vec<f16> = random(n, 41, 1.0).iter().map(|x| f16::from_f32(*x)).collect();
        let kc = gpu.upload_f16("k", &[hkv, ctx, d], &kv).unwrap();
        let vc = gpu.upload_f16("v", &[hkv, ctx, d], &kv).unwrap();
        let qkv = gpu.upload_f32("qkv", &[t, row_stride(&p)], &random(t * row_stride(&p), 42, 1.0)).unwrap();
        let out = gpu.empty("out", &[t, h * d], ElemType::F32).unwrap();
        let sp = StepParams { pos: (ctx - t) as u32, n_tokens: t as u32, slot: 0, _pad: 0 };
        let step = gpu.uniform("step", &sp);
        let auto = Tiling::choose(&gpu, &p).unwrap();
        let limit = gpu.limits.max_compute_workgroup_storage_size as usize;
        let mut tilings = vec![auto];
        let splits: &[usize] = if t <= 64 { &[1, 16, 32, 64, 128, 256] } else { &[1] };
        let bqs: &[usize] = if t <= 64 { &[4] } else { &[16, 8] };
        for &bq in bqs {
            for bk in [16, 32, 64, 128] {
                for &nsplit in splits {
                    let tl = Tiling { bq, lpr: 128 / bq, bk, nsplit };
                    if tl.valid(d, limit) && !tilings.contains(&tl) {
                        tilings.push(tl);
                    }
                }
            }
        }
        // keys visited (per query head), and bytes of K/V read once
        let keys: usize = (ctx - t..ctx).map(|q| if window > 0 { window.min(q + 1) } else { q + 1 }).sum();
        let flops = 4.0 * (h * d * keys) as f64;
        let span = if window > 0 { window.min(ctx) + t } else { ctx };
        let bytes = (2 * hkv * span.min(ctx) * d * 2) as f64;
        // The one-dispatch decode kernel: its choice, then other run counts and chunk sizes.
        if t == 1 {
            let g = h / hkv;
            let auto = DecodeTiling::choose(&gpu, &p, false);
            let mut dts: Vec<DecodeTiling> = auto.into_iter().collect();
            for ce in [8192, 4096] {
                for nsplit in [1, 4, 8, 16, 32, 64, 128] {
                    let tl = DecodeTiling { ck: ce / d, nsplit };
                    if ce % d == 0 && tl.valid(d, g, limit, false, sg32(&gpu)) && !dts.contains(&tl) {
                        dts.push(tl);
                    }
                }
            }
            let table = gpu.upload_f32("inv_freq", &[d / 2], &inv_freq(d, 1e6, 1.0)).unwrap();
            for tl in dts {
                for rope in [false, true] {
                    if rope && Some(tl) != auto {
                        continue;
                    }
                    let ks =
                        attention_decode(&gpu, &qkv, &kc, &vc, &out, &step, p, tl, rope.then_some(&table), None, None)
                            .unwrap();
                    let refs: Vec<&Kernel> = ks.iter().collect();
                    let s = time(&refs);
                    eprintln!(
                        "{name:28} H={h:2} Hkv={hkv} D={d} ctx={ctx:5} T={t:4} w={window:4} decode{} {:?}: {:8.1} us  {:6.0} GB/s{}",
                        if rope { "+rope" } else { "" },
                        tl,
                        s * 1e6,
                        bytes / s * 1e-9,
                        if Some(tl) == auto { "  (auto)" } else { "" },
                    );
                }
            }
        }
        for tl in tilings {
            let ks = attention_with(&gpu, &qkv, &kc, &vc, &out, &step, p, tl, None, None).unwrap();
            let refs: Vec<&Kernel> = ks.iter().collect();
            let s = time(&refs);
            let parts = if refs.len() > 1 {
                format!("  (main {:.1} us, merge {:.1} us)", time(&refs[..1]) * 1e6, time(&refs[1..]) * 1e6)
            } else {
                String::new()
            };
            eprintln!(
                "{name:28} H={h:2} Hkv={hkv} D={d} ctx={ctx:5} T={t:4} w={window:4} {:?}: {:8.1} us  {:6.0} GB/s  {:6.2} TFLOP/s{}{}",
                tl,
                s * 1e6,
                bytes / s * 1e-9,
                flops / s * 1e-12,
                if tl == auto { "  (auto)" } else { "" },
                parts
            );
        }
    }
    // rope and the cache write, for scale
    for t in [1usize, 2048] {
        let p = AttnParams { n_tokens: t, ..params(32, 8, 128, 4096, 0) };
        let (kc, vc) = kv_cache(&gpu, "c", &p, 1).unwrap();
        let qkv = gpu.upload_f32("qkv", &[t, row_stride(&p)], &random(t * row_stride(&p), 43, 1.0)).unwrap();
        let sp = StepParams { pos: 0, n_tokens: t as u32, slot: 0, _pad: 0 };
        let step = gpu.uniform("step", &sp);
        let w = kv_cache_write(&gpu, &qkv, &kc, &vc, &step, p).unwrap();
        let rp = RopeParams {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            rotary_dim: 128,
            theta: 5e5,
            scaling: 1.0,
            n_tokens: t,
            proportional: false,
            k_eq_v: false,
            v_norm: false,
            q_only: false,
        };
        let nw = gpu.upload_f32("n", &[128], &[1.0; 128]).unwrap();
        let r = rope(&gpu, &qkv, &step, rp, Some((&nw, &nw, 1e-6))).unwrap();
        let f = rope_kv_write(&gpu, &qkv, &step, rp, Some((&nw, &nw, 1e-6)), &kc, &vc).unwrap();
        eprintln!(
            "T={t:4}: kv_cache_write {:7.1} us, rope+qk_norm {:7.1} us, fused rope+qk_norm+kv write {:7.1} us",
            time(&[&w]) * 1e6,
            time(&[&r]) * 1e6,
            time(&[&f]) * 1e6
        );
    }
}
