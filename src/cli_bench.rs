//! `wgpu-llm bench`: prefill and decode throughput of one sequence (the default), of N concurrent
//! requests through the batching engine (`--streams`), or a multi-turn chat's time to first
//! token (`--history-tokens`); `--profile` adds where a decode step's GPU time goes, by kernel.

use crate::{load, sampler, BatchFormArg, GpuArgs, SamplingArgs};
use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use wgpu_llm::decode::batch::{BatchEngine, BatchOptions, Event, Request};
use wgpu_llm::decode::{continue_with, generate_with, DecodeOptions, Job, Stats, StepTiming};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{SamplingBackend, SamplingParams};

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["model", "synthetic"])))]
pub struct BenchArgs {
    /// A GGUF file or a Hugging Face folder.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Random weights with a real checkpoint's architecture, shapes and tensor types:
    /// NAME:RECIPE, NAME one of smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, gemma3-270m and RECIPE
    /// one of f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k_m.
    #[arg(long)]
    synthetic: Option<String>,
    /// Prompt tokens for the prefill measurement.
    #[arg(long, default_value_t = 512)]
    prompt_tokens: usize,
    /// Measure a multi-turn chat's time to first token instead: a conversation of this many
    /// tokens is already held, then a new message of --prompt-tokens arrives; cold (the whole
    /// conversation prefilled) against the history kept in the KV cache (only the message).
    /// With --streams 1: through the batching engine (`serve`'s), its prefix cache holding the
    /// history.
    #[arg(long, value_name = "N")]
    history_tokens: Option<usize>,
    /// Tokens for the decode measurement.
    #[arg(long, default_value_t = 128)]
    gen_tokens: usize,
    /// Context length (KV cache positions) to load the model with; default just what the
    /// measurement needs (prompt + generated tokens + 1). `generate`'s default is min(model
    /// maximum, 4096): attention's work split follows the context length.
    #[arg(long)]
    ctx: Option<usize>,
    /// Timed repetitions (after one warm-up).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Sampling as in `generate` (the same defaults: llama.cpp's default chain; `--temperature 0`
    /// for greedy).
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Also time every dispatch of a decode step (median of N steps, each dispatch in a pass of its
    /// own between timestamps) and report where the step's GPU time goes, by kernel.
    #[arg(long, value_name = "N")]
    profile: Option<usize>,
    /// Measure N concurrent requests through the batching engine instead (continuous batching:
    /// N sequences decoded together, each with its own prompt and seed): total decode
    /// throughput, time to first token and inter-token latency per request.
    /// With --streams: how a batch step computes each sequence's row: `one-token` (generate's
    /// numbers, its speed for one stream) or `batched` (the batch kernels: faster for many);
    /// default: one-token for one stream, batched for more.
    #[arg(long, value_name = "FORM", requires = "streams")]
    batch_form: Option<BatchFormArg>,
    #[arg(long, value_name = "N")]
    streams: Option<usize>,
    #[command(flatten)]
    gpu: GpuArgs,
}

/// `bench --history-tokens H --streams 1`: a conversation's next turn through the batching
/// engine, cold (the prefix cache emptied) and with the history in its prefix cache.
fn bench_history_engine(
    a: &BenchArgs,
    mut engine: BatchEngine,
    history: &[u32],
    message: &[u32],
    params: &SamplingParams,
    source: &str,
) -> Result<()> {
    // One request's first token: (time from submission, token, prompt positions reused).
    let first = |engine: &mut BatchEngine, prompt: Vec<u32>| -> Result<(f64, u32, usize)> {
        let t0 = std::time::Instant::now();
        engine.submit(Request::new(prompt, *params, 1, vec![])).map_err(|e| anyhow::anyhow!("{e}"))?;
        let (mut token, mut cached, mut failed) = (None, 0, None);
        while !engine.is_idle() {
            engine.step(&mut |_, e| match e {
                Event::Started { cached_tokens } => cached = cached_tokens,
                Event::Token(t, _) => token = token.or(Some((1e3 * t0.elapsed().as_secs_f64(), t))),
                Event::Failed(e) => failed = Some(e),
                Event::Finished { .. } => {}
            })?;
        }
        if let Some(e) = failed {
            return Err(e.into());
        }
        let (ms, t) = token.context("no token came")?;
        Ok((ms, t, cached))
    };
    let whole: Vec<u32> = history.iter().chain(message).copied().collect();
    let (mut cold, mut cached, mut same) = (Vec::new(), Vec::new(), true);
    let mut reused = 0;
    for rep in 0..=a.reps {
        engine.clear_prefix_cache();
        let (tc, token_cold, _) = first(&mut engine, whole.clone())?;
        engine.clear_prefix_cache();
        first(&mut engine, history.to_vec())?;
        let (tk, token_cached, n) = first(&mut engine, whole.clone())?;
        same &= token_cold == token_cached;
        reused = n;
        if rep > 0 {
            cold.push(tc);
            cached.push(tk);
        }
    }
    let (tc, tk) = (median(cold.clone()), median(cached.clone()));
    let name = engine.model().gpu.info.name.clone();
    if a.json {
        let report = serde_json::json!({
            "model": source, "adapter": name, "engine": "batch", "history_tokens": history.len(),
            "message_tokens": message.len(), "cached_tokens": reused, "ttft_cold_ms": tc, "ttft_cached_ms": tk,
            "cached_over_cold": tk / tc.max(1e-9), "ttft_cold_ms_all": cold, "ttft_cached_ms_all": cached,
            "first_token_same": same,
        });
        println!("{}", with_run(a, params, report));
    } else {
        println!(
            "{} history tokens + a {}-token message through the batching engine on {name}: time to first token cold \
             {tc:.1} ms, with {reused} positions from the prefix cache {tk:.1} ms ({:.1} %; median of {}; first \
             tokens {})",
            history.len(),
            message.len(),
            100.0 * tk / tc.max(1e-9),
            a.reps,
            if same { "the same" } else { "DIFFERENT (rounding: see decode::prefix)" }
        );
    }
    Ok(())
}

/// Median of `v` (empty: 0).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Per-step medians in microseconds over every timed decode step.
fn step_medians(runs: &[Stats]) -> serde_json::Value {
    let us = |f: &dyn Fn(&StepTiming) -> Option<std::time::Duration>| {
        let v: Vec<f64> =
            runs.iter().flat_map(|r| r.steps.iter()).filter_map(f).map(|d| d.as_secs_f64() * 1e6).collect();
        (!v.is_empty()).then(|| median(v))
    };
    serde_json::json!({
        "host_encode_us": us(&|s| Some(s.encode)),
        "submit_us": us(&|s| Some(s.submit)),
        "wait_us": us(&|s| Some(s.wait)),
        "gpu_us": us(&|s| s.gpu),
    })
}

pub fn run(a: BenchArgs) -> Result<()> {
    if a.reps == 0 || a.reps > 1000 {
        anyhow::bail!("--reps {} is out of range: 1..=1000", a.reps);
    }
    if a.prompt_tokens == 0 || a.gen_tokens == 0 {
        anyhow::bail!("--prompt-tokens and --gen-tokens must be at least 1");
    }
    if a.profile.is_some_and(|n| n == 0 || n > 1000) {
        anyhow::bail!("--profile {} is out of range: 1..=1000", a.profile.unwrap_or_default());
    }
    const MAX_TOKENS: usize = 1 << 20;
    if a.prompt_tokens > MAX_TOKENS || a.gen_tokens > MAX_TOKENS {
        anyhow::bail!("--prompt-tokens and --gen-tokens must be at most {MAX_TOKENS}");
    }
    let params = a.sampling.params()?;
    let opts = a.sampling.decode()?;
    // Several sequences at once: the batch engine's steps in flight (checked before the model loads).
    let batch_depth = a.streams.map(|_| a.sampling.batch_depth()).transpose()?;
    let need = (a.history_tokens.unwrap_or(0) + a.prompt_tokens + a.gen_tokens + 1).max(16);
    if a.ctx.is_some_and(|c| c < need) {
        anyhow::bail!(
            "--ctx {} is below the {need} positions the measurement needs (--prompt-tokens + --gen-tokens + 1)",
            a.ctx.unwrap_or_default()
        );
    }
    if a.history_tokens.is_some() && a.streams.is_some_and(|n| n != 1) {
        anyhow::bail!("--history-tokens takes --streams 1 (one conversation through the batching engine) or none");
    }
    if a.streams.is_some_and(|n| n == 0 || n > 32) {
        anyhow::bail!("--streams {} is out of range: 1..=32", a.streams.unwrap_or_default());
    }
    let ctx = Some(a.ctx.unwrap_or(need));
    let ck = match (&a.model, &a.synthetic) {
        (Some(path), _) => Checkpoint::open(path)?,
        (None, Some(spec)) => wgpu_llm::loader::synthetic::open(spec)?,
        (None, None) => unreachable!("clap requires --model or --synthetic"),
    };
    let gpu = a.gpu.open()?;
    let mut model = load(&ck, &gpu, ctx, a.gpu.weight_format(), a.json || a.model.is_none())?;
    let source = match (&a.model, &a.synthetic) {
        (Some(path), _) => path.display().to_string(),
        (None, spec) => format!("synthetic:{}", spec.as_deref().unwrap_or_default()),
    };
    let mut sampler = sampler(a.sampling.sampler, &gpu)?;
    // Deterministic pseudo-random prompt ids (no text needed).
    let vocab = ck.config.vocab_size as u64;
    let prompt_of = |stream: u64| -> Vec<u32> {
        (0..a.prompt_tokens as u64)
            .map(|i| ((i.wrapping_mul(2654435761) ^ 0x5bd1e995 ^ stream.wrapping_mul(0x9e3779b9)) % vocab) as u32)
            .collect()
    };
    let prompt = prompt_of(0);
    if let Some(h) = a.history_tokens {
        let history: Vec<u32> = prompt_of(1).into_iter().cycle().take(h).collect();
        if let Some(depth) = batch_depth {
            let bytes = wgpu_llm::decode::prefix::default_bytes(&model, 1);
            let opts = BatchOptions { prefix_cache_bytes: bytes, ..BatchOptions::new(1, 1) };
            let engine = BatchEngine::new(model, sampler, opts, depth)?;
            return bench_history_engine(&a, engine, &history, &prompt, &params, &source);
        }
        return bench_history(&a, &mut model, sampler.as_mut(), &history, &prompt, &params, opts, &source);
    }
    if let (Some(n), Some(depth)) = (a.streams, batch_depth) {
        let form = a.batch_form.map(BatchFormArg::form);
        let engine = BatchEngine::new(model, sampler, BatchOptions { form, ..BatchOptions::new(n, n) }, depth)?;
        return bench_streams(&a, engine, n, &params, &prompt_of, &source, ck.config.arch.name());
    }
    let mut runs = Vec::new();
    for rep in 0..=a.reps {
        // No eos: every run decodes gen_tokens steps.
        let s =
            generate_with(&mut model, sampler.as_mut(), &prompt, a.gen_tokens, &params, &[], &mut |_| Ok(true), opts)?;
        if rep > 0 {
            runs.push(s);
        }
    }
    let pp = median(runs.iter().map(Stats::prefill_tok_s).collect());
    let tg = median(runs.iter().map(Stats::decode_tok_s).collect());
    let last = runs.last().expect("reps >= 1");
    let steps = step_medians(&runs);
    let profile = match a.profile {
        Some(n) => Some(profile_table(&model.profile_step(n)?)),
        None => None,
    };
    if a.json {
        println!(
            "{}",
            with_run(
                &a,
                &params,
                serde_json::json!({
                    "model": source,
                    "arch": ck.config.arch.name(),
                    "adapter": gpu.info.name,
                    "backend": format!("{:?}", gpu.info.backend),
                    "weights_bytes": model.weights.bytes,
                    "weights_formats": model.weights.summary(),
                    "pipeline_depth": last.depth,
                    "steps_per_submit": last.steps_per_submit,
                    "prefill_tok_s": pp,
                    "decode_tok_s": tg,
                    "prefill_tok_s_all": runs.iter().map(Stats::prefill_tok_s).collect::<Vec<_>>(),
                    "decode_tok_s_all": runs.iter().map(Stats::decode_tok_s).collect::<Vec<_>>(),
                    "decode_step": {
                        "dispatches": last.dispatches_per_step,
                        "submits": last.submits_per_step,
                        "blocking_waits": last.waits_per_step,
                        "median": steps,
                    },
                    "logits_finite": true,
                    "profile": profile,
                }),
            )
        );
    } else {
        let f = |k: &str| steps[k].as_f64().map_or("n/a".to_string(), |v| format!("{v:.0}"));
        println!(
            "{} on {}: pp{} {:.1} tok/s, tg{} {:.1} tok/s (median of {}; sampler {:?}, T {} top-k {} top-p {} min-p {}, \
             {})\nper decode step (median): {} dispatches, {} submit(s), {} blocking wait(s); host encode {} us, submit {} us, \
             wait {} us, GPU {} us",
            ck.config.arch.name(),
            gpu.info.name,
            a.prompt_tokens,
            pp,
            a.gen_tokens,
            tg,
            a.reps,
            a.sampling.sampler,
            params.temperature,
            params.top_k,
            params.top_p,
            params.min_p,
            match (last.depth, last.steps_per_submit) {
                (0, _) => "readback loop".to_string(),
                (d, 1) => format!("GPU-resident loop, {d} in flight"),
                (d, k) => format!("GPU-resident loop, {d} submissions of {k} steps in flight"),
            },
            last.dispatches_per_step,
            last.submits_per_step,
            last.waits_per_step,
            f("host_encode_us"),
            f("submit_us"),
            f("wait_us"),
            f("gpu_us"),
        );
        if let Some(rows) = &profile {
            print_profile(rows);
        }
    }
    Ok(())
}

/// [`profile_table`]'s rows as text: where a decode step's GPU time goes.
fn print_profile(rows: &[serde_json::Value]) {
    let total: f64 = rows.iter().filter_map(|r| r["us_total"].as_f64()).sum();
    println!("per-dispatch GPU time of a decode step (sum {total:.0} us):");
    for r in rows {
        let us = r["us_total"].as_f64().unwrap_or(0.0);
        println!(
            "{:>8.1} us {:>5.1} %  {:>3} x {:>7.2} us  {} [{}] {}",
            us,
            100.0 * us / total.max(1e-9),
            r["count"],
            r["us_each"].as_f64().unwrap_or(0.0),
            r["name"].as_str().unwrap_or(""),
            r["variant"].as_str().unwrap_or(""),
            r["workgroups"],
        );
    }
}

/// A benchmark's JSON `report` with the run's shape and sampling parameters added (both
/// benchmarks report them alike).
fn with_run(a: &BenchArgs, params: &SamplingParams, mut report: serde_json::Value) -> serde_json::Value {
    let run = serde_json::json!({
        "prompt_tokens": a.prompt_tokens,
        "gen_tokens": a.gen_tokens,
        "reps": a.reps,
        "sampler": format!("{:?}", a.sampling.sampler),
        "temperature": params.temperature,
        "top_k": params.top_k,
        "top_p": params.top_p,
        "min_p": params.min_p,
        "seed": params.seed,
    });
    if let (Some(report), serde_json::Value::Object(run)) = (report.as_object_mut(), run) {
        report.extend(run);
    }
    report
}

fn bench_streams(
    a: &BenchArgs,
    mut engine: BatchEngine,
    n: usize,
    params: &SamplingParams,
    prompt_of: &dyn Fn(u64) -> Vec<u32>,
    source: &str,
    arch: &str,
) -> Result<()> {
    use std::time::Instant;
    struct Rep {
        total_tok_s: f64,
        decode_tok_s: f64,
        ttft_ms: Vec<f64>,
        itl_ms: Vec<f64>,
        wall_s: f64,
    }
    let mut reps = Vec::new();
    for rep in 0..=a.reps {
        let t0 = Instant::now();
        let mut ids = Vec::new();
        for i in 0..n as u64 {
            let req = Request {
                prompt: prompt_of(i),
                params: SamplingParams { seed: params.seed.wrapping_add(i), ..*params },
                max_tokens: a.gen_tokens,
                stop_ids: vec![],
                constraint: None,
                logprobs: None,
                controls: Default::default(),
            };
            ids.push(engine.submit(req).map_err(|e| anyhow::anyhow!("{e}"))?);
        }
        // Per request: the time of each token.
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut failed = None;
        while !engine.is_idle() {
            engine.step(&mut |id, e| match e {
                Event::Token(..) => {
                    times[ids.iter().position(|&x| x == id).expect("ours")].push(t0.elapsed().as_secs_f64())
                }
                Event::Failed(e) => failed = Some(e),
                Event::Started { .. } | Event::Finished { .. } => {}
            })?;
            if let Some(e) = failed.take() {
                return Err(e.into());
            }
        }
        let wall = t0.elapsed().as_secs_f64();
        let all_first = times.iter().map(|t| t[0]).fold(0f64, f64::max);
        let decode_tokens: usize = times.iter().map(|t| t.iter().filter(|&&x| x > all_first).count()).sum();
        let r = Rep {
            total_tok_s: times.iter().map(Vec::len).sum::<usize>() as f64 / wall,
            decode_tok_s: decode_tokens as f64 / (wall - all_first).max(1e-9),
            ttft_ms: times.iter().map(|t| 1e3 * t[0]).collect(),
            itl_ms: times.iter().map(|t| 1e3 * (t[t.len() - 1] - t[0]) / (t.len() - 1).max(1) as f64).collect(),
            wall_s: wall,
        };
        if rep > 0 {
            reps.push(r);
        }
    }
    let med = |f: &dyn Fn(&Rep) -> f64| median(reps.iter().map(f).collect());
    let decode = med(&|r| r.decode_tok_s);
    let total = med(&|r| r.total_tok_s);
    let ttft = med(&|r| median(r.ttft_ms.clone()));
    let ttft_max = med(&|r| r.ttft_ms.iter().copied().fold(0.0, f64::max));
    let itl = med(&|r| median(r.itl_ms.clone()));
    // The batch step's dispatches at the runs' last position (a batch of n rows).
    let profile = match a.profile {
        Some(reps) if engine.is_batched() => {
            let pos = a.prompt_tokens + a.gen_tokens - 1;
            Some(profile_table(&engine.model_mut().profile_batch(n, pos, reps)?))
        }
        Some(_) => anyhow::bail!("--profile with --streams needs a model that decodes sequences together"),
        None => None,
    };
    let gpu = &engine.model().gpu;
    if a.json {
        println!(
            "{}",
            with_run(
                a,
                params,
                serde_json::json!({
                    "model": source,
                    "arch": arch,
                    "adapter": gpu.info.name,
                    "backend": format!("{:?}", gpu.info.backend),
                    "streams": n,
                    "batched": engine.is_batched(),
                    "batch_form": format!("{:?}", engine.model().batch_form()),
                    "pipeline_depth": a.sampling.batch_depth()?,
                    "decode_tok_s_total": decode,
                    "tok_s_total_with_prefill": total,
                    "decode_tok_s_per_stream": decode / n as f64,
                    "ttft_ms_median": ttft,
                    "ttft_ms_max": ttft_max,
                    "inter_token_ms_median": itl,
                    "decode_tok_s_all": reps.iter().map(|r| r.decode_tok_s).collect::<Vec<_>>(),
                    "wall_s_all": reps.iter().map(|r| r.wall_s).collect::<Vec<_>>(),
                    "logits_finite": true,
                    "profile": profile,
                }),
            )
        );
    } else {
        println!(
            "{arch} on {}: {n} streams ({:?} form, pp{} + tg{} each, sampler {:?}): decode {decode:.1} tok/s in total ({:.1} per stream), {total:.1} tok/s with prefill; time to first token {ttft:.1} ms median ({ttft_max:.1} max), inter-token {itl:.2} ms (median of {})",
            gpu.info.name,
            engine.model().batch_form(),
            a.prompt_tokens,
            a.gen_tokens,
            a.sampling.sampler,
            decode / n as f64,
            a.reps,
        );
        if let Some(rows) = &profile {
            print_profile(rows);
        }
    }
    Ok(())
}

/// `bench --history-tokens H`: a new message of `message` after a conversation `history` already
/// held, time to first token cold (history and message prefilled from an empty context, one
/// token sampled) against the history kept in the KV cache (the history prefilled and waited for
/// outside the timing, then only the message: `decode::continue_with`). Both first tokens are
/// the same token (checked).
#[allow(clippy::too_many_arguments)]
fn bench_history(
    a: &BenchArgs,
    model: &mut Model,
    sampler: &mut dyn SamplingBackend,
    history: &[u32],
    message: &[u32],
    params: &SamplingParams,
    opts: DecodeOptions,
    source: &str,
) -> Result<()> {
    let whole: Vec<u32> = history.iter().chain(message).copied().collect();
    let (mut cold, mut cached) = (Vec::new(), Vec::new());
    for rep in 0..=a.reps {
        let mut first = [0u32; 2];
        let s = generate_with(
            model,
            sampler,
            &whole,
            1,
            params,
            &[],
            &mut |t| {
                first[0] = t;
                Ok(true)
            },
            opts,
        )?;
        model.reset();
        model.forward(history)?;
        model.gpu.device.poll(wgpu::PollType::Wait { submission_index: None, timeout: None })?;
        let job = Job { prompt: message, max_tokens: 1, params, eos: &[] };
        let c = continue_with(
            model,
            sampler,
            job,
            &mut |t| {
                first[1] = t;
                Ok(true)
            },
            opts,
        )?;
        anyhow::ensure!(
            first[0] == first[1],
            "the cached turn's first token {} is not the cold run's {}",
            first[1],
            first[0]
        );
        if rep > 0 {
            cold.push(1e3 * s.prefill.as_secs_f64());
            cached.push(1e3 * c.prefill.as_secs_f64());
        }
    }
    let (tc, tk) = (median(cold.clone()), median(cached.clone()));
    let gpu = &model.gpu;
    if a.json {
        let report = serde_json::json!({
            "model": source,
            "adapter": gpu.info.name,
            "history_tokens": history.len(),
            "message_tokens": message.len(),
            "ttft_cold_ms": tc,
            "ttft_cached_ms": tk,
            "cached_over_cold": tk / tc.max(1e-9),
            "ttft_cold_ms_all": cold,
            "ttft_cached_ms_all": cached,
            "logits_finite": true,
        });
        println!("{}", with_run(a, params, report));
    } else {
        println!(
            "{} history tokens + a {}-token message on {}: time to first token cold {tc:.1} ms, with the history in the KV cache {tk:.1} ms ({:.1} %; median of {})",
            history.len(),
            message.len(),
            gpu.info.name,
            100.0 * tk / tc.max(1e-9),
            a.reps
        );
    }
    Ok(())
}

/// Dispatches grouped by kernel, variant and grid, largest total first.
fn profile_table(times: &[wgpu_llm::model::forward::DispatchTime]) -> Vec<serde_json::Value> {
    let mut groups: Vec<(&wgpu_llm::model::forward::DispatchTime, usize, f64)> = Vec::new();
    for t in times {
        match groups
            .iter_mut()
            .find(|(g, _, _)| g.name == t.name && g.variant == t.variant && g.workgroups == t.workgroups)
        {
            Some(g) => {
                g.1 += 1;
                g.2 += t.us;
            }
            None => groups.push((t, 1, t.us)),
        }
    }
    groups.sort_by(|a, b| b.2.total_cmp(&a.2));
    groups
        .into_iter()
        .map(|(t, count, total)| {
            serde_json::json!({
                "name": t.name,
                "variant": t.variant,
                "workgroups": t.workgroups,
                "count": count,
                "us_each": total / count as f64,
                "us_total": total,
            })
        })
        .collect()
}
