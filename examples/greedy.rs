//! The library without the CLI: load a model with its tokenizer in one call, continue a prompt
//! greedily on the GPU, and print the text as it streams.
//!
//! ```sh
//! cargo run --release --example greedy -- "$(tools/fetch-model.sh smollm2)" "The capital of France is"
//! ```

use std::io::Write;
use wgpu_llm::Engine;

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(prompt)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: greedy MODEL PROMPT");
    };
    let mut engine = Engine::load(&path)?;
    print!("{prompt}");
    let out = engine.generate(&prompt).temperature(0.0).max_tokens(32).stream(|piece| {
        print!("{piece}");
        std::io::stdout().flush().is_ok()
    })?;
    println!();
    eprintln!(
        "{} tokens, decode {:.1} tok/s on {}",
        out.stats.generated_tokens,
        out.stats.decode_tok_s(),
        engine.gpu().info.name
    );
    Ok(())
}
