//! The GPU-resident, pipelined decode loop (see the [module docs](super)).
//!
//! Step `s` (`s ≥ 1`) is: copies of its uniforms (the position, the sampling step) from a
//! buffer the host wrote ahead into the ones the kernels read; the one-token forward pass reading
//! its input id from the plan's ids buffer, then the device sampler writing the sampled id back
//! into that same buffer (the input of step `s + 1`) and its status word, in one compute pass
//! with timestamp writes at its ends; the sampler also logs the id and its status at entry
//! `s % steps` of a small log. `steps` such steps go in one command buffer (one submission),
//! which ends with one copy of the log and one of the steps' resolved timestamps into the
//! submission's readback slot; command order makes step `s + 1` read what step `s` wrote, so the
//! host can record and submit up to `depth` submissions ahead. The slot of the oldest submission
//! is mapped and read first: tokens reach the caller in order.
//!
//! Stops: max-tokens and a full context are known ahead, so no step past them is submitted. Eos,
//! the caller's stop and non-finite logits are seen up to `depth · steps - 1` steps late: those
//! steps are dropped unread (the GPU runs them before anything submitted later) and the model's
//! position is rolled back to where the step-by-step loop would have left it (the KV entries they
//! wrote lie past it and are overwritten by later passes); after an error the model is reset.

use super::common::{non_finite_error, room, stop_after, Job, Stats, StepTiming, StopReason};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::Model;
use crate::sampling::device::PassLog;
use crate::sampling::{DeviceSampler, SamplingParams, SeqControls};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One submission's readback buffer (the sampler's log: `(id, status)` a step, then each step's
/// two u64 timestamps) and what has been read of it.
struct Slot {
    buffer: wgpu::Buffer,
    /// The map callback's outcome: [`PENDING`], [`MAPPED`] or [`FAILED`] (made once, reused by
    /// every submission the slot carries).
    state: Arc<AtomicU8>,
    /// The slot's words once its submission is done and read.
    words: Option<Vec<u32>>,
}

const PENDING: u8 = 0;
const MAPPED: u8 = 1;
const FAILED: u8 = 2;

/// A step in flight: `index`-th of the submission in `slot`.
struct InFlight {
    slot: usize,
    index: usize,
    /// The last step of its submission (its slot is free once read).
    last: bool,
    step: u32,
    submission: wgpu::SubmissionIndex,
    encode: Duration,
    submit: Duration,
}

/// The readback slots (one a submission in flight), the sampler's step log and the timestamp
/// queries of one run.
struct Ring {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Steps a submission holds at most (entries of the log, timestamp pairs of a slot).
    steps: usize,
    /// Timestamps: the query set (a pair a step of every slot) and the buffer it resolves into.
    queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    period_ns: f64,
}

impl Ring {
    fn new(gpu: &Gpu, depth: usize, steps: usize) -> Ring {
        let bytes = (8 + 16) * steps as u64;
        let slots = (0..depth)
            .map(|_| Slot {
                buffer: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("decode readback slot"),
                    size: bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                state: Arc::new(AtomicU8::new(PENDING)),
                words: None,
            })
            .collect();
        // (Timestamps only where the run's pairs fit one query set.)
        let timed = gpu.caps.timestamps && 2 * depth * steps <= wgpu::QUERY_SET_MAX_QUERIES as usize;
        let queries = timed.then(|| {
            let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("decode step timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: (2 * depth * steps) as u32,
            });
            let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("decode step timestamps resolved"),
                size: depth as u64 * Self::resolve_stride(steps),
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (set, resolve)
        });
        Ring {
            slots,
            free: (0..depth).rev().collect(),
            steps,
            queries,
            period_ns: f64::from(gpu.queue.get_timestamp_period()),
        }
    }

    /// Bytes of a slot's region of the resolve buffer.
    fn resolve_stride(steps: usize) -> u64 {
        (16 * steps as u64).next_multiple_of(wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT)
    }

    /// The timestamp writes of the `index`-th step of the submission in `slot`.
    fn timestamp_writes(&self, slot: usize, index: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let q = (2 * (slot * self.steps + index)) as u32;
        self.queries.as_ref().map(|(set, _)| wgpu::ComputePassTimestampWrites {
            query_set: set,
            beginning_of_pass_write_index: Some(q),
            end_of_pass_write_index: Some(q + 1),
        })
    }

    /// Copies the sampler's step log (its (id, status) of step `s` at entry `s % steps`) and
    /// (with timestamps) the `n` steps' pass times into the slot.
    fn record_readback(&self, enc: &mut wgpu::CommandEncoder, slot: usize, n: usize, log: &wgpu::Buffer) {
        let s = &self.slots[slot];
        let log_bytes = 8 * self.steps as u64;
        enc.copy_buffer_to_buffer(log, 0, &s.buffer, 0, log_bytes);
        if let Some((set, resolve)) = &self.queries {
            let q = (2 * slot * self.steps) as u32;
            let at = slot as u64 * Self::resolve_stride(self.steps);
            enc.resolve_query_set(set, q..q + 2 * n as u32, resolve, at);
            enc.copy_buffer_to_buffer(resolve, at, &s.buffer, log_bytes, 16 * n as u64);
        }
    }
}

/// What a step's slot held.
struct Read {
    token: u32,
    non_finite: bool,
    gpu: Option<Duration>,
}

/// Runs the loop; `stats` has the prompt's length and its start (`cached_tokens`: the positions
/// the model holds before it). `controls` (started on `sampler`): the sequence's logit controls,
/// applied and counted on the GPU in every step's pass.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    model: &mut Model,
    sampler: &mut DeviceSampler,
    job: Job,
    controls: Option<&SeqControls>,
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    depth: usize,
    steps: usize,
    mut stats: Stats,
) -> Result<Stats> {
    let Job { prompt, max_tokens, params, eos } = job;
    let end = stats.cached_tokens + prompt.len();
    let gpu = model.gpu.clone();
    let steps = steps.max(1);
    // A readback slot and a region of uniforms per submission in flight.
    let mut ring = Ring::new(&gpu, depth, steps);
    let uniforms = Uniforms::new(&gpu, depth, steps);
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    // Tokens that can be produced: max_tokens, and one per free position plus the one sampled
    // from the prompt's last position.
    let room = room(model, end);
    let budget = max_tokens.min(room);
    let ids = model.plan(1)?.ids.clone();
    stats.depth = depth;
    stats.steps_per_submit = steps;
    stats.dispatches_per_step = model.plan(1)?.dispatches() + sampler_dispatches(params);

    let t0 = Instant::now();
    // Step 0: the prompt, then the sampler into the decode plan's ids.
    let logits = model.forward(prompt)?;
    let te = Instant::now();
    sampler.set_params(&gpu, std::slice::from_ref(params), 0)?;
    if let Some(c) = controls {
        sampler.set_controls(&gpu, &[Some(c)])?;
        stats.dispatches_per_step += 2;
    }
    let slot = ring.free.pop().expect("depth >= 1");
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sample prompt") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("sample prompt"),
            timestamp_writes: ring.timestamp_writes(slot, 0),
        });
        sampler.encode_pass(&gpu, &mut pass, &logits, 1, &ids, PassLog::Steps(steps))?;
    }
    ring.record_readback(&mut enc, slot, 1, sampler.step_log()?);
    submit_steps(&gpu, &ring, &mut in_flight, enc, slot, &[0], te)?;

    let mut next_step = 1u32; // the next step to submit
    let mut submissions = 0usize;
    let mut waits = 0usize;
    let mut t1 = None;
    let result = 'run: loop {
        // Keep `depth` submissions of up to `steps` steps in flight, never past the budget.
        while let Some(&slot) = ring.free.last() {
            let n = steps.min(budget.saturating_sub(next_step as usize));
            if n == 0 {
                break;
            }
            ring.free.pop();
            let submitted = submit_decode(
                model,
                sampler,
                params,
                &ring,
                &uniforms,
                &mut in_flight,
                slot,
                next_step,
                n,
                submissions,
            );
            if let Err(e) = submitted {
                break 'run Err(e);
            }
            next_step += n as u32;
            submissions += 1;
        }
        let Some(f) = in_flight.pop_front() else {
            break Ok(());
        };
        let tw = Instant::now();
        waits += usize::from(f.step > 0 && ring.slots[f.slot].words.is_none());
        let read = match read_step(&gpu, &mut ring, &f) {
            Ok(read) => read,
            Err(e) => break Err(e),
        };
        let wait = tw.elapsed();
        if read.non_finite {
            // The logits of step s came from position end + s - 1.
            break Err(non_finite_error(f.step, end + f.step as usize - 1));
        }
        if f.step == 0 {
            stats.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        } else {
            stats.steps.push(StepTiming { encode: f.encode, submit: f.submit, wait, gpu: read.gpu });
        }
        stats.generated_tokens += 1;
        match on_token(read.token) {
            Ok(true) => {}
            Ok(false) => {
                stats.stop = StopReason::Caller;
                break Ok(());
            }
            Err(e) => break Err(e),
        }
        if let Some(s) = stop_after(read.token, stats.generated_tokens, max_tokens, room, eos) {
            stats.stop = s;
            break Ok(());
        }
    };
    // Steps past the stop are dropped unread: the GPU runs them before anything submitted later,
    // and the rollback hands their positions to later passes, so nothing waits for them.
    stats.discarded_steps = in_flight.len();
    in_flight.clear();
    let delivered = stats.generated_tokens;
    if result.is_err() {
        // Non-finite logits, a failed submission or the caller's error: what the model holds past
        // the last good token is of no use, and more steps than a recurrent state ring rolls
        // back may be past it.
        model.reset();
    } else if delivered > 0 {
        model.rollback(end + delivered - 1);
    }
    if let Some(t1) = t1 {
        stats.decode = t1.elapsed();
    }
    let decode_steps = stats.steps.len().max(1) as f64;
    stats.submits_per_step = (submissions as f64 / (next_step - 1).max(1) as f64).min(1.0);
    stats.waits_per_step = waits as f64 / decode_steps;
    gpu.check()?;
    result.map(|()| stats)
}

/// Records and submits decode steps `first .. first + n` in one command buffer for `slot`
/// (uniform region `submission % regions`).
#[allow(clippy::too_many_arguments)]
fn submit_decode(
    model: &mut Model,
    sampler: &mut DeviceSampler,
    params: &SamplingParams,
    ring: &Ring,
    uniforms: &Uniforms,
    in_flight: &mut VecDeque<InFlight>,
    slot: usize,
    first: u32,
    n: usize,
    submission: usize,
) -> Result<()> {
    let gpu = model.gpu.clone();
    let steps = ring.steps;
    let te = Instant::now();
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("decode steps") });
    let region = submission % uniforms.regions;
    let mut bytes = Vec::with_capacity(n * UNIFORM_STRIDE as usize);
    let batch: Vec<u32> = (first..first + n as u32).collect();
    for (index, &step) in batch.iter().enumerate() {
        let at = uniforms.at(region, bytes.len());
        let step_params = model.advance(1)?;
        let sampling = sampler.step_params(std::slice::from_ref(params), step)?;
        bytes.extend_from_slice(bytemuck::bytes_of(&step_params));
        bytes.extend_from_slice(&sampling);
        assert!(bytes.len() <= (index + 1) * UNIFORM_STRIDE as usize, "a step's uniforms fit its stride");
        bytes.resize((index + 1) * UNIFORM_STRIDE as usize, 0);
        let step_len = std::mem::size_of_val(&step_params) as u64;
        enc.copy_buffer_to_buffer(&uniforms.buffer, at, model.step_buffer(), 0, step_len);
        let sampler_params = sampler.params_buffer()?;
        enc.copy_buffer_to_buffer(&uniforms.buffer, at + step_len, sampler_params, 0, sampling.len() as u64);
        let plan = model.staged_plan(1)?;
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("decode step"),
            timestamp_writes: ring.timestamp_writes(slot, index),
        });
        plan.encode_pass(&mut pass);
        sampler.encode_pass(&gpu, &mut pass, &plan.logits, 1, &plan.ids, PassLog::Steps(steps))?;
    }
    ring.record_readback(&mut enc, slot, n, sampler.step_log()?);
    gpu.queue.write_buffer(&uniforms.buffer, uniforms.at(region, 0), &bytes);
    submit_steps(&gpu, ring, in_flight, enc, slot, &batch, te)
}

/// The sampler's dispatches for these parameters (2 greedy, 3 sampling).
pub(super) fn sampler_dispatches(params: &SamplingParams) -> usize {
    if params.is_greedy() {
        2
    } else {
        3
    }
}

/// Finishes and submits a command buffer of the steps `steps` (in order) recorded for `slot`,
/// and maps the slot; each step is charged an equal share of the encoding and submission time.
fn submit_steps(
    gpu: &Gpu,
    ring: &Ring,
    in_flight: &mut VecDeque<InFlight>,
    enc: wgpu::CommandEncoder,
    slot: usize,
    steps: &[u32],
    started: Instant,
) -> Result<()> {
    let cmd = enc.finish();
    let encode = started.elapsed() / steps.len() as u32;
    let ts = Instant::now();
    let submission = gpu.queue.submit([cmd]);
    let submit = ts.elapsed() / steps.len() as u32;
    let state = ring.slots[slot].state.clone();
    state.store(PENDING, Ordering::Relaxed);
    ring.slots[slot].buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        state.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
    });
    for (index, &step) in steps.iter().enumerate() {
        let last = index + 1 == steps.len();
        in_flight.push_back(InFlight { slot, index, last, step, submission: submission.clone(), encode, submit });
    }
    Ok(())
}

/// Bytes a decode step's uniforms take in [`Uniforms`] (the step's [`crate::ops::StepParams`],
/// then the sampler's parameters; a copy's offset must be a multiple of 4).
const UNIFORM_STRIDE: u64 = 256;

/// The uniforms of the submissions in flight, written ahead by the host (`queue.write_buffer`)
/// and copied into the buffers the kernels read by each step's commands: a region of `steps`
/// steps per submission, one more region than submissions in flight.
struct Uniforms {
    buffer: wgpu::Buffer,
    regions: usize,
    region_bytes: u64,
}

impl Uniforms {
    fn new(gpu: &Gpu, depth: usize, steps: usize) -> Uniforms {
        let regions = depth + 1;
        let region_bytes = steps as u64 * UNIFORM_STRIDE;
        let buffer = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("decode step uniforms"),
            size: regions as u64 * region_bytes,
            usage: wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Uniforms { buffer, regions, region_bytes }
    }

    /// Byte `offset` of region `region`.
    fn at(&self, region: usize, offset: usize) -> u64 {
        region as u64 * self.region_bytes + offset as u64
    }
}

/// Reads a step's token, status and GPU time: the first step read of a submission waits for it
/// and reads its slot whole; the last frees the slot.
fn read_step(gpu: &Gpu, ring: &mut Ring, f: &InFlight) -> Result<Read> {
    if ring.slots[f.slot].words.is_none() {
        let words = read_slot(gpu, ring, f)?;
        ring.slots[f.slot].words = Some(words);
    }
    let steps = ring.steps;
    let w = ring.slots[f.slot].words.as_ref().expect("read above");
    let e = 2 * (f.step as usize % steps);
    let (token, non_finite) = (w[e], w[e + 1] != 0);
    let gpu_time = ring.queries.as_ref().map(|_| {
        let t = 2 * steps + 4 * f.index;
        let begin = u64::from(w[t]) | (u64::from(w[t + 1]) << 32);
        let end = u64::from(w[t + 2]) | (u64::from(w[t + 3]) << 32);
        Duration::from_nanos((end.saturating_sub(begin) as f64 * ring.period_ns) as u64)
    });
    if f.last {
        ring.slots[f.slot].words = None;
        ring.free.push(f.slot);
    }
    Ok(Read { token, non_finite, gpu: gpu_time })
}

/// Waits for a submission, reads its slot's words and unmaps it.
fn read_slot(gpu: &Gpu, ring: &Ring, f: &InFlight) -> Result<Vec<u32>> {
    gpu.device
        .poll(wgpu::PollType::Wait { submission_index: Some(f.submission.clone()), timeout: None })
        .map_err(|e| Error::Gpu(format!("waiting for decode step {}: {e}", f.step)))?;
    gpu.check()?;
    // The submission is done, but another thread polling the same device may have taken the map
    // callback and not run it yet: give it a moment.
    let waited = Instant::now();
    while ring.slots[f.slot].state.load(Ordering::Acquire) == PENDING && waited.elapsed().as_secs() < 10 {
        std::thread::yield_now();
        let _ = gpu.device.poll(wgpu::PollType::Poll);
    }
    match ring.slots[f.slot].state.load(Ordering::Acquire) {
        MAPPED => {}
        FAILED => return Err(Error::Gpu(format!("mapping decode step {}'s token failed", f.step))),
        _ => return Err(Error::Gpu(format!("decode step {}'s readback callback never ran", f.step))),
    }
    let buffer = &ring.slots[f.slot].buffer;
    let words: Vec<u32> = {
        let view =
            buffer.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("reading a mapped slot: {e}")))?;
        bytemuck::pod_collect_to_vec(&view[..])
    };
    buffer.unmap();
    Ok(words)
}
