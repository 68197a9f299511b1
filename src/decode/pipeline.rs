//! The GPU-resident, pipelined decode loop (see the [module docs](super)).
//!
//! Step `s` (`s ≥ 1`) is: copies of its uniforms (the position, the sampling step) from a
//! buffer the host wrote ahead into the ones the kernels read; the one-token forward pass reading
//! its input id from the plan's ids buffer, then the device sampler writing the sampled id back
//! into that same buffer (the input of step `s + 1`) and its status word, in one compute pass
//! with timestamp writes at its ends; then copies of the id, the status and the resolved
//! timestamps into the step's readback slot. `steps` such steps go in one command buffer (one
//! submission); command order makes step `s + 1` read what step `s` wrote, so the host can record
//! and submit up to `depth` submissions ahead. The slot of the oldest step is mapped and read
//! first: tokens reach the caller in order.
//!
//! Stops: max-tokens and a full context are known ahead, so no step past them is submitted. Eos,
//! the caller's stop and non-finite logits are seen up to `depth · steps - 1` steps late: those
//! steps are waited for, dropped, and the model's position is rolled back to where the
//! step-by-step loop would have left it (the KV entries they wrote lie past it and are
//! overwritten by later passes).

use super::{non_finite_error, room, stop_after, Stats, StepTiming, StopReason};
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::model::Model;
use crate::sampling::{DeviceSampler, SamplingParams};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of a readback slot: id, status, then the pass's two u64 timestamps.
const SLOT_BYTES: u64 = 24;

/// One step's readback buffer and what is known about the step in flight.
struct Slot {
    buffer: wgpu::Buffer,
    /// Index of this slot's timestamp pair in the query set.
    index: u32,
    /// The map callback's outcome: [`PENDING`], [`MAPPED`] or [`FAILED`] (made once, reused by
    /// every step the slot carries).
    state: Arc<AtomicU8>,
}

const PENDING: u8 = 0;
const MAPPED: u8 = 1;
const FAILED: u8 = 2;

struct InFlight {
    slot: usize,
    step: u32,
    submission: wgpu::SubmissionIndex,
    encode: Duration,
    submit: Duration,
}

/// The readback slots and the timestamp queries of one run.
struct Ring {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// Timestamps: the query set and the buffer it resolves into (256 bytes a slot).
    queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    period_ns: f64,
}

impl Ring {
    fn new(gpu: &Gpu, depth: usize) -> Ring {
        let slots = (0..depth)
            .map(|i| Slot {
                buffer: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("decode readback slot"),
                    size: SLOT_BYTES,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }),
                index: i as u32,
                state: Arc::new(AtomicU8::new(PENDING)),
            })
            .collect();
        let queries = gpu.caps.timestamps.then(|| {
            let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("decode step timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * depth as u32,
            });
            let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("decode step timestamps resolved"),
                size: depth as u64 * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (set, resolve)
        });
        Ring {
            slots,
            free: (0..depth).rev().collect(),
            queries,
            period_ns: f64::from(gpu.queue.get_timestamp_period()),
        }
    }

    fn timestamp_writes(&self, slot: usize) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        self.queries.as_ref().map(|(set, _)| wgpu::ComputePassTimestampWrites {
            query_set: set,
            beginning_of_pass_write_index: Some(2 * self.slots[slot].index),
            end_of_pass_write_index: Some(2 * self.slots[slot].index + 1),
        })
    }

    /// Copies the sampled id, the sampler's status and (with timestamps) the pass's times into
    /// the slot.
    fn record_readback(
        &self,
        enc: &mut wgpu::CommandEncoder,
        slot: usize,
        ids: &crate::gpu::Tensor,
        status: &wgpu::Buffer,
    ) {
        let s = &self.slots[slot];
        enc.copy_buffer_to_buffer(&ids.buffer, ids.offset, &s.buffer, 0, 4);
        enc.copy_buffer_to_buffer(status, 0, &s.buffer, 4, 4);
        if let Some((set, resolve)) = &self.queries {
            let at = u64::from(s.index) * wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT;
            enc.resolve_query_set(set, 2 * s.index..2 * s.index + 2, resolve, at);
            enc.copy_buffer_to_buffer(resolve, at, &s.buffer, 8, 16);
        }
    }
}

/// What a step's slot held.
struct Read {
    token: u32,
    non_finite: bool,
    gpu: Option<Duration>,
}

/// Runs the loop; `model` was reset and `stats` has the prompt length.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    model: &mut Model,
    sampler: &mut DeviceSampler,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
    depth: usize,
    steps: usize,
    mut stats: Stats,
) -> Result<Stats> {
    let gpu = model.gpu.clone();
    let steps = steps.max(1);
    // A readback slot per step in flight, a region of uniforms per submission in flight.
    let mut ring = Ring::new(&gpu, depth * steps);
    let uniforms = Uniforms::new(&gpu, depth, steps);
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    // Tokens that can be produced: max_tokens, and one per free position plus the one sampled
    // from the prompt's last position.
    let room = room(model, prompt.len());
    let budget = max_tokens.min(room);
    let ids = model.plan(1)?.ids.clone();
    stats.depth = depth;
    stats.steps_per_submit = steps;
    stats.dispatches_per_step = model.plan(1)?.dispatches() + sampler_dispatches(params);
    stats.submits_per_step = 1;
    stats.waits_per_step = 1;

    let t0 = Instant::now();
    // Step 0: the prompt, then the sampler into the decode plan's ids.
    let logits = model.forward(prompt)?;
    let te = Instant::now();
    sampler.set_params(&gpu, std::slice::from_ref(params), 0)?;
    let slot = ring.free.pop().expect("depth >= 1");
    let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("sample prompt") });
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("sample prompt"),
            timestamp_writes: ring.timestamp_writes(slot),
        });
        sampler.encode_pass(&gpu, &mut pass, &logits, 1, &ids)?;
    }
    ring.record_readback(&mut enc, slot, &ids, status_buffer(sampler)?);
    submit_steps(&gpu, &ring, &mut in_flight, enc, &[(slot, 0)], te)?;

    let mut next_step = 1u32; // the next step to submit
    let mut submissions = 0usize;
    let mut t1 = None;
    let result = loop {
        // Keep `depth` submissions of `steps` steps in flight, never past the budget.
        loop {
            let n = steps.min(budget.saturating_sub(next_step as usize));
            if n == 0 || in_flight.len() + n > depth * steps {
                break;
            }
            let te = Instant::now();
            let mut enc =
                gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("decode steps") });
            let region = submissions % uniforms.regions;
            let mut bytes = Vec::with_capacity(n * UNIFORM_STRIDE as usize);
            let mut slots = Vec::with_capacity(n);
            for step in next_step..next_step + n as u32 {
                let at = uniforms.at(region, bytes.len());
                let step_params = model.advance(1)?;
                let sampling = sampler.step_params(std::slice::from_ref(params), step)?;
                bytes.extend_from_slice(bytemuck::bytes_of(&step_params));
                bytes.extend_from_slice(&sampling);
                debug_assert!(bytes.len() <= uniforms.at(0, 0) as usize + (slots.len() + 1) * UNIFORM_STRIDE as usize);
                bytes.resize(bytes.len().next_multiple_of(UNIFORM_STRIDE as usize), 0);
                let step_len = std::mem::size_of_val(&step_params) as u64;
                enc.copy_buffer_to_buffer(&uniforms.buffer, at, model.step_buffer(), 0, step_len);
                enc.copy_buffer_to_buffer(
                    &uniforms.buffer,
                    at + step_len,
                    sampler.params_buffer()?,
                    0,
                    sampling.len() as u64,
                );
                let slot = ring.free.pop().expect("a slot per step in flight");
                let plan = model.staged_plan(1)?;
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: Some("decode step"),
                        timestamp_writes: ring.timestamp_writes(slot),
                    });
                    plan.encode_pass(&mut pass);
                    sampler.encode_pass(&gpu, &mut pass, &plan.logits, 1, &plan.ids)?;
                }
                ring.record_readback(&mut enc, slot, &ids, status_buffer(sampler)?);
                slots.push((slot, step));
            }
            gpu.queue.write_buffer(&uniforms.buffer, uniforms.at(region, 0), &bytes);
            submit_steps(&gpu, &ring, &mut in_flight, enc, &slots, te)?;
            next_step += n as u32;
            submissions += 1;
        }
        let Some(f) = in_flight.pop_front() else {
            break Ok(());
        };
        let tw = Instant::now();
        let read = read_slot(&gpu, &ring, &f)?;
        ring.free.push(f.slot);
        let wait = tw.elapsed();
        if read.non_finite {
            // The logits of step s came from position prompt + s - 1.
            break Err(non_finite_error(f.step, prompt.len() + f.step as usize - 1));
        }
        if f.step == 0 {
            stats.prefill = t0.elapsed();
            t1 = Some(Instant::now());
        } else {
            stats.steps.push(StepTiming { encode: f.encode, submit: f.submit, wait, gpu: read.gpu });
        }
        stats.generated_tokens += 1;
        if !on_token(read.token)? {
            stats.stop = StopReason::Caller;
            break Ok(());
        }
        if let Some(s) = stop_after(read.token, stats.generated_tokens, max_tokens, room, eos) {
            stats.stop = s;
            break Ok(());
        }
    };
    // Steps past the stop: wait for them, drop their tokens, roll their positions back.
    stats.discarded_steps = in_flight.len();
    for f in in_flight.drain(..) {
        read_slot(&gpu, &ring, &f)?;
    }
    let delivered = stats.generated_tokens;
    if delivered > 0 {
        model.rollback(prompt.len() + delivered - 1);
    }
    if let Some(t1) = t1 {
        stats.decode = t1.elapsed();
    }
    gpu.check()?;
    result.map(|()| stats)
}

/// The sampler's dispatches for these parameters (2 greedy, 3 sampling).
pub(super) fn sampler_dispatches(params: &SamplingParams) -> usize {
    if params.is_greedy() {
        2
    } else {
        3
    }
}

fn status_buffer(sampler: &DeviceSampler) -> Result<&wgpu::Buffer> {
    sampler.status().ok_or_else(|| Error::Gpu("the sampler's status buffer is missing after encoding".into()))
}

/// Finishes and submits a command buffer of one or more steps, `(slot, step)` in order, and maps
/// their slots; each step is charged an equal share of the encoding and submission time.
fn submit_steps(
    gpu: &Gpu,
    ring: &Ring,
    in_flight: &mut VecDeque<InFlight>,
    enc: wgpu::CommandEncoder,
    slots: &[(usize, u32)],
    started: Instant,
) -> Result<()> {
    let cmd = enc.finish();
    let encode = started.elapsed() / slots.len() as u32;
    let ts = Instant::now();
    let submission = gpu.queue.submit([cmd]);
    let submit = ts.elapsed() / slots.len() as u32;
    for &(slot, step) in slots {
        let state = ring.slots[slot].state.clone();
        state.store(PENDING, Ordering::Relaxed);
        ring.slots[slot].buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            state.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
        });
        in_flight.push_back(InFlight { slot, step, submission: submission.clone(), encode, submit });
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

/// Waits for a step's submission, reads its slot and unmaps it.
fn read_slot(gpu: &Gpu, ring: &Ring, f: &InFlight) -> Result<Read> {
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
    let words: [u32; 6] = {
        let view =
            buffer.slice(..).get_mapped_range().map_err(|e| Error::Gpu(format!("reading a mapped slot: {e}")))?;
        bytemuck::pod_read_unaligned(&view[..SLOT_BYTES as usize])
    };
    buffer.unmap();
    let gpu_time = ring.queries.as_ref().map(|_| {
        let begin = u64::from(words[2]) | (u64::from(words[3]) << 32);
        let end = u64::from(words[4]) | (u64::from(words[5]) << 32);
        Duration::from_nanos((end.saturating_sub(begin) as f64 * ring.period_ns) as u64)
    });
    Ok(Read { token: words[0], non_finite: words[1] != 0, gpu: gpu_time })
}
