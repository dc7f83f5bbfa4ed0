//! Responses API streams: typed events (`event: <type>` and a `data:` object carrying the
//! same `type` and a `sequence_number`), in the order OpenAI's SDKs check:
//!
//! `response.created`, `response.in_progress`; per output item `response.output_item.added`,
//! then for a message `response.content_part.added`, `response.output_text.delta`… (or
//! `response.refusal.delta`…), `response.output_text.done`, `response.content_part.done`,
//! for a function call `response.function_call_arguments.delta`…,
//! `response.function_call_arguments.done`; then `response.output_item.done`; and last
//! `response.completed`, or `response.incomplete` (a block: `incomplete_details.reason =
//! "content_filter"`; the token limit: `"max_output_tokens"`), or `error` and
//! `response.failed` when the backend failed mid-stream.
//!
//! The Responses API has one choice: events of choice 0 are written, as the route asks
//! the backends for one.

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use serde_json::{json, Value};

use super::{Closing, Framing};
use crate::api::response::{ChatCompletion, FunctionChunk, Logprobs, Message, ToolCallChunk};
use crate::api::responses::object::{
    item_id, outcome, ItemStatus, OutputContent, OutputItem, ResponseError, ResponseObject, Status,
};
use crate::api::Usage;
use crate::backend::{BackendEvent, ChoiceDelta, TokenLogprob};
use crate::error::ApiError;
use crate::state::unix_now;

/// Keeps a finished response (for `previous_response_id`); awaited before the client is
/// told the response is complete.
pub type Persist = Box<dyn FnOnce(&ResponseObject) -> BoxFuture<'static, ()> + Send>;

/// The kind of the message part being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    Text,
    Refusal,
}

/// The message item being written: its place in `items` and its open part.
#[derive(Debug, Clone, Copy)]
struct OpenMessage {
    item: usize,
    part: Option<(usize, Part)>,
}

/// Writes one response's events.
pub struct ResponsesFraming {
    response: ResponseObject,
    sequence: u64,
    items: Vec<OutputItem>,
    message: Option<OpenMessage>,
    /// Tool-call index -> its item in `items`.
    calls: BTreeMap<u32, usize>,
    /// The call being written (one item at a time, as OpenAI streams them).
    open_call: Option<usize>,
    finish: Option<String>,
    usage: Option<Usage>,
    persist: Option<Persist>,
}

impl ResponsesFraming {
    /// `response` is the `in_progress` object; `persist`, when the response is stored.
    pub fn new(response: ResponseObject, persist: Option<Persist>) -> ResponsesFraming {
        ResponsesFraming {
            response,
            sequence: 0,
            items: Vec::new(),
            message: None,
            calls: BTreeMap::new(),
            open_call: None,
            finish: None,
            usage: None,
            persist,
        }
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut body: Value) {
        if let Value::Object(map) = &mut body {
            map.insert("type".into(), Value::String(kind.to_owned()));
            map.insert("sequence_number".into(), Value::from(self.sequence));
        }
        self.sequence += 1;
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // Serializing plain values cannot fail; an empty object keeps the frame valid.
        if serde_json::to_writer(&mut *out, &body).is_err() {
            out.extend_from_slice(b"{}");
        }
        out.extend_from_slice(b"\n\n");
    }

    fn snapshot(&self) -> Value {
        serde_json::to_value(&self.response).unwrap_or(Value::Null)
    }

    fn item_json(&self, index: usize) -> Value {
        serde_json::to_value(&self.items[index]).unwrap_or(Value::Null)
    }

    fn id_of(&self, index: usize) -> String {
        match &self.items[index] {
            OutputItem::Message { id, .. } | OutputItem::FunctionCall { id, .. } => id.clone(),
        }
    }

    /// The open message's item index, opening one if needed.
    fn open_message(&mut self, out: &mut Vec<u8>) -> usize {
        if let Some(m) = self.message {
            return m.item;
        }
        let index = self.items.len();
        self.items.push(OutputItem::Message {
            id: item_id("msg"),
            status: ItemStatus::InProgress,
            role: "assistant",
            content: Vec::new(),
        });
        self.message = Some(OpenMessage { item: index, part: None });
        let item = self.item_json(index);
        self.emit(out, "response.output_item.added", json!({"output_index": index, "item": item}));
        index
    }

    /// The open part of kind `kind` in the open message, opening it (and closing another).
    fn open_part(&mut self, kind: Part, out: &mut Vec<u8>) -> (usize, usize) {
        let item = self.open_message(out);
        if let Some(OpenMessage { part: Some((at, open)), .. }) = self.message {
            if open == kind {
                return (item, at);
            }
            self.close_part(out);
        }
        let part = match kind {
            Part::Text => {
                OutputContent::OutputText { text: String::new(), annotations: Vec::new(), logprobs: Vec::new() }
            }
            Part::Refusal => OutputContent::Refusal { refusal: String::new() },
        };
        let at = match &mut self.items[item] {
            OutputItem::Message { content, .. } => {
                content.push(part.clone());
                content.len() - 1
            }
            OutputItem::FunctionCall { .. } => 0,
        };
        self.message = Some(OpenMessage { item, part: Some((at, kind)) });
        let id = self.id_of(item);
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": item, "content_index": at, "part": part}),
        );
        (item, at)
    }

    fn part_mut(&mut self, item: usize, at: usize) -> Option<&mut OutputContent> {
        match &mut self.items[item] {
            OutputItem::Message { content, .. } => content.get_mut(at),
            OutputItem::FunctionCall { .. } => None,
        }
    }

    fn close_part(&mut self, out: &mut Vec<u8>) {
        let Some(OpenMessage { item, part: Some((at, _)) }) = self.message else { return };
        self.message = Some(OpenMessage { item, part: None });
        let id = self.id_of(item);
        let Some(part) = self.part_mut(item, at).cloned() else { return };
        match &part {
            OutputContent::OutputText { text, logprobs, .. } => {
                let body = json!({"item_id": id, "output_index": item, "content_index": at, "text": text, "logprobs": logprobs});
                self.emit(out, "response.output_text.done", body);
            }
            OutputContent::Refusal { refusal } => {
                let body = json!({"item_id": id, "output_index": item, "content_index": at, "refusal": refusal});
                self.emit(out, "response.refusal.done", body);
            }
        }
        self.emit(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": item, "content_index": at, "part": part}),
        );
    }

    fn close_message(&mut self, status: ItemStatus, out: &mut Vec<u8>) {
        self.close_part(out);
        let Some(OpenMessage { item, .. }) = self.message.take() else { return };
        if let OutputItem::Message { status: s, .. } = &mut self.items[item] {
            *s = status;
        }
        let body = json!({"output_index": item, "item": self.item_json(item)});
        self.emit(out, "response.output_item.done", body);
    }

    fn close_call(&mut self, status: ItemStatus, out: &mut Vec<u8>) {
        let Some(item) = self.open_call.take() else { return };
        let id = self.id_of(item);
        if let OutputItem::FunctionCall { status: s, name, arguments, .. } = &mut self.items[item] {
            *s = status;
            let body =
                json!({"item_id": id, "output_index": item, "name": name.clone(), "arguments": arguments.clone()});
            self.emit(out, "response.function_call_arguments.done", body);
        }
        let body = json!({"output_index": item, "item": self.item_json(item)});
        self.emit(out, "response.output_item.done", body);
    }

    fn close_all(&mut self, status: ItemStatus, out: &mut Vec<u8>) {
        self.close_message(status, out);
        self.close_call(status, out);
    }

    fn delta(&mut self, d: ChoiceDelta, out: &mut Vec<u8>) {
        // Logprobs may come without text (a token that ends inside a character).
        if d.content.as_ref().is_some_and(|t| !t.is_empty()) || !d.logprobs.is_empty() {
            let text = d.content.unwrap_or_default();
            let (item, at) = self.open_part(Part::Text, out);
            let logprobs = Logprobs::of(&d.logprobs).content;
            if let Some(OutputContent::OutputText { text: all, logprobs: all_logprobs, .. }) = self.part_mut(item, at) {
                all.push_str(&text);
                all_logprobs.extend(logprobs.iter().cloned());
            }
            let id = self.id_of(item);
            let body =
                json!({"item_id": id, "output_index": item, "content_index": at, "delta": text, "logprobs": logprobs});
            self.emit(out, "response.output_text.delta", body);
        }
        if let Some(text) = d.refusal.filter(|t| !t.is_empty()) {
            let (item, at) = self.open_part(Part::Refusal, out);
            if let Some(OutputContent::Refusal { refusal }) = self.part_mut(item, at) {
                refusal.push_str(&text);
            }
            let id = self.id_of(item);
            self.emit(
                out,
                "response.refusal.delta",
                json!({"item_id": id, "output_index": item, "content_index": at, "delta": text}),
            );
        }
        for chunk in d.tool_calls {
            let item = match self.calls.get(&chunk.index) {
                Some(item) => *item,
                None => {
                    // A call follows the text or the call before it: those are done.
                    self.close_message(ItemStatus::Completed, out);
                    self.close_call(ItemStatus::Completed, out);
                    let index = self.items.len();
                    // The call's identity is fixed once announced (the SDKs check it): an
                    // upstream that names no id gets one here, and later ids are ignored.
                    self.items.push(OutputItem::FunctionCall {
                        id: item_id("fc"),
                        call_id: chunk.id.clone().filter(|id| !id.is_empty()).unwrap_or_else(|| item_id("call")),
                        name: chunk.function.name.clone().unwrap_or_default(),
                        arguments: String::new(),
                        status: ItemStatus::InProgress,
                    });
                    self.calls.insert(chunk.index, index);
                    self.open_call = Some(index);
                    let body = json!({"output_index": index, "item": self.item_json(index)});
                    self.emit(out, "response.output_item.added", body);
                    if let Some(args) = chunk.function.arguments.filter(|a| !a.is_empty()) {
                        self.arguments(index, args, out);
                    }
                    continue;
                }
            };
            let open = self.open_call == Some(item);
            if let OutputItem::FunctionCall { name, arguments, .. } = &mut self.items[item] {
                if let Some(more) = chunk.function.name {
                    name.push_str(&more);
                }
                // A fragment of a call already done (an upstream interleaving its calls)
                // joins the final object only: its events have been sent.
                if !open {
                    arguments.push_str(&chunk.function.arguments.unwrap_or_default());
                    continue;
                }
            }
            if let Some(args) = chunk.function.arguments.filter(|a| !a.is_empty()) {
                self.arguments(item, args, out);
            }
        }
    }

    fn arguments(&mut self, item: usize, delta: String, out: &mut Vec<u8>) {
        if let OutputItem::FunctionCall { arguments, .. } = &mut self.items[item] {
            arguments.push_str(&delta);
        }
        let id = self.id_of(item);
        self.emit(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": item, "delta": delta}),
        );
    }
}

impl Framing for ResponsesFraming {
    fn open(&mut self, _fingerprint: Option<String>) -> Vec<u8> {
        let mut out = Vec::new();
        let snapshot = self.snapshot();
        self.emit(&mut out, "response.created", json!({"response": snapshot}));
        self.emit(&mut out, "response.in_progress", json!({"response": snapshot}));
        out
    }

    fn events(&mut self, events: Vec<BackendEvent>, out: &mut Vec<u8>) {
        for event in events {
            match event {
                BackendEvent::Delta(d) if d.index == 0 => self.delta(d, out),
                BackendEvent::Finish { index: 0, reason } => {
                    let status = match outcome(Some(&reason)).0 {
                        Status::Completed => ItemStatus::Completed,
                        _ => ItemStatus::Incomplete,
                    };
                    self.close_all(status, out);
                    self.finish = Some(reason);
                }
                BackendEvent::Usage(u) => self.usage = Some(u),
                BackendEvent::Delta(_) | BackendEvent::Finish { .. } => {}
            }
        }
    }

    fn fail(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        self.close_all(ItemStatus::Incomplete, out);
        let ResponseError { code, message } = ResponseError::of(error);
        let body = json!({"code": code, "message": message, "param": error.param_name()});
        self.emit(out, "error", body);
        let items = std::mem::take(&mut self.items);
        self.response.fail(items, error);
        let snapshot = self.snapshot();
        self.emit(out, "response.failed", json!({"response": snapshot}));
    }

    fn close(&mut self) -> Closing {
        let mut frames = Vec::new();
        // A backend that ended without a finish reason ended normally.
        self.close_all(ItemStatus::Completed, &mut frames);
        let items = std::mem::take(&mut self.items);
        self.response.finish(items, self.finish.as_deref(), self.usage, unix_now());
        let before = self.persist.take().map(|persist| persist(&self.response));
        let kind = if self.response.status == Status::Completed { "response.completed" } else { "response.incomplete" };
        let snapshot = self.snapshot();
        self.emit(&mut frames, kind, json!({"response": snapshot}));
        Closing { frames, before }
    }
}

/// The whole response for a completion the guard released: its events through the framing
/// a stream takes (frames discarded), so whole and streamed responses are built alike.
pub fn whole_response(started: ResponseObject, completion: ChatCompletion) -> ResponseObject {
    let mut framing = ResponsesFraming::new(started, None);
    let mut discarded = Vec::new();
    framing.events(completion_events(completion), &mut discarded);
    let _ = framing.close();
    framing.response
}

/// The events a completion's first choice is made of (the Responses API has one choice).
fn completion_events(completion: ChatCompletion) -> Vec<BackendEvent> {
    let mut events = Vec::new();
    if let Some(choice) = completion.choices.into_iter().next() {
        let logprobs =
            choice.logprobs.map(|l| l.content.into_iter().map(TokenLogprob::from).collect()).unwrap_or_default();
        let Message { content, refusal, tool_calls, .. } = choice.message;
        events.push(BackendEvent::Delta(ChoiceDelta { index: 0, content, refusal, logprobs, ..Default::default() }));
        for (i, call) in tool_calls.into_iter().enumerate() {
            let chunk = ToolCallChunk {
                index: i as u32,
                id: Some(call.id),
                kind: Some(call.kind),
                function: FunctionChunk { name: Some(call.function.name), arguments: Some(call.function.arguments) },
            };
            events.push(BackendEvent::Delta(ChoiceDelta { index: 0, tool_calls: vec![chunk], ..Default::default() }));
        }
        if let Some(reason) = choice.finish_reason {
            events.push(BackendEvent::Finish { index: 0, reason });
        }
    }
    events.extend(completion.usage.map(BackendEvent::Usage));
    events
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::responses::ResponsesRequest;

    fn framing() -> ResponsesFraming {
        let echo = ResponsesRequest::parse(br#"{"model": "m", "input": "x", "stream": true}"#).unwrap().echo;
        ResponsesFraming::new(ResponseObject::started("resp_1".into(), 1, "m".into(), echo), None)
    }

    fn text(s: &str) -> BackendEvent {
        BackendEvent::Delta(ChoiceDelta { index: 0, content: Some(s.into()), ..Default::default() })
    }

    fn call(id: Option<&str>, args: &str) -> BackendEvent {
        let chunk = ToolCallChunk {
            index: 0,
            id: id.map(str::to_owned),
            kind: id.map(|_| "function".to_owned()),
            function: FunctionChunk { name: id.map(|_| "lookup".to_owned()), arguments: Some(args.into()) },
        };
        BackendEvent::Delta(ChoiceDelta { index: 0, tool_calls: vec![chunk], ..Default::default() })
    }

    /// (event type, data) of every frame, checking the framing on the way.
    fn parse(bytes: &[u8]) -> Vec<(String, Value)> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|f| !f.is_empty())
            .map(|frame| {
                let (event, data) = frame.split_once('\n').unwrap();
                let kind = event.strip_prefix("event: ").unwrap().to_owned();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(data["type"], kind.as_str());
                (kind, data)
            })
            .collect()
    }

    fn run(events: Vec<BackendEvent>) -> Vec<(String, Value)> {
        let mut f = framing();
        let mut out = f.open(None);
        f.events(events, &mut out);
        out.extend_from_slice(&f.close().frames);
        parse(&out)
    }

    #[test]
    fn text_then_a_call_stream_in_order_and_complete() {
        let usage = Usage { prompt_tokens: 3, completion_tokens: 4, total_tokens: 7 };
        let frames = run(vec![
            text("Let me "),
            text("check."),
            call(Some("call_1"), "{\"q\":"),
            call(None, "1}"),
            BackendEvent::Finish { index: 0, reason: "tool_calls".into() },
            BackendEvent::Usage(usage),
        ]);
        let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let seq: Vec<u64> = frames.iter().map(|(_, d)| d["sequence_number"].as_u64().unwrap()).collect();
        assert!(seq.windows(2).all(|w| w[1] == w[0] + 1));
        assert_eq!(frames[6].1["text"], "Let me check.");
        assert_eq!(frames[12].1["arguments"], "{\"q\":1}");
        let done = &frames[14].1["response"];
        assert_eq!(done["status"], "completed");
        assert_eq!(done["output"][1]["call_id"], "call_1");
        assert_eq!(done["output"][1]["status"], "completed");
        assert_eq!(done["usage"]["total_tokens"], 7);
        assert_eq!(frames[2].1["item"]["id"], done["output"][0]["id"]);
    }

    #[test]
    fn a_call_keeps_the_identity_it_was_announced_with() {
        let frames = run(vec![
            call(None, "{\"q\":"),
            call(Some("late_id"), "1}"),
            BackendEvent::Finish { index: 0, reason: "tool_calls".into() },
        ]);
        let added = frames
            .iter()
            .find(|(k, _)| k == "response.output_item.added")
            .map(|(_, d)| d["item"]["call_id"].clone())
            .unwrap();
        assert!(added.as_str().is_some_and(|id| id.starts_with("call_")), "{added}");
        let done = &frames.last().unwrap().1["response"]["output"][0];
        assert_eq!((&done["call_id"], done["arguments"].as_str()), (&added, Some("{\"q\":1}")));
    }

    #[test]
    fn logprobs_without_text_still_go_out() {
        let lp = |s: &str| crate::backend::TokenLogprob { token: s.into(), logprob: -0.1, top_logprobs: Vec::new() };
        let frames = run(vec![
            BackendEvent::Delta(ChoiceDelta { index: 0, logprobs: vec![lp("\u{fffd}")], ..Default::default() }),
            BackendEvent::Delta(ChoiceDelta {
                index: 0,
                content: Some("é".into()),
                logprobs: vec![lp("é")],
                ..Default::default()
            }),
            BackendEvent::Finish { index: 0, reason: "stop".into() },
        ]);
        let done = &frames.last().unwrap().1["response"]["output"][0]["content"][0];
        assert_eq!((done["text"].as_str(), done["logprobs"].as_array().map(Vec::len)), (Some("é"), Some(2)));
    }

    #[test]
    fn a_whole_completion_is_built_as_its_stream_would_be() {
        use crate::api::response::{Choice, FunctionCall, Message, ToolCall};
        let completion = |content: Option<&str>, finish: &str| ChatCompletion {
            id: "c".into(),
            object: "chat.completion",
            created: 1,
            model: "m".into(),
            choices: vec![Choice {
                index: 0,
                message: Message {
                    role: "assistant".into(),
                    content: content.map(str::to_owned),
                    refusal: None,
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        kind: "function".into(),
                        function: FunctionCall { name: "f".into(), arguments: "{}".into() },
                    }],
                },
                logprobs: None,
                finish_reason: Some(finish.into()),
            }],
            usage: Some(Usage { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 }),
            system_fingerprint: None,
        };
        let started = || framing().response;
        let v = serde_json::to_value(whole_response(started(), completion(Some("Hi"), "tool_calls"))).unwrap();
        assert_eq!((v["status"].as_str(), v["usage"]["input_tokens"].as_u64()), (Some("completed"), Some(5)));
        assert_eq!(
            (v["output"][0]["content"][0]["text"].as_str(), v["output"][1]["call_id"].as_str()),
            (Some("Hi"), Some("call_1"))
        );
        let v =
            serde_json::to_value(whole_response(started(), completion(Some("The key is "), "content_filter"))).unwrap();
        assert_eq!(
            (v["status"].as_str(), v["incomplete_details"]["reason"].as_str()),
            (Some("incomplete"), Some("content_filter"))
        );
        assert_eq!(v["output"][0]["status"], "completed", "the message was done when the call began");
        assert_eq!(v["output"][1]["status"], "incomplete");
    }

    #[test]
    fn calls_are_written_one_item_at_a_time() {
        let second = |args: &str| {
            let chunk = ToolCallChunk {
                index: 1,
                id: Some("call_2".into()),
                kind: None,
                function: FunctionChunk { name: Some("g".into()), arguments: Some(args.into()) },
            };
            BackendEvent::Delta(ChoiceDelta { index: 0, tool_calls: vec![chunk], ..Default::default() })
        };
        let frames = run(vec![
            call(Some("call_1"), "{}"),
            second("{"),
            call(None, " "),
            second("}"),
            BackendEvent::Finish { index: 0, reason: "tool_calls".into() },
        ]);
        let items: Vec<(&str, u64)> = frames
            .iter()
            .filter(|(k, _)| k.starts_with("response.output_item."))
            .map(|(k, d)| (k.as_str(), d["output_index"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            items,
            [
                ("response.output_item.added", 0),
                ("response.output_item.done", 0),
                ("response.output_item.added", 1),
                ("response.output_item.done", 1)
            ]
        );
        let done = &frames.last().unwrap().1["response"]["output"];
        assert_eq!(
            (done[0]["arguments"].as_str(), done[1]["arguments"].as_str()),
            (Some("{} "), Some("{}")),
            "a late fragment joins the final object"
        );
    }

    #[test]
    fn a_block_ends_incomplete_with_content_filter() {
        let frames = run(vec![text("The key is "), BackendEvent::Finish { index: 0, reason: "content_filter".into() }]);
        let (kind, last) = frames.last().unwrap();
        assert_eq!(kind, "response.incomplete");
        assert_eq!(last["response"]["status"], "incomplete");
        assert_eq!(last["response"]["incomplete_details"]["reason"], "content_filter");
        assert_eq!(last["response"]["output"][0]["status"], "incomplete");
        assert_eq!(last["response"]["output"][0]["content"][0]["text"], "The key is ");
    }

    #[test]
    fn a_backend_failure_sends_error_then_failed() {
        let mut f = framing();
        let mut out = f.open(None);
        f.events(vec![text("partial")], &mut out);
        f.fail(&ApiError::BadGateway("cut".into()), &mut out);
        let frames = parse(&out);
        let n = frames.len();
        assert_eq!(frames[n - 2].0, "error");
        assert_eq!(frames[n - 1].0, "response.failed");
        assert_eq!(frames[n - 1].1["response"]["status"], "failed");
        assert_eq!(frames[n - 1].1["response"]["output"][0]["status"], "incomplete");
        assert!(frames[n - 1].1["response"]["error"]["message"].is_string());
    }

    #[test]
    fn the_store_is_written_before_completion_goes_out() {
        let (tx, rx) = std::sync::mpsc::channel();
        let persist: Persist = Box::new(move |r: &ResponseObject| {
            let _ = tx.send(r.output_text());
            Box::pin(async {})
        });
        let echo = ResponsesRequest::parse(br#"{"model": "m", "input": "x"}"#).unwrap().echo;
        let mut f = ResponsesFraming::new(ResponseObject::started("resp_1".into(), 1, "m".into(), echo), Some(persist));
        let mut out = Vec::new();
        f.events(vec![text("hi"), BackendEvent::Finish { index: 0, reason: "stop".into() }], &mut out);
        let closing = f.close();
        assert!(closing.before.is_some());
        assert_eq!(rx.recv().unwrap(), "hi");
    }
}
