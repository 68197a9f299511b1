//! Validation shared by both loaders: the config against its limits, the tensors present
//! against the config.

use super::stored::{RowPick, StoredTensor};
use crate::error::{shown, Error, Result};
use crate::model::config::ModelConfig;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// `[a, b, c]`, at most 8 dimensions shown.
pub(crate) fn fmt_shape<T: std::fmt::Display>(dims: &[T]) -> String {
    let mut s = String::from("[");
    for (i, d) in dims.iter().enumerate() {
        if i == 8 {
            s.push_str(&format!(", … ({} dimensions)", dims.len()));
            break;
        }
        if i > 0 {
            s.push_str(", ");
        }
        s.push_str(&d.to_string());
    }
    s.push(']');
    s
}
/// Token strings that end a turn in the chat templates of the supported families; their ids
/// (when in the vocabulary) join `eos_token_ids`.
pub(crate) const END_OF_TURN_TOKENS: [&str; 4] = ["<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<|eot_id|>"];

/// Checks that a config is self-consistent (both loaders call this).
pub(crate) fn validate_config(c: &ModelConfig, path: &Path) -> Result<()> {
    let bad = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", path.display())));
    for (what, v) in [
        ("vocab size", c.vocab_size),
        ("hidden size", c.hidden_size),
        ("layer count", c.num_layers()),
        ("context length", c.max_position_embeddings),
    ] {
        if v == 0 {
            return bad(format!("{what} is 0"));
        }
    }
    use crate::model::config::{Mixer, MlpSpec};
    use limits as l;
    for (what, v, limit) in [
        ("vocab size", c.vocab_size, l::VOCAB),
        ("hidden size", c.hidden_size, l::HIDDEN),
        ("layer count", c.num_layers(), l::LAYERS),
        ("context length", c.max_position_embeddings, l::CONTEXT),
    ] {
        if v > limit {
            return bad(format!("{what} {v} is above the limit of {limit}"));
        }
    }
    if c.vocab_size.checked_mul(c.hidden_size).is_none() {
        return bad("dimensions overflow".into());
    }
    if !(c.rms_norm_eps >= 0.0 && c.rms_norm_eps.is_finite()) {
        return bad(format!("rms norm epsilon {}", c.rms_norm_eps));
    }
    for (what, v) in
        [("embedding scale", c.embedding_scale), ("final logit softcapping", c.final_logit_softcapping.unwrap_or(1.0))]
    {
        if !(v > 0.0 && v.is_finite()) {
            return bad(format!("{what} is {v}"));
        }
    }
    let mut kv_width = 0u64;
    for (i, spec) in c.layers.iter().enumerate() {
        let intermediate = match spec.mlp {
            MlpSpec::Dense { intermediate, .. } => intermediate,
            MlpSpec::Moe { intermediate, .. } => intermediate,
        };
        if intermediate == 0 {
            return bad(format!("layer {i}: intermediate size is 0"));
        }
        if intermediate > l::INTERMEDIATE {
            return bad(format!(
                "layer {i}: intermediate size {intermediate} is above the limit of {}",
                l::INTERMEDIATE
            ));
        }
        let Mixer::Attention(a) = spec.mixer else {
            continue;
        };
        for (what, v, limit) in [
            ("head count", a.heads, l::HEADS),
            ("kv head count", a.kv_heads, l::HEADS),
            ("head dimension", a.head_dim, l::HEAD_DIM),
        ] {
            if v == 0 {
                return bad(format!("layer {i}: {what} is 0"));
            }
            if v > limit {
                return bad(format!("layer {i}: {what} {v} is above the limit of {limit}"));
            }
        }
        if a.heads % a.kv_heads != 0 {
            return bad(format!("{} attention heads are not a multiple of {} kv heads", a.heads, a.kv_heads));
        }
        if a.head_dim % 2 != 0 {
            return bad(format!("head dimension {} is odd (RoPE needs pairs)", a.head_dim));
        }
        if a.heads.checked_mul(a.head_dim).is_none() {
            return bad("dimensions overflow".into());
        }
        for (what, v) in
            [("rope theta", a.rope.theta), ("rope scaling factor", a.rope.scaling), ("attention scale", a.scale)]
        {
            if !(v > 0.0 && v.is_finite()) {
                return bad(format!("{what} is {v}"));
            }
        }
        if a.window == Some(0) {
            return bad("sliding window of 0".into());
        }
        kv_width = kv_width.max(a.kv_dim() as u64);
    }
    // The KV cache for the whole context, in f32 bytes, must be a representable size (the
    // limits above guarantee it; this keeps the guarantee next to the use).
    let kv_bytes = [2, c.num_layers() as u64, c.max_position_embeddings as u64, kv_width, 4]
        .into_iter()
        .try_fold(1u64, |a, b| a.checked_mul(b));
    if kv_bytes.is_none() {
        return bad("the KV cache size for the full context overflows".into());
    }
    for id in c.bos_token_id.iter().chain(&c.eos_token_ids) {
        if *id as usize >= c.vocab_size {
            return bad(format!("special token id {id} is outside the vocabulary of {}", c.vocab_size));
        }
    }
    Ok(())
}

/// Limits on config values, far above any real model, that keep every size computed from them
/// (KV cache, activations, weights) well inside `u64` and refuse absurd values before anything
/// is allocated. Each error names the field and the limit.
pub mod limits {
    /// Vocabulary size (real models: up to 262,144).
    pub const VOCAB: usize = 1 << 24;
    /// Hidden size (real models: up to 16,384).
    pub const HIDDEN: usize = 1 << 17;
    /// MLP intermediate size (real models: up to 53,248).
    pub const INTERMEDIATE: usize = 1 << 20;
    /// Layers (real models: up to 126). The layer count must also match the tensors present.
    pub const LAYERS: usize = 4096;
    /// Experts of a mixture-of-experts block.
    pub const EXPERTS: usize = 4096;
    /// Attention heads, query or key/value (real models: up to 128).
    pub const HEADS: usize = 4096;
    /// Head dimension (real models: up to 256).
    pub const HEAD_DIM: usize = 4096;
    /// Context length (real models: up to ~10^7 with scaling).
    pub const CONTEXT: usize = 1 << 26;
}

/// A config value checked against its limit: `field` is named as the file names it.
pub(crate) fn capped(path: &Path, field: &str, value: usize, limit: usize) -> Result<usize> {
    if value > limit {
        return Err(Error::corrupt(path, format!("{} = {value} is above the limit of {limit}", shown(field))));
    }
    Ok(value)
}

/// The number of layers the tensors describe (`blk.{i}.*`, highest `i` + 1), before anything is
/// sized by a layer count: a layer index that is not canonical decimal is an error, and so is a
/// declared count (`field`) that differs from it, in either direction.
pub(crate) fn check_layer_count<'a>(
    names: impl Iterator<Item = &'a str>,
    declared: usize,
    field: &str,
    path: &Path,
) -> Result<()> {
    let mut layers = BTreeSet::new();
    for name in names {
        if let Some(i) = layer_index(name, path)? {
            layers.insert(i);
        }
    }
    let present = layers.last().map_or(0, |&i| i + 1);
    if present != declared {
        let what = match layers.last() {
            None => "no layer tensors".to_string(),
            Some(&last) => format!("tensors for {present} (blk.0 to blk.{last})"),
        };
        return Err(Error::Mismatch(format!(
            "{}: {} says {declared} layers, the file has {what}",
            path.display(),
            shown(field)
        )));
    }
    if let Some(missing) = (0..present).find(|i| !layers.contains(i)) {
        return Err(Error::Mismatch(format!("{}: layer {missing} has no tensors", path.display())));
    }
    Ok(())
}

/// The layer index of a canonical `blk.{i}.…` name.
fn layer_index(name: &str, path: &Path) -> Result<Option<usize>> {
    let Some(rest) = name.strip_prefix("blk.") else {
        return Ok(None);
    };
    let digits = rest.split('.').next().unwrap_or("");
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'))
        && digits.len() <= 9;
    if !canonical || rest.len() == digits.len() {
        return Err(Error::corrupt(path, format!("tensor {} has no valid layer index", shown(name))));
    }
    Ok(digits.parse().ok())
}

/// What a tensor of a model is, for its type check.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Role {
    /// A matrix: any supported type.
    Matrix,
    /// A norm weight or a bias: stored as floats (F32, F16 or BF16).
    Vector,
    /// Depthwise conv taps [C, K]: floats, stored [C, 1, K] (transformers) or [C, K, 1] (mlx-lm).
    Conv,
}

/// Every tensor `c` implies, with its shape (stacked experts: `[E, rows, cols]`) and role.
pub(crate) fn expected_tensors(c: &ModelConfig) -> Vec<(String, Vec<usize>, Role)> {
    use crate::model::config::{Mixer, MlpSpec};
    let (h, v) = (c.hidden_size, c.vocab_size);
    let mut out = vec![
        ("token_embd.weight".to_string(), vec![v, h], Role::Matrix),
        ("output_norm.weight".to_string(), vec![h], Role::Vector),
    ];
    if !c.tie_word_embeddings {
        out.push(("output.weight".into(), vec![v, h], Role::Matrix));
    }
    if let Some(ple) = c.per_layer_input {
        let all = c.num_layers() * ple.dim;
        out.push(("per_layer_token_embd.weight".into(), vec![ple.vocab, all], Role::Matrix));
        out.push(("per_layer_model_proj.weight".into(), vec![all, h], Role::Matrix));
        out.push(("per_layer_proj_norm.weight".into(), vec![ple.dim], Role::Vector));
    }
    for i in 0..c.num_layers() {
        let spec = c.layer(i);
        let mut add = |s: &str, shape: Vec<usize>, role| out.push((format!("blk.{i}.{s}"), shape, role));
        add("attn_norm.weight", vec![h], Role::Vector);
        add("ffn_norm.weight", vec![h], Role::Vector);
        match spec.mixer {
            Mixer::Attention(a) => {
                let (d, q, kv) = (a.head_dim, a.q_dim(), a.kv_dim());
                // A layer reading another's KV cache has only q.
                let own_kv = a.kv_from.is_none();
                add("attn_q.weight", vec![q, h], Role::Matrix);
                if own_kv {
                    add("attn_k.weight", vec![kv, h], Role::Matrix);
                }
                if own_kv && !a.k_eq_v {
                    add("attn_v.weight", vec![kv, h], Role::Matrix);
                }
                add("attn_output.weight", vec![h, q], Role::Matrix);
                if a.output_gate {
                    add("attn_out_gate.weight", vec![q, h], Role::Matrix);
                }
                if a.bias {
                    add("attn_q.bias", vec![q], Role::Vector);
                    if own_kv {
                        add("attn_k.bias", vec![kv], Role::Vector);
                    }
                    if own_kv && !a.k_eq_v {
                        add("attn_v.bias", vec![kv], Role::Vector);
                    }
                }
                if a.qk_norm {
                    add("attn_q_norm.weight", vec![d], Role::Vector);
                    if own_kv {
                        add("attn_k_norm.weight", vec![d], Role::Vector);
                    }
                }
            }
            Mixer::DeltaNet(d) => {
                let hv = d.v_heads;
                add("ssm_in_qkv.weight", vec![d.conv_dim(), h], Role::Matrix);
                add("ssm_in_z.weight", vec![d.value_dim(), h], Role::Matrix);
                add("ssm_beta.weight", vec![hv, h], Role::Matrix);
                add("ssm_alpha.weight", vec![hv, h], Role::Matrix);
                add("ssm_conv1d.weight", vec![d.conv_dim(), d.conv_kernel], Role::Conv);
                add("ssm_dt_bias.weight", vec![hv], Role::Vector);
                add("ssm_a_log.weight", vec![hv], Role::Vector);
                add("ssm_norm.weight", vec![d.v_dim], Role::Vector);
                add("ssm_out.weight", vec![h, d.value_dim()], Role::Matrix);
            }
        }
        match spec.mlp {
            MlpSpec::Dense { intermediate: f, .. } => {
                add("ffn_gate.weight", vec![f, h], Role::Matrix);
                add("ffn_up.weight", vec![f, h], Role::Matrix);
                add("ffn_down.weight", vec![h, f], Role::Matrix);
            }
            MlpSpec::Moe { experts: e, intermediate: f, shared_intermediate: fs, .. } => {
                add("ffn_gate_inp.weight", vec![e, h], Role::Matrix);
                add("ffn_gate_exps.weight", vec![e, f, h], Role::Matrix);
                add("ffn_up_exps.weight", vec![e, f, h], Role::Matrix);
                add("ffn_down_exps.weight", vec![e, h, f], Role::Matrix);
                if fs > 0 {
                    add("ffn_gate_inp_shexp.weight", vec![1, h], Role::Matrix);
                    add("ffn_gate_shexp.weight", vec![fs, h], Role::Matrix);
                    add("ffn_up_shexp.weight", vec![fs, h], Role::Matrix);
                    add("ffn_down_shexp.weight", vec![h, fs], Role::Matrix);
                }
            }
        }
        if spec.sandwich_norm {
            add("post_attention_norm.weight", vec![h], Role::Vector);
            add("post_ffw_norm.weight", vec![h], Role::Vector);
        }
        if spec.output_scale {
            add("layer_output_scale.weight", vec![1], Role::Vector);
        }
        if let Some(ple) = c.per_layer_input {
            add("inp_gate.weight", vec![ple.dim, h], Role::Matrix);
            add("proj.weight", vec![h, ple.dim], Role::Matrix);
            add("post_norm.weight", vec![h], Role::Vector);
        }
    }
    out
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
        if n == 0 || !rows.is_multiple_of(2 * n) {
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

/// Drops the k and v projections (and k norms) of layers that read another layer's KV cache
/// ([`crate::model::config::AttentionSpec::kv_from`]): Google's Gemma 4 E2B/E4B checkpoints ship
/// them for every layer, and transformers ignores those of the shared layers
/// (`_keys_to_ignore_on_load_unexpected`), as this does.
pub(crate) fn drop_shared_kv_tensors(c: &ModelConfig, tensors: &mut HashMap<String, StoredTensor>) {
    use crate::model::config::Mixer;
    for l in 0..c.num_layers() {
        if let Mixer::Attention(a) = c.layer(l).mixer {
            if a.kv_from.is_some() {
                for t in ["attn_k.weight", "attn_v.weight", "attn_k_norm.weight", "attn_k.bias", "attn_v.bias"] {
                    tensors.remove(&format!("blk.{l}.{t}"));
                }
            }
        }
    }
}

/// Checks the tensors against the config: every tensor the config implies is present with the
/// shape it implies and a type that fits its role, and no other tensor is there (a tensor the
/// engine would silently ignore means the file and the config disagree). Call after
/// [`check_layer_count`], so the layer loop here is bounded by the tensors present.
pub(crate) fn check_tensors(c: &ModelConfig, tensors: &HashMap<String, StoredTensor>, path: &Path) -> Result<()> {
    let expected = expected_tensors(c);
    let mismatch = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", path.display())));
    for (name, shape, role) in &expected {
        let Some(t) = tensors.get(name) else {
            return mismatch(format!("tensor {name} is missing"));
        };
        let conv_ok = *role == Role::Conv
            && t.shape.len() == 3
            && t.shape[0] == shape[0]
            && t.shape[1] * t.shape[2] == shape[1]
            && (t.shape[1] == 1 || t.shape[2] == 1);
        if t.shape != *shape && !conv_ok {
            return mismatch(format!(
                "tensor {name} has shape {}, the config implies {}",
                fmt_shape(&t.shape),
                fmt_shape(shape)
            ));
        }
        if *role != Role::Matrix && t.dtype.is_quantized() {
            return mismatch(format!(
                "tensor {name} is stored as {}, a norm or bias should be f32, f16 or bf16",
                t.dtype
            ));
        }
    }
    if tensors.len() != expected.len() {
        let known: std::collections::HashSet<&str> = expected.iter().map(|(n, ..)| n.as_str()).collect();
        let mut extra: Vec<&str> = tensors.keys().map(String::as_str).filter(|n| !known.contains(n)).collect();
        extra.sort_unstable();
        if let Some(first) = extra.first() {
            return mismatch(format!(
                "{} tensor(s) the config does not use, such as {} (a {} model with these settings has no such tensor)",
                extra.len(),
                shown(first),
                c.arch.name()
            ));
        }
    }
    Ok(())
}
