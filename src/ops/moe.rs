//! Mixture-of-experts ops: Qwen3.5-MoE's sparse MoE block (transformers'
//! `Qwen3_5MoeSparseMoeBlock`: `Qwen3_5MoeTopKRouter`, `Qwen3_5MoeExperts`, the gated shared expert).
//! Routing stays on the GPU: the chosen experts' ids are data in a buffer, written by
//! [`moe_router`] and read by the workgroups of [`linear_experts`]; the host never reads them.
//!
//! - [`moe_router`] (`wgsl/moe_router.wgsl`): softmax over the E experts' logits and the top k,
//!   renormalized (`norm_topk`), one workgroup per token: ids `u32 (T, k)`, weights `f32 (T, k)`.
//!   Up to 256 experts each expert's rank is counted against all (no rounds); above, k rounds of
//!   a workgroup arg-max (measured on an H100, one token, a dependent dispatch: E = 256, k = 8:
//!   7.3 vs 8.2 us; k = 16: 8.4 vs 13.6; E = 512, k = 10: ranks 17.8, rounds 11.1).
//! - [`linear_experts`] (`wgsl/matvec.wgsl` for f16, `wgsl/matvec_quant.wgsl` for quantized
//!   weights, under their `EXPERTS` flag): `y[s, :] = W[ids[s]] · x[row(s)]` for the T·k slots
//!   `s = t·k + j`, with the matvecs' fused input ([`Input::Norm`], [`Input::Gated`]) and GLU
//!   epilogue ([`LinearOpts::glu`]).
//! - [`moe_combine`] (`wgsl/moe_combine.wgsl`): `x += Σ_j w[t, j] · y[t·k + j] + sigmoid(gate[t]) ·
//!   shared[t]` into the residual stream.
//!
//! # Stacked experts
//!
//! The E experts' weights of one projection are one weight of E·N rows ([`ExpertWeight`]): expert
//! e's `[N, K]` rows are rows `e·N .. e·N + N` (HF's `[E, N, K]` parameter flattened; GGUF's
//! `ffn_*_exps` `[K, N, E]` tensors are this order already). Quantized: one [`QuantWeight`] of
//! `[E·N, K]` (rows are whole blocks, so expert e's blocks follow expert e - 1's; build it with
//! [`QuantWeight::concat_rows`] or from the file's bytes as they are). For the GLU epilogue the
//! gate_up stack interleaves each expert's rows: expert e's rows are `gate_0, up_0, gate_1, up_1,
//! ...` (HF's `gate_up_proj[e]` is `[gate (I rows); up (I rows)]`: row 2i = gate row i, row 2i + 1
//! = up row i), N = 2·I, and the output has I columns. The whole stack is one storage binding:
//! it must fit the device's `max_storage_buffer_binding_size`.
//!
//! # One MoE layer in decode
//!
//! With the post-attention norm fused into the projections that read it, a layer is 7 dispatches:
//! 1. router linear: `logits (T, E + 1) = norm(h) · [router; shared_expert_gate]ᵀ` ([`super::matmul::linear_in`]
//!    with [`Input::Norm`]; column E is the shared expert's gate logit);
//! 2. [`moe_router`] on columns `0 .. E` (ld = E + 1);
//! 3. experts' gate_up: [`linear_experts`] with [`Input::Norm`], GLU, `slots_per_row = k`: `(T·k, I)`;
//! 4. experts' down: [`linear_experts`], `slots_per_row = 1`: `(T·k, H)`;
//! 5. shared expert's gate_up (`linear_in`, Norm + GLU) and 6. its down: `(T, H)`;
//! 7. [`moe_combine`]: `h += Σ_j w_j · y_j + sigmoid(logits[t, E]) · shared`.
//!
//! Of the expert stacks only the k chosen experts' rows are read: as fast as a dense matvec over
//! the same bytes. Measured on an H100 (`bench_moe`, Qwen3.5-35B-A3B's shapes: H = 2048, E = 256,
//! k = 8, I = 512; each call routed to other experts, so weights come from memory): gate_up with
//! the norm and GLU f16 17.6 us (dense 8192 × 2048: 17.0), Q4_K 10.8 (11.5), Q8_0 21.7 (23.9),
//! MLX 4-bit 11.5 (11.3); down f16 10.1 us (dense 16384 × 512: 10.5), Q4_K 8.7 (9.3), Q8_0 11.1
//! (11.0), MLX 4-bit 8.3 (8.0); router 7.3 us, combine 4.4 us; the whole f16 layer (7 dispatches)
//! 63 us.
//!
//! # Prefill: the slots grouped by expert
//!
//! The per-slot matvec reads and dequantizes an expert's rows once per slot that chose it, so its
//! time grows with T (gate_up at T = 512: f16 5.5 ms, Q4_K 2.0 ms, 4-11 us a token). For prefill
//! [`moe_group`] (`wgsl/moe_group.wgsl`, one workgroup) sorts a pass's slots by expert on the GPU
//! and cuts each expert's run into tiles of up to [`GROUP_TILE`] slots; [`linear_experts`] given
//! that table (`groups`) runs the batch kernel (`wgsl/matvec_quant_batch.wgsl`, GROUPED) with a
//! tile per workgroup column: each unit of an expert's rows dequantized once for the tile's slots,
//! each slot's x row staged in workgroup memory, its output written to the slot's own row, so
//! the combine is unchanged. A slot's sums do not depend on the tile it lands in (the batch
//! kernel's invariance). Quantized stacks only (f16 stacks, the tiny test models', run per slot);
//! [`groups_slots`] says when the model groups.
//!
//! # Alignment
//!
//! Every tensor is bound from its offset, which must be a multiple of the device's
//! `min_storage_buffer_offset_alignment` (256 bytes at most): pass whole buffers, or views at
//! such offsets. A column of another buffer (the shared expert's gate logit in the router's
//! output) is passed as the whole buffer plus a stride and column ([`SharedExpert`]), not a view.

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};
use crate::ops::matmul::{self, Input, LinearOpts, LinearShape, QuantWeight};

/// Most experts [`moe_router`] takes (two per thread of its 256).
pub const ROUTER_MAX_EXPERTS: usize = 512;
/// Most experts per token [`moe_router`] takes.
pub const ROUTER_MAX_TOP_K: usize = 256;
/// Slots a tile of [`moe_group`]'s table holds at most (the batch kernel's tokens a workgroup).
pub const GROUP_TILE: usize = 8;

/// Most experts (with a stacked shared expert) [`moe_group`] takes (its workgroup arrays).
pub const GROUP_MAX_EXPERTS: usize = 1024;

/// Tiles [`moe_group`]'s table holds for `slots` slots over `experts` experts: each expert's
/// count rounded up to whole tiles adds at most one tile per expert that has a slot.
pub fn group_tiles(slots: usize, experts: usize) -> usize {
    slots.div_ceil(GROUP_TILE) + experts.min(slots)
}

/// Elements (u32) of [`moe_group`]'s table: the order, then 3 per tile.
pub fn groups_len(slots: usize, experts: usize) -> usize {
    slots + 3 * group_tiles(slots, experts)
}

/// Whether a pass of `slots` slots over `experts` experts runs its quantized expert projections
/// grouped by expert ([`moe_group`]) rather than per slot: where an expert has on average at
/// least 4 slots, i.e. a unit dequantized once serves 4 or more (prefill; a decode step's 8-9
/// slots never).
pub fn groups_slots(slots: usize, experts: usize) -> bool {
    slots >= 4 * experts
}

/// Records the grouping of `ids` (u32, S slots, each an expert of `experts`; an id past the
/// stack counts as its last expert, as [`linear_experts`] reads it) into `groups` (u32,
/// [`groups_len`] elements): the slots ordered by expert, then the tiles (expert, first place,
/// count ≤ [`GROUP_TILE`]) of each expert's run, the unused tiles with count 0. Within an
/// expert the order of its slots may differ from run to run (GPU atomics); the grouped
/// projections' outputs do not.
pub fn moe_group(gpu: &Gpu, ids: &Tensor, experts: usize, groups: &Tensor) -> Result<Kernel> {
    const OP: &str = "moe_group";
    let slots = ids.numel();
    if experts == 0 || experts > GROUP_MAX_EXPERTS || slots == 0 {
        return Err(invalid(format!("{OP}: {slots} slots over {experts} experts (1..={GROUP_MAX_EXPERTS})")));
    }
    check_tensor(gpu, OP, "ids", ids, ElemType::U32, slots)?;
    check_tensor(gpu, OP, "groups", groups, ElemType::U32, groups_len(slots, experts))?;
    let tiles = group_tiles(slots, experts);
    if tiles > gpu.limits.max_compute_workgroups_per_dimension as usize {
        return Err(invalid(format!("{OP}: {tiles} tiles exceed the grid's z limit")));
    }
    let params = gpu.uniform("moe_group.params", &[slots as u32, experts as u32, tiles as u32, 0]);
    gpu.kernel(
        "moe_group",
        "main",
        &gpu.macros().set("TB", GROUP_TILE).set("ME", GROUP_MAX_EXPERTS),
        &[ids.binding(), groups.binding(), params.as_entire_binding()],
        [1, 1, 1],
    )
}

/// Most slots (tokens × experts per token) [`linear_experts`] takes: the grid's z (the device
/// limit, 65535 at least, may be lower).
pub const MAX_SLOTS: usize = 65535;

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// Checks a tensor's type, size and offset alignment (`need` elements from its offset).
fn check_tensor(gpu: &Gpu, op: &str, what: &str, t: &Tensor, ty: ElemType, need: usize) -> Result<()> {
    if t.ty != ty {
        return Err(invalid(format!("{op}: {what} must be {ty:?}, is {:?}", t.ty)));
    }
    if t.numel() < need {
        return Err(invalid(format!("{op}: {what} has {} elements ({:?}), needs {need}", t.numel(), t.shape)));
    }
    let align = gpu.limits.min_storage_buffer_offset_alignment as u64;
    if t.offset % align != 0 {
        return Err(invalid(format!("{op}: {what}'s offset {} is not a multiple of {align} bytes", t.offset)));
    }
    Ok(())
}

/// The standard macros, less SUBGROUP where a subgroup may be wider than the workgroup.
fn macros(gpu: &Gpu, wg: u32) -> crate::gpu::Macros {
    let mut m = gpu.macros();
    if gpu.caps.subgroup_max_size.max(1).next_power_of_two() > wg {
        m.0.remove("SUBGROUP");
    }
    m
}

/// Records the router of `T = ids.numel() / top_k` tokens: per token t, the `top_k` experts of
/// largest probability under `softmax(logits[t, 0 .. experts])` (the order of the logits; equal
/// logits: lower index first), larger first, into `ids[t, :]` (u32) and their probabilities into
/// `weights[t, :]` (f32), renormalized to sum 1 with `norm_topk` (Qwen3.5-MoE, Qwen3-MoE), as
/// they are otherwise. `logits` is f32 with rows of stride `ld >= experts` (columns past
/// `experts`, e.g. the shared expert's gate logit, are not read); `ids` and `weights` hold
/// `T · top_k` elements each. `experts <= 512`, `1 <= top_k <= experts`.
#[allow(clippy::too_many_arguments)]
pub fn moe_router(
    gpu: &Gpu,
    logits: &Tensor,
    ld: usize,
    experts: usize,
    top_k: usize,
    ids: &Tensor,
    weights: &Tensor,
    norm_topk: bool,
) -> Result<Kernel> {
    router(gpu, logits, ld, experts, top_k, ids, weights, norm_topk, experts <= RANK_MAX_EXPERTS, false)
}

/// [`moe_router`] with a shared expert as one more slot per token: `ids` / `weights` are
/// `(T, top_k + 1)`, the last slot of each row id `experts` (the shared expert stacked after the
/// routed ones) weighted `sigmoid(logits[t, experts])` (its gate logit, column `experts`, so
/// `ld > experts`). The experts' matvecs then run the shared expert too, and the combine needs no
/// shared term: two dispatches fewer a layer.
#[allow(clippy::too_many_arguments)]
pub fn moe_router_shared(
    gpu: &Gpu,
    logits: &Tensor,
    ld: usize,
    experts: usize,
    top_k: usize,
    ids: &Tensor,
    weights: &Tensor,
    norm_topk: bool,
) -> Result<Kernel> {
    if ld <= experts {
        return Err(invalid(format!("moe_router: row stride {ld} has no shared gate column after {experts} experts")));
    }
    router(gpu, logits, ld, experts, top_k, ids, weights, norm_topk, experts <= RANK_MAX_EXPERTS, true)
}

/// Up to this many experts the router ranks every expert against all (`RANK`: E² comparisons
/// and no rounds); above, it takes k rounds of a workgroup arg-max.
const RANK_MAX_EXPERTS: usize = 256;

#[allow(clippy::too_many_arguments)]
fn router(
    gpu: &Gpu,
    logits: &Tensor,
    ld: usize,
    experts: usize,
    top_k: usize,
    ids: &Tensor,
    weights: &Tensor,
    norm_topk: bool,
    rank: bool,
    shared_slot: bool,
) -> Result<Kernel> {
    const OP: &str = "moe_router";
    if experts == 0 || experts > ROUTER_MAX_EXPERTS || top_k == 0 || top_k > experts.min(ROUTER_MAX_TOP_K) {
        return Err(invalid(format!(
            "{OP}: {experts} experts, top {top_k} (at most {ROUTER_MAX_EXPERTS} experts, 1 <= top_k <= experts)"
        )));
    }
    if ld < experts {
        return Err(invalid(format!("{OP}: row stride {ld} < {experts} experts")));
    }
    let slots = ids.numel();
    let per_row = top_k + usize::from(shared_slot);
    if slots == 0 || slots % per_row != 0 || (shared_slot && top_k >= 256) {
        return Err(invalid(format!("{OP}: ids has {slots} elements, not T · {per_row}")));
    }
    let t = slots / per_row;
    check_tensor(gpu, OP, "ids", ids, ElemType::U32, slots)?;
    check_tensor(gpu, OP, "weights", weights, ElemType::F32, slots)?;
    check_tensor(gpu, OP, "logits", logits, ElemType::F32, (t - 1) * ld + experts + usize::from(shared_slot))?;
    let params = gpu.uniform("moe_router.params", &[t as u32, ld as u32, experts as u32, top_k as u32]);
    gpu.kernel(
        "moe_router",
        "main",
        &macros(gpu, 256)
            .flag_if("NORM_TOPK", norm_topk)
            .flag_if("RANK", rank)
            .flag_if("RANK2", rank && experts > 256)
            .flag_if("SHARED_SLOT", shared_slot),
        &[logits.binding(), ids.binding(), weights.binding(), params.as_entire_binding()],
        grid(t as u32),
    )
}

/// The E experts' weights of one projection, stacked along rows: `[E·N, K]`, expert e's `[N, K]`
/// rows `e·N .. e·N + N` (see the module docs; for a GLU epilogue each expert's rows are
/// interleaved (gate, up) pairs).
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeight<'a> {
    /// f16, packed as [`Tensor`] stores f16 (two per u32), shape `[E·N, K]`, K even.
    F16 { w: &'a Tensor, experts: usize },
    /// Any type [`QuantWeight`] takes (GGUF Q4_0 .. Q6_K, MLX affine), shape `[E·N, K]`.
    Quant { w: &'a QuantWeight, experts: usize },
}

impl ExpertWeight<'_> {
    /// E.
    pub fn experts(&self) -> usize {
        match *self {
            ExpertWeight::F16 { experts, .. } | ExpertWeight::Quant { experts, .. } => experts,
        }
    }

    /// Rows of the stack (E·N) and K.
    pub fn shape(&self) -> [usize; 2] {
        match self {
            ExpertWeight::F16 { w, .. } => {
                assert!(w.ty == ElemType::F16 && w.shape.len() == 2, "linear_experts: W must be f16 [E·N, K]");
                [w.shape[0], w.shape[1]]
            }
            ExpertWeight::Quant { w, .. } => w.shape,
        }
    }

    /// N: rows of one expert.
    pub fn rows_per_expert(&self) -> usize {
        self.shape()[0] / self.experts().max(1)
    }
}

/// Records the expert-indexed projection `y[s, :] = W[ids[s]] · x[s / slots_per_row, :]` (or
/// `y[s, :] += …` with `opts.accumulate`) for the slots `s = 0 .. S`, S = y's rows = x's rows ×
/// `slots_per_row`:
/// - gate_up: x `(T, K)` the layer's input, `slots_per_row` = k (every slot of token t reads x
///   row t), usually with [`Input::Norm`] (the post-attention norm) and [`LinearOpts::glu`] (y
///   `(T·k, N/2)` = act(gate) · up of each expert's interleaved rows);
/// - down: x `(T·k, K)` the gate_up output, `slots_per_row` = 1 (or x `(T·k, 2K)` `[gate | up]`
///   rows with [`Input::Gated`]).
///
/// `ids`: u32, S elements (`(T, k)` as [`moe_router`] writes them); an id past the stack reads its
/// last expert. `y`: f32 `(S, N)` (`(S, N/2)` with GLU), rows of stride `opts.ld_out`. No bias.
/// Without `groups` each slot streams only its expert's rows (the matvec kernels, one token a
/// pass, all slots in one dispatch: grid z = S ≤ [`MAX_SLOTS`]); with `groups` ([`moe_group`]'s
/// table of these ids; quantized stacks only) a workgroup column takes a tile of an expert's
/// slots (see the module docs). Shape mismatches panic, as in [`matmul::linear`].
#[allow(clippy::too_many_arguments)]
pub fn linear_experts(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &ExpertWeight<'_>,
    ids: &Tensor,
    groups: Option<&Tensor>,
    slots_per_row: usize,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    const OP: &str = "linear_experts";
    let [rows, k] = w.shape();
    let experts = w.experts();
    assert!(experts > 0 && rows > 0 && rows % experts == 0, "{OP}: {rows} rows are not {experts} experts' worth");
    let n = rows / experts;
    assert!(k > 0, "{OP}: K = 0");
    assert_eq!(x.ty, ElemType::F32, "{OP}: x must be f32, got {:?}", x.ty);
    let x_cols = input.x_cols(k);
    assert!(
        x.shape.len() == 2 && x.shape[1] == x_cols && x.shape[0] > 0,
        "{OP}: x must be [rows, {x_cols}] ({input:?} over K = {k}), got {:?}",
        x.shape
    );
    assert!(slots_per_row > 0, "{OP}: slots_per_row = 0");
    let slots = x.shape[0] * slots_per_row;
    assert!(
        slots <= MAX_SLOTS.min(gpu.limits.max_compute_workgroups_per_dimension as usize),
        "{OP}: {slots} slots exceed the grid's z limit"
    );
    assert_eq!(ids.ty, ElemType::U32, "{OP}: ids must be u32, got {:?}", ids.ty);
    assert_eq!(ids.numel(), slots, "{OP}: ids must hold {slots} slots (x rows × {slots_per_row}), has {:?}", ids.shape);
    assert_eq!(y.ty, ElemType::F32, "{OP}: y must be f32, got {:?}", y.ty);
    let cols = match opts.glu {
        Some(_) => {
            assert!(n % 2 == 0, "{OP}: GLU needs (gate, up) row pairs, N = {n}");
            assert!(!opts.accumulate, "{OP}: GLU takes no accumulation");
            n / 2
        }
        None => n,
    };
    assert!(y.shape == [slots, cols], "{OP}: y must be [S = {slots}, {cols}], got {:?}", y.shape);
    let ld_out = opts.ld_out.unwrap_or(cols);
    assert!(ld_out >= cols, "{OP}: ld_out = {ld_out} < {cols} columns");
    let s = LinearShape { t: slots, n, k, ld_out, cols };
    let end = y.offset + 4 * s.out_span() as u64;
    assert!(end <= y.buffer.size(), "{OP}: y's rows of stride {ld_out} reach byte {end}, past its buffer");
    let align = gpu.limits.min_storage_buffer_offset_alignment as u64;
    for (what, t) in [("x", x), ("ids", ids)] {
        assert!(t.offset % align == 0, "{OP}: {what}'s offset {} is not a multiple of {align} bytes", t.offset);
    }
    assert!(s.out_span() < u32::MAX as usize && x.numel() < u32::MAX as usize, "{OP}: {s:?} overflows 32-bit indexing");
    let route = matmul::Route { ids, experts: experts as u32, slots_per_row: slots_per_row as u32 };
    match *w {
        ExpertWeight::F16 { w, .. } => {
            assert!(groups.is_none(), "{OP}: f16 stacks run per slot");
            assert!(k % 2 == 0, "{OP}: K = {k} must be even (f16 rows are whole u32 words)");
            assert!(rows * k / 2 < u32::MAX as usize, "{OP}: [{rows}, {k}] overflows 32-bit indexing");
            matmul::matvec_experts(gpu, x, input, w, route, y, &s, opts)
        }
        ExpertWeight::Quant { w, .. } => {
            matmul::gguf::matvec_experts_quant(gpu, x, input, w, route, groups, y, &s, opts)
        }
    }
}

/// The shared expert of [`moe_combine`]: its output `out` f32 `(T, H)`, gated by
/// `sigmoid(gate[t · gate_ld + gate_col])`: `gate` is a whole f32 buffer (e.g. the router
/// linear's `(T, E + 1)` output, `gate_ld = E + 1`, `gate_col = E`), not a view, so that no binding
/// offset has to be aligned.
#[derive(Clone, Copy, Debug)]
pub struct SharedExpert<'a> {
    pub out: &'a Tensor,
    pub gate: &'a Tensor,
    pub gate_ld: usize,
    pub gate_col: usize,
}

/// Records `x[t, :] += Σ_j weights[t, j] · y[t·k + j, :] (+ sigmoid(gate_t) · shared.out[t, :])`
/// with x f32 `(T, H)` (the residual stream), y f32 `(T·k, H)` ([`linear_experts`]' down output),
/// weights f32 `(T, k)` ([`moe_router`]'s), k = weights.numel() / T.
pub fn moe_combine(
    gpu: &Gpu,
    y: &Tensor,
    weights: &Tensor,
    shared: Option<SharedExpert<'_>>,
    x: &Tensor,
) -> Result<Kernel> {
    const OP: &str = "moe_combine";
    if x.shape.len() != 2 || x.numel() == 0 {
        return Err(invalid(format!("{OP}: x must be (T, H), got {:?}", x.shape)));
    }
    let (t, h) = (x.shape[0], x.shape[1]);
    check_tensor(gpu, OP, "x", x, ElemType::F32, t * h)?;
    let k = weights.numel() / t;
    if k == 0 || weights.numel() != t * k {
        return Err(invalid(format!("{OP}: weights has {} elements, not {t} tokens × k", weights.numel())));
    }
    check_tensor(gpu, OP, "weights", weights, ElemType::F32, t * k)?;
    check_tensor(gpu, OP, "y", y, ElemType::F32, t * k * h)?;
    if y.numel() != t * k * h {
        return Err(invalid(format!("{OP}: y must be ({t} · {k}, {h}), got {:?}", y.shape)));
    }
    let (gate_ld, gate_col) = shared.map_or((0, 0), |s| (s.gate_ld, s.gate_col));
    let mut bindings = vec![x.binding(), y.binding(), weights.binding()];
    let params =
        gpu.uniform("moe_combine.params", &[t as u32, h as u32, k as u32, gate_ld as u32, gate_col as u32, 0, 0, 0]);
    bindings.push(params.as_entire_binding());
    if let Some(s) = shared {
        check_tensor(gpu, OP, "the shared expert's output", s.out, ElemType::F32, t * h)?;
        if gate_col >= gate_ld {
            return Err(invalid(format!("{OP}: gate column {gate_col} outside rows of {gate_ld}")));
        }
        check_tensor(gpu, OP, "the shared expert's gate", s.gate, ElemType::F32, (t - 1) * gate_ld + gate_col + 1)?;
        bindings.push(s.out.binding());
        bindings.push(s.gate.binding());
    }
    let n = (t * h) as u32;
    gpu.kernel(
        "moe_combine",
        "main",
        &gpu.macros().flag_if("SHARED", shared.is_some()),
        &bindings,
        grid(n.div_ceil(256)),
    )
}

pub mod cpu {
    use crate::dtype::DType;
    use crate::error::Result;
    use crate::model::config::Activation;
    use crate::ops::elementwise::cpu::{gelu_tanh, silu};

    /// Reference of [`super::moe_router`] (softmax in f64): per token, the `top_k` experts of
    /// largest logit (equal logits: lower index first), larger first.
    pub fn moe_router(
        logits: &[f32],
        ld: usize,
        experts: usize,
        top_k: usize,
        ids: &mut [u32],
        weights: &mut [f32],
        norm_topk: bool,
    ) {
        let t = ids.len() / top_k;
        for ti in 0..t {
            let row = &logits[ti * ld..][..experts];
            let mut order: Vec<usize> = (0..experts).collect();
            // Stable: equal logits keep the lower index first.
            order.sort_by(|&a, &b| row[b].partial_cmp(&row[a]).unwrap_or(std::cmp::Ordering::Equal));
            let m = row[order[0]] as f64;
            let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
            let chosen = &order[..top_k];
            let total: f64 = if norm_topk { chosen.iter().map(|&i| e[i]).sum() } else { e.iter().sum() };
            for (j, &i) in chosen.iter().enumerate() {
                ids[ti * top_k + j] = i as u32;
                weights[ti * top_k + j] = (e[i] / total) as f32;
            }
        }
    }

    /// [`moe_router`] with the shared expert's slot after each row's top-k: id `experts`,
    /// weight `sigmoid(logits[t, experts])` (rows of `top_k + 1`).
    pub fn moe_router_shared(
        logits: &[f32],
        ld: usize,
        experts: usize,
        top_k: usize,
        ids: &mut [u32],
        weights: &mut [f32],
        norm_topk: bool,
    ) {
        let t = ids.len() / (top_k + 1);
        let (mut ri, mut rw) = (vec![0u32; t * top_k], vec![0f32; t * top_k]);
        moe_router(logits, ld, experts, top_k, &mut ri, &mut rw, norm_topk);
        for ti in 0..t {
            let row = ti * (top_k + 1);
            ids[row..row + top_k].copy_from_slice(&ri[ti * top_k..][..top_k]);
            weights[row..row + top_k].copy_from_slice(&rw[ti * top_k..][..top_k]);
            ids[row + top_k] = experts as u32;
            weights[row + top_k] = (1.0 / (1.0 + (-(logits[ti * ld + experts] as f64)).exp())) as f32;
        }
    }

    /// Reference of [`super::moe_group`]: the slots by expert (ids clamped to the stack; within an
    /// expert in slot order, where the GPU's order may differ) and the tiles (expert, first place,
    /// count) of each expert's run, [`super::group_tiles`] of them (unused ones all 0).
    pub fn moe_group(ids: &[u32], experts: usize) -> (Vec<u32>, Vec<[u32; 3]>) {
        let tb = super::GROUP_TILE;
        let e_of = |id: u32| (id as usize).min(experts - 1);
        let mut order: Vec<u32> = (0..ids.len() as u32).collect();
        order.sort_by_key(|&s| e_of(ids[s as usize]));
        let mut tiles = Vec::new();
        let mut first = 0usize;
        for e in 0..experts {
            let c = ids.iter().filter(|&&id| e_of(id) == e).count();
            for i in (0..c).step_by(tb) {
                tiles.push([e as u32, (first + i) as u32, (c - i).min(tb) as u32]);
            }
            first += c;
        }
        let room = super::group_tiles(ids.len(), experts);
        assert!(tiles.len() <= room, "{} tiles for a table of {room}", tiles.len());
        tiles.resize(room, [0; 3]);
        (order, tiles)
    }

    /// Reference of [`super::linear_experts`] over f32 weights `w` = `[E·N, K]` (the stack
    /// widened or dequantized), sums in f64: `y[s, :] = W[ids[s]] · x[s / slots_per_row, :]`,
    /// then with `glu` `act(gate) · up` of each (gate, up) row pair (y `(S, N/2)`). x is the input
    /// as the kernel meets it: apply a fused norm or activation first (`norm::cpu::rms_norm`,
    /// `elementwise::cpu::gated_act`). An id past the stack reads the last expert.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_experts(
        x: &[f32],
        w: &[f32],
        experts: usize,
        k: usize,
        ids: &[u32],
        slots_per_row: usize,
        glu: Option<Activation>,
        y: &mut [f32],
        accumulate: bool,
    ) {
        let n = w.len() / k / experts;
        let cols = if glu.is_some() { n / 2 } else { n };
        assert_eq!(y.len(), ids.len() * cols);
        let act = match glu {
            Some(Activation::GeluTanhGated) => gelu_tanh,
            _ => silu,
        };
        for (s, &id) in ids.iter().enumerate() {
            let e = (id as usize).min(experts - 1);
            let xr = &x[s / slots_per_row * k..][..k];
            let we = &w[e * n * k..(e + 1) * n * k];
            let out = &mut y[s * cols..(s + 1) * cols];
            match glu {
                None => crate::ops::matmul::cpu::linear(xr, we, k, None, out, accumulate),
                Some(_) => {
                    let mut full = vec![0f32; n];
                    crate::ops::matmul::cpu::linear(xr, we, k, None, &mut full, false);
                    for (c, o) in out.iter_mut().enumerate() {
                        let v = act(full[2 * c]) as f64 * full[2 * c + 1] as f64;
                        *o = if accumulate { (*o as f64 + v) as f32 } else { v as f32 };
                    }
                }
            }
        }
    }

    /// [`linear_experts`] over a quantized stack: `raw` the file's bytes of `[E·N, K]` in `dtype`,
    /// dequantized with `to_f32` (`gguf::cpu::dequantize_rows`).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_experts_quant(
        x: &[f32],
        dtype: DType,
        raw: &[u8],
        experts: usize,
        k: usize,
        ids: &[u32],
        slots_per_row: usize,
        glu: Option<Activation>,
        y: &mut [f32],
        accumulate: bool,
    ) -> Result<()> {
        let w = crate::ops::matmul::gguf::cpu::dequantize_rows(dtype, raw, k)?;
        linear_experts(x, &w, experts, k, ids, slots_per_row, glu, y, accumulate);
        Ok(())
    }

    /// Reference of [`super::moe_combine`] (in f64): x `(T, h)`, y `(T·k, h)`, weights `(T, k)`;
    /// `shared` = (its output `(T, h)`, the gate buffer, its row stride, the gate's column).
    pub fn moe_combine(
        y: &[f32],
        weights: &[f32],
        shared: Option<(&[f32], &[f32], usize, usize)>,
        x: &mut [f32],
        h: usize,
    ) {
        let t = x.len() / h;
        let k = weights.len() / t;
        for ti in 0..t {
            for hi in 0..h {
                let mut acc = 0f64;
                for j in 0..k {
                    acc += weights[ti * k + j] as f64 * y[(ti * k + j) * h + hi] as f64;
                }
                if let Some((out, gate, ld, col)) = shared {
                    let g = gate[ti * ld + col] as f64;
                    acc += out[ti * h + hi] as f64 / (1.0 + (-g).exp());
                }
                let o = &mut x[ti * h + hi];
                *o = (*o as f64 + acc) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::to_f32;
    use crate::dtype::DType;
    use crate::gpu::tensor::test_util::*;
    use crate::model::config::Activation;
    use crate::ops::matmul::gguf::tests as qt;
    use crate::ops::matmul::tests as ft;
    use crate::ops::{elementwise, norm};

    const EPS: f32 = f32::EPSILON / 2.0;

    /// Per token, `top_k` distinct experts of `experts` in a random order (as a router picks them).
    fn random_ids(t: usize, experts: usize, top_k: usize, seed: u64) -> Vec<u32> {
        let r = random(t * experts, seed, 1.0);
        (0..t)
            .flat_map(|ti| {
                let mut order: Vec<usize> = (0..experts).collect();
                order.sort_by(|&a, &b| r[ti * experts + a].total_cmp(&r[ti * experts + b]));
                order.into_iter().take(top_k).map(|e| e as u32)
            })
            .collect()
    }

    /// Relative error bound of a router weight: each exp (q_exp) within 2 ulp, the sum's
    /// additions (k - 1 in a row with `norm_topk`; else a thread's pair and a tree of log2(256)
    /// levels: 9 per term) one rounding each of the running sum (<= the total), the division 2.5
    /// ulp (Vulkan's bound); ulp = 2^-24 relative. 1e-6 or less for k <= 8.
    fn router_tol(top_k: usize, norm_topk: bool) -> f32 {
        let adds = if norm_topk { top_k - 1 } else { 9 };
        (2.0 + 2.0 + 2.5 + adds as f32) * EPS * 1.0001
    }

    #[test]
    fn router_matches_cpu() {
        let mut worst = 0f32;
        for gpu in gpu_variants() {
            let mut seed = 10;
            for (experts, top_k) in [(8usize, 2usize), (64, 8), (256, 8), (512, 16), (60, 4), (300, 1)] {
                for (t, rank) in [(1usize, false), (1, true), (5, experts <= RANK_MAX_EXPERTS)] {
                    for norm_topk in [true, false] {
                        seed += 10;
                        // Rows of E + 1: column E holds a shared expert's gate logit, larger than
                        // every expert's (it must not be picked).
                        let ld = experts + 1;
                        let mut lv = random(t * ld, seed, 4.0);
                        for ti in 0..t {
                            lv[ti * ld + experts] = 100.0;
                        }
                        let logits = gpu.upload_f32("logits", &[t, ld], &lv).unwrap();
                        let ids = gpu.upload_u32("ids", &[t, top_k], &vec![7777; t * top_k]).unwrap();
                        let weights = gpu.upload_f32("weights", &[t, top_k], &vec![-1.0; t * top_k]).unwrap();
                        let kern =
                            router(&gpu, &logits, ld, experts, top_k, &ids, &weights, norm_topk, rank, false).unwrap();
                        gpu.run(&[&kern]).unwrap();
                        let (got_i, got_w) = (gpu.read_u32(&ids).unwrap(), gpu.read_f32(&weights).unwrap());
                        let mut want_i = vec![0u32; t * top_k];
                        let mut want_w = vec![0f32; t * top_k];
                        cpu::moe_router(&lv, ld, experts, top_k, &mut want_i, &mut want_w, norm_topk);
                        let what = format!(
                            "E={experts} k={top_k} T={t} norm={norm_topk} rank={rank} sg={}",
                            gpu.caps.subgroups
                        );
                        assert_eq!(got_i, want_i, "{what}: ids");
                        let tol = router_tol(top_k, norm_topk);
                        for (i, (g, w)) in got_w.iter().zip(&want_w).enumerate() {
                            let rel = (g - w).abs() / w.abs();
                            assert!(rel <= tol, "{what}: weight {i}: got {g}, want {w} (rel {rel:e} > {tol:e})");
                            worst = worst.max(rel / tol);
                        }
                    }
                }
            }
        }
        eprintln!("router_matches_cpu: worst relative error / tolerance = {worst:.3}");
    }

    /// The shared expert's slot: id E after the routed top-k, weight sigmoid(gate logit).
    #[test]
    fn router_shared_slot_matches_cpu() {
        for gpu in gpu_variants() {
            for (experts, top_k, t) in [(8usize, 2usize, 3usize), (256, 8, 1), (300, 4, 2)] {
                let ld = experts + 1;
                let lv = random(t * ld, 5 + experts as u64, 4.0);
                let logits = gpu.upload_f32("logits", &[t, ld], &lv).unwrap();
                let n = t * (top_k + 1);
                let ids = gpu.upload_u32("ids", &[n], &vec![7777; n]).unwrap();
                let weights = gpu.upload_f32("weights", &[n], &vec![-1.0; n]).unwrap();
                let kern = moe_router_shared(&gpu, &logits, ld, experts, top_k, &ids, &weights, true).unwrap();
                gpu.run(&[&kern]).unwrap();
                let (mut want_i, mut want_w) = (vec![0u32; n], vec![0f32; n]);
                cpu::moe_router_shared(&lv, ld, experts, top_k, &mut want_i, &mut want_w, true);
                assert_eq!(gpu.read_u32(&ids).unwrap(), want_i, "E={experts} k={top_k}");
                // The routed weights as in router_matches_cpu; the gate's sigmoid: exp within
                // 3 + 2|x| ulps (Vulkan), then 1 + e and a division.
                let tol = router_tol(top_k, true).max((6.0 + 2.0 * 12.0) * EPS);
                for (i, (g, w)) in gpu.read_f32(&weights).unwrap().iter().zip(&want_w).enumerate() {
                    assert!((g - w).abs() / w.abs() <= tol, "E={experts} k={top_k} slot {i}: {g} vs {w}");
                }
            }
            let (logits, ids, weights) = (
                gpu.upload_f32("l", &[1, 8], &[0.5; 8]).unwrap(),
                gpu.empty("i", &[3], ElemType::U32).unwrap(),
                gpu.empty("w", &[3], ElemType::F32).unwrap(),
            );
            assert!(moe_router_shared(&gpu, &logits, 8, 8, 2, &ids, &weights, true).is_err(), "no gate column");
        }
    }

    #[test]
    fn router_ties_and_extremes() {
        // Equal logits rank lower index first; an -inf logit ranks last but still counts as an
        // expert (weight 0); large spreads (exp underflows) stay finite.
        let gpu = gpu();
        let (experts, top_k, t) = (40usize, 6usize, 3usize);
        let mut lv = vec![0f32; t * experts];
        for (i, v) in lv.iter_mut().enumerate() {
            *v = ((i * 7) % 5) as f32;
        }
        lv[experts + 3] = f32::NEG_INFINITY;
        for v in &mut lv[2 * experts..] {
            *v = -200.0;
        }
        lv[2 * experts + 11] = 0.0;
        for (norm_topk, rank) in [(true, false), (false, false), (true, true), (false, true)] {
            let logits = gpu.upload_f32("logits", &[t, experts], &lv).unwrap();
            let ids = gpu.empty("ids", &[t, top_k], ElemType::U32).unwrap();
            let weights = gpu.empty("weights", &[t, top_k], ElemType::F32).unwrap();
            let kern = router(&gpu, &logits, experts, experts, top_k, &ids, &weights, norm_topk, rank, false).unwrap();
            gpu.run(&[&kern]).unwrap();
            let mut want_i = vec![0u32; t * top_k];
            let mut want_w = vec![0f32; t * top_k];
            cpu::moe_router(&lv, experts, experts, top_k, &mut want_i, &mut want_w, norm_topk);
            assert_eq!(gpu.read_u32(&ids).unwrap(), want_i, "norm={norm_topk} rank={rank}");
            let got_w = gpu.read_f32(&weights).unwrap();
            for (g, w) in got_w.iter().zip(&want_w) {
                assert!((g - w).abs() <= router_tol(top_k, norm_topk) * w.abs(), "{g} vs {w}");
            }
        }
        // Errors, not device failures.
        let logits = gpu.upload_f32("logits", &[1, 8], &[0.5; 8]).unwrap();
        let ids = gpu.empty("ids", &[1, 4], ElemType::U32).unwrap();
        let weights = gpu.empty("weights", &[1, 4], ElemType::F32).unwrap();
        assert!(moe_router(&gpu, &logits, 8, 8, 9, &ids, &weights, true).is_err());
        assert!(moe_router(&gpu, &logits, 4, 8, 4, &ids, &weights, true).is_err());
        assert!(moe_router(&gpu, &ids, 8, 8, 4, &ids, &weights, true).is_err());
    }

    /// The weight types of the expert tests.
    #[derive(Clone, Copy, Debug)]
    enum Wt {
        F16,
        Q(DType),
    }

    /// Which projection a case runs.
    #[derive(Clone, Copy, Debug)]
    enum Proj {
        /// x (T, K), slots_per_row = k: the fused norm and/or the GLU epilogue.
        GateUp { norm: bool, glu: Option<Activation> },
        /// x (T·k, K) (or (T·k, 2K) [gate | up] with `gated`), slots_per_row = 1.
        Down { gated: bool, accumulate: bool },
    }

    /// One case of the expert projections: `t` tokens, `top_k` slots each over a stack of
    /// `experts`, N × K per expert, with `grouped` the slots grouped by expert first
    /// ([`moe_group`]; the batch kernel, which meets x as it is: no DP4 staging).
    #[derive(Clone, Copy)]
    struct Case {
        wt: Wt,
        t: usize,
        top_k: usize,
        experts: usize,
        n: usize,
        k: usize,
        proj: Proj,
        seed: u64,
        grouped: bool,
    }

    impl Case {
        /// Runs one expert projection of random operands against the CPU twin; returns the worst
        /// error / tolerance. Tolerance per slot: the plain projection's of the matmul tests (f16:
        /// `ft::reference`; quantized: `qt::reference` over the dequantized expert), plus the fused
        /// input's own rounding (8·eps·S for the norm, 16·eps·S for the activation, S = Σ|x_in · w|,
        /// as in `fused_inputs_match_cpu_ops`), through `qt::glu_expected` for GLU. Where the
        /// quantized kernel stages x for DP4, the reference meets x as `stage_x16` stages it (and the
        /// gated case allows an activation ulp to move an element by one staging step, as the gguf
        /// tests do).
        fn run(self, gpu: &Gpu) -> f32 {
            let Case { wt, t, top_k, experts, n, k, proj, seed, grouped } = self;
            let (spr, xrows, xcols, glu, acc) = match proj {
                Proj::GateUp { glu, .. } => (top_k, t, k, glu, false),
                Proj::Down { gated, accumulate } => (1, t * top_k, if gated { 2 * k } else { k }, None, accumulate),
            };
            let slots = t * top_k;
            let cols = if glu.is_some() { n / 2 } else { n };
            let mut idv = random_ids(t, experts, top_k, seed);
            if slots > 2 {
                // An id past the stack reads its last expert.
                idv[slots - 1] = experts as u32 + 3;
            }
            let xv = random(xrows * xcols, seed + 1, 1.0);
            let gv: Vec<f32> = random(k, seed + 2, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let y0 = random(slots * cols, seed + 3, 1.0);
            let x = gpu.upload_f32("x", &[xrows, xcols], &xv).unwrap();
            let g = gpu.upload_f32("g", &[k], &gv).unwrap();
            let ids = gpu.upload_u32("ids", &[t, top_k], &idv).unwrap();
            let y = gpu.upload_f32("y", &[slots, cols], &y0).unwrap();
            let input = match proj {
                Proj::GateUp { norm: true, .. } => Input::Norm { weight: &g, eps: 1e-6 },
                Proj::Down { gated: true, .. } => Input::Gated(Activation::SiluGated),
                _ => Input::Plain,
            };
            let opts = LinearOpts { accumulate: acc, ld_out: None, glu, batch: false, softcap: None };
            // The weights, as the kernel reads them and as f32 (an expert's [N, K] rows at e·N·K).
            let rows = experts * n;
            let shape = LinearShape { t: slots, n, k, ld_out: cols, cols };
            let (wf, raw, quant, fw, dp4): (Vec<f32>, Vec<u8>, Option<QuantWeight>, Option<Tensor>, bool) = match wt {
                Wt::F16 => {
                    let (h, f) = ft::weights(rows, k, seed + 4);
                    (f, Vec::new(), None, Some(gpu.upload_f16("w", &[rows, k], &h).unwrap()), false)
                }
                Wt::Q(ty) => {
                    let raw = qt::random_blocks(ty, rows, k, seed + 4);
                    let wf = to_f32(ty, &raw, rows * k).unwrap();
                    let q = QuantWeight::new(gpu, "w", ty, [rows, k], &raw).unwrap();
                    (wf, raw, Some(q), None, !grouped && matmul::gguf::experts_use_dp4(gpu, ty, &shape))
                }
            };
            let w = match wt {
                Wt::F16 => ExpertWeight::F16 { w: fw.as_ref().unwrap(), experts },
                Wt::Q(_) => ExpertWeight::Quant { w: quant.as_ref().unwrap(), experts },
            };
            let got = if grouped {
                // The table starts dirty: every entry must be written.
                let len = groups_len(slots, experts);
                let groups = gpu.upload_u32("groups", &[len], &vec![0xdead_beef; len]).unwrap();
                let group = moe_group(gpu, &ids, experts, &groups).unwrap();
                let kern = linear_experts(gpu, &x, input, &w, &ids, Some(&groups), spr, &y, opts).unwrap();
                gpu.run(&[&group, &kern]).unwrap();
                gpu.read_f32(&y).unwrap()
            } else {
                let kern = linear_experts(gpu, &x, input, &w, &ids, None, spr, &y, opts).unwrap();
                gpu.run(&[&kern]).unwrap();
                gpu.read_f32(&y).unwrap()
            };

            let what = format!(
                "{wt:?} {proj:?} T={t} k={top_k} E={experts} N={n} K={k} dp4={dp4} grouped={grouped} f16={} sg={}",
                gpu.caps.f16, gpu.caps.subgroups
            );
            // x as the kernel meets it, per x row.
            let xin: Vec<f32> = match input {
                Input::Norm { .. } if dp4 => {
                    // The kernel stages x ⊙ g and scales the sums by the norm's r at the end.
                    let xg: Vec<f32> = xv.iter().zip(gv.iter().cycle()).map(|(a, b)| a * b).collect();
                    let staged = matmul::gguf::cpu::stage_x16(&xg, k);
                    let r: Vec<f32> = xv
                        .chunks(k)
                        .map(|row| 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / k as f32 + 1e-6).sqrt())
                        .collect();
                    staged.iter().enumerate().map(|(i, v)| v * r[i / k]).collect()
                }
                Input::Norm { .. } => {
                    let mut o = vec![0f32; xv.len()];
                    norm::cpu::rms_norm(&xv, &gv, &mut o, 1e-6, false);
                    o
                }
                Input::Gated(act) => {
                    let mut o = vec![0f32; xrows * k];
                    elementwise::cpu::gated_act(&xv, &mut o, k, act);
                    if dp4 {
                        matmul::gguf::cpu::stage_x16(&o, k)
                    } else {
                        o
                    }
                }
                Input::Plain if dp4 => matmul::gguf::cpu::stage_x16(&xv, k),
                Input::Plain => xv.clone(),
                Input::Staged(_) => unreachable!("the expert tests stage no x apart"),
            };
            // The twin (pre-GLU when GLU: glu_expected applies it with its tolerance).
            let mut pre = if glu.is_some() { vec![0f32; slots * n] } else { y0.clone() };
            cpu::linear_experts(&xin, &wf, experts, k, &idv, spr, None, &mut pre, acc);
            if let Some(act) = glu {
                // The twin's own GLU is what glu_expected computes.
                let mut direct = vec![0f32; slots * cols];
                cpu::linear_experts(&xin, &wf, experts, k, &idv, spr, glu, &mut direct, false);
                let (via, _) = qt::glu_expected(&pre, &vec![0.0; pre.len()], act);
                assert_eq!(direct, via, "the CPU twin's GLU");
            }
            let mut tol = Vec::with_capacity(slots * n);
            let abs = |v: &[f32]| v.iter().map(|a| a.abs()).collect::<Vec<_>>();
            for s in 0..slots {
                let e = (idv[s] as usize).min(experts - 1);
                let xr = &xin[s / spr * k..][..k];
                let we = &wf[e * n * k..(e + 1) * n * k];
                let y0s: Vec<f32> = if acc { y0[s * n..(s + 1) * n].to_vec() } else { vec![0.0; n] };
                let (want_s, mut tol_s) = match wt {
                    Wt::F16 => ft::reference(xr, we, k, None, &y0s, acc),
                    Wt::Q(ty) => {
                        let rb = ty.byte_size(k).unwrap();
                        qt::reference(xr, ty, &raw[e * n * rb..(e + 1) * n * rb], k, None, &y0s, acc)
                    }
                };
                assert_eq!(want_s, pre[s * n..(s + 1) * n], "{what}: the CPU twin, slot {s}");
                if !matches!(input, Input::Plain) {
                    let mut s_terms = vec![0f32; n];
                    matmul::cpu::linear(&abs(xr), &abs(we), k, None, &mut s_terms, false);
                    let extra = if matches!(input, Input::Gated(_)) { 16.0 } else { 8.0 } * EPS;
                    tol_s.iter_mut().zip(&s_terms).for_each(|(tl, s)| *tl += extra * s);
                }
                if dp4 && matches!(input, Input::Gated(_)) {
                    let d = qt::stage_steps16(xr);
                    for (r, tl) in tol_s.iter_mut().enumerate() {
                        *tl += 4.0 * we[r * k..(r + 1) * k].iter().zip(&d).fold(0f32, |m, (w, d)| m.max(w.abs() * d));
                    }
                }
                tol.extend(tol_s);
            }
            let (want, tol) = match glu {
                Some(act) => qt::glu_expected(&pre, &tol, act),
                None => (pre, tol),
            };
            ft::check(&got, &want, &tol, &what)
        }
    }

    #[test]
    fn linear_experts_match_cpu() {
        let mut worst = 0f32;
        for gpu in gpu_variants() {
            let mut seed = 100;
            let types = [
                Wt::F16,
                Wt::Q(DType::Q4_K),
                Wt::Q(DType::Q8_0),
                Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false }),
            ];
            // A small Qwen3.5-MoE: hidden H = 256, expert intermediate I = 256 (K of the down
            // projection: whole Q4_K blocks), 12 experts.
            let (h, inter, experts) = (256usize, 256usize, 12usize);
            for wt in types {
                for t in [1usize, 5] {
                    for top_k in [2usize, 8] {
                        let projs = [
                            (Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }, 2 * inter, h),
                            (Proj::GateUp { norm: false, glu: None }, 2 * inter, h),
                            (Proj::Down { gated: false, accumulate: false }, h, inter),
                        ];
                        for (proj, n, k) in projs {
                            seed += 10;
                            worst =
                                worst.max(Case { wt, t, top_k, experts, n, k, proj, seed, grouped: false }.run(&gpu));
                        }
                    }
                }
                // The fused activation before the down projection, accumulating; GELU-tanh GLU
                // with the norm.
                seed += 10;
                let down = Proj::Down { gated: true, accumulate: true };
                worst = worst.max(
                    Case { wt, t: 3, top_k: 4, experts, n: h, k: inter, proj: down, seed, grouped: false }.run(&gpu),
                );
                let gelu = Proj::GateUp { norm: true, glu: Some(Activation::GeluTanhGated) };
                worst = worst.max(
                    Case {
                        wt,
                        t: 2,
                        top_k: 3,
                        experts,
                        n: 2 * inter,
                        k: h,
                        proj: gelu,
                        seed: seed + 5,
                        grouped: false,
                    }
                    .run(&gpu),
                );
            }
            // f16 off the models' shapes: N not a multiple of 4, K % 8 == 4 (two-word loads) and
            // K % 4 == 2 (one-word loads), a 1-expert stack.
            for (n, k, proj) in [
                (70usize, 68usize, Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }),
                (33, 70, Proj::Down { gated: false, accumulate: true }),
                (130, 96, Proj::GateUp { norm: false, glu: None }),
            ] {
                seed += 10;
                worst = worst
                    .max(Case { wt: Wt::F16, t: 5, top_k: 2, experts: 3, n, k, proj, seed, grouped: false }.run(&gpu));
            }
            worst = worst.max(
                Case {
                    wt: Wt::F16,
                    t: 2,
                    top_k: 1,
                    experts: 1,
                    n: 64,
                    k: 64,
                    proj: Proj::GateUp { norm: false, glu: None },
                    seed: 7,
                    grouped: false,
                }
                .run(&gpu),
            );
        }
        eprintln!("linear_experts_match_cpu: worst |error| / tolerance = {worst:.3}");
    }

    /// The grouping against its twin: the tile table exactly, the order as each expert's set of
    /// slots (its order within an expert is the GPU's); skewed routing (most slots on a few
    /// experts: many full tiles and a partial one), unused experts, ids past the stack, one expert.
    #[test]
    fn moe_group_matches_cpu() {
        let gpu = gpu();
        for (slots, experts, seed) in [(37usize, 5usize, 1u64), (300, 12, 2), (4608, 257, 3), (9, 1, 4), (1, 3, 5)] {
            let r = random(slots, seed, 1.0);
            // Skewed: |r|^3 crowds the ids toward expert 0; every 7th id past the stack.
            let ids: Vec<u32> = r
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 7 == 3 { experts as u32 + 2 } else { (v.abs().powi(3) * experts as f32) as u32 })
                .collect();
            let len = groups_len(slots, experts);
            let idt = gpu.upload_u32("ids", &[slots], &ids).unwrap();
            let groups = gpu.upload_u32("groups", &[len], &vec![0xdead_beef; len]).unwrap();
            gpu.run(&[&moe_group(&gpu, &idt, experts, &groups).unwrap()]).unwrap();
            let got = gpu.read_u32(&groups).unwrap();
            let (order, tiles) = cpu::moe_group(&ids, experts);
            let got_tiles: Vec<[u32; 3]> = got[slots..].chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
            assert_eq!(got_tiles, tiles, "tiles, S={slots} E={experts}");
            // Each tile's slots (as sets) are its expert's, and the order is a permutation.
            let mut seen = vec![false; slots];
            for [e, first, count] in tiles.iter().copied().filter(|t| t[2] > 0) {
                for &s in &got[first as usize..(first + count) as usize] {
                    assert!(!seen[s as usize], "slot {s} twice (S={slots} E={experts})");
                    seen[s as usize] = true;
                    assert_eq!(
                        (ids[s as usize] as usize).min(experts - 1),
                        e as usize,
                        "slot {s} in expert {e}'s tile"
                    );
                }
            }
            assert!(seen.iter().all(|&v| v), "every slot placed (S={slots} E={experts})");
            let mut sorted = got[..slots].to_vec();
            sorted.sort_unstable();
            let mut want = order.clone();
            want.sort_unstable();
            assert_eq!(sorted, want);
        }
    }

    /// The grouped expert projections (prefill's) against the CPU twin: enough tokens that experts
    /// have several tiles (full and partial), every fused input and epilogue, the quantized types
    /// of the real checkpoints.
    #[test]
    fn grouped_experts_match_cpu() {
        let mut worst = 0f32;
        for gpu in gpu_variants() {
            let mut seed = 500;
            let (h, inter, experts) = (256usize, 256usize, 12usize);
            for wt in [
                Wt::Q(DType::Q4_K),
                Wt::Q(DType::Q6_K),
                Wt::Q(DType::Q8_0),
                Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false }),
            ] {
                for (t, top_k) in [(40usize, 3usize), (13, 8)] {
                    let projs = [
                        (Proj::GateUp { norm: true, glu: Some(Activation::SiluGated) }, 2 * inter, h),
                        (Proj::GateUp { norm: false, glu: None }, 2 * inter, h),
                        (Proj::Down { gated: false, accumulate: false }, h, inter),
                        (Proj::Down { gated: true, accumulate: true }, h, inter),
                    ];
                    for (proj, n, k) in projs {
                        seed += 10;
                        worst = worst.max(Case { wt, t, top_k, experts, n, k, proj, seed, grouped: true }.run(&gpu));
                    }
                }
            }
        }
        eprintln!("grouped_experts_match_cpu: worst |error| / tolerance = {worst:.3}");
    }

    #[test]
    #[ignore = "timing: cargo test --release --lib ops::moe::tests::bench_moe -- --ignored --nocapture"]
    fn bench_moe() {
        // Qwen3.5-35B-A3B's MoE layer: H = 2048, 256 experts of I = 512, top 8, a shared expert of
        // 512. Stacks of one random expert repeated (the bytes each expert holds do not matter);
        // each timed call routes to other experts (R id sets / inputs), so that the weights come
        // from memory, not L2, as in a decode step.
        let gpu = gpu();
        let big = gpu.info.device_type != wgpu::DeviceType::Cpu;
        let (h, inter, experts, top_k) = if big { (2048usize, 512usize, 256usize, 8usize) } else { (256, 256, 16, 4) };
        let reps = if big { 32usize } else { 2 };
        eprintln!(
            "{} f16={} sg={}: H={h} I={inter} E={experts} k={top_k}",
            gpu.info.name, gpu.caps.f16, gpu.caps.subgroups
        );
        let id_sets: Vec<Tensor> = (0..reps)
            .map(|r| {
                let v: Vec<u32> = (0..top_k).map(|j| ((r * top_k + j * 37) % experts) as u32).collect();
                gpu.upload_u32("ids", &[1, top_k], &v).unwrap()
            })
            .collect();
        let x1 = gpu.upload_f32("x", &[1, h], &random(h, 1, 1.0)).unwrap();
        let g = gpu.upload_f32("g", &[h], &random(h, 2, 0.5).into_iter().map(|v| 1.0 + v).collect::<Vec<_>>()).unwrap();
        let norm = Input::Norm { weight: &g, eps: 1e-6 };
        let glu = LinearOpts { glu: Some(Activation::SiluGated), ..Default::default() };
        let plain = LinearOpts::default();
        let act = gpu.empty("act", &[top_k, inter], ElemType::F32).unwrap();
        let ys = gpu.empty("ys", &[top_k, h], ElemType::F32).unwrap();
        let act_in = gpu.upload_f32("act in", &[top_k, inter], &random(top_k * inter, 3, 1.0)).unwrap();
        let time =
            |ks: &[Kernel]| ft::time_per_call(&gpu, &|pass| ks.iter().for_each(|k| k.encode(pass))) / ks.len() as f64;
        let us = |t: f64| t * 1e6;
        for wt in
            [Wt::F16, Wt::Q(DType::Q4_K), Wt::Q(DType::Q8_0), Wt::Q(DType::Affine { bits: 4, group: 64, bf16: false })]
        {
            // One expert's gate_up [2I, H] and down [H, I], repeated E times.
            let stack = |n: usize, k: usize, seed: u64| -> (Option<Tensor>, Option<QuantWeight>, u64) {
                match wt {
                    Wt::F16 => {
                        let (one, _) = ft::weights(n, k, seed);
                        let all: Vec<half::f16> = one.iter().copied().cycle().take(experts * n * k).collect();
                        (Some(gpu.upload_f16("w", &[experts * n, k], &all).unwrap()), None, 2 * (n * k) as u64)
                    }
                    Wt::Q(ty) => {
                        let one = qt::random_blocks(ty, n, k, seed);
                        let all: Vec<u8> = one.iter().copied().cycle().take(experts * one.len()).collect();
                        let q = QuantWeight::new(&gpu, "w", ty, [experts * n, k], &all).unwrap();
                        (None, Some(q), one.len() as u64)
                    }
                }
            };
            let (gf, gq, gbytes) = stack(2 * inter, h, 5);
            let (df, dq, dbytes) = stack(h, inter, 6);
            let (gw, dw) = match wt {
                Wt::F16 => (
                    ExpertWeight::F16 { w: gf.as_ref().unwrap(), experts },
                    ExpertWeight::F16 { w: df.as_ref().unwrap(), experts },
                ),
                Wt::Q(_) => (
                    ExpertWeight::Quant { w: gq.as_ref().unwrap(), experts },
                    ExpertWeight::Quant { w: dq.as_ref().unwrap(), experts },
                ),
            };
            // We'd stream k experts' rows: bytes per call.
            let (gu_b, dn_b) = (top_k as u64 * gbytes, top_k as u64 * dbytes);
            let gu: Vec<Kernel> = id_sets
                .iter()
                .map(|ids| linear_experts(&gpu, &x1, norm, &gw, ids, None, top_k, &act, glu).unwrap())
                .collect();
            let dn: Vec<Kernel> = id_sets
                .iter()
                .map(|ids| linear_experts(&gpu, &act_in, Input::Plain, &dw, ids, None, 1, &ys, plain).unwrap())
                .collect();
            let (tg, td) = (time(&gu), time(&dn));
            // The same bytes as one dense matvec of k·N rows (the baseline), weights rotated too.
            // One x row (the down baseline's: random), y one row of k·N (GLU: k·N / 2) columns.
            let dense = |n: usize, k: usize, x: &Tensor, input: Input<'_>, opts: LinearOpts, seed: u64| -> f64 {
                let cols = if opts.glu.is_some() { top_k * n / 2 } else { top_k * n };
                let y = gpu.empty("y", &[1, cols], ElemType::F32).unwrap();
                let xk = gpu.upload_f32("xk", &[1, k], &random(k, 4, 1.0)).unwrap();
                let x = if x.shape[0] == 1 { x } else { &xk };
                let ks: Vec<Kernel> = (0..reps)
                    .map(|r| match wt {
                        Wt::F16 => {
                            let (one, _) = ft::weights(n, k, seed);
                            let all: Vec<half::f16> = one.iter().copied().cycle().take(top_k * n * k).collect();
                            let w = gpu.upload_f16("dense", &[top_k * n, k], &all).unwrap();
                            let _ = r;
                            matmul::linear_in(&gpu, x, input, &w, None, &y, opts).unwrap()
                        }
                        Wt::Q(ty) => {
                            let one = qt::random_blocks(ty, n, k, seed);
                            let all: Vec<u8> = one.iter().copied().cycle().take(top_k * one.len()).collect();
                            let w = QuantWeight::new(&gpu, "dense", ty, [top_k * n, k], &all).unwrap();
                            matmul::linear_quant_in(&gpu, x, input, &w, None, &y, opts).unwrap()
                        }
                    })
                    .collect();
                time(&ks)
            };
            let tgd = dense(2 * inter, h, &x1, norm, glu, 5);
            let tdd = dense(h, inter, &act_in, Input::Plain, LinearOpts::default(), 6);
            eprintln!(
                "{wt:?} decode: experts gate_up (norm+GLU) {:.1} us ({:.2} TB/s; dense {}x{h} {:.1} us), down {:.1} us ({:.2} TB/s; dense {}x{inter} {:.1} us)",
                us(tg),
                gu_b as f64 / tg / 1e12,
                top_k * 2 * inter,
                us(tgd),
                us(td),
                dn_b as f64 / td / 1e12,
                top_k * h,
                us(tdd)
            );
            // Prefill in the per-slot form.
            for t in [4usize, 32, 512] {
                if !big && t > 32 {
                    continue;
                }
                let x = gpu.upload_f32("x", &[t, h], &random(t * h, 7, 1.0)).unwrap();
                let v: Vec<u32> = (0..t * top_k).map(|s| ((s * 37 + s / top_k) % experts) as u32).collect();
                let ids = gpu.upload_u32("ids", &[t, top_k], &v).unwrap();
                let y = gpu.empty("y", &[t * top_k, inter], ElemType::F32).unwrap();
                let k = linear_experts(&gpu, &x, norm, &gw, &ids, None, top_k, &y, glu).unwrap();
                let tt = time(std::slice::from_ref(&k));
                eprintln!("{wt:?} T={t}: experts gate_up {:.1} us ({:.2} us/token)", us(tt), us(tt) / t as f64);
            }
        }
        // Router, combine, and a whole layer (f16, 7 dispatches), inputs rotated.
        let ld = experts + 1;
        let logits: Vec<Tensor> =
            (0..reps).map(|r| gpu.upload_f32("logits", &[1, ld], &random(ld, 10 + r as u64, 4.0)).unwrap()).collect();
        let wts = gpu.empty("w", &[1, top_k], ElemType::F32).unwrap();
        let ids = gpu.empty("ids", &[1, top_k], ElemType::U32).unwrap();
        let rk: Vec<Kernel> =
            logits.iter().map(|l| moe_router(&gpu, l, ld, experts, top_k, &ids, &wts, true).unwrap()).collect();
        let so = gpu.upload_f32("shared", &[1, h], &random(h, 8, 1.0)).unwrap();
        let xr = gpu.upload_f32("x", &[1, h], &random(h, 9, 1.0)).unwrap();
        let ys_v = gpu.upload_f32("ys", &[top_k, h], &random(top_k * h, 11, 1.0)).unwrap();
        let ck = moe_combine(
            &gpu,
            &ys_v,
            &wts,
            Some(SharedExpert { out: &so, gate: &logits[0], gate_ld: ld, gate_col: experts }),
            &xr,
        )
        .unwrap();
        eprintln!(
            "router E={experts} k={top_k}: {:.1} us; combine: {:.1} us",
            us(time(&rk)),
            us(time(std::slice::from_ref(&ck)))
        );
        // The router's two forms (k rounds of an arg-max; ranks) over E and k, inputs rotated.
        for (e, k) in [(64usize, 8usize), (128, 8), (256, 8), (256, 16), (512, 10), (512, 16)] {
            let lgs: Vec<Tensor> = (0..reps)
                .map(|r| gpu.upload_f32("logits", &[1, e + 1], &random(e + 1, 50 + r as u64, 4.0)).unwrap())
                .collect();
            let ids = gpu.empty("ids", &[1, k], ElemType::U32).unwrap();
            let wts = gpu.empty("w", &[1, k], ElemType::F32).unwrap();
            let mut line = format!("router E={e} k={k}:");
            for rank in [false, true] {
                let ks: Vec<Kernel> =
                    lgs.iter().map(|l| router(&gpu, l, e + 1, e, k, &ids, &wts, true, rank, false).unwrap()).collect();
                line += &format!(" {} {:.2} us;", if rank { "rank" } else { "rounds" }, us(time(&ks)));
            }
            eprintln!("{line}");
        }
        let (rh, _) = ft::weights(ld, h, 12);
        let router_w = gpu.upload_f16("router", &[ld, h], &rh).unwrap();
        let (one, _) = ft::weights(2 * inter, h, 13);
        let gu_w = gpu
            .upload_f16(
                "gu",
                &[experts * 2 * inter, h],
                &one.iter().copied().cycle().take(experts * 2 * inter * h).collect::<Vec<_>>(),
            )
            .unwrap();
        let (one, _) = ft::weights(h, inter, 14);
        let d_w = gpu
            .upload_f16(
                "d",
                &[experts * h, inter],
                &one.iter().copied().cycle().take(experts * h * inter).collect::<Vec<_>>(),
            )
            .unwrap();
        let sg_w = gpu.upload_f16("sg", &[2 * inter, h], &ft::weights(2 * inter, h, 15).0).unwrap();
        let sd_w = gpu.upload_f16("sd", &[h, inter], &ft::weights(h, inter, 16).0).unwrap();
        let lg = gpu.empty("logits", &[1, ld], ElemType::F32).unwrap();
        let sact = gpu.empty("sact", &[1, inter], ElemType::F32).unwrap();
        let sout = gpu.empty("sout", &[1, h], ElemType::F32).unwrap();
        let (gu, dn) = (ExpertWeight::F16 { w: &gu_w, experts }, ExpertWeight::F16 { w: &d_w, experts });
        let xs: Vec<Tensor> =
            (0..reps).map(|r| gpu.upload_f32("x", &[1, h], &random(h, 100 + r as u64, 1.0)).unwrap()).collect();
        let mut layer = Vec::new();
        for x in &xs {
            layer.push(matmul::linear_in(&gpu, x, norm, &router_w, None, &lg, plain).unwrap());
            layer.push(moe_router(&gpu, &lg, ld, experts, top_k, &ids, &wts, true).unwrap());
            layer.push(linear_experts(&gpu, x, norm, &gu, &ids, None, top_k, &act, glu).unwrap());
            layer.push(linear_experts(&gpu, &act, Input::Plain, &dn, &ids, None, 1, &ys, plain).unwrap());
            layer.push(matmul::linear_in(&gpu, x, norm, &sg_w, None, &sact, glu).unwrap());
            layer.push(matmul::linear(&gpu, &sact, &sd_w, None, &sout, plain).unwrap());
            let sh = SharedExpert { out: &sout, gate: &lg, gate_ld: ld, gate_col: experts };
            layer.push(moe_combine(&gpu, &ys, &wts, Some(sh), x).unwrap());
        }
        let tl = time(&layer) * 7.0;
        eprintln!("f16 MoE layer, 7 dispatches: {:.1} us", us(tl));
    }

    #[test]
    fn combine_matches_cpu() {
        // Tolerance: the kernel adds k products and the gated shared term into an f32 sum, then
        // adds it to x: each of those k + 2 roundings errs by at most eps of S = Σ|terms| + |x|
        // (sigmoid's exp within 3 + 2|g| ulp for |g| <= 4 here, the add and divide 2.5 each: 16 ulp
        // of the shared term): (k + 2 + 16)·eps·S, doubled for margin.
        for gpu in gpu_variants() {
            let mut seed = 300;
            for (t, top_k) in [(1usize, 2usize), (1, 8), (5, 8), (3, 1)] {
                for with_shared in [false, true] {
                    seed += 10;
                    let (h, experts) = (256usize, 16usize);
                    let ld = experts + 1;
                    let yv = random(t * top_k * h, seed, 2.0);
                    let wv: Vec<f32> = random(t * top_k, seed + 1, 0.5).into_iter().map(|v| v + 0.5).collect();
                    let sv = random(t * h, seed + 2, 2.0);
                    let gv = random(t * ld, seed + 3, 4.0);
                    let xv = random(t * h, seed + 4, 1.0);
                    let y = gpu.upload_f32("y", &[t * top_k, h], &yv).unwrap();
                    let w = gpu.upload_f32("w", &[t, top_k], &wv).unwrap();
                    let so = gpu.upload_f32("shared", &[t, h], &sv).unwrap();
                    let gate = gpu.upload_f32("gate", &[t, ld], &gv).unwrap();
                    let x = gpu.upload_f32("x", &[t, h], &xv).unwrap();
                    let shared =
                        with_shared.then_some(SharedExpert { out: &so, gate: &gate, gate_ld: ld, gate_col: experts });
                    let kern = moe_combine(&gpu, &y, &w, shared, &x).unwrap();
                    gpu.run(&[&kern]).unwrap();
                    let got = gpu.read_f32(&x).unwrap();
                    let mut want = xv.clone();
                    let sh = with_shared.then_some((&sv[..], &gv[..], ld, experts));
                    cpu::moe_combine(&yv, &wv, sh, &mut want, h);
                    let mut mag = xv.iter().map(|v| v.abs()).collect::<Vec<_>>();
                    let ya: Vec<f32> = yv.iter().map(|v| v.abs()).collect();
                    let sa: Vec<f32> = sv.iter().map(|v| v.abs()).collect();
                    cpu::moe_combine(&ya, &wv, with_shared.then_some((&sa[..], &gv[..], ld, experts)), &mut mag, h);
                    let tol: Vec<f32> = mag.iter().map(|m| 2.0 * (top_k + 18) as f32 * EPS * m).collect();
                    let what = format!("T={t} k={top_k} shared={with_shared} sg={}", gpu.caps.subgroups);
                    ft::check(&got, &want, &tol, &what);
                }
            }
        }
    }

    #[test]
    fn moe_block_routes_on_the_gpu() {
        // A whole sparse MoE block as the model records it (norm fused into the router linear and
        // the experts' gate_up, the shared expert's gate in the router's column E): the expert ids
        // go from the router to the projections in a GPU buffer. Against the CPU twins chained on
        // the GPU's routing (its ids, checked against the CPU router's on the GPU's logits).
        for gpu in gpu_variants() {
            let (t, h, inter, experts, top_k) = (3usize, 128usize, 64usize, 16usize, 4usize);
            let seed = 900;
            let xv = random(t * h, seed, 1.0);
            let gv: Vec<f32> = random(h, seed + 1, 0.5).into_iter().map(|v| 1.0 + v).collect();
            let (rh, rf) = ft::weights(experts + 1, h, seed + 2);
            let (guh, guf) = ft::weights(experts * 2 * inter, h, seed + 3);
            let (dh, df) = ft::weights(experts * h, inter, seed + 4);
            let (sgh, sgf) = ft::weights(2 * inter, h, seed + 5);
            let (sdh, sdf) = ft::weights(h, inter, seed + 6);
            let x = gpu.upload_f32("x", &[t, h], &xv).unwrap();
            let g = gpu.upload_f32("g", &[h], &gv).unwrap();
            let router_w = gpu.upload_f16("router", &[experts + 1, h], &rh).unwrap();
            let gu_w = gpu.upload_f16("gate_up_exps", &[experts * 2 * inter, h], &guh).unwrap();
            let d_w = gpu.upload_f16("down_exps", &[experts * h, inter], &dh).unwrap();
            let sg_w = gpu.upload_f16("shared gate_up", &[2 * inter, h], &sgh).unwrap();
            let sd_w = gpu.upload_f16("shared down", &[h, inter], &sdh).unwrap();
            let logits = gpu.empty("logits", &[t, experts + 1], ElemType::F32).unwrap();
            let ids = gpu.empty("ids", &[t, top_k], ElemType::U32).unwrap();
            let weights = gpu.empty("weights", &[t, top_k], ElemType::F32).unwrap();
            let act = gpu.empty("act", &[t * top_k, inter], ElemType::F32).unwrap();
            let ys = gpu.empty("ys", &[t * top_k, h], ElemType::F32).unwrap();
            let sact = gpu.empty("shared act", &[t, inter], ElemType::F32).unwrap();
            let sout = gpu.empty("shared out", &[t, h], ElemType::F32).unwrap();
            let norm = Input::Norm { weight: &g, eps: 1e-6 };
            let glu = LinearOpts { glu: Some(Activation::SiluGated), ..Default::default() };
            let plain = LinearOpts::default();
            let gu = ExpertWeight::F16 { w: &gu_w, experts };
            let dn = ExpertWeight::F16 { w: &d_w, experts };
            let kernels = [
                matmul::linear_in(&gpu, &x, norm, &router_w, None, &logits, plain).unwrap(),
                moe_router(&gpu, &logits, experts + 1, experts, top_k, &ids, &weights, true).unwrap(),
                linear_experts(&gpu, &x, norm, &gu, &ids, None, top_k, &act, glu).unwrap(),
                linear_experts(&gpu, &act, Input::Plain, &dn, &ids, None, 1, &ys, plain).unwrap(),
                matmul::linear_in(&gpu, &x, norm, &sg_w, None, &sact, glu).unwrap(),
                matmul::linear(&gpu, &sact, &sd_w, None, &sout, plain).unwrap(),
                moe_combine(
                    &gpu,
                    &ys,
                    &weights,
                    Some(SharedExpert { out: &sout, gate: &logits, gate_ld: experts + 1, gate_col: experts }),
                    &x,
                )
                .unwrap(),
            ];
            gpu.run(&kernels.iter().collect::<Vec<_>>()).unwrap();
            let got = gpu.read_f32(&x).unwrap();

            let lg = gpu.read_f32(&logits).unwrap();
            let (gi, gw) = (gpu.read_u32(&ids).unwrap(), gpu.read_f32(&weights).unwrap());
            let mut want_i = vec![0u32; t * top_k];
            let mut want_w = vec![0f32; t * top_k];
            cpu::moe_router(&lg, experts + 1, experts, top_k, &mut want_i, &mut want_w, true);
            assert_eq!(gi, want_i, "router on the GPU's logits");
            let mut xn = vec![0f32; t * h];
            norm::cpu::rms_norm(&xv, &gv, &mut xn, 1e-6, false);
            let mut lw = vec![0f32; t * (experts + 1)];
            matmul::cpu::linear(&xn, &rf, h, None, &mut lw, false);
            let (d, _) = max_abs_diff(&lg, &lw);
            assert!(d < 1e-3, "router logits differ by {d}");
            let mut a = vec![0f32; t * top_k * inter];
            cpu::linear_experts(&xn, &guf, experts, h, &gi, top_k, Some(Activation::SiluGated), &mut a, false);
            let mut yv = vec![0f32; t * top_k * h];
            cpu::linear_experts(&a, &df, experts, inter, &gi, 1, None, &mut yv, false);
            let mut sa = vec![0f32; t * 2 * inter];
            matmul::cpu::linear(&xn, &sgf, h, None, &mut sa, false);
            let mut sact_v = vec![0f32; t * inter];
            elementwise::cpu::gated_act_interleaved(&sa, &mut sact_v, inter, Activation::SiluGated);
            let mut so = vec![0f32; t * h];
            matmul::cpu::linear(&sact_v, &sdf, inter, None, &mut so, false);
            let mut want = xv.clone();
            cpu::moe_combine(&yv, &gw, Some((&so, &lg, experts + 1, experts)), &mut want, h);
            // Four f32 projections chained, each within 4·eps·sqrt(K)·S of its f64 twin (the
            // matmul tests' bound: 2.7e-6 of S = Σ|terms| at K = 128), S a few times the outputs'
            // scale: 1e-5 of the largest output bounds the chain, and a misrouted expert or weight
            // moves outputs by about their scale.
            let (d, at) = max_abs_diff(&got, &want);
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            eprintln!("moe block: max |diff| {d:e} at {at}, outputs up to {scale} (sg={})", gpu.caps.subgroups);
            assert!(d <= 1e-5 * scale, "moe block: got {} want {} at {at}", got[at], want[at]);
        }
    }
}
