//! Linear layers over GGUF quantized weights, read directly by the kernels: `y (+)= x · Wᵀ (+ bias)`
//! with W `[N, K]` in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K ([`QuantWeight`]), x f32
//! `[T, K]`, y f32 `[T, N]` (row stride `ld_out`, as [`super::linear`]), bias f32 `[N]`; the
//! weights are dequantized in registers (matvec) or into workgroup memory (matmul), and every sum
//! is f32. No f16 copy of the weight exists.
//!
//! [`linear_quant`] picks the kernel as [`super::linear`] does:
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
//! `gguf/`: [`linear`] (the dispatch: [`linear_quant`]), [`matvec`] (one-token and routed matvecs,
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
#[cfg(test)]
mod timing;

pub use super::staged_x_words;
/// The quantized weights' storage, from [`crate::weights`] (kept at their former path).
pub use crate::weights::{is_supported, repack, unpack, unpermute_rope_rows_raw, QuantWeight};
pub(crate) use linear::matvec_experts_quant;
pub use linear::{linear_quant, linear_quant_in};
pub use matvec::{matvec_quant_mixed, quantize_x16};

use super::{common_macros, glu_macros, Input, LinearOpts, LinearShape, MATVEC_WG};
use crate::dtype::DType;
use crate::gpu::{Gpu, Macros};
use crate::weights::{type_macros, unit_elems};

/// How matvec_quant runs for one shape on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct QMatvecConfig {
    /// Threads per workgroup.
    wg: u32,
    /// Threads per row group of 4 rows (a power of two dividing the workgroup).
    tpr: u32,
    /// Tokens per pass over W: 1 or 4.
    tok: u32,
    /// Reduce with subgroup operations.
    subgroups: bool,
    /// Stage x as 16-bit fixed point and sum with integer dot products (`DP4` in
    /// wgsl/matvec_quant.wgsl): Q4_0 / Q4_1 / Q4_K / Q6_K where the backend has the instructions;
    /// one token a pass with the whole row staged, or (Q6_K) passes of 4 tokens, staged in chunks
    /// where they do not fit workgroup memory ([`dp4_chunk`]).
    dp4: bool,
    /// With `dp4`, one token, the row staged whole: each unit's loads issued one iteration
    /// early (`PREFETCH`).
    prefetch: bool,
    /// Measurement probes (tests only): PROBE_NOX, PROBE_NOMATH.
    #[cfg(test)]
    probe: &'static str,
    /// At most this many blocks staged a chunk (tests only; 0: as many as fit).
    #[cfg(test)]
    max_kc: u32,
}

impl QMatvecConfig {
    fn new(gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let units = (s.k / unit_elems(dtype)) as u32;
        let sg_max = gpu.caps.subgroup_max_size.max(1).next_power_of_two();
        let subgroups = gpu.caps.subgroups && sg_max <= MATVEC_WG;
        let tok = if s.t >= 2 { 4 } else { 1 };
        // As the f16 matvec: every output of a pass (4 rows × tok tokens) has a storing lane, the
        // reduction without subgroups folds 8 lanes first, a row group covers whole subgroups.
        let min_tpr = (4 * tok).max(8).max(if subgroups { sg_max } else { 1 });
        // About 256k lanes (a full H100's worth of resident threads), each on units of 4 rows;
        // never wider than a row's units (rounded up to a power of two), nor than the workgroup.
        // Measured on the H100 (`bench_quant`, every type): K = 1536 (48 units) wants 64 lanes
        // per row group at N = 2048 and 17920 (5-10% over 32), 32 at N = 151936 (10-40% over
        // 64); K = 8960 (280 units) at N = 1536 wants 256. Software-pipelined loads (the next
        // unit's issued before this one's math) were 5-40% slower everywhere (registers), but
        // for the wide DP4 rows below (`prefetch`).
        let groups = s.n.div_ceil(4) as u32;
        let want = 262144u32.div_ceil(groups).next_power_of_two();
        let widest = units.next_power_of_two().min(MATVEC_WG).max(min_tpr);
        let mut tpr = want.clamp(min_tpr.max(16).min(widest), widest);
        // Gemma-4-31B's shapes on the H100 (`bench_quant` with QSHAPES): rows of 4096 to 8192
        // elements over 4096 rows or more run best as 32-lane row groups with the integer dot
        // products (N = 5376, K = 8192: Q4_K 17.5 us against 20.7 at 256 lanes, Q6_K 23.4 against
        // 30.0; N = 16384, K = 5376: 29.9 / 43.6 against 34.7 / 56.5 at 64 lanes); Q6_K rows of
        // 16384 or more want 64 lanes (N = 5376, K = 21504: 71.5 us against 88.4 at 256).
        let dp4_ok = dp4_fits(gpu, dtype, s.k, MATVEC_WG, 1) && gpu.info.backend == wgpu::Backend::Vulkan;
        // (measured with 256-thread workgroups: 32 rows each, which the staging pays off on).
        let wide_rows = tok == 1 && dp4_ok && (4096..=8192).contains(&s.k) && s.n >= 4096;
        if wide_rows {
            tpr = min_tpr.max(32);
        } else if tok == 1 && dtype == DType::Q6_K && s.k >= 16384 {
            tpr = tpr.min(64).max(min_tpr);
        }
        // Few rows (a v or o projection): smaller workgroups, so that more of them spread over
        // the GPU (N = 256, 32 lanes a row group: 8 workgroups of 256 threads, or 64 of 32),
        // down to one row group, or 32 threads, a workgroup.
        let mut wg = MATVEC_WG;
        while !wide_rows && wg / 2 >= tpr.max(32) && (s.n as u32).div_ceil(4 * wg / tpr) < 512 {
            wg /= 2;
        }
        // Integer dot products where the backend compiles them to instructions: Vulkan (SPIR-V
        // 1.6's OpSDot/OpUDot; naga writes a bit-field polyfill where the device lacks them),
        // not Metal or GL, where naga always writes the polyfill (slower than the float path).
        // The staging (K elements a workgroup) pays off from 16 rows a workgroup on (measured on
        // the H100: 1.2-1.8x at 32 rows, 1.15-1.3x at 16, slower at 4).
        // Passes of 4 tokens (a short prompt; batch steps run matvec_quant_batch) stage 4 rows
        // of x a pass: worth it for Q6_K only (H100, `bench_quant_batch`, N = 17920, K = 1536 at
        // 32 tokens: Q6_K 279 us against 457 float, Q4_K 380 against 324).
        // One token a pass: only rows that stage whole (chunked one-token DP4 ran at half the
        // float kernel's speed on Gemma 4's K = 21504 rows: `bench_quant`, W cold).
        let whole = |wg: u32| stages_whole(gpu, dtype, s.k, wg);
        let dp4 = 4 * wg / tpr >= 16
            && (if tok == 1 { whole(wg) } else { dtype == DType::Q6_K && dp4_fits(gpu, dtype, s.k, wg, tok) })
            && gpu.info.backend == wgpu::Backend::Vulkan;
        // One-token Q6_K and Q4_1 rows that stage whole: DP4 in 128-thread workgroups of 32-lane
        // row groups whatever N (the float Q6_K path costs 2-3x its isolated time inside a step;
        // H100, a Qwen2.5-1.5B Q4_K_M step: v (N = 256) 20.7 -> 14.7 us, down (K = 8960) 28.1 ->
        // 23.1, the step 2177 -> 1969 us; SmolLM2-135M Q4_1: the step 1100 -> 945 us). Not Q4_K
        // (the 1.5B step 1960 -> 2013 us, the 0.5B 1373 -> 1418: BENCHMARKS run 22). Rows that
        // would stage in chunks stay float (Gemma 4's K = 21504 down projections: chunked DP4 ran
        // at half the float kernel's speed).
        // (Both rules: 128 threads of 32-lane row groups, 16 rows a workgroup, where a row group
        // of 32 lanes covers whole subgroups.)
        let narrow = min_tpr <= 32;
        let q6_whole = tok == 1
            && narrow
            && matches!(dtype, DType::Q6_K | DType::Q4_1)
            && gpu.info.backend == wgpu::Backend::Vulkan
            && whole(128);
        let dp4 = dp4 || q6_whole;
        // A vocabulary's rows (lm_head) with DP4 likewise (Gemma-4-31B's Q6_K lm_head, N = 262144,
        // K = 5376: 593 us with 256 threads against 519 in the step; Qwen2.5's, N = 151936,
        // K = 1536: 159 -> 100 us).
        let vocab = dp4 && tok == 1 && narrow && s.n >= 131072 && whole(128);
        let (mut wg, mut tpr) = if q6_whole || vocab { (128, 32) } else { (wg, tpr) };
        // Of those, rows of 48 units or more, longer than they are many (the down projections; not a
        // v projection's 24-unit rows) take 256 threads, with
        // 128-lane row groups where that keeps to 128 workgroups, else 64-lane (H100, inside the
        // step, `WGPU_LLM_QMV`: Qwen2.5-1.5B's Q6_K down, N = 1536, K = 8960, 64 lanes: the step
        // 1946 -> 1905 us, 128 lanes 1936; the 0.5B's, N = 896, K = 4864, 128 lanes: 1369 ->
        // 1329, 64 lanes 1347; SmolLM2's Q4_1 down, N = 576, K = 1536, 64 lanes: 945 -> 928).
        if q6_whole && !vocab && s.k > s.n && units >= 48 && whole(256) {
            wg = 256;
            tpr = if s.n.div_ceil(8) <= 128 { 128 } else { 64 }.min(widest).max(min_tpr);
        }
        // Q6_K rows of 128 units (8192 elements) or more that stage whole in 512 threads: 128-lane
        // row groups, 16 rows a workgroup (the 1.5B's down, K = 8960: the step 1683 -> 1671 us
        // against 256 threads of 64 lanes, BENCHMARKS run 67).
        let w512 = gpu.limits.max_compute_invocations_per_workgroup >= 512 && whole(512);
        if q6_whole && !vocab && dtype == DType::Q6_K && s.k > s.n && units >= 128 && w512 {
            (wg, tpr) = (512, 128.min(widest).max(min_tpr));
        }
        // And a v projection's few short rows (N <= 256, under 48 units) in 256-thread workgroups of
        // 32-lane row groups:
        // fewer, wider workgroups (Qwen2.5-1.5B's Q6_K v, 256 x 1536, 8 workgroups: the step 1889 ->
        // 1846 us against 16 workgroups of 128 threads, 1877 with 64-lane row groups; the 0.5B's
        // 128 x 896 the same).
        if q6_whole && !vocab && s.n <= 256 && units < 48 && whole(256) {
            (wg, tpr) = (256, 32);
        }
        // Q4_K rows of at most 1536 elements (48 units) over many rows, integer dot products (the
        // gate_up projections): 128 threads of 32-lane row groups (Qwen2.5-1.5B's 17920 x 1536:
        // the step 1946 -> 1931 us against 256 threads of 64 lanes; the 0.5B's 9728 x 896 the same).
        if dp4 && tok == 1 && dtype == DType::Q4_K && s.k <= 1536 && s.n >= 8192 && narrow && whole(128) {
            (wg, tpr) = (128, 32);
        }
        // Q4_K rows of 4096-8192 elements over 12288 rows or more (Gemma-4-31B's gate_up and qkv)
        // in 1024-thread workgroups where the device takes them and the row stages whole there:
        // x staged once for 128 rows instead of 32 (H100, BENCHMARKS run 40, the step 14979 ->
        // 14764 us: gate_up 78.6 -> 75.6 us, qkv 32.4 -> 29.7 and 37.9 -> 34.4; 512 threads: no
        // gain).
        let wide = gpu.limits.max_compute_invocations_per_workgroup >= 1024 && whole(1024);
        if wide_rows && dp4 && !vocab && dtype == DType::Q4_K && s.n >= 12288 && wide {
            (wg, tpr) = (1024, 32);
        }
        // Those rows of 4096-8192 elements over 4096 or more (Gemma-4-31B's gate_up, qkv, o and
        // lm_head) with each unit's loads issued an iteration early: the step 14848 -> 14728,
        // 14774 -> 14678 and 14766 -> 14662 us in three calls (H100, BENCHMARKS session 14); the
        // other shapes keep the plain loop (see above: slower on Qwen2.5's).
        let prefetch = wide_rows && dp4;
        QMatvecConfig {
            wg,
            tpr,
            tok,
            subgroups,
            dp4,
            prefetch,
            #[cfg(test)]
            probe: "",
            #[cfg(test)]
            max_kc: 0,
        }
        .knob(gpu, dtype, s)
    }

    /// A benchmark knob: WGPU_LLM_QMV="TYPE:N:K:wg:tpr:dp4,..." (TYPE as `Q4_K`, or `any`) sets
    /// one-token configurations by type and shape, for measuring them inside a step. Applied
    /// last, over every rule (a shape it names takes its configuration, the others their rules).
    /// WGPU_LLM_QMV_PF=0 / 1 turns `prefetch` off / on wherever a row stages whole.
    fn knob(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let pf = std::env::var("WGPU_LLM_QMV_PF").ok();
        let mut cfg = match pf.as_deref() {
            Some("0") => QMatvecConfig { prefetch: false, ..self },
            Some("1") => QMatvecConfig { prefetch: self.dp4 && self.tok == 1, ..self },
            _ => self,
        };
        let Ok(v) = std::env::var("WGPU_LLM_QMV") else { return cfg };
        if cfg.tok != 1 {
            return cfg;
        }
        for e in v.split(',') {
            let ty = e.split(':').next().unwrap_or_default();
            let f: Vec<usize> = e.split(':').skip(1).filter_map(|x| x.parse().ok()).collect();
            let ty_ok = ty == "any" || ty == format!("{dtype:?}");
            if let [n, k, w, t, d] = f[..] {
                if ty_ok && n == s.n && k == s.k && (d == 0 || stages_whole(gpu, dtype, s.k, w as u32)) {
                    let dp4 = d == 1 && gpu.info.backend == wgpu::Backend::Vulkan;
                    let prefetch = dp4 && pf.as_deref() == Some("1");
                    cfg = QMatvecConfig { wg: w as u32, tpr: t as u32, dp4, prefetch, ..cfg };
                }
            }
        }
        cfg
    }
}

impl QMatvecConfig {
    /// The macros of wgsl/matvec_quant.wgsl every dispatch of this configuration sets: the fused
    /// input, the epilogue, W's type, where the norm weight binds, the workgroup shape and tokens a
    /// pass (`SUBGROUP` cleared where the configuration reduces without subgroups).
    fn macros(&self, gpu: &Gpu, dtype: DType, input: Input<'_>, bias: bool, opts: &LinearOpts) -> Macros {
        let mut m = type_macros(glu_macros(input.macros(common_macros(gpu, bias, opts)), opts.glu), dtype)
            .set("GB", if bias { 6 } else { 5 })
            .set("WG", self.wg)
            .set("TPR", self.tpr)
            .set("TOK", self.tok)
            .flag_if("TOK4", self.tok == 4);
        if !self.subgroups {
            m.0.remove("SUBGROUP");
        }
        m
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
        let plain = matches!(input, Input::Plain);
        let norm = matches!(input, Input::Norm { .. });
        let vulkan = gpu.info.backend == wgpu::Backend::Vulkan;
        let narrow = !self.subgroups || gpu.caps.subgroup_max_size <= 32;
        let q4k_short = vulkan && narrow && self.tok == 1 && !self.dp4 && dtype == DType::Q4_K && s.n <= 4096;
        if q4k_short && s.k == 1536 && (plain || norm) && stages_whole(gpu, dtype, s.k, 256) {
            return QMatvecConfig { wg: 256, tpr: 64, dp4: true, prefetch: false, ..self }.knob(gpu, dtype, s);
        }
        if q4k_short && plain && s.k <= 1536 && stages_whole(gpu, dtype, s.k, 128) {
            return QMatvecConfig { wg: 128, tpr: 32, dp4: true, prefetch: false, ..self }.knob(gpu, dtype, s);
        }
        self
    }
}

impl QMatvecConfig {
    /// The configuration for x staged apart ([`Input::Staged`], one token): DP4 without the
    /// kernel's own staging, so any workgroup size: row groups of about 2 units a lane (32 to 128
    /// lanes) in workgroups of one row group, at least 64 threads (`WGPU_LLM_XG_CFG="wg:tpr:prefetch"`
    /// sets it for measurement).
    fn staged(self, gpu: &Gpu, dtype: DType, s: &LinearShape) -> Self {
        let sg = if self.subgroups { gpu.caps.subgroup_max_size.max(1).next_power_of_two() } else { 1 };
        // About 2-4 units a lane, 32 to 128 lanes. H100, `bench_quant` (W cold, the staging apart
        // not counted), Gemma-4-31B's rows of 16384 and 21504 over 5376: Q4_K (32-element units)
        // 26.5 / 35.9 us at 128 lanes (30.0 / 39.0 at 64, 41.3 / 53.5 at 32; the kernel staging in
        // workgroup memory: 38.3 / 48.3), Q6_K (64-element units) 35.5 / 45.9 at 64 lanes (34.9 /
        // 44.2 at 32; before: 48.9 / 64.5).
        let units = (s.k / unit_elems(dtype)) as u32;
        let tpr = (1u32 << (units / 2).max(1).ilog2()).clamp(32, 128);
        let wg = tpr.max(64);
        let (mut wg, mut tpr, mut prefetch) = (wg.max(sg), tpr.max(sg), false);
        if let Ok(v) = std::env::var("WGPU_LLM_XG_CFG") {
            let f: Vec<u32> = v.split(':').filter_map(|x| x.parse().ok()).collect();
            if let [w, t, pf] = f[..] {
                let t = t.max(sg);
                (wg, tpr, prefetch) = (w.max(t), t, pf == 1);
            }
        }
        QMatvecConfig { wg, tpr, dp4: true, prefetch, ..self }
    }
}

/// Whether a one-token projection of `dtype` over rows of `k` reads x staged apart
/// ([`quantize_x16`] then [`Input::Staged`]): DP4 types on Vulkan, rows of `min_k` or more
/// ([`StageApart`]).
pub fn stages_apart(gpu: &Gpu, dtype: DType, t: usize, k: usize, min_k: usize) -> bool {
    t == 1 && k >= min_k && k % 32 == 0 && gpu.info.backend == wgpu::Backend::Vulkan && has_dp4(dtype)
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

    /// The rule (see the type), with the measurement knobs: `WGPU_LLM_XG=0` ([`Self::NEVER`]),
    /// `WGPU_LLM_XG_K`, `WGPU_LLM_XG_FREE_K` and `WGPU_LLM_XG_FREE_N` for the three fields.
    pub fn rule() -> StageApart {
        let knob =
            |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        if std::env::var("WGPU_LLM_XG").is_ok_and(|v| v == "0") {
            return StageApart::NEVER;
        }
        StageApart {
            k: knob("WGPU_LLM_XG_K", 16384),
            free_k: knob("WGPU_LLM_XG_FREE_K", 4096),
            free_n: knob("WGPU_LLM_XG_FREE_N", 0),
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
fn has_dp4(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q4_1 | DType::Q4_K | DType::Q6_K | DType::Affine { bits: 4, .. })
}

/// Whether one token's row of `k` elements stages whole for DP4 in workgroups of `wg` threads
/// ([`dp4_chunk`]: one chunk, the whole row).
fn stages_whole(gpu: &Gpu, dtype: DType, k: usize, wg: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, 1) == Some((k / 32) as u32)
}

/// Whether the DP4 matvec takes `dtype` at all for rows of `k` ([`dp4_chunk`]).
fn dp4_fits(gpu: &Gpu, dtype: DType, k: usize, wg: u32, tok: u32) -> bool {
    dp4_chunk(gpu, dtype, k, wg, tok).is_some()
}

/// The matvec config of a quantized expert projection ([`super::experts_shape`]).
fn experts_config(gpu: &Gpu, dtype: DType, s: &LinearShape) -> QMatvecConfig {
    let cfg = QMatvecConfig::new(gpu, dtype, &super::experts_shape(s));
    assert!(cfg.tok == 1);
    cfg
}

#[cfg(test)]
/// Whether [`matvec_experts_quant`] stages x for the integer dot products (`DP4`): the test
/// references meet x as [`cpu::stage_x16`] stages it there.
pub(crate) fn experts_use_dp4(gpu: &Gpu, dtype: DType, s: &LinearShape) -> bool {
    experts_config(gpu, dtype, s).dp4
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
    if std::env::var("WGPU_LLM_MIX").is_ok_and(|v| v == "0") {
        return false;
    }
    let [na, k] = a.shape;
    let ok = t == 1
        && k <= 1536
        && !opts.batch
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
    let vulkan = gpu.info.backend == wgpu::Backend::Vulkan;
    let dp4 = |t: DType, wg: u32| has_dp4(t) && vulkan && stages_whole(gpu, t, s.k, wg);
    if let Ok(v) = std::env::var("WGPU_LLM_MIX_CFG") {
        let f: Vec<u32> = v.split(':').filter_map(|x| x.parse().ok()).collect();
        if let [wg, tpr, bd, ad] = f[..] {
            // (row groups of whole subgroups, whole row groups a workgroup)
            let tpr = tpr.max(cfg.tpr.min(gpu.caps.subgroup_max_size.max(8))).next_power_of_two();
            let wg = wg.max(tpr).next_multiple_of(tpr);
            let b_dp4 = bd == 1 && dp4(b, wg);
            let a_dp4 = ad == 1 && b_dp4 && dp4(a, wg);
            return Some((QMatvecConfig { wg, tpr, dp4: a_dp4, prefetch: false, ..cfg }, b_dp4));
        }
    }
    if cfg.dp4 {
        // (a whole row staged: no chunks, no prefetch, one token)
        let whole = cfg.tok == 1 && !cfg.prefetch && dp4(a, cfg.wg);
        return (whole && dp4(b, cfg.wg)).then_some((cfg, true));
    }
    if !dp4(b, 256) || 256 % cfg.tpr != 0 {
        return Some((cfg, dp4(b, cfg.wg)));
    }
    Some((QMatvecConfig { wg: 256, ..cfg }, true))
}
