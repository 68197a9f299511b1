//! The pipeline cache and recorded dispatches.
//!
//! A [`Kernel`] is one dispatch with everything bound: pipeline, bind group, workgroup counts.
//! Ops build their kernels once (buffers and bind groups made once); a forward pass or a decode
//! step is a list of kernels encoded into one compute pass. Per-step values (position, length)
//! live in small uniform buffers that the host rewrites with `queue.write_buffer`, so nothing is
//! rebuilt between steps.
//!
//! Grid convention: kernels with many workgroups take a 2-D grid from [`grid`] (x ≤ 65535) and
//! compute their linear workgroup index as `wid.x + wid.y * nwg.x`, ignoring indices past the end.

use super::{shader, Gpu, Macros};
use crate::error::{Error, Result};
use std::sync::Arc;

/// One recorded dispatch.
pub struct Kernel {
    pub name: String,
    /// The variant flags it was compiled with (macros set to "1", less the adapter's F16 and
    /// SUBGROUP and the token count), joined by '+': what tells two dispatches of one shader
    /// apart in a profile.
    pub variant: String,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    pub workgroups: [u32; 3],
}

impl Kernel {
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        let [x, y, z] = self.workgroups;
        pass.dispatch_workgroups(x, y, z);
    }
}

/// A 2-D grid of `n` workgroups with x ≤ 65535 (see the module docs).
pub fn grid(n: u32) -> [u32; 3] {
    let n = n.max(1);
    if n <= 65535 {
        [n, 1, 1]
    } else {
        let y = n.div_ceil(65535);
        [n.div_ceil(y), y, 1]
    }
}

// Kernels compiled without wgpu's bounds checks, every variant (see [`Gpu::pipeline`]): the
// tuning table's `Unchecked` row (src/tuning/table.rs) names them: the quantized matvec, its input
// staging, the norms, the rotation (prefill's and batches' too) and the decode attention. The last
// two index the KV caches by the pass's positions and slots, which the model checks against the
// caches before every pass (`Model::check_room`, `prefill_slot`, `stage_batch`); a caller of
// `ops::rope` / `ops::attention` directly owns that check.

impl Gpu {
    /// Encodes `kernels` into one compute pass, submits and waits.
    pub fn run(&self, kernels: &[&Kernel]) -> Result<()> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for k in kernels {
                k.encode(&mut pass);
            }
        }
        self.queue.submit([enc.finish()]);
        self.wait()
    }

    /// The compute pipeline of `entry` in `wgsl/<shader>.wgsl` under `macros`, compiled once.
    pub fn pipeline(&self, shader_name: &str, entry: &str, macros: &Macros) -> Result<Arc<wgpu::ComputePipeline>> {
        // Whether wgpu's bounds checks are compiled in is the device's tuning's choice: part of the key, so a
        // device sharing this cache with another tuning (`Gpu::with_tuning`) never takes the other's pipeline.
        let checked = self.tuning().bounds_checked(shader_name);
        let key = (shader_name.to_string(), entry.to_string(), macros.clone(), checked);
        if let Some(p) = self.pipelines().map.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(p.clone());
        }
        let code = shader::preprocess(shader_name, macros)?;
        let label = format!("{shader_name}:{entry}");
        let pipeline = self.scoped(&format!("compiling {label}"), || {
            let desc =
                wgpu::ShaderModuleDescriptor { label: Some(&label), source: wgpu::ShaderSource::Wgsl(code.into()) };
            // Bounds checks stay on but for the tuning's unchecked kernels (a wrong index reads a clamped element,
            // never another allocation); the loop-bounding guard wgpu adds for untrusted web content is off:
            // every loop in wgsl/ is bounded by its own condition, and the guard (a 64-bit
            // counter checked on every iteration) keeps drivers from unrolling and scheduling
            // short loops. Measured on the H100: SmolLM2 prefill 31.9k -> 45.9k tok/s,
            // the sampler 41.4 -> 38.4 us (BENCHMARKS.md).
            let mut checks = wgpu::ShaderRuntimeChecks::checked();
            checks.force_loop_bounding = false;
            // wgpu's injected bounds checks (naga clamps every index into a fixed-size array,
            // workgroup memory included, and buffer indices where the driver lacks robust access)
            // are left out of the kernels the tuning names (every variant: the one-token decode path's
            // and also prefill's few-token matvec, the experts', every rms_norm), whose every index
            // is in range by construction (rows and tokens clamped or guarded, workgroup arrays
            // indexed by the thread and the sizes they were declared with, row layouts checked on
            // the host; the suite runs them so): the
            // Gemma-4-31B step 13,182 -> 13,030 us on the H100 with none checked (BENCHMARKS
            // session 15), as llama.cpp turns robustness off for its mul_mat_vec. Knob:
            // WGPU_LLM_BOUNDS_CHECKS=1 checks every kernel, =0 none (measurement; TUNING.md).
            checks.bounds_checks = checked;
            // SAFETY: this crate's own shaders, whose loops terminate; those compiled without
            // bounds checks index inside their arrays and bindings by construction (above), which
            // the test suite runs (and runs with every kernel unchecked: the knob).
            let module = unsafe { self.device.create_shader_module_trusted(desc, checks) };
            self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: None,
                module: &module,
                entry_point: Some(entry),
                compilation_options: Default::default(),
                cache: None,
            })
        })?;
        let p = Arc::new(pipeline);
        self.pipelines().map.lock().unwrap_or_else(|p| p.into_inner()).insert(key, p.clone());
        Ok(p)
    }

    /// Records a dispatch of `entry` in `wgsl/<shader>.wgsl`: `bindings[i]` is bound at
    /// `@group(0) @binding(i)`.
    pub fn kernel(
        &self,
        shader_name: &str,
        entry: &str,
        macros: &Macros,
        bindings: &[wgpu::BindingResource<'_>],
        workgroups: [u32; 3],
    ) -> Result<Kernel> {
        let pipeline = self.pipeline(shader_name, entry, macros)?;
        let entries: Vec<wgpu::BindGroupEntry> = bindings
            .iter()
            .enumerate()
            .map(|(i, r)| wgpu::BindGroupEntry { binding: i as u32, resource: r.clone() })
            .collect();
        let name = format!("{shader_name}:{entry}");
        let variant = macros
            .0
            .iter()
            .filter(|(k, v)| v.as_str() == "1" && !matches!(k.as_str(), "F16" | "SUBGROUP" | "TOK"))
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
            .join("+");
        let bind_group = self.scoped(&format!("binding {name}"), || {
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&name),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        })?;
        if workgroups.iter().any(|&w| w > self.limits.max_compute_workgroups_per_dimension) {
            return Err(Error::Gpu(format!("{name}: grid {workgroups:?} exceeds the device limit")));
        }
        Ok(Kernel { name, variant, pipeline, bind_group, workgroups })
    }

    /// A uniform buffer holding `value`.
    pub fn uniform<T: bytemuck::Pod>(&self, label: &str, value: &T) -> wgpu::Buffer {
        use wgpu::util::DeviceExt;
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::bytes_of(value),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        })
    }
}
