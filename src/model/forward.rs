//! The one layer loop. A [`Plan`] is the recorded forward pass for T tokens: its activation
//! buffers, bind groups and dispatches are made once and replayed; what changes per call (the
//! token ids and the [`StepParams`] uniform) is written with `queue.write_buffer`.
//!
//! Each layer runs its [`LayerSpec`](super::config::LayerSpec) ([`ModelConfig::layer`]): a token
//! mixer, then an MLP, each added to the residual stream x (through a post-norm with sandwich
//! norms). Decode and short passes (up to `MATVEC_MAX_T` tokens) fuse the RMSNorm before a
//! projection into its matvec (`ops::matmul::Input::Norm`) and the residual add into the last
//! projection; prefill runs the norm as a dispatch of its own. Per mixer / MLP, in decode:
//! - attention: qkv linear (+bias) → rope (+ q/k norm) and KV-cache write → attention (split
//!   keys: + merge) [→ gate linear → mul_sigmoid] → o linear (+= residual): 4-5, +2 with an
//!   output gate; one decode token without q/k norm rotates inside attention (rope gone);
//! - Gated DeltaNet: in_proj [qkv | z | b | a] → causal_conv1d → gated_delta_rule →
//!   rms_norm_gated → out_proj (+= residual): 5; its states live in a ring of [`STATE_RING`]
//!   states per sequence slot (a batch step's rows each read and write their own slot's);
//! - dense MLP: gate_up linear with the gated activation in its epilogue (gate and up rows
//!   interleaved at load, `LinearOpts::glu`; else in the down matvec's input) → down: 2;
//! - MoE: router linear (+ the shared expert's gate logit) → moe_router (top-k on the GPU) →
//!   experts' gate_up (GLU) → experts' down → moe_combine (+= residual): 5 (+2 for a shared expert
//!   of another size than the experts', run as its own MLP; +1 in prefill and in a batch step of
//!   the batched form: moe_group, the slots grouped by expert for the quantized experts'
//!   projections, each expert's rows read once for all its slots).
//!
//! Then the last row: output rms_norm → lm_head (one dispatch per row chunk) → logits (vocab).

use super::config::{DeltaNetSpec, Mixer, MlpSpec, ModelConfig};
pub use super::pass::STATE_RING;
use super::pass::{mixer_readers, mlp_readers, Item, LayerPass, Scratch};
use super::source::TensorSource;
use super::weights::{self, linear, Linear, MixerWeights, MlpWeights, WeightFormat, Weights};
use crate::error::{Error, Result};
use crate::gpu::{ElemType, Gpu, Kernel, Tensor};
use crate::ops::embedding::{embedding, per_layer_inputs};
use crate::ops::matmul::gguf::StageApart;
use crate::ops::matmul::{fuses_norm, Input, LinearOpts, MATVEC_MAX_T};
use crate::ops::norm::{rms_norm, rms_norm_in_place, RowLayout};
use crate::ops::StepParams;
use std::collections::HashMap;

/// Default maximum tokens per prefill pass: longer prompts run in chunks of this size.
pub const PREFILL_CHUNK: usize = 512;

/// Most plans kept at once (the one-token plan is never evicted): prompts of many distinct
/// lengths replace the least recently used plan instead of adding one each.
pub const MAX_PLANS: usize = 8;

/// What a layer keeps between passes.
enum LayerState {
    /// Keys and values, f16 [S, Hkv, max_ctx, D] each (S sequence slots).
    Kv(Tensor, Tensor),
    /// Gated DeltaNet: the conv's last inputs f32 [S·R, K-1, conv_dim] and the delta rule's state
    /// f32 [S·R, Hv, Dk, Dv]: a ring of R = [`STATE_RING`] states for each of the S sequence slots.
    Recurrent { conv: Tensor, delta: Tensor },
    /// Nothing of its own: the layer reads layer `.0`'s KV caches (Gemma 4's shared KV layers).
    Shared(usize),
}

/// A Gated DeltaNet layer's (layer `l`) state rings for `slots` sequences.
fn recurrent_state(gpu: &Gpu, l: usize, d: &DeltaNetSpec, slots: usize) -> Result<LayerState> {
    let rings = slots * STATE_RING;
    Ok(LayerState::Recurrent {
        conv: gpu.empty(&format!("conv_state.{l}"), &[rings, d.conv_kernel - 1, d.conv_dim()], ElemType::F32)?,
        delta: gpu.empty(&format!("delta_state.{l}"), &[rings, d.v_heads, d.k_dim, d.v_dim], ElemType::F32)?,
    })
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
    /// Token ids in, u32 `[t]`.
    pub ids: Tensor,
    /// Last-position logits out, f32 `[vocab]`; a batch step's: f32 `[t, vocab]`, a row per
    /// sequence.
    pub logits: Tensor,
    items: Vec<Item>,
    /// When the plan was last staged (the [`Model`]'s use counter), for eviction.
    last_used: u64,
}

impl Plan {
    pub fn dispatches(&self) -> usize {
        self.items.iter().filter(|i| matches!(i, Item::Kernel(_))).count()
    }

    /// Its kernels (`shader:entry`, variant), in dispatch order.
    pub fn kernels(&self) -> Vec<(String, String)> {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Kernel(k) => Some((k.name.clone(), k.variant.clone())),
                Item::Copy { .. } => None,
            })
            .collect()
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

    /// Writes `ids` (the plan's `t` token ids) and submits the plan in a command buffer of its
    /// own (its uniforms as last written); returns its logits.
    pub fn submit_with(&self, gpu: &Gpu, ids: &[u32]) -> Tensor {
        gpu.queue.write_buffer(&self.ids.buffer, self.ids.offset, bytemuck::cast_slice(ids));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        self.encode(&mut enc);
        gpu.queue.submit([enc.finish()]);
        self.logits.clone()
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
    /// Per layer: the (K, V) cache of an attention layer, f16 [S, Hkv, max_ctx, D] each; the
    /// recurrent state rings of a Gated DeltaNet layer (S sequence slots).
    state: Vec<LayerState>,
    /// End positions of the last passes of the model's own sequence (slot 0; most recent last, at
    /// most [`STATE_RING`]): where its recurrent states can be rolled back to.
    pass_ends: std::collections::VecDeque<usize>,
    pub max_ctx: usize,
    /// The [`StepParams`] uniform.
    step: wgpu::Buffer,
    plans: HashMap<usize, Plan>,
    /// Decode steps of `b` sequences at once ([`stage_batch`](Self::stage_batch)), by `b`.
    batch_plans: HashMap<usize, Plan>,
    /// Sequences the KV caches hold ([`set_sequences`](Self::set_sequences)); a pass of one
    /// sequence uses slot 0 unless staged elsewhere.
    slots: usize,
    /// Use counter for the plans' least-recently-used eviction.
    uses: u64,
    scratch: Option<Scratch>,
    /// Tokens already in the KV cache.
    pub pos: usize,
    pub prefill_chunk: usize,
    /// Which one-token projections read x staged apart (the device tuning's [`StageApart::rule`]).
    stage_apart: StageApart,
    /// The layers' norms run as dispatches of their own even where they would fuse (the device
    /// tuning's `norms_apart` knob: tests run that path, which long rows take, on small models).
    norms_apart: bool,
    /// How a batch step computes its rows ([`set_batch_form`](Self::set_batch_form)).
    batch_form: BatchForm,
}

/// How a decode step of several sequences ([`Model::stage_batch`]) computes each row. Either way a
/// row's numbers do not depend on the batch (its size, the row, the other sequences): a request's
/// tokens depend only on its prompt, parameters and seed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BatchForm {
    /// Each row bit for bit the one-sequence pass's (`generate`'s numbers): the projections in
    /// their one-token configuration (integer dot products where the device tunes them so) run
    /// over the rows. One sequence decodes at `generate`'s speed; many are slower than
    /// [`Batched`](Self::Batched) (H100: 0.55x at 8 sequences, 0.3x at 32: BENCHMARKS.md session 20).
    OneToken,
    /// The batch kernels (`matvec_quant_batch`: each unit of W met with 8 sequences' rows, float
    /// sums) at every batch size, one row included: the faster form for many sequences; a
    /// sequence's numbers differ in rounding from `generate`'s.
    #[default]
    Batched,
}

impl Model {
    /// Uploads the checkpoint's weights and allocates a KV cache of `ctx` positions (default:
    /// the model's maximum, capped at 4096).
    pub fn load(
        gpu: &Gpu,
        ck: &dyn TensorSource,
        ctx: Option<usize>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        Self::load_with(gpu, ck, ctx, WeightFormat::Native, progress)
    }

    /// [`load`](Self::load) with linear weights in `format` (dequantized to f16, or float weights
    /// quantized at load: [`WeightFormat`]).
    pub fn load_with(
        gpu: &Gpu,
        ck: &dyn TensorSource,
        ctx: Option<usize>,
        format: WeightFormat,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Model> {
        let config = ck.config().clone();
        let max_ctx = ctx.unwrap_or(config.max_position_embeddings.min(4096));
        if max_ctx == 0 || max_ctx > config.max_position_embeddings {
            return Err(Error::InvalidArgument(format!(
                "context length {max_ctx} is outside 1..={} for this model",
                config.max_position_embeddings
            )));
        }
        // What the attention and RoPE kernels take, before anything is uploaded: a file with other
        // head shapes gets an error here rather than a kernel's assert at the first step.
        for l in 0..config.num_layers() {
            if let Mixer::Attention(a) = config.layer(l).mixer {
                let (d, rot) = (a.head_dim, a.rope.rotary_dim);
                if d % 16 != 0 || d > 512 || rot < 2 || rot % 2 != 0 || rot > d || a.heads % a.kv_heads.max(1) != 0 {
                    return Err(Error::Unsupported(format!(
                        "layer {l}: attention of head dimension {d} ({rot} rotary dims, {} heads over {} KV heads); \
                         the kernels take head dimensions that are multiples of 16 up to 512",
                        a.heads, a.kv_heads
                    )));
                }
            }
        }
        // The KV cache is one f16 [Hkv, ctx, D] buffer per attention layer and K/V: check it
        // against the device's binding limit before the weights upload, in the user's terms.
        let max_bind = gpu.limits.max_storage_buffer_binding_size;
        let per_pos = (0..config.num_layers())
            .filter_map(|l| match config.layer(l).mixer {
                Mixer::Attention(a) => Some((a.kv_heads * a.head_dim * 2) as u64),
                Mixer::DeltaNet(_) => None,
            })
            .max()
            .unwrap_or(0);
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
        let state = (0..config.num_layers())
            .map(|l| {
                Ok(match config.layer(l).mixer {
                    Mixer::Attention(a) if a.kv_from.is_some() => {
                        let src = a.kv_from.expect("checked");
                        if src >= l || !matches!(config.layer(src).mixer, Mixer::Attention(b) if b.kv_from.is_none() && (b.kv_heads, b.head_dim) == (a.kv_heads, a.head_dim)) {
                            return Err(Error::InvalidArgument(format!(
                                "layer {l} reads layer {src}'s KV cache, which is not an earlier attention layer of its shape"
                            )));
                        }
                        LayerState::Shared(src)
                    }
                    Mixer::Attention(a) => {
                        let shape = [1, a.kv_heads, max_ctx, a.head_dim];
                        LayerState::Kv(
                            gpu.empty(&format!("k_cache.{l}"), &shape, ElemType::F16)?,
                            gpu.empty(&format!("v_cache.{l}"), &shape, ElemType::F16)?,
                        )
                    }
                    Mixer::DeltaNet(d) => recurrent_state(gpu, l, &d, 1)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let step = gpu.uniform("step", &StepParams::default());
        Ok(Model {
            gpu: gpu.clone(),
            config,
            weights,
            state,
            pass_ends: Default::default(),
            max_ctx,
            step,
            plans: HashMap::new(),
            batch_plans: HashMap::new(),
            slots: 1,
            uses: 0,
            scratch: None,
            pos: 0,
            prefill_chunk: PREFILL_CHUNK,
            stage_apart: StageApart::rule(gpu),
            // WGPU_LLM_NORMS_APART=1: a measurement knob (short rows' norms apart, and staging
            // the projections' input where StageApart's free rule takes them).
            norms_apart: gpu.tuning().knobs.norms_apart,
            batch_form: BatchForm::default(),
        })
    }

    /// The kernels (name, variant) of the staged plan of `n` tokens, in dispatch order (None
    /// before it is staged): what a step records.
    pub fn plan_kernels(&self, n: usize) -> Option<Vec<(String, String)>> {
        self.plans.get(&n).map(Plan::kernels)
    }

    /// Forgets the sequence (the KV cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.pos = 0;
        self.pass_ends.clear();
    }

    /// The KV caches the layers own (a layer reading another's left out), in layer order: keys
    /// and values, f16 `[S, Hkv, max_ctx, D]` each (S = [`sequences`](Self::sequences)). The
    /// batch engine's prefix cache copies a sequence's first positions out of and into them.
    pub fn kv_caches(&self) -> impl Iterator<Item = (&Tensor, &Tensor)> {
        self.state.iter().filter_map(|s| match s {
            LayerState::Kv(k, v) => Some((k, v)),
            _ => None,
        })
    }

    /// Whether some layer keeps a recurrent state (which rolls back only to a recent pass end).
    pub fn is_recurrent(&self) -> bool {
        self.state.iter().any(|s| matches!(s, LayerState::Recurrent { .. }))
    }

    /// The most decode steps a rollback may undo: any number for attention-only models; for
    /// recurrent ones, fewer than the state ring's slots ([`STATE_RING`]).
    pub fn max_rollback(&self) -> usize {
        if self.is_recurrent() {
            STATE_RING - 1
        } else {
            usize::MAX
        }
    }

    /// Forgets the positions from `pos` on (tokens a pipelined loop ran past a stop): later
    /// passes overwrite their KV entries, and attention never reads past the current position.
    ///
    /// A model with recurrent layers keeps their state for the last [`STATE_RING`] pass ends
    /// only: `pos` must be one of those (0, a new sequence, always works).
    pub fn rollback(&mut self, pos: usize) {
        assert!(pos <= self.pos, "rollback to {pos} past the current position {}", self.pos);
        if self.is_recurrent() && pos > 0 {
            // The state at `pos` is in slot pos % R unless a later pass ended in the same slot.
            let intact = self.pass_ends.contains(&pos)
                && self.pass_ends.iter().filter(|&&e| e > pos).all(|e| e % STATE_RING != pos % STATE_RING);
            assert!(
                intact,
                "rollback to {pos}: the recurrent state is kept only at the last passes' ends {:?} (ring of {STATE_RING})",
                self.pass_ends
            );
            while self.pass_ends.back().is_some_and(|&e| e > pos) {
                self.pass_ends.pop_back();
            }
        }
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
        let step = self.advance(n)?;
        self.gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&step));
        Ok(&self.plans[&n])
    }

    /// [`stage`](Self::stage) without the write: returns the step uniform for the caller to put
    /// into [`step_buffer`](Self::step_buffer) before the plan ([`staged_plan`](Self::staged_plan))
    /// runs, e.g. by a copy recorded in the same command buffer, so that several steps go in one
    /// submission.
    pub fn advance(&mut self, n: usize) -> Result<StepParams> {
        self.check_room(n)?;
        self.plan(n)?;
        let step = StepParams { pos: self.pos as u32, n_tokens: n as u32, slot: 0, _pad: 0 };
        self.pos += n;
        if self.pos - n == 0 {
            self.pass_ends.clear();
        }
        self.pass_ends.push_back(self.pos);
        while self.pass_ends.len() > STATE_RING {
            self.pass_ends.pop_front();
        }
        Ok(step)
    }

    /// The uniform buffer of the one-sequence plans' [`StepParams`] (see [`advance`](Self::advance)).
    pub fn step_buffer(&self) -> &wgpu::Buffer {
        &self.step
    }

    /// The plan for `n` tokens, recorded by an earlier [`advance`](Self::advance) or
    /// [`stage`](Self::stage).
    pub fn staged_plan(&self, n: usize) -> Result<&Plan> {
        self.plans.get(&n).ok_or_else(|| Error::Gpu(format!("no plan for {n} tokens has been staged")))
    }

    /// Runs the one-token step `reps` times with every dispatch in a compute pass of its own
    /// between two timestamps, and returns each dispatch's median GPU time, in plan order: where a
    /// decode step's time goes. A pass per dispatch adds a little to each, so the sum is a bit
    /// above the fused step's time; the split is what counts. The position is restored.
    pub fn profile_step(&mut self, reps: usize) -> Result<Vec<DispatchTime>> {
        let pos = self.pos;
        self.stage(1)?;
        self.rollback(pos);
        time_dispatches(&self.gpu, &self.plans[&1], reps)
    }

    /// [`profile_step`](Self::profile_step) for the batch decode step of `b` sequences (slots
    /// `0..b`), each at position `pos`.
    pub fn profile_batch(&mut self, b: usize, pos: usize, reps: usize) -> Result<Vec<DispatchTime>> {
        let seqs: Vec<(u32, u32)> = (0..b as u32).map(|slot| (pos as u32, slot)).collect();
        self.stage_batch(&seqs)?;
        time_dispatches(&self.gpu, &self.batch_plans[&b], reps)
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
            self.ensure_scratch(t)?;
            while self.plans.len() >= MAX_PLANS {
                let oldest =
                    self.plans.iter().filter(|(&n, _)| n != 1).min_by_key(|(_, p)| p.last_used).map(|(&n, _)| n);
                self.plans.remove(&oldest.expect("MAX_PLANS > 1"));
            }
            let mut p = self.record(t, false)?;
            if t == 1 {
                probe_drop(&self.gpu, &mut p.items);
            }
            self.plans.insert(t, p);
        }
        let p = self.plans.get_mut(&t).expect("recorded above");
        p.last_used = self.uses;
        Ok(p)
    }

    /// Activation buffers for at least `t` rows (and a logits row per sequence slot).
    fn ensure_scratch(&mut self, t: usize) -> Result<()> {
        if self.scratch.as_ref().is_none_or(|s| s.rows < t) {
            // Plans bind the old buffers: record them again on the new ones (the old ones are
            // freed first, so both sets are never held at once).
            self.plans.clear();
            self.batch_plans.clear();
            self.scratch = None;
            let rows = t.max(self.prefill_chunk).max(self.slots);
            self.scratch = Some(Scratch::new(&self.gpu, &self.config, rows, self.slots)?);
        }
        Ok(())
    }

    /// Makes batch steps compute their rows in `form` (the batch plans are recorded again).
    pub fn set_batch_form(&mut self, form: BatchForm) {
        if form != self.batch_form {
            self.batch_form = form;
            self.batch_plans.clear();
        }
    }

    pub fn batch_form(&self) -> BatchForm {
        self.batch_form
    }

    /// Sequences the KV caches hold at once ([`set_sequences`](Self::set_sequences)).
    pub fn sequences(&self) -> usize {
        self.slots
    }

    /// Makes the KV caches (and a recurrent layer's state rings) hold `n` sequences of `max_ctx`
    /// tokens each (slots `0..n`), for [`prefill_slot`](Self::prefill_slot) and
    /// [`stage_batch`](Self::stage_batch). Everything cached is forgotten.
    pub fn set_sequences(&mut self, n: usize) -> Result<()> {
        if n == 0 || n > MATVEC_MAX_T {
            return Err(Error::InvalidArgument(format!(
                "a batch of {n} sequences: between 1 and {MATVEC_MAX_T} can be decoded together"
            )));
        }
        if n == self.slots {
            return Ok(());
        }
        let max_bind = self.gpu.limits.max_storage_buffer_binding_size;
        for st in &self.state {
            let (per_seq, what, or) = match st {
                LayerState::Kv(k, _) => (k.size_bytes() / self.slots as u64, "KV cache", ", or lower --ctx"),
                LayerState::Recurrent { delta, .. } => (delta.size_bytes() / self.slots as u64, "recurrent state", ""),
                LayerState::Shared(_) => continue,
            };
            if n as u64 * per_seq > max_bind {
                return Err(Error::InvalidArgument(format!(
                    "{n} sequences of {} tokens need {} MiB of {what} per layer, more than this GPU binds \
                     ({} MiB): decode at most {} sequences together{or}",
                    self.max_ctx,
                    (n as u64 * per_seq) >> 20,
                    max_bind >> 20,
                    max_bind / per_seq
                )));
            }
        }
        // Plans bind the caches: drop them, and the old caches before the new ones are made.
        self.plans.clear();
        self.batch_plans.clear();
        self.scratch = None;
        self.reset();
        let shapes: Vec<Option<[usize; 4]>> = self
            .state
            .iter()
            .map(|st| match st {
                LayerState::Kv(k, _) => Some([n, k.shape[1], k.shape[2], k.shape[3]]),
                LayerState::Shared(_) | LayerState::Recurrent { .. } => None,
            })
            .collect();
        let old = std::mem::take(&mut self.state);
        self.slots = n;
        for (l, (shape, st)) in shapes.iter().zip(old).enumerate() {
            self.state.push(match (shape, st, self.config.layer(l).mixer) {
                (Some(shape), ..) => LayerState::Kv(
                    self.gpu.empty(&format!("k_cache.{l}"), shape, ElemType::F16)?,
                    self.gpu.empty(&format!("v_cache.{l}"), shape, ElemType::F16)?,
                ),
                (None, LayerState::Recurrent { conv, delta }, Mixer::DeltaNet(d)) => {
                    // The old rings go before the new ones are made.
                    drop((conv, delta));
                    recurrent_state(&self.gpu, l, &d, n)?
                }
                (None, st, _) => st,
            });
        }
        Ok(())
    }

    /// Runs a sequence's prompt `tokens` at positions `0..len` of KV-cache slot `slot` and
    /// leaves its last position's logits on the GPU (returned: f32 `[vocab]`). Submitted, not
    /// waited for. The model's own position ([`pos`](Self::pos)) is not touched.
    pub fn prefill_slot(&mut self, slot: usize, tokens: &[u32]) -> Result<Tensor> {
        self.prefill_slot_at(slot, 0, tokens)
    }

    /// [`prefill_slot`](Self::prefill_slot) at positions `start..start + len`: positions
    /// `0..start` of the slot already hold the sequence's KV entries (the batch engine's prefix
    /// cache copies them there).
    pub fn prefill_slot_at(&mut self, slot: usize, start: usize, tokens: &[u32]) -> Result<Tensor> {
        if slot >= self.slots {
            return Err(Error::InvalidArgument(format!("KV-cache slot {slot} of {}", self.slots)));
        }
        self.check_tokens(tokens)?;
        if start + tokens.len() > self.max_ctx {
            return Err(Error::InvalidArgument(format!(
                "{} tokens at position {start} exceed the context of {} tokens",
                tokens.len(),
                self.max_ctx
            )));
        }
        let gpu = self.gpu.clone();
        let mut logits = None;
        for (i, chunk) in tokens.chunks(self.prefill_chunk).enumerate() {
            let pos = start + i * self.prefill_chunk;
            let step = StepParams { pos: pos as u32, n_tokens: chunk.len() as u32, slot: slot as u32, _pad: 0 };
            gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&step));
            logits = Some(self.plan(chunk.len())?.submit_with(&gpu, chunk));
        }
        gpu.check()?;
        Ok(logits.expect("at least one chunk"))
    }

    /// Makes the next pass the decode step of `seqs.len()` sequences, one token each: row `r`
    /// is the sequence in KV-cache slot `seqs[r].1` at position `seqs[r].0` (its tokens so far).
    /// Records the plan for that many on first use and writes the step's uniforms (ordered
    /// before the next submission). The caller writes the ids (or has the sampler write them on
    /// the GPU) and encodes the returned plan, whose logits are `[rows, vocab]`.
    pub fn stage_batch(&mut self, seqs: &[(u32, u32)]) -> Result<&Plan> {
        let b = seqs.len();
        if b == 0 || b > self.slots {
            return Err(Error::InvalidArgument(format!("a batch step of {b} sequences ({} slots)", self.slots)));
        }
        if let Some(&(pos, slot)) = seqs.iter().find(|&&(p, s)| p as usize >= self.max_ctx || s as usize >= self.slots)
        {
            return Err(Error::InvalidArgument(format!(
                "a sequence at position {pos} of slot {slot}: the caches hold {} slots of {} positions",
                self.slots, self.max_ctx
            )));
        }
        if !self.batch_plans.contains_key(&b) {
            self.ensure_scratch(b)?;
            let p = self.record(b, true)?;
            self.batch_plans.insert(b, p);
        }
        let s = self.scratch.as_ref().expect("made above");
        let flat: Vec<u32> = seqs.iter().flat_map(|&(p, s)| [p, s]).collect();
        self.gpu.queue.write_buffer(&s.seqs.buffer, s.seqs.offset, bytemuck::cast_slice(&flat));
        let step = StepParams { pos: 0, n_tokens: b as u32, slot: 0, _pad: 0 };
        self.gpu.queue.write_buffer(&self.step, 0, bytemuck::bytes_of(&step));
        Ok(&self.batch_plans[&b])
    }

    /// Token ids a pass can take: some, all inside the vocabulary.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if tokens.is_empty() {
            return Err(Error::InvalidArgument("no tokens to run".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.config.vocab_size
            )));
        }
        Ok(())
    }

    /// (plans cached, bytes of the activation buffers they share).
    pub fn plan_cache(&self) -> (usize, u64) {
        (self.plans.len(), self.scratch.as_ref().map_or(0, Scratch::bytes))
    }

    /// Runs `tokens` at positions `pos..pos + len` and leaves the last position's logits on the
    /// GPU (returned: f32 `[vocab]`). Work is submitted, not waited for.
    pub fn forward(&mut self, tokens: &[u32]) -> Result<Tensor> {
        self.check_tokens(tokens)?;
        self.check_room(tokens.len())?;
        let mut logits = None;
        let gpu = self.gpu.clone();
        for chunk in tokens.chunks(self.prefill_chunk) {
            logits = Some(self.stage(chunk.len())?.submit_with(&gpu, chunk));
        }
        self.gpu.check()?;
        Ok(logits.expect("at least one chunk"))
    }

    /// Records the pass for `t` tokens of one sequence, or with `batch` the decode step of `t`
    /// sequences (one token each, a logits row each).
    fn record(&self, t: usize, batch: bool) -> Result<Plan> {
        let g = &self.gpu;
        let c = &self.config;
        let w = &self.weights;
        let h = c.hidden_size;
        let s = self.scratch.as_ref().expect("plan() sizes the scratch buffers");
        let ids = s.ids.view(0, &[t]);
        let seqs = batch.then(|| s.seqs.view(0, &[t, 2]));
        let [x, xn, tmp] = ["x", "xn", "tmp"].map(|name| s.rows(name, t));
        let (last, last_n, logits) = (s.last.clone(), s.last_norm.clone(), s.logits.clone());

        let mut items = Vec::new();
        for (row_start, chunk) in &w.embed {
            items.push(Item::Kernel(match chunk {
                Linear::F16(t) => embedding(g, t, *row_start, &ids, &x, c.embedding_scale)?,
                Linear::Quant(q) => embedding(g, q, *row_start, &ids, &x, c.embedding_scale)?,
            }));
        }
        let eps = c.rms_norm_eps;
        let lp = LayerPass {
            g,
            s,
            t,
            eps,
            x: &x,
            xn: &xn,
            tmp: &tmp,
            step: &self.step,
            max_ctx: self.max_ctx,
            seqs,
            xn_for: Default::default(),
            xs_of: Default::default(),
            stage_apart: self.stage_apart,
            one_token: self.batch_form == BatchForm::OneToken,
            norms_apart: self.norms_apart,
        };
        // Per-layer inputs from the token embedding x0, before any layer changes x.
        if let (Some(ple), Some(pw), Some((slots, _))) = (c.per_layer_input, &w.per_layer_input, &s.ple_slots) {
            let width = c.num_layers() * ple.dim;
            let (tok, proj) = (lp.act("ple_tok", width), lp.act("ple_proj", width));
            for (row_start, chunk) in &pw.embed {
                items.push(Item::Kernel(match chunk {
                    Linear::F16(tb) => embedding(g, tb, *row_start, &ids, &tok, (ple.dim as f32).sqrt())?,
                    Linear::Quant(q) => embedding(g, q, *row_start, &ids, &tok, (ple.dim as f32).sqrt())?,
                }));
            }
            items.push(Item::Kernel(linear(g, &x, Input::Plain, &pw.model_proj, None, &proj, lp.opts())?));
            // norm(proj(x0) / sqrt(hidden)) is norm(proj(x0)) with eps * hidden: the scale folded in.
            let rows = RowLayout::contiguous((t * c.num_layers()) as u32, ple.dim as u32);
            items.push(Item::Kernel(rms_norm_in_place(g, &proj, &pw.norm, rows, eps * h as f32)?));
            let scale = std::f32::consts::FRAC_1_SQRT_2;
            items.push(Item::Kernel(per_layer_inputs(g, &proj, &tok, slots, (c.num_layers(), ple.dim), scale)?));
        }
        for (l, lw) in w.layers.iter().enumerate() {
            let spec = c.layer(l);
            let mut k = Vec::new();
            // Token mixer, its output added to the residual stream x (through the sandwich norm
            // where there is one).
            let state = match &self.state[l] {
                LayerState::Shared(src) => &self.state[*src],
                own => own,
            };
            let mixed = match (spec.mixer, &lw.mixer, state) {
                (Mixer::Attention(a), MixerWeights::Attention { .. }, LayerState::Kv(kc, vc)) => {
                    lp.attention(&mut k, &a, lw, kc, vc)?
                }
                (Mixer::DeltaNet(d), MixerWeights::DeltaNet { .. }, LayerState::Recurrent { conv, delta }) => {
                    lp.delta_net(&mut k, &d, lw, conv, delta)?
                }
                _ => unreachable!("layer {l}: weights and state are made from its spec"),
            };
            // The projections each norm written by a residual add feeds (whether to stage its rows).
            lp.residual_scaled(
                &mut k,
                mixed,
                lw.post_attn_norm.as_ref(),
                1.0,
                Some(&lw.ffn_norm),
                &mlp_readers(&lw.mlp),
            )?;
            // The next layer's input norm, for the last residual add of this one to write.
            let next_norm = w.layers.get(l + 1).map(|n| &n.attn_norm);
            let qkv_ws = w.layers.get(l + 1).map_or(Vec::new(), |n| mixer_readers(&n.mixer));
            let ffn = match (spec.mlp, &lw.mlp) {
                (MlpSpec::Dense { intermediate, activation }, MlpWeights::Dense { gate_up, down }) => {
                    let (xin, input) = lp.normed(&mut k, &lw.ffn_norm, &mlp_readers(&lw.mlp))?;
                    lp.dense_mlp(&mut k, &xin, input, gate_up, down, intermediate, activation)?
                }
                (MlpSpec::Moe { .. }, MlpWeights::Moe { .. }) => lp.moe(&mut k, &spec.mlp, lw)?,
                _ => unreachable!("layer {l}: weights are made from its spec"),
            };
            match (&lw.per_layer_input, &s.ple_slots) {
                (Some(ple_w), Some((slots, slot))) => {
                    lp.residual(&mut k, ffn, lw.post_ffw_norm.as_ref())?;
                    let out = lp.per_layer_input(&mut k, ple_w, slots.view(l * slot, &[t, 2 * ple_w.0.shape()[0]]))?;
                    lp.residual_scaled(&mut k, out, Some(&ple_w.2), lw.output_scale, next_norm, &qkv_ws)?;
                }
                _ => lp.residual_scaled(&mut k, ffn, lw.post_ffw_norm.as_ref(), lw.output_scale, next_norm, &qkv_ws)?,
            }
            items.extend(k.into_iter().map(Item::Kernel));
        }
        if batch {
            // Every row (sequence): output norm and lm_head into its logits row.
            let (head_in, head_input) = lp.normed_out(&mut items, &w.output_norm)?;
            for (row_start, chunk) in &w.lm_head {
                let rows = chunk.shape()[0];
                let out = logits.view(*row_start as usize, &[t, rows]);
                let opts = LinearOpts { ld_out: Some(c.vocab_size), softcap: c.final_logit_softcapping, ..lp.opts() };
                items.push(Item::Kernel(linear(g, &head_in, head_input, chunk, None, &out, opts)?));
            }
            return Ok(Plan { t, ids, logits: logits.view(0, &[t, c.vocab_size]), items, last_used: 0 });
        }
        // The last row only: output norm and lm_head.
        let last_row = if t == 1 {
            x.clone()
        } else {
            items.push(Item::Copy { src: x.view((t - 1) * h, &[1, h]), dst: last.clone() });
            last.clone()
        };
        // Soft-capping (Gemma 4) is the lm_head's epilogue.
        let plain = LinearOpts { softcap: c.final_logit_softcapping, ..Default::default() };
        let mut k = |kernel: Kernel| items.push(Item::Kernel(kernel));
        // One row: the output norm always fuses into the lm_head's matvec when K allows.
        let (head_in, head_input) = if fuses_norm(1, h) {
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
        Ok(Plan { t, ids, logits: logits.view(0, &[c.vocab_size]), items, last_used: 0 })
    }
}

/// Replays `plan` (its uniforms as last written) `reps` times with every dispatch in a compute
/// pass of its own between two timestamps; each dispatch's median GPU time, in plan order.
fn time_dispatches(gpu: &Gpu, plan: &Plan, reps: usize) -> Result<Vec<DispatchTime>> {
    if !gpu.caps.timestamps {
        return Err(Error::Unsupported("profiling needs timestamp queries, which this adapter lacks".into()));
    }
    let kernels = || plan.items.iter().filter_map(|i| if let Item::Kernel(k) = i { Some(k) } else { None });
    let n = kernels().count();
    let queries = 2 * n as u32;
    if queries > wgpu::QUERY_SET_MAX_QUERIES {
        return Err(Error::Unsupported(format!("{n} dispatches are more than one query set can time")));
    }
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
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        for (i, k) in kernels().enumerate() {
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
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&gpu.read_bytes(&resolve, 0, 8 * u64::from(queries))?);
        for (i, t) in times.iter_mut().enumerate() {
            t.push(ticks[2 * i + 1].saturating_sub(ticks[2 * i]) as f64 * period_us);
        }
    }
    Ok(kernels()
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

/// A measurement probe (wrong outputs, for `bench` only): `WGPU_LLM_PROBE_DROP="name:VARIANT,..."`
/// (the name with or without its entry point) leaves the one-token plan's dispatches of that
/// kernel name and exact variant out, so a step's GPU time without them tells what they cost
/// inside the step.
fn probe_drop(gpu: &Gpu, items: &mut Vec<Item>) {
    let drop = &gpu.tuning().knobs.probe_drop;
    if drop.is_empty() {
        return;
    }
    let named = |k: &Kernel, n: &str| k.name == n || k.name.split(':').next() == Some(n);
    items.retain(|it| match it {
        Item::Kernel(k) => !drop.iter().any(|(n, var)| named(k, n) && k.variant == *var),
        _ => true,
    });
}
