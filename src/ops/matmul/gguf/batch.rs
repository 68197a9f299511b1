//! The batch step's quantized matvec (`wgsl/matvec_quant_batch.wgsl`).

use super::matvec::matvec_quant_params;
use crate::error::Result;
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};
use crate::ops::matmul::{LinearShape, Operands};
use crate::weights::QuantWeight;

/// Tokens a workgroup of `wgsl/matvec_quant_batch.wgsl` takes (the grid's z: groups of them).
pub(super) const BATCH_TB: u32 = 8;

/// Rows of W a workgroup of `wgsl/matvec_quant_batch.wgsl` takes (its threads: RW · TB): 32 (a
/// subgroup's width on NVIDIA: a subgroup's rows share their x loads), or 16 where the grid would
/// have fewer than 264 workgroups (two an SM on the H100; `bench_quant_batch`, N = 1536 and 2048 at
/// 1-32 tokens: 16 rows 5-30 % faster than 32, and than 8 for Q6_K). The sums are the same
/// whatever RW, so the choice may depend on T.
pub fn batch_rows(n: usize, t: usize) -> u32 {
    let groups = (t as u32).div_ceil(BATCH_TB);
    if (n as u32).div_ceil(32) * groups >= 264 {
        32
    } else {
        16
    }
}

/// Records a batch step's projection (`LinearOpts::batch`, up to [`MATVEC_MAX_T`] tokens) with
/// `wgsl/matvec_quant_batch.wgsl`: each unit of W dequantized once for 8 tokens, the tokens' x in
/// workgroup memory; a token's sums do not depend on the batch (its size, the token's row, the
/// others). With `grouped` (the groups table and its tiles; `op.route` set) the tokens are the slots
/// of an expert projection grouped by expert ([`matvec_experts_quant`] with its groups), a tile a
/// workgroup.
pub fn matvec_quant_batch(
    gpu: &Gpu,
    op: &Operands<'_, QuantWeight>,
    s: &LinearShape,
    rw: u32,
    grouped: Option<(&Tensor, usize)>,
) -> Result<Kernel> {
    assert!(matches!(rw, 16 | 32), "matvec_quant_batch: {rw} rows a workgroup");
    assert!(grouped.is_some() == op.route.is_some(), "matvec_quant_batch: routed slots come grouped");
    let mut macros = op
        .quant_macros(gpu)
        .set("GB", if op.bias.is_some() { 6 } else { 5 })
        .set("WG", rw * BATCH_TB)
        .set("RW", rw)
        .set("TB", BATCH_TB);
    let params = matvec_quant_params(gpu, "matvec_quant_batch.params", op, s);
    let mut bindings = op.quant_bindings(gpu, s, &params);
    let mut z = (s.t as u32).div_ceil(BATCH_TB);
    if let Some((groups, tiles)) = grouped {
        assert!(
            groups.ty == ElemType::U32 && groups.numel() >= s.t + 3 * tiles,
            "linear_experts: the groups table must be u32 of {} elements, got {:?} {:?}",
            s.t + 3 * tiles,
            groups.ty,
            groups.shape
        );
        macros = macros.flag("GROUPED").set("EB", bindings.len());
        bindings.push(groups.binding());
        z = tiles as u32;
    }
    let [gx, gy, _] = grid((s.n as u32).div_ceil(rw));
    gpu.kernel("matvec_quant_batch", "main", &macros, &bindings, [gx, gy, z])
}
