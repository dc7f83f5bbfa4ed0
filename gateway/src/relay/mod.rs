//! The relay: turns a backend's [`BackendEvent`] stream into what the client asked for —
//! an SSE stream written by a [`Framing`] (chat chunks ending in `data: [DONE]`, legacy
//! text chunks, or the Responses API's typed events), or one `chat.completion` object
//! ([`collect`]) that the routes turn into their own shapes.
//!
//! Files: `chunks.rs` (`chat.completion.chunk` and `text_completion` streams),
//! `responses.rs` (Responses API events). Whatever the framing, only what the
//! [`ResponseGuard`] released is written, and the backend is dropped (stopped) as soon as
//! every choice is finished or blocked.

mod chunks;
mod responses;

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

use crate::api::response::{ChatCompletion, Choice, FunctionCall, Logprobs, Message, ToolCall};
use crate::backend::{BackendEvent, BackendResponse, ChoiceDelta, EventStream, TokenLogprob};
use crate::error::ApiError;
use crate::response_guard::ResponseGuard;

pub use chunks::{ChunkFraming, ResponseMeta, Shape};
pub use responses::{whole_response, Persist, ResponsesFraming};

/// A batch of frames stops growing past this many bytes.
const COALESCE_BYTES: usize = 16 * 1024;

/// How a stream's released events are written.
pub trait Framing: Send + 'static {
    /// Frames that open the stream, before any event; `fingerprint` is the released
    /// `system_fingerprint`.
    fn open(&mut self, fingerprint: Option<String>) -> Vec<u8>;
    /// Frames for events the guard released.
    fn events(&mut self, events: Vec<BackendEvent>, out: &mut Vec<u8>);
    /// The backend failed after the stream started: the stream's last frames.
    fn fail(&mut self, error: &ApiError, out: &mut Vec<u8>);
    /// The stream's normal end: its last frames, and work that must be done before they
    /// go out (a stored response must exist when the client reads that it is complete).
    fn close(&mut self) -> Closing;
}

/// The last frames of a stream.
pub struct Closing {
    pub frames: Vec<u8>,
    pub before: Option<BoxFuture<'static, ()>>,
}

/// Called once when a response has been relayed (or abandoned), with the firewall's view.
pub type OnEnd = Box<dyn FnOnce(&ResponseGuard) + Send>;

/// The SSE body for a streaming client: only what `guard` released goes out, written by
/// `framing`.
pub fn sse_body<F: Framing>(
    mut framing: F,
    backend: BackendResponse,
    mut guard: ResponseGuard,
    on_end: OnEnd,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
    let opening = framing.open(guard.release_fingerprint(backend.system_fingerprint));
    let state = StreamState {
        framing,
        pending: opening,
        events: Some(backend.events),
        guard,
        on_end: Some(on_end),
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

struct StreamState<F: Framing> {
    framing: F,
    /// Frames written but not sent yet (the opening ones).
    pending: Vec<u8>,
    /// `None` once the backend is stopped or done.
    events: Option<EventStream>,
    guard: ResponseGuard,
    on_end: Option<OnEnd>,
    ended: bool,
}

impl<F: Framing> Drop for StreamState<F> {
    fn drop(&mut self) {
        // A client that goes away mid-stream still gets its response accounted for.
        if let Some(on_end) = self.on_end.take() {
            on_end(&self.guard);
        }
    }
}

impl<F: Framing> StreamState<F> {
    /// The next non-empty batch of frames (the stream's tail when the backend is done).
    /// Events the backend has already produced are taken in the same batch, so a fast
    /// upstream's burst goes out in one write rather than one per chunk; nothing waits for
    /// events that are not there yet.
    async fn next_frames(&mut self) -> Bytes {
        let mut out = std::mem::take(&mut self.pending);
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
                    self.framing.events(released, &mut out);
                }
                Some(Err(error)) => {
                    // What the backend sent before failing is judged as a text's end, as
                    // when it ends cleanly, and relayed before the error: text the firewall
                    // held only because a match might have gone on is not lost with it.
                    let rest = self.guard.finish_all();
                    self.framing.events(rest, &mut out);
                    self.guard.backend_failed(&error);
                    self.end();
                    self.framing.fail(&error, &mut out);
                    break;
                }
                None => {
                    let rest = self.guard.finish_all();
                    self.framing.events(rest, &mut out);
                    self.end();
                    let closing = self.framing.close();
                    if let Some(before) = closing.before {
                        before.await;
                    }
                    out.extend_from_slice(&closing.frames);
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
}

/// `data: <json>\n\n`.
pub(crate) fn sse_frame(chunk: &impl serde::Serialize) -> Vec<u8> {
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
pub async fn collect(
    meta: ResponseMeta,
    backend: BackendResponse,
    guard: &mut ResponseGuard,
) -> Result<ChatCompletion, ApiError> {
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
    use crate::api::Usage;

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
        guard_with(n, firewall::Ruleset::empty())
    }

    fn guard_with(n: u32, rules: firewall::Ruleset) -> ResponseGuard {
        let rules = std::sync::Arc::new(rules);
        let settings = crate::response_guard::GuardSettings::new(
            rules,
            firewall::ScanContext::new("t"),
            std::sync::Arc::new(firewall::Detectors::default()),
        );
        ResponseGuard::new(crate::response_guard::GuardSettings { choices: n, ..settings })
    }

    async fn frames(events: Vec<Result<BackendEvent, ApiError>>, include_usage: bool) -> Vec<String> {
        frames_under(open_guard(2), events, include_usage).await
    }

    async fn frames_under(
        guard: ResponseGuard,
        events: Vec<Result<BackendEvent, ApiError>>,
        include_usage: bool,
    ) -> Vec<String> {
        let body: Vec<_> =
            sse_body(ChunkFraming::new(meta(include_usage)), backend(events), guard, Box::new(|_| {})).collect().await;
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
        let chunks: Vec<serde_json::Value> =
            f[..f.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
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
        let body: Vec<_> =
            sse_body(ChunkFraming::new(meta), backend(events), open_guard(1), Box::new(|_| {})).collect().await;
        let joined: String = body.into_iter().map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap()).collect();
        let frames: Vec<&str> =
            joined.split("\n\n").filter(|f| !f.is_empty()).map(|f| f.trim_start_matches("data: ")).collect();
        assert_eq!(frames.last(), Some(&"[DONE]"));
        let chunks: Vec<serde_json::Value> =
            frames[..frames.len() - 1].iter().map(|c| serde_json::from_str(c).unwrap()).collect();
        assert!(chunks.iter().all(|c| c["object"] == "text_completion" && c["id"] == "cmpl-1"));
        assert_eq!(chunks[0]["choices"][0]["text"], "Hé");
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["text_offset"][0], 2);
        assert_eq!(chunks[1]["choices"][0]["logprobs"]["tokens"][0], "llo");
        assert_eq!(chunks[2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[3]["usage"]["total_tokens"], 3);
        assert!(chunks
            .iter()
            .all(|c| c["choices"].as_array().is_some_and(|l| l.iter().all(|ch| ch.get("delta").is_none()))));
    }

    #[tokio::test]
    async fn errors_mid_stream_end_it_without_done() {
        let f = frames(vec![text(0, "a"), Err(ApiError::BadGateway("cut".into())), text(0, "never")], false).await;
        assert_eq!(f.len(), 2);
        assert!(f[1].contains("\"error\"") && f[1].contains("cut"));
    }

    /// Frames of one choice's stream under the built-in rules.
    async fn guarded_frames(events: Vec<Result<BackendEvent, ApiError>>) -> Vec<String> {
        let rules = firewall::Ruleset::builtin().unwrap_or_else(|_| firewall::Ruleset::empty());
        assert!(rules.len() > 400, "the built-in rules load");
        frames_under(guard_with(1, rules), events, false).await
    }

    #[tokio::test]
    async fn text_held_when_the_backend_fails_is_judged_and_relayed_before_the_error() {
        // A line's first word could open `name secret VALUE`: the firewall holds it until
        // the next word, which a failing backend never sends.
        let f = guarded_frames(vec![text(0, "partial "), Err(ApiError::BadGateway("cut".into()))]).await;
        assert!(f.iter().any(|c| c.contains("partial")), "{f:?}");
        assert!(f.last().is_some_and(|c| c.contains("\"error\"") && c.contains("cut")), "{f:?}");
        assert!(!f.iter().any(|c| c == "[DONE]"));
        // A key cut by the failure is judged at the text's end like any other: never relayed.
        let key = "ghp_R8vTq2LmZx9WcY4bN7kP1sD3fG6hJ0aQe5Ui";
        let f = guarded_frames(vec![text(0, "token: "), text(0, key), Err(ApiError::BadGateway("cut".into()))]).await;
        assert!(!f.iter().any(|c| c.contains("ghp_R8vT")), "{f:?}");
        assert!(f.last().is_some_and(|c| c.contains("\"error\"")), "{f:?}");
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
        let c = collect(meta(false), backend(events), &mut open_guard(1)).await.unwrap();
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "Hello");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"q\":1}");
        assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["id"], "c1");
        assert_eq!(v["object"], "chat.completion");
    }

    #[tokio::test]
    async fn collect_fails_whole_on_error() {
        let mut guard = open_guard(1);
        let r =
            collect(meta(false), backend(vec![text(0, "a"), Err(ApiError::GatewayTimeout("slow".into()))]), &mut guard)
                .await;
        assert_eq!(r.unwrap_err().status(), 504);
        assert_eq!(guard.backend_error().map(ApiError::kind), Some("upstream_error"), "the guard's outcome holds it");
    }

    #[tokio::test]
    async fn an_upstream_error_event_goes_out_as_its_fixed_message_and_is_recorded() {
        let error = ApiError::UpstreamFailed {
            status: None,
            request_id: "req-5".into(),
            detail: "upstream message GLOB**** (20 chars)".into(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let on_end: OnEnd = Box::new(move |g| {
            let _ = tx.send(g.backend_error().map(|e| e.status().as_u16()));
        });
        let body: Vec<_> =
            sse_body(ChunkFraming::new(meta(false)), backend(vec![text(0, "a"), Err(error)]), open_guard(1), on_end)
                .collect()
                .await;
        let text: String = body.into_iter().map(|b| String::from_utf8(b.unwrap().to_vec()).unwrap()).collect();
        assert!(text.contains("req-5") && !text.contains("GLOB") && !text.contains("[DONE]"), "{text}");
        assert_eq!(rx.recv().unwrap(), Some(502));
    }
}
