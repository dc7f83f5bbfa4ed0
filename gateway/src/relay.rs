//! The relay: turns a backend's [`BackendEvent`] stream into what the client asked for —
//! SSE `chat.completion.chunk`s ending in `data: [DONE]`, or one `chat.completion` object
//! (the legacy `text_completion` shape when [`ResponseMeta::shape`] says so).
//!
//! Invariants of the streamed form: every choice's first chunk carries `role`, no choice
//! gets a second role chunk; usage (when asked for) is the last chunk before `[DONE]`, with
//! `"usage": null` on the others as OpenAI does; an error after the first byte becomes a
//! `data: {"error": ...}` event and the stream ends without `[DONE]`, which the official
//! SDKs raise as an API error.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;

use bytes::Bytes;
use futures::{FutureExt, Stream, StreamExt};

use crate::api::response::{
    ChatChunk, ChatCompletion, Choice, ChunkChoice, Delta, FunctionCall, Logprobs, Message, TextChoice, TextCompletion, TextLogprobs, ToolCall,
    UsageField,
};
use crate::api::Usage;
use crate::backend::{BackendEvent, BackendResponse, ChoiceDelta, EventStream, TokenLogprob};
use crate::error::ApiError;
use crate::response_guard::ResponseGuard;

/// A batch of frames stops growing past this many bytes.
const COALESCE_BYTES: usize = 16 * 1024;

/// Identity of the response being relayed.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
    /// Which API's chunks the stream is written as.
    pub shape: Shape,
}

/// The API a response is written for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Shape {
    /// `chat.completion(.chunk)`.
    #[default]
    Chat,
    /// Legacy `text_completion`: each choice's content as `text`, no roles or tool calls.
    Text,
}

/// Called once when a response has been relayed (or abandoned), with the firewall's view.
pub type OnEnd = Box<dyn FnOnce(&ResponseGuard) + Send>;

/// The SSE body for a streaming client: only what `guard` released goes out.
pub fn sse_body(
    meta: ResponseMeta,
    backend: BackendResponse,
    mut guard: ResponseGuard,
    on_end: OnEnd,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let state = StreamState {
        meta,
        fingerprint: guard.release_fingerprint(backend.system_fingerprint),
        events: Some(backend.events),
        guard,
        on_end: Some(on_end),
        role_sent: BTreeSet::new(),
        text_offsets: BTreeMap::new(),
        usage: None,
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        let frames = st.next_frames().await;
        Some((Ok(frames), st))
    })
}

struct StreamState {
    meta: ResponseMeta,
    fingerprint: Option<String>,
    /// `None` once the backend is stopped or done.
    events: Option<EventStream>,
    guard: ResponseGuard,
    on_end: Option<OnEnd>,
    role_sent: BTreeSet<u32>,
    /// Legacy shape: characters of text each choice has sent (for `text_offset`).
    text_offsets: BTreeMap<u32, usize>,
    usage: Option<Usage>,
    ended: bool,
}

impl Drop for StreamState {
    fn drop(&mut self) {
        // A client that goes away mid-stream still gets its response accounted for.
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.guard);
        }
    }
}

impl StreamState {
    /// The next non-empty batch of frames (the stream's tail when the backend is done).
    /// Events the backend has already produced are taken in the same batch, so a fast
    /// upstream's burst goes out in one write rather than one per chunk; nothing waits for
    /// events that are not there yet.
    async fn next_frames(&mut self) -> Bytes {
        let mut out = Vec::new();
        loop {
            let next = match self.events.as_mut() {
                None => None,
                Some(events) if out.is_empty() => events.next().await,
                Some(events) => match events.next().now_or_never() {
                    Some(next) => next,
                    None => break,
                },
            };
            match next {
                Some(Ok(event)) => {
                    let released = self.guard.apply(event);
                    if self.guard.blocked() && self.guard.all_finished() {
                        // Stop the backend now: dropping its stream aborts the generation or request.
                        self.events = None;
                    }
                    out.extend_from_slice(&self.frames(released));
                }
                Some(Err(error)) => {
                    self.guard.backend_failed(&error);
                    self.end();
                    out.extend_from_slice(&error_frame(&error));
                    break;
                }
                None => {
                    let rest = self.guard.finish_all();
                    let tail = self.frames(rest);
                    out.extend_from_slice(&tail);
                    self.end();
                    if self.meta.include_usage {
                        if let Some(usage) = self.usage {
                            let frame = match self.meta.shape {
                                Shape::Chat => self.chunk(Vec::new(), UsageField::Some(usage)),
                                Shape::Text => self.text_chunk(Vec::new(), UsageField::Some(usage)),
                            };
                            out.extend_from_slice(&frame);
                        }
                    }
                    out.extend_from_slice(b"data: [DONE]\n\n");
                    break;
                }
            }
            if out.len() >= COALESCE_BYTES {
                break;
            }
        }
        Bytes::from(out)
    }

    fn end(&mut self) {
        self.ended = true;
        self.events = None;
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.guard);
        }
    }

    fn frames(&mut self, events: Vec<BackendEvent>) -> Vec<u8> {
        let mut out = Vec::new();
        for event in events {
            if let Some(frame) = self.frame_for(event) {
                out.extend_from_slice(&frame);
            }
        }
        out
    }

    /// The SSE frame for one event, if it produces one now.
    fn frame_for(&mut self, event: BackendEvent) -> Option<Bytes> {
        let usage_field = if self.meta.include_usage { UsageField::Null } else { UsageField::Absent };
        if self.meta.shape == Shape::Text {
            return self.text_frame_for(event, usage_field);
        }
        match event {
            BackendEvent::Usage(u) => {
                // Held back: usage goes last, after every choice has finished.
                self.usage = Some(u);
                None
            }
            BackendEvent::Delta(d) => {
                let role = self.take_role(d.index, d.role.clone());
                let choice = ChunkChoice {
                    index: d.index,
                    logprobs: (!d.logprobs.is_empty()).then(|| Logprobs::of(&d.logprobs)),
                    delta: Delta { role, content: d.content, refusal: d.refusal, tool_calls: d.tool_calls },
                    finish_reason: None,
                };
                Some(Bytes::from(self.chunk(vec![choice], usage_field)))
            }
            BackendEvent::Finish { index, reason } => {
                let role = self.take_role(index, None);
                let choice = ChunkChoice {
                    index,
                    delta: Delta { role, ..Delta::default() },
                    logprobs: None,
                    finish_reason: Some(reason),
                };
                Some(Bytes::from(self.chunk(vec![choice], usage_field)))
            }
        }
    }

    /// [`StreamState::frame_for`] for the legacy shape.
    fn text_frame_for(&mut self, event: BackendEvent, usage: UsageField) -> Option<Bytes> {
        let choice = match event {
            BackendEvent::Usage(u) => {
                self.usage = Some(u);
                return None;
            }
            BackendEvent::Delta(d) => {
                let text = d.content.unwrap_or_default();
                if text.is_empty() && d.logprobs.is_empty() {
                    return None;
                }
                let offset = self.text_offsets.entry(d.index).or_insert(0);
                let logprobs = (!d.logprobs.is_empty()).then(|| TextLogprobs::of(&Logprobs::of(&d.logprobs).content, *offset));
                *offset += text.chars().count();
                TextChoice { text, index: d.index, logprobs, finish_reason: None }
            }
            BackendEvent::Finish { index, reason } => TextChoice { text: String::new(), index, logprobs: None, finish_reason: Some(reason) },
        };
        Some(Bytes::from(self.text_chunk(vec![choice], usage)))
    }

    fn text_chunk(&self, choices: Vec<TextChoice>, usage: UsageField) -> Vec<u8> {
        let chunk = TextCompletion {
            id: self.meta.id.clone(),
            object: "text_completion",
            created: self.meta.created,
            model: self.meta.model.clone(),
            choices,
            usage,
            system_fingerprint: self.fingerprint.clone(),
        };
        sse_frame(&chunk)
    }

    /// `Some("assistant")` (or the backend's role) the first time a choice speaks.
    fn take_role(&mut self, index: u32, role: Option<String>) -> Option<String> {
        self.role_sent.insert(index).then(|| role.unwrap_or_else(|| "assistant".to_owned()))
    }

    fn chunk(&self, choices: Vec<ChunkChoice>, usage: UsageField) -> Vec<u8> {
        let chunk = ChatChunk {
            id: &self.meta.id,
            object: "chat.completion.chunk",
            created: self.meta.created,
            model: &self.meta.model,
            choices,
            system_fingerprint: self.fingerprint.as_deref(),
            usage,
        };
        sse_frame(&chunk)
    }
}

/// `data: <json>\n\n`.
fn sse_frame(chunk: &impl serde::Serialize) -> Vec<u8> {
    let mut frame = b"data: ".to_vec();
    // Serializing these plain structs cannot fail; an empty object keeps the frame valid.
    if serde_json::to_writer(&mut frame, chunk).is_err() {
        frame.extend_from_slice(b"{}");
    }
    frame.extend_from_slice(b"\n\n");
    frame
}

/// `data: {"error": ...}` for a failure after the stream started.
pub fn error_frame(error: &ApiError) -> Bytes {
    let mut frame = b"data: ".to_vec();
    if serde_json::to_writer(&mut frame, &error.envelope()).is_err() {
        frame.extend_from_slice(br#"{"error":{"message":"stream failed","type":"server_error"}}"#);
    }
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

/// Collects a whole completion for a non-streaming client, scanned by `guard` before any
/// byte is sent. An error anywhere fails it: nothing has been sent yet, so the client gets
/// a proper HTTP error instead.
pub async fn collect(meta: ResponseMeta, backend: BackendResponse, guard: &mut ResponseGuard) -> Result<ChatCompletion, ApiError> {
    let mut choices: BTreeMap<u32, ChoiceAcc> = BTreeMap::new();
    let mut usage = None;
    let mut events = backend.events;
    let mut absorb = |released: Vec<BackendEvent>, choices: &mut BTreeMap<u32, ChoiceAcc>| {
        for event in released {
            match event {
                BackendEvent::Delta(d) => choices.entry(d.index).or_default().absorb(d),
                BackendEvent::Finish { index, reason } => choices.entry(index).or_default().finish = Some(reason),
                BackendEvent::Usage(u) => usage = Some(u),
            }
        }
    };
    while let Some(event) = events.next().await {
        let event = event.inspect_err(|e| guard.backend_failed(e))?;
        absorb(guard.apply(event), &mut choices);
        if guard.blocked() && guard.all_finished() {
            break;
        }
    }
    drop(events);
    absorb(guard.finish_all(), &mut choices);
    Ok(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: choices.into_iter().map(|(index, acc)| acc.into_choice(index)).collect(),
        usage,
        system_fingerprint: guard.release_fingerprint(backend.system_fingerprint),
    })
}

/// One choice being assembled from deltas.
#[derive(Default)]
struct ChoiceAcc {
    role: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u32, ToolCall>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<String>,
}

impl ChoiceAcc {
    fn absorb(&mut self, d: ChoiceDelta) {
        if self.role.is_none() {
            self.role = d.role;
        }
        if let Some(text) = d.content {
            self.content.get_or_insert_with(String::new).push_str(&text);
        }
        if let Some(text) = d.refusal {
            self.refusal.get_or_insert_with(String::new).push_str(&text);
        }
        for frag in d.tool_calls {
            let call = self.tool_calls.entry(frag.index).or_insert_with(|| ToolCall {
                id: String::new(),
                kind: "function".to_owned(),
                function: FunctionCall { name: String::new(), arguments: String::new() },
            });
            if let Some(id) = frag.id {
                call.id = id;
            }
            if let Some(kind) = frag.kind {
                call.kind = kind;
            }
            if let Some(name) = frag.function.name {
                call.function.name.push_str(&name);
            }
            if let Some(args) = frag.function.arguments {
                call.function.arguments.push_str(&args);
            }
        }
        self.logprobs.extend(d.logprobs);
    }

    fn into_choice(self, index: u32) -> Choice {
        Choice {
            index,
            message: Message {
                role: self.role.unwrap_or_else(|| "assistant".to_owned()),
                content: self.content,
                refusal: self.refusal,
                tool_calls: self.tool_calls.into_values().collect(),
            },
            logprobs: (!self.logprobs.is_empty()).then(|| Logprobs::of(&self.logprobs)),
            finish_reason: Some(self.finish.unwrap_or_else(|| "stop".to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::response::{FunctionChunk, ToolCallChunk};

    fn meta(include_usage: bool) -> ResponseMeta {
        ResponseMeta { id: "chatcmpl-1".into(), created: 1, model: "m".into(), include_usage, shape: Shape::Chat }
    }

    fn backend(events: Vec<Result<BackendEvent, ApiError>>) -> BackendResponse {
        BackendResponse { system_fingerprint: None, events: Box::pin(futures::stream::iter(events)) }
    }

    fn text(index: u32, s: &str) -> Result<BackendEvent, ApiError> {
        Ok(BackendEvent::Delta(ChoiceDelta { index, content: Some(s.into()), ..Default::default() }))
    }

    fn finish(index: u32) -> Result<BackendEvent, ApiError> {
        Ok(BackendEvent::Finish { index, reason: "stop".into() })
    }

    fn open_guard(n: u32) -> ResponseGuard {
        let rules = std::sync::Arc::new(firewall::Ruleset::empty());
        let settings = crate::response_guard::GuardSettings::new(rules, firewall::ScanContext::new("t"), std::sync::Arc::new(firewall::Detectors::default()));
        ResponseGuard::new(crate::response_guard::GuardSettings { choices: n, ..settings })
    }

    async fn frames(events: Vec<Result<BackendEvent, ApiError>>, include_usage: bool) -> Vec<String> {
        let body: Vec<_> = sse_body(meta(include_usage), backend(events), open_guard(2), Box::new(|_| {})).collect().await;
        let joined: String = body.into_iter().map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap()).collect();
        joined.split("\n\n").filter(|f| !f.is_empty()).map(|f| f.trim_start_matches("data: ").to_owned()).collect()
    }

    #[tokio::test]
    async fn stream_has_one_role_per_choice_usage_last_and_done() {
        let usage = Usage { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 };
        let f = frames(
            vec![text(0, "a"), text(1, "x"), Ok(BackendEvent::Usage(usage)), text(0, "b"), finish(0), finish(1)],
            true,
        )
        .await;
        assert_eq!(f.last().unwrap(), "[DONE]");
        let chunks: Vec<serde_json::Value> = f[..f.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
        let roles: Vec<_> = chunks.iter().filter(|c| c["choices"][0]["delta"]["role"].is_string()).collect();
        assert_eq!(roles.len(), 2);
        let last = chunks.last().unwrap();
        assert_eq!(last["usage"]["total_tokens"], 3);
        assert_eq!(last["choices"].as_array().unwrap().len(), 0);
        assert!(chunks[0]["usage"].is_null() && chunks[0].get("usage").is_some());
    }

    #[tokio::test]
    async fn the_legacy_shape_streams_text_chunks_with_offsets_and_usage_last() {
        let usage = Usage { prompt_tokens: 1, completion_tokens: 2, total_tokens: 3 };
        let with_logprob = |s: &str| {
            Ok(BackendEvent::Delta(ChoiceDelta {
                index: 0,
                content: Some(s.into()),
                logprobs: vec![TokenLogprob { token: s.into(), logprob: -0.5, top_logprobs: Vec::new() }],
                ..Default::default()
            }))
        };
        let meta = ResponseMeta { id: "cmpl-1".into(), shape: Shape::Text, ..meta(true) };
        let events = vec![with_logprob("Hé"), with_logprob("llo"), Ok(BackendEvent::Usage(usage)), finish(0)];
        let body: Vec<_> = sse_body(meta, backend(events), open_guard(1), Box::new(|_| {})).collect().await;
        let joined: String = body.into_iter().map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap()).collect();
        let frames: Vec<&str> = joined.split("\n\n").filter(|f| !f.is_empty()).map(|f| f.trim_start_matches("data: ")).collect();
        assert_eq!(frames.last(), Some(&"[DONE]"));
        let chunks: Vec<serde_json::Value> = frames[..frames.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
        assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c["id"] == "cmpl-1"));
        assert_eq!(chunks[0]["choices"][0]["text"], "Hé");
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["text_offset"][0], 2);
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["tokens"][0], "llo");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[3]["usage"]["total_tokens"], 3);
        assert!(chunks.iter().all(|c| c["choices"].as_array().is_some_and(|l| l.iter().all(|ch| ch.get("delta").is_none()))));
    }

    #[tokio::test]
    async fn errors_mid_stream_end_it_without_done() {
        let f = frames(vec![text(0, "a"), Err(ApiError::BadGateway("cut".into())), text(0, "never")], false).await;
        assert_eq!(f.len(), 2);
        assert!(f[1].contains("\"error\"") && f[1].contains("cut"));
    }

    #[tokio::test]
    async fn collect_merges_text_and_tool_call_fragments() {
        let call = |id: Option<&str>, args: &str| {
            Ok(BackendEvent::Delta(ChoiceDelta {
                index: 0,
                tool_calls: vec![ToolCallChunk {
                    index: 0,
                    id: id.map(str::to_owned),
                    kind: id.map(|_| "function".to_owned()),
                    function: FunctionChunk { name: id.map(|_| "lookup".to_owned()), arguments: Some(args.into()) },
                }],
                ..Default::default()
            }))
        };
        let events = vec![text(0, "Hel"), text(0, "lo"), call(Some("c1"), "{\"q\":"), call(None, "1}"), finish(0)];
        let c = collect(meta(false), backend(events), &mut open_guard(1))
            .await
            .unwrap();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "Hello");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"q\":1}");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["id"], "c1");
        assert_eq!(v["object"], "chat.completion");
    }

    #[tokio::test]
    async fn collect_fails_whole_on_error() {
        let mut guard = open_guard(1);
        let r = collect(meta(false), backend(vec![text(0, "a"), Err(ApiError::GatewayTimeout("slow".into()))]), &mut guard).await;
        assert_eq!(r.unwrap_err().status(), 504);
        assert_eq!(guard.backend_error().map(ApiError::kind), Some("upstream_error"), "the guard's outcome holds it");
    }

    #[tokio::test]
    async fn an_upstream_error_event_goes_out_as_its_fixed_message_and_is_recorded() {
        let error = ApiError::UpstreamFailed { status: None, request_id: "req-5".into(), detail: "upstream message GLOB**** (20 chars)".into() };
        let (tx, rx) = std::sync::mpsc::channel();
        let on_end: OnEnd = Box::new(move |g| {
            let _ = tx.send(g.backend_error().map(|e| e.status().as_u16()));
        });
        let body: Vec<_> = sse_body(meta(false), backend(vec![text(0, "a"), Err(error)]), open_guard(1), on_end).collect().await;
        let text: String = body.into_iter().map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap()).collect();
        assert!(text.contains("req-5") && !text.contains("GLOB") && !text.contains("[DONE]"), "{text}");
        assert_eq!(rx.recv().unwrap(), Some(502));
    }
}
