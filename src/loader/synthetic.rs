//! Synthetic checkpoints: a real model's architecture, shapes and tensor types with random weights
//! scaled like trained ones, built in memory, so throughput can be measured at any size without
//! carrying files (`wgpu-llm bench --synthetic qwen2.5-1.5b:q4_k_m`).
//!
//! Weights are never zero and give finite activations: a linear weight `[N, K]` is drawn with
//! standard deviation `1/√K` (a normalized input gives unit-scale outputs, so the residual
//! stream grows like √layers), the embedding with 0.05 (tied) or 0.02, the lm_head with
//! `2/√hidden` (logits of standard deviation ~2), norms near 1, biases small. Quantized tensors
//! tile a pool of random blocks of their type: 32-element blocks quantized from Gaussian values
//! by ggml's reference quantizers ([`super::dtype::quantize`]), k-quant super-blocks built
//! directly with zero-mean sub-blocks. The speed of a kernel depends on the types and shapes,
//! not on the values; the text such a model writes is noise, and it has no tokenizer.
//!
//! Spec: `NAME:RECIPE`, NAME one of [`PRESETS`], RECIPE one of `f32`, `f16`, `q8_0`, `q4_0`,
//! `q4_1`, `q5_0`, `q5_1`, `q4_k_m` (llama.cpp's mix: Q4_K, with Q6_K for the output and for
//! `attn_v` / `ffn_down` of the layers llama.cpp gives more bits; types whose super-block does
//! not divide a row fall back as llama.cpp does: Q4_K → Q5_0, Q6_K → Q8_0), `mlx4`, `mlx8`
//! (mlx-lm's `convert -q`: every linear layer and the embedding in MLX affine 4 or 8 bits, group
//! 64, bf16 scales and biases).

use super::dtype::{quantize, DType, QK_K};
use super::{Checkpoint, DataFile, DataSource, Role, StoredTensor, TokenizerSource};
use crate::error::{Error, Result};
use crate::model::arch::{self, Hyperparams};
use crate::model::config::{Activation, Arch, LayerAttention, ModelConfig};
use half::f16;
use std::collections::HashMap;
use std::path::PathBuf;

/// The architectures a synthetic checkpoint can copy (the shapes of the real checkpoints of
/// `tools/fetch-model.sh` and of the GPU machine's shape recipes).
pub const PRESETS: [&str; 6] =
    ["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b", "gemma3-270m", "qwen3.5-35b-a3b", "gemma-4-31b"];

/// Quantization recipes.
pub const RECIPES: [&str; 10] = ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "mlx4", "mlx8"];

/// The hyperparameters of a dense preset (`None` for the presets with their own config:
/// Qwen3.5-MoE, Gemma 4), what the real checkpoint's metadata says.
pub fn preset_hyperparams(name: &str) -> Option<Hyperparams> {
    let llama_like = |arch, vocab, hidden, ffn, layers, heads, kv, head_dim, theta, eps, ctx, tied, bias| Hyperparams {
        arch,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_attention_heads: heads,
        num_key_value_heads: kv,
        head_dim,
        rms_norm_eps: eps,
        rope_theta: theta,
        rope_local_theta: None,
        rope_scaling_factor: 1.0,
        max_position_embeddings: ctx,
        layer_types: vec![LayerAttention::Full; layers],
        tie_word_embeddings: tied,
        attention_bias: bias,
        activation: Activation::SiluGated,
        query_pre_attn_scalar: None,
        final_logit_softcapping: None,
        ..Hyperparams::default()
    };
    Some(match name {
        "smollm2-135m" => llama_like(Arch::Llama, 49152, 576, 1536, 30, 9, 3, 64, 1e5, 1e-5, 8192, true, false),
        "qwen2.5-0.5b" => llama_like(Arch::Qwen2, 151936, 896, 4864, 24, 14, 2, 64, 1e6, 1e-6, 32768, false, true),
        "qwen2.5-1.5b" => llama_like(Arch::Qwen2, 151936, 1536, 8960, 28, 12, 2, 128, 1e6, 1e-6, 32768, false, true),
        "gemma3-270m" => {
            let mut h = llama_like(Arch::Gemma3, 262144, 640, 2048, 18, 4, 1, 256, 1e6, 1e-6, 32768, true, false);
            h.rope_local_theta = Some(1e4);
            // Five sliding-window layers, then a global one.
            h.layer_types = (0..18)
                .map(|l| if l % 6 == 5 { LayerAttention::Full } else { LayerAttention::Sliding { window: 512 } })
                .collect();
            h.activation = Activation::GeluTanhGated;
            h.query_pre_attn_scalar = Some(256.0);
            h
        }
        _ => return None,
    })
}

/// The config of a preset (what the real checkpoint's metadata says).
pub fn preset_config(name: &str) -> Result<ModelConfig> {
    if let Some(h) = preset_hyperparams(name) {
        return Ok(arch::model_config(&h));
    }
    Ok(match name {
        "qwen3.5-35b-a3b" => arch::qwen3_5_moe::Qwen35MoeConfig::qwen3_5_35b_a3b().model_config(),
        "gemma-4-31b" => arch::gemma4::Gemma4Config::gemma_4_31b().model_config(),
        other => {
            return Err(Error::InvalidArgument(format!(
                "unknown synthetic model {other:?}; choose one of {}",
                PRESETS.join(", ")
            )))
        }
    })
}

/// Builds the synthetic checkpoint of `spec` (`NAME:RECIPE`).
pub fn open(spec: &str) -> Result<Checkpoint> {
    let (name, recipe) = spec.split_once(':').unwrap_or((spec, "q4_k_m"));
    if !RECIPES.contains(&recipe) {
        return Err(Error::InvalidArgument(format!(
            "unknown quantization recipe {recipe:?} in --synthetic {spec}; choose one of {}",
            RECIPES.join(", ")
        )));
    }
    let config = preset_config(name)?;
    build(&config, recipe, &format!("synthetic:{name}:{recipe}"), 0x5EED)
}

/// One tensor to make: name, shape, type, values.
struct Plan {
    name: String,
    shape: Vec<usize>,
    dtype: DType,
    init: Init,
}

/// How a synthetic tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// N(0, std), tiled from a pool of random blocks of the tensor's type (matrices).
    Normal(f32),
    /// N(0, std), every value drawn (f32 vectors and conv taps).
    Each(f32),
    /// 1 + N(0, 0.05) (norm weights).
    NearOne,
    /// ln(U(1, 16)) (a Gated DeltaNet's A_log).
    ALog,
}

/// llama.cpp's `use_more_bits`: the layers whose `attn_v` and `ffn_down` Q4_K_M stores as Q6_K.
fn more_bits(layer: usize, layers: usize) -> bool {
    let first = layers / 8;
    layer < first || layer >= 7 * layers / 8 || (layer - first) % 3 == 2
}

/// The type of a 2-D tensor `name` with rows of `cols` in `recipe`.
fn weight_type(recipe: &str, name: &str, layer: Option<usize>, layers: usize, cols: usize, tied: bool) -> DType {
    let base = match recipe {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "q8_0" => DType::Q8_0,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q5_0" => DType::Q5_0,
        "q5_1" => DType::Q5_1,
        "mlx4" | "mlx8" => {
            // mlx-lm's quant_predicate for MoE models keeps the routers at 8 bits.
            let router = name.ends_with("ffn_gate_inp.weight") || name.ends_with("ffn_gate_inp_shexp.weight");
            let bits = if recipe == "mlx4" && !router { 4 } else { 8 };
            return if cols.is_multiple_of(64) { DType::Affine { bits, group: 64, bf16: true } } else { DType::F16 };
        }
        _ => DType::Q4_K,
    };
    let want = if recipe == "q4_k_m" {
        let more = layer.is_some_and(|l| more_bits(l, layers));
        let output = name == "output.weight" || (tied && name == "token_embd.weight");
        if output || (more && (name.ends_with("attn_v.weight") || name.ends_with("ffn_down.weight"))) {
            DType::Q6_K
        } else {
            DType::Q4_K
        }
    } else if base.is_quantized()
        && base != DType::Q8_0
        && (name == "output.weight" || (tied && name == "token_embd.weight"))
    {
        // llama.cpp keeps the output layer at 8 bits or more in the 4/5-bit files.
        DType::Q8_0
    } else {
        base
    };
    match want {
        DType::Q4_K if !cols.is_multiple_of(QK_K) => DType::Q5_0,
        DType::Q6_K if !cols.is_multiple_of(QK_K) => DType::Q8_0,
        t => t,
    }
}

/// Every tensor the config implies ([`super::expected_tensors`]), typed by `recipe` and
/// initialized like a trained model's: matrices N(0, 1/fan-in), norms near 1, biases small, the
/// Gated DeltaNet's decay parameters in their trained ranges.
fn tensor_plans(c: &ModelConfig, recipe: &str) -> Vec<Plan> {
    let (h, layers) = (c.hidden_size, c.num_layers());
    let tied = c.tie_word_embeddings;
    super::expected_tensors(c)
        .into_iter()
        .map(|(name, shape, role)| {
            let layer = name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|l| l.parse().ok());
            let cols = *shape.last().expect("a shape");
            let (dtype, init) = match role {
                Role::Matrix => {
                    let std = match name.as_str() {
                        "token_embd.weight" if tied => 0.05,
                        "token_embd.weight" => 0.02,
                        "output.weight" => 2.0 / (h as f32).sqrt(),
                        _ => 1.0 / (cols as f32).sqrt(),
                    };
                    (weight_type(recipe, &name, layer, layers, cols, tied), Init::Normal(std))
                }
                Role::Conv => (DType::F32, Init::Each(0.3)),
                Role::Vector if name.ends_with(".bias") => (DType::F32, Init::Each(0.1)),
                // A = exp(A_log) uniform in [1, 16] (transformers' init), dt_bias ~ 1.
                Role::Vector if name.ends_with("ssm_a_log.weight") => (DType::F32, Init::ALog),
                Role::Vector if name.ends_with("ssm_dt_bias.weight") => (DType::F32, Init::NearOne),
                Role::Vector => (DType::F32, Init::NearOne),
            };
            Plan { name, shape, dtype, init }
        })
        .collect()
}

/// A small, fast generator (xorshift64*), Gaussian by Box-Muller.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in (0, 1).
    fn unit(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 0.5) / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        let (u, v) = (self.unit(), self.unit());
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next_u64() % u64::from(n)) as u32
    }
    fn bytes(&mut self, out: &mut [u8]) {
        out.iter_mut().for_each(|b| *b = self.next_u64() as u8);
    }
}

/// Blocks in a pool of random blocks of one (type, std).
const POOL: usize = 1024;
/// Elements of a "block" of a float type (so float tensors tile the same way).
const FLOAT_BLOCK: usize = 32;

/// `POOL` random blocks of `dtype` whose values have standard deviation `std`.
fn block_pool(dtype: DType, std: f32, rng: &mut Rng) -> Result<Vec<u8>> {
    let elems = if dtype.is_quantized() { dtype.block_size() } else { FLOAT_BLOCK };
    let f16_bytes = |x: f32| f16::from_f32(x).to_le_bytes();
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            // x = d·sc·q - dmin·m per 32-element sub-block, q uniform in [0, 2^bits): m = sc and
            // dmin = d·mean(q) make every sub-block zero-mean; sc in [4, 15] keeps the 6-bit
            // scale fields' high bits (stored in other bytes) zero.
            let (qmax, qbytes) = if dtype == DType::Q4_K { (15.0f32, 128) } else { (31.0, 160) };
            let q_std = ((qmax + 1.0) * (qmax + 1.0) - 1.0).sqrt() / 12f32.sqrt();
            let d = std / (9.5 * q_std);
            let mut out = Vec::with_capacity(POOL * dtype.block_bytes());
            for _ in 0..POOL {
                out.extend_from_slice(&f16_bytes(d));
                out.extend_from_slice(&f16_bytes(d * qmax / 2.0));
                let sc: Vec<u8> = (0..8).map(|_| 4 + rng.below(12) as u8).collect();
                let mut scales = [0u8; 12];
                for j in 0..4 {
                    scales[j] = sc[j];
                    scales[j + 4] = sc[j];
                    scales[j + 8] = (sc[j + 4] & 0xF) | ((sc[j + 4] & 0xF) << 4);
                }
                out.extend_from_slice(&scales);
                let mut q = vec![0u8; qbytes];
                rng.bytes(&mut q);
                out.extend_from_slice(&q);
            }
            Ok(out)
        }
        DType::Q6_K => {
            // x = d·sc·(q - 32), q uniform in [0, 64), sc in [8, 24].
            let d = std / (16.0 * 18.47);
            let mut out = Vec::with_capacity(POOL * dtype.block_bytes());
            for _ in 0..POOL {
                let mut q = [0u8; 192];
                rng.bytes(&mut q);
                out.extend_from_slice(&q);
                for _ in 0..16 {
                    out.push(8 + rng.below(17) as u8);
                }
                out.extend_from_slice(&f16_bytes(d));
            }
            Ok(out)
        }
        _ => {
            let values: Vec<f32> = (0..POOL * elems).map(|_| rng.normal() * std).collect();
            quantize(dtype, &values)
        }
    }
}

/// Builds a checkpoint of `config` with `recipe`'s tensor types and random weights from `seed`.
pub fn build(config: &ModelConfig, recipe: &str, label: &str, seed: u64) -> Result<Checkpoint> {
    let plans = tensor_plans(config, recipe);
    let mut rng = Rng(seed | 1);
    let mut layout = Vec::with_capacity(plans.len());
    let mut total = 0usize;
    for p in &plans {
        let numel: usize = p.shape.iter().product();
        let len = p.dtype.byte_size(numel).ok_or_else(|| {
            Error::InvalidArgument(format!("{label}: {} ({numel} values) is not whole {} blocks", p.name, p.dtype))
        })?;
        layout.push((total, len));
        total = (total + len).next_multiple_of(32);
    }
    let mut map = Vec::new();
    map.try_reserve_exact(total)
        .map_err(|e| Error::Gpu(format!("{label}: cannot allocate {} MiB of host memory: {e}", total >> 20)))?;
    map.resize(total, 0u8);
    let mut pools: HashMap<(DType, u32), Vec<u8>> = HashMap::new();
    for (p, &(offset, len)) in plans.iter().zip(&layout) {
        let dst = &mut map[offset..offset + len];
        match p.init {
            Init::NearOne => {
                let v: Vec<f32> = (0..len / 4).map(|_| 1.0 + 0.05 * rng.normal()).collect();
                dst.copy_from_slice(bytemuck::cast_slice(&v));
            }
            Init::ALog => {
                let v: Vec<f32> = (0..len / 4).map(|_| (1.0 + 15.0 * rng.unit()).ln()).collect();
                dst.copy_from_slice(bytemuck::cast_slice(&v));
            }
            Init::Each(std) => {
                let v: Vec<f32> = (0..len / 4).map(|_| std * rng.normal()).collect();
                dst.copy_from_slice(bytemuck::cast_slice(&v));
            }
            Init::Normal(std) => {
                let pool = match pools.entry((p.dtype, std.to_bits())) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(block_pool(p.dtype, std, &mut rng)?),
                };
                let bb = pool.len() / POOL;
                for block in dst.chunks_exact_mut(bb) {
                    let i = rng.below(POOL as u32) as usize;
                    block.copy_from_slice(&pool[i * bb..(i + 1) * bb]);
                }
            }
        }
    }
    let tensors = plans
        .into_iter()
        .zip(layout)
        .map(|(p, (offset, len))| {
            (
                p.name,
                StoredTensor {
                    file: 0,
                    offset: offset as u64,
                    len,
                    dtype: p.dtype,
                    shape: p.shape,
                    affine: None,
                    pick: None,
                    stack: None,
                },
            )
        })
        .collect();
    let mut config = config.clone();
    config.eos_token_ids.clear();
    Ok(Checkpoint {
        path: PathBuf::from(label),
        config,
        tokenizer: TokenizerSource::None,
        chat_template: None,
        bos_token: None,
        eos_token: None,
        tensors,
        files: vec![DataFile { path: PathBuf::from(label), len: map.len() as u64, source: DataSource::Memory(map) }],
        fixups: HashMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every block type's pool dequantizes to finite, non-zero values of about the asked
    /// standard deviation with a small mean (the point of synthetic weights: finite activations).
    #[test]
    fn pools_have_the_asked_scale() {
        let mut rng = Rng(7);
        let affine = [4, 8].map(|bits| DType::Affine { bits, group: 64, bf16: true });
        for dtype in DType::ALL.into_iter().filter(|&t| t != DType::BF16).chain(affine) {
            let std = 0.03f32;
            let pool = block_pool(dtype, std, &mut rng).unwrap();
            let n = pool.len() / dtype.byte_size(dtype.block_size().max(1)).unwrap() * dtype.block_size();
            let x = super::super::dtype::to_f32(dtype, &pool, n).unwrap();
            assert!(x.iter().all(|v| v.is_finite()), "{dtype}: non-finite values");
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let sd = (x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64).sqrt();
            let zeros = x.iter().filter(|&&v| v == 0.0).count();
            // Quantization to 4 bits moves the spread by up to ~25 %; the mean of 32k+ values of
            // sd 0.03 is within a few 1e-4 of 0 (Q6_K's q - 32 has mean -0.5: 0.03 · 0.5 / 18.5).
            assert!((sd / std as f64 - 1.0).abs() < 0.3, "{dtype}: sd {sd} for {std}");
            assert!(mean.abs() < 0.1 * std as f64, "{dtype}: mean {mean}");
            assert!(zeros < n / 8, "{dtype}: {zeros} of {n} values are 0");
        }
    }

    /// The MLX recipes quantize every matrix, embedding included, to one affine type.
    #[test]
    fn mlx_recipes_quantize_every_matrix() {
        let c = preset_config("qwen2.5-1.5b").unwrap();
        for (recipe, bits) in [("mlx4", 4), ("mlx8", 8)] {
            let plans = tensor_plans(&c, recipe);
            let want = DType::Affine { bits, group: 64, bf16: true };
            assert!(plans.iter().filter(|p| p.shape.len() == 2).all(|p| p.dtype == want), "{recipe}");
        }
    }

    /// Qwen3.5-35B-A3B in mlx4: 30 Gated DeltaNet and 10 attention layers, stacked experts in
    /// 4 bits and the routers in 8 (mlx-lm's predicate), about 20 GB in all: the 4-bit size.
    #[test]
    fn qwen3_5_moe_shape_and_size() {
        let c = preset_config("qwen3.5-35b-a3b").unwrap();
        let plans = tensor_plans(&c, "mlx4");
        let get = |n: &str| plans.iter().find(|p| p.name == n).unwrap_or_else(|| panic!("{n}"));
        let a4 = DType::Affine { bits: 4, group: 64, bf16: true };
        assert_eq!(get("blk.0.ffn_gate_exps.weight").shape, [256, 512, 2048]);
        assert_eq!(get("blk.0.ffn_gate_exps.weight").dtype, a4);
        assert_eq!(get("blk.0.ffn_gate_inp.weight").dtype, DType::Affine { bits: 8, group: 64, bf16: true });
        assert_eq!(get("blk.0.ssm_in_qkv.weight").shape, [8192, 2048]);
        assert_eq!(get("blk.3.attn_q.weight").shape, [4096, 2048]);
        assert!(plans.iter().all(|p| !p.name.starts_with("blk.3.ssm")), "layer 3 is full attention");
        let bytes: usize = plans.iter().map(|p| p.dtype.byte_size(p.shape.iter().product()).unwrap()).sum();
        assert!((18e9..22e9).contains(&(bytes as f64)), "{bytes} bytes");
    }

    /// The q4_k_m recipe reproduces the real Qwen2.5 files' types (../shared/gpu/shape-recipes):
    /// 1.5B: Q4_K / Q6_K, output Q6_K; 0.5B (rows of 896): the Q5_0 / Q8_0 fallbacks.
    #[test]
    fn q4_k_m_types_follow_llama_cpp() {
        // The recipe's type of each tensor of a preset.
        let types = |preset: &str| {
            let plans = tensor_plans(&preset_config(preset).unwrap(), "q4_k_m");
            move |n: &str| plans.iter().find(|p| p.name == n).unwrap().dtype
        };
        let ty = types("qwen2.5-1.5b");
        assert_eq!(ty("output.weight"), DType::Q6_K);
        assert_eq!(ty("token_embd.weight"), DType::Q4_K);
        assert_eq!(ty("blk.5.attn_q.weight"), DType::Q4_K);
        let v6 = (0..28).filter(|l| ty(&format!("blk.{l}.attn_v.weight")) == DType::Q6_K).count();
        assert!((12..=16).contains(&v6), "{v6} of 28 attn_v layers in Q6_K (the real file: 14)");
        let ty = types("qwen2.5-0.5b");
        assert_eq!(ty("output.weight"), DType::Q8_0);
        assert_eq!(ty("token_embd.weight"), DType::Q5_0);
        assert_eq!(ty("blk.0.ffn_down.weight"), DType::Q6_K);
        assert_eq!(ty("blk.0.attn_v.weight"), DType::Q8_0);
    }

    #[test]
    fn bad_specs_are_errors() {
        let err = |spec: &str| open(spec).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err("llama-70b:q4_k_m").contains("smollm2-135m"));
        assert!(err("smollm2-135m:q3_k").contains("q4_k_m"));
    }
}
