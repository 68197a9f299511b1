//! Structured output: a [`Constraint`] (a JSON schema, a regular expression or a Lark grammar)
//! compiled by [llguidance](https://github.com/guidance-ai/llguidance) into a [`Matcher`] over
//! the model's vocabulary, which gives the [`TokenMask`] of the tokens allowed next and advances
//! by each sampled token. The samplers apply the mask ([`crate::sampling::mask`]); the decode
//! loop that drives both is [`crate::decode::constrained`].
//!
//! The vocabulary ([`Vocabulary`]) is built once per tokenizer: each token's bytes (byte-level
//! BPE or SentencePiece byte fallback, read from the tokenizer's `tokenizer.json` form), special
//! tokens marked as such (a grammar never produces them), ids past the tokenizer up to the
//! model's logits width as unreachable specials, and the model's end-of-sequence tokens, which
//! the mask allows exactly where the grammar may end.
//!
//! JSON schemas are compiled without free whitespace (`", "` between items, `": "` after keys),
//! so a model cannot spend its tokens on blank space; a schema's own `x-guidance` options win.

use crate::error::{Error, Result};
use crate::sampling::TokenMask;
use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::{ApproximateTokEnv, InferenceCapabilities, TokEnv, TokRxInfo, TokTrie};
use llguidance::ParserFactory;
use std::sync::Arc;

/// What the generated text must match.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Constraint {
    /// A JSON schema (its text): the output is one JSON value valid under it.
    JsonSchema(String),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// A regular expression the whole output matches.
    Regex(String),
    /// A grammar in llguidance's Lark syntax (a `start` rule; `%json { .. }` embeds a schema).
    Lark(String),
}

impl Constraint {
    /// What this constraint is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonSchema(_) => "JSON schema",
            Constraint::JsonObject => "JSON object",
            Constraint::Regex(_) => "regex",
            Constraint::Lark(_) => "grammar",
        }
    }

    /// Checks that the constraint compiles, before any model is loaded: the same grammar built
    /// over a stand-in byte-level vocabulary, so a schema or grammar with an error is reported
    /// at once (a model's own [`Vocabulary::matcher`] checks it again against its tokens).
    pub fn check(&self) -> Result<()> {
        static BYTES: std::sync::OnceLock<std::result::Result<ParserFactory, String>> = std::sync::OnceLock::new();
        let factory = BYTES
            .get_or_init(|| {
                let env = ApproximateTokEnv::single_byte_env();
                let mut f = ParserFactory::new(&env, capabilities(), &SlicedBiasComputer::general_slices())
                    .map_err(|e| e.to_string())?;
                f.quiet();
                Ok(f)
            })
            .as_ref()
            .map_err(|e| Error::InvalidArgument(format!("structured output: building the grammar engine: {e}")))?;
        factory
            .create_parser(self.top_level()?)
            .map(drop)
            .map_err(|e| Error::InvalidArgument(format!("invalid {}: {}", self.kind(), one_line(&e.to_string()))))
    }

    /// The grammar llguidance compiles; a schema that is not JSON, or a grammar in GBNF (which
    /// llguidance does not read), is an error naming the problem.
    fn top_level(&self) -> Result<TopLevelGrammar> {
        let bad = |msg: String| Error::InvalidArgument(format!("invalid {}: {msg}", self.kind()));
        Ok(match self {
            Constraint::JsonSchema(text) => {
                let schema: serde_json::Value =
                    serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(bad("a schema is a JSON object (or true / false)".into()));
                }
                TopLevelGrammar::from_json_schema(compact(schema))
            }
            Constraint::JsonObject => TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"}))),
            Constraint::Regex(rx) => {
                // llguidance checks the pattern when it builds the parser; say so early here.
                if rx.is_empty() {
                    return Err(bad("the pattern is empty".into()));
                }
                TopLevelGrammar::from_regex(rx)
            }
            Constraint::Lark(text) => {
                if looks_like_gbnf(text) {
                    return Err(bad(
                        "this looks like GBNF (`::=` rules), which is not supported: write the grammar in \
                         Lark syntax (`rule: ...`, a `start` rule), as llguidance reads it"
                            .into(),
                    ));
                }
                TopLevelGrammar::from_lark(text.clone())
            }
        })
    }
}

/// Whether a grammar text is GBNF (llama.cpp's `name ::= ...` rules) rather than Lark.
fn looks_like_gbnf(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        !l.starts_with('#') && !l.starts_with("//") && l.contains("::=")
    })
}

/// A JSON schema with the compact separators and no free whitespace, unless it sets its own.
pub(crate) fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
        schema
    } else if schema == serde_json::Value::Bool(true) {
        compact(serde_json::json!({}))
    } else {
        schema
    }
}

/// A model's vocabulary as the grammar engine sees it (see the [module docs](self)); cheap to
/// clone, shared by every [`Matcher`] of the model.
#[derive(Clone)]
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    vocab: usize,
    eos: Vec<u32>,
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` for logits of `vocab` entries, ending at the `eos` tokens.
    pub fn new(tokenizer: &Tokenizer, vocab: usize, eos: &[u32]) -> Result<Self> {
        let bad = |msg: String| Error::InvalidArgument(format!("structured output: {msg}"));
        let json = tokenizer.inner().to_string(false).map_err(|e| bad(format!("reading the tokenizer: {e}")))?;
        let json: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| bad(format!("reading the tokenizer: {e}")))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| bad(format!("the tokenizer's token bytes: {e}")))?;
        if words.len() > vocab {
            // Trailing ids the model has no logits for (never sampled).
            words.truncate(vocab);
        }
        // Ids the tokenizer does not spell (padding of the embedding) can never be produced.
        let missing = |i: usize| {
            let mut name = format!(".<[{i}]>").into_bytes();
            name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            name
        };
        for (i, w) in words.iter_mut().enumerate() {
            if w.is_empty() {
                *w = missing(i);
            }
        }
        while words.len() < vocab {
            words.push(missing(words.len()));
        }
        let first_eos = *eos.first().ok_or_else(|| bad("the model has no end-of-sequence token".into()))?;
        if let Some(&e) = eos.iter().find(|&&e| e as usize >= vocab) {
            return Err(bad(format!("end-of-sequence token {e} is outside the vocabulary of {vocab}")));
        }
        let info = TokRxInfo::new(vocab as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new(&env, capabilities(), &SlicedBiasComputer::general_slices())
            .map_err(|e| bad(format!("building the grammar engine: {e}")))?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory), vocab, eos: eos.to_vec() })
    }

    /// Logits this vocabulary covers.
    pub fn len(&self) -> usize {
        self.vocab
    }

    /// Never true for a model's vocabulary.
    pub fn is_empty(&self) -> bool {
        self.vocab == 0
    }

    /// The end-of-sequence tokens.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// The bytes token `id` stands for in text (a special token: its name), `None` past the
    /// vocabulary: what `logprobs` reports (`bytes`) for it.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        if id as usize >= self.vocab {
            return None;
        }
        let bytes = self.factory.tok_env().tok_trie().token(id);
        Some(bytes.strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER]).unwrap_or(bytes).to_vec())
    }

    /// A matcher for `constraint`, at the start of the output.
    pub fn matcher(&self, constraint: &Constraint) -> Result<Matcher> {
        let grammar = constraint.top_level()?;
        let parser = self.factory.create_parser(grammar).map_err(|e| {
            Error::InvalidArgument(format!("invalid {}: {}", constraint.kind(), one_line(&e.to_string())))
        })?;
        let inner = llguidance::Matcher::new(Ok(parser));
        let mut m = Matcher { inner, vocab: self.vocab, eos: self.eos.clone() };
        m.check()?;
        Ok(m)
    }
}

/// What the decode loops can do for the grammar engine: plain masks (no forced or rolled-back
/// tokens).
fn capabilities() -> InferenceCapabilities {
    InferenceCapabilities { ff_tokens: false, backtrack: false, conditional_ff_tokens: false, fork: false }
}

/// The first line of an engine message (messages to users are one line).
fn one_line(msg: &str) -> String {
    msg.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("unknown error").to_string()
}

/// Where an output stands under its constraint ([`Vocabulary::matcher`]).
pub struct Matcher {
    inner: llguidance::Matcher,
    vocab: usize,
    eos: Vec<u32>,
}

impl Matcher {
    fn check(&mut self) -> Result<()> {
        match self.inner.get_error() {
            Some(e) => Err(Error::InvalidArgument(format!("structured output: {}", one_line(&e)))),
            None => Ok(()),
        }
    }

    /// The tokens allowed next (an end-of-sequence token where the output may end). An error
    /// where nothing can follow (the constraint cannot continue).
    pub fn mask(&mut self) -> Result<TokenMask> {
        let set = self.inner.compute_mask();
        let set = match set {
            Ok(s) => s,
            Err(e) => return Err(Error::InvalidArgument(format!("structured output: {}", one_line(&e.to_string())))),
        };
        let words = set.as_slice();
        let n = TokenMask::words_for(self.vocab);
        let mask = TokenMask::from_words(self.vocab, words.get(..n).unwrap_or(words).to_vec())?;
        mask.check(self.vocab)?;
        Ok(mask)
    }

    /// Advances past `token` (one the last mask allowed; an end-of-sequence token ends the
    /// output).
    pub fn advance(&mut self, token: u32) -> Result<()> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        self.inner.consume_token(token).map_err(|e| {
            Error::InvalidArgument(format!("structured output: token {token}: {}", one_line(&e.to_string())))
        })
    }

    /// Whether the output so far is complete (the constraint allows it to end here).
    pub fn is_accepting(&mut self) -> bool {
        self.inner.is_accepting().unwrap_or(false)
    }

    /// Whether the output is complete and nothing but its end may follow.
    pub fn is_finished(&self) -> bool {
        self.inner.is_stopped() && self.inner.get_error().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_are_checked_without_a_model() {
        let ok = [
            Constraint::JsonSchema(r#"{"type": "object", "properties": {"a": {"type": "integer"}}}"#.into()),
            Constraint::JsonObject,
            Constraint::Regex("[a-z]+".into()),
            Constraint::Lark("start: \"yes\" | \"no\"".into()),
        ];
        for c in &ok {
            c.check().unwrap_or_else(|e| panic!("{c:?}: {e}"));
        }
        let bad = [
            (Constraint::JsonSchema(r##"{"$ref": "#/$defs/missing"}"##.into()), "invalid JSON schema"),
            (Constraint::JsonSchema("{not json".into()), "not JSON"),
            (Constraint::Regex("(unclosed".into()), "invalid regex"),
            (Constraint::Lark("start: undefined_rule".into()), "invalid grammar"),
            (Constraint::Lark("root ::= \"a\"".into()), "GBNF"),
        ];
        for (c, want) in &bad {
            let e = c.check().expect_err(&format!("{c:?} should be refused")).to_string();
            assert!(e.contains(want), "{c:?}: {e}");
        }
    }

    #[test]
    fn gbnf_is_told_apart() {
        assert!(looks_like_gbnf("root ::= \"yes\" | \"no\"\n"));
        assert!(!looks_like_gbnf("start: \"yes\" | \"no\"\n"));
        let e = Constraint::Lark("root ::= \"a\"".into()).top_level().err().unwrap();
        assert!(e.to_string().contains("GBNF"), "{e}");
    }

    #[test]
    fn schemas_get_compact_separators_unless_they_say() {
        let s = compact(serde_json::json!({"type": "integer"}));
        assert_eq!(s["x-guidance"]["whitespace_flexible"], false);
        let own = compact(serde_json::json!({"x-guidance": {"whitespace_flexible": true}}));
        assert_eq!(own["x-guidance"]["whitespace_flexible"], true);
        assert!(Constraint::JsonSchema("{not json".into()).top_level().err().unwrap().to_string().contains("not JSON"));
        assert!(Constraint::JsonSchema("[1]".into()).top_level().is_err());
    }
}
