//! Structured output ([`wgpu_llm::grammar`], [`wgpu_llm::decode::constrained`]): JSON schemas of
//! many shapes, a regex and a Lark grammar hold a model's output, checked by an independent JSON
//! Schema validator (the `jsonschema` crate) or by matching the text.
//!
//! Most cases run on a tiny synthetic model (random weights, SmolLM2's layout shrunk) with the real
//! SmolLM2 tokenizer and vocabulary (49,152 tokens): its logits are noise, so only the mask keeps
//! its output valid, which is the point. The schemas are bounded (lengths, item counts, ranges)
//! so that any path through them ends within the token limit. A few cases run the real
//! SmolLM2-135M-Instruct through the [`Engine`] API. Generations are short (lavapipe is slow).

mod common;

use common::tiny_smollm::{generate, text, tiny_model};
use wgpu_llm::decode::StopReason;
use wgpu_llm::grammar::Constraint;
use wgpu_llm::sampling::{DeviceSampler, HostSampler, SamplingParams};
use wgpu_llm::{Engine, Error};

/// Ten schemas of different shapes, each bounded so that every path ends within 96 tokens.
const SCHEMAS: [&str; 10] = [
    // A flat object, required and optional fields.
    r#"{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120}, "nick": {"type": "string", "maxLength": 4}},
        "required": ["name", "age"], "additionalProperties": false}"#,
    // Nested objects.
    r#"{"type": "object", "properties": {"user": {"type": "object", "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 999},
        "address": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["city", "zip"], "additionalProperties": false}},
        "required": ["id", "address"], "additionalProperties": false}}, "required": ["user"], "additionalProperties": false}"#,
    // An array of integers with bounds.
    r#"{"type": "array", "items": {"type": "integer", "minimum": -50, "maximum": 50}, "minItems": 1, "maxItems": 4}"#,
    // An enum of strings.
    r#"{"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
        "size": {"enum": ["S", "M", "L", "XL"]}}, "required": ["color", "size"], "additionalProperties": false}"#,
    // Numbers with bounds (exclusive too).
    r#"{"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1},
        "t": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20}}, "required": ["p", "t"], "additionalProperties": false}"#,
    // Booleans and null.
    r#"{"type": "object", "properties": {"ok": {"type": "boolean"}, "note": {"type": "null"}},
        "required": ["ok", "note"], "additionalProperties": false}"#,
    // An array of objects.
    r#"{"type": "array", "minItems": 1, "maxItems": 3, "items": {"type": "object", "properties": {
        "k": {"type": "string", "maxLength": 3}, "v": {"type": "boolean"}}, "required": ["k", "v"], "additionalProperties": false}}"#,
    // A const and a string pattern.
    r#"{"type": "object", "properties": {"version": {"const": 2}, "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
        "required": ["version", "code"], "additionalProperties": false}"#,
    // anyOf: a number or a short string.
    r#"{"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
        {"type": "string", "maxLength": 3}]}}, "required": ["value"], "additionalProperties": false}"#,
    // Definitions and references, an array of enums inside.
    r##"{"$defs": {"tag": {"enum": ["a", "b", "c"]}}, "type": "object", "properties": {
        "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 1, "maxItems": 3},
        "level": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["tags", "level"], "additionalProperties": false}"##,
];

fn validator(schema: &str) -> jsonschema::Validator {
    jsonschema::validator_for(&serde_json::from_str(schema).unwrap()).unwrap()
}

fn assert_valid(schema: &str, out: &str, what: &str) {
    let value: serde_json::Value =
        serde_json::from_str(out).unwrap_or_else(|e| panic!("{what}: not JSON ({e}): {out:?}"));
    let v = validator(schema);
    let errors: Vec<String> = v.iter_errors(&value).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{what}: {out} is invalid: {errors:?}");
}

/// Every schema, two seeds each, sampled on the device: complete, valid output every time.
#[test]
fn tiny_model_output_validates_against_ten_schemas() {
    let gpu = common::gpu();
    let mut model = tiny_model(&gpu);
    let mut sampler = DeviceSampler::new(&gpu).unwrap();
    for (i, schema) in SCHEMAS.iter().enumerate() {
        for seed in [1u64, 2] {
            let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed };
            let c = Constraint::JsonSchema(schema.to_string());
            let (out, tokens, stop) = generate(&mut model, &mut sampler, &c, &params, 96).unwrap();
            eprintln!("schema {i} seed {seed}: {out} ({} tokens, {stop:?})", tokens.len());
            assert_eq!(stop, StopReason::Eos, "schema {i} seed {seed}: {out:?} not finished in 96 tokens");
            assert_valid(schema, &out, &format!("schema {i} seed {seed}"));
        }
    }
}

/// The same constrained run with the host sampler gives the device's tokens (the masked
/// samplers are bit-identical), greedy and seeded.
#[test]
fn host_and_device_samplers_give_the_same_constrained_tokens() {
    let gpu = common::gpu();
    let mut model = tiny_model(&gpu);
    let mut device = DeviceSampler::new(&gpu).unwrap();
    for (schema, params) in [
        (SCHEMAS[0], SamplingParams::greedy()),
        (SCHEMAS[6], SamplingParams { temperature: 0.9, top_k: 50, top_p: 1.0, min_p: 0.0, seed: 9 }),
    ] {
        let c = Constraint::JsonSchema(schema.to_string());
        let dev = generate(&mut model, &mut device, &c, &params, 96).unwrap();
        let host = generate(&mut model, &mut HostSampler, &c, &params, 96).unwrap();
        assert_eq!(dev.1, host.1, "{params:?}");
        assert_eq!(dev.2, StopReason::Eos);
        assert_valid(schema, &dev.0, "greedy/seeded");
    }
}

/// A regex and a Lark grammar hold the output too.
#[test]
fn regex_and_lark_grammar() {
    let gpu = common::gpu();
    let mut model = tiny_model(&gpu);
    let mut sampler = DeviceSampler::new(&gpu).unwrap();
    let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 4 };
    let (out, _, stop) =
        generate(&mut model, &mut sampler, &Constraint::Regex("[A-Z][a-z]{2,5}-[0-9]{2}".into()), &params, 32).unwrap();
    assert_eq!(stop, StopReason::Eos, "{out:?}");
    let b = out.as_bytes();
    assert!(
        out.len() >= 6
            && b[0].is_ascii_uppercase()
            && out[1..out.len() - 3].bytes().all(|c| c.is_ascii_lowercase())
            && b[out.len() - 3] == b'-'
            && out[out.len() - 2..].bytes().all(|c| c.is_ascii_digit()),
        "{out:?} does not match the regex"
    );
    let lark = "start: answer \" \" mood\nanswer: \"yes\" | \"no\"\nmood: \"(sure)\" | \"(unsure)\"\n";
    let (out, _, stop) = generate(&mut model, &mut sampler, &Constraint::Lark(lark.into()), &params, 32).unwrap();
    assert_eq!(stop, StopReason::Eos);
    assert!(
        ["yes (sure)", "yes (unsure)", "no (sure)", "no (unsure)"].contains(&out.as_str()),
        "{out:?} is not in the grammar's language"
    );
}

/// A schema the limit cuts short ends with MaxTokens, not as complete; an invalid schema,
/// regex or grammar is an error naming the problem before anything runs.
#[test]
fn unfinished_and_invalid_constraints() {
    let gpu = common::gpu();
    let mut model = tiny_model(&gpu);
    let mut sampler = DeviceSampler::new(&gpu).unwrap();
    let long = Constraint::JsonSchema(r#"{"type": "string", "minLength": 40, "maxLength": 40}"#.into());
    let (out, tokens, stop) = generate(&mut model, &mut sampler, &long, &SamplingParams::greedy(), 6).unwrap();
    assert_eq!(stop, StopReason::MaxTokens, "{out:?}");
    assert_eq!(tokens.len(), 6);
    assert!(serde_json::from_str::<serde_json::Value>(&out).is_err(), "cut short, yet valid JSON: {out:?}");

    let bad = [
        (Constraint::JsonSchema("{\"type\": \"object\",".into()), "not JSON"),
        (Constraint::JsonSchema(r#"{"type": "strnig"}"#.into()), "strnig"),
        (Constraint::JsonSchema(r#"{"type": "integer", "minimum": 5, "maximum": 2}"#.into()), "JSON schema"),
        (Constraint::Regex("[a-z".into()), "regex"),
        (Constraint::Lark("start: foo\n".into()), "foo"),
        (Constraint::Lark("root ::= \"a\"\n".into()), "GBNF"),
    ];
    for (c, says) in bad {
        let e = match text().vocab.matcher(&c) {
            Err(e) => e,
            Ok(_) => panic!("{c:?} was accepted"),
        };
        let msg = e.to_string();
        assert!(matches!(e, Error::InvalidArgument(_)), "{c:?}: {e:?}");
        assert!(msg.contains(says), "{c:?}: {msg:?} does not say {says:?}");
        common::assert_clean_message(&msg);
    }
    // The model still runs after the errors.
    let c = Constraint::JsonSchema(SCHEMAS[5].into());
    let (out, _, stop) = generate(&mut model, &mut sampler, &c, &SamplingParams::greedy(), 32).unwrap();
    assert_eq!(stop, StopReason::Eos);
    assert_valid(SCHEMAS[5], &out, "after errors");
}

/// The real SmolLM2-135M-Instruct, through the Engine API, answers a chat question in the shape
/// two schemas ask for (greedy; at most 48 tokens each).
#[test]
fn real_model_answers_in_schema() {
    let mut engine = Engine::load(common::model("smollm2")).unwrap();
    let schemas = [
        r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20}}, "required": ["city", "country"], "additionalProperties": false}"#,
        r#"{"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100},
            "sure": {"type": "boolean"}}, "required": ["answer", "sure"], "additionalProperties": false}"#,
    ];
    let questions = ["What is the capital of France? Answer in JSON.", "What is 2+3? Answer in JSON."];
    for (schema, q) in schemas.iter().zip(questions) {
        let g = engine
            .generate(q)
            .chat(true)
            .temperature(0.0)
            .max_tokens(48)
            .constraint(Constraint::JsonSchema(schema.to_string()))
            .run()
            .unwrap();
        eprintln!("{q} -> {} ({:?})", g.text, g.stats.stop);
        assert_eq!(g.stats.stop, StopReason::Eos, "{:?}", g.text);
        assert_valid(schema, &g.text, q);
    }
}
