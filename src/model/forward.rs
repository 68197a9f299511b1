//! The one layer loop. A [`Plan`] is the recorded forward pass for T tokens: its activation
//! buffers, bind groups and dispatches are made once and replayed; what changes per call (the
//! token ids and the [`StepParams`] uniform) is written with `queue.write_buffer`.
//!
//! Per layer (9 dispatches, +1 when attention splits its keys, +2 with sandwich norms; one decode
//! token without q/k norm rotates inside attention: -1):
//! rms_norm → qkv linear (+bias) → rope (+q/k norm) and KV-cache write → attention →
//! o linear (+= residual | → tmp, rms_norm += residual) → rms_norm → gate_up linear →
//! gated_act → down linear (+= residual | → tmp, rms_norm += residual).
//! Then the last row: output rms_norm → lm_head (one dispatch per row chunk) → logits (vocab).
//! Decode and short passes (up to `MATVEC_MAX_T` tokens) fuse the two rms_norms into the qkv
//! and gate_up matvecs and the output norm into lm_head (`ops::matmul::Input`), and gated_act
//! into the gate_up matvec's epilogue where gate and up share a format (their rows interleaved
//! at load: `LinearOpts::glu`; else into the down matvec's input): 6 dispatches a layer.

use super::config::ModelConfig;
use super::weights::{self, linear, Linear, WeightFormat, Weights};
use crate::error::{Error, Result};
use crate::gpu::{ElemType, Gpu, Kernel, Tensor};
use crate::loader::Checkpoint;
use crate::ops::attention::{attention, attention_rope, AttnParams};
use crate::ops::elementwise::gated_act_in;
use crate::ops::embedding::{embedding, embedding_quant};
use crate::ops::matmul::{fuses_input, Input, LinearOpts, MATVEC_MAX_T};
use crate::ops::norm::rms_norm;
use crate::ops::rope::{inv_freq, rope_kv_write, RopeParams};
use crate::ops::StepParams;
use std::collections::HashMap;

/// Default maximum tokens per prefill pass: longer prompts run in chunks of this size.
pub const PREFILL_CHUNK: usize = 512;

/// Most plans kept at once (the one-token plan is never evicted): prompts of many distinct
/// lengths replace the least recently used plan instead of adding one each.
pub const MAX_PLANS: usize = 8;

/// The activation buffers every plan shares, sized for `rows` tokens: a plan for `t <= rows`
/// tokens binds views of their first `t` rows, so memory does not grow with the number of
/// distinct prompt lengths (plans run one after another on the queue, never at once).
struct Scratch {
    rows: usize,
    ids: Tensor,
    /// `[rows, cols]` f32 buffers by name: x, xn, qkv, attn, gate_up, act, tmp.
    acts: Vec<(&'static str, Tensor)>,
    last: Tensor,
    last_norm: Tensor,
    logits: Tensor,
}

impl Scratch {
    fn new(g: &Gpu, c: &ModelConfig, rows: usize) -> Result<Scratch> {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let cols = [
            ("x", h),
            ("xn", h),
            ("qkv", c.q_dim() + 2 * c.kv_dim()),
            ("attn", c.q_dim()),
            ("gate_up", 2 * f),
            ("act", f),
            ("tmp", h),
        ];
        let acts = cols
            .into_iter()
            .map(|(name, n)| Ok((name, g.empty(name, &[rows, n], ElemType::F32)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Scratch {
            rows,
            ids: g.empty("ids", &[rows], ElemType::U32)?,
            acts,
            last: g.empty("last", &[1, h], ElemType::F32)?,
            last_norm: g.empty("last_norm", &[1, h], ElemType::F32)?,
            logits: g.empty("logits", &[c.vocab_size], ElemType::F32)?,
        })
    }

    /// The first `t` rows of the activation `name`.
    fn rows(&self, name: &str, t: usize) -> Tensor {
        let (_, a) = self.acts.iter().find(|(n, _)| *n == name).expect("a scratch activation");
        let cols = a.shape[1];
        a.view(0, &[t, cols])
    }

    fn bytes(&self) -> u64 {
        self.acts.iter().map(|(_, a)| a.size_bytes()).sum::<u64>()
            + [&self.ids, &self.last, &self.last_norm, &self.logits].iter().map(|t| t.size_bytes()).sum::<u64>()
    }
}

enum Item {
    Kernel(Kernel),
    /// Copy of `bytes` between buffers (ends the compute pass).
    Copy {
        src: Tensor,
        dst: Tensor,
    },
}

/// One dispatch's median GPU time in [`Model::profile_step`].
#[derive(Clone, Debug)]
pub struct DispatchTime {
    /// `shader:entry`.
    pub name: String,
    /// Its variant flags ([`Kernel::variant`]).
    pub variant: String,
    pub workgroups: [u32; 3],
    pub us: f64,
}

/// The recorded forward pass for `t` tokens.
pub struct Plan {
    pub t: usize,
    /// Token ids in, u32 [t].
    pub ids: Tensor,
    /// Last-position logits out, f32 [vocab].
    pub logits: Tensor,
    items: Vec<Item>,
    /// When the plan was last staged (the [`Model`]'s use counter), for eviction.
    last_used: u64,
}

impl Plan {
    pub fn dispatches(&self) -> usize {
        self.items.iter().filter(|i| matches!(i, Item::Kernel(_))).count()
    }

    /// Whether the plan is one compute pass (no copies: every one-token plan), so that
    /// [`encode_pass`](Self::encode_pass) can record it into a pass the caller shares with more
    /// work (a decode step's sampler).
    pub fn is_single_pass(&self) -> bool {
        self.items.iter().all(|i| matches!(i, Item::Kernel(_)))
    }

    /// Records a single-pass plan's dispatches into `pass`.
    pub fn encode_pass(&self, pass: &mut wgpu::ComputePass<'_>) {
        assert!(self.is_single_pass(), "a plan with copies needs its own encoder: use encode");
        for item in &self.items {
            if let Item::Kernel(k) = item {
                k.encode(pass);
            }
        }
    }

    /// Encodes the pass into `enc` (compute passes split around copies).
    pub fn encode(&self, enc: &mut wgpu::CommandEncoder) {
        let mut i = 0;
        while i < self.items.len() {
            {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("forward"),
                    timestamp_writes: None,
                });
                while let Some(Item::Kernel(k)) = self.items.get(i) {
                    k.encode(&mut pass);
                    i += 1;
                }
            }
            while let Some(Item::Copy { src, dst }) = self.items.get(i) {
                enc.copy_buffer_to_buffer(&src.buffer, src.offset, &dst.buffer, dst.offset, src.size_bytes());
                i += 1;
            }
        }
    }
}

pub struct Model {
    pub gpu: Gpu,
    pub config: ModelConfig,
    pub weights: Weights,
    /// (K, V) cache per layer, f16 [Hkv, max_ctx, D] each.
    kv: Vec<(Tensor, Tensor)>,
    pub max_ctx: usize,
    /// The [`StepParams`] uniform.
    step: wgpu::Buffer,
    plans: HashMap<usize, Plan>,
    /// Use counter for the plans' least-recently-used eviction.
    uses: u64,
    scratch: Option<Scratch>,
    /// Tokens already in the KV cache.
    pub pos: usize,
    pub prefill_chunk: usize,
}

impl Model {
    /// Uploads the checkpoint's weights and allocates a KV cache of `ctx` positions (default:
    /// the model's maximum, capped at 4096).
    pub fn load(
        gpu: &Gpu,
        ck: &Checkpoint,
        ctx: Option<usize>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        Self::load_with(gpu, ck, ctx, WeightFormat::Native, progress)
    }

    /// [`load`](Self::load) with linear weights in `format` (dequantized to f16, or float weights
    /// quantized at load: [`WeightFormat`]).
    pub fn load_with(
        gpu: &Gpu,
        ck: &Checkpoint,
        ctx: Option<usize>,
        format: WeightFormat,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let config = ck.config.clone();
        let max_ctx = ctx.unwrap_or(config.max_position_embeddings.min(4096));
        if max_ctx == 0 || max_ctx > config.max_position_embeddings {
            return Err(Error::InvalidArgument(format!(
                "context length {max_ctx} is outside 1..={} for this model",
                config.max_position_embeddings
            )));
        }
        // The KV cache is one f16 [Hkv, ctx, D] buffer per layer and K/V: check it against the
        // device's binding limit before the weights upload, in the user's terms.
        let per_pos = (config.num_kv_heads * config.head_dim * 2) as u64;
        let max_bind = gpu.limits.max_storage_buffer_binding_size;
        if per_pos > 0 && max_ctx as u64 * per_pos > max_bind {
            return Err(Error::InvalidArgument(format!(
                "a context of {max_ctx} tokens needs {} MiB of KV cache per layer, more than this GPU binds \
                 ({} MiB): lower --ctx to at most {}",
                (max_ctx as u64 * per_pos) >> 20,
                max_bind >> 20,
                max_bind / per_pos
            )));
        }
        let weights = weights::load(gpu, ck, format, progress)?;
        let kv_shape = [config.num_kv_heads, max_ctx, config.head_dim];
        let kv = (0..config.num_layers)
            .map(|l| {
                Ok((
                    gpu.empty(&format!("k_cache.{l}"), &kv_shape, ElemType::F16)?,
                    gpu.empty(&format!("v_cache.{l}"), &kv_shape, ElemType::F16)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let step = gpu.uniform("step", &StepParams::default());
        Ok(Model {
            gpu: gpu.clone(),
            config,
            weights,
            kv,
            max_ctx,
            step,
            plans: HashMap::new(),
            uses: 0,
            scratch: None,
            pos: 0,
            prefill_chunk: PREFILL_CHUNK,
        })
    }

    /// Forgets the sequence (the KV cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Forgets the positions from `pos` on (tokens a pipelined loop ran past a stop): later
    /// passes overwrite their KV entries, and attention never reads past the current position.
    pub fn rollback(&mut self, pos: usize) {
        assert!(pos <= self.pos, "rollback to {pos} past the current position {}", self.pos);
        self.pos = pos;
    }

    /// Checks that `n` more tokens fit the context at the current position.
    pub fn check_room(&self, n: usize) -> Result<()> {
        if self.pos + n > self.max_ctx {
            return Err(Error::InvalidArgument(format!(
                "{n} tokens at position {} exceed the context of {} tokens (raise --ctx, up to {})",
                self.pos, self.max_ctx, self.config.max_position_embeddings
            )));
        }
        Ok(())
    }

    /// Makes the next pass run `n` tokens at the current position: records the plan for `n`
    /// on first use, writes the step uniform (`queue.write_buffer`: ordered before the next
    /// submission, after the ones before) and advances the position. The caller writes the ids
    /// (or has the sampler write them on the GPU) and encodes the returned plan.
    pub fn stage(&mut self, n: usize) -> Result<&Plan> {
        self.check_room(n)?;
        self.plan(n)?;
        let step = StepParams { pos: self.pos as u32, n_tokens: n as u32, _pad: [0; 2] };
        self.gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&step));
        self.pos += n;
        Ok(&self.plans[&n])
    }

    /// Runs the one-token step `reps` times with every dispatch in a compute pass of its own
    /// between two timestamps, and returns each dispatch's median GPU time, in plan order: where a
    /// decode step's time goes. A pass per dispatch adds a little to each, so the sum is a bit
    /// above the fused step's time; the split is what counts. The position is restored.
    pub fn profile_step(&mut self, reps: usize) -> Result<Vec<DispatchTime>> {
        if !self.gpu.caps.timestamps {
            return Err(Error::Unsupported("profiling needs timestamp queries, which this adapter lacks".into()));
        }
        let pos = self.pos;
        self.stage(1)?;
        self.rollback(pos);
        let n = self.plans[&1].dispatches();
        let queries = 2 * n as u32;
        if queries > wgpu::QUERY_SET_MAX_QUERIES {
            return Err(Error::Unsupported(format!("{n} dispatches are more than one query set can time")));
        }
        let gpu = self.gpu.clone();
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("profile"),
            ty: wgpu::QueryType::Timestamp,
            count: queries,
        });
        let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("profile resolved"),
            size: 8 * u64::from(queries),
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let period_us = f64::from(gpu.queue.get_timestamp_period()) / 1e3;
        let mut times = vec![Vec::with_capacity(reps); n];
        for _ in 0..reps.max(1) {
            let plan = self.stage(1)?;
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            let kernels = plan.items.iter().filter_map(|i| if let Item::Kernel(k) = i { Some(k) } else { None });
            for (i, k) in kernels.enumerate() {
                let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                        query_set: &set,
                        beginning_of_pass_write_index: Some(2 * i as u32),
                        end_of_pass_write_index: Some(2 * i as u32 + 1),
                    }),
                });
                k.encode(&mut pass);
            }
            enc.resolve_query_set(&set, 0..queries, &resolve, 0);
            gpu.queue.submit([enc.finish()]);
            let bytes = gpu.read_bytes(&resolve, 0, 8 * u64::from(queries));
            self.rollback(pos);
            let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&bytes?);
            for (i, t) in times.iter_mut().enumerate() {
                t.push(ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period_us);
            }
        }
        let plan = &self.plans[&1];
        let kernels = plan.items.iter().filter_map(|i| if let Item::Kernel(k) = i { Some(k) } else { None });
        Ok(kernels
            .zip(times)
            .map(|(k, mut t)| {
                t.sort_by(f64::total_cmp);
                DispatchTime {
                    name: k.name.clone(),
                    variant: k.variant.clone(),
                    workgroups: k.workgroups,
                    us: t[t.len() / 2],
                }
            })
            .collect())
    }

    /// The plan for `t` tokens, recorded on first use. At most [`MAX_PLANS`] are kept (the
    /// least recently used one goes first; never the one-token plan), and all of them share one
    /// set of activation buffers, sized for the longest plan yet (at least a prefill chunk).
    pub fn plan(&mut self, t: usize) -> Result<&Plan> {
        if t == 0 {
            return Err(Error::InvalidArgument("a plan needs at least one token".into()));
        }
        self.uses += 1;
        if !self.plans.contains_key(&t) {
            if self.scratch.as_ref().is_none_or(|s| s.rows < t) {
                // Plans bind the old buffers: record them again on the new ones (the old ones are
                // freed first, so both sets are never held at once).
                self.plans.clear();
                self.scratch = None;
                self.scratch = Some(Scratch::new(&self.gpu, &self.config, t.max(self.prefill_chunk))?);
            }
            while self.plans.len() >= MAX_PLANS {
                let oldest =
                    self.plans.iter().filter(|(&n, _)| n != 1).min_by_key(|(_, p)| p.last_used).map(|(&n, _)| n);
                self.plans.remove(&oldest.expect("MAX_PLANS > 1"));
            }
            let p = self.record(t)?;
            self.plans.insert(t, p);
        }
        let p = self.plans.get_mut(&t).expect("recorded above");
        p.last_used = self.uses;
        Ok(p)
    }

    /// (plans cached, bytes of the activation buffers they share).
    pub fn plan_cache(&self) -> (usize, u64) {
        (self.plans.len(), self.scratch.as_ref().map_or(0, Scratch::bytes))
    }

    /// Runs `tokens` at positions `pos..pos + len` and leaves the last position's logits on the
    /// GPU (returned: f32 [vocab]). Work is submitted, not waited for.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Tensor> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to run".into()));
        }
        self.check_room(tokens.len())?;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        let mut logits = None;
        let gpu = self.gpu.clone();
        for chunk in tokens.chunks(self.prefill_chunk) {
            let plan = self.stage(chunk.len())?;
            gpu.queue.write_buffer(&plan.ids.buffer, plan.ids.offset, bytemuck::cast_slice(chunk));
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            plan.encode(&mut enc);
            gpu.queue.submit([enc.finish()]);
            logits = Some(plan.logits.clone());
        }
        self.gpu.check()?;
        Ok(logits.expect("at least one chunk"))
    }

    fn record(&self, t: usize) -> Result<Plan> {
        let g = &self.gpu;
        let c = &self.config;
        let w = &self.weights;
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let s = self.scratch.as_ref().expect("plan() sizes the scratch buffers");
        let ids = s.ids.view(0, &[t]);
        let [x, xn, qkv, attn, gu, act, tmp] =
            ["x", "xn", "qkv", "attn", "gate_up", "act", "tmp"].map(|name| s.rows(name, t));
        let (last, last_n, logits) = (s.last.clone(), s.last_norm.clone(), s.logits.clone());

        let mut items = Vec::new();
        let mut k = |kernel: Kernel| items.push(Item::Kernel(kernel));
        for (row_start, chunk) in &w.embed {
            k(match chunk {
                Linear::F16(t) => embedding(g, t, *row_start, &ids, &x, c.embedding_scale)?,
                Linear::Quant(q) => embedding_quant(g, q, *row_start, &ids, &x, c.embedding_scale)?,
            });
        }
        let norm = |x: &Tensor, wt: &Tensor, out: &Tensor, accumulate: bool| {
            rms_norm(g, x, wt, out, c.rms_norm_eps, accumulate)
        };
        let plain = LinearOpts { accumulate: false, ld_out: None, glu: None };
        let residual = LinearOpts { accumulate: true, ld_out: None, glu: None };
        // Up to MATVEC_MAX_T tokens the RMSNorm before a projection and the gated activation
        // before the down projection run inside the projection's matvec (one dispatch each
        // fewer); prefill runs them as ops of their own.
        let eps = c.rms_norm_eps;
        let (fuse_norm, fuse_act) = (fuses_input(t, h), fuses_input(t, f));
        for (l, lw) in w.layers.iter().enumerate() {
            let (kc, vc) = &self.kv[l];
            let sliding = match c.layer_attention[l] {
                super::config::LayerAttention::Full => None,
                super::config::LayerAttention::Sliding { window } => Some(window),
            };
            let qkv_kernels = if fuse_norm {
                lw.qkv.linear(g, &x, Input::Norm { weight: &lw.attn_norm, eps }, lw.qkv_bias.as_ref(), &qkv, plain)?
            } else {
                k(norm(&x, &lw.attn_norm, &xn, false)?);
                lw.qkv.linear(g, &xn, Input::Plain, lw.qkv_bias.as_ref(), &qkv, plain)?
            };
            qkv_kernels.into_iter().for_each(&mut k);
            let rp = RopeParams {
                heads: c.num_heads,
                kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                theta: if sliding.is_some() { c.rope_local_theta.unwrap_or(c.rope_theta) } else { c.rope_theta },
                scaling: if sliding.is_some() { 1.0 } else { c.rope_scaling_factor },
                n_tokens: t,
            };
            let qk = lw.qk_norm.as_ref().map(|(q, kk)| (q, kk, c.rms_norm_eps));
            let ap = AttnParams {
                heads: c.num_heads,
                kv_heads: c.num_kv_heads,
                head_dim: c.head_dim,
                max_ctx: self.max_ctx,
                window: sliding.unwrap_or(0) as usize,
                scale: c.attention_scale,
                n_tokens: t,
                splits: 0,
            };
            // One decode token without q/k norm: the rotation and the cache write happen inside
            // attention (a dispatch fewer); else rope (+ q/k norm) writes the caches first.
            let attn_kernels = if t == 1 && qk.is_none() {
                let table =
                    g.upload_f32("rope.inv_freq", &[c.head_dim / 2], &inv_freq(c.head_dim, rp.theta, rp.scaling))?;
                attention_rope(g, &qkv, kc, vc, &attn, &self.step, ap, &table)?
            } else {
                k(rope_kv_write(g, &qkv, &self.step, rp, qk, kc, vc)?);
                attention(g, &qkv, kc, vc, &attn, &self.step, ap)?
            };
            attn_kernels.into_iter().for_each(&mut k);
            match &lw.post_attn_norm {
                Some(pn) => {
                    k(linear(g, &attn, Input::Plain, &lw.attn_out, None, &tmp, plain)?);
                    k(norm(&tmp, pn, &x, true)?);
                }
                None => k(linear(g, &attn, Input::Plain, &lw.attn_out, None, &x, residual)?),
            }
            // A GLU weight (gate and up rows interleaved) ends its matvec in the activation; after
            // a matmul its output pairs go through gated_act.
            let glu_out = lw.gate_up.glu && t <= MATVEC_MAX_T;
            let (gu_y, gu_opts) =
                if glu_out { (&act, LinearOpts { glu: Some(c.activation), ..plain }) } else { (&gu, plain) };
            let gate_up_kernels = if fuse_norm {
                lw.gate_up.linear(g, &x, Input::Norm { weight: &lw.ffn_norm, eps }, None, gu_y, gu_opts)?
            } else {
                k(norm(&x, &lw.ffn_norm, &xn, false)?);
                lw.gate_up.linear(g, &xn, Input::Plain, None, gu_y, gu_opts)?
            };
            gate_up_kernels.into_iter().for_each(&mut k);
            let (down_in, down_input) = if glu_out {
                (&act, Input::Plain)
            } else if fuse_act && !lw.gate_up.glu {
                (&gu, Input::Gated(c.activation))
            } else {
                k(gated_act_in(g, &gu, &act, c.activation, lw.gate_up.glu)?);
                (&act, Input::Plain)
            };
            match &lw.post_ffw_norm {
                Some(pn) => {
                    k(linear(g, down_in, down_input, &lw.down, None, &tmp, plain)?);
                    k(norm(&tmp, pn, &x, true)?);
                }
                None => k(linear(g, down_in, down_input, &lw.down, None, &x, residual)?),
            }
        }
        // The last row only: output norm and lm_head.
        let last_row = if t == 1 {
            x.clone()
        } else {
            items.push(Item::Copy { src: x.view((t - 1) * h, &[1, h]), dst: last.clone() });
            last.clone()
        };
        let mut k = |kernel: Kernel| items.push(Item::Kernel(kernel));
        // One row: the output norm always fuses into the lm_head's matvec when K allows.
        let (head_in, head_input) = if fuses_input(1, h) {
            (&last_row, Input::Norm { weight: &w.output_norm, eps })
        } else {
            k(rms_norm(g, &last_row, &w.output_norm, &last_n, eps, false)?);
            (&last_n, Input::Plain)
        };
        for (row_start, chunk) in &w.lm_head {
            let rows = chunk.shape()[0];
            let out = logits.view(*row_start as usize, &[1, rows]);
            k(linear(g, head_in, head_input, chunk, None, &out, plain)?);
        }
        if c.final_logit_softcapping.is_some() {
            return Err(Error::Unsupported("final logit soft-capping".into()));
        }
        Ok(Plan { t, ids, logits, items, last_used: 0 })
    }
}
