//! `wgpu-llm`: run a model (generate), list adapters (devices), measure (bench).

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use wgpu_llm::chat::{apply_chat_template, Message};
use wgpu_llm::generate::generate;
use wgpu_llm::gpu::{list_adapters, BackendChoice, Gpu, GpuOptions};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{random_seed, DeviceSampler, HostSampler, SamplingBackend, SamplingParams};
use wgpu_llm::tokenizer::{StreamDecoder, Tokenizer};

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
    /// List GPU adapters with the features and limits that matter here.
    Devices {
        #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
        backend: BackendChoice,
    },
    /// Measure prefill and decode throughput.
    Bench(BenchArgs),
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
}

impl GpuArgs {
    fn open(&self) -> Result<Gpu> {
        Ok(Gpu::new(&GpuOptions {
            backend: self.backend,
            adapter: self.adapter,
            disable_f16: self.no_f16,
            disable_subgroups: self.no_subgroups,
        })?)
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum SamplerChoice {
    /// WGSL sampling head: logits never leave the GPU.
    Device,
    /// Read logits back and sample on the CPU (reference).
    Host,
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
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 40)]
    top_k: u32,
    /// 1 = off.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// RNG seed; random (and printed) when absent.
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, value_enum, default_value_t = SamplerChoice::Device)]
    sampler: SamplerChoice,
    /// Context length (KV cache positions); default min(model maximum, 4096).
    #[arg(long)]
    ctx: Option<usize>,
    /// No progress bar or summary.
    #[arg(long, short)]
    quiet: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

#[derive(Args)]
struct BenchArgs {
    #[arg(long)]
    model: PathBuf,
    /// Prompt tokens for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Tokens for the decode measurement.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    #[arg(long, value_enum, default_value_t = SamplerChoice::Device)]
    sampler: SamplerChoice,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    gpu: GpuArgs,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Devices { backend } => devices(backend),
        Cmd::Generate(a) => run_generate(a),
        Cmd::Bench(a) => run_bench(a),
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
    }
    Ok(())
}

fn sampler(choice: SamplerChoice, gpu: &Gpu) -> Result<Box<dyn SamplingBackend>> {
    Ok(match choice {
        SamplerChoice::Host => Box::new(HostSampler),
        SamplerChoice::Device => Box::new(DeviceSampler::new(gpu)?),
    })
}

/// Loads a checkpoint and its weights with a progress bar on stderr.
fn load(path: &std::path::Path, gpu: &Gpu, ctx: Option<usize>, quiet: bool) -> Result<(Checkpoint, Model)> {
    let ck = Checkpoint::open(path)?;
    let bar = if quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let b = indicatif::ProgressBar::new(1);
        b.set_style(
            indicatif::ProgressStyle::with_template("loading {msg} [{bar:30}] {pos}/{len} tensors groups ({elapsed})")
                .expect("valid template")
                .progress_chars("=> "),
        );
        b.set_message(format!("{} on {}", ck.config.arch.name(), gpu.info.name));
        b
    };
    let model = Model::load(gpu, &ck, ctx, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    Ok((ck, model))
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
    let seed = a.seed.unwrap_or_else(random_seed);
    let params = SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, min_p: a.min_p, seed };
    params.validate()?;
    let gpu = a.gpu.open()?;
    let t_load = std::time::Instant::now();
    let (ck, mut model) = load(&a.model, &gpu, a.ctx, a.quiet)?;
    let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id)?;
    let text = if a.chat {
        let template = ck.chat_template.as_deref().context("this model ships no chat template; run without --chat")?;
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &prompt));
        apply_chat_template(template, &msgs, true, ck.bos_token.as_deref(), ck.eos_token.as_deref())?
    } else {
        prompt
    };
    // encode adds BOS only where the model wants one and the text (a rendered template) lacks it.
    let ids = tok.encode(&text, true)?;
    if a.seed.is_none() && a.temperature > 0.0 {
        eprintln!("seed: {seed}");
    }
    let load_s = t_load.elapsed().as_secs_f64();
    let mut sampler = sampler(a.sampler, &gpu)?;
    let mut stream = StreamDecoder::new(&tok);
    let mut out = std::io::stdout().lock();
    let eos = ck.config.eos_token_ids.clone();
    let stats = generate(&mut model, sampler.as_mut(), &ids, a.max_tokens, &params, &eos, &mut |t| {
        if !eos.contains(&t) {
            if let Some(piece) = stream.push(t)? {
                out.write_all(piece.as_bytes()).ok();
                out.flush().ok();
            }
        }
        Ok(true)
    })?;
    let rest = stream.finish()?.unwrap_or_default();
    writeln!(out, "{rest}").ok();
    if !a.quiet {
        eprintln!(
            "[{} on {} | load {:.2}s | prompt {} tokens, prefill {:.1} tok/s | generated {} tokens, decode {:.1} tok/s | sampler {:?} | stop: {:?}]",
            ck.config.arch.name(),
            gpu.info.name,
            load_s,
            stats.prompt_tokens,
            stats.prefill_tok_s(),
            stats.generated_tokens,
            stats.decode_tok_s(),
            a.sampler,
            stats.stop
        );
    }
    Ok(())
}

fn run_bench(a: BenchArgs) -> Result<()> {
    let gpu = a.gpu.open()?;
    let (ck, mut model) = load(&a.model, &gpu, Some((a.prompt_tokens + a.gen_tokens + 1).max(16)), a.json)?;
    let mut sampler = sampler(a.sampler, &gpu)?;
    // Deterministic pseudo-random prompt ids (no text needed).
    let vocab = ck.config.vocab_size as u64;
    let prompt: Vec<u32> =
        (0..a.prompt_tokens as u64).map(|i| ((i.wrapping_mul(2654435761) ^ 0x5bd1e995) % vocab) as u32).collect();
    let params = SamplingParams::greedy();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for rep in 0..=a.reps {
        let s = generate(&mut model, sampler.as_mut(), &prompt, a.gen_tokens, &params, &[], &mut |_| Ok(true))?;
        if rep > 0 {
            prefill.push(s.prefill_tok_s());
            decode.push(s.decode_tok_s());
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    let (pp, tg) = (med(&mut prefill), med(&mut decode));
    let dispatches = model.plan(1)?.dispatches();
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "model": a.model.display().to_string(),
                "arch": ck.config.arch.name(),
                "adapter": gpu.info.name,
                "backend": format!("{:?}", gpu.info.backend),
                "weights_bytes": model.weights.bytes,
                "prompt_tokens": a.prompt_tokens,
                "gen_tokens": a.gen_tokens,
                "reps": a.reps,
                "sampler": format!("{:?}", a.sampler),
                "prefill_tok_s": pp,
                "decode_tok_s": tg,
                "prefill_tok_s_all": prefill,
                "decode_tok_s_all": decode,
                "decode_dispatches_per_token": dispatches,
            })
        );
    } else {
        println!(
            "{} on {}: pp{} {:.1} tok/s, tg{} {:.1} tok/s (median of {}; {} dispatches per decode step)",
            ck.config.arch.name(),
            gpu.info.name,
            a.prompt_tokens,
            pp,
            a.gen_tokens,
            tg,
            a.reps,
            dispatches
        );
    }
    Ok(())
}
