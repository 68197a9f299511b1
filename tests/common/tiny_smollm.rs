//! The real SmolLM2 tokenizer and a tiny random model over its whole vocabulary (tests of
//! structured output and forced tool calls: the model's logits are noise, so only a constraint's
//! mask keeps its output valid).

use std::sync::OnceLock;
use wgpu_llm::decode::{constrained, StopReason};
use wgpu_llm::gpu::Gpu;
use wgpu_llm::grammar::{Constraint, Vocabulary};
use wgpu_llm::loader::{synthetic, Checkpoint};
use wgpu_llm::model::arch;
use wgpu_llm::model::config::LayerAttention;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{SamplingBackend, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;

/// The real SmolLM2 tokenizer, its end-of-sequence tokens and the grammar vocabulary over them.
pub struct Text {
    pub tokenizer: Tokenizer,
    pub eos: Vec<u32>,
    pub vocab: Vocabulary,
}

pub fn text() -> &'static Text {
    static TEXT: OnceLock<Text> = OnceLock::new();
    TEXT.get_or_init(|| {
        let ck = Checkpoint::open(&super::model("smollm2")).unwrap();
        let tokenizer = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id).unwrap();
        let eos = ck.config.eos_token_ids.clone();
        let vocab = Vocabulary::new(&tokenizer, ck.config.vocab_size, &eos).unwrap();
        Text { tokenizer, eos, vocab }
    })
}

/// SmolLM2's layout with its full vocabulary, shrunk: 2 layers of width 64.
pub fn tiny_model(gpu: &Gpu) -> Model {
    let mut h = synthetic::preset_hyperparams("smollm2-135m").unwrap();
    (h.hidden_size, h.intermediate_size) = (64, 96);
    (h.num_attention_heads, h.num_key_value_heads, h.head_dim) = (4, 2, 16);
    h.layer_types = vec![LayerAttention::Full; 2];
    h.query_pre_attn_scalar = Some(16.0);
    h.max_position_embeddings = 256;
    let config = arch::model_config(&h);
    assert_eq!(config.vocab_size, text().vocab.len(), "the tiny model has the tokenizer's vocabulary");
    let ck = synthetic::build(&config, "q8_0", "synthetic:tiny", 5).unwrap();
    Model::load(gpu, &ck, Some(192), &mut |_, _| {}).unwrap()
}

/// One constrained generation: (text, tokens, stop).
pub fn generate(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    constraint: &Constraint,
    params: &SamplingParams,
    max_tokens: usize,
) -> wgpu_llm::Result<(String, Vec<u32>, StopReason)> {
    let t = text();
    let mut matcher = t.vocab.matcher(constraint)?;
    let prompt = t.tokenizer.encode("Answer in JSON:", false)?;
    let mut tokens = Vec::new();
    let stats = constrained::generate(model, sampler, &prompt, max_tokens, params, &mut matcher, &t.eos, &mut |tok| {
        tokens.push(tok);
        Ok(true)
    })?;
    let body: Vec<u32> = tokens.iter().copied().filter(|tok| !t.eos.contains(tok)).collect();
    Ok((t.tokenizer.decode(&body)?, tokens, stats.stop))
}
