//! GPU ops, one module per family. Each op has: a constructor that records a [`Kernel`](crate::gpu::Kernel)
//! from its WGSL file (`wgsl/<op>.wgsl`), a CPU reference (`cpu::<op>` in the same module), and a test
//! on random inputs comparing the two.

pub mod attention;
pub mod deltanet;
pub mod elementwise;
pub mod embedding;
pub mod matmul;
pub mod moe;
pub mod norm;
pub mod rope;

/// Per-step values shared by the position-dependent kernels (RoPE, KV-cache write, attention,
/// the recurrent states), bound as one uniform buffer that the host rewrites each step: recorded
/// kernels never change. WGSL twin: `struct Step` in `wgsl/include/step.wgsl` (the test below
/// checks that the two agree).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepParams {
    /// Absolute position of the first token of this pass (= tokens already in the KV cache).
    pub pos: u32,
    /// Tokens in this pass (T); the kernels were recorded for at most this many.
    pub n_tokens: u32,
    /// The sequence's KV-cache slot (0 for a model that holds one sequence).
    pub slot: u32,
    pub _pad: u32,
}

#[cfg(test)]
mod tests {
    /// `StepParams` and WGSL's `struct Step` (wgsl/include/step.wgsl) have the same members at
    /// the same offsets.
    #[test]
    fn step_params_match_the_wgsl_struct() {
        let src = format!(
            "{}\n@group(0) @binding(0) var<uniform> step: Step;",
            crate::gpu::shader::preprocess("include/step", &crate::gpu::Macros::new()).unwrap()
        );
        let module = naga::front::wgsl::parse_str(&src).unwrap();
        let (_, ty) = module.types.iter().find(|(_, t)| t.name.as_deref() == Some("Step")).expect("struct Step");
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("Step is a struct") };
        let got: Vec<(&str, u32)> = members.iter().map(|m| (m.name.as_deref().unwrap(), m.offset)).collect();
        let want = [
            ("pos", std::mem::offset_of!(super::StepParams, pos) as u32),
            ("n_tokens", std::mem::offset_of!(super::StepParams, n_tokens) as u32),
            ("slot", std::mem::offset_of!(super::StepParams, slot) as u32),
            ("_pad0", std::mem::offset_of!(super::StepParams, _pad) as u32),
        ];
        assert_eq!(got, want);
        assert_eq!(*span as usize, std::mem::size_of::<super::StepParams>());
    }
}
