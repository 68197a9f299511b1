//! What the kernel benches share: their command line and the timing of a recorded dispatch.
// (Each bench compiles this file for itself and uses part of it.)
#![allow(dead_code)]

use wgpu_llm::gpu::Gpu;

/// The bench's command line (after `cargo bench --bench NAME --`): `--name value` options and
/// lone `--name` flags. Cargo adds `--bench` itself.
pub struct Args(Vec<String>);

impl Args {
    pub fn new() -> Args {
        Args(std::env::args().skip(1).filter(|a| a != "--bench").collect())
    }

    /// The value after `--name`, if given.
    pub fn value(&self, name: &str) -> Option<&str> {
        let flag = format!("--{name}");
        self.0.iter().position(|a| *a == flag).and_then(|i| self.0.get(i + 1)).map(String::as_str)
    }

    /// `--name` given (alone).
    pub fn flag(&self, name: &str) -> bool {
        let flag = format!("--{name}");
        self.0.contains(&flag)
    }

    /// `--shapes N:K,N:K`: the weights' shapes, if given.
    pub fn shapes(&self) -> Option<Vec<(usize, usize)>> {
        self.value("shapes").map(|v| {
            v.split(',')
                .map(|nk| {
                    let (n, k) = nk.split_once(':').expect("--shapes takes N:K,N:K");
                    (n.parse().expect("--shapes: N"), k.parse().expect("--shapes: K"))
                })
                .collect()
        })
    }
}

/// How [`time_per_call`] measures: `warm_s` seconds of batches of about `warm_batch_s`, then the
/// best of 3 batches of about `batch_s`, each of at most `max_reps` calls.
#[derive(Clone, Copy)]
pub struct Timing {
    pub warm_s: f64,
    pub warm_batch_s: f64,
    pub batch_s: f64,
    pub max_reps: usize,
}

/// The f16 benches' timing (the GPU's clocks ramp up over the 0.3 s warm-up).
pub const SLOW: Timing = Timing { warm_s: 0.3, warm_batch_s: 0.05, batch_s: 0.1, max_reps: 2000 };
/// The quantized benches' (many configurations a shape).
pub const QUICK: Timing = Timing { warm_s: 0.1, warm_batch_s: 0.03, batch_s: 0.03, max_reps: 5000 };

/// Seconds per call of `encode`: the best of 3 batches encoded into one compute pass (see
/// [`Timing`]).
pub fn time_per_call(gpu: &Gpu, timing: Timing, encode: &dyn Fn(&mut wgpu::ComputePass<'_>)) -> f64 {
    let Timing { warm_s, warm_batch_s, batch_s, max_reps } = timing;
    let batch = |r: usize| {
        let t0 = std::time::Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for _ in 0..r {
                encode(&mut pass);
            }
        }
        gpu.queue.submit([enc.finish()]);
        gpu.wait().unwrap();
        t0.elapsed().as_secs_f64()
    };
    let warm = std::time::Instant::now();
    let mut one = batch(2) / 2.0;
    while warm.elapsed().as_secs_f64() < warm_s {
        let r = ((warm_batch_s / one) as usize).clamp(1, max_reps);
        one = batch(r) / r as f64;
    }
    let reps = ((batch_s / one) as usize).clamp(3, max_reps);
    (0..3).map(|_| batch(reps) / reps as f64).fold(f64::INFINITY, f64::min)
}
