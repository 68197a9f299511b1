//! Sampling head: device (`DeviceSampler`, WGSL) vs host (logits readback + CPU `sample_row`),
//! for vocabularies of 32k, 152k and 262k at greedy, top-p 0.9 and top-k 50, one row.
//!
//! ```text
//! cargo bench --bench sampling                      # table
//! cargo bench --bench sampling -- --json            # table, then one JSON document
//! cargo bench --bench sampling -- --reps 200        # more repetitions (default 10)
//! cargo bench --bench sampling -- --vocab 152064    # one vocabulary (any size)
//! cargo bench --bench sampling -- --warm 0.3        # seconds of back-to-back samplings before each timing (GPU clocks up)
//! ```
//!
//! Columns: `gpu µs` = the sampler's compute pass between GPU timestamps (when the device has
//! timestamp queries; otherwise `-`), `busy µs` = GPU time per sampling when `--reps` of them
//! run back to back in one command buffer (the GPU kept busy, as in a decode loop), `pass µs` =
//! GPU time per sampling when `--reps` of them share one compute pass (what sampling adds to a
//! decode step that encodes it into its own pass: no pass boundaries),
//! `per kernel µs` = each dispatch between timestamps written
//! inside the pass (when the device has those), `submit µs` = wall clock of set_params + encode + submit +
//! wait (no readback), `device µs` = wall clock of `DeviceSampler::sample` (+ reading back the
//! one id), `host µs` = wall clock of `HostSampler::sample` (reading back the whole row of
//! logits, then the CPU sampler). Medians over the repetitions. On lavapipe (a CPU driver) the
//! numbers only mean something as ratios.

use std::time::Instant;
use wgpu_llm::gpu::{ElemType, Gpu, GpuOptions, Tensor};
use wgpu_llm::sampling::device::PassLog;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, SamplingBackend, SamplingParams};

/// LLM-like logits: a normal bulk (σ = 2.5) and a few dozen boosted tokens, so that top-p 0.9
/// keeps a realistic handful-to-hundreds of tokens. Deterministic.
fn logits(v: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut unit = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut l: Vec<f32> = (0..v).map(|_| ((0..12).map(|_| unit()).sum::<f64>() - 6.0) as f32 * 2.5).collect();
    for i in 0..40 {
        let j = (unit() * v as f64) as usize % v;
        l[j] += 14.0 - 0.3 * i as f32;
    }
    l
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// GPU time of the sampler's pass, in µs, from timestamps written at its start and end.
struct Timer {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    read: wgpu::Buffer,
    period_ns: f64,
}

impl Timer {
    fn new(gpu: &Gpu) -> Option<Timer> {
        if !gpu.caps.timestamps {
            return None;
        }
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("sampling timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 8,
        });
        let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps resolve"),
            size: 64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let read = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("timestamps read"),
            size: 64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Some(Timer { set, resolve, read, period_ns: f64::from(gpu.queue.get_timestamp_period()) })
    }

    fn time(&self, gpu: &Gpu, s: &mut DeviceSampler, logits: &Tensor, out: &Tensor) -> f64 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sampling (timed)"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            s.encode_pass(gpu, &mut pass, logits, 1, out, PassLog::Nothing).expect("encode");
        }
        self.finish(gpu, enc, 2)[0]
    }

    /// GPU time per sample (µs) of `n` samplings encoded back to back in one command buffer
    /// (timestamps at the start of the first pass and the end of the last): the GPU stays busy.
    fn batch(&self, gpu: &Gpu, s: &mut DeviceSampler, logits: &Tensor, out: &Tensor, n: usize) -> f64 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for i in 0..n {
            let (first, last) = (i == 0, i + 1 == n);
            let writes = (first || last).then_some(wgpu::ComputePassTimestampWrites {
                query_set: &self.set,
                beginning_of_pass_write_index: first.then_some(0),
                end_of_pass_write_index: last.then_some(1),
            });
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sampling (batch)"),
                timestamp_writes: writes,
            });
            s.encode_pass(gpu, &mut pass, logits, 1, out, PassLog::Nothing).expect("encode");
        }
        self.finish(gpu, enc, 2)[0] / n as f64
    }

    /// GPU time per sample (µs) of `n` samplings encoded back to back in one compute pass: what
    /// the sampler adds to a decode step whose pass it shares (no pass boundaries counted).
    fn in_pass(&self, gpu: &Gpu, s: &mut DeviceSampler, logits: &Tensor, out: &Tensor, n: usize) -> f64 {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("sampling (one pass)"),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: &self.set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            for _ in 0..n {
                s.encode_pass(gpu, &mut pass, logits, 1, out, PassLog::Nothing).expect("encode");
            }
        }
        self.finish(gpu, enc, 2)[0] / n as f64
    }

    /// Per-dispatch GPU times (µs), from timestamps between the dispatches; None without
    /// timestamps inside passes.
    fn kernels(&self, gpu: &Gpu, s: &mut DeviceSampler, logits: &Tensor, out: &Tensor) -> Option<Vec<f64>> {
        if !gpu.device.features().contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES) {
            return None;
        }
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            s.encode_pass(gpu, &mut pass, logits, 1, out, PassLog::Timestamps(&self.set, 0)).expect("encode");
        }
        Some(self.finish(gpu, enc, s.dispatches() as u32 + 1))
    }

    /// Resolves `n` timestamps and returns the n - 1 differences in µs.
    fn finish(&self, gpu: &Gpu, mut enc: wgpu::CommandEncoder, n: u32) -> Vec<f64> {
        enc.resolve_query_set(&self.set, 0..n, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.read, 0, 64);
        gpu.queue.submit([enc.finish()]);
        let slice = self.read.slice(..);
        slice.map_async(wgpu::MapMode::Read, |r| r.expect("map timestamps"));
        gpu.wait().expect("wait");
        let t: Vec<u64> = bytemuck::pod_collect_to_vec(&slice.get_mapped_range().expect("mapped")[..]);
        self.read.unmap();
        t[..n as usize].windows(2).map(|w| w[1].saturating_sub(w[0]) as f64 * self.period_ns / 1000.0).collect()
    }
}

struct Row {
    vocab: usize,
    mode: &'static str,
    dispatches: usize,
    gpu_us: Option<f64>,
    batch_us: Option<f64>,
    pass_us: Option<f64>,
    kernels_us: Option<Vec<f64>>,
    submit_us: f64,
    device_us: f64,
    host_us: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args.iter().any(|a| a == "--json");
    let reps = args
        .iter()
        .position(|a| a == "--reps")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse::<usize>().ok())
        .unwrap_or(10)
        .max(1);
    let warm_s: f64 = args
        .iter()
        .position(|a| a == "--warm")
        .and_then(|i| args.get(i + 1))
        .and_then(|r| r.parse().ok())
        .unwrap_or(0.3);
    let only: Option<usize> =
        args.iter().position(|a| a == "--vocab").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok());
    let gpu = Gpu::new(&GpuOptions::default())
        .expect("a GPU adapter (on Linux without one: apt-get install mesa-vulkan-drivers)");
    let timer = Timer::new(&gpu);
    println!(
        "sampling bench on {} ({:?}), {reps} reps, median; gpu time from {}",
        gpu.info.name,
        gpu.info.backend,
        if timer.is_some() { "timestamp queries" } else { "(no timestamp queries: wall clock only)" }
    );
    let modes: [(&str, SamplingParams); 3] = [
        ("greedy", SamplingParams::greedy()),
        ("top-p 0.9", SamplingParams { temperature: 1.0, top_p: 0.9, seed: 7, ..SamplingParams::default() }),
        ("top-k 50", SamplingParams { temperature: 1.0, top_k: 50, seed: 7, ..SamplingParams::default() }),
    ];
    let mut rows = Vec::new();
    let mut host_runs = Vec::new();
    let mut sampler = DeviceSampler::new(&gpu).expect("device sampler");
    let vocabs = only.map_or(vec![32_000usize, 152_064, 262_144], |v| vec![v]);
    for vocab in vocabs {
        let l = logits(vocab, vocab as u64);
        let t = gpu.upload_f32("logits", &[1, vocab], &l).expect("upload");
        let out = gpu.empty("ids", &[1], ElemType::U32).expect("ids");
        for (mode, p) in modes {
            let params = [p];
            // Warm-up: pipelines, scratch, bind groups; and the two agree.
            let dev = sampler.sample(&gpu, &t, &params, 0).expect("device sample");
            let host = HostSampler.sample(&gpu, &t, &params, 0).expect("host sample");
            if dev != host {
                println!("warning: device {dev:?} and host {host:?} disagree at V={vocab} {mode}");
            }
            // Each measurement in its own loop, so the GPU is not left idle (and clocked down)
            // by the host sampler's long CPU work in between.
            let (mut gpu_t, mut submit_t, mut device_t) = (vec![], vec![], vec![]);
            let mut kernel_t: Vec<Vec<f64>> = vec![];
            let mut batch_us = None;
            let mut pass_us = None;
            if let Some(timer) = &timer {
                // Clock the GPU up first (an idle GPU runs at a fraction of its boost clock; in a
                // decode loop the layers before the sampler keep it busy): ~0.3 s of samplings.
                let t0 = Instant::now();
                while t0.elapsed().as_secs_f64() < warm_s {
                    timer.batch(&gpu, &mut sampler, &t, &out, 500);
                }
                for _ in 0..reps {
                    gpu_t.push(timer.time(&gpu, &mut sampler, &t, &out));
                }
                for _ in 0..reps {
                    if let Some(k) = timer.kernels(&gpu, &mut sampler, &t, &out) {
                        kernel_t.push(k);
                    }
                }
                batch_us = Some(timer.batch(&gpu, &mut sampler, &t, &out, reps));
                pass_us = Some(timer.in_pass(&gpu, &mut sampler, &t, &out, reps));
            }
            for step in 0..reps as u32 {
                let t0 = Instant::now();
                sampler.set_params(&gpu, &params, step).expect("params");
                let mut enc = gpu.device.create_command_encoder(&Default::default());
                sampler.encode(&gpu, &mut enc, &t, 1, &out).expect("encode");
                gpu.queue.submit([enc.finish()]);
                gpu.wait().expect("wait");
                submit_t.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            for step in 0..reps as u32 {
                let t0 = Instant::now();
                sampler.sample(&gpu, &t, &params, step).expect("device sample");
                device_t.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            rows.push(Row {
                vocab,
                mode,
                dispatches: sampler.dispatches(),
                gpu_us: (!gpu_t.is_empty()).then(|| median(gpu_t)),
                batch_us,
                pass_us,
                kernels_us: (!kernel_t.is_empty())
                    .then(|| (0..kernel_t[0].len()).map(|k| median(kernel_t.iter().map(|v| v[k]).collect())).collect()),
                submit_us: median(submit_t),
                device_us: median(device_t),
                host_us: 0.0,
            });
            host_runs.push((rows.len() - 1, t.clone(), params));
        }
    }
    // The host path last: its CPU work leaves the GPU idle, which would skew the timings above.
    for (row, t, params) in host_runs {
        let mut host_t = vec![];
        for step in 0..reps as u32 {
            let t0 = Instant::now();
            HostSampler.sample(&gpu, &t, &params, step).expect("host sample");
            host_t.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        rows[row].host_us = median(host_t);
    }
    println!(
        "{:>8} {:>10} {:>5} {:>8} {:>8} {:>8} {:>20} {:>10} {:>10} {:>10} {:>12}",
        "vocab",
        "mode",
        "disp",
        "gpu µs",
        "busy µs",
        "pass µs",
        "per kernel µs",
        "submit µs",
        "device µs",
        "host µs",
        "host/device"
    );
    for r in &rows {
        println!(
            "{:>8} {:>10} {:>5} {:>8} {:>8} {:>8} {:>20} {:>10.1} {:>10.1} {:>10.1} {:>11.2}x",
            r.vocab,
            r.mode,
            r.dispatches,
            r.gpu_us.map_or("-".to_string(), |g| format!("{g:.1}")),
            r.batch_us.map_or("-".to_string(), |g| format!("{g:.1}")),
            r.pass_us.map_or("-".to_string(), |g| format!("{g:.1}")),
            r.kernels_us.as_ref().map_or("-".to_string(), |k| k
                .iter()
                .map(|x| format!("{x:.1}"))
                .collect::<Vec<_>>()
                .join(" + ")),
            r.submit_us,
            r.device_us,
            r.host_us,
            r.host_us / r.device_us
        );
    }
    if gpu.info.device_type == wgpu::DeviceType::Cpu {
        println!("(a CPU driver: compare ratios only)");
    }
    if json {
        let doc = serde_json::json!({
            "adapter": gpu.info.name,
            "backend": format!("{:?}", gpu.info.backend),
            "device_type": format!("{:?}", gpu.info.device_type),
            "gpu_time": if timer.is_some() { "timestamps" } else { "none" },
            "reps": reps,
            "rows": rows.iter().map(|r| serde_json::json!({
                "vocab": r.vocab,
                "mode": r.mode,
                "dispatches": r.dispatches,
                "gpu_us": r.gpu_us,
                "busy_us": r.batch_us,
                "pass_us": r.pass_us,
                "kernels_us": r.kernels_us,
                "submit_us": r.submit_us,
                "device_us": r.device_us,
                "host_us": r.host_us,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&doc).expect("json"));
    }
}
