//! Batched generation through the library: several prompts decoded together by one
//! [`BatchEngine`] (one pass of the model per step for all of them, each sampled on the GPU with
//! its own parameters and seed), each printed when it ends.
//!
//! ```sh
//! cargo run --release --example batch -- "$(tools/fetch-model.sh smollm2)" \
//!     "The capital of France is" "Water boils at" "The largest planet is"
//! ```

use std::collections::HashMap;
use wgpu_llm::decode::batch::{BatchEngine, BatchOptions, Event, Request};
use wgpu_llm::decode::DEFAULT_DEPTH;
use wgpu_llm::gpu::{Gpu, GpuOptions};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: batch MODEL PROMPT [PROMPT ...]"))?;
    let prompts: Vec<String> = args.collect();
    if prompts.is_empty() {
        anyhow::bail!("usage: batch MODEL PROMPT [PROMPT ...]");
    }
    let gpu = Gpu::new(&GpuOptions::default())?;
    let ck = Checkpoint::open(path.as_ref())?;
    let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id)?;
    let model = Model::load(&gpu, &ck, Some(512), &mut |_, _| {})?;
    let opts = BatchOptions::new(prompts.len().min(32), prompts.len());
    let mut engine = BatchEngine::new(model, Box::new(DeviceSampler::new(&gpu)?), opts, DEFAULT_DEPTH)?;
    // Each prompt its own request: the first greedy, the others sampled with their own seed.
    let mut texts: HashMap<u64, (usize, Vec<u32>)> = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        let params = if i == 0 {
            SamplingParams::greedy()
        } else {
            SamplingParams { temperature: 0.7, top_k: 40, top_p: 0.95, min_p: 0.05, seed: i as u64 }
        };
        let req = Request::new(tok.encode(p, true)?, params, 24, ck.config.eos_token_ids.clone());
        let id = engine.submit(req).map_err(|e| anyhow::anyhow!("{e}"))?;
        texts.insert(id, (i, Vec::new()));
    }
    let t0 = std::time::Instant::now();
    let mut total = 0;
    while !engine.is_idle() {
        let mut done = Vec::new();
        engine.step(&mut |id, e| match e {
            Event::Token(t, _) => {
                texts.get_mut(&id).expect("ours").1.push(t);
                total += 1;
            }
            Event::Finished { .. } => done.push(id),
            Event::Started { .. } => {}
            Event::Failed(e) => eprintln!("request {id} failed: {e}"),
        })?;
        for id in done {
            let (i, ids) = &texts[&id];
            println!("[{i}] {}{}", prompts[*i], tok.decode(ids)?);
        }
    }
    eprintln!(
        "{} requests, {total} tokens in {:.2} s on {} ({})",
        prompts.len(),
        t0.elapsed().as_secs_f64(),
        gpu.info.name,
        if engine.is_batched() { "decoded together" } else { "one at a time" }
    );
    Ok(())
}
