//! Tool calls (`serve`'s `tools` and `tool_choice`, [`wgpu_llm::serve::tools`]):
//! - the `openai` Python client round trip against `wgpu-llm serve` on SmolLM2-135M-Instruct
//!   (tests/serve_tools/openai_roundtrip.py: a tool definition in, a forced `tool_calls` message
//!   out, whole and streamed, the tool's result sent back, a final answer; `n` > 1; the 400s);
//! - forced calls on a tiny random model with the real SmolLM2 vocabulary: its logits are noise,
//!   so only the grammar of `tool_choice` keeps its output a valid call, which an independent
//!   JSON Schema validator checks against the called tool's `parameters`.

mod common;

use common::tiny_smollm::{generate, tiny_model};
use serde_json::json;
use wgpu_llm::decode::StopReason;
use wgpu_llm::sampling::{DeviceSampler, SamplingParams};
use wgpu_llm::serve::tools::{parse, plan, ToolFormat, ToolSupport};

#[test]
fn openai_client_round_trips_tool_calls() {
    let model = common::model("smollm2");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/serve_tools/openai_roundtrip.py");
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_wgpu-llm"))
        .arg(&model)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "tests/serve_tools/openai_roundtrip.py failed (tools/install-test-deps.sh installs openai):\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three tools of different shapes, in the Hermes (Qwen) and Gemma 4 call formats; `tool_choice`
/// "required" (any of them, one or several calls)
/// and each named in turn, two seeds each: every output is complete, parses as calls, and each
/// call's arguments validate against its tool's schema.
#[test]
fn forced_calls_are_valid_on_a_random_model() {
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"terms": {"type": "array", "items": {"type": "integer", "minimum": -9, "maximum": 99},
            "minItems": 1, "maxItems": 3}}, "required": ["terms"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "ping", "description": "no parameters"}},
    ]);
    let schemas: Vec<(String, serde_json::Value)> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let f = &t["function"];
            let p = if f["parameters"].is_null() {
                json!({"type": "object", "properties": {}, "additionalProperties": false})
            } else {
                f["parameters"].clone()
            };
            (f["name"].as_str().unwrap().to_string(), p)
        })
        .collect();
    let vocab = &common::tiny_smollm::text().vocab;
    let gpu = common::gpu();
    let mut model = tiny_model(&gpu);
    let mut sampler = DeviceSampler::new(&gpu).unwrap();
    let mut choices: Vec<(serde_json::Value, Option<String>)> = vec![(json!("required"), None)];
    for (name, _) in &schemas {
        choices.push((json!({"type": "function", "function": {"name": name}}), Some(name.clone())));
    }
    // Qwen's (Hermes) JSON calls and Gemma 4's own syntax.
    for format in [ToolFormat::Hermes, ToolFormat::Gemma4] {
        let support = ToolSupport { format, native: true };
        for (choice, named) in &choices {
            for (seed, parallel) in [(1u64, true), (2, false)] {
                let fields = json!({"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel});
                let p = plan(fields.as_object().unwrap(), support).unwrap().unwrap();
                let c = p.constraint(Ok(vocab)).unwrap().expect("a forced call has a grammar");
                let params = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed };
                let (out, tokens, stop) = generate(&mut model, &mut sampler, &c, &params, 180).unwrap();
                let what = format!("{format:?} {choice} seed {seed}: {out:?} ({} tokens)", tokens.len());
                eprintln!("{what}");
                assert_eq!(stop, StopReason::Eos, "{what}: not finished");
                let (content, calls) = parse(format, parallel, &out);
                assert_eq!(content, "", "{what}");
                assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{what}");
                for call in &calls {
                    if let Some(name) = &named {
                        assert_eq!(&call.name, name, "{what}");
                    }
                    let schema = &schemas.iter().find(|(n, _)| n == &call.name).unwrap_or_else(|| panic!("{what}")).1;
                    let args: serde_json::Value = serde_json::from_str(&call.arguments).unwrap();
                    let v = jsonschema::validator_for(schema).unwrap();
                    let errors: Vec<String> = v.iter_errors(&args).map(|e| e.to_string()).collect();
                    assert!(errors.is_empty(), "{what}: {} does not follow {schema}: {errors:?}", call.arguments);
                }
            }
        }
    }
}
