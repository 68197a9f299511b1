//! The [`Checkpoint`] of a GGUF file: its metadata read into the architecture's hyperparameters,
//! its tensors under the engine's names.

use super::file::GgufFile;
use super::meta::Meta;
use super::tokenizer::{tokenizer_data, GgufTokenizerData};
use super::value::GgufValue;
use crate::error::{shown, Error, Result};
use crate::loader::{
    capped, check_tensors, drop_shared_kv_tensors, limits as cfg_limits, open_regular, split_halves, validate_config,
    Checkpoint, DataFile, Fixup, StoredTensor, TokenizerSource, END_OF_TURN_TOKENS,
};
use crate::model::arch::{self, Hyperparams};
use crate::model::arch::{DeltaNetParams, FullLayers, MoeParams};
use crate::model::config::{Activation, PerLayerInput};
use crate::model::config::{Arch, LayerAttention, Mixer, ModelConfig};
use std::collections::HashMap;
use std::path::Path;

// ---------------------------------------------------------------------------------------------
// Checkpoint
// ---------------------------------------------------------------------------------------------

/// Opens a GGUF checkpoint: parses and validates the file, builds the [`ModelConfig`] from the
/// metadata and registers the tensors under their GGUF names.
pub fn open(path: &Path) -> Result<Checkpoint> {
    let (file, len) = open_regular(path)?;
    let g = GgufFile::parse_from(std::io::BufReader::with_capacity(1 << 20, &file), len, path)?;
    match g.get("general.architecture").and_then(GgufValue::as_str) {
        Some("qwen35moe") => return open_qwen35moe(&g, DataFile::file(path, file, len), path),
        Some("gemma4") => return open_gemma4(&g, DataFile::file(path, file, len), path),
        _ => {}
    }
    let (config, tok) = build_config(&g, path)?;
    let tensors: HashMap<String, StoredTensor> = g.tensors.iter().map(|t| (t.name.clone(), t.stored())).collect();
    check_tensors(&config, &tensors, path)?;

    let mut fixups = HashMap::new();
    if arch::gguf_permuted_qk(config.arch) {
        // llama.cpp's converter interleaves the rotary halves of Q and K rows (`permute`).
        for (i, spec) in config.layers.iter().enumerate() {
            if let Mixer::Attention(a) = spec.mixer {
                fixups.insert(format!("blk.{i}.attn_q.weight"), Fixup::UnpermuteRope { heads: a.heads });
                fixups.insert(format!("blk.{i}.attn_k.weight"), Fixup::UnpermuteRope { heads: a.kv_heads });
            }
        }
    }

    let token_str = |id: Option<u32>| id.and_then(|i| tok.tokens.get(i as usize)).cloned();
    let bos_token = token_str(tok.bos_token_id);
    let eos_token = token_str(tok.eos_token_id);
    let m = Meta { g: &g, path, arch: "" };
    let chat_template = m.opt_str("tokenizer.chat_template")?.map(str::to_string);

    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tokenizer: TokenizerSource::Gguf(tok),
        chat_template,
        bos_token,
        eos_token,
        tensors,
        files: vec![DataFile::file(path, file, len)],
        fixups,
    })
}

/// A `qwen35moe` GGUF (llama.cpp's Qwen3.5-MoE layout): the config from its metadata, its
/// tensors under the engine's names. llama.cpp's converter stores the `(1 + w)` norms with the 1
/// added, `ssm_a = -exp(A_log)` (undone by [`Fixup::LnNeg`]), q and its output gate fused per
/// head in `attn_q` (split as transformers' `q_proj` is), and the linear layers' value heads
/// tiled over the key heads ([`DeltaNetSpec::kv_tiled`](crate::model::config::DeltaNetSpec)),
/// which the engine runs as stored.
fn open_qwen35moe(g: &GgufFile, data: DataFile, path: &Path) -> Result<Checkpoint> {
    let m = Meta { g, path, arch: "qwen35moe" };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let num_layers = m.layer_count()?;
    let heads = m.req_capped(&m.key("attention.head_count"), cfg_limits::HEADS)?;
    let head_dim = m.req_capped(&m.key("attention.key_length"), cfg_limits::HEAD_DIM)?;
    if let Some(vd) = m.opt_usize(&m.key("attention.value_length"))? {
        if vd != head_dim {
            return Err(mismatch(format!("attention.value_length {vd} differs from attention.key_length {head_dim}")));
        }
    }
    let rot = m.opt_usize(&m.key("rope.dimension_count"))?.unwrap_or(head_dim / 4);
    // Full attention layers: those `attention.recurrent_layers` marks false, else every
    // `full_attention_interval`-th (default 4).
    let full_attention: Vec<bool> = match m.opt_array(&m.key("attention.recurrent_layers"))? {
        Some(a) => {
            if a.len() != num_layers {
                return Err(mismatch(format!(
                    "attention.recurrent_layers has {} entries for {num_layers} layers",
                    a.len()
                )));
            }
            a.iter()
                .map(|v| v.as_bool().map(|r| !r).ok_or_else(|| m.wrong("attention.recurrent_layers", "bools", v)))
                .collect::<Result<_>>()?
        }
        None => {
            let interval = m.opt_usize(&m.key("full_attention_interval"))?.unwrap_or(4).max(1);
            (0..num_layers).map(|i| (i + 1) % interval == 0).collect()
        }
    };
    let req = |k: &str, limit| m.req_capped(&m.key(k), limit);
    let v_heads = req("ssm.time_step_rank", cfg_limits::HEADS)?;
    let inner = req("ssm.inner_size", cfg_limits::INTERMEDIATE)?;
    if v_heads == 0 || inner % v_heads != 0 {
        return Err(mismatch(format!("ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {v_heads}")));
    }
    let no_vocab = m.opt_str("tokenizer.ggml.model")? == Some("none");
    let tok = if no_vocab { None } else { Some(tokenizer_data(&m, Arch::Qwen35Moe)?) };
    let vocab_size = vocab_rows(g, tok.as_ref(), path)?;
    let h = Hyperparams {
        arch: Arch::Qwen35Moe,
        vocab_size,
        hidden_size: req("embedding_length", cfg_limits::HIDDEN)?,
        rms_norm_eps: m.opt_f32(&m.key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-6),
        max_position_embeddings: req("context_length", cfg_limits::CONTEXT)?,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        num_attention_heads: heads,
        num_key_value_heads: m.opt_usize(&m.key("attention.head_count_kv"))?.unwrap_or(heads),
        head_dim,
        rope_theta: m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000_000.0),
        partial_rotary_factor: rot as f32 / head_dim.max(1) as f32,
        layer_types: full_attention
            .iter()
            .map(|&f| if f { LayerAttention::Full } else { LayerAttention::Linear })
            .collect(),
        delta_net: Some(DeltaNetParams {
            linear_num_key_heads: req("ssm.group_count", cfg_limits::HEADS)?,
            linear_num_value_heads: v_heads,
            linear_key_head_dim: req("ssm.state_size", cfg_limits::HEAD_DIM)?,
            linear_value_head_dim: inner / v_heads,
            linear_conv_kernel_dim: m.req_capped(&m.key("ssm.conv_kernel"), 64)?,
            value_heads_tiled: true,
        }),
        moe: Some(MoeParams {
            num_experts: req("expert_count", cfg_limits::EXPERTS)?,
            num_experts_per_tok: req("expert_used_count", cfg_limits::EXPERTS)?,
            moe_intermediate_size: req("expert_feed_forward_length", cfg_limits::INTERMEDIATE)?,
            shared_expert_intermediate_size: m
                .opt_usize(&m.key("expert_shared_feed_forward_length"))?
                .map(|v| capped(path, "expert_shared_feed_forward_length", v, cfg_limits::INTERMEDIATE))
                .transpose()?
                .unwrap_or(0),
        }),
        attention_bias: false,
        ..Hyperparams::default()
    };
    if h.partial_rotary_dim() != rot || rot < 2 || rot % 2 != 0 || rot > head_dim {
        return Err(mismatch(format!("rope.dimension_count {rot} of head dimension {head_dim}")));
    }

    let mut config = arch::try_model_config(&h).map_err(mismatch)?;
    if let Some(t) = &tok {
        config.bos_token_id = t.bos_token_id;
        config.eos_token_ids = stop_ids(t);
        config.add_bos = t.add_bos_token;
    }
    // llama.cpp's names -> the engine's (the architecture's mapping); `a|b` names are split into
    // halves below.
    let mut tensors = HashMap::new();
    let mut fixups = HashMap::new();
    for t in &g.tensors {
        let st = t.stored();
        let (layer, rest) = match t.name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((l, rest)) => (Some(l), rest),
            None => (None, t.name.as_str()),
        };
        let full = layer
            .and_then(|l| l.parse::<usize>().ok())
            .is_some_and(|l| h.layer_types.get(l) == Some(&LayerAttention::Full));
        let mapped = arch::gguf_tensor(Arch::Qwen35Moe, rest, full);
        let name = match layer {
            Some(l) => format!("blk.{l}.{}", mapped.name),
            None => mapped.name.to_string(),
        };
        let st =
            if mapped.as_row && st.shape.len() == 1 { StoredTensor { shape: vec![1, st.shape[0]], ..st } } else { st };
        if mapped.neg_exp {
            fixups.insert(name.clone(), Fixup::LnNeg);
        }
        tensors.insert(name, st);
    }
    split_halves(&mut tensors, &config, path)?;
    check_tensors(&config, &tensors, path)?;
    validate_config(&config, path)?;
    let token_str = |id: Option<u32>| tok.as_ref().and_then(|t| id.and_then(|i| t.tokens.get(i as usize)).cloned());
    let (bos_token, eos_token) = (token_str(config.bos_token_id), token_str(config.eos_token_ids.first().copied()));
    let chat_template = m.opt_str("tokenizer.chat_template")?.map(str::to_string);
    Ok(Checkpoint {
        path: path.to_path_buf(),
        config,
        tokenizer: tok.map_or(TokenizerSource::None, TokenizerSource::Gguf),
        chat_template,
        bos_token,
        eos_token,
        tensors,
        files: vec![data],
        fixups,
    })
}

/// A `gemma4` GGUF (llama.cpp's Gemma 4 layout): the config from its metadata (sliding and full
/// layers by `attention.sliding_window_pattern`, their head dims by `attention.key_length_swa` /
/// `key_length`, their KV heads by the per-layer `attention.head_count_kv`), keys as values on the
/// full layers where they have no `attn_v`, and the full layers' proportional RoPE from the
/// `rope_freqs` factors (1 for the pairs that turn, ~1e30 for those that do not). Tensor names are
/// the engine's own; norms are stored as they are used (plain w).
fn open_gemma4(g: &GgufFile, data: DataFile, path: &Path) -> Result<Checkpoint> {
    let m = Meta { g, path, arch: "gemma4" };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let num_layers = m.layer_count()?;
    if num_layers == 0 {
        return Err(mismatch(format!("{} is 0", m.key("block_count"))));
    }
    let req = |k: &str, limit| m.req_capped(&m.key(k), limit);
    if m.opt_usize(&m.key("expert_count"))?.unwrap_or(0) > 0 {
        return Err(Error::Unsupported(format!("gemma4 mixture-of-experts blocks ({})", m.key("expert_count"))));
    }
    let ple_dim = m.opt_usize(&m.key("embedding_length_per_layer_input"))?.unwrap_or(0);
    let ple_dim = capped(path, &m.key("embedding_length_per_layer_input"), ple_dim, cfg_limits::HIDDEN)?;
    let shared = m.opt_usize(&m.key("attention.shared_kv_layers"))?.unwrap_or(0);
    if shared > num_layers {
        return Err(mismatch(format!("attention.shared_kv_layers {shared} of {num_layers} layers")));
    }
    let pattern_key = m.key("attention.sliding_window_pattern");
    let pattern = m.opt_array(&pattern_key)?.ok_or_else(|| m.missing(&pattern_key))?;
    if pattern.len() != num_layers {
        return Err(mismatch(format!("{pattern_key} has {} entries for {num_layers} layers", pattern.len())));
    }
    let full_attention: Vec<bool> = pattern
        .iter()
        .map(|v| match (v.as_bool(), v.as_u64()) {
            (Some(b), _) => Ok(!b),
            (None, Some(n)) => Ok(n == 0),
            _ => Err(m.wrong(&pattern_key, "bools", v)),
        })
        .collect::<Result<_>>()?;
    let heads = req("attention.head_count", cfg_limits::HEADS)?;
    let kv_key = m.key("attention.head_count_kv");
    let kv_per_layer = m.per_layer(&kv_key, num_layers)?.unwrap_or_else(|| vec![heads; num_layers]);
    // One KV head count per layer kind.
    let kind_kv = |full: bool| -> Result<usize> {
        let mut v = kv_per_layer.iter().zip(&full_attention).filter(|(_, &f)| f == full).map(|(&k, _)| k);
        let first = v.next().unwrap_or(heads);
        match v.find(|&k| k != first) {
            Some(other) => Err(Error::Unsupported(format!("{kv_key}: {first} and {other} KV heads in one layer kind"))),
            None => Ok(capped(path, &kv_key, first, cfg_limits::HEADS)?),
        }
    };
    let (sliding_kv, full_kv) = (kind_kv(false)?, kind_kv(true)?);
    let head_dim = req("attention.key_length_swa", cfg_limits::HEAD_DIM)?;
    let global_head_dim = req("attention.key_length", cfg_limits::HEAD_DIM)?;
    for (k, want) in [("attention.value_length_swa", head_dim), ("attention.value_length", global_head_dim)] {
        if let Some(v) = m.opt_usize(&m.key(k))?.filter(|&v| v != want) {
            return Err(Error::Unsupported(format!("{} {v} different from the key length {want}", m.key(k))));
        }
    }
    for (k, want) in [("rope.dimension_count_swa", head_dim), ("rope.dimension_count", global_head_dim)] {
        if let Some(v) = m.opt_usize(&m.key(k))?.filter(|&v| v != want) {
            return Err(Error::Unsupported(format!("{} {v} of head dimension {want} (partial rotary)", m.key(k))));
        }
    }
    // Keys as values: the full layers that project their own KV have no attn_v.
    let k_eq_v =
        (0..num_layers - shared).any(|l| full_attention[l] && g.tensor(&format!("blk.{l}.attn_v.weight")).is_none());
    if !k_eq_v && full_kv != sliding_kv {
        return Err(Error::Unsupported(format!(
            "{kv_key}: {full_kv} KV heads on full layers, {sliding_kv} on sliding ones, with a v projection"
        )));
    }
    let tok = tokenizer_data(&m, Arch::Gemma4)?;
    let vocab_size = vocab_rows(g, Some(&tok), path)?;
    let ffn_key = m.key("feed_forward_length");
    let ffn = m.per_layer(&ffn_key, num_layers)?.ok_or_else(|| m.missing(&ffn_key))?;
    let double_wide = ffn.iter().any(|&f| f != ffn[0]);
    let want_ffn = |l: usize| if double_wide && l >= num_layers - shared { 2 * ffn[0] } else { ffn[0] };
    if let Some(l) = (0..num_layers).find(|&l| ffn[l] != want_ffn(l)) {
        return Err(Error::Unsupported(format!(
            "{ffn_key}: layer {l} is {} wide (one width, or twice it on the shared KV layers)",
            ffn[l]
        )));
    }
    let ple_vocab =
        g.tensor("per_layer_token_embd.weight").and_then(|t| t.shape.first().copied()).unwrap_or(vocab_size);
    // llama.cpp caps at 30 when the key is absent; 0 turns it off.
    let cap = m.opt_f32(&m.key("final_logit_softcapping"))?.unwrap_or(30.0);
    let window =
        m.opt_u32(&m.key("attention.sliding_window"))?.ok_or_else(|| m.missing(&m.key("attention.sliding_window")))?;
    let mut h = Hyperparams {
        arch: Arch::Gemma4,
        vocab_size,
        hidden_size: req("embedding_length", cfg_limits::HIDDEN)?,
        // One width, or per layer with the shared-KV layers' twice the others' (double-wide MLPs).
        intermediate_size: capped(path, &ffn_key, ffn[0], cfg_limits::INTERMEDIATE)?,
        num_attention_heads: heads,
        num_key_value_heads: sliding_kv,
        head_dim,
        // Full layers' RoPE kind: set from rope_freqs below.
        full_layers: FullLayers {
            head_dim: Some(global_head_dim),
            kv_heads: Some(full_kv),
            k_eq_v,
            rope_proportional: false,
        },
        attention_bias: false,
        layer_types: full_attention
            .iter()
            .map(|&f| if f { LayerAttention::Full } else { LayerAttention::Sliding { window } })
            .collect(),
        sliding_window: Some(window),
        rope_local_theta: Some(m.opt_f32(&m.key("rope.freq_base_swa"))?.unwrap_or(10_000.0)),
        rope_theta: m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000.0),
        partial_rotary_factor: 1.0,
        final_logit_softcapping: (cap != 0.0).then_some(cap),
        rms_norm_eps: m
            .opt_f32(&m.key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| m.missing(&m.key("attention.layer_norm_rms_epsilon")))?,
        max_position_embeddings: req("context_length", cfg_limits::CONTEXT)?,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        activation: Activation::GeluTanhGated,
        bos_token_id: tok.bos_token_id,
        eos_token_ids: stop_ids(&tok),
        per_layer_input: (ple_dim > 0).then_some(PerLayerInput { dim: ple_dim, vocab: ple_vocab }),
        num_kv_shared_layers: shared,
        double_wide_mlp: double_wide,
        ..Hyperparams::default()
    };
    let tensors: HashMap<String, StoredTensor> = g.tensors.iter().map(|t| (t.name.clone(), t.stored())).collect();
    // The config is set below, once rope_freqs (read through the checkpoint) has said the RoPE.
    let mut ck = Checkpoint {
        path: path.to_path_buf(),
        config: arch::model_config(&h),
        tokenizer: TokenizerSource::None,
        chat_template: m.opt_str("tokenizer.chat_template")?.map(str::to_string),
        bos_token: h.bos_token_id.and_then(|i| tok.tokens.get(i as usize)).cloned(),
        eos_token: h.eos_token_ids.first().and_then(|&i| tok.tokens.get(i as usize)).cloned(),
        tensors,
        files: vec![data],
        fixups: HashMap::new(),
    };
    if ck.has("rope_freqs.weight") {
        // Proportional RoPE: a run of factor 1 (the pairs that turn), then factors that stop the
        // rest (llama.cpp: angle / factor; 1e30 makes it 0 to f32 precision).
        let factors = ck.raw("rope_freqs.weight")?.to_f32()?;
        ck.tensors.remove("rope_freqs.weight");
        let turning = factors.iter().take_while(|&&x| x == 1.0).count();
        if factors.len() != global_head_dim / 2
            || factors[turning..].iter().any(|&x| x.is_nan() || x < 1e20)
            || turning == 0
        {
            return Err(Error::Unsupported(format!(
                "rope_freqs factors other than a run of 1 then >= 1e20 ({} factors for head dimension {global_head_dim})",
                factors.len()
            )));
        }
        h.full_layers.rope_proportional = true;
        // Halfway between `turning` and `turning + 1` pairs: Gemma4Config::full_rotary_dim's
        // floor gives `turning` whatever the f32 rounding of the fraction.
        h.partial_rotary_factor = (2 * turning + 1) as f32 / global_head_dim as f32;
    }
    ck.config = arch::try_model_config(&h).map_err(mismatch)?;
    ck.config.add_bos = tok.add_bos_token;
    drop_shared_kv_tensors(&ck.config, &mut ck.tensors);
    ck.tokenizer = if tok.tokens.is_empty() { TokenizerSource::None } else { TokenizerSource::Gguf(tok) };
    check_tensors(&ck.config, &ck.tensors, path)?;
    validate_config(&ck.config, path)?;
    Ok(ck)
}

/// The vocabulary size: `token_embd.weight`'s rows, which must equal the tokenizer's tokens.
fn vocab_rows(g: &GgufFile, tok: Option<&GgufTokenizerData>, path: &Path) -> Result<usize> {
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));
    let rows = match g.tensor("token_embd.weight") {
        Some(t) => t.shape.first().copied().unwrap_or(0),
        None => return Err(mismatch("tensor token_embd.weight is missing".into())),
    };
    if let Some(tok) = tok.filter(|t| !t.tokens.is_empty() && t.tokens.len() != rows) {
        return Err(mismatch(format!(
            "the vocabulary has {} tokens but token_embd.weight has {rows} rows (they must be equal)",
            tok.tokens.len()
        )));
    }
    let rows = capped(path, "token_embd.weight rows (vocabulary size)", rows, cfg_limits::VOCAB)?;
    if rows == 0 {
        return Err(mismatch("the vocabulary is empty (token_embd.weight has no rows)".into()));
    }
    Ok(rows)
}

/// The ids that end generation: eos, eot and eom, and the end-of-turn tokens of
/// [`END_OF_TURN_TOKENS`] in the vocabulary.
pub(super) fn stop_ids(tok: &GgufTokenizerData) -> Vec<u32> {
    let mut ids = Vec::new();
    let ends = [tok.eos_token_id, tok.eot_token_id, tok.eom_token_id];
    let named = END_OF_TURN_TOKENS.iter().map(|t| tok.token_id(t));
    for id in ends.into_iter().chain(named).flatten() {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

fn build_config(g: &GgufFile, path: &Path) -> Result<(ModelConfig, GgufTokenizerData)> {
    let arch_name = match g.get("general.architecture") {
        None => return Err(Error::corrupt(path, "required metadata general.architecture is missing")),
        Some(v) => {
            v.as_str().ok_or_else(|| Error::corrupt(path, format!("general.architecture is {}", v.describe())))?
        }
    };
    let arch = match Arch::parse(arch_name) {
        // Its own builder: `open_qwen35moe`.
        Some(Arch::Qwen35Moe) => {
            return Err(Error::Unsupported(format!(
                "architecture {} spelled other than llama.cpp's qwen35moe (in {})",
                shown(arch_name),
                path.display()
            )))
        }
        Some(Arch::Gemma4) => return Err(Error::Unsupported("gemma4 GGUF files".into())),
        Some(a) => a,
        None => return Err(Error::Unsupported(format!("architecture {} (in {})", shown(arch_name), path.display()))),
    };
    let m = Meta { g, path, arch: arch_name };
    let mismatch = |msg: String| Error::Mismatch(format!("{}: {msg}", path.display()));

    // The layer count first, before anything is sized by it.
    let num_layers = m.layer_count()?;
    let hidden = m.req_capped(&m.key("embedding_length"), cfg_limits::HIDDEN)?;
    let ffn_key = m.key("feed_forward_length");
    let intermediate = m.uniform_usize(&ffn_key)?.ok_or_else(|| m.missing(&ffn_key))?;
    let intermediate = capped(path, &ffn_key, intermediate, cfg_limits::INTERMEDIATE)?;
    let heads_key = m.key("attention.head_count");
    let num_heads = m.uniform_usize(&heads_key)?.ok_or_else(|| m.missing(&heads_key))?;
    let num_heads = capped(path, &heads_key, num_heads, cfg_limits::HEADS)?;
    let kv_key = m.key("attention.head_count_kv");
    let num_kv_heads = m.uniform_usize(&kv_key)?.unwrap_or(num_heads);
    let num_kv_heads = capped(path, &kv_key, num_kv_heads, cfg_limits::HEADS)?;
    let max_pos = m.req_capped(&m.key("context_length"), cfg_limits::CONTEXT)?;
    for (what, v) in [
        ("embedding_length", hidden),
        ("block_count", num_layers),
        ("feed_forward_length", intermediate),
        ("attention.head_count", num_heads),
        ("attention.head_count_kv", num_kv_heads),
        ("context_length", max_pos),
    ] {
        if v == 0 {
            return Err(mismatch(format!("{arch_name}.{what} is 0")));
        }
    }
    if num_heads % num_kv_heads != 0 {
        return Err(mismatch(format!(
            "attention.head_count {num_heads} is not a multiple of attention.head_count_kv {num_kv_heads}"
        )));
    }
    let head_dim = match m.opt_usize(&m.key("attention.key_length"))? {
        Some(d) => capped(path, &m.key("attention.key_length"), d, cfg_limits::HEAD_DIM)?,
        None => {
            if hidden % num_heads != 0 {
                return Err(mismatch(format!(
                    "embedding_length {hidden} is not a multiple of attention.head_count {num_heads} \
                     (and attention.key_length is absent)"
                )));
            }
            hidden / num_heads
        }
    };
    if let Some(vd) = m.opt_usize(&m.key("attention.value_length"))? {
        if vd != head_dim {
            return Err(Error::Unsupported(format!(
                "attention.value_length {vd} different from attention.key_length {head_dim}"
            )));
        }
    }
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(mismatch(format!("head dimension {head_dim} must be even and non-zero (RoPE)")));
    }
    // llama.cpp rotates the first `rope.dimension_count` dimensions of each head (default: all).
    // The engine rotates all of them: anything else would run and give wrong text.
    let rot_key = m.key("rope.dimension_count");
    if let Some(n) = m.opt_u64(&rot_key)? {
        if n != head_dim as u64 {
            return Err(Error::Unsupported(format!(
                "{}: {rot_key} = {n}: rotary embeddings on part of a head (the head dimension is {head_dim}; \
                 this engine rotates all of it)",
                path.display()
            )));
        }
    }
    if num_heads.checked_mul(head_dim).is_none() {
        return Err(mismatch(format!("{num_heads} heads × {head_dim} overflows")));
    }
    let eps_key = m.key("attention.layer_norm_rms_epsilon");
    let rms_norm_eps = m.opt_f32(&eps_key)?.ok_or_else(|| m.missing(&eps_key))?;
    if rms_norm_eps.is_nan() || rms_norm_eps < 0.0 {
        return Err(mismatch(format!("{eps_key} = {rms_norm_eps}")));
    }
    let rope_theta = m.opt_f32(&m.key("rope.freq_base"))?.unwrap_or(10_000.0);
    if rope_theta <= 0.0 {
        return Err(mismatch(format!("rope.freq_base = {rope_theta}")));
    }
    // RoPE scaling: llama.cpp reads `rope.scaling.factor`, else the older `rope.scale_linear`;
    // the type defaults to linear.
    let factor = match m.opt_f32(&m.key("rope.scaling.factor"))? {
        Some(f) => Some(f),
        None => m.opt_f32(&m.key("rope.scale_linear"))?,
    };
    let factor = factor.filter(|&f| f != 0.0 && f != 1.0);
    let rope_scaling_factor = match (m.opt_str(&m.key("rope.scaling.type"))?, factor) {
        (_, None) | (Some("none"), _) => 1.0,
        (None | Some("linear"), Some(f)) if f > 0.0 => f,
        (None | Some("linear"), Some(f)) => return Err(mismatch(format!("rope.scaling.factor = {f}"))),
        (Some(other), Some(f)) => {
            return Err(Error::Unsupported(format!("RoPE scaling type {} (factor {f})", shown(other))));
        }
    };
    if g.tensor("rope_freqs.weight").is_some() {
        return Err(Error::Unsupported(
            "per-dimension RoPE frequency factors (rope_freqs.weight, Llama 3.1-style scaling)".into(),
        ));
    }
    let final_logit_softcapping = m.opt_f32(&m.key("final_logit_softcapping"))?.filter(|&c| c > 0.0);

    // Tokenizer.
    let tok = tokenizer_data(&m, arch)?;

    let vocab_size = vocab_rows(g, Some(&tok), path)?;
    let eos_token_ids = stop_ids(&tok);

    // Gemma 3: llama.cpp's fixed pattern of sliding layers, its window from the metadata.
    let layer_types = match arch::defaults(arch).sliding_window_pattern {
        None => vec![LayerAttention::Full; num_layers],
        Some(pattern) => {
            let sw_key = m.key("attention.sliding_window");
            let window = m.opt_u32(&sw_key)?.ok_or_else(|| m.missing(&sw_key))?;
            if window == 0 {
                return Err(mismatch(format!("{sw_key} is 0")));
            }
            (0..num_layers)
                .map(|i| if (i + 1) % pattern == 0 { LayerAttention::Full } else { LayerAttention::Sliding { window } })
                .collect()
        }
    };
    let mut config = arch::model_config(&Hyperparams {
        arch,
        vocab_size,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_attention_heads: num_heads,
        num_key_value_heads: num_kv_heads,
        head_dim,
        rms_norm_eps,
        rope_theta,
        rope_local_theta: None,
        rope_scaling_factor,
        max_position_embeddings: max_pos,
        layer_types,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        attention_bias: g.tensor("blk.0.attn_q.bias").is_some(),
        activation: arch::activation(arch::defaults(arch).activation).expect("a known default activation"),
        query_pre_attn_scalar: None,
        final_logit_softcapping,
        ..Hyperparams::default()
    });
    config.bos_token_id = tok.bos_token_id;
    config.eos_token_ids = eos_token_ids;
    config.add_bos = tok.add_bos_token;
    validate_config(&config, path)?;
    Ok((config, tok))
}
