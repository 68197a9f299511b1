//! A multi-turn chat whose history stays in the model's KV cache: each turn prefills only what
//! the conversation adds.
//!
//! ```no_run
//! use wgpu_llm::Engine;
//!
//! let mut engine = Engine::load("SmolLM2-135M-Instruct-Q8_0.gguf")?;
//! let mut chat = engine.session().system("Answer in one sentence.").max_tokens(64);
//! for question in ["What is the capital of France?", "And of Italy?"] {
//!     let answer = chat.send(question, |piece| {
//!         print!("{piece}");
//!         Ok(true) // false stops the answer
//!     })?;
//!     // The second turn prefills its own message only: the first is still in the KV cache.
//!     eprintln!("\n[{} new prompt tokens, {} reused]", answer.stats.prompt_tokens, answer.stats.cached_tokens);
//! }
//! # Ok::<(), wgpu_llm::Error>(())
//! ```
//!
//! Each turn renders the whole conversation with the model's chat template ([`crate::chat`]),
//! exactly as a cold run of it would ([`Engine::chat`]), and compares its tokens with the tokens
//! whose KV entries the model holds: the prompt of the last turn and the tokens generated after
//! it (all but the last, which was sampled and never fed). The model is rolled back to the longest
//! common prefix ([`crate::model::Model::rollback`]) and only the rest is prefilled
//! ([`crate::decode::continue_with`]); the first answer token is then sampled with the sampling
//! step counter at 0, as in a cold run. An answer re-tokenized by the template can differ from
//! the tokens sampled (another split of the same text, a template that drops or rewrites earlier
//! answers): the common prefix then ends there.
//!
//! Models with recurrent layers (Qwen3.5's Gated DeltaNet) keep their state only at the ends of
//! the last few passes ([`crate::model::pass::STATE_RING`]), and the steps a pipelined decode ran past
//! its stop may have overwritten the older of those slots. So such a model reuses its history only
//! where the common prefix is all of it (a turn that extends the conversation as the template
//! renders it, the usual case): any other divergence (`/clear`, an earlier message edited, an
//! answer re-tokenized differently) re-prefills the whole conversation from position 0.
//! [`Stats::cached_tokens`](crate::decode::Stats::cached_tokens) says how many positions a turn
//! reused (0 after such a fallback), `prompt_tokens` how many it prefilled.
//!
//! The tokens equal a cold run's of the same conversation (greedy and seeded; tests/chat.rs)
//! up to one difference of arithmetic: the reused positions' KV entries were computed by the
//! passes that ran them (the earlier turn's prefill and one-token decode steps) where a cold run
//! computes them in one prefill, and the two kernels may round differently in the last bits.
//!
//! A turn that fails (a conversation longer than the context, a GPU error) leaves the
//! conversation as it was and forgets the KV history: the next turn prefills from position 0.

use crate::chat::Message;
use crate::engine::{Chat, Engine, Generation, Request, SamplerChoice, Sampling};
use crate::error::Result;

/// A chat on an [`Engine`] ([`Engine::session`]): the conversation so far, the generation
/// settings of its turns, and which tokens the model's KV cache holds.
pub struct Session<'e> {
    engine: &'e mut Engine,
    /// The conversation: system messages first, then the turns.
    messages: Vec<Message>,
    /// Each turn's settings (its prompt and chat are set per turn).
    settings: Request,
    /// The tokens at positions `0..model.pos` of the model's KV cache, as the last turn left them.
    held: Vec<u32>,
}

impl Engine {
    /// A chat whose history stays in this engine's KV cache; it starts empty (the first turn
    /// prefills from position 0), with [`Request::default`]'s settings.
    pub fn session(&mut self) -> Session<'_> {
        Session::new(self)
    }
}

impl<'e> Session<'e> {
    /// An empty conversation on `engine` (see [`Engine::session`]).
    pub fn new(engine: &'e mut Engine) -> Self {
        Self { engine, messages: Vec::new(), settings: Request::default(), held: Vec::new() }
    }

    /// Sets the system message (replacing any earlier one at the start of the conversation).
    pub fn system(mut self, text: impl Into<String>) -> Self {
        let n = self.leading_system();
        self.messages.splice(..n, [Message::system(text)]);
        self
    }
    /// Generated tokens at most in each answer (default 256; the end-of-sequence token counts).
    pub fn max_tokens(mut self, n: usize) -> Self {
        self.settings.max_tokens = n;
        self
    }
    /// The sampling parameters of each turn (default [`Sampling::default`]; a seed, where given,
    /// seeds every turn as it would seed a cold run of it).
    pub fn sampling(mut self, sampling: Sampling) -> Self {
        self.settings.sampling = sampling;
        self
    }
    /// Where sampling runs (default: the device).
    pub fn sampler(mut self, sampler: SamplerChoice) -> Self {
        self.settings.sampler = sampler;
        self
    }

    /// Sends `text` as the user's message and generates the answer, calling `on_piece` with each
    /// piece of text as it completes (returning false stops the answer; an error ends the turn
    /// and is returned). The message and the answer (what was generated, also when stopped)
    /// join the conversation. `stats.cached_tokens` of the result counts the positions reused from
    /// the KV cache, `stats.prompt_tokens` those prefilled.
    pub fn send(
        &mut self,
        text: impl Into<String>,
        mut on_piece: impl FnMut(&str) -> Result<bool>,
    ) -> Result<Generation> {
        let mut conversation = self.messages.clone();
        conversation.push(Message::user(text));
        self.respond(conversation, &mut on_piece)
    }

    /// Generates the assistant's answer to `conversation` (which ends with the user's message),
    /// reusing the KV cache's common prefix; on success the conversation and the answer become
    /// the session's.
    fn respond(
        &mut self,
        conversation: Vec<Message>,
        on_piece: &mut dyn FnMut(&str) -> Result<bool>,
    ) -> Result<Generation> {
        let req = Request {
            chat: Some(Chat { system: None, messages: conversation }),
            prompt: String::new(),
            ..self.settings.clone()
        };
        let params = req.sampling.resolve()?;
        let tokens = self.engine.prompt_ids(&req)?;
        let keep = self.reusable(&tokens);
        let model = self.engine.model_mut();
        if keep == 0 {
            model.reset();
        } else {
            model.rollback(keep);
        }
        self.held.truncate(keep);
        match self.engine.run_tokens(&req, params, &tokens[keep..], false, None, on_piece) {
            Ok(answer) => {
                // What the model holds now: the prompt and the answer but its last token.
                let pos = self.engine.model().pos;
                self.held = tokens;
                self.held.extend_from_slice(&answer.tokens);
                if self.held.len() < pos {
                    self.forget();
                }
                self.held.truncate(pos);
                let Some(Chat { messages, .. }) = req.chat else { unreachable!("set above") };
                self.messages = messages;
                self.messages.push(Message::assistant(answer.text.clone()));
                Ok(answer)
            }
            Err(e) => {
                self.forget();
                Err(e)
            }
        }
    }

    /// How many of `tokens`' positions the model's KV cache holds and can keep: the common
    /// prefix with what it holds, short of the last token (whose logits the first answer token
    /// is sampled from); for a recurrent model, all it holds or nothing.
    fn reusable(&self, tokens: &[u32]) -> usize {
        let model = self.engine.model();
        if self.held.len() != model.pos {
            return 0;
        }
        let common = self.held.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        let keep = common.min(tokens.len().saturating_sub(1));
        if model.is_recurrent() && keep != model.pos {
            0
        } else {
            keep
        }
    }

    /// Forgets the KV history (the next turn prefills from position 0).
    fn forget(&mut self) {
        self.held.clear();
        self.engine.model_mut().reset();
    }

    /// Number of leading system messages.
    fn leading_system(&self) -> usize {
        self.messages.iter().take_while(|m| m.role == "system").count()
    }

    /// The conversation so far (the system message first, where there is one).
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }
    /// Replaces the conversation (a saved one loaded again, an edited history); the next turn
    /// reuses whatever prefix of the KV cache still matches.
    pub fn set_messages(&mut self, messages: Vec<Message>) {
        self.messages = messages;
    }
    /// Forgets the turns, keeping the system message (whose KV entries the next turn can reuse).
    pub fn clear(&mut self) {
        let n = self.leading_system();
        self.messages.truncate(n);
    }
    /// Positions of the KV cache that hold this conversation (the last turn's prompt and answer
    /// but its last token).
    pub fn cached_tokens(&self) -> usize {
        self.held.len()
    }
    /// The settings each turn runs with (its prompt and chat are the turn's).
    pub fn settings(&self) -> &Request {
        &self.settings
    }
    pub fn engine(&self) -> &Engine {
        self.engine
    }
}
