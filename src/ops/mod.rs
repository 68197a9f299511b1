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

/// Per-step values shared by the position-dependent kernels (RoPE, KV-cache write, attention),
/// bound as one uniform buffer that the host rewrites each step: recorded kernels never change.
/// WGSL twin: `struct Step { pos: u32, n_tokens: u32, _pad0: u32, _pad1: u32 }`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct StepParams {
    /// Absolute position of the first token of this pass (= tokens already in the KV cache).
    pub pos: u32,
    /// Tokens in this pass (T); the kernels were recorded for at most this many.
    pub n_tokens: u32,
    pub _pad: [u32; 2],
}
