//! The engine's thread: it owns the [`BatchEngine`] (and so the GPU), takes requests from the
//! HTTP tasks over a channel and steps every running request together, sending each its tokens.
//! A request whose receiver is dropped (its client went away, or a stop string ended it) is
//! cancelled at the next step boundary, which frees its sequence.

pub use super::metrics::Load;
use super::metrics::Metrics;
use crate::decode::batch::{BatchEngine, Event, Request, SeqId, SubmitError};
use crate::decode::StopReason;
use crate::sampling::TokenLogprobs;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{mpsc as std_mpsc, Arc};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};

/// What the engine sends a request.
#[derive(Debug)]
pub enum Reply {
    /// The prompt was prefilled, `cached_tokens` of it from the prefix cache (before any token).
    Started {
        cached_tokens: usize,
    },
    /// A token, with its logprobs when the request asked.
    Token(u32, Option<TokenLogprobs>),
    Finished {
        reason: StopReason,
        prompt_tokens: usize,
        generated_tokens: usize,
    },
    Failed(String),
}

struct Job {
    req: Request,
    replies: mpsc::UnboundedSender<Reply>,
    accepted: oneshot::Sender<Result<(), SubmitError>>,
}

/// A running request: where its tokens go, and its timing (`/metrics`).
struct Running {
    replies: mpsc::UnboundedSender<Reply>,
    /// When it was submitted, then when its last token came.
    last: Instant,
    first: bool,
}

/// The HTTP side's handle on the engine thread.
#[derive(Clone)]
pub struct Worker {
    jobs: std_mpsc::Sender<Job>,
    /// The sequences the engine decodes together (a request's choices must fit).
    pub sequences: usize,
    pub load: Arc<Load>,
    pub metrics: Arc<Metrics>,
}

/// Why a request did not start.
#[derive(Debug)]
pub enum StartError {
    Refused(SubmitError),
    /// The engine thread is gone or failed.
    Down,
}

impl Worker {
    /// Moves `engine` onto a thread of its own.
    pub fn spawn(engine: BatchEngine) -> std::io::Result<Self> {
        let (jobs, rx) = std_mpsc::channel();
        let load = Arc::new(Load::default());
        load.update(&engine);
        let sequences = engine.free_sequences();
        let metrics = Arc::new(Metrics::default());
        let (l, m) = (load.clone(), metrics.clone());
        std::thread::Builder::new().name("engine".into()).spawn(move || run(engine, rx, &l, &m))?;
        Ok(Self { jobs, sequences, load, metrics })
    }

    /// Queues `req`; its replies come on the returned receiver. Dropping the receiver cancels it.
    pub async fn start(&self, req: Request) -> Result<mpsc::UnboundedReceiver<Reply>, StartError> {
        if self.load.broken.load(Ordering::Relaxed) {
            return Err(StartError::Down);
        }
        let (replies, rx) = mpsc::unbounded_channel();
        let (accepted, ok) = oneshot::channel();
        self.jobs.send(Job { req, replies, accepted }).map_err(|_| StartError::Down)?;
        match ok.await {
            Ok(Ok(())) => Ok(rx),
            Ok(Err(e)) => Err(StartError::Refused(e)),
            Err(_) => Err(StartError::Down),
        }
    }
}

impl Load {
    fn update(&self, engine: &BatchEngine) {
        self.active.store(engine.active(), Ordering::Relaxed);
        self.queued.store(engine.queued(), Ordering::Relaxed);
        self.free.store(engine.free_sequences(), Ordering::Relaxed);
        self.set_prefix(engine.prefix_stats());
    }
}

fn run(mut engine: BatchEngine, jobs: std_mpsc::Receiver<Job>, load: &Load, metrics: &Metrics) {
    let mut running: HashMap<SeqId, Running> = HashMap::new();
    let take = |engine: &mut BatchEngine, running: &mut HashMap<SeqId, _>, job: Job| {
        let prompt = job.req.prompt.len() as u64;
        match engine.submit(job.req) {
            Ok(id) => {
                metrics.prompt_tokens.fetch_add(prompt, Ordering::Relaxed);
                running.insert(id, Running { replies: job.replies, last: Instant::now(), first: true });
                let _ = job.accepted.send(Ok(()));
            }
            Err(e) => {
                let _ = job.accepted.send(Err(e));
            }
        }
    };
    loop {
        // Idle: sleep until a request comes (or every sender is gone: the server stopped).
        if engine.is_idle() {
            match jobs.recv() {
                Ok(job) => take(&mut engine, &mut running, job),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            take(&mut engine, &mut running, job);
        }
        running.retain(|&id, r| {
            if r.replies.is_closed() {
                engine.cancel(id);
                false
            } else {
                true
            }
        });
        if !engine.is_idle() {
            let r = engine.step(&mut |id, event| {
                let Some(r) = running.get_mut(&id) else { return };
                let (reply, last) = match event {
                    Event::Token(t, logprobs) => {
                        let now = Instant::now();
                        let h = if r.first { &metrics.ttft } else { &metrics.itl };
                        h.observe(now - r.last);
                        (r.last, r.first) = (now, false);
                        metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
                        (Reply::Token(t, logprobs), false)
                    }
                    Event::Started { cached_tokens } => (Reply::Started { cached_tokens }, false),
                    Event::Finished { reason, prompt_tokens, generated_tokens } => {
                        (Reply::Finished { reason, prompt_tokens, generated_tokens }, true)
                    }
                    Event::Failed(e) => (Reply::Failed(e.to_string()), true),
                };
                let _ = r.replies.send(reply);
                if last {
                    running.remove(&id);
                    load.served.fetch_add(1, Ordering::Relaxed);
                }
            });
            if let Err(e) = r {
                // The GPU failed: every request gets the error and the server stops taking more.
                load.broken.store(true, Ordering::Relaxed);
                for (_, r) in running.drain() {
                    let _ = r.replies.send(Reply::Failed(format!("the engine failed: {e}")));
                }
                while let Ok(job) = jobs.recv() {
                    drop(job);
                }
                return;
            }
        }
        load.update(&engine);
    }
}
