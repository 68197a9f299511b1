//! The device: adapter choice ([`list_adapters`], [`GpuOptions`]), what it can do ([`Caps`]),
//! and [`Gpu`] (device, queue, limits, tuning, the pipeline cache).

use super::cache::PipelineCache;
use super::shader::Macros;
use crate::error::{Error, Result};
use crate::tuning::{DeviceProfile, Family, Tuning};
use std::sync::{Arc, Mutex};

/// Which graphics API to run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BackendChoice {
    /// Vulkan or Metal, whichever the platform has. Never GL: probing it starts EGL (Mesa then
    /// prints `XDG_RUNTIME_DIR is invalid` on a headless machine) and its shader compiler can
    /// take minutes on these kernels, so GL runs only when asked for.
    #[default]
    Auto,
    Vulkan,
    Metal,
    /// OpenGL ES / WebGL through ANGLE or Mesa: only with `--backend gl`.
    Gl,
}

impl BackendChoice {
    fn backends(self) -> wgpu::Backends {
        match self {
            BackendChoice::Auto => wgpu::Backends::VULKAN | wgpu::Backends::METAL,
            BackendChoice::Vulkan => wgpu::Backends::VULKAN,
            BackendChoice::Metal => wgpu::Backends::METAL,
            BackendChoice::Gl => wgpu::Backends::GL,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    pub backend: BackendChoice,
    /// Index into [`list_adapters`]; `None` picks the best (discrete > integrated > other > cpu).
    pub adapter: Option<usize>,
    /// Do not use shader-f16 even where present (tests the fallback).
    pub disable_f16: bool,
    /// Do not use subgroup operations even where present (tests the fallback).
    pub disable_subgroups: bool,
    /// Do not use cooperative matrices (tensor cores) even where present.
    pub disable_coop: bool,
    /// Run as this family would (tests): its profile's facts forced on the adapter (Apple's:
    /// the device is requested with 32 KiB of workgroup memory, 31 storage bindings a stage,
    /// bindings under 4 GiB, buffers of at most 4 GiB, no integer dot products) and its rows of
    /// the rule table chosen. The kernels still run at the adapter's real subgroup size.
    pub emulate: Option<Family>,
}

/// Optional capabilities in use on this device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub f16: bool,
    pub subgroups: bool,
    pub timestamps: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    /// Cooperative matrices (wgpu's experimental `wgpu_cooperative_matrix`) in the configuration
    /// the tensor-core kernels use: 16 × 16 × 16, f16 inputs, f32 sums, subgroups of exactly 32.
    pub coop: bool,
}

impl Caps {
    /// Subgroups of 8 or more: a 32-element block's eight threads (a vec4 each) meet by shuffles
    /// (the STAGE8 staging of wgsl/include/stage_x16.wgsl).
    pub fn shuffles8(&self) -> bool {
        self.subgroups && self.subgroup_min_size >= 8
    }
}

/// What `wgpu-llm devices` prints for one adapter.
#[derive(Clone, Debug)]
pub struct AdapterReport {
    pub index: usize,
    pub info: wgpu::AdapterInfo,
    pub features: wgpu::Features,
    pub limits: wgpu::Limits,
    /// The adapter's cooperative-matrix (tensor core) configurations, as wgpu reports them
    /// (Vulkan: `vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR`); empty where it has none.
    pub cooperative_matrices: Vec<wgpu::CooperativeMatrixProperties>,
}

impl AdapterReport {
    /// The adapter's profile and tuning (no knobs read): what `wgpu-llm devices` prints below it.
    pub fn tuning(&self) -> Tuning {
        Tuning::new(DeviceProfile::new(&self.info, self.features, &self.limits, &self.cooperative_matrices))
    }
}

impl std::fmt::Display for AdapterReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.info;
        let l = &self.limits;
        let has = |x| if self.features.contains(x) { "yes" } else { "no" };
        writeln!(f, "[{}] {} ({:?}, {:?})", self.index, i.name, i.backend, i.device_type)?;
        writeln!(f, "    driver: {} {}", i.driver, i.driver_info)?;
        writeln!(
            f,
            "    shader-f16: {}  subgroups: {} (size {}..{})  timestamps: {} (inside passes: {})",
            has(wgpu::Features::SHADER_F16),
            has(wgpu::Features::SUBGROUP),
            i.subgroup_min_size,
            i.subgroup_max_size,
            has(wgpu::Features::TIMESTAMP_QUERY),
            has(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
        )?;
        write!(
            f,
            "    max storage binding: {} MiB  max buffer: {} MiB  workgroup memory: {} KiB  invocations/workgroup: {}",
            l.max_storage_buffer_binding_size >> 20,
            l.max_buffer_size >> 20,
            l.max_compute_workgroup_storage_size >> 10,
            l.max_compute_invocations_per_workgroup,
        )?;
        let coop: Vec<String> = self
            .cooperative_matrices
            .iter()
            .map(|c| {
                let sat = if c.saturating_accumulation { " sat" } else { "" };
                format!("{}x{}x{} {:?}->{:?}{sat}", c.m_size, c.n_size, c.k_size, c.ab_type, c.cr_type)
            })
            .collect();
        write!(
            f,
            "\n    cooperative matrices (MxNxK, A/B -> C): {}",
            if coop.is_empty() { "none".to_string() } else { coop.join(", ") }
        )
    }
}

fn instance(backend: BackendChoice) -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    desc.backends = backend.backends();
    wgpu::Instance::new(desc)
}

fn rank(t: wgpu::DeviceType) -> u8 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Every adapter the backend offers, in a stable order (by type, then enumeration order).
pub fn list_adapters(backend: BackendChoice) -> Vec<AdapterReport> {
    let inst = instance(backend);
    let mut adapters = pollster::block_on(inst.enumerate_adapters(backend.backends()));
    adapters.sort_by_key(|a| rank(a.get_info().device_type));
    adapters
        .into_iter()
        .enumerate()
        .map(|(index, a)| AdapterReport {
            index,
            info: a.get_info(),
            features: a.features(),
            limits: a.limits(),
            cooperative_matrices: a.cooperative_matrix_properties(),
        })
        .collect()
}

/// A device, its queue, what it can do, and the pipeline cache. Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub limits: wgpu::Limits,
    pub caps: Caps,
    /// The profile, the rule table's choices for it and the knobs ([`Gpu::tuning`]).
    tuning: Arc<Tuning>,
    pipelines: Arc<PipelineCache>,
    /// First uncaptured device error (validation, out of memory, device lost), if any.
    failure: Arc<Mutex<Option<String>>>,
}

impl Gpu {
    pub fn new(opts: &GpuOptions) -> Result<Gpu> {
        let inst = instance(opts.backend);
        let mut adapters = pollster::block_on(inst.enumerate_adapters(opts.backend.backends()));
        adapters.sort_by_key(|a| rank(a.get_info().device_type));
        if adapters.is_empty() {
            return Err(Error::Gpu(format!(
                "no usable GPU adapter for backend {:?} (on Linux without a GPU, install Mesa's lavapipe: \
                 apt-get install mesa-vulkan-drivers libvulkan1)",
                opts.backend
            )));
        }
        let n = adapters.len();
        let adapter = match opts.adapter {
            Some(i) if i >= n => {
                return Err(Error::InvalidArgument(format!(
                    "--adapter {i}: only {n} adapter(s) found (see `wgpu-llm devices`)"
                )))
            }
            Some(i) => adapters.swap_remove(i),
            None => adapters.swap_remove(0),
        };
        let info = adapter.get_info();
        let have = adapter.features();
        let profile = DeviceProfile::new(&info, have, &adapter.limits(), &adapter.cooperative_matrix_properties());
        let profile = match opts.emulate {
            Some(family) => profile.emulating(family),
            None => profile,
        };
        let mut features = wgpu::Features::empty();
        let f16 = have.contains(wgpu::Features::SHADER_F16) && !opts.disable_f16;
        let subgroups = have.contains(wgpu::Features::SUBGROUP) && !opts.disable_subgroups;
        let timestamps = have.contains(wgpu::Features::TIMESTAMP_QUERY);
        let coop = f16
            && subgroups
            && !opts.disable_coop
            && profile.subgroup_min_size == 32
            && profile.subgroup_max_size == 32
            && have.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
            && adapter.cooperative_matrix_properties().iter().any(|c| {
                use wgpu::CooperativeScalarType as S;
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16) && c.ab_type == S::F16 && c.cr_type == S::F32
            });
        for (on, f) in [
            (coop, wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            (f16, wgpu::Features::SHADER_F16),
            (subgroups, wgpu::Features::SUBGROUP),
            (timestamps, wgpu::Features::TIMESTAMP_QUERY),
            (
                have.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
                wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES,
            ),
        ] {
            if on {
                features |= f;
            }
        }
        // The profile's limits (Apple's: storage bindings under 4 GiB whatever the adapter reports),
        // requested as such, so that wgpu refuses a binding past them.
        let limits = profile.clamp_limits(&adapter.limits());
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wgpu-llm"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: the experimental feature is requested only with `coop` (cooperative matrices,
            // used by the `*_coop` kernels alone); wgpu warns its implementation may have bugs.
            experimental_features: if coop {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Gpu(format!("requesting a device from {}: {e}", info.name)))?;
        let failure = Arc::new(Mutex::new(None::<String>));
        let sink = failure.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = sink.lock().unwrap_or_else(|p| p.into_inner());
            if slot.is_none() {
                *slot = Some(describe_error(&e));
            }
        }));
        let caps = Caps {
            f16,
            subgroups,
            timestamps,
            subgroup_min_size: profile.subgroup_min_size,
            subgroup_max_size: profile.subgroup_max_size,
            coop,
        };
        let tuning = Arc::new(Tuning::new(profile).override_from_env()?);
        Ok(Gpu { device, queue, info, limits, caps, tuning, pipelines: Arc::new(PipelineCache::default()), failure })
    }

    /// The device's tuning: its profile, the rule table's choices for it, the knobs.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    /// The same device with another tuning (a test's knobs, without the environment).
    pub fn with_tuning(&self, tuning: Tuning) -> Gpu {
        Gpu { tuning: Arc::new(tuning), ..self.clone() }
    }

    /// The same device choosing kernels as `profile`'s would (tests of the table: an H100's
    /// choices on lavapipe): its limits and subgroup sizes for the choices, its rows. Its kernels
    /// must not run: the device has none of those limits.
    #[cfg(test)]
    pub(crate) fn choosing_as(&self, profile: DeviceProfile) -> Gpu {
        let mut g = self.with_tuning(Tuning::new(profile.clone()));
        g.limits.max_compute_workgroup_storage_size = profile.workgroup_memory;
        g.limits.max_compute_invocations_per_workgroup = profile.max_invocations;
        g.limits.max_compute_workgroup_size_x = g.limits.max_compute_workgroup_size_x.max(profile.max_invocations);
        g.limits.max_storage_buffer_binding_size = profile.max_storage_binding;
        g.caps.subgroup_min_size = profile.subgroup_min_size;
        g.caps.subgroup_max_size = profile.subgroup_max_size;
        g.info.backend = profile.backend;
        g
    }

    /// The standard macros for this device (`F16`, `SUBGROUP`), to extend per kernel.
    pub fn macros(&self) -> Macros {
        Macros::new().flag_if("F16", self.caps.f16).flag_if("SUBGROUP", self.caps.subgroups)
    }

    /// The same device with optional capabilities turned off for kernel selection (tests of the
    /// fallbacks run on one device).
    pub fn restricted(&self, f16: bool, subgroups: bool) -> Gpu {
        let mut g = self.clone();
        g.caps.f16 &= f16;
        g.caps.subgroups &= subgroups;
        g.caps.coop &= f16 && subgroups;
        g
    }

    pub fn pipelines(&self) -> &PipelineCache {
        &self.pipelines
    }

    /// Returns the first error the device reported outside an error scope.
    pub fn check(&self) -> Result<()> {
        let slot = self.failure.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(msg) => Err(Error::Gpu(msg.clone())),
            None => Ok(()),
        }
    }

    /// Blocks until all submitted work is done.
    pub fn wait(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("waiting for the device: {e}")))?;
        self.check()
    }

    /// Runs `f` (which creates resources) inside out-of-memory and validation error scopes, so
    /// an allocation that does not fit is an error, not an abort.
    pub fn scoped<T>(&self, what: &str, f: impl FnOnce() -> T) -> Result<T> {
        let oom = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        if let Some(e) = o {
            return Err(Error::Gpu(format!("out of GPU memory while {what}: {}", describe_error(&e))));
        }
        if let Some(e) = v {
            return Err(Error::Gpu(format!("while {what}: {}", describe_error(&e))));
        }
        Ok(out)
    }
}

fn describe_error(e: &wgpu::Error) -> String {
    match e {
        wgpu::Error::OutOfMemory { .. } => "out of GPU memory".to_string(),
        other => {
            let s = other.to_string();
            // wgpu's Display of a validation error can be long: keep the first lines.
            s.lines().take(8).collect::<Vec<_>>().join("\n")
        }
    }
}
