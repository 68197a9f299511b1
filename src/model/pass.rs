//! Recording one layer of a [`Plan`](super::forward::Plan): the activation buffers every plan
//! shares ([`Scratch`]), the recorded items ([`Item`]) and [`LayerPass`], which turns a layer's
//! weights and spec into its dispatches (the token mixer, the MLP, the residual adds with their
//! fused norms). The layer loop that drives it is in [`super::forward`].

use super::config::{Activation, AttentionSpec, DeltaNetSpec, Mixer, MlpSpec, ModelConfig};
use super::weights::{linear, LayerWeights, Linear, MixerWeights, MlpWeights, Proj, SharedExpert};
use crate::error::Result;
use crate::gpu::{ElemType, Gpu, Kernel, Tensor};
use crate::ops::attention::{attention, attention_batch, attention_rope, attention_staged, AttnParams};
use crate::ops::deltanet::{causal_conv1d, gated_delta_rule, rms_norm_gated, DeltaRuleArgs};
use crate::ops::elementwise::{gated_act_in, mul_sigmoid};
use crate::ops::embedding::per_layer_slot;
use crate::ops::matmul::gguf::{quantize_x16, staged_x_words, stages_apart, StageApart};
use crate::ops::matmul::{fuses_input, fuses_norm, Input, LinearOpts, MATVEC_MAX_T};
use crate::ops::moe::{
    groups_len, groups_slots, linear_experts, moe_combine, moe_group, moe_router, moe_router_shared, ExpertWeight,
    SharedExpert as MoeShared,
};
use crate::ops::norm::{rms_norm, rms_norm_residual, rms_norm_residual_staged, rms_norm_staged};
use crate::ops::rope::{inv_freq, rope, rope_batch, rope_kv_write, rope_kv_write_batch, RopeParams};

/// Slots of a Gated DeltaNet layer's state ring: the state after position p lives in slot
/// p % STATE_RING, so a rollback of fewer than STATE_RING passes finds its state intact.
pub const STATE_RING: usize = 4;

/// The activations a layer may use besides x, xn and tmp (each `[rows, widest use]`): qkv, attn,
/// gate (attention's output gate), mix / conv (Gated DeltaNet's input projection and conv),
/// gate_up / act (the dense or shared-expert MLP), router / moe_w / exp_act / exp_out (the
/// experts' router logits, routing weights, activations and outputs).
pub(crate) const ACTS: [&str; 11] =
    ["qkv", "attn", "gate", "mix", "conv", "gate_up", "act", "router", "moe_w", "exp_act", "exp_out"];

/// The activation buffers every plan shares, sized for `rows` tokens: a plan for `t <= rows`
/// tokens binds views of their first `t` rows, so memory does not grow with the number of
/// distinct prompt lengths (plans run one after another on the queue, never at once).
pub(crate) struct Scratch {
    pub(crate) rows: usize,
    pub(crate) ids: Tensor,
    /// The experts each token's MoE block picked, u32 [rows, top_k].
    pub(crate) moe_ids: Tensor,
    /// Those slots grouped by expert for prefill (`ops::moe::moe_group`'s table), u32.
    pub(crate) moe_groups: Tensor,
    /// `[rows, cols]` f32 buffers by name ([`ACTS`] and x, xn, tmp).
    pub(crate) acts: Vec<(&'static str, Tensor)>,
    pub(crate) last: Tensor,
    pub(crate) last_norm: Tensor,
    /// `[slots, vocab]`: one row per sequence of a batch step, the first for a pass of one.
    pub(crate) logits: Tensor,
    /// A batch step's (position, slot) per sequence, u32 `[slots, 2]`.
    pub(crate) seqs: Tensor,
    /// One token's x staged apart for the projections that read it so ([`stages_apart`],
    /// [`StageApart`]): u32 words.
    pub(crate) xs16: Tensor,
    /// Per-layer inputs (Gemma 4 E2B/E4B): each layer's slot of `rows` rows of [gate | input]
    /// (`ops::embedding::per_layer_inputs`), f32 `[layers * slot]`.
    pub(crate) ple_slots: Option<(Tensor, usize)>,
}

impl Scratch {
    pub(crate) fn new(g: &Gpu, c: &ModelConfig, rows: usize, slots: usize) -> Result<Scratch> {
        let h = c.hidden_size;
        // Each buffer is as wide as the widest layer needs (1 where no layer uses it).
        let mut widths: Vec<(&'static str, usize)> = vec![("x", h), ("xn", h), ("tmp", h)];
        let mut need = |name: &'static str, n: usize| match widths.iter_mut().find(|(w, _)| *w == name) {
            Some((_, m)) => *m = (*m).max(n),
            None => widths.push((name, n)),
        };
        for name in ACTS {
            need(name, 1);
        }
        for l in 0..c.num_layers() {
            let spec = c.layer(l);
            match spec.mixer {
                Mixer::Attention(a) => {
                    need("qkv", a.q_dim() + 2 * a.kv_dim());
                    need("attn", a.q_dim());
                    if a.output_gate {
                        need("gate", a.q_dim());
                    }
                }
                Mixer::DeltaNet(d) => {
                    need("mix", d.in_dim());
                    need("conv", d.conv_dim());
                    need("attn", d.value_dim());
                }
            }
            match spec.mlp {
                MlpSpec::Dense { intermediate: f, .. } => {
                    need("gate_up", 2 * f);
                    need("act", f);
                }
                MlpSpec::Moe { experts, top_k, intermediate: f, shared_intermediate: fs, .. } => {
                    // A shared expert of the experts' size takes a slot of its own.
                    let slots = top_k + usize::from(fs == f);
                    need("router", experts + 1);
                    need("moe_w", slots);
                    need("exp_act", slots * f);
                    need("exp_out", slots * h);
                    need("gate_up", 2 * fs);
                    need("act", fs);
                }
            }
        }
        if let Some(ple) = c.per_layer_input {
            need("ple_tok", c.num_layers() * ple.dim);
            need("ple_proj", c.num_layers() * ple.dim);
            need("ple_act", ple.dim);
        }
        // The widest input a projection may read staged apart: a norm's rows, an MLP's or
        // attention's output.
        let staged =
            widths.iter().filter(|(n, _)| matches!(*n, "xn" | "act" | "attn")).map(|(_, w)| *w).max().unwrap_or(32);
        let acts = widths
            .into_iter()
            .map(|(name, n)| Ok((name, g.empty(name, &[rows, n], ElemType::F32)?)))
            .collect::<Result<Vec<_>>>()?;
        // (slots a token, experts in the stack): a shared expert of the experts' size is both.
        let moe = (0..c.num_layers()).filter_map(|l| match c.layer(l).mlp {
            MlpSpec::Moe { experts, top_k, intermediate, shared_intermediate, .. } => {
                let stacked = usize::from(shared_intermediate == intermediate);
                Some((top_k + stacked, experts + stacked))
            }
            _ => None,
        });
        let (top_k, stack) = moe.fold((1, 1), |(k, e), (k2, e2)| (k.max(k2), e.max(e2)));
        Ok(Scratch {
            rows,
            ids: g.empty("ids", &[rows], ElemType::U32)?,
            moe_ids: g.empty("moe_ids", &[rows, top_k], ElemType::U32)?,
            moe_groups: g.empty("moe_groups", &[groups_len(rows * top_k, stack)], ElemType::U32)?,
            acts,
            last: g.empty("last", &[1, h], ElemType::F32)?,
            last_norm: g.empty("last_norm", &[1, h], ElemType::F32)?,
            logits: g.empty("logits", &[slots, c.vocab_size], ElemType::F32)?,
            seqs: g.empty("seqs", &[slots, 2], ElemType::U32)?,
            xs16: g.empty("xs16", &[staged_x_words(1, staged.next_multiple_of(32))], ElemType::U32)?,
            ple_slots: match c.per_layer_input {
                None => None,
                Some(ple) => {
                    let slot = per_layer_slot(rows, ple.dim);
                    Some((g.empty("ple_slots", &[c.num_layers() * slot], ElemType::F32)?, slot))
                }
            },
        })
    }

    /// The first `t` rows of the activation `name`.
    pub(crate) fn rows(&self, name: &str, t: usize) -> Tensor {
        let (_, a) = self.acts.iter().find(|(n, _)| *n == name).expect("a scratch activation");
        let cols = a.shape[1];
        a.view(0, &[t, cols])
    }

    /// The first `t` rows of `name` seen as `shape` (a row of `cols` read as several).
    pub(crate) fn rows_as(&self, name: &str, t: usize, shape: &[usize]) -> Tensor {
        let v = self.rows(name, t);
        debug_assert!(shape.iter().product::<usize>() <= v.numel());
        v.view(0, shape)
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.acts.iter().map(|(_, a)| a.size_bytes()).sum::<u64>()
            + [
                &self.ids,
                &self.moe_ids,
                &self.moe_groups,
                &self.last,
                &self.last_norm,
                &self.logits,
                &self.seqs,
                &self.xs16,
            ]
            .iter()
            .map(|t| t.size_bytes())
            .sum::<u64>()
            + self.ple_slots.as_ref().map_or(0, |(t, _)| t.size_bytes())
    }
}

pub(crate) enum Item {
    Kernel(Kernel),
    /// Copy of `bytes` between buffers (ends the compute pass).
    Copy {
        src: Tensor,
        dst: Tensor,
    },
}

/// The projections that read a layer's normed input for its token mixer, all from one staging
/// ([`LayerPass::staged`]): attention's q/k/v and output gate; none for Gated DeltaNet, whose
/// in_proj reads its input as it is.
pub(crate) fn mixer_readers(m: &MixerWeights) -> Vec<&Linear> {
    match m {
        MixerWeights::Attention { qkv, gate, .. } => qkv.weights().chain(gate.iter()).collect(),
        MixerWeights::DeltaNet { .. } => Vec::new(),
    }
}

/// The same for its MLP: a dense MLP's gate_up; none for experts, whose router reads its input
/// as it is.
pub(crate) fn mlp_readers(m: &MlpWeights) -> Vec<&Linear> {
    match m {
        MlpWeights::Dense { gate_up, .. } => gate_up.weights().collect(),
        MlpWeights::Moe { .. } => Vec::new(),
    }
}

/// A layer's last projection, not yet added to the residual stream: what [`LayerPass::residual`]
/// records as `x += y` (fused into the projection) or `x += norm(y)` (a sandwich norm).
pub(crate) enum Output<'a> {
    /// `x (+)= input(from) · Wᵀ` with this weight.
    Linear { from: Tensor, input: Input<'a>, w: &'a Linear },
    /// A block whose kernels already added their result to x (the MoE combine).
    Added,
}

/// What recording one layer needs: the scratch views for `t` tokens and the shared uniforms.
pub(crate) struct LayerPass<'a> {
    pub(crate) g: &'a Gpu,
    pub(crate) s: &'a Scratch,
    pub(crate) t: usize,
    pub(crate) eps: f32,
    pub(crate) x: &'a Tensor,
    pub(crate) xn: &'a Tensor,
    pub(crate) tmp: &'a Tensor,
    pub(crate) step: &'a wgpu::Buffer,
    pub(crate) max_ctx: usize,
    /// A decode step of many sequences: token t is sequence t, at the (position, slot) of row t
    /// (u32 `[t, 2]`).
    pub(crate) seqs: Option<Tensor>,
    /// The norm weight xn already holds x under (a post-norm's residual add wrote it in the same
    /// dispatch: [`LayerPass::residual_scaled`]'s `next`), for the next [`LayerPass::normed`].
    pub(crate) xn_for: std::cell::RefCell<Option<Tensor>>,
    /// The activation whose rows the dispatch that wrote them also staged into the scratch's xs16,
    /// for the next projection that reads it ([`LayerPass::staged`]; taken by the first reader).
    pub(crate) xs_of: std::cell::RefCell<Option<Tensor>>,
    /// The model's (the tuning's [`StageApart::rule`]).
    pub(crate) stage_apart: StageApart,
    /// The model's (the tuning's `norms_apart` knob).
    pub(crate) norms_apart: bool,
    /// A batch step's rows in the one-token form ([`LinearOpts::one_token`]).
    pub(crate) one_token: bool,
}

impl<'a> LayerPass<'a> {
    /// Linear options for this pass: a batch's rows independent of the batch size
    /// ([`LinearOpts::batch`]), in the model's [`BatchForm`](super::forward::BatchForm).
    pub(crate) fn opts(&self) -> LinearOpts {
        let batch = self.seqs.is_some();
        LinearOpts { batch, one_token: batch && self.one_token, ..Default::default() }
    }

    /// The input of projections by `ws` from `x`: staged apart once for all of them where each
    /// reads its rows that way (one token, [`stages_apart`]): by the dispatch that wrote x
    /// ([`Self::xs_of`]) or by [`quantize_x16`] recorded here; else `input` as it is.
    pub(crate) fn staged(
        &self,
        k: &mut Vec<Kernel>,
        x: &Tensor,
        input: Input<'a>,
        ws: &[&Linear],
    ) -> Result<Input<'a>> {
        let s: &'a Scratch = self.s;
        let ready = self.xs_of.borrow_mut().take().is_some_and(|t| t.starts_with(x));
        if !matches!(input, Input::Plain) || !self.stages_all(ws, x.shape[1], ready) {
            return Ok(input);
        }
        if !ready {
            k.push(quantize_x16(self.g, x, &s.xs16)?);
        }
        Ok(Input::Staged(&s.xs16))
    }

    /// Whether the layers' norms are fused into the projections after them ([`fuses_norm`], unless
    /// the tuning's `norms_apart` knob).
    pub(crate) fn fuses_norm(&self) -> bool {
        fuses_norm(self.t, self.x.shape[1]) && !self.norms_apart
    }

    /// Whether every one of `ws` (rows of `k`) reads one token's x staged apart ([`stages_apart`];
    /// `free`: the staging costs no dispatch of its own).
    pub(crate) fn stages_all(&self, ws: &[&Linear], k: usize, free: bool) -> bool {
        let rule = self.stage_apart;
        let min_k = if free { rule.free_k } else { rule.k };
        let apart = |w: &&Linear| matches!(w, Linear::Quant(q) if stages_apart(self.g, q.dtype, self.t, k, min_k));
        let rows: usize = ws.iter().map(|w| w.shape()[0]).sum();
        !self.opts().batch && !ws.is_empty() && ws.iter().all(apart) && (!free || rows >= rule.free_n)
    }

    /// `[t, n]` rows of the scratch activation `name`.
    pub(crate) fn act(&self, name: &str, n: usize) -> Tensor {
        self.s.rows_as(name, self.t, &[self.t, n])
    }

    /// The input of a projection that starts from the residual stream under the norm `w`: the
    /// norm fused into the matvec up to MATVEC_MAX_T tokens, else run into xn first, staging xn
    /// where `readers` (the projections that read it) read it staged apart.
    pub(crate) fn normed(
        &self,
        k: &mut Vec<Kernel>,
        w: &'a Tensor,
        readers: &[&Linear],
    ) -> Result<(Tensor, Input<'a>)> {
        let ready = self.xn_for.borrow_mut().take();
        // xs16 holds xn staged only where xn is what the residual add wrote.
        let staged = self.xs_of.borrow_mut().take();
        if self.fuses_norm() {
            Ok((self.x.clone(), Input::Norm { weight: w, eps: self.eps }))
        } else if ready.is_some_and(|r| r.starts_with(w)) {
            // The residual add before wrote xn under this weight.
            *self.xs_of.borrow_mut() = staged;
            Ok((self.xn.clone(), Input::Plain))
        } else if self.stages_all(readers, self.x.shape[1], true) {
            let s: &'a Scratch = self.s;
            k.push(rms_norm_staged(self.g, self.x, w, self.xn, self.eps, &s.xs16)?);
            *self.xs_of.borrow_mut() = Some(self.xn.clone());
            Ok((self.xn.clone(), Input::Plain))
        } else {
            k.push(rms_norm(self.g, self.x, w, self.xn, self.eps, false)?);
            Ok((self.xn.clone(), Input::Plain))
        }
    }

    /// x under the output norm for lm_head: fused into its matvec, else run into xn first.
    pub(crate) fn normed_out(&self, items: &mut Vec<Item>, w: &'a Tensor) -> Result<(Tensor, Input<'a>)> {
        let mut k = Vec::new();
        let r = self.normed(&mut k, w, &[])?;
        items.extend(k.into_iter().map(Item::Kernel));
        Ok(r)
    }

    /// Adds a block's output to x: the residual add fused into its last projection, or through
    /// the post-norm (`x += norm(y)`).
    pub(crate) fn residual(&self, k: &mut Vec<Kernel>, out: Output<'a>, post_norm: Option<&Tensor>) -> Result<()> {
        self.residual_scaled(k, out, post_norm, 1.0, None, &[])
    }

    /// [`Self::residual`], then x scaled by the layer's output scale (fused into the post-norm;
    /// the loader refuses a scale without one). With a post-norm and `next` (the weight of the
    /// norm the next projection starts with), where that norm runs as a dispatch of its own (long
    /// rows: [`fuses_norm`]), the same dispatch also writes xn = norm(x) · next for it, and stages
    /// xn into xs16 where `next_ws` (the projections that read xn) read it staged apart. The
    /// output's own projection reads `from` staged apart where [`Self::staged`] says so.
    pub(crate) fn residual_scaled(
        &self,
        k: &mut Vec<Kernel>,
        out: Output<'a>,
        post_norm: Option<&Tensor>,
        scale: f32,
        next: Option<&Tensor>,
        next_ws: &[&Linear],
    ) -> Result<()> {
        let Output::Linear { from, input, w } = out else {
            assert_eq!(scale, 1.0, "an output scale needs the block's post-norm");
            return Ok(());
        };
        let input = self.staged(k, &from, input, &[w])?;
        match post_norm {
            Some(pn) => {
                k.push(linear(self.g, &from, input, w, None, self.tmp, self.opts())?);
                let next = next.filter(|_| !self.fuses_norm());
                // The next norm's rows staged too where its projections read them that way.
                let h = self.x.shape[1];
                let stage = next.is_some() && self.stages_all(next_ws, h, true);
                k.push(match next {
                    Some(nw) if stage => {
                        let s: &'a Scratch = self.s;
                        rms_norm_residual_staged(self.g, self.tmp, pn, self.x, self.eps, scale, (nw, self.xn), &s.xs16)?
                    }
                    _ => rms_norm_residual(self.g, self.tmp, pn, self.x, self.eps, scale, next.map(|w| (w, self.xn)))?,
                });
                *self.xn_for.borrow_mut() = next.cloned();
                *self.xs_of.borrow_mut() = stage.then(|| self.xn.clone());
            }
            None => {
                assert_eq!(scale, 1.0, "an output scale needs the block's post-norm");
                k.push(linear(self.g, &from, input, w, None, self.x, LinearOpts { accumulate: true, ..self.opts() })?)
            }
        }
        Ok(())
    }

    /// Softmax attention: qkv projection → rope (+ q/k norm) and KV write → attention (→ output
    /// gate); returns o_proj.
    pub(crate) fn attention(
        &self,
        k: &mut Vec<Kernel>,
        a: &AttentionSpec,
        lw: &'a LayerWeights,
        kc: &Tensor,
        vc: &Tensor,
    ) -> Result<Output<'a>> {
        let MixerWeights::Attention { qkv: qkv_w, qkv_bias, qk_norm, gate, out } = &lw.mixer else {
            unreachable!("attention weights")
        };
        let (g, t) = (self.g, self.t);
        let qkv = self.act("qkv", a.q_dim() + 2 * a.kv_dim());
        let attn = self.act("attn", a.q_dim());
        let readers = mixer_readers(&lw.mixer);
        let (xin, input) = self.normed(k, &lw.attn_norm, &readers)?;
        let input = self.staged(k, &xin, input, &readers)?;
        if a.qkv_dim() != a.q_dim() + 2 * a.kv_dim() {
            // [q | k] (the cache write takes v from k) or [q] (the layer reads another's cache)
            // into the rows' first columns.
            let qk = qkv.view(0, &[t, a.qkv_dim()]);
            let opts = LinearOpts { ld_out: Some(a.q_dim() + 2 * a.kv_dim()), ..self.opts() };
            k.extend(qkv_w.linear(g, &xin, input, qkv_bias.as_ref(), &qk, opts)?);
        } else {
            k.extend(qkv_w.linear(g, &xin, input, qkv_bias.as_ref(), &qkv, self.opts())?);
        }
        let rp = RopeParams {
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            rotary_dim: a.rope.rotary_dim,
            theta: a.rope.theta,
            scaling: a.rope.scaling,
            n_tokens: t,
            proportional: a.rope.proportional,
            // The cache write's options; a layer reading another's cache writes none.
            k_eq_v: a.k_eq_v && a.kv_from.is_none(),
            v_norm: a.v_norm && a.kv_from.is_none(),
            q_only: a.kv_from.is_some(),
        };
        let qk = qk_norm.as_ref().map(|(q, kk)| (q, kk, self.eps));
        let ap = AttnParams {
            heads: a.heads,
            kv_heads: a.kv_heads,
            head_dim: a.head_dim,
            max_ctx: self.max_ctx,
            window: a.window.unwrap_or(0) as usize,
            scale: a.scale,
            n_tokens: t,
            splits: 0,
        };
        // One decode token a sequence without q/k norm (full rotary): the rotation and the cache
        // write happen inside attention (a dispatch fewer); else rope (+ q/k norm) writes the
        // caches.
        let fused_rope = qk.is_none()
            && a.rope.rotary_dim == a.head_dim
            && !a.rope.proportional
            && !a.k_eq_v
            && !a.v_norm
            && a.kv_from.is_none();
        // The rotation's inverse frequencies where attention rotates q and k itself (one decode
        // token a sequence).
        let rope_table =
            || g.upload_f32("rope.inv_freq", &[a.head_dim / 2], &inv_freq(a.head_dim, a.rope.theta, a.rope.scaling));
        if a.kv_from.is_some() {
            // Only q to rotate: the keys and values are another layer's, already cached.
            k.push(match &self.seqs {
                Some(seqs) => rope_batch(g, &qkv, self.step, seqs, rp, qk)?,
                None => rope(g, &qkv, self.step, rp, qk)?,
            });
            k.extend(match &self.seqs {
                Some(seqs) => attention_batch(g, &qkv, kc, vc, &attn, self.step, seqs, ap, None)?,
                None => attention(g, &qkv, kc, vc, &attn, self.step, ap)?,
            });
        } else if let Some(seqs) = &self.seqs {
            if fused_rope {
                let table = rope_table()?;
                k.extend(attention_batch(g, &qkv, kc, vc, &attn, self.step, seqs, ap, Some(&table))?);
            } else {
                k.push(rope_kv_write_batch(g, &qkv, self.step, seqs, rp, qk, kc, vc)?);
                k.extend(attention_batch(g, &qkv, kc, vc, &attn, self.step, seqs, ap, None)?);
            }
        } else {
            // One token: with fused rope the rotation and cache write happen inside attention,
            // else rope (+ q/k norm) writes the caches first.
            let table = match t == 1 && fused_rope {
                true => Some(rope_table()?),
                false => {
                    k.push(rope_kv_write(g, &qkv, self.step, rp, qk, kc, vc)?);
                    None
                }
            };
            // The output staged for the o projection by the decode kernel itself, where that
            // projection reads it so (no output gate to change it first).
            let s: &'a Scratch = self.s;
            let staged = match gate.is_none() && self.stages_all(&[out], a.q_dim(), true) {
                true => attention_staged(g, &qkv, kc, vc, &attn, self.step, ap, table.as_ref(), &s.xs16)?,
                false => None,
            };
            match (staged, &table) {
                (Some(kernels), _) => {
                    k.extend(kernels);
                    *self.xs_of.borrow_mut() = Some(attn.clone());
                }
                (None, Some(table)) => k.extend(attention_rope(g, &qkv, kc, vc, &attn, self.step, ap, table)?),
                (None, None) => k.extend(attention(g, &qkv, kc, vc, &attn, self.step, ap)?),
            }
        }
        if let Some(gate_w) = gate {
            // attn *= sigmoid(x · Wgᵀ): the gate's projection, then the product.
            let gt = self.act("gate", a.q_dim());
            k.push(linear(g, &xin, input, gate_w, None, &gt, self.opts())?);
            k.push(mul_sigmoid(g, &attn, &gt)?);
        }
        Ok(Output::Linear { from: attn, input: Input::Plain, w: out })
    }

    /// A layer's per-layer input (Gemma 4 E2B/E4B): its gate projection of x into the first half
    /// of its slot's rows ([gate | input], the input written before the layers), then the
    /// projection of `act(gate) · input`; returns that projection (added to x through the post
    /// norm and the layer's output scale).
    pub(crate) fn per_layer_input(
        &self,
        k: &mut Vec<Kernel>,
        (gate, proj, _): &'a (Linear, Linear, Tensor),
        slot: Tensor,
    ) -> Result<Output<'a>> {
        let (g, t, p) = (self.g, self.t, gate.shape()[0]);
        let gate_out = slot.view(0, &[t, p]);
        k.push(linear(
            g,
            self.x,
            Input::Plain,
            gate,
            None,
            &gate_out,
            LinearOpts { ld_out: Some(2 * p), ..self.opts() },
        )?);
        Ok(if fuses_input(t, p) {
            Output::Linear { from: slot, input: Input::Gated(Activation::GeluTanhGated), w: proj }
        } else {
            let act = self.act("ple_act", p);
            k.push(gated_act_in(g, &slot, &act, Activation::GeluTanhGated, false)?);
            Output::Linear { from: act, input: Input::Plain, w: proj }
        })
    }

    /// Gated DeltaNet: in_proj [qkv | z | b | a] → causal conv (+ SiLU) → gated delta rule with
    /// the gated RMSNorm; returns out_proj.
    pub(crate) fn delta_net(
        &self,
        k: &mut Vec<Kernel>,
        d: &DeltaNetSpec,
        lw: &'a LayerWeights,
        conv_state: &Tensor,
        delta_state: &Tensor,
    ) -> Result<Output<'a>> {
        let MixerWeights::DeltaNet { in_proj, conv, a_log, dt_bias, norm, out } = &lw.mixer else {
            unreachable!("delta net weights")
        };
        let (g, t) = (self.g, self.t);
        let mix = self.act("mix", d.in_dim());
        let conv_out = self.act("conv", d.conv_dim());
        let attn = self.act("attn", d.value_dim());
        let (xin, input) = self.normed(k, &lw.attn_norm, &[])?;
        k.extend(in_proj.linear(g, &xin, input, None, &mix, self.opts())?);
        let seqs = self.seqs.as_ref();
        k.push(causal_conv1d(g, &mix, d.in_dim(), conv, conv_state, &conv_out, self.step, seqs, t, STATE_RING)?);
        let (z_col, b_col) = (d.conv_dim(), d.conv_dim() + d.value_dim());
        k.push(gated_delta_rule(
            g,
            &DeltaRuleArgs {
                spec: *d,
                qkv: &conv_out,
                mix: &mix,
                ld_mix: d.in_dim(),
                b_col,
                a_col: b_col + d.v_heads,
                a_log,
                dt_bias,
                state: delta_state,
                out: &attn,
                step: self.step,
                seqs,
                n_tokens: t,
                ring: STATE_RING,
            },
        )?);
        k.push(rms_norm_gated(g, &attn, &mix, d.in_dim(), z_col, norm, d.v_heads, self.step, t, self.eps)?);
        Ok(Output::Linear { from: attn, input: Input::Plain, w: out })
    }

    /// `down(act(gate) · up)`: the activation in the gate_up matvec's epilogue where gate and up
    /// share a format (rows interleaved at load), else in the down matvec's input, else its own
    /// dispatch; returns down.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn dense_mlp(
        &self,
        k: &mut Vec<Kernel>,
        xin: &Tensor,
        input: Input<'_>,
        gate_up: &Proj,
        down: &'a Linear,
        f: usize,
        activation: Activation,
    ) -> Result<Output<'a>> {
        let (g, t) = (self.g, self.t);
        let (gu, act) = (self.act("gate_up", 2 * f), self.act("act", f));
        // A GLU weight (gate and up rows interleaved) ends its matvec in the activation; after a
        // matmul its output pairs go through gated_act.
        let glu_out = gate_up.glu && t <= MATVEC_MAX_T;
        let (gu_y, gu_opts) =
            if glu_out { (&act, LinearOpts { glu: Some(activation), ..self.opts() }) } else { (&gu, self.opts()) };
        let input = self.staged(k, xin, input, &gate_up.weights().collect::<Vec<_>>())?;
        k.extend(gate_up.linear(g, xin, input, None, gu_y, gu_opts)?);
        Ok(if glu_out {
            Output::Linear { from: act, input: Input::Plain, w: down }
        } else if fuses_input(t, f) && !gate_up.glu {
            Output::Linear { from: gu, input: Input::Gated(activation), w: down }
        } else {
            k.push(gated_act_in(g, &gu, &act, activation, gate_up.glu)?);
            Output::Linear { from: act, input: Input::Plain, w: down }
        })
    }

    /// Sparse mixture of experts with a shared expert: router logits (+ the shared expert's gate
    /// logit as one more column) → top-k on the GPU → each token's experts' gate_up (GLU) and
    /// down, read by expert id → the shared expert → x += Σ w·expert + sigmoid(gate)·shared.
    pub(crate) fn moe(&self, k: &mut Vec<Kernel>, spec: &MlpSpec, lw: &'a LayerWeights) -> Result<Output<'a>> {
        let MlpSpec::Moe { experts, top_k, intermediate: f, shared_intermediate: fs, norm_topk, activation } = *spec
        else {
            unreachable!("moe spec")
        };
        let MlpWeights::Moe { router, gate_up_exps, down_exps, shared } = &lw.mlp else { unreachable!("moe weights") };
        let (g, t, h) = (self.g, self.t, self.x.shape[1]);
        let router_cols = experts + usize::from(!matches!(shared, SharedExpert::None));
        // A stacked shared expert is slot top_k of each token (id E), weighted by its gate.
        let stacked = matches!(shared, SharedExpert::Stacked);
        let (slots, stack) = if stacked { (top_k + 1, experts + 1) } else { (top_k, experts) };
        let logits = self.act("router", router_cols);
        let ids = self.s.moe_ids.view(0, &[t, slots]);
        let weights = self.act("moe_w", slots);
        let exp_act = self.s.rows_as("exp_act", t, &[t * slots, f]);
        let exp_out = self.s.rows_as("exp_out", t, &[t * slots, h]);
        let (xin, input) = self.normed(k, &lw.ffn_norm, &[])?;
        k.extend(router.linear(g, &xin, input, None, &logits, self.opts())?);
        k.push(if stacked {
            moe_router_shared(g, &logits, router_cols, experts, top_k, &ids, &weights, norm_topk)?
        } else {
            moe_router(g, &logits, router_cols, experts, top_k, &ids, &weights, norm_topk)?
        });
        let as_stack = |w: &'a Linear| match w {
            Linear::F16(w) => ExpertWeight::F16 { w, experts: stack },
            Linear::Quant(w) => ExpertWeight::Quant { w, experts: stack },
        };
        // The selected experts' gate_up (rows interleaved per expert: the GLU epilogue) for each
        // of a token's slots, then their down projections.
        // Prefill groups the slots by expert for the quantized stacks (module docs of ops::moe):
        // the grouping once, each quantized projection reads it (f16 stacks run per slot). A batch
        // step in the batched form groups them where the tuning table says so (each expert's rows
        // read once for all the step's slots routed to it; a slot's sums the batch kernel's
        // whatever its tile), else, as in the one-token form, each slot runs as in the one-token
        // pass; the same choice at every batch size.
        let quant = |w: &Linear| matches!(w, Linear::Quant(_));
        let group = match self.seqs {
            // (The tuning table's choice, or `WGPU_LLM_MOE_GROUP`; fixed for every batch size.)
            Some(_) => !self.one_token && g.tuning().moe_batch_group(),
            None => groups_slots(t * slots, stack),
        };
        let groups = if (quant(gate_up_exps) || quant(down_exps)) && group {
            let groups = self.s.moe_groups.view(0, &[groups_len(t * slots, stack)]);
            k.push(moe_group(g, &ids, stack, &groups)?);
            Some(groups)
        } else {
            None
        };
        let grouped = |w: &Linear| groups.as_ref().filter(|_| quant(w));
        let glu = LinearOpts { glu: Some(activation), ..self.opts() };
        let (gate_up, down) = (as_stack(gate_up_exps), as_stack(down_exps));
        k.push(linear_experts(g, &xin, input, &gate_up, &ids, grouped(gate_up_exps), slots, &exp_act, glu)?);
        let plain = LinearOpts::default();
        k.push(linear_experts(g, &exp_act, Input::Plain, &down, &ids, grouped(down_exps), 1, &exp_out, plain)?);
        let shared_out = match shared {
            SharedExpert::Separate(gate_up, down) => {
                // The shared expert's output in tmp; the combine adds it under its gate.
                let out = self.tmp;
                match self.dense_mlp(k, &xin, input, gate_up, down, fs, activation)? {
                    Output::Linear { from, input, w } => {
                        k.push(linear(g, &from, input, w, None, out, self.opts())?);
                    }
                    Output::Added => unreachable!("a dense MLP ends in its down projection"),
                }
                Some(MoeShared { out, gate: &logits, gate_ld: router_cols, gate_col: experts })
            }
            SharedExpert::Stacked | SharedExpert::None => None,
        };
        k.push(moe_combine(g, &exp_out, &weights, shared_out, self.x)?);
        Ok(Output::Added)
    }
}
