//! The Responses API objects the gateway writes: the `response` object, its output items
//! (`message` with `output_text` / `refusal` parts, `function_call`), usage, and the chat
//! turn a stored response continues from.
//!
//! A response is built from what the response guard released and nothing else: a blocked
//! response is `incomplete` with `incomplete_details.reason = "content_filter"`, holding the
//! text released before the block.

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::request::Echo;
use crate::api::response::LogprobContent;
use crate::api::Usage;
use crate::error::ApiError;

/// A `response` object: the whole answer, or a stream's snapshot.
#[derive(Debug, Clone, Serialize)]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    pub status: Status,
    pub completed_at: Option<u64>,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<Incomplete>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub background: bool,
    pub reasoning: Value,
    pub service_tier: &'static str,
    #[serde(flatten)]
    pub echo: Echo,
}

/// A response's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

/// Why a response is incomplete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Incomplete {
    pub reason: &'static str,
}

/// A failed response's `error`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ResponseError {
    pub code: String,
    pub message: String,
}

impl ResponseError {
    /// The client's view of a backend failure (its fixed message, never an upstream's words).
    pub fn of(error: &ApiError) -> ResponseError {
        ResponseError { code: error.code().unwrap_or_else(|| error.kind().to_owned()), message: error.to_string() }
    }
}

/// One entry of `output`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message { id: String, status: ItemStatus, role: &'static str, content: Vec<OutputContent> },
    FunctionCall { id: String, call_id: String, name: String, arguments: String, status: ItemStatus },
}

/// An output item's `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// A part of an output message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputContent {
    OutputText { text: String, annotations: Vec<Value>, logprobs: Vec<LogprobContent> },
    Refusal { refusal: String },
}

/// `usage` of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u64,
    pub input_tokens_details: InputDetails,
    pub output_tokens: u64,
    pub output_tokens_details: OutputDetails,
    pub total_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InputDetails {
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct OutputDetails {
    pub reasoning_tokens: u64,
}

impl From<Usage> for ResponseUsage {
    fn from(u: Usage) -> ResponseUsage {
        ResponseUsage {
            input_tokens: u.prompt_tokens,
            input_tokens_details: InputDetails { cached_tokens: 0 },
            output_tokens: u.completion_tokens,
            output_tokens_details: OutputDetails { reasoning_tokens: 0 },
            total_tokens: u.total_tokens,
        }
    }
}

/// A fresh item id: `msg_…`, `fc_…`.
pub fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// The response's status and incomplete reason for a choice's `finish_reason`.
pub fn outcome(finish_reason: Option<&str>) -> (Status, Option<Incomplete>) {
    match finish_reason {
        Some("length") => (Status::Incomplete, Some(Incomplete { reason: "max_output_tokens" })),
        Some("content_filter") => (Status::Incomplete, Some(Incomplete { reason: "content_filter" })),
        _ => (Status::Completed, None),
    }
}

impl ResponseObject {
    /// The response before any output: `in_progress`.
    pub fn started(id: String, created_at: u64, model: String, echo: Echo) -> ResponseObject {
        ResponseObject {
            id,
            object: "response",
            created_at,
            status: Status::InProgress,
            completed_at: None,
            error: None,
            incomplete_details: None,
            model,
            output: Vec::new(),
            usage: None,
            background: false,
            reasoning: json!({"effort": null, "summary": null}),
            service_tier: "default",
            echo,
        }
    }

    /// Ends the response with its output, the finish reason of its one choice and usage.
    pub fn finish(&mut self, output: Vec<OutputItem>, finish_reason: Option<&str>, usage: Option<Usage>, now: u64) {
        let (status, incomplete) = outcome(finish_reason);
        self.status = status;
        self.incomplete_details = incomplete;
        self.output = output;
        self.usage = usage.map(ResponseUsage::from);
        self.completed_at = (status == Status::Completed).then_some(now);
    }

    /// The response ended by a backend failure, with what was released before it.
    pub fn fail(&mut self, output: Vec<OutputItem>, error: &ApiError) {
        self.status = Status::Failed;
        self.output = output;
        self.error = Some(ResponseError::of(error));
    }

    /// The concatenated `output_text` of every message (what the SDKs call `output_text`).
    pub fn output_text(&self) -> String {
        let mut out = String::new();
        for item in &self.output {
            if let OutputItem::Message { content, .. } = item {
                for part in content {
                    if let OutputContent::OutputText { text, .. } = part {
                        out.push_str(text);
                    }
                }
            }
        }
        out
    }

    /// The output as the assistant's chat turn, for the stored conversation a later
    /// `previous_response_id` continues.
    pub fn assistant_turn(&self) -> Map<String, Value> {
        let mut turn = Map::new();
        turn.insert("role".into(), json!("assistant"));
        let mut refusal = String::new();
        let mut calls = Vec::new();
        for item in &self.output {
            match item {
                OutputItem::Message { content, .. } => {
                    for part in content {
                        if let OutputContent::Refusal { refusal: r } = part {
                            refusal.push_str(r);
                        }
                    }
                }
                // A call cut off (by a block or the token limit) has no result to come:
                // continuing from it would send a call without its answer.
                OutputItem::FunctionCall { status, .. } if *status != ItemStatus::Completed => {}
                OutputItem::FunctionCall { call_id, name, arguments, .. } => {
                    calls.push(
                        json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}),
                    );
                }
            }
        }
        let text = self.output_text();
        let content = if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) };
        turn.insert("content".into(), content);
        if !refusal.is_empty() {
            turn.insert("refusal".into(), Value::String(refusal));
        }
        if !calls.is_empty() {
            turn.insert("tool_calls".into(), Value::Array(calls));
        }
        turn
    }
}

/// What the store keeps of a response: the object (for `GET /v1/responses/{id}`) and the
/// conversation it ends, as chat messages without `instructions` (which, as in OpenAI's
/// API, a later request does not inherit).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct StoredResponse {
    pub response: Value,
    pub conversation: Vec<Map<String, Value>>,
}

impl StoredResponse {
    /// The record for `response`, continuing `conversation` (history and this input).
    pub fn new(response: &ResponseObject, mut conversation: Vec<Map<String, Value>>) -> StoredResponse {
        conversation.push(response.assistant_turn());
        StoredResponse { response: serde_json::to_value(response).unwrap_or(Value::Null), conversation }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started() -> ResponseObject {
        let echo = super::super::request::ResponsesRequest::parse(br#"{"model": "m", "input": "x"}"#).unwrap().echo;
        ResponseObject::started("resp_1".into(), 1, "m".into(), echo)
    }

    fn call(call_id: &str, status: ItemStatus) -> OutputItem {
        OutputItem::FunctionCall {
            id: item_id("fc"),
            call_id: call_id.into(),
            name: "f".into(),
            arguments: "{}".into(),
            status,
        }
    }

    #[test]
    fn the_stored_turn_holds_the_text_and_the_finished_calls_only() {
        let mut r = started();
        let text = OutputContent::OutputText { text: "Hi".into(), annotations: Vec::new(), logprobs: Vec::new() };
        let message = OutputItem::Message {
            id: item_id("msg"),
            status: ItemStatus::Completed,
            role: "assistant",
            content: vec![text],
        };
        r.finish(
            vec![message, call("call_1", ItemStatus::Completed), call("call_2", ItemStatus::Incomplete)],
            Some("length"),
            None,
            2,
        );
        assert_eq!(
            (r.status, r.incomplete_details.as_ref().map(|i| i.reason)),
            (Status::Incomplete, Some("max_output_tokens"))
        );
        let turn = r.assistant_turn();
        assert_eq!(turn["content"], "Hi");
        assert_eq!(turn["tool_calls"].as_array().map(Vec::len), Some(1), "the cut-off call is left out: {turn:?}");
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!((v["object"].as_str(), v["text"]["format"]["type"].as_str()), (Some("response"), Some("text")));
        assert!(v["completed_at"].is_null());
    }
}
