//! The tokenizer a GGUF file carries (`tokenizer.ggml.*` metadata).

use super::meta::Meta;
use crate::error::{Error, Result};
use crate::model::config::Arch;

// ---------------------------------------------------------------------------------------------
// Tokenizer data
// ---------------------------------------------------------------------------------------------

/// GGUF token types (`tokenizer.ggml.token_type`, llama.cpp's `llama_token_type`).
pub mod token_type {
    pub const UNDEFINED: i32 = 0;
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    /// Special/control tokens (`<|im_end|>`, `<bos>`, ...): never produced by splitting text.
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    /// SentencePiece byte-fallback tokens `<0x00>`..`<0xFF>`.
    pub const BYTE: i32 = 6;
}

/// Everything GGUF's `tokenizer.ggml.*` metadata says, as owned copies. The tokenizer is built
/// from this (see `crate::tokenizer`). Ids are validated to be inside `tokens` when `tokens`
/// is not empty.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufTokenizerData {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE: SmolLM2, Qwen, Llama 3) or `"llama"`
    /// (SentencePiece: Gemma, Llama 2). Empty when the file has no tokenizer.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer (regex split) name for BPE models, such as
    /// `"smollm"`, `"qwen2"`, `"llama-bpe"`, `"default"`.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the vocabulary, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece piece scores); empty when absent, else one per token.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type` (see [`token_type`]); empty when absent, else one per token.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: BPE merges in priority order, each `"left right"`.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn)
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message)
    pub eom_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`, defaulted when absent: true for the `"llama"`
    /// (SentencePiece) model and for Gemma 3, false otherwise.
    pub add_bos_token: bool,
    /// `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos_token: bool,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece's "▁" prefix), if stated.
    pub add_space_prefix: Option<bool>,
}

impl GgufTokenizerData {
    /// A stand-in vocabulary for synthetic files that carry no real tokenizer but must satisfy
    /// llama.cpp (which wants as many tokens as embedding rows): SentencePiece model `"llama"`,
    /// tokens `<t0>`..`<tN>`, the first four control tokens (pad 0, eos 1, bos 2, unk 3).
    pub fn placeholder(vocab: usize) -> Self {
        GgufTokenizerData {
            model: "llama".into(),
            pre: Some("default".into()),
            tokens: (0..vocab).map(|i| format!("<t{i}>")).collect(),
            scores: vec![0.0; vocab],
            token_types: (0..vocab).map(|i| if i < 4 { 3 } else { 1 }).collect(),
            padding_token_id: Some(0),
            eos_token_id: Some(1),
            bos_token_id: Some(2),
            unknown_token_id: Some(3),
            add_bos_token: true,
            ..Default::default()
        }
    }

    /// The id of a token string, by linear search.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.tokens.iter().position(|t| t == token).map(|i| i as u32)
    }
}

pub(super) fn tokenizer_data(m: &Meta, arch: Arch) -> Result<GgufTokenizerData> {
    let path = m.path;
    let strings = |key: &str| -> Result<Vec<String>> {
        let Some(a) = m.opt_array(key)? else {
            return Ok(Vec::new());
        };
        a.iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, format!("metadata {key} should be an array of strings")))
    };
    let tokens = strings("tokenizer.ggml.tokens")?;
    if m.g.get("tokenizer.ggml.tokens").is_some() && tokens.is_empty() {
        return Err(Error::corrupt(path, "tokenizer.ggml.tokens is empty: the file has no vocabulary"));
    }
    let merges = strings("tokenizer.ggml.merges")?;
    let scores = match m.opt_array("tokenizer.ggml.scores")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|v| v.as_f64().map(|x| x as f32))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, "metadata tokenizer.ggml.scores should be numbers"))?,
    };
    let token_types = match m.opt_array("tokenizer.ggml.token_type")? {
        None => Vec::new(),
        Some(a) => a
            .iter()
            .map(|v| v.as_i64().and_then(|x| i32::try_from(x).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::corrupt(path, "metadata tokenizer.ggml.token_type should be integers"))?,
    };
    for (what, n) in [("scores", scores.len()), ("token_type", token_types.len())] {
        if n != 0 && n != tokens.len() {
            return Err(Error::Mismatch(format!(
                "{}: tokenizer.ggml.{what} has {n} entries for {} tokens",
                path.display(),
                tokens.len()
            )));
        }
    }
    let model = m.opt_str("tokenizer.ggml.model")?.unwrap_or_default().to_string();
    let pre = m.opt_str("tokenizer.ggml.pre")?.map(str::to_string);
    let n = tokens.len();
    let id = |name: &str, strict: bool| -> Result<Option<u32>> {
        let key = format!("tokenizer.ggml.{name}_token_id");
        match m.opt_u32(&key)? {
            Some(i) if n != 0 && i as usize >= n => {
                if strict {
                    Err(Error::Mismatch(format!("{}: {key} = {i} is outside the {n}-token vocabulary", path.display())))
                } else {
                    Ok(None)
                }
            }
            other => Ok(other),
        }
    };
    let default_add_bos = model == "llama" || matches!(arch, Arch::Gemma3 | Arch::Gemma4);
    Ok(GgufTokenizerData {
        bos_token_id: id("bos", true)?,
        eos_token_id: id("eos", true)?,
        eot_token_id: id("eot", true)?,
        eom_token_id: id("eom", true)?,
        unknown_token_id: id("unknown", false)?,
        padding_token_id: id("padding", false)?,
        add_bos_token: m.opt_bool("tokenizer.ggml.add_bos_token")?.unwrap_or(default_add_bos),
        add_eos_token: m.opt_bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false),
        add_space_prefix: m.opt_bool("tokenizer.ggml.add_space_prefix")?,
        model,
        pre,
        tokens,
        scores,
        token_types,
        merges,
    })
}
