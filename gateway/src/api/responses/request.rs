//! `POST /v1/responses` request: validated field by field (every error names its Responses
//! API `param`) and translated into the chat request both backends serve — `input` items to
//! messages (in `input.rs`), `instructions` to the first system turn, flat function tools to
//! chat tools, `text.format` to `response_format`, `max_output_tokens` to
//! `max_completion_tokens`.
//!
//! What has no chat equivalent is refused by name rather than ignored (hosted tools,
//! `background`, `conversation`, `truncation: "auto"`, reasoning effort, unknown fields):
//! a client that asks for something gets it or a 400 saying why.

use serde_json::{json, Map, Value};

use super::input::{parse_input, Messages};
use crate::api::ChatRequest;
use crate::error::ApiError;

/// Fields accepted with their meaning here; any other non-null field is refused.
const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "stream",
    "stream_options",
    "store",
    "previous_response_id",
    "metadata",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "temperature",
    "top_p",
    "max_output_tokens",
    "top_logprobs",
    "include",
    "user",
    "safety_identifier",
    "truncation",
    "background",
    "reasoning",
    "service_tier",
    "prompt_cache_key",
    "max_tool_calls",
];

/// The `include` value that asks for output logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// A validated Responses API request.
#[derive(Debug, Clone)]
pub struct ResponsesRequest {
    pub model: String,
    pub stream: bool,
    /// Keep the response for `previous_response_id` and `GET /v1/responses/{id}`.
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// This request's `input`, as chat messages (without `instructions`).
    pub input: Messages,
    /// Where each of `input`'s messages came from (`input[3]`), for error params.
    input_origins: Vec<String>,
    /// What the response object repeats back.
    pub echo: Echo,
    /// The chat body's other fields, translated.
    chat: Map<String, Value>,
}

/// The request's settings as the response object reports them.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Echo {
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u64>,
    pub metadata: Map<String, Value>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub store: bool,
    pub temperature: Option<f64>,
    pub text: Value,
    pub tool_choice: Value,
    pub tools: Value,
    pub top_logprobs: Option<u64>,
    pub top_p: Option<f64>,
    pub truncation: &'static str,
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
}

impl ResponsesRequest {
    /// Parses and validates a request body.
    pub fn parse(body: &[u8]) -> Result<ResponsesRequest, ApiError> {
        let value: Value = serde_json::from_slice(body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
        let Value::Object(raw) = value else {
            return Err(ApiError::MalformedJson("the body must be a JSON object".into()));
        };
        if let Some(key) = raw.iter().find(|(k, v)| !v.is_null() && !KNOWN.contains(&k.as_str())).map(|(k, _)| k) {
            return Err(ApiError::param(key.as_str(), format!("Unknown parameter: '{key}'.")));
        }
        refuse_unsupported(&raw)?;
        let get = |key: &str| raw.get(key).filter(|v| !v.is_null());
        let model = string(get("model"), "model")?
            .ok_or_else(|| ApiError::param("model", "you must provide a model parameter"))?;
        let stream = boolean(get("stream"), "stream")?.unwrap_or(false);
        if get("stream_options").is_some() && !stream {
            return Err(ApiError::param("stream_options", "stream_options is only allowed when stream is true"));
        }
        let store = boolean(get("store"), "store")?.unwrap_or(true);
        let previous_response_id = string(get("previous_response_id"), "previous_response_id")?;
        if let Some(id) = &previous_response_id {
            if !is_response_id(id) {
                return Err(ApiError::param(
                    "previous_response_id",
                    format!("Invalid 'previous_response_id': {id:?} is not a response id."),
                ));
            }
        }
        let instructions = string(get("instructions"), "instructions")?;
        let (input, input_origins) = parse_input(get("input"))?;
        let metadata = parse_metadata(get("metadata"))?;
        let (tools, chat_tools) = parse_tools(get("tools"))?;
        let (tool_choice, chat_tool_choice) = parse_tool_choice(get("tool_choice"), &tools)?;
        let (text, response_format) = parse_text(get("text"))?;
        let include = parse_include(get("include"))?;
        let top_logprobs = get("top_logprobs")
            .map(|v| {
                v.as_u64().filter(|k| *k <= 20).ok_or_else(|| range("top_logprobs", "an integer between 0 and 20"))
            })
            .transpose()?;
        let max_output_tokens = get("max_output_tokens")
            .map(|v| {
                v.as_u64().filter(|n| *n >= 1).ok_or_else(|| range("max_output_tokens", "an integer of at least 1"))
            })
            .transpose()?;
        let safety_identifier = string(get("safety_identifier"), "safety_identifier")?;
        let user = string(get("user"), "user")?;
        let parallel_tool_calls = boolean(get("parallel_tool_calls"), "parallel_tool_calls")?.unwrap_or(true);
        let temperature =
            get("temperature").map(|v| v.as_f64().ok_or_else(|| range("temperature", "a number"))).transpose()?;
        let top_p = get("top_p").map(|v| v.as_f64().ok_or_else(|| range("top_p", "a number"))).transpose()?;
        for key in ["service_tier", "prompt_cache_key"] {
            string(get(key), key)?;
        }
        if get("max_tool_calls").is_some() {
            return Err(ApiError::param(
                "max_tool_calls",
                "max_tool_calls is not supported: use tool_choice and parallel_tool_calls",
            ));
        }

        // The chat body, `messages` excepted (they depend on the stored conversation).
        let mut chat = Map::new();
        chat.insert("model".into(), Value::String(model.clone()));
        chat.insert("stream".into(), Value::Bool(stream));
        if stream {
            // The final response object carries usage.
            chat.insert("stream_options".into(), json!({"include_usage": true}));
        }
        for (key, value) in [("temperature", temperature.map(Value::from)), ("top_p", top_p.map(Value::from))] {
            if let Some(v) = value {
                chat.insert(key.into(), v);
            }
        }
        if let Some(n) = max_output_tokens {
            chat.insert("max_completion_tokens".into(), Value::from(n));
        }
        if include || top_logprobs.is_some_and(|k| k > 0) {
            chat.insert("logprobs".into(), Value::Bool(true));
            chat.insert("top_logprobs".into(), Value::from(top_logprobs.unwrap_or(0)));
        }
        if let Some(tools) = chat_tools {
            chat.insert("tools".into(), tools);
            chat.insert("parallel_tool_calls".into(), Value::Bool(parallel_tool_calls));
        }
        if let Some(choice) = chat_tool_choice {
            chat.insert("tool_choice".into(), choice);
        }
        if let Some(format) = response_format {
            chat.insert("response_format".into(), format);
        }
        // The chat API's one end-user field.
        if let Some(id) = safety_identifier.as_ref().or(user.as_ref()) {
            chat.insert("user".into(), Value::String(id.clone()));
        }
        let echo = Echo {
            instructions,
            max_output_tokens,
            metadata,
            parallel_tool_calls,
            previous_response_id: previous_response_id.clone(),
            store,
            temperature,
            text,
            tool_choice,
            tools: Value::Array(tools),
            top_logprobs,
            top_p,
            truncation: "disabled",
            user,
            safety_identifier,
        };
        Ok(ResponsesRequest { model, stream, store, previous_response_id, input, input_origins, echo, chat })
    }

    /// The chat request to serve: `instructions` as the first system turn, then `history`
    /// (the stored conversation this one continues), then this request's input. A chat
    /// validation error is reported with the Responses API's param name.
    pub fn chat_request(&self, history: &[Map<String, Value>]) -> Result<ChatRequest, ApiError> {
        let mut messages: Vec<Value> = Vec::with_capacity(history.len() + self.input.len() + 1);
        if let Some(text) = &self.echo.instructions {
            messages.push(json!({"role": "system", "content": text}));
        }
        messages.extend(history.iter().cloned().map(Value::Object));
        messages.extend(self.input.iter().cloned().map(Value::Object));
        let mut body = self.chat.clone();
        body.insert("messages".into(), Value::Array(messages));
        let bytes =
            serde_json::to_vec(&body).map_err(|e| ApiError::Internal(format!("translating the request: {e}")))?;
        ChatRequest::parse(&bytes).map_err(|e| self.rename(e, history.len()))
    }

    /// `e` with a chat param name replaced by this API's; `history` is the number of
    /// stored messages before the input (after `instructions`).
    pub fn rename(&self, e: ApiError, history: usize) -> ApiError {
        match e {
            ApiError::InvalidParam { param, message } => {
                let renamed = self.param_name(&param, history);
                // The chat path's messages name their param too.
                let message = if param.is_empty() { message } else { message.replace(&param, &renamed) };
                ApiError::InvalidParam { param: renamed, message }
            }
            ApiError::ContextLengthExceeded { message, param } => ApiError::ContextLengthExceeded {
                message: message.replace("your messages use", "your input uses"),
                param: self.param_name(&param, history),
            },
            other => other,
        }
    }

    fn param_name(&self, chat: &str, history: usize) -> String {
        if let Some(rest) = chat.strip_prefix("messages[") {
            let (index, tail) = rest.split_once(']').unwrap_or((rest, ""));
            let first_input = history + usize::from(self.echo.instructions.is_some());
            return match index.parse::<usize>() {
                Ok(0) if self.echo.instructions.is_some() => "instructions".to_owned(),
                Ok(i) if i < first_input => "previous_response_id".to_owned(),
                Ok(i) => match self.input_origins.get(i - first_input) {
                    // A string input is the whole message.
                    Some(origin) if origin == "input" => "input".to_owned(),
                    Some(origin) => format!("{origin}{tail}"),
                    None => "input".to_owned(),
                },
                Err(_) => "input".to_owned(),
            };
        }
        let renamed = [
            ("messages", "input"),
            ("max_completion_tokens", "max_output_tokens"),
            ("response_format.json_schema.", "text.format."),
            ("response_format", "text.format"),
            ("tool_choice.function.name", "tool_choice.name"),
        ];
        for (from, to) in renamed {
            if let Some(rest) = chat.strip_prefix(from) {
                return format!("{to}{rest}");
            }
        }
        // `tools[i].function.x` -> `tools[i].x`
        if chat.starts_with("tools[") {
            return chat.replacen(".function.", ".", 1);
        }
        chat.to_owned()
    }
}

/// Response ids this gateway issues (`resp_` and hex) and the like: short, no separators.
pub fn is_response_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Known fields whose features neither backend path has: refused by name.
fn refuse_unsupported(raw: &Map<String, Value>) -> Result<(), ApiError> {
    let get = |key: &str| raw.get(key).filter(|v| !v.is_null());
    if boolean(get("background"), "background")? == Some(true) {
        return Err(ApiError::param(
            "background",
            "background responses are not supported: stream the response instead",
        ));
    }
    match get("truncation") {
        None => {}
        Some(Value::String(t)) if t == "disabled" => {}
        Some(Value::String(t)) if t == "auto" => {
            return Err(ApiError::param(
                "truncation",
                "truncation 'auto' is not supported: a conversation longer than the model's context is refused",
            ))
        }
        Some(_) => {
            return Err(ApiError::param("truncation", "Invalid value for 'truncation': expected 'auto' or 'disabled'."))
        }
    }
    match get("reasoning") {
        None => {}
        Some(Value::Object(r)) if r.values().all(Value::is_null) => {}
        Some(Value::Object(_)) => {
            return Err(ApiError::param("reasoning", "reasoning options are not supported by this gateway's models"))
        }
        Some(_) => return Err(type_error("reasoning", "an object")),
    }
    if let Some(options) = get("stream_options") {
        let Value::Object(o) = options else { return Err(type_error("stream_options", "an object")) };
        boolean(o.get("include_obfuscation").filter(|v| !v.is_null()), "stream_options.include_obfuscation")?;
    }
    Ok(())
}

/// Up to 16 pairs, keys up to 64 characters, string values up to 512 (OpenAI's limits).
fn parse_metadata(value: Option<&Value>) -> Result<Map<String, Value>, ApiError> {
    let map = match value {
        None => return Ok(Map::new()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(type_error("metadata", "an object of strings")),
    };
    if map.len() > 16 {
        return Err(ApiError::param("metadata", format!("metadata may hold at most 16 pairs, got {}", map.len())));
    }
    for (key, v) in map {
        let ok = key.chars().count() <= 64 && v.as_str().is_some_and(|s| s.chars().count() <= 512);
        if !ok {
            return Err(ApiError::param(
                format!("metadata.{key}"),
                "metadata keys are at most 64 characters and values strings of at most 512",
            ));
        }
    }
    Ok(map.clone())
}

/// `tools` as given (for the echo) and as chat tools.
fn parse_tools(value: Option<&Value>) -> Result<(Vec<Value>, Option<Value>), ApiError> {
    let list = match value {
        None => return Ok((Vec::new(), None)),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(type_error("tools", "an array")),
    };
    let mut chat = Vec::with_capacity(list.len());
    for (i, tool) in list.iter().enumerate() {
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(ApiError::param(
                    format!("tools[{i}].type"),
                    format!("tools of type '{other}' are not supported: only function tools"),
                ))
            }
            None => return Err(ApiError::param(format!("tools[{i}].type"), format!("tools[{i}].type is required"))),
        }
        let mut function = Map::new();
        for key in ["name", "description", "parameters", "strict"] {
            if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                function.insert(key.into(), v.clone());
            }
        }
        chat.push(json!({"type": "function", "function": function}));
    }
    Ok((list.clone(), Some(Value::Array(chat))))
}

/// `tool_choice` as given (for the echo) and in the chat form.
fn parse_tool_choice(value: Option<&Value>, tools: &[Value]) -> Result<(Value, Option<Value>), ApiError> {
    let Some(choice) = value else {
        return Ok((Value::String("auto".into()), None));
    };
    let chat = match choice {
        Value::String(_) => choice.clone(),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => {
                let name = o
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::param("tool_choice.name", "a function tool_choice needs name"))?;
                if !tools.iter().any(|t| t.get("name").and_then(Value::as_str) == Some(name)) {
                    return Err(ApiError::param(
                        "tool_choice.name",
                        format!("tool_choice names '{name}', which is not in tools"),
                    ));
                }
                json!({"type": "function", "function": {"name": name}})
            }
            Some(other) => {
                return Err(ApiError::param(
                    "tool_choice.type",
                    format!("tool_choice of type '{other}' is not supported: use none, auto, required or a function"),
                ))
            }
            None => return Err(ApiError::param("tool_choice.type", "tool_choice.type is required")),
        },
        _ => return Err(type_error("tool_choice", "a string or an object")),
    };
    Ok((choice.clone(), Some(chat)))
}

/// `text` as echoed (`{"format": {"type": "text"}}` by default) and the chat
/// `response_format` for its `format`.
fn parse_text(value: Option<&Value>) -> Result<(Value, Option<Value>), ApiError> {
    let default = json!({"format": {"type": "text"}});
    let text = match value {
        None => return Ok((default, None)),
        Some(Value::Object(text)) => text,
        Some(_) => return Err(type_error("text", "an object")),
    };
    match text.get("verbosity").filter(|v| !v.is_null()) {
        None => {}
        Some(Value::String(v)) if v == "medium" => {}
        Some(_) => return Err(ApiError::param("text.verbosity", "only the default verbosity ('medium') is supported")),
    }
    let format = match text.get("format").filter(|v| !v.is_null()) {
        None => return Ok((default, None)),
        Some(Value::Object(format)) => format,
        Some(_) => return Err(type_error("text.format", "an object")),
    };
    let chat = match format.get("type").and_then(Value::as_str) {
        Some("text") => json!({"type": "text"}),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let mut spec = Map::new();
            for key in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    spec.insert(key.into(), v.clone());
                }
            }
            json!({"type": "json_schema", "json_schema": spec})
        }
        Some(other) => {
            return Err(ApiError::param("text.format.type", format!("text.format of type '{other}' is not supported")))
        }
        None => return Err(ApiError::param("text.format.type", "text.format.type is required")),
    };
    let mut echo = Map::new();
    echo.insert("format".into(), Value::Object(format.clone()));
    Ok((Value::Object(echo), Some(chat)))
}

/// Whether `include` asks for output logprobs; other values name outputs this gateway
/// never produces (hosted tools, encrypted reasoning) and so change nothing.
fn parse_include(value: Option<&Value>) -> Result<bool, ApiError> {
    let list = match value {
        None => return Ok(false),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(type_error("include", "an array of strings")),
    };
    let mut logprobs = false;
    for (i, v) in list.iter().enumerate() {
        let s = v.as_str().ok_or_else(|| type_error(&format!("include[{i}]"), "a string"))?;
        logprobs |= s == INCLUDE_LOGPROBS;
    }
    Ok(logprobs)
}

fn string(value: Option<&Value>, param: &str) -> Result<Option<String>, ApiError> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(type_error(param, "a string")),
    }
}

fn boolean(value: Option<&Value>, param: &str) -> Result<Option<bool>, ApiError> {
    match value {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(type_error(param, "a boolean")),
    }
}

pub(super) fn type_error(param: &str, expected: &str) -> ApiError {
    ApiError::param(param, format!("Invalid type for '{param}': expected {expected}."))
}

fn range(param: &str, expected: &str) -> ApiError {
    ApiError::param(param, format!("Invalid value for '{param}': expected {expected}."))
}

#[cfg(test)]
mod tests {
    use super::super::input::message;
    use super::*;

    fn parse(v: Value) -> Result<ResponsesRequest, ApiError> {
        ResponsesRequest::parse(v.to_string().as_bytes())
    }

    fn param_of(v: Value) -> String {
        let r = parse(v.clone()).and_then(|r| r.chat_request(&[]));
        match r {
            Err(ApiError::InvalidParam { param, .. }) => param,
            other => panic!("{v}: expected a param error, got {other:?}"),
        }
    }

    #[test]
    fn a_string_input_is_one_user_turn_and_instructions_lead() {
        let r =
            parse(json!({"model": "m", "input": "hi", "instructions": "be brief", "max_output_tokens": 20})).unwrap();
        let chat = r.chat_request(&[]).unwrap();
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(
            (chat.messages[0]["role"].as_str(), chat.messages[0]["content"].as_str()),
            (Some("system"), Some("be brief"))
        );
        assert_eq!(chat.messages[1]["content"], "hi");
        assert_eq!(chat.max_tokens, Some(20));
        assert!(r.store && !r.stream);
    }

    #[test]
    fn tools_formats_and_choices_translate() {
        let r = parse(json!({
            "model": "m", "input": "x",
            "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {}}, "strict": true}],
            "tool_choice": {"type": "function", "name": "weather"},
            "parallel_tool_calls": false,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}, "strict": true}},
            "include": ["message.output_text.logprobs"], "top_logprobs": 2,
            "metadata": {"run": "7"}
        }))
        .unwrap();
        let chat = r.chat_request(&[]).unwrap();
        assert_eq!(chat.tool_choice, crate::api::ToolChoice::Function("weather".into()));
        assert!(!chat.parallel_tool_calls);
        assert!(
            matches!(chat.response_format, crate::api::ResponseFormat::JsonSchema { ref name, strict: true, .. } if name == "out")
        );
        assert_eq!((chat.logprobs, chat.top_logprobs), (true, 2));
        assert_eq!(r.echo.tools[0]["name"], "weather");
        assert_eq!(r.echo.metadata["run"], "7");
    }

    #[test]
    fn history_comes_between_instructions_and_input() {
        let r = parse(json!({"model": "m", "input": "and now?", "instructions": "terse"})).unwrap();
        let history = [message("user", json!("first")), message("assistant", json!("one"))];
        let chat = r.chat_request(&history).unwrap();
        let contents: Vec<&str> = chat.messages.iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(contents, ["terse", "first", "one", "and now?"]);
    }

    #[test]
    fn every_bad_field_names_its_responses_param() {
        let base = || json!({"model": "m", "input": "x"});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            b
        };
        let cases = [
            (json!({"input": "x"}), "model"),
            (json!({"model": "m"}), "input"),
            (with("input", json!(5)), "input"),
            (with("input", json!([])), "input"),
            (with("input", json!([{"role": "robot", "content": "x"}])), "input[0].role"),
            (
                with("input", json!([{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}])),
                "input[0].content[0].type",
            ),
            (with("input", json!([{"type": "function_call", "name": "f", "arguments": "{}"}])), "input[0].call_id"),
            (with("input", json!([{"type": "function_call_output", "call_id": "c", "output": 3}])), "input[0].output"),
            (with("input", json!([{"type": "item_reference", "id": "x"}])), "input[0].type"),
            (with("tools", json!([{"type": "web_search"}])), "tools[0].type"),
            (with("tools", json!([{"type": "function", "name": "a b"}])), "tools[0].name"),
            (with("tools", json!([{"type": "function", "name": "ok", "parameters": "x"}])), "tools[0].parameters"),
            (with("tool_choice", json!({"type": "function", "name": "nope"})), "tool_choice.name"),
            (with("tool_choice", json!({"type": "allowed_tools"})), "tool_choice.type"),
            (with("tool_choice", json!("sometimes")), "tool_choice"),
            (with("text", json!({"format": {"type": "json_schema", "schema": {}}})), "text.format.name"),
            (with("text", json!({"format": {"type": "grammar"}})), "text.format.type"),
            (with("text", json!({"verbosity": "low"})), "text.verbosity"),
            (with("temperature", json!(5)), "temperature"),
            (with("top_p", json!("x")), "top_p"),
            (with("max_output_tokens", json!(0)), "max_output_tokens"),
            (with("top_logprobs", json!(30)), "top_logprobs"),
            (with("truncation", json!("auto")), "truncation"),
            (with("background", json!(true)), "background"),
            (with("reasoning", json!({"effort": "high"})), "reasoning"),
            (with("conversation", json!("conv_1")), "conversation"),
            (with("frequency_penalty", json!(1)), "frequency_penalty"),
            (with("max_tool_calls", json!(3)), "max_tool_calls"),
            (with("input", json!([{"role": "user", "content": [{"type": "input_text"}]}])), "input[0].content[0].text"),
            (with("previous_response_id", json!("../x")), "previous_response_id"),
            (with("metadata", json!({"k": 1})), "metadata.k"),
            (with("stream_options", json!({})), "stream_options"),
            (with("include", json!([1])), "include[0]"),
        ];
        for (body, param) in cases {
            assert_eq!(param_of(body.clone()), param, "{body}");
        }
    }

    #[test]
    fn chat_params_of_history_and_instructions_map_back() {
        let r = parse(json!({"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "instructions": "i"})).unwrap();
        let e = |p: &str| r.rename(ApiError::param(p, "x"), 2).param_name().map(str::to_owned);
        assert_eq!(e("messages[0].content").as_deref(), Some("instructions"));
        assert_eq!(e("messages[2]").as_deref(), Some("previous_response_id"));
        assert_eq!(e("messages[4].content[0]").as_deref(), Some("input[1].content[0]"));
        let long = r.rename(ApiError::context_length("your messages use 9000 tokens"), 2);
        assert_eq!((long.param_name(), long.to_string().as_str()), (Some("input"), "your input uses 9000 tokens"));
    }
}
