//! The quantized matvec (`wgsl/matvec_quant.wgsl`): one token or a few, routed expert slots, and
//! the mixed-type dispatch of two weights; the staging of x apart (`wgsl/quantize_x16.wgsl`).

use super::{dp4_chunk, has_dp4, mix_config, mixes, stages_whole, QMatvecConfig};
use crate::error::Result;
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Macros, Tensor};
use crate::ops::matmul::{
    check_operands, check_row_groups, staged_x_words, Input, LinearOpts, LinearShape, Operands, Route,
};
use crate::weights::{type_flag, type_macros, unit_elems, QuantWeight};

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/quantize_x16.wgsl`.
    pub(crate) struct QuantizeX16Uniform = "Params" {
        blocks: u32,
        bpr: u32,
        xs: u32,
        pad: u32,
    }
}

/// Records x (f32 `[T, K]`, K a multiple of 32) staged as 16-bit fixed point into `xs` (any
/// 4-byte element type, at least [`staged_x_words`]): wgsl/quantize_x16.wgsl, CPU twin
/// [`cpu::quantize_x16`]. A quantized matvec then reads it as [`Input::Staged`].
pub fn quantize_x16(gpu: &Gpu, x: &Tensor, xs: &Tensor) -> Result<Kernel> {
    assert_eq!(x.ty, ElemType::F32, "quantize_x16: x must be f32, got {:?}", x.ty);
    let (t, k) = match x.shape[..] {
        [t, k] if k % 32 == 0 && t > 0 => (t, k),
        _ => panic!("quantize_x16: x must be [T, K] with K a multiple of 32, got {:?}", x.shape),
    };
    let need = 4 * staged_x_words(t, k) as u64;
    assert!(xs.size_bytes() >= need, "quantize_x16: xs must hold {need} bytes, got {:?} {:?}", xs.ty, xs.shape);
    let blocks = (t * k / 32) as u32;
    let params = gpu.uniform(
        "quantize_x16.params",
        &QuantizeX16Uniform { blocks, bpr: (k / 32) as u32, xs: (k / 4) as u32, pad: 0 },
    );
    // Eight threads a block where subgroups are at least 8 wide (a block's threads one aligned run).
    let eight = gpu.caps.shuffles8();
    let threads = if eight { 8 * blocks } else { blocks };
    gpu.kernel(
        "quantize_x16",
        "main",
        &gpu.macros().flag_if("STAGE8", eight),
        &[x.binding(), xs.binding(), params.as_entire_binding()],
        grid(threads.div_ceil(64)),
    )
}

/// Records the quantized matvec with its configuration given (what [`crate::ops::matmul::linear_in`] records
/// up to [`MATVEC_MAX_T`](crate::ops::matmul::MATVEC_MAX_T) tokens, with the configuration the
/// tuning table chooses).
pub fn matvec_quant(gpu: &Gpu, op: &Operands<'_, QuantWeight>, s: &LinearShape, cfg: QMatvecConfig) -> Result<Kernel> {
    check_row_groups(cfg.shape.wg, cfg.shape.tpr, cfg.shape.tok);
    let (w, bias) = (op.w, op.bias);
    let mut macros = cfg.macros(gpu, op);
    if let Input::Staged(_) = op.input {
        assert!(
            cfg.shape.dp4 && cfg.shape.tok == 1 && s.t == 1,
            "linear_quant: x staged apart is one token's, DP4 ({cfg:?}, {s:?})"
        );
        assert!(op.route.is_none(), "linear_quant: no expert projection reads x staged apart");
        assert!(has_dp4(w.dtype), "linear_quant: {} has no DP4 form", w.dtype);
        macros =
            macros.flag("DP4").set("XB", if bias.is_some() { 6 } else { 5 }).flag_if("PREFETCH", cfg.shape.prefetch);
    } else if cfg.shape.dp4 {
        let kc = dp4_chunk(gpu, w.dtype, s.k, cfg.shape.wg, cfg.shape.tok);
        let kc = kc.unwrap_or_else(|| panic!("DP4 for {} K = {} ({cfg:?})", w.dtype, s.k));
        #[cfg(test)]
        let kc = if cfg.max_kc > 0 { kc.min(cfg.max_kc) } else { kc };
        // Chunks of whole 256-element super-blocks (the k-quants' units never straddle one).
        assert!(kc as usize == s.k / 32 || kc.is_multiple_of(8), "DP4 chunks of {kc} blocks");
        let chunked = (kc as usize) < s.k / 32 || cfg.shape.tok > 1;
        macros = macros
            .flag("DP4")
            .set("KC", kc)
            .flag_if("DP4X", chunked)
            .flag_if("STAGE8", cfg.shape.subgroups && gpu.caps.shuffles8())
            .flag_if("PREFETCH", cfg.shape.prefetch && !chunked);
    }
    if !cfg.probe.is_empty() {
        macros = macros.flag(cfg.probe);
    }
    let rows_per_wg = 4 * cfg.shape.wg / cfg.shape.tpr;
    let params = matvec_quant_params(gpu, "matvec_quant.params", op, s);
    let mut bindings = op.quant_bindings(gpu, s, &params);
    let (macros, z) = Route::apply(op.route, macros, &mut bindings, s.t);
    let [gx, gy, _] = grid((s.n as u32).div_ceil(rows_per_wg));
    gpu.kernel("matvec_quant", "main", &macros, &bindings, [gx, gy, z])
}

/// Records `y (+)= input(x) · [A; B]ᵀ (+ bias)` for one token in one dispatch (`MIX` in
/// wgsl/matvec_quant.wgsl): `a` writes columns 0 .. N_A of y, `b` columns `col` = N_A .. N,
/// where y is `[1, N]` (row stride `opts.ld_out`) and the bias `[N]`. Each weight's columns are
/// the sums of its float or DP4 path ([`mix_config`]) in the dispatch's workgroup shape: those of
/// [`crate::ops::matmul::linear_in`] for that weight alone in that shape ([`mixes`] says when it applies).
pub fn matvec_quant_mixed(gpu: &Gpu, op: &Operands<'_, QuantWeight>, b: (&QuantWeight, usize)) -> Result<Kernel> {
    let [na, k] = op.w.shape;
    let sa = LinearShape { t: 1, n: na, k, ld_out: na, cols: na };
    let (cfg, b_dp4) = mix_config(gpu, op.w.dtype, b.0.dtype, &sa, op.input).expect("mixes");
    matvec_quant_mixed_with(gpu, op, b, cfg, b_dp4)
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct MixParams` of `wgsl/matvec_quant.wgsl` (MIX: the second weight).
    pub(crate) struct MatvecQuantMixUniform = "MixParams" {
        wg0: u32,
        n: u32,
        units: u32,
        col: u32,
        o1: u32,
        o2: u32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// [`matvec_quant_mixed`] for a batch step's `T` rows in the one-token form
/// ([`LinearOpts::one_token`], y `[T, N]`): one row is the mixed dispatch itself; more are two
/// dispatches, each weight in the configuration the mixed dispatch gives it ([`mix_config`]: its
/// workgroup shape, its float or DP4 path) run over the rows ([`QMatvecConfig::for_rows`]), so each
/// row's sums are the one-token pass's.
pub fn matvec_quant_mixed_rows(
    gpu: &Gpu,
    op: &Operands<'_, QuantWeight>,
    (b, col): (&QuantWeight, usize),
) -> Result<Vec<Kernel>> {
    let t = op.y.shape[0];
    if t == 1 {
        return Ok(vec![matvec_quant_mixed(gpu, op, (b, col))?]);
    }
    assert!(op.opts.batch && op.opts.one_token, "linear_quant_mixed: {t} rows are a one-token batch step's");
    let a = op.w;
    let [na, k] = a.shape;
    let one = LinearShape { t: 1, n: na, k, ld_out: na, cols: na };
    let (cfg, b_dp4) = mix_config(gpu, a.dtype, b.dtype, &one, op.input).expect("mixes");
    let ld_out = op.opts.ld_out.unwrap_or(na + b.shape[0]);
    let parts = [(a, 0, cfg), (b, col, cfg.with(|s| (s.dp4, s.prefetch) = (b_dp4, false)))];
    parts
        .into_iter()
        .map(|(w, col, cfg)| {
            let n = w.shape[0];
            let (y, bias) = (op.y.view(col, &[t, n]), op.bias.map(|b| b.view(col, &[n])));
            let opts = LinearOpts { ld_out: Some(ld_out), ..op.opts };
            let part = Operands { input: op.input, bias: bias.as_ref(), ..Operands::new(op.x, w, &y, opts) };
            let s = check_operands("linear_quant_mixed", &op.input.checked_x(op.x, k), n, k, bias.as_ref(), &y, opts);
            matvec_quant(gpu, &part, &s, cfg.for_rows(gpu, w.dtype, k, t))
        })
        .collect()
}

/// [`matvec_quant_mixed`] with its configuration given.
pub(super) fn matvec_quant_mixed_with(
    gpu: &Gpu,
    op: &Operands<'_, QuantWeight>,
    (b, col): (&QuantWeight, usize),
    cfg: QMatvecConfig,
    b_dp4: bool,
) -> Result<Kernel> {
    let Operands { x, input, w: a, bias, y, opts, route } = *op;
    assert!(route.is_none(), "linear_quant_mixed: no expert projection mixes");
    let [na, k] = a.shape;
    let nb = b.shape[0];
    assert!(col == na && b.shape[1] == k, "linear_quant_mixed: parts {:?} at 0 and {:?} at {col}", a.shape, b.shape);
    let s = check_operands("linear_quant_mixed", &input.checked_x(x, k), na + nb, k, bias, y, opts);
    assert!(mixes(gpu, a, b, s.t, input, &opts), "linear_quant_mixed: {} + {} at {s:?} ({input:?})", a.dtype, b.dtype);
    assert!(
        cfg.shape.tpr.is_power_of_two() && cfg.shape.wg.is_multiple_of(cfg.shape.tpr) && cfg.shape.tpr >= 8,
        "{cfg:?}"
    );
    assert!(!b_dp4 || stages_whole(gpu, b.dtype, k, cfg.shape.wg), "linear_quant_mixed: {} DP4 at K = {k}", b.dtype);
    let sa = LinearShape { n: na, cols: na, ..s };
    let params = matvec_quant_params(gpu, "matvec_quant.params", op, &sa);
    let mut bindings = op.quant_bindings(gpu, &s, &params);
    let rows_per_wg = 4 * cfg.shape.wg / cfg.shape.tpr;
    let wg0 = (na as u32).div_ceil(rows_per_wg);
    let units_b = (k / unit_elems(b.dtype)) as u32;
    let pb = gpu.uniform(
        "matvec_quant.mix",
        &MatvecQuantMixUniform {
            wg0,
            n: nb as u32,
            units: units_b,
            col: col as u32,
            o1: b.planes[0],
            o2: b.planes[1],
            ..Default::default()
        },
    );
    let mb = bindings.len();
    let mut macros = cfg
        .macros(gpu, op)
        .flag("MIX")
        .flag(&format!("MIX_{}", type_flag(b.dtype)))
        .set("MB", mb)
        .set("MB1", mb + 1)
        .set("MB2", mb + 2);
    // DP4 for the second weight, and the first unless MIX_FLOAT_A (never the first alone).
    assert!(!cfg.shape.dp4 || b_dp4, "linear_quant_mixed: DP4 for {} but not {}", a.dtype, b.dtype);
    if b_dp4 {
        macros = macros
            .flag("DP4")
            .flag_if("MIX_FLOAT_A", !cfg.shape.dp4)
            .set("KC", k / 32)
            .flag_if("STAGE8", cfg.shape.subgroups && gpu.caps.shuffles8());
    }
    bindings.extend([b.buffer.as_entire_binding(), b.buffer.as_entire_binding(), pb.as_entire_binding()]);
    let [gx, gy, _] = grid(wg0 + (nb as u32).div_ceil(rows_per_wg));
    gpu.kernel("matvec_quant", "main", &macros, &bindings, [gx, gy, 1])
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/include/matvec_quant_params.wgsl` (matvec_quant, matvec_quant_batch).
    pub(crate) struct MatvecQuantUniform = "Params" {
        n: u32,
        units: u32,
        t: u32,
        ld_out: u32,
        xk: u32,
        o1: u32,
        o2: u32,
        experts: u32,
        xs: u32,
        half: u32,
        eps: f32,
        spr: u32,
    }
}

/// The uniform of both quantized matvecs (`Params`, wgsl/include/matvec_quant_params.wgsl): the
/// shape, W's planes, the fused input and the routing.
pub(super) fn matvec_quant_params(
    gpu: &Gpu,
    label: &str,
    op: &Operands<'_, QuantWeight>,
    s: &LinearShape,
) -> wgpu::Buffer {
    let Operands { input, w, route, .. } = *op;
    let units = s.k / unit_elems(w.dtype);
    gpu.uniform(
        label,
        &MatvecQuantUniform {
            n: s.n as u32,
            units: units as u32,
            t: s.t as u32,
            ld_out: s.ld_out as u32,
            xk: (s.k / 4) as u32,
            o1: w.planes[0],
            o2: w.planes[1],
            experts: route.map_or(0, |r| r.experts),
            xs: (input.x_cols(s.k) / 4) as u32,
            half: (s.k / 4) as u32,
            eps: input.eps(),
            spr: route.map_or(0, |r| r.slots_per_row),
        },
    )
}

impl<'a> Operands<'a, QuantWeight> {
    /// The macros of the quantized matmuls: [`Operands::common_macros`] and W's type.
    pub(super) fn type_macros(&self, gpu: &Gpu) -> Macros {
        type_macros(self.common_macros(gpu), self.w.dtype)
    }

    /// The macros of the quantized matvecs: [`Operands::matvec_macros`] and W's type.
    pub(super) fn quant_macros(&self, gpu: &Gpu) -> Macros {
        type_macros(self.matvec_macros(gpu), self.w.dtype)
    }

    /// The bindings of the quantized kernels that read both views of W, in order: W's 16-byte and
    /// word views (wgsl/include/quant_views.wgsl), then [`Operands::bindings`]' x, y, the uniform,
    /// the bias and the fused input's.
    pub(super) fn quant_bindings(
        &self,
        gpu: &Gpu,
        s: &LinearShape,
        params: &'a wgpu::Buffer,
    ) -> Vec<wgpu::BindingResource<'a>> {
        let w = &self.w.buffer;
        self.bindings(gpu, [w.as_entire_binding(), w.as_entire_binding()], s, params)
    }
}
