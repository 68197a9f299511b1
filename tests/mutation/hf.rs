//! A Hugging Face folder derived from the real SmolLM2 checkpoint (its config as config.json, its
//! tensors under their transformers names and shapes in model.safetensors, its tokenizer as
//! tokenizer.json, its chat template and special tokens in tokenizer_config.json), and the
//! recipes that corrupt it.
//!
//! The safetensors data is a hole of the right length (matrices BF16, norms F32): opening a
//! folder reads headers and side files, never tensor data, so a sparse file tests the same code
//! without writing 270 MB per case. The sharded variant splits the tensors over two files and
//! an index.

use super::{Content, Edit, Files, Rng, Sink, ABSURD};
use serde_json::{json, Map, Value};
use wgpu_llm::loader::{Checkpoint, TokenizerSource};
use wgpu_llm::model::config::ModelConfig;
use wgpu_llm::tokenizer::Tokenizer;

/// One safetensors entry: (name, dtype, shape, [begin, end)).
#[derive(Clone, Debug)]
pub struct Entry {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<u64>,
    pub offsets: [u64; 2],
}

pub struct Base {
    pub config: Value,
    pub entries: Vec<Entry>,
    pub data_len: u64,
    pub tokenizer_json: String,
    pub tokenizer_config: Value,
    pub generation_config: Value,
}

/// transformers' names and shapes for a llama checkpoint with `c`.
fn hf_tensors(c: &ModelConfig) -> Vec<(String, &'static str, Vec<u64>)> {
    let a = *c.attention(0).expect("an attention layer");
    let wgpu_llm::model::config::MlpSpec::Dense { intermediate, .. } = c.layer(0).mlp else { panic!("a dense MLP") };
    let (h, q, kv, f, v) =
        (c.hidden_size as u64, a.q_dim() as u64, a.kv_dim() as u64, intermediate as u64, c.vocab_size as u64);
    let mut t = vec![
        ("model.embed_tokens.weight".to_string(), "BF16", vec![v, h]),
        ("model.norm.weight".to_string(), "F32", vec![h]),
    ];
    for i in 0..c.num_layers() {
        let p = |s: &str| format!("model.layers.{i}.{s}");
        t.push((p("input_layernorm.weight"), "F32", vec![h]));
        t.push((p("self_attn.q_proj.weight"), "BF16", vec![q, h]));
        t.push((p("self_attn.k_proj.weight"), "BF16", vec![kv, h]));
        t.push((p("self_attn.v_proj.weight"), "BF16", vec![kv, h]));
        t.push((p("self_attn.o_proj.weight"), "BF16", vec![h, q]));
        t.push((p("post_attention_layernorm.weight"), "F32", vec![h]));
        t.push((p("mlp.gate_proj.weight"), "BF16", vec![f, h]));
        t.push((p("mlp.up_proj.weight"), "BF16", vec![f, h]));
        t.push((p("mlp.down_proj.weight"), "BF16", vec![h, f]));
    }
    t
}

fn elem_bytes(dtype: &str) -> u64 {
    match dtype {
        "F32" | "I32" => 4,
        "F16" | "BF16" | "I16" => 2,
        "F64" | "I64" => 8,
        _ => 1,
    }
}

/// Lays entries out contiguously in the given order.
fn lay_out(tensors: Vec<(String, &'static str, Vec<u64>)>) -> (Vec<Entry>, u64) {
    let mut at = 0;
    let entries = tensors
        .into_iter()
        .map(|(name, dtype, shape)| {
            let len = shape.iter().product::<u64>() * elem_bytes(dtype);
            let e = Entry { name, dtype, shape, offsets: [at, at + len] };
            at += len;
            e
        })
        .collect();
    (entries, at)
}

/// The JSON header object of `entries`.
pub fn header_json(entries: &[Entry]) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("__metadata__".into(), json!({"format": "pt"}));
    for e in entries {
        m.insert(e.name.clone(), json!({"dtype": e.dtype, "shape": e.shape, "data_offsets": e.offsets}));
    }
    m
}

/// A safetensors file: length prefix, `text` padded with spaces to a multiple of 8, then
/// `data_len` bytes of hole.
pub fn st_file(text: &str, data_len: u64) -> Content {
    let mut h = text.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut head = (h.len() as u64).to_le_bytes().to_vec();
    head.extend(h);
    let len = head.len() as u64 + data_len;
    Content::Sparse { parts: vec![(0, head)], len }
}

impl Base {
    pub fn new(ck: &Checkpoint) -> Base {
        let c = &ck.config;
        let config = crate::common::mlx::llama_hf_config(c);
        let (entries, data_len) = lay_out(hf_tensors(c));
        let TokenizerSource::Gguf(_) = &ck.tokenizer else { panic!("the base is a GGUF checkpoint") };
        let tok = Tokenizer::from_source(&ck.tokenizer, c.add_bos, c.bos_token_id).unwrap();
        let tokenizer_json = tok.inner().to_string(false).unwrap();
        let tokenizer_config = json!({
            "add_bos_token": c.add_bos,
            "bos_token": ck.bos_token,
            "eos_token": ck.eos_token,
            "chat_template": ck.chat_template,
            "model_max_length": c.max_position_embeddings,
        });
        let generation_config = json!({"bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_ids[0]});
        Base { config, entries, data_len, tokenizer_json, tokenizer_config, generation_config }
    }

    pub fn safetensors(&self) -> Content {
        st_file(&Value::Object(header_json(&self.entries)).to_string(), self.data_len)
    }

    /// The folder's files.
    pub fn files(&self) -> Files {
        vec![
            ("config.json".into(), Content::Bytes(self.config.to_string().into_bytes())),
            ("model.safetensors".into(), self.safetensors()),
            ("tokenizer.json".into(), Content::Bytes(self.tokenizer_json.clone().into_bytes())),
            ("tokenizer_config.json".into(), Content::Bytes(self.tokenizer_config.to_string().into_bytes())),
            ("generation_config.json".into(), Content::Bytes(self.generation_config.to_string().into_bytes())),
        ]
    }

    /// The sharded folder: two shards and model.safetensors.index.json.
    pub fn sharded_files(&self) -> Files {
        let mut files = self.files();
        files.retain(|(n, _)| n != "model.safetensors");
        let half = self.entries.len() / 2;
        let mut index = Map::new();
        let mut total = 0;
        for (i, part) in [&self.entries[..half], &self.entries[half..]].into_iter().enumerate() {
            let name = format!("model-0000{}-of-00002.safetensors", i + 1);
            let (entries, len) = lay_out(part.iter().map(|e| (e.name.clone(), e.dtype, e.shape.clone())).collect());
            for e in &entries {
                index.insert(e.name.clone(), Value::String(name.clone()));
            }
            total += len;
            files.push((name, st_file(&Value::Object(header_json(&entries)).to_string(), len)));
        }
        let idx = json!({"metadata": {"total_size": total}, "weight_map": index});
        files.push(("model.safetensors.index.json".into(), Content::Bytes(idx.to_string().into_bytes())));
        files
    }
}

/// `files` with `name` replaced by (or given) `content`.
pub fn with(mut files: Files, name: &str, content: Content) -> Files {
    files.retain(|(n, _)| n != name);
    files.push((name.to_string(), content));
    files
}

pub fn without(mut files: Files, name: &str) -> Files {
    files.retain(|(n, _)| n != name);
    files
}

fn bytes(s: impl Into<Vec<u8>>) -> Content {
    Content::Bytes(s.into())
}

/// The base folder with config.json edited as JSON.
fn config_with(b: &Base, edit: impl FnOnce(&mut Map<String, Value>)) -> Files {
    let mut c = b.config.as_object().unwrap().clone();
    edit(&mut c);
    with(b.files(), "config.json", bytes(Value::Object(c).to_string()))
}

/// The base folder with config.json's `key` set to the raw JSON text `raw`.
fn config_raw(b: &Base, key: &str, raw: &str) -> Files {
    let mut c = b.config.as_object().unwrap().clone();
    c.insert(key.to_string(), Value::String("@@".into()));
    let text = Value::Object(c).to_string().replace("\"@@\"", raw);
    with(b.files(), "config.json", bytes(text))
}

/// The base folder with the safetensors header's JSON text edited.
fn st_text(b: &Base, edit: impl FnOnce(&mut String)) -> Files {
    let mut text = Value::Object(header_json(&b.entries)).to_string();
    edit(&mut text);
    with(b.files(), "model.safetensors", st_file(&text, b.data_len))
}

/// The base folder with the safetensors header's entries edited (re-laid out when `relayout`).
fn st_entries(b: &Base, relayout: bool, edit: impl FnOnce(&mut Vec<Entry>)) -> Files {
    let mut entries = b.entries.clone();
    edit(&mut entries);
    let (entries, len) = if relayout {
        lay_out(entries.into_iter().map(|e| (e.name, e.dtype, e.shape)).collect())
    } else {
        (entries, b.data_len)
    };
    with(b.files(), "model.safetensors", st_file(&Value::Object(header_json(&entries)).to_string(), len))
}

/// The base folder with the safetensors file's first bytes (the length prefix) replaced.
fn st_prefix(b: &Base, n: u64) -> Files {
    let Content::Sparse { mut parts, len } = b.safetensors() else { unreachable!() };
    parts[0].1[..8].copy_from_slice(&n.to_le_bytes());
    with(b.files(), "model.safetensors", Content::Sparse { parts, len })
}

fn entry<'a>(entries: &'a mut [Entry], name: &str) -> &'a mut Entry {
    entries.iter_mut().find(|e| e.name == name).unwrap_or_else(|| panic!("no entry {name}"))
}

pub fn recipes(b: &Base, s: &mut Sink, rng: &mut Rng) {
    // --- config.json syntax ------------------------------------------------------------------
    let cat = "hf: config.json syntax";
    let text = b.config.to_string();
    for cut in [1, text.len() / 4, text.len() / 2, text.len() - 1] {
        let t = text[..cut].to_string();
        s.hf(cat, format!("cut at byte {cut}"), move |b| with(b.files(), "config.json", bytes(t.clone())));
    }
    let variants: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("null", b"null".to_vec()),
        ("a list", b"[]".to_vec()),
        ("a number", b"42".to_vec()),
        ("a string", b"\"llama\"".to_vec()),
        ("a NUL inside", text.replacen(',', ",\0", 1).into_bytes()),
        (
            "invalid UTF-8",
            text.replacen('{', "{\u{1}", 1)
                .replace('\u{1}', "\u{80}")
                .into_bytes()
                .into_iter()
                .filter(|&c| c != 0xc2)
                .collect(),
        ),
        ("200,000 nested lists", "[".repeat(200_000).into_bytes()),
        ("garbage after the object", format!("{text} x").into_bytes()),
        ("a byte-order mark", [b"\xef\xbb\xbf".to_vec(), text.clone().into_bytes()].concat()),
        ("single quotes", text.replace('"', "'").into_bytes()),
        ("a comment", format!("// config\n{text}").into_bytes()),
        ("UTF-16", text.encode_utf16().flat_map(|u| u.to_le_bytes()).collect()),
    ];
    for (what, v) in variants {
        s.hf(cat, what, move |b| with(b.files(), "config.json", bytes(v.clone())));
    }
    s.hf(cat, "rms_norm_eps NaN", |b| config_raw(b, "rms_norm_eps", "NaN"));
    s.hf(cat, "hidden_size 1e999", |b| config_raw(b, "hidden_size", "1e999"));

    // --- config.json fields ------------------------------------------------------------------
    let cat = "hf: config.json fields";
    let wrong_types = ["1.5", "\"576\"", "[]", "-1"];
    let big = ["4294967296", "9223372036854775808", "18446744073709551615", "18446744073709551616"];
    let counts: [(&str, u64, bool); 8] = [
        // (key, real value, whether absent/null must fail and ±1 is wrong)
        ("hidden_size", 576, true),
        ("intermediate_size", 1536, true),
        ("num_hidden_layers", 30, true),
        ("num_attention_heads", 9, true),
        ("num_key_value_heads", 3, true),
        ("vocab_size", 49152, false),
        ("max_position_embeddings", 8192, false),
        ("head_dim", 64, false),
    ];
    for (key, real, strict) in counts {
        let mut vals: Vec<String> = vec!["0".into()];
        vals.extend(wrong_types.iter().map(|s| s.to_string()));
        vals.extend(big.iter().map(|s| s.to_string()));
        if strict || key == "vocab_size" || key == "head_dim" {
            vals.push((real + 1).to_string());
            vals.push((real - 1).to_string());
        }
        for v in vals {
            s.hf(cat, format!("{key} = {v}"), move |b| config_raw(b, key, &v));
        }
        if strict {
            s.hf(cat, format!("{key} = null"), move |b| config_raw(b, key, "null"));
            s.hf(cat, format!("{key} missing"), move |b| {
                config_with(b, |c| {
                    c.remove(key);
                })
            });
        }
    }
    for (key, vals) in [
        ("rms_norm_eps", vec!["-1", "\"1e-5\"", "1e300", "[]", "-1e-5"]),
        ("rope_theta", vec!["0", "-1", "\"100000\"", "1e300", "{}"]),
        ("tie_word_embeddings", vec!["false", "\"true\"", "1", "[]"]),
        ("model_type", vec!["\"bert\"", "\"\"", "5", "null", "\"LLAMA\"", "\"llama2\"", "[\"llama\"]"]),
        ("hidden_act", vec!["\"relu\"", "\"gelu\"", "5", "[]"]),
        ("mlp_bias", vec!["true", "\"no\""]),
        (
            "rope_scaling",
            vec![
                "{\"rope_type\": \"yarn\", \"factor\": 4.0}",
                "{\"rope_type\": \"dynamic\", \"factor\": 2.0}",
                "{\"type\": \"linear\", \"factor\": -1}",
                "{\"type\": \"linear\", \"factor\": 0}",
                "{\"type\": \"linear\", \"factor\": \"2\"}",
                "{\"type\": \"linear\"}",
                "{\"type\": 5, \"factor\": 2.0}",
                "\"linear\"",
                "4.0",
            ],
        ),
        (
            "rope_parameters",
            vec![
                "{\"rope_type\": \"yarn\", \"factor\": 4.0, \"rope_theta\": 100000.0}",
                "{\"rope_type\": \"default\", \"rope_theta\": \"1e5\"}",
                "{\"rope_type\": \"default\", \"rope_theta\": -5}",
                "[]",
            ],
        ),
        ("layer_types", vec!["[\"full_attention\"]", "\"full_attention\"", "[\"chunked_attention\"]"]),
        ("bos_token_id", vec!["49152", "4294967296", "-1", "\"<s>\"", "[1, 99999]", "1.5"]),
        ("eos_token_id", vec!["49152", "[2, 49999]", "-2", "\"</s>\"", "[2, \"x\"]", "18446744073709551615"]),
    ] {
        for v in vals {
            s.hf(cat, format!("{key} = {v}"), move |b| {
                let files = config_raw(b, key, v);
                if key == "rope_parameters" || key == "rope_scaling" {
                    // Only the edited spelling: rope_theta moves into rope_parameters where
                    // transformers 5 writes it.
                    let Content::Bytes(t) = &files.iter().find(|(n, _)| n == "config.json").unwrap().1 else {
                        unreachable!()
                    };
                    let mut c: Map<String, Value> = serde_json::from_slice(t).unwrap();
                    if key == "rope_parameters" {
                        c.remove("rope_theta");
                        c.remove("rope_scaling");
                    }
                    return with(files, "config.json", bytes(Value::Object(c).to_string()));
                }
                files
            });
        }
    }
    let layers_sliding = |b: &Base| {
        config_with(b, |c| {
            c.insert("layer_types".into(), json!(vec!["sliding_attention"; 30]));
        })
    };
    s.hf(cat, "layer_types: 30 sliding layers without sliding_window", layers_sliding);
    s.hf(cat, "layer_types: 29 entries", |b| {
        config_with(b, |c| {
            c.insert("layer_types".into(), json!(vec!["full_attention"; 29]));
        })
    });

    // --- Files missing, misnamed, of the wrong kind ------------------------------------------
    let cat = "hf: files";
    for name in ["config.json", "model.safetensors", "tokenizer.json"] {
        s.hf(cat, format!("{name} missing"), move |b| without(b.files(), name));
        s.hf(cat, format!("{name} is a directory"), move |b| with(b.files(), name, Content::Dir));
        s.hf(cat, format!("{name} is a FIFO"), move |b| with(b.files(), name, Content::Fifo));
        s.hf(cat, format!("{name} is empty"), move |b| with(b.files(), name, bytes(vec![])));
        s.hf(cat, format!("{name} is a dangling symlink"), move |b| {
            with(b.files(), name, Content::Symlink("no-such-file".into()))
        });
    }
    for (from, to) in [
        ("model.safetensors", "model.safetensor"),
        ("model.safetensors", "Model.safetensors"),
        ("model.safetensors", "model.safetensors.bak"),
        ("model.safetensors", "pytorch_model.bin"),
        ("config.json", "Config.json"),
        ("config.json", "config.json.txt"),
        ("tokenizer.json", "tokenizer.JSON"),
        ("tokenizer.json", "tokenizer.model"),
    ] {
        s.hf(cat, format!("{from} renamed {to}"), move |b| {
            let mut files = b.files();
            for f in &mut files {
                if f.0 == from {
                    f.0 = to.to_string();
                }
            }
            files
        });
    }
    for name in ["tokenizer_config.json", "generation_config.json"] {
        s.hf(cat, format!("{name} is a directory"), move |b| with(b.files(), name, Content::Dir));
        s.hf(cat, format!("{name} is a FIFO"), move |b| with(b.files(), name, Content::Fifo));
        s.hf(cat, format!("{name} is not JSON"), move |b| with(b.files(), name, bytes("{\"bos_token\": ")));
    }
    s.hf(cat, "chat_template.jinja: not UTF-8, and no template in tokenizer_config.json", |b| {
        let mut tc = b.tokenizer_config.clone();
        tc.as_object_mut().unwrap().remove("chat_template");
        let files = with(b.files(), "tokenizer_config.json", bytes(tc.to_string()));
        with(files, "chat_template.jinja", bytes(b"{{ bos_token }}\xff\xfe".to_vec()))
    });
    s.hf(cat, "chat_template.jinja is a directory, and no template in tokenizer_config.json", |b| {
        let mut tc = b.tokenizer_config.clone();
        tc.as_object_mut().unwrap().remove("chat_template");
        let files = with(b.files(), "tokenizer_config.json", bytes(tc.to_string()));
        with(files, "chat_template.jinja", Content::Dir)
    });

    // --- Tokenizer files ---------------------------------------------------------------------
    let cat = "hf: tokenizer files";
    let tj: Value = serde_json::from_str(&b.tokenizer_json).unwrap();
    let tj_len = b.tokenizer_json.len();
    for cut in [tj_len / 3, tj_len - 1] {
        s.hf(cat, format!("tokenizer.json cut at byte {cut}"), move |b| {
            with(b.files(), "tokenizer.json", bytes(b.tokenizer_json[..cut].to_string()))
        });
    }
    let tj_edits: Vec<(&str, Edit<Value>)> = vec![
        ("{}", Box::new(|t| *t = json!({}))),
        ("model.vocab empty", Box::new(|t| t["model"]["vocab"] = json!({}))),
        ("model.vocab a number", Box::new(|t| t["model"]["vocab"] = json!(5))),
        ("model.type unknown", Box::new(|t| t["model"]["type"] = json!("NoSuchModel"))),
        ("model.merges a number", Box::new(|t| t["model"]["merges"] = json!(5))),
        ("added_tokens a string", Box::new(|t| t["added_tokens"] = json!("x"))),
        ("added token id 49152", Box::new(|t| t["added_tokens"][0]["id"] = json!(49152))),
        ("added token id -1", Box::new(|t| t["added_tokens"][0]["id"] = json!(-1))),
        ("added token id 2^40", Box::new(|t| t["added_tokens"][0]["id"] = json!(1u64 << 40))),
        ("pre_tokenizer of an unknown type", Box::new(|t| t["pre_tokenizer"] = json!({"type": "NoSuchPre"}))),
        ("normalizer a number", Box::new(|t| t["normalizer"] = json!(7))),
    ];
    let _ = tj;
    for (what, edit) in tj_edits {
        s.hf(cat, format!("tokenizer.json: {what}"), move |b| {
            let mut t: Value = serde_json::from_str(&b.tokenizer_json).unwrap();
            edit(&mut t);
            with(b.files(), "tokenizer.json", bytes(t.to_string()))
        });
    }
    let tc_edits: Vec<(&str, Value)> = vec![
        ("chat_template: unclosed block", json!("{% for m in messages %}{{ m.content }}")),
        ("chat_template: unknown filter", json!("{{ messages | no_such_filter }}")),
        ("chat_template: raise_exception", json!("{{ raise_exception('bad') }}")),
        ("chat_template: a number", json!(5)),
        ("chat_template: a list without templates", json!([{"name": "default"}])),
        ("chat_template: an object", json!({"template": "x"})),
        ("add_bos_token: a string", json!("yes")),
        ("bos_token: a number", json!(5)),
        ("eos_token: a list", json!(["<|im_end|>"])),
    ];
    for (what, v) in tc_edits {
        let key = what.split(':').next().unwrap();
        s.hf(cat, format!("tokenizer_config.json {what}"), move |b| {
            let mut tc = b.tokenizer_config.clone();
            tc[key] = v.clone();
            with(b.files(), "tokenizer_config.json", bytes(tc.to_string()))
        });
    }
    for (what, v) in [
        ("eos_token_id: a string", json!("x")),
        ("eos_token_id: 2^40", json!(1u64 << 40)),
        ("bos_token_id: -1", json!(-1)),
    ] {
        let key = what.split(':').next().unwrap();
        s.hf(cat, format!("generation_config.json {what}"), move |b| {
            let mut g = b.generation_config.clone();
            g[key] = v.clone();
            with(b.files(), "generation_config.json", bytes(g.to_string()))
        });
    }

    // --- Safetensors headers -----------------------------------------------------------------
    let cat = "hf: safetensors header";
    let header_len = {
        let Content::Sparse { parts, .. } = b.safetensors() else { unreachable!() };
        parts[0].1.len() as u64 - 8
    };
    let file_len = header_len + 8 + b.data_len;
    for n in [0, 1, 7, header_len - 1, header_len + 1, header_len + 8, file_len - 8, file_len, 100_000_001]
        .into_iter()
        .chain(ABSURD)
    {
        s.hf(cat, format!("header length {n} (is {header_len})"), move |b| st_prefix(b, n));
    }
    let st_len = header_len + 8;
    for cut in [0u64, 4, 8, 9, st_len / 2, st_len - 1] {
        s.hf(cat, format!("file cut at byte {cut}"), move |b| {
            let Content::Sparse { parts, .. } = b.safetensors() else { unreachable!() };
            with(b.files(), "model.safetensors", bytes(parts[0].1[..cut as usize].to_vec()))
        });
    }
    for (what, delta) in [("1 byte short", -1i64), ("2 bytes short", -2), ("8 bytes long", 8), ("1 MiB long", 1 << 20)]
    {
        s.hf(cat, format!("data {what}"), move |b| {
            let Content::Sparse { parts, len } = b.safetensors() else { unreachable!() };
            with(b.files(), "model.safetensors", Content::Sparse { parts, len: (len as i64 + delta) as u64 })
        });
    }
    let text_edits: Vec<(&str, Edit<String>)> = vec![
        ("JSON cut in half", Box::new(|t| t.truncate(t.len() / 2))),
        ("a list instead of an object", Box::new(|t| *t = "[]".into())),
        ("not JSON", Box::new(|t| *t = t.replacen('{', "<", 1))),
        ("a NUL in the JSON", Box::new(|t| *t = t.replacen(':', ":\0", 1))),
        (
            "an entry that is a number",
            Box::new(|t| *t = t.replacen("\"model.norm.weight\":{", "\"model.norm.weight\":5,\"x\":{", 1)),
        ),
        (
            "data_offsets with one number",
            Box::new(|t| *t = t.replacen("\"data_offsets\":[0,", "\"data_offsets\":[", 1)),
        ),
        ("negative shape", Box::new(|t| *t = t.replacen("\"shape\":[576]", "\"shape\":[-576]", 1))),
        ("shape 2^64", Box::new(|t| *t = t.replacen("\"shape\":[576]", "\"shape\":[18446744073709551616]", 1))),
        (
            "a key twice (layer 0's input norm named model.norm.weight)",
            Box::new(|t| *t = t.replacen("\"model.layers.0.input_layernorm.weight\"", "\"model.norm.weight\"", 1)),
        ),
        ("__metadata__ a number", Box::new(|t| *t = t.replacen("{\"format\":\"pt\"}", "5", 1))),
    ];
    for (what, edit) in text_edits {
        s.hf(cat, what, move |b| st_text(b, |t| edit(t)));
    }
    // Entry edits, in place (the data layout stays) or re-laid out (a valid file that disagrees
    // with the config).
    let names = [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.17.mlp.down_proj.weight",
        "model.layers.29.post_attention_layernorm.weight",
    ];
    for name in names {
        let e = b.entries.iter().find(|e| e.name == name).unwrap().clone();
        let [lo, hi] = e.offsets;
        let mut menu: Vec<(String, bool, Edit<Entry>)> = vec![
            ("offsets reversed".into(), false, Box::new(move |e| e.offsets = [hi, lo])),
            ("offsets +2".into(), false, Box::new(move |e| e.offsets = [lo + 2, hi + 2])),
            ("end +2".into(), false, Box::new(move |e| e.offsets = [lo, hi + 2])),
            ("end 2^63".into(), false, Box::new(move |e| e.offsets = [lo, 1 << 63])),
            ("offsets [u64::MAX - 1, u64::MAX]".into(), false, Box::new(|e| e.offsets = [u64::MAX - 1, u64::MAX])),
            ("dtype I64".into(), false, Box::new(|e| e.dtype = "I64")),
            ("dtype F8_E4M3".into(), false, Box::new(|e| e.dtype = "F8_E4M3")),
            ("dtype BOOL".into(), false, Box::new(|e| e.dtype = "BOOL")),
            ("dtype F64".into(), false, Box::new(|e| e.dtype = "F64")),
            ("a dimension + 1".into(), false, Box::new(|e| e.shape[0] += 1)),
            ("a dimension 0".into(), false, Box::new(|e| e.shape[0] = 0)),
            ("shape []".into(), false, Box::new(|e| e.shape.clear())),
            ("9 dimensions".into(), false, Box::new(|e| e.shape = vec![1; 9])),
            ("dimensions 2^32 and 2^32".into(), false, Box::new(|e| e.shape = vec![1 << 32, 1 << 32])),
            ("dimensions u64::MAX and 2".into(), false, Box::new(|e| e.shape = vec![u64::MAX, 2])),
            ("a dimension + 1, re-laid out".into(), true, Box::new(|e| e.shape[0] += 1)),
            ("dtype I32, re-laid out".into(), true, Box::new(|e| e.dtype = "I32")),
            ("renamed .weights".into(), true, Box::new(|e| e.name = e.name.replace(".weight", ".weights"))),
            (
                "renamed into layer 30".into(),
                true,
                Box::new(|e| e.name = "model.layers.30.input_layernorm.weight".into()),
            ),
        ];
        if name.contains("layers.") {
            menu.push((
                "renamed into layer 0N".into(),
                true,
                Box::new(|e| e.name = e.name.replace("layers.", "layers.0")),
            ));
            menu.push((
                "renamed into layer +N".into(),
                true,
                Box::new(|e| e.name = e.name.replace("layers.", "layers.+")),
            ));
        }
        if e.shape.len() == 2 && e.shape[0] != e.shape[1] {
            menu.push(("dimensions swapped".into(), false, Box::new(|e| e.shape.reverse())));
        }
        let keep = if name == names[0] { menu.len() } else { 12 };
        rng.shuffle(&mut menu);
        menu.truncate(keep);
        for (what, relayout, edit) in menu {
            s.hf(cat, format!("{name}: {what}"), move |b| st_entries(b, relayout, |es| edit(entry(es, name))));
        }
        s.hf(cat, format!("{name}: removed"), move |b| st_entries(b, true, |es| es.retain(|e| e.name != name)));
    }
    s.hf(cat, "a q_proj bias in layer 0 only", |b| {
        st_entries(b, true, |es| {
            es.push(Entry {
                name: "model.layers.0.self_attn.q_proj.bias".into(),
                dtype: "F32",
                shape: vec![576],
                offsets: [0, 0],
            })
        })
    });
    s.hf(cat, "lm_head.weight of the wrong shape, untied", |b| {
        let mut files = st_entries(b, true, |es| {
            es.push(Entry { name: "lm_head.weight".into(), dtype: "BF16", shape: vec![49152, 575], offsets: [0, 0] })
        });
        let mut c = b.config.clone();
        c["tie_word_embeddings"] = json!(false);
        files = with(files, "config.json", bytes(c.to_string()));
        files
    });
    s.hf(cat, "two names for one tensor (layers.0 and language_model.model.layers.0)", |b| {
        st_entries(b, true, |es| {
            let mut e = es.iter().find(|e| e.name == "model.layers.0.mlp.up_proj.weight").unwrap().clone();
            e.name = "language_model.model.layers.0.mlp.up_proj.weight".into();
            es.push(e);
        })
    });
    s.hf(cat, "two tensors at the same offsets", |b| {
        st_entries(b, false, |es| {
            let o = entry(es, "model.layers.3.mlp.up_proj.weight").offsets;
            entry(es, "model.layers.3.mlp.gate_proj.weight").offsets = o;
        })
    });

    // --- Sharded folders ---------------------------------------------------------------------
    let cat = "hf: sharded index";
    let index_edits: Vec<(&str, Edit<Value>)> = vec![
        ("no weight_map", Box::new(|v| v.as_object_mut().unwrap().retain(|k, _| k != "weight_map"))),
        ("weight_map a list", Box::new(|v| v["weight_map"] = json!([]))),
        ("weight_map empty", Box::new(|v| v["weight_map"] = json!({}))),
        ("an entry a number", Box::new(|v| v["weight_map"]["model.norm.weight"] = json!(5))),
        (
            "an entry ../model.safetensors",
            Box::new(|v| v["weight_map"]["model.norm.weight"] = json!("../model.safetensors")),
        ),
        ("an entry /etc/passwd", Box::new(|v| v["weight_map"]["model.norm.weight"] = json!("/etc/passwd"))),
        ("an entry empty", Box::new(|v| v["weight_map"]["model.norm.weight"] = json!(""))),
        (
            "an entry naming a missing shard",
            Box::new(|v| v["weight_map"]["model.norm.weight"] = json!("model-00003-of-00002.safetensors")),
        ),
        (
            "a tensor in the wrong shard",
            Box::new(|v| {
                let wm = v["weight_map"].as_object_mut().unwrap();
                let (k, f) = wm.iter().next().map(|(k, f)| (k.clone(), f.as_str().unwrap().to_string())).unwrap();
                let other = if f.contains("00001") {
                    "model-00002-of-00002.safetensors"
                } else {
                    "model-00001-of-00002.safetensors"
                };
                wm.insert(k, json!(other));
            }),
        ),
        (
            "a tensor no shard has",
            Box::new(|v| {
                v["weight_map"]["model.layers.0.self_attn.q_proj.bias"] = json!("model-00001-of-00002.safetensors")
            }),
        ),
    ];
    for (what, edit) in index_edits {
        s.hf(cat, format!("index: {what}"), move |b| {
            let files = b.sharded_files();
            let Content::Bytes(t) = &files.iter().find(|(n, _)| n == "model.safetensors.index.json").unwrap().1 else {
                unreachable!()
            };
            let mut v: Value = serde_json::from_slice(t).unwrap();
            edit(&mut v);
            with(files, "model.safetensors.index.json", bytes(v.to_string()))
        });
    }
    s.hf(cat, "index: not JSON", |b| with(b.sharded_files(), "model.safetensors.index.json", bytes("{\"weight_map\"")));
    s.hf(cat, "index: a directory", |b| with(b.sharded_files(), "model.safetensors.index.json", Content::Dir));
    s.hf(cat, "the second shard missing", |b| without(b.sharded_files(), "model-00002-of-00002.safetensors"));
    s.hf(cat, "the second shard a FIFO", |b| {
        with(b.sharded_files(), "model-00002-of-00002.safetensors", Content::Fifo)
    });
    s.hf(cat, "both shards hold model.norm.weight", |b| {
        let files = b.sharded_files();
        let first = b.entries.len() / 2;
        let part: Vec<_> = b.entries[..first]
            .iter()
            .map(|e| (e.name.clone(), e.dtype, e.shape.clone()))
            .chain(std::iter::once(("model.norm.weight".to_string(), "F32", vec![576])))
            .collect();
        let (entries, len) = lay_out(part);
        with(files, "model-00001-of-00002.safetensors", st_file(&Value::Object(header_json(&entries)).to_string(), len))
    });

    // --- Tensor values -----------------------------------------------------------------------
    for (name, bits) in
        [("model.norm.weight", f32::NAN.to_bits()), ("model.layers.4.input_layernorm.weight", f32::INFINITY.to_bits())]
    {
        let e = b.entries.iter().find(|e| e.name == name).unwrap().clone();
        s.hf("hf: tensor values", format!("{name}[3] = {}", f32::from_bits(bits)), move |b| {
            let Content::Sparse { mut parts, len } = b.safetensors() else { unreachable!() };
            let data_start = parts[0].1.len() as u64;
            parts.push((data_start + e.offsets[0] + 12, bits.to_le_bytes().to_vec()));
            with(b.files(), "model.safetensors", Content::Sparse { parts, len })
        });
    }
}
