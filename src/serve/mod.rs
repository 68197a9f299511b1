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
//! requests that ask ([`Request::logprobs`]) from the model's raw logits (after the request's
//! `logit_bias` and penalties, where it sets them), and the answer carries
//! them in OpenAI's shapes, streamed chunks included.
//!
//! `tools` / `tool_choice` ([`tools`]): the template gets the tools, the answer's calls are
//! read back into `tool_calls` (whole or streamed), and `"required"` or a named function
//! compiles a grammar of the family's call format that the engine holds the output to, as for
//! `response_format`.
//!
//! `n` > 1: the request's choices run as `n` requests of the one prompt in the batch engine
//! (at most its sequences), choice `i` with seed `seed + i` ([`Generation::n`]); streamed, each
//! chunk names its choice.
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
pub mod tool_grammar;
pub mod tools;
pub mod worker;

use crate::chat::ChatTemplate;
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
use std::mem::take;
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
    // Tools (tools.rs): what the template gets, and the grammar a forced call follows.
    let support = tools::ToolSupport::detect(template.source());
    let plan = tools::plan(&r.sampling.other, support)?;
    let (msgs, definitions) = tools::messages(&r.messages, plan.as_ref(), support)?;
    let text = template
        .render_with_tools(&msgs, true, definitions.as_ref())
        .map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    let ids = st.tokenizer.encode(&text, true).map_err(|e| ApiError::invalid(e.to_string(), Some("messages")))?;
    let mut g = api::generation(&r.sampling, r.max_completion_tokens.or(r.max_tokens), &st.defaults, seed63)?;
    g.logprobs = logprobs::chat_request(&r.sampling.other)?;
    let reading = match &plan {
        None => None,
        Some(p) => {
            if let Some(c) = p.constraint(st.grammar.as_ref())? {
                g.constraint = Some(c);
            }
            Some(Reading { format: p.support.format, parallel: p.parallel })
        }
    };
    let model = r.model.unwrap_or_else(|| st.model_name.clone());
    run(st, Kind::Chat, model, ids, String::new(), g, "messages", reading).await
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
    tools::refuse_on_completions(&r.sampling.other)?;
    let mut g = api::generation(&r.sampling, Some(r.max_tokens.unwrap_or(16)), &st.defaults, seed63)?;
    g.logprobs = logprobs::completion_request(&r.sampling.other)?;
    let model = r.model.unwrap_or_else(|| st.model_name.clone());
    run(st, Kind::Completion, model, ids, echo, g, "prompt", None).await
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

/// Starts a request's choices on the engine and answers with its completion, whole or
/// streamed; `reading`: the chat answer's tool calls are read back.
#[allow(clippy::too_many_arguments)]
async fn run(
    st: Arc<ServerState>,
    kind: Kind,
    model: String,
    ids: Vec<u32>,
    echo: String,
    g: Generation,
    param: &'static str,
    reading: Option<Reading>,
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
    let n = g.n;
    if n > st.worker.sequences {
        let msg =
            format!("n = {n}: at most {} choices, the sequences this server decodes together", st.worker.sequences);
        return Err(ApiError::invalid(msg, Some("n")));
    }
    // The constraint's errors name the field that asked for it.
    let constraint_param = if reading.is_some() { "tool_choice" } else { "response_format" };
    let mut rxs = Vec::with_capacity(n);
    for i in 0..n {
        let constraint = match &g.constraint {
            None => None,
            Some(c) => {
                let vocab = st.grammar.as_ref().map_err(|e| {
                    ApiError::invalid(
                        format!("structured output is not available for this model: {e}"),
                        Some(constraint_param),
                    )
                })?;
                Some(vocab.matcher(c).map_err(|e| ApiError::invalid(e.to_string(), Some(constraint_param)))?)
            }
        };
        // Choice i's seed: the request's plus i (see `Generation::n`).
        let params = SamplingParams { seed: g.params.seed.wrapping_add(i as u64), ..g.params };
        let req = Request {
            prompt: ids.clone(),
            params,
            max_tokens: g.max_tokens.unwrap_or(usize::MAX),
            stop_ids: st.stop_ids.clone(),
            constraint,
            logprobs: g.logprobs,
            controls: g.controls.clone(),
        };
        // An error drops the receivers of the choices already started, which cancels them.
        rxs.push(st.worker.start(req).await.map_err(|e| match e {
            StartError::Refused(SubmitError::QueueFull) => ApiError::busy(),
            StartError::Refused(SubmitError::Invalid(e)) => {
                // A biased token outside the vocabulary is the engine's to see.
                let field = if e.to_string().contains("logit_bias") { "logit_bias" } else { param };
                ApiError::invalid(e.to_string(), Some(field))
            }
            StartError::Down => ApiError::internal("the engine is not running").with_status(503),
        })?);
    }
    let (prefix, object) = match kind {
        Kind::Chat => ("chatcmpl", "chat.completion"),
        Kind::Completion => ("cmpl", "text_completion"),
    };
    let seed = g.seed();
    let fingerprint = format!("seed-{seed}");
    let usage = g.include_usage;
    let head = Head { id: format!("{prefix}-{:016x}", random_seed()), created: now(), model, kind, fingerprint, usage };
    let seed_header = |mut r: Response| {
        r.headers_mut().insert("x-seed", HeaderValue::from(seed));
        r
    };
    if g.stream {
        let (tx, events) = mpsc::channel::<SseEvent>(64);
        tokio::spawn(stream(st, head, rxs, tx, g, prompt_tokens, echo, reading));
        let body = futures_util::stream::unfold(events, |mut ev| async move {
            ev.recv().await.map(|e| (Ok::<_, std::convert::Infallible>(e), ev))
        });
        return Ok(seed_header(Sse::new(body).keep_alive(KeepAlive::default()).into_response()));
    }
    let mut choices = Vec::with_capacity(n);
    let mut completion_tokens = 0;
    let mut cached = 0;
    for (index, mut rx) in rxs.into_iter().enumerate() {
        let mut out = Decoded::choice(&st, &g, kind, &echo, reading);
        let mut text = echo.clone();
        let mut finish = loop {
            let (piece, finish) = out.feed(rx.recv().await)?;
            text.push_str(&piece);
            if let Some(f) = finish {
                break f;
            }
        };
        drop(rx);
        completion_tokens += out.tokens;
        if index == 0 {
            // The prompt's cached positions as the first choice found them (the others may
            // find the prompt the first one left).
            cached = out.cached;
        }
        let logprobs = out.logprobs.as_ref().map_or(Value::Null, LogprobLog::all);
        choices.push(match (kind, reading) {
            (Kind::Chat, Some(r)) => {
                let (content, calls) = tools::parse(r.format, r.parallel, &text);
                let mut message = json!({"role": "assistant", "content": content});
                if !calls.is_empty() {
                    if content.is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = calls.iter().map(tools::ToolCall::to_json).collect();
                    if finish == "stop" {
                        finish = "tool_calls";
                    }
                }
                json!({"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            (Kind::Chat, None) => json!({"index": index, "message": {"role": "assistant", "content": text},
                                         "logprobs": logprobs, "finish_reason": finish}),
            (Kind::Completion, _) => {
                json!({"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
        });
    }
    let usage = Usage::new(prompt_tokens, completion_tokens).cached(cached);
    Ok(seed_header(
        Json(json!({
            "id": head.id, "object": object, "created": head.created, "model": head.model,
            "system_fingerprint": head.fingerprint, "choices": choices, "usage": usage,
        }))
        .into_response(),
    ))
}

/// How a chat answer's tool calls are read back (a request with tools offered).
#[derive(Clone, Copy, Debug)]
pub struct Reading {
    pub format: tools::ToolFormat,
    pub parallel: bool,
}

/// What every chunk of a completion repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    /// `seed-N`: the request's seed.
    fingerprint: String,
    /// Streamed chunks carry `usage: null` (`stream_options.include_usage`).
    usage: bool,
}

impl Head {
    /// A chunk of choice `index`: `delta` (chat: its content, or one of its tool calls) or
    /// `text` (completions), the logprobs of its tokens (or `null`), and its finish reason.
    fn chunk(
        &self,
        index: usize,
        text: Option<&str>,
        call: Option<Value>,
        finish: Option<&str>,
        first: bool,
        logprobs: Value,
    ) -> SseEvent {
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                if let Some(c) = call {
                    delta.insert("tool_calls".into(), json!([c]));
                }
                json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": index, "text": text.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish})
            }
        };
        let mut v = self.frame(vec![choice]);
        if self.usage {
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

/// One choice of a streamed completion.
struct Streamed<'t> {
    out: Decoded<'t>,
    calls: Option<tools::ToolStream>,
    /// No chunk sent yet (the first says the role).
    first: bool,
    /// A tool call was sent.
    called: bool,
    done: bool,
}

/// Streams a completion's choices as server-sent events (each chunk names its choice) until
/// every one ends, one fails, or the client goes away (then the engine's receivers are
/// dropped, which cancels the requests).
#[allow(clippy::too_many_arguments)]
async fn stream(
    st: Arc<ServerState>,
    head: Head,
    rxs: Vec<mpsc::UnboundedReceiver<Reply>>,
    tx: mpsc::Sender<SseEvent>,
    g: Generation,
    prompt_tokens: usize,
    echo: String,
    reading: Option<Reading>,
) {
    let usage = g.include_usage;
    // Every choice's replies, tagged with its index, on one channel.
    let (all_tx, mut all) = mpsc::unbounded_channel::<(usize, Option<Reply>)>();
    for (i, mut rx) in rxs.into_iter().enumerate() {
        let all_tx = all_tx.clone();
        tokio::spawn(async move {
            loop {
                let r = tokio::select! {
                    _ = all_tx.closed() => return,
                    r = rx.recv() => r,
                };
                let end = r.is_none();
                if all_tx.send((i, r)).is_err() || end {
                    return;
                }
            }
        });
    }
    drop(all_tx);
    let mut choices: Vec<Streamed> = (0..g.n)
        .map(|_| Streamed {
            out: Decoded::choice(&st, &g, head.kind, &echo, reading),
            calls: reading.map(|r| tools::ToolStream::new(r.format, r.parallel)),
            first: true,
            called: false,
            done: false,
        })
        .collect();
    if head.kind == Kind::Chat || !echo.is_empty() {
        let text = if head.kind == Kind::Chat { "" } else { &echo };
        for (i, c) in choices.iter_mut().enumerate() {
            if tx.send(head.chunk(i, Some(text), None, None, true, Value::Null)).await.is_err() {
                return;
            }
            c.first = false;
        }
    }
    let mut left = g.n;
    while left > 0 {
        let (i, reply) = tokio::select! {
            _ = tx.closed() => return,
            r = all.recv() => match r {
                Some(r) => r,
                None => return,
            },
        };
        let c = &mut choices[i];
        if c.done {
            continue;
        }
        let (piece, finish) = match c.out.feed(reply) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx.send(SseEvent::default().data(e.body().to_string())).await;
                return;
            }
        };
        let mut deltas = match &mut c.calls {
            Some(s) => s.push(&piece),
            None if piece.is_empty() => Vec::new(),
            None => vec![tools::Delta::Content(piece)],
        };
        if finish.is_some() {
            deltas.extend(c.calls.as_mut().map(tools::ToolStream::finish).unwrap_or_default());
        }
        // The logprobs of the tokens since the last chunk go with the next chunk sent.
        let mut lp = if deltas.is_empty() && finish.is_none() { Value::Null } else { c.out.take_logprobs() };
        for d in deltas {
            let ev = match &d {
                tools::Delta::Content(t) => head.chunk(i, Some(t), None, None, c.first, take(&mut lp)),
                _ => {
                    c.called = true;
                    head.chunk(i, None, tools::delta_json(&d), None, c.first, take(&mut lp))
                }
            };
            if tx.send(ev).await.is_err() {
                return;
            }
            c.first = false;
        }
        if let Some(mut f) = finish {
            if c.called && f == "stop" {
                f = "tool_calls";
            }
            if tx.send(head.chunk(i, None, None, Some(f), c.first, take(&mut lp))).await.is_err() {
                return;
            }
            c.done = true;
            left -= 1;
        }
    }
    drop(all);
    if usage {
        let mut v = head.frame(Vec::new());
        let tokens = choices.iter().map(|c| c.out.tokens).sum();
        let usage = Usage::new(prompt_tokens, tokens).cached(choices[0].out.cached);
        v["usage"] = serde_json::to_value(usage).expect("plain struct");
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
    /// Special tokens kept as text: a tool format's tags, while tool calls are read back.
    markers: Vec<(u32, &'static str)>,
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
            markers: Vec::new(),
        }
    }

    /// The logprobs of the tokens since the last call (`null`: none, or not asked).
    fn take_logprobs(&mut self) -> Value {
        self.logprobs.as_mut().map_or(Value::Null, LogprobLog::take)
    }

    /// A choice's decoder: the request's stop strings, the tool format's tags kept as text while
    /// calls are read back, and the log of its logprobs when the request asked.
    fn choice(st: &'t ServerState, g: &Generation, kind: Kind, echo: &str, reading: Option<Reading>) -> Self {
        let mut out = Decoded::new(&st.tokenizer, &st.stop_ids, g.stops.clone()).reading(&st.tokenizer, reading);
        out.logprobs =
            g.logprobs.map(|_| LogprobLog::new(&st.tokenizer, st.grammar.as_ref().ok(), kind == Kind::Chat, echo));
        out
    }

    /// Keeps the text of the special tokens among the tool format's tags (a decoder drops
    /// special tokens).
    fn reading(mut self, tok: &Tokenizer, reading: Option<Reading>) -> Self {
        for m in reading.map_or(&[][..], |r| r.format.markers()) {
            if let Some(id) = tok.token_to_id(m).filter(|&id| tok.is_special(id)) {
                self.markers.push((id, m));
            }
        }
        self
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
                    let mut p = self.dec.push(t).map_err(text_err)?.unwrap_or_default();
                    if let Some(&(_, m)) = self.markers.iter().find(|&&(id, _)| id == t) {
                        p.push_str(m);
                    }
                    if !p.is_empty() {
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
