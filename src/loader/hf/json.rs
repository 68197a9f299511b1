//! The JSON side files of a Hugging Face folder (config.json, tokenizer.json,
//! tokenizer_config.json, ...) and the chat template.

use super::config::json_shown;
use crate::error::{Error, Result};
use crate::loader::{read_small_file, side_file_exists};
use serde_json::{Map, Value};
use std::path::Path;

/// The largest JSON side file read (config.json, tokenizer_config.json, ...).
pub(super) const MAX_JSON_BYTES: u64 = 64 << 20;
/// The largest tokenizer.json read (real ones: up to ~35 MB).
pub(super) const MAX_TOKENIZER_JSON_BYTES: u64 = 512 << 20;

pub(super) fn json_error(path: &Path, e: serde_json::Error) -> Error {
    Error::corrupt(path, format!("bad JSON: {}", crate::error::one_line(&e.to_string(), 300)))
}

pub(super) fn read_json(path: &Path) -> Result<Value> {
    let bytes = read_small_file(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| json_error(path, e))
}

/// A JSON side file that may be absent (`None`); present but not a regular file is an error.
pub(super) fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    if side_file_exists(path)? {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// A token id: an integer below 2^32, or null/absent. `key` and `path` name it in errors.
pub(super) fn token_id(v: Option<&Value>, key: &str, path: &Path) -> Result<Option<u32>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64().and_then(|x| u32::try_from(x).ok()) {
            Some(id) => Ok(Some(id)),
            None => Err(Error::corrupt(path, format!("{key} should be a token id, is {}", json_shown(x)))),
        },
    }
}

/// Token ids from a value that is an id, a list of ids, or null/absent.
pub(super) fn token_ids(v: Option<&Value>, key: &str, path: &Path) -> Result<Vec<u32>> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                token_id(Some(x), key, path)?
                    .ok_or_else(|| Error::corrupt(path, format!("{key} should be a list of token ids, has null")))
            })
            .collect(),
        other => Ok(token_id(other, key, path)?.into_iter().collect()),
    }
}

/// The parts of tokenizer.json the loader reads (the rest is skipped, not built).
#[derive(serde::Deserialize)]
pub(super) struct TokenizerJson {
    #[serde(default)]
    pub(super) added_tokens: Vec<AddedToken>,
    #[serde(default)]
    pub(super) post_processor: Option<Value>,
    #[serde(default)]
    pub(super) model: Option<TokenizerModel>,
}

#[derive(serde::Deserialize)]
pub(super) struct TokenizerModel {
    /// BPE / WordPiece / WordLevel: an object of token → id; Unigram: a list of [token, score].
    #[serde(default)]
    pub(super) vocab: Option<Value>,
}

#[derive(serde::Deserialize)]
pub(super) struct AddedToken {
    pub(super) id: u32,
    pub(super) content: String,
}

pub(super) fn read_tokenizer_json(path: &Path) -> Result<TokenizerJson> {
    let bytes = read_small_file(path, MAX_TOKENIZER_JSON_BYTES)?;
    let t: TokenizerJson = serde_json::from_slice(&bytes).map_err(|e| json_error(path, e))?;
    let model_vocab = match t.model.as_ref().and_then(|m| m.vocab.as_ref()) {
        Some(Value::Object(o)) => o.len(),
        Some(Value::Array(a)) => a.len(),
        Some(_) => return Err(Error::corrupt(path, "model.vocab is neither an object nor a list")),
        None => 0,
    };
    if model_vocab == 0 {
        return Err(Error::Tokenizer(format!(
            "{}: the vocabulary is empty (model.vocab has no tokens)",
            path.display()
        )));
    }
    Ok(t)
}

/// Whether a tokenizer.json post-processor starts single sequences with a special token (BOS).
pub(super) fn prepends_special_token(pp: &Value) -> bool {
    match pp.get("type").and_then(Value::as_str) {
        Some("TemplateProcessing") => pp
            .get("single")
            .and_then(Value::as_array)
            .and_then(|s| s.first())
            .is_some_and(|first| first.get("SpecialToken").is_some()),
        Some("Sequence") => {
            pp.get("processors").and_then(Value::as_array).is_some_and(|ps| ps.iter().any(prepends_special_token))
        }
        Some("BertProcessing") | Some("RobertaProcessing") => true,
        _ => false,
    }
}

/// The chat template: tokenizer_config.json `chat_template` (a string, or a list of named
/// templates: "default" wins), else chat_template.jinja, else chat_template.json.
pub(super) fn chat_template(dir: &Path, tcfg: Option<&Map<String, Value>>) -> Result<Option<String>> {
    let tcfg_path = dir.join("tokenizer_config.json");
    match tcfg.and_then(|t| t.get("chat_template")) {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |n: &str| {
                list.iter()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some(n))
                    .and_then(|e| e.get("template"))
                    .and_then(Value::as_str)
            };
            let first = list.first().and_then(|e| e.get("template")).and_then(Value::as_str);
            return match named("default").or(first) {
                Some(t) => Ok(Some(t.to_string())),
                None => Err(Error::corrupt(
                    &tcfg_path,
                    "chat_template is a list without a template string (want [{\"name\": …, \"template\": \"…\"}])",
                )),
            };
        }
        Some(v) => {
            return Err(Error::corrupt(
                &tcfg_path,
                format!("chat_template should be a string or a list of named templates, is {}", json_shown(v)),
            ));
        }
    }
    let jinja = dir.join("chat_template.jinja");
    if side_file_exists(&jinja)? {
        let bytes = read_small_file(&jinja, MAX_JSON_BYTES)?;
        return String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Error::corrupt(&jinja, "the chat template is not UTF-8 text"));
    }
    let json = dir.join("chat_template.json");
    if let Some(v) = read_optional_json(&json)? {
        return Ok(v.get("chat_template").and_then(Value::as_str).map(str::to_string));
    }
    Ok(None)
}
