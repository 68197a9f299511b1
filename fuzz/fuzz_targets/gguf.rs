//! A GGUF file: the input's bytes are the file.
#![no_main]

mod common;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let path = common::scratch("model.gguf");
    std::fs::write(&path, data).expect("writing the fuzz input");
    common::check(&path);
});
