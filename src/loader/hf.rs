//! Hugging Face checkpoint folders: `config.json`, `model.safetensors` (or shards listed in
//! `model.safetensors.index.json`), `tokenizer.json`, `tokenizer_config.json` and, when present,
//! `generation_config.json` / `chat_template.jinja`.
//!
//! Tensor names are mapped onto the canonical GGUF names (see the module docs of
//! [`crate::loader`]); tensors that map to nothing (vision towers, rotary caches, ...) are left
//! out. Safetensors headers are parsed here over the memory map and every offset is checked
//! against the file. Stored types F32, F16 and BF16 are read; a used tensor of any other type is
//! [`Error::Unsupported`].

use super::gguf::{map_file, validate_config, END_OF_TURN_TOKENS};
use super::{Checkpoint, DType, Fixup, StoredTensor, TokenizerSource};
use crate::error::{Error, Result};
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
            return Err(Error::Unsupported(format!("architecture {other} (in {})", config_path.display())))
        }
    };

    // Tensors.
    let mut maps = Vec::new();
    let mut tensors = HashMap::new();
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    if single.is_file() {
        load_safetensors(&single, arch, &mut maps, &mut tensors, None)?;
    } else if index.is_file() {
        let idx = read_json(&index)?;
        let weight_map = idx
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| Error::corrupt(&index, "no weight_map object"))?;
        let mut shards: Vec<&str> = Vec::new();
        for (name, file) in weight_map {
            let file = file
                .as_str()
                .ok_or_else(|| Error::corrupt(&index, format!("weight_map entry {name} is not a file name")))?;
            let plain =
                Path::new(file).components().count() == 1 && !file.contains(['/', '\\']) && file != ".." && file != ".";
            if !plain {
                return Err(Error::corrupt(&index, format!("shard name {file:?} is not a plain file name")));
            }
            if !shards.contains(&file) {
                shards.push(file);
            }
        }
        shards.sort_unstable();
        for shard in shards {
            let expect: Vec<&str> =
                weight_map.iter().filter(|(_, f)| f.as_str() == Some(shard)).map(|(n, _)| n.as_str()).collect();
            load_safetensors(&dir.join(shard), arch, &mut maps, &mut tensors, Some(&expect))?;
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

    // Tokenizer files.
    let tok_path = dir.join("tokenizer.json");
    if !tok_path.is_file() {
        return Err(Error::io(
            &tok_path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "tokenizer.json is missing"),
        ));
    }
    let tok_json = read_tokenizer_json(&tok_path)?;
    let tok_config = read_optional_json(&dir.join("tokenizer_config.json"))?;
    let gen_config = read_optional_json(&dir.join("generation_config.json"))?;
    let tcfg = tok_config.as_ref().and_then(Value::as_object);

    // Special tokens.
    let token_string = |key: &str| -> Option<String> {
        match tcfg?.get(key)? {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
            _ => None,
        }
    };
    let added_id = |s: &str| tok_json.added_tokens.iter().find(|t| t.content == s).map(|t| t.id);
    let added_str = |id: u32| tok_json.added_tokens.iter().find(|t| t.id == id).map(|t| t.content.clone());

    let gen = gen_config.as_ref().and_then(Value::as_object);
    let bos_id = token_ids(root.get("bos_token_id").or_else(|| text.get("bos_token_id")))
        .first()
        .copied()
        .or_else(|| token_ids(gen.and_then(|g| g.get("bos_token_id"))).first().copied());
    let mut bos_token = token_string("bos_token");
    let mut eos_token = token_string("eos_token");
    let bos_id = bos_id.or_else(|| bos_token.as_deref().and_then(added_id));
    if bos_token.is_none() {
        bos_token = bos_id.and_then(added_str);
    }
    let mut eos_ids = Vec::new();
    let sources =
        [root.get("eos_token_id").or_else(|| text.get("eos_token_id")), gen.and_then(|g| g.get("eos_token_id"))];
    let named = eos_token.iter().map(String::as_str).chain(END_OF_TURN_TOKENS).filter_map(added_id);
    for id in sources.into_iter().flat_map(token_ids).chain(named) {
        if !eos_ids.contains(&id) {
            eos_ids.push(id);
        }
    }
    if eos_token.is_none() {
        eos_token = eos_ids.first().copied().and_then(added_str);
    }
    let add_bos = match tcfg.and_then(|t| t.get("add_bos_token")).and_then(Value::as_bool) {
        Some(b) => b,
        None => tok_json.post_processor.as_ref().is_some_and(prepends_special_token),
    };
    config.bos_token_id = bos_id;
    config.eos_token_ids = eos_ids;
    config.add_bos = add_bos;

    let chat_template = chat_template(dir, tcfg)?;

    // Fixups: Gemma's RMSNorm multiplies by (1 + w); fold the 1 in.
    let mut fixups = HashMap::new();
    if arch == Arch::Gemma3 {
        for name in tensors.keys().filter(|n| n.ends_with("norm.weight")) {
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
        maps,
        fixups,
    })
}

// ---------------------------------------------------------------------------------------------
// Safetensors
// ---------------------------------------------------------------------------------------------

/// Parses one safetensors file and adds its tensors (under canonical names) to `out`, which maps
/// canonical name → (original name, tensor). `expect`: the names an index says are in the file.
fn load_safetensors(
    path: &Path,
    arch: Arch,
    maps: &mut Vec<memmap2::Mmap>,
    out: &mut HashMap<String, (String, StoredTensor)>,
    expect: Option<&[&str]>,
) -> Result<()> {
    let map = map_file(path)?;
    let map_index = maps.len();
    let entries = parse_safetensors_header(&map, path)?;
    if let Some(expect) = expect {
        for name in expect {
            if !entries.iter().any(|e| e.name == *name) {
                return Err(Error::Mismatch(format!(
                    "{}: the index lists {name} in this shard, but it is not there",
                    path.display()
                )));
            }
        }
    }
    for e in entries {
        let Some(canonical) = canonical_name(&e.name, arch) else {
            continue;
        };
        let dtype = match e.dtype.as_str() {
            "F32" => DType::F32,
            "F16" => DType::F16,
            "BF16" => DType::BF16,
            other => {
                return Err(Error::Unsupported(format!(
                    "tensor {} in {} has dtype {other} (F32, F16 and BF16 are read)",
                    e.name,
                    path.display()
                )))
            }
        };
        let st = StoredTensor { map: map_index, offset: e.start, len: e.end - e.start, dtype, shape: e.shape };
        if let Some((prev, _)) = out.insert(canonical.clone(), (e.name.clone(), st)) {
            return Err(Error::corrupt(path, format!("tensors {prev} and {} both map to {canonical}", e.name)));
        }
    }
    maps.push(map);
    Ok(())
}

struct SafetensorsEntry {
    name: String,
    dtype: String,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// Element size of a safetensors dtype name (None: unknown name).
fn safetensors_dtype_bits(dtype: &str) -> Option<usize> {
    Some(match dtype {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        "F4" | "F6_E2M3" | "F6_E3M2" => return None,
        _ => return None,
    })
}

/// Parses and validates a safetensors header: `u64` JSON length, then a JSON object of
/// `name: {dtype, shape, data_offsets: [begin, end]}` (offsets relative to the data section
/// after the header). Each tensor's range must match its shape and lie within the file.
fn parse_safetensors_header(bytes: &[u8], path: &Path) -> Result<Vec<SafetensorsEntry>> {
    let corrupt = |msg: String| Error::corrupt(path, msg);
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(corrupt(format!("truncated: {} bytes, no safetensors header", bytes.len())));
    };
    let n = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
    let data_start =
        usize::try_from(n).ok().and_then(|n| n.checked_add(8)).filter(|&e| e <= bytes.len()).ok_or_else(|| {
            corrupt(format!("header length {n} runs past the end of the file ({} bytes)", bytes.len()))
        })?;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| corrupt(format!("bad safetensors header JSON: {e}")))?;
    let data_len = bytes.len() - data_start;
    let mut out = Vec::with_capacity(header.len());
    for (name, info) in header {
        if name == "__metadata__" {
            continue;
        }
        let bad = |what: &str| corrupt(format!("tensor {name}: {what}"));
        let info = info.as_object().ok_or_else(|| bad("entry is not an object"))?;
        let dtype = info.get("dtype").and_then(Value::as_str).ok_or_else(|| bad("no dtype"))?.to_string();
        let shape = info
            .get("shape")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no shape"))?
            .iter()
            .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
            .collect::<Option<Vec<usize>>>()
            .ok_or_else(|| bad("shape is not a list of sizes"))?;
        let offs = info
            .get("data_offsets")
            .and_then(Value::as_array)
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("no data_offsets [begin, end]"))?;
        let (begin, end) = match (offs[0].as_u64(), offs[1].as_u64()) {
            (Some(b), Some(e)) if b <= e => (b, e),
            _ => return Err(bad("data_offsets are not [begin, end] with begin <= end")),
        };
        if end > data_len as u64 {
            return Err(corrupt(format!(
                "tensor {name}: data_offsets [{begin}, {end}] run past the end of the data ({data_len} bytes): truncated?"
            )));
        }
        let (begin, end) = (begin as usize, end as usize);
        if let Some(bits) = safetensors_dtype_bits(&dtype) {
            let want = shape
                .iter()
                .try_fold(1usize, |a, &d| a.checked_mul(d))
                .and_then(|n| n.checked_mul(bits))
                .map(|b| b / 8);
            if want != Some(end - begin) {
                return Err(corrupt(format!(
                    "tensor {name}: shape {shape:?} of {dtype} needs {want:?} bytes, data_offsets give {}",
                    end - begin
                )));
            }
        }
        out.push(SafetensorsEntry { name, dtype, shape, start: data_start + begin, end: data_start + end });
    }
    Ok(out)
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
        "model.norm.weight" => return Some("output_norm.weight".into()),
        "lm_head.weight" => return Some("output.weight".into()),
        _ => {}
    }
    let rest = name.strip_prefix("model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = match rest.rsplit_once('.')? {
        (m, s @ ("weight" | "bias")) => (m, s),
        _ => return None,
    };
    let mapped = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "post_attention_layernorm" if arch == Arch::Gemma3 => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" => "ffn_norm",
        "post_feedforward_layernorm" => "post_ffw_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{mapped}.{suffix}"))
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
        Error::corrupt(self.path, format!("{key} should be {want}, is {v}"))
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
        self.opt_usize(key)?.ok_or_else(|| Error::corrupt(self.path, format!("required key {key} is missing")))
    }
    fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| self.wrong(key, "a number")),
        }
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| self.wrong(key, "a bool")),
        }
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_str().map(Some).ok_or_else(|| self.wrong(key, "a string")),
        }
    }
}

/// The linear RoPE scaling factor of a `rope_scaling` / `rope_parameters` object (1 = none).
fn rope_factor(o: Option<&Map<String, Value>>, path: &Path) -> Result<f32> {
    let Some(o) = o else { return Ok(1.0) };
    let ty = o.get("rope_type").or_else(|| o.get("type")).and_then(Value::as_str).unwrap_or("default");
    let factor = o.get("factor").and_then(Value::as_f64).unwrap_or(1.0) as f32;
    match ty {
        "default" => Ok(1.0),
        "linear" if factor > 0.0 && factor.is_finite() => Ok(factor),
        "linear" => Err(Error::corrupt(path, format!("rope scaling factor {factor}"))),
        other => Err(Error::Unsupported(format!("RoPE scaling type {other}"))),
    }
}

fn build_config(c: &Cfg, arch: Arch, tensors: &HashMap<String, StoredTensor>, dir: &Path) -> Result<ModelConfig> {
    let gemma = arch == Arch::Gemma3;
    let hidden = c.req_usize("hidden_size")?;
    let num_layers = c.req_usize("num_hidden_layers")?;
    let intermediate = c.req_usize("intermediate_size")?;
    let num_heads = c.req_usize("num_attention_heads")?;
    let num_kv_heads = c.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    let vocab_size = match c.opt_usize("vocab_size")? {
        Some(v) => v,
        None => tensors
            .get("token_embd.weight")
            .and_then(|t| t.shape.first().copied())
            .ok_or_else(|| Error::corrupt(c.path, "required key vocab_size is missing"))?,
    };
    if num_heads == 0 {
        return Err(Error::Mismatch(format!("{}: num_attention_heads is 0", c.path.display())));
    }
    let head_dim = match c.opt_usize("head_dim")? {
        Some(d) => d,
        None if gemma => 256,
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
    let rms_norm_eps = c.opt_f32("rms_norm_eps")?.unwrap_or(if gemma { 1e-6 } else { 1e-5 });
    let max_pos = c.opt_usize("max_position_embeddings")?.unwrap_or(match arch {
        Arch::Llama => 2048,
        Arch::Qwen2 | Arch::Qwen3 => 32768,
        Arch::Gemma3 => 131072,
    });

    // RoPE: rope_theta / rope_scaling (transformers 4.x) or rope_parameters (5.x, per layer kind
    // for Gemma 3).
    let default_theta = if gemma || matches!(arch, Arch::Qwen2 | Arch::Qwen3) { 1_000_000.0 } else { 10_000.0 };
    let params = c.get("rope_parameters").and_then(Value::as_object);
    let (full_params, local_params) = match params {
        Some(p) if p.contains_key("full_attention") => {
            (p.get("full_attention").and_then(Value::as_object), p.get("sliding_attention").and_then(Value::as_object))
        }
        Some(p) => (Some(p), None),
        None => (None, None),
    };
    let theta_of = |p: Option<&Map<String, Value>>| p.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64);
    let rope_theta = match c.opt_f32("rope_theta")? {
        Some(t) => t,
        None => theta_of(full_params).map_or(default_theta, |t| t as f32),
    };
    let rope_scaling_factor = match c.get("rope_scaling") {
        Some(v) => rope_factor(v.as_object(), c.path)?,
        None => rope_factor(full_params, c.path)?,
    };
    let rope_local_theta = if gemma {
        Some(match c.opt_f32("rope_local_base_freq")? {
            Some(t) => t,
            None => theta_of(local_params).map_or(10_000.0, |t| t as f32),
        })
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
                _ => Err(Error::Unsupported(format!("layer type {t}"))),
            })
            .collect::<Result<_>>()?
    } else if gemma {
        let pattern = c.opt_usize("sliding_window_pattern")?.unwrap_or(6).max(1);
        let w = window("sliding_attention")?;
        (0..num_layers)
            .map(|i| if (i + 1) % pattern == 0 { LayerAttention::Full } else { LayerAttention::Sliding { window: w } })
            .collect()
    } else if matches!(arch, Arch::Qwen2 | Arch::Qwen3) && c.opt_bool("use_sliding_window")? == Some(true) {
        let from = c.opt_usize("max_window_layers")?.unwrap_or(num_layers);
        let w = window("sliding_attention")?;
        (0..num_layers)
            .map(|i| if i >= from { LayerAttention::Sliding { window: w } } else { LayerAttention::Full })
            .collect()
    } else {
        vec![LayerAttention::Full; num_layers]
    };

    let act_key = if gemma { "hidden_activation" } else { "hidden_act" };
    let act = c.opt_str(act_key)?.or(c.opt_str("hidden_act")?);
    let activation = match act.unwrap_or(if gemma { "gelu_pytorch_tanh" } else { "silu" }) {
        "silu" | "swish" => Activation::SiluGated,
        "gelu_pytorch_tanh" | "gelu_tanh" | "gelu_new" => Activation::GeluTanhGated,
        other => return Err(Error::Unsupported(format!("activation {other}"))),
    };
    if c.opt_bool("mlp_bias")? == Some(true) {
        return Err(Error::Unsupported("MLP bias (mlp_bias = true)".into()));
    }

    let tie_word_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(gemma);
    let attention_scale = if gemma {
        let s = c.opt_f32("query_pre_attn_scalar")?.unwrap_or(head_dim as f32);
        if s.is_nan() || s <= 0.0 {
            return Err(Error::Mismatch(format!("{}: query_pre_attn_scalar {s}", dir.display())));
        }
        1.0 / s.sqrt()
    } else {
        1.0 / (head_dim as f32).sqrt()
    };

    Ok(ModelConfig {
        arch,
        vocab_size,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        rope_local_theta,
        rope_scaling_factor,
        max_position_embeddings: max_pos,
        layer_attention,
        tie_word_embeddings,
        attention_bias: tensors.contains_key("blk.0.attn_q.bias"),
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        sandwich_norm: gemma,
        activation,
        embedding_scale: if gemma { (hidden as f32).sqrt() } else { 1.0 },
        attention_scale,
        final_logit_softcapping: c.opt_f32("final_logit_softcapping")?.filter(|&x| x > 0.0),
        bos_token_id: None,
        eos_token_ids: Vec::new(),
        add_bos: false,
    })
}

// ---------------------------------------------------------------------------------------------
// Tokenizer side files
// ---------------------------------------------------------------------------------------------

fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(path, format!("bad JSON: {e}")))
}

fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    if path.is_file() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// Ids from a config value that is an integer or a list of integers.
fn token_ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).filter_map(|x| u32::try_from(x).ok()).collect(),
        Some(x) => x.as_u64().and_then(|x| u32::try_from(x).ok()).into_iter().collect(),
        None => Vec::new(),
    }
}

/// The parts of tokenizer.json the loader reads (the rest is skipped, not built).
#[derive(serde::Deserialize)]
struct TokenizerJson {
    #[serde(default)]
    added_tokens: Vec<AddedToken>,
    #[serde(default)]
    post_processor: Option<Value>,
}

#[derive(serde::Deserialize)]
struct AddedToken {
    id: u32,
    content: String,
}

fn read_tokenizer_json(path: &Path) -> Result<TokenizerJson> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(path, format!("bad tokenizer.json: {e}")))
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
    match tcfg.and_then(|t| t.get("chat_template")) {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |n: &str| {
                list.iter()
                    .find(|e| e.get("name").and_then(Value::as_str) == Some(n))
                    .and_then(|e| e.get("template"))
                    .and_then(Value::as_str)
            };
            let first = list.first().and_then(|e| e.get("template")).and_then(Value::as_str);
            if let Some(t) = named("default").or(first) {
                return Ok(Some(t.to_string()));
            }
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return std::fs::read_to_string(&jinja).map(Some).map_err(|e| Error::io(jinja, e));
    }
    let json = dir.join("chat_template.json");
    if let Some(v) = read_optional_json(&json)? {
        return Ok(v.get("chat_template").and_then(Value::as_str).map(str::to_string));
    }
    Ok(None)
}
