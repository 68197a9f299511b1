//! Many sequences at once: a [`BatchEngine`] owns a model and a sampler and steps every active
//! request together. Requests are [`submit`](BatchEngine::submit)ted at any time, join at a step
//! boundary (their prompt is prefilled, their first token sampled) and leave when they stop or
//! are [`cancel`](BatchEngine::cancel)led, without stalling the others. Each [`step`](BatchEngine::step)
//! delivers at most one [`Event::Token`] per active request, in order, and an [`Event::Finished`]
//! when it ends.
//!
//! A request's tokens depend only on its prompt, its parameters and its seed: the sampler's
//! counter is keyed by the request's own step, never by its row in the batch. With a prefix cache
//! ([`BatchOptions::prefix_cache_bytes`], [`super::prefix`]) a request may reuse the KV entries of
//! an earlier one: its tokens are then those of a cold run up to rounding.
//!
//! A request may carry a constraint ([`Request::constraint`], a [`Matcher`]): each of its tokens
//! is drawn under the mask its matcher gives, with the stop rules of the one-sequence
//! constrained loop ([`constrained`](super::constrained)). The host must see each of its tokens
//! before the next mask, so while a constrained request runs every step is read back (no steps
//! in flight); its masks are per row, so its tokens do not depend on the others.

use super::common::{non_finite_error, stop_after, StopReason};
use super::prefix::{PrefixCache, PrefixStats};
use crate::error::{Error, Result};
use crate::grammar::Matcher;
pub use crate::model::forward::BatchForm;
use crate::model::Model;
use crate::sampling::device::PassLog;
use crate::sampling::logprobs::{Layout, LogprobHead, TokenLogprobs};
use crate::sampling::{Draw, LogitControls, RowKey, Rows, SamplingBackend, SamplingParams, SeqControls, TokenMask};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

/// A request's handle, unique for the engine's lifetime.
pub type SeqId = u64;

/// One generation request (token ids in, token ids out; text is the caller's business).
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Tokens to generate at most (the context may end the request earlier).
    pub max_tokens: usize,
    /// Tokens that end the request (delivered, then [`StopReason::Eos`]). For a constrained
    /// request, its end-of-sequence tokens: those of the vocabulary its matcher was made on
    /// ([`Vocabulary::eos`](crate::grammar::Vocabulary::eos)).
    pub stop_ids: Vec<u32>,
    /// The constraint its output follows (a matcher at the start of the output), or `None`. It
    /// ends with [`StopReason::Eos`] when the output is complete (an end token sampled, or
    /// nothing else allowed), never at `max_tokens` or a full context.
    pub constraint: Option<Matcher>,
    /// Logprobs to report with each token ([`Event::Token`]; [`crate::sampling::logprobs`]):
    /// `Some(n)`, the sampled token's and the `n` most likely tokens' (`n ≤ 20`; 0: the sampled
    /// token's only); `None`, none (no work).
    pub logprobs: Option<u32>,
    /// Its logit controls ([`crate::sampling::penalty`]; default: off), counted over its prompt
    /// and its tokens in its own sequence, so they do not depend on the other rows.
    pub controls: LogitControls,
}

impl Request {
    /// A request without a constraint.
    pub fn new(prompt: Vec<u32>, params: SamplingParams, max_tokens: usize, stop_ids: Vec<u32>) -> Self {
        Self {
            prompt,
            params,
            max_tokens,
            stop_ids,
            constraint: None,
            logprobs: None,
            controls: LogitControls::default(),
        }
    }
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt", &self.prompt)
            .field("params", &self.params)
            .field("max_tokens", &self.max_tokens)
            .field("stop_ids", &self.stop_ids)
            .field("constrained", &self.constraint.is_some())
            .field("logprobs", &self.logprobs)
            .field("controls", &self.controls)
            .finish()
    }
}

/// What [`BatchEngine::step`] reports about a request.
#[derive(Debug)]
pub enum Event {
    /// The request's prompt was prefilled: `cached_tokens` of its positions came from the prefix
    /// cache ([`BatchOptions::prefix_cache_bytes`]). Once, before its first token.
    Started { cached_tokens: usize },
    /// The request's next token, with its logprobs when the request asked ([`Request::logprobs`]).
    Token(u32, Option<TokenLogprobs>),
    /// The request ended (after its last token); its sequence is freed.
    Finished { reason: StopReason, prompt_tokens: usize, generated_tokens: usize },
    /// The request failed (e.g. its logits were not finite); its sequence is freed.
    Failed(Error),
}

/// Bounds of a [`BatchEngine`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchOptions {
    /// Sequences decoded together at most.
    pub max_batch: usize,
    /// Requests waiting for a sequence at most, besides those that a free sequence takes at the
    /// next step; [`BatchEngine::submit`] refuses more.
    pub max_queue: usize,
    /// How a step computes each sequence's row ([`BatchForm`]); `None`: the one-token form for an
    /// engine of one sequence (`generate`'s numbers and speed), the batched form for more.
    pub form: Option<BatchForm>,
    /// Bytes of GPU memory the prefix cache may hold ([`super::prefix`]: a request whose prompt
    /// starts with tokens of an earlier one prefills only the rest; its tokens are a cold run's
    /// up to rounding); 0, the default, turns it off.
    pub prefix_cache_bytes: u64,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self { max_batch: 8, max_queue: 64, form: None, prefix_cache_bytes: 0 }
    }
}

impl BatchOptions {
    /// Up to `max_batch` sequences together and `max_queue` waiting, the form by default.
    pub fn new(max_batch: usize, max_queue: usize) -> Self {
        Self { max_batch, max_queue, form: None, prefix_cache_bytes: 0 }
    }

    /// The form a step takes ([`Self::form`], or the default for `max_batch`).
    pub fn batch_form(&self) -> BatchForm {
        self.form.unwrap_or(if self.max_batch == 1 { BatchForm::OneToken } else { BatchForm::Batched })
    }
}

/// Why [`BatchEngine::submit`] refused a request.
#[derive(Debug)]
pub enum SubmitError {
    /// The request itself is bad (empty prompt, prompt beyond the context, parameters out of
    /// range): a client error.
    Invalid(Error),
    /// The queue is full: try again later.
    QueueFull,
}

impl std::fmt::Display for SubmitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubmitError::Invalid(e) => e.fmt(f),
            SubmitError::QueueFull => f.write_str("the request queue is full; try again later"),
        }
    }
}

impl std::error::Error for SubmitError {}

/// A running request.
struct Seq {
    id: SeqId,
    req: Request,
    /// Its KV-cache slot.
    slot: u32,
    /// The tokens delivered (what its KV entries hold after the prompt, for the prefix cache; the
    /// last one is the next step's input after a change of the batch).
    out: Vec<u32>,
    /// It failed: its KV entries are not kept.
    failed: bool,
    /// Tokens sampled or being sampled (steps submitted, the prompt's included): the next
    /// decode step feeds token `submitted - 1` at position `prompt + submitted - 1` and samples
    /// token `submitted` with the sampler's step `submitted`.
    submitted: usize,
    /// Tokens this request may produce: `max_tokens`, and one per free position after the
    /// prompt plus the one sampled from its last position.
    budget: usize,
    /// It stopped; steps already in flight still carry it, their tokens dropped.
    stopped: bool,
    /// A constrained request's mask for its next token.
    mask: Option<TokenMask>,
    /// Its logit controls and the host's counts of its tokens.
    controls: Option<SeqControls>,
}

impl Seq {
    fn wants_step(&self) -> bool {
        !self.stopped && self.submitted < self.budget
    }

    fn constrained(&self) -> bool {
        self.req.constraint.is_some()
    }

    /// Tokens delivered.
    fn delivered(&self) -> usize {
        self.out.len()
    }

    /// The last token delivered (a running request has one: admission delivers the first).
    fn last(&self) -> u32 {
        self.out.last().copied().unwrap_or(0)
    }
}

/// A request waiting for a sequence, with its first mask when it is constrained.
struct Queued {
    id: SeqId,
    req: Request,
    mask: Option<TokenMask>,
}

/// A decode step in flight: its readback slot, and which request each row was.
struct InFlight {
    ring: usize,
    rows: Vec<SeqId>,
    submission: wgpu::SubmissionIndex,
    /// The logprobs read back after the status words, when some row asked.
    logprobs: Option<Layout>,
}

/// Readback buffers of the steps in flight: per row, the sampled id, then per row the status,
/// then the logprobs of the rows that asked.
struct Ring {
    buffers: Vec<(wgpu::Buffer, Arc<AtomicU8>)>,
    free: Vec<usize>,
}

const PENDING: u8 = 0;
const MAPPED: u8 = 1;
const FAILED: u8 = 2;

/// Steps many requests together over one model (see the [module docs](self)).
pub struct BatchEngine {
    model: Model,
    sampler: Box<dyn SamplingBackend + Send>,
    opts: BatchOptions,
    /// Decode steps in flight (the device sampler's GPU-resident loop); 0 with the host sampler.
    depth: usize,
    /// The model decodes many sequences in one pass (else one request runs at a time).
    batched: bool,
    queue: VecDeque<Queued>,
    /// Running requests, in the row order of the steps being submitted.
    running: Vec<Seq>,
    free_slots: Vec<u32>,
    in_flight: VecDeque<InFlight>,
    ring: Ring,
    /// The rows of the last step submitted, whose ids the sampler left in the plan's ids buffer:
    /// the next step reads them there when the rows are the same.
    fed: Vec<SeqId>,
    /// A step sampled by a readback (host sampler, or no steps in flight), to deliver, with its
    /// rows' logprobs.
    pending: Option<(Vec<SeqId>, Draw, Vec<Option<TokenLogprobs>>)>,
    /// Computes logprobs for the rows that ask (made when one first does).
    logprobs: Option<LogprobHead>,
    next_id: SeqId,
    prefix: PrefixCache,
}

impl BatchEngine {
    /// An engine over `model`, decoding up to `opts.max_batch` sequences together (the model's
    /// KV caches are re-made for that many). With the device sampler, `depth` decode steps are
    /// in flight ([`DEFAULT_DEPTH`](super::DEFAULT_DEPTH) is a good value; 0 or the host sampler: one at a
    /// time, read back each step). A model that cannot hold several sequences (`set_sequences`
    /// answers `Unsupported`) runs one request at a time (the others wait in the queue).
    pub fn new(
        mut model: Model,
        mut sampler: Box<dyn SamplingBackend + Send>,
        opts: BatchOptions,
        depth: usize,
    ) -> Result<Self> {
        if opts.max_batch == 0 {
            return Err(Error::InvalidArgument("the batch needs at least one sequence".into()));
        }
        model.set_batch_form(opts.batch_form());
        let batched = match model.set_sequences(opts.max_batch) {
            Ok(()) => true,
            Err(Error::Unsupported(_)) => false,
            Err(e) => return Err(e),
        };
        let depth = if sampler.as_device().is_some() { depth } else { 0 };
        let rows = if batched { opts.max_batch } else { 1 };
        let ring = Ring {
            buffers: (0..depth.max(1))
                .map(|_| {
                    let b = model.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("batch readback"),
                        size: 8 * rows as u64 + LogprobHead::max_bytes(rows),
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    });
                    (b, Arc::new(AtomicU8::new(PENDING)))
                })
                .collect(),
            free: (0..depth.max(1)).rev().collect(),
        };
        let prefix = PrefixCache::new(&model, opts.prefix_cache_bytes);
        Ok(Self {
            prefix,
            model,
            sampler,
            opts,
            depth,
            batched,
            queue: VecDeque::new(),
            running: Vec::new(),
            free_slots: (0..rows as u32).rev().collect(),
            in_flight: VecDeque::new(),
            ring,
            fed: Vec::new(),
            pending: None,
            logprobs: None,
            next_id: 0,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The model, to measure it between runs ([`Model::profile_batch`]): only while the engine
    /// [`is_idle`](Self::is_idle) (what runs next starts from its own prompt; the prefix cache
    /// forgets what the model's own sequence held).
    pub fn model_mut(&mut self) -> &mut Model {
        self.prefix.forget_sequence();
        &mut self.model
    }

    /// The context of one sequence (prompt plus generated tokens), in tokens.
    pub fn max_ctx(&self) -> usize {
        self.model.max_ctx
    }

    pub fn options(&self) -> BatchOptions {
        self.opts
    }

    /// Whether requests decode together (else one at a time).
    pub fn is_batched(&self) -> bool {
        self.batched
    }

    /// Requests running now.
    pub fn active(&self) -> usize {
        self.running.iter().filter(|s| !s.stopped).count()
    }

    /// Sequences no running request holds (a stopped request's included: it is freed before the
    /// next request is admitted).
    pub fn free_sequences(&self) -> usize {
        self.free_slots.len() + self.running.iter().filter(|s| s.stopped).count()
    }

    /// What the prefix cache did and holds.
    pub fn prefix_stats(&self) -> PrefixStats {
        self.prefix.stats()
    }

    /// Empties the prefix cache (the next requests prefill their whole prompts).
    pub fn clear_prefix_cache(&mut self) {
        self.prefix.clear();
    }

    /// Requests waiting for a free sequence.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Nothing running, nothing waiting, nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.queue.is_empty() && self.in_flight.is_empty()
    }

    /// Checks a request and queues it; it joins at a later [`step`](Self::step) with a free
    /// sequence.
    /// A constrained request's first mask is computed here: a constraint that allows nothing
    /// is refused.
    pub fn submit(&mut self, mut req: Request) -> Result<SeqId, SubmitError> {
        self.check(&req).map_err(SubmitError::Invalid)?;
        // Requests that free sequences take at the next step do not wait (a stopped request's
        // sequence is freed before the next admission).
        if self.queue.len() >= self.opts.max_queue + self.free_sequences() {
            return Err(SubmitError::QueueFull);
        }
        let mask = match req.constraint.as_mut() {
            Some(m) => Some(self.first_mask(m).map_err(SubmitError::Invalid)?),
            None => None,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back(Queued { id, req, mask });
        Ok(id)
    }

    /// A constrained request's first mask, over the model's logits.
    fn first_mask(&self, matcher: &mut Matcher) -> Result<TokenMask> {
        let mask = matcher.mask()?;
        mask.check(self.model.config.vocab_size)?;
        Ok(mask)
    }

    fn check(&self, req: &Request) -> Result<()> {
        req.params.validate()?;
        req.controls.validate_for(self.model.config.vocab_size)?;
        if req.prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.model.config.vocab_size) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.model.config.vocab_size
            )));
        }
        let most = crate::sampling::MAX_TOP_LOGPROBS;
        if let Some(n) = req.logprobs.filter(|&n| n > most) {
            return Err(Error::InvalidArgument(format!("{n} top logprobs: at most {most}")));
        }
        if req.constraint.is_some() && req.stop_ids.is_empty() {
            return Err(Error::InvalidArgument(
                "a constrained request needs its end-of-sequence tokens (stop_ids)".into(),
            ));
        }
        if req.prompt.len() >= self.model.max_ctx {
            return Err(Error::InvalidArgument(format!(
                "the prompt has {} tokens but the context holds {} (prompt plus at least one generated token)",
                req.prompt.len(),
                self.model.max_ctx
            )));
        }
        Ok(())
    }

    /// Drops a queued or running request; no more events come for it. Returns whether it was
    /// known.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.queue.iter().position(|q| q.id == id) {
            self.queue.remove(i);
            return true;
        }
        match self.running.iter_mut().find(|s| s.id == id && !s.stopped) {
            Some(s) => {
                s.stopped = true;
                true
            }
            None => false,
        }
    }

    /// Runs one step: admits waiting requests into free sequences (their prompt, their first
    /// token) when no decode step is in flight, keeps up to `depth` decode steps of every running
    /// request in flight, and delivers the oldest step's tokens. Events go to `sink` in order per
    /// request. An `Err` is an engine failure (the GPU), not a request's.
    pub fn step(&mut self, sink: &mut dyn FnMut(SeqId, Event)) -> Result<()> {
        if self.in_flight.is_empty() {
            self.retire();
            self.admit(sink)?;
        }
        // Submit while the rows stay the same: a change (a request stopping, reaching its budget,
        // or one waiting with a slot free) drains the steps in flight first.
        while self.in_flight.len() < self.depth.max(1) {
            let rows: Vec<SeqId> = self.running.iter().filter(|s| s.wants_step()).map(|s| s.id).collect();
            if rows.is_empty() {
                break;
            }
            let same = self.in_flight.is_empty() || rows == self.fed;
            let joiners = !self.queue.is_empty() && !self.free_slots.is_empty();
            // A constrained row's next mask waits for its last token: nothing in flight.
            let constrained = self.running.iter().any(|s| s.wants_step() && s.constrained());
            if !same || ((joiners || constrained) && !self.in_flight.is_empty()) {
                break;
            }
            self.submit_step(&rows)?;
            if self.pending.is_some() {
                break;
            }
        }
        if let Some((rows, d, logprobs)) = self.pending.take() {
            self.deliver_rows(&rows, &d.ids, &d.non_finite, logprobs, sink);
        } else if let Some(f) = self.in_flight.pop_front() {
            let words = self.read(&f)?;
            let (ids, rest) = words.split_at(f.rows.len());
            let (status, logprobs) = rest.split_at(f.rows.len());
            let non_finite: Vec<bool> = status.iter().map(|&w| w != 0).collect();
            let logprobs = f.logprobs.as_ref().map_or_else(|| vec![None; f.rows.len()], |l| l.decode(logprobs));
            self.deliver_rows(&f.rows, ids, &non_finite, logprobs, sink);
        }
        Ok(())
    }

    /// Waits for a step in flight and reads its ids and status words.
    fn read(&mut self, f: &InFlight) -> Result<Vec<u32>> {
        let gpu = &self.model.gpu;
        gpu.device
            .poll(wgpu::PollType::Wait { submission_index: Some(f.submission.clone()), timeout: None })
            .map_err(|e| Error::Gpu(format!("waiting for a batch step: {e}")))?;
        gpu.check()?;
        let (buf, state) = &self.ring.buffers[f.ring];
        // Another thread polling the device may have taken the map callback: give it a moment.
        let waited = std::time::Instant::now();
        while state.load(Ordering::Acquire) == PENDING && waited.elapsed().as_secs() < 10 {
            std::thread::yield_now();
            let _ = gpu.device.poll(wgpu::PollType::Poll);
        }
        if state.load(Ordering::Acquire) != MAPPED {
            return Err(Error::Gpu("reading a batch step's tokens failed".into()));
        }
        let n = 8 * f.rows.len() + f.logprobs.as_ref().map_or(0, |l| l.bytes() as usize);
        let words: Vec<u32> = {
            let view = buf
                .slice(..n as u64)
                .get_mapped_range()
                .map_err(|e| Error::Gpu(format!("reading a mapped slot: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..n])
        };
        buf.unmap();
        self.ring.free.push(f.ring);
        Ok(words)
    }

    /// Delivers a step's token to each of its rows still running.
    fn deliver_rows(
        &mut self,
        rows: &[SeqId],
        ids: &[u32],
        non_finite: &[bool],
        logprobs: Vec<Option<TokenLogprobs>>,
        sink: &mut dyn FnMut(SeqId, Event),
    ) {
        let max_ctx = self.model.max_ctx;
        for ((r, id), lp) in rows.iter().enumerate().zip(logprobs) {
            if let Some(s) = self.running.iter_mut().find(|s| s.id == *id) {
                deliver(s, ids[r], non_finite[r], lp, max_ctx, sink);
            }
        }
    }

    /// Frees the slots of stopped requests (no step in flight carries them).
    fn retire(&mut self) {
        let (stopped, running) = std::mem::take(&mut self.running).into_iter().partition(|s| s.stopped);
        self.running = running;
        for s in stopped {
            self.release(s);
        }
    }

    /// Frees a stopped request's slot, keeping its KV entries in the prefix cache: its prompt and
    /// what it generated but the last token (sampled, never fed).
    fn release(&mut self, s: Seq) {
        if !s.failed {
            let mut tokens = s.req.prompt;
            tokens.extend_from_slice(&s.out[..s.out.len().saturating_sub(1)]);
            if self.batched {
                self.prefix.store(&self.model, s.slot as usize, &tokens);
            } else {
                self.prefix.hold(&self.model, tokens);
            }
        }
        self.free_slots.push(s.slot);
    }

    /// Prefills waiting requests into free slots and delivers their first tokens.
    fn admit(&mut self, sink: &mut dyn FnMut(SeqId, Event)) -> Result<()> {
        while !self.free_slots.is_empty() {
            let Some(Queued { id, req, mask }) = self.queue.pop_front() else { break };
            if req.max_tokens == 0 {
                let prompt_tokens = req.prompt.len();
                sink(id, Event::Finished { reason: StopReason::MaxTokens, prompt_tokens, generated_tokens: 0 });
                continue;
            }
            let slot = self.free_slots.pop().expect("checked");
            let (logits, cached_tokens) = if self.batched {
                let at = self.prefix.restore(&self.model, slot as usize, &req.prompt);
                (self.model.prefill_slot_at(slot as usize, at, &req.prompt[at..])?, at)
            } else {
                let at = self.prefix.resume(&mut self.model, &req.prompt);
                (self.model.forward(&req.prompt[at..])?, at)
            };
            sink(id, Event::Started { cached_tokens });
            let key = RowKey { step: 0, stream: 0 };
            let rows = Rows { params: std::slice::from_ref(&req.params), keys: &[key], masks: &[mask.as_ref()] };
            let controls = SeqControls::start(&req.controls, self.model.config.vocab_size, slot, &req.prompt)?;
            if let Some(c) = &controls {
                self.sampler.start_controls(&self.model.gpu, c)?;
            }
            let d = self.sampler.draw_controlled(&self.model.gpu, &logits, rows, &[controls.as_ref()])?;
            let lp = self.row_logprobs(&logits, &d.ids, &[req.logprobs])?.pop().flatten();
            let room = self.model.max_ctx - req.prompt.len() + 1;
            let budget = req.max_tokens.min(room);
            let s = Seq {
                id,
                req,
                slot,
                out: Vec::new(),
                failed: false,
                submitted: 1,
                budget,
                stopped: false,
                mask: None,
                controls,
            };
            self.running.push(s);
            let s = self.running.last_mut().expect("pushed");
            deliver(s, d.ids[0], d.non_finite[0], lp, self.model.max_ctx, sink);
            if self.batched && !s.failed {
                // The prompt's KV entries, for requests that share its start while it runs.
                self.prefix.store(&self.model, slot as usize, &s.req.prompt);
            }
            self.fed.clear();
            if s.stopped {
                let s = self.running.pop().expect("pushed");
                self.release(s);
            }
        }
        Ok(())
    }

    /// Records and submits one decode step of `rows`.
    fn submit_step(&mut self, rows: &[SeqId]) -> Result<()> {
        let seqs: Vec<&Seq> =
            rows.iter().map(|id| self.running.iter().find(|s| s.id == *id).expect("running")).collect();
        let params: Vec<SamplingParams> = seqs.iter().map(|s| s.req.params).collect();
        let constrained = seqs.iter().any(|s| s.constrained());
        let asks: Vec<Option<u32>> = seqs.iter().map(|s| s.req.logprobs).collect();
        let keys: Vec<RowKey> = seqs.iter().map(|s| RowKey { step: s.submitted as u32, stream: 0 }).collect();
        let at: Vec<(u32, u32)> =
            seqs.iter().map(|s| ((s.req.prompt.len() + s.submitted - 1) as u32, s.slot)).collect();
        // The inputs: from the last step's sampler on the GPU when the rows are the same, else
        // the tokens delivered last.
        let inputs: Option<Vec<u32>> = (rows != self.fed.as_slice()).then(|| seqs.iter().map(|s| s.last()).collect());
        let gpu = self.model.gpu.clone();
        if !self.batched {
            // One request at a time on the model's own sequence.
            let logits = self.model.forward(&inputs.unwrap_or_else(|| vec![seqs[0].last()]))?;
            return self.draw_now(rows, &logits, &params, &keys);
        }
        let plan = self.model.stage_batch(&at)?;
        if let Some(ids) = &inputs {
            gpu.queue.write_buffer(&plan.ids.buffer, plan.ids.offset, bytemuck::cast_slice(ids));
        }
        let Some(device) = self.sampler.as_device().filter(|_| self.depth > 0 && !constrained) else {
            let mut enc = gpu.device.create_command_encoder(&Default::default());
            plan.encode(&mut enc);
            gpu.queue.submit([enc.finish()]);
            let logits = plan.logits.clone();
            return self.draw_now(rows, &logits, &params, &keys);
        };
        device.set_rows(&gpu, &params, &keys)?;
        let controls: Vec<Option<&SeqControls>> = seqs.iter().map(|s| s.controls.as_ref()).collect();
        if controls.iter().any(Option::is_some) {
            device.set_controls(&gpu, &controls)?;
        }
        let ring = self.ring.free.pop().expect("a readback slot per step in flight");
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("batch step") });
        let logprobs = {
            let mut pass = enc
                .begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("batch step"), timestamp_writes: None });
            plan.encode_pass(&mut pass);
            device.encode_pass(&gpu, &mut pass, &plan.logits, rows.len(), &plan.ids, PassLog::Nothing)?;
            match asks.iter().any(Option::is_some) {
                true => LogprobHead::lazy(&mut self.logprobs, &gpu)?.encode_pass(
                    &gpu,
                    &mut pass,
                    &plan.logits,
                    &plan.ids,
                    &asks,
                )?,
                false => None,
            }
        };
        let status = device.status().ok_or_else(|| Error::Gpu("the sampler's status buffer is missing".into()))?;
        let (buf, state) = &self.ring.buffers[ring];
        let n = 4 * rows.len() as u64;
        enc.copy_buffer_to_buffer(&plan.ids.buffer, plan.ids.offset, buf, 0, n);
        enc.copy_buffer_to_buffer(status, 0, buf, n, n);
        let lp_bytes = logprobs.as_ref().map_or(0, Layout::bytes);
        if let (Some(head), true) = (&self.logprobs, lp_bytes > 0) {
            enc.copy_buffer_to_buffer(head.output(), 0, buf, 2 * n, lp_bytes);
        }
        let submission = gpu.queue.submit([enc.finish()]);
        state.store(PENDING, Ordering::Relaxed);
        let st = state.clone();
        buf.slice(..2 * n + lp_bytes).map_async(wgpu::MapMode::Read, move |r| {
            st.store(if r.is_ok() { MAPPED } else { FAILED }, Ordering::Release);
        });
        for id in rows {
            self.running.iter_mut().find(|s| s.id == *id).expect("running").submitted += 1;
        }
        self.fed = rows.to_vec();
        self.in_flight.push_back(InFlight { ring, rows: rows.to_vec(), submission, logprobs });
        Ok(())
    }

    /// Samples `rows` from `logits` now (read back), as a step already finished; constrained
    /// rows under their masks.
    fn draw_now(
        &mut self,
        rows: &[SeqId],
        logits: &crate::gpu::Tensor,
        params: &[SamplingParams],
        keys: &[RowKey],
    ) -> Result<()> {
        let seqs: Vec<&Seq> =
            rows.iter().map(|id| self.running.iter().find(|s| s.id == *id).expect("running")).collect();
        let masks: Vec<Option<&TokenMask>> = seqs.iter().map(|s| s.mask.as_ref()).collect();
        let asks: Vec<Option<u32>> = seqs.iter().map(|s| s.req.logprobs).collect();
        let controls: Vec<Option<&SeqControls>> = seqs.iter().map(|s| s.controls.as_ref()).collect();
        let rows_in = Rows { params, keys, masks: &masks };
        let d = self.sampler.draw_controlled(&self.model.gpu, logits, rows_in, &controls)?;
        let logprobs = self.row_logprobs(logits, &d.ids, &asks)?;
        for id in rows {
            self.running.iter_mut().find(|s| s.id == *id).expect("running").submitted += 1;
        }
        self.fed.clear();
        self.pending = Some((rows.to_vec(), d, logprobs));
        Ok(())
    }

    /// The logprobs of tokens sampled by a readback, for the rows that ask (no work if none).
    fn row_logprobs(
        &mut self,
        logits: &crate::gpu::Tensor,
        ids: &[u32],
        asks: &[Option<u32>],
    ) -> Result<Vec<Option<TokenLogprobs>>> {
        match asks.iter().any(Option::is_some) {
            true => LogprobHead::lazy(&mut self.logprobs, &self.model.gpu)?.compute(&self.model.gpu, logits, ids, asks),
            false => Ok(vec![None; asks.len()]),
        }
    }
}

/// Delivers `token`, the next of `s`, unless it stopped; stops it at eos, its budget or
/// non-finite logits (the same rule as the one-sequence loops: [`stop_after`]); a constrained
/// request also where its output is complete ([`advance`]).
fn deliver(
    s: &mut Seq,
    token: u32,
    non_finite: bool,
    logprobs: Option<TokenLogprobs>,
    max_ctx: usize,
    sink: &mut dyn FnMut(SeqId, Event),
) {
    if s.stopped {
        return;
    }
    let prompt = s.req.prompt.len();
    if non_finite {
        (s.stopped, s.failed) = (true, true);
        sink(s.id, Event::Failed(non_finite_error(s.delivered() as u32, prompt + s.delivered() - 1)));
        return;
    }
    if let Some(c) = &mut s.controls {
        c.push(token);
    }
    s.out.push(token);
    sink(s.id, Event::Token(token, logprobs));
    let room = max_ctx - prompt + 1;
    let complete = match advance(s, token) {
        Ok(complete) => complete,
        Err(e) => {
            (s.stopped, s.failed) = (true, true);
            sink(s.id, Event::Failed(e));
            return;
        }
    };
    let reason = if complete {
        Some(StopReason::Eos)
    } else {
        stop_after(token, s.delivered(), s.req.max_tokens, room, &s.req.stop_ids)
    };
    if let Some(reason) = reason {
        s.stopped = true;
        sink(s.id, Event::Finished { reason, prompt_tokens: prompt, generated_tokens: s.delivered() });
    }
}

/// Moves a constrained request's matcher past `token` and keeps its next mask: whether its
/// output is complete (an end token, the matcher finished, or nothing but an end token allowed
/// next: the rules of [`constrained`](super::constrained)). Always false for a free request.
fn advance(s: &mut Seq, token: u32) -> Result<bool> {
    let eos = &s.req.stop_ids;
    let Some(matcher) = s.req.constraint.as_mut() else { return Ok(false) };
    s.mask = None;
    if eos.contains(&token) {
        return Ok(true);
    }
    matcher.advance(token)?;
    if matcher.is_finished() {
        return Ok(true);
    }
    let mask = matcher.mask()?;
    let allowed_eos = (0..eos.len()).filter(|&i| !eos[..i].contains(&eos[i]) && mask.allows(eos[i])).count();
    if mask.count() == allowed_eos {
        return Ok(true);
    }
    s.mask = Some(mask);
    Ok(false)
}

// A server moves the engine into a worker thread of its own.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<BatchEngine>();
};
