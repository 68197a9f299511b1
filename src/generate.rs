//! The generation loop: prefill the prompt, then sample and feed back one token at a time.
//!
//! Sampling step schedule (the RNG counter): the token sampled from the prompt's last position
//! is step 0, each decode step adds one. Chunked prefill does not advance it.

use crate::error::{Error, Result};
use crate::model::Model;
use crate::sampling::{SamplingBackend, SamplingParams};
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing including the first sampled token.
    pub prefill: Duration,
    /// Everything after the first token.
    pub decode: Duration,
    /// Why generation ended.
    pub stop: StopReason,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopReason {
    #[default]
    MaxTokens,
    Eos,
    ContextFull,
    /// The callback asked to stop.
    Caller,
}

impl Stats {
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64().max(1e-9)
    }
    /// Tokens per second after the first (each is one full forward + sample).
    pub fn decode_tok_s(&self) -> f64 {
        self.generated_tokens.saturating_sub(1) as f64 / self.decode.as_secs_f64().max(1e-9)
    }
}

/// Generates up to `max_tokens` tokens after `prompt`. `on_token` sees each token as it is
/// sampled (eos included) and returns false to stop.
pub fn generate(
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    prompt: &[u32],
    max_tokens: usize,
    params: &SamplingParams,
    eos: &[u32],
    on_token: &mut dyn FnMut(u32) -> Result<bool>,
) -> Result<Stats> {
    params.validate()?;
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty".into()));
    }
    if prompt.len() >= model.max_ctx {
        return Err(Error::InvalidArgument(format!(
            "the prompt has {} tokens but the context holds {} (prompt plus at least one generated \
             token); shorten the prompt or raise --ctx (this model allows up to {})",
            prompt.len(),
            model.max_ctx,
            model.config.max_position_embeddings
        )));
    }
    let mut stats = Stats { prompt_tokens: prompt.len(), ..Default::default() };
    if max_tokens == 0 {
        return Ok(stats);
    }
    model.reset();
    let t0 = Instant::now();
    let logits = model.forward(prompt)?;
    let mut token = sampler.sample(&model.gpu, &logits, std::slice::from_ref(params), 0)?[0];
    stats.prefill = t0.elapsed();
    stats.generated_tokens = 1;
    let t1 = Instant::now();
    let mut step = 0u32;
    loop {
        if !on_token(token)? {
            stats.stop = StopReason::Caller;
            break;
        }
        if eos.contains(&token) {
            stats.stop = StopReason::Eos;
            break;
        }
        if stats.generated_tokens >= max_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        if model.pos >= model.max_ctx {
            stats.stop = StopReason::ContextFull;
            break;
        }
        step += 1;
        let logits = model.forward(&[token])?;
        token = sampler.sample(&model.gpu, &logits, std::slice::from_ref(params), step)?[0];
        stats.generated_tokens += 1;
    }
    stats.decode = t1.elapsed();
    Ok(stats)
}
