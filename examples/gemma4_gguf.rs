//! A benchmark helper: writes Gemma-4-31B's shape with synthetic weights as a GGUF file in
//! llama.cpp's `gemma4` layout (its metadata keys, tensor names and shapes, `rope_freqs` for the
//! full layers' proportional RoPE, no `attn_v` where keys are the values; a placeholder
//! vocabulary of as many tokens as embedding rows, which llama.cpp requires), for llama.cpp to run
//! beside `wgpu-llm bench --synthetic gemma-4-31b:RECIPE` with the same shapes and tensor types.
//! With `--from DIR` it writes a Gemma 4 checkpoint folder (transformers' or mlx-lm's float
//! layout) instead, every tensor as F32.
//!
//! The weights are those of [`wgpu_llm::loader::synthetic`] (random, scaled like trained ones);
//! the engine's canonical tensor names are llama.cpp's.
//!
//! ```sh
//! cargo run --release --example gemma4_gguf -- q4_k_m OUT.gguf [LAYERS]
//! cargo run --release --example gemma4_gguf -- --from tests/fixtures/models/gemma4_tiny OUT.gguf
//! ```

use wgpu_llm::loader::gguf::{GgufTokenizerData, GgufWriter};
use wgpu_llm::loader::{synthetic, Checkpoint};
use wgpu_llm::model::gemma4::Gemma4Config;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (ck, name, out) = match &args[..] {
        [flag, dir, out] if flag == "--from" => {
            (Checkpoint::open(std::path::Path::new(dir))?, format!("Gemma 4 from {dir}"), out.as_str())
        }
        [recipe, out] | [recipe, out, _] => {
            let mut g = Gemma4Config::gemma_4_31b();
            if let Some(n) = args.get(2) {
                g.full_attention.truncate(n.parse()?);
            }
            let spec = format!("synthetic:gemma-4-31b:{recipe}");
            (
                synthetic::build(&g.model_config(), recipe, &spec, 0x5EED)?,
                format!("synthetic Gemma-4-31B shape, {recipe}"),
                out.as_str(),
            )
        }
        _ => anyhow::bail!("usage: gemma4_gguf RECIPE OUT.gguf [LAYERS] | gemma4_gguf --from DIR OUT.gguf"),
    };
    let c = &ck.config;
    let float = args[0] == "--from";
    let mut w = GgufWriter::new();
    let freqs = w.add_gemma4_config(c)?;
    w.add_metadata("general.name", name);
    w.add_tokenizer(&GgufTokenizerData::placeholder(c.vocab_size));
    if let Some(f) = freqs {
        w.add_f32("rope_freqs.weight", &[f.len()], &f)?;
    }
    let mut names: Vec<&str> = ck.tensor_names().collect();
    names.sort_unstable();
    for n in names {
        if float {
            let shape = ck.raw_shape(n)?;
            w.add_f32(n, &shape, &ck.f32(n, &shape)?)?;
        } else {
            let t = ck.raw(n)?;
            w.add_tensor(n, t.dtype, &t.shape, t.bytes)?;
        }
    }
    w.write(std::path::Path::new(out))?;
    eprintln!("wrote {out}: {} layers, vocabulary {}", c.num_layers(), c.vocab_size);
    Ok(())
}
