//! The library without the CLI: load a checkpoint, run a prompt through the WGSL layers, sample on
//! the GPU, and print the text as it streams.
//!
//! ```sh
//! cargo run --release --example greedy -- "$(tools/fetch-model.sh smollm2)" "The capital of France is"
//! ```

use std::io::Write;
use wgpu_llm::decode::generate;
use wgpu_llm::gpu::{Gpu, GpuOptions};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::model::Model;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};
use wgpu_llm::tokenizer::Tokenizer;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(prompt)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: greedy MODEL PROMPT");
    };
    let gpu = Gpu::new(&GpuOptions::default())?;
    let ck = Checkpoint::open(path.as_ref())?;
    let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id)?;
    let mut model = Model::load(&gpu, &ck, None, &mut |_, _| {})?;
    let mut sampler = DeviceSampler::new(&gpu)?;
    let ids = tok.encode(&prompt, true)?;
    let mut stream = tok.stream_decoder();
    let mut out = std::io::stdout();
    print!("{prompt}");
    let stats =
        generate(&mut model, &mut sampler, &ids, 32, &SamplingParams::greedy(), &ck.config.eos_token_ids, &mut |t| {
            if let Some(piece) = stream.push(t)? {
                print!("{piece}");
                out.flush().ok();
            }
            Ok(true)
        })?;
    println!("{}", stream.finish()?.unwrap_or_default());
    eprintln!("{} tokens, decode {:.1} tok/s on {}", stats.generated_tokens, stats.decode_tok_s(), gpu.info.name);
    Ok(())
}
