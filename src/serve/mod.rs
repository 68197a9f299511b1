//! `wgpu-llm serve`: an HTTP server with the OpenAI API (`POST /v1/chat/completions`,
//! `POST /v1/completions`, streaming with server-sent events or not; `GET /v1/models`,
//! `GET /v1/models/{id}`, `GET /health`, `GET /metrics` in Prometheus' format) over one
//! [`BatchEngine`](crate::decode::batch::BatchEngine).
//!
//! The engine runs on a thread of its own ([`worker`]); the HTTP tasks (axum on tokio) parse and
//! check a request, tokenize it (the model's chat template for chat), hand it to the engine and
//! turn the token ids it sends back into text, stop strings included ([`text`]). Requests run
//! concurrently through continuous batching; a client that goes away drops its receiver, and the
//! engine cancels its sequence at the next step. Beyond the engine's queue a request gets a 429;
//! bad requests get OpenAI's error shape with a 4xx (fields of OpenAI's API the server does not
//! implement included, by name), and nothing a client sends reaches a panic. Slow clients,
//! too many connections and shutdown are [`listen`]'s.
//!
//! `response_format` (`json_object`, `json_schema`) holds the output: the HTTP task compiles
//! the request's [`Constraint`](crate::grammar::Constraint) into a matcher over the vocabulary
//! built at startup ([`ServerState::grammar`]; a bad schema is a 400) and the engine draws each
//! of its tokens under its mask ([`Request::constraint`]).
//!
//! `logprobs` / `top_logprobs` ([`logprobs`]): the engine computes them on the GPU for the
//! requests that ask ([`Request::logprobs`]) from the model's raw logits, and the answer carries
//! them in OpenAI's shapes, streamed chunks included.
//!
//! Every completion says its seed (the request's, or the random one it was given): in the
//! `x-seed` response header and as `system_fingerprint: "seed-N"`; the same request with
//! `"seed": N` gives the same answer.

pub mod api;
pub mod controls;
pub mod listen;
pub mod logprobs;
pub mod metrics;
pub mod text;
pub mod worker;

use crate::chat::{ChatTemplate, Message};
use crate::decode::batch::{Request, SubmitError};
use crate::decode::StopReason;
use crate::grammar::Vocabulary;
use crate::sampling::{random_seed, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use api::{ApiError, ChatRequest, CompletionRequest, Generation, Prompt, Usage};
use axum::extract::{MatchedPath, Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
pub use listen::{signals, Ended, Limits};

/// Serves the OpenAI API over `state` on `listener` until the first item of `signals`, then
/// drains (see [`Limits::drain`]); a second item ends it at once.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ServerState>,
    signals: impl futures_util::Stream<Item = ()>,
) -> std::io::Result<Ended> {
    let (limits, metrics) = (state.limits, state.worker.metrics.clone());
    listen::serve_app(listener, router(state), limits, metrics, signals).await
}
use logprobs::LogprobLog;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use text::StopText;
use tokio::sync::mpsc;
use worker::{Reply, StartError, Worker};

/// What the server knows besides the engine.
pub struct ServerState {
    pub worker: Worker,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<ChatTemplate>,
    /// Token ids that end a completion.
    pub stop_ids: Vec<u32>,
    /// The model's vocabulary for structured output (`response_format`), built once at
    /// startup over `stop_ids`; `Err`: why the tokenizer has none (such requests get a 400).
    pub grammar: Result<Vocabulary, String>,
    /// The context of one sequence, in tokens.
    pub max_ctx: usize,
    /// The id `/v1/models` lists.
    pub model_name: String,
    /// Sampling for what a request leaves out (the seed is random per request).
    pub defaults: SamplingParams,
    /// Request bodies above this many bytes get a 413.
    pub max_body_bytes: usize,
    /// Timeouts, the connection bound, the drain deadline.
    pub limits: Limits,
    /// Unix seconds when the server started.
    pub created: u64,
}

/// Request targets longer than this get a 414 (hyper answers one without a body past 64 KiB).
const MAX_URI_BYTES: usize = 8192;

/// The routes; anything else is a 404 in OpenAI's error shape, a known route with another
/// method a 405.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .fallback(|| async { ApiError::invalid("no such route", None).with_status(404) })
        .method_not_allowed_fallback(|req: axum::extract::Request| async move {
            ApiError::invalid(format!("method {} is not allowed here", req.method()), None).with_status(405)
        })
        .layer(axum::middleware::from_fn_with_state(state.clone(), account))
        .with_state(state)
}

/// Refuses request targets over [`MAX_URI_BYTES`] and counts every response (`/metrics`).
async fn account(
    State(st): State<Arc<ServerState>>,
    route: Option<MatchedPath>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let len = req.uri().to_string().len();
    let r = if len > MAX_URI_BYTES {
        let msg = format!("the request target has {len} bytes; at most {MAX_URI_BYTES}");
        ApiError::invalid(msg, None).with_status(414).into_response()
    } else {
        next.run(req).await
    };
    st.worker.metrics.count_request(route.as_ref().map(|m| m.as_str()), r.status().as_u16());
    r
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut r = (status, Json(self.body())).into_response();
        if self.status == 429 {
            r.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

async fn health(State(st): State<Arc<ServerState>>) -> Response {
    let l = &st.worker.load;
    let body = json!({
        "status": if l.broken.load(Ordering::Relaxed) { "error" } else { "ok" },
        "active": l.active.load(Ordering::Relaxed),
        "queued": l.queued.load(Ordering::Relaxed),
        "served": l.served.load(Ordering::Relaxed),
        "free_sequences": l.free.load(Ordering::Relaxed),
    });
    let status = if l.broken.load(Ordering::Relaxed) { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    (status, Json(body)).into_response()
}

async fn metrics(State(st): State<Arc<ServerState>>) -> Response {
    let text = st.worker.metrics.render(&st.worker.load);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

impl ServerState {
    /// The model as `/v1/models` lists it.
    fn model_card(&self) -> Value {
        json!({"id": self.model_name, "object": "model", "created": self.created, "owned_by": "wgpu-llm",
               "max_model_len": self.max_ctx})
    }
}

async fn models(State(st): State<Arc<ServerState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [st.model_card()]}))
}

async fn model(State(st): State<Arc<ServerState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if id != st.model_name {
        let msg = format!("The model '{id}' does not exist; this server has '{}'", st.model_name);
        return Err(ApiError::invalid(msg, Some("model")).with_status(404).with_code("model_not_found"));
    }
    Ok(Json(st.model_card()))
}

/// Reads a body of at most `max_body_bytes` within the body timeout and parses it as `T`.
async fn parse<T: serde::de::DeserializeOwned>(st: &ServerState, req: axum::extract::Request) -> Result<T, ApiError> {
    let (limit, wait) = (st.max_body_bytes, st.limits.body_timeout);
    let read = tokio::time::timeout(wait, axum::body::to_bytes(req.into_body(), limit)).await.map_err(|_| {
        st.worker.metrics.body_timeouts.fetch_add(1, Ordering::Relaxed);
        ApiError::invalid(format!("the request body did not arrive within {} s", wait.as_secs_f64()), None)
            .with_status(408)
    })?;
    let bytes = read.map_err(|e| {
        let too_large = std::error::Error::source(&e)
            .is_some_and(|s| s.downcast_ref::<http_body_util::LengthLimitError>().is_some());
        if too_large {
            ApiError::invalid(format!("the request body is larger than {limit} bytes"), None).with_status(413)
        } else {
            ApiError::invalid(format!("reading the request body: {e}"), None)
        }
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("the request body is not valid: {e}"), None))
}

async fn chat(State(st): State<Arc<ServerState>>, req: axum::extract::Request) -> Result<Response, ApiError> {
    let r: ChatRequest = parse(&st, req).await?;
    let template = st
        .template
        .as_ref()
        .ok_or_else(|| ApiError::invalid("this model has no chat template: use /v1/completions", Some("messages")))?;
    if r.messages.is_empty() {
        return Err(ApiError::invalid("messages is empty", Some("messages")));
    }
    let msgs = r.messages.iter().map(|m| Ok(Message::new(&m.role, m.text()?))).collect::<Result<Vec<_>, ApiError>>()?;
    let text = template.render(&msgs, true).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    let ids = st.tokenizer.encode(&text, true).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    let mut g = api::generation(&r.sampling, r.max_completion_tokens.or(r.max_tokens), &st.defaults, seed63)?;
    g.logprobs = logprobs::chat_request(&r.sampling.other)?;
    let model = r.model.unwrap_or_else(|| st.model_name.clone());
    run(st, Kind::Chat, model, ids, String::new(), g, "messages").await
}

async fn completions(State(st): State<Arc<ServerState>>, req: axum::extract::Request) -> Result<Response, ApiError> {
    let r: CompletionRequest = parse(&st, req).await?;
    let tok = &st.tokenizer;
    let one = |n: usize| {
        (n == 1).then_some(()).ok_or_else(|| {
            ApiError::invalid(format!("{n} prompts: one prompt per request is supported"), Some("prompt"))
        })
    };
    let encode = |s: &str| tok.encode(s, true).map_err(|e| ApiError::invalid(e.to_string(), Some("prompt")));
    // One prompt: text or token ids (echoed as text only when asked).
    enum One {
        Text(String),
        Ids(Vec<u32>),
    }
    let prompt = match r.prompt {
        Prompt::Text(s) => One::Text(s),
        Prompt::Tokens(ids) => One::Ids(ids),
        Prompt::Texts(mut v) => {
            one(v.len())?;
            One::Text(v.swap_remove(0))
        }
        Prompt::TokenLists(mut v) => {
            one(v.len())?;
            One::Ids(v.swap_remove(0))
        }
    };
    let echo = r.echo.unwrap_or(false);
    let (ids, echo) = match prompt {
        One::Text(s) => (encode(&s)?, if echo { s } else { String::new() }),
        One::Ids(ids) => {
            let text = if echo { tok.decode(&ids).unwrap_or_default() } else { String::new() };
            (ids, text)
        }
    };
    let mut g = api::generation(&r.sampling, Some(r.max_tokens.unwrap_or(16)), &st.defaults, seed63)?;
    g.logprobs = logprobs::completion_request(&r.sampling.other)?;
    let model = r.model.unwrap_or_else(|| st.model_name.clone());
    run(st, Kind::Completion, model, ids, echo, g, "prompt").await
}

/// A random seed that a request can give back as it is (OpenAI's `seed` is signed).
fn seed63() -> u64 {
    random_seed() >> 1
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

/// Starts a request on the engine and answers with its completion, whole or streamed.
async fn run(
    st: Arc<ServerState>,
    kind: Kind,
    model: String,
    ids: Vec<u32>,
    echo: String,
    g: Generation,
    param: &'static str,
) -> Result<Response, ApiError> {
    // The engine checks the rest (an empty prompt, token ids past the vocabulary, parameters);
    // this one gets OpenAI's code.
    if ids.len() >= st.max_ctx {
        return Err(ApiError::invalid(
            format!(
                "This model's maximum context length is {} tokens; the prompt has {} tokens and at least one \
                 must be generated",
                st.max_ctx,
                ids.len()
            ),
            Some(param),
        )
        .with_code("context_length_exceeded"));
    }
    let prompt_tokens = ids.len();
    let constraint = match &g.constraint {
        None => None,
        Some(c) => {
            let vocab = st.grammar.as_ref().map_err(|e| {
                ApiError::invalid(
                    format!("structured output is not available for this model: {e}"),
                    Some("response_format"),
                )
            })?;
            Some(vocab.matcher(c).map_err(|e| ApiError::invalid(e.to_string(), Some("response_format")))?)
        }
    };
    let req = Request {
        prompt: ids,
        params: g.params,
        max_tokens: g.max_tokens.unwrap_or(usize::MAX),
        stop_ids: st.stop_ids.clone(),
        constraint,
        logprobs: g.logprobs,
        controls: g.controls.clone(),
    };
    let rx = st.worker.start(req).await.map_err(|e| match e {
        StartError::Refused(SubmitError::QueueFull) => ApiError::busy(),
        StartError::Refused(SubmitError::Invalid(e)) => {
            // A biased token outside the vocabulary is the engine's to see.
            let field = if e.to_string().contains("logit_bias") { "logit_bias" } else { param };
            ApiError::invalid(e.to_string(), Some(field))
        }
        StartError::Down => ApiError::internal("the engine is not running").with_status(503),
    })?;
    let (prefix, object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion"),
        Kind::Completion => ("cmpl", "text_completion"),
    };
    let seed = g.seed();
    let fingerprint = format!("seed-{seed}");
    let head = Head { id: format!("{prefix}-{:016x}", random_seed()), created: now(), model, kind, fingerprint };
    let seed_header = |mut r: Response| {
        r.headers_mut().insert("x-seed", HeaderValue::from(seed));
        r
    };
    if g.stream {
        let (tx, events) = mpsc::channel::<SseEvent>(64);
        tokio::spawn(stream(st, head, rx, tx, g, prompt_tokens, echo));
        let body = futures_util::stream::unfold(events, |mut ev| async move {
            ev.recv().await.map(|e| (Ok::<_, std::convert::Infallible>(e), ev))
        });
        return Ok(seed_header(Sse::new(body).keep_alive(KeepAlive::default()).into_response()));
    }
    let mut out = Decoded::new(&st.tokenizer, &st.stop_ids, g.stops);
    out.logprobs =
        g.logprobs.map(|_| LogprobLog::new(&st.tokenizer, st.grammar.as_ref().ok(), kind == Kind::Chat, &echo));
    let mut text = echo;
    let mut rx = rx;
    let finish = loop {
        let (piece, finish) = out.feed(rx.recv().await)?;
        text.push_str(&piece);
        if let Some(f) = finish {
            break f;
        }
    };
    drop(rx);
    let usage = Usage::new(prompt_tokens, out.tokens).cached(out.cached);
    let logprobs = out.logprobs.as_ref().map_or(Value::Null, LogprobLog::all);
    let choice = match kind {
        Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                            "finish_reason": finish}),
        Kind::Completion => json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}),
    };
    Ok(seed_header(
        Json(json!({
            "id": head.id, "object": object, "created": head.created, "model": head.model,
            "system_fingerprint": head.fingerprint, "choices": [choice], "usage": usage,
        }))
        .into_response(),
    ))
}

/// What every chunk of a completion repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    /// `seed-N`: the request's seed.
    fingerprint: String,
}

impl Head {
    /// A chunk with one choice: `delta` (chat) or `text` (completions), the logprobs of its
    /// tokens (or `null`), and its finish reason.
    fn chunk(&self, text: Option<&str>, finish: Option<&str>, first: bool, usage: bool, logprobs: Value) -> SseEvent {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish})
            }
        };
        let mut v = self.frame(vec![choice]);
        if usage {
            v["usage"] = Value::Null;
        }
        SseEvent::default().data(v.to_string())
    }

    fn frame(&self, choices: Vec<Value>) -> Value {
        let object = match self.kind {
            Kind::Chat => "chat.completion.chunk",
            Kind::Completion => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "system_fingerprint": self.fingerprint, "choices": choices})
    }
}

/// Streams a completion as server-sent events until it ends, fails, or the client goes away
/// (then the engine's receiver is dropped, which cancels the request).
async fn stream(
    st: Arc<ServerState>,
    head: Head,
    mut rx: mpsc::UnboundedReceiver<Reply>,
    tx: mpsc::Sender<SseEvent>,
    g: Generation,
    prompt_tokens: usize,
    echo: String,
) {
    let usage = g.include_usage;
    let mut out = Decoded::new(&st.tokenizer, &st.stop_ids, g.stops);
    out.logprobs =
        g.logprobs.map(|_| LogprobLog::new(&st.tokenizer, st.grammar.as_ref().ok(), head.kind == Kind::Chat, &echo));
    let mut first = true;
    if head.kind == Kind::Chat || !echo.is_empty() {
        let text = if head.kind == Kind::Chat { "" } else { &echo };
        if tx.send(head.chunk(Some(text), None, true, usage, Value::Null)).await.is_err() {
            return;
        }
        first = false;
    }
    let finish = loop {
        let reply = tokio::select! {
            _ = tx.closed() => return,
            r = rx.recv() => r,
        };
        match out.feed(reply) {
            Ok((piece, finish)) => {
                if !piece.is_empty() {
                    let lp = out.take_logprobs();
                    if tx.send(head.chunk(Some(&piece), None, first, usage, lp)).await.is_err() {
                        return;
                    }
                }
                first &= piece.is_empty();
                if let Some(f) = finish {
                    break f;
                }
            }
            Err(e) => {
                let _ = tx.send(SseEvent::default().data(e.body().to_string())).await;
                return;
            }
        }
    };
    drop(rx);
    let lp = out.take_logprobs();
    let _ = tx.send(head.chunk(None, Some(finish), first, usage, lp)).await;
    if usage {
        let mut v = head.frame(Vec::new());
        v["usage"] =
            serde_json::to_value(Usage::new(prompt_tokens, out.tokens).cached(out.cached)).expect("plain struct");
        let _ = tx.send(SseEvent::default().data(v.to_string())).await;
    }
    let _ = tx.send(SseEvent::default().data("[DONE]")).await;
}

/// Turns a request's token ids into text: stop ids are not text, stop strings end it.
struct Decoded<'t> {
    dec: StreamDecoder<'t>,
    stop: StopText,
    stop_ids: &'t [u32],
    /// Tokens generated (a stop id included).
    tokens: usize,
    /// The logprobs of the tokens, when the request asked.
    logprobs: Option<LogprobLog<'t>>,
    /// Prompt tokens the prefix cache gave.
    cached: usize,
}

impl<'t> Decoded<'t> {
    fn new(tok: &'t Tokenizer, stop_ids: &'t [u32], stops: Vec<String>) -> Self {
        Self {
            dec: StreamDecoder::new(tok),
            stop: StopText::new(stops),
            stop_ids,
            tokens: 0,
            logprobs: None,
            cached: 0,
        }
    }

    /// The logprobs of the tokens since the last call (`null`: none, or not asked).
    fn take_logprobs(&mut self) -> Value {
        self.logprobs.as_mut().map_or(Value::Null, LogprobLog::take)
    }

    /// The text `reply` releases, and the finish reason when the completion ended.
    fn feed(&mut self, reply: Option<Reply>) -> Result<(String, Option<&'static str>), ApiError> {
        let text_err = |e: crate::Error| ApiError::internal(e.to_string());
        match reply {
            None => Err(ApiError::internal("the engine stopped")),
            Some(Reply::Failed(m)) => Err(ApiError::internal(m)),
            Some(Reply::Started { cached_tokens }) => {
                self.cached = cached_tokens;
                Ok((String::new(), None))
            }
            Some(Reply::Token(t, lp)) => {
                self.tokens += 1;
                let mut out = String::new();
                if let (Some(log), Some(lp), false) = (&mut self.logprobs, &lp, self.stop_ids.contains(&t)) {
                    log.push(t, lp);
                }
                if !self.stop_ids.contains(&t) {
                    if let Some(p) = self.dec.push(t).map_err(text_err)? {
                        out = self.stop.push(&p);
                    }
                }
                Ok((out, self.stop.stopped().then_some("stop")))
            }
            Some(Reply::Finished { reason, .. }) => {
                let mut out = match self.dec.finish().map_err(text_err)? {
                    Some(p) => self.stop.push(&p),
                    None => String::new(),
                };
                if !self.stop.stopped() {
                    out.push_str(&self.stop.finish());
                }
                let finish = match reason {
                    _ if self.stop.stopped() => "stop",
                    StopReason::Eos | StopReason::Caller => "stop",
                    StopReason::MaxTokens | StopReason::ContextFull => "length",
                };
                Ok((out, Some(finish)))
            }
        }
    }
}
