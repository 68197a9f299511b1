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
//! the same bytes. Measured on an H100 (`benches/moe.rs`, Qwen3.5-35B-A3B's shapes: H = 2048, E = 256,
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
use crate::ops::matmul::{self, Input, LinearOpts, LinearShape, Operands};
use crate::ops::signature::shared_params;
use crate::weights::QuantWeight;

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

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/moe_group.wgsl`.
    pub(crate) struct MoeGroupUniform = "Params" {
        slots: u32,
        stack: u32,
        max_tiles: u32,
        _pad: u32,
    }
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
    let params = gpu.uniform(
        "moe_group.params",
        &MoeGroupUniform { slots: slots as u32, stack: experts as u32, max_tiles: tiles as u32, _pad: 0 },
    );
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
    if !t.offset.is_multiple_of(align) {
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

shared_params! {
    (
        gpu: &Gpu, logits: &Tensor, ld: usize, experts: usize, top_k: usize, ids: &Tensor, weights: &Tensor,
        norm_topk: bool
    )

    /// Records the router of `T = ids.numel() / top_k` tokens: per token t, the `top_k` experts of
    /// largest probability under `softmax(logits[t, 0 .. experts])` (the order of the logits; equal
    /// logits: lower index first), larger first, into `ids[t, :]` (u32) and their probabilities into
    /// `weights[t, :]` (f32), renormalized to sum 1 with `norm_topk` (Qwen3.5-MoE, Qwen3-MoE), as
    /// they are otherwise. `logits` is f32 with rows of stride `ld >= experts` (columns past
    /// `experts`, e.g. the shared expert's gate logit, are not read); `ids` and `weights` hold
    /// `T · top_k` elements each. `experts <= 512`, `1 <= top_k <= experts`.
    pub fn moe_router() -> Result<Kernel> {
        router(gpu, logits, ld, experts, top_k, ids, weights, norm_topk, experts <= RANK_MAX_EXPERTS, false)
    }

    /// [`moe_router`] with a shared expert as one more slot per token: `ids` / `weights` are
    /// `(T, top_k + 1)`, the last slot of each row id `experts` (the shared expert stacked after the
    /// routed ones) weighted `sigmoid(logits[t, experts])` (its gate logit, column `experts`, so
    /// `ld > experts`). The experts' matvecs then run the shared expert too, and the combine needs no
    /// shared term: two dispatches fewer a layer.
    pub fn moe_router_shared() -> Result<Kernel> {
        if ld <= experts {
            return Err(invalid(format!(
                "moe_router: row stride {ld} has no shared gate column after {experts} experts"
            )));
        }
        router(gpu, logits, ld, experts, top_k, ids, weights, norm_topk, experts <= RANK_MAX_EXPERTS, true)
    }
}

/// Up to this many experts the router ranks every expert against all (`RANK`: E² comparisons
/// and no rounds); above, it takes k rounds of a workgroup arg-max.
const RANK_MAX_EXPERTS: usize = 256;

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/moe_router.wgsl`.
    pub(crate) struct MoeRouterUniform = "Params" {
        t: u32,
        ld: u32,
        e: u32,
        k: u32,
    }
}

/// [`moe_router`] with its form given (`rank`, and `shared_slot`: [`moe_router_shared`]'s): for
/// `benches/moe.rs`.
#[doc(hidden)]
#[allow(clippy::too_many_arguments)]
pub fn router(
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
    if slots == 0 || !slots.is_multiple_of(per_row) || (shared_slot && top_k >= 256) {
        return Err(invalid(format!("{OP}: ids has {slots} elements, not T · {per_row}")));
    }
    let t = slots / per_row;
    check_tensor(gpu, OP, "ids", ids, ElemType::U32, slots)?;
    check_tensor(gpu, OP, "weights", weights, ElemType::F32, slots)?;
    check_tensor(gpu, OP, "logits", logits, ElemType::F32, (t - 1) * ld + experts + usize::from(shared_slot))?;
    let params = gpu.uniform(
        "moe_router.params",
        &MoeRouterUniform { t: t as u32, ld: ld as u32, e: experts as u32, k: top_k as u32 },
    );
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
/// last expert. With `opts.batch` (a decode step of T sequences, ids `(T, k)`) each slot's matvec
/// is tuned as for one token's k slots, as the one-token pass tunes it: a slot's sums do not
/// depend on T (and are the one-token pass's); with `groups` the batch kernel's do not either. `y`: f32 `(S, N)` (`(S, N/2)` with GLU), rows of stride `opts.ld_out`. No bias.
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
            assert!(n.is_multiple_of(2), "{OP}: GLU needs (gate, up) row pairs, N = {n}");
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
    let route = Some(matmul::Route { ids, experts: experts as u32, slots_per_row: slots_per_row as u32 });
    // The per-slot matvec is tuned for all the slots, or for one token's in a batch step.
    let tuned = if opts.batch {
        assert!(ids.shape.len() == 2, "{OP}: a batch step's ids must be (T, k), got {:?}", ids.shape);
        ids.shape[1]
    } else {
        slots
    };
    match *w {
        ExpertWeight::F16 { w, .. } => {
            assert!(groups.is_none(), "{OP}: f16 stacks run per slot");
            assert!(k % 2 == 0, "{OP}: K = {k} must be even (f16 rows are whole u32 words)");
            assert!(rows * k / 2 < u32::MAX as usize, "{OP}: [{rows}, {k}] overflows 32-bit indexing");
            matmul::matvec_experts(gpu, &Operands { input, route, ..Operands::new(x, w, y, opts) }, &s, tuned)
        }
        ExpertWeight::Quant { w, .. } => {
            let groups = groups.map(|g| (g, group_tiles(s.t, experts)));
            let op = Operands { input, route, ..Operands::new(x, w, y, opts) };
            matmul::gguf::matvec_experts_quant(gpu, &op, &s, tuned, groups)
        }
    }
}

/// The shared expert of [`moe_combine`]: its output gated by `sigmoid(gate[t · gate_ld + gate_col])`.
#[derive(Clone, Copy, Debug)]
pub struct SharedExpert<'a> {
    /// Its output, f32 `(T, H)`.
    pub out: &'a Tensor,
    /// A whole f32 buffer (e.g. the router linear's `(T, E + 1)` output), not a view, so that no
    /// binding offset has to be aligned.
    pub gate: &'a Tensor,
    /// The gate buffer's row stride (E + 1 for the router linear's output).
    pub gate_ld: usize,
    /// The gate logit's column (E for the router linear's output).
    pub gate_col: usize,
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/moe_combine.wgsl`.
    pub(crate) struct MoeCombineUniform = "Params" {
        t: u32,
        h: u32,
        k: u32,
        gate_ld: u32,
        gate_col: u32,
        _pad0: u32,
        _pad1: u32,
        _pad2: u32,
    }
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
    let params = gpu.uniform(
        "moe_combine.params",
        &MoeCombineUniform {
            t: t as u32,
            h: h as u32,
            k: k as u32,
            gate_ld: gate_ld as u32,
            gate_col: gate_col as u32,
            ..Default::default()
        },
    );
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
    use crate::ops::elementwise::cpu::{gelu_tanh, silu};
    use crate::ops::elementwise::Activation;

    /// Reference of [`super::moe_router`] (softmax in f64): per token, the `top_k` experts of
    /// largest logit (equal logits: lower index first), larger first; with `shared_slot`, of
    /// [`super::moe_router_shared`]: after each row's top-k the shared expert's slot, id `experts`,
    /// weight `sigmoid(logits[t, experts])` (rows of `top_k + 1`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_router(
        logits: &[f32],
        ld: usize,
        experts: usize,
        top_k: usize,
        ids: &mut [u32],
        weights: &mut [f32],
        norm_topk: bool,
        shared_slot: bool,
    ) {
        let per_row = top_k + usize::from(shared_slot);
        let t = ids.len() / per_row;
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
                ids[ti * per_row + j] = i as u32;
                weights[ti * per_row + j] = (e[i] / total) as f32;
            }
            if shared_slot {
                ids[ti * per_row + top_k] = experts as u32;
                weights[ti * per_row + top_k] = (1.0 / (1.0 + (-(logits[ti * ld + experts] as f64)).exp())) as f32;
            }
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
    /// `elementwise::cpu::gated_act`). An id past the stack reads the last expert. A quantized
    /// stack is dequantized first (`gguf::cpu::dequantize_rows`, as `to_f32`).
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
mod tests;
