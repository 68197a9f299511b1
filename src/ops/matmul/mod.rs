//! Linear layers `y = x · Wᵀ (+ bias)`, or `y += x · Wᵀ (+ bias)` with
//! [`LinearOpts::accumulate`] (the residual add fused into an output/down projection).
//!
//! W is f16 `[N, K]` row-major (a linear weight as HF/GGUF store it, packed two per u32), x is f32
//! `[T, K]`, y is f32 `[T, N]`, bias f32 `[N]`; accumulation is f32. [`linear`] picks the kernel:
//! - T = 1 (decode) and up to [`MATVEC_MAX_T`] tokens: `wgsl/matvec.wgsl`, bandwidth-bound,
//!   streams W rows with 16-byte loads (2.8-2.95 TB/s on an H100's ~3.0 for lm_head shapes);
//! - more tokens (prefill): `wgsl/matmul.wgsl`, tiled in workgroup memory.
//!
//! W in a GGUF quantized type (Q4_0 ... Q6_K, read by the kernels without an f16 copy): [`gguf`]
//! ([`QuantWeight`], recorded by the same [`linear`] and [`linear_in`]: [`Weight`]), with the same
//! options and output views.
//!
//! Stacks of experts' weights (mixture-of-experts layers): the matvec kernels' `EXPERTS` flag reads,
//! per slot of a token and a chosen expert, the rows of the expert whose id a GPU buffer holds
//! ([`crate::ops::moe::linear_experts`], which records it through `Route`).
//!
//! Output views: a weight too large for one storage binding (a 262144-row lm_head) is split into
//! row chunks, each its own tensor, each writing its columns of one logits buffer `[T, V]`. For
//! the chunk starting at row `r0` pass `y` = a view of the logits with `offset` = logits.offset +
//! 4·r0 (aligned to the device's storage offset alignment: r0 a multiple of 64 does it) and shape
//! `[T, N_chunk]`, and `ld_out = Some(V)`: row t of the chunk's output lands at
//! `y[t·ld_out + n]`. The kernel binds `(T-1)·ld_out + N` elements from the view's offset, which
//! must lie inside the buffer.

use crate::error::Result;
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};
use crate::ops::elementwise::Activation;

pub mod gguf;
pub use crate::weights::QuantWeight;

/// What the kernel meets W with: `x` itself, or the op before the projection fused in (matvec
/// only: up to [`MATVEC_MAX_T`] tokens, K a multiple of 4; see [`fuses_input`]):
/// - `Norm`: `rms_norm(x) = x · g / sqrt(mean(x²) + eps)` per token, x `[T, K]`, g f32 `[K]`;
/// - `Gated`: `act(gate) · up` with x `[T, 2K]` = `[gate | up]` per row (the down projection).
///
/// One dispatch instead of two, and the normalized / activated rows are never written.
#[derive(Clone, Copy, Debug, Default)]
pub enum Input<'a> {
    #[default]
    Plain,
    Norm {
        weight: &'a Tensor,
        eps: f32,
    },
    Gated(Activation),
    /// x as [`gguf::quantize_x16`] staged it into this buffer (one token, a DP4 weight type on
    /// Vulkan: the quantized matvec's `XG` variant reads it instead of x).
    Staged(&'a Tensor),
}

impl<'a> Input<'a> {
    /// Columns of x for a weight with K columns.
    pub(crate) fn x_cols(&self, k: usize) -> usize {
        match self {
            Input::Gated(_) => 2 * k,
            _ => k,
        }
    }

    pub(crate) fn macros(&self, m: crate::gpu::Macros) -> crate::gpu::Macros {
        match self {
            Input::Plain => m,
            Input::Norm { .. } => m.flag("NORM"),
            Input::Gated(act) => m.flag("GATED").flag_if("GELU_TANH", *act == Activation::GeluTanhGated),
            Input::Staged(_) => m.flag("XG"),
        }
    }

    /// The x view [T, K] that the shape checks see (a gated x has 2K columns).
    pub(crate) fn checked_x(&self, x: &Tensor, k: usize) -> Tensor {
        match self {
            Input::Gated(_) => {
                assert!(
                    x.shape.len() == 2 && x.shape[1] == 2 * k,
                    "linear: a gated x must be [T, 2K = {}] ([gate | up] rows), got {:?}",
                    2 * k,
                    x.shape
                );
                Tensor { shape: vec![x.shape[0], k], ..x.clone() }
            }
            _ => x.clone(),
        }
    }

    /// The extra binding (the norm weight), after checking it against K.
    pub(crate) fn binding(&self, k: usize) -> Option<wgpu::BindingResource<'a>> {
        match self {
            Input::Norm { weight, .. } => {
                assert!(
                    weight.ty == ElemType::F32 && weight.shape == [k],
                    "linear: the fused norm's weight must be f32 [K = {k}], got {:?} {:?}",
                    weight.ty,
                    weight.shape
                );
                Some(weight.binding())
            }
            Input::Staged(xs) => {
                let need = 4 * staged_x_words(1, k) as u64;
                assert!(
                    xs.size_bytes() >= need,
                    "linear: the staged x must hold {need} bytes for K = {k}, got {:?} {:?}",
                    xs.ty,
                    xs.shape
                );
                Some(xs.binding())
            }
            _ => None,
        }
    }

    pub(crate) fn eps(&self) -> f32 {
        match self {
            Input::Norm { eps, .. } => *eps,
            _ => 0.0,
        }
    }
}

/// u32 words of x staged by [`gguf::quantize_x16`] for `t` rows of `k` elements: five vec4 a 32-element
/// block (wgsl/quantize_x16.wgsl).
pub fn staged_x_words(t: usize, k: usize) -> usize {
    t * k / 32 * 20
}

/// Whether a projection of `t` tokens with K = `k` can take a fused [`Input`] (otherwise run the
/// norm or the activation as its own op first).
pub fn fuses_input(t: usize, k: usize) -> bool {
    t <= MATVEC_MAX_T && k.is_multiple_of(4)
}

/// Whether a projection of `t` tokens with K = `k` takes its RMSNorm fused ([`Input::Norm`]):
/// every workgroup of the matvec then reduces the whole input row itself, which pays off for
/// short rows (a dispatch saved) and not for long ones (Gemma-4-31B's 5376 on the H100: the
/// fused gate_up matvec took 91 us against 70 us unfused, where a separate norm takes ~6 us).
pub fn fuses_norm(t: usize, k: usize) -> bool {
    fuses_input(t, k) && k <= 4096
}

/// Options of [`linear`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LinearOpts {
    /// `y += x · Wᵀ (+ bias)` instead of `y = ...`.
    pub accumulate: bool,
    /// Row stride of `y` in elements (default: its columns): see the module docs on output views.
    pub ld_out: Option<usize>,
    /// W's rows are (gate, up) pairs (interleaved): y `[T, N / 2]` gets `act(gate) · up` of each
    /// pair, the gated MLP activation as the projection's epilogue (matvec only, no bias, no
    /// accumulation; after a matmul the model runs `gated_act` on the interleaved rows).
    pub glu: Option<Activation>,
    /// The rows are separate sequences (a decode step of a batch): each row's numbers must not
    /// depend on how many rows the pass has. The batched form (`one_token` unset): the matvec runs
    /// its several-token form (quantized: `matvec_quant_batch`, each unit of W met with 8 tokens)
    /// even for one row, so a row's sums are the same at any batch size.
    pub batch: bool,
    /// With `batch`, the one-token form: each row's numbers are those of the one-token pass (a
    /// sequence decoded alone, `generate`): the projection is tuned as for one token
    /// ([`tuned_shape`]) and runs its rows in passes that keep each token's sums
    /// ([`MatvecConfig::for_rows`], `QMatvecConfig::for_rows`). As fast as `generate` for one
    /// row, slower than the batched form for many (BENCHMARKS.md session 20).
    pub one_token: bool,
    /// `y = cap · tanh(y / cap)` as the epilogue (Gemma's final logit soft-capping, fused into
    /// lm_head); not with `accumulate` or `glu`.
    pub softcap: Option<f32>,
}

/// The dimensions one linear layer's matvec is tuned for: `s`; for a batch ([`LinearOpts::batch`])
/// at least two tokens, or in the one-token form ([`LinearOpts::one_token`]) one, so that every
/// batch size takes the same form.
#[doc(hidden)]
pub fn tuned_shape(s: &LinearShape, opts: &LinearOpts) -> LinearShape {
    match (opts.batch, opts.one_token) {
        (true, true) => LinearShape { t: 1, ..*s },
        (true, false) => LinearShape { t: s.t.max(2), ..*s },
        _ => *s,
    }
}

/// The dimensions of one linear layer, as checked by [`check_shapes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearShape {
    /// Tokens (rows of x and y).
    pub t: usize,
    /// Output features (rows of W).
    pub n: usize,
    /// Input features (columns of W and x).
    pub k: usize,
    /// Row stride of y, in elements.
    pub ld_out: usize,
    /// Columns of y: N, or N / 2 with [`LinearOpts::glu`].
    pub cols: usize,
}

impl LinearShape {
    /// Elements of y's buffer, from its offset, that the kernel may touch.
    pub fn out_span(&self) -> usize {
        (self.t - 1) * self.ld_out + self.cols
    }
}

/// Checks the operands of [`linear`] and returns their dimensions. Panics with a message naming
/// the operand on any mismatch: shapes are fixed by the model, so a mismatch is a bug.
pub fn check_shapes(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, y: &Tensor, opts: LinearOpts) -> LinearShape {
    assert_eq!(w.ty, ElemType::F16, "linear: W must be f16, got {:?}", w.ty);
    assert_eq!(w.shape.len(), 2, "linear: W must be [N, K], got {:?}", w.shape);
    let (n, k) = (w.shape[0], w.shape[1]);
    assert!(n > 0 && k > 0, "linear: empty W {:?}", w.shape);
    assert!(k % 2 == 0, "linear: K = {k} must be even (W rows are whole u32 words)");
    let s = check_operands("linear", x, n, k, bias, y, opts);
    assert!(n * k / 2 < u32::MAX as usize, "linear: {s:?} overflows 32-bit indexing");
    s
}

/// The checks of x, bias and y against a weight `[n, k]` shared by [`check_shapes`] and
/// the quantized [`Weight`]; `op` names the op in the panic messages.
#[doc(hidden)]
pub fn check_operands(
    op: &str,
    x: &Tensor,
    n: usize,
    k: usize,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> LinearShape {
    assert_eq!(x.ty, ElemType::F32, "{op}: x must be f32, got {:?}", x.ty);
    assert!(x.shape.len() == 2 && x.shape[1] == k, "{op}: x must be [T, K = {k}], got {:?}", x.shape);
    let t = x.shape[0];
    assert!(t > 0, "{op}: x has no rows");
    assert_eq!(y.ty, ElemType::F32, "{op}: y must be f32, got {:?}", y.ty);
    let cols = match opts.glu {
        Some(_) => {
            assert!(n.is_multiple_of(2), "{op}: GLU needs (gate, up) row pairs, N = {n}");
            assert!(bias.is_none() && !opts.accumulate, "{op}: GLU takes no bias and no accumulation");
            n / 2
        }
        None => n,
    };
    assert!(y.shape == [t, cols], "{op}: y must be [T = {t}, {cols}], got {:?}", y.shape);
    if let Some(b) = bias {
        assert_eq!(b.ty, ElemType::F32, "{op}: bias must be f32, got {:?}", b.ty);
        assert!(b.shape == [n], "{op}: bias must be [N = {n}], got {:?}", b.shape);
    }
    let ld_out = opts.ld_out.unwrap_or(cols);
    assert!(ld_out >= cols, "{op}: ld_out = {ld_out} < {cols} columns");
    let s = LinearShape { t, n, k, ld_out, cols };
    let end = y.offset + 4 * s.out_span() as u64;
    assert!(
        end <= y.buffer.size(),
        "{op}: y rows of stride {ld_out} from byte {} reach byte {end}, past its buffer ({} bytes)",
        y.offset,
        y.buffer.size()
    );
    assert!(s.out_span() < u32::MAX as usize && t * k < u32::MAX as usize, "{op}: {s:?} overflows 32-bit indexing");
    s
}

/// Up to this many tokens, [`linear`] runs matvec (passes of 4 tokens over the same W rows, which
/// stay in cache after the first) rather than the tiled matmul, which has few workgroups when
/// T·N is small. Measured on an H100 at T = 32: 32 vs 180 us at N = K = 2048, 36 vs 82 us at
/// 4864 × 896, 0.83 vs 1.15 ms at 151936 × 896; at T = 64 matvec still wins the first two, not
/// the third.
pub const MATVEC_MAX_T: usize = 32;

/// Records `y (+)= x · Wᵀ (+ bias)` with an f16 or a quantized W ([`Weight`]): matvec for one
/// token (or up to [`MATVEC_MAX_T`]), the tiled matmul for more.
pub fn linear<W: Weight + ?Sized>(
    gpu: &Gpu,
    x: &Tensor,
    w: &W,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    linear_in(gpu, x, Input::Plain, w, bias, y, opts)
}

/// [`linear`] with a fused [`Input`] (panics where [`fuses_input`] says no: the model decides).
pub fn linear_in<W: Weight + ?Sized>(
    gpu: &Gpu,
    x: &Tensor,
    input: Input<'_>,
    w: &W,
    bias: Option<&Tensor>,
    y: &Tensor,
    opts: LinearOpts,
) -> Result<Kernel> {
    W::record(gpu, &Operands { x, input, w, bias, y, opts, route: None })
}

/// A weight [`linear_in`] records with: f16 ([`Tensor`]: `wgsl/matvec.wgsl`, `wgsl/matmul.wgsl`),
/// quantized ([`QuantWeight`]: [`gguf`]'s kernels), or the model's either
/// ([`crate::model::weights::Linear`]).
pub trait Weight {
    /// Checks the operands (a mismatch panics: shapes are fixed by the model) and records the
    /// kernel their shape takes.
    fn record(gpu: &Gpu, op: &Operands<'_, Self>) -> Result<Kernel>;
}

impl Weight for Tensor {
    fn record(gpu: &Gpu, op: &Operands<'_, Tensor>) -> Result<Kernel> {
        let Operands { x, input, w, bias, y, opts, .. } = *op;
        let k = *w.shape.get(1).unwrap_or(&0);
        let s = check_shapes(&input.checked_x(x, k), w, bias, y, opts);
        if s.t <= MATVEC_MAX_T {
            let cfg = MatvecConfig::new(gpu, &tuned_shape(&s, &opts));
            let cfg = if opts.batch && opts.one_token { cfg.for_rows(s.t) } else { cfg };
            assert!(
                matches!(input, Input::Plain) || (fuses_input(s.t, s.k) && cfg.vec > 1),
                "linear: {input:?} cannot be fused at {s:?}"
            );
            matvec(gpu, op, &s, cfg)
        } else {
            check_matmul_input("linear", &input, &s, &opts);
            matmul(gpu, op, &s, MatmulConfig::new(&s))
        }
    }
}

/// One linear layer's operands, `y (+)= input(x) · Wᵀ (+ bias)` with `opts`: what [`linear_in`]
/// takes, and with their checked [`LinearShape`] what every kernel constructor of this module
/// and of [`gguf`] takes (W f16 [`Tensor`] or [`QuantWeight`]).
pub struct Operands<'a, W: ?Sized> {
    pub x: &'a Tensor,
    pub input: Input<'a>,
    pub w: &'a W,
    pub bias: Option<&'a Tensor>,
    pub y: &'a Tensor,
    pub opts: LinearOpts,
    /// W a stack of experts' weights read per slot ([`Route`]; the expert projections').
    pub route: Option<Route<'a>>,
}

impl<W: ?Sized> Clone for Operands<'_, W> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<W: ?Sized> Copy for Operands<'_, W> {}

impl<'a, W: ?Sized> Operands<'a, W> {
    /// x read plain, no bias, no route (set the others with `Operands { input, ..Operands::new(..) }`).
    pub fn new(x: &'a Tensor, w: &'a W, y: &'a Tensor, opts: LinearOpts) -> Self {
        Operands { x, input: Input::Plain, w, bias: None, y, opts, route: None }
    }

    /// The same operands with the weight `w`.
    pub fn with_weight<V: ?Sized>(&self, w: &'a V) -> Operands<'a, V> {
        let Operands { x, input, bias, y, opts, route, .. } = *self;
        Operands { x, input, w, bias, y, opts, route }
    }

    /// The macros every linear kernel sets: the bias, accumulation and the soft-capping epilogue.
    fn common_macros(&self, gpu: &Gpu) -> crate::gpu::Macros {
        let m = gpu.macros().flag_if("BIAS", self.bias.is_some()).flag_if("ACCUMULATE", self.opts.accumulate);
        match self.opts.softcap {
            None => m,
            Some(cap) => {
                assert!(cap > 0.0 && cap.is_finite(), "linear: softcap {cap} must be positive");
                assert!(
                    !self.opts.accumulate && self.opts.glu.is_none(),
                    "linear: softcap is the epilogue of a plain projection"
                );
                m.flag("SOFTCAP").set("SOFTCAP_BITS", cap.to_bits())
            }
        }
    }

    /// The macros of a matvec over x read as `input` ([`Self::common_macros`], the fused
    /// input's, the GLU epilogue's): wgsl/matvec.wgsl, wgsl/matvec_quant.wgsl and
    /// wgsl/matvec_quant_batch.wgsl.
    fn matvec_macros(&self, gpu: &Gpu) -> crate::gpu::Macros {
        let m = self.input.macros(self.common_macros(gpu));
        match self.opts.glu {
            None => m,
            Some(act) => m.flag("GLU").flag_if("GELU_TANH", act == Activation::GeluTanhGated),
        }
    }

    /// The bindings of a linear kernel, in order: W's (one or more views), x, y (its
    /// [`LinearShape::out_span`]), the uniform, the bias where there is one, then the fused
    /// input's ([`Input::binding`]) where it has one.
    fn bindings(
        &self,
        gpu: &Gpu,
        w: impl IntoIterator<Item = wgpu::BindingResource<'a>>,
        s: &LinearShape,
        params: &'a wgpu::Buffer,
    ) -> Vec<wgpu::BindingResource<'a>> {
        let mut bindings: Vec<_> = w.into_iter().collect();
        bindings.extend([self.x.binding(), out_binding(gpu, self.y, s), params.as_entire_binding()]);
        bindings.extend(self.bias.map(Tensor::binding));
        bindings.extend(self.input.binding(s.k));
        bindings
    }
}

/// The tiled matmuls' part of the checks of [`linear_in`] (f16 and quantized W): x read plain
/// and no GLU epilogue (both are the matvec's alone); `op` names the op in the panic messages.
fn check_matmul_input(op: &str, input: &Input<'_>, s: &LinearShape, opts: &LinearOpts) {
    assert!(matches!(input, Input::Plain), "{op}: {input:?} cannot be fused into the matmul ({s:?})");
    assert!(opts.glu.is_none(), "{op}: GLU is a matvec epilogue, not the matmul's ({s:?})");
}

/// y's binding: `out_span` elements from its offset (more than its own shape when ld_out > N).
fn out_binding<'a>(gpu: &Gpu, y: &'a Tensor, s: &LinearShape) -> wgpu::BindingResource<'a> {
    let align = gpu.limits.min_storage_buffer_offset_alignment as u64;
    assert!(
        y.offset.is_multiple_of(align),
        "linear: y's offset {} is not a multiple of the storage offset alignment {align}",
        y.offset
    );
    wgpu::BindingResource::Buffer(wgpu::BufferBinding {
        buffer: &y.buffer,
        offset: y.offset,
        size: std::num::NonZeroU64::new(4 * s.out_span() as u64),
    })
}

/// Asserts a matvec's workgroup shape (wgsl/matvec.wgsl, wgsl/matvec_quant.wgsl): `tok` tokens a
/// pass (1 or 4), row groups of `tpr` lanes (a power of two dividing the `wg` threads) with a
/// storing lane for each output of a pass and the 8 lanes the reduction without subgroups folds.
fn check_row_groups(wg: u32, tpr: u32, tok: u32) {
    assert!(matches!(tok, 1 | 4));
    assert!(tpr.is_power_of_two() && wg.is_multiple_of(tpr));
    assert!(tpr >= 8 && tpr >= 4 * tok);
}

/// A matvec's workgroup shape (wgsl/matvec.wgsl, wgsl/matvec_quant.wgsl): `wg` threads in row
/// groups of `tpr` lanes, `tok` tokens a pass, `SUBGROUP` cleared where it reduces without
/// subgroups.
fn matvec_shape(m: crate::gpu::Macros, wg: u32, tpr: u32, tok: u32, subgroups: bool) -> crate::gpu::Macros {
    let mut m = m.set("WG", wg).set("TPR", tpr).set("TOK", tok).flag_if("TOK4", tok == 4);
    if !subgroups {
        m.0.remove("SUBGROUP");
    }
    m
}

const MATVEC_WG: u32 = 256;

/// How matvec runs for one K on one device.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatvecConfig {
    /// u32 words (2 halves each) per W load: 4, 2 or 1, the widest that divides a row.
    pub vec: u32,
    /// Threads per workgroup.
    pub wg: u32,
    /// Threads per row group of 4 rows (a power of two dividing the workgroup).
    pub tpr: u32,
    /// Tokens per pass over W: 1 or 4 (each lane meets its unpacked W loads with this many x
    /// rows).
    pub tok: u32,
    /// Reduce with subgroup operations.
    pub subgroups: bool,
}

impl MatvecConfig {
    /// The configuration [`linear`] takes for `s` on this device.
    pub fn new(gpu: &Gpu, s: &LinearShape) -> Self {
        let vec = if s.k.is_multiple_of(8) {
            4
        } else if s.k.is_multiple_of(4) {
            2
        } else {
            1
        };
        let loads = (s.k / (2 * vec as usize)) as u32;
        // A row group must cover whole subgroups, of any size the device may pick.
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let subgroups = gpu.caps.subgroups && sg_max <= MATVEC_WG;
        // Several tokens go in passes of 4 (measured on an H100: 1.3-2.6× faster than one token
        // per pass from T = 4 on, about as fast at T = 2).
        let tok = if s.t >= 2 { 4 } else { 1 };
        // Every output of a pass (4 rows × tok tokens) has a storing lane, and the reduction
        // without subgroups folds 8 lanes first.
        let min_tpr = (4 * tok).max(8).max(if subgroups { sg_max } else { 1 });
        // Measured on an H100 (2.8-3.0 TB/s on lm_head shapes 151936 × 896 and 262144 × 640,
        // the roofline being ~3.0): narrow row groups where rows are many (less reduction per
        // row, which matters most without subgroups), wide where they are few, so that about
        // 64k lanes stream W; never wider than a row's loads, nor than 256.
        let groups = s.n.div_ceil(4) as u32;
        let want = 65536u32.div_ceil(groups).next_power_of_two();
        let widest = loads.next_power_of_two().min(MATVEC_WG).max(min_tpr);
        let tpr = want.clamp(min_tpr.max(16).min(widest), widest);
        MatvecConfig { vec, wg: MATVEC_WG, tpr, tok, subgroups }
    }

    /// This configuration run over `t` rows: passes of 4 tokens where a row group has a storing
    /// lane for each of a pass's outputs (16 lanes), else one token a pass. A token's sums are
    /// the same code in either (wgsl/matvec.wgsl), so a batch step's rows tuned as one token
    /// ([`tuned_shape`]) are bit for bit the one-token pass's.
    pub fn for_rows(self, t: usize) -> Self {
        let tok = if t >= 2 && self.tpr >= 16 { 4 } else { 1 };
        MatvecConfig { tok, ..self }
    }
}

/// The expert routing of a matvec over a stack of experts' weights (`EXPERTS` in
/// wgsl/matvec.wgsl and wgsl/matvec_quant.wgsl; the op is [`crate::ops::moe::linear_experts`]):
/// W holds `experts` weights of N rows each, y's `s.t` rows are slots, slot s reads expert
/// `ids[s]`'s rows and x row `s / slots_per_row`.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Route<'a> {
    pub ids: &'a Tensor,
    pub experts: u32,
    pub slots_per_row: u32,
}

impl Route<'_> {
    /// The kernel's flag, the ids' binding number (after `bindings`) and the grid's z (one per slot).
    fn apply<'a>(
        route: Option<Route<'a>>,
        macros: crate::gpu::Macros,
        bindings: &mut Vec<wgpu::BindingResource<'a>>,
        slots: usize,
    ) -> (crate::gpu::Macros, u32) {
        match route {
            None => (macros, 1),
            Some(r) => {
                let m = macros.flag("EXPERTS").set("EB", bindings.len());
                bindings.push(r.ids.binding());
                (m, slots as u32)
            }
        }
    }
}

/// The matvec config of an expert projection: one token a pass (each slot is its own), sized for
/// the rows of `slots` slots together (`s.n` rows per slot: all the pass's, `s.t`, or a batch
/// step's one token's, so that a slot's sums do not depend on the batch).
fn experts_shape(s: &LinearShape, slots: usize) -> LinearShape {
    LinearShape { t: 1, n: s.n * slots, ..*s }
}

/// Records the f16 expert projection of [`crate::ops::moe::linear_experts`] (its checks done):
/// `s.t` slots of `s.n` rows (per expert) over K = `s.k` (no bias), the matvec tuned for
/// `tuned_slots` slots ([`experts_shape`]).
pub(crate) fn matvec_experts(
    gpu: &Gpu,
    op: &Operands<'_, Tensor>,
    s: &LinearShape,
    tuned_slots: usize,
) -> Result<Kernel> {
    let input = op.input;
    assert!(op.bias.is_none() && op.route.is_some(), "linear_experts: routed, no bias");
    let cfg = MatvecConfig::new(gpu, &experts_shape(s, tuned_slots));
    assert!(cfg.tok == 1);
    assert!(
        matches!(input, Input::Plain) || (s.k.is_multiple_of(4) && cfg.vec > 1),
        "linear_experts: {input:?} cannot be fused at K = {}",
        s.k
    );
    matvec(gpu, op, s, cfg)
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/matvec.wgsl`.
    pub(crate) struct MatvecUniform = "Params" {
        n: u32,
        kv: u32,
        t: u32,
        ld_out: u32,
        xs: u32,
        half: u32,
        eps: f32,
        k4: u32,
        experts: u32,
        spr: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// Records the f16 matvec with its configuration given (what [`linear_in`] records up to
/// [`MATVEC_MAX_T`] tokens, with [`MatvecConfig::new`]'s; routed: [`matvec_experts`]).
#[doc(hidden)]
pub fn matvec(gpu: &Gpu, op: &Operands<'_, Tensor>, s: &LinearShape, cfg: MatvecConfig) -> Result<Kernel> {
    assert!(s.k.is_multiple_of(2 * cfg.vec as usize));
    check_row_groups(cfg.wg, cfg.tpr, cfg.tok);
    let loads = (s.k / (2 * cfg.vec as usize)) as u32;
    let macros = op
        .matvec_macros(gpu)
        .flag_if("VEC4", cfg.vec == 4)
        .flag_if("VEC1", cfg.vec == 1)
        .set("GB", if op.bias.is_some() { 5 } else { 4 });
    let macros = matvec_shape(macros, cfg.wg, cfg.tpr, cfg.tok, cfg.subgroups);
    let rows_per_wg = 4 * cfg.wg / cfg.tpr;
    // x's row stride and the up half's offset, in the kernel's x vectors (XPL per load).
    let xpl = if cfg.vec == 4 { 2 } else { 1 };
    let row = loads * xpl;
    let xs = if matches!(op.input, Input::Gated(_)) { 2 * row } else { row };
    let (experts, spr) = op.route.map_or((0, 0), |r| (r.experts, r.slots_per_row));
    let params = gpu.uniform(
        "matvec.params",
        &MatvecUniform {
            n: s.n as u32,
            kv: loads,
            t: s.t as u32,
            ld_out: s.ld_out as u32,
            xs,
            half: row,
            eps: op.input.eps(),
            k4: (s.k / 4) as u32,
            experts,
            spr,
            ..Default::default()
        },
    );
    let mut bindings = op.bindings(gpu, [op.w.binding()], s, &params);
    let (macros, z) = Route::apply(op.route, macros, &mut bindings, s.t);
    let [gx, gy, _] = grid((s.n as u32).div_ceil(rows_per_wg));
    gpu.kernel("matvec", "main", &macros, &bindings, [gx, gy, z])
}

/// Matmul tile: the workgroup is 16 × 16 threads, each computing tile × tile outputs of a
/// 16·tile (tokens) × 16·tile (features) block of y; K advances bk at a time.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatmulConfig {
    pub tile: u32,
    pub bk: u32,
}

impl MatmulConfig {
    /// The tile [`linear`] takes for `s` (f16 or quantized W).
    pub fn new(s: &LinearShape) -> Self {
        // The 128×128 tile does twice the work per staged word, but makes 4× fewer workgroups:
        // worth it once they fill a large GPU (measured on an H100, 132 SMs: 29.6 vs 17.3
        // TFLOP/s at 2048 × 4096 × 4096, 512 workgroups; 17.0 vs 14.2 at 512 × 4864 × 896, 152;
        // 11.7 vs 17.0 at 512 × 2048 × 2048, 64).
        if s.t.div_ceil(128) * s.n.div_ceil(128) >= 128 {
            MatmulConfig { tile: 8, bk: 16 }
        } else {
            MatmulConfig { tile: 4, bk: 32 }
        }
    }

    /// The grid of a tiled matmul (wgsl/matmul.wgsl, wgsl/matmul_quant.wgsl) over `s`: a
    /// workgroup per 16·tile features × 16·tile tokens.
    fn groups(&self, s: &LinearShape) -> [u32; 3] {
        [(s.n as u32).div_ceil(16 * self.tile), (s.t as u32).div_ceil(16 * self.tile), 1]
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/matmul.wgsl`.
    pub(crate) struct MatmulUniform = "Params" {
        t: u32,
        n: u32,
        k: u32,
        ld_out: u32,
    }
}

/// Records the tiled f16 matmul with its tile given (what [`linear_in`] records past
/// [`MATVEC_MAX_T`] tokens, with [`MatmulConfig::new`]'s).
#[doc(hidden)]
pub fn matmul(gpu: &Gpu, op: &Operands<'_, Tensor>, s: &LinearShape, cfg: MatmulConfig) -> Result<Kernel> {
    let MatmulConfig { tile, bk } = cfg;
    // Staging: every thread loads 4 K pairs of each tile, and a K slice is whole groups of 4.
    assert!(matches!(tile, 4 | 8) && bk % 8 == 0 && 16 * tile * bk / 2 == 4 * 256);
    let macros = op.common_macros(gpu).set("TILE", tile).flag_if("TILE8", tile == 8).set("BK", bk);
    let params = gpu.uniform(
        "matmul.params",
        &MatmulUniform { t: s.t as u32, n: s.n as u32, k: s.k as u32, ld_out: s.ld_out as u32 },
    );
    let bindings = op.bindings(gpu, [op.w.binding()], s, &params);
    gpu.kernel("matmul", "main", &macros, &bindings, cfg.groups(s))
}

pub mod cpu {
    pub use super::gguf::cpu::linear_quant;

    /// Reference of the soft-capping epilogue ([`super::LinearOpts::softcap`]):
    /// `cap · tanh(v / cap)`, in f64.
    pub fn softcap(v: f32, cap: f32) -> f32 {
        (cap as f64 * (v as f64 / cap as f64).tanh()) as f32
    }

    /// `y (+)= x · Wᵀ (+ bias)` with x `[T, K]`, w `[N, K]` (f32, e.g. the f16 weight widened),
    /// y `[T, N]`; sums in f64, so it serves as the exact reference.
    pub fn linear(x: &[f32], w: &[f32], k: usize, bias: Option<&[f32]>, y: &mut [f32], accumulate: bool) {
        assert!(k > 0 && x.len().is_multiple_of(k) && w.len().is_multiple_of(k));
        let (t, n) = (x.len() / k, w.len() / k);
        assert_eq!(y.len(), t * n);
        for ti in 0..t {
            let xr = &x[ti * k..(ti + 1) * k];
            for ni in 0..n {
                let wr = &w[ni * k..(ni + 1) * k];
                let mut s: f64 = xr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum();
                if let Some(b) = bias {
                    s += b[ni] as f64;
                }
                let o = &mut y[ti * n + ni];
                *o = if accumulate { (*o as f64 + s) as f32 } else { s as f32 };
            }
        }
    }
}

/// The kernels with their configuration given rather than chosen, for the timing loops of
/// `benches/` (`matvec.rs`, `quant.rs`, `moe.rs`): not an API, its items follow the kernels.
#[doc(hidden)]
pub mod bench {
    pub use super::gguf::bench::{
        batch_rows, dp4_fits, has_dp4, matmul_quant, matmul_quant_coop, matvec_quant, matvec_quant_batch, QMatvecConfig,
    };
    pub use super::{check_operands, check_shapes, matmul, matvec, tuned_shape, MatmulConfig, MatvecConfig, Route};
}

#[doc(hidden)]
pub mod test_util;
#[cfg(test)]
pub(crate) mod tests;
