//! The OpenAI API's request and response bodies (the parts this server implements), and its
//! error shape.

use crate::sampling::SamplingParams;
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
    pub stop: Option<Stop>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
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
    pub content: Option<Content>,
}

/// A message's content: a string, or parts of which only text is understood here.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
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
            Some(Content::Text(s)) => Ok(s.clone()),
            Some(Content::Parts(parts)) => {
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
}

/// OpenAI's documented ranges where it has them (temperature 0..=2, top_p in (0, 1]), this
/// engine's own for the rest.
pub fn generation(
    f: &SamplingFields,
    max_tokens: Option<i64>,
    defaults: &SamplingParams,
    random_seed: impl FnOnce() -> u64,
) -> Result<Generation, ApiError> {
    if let Some(n) = f.n {
        if n != 1 {
            return Err(ApiError::invalid(format!("n = {n}: only one choice per request is supported"), Some("n")));
        }
    }
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
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) if v.len() <= 4 => v.clone(),
        Some(Stop::Many(v)) => {
            return Err(ApiError::invalid(format!("{} stop sequences: at most 4", v.len()), Some("stop")))
        }
    };
    Ok(Generation {
        params: p,
        max_tokens,
        stops,
        stream: f.stream.unwrap_or(false),
        include_usage: f.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
    })
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
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
            (json!({"n": 2}), Some("n")),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), Some("stop")),
        ] {
            let e = generation(&fields(v.clone()), None, &d, || 0).unwrap_err();
            assert_eq!((e.status, e.param), (400, param), "{v}");
        }
        let e = generation(&fields(json!({})), Some(0), &d, || 0).unwrap_err();
        assert_eq!(e.param, Some("max_tokens"));
    }
}
