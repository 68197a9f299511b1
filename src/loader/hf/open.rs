//! The [`Checkpoint`] of a Hugging Face folder: config.json read into the architecture's
//! hyperparameters, the safetensors' tensors under the engine's names, the tokenizer's side files.

use super::config::{build_config, json_shown, Cfg};
use super::json::{
    chat_template, prepends_special_token, read_json, read_optional_json, read_tokenizer_json, token_id, token_ids,
};
use super::mlx::mlx_affine;
use super::safetensors::{load_safetensors, stack_experts, MlxParts};
use crate::error::{shown, Error, Result};
use crate::loader::{
    check_tensors, side_file_exists, split_halves, validate_config, Checkpoint, Fixup, StoredTensor, TokenizerSource,
    END_OF_TURN_TOKENS,
};
use crate::model::arch::gemma3;
use crate::model::arch::qwen3_5_moe;
use crate::model::config::Arch;
use serde_json::Value;
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
    crate::loader::drop_shared_kv_tensors(&config, &mut tensors);
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
