//! The f16 linear layer's kernels (`wgsl/matvec.wgsl`, `wgsl/matmul.wgsl`): the matvec against a
//! naive one-thread-a-row kernel, every row group width of the matvec, matvec against the tiled
//! matmul at a few tokens, and both matmul tiles; each result checked against the CPU. (The parts
//! were the `#[ignore]`d unit tests `bench_matvec` and `bench_sweep`.)
//!
//! ```text
//! cargo bench --bench matvec                           # both parts
//! cargo bench --bench matvec -- --part naive           # matvec against the naive kernel
//! cargo bench --bench matvec -- --part sweep           # row group widths, few tokens, tiles
//! cargo bench --bench matvec -- --shapes 512:256       # these (N, K) only (matvec parts)
//! ```

mod common;

use common::{time_per_call, Args, SLOW};
use wgpu_llm::gpu::tensor::test_util::{gpu, gpu_variants, max_abs_diff, random};
use wgpu_llm::ops::matmul::bench::{check_shapes, matmul, matvec, MatmulConfig, MatvecConfig};
use wgpu_llm::ops::matmul::test_util::{check, reference, weights};
use wgpu_llm::ops::matmul::{linear, LinearOpts, Operands};

const TILE4: MatmulConfig = MatmulConfig { tile: 4, bk: 32 };
const TILE8: MatmulConfig = MatmulConfig { tile: 8, bk: 16 };

fn main() {
    let args = Args::new();
    let shapes = args.shapes();
    let part = args.value("part");
    if part.is_none_or(|p| p == "naive") {
        naive(shapes.as_deref().unwrap_or(&[(2048, 2048)]));
    }
    if part.is_none_or(|p| p == "sweep") {
        sweep(shapes.as_deref());
    }
}

/// One thread per output row, reading W one u32 at a time: the baseline of the `naive` part.
const NAIVE_MATVEC: &str = "
@group(0) @binding(0) var<storage, read> w: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: vec4<u32>;  // (n, k / 2)
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
let row = g.x;
if (row >= p.x) { return; }
var acc = 0.0;
for (var i = 0u; i < p.y; i++) {
    acc += dot(unpack2x16float(w[row * p.y + i]), x[i]);
}
y[row] = acc;
}
";

/// The matvec against [`NAIVE_MATVEC`] at N = K = 2048 (or each `--shapes`), on the device as
/// is and without f16 and subgroups.
fn naive(shapes: &[(usize, usize)]) {
    for (gpu, &(n, k)) in gpu_variants().iter().flat_map(|g| shapes.iter().map(move |nk| (g, nk))) {
        let xv = random(k, 1, 1.0);
        let (wh, wf) = weights(n, k, 2);
        let x = gpu.upload_f32("x", &[1, k], &xv).unwrap();
        let w = gpu.upload_f16("w", &[n, k], &wh).unwrap();
        let y = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
        let y_naive = gpu.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();

        let kern = linear(gpu, &x, &w, None, &y, LinearOpts::default()).unwrap();
        let t_fast = time_per_call(gpu, SLOW, &|pass| kern.encode(pass));

        let module = gpu.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("naive matvec"),
            source: wgpu::ShaderSource::Wgsl(NAIVE_MATVEC.into()),
        });
        let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("naive matvec"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let params = gpu.uniform("naive.params", &[n as u32, (k / 2) as u32, 0, 0]);
        let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: w.binding() },
                wgpu::BindGroupEntry { binding: 1, resource: x.binding() },
                wgpu::BindGroupEntry { binding: 2, resource: y_naive.binding() },
                wgpu::BindGroupEntry { binding: 3, resource: params.as_entire_binding() },
            ],
        });
        let t_naive = time_per_call(gpu, SLOW, &|pass| {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups((n as u32).div_ceil(64), 1, 1);
        });

        let (want, tol) = reference(&xv, &wf, k, None, &vec![0.0; n], false);
        check(&gpu.read_f32(&y).unwrap(), &want, &tol, "bench matvec");
        check(&gpu.read_f32(&y_naive).unwrap(), &want, &tol, "bench naive");
        let gbs = |t: f64| (n * k * 2) as f64 / t / 1e9;
        eprintln!(
            "{} f16={} sg={} N=K={n}: matvec {:.3} ms ({:.2} GB/s of W, {:?}), naive {:.3} ms ({:.2} GB/s): {:.1}x",
            gpu.info.name,
            gpu.caps.f16,
            gpu.caps.subgroups,
            t_fast * 1e3,
            gbs(t_fast),
            MatvecConfig::new(gpu, &check_shapes(&x, &w, None, &y, LinearOpts::default())),
            t_naive * 1e3,
            gbs(t_naive),
            t_naive / t_fast
        );
    }
}

/// Every row group width of the matvec on decode shapes (N, K: square, Qwen2-0.5B-like MLP and
/// lm_head, Gemma-3-270M lm_head, or `--shapes`), matvec against the tiled matmul at a few
/// tokens, and both matmul tiles at many.
fn sweep(custom: Option<&[(usize, usize)]>) {
    let gpu = gpu();
    let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
    let matvec_shapes: &[(usize, usize)] = match (custom, big) {
        (Some(c), _) => c,
        (None, true) => &[(2048, 2048), (4096, 4096), (4864, 896), (896, 4864), (151936, 896), (262144, 640)],
        (None, false) => &[(2048, 2048)],
    };
    let opts = LinearOpts::default();
    for g in gpu_variants() {
        for &(n, k) in matvec_shapes {
            let xv = random(k, 1, 1.0);
            let (wh, wf) = weights(n, k, 2);
            let x = g.upload_f32("x", &[1, k], &xv).unwrap();
            let w = g.upload_f16("w", &[n, k], &wh).unwrap();
            let y = g.upload_f32("y", &[1, n], &vec![0.0; n]).unwrap();
            let (want, tol) = reference(&xv, &wf, k, None, &vec![0.0; n], false);
            let s = check_shapes(&x, &w, None, &y, opts);
            let auto = MatvecConfig::new(&g, &s);
            let mut cfgs = vec![auto];
            for tpr in [16, 32, 64, 128, 256] {
                if tpr >= g.caps.subgroup_max_size || !auto.subgroups {
                    cfgs.push(MatvecConfig { tpr, ..auto });
                }
            }
            // Measured first and last: the first run after a large upload is slow.
            cfgs.push(auto);
            let mut line = format!("matvec sg={} N={n} K={k}:", auto.subgroups);
            for (i, c) in cfgs.iter().enumerate() {
                let kern = matvec(&g, &Operands::new(&x, &w, &y, opts), &s, *c).unwrap();
                let t = time_per_call(&g, SLOW, &|pass| kern.encode(pass));
                check(&g.read_f32(&y).unwrap(), &want, &tol, "sweep");
                let name = if i == 0 || i == cfgs.len() - 1 {
                    format!("auto(tpr {})", c.tpr)
                } else {
                    format!("tpr {}", c.tpr)
                };
                line += &format!(" {name} {:.1}us {:.0}GB/s;", t * 1e6, (n * k * 2) as f64 / t / 1e9);
            }
            eprintln!("{line}");
        }
    }
    if custom.is_some() {
        return;
    }
    // Few tokens: matvec (4 tokens per pass over W, and 1) vs the tiled matmul.
    let few: &[(usize, usize)] = if big { &[(2048, 2048), (4864, 896), (151936, 896)] } else { &[(576, 1536)] };
    for &(n, k) in few {
        let w = gpu.upload_f16("w", &[n, k], &weights(n, k, 2).0).unwrap();
        for t in [2usize, 4, 8, 16, 32, 64, 128] {
            let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
            let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
            let s = check_shapes(&x, &w, None, &y, opts);
            let mut line = format!("few tokens T={t} N={n} K={k}:");
            let mut outs = Vec::new();
            let auto = MatvecConfig::new(&gpu, &s);
            let tok4 = MatvecConfig { tok: 4, tpr: auto.tpr.max(16), ..auto };
            let tok1 = MatvecConfig { tok: 1, ..auto };
            for (name, cfg) in [("matvec tok 4", tok4), ("matvec tok 1", tok1)] {
                let kern = matvec(&gpu, &Operands::new(&x, &w, &y, opts), &s, cfg).unwrap();
                let tv = time_per_call(&gpu, SLOW, &|pass| kern.encode(pass));
                outs.push(gpu.read_f32(&y).unwrap());
                line += &format!(" {name} {:.1} us;", tv * 1e6);
            }
            let km = matmul(&gpu, &Operands::new(&x, &w, &y, opts), &s, MatmulConfig::new(&s)).unwrap();
            let tm = time_per_call(&gpu, SLOW, &|pass| km.encode(pass));
            outs.push(gpu.read_f32(&y).unwrap());
            line += &format!(" matmul {:.1} us", tm * 1e6);
            for o in &outs[1..] {
                let (d, _) = max_abs_diff(&outs[0], o);
                assert!(d < 1e-2, "kernels disagree by {d}");
            }
            eprintln!("{line}");
        }
    }
    let matmul_shapes: &[(usize, usize, usize)] = if big {
        &[(16, 2048, 2048), (128, 2048, 2048), (512, 2048, 2048), (512, 4864, 896), (2048, 4096, 4096)]
    } else {
        &[(67, 576, 1536)]
    };
    for &(t, n, k) in matmul_shapes {
        let x = gpu.upload_f32("x", &[t, k], &random(t * k, 1, 1.0)).unwrap();
        let w = gpu.upload_f16("w", &[n, k], &weights(n, k, 2).0).unwrap();
        let y = gpu.upload_f32("y", &[t, n], &vec![0.0; t * n]).unwrap();
        let s = check_shapes(&x, &w, None, &y, opts);
        let mut outs = Vec::new();
        for cfg in [TILE4, TILE8] {
            let kern = matmul(&gpu, &Operands::new(&x, &w, &y, opts), &s, cfg).unwrap();
            let tm = time_per_call(&gpu, SLOW, &|pass| kern.encode(pass));
            outs.push(gpu.read_f32(&y).unwrap());
            eprintln!(
                "matmul T={t} N={n} K={k} tile {}{}: {:.1} us, {:.2} TFLOP/s",
                cfg.tile,
                if cfg == MatmulConfig::new(&s) { " (auto)" } else { "" },
                tm * 1e6,
                (2 * t * n * k) as f64 / tm / 1e12
            );
        }
        let (d, _) = max_abs_diff(&outs[0], &outs[1]);
        assert!(d < 1e-2, "tiles disagree by {d}");
    }
}
