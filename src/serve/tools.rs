//! Tool calls in chat completions (`tools`, `tool_choice`, `parallel_tool_calls`): what the
//! chat template is given, the grammar that forces a call, and the model's text read back as
//! OpenAI's `tool_calls`.
//!
//! One format per model family, chosen from the chat template's text ([`ToolSupport::detect`]):
//! - [`ToolFormat::Hermes`], Qwen2.5 / Qwen3 (and Hermes-style templates): the template lists
//!   the tools itself (its `tools` variable) and the model answers
//!   `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, possibly several, one after
//!   the other (separated by a newline);
//! - [`ToolFormat::Gemma4`]: the template declares the tools itself and the model answers
//!   `<|tool_call>call:f{key:<|"|>text<|"|>,n:3}<tool_call|>` (strings between `<|"|>`, keys
//!   bare), read into JSON arguments;
//! - a template that knows no tools (SmolLM2, Gemma 3, ..): the Hermes format as a documented
//!   fallback ([`ToolSupport::native`] false): the tool definitions go into the system prompt
//!   (Qwen2.5's own wording, [`fallback_system_text`]), an assistant's earlier calls into its
//!   content as `<tool_call>` blocks, and `tool` messages become `user` messages of
//!   `<tool_response>` blocks.
//!
//! `tool_choice`: `"none"` offers the template no tools and reads no calls back (the model does
//! not call tools, as OpenAI's); `"auto"` (the default with tools) lets the model write what it
//! wants and reads calls back where it wrote the format; `"required"` and a named function
//! constrain the output by an llguidance Lark grammar of the family's call format whose arguments
//! are `%json` of each tool's `parameters` schema (a named function: that one only), so even a
//! tiny random model produces a valid call. `parallel_tool_calls: false` allows one call.
//! For Gemma 4's native format, whose argument syntax is no JSON, the grammar is written from
//! each tool's schema by [`super::tool_grammar`] (the schema forms it has rules for; a tool with
//! another form is a 400 naming it).
//!
//! Reading back ([`ToolStream`]) works on text as it streams: text before a call is content, a
//! partial opening tag is held back until the next piece decides, a call's name is sent as soon
//! as it is known and its arguments as they come (Hermes: the JSON value after `"arguments": `
//! piece by piece; Gemma 4: whole at the closing tag). A whole completion is read by the same
//! code fed at once, so streamed and whole answers agree. A block that does not parse stays
//! content.

use super::api::{ApiError, ChatMessage};
use super::text::held;
use crate::chat::Message;
use crate::grammar::{compact, Constraint, Vocabulary};
use crate::sampling::random_seed;
use serde_json::{json, Map, Value};

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// `<|tool_call>call:name{key:<|"|>text<|"|>}<tool_call|>` (Gemma 4).
    Gemma4,
}

impl ToolFormat {
    /// The tags around one call.
    fn tags(self) -> (&'static str, &'static str) {
        match self {
            ToolFormat::Hermes => ("<tool_call>", "</tool_call>"),
            ToolFormat::Gemma4 => ("<|tool_call>", "<tool_call|>"),
        }
    }

    /// Tokens of the format that a tokenizer may mark special (dropped from decoded text); the
    /// server keeps their text while it reads calls back.
    pub fn markers(self) -> &'static [&'static str] {
        match self {
            ToolFormat::Hermes => &["<tool_call>", "</tool_call>"],
            ToolFormat::Gemma4 => &["<|tool_call>", "<tool_call|>", GEMMA_QUOTE],
        }
    }
}

/// Gemma 4's string delimiter.
const GEMMA_QUOTE: &str = "<|\"|>";

/// What a chat template can do with tools.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ToolSupport {
    pub format: ToolFormat,
    /// Whether the template renders tools, calls and results itself (else the fallback of the
    /// [module docs](self)).
    pub native: bool,
}

impl ToolSupport {
    /// The family's format, from the template's text: Gemma 4's tags, Hermes' tags (with the
    /// template reading `tools`), else the Hermes fallback.
    pub fn detect(template: &str) -> Self {
        if template.contains("<|tool_call>") {
            Self { format: ToolFormat::Gemma4, native: true }
        } else if template.contains("<tool_call>") && template.contains("tools") {
            Self { format: ToolFormat::Hermes, native: true }
        } else {
            Self { format: ToolFormat::Hermes, native: false }
        }
    }
}

/// One tool of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    /// Its `parameters` JSON schema (an object without properties where the request gave none).
    pub parameters: Value,
}

/// What `tool_choice` asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    Auto,
    Required,
    /// This function, by name.
    Named(String),
}

/// A request's tools, checked: offered to the template and read back from the output.
#[derive(Clone, Debug)]
pub struct ToolPlan {
    pub support: ToolSupport,
    pub tools: Vec<Tool>,
    /// The `tools` list as the request sent it (what the template gets).
    pub definitions: Value,
    pub choice: Choice,
    /// `parallel_tool_calls` (default true): false allows one call.
    pub parallel: bool,
}

fn bad(msg: impl Into<String>, param: &'static str) -> ApiError {
    ApiError::invalid(msg, Some(param))
}

/// OpenAI's rule for a function name.
fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls` from a chat request's other fields.
/// `None`: no tools to offer (none given, or `tool_choice` "none"). A malformed tool, an unknown
/// named function, a choice without tools, or tools beside a `response_format` constraint are
/// 400s naming the problem.
pub fn plan(fields: &Map<String, Value>, support: ToolSupport) -> Result<Option<ToolPlan>, ApiError> {
    let definitions = match fields.get("tools") {
        None | Some(Value::Null) => Value::Array(Vec::new()),
        Some(v @ Value::Array(_)) => v.clone(),
        Some(v) => return Err(bad(format!("tools must be a list of tools, not {v}"), "tools")),
    };
    let mut tools = Vec::new();
    for (i, t) in definitions.as_array().into_iter().flatten().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(format!("tools[{i}].type must be 'function'"), "tools"));
        }
        let Some(f) = t.get("function").and_then(Value::as_object) else {
            return Err(bad(format!("tools[{i}].function is missing: {{\"name\", \"parameters\"}}"), "tools"));
        };
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        if !valid_name(name) {
            return Err(bad(
                format!("tools[{i}].function.name '{name}' must be 1 to 64 letters, digits, '_' or '-'"),
                "tools",
            ));
        }
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(bad(format!("tools[{i}]: the function '{name}' is defined twice"), "tools"));
        }
        let parameters = match f.get("parameters") {
            // No parameters: an empty parameter list (OpenAI's reading).
            None | Some(Value::Null) => json!({"type": "object", "properties": {}, "additionalProperties": false}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(p) => {
                return Err(bad(
                    format!("tools[{i}].function.parameters must be a JSON schema object, not {p}"),
                    "tools",
                ))
            }
        };
        tools.push(Tool { name: name.to_string(), parameters });
    }
    let choice = match fields.get("tool_choice") {
        None | Some(Value::Null) => (!tools.is_empty()).then_some(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "none" => None,
            "auto" => (!tools.is_empty()).then_some(Choice::Auto),
            "required" => Some(Choice::Required),
            other => {
                return Err(bad(
                    format!("tool_choice '{other}' is not one of 'none', 'auto', 'required' or a function"),
                    "tool_choice",
                ))
            }
        },
        Some(v @ Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            match (o.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => Some(Choice::Named(name.to_string())),
                _ => {
                    return Err(bad(
                        format!("tool_choice {v} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
                        "tool_choice",
                    ))
                }
            }
        }
        Some(v) => return Err(bad(format!("tool_choice must be a string or an object, not {v}"), "tool_choice")),
    };
    let Some(choice) = choice else { return Ok(None) };
    if tools.is_empty() {
        return Err(bad("tool_choice asks for a tool call, but the request has no tools", "tool_choice"));
    }
    if let Choice::Named(name) = &choice {
        if !tools.iter().any(|t| &t.name == name) {
            return Err(bad(format!("tool_choice names the function '{name}', which is not in tools"), "tool_choice"));
        }
    }
    if fields.get("response_format").is_some_and(|f| !(f.is_null() || f.get("type") == Some(&json!("text")))) {
        return Err(bad(
            "response_format together with tools is not supported: use one or the other",
            "response_format",
        ));
    }
    let parallel = match fields.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(v) => {
            return Err(bad(format!("parallel_tool_calls must be true or false, not {v}"), "parallel_tool_calls"))
        }
    };
    Ok(Some(ToolPlan { support, tools, definitions, choice, parallel }))
}

/// `tools` and `tool_choice` on `/v1/completions` (a chat feature): a 400 when they ask for
/// anything.
pub fn refuse_on_completions(fields: &Map<String, Value>) -> Result<(), ApiError> {
    let asks =
        |v: Option<&Value>| v.is_some_and(|v| !(v.is_null() || v == "none" || v.as_array().is_some_and(Vec::is_empty)));
    for name in ["tools", "tool_choice"] {
        if asks(fields.get(name)) {
            return Err(ApiError::invalid(
                format!("Unsupported parameter: '{name}' is a chat completions parameter: use /v1/chat/completions"),
                Some(if name == "tools" { "tools" } else { "tool_choice" }),
            )
            .with_code("unsupported_parameter"));
        }
    }
    Ok(())
}

/// The messages for the template, and the `tools` it gets: an assistant's `tool_calls` with
/// their arguments as mappings where they are JSON (Qwen's templates write them with `tojson`),
/// and for a template without tool support the fallback of the [module docs](self).
pub fn messages(
    msgs: &[ChatMessage],
    plan: Option<&ToolPlan>,
    support: ToolSupport,
) -> Result<(Vec<Message>, Option<Value>), ApiError> {
    let mut out: Vec<Message> = Vec::with_capacity(msgs.len() + 1);
    for (i, m) in msgs.iter().enumerate() {
        let mut msg = Message::new(&m.role, m.text()?);
        if let Some(calls) = m.tool_calls.as_ref().filter(|c| !c.is_null()) {
            let calls =
                normalize_calls(calls).map_err(|e| bad(format!("messages[{i}].tool_calls: {e}"), "messages"))?;
            if support.native {
                msg.tool_calls = Some(calls);
            } else {
                for c in calls.as_array().into_iter().flatten() {
                    let f = &c["function"];
                    let call = json!({"name": f["name"], "arguments": f["arguments"]});
                    if !msg.content.is_empty() {
                        msg.content.push('\n');
                    }
                    msg.content.push_str(&format!("<tool_call>\n{}\n</tool_call>", python_json(&call)));
                }
            }
        }
        if m.role == "tool" {
            if support.native {
                msg.tool_call_id = m.tool_call_id.clone();
                msg.name = m.name.clone();
            } else {
                let block = format!("<tool_response>\n{}\n</tool_response>", msg.content);
                match out.last_mut() {
                    Some(prev) if prev.role == "user" && i > 0 && msgs[i - 1].role == "tool" => {
                        prev.content.push('\n');
                        prev.content.push_str(&block);
                    }
                    _ => out.push(Message::new("user", block)),
                }
                continue;
            }
        }
        out.push(msg);
    }
    let Some(plan) = plan else { return Ok((out, None)) };
    if support.native {
        return Ok((out, Some(plan.definitions.clone())));
    }
    let text = fallback_system_text(&plan.definitions);
    match out.first_mut() {
        Some(first) if first.role == "system" => first.content = format!("{}\n\n{text}", first.content),
        _ => out.insert(0, Message::system(text)),
    }
    Ok((out, None))
}

/// The tool instructions of the fallback: Qwen2.5's template's own words (its tools section),
/// which models trained on Hermes-style calls know.
pub fn fallback_system_text(definitions: &Value) -> String {
    let mut s = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with \
         function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in definitions.as_array().into_iter().flatten() {
        s.push('\n');
        s.push_str(&python_json(t));
    }
    s.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    s
}

/// An assistant's `tool_calls` as templates read them: each `{"id", "type", "function": {"name",
/// "arguments"}}` with the arguments a JSON value where the string parses as JSON.
fn normalize_calls(calls: &Value) -> Result<Value, String> {
    let list = calls.as_array().ok_or("must be a list of calls")?;
    let mut out = Vec::with_capacity(list.len());
    for (j, c) in list.iter().enumerate() {
        let f = c.get("function").and_then(Value::as_object).ok_or(format!("[{j}].function is missing"))?;
        let name = f.get("name").and_then(Value::as_str).ok_or(format!("[{j}].function.name is missing"))?;
        let arguments = match f.get("arguments") {
            None | Some(Value::Null) => json!({}),
            Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
            Some(v) => v.clone(),
        };
        let mut call = Map::new();
        if let Some(id) = c.get("id") {
            call.insert("id".into(), id.clone());
        }
        call.insert("type".into(), json!("function"));
        call.insert("function".into(), json!({"name": name, "arguments": arguments}));
        out.push(Value::Object(call));
    }
    Ok(Value::Array(out))
}

/// JSON as Python's `json.dumps(x, ensure_ascii=False)` writes it (`", "`, `": "`), the form
/// the templates' `tojson` writes.
pub fn python_json(v: &Value) -> String {
    struct Python;
    impl serde_json::ser::Formatter for Python {
        fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            self.begin_array_value(w, first)
        }
        fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Python);
    serde::Serialize::serialize(v, &mut ser).expect("JSON values serialize");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

impl ToolPlan {
    /// The grammar that `"required"` or a named function asks for (`None` for `"auto"`), each
    /// tool's schema checked first by `vocab` so that a schema the grammar engine rejects is a
    /// 400 naming its tool.
    pub fn constraint(&self, vocab: Result<&Vocabulary, &String>) -> Result<Option<Constraint>, ApiError> {
        let tools: Vec<&Tool> = match &self.choice {
            Choice::Auto => return Ok(None),
            Choice::Required => self.tools.iter().collect(),
            Choice::Named(name) => self.tools.iter().filter(|t| &t.name == name).collect(),
        };
        if self.support.format == ToolFormat::Gemma4 {
            let named: Vec<(&str, &Value)> = tools.iter().map(|t| (t.name.as_str(), &t.parameters)).collect();
            let grammar = super::tool_grammar::gemma_grammar(&named, self.parallel).map_err(|e| {
                bad(format!("{e}: a forced call in Gemma 4's call format cannot follow it (use 'auto')"), "tools")
            })?;
            return Ok(Some(Constraint::Lark(grammar)));
        }
        let vocab = vocab.map_err(|e| {
            bad(format!("tool_choice needs structured output, which this model lacks: {e}"), "tool_choice")
        })?;
        for t in &tools {
            let schema = Constraint::JsonSchema(t.parameters.to_string());
            vocab.matcher(&schema).map_err(|e| {
                bad(
                    format!("the parameters of the tool '{}' are not a schema this server can follow: {e}", t.name),
                    "tools",
                )
            })?;
        }
        Ok(Some(Constraint::Lark(hermes_grammar(&tools, self.parallel))))
    }
}

/// The Lark grammar of Hermes-format calls to `tools`: one call, or with `parallel` one or more
/// separated by a newline (as Qwen's template writes them).
fn hermes_grammar(tools: &[&Tool], parallel: bool) -> String {
    let lit = |s: &str| serde_json::to_string(s).expect("strings serialize");
    let mut g = String::new();
    g.push_str(if parallel { "start: call (\"\\n\" call)*\n" } else { "start: call\n" });
    let fns: Vec<String> = (0..tools.len()).map(|i| format!("fn{i}")).collect();
    g.push_str(&format!(
        "call: {} ({}) {}\n",
        lit("<tool_call>\n{\"name\": "),
        fns.join(" | "),
        lit("}\n</tool_call>")
    ));
    for (i, t) in tools.iter().enumerate() {
        let head = format!("{}, \"arguments\": ", lit(&t.name));
        g.push_str(&format!("fn{i}: {} %json {}\n", lit(&head), compact(t.parameters.clone())));
    }
    g
}

/// A piece of a chat answer as tool calls are read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// Text of the message's `content`.
    Content(String),
    /// Call `index` starts: its id and function name.
    Call { index: usize, id: String, name: String },
    /// More of call `index`'s arguments (a JSON string's next characters).
    Args { index: usize, text: String },
}

/// A call's id: `call_` and 24 random hex digits.
fn call_id() -> String {
    format!("call_{:016x}{:08x}", random_seed(), random_seed() as u32)
}

/// Reads tool calls out of a completion's text as it streams (see the [module docs](self)).
pub struct ToolStream {
    format: ToolFormat,
    parallel: bool,
    /// Text not yet decided (outside a call: a possible opening tag or trailing whitespace;
    /// inside: a possible closing tag).
    buf: String,
    /// The current call, while inside one.
    call: Option<CallState>,
    /// Calls started.
    calls: usize,
    /// Whitespace right after a call is not content.
    after_call: bool,
}

/// The call being read.
struct CallState {
    /// The whitespace before its opening tag (content again if the block is no call).
    space: String,
    body: String,
    /// Its index among the calls, once its `Call` delta went out.
    started: Option<usize>,
    /// Ignored: a second call where only one is allowed.
    skip: bool,
    /// Where the arguments' streaming stands in `body`.
    args: ArgScan,
}

/// A JSON value scanned character by character (Hermes arguments).
#[derive(Default)]
struct ArgScan {
    pos: usize,
    depth: usize,
    begun: bool,
    in_str: bool,
    esc: bool,
    done: bool,
    /// The value is no object or list: sent whole at the end.
    whole: bool,
}

impl ToolStream {
    pub fn new(format: ToolFormat, parallel: bool) -> Self {
        Self { format, parallel, buf: String::new(), call: None, calls: 0, after_call: false }
    }

    /// Adds a piece of text; returns what it decides.
    pub fn push(&mut self, piece: &str) -> Vec<Delta> {
        self.buf.push_str(piece);
        let mut out = Vec::new();
        let (open, close) = self.format.tags();
        loop {
            if self.call.is_none() {
                if self.after_call {
                    let ws = self.buf.len() - self.buf.trim_start().len();
                    self.buf.drain(..ws);
                    if self.buf.is_empty() {
                        break;
                    }
                    self.after_call = false;
                }
                if let Some(i) = self.buf.find(open) {
                    let before = self.buf[..i].trim_end().len();
                    push_content(&mut out, &self.buf[..before]);
                    let space = self.buf[before..i].to_string();
                    self.buf.drain(..i + open.len());
                    let skip = !self.parallel && self.calls > 0;
                    let args = ArgScan::default();
                    self.call = Some(CallState { space, body: String::new(), started: None, skip, args });
                    continue;
                }
                // Held back: a possible opening tag and the whitespace before it.
                let tag = held(&self.buf, open);
                let end = self.buf[..self.buf.len() - tag].trim_end().len();
                push_content(&mut out, &self.buf[..end]);
                self.buf.drain(..end);
                break;
            }
            let found = self.buf.find(close);
            let end = found.unwrap_or(self.buf.len() - held(&self.buf, close));
            let mut call = self.call.take().expect("inside a call");
            call.body.push_str(&self.buf[..end]);
            self.buf.drain(..end);
            if found.is_some() {
                self.buf.drain(..close.len());
                self.after_call = self.end_call(call, &mut out, true);
                continue;
            }
            self.stream_call(&mut call, &mut out);
            self.call = Some(call);
            break;
        }
        out
    }

    /// The end of the completion: what is still held back (an unclosed call is read as it is).
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        if let Some(mut call) = self.call.take() {
            call.body.push_str(&std::mem::take(&mut self.buf));
            self.end_call(call, &mut out, false);
        }
        let rest = std::mem::take(&mut self.buf);
        push_content(&mut out, if self.calls > 0 { rest.trim_end() } else { &rest });
        out
    }

    /// Sends what is known of the call being read.
    fn stream_call(&mut self, call: &mut CallState, out: &mut Vec<Delta>) {
        if call.skip {
            return;
        }
        if call.started.is_none() {
            let Some((name, at)) = call_head(self.format, &call.body) else { return };
            call.started = Some(self.start(name, out));
            call.args.pos = at;
        }
        if self.format == ToolFormat::Hermes {
            let index = call.started.expect("started");
            let text = call.args.scan(&call.body);
            if !text.is_empty() {
                out.push(Delta::Args { index, text });
            }
        }
    }

    fn start(&mut self, name: String, out: &mut Vec<Delta>) -> usize {
        let index = self.calls;
        self.calls += 1;
        out.push(Delta::Call { index, id: call_id(), name });
        index
    }

    /// The call's body is all there (`closed`: its closing tag came); false where the block
    /// was no call (it went out as content).
    fn end_call(&mut self, mut call: CallState, out: &mut Vec<Delta>, closed: bool) -> bool {
        if call.skip {
            return true;
        }
        self.stream_call(&mut call, out);
        let parsed = match self.format {
            ToolFormat::Hermes => hermes_call(&call.body),
            ToolFormat::Gemma4 => gemma_call(&call.body),
        };
        match (call.started, parsed) {
            (Some(index), Some((_, args))) if self.format == ToolFormat::Gemma4 || call.args.whole => {
                out.push(Delta::Args { index, text: args });
            }
            (Some(_), _) => {}
            (None, Some((name, args))) => {
                let index = self.start(name, out);
                out.push(Delta::Args { index, text: args });
            }
            // A call cut short (max_tokens) after others: dropped, never content.
            (None, None) if !closed && self.calls > 0 => {}
            (None, None) => {
                let (open, close) = self.format.tags();
                let close = if closed { close } else { "" };
                push_content(out, &format!("{}{open}{}{close}", call.space, call.body));
                return false;
            }
        }
        true
    }
}

fn push_content(out: &mut Vec<Delta>, text: &str) {
    if text.is_empty() {
        return;
    }
    match out.last_mut() {
        Some(Delta::Content(c)) => c.push_str(text),
        _ => out.push(Delta::Content(text.to_string())),
    }
}

/// The function name at the start of a call's body and where its arguments begin, once the
/// body has got that far.
fn call_head(format: ToolFormat, body: &str) -> Option<(String, usize)> {
    match format {
        ToolFormat::Hermes => {
            // {"name": "f", "arguments": ...
            let mut p = Cursor { s: body, i: 0 };
            p.token("{")?;
            p.token("\"name\"")?;
            p.token(":")?;
            let name = p.string()?;
            p.token(",")?;
            if p.token("\"arguments\"").is_none() {
                p.token("\"parameters\"")?;
            }
            p.token(":")?;
            p.ws();
            Some((name, p.i))
        }
        ToolFormat::Gemma4 => {
            let rest = body.trim_start();
            let skipped = body.len() - rest.len();
            let rest = rest.strip_prefix("call:")?;
            let n = rest.find('{')?;
            let name = &rest[..n];
            valid_name(name).then(|| (name.to_string(), skipped + 5 + n))
        }
    }
}

/// A little reader over a call's text.
struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

impl Cursor<'_> {
    fn ws(&mut self) {
        let rest = &self.s[self.i..];
        self.i += rest.len() - rest.trim_start().len();
    }

    fn token(&mut self, t: &str) -> Option<()> {
        self.ws();
        self.s[self.i..].starts_with(t).then(|| self.i += t.len())
    }

    /// A whole JSON string.
    fn string(&mut self) -> Option<String> {
        self.ws();
        let rest = &self.s[self.i..];
        if !rest.starts_with('"') {
            return None;
        }
        let mut esc = false;
        for (k, c) in rest.char_indices().skip(1) {
            match (esc, c) {
                (true, _) => esc = false,
                (false, '\\') => esc = true,
                (false, '"') => {
                    let s = serde_json::from_str(&rest[..=k]).ok()?;
                    self.i += k + 1;
                    return Some(s);
                }
                _ => {}
            }
        }
        None
    }
}

impl ArgScan {
    /// The characters of the value in `body` past `pos`, up to its end.
    fn scan(&mut self, body: &str) -> String {
        let mut out = String::new();
        if self.done || self.whole {
            return out;
        }
        for (k, c) in body[self.pos..].char_indices() {
            if !self.begun {
                if c.is_whitespace() {
                    continue;
                }
                if c != '{' && c != '[' {
                    self.whole = true;
                    self.pos += k;
                    return out;
                }
                self.begun = true;
            }
            out.push(c);
            match (self.in_str, self.esc, c) {
                (true, true, _) => self.esc = false,
                (true, false, '\\') => self.esc = true,
                (true, false, '"') => self.in_str = false,
                (false, _, '"') => self.in_str = true,
                (false, _, '{' | '[') => self.depth += 1,
                (false, _, '}' | ']') => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.done = true;
                        self.pos += k + c.len_utf8();
                        return out;
                    }
                }
                _ => {}
            }
        }
        self.pos = body.len();
        out
    }
}

/// A whole Hermes call: its name and its arguments as a JSON string.
fn hermes_call(body: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some((name, args))
}

/// A whole Gemma 4 call (`call:name{...}`): its name and its arguments as a JSON string.
fn gemma_call(body: &str) -> Option<(String, String)> {
    let (name, at) = call_head(ToolFormat::Gemma4, body)?;
    let mut p = GemmaReader { s: &body[at..] };
    let args = p.value()?;
    p.s.trim().is_empty().then(|| (name, args.to_string()))
}

/// Gemma 4's argument syntax: `{key:value,...}`, `[v,...]`, strings between `<|"|>`, numbers,
/// `true`/`false`/`null`; a bare word is read as a string.
struct GemmaReader<'a> {
    s: &'a str,
}

impl GemmaReader<'_> {
    fn eat(&mut self, t: &str) -> bool {
        self.s = self.s.trim_start();
        match self.s.strip_prefix(t) {
            Some(rest) => {
                self.s = rest;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        if self.eat("{") {
            let mut m = Map::new();
            if self.eat("}") {
                return Some(Value::Object(m));
            }
            loop {
                let colon = self.s.find(':')?;
                let key = self.s[..colon].trim();
                let key = key.strip_prefix(GEMMA_QUOTE).and_then(|k| k.strip_suffix(GEMMA_QUOTE)).unwrap_or(key);
                let key = key.to_string();
                self.s = &self.s[colon + 1..];
                let v = self.value()?;
                m.insert(key, v);
                if self.eat("}") {
                    return Some(Value::Object(m));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut a = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(a));
            }
            loop {
                a.push(self.value()?);
                if self.eat("]") {
                    return Some(Value::Array(a));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat(GEMMA_QUOTE) {
            let end = self.s.find(GEMMA_QUOTE)?;
            let text = self.s[..end].to_string();
            self.s = &self.s[end + GEMMA_QUOTE.len()..];
            return Some(Value::String(text));
        }
        let end = self.s.find([',', '}', ']']).unwrap_or(self.s.len());
        let word = self.s[..end].trim();
        self.s = &self.s[end..];
        if word.is_empty() {
            return None;
        }
        Some(serde_json::from_str::<Value>(word).ok().filter(|v| !v.is_string()).unwrap_or_else(|| word.into()))
    }
}

/// A whole answer's content and calls, read by a [`ToolStream`] fed all of `text` at once.
pub fn parse(format: ToolFormat, parallel: bool, text: &str) -> (String, Vec<ToolCall>) {
    let mut s = ToolStream::new(format, parallel);
    let mut deltas = s.push(text);
    deltas.extend(s.finish());
    collect(deltas)
}

/// One call of an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

impl ToolCall {
    /// As OpenAI's `message.tool_calls[i]`.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}})
    }
}

/// Deltas summed up: the content and the calls.
pub fn collect(deltas: impl IntoIterator<Item = Delta>) -> (String, Vec<ToolCall>) {
    let (mut content, mut calls) = (String::new(), Vec::<ToolCall>::new());
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(&t),
            Delta::Call { id, name, .. } => calls.push(ToolCall { id, name, arguments: String::new() }),
            Delta::Args { index, text } => calls[index].arguments.push_str(&text),
        }
    }
    (content, calls)
}

/// A streamed chunk's `delta.tool_calls` entry for `d` (`None` for content).
pub fn delta_json(d: &Delta) -> Option<Value> {
    match d {
        Delta::Content(_) => None,
        Delta::Call { index, id, name } => {
            Some(json!({"index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}))
        }
        Delta::Args { index, text } => Some(json!({"index": index, "function": {"arguments": text}})),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN: &str = include_str!("../../tests/fixtures/templates/qwen2.5_tools.jinja");
    const HERMES: ToolSupport = ToolSupport { format: ToolFormat::Hermes, native: true };

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}])
    }

    fn fields(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// Feeds `text` in pieces of `step` characters; the deltas.
    fn streamed(format: ToolFormat, text: &str, step: usize) -> Vec<Delta> {
        let mut s = ToolStream::new(format, true);
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for piece in chars.chunks(step) {
            out.extend(s.push(&piece.iter().collect::<String>()));
        }
        out.extend(s.finish());
        out
    }

    fn names_args(calls: &[ToolCall]) -> Vec<(String, Value)> {
        calls.iter().map(|c| (c.name.clone(), serde_json::from_str(&c.arguments).unwrap())).collect()
    }

    #[test]
    fn formats_are_told_from_the_template() {
        assert_eq!(ToolSupport::detect(QWEN), HERMES);
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
        assert_eq!(ToolSupport::detect(chatml), ToolSupport { format: ToolFormat::Hermes, native: false });
        let gemma4 = "{% if tools %}<|tool>declaration:...{% endif %}{{ '<|tool_call>call:' }}";
        assert_eq!(ToolSupport::detect(gemma4), ToolSupport { format: ToolFormat::Gemma4, native: true });
    }

    #[test]
    fn hermes_calls_are_read() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"CET\", \"fmt\": [\"h\", {\"x\": \"}\"}]}}\n</tool_call>";
        let (content, calls) = parse(ToolFormat::Hermes, true, text);
        assert_eq!(content, "Let me look.");
        assert_eq!(
            names_args(&calls),
            [
                ("get_weather".to_string(), json!({"city": "Paris"})),
                ("get_time".to_string(), json!({"zone": "CET", "fmt": ["h", {"x": "}"}]})),
            ]
        );
        assert!(calls.iter().all(|c| c.id.starts_with("call_") && c.id.len() == 29), "{calls:?}");
        assert_ne!(calls[0].id, calls[1].id);
        // One call only where parallel calls are off.
        let mut s = ToolStream::new(ToolFormat::Hermes, false);
        let mut d = s.push(text);
        d.extend(s.finish());
        assert_eq!(names_args(&collect(d).1), [("get_weather".to_string(), json!({"city": "Paris"}))]);
        // Plain text is all content, whitespace and all.
        assert_eq!(parse(ToolFormat::Hermes, true, "  No tools <here>.\n"), ("  No tools <here>.\n".into(), vec![]));
        // Arguments as a JSON string, "parameters" for "arguments", keys in another order.
        for body in [
            r#"{"name": "f", "arguments": "{\"a\": 1}"}"#,
            r#"{"name": "f", "parameters": {"a": 1}}"#,
            r#"{"arguments": {"a": 1}, "name": "f"}"#,
        ] {
            let (content, calls) = parse(ToolFormat::Hermes, true, &format!("<tool_call>\n{body}\n</tool_call>"));
            assert_eq!(
                (content.as_str(), names_args(&calls)),
                ("", vec![("f".to_string(), json!({"a": 1}))]),
                "{body}"
            );
        }
    }

    #[test]
    fn a_block_that_is_no_call_stays_content() {
        let text = "a <tool_call>\nnot json\n</tool_call> b";
        assert_eq!(parse(ToolFormat::Hermes, true, text), (text.to_string(), vec![]));
        // Cut short (max_tokens): an unclosed call that parses is a call, one that does not is text.
        let (_, calls) = parse(ToolFormat::Hermes, true, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}");
        assert_eq!(names_args(&calls), [("f".to_string(), json!({}))]);
        let cut = "<tool_call>\n{\"nam";
        assert_eq!(parse(ToolFormat::Hermes, true, cut), (cut.to_string(), vec![]));
        // After a call, a second one cut short is dropped.
        let (content, calls) = parse(
            ToolFormat::Hermes,
            true,
            &format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {{}}}}\n</tool_call>\n{cut}"),
        );
        assert_eq!((content.as_str(), calls.len()), ("", 1));
    }

    #[test]
    fn streamed_pieces_give_the_whole_answer_and_no_partial_tag() {
        let text = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rio \\\"de\\\" J\", \"n\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>\n";
        let whole = parse(ToolFormat::Hermes, true, text);
        for step in [1, 2, 3, 5, 7, 1000] {
            let deltas = streamed(ToolFormat::Hermes, text, step);
            for d in &deltas {
                if let Delta::Content(c) = d {
                    assert!(!c.contains('<'), "step {step}: a tag leaked as content: {c:?}");
                }
            }
            // The name comes before any argument, each call's arguments in order.
            let first_args = deltas.iter().position(|d| matches!(d, Delta::Args { index: 0, .. })).unwrap();
            let first_call = deltas.iter().position(|d| matches!(d, Delta::Call { index: 0, .. })).unwrap();
            assert!(first_call < first_args, "step {step}");
            let (content, calls) = collect(deltas);
            assert_eq!(content, whole.0, "step {step}");
            assert_eq!(names_args(&calls), names_args(&whole.1), "step {step}");
        }
        // Character by character, the arguments come in many fragments.
        let args = streamed(ToolFormat::Hermes, text, 1).iter().filter(|d| matches!(d, Delta::Args { .. })).count();
        assert!(args > 10, "{args}");
        // A tag's start that turns out to be text is released.
        assert_eq!(collect(streamed(ToolFormat::Hermes, "x <tool_c!", 1)).0, "x <tool_c!");
    }

    #[test]
    fn gemma4_calls_are_read() {
        let text = "<|tool_call>call:get_weather{location:<|\"|>London, UK<|\"|>,days:3,hourly:false,tags:[<|\"|>a<|\"|>,2.5],opts:{unit:<|\"|>c<|\"|>}}<tool_call|><|tool_call>call:noop{}<tool_call|>";
        for step in [1, 4, 1000] {
            let (content, calls) = collect(streamed(ToolFormat::Gemma4, text, step));
            assert_eq!(content, "", "step {step}");
            assert_eq!(
                names_args(&calls),
                [
                    (
                        "get_weather".to_string(),
                        json!({"location": "London, UK", "days": 3, "hourly": false, "tags": ["a", 2.5],
                               "opts": {"unit": "c"}})
                    ),
                    ("noop".to_string(), json!({})),
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn tool_requests_are_checked() {
        let ok = |v: Value| plan(&fields(v), HERMES);
        let p = ok(json!({"tools": weather()})).unwrap().unwrap();
        assert_eq!((p.choice.clone(), p.parallel, p.tools[0].name.as_str()), (Choice::Auto, true, "get_weather"));
        let p =
            ok(json!({"tools": weather(), "tool_choice": "required", "parallel_tool_calls": false})).unwrap().unwrap();
        assert_eq!((p.choice, p.parallel), (Choice::Required, false));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            ok(json!({"tools": weather(), "tool_choice": named})).unwrap().unwrap().choice,
            Choice::Named("get_weather".into())
        );
        // "none", or no tools: nothing offered.
        assert!(ok(json!({"tools": weather(), "tool_choice": "none"})).unwrap().is_none());
        assert!(ok(json!({"tools": [], "tool_choice": "auto"})).unwrap().is_none());
        assert!(ok(json!({})).unwrap().is_none());
        let tool = |f: Value| json!([{"type": "function", "function": f}]);
        for (v, param, says) in [
            (
                json!({"tools": weather(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
                "'nope'",
            ),
            (json!({"tool_choice": "required"}), "tool_choice", "no tools"),
            (json!({"tools": weather(), "tool_choice": "any"}), "tool_choice", "'any'"),
            (json!({"tools": weather(), "tool_choice": {"name": "get_weather"}}), "tool_choice", "must be"),
            (json!({"tools": tool(json!({"name": "a b"}))}), "tools", "'a b'"),
            (json!({"tools": tool(json!({"name": "f", "parameters": [1]}))}), "tools", "parameters"),
            (
                json!({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}),
                "tools",
                "twice",
            ),
            (json!({"tools": [{"type": "retrieval"}]}), "tools", "type"),
            (json!({"tools": {"a": 1}}), "tools", "list"),
            (json!({"tools": weather(), "response_format": {"type": "json_object"}}), "response_format", "together"),
            (json!({"tools": weather(), "parallel_tool_calls": "yes"}), "parallel_tool_calls", "true or false"),
        ] {
            let e = ok(v.clone()).unwrap_err();
            assert_eq!((e.status, e.param), (400, Some(param)), "{v}");
            assert!(e.message.contains(says), "{v}: {}", e.message);
        }
        // Gemma 4's native format: a grammar of its own syntax, or a 400 naming the tool whose
        // schema it has no rule for.
        let gemma = ToolSupport { format: ToolFormat::Gemma4, native: true };
        let p = plan(&fields(json!({"tools": weather(), "tool_choice": "required"})), gemma).unwrap().unwrap();
        assert!(matches!(p.constraint(Err(&"unused".to_string())), Ok(Some(Constraint::Lark(_)))));
        let any_of = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"x": {"anyOf": [{"type": "string"}, {"type": "integer"}]}}}}}]);
        let p = plan(&fields(json!({"tools": any_of, "tool_choice": "required"})), gemma).unwrap().unwrap();
        let e = p.constraint(Err(&"unused".to_string())).unwrap_err();
        assert_eq!(e.param, Some("tools"));
        // Completions take no tools.
        assert!(refuse_on_completions(&fields(json!({"tools": [], "tool_choice": "none"}))).is_ok());
        assert_eq!(refuse_on_completions(&fields(json!({"tools": weather()}))).unwrap_err().param, Some("tools"));
    }

    #[test]
    fn forced_calls_get_a_grammar_of_the_format() {
        let p = plan(&fields(json!({"tools": weather(), "tool_choice": "required"})), HERMES).unwrap().unwrap();
        let tools: Vec<&Tool> = p.tools.iter().collect();
        let g = hermes_grammar(&tools, true);
        assert!(g.starts_with("start: call (\"\\n\" call)*\n"), "{g}");
        assert!(g.contains(r#"call: "<tool_call>\n{\"name\": " (fn0) "}\n</tool_call>""#), "{g}");
        assert!(g.contains(r#"fn0: "\"get_weather\", \"arguments\": " %json {"#), "{g}");
        assert!(hermes_grammar(&tools, false).starts_with("start: call\n"));
    }

    /// The conversation as OpenAI's clients send it (arguments as a JSON string), rendered by
    /// Qwen2.5's template: what transformers 5.24's `apply_chat_template` renders for the same
    /// conversation with the arguments as a dict.
    #[test]
    fn qwen_template_renders_tools_calls_and_results() {
        let msgs: Vec<ChatMessage> = serde_json::from_value(json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"c\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "sunny"},
        ]))
        .unwrap();
        let p = plan(&fields(json!({"tools": weather()})), HERMES).unwrap().unwrap();
        let (m, defs) = messages(&msgs, Some(&p), HERMES).unwrap();
        let t = crate::chat::ChatTemplate::new(QWEN, None, None).unwrap();
        let got = t.render_with_tools(&m, true, defs.as_ref()).unwrap();
        let want = "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"The weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"c\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\nsunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(got, want);
        // The fallback for a template without tools writes the same instructions and blocks.
        let chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let plain = ToolSupport { format: ToolFormat::Hermes, native: false };
        let (m, defs) = messages(&msgs, Some(&p), plain).unwrap();
        assert!(defs.is_none());
        let got = crate::chat::ChatTemplate::new(chatml, None, None).unwrap().render(&m, true).unwrap();
        assert_eq!(got, want, "the fallback renders what Qwen's template renders");
    }
}
