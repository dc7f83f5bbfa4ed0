//! Engine streams under slow, absent and greedy clients, over real sockets with the real
//! model: a streaming client that stops reading pauses its sequence (the engine stops
//! generating for it) and, after `stream_stall_ms`, loses it, its KV blocks back in the
//! free pool and a `stream_stalled` error at the end of its stream; a client that goes
//! away while paused frees its blocks at once; a paused client takes no batch slot from
//! another tenant; a 4 MiB prompt is tokenised without stalling the async workers.

use std::time::{Duration, Instant};

use crossguard_e2e::TestGateway;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const TENANTS: [&str; 2] = ["acme", "globex"];

fn config(model_keys: &str) -> String {
    let mut text = String::from("max_body_bytes = 8388608\n");
    for t in TENANTS {
        text.push_str(&format!(
            "[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"
        ));
    }
    text.push_str(&format!("[[models]]\nid = \"m\"\nbackend = \"engine\"\ncontext_tokens = 1024\nstream_buffer_events = 4\n{model_keys}\n"));
    text
}

/// The model's end-of-text tokens (SmolLM2: `<|endoftext|>`, `<|im_end|>`), suppressed so
/// that a request runs its whole budget.
fn no_end() -> Value {
    json!({"0": -100, "2": -100})
}

/// A long greedy stream whose every event is large (20 alternatives per token), so that a
/// client that stops reading fills the socket and the gateway's buffers quickly.
fn long_stream(max_tokens: u32) -> Value {
    json!({
        "model": "m", "stream": true, "temperature": 0, "max_tokens": max_tokens,
        "logprobs": true, "top_logprobs": 20, "logit_bias": no_end(),
        "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}],
    })
}

/// A streaming client on a raw socket with a small receive buffer, that reads only when
/// told to.
struct SlowReader {
    stream: TcpStream,
    seen: Vec<u8>,
}

impl SlowReader {
    /// Sends `body` as `tenant` and reads up to the first SSE event.
    async fn start(gw: &TestGateway, tenant: &str, body: &Value) -> SlowReader {
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stream = socket.connect(gw.addr).await.unwrap();
        let body = body.to_string();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer sk-{tenant}-key\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            gw.addr,
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let mut reader = SlowReader {
            stream,
            seen: Vec::new(),
        };
        reader.read_until("data: ", Duration::from_secs(120)).await;
        assert!(
            reader.seen.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&reader.seen)
        );
        reader
    }

    /// Reads until `needle` has been seen (or the stream ends), panicking after `limit`.
    async fn read_until(&mut self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        let mut buf = vec![0u8; 64 * 1024];
        while !String::from_utf8_lossy(&self.seen).contains(needle) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.stream.read(&mut buf)).await {
                Ok(Ok(0)) => break,
                Ok(Ok(n)) => self.seen.extend_from_slice(&buf[..n]),
                Ok(Err(e)) => panic!("reading the stream: {e}"),
                Err(_) => panic!("{needle:?} did not arrive in {limit:?}"),
            }
        }
        String::from_utf8_lossy(&self.seen).into_owned()
    }
}

/// One series of `/metrics` for model `m`.
async fn metric(gw: &TestGateway, name: &str) -> u64 {
    let text = reqwest::get(gw.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{name}{{model=\"m\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// Waits until `name` reaches `want`, panicking after `limit`.
async fn wait_metric(gw: &TestGateway, name: &str, want: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = metric(gw, name).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {got}, not {want}, after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// KV blocks held by sequences (used, less what only the prefix cache holds).
async fn blocks_in_sequences(gw: &TestGateway) -> u64 {
    metric(gw, "crossguard_engine_kv_blocks_used").await
        - metric(gw, "crossguard_engine_kv_blocks_cached").await
}

#[tokio::test]
async fn a_client_that_stops_reading_pauses_then_loses_its_sequence() {
    let gw = TestGateway::start(&config("stream_stall_ms = 2000"), &[]).await;
    gw.wait_ready(Duration::from_secs(240)).await;
    let max_tokens = 900;
    let mut reader = SlowReader::start(&gw, "acme", &long_stream(max_tokens)).await;
    wait_metric(
        &gw,
        "crossguard_engine_paused_requests",
        1,
        Duration::from_secs(60),
    )
    .await;
    assert!(
        blocks_in_sequences(&gw).await > 0,
        "the paused sequence keeps its blocks"
    );
    // The stall bound counts from the last pause: a cancel means it stayed paused that long.
    wait_metric(
        &gw,
        "crossguard_engine_stream_stall_cancels_total",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(metric(&gw, "crossguard_engine_paused_requests").await, 0);
    assert_eq!(
        blocks_in_sequences(&gw).await,
        0,
        "the cancelled sequence's blocks are back in the pool"
    );
    let generated = metric(&gw, "crossguard_engine_generated_tokens_total").await;
    assert!(
        generated < u64::from(max_tokens) / 2,
        "the engine generated {generated} of {max_tokens} tokens for a client that read one event"
    );
    // Reading again, the client gets what was buffered, then the reason its stream ended.
    let body = reader
        .read_until("stream_stalled", Duration::from_secs(30))
        .await;
    assert!(
        !body.contains("[DONE]"),
        "a stopped stream does not claim to be complete"
    );
}

#[tokio::test]
async fn a_paused_client_takes_no_slot_and_frees_its_blocks_when_it_leaves() {
    // One sequence per step, and a stall bound far beyond this test: only pausing lets
    // the other tenant in, and only the disconnect frees the blocks.
    let gw = TestGateway::start(&config("max_batch = 1\nstream_stall_ms = 600000"), &[]).await;
    gw.wait_ready(Duration::from_secs(240)).await;
    let reader = SlowReader::start(&gw, "acme", &long_stream(900)).await;
    wait_metric(
        &gw,
        "crossguard_engine_paused_requests",
        1,
        Duration::from_secs(60),
    )
    .await;
    let answer = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-globex-key")
        .timeout(Duration::from_secs(60))
        .json(&json!({"model": "m", "temperature": 0, "max_tokens": 8, "messages": [{"role": "user", "content": "What is 2 + 2?"}]}))
        .send()
        .await
        .expect("another tenant is served while a paused stream holds the only batch slot");
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["usage"]["completion_tokens"], 8, "{answer}");
    assert_eq!(
        metric(&gw, "crossguard_engine_paused_requests").await,
        1,
        "still paused"
    );
    let held = blocks_in_sequences(&gw).await;
    assert!(held > 0);
    drop(reader);
    wait_metric(
        &gw,
        "crossguard_engine_disconnect_cancels_total",
        1,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(
        blocks_in_sequences(&gw).await,
        0,
        "the departed client's blocks are back in the pool"
    );
    assert_eq!(metric(&gw, "crossguard_engine_paused_requests").await, 0);
    assert_eq!(
        metric(&gw, "crossguard_engine_stream_stall_cancels_total").await,
        0
    );
}

#[tokio::test]
async fn a_huge_prompt_does_not_stall_the_async_workers() {
    let gw = TestGateway::start(&config(""), &[]).await;
    gw.wait_ready(Duration::from_secs(240)).await;
    // This test's runtime has one thread, shared by the gateway and this client: a prompt
    // tokenised on it would hold every other request until it is done.
    let prompt = crossguard_e2e::Words::new(29).sentence(700_000);
    let prompt = &prompt[..4 * 1024 * 1024];
    let body =
        json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]});
    let huge = tokio::spawn(
        reqwest::Client::new()
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth("sk-acme-key")
            .json(&body)
            .send(),
    );
    let (mut slowest, mut polls) = (Duration::ZERO, 0);
    while !huge.is_finished() {
        let asked = Instant::now();
        let status = reqwest::get(gw.url("/healthz")).await.unwrap().status();
        assert_eq!(status, 200);
        slowest = slowest.max(asked.elapsed());
        polls += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answer = huge.await.unwrap().unwrap();
    assert_eq!(
        answer.status(),
        400,
        "a prompt this long exceeds the context"
    );
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(
        answer["error"]["code"], "context_length_exceeded",
        "{answer}"
    );
    assert!(
        polls > 1,
        "the prompt was tokenised before /healthz could be asked"
    );
    assert!(
        slowest < Duration::from_secs(2),
        "/healthz took {slowest:?} while a huge prompt was tokenised"
    );
}
