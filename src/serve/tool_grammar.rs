//! The grammar of a forced call in Gemma 4's native format ([`super::tools::ToolFormat::Gemma4`]):
//! `<|tool_call>call:NAME{key:value,...}<tool_call|>`, whose argument syntax is no JSON (strings
//! between `<|"|>`, keys bare), written as an llguidance Lark grammar from each tool's
//! `parameters` schema.
//!
//! What the schema says becomes rules of that syntax:
//! - an object: its properties in the schema's order, the required ones always, the others
//!   optional (no property it does not declare);
//! - a string: `<|"|>` text `<|"|>`, the text any characters but `<` (Gemma's reader ends a string
//!   at the closing tag), `minLength` / `maxLength` kept; an `enum` / `const` of strings: those
//!   strings;
//! - numbers, integers, booleans, null and enums of them: the JSON grammar of that schema
//!   (`%json`, bounds included), whose text is the same in Gemma's syntax;
//! - an array: `[v,...]` with `minItems` / `maxItems`.
//!
//! Other schema forms (`anyOf`, a list of types, `pattern`, `$ref`, ..) have no rules here: the
//! tool's forced call is then refused by name (`auto` still reads such calls back).

use crate::grammar::compact;
use serde_json::{json, Value};

/// Gemma 4's string delimiter.
const QUOTE: &str = "<|\"|>";

/// The Lark grammar of Gemma 4 calls to `tools` (each its name and its `parameters` schema):
/// one call, or with `parallel` one or more, one after the other. An error names the tool and
/// the schema form that has no rule.
pub fn gemma_grammar(tools: &[(&str, &Value)], parallel: bool) -> Result<String, String> {
    let mut g = Rules::default();
    let mut fns = Vec::new();
    for &(name, parameters) in tools {
        let args = g.value(parameters).map_err(|e| format!("the parameters of the tool '{name}': {e}"))?;
        if !parameters.get("type").is_some_and(|ty| ty == "object") {
            return Err(format!("the parameters of the tool '{name}' are not an object"));
        }
        fns.push(format!("{} {args}", lit(&format!("call:{name}"))));
    }
    let mut out = String::new();
    out.push_str(if parallel { "start: call+\n" } else { "start: call\n" });
    out.push_str(&format!("call: {} ({}) {}\n", lit("<|tool_call>"), fns.join(" | "), lit("<tool_call|>")));
    out.push_str(&g.text);
    Ok(out)
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("strings serialize")
}

/// Rules written so far (leaf `%json` rules get names of their own).
#[derive(Default)]
struct Rules {
    text: String,
    count: usize,
}

impl Rules {
    /// A named rule for `body`; its name.
    fn rule(&mut self, body: &str) -> String {
        let name = format!("v{}", self.count);
        self.count += 1;
        self.text.push_str(&format!("{name}: {body}\n"));
        name
    }

    /// The expression of a value under `schema`.
    fn value(&mut self, schema: &Value) -> Result<String, String> {
        let Some(obj) = schema.as_object() else {
            return match schema {
                Value::Bool(true) => Err("`true` (any value) has no rule".into()),
                _ => Err(format!("{schema} is not a schema this format can follow")),
            };
        };
        for unsupported in ["anyOf", "oneOf", "allOf", "not", "$ref", "pattern", "format", "if", "patternProperties"] {
            if obj.contains_key(unsupported) {
                return Err(format!("`{unsupported}` has no rule in Gemma 4's call format"));
            }
        }
        let choices = obj.get("enum").cloned().or_else(|| obj.get("const").map(|c| json!([c])));
        if let Some(Value::Array(values)) = choices {
            if values.is_empty() {
                return Err("an empty `enum`".into());
            }
            if values.iter().all(Value::is_string) {
                let alts: Vec<String> =
                    values.iter().map(|v| lit(&format!("{QUOTE}{}{QUOTE}", v.as_str().unwrap()))).collect();
                return Ok(format!("({})", alts.join(" | ")));
            }
            if values.iter().any(|v| v.is_string() || v.is_object() || v.is_array()) {
                return Err("an `enum` of strings mixed with other values, or of objects or arrays".into());
            }
            return Ok(self.rule(&format!("%json {}", compact(json!({"enum": values})))));
        }
        let ty = match obj.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(_) => return Err("a list of types has no rule in Gemma 4's call format".into()),
            None if obj.contains_key("properties") => "object",
            None => return Err("a schema without a `type`".into()),
        };
        let count = |key: &str| obj.get(key).and_then(Value::as_u64).map(|n| n as usize);
        match ty {
            "string" => {
                let (min, max) = (count("minLength").unwrap_or(0), count("maxLength"));
                let reps = match max {
                    Some(max) => format!("{{{min},{max}}}"),
                    None if min == 0 => "*".into(),
                    None => format!("{{{min},}}"),
                };
                Ok(format!("{} /[^<]{reps}/ {}", lit(QUOTE), lit(QUOTE)))
            }
            "integer" | "number" | "boolean" | "null" => {
                Ok(self.rule(&format!("%json {}", compact(Value::Object(obj.clone())))))
            }
            "array" => {
                let item = match obj.get("items") {
                    Some(items) => self.value(items)?,
                    None => return Err("an array without `items`".into()),
                };
                let (min, max) = (count("minItems").unwrap_or(0), count("maxItems"));
                if max.is_some_and(|m| m < min) {
                    return Err("`maxItems` below `minItems`".into());
                }
                let item = self.rule(&item);
                let mut seq = vec![item.clone()];
                let more = format!("{} {item}", lit(","));
                for _ in 1..min.max(1) {
                    seq.push(more.clone());
                }
                match max {
                    Some(m) => seq.extend((min.max(1)..m).map(|_| format!("({more})?"))),
                    None => seq.push(format!("({more})*")),
                }
                let items = seq.join(" ");
                let body = if min == 0 && max != Some(0) {
                    format!("({items})?")
                } else if max == Some(0) {
                    String::new()
                } else {
                    items
                };
                Ok(format!("{} {body} {}", lit("["), lit("]")))
            }
            "object" => {
                let props: Vec<(String, &Value)> = match obj.get("properties") {
                    Some(Value::Object(p)) => p.iter().map(|(k, v)| (k.clone(), v)).collect(),
                    Some(_) => return Err("`properties` is not an object".into()),
                    None => Vec::new(),
                };
                let required: Vec<&str> = match obj.get("required") {
                    Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
                    _ => Vec::new(),
                };
                if let Some(missing) = required.iter().find(|r| !props.iter().any(|(k, _)| k == *r)) {
                    return Err(format!("required property '{missing}' is not among the properties"));
                }
                let mut parts = Vec::with_capacity(props.len());
                for (key, schema) in &props {
                    if key.is_empty() || key.contains([':', ',', '{', '}', '<']) || key.trim() != key {
                        return Err(format!("the property name {key:?} cannot be written in Gemma 4's call format"));
                    }
                    let v = self.value(schema)?;
                    parts.push((format!("{} {v}", lit(&format!("{key}:"))), required.contains(&key.as_str())));
                }
                Ok(format!("{} {} {}", lit("{"), first(&parts, 0), lit("}")))
            }
            other => Err(format!("type '{other}' has no rule in Gemma 4's call format")),
        }
    }
}

/// The properties from `j` on when none came before them: each optional one may be left out,
/// the first one written has no comma before it.
fn first(parts: &[(String, bool)], j: usize) -> String {
    let Some((p, required)) = parts.get(j) else {
        return String::new();
    };
    let rest = rest(parts, j + 1);
    if *required {
        format!("{p} {rest}")
    } else {
        let later = first(parts, j + 1);
        match later.trim().is_empty() {
            true => format!("({p} {rest})?"),
            false => format!("({p} {rest} | {later})?"),
        }
    }
}

/// The properties from `j` on after one was written: each with a comma before it.
fn rest(parts: &[(String, bool)], j: usize) -> String {
    let Some((p, required)) = parts.get(j) else {
        return String::new();
    };
    let next = rest(parts, j + 1);
    if *required {
        format!("{} {p} {next}", lit(","))
    } else {
        format!("({} {p})? {next}", lit(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Constraint;

    #[test]
    fn schemas_become_grammars_that_compile() {
        let weather = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                   "unit": {"enum": ["c", "f"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
                   "hourly": {"type": "boolean"}, "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
                   "at": {"type": "object", "properties": {"lat": {"type": "number"}}, "required": ["lat"]}},
                   "required": ["city"]});
        let ping = json!({"type": "object", "properties": {}});
        for parallel in [false, true] {
            let g = gemma_grammar(&[("get_weather", &weather), ("ping", &ping)], parallel).unwrap();
            assert!(g.contains(r#""call:get_weather" "{" "city:" "<|\"|>" /[^<]{0,8}/ "<|\"|>""#), "{g}");
            assert!(g.contains(r#"%json {"type":"integer","minimum":1,"maximum":7"#), "{g}");
            Constraint::Lark(g.clone()).check().unwrap_or_else(|e| panic!("{e}\n{g}"));
        }
    }

    #[test]
    fn forms_without_rules_name_the_tool() {
        for (params, want) in [
            (json!({"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}]}}}), "anyOf"),
            (json!({"type": "object", "properties": {"x": {"type": ["string", "null"]}}}), "a list of types"),
            (json!({"type": "object", "properties": {"a:b": {"type": "string"}}}), "property name"),
            (json!({"type": "object", "required": ["y"]}), "required property 'y'"),
        ] {
            let e = gemma_grammar(&[("f", &params)], false).unwrap_err();
            assert!(e.contains("tool 'f'") && e.contains(want), "{e}");
        }
    }
}
