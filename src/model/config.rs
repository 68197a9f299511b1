//! The architecture-independent description of a checkpoint, filled by either loader
//! (GGUF metadata or a Hugging Face config.json). The layer loop reads only this.

/// Architectures this engine runs. Everything that differs between them is a field of
/// [`ModelConfig`] (filled by the loaders), so one layer loop drives them all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama / SmolLM2: plain RMSNorm, SiLU gated MLP.
    Llama,
    /// Qwen2 / Qwen2.5: q/k/v projection bias.
    Qwen2,
    /// Qwen3: per-head RMSNorm on q and k before RoPE.
    Qwen3,
    /// Gemma 3: sliding/global layers with their own RoPE bases, q/k norm, (1+w) RMSNorm
    /// (folded into the weights at load), sandwich norms, GELU-tanh gated MLP, sqrt(hidden)
    /// embedding scale, tied embeddings.
    Gemma3,
    /// Qwen3.5-MoE: Gated DeltaNet (linear attention) layers between gated full-attention
    /// layers, every MLP a sparse mixture of experts with a shared expert
    /// ([`super::qwen3_5_moe`]).
    Qwen35Moe,
    /// Gemma 4: sliding and full attention layers with their own head dims, KV heads and RoPE
    /// (proportional on full layers), keys as values on full layers, an unweighted norm on v,
    /// a per-layer output scale, soft-capped logits ([`super::gemma4`]).
    Gemma4,
}

impl Arch {
    /// Parses the architecture name used by config.json `model_type` or GGUF `general.architecture`.
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma3" | "gemma3_text" => Some(Arch::Gemma3),
            "qwen3_5_moe" | "qwen3_5_moe_text" | "qwen35moe" => Some(Arch::Qwen35Moe),
            "gemma4" | "gemma4_text" => Some(Arch::Gemma4),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen35Moe => "qwen3_5_moe",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// Attention span of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerAttention {
    /// Attends to every earlier position.
    Full,
    /// Attends to the last `window` positions (the current one included).
    Sliding { window: u32 },
}

pub use crate::ops::elementwise::Activation;

/// RoPE of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f32,
    /// Linear scaling factor (positions divided by it); 1 = none.
    pub scaling: f32,
    /// Rotated dims of a head (the first ones; = head_dim unless partial rotary).
    pub rotary_dim: usize,
    /// Proportional RoPE (Gemma 4's full attention, transformers' `rope_type: proportional`):
    /// pairs (i, i + D/2) over the whole head, pair i at `theta^(-2i/D)` for the first
    /// `rotary_dim / 2` pairs and frequency 0 (unrotated) past them. False: NeoX pairs over the
    /// first `rotary_dim` dims at `theta^(-2i/rotary_dim)`.
    pub proportional: bool,
}

impl RopeSpec {
    /// Full rotary over `head_dim` at `theta`.
    pub fn full(theta: f32, head_dim: usize) -> RopeSpec {
        RopeSpec { theta, scaling: 1.0, rotary_dim: head_dim, proportional: false }
    }
}

/// Softmax attention over a KV cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window (the current position included); `None` = every earlier position.
    pub window: Option<u32>,
    pub rope: RopeSpec,
    /// Score scale (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// q/k/v projections carry a bias (Qwen2).
    pub bias: bool,
    /// Per-head RMSNorm on q and k before RoPE.
    pub qk_norm: bool,
    /// q_proj also yields a gate per output element: `o_proj(attn * sigmoid(gate))` (Qwen3.5).
    pub output_gate: bool,
    /// No v projection: the values are k_proj's output before k's norm and RoPE (Gemma 4's
    /// `attention_k_eq_v` on full layers).
    pub k_eq_v: bool,
    /// RMSNorm without a weight on each value head (Gemma 4's `v_norm`).
    pub v_norm: bool,
    /// This layer reads layer `kv_from`'s KV cache (same kind and shape) instead of projecting
    /// and caching keys and values of its own: it has only q (Gemma 4's shared KV layers).
    pub kv_from: Option<usize>,
}

impl AttentionSpec {
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
    /// Columns of the fused projection: [q | k | v], [q | k] with `k_eq_v`, [q] with `kv_from`.
    pub fn qkv_dim(&self) -> usize {
        let kv_parts = match (self.kv_from, self.k_eq_v) {
            (Some(_), _) => 0,
            (None, true) => 1,
            (None, false) => 2,
        };
        self.q_dim() + kv_parts * self.kv_dim()
    }
}

pub use crate::ops::deltanet::DeltaNetSpec;

/// A layer's token mixer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mixer {
    Attention(AttentionSpec),
    DeltaNet(DeltaNetSpec),
}

/// A layer's feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MlpSpec {
    /// `down(act(gate(x)) * up(x))`.
    Dense { intermediate: usize, activation: Activation },
    /// Sparse mixture of experts: router softmax, top-k experts (weights renormalized when
    /// `norm_topk`), each a gated MLP of `intermediate`; plus a shared expert of
    /// `shared_intermediate` scaled by `sigmoid(shared_gate(x))` (0 = none).
    Moe {
        experts: usize,
        top_k: usize,
        intermediate: usize,
        shared_intermediate: usize,
        norm_topk: bool,
        activation: Activation,
    },
}

/// Per-layer input embeddings (Gemma 4 E2B/E4B's PLE): every layer gets a `dim`-wide input per
/// token from its own slice of a second embedding table (`vocab` rows of `layers * dim`) and a
/// projection of the token's embedding, added to its output through a gated projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PerLayerInput {
    pub dim: usize,
    pub vocab: usize,
}

/// One layer of the loop: what `forward` runs and `weights` loads for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub mixer: Mixer,
    pub mlp: MlpSpec,
    /// Extra RMSNorms after the mixer and after the MLP, before each residual add (Gemma).
    pub sandwich_norm: bool,
    /// The layer's output (the residual stream) is multiplied by a learned scalar (Gemma 4's
    /// `layer_scalar`).
    pub output_scale: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// RoPE base of full-attention layers.
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers (Gemma 3: 10k); `None` = same as `rope_theta`.
    pub rope_local_theta: Option<f32>,
    /// Linear RoPE scaling factor of full-attention layers (positions divided by it); 1 = none.
    pub rope_scaling_factor: f32,
    pub max_position_embeddings: usize,
    /// One entry per layer.
    pub layer_attention: Vec<LayerAttention>,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm on q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Gemma 3: extra RMSNorm after attention and after the MLP, before the residual add.
    pub sandwich_norm: bool,
    pub activation: Activation,
    /// Multiply the gathered embedding by this (Gemma: sqrt(hidden)); 1 otherwise.
    pub embedding_scale: f32,
    /// Attention score scale; usually 1/sqrt(head_dim) (Gemma 3: query_pre_attn_scalar^-0.5).
    pub attention_scale: f32,
    /// tanh soft-capping of the final logits (None = off).
    pub final_logit_softcapping: Option<f32>,
    /// Per-layer input embeddings (Gemma 4 E2B/E4B), when the model has them.
    pub per_layer_input: Option<PerLayerInput>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Whether the tokenizer prepends BOS to a prompt (Gemma: yes; SmolLM2/Qwen: no).
    pub add_bos: bool,
    /// One spec per layer, set by architectures whose layers differ in more than their attention
    /// span ([`super::qwen3_5_moe`]); empty = every layer has the shape the fields above describe.
    /// The layer loop and the weight loader read layers through [`ModelConfig::layer`] only.
    pub layers: Vec<LayerSpec>,
}

impl ModelConfig {
    /// Layer `l`'s spec: from `layers` when an architecture module set them, else the one shape
    /// the model-wide fields describe (Llama, Qwen2/3, Gemma 3: layers differ only in their
    /// attention span and its RoPE base, from `layer_attention`).
    pub fn layer(&self, l: usize) -> LayerSpec {
        if let Some(spec) = self.layers.get(l) {
            return *spec;
        }
        let window = match self.layer_attention[l] {
            LayerAttention::Full => None,
            LayerAttention::Sliding { window } => Some(window),
        };
        let rope = match window {
            Some(_) => RopeSpec::full(self.rope_local_theta.unwrap_or(self.rope_theta), self.head_dim),
            None => RopeSpec { scaling: self.rope_scaling_factor, ..RopeSpec::full(self.rope_theta, self.head_dim) },
        };
        LayerSpec {
            mixer: Mixer::Attention(AttentionSpec {
                heads: self.num_heads,
                kv_heads: self.num_kv_heads,
                head_dim: self.head_dim,
                window,
                rope,
                scale: self.attention_scale,
                bias: self.attention_bias,
                qk_norm: self.qk_norm,
                output_gate: false,
                k_eq_v: false,
                v_norm: false,
                kv_from: None,
            }),
            mlp: MlpSpec::Dense { intermediate: self.intermediate_size, activation: self.activation },
            sandwich_norm: self.sandwich_norm,
            output_scale: false,
        }
    }

    /// Every layer's spec.
    pub fn layer_specs(&self) -> Vec<LayerSpec> {
        (0..self.num_layers).map(|l| self.layer(l)).collect()
    }

    pub fn layer_is_sliding(&self, layer: usize) -> bool {
        matches!(self.layer_attention[layer], LayerAttention::Sliding { .. })
    }
    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}
