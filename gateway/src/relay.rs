//! The relay: turns a backend's [`BackendEvent`] stream into what the client asked for —
//! SSE `chat.completion.chunk`s ending in `data: [DONE]`, or one `chat.completion` object.
//!
//! Invariants of the streamed form: every choice's first chunk carries `role`, no choice
//! gets a second role chunk; usage (when asked for) is the last chunk before `[DONE]`, with
//! `"usage": null` on the others as OpenAI does; an error after the first byte becomes a
//! `data: {"error": ...}` event and the stream ends without `[DONE]`, which the official
//! SDKs raise as an API error.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;

use bytes::Bytes;
use futures::{Stream, StreamExt};

use crate::api::response::{
    ChatChunk, ChatCompletion, Choice, ChunkChoice, Delta, FunctionCall, Logprobs, Message, ToolCall, UsageField,
};
use crate::api::Usage;
use crate::backend::{BackendEvent, BackendResponse, ChoiceDelta, EventStream};
use crate::error::ApiError;

/// Identity of the response being relayed.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub include_usage: bool,
}

/// The SSE body for a streaming client.
pub fn sse_body(meta: ResponseMeta, backend: BackendResponse) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let state = StreamState {
        meta,
        fingerprint: backend.system_fingerprint,
        events: backend.events,
        role_sent: BTreeSet::new(),
        usage: None,
        ended: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.ended {
            return None;
        }
        loop {
            match st.events.next().await {
                Some(Ok(event)) => {
                    if let Some(frame) = st.frame_for(event) {
                        return Some((Ok(frame), st));
                    }
                }
                Some(Err(error)) => {
                    st.ended = true;
                    return Some((Ok(error_frame(&error)), st));
                }
                None => {
                    st.ended = true;
                    let mut tail = Vec::new();
                    if st.meta.include_usage {
                        let usage = st.usage.unwrap_or_default();
                        tail.extend_from_slice(&st.chunk(Vec::new(), UsageField::Some(usage)));
                    }
                    tail.extend_from_slice(b"data: [DONE]\n\n");
                    return Some((Ok(Bytes::from(tail)), st));
                }
            }
        }
    })
}

struct StreamState {
    meta: ResponseMeta,
    fingerprint: Option<String>,
    events: EventStream,
    role_sent: BTreeSet<u32>,
    usage: Option<Usage>,
    ended: bool,
}

impl StreamState {
    /// The SSE frame for one event, if it produces one now.
    fn frame_for(&mut self, event: BackendEvent) -> Option<Bytes> {
        let usage_field = if self.meta.include_usage { UsageField::Null } else { UsageField::Absent };
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
                    logprobs: (!d.logprobs.is_empty()).then(|| Logprobs { content: d.logprobs }),
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
        let mut frame = b"data: ".to_vec();
        // Serializing these plain structs cannot fail; an empty object keeps the frame valid.
        if serde_json::to_writer(&mut frame, &chunk).is_err() {
            frame.extend_from_slice(b"{}");
        }
        frame.extend_from_slice(b"\n\n");
        frame
    }
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

/// Collects a whole completion for a non-streaming client. An error anywhere fails it:
/// nothing has been sent yet, so the client gets a proper HTTP error instead.
pub async fn collect(meta: ResponseMeta, backend: BackendResponse) -> Result<ChatCompletion, ApiError> {
    let mut choices: BTreeMap<u32, ChoiceAcc> = BTreeMap::new();
    let mut usage = None;
    let mut events = backend.events;
    while let Some(event) = events.next().await {
        match event? {
            BackendEvent::Delta(d) => choices.entry(d.index).or_default().absorb(d),
            BackendEvent::Finish { index, reason } => choices.entry(index).or_default().finish = Some(reason),
            BackendEvent::Usage(u) => usage = Some(u),
        }
    }
    Ok(ChatCompletion {
        id: meta.id,
        object: "chat.completion",
        created: meta.created,
        model: meta.model,
        choices: choices.into_iter().map(|(index, acc)| acc.into_choice(index)).collect(),
        usage,
        system_fingerprint: backend.system_fingerprint,
    })
}

/// One choice being assembled from deltas.
#[derive(Default)]
struct ChoiceAcc {
    role: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u32, ToolCall>,
    logprobs: Vec<serde_json::Value>,
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
            logprobs: (!self.logprobs.is_empty()).then(|| Logprobs { content: self.logprobs }),
            finish_reason: Some(self.finish.unwrap_or_else(|| "stop".to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::response::{FunctionChunk, ToolCallChunk};

    fn meta(include_usage: bool) -> ResponseMeta {
        ResponseMeta { id: "chatcmpl-1".into(), created: 1, model: "m".into(), include_usage }
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

    async fn frames(events: Vec<Result<BackendEvent, ApiError>>, include_usage: bool) -> Vec<String> {
        let body: Vec<_> = sse_body(meta(include_usage), backend(events)).collect().await;
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
        let c = collect(meta(false), backend(vec![text(0, "Hel"), text(0, "lo"), call(Some("c1"), "{\"q\":"), call(None, "1}"), finish(0)]))
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
        let r = collect(meta(false), backend(vec![text(0, "a"), Err(ApiError::GatewayTimeout("slow".into()))])).await;
        assert_eq!(r.unwrap_err().status(), 504);
    }
}
