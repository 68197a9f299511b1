//! Uploading a checkpoint's weights to the GPU in the layout the layer loop computes with.
//!
//! Linear weights are f16 (dequantized on load), norms and biases f32. Projections that read
//! the same input are concatenated along their output rows so one dispatch computes them:
//! `qkv` = [q; k; v] (rows H*D + 2*Hkv*D) and `gate_up` = [gate; up] (rows 2F).
//! The embedding table and the lm_head are split into row chunks that each fit the device's
//! max storage binding (a tied lm_head shares the embedding's chunks).

use super::config::ModelConfig;
use crate::error::{Error, Result};
use crate::gpu::{Gpu, Tensor};
use crate::loader::Checkpoint;
use crate::ops::embedding::upload_row_chunks;
use half::f16;

pub struct LayerWeights {
    pub attn_norm: Tensor,
    /// [q; k; v] rows, f16 [H*D + 2*Hkv*D, hidden].
    pub qkv: Tensor,
    pub qkv_bias: Option<Tensor>,
    /// Per-head norms of q and k, f32 [D] each.
    pub qk_norm: Option<(Tensor, Tensor)>,
    pub attn_out: Tensor,
    pub post_attn_norm: Option<Tensor>,
    pub ffn_norm: Tensor,
    /// [gate; up] rows, f16 [2F, hidden].
    pub gate_up: Tensor,
    pub down: Tensor,
    pub post_ffw_norm: Option<Tensor>,
}

pub struct Weights {
    /// (first row, chunk) of the f16 embedding table [vocab, hidden].
    pub embed: Vec<(u32, Tensor)>,
    /// (first row, chunk) of the f16 lm_head [vocab, hidden].
    pub lm_head: Vec<(u32, Tensor)>,
    pub output_norm: Tensor,
    pub layers: Vec<LayerWeights>,
    /// Bytes uploaded.
    pub bytes: u64,
}

/// Reads and uploads every weight; `progress(done, total)` is called after each tensor.
pub fn load(gpu: &Gpu, ck: &Checkpoint, progress: &mut dyn FnMut(usize, usize)) -> Result<Weights> {
    let c: &ModelConfig = &ck.config;
    let (h, d) = (c.hidden_size, c.head_dim);
    let (qd, kvd, f) = (c.q_dim(), c.kv_dim(), c.intermediate_size);
    let total = 3 + c.num_layers;
    let mut bytes = 0u64;
    let mut up16 = |name: &str, shape: &[usize], data: &[f16]| -> Result<Tensor> {
        bytes += 2 * data.len() as u64;
        gpu.upload_f16(name, shape, data)
    };
    let norm =
        |name: &str, n: usize| -> Result<Tensor> { gpu.upload_f32(name, &[n], &finite32(name, ck.f32(name, &[n])?)?) };
    let f16 = |name: &str, shape: &[usize]| finite16(name, ck.f16(name, shape)?);

    let emb = f16("token_embd.weight", &[c.vocab_size, h])?;
    let embed = upload_row_chunks(gpu, "token_embd", &emb, c.vocab_size, h)?;
    progress(1, total);
    let lm_head = if ck.has("output.weight") {
        let w = f16("output.weight", &[c.vocab_size, h])?;
        upload_row_chunks(gpu, "output", &w, c.vocab_size, h)?
    } else {
        embed.clone()
    };
    progress(2, total);
    let output_norm = norm("output_norm.weight", h)?;
    progress(3, total);

    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mut qkv = f16(&n("attn_q.weight"), &[qd, h])?;
        qkv.extend(f16(&n("attn_k.weight"), &[kvd, h])?);
        qkv.extend(f16(&n("attn_v.weight"), &[kvd, h])?);
        let qkv_bias = if c.attention_bias {
            let mut b = finite32(&n("attn_q.bias"), ck.f32(&n("attn_q.bias"), &[qd])?)?;
            b.extend(finite32(&n("attn_k.bias"), ck.f32(&n("attn_k.bias"), &[kvd])?)?);
            b.extend(finite32(&n("attn_v.bias"), ck.f32(&n("attn_v.bias"), &[kvd])?)?);
            Some(gpu.upload_f32(&n("attn_qkv.bias"), &[qd + 2 * kvd], &b)?)
        } else {
            None
        };
        let qk_norm = if c.qk_norm {
            Some((norm(&n("attn_q_norm.weight"), d)?, norm(&n("attn_k_norm.weight"), d)?))
        } else {
            None
        };
        let mut gate_up = f16(&n("ffn_gate.weight"), &[f, h])?;
        gate_up.extend(f16(&n("ffn_up.weight"), &[f, h])?);
        let (post_attn_norm, post_ffw_norm) = if c.sandwich_norm {
            (Some(norm(&n("post_attention_norm.weight"), h)?), Some(norm(&n("post_ffw_norm.weight"), h)?))
        } else {
            (None, None)
        };
        layers.push(LayerWeights {
            attn_norm: norm(&n("attn_norm.weight"), h)?,
            qkv: up16(&n("attn_qkv.weight"), &[qd + 2 * kvd, h], &qkv)?,
            qkv_bias,
            qk_norm,
            attn_out: up16(&n("attn_output.weight"), &[h, qd], &f16(&n("attn_output.weight"), &[h, qd])?)?,
            post_attn_norm,
            ffn_norm: norm(&n("ffn_norm.weight"), h)?,
            gate_up: up16(&n("ffn_gate_up.weight"), &[2 * f, h], &gate_up)?,
            down: up16(&n("ffn_down.weight"), &[h, f], &f16(&n("ffn_down.weight"), &[h, f])?)?,
            post_ffw_norm,
        });
        progress(4 + i, total);
    }
    bytes += 2 * (emb.len() as u64) * if ck.has("output.weight") { 2 } else { 1 };
    gpu.wait()?;
    Ok(Weights { embed, lm_head, output_norm, layers, bytes })
}

/// The values of `name` if they are all finite. A NaN or an infinity in a weight (a block scale
/// that is NaN or inf, or a value beyond the f16 range the GPU copy holds) makes every logit that
/// reads it NaN: the file is corrupt, and saying so at load beats streaming noise.
fn finite16(name: &str, data: Vec<f16>) -> Result<Vec<f16>> {
    match data.iter().position(|x| !x.is_finite()) {
        None => Ok(data),
        Some(i) => Err(non_finite(name, i, data.iter().filter(|x| !x.is_finite()).count(), data.len())),
    }
}

fn finite32(name: &str, data: Vec<f32>) -> Result<Vec<f32>> {
    match data.iter().position(|x| !x.is_finite()) {
        None => Ok(data),
        Some(i) => Err(non_finite(name, i, data.iter().filter(|x| !x.is_finite()).count(), data.len())),
    }
}

fn non_finite(name: &str, first: usize, count: usize, len: usize) -> Error {
    Error::Mismatch(format!(
        "tensor {name} holds {count} non-finite values of {len} (the first at element {first}) after \
         dequantization: a NaN or infinite block scale, or a value beyond the f16 range; the file is corrupt"
    ))
}
