//! Text to token ids and back, built on the `tokenizers` crate.
//!
//! Two sources (see [`TokenizerSource`]): a `tokenizer.json`, loaded as is, or the
//! `tokenizer.ggml.*` metadata of a GGUF file, from which this module builds the equivalent of the
//! model's official `tokenizer.json`:
//!
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE from the tokens and merges, ByteLevel decoder,
//!   and the pre-tokenizer (and normalizer) the model family uses, picked by `tokenizer.ggml.pre`:
//!   `qwen2` (Qwen2 split regex, then ByteLevel without regex; NFC normalizer), `smollm` (digits
//!   one by one, then ByteLevel with the GPT-2 regex), `llama-bpe`/`llama3` (Llama 3 split regex),
//!   `default`/`gpt-2` (or no `pre`) GPT-2's ByteLevel regex; any other name is unsupported.
//! - `tokenizer.ggml.model = "llama"`: sentencepiece BPE (Gemma): normalizer `" "` -> `"▁"`, no
//!   pre-tokenizer, BPE with byte fallback whose merges are derived from the token scores the way
//!   Hugging Face's `SpmConverter` derives them, decoder `"▁"` -> `" "`, ByteFallback, Fuse.
//!
//! In both, tokens typed control (3) become special added tokens (parsed whole in the text, dropped by
//! [`StreamDecoder`]) and tokens typed user-defined (4) become plain added tokens (parsed whole,
//! kept in the output), as llama.cpp treats them.
//!
//! BOS is never added by the `tokenizers` post-processor; [`Tokenizer::encode`] adds it itself.

use crate::error::{Error, Result};
use crate::loader::gguf::GgufTokenizerData;
use crate::loader::TokenizerSource;
use tk::decoders::byte_fallback::ByteFallback;
use tk::decoders::fuse::Fuse;
use tk::decoders::sequence::Sequence as DecoderSequence;
use tk::decoders::strip::Strip;
use tk::decoders::DecoderWrapper;
use tk::models::bpe::{Vocab, BPE};
use tk::normalizers::{NormalizerWrapper, Prepend, Replace, NFC};
use tk::pre_tokenizers::byte_level::ByteLevel;
use tk::pre_tokenizers::digits::Digits;
use tk::pre_tokenizers::sequence::Sequence as PreSequence;
use tk::pre_tokenizers::split::{Split, SplitPattern};
use tk::pre_tokenizers::PreTokenizerWrapper;
use tk::{AddedToken, SplitDelimiterBehavior};
use tokenizers as tk;

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
pub use crate::loader::gguf::token_type;

/// Qwen2's pre-tokenizer split (its tokenizer.json).
pub const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's pre-tokenizer split (its tokenizer.json).
pub const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A borrowed view of a GGUF file's tokenizer metadata: what the builders need. Tests build tiny
/// vocabularies with it directly.
#[derive(Clone, Copy, Debug, Default)]
pub struct GgufVocab<'a> {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (sentencepiece BPE).
    pub model: &'a str,
    /// `tokenizer.ggml.pre`: the pre-tokenizer family of a `gpt2` vocabulary.
    pub pre: Option<&'a str>,
    pub tokens: &'a [String],
    pub scores: Option<&'a [f32]>,
    pub token_types: Option<&'a [i32]>,
    pub merges: Option<&'a [String]>,
    /// `tokenizer.ggml.add_space_prefix` (sentencepiece's add_dummy_prefix); absent means false.
    pub add_space_prefix: Option<bool>,
}

/// A tokenizer: encode, decode, and the ids of the special tokens the engine needs.
pub struct Tokenizer {
    inner: tk::Tokenizer,
    add_bos: bool,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    vocab_size: usize,
}

fn tk_err(context: &str) -> impl Fn(tk::Error) -> Error + '_ {
    move |e| Error::Tokenizer(format!("{context}: {e}"))
}

impl Tokenizer {
    /// Builds the tokenizer from a checkpoint's source. `add_bos` says whether the model wants a
    /// BOS token in front of a prompt (GGUF `tokenizer.ggml.add_bos_token`, Hugging Face
    /// `add_bos_token`), `bos_id` which token that is; for a GGUF source a `None` `bos_id` falls back
    /// to the file's `tokenizer.ggml.bos_token_id`.
    pub fn from_source(source: &TokenizerSource, add_bos: bool, bos_id: Option<u32>) -> Result<Self> {
        let mut t = match source {
            TokenizerSource::Json(path) => Self::from_json_file(path)?,
            TokenizerSource::Gguf(data) => Self::from_gguf_data(data)?,
            TokenizerSource::None => {
                return Err(Error::Unsupported(
                    "this checkpoint has no tokenizer (a synthetic model runs on token ids: use `wgpu-llm bench`)"
                        .into(),
                ))
            }
        };
        t.add_bos = add_bos;
        if bos_id.is_some() {
            t.bos_id = bos_id;
        }
        Ok(t)
    }

    /// Loads a `tokenizer.json`. BOS/EOS are unknown here (they live in `tokenizer_config.json`):
    /// set them with [`Tokenizer::from_source`] or [`Tokenizer::set_special_ids`].
    pub fn from_json_file(path: &std::path::Path) -> Result<Self> {
        let inner = tk::Tokenizer::from_file(path).map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        Ok(Self::wrap(inner, None))
    }

    /// Loads a `tokenizer.json` from memory.
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self> {
        let inner = tk::Tokenizer::from_bytes(bytes).map_err(tk_err("tokenizer.json"))?;
        Ok(Self::wrap(inner, None))
    }

    fn wrap(inner: tk::Tokenizer, vocab_size: Option<usize>) -> Self {
        let vocab_size =
            vocab_size.unwrap_or_else(|| inner.get_vocab(true).values().copied().max().map_or(0, |m| m as usize + 1));
        Tokenizer { inner, add_bos: false, bos_id: None, eos_id: None, vocab_size }
    }

    /// Builds the tokenizer a GGUF file's metadata describes (see the module docs).
    pub fn from_gguf_data(d: &GgufTokenizerData) -> Result<Self> {
        let v = GgufVocab {
            model: &d.model,
            pre: d.pre.as_deref(),
            tokens: &d.tokens,
            scores: (!d.scores.is_empty()).then_some(&d.scores[..]),
            token_types: (!d.token_types.is_empty()).then_some(&d.token_types[..]),
            merges: (!d.merges.is_empty()).then_some(&d.merges[..]),
            add_space_prefix: d.add_space_prefix,
        };
        let mut t = Self::from_gguf_vocab(&v)?;
        t.add_bos = d.add_bos_token;
        t.bos_id = d.bos_token_id;
        t.eos_id = d.eos_token_id;
        Ok(t)
    }

    /// Builds from a borrowed view of GGUF metadata. BOS/EOS are unset: see
    /// [`Tokenizer::set_special_ids`].
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Self> {
        if v.tokens.is_empty() {
            return Err(Error::Tokenizer("GGUF has no tokenizer.ggml.tokens".into()));
        }
        for (key, len) in [
            ("tokenizer.ggml.token_type", v.token_types.map(<[_]>::len)),
            ("tokenizer.ggml.scores", v.scores.map(<[_]>::len)),
        ] {
            if let Some(len) = len.filter(|&n| n != v.tokens.len()) {
                return Err(Error::Tokenizer(format!("{key} has {len} entries for {} tokens", v.tokens.len())));
            }
        }
        let inner = match v.model {
            "gpt2" => build_byte_level(v)?,
            "llama" => build_sentencepiece(v)?,
            other => {
                return Err(Error::Unsupported(format!("GGUF tokenizer model {other:?} (supported: gpt2, llama)")))
            }
        };
        Ok(Self::wrap(inner, Some(v.tokens.len())))
    }

    /// Sets whether [`encode`](Self::encode) may add BOS, and the BOS/EOS ids.
    pub fn set_special_ids(&mut self, add_bos: bool, bos_id: Option<u32>, eos_id: Option<u32>) {
        self.add_bos = add_bos;
        self.bos_id = bos_id;
        self.eos_id = eos_id;
    }

    /// Encodes `text`. Special tokens written in the text (`<|im_start|>`, `<start_of_turn>`, ...)
    /// become their single ids, as chat templates need.
    ///
    /// With `add_bos`, BOS is put in front when the model wants one (see
    /// [`add_bos`](Self::add_bos)) and the text does not already start with it; pass `true` for a
    /// raw prompt and `false` for a rendered chat template (templates write BOS themselves).
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode_fast(text, false).map_err(tk_err("encode"))?;
        let mut ids = enc.get_ids().to_vec();
        if add_bos && self.add_bos {
            if let Some(bos) = self.bos_id {
                if ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                }
            }
        }
        Ok(ids)
    }

    /// Decodes ids to text, special tokens included (so `decode(encode(s)) == s` for most `s`).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tk_err("decode"))
    }

    /// Decodes ids to text, leaving out special (control) tokens.
    pub fn decode_skip_special(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, true).map_err(tk_err("decode"))
    }

    /// The token's string as the vocabulary spells it (`"Ġthe"`, `"▁the"`, `"<|im_end|>"`).
    pub fn token_to_str(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token spelled as in the vocabulary.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a special (control) token, which streamed output leaves out.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.get_added_tokens_decoder().get(&id).is_some_and(|t| t.special)
    }

    /// Number of token ids (the embedding's row count for a GGUF model).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Whether the model wants BOS in front of a prompt.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// The `tokenizers` tokenizer underneath.
    pub fn inner(&self) -> &tk::Tokenizer {
        &self.inner
    }

    /// A decoder for streaming generated tokens as text.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// Turns generated token ids into printable text deltas, one token at a time.
///
/// It decodes a short window of recent tokens and emits what the newest token added, but only
/// once that text is complete UTF-8: while the window's text ends in U+FFFD (a character split
/// across tokens, as with byte-fallback or byte-level tokens) it holds back. Special tokens are left
/// out of the output.
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    ids: Vec<u32>,
    /// Start of the window decoded for context.
    prefix: usize,
    /// End of what has been emitted.
    read: usize,
}

/// After this many held-back tokens the text is emitted even if it ends in U+FFFD (the model
/// produced bytes that are not UTF-8; a character is at most 4 bytes).
const MAX_HELD: usize = 8;

impl<'t> StreamDecoder<'t> {
    pub fn new(tok: &'t Tokenizer) -> Self {
        StreamDecoder { tok, ids: Vec::new(), prefix: 0, read: 0 }
    }

    /// Adds one token; returns the text it completes, if any (never an empty string).
    pub fn push(&mut self, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        self.step(false)
    }

    /// Emits whatever is held back (a trailing incomplete character comes out as U+FFFD).
    pub fn finish(&mut self) -> Result<Option<String>> {
        self.step(true)
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn step(&mut self, flush: bool) -> Result<Option<String>> {
        if self.read == self.ids.len() {
            return Ok(None);
        }
        let prefix_text = self.tok.decode_skip_special(&self.ids[self.prefix..self.read])?;
        let text = self.tok.decode_skip_special(&self.ids[self.prefix..])?;
        let held = self.ids.len() - self.read;
        if !flush && text.ends_with('\u{FFFD}') && held < MAX_HELD {
            return Ok(None);
        }
        let delta = match text.strip_prefix(prefix_text.as_str()) {
            Some(rest) => rest.to_owned(),
            // The window's start decoded differently in context; emit the part past the common prefix.
            None => {
                let common = prefix_text
                    .char_indices()
                    .zip(text.chars())
                    .find(|((_, a), b)| a != b)
                    .map_or(prefix_text.len().min(text.len()), |((i, _), _)| i);
                text.get(common..).unwrap_or_default().to_owned()
            }
        };
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(if delta.is_empty() { None } else { Some(delta) })
    }
}

// ---------------------------------------------------------------------------------------------
// Builders

fn vocab_map(tokens: &[String], spell: impl Fn(usize, &str) -> String) -> Vocab {
    // First occurrence wins if a token string repeats.
    let mut vocab = Vocab::default();
    vocab.reserve(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.entry(spell(i, t)).or_insert(i as u32);
    }
    vocab
}

fn type_of(v: &GgufVocab, i: usize) -> i32 {
    v.token_types.and_then(|t| t.get(i).copied()).unwrap_or(token_type::NORMAL)
}

/// Adds control tokens as special added tokens and user-defined ones as plain added tokens.
/// `spell` gives the added token's content for a vocabulary entry; `normalized_user` says whether
/// user-defined tokens are matched on normalized text.
fn add_typed_tokens(tok: &mut tk::Tokenizer, v: &GgufVocab, spell: impl Fn(&str) -> String, normalized_user: bool) {
    let mut special = Vec::new();
    let mut user = Vec::new();
    for (i, t) in v.tokens.iter().enumerate() {
        if t.is_empty() {
            continue;
        }
        match type_of(v, i) {
            token_type::CONTROL => special.push(AddedToken::from(t.clone(), true).normalized(false)),
            token_type::USER_DEFINED => user.push(AddedToken::from(spell(t), false).normalized(normalized_user)),
            _ => {}
        }
    }
    if !special.is_empty() {
        tok.add_special_tokens(&special);
    }
    if !user.is_empty() {
        tok.add_tokens(&user);
    }
}

/// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`).
fn build_byte_level(v: &GgufVocab) -> Result<tk::Tokenizer> {
    let merges_src =
        v.merges.ok_or_else(|| Error::Tokenizer("byte-level BPE GGUF has no tokenizer.ggml.merges".into()))?;
    let vocab = vocab_map(v.tokens, |_, t| t.to_owned());
    let mut merges = Vec::with_capacity(merges_src.len());
    for (i, m) in merges_src.iter().enumerate() {
        let (a, b) =
            m.split_once(' ').ok_or_else(|| Error::Tokenizer(format!("merge #{i} {m:?} is not two tokens")))?;
        merges.push((a.to_owned(), b.to_owned()));
    }
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(tk_err("byte-level BPE"))?;
    let mut tok = tk::Tokenizer::new(bpe);

    let byte_level = |use_regex: bool| ByteLevel::new(false, true, use_regex);
    let split = |re: &str| -> Result<PreTokenizerWrapper> {
        Ok(Split::new(SplitPattern::Regex(re.to_owned()), SplitDelimiterBehavior::Isolated, false)
            .map_err(tk_err("split regex"))?
            .into())
    };
    let (normalizer, pre): (Option<NormalizerWrapper>, PreTokenizerWrapper) = match v.pre.unwrap_or("default") {
        "qwen2" | "deepseek-r1-qwen" => {
            (Some(NFC.into()), PreSequence::new(vec![split(QWEN2_SPLIT)?, byte_level(false).into()]).into())
        }
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "falcon3" => {
            (None, PreSequence::new(vec![split(LLAMA3_SPLIT)?, byte_level(false).into()]).into())
        }
        "smollm" => (None, PreSequence::new(vec![Digits::new(true).into(), byte_level(true).into()]).into()),
        "default" | "gpt-2" | "gpt2" => (None, byte_level(true).into()),
        // llama.cpp refuses an unknown pre-tokenizer too: splitting text another way than the
        // model was trained with would run and give wrong text.
        other => {
            return Err(Error::Unsupported(format!(
                "pre-tokenizer {} (tokenizer.ggml.pre); this engine splits text as qwen2, llama-bpe, smollm or \
                 gpt-2 (default) do",
                crate::error::shown(other)
            )))
        }
    };
    tok.with_normalizer(normalizer);
    tok.with_pre_tokenizer(Some(pre));
    tok.with_decoder(Some(ByteLevel::default()));
    add_typed_tokens(&mut tok, v, str::to_owned, false);
    Ok(tok)
}

/// Sentencepiece BPE (`tokenizer.ggml.model = "llama"`), the equivalent of Hugging Face's
/// converted `tokenizer.json` for Gemma.
fn build_sentencepiece(v: &GgufVocab) -> Result<tk::Tokenizer> {
    // llama.cpp writes user-defined whitespace tokens ("▁▁") with real spaces; spell them back.
    let spell_user = |t: &str| t.replace(' ', "▁");
    let vocab =
        vocab_map(
            v.tokens,
            |i, t| {
                if type_of(v, i) == token_type::USER_DEFINED {
                    spell_user(t)
                } else {
                    t.to_owned()
                }
            },
        );
    let merges = spm_merges(&vocab, v.scores);
    let unk = v
        .tokens
        .iter()
        .enumerate()
        .find(|(i, _)| type_of(v, *i) == token_type::UNKNOWN)
        .map(|(_, t)| t.clone())
        .or_else(|| vocab.contains_key("<unk>").then(|| "<unk>".to_owned()));
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).byte_fallback(true).fuse_unk(true);
    if let Some(unk) = unk {
        builder = builder.unk_token(unk);
    }
    let bpe = builder.build().map_err(tk_err("sentencepiece BPE"))?;
    let mut tok = tk::Tokenizer::new(bpe);

    let replace = Replace::new(" ", "▁").map_err(tk_err("normalizer"))?;
    let add_prefix = v.add_space_prefix.unwrap_or(false);
    if add_prefix {
        tok.with_normalizer(Some(tk::normalizers::Sequence::new(vec![
            Prepend::new("▁".into()).into(),
            replace.into(),
        ])));
    } else {
        tok.with_normalizer(Some(replace));
    }
    tok.with_pre_tokenizer(None::<PreTokenizerWrapper>);
    let mut decoders: Vec<DecoderWrapper> =
        vec![Replace::new("▁", " ").map_err(tk_err("decoder"))?.into(), ByteFallback::new().into(), Fuse::new().into()];
    if add_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    tok.with_decoder(Some(DecoderSequence::new(decoders)));
    add_typed_tokens(&mut tok, v, spell_user, true);
    Ok(tok)
}

/// Merges implied by a sentencepiece vocabulary, as `transformers.generate_merges` (used by
/// `SpmConverter`) derives them: for every token `t` (in id order) and every split of `t` into two
/// vocabulary tokens `(a, b)`, a merge `(a, b)`; all sorted by `t`'s score (descending), then the
/// character lengths of `a` and `b` (descending), stably. Without scores, the id order is the
/// priority.
pub fn spm_merges(vocab: &Vocab, scores: Option<&[f32]>) -> Vec<(String, String)> {
    struct Cand<'v> {
        score: f32,
        len_a: u32,
        len_b: u32,
        id: u32,
        token: &'v str,
        split: usize, // byte offset of the split
    }
    // The vocabulary's tokens in id order, and a lookup by &str.
    let mut by_id: Vec<(&str, u32)> = vocab.iter().map(|(k, &v)| (k.as_str(), v)).collect();
    by_id.sort_unstable_by_key(|&(_, id)| id);
    let mut cands: Vec<Cand> = Vec::new();
    for &(t, id) in &by_id {
        let score = match scores {
            Some(s) => s.get(id as usize).copied().unwrap_or(0.0),
            None => -(id as f32),
        };
        let total = t.chars().count() as u32;
        for (n_a, (pos, _)) in t.char_indices().enumerate().skip(1) {
            let (a, b) = t.split_at(pos);
            if vocab.contains_key(a) && vocab.contains_key(b) {
                cands.push(Cand { score, len_a: n_a as u32, len_b: total - n_a as u32, id, token: t, split: pos });
            }
        }
    }
    cands.sort_by(|x, y| {
        y.score
            .partial_cmp(&x.score)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(y.len_a.cmp(&x.len_a))
            .then(y.len_b.cmp(&x.len_b))
            .then(x.id.cmp(&y.id))
    });
    cands
        .iter()
        .map(|c| {
            let (a, b) = c.token.split_at(c.split);
            (a.to_owned(), b.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spm_merges_follow_scores() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"].iter().map(|s| s.to_string()).collect();
        let vocab = vocab_map(&tokens, |_, t| t.to_owned());
        // "bc" scores higher than "ab"; "abc" splits as ("ab","c") and ("a","bc"): longer left first.
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -3.0];
        let m = spm_merges(&vocab, Some(&scores));
        let m: Vec<(&str, &str)> = m.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(m, vec![("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }
}
