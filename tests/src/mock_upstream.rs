//! A scripted OpenAI-compatible upstream, served in-process on port 0.
//!
//! The last message's content selects the behaviour, so each test states its script in
//! the request itself:
//! - `#slow <ms>`: wait before answering (tests first-byte timeouts);
//! - `#stall`: stream two chunks, then go silent (idle timeouts);
//! - `#die`: stream two chunks, then drop the connection without `[DONE]`;
//! - `#status <code>`: answer with that HTTP status and an OpenAI error body;
//! - `#garbage`: answer 200 with a body that is not JSON;
//! - `#tools`: answer with a tool call whose arguments are streamed in fragments;
//! - `#leak <text>`: answer `<text>`, streamed in 40 pieces of equal byte length;
//! - `#place <channel> <text>`: a small answer (content with logprobs, one tool call) with
//!   `<text>` placed in one channel: `status400` / `status500` (an HTTP error whose message,
//!   `code` and `param` carry it), `midstream` (an `{"error": ...}` event after the first
//!   chunk, streamed requests only), `logprob` (a logprob entry's token), `top_logprob` (a
//!   `top_logprobs` token), `tool_name`, `tool_id`, `fingerprint` (`system_fingerprint`),
//!   or `clean` (nowhere: the answer as [`PLACED_CONTENT`] and friends say);
//! - `#splice <request> <word> <count>`: the production bug — answer with `<count>` words,
//!   from word `<word>` on, of the first user message of the `<request>`-th request this
//!   mock received (0-based), wrapped in a sentence and streamed in 40 pieces;
//! - `#place <channel> @<k>`: `#place` with the `<k>`-th canned text;
//! - `#canned <k>`: answer the `<k>`-th text registered with [`MockUpstream::can`], streamed
//!   in 40 pieces (so an answer can carry text the asking tenant never sent);
//! - `#bigevent <mib>`: stream a role chunk, then one SSE event of `<mib>` MiB made of
//!   many 64 KiB `data:` lines (no line near a line cap), then `[DONE]`;
//! - anything else: answer `Echo: <content>` (streamed word by word when asked).
//!
//! Every request's body and headers are kept for the test to inspect.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};

/// A request the mock received.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: Value,
    pub headers: HeaderMap,
}

/// A running mock upstream.
pub struct MockUpstream {
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    canned: Arc<Mutex<Vec<String>>>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl MockUpstream {
    /// Starts the mock on 127.0.0.1:0.
    pub async fn start() -> MockUpstream {
        let received = Arc::new(Mutex::new(Vec::new()));
        let canned = Arc::new(Mutex::new(Vec::new()));
        let app =
            Router::new().route("/v1/chat/completions", post(chat)).with_state((received.clone(), canned.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind mock upstream");
        let addr = listener.local_addr().expect("mock address");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await;
        });
        MockUpstream { addr, received, canned, _shutdown: tx }
    }

    /// `http://127.0.0.1:PORT/v1`
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Registers an answer for `#canned <k>`; returns its `k`.
    pub fn can(&self, text: impl Into<String>) -> usize {
        let mut canned = self.canned.lock().unwrap_or_else(|p| p.into_inner());
        canned.push(text.into());
        canned.len() - 1
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

type Shared = (Arc<Mutex<Vec<Received>>>, Arc<Mutex<Vec<String>>>);

async fn chat(State((received, canned)): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let earlier: Vec<Value> = match received.lock() {
        Ok(mut r) => {
            r.push(Received { body: body.clone(), headers });
            r.iter().map(|x| x.body.clone()).collect()
        }
        Err(_) => Vec::new(),
    };
    let script = last_message(&body);
    let stream = body["stream"].as_bool().unwrap_or(false);
    let n = body["n"].as_u64().unwrap_or(1) as u32;
    let include_usage = body["stream_options"]["include_usage"].as_bool().unwrap_or(false);
    let model = body["model"].as_str().unwrap_or("mock").to_owned();
    let mut words = script.split_whitespace();
    match words.next() {
        Some("#slow") => {
            let ms = words.next().and_then(|w| w.parse().ok()).unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            answer(&model, "slow answer", n, stream, include_usage)
        }
        Some("#status") => {
            let code = words.next().and_then(|w| w.parse().ok()).unwrap_or(500);
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let err = json!({"error": {"message": format!("mock error {code}"), "type": "mock", "code": "mock_code"}});
            (status, axum::Json(err)).into_response()
        }
        Some("#garbage") => (StatusCode::OK, "this is not json").into_response(),
        Some("#stall") => broken_stream(&model, true),
        Some("#die") => broken_stream(&model, false),
        Some("#tools") => tools(&model, stream),
        Some("#leak") => {
            let text = script.trim_start_matches("#leak").trim_start();
            if stream {
                pieces(&model, text, 40)
            } else {
                answer(&model, text, n, false, include_usage)
            }
        }
        Some("#canned") => {
            let k = words.next().and_then(|w| w.parse::<usize>().ok()).unwrap_or(usize::MAX);
            let text = canned.lock().ok().and_then(|c| c.get(k).cloned()).unwrap_or_default();
            if stream {
                pieces(&model, &text, 40)
            } else {
                answer(&model, &text, n, false, include_usage)
            }
        }
        Some("#place") => {
            let channel = words.next().unwrap_or("clean");
            let mut text = words.collect::<Vec<_>>().join(" ");
            // `@<k>`: the `<k>`-th canned text, so the asker need not send it.
            if let Some(k) = text.strip_prefix('@').and_then(|k| k.parse::<usize>().ok()) {
                text = canned.lock().ok().and_then(|c| c.get(k).cloned()).unwrap_or_default();
            }
            placed(&model, channel, &text, stream)
        }
        Some("#splice") => {
            let mut arg = || words.next().and_then(|w| w.parse::<usize>().ok()).unwrap_or(0);
            let (request, from, count) = (arg(), arg(), arg());
            let source = earlier.get(request).map(first_user_message).unwrap_or_default();
            let fragment: Vec<&str> = source.split_whitespace().skip(from).take(count).collect();
            let text = format!("Here is what I found in the notes: {} Hope that helps.", fragment.join(" "));
            if stream {
                pieces(&model, &text, 40)
            } else {
                answer(&model, &text, n, false, include_usage)
            }
        }
        Some("#bigevent") => big_event(&model, words.next().and_then(|w| w.parse().ok()).unwrap_or(20)),
        _ => answer(&model, &format!("Echo: {script}"), n, stream, include_usage),
    }
}

fn first_user_message(body: &Value) -> String {
    let messages = body["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    messages.iter().find(|m| m["role"] == "user").and_then(|m| m["content"].as_str()).unwrap_or("").to_owned()
}

fn last_message(body: &Value) -> String {
    body["messages"].as_array().and_then(|m| m.last()).and_then(|m| m["content"].as_str()).unwrap_or("").to_owned()
}

fn chunk(model: &str, choices: Value) -> Value {
    json!({"id": "mock-1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": choices})
}

fn sse(frames: Vec<Value>, done: bool) -> Vec<Result<Bytes, Infallible>> {
    let mut out: Vec<Result<Bytes, Infallible>> =
        frames.into_iter().map(|f| Ok(Bytes::from(format!("data: {f}\n\n")))).collect();
    if done {
        out.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
    }
    out
}

fn sse_response(body: Body) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

fn answer(model: &str, text: &str, n: u32, stream: bool, include_usage: bool) -> Response {
    let words: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
    let usage = json!({"prompt_tokens": 7, "completion_tokens": words.len() * n as usize, "total_tokens": 7 + words.len() * n as usize});
    if !stream {
        let choices: Vec<Value> = (0..n)
            .map(|i| json!({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": "stop"}))
            .collect();
        let body = json!({"id": "mock-1", "object": "chat.completion", "created": 1, "model": model,
                          "choices": choices, "usage": usage, "system_fingerprint": "fp_mock"});
        return axum::Json(body).into_response();
    }
    let mut frames = Vec::new();
    for i in 0..n {
        frames.push(chunk(
            model,
            json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
        ));
    }
    for w in &words {
        for i in 0..n {
            frames.push(chunk(model, json!([{"index": i, "delta": {"content": w}, "finish_reason": null}])));
        }
    }
    for i in 0..n {
        frames.push(chunk(model, json!([{"index": i, "delta": {}, "finish_reason": "stop"}])));
    }
    if include_usage {
        let mut last = chunk(model, json!([]));
        last["usage"] = usage;
        frames.push(last);
    }
    sse_response(Body::from_stream(futures::stream::iter(sse(frames, true))))
}

fn tools(model: &str, stream: bool) -> Response {
    let args = ["{\"ci", "ty\": \"Par", "is\"}"];
    if !stream {
        let body = json!({"id": "mock-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": args.concat()}}]}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}});
        return axum::Json(body).into_response();
    }
    let mut frames = vec![chunk(
        model,
        json!([{"index": 0, "delta": {"role": "assistant", "content": null,
        "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}}]}, "finish_reason": null}]),
    )];
    for a in args {
        frames.push(chunk(model, json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": a}}]}, "finish_reason": null}])));
    }
    frames.push(chunk(model, json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])));
    sse_response(Body::from_stream(futures::stream::iter(sse(frames, true))))
}

/// `text` (ASCII) streamed in `count` pieces of equal length, then `[DONE]`.
fn pieces(model: &str, text: &str, count: usize) -> Response {
    let step = text.len().div_ceil(count).max(1);
    let mut frames =
        vec![chunk(model, json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]))];
    // Pieces end on character boundaries: a JSON string holds whole characters.
    let mut at = 0;
    while at < text.len() {
        let mut end = (at + step).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        frames.push(chunk(model, json!([{"index": 0, "delta": {"content": &text[at..end]}, "finish_reason": null}])));
        at = end;
    }
    frames.push(chunk(model, json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])));
    sse_response(Body::from_stream(futures::stream::iter(sse(frames, true))))
}

/// A role chunk, then one event of `mib` MiB in 64 KiB `data:` lines, produced lazily.
fn big_event(model: &str, mib: usize) -> Response {
    let head = sse(
        vec![chunk(model, json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]))],
        false,
    );
    let line = Bytes::from(format!("data: {}\n", "x".repeat(64 * 1024 - 7)));
    let lines = futures::stream::iter((0..mib * 16).map(move |_| Ok::<_, Infallible>(line.clone())));
    let tail = futures::stream::iter([Ok(Bytes::from_static(b"\ndata: [DONE]\n\n"))]);
    use futures::StreamExt;
    sse_response(Body::from_stream(futures::stream::iter(head).chain(lines).chain(tail)))
}

/// Two chunks, then silence (`stall`) or a dropped connection.
fn broken_stream(model: &str, stall: bool) -> Response {
    let first = sse(
        vec![
            chunk(model, json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}])),
            chunk(model, json!([{"index": 0, "delta": {"content": "partial "}, "finish_reason": null}])),
        ],
        false,
    );
    let head = futures::stream::iter(first);
    let tail = futures::stream::once(async move {
        if stall {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Bytes::new())
        } else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Err(std::io::Error::other("mock upstream died"))
        }
    });
    use futures::StreamExt;
    let body = head.map(|r| r.map_err(|never: Infallible| match never {})).chain(tail);
    sse_response(Body::from_stream(body))
}

/// The content of a `#place` answer.
pub const PLACED_CONTENT: &str = "The weather in Paris";
/// Its tokens, as its logprob entries spell them.
pub const PLACED_TOKENS: [&str; 4] = ["The", " weather", " in", " Paris"];
/// Its tool call: id, name, and arguments (streamed in two fragments).
pub const PLACED_CALL: (&str, &str, &str) = ("call_abc123", "get_weather", r#"{"city": "Paris", "units": "metric"}"#);
/// Its `system_fingerprint`.
pub const PLACED_FINGERPRINT: &str = "fp_mock";

/// A `#place` answer: `text` in `channel`, everything else as the `PLACED_*` constants say.
fn placed(model: &str, channel: &str, text: &str, stream: bool) -> Response {
    if let Some(status) = match channel {
        "status400" => Some(StatusCode::BAD_REQUEST),
        "status500" => Some(StatusCode::INTERNAL_SERVER_ERROR),
        _ => None,
    } {
        let err = json!({"error": {"message": format!("Request failed, see {text}"), "type": "invalid_request_error", "code": text, "param": text}});
        return (status, axum::Json(err)).into_response();
    }
    let at = |c: &str, clean: &str| if channel == c { text.to_owned() } else { clean.to_owned() };
    let mut entries: Vec<Value> = PLACED_TOKENS
        .iter()
        .map(|t| json!({"token": t, "logprob": -0.25, "bytes": t.as_bytes(), "top_logprobs": [{"token": t, "logprob": -0.25, "bytes": t.as_bytes()}, {"token": " Lyon", "logprob": -2.5, "bytes": " Lyon".as_bytes()}]}))
        .collect();
    if channel == "logprob" {
        entries[1]["token"] = json!(text);
    }
    if channel == "top_logprob" {
        entries[2]["top_logprobs"][1]["token"] = json!(text);
    }
    let (id, name, args) = (at("tool_id", PLACED_CALL.0), at("tool_name", PLACED_CALL.1), PLACED_CALL.2);
    let fingerprint = at("fingerprint", PLACED_FINGERPRINT);
    if !stream {
        let message = json!({"role": "assistant", "content": PLACED_CONTENT,
            "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": args}}]});
        let body = json!({"id": "mock-1", "object": "chat.completion", "created": 1, "model": model, "system_fingerprint": fingerprint,
            "choices": [{"index": 0, "message": message, "logprobs": {"content": entries}, "finish_reason": "tool_calls"}]});
        return axum::Json(body).into_response();
    }
    let with_fp = |mut c: Value| {
        c["system_fingerprint"] = json!(fingerprint);
        c
    };
    let mut frames = vec![with_fp(chunk(
        model,
        json!([{"index": 0, "delta": {"role": "assistant", "content": PLACED_CONTENT}, "logprobs": {"content": entries}, "finish_reason": null}]),
    ))];
    if channel == "midstream" {
        let error = json!({"error": {"message": format!("The server had an error: {text}"), "type": "server_error", "code": text}});
        return sse_response(Body::from_stream(futures::stream::iter(sse(vec![frames.remove(0), error], false))));
    }
    frames.push(with_fp(chunk(model, json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]}, "finish_reason": null}]))));
    let (a, b) = args.split_at(args.len() / 2);
    for piece in [a, b] {
        frames.push(with_fp(chunk(model, json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, "finish_reason": null}]))));
    }
    frames.push(with_fp(chunk(model, json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]))));
    sse_response(Body::from_stream(futures::stream::iter(sse(frames, true))))
}
