//! Many sequences at once: a [`BatchEngine`] owns a model and a sampler and steps every active
//! request together. Requests are [`submit`](BatchEngine::submit)ted at any time, join at a step
//! boundary (their prompt is prefilled, their first token sampled) and leave when they stop or
//! are [`cancel`](BatchEngine::cancel)led, without stalling the others. Each [`step`](BatchEngine::step)
//! delivers at most one [`Event::Token`] per active request, in order, and an [`Event::Finished`]
//! when it ends.
//!
//! A request's tokens depend only on its prompt, its parameters and its seed: the sampler's
//! counter is keyed by the request's own step, never by its row in the batch.

use super::StopReason;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{SamplingBackend, SamplingParams};
use std::collections::VecDeque;

/// A request's handle, unique for the engine's lifetime.
pub type SeqId = u64;

/// One generation request (token ids in, token ids out; text is the caller's business).
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Tokens to generate at most (the context may end the request earlier).
    pub max_tokens: usize,
    /// Tokens that end the request (delivered, then [`StopReason::Eos`]).
    pub stop_ids: Vec<u32>,
}

/// What [`BatchEngine::step`] reports about a request.
#[derive(Debug)]
pub enum Event {
    /// The request's next token.
    Token(u32),
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
    /// Requests waiting for a free sequence at most; [`BatchEngine::submit`] refuses more.
    pub max_queue: usize,
}

impl Default for BatchOptions {
    fn default() -> Self {
        Self { max_batch: 8, max_queue: 64 }
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

struct Active {
    id: SeqId,
    req: Request,
    /// Tokens delivered so far.
    generated: usize,
    /// The token sampled last (the next step's input).
    last: u32,
}

/// Steps many requests together over one model (see the [module docs](self)).
pub struct BatchEngine {
    model: Model,
    sampler: Box<dyn SamplingBackend + Send>,
    opts: BatchOptions,
    queue: VecDeque<(SeqId, Request)>,
    active: Vec<Active>,
    next_id: SeqId,
}

impl BatchEngine {
    pub fn new(model: Model, sampler: Box<dyn SamplingBackend + Send>, opts: BatchOptions) -> Result<Self> {
        if opts.max_batch == 0 {
            return Err(Error::InvalidArgument("the batch needs at least one sequence".into()));
        }
        Ok(Self { model, sampler, opts, queue: VecDeque::new(), active: Vec::new(), next_id: 0 })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The context of one sequence (prompt plus generated tokens), in tokens.
    pub fn max_ctx(&self) -> usize {
        self.model.max_ctx
    }

    pub fn options(&self) -> BatchOptions {
        self.opts
    }

    /// Requests running now.
    pub fn active(&self) -> usize {
        self.active.len()
    }

    /// Requests waiting for a free sequence.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Nothing running and nothing waiting.
    pub fn is_idle(&self) -> bool {
        self.active.is_empty() && self.queue.is_empty()
    }

    /// Checks a request and queues it; it joins at the next [`step`](Self::step) with a free
    /// sequence.
    pub fn submit(&mut self, req: Request) -> Result<SeqId, SubmitError> {
        self.check(&req).map_err(SubmitError::Invalid)?;
        if self.queue.len() >= self.opts.max_queue {
            return Err(SubmitError::QueueFull);
        }
        let id = self.next_id;
        self.next_id += 1;
        self.queue.push_back((id, req));
        Ok(id)
    }

    fn check(&self, req: &Request) -> Result<()> {
        req.params.validate()?;
        if req.prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.model.config.vocab_size) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary ({})",
                self.model.config.vocab_size
            )));
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
        if let Some(i) = self.queue.iter().position(|(q, _)| *q == id) {
            self.queue.remove(i);
            return true;
        }
        if let Some(i) = self.active.iter().position(|a| a.id == id) {
            self.active.remove(i);
            return true;
        }
        false
    }

    /// Runs one step: admits waiting requests into free sequences (prefill and first token),
    /// then decodes one token for every running request. Events go to `sink` in order per
    /// request. An `Err` is an engine failure (the GPU), not a request's.
    pub fn step(&mut self, sink: &mut dyn FnMut(SeqId, Event)) -> Result<()> {
        // First version: one sequence at a time (the model holds one KV cache).
        if self.active.is_empty() {
            if let Some((id, req)) = self.queue.pop_front() {
                if req.max_tokens == 0 {
                    sink(
                        id,
                        Event::Finished {
                            reason: StopReason::MaxTokens,
                            prompt_tokens: req.prompt.len(),
                            generated_tokens: 0,
                        },
                    );
                    return Ok(());
                }
                self.model.reset();
                let logits = self.model.forward(&req.prompt)?;
                let d = self.sampler.draw(&self.model.gpu, &logits, std::slice::from_ref(&req.params), 0)?;
                let a = Active { id, req, generated: 0, last: d.ids[0] };
                self.deliver(a, d.non_finite[0], sink);
            }
            return Ok(());
        }
        let a = self.active.pop().expect("one active");
        let step = a.generated as u32;
        let logits = self.model.forward(&[a.last])?;
        let d = self.sampler.draw(&self.model.gpu, &logits, std::slice::from_ref(&a.req.params), step)?;
        let a = Active { last: d.ids[0], ..a };
        self.deliver(a, d.non_finite[0], sink);
        Ok(())
    }

    /// Delivers `a.last` and keeps `a` running unless it stops.
    fn deliver(&mut self, mut a: Active, non_finite: bool, sink: &mut dyn FnMut(SeqId, Event)) {
        if non_finite {
            let pos = a.req.prompt.len() + a.generated;
            sink(a.id, Event::Failed(super::non_finite_error(a.generated as u32, pos - 1)));
            return;
        }
        a.generated += 1;
        sink(a.id, Event::Token(a.last));
        let room = self.model.max_ctx - a.req.prompt.len() + 1;
        match super::stop_after(a.last, a.generated, a.req.max_tokens, room, &a.req.stop_ids) {
            Some(reason) => {
                sink(a.id, Event::Finished { reason, prompt_tokens: a.req.prompt.len(), generated_tokens: a.generated })
            }
            None => self.active.push(a),
        }
    }
}

// A server moves the engine into a worker thread of its own.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<BatchEngine>();
};
