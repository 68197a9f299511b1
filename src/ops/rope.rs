//! Rotary position embedding (`wgsl/rope.wgsl`), with the optional per-head q/k RMSNorm of
//! Qwen3 and Gemma 3 fused in.
//!
//! Works in place on the `qkv` buffer of the fused QKV projection: each token row is
//! `[q: H*D | k: Hkv*D | v: Hkv*D]`; the first `H + Hkv` heads are rotated, v is untouched.
//! Token `t` of a pass is at position `step.pos + t` ([`StepParams`](super::StepParams)).

use crate::error::Result;
use crate::gpu::{kernel::grid, ElemType, Gpu, Kernel, Tensor};
use crate::ops::attention::cache_dims;
use crate::ops::signature::shared_params;

/// Shape of one layer's RoPE.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Query heads (H).
    pub heads: usize,
    /// Key/value heads (Hkv).
    pub kv_heads: usize,
    /// Head dimension D (even, ≤ 256 in practice).
    pub head_dim: usize,
    /// Rotated dims of a head (even, ≤ D; the first ones): D for full rotary, less for partial
    /// rotary (Qwen3.5: D/4); the rest pass through.
    pub rotary_dim: usize,
    /// RoPE base.
    pub theta: f32,
    /// Linear scaling factor (positions divided by it); 1 = none.
    pub scaling: f32,
    /// Tokens per pass the kernel is recorded for (T); a step may use fewer (`step.n_tokens`).
    pub n_tokens: usize,
    /// Proportional RoPE (Gemma 4): pairs (i, i + D/2) over the whole head, the first
    /// `rotary_dim / 2` at `theta^(-2i/D)`, the rest unrotated ([`rope_table`]).
    pub proportional: bool,
    /// Cache write only: the values are the k heads as projected, before norm and RoPE (the
    /// row's v part is not read; Gemma 4's `attention_k_eq_v`).
    pub k_eq_v: bool,
    /// Cache write only: the values RMS-normalized per head without a weight (Gemma 4).
    pub v_norm: bool,
    /// Only the q heads (normed and) rotated, no cache write: a layer that reads another layer's
    /// KV cache (Gemma 4's shared KV layers).
    pub q_only: bool,
}

impl RopeParams {
    /// Full NeoX RoPE over heads of `head_dim`, no scaling; the cache write plain.
    pub fn new(heads: usize, kv_heads: usize, head_dim: usize, theta: f32, n_tokens: usize) -> RopeParams {
        RopeParams {
            heads,
            kv_heads,
            head_dim,
            rotary_dim: head_dim,
            theta,
            scaling: 1.0,
            n_tokens,
            proportional: false,
            k_eq_v: false,
            v_norm: false,
            q_only: false,
        }
    }
}

/// `inv_freq[i] = 1 / theta^(2i/D) / scaling` for i < D/2, in f32 exactly as Hugging Face
/// computes it (`1.0 / base ** (arange(0, D, 2).float() / D)`, then `inv_freq /= factor` for
/// linear scaling); the angle of pair i at position p is then `f32(p) * inv_freq[i]`.
pub fn inv_freq(head_dim: usize, theta: f32, scaling: f32) -> Vec<f32> {
    (0..head_dim / 2).map(|i| 1.0f32 / theta.powf((2 * i) as f32 / head_dim as f32) / scaling).collect()
}

/// The dims the kernel pairs over (pairs (i, i + span / 2)) and each pair's inverse frequency:
/// `(rotary_dim, inv_freq(rotary_dim))` for NeoX RoPE over the first `rotary_dim` dims; for
/// proportional RoPE (transformers' `_compute_proportional_rope_parameters`) `(D, inv_freq(D))`
/// with the entries past `rotary_dim / 2` set to 0: those pairs turn by angle 0, unchanged.
pub fn rope_table(
    head_dim: usize,
    rotary_dim: usize,
    theta: f32,
    scaling: f32,
    proportional: bool,
) -> (usize, Vec<f32>) {
    if proportional {
        let mut f = inv_freq(head_dim, theta, scaling);
        f[rotary_dim / 2..].iter_mut().for_each(|v| *v = 0.0);
        (head_dim, f)
    } else {
        (rotary_dim, inv_freq(rotary_dim, theta, scaling))
    }
}

shared_params! {
    (gpu: &Gpu, qkv: &Tensor, step: &wgpu::Buffer)

    /// Records RoPE (and with `qk_norm = Some((q_norm, k_norm, eps))`, the per-head RMSNorm before
    /// it: `x * rsqrt(mean(x²) + eps) * w`, q heads with `q_norm`, k heads with `k_norm`, both f32
    /// `[D]` with any Gemma `1 + w` already folded in) over the rows `t < step.n_tokens` of `qkv`
    /// (f32 `[T, (H + 2 Hkv) * D]`). `step` is the [`StepParams`](super::StepParams) uniform.
    pub fn rope(p: RopeParams, qk_norm: Option<(&Tensor, &Tensor, f32)>) -> Result<Kernel> {
        record(gpu, qkv, step, p, qk_norm, None, None)
    }

    /// [`rope`] fused with [`kv_cache_write`](super::attention::kv_cache_write): also writes the
    /// rotated k and the v of rows `t < step.n_tokens` to the f16 caches `[Hkv, max_ctx, D]` at
    /// positions `step.pos + t` (same bits as the separate kernel), saving one dispatch per layer.
    pub fn rope_kv_write(
        p: RopeParams, qk_norm: Option<(&Tensor, &Tensor, f32)>, k_cache: &Tensor, v_cache: &Tensor
    ) -> Result<Kernel> {
        record(gpu, qkv, step, p, qk_norm, Some((k_cache, v_cache)), None)
    }

    /// [`rope_kv_write`] for a decode step of many sequences: token `t` of the pass is sequence `t`,
    /// at position `seqs[t].0` of KV-cache slot `seqs[t].1` (u32 `[T, 2]`), the caches being
    /// `[S, Hkv, max_ctx, D]`.
    pub fn rope_kv_write_batch(
        seqs: &Tensor, p: RopeParams, qk_norm: Option<(&Tensor, &Tensor, f32)>, k_cache: &Tensor, v_cache: &Tensor
    ) -> Result<Kernel> {
        record(gpu, qkv, step, p, qk_norm, Some((k_cache, v_cache)), Some(seqs))
    }

    /// [`rope`] of the q heads only ([`RopeParams::q_only`]) for a decode step of many sequences:
    /// token `t` at position `seqs[t].0` (u32 `[T, 2]`).
    pub fn rope_batch(seqs: &Tensor, p: RopeParams, qk_norm: Option<(&Tensor, &Tensor, f32)>) -> Result<Kernel> {
        assert!(p.q_only, "rope_batch: the batch form without a cache write is for q-only layers");
        record(gpu, qkv, step, p, qk_norm, None, Some(seqs))
    }
}

crate::ops::uniform::uniform_struct! {
    /// WGSL twin: `struct Params` of `wgsl/rope.wgsl`.
    pub(crate) struct RopeUniform = "Params" {
        heads: u32,
        q_heads: u32,
        row_stride: u32,
        n_rows: u32,
        eps: f32,
        max_ctx: u32,
        _pad1: u32,
        _pad2: u32,
    }
}

fn record(
    gpu: &Gpu,
    qkv: &Tensor,
    step: &wgpu::Buffer,
    p: RopeParams,
    qk_norm: Option<(&Tensor, &Tensor, f32)>,
    cache: Option<(&Tensor, &Tensor)>,
    seqs: Option<&Tensor>,
) -> Result<Kernel> {
    let d = p.head_dim;
    assert!(d >= 2 && d.is_multiple_of(2), "rope: head_dim {d} must be even");
    assert!(
        p.rotary_dim >= 2 && p.rotary_dim.is_multiple_of(2) && p.rotary_dim <= d,
        "rope: rotary_dim {} must be even and at most {d}",
        p.rotary_dim
    );
    assert!(cache.is_some() || !(p.k_eq_v || p.v_norm), "rope: k_eq_v and v_norm shape the cache write");
    assert!(!p.q_only || cache.is_none(), "rope: a q-only pass writes no cache");
    assert!(!p.v_norm || qk_norm.is_some(), "rope: v_norm takes its epsilon from the q/k norm");
    let (rot, table) = rope_table(d, p.rotary_dim, p.theta, p.scaling, p.proportional);
    assert!(p.heads > 0 && p.kv_heads > 0 && p.n_tokens > 0);
    assert_eq!(qkv.ty, ElemType::F32, "rope: qkv must be f32");
    let row = (p.heads + 2 * p.kv_heads) * d;
    assert!(qkv.numel() >= p.n_tokens * row, "rope: qkv holds fewer than T rows");
    let heads = p.heads + if p.q_only { 0 } else { p.kv_heads };
    let table = gpu.upload_f32("rope.inv_freq", &[rot / 2], &table)?;
    let eps = qk_norm.map_or(0.0, |n| n.2);
    let max_ctx = cache.map_or(0, |(k, _)| cache_dims(k).2);
    let params = RopeUniform {
        heads: heads as u32,
        q_heads: p.heads as u32,
        row_stride: row as u32,
        n_rows: p.n_tokens as u32,
        eps,
        max_ctx: max_ctx as u32,
        ..Default::default()
    };
    let params = gpu.uniform("rope.params", &params);
    // One pair per thread where possible: D/2 threads, clamped to 32..=128.
    let wg = (d / 2).next_power_of_two().clamp(32, 128);
    let macros = gpu
        .macros()
        .set("D", d)
        .set("ROT", rot)
        .set("WG", wg)
        .flag_if("QK_NORM", qk_norm.is_some())
        .flag_if("K_EQ_V", p.k_eq_v)
        .flag_if("V_NORM", p.v_norm);
    let mut bindings = vec![qkv.binding(), table.binding(), step.as_entire_binding(), params.as_entire_binding()];
    if let Some((qn, kn, _)) = qk_norm {
        assert!(qn.ty == ElemType::F32 && kn.ty == ElemType::F32, "rope: q/k norm weights must be f32");
        assert!(qn.numel() == d && kn.numel() == d, "rope: q/k norm weights must have D elements");
        bindings.push(qn.binding());
        bindings.push(kn.binding());
    }
    let mut macros = macros;
    if let Some((kc, vc)) = cache {
        for c in [kc, vc] {
            assert_eq!(c.ty, ElemType::F16, "rope: KV cache must be f16");
            let (_, hkv, _, cd) = cache_dims(c);
            assert!(hkv == p.kv_heads && cd == d, "rope: KV cache must be [S, Hkv, max_ctx, D]");
        }
        assert_eq!(kc.shape, vc.shape);
        macros = macros.flag("KV_WRITE").set("KC", bindings.len()).set("VC", bindings.len() + 1);
        bindings.push(kc.binding());
        bindings.push(vc.binding());
    }
    if let Some(seqs) = seqs {
        assert!(cache.is_some() || p.q_only, "rope: a batch of sequences writes their caches");
        assert!(seqs.ty == ElemType::U32 && seqs.numel() >= 2 * p.n_tokens, "rope: seqs must be u32 [T, 2]");
        macros = macros.flag("BATCH").set("SEQS", bindings.len());
        bindings.push(seqs.binding());
    }
    gpu.kernel("rope", "main", &macros, &bindings, grid((p.n_tokens * heads) as u32))
}

pub mod cpu {
    use super::RopeParams;

    /// Reference RoPE (+ optional q/k RMSNorm) on rows `t < n_tokens` of `qkv` at positions
    /// `pos + t`; cos/sin of the f32 angle are computed in f64.
    pub fn rope(qkv: &mut [f32], pos: usize, n_tokens: usize, p: &RopeParams, qk_norm: Option<(&[f32], &[f32], f32)>) {
        let d = p.head_dim;
        let (rot, inv) = super::rope_table(d, p.rotary_dim, p.theta, p.scaling, p.proportional);
        let half = rot / 2;
        let row = (p.heads + 2 * p.kv_heads) * d;
        for t in 0..n_tokens {
            let position = (pos + t) as f32;
            for h in 0..p.heads + if p.q_only { 0 } else { p.kv_heads } {
                let x = &mut qkv[t * row + h * d..][..d];
                if let Some((qn, kn, eps)) = qk_norm {
                    let w = if h < p.heads { qn } else { kn };
                    let ms = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
                    let r = 1.0 / (ms + eps).sqrt();
                    x.iter_mut().zip(w).for_each(|(v, w)| *v = *v * r * w);
                }
                for i in 0..half {
                    let a = (position * inv[i]) as f64;
                    let (s, c) = (a.sin() as f32, a.cos() as f32);
                    let (x1, x2) = (x[i], x[i + half]);
                    x[i] = x1 * c - x2 * s;
                    x[i + half] = x2 * c + x1 * s;
                }
            }
        }
    }

    /// Reference of what [`super::rope_kv_write`] writes to the caches for rows `t < n_tokens`
    /// of `qkv` (as the projection wrote it) at positions `pos + t`: `(keys, values)`, f32
    /// `[n_tokens, Hkv, D]` each before the f16 rounding. Keys are the rotated (and normed) k
    /// heads; values the v heads, or with `k_eq_v` the k heads as projected, with `v_norm`
    /// RMS-normalized (no weight; the q/k norm's epsilon).
    pub fn kv_values(
        qkv: &[f32],
        pos: usize,
        n_tokens: usize,
        p: &RopeParams,
        qk_norm: Option<(&[f32], &[f32], f32)>,
    ) -> (Vec<f32>, Vec<f32>) {
        let d = p.head_dim;
        let row = (p.heads + 2 * p.kv_heads) * d;
        let mut roped = qkv.to_vec();
        rope(&mut roped, pos, n_tokens, p, qk_norm);
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for t in 0..n_tokens {
            for g in 0..p.kv_heads {
                let k_at = t * row + (p.heads + g) * d;
                keys.extend_from_slice(&roped[k_at..][..d]);
                let v_at = if p.k_eq_v { k_at } else { k_at + p.kv_heads * d };
                let v = &qkv[v_at..][..d];
                if p.v_norm {
                    let eps = qk_norm.expect("v_norm takes the q/k norm's epsilon").2 as f64;
                    let ms = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>() / d as f64;
                    let r = 1.0 / (ms + eps).sqrt();
                    values.extend(v.iter().map(|&x| (x as f64 * r) as f32));
                } else {
                    values.extend_from_slice(v);
                }
            }
        }
        (keys, values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::tensor::test_util::*;
    use crate::ops::StepParams;

    fn check(gpu: &Gpu, p: RopeParams, steps: &[(usize, usize)], norm: bool, tol: f32) {
        let d = p.head_dim;
        let row = (p.heads + 2 * p.kv_heads) * d;
        let data = random(p.n_tokens * row, 11 + d as u64, 2.0);
        let qn: Vec<f32> = random(d, 12, 0.5).iter().map(|w| 1.0 + w).collect();
        let kn: Vec<f32> = random(d, 13, 0.5).iter().map(|w| 1.0 + w).collect();
        let qkv = gpu.upload_f32("qkv", &[p.n_tokens, row], &data).unwrap();
        let qn_t = gpu.upload_f32("q_norm", &[d], &qn).unwrap();
        let kn_t = gpu.upload_f32("k_norm", &[d], &kn).unwrap();
        let eps = 1e-6;
        let step = gpu.uniform("step", &StepParams::default());
        let norms = norm.then_some((&qn_t, &kn_t, eps));
        let k = rope(gpu, &qkv, &step, p, norms).unwrap();
        for &(pos, n) in steps {
            gpu.queue.write_buffer(&qkv.buffer, 0, bytemuck::cast_slice(&data));
            let sp = StepParams { pos: pos as u32, n_tokens: n as u32, slot: 0, _pad: 0 };
            gpu.queue.write_buffer(&step, 0, bytemuck::bytes_of(&sp));
            gpu.run(&[&k]).unwrap();
            let got = gpu.read_f32(&qkv).unwrap();
            let mut want = data.clone();
            cpu::rope(&mut want, pos, n, &p, norm.then_some((&qn[..], &kn[..], eps)));
            // rows past n_tokens are untouched, v is untouched
            for t in 0..p.n_tokens {
                let (g, w) = (&got[t * row..][..row], &want[t * row..][..row]);
                let qk = (p.heads + p.kv_heads) * d;
                assert_eq!(g[qk..], w[qk..], "v changed, t={t}");
                if t >= n {
                    assert_eq!(g, w, "row {t} >= n_tokens changed");
                }
            }
            let (diff, at) = max_abs_diff(&got, &want);
            assert!(
                diff <= tol,
                "rope {p:?} norm={norm} pos={pos} n={n} f16={}: max diff {diff} at {at} ({} vs {})",
                gpu.caps.f16,
                got[at],
                want[at]
            );
        }
    }

    #[test]
    fn rope_matches_cpu() {
        for gpu in gpu_variants() {
            for d in [64, 256] {
                for norm in [false, true] {
                    let p = RopeParams::new(4, 2, d, 10000.0, 7);
                    check(&gpu, p, &[(0, 7), (37, 1), (10, 5)], norm, 2e-6 * if norm { 4.0 } else { 2.0 });
                }
            }
            // Qwen-style large base with GQA 6:2, Gemma-style linear scaling.
            let p = RopeParams::new(6, 2, 128, 1_000_000.0, 3);
            check(&gpu, p, &[(5, 3)], true, 1e-5);
            let p = RopeParams { theta: 1_000_000.0, scaling: 8.0, heads: 4, kv_heads: 1, ..p };
            check(&gpu, p, &[(1000, 3)], false, 1e-5);
            // Qwen3.5: a quarter of each head rotated, the rest only normalized.
            let p = RopeParams { rotary_dim: 64, ..RopeParams::new(4, 2, 256, 1e7, 3) };
            check(&gpu, p, &[(0, 3), (300, 2)], true, 1e-5);
            check(&gpu, RopeParams { head_dim: 32, rotary_dim: 8, ..p }, &[(7, 3)], false, 1e-5);
        }
    }

    /// Gemma 4's full layers: proportional RoPE (a quarter of the pairs of a 512-dim head turn,
    /// at theta^(-2i/D)), values from the k projection (k_eq_v) under an unweighted RMSNorm
    /// (v_norm); its sliding layers: plain RoPE with v_norm. The caches hold the CPU reference's
    /// keys and values to f16 rounding, q and k in the row match it, and rows past n_tokens are
    /// untouched.
    #[test]
    fn rope_kv_write_gemma4_matches_cpu() {
        use crate::ops::attention::{kv_cache, AttnParams};
        for gpu in gpu_variants() {
            for (d, rot, proportional, k_eq_v) in
                [(512, 128, true, true), (64, 16, true, false), (64, 64, false, false)]
            {
                let (h, hkv, t) = (4, 2, 3);
                let p = RopeParams {
                    rotary_dim: rot,
                    proportional,
                    k_eq_v,
                    v_norm: true,
                    q_only: false,
                    ..RopeParams::new(h, hkv, d, 1e6, t)
                };
                let ap = AttnParams {
                    heads: h,
                    kv_heads: hkv,
                    head_dim: d,
                    max_ctx: 64,
                    window: 0,
                    scale: 1.0,
                    n_tokens: t,
                    splits: 0,
                };
                let row = (h + 2 * hkv) * d;
                let data = random(t * row, 90 + d as u64, 2.0);
                let qn: Vec<f32> = random(d, 91, 0.5).iter().map(|w| 1.0 + w).collect();
                let kn: Vec<f32> = random(d, 92, 0.5).iter().map(|w| 1.0 + w).collect();
                let (qn_t, kn_t) = (gpu.upload_f32("qn", &[d], &qn).unwrap(), gpu.upload_f32("kn", &[d], &kn).unwrap());
                let (pos, n) = (37, 2);
                let step = gpu.uniform("step", &StepParams { pos, n_tokens: n, slot: 0, _pad: 0 });
                let qkv = gpu.upload_f32("qkv", &[t, row], &data).unwrap();
                let (kc, vc) = kv_cache(&gpu, "c", &ap, 1).unwrap();
                let k = rope_kv_write(&gpu, &qkv, &step, p, Some((&qn_t, &kn_t, 1e-6)), &kc, &vc).unwrap();
                gpu.run(&[&k]).unwrap();
                let norms = Some((&qn[..], &kn[..], 1e-6));
                let mut want = data.clone();
                cpu::rope(&mut want, pos as usize, n as usize, &p, norms);
                let got = gpu.read_f32(&qkv).unwrap();
                let qk = (h + hkv) * d;
                for r in 0..t {
                    let (g, w) = (&got[r * row..][..qk], &want[r * row..][..qk]);
                    let (diff, at) = max_abs_diff(g, w);
                    assert!(diff <= 2e-5, "d={d} q/k row {r}: {diff} at {at}");
                    if r >= n as usize {
                        assert_eq!(&got[r * row..][..row], &data[r * row..][..row], "row {r} >= n_tokens changed");
                    }
                }
                // The pairs past the turning ones only normalized: q head 0's last dim is x * rms * w.
                let (keys, values) = cpu::kv_values(&data, pos as usize, n as usize, &p, norms);
                let (kg, vg) = (gpu.read_f16(&kc).unwrap(), gpu.read_f16(&vc).unwrap());
                for tok in 0..n as usize {
                    for g in 0..hkv {
                        let at = (g * 64 + pos as usize + tok) * d;
                        let src = (tok * hkv + g) * d;
                        for i in 0..d {
                            let (kw, vw) = (keys[src + i], values[src + i]);
                            // f16 rounding: half an ulp, relative 2^-11.
                            assert!(
                                (kg[at + i].to_f32() - kw).abs() <= kw.abs() / 2048.0 + 1e-5,
                                "K d={d} {tok} {g} {i}"
                            );
                            assert!(
                                (vg[at + i].to_f32() - vw).abs() <= vw.abs() / 2048.0 + 1e-5,
                                "V d={d} {tok} {g} {i}"
                            );
                        }
                    }
                }
                // v_norm gives unit-RMS values.
                let ms = values[..d].iter().map(|v| v * v).sum::<f32>() / d as f32;
                assert!((ms - 1.0).abs() < 1e-3, "v_norm: mean square {ms}");
                if proportional {
                    // The non-turning pairs pass through the norm only.
                    let x = data[d - 1] / (data[..d].iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt()
                        * qn[d - 1];
                    assert!((got[d - 1] - x).abs() <= 1e-5 * (1.0 + x.abs()), "unrotated dim: {} vs {x}", got[d - 1]);
                }
            }
        }
    }

    /// Far positions: the angle reduction must stay accurate where the drivers' sin/cos are not.
    #[test]
    fn rope_far_positions() {
        for gpu in gpu_variants() {
            let p = RopeParams::new(2, 1, 64, 10000.0, 4);
            check(&gpu, p, &[(4093, 4), (32764, 4), (131_000, 4), (1_000_000, 2)], false, 4e-6);
        }
    }

    /// The fused kernel leaves qkv and the caches exactly as rope followed by kv_cache_write.
    #[test]
    fn rope_kv_write_equals_separate() {
        use crate::ops::attention::{kv_cache, kv_cache_write, AttnParams};
        for gpu in gpu_variants() {
            for (d, rot, norm) in [(64, 64, false), (256, 256, true), (256, 64, true)] {
                let p = RopeParams { rotary_dim: rot, ..RopeParams::new(6, 2, d, 10000.0, 5) };
                let ap = AttnParams {
                    heads: 6,
                    kv_heads: 2,
                    head_dim: d,
                    max_ctx: 16,
                    window: 0,
                    scale: 1.0,
                    n_tokens: 5,
                    splits: 0,
                };
                let row = (p.heads + 2 * p.kv_heads) * d;
                let data = random(5 * row, 77, 2.0);
                let qn: Vec<f32> = random(d, 78, 0.5).iter().map(|w| 1.0 + w).collect();
                let qn = gpu.upload_f32("q_norm", &[d], &qn).unwrap();
                let norms = norm.then_some((&qn, &qn, 1e-6));
                let step = gpu.uniform("step", &StepParams { pos: 9, n_tokens: 4, slot: 0, _pad: 0 });
                // separate
                let a = gpu.upload_f32("qkv", &[5, row], &data).unwrap();
                let (ka, va) = kv_cache(&gpu, "a", &ap, 1).unwrap();
                let r = rope(&gpu, &a, &step, p, norms).unwrap();
                let w = kv_cache_write(&gpu, &a, &ka, &va, &step, ap).unwrap();
                gpu.run(&[&r, &w]).unwrap();
                // fused
                let b = gpu.upload_f32("qkv", &[5, row], &data).unwrap();
                let (kb, vb) = kv_cache(&gpu, "b", &ap, 1).unwrap();
                let f = rope_kv_write(&gpu, &b, &step, p, norms, &kb, &vb).unwrap();
                gpu.run(&[&f]).unwrap();
                assert_eq!(gpu.read_f32(&a).unwrap(), gpu.read_f32(&b).unwrap());
                let (ka, kb) = (gpu.read_f16(&ka).unwrap(), gpu.read_f16(&kb).unwrap());
                let (va, vb) = (gpu.read_f16(&va).unwrap(), gpu.read_f16(&vb).unwrap());
                assert!(ka.iter().zip(&kb).all(|(x, y)| x.to_bits() == y.to_bits()), "K d={d}");
                assert!(va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()), "V d={d}");
                assert!(ka.iter().any(|x| x.to_f32() != 0.0), "nothing written");
            }
        }
    }
}
