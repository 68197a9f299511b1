//! The quantized matmuls of many tokens: tiled (`wgsl/matmul_quant.wgsl`) and on cooperative
//! matrices (`wgsl/matmul_quant_coop.wgsl`).

use crate::error::Result;
use crate::gpu::{Gpu, Kernel};
use crate::ops::matmul::{LinearShape, MatmulConfig, Operands};
use crate::weights::{kernel_block, QuantWeight};

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/include/matmul_quant_params.wgsl` (matmul_quant, matmul_quant_coop).
    pub(crate) struct MatmulQuantUniform = "Params" {
        t: u32,
        n: u32,
        k: u32,
        ld_out: u32,
        o1: u32,
        o2: u32,
        bpr: u32,
        _pad: u32,
    }
}

/// The uniform of both quantized matmuls (`Params`, wgsl/include/matmul_quant_params.wgsl).
fn matmul_quant_params(gpu: &Gpu, label: &str, w: &QuantWeight, s: &LinearShape) -> wgpu::Buffer {
    let bpr = s.k / kernel_block(w.dtype);
    let params = MatmulQuantUniform {
        t: s.t as u32,
        n: s.n as u32,
        k: s.k as u32,
        ld_out: s.ld_out as u32,
        o1: w.planes[0],
        o2: w.planes[1],
        bpr: bpr as u32,
        _pad: 0,
    };
    gpu.uniform(label, &params)
}

/// Records the matmul on cooperative matrices (`wgsl/matmul_quant_coop.wgsl`: tensor cores,
/// x and W's values met as f16, f32 sums) where the device has them (`Caps::coop`), with extra
/// `flags` (none in the engine: the measurement probes of `benches/quant.rs`).
pub fn matmul_quant_coop(gpu: &Gpu, op: &Operands<'_, QuantWeight>, s: &LinearShape, flags: &[&str]) -> Result<Kernel> {
    assert!(gpu.caps.coop, "matmul_quant_coop on a device without cooperative matrices");
    let macros = flags.iter().fold(op.type_macros(gpu), |m, f| m.flag(f));
    let params = matmul_quant_params(gpu, "matmul_quant_coop.params", op.w, s);
    let bindings = op.quant_bindings(gpu, s, &params);
    let groups = [(s.n as u32).div_ceil(64), (s.t as u32).div_ceil(128), 1];
    gpu.kernel("matmul_quant_coop", "main", &macros, &bindings, groups)
}

/// Records the tiled quantized matmul with its tile given.
pub fn matmul_quant(gpu: &Gpu, op: &Operands<'_, QuantWeight>, s: &LinearShape, cfg: MatmulConfig) -> Result<Kernel> {
    let MatmulConfig { tile, bk } = cfg;
    // Staging: 2 runs of 4 k per thread and slice; a slice never straddles a block (K is whole
    // blocks of 32 or 256, and bk divides 32).
    assert!(matches!(tile, 4 | 8) && 16 * tile * bk / 4 == 2 * 256 && 32 % bk == 0);
    let macros = op.type_macros(gpu).set("TILE", tile).flag_if("TILE8", tile == 8).set("BK", bk);
    let params = matmul_quant_params(gpu, "matmul_quant.params", op.w, s);
    let bindings = op.bindings(gpu, [op.w.buffer.as_entire_binding()], s, &params);
    gpu.kernel("matmul_quant", "main", &macros, &bindings, cfg.groups(s))
}
