//! Elementwise ops: residual add (`wgsl/add.wgsl`), the gated MLP activation
//! (`wgsl/gated_act.wgsl`) and the sigmoid output gate (`wgsl/mul_sigmoid.wgsl`).

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};

/// The gated MLP activation: `act(gate) * up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up
    SiluGated,
    /// gelu_tanh(gate) * up
    GeluTanhGated,
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/add.wgsl` and `wgsl/mul_sigmoid.wgsl` (the element count).
    pub(crate) struct InPlaceUniform = "Params" { n: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
}

/// `x += y` over all elements (f32).
pub fn add(gpu: &Gpu, x: &Tensor, y: &Tensor) -> Result<Kernel> {
    assert_eq!(x.numel(), y.numel());
    in_place("add", gpu, x, y)
}

/// `x *= sigmoid(g)` over all elements (f32): the output gate of Qwen3.5's attention.
pub fn mul_sigmoid(gpu: &Gpu, x: &Tensor, g: &Tensor) -> Result<Kernel> {
    if x.ty != ElemType::F32 || g.ty != ElemType::F32 || x.numel() != g.numel() {
        return Err(Error::InvalidArgument(format!(
            "mul_sigmoid: need f32 x and g of one size, got {:?} {:?} and {:?} {:?}",
            x.ty, x.shape, g.ty, g.shape
        )));
    }
    in_place("mul_sigmoid", gpu, x, g)
}

/// Kernel `name` updating `x` in place from `y`, element by element (`x` and `y` of one size;
/// uniform: the element count).
fn in_place(name: &str, gpu: &Gpu, x: &Tensor, y: &Tensor) -> Result<Kernel> {
    let n = x.numel() as u32;
    let params = gpu.uniform(&format!("{name}.params"), &InPlaceUniform { n, ..Default::default() });
    gpu.kernel(
        name,
        "main",
        &gpu.macros(),
        &[x.binding(), y.binding(), params.as_entire_binding()],
        grid(n.div_ceil(256)),
    )
}

/// `out[t, f] = act(gu[t, f]) * gu[t, F + f]`: the activation after the fused gate+up
/// projection. `gu`: f32 `[T, 2F]` (each row `[gate: F | up: F]`); `out`: f32 `[T, F]`.
/// `act` = SiLU or PyTorch's `gelu(approximate='tanh')`, both computed as `x * sigmoid(y)` (see
/// `wgsl/gated_act.wgsl`; NaN-free for any finite input).
pub fn gated_act(gpu: &Gpu, gu: &Tensor, out: &Tensor, act: Activation) -> Result<Kernel> {
    gated_act_in(gpu, gu, out, act, false)
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/gated_act.wgsl`.
    pub(crate) struct GatedActUniform = "Params" { n_tokens: u32, f: u32, _pad0: u32, _pad1: u32 }
}

/// [`gated_act`]; `interleaved`: gu's rows are (gate, up) pairs (a GLU weight's output after a
/// matmul), not `[gate | up]`.
pub fn gated_act_in(gpu: &Gpu, gu: &Tensor, out: &Tensor, act: Activation, interleaved: bool) -> Result<Kernel> {
    let f = *out.shape.last().unwrap_or(&0);
    let n_tokens = out.numel().checked_div(f).unwrap_or(0);
    if gu.ty != ElemType::F32 || out.ty != ElemType::F32 || f == 0 || gu.numel() != 2 * out.numel() {
        return Err(Error::InvalidArgument(format!(
            "gated_act: need f32 gu [T, 2F] and out [T, F], got {:?} {:?} and {:?} {:?}",
            gu.ty, gu.shape, out.ty, out.shape
        )));
    }
    let n = out.numel() as u32;
    let params = gpu
        .uniform("gated_act.params", &GatedActUniform { n_tokens: n_tokens as u32, f: f as u32, ..Default::default() });
    let macros = match act {
        Activation::SiluGated => gpu.macros().flag("SILU"),
        Activation::GeluTanhGated => gpu.macros().flag("GELU_TANH"),
    }
    .flag_if("INTERLEAVED", interleaved);
    gpu.kernel(
        "gated_act",
        "main",
        &macros,
        &[gu.binding(), out.binding(), params.as_entire_binding()],
        grid(n.div_ceil(256)),
    )
}

pub mod cpu {
    use super::Activation;

    pub fn add(x: &mut [f32], y: &[f32]) {
        x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
    }

    /// `x *= sigmoid(g)`, in f64.
    pub fn mul_sigmoid(x: &mut [f32], g: &[f32]) {
        x.iter_mut().zip(g).for_each(|(a, &b)| *a = (*a as f64 / (1.0 + (-(b as f64)).exp())) as f32);
    }

    /// `x * sigmoid(x)`, in f64.
    pub fn silu(x: f32) -> f32 {
        let x = x as f64;
        (x / (1.0 + (-x).exp())) as f32
    }

    /// PyTorch's `gelu(x, approximate='tanh')` = `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`,
    /// in f64, evaluated as `x * sigmoid(2z)` (the same function: `1 + tanh(z) = 2 sigmoid(2z)`)
    /// so that the negative tail is accurate.
    pub fn gelu_tanh(x: f32) -> f32 {
        let x = x as f64;
        let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        (x / (1.0 + (-2.0 * z).exp())) as f32
    }

    /// `out[t, f] = act(gu[t, f]) * gu[t, F + f]` with `F = out.len() / T`, rows of `gu` = `[gate | up]`.
    pub fn gated_act(gu: &[f32], out: &mut [f32], f: usize, act: Activation) {
        let a = match act {
            Activation::SiluGated => silu,
            Activation::GeluTanhGated => gelu_tanh,
        };
        for (o_row, gu_row) in out.chunks_mut(f).zip(gu.chunks(2 * f)) {
            let (g, u) = gu_row.split_at(f);
            for ((o, &g), &u) in o_row.iter_mut().zip(g).zip(u) {
                *o = (a(g) as f64 * u as f64) as f32;
            }
        }
    }

    /// [`gated_act`] over rows of (gate, up) pairs.
    pub fn gated_act_interleaved(gu: &[f32], out: &mut [f32], f: usize, act: Activation) {
        let pairs: Vec<f32> = gu
            .chunks(2 * f)
            .flat_map(|row| {
                let (g, u): (Vec<f32>, Vec<f32>) = row.chunks(2).map(|p| (p[0], p[1])).unzip();
                g.into_iter().chain(u)
            })
            .collect();
        gated_act(&pairs, out, f, act);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;

    /// Runs the in-place op `x = op(x, y)` on the GPU and its CPU twin on `x` and `y`: (GPU, CPU).
    fn in_place_pair(
        gpu: &Gpu,
        x: Vec<f32>,
        y: &[f32],
        op: fn(&Gpu, &Tensor, &Tensor) -> Result<Kernel>,
        cpu_op: fn(&mut [f32], &[f32]),
    ) -> (Vec<f32>, Vec<f32>) {
        let xt = gpu.upload_f32("x", &[x.len()], &x).unwrap();
        let yt = gpu.upload_f32("y", &[y.len()], y).unwrap();
        let k = op(gpu, &xt, &yt).unwrap();
        gpu.run(&[&k]).unwrap();
        let mut want = x;
        cpu_op(&mut want, y);
        (gpu.read_f32(&xt).unwrap(), want)
    }

    #[test]
    fn add_matches_cpu() {
        for gpu in gpu_variants() {
            for n in [1usize, 255, 257, 4099] {
                let (got, want) = in_place_pair(&gpu, random(n, 1, 3.0), &random(n, 2, 3.0), add, cpu::add);
                assert_eq!(got, want, "n={n}");
            }
        }
    }

    #[test]
    fn mul_sigmoid_matches_cpu() {
        for gpu in gpu_variants() {
            for n in [1usize, 257, 4099] {
                let a = random(n, 3, 3.0);
                // Gates across sigmoid's whole range, the far tails included (exp overflow).
                let mut b = random(n, 4, 12.0);
                b[0] = -200.0;
                let (got, want) = in_place_pair(&gpu, a, &b, mul_sigmoid, cpu::mul_sigmoid);
                // Vulkan allows exp(x) 3 + 2|x| ulps; 1 + e, the division and the product add
                // about 3 more: the bound in ulps of the result.
                for (i, ((got, want), gate)) in got.iter().zip(&want).zip(&b).enumerate() {
                    let ulps = 6.0 + 2.0 * gate.abs();
                    assert!(
                        (got - want).abs() <= ulps * f32::EPSILON * want.abs() + 1e-30,
                        "n={n} i={i}: {got} vs {want} (gate {gate})"
                    );
                }
            }
        }
    }

    #[test]
    fn gelu_tanh_reference_is_the_pytorch_formula() {
        // The literal formula in f64 (accurate where 1 + tanh does not cancel, i.e. x > -3).
        let literal =
            |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        for i in -3000..=30000 {
            let x = i as f32 * 1e-3;
            let want = literal(x as f64);
            let got = cpu::gelu_tanh(x) as f64;
            assert!((got - want).abs() <= 1e-7 * want.abs() + 1e-12, "x={x}: {got} vs {want}");
        }
        assert_eq!(cpu::gelu_tanh(-30.0), 0.0);
        assert_eq!(cpu::gelu_tanh(30.0), 30.0);
    }

    /// Relative error bound of the GPU activations against the f64 references: exp is allowed
    /// 3 + 2|y| ulp in Vulkan (and is similar in Metal's fast math), so for |y| ≤ 60 (inputs to ±30)
    /// up to ~1e-5; observed on lavapipe: see the assertion message. Absolute floor 1e-30 for
    /// results the exp clamp sends to ~1e-34 instead of 0.
    const ACT_RTOL: f64 = 2e-5;

    #[test]
    fn gated_act_matches_cpu() {
        for gpu in gpu_variants() {
            for act in [Activation::SiluGated, Activation::GeluTanhGated] {
                for (t, f) in [(1usize, 64usize), (3, 1000), (5, 4099)] {
                    let mut gu = random(t * 2 * f, 7 + f as u64, 4.0);
                    // Large |gate|: saturated and deep negative tails (NaN-prone tanh/exp).
                    for (i, v) in [-30.0f32, 30.0, -15.0, 15.0, -9.0, 9.0, -88.0, 100.0, 0.0].iter().enumerate() {
                        gu[i * 7 % f] = *v;
                    }
                    let x = gpu.upload_f32("gu", &[t, 2 * f], &gu).unwrap();
                    let out = gpu.upload_f32("out", &[t, f], &random(t * f, 3, 1.0)).unwrap();
                    let interleaved = f == 1000;
                    let k = gated_act_in(&gpu, &x, &out, act, interleaved).unwrap();
                    gpu.run(&[&k]).unwrap();
                    let got = gpu.read_f32(&out).unwrap();
                    let mut want = vec![0.0; t * f];
                    if interleaved {
                        cpu::gated_act_interleaved(&gu, &mut want, f, act);
                    } else {
                        cpu::gated_act(&gu, &mut want, f, act);
                    }
                    let mut worst = 0.0f64;
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        assert!(g.is_finite(), "{act:?} T={t} F={f}: {g} at {i}");
                        let err = (g as f64 - w as f64).abs();
                        assert!(err <= ACT_RTOL * (w as f64).abs() + 1e-30, "{act:?} T={t} F={f}: {g} vs {w} at {i}");
                        if w.abs() > 1e-30 {
                            worst = worst.max(err / (w as f64).abs());
                        }
                    }
                    eprintln!("gated_act {act:?} T={t} F={f} subgroups={}: max rel err {worst:e}", gpu.caps.subgroups);
                }
            }
        }
    }
}
