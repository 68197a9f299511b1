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
pub(crate) mod signature;
pub mod uniform;
#[cfg(test)]
mod uniform_registry;

uniform::uniform_struct! {
    /// Per-step values shared by the position-dependent kernels (RoPE, KV-cache write, attention,
    /// the recurrent states), bound as one uniform buffer that the host rewrites each step: recorded
    /// kernels never change. WGSL twin: `struct Step` in `wgsl/include/step.wgsl` (checked by
    /// `ops::uniform_registry`).
    pub struct StepParams = "Step" {
        /// Absolute position of the first token of this pass (= tokens already in the KV cache).
        pub pos: u32,
        /// Tokens in this pass (T); the kernels were recorded for at most this many.
        pub n_tokens: u32,
        /// The sequence's KV-cache slot (0 for a model that holds one sequence).
        pub slot: u32,
        pub _pad: u32,
    }
}
