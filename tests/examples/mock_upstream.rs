//! A fast OpenAI-compatible upstream for the gateway-overhead benchmark
//! (`scripts/bench/gateway_overhead.sh`): `POST /v1/chat/completions` on a given port,
//! answering every request with the same pre-built completion, or the same pre-built SSE
//! stream when the request says `"stream": true`.
//!
//! Why not `crossguard_e2e::mock_upstream::MockUpstream`: the scripted mock keeps every
//! request it receives (memory grows by ~1 KiB a request, hundreds of MiB over a benchmark)
//! and builds each answer with `json!` per request. Here the only per-request work is one
//! parse of the request body (to read `stream`) and cloning reference-counted buffers, so
//! the direct-to-mock figures measure the load generator and the loopback, not the mock.
//!
//! Invariant: the answers are valid OpenAI objects — the gateway parses and re-emits them,
//! so a malformed answer would measure an error path instead of the relay.
//!
//! Usage: `cargo run --release -p crossguard-e2e --example mock_upstream -- --port 19001`

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::serve::ListenerExt;
use axum::Router;
use bytes::Bytes;
use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Debug, Parser)]
#[command(about = "A fast OpenAI-compatible mock upstream for benchmarks")]
struct Args {
    /// Port on 127.0.0.1 (0 picks one; the address is printed on stdout).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Runtime worker threads (1: a current-thread runtime, which leaves the other core to
    /// the gateway and the load generator).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Content chunks in a streamed answer (plus a role chunk, a finish chunk and `[DONE]`).
    #[arg(long, default_value_t = 16)]
    stream_chunks: usize,
    /// Pause between streamed chunks, in microseconds (0: all at once; the runtime's timer
    /// rounds anything else up to whole milliseconds).
    #[arg(long, default_value_t = 0)]
    chunk_delay_us: u64,
    /// Every Nth answer (0: none) quotes a credential nobody sent (a GitHub token, fresh each
    /// time), which the gateway's rules block: soak runs count the audit records this makes.
    #[arg(long, default_value_t = 0)]
    leak_every: u64,
}

/// The pre-built answers, shared by every request.
struct Answers {
    /// One `chat.completion` JSON object.
    completion: Bytes,
    /// SSE frames in order: role, `stream_chunks` contents, finish, `[DONE]`.
    frames: Vec<Bytes>,
    chunk_delay: Duration,
    leak_every: u64,
    served: AtomicU64,
}

impl Answers {
    fn build(args: &Args) -> Answers {
        let words: Vec<String> = (0..args.stream_chunks).map(|i| format!("word{i} ")).collect();
        let (completion, frames) = answer(&words);
        Answers {
            completion,
            frames,
            chunk_delay: Duration::from_micros(args.chunk_delay_us),
            leak_every: args.leak_every,
            served: AtomicU64::new(0),
        }
    }

    /// The leaking answer for request number `n`: one sentence quoting a GitHub token made
    /// from `n` (so every leak is a different value).
    fn leak(n: u64) -> (Bytes, Vec<Bytes>) {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut token = String::from("ghp_");
        let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
        for _ in 0..36 {
            x ^= x >> 29;
            x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            token.push(char::from(ALPHABET[(x >> 58) as usize % ALPHABET.len()]));
        }
        answer(&[format!("Here is the deploy token: {token} - keep it safe.")])
    }
}

/// A completion whose content is `pieces` joined, and the SSE frames that stream it: role,
/// one chunk per piece, finish, `[DONE]`.
fn answer(pieces: &[String]) -> (Bytes, Vec<Bytes>) {
    let text: String = pieces.concat();
    let usage = json!({"prompt_tokens": 12, "completion_tokens": pieces.len(), "total_tokens": 12 + pieces.len()});
    let completion = json!({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock-upstream",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "logprobs": null, "finish_reason": "stop"}],
        "usage": usage, "system_fingerprint": "fp_mock"
    });
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1,
                       "model": "mock-upstream",
                       "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]});
        Bytes::from(format!("data: {c}\n\n"))
    };
    let mut frames = vec![chunk(json!({"role": "assistant", "content": ""}), Value::Null)];
    frames.extend(pieces.iter().map(|w| chunk(json!({"content": w}), Value::Null)));
    frames.push(chunk(json!({}), json!("stop")));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    (Bytes::from(completion.to_string()), frames)
}

async fn chat(State(answers): State<Arc<Answers>>, body: Bytes) -> Response {
    let request: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            let err = json!({"error": {"message": "invalid JSON", "type": "invalid_request_error"}});
            return (StatusCode::BAD_REQUEST, axum::Json(err)).into_response();
        }
    };
    let stream = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let n = answers.served.fetch_add(1, Ordering::Relaxed) + 1;
    let leak = (answers.leak_every > 0 && n % answers.leak_every == 0).then(|| Answers::leak(n));
    if !stream {
        let body = leak.map_or_else(|| answers.completion.clone(), |(completion, _)| completion);
        let mut response = Response::new(Body::from(body));
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return response;
    }
    let frames = leak.map_or_else(|| answers.frames.clone(), |(_, frames)| frames);
    let delay = answers.chunk_delay;
    let body = if delay.is_zero() {
        Body::from_stream(futures::stream::iter(frames.into_iter().map(Ok::<_, Infallible>)))
    } else {
        let paced = futures::stream::iter(frames.into_iter().enumerate()).then(move |(i, frame)| async move {
            if i > 0 {
                tokio::time::sleep(delay).await;
            }
            Ok::<_, Infallible>(frame)
        });
        Body::from_stream(paced)
    };
    let mut response = Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response
}

async fn serve(args: Args) -> std::io::Result<()> {
    let answers = Arc::new(Answers::build(&args));
    let app = Router::new().route("/v1/chat/completions", post(chat)).with_state(answers);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], args.port))).await?;
    println!("mock upstream listening on http://{}/v1", listener.local_addr()?);
    // Without TCP_NODELAY a frame written while the previous one is unacknowledged waits
    // for the peer's delayed ACK; a fast upstream must not add that to the figures.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.threads).enable_all().build()
    };
    let result = runtime.and_then(|rt| rt.block_on(serve(args)));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mock_upstream: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
