//! The quantized linear layer's kernels (`wgsl/matvec_quant*.wgsl`, `wgsl/matmul_quant*.wgsl`,
//! `wgsl/quantize_x16.wgsl`) over random blocks: every matvec configuration against the one the
//! tuning table picks, x staged apart, the f16 path beside them, few and many tokens, the batch
//! step's kernels, the tensor-core matmul; where the time goes (probes). A large GPU takes the
//! models' shapes; a CPU device (lavapipe) one small shape.
//!
//! ```text
//! cargo bench --bench quant                                  # --part matvec
//! cargo bench --bench quant -- --part matvec [--only matvec|prefill] [--auto-wg]
//! cargo bench --bench quant -- --part probe                  # hot / cold W, float, PROBE_NOX, PROBE_NOMATH
//! cargo bench --bench quant -- --part batch                  # the batch step at 1-32 tokens
//! cargo bench --bench quant -- --part coop                   # the tensor-core matmul (Caps::coop)
//! cargo bench --bench quant -- --shapes 2048:1536,256:1536 --types q4_K,q6_K
//! ```
//!
//! These parts were the `#[ignore]`d unit tests `bench_quant` (`matvec`), `probe_quant`,
//! `bench_quant_batch` and `bench_coop`, the names BENCHMARKS.md and the tuning table cite; their
//! environment variables are now the options `--shapes` (QSHAPES), `--types` (QTYPES), `--only`
//! (QBENCH) and `--auto-wg` (WG_ALL=0).
//!
//! `--only matvec`: one token only; `--only prefill`: only the few/many-token part; `--auto-wg`:
//! the tuning table's workgroup size only (the row group widths and DP4 still swept).

mod common;

use common::{time_per_call, Args, QUICK};
use half::f16;
use wgpu_llm::dtype::DType;
use wgpu_llm::gpu::tensor::test_util::{gpu, max_abs_diff, random};
use wgpu_llm::gpu::{ElemType, Gpu, Kernel, Tensor};
use wgpu_llm::ops::matmul::bench::{
    batch_rows, check_operands, dp4_fits, has_dp4, matmul_quant, matmul_quant_coop, matvec_quant, matvec_quant_batch,
    tuned_shape, MatmulConfig, QMatvecConfig,
};
use wgpu_llm::ops::matmul::gguf::{quantize_x16, staged_x_words};
use wgpu_llm::ops::matmul::{linear, Input, LinearOpts, Operands, Weight, MATVEC_MAX_T};
use wgpu_llm::weights::test_util::{random_blocks, TYPES};
use wgpu_llm::weights::QuantWeight;

fn main() {
    let args = Args::new();
    match args.value("part").unwrap_or("matvec") {
        "matvec" => matvecs(&args),
        "probe" => probe(&args),
        "batch" => batch(&args),
        "coop" => coop(&args),
        p => panic!("--part {p}: one of matvec, probe, batch, coop"),
    }
}

/// The types of `--types q4_K,q6_K` (names as `DType::name`, any case) if given, else `default`.
fn types(a: &Args, default: &[DType]) -> Vec<DType> {
    let Some(v) = a.value("types") else { return default.to_vec() };
    let types: Vec<DType> =
        TYPES.into_iter().filter(|t| v.split(',').any(|n| n.eq_ignore_ascii_case(t.name()))).collect();
    assert!(!types.is_empty(), "--types {v}: none of {:?}", TYPES.map(DType::name));
    types
}

/// Where a quantized matvec's time goes: the kernel as picked (DP4 where it applies), the
/// float path, without x (PROBE_NOX), and the weight loads alone (PROBE_NOMATH); with W hot in
/// L2 (one copy) and cold (copies rotated over > 256 MB).
fn probe(a: &Args) {
    let gpu = gpu();
    let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
    let custom = a.shapes();
    let shapes: &[(usize, usize)] = match (&custom, big) {
        (Some(c), _) => c,
        (None, true) => &[(2048, 1536), (17920, 1536), (1536, 8960), (151936, 1536)],
        (None, false) => &[(256, 1536)],
    };
    let opts = LinearOpts::default();
    for ty in types(a, &[DType::Q4_K, DType::Q6_K, DType::Q4_0, DType::Q8_0]) {
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
                auto.shape.tpr,
                auto.shape.wg,
                auto.shape.dp4,
                bytes as f64 / 1e6
            );
            let float = auto.with(|s| s.dp4 = false);
            for (name, c) in [
                ("auto", auto),
                ("dp4", auto.with(|s| s.dp4 = dp4_fits(&gpu, ty, k, auto.shape.wg, auto.shape.tok))),
                ("float", float),
                ("nox", QMatvecConfig { probe: "PROBE_NOX", ..float }),
                ("nomath", QMatvecConfig { probe: "PROBE_NOMATH", ..float }),
            ] {
                let ks: Vec<Kernel> =
                    ws.iter().map(|w| matvec_quant(&gpu, &Operands::new(&x, w, &y, opts), &s, c).unwrap()).collect();
                let hot = time_per_call(&gpu, QUICK, &|pass| ks[0].encode(pass));
                let cold = time_per_call(&gpu, QUICK, &|pass| {
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

/// Every matvec configuration on Qwen2.5-1.5B's linear layers (N, K: qkv, o, gate_up, down,
/// lm_head), x staged apart, the f16 matvec on the same shapes, then few and many tokens.
fn matvecs(a: &Args) {
    let gpu = gpu();
    let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
    let custom = a.shapes();
    let shapes: &[(usize, usize)] = match (&custom, big) {
        (Some(c), _) => c,
        (None, true) => &[(2048, 1536), (256, 1536), (1536, 1536), (17920, 1536), (1536, 8960), (151936, 1536)],
        (None, false) => &[(2048, 1536)],
    };
    let types = types(a, &TYPES);
    eprintln!("{} f16={} sg={} (max {})", gpu.info.name, gpu.caps.f16, gpu.caps.subgroups, gpu.caps.subgroup_max_size);
    let opts = LinearOpts::default();
    // --only prefill: only the few/many-token part below.
    let matvecs = a.value("only") != Some("prefill");
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
            let mut line = format!("matvec {ty} N={n} K={k} ({:.1} MB x{copies} cold):", w.gpu_bytes() as f64 / 1e6);
            let mut cfgs = vec![auto];
            // Every workgroup size from 32 threads, every row group width it holds, with and
            // without DP4 (--auto-wg: the auto workgroup size only).
            let wgs: Vec<u32> = if a.flag("auto-wg") { vec![auto.shape.wg] } else { vec![32, 64, 128, 256] };
            for wg in wgs {
                for tpr in [16u32, 32, 64, 128, 256] {
                    let sg_ok = tpr >= gpu.caps.subgroup_max_size || !auto.shape.subgroups;
                    if !sg_ok || tpr > wg {
                        continue;
                    }
                    for dp4 in [false, true] {
                        let c = auto.with(|s| (s.tpr, s.dp4, s.wg) = (tpr, dp4, wg));
                        if (dp4 && !dp4_fits(&gpu, ty, k, wg, auto.shape.tok)) || c == auto {
                            continue;
                        }
                        cfgs.push(c);
                    }
                }
            }
            let mut first = None;
            for (i, c) in cfgs.iter().enumerate() {
                let ks: Vec<Kernel> =
                    ws.iter().map(|w| matvec_quant(&gpu, &Operands::new(&x, w, &y, opts), &s, *c).unwrap()).collect();
                let t = time_per_call(&gpu, QUICK, &|pass| ks.iter().for_each(|k| k.encode(pass))) / copies as f64;
                let out = gpu.read_f32(&y).unwrap();
                let first = first.get_or_insert(out.clone());
                let (d, at) = max_abs_diff(first, &out);
                assert!(d < 1e-3 * (1.0 + first[at].abs()), "{ty} N={n} K={k} {c:?}: differs by {d} at {at}");
                let dp = if c.shape.dp4 { "+dp4" } else { "" };
                let name = format!("{}wg {} tpr {}{dp}", if i == 0 { "auto " } else { "" }, c.shape.wg, c.shape.tpr);
                line += &format!(" {name} {:.1}us {:.0}GB/s;", t * 1e6, w.gpu_bytes() as f64 / t / 1e9);
            }
            // x staged apart (quantize_x16, then XG), the staging counted once a call.
            if has_dp4(ty) && gpu.info.backend == wgpu::Backend::Vulkan {
                let xs = gpu.empty("xs", &[staged_x_words(1, k)], ElemType::U32).unwrap();
                let stage = quantize_x16(&gpu, &x, &xs).unwrap();
                let ts = time_per_call(&gpu, QUICK, &|pass| stage.encode(pass));
                line += &format!(" | quantize_x16 {:.1}us;", ts * 1e6);
                let sg = if auto.shape.subgroups { gpu.caps.subgroup_max_size.max(8) } else { 8 };
                for (wg, tpr) in [(32, 32), (64, 32), (64, 64), (128, 32), (128, 64), (128, 128), (256, 64), (256, 256)]
                {
                    for prefetch in [false, true] {
                        if tpr < sg || tpr > wg {
                            continue;
                        }
                        let c = auto.with(|s| (s.wg, s.tpr, s.tok, s.dp4, s.prefetch) = (wg, tpr, 1, true, prefetch));
                        let ks: Vec<Kernel> = ws
                            .iter()
                            .map(|w| {
                                matvec_quant(
                                    &gpu,
                                    &Operands { input: Input::Staged(&xs), ..Operands::new(&x, w, &y, opts) },
                                    &s,
                                    c,
                                )
                                .unwrap()
                            })
                            .collect();
                        let t =
                            time_per_call(&gpu, QUICK, &|pass| ks.iter().for_each(|k| k.encode(pass))) / copies as f64;
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
        let kern = linear(&gpu, &x, &w, None, &y, opts).unwrap();
        let t = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
        eprintln!("matvec f16 N={n} K={k}: {:.1}us {:.0}GB/s", t * 1e6, (2 * n * k) as f64 / t / 1e9);
    }
    if a.value("only") == Some("matvec") || custom.is_some() {
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
            let (x, y, tm) = time_linear(&gpu, &w, [n, k], t, opts);
            line += &format!(" T={t} {:.1}us {:.2}TFLOP/s", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
            if gpu.caps.coop && t > MATVEC_MAX_T {
                // (the auto pick above is the tensor-core matmul: the f32 one beside it)
                let s = check_operands("bench", &x, n, k, None, &y, opts);
                let kern = matmul_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, MatmulConfig::new(&s)).unwrap();
                let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
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
        let tm = time_linear(&gpu, &w, [n, k], t, opts).2;
        line += &format!(" T={t} {:.1}us {:.2}TFLOP/s;", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
    }
    eprintln!("{line}");
}

/// `linear` over `t` random tokens with the `[N, K]` weight `w` (f16 or quantized), timed: its x,
/// its y and the seconds a call takes.
fn time_linear<W: Weight>(gpu: &Gpu, w: &W, [n, k]: [usize; 2], t: usize, opts: LinearOpts) -> (Tensor, Tensor, f64) {
    let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
    let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
    let kern = linear(gpu, &x, w, None, &y, opts).unwrap();
    (x, y, time_per_call(gpu, QUICK, &|pass| kern.encode(pass)))
}

/// The tensor-core matmul's time and where it goes: with the W loads, the x loads or the
/// tensor-core ops left out (PROBE_NOW / NOX / NOMMA), against the f32 matmul, at 33, 128 and
/// 512 tokens (--shapes, --types; default Q4_K 17920 × 1536).
fn coop(a: &Args) {
    let gpu = gpu();
    assert!(gpu.caps.coop, "{} has no cooperative matrices", gpu.info.name);
    let shapes = a.shapes().unwrap_or(vec![(17920, 1536)]);
    for (ty, (n, k)) in types(a, &[DType::Q4_K]).into_iter().flat_map(|ty| shapes.iter().map(move |&nk| (ty, nk))) {
        let w = QuantWeight::new(&gpu, "w", ty, [n, k], &random_blocks(ty, n, k, 2)).unwrap();
        for t in [33usize, 128, 512] {
            let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
            let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
            let opts = LinearOpts::default();
            let s = check_operands("bench", &x, n, k, None, &y, opts);
            let mut line = format!("coop {ty} N={n} K={k} T={t}:");
            let kern = matmul_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, MatmulConfig::new(&s)).unwrap();
            let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
            line += &format!(" f32 {:.1}us", tm * 1e6);
            for probe in ["", "PROBE_NOW", "PROBE_NOX", "PROBE_NOMMA"] {
                let flags: Vec<&str> = if probe.is_empty() { vec![] } else { vec![probe] };
                let kern = matmul_quant_coop(&gpu, &Operands::new(&x, &w, &y, opts), &s, &flags).unwrap();
                let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
                let what = if probe.is_empty() { "coop" } else { probe };
                line += &format!(" {what} {:.1}us {:.1}TFLOP/s", tm * 1e6, (2 * t * n * k) as f64 / tm / 1e12);
            }
            eprintln!("{line}");
        }
    }
}

/// The batch step's matvec (`LinearOpts::batch`: passes of 4 tokens at every batch size)
/// with DP4 against the float sums, and the tiled matmul beside them, at batch sizes 1 to 32
/// on Qwen2.5-1.5B's shapes (--shapes, --types as the matvec part).
fn batch(a: &Args) {
    let gpu = gpu();
    let shapes = a.shapes().unwrap_or_else(|| vec![(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)]);
    let types = types(a, &[DType::Q4_K, DType::Q6_K]);
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
                let auto = QMatvecConfig::new(&gpu, ty, &tuned_shape(&s, &opts));
                line += &format!(" T={t}");
                for dp4 in [true, false] {
                    if dp4 && !dp4_fits(&gpu, ty, k, auto.shape.wg, auto.shape.tok) {
                        continue;
                    }
                    let c = auto.with(|s| s.dp4 = dp4);
                    let kern = matvec_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, c).unwrap();
                    let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
                    line += &format!(" {}{:.1}us", if dp4 { "dp4 " } else { "float " }, tm * 1e6);
                }
                let kern = matmul_quant(&gpu, &Operands::new(&x, &w, &y, opts), &s, MatmulConfig::new(&s)).unwrap();
                let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
                line += &format!(" matmul {:.1}us", tm * 1e6);
                for rw in [32, 16] {
                    let kern = matvec_quant_batch(&gpu, &Operands::new(&x, &w, &y, opts), &s, rw, None).unwrap();
                    let tm = time_per_call(&gpu, QUICK, &|pass| kern.encode(pass));
                    let auto = if rw == batch_rows(n, t) { "*" } else { "" };
                    line += &format!(" batch rw {rw}{auto} {:.1}us", tm * 1e6);
                }
                line += ";";
            }
            eprintln!("{line}");
        }
    }
}
