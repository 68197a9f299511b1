//! The GPU cost of a dispatch itself: what a kernel costs before it does any work. Times
//! `--n` back-to-back dispatches of tiny kernels in one compute pass (GPU timestamps at the
//! pass's start and end), with and without a storage dependency between them (wgpu puts a
//! barrier between dispatches that write the same buffer), with 1 and 256 workgroups, and with
//! a 32 KiB workgroup array. The floor every multi-pass kernel design pays per pass.
//!
//! ```text
//! cargo bench --bench dispatch              # table
//! cargo bench --bench dispatch -- --n 500   # dispatches per timing (default 200)
//! ```

use wgpu_llm::gpu::{Gpu, GpuOptions};

const EMPTY: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    if (g.x == 0xFFFFFFFFu) { out[0] = 1u; }
}";

const SHARED: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
var<workgroup> sh: array<u32, 8192>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    for (var i = lid; i < 8192u; i += 256u) { sh[i] = i; }
    workgroupBarrier();
    if (sh[(lid * 37u) % 8192u] == 0xFFFFFFFFu) { out[0] = 1u; }
}";

/// Reads `out[wg]` and writes it back + 1: a true read-after-write chain between dispatches.
const CHAIN: &str = "
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (lid == 0u) { out[w.x] = out[w.x] + 1u; }
}";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: u32 =
        args.iter().position(|a| a == "--n").and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(200);
    let gpu = Gpu::new(&GpuOptions::default()).expect("a GPU adapter");
    if !gpu.caps.timestamps {
        println!("{}: no timestamp queries, nothing to measure", gpu.info.name);
        return;
    }
    println!("dispatch floor on {} ({:?}), {n} dispatches a timing, median of 20", gpu.info.name, gpu.info.backend);
    let dev = &gpu.device;
    let set = dev.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let read = dev.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let buffers: Vec<wgpu::Buffer> = (0..n)
        .map(|_| {
            dev.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: 4096,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            })
        })
        .collect();
    let period = f64::from(gpu.queue.get_timestamp_period());
    println!("{:>10} {:>6} {:>14} {:>16}", "kernel", "wgs", "same buffer", "own buffers");
    for (name, src) in [("empty", EMPTY), ("shared32k", SHARED), ("chain", CHAIN)] {
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipeline = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let groups: Vec<wgpu::BindGroup> = buffers
            .iter()
            .map(|b| {
                dev.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &[wgpu::BindGroupEntry { binding: 0, resource: b.as_entire_binding() }],
                })
            })
            .collect();
        for wgs in [1u32, 256] {
            let mut cols = Vec::new();
            for own in [false, true] {
                let mut times = Vec::new();
                for _ in 0..20 {
                    let mut enc = dev.create_command_encoder(&Default::default());
                    {
                        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: None,
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: &set,
                                beginning_of_pass_write_index: Some(0),
                                end_of_pass_write_index: Some(1),
                            }),
                        });
                        pass.set_pipeline(&pipeline);
                        for i in 0..n as usize {
                            pass.set_bind_group(0, &groups[if own { i } else { 0 }], &[]);
                            pass.dispatch_workgroups(wgs, 1, 1);
                        }
                    }
                    enc.resolve_query_set(&set, 0..2, &resolve, 0);
                    enc.copy_buffer_to_buffer(&resolve, 0, &read, 0, 16);
                    gpu.queue.submit([enc.finish()]);
                    let slice = read.slice(..);
                    slice.map_async(wgpu::MapMode::Read, |r| r.expect("map"));
                    gpu.wait().expect("wait");
                    let t: Vec<u64> = bytemuck::pod_collect_to_vec(&slice.get_mapped_range().expect("mapped")[..]);
                    read.unmap();
                    times.push(t[1].saturating_sub(t[0]) as f64 * period / 1000.0 / f64::from(n));
                }
                times.sort_by(f64::total_cmp);
                cols.push(times[times.len() / 2]);
            }
            println!("{name:>10} {wgs:>6} {:>11.2} µs {:>13.2} µs", cols[0], cols[1]);
        }
    }
}
