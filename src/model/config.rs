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
    /// ([`super::arch::qwen3_5_moe`]).
    Qwen35Moe,
    /// Gemma 4: sliding and full attention layers with their own head dims, KV heads and RoPE
    /// (proportional on full layers), keys as values on full layers, an unweighted norm on v,
    /// a per-layer output scale, soft-capped logits ([`super::arch::gemma4`]).
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
    /// Linear attention (Qwen3.5's Gated DeltaNet, `linear_attention`): a recurrent state, no KV
    /// cache.
    Linear,
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

/// The model-wide fields of a checkpoint and one [`LayerSpec`] per layer, built by the
/// checkpoint's architecture module ([`super::arch`]) from its hyperparameters.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Multiply the gathered embedding by this (Gemma: sqrt(hidden)); 1 otherwise.
    pub embedding_scale: f32,
    /// tanh soft-capping of the final logits (None = off).
    pub final_logit_softcapping: Option<f32>,
    /// Per-layer input embeddings (Gemma 4 E2B/E4B), when the model has them.
    pub per_layer_input: Option<PerLayerInput>,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Whether the tokenizer prepends BOS to a prompt (Gemma: yes; SmolLM2/Qwen: no).
    pub add_bos: bool,
    /// One spec per layer: what the layer loop runs and the weight loader loads for it.
    pub layers: Vec<LayerSpec>,
}

impl ModelConfig {
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `l`'s spec.
    pub fn layer(&self, l: usize) -> LayerSpec {
        self.layers[l]
    }

    /// Every layer's spec.
    pub fn layer_specs(&self) -> Vec<LayerSpec> {
        self.layers.clone()
    }

    /// Layer `l`'s attention, if its mixer is softmax attention.
    pub fn attention(&self, l: usize) -> Option<&AttentionSpec> {
        match &self.layers[l].mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(_) => None,
        }
    }

    pub fn layer_is_sliding(&self, layer: usize) -> bool {
        self.attention(layer).is_some_and(|a| a.window.is_some())
    }
}
