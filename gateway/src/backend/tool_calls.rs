//! Tool calls on the engine: how a request's `tools` and `tool_choice` become a prompt
//! instruction and an output grammar ([`ToolPlan`]), and how the model's output becomes
//! OpenAI `tool_calls` as it streams ([`CallStream`]).
//!
//! The model answers a call as one JSON object,
//! `{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}` — the
//! shape a template without tool support already shows past calls in (see the engine's
//! `template::adapt`) — and constrained decoding makes that the only way it can: each
//! call's `name` is one of the offered tools and its `arguments` valid under that tool's
//! `parameters` schema, in the grammar's fixed spacing. `tool_choice` picks the grammar:
//! `auto` allows that object or plain text not starting with `{` (or, with a
//! `response_format`, that format), `required` a call, a named function exactly one call
//! of it; `parallel_tool_calls: false` allows one call. `none` leaves the request alone.
//!
//! [`CallStream`] holds text back only while it may still be the start of a call object,
//! then passes text through as content, or sends each call's id and name as soon as the
//! name is complete and its arguments as they are generated: the deltas OpenAI streams.

use engine::json_schema_with_layout;
use serde_json::{json, Map, Value};

use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::api::ToolChoice;

/// The text a call answer starts with.
const CALLS_PREFIX: &str = "{\"tool_calls\": [";

/// What a request with tools asks of the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    /// Told to the model in the system turn: the tools and how to call them.
    pub instruction: String,
    /// The output grammar (llguidance's Lark dialect, JSON Schemas embedded).
    pub grammar: String,
}

impl ToolPlan {
    /// The plan for `tools` under `choice`; `None` when no call may be made.
    /// `answer_schema`: the `response_format` schema a plain answer must follow, if any;
    /// `has_results`: the conversation already holds tool results.
    pub fn new(
        tools: &Value,
        choice: &ToolChoice,
        parallel: bool,
        answer_schema: Option<&Value>,
        has_results: bool,
    ) -> Option<ToolPlan> {
        let offered: Vec<&Value> = tools
            .as_array()?
            .iter()
            .filter_map(|t| t.get("function"))
            .filter(|f| match choice {
                ToolChoice::Function(name) => f.get("name").and_then(Value::as_str) == Some(name),
                _ => true,
            })
            .collect();
        if offered.is_empty() || *choice == ToolChoice::None {
            return None;
        }
        let single = !parallel || matches!(choice, ToolChoice::Function(_));
        let calls = calls_schema(&offered, single);
        let grammar = match (choice, answer_schema) {
            (ToolChoice::Auto, None) => format!("start: calls | TEXT\nTEXT: /[^{{](.|\\n)*/\ncalls: %json {calls}\n"),
            (ToolChoice::Auto, Some(schema)) => {
                format!(
                    "start: calls | answer\ncalls: %json {calls}\nanswer: %json {}\n",
                    json_schema_with_layout(schema)
                )
            }
            _ => format!("start: calls\ncalls: %json {calls}\n"),
        };
        Some(ToolPlan { instruction: instruction(&offered, choice, single, has_results), grammar })
    }
}

/// `{"tool_calls": [call, ...]}`, each call `{"name": <a tool>, "arguments": <its schema>}`.
fn calls_schema(offered: &[&Value], single: bool) -> Value {
    let one_of: Vec<Value> = offered
        .iter()
        .map(|f| {
            let parameters = f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {"name": {"const": f.get("name").cloned().unwrap_or(Value::Null)}, "arguments": parameters},
                "required": ["name", "arguments"],
                "additionalProperties": false
            })
        })
        .collect();
    let mut list = json!({"type": "array", "minItems": 1, "items": {"anyOf": one_of}});
    if single {
        list["maxItems"] = json!(1);
    }
    // In the engine's fixed spacing, which is what [`CallStream`] reads.
    json_schema_with_layout(
        &json!({"type": "object", "properties": {"tool_calls": list}, "required": ["tool_calls"], "additionalProperties": false}),
    )
}

fn instruction(offered: &[&Value], choice: &ToolChoice, single: bool, has_results: bool) -> String {
    let listed: Vec<Value> = offered
        .iter()
        .map(|f| {
            let mut entry = Map::new();
            for key in ["name", "description", "parameters"] {
                if let Some(v) = f.get(key) {
                    entry.insert(key.into(), v.clone());
                }
            }
            Value::Object(entry)
        })
        .collect();
    let how = r#"To call a tool, answer with only this JSON: {"tool_calls": [{"name": "<tool name>", "arguments": {<the tool's arguments>}}]}"#;
    let when = match choice {
        // Small models imitate the call before a result rather than use the result.
        ToolChoice::Auto if has_results => {
            "The tool results are in the conversation: when they answer the question, answer the user in plain text without calling a tool again."
        }
        ToolChoice::Auto => "Call a tool when it helps answer; otherwise answer the user directly.",
        ToolChoice::Function(_) => "You must call this tool now.",
        _ => "You must call a tool now.",
    };
    let count = if single { " Call one tool at a time." } else { "" };
    format!("You can call these tools:\n{}\n{how}\n{when}{count}", Value::Array(listed))
}

/// What one piece of model output became.
#[derive(Debug, Default, PartialEq)]
pub struct CallOutput {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCallChunk>,
}

/// Where [`CallStream`] stands in the output.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// The output so far is a prefix of [`CALLS_PREFIX`]: held back.
    Undecided,
    /// Plain text: passed through.
    Text,
    /// A call answer: calls are read out of it.
    Calls,
}

/// Reads one choice's output as it streams (see the module docs).
#[derive(Debug)]
pub struct CallStream {
    mode: Mode,
    /// Output not yet read (in `Calls` mode) or not yet released (`Undecided`).
    pending: String,
    /// Calls started so far.
    calls: u32,
    /// Inside a call's arguments: JSON nesting depth, in a string, after a backslash.
    arguments: Option<(u32, bool, bool)>,
    make_id: fn() -> String,
}

impl CallStream {
    pub fn new() -> CallStream {
        CallStream::with_ids(|| format!("call_{}", uuid::Uuid::new_v4().simple()))
    }

    fn with_ids(make_id: fn() -> String) -> CallStream {
        CallStream { mode: Mode::Undecided, pending: String::new(), calls: 0, arguments: None, make_id }
    }

    /// Whether any call was made (the choice then finishes with `tool_calls`).
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    /// Reads `text`, the next piece of output.
    pub fn push(&mut self, text: &str) -> CallOutput {
        match self.mode {
            Mode::Text => {
                CallOutput { content: Some(text.to_owned()).filter(|t| !t.is_empty()), ..CallOutput::default() }
            }
            Mode::Undecided => {
                self.pending.push_str(text);
                if self.pending.starts_with(CALLS_PREFIX) {
                    self.mode = Mode::Calls;
                    self.read_calls()
                } else if CALLS_PREFIX.starts_with(self.pending.as_str()) {
                    CallOutput::default()
                } else {
                    self.mode = Mode::Text;
                    CallOutput {
                        content: Some(std::mem::take(&mut self.pending)).filter(|t| !t.is_empty()),
                        ..CallOutput::default()
                    }
                }
            }
            Mode::Calls => {
                self.pending.push_str(text);
                self.read_calls()
            }
        }
    }

    /// The output ended: text still held back is content after all.
    pub fn finish(&mut self) -> CallOutput {
        match self.mode {
            Mode::Undecided if !self.pending.is_empty() => {
                self.mode = Mode::Text;
                CallOutput { content: Some(std::mem::take(&mut self.pending)), ..CallOutput::default() }
            }
            _ => CallOutput::default(),
        }
    }

    /// Reads what `pending` holds of calls: a call's header once its name is complete,
    /// its arguments as far as they go.
    fn read_calls(&mut self) -> CallOutput {
        let mut out = CallOutput::default();
        loop {
            if let Some(state) = self.arguments {
                let (taken, done) = scan_value(&self.pending, state, &mut self.arguments);
                if taken > 0 {
                    let text: String = self.pending.drain(..taken).collect();
                    push_arguments(&mut out, self.calls - 1, text);
                }
                if !done {
                    return out;
                }
                self.arguments = None;
                continue;
            }
            // A call's header: `{"name": "<name>", "arguments": ` (names need no escapes).
            let Some(start) = self.pending.find("{\"name\": \"") else { return out };
            let name_at = start + "{\"name\": \"".len();
            let Some(name_len) = self.pending[name_at..].find('"') else { return out };
            let name = self.pending[name_at..name_at + name_len].to_owned();
            let rest = &self.pending[name_at + name_len..];
            const BETWEEN: &str = "\", \"arguments\": ";
            if rest.len() < BETWEEN.len() {
                return out;
            }
            let header_end = name_at + name_len + BETWEEN.len();
            self.pending.drain(..header_end);
            out.tool_calls.push(ToolCallChunk {
                index: self.calls,
                id: Some((self.make_id)()),
                kind: Some("function".into()),
                function: FunctionChunk { name: Some(name), arguments: Some(String::new()) },
            });
            self.calls += 1;
            self.arguments = Some((0, false, false));
        }
    }
}

impl Default for CallStream {
    fn default() -> Self {
        CallStream::new()
    }
}

/// Adds an arguments fragment for call `index`, merged into this output's last chunk
/// when that one is for the same call.
fn push_arguments(out: &mut CallOutput, index: u32, text: String) {
    if let Some(last) = out.tool_calls.last_mut().filter(|c| c.index == index) {
        last.function.arguments.get_or_insert_with(String::new).push_str(&text);
        return;
    }
    out.tool_calls.push(ToolCallChunk {
        index,
        id: None,
        kind: None,
        function: FunctionChunk { name: None, arguments: Some(text) },
    });
}

/// How many bytes of `text` belong to the JSON value being read from `state` (depth, in a
/// string, after a backslash), and whether the value ended there; `state` is updated.
fn scan_value(text: &str, state: (u32, bool, bool), slot: &mut Option<(u32, bool, bool)>) -> (usize, bool) {
    let (mut depth, mut in_string, mut escaped) = state;
    for (i, b) in text.bytes().enumerate() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            // Outside any container: the end of the call object, or a separator, ends a
            // scalar value (a tool whose `parameters` is not an object schema).
            b'}' | b']' | b',' if depth == 0 => {
                *slot = Some((0, false, false));
                return (i, true);
            }
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    *slot = Some((0, false, false));
                    return (i + 1, true);
                }
            }
            _ => {}
        }
    }
    *slot = Some((depth, in_string, escaped));
    (text.len(), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Value {
        json!([
            {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
        ])
    }

    fn fixed_id() -> String {
        "call_x".into()
    }

    /// Feeds `pieces` and gathers content and each call's (id, name, arguments).
    fn read(pieces: &[&str]) -> (String, Vec<(Option<String>, String, String)>) {
        let mut stream = CallStream::with_ids(fixed_id);
        let (mut content, mut calls): (String, Vec<(Option<String>, String, String)>) = (String::new(), Vec::new());
        let mut outputs: Vec<CallOutput> = pieces.iter().map(|p| stream.push(p)).collect();
        outputs.push(stream.finish());
        for out in outputs {
            content.push_str(out.content.as_deref().unwrap_or(""));
            for chunk in out.tool_calls {
                let i = chunk.index as usize;
                if calls.len() <= i {
                    calls.push((chunk.id.clone(), chunk.function.name.clone().unwrap_or_default(), String::new()));
                }
                calls[i].2.push_str(chunk.function.arguments.as_deref().unwrap_or(""));
            }
        }
        (content, calls)
    }

    #[test]
    fn calls_stream_out_of_the_answer_in_any_split() {
        let answer = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris \"}{ \\"}}, {"name": "get_time", "arguments": {}}]}"#;
        for split in [1, 2, 3, 7, answer.len()] {
            let pieces: Vec<String> =
                answer.as_bytes().chunks(split).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (content, calls) = read(&refs);
            assert_eq!(content, "", "split {split}");
            assert_eq!(
                calls,
                [
                    (Some("call_x".into()), "get_weather".into(), r#"{"city": "Paris \"}{ \\"}"#.into()),
                    (Some("call_x".into()), "get_time".into(), "{}".into())
                ],
                "split {split}"
            );
        }
    }

    #[test]
    fn scalar_arguments_end_where_the_call_object_does() {
        let answer = r#"{"tool_calls": [{"name": "echo", "arguments": "a}b"}, {"name": "count", "arguments": 3}]}"#;
        let (content, calls) = read(&[answer]);
        assert_eq!(content, "");
        assert_eq!(
            calls,
            [
                (Some("call_x".into()), "echo".into(), r#""a}b""#.into()),
                (Some("call_x".into()), "count".into(), "3".into())
            ]
        );
    }

    #[test]
    fn text_passes_through_and_a_prefix_that_never_became_a_call_is_released() {
        assert_eq!(read(&["The weather", " is fine."]), ("The weather is fine.".into(), vec![]));
        assert_eq!(read(&["{\"tool", "s\": 1}"]), ("{\"tools\": 1}".into(), vec![]));
        assert_eq!(read(&["{\"tool_"]), ("{\"tool_".into(), vec![]));
    }

    #[test]
    fn plans_follow_tool_choice() {
        assert!(ToolPlan::new(&tools(), &ToolChoice::None, true, None, false).is_none());
        let auto = ToolPlan::new(&tools(), &ToolChoice::Auto, true, None, false).unwrap();
        assert!(auto.grammar.starts_with("start: calls | TEXT"), "{}", auto.grammar);
        assert!(auto.instruction.contains("get_weather") && auto.instruction.contains("get_time"));
        let named = ToolPlan::new(&tools(), &ToolChoice::Function("get_time".into()), true, None, false).unwrap();
        assert!(
            named.grammar.starts_with("start: calls\n") && !named.grammar.contains("get_weather"),
            "{}",
            named.grammar
        );
        assert!(named.grammar.contains("\"maxItems\":1"), "{}", named.grammar);
        let required = ToolPlan::new(&tools(), &ToolChoice::Required, true, None, false).unwrap();
        assert!(!required.grammar.contains("maxItems"), "{}", required.grammar);
        let answer = json!({"type": "object"});
        let with_format = ToolPlan::new(&tools(), &ToolChoice::Auto, false, Some(&answer), true).unwrap();
        assert!(with_format.grammar.contains("answer: %json"), "{}", with_format.grammar);
    }
}
