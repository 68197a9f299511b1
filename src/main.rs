//! `wgpu-llm`: run a model (generate, chat), list adapters (devices), measure (bench).

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use wgpu_llm::decode::batch::{BatchEngine, BatchForm, BatchOptions};
use wgpu_llm::decode::{DecodeOptions, DEFAULT_DEPTH, DEFAULT_STEPS_PER_SUBMIT, DEFAULT_SUBMISSIONS};
use wgpu_llm::engine::{Chat, Engine, SamplerChoice, Sampling};
use wgpu_llm::gpu::{list_adapters, BackendChoice, Gpu, GpuOptions};
use wgpu_llm::loader::{Checkpoint, DType};
use wgpu_llm::model::{Model, WeightFormat};
use wgpu_llm::sampling::{LogitControls, SamplingBackend, SamplingParams};

mod cli_bench;
mod cli_chat;

#[derive(Parser)]
#[command(name = "wgpu-llm", version, about = "LLM inference in WGSL compute shaders through wgpu")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt, streaming tokens to stdout.
    Generate(GenerateArgs),
    /// Chat in the terminal: multi-turn, the model's chat template, the history kept in the KV
    /// cache (a turn prefills only its new tokens); /help lists the commands.
    Chat(cli_chat::ChatArgs),
    /// List GPU adapters with the features and limits that matter here.
    Devices {
        #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
        backend: BackendChoice,
    },
    /// Measure prefill and decode throughput.
    Bench(cli_bench::BenchArgs),
    #[cfg(feature = "serve")]
    /// Serve the model over HTTP with the OpenAI API (chat and text completions, streamed or
    /// not), many requests decoded together.
    Serve(ServeArgs),
}

#[derive(Args, Clone)]
struct GpuArgs {
    /// Graphics API.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    backend: BackendChoice,
    /// Adapter index from `wgpu-llm devices` (default: the best one).
    #[arg(long)]
    adapter: Option<usize>,
    /// Do not use shader-f16 even if available.
    #[arg(long)]
    no_f16: bool,
    /// Do not use subgroup operations even if available.
    #[arg(long)]
    no_subgroups: bool,
    /// Do not use cooperative matrices (tensor cores) even if available.
    #[arg(long)]
    no_coop: bool,
    /// Dequantize every linear weight to f16 at load instead of keeping the checkpoint's
    /// quantized blocks on the GPU (more memory; for comparisons).
    #[arg(long, conflicts_with = "quantize")]
    dequantize: bool,
    /// Quantize float weights (F32/F16/BF16 checkpoints) at load to MLX's affine 4- or 8-bit
    /// format, group 64 (weights already quantized in the file stay as they are).
    #[arg(long, value_enum)]
    quantize: Option<QuantizeChoice>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum QuantizeChoice {
    Q4,
    Q8,
}

impl GpuArgs {
    /// The type linear weights take on the GPU.
    fn weight_format(&self) -> WeightFormat {
        match (self.dequantize, self.quantize) {
            (true, _) => WeightFormat::F16,
            (false, None) => WeightFormat::Native,
            (false, Some(q)) => {
                let bits = if matches!(q, QuantizeChoice::Q4) { 4 } else { 8 };
                WeightFormat::Quantize(DType::Affine { bits, group: 64, bf16: false })
            }
        }
    }

    fn options(&self) -> GpuOptions {
        GpuOptions {
            backend: self.backend,
            adapter: self.adapter,
            disable_f16: self.no_f16,
            disable_subgroups: self.no_subgroups,
            disable_coop: self.no_coop,
            emulate: None,
        }
    }

    fn open(&self) -> Result<Gpu> {
        Ok(Gpu::new(&self.options())?)
    }
}

#[derive(Args, Clone, Copy)]
struct SamplingArgs {
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    top_k: u32,
    /// 1 = off.
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    min_p: f32,
    /// RNG seed; random (and printed) when absent.
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, value_enum, default_value_t = SamplerChoice::Device)]
    sampler: SamplerChoice,
    /// With the device sampler, submissions in flight in the one-sequence GPU-resident loop (by
    /// default 2), or decode steps in flight where several sequences are decoded together
    /// (`serve`, `bench --streams`; by default 3); 1 = one at a time, 0 = forward then sample with
    /// a readback each step.
    #[arg(long)]
    pipeline: Option<usize>,
    /// Decode steps recorded into each submission of the one-sequence GPU-resident loop (by
    /// default 4).
    #[arg(long)]
    submit_steps: Option<usize>,
}

impl SamplingArgs {
    /// The parameters, a random seed where none was given, every range checked.
    fn params(&self) -> Result<SamplingParams> {
        let s = Sampling {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            seed: self.seed,
        };
        Ok(s.resolve()?)
    }
    fn decode(&self) -> Result<DecodeOptions> {
        let depth = self.pipeline.unwrap_or(DEFAULT_SUBMISSIONS);
        if depth > 64 {
            anyhow::bail!("--pipeline {depth} is out of range: 0..=64 in flight");
        }
        let steps = self.submit_steps.unwrap_or(DEFAULT_STEPS_PER_SUBMIT);
        if !(1..=64).contains(&steps) {
            anyhow::bail!("--submit-steps {steps} is out of range: 1..=64 decode steps a submission");
        }
        Ok(DecodeOptions { depth, steps_per_submit: steps })
    }

    /// Decode steps in flight when several sequences are decoded together (the batch engine,
    /// which submits a step at a time).
    fn batch_depth(&self) -> Result<usize> {
        self.decode()?;
        if self.submit_steps.is_some() {
            anyhow::bail!("--submit-steps is for one sequence; decoding several at once submits a step at a time");
        }
        Ok(self.pipeline.unwrap_or(DEFAULT_DEPTH))
    }
}

#[derive(Args)]
struct GenerateArgs {
    /// A GGUF file or a Hugging Face folder (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// The prompt; read from stdin when absent.
    #[arg(long)]
    prompt: Option<String>,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Context length (KV cache positions); default min(model maximum, 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// No progress bar or summary.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    gpu: GpuArgs,
    #[command(flatten)]
    constraint: ConstraintArgs,
    #[command(flatten)]
    controls: ControlArgs,
}

/// Structured output: at most one constraint on what `generate` writes.
#[derive(Args)]
#[group(multiple = false)]
struct ConstraintArgs {
    /// Hold the output to the JSON schema in FILE (one JSON value valid under it).
    #[arg(long, value_name = "FILE")]
    json_schema: Option<PathBuf>,
    /// Hold the output to a regular expression (the whole output matches it).
    #[arg(long, value_name = "RE")]
    regex: Option<String>,
    /// Hold the output to the grammar in FILE, in llguidance's Lark syntax (GBNF is refused).
    #[arg(long, value_name = "FILE")]
    grammar: Option<PathBuf>,
}

impl ConstraintArgs {
    fn constraint(&self) -> Result<Option<wgpu_llm::grammar::Constraint>> {
        use wgpu_llm::grammar::Constraint;
        let read = |p: &PathBuf| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()));
        Ok(match (&self.json_schema, &self.regex, &self.grammar) {
            (Some(p), _, _) => Some(Constraint::JsonSchema(read(p)?)),
            (_, Some(rx), _) => Some(Constraint::Regex(rx.clone())),
            (_, _, Some(p)) => Some(Constraint::Lark(read(p)?)),
            _ => None,
        })
    }
}

/// Logit controls (wgpu_llm::sampling::penalty): llama.cpp's repetition penalty, OpenAI's
/// presence / frequency penalties and logit bias, applied before sampling on either sampler.
#[derive(Args)]
struct ControlArgs {
    /// Repetition penalty over the last --repeat-last-n tokens of the prompt and the output
    /// (llama.cpp's; 1.0 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    repeat_penalty: f32,
    /// Tokens the repetition penalty looks back over (0 = off, -1 = all of them).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    repeat_last_n: i64,
    /// Subtracted from the logit of every token already generated, in [-2, 2] (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    presence_penalty: f32,
    /// Times the number of times a token was generated, subtracted from its logit, in [-2, 2].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    frequency_penalty: f32,
    /// Adds BIAS (in [-100, 100]) to the logit of token TOKEN_ID (repeatable).
    #[arg(long, value_name = "TOKEN_ID=BIAS", allow_negative_numbers = true)]
    logit_bias: Vec<String>,
}

impl ControlArgs {
    fn controls(&self) -> Result<LogitControls> {
        use wgpu_llm::sampling::penalty::REPEAT_ALL;
        let mut logit_bias = Vec::new();
        for b in &self.logit_bias {
            let parsed = b.split_once('=').and_then(|(t, v)| Some((t.trim().parse().ok()?, v.trim().parse().ok()?)));
            let Some(pair) = parsed else {
                anyhow::bail!("--logit-bias {b}: expected TOKEN_ID=BIAS (e.g. 42=-100)");
            };
            logit_bias.push(pair);
        }
        let repeat_last_n = match self.repeat_last_n {
            -1 => REPEAT_ALL,
            n => u32::try_from(n).map_err(|_| anyhow::anyhow!("--repeat-last-n {n}: 0 (off), -1 (all) or a count"))?,
        };
        let c = LogitControls {
            logit_bias,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n,
        };
        if let Err((field, msg)) = c.check() {
            anyhow::bail!("--{}: {msg}", field.replace('_', "-"));
        }
        Ok(c)
    }
}

#[cfg(feature = "serve")]
#[derive(Args)]
struct ServeArgs {
    /// A GGUF file or a Hugging Face folder.
    #[arg(long)]
    model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port (0: any free port; the address is printed on stderr as `listening on http://...`).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model id `/v1/models` lists (default: the model file's or folder's name).
    #[arg(long)]
    model_name: Option<String>,
    /// Requests decoded together at most (each holds a KV-cache sequence of --ctx tokens).
    #[arg(long, default_value_t = 8)]
    max_batch: usize,
    /// Requests waiting for a sequence at most; beyond, requests get 429.
    #[arg(long, default_value_t = 64)]
    max_queue: usize,
    /// GPU memory for the prefix cache, in bytes: a request whose prompt starts with tokens of an
    /// earlier one (a chat's next turn, a shared system prompt) prefills only the rest, its
    /// tokens those of a cold run up to rounding. 0 turns it off (every request then gets
    /// exactly the tokens it gets alone). Default: as much as the sequences' own KV caches
    /// (--max-batch x --ctx positions), at most 4 GiB.
    #[arg(long, value_name = "BYTES")]
    prefix_cache_bytes: Option<u64>,
    /// How a batch step computes each sequence's row: `one-token` (every request gets exactly
    /// `generate`'s tokens, at its speed for one client; slower for many) or `batched` (faster
    /// for many); default: one-token with --max-batch 1, else batched.
    #[arg(long, value_name = "FORM")]
    batch_form: Option<BatchFormArg>,
    /// Context of each sequence (prompt plus completion), in tokens; default min(model maximum,
    /// 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// Request bodies above this many bytes get 413.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Seconds a request's headers may take to arrive (and a kept-alive connection may stay idle);
    /// past them the connection is closed.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive; past them it gets 408.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    body_timeout: f64,
    /// Connections open at most; beyond, a connection gets 503 and is closed.
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// On SIGINT/SIGTERM, seconds running requests get to finish (a second signal stops at once).
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    shutdown_timeout: f64,
    /// Sampling for what a request leaves out (as `generate`; a request without a seed gets a
    /// random one, so `--seed` is not taken here).
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// Mesa's implicit Vulkan layer VK_LAYER_MESA_device_select, when it enumerates devices, looks
/// for a Wayland compositor to put its GPU first; on a machine without one (a server, CI) that
/// prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` twice, although
/// nothing is wrong. The layer only orders adapters, which this program orders itself, so it is
/// switched off (its documented `NODEVICE_SELECT=1`) where it would print that, unless the user
/// asked it for a device (`MESA_VK_DEVICE_SELECT`). Runs first, before any thread exists.
fn quiet_mesa_device_select() {
    #[cfg(target_os = "linux")]
    {
        let runtime_dir = std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
        let asked = ["NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT"].iter().any(|v| std::env::var_os(v).is_some());
        if !runtime_dir && !asked {
            std::env::set_var("NODEVICE_SELECT", "1");
        }
    }
}

fn main() -> ExitCode {
    quiet_mesa_device_select();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Devices { backend } => devices(backend),
        Cmd::Generate(a) => run_generate(a),
        Cmd::Chat(a) => cli_chat::run(a),
        Cmd::Bench(a) => cli_bench::run(a),
        #[cfg(feature = "serve")]
        Cmd::Serve(a) => run_serve(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn devices(backend: BackendChoice) -> Result<()> {
    let list = list_adapters(backend);
    if list.is_empty() {
        anyhow::bail!("no GPU adapter found for backend {backend:?} (without a GPU on Linux: apt-get install mesa-vulkan-drivers libvulkan1)");
    }
    for a in list {
        println!("{a}");
        // The tuning profile and the rule table's rows that apply (src/tuning, TUNING.md), with the
        // knobs the environment or WGPU_LLM_TUNING set.
        let t = a.tuning().override_from_env()?;
        println!("{}", t.profile);
        let measured = if t.profile.family == wgpu_llm::tuning::Family::NvidiaHopper {
            "measured on this family (H100)".to_string()
        } else {
            format!(
                "the rows were measured on the H100 only: {:?} is measured nowhere else and takes them as H100 defaults",
                t.profile.family
            )
        };
        println!("    tuning rules (op [family] shape: choice (citation)), {measured}:");
        for r in t.applicable() {
            println!("      {r}");
        }
        if t.knobs != Default::default() {
            println!("    knobs set: {:?}", t.knobs);
        }
    }
    Ok(())
}

fn sampler(choice: SamplerChoice, gpu: &Gpu) -> Result<Box<dyn SamplingBackend + Send>> {
    Ok(choice.backend(gpu)?)
}

/// A progress bar on stderr for loading `ck` onto `gpu` (hidden when `quiet`).
fn load_bar(ck: &Checkpoint, gpu: &Gpu, quiet: bool) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(1);
    b.set_style(
        indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors groups ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    b.set_message(format!("{} on {}", ck.config.arch.name(), gpu.info.name));
    b
}

/// The progress callback that moves `bar`.
fn progress(bar: &indicatif::ProgressBar) -> impl FnMut(usize, usize) + '_ {
    |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    }
}

/// Uploads a checkpoint's weights with a progress bar on stderr.
fn load(ck: &Checkpoint, gpu: &Gpu, ctx: Option<usize>, format: WeightFormat, quiet: bool) -> Result<Model> {
    let bar = load_bar(ck, gpu, quiet);
    let model = Model::load_with(gpu, ck, ctx, format, &mut progress(&bar))?;
    bar.finish_and_clear();
    Ok(model)
}

fn run_generate(a: GenerateArgs) -> Result<()> {
    let prompt = match &a.prompt {
        Some(p) => p.clone(),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("reading the prompt from stdin")?;
            s
        }
    };
    let params = a.sampling.params()?;
    let constraint = a.constraint.constraint()?;
    if let Some(c) = &constraint {
        c.check()?;
    }
    let req = wgpu_llm::engine::Request {
        prompt,
        chat: a.chat.then(|| Chat { system: a.system.clone(), messages: vec![] }),
        max_tokens: a.max_tokens,
        sampling: Sampling::from(params),
        sampler: a.sampling.sampler,
        controls: a.controls.controls()?,
    };
    // The checkpoint, its tokenizer and the prompt are checked before the GPU is touched: bad
    // input gets its error at once, on any machine.
    let t_load = std::time::Instant::now();
    let opened = Engine::builder(&a.model)
        .ctx(a.ctx)
        .weights(a.gpu.weight_format())
        .decode_options(a.sampling.decode()?)
        .open()?;
    opened.prompt_ids(&req)?;
    let arch = opened.checkpoint().config.arch.name();
    let gpu = a.gpu.open()?;
    let bar = load_bar(opened.checkpoint(), &gpu, a.quiet);
    let mut engine = opened.progress(progress(&bar)).load_on(&gpu)?;
    bar.finish_and_clear();
    if a.sampling.seed.is_none() && !params.is_greedy() {
        eprintln!("seed: {}", params.seed);
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let mut out = std::io::stdout().lock();
    // A closed pipe (`| head`) ends generation quietly; any other write error (a full disk) is an
    // error.
    let mut closed = false;
    let mut emit = |text: &str| -> wgpu_llm::Result<bool> {
        if closed {
            return Ok(false);
        }
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                closed = true;
                Ok(false)
            }
            Err(e) => Err(wgpu_llm::Error::io("standard output", e)),
        }
    };
    let stats = engine.run_constrained(&req, constraint.as_ref(), &mut emit)?.stats;
    emit("\n")?;
    if !a.quiet {
        let model = engine.model();
        eprintln!(
            "[{} on {} | load {:.2}s, weights {:.0} MB ({}) | prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s | sampler {:?} | stop: {:?}]",
            arch,
            model.gpu.info.name,
            load_s,
            model.weights.bytes as f64 / 1e6,
            model.weights.summary(),
            stats.prompt_tokens,
            stats.prefill_tok_s(),
            stats.generated_tokens,
            stats.decode_tok_s(),
            a.sampling.sampler,
            stats.stop
        );
    }
    Ok(())
}

#[cfg(feature = "serve")]
fn run_serve(a: ServeArgs) -> Result<()> {
    use wgpu_llm::serve::{worker::Worker, Ended, Limits, ServerState};
    use wgpu_llm::tokenizer::Tokenizer;
    if a.sampling.seed.is_some() {
        anyhow::bail!("serve takes no --seed: each request has its own (`seed`), or a random one");
    }
    let defaults = a.sampling.params()?;
    let depth = a.sampling.batch_depth()?;
    if a.max_batch == 0 {
        anyhow::bail!("--max-batch must be at least 1");
    }
    if a.max_connections == 0 {
        anyhow::bail!("--max-connections must be at least 1");
    }
    let secs = |v: f64, flag: &str| {
        std::time::Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("--{flag} {v}: a number of seconds above 0"))
    };
    let limits = Limits {
        header_timeout: secs(a.header_timeout, "header-timeout")?,
        body_timeout: secs(a.body_timeout, "body-timeout")?,
        max_connections: a.max_connections,
        drain: secs(a.shutdown_timeout, "shutdown-timeout")?,
    };
    let ck = Checkpoint::open(&a.model)?;
    let tokenizer = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id)?;
    let template = match ck.chat_template.as_deref() {
        Some(t) => Some(
            wgpu_llm::chat::ChatTemplate::new(t, ck.bos_token.as_deref(), ck.eos_token.as_deref())
                .context("the model's chat template")?,
        ),
        None => None,
    };
    // Bind before the weights load: a port in use is an error at once.
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting tokio")?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((a.host.as_str(), a.port)))
        .with_context(|| format!("listening on {}:{}", a.host, a.port))?;
    let gpu = a.gpu.open()?;
    let model = load(&ck, &gpu, a.ctx, a.gpu.weight_format(), false)?;
    let max_ctx = model.max_ctx;
    let prefix_cache_bytes =
        a.prefix_cache_bytes.unwrap_or_else(|| wgpu_llm::decode::prefix::default_bytes(&model, a.max_batch));
    let engine = BatchEngine::new(
        model,
        sampler(a.sampling.sampler, &gpu)?,
        BatchOptions {
            form: a.batch_form.map(BatchFormArg::form),
            prefix_cache_bytes,
            ..BatchOptions::new(a.max_batch, a.max_queue)
        },
        depth,
    )?;
    let together = if engine.is_batched() {
        format!("{} sequences decoded together, {:?} form", a.max_batch, engine.model().batch_form())
    } else {
        "one sequence at a time (recurrent or mixture-of-experts layers)".to_string()
    };
    let worker = Worker::spawn(engine).context("starting the engine thread")?;
    let model_name = a.model_name.clone().unwrap_or_else(|| {
        let p = a.model.canonicalize().unwrap_or_else(|_| a.model.clone());
        p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into())
    });
    let grammar = wgpu_llm::grammar::Vocabulary::new(&tokenizer, ck.config.vocab_size, &ck.config.eos_token_ids)
        .map_err(|e| e.to_string());
    if let Err(e) = &grammar {
        eprintln!("warning: no structured output (response_format): {e}");
    }
    let state = std::sync::Arc::new(ServerState {
        worker,
        tokenizer: std::sync::Arc::new(tokenizer),
        template,
        stop_ids: ck.config.eos_token_ids.clone(),
        grammar,
        max_ctx,
        model_name,
        defaults,
        max_body_bytes: a.max_body_bytes,
        limits,
        created: wgpu_llm::serve::now(),
    });
    let addr = listener.local_addr().context("the listening address")?;
    eprintln!(
        "{} on {}: {}, {} tokens each, queue {}, sampler {:?}, prefix cache {} MiB",
        ck.config.arch.name(),
        gpu.info.name,
        together,
        max_ctx,
        a.max_queue,
        a.sampling.sampler,
        prefix_cache_bytes >> 20
    );
    eprintln!("listening on http://{addr}");
    let ended = rt
        .block_on(async { wgpu_llm::serve::serve(listener, state, wgpu_llm::serve::signals()?).await })
        .context("serving")?;
    // Whatever still runs (the engine's thread, connections past the deadline) ends with the
    // process.
    rt.shutdown_background();
    match ended {
        Ended::Drained => Ok(()),
        Ended::DeadlinePassed(n) => {
            anyhow::bail!("stopped after --shutdown-timeout with {n} connection(s) still open")
        }
        Ended::Forced(n) => anyhow::bail!("stopped by a second signal with {n} connection(s) still open"),
    }
}

/// `--batch-form`: [`BatchForm`]'s values on the command line.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum BatchFormArg {
    OneToken,
    Batched,
}

impl BatchFormArg {
    fn form(self) -> BatchForm {
        match self {
            BatchFormArg::OneToken => BatchForm::OneToken,
            BatchFormArg::Batched => BatchForm::Batched,
        }
    }
}
