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

use super::gguf::{validate_config, END_OF_TURN_TOKENS};
use super::{
    capped, check_layer_count, check_tensors, limits, open_regular, read_small_file, side_file_exists, AffineParts,
    Checkpoint, DType, DataFile, Fixup, RowPick, StoredTensor, TokenizerSource,
};
use crate::error::{shown, Error, Result};
use crate::model::arch::gemma4::{Gemma4Config, Gemma4Rope};
use crate::model::arch::qwen3_5_moe::{self, Qwen35MoeConfig};
use crate::model::arch::{self, gemma3, Hyperparams, TensorName};
use crate::model::config::{Activation, Arch, LayerAttention, ModelConfig};
use serde_json::{Map, Value};
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
// Safetensors
// ---------------------------------------------------------------------------------------------

/// The largest safetensors header read (the `safetensors` crate's own limit).
pub const MAX_SAFETENSORS_HEADER: u64 = 100_000_000;

/// One stored tensor of an MLX quantized layer: (safetensors name, file, offset, bytes, dtype,
/// shape).
type Part = (String, usize, u64, usize, safetensors::Dtype, Vec<usize>);

/// The parts of MLX quantized layers, by the canonical name of the layer's weight.
#[derive(Default)]
struct MlxParts {
    packed: HashMap<String, Part>,
    scales: HashMap<String, Part>,
    biases: HashMap<String, Part>,
}

/// Reads and validates one safetensors file's header and adds its tensors (under canonical
/// names) to `out`, which maps canonical name → (original name, tensor). `expect`: the names an
/// index says are in the file. MLX's quantized parts (U32 weights, scales, biases) go to `mlx`.
fn load_safetensors(
    path: &Path,
    arch: Arch,
    files: &mut Vec<DataFile>,
    out: &mut HashMap<String, (String, StoredTensor)>,
    mlx: &mut MlxParts,
    expect: Option<&[&str]>,
) -> Result<()> {
    let (file, file_len) = open_regular(path)?;
    let file_index = files.len();
    let data = DataFile::file(path, file, file_len);
    let entries = read_safetensors_header(&data)?;
    if let Some(expect) = expect {
        for name in expect {
            if !entries.iter().any(|e| e.name == *name) {
                return Err(Error::Mismatch(format!(
                    "{}: the index lists {} in this shard, but it is not there",
                    path.display(),
                    shown(name)
                )));
            }
        }
    }
    for e in entries {
        // MLX's quantization parts: `scales` and `biases` beside a `weight` stored as U32.
        let side = [("scales", &mut mlx.scales), ("biases", &mut mlx.biases)]
            .into_iter()
            .find_map(|(suffix, map)| e.name.strip_suffix(suffix).map(|stem| (format!("{stem}weight"), map)));
        let side = side.filter(|(w, _)| w.ends_with(".weight"));
        let (key, map) = match side {
            Some((w, map)) => (canonical_name(&w, arch), Some(map)),
            None if e.dtype == safetensors::Dtype::U32 => (canonical_name(&e.name, arch), Some(&mut mlx.packed)),
            None => (canonical_name(&e.name, arch), None),
        };
        let Some(canonical) = key else {
            continue;
        };
        if let Some(map) = map {
            let part = (e.name.clone(), file_index, e.start, e.len, e.dtype, e.shape.clone());
            if let Some(prev) = map.insert(canonical.clone(), part) {
                return Err(Error::corrupt(
                    path,
                    format!("tensors {} and {} both map to {canonical}", shown(&prev.0), shown(&e.name)),
                ));
            }
            continue;
        }
        let dtype = match e.dtype {
            safetensors::Dtype::F32 => DType::F32,
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            other => {
                return Err(Error::Unsupported(format!(
                    "tensor {} in {} has dtype {other} (F32, F16 and BF16 are read)",
                    shown(&e.name),
                    path.display()
                )))
            }
        };
        let st = StoredTensor {
            file: file_index,
            offset: e.start,
            len: e.len,
            dtype,
            shape: e.shape,
            affine: None,
            pick: None,
            stack: None,
        };
        if let Some((prev, _)) = out.insert(canonical.clone(), (e.name.clone(), st)) {
            return Err(Error::corrupt(
                path,
                format!("tensors {} and {} both map to {canonical}", shown(&prev), shown(&e.name)),
            ));
        }
    }
    files.push(data);
    Ok(())
}

/// Gathers each MLX quantized layer's `weight`, `scales` and `biases` into one [`DType::Affine`]
/// tensor, by config.json's `quantization` (or `quantization_config`). Errors: parts without a
/// quantization config, a config without `group_size` or `bits` (or another `mode` than affine),
/// a weight without its scales or biases (or the other way round), shapes that do not agree
/// (`weight` `[N, K·bits/32]`, `scales` and `biases` `[N, K/group]`), scales and biases of
/// different types or not f16/bf16, unsupported bits or group sizes.
fn mlx_affine(
    root: &Map<String, Value>,
    config_path: &Path,
    mut parts: MlxParts,
    tensors: &mut HashMap<String, (String, StoredTensor)>,
) -> Result<()> {
    let q = root.get("quantization").or_else(|| root.get("quantization_config"));
    let any = [&parts.packed, &parts.scales, &parts.biases].iter().find_map(|m| m.values().next().map(|p| p.0.clone()));
    let Some(q) = q else {
        return match any {
            None => Ok(()),
            Some(name) => Err(Error::corrupt(
                config_path,
                format!(
                    "tensor {} is quantized (U32, scales, biases) but config.json has no quantization",
                    shown(&name)
                ),
            )),
        };
    };
    let bad = |msg: String| Error::corrupt(config_path, format!("quantization: {msg}"));
    let q = q.as_object().ok_or_else(|| bad("not an object".into()))?;
    if let Some(mode) = q.get("mode") {
        if mode.as_str() != Some("affine") {
            return Err(Error::Unsupported(format!(
                "quantization mode {} in {} (affine is supported)",
                shown(&mode.to_string()),
                config_path.display()
            )));
        }
    }
    let int = |o: &Map<String, Value>, key: &str, module: &str| -> Result<u64> {
        o.get(key).and_then(Value::as_u64).ok_or_else(|| bad(format!("{module}has no integer {key}")))
    };
    let (bits, group) = (int(q, "bits", "")?, int(q, "group_size", "")?);
    let mut names: Vec<String> = parts.packed.keys().cloned().collect();
    names.sort();
    for canonical in names {
        let (name, file, offset, len, st_dtype, shape) = parts.packed.remove(&canonical).expect("listed");
        let module = name.strip_suffix(".weight").unwrap_or(&name);
        let (bits, group) = match q.get(module) {
            None => (bits, group),
            Some(Value::Object(o)) => {
                (int(o, "bits", &format!("{module} "))?, int(o, "group_size", &format!("{module} "))?)
            }
            Some(Value::Bool(false)) => {
                return Err(bad(format!("{module} is not quantized, but its weight is stored as U32")));
            }
            Some(other) => return Err(bad(format!("{module}: {}", shown(&other.to_string())))),
        };
        let part = |map: &mut HashMap<String, Part>, what: &str| {
            map.remove(&canonical).ok_or_else(|| {
                Error::Mismatch(format!("{}: quantized {} has no {what}", config_path.display(), shown(&name)))
            })
        };
        let scales = part(&mut parts.scales, "scales")?;
        let biases = part(&mut parts.biases, "biases")?;
        let mismatch = |msg: String| Error::Mismatch(format!("{}: {}: {msg}", config_path.display(), shown(&name)));
        // 2-D, or stacked experts [E, N, K·bits/32] (mlx-lm's switch_mlp).
        if st_dtype != safetensors::Dtype::U32 || !(2..=3).contains(&shape.len()) {
            return Err(mismatch(format!("a quantized weight is 2-D (or 3-D, stacked) U32, not {st_dtype} {shape:?}")));
        }
        let (&packed, lead) = shape.split_last().expect("2-D or 3-D");
        if scales.4 != biases.4 {
            return Err(mismatch(format!("scales are {} but biases {}", scales.4, biases.4)));
        }
        let scale_type = match scales.4 {
            safetensors::Dtype::F16 => DType::F16,
            safetensors::Dtype::BF16 => DType::BF16,
            safetensors::Dtype::F32 => DType::F32,
            other => return Err(mismatch(format!("scales of type {other}"))),
        };
        let dtype =
            DType::affine(bits, group, scale_type).map_err(|m| Error::Unsupported(format!("{}: {m}", shown(&name))))?;
        let n: usize = lead.iter().product();
        let k = packed * 32 / bits as usize;
        let groups = k / group as usize;
        let want: Vec<usize> = lead.iter().copied().chain([groups]).collect();
        if k % group as usize != 0 || scales.5 != want || biases.5 != want {
            return Err(mismatch(format!(
                "weight {shape:?} ({bits}-bit: K = {k}) needs scales and biases {want:?} (group {group}), \
                 got {:?} and {:?}",
                scales.5, biases.5
            )));
        }
        let st = StoredTensor {
            file,
            offset,
            len: dtype.byte_size(n * k).expect("whole groups"),
            dtype,
            shape: lead.iter().copied().chain([k]).collect(),
            affine: Some(Box::new(AffineParts {
                weight: (file, offset, len),
                scales: (scales.1, scales.2, scales.3),
                biases: (biases.1, biases.2, biases.3),
            })),
            pick: None,
            stack: None,
        };
        if let Some((prev, _)) = tensors.insert(canonical.clone(), (name.clone(), st)) {
            return Err(mismatch(format!("{} maps to {canonical} too", shown(&prev))));
        }
    }
    if let Some((_, p)) = parts.scales.iter().chain(parts.biases.iter()).next() {
        return Err(Error::Mismatch(format!(
            "{}: {} belongs to no quantized weight",
            config_path.display(),
            shown(&p.0)
        )));
    }
    Ok(())
}

struct SafetensorsEntry {
    name: String,
    dtype: safetensors::Dtype,
    shape: Vec<usize>,
    /// Absolute byte offset in the file.
    start: u64,
    len: usize,
}

/// Reads a safetensors header (`u64` JSON length, then the JSON) and validates it with the
/// `safetensors` crate: tensors contiguous from the start of the data, each range the size its
/// dtype and shape imply, no overflow. The data must end exactly where the file ends.
fn read_safetensors_header(f: &DataFile) -> Result<Vec<SafetensorsEntry>> {
    let path = f.path.as_path();
    let corrupt = |msg: String| Error::corrupt(path, msg);
    if f.len < 8 {
        return Err(corrupt(format!("truncated: {} bytes, no safetensors header", f.len)));
    }
    let n = u64::from_le_bytes(f.read(0, 8)?.try_into().expect("8 bytes"));
    if n > MAX_SAFETENSORS_HEADER {
        return Err(corrupt(format!("header length {n} is above the limit of {MAX_SAFETENSORS_HEADER}")));
    }
    if n > f.len - 8 {
        return Err(corrupt(format!("header length {n} runs past the end of the file ({} bytes)", f.len)));
    }
    let header = f.read(8, n as usize)?;
    // JSON first, then what the safetensors crate makes of it (its own validation: offsets
    // contiguous from 0, each range the size its dtype and shape imply).
    let json: Value = serde_json::from_slice(&header).map_err(|e| {
        corrupt(format!("bad safetensors header JSON: {}", crate::error::one_line(&e.to_string(), 300)))
    })?;
    let meta: safetensors::tensor::Metadata = serde_json::from_value(json.clone()).map_err(|e| {
        let text = e.to_string();
        // Name the tensor where the crate's message does not.
        let which = match text.contains('`') {
            true => None,
            false => json.as_object().and_then(wrong_size_tensor),
        };
        let which = which.map(|t| format!(" ({t})")).unwrap_or_default();
        corrupt(format!("invalid safetensors header: {}{which}", crate::error::one_line(&text, 300)))
    })?;
    drop(json);
    let data_start = 8 + n;
    let data_len = meta.data_len() as u64;
    let have = f.len - data_start;
    if data_len > have {
        let tensors = meta.tensors();
        let mut past: Vec<_> = tensors.iter().filter(|(_, t)| t.data_offsets.1 as u64 > have).collect();
        past.sort_by_key(|(_, t)| t.data_offsets);
        let (name, t) = past[0];
        return Err(corrupt(format!(
            "tensor {}: data_offsets [{}, {}] run past the end of the data ({have} bytes after the {n}-byte header): truncated?",
            shown(name),
            t.data_offsets.0,
            t.data_offsets.1
        )));
    }
    if data_len < have {
        return Err(corrupt(format!(
            "{} bytes follow the data of the last tensor (the header accounts for {data_len} of the {have} data bytes)",
            have - data_len
        )));
    }
    let mut out = Vec::new();
    for (name, info) in meta.tensors() {
        let (begin, end) = info.data_offsets;
        if info.shape.len() > 8 {
            return Err(corrupt(format!("tensor {} has {} dimensions", shown(&name), info.shape.len())));
        }
        out.push(SafetensorsEntry {
            name,
            dtype: info.dtype,
            shape: info.shape.clone(),
            start: data_start + begin as u64,
            len: end - begin,
        });
    }
    out.sort_by_key(|e| e.start);
    Ok(out)
}

/// The first entry of a safetensors header whose byte range is not the size its dtype and shape
/// imply, described for a message (the safetensors crate's error does not name it).
fn wrong_size_tensor(header: &Map<String, Value>) -> Option<String> {
    header.iter().filter(|(k, _)| *k != "__metadata__").find_map(|(name, v)| {
        let dtype: safetensors::Dtype = serde_json::from_value(v.get("dtype")?.clone()).ok()?;
        let shape: Vec<usize> = serde_json::from_value(v.get("shape")?.clone()).ok()?;
        let [begin, end]: [usize; 2] = serde_json::from_value(v.get("data_offsets")?.clone()).ok()?;
        let bits = shape.iter().try_fold(dtype.bitsize(), |a, &d| a.checked_mul(d));
        let have = end.checked_sub(begin);
        (bits.map(|b| b / 8) != have).then(|| {
            format!(
                "tensor {}: {dtype} {} needs {} bytes, data_offsets [{begin}, {end}] hold {}",
                shown(name),
                super::fmt_shape(&shape),
                bits.map_or("more than 2^64".to_string(), |b| (b / 8).to_string()),
                have.map_or("a negative count".to_string(), |h| h.to_string())
            )
        })
    })
}

/// Maps a Hugging Face tensor name to the canonical (GGUF) one; `None` for tensors the engine
/// does not use.
pub fn canonical_name(hf: &str, arch: Arch) -> Option<String> {
    let name = if let Some(r) = hf.strip_prefix("model.language_model.") {
        format!("model.{r}")
    } else if let Some(r) = hf.strip_prefix("language_model.model.") {
        format!("model.{r}")
    } else if let Some(r) = hf.strip_prefix("language_model.") {
        r.to_string()
    } else {
        hf.to_string()
    };
    match name.as_str() {
        "model.embed_tokens.weight" => return Some("token_embd.weight".into()),
        "model.embed_tokens_per_layer.weight" => return Some("per_layer_token_embd.weight".into()),
        "model.per_layer_model_projection.weight" => return Some("per_layer_model_proj.weight".into()),
        "model.per_layer_projection_norm.weight" => return Some("per_layer_proj_norm.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    // Only canonical decimal (transformers' state-dict keys): "00" or "+1" name no layer.
    if layer.is_empty()
        || layer.len() > 9
        || !layer.bytes().all(|b| b.is_ascii_digit())
        || (layer.len() > 1 && layer.starts_with('0'))
    {
        return None;
    }
    let layer: usize = layer.parse().ok()?;
    // A tensor split in two by rows is named `a|b` until split_halves, an expert's `name#e` until
    // stack_experts.
    match arch::tensor_name(arch, rest)? {
        TensorName::One(n) => Some(format!("blk.{layer}.{n}")),
        TensorName::Halves(a, b) => Some(format!("blk.{layer}.{a}|{b}")),
        TensorName::Expert(n, e) => Some(format!("blk.{layer}.{n}#{e}")),
    }
}

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

/// config.json accessors with errors naming the key.
struct Cfg<'a> {
    obj: &'a Map<String, Value>,
    path: &'a Path,
}

impl Cfg<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }
    fn wrong(&self, key: &str, want: &str) -> Error {
        let v = self.obj.get(key).unwrap_or(&Value::Null);
        Error::corrupt(self.path, format!("{} should be {want}, is {}", shown(key), json_shown(v)))
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a non-negative integer")),
        }
    }
    fn req_usize(&self, key: &str) -> Result<usize> {
        self.opt_usize(key)?.ok_or_else(|| Error::corrupt(self.path, format!("required key {} is missing", shown(key))))
    }
    /// A count at most `limit`, if present.
    fn opt_capped(&self, key: &str, limit: usize) -> Result<Option<usize>> {
        self.opt_usize(key)?.map(|v| capped(self.path, key, v, limit)).transpose()
    }
    /// A required count at most `limit`.
    fn req_capped(&self, key: &str, limit: usize) -> Result<usize> {
        capped(self.path, key, self.req_usize(key)?, limit)
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| self.wrong(key, "a finite number (in f32 range)")),
        }
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "a bool")),
        }
    }
    /// Which layers are `full_attention` by `layer_types` (one per layer, each that or `other`),
    /// or when it is absent every `every`-th layer; `arch` names the model in errors.
    fn full_attention_layers(&self, num_layers: usize, other: &str, arch: &str, every: usize) -> Result<Vec<bool>> {
        let Some(types) = self.get("layer_types") else {
            return Ok((0..num_layers).map(|i| (i + 1) % every == 0).collect());
        };
        let types = types.as_array().ok_or_else(|| self.wrong("layer_types", "a list"))?;
        if types.len() != num_layers {
            return Err(Error::Mismatch(format!(
                "{}: layer_types has {} entries for {num_layers} layers",
                self.path.display(),
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(true),
                Some(o) if o == other => Ok(false),
                _ => Err(Error::Unsupported(format!("layer type {} in a {arch} model", json_shown(t)))),
            })
            .collect()
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "a string")),
        }
    }
}

/// A JSON value inside an error message: its JSON text, cut short.
fn json_shown(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 60 {
        crate::error::one_line(&text, 200)
    } else {
        format!(
            "{}… ({} bytes of JSON)",
            crate::error::one_line(&text.chars().take(40).collect::<String>(), 200),
            text.len()
        )
    }
}

/// The linear RoPE scaling factor of a `rope_scaling` / `rope_parameters` object (1 = none).
/// `what` names the key in messages. As in transformers, a linear scaling needs a positive
/// `factor`; a kind, factor or theta of the wrong JSON type is an error, not a default.
fn rope_factor(o: Option<&Value>, what: &str, path: &Path) -> Result<f32> {
    let o = match o {
        None | Some(Value::Null) => return Ok(1.0),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(Error::corrupt(path, format!("{what} should be an object, is {}", json_shown(other))));
        }
    };
    let ty = match o.get("rope_type").or_else(|| o.get("type")) {
        None | Some(Value::Null) => "default",
        Some(Value::String(s)) => s.as_str(),
        Some(other) => {
            return Err(Error::corrupt(path, format!("{what}.rope_type should be a string, is {}", json_shown(other))));
        }
    };
    let factor = match o.get("factor") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(f) if f > 0.0 && (f as f32).is_finite() => Some(f as f32),
            _ => {
                return Err(Error::corrupt(
                    path,
                    format!("{what}.factor should be a positive number, is {}", json_shown(v)),
                ))
            }
        },
    };
    if let Some(t) = o.get("rope_theta") {
        if !t.as_f64().is_some_and(|t| t > 0.0 && (t as f32).is_finite()) {
            return Err(Error::corrupt(
                path,
                format!("{what}.rope_theta should be a positive number, is {}", json_shown(t)),
            ));
        }
    }
    match (ty, factor) {
        ("default", _) => Ok(1.0),
        ("linear", Some(f)) => Ok(f),
        ("linear", None) => Err(Error::corrupt(path, format!("{what}: linear RoPE scaling without a factor"))),
        (other, _) => Err(Error::Unsupported(format!("RoPE scaling type {}", shown(other)))),
    }
}

fn build_config(c: &Cfg, arch: Arch, tensors: &HashMap<String, StoredTensor>, dir: &Path) -> Result<ModelConfig> {
    if arch == Arch::Qwen35Moe {
        return build_qwen35_moe(c, tensors);
    }
    if arch == Arch::Gemma4 {
        return build_gemma4(c, tensors);
    }
    let defaults = arch::defaults(arch);
    // Gemma's keys: sliding_window_pattern, rope_local_base_freq, query_pre_attn_scalar.
    let gemma = defaults.sliding_window_pattern.is_some();
    // The layer count first, against its limit and the tensors present, before anything is
    // sized by it.
    let num_layers = c.req_capped("num_hidden_layers", limits::LAYERS)?;
    check_layer_count(tensors.keys().map(String::as_str), num_layers, "num_hidden_layers", dir)?;
    let hidden = c.req_capped("hidden_size", limits::HIDDEN)?;
    let intermediate = c.req_capped("intermediate_size", limits::INTERMEDIATE)?;
    let num_heads = c.req_capped("num_attention_heads", limits::HEADS)?;
    let num_kv_heads = c.opt_capped("num_key_value_heads", limits::HEADS)?.unwrap_or(num_heads);
    let vocab_size = match c.opt_capped("vocab_size", limits::VOCAB)? {
        Some(v) => v,
        None => tensors
            .get("token_embd.weight")
            .and_then(|t| t.shape.first().copied())
            .ok_or_else(|| Error::corrupt(c.path, "required key vocab_size is missing"))?,
    };
    if num_heads == 0 {
        return Err(Error::Mismatch(format!("{}: num_attention_heads is 0", c.path.display())));
    }
    let head_dim = match c.opt_capped("head_dim", limits::HEAD_DIM)? {
        Some(d) => d,
        None if defaults.head_dim.is_some() => defaults.head_dim.unwrap_or_default(),
        None => {
            if hidden % num_heads != 0 {
                return Err(Error::Mismatch(format!(
                    "{}: hidden_size {hidden} is not a multiple of num_attention_heads {num_heads} (and head_dim is absent)",
                    c.path.display()
                )));
            }
            hidden / num_heads
        }
    };
    let rms_norm_eps = c.opt_f32("rms_norm_eps")?.unwrap_or(defaults.rms_norm_eps);
    let max_pos = c.opt_capped("max_position_embeddings", limits::CONTEXT)?.unwrap_or(defaults.max_position_embeddings);

    // RoPE: rope_theta / rope_scaling (transformers 4.x) or rope_parameters (5.x, per layer kind
    // for Gemma 3).
    let default_theta = defaults.rope_theta;
    let (full_raw, local_raw) = match c.get("rope_parameters") {
        None => (None, None),
        Some(Value::Object(p)) if p.contains_key("full_attention") => {
            (p.get("full_attention"), p.get("sliding_attention"))
        }
        Some(p @ Value::Object(_)) => (Some(p), None),
        Some(_) => return Err(c.wrong("rope_parameters", "an object")),
    };
    // Each kind's parameters: an object whose kind, factor and theta are checked.
    let full_factor = rope_factor(full_raw, "rope_parameters", c.path)?;
    rope_factor(local_raw, "rope_parameters.sliding_attention", c.path)?;
    let (full_params, local_params) = (full_raw.and_then(Value::as_object), local_raw.and_then(Value::as_object));
    let theta_of = |p: Option<&Map<String, Value>>| p.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
    let rope_theta = match c.opt_f32("rope_theta")? {
        Some(t) => t,
        None => theta_of(full_params).map_or(default_theta, |t| t as f32),
    };
    let rope_scaling_factor = match c.get("rope_scaling") {
        Some(v) => rope_factor(Some(v), "rope_scaling", c.path)?,
        None => full_factor,
    };
    let rope_local_theta = if gemma {
        match c.opt_f32("rope_local_base_freq")? {
            Some(t) => Some(t),
            None => theta_of(local_params).map(|t| t as f32),
        }
    } else {
        None
    };

    // Layer kinds.
    let sliding_window = c.opt_usize("sliding_window")?;
    let window = |kind: &str| -> Result<u32> {
        let w = sliding_window.ok_or_else(|| {
            Error::corrupt(c.path, format!("layer kind {kind} needs sliding_window, which is missing"))
        })?;
        u32::try_from(w).map_err(|_| Error::corrupt(c.path, format!("sliding_window {w} is too large")))
    };
    let layer_attention: Vec<LayerAttention> = if let Some(types) = c.get("layer_types") {
        let types = types.as_array().ok_or_else(|| c.wrong("layer_types", "a list"))?;
        if types.len() != num_layers {
            return Err(Error::Mismatch(format!(
                "{}: layer_types has {} entries for {num_layers} layers",
                c.path.display(),
                types.len()
            )));
        }
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(LayerAttention::Full),
                Some(k @ "sliding_attention") => Ok(LayerAttention::Sliding { window: window(k)? }),
                _ => Err(Error::Unsupported(format!("layer type {}", json_shown(t)))),
            })
            .collect::<Result<_>>()?
    } else if let Some(pattern) = defaults.sliding_window_pattern {
        let pattern = c.opt_usize("sliding_window_pattern")?.unwrap_or(pattern).max(1);
        let w = window("sliding_attention")?;
        (0..num_layers)
            .map(|i| if (i + 1) % pattern == 0 { LayerAttention::Full } else { LayerAttention::Sliding { window: w } })
            .collect()
    } else if defaults.use_sliding_window && c.opt_bool("use_sliding_window")? == Some(true) {
        let from = c.opt_usize("max_window_layers")?.unwrap_or(num_layers);
        let w = window("sliding_attention")?;
        (0..num_layers)
            .map(|i| if i >= from { LayerAttention::Sliding { window: w } } else { LayerAttention::Full })
            .collect()
    } else {
        vec![LayerAttention::Full; num_layers]
    };

    let act = c.opt_str(defaults.activation_key)?.or(c.opt_str("hidden_act")?);
    let activation = match act.unwrap_or(defaults.activation) {
        "silu" | "swish" => Activation::SiluGated,
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Activation::GeluTanhGated,
        other => return Err(Error::Unsupported(format!("activation {}", shown(other)))),
    };
    if c.opt_bool("mlp_bias")? == Some(true) {
        return Err(Error::Unsupported("MLP bias (mlp_bias = true)".into()));
    }

    let tie_word_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(defaults.tie_word_embeddings);
    let query_pre_attn_scalar = if gemma {
        let s = c.opt_f32("query_pre_attn_scalar")?.unwrap_or(head_dim as f32);
        if s.is_nan() || s <= 0.0 {
            return Err(Error::Mismatch(format!("{}: query_pre_attn_scalar {s}", dir.display())));
        }
        Some(s)
    } else {
        None
    };

    Ok(arch::model_config(&Hyperparams {
        arch,
        vocab_size,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_attention_heads: num_heads,
        num_key_value_heads: num_kv_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        rope_local_theta,
        rope_scaling_factor,
        max_position_embeddings: max_pos,
        layer_types: layer_attention,
        tie_word_embeddings,
        attention_bias: tensors.contains_key("blk.0.attn_q.bias"),
        activation,
        query_pre_attn_scalar,
        final_logit_softcapping: c.opt_f32("final_logit_softcapping")?.filter(|&x| x > 0.0),
    }))
}

/// `Qwen3_5MoeTextConfig` (the `text_config` of the multimodal model) into its layer specs.
fn build_qwen35_moe(c: &Cfg, tensors: &HashMap<String, StoredTensor>) -> Result<ModelConfig> {
    let num_layers = c.req_capped("num_hidden_layers", limits::LAYERS)?;
    check_layer_count(tensors.keys().map(String::as_str), num_layers, "num_hidden_layers", c.path)?;
    let hidden = c.req_capped("hidden_size", limits::HIDDEN)?;
    let heads = c.req_capped("num_attention_heads", limits::HEADS)?;
    let rope = match c.get("rope_parameters") {
        None => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(c.wrong("rope_parameters", "an object")),
    };
    let rope_cfg = rope.map(|p| Cfg { obj: p, path: c.path });
    rope_factor(c.get("rope_parameters"), "rope_parameters", c.path)?;
    let from_rope = |key: &str| -> Result<Option<f32>> {
        match &rope_cfg {
            Some(r) => r.opt_f32(key),
            None => Ok(None),
        }
    };
    let rope_theta = match c.opt_f32("rope_theta")? {
        Some(t) => t,
        None => from_rope("rope_theta")?.unwrap_or(10_000_000.0),
    };
    let partial = match c.opt_f32("partial_rotary_factor")? {
        Some(f) => f,
        None => from_rope("partial_rotary_factor")?.unwrap_or(0.25),
    };
    // full_attention_interval is read only where layer_types does not say.
    let interval = match c.get("layer_types") {
        Some(_) => 1,
        None => c.opt_usize("full_attention_interval")?.unwrap_or(4).max(1),
    };
    let full_attention = c.full_attention_layers(num_layers, "linear_attention", "qwen3_5_moe", interval)?;
    let q = Qwen35MoeConfig {
        vocab_size: c.req_capped("vocab_size", limits::VOCAB)?,
        hidden_size: hidden,
        rms_norm_eps: c.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
        max_position_embeddings: c.opt_capped("max_position_embeddings", limits::CONTEXT)?.unwrap_or(32768),
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        num_attention_heads: heads,
        num_key_value_heads: c.opt_capped("num_key_value_heads", limits::HEADS)?.unwrap_or(heads),
        head_dim: c.opt_capped("head_dim", limits::HEAD_DIM)?.unwrap_or(256),
        rope_theta,
        partial_rotary_factor: partial,
        full_attention,
        linear_num_key_heads: c.opt_capped("linear_num_key_heads", limits::HEADS)?.unwrap_or(16),
        linear_num_value_heads: c.opt_capped("linear_num_value_heads", limits::HEADS)?.unwrap_or(32),
        linear_key_head_dim: c.opt_capped("linear_key_head_dim", limits::HEAD_DIM)?.unwrap_or(128),
        linear_value_head_dim: c.opt_capped("linear_value_head_dim", limits::HEAD_DIM)?.unwrap_or(128),
        linear_conv_kernel_dim: c.opt_capped("linear_conv_kernel_dim", 64)?.unwrap_or(4),
        num_experts: c.req_capped("num_experts", limits::EXPERTS)?,
        num_experts_per_tok: c.req_capped("num_experts_per_tok", limits::EXPERTS)?,
        moe_intermediate_size: c.req_capped("moe_intermediate_size", limits::INTERMEDIATE)?,
        shared_expert_intermediate_size: c
            .opt_capped("shared_expert_intermediate_size", limits::INTERMEDIATE)?
            .unwrap_or(0),
        attention_bias: c.opt_bool("attention_bias")? == Some(true),
        value_heads_tiled: false,
    };
    let bad = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", c.path.display())));
    if q.num_experts_per_tok == 0 || q.num_experts_per_tok > q.num_experts {
        return bad(format!("num_experts_per_tok {} is not in 1..={}", q.num_experts_per_tok, q.num_experts));
    }
    let rot = q.rotary_dim();
    if !(partial > 0.0 && partial <= 1.0) || rot < 2 || rot % 2 != 0 {
        return bad(format!(
            "partial_rotary_factor {partial} gives {rot} rotary dims of {} (need an even count >= 2)",
            q.head_dim
        ));
    }
    if q.linear_num_key_heads == 0 || q.linear_num_value_heads % q.linear_num_key_heads.max(1) != 0 {
        return bad(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            q.linear_num_value_heads, q.linear_num_key_heads
        ));
    }
    if q.linear_conv_kernel_dim < 2 {
        return bad(format!("linear_conv_kernel_dim {} (at least 2)", q.linear_conv_kernel_dim));
    }
    let act = c.opt_str("hidden_act")?.unwrap_or("silu");
    if !matches!(act, "silu" | "swish") {
        return Err(Error::Unsupported(format!("activation {} in a qwen3_5_moe model", shown(act))));
    }
    Ok(q.model_config())
}

/// `Gemma4TextConfig` (the `text_config` of the multimodal model) into its layer specs.
fn build_gemma4(c: &Cfg, tensors: &HashMap<String, StoredTensor>) -> Result<ModelConfig> {
    let num_layers = c.req_capped("num_hidden_layers", limits::LAYERS)?;
    check_layer_count(tensors.keys().map(String::as_str), num_layers, "num_hidden_layers", c.path)?;
    let bad = |msg: String| Error::Mismatch(format!("{}: {msg}", c.path.display()));
    // What this engine does not run yet: refused by name rather than run wrong.
    if c.opt_bool("enable_moe_block")? == Some(true) {
        return Err(Error::Unsupported("gemma4 mixture-of-experts blocks (enable_moe_block)".into()));
    }
    // "vision": image tokens attend both ways, text stays causal (the published 31B and 26B-A4B
    // configs); "all" makes every token bidirectional.
    match c.opt_str("use_bidirectional_attention")? {
        None | Some("vision") => {}
        Some(other) => {
            return Err(Error::Unsupported(format!(
                "gemma4 bidirectional attention (use_bidirectional_attention {other:?})"
            )))
        }
    }
    if c.opt_bool("attention_bias")? == Some(true) {
        return Err(Error::Unsupported("gemma4 attention biases (attention_bias)".into()));
    }
    let act = c.opt_str("hidden_activation")?.unwrap_or("gelu_pytorch_tanh");
    if act != "gelu_pytorch_tanh" {
        return Err(Error::Unsupported(format!("activation {} in a gemma4 model", shown(act))));
    }
    // Gemma4TextConfig's default: every 6th layer full.
    let mut full_attention = c.full_attention_layers(num_layers, "sliding_attention", "gemma4", 6)?;
    // Gemma4TextConfig forces the last layer to full attention (with a warning); so does this.
    if let Some(last) = full_attention.last_mut() {
        *last = true;
    }
    // rope_parameters: {"sliding_attention": {...}, "full_attention": {...}}.
    let rope = |kind: &str, theta: f32, proportional: bool, partial: f32| -> Result<Gemma4Rope> {
        let key = format!("rope_parameters.{kind}");
        let p = match c.get("rope_parameters").and_then(|r| r.get(kind)) {
            None | Some(Value::Null) => return Ok(Gemma4Rope { theta, proportional, partial_rotary_factor: partial }),
            Some(Value::Object(p)) => Cfg { obj: p, path: c.path },
            Some(_) => return Err(c.wrong("rope_parameters", "an object of objects per layer type")),
        };
        let proportional = match (p.opt_str("rope_type")?.unwrap_or("default"), kind) {
            ("default", _) => false,
            ("proportional", "full_attention") => true,
            (other, _) => return Err(Error::Unsupported(format!("{key}.rope_type {}", shown(other)))),
        };
        if p.opt_f32("factor")?.is_some_and(|f| f != 1.0) {
            return Err(Error::Unsupported(format!("{key}: RoPE scaling factor other than 1")));
        }
        let theta = p.opt_f32("rope_theta")?.unwrap_or(theta);
        let partial = p.opt_f32("partial_rotary_factor")?.unwrap_or(1.0);
        if !proportional && partial != 1.0 {
            return Err(Error::Unsupported(format!("{key}: partial rotary with rope_type default")));
        }
        if theta <= 0.0 || partial <= 0.0 || partial > 1.0 {
            return Err(bad(format!("{key}: rope_theta {theta}, partial_rotary_factor {partial}")));
        }
        Ok(Gemma4Rope { theta, proportional, partial_rotary_factor: partial })
    };
    if let Some(r) = c.get("rope_parameters") {
        if !r.is_object() {
            return Err(c.wrong("rope_parameters", "an object of objects per layer type"));
        }
    }
    let heads = c.req_capped("num_attention_heads", limits::HEADS)?;
    let head_dim = c.opt_capped("head_dim", limits::HEAD_DIM)?.unwrap_or(256);
    let mut g = Gemma4Config {
        vocab_size: c.req_capped("vocab_size", limits::VOCAB)?,
        hidden_size: c.req_capped("hidden_size", limits::HIDDEN)?,
        intermediate_size: c.req_capped("intermediate_size", limits::INTERMEDIATE)?,
        num_attention_heads: heads,
        num_key_value_heads: c.opt_capped("num_key_value_heads", limits::HEADS)?.unwrap_or(heads),
        num_global_key_value_heads: c.opt_capped("num_global_key_value_heads", limits::HEADS)?,
        head_dim,
        global_head_dim: c.opt_capped("global_head_dim", limits::HEAD_DIM)?.unwrap_or(512),
        attention_k_eq_v: c.opt_bool("attention_k_eq_v")?.unwrap_or(false),
        attention_bias: c.opt_bool("attention_bias")?.unwrap_or(false),
        full_attention,
        sliding_window: c.opt_capped("sliding_window", limits::CONTEXT)?.unwrap_or(512) as u32,
        rope_sliding: rope("sliding_attention", 10_000.0, false, 1.0)?,
        rope_full: rope("full_attention", 1_000_000.0, true, 0.25)?,
        final_logit_softcapping: c.opt_f32("final_logit_softcapping")?,
        rms_norm_eps: c.opt_f32("rms_norm_eps")?.unwrap_or(1e-6),
        max_position_embeddings: c.opt_capped("max_position_embeddings", limits::CONTEXT)?.unwrap_or(131_072),
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(true),
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        hidden_size_per_layer_input: c.opt_capped("hidden_size_per_layer_input", limits::HIDDEN)?.unwrap_or(0),
        vocab_size_per_layer_input: c.opt_capped("vocab_size_per_layer_input", limits::VOCAB)?.unwrap_or(262_144),
        num_kv_shared_layers: c.opt_capped("num_kv_shared_layers", limits::LAYERS)?.unwrap_or(0),
        use_double_wide_mlp: c.opt_bool("use_double_wide_mlp")?.unwrap_or(false),
    };
    // transformers writes the full layers' head dim and KV heads as a per-layer table
    // (`per_layer_config`, keyed by layer index), Google's and mlx-lm's configs as the top-level
    // keys read above: the table, where present, says it for each layer.
    if let Some(table) = c.get("per_layer_config") {
        let table = table.as_object().ok_or_else(|| c.wrong("per_layer_config", "an object"))?;
        let mut entries = Vec::new();
        for (layer, o) in table {
            let l = layer.parse::<usize>().ok().filter(|&l| l < num_layers);
            let l = l.ok_or_else(|| c.wrong("per_layer_config", "keyed by layer index"))?;
            let o = o.as_object().ok_or_else(|| c.wrong("per_layer_config", "an object of objects"))?;
            let o = Cfg { obj: o, path: c.path };
            if let Some(other) = o.obj.keys().find(|k| !matches!(k.as_str(), "head_dim" | "num_key_value_heads")) {
                return Err(Error::Unsupported(format!("gemma4 per_layer_config: layer {l} sets {}", shown(other))));
            }
            entries.push((
                l,
                o.opt_capped("head_dim", limits::HEAD_DIM)?,
                o.opt_capped("num_key_value_heads", limits::HEADS)?,
            ));
        }
        entries.sort_unstable();
        let mut full_seen = false;
        for (l, head_dim, kv) in entries {
            let full = g.full_attention[l];
            if full && !full_seen {
                // The first full layer's entry sets the full layers' shape; the others must agree.
                full_seen = true;
                g.global_head_dim = head_dim.unwrap_or(g.global_head_dim);
                if g.attention_k_eq_v {
                    g.num_global_key_value_heads = kv.or(g.num_global_key_value_heads);
                }
            }
            let (want_dim, want_kv) = match full {
                true if g.attention_k_eq_v => {
                    (g.global_head_dim, g.num_global_key_value_heads.unwrap_or(g.num_key_value_heads))
                }
                true => (g.global_head_dim, g.num_key_value_heads),
                false => (g.head_dim, g.num_key_value_heads),
            };
            let (d, k) = (head_dim.unwrap_or(want_dim), kv.unwrap_or(want_kv));
            if (d, k) != (want_dim, want_kv) {
                return Err(Error::Unsupported(format!(
                    "gemma4 per_layer_config: layer {l} with head_dim {d} and {k} KV heads (its kind has {want_dim} and \
                     {want_kv})"
                )));
            }
        }
    }
    g.validate().map_err(bad)?;
    Ok(g.model_config())
}

/// Stacks each expert tensor `name#e` (e = 0..E, all present, one shape and type) into `name`
/// of shape [E, ..].
fn stack_experts(tensors: &mut HashMap<String, StoredTensor>, path: &Path) -> Result<()> {
    let mut stacks: HashMap<String, Vec<(usize, StoredTensor)>> = HashMap::new();
    let keys: Vec<String> = tensors.keys().filter(|k| k.contains('#')).cloned().collect();
    for key in keys {
        let (name, e) = key.split_once('#').expect("an expert key");
        let e: usize = e.parse().expect("written by canonical_name");
        let t = tensors.remove(&key).expect("listed");
        stacks.entry(name.to_string()).or_default().push((e, t));
    }
    for (name, mut parts) in stacks {
        parts.sort_by_key(|(e, _)| *e);
        let bad = |msg: String| Err(Error::Mismatch(format!("{}: experts of {name}: {msg}", path.display())));
        if let Some((i, (e, _))) = parts.iter().enumerate().find(|(i, (e, _))| i != e) {
            return bad(format!("expert {i} is missing (the next present is {e})"));
        }
        let first = parts[0].1.clone();
        if let Some((e, t)) = parts.iter().find(|(_, t)| t.shape != first.shape || t.dtype != first.dtype) {
            return bad(format!("expert {e} is {} {:?}, expert 0 {} {:?}", t.dtype, t.shape, first.dtype, first.shape));
        }
        let n = parts.len();
        let st = StoredTensor {
            len: first.len * n,
            shape: [n].into_iter().chain(first.shape.iter().copied()).collect(),
            pick: None,
            stack: Some(parts.into_iter().map(|(_, t)| t).collect()),
            ..first
        };
        if tensors.insert(name.clone(), st).is_some() {
            return bad("both stacked and per-expert tensors are present".into());
        }
    }
    Ok(())
}

/// Splits each tensor named `a|b` (a [`TensorName::Halves`]) into `a` and `b`: row groups of
/// `2n`, n = the experts' intermediate rows for a stacked [E, 2I, K] tensor, else the attention
/// head dim (q_proj's [q_h | gate_h]).
pub(crate) fn split_halves(
    tensors: &mut HashMap<String, StoredTensor>,
    config: &ModelConfig,
    path: &Path,
) -> Result<()> {
    let joined: Vec<String> = tensors.keys().filter(|k| k.contains('|')).cloned().collect();
    // The attention layers' head dim (one for the model).
    let head_dim = (0..config.num_layers()).find_map(|l| config.attention(l)).map_or(0, |a| a.head_dim);
    for name in joined {
        let t = tensors.remove(&name).expect("listed");
        // `blk.{i}.` then `a|b`.
        let layer_end = name.strip_prefix("blk.").and_then(|r| r.find('.')).map_or(0, |i| "blk.".len() + i + 1);
        let (prefix, pair) = name.split_at(layer_end);
        let (a, b) = pair.split_once('|').expect("joined name");
        let rows: usize = t.shape[..t.shape.len() - 1].iter().product();
        let (n, lead) = match t.shape.as_slice() {
            [e, two_i, k] => (two_i / 2, vec![*e, two_i / 2, *k]),
            [r, k] => (head_dim, vec![r / 2, *k]),
            _ => return Err(Error::Mismatch(format!("{}: tensor {name} has shape {:?}", path.display(), t.shape))),
        };
        if n == 0 || rows % (2 * n) != 0 {
            return Err(Error::Mismatch(format!(
                "{}: tensor {} has {rows} rows, not groups of 2 x {n}",
                path.display(),
                shown(&name)
            )));
        }
        let len = t.len / 2;
        for (half, start) in [(a, 0), (b, n)] {
            let pick = RowPick { src_rows: rows, src_len: t.len, period: 2 * n, start, take: n };
            let st = StoredTensor { len, shape: lead.clone(), pick: Some(pick), ..t.clone() };
            tensors.insert(format!("{prefix}{half}"), st);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Tokenizer side files
// ---------------------------------------------------------------------------------------------

/// The largest JSON side file read (config.json, tokenizer_config.json, ...).
const MAX_JSON_BYTES: u64 = 64 << 20;
/// The largest tokenizer.json read (real ones: up to ~35 MB).
const MAX_TOKENIZER_JSON_BYTES: u64 = 512 << 20;

fn json_error(path: &Path, e: serde_json::Error) -> Error {
    Error::corrupt(path, format!("bad JSON: {}", crate::error::one_line(&e.to_string(), 300)))
}

fn read_json(path: &Path) -> Result<Value> {
    let bytes = read_small_file(path, MAX_JSON_BYTES)?;
    serde_json::from_slice(&bytes).map_err(|e| json_error(path, e))
}

/// A JSON side file that may be absent (`None`); present but not a regular file is an error.
fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    if side_file_exists(path)? {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// A token id: an integer below 2^32, or null/absent. `key` and `path` name it in errors.
fn token_id(v: Option<&Value>, key: &str, path: &Path) -> Result<Option<u32>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(x) => match x.as_u64().and_then(|x| u32::try_from(x).ok()) {
            Some(id) => Ok(Some(id)),
            None => Err(Error::corrupt(path, format!("{key} should be a token id, is {}", json_shown(x)))),
        },
    }
}

/// Token ids from a value that is an id, a list of ids, or null/absent.
fn token_ids(v: Option<&Value>, key: &str, path: &Path) -> Result<Vec<u32>> {
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
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(default)]
    model: Option<TokenizerModel>,
}

#[derive(serde::Deserialize)]
struct TokenizerModel {
    /// BPE / WordPiece / WordLevel: an object of token → id; Unigram: a list of [token, score].
    #[serde(default)]
    vocab: Option<Value>,
}

#[derive(serde::Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
}

fn read_tokenizer_json(path: &Path) -> Result<TokenizerJson> {
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
fn prepends_special_token(pp: &Value) -> bool {
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
fn chat_template(dir: &Path, tcfg: Option<&Map<String, Value>>) -> Result<Option<String>> {
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
