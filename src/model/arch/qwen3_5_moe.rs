//! Qwen3.5-MoE, as transformers' `modeling_qwen3_5_moe.py` (`Qwen3_5MoeForCausalLM`, the text
//! part of `Qwen3_5MoeForConditionalGeneration`) and mlx-lm's `qwen3_5_moe.py` write it.
//!
//! ```text
//! Qwen3_5MoeDecoderLayer:
//!     h = x + token_mixer(input_layernorm(x))          # (1 + w) RMSNorms, folded at load
//!     out = h + Qwen3_5MoeSparseMoeBlock(post_attention_layernorm(h))
//! token_mixer, by config.layer_types[i]:
//!     "linear_attention": Qwen3_5MoeGatedDeltaNet
//!         qkv = in_proj_qkv(x); z = in_proj_z(x); b = in_proj_b(x); a = in_proj_a(x)
//!         q, k, v = split(silu(causal_conv1d(qkv)))    # depthwise, linear_conv_kernel_dim taps
//!         q, k = l2norm(q), l2norm(k); q /= sqrt(d_k)   # k heads repeated to the v heads
//!         beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
//!         S = S * exp(g); S += k ⊗ ((v - Sᵀk) * beta); o = Sᵀq      # per v head, every token
//!         out_proj(RMSNormGated(o, z))                  # rms_norm(o) * w * silu(z), plain w
//!     "full_attention": Qwen3_5MoeAttention
//!         q, gate = q_proj(x) split per head             # [q_h | gate_h] for each head h
//!         q, k = q_norm(q), k_norm(k); rotary on the first head_dim * partial_rotary_factor dims
//!         o_proj(attention(q, k, v) * sigmoid(gate))
//! Qwen3_5MoeSparseMoeBlock:
//!     p = softmax(gate(x)); top num_experts_per_tok by p, renormalized to sum 1
//!     Σ p_e · expert_e(x) + sigmoid(shared_expert_gate(x)) · shared_expert(x)   # SwiGLU MLPs
//! ```
//!
//! The engine reads this as one [`LayerSpec`] per layer ([`Qwen35MoeConfig::layers`]) and the
//! tensors under the canonical names of [`tensor_name`].

pub use super::common::TensorName;
use super::common::{Defaults, DeltaNetParams, GgufTensor, Hyperparams, MoeParams};
use crate::model::config::{
    Activation, Arch, AttentionSpec, DeltaNetSpec, LayerAttention, LayerSpec, Mixer, MlpSpec, ModelConfig, RopeSpec,
};

/// `Qwen3_5MoeTextConfig`'s defaults (every 4th layer full, `partial_rotary_factor` 0.25 and the
/// linear layers' sizes are the loaders' to apply).
pub const DEFAULTS: Defaults = Defaults {
    head_dim: Some(256),
    rms_norm_eps: 1e-6,
    rope_theta: 10_000_000.0,
    use_sliding_window: false,
    ..super::qwen3::DEFAULTS
};

/// The model `h` describes: its `Full` layers gated softmax attention, the others Gated DeltaNet
/// (`h.delta_net`), every MLP the MoE block (`h.moe`).
pub fn model_config(h: &Hyperparams) -> ModelConfig {
    Qwen35MoeConfig::from_hyperparams(h).model_config()
}

/// llama.cpp's name of a `qwen35moe` GGUF tensor (after `blk.{i}.`, or outside layers) as the
/// engine's: its converter stores `(1 + w)` norms with the 1 added, `ssm_a = -exp(A_log)`, q and
/// its output gate fused per head in a full layer's `attn_q` (split as transformers' `q_proj`
/// is), the shared expert's gate as a vector.
pub fn gguf_tensor(name: &str, full: bool) -> GgufTensor<'_> {
    let canonical = match name {
        "post_attention_norm.weight" => "ffn_norm.weight",
        "attn_q.weight" if full => "attn_q.weight|attn_out_gate.weight",
        "attn_qkv.weight" => "ssm_in_qkv.weight",
        "attn_gate.weight" => "ssm_in_z.weight",
        "ssm_dt.bias" => "ssm_dt_bias.weight",
        "ssm_a" => "ssm_a_log.weight",
        other => other,
    };
    GgufTensor { name: canonical, neg_exp: name == "ssm_a", as_row: name == "ffn_gate_inp_shexp.weight" }
}

/// The fields of `Qwen3_5MoeTextConfig` the engine uses.
#[derive(Clone, Debug, PartialEq)]
pub struct Qwen35MoeConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// `rope_parameters.rope_theta`.
    pub rope_theta: f32,
    /// `rope_parameters.partial_rotary_factor` (default 0.25).
    pub partial_rotary_factor: f32,
    /// One of `linear_attention` / `full_attention` per layer (`layer_types`, or every
    /// `full_attention_interval`-th layer full).
    pub full_attention: Vec<bool>,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub attention_bias: bool,
    /// The linear layers' value heads are in llama.cpp's GGUF order (tiled over the key heads,
    /// [`DeltaNetSpec::kv_tiled`]) rather than transformers'.
    pub value_heads_tiled: bool,
}

impl Qwen35MoeConfig {
    /// Qwen3.5-MoE's reading of the neutral hyperparameters (a `Qwen35Moe` [`Hyperparams`] has
    /// `moe` and `delta_net`; zero sizes where it has not).
    pub fn from_hyperparams(h: &Hyperparams) -> Self {
        let moe = h.moe.unwrap_or(MoeParams {
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
        });
        let dn = h.delta_net.unwrap_or(DeltaNetParams {
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            value_heads_tiled: false,
        });
        Qwen35MoeConfig {
            vocab_size: h.vocab_size,
            hidden_size: h.hidden_size,
            rms_norm_eps: h.rms_norm_eps,
            max_position_embeddings: h.max_position_embeddings,
            tie_word_embeddings: h.tie_word_embeddings,
            num_attention_heads: h.num_attention_heads,
            num_key_value_heads: h.num_key_value_heads,
            head_dim: h.head_dim,
            rope_theta: h.rope_theta,
            partial_rotary_factor: h.partial_rotary_factor,
            full_attention: h.layer_types.iter().map(|t| *t == LayerAttention::Full).collect(),
            linear_num_key_heads: dn.linear_num_key_heads,
            linear_num_value_heads: dn.linear_num_value_heads,
            linear_key_head_dim: dn.linear_key_head_dim,
            linear_value_head_dim: dn.linear_value_head_dim,
            linear_conv_kernel_dim: dn.linear_conv_kernel_dim,
            num_experts: moe.num_experts,
            num_experts_per_tok: moe.num_experts_per_tok,
            moe_intermediate_size: moe.moe_intermediate_size,
            shared_expert_intermediate_size: moe.shared_expert_intermediate_size,
            attention_bias: h.attention_bias,
            value_heads_tiled: dn.value_heads_tiled,
        }
    }

    /// `rotary_dim = int(head_dim * partial_rotary_factor)` (transformers'
    /// `compute_default_rope_parameters`).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f32 * self.partial_rotary_factor) as usize
    }

    /// Qwen/Qwen3.5-35B-A3B's text config.
    pub fn qwen3_5_35b_a3b() -> Self {
        Qwen35MoeConfig {
            vocab_size: 248_320,
            hidden_size: 2048,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 262_144,
            tie_word_embeddings: false,
            num_attention_heads: 16,
            num_key_value_heads: 2,
            head_dim: 256,
            rope_theta: 10_000_000.0,
            partial_rotary_factor: 0.25,
            full_attention: (0..40).map(|i| (i + 1) % 4 == 0).collect(),
            linear_num_key_heads: 16,
            linear_num_value_heads: 32,
            linear_key_head_dim: 128,
            linear_value_head_dim: 128,
            linear_conv_kernel_dim: 4,
            num_experts: 256,
            num_experts_per_tok: 8,
            moe_intermediate_size: 512,
            shared_expert_intermediate_size: 512,
            attention_bias: false,
            value_heads_tiled: false,
        }
    }

    /// The engine's description: the model-wide fields, and one spec per layer.
    pub fn model_config(&self) -> ModelConfig {
        let layers = self.layers();
        ModelConfig {
            arch: Arch::Qwen35Moe,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            rms_norm_eps: self.rms_norm_eps,
            max_position_embeddings: self.max_position_embeddings,
            tie_word_embeddings: self.tie_word_embeddings,
            embedding_scale: 1.0,
            final_logit_softcapping: None,
            per_layer_input: None,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            add_bos: false,
            layers,
        }
    }

    pub fn layers(&self) -> Vec<LayerSpec> {
        let mlp = MlpSpec::Moe {
            experts: self.num_experts,
            top_k: self.num_experts_per_tok,
            intermediate: self.moe_intermediate_size,
            shared_intermediate: self.shared_expert_intermediate_size,
            // Qwen3_5MoeTopKRouter: `router_top_value /= router_top_value.sum(...)`, always.
            norm_topk: true,
            activation: Activation::SiluGated,
        };
        self.full_attention
            .iter()
            .map(|&full| {
                let mixer = if full {
                    Mixer::Attention(AttentionSpec {
                        heads: self.num_attention_heads,
                        kv_heads: self.num_key_value_heads,
                        head_dim: self.head_dim,
                        window: None,
                        rope: RopeSpec {
                            rotary_dim: self.rotary_dim(),
                            ..RopeSpec::full(self.rope_theta, self.head_dim)
                        },
                        scale: 1.0 / (self.head_dim as f32).sqrt(),
                        bias: self.attention_bias,
                        qk_norm: true,
                        output_gate: true,
                        k_eq_v: false,
                        v_norm: false,
                        kv_from: None,
                    })
                } else {
                    Mixer::DeltaNet(DeltaNetSpec {
                        k_heads: self.linear_num_key_heads,
                        v_heads: self.linear_num_value_heads,
                        k_dim: self.linear_key_head_dim,
                        v_dim: self.linear_value_head_dim,
                        conv_kernel: self.linear_conv_kernel_dim,
                        kv_tiled: self.value_heads_tiled,
                    })
                };
                LayerSpec { mixer, mlp, sandwich_norm: false, output_scale: false }
            })
            .collect()
    }
}

/// The canonical name of a layer tensor by its module path after `model.layers.{i}.`, in
/// transformers' or mlx-lm's names (with `.weight`, or a bare parameter: `A_log`, `dt_bias`,
/// `experts.gate_up_proj`).
pub fn tensor_name(module: &str) -> Option<TensorName> {
    use TensorName::*;
    Some(match module {
        "input_layernorm.weight" => One("attn_norm.weight"),
        "post_attention_layernorm.weight" => One("ffn_norm.weight"),
        // Full attention.
        "self_attn.q_proj.weight" => Halves("attn_q.weight", "attn_out_gate.weight"),
        "self_attn.k_proj.weight" => One("attn_k.weight"),
        "self_attn.v_proj.weight" => One("attn_v.weight"),
        "self_attn.o_proj.weight" => One("attn_output.weight"),
        "self_attn.q_norm.weight" => One("attn_q_norm.weight"),
        "self_attn.k_norm.weight" => One("attn_k_norm.weight"),
        // Gated DeltaNet.
        "linear_attn.in_proj_qkv.weight" => One("ssm_in_qkv.weight"),
        "linear_attn.in_proj_z.weight" => One("ssm_in_z.weight"),
        "linear_attn.in_proj_b.weight" => One("ssm_beta.weight"),
        "linear_attn.in_proj_a.weight" => One("ssm_alpha.weight"),
        "linear_attn.conv1d.weight" => One("ssm_conv1d.weight"),
        "linear_attn.dt_bias" => One("ssm_dt_bias.weight"),
        "linear_attn.A_log" => One("ssm_a_log.weight"),
        "linear_attn.norm.weight" => One("ssm_norm.weight"),
        "linear_attn.out_proj.weight" => One("ssm_out.weight"),
        // Sparse MoE.
        "mlp.gate.weight" => One("ffn_gate_inp.weight"),
        "mlp.shared_expert_gate.weight" => One("ffn_gate_inp_shexp.weight"),
        "mlp.shared_expert.gate_proj.weight" => One("ffn_gate_shexp.weight"),
        "mlp.shared_expert.up_proj.weight" => One("ffn_up_shexp.weight"),
        "mlp.shared_expert.down_proj.weight" => One("ffn_down_shexp.weight"),
        "mlp.experts.gate_up_proj" => Halves("ffn_gate_exps.weight", "ffn_up_exps.weight"),
        "mlp.experts.down_proj" => One("ffn_down_exps.weight"),
        "mlp.switch_mlp.gate_proj.weight" => One("ffn_gate_exps.weight"),
        "mlp.switch_mlp.up_proj.weight" => One("ffn_up_exps.weight"),
        "mlp.switch_mlp.down_proj.weight" => One("ffn_down_exps.weight"),
        _ => {
            let (e, proj) = module.strip_prefix("mlp.experts.")?.split_once('.')?;
            let e: usize = e.parse().ok().filter(|_| e == "0" || !e.starts_with('0'))?;
            match proj {
                "gate_proj.weight" => Expert("ffn_gate_exps.weight", e),
                "up_proj.weight" => Expert("ffn_up_exps.weight", e),
                "down_proj.weight" => Expert("ffn_down_exps.weight", e),
                _ => return None,
            }
        }
    })
}

/// Whether a canonical tensor is one of Qwen3_5MoeRMSNorm's `(1 + w)` weights (every RMSNorm
/// but the gated one of the DeltaNet), which a transformers checkpoint stores as `w` (mlx-lm's
/// conversion adds the 1 itself).
pub fn is_one_centered_norm(canonical: &str) -> bool {
    ["attn_norm.weight", "ffn_norm.weight", "attn_q_norm.weight", "attn_k_norm.weight"]
        .iter()
        .any(|s| canonical.ends_with(s))
        || canonical == "output_norm.weight"
}
