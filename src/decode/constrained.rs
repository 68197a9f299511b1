//! The constrained decode loop: one sequence whose every token is sampled under the token mask a
//! [`Matcher`] gives ([`crate::grammar`]), so the output follows a JSON schema, a regex or a
//! grammar.
//!
//! The mask of step `s` depends on token `s - 1`, which only the host's matcher can turn into
//! the next mask; the rest stays on the GPU. With the device sampler, step `s` is two
//! submissions: the sampler (under mask `s`) writing token `s` into the one-token plan's input
//! ids, with a copy of the id and its status into a small readback buffer; then at once the
//! forward pass of step `s + 1` reading that id on the GPU. The host waits for the sampler's
//! submission only, so while the GPU runs the forward pass of `s + 1` the host reads token `s`,
//! advances the matcher and computes mask `s + 1`; it then uploads it (`⌈V / 32⌉` words) and
//! submits the sampler of `s + 1`. Per token: one small wait, the mask's upload, and no logits
//! leave the GPU. Other samplers (the host one) run forward, then the mask (while the forward
//! pass runs), then the masked draw.
//!
//! Stops: an end-of-sequence token (allowed only where the output may end), or the matcher
//! finished (nothing but the end may follow): [`StopReason::Eos`], the output complete;
//! `max_tokens` or a full context before that: [`StopReason::MaxTokens`] /
//! [`StopReason::ContextFull`], never reported complete. A forward pass run past the stop is
//! rolled back (the model's position is where the step-by-step loop leaves it).

use super::common::{non_finite_error, room, Stats, StepTiming, StopReason};
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Tensor};
use crate::grammar::Matcher;
use crate::model::Model;
use crate::sampling::{
    DeviceSampler, LogitControls, RowKey, Rows, SamplingBackend, SamplingParams, SeqControls, TokenMask,
};
use std::time::{Duration, Instant};

/// Generates up to `max_tokens` tokens after `prompt` under `matcher`'s constraint (from its
/// start), starting from an empty context. `on_token` sees each token in order (an
/// end-of-sequence token included) and returns false to stop. Stats as
/// [`generate_with`](super::generate_with)'s; a step's `encode` time includes its mask.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    matcher: &mut Matcher,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Stats> {
    let job = super::Job { prompt, max_tokens, params, eos };
    generate_controlled(model, sampler, job, matcher, &LogitControls::default(), on_token)
}

/// [`generate`] with logit controls ([`crate::sampling::penalty`]), applied before the mask.
pub fn generate_controlled(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    job: super::Job,
    matcher: &mut Matcher,
    controls: &LogitControls,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Stats> {
    let super::Job { prompt, max_tokens, params, eos } = job;
    params.validate()?;
    let controls = SeqControls::start(controls, model.config.vocab_size, 0, prompt)?;
    let Some(_) = prompt.first() else { return Err(Error::InvalidArgument("the prompt is empty".into())) };
    // The prompt and at least one generated token.
    model.reset();
    model.check_room(prompt.len() + 1)?;
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Default::default() };
    if max_tokens == 0 {
        return Ok(stats);
    }
    // The first mask before any GPU work: a constraint that allows nothing fails here.
    let first = matcher.mask()?;
    let budget = max_tokens.min(room(model, prompt.len()));
    if let Some(c) = &controls {
        sampler.start_controls(&model.gpu, c)?;
    }
    let mut run = Run { matcher, eos, on_token, budget, max_tokens, stats: &mut stats, delivered: 0, controls };
    let result = match sampler.as_device() {
        Some(device) => device_loop(model, device, prompt, params, first, &mut run),
        None => readback_loop(model, sampler, prompt, params, first, &mut run),
    };
    let delivered = run.delivered;
    match &result {
        Err(_) => model.reset(),
        // A forward pass past the last token is undone.
        Ok(()) if delivered > 0 && model.pos > prompt.len() + delivered - 1 => {
            model.rollback(prompt.len() + delivered - 1)
        }
        Ok(()) => {}
    }
    result.map(|()| stats)
}

/// A run's state shared by both loops.
struct Run<'a, 'b> {
    matcher: &'a mut Matcher,
    eos: &'a [u32],
    on_token: &'a mut dyn FnMut(u32) -> Result<bool>,
    /// Tokens that can be produced: `max_tokens` and the context's room.
    budget: usize,
    max_tokens: usize,
    stats: &'b mut Stats,
    delivered: usize,
    /// The sequence's logit controls (the host's counts).
    controls: Option<SeqControls>,
}

impl Run<'_, '_> {
    /// Delivers `token` and advances the matcher: `Ok(None)` when the run stops, else the mask of
    /// the next token.
    fn deliver(&mut self, token: u32) -> Result<Option<TokenMask>> {
        self.delivered += 1;
        self.stats.generated_tokens = self.delivered;
        if let Some(c) = &mut self.controls {
            c.push(token);
        }
        if !(self.on_token)(token)? {
            self.stats.stop = StopReason::Caller;
            return Ok(None);
        }
        if self.eos.contains(&token) {
            self.stats.stop = StopReason::Eos;
            return Ok(None);
        }
        self.matcher.advance(token)?;
        if self.matcher.is_finished() {
            self.stats.stop = StopReason::Eos;
            return Ok(None);
        }
        let mask = self.matcher.mask()?;
        let allowed_eos = (0..self.eos.len()).filter(|&i| !self.eos[..i].contains(&self.eos[i])).map(|i| self.eos[i]);
        if mask.count() == allowed_eos.filter(|&e| mask.allows(e)).count() {
            // Complete, and only the end may follow: the end-of-sequence token is not sampled.
            self.stats.stop = StopReason::Eos;
            return Ok(None);
        }
        if self.delivered >= self.budget {
            self.stats.stop =
                if self.delivered >= self.max_tokens { StopReason::MaxTokens } else { StopReason::ContextFull };
            return Ok(None);
        }
        Ok(Some(mask))
    }
}

/// Forward, then the mask (computed while the forward pass runs), then the masked draw.
fn readback_loop(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    params: &SamplingParams,
    first: TokenMask,
    run: &mut Run,
) -> Result<()> {
    run.stats.dispatches_per_step = model.plan(1)?.dispatches();
    (run.stats.submits_per_step, run.stats.waits_per_step) = (2.0, 1.0);
    let t0 = Instant::now();
    let mut logits = model.forward(prompt)?;
    let mut mask = first;
    let mut step = 0u32;
    let mut t1 = None;
    loop {
        let t = Instant::now();
        let keys = [RowKey { step, stream: 0 }];
        let rows = Rows { params: std::slice::from_ref(params), keys: &keys, masks: &[Some(&mask)] };
        let d = sampler.draw_controlled(&model.gpu, &logits, rows, &[run.controls.as_ref()])?;
        if d.non_finite[0] {
            return Err(non_finite_error(step, model.pos - 1));
        }
        let wait = t.elapsed();
        if step == 0 {
            run.stats.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        }
        let t = Instant::now();
        let token = d.ids[0];
        let next = if run.delivered + 1 < run.budget {
            // The next forward pass runs on the GPU while the matcher works.
            Some(model.forward(&[token])?)
        } else {
            None
        };
        let delivered = run.deliver(token)?;
        if step > 0 {
            run.stats.steps.push(StepTiming { encode: t.elapsed(), submit: Duration::ZERO, wait, gpu: None });
        }
        let (Some(m), Some(l)) = (delivered, next) else { break };
        (mask, logits) = (m, l);
        step += 1;
    }
    run.stats.decode = t1.map_or(Duration::ZERO, |t| t.elapsed());
    Ok(())
}

/// The device sampler's loop (see the [module docs](self)).
fn device_loop(
    model: &mut Model,
    sampler: &mut DeviceSampler,
    prompt: &[u32],
    params: &SamplingParams,
    first: TokenMask,
    run: &mut Run,
) -> Result<()> {
    let gpu = model.gpu.clone();
    let ids = model.plan(1)?.ids.clone();
    let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("constrained token readback"),
        size: 8,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let t0 = Instant::now();
    let mut logits = model.forward(prompt)?;
    let mut mask = first;
    let mut t1 = None;
    let mut step = 0u32;
    loop {
        let te = Instant::now();
        let sampled =
            submit_sampler(&gpu, sampler, (params, run.controls.as_ref()), step, &mask, &logits, &ids, &staging)?;
        run.stats.dispatches_per_step = model.plan(1)?.dispatches() + sampler.dispatches();
        // The next forward pass reads the sampled id on the GPU: submitted before it is read.
        let next = if run.delivered + 1 < run.budget {
            let plan = model.stage(1)?;
            let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("decode") });
            plan.encode(&mut enc);
            let l = plan.logits.clone();
            gpu.queue.submit([enc.finish()]);
            Some(l)
        } else {
            None
        };
        let encode = te.elapsed();
        let tw = Instant::now();
        let (token, non_finite) = read_token(&gpu, &staging, sampled)?;
        let wait = tw.elapsed();
        if non_finite {
            return Err(non_finite_error(step, prompt.len() + step as usize - 1));
        }
        if step == 0 {
            run.stats.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        }
        let tm = Instant::now();
        let delivered = run.deliver(token)?;
        if step > 0 {
            run.stats.steps.push(StepTiming { encode: encode + tm.elapsed(), submit: Duration::ZERO, wait, gpu: None });
        }
        let (Some(m), Some(l)) = (delivered, next) else { break };
        (mask, logits) = (m, l);
        step += 1;
    }
    run.stats.decode = t1.map_or(Duration::ZERO, |t| t.elapsed());
    (run.stats.depth, run.stats.submits_per_step, run.stats.waits_per_step) = (1, 2.0, 1.0);
    gpu.check()
}

/// Submits the device sampler under `mask` (step `step`) writing its id into `ids` (the next
/// pass's input), and copies of the id and its status word into `staging`.
#[allow(clippy::too_many_arguments)]
fn submit_sampler(
    gpu: &Gpu,
    sampler: &mut DeviceSampler,
    (params, controls): (&SamplingParams, Option<&SeqControls>),
    step: u32,
    mask: &TokenMask,
    logits: &Tensor,
    ids: &Tensor,
    staging: &wgpu::Buffer,
) -> Result<wgpu::SubmissionIndex> {
    let keys = [RowKey { step, stream: 0 }];
    sampler.set_masked(gpu, Rows { params: std::slice::from_ref(params), keys: &keys, masks: &[Some(mask)] })?;
    if controls.is_some() {
        sampler.set_controls(gpu, &[controls])?;
    }
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("masked sampling") });
    sampler.encode(gpu, &mut enc, logits, 1, ids)?;
    let status = sampler.status().ok_or_else(|| Error::Gpu("the sampler has no status buffer".into()))?;
    enc.copy_buffer_to_buffer(&ids.buffer, ids.offset, staging, 0, 4);
    enc.copy_buffer_to_buffer(status, 0, staging, 4, 4);
    Ok(gpu.queue.submit([enc.finish()]))
}

/// Waits for the sampler's submission alone (not the forward pass after it) and reads the id
/// and its status.
fn read_token(gpu: &Gpu, staging: &wgpu::Buffer, submission: wgpu::SubmissionIndex) -> Result<(u32, bool)> {
    let (tx, rx) = std::sync::mpsc::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    gpu.device
        .poll(wgpu::PollType::Wait { submission_index: Some(submission), timeout: None })
        .map_err(|e| Error::Gpu(format!("waiting for a sampled token: {e}")))?;
    let mapped = rx.recv_timeout(std::time::Duration::from_secs(60));
    mapped
        .map_err(|_| Error::Gpu("a sampled token's readback never completed".into()))?
        .map_err(|e| Error::Gpu(format!("mapping a sampled token: {e}")))?;
    let words: Vec<u32> = {
        let view =
            staging.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("reading a sampled token: {e}")))?;
        bytemuck::pod_collect_to_vec(&view[..])
    };
    staging.unmap();
    Ok((words[0], words[1] != 0))
}
