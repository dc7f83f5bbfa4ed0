//! `POST /v1/chat/completions` request: parsed from the raw JSON object, validated field by
//! field with OpenAI's ranges, every error naming its `param`. The original object is kept
//! whole (`raw`) so an upstream receives every field — known or not — untouched.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Roles OpenAI accepts in `messages`.
const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "function"];

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum ResponseFormat {
    /// Free text (`{"type": "text"}`, or no `response_format`).
    #[default]
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON valid under `schema` (`None`: the client gave a name but no schema, so any
    /// JSON value). `strict` is recorded as sent: the engine enforces the schema either way.
    JsonSchema { name: String, schema: Option<Value>, strict: bool },
    /// A type this gateway does not know: passed to an upstream untouched (it may know
    /// it), refused by the engine.
    Other(String),
}

/// OpenAI's `tool_choice`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// No tool calls.
    None,
    /// The model decides (the default when there are tools).
    #[default]
    Auto,
    /// At least one tool call.
    Required,
    /// Exactly one call of this function.
    Function(String),
    /// An object of another `type`: passed to an upstream untouched, refused by the engine.
    Other(String),
}

/// A validated chat completion request.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<Map<String, Value>>,
    pub stream: bool,
    pub include_usage: bool,
    pub n: u32,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
    pub logprobs: bool,
    pub top_logprobs: u32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub logit_bias: Vec<(u32, f32)>,
    pub tools: Option<Value>,
    /// Meaningful only with `tools`.
    pub tool_choice: ToolChoice,
    /// Several tool calls in one answer (`parallel_tool_calls`, default true).
    pub parallel_tool_calls: bool,
    /// What the output must be (`response_format`).
    pub response_format: ResponseFormat,
    pub user: Option<String>,
    /// A legacy `/v1/completions` request: the prompt is the messages' text as it is,
    /// without the chat template.
    pub text_prompt: bool,
    /// The request body exactly as received.
    pub raw: Map<String, Value>,
}

impl ChatRequest {
    /// Parses and validates a request body.
    pub fn parse(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        let Value::Object(raw) = value else {
            return Err(ApiError::MalformedJson("the body must be a JSON object".into()));
        };
        let f = Fields(&raw);
        let model = f.string("model")?.ok_or_else(|| ApiError::param("model", "you must provide a model parameter"))?;
        let messages = parse_messages(raw.get("messages"))?;
        let stream = f.bool("stream")?.unwrap_or(false);
        let include_usage = match raw.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => {
                if !stream {
                    return Err(ApiError::param(
                        "stream_options",
                        "stream_options is only allowed when stream is true",
                    ));
                }
                Fields(o)
                    .bool("include_usage")
                    .map_err(|e| rename_param(e, "stream_options.include_usage"))?
                    .unwrap_or(false)
            }
            Some(_) => return Err(type_error("stream_options", "an object")),
        };
        let n = f.int("n", 1, 128)?.unwrap_or(1) as u32;
        let max_tokens = f.int("max_tokens", 1, u32::MAX as i64)?;
        let max_completion = f.int("max_completion_tokens", 1, u32::MAX as i64)?;
        let logprobs = f.bool("logprobs")?.unwrap_or(false);
        let top_logprobs = f.int("top_logprobs", 0, 20)?;
        if top_logprobs.is_some_and(|k| k > 0) && !logprobs {
            return Err(ApiError::param("top_logprobs", "top_logprobs requires logprobs to be true"));
        }
        let tools = parse_tools(raw.get("tools"))?;
        let tool_choice = parse_tool_choice(raw.get("tool_choice"), tools.as_ref())?;
        Ok(ChatRequest {
            model,
            messages,
            stream,
            include_usage,
            n,
            max_tokens: max_completion.or(max_tokens).map(|v| v as u32),
            temperature: f.number("temperature", 0.0, 2.0)?,
            top_p: f.number("top_p", 0.0, 1.0)?,
            seed: f.int("seed", i64::MIN, i64::MAX)?,
            stop: parse_stop(raw.get("stop"))?,
            logprobs,
            top_logprobs: top_logprobs.unwrap_or(0) as u32,
            presence_penalty: f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
            frequency_penalty: f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
            logit_bias: parse_logit_bias(raw.get("logit_bias"))?,
            tools: tools.clone(),
            tool_choice,
            parallel_tool_calls: f.bool("parallel_tool_calls")?.unwrap_or(true),
            response_format: parse_response_format(raw.get("response_format"))?,
            user: f.string("user")?,
            text_prompt: false,
            raw,
        })
    }

    /// Parses a legacy `POST /v1/completions` body: `prompt` (a string, or a list of one
    /// string) becomes the one user message, `logprobs` (0..=5) the number of alternatives,
    /// `max_tokens` defaults to 16 as OpenAI's does; `echo`, `suffix` and `best_of` other
    /// than their defaults are refused by name. Every other field is checked as for chat.
    pub fn parse_completion(body: &[u8]) -> Result<ChatRequest, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        let Value::Object(mut legacy) = value else {
            return Err(ApiError::MalformedJson("the body must be a JSON object".into()));
        };
        let prompt = match legacy.remove("prompt") {
            Some(Value::String(p)) => p,
            Some(Value::Array(list)) if list.len() == 1 && list[0].is_string() => {
                list[0].as_str().unwrap_or_default().to_owned()
            }
            Some(Value::Array(list)) if list.iter().all(Value::is_string) => {
                return Err(ApiError::param(
                    "prompt",
                    format!("one prompt per request is supported, got {}", list.len()),
                ))
            }
            None | Some(Value::Null) => return Err(ApiError::param("prompt", "you must provide a prompt parameter")),
            Some(_) => return Err(type_error("prompt", "a string (token-id prompts are not supported)")),
        };
        let f = Fields(&legacy);
        if f.bool("echo")?.unwrap_or(false) {
            return Err(ApiError::param("echo", "echo is not supported"));
        }
        if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::param("suffix", "suffix (insertion) is not supported"));
        }
        f.int("best_of", 1, 1)?;
        let logprobs = f.int("logprobs", 0, 5)?;
        let max_tokens = f.int("max_tokens", 1, u32::MAX as i64)?.unwrap_or(16);
        for key in ["top_logprobs", "max_completion_tokens", "messages", "tools", "tool_choice", "response_format"] {
            if legacy.get(key).is_some_and(|v| !v.is_null()) {
                return Err(ApiError::param(key, format!("{key} is not a parameter of text completions")));
            }
        }
        for key in ["echo", "suffix", "best_of", "logprobs"] {
            legacy.remove(key);
        }
        legacy.insert("messages".into(), serde_json::json!([{"role": "user", "content": prompt}]));
        legacy.insert("max_tokens".into(), Value::from(max_tokens));
        if let Some(k) = logprobs {
            legacy.insert("logprobs".into(), Value::Bool(true));
            legacy.insert("top_logprobs".into(), Value::from(k));
        }
        let mut request = ChatRequest::parse(Value::Object(legacy).to_string().as_bytes())?;
        request.text_prompt = true;
        Ok(request)
    }

    /// Every text the client sent in `messages` (contents, text parts, tool-call arguments,
    /// tool results), one per line: what the provenance index fingerprints.
    pub fn prompt_text(&self) -> String {
        let mut out = String::new();
        self.for_each_prompt_text(|text| {
            out.push_str(text);
            out.push('\n');
        });
        out
    }

    /// The length of [`ChatRequest::prompt_text`], without building it (rate limits
    /// estimate tokens from it).
    pub fn prompt_bytes(&self) -> usize {
        let mut n = 0;
        self.for_each_prompt_text(|text| n += text.len() + 1);
        n
    }

    /// Calls `push` with every text of [`ChatRequest::prompt_text`], in order: what each
    /// message says (its text and refusal parts, its tool and legacy function call
    /// arguments), then every string of the tool definitions (`tools`, legacy `functions`)
    /// and of `response_format` but their JSON Schema type names. All of it reaches the model,
    /// so all of it is the tenant's: a secret or a paragraph in a tool's description is
    /// owned like one in a message.
    fn for_each_prompt_text(&self, mut push: impl FnMut(&str)) {
        for m in &self.messages {
            match m.get("content") {
                Some(Value::String(text)) => push(text),
                Some(Value::Array(parts)) => {
                    for part in parts {
                        ["text", "refusal"]
                            .iter()
                            .filter_map(|k| part.get(*k).and_then(Value::as_str))
                            .for_each(&mut push);
                    }
                }
                _ => {}
            }
            if let Some(refusal) = m.get("refusal").and_then(Value::as_str) {
                push(refusal);
            }
            for call in m.get("tool_calls").and_then(Value::as_array).into_iter().flatten() {
                if let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str) {
                    push(args);
                }
            }
            if let Some(args) = m.get("function_call").and_then(|c| c.get("arguments")).and_then(Value::as_str) {
                push(args);
            }
        }
        for key in ["tools", "functions", "response_format"] {
            if let Some(definitions) = self.raw.get(key) {
                for_each_string(definitions, &mut push);
            }
        }
    }

    /// Adds `line` to the system prompt — at the start of the first system message, or at
    /// the end of the last one — or as a new first system message when there is none.
    /// `messages` and `raw` (what an upstream receives) change together.
    pub fn add_system_line(&mut self, line: &str, at_start: bool) {
        let is_system =
            |m: &Map<String, Value>| matches!(m.get("role").and_then(Value::as_str), Some("system" | "developer"));
        let target =
            if at_start { self.messages.iter().position(is_system) } else { self.messages.iter().rposition(is_system) };
        match target {
            Some(i) => {
                let content = self.messages[i].entry("content").or_insert(Value::String(String::new()));
                match content {
                    Value::Array(parts) => {
                        let part = serde_json::json!({"type": "text", "text": line});
                        if at_start {
                            parts.insert(0, part);
                        } else {
                            parts.push(part);
                        }
                    }
                    Value::String(text) if text.is_empty() => *text = line.to_owned(),
                    Value::String(text) if at_start => *text = format!("{line}\n{text}"),
                    Value::String(text) => {
                        text.push('\n');
                        text.push_str(line);
                    }
                    other => *other = Value::String(line.to_owned()),
                }
            }
            None => {
                let mut m = Map::new();
                m.insert("role".into(), Value::String("system".into()));
                m.insert("content".into(), Value::String(line.to_owned()));
                self.messages.insert(0, m);
            }
        }
        self.raw.insert("messages".into(), Value::Array(self.messages.iter().cloned().map(Value::Object).collect()));
    }
}

/// Typed accessors over the request object; `null` counts as absent, as in OpenAI's API.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn string(&self, key: &str) -> Result<Option<String>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(type_error(key, "a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(type_error(key, "a boolean")),
        }
    }

    fn number(&self, key: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| type_error(key, "a number"))?;
        if !(min..=max).contains(&x) {
            return Err(ApiError::param(key, format!("{key} must be between {min} and {max}, got {x}")));
        }
        Ok(Some(x as f32))
    }

    fn int(&self, key: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let x = v.as_i64().ok_or_else(|| type_error(key, "an integer"))?;
        if !(min..=max).contains(&x) {
            let range = if max == u32::MAX as i64 || max == i64::MAX {
                format!("at least {min}")
            } else {
                format!("between {min} and {max}")
            };
            return Err(ApiError::param(key, format!("{key} must be {range}, got {x}")));
        }
        Ok(Some(x))
    }
}

fn type_error(param: &str, expected: &str) -> ApiError {
    ApiError::param(param, format!("Invalid type for '{param}': expected {expected}."))
}

fn rename_param(err: ApiError, param: &str) -> ApiError {
    match err {
        ApiError::InvalidParam { message, .. } => ApiError::InvalidParam { param: param.into(), message },
        other => other,
    }
}

/// Calls `push` with every string in `value`, depth first, but the values of `type` keys
/// (JSON Schema's `"object"`, `"string"`: the same in every tenant's definitions).
fn for_each_string(value: &Value, push: &mut impl FnMut(&str)) {
    match value {
        Value::String(s) => push(s),
        Value::Array(items) => items.iter().for_each(|v| for_each_string(v, push)),
        Value::Object(fields) => {
            fields
                .iter()
                .filter(|(k, v)| !(k.as_str() == "type" && v.is_string()))
                .for_each(|(_, v)| for_each_string(v, push));
        }
        _ => {}
    }
}

fn parse_messages(value: Option<&Value>) -> Result<Vec<Map<String, Value>>, ApiError> {
    let list = match value {
        None | Some(Value::Null) => return Err(ApiError::param("messages", "you must provide a messages parameter")),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(type_error("messages", "an array")),
    };
    if list.is_empty() {
        return Err(ApiError::param("messages", "messages must contain at least one message"));
    }
    list.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect()
}

fn parse_message(i: usize, value: &Value) -> Result<Map<String, Value>, ApiError> {
    let at = |k: &str| format!("messages[{i}].{k}");
    let Value::Object(m) = value else { return Err(type_error(&format!("messages[{i}]"), "an object")) };
    let role = match m.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(_) => return Err(type_error(&at("role"), "a string")),
        None => return Err(ApiError::param(at("role"), format!("{} is required", at("role")))),
    };
    if !ROLES.contains(&role) {
        return Err(ApiError::param(
            at("role"),
            format!("Invalid value: '{role}'. Supported values are: {}.", ROLES.join(", ")),
        ));
    }
    match m.get("content") {
        Some(Value::String(_)) => {}
        Some(Value::Array(parts)) => {
            for (j, part) in parts.iter().enumerate() {
                if part.get("type").and_then(Value::as_str).is_none() {
                    return Err(ApiError::param(
                        format!("messages[{i}].content[{j}].type"),
                        "each content part needs a string `type`",
                    ));
                }
            }
        }
        None | Some(Value::Null) => {
            let may_be_empty = role == "assistant" && (m.contains_key("tool_calls") || m.contains_key("function_call"));
            if !may_be_empty && role != "assistant" {
                return Err(ApiError::param(at("content"), format!("{} is required for role '{role}'", at("content"))));
            }
        }
        Some(_) => return Err(type_error(&at("content"), "a string or an array of content parts")),
    }
    if role == "tool" && !m.get("tool_call_id").is_some_and(Value::is_string) {
        return Err(ApiError::param(at("tool_call_id"), "messages with role 'tool' need a string tool_call_id"));
    }
    if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
        if !calls.is_array() {
            return Err(type_error(&at("tool_calls"), "an array"));
        }
    }
    Ok(m.clone())
}

fn parse_stop(value: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let stops = match value {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_owned).ok_or_else(|| type_error("stop", "a string or an array of strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(type_error("stop", "a string or an array of strings")),
    };
    if stops.len() > 4 {
        return Err(ApiError::param("stop", format!("stop may hold at most 4 sequences, got {}", stops.len())));
    }
    if stops.iter().any(String::is_empty) {
        return Err(ApiError::param("stop", "stop sequences must not be empty"));
    }
    Ok(stops)
}

fn parse_logit_bias(value: Option<&Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let map = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(type_error("logit_bias", "an object mapping token ids to numbers")),
    };
    map.iter()
        .map(|(token, bias)| {
            let id: u32 = token.parse().map_err(|_| {
                ApiError::param("logit_bias", format!("logit_bias keys must be token ids, got {token:?}"))
            })?;
            let b = bias.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                ApiError::param("logit_bias", format!("logit_bias[{token}] must be a number between -100 and 100"))
            })?;
            Ok((id, b as f32))
        })
        .collect()
}

fn parse_tool_choice(value: Option<&Value>, tools: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let choice = match value {
        None | Some(Value::Null) => return Ok(if tools.is_some() { ToolChoice::Auto } else { ToolChoice::None }),
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::param(
                    "tool_choice",
                    format!(
                    "Invalid value: '{other}'. Supported values are: 'none', 'auto', 'required' or a named function."
                ),
                ))
            }
        },
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str).is_some_and(|t| t != "function") => {
            ToolChoice::Other(o.get("type").and_then(Value::as_str).unwrap_or_default().to_owned())
        }
        Some(Value::Object(o)) => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            let name = name.ok_or_else(|| {
                ApiError::param("tool_choice.function.name", "a named tool_choice needs function.name")
            })?;
            let known = tools
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name));
            if !known {
                return Err(ApiError::param(
                    "tool_choice.function.name",
                    format!("tool_choice names '{name}', which is not in tools"),
                ));
            }
            ToolChoice::Function(name.to_owned())
        }
        Some(_) => return Err(type_error("tool_choice", "a string or an object")),
    };
    if tools.is_none() && choice != ToolChoice::None {
        return Err(ApiError::param("tool_choice", "tool_choice is only allowed when tools are specified"));
    }
    Ok(choice)
}

fn parse_response_format(value: Option<&Value>) -> Result<ResponseFormat, ApiError> {
    let format = match value {
        None | Some(Value::Null) => return Ok(ResponseFormat::Text),
        Some(Value::Object(format)) => format,
        Some(_) => return Err(type_error("response_format", "an object")),
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let spec = match format.get("json_schema") {
                Some(Value::Object(spec)) => spec,
                None | Some(Value::Null) => {
                    return Err(ApiError::param(
                        "response_format.json_schema",
                        "response_format.json_schema is required when type is 'json_schema'",
                    ))
                }
                Some(_) => return Err(type_error("response_format.json_schema", "an object")),
            };
            let f = Fields(spec);
            let name = f.string("name").map_err(|e| rename_param(e, "response_format.json_schema.name"))?;
            let name = name.ok_or_else(|| {
                ApiError::param("response_format.json_schema.name", "response_format.json_schema.name is required")
            })?;
            let well_formed = (1..=64).contains(&name.len())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !well_formed {
                return Err(ApiError::param(
                    "response_format.json_schema.name",
                    format!("Invalid 'response_format.json_schema.name': {name:?}; 1 to 64 letters, digits, underscores or dashes"),
                ));
            }
            let schema = match f.get("schema") {
                None => None,
                Some(schema @ (Value::Object(_) | Value::Bool(_))) => Some(schema.clone()),
                Some(_) => return Err(type_error("response_format.json_schema.schema", "an object")),
            };
            let strict =
                f.bool("strict").map_err(|e| rename_param(e, "response_format.json_schema.strict"))?.unwrap_or(false);
            Ok(ResponseFormat::JsonSchema { name, schema, strict })
        }
        Some(other) => Ok(ResponseFormat::Other(other.to_owned())),
        None => Err(ApiError::param("response_format.type", "response_format.type is required")),
    }
}

fn parse_tools(value: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(list)) => {
            for (i, tool) in list.iter().enumerate() {
                let Some(name) = tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) else {
                    return Err(ApiError::param(format!("tools[{i}].function.name"), "each tool needs function.name"));
                };
                // OpenAI's rule; the engine also relies on names needing no JSON escapes.
                let well_formed = (1..=64).contains(&name.len())
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !well_formed {
                    return Err(ApiError::param(
                        format!("tools[{i}].function.name"),
                        format!("Invalid 'tools[{i}].function.name': {name:?}; 1 to 64 letters, digits, underscores or dashes"),
                    ));
                }
                let parameters = tool.pointer("/function/parameters").filter(|p| !p.is_null());
                if parameters.is_some_and(|p| !p.is_object()) {
                    return Err(type_error(&format!("tools[{i}].function.parameters"), "a JSON Schema object"));
                }
            }
            Ok(Some(Value::Array(list.clone())))
        }
        Some(_) => Err(type_error("tools", "an array")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<ChatRequest, ApiError> {
        ChatRequest::parse(v.to_string().as_bytes())
    }

    fn param_of(v: Value) -> String {
        match parse(v) {
            Err(ApiError::InvalidParam { param, .. }) => param,
            other => panic!("expected a param error, got {other:?}"),
        }
    }

    fn base() -> Value {
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn with(key: &str, value: Value) -> Value {
        let mut v = base();
        v[key] = value;
        v
    }

    #[test]
    fn minimal_request_parses_with_defaults() {
        let r = parse(base()).unwrap();
        assert_eq!((r.model.as_str(), r.n, r.stream, r.max_tokens), ("m", 1, false, None));
    }

    #[test]
    fn unknown_fields_are_kept_for_upstream() {
        let r = parse(with("reasoning_effort", json!("low"))).unwrap();
        assert_eq!(r.raw["reasoning_effort"], "low");
    }

    #[test]
    fn malformed_json_is_not_a_param_error() {
        assert!(matches!(ChatRequest::parse(b"{\"model\": "), Err(ApiError::MalformedJson(_))));
        assert!(matches!(ChatRequest::parse(b"[1,2]"), Err(ApiError::MalformedJson(_))));
    }

    #[test]
    fn every_bad_field_names_its_param() {
        let cases = [
            (json!({"messages": [{"role": "user", "content": "x"}]}), "model"),
            (json!({"model": "m"}), "messages"),
            (with("messages", json!([])), "messages"),
            (with("messages", json!("hi")), "messages"),
            (with("messages", json!([{"role": "robot", "content": "x"}])), "messages[0].role"),
            (with("messages", json!([{"content": "x"}])), "messages[0].role"),
            (with("messages", json!([{"role": "user", "content": 5}])), "messages[0].content"),
            (with("messages", json!([{"role": "tool", "content": "x"}])), "messages[0].tool_call_id"),
            (with("temperature", json!(3)), "temperature"),
            (with("temperature", json!("hot")), "temperature"),
            (with("top_p", json!(1.5)), "top_p"),
            (with("n", json!(0)), "n"),
            (with("max_tokens", json!(0)), "max_tokens"),
            (with("max_completion_tokens", json!(-1)), "max_completion_tokens"),
            (with("presence_penalty", json!(-3)), "presence_penalty"),
            (with("stop", json!(["a", "b", "c", "d", "e"])), "stop"),
            (with("stream", json!("yes")), "stream"),
            (with("top_logprobs", json!(5)), "top_logprobs"),
            (with("logit_bias", json!({"abc": 1})), "logit_bias"),
            (with("tools", json!([{"type": "function"}])), "tools[0].function.name"),
            (with("tools", json!([{"type": "function", "function": {"name": "a\"b"}}])), "tools[0].function.name"),
            (
                with(
                    "tools",
                    json!([{"type": "function", "function": {"name": "ok"}}, {"type": "function", "function": {"name": "ok2", "parameters": "x"}}]),
                ),
                "tools[1].function.parameters",
            ),
            (with("stream_options", json!({"include_usage": true})), "stream_options"),
            (with("response_format", json!("json")), "response_format"),
            (with("tool_choice", json!("required")), "tool_choice"),
            (with("tool_choice", json!("sometimes")), "tool_choice"),
            (with("tool_choice", json!(3)), "tool_choice"),
            (with("parallel_tool_calls", json!("no")), "parallel_tool_calls"),
            (with("response_format", json!({})), "response_format.type"),
            (with("response_format", json!({"type": "json_schema"})), "response_format.json_schema"),
            (
                with("response_format", json!({"type": "json_schema", "json_schema": {"schema": {}}})),
                "response_format.json_schema.name",
            ),
            (
                with("response_format", json!({"type": "json_schema", "json_schema": {"name": "a b"}})),
                "response_format.json_schema.name",
            ),
            (
                with("response_format", json!({"type": "json_schema", "json_schema": {"name": "a", "schema": "{}"}})),
                "response_format.json_schema.schema",
            ),
            (
                with("response_format", json!({"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}})),
                "response_format.json_schema.strict",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(body.clone()), param, "{body}");
        }
    }

    #[test]
    fn numbers_reach_the_upstream_as_the_client_sent_them() {
        // serde_json's default float parser may land an ulp off, and the body relayed
        // upstream would carry another number than the client's (found by the fuzzer).
        let digits = "-88888888888888888888888888888888888888888888";
        let body =
            format!(r#"{{"model": "m", "messages": [{{"role": "user", "content": "hi"}}], "x_weight": {digits}}}"#);
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(r.raw["x_weight"].as_f64(), Some(digits.parse::<f64>().unwrap()));
        let relayed = ChatRequest::parse(serde_json::to_string(&r.raw).unwrap().as_bytes()).unwrap();
        assert_eq!(relayed.raw, r.raw);
    }

    #[test]
    fn legacy_completions_become_one_raw_prompt() {
        let r = ChatRequest::parse_completion(br#"{"model": "m", "prompt": "Once upon", "logprobs": 2, "stop": "."}"#)
            .unwrap();
        assert!(r.text_prompt);
        assert_eq!(r.messages[0]["content"], "Once upon");
        assert_eq!(
            (r.max_tokens, r.logprobs, r.top_logprobs, r.stop.clone()),
            (Some(16), true, 2, vec![".".to_owned()])
        );
        let r = ChatRequest::parse_completion(
            br#"{"model": "m", "prompt": ["x"], "max_tokens": 3, "echo": false, "best_of": 1}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(3));
        let param = |body: &str| match ChatRequest::parse_completion(body.as_bytes()) {
            Err(ApiError::InvalidParam { param, .. }) => param,
            other => panic!("{body}: {other:?}"),
        };
        assert_eq!(param(r#"{"model": "m"}"#), "prompt");
        assert_eq!(param(r#"{"model": "m", "prompt": [1, 2]}"#), "prompt");
        assert_eq!(param(r#"{"model": "m", "prompt": ["a", "b"]}"#), "prompt");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "echo": true}"#), "echo");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "suffix": "z"}"#), "suffix");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "best_of": 3}"#), "best_of");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "logprobs": 9}"#), "logprobs");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "tools": []}"#), "tools");
        assert_eq!(param(r#"{"model": "m", "prompt": "a", "temperature": 9}"#), "temperature");
    }

    #[test]
    fn tool_choices_parse() {
        let tools = json!([{"type": "function", "function": {"name": "w"}}]);
        let mut v = with("tools", tools.clone());
        assert_eq!(parse(v.clone()).unwrap().tool_choice, ToolChoice::Auto);
        assert_eq!(parse(base()).unwrap().tool_choice, ToolChoice::None);
        v["tool_choice"] = json!({"type": "function", "function": {"name": "w"}});
        assert_eq!(parse(v.clone()).unwrap().tool_choice, ToolChoice::Function("w".into()));
        v["tool_choice"] = json!({"type": "function", "function": {"name": "other"}});
        assert_eq!(param_of(v.clone()), "tool_choice.function.name");
        v["tool_choice"] = json!("required");
        v["parallel_tool_calls"] = json!(false);
        let r = parse(v).unwrap();
        assert_eq!((r.tool_choice, r.parallel_tool_calls), (ToolChoice::Required, false));
    }

    #[test]
    fn response_formats_parse() {
        assert_eq!(parse(base()).unwrap().response_format, ResponseFormat::Text);
        assert_eq!(
            parse(with("response_format", json!({"type": "text"}))).unwrap().response_format,
            ResponseFormat::Text
        );
        assert_eq!(
            parse(with("response_format", json!({"type": "json_object"}))).unwrap().response_format,
            ResponseFormat::JsonObject
        );
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let r = parse(with(
            "response_format",
            json!({"type": "json_schema", "json_schema": {"name": "thing_1", "schema": schema, "strict": true}}),
        ))
        .unwrap();
        assert_eq!(
            r.response_format,
            ResponseFormat::JsonSchema { name: "thing_1".into(), schema: Some(schema), strict: true }
        );
        // Types the gateway does not know still reach an upstream.
        let r = parse(with("response_format", json!({"type": "grammar", "grammar": "x"}))).unwrap();
        assert_eq!(r.response_format, ResponseFormat::Other("grammar".into()));
        assert_eq!(r.raw["response_format"]["grammar"], "x");
    }

    #[test]
    fn max_completion_tokens_wins_over_max_tokens() {
        let mut v = with("max_tokens", json!(10));
        v["max_completion_tokens"] = json!(20);
        assert_eq!(parse(v).unwrap().max_tokens, Some(20));
    }

    #[test]
    fn stream_options_and_stop_forms() {
        let mut v = with("stream", json!(true));
        v["stream_options"] = json!({"include_usage": true});
        v["stop"] = json!("END");
        let r = parse(v).unwrap();
        assert!(r.include_usage);
        assert_eq!(r.stop, vec!["END".to_string()]);
    }

    #[test]
    fn system_lines_go_where_asked_and_reach_the_raw_body() {
        let mut r = parse(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        r.add_system_line("canary-1", false);
        assert_eq!(r.messages[0]["role"], "system");
        assert_eq!(r.raw["messages"][0]["content"], "canary-1");
        let mut r = parse(json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hello"}]},
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"q\":1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "result text"}
        ]}))
        .unwrap();
        r.add_system_line("canary-2", true);
        assert_eq!(r.messages[0]["content"], "canary-2\nbe brief");
        assert_eq!(r.raw["messages"][0]["content"], "canary-2\nbe brief");
        assert_eq!(r.prompt_text(), "canary-2\nbe brief\nhello\n{\"q\":1}\nresult text\n");
    }

    #[test]
    fn the_prompt_text_holds_everything_the_model_reads() {
        let r = parse(json!({"model": "m",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "no part"}], "refusal": "no field"},
                {"role": "assistant", "content": null, "function_call": {"name": "f", "arguments": "{\"legacy\":1}"}},
                {"role": "function", "name": "f", "content": "done"}
            ],
            "tools": [{"type": "function", "function": {"name": "lookup", "description": "Reads the vault at vault.acme.internal",
                "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "what to look up"}}}}}],
            "functions": [{"name": "old", "description": "a legacy function"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object", "description": "the answer's shape"}}}
        }))
        .unwrap();
        let text = r.prompt_text();
        for said in [
            "hi",
            "no part",
            "no field",
            "{\"legacy\":1}",
            "done",
            "Reads the vault at vault.acme.internal",
            "what to look up",
            "a legacy function",
            "the answer's shape",
            "lookup",
        ] {
            assert!(text.contains(said), "{said:?} missing from {text:?}");
        }
        assert!(!text.lines().any(|l| l == "object" || l == "string" || l == "json_schema"), "{text:?}");
        assert_eq!(r.prompt_bytes(), text.len());
    }

    #[test]
    fn assistant_tool_call_messages_may_omit_content() {
        let msgs = json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ]);
        assert_eq!(parse(with("messages", msgs)).unwrap().messages.len(), 3);
    }
}
