//! The engine's thread: it owns the [`BatchEngine`] (and so the GPU), takes requests from the
//! HTTP tasks over a channel and steps every running request together, sending each its tokens.
//! A request whose receiver is dropped (its client went away, or a stop string ended it) is
//! cancelled at the next step boundary, which frees its sequence.

use crate::decode::batch::{BatchEngine, Event, Request, SeqId, SubmitError};
use crate::decode::StopReason;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc as std_mpsc, Arc};
use tokio::sync::{mpsc, oneshot};

/// What the engine sends a request.
#[derive(Debug)]
pub enum Reply {
    Token(u32),
    Finished { reason: StopReason, prompt_tokens: usize, generated_tokens: usize },
    Failed(String),
}

struct Job {
    req: Request,
    replies: mpsc::UnboundedSender<Reply>,
    accepted: oneshot::Sender<Result<(), SubmitError>>,
}

/// Counters the HTTP side reads (`/health`).
#[derive(Debug, Default)]
pub struct Load {
    pub active: AtomicUsize,
    pub queued: AtomicUsize,
    pub served: AtomicUsize,
    /// Sequences free for new requests.
    pub free: AtomicUsize,
    /// The engine failed (the GPU): requests are refused.
    pub broken: AtomicBool,
}

/// The HTTP side's handle on the engine thread.
#[derive(Clone)]
pub struct Worker {
    jobs: std_mpsc::Sender<Job>,
    pub load: Arc<Load>,
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
        let l = load.clone();
        std::thread::Builder::new().name("engine".into()).spawn(move || run(engine, rx, &l))?;
        Ok(Self { jobs, load })
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

fn run(mut engine: BatchEngine, jobs: std_mpsc::Receiver<Job>, load: &Load) {
    let mut replies: HashMap<SeqId, mpsc::UnboundedSender<Reply>> = HashMap::new();
    let take = |engine: &mut BatchEngine, replies: &mut HashMap<SeqId, _>, job: Job| match engine.submit(job.req) {
        Ok(id) => {
            replies.insert(id, job.replies);
            let _ = job.accepted.send(Ok(()));
        }
        Err(e) => {
            let _ = job.accepted.send(Err(e));
        }
    };
    loop {
        // Idle: sleep until a request comes (or every sender is gone: the server stopped).
        if engine.is_idle() {
            match jobs.recv() {
                Ok(job) => take(&mut engine, &mut replies, job),
                Err(_) => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            take(&mut engine, &mut replies, job);
        }
        replies.retain(|&id, tx| {
            if tx.is_closed() {
                engine.cancel(id);
                false
            } else {
                true
            }
        });
        if !engine.is_idle() {
            let r = engine.step(&mut |id, event| {
                let Some(tx) = replies.get(&id) else { return };
                let (reply, last) = match event {
                    Event::Token(t) => (Reply::Token(t), false),
                    Event::Finished { reason, prompt_tokens, generated_tokens } => {
                        (Reply::Finished { reason, prompt_tokens, generated_tokens }, true)
                    }
                    Event::Failed(e) => (Reply::Failed(e.to_string()), true),
                };
                let _ = tx.send(reply);
                if last {
                    replies.remove(&id);
                    load.served.fetch_add(1, Ordering::Relaxed);
                }
            });
            if let Err(e) = r {
                // The GPU failed: every request gets the error and the server stops taking more.
                load.broken.store(true, Ordering::Relaxed);
                for (_, tx) in replies.drain() {
                    let _ = tx.send(Reply::Failed(format!("the engine failed: {e}")));
                }
                while let Ok(job) = jobs.recv() {
                    drop(job);
                }
                return;
            }
        }
        load.active.store(engine.active(), Ordering::Relaxed);
        load.queued.store(engine.queued(), Ordering::Relaxed);
        load.free.store(engine.free_sequences(), Ordering::Relaxed);
    }
}
