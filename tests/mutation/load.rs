//! What `wgpu-llm generate --chat` does with a model before it touches the GPU, as one function:
//! the mutation corpus (tests/corpus.rs) judges every case by it, and the fuzz targets
//! (fuzz/fuzz_targets/) run it on their inputs, so both exercise the same loading path.

use std::path::Path;
use wgpu_llm::chat::{apply_chat_template, Message};
use wgpu_llm::loader::Checkpoint;
use wgpu_llm::tokenizer::Tokenizer;

/// What `wgpu-llm generate --chat` does with a model before it touches the GPU, then the tensor
/// reads of the weight upload (norms as floats, checked finite; matrices as stored).
pub fn load(path: &Path) -> Result<(), String> {
    let e = |e: wgpu_llm::Error| e.to_string();
    let ck = Checkpoint::open(path).map_err(e)?;
    let tok = Tokenizer::from_source(&ck.tokenizer, ck.config.add_bos, ck.config.bos_token_id).map_err(e)?;
    if let Some(t) = &ck.chat_template {
        let msgs = [Message::system("Be brief."), Message::user("What is 2+3?")];
        let text = apply_chat_template(t, &msgs, true, ck.bos_token.as_deref(), ck.eos_token.as_deref()).map_err(e)?;
        tok.encode(&text, true).map_err(e)?;
    }
    let mut names: Vec<&str> = ck.tensor_names().collect();
    names.sort_unstable();
    for name in names {
        let v = ck.raw(name).map_err(e)?;
        if v.shape.len() == 1 {
            let shape = v.shape.clone();
            drop(v);
            ck.f32(name, &shape).map_err(e)?;
        }
    }
    Ok(())
}
