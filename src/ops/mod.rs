//! GPU ops, one module per family. Each op has: a constructor that records a [`Kernel`](crate::gpu::Kernel)
//! from its WGSL file (`wgsl/<op>.wgsl`), a CPU reference (`cpu::<op>` in the same module), and a test
//! on random inputs comparing the two.

pub mod elementwise;
pub mod matmul;
pub mod attention;
pub mod rope;
pub mod norm;
pub mod embedding;
