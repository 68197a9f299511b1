//! Elementwise ops: residual add (`wgsl/add.wgsl`).

use crate::error::Result;
use crate::gpu::{kernel::grid, Gpu, Kernel, Tensor};

/// `x += y` over all elements (f32).
pub fn add(gpu: &Gpu, x: &Tensor, y: &Tensor) -> Result<Kernel> {
    assert_eq!(x.numel(), y.numel());
    let n = x.numel() as u32;
    let params = gpu.uniform("add.params", &[n, 0, 0, 0]);
    gpu.kernel(
        "add",
        "main",
        &gpu.macros(),
        &[x.binding(), y.binding(), params.as_entire_binding()],
        grid(n.div_ceil(256)),
    )
}

pub mod cpu {
    pub fn add(x: &mut [f32], y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;

    #[test]
    fn add_matches_cpu() {
        for gpu in gpu_variants() {
            for n in [1usize, 255, 257, 4099] {
                let a = random(n, 1, 3.0);
                let b = random(n, 2, 3.0);
                let x = gpu.upload_f32("x", &[n], &a).unwrap();
                let y = gpu.upload_f32("y", &[n], &b).unwrap();
                let k = add(&gpu, &x, &y).unwrap();
                gpu.run(&[&k]).unwrap();
                let got = gpu.read_f32(&x).unwrap();
                let mut want = a.clone();
                cpu::add(&mut want, &b);
                assert_eq!(got, want, "n={n}");
            }
        }
    }
}
