//! Tokenizer and chat-template tests.
//!
//! - Real models (GGUF fetched by `tools/fetch-model.sh` on first use into `$WGPU_LLM_MODELS`, else
//!   `~/.cache/wgpu-llm/models`; a test fails when its file cannot be fetched): ids, decoded text, BOS handling and chat rendering
//!   against `tests/fixtures/tokenizer/{model}.json`, written by `tools/make_tokenizer_fixtures.py`
//!   from Hugging Face transformers/tokenizers (and sentencepiece for Gemma).
//! - Tiny hand-made vocabularies (no files): the byte-level and sentencepiece builders, and the
//!   stream decoder.

mod common;

use std::path::PathBuf;
use wgpu_llm::chat::{apply_chat_template, apply_model_chat_template, Message};
use wgpu_llm::loader::{Checkpoint, TokenizerSource};
use wgpu_llm::tokenizer::{token_type, GgufVocab, StreamDecoder, Tokenizer};
use wgpu_llm::Error;

// ---------------------------------------------------------------------------------------------
// Real models against fixtures

fn fixture(name: &str) -> serde_json::Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer").join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// What a test needs from a checkpoint.
struct Loaded {
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

fn load(path: &std::path::Path) -> Loaded {
    let ckpt = Checkpoint::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let t0 = std::time::Instant::now();
    let tokenizer = Tokenizer::from_source(&ckpt.tokenizer, ckpt.config.add_bos, ckpt.config.bos_token_id)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    eprintln!("{}: tokenizer built in {:.2?}", path.display(), t0.elapsed());
    assert!(
        tokenizer.vocab_size() <= ckpt.config.vocab_size,
        "tokenizer has {} ids, the model {}",
        tokenizer.vocab_size(),
        ckpt.config.vocab_size
    );
    Loaded {
        tokenizer,
        chat_template: ckpt.chat_template.clone(),
        bos_token: ckpt.bos_token.clone(),
        eos_token: ckpt.eos_token.clone(),
    }
}

fn check_model(name: &str) {
    let fx = fixture(name);
    let path = common::model(name);
    assert!(path.ends_with(fx["gguf"].as_str().unwrap()), "{} is not the fixture's {}", path.display(), fx["gguf"]);
    let m = load(&path);
    let tok = &m.tokenizer;
    let mut failures = Vec::new();
    for case in fx["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        let got = tok.encode(text, false).unwrap();
        if got != want {
            failures.push(format!("encode {text:?}:\n   got  {got:?}\n   want {want:?}"));
        }
        let decoded = tok.decode(&want).unwrap();
        let want_text = case["decoded"].as_str().unwrap();
        if decoded != want_text {
            failures.push(format!("decode {want:?}: got {decoded:?}, want {want_text:?}"));
        }
        // Streaming the ids gives the same text as decoding them at once (specials left out).
        let mut stream = StreamDecoder::new(tok);
        let mut streamed = String::new();
        for &id in &want {
            if let Some(d) = stream.push(id).unwrap() {
                streamed.push_str(&d);
            }
        }
        if let Some(d) = stream.finish().unwrap() {
            streamed.push_str(&d);
        }
        let whole = tok.decode_skip_special(&want).unwrap();
        if streamed != whole {
            failures.push(format!("stream {want:?}: got {streamed:?}, want {whole:?}"));
        }
    }

    // BOS: added for a raw prompt only when the model asks for it, never twice.
    let bos = fx["bos_token_id"].as_u64().map(|b| b as u32);
    assert_eq!(tok.bos_id(), bos, "{name}: bos id");
    assert_eq!(tok.add_bos(), fx["add_bos_token"].as_bool().unwrap(), "{name}: add_bos");
    let plain = tok.encode("Hello", false).unwrap();
    let with = tok.encode("Hello", true).unwrap();
    if tok.add_bos() {
        assert_eq!(with[0], bos.unwrap());
        assert_eq!(&with[1..], &plain[..]);
        let bos_text = tok.token_to_str(bos.unwrap()).unwrap();
        let again = tok.encode(&format!("{bos_text}Hello"), true).unwrap();
        assert_eq!(again, with, "{name}: BOS must not be doubled");
    } else {
        assert_eq!(with, plain);
    }

    // Chat template.
    assert_eq!(m.bos_token.as_deref(), fx["bos_token"].as_str(), "{name}: bos_token");
    assert_eq!(m.eos_token.as_deref(), fx["eos_token"].as_str(), "{name}: eos_token");
    assert_eq!(m.chat_template.is_some(), fx["has_chat_template"].as_bool().unwrap(), "{name}: chat template presence");
    for chat in fx["chats"].as_array().unwrap() {
        let messages: Vec<Message> = serde_json::from_value(chat["messages"].clone()).unwrap();
        let got = apply_model_chat_template(
            m.chat_template.as_deref(),
            &messages,
            chat["add_generation_prompt"].as_bool().unwrap(),
            m.bos_token.as_deref(),
            m.eos_token.as_deref(),
        )
        .unwrap();
        let want = chat["rendered"].as_str().unwrap();
        if got != want {
            failures.push(format!("chat: got {got:?}\n   want {want:?}"));
        }
        // The rendered chat encodes its special tokens whole.
        let ids = tok.encode(&got, false).unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), got);
    }
    if m.chat_template.is_none() {
        match apply_model_chat_template(None, &[Message::user("hi")], true, None, None) {
            Err(Error::Template(msg)) => assert!(msg.contains("no chat template")),
            other => panic!("{other:?}"),
        }
    }
    assert!(failures.is_empty(), "{name}: {} failures:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn smollm2_matches_reference() {
    check_model("smollm2");
}

#[test]
fn qwen05_matches_reference() {
    check_model("qwen05");
}

#[test]
fn gemma3_matches_reference() {
    check_model("gemma3");
}

// ---------------------------------------------------------------------------------------------
// Tiny vocabularies

/// GPT-2's byte -> printable-char map.
fn bytes_to_unicode() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut map = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        map[*b as usize] = char::from_u32(c).unwrap();
    }
    map
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

struct Owned {
    tokens: Vec<String>,
    types: Vec<i32>,
    scores: Vec<f32>,
    merges: Vec<String>,
}

impl Owned {
    fn id(&self, t: &str) -> u32 {
        self.tokens.iter().position(|x| x == t).unwrap_or_else(|| panic!("{t:?}")) as u32
    }
}

fn byte_level_vocab() -> Owned {
    let alphabet = bytes_to_unicode();
    let mut tokens: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    let merges = strings(&["Ġ t", "h e", "Ġt he", "1 2", "Ã ©"]);
    tokens.extend(strings(&["Ġt", "he", "Ġthe", "12", "Ã©", "<|im_start|>", "<tool>"]));
    let mut types = vec![token_type::NORMAL; tokens.len()];
    let n = types.len();
    types[n - 2] = token_type::CONTROL;
    types[n - 1] = token_type::USER_DEFINED;
    Owned { tokens, types, scores: vec![], merges }
}

fn byte_level(v: &Owned, pre: &str) -> Tokenizer {
    Tokenizer::from_gguf_vocab(&GgufVocab {
        model: "gpt2",
        pre: Some(pre),
        tokens: &v.tokens,
        token_types: Some(&v.types),
        merges: Some(&v.merges),
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn byte_level_bpe_builder() {
    let v = byte_level_vocab();
    let tok = byte_level(&v, "default");
    assert_eq!(tok.vocab_size(), v.tokens.len());
    assert_eq!(tok.encode(" the", false).unwrap(), vec![v.id("Ġthe")]);
    assert_eq!(tok.encode("the", false).unwrap(), vec![v.id("t"), v.id("he")]);
    // Specials parse whole; user-defined tokens too; both decode back.
    let ids = tok.encode("<|im_start|>the<tool>", false).unwrap();
    assert_eq!(ids, vec![v.id("<|im_start|>"), v.id("t"), v.id("he"), v.id("<tool>")]);
    assert_eq!(tok.decode(&ids).unwrap(), "<|im_start|>the<tool>");
    assert_eq!(tok.decode_skip_special(&ids).unwrap(), "the<tool>");
    assert!(tok.is_special(v.id("<|im_start|>")));
    assert!(!tok.is_special(v.id("<tool>")));
    // Multi-byte characters are bytes.
    assert_eq!(tok.encode("é", false).unwrap(), vec![v.id("Ã©")]);
    assert_eq!(tok.decode(&[v.id("Ã©")]).unwrap(), "é");
    // GPT-2 regex keeps "12" together; SmolLM2's pre-tokenizer splits digits.
    assert_eq!(tok.encode("12", false).unwrap(), vec![v.id("12")]);
    let smol = byte_level(&v, "smollm");
    assert_eq!(smol.encode("12", false).unwrap(), vec![v.id("1"), v.id("2")]);
    // Qwen2: NFC first, so a decomposed "é" is the composed one.
    let qwen = byte_level(&v, "qwen2");
    assert_eq!(qwen.encode("e\u{301}", false).unwrap(), vec![v.id("Ã©")]);
    assert_eq!(qwen.encode(" the12", false).unwrap(), vec![v.id("Ġthe"), v.id("1"), v.id("2")]);
}

fn spm_vocab() -> Owned {
    let mut tokens = strings(&["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "\n", "  "]);
    let mut types = vec![3, 3, 3, 3, 3, 4, 4];
    let mut scores = vec![0.0; tokens.len()];
    for b in 0..256 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(token_type::BYTE);
        scores.push(0.0);
    }
    let normal = ["▁", "h", "e", "l", "o", "ll", "he", "hell", "hello", "▁hello", "lo"];
    for (i, t) in normal.iter().enumerate() {
        tokens.push(t.to_string());
        types.push(token_type::NORMAL);
        scores.push(-(i as f32));
    }
    Owned { tokens, types, scores, merges: vec![] }
}

fn spm(v: &Owned) -> Tokenizer {
    let mut tok = Tokenizer::from_gguf_vocab(&GgufVocab {
        model: "llama",
        tokens: &v.tokens,
        token_types: Some(&v.types),
        scores: Some(&v.scores),
        ..Default::default()
    })
    .unwrap();
    tok.set_special_ids(true, Some(2), Some(1));
    tok
}

#[test]
fn sentencepiece_bpe_builder() {
    let v = spm_vocab();
    let tok = spm(&v);
    assert_eq!(tok.encode("hello", false).unwrap(), vec![v.id("hello")]);
    assert_eq!(tok.encode(" hello", false).unwrap(), vec![v.id("▁hello")]);
    assert_eq!(tok.encode("hello", true).unwrap(), vec![2, v.id("hello")]);
    assert_eq!(tok.encode("<bos>hello", true).unwrap(), vec![2, v.id("hello")]);
    // "he" outranks "lo".
    assert_eq!(tok.encode("helo", false).unwrap(), vec![v.id("he"), v.id("lo")]);
    // Unknown characters fall back to bytes and decode back.
    let ids = tok.encode("hé", false).unwrap();
    assert_eq!(ids, vec![v.id("h"), v.id("<0xC3>"), v.id("<0xA9>")]);
    assert_eq!(tok.decode(&ids).unwrap(), "hé");
    // Control and user-defined tokens (the latter stored with real spaces) parse whole.
    let ids = tok.encode("<start_of_turn>  hello\n", false).unwrap();
    assert_eq!(ids, vec![4, v.id("  "), v.id("hello"), v.id("\n")]);
    assert_eq!(tok.decode(&ids).unwrap(), "<start_of_turn>  hello\n");
    assert_eq!(tok.decode_skip_special(&ids).unwrap(), "  hello\n");
    assert_eq!(tok.token_to_str(v.id("▁hello")).as_deref(), Some("▁hello"));
}

#[test]
fn stream_decoder_holds_incomplete_characters() {
    let v = spm_vocab();
    let tok = spm(&v);
    let mut s = tok.stream_decoder();
    assert_eq!(s.push(v.id("▁hello")).unwrap().as_deref(), Some(" hello"));
    assert_eq!(s.push(v.id("<0xC3>")).unwrap(), None);
    assert_eq!(s.push(4).unwrap(), None); // a special token in between: not printed
    assert_eq!(s.push(v.id("<0xA9>")).unwrap().as_deref(), Some("é"));
    // A 4-byte character over four tokens.
    for b in [0xF0u8, 0x9F, 0x98] {
        assert_eq!(s.push(v.id(&format!("<0x{b:02X}>"))).unwrap(), None);
    }
    assert_eq!(s.push(v.id("<0x80>")).unwrap().as_deref(), Some("😀"));
    assert_eq!(s.push(v.id("\n")).unwrap().as_deref(), Some("\n"));
    assert_eq!(s.finish().unwrap(), None);
    // An incomplete character at the end comes out on finish.
    let mut s = StreamDecoder::new(&tok);
    assert_eq!(s.push(v.id("<0xE2>")).unwrap(), None);
    assert_eq!(s.finish().unwrap().as_deref(), Some("\u{FFFD}"));

    // Byte-level: "é" as two byte tokens.
    let v = byte_level_vocab();
    let tok = byte_level(&v, "default");
    let mut s = tok.stream_decoder();
    assert_eq!(s.push(v.id("Ġthe")).unwrap().as_deref(), Some(" the"));
    assert_eq!(s.push(v.id("Ã")).unwrap(), None);
    assert_eq!(s.push(v.id("©")).unwrap().as_deref(), Some("é"));
}

/// A `tokenizer.json` source: what our builders make, written out and loaded back, tokenizes the same.
#[test]
fn json_source_roundtrip() {
    let cases: [(Tokenizer, &[&str]); 2] = [
        (spm(&spm_vocab()), &["hello", " hello  hé\n", "<start_of_turn>x<bos>"]),
        (byte_level(&byte_level_vocab(), "qwen2"), &[" the12é", "<|im_start|>the<tool>"]),
    ];
    for (i, (tok, texts)) in cases.iter().enumerate() {
        let json = tok.inner().to_string(false).unwrap();
        let path = std::env::temp_dir().join(format!("wgpu-llm-tok-{}-{i}.json", std::process::id()));
        std::fs::write(&path, json).unwrap();
        let loaded = Tokenizer::from_source(&TokenizerSource::Json(path.clone()), tok.add_bos(), tok.bos_id());
        std::fs::remove_file(&path).ok();
        let loaded = loaded.unwrap();
        assert_eq!(loaded.vocab_size(), tok.vocab_size());
        for text in texts.iter() {
            let ids = tok.encode(text, true).unwrap();
            assert_eq!(loaded.encode(text, true).unwrap(), ids, "{text:?}");
            assert_eq!(loaded.decode(&ids).unwrap(), tok.decode(&ids).unwrap());
        }
    }
}

#[test]
fn builder_errors() {
    let missing = PathBuf::from("/nonexistent/tokenizer.json");
    assert!(matches!(Tokenizer::from_source(&TokenizerSource::Json(missing), false, None), Err(Error::Tokenizer(_))));
    let tokens = strings(&["a"]);
    let v = GgufVocab { model: "bert", tokens: &tokens, ..Default::default() };
    assert!(matches!(Tokenizer::from_gguf_vocab(&v), Err(Error::Unsupported(_))));
    let merges = strings(&["a b"]); // "b" is not in the vocabulary
    let v = GgufVocab { model: "gpt2", tokens: &tokens, merges: Some(&merges), ..Default::default() };
    assert!(matches!(Tokenizer::from_gguf_vocab(&v), Err(Error::Tokenizer(_))));
}

#[test]
fn chat_template_with_bos_and_methods() {
    // A Gemma-3-style template: bos_token, role renaming, trim, raise_exception.
    let t = "{{ bos_token }}{%- for message in messages -%}\n{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}{{ raise_exception('roles must alternate') }}{%- endif -%}\n{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}\n{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}";
    let out = apply_chat_template(
        t,
        &[Message::user(" hi "), Message::assistant("hello")],
        true,
        Some("<bos>"),
        Some("<eos>"),
    )
    .unwrap();
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\nhello<end_of_turn>\n<start_of_turn>model\n"
    );
    match apply_chat_template(t, &[Message::assistant("x")], true, None, None) {
        Err(Error::Template(m)) => assert_eq!(m, "roles must alternate"),
        other => panic!("{other:?}"),
    }
}
