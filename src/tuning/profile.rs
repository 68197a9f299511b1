//! What the tuning knows about an adapter: its vendor and family, the sizes and limits the
//! kernel choices depend on, and the hazards of a family (Apple's) that the code must respect
//! whatever the adapter reports.

/// A GPU family: the key of the rule table's rows ([`super::table`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// NVIDIA Hopper (H100, H200, H800, GH200, H20): where every measured rule was measured.
    NvidiaHopper,
    /// Other NVIDIA GPUs.
    Nvidia,
    Amd,
    Intel,
    /// Apple silicon (Metal): see [`DeviceProfile::apple_hazards`].
    Apple,
    /// A software rasterizer (Mesa's lavapipe / llvmpipe, SwiftShader): the test machine.
    Software,
    Other,
}

impl Family {
    /// Every family, in the order `wgpu-llm devices` and the docs list them.
    pub const ALL: [Family; 7] = [
        Family::NvidiaHopper,
        Family::Nvidia,
        Family::Amd,
        Family::Intel,
        Family::Apple,
        Family::Software,
        Family::Other,
    ];

    /// The family of an adapter, from its PCI vendor id, name, type and backend.
    pub fn of(info: &wgpu::AdapterInfo) -> Family {
        let name = info.name.to_ascii_lowercase();
        let hopper =
            ["h100", "h200", "h800", "gh200", "h20 "].iter().any(|h| name.contains(h)) || name.ends_with("h20");
        if info.device_type == wgpu::DeviceType::Cpu
            || ["llvmpipe", "lavapipe", "swiftshader", "software"].iter().any(|s| name.contains(s))
        {
            return Family::Software;
        }
        match info.vendor {
            0x10de if hopper => Family::NvidiaHopper,
            0x10de => Family::Nvidia,
            0x1002 | 0x1022 => Family::Amd,
            0x8086 => Family::Intel,
            0x106b => Family::Apple,
            _ if info.backend == wgpu::Backend::Metal && name.contains("apple") => Family::Apple,
            _ => Family::Other,
        }
    }
}

/// Apple silicon's known hazards, as numbers the code uses (see TUNING.md).
pub mod apple {
    /// Simdgroups are 32 lanes, always.
    pub const SUBGROUP_SIZE: u32 = 32;
    /// Cooperative matrices are 8x8 simdgroup matrices (`simdgroup_float8x8`).
    pub const COOP_TILE: (u32, u32, u32) = (8, 8, 8);
    /// Buffer bindings a shader stage (Metal's argument table: 31 buffers).
    pub const BINDINGS_PER_STAGE: u32 = 31;
    /// The largest storage binding whatever the adapter reports: under 4 GiB. wgpu 30.0.1's Metal
    /// backend reports `maxBufferLength` (e.g. 14 GB on an M4 Pro) but passes each binding's size
    /// to the kernel's bounds checks as a `u32`, so a binding of 4 GiB or more silently reads
    /// zeros past byte 2^32 - 4 (gfx-rs/wgpu#10305; the fix, #10306, is not in 30.0.1).
    pub const MAX_STORAGE_BINDING: u64 = u32::MAX as u64 & !3;
    /// Threadgroup memory: 32 KiB on every Apple GPU.
    pub const WORKGROUP_MEMORY: u32 = 32 << 10;
    /// The largest buffer the emulated profile allows (an M1's `maxBufferLength` is about half
    /// its memory; 4 GiB keeps the emulation honest on any of them).
    pub const MAX_BUFFER: u64 = 4 << 30;
}

/// One cooperative-matrix configuration the adapter lists (M x N x K, A/B and C types).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoopShape {
    pub m: u32,
    pub n: u32,
    pub k: u32,
    pub ab: String,
    pub cr: String,
}

/// An adapter as the tuning sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceProfile {
    pub family: Family,
    /// PCI vendor id (0 where the backend has none).
    pub vendor: u32,
    pub name: String,
    pub backend: wgpu::Backend,
    /// Whether this profile is emulated on another adapter (`GpuOptions::emulate`).
    pub emulated: bool,
    pub subgroup_min_size: u32,
    pub subgroup_max_size: u32,
    pub f16: bool,
    pub subgroups: bool,
    /// The cooperative-matrix shapes the adapter lists (Apple: 8x8 simdgroup matrices).
    pub coop_shapes: Vec<CoopShape>,
    /// Workgroup memory, bytes.
    pub workgroup_memory: u32,
    /// Largest storage binding, bytes (Apple: under 4 GiB whatever the adapter reports).
    pub max_storage_binding: u64,
    pub max_buffer: u64,
    /// Storage buffers a shader stage.
    pub bindings_per_stage: u32,
    pub max_invocations: u32,
    /// Whether the backend compiles WGSL's packed integer dot products to instructions (Vulkan:
    /// SPIR-V's OpSDot/OpUDot; Metal and GL get naga's bit-field polyfill, slower than the float
    /// path): the DP4 matvec and the staged-x paths run only here.
    pub int_dot: bool,
    /// Whether a step must stay one compute pass (Metal: each pass ends a command encoder).
    pub one_pass_per_step: bool,
}

impl DeviceProfile {
    /// The profile of a real adapter.
    pub fn new(
        info: &wgpu::AdapterInfo,
        features: wgpu::Features,
        limits: &wgpu::Limits,
        coop: &[wgpu::CooperativeMatrixProperties],
    ) -> DeviceProfile {
        let family = Family::of(info);
        let mut p = DeviceProfile {
            family,
            vendor: info.vendor,
            name: info.name.clone(),
            backend: info.backend,
            emulated: false,
            subgroup_min_size: info.subgroup_min_size,
            subgroup_max_size: info.subgroup_max_size,
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            coop_shapes: coop
                .iter()
                .map(|c| CoopShape {
                    m: c.m_size,
                    n: c.n_size,
                    k: c.k_size,
                    ab: format!("{:?}", c.ab_type),
                    cr: format!("{:?}", c.cr_type),
                })
                .collect(),
            workgroup_memory: limits.max_compute_workgroup_storage_size,
            max_storage_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            bindings_per_stage: limits.max_storage_buffers_per_shader_stage,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            int_dot: info.backend == wgpu::Backend::Vulkan,
            one_pass_per_step: info.backend == wgpu::Backend::Metal,
        };
        if family == Family::Apple {
            p.apple_hazards();
        }
        p
    }

    /// Apple silicon's hazards applied to this profile, whatever the adapter reported: subgroups
    /// of exactly 32, 8x8 cooperative matrices, 31 buffer bindings a stage, storage bindings
    /// under 4 GiB, 32 KiB of workgroup memory, one compute pass a step, and no integer dot
    /// products (the Metal backend has no instruction for WGSL's `dot4I8Packed`).
    fn apple_hazards(&mut self) {
        if self.backend == wgpu::Backend::Metal {
            // (Emulated on another adapter, the kernels run at that adapter's real subgroup size.)
            self.subgroup_min_size = apple::SUBGROUP_SIZE;
            self.subgroup_max_size = apple::SUBGROUP_SIZE;
        }
        let (m, n, k) = apple::COOP_TILE;
        self.coop_shapes.retain(|c| (c.m, c.n, c.k) == (m, n, k));
        self.bindings_per_stage = self.bindings_per_stage.min(apple::BINDINGS_PER_STAGE);
        self.max_storage_binding = self.max_storage_binding.min(apple::MAX_STORAGE_BINDING);
        self.workgroup_memory = self.workgroup_memory.min(apple::WORKGROUP_MEMORY);
        self.int_dot = false;
        self.one_pass_per_step = true;
    }

    /// This adapter's profile with `family`'s facts forced on it (tests: Apple's limits on
    /// lavapipe). Only Apple has facts to force; other families only change which rows apply.
    pub fn emulating(&self, family: Family) -> DeviceProfile {
        let mut p = DeviceProfile { family, emulated: true, ..self.clone() };
        if family == Family::Apple {
            p.max_buffer = p.max_buffer.min(apple::MAX_BUFFER);
            p.apple_hazards();
        }
        p
    }

    /// `limits` lowered to this profile's (what the device is requested with, so that wgpu itself
    /// refuses a binding past them).
    pub fn clamp_limits(&self, limits: &wgpu::Limits) -> wgpu::Limits {
        let mut l = limits.clone();
        l.max_compute_workgroup_storage_size = l.max_compute_workgroup_storage_size.min(self.workgroup_memory);
        l.max_storage_buffer_binding_size = l.max_storage_buffer_binding_size.min(self.max_storage_binding);
        l.max_buffer_size = l.max_buffer_size.min(self.max_buffer);
        l.max_storage_buffers_per_shader_stage = l.max_storage_buffers_per_shader_stage.min(self.bindings_per_stage);
        l
    }

    /// A profile for tests of the table: NVIDIA's H100 as `wgpu-llm devices` reports it on
    /// Vulkan (48 KiB of workgroup memory, 1024 invocations, subgroups of 32).
    pub fn h100() -> DeviceProfile {
        DeviceProfile {
            family: Family::NvidiaHopper,
            vendor: 0x10de,
            name: "NVIDIA H100 80GB HBM3".into(),
            backend: wgpu::Backend::Vulkan,
            emulated: true,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            f16: true,
            subgroups: true,
            coop_shapes: vec![CoopShape { m: 16, n: 16, k: 16, ab: "F16".into(), cr: "F32".into() }],
            workgroup_memory: 48 << 10,
            max_storage_binding: (2u64 << 30) - 4,
            max_buffer: (2u64 << 30) - 4,
            bindings_per_stage: 1 << 20,
            max_invocations: 1024,
            int_dot: true,
            one_pass_per_step: false,
        }
    }
}

impl std::fmt::Display for DeviceProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let coop: Vec<String> =
            self.coop_shapes.iter().map(|c| format!("{}x{}x{} {}->{}", c.m, c.n, c.k, c.ab, c.cr)).collect();
        writeln!(
            f,
            "    profile: {:?}{} (vendor {:#06x}, {:?})  subgroups {}..{}  f16: {}  integer dot products: {}  one pass a step: {}",
            self.family,
            if self.emulated { ", emulated" } else { "" },
            self.vendor,
            self.backend,
            self.subgroup_min_size,
            self.subgroup_max_size,
            self.f16,
            self.int_dot,
            self.one_pass_per_step,
        )?;
        write!(
            f,
            "    profile limits: workgroup memory {} KiB, storage binding {} MiB, buffer {} MiB, {} storage bindings a stage, {} invocations; cooperative matrices: {}",
            self.workgroup_memory >> 10,
            self.max_storage_binding >> 20,
            self.max_buffer >> 20,
            self.bindings_per_stage,
            self.max_invocations,
            if coop.is_empty() { "none".to_string() } else { coop.join(", ") }
        )
    }
}
