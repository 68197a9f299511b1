//! The OpenAI API's request and response bodies (the parts this server implements), and its
//! error shape.

use crate::grammar::Constraint;
use crate::sampling::{LogitControls, SamplingParams};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// An error as OpenAI's API returns it: an HTTP status and
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about the request's body.
    pub fn invalid(message: impl Into<String>, param: Option<&'static str>) -> Self {
        Self { status: 400, message: message.into(), kind: "invalid_request_error", param, code: None }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    /// The server cannot take the request now (its queue is full).
    pub fn busy() -> Self {
        Self {
            status: 429,
            message: "the server's request queue is full; try again later".into(),
            kind: "server_busy",
            param: None,
            code: Some("queue_full"),
        }
    }

    /// The request failed inside the engine.
    pub fn internal(message: impl Into<String>) -> Self {
        Self { status: 500, message: message.into(), kind: "server_error", param: None, code: None }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

/// Sampling fields shared by both endpoints; absent ones take the server's defaults.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub n: Option<i64>,
    pub stop: Option<OneOrMany<String>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// Every other field: those of OpenAI's API that this server does not implement are refused
    /// by name when they ask for something ([`unimplemented`]); the rest (`user`, `metadata`, ..)
    /// change nothing here.
    #[serde(flatten)]
    pub other: serde_json::Map<String, Value>,
}

/// The first field of OpenAI's API that the server does not implement which `fields` asks for,
/// as a 400 naming it. `null`, and values that ask for nothing (`best_of: 1`, `function_call:
/// "none"`), pass. `response_format` is [`response_format`]'s; `tools` and `tool_choice` are
/// [`super::tools`]'; `logprobs` and `top_logprobs` are [`super::logprobs`]'; `logit_bias` and the
/// penalties are [`super::controls`]'s.
pub fn unimplemented(fields: &serde_json::Map<String, Value>) -> Result<(), ApiError> {
    let nothing = |v: &Value| match v {
        Value::Null | Value::Bool(false) => true,
        Value::Bool(true) => false,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(n) => n.as_f64() == Some(0.0),
    };
    // "none" and "auto" ask for no tool when there are none.
    let no_tool = |v: &Value| nothing(v) || v == "none" || v == "auto";
    let asks = |name: &str, v: &Value| match name {
        "suffix" | "functions" => !nothing(v),
        "best_of" => !(v.is_null() || v == 1),
        "function_call" => !no_tool(v),
        _ => false,
    };
    match UNIMPLEMENTED.into_iter().find(|&name| fields.get(name).is_some_and(|v| asks(name, v))) {
        None => Ok(()),
        Some(name) => Err(ApiError::invalid(
            format!("Unsupported parameter: '{name}' is not supported by this server."),
            Some(name),
        )
        .with_code("unsupported_parameter")),
    }
}

/// The fields [`unimplemented`] refuses.
const UNIMPLEMENTED: [&str; 4] = ["suffix", "best_of", "functions", "function_call"];

/// One value or a list of them (`stop`, a message's `content`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(String),
    Many(Vec<T>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    /// A string, or parts of which only text is understood here.
    pub content: Option<OneOrMany<ContentPart>>,
    /// An assistant message's tool calls (`[{"id", "type", "function": {"name", "arguments"}}]`).
    #[serde(default)]
    pub tool_calls: Option<Value>,
    /// A `tool` message: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl ChatMessage {
    /// The message's text; parts other than text are refused.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(OneOrMany::One(s)) => Ok(s.clone()),
            Some(OneOrMany::Many(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::invalid(
                                format!("content parts of type '{kind}' are not supported (text only)"),
                                Some("messages"),
                            ))
                        }
                    }
                }
                Ok(s)
            }
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    pub max_tokens: Option<i64>,
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A completion's prompt: text, or token ids; a list of one of either.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

/// What a request asks of the engine, checked.
#[derive(Debug, Clone)]
pub struct Generation {
    pub params: SamplingParams,
    /// `None`: up to the end of the context.
    pub max_tokens: Option<usize>,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// What the output must match (`response_format`), or `None`.
    pub constraint: Option<Constraint>,
    /// Logprobs per token (the engine's `Request::logprobs`): set by the endpoint
    /// ([`super::logprobs`]), the two read different fields.
    pub logprobs: Option<u32>,
    /// `logit_bias` and the penalties ([`super::controls`]).
    pub controls: LogitControls,
    /// Choices (`n`): sequences of the one prompt; choice `i` samples with seed `seed + i`
    /// (wrapping), so `n: 1` with that seed gives it again.
    pub n: usize,
}

/// The most choices (`n`) one request may ask for (the server also bounds it by its batch).
pub const MAX_N: usize = 128;

/// The constraint `response_format` asks for: none for `{"type": "text"}` (or no field),
/// [`Constraint::JsonObject`] for `{"type": "json_object"}`, [`Constraint::JsonSchema`] for
/// `{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (the output always
/// follows the schema, `strict` or not). Anything else is a 400 naming the problem; whether a
/// schema compiles is [`Vocabulary::matcher`](crate::grammar::Vocabulary::matcher)'s.
pub fn response_format(fields: &serde_json::Map<String, Value>) -> Result<Option<Constraint>, ApiError> {
    let bad = |msg: String| ApiError::invalid(msg, Some("response_format"));
    let v = match fields.get("response_format") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(v) => return Err(bad(format!("response_format must be an object with a 'type', not {v}"))),
    };
    match v.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonObject)),
        Some("json_schema") => {
            let Some(Value::Object(js)) = v.get("json_schema") else {
                return Err(bad("response_format of type 'json_schema' needs a 'json_schema' object".into()));
            };
            if let Some(name) = js.get("name") {
                if !name.as_str().is_some_and(|n| !n.is_empty() && n.len() <= 64) {
                    return Err(bad(format!("json_schema.name must be a string of 1 to 64 characters, not {name}")));
                }
            }
            if let Some(strict) = js.get("strict") {
                if !(strict.is_boolean() || strict.is_null()) {
                    return Err(bad(format!("json_schema.strict must be true or false, not {strict}")));
                }
            }
            match js.get("schema") {
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => {
                    Ok(Some(Constraint::JsonSchema(schema.to_string())))
                }
                None | Some(Value::Null) => Err(bad("json_schema.schema is missing: the JSON schema to follow".into())),
                Some(other) => Err(bad(format!("json_schema.schema must be a JSON schema (an object), not {other}"))),
            }
        }
        Some(kind) => {
            Err(bad(format!("response_format type '{kind}' is not supported: 'text', 'json_object' or 'json_schema'"))
                .with_code("unsupported_parameter"))
        }
        None => Err(bad("response_format needs a 'type': 'text', 'json_object' or 'json_schema'".into())),
    }
}

/// OpenAI's documented ranges where it has them (temperature 0..=2, top_p in (0, 1]), this
/// engine's own for the rest.
pub fn generation(
    f: &SamplingFields,
    max_tokens: Option<i64>,
    defaults: &SamplingParams,
    random_seed: impl FnOnce() -> u64,
) -> Result<Generation, ApiError> {
    let n = match f.n {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::invalid(format!("n = {n}: from 1 to {MAX_N} choices"), Some("n"))),
    };
    unimplemented(&f.other)?;
    let constraint = response_format(&f.other)?;
    let controls = super::controls::logit_controls(&f.other).map_err(|(field, m)| ApiError::invalid(m, Some(field)))?;
    let mut p = *defaults;
    if let Some(t) = f.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::invalid(format!("temperature {t} is out of range: 0 to 2"), Some("temperature")));
        }
        p.temperature = t as f32;
    }
    if let Some(v) = f.top_p {
        if !(v > 0.0 && v <= 1.0) {
            return Err(ApiError::invalid(format!("top_p {v} is out of range: (0, 1]"), Some("top_p")));
        }
        p.top_p = v as f32;
    }
    if let Some(k) = f.top_k {
        // llama.cpp's server and vLLM read a negative top_k as off.
        p.top_k = if k <= 0 {
            0
        } else {
            u32::try_from(k).map_err(|_| ApiError::invalid(format!("top_k {k} is too large"), Some("top_k")))?
        };
    }
    if let Some(m) = f.min_p {
        if !(0.0..1.0).contains(&m) {
            return Err(ApiError::invalid(format!("min_p {m} is out of range: [0, 1)"), Some("min_p")));
        }
        p.min_p = m as f32;
    }
    // OpenAI's seed is a signed 64-bit integer: its bits are the Philox key.
    p.seed = match f.seed {
        Some(s) => s as u64,
        None => random_seed(),
    };
    p.validate().map_err(|e| ApiError::invalid(e.to_string(), None))?;
    let max_tokens = match max_tokens {
        None => None,
        Some(m) if m >= 1 => Some(m as usize),
        Some(m) => return Err(ApiError::invalid(format!("max_tokens {m} must be at least 1"), Some("max_tokens"))),
    };
    let stops = match &f.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s.clone()],
        Some(OneOrMany::Many(v)) if v.len() <= 4 => v.clone(),
        Some(OneOrMany::Many(v)) => {
            return Err(ApiError::invalid(format!("{} stop sequences: at most 4", v.len()), Some("stop")))
        }
    };
    Ok(Generation {
        params: p,
        max_tokens,
        stops,
        stream: f.stream.unwrap_or(false),
        include_usage: f.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        constraint,
        logprobs: None,
        controls,
        n,
    })
}

impl Generation {
    /// The seed as a request gives it (OpenAI's signed 64 bits): sent back in the `x-seed` header
    /// and in `system_fingerprint` (`seed-N`), so that any answer can be asked for again.
    pub fn seed(&self) -> i64 {
        self.params.seed as i64
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache (`serve --prefix-cache-bytes`).
    pub cached_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        }
    }

    /// The same, with `n` of the prompt tokens from the prefix cache.
    pub fn cached(mut self, n: usize) -> Self {
        self.prompt_tokens_details.cached_tokens = n;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(v: Value) -> SamplingFields {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_fill_what_the_request_leaves_out() {
        let d = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: 0 };
        let g = generation(&fields(json!({})), None, &d, || 7).unwrap();
        assert_eq!(g.params, SamplingParams { seed: 7, ..d });
        assert_eq!(g.max_tokens, None);
        let g = generation(
            &fields(json!({"temperature": 0, "top_k": -1, "seed": -1, "stop": "x", "stream": true,
                           "stream_options": {"include_usage": true}})),
            Some(5),
            &d,
            || unreachable!("the request has a seed"),
        )
        .unwrap();
        assert_eq!(g.params, SamplingParams { temperature: 0.0, top_k: 0, seed: u64::MAX, ..d });
        assert_eq!((g.max_tokens, g.stops, g.stream, g.include_usage), (Some(5), vec!["x".to_string()], true, true));
        assert_eq!(g.n, 1);
        assert_eq!(generation(&fields(json!({"n": 3})), None, &d, || 0).unwrap().n, 3);
    }

    #[test]
    fn out_of_range_fields_name_their_parameter() {
        let d = SamplingParams::default();
        for (v, param) in [
            (json!({"temperature": 2.5}), Some("temperature")),
            (json!({"temperature": -0.1}), Some("temperature")),
            (json!({"top_p": 0}), Some("top_p")),
            (json!({"top_p": 1.5}), Some("top_p")),
            (json!({"min_p": 1}), Some("min_p")),
            (json!({"n": 0}), Some("n")),
            (json!({"n": 129}), Some("n")),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), Some("stop")),
        ] {
            let e = generation(&fields(v.clone()), None, &d, || 0).unwrap_err();
            assert_eq!((e.status, e.param), (400, param), "{v}");
        }
        let e = generation(&fields(json!({})), Some(0), &d, || 0).unwrap_err();
        assert_eq!(e.param, Some("max_tokens"));
    }

    #[test]
    fn unimplemented_fields_are_refused_by_name() {
        let d = SamplingParams::default();
        for (v, param) in [
            (json!({"suffix": "end"}), "suffix"),
            (json!({"best_of": 3}), "best_of"),
            (json!({"response_format": {"type": "grammar"}}), "response_format"),
            (json!({"functions": [{"name": "f"}]}), "functions"),
            (json!({"function_call": {"name": "f"}}), "function_call"),
        ] {
            let e = generation(&fields(v.clone()), None, &d, || 0).unwrap_err();
            assert_eq!((e.status, e.param, e.code), (400, Some(param), Some("unsupported_parameter")), "{v}");
            assert!(e.message.contains(param), "{v}: {}", e.message);
        }
        // Values that ask for nothing, and fields OpenAI's clients send that change nothing here.
        let harmless = json!({
            "logit_bias": {}, "presence_penalty": 0, "frequency_penalty": 0.0, "suffix": null, "best_of": 1,
            "logprobs": false, "top_logprobs": null, "response_format": {"type": "text"},
            "functions": null, "function_call": "auto", "user": "u-1",
            "stream_options": {"include_usage": false}, "parallel_tool_calls": false, "metadata": {"k": "v"},
        });
        generation(&fields(harmless), None, &d, || 0).unwrap();
    }

    #[test]
    fn logit_controls_are_read_and_bad_ones_are_400s() {
        let d = SamplingParams::default();
        let g = generation(&fields(json!({"logit_bias": {"5": -100}, "repeat_penalty": 1.1})), None, &d, || 0).unwrap();
        assert_eq!((g.controls.logit_bias, g.controls.repeat_penalty), (vec![(5, -100.0)], 1.1));
        for (v, param) in [
            (json!({"logit_bias": {"5": 200}}), "logit_bias"),
            (json!({"presence_penalty": 3}), "presence_penalty"),
            (json!({"frequency_penalty": "x"}), "frequency_penalty"),
            (json!({"repeat_last_n": -5}), "repeat_last_n"),
        ] {
            let e = generation(&fields(v.clone()), None, &d, || 0).unwrap_err();
            assert_eq!((e.status, e.param, e.kind), (400, Some(param), "invalid_request_error"), "{v}");
        }
    }

    #[test]
    fn response_formats_become_constraints() {
        let d = SamplingParams::default();
        let c = |v: Value| generation(&fields(json!({ "response_format": v })), None, &d, || 0).map(|g| g.constraint);
        assert_eq!(c(json!({"type": "text"})).unwrap(), None);
        assert_eq!(c(Value::Null).unwrap(), None);
        assert_eq!(c(json!({"type": "json_object"})).unwrap(), Some(Constraint::JsonObject));
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let got = c(json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}));
        let Some(Constraint::JsonSchema(text)) = got.unwrap() else { panic!("a schema") };
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema);
        for (v, says) in [
            (json!({"type": "json_schema"}), "'json_schema' object"),
            (json!({"type": "json_schema", "json_schema": {"name": "x"}}), "schema is missing"),
            (json!({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}), "must be a JSON schema"),
            (json!({"type": "json_schema", "json_schema": {"name": "", "schema": {}}}), "name"),
            (json!({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}), "strict"),
            (json!({"type": "regex"}), "'regex' is not supported"),
            (json!({}), "needs a 'type'"),
            (json!("json"), "must be an object"),
        ] {
            let e = c(v.clone()).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some("response_format")), "{v}");
            assert!(e.message.contains(says), "{v}: {}", e.message);
        }
    }
}
