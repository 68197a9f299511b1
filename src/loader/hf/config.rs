//! config.json read into the architecture's hyperparameters.

use crate::error::{shown, Error, Result};
use crate::loader::{capped, check_layer_count, limits, StoredTensor};
use crate::model::arch::{self, DeltaNetParams, FullLayers, Hyperparams, MoeParams};
use crate::model::config::{Activation, Arch, LayerAttention, ModelConfig, PerLayerInput};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

/// config.json accessors with errors naming the key.
pub(super) struct Cfg<'a> {
    pub(super) obj: &'a Map<String, Value>,
    pub(super) path: &'a Path,
}

impl Cfg<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }
    fn wrong(&self, key: &str, want: &str) -> Error {
        let v = self.obj.get(key).unwrap_or(&Value::Null);
        Error::corrupt(self.path, format!("{} should be {want}, is {}", shown(key), json_shown(v)))
    }
    /// The value of `key` read by `read`, if present; `want` says what it should be in the error.
    fn opt<'v, T>(&'v self, key: &str, want: &str, read: impl FnOnce(&'v Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| self.wrong(key, want)),
        }
    }
    fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        self.opt(key, "a non-negative integer", |v| v.as_u64().and_then(|x| usize::try_from(x).ok()))
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
        self.opt(key, "a finite number (in f32 range)", |v| v.as_f64().map(|x| x as f32).filter(|x| x.is_finite()))
    }
    fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        self.opt(key, "a bool", Value::as_bool)
    }
    /// Which layers are `full_attention` by `layer_types` (one per layer, each that or `other`),
    /// or when it is absent every `every`-th layer; `arch` names the model in errors.
    fn full_attention_layers(&self, num_layers: usize, other: &str, arch: &str, every: usize) -> Result<Vec<bool>> {
        let Some(types) = self.layer_types(num_layers)? else {
            return Ok((0..num_layers).map(|i| (i + 1) % every == 0).collect());
        };
        types
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(true),
                Some(o) if o == other => Ok(false),
                _ => Err(Error::Unsupported(format!("layer type {} in a {arch} model", json_shown(t)))),
            })
            .collect()
    }
    /// `layer_types` if present: a list of one entry per layer.
    fn layer_types(&self, num_layers: usize) -> Result<Option<&Vec<Value>>> {
        let Some(types) = self.get("layer_types") else {
            return Ok(None);
        };
        let types = types.as_array().ok_or_else(|| self.wrong("layer_types", "a list"))?;
        if types.len() != num_layers {
            return Err(Error::Mismatch(format!(
                "{}: layer_types has {} entries for {num_layers} layers",
                self.path.display(),
                types.len()
            )));
        }
        Ok(Some(types))
    }
    fn opt_str(&self, key: &str) -> Result<Option<&str>> {
        self.opt(key, "a string", Value::as_str)
    }
}

/// A JSON value inside an error message: its JSON text, cut short.
pub(super) fn json_shown(v: &Value) -> String {
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
pub(super) fn rope_factor(o: Option<&Value>, what: &str, path: &Path) -> Result<f32> {
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

pub(super) fn build_config(
    c: &Cfg,
    arch: Arch,
    tensors: &HashMap<String, StoredTensor>,
    dir: &Path,
) -> Result<ModelConfig> {
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
    let layer_attention: Vec<LayerAttention> = if let Some(types) = c.layer_types(num_layers)? {
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

    arch::try_model_config(&Hyperparams {
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
        ..Hyperparams::default()
    })
    .map_err(|msg| Error::Mismatch(format!("{}: {msg}", c.path.display())))
}

/// `Qwen3_5MoeTextConfig` (the `text_config` of the multimodal model) into its layer specs.
pub(super) fn build_qwen35_moe(c: &Cfg, tensors: &HashMap<String, StoredTensor>) -> Result<ModelConfig> {
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
    let d = arch::qwen3_5_moe::DEFAULTS;
    let h = Hyperparams {
        arch: Arch::Qwen35Moe,
        vocab_size: c.req_capped("vocab_size", limits::VOCAB)?,
        hidden_size: hidden,
        rms_norm_eps: c.opt_f32("rms_norm_eps")?.unwrap_or(d.rms_norm_eps),
        max_position_embeddings: c
            .opt_capped("max_position_embeddings", limits::CONTEXT)?
            .unwrap_or(d.max_position_embeddings),
        tie_word_embeddings: c.opt_bool("tie_word_embeddings")?.unwrap_or(d.tie_word_embeddings),
        num_attention_heads: heads,
        num_key_value_heads: c.opt_capped("num_key_value_heads", limits::HEADS)?.unwrap_or(heads),
        head_dim: c.opt_capped("head_dim", limits::HEAD_DIM)?.unwrap_or(d.head_dim.unwrap_or_default()),
        rope_theta,
        partial_rotary_factor: partial,
        layer_types: full_attention
            .iter()
            .map(|&f| if f { LayerAttention::Full } else { LayerAttention::Linear })
            .collect(),
        delta_net: Some(DeltaNetParams {
            linear_num_key_heads: c.opt_capped("linear_num_key_heads", limits::HEADS)?.unwrap_or(16),
            linear_num_value_heads: c.opt_capped("linear_num_value_heads", limits::HEADS)?.unwrap_or(32),
            linear_key_head_dim: c.opt_capped("linear_key_head_dim", limits::HEAD_DIM)?.unwrap_or(128),
            linear_value_head_dim: c.opt_capped("linear_value_head_dim", limits::HEAD_DIM)?.unwrap_or(128),
            linear_conv_kernel_dim: c.opt_capped("linear_conv_kernel_dim", 64)?.unwrap_or(4),
            value_heads_tiled: false,
        }),
        moe: Some(MoeParams {
            num_experts: c.req_capped("num_experts", limits::EXPERTS)?,
            num_experts_per_tok: c.req_capped("num_experts_per_tok", limits::EXPERTS)?,
            moe_intermediate_size: c.req_capped("moe_intermediate_size", limits::INTERMEDIATE)?,
            shared_expert_intermediate_size: c
                .opt_capped("shared_expert_intermediate_size", limits::INTERMEDIATE)?
                .unwrap_or(0),
        }),
        attention_bias: c.opt_bool("attention_bias")? == Some(true),
        ..Hyperparams::default()
    };
    let (moe, dn) = (h.moe.unwrap_or_else(|| unreachable!()), h.delta_net.unwrap_or_else(|| unreachable!()));
    let bad = |msg: String| Err(Error::Mismatch(format!("{}: {msg}", c.path.display())));
    if moe.num_experts_per_tok == 0 || moe.num_experts_per_tok > moe.num_experts {
        return bad(format!("num_experts_per_tok {} is not in 1..={}", moe.num_experts_per_tok, moe.num_experts));
    }
    let rot = h.partial_rotary_dim();
    if !(partial > 0.0 && partial <= 1.0) || rot < 2 || !rot.is_multiple_of(2) {
        return bad(format!(
            "partial_rotary_factor {partial} gives {rot} rotary dims of {} (need an even count >= 2)",
            h.head_dim
        ));
    }
    if dn.linear_num_key_heads == 0 || dn.linear_num_value_heads % dn.linear_num_key_heads.max(1) != 0 {
        return bad(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            dn.linear_num_value_heads, dn.linear_num_key_heads
        ));
    }
    if dn.linear_conv_kernel_dim < 2 {
        return bad(format!("linear_conv_kernel_dim {} (at least 2)", dn.linear_conv_kernel_dim));
    }
    let act = c.opt_str("hidden_act")?.unwrap_or(d.activation);
    if !matches!(act, "silu" | "swish") {
        return Err(Error::Unsupported(format!("activation {} in a qwen3_5_moe model", shown(act))));
    }
    arch::try_model_config(&h).map_err(|msg| Error::Mismatch(format!("{}: {msg}", c.path.display())))
}

/// `Gemma4TextConfig` (the `text_config` of the multimodal model) into its layer specs.
pub(super) fn build_gemma4(c: &Cfg, tensors: &HashMap<String, StoredTensor>) -> Result<ModelConfig> {
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
    // (rope_theta, proportional, partial_rotary_factor) of a layer kind.
    let rope = |kind: &str, theta: f32, proportional: bool, partial: f32| -> Result<(f32, bool, f32)> {
        let key = format!("rope_parameters.{kind}");
        let p = match c.get("rope_parameters").and_then(|r| r.get(kind)) {
            None | Some(Value::Null) => return Ok((theta, proportional, partial)),
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
        Ok((theta, proportional, partial))
    };
    if let Some(r) = c.get("rope_parameters") {
        if !r.is_object() {
            return Err(c.wrong("rope_parameters", "an object of objects per layer type"));
        }
    }
    let heads = c.req_capped("num_attention_heads", limits::HEADS)?;
    let d = arch::gemma4::DEFAULTS;
    let head_dim = c.opt_capped("head_dim", limits::HEAD_DIM)?.unwrap_or(d.head_dim.unwrap_or_default());
    let vocab_size = c.req_capped("vocab_size", limits::VOCAB)?;
    let hidden_size = c.req_capped("hidden_size", limits::HIDDEN)?;
    let intermediate_size = c.req_capped("intermediate_size", limits::INTERMEDIATE)?;
    let num_key_value_heads = c.opt_capped("num_key_value_heads", limits::HEADS)?.unwrap_or(heads);
    let mut full_kv_heads = c.opt_capped("num_global_key_value_heads", limits::HEADS)?;
    let mut full_head_dim = c.opt_capped("global_head_dim", limits::HEAD_DIM)?.unwrap_or(512);
    let k_eq_v = c.opt_bool("attention_k_eq_v")?.unwrap_or(false);
    let attention_bias = c.opt_bool("attention_bias")?.unwrap_or(false);
    let sliding_window = c.opt_capped("sliding_window", limits::CONTEXT)?.unwrap_or(512) as u32;
    let (local_theta, _, _) = rope("sliding_attention", 10_000.0, false, 1.0)?;
    let (rope_theta, full_rope_proportional, partial_rotary_factor) = rope("full_attention", d.rope_theta, true, 0.25)?;
    let final_logit_softcapping = c.opt_f32("final_logit_softcapping")?;
    let rms_norm_eps = c.opt_f32("rms_norm_eps")?.unwrap_or(d.rms_norm_eps);
    let max_position_embeddings =
        c.opt_capped("max_position_embeddings", limits::CONTEXT)?.unwrap_or(d.max_position_embeddings);
    let tie_word_embeddings = c.opt_bool("tie_word_embeddings")?.unwrap_or(d.tie_word_embeddings);
    let ple_dim = c.opt_capped("hidden_size_per_layer_input", limits::HIDDEN)?.unwrap_or(0);
    let ple_vocab = c.opt_capped("vocab_size_per_layer_input", limits::VOCAB)?.unwrap_or(262_144);
    let num_kv_shared_layers = c.opt_capped("num_kv_shared_layers", limits::LAYERS)?.unwrap_or(0);
    let double_wide_mlp = c.opt_bool("use_double_wide_mlp")?.unwrap_or(false);
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
        for (l, dim, kv) in entries {
            let full = full_attention[l];
            if full && !full_seen {
                // The first full layer's entry sets the full layers' shape; the others must agree.
                full_seen = true;
                full_head_dim = dim.unwrap_or(full_head_dim);
                if k_eq_v {
                    full_kv_heads = kv.or(full_kv_heads);
                }
            }
            let (want_dim, want_kv) = match full {
                true if k_eq_v => (full_head_dim, full_kv_heads.unwrap_or(num_key_value_heads)),
                true => (full_head_dim, num_key_value_heads),
                false => (head_dim, num_key_value_heads),
            };
            let (d, k) = (dim.unwrap_or(want_dim), kv.unwrap_or(want_kv));
            if (d, k) != (want_dim, want_kv) {
                return Err(Error::Unsupported(format!(
                    "gemma4 per_layer_config: layer {l} with head_dim {d} and {k} KV heads (its kind has {want_dim} and \
                     {want_kv})"
                )));
            }
        }
    }
    let h = Hyperparams {
        arch: Arch::Gemma4,
        vocab_size,
        hidden_size,
        intermediate_size,
        num_attention_heads: heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        rope_local_theta: Some(local_theta),
        max_position_embeddings,
        layer_types: full_attention
            .iter()
            .map(|&f| if f { LayerAttention::Full } else { LayerAttention::Sliding { window: sliding_window } })
            .collect(),
        tie_word_embeddings,
        attention_bias,
        activation: Activation::GeluTanhGated,
        final_logit_softcapping,
        sliding_window: Some(sliding_window),
        full_layers: FullLayers {
            head_dim: Some(full_head_dim),
            kv_heads: full_kv_heads,
            k_eq_v,
            rope_proportional: full_rope_proportional,
        },
        partial_rotary_factor,
        per_layer_input: (ple_dim > 0).then_some(PerLayerInput { dim: ple_dim, vocab: ple_vocab }),
        num_kv_shared_layers,
        double_wide_mlp,
        ..Hyperparams::default()
    };
    arch::try_model_config(&h).map_err(bad)
}
