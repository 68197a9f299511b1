//! `logprobs` in the OpenAI API: what a request asks for, and the shapes of the answer.
//!
//! - **Chat completions**: `logprobs: true` (the sampled tokens' logprobs) and `top_logprobs: n`
//!   (`0..=20`, needs `logprobs: true`) give each choice `logprobs: {content: [{token, logprob,
//!   bytes, top_logprobs: [{token, logprob, bytes}]}], refusal: null}`; streamed, each chunk
//!   carries the entries of the tokens whose text it brings.
//! - **Completions** (legacy): `logprobs: n` (`0..=5`) gives `logprobs: {tokens, token_logprobs,
//!   top_logprobs, text_offset}`, `top_logprobs` a map per token of its `n` most likely tokens'
//!   text to their logprob, the sampled token's always included (up to `n + 1` entries, as vLLM);
//!   `text_offset`: where each token's text starts in the choice's text (the echoed prompt
//!   included), in characters of the tokens' texts.
//!
//! The logprobs are those of the model's distribution, the raw logits (after `logit_bias` and the
//! penalties where the request sets them), whatever the request's temperature, top-k/top-p/min-p
//! or `response_format` (see [`crate::sampling::logprobs`]). A
//! token's `token` is its text (`bytes`: its UTF-8 bytes, which may be part of a character: the
//! text then has U+FFFD); end-of-sequence tokens are not text and have no entry. A logprob of
//! `-inf` is given as -9999.0 (OpenAI's value for "very unlikely"; JSON has no infinity).

use super::api::ApiError;
use crate::grammar::Vocabulary;
use crate::sampling::{TokenLogprobs, MAX_TOP_LOGPROBS};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// Completions' `logprobs` at most (OpenAI's limit).
pub const MAX_COMPLETION_LOGPROBS: u32 = 5;

/// The engine's [`Request::logprobs`](crate::decode::batch::Request::logprobs) for a chat
/// request's fields: `logprobs` (a boolean) and `top_logprobs` (`0..=20`, only with `logprobs:
/// true`); a bad value is a 400 naming its field.
pub fn chat_request(fields: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    let on = match fields.get("logprobs") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(bad(format!("logprobs must be true or false, not {v}"), "logprobs")),
    };
    let top = match fields.get("top_logprobs") {
        None | Some(Value::Null) => None,
        Some(v) => Some(count(v, MAX_TOP_LOGPROBS, "top_logprobs")?),
    };
    match (on, top) {
        (false, Some(_)) => Err(bad("top_logprobs needs logprobs: true".into(), "top_logprobs")),
        (false, None) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// The engine's [`Request::logprobs`](crate::decode::batch::Request::logprobs) for a completion
/// request's `logprobs: n` (`0..=5`); `top_logprobs` is chat's (a 400 here).
pub fn completion_request(fields: &Map<String, Value>) -> Result<Option<u32>, ApiError> {
    if fields.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(bad("top_logprobs is a chat completions field: use logprobs: n".into(), "top_logprobs"));
    }
    match fields.get("logprobs") {
        None | Some(Value::Null | Value::Bool(false)) => Ok(None),
        Some(v) => count(v, MAX_COMPLETION_LOGPROBS, "logprobs").map(Some),
    }
}

fn bad(message: String, param: &'static str) -> ApiError {
    ApiError::invalid(message, Some(param))
}

/// An integer in `0..=max`.
fn count(v: &Value, max: u32, param: &'static str) -> Result<u32, ApiError> {
    match v.as_u64() {
        Some(n) if n <= max as u64 => Ok(n as u32),
        _ => Err(bad(format!("{param} must be an integer from 0 to {max}, not {v}"), param)),
    }
}

/// A token as logprobs show it: its text and bytes.
struct Piece {
    text: String,
    bytes: Vec<u8>,
}

/// One generated token's entry.
struct Entry {
    piece: Piece,
    logprob: f32,
    top: Vec<(Piece, f32)>,
    /// Characters of text before it.
    offset: usize,
}

/// A choice's logprobs, gathered token by token ([`push`](Self::push)) and given out whole
/// ([`all`](Self::all)) or by chunk ([`take`](Self::take)).
pub struct LogprobLog<'t> {
    tokenizer: &'t Tokenizer,
    /// The vocabulary's token bytes, where the grammar engine has them (else the tokenizer's
    /// decoding of the token alone).
    vocab: Option<&'t Vocabulary>,
    chat: bool,
    entries: Vec<Entry>,
    /// Entries already given out by [`take`](Self::take).
    taken: usize,
    /// Characters of text so far.
    offset: usize,
}

impl<'t> LogprobLog<'t> {
    /// The log of a chat choice (`chat`) or of a completion whose text starts with `echo`.
    pub fn new(tokenizer: &'t Tokenizer, vocab: Option<&'t Vocabulary>, chat: bool, echo: &str) -> Self {
        Self { tokenizer, vocab, chat, entries: Vec::new(), taken: 0, offset: echo.chars().count() }
    }

    fn piece(&self, id: u32) -> Piece {
        let bytes = match self.vocab.and_then(|v| v.token_bytes(id)) {
            Some(b) => b,
            None => self.tokenizer.decode(&[id]).unwrap_or_default().into_bytes(),
        };
        Piece { text: String::from_utf8_lossy(&bytes).into_owned(), bytes }
    }

    /// Adds the entry of generated token `id` (not an end-of-sequence token).
    pub fn push(&mut self, id: u32, lp: &TokenLogprobs) {
        let piece = self.piece(id);
        let top = lp.top.iter().map(|&(t, l)| (self.piece(t), l)).collect();
        let offset = self.offset;
        self.offset += piece.text.chars().count();
        self.entries.push(Entry { piece, logprob: lp.logprob, top, offset });
    }

    /// Every entry, in OpenAI's shape: a whole answer's `logprobs`.
    pub fn all(&self) -> Value {
        self.shape(&self.entries)
    }

    /// The entries since the last call (`null` when none): a streamed chunk's `logprobs`.
    pub fn take(&mut self) -> Value {
        let new = &self.entries[self.taken..];
        self.taken = self.entries.len();
        if new.is_empty() {
            return Value::Null;
        }
        self.shape(new)
    }

    fn shape(&self, entries: &[Entry]) -> Value {
        let one = |p: &Piece, l: f32| json!({"token": p.text, "logprob": number(l), "bytes": p.bytes});
        if self.chat {
            let content: Vec<Value> = entries
                .iter()
                .map(|e| {
                    let mut v = one(&e.piece, e.logprob);
                    v["top_logprobs"] = e.top.iter().map(|(p, l)| one(p, *l)).collect();
                    v
                })
                .collect();
            return json!({"content": content, "refusal": null});
        }
        let top: Vec<Value> = entries
            .iter()
            .map(|e| {
                let mut m = Map::new();
                for (p, l) in &e.top {
                    m.entry(p.text.clone()).or_insert_with(|| number(*l).into());
                }
                m.entry(e.piece.text.clone()).or_insert_with(|| number(e.logprob).into());
                Value::Object(m)
            })
            .collect();
        json!({
            "tokens": entries.iter().map(|e| e.piece.text.clone()).collect::<Vec<_>>(),
            "token_logprobs": entries.iter().map(|e| number(e.logprob)).collect::<Vec<_>>(),
            "top_logprobs": top,
            "text_offset": entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
        })
    }
}

/// A logprob as JSON carries it: -9999.0 for `-inf` (and NaN).
fn number(lp: f32) -> f64 {
    if lp.is_finite() {
        lp as f64
    } else {
        -9999.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn requests_ask_for_logprobs() {
        let chat = |v: Value| chat_request(&map(v));
        assert_eq!(chat(json!({})).unwrap(), None);
        assert_eq!(chat(json!({"logprobs": false, "top_logprobs": null})).unwrap(), None);
        assert_eq!(chat(json!({"logprobs": true})).unwrap(), Some(0));
        assert_eq!(chat(json!({"logprobs": true, "top_logprobs": 20})).unwrap(), Some(20));
        let done = |v: Value| completion_request(&map(v));
        assert_eq!(done(json!({"logprobs": null})).unwrap(), None);
        assert_eq!(done(json!({"logprobs": 0})).unwrap(), Some(0));
        assert_eq!(done(json!({"logprobs": 5})).unwrap(), Some(5));
        for (v, param) in [
            (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
            (json!({"logprobs": true, "top_logprobs": -1}), "top_logprobs"),
            (json!({"logprobs": true, "top_logprobs": 2.5}), "top_logprobs"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (json!({"logprobs": false, "top_logprobs": 0}), "top_logprobs"),
            (json!({"logprobs": 3}), "logprobs"),
        ] {
            let e = chat(v.clone()).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(param)), "{v}");
            assert!(e.message.contains(param), "{v}: {}", e.message);
        }
        for (v, param) in [
            (json!({"logprobs": 6}), "logprobs"),
            (json!({"logprobs": true}), "logprobs"),
            (json!({"logprobs": "2"}), "logprobs"),
            (json!({"logprobs": 1, "top_logprobs": 1}), "top_logprobs"),
        ] {
            let e = done(v.clone()).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(param)), "{v}");
        }
    }
}
