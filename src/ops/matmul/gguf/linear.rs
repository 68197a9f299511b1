//! The quantized linear layer's dispatch: which kernel records `y (+)= x · Wᵀ (+ bias)` for a
//! shape (matvec, batch matvec, tiled or cooperative-matrix matmul), and the expert projections'.

use super::batch::{batch_rows, matvec_quant_batch};
use super::experts_config;
use super::matmul::{matmul_quant, matmul_quant_coop};
use super::matvec::{matvec_quant, matvec_quant_routed};
use super::QMatvecConfig;
use crate::error::Result;
use crate::gpu::{Gpu, Kernel, Tensor};
use crate::ops::matmul::{
    check_matmul_input, check_operands, fuses_input, tuned_shape, Input, LinearOpts, LinearShape, MatmulConfig, Route,
    MATVEC_MAX_T,
};
use crate::weights::{is_supported, QuantWeight};

/// Records `y (+)= x · Wᵀ (+ bias)` with a quantized W: matvec up to [`MATVEC_MAX_T`] tokens, the
/// tiled matmul for more. Shapes are checked as [`crate::ops::matmul::linear`] checks them (a mismatch
/// panics: shapes are fixed by the model); `y` may be a view with `opts.ld_out` (row chunks of an
/// lm_head writing one logits buffer).
pub fn linear_quant(
    gpu: &Gpu,
    x: &Tensor,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    linear_quant_in(gpu, x, Input::Plain, w, bias, y, opts)
}

/// [`linear_quant`] with a fused [`Input`] (matvec only: see [`fuses_input`]).
pub fn linear_quant_in(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    let s = check_operands("linear_quant", &input.checked_x(x, w.shape[1]), w.shape[0], w.shape[1], bias, y, opts);
    assert!(
        is_supported(w.dtype) && s.k % w.dtype.block_size() == 0,
        "linear_quant: K = {} is not whole {} blocks",
        s.k,
        w.dtype
    );
    if s.t <= MATVEC_MAX_T {
        assert!(
            matches!(input, Input::Plain) || fuses_input(s.t, s.k),
            "linear_quant: {input:?} cannot be fused at {s:?}"
        );
        if opts.batch && !opts.one_token {
            return matvec_quant_batch(gpu, x, input, w, bias, y, &s, opts, batch_rows(s.n, s.t), None);
        }
        // (The one-token form of a batch step: every row in the one-token configuration, its sums
        // the one-token pass's.)
        let one = tuned_shape(&s, &opts);
        let cfg = QMatvecConfig::new(gpu, w.dtype, &one).for_input(gpu, w.dtype, &one, input);
        let cfg = if opts.batch { cfg.for_rows(gpu, w.dtype, s.k, s.t) } else { cfg };
        matvec_quant(gpu, x, input, w, bias, y, &s, opts, cfg)
    } else {
        check_matmul_input("linear_quant", &input, &s, &opts);
        if gpu.caps.coop {
            return matmul_quant_coop(gpu, x, w, bias, y, &s, opts, &[]);
        }
        matmul_quant(gpu, x, w, bias, y, &s, opts, MatmulConfig::new(&s))
    }
}

/// Records the quantized expert projection of [`crate::ops::moe::linear_experts`] (its checks
/// done): `s.t` slots of `s.n` rows (per expert) over K = `s.k`. Without `groups`, a slot a
/// workgroup column (the one-token matvec); with `groups` ([`crate::ops::moe::moe_group`]'s table
/// for these slots, and its tiles: [`crate::ops::moe::group_tiles`]), the batch kernel (`wgsl/matvec_quant_batch.wgsl`, GROUPED) over tiles of up
/// to 8 slots of one expert, a unit of its rows dequantized once a tile (prefill's form: at many
/// tokens each expert has many slots).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matvec_experts_quant(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &QuantWeight,
    route: Route<'_>,
    groups: Option<(&Tensor, usize)>,
    y: &Tensor,
    s: &LinearShape,
    opts: LinearOpts,
) -> Result<Kernel> {
    assert!(
        is_supported(w.dtype) && s.k % w.dtype.block_size() == 0,
        "linear_experts: K = {} is not whole {} blocks",
        s.k,
        w.dtype
    );
    assert!(matches!(input, Input::Plain) || s.k % 4 == 0, "linear_experts: {input:?} cannot be fused at K = {}", s.k);
    match groups {
        None => {
            let cfg = experts_config(gpu, w.dtype, s);
            matvec_quant_routed(gpu, x, input, w, None, y, s, opts, cfg, Some(&route))
        }
        Some((g, tiles)) => matvec_quant_batch(gpu, x, input, w, None, y, s, opts, 32, Some((&route, g, tiles))),
    }
}
