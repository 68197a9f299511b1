//! The engine for a program that embeds wgpu-llm: a model with its tokenizer, chat template and
//! stop tokens loaded in one call, and a builder for each generation.
//!
//! ```no_run
//! use wgpu_llm::Engine;
//!
//! let mut engine = Engine::load("SmolLM2-135M-Instruct-Q8_0.gguf")?;
//! let answer = engine
//!     .generate("What is the capital of France?")
//!     .chat(true)
//!     .max_tokens(64)
//!     .temperature(0.0)
//!     .stream(|piece| {
//!         print!("{piece}");
//!         true // false stops the generation
//!     })?;
//! eprintln!("\n{} tokens at {:.1} tok/s", answer.stats.generated_tokens, answer.stats.decode_tok_s());
//! # Ok::<(), wgpu_llm::Error>(())
//! ```
//!
//! This is what `wgpu-llm generate` runs: the prompt (or a conversation, with
//! [`chat`](Generate::chat) or [`messages`](Generate::messages)) goes through the model's chat
//! template ([`crate::chat`]), generation stops at the model's end-of-sequence tokens, and a run
//! without a [`seed`](Generate::seed) gets a random one, reported in [`Generation::seed`]. The
//! decoding itself is [`decode::generate_with`]. Several sequences decoded together are
//! [`decode::batch`]'s business.
//!
//! Loading is two steps where a caller wants bad input refused before a GPU is touched:
//! [`EngineBuilder::open`] reads the checkpoint's description, tokenizer and template
//! ([`Opened`], which can already [encode](Opened::prompt_ids) a request), and
//! [`Opened::load`] puts the weights on the GPU.

use crate::chat::{ChatTemplate, Message};
use crate::decode::{self, DecodeOptions, Stats};
use crate::error::{Error, Result};
use crate::gpu::{BackendChoice, Gpu, GpuOptions};
use crate::grammar::{Constraint, Matcher, Vocabulary};
use crate::loader::Checkpoint;
use crate::model::{Model, WeightFormat};
use crate::sampling::{random_seed, DeviceSampler, HostSampler, LogitControls, SamplingBackend, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::path::{Path, PathBuf};

/// Where the sampling head runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum SamplerChoice {
    /// WGSL sampling head: logits never leave the GPU.
    #[default]
    Device,
    /// Read logits back and sample on the CPU (reference).
    Host,
}

impl SamplerChoice {
    /// A sampler of this kind on `gpu`.
    pub fn backend(self, gpu: &Gpu) -> Result<Box<dyn SamplingBackend + Send>> {
        Ok(match self {
            SamplerChoice::Host => Box::new(HostSampler),
            SamplerChoice::Device => Box::new(DeviceSampler::new(gpu)?),
        })
    }
}

/// Sampling parameters as a user gives them: [`SamplingParams`] with the seed optional.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: u32,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// The RNG seed; `None`: a random one ([`Generation::seed`] says which).
    pub seed: Option<u64>,
}

impl Default for Sampling {
    /// `wgpu-llm generate`'s defaults, llama.cpp's default chain: temperature 0.8, top-k 40,
    /// top-p 0.95, min-p 0.05, a random seed.
    fn default() -> Self {
        Self { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, seed: None }
    }
}

impl Sampling {
    /// Greedy decoding (temperature 0; the filters then do nothing).
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// The parameters the samplers take: the seed drawn at random where none was given, and
    /// every range checked ([`SamplingParams::validate`]).
    pub fn resolve(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed.unwrap_or_else(random_seed),
        };
        p.validate()?;
        Ok(p)
    }
}

impl From<SamplingParams> for Sampling {
    fn from(p: SamplingParams) -> Self {
        Self { temperature: p.temperature, top_k: p.top_k, top_p: p.top_p, min_p: p.min_p, seed: Some(p.seed) }
    }
}

/// A conversation for the model's chat template: a system message and earlier turns, before the
/// request's prompt as the user's message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chat {
    pub system: Option<String>,
    pub messages: Vec<Message>,
}

/// One generation's input and settings; [`Engine::generate`] builds one with [`Generate`]'s
/// methods, [`Engine::run`] takes one as it is.
///
/// With `chat`, the model's chat template renders the conversation (its `system` message, its
/// `messages`, then `prompt` as the user's message, left out when empty) and the header of the
/// assistant's turn; without, `prompt` is the text to continue. `max_tokens` counts the
/// end-of-sequence token.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub prompt: String,
    pub chat: Option<Chat>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub sampler: SamplerChoice,
    /// `logit_bias` and the presence, frequency and repetition penalties (default: off).
    pub controls: LogitControls,
}

impl Default for Request {
    /// `wgpu-llm generate`'s defaults: no chat, 256 tokens, [`Sampling::default`] on the device.
    fn default() -> Self {
        Self {
            prompt: String::new(),
            chat: None,
            max_tokens: 256,
            sampling: Sampling::default(),
            sampler: SamplerChoice::Device,
            controls: LogitControls::default(),
        }
    }
}

impl Request {
    /// A request for `prompt` with the defaults.
    pub fn new(prompt: impl Into<String>) -> Self {
        Self { prompt: prompt.into(), ..Self::default() }
    }

    /// The conversation the chat template renders (`None` without chat).
    pub fn conversation(&self) -> Option<Vec<Message>> {
        let chat = self.chat.as_ref()?;
        let mut msgs = Vec::with_capacity(chat.messages.len() + 2);
        if let Some(s) = &chat.system {
            msgs.push(Message::system(s));
        }
        msgs.extend(chat.messages.iter().cloned());
        if !self.prompt.is_empty() || msgs.is_empty() {
            msgs.push(Message::user(&self.prompt));
        }
        Some(msgs)
    }
}

/// What a generation produced: the text (special tokens left out; the streamed pieces,
/// concatenated), every sampled token in order (the end-of-sequence token included where one
/// ended it), the seed used (drawn at random where the request gave none), and the timings,
/// counts and why generation ended ([`decode::StopReason`]; the prompt's length is
/// `stats.prompt_tokens`, its tokens [`Engine::prompt_ids`]).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    pub seed: u64,
    pub stats: Stats,
}

/// The text side of a model: tokenizer, chat template, stop tokens.
struct Text {
    tokenizer: Tokenizer,
    /// The model's template compiled, or why it did not compile (an error only for chat).
    template: Option<std::result::Result<ChatTemplate, String>>,
    stop_ids: Vec<u32>,
}

impl Text {
    fn new(ck: &Checkpoint) -> Result<Self> {
        let tokenizer = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id)?;
        let template = ck.chat_template.as_deref().map(|t| {
            ChatTemplate::new(t, ck.bos_token.as_deref(), ck.eos_token.as_deref()).map_err(|e| match e {
                Error::Template(m) => m,
                e => e.to_string(),
            })
        });
        Ok(Self { tokenizer, template, stop_ids: ck.config.eos_token_ids.clone() })
    }

    fn render(&self, messages: &[Message]) -> Result<String> {
        match &self.template {
            Some(Ok(t)) => t.render(messages, true),
            Some(Err(m)) => Err(Error::Template(m.clone())),
            None => Err(crate::chat::no_template_error()),
        }
    }

    fn prompt_ids(&self, req: &Request) -> Result<Vec<u32>> {
        let text = match req.conversation() {
            Some(msgs) => self.render(&msgs)?,
            None => req.prompt.clone(),
        };
        // Adds BOS only where the model wants one and the text (a rendered template) lacks it.
        self.tokenizer.encode(&text, true)
    }
}

/// How to load an [`Engine`]: [`Engine::builder`].
pub struct EngineBuilder<'p> {
    path: PathBuf,
    gpu: GpuOptions,
    ctx: Option<usize>,
    weights: WeightFormat,
    decode: DecodeOptions,
    progress: Option<Box<dyn FnMut(usize, usize) + 'p>>,
}

impl<'p> EngineBuilder<'p> {
    /// Graphics API (default: Vulkan or Metal, whichever the platform has).
    pub fn backend(mut self, backend: BackendChoice) -> Self {
        self.gpu.backend = backend;
        self
    }
    /// Adapter index from [`crate::gpu::list_adapters`] (default: the best one).
    pub fn adapter(mut self, index: usize) -> Self {
        self.gpu.adapter = Some(index);
        self
    }
    /// Every GPU option at once (backend, adapter, features left unused).
    pub fn gpu_options(mut self, options: GpuOptions) -> Self {
        self.gpu = options;
        self
    }
    /// Context length (KV cache positions); `None`: min(the model's maximum, 4096).
    pub fn ctx(mut self, ctx: impl Into<Option<usize>>) -> Self {
        self.ctx = ctx.into();
        self
    }
    /// The type linear weights take on the GPU (default: the checkpoint's own).
    pub fn weights(mut self, format: WeightFormat) -> Self {
        self.weights = format;
        self
    }
    /// How the decode loop runs (submissions in flight, steps a submission; default
    /// [`DecodeOptions::default`]).
    pub fn decode_options(mut self, opts: DecodeOptions) -> Self {
        self.decode = opts;
        self
    }
    /// Called with (groups done, groups in all) as the weights upload.
    pub fn progress(mut self, f: impl FnMut(usize, usize) + 'p) -> Self {
        self.progress = Some(Box::new(f));
        self
    }

    /// Opens the checkpoint (memory-mapped), its tokenizer and chat template, without a GPU.
    pub fn open(self) -> Result<Opened<'p>> {
        let ck = Checkpoint::open(&self.path)?;
        let text = Text::new(&ck)?;
        Ok(Opened { ck, text, builder: self })
    }

    /// Opens the checkpoint and the GPU and uploads the weights.
    pub fn load(self) -> Result<Engine> {
        self.open()?.load()
    }
}

/// A checkpoint opened with its tokenizer and chat template, its weights not on a GPU yet
/// ([`EngineBuilder::open`]).
pub struct Opened<'p> {
    ck: Checkpoint,
    text: Text,
    builder: EngineBuilder<'p>,
}

impl<'p> Opened<'p> {
    /// Called with (groups done, groups in all) as the weights upload
    /// ([`EngineBuilder::progress`], for a caller who sets it up once the checkpoint is open).
    pub fn progress(mut self, f: impl FnMut(usize, usize) + 'p) -> Self {
        self.builder.progress = Some(Box::new(f));
        self
    }
    pub fn checkpoint(&self) -> &Checkpoint {
        &self.ck
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.text.tokenizer
    }
    /// The prompt tokens `req` gives: its text, or its conversation through the chat template.
    pub fn prompt_ids(&self, req: &Request) -> Result<Vec<u32>> {
        self.text.prompt_ids(req)
    }

    /// Opens the GPU the builder's options name and uploads the weights.
    pub fn load(self) -> Result<Engine> {
        let gpu = Gpu::new(&self.builder.gpu)?;
        self.load_on(&gpu)
    }

    /// Uploads the weights to `gpu`.
    pub fn load_on(mut self, gpu: &Gpu) -> Result<Engine> {
        let b = &mut self.builder;
        let mut none = |_: usize, _: usize| {};
        let progress: &mut dyn FnMut(usize, usize) = match &mut b.progress {
            Some(f) => f.as_mut(),
            None => &mut none,
        };
        let model = Model::load_with(gpu, &self.ck, b.ctx, b.weights, progress)?;
        Ok(Engine { model, text: self.text, decode: b.decode, device_sampler: None, grammar: None })
    }
}

/// A model on the GPU with its tokenizer, chat template and stop tokens.
pub struct Engine {
    model: Model,
    text: Text,
    decode: DecodeOptions,
    /// Made at the first generation that samples on the device, kept for the next.
    device_sampler: Option<DeviceSampler>,
    /// The vocabulary for structured output, made at the first constrained generation.
    grammar: Option<Vocabulary>,
}

impl Engine {
    /// Loads the checkpoint at `path` (a GGUF file or a Hugging Face folder) on the best GPU,
    /// with the default options.
    pub fn load(path: impl AsRef<Path>) -> Result<Engine> {
        Self::builder(path).load()
    }

    /// Options for loading: backend, adapter, context length, weight format, progress.
    pub fn builder<'p>(path: impl AsRef<Path>) -> EngineBuilder<'p> {
        EngineBuilder {
            path: path.as_ref().to_path_buf(),
            gpu: GpuOptions::default(),
            ctx: None,
            weights: WeightFormat::Native,
            decode: DecodeOptions::default(),
            progress: None,
        }
    }

    /// A generation continuing `prompt` (or, with [`chat`](Generate::chat), answering it),
    /// configured by [`Generate`]'s methods and run by [`Generate::run`] or
    /// [`Generate::stream`].
    pub fn generate(&mut self, prompt: impl Into<String>) -> Generate<'_> {
        Generate { engine: self, req: Request::new(prompt), constraint: None }
    }

    /// A generation answering the conversation `messages` through the chat template.
    pub fn chat(&mut self, messages: &[Message]) -> Generate<'_> {
        self.generate("").messages(messages)
    }

    /// Runs `req`, calling `on_piece` with each piece of text as it completes (returning false
    /// stops the generation; the text held back, if any, still comes as a last piece).
    pub fn run(&mut self, req: &Request, on_piece: &mut dyn FnMut(&str) -> Result<bool>) -> Result<Generation> {
        self.run_constrained(req, None, on_piece)
    }

    /// [`run`](Self::run) with the output held to `constraint` ([`crate::grammar`]; `None`:
    /// free): an invalid schema or grammar is an error before the GPU runs; an output the limit
    /// cuts short ends with [`decode::StopReason::MaxTokens`], never as complete.
    pub fn run_constrained(
        &mut self,
        req: &Request,
        constraint: Option<&Constraint>,
        on_piece: &mut dyn FnMut(&str) -> Result<bool>,
    ) -> Result<Generation> {
        let params = req.sampling.resolve()?;
        let prompt_tokens = self.text.prompt_ids(req)?;
        let matcher = match constraint {
            Some(c) => {
                let vocab = match &self.grammar {
                    Some(v) => v,
                    None => self.grammar.insert(Vocabulary::new(
                        &self.text.tokenizer,
                        self.model.config.vocab_size,
                        &self.text.stop_ids,
                    )?),
                };
                Some(vocab.matcher(c)?)
            }
            None => None,
        };
        self.run_tokens(req, params, &prompt_tokens, true, matcher, on_piece)
    }

    /// Generates with `req`'s settings and `params` after `prompt_tokens`: from an empty context
    /// (`fresh`, [`decode::generate_with`], or held to `matcher`: [`decode::constrained::generate`])
    /// or after what the model holds ([`decode::continue_with`]; not constrained).
    pub(crate) fn run_tokens(
        &mut self,
        req: &Request,
        params: SamplingParams,
        prompt_tokens: &[u32],
        fresh: bool,
        mut matcher: Option<Matcher>,
        on_piece: &mut dyn FnMut(&str) -> Result<bool>,
    ) -> Result<Generation> {
        if matcher.is_some() && !fresh {
            return Err(Error::Unsupported("a constrained generation after a kept history".into()));
        }
        let mut host = HostSampler;
        let sampler: &mut dyn SamplingBackend = match req.sampler {
            SamplerChoice::Host => &mut host,
            SamplerChoice::Device => match &mut self.device_sampler {
                Some(s) => s,
                None => self.device_sampler.insert(DeviceSampler::new(&self.model.gpu)?),
            },
        };
        let stop = &self.text.stop_ids;
        let mut stream = StreamDecoder::new(&self.text.tokenizer);
        let mut tokens = Vec::new();
        let mut text = String::new();
        let mut on_token = |t| {
            tokens.push(t);
            if !stop.contains(&t) {
                if let Some(piece) = stream.push(t)? {
                    text.push_str(&piece);
                    return on_piece(&piece);
                }
            }
            Ok(true)
        };
        let (model, max) = (&mut self.model, req.max_tokens);
        let stats = match &mut matcher {
            Some(m) => {
                let job = decode::Job { prompt: prompt_tokens, max_tokens: max, params: &params, eos: stop };
                decode::constrained::generate_controlled(model, sampler, job, m, &req.controls, &mut on_token)?
            }
            None => {
                let job = decode::Job { prompt: prompt_tokens, max_tokens: max, params: &params, eos: stop };
                decode::run_job(model, sampler, fresh, job, &req.controls, &mut on_token, self.decode)?
            }
        };
        if let Some(rest) = stream.finish()? {
            text.push_str(&rest);
            on_piece(&rest)?;
        }
        Ok(Generation { text, tokens, seed: params.seed, stats })
    }

    /// The prompt tokens `req` gives: its text, or its conversation through the chat template.
    pub fn prompt_ids(&self, req: &Request) -> Result<Vec<u32>> {
        self.text.prompt_ids(req)
    }
    /// The conversation rendered by the model's chat template, ending with the header of the
    /// assistant's turn.
    pub fn render_chat(&self, messages: &[Message]) -> Result<String> {
        self.text.render(messages)
    }
    pub fn model(&self) -> &Model {
        &self.model
    }
    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }
    /// The model and its parts, for the lower-level APIs ([`decode::batch`]).
    pub fn into_model(self) -> Model {
        self.model
    }
    pub fn gpu(&self) -> &Gpu {
        &self.model.gpu
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.text.tokenizer
    }
    /// The tokens that end a generation (the model's end-of-sequence tokens).
    pub fn stop_ids(&self) -> &[u32] {
        &self.text.stop_ids
    }
    /// Whether the model ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.text.template.is_some()
    }
    /// How the decode loop runs ([`EngineBuilder::decode_options`]).
    pub fn set_decode_options(&mut self, opts: DecodeOptions) {
        self.decode = opts;
    }
    /// The context length: prompt plus generated tokens at most.
    pub fn max_ctx(&self) -> usize {
        self.model.max_ctx
    }
}

/// One generation being configured ([`Engine::generate`]); [`run`](Self::run) or
/// [`stream`](Self::stream) runs it.
#[must_use = "a generation does nothing until run or streamed"]
pub struct Generate<'e> {
    engine: &'e mut Engine,
    req: Request,
    constraint: Option<Constraint>,
}

/// Builder methods that set one field of the request each.
macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident($ty:ty) => $($field:ident).+;)*) => {
        $($(#[$doc])* pub fn $name(mut self, value: $ty) -> Self {
            self.req.$($field).+ = value;
            self
        })*
    };
}

impl Generate<'_> {
    setters! {
        /// Generated tokens at most (default 256).
        max_tokens(usize) => max_tokens;
        /// 0 = greedy (default 0.8).
        temperature(f32) => sampling.temperature;
        /// 0 = off (default 40).
        top_k(u32) => sampling.top_k;
        /// 1 = off (default 0.95).
        top_p(f32) => sampling.top_p;
        /// 0 = off (default 0.05).
        min_p(f32) => sampling.min_p;
        /// All sampling parameters at once.
        sampling(Sampling) => sampling;
        /// Where sampling runs (default: the device).
        sampler(SamplerChoice) => sampler;
        /// `logit_bias` and the presence, frequency and repetition penalties (default: off).
        controls(LogitControls) => controls;
    }
    /// Wrap the prompt as a user message in the model's chat template (false: plain text, and
    /// any system message or earlier turns dropped).
    pub fn chat(mut self, on: bool) -> Self {
        self.req.chat = on.then(|| self.req.chat.take().unwrap_or_default());
        self
    }
    /// A system message (implies chat).
    pub fn system(mut self, text: impl Into<String>) -> Self {
        self.req.chat.get_or_insert_with(Chat::default).system = Some(text.into());
        self
    }
    /// Earlier turns, before the prompt (implies chat).
    pub fn messages(mut self, messages: &[Message]) -> Self {
        self.req.chat.get_or_insert_with(Chat::default).messages = messages.to_vec();
        self
    }
    /// The RNG seed (default: a random one, reported in [`Generation::seed`]).
    pub fn seed(mut self, seed: u64) -> Self {
        self.req.sampling.seed = Some(seed);
        self
    }
    /// The request as configured so far.
    pub fn request(&self) -> &Request {
        &self.req
    }

    /// Hold the output to a JSON schema, a regex or a grammar ([`crate::grammar`]).
    pub fn constraint(mut self, constraint: Constraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// Generates and returns the whole text.
    pub fn run(self) -> Result<Generation> {
        self.try_stream(|_| Ok(true))
    }
    /// Generates, calling `on_piece` with each piece of text as it completes; returning false
    /// stops the generation.
    pub fn stream(self, mut on_piece: impl FnMut(&str) -> bool) -> Result<Generation> {
        self.try_stream(|piece| Ok(on_piece(piece)))
    }
    /// [`stream`](Self::stream) with a callback that can fail (the error ends the generation
    /// and is returned).
    pub fn try_stream(self, mut on_piece: impl FnMut(&str) -> Result<bool>) -> Result<Generation> {
        self.engine.run_constrained(&self.req, self.constraint.as_ref(), &mut on_piece)
    }
}
