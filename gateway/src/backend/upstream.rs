//! The upstream backend: any OpenAI-compatible server, reached over a pooled `reqwest`
//! client. The client's request body goes upstream untouched except for `model` (renamed
//! to the upstream's name). Streamed answers are parsed from SSE back into
//! [`BackendEvent`]s; whole answers are converted to the same events, so the relay never
//! sees the wire. Timeouts: connect, first byte (headers), and idle between body chunks.
//! Upstream failures become OpenAI errors: client errors the caller caused keep their
//! status, everything else is a 502, and a timeout a 504; what of an upstream's error text
//! may reach a client is [`super::upstream_error`]'s decision (none of it).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::sse::{SseEvent, SseParser};
use super::{upstream_error, BackendEvent, BackendResponse, ChoiceDelta, EventStream, RequestContext, TokenLogprob};
use crate::api::response::{FunctionChunk, ToolCallChunk};
use crate::api::{ChatRequest, Usage};
use crate::config::UpstreamConfig;
use crate::error::ApiError;

/// Largest non-streamed upstream body (or error body) the gateway reads.
const MAX_UPSTREAM_BODY_BYTES: usize = 64 * 1024 * 1024;

/// One configured upstream model.
pub struct UpstreamBackend {
    config: UpstreamConfig,
    client: reqwest::Client,
    /// Parsed once: parsing per request (with IDNA) showed up in the overhead profile.
    url: reqwest::Url,
}

impl UpstreamBackend {
    pub fn new(config: UpstreamConfig) -> Result<Self, ApiError> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ApiError::Internal(format!("cannot build HTTP client: {e}")))?;
        let url = reqwest::Url::parse(&format!("{}/chat/completions", config.base_url))
            .map_err(|e| ApiError::Internal(format!("invalid upstream URL {}: {e}", config.base_url)))?;
        Ok(UpstreamBackend { config, client, url })
    }

    pub async fn complete(&self, request: &ChatRequest, ctx: &RequestContext) -> Result<BackendResponse, ApiError> {
        let mut body = request.raw.clone();
        body.insert("model".into(), Value::String(self.config.upstream_model.clone()));
        let mut builder = self.client.post(self.url.clone()).header("x-request-id", &ctx.request_id).json(&body);
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key.expose());
        }
        let first_byte = Duration::from_millis(self.config.first_byte_timeout_ms);
        let response = match tokio::time::timeout(first_byte, builder.send()).await {
            Err(_) => return Err(timeout_error(first_byte, "to start answering")),
            Ok(Err(e)) if e.is_timeout() => return Err(timeout_error(first_byte, "to start answering")),
            Ok(Err(e)) => return Err(ApiError::BadGateway(format!("upstream request failed: {}", error_chain(&e)))),
            Ok(Ok(r)) => r,
        };
        let idle = Duration::from_millis(self.config.idle_timeout_ms);
        let status = response.status();
        if !status.is_success() {
            let body = read_body(response, idle).await.unwrap_or_default();
            return Err(upstream_error::from_status(status.as_u16(), &body, &ctx.request_id));
        }
        let is_sse = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));
        if request.stream && is_sse {
            let parser = SseParser::with_max_event_bytes(self.config.max_stream_event_bytes);
            let events = sse_events(response.bytes_stream(), parser, idle, ctx.request_id.clone());
            return Ok(BackendResponse { system_fingerprint: None, events });
        }
        let body = read_body(response, idle).await?;
        let completion: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::BadGateway(format!("upstream answered with invalid JSON: {e}")))?;
        let system_fingerprint = completion.get("system_fingerprint").and_then(Value::as_str).map(str::to_owned);
        let events = completion_events(&completion)?;
        Ok(BackendResponse { system_fingerprint, events: Box::pin(futures::stream::iter(events.into_iter().map(Ok))) })
    }
}

fn timeout_error(limit: Duration, what: &str) -> ApiError {
    ApiError::GatewayTimeout(format!("The upstream took longer than {} ms {what}.", limit.as_millis()))
}

/// `reqwest` hides the useful part (connection refused, ...) in the source chain.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Reads a whole body with an idle timeout between pieces and a size cap.
async fn read_body(response: reqwest::Response, idle: Duration) -> Result<Vec<u8>, ApiError> {
    let mut stream = response.bytes_stream();
    let mut body = Vec::new();
    loop {
        match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return Err(timeout_error(idle, "between two pieces of its answer")),
            Ok(None) => return Ok(body),
            Ok(Some(Err(e))) => {
                return Err(ApiError::BadGateway(format!("upstream connection failed: {}", error_chain(&e))))
            }
            Ok(Some(Ok(piece))) => {
                if body.len() + piece.len() > MAX_UPSTREAM_BODY_BYTES {
                    return Err(ApiError::BadGateway(format!(
                        "upstream answer is larger than {MAX_UPSTREAM_BODY_BYTES} bytes"
                    )));
                }
                body.extend_from_slice(&piece);
            }
        }
    }
}

/// Turns an SSE body into events with `parser`; `[DONE]` ends it, silence past `idle` and
/// an event past the parser's cap are errors.
fn sse_events(
    body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    parser: SseParser,
    idle: Duration,
    request_id: String,
) -> EventStream {
    let state = SseEvents { body: Box::pin(body), parser, queue: VecDeque::new(), done: false, request_id };
    Box::pin(futures::stream::unfold(state, move |mut st| async move {
        loop {
            if let Some(item) = st.queue.pop_front() {
                if item.is_err() {
                    // An error ends the stream: nothing after it is delivered.
                    st.done = true;
                    st.queue.clear();
                }
                return Some((item, st));
            }
            if st.done {
                return None;
            }
            st.read_next(idle).await;
        }
    }))
}

/// The state of one upstream SSE body being turned into events.
struct SseEvents<S> {
    body: std::pin::Pin<Box<S>>,
    parser: SseParser,
    /// Events parsed but not yet delivered, in order; an `Err` is always last.
    queue: VecDeque<Result<BackendEvent, ApiError>>,
    /// `[DONE]` seen or an error queued: read no further.
    done: bool,
    /// Named in the client's message when the upstream reports an error mid-stream.
    request_id: String,
}

impl<S: Stream<Item = reqwest::Result<Bytes>>> SseEvents<S> {
    /// Reads one piece of the body and queues what it completes.
    async fn read_next(&mut self, idle: Duration) {
        let mut events: Vec<SseEvent> = Vec::new();
        match tokio::time::timeout(idle, self.body.next()).await {
            Err(_) => self.fail(timeout_error(idle, "between two stream chunks")),
            Ok(Some(Err(e))) => {
                self.fail(ApiError::BadGateway(format!("upstream stream broke off: {}", error_chain(&e))))
            }
            Ok(Some(Ok(bytes))) => match self.parser.push(&bytes, &mut events) {
                Ok(()) => self.absorb(events),
                Err(e) => self.fail(ApiError::BadGateway(format!("upstream stream: {e}"))),
            },
            Ok(None) => {
                let _ = self.parser.finish(&mut events);
                self.absorb(events);
                if !self.done {
                    self.fail(ApiError::BadGateway("upstream stream ended before [DONE]".into()));
                }
            }
        }
    }

    fn absorb(&mut self, events: Vec<SseEvent>) {
        for ev in events {
            if self.done {
                return;
            }
            if ev.data.trim() == "[DONE]" {
                self.done = true;
                return;
            }
            match chunk_events(&ev.data, &self.request_id) {
                Ok(list) => self.queue.extend(list.into_iter().map(Ok)),
                Err(e) => self.fail(e),
            }
        }
    }

    fn fail(&mut self, error: ApiError) {
        self.queue.push_back(Err(error));
        self.done = true;
    }
}

/// Events from one `chat.completion.chunk` JSON payload.
fn chunk_events(data: &str, request_id: &str) -> Result<Vec<BackendEvent>, ApiError> {
    let chunk: Value = serde_json::from_str(data)
        .map_err(|e| ApiError::BadGateway(format!("upstream sent an invalid stream chunk: {e}")))?;
    if let Some(err) = chunk.get("error") {
        return Err(upstream_error::from_stream_event(err, request_id));
    }
    let mut events = Vec::new();
    for choice in chunk.get("choices").and_then(Value::as_array).into_iter().flatten() {
        let index = choice_index(choice);
        if let Some(delta) = choice.get("delta").and_then(Value::as_object) {
            let d = delta_from(index, delta, choice.get("logprobs"));
            if d != (ChoiceDelta { index, ..ChoiceDelta::default() }) {
                events.push(BackendEvent::Delta(d));
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            events.push(BackendEvent::Finish { index, reason: reason.to_owned() });
        }
    }
    if let Some(usage) = parse_usage(&chunk) {
        events.push(BackendEvent::Usage(usage));
    }
    Ok(events)
}

/// Events equivalent to one whole `chat.completion` object.
fn completion_events(completion: &Value) -> Result<Vec<BackendEvent>, ApiError> {
    let choices = completion
        .get("choices")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::BadGateway("upstream answer has no `choices` array".into()))?;
    let mut events = Vec::new();
    for choice in choices {
        let index = choice_index(choice);
        let message = choice.get("message").and_then(Value::as_object).cloned().unwrap_or_default();
        let mut delta = delta_from(index, &message, choice.get("logprobs"));
        // A whole message's tool calls have no stream index: their position is it.
        for (i, call) in delta.tool_calls.iter_mut().enumerate() {
            call.index = i as u32;
        }
        events.push(BackendEvent::Delta(delta));
        let reason = choice.get("finish_reason").and_then(Value::as_str).unwrap_or("stop");
        events.push(BackendEvent::Finish { index, reason: reason.to_owned() });
    }
    if let Some(usage) = parse_usage(completion) {
        events.push(BackendEvent::Usage(usage));
    }
    Ok(events)
}

fn choice_index(choice: &Value) -> u32 {
    choice.get("index").and_then(Value::as_u64).unwrap_or(0) as u32
}

fn delta_from(index: u32, delta: &Map<String, Value>, logprobs: Option<&Value>) -> ChoiceDelta {
    let text = |k: &str| delta.get(k).and_then(Value::as_str).map(str::to_owned);
    let tool_calls = delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| {
            let f = call.get("function");
            let ftext = |k: &str| f.and_then(|f| f.get(k)).and_then(Value::as_str).map(str::to_owned);
            ToolCallChunk {
                index: call.get("index").and_then(Value::as_u64).unwrap_or(0) as u32,
                id: call.get("id").and_then(Value::as_str).map(str::to_owned),
                kind: call.get("type").and_then(Value::as_str).map(str::to_owned),
                function: FunctionChunk { name: ftext("name"), arguments: ftext("arguments") },
            }
        })
        .collect();
    ChoiceDelta {
        index,
        role: text("role"),
        content: text("content"),
        refusal: text("refusal"),
        tool_calls,
        logprobs: logprob_entries(logprobs),
        signals: None,
    }
}

/// The typed `logprobs.content` entries of a choice. An entry that does not fit the type
/// (no token, a logprob that is not a number) is dropped: nothing of it can be vouched for.
fn logprob_entries(logprobs: Option<&Value>) -> Vec<TokenLogprob> {
    let entries =
        logprobs.and_then(|l| l.get("content")).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    entries.iter().filter_map(|e| TokenLogprob::deserialize(e).ok()).collect()
}

fn parse_usage(v: &Value) -> Option<Usage> {
    let u = v.get("usage").filter(|u| u.is_object())?;
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        prompt_tokens: n("prompt_tokens"),
        completion_tokens: n("completion_tokens"),
        total_tokens: n("total_tokens"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chunk_with_content_tool_call_finish_and_usage() {
        let data = json!({
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": null},
                {"index": 1, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                    "function": {"name": "f", "arguments": "{\"a\""}}]}, "finish_reason": "tool_calls"}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        });
        let ev = chunk_events(&data.to_string(), "r").unwrap();
        assert_eq!(ev.len(), 4);
        let BackendEvent::Delta(d) = &ev[0] else { panic!() };
        assert_eq!((d.role.as_deref(), d.content.as_deref()), (Some("assistant"), Some("Hel")));
        let BackendEvent::Delta(t) = &ev[1] else { panic!() };
        assert_eq!(t.tool_calls[0].function.arguments.as_deref(), Some("{\"a\""));
        assert_eq!(ev[2], BackendEvent::Finish { index: 1, reason: "tool_calls".into() });
        assert_eq!(ev[3], BackendEvent::Usage(Usage { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }));
    }

    #[test]
    fn error_chunks_and_garbage_are_bad_gateway() {
        let e = chunk_events(r#"{"error":{"message":"boom"}}"#, "req-3").unwrap_err();
        assert_eq!(e.status(), 502);
        assert!(!e.to_string().contains("boom") && e.to_string().contains("req-3"), "{e}");
        assert_eq!(chunk_events("not json", "r").unwrap_err().status(), 502);
    }

    #[test]
    fn whole_completion_becomes_events() {
        let c = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]});
        let ev = completion_events(&c).unwrap();
        assert_eq!(ev.len(), 2);
        assert!(completion_events(&json!({"id": "x"})).is_err());
    }

    #[test]
    fn logprob_entries_are_typed_and_odd_ones_dropped() {
        let lp = json!({"content": [
            {"token": "Hi", "logprob": -0.5, "bytes": [1, 2, 3], "extra": "cg-x", "top_logprobs": [{"token": "Hi", "logprob": -0.5, "bytes": [9]}]},
            {"token": 5, "logprob": -0.5},
            {"token": "x", "logprob": null},
            {"token": "y", "logprob": -1.0, "top_logprobs": null}
        ]});
        let entries = logprob_entries(Some(&lp));
        assert_eq!(entries.len(), 2);
        assert!(entries[1].top_logprobs.is_empty());
        assert_eq!((entries[0].token.as_str(), entries[0].top_logprobs.len()), ("Hi", 1));
    }
}
