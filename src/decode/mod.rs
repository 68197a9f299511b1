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

pub mod batch;
pub mod pipeline;

use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{SamplingBackend, SamplingParams};
use std::time::{Duration, Instant};

/// Decode steps in flight in the batch engine ([`batch::BatchEngine`]) by default.
pub const DEFAULT_DEPTH: usize = 3;

/// Submissions in flight in the one-sequence GPU-resident loop by default.
pub const DEFAULT_SUBMISSIONS: usize = 2;

/// Decode steps a submission of the one-sequence GPU-resident loop holds by default: 4 were
/// +0.7-1.2 % decode over 1 on the H100 (fewer submissions; BENCHMARKS.md session 17), for
/// tokens that reach the caller four at a time and a stop seen up to 7 steps late (discarded).
pub const DEFAULT_STEPS_PER_SUBMIT: usize = 4;

/// How [`generate_with`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Submissions in flight in the GPU-resident loop (device sampler): 1 = one at a time,
    /// 0 = the readback loop (forward, then sample and wait) even with the device sampler.
    pub depth: usize,
    /// Decode steps recorded into each submission of the GPU-resident loop (1 or more): fewer
    /// submissions, and a stop seen up to `depth · steps_per_submit - 1` steps late.
    pub steps_per_submit: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self { depth: DEFAULT_SUBMISSIONS, steps_per_submit: DEFAULT_STEPS_PER_SUBMIT }
    }
}

impl DecodeOptions {
    /// `depth` submissions in flight of the default steps each.
    pub fn depth(depth: usize) -> Self {
        Self { depth, ..Self::default() }
    }
}

/// Host and GPU time of one decode step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// Host time spent recording the step (uniform writes, the forward pass, the sampler, the
    /// readback copies) and finishing its command buffer. Readback loop: the forward pass's
    /// recording and submission.
    pub encode: Duration,
    /// Host time inside `queue.submit` (readback loop: 0, counted in `encode` and `wait`).
    pub submit: Duration,
    /// Host time blocked waiting for the step's token. Readback loop: the whole sampling call
    /// (the device sampler's recording and submission, or the host sampler's logits readback and
    /// CPU sampling, and the wait).
    pub wait: Duration,
    /// GPU time of the step's compute pass (timestamp queries), where the adapter has them.
    pub gpu: Option<Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing including the first sampled token.
    pub prefill: Duration,
    /// Everything after the first token.
    pub decode: Duration,
    /// Why generation ended.
    pub stop: StopReason,
    /// Which loop ran: 0 = readback, else the GPU-resident loop's depth.
    pub depth: usize,
    /// Decode steps a submission of the GPU-resident loop held (0: the readback loop).
    pub steps_per_submit: usize,
    /// Decode steps run past the stop and discarded (their positions rolled back).
    pub discarded_steps: usize,
    /// Dispatches, submits and blocking waits per decode step (the GPU-resident loop: a submit
    /// and a wait a submission of `steps_per_submit` steps, so 1 / `steps_per_submit` a step).
    pub dispatches_per_step: usize,
    pub submits_per_step: f64,
    pub waits_per_step: f64,
    /// One entry per decode step whose token was delivered (not the prefill).
    pub steps: Vec<StepTiming>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    MaxTokens,
    Eos,
    ContextFull,
    /// The callback asked to stop.
    Caller,
}

impl Stats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Tokens per second after the first (each is one full forward + sample).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// The error for a step whose logits held a NaN or an infinity.
pub fn non_finite_error(step: u32, pos: usize) -> Error {
    let at = if step == 0 { "the prompt's last position".to_string() } else { format!("decode step {step}") };
    Error::Gpu(format!(
        "the model's logits are not finite (NaN or infinity) at {at} (position {pos}): an activation \
         overflowed or the weights are corrupt; no token was produced from them"
    ))
}

/// [`generate_with`] with the default options.
pub fn generate(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Stats> {
    generate_with(model, sampler, prompt, max_tokens, params, eos, on_token, DecodeOptions::default())
}

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
    params.validate()?;
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty".into()));
    }
    if prompt.len() >= model.max_ctx {
        return Err(Error::InvalidArgument(format!(
            "the prompt has {} tokens but the context holds {} (prompt plus at least one generated \
             token); shorten the prompt or raise --ctx (this model allows up to {})",
            prompt.len(),
            model.max_ctx,
            model.config.max_position_embeddings
        )));
    }
    let stats = Stats { prompt_tokens: prompt.len(), ..Default::default() };
    if max_tokens == 0 {
        return Ok(stats);
    }
    model.reset();
    if opts.depth > 0 {
        if let Some(device) = sampler.as_device() {
            // A recurrent state rolls back only a few passes (the state ring): no more steps in
            // flight than that, two submissions of them where the options ask for two or more.
            let cap = model.max_rollback().saturating_add(1);
            let steps = opts.steps_per_submit.clamp(1, (cap / opts.depth.clamp(1, 2)).max(1));
            let depth = opts.depth.min(cap / steps).max(1);
            return pipeline::run(model, device, prompt, max_tokens, params, eos, on_token, depth, steps, stats);
        }
    }
    readback_loop(model, sampler, prompt, max_tokens, params, eos, on_token, stats)
}

/// Why a loop stops after delivering `token`, the `produced`-th token (1-based), if it does;
/// `room` is how many tokens the context allows: one per free position after the prompt, plus the
/// one sampled from its last position. Both loops stop by this rule.
fn stop_after(token: u32, produced: usize, max_tokens: usize, room: usize, eos: &[u32]) -> Option<StopReason> {
    if eos.contains(&token) {
        Some(StopReason::Eos)
    } else if produced >= max_tokens {
        Some(StopReason::MaxTokens)
    } else if produced >= room {
        Some(StopReason::ContextFull)
    } else {
        None
    }
}

/// `room` of [`stop_after`] for a prompt of `prompt` tokens.
fn room(model: &Model, prompt: usize) -> usize {
    model.max_ctx - prompt + 1
}

/// The readback loop: forward, then sample with a blocking wait, one step at a time.
#[allow(clippy::too_many_arguments)]
fn readback_loop(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    mut stats: Stats,
) -> Result<Stats> {
    let sampler_dispatches = if sampler.as_device().is_some() { pipeline::sampler_dispatches(params) } else { 0 };
    stats.dispatches_per_step = model.plan(1)?.dispatches() + sampler_dispatches;
    stats.submits_per_step = 2.0;
    stats.waits_per_step = 1.0;
    let t0 = Instant::now();
    let draw = |model: &mut Model, sampler: &mut dyn SamplingBackend, logits, step: u32| -> Result<u32> {
        let d = sampler.draw(&model.gpu, &logits, std::slice::from_ref(params), step)?;
        if d.non_finite[0] {
            return Err(non_finite_error(step, model.pos - 1));
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
        if let Some(stop) = stop_after(token, stats.generated_tokens, max_tokens, room(model, prompt.len()), eos) {
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
