//! Linear layers over GGUF quantized weights, read directly by the kernels: `y (+)= x · Wᵀ (+ bias)`
//! with W `[N, K]` in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K ([`QuantWeight`]), x f32
//! `[T, K]`, y f32 `[T, N]` (row stride `ld_out`, as [`super::linear`]), bias f32 `[N]`; the
//! weights are dequantized in registers (matvec) or into workgroup memory (matmul), and every sum
//! is f32. No f16 copy of the weight exists.
//!
//! [`super::linear`] picks the kernel for a [`QuantWeight`] as for an f16 one:
//! - up to [`MATVEC_MAX_T`] tokens, `wgsl/matvec_quant.wgsl`: lanes stream whole blocks (units of
//!   32 elements, 64 for Q6_K: one 16-byte load of quants plus the block's scales per row),
//!   dequantize them in registers and meet them with x; for one token over Q4_0, Q4_1, Q4_K and
//!   Q6_K on Vulkan, with 16 rows or more a workgroup, x is first staged in workgroup memory as
//!   16-bit fixed point per block (`DP4`) and the quants meet it in 4-wide integer dot products
//!   (exact sums; x rounded to 2^-14 of its block's largest |x|, [`cpu::stage_x16`]);
//! - a batch decode step ([`LinearOpts::batch`], up to [`MATVEC_MAX_T`] sequences, a token each),
//!   `wgsl/matvec_quant_batch.wgsl`: each unit of W dequantized once (`q_vals`) and met with the x
//!   of 8 tokens staged in workgroup memory, so that a token's sums do not depend on the batch;
//! - more tokens, `wgsl/matmul_quant.wgsl`: the f16 matmul's tiling, with W's tiles dequantized
//!   into workgroup memory as f32 (bit-identical to [`crate::dtype::to_f32`]); where the device
//!   has 16 × 16 cooperative matrices (`Caps::coop`: the H100 on Vulkan), `wgsl/matmul_quant_coop.wgsl`
//!   on the tensor cores instead (x and W's values met as f16, f32 sums; 2.3x the f32 matmul's
//!   prefill on Qwen2.5-1.5B, BENCHMARKS.md run 27).
//!
//! The weights' layout on the GPU (repacked planes) and their upload: [`crate::weights`].
//!
//! This file holds the configuration rules of the quantized matvec ([`QMatvecConfig`], the staging
//! apart, the mixed dispatch's [`mixes`]); the kernels' constructors live beside it in
//! `gguf/`: [`linear`] (the dispatch: `Weight for QuantWeight`), [`matvec`] (one-token and routed matvecs,
//! the mixed dispatch, [`quantize_x16`]), [`batch`] (the batch step's matvec), [`matmul`] (tiled
//! and cooperative-matrix matmuls), [`cpu`] (the CPU twins), `tests.rs`.
//!
//! The dequantization lives in `wgsl/include/quant*.wgsl` (one file per type, shared by any kernel
//! that reads quantized rows). Its CPU twin is [`cpu::linear_quant`] (dequantizes with `to_f32`).
//!
//! # Measured (H100, Vulkan, driver 580.159.04; `bench_quant`, random blocks, one token)
//!
//! | (N, K) | Q4_0 | Q4_K | Q6_K | Q8_0 | f16 (`linear`) |
//! |---|---|---|---|---|---|
//! | 151936 × 1536 (lm_head) | 100 us, 1.31 TB/s | 109 us, 1.21 | 157 us, 1.22 | 115 us, 2.16 | 284 us, 1.6 |
//! | 17920 × 1536 (gate_up) | 18.5 us, 0.84 | 17.6 us, 0.88 | 23.3 us, 0.97 | 19.3 us, 1.5 | 24 us, 2.2 |
//! | 1536 × 8960 (down) | 10.6 us, 0.73 | 10.5 us, 0.74 | 14.7-15.3 us, 0.75 | 12.1 us, 1.2 | 8.1-8.8 us |
//! | 2048 × 1536 (qkv) | 6.2 us | 6.6 us | 7.5 us | 6.0 us | 5.6 us |
//!
//! With DP4 (`probe_quant`, same machine, W cold in L2): lm_head 151936 × 1536 Q4_0 101 → 56 us
//! (2.36 TB/s), Q4_K 109 → 69 us (1.90), Q6_K 159 → 109 us (1.76); gate_up 17920 × 1536 Q4_0
//! 19.1 → 12.2 us, Q4_K 18.8 → 13.9, Q6_K 25.3 → 19.4. Not used below 16 rows a workgroup (the
//! down projection's 4: staging K = 8960 per 4 rows made it 1.4x slower).
//!
//! Large shapes stream 1.0-1.4 TB/s for the 4- to 6-bit types (35-50% of the ~2.8 TB/s read
//! roofline) and 2.2 TB/s for Q8_0, 2-2.7x faster than the f16 copy on an lm_head; the weights
//! per second are about the same for every type, so the kernel is bound by the dequantization's
//! instructions and latency (occupancy), not by bytes. Small and mid shapes are latency-bound
//! (one wave of lanes), as fast as f16 or, for the 1536 × 8960 down projection, slower.
//! Prefill (T = 512, 17920 × 1536): 22-24.5 TFLOP/s for every type, 26 for f16. At T = 32
//! matvec (4 tokens per pass, dequantizing per token) takes 250-360 us (Q6_K 530) against
//! 410-460 us for the tiled matmul at T = 33, and matvec_quant_batch 137-157 us (17920 × 1536,
//! Q4_K / Q6_K, `bench_quant_batch`: W dequantized once per 8 tokens).

mod batch;
pub mod cpu;
mod linear;
mod matmul;
mod matvec;
#[cfg(test)]
pub(crate) use {
    matmul::MatmulQuantUniform,
    matvec::{MatvecQuantMixUniform, MatvecQuantUniform, QuantizeX16Uniform},
};
#[cfg(test)]
pub(crate) mod tests;

pub use super::staged_x_words;
/// The quantized weights' storage, from [`crate::weights`] (kept at their former path).
pub use crate::weights::{is_supported, repack, unpack, unpermute_rope_rows_raw, QuantWeight};
pub(crate) use linear::matvec_experts_quant;
pub use matvec::{matvec_quant_mixed, matvec_quant_mixed_rows, quantize_x16};

use super::{matvec_shape, Input, LinearOpts, LinearShape, Operands, MATVEC_WG};
use crate::dtype::DType;
use crate::gpu::{Gpu, Macros};
use crate::tuning::{InputKind, MatvecQuery, MatvecState};
use crate::weights::unit_elems;

/// How matvec_quant runs for one shape on one device: the shape the tuning table's rows chose
/// ([`MatvecState`]: threads per workgroup, lanes per row group of 4 rows, tokens a pass,
/// subgroups, `DP4`, `PREFETCH`), and the measurement settings no rule picks.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QMatvecConfig {
    /// The workgroup shape and path. `dp4` (`DP4` in wgsl/matvec_quant.wgsl): Q4_0 / Q4_1 /
    /// Q4_K / Q6_K where the backend has the instructions; one token a pass with the whole row
    /// staged, or (Q6_K) passes of 4 tokens, staged in chunks where they do not fit workgroup
    /// memory ([`dp4_chunk`]).
    pub shape: MatvecState,
    /// A measurement probe of wgsl/matvec_quant.wgsl set as a flag (`benches/quant.rs`:
    /// PROBE_NOX, PROBE_NOMATH); empty (none) wherever the engine picks the configuration.
    pub probe: &'static str,
    /// At most this many blocks staged a chunk (tests only; 0: as many as fit).
    #[cfg(test)]
    max_kc: u32,
}

/// The configuration of the shape the tuning table chose (no probe, chunks as large as fit).
impl From<MatvecState> for QMatvecConfig {
    fn from(shape: MatvecState) -> Self {
        QMatvecConfig {
            shape,
            probe: "",
            #[cfg(test)]
            max_kc: 0,
        }
    }
}

impl QMatvecConfig {
    /// The shape the tuning table's [`Op::Matvec`](crate::tuning::Op) rows choose for `dtype`
    /// and `s` on this device (src/tuning/table.rs: each rule with the measurement that chose it,
    /// e.g. Q6_K down projections of 128+ units in 512 threads, BENCHMARKS run 67), then the knobs.
    pub fn new(gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let subgroups = gpu.caps.subgroups && sg_max <= MATVEC_WG;
        let tok = if s.t >= 2 { 4 } else { 1 };
        let st = Self::query(gpu, dtype, s, tok, subgroups, InputKind::Plain, |q| gpu.tuning().matvec(q));
        Self::from(st).knob(gpu, dtype, s)
    }

    /// Runs `f` on what the tuning table's rows see of this projection ([`MatvecQuery`]): the
    /// type's units, the narrowest and widest row groups a pass allows (as the f16 matvec: every
    /// output of a pass, 4 rows x `tok` tokens, has a storing lane, the reduction without
    /// subgroups folds 8 lanes first, a row group covers whole subgroups), whether a row stages
    /// whole for DP4 ([`stages_whole`], [`dp4_fits`]).
    #[allow(clippy::too_many_arguments)]
    fn query<R>(
        gpu: &Gpu,
        dtype: DType,
        s: &LinearShape,
        tok: u32,
        subgroups: bool,
        input: InputKind,
        f: impl FnOnce(&MatvecQuery) -> R,
    ) -> R {
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let min_tpr = (4 * tok).max(8).max(if subgroups { sg_max } else { 1 });
        let units = (s.k / unit_elems(dtype)) as u32;
        let whole = |wg: u32| stages_whole(gpu, dtype, s.k, wg);
        let fits = |wg: u32, tok: u32| dp4_fits(gpu, dtype, s.k, wg, tok);
        f(&MatvecQuery {
            dtype,
            n: s.n,
            k: s.k,
            tok,
            units,
            min_tpr,
            widest: units.next_power_of_two().min(MATVEC_WG).max(min_tpr),
            max_wg: MATVEC_WG,
            subgroups,
            subgroup_max_size: gpu.caps.subgroup_max_size,
            max_invocations: gpu.limits.max_compute_invocations_per_workgroup,
            int_dot: gpu.tuning().int_dot(),
            input,
            whole: &whole,
            fits: &fits,
        })
    }

    /// This configuration run over `t` rows (a batch step tuned as one token, [`LinearOpts::one_token`]):
    /// passes of 4 tokens where a row group has a storing lane for each output of a pass (16
    /// lanes) and, with DP4, 4 tokens stage in workgroup memory (in chunks where the row does not
    /// fit); else one token a pass. A token's sums are the same in either (the kernel's passes
    /// and chunks keep each token's order: `dp4_chunks_and_token_passes_keep_each_tokens_sums`),
    /// so each row is bit for bit the one-token pass's.
    pub(crate) fn for_rows(self, gpu: &Gpu, dtype: DType, k: usize, t: usize) -> Self {
        if t < 2 {
            return self;
        }
        let four = self.shape.tpr >= 16 && (!self.shape.dp4 || dp4_fits(gpu, dtype, k, self.shape.wg, 4));
        self.with(|c| c.tok = if four { 4 } else { 1 })
    }

    /// This configuration with its shape changed by `f` (the probe and the chunk cap kept).
    pub fn with(mut self, f: impl FnOnce(&mut MatvecState)) -> Self {
        f(&mut self.shape);
        self
    }

    /// The measurement knobs (TUNING.md): `WGPU_LLM_QMV="TYPE:N:K:wg:tpr:dp4,..."` (TYPE as `Q4_K`,
    /// or `any`) sets one-token configurations by type and shape, for measuring them inside a
    /// step. Applied last, over every rule (a shape it names takes its configuration, the others
    /// their rules). `WGPU_LLM_QMV_PF=0` / `1` turns `prefetch` off / on wherever a row stages whole.
    fn knob(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let knobs = &gpu.tuning().knobs;
        let mut cfg = match knobs.qmv_pf {
            Some(false) => self.with(|s| s.prefetch = false),
            Some(true) => self.with(|s| s.prefetch = s.dp4 && s.tok == 1),
            None => self,
        };
        if cfg.shape.tok != 1 {
            return cfg;
        }
        for e in &knobs.qmv {
            let ty_ok = e.ty == "any" || e.ty == format!("{dtype:?}");
            if ty_ok && e.n == s.n && e.k == s.k && (e.dp4 == 0 || stages_whole(gpu, dtype, s.k, e.wg)) {
                let dp4 = e.dp4 == 1 && gpu.tuning().int_dot();
                let prefetch = dp4 && knobs.qmv_pf == Some(true);
                cfg = cfg.with(|s| (s.wg, s.tpr, s.dp4, s.prefetch) = (e.wg, e.tpr, dp4, prefetch));
            }
        }
        cfg
    }
}

impl QMatvecConfig {
    /// The macros of wgsl/matvec_quant.wgsl every dispatch of this configuration sets: the fused
    /// input, the epilogue, W's type, where the norm weight binds, the workgroup shape and tokens a
    /// pass (`SUBGROUP` cleared where the configuration reduces without subgroups).
    fn macros(&self, gpu: &Gpu, op: &Operands<'_, QuantWeight>) -> Macros {
        let m = op.quant_macros(gpu).set("GB", if op.bias.is_some() { 6 } else { 5 });
        matvec_shape(m, self.shape.wg, self.shape.tpr, self.shape.tok, self.shape.subgroups)
    }

    /// The configuration for x read as `input`: one-token Q4_K rows of at most 1536 elements
    /// over at most 4096 rows, read plain (an o projection) or through the fused norm (q/k/v),
    /// take DP4 where the row stages whole. Rows of 1536 (Qwen2.5-1.5B's) in 256-thread
    /// workgroups of 64-lane row groups (H100, `WGPU_LLM_QMV` inside the step, BENCHMARKS run 65:
    /// its 1536 x 1536 o projection, the step 1741 -> 1710 us against 128 threads of 32 lanes; its
    /// q/k/v, N = 2048, with the norm, 1741 -> 1727 against the float path); shorter rows read
    /// plain in 128-thread workgroups of 32-lane row groups (measured against the float path with
    /// the 1.5B's o projection before the rule above, the step 1886 -> 1875 us and 1949 -> 1938 in
    /// two calls, and the 0.5B's 896 x 896 the same), through the norm the float path.
    fn for_input(self, gpu: &Gpu, dtype: DType, s: &LinearShape, input: Input) -> Self {
        if matches!(input, Input::Staged(_)) {
            return self.staged(gpu, dtype, s);
        }
        let kind = if matches!(input, Input::Norm { .. }) { InputKind::Norm } else { InputKind::Plain };
        match Self::query(gpu, dtype, s, self.shape.tok, self.shape.subgroups, kind, |q| {
            gpu.tuning().matvec_input(q, self.shape)
        }) {
            Some(st) => Self::from(st).knob(gpu, dtype, s),
            None => self,
        }
    }
}

impl QMatvecConfig {
    /// The configuration for x staged apart ([`Input::Staged`], one token): DP4 without the
    /// kernel's own staging, so any workgroup size: row groups of about 2 units a lane (32 to 128
    /// lanes) in workgroups of one row group, at least 64 threads (`WGPU_LLM_XG_CFG="wg:tpr:prefetch"`
    /// sets it for measurement).
    fn staged(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        // (The table's row: H100, `bench_quant` (W cold, the staging apart not counted),
        // Gemma-4-31B's rows of 16384 and 21504 over 5376: Q4_K (32-element units) 26.5 / 35.9 us
        // at 128 lanes (30.0 / 39.0 at 64, 41.3 / 53.5 at 32; the kernel staging in workgroup
        // memory: 38.3 / 48.3), Q6_K (64-element units) 35.5 / 45.9 at 64 lanes (34.9 / 44.2 at
        // 32; before: 48.9 / 64.5).)
        let st = Self::query(gpu, dtype, s, self.shape.tok, self.shape.subgroups, InputKind::Staged, |q| {
            gpu.tuning().matvec_staged(q, self.shape)
        });
        let mut cfg = Self::from(st);
        if let Some([w, t, pf]) = gpu.tuning().knobs.xg_cfg {
            let sg = if self.shape.subgroups { gpu.caps.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
            let t = t.max(sg);
            (cfg.shape.wg, cfg.shape.tpr, cfg.shape.prefetch) = (w.max(t), t, pf == 1);
        }
        cfg
    }
}

/// The matvec's (wg, tpr, dp4, prefetch) for `dtype` over `t` tokens of an N x K weight, x read
/// plain or through the fused norm (`norm`): what the tuning table's tests check.
#[cfg(test)]
pub(crate) fn tuned_matvec(
    gpu: &Gpu,
    dtype: DType,
    t: usize,
    n: usize,
    k: usize,
    norm: bool,
) -> (u32, u32, bool, bool) {
    let s = LinearShape { t, n, k, ld_out: n, cols: n };
    let g = gpu.upload_f32("g", &[k], &vec![1.0; k]).unwrap();
    let input = if norm { Input::Norm { weight: &g, eps: 1e-6 } } else { Input::Plain };
    let c = QMatvecConfig::new(gpu, dtype, &s).for_input(gpu, dtype, &s, input);
    (c.shape.wg, c.shape.tpr, c.shape.dp4, c.shape.prefetch)
}

/// Whether a one-token projection of `dtype` over rows of `k` reads x staged apart
/// ([`quantize_x16`] then [`Input::Staged`]): DP4 types on Vulkan, rows of `min_k` or more
/// ([`StageApart`]).
pub fn stages_apart(gpu: &Gpu, dtype: DType, t: usize, k: usize, min_k: usize) -> bool {
    t == 1 && k >= min_k && k.is_multiple_of(32) && gpu.tuning().int_dot() && has_dp4(dtype)
}

/// Which one-token quantized projections read x staged apart ([`stages_apart`], [`Input::Staged`]).
/// The rule ([`StageApart::rule`]): rows of 16384 or more staged by [`quantize_x16`] (Gemma-4-31B's
/// down projections, K = 21504, and full-attention o projections, K = 16384), which the matvec
/// cannot stage in workgroup memory for many rows at once; rows of 4096 or more where the norm that
/// writes x stages it in the same dispatch (Gemma-4-31B's gate_up and q/k/v, K = 5376; the norm runs
/// as a dispatch of its own only above 4096, `fuses_norm`). Measured on the H100: BENCHMARKS.md
/// session 15.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StageApart {
    /// Rows of at least this many elements, staged by a dispatch of their own.
    pub k: usize,
    /// Rows of at least this many elements, where the norm before them stages them.
    pub free_k: usize,
    /// ... for projections of at least this many output rows in all (the parts of q/k/v or gate_up).
    pub free_n: usize,
}

impl StageApart {
    /// No projection stages apart.
    pub const NEVER: StageApart = StageApart { k: usize::MAX, free_k: usize::MAX, free_n: usize::MAX };

    /// Every projection whose rows are whole 32-element blocks stages apart (tests: every path).
    pub const EVERY: StageApart = StageApart { k: 32, free_k: 32, free_n: 0 };

    /// The rule (see the type): the tuning table's [`Op::StageApart`](crate::tuning::Op) row for
    /// `gpu`, with the measurement knobs: `WGPU_LLM_XG=0` ([`Self::NEVER`]), `WGPU_LLM_XG_K`,
    /// `WGPU_LLM_XG_FREE_K` and `WGPU_LLM_XG_FREE_N` for the three fields.
    pub fn rule(gpu: &Gpu) -> StageApart {
        match gpu.tuning().stage_apart() {
            Some((k, free_k, free_n)) => StageApart { k, free_k, free_n },
            None => StageApart::NEVER,
        }
    }
}

/// Blocks of 32 elements staged per token at a time for DP4 (`KC` in wgsl/matvec_quant.wgsl):
/// the whole row (K / 32 blocks) where `tok` tokens of it fit the workgroup memory the reductions
/// leave (`red`, WG · TOK vec4, and the fused norm's, WG vec4), else balanced chunks of whole
/// 256-element super-blocks. None for types without the DP4 form, or where not even one
/// super-block a token fits.
fn dp4_chunk(gpu: &Gpu, dtype: DType, k: usize, wg: u32, tok: u32) -> Option<u32> {
    if !has_dp4(dtype) {
        return None;
    }
    // A block a token: 32 low and 32 high bytes, two 16-element sums and the scale.
    let per_block = (2 * 32 + 2 * 4 + 4) * tok as usize;
    let reductions = 16 * wg as usize * (tok as usize + 1);
    let fit = (gpu.limits.max_compute_workgroup_storage_size as usize).checked_sub(reductions)? / per_block;
    let kb = k / 32;
    if kb <= fit {
        return Some(kb as u32);
    }
    let fit = fit / 8 * 8;
    if fit == 0 {
        return None;
    }
    Some(kb.div_ceil(kb.div_ceil(fit)).next_multiple_of(8) as u32)
}

/// Whether `dtype` has the integer-dot-product form (`DP4`: quants of at most 7 bits, blocks of
/// 32 or whole 256-element super-blocks).
#[doc(hidden)]
pub fn has_dp4(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::Q6_K | DType::Affine { bits: 4, .. })
}

/// Whether one token's row of `k` elements stages whole for DP4 in workgroups of `wg` threads
/// ([`dp4_chunk`]: one chunk, the whole row).
fn stages_whole(gpu: &Gpu, dtype: DType, k: usize, wg: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, 1) == Some((k / 32) as u32)
}

/// Whether the DP4 matvec takes `dtype` at all for rows of `k` ([`dp4_chunk`]).
#[doc(hidden)]
pub fn dp4_fits(gpu: &Gpu, dtype: DType, k: usize, wg: u32, tok: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, tok).is_some()
}

/// The matvec config of a quantized expert projection tuned for `slots` slots ([`super::experts_shape`]).
fn experts_config(gpu: &Gpu, dtype: DType, s: &LinearShape, slots: usize) -> QMatvecConfig {
    let cfg = QMatvecConfig::new(gpu, dtype, &super::experts_shape(s, slots));
    assert!(cfg.shape.tok == 1);
    cfg
}

#[cfg(test)]
/// Whether [`matvec_experts_quant`] stages x for the integer dot products (`DP4`): the test
/// references meet x as [`cpu::stage_x16`] stages it there.
pub(crate) fn experts_use_dp4(gpu: &Gpu, dtype: DType, s: &LinearShape) -> bool {
    experts_config(gpu, dtype, s, s.t).shape.dp4
}

/// Whether a projection of two quantized weights over the same x (the first writing columns
/// 0 .. N₁ of y, the second the rest) runs as one mixed-type dispatch ([`matvec_quant_mixed`]) for
/// `t` tokens read as `input`: one token, plain or normalized x, two different GGUF types (not
/// the MLX affine ones), rows of at most 1536 elements, paths that go together ([`mix_config`]):
/// a Q4_K_M file's q/k (Q4_K) and Q6_K v, two dispatches otherwise, each mostly its launch and
/// latency on the H100 (Qwen2.5-1.5B, K = 1536: +3.5 %, Qwen2.5-0.5B, K = 896: +6 %, BENCHMARKS
/// runs 64-66; Qwen3.5-35B-A3B's rows of 2048 lost 1.7 %, run 71). `WGPU_LLM_MIX=0` turns it off
/// (for measuring).
pub fn mixes(gpu: &Gpu, a: &QuantWeight, b: &QuantWeight, t: usize, input: Input<'_>, opts: &LinearOpts) -> bool {
    // (A QuantWeight's type has kernels and its rows are whole blocks.)
    let gguf = |d: DType| !matches!(d, DType::Affine { .. });
    let Some(max_k) = gpu.tuning().mix_max_k() else { return false };
    let [na, k] = a.shape;
    // (A batch step's rows in the one-token form: [`matvec_quant_mixed_rows`].)
    let ok = if opts.batch { opts.one_token } else { t == 1 }
        && k <= max_k
        && opts.glu.is_none()
        && matches!(input, Input::Plain | Input::Norm { .. })
        && a.dtype != b.dtype
        && gguf(a.dtype)
        && gguf(b.dtype)
        && b.shape[1] == k;
    ok && mix_config(gpu, a.dtype, b.dtype, &LinearShape { t: 1, n: na, k, ld_out: na, cols: na }, input).is_some()
}

/// The mixed dispatch's configuration (None: the two weights do not mix): the first weight's own
/// (its rows are most of the work), and whether the second weight takes the integer dot products
/// against x staged whole in each of its workgroups (`DP4`). A first weight on its DP4 path mixes
/// with a second that has one (both DP4 in the first's workgroups); on its float path, with any
/// (`MIX_FLOAT_A`): the second takes DP4 where its type has it (the float path of a Q6_K v made
/// the 1.5B's mixed q/k/v 20.6 us, against 13.0 + 11.4 as two dispatches: BENCHMARKS run 63),
/// then in workgroups of 256 threads (the 1.5B's step 1741 us against 1756 with its 64-thread
/// workgroups, run 64). `WGPU_LLM_MIX_CFG="wg:tpr:b_dp4:a_dp4"` sets it for measuring.
fn mix_config(gpu: &Gpu, a: DType, b: DType, s: &LinearShape, input: Input<'_>) -> Option<(QMatvecConfig, bool)> {
    let cfg = QMatvecConfig::new(gpu, a, &super::tuned_shape(s, &LinearOpts::default())).for_input(gpu, a, s, input);
    let int_dot = gpu.tuning().int_dot();
    let dp4 = |t: DType, wg: u32| has_dp4(t) && int_dot && stages_whole(gpu, t, s.k, wg);
    if let Some([wg, tpr, bd, ad]) = gpu.tuning().knobs.mix_cfg {
        // (row groups of whole subgroups, whole row groups a workgroup)
        let tpr = tpr.max(cfg.shape.tpr.min(gpu.caps.subgroup_max_size.max(8))).next_power_of_two();
        let wg = wg.max(tpr).next_multiple_of(tpr);
        let b_dp4 = bd == 1 && dp4(b, wg);
        let a_dp4 = ad == 1 && b_dp4 && dp4(a, wg);
        return Some((cfg.with(|s| (s.wg, s.tpr, s.dp4, s.prefetch) = (wg, tpr, a_dp4, false)), b_dp4));
    }
    if cfg.shape.dp4 {
        // (a whole row staged: no chunks, no prefetch, one token)
        let whole = cfg.shape.tok == 1 && !cfg.shape.prefetch && dp4(a, cfg.shape.wg);
        return (whole && dp4(b, cfg.shape.wg)).then_some((cfg, true));
    }
    let wg = gpu.tuning().mix_float_wg();
    if !dp4(b, wg) || !wg.is_multiple_of(cfg.shape.tpr) {
        return Some((cfg, dp4(b, cfg.shape.wg)));
    }
    Some((cfg.with(|s| s.wg = wg), true))
}

/// What `benches/quant.rs` times beside [`super::linear`]: the quantized kernels with their
/// configuration given rather than chosen (re-exported by [`crate::ops::matmul::bench`]).
#[doc(hidden)]
pub mod bench {
    pub use super::batch::{batch_rows, matvec_quant_batch};
    pub use super::matmul::{matmul_quant, matmul_quant_coop};
    pub use super::matvec::matvec_quant;
    pub use super::{dp4_fits, has_dp4, QMatvecConfig};
}
