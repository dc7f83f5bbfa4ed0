//! `input` items of a `POST /v1/responses` request as chat messages: a string as one user
//! turn; `message` items with their content parts (text joined into one string, images by
//! URL, refusals kept apart); a turn's `function_call` items gathered into one assistant
//! message's `tool_calls`; `function_call_output` items as tool turns; `reasoning` items
//! dropped. Every error names its `input[i]…` param, and each message keeps the path it
//! came from so that a chat error can be renamed back (`ResponsesRequest::rename`).
//!
//! Kept apart from `request.rs`, which validates the other fields and assembles the chat body:
//! the items are a grammar of their own, and the rest of the request never looks inside them.

use serde_json::{json, Map, Value};

use super::request::type_error;
use crate::error::ApiError;

/// Chat messages.
pub(super) type Messages = Vec<Map<String, Value>>;

/// `input` as chat messages, with the param path each came from.
pub(super) fn parse_input(value: Option<&Value>) -> Result<(Messages, Vec<String>), ApiError> {
    let items = match value {
        None => return Err(ApiError::param("input", "you must provide an input parameter")),
        Some(Value::String(text)) => {
            return Ok((vec![message("user", Value::String(text.clone()))], vec!["input".to_owned()]))
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(type_error("input", "a string or an array of input items")),
    };
    let mut messages: Messages = Vec::new();
    let mut origins = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = |k: &str| format!("input[{i}].{k}");
        let Value::Object(item) = item else { return Err(type_error(&format!("input[{i}]"), "an object")) };
        let kind = match item.get("type") {
            Some(Value::String(t)) => t.as_str(),
            None | Some(Value::Null) if item.contains_key("role") => "message",
            None | Some(Value::Null) => return Err(ApiError::param(at("type"), format!("{} is required", at("type")))),
            Some(_) => return Err(type_error(&at("type"), "a string")),
        };
        match kind {
            "message" => {
                let role = match item.get("role") {
                    Some(Value::String(r)) if ["user", "system", "developer", "assistant"].contains(&r.as_str()) => r.as_str(),
                    Some(Value::String(r)) => {
                        return Err(ApiError::param(at("role"), format!("Invalid value: '{r}'. Supported values are: user, system, developer, assistant.")))
                    }
                    _ => return Err(ApiError::param(at("role"), format!("{} must be a string", at("role")))),
                };
                let (content, refusal) = parse_content(i, role, item.get("content"))?;
                let mut m = message(role, content);
                if let Some(refusal) = refusal {
                    m.insert("refusal".into(), Value::String(refusal));
                }
                messages.push(m);
                origins.push(format!("input[{i}]"));
            }
            "function_call" => {
                let field = |k: &str| match item.get(k) {
                    Some(Value::String(s)) => Ok(s.clone()),
                    _ => Err(ApiError::param(at(k), format!("{} must be a string", at(k)))),
                };
                let (call_id, name, arguments) = (field("call_id")?, field("name")?, field("arguments")?);
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls made in one turn are one assistant message, after its text if any.
                let continues = messages.last().is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
                if !continues {
                    let mut m = message("assistant", Value::Null);
                    m.insert("tool_calls".into(), Value::Array(Vec::new()));
                    messages.push(m);
                    origins.push(format!("input[{i}]"));
                }
                if let Some(Value::Array(calls)) = messages.last_mut().map(|m| m.entry("tool_calls").or_insert(Value::Array(Vec::new()))) {
                    calls.push(call);
                }
            }
            "function_call_output" => {
                let call_id = match item.get("call_id") {
                    Some(Value::String(s)) => s.clone(),
                    _ => return Err(ApiError::param(at("call_id"), format!("{} must be a string", at("call_id")))),
                };
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => joined_text(parts, &at("output"))?,
                    _ => return Err(type_error(&at("output"), "a string or an array of text parts")),
                };
                let mut m = message("tool", Value::String(output));
                m.insert("tool_call_id".into(), Value::String(call_id));
                messages.push(m);
                origins.push(format!("input[{i}]"));
            }
            // A reasoning model's notes from another server: nothing this model can use.
            "reasoning" => {}
            other => {
                return Err(ApiError::param(
                    at("type"),
                    format!("input items of type '{other}' are not supported: use message, function_call, function_call_output (or previous_response_id)"),
                ))
            }
        }
    }
    if messages.is_empty() {
        return Err(ApiError::param("input", "input must contain at least one message or tool output"));
    }
    Ok((messages, origins))
}

/// A message's content as chat content (a string, or parts when there is an image) and
/// its refusal text, if it has refusal parts.
fn parse_content(i: usize, role: &str, content: Option<&Value>) -> Result<(Value, Option<String>), ApiError> {
    let parts = match content {
        Some(Value::String(text)) => return Ok((Value::String(text.clone()), None)),
        Some(Value::Array(parts)) => parts,
        None | Some(Value::Null) => {
            return Err(ApiError::param(format!("input[{i}].content"), format!("input[{i}].content is required")))
        }
        Some(_) => return Err(type_error(&format!("input[{i}].content"), "a string or an array of content parts")),
    };
    let mut chat_parts = Vec::with_capacity(parts.len());
    let mut refusal: Option<String> = None;
    for (j, part) in parts.iter().enumerate() {
        let at = format!("input[{i}].content[{j}]");
        let kind = part.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "input_text" | "output_text" | "text" => {
                let text = part
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::param(format!("{at}.text"), format!("{at}.text must be a string")))?;
                chat_parts.push(json!({"type": "text", "text": text}));
            }
            "refusal" => {
                let text = part.get("refusal").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::param(format!("{at}.refusal"), format!("{at}.refusal must be a string"))
                })?;
                refusal.get_or_insert_with(String::new).push_str(text);
            }
            "input_image" if role != "assistant" => {
                let url = part.get("image_url").and_then(Value::as_str).ok_or_else(|| {
                    ApiError::param(
                        format!("{at}.image_url"),
                        "images are taken by URL (image_url); file ids are not supported",
                    )
                })?;
                let detail = part.get("detail").and_then(Value::as_str).unwrap_or("auto");
                chat_parts.push(json!({"type": "image_url", "image_url": {"url": url, "detail": detail}}));
            }
            "" => return Err(ApiError::param(format!("{at}.type"), "each content part needs a string `type`")),
            other => {
                return Err(ApiError::param(
                    format!("{at}.type"),
                    format!("content parts of type '{other}' are not supported here"),
                ))
            }
        }
    }
    let all_text = chat_parts.iter().all(|p| p["type"] == "text");
    let content = if all_text {
        // One string: the form every chat template renders.
        Value::String(chat_parts.iter().filter_map(|p| p["text"].as_str()).collect())
    } else {
        Value::Array(chat_parts)
    };
    Ok((content, refusal))
}

/// The text of a tool output given as content parts.
fn joined_text(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
            (Some("input_text" | "output_text" | "text"), Some(text)) => out.push_str(text),
            _ => return Err(ApiError::param(format!("{at}[{j}]"), "tool outputs may hold text parts only")),
        }
    }
    Ok(out)
}

pub(super) fn message(role: &str, content: Value) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("role".into(), Value::String(role.to_owned()));
    m.insert("content".into(), content);
    m
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::request::ResponsesRequest;

    #[test]
    fn items_become_a_tool_conversation() {
        let body = json!({"model": "m", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather in "}, {"type": "input_text", "text": "Oslo?"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather", "arguments": "{\"city\":\"Oslo\"}"},
            {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "time", "arguments": "{}"},
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "noon"}]}
        ]});
        let r = ResponsesRequest::parse(body.to_string().as_bytes()).unwrap();
        let chat = r.chat_request(&[]).unwrap();
        let roles: Vec<&str> = chat.messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool"]);
        assert_eq!(chat.messages[0]["content"], "weather in Oslo?");
        assert_eq!(chat.messages[1]["content"], "Checking.");
        assert_eq!(chat.messages[1]["tool_calls"][1]["function"]["name"], "time");
        assert_eq!(
            (chat.messages[3]["tool_call_id"].as_str(), chat.messages[3]["content"].as_str()),
            (Some("call_b"), Some("noon"))
        );
    }
}
