//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, or
//! `chat_template` in a Hugging Face `tokenizer_config.json`) rendered with minijinja the way
//! Hugging Face transformers renders it.
//!
//! What makes this match transformers' `apply_chat_template(..., tokenize=False)`:
//! - `trim_blocks` and `lstrip_blocks` on, trailing newline dropped (transformers' Jinja settings);
//! - Python string/dict/list methods (`.strip()`, `.startswith()`, `.items()`, ...) through
//!   `minijinja_contrib::pycompat`;
//! - `raise_exception(msg)` and `strftime_now(fmt)` globals;
//! - a `tojson` filter that writes what Python's `json.dumps(x, ensure_ascii=False)` writes
//!   (`{"a": 1}`, no HTML escaping), with `indent`, `separators` and `sort_keys`;
//! - variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (none, or
//!   the request's tool definitions as OpenAI sends them: `{"type": "function", "function":
//!   {"name", "description", "parameters"}}`, see [`ChatTemplate::render_with_tools`]) and
//!   `documents` set to none;
//! - maps iterate in insertion order, as Python's dicts do (minijinja's `preserve_order`), so
//!   `tool | tojson` writes a tool's keys in the order the request gave them.
//!
//! A message is a map of `role` and `content`, and where present `tool_calls` (an assistant's
//! calls: `[{"id", "type": "function", "function": {"name", "arguments"}}]`, the arguments a
//! mapping where they are JSON, which is what Qwen's templates pass through `tojson`),
//! `tool_call_id` and `name` (a `tool` message's).
//!
//! A template error (syntax, `raise_exception`, a failing filter) becomes
//! [`crate::Error::Template`] carrying the template's own message.

use crate::error::{Error, Result};
use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool` (or whatever the template knows).
    pub role: String,
    pub content: String,
    /// An assistant message's tool calls, a JSON list as the template reads it (see the
    /// [module docs](self)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, name: None }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// A message is a map with keys `role`, `content`, then those of `tool_calls`, `tool_call_id`,
/// `name` it has, in that order (what `tojson` and `.items()` see).
impl minijinja::value::Object for Message {
    fn get_value(self: &std::sync::Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.role.as_str())),
            "content" => Some(Value::from(self.content.as_str())),
            "tool_calls" => self.tool_calls.as_ref().map(json_value),
            "tool_call_id" => self.tool_call_id.as_deref().map(Value::from),
            "name" => self.name.as_deref().map(Value::from),
            _ => None,
        }
    }
    fn enumerate(self: &std::sync::Arc<Self>) -> minijinja::value::Enumerator {
        let mut keys = vec!["role", "content"];
        for (key, present) in [
            ("tool_calls", self.tool_calls.is_some()),
            ("tool_call_id", self.tool_call_id.is_some()),
            ("name", self.name.is_some()),
        ] {
            if present {
                keys.push(key);
            }
        }
        minijinja::value::Enumerator::Values(keys.into_iter().map(Value::from).collect())
    }
}

/// The error for a model that ships no chat template.
pub fn no_template_error() -> Error {
    Error::Template("model has no chat template; run without --chat".into())
}

/// A compiled chat template, for rendering many conversations with the same template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `template`; a syntax error is an [`Error::Template`].
    pub fn new(template: &str, bos_token: Option<&str>, eos_token: Option<&str>) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(template_error)?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, template.to_owned()).map_err(template_error)?;
        Ok(ChatTemplate {
            env,
            source: template.to_owned(),
            bos_token: bos_token.map(str::to_owned),
            eos_token: eos_token.map(str::to_owned),
        })
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends with the header of the
    /// assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, add_generation_prompt, None)
    }

    /// [`Self::render`] with the template's `tools` variable set to `tools` (a JSON list of tool
    /// definitions as OpenAI's API sends them), or none.
    pub fn render_with_tools(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        tools: Option<&serde_json::Value>,
    ) -> Result<String> {
        let tmpl = self.env.get_template(NAME).map_err(template_error)?;
        let ctx = minijinja::context! {
            messages => Value::from(messages.iter().map(|m| Value::from_object(m.clone())).collect::<Vec<_>>()),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref().unwrap_or(""),
            eos_token => self.eos_token.as_deref().unwrap_or(""),
            tools => tools.map_or(Value::from(()), json_value),
            documents => Value::from(()),
        };
        tmpl.render(ctx).map_err(template_error)
    }

    /// The template's text.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// Renders `template` for `messages` (see the module docs for what matches transformers).
pub fn apply_chat_template(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String> {
    ChatTemplate::new(template, bos_token, eos_token)?.render(messages, add_generation_prompt)
}

/// Renders with the model's template, or says that the model has none.
pub fn apply_model_chat_template(
    template: Option<&str>,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String> {
    let template = template.ok_or_else(no_template_error)?;
    apply_chat_template(template, messages, add_generation_prompt, bos_token, eos_token)
}

/// A JSON value as a template value, objects keeping their key order (as Python's `json.loads`
/// gives them to transformers).
pub fn json_value(v: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match v {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(u)) => Value::from(u),
            _ => Value::from(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::String(s) => Value::from(s.as_str()),
        J::Array(a) => a.iter().map(json_value).collect(),
        J::Object(o) => Value::from_pairs(o.iter().map(|(k, v)| (Value::from(k.as_str()), json_value(v)))),
    }
}

/// Marks an error raised by the template itself through `raise_exception`.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

fn template_error(e: minijinja::Error) -> Error {
    use std::error::Error as _;
    let mut src: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = src {
        if let Some(r) = s.downcast_ref::<Raised>() {
            return Error::Template(r.0.clone());
        }
        src = s.source();
    }
    let mut msg = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        msg.push_str(&format!(" (template line {line})"));
    }
    Error::Template(msg)
}

fn raise_exception(message: String) -> std::result::Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime_local(&format, secs).map_err(|m| minijinja::Error::new(ErrorKind::InvalidOperation, m))
}

/// transformers' `strftime_now`: `datetime.now().strftime(format)`, the local time of the
/// machine as a naive datetime (so `%Z` and `%z` render empty, as Python's do).
fn strftime_local(format: &str, unix_secs: i64) -> std::result::Result<String, String> {
    strftime_naive(format, unix_secs.saturating_add(utc_offset_secs(unix_secs)))
}

/// The local time zone's offset from UTC at `unix_secs`, in seconds (`localtime_r`, which
/// follows `TZ` and /etc/localtime); 0 where the platform gives none.
fn utc_offset_secs(unix_secs: i64) -> i64 {
    #[cfg(unix)]
    {
        let t: libc::time_t = unix_secs as libc::time_t;
        // SAFETY: localtime_r writes only into the `tm` we pass and reads `t`; a zeroed `tm` is a
        // valid value of the plain C struct.
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        if !unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
            return tm.tm_gmtoff as i64;
        }
    }
    let _ = unix_secs;
    0
}

/// Python's `strftime` for the common directives, on a naive wall-clock time given as seconds
/// since 1970-01-01 00:00 of that clock.
fn strftime_naive(format: &str, unix_secs: i64) -> std::result::Result<String, String> {
    const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_secs.div_euclid(86400);
    let rem = unix_secs.rem_euclid(86400);
    let (hour, min, sec) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy_m = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_m + 2) / 153;
    let day = doy_m - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday (index 3)
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    const CUM: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let h12 = if hour % 12 == 0 { 12 } else { hour % 12 };

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            out.push('%');
            break;
        };
        match d {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            '-' => match chars.next() {
                // glibc's no-padding flag, as in "%-d"
                Some('d') => out.push_str(&day.to_string()),
                Some('m') => out.push_str(&month.to_string()),
                Some('H') => out.push_str(&hour.to_string()),
                Some('I') => out.push_str(&h12.to_string()),
                Some('M') => out.push_str(&min.to_string()),
                Some('S') => out.push_str(&sec.to_string()),
                Some('j') => out.push_str(&yday.to_string()),
                other => return Err(format!("strftime_now: unsupported directive %-{}", other.unwrap_or(' '))),
            },
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{h12:02}")),
            'M' => out.push_str(&format!("{min:02}")),
            'S' => out.push_str(&format!("{sec:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'j' => out.push_str(&format!("{yday:03}")),
            'A' => out.push_str(DAYS[weekday]),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'B' => out.push_str(MONTHS[(month - 1) as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            'w' => out.push_str(&((weekday + 1) % 7).to_string()),
            'u' => out.push_str(&(weekday + 1).to_string()),
            'F' => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            'T' => out.push_str(&format!("{hour:02}:{min:02}:{sec:02}")),
            // A naive datetime has no zone: Python renders both empty.
            'Z' | 'z' => {}
            '%' => out.push('%'),
            other => return Err(format!("strftime_now: unsupported directive %{other}")),
        }
    }
    Ok(out)
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.kind() {
            ValueKind::Number => Some(" ".repeat(i64::try_from(v)?.max(0) as usize)),
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ))
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() && !v.is_undefined() => {
            let a = v.get_item_by_index(0)?;
            let b = v.get_item_by_index(1)?;
            match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => (a.to_owned(), b.to_owned()),
                _ => {
                    return Err(minijinja::Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ))
                }
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_owned(), ": ".to_owned()),
    };
    let w = JsonWriter {
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    w.write(&value, 0, &mut out)?;
    Ok(out)
}

struct JsonWriter {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonWriter {
    fn newline(&self, level: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..level {
                out.push_str(ind);
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for u in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{:04x}", u));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }

    /// A list or an object: `open`, then `item` of each of `items` (separated, each on its own
    /// line at `level + 1` where indenting), then `close` on a line at `level`; `[]` / `{}` when
    /// empty.
    fn items(
        &self,
        items: &[Value],
        [open, close]: [char; 2],
        level: usize,
        out: &mut String,
        mut item: impl FnMut(&Value, &mut String) -> std::result::Result<(), minijinja::Error>,
    ) -> std::result::Result<(), minijinja::Error> {
        out.push(open);
        if items.is_empty() {
            out.push(close);
            return Ok(());
        }
        for (i, it) in items.iter().enumerate() {
            if i > 0 {
                out.push_str(&self.item_sep);
            }
            self.newline(level + 1, out);
            item(it, out)?;
        }
        self.newline(level, out);
        out.push(close);
        Ok(())
    }

    fn write(&self, v: &Value, level: usize, out: &mut String) -> std::result::Result<(), minijinja::Error> {
        match v.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => {
                if let Ok(i) = i64::try_from(v.clone()) {
                    if v.as_i64().is_some() || !v.to_string().contains(['.', 'e', 'E']) {
                        out.push_str(&i.to_string());
                        return Ok(());
                    }
                }
                let f = f64::try_from(v.clone())?;
                out.push_str(&python_float_repr(f));
            }
            ValueKind::String => self.string(v.as_str().unwrap_or_default(), out),
            ValueKind::Bytes => self.string(&v.to_string(), out),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.items(&items, ['[', ']'], level, out, |item, out| self.write(item, level + 1, out))?;
            }
            ValueKind::Map => {
                let mut keys: Vec<Value> = v.try_iter()?.collect();
                if self.sort_keys {
                    keys.sort();
                }
                self.items(&keys, ['{', '}'], level, out, |k, out| {
                    match k.as_str() {
                        Some(s) => self.string(s, out),
                        None => self.string(&k.to_string(), out),
                    }
                    out.push_str(&self.key_sep);
                    self.write(&v.get_item(k)?, level + 1, out)
                })?;
            }
            _ => self.string(&v.to_string(), out),
        }
        Ok(())
    }
}

/// Python's `repr(float)` for finite values, `NaN`/`Infinity` as `json.dumps` writes them.
fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let s = format!("{f:?}"); // shortest round-trip, like Python
    if s.contains(['.', 'e', 'E']) || s.contains("inf") {
        s
    } else {
        format!("{s}.0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml() {
        let out =
            apply_chat_template(CHATML, &[Message::user("hi"), Message::assistant("hello")], true, None, None).unwrap();
        assert_eq!(
            out,
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn raise_exception_message_is_kept() {
        let t = "{% if messages[0].role != 'system' %}{{ raise_exception('System first, please') }}{% endif %}";
        match apply_chat_template(t, &[Message::user("x")], false, None, None) {
            Err(Error::Template(m)) => assert_eq!(m, "System first, please"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn syntax_error_is_template_error() {
        assert!(matches!(apply_chat_template("{% for %}", &[], false, None, None), Err(Error::Template(_))));
    }

    #[test]
    fn no_template() {
        match apply_model_chat_template(None, &[], true, None, None) {
            Err(Error::Template(m)) => assert!(m.contains("no chat template"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn python_methods_and_blocks() {
        // lstrip_blocks/trim_blocks: the block lines leave no whitespace behind.
        let t = "{{ bos_token }}\n{% for m in messages %}\n    {% if m.content.strip().startswith('/') %}\n[cmd]{{ m.content.strip()[1:] | upper }}\n    {% else %}\n{{ m.role.title() }}: {{ m.content | trim }}\n    {% endif %}\n{% endfor %}\n";
        let out =
            apply_chat_template(t, &[Message::user("  /run "), Message::assistant(" ok ")], false, Some("<s>"), None)
                .unwrap();
        assert_eq!(out, "<s>\n[cmd]RUN\nAssistant: ok\n");
    }

    #[test]
    fn tojson_like_python() {
        let env_out = |t: &str| apply_chat_template(t, &[Message::user("a\"<b>é\n")], false, None, None).unwrap();
        assert_eq!(env_out("{{ messages[0] | tojson }}"), r#"{"role": "user", "content": "a\"<b>é\n"}"#);
        assert_eq!(env_out("{{ [1, 2.5, none, true] | tojson }}"), "[1, 2.5, null, true]");
        // Maps keep their insertion order, as Python's dicts do.
        assert_eq!(env_out("{{ {'b': 1, 'a': 2} | tojson }}"), r#"{"b": 1, "a": 2}"#);
        assert_eq!(
            env_out("{{ {'a': [1, {}], 'b': []} | tojson(indent=2) }}"),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(
            env_out("{{ {'b': 1, 'a': 2} | tojson(sort_keys=true, separators=[',', ':']) }}"),
            r#"{"a":2,"b":1}"#
        );
    }

    #[test]
    fn tools_and_tool_calls_reach_the_template() {
        let t = ChatTemplate::new(
            "{% for t in tools %}{{ t.function.name }}:{{ t | tojson }}\n{% endfor %}{% for m in messages %}{{ m | tojson }}\n{% for c in m.tool_calls or [] %}{{ c.function.name }}({{ c.function.arguments.city }})\n{% endfor %}{% endfor %}",
            None,
            None,
        )
        .unwrap();
        let tools =
            serde_json::json!([{"type": "function", "function": {"name": "w", "parameters": {"z": 1, "a": 2}}}]);
        let mut call = Message::assistant("");
        call.tool_calls = Some(serde_json::json!([{"id": "c1", "type": "function",
            "function": {"name": "w", "arguments": {"city": "Oslo"}}}]));
        let mut result = Message::new("tool", "12C");
        (result.tool_call_id, result.name) = (Some("c1".into()), Some("w".into()));
        let out = t.render_with_tools(&[call, result], false, Some(&tools)).unwrap();
        assert_eq!(
            out,
            "w:{\"type\": \"function\", \"function\": {\"name\": \"w\", \"parameters\": {\"z\": 1, \"a\": 2}}}\n\
             {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}}]}\n\
             w(Oslo)\n\
             {\"role\": \"tool\", \"content\": \"12C\", \"tool_call_id\": \"c1\", \"name\": \"w\"}\n"
        );
        // Without tools the variable is none.
        assert_eq!(ChatTemplate::new("{{ tools is none }}", None, None).unwrap().render(&[], false).unwrap(), "True");
    }

    #[test]
    fn strftime() {
        // 2024-02-29 13:05:09, a Thursday.
        let t = 1709211909;
        assert_eq!(
            strftime_naive("%Y-%m-%d %H:%M:%S %A %a %B %b %j %I%p %y %-d %%", t).unwrap(),
            "2024-02-29 13:05:09 Thursday Thu February Feb 060 01PM 24 29 %"
        );
        assert_eq!(strftime_naive("%d %b %Y", 0).unwrap(), "01 Jan 1970");
        assert_eq!(strftime_naive("[%Z%z]", 0).unwrap(), "[]");
        let out = apply_chat_template("{{ strftime_now('%Y') }}", &[], false, None, None).unwrap();
        assert_eq!(out.len(), 4);
    }

    /// `strftime_now` renders the local time, as transformers does: this test runs itself again in
    /// a child process under two POSIX time zones (no zone database needed) and checks the
    /// wall-clock time it prints for a fixed instant.
    #[test]
    fn strftime_now_is_local_time() {
        const CHILD: &str = "WGPU_LLM_STRFTIME_CHILD";
        let t = 1709211909; // 2024-02-29 13:05:09 UTC
        if std::env::var_os(CHILD).is_some() {
            println!("<{}>", strftime_local("%Y-%m-%d %H:%M:%S", t).unwrap());
            return;
        }
        for (tz, want) in
            [("UTC0", "2024-02-29 13:05:09"), ("XST-5:30", "2024-02-29 18:35:09"), ("YST11", "2024-02-29 02:05:09")]
        {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["chat::tests::strftime_now_is_local_time", "--exact", "--nocapture", "--test-threads=1"])
                .env(CHILD, "1")
                .env("TZ", tz)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "child under TZ={tz} failed: {stdout}");
            if cfg!(unix) {
                assert!(stdout.contains(&format!("<{want}>")), "TZ={tz}: want {want}, child printed {stdout}");
            }
        }
    }
}
