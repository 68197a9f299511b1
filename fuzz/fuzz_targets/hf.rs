//! A Hugging Face folder: the input is config.json, a NUL byte, then model.safetensors (the
//! safetensors header parser and the config reader; tokenizer files are absent, so a folder that
//! gets past its tensors ends in the missing-tokenizer error).
#![no_main]

mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (config, weights) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let dir = common::scratch("hf");
    std::fs::create_dir_all(&dir).expect("creating the fuzz folder");
    std::fs::write(dir.join("config.json"), config).expect("writing config.json");
    std::fs::write(dir.join("model.safetensors"), weights).expect("writing model.safetensors");
    common::check(&dir);
});
