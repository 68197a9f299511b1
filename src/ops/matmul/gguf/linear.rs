//! The quantized linear layer's dispatch: which kernel records `y (+)= x · Wᵀ (+ bias)` for a
//! shape (matvec, batch matvec, tiled or cooperative-matrix matmul), and the expert projections'.

use super::batch::{batch_rows, matvec_quant_batch};
use super::experts_config;
use super::matmul::{matmul_quant, matmul_quant_coop};
use super::matvec::matvec_quant;
use super::QMatvecConfig;
use crate::error::Result;
use crate::gpu::{Gpu, Kernel, Tensor};
use crate::ops::matmul::{
    check_matmul_input, check_operands, fuses_input, tuned_shape, Input, LinearShape, MatmulConfig, Operands, Weight,
    MATVEC_MAX_T,
};
use crate::weights::{is_supported, QuantWeight};

/// `y (+)= x · Wᵀ (+ bias)` with a quantized W: matvec up to [`MATVEC_MAX_T`] tokens, the tiled
/// matmul for more. Shapes are checked as for an f16 W (a mismatch panics: shapes are fixed by the
/// model); `y` may be a view with `opts.ld_out` (row chunks of an lm_head writing one logits
/// buffer).
impl Weight for QuantWeight {
    fn record(gpu: &Gpu, op: &Operands<'_, QuantWeight>) -> Result<Kernel> {
        let Operands { x, input, w, bias, y, opts, .. } = *op;
        let [n, k] = w.shape;
        let s = check_operands("linear_quant", &input.checked_x(x, k), n, k, bias, y, opts);
        check_blocks("linear_quant", w, &s);
        if s.t <= MATVEC_MAX_T {
            assert!(
                matches!(input, Input::Plain) || fuses_input(s.t, s.k),
                "linear_quant: {input:?} cannot be fused at {s:?}"
            );
            if opts.batch && !opts.one_token {
                return matvec_quant_batch(gpu, op, &s, batch_rows(s.n, s.t), None);
            }
            // (The one-token form of a batch step: every row in the one-token configuration, its
            // sums the one-token pass's.)
            let one = tuned_shape(&s, &opts);
            let cfg = QMatvecConfig::new(gpu, w.dtype, &one).for_input(gpu, w.dtype, &one, input);
            let cfg = if opts.batch { cfg.for_rows(gpu, w.dtype, s.k, s.t) } else { cfg };
            matvec_quant(gpu, op, &s, cfg)
        } else {
            check_matmul_input("linear_quant", &input, &s, &opts);
            if gpu.caps.coop {
                return matmul_quant_coop(gpu, op, &s, &[]);
            }
            matmul_quant(gpu, op, &s, MatmulConfig::new(&s))
        }
    }
}

/// Asserts that W's type has kernels and that its rows (K = `s.k`) are whole blocks; `what`
/// names the op in the message.
fn check_blocks(what: &str, w: &QuantWeight, s: &LinearShape) {
    assert!(
        is_supported(w.dtype) && s.k.is_multiple_of(w.dtype.block_size()),
        "{what}: K = {} is not whole {} blocks",
        s.k,
        w.dtype
    );
}

/// Records the quantized expert projection of [`crate::ops::moe::linear_experts`] (its checks
/// done): `s.t` slots of `s.n` rows (per expert) over K = `s.k`, no bias. Without `groups`, a
/// slot a workgroup column (the one-token matvec, tuned for `tuned_slots` slots); with `groups` ([`crate::ops::moe::moe_group`]'s
/// table for these slots, and its tiles: [`crate::ops::moe::group_tiles`]), the batch kernel
/// (`wgsl/matvec_quant_batch.wgsl`, GROUPED) over tiles of up to 8 slots of one expert, a unit of
/// its rows dequantized once a tile (prefill's form: at many tokens each expert has many slots).
pub(crate) fn matvec_experts_quant(
    gpu: &Gpu,
    op: &Operands<'_, QuantWeight>,
    s: &LinearShape,
    tuned_slots: usize,
    groups: Option<(&Tensor, usize)>,
) -> Result<Kernel> {
    let input = op.input;
    check_blocks("linear_experts", op.w, s);
    assert!(op.bias.is_none() && op.route.is_some(), "linear_experts: routed, no bias");
    assert!(
        matches!(input, Input::Plain) || s.k.is_multiple_of(4),
        "linear_experts: {input:?} cannot be fused at K = {}",
        s.k
    );
    match groups {
        None => matvec_quant(gpu, op, s, experts_config(gpu, op.w.dtype, s, tuned_slots)),
        Some(grouped) => matvec_quant_batch(gpu, op, s, 32, Some(grouped)),
    }
}
