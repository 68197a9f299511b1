//! Gated DeltaNet, the linear attention of Qwen3.5 / Qwen3-Next (transformers'
//! `Qwen3_5MoeGatedDeltaNet`): the causal depthwise conv over [q | k | v] (`wgsl/causal_conv1d.wgsl`),
//! the gated delta rule (`wgsl/gated_delta_rule.wgsl`) and the gated RMSNorm after it
//! (`wgsl/rms_norm_gated.wgsl`).
//!
//! Both keep a recurrent state between passes in a ring of R states per sequence slot (the state
//! buffers hold `slots · R` states, slot s's ring at `s · R`): the state after position p lives in
//! ring state `p % R`; a pass at `step.pos` of `step.n_tokens` tokens in slot `step.slot` reads
//! `pos % R` (zeros when `pos == 0`, so a new sequence needs no reset) and writes `(pos + n) % R`.
//! A rollback to any of the last passes' ends whose state no later pass reused finds it intact
//! (the model keeps that bookkeeping: `model::forward::STATE_RING`).
//!
//! A decode step of many sequences (`seqs`, u32 `[T, 2]`: row t is the sequence in slot
//! `seqs[t].1` at position `seqs[t].0`; the `BATCH` flag of both kernels, the recurrent form of
//! the delta rule) runs each row as a one-token pass of its own sequence on grid z: the same
//! arithmetic on its own slot's state, so a row's numbers are those of that sequence decoded alone,
//! whatever the batch.
//!
//! The delta rule has two kernels over the same state ring, grid and work split. A head's state
//! is split over Dv / CB workgroups of CB columns, each column's rows over RG threads that keep
//! them in registers through the pass (the state is read and written once per pass): at
//! Qwen3.5-35B-A3B's shapes (32 heads of 128 x 128) a decode step runs 128 workgroups of 256
//! threads, not 32 (measured on the H100: 33 us a layer with a workgroup per head).
//! - Decode (a pass recorded for one token) runs the recurrence (`wgsl/gated_delta_rule.wgsl`),
//!   token by token.
//! - Prefill (recorded for more) runs the chunked form (`wgsl/gated_delta_rule_chunked.wgsl`,
//!   transformers' `torch_chunk_gated_delta_rule`): per chunk of C tokens (8 at Qwen3.5's heads)
//!   the C x C products of the chunk's q and k, a forward substitution for the deltas and one
//!   update of the state, instead of C updates each with its reductions; about 6 barriers per
//!   chunk instead of 12 per token. `delta_form` says which runs where; the recurrent kernel
//!   stays the fallback where no chunk fits the device's workgroup memory.
//!
//! The CPU twin [`cpu::gated_delta_rule`] is the recurrent definition; both kernels are tested
//! against it.

use crate::error::{Error, Result};
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Macros, Tensor};

/// Gated DeltaNet linear attention (Qwen3.5 / Qwen3-Next `linear_attention` layers): a causal
/// depthwise conv over [q | k | v], then the gated delta rule with a per-head recurrent state,
/// a gated RMSNorm and out_proj.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNetSpec {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// Taps of the causal conv (`linear_conv_kernel_dim`).
    pub conv_kernel: usize,
    /// Value head `h` reads key head `h % k_heads` (llama.cpp's GGUF order of the value heads,
    /// tiled over the key heads) instead of `h / (v_heads / k_heads)` (transformers'
    /// `repeat_interleave`).
    pub kv_tiled: bool,
}

impl DeltaNetSpec {
    /// Channels of the conv: [q | k | v].
    pub fn conv_dim(&self) -> usize {
        2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
    }
    /// The key head value head `h` reads.
    pub fn k_head(&self, h: usize) -> usize {
        if self.kv_tiled {
            h % self.k_heads
        } else {
            h / (self.v_heads / self.k_heads)
        }
    }
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }
    /// Columns of the fused input projection: [qkv | z | b | a].
    pub fn in_dim(&self) -> usize {
        self.conv_dim() + self.value_dim() + 2 * self.v_heads
    }
}

/// Most taps of the causal conv (the kernel keeps the window in registers).
pub const MAX_CONV_TAPS: usize = 8;
/// Largest head dims of the delta rule (a thread keeps a Dk-column of the state in registers; a
/// workgroup has at most 256 threads, one per value dim).
pub const MAX_HEAD_DIM: usize = 256;

fn f32_check(what: &str, t: &Tensor, need: usize) -> Result<()> {
    if t.ty != ElemType::F32 || t.numel() < need {
        return Err(Error::InvalidArgument(format!(
            "deltanet: {what} must be f32 with at least {need} elements, is {:?} {:?}",
            t.ty, t.shape
        )));
    }
    Ok(())
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/causal_conv1d.wgsl`.
    pub(crate) struct CausalConv1dUniform = "Params" {
        channels: u32,
        ld_x: u32,
        n_rows: u32,
        ring: u32,
    }
}

/// Records the causal conv (+ SiLU) over the first `C = weight.shape[0]` columns of the rows
/// `t < step.n_tokens` of `x` (f32 `(T, ld_x)`, T = `n_tokens`), taps `weight` f32 `(C, K)`, the
/// state rings f32 `(slots · R, K-1, C)`, into `out` f32 `(T, C)`. `step`: the
/// [`StepParams`](super::StepParams) uniform. With `seqs` (u32 `[T, 2]`, (position, slot) per
/// row) each row is a sequence of its own (a batch decode step: module docs).
#[allow(clippy::too_many_arguments)]
pub fn causal_conv1d(
    gpu: &Gpu,
    x: &Tensor,
    ld_x: usize,
    weight: &Tensor,
    state: &Tensor,
    out: &Tensor,
    step: &wgpu::Buffer,
    seqs: Option<&Tensor>,
    n_tokens: usize,
    ring: usize,
) -> Result<Kernel> {
    let (c, k) = match weight.shape.as_slice() {
        [c, k] => (*c, *k),
        s => return Err(Error::InvalidArgument(format!("causal_conv1d: weight must be (C, K), is {s:?}"))),
    };
    if !(2..=MAX_CONV_TAPS).contains(&k) || ring < 2 || ld_x < c || n_tokens == 0 {
        return Err(Error::InvalidArgument(format!(
            "causal_conv1d: K = {k} (2..={MAX_CONV_TAPS}), ring {ring} (>= 2), ld_x {ld_x} (>= C = {c}), T {n_tokens}"
        )));
    }
    f32_check("x", x, (n_tokens - 1) * ld_x + c)?;
    f32_check("weight", weight, c * k)?;
    f32_check("state", state, ring * (k - 1) * c)?;
    f32_check("out", out, n_tokens * c)?;
    // (A batch step's slots index rings past the first: the model sizes the state for its slots.)
    let params = gpu.uniform(
        "causal_conv1d.params",
        &CausalConv1dUniform { channels: c as u32, ld_x: ld_x as u32, n_rows: n_tokens as u32, ring: ring as u32 },
    );
    let wg = 64;
    let mut bindings = vec![
        x.binding(),
        weight.binding(),
        state.binding(),
        out.binding(),
        step.as_entire_binding(),
        params.as_entire_binding(),
    ];
    let (macros, rows) = batch_rows(gpu.macros().set("K", k).set("WG", wg), seqs, n_tokens, &mut bindings)?;
    let [gx, gy, _] = grid(c.div_ceil(wg) as u32);
    gpu.kernel("causal_conv1d", "main", &macros, &bindings, [gx, gy, rows])
}

/// A batch step's `seqs` (u32 `[T, 2]`) bound after `bindings` under the `BATCH` flag (the include
/// `step`'s `SEQS` binding): the macros and the grid's z (a row each); else `macros` and 1.
fn batch_rows<'a>(
    macros: Macros,
    seqs: Option<&'a Tensor>,
    n_tokens: usize,
    bindings: &mut Vec<wgpu::BindingResource<'a>>,
) -> Result<(Macros, u32)> {
    let Some(seqs) = seqs else { return Ok((macros, 1)) };
    if seqs.ty != ElemType::U32 || seqs.numel() < 2 * n_tokens {
        return Err(Error::InvalidArgument(format!(
            "deltanet: seqs must be u32 [{n_tokens}, 2], is {:?} {:?}",
            seqs.ty, seqs.shape
        )));
    }
    let macros = macros.flag("BATCH").set("SEQS", bindings.len());
    bindings.push(seqs.binding());
    Ok((macros, n_tokens as u32))
}

/// The buffers of one [`gated_delta_rule`] dispatch.
pub struct DeltaRuleArgs<'a> {
    pub spec: DeltaNetSpec,
    /// The conv's output, f32 `(T, 2 Hk Dk + Hv Dv)`: [q | k | v].
    pub qkv: &'a Tensor,
    /// The input projection's output, f32 `(T, ld_mix)`, holding b `(Hv)` and a `(Hv)` from the
    /// given columns.
    pub mix: &'a Tensor,
    pub ld_mix: usize,
    pub b_col: usize,
    pub a_col: usize,
    /// f32 `(Hv)` each.
    pub a_log: &'a Tensor,
    pub dt_bias: &'a Tensor,
    /// The state rings, f32 `(slots · R, Hv, Dk, Dv)`.
    pub state: &'a Tensor,
    /// o, before the gated norm: f32 `(T, Hv Dv)`.
    pub out: &'a Tensor,
    pub step: &'a wgpu::Buffer,
    /// A batch decode step's (position, slot) per row, u32 `[T, 2]` (module docs); `None`: one
    /// sequence, in slot `step.slot`.
    pub seqs: Option<&'a Tensor>,
    pub n_tokens: usize,
    pub ring: usize,
}

/// The (columns per workgroup, row groups) of the delta rule for head dims (Dk, Dv): CB the
/// largest power of two up to 32 that divides Dv, RG filling 256 threads (at most Dk rounded up).
/// Both kernels use it.
fn delta_tiling(dk: usize, dv: usize) -> (usize, usize) {
    let cb = (0..=5).rev().map(|e| 1usize << e).find(|c| dv.is_multiple_of(*c)).unwrap_or(1);
    let rg = (256 / cb).min(dk.next_power_of_two());
    (cb, rg)
}

/// Workgroup memory of the chunked kernel in bytes, chunk `c` (the sum in the header of
/// `wgsl/gated_delta_rule_chunked.wgsl`).
fn chunk_bytes(c: usize, dk: usize, (cb, rg): (usize, usize)) -> usize {
    4 * (2 * c * (dk + 1) + 5 * c + 2 * c * c + 2 * c * cb * rg + 2 * c * cb)
}

/// Tokens per chunk of the chunked kernel for head dims (Dk, Dv) within `budget` bytes of
/// workgroup memory: the largest of 16, 8, 4 that fits (8 at Qwen3.5's 128 x 128 heads, 26.7 KiB;
/// 4 at 256 x 256, 17.2 KiB); `None` where none does (the recurrent kernel then runs prefill too).
fn delta_chunk(dk: usize, dv: usize, budget: usize) -> Option<usize> {
    let tiling = delta_tiling(dk, dv);
    [16, 8, 4].into_iter().find(|&c| chunk_bytes(c, dk, tiling) <= budget)
}

/// Which kernel records a pass of the delta rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeltaForm {
    /// `wgsl/gated_delta_rule.wgsl`: the recurrence token by token.
    Recurrent,
    /// `wgsl/gated_delta_rule_chunked.wgsl` with chunks of this many tokens.
    Chunked(usize),
}

/// The form for a pass recorded for `n_tokens`: chunked for prefill (more than one token),
/// recurrent for a decode step. The recurrent kernel spends about 12 barriers on every token (its
/// q / k norms are a tree reduction), the chunked one 6 on every chunk of up to C tokens plus a
/// C x C Gram matrix of Dk-long dot products, so it is expected to win from 2 tokens on (measured
/// at 512-token passes only: Qwen3.5-35B-A3B's prefill 2,762 -> 3,005 tok/s on the H100,
/// BENCHMARKS.md run 36). A decode step keeps the recurrent kernel: for one
/// token the chunked one would stage and multiply a mostly empty chunk (its Gram dot products
/// serial in a thread each, where the recurrent kernel reduces the norms over the workgroup).
/// Budget: min(32 KiB, the device's limit); where no chunk fits, recurrent.
fn delta_form(gpu: &Gpu, dk: usize, dv: usize, n_tokens: usize) -> DeltaForm {
    let budget = (gpu.limits.max_compute_workgroup_storage_size as usize).min(32 << 10);
    match delta_chunk(dk, dv, budget) {
        Some(c) if n_tokens > 1 => DeltaForm::Chunked(c),
        _ => DeltaForm::Recurrent,
    }
}

/// Records the gated delta rule over the rows `t < step.n_tokens`: o into `out` (the gated norm
/// is [`rms_norm_gated`]). A pass recorded for one token (decode) runs the recurrent kernel, a
/// longer one the chunked kernel (`delta_form`); both read and write the same state ring. A batch
/// step (`a.seqs`) runs the recurrent kernel, a one-token pass per row.
pub fn gated_delta_rule(gpu: &Gpu, a: &DeltaRuleArgs<'_>) -> Result<Kernel> {
    let d = &a.spec;
    let form = if a.seqs.is_some() { DeltaForm::Recurrent } else { delta_form(gpu, d.k_dim, d.v_dim, a.n_tokens) };
    record_delta(gpu, a, form)
}

/// The shader and macros of `form` for heads `d` (on top of the device's `base` macros).
fn delta_shader(base: Macros, d: &DeltaNetSpec, form: DeltaForm) -> (&'static str, Macros) {
    let (dk, dv) = (d.k_dim, d.v_dim);
    let (cb, rg) = delta_tiling(dk, dv);
    let macros = base.set("DK", dk).set("DV", dv).set("CB", cb).set("RG", rg).set("ROWS", dk.div_ceil(rg));
    let macros = macros.flag_if("KV_TILED", d.kv_tiled);
    match form {
        DeltaForm::Recurrent => ("gated_delta_rule", macros),
        DeltaForm::Chunked(c) => ("gated_delta_rule_chunked", macros.set("C", c)),
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/include/gated_delta_rule_io.wgsl` (gated_delta_rule, gated_delta_rule_chunked).
    pub(crate) struct GatedDeltaRuleUniform = "Params" {
        k_heads: u32,
        v_heads: u32,
        ld_qkv: u32,
        ld_mix: u32,
        b_col: u32,
        a_col: u32,
        n_rows: u32,
        ring: u32,
    }
}

fn record_delta(gpu: &Gpu, a: &DeltaRuleArgs<'_>, form: DeltaForm) -> Result<Kernel> {
    let d = &a.spec;
    let (hk, hv, dk, dv, t) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim, a.n_tokens);
    if hk == 0 || hv % hk != 0 || dk == 0 || dv == 0 || dk > MAX_HEAD_DIM || dv > MAX_HEAD_DIM || t == 0 || a.ring < 2 {
        return Err(Error::InvalidArgument(format!(
            "gated_delta_rule: Hk {hk}, Hv {hv} (a multiple), Dk {dk}, Dv {dv} (1..={MAX_HEAD_DIM}), T {t}, ring {}",
            a.ring
        )));
    }
    let ld_qkv = d.conv_dim();
    if a.b_col + hv > a.ld_mix || a.a_col + hv > a.ld_mix {
        return Err(Error::InvalidArgument("gated_delta_rule: b or a lies past the mix row".into()));
    }
    f32_check("qkv", a.qkv, t * ld_qkv)?;
    f32_check("mix", a.mix, (t - 1) * a.ld_mix + a.ld_mix)?;
    f32_check("a_log", a.a_log, hv)?;
    f32_check("dt_bias", a.dt_bias, hv)?;
    f32_check("state", a.state, a.ring * hv * dk * dv)?;
    f32_check("out", a.out, t * hv * dv)?;
    let params = GatedDeltaRuleUniform {
        k_heads: hk as u32,
        v_heads: hv as u32,
        ld_qkv: ld_qkv as u32,
        ld_mix: a.ld_mix as u32,
        b_col: a.b_col as u32,
        a_col: a.a_col as u32,
        n_rows: t as u32,
        ring: a.ring as u32,
    };
    let params = gpu.uniform("gated_delta_rule.params", &params);
    let (shader, macros) = delta_shader(gpu.macros(), d, form);
    if a.seqs.is_some() && form != DeltaForm::Recurrent {
        return Err(Error::InvalidArgument("gated_delta_rule: a batch step runs the recurrent form".into()));
    }
    let cb = delta_tiling(dk, dv).0;
    let mut bindings = vec![
        a.qkv.binding(),
        a.mix.binding(),
        a.a_log.binding(),
        a.dt_bias.binding(),
        a.state.binding(),
        a.out.binding(),
        a.step.as_entire_binding(),
        params.as_entire_binding(),
    ];
    let (macros, rows) = batch_rows(macros, a.seqs, t, &mut bindings)?;
    let [gx, gy, _] = grid((hv * dv / cb) as u32);
    gpu.kernel(shader, "main", &macros, &bindings, [gx, gy, rows])
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/rms_norm_gated.wgsl`.
    pub(crate) struct RmsNormGatedUniform = "Params" {
        heads: u32,
        dim: u32,
        ld_z: u32,
        z_col: u32,
        n_rows: u32,
        eps: f32,
        _pad0: u32,
        _pad1: u32,
    }
}

/// Records `Qwen3_5MoeRMSNormGated` in place over the rows `t < step.n_tokens` of `x` f32
/// `(T, H Dv)`: per head, `x * rsqrt(mean(x²) + eps) * w * silu(z)` with `w` f32 `(Dv)` and z
/// at columns `z_col ..` of `z` (row stride `ld_z`).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_gated(
    gpu: &Gpu,
    x: &Tensor,
    z: &Tensor,
    ld_z: usize,
    z_col: usize,
    w: &Tensor,
    heads: usize,
    step: &wgpu::Buffer,
    n_tokens: usize,
    eps: f32,
) -> Result<Kernel> {
    let d = w.numel();
    if d == 0 || heads == 0 || n_tokens == 0 || z_col + heads * d > ld_z {
        return Err(Error::InvalidArgument(format!(
            "rms_norm_gated: {heads} heads of {d}, z at column {z_col} of rows of {ld_z}, T {n_tokens}"
        )));
    }
    f32_check("x", x, n_tokens * heads * d)?;
    f32_check("z", z, (n_tokens - 1) * ld_z + z_col + heads * d)?;
    f32_check("w", w, d)?;
    let params = RmsNormGatedUniform {
        heads: heads as u32,
        dim: d as u32,
        ld_z: ld_z as u32,
        z_col: z_col as u32,
        n_rows: n_tokens as u32,
        eps,
        ..Default::default()
    };
    let params = gpu.uniform("rms_norm_gated.params", &params);
    let wg = d.next_power_of_two().clamp(32, 128);
    gpu.kernel(
        "rms_norm_gated",
        "main",
        &gpu.macros().set("WG", wg),
        &[x.binding(), z.binding(), w.binding(), step.as_entire_binding(), params.as_entire_binding()],
        grid((n_tokens * heads) as u32),
    )
}

/// CPU twins, written like transformers' torch code (f64 where it accumulates).
pub mod cpu {
    use super::DeltaNetSpec;

    fn silu(x: f64) -> f64 {
        x / (1.0 + (-x).exp())
    }

    /// `causal_conv1d_update` over `t` rows of `x` (row stride `ld_x`, the first `c` columns),
    /// `state` `(K-1, C)` updated in place, taps `w` `(C, K)`; returns `(t, C)`.
    pub fn causal_conv1d(x: &[f32], ld_x: usize, t: usize, w: &[f32], k: usize, state: &mut [f32]) -> Vec<f32> {
        let c = w.len() / k;
        let mut out = vec![0f32; t * c];
        for ch in 0..c {
            let mut win: Vec<f64> = (0..k - 1).map(|j| state[j * c + ch] as f64).collect();
            for r in 0..t {
                win.push(x[r * ld_x + ch] as f64);
                let acc: f64 = (0..k).map(|j| w[ch * k + j] as f64 * win[j]).sum();
                out[r * c + ch] = silu(acc) as f32;
                win.remove(0);
            }
            for j in 0..k - 1 {
                state[j * c + ch] = win[j] as f32;
            }
        }
        out
    }

    /// `Qwen3_5MoeRMSNormGated`: `x * rsqrt(mean(x²) + eps) * w * silu(z)` over one head.
    pub fn rms_norm_gated(x: &[f64], z: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let r = 1.0 / (ms + eps as f64).sqrt();
        x.iter().zip(z).zip(w).map(|((v, &z), &w)| (v * r * w as f64 * silu(z as f64)) as f32).collect()
    }

    /// The gated delta rule (see `wgsl/gated_delta_rule.wgsl`) for `t` tokens: `qkv`
    /// `(t, 2 Hk Dk + Hv Dv)`, b/a from their columns of `mix` (row stride `ld_mix`), `state`
    /// `(Hv, Dk, Dv)` updated in place; returns o `(t, Hv Dv)` in f64 (before the gated norm).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_rule(
        d: &DeltaNetSpec,
        qkv: &[f32],
        mix: &[f32],
        (ld_mix, b_col, a_col): (usize, usize, usize),
        a_log: &[f32],
        dt_bias: &[f32],
        t: usize,
        state: &mut [f32],
    ) -> Vec<f64> {
        let (hk, hv, dk, dv) = (d.k_heads, d.v_heads, d.k_dim, d.v_dim);
        let ld = d.conv_dim();
        let l2 = |x: &[f32]| -> Vec<f64> {
            let n = 1.0 / (x.iter().map(|&v| v as f64 * v as f64).sum::<f64>() + 1e-6).sqrt();
            x.iter().map(|&v| v as f64 * n).collect()
        };
        let mut out = vec![0f64; t * hv * dv];
        for r in 0..t {
            let row = &qkv[r * ld..][..ld];
            let m = &mix[r * ld_mix..][..ld_mix];
            for h in 0..hv {
                let kh = d.k_head(h);
                let q: Vec<f64> = l2(&row[kh * dk..][..dk]).iter().map(|v| v / (dk as f64).sqrt()).collect();
                let k = l2(&row[hk * dk + kh * dk..][..dk]);
                let v = &row[2 * hk * dk + h * dv..][..dv];
                let beta = 1.0 / (1.0 + (-(m[b_col + h] as f64)).exp());
                let x = m[a_col + h] as f64 + dt_bias[h] as f64;
                let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
                let decay = (-(a_log[h] as f64).exp() * softplus).exp();
                let s = &mut state[h * dk * dv..][..dk * dv];
                let mut o = vec![0f64; dv];
                for j in 0..dv {
                    let mut kv = 0f64;
                    for i in 0..dk {
                        let sij = s[i * dv + j] as f64 * decay;
                        s[i * dv + j] = sij as f32;
                        kv += sij * k[i];
                    }
                    let delta = (v[j] as f64 - kv) * beta;
                    for i in 0..dk {
                        let sij = s[i * dv + j] as f64 + k[i] * delta;
                        s[i * dv + j] = sij as f32;
                        o[j] += sij * q[i];
                    }
                }
                out[r * hv * dv + h * dv..][..dv].copy_from_slice(&o);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;
    use crate::ops::StepParams;

    fn set_step(gpu: &Gpu, step: &wgpu::Buffer, pos: usize, n: usize) {
        let sp = StepParams { pos: pos as u32, n_tokens: n as u32, slot: 0, _pad: 0 };
        gpu.queue.write_buffer(step, 0, bytemuck::bytes_of(&sp));
    }

    fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
        let (diff, at) = max_abs_diff(got, want);
        eprintln!("{what}: max diff {diff:e}");
        assert!(diff <= tol, "{what}: max diff {diff} at {at} ({} vs {})", got[at], want[at]);
    }

    /// Passes of `n` tokens over one sequence (each reading its own rows of x), the GPU's outputs
    /// and ring slots against the CPU twin; the first pass (pos 0) must ignore a dirty slot. Then a
    /// rollback: the pass at `rollback` (an earlier pass end whose slot no later pass reused) is
    /// run again on other input and must start from the state kept there.
    fn check_conv(
        gpu: &Gpu,
        (c, k, ld): (usize, usize, usize),
        t_max: usize,
        ring: usize,
        passes: &[usize],
        rollback: usize,
    ) {
        let np = passes.len() + 1;
        let x = random(t_max * ld * np, 5 + c as u64, 1.0);
        let w = random(c * k, 6, 0.5);
        // Each pass reads its own rows of x (a tensor each); the last one is the rollback's.
        let xs: Vec<Tensor> =
            (0..np).map(|i| gpu.upload_f32("x", &[t_max, ld], &x[i * t_max * ld..][..t_max * ld]).unwrap()).collect();
        let wt = gpu.upload_f32("w", &[c, k], &w).unwrap();
        // A dirty ring: pos 0 must read zeros anyway.
        let st = gpu.upload_f32("state", &[ring, k - 1, c], &random(ring * (k - 1) * c, 7, 3.0)).unwrap();
        let out = gpu.empty("out", &[t_max, c], ElemType::F32).unwrap();
        let step = gpu.uniform("step", &StepParams::default());
        let mut cpu_state = vec![0f32; (k - 1) * c];
        let mut kept = std::collections::HashMap::new();
        let mut pos = 0;
        let run = |pass: usize, pos: usize, n: usize, cpu_state: &mut Vec<f32>, what: &str| {
            let kern = causal_conv1d(gpu, &xs[pass], ld, &wt, &st, &out, &step, None, t_max, ring).unwrap();
            set_step(gpu, &step, pos, n);
            gpu.run(&[&kern]).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let want = cpu::causal_conv1d(&x[pass * t_max * ld..], ld, n, &w, k, cpu_state);
            // K products and a sum in f32, then exp: a few ulps of values ~1.
            assert_close(&got[..n * c], &want, 1e-5, &format!("conv c={c} k={k} pos={pos} n={n}{what}"));
            let slots = gpu.read_f32(&st).unwrap();
            let slot = &slots[((pos + n) % ring) * (k - 1) * c..][..(k - 1) * c];
            assert_close(slot, cpu_state, 0.0, "conv state slot");
        };
        for (pass, &n) in passes.iter().enumerate() {
            kept.insert(pos, cpu_state.clone());
            run(pass, pos, n, &mut cpu_state, "");
            pos += n;
        }
        let mut at = kept.remove(&rollback).expect("rollback to a pass start");
        run(np - 1, rollback, 1, &mut at, " (rollback)");
    }

    #[test]
    fn causal_conv1d_matches_cpu() {
        for gpu in gpu_variants() {
            // Ring 3: ends 7, 8, 9, 12, 13 in slots 1, 2, 0, 0, 1; slot 0 holds 12 at the end.
            for (c, k, ld) in [(40, 4, 52), (7, 2, 7), (130, 4, 130)] {
                check_conv(&gpu, (c, k, ld), 9, 3, &[7, 1, 1, 3, 1], 12);
            }
            // Qwen3.5-35B-A3B's conv (C = 8192 of an in_proj row of 12352), a 33-token prefill,
            // ring 4: ends 33, 34, 41 in slots 1, 2, 1; back to 34.
            check_conv(&gpu, (8192, 4, 12352), 33, 4, &[33, 1, 7], 34);
        }
    }

    fn spec(hk: usize, hv: usize, dk: usize, dv: usize) -> DeltaNetSpec {
        DeltaNetSpec { k_heads: hk, v_heads: hv, k_dim: dk, v_dim: dv, conv_kernel: 4, kv_tiled: false }
    }

    struct Case {
        qkv: Vec<f32>,
        mix: Vec<f32>,
        cols: (usize, usize, usize, usize),
        a_log: Vec<f32>,
        dt_bias: Vec<f32>,
        norm: Vec<f32>,
    }

    impl Case {
        /// `slow`: A = exp(A_log) in [0.01, 0.1] (a state that lasts hundreds of tokens) instead
        /// of [1, 16] (one that mostly fades within a few).
        fn new(d: DeltaNetSpec, rows: usize, seed: u64, slow: bool) -> Case {
            let (hv, vd) = (d.v_heads, d.value_dim());
            // mix = [pad 3 | z | b | a | pad 5]: z, b and a at odd columns, as views would not allow.
            let (z_col, b_col, a_col) = (3, 3 + vd, 3 + vd + hv);
            let ld_mix = a_col + hv + 5;
            let mut mix = random(rows * ld_mix, seed, 1.0);
            for r in 0..rows {
                for h in 0..hv {
                    mix[r * ld_mix + a_col + h] *= 2.0;
                }
            }
            let mut rng = random(hv * 2, seed + 1, 1.0).into_iter();
            Case {
                qkv: random(rows * d.conv_dim(), seed + 2, 0.5),
                mix,
                cols: (ld_mix, z_col, b_col, a_col),
                // A = exp(A_log) in [1, 16] (or [0.01, 0.1]); dt_bias near 1.
                a_log: (0..hv)
                    .map(|_| {
                        let u = rng.next().unwrap() + 1.0;
                        if slow { 0.01 + 0.045 * u } else { 1.0 + 7.5 * u }.ln()
                    })
                    .collect(),
                dt_bias: (0..hv).map(|_| 1.0 + 0.1 * rng.next().unwrap()).collect(),
                norm: random(d.v_dim, seed + 3, 0.2).iter().map(|w| 1.0 + w).collect(),
            }
        }
    }

    /// A pass of a test: `(n, rows)`, `n` tokens run by kernels recorded for `rows` (>= n).
    type Pass = (usize, usize);

    /// Passes over one sequence (each on its own input rows), the delta rule + gated norm against
    /// the CPU twins (the recurrent definition), and the ring slot each pass writes against the
    /// CPU's state; the ring starts dirty, so the first pass (pos 0) must ignore it. Then a
    /// rollback `(pos, pass)`: a pass at `pos` (an earlier pass start whose slot no later pass
    /// reused) again, on other input, from the state kept there. `form`: the kernel every pass
    /// records, or `None` for the one `gated_delta_rule` picks. Returns the largest differences
    /// seen (output, state).
    fn check_delta(
        gpu: &Gpu,
        d: DeltaNetSpec,
        slow: bool,
        passes: &[Pass],
        (rollback, rb_pass): (usize, Pass),
        form: Option<DeltaForm>,
    ) -> (f32, f32) {
        let (ring, eps) = (4, 1e-6);
        let np = passes.len() + 1;
        let rmax = passes.iter().chain([&rb_pass]).map(|p| p.1).max().unwrap();
        let c = Case::new(d, np * rmax, 11 + d.k_dim as u64, slow);
        let up = |n: &str, v: &[f32]| gpu.upload_f32(n, &[v.len()], v).unwrap();
        let (ld_mix, z_col, b_col, a_col) = c.cols;
        // A tensor per pass of each input (rmax rows); the last one is the rollback's.
        let qkv: Vec<Tensor> =
            (0..np).map(|p| up("qkv", &c.qkv[p * rmax * d.conv_dim()..][..rmax * d.conv_dim()])).collect();
        let mix: Vec<Tensor> = (0..np).map(|p| up("mix", &c.mix[p * rmax * ld_mix..][..rmax * ld_mix])).collect();
        let (a_log, dt_bias, norm) = (up("a_log", &c.a_log), up("dt_bias", &c.dt_bias), up("norm", &c.norm));
        let hsz = d.v_heads * d.k_dim * d.v_dim;
        let state = up("state", &random(ring * hsz, 3, 1.0));
        let out = gpu.empty("out", &[rmax, d.value_dim()], ElemType::F32).unwrap();
        let step = gpu.uniform("step", &StepParams::default());
        let worst = std::cell::Cell::new((0f32, 0f32));
        let run = |pass: usize, pos: usize, (n, rows): Pass, st: &mut Vec<f32>, what: &str| {
            let args = DeltaRuleArgs {
                spec: d,
                qkv: &qkv[pass],
                mix: &mix[pass],
                ld_mix,
                b_col,
                a_col,
                a_log: &a_log,
                dt_bias: &dt_bias,
                state: &state,
                out: &out,
                step: &step,
                seqs: None,
                n_tokens: rows,
                ring,
            };
            let form = form.unwrap_or_else(|| delta_form(gpu, d.k_dim, d.v_dim, rows));
            let rule = record_delta(gpu, &args, form).unwrap();
            let gate = rms_norm_gated(gpu, &out, &mix[pass], ld_mix, z_col, &norm, d.v_heads, &step, rows, eps);
            set_step(gpu, &step, pos, n);
            gpu.run(&[&rule, &gate.unwrap()]).unwrap();
            let got = gpu.read_f32(&out).unwrap();
            let qkv = &c.qkv[pass * rmax * d.conv_dim()..];
            let mix = &c.mix[pass * rmax * ld_mix..];
            let o = cpu::gated_delta_rule(&d, qkv, mix, (ld_mix, b_col, a_col), &c.a_log, &c.dt_bias, n, st);
            let want: Vec<f32> = (0..n * d.v_heads)
                .flat_map(|th| {
                    let (t, h) = (th / d.v_heads, th % d.v_heads);
                    let z = &mix[t * ld_mix + z_col + h * d.v_dim..][..d.v_dim];
                    cpu::rms_norm_gated(&o[th * d.v_dim..][..d.v_dim], z, &c.norm, eps)
                })
                .collect();
            let what =
                format!("delta {d:?}{} {form:?} pos={pos} n={n} rows={rows}{what}", if slow { " slow" } else { "" });
            // The outputs are RMS-normalized (~1 per element, times w ~ 1 and silu(z) < 1): f32
            // rounding through the recurrence (Dk-long dot products of unit-norm k and q with a
            // state that decays by exp(g) < 1 each token, and a delta rule step never grows it:
            // |I - beta k k^T| <= 1, so errors do not grow with T) measures <= 1.5e-6 on lavapipe
            // for both kernels (T up to 101; the chunked form only regroups the same sums: C x C
            // products, exp of differences <= 0, a forward substitution with |A| <= 1); 2e-4
            // leaves room for other reduction orders, fast exp/rsqrt and the norm's 1/rms
            // amplifying a small o.
            let (diff, _) = max_abs_diff(&got[..want.len()], &want);
            assert_close(&got[..want.len()], &want, 2e-4, &what);
            // The state slot the pass wrote, not normalized: |S| <= 0.3 here, a Dk-long dot
            // product's rounding (128 * 6e-8 * 0.3 ~ 2e-6) per token at worst, not accumulating
            // (as above); measured <= 1.5e-7.
            let slots = gpu.read_f32(&state).unwrap();
            let slot = &slots[((pos + n) % ring) * hsz..][..hsz];
            let (sdiff, _) = max_abs_diff(slot, st);
            assert_close(slot, st, 1e-5, &format!("{what} state"));
            let w = worst.get();
            worst.set((w.0.max(diff), w.1.max(sdiff)));
        };
        let mut cpu_state = vec![0f32; hsz];
        let mut kept = std::collections::HashMap::new();
        let mut pos = 0;
        for (pass, &p) in passes.iter().enumerate() {
            kept.insert(pos, cpu_state.clone());
            run(pass, pos, p, &mut cpu_state, "");
            pos += p.0;
        }
        let mut at = kept.remove(&rollback).expect("rollback to a pass start");
        run(np - 1, rollback, rb_pass, &mut at, " (rollback)");
        worst.get()
    }

    /// The chunk sizes and forms picked.
    #[test]
    fn gated_delta_rule_forms() {
        // Qwen3.5's 128 x 128 heads chunk by 8 (26.7 KiB), by 4 on a 16 KiB device; small heads by
        // 16; 256 x 256 by 4 (17.2 KiB), recurrent on a 16 KiB device.
        assert_eq!(chunk_bytes(8, 128, delta_tiling(128, 128)), 27360);
        assert_eq!(delta_chunk(128, 128, 32 << 10), Some(8));
        assert_eq!(delta_chunk(128, 128, 16 << 10), Some(4));
        assert_eq!(delta_chunk(5, 7, 32 << 10), Some(16));
        assert_eq!(delta_chunk(256, 256, 32 << 10), Some(4));
        assert_eq!(delta_chunk(256, 256, 16 << 10), None);
        // In 32 KiB every head shape up to MAX_HEAD_DIM has a chunk.
        for dk in 1..=MAX_HEAD_DIM {
            for dv in 1..=MAX_HEAD_DIM {
                assert!(delta_chunk(dk, dv, 32 << 10).is_some(), "{dk} x {dv}");
            }
        }
        // Decode is recurrent, anything longer chunked (where the device has the memory).
        let g = gpu();
        assert_eq!(delta_form(&g, 128, 128, 1), DeltaForm::Recurrent);
        if g.limits.max_compute_workgroup_storage_size >= 32 << 10 {
            assert_eq!(delta_form(&g, 128, 128, 2), DeltaForm::Chunked(8));
            assert_eq!(delta_form(&g, 128, 128, 512), DeltaForm::Chunked(8));
        }
    }

    /// Passes of 19 (2 or 3 chunks, the last partial), 16 (whole chunks of 8 or 16) and 5 tokens
    /// recorded for 20 (fewer than recorded, state from the ring), a decode step recorded for 1
    /// (the recurrent kernel), one recorded for 20 (a one-token chunk); ring 4: ends 19, 35, 40,
    /// 41, 42 in slots 3, 3, 0, 1, 2, so the pass at 35 (7 tokens) is re-run from slot 3.
    const PASSES: &[Pass] = &[(19, 20), (16, 20), (5, 20), (1, 1), (1, 20)];
    const ROLLBACK: (usize, Pass) = (35, (7, 20));

    /// Each shape with the kernels `gated_delta_rule` picks, with the recurrent kernel for every
    /// pass (the fallback where no chunk fits) and with chunks of 4 (the chunk of a 16 KiB
    /// device): GQA-style 2:1 heads, odd head dims, z/b/a at arbitrary columns.
    #[test]
    fn gated_delta_rule_matches_cpu() {
        for gpu in gpu_variants() {
            // Tilings: (CB, RG, ROWS) = (16, 16, 1), (4, 32, 1) with idle row groups, (32, 8, 16),
            // (8, 32, 2) with a partial last row group, (1, 8, 1) with Dk = 5, Dv = 7 (odd), (32,
            // 8, 32) at MAX_HEAD_DIM. Chunks picked: 8, 16, 8, 8, 16, 4.
            let shapes =
                [spec(2, 4, 16, 16), spec(1, 2, 24, 12), spec(2, 2, 128, 128), spec(1, 1, 40, 8), spec(1, 3, 5, 7)];
            for d in shapes.into_iter().chain([spec(1, 1, 256, 256)]) {
                for form in [None, Some(DeltaForm::Recurrent), Some(DeltaForm::Chunked(4))] {
                    let (o, s) = check_delta(&gpu, d, false, PASSES, ROLLBACK, form);
                    eprintln!("worst {d:?} {form:?}: out {o:e}, state {s:e}");
                }
            }
            // llama.cpp's order of the value heads: head h reads key head h % Hk (3 key heads
            // of 6 value heads: 0 1 2 0 1 2, not 0 0 1 1 2 2).
            let tiled = DeltaNetSpec { kv_tiled: true, ..spec(3, 6, 16, 16) };
            assert_eq!((0..6).map(|h| tiled.k_head(h)).collect::<Vec<_>>(), [0, 1, 2, 0, 1, 2]);
            for form in [None, Some(DeltaForm::Recurrent)] {
                check_delta(&gpu, tiled, false, PASSES, ROLLBACK, form);
            }
        }
    }

    /// Qwen3.5-35B-A3B's shapes (Hk 16, Hv 32, Dk = Dv = 128, chunks of 8): a 101-token prefill
    /// recorded for 104 (12 whole chunks and 5 tokens), a 24-token pass, two decode steps, then
    /// back to 125 for 3 tokens (ring 4: ends 101, 125, 126, 127 in slots 1, 1, 2, 3); with
    /// A in [1, 16] and with slow decay (the state carried across all the chunks).
    #[test]
    fn gated_delta_rule_long_prefill() {
        let passes = [(101, 104), (24, 24), (1, 1), (1, 1)];
        for gpu in gpu_variants() {
            for slow in [false, true] {
                let (o, s) = check_delta(&gpu, spec(16, 32, 128, 128), slow, &passes, (125, (3, 24)), None);
                eprintln!("worst slow={slow}: out {o:e}, state {s:e}");
            }
        }
    }

    /// A batch decode step's rows: (position, slot), the slots in no order, one row at position 0
    /// (its state zeros, whatever its ring holds), rings wrapping (ring of 4, 5 slots).
    const BATCH_ROWS: [(usize, usize); 4] = [(6, 2), (0, 0), (9, 4), (1, 1)];
    const BATCH_SLOTS: usize = 5;

    /// What [`check_batch_rows`] checks: the kernel recorded by `record(input, state, out, seqs,
    /// n)` over the step's rows (`input` None) or over row r's input alone (`Some(r)`, as row 0 of
    /// a one-token pass); a ring state of `state_len` f32 and output rows of `out_cols`; `twin(r,
    /// state)` row r's output from its state (updated), and the tolerance of the output against it.
    /// [`BatchCheck::record`]: (row or the whole step, state, out, seqs, rows) -> the kernel.
    type Record<'a> = &'a dyn Fn(Option<usize>, &Tensor, &Tensor, Option<&Tensor>, usize) -> Kernel;

    struct BatchCheck<'a> {
        /// The step uniform `record` binds.
        step: &'a wgpu::Buffer,
        state_len: usize,
        out_cols: usize,
        record: Record<'a>,
        twin: &'a dyn Fn(usize, &mut Vec<f32>) -> Vec<f32>,
        tol: (f32, f32),
    }

    /// A batch decode step ([`BATCH_ROWS`]) against one-token passes: each row's output and the
    /// state it writes are bit for bit those of a one-token pass of its sequence alone in its slot
    /// (from the same states), no other state changes, and each matches the CPU twin (output
    /// within `tol.0`, state within `tol.1`).
    fn check_batch_rows(gpu: &Gpu, ring: usize, c: &BatchCheck<'_>, what: &str) {
        let (b, len) = (BATCH_ROWS.len(), c.state_len);
        let init = random(BATCH_SLOTS * ring * len, 41, 1.0);
        let step = c.step;
        let seqs: Vec<u32> = BATCH_ROWS.iter().flat_map(|&(p, s)| [p as u32, s as u32]).collect();
        let seqs = gpu.upload_u32("seqs", &[b, 2], &seqs).unwrap();
        let state = gpu.upload_f32("state", &[BATCH_SLOTS * ring, len], &init).unwrap();
        let out = gpu.empty("out", &[b, c.out_cols], ElemType::F32).unwrap();
        let kern = (c.record)(None, &state, &out, Some(&seqs), b);
        // A batch step's uniform: its rows, positions from seqs.
        gpu.queue.write_buffer(step, 0, bytemuck::bytes_of(&StepParams { n_tokens: b as u32, ..Default::default() }));
        gpu.run(&[&kern]).unwrap();
        let (got, got_state) = (gpu.read_f32(&out).unwrap(), gpu.read_f32(&state).unwrap());
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let mut want_state = init.clone();
        for (r, &(pos, slot)) in BATCH_ROWS.iter().enumerate() {
            let one_state = gpu.upload_f32("state", &[BATCH_SLOTS * ring, len], &init).unwrap();
            let one_out = gpu.empty("out", &[1, c.out_cols], ElemType::F32).unwrap();
            let kern = (c.record)(Some(r), &one_state, &one_out, None, 1);
            let sp = StepParams { pos: pos as u32, n_tokens: 1, slot: slot as u32, _pad: 0 };
            gpu.queue.write_buffer(step, 0, bytemuck::bytes_of(&sp));
            gpu.run(&[&kern]).unwrap();
            let one = gpu.read_f32(&one_out).unwrap();
            let row = &got[r * c.out_cols..][..c.out_cols];
            assert_eq!(bits(row), bits(&one), "{what}: row {r} (pos {pos}, slot {slot}) vs its one-token pass");
            let dst = (slot * ring + (pos + 1) % ring) * len;
            let written = &gpu.read_f32(&one_state).unwrap()[dst..][..len];
            want_state[dst..][..len].copy_from_slice(written);
            // The one-token pass in its slot against the CPU twin.
            let src = (slot * ring + pos % ring) * len;
            let mut st = if pos == 0 { vec![0f32; len] } else { init[src..][..len].to_vec() };
            let want = (c.twin)(r, &mut st);
            assert_close(&one, &want, c.tol.0, &format!("{what}: row {r} vs the CPU twin"));
            assert_close(written, &st, c.tol.1, &format!("{what}: row {r}'s state vs the CPU twin"));
        }
        assert_eq!(bits(&got_state), bits(&want_state), "{what}: the states after the step");
    }

    #[test]
    fn causal_conv1d_batch_rows_are_one_token_passes() {
        let ring = 4;
        for gpu in gpu_variants() {
            for (c, k, ld) in [(40, 4, 52), (7, 2, 7)] {
                let b = BATCH_ROWS.len();
                let x = random(b * ld, 5 + c as u64, 1.0);
                let w = random(c * k, 6, 0.5);
                let (xs, wt) = (gpu.upload_f32("x", &[b, ld], &x).unwrap(), gpu.upload_f32("w", &[c, k], &w).unwrap());
                let rows: Vec<Tensor> =
                    (0..b).map(|r| gpu.upload_f32("x", &[1, ld], &x[r * ld..][..ld]).unwrap()).collect();
                let step = gpu.uniform("step", &StepParams::default());
                let record = |row: Option<usize>, st: &Tensor, out: &Tensor, seqs: Option<&Tensor>, n: usize| {
                    let x = row.map_or(&xs, |r| &rows[r]);
                    causal_conv1d(&gpu, x, ld, &wt, st, out, &step, seqs, n, ring).unwrap()
                };
                let twin = |r: usize, st: &mut Vec<f32>| cpu::causal_conv1d(&x[r * ld..], ld, 1, &w, k, st);
                // As causal_conv1d_matches_cpu: a few ulps of the output, the state exact.
                let (state_len, tol) = ((k - 1) * c, (1e-5, 0.0));
                let check = BatchCheck { step: &step, state_len, out_cols: c, record: &record, twin: &twin, tol };
                check_batch_rows(&gpu, ring, &check, &format!("conv c={c} k={k}"));
            }
        }
    }

    #[test]
    fn gated_delta_rule_batch_rows_are_one_token_passes() {
        let ring = 4;
        for gpu in gpu_variants() {
            let tiled = DeltaNetSpec { kv_tiled: true, ..spec(3, 6, 16, 16) };
            for d in [spec(2, 4, 16, 16), spec(1, 3, 5, 7), spec(2, 2, 128, 128), tiled] {
                let b = BATCH_ROWS.len();
                let c = Case::new(d, b, 61, true);
                let (ld_mix, _, b_col, a_col) = c.cols;
                let cd = d.conv_dim();
                let up = |n: &str, rows: usize, v: &[f32]| gpu.upload_f32(n, &[rows, v.len() / rows], v).unwrap();
                let (qkv, mix) = (up("qkv", b, &c.qkv), up("mix", b, &c.mix));
                let qkv_rows: Vec<Tensor> = (0..b).map(|r| up("qkv", 1, &c.qkv[r * cd..][..cd])).collect();
                let mix_rows: Vec<Tensor> = (0..b).map(|r| up("mix", 1, &c.mix[r * ld_mix..][..ld_mix])).collect();
                let (a_log, dt_bias) = (up("a_log", 1, &c.a_log), up("dt_bias", 1, &c.dt_bias));
                let step = gpu.uniform("step", &StepParams::default());
                let record = |row: Option<usize>, state: &Tensor, out: &Tensor, seqs: Option<&Tensor>, n: usize| {
                    let (qkv, mix) = row.map_or((&qkv, &mix), |r| (&qkv_rows[r], &mix_rows[r]));
                    let (a_log, dt_bias, step) = (&a_log, &dt_bias, &step);
                    let args = DeltaRuleArgs {
                        spec: d,
                        qkv,
                        mix,
                        ld_mix,
                        b_col,
                        a_col,
                        a_log,
                        dt_bias,
                        state,
                        out,
                        step,
                        seqs,
                        n_tokens: n,
                        ring,
                    };
                    gated_delta_rule(&gpu, &args).unwrap()
                };
                let twin = |r: usize, st: &mut Vec<f32>| {
                    let (qkv, mix) = (&c.qkv[r * cd..], &c.mix[r * ld_mix..]);
                    let o = cpu::gated_delta_rule(&d, qkv, mix, (ld_mix, b_col, a_col), &c.a_log, &c.dt_bias, 1, st);
                    o.into_iter().map(|v| v as f32).collect()
                };
                // One token from a state of |S| <= 1 (o before the norm: Dk-long sums of S q, |q| =
                // 1 / sqrt(Dk)): f32 rounding of a few ulps of ~1, as the state's; measured <= 2.4e-7
                // on lavapipe.
                let (state_len, out_cols) = (d.v_heads * d.k_dim * d.v_dim, d.value_dim());
                let check =
                    BatchCheck { step: &step, state_len, out_cols, record: &record, twin: &twin, tol: (1e-5, 1e-5) };
                check_batch_rows(&gpu, ring, &check, &format!("delta {d:?}"));
            }
        }
    }

    /// The kernels as the tested shapes (and Qwen3.5's) record them, each form, with and without
    /// KV_TILED, translate to MSL (the Metal check) and SPIR-V; tests/shaders.rs covers only the
    /// files' default macros.
    #[test]
    fn gated_delta_rule_variants_translate() {
        use naga::back::{msl, spv};
        use naga::valid::{Capabilities, ValidationFlags, Validator};
        let shapes = [(16, 16), (24, 12), (128, 128), (40, 8), (5, 7), (256, 256)];
        for (dk, dv) in shapes {
            let chunks = [16, 8, 4].into_iter().filter(|&c| chunk_bytes(c, dk, delta_tiling(dk, dv)) <= 32 << 10);
            let forms = std::iter::once(DeltaForm::Recurrent).chain(chunks.map(DeltaForm::Chunked));
            for (form, tiled) in forms.flat_map(|f| [(f, false), (f, true)]) {
                let d = DeltaNetSpec { kv_tiled: tiled, ..spec(1, 2, dk, dv) };
                let (name, macros) = delta_shader(Macros::new(), &d, form);
                let what = format!("{name} {macros:?}");
                let code = crate::gpu::shader::preprocess(name, &macros).unwrap();
                let module = naga::front::wgsl::parse_str(&code).unwrap_or_else(|e| panic!("{what}: {e}"));
                let caps = Capabilities::all() - Capabilities::SHADER_FLOAT16 - Capabilities::SUBGROUP;
                let info = Validator::new(ValidationFlags::all(), caps)
                    .validate(&module)
                    .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&code)));
                let options = msl::Options { lang_version: (2, 4), ..Default::default() };
                msl::write_string(&module, &info, &options, &msl::PipelineOptions::default())
                    .unwrap_or_else(|e| panic!("{what}: MSL {e}"));
                let options = spv::Options { lang_version: (1, 3), ..Default::default() };
                spv::write_vec(&module, &info, &options, None).unwrap_or_else(|e| panic!("{what}: SPIR-V {e}"));
            }
        }
    }
}
