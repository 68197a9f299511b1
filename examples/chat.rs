//! A conversation through the library: the model's chat template, a system message, earlier turns
//! kept in the KV cache (each turn prefills only its new tokens), each answer streamed as it comes.
//!
//! ```sh
//! cargo run --release --example chat -- "$(tools/fetch-model.sh smollm2)" \
//!     "What is the capital of France?" "And of Italy?"
//! ```

use std::io::Write;
use wgpu_llm::engine::Sampling;
use wgpu_llm::Engine;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: chat MODEL QUESTION [QUESTION ...]"))?;
    let questions: Vec<String> = args.collect();
    let mut engine = Engine::builder(&path).ctx(2048).load()?;
    let mut chat = engine
        .session()
        .system("You are a helpful assistant. Answer in one sentence.")
        .max_tokens(64)
        .sampling(Sampling { temperature: 0.7, seed: Some(42), ..Sampling::default() });
    for q in questions {
        println!("> {q}");
        let answer = chat.send(q, |piece| {
            print!("{piece}");
            Ok(std::io::stdout().flush().is_ok())
        })?;
        println!();
        eprintln!(
            "[prefill {} tokens ({} reused from the KV cache) | {} tokens, {:.1} tok/s, stop: {:?}]",
            answer.stats.prompt_tokens,
            answer.stats.cached_tokens,
            answer.stats.generated_tokens,
            answer.stats.decode_tok_s(),
            answer.stats.stop
        );
    }
    Ok(())
}
