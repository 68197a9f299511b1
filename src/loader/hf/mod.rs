//! Hugging Face checkpoint folders: `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` and, when present,
//! `generation_config.json` / `chat_template.jinja`.
//!
//! Tensor names are mapped onto the canonical GGUF names (see the module docs of
//! [`crate::loader`]); tensors that map to nothing (vision towers, rotary caches, ...) are left
//! out. Safetensors headers are read and validated by the `safetensors` crate (offsets contiguous
//! from 0, sizes matching dtype × shape, no overflow) and the data must end exactly at the end of
//! the file. Stored types F32, F16 and BF16 are read; a used tensor of any other type is
//! [`Error::Unsupported`]. Every file is opened only if it is a regular file.
//!
//! MLX quantized folders (mlx-lm's `convert -q`, mlx-community checkpoints): config.json's
//! `quantization` (`group_size`, `bits`, `mode` "affine", and per-module overrides: an object with
//! its own `group_size`/`bits`, or `false` for a module left in floats) says how each linear
//! layer's `weight` (packed U32), `scales` and `biases` (f16 or bf16) encode it; the three become
//! one [`DType::Affine`] tensor of the logical shape `[N, K]` (see `mlx_affine`).

use super::{
    capped, check_layer_count, check_tensors, limits, open_regular, read_small_file, side_file_exists, split_halves,
    validate_config, AffineParts, Checkpoint, DType, DataFile, Fixup, StoredTensor, TokenizerSource,
    END_OF_TURN_TOKENS,
};
use crate::error::{shown, Error, Result};
use crate::model::arch::qwen3_5_moe;
use crate::model::arch::{self, gemma3, DeltaNetParams, Hyperparams, MoeParams, TensorName};
use crate::model::config::{Activation, Arch, LayerAttention, ModelConfig, PerLayerInput};
use serde_json::{Map, Value};

mod config;
mod mlx;
mod safetensors;

use config::{build_config, json_shown, Cfg};
use mlx::mlx_affine;
pub use safetensors::{canonical_name, MAX_SAFETENSORS_HEADER};
use safetensors::{load_safetensors, stack_experts, MlxParts};
use std::collections::HashMap;
use std::path::Path;

/// Opens a Hugging Face checkpoint folder.
pub fn open(dir: &Path) -> Result<Checkpoint> {
    let config_path = dir.join("config.json");
    let root = read_json(&config_path)?;
    let root = root.as_object().ok_or_else(|| Error::corrupt(&config_path, "config.json is not a JSON object"))?;
    let top_type = root.get("model_type").and_then(Value::as_str).unwrap_or("");
    // Multimodal Gemma 3 nests the language model's config under text_config.
    let text = match root.get("text_config").and_then(Value::as_object) {
        Some(t) if top_type == "gemma3" || !root.contains_key("hidden_size") => t,
        _ => root,
    };
    let model_type = text.get("model_type").and_then(Value::as_str).unwrap_or(top_type);
    let arch = match (Arch::parse(model_type), model_type) {
        (Some(arch), _) => arch,
        (None, "") => return Err(Error::corrupt(&config_path, "config.json has no model_type")),
        (None, other) => {
            return Err(Error::Unsupported(format!("architecture {} (in {})", shown(other), config_path.display())))
        }
    };

    // Tensors.
    let mut files = Vec::new();
    let mut tensors = HashMap::new();
    let mut mlx = MlxParts::default();
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if side_file_exists(&single)? {
        load_safetensors(&single, arch, &mut files, &mut tensors, &mut mlx, None)?;
    } else if side_file_exists(&index)? {
        let idx = read_json(&index)?;
        let weight_map = idx
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::corrupt(&index, "no weight_map object"))?;
        let mut shards: Vec<&str> = Vec::new();
        for (name, file) in weight_map {
            let file = file.as_str().ok_or_else(|| {
                Error::corrupt(&index, format!("weight_map entry {} is not a file name", shown(name)))
            })?;
            let plain = Path::new(file).components().count() == 1
                && !file.contains(['/', '\\'])
                && file != ".."
                && file != "."
                && !file.is_empty();
            if !plain {
                return Err(Error::corrupt(&index, format!("shard name {} is not a plain file name", shown(file))));
            }
            if !shards.contains(&file) {
                shards.push(file);
            }
        }
        if shards.is_empty() {
            return Err(Error::corrupt(&index, "weight_map is empty"));
        }
        shards.sort_unstable();
        for shard in shards {
            let expect: Vec<&str> =
                weight_map.iter().filter(|(_, f)| f.as_str() == Some(shard)).map(|(n, _)| n.as_str()).collect();
            load_safetensors(&dir.join(shard), arch, &mut files, &mut tensors, &mut mlx, Some(&expect))?;
        }
    } else {
        return Err(Error::io(
            single,
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "neither model.safetensors nor model.safetensors.index.json is in the folder",
            ),
        ));
    }
    mlx_affine(root, &config_path, mlx, &mut tensors)?;
    let tensors: HashMap<String, StoredTensor> = tensors.into_iter().map(|(k, (_, t))| (k, t)).collect();

    // Config.
    let c = Cfg { obj: text, path: &config_path };
    let mut config = build_config(&c, arch, &tensors, dir)?;

    if config.tie_word_embeddings {
        // Tied: transformers ignores a stored lm_head (it is the embedding).
    } else if !tensors.contains_key("output.weight") {
        return Err(Error::Mismatch(format!(
            "{}: tie_word_embeddings is false but there is no lm_head.weight",
            dir.display()
        )));
    }
    let mut tensors = tensors;
    if config.tie_word_embeddings {
        tensors.remove("output.weight");
    }
    split_halves(&mut tensors, &config, dir)?;
    stack_experts(&mut tensors, dir)?;
    super::drop_shared_kv_tensors(&config, &mut tensors);
    check_tensors(&config, &tensors, dir)?;

    // Tokenizer files.
    let tok_path = dir.join("tokenizer.json");
    if !side_file_exists(&tok_path)? {
        return Err(Error::io(
            &tok_path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json is missing"),
        ));
    }
    let tok_json = read_tokenizer_json(&tok_path)?;
    let tok_config = read_optional_json(&dir.join("tokenizer_config.json"))?;
    let gen_config = read_optional_json(&dir.join("generation_config.json"))?;
    if let Some(t) = tok_json.added_tokens.iter().find(|t| t.id as usize >= config.vocab_size) {
        return Err(Error::Mismatch(format!(
            "{}: added token {} has id {}, outside the vocabulary of {}",
            tok_path.display(),
            shown(&t.content),
            t.id,
            config.vocab_size
        )));
    }
    let tcfg = tok_config.as_ref().and_then(Value::as_object);

    // Special tokens: a string, an AddedToken object with a string "content", or null.
    let tcfg_path = dir.join("tokenizer_config.json");
    let token_string = |key: &str| -> Result<Option<String>> {
        match tcfg.and_then(|t| t.get(key)) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Object(o)) if o.get("content").is_some_and(Value::is_string) => {
                Ok(o.get("content").and_then(Value::as_str).map(str::to_string))
            }
            Some(v) => Err(Error::corrupt(
                &tcfg_path,
                format!("{key} should be a string or a token object with a content string, is {}", json_shown(v)),
            )),
        }
    };
    let added_id = |s: &str| tok_json.added_tokens.iter().find(|t| t.content == s).map(|t| t.id);
    let added_str = |id: u32| tok_json.added_tokens.iter().find(|t| t.id == id).map(|t| t.content.clone());

    let gen = gen_config.as_ref().and_then(Value::as_object);
    let gen_path = dir.join("generation_config.json");
    let config_bos = root.get("bos_token_id").or_else(|| text.get("bos_token_id"));
    // Both files' ids are checked, config.json's wins.
    let gen_bos = token_id(gen.and_then(|g| g.get("bos_token_id")), "bos_token_id", &gen_path)?;
    let bos_id = token_id(config_bos, "bos_token_id", &config_path)?.or(gen_bos);
    let mut bos_token = token_string("bos_token")?;
    let mut eos_token = token_string("eos_token")?;
    let bos_id = bos_id.or_else(|| bos_token.as_deref().and_then(added_id));
    if bos_token.is_none() {
        bos_token = bos_id.and_then(added_str);
    }
    let mut eos_ids = Vec::new();
    let from_config =
        token_ids(root.get("eos_token_id").or_else(|| text.get("eos_token_id")), "eos_token_id", &config_path)?;
    let from_gen = token_ids(gen.and_then(|g| g.get("eos_token_id")), "eos_token_id", &gen_path)?;
    let named = eos_token.iter().map(String::as_str).chain(END_OF_TURN_TOKENS).filter_map(added_id);
    for id in from_config.into_iter().chain(from_gen).chain(named) {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    if eos_token.is_none() {
        eos_token = eos_ids.first().copied().and_then(added_str);
    }
    let add_bos = match tcfg.and_then(|t| t.get("add_bos_token")) {
        Some(Value::Bool(b)) => *b,
        None | Some(Value::Null) => tok_json.post_processor.as_ref().is_some_and(prepends_special_token),
        Some(v) => {
            return Err(Error::corrupt(&tcfg_path, format!("add_bos_token should be a bool, is {}", json_shown(v))));
        }
    };
    config.bos_token_id = bos_id;
    config.eos_token_ids = eos_ids;
    config.add_bos = add_bos;

    let chat_template = chat_template(dir, tcfg)?;

    // Fixups: Gemma's RMSNorm multiplies by (1 + w); fold the 1 in.
    let mut fixups = HashMap::new();
    if arch == Arch::Gemma3 {
        for name in tensors.keys() {
            if let Some(c) = gemma3::hf_norm_offset(name) {
                fixups.insert(name.clone(), Fixup::AddConstant(c));
            }
        }
    }
    // Qwen3.5's (1 + w) norms, as transformers stores them; mlx-lm's conversion has added the 1
    // already, and moved the conv taps' axis: a conv1d weight [C, 1, K] says which it is.
    let transformers_layout = tensors
        .iter()
        .any(|(n, t)| n.ends_with("ssm_conv1d.weight") && t.shape.len() == 3 && t.shape[1] == 1 && t.shape[2] != 1);
    if arch == Arch::Qwen35Moe && transformers_layout {
        for name in tensors.keys().filter(|n| qwen3_5_moe::is_one_centered_norm(n)) {
            fixups.insert(name.clone(), Fixup::AddConstant(1.0));
        }
    }
    validate_config(&config, dir)?;

    Ok(Checkpoint {
        path: dir.to_path_buf(),
        config,
        tokenizer: TokenizerSource::Json(tok_path),
        chat_template,
        bos_token,
        eos_token,
        tensors,
        files,
        fixups,
    })
}

// ---------------------------------------------------------------------------------------------
// Tokenizer side files
// ---------------------------------------------------------------------------------------------

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
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(default)]
    model: Option<TokenizerModel>,
}

#[derive(serde::Deserialize)]
pub(super) struct TokenizerModel {
    /// BPE / WordPiece / WordLevel: an object of token → id; Unigram: a list of [token, score].
    #[serde(default)]
    vocab: Option<Value>,
}

#[derive(serde::Deserialize)]
pub(super) struct AddedToken {
    id: u32,
    content: String,
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
