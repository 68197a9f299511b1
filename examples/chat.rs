//! A conversation through the library: the model's chat template, a system message, earlier turns
//! kept as history, each answer streamed as it comes.
//!
//! ```sh
//! cargo run --release --example chat -- "$(tools/fetch-model.sh smollm2)" \
//!     "What is the capital of France?" "And of Italy?"
//! ```

use std::io::Write;
use wgpu_llm::chat::Message;
use wgpu_llm::Engine;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or_else(|| anyhow::anyhow!("usage: chat MODEL QUESTION [QUESTION ...]"))?;
    let questions: Vec<String> = args.collect();
    let mut engine = Engine::builder(&path).ctx(2048).load()?;
    let mut history = Vec::new();
    for q in questions {
        println!("> {q}");
        let answer = engine
            .generate(&q)
            .system("You are a helpful assistant. Answer in one sentence.")
            .messages(&history)
            .max_tokens(64)
            .temperature(0.7)
            .seed(42)
            .stream(|piece| {
                print!("{piece}");
                std::io::stdout().flush().is_ok()
            })?;
        println!();
        eprintln!(
            "[{} tokens, {:.1} tok/s, stop: {:?}]",
            answer.stats.generated_tokens,
            answer.stats.decode_tok_s(),
            answer.stats.stop
        );
        history.push(Message::user(q));
        history.push(Message::assistant(answer.text));
    }
    Ok(())
}
