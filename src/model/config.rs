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
}

impl Arch {
    /// Parses the architecture name used by config.json `model_type` or GGUF `general.architecture`.
    pub fn parse(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "gemma3" | "gemma3_text" => Some(Arch::Gemma3),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Gemma3 => "gemma3",
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// silu(gate) * up
    SiluGated,
    /// gelu_tanh(gate) * up
    GeluTanhGated,
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
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// Whether the tokenizer prepends BOS to a prompt (Gemma: yes; SmolLM2/Qwen: no).
    pub add_bos: bool,
}

impl ModelConfig {
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
