//! What the decode loops share: their options, a run's request ([`Job`]), the stop rule and the
//! statistics they report.

use crate::error::Error;
use crate::model::Model;
use crate::sampling::SamplingParams;
use std::time::Duration;

/// Decode steps in flight in the batch engine ([`batch::BatchEngine`]) by default.
pub const DEFAULT_DEPTH: usize = 3;

/// Submissions in flight in the one-sequence GPU-resident loop by default.
pub const DEFAULT_SUBMISSIONS: usize = 2;

/// Decode steps a submission of the one-sequence GPU-resident loop holds by default: 4 were
/// +0.7-1.2 % decode over 1 on the H100 (fewer submissions; BENCHMARKS.md session 17), for
/// tokens that reach the caller four at a time and a stop seen up to 7 steps late (discarded).
pub const DEFAULT_STEPS_PER_SUBMIT: usize = 4;

/// How [`generate_with`](super::generate_with) runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Submissions in flight in the GPU-resident loop (device sampler): 1 = one at a time,
    /// 0 = the readback loop (forward, then sample and wait) even with the device sampler.
    pub depth: usize,
    /// Decode steps recorded into each submission of the GPU-resident loop (1 or more): fewer
    /// submissions, and a stop seen up to `depth · steps_per_submit - 1` steps late.
    pub steps_per_submit: usize,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self { depth: DEFAULT_SUBMISSIONS, steps_per_submit: DEFAULT_STEPS_PER_SUBMIT }
    }
}

impl DecodeOptions {
    /// `depth` submissions in flight of the default steps each.
    pub fn depth(depth: usize) -> Self {
        Self { depth, ..Self::default() }
    }
}

/// Host and GPU time of one decode step.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepTiming {
    /// Host time spent recording the step (uniform writes, the forward pass, the sampler, the
    /// readback copies) and finishing its command buffer. Readback loop: the forward pass's
    /// recording and submission.
    pub encode: Duration,
    /// Host time inside `queue.submit` (readback loop: 0, counted in `encode` and `wait`).
    pub submit: Duration,
    /// Host time blocked waiting for the step's token. Readback loop: the whole sampling call
    /// (the device sampler's recording and submission, or the host sampler's logits readback and
    /// CPU sampling, and the wait).
    pub wait: Duration,
    /// GPU time of the step's compute pass (timestamp queries), where the adapter has them.
    pub gpu: Option<Duration>,
}

#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// Tokens prefilled: the prompt given to the loop.
    pub prompt_tokens: usize,
    /// Positions the KV cache already held when the run began, which the prompt continued
    /// ([`continue_with`](super::continue_with); 0 for [`generate_with`](super::generate_with)).
    pub cached_tokens: usize,
    pub generated_tokens: usize,
    /// Prompt processing including the first sampled token.
    pub prefill: Duration,
    /// Everything after the first token.
    pub decode: Duration,
    /// Why generation ended.
    pub stop: StopReason,
    /// Which loop ran: 0 = readback, else the GPU-resident loop's depth.
    pub depth: usize,
    /// Decode steps a submission of the GPU-resident loop held (0: the readback loop).
    pub steps_per_submit: usize,
    /// Decode steps run past the stop and discarded (their positions rolled back).
    pub discarded_steps: usize,
    /// Dispatches, submits and blocking waits per decode step (the GPU-resident loop: a submit
    /// and a wait a submission of `steps_per_submit` steps, so 1 / `steps_per_submit` a step).
    pub dispatches_per_step: usize,
    pub submits_per_step: f64,
    pub waits_per_step: f64,
    /// One entry per decode step whose token was delivered (not the prefill).
    pub steps: Vec<StepTiming>,
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

/// The error for a step whose logits held a NaN or an infinity.
pub fn non_finite_error(step: u32, pos: usize) -> Error {
    let at = if step == 0 { "the prompt's last position".to_string() } else { format!("decode step {step}") };
    Error::Gpu(format!(
        "the model's logits are not finite (NaN or infinity) at {at} (position {pos}): an activation \
         overflowed or the weights are corrupt; no token was produced from them"
    ))
}

/// What a loop is asked for: up to `max_tokens` tokens after `prompt`, sampled with `params`,
/// ending at a token of `eos` ([`continue_with`](super::continue_with)'s request).
#[derive(Clone, Copy, Debug)]
pub struct Job<'a> {
    pub prompt: &'a [u32],
    pub max_tokens: usize,
    pub params: &'a SamplingParams,
    pub eos: &'a [u32],
}

/// Why a loop stops after delivering `token`, the `produced`-th token (1-based), if it does;
/// `room` is how many tokens the context allows: one per free position after the prompt, plus the
/// one sampled from its last position. Both loops stop by this rule.
pub(super) fn stop_after(
    token: u32,
    produced: usize,
    max_tokens: usize,
    room: usize,
    eos: &[u32],
) -> Option<StopReason> {
    if eos.contains(&token) {
        Some(StopReason::Eos)
    } else if produced >= max_tokens {
        Some(StopReason::MaxTokens)
    } else if produced >= room {
        Some(StopReason::ContextFull)
    } else {
        None
    }
}

/// `room` of [`stop_after`] for a prompt that ends at position `end`.
pub(super) fn room(model: &Model, end: usize) -> usize {
    model.max_ctx - end + 1
}
