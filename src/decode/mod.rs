//! The generation loop: prefill the prompt, then sample and feed back one token at a time.
//!
//! Two loops produce the same tokens:
//! - **GPU-resident** ([`pipeline`], with the device sampler): each decode step is one compute
//!   pass holding the forward pass and the sampler, which writes the sampled id straight into
//!   the next step's input-ids buffer; `steps_per_submit` steps go in one command buffer. The
//!   host writes what it knows ahead (the positions, the sampling steps) and encodes and submits
//!   the next steps (up to `depth` submissions) while the GPU runs earlier ones; the ids come
//!   back through a ring of small mapped buffers, in order. A stop (eos, the caller, non-finite
//!   logits) discards the steps already in flight and rolls the model's position back, so the
//!   next call never sees them. `depth = 1` with one step a submission is the loop unpipelined.
//! - **Readback** (any sampler, the host sampler always): forward, then
//!   [`SamplingBackend::draw`], which waits for the ids (the host sampler reads the logits back).
//!
//! Sampling step schedule (the RNG counter): the token sampled from the prompt's last position
//! is step 0, each decode step adds one. Chunked prefill does not advance it.
//!
//! [`generate_with`] starts from an empty context; [`continue_with`] puts the prompt after what
//! the model already holds (a chat's earlier turns, [`crate::session`]) and is otherwise the
//! same run.

pub mod batch;
pub mod common;
pub mod constrained;
pub mod pipeline;
pub mod prefix;

pub use common::{
    non_finite_error, DecodeOptions, Job, Stats, StepTiming, StopReason, DEFAULT_DEPTH, DEFAULT_STEPS_PER_SUBMIT,
    DEFAULT_SUBMISSIONS,
};

use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{LogitControls, RowKey, Rows, SamplingBackend, SamplingParams, SeqControls};
use common::{room, stop_after};
use std::time::{Duration, Instant};

/// Generates up to `max_tokens` tokens after `prompt`, starting from an empty context. `on_token`
/// sees each token as it is sampled, in order (eos included), and returns false to stop.
/// Logits that are not finite end the run with an error naming the step.
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    opts: DecodeOptions,
) -> Result<Stats> {
    let job = Job { prompt, max_tokens, params, eos };
    run_job(model, sampler, true, job, &LogitControls::default(), on_token, opts)
}

/// [`generate_with`] with logit controls ([`crate::sampling::penalty`]): `logit_bias` and the
/// presence, frequency and repetition penalties, counted over `job.prompt` and the tokens
/// generated. With the device sampler the counts stay on the GPU (the GPU-resident loop stays
/// pipelined); the host sampler applies the same spec to the logits it reads back.
pub fn generate_controlled(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    job: Job,
    controls: &LogitControls,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    opts: DecodeOptions,
) -> Result<Stats> {
    run_job(model, sampler, true, job, controls, on_token, opts)
}

/// [`generate_with`] continuing the sequence the model holds: `job.prompt` goes at positions
/// `model.pos..`, after the KV cache's (and recurrent states') first `model.pos` positions, which
/// are kept. The run is the cold run of the whole sequence from there on: the sampling step
/// counter starts at 0 at the first token sampled (from the prompt's last position), the room is
/// what the context has left after the prompt, and a stop leaves the model at the position after
/// the last token fed (the last token delivered is not fed), so a next call can continue again.
/// A caller that keeps only part of what the model holds rolls it back first
/// ([`Model::rollback`]: to any earlier position for attention-only models, to a recent pass end
/// for models with recurrent layers). The prompt must not be empty: the first token is sampled
/// from its last position.
pub fn continue_with(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    job: Job,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    opts: DecodeOptions,
) -> Result<Stats> {
    run_job(model, sampler, false, job, &LogitControls::default(), on_token, opts)
}

/// [`generate_with`] (`fresh`: the model reset first) or [`continue_with`], with `controls`
/// (counted over `job.prompt` and what is generated).
pub(crate) fn run_job(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    fresh: bool,
    job: Job,
    controls: &LogitControls,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    opts: DecodeOptions,
) -> Result<Stats> {
    let Job { prompt, max_tokens, params, .. } = job;
    params.validate()?;
    let mut controls = SeqControls::start(controls, model.config.vocab_size, 0, prompt)?;
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty".into()));
    }
    let start = if fresh { 0 } else { model.pos };
    if start + prompt.len() >= model.max_ctx {
        let held = if start > 0 { format!(" after the {start} already in the KV cache") } else { String::new() };
        return Err(Error::InvalidArgument(format!(
            "the prompt has {} tokens{held} but the context holds {} (prompt plus at least one generated \
             token); shorten the prompt or raise --ctx (this model allows up to {})",
            prompt.len(),
            model.max_ctx,
            model.config.max_position_embeddings
        )));
    }
    let stats = Stats { prompt_tokens: prompt.len(), cached_tokens: start, ..Default::default() };
    if max_tokens == 0 {
        return Ok(stats);
    }
    if fresh {
        model.reset();
    }
    if let Some(c) = &controls {
        sampler.start_controls(&model.gpu, c)?;
    }
    if opts.depth > 0 {
        if let Some(device) = sampler.as_device() {
            // A recurrent state rolls back only a few passes (the state ring): no more steps in
            // flight than that, two submissions of them where the options ask for two or more.
            let cap = model.max_rollback().saturating_add(1);
            let steps = opts.steps_per_submit.clamp(1, (cap / opts.depth.clamp(1, 2)).max(1));
            let depth = opts.depth.min(cap / steps).max(1);
            return pipeline::run(model, device, job, controls.as_ref(), on_token, depth, steps, stats);
        }
    }
    readback_loop(model, sampler, job, controls.as_mut(), on_token, stats)
}

/// The readback loop: forward, then sample with a blocking wait, one step at a time.
fn readback_loop(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    job: Job,
    mut controls: Option<&mut SeqControls>,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    mut stats: Stats,
) -> Result<Stats> {
    let Job { prompt, max_tokens, params, eos } = job;
    let sampler_dispatches = if sampler.as_device().is_some() { pipeline::sampler_dispatches(params) } else { 0 };
    stats.dispatches_per_step = model.plan(1)?.dispatches() + sampler_dispatches;
    stats.submits_per_step = 2.0;
    stats.waits_per_step = 1.0;
    let t0 = Instant::now();
    let mut draw = |model: &mut Model, sampler: &mut dyn SamplingBackend, logits, step: u32| -> Result<u32> {
        let keys = [RowKey { step, stream: 0 }];
        let rows = Rows { params: std::slice::from_ref(params), keys: &keys, masks: &[None] };
        let d = sampler.draw_controlled(&model.gpu, &logits, rows, &[controls.as_deref()])?;
        if d.non_finite[0] {
            return Err(non_finite_error(step, model.pos - 1));
        }
        if let Some(c) = controls.as_deref_mut() {
            c.push(d.ids[0]);
        }
        Ok(d.ids[0])
    };
    let logits = model.forward(prompt)?;
    let mut token = draw(model, sampler, logits, 0)?;
    stats.prefill = t0.elapsed();
    stats.generated_tokens = 1;
    let t1 = Instant::now();
    let mut step = 0u32;
    loop {
        if !on_token(token)? {
            stats.stop = StopReason::Caller;
            break;
        }
        if let Some(stop) =
            stop_after(token, stats.generated_tokens, max_tokens, room(model, stats.cached_tokens + prompt.len()), eos)
        {
            stats.stop = stop;
            break;
        }
        step += 1;
        let t = Instant::now();
        let logits = model.forward(&[token])?;
        let encode = t.elapsed();
        let t = Instant::now();
        token = draw(model, sampler, logits, step)?;
        stats.steps.push(StepTiming { encode, submit: Duration::ZERO, wait: t.elapsed(), gpu: None });
        stats.generated_tokens += 1;
    }
    stats.decode = t1.elapsed();
    Ok(stats)
}
