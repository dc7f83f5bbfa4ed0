//! Engine streams under slow, absent and greedy clients, over real sockets with the real
//! model: a streaming client that stops reading pauses its sequence (the engine stops
//! generating for it) and, after `stream_stall_ms`, loses it, its KV blocks back in the
//! free pool and a `stream_stalled` error at the end of its stream; a client that goes
//! away while paused frees its blocks at once; a paused client takes no batch slot from
//! another tenant; a 4 MiB prompt is tokenised without stalling the async workers.

use std::time::{Duration, Instant};

use std::sync::atomic::Ordering::Relaxed;

use crossguard_e2e::TestGateway;
use futures::StreamExt;
use gateway::api::ChatRequest;
use gateway::auth::TenantId;
use gateway::backend::engine_client::LoopGauges;
use gateway::backend::{BackendEvent, EngineBackend, EventStream, RequestContext};
use gateway::config::{Config, ModelBackend};
use gateway::error::ApiError;
use serde_json::{json, Value};

const TENANTS: [&str; 2] = ["acme", "globex"];

fn config(model_keys: &str) -> String {
    let mut text = String::from("max_body_bytes = 8388608\n");
    for t in TENANTS {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"));
    }
    text.push_str(&format!(
        "[[models]]\nid = \"m\"\nbackend = \"engine\"\ncontext_tokens = 1024\nstream_buffer_events = 4\n{model_keys}\n"
    ));
    text
}

/// The model's end-of-text tokens (SmolLM2: `<|endoftext|>`, `<|im_end|>`), suppressed so
/// that a request runs its whole budget.
fn no_end() -> Value {
    json!({"0": -100, "2": -100})
}

fn long_stream(max_tokens: u32) -> ChatRequest {
    let body = json!({
        "model": "m", "stream": true, "temperature": 0, "max_tokens": max_tokens, "logit_bias": no_end(),
        "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}],
    });
    ChatRequest::parse(body.to_string().as_bytes()).unwrap()
}

/// The gateway's engine backend for model `m`, loaded. The slow client is simulated at the
/// backend's own event stream, not over a socket: the kernel's and hyper's buffers would
/// otherwise absorb a whole short answer before the engine's channel ever filled.
async fn engine_backend(model_keys: &str) -> EngineBackend {
    let config = Config::from_parts(&config(model_keys), "test.toml", &[], &|_| None).unwrap();
    let ModelBackend::Engine(engine) = &config.models[0].backend else { panic!("an engine model") };
    let backend = EngineBackend::spawn_load("m", engine);
    let deadline = Instant::now() + Duration::from_secs(240);
    while !backend.is_ready() {
        assert!(Instant::now() < deadline, "the model did not load");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    backend
}

fn ctx(tenant: &str) -> RequestContext {
    RequestContext { request_id: format!("req-{tenant}"), tenant: TenantId::new(tenant) }
}

/// Waits until the loop gauge read by `get` reaches `want`, panicking after `limit`.
async fn wait_gauge(backend: &EngineBackend, name: &str, get: fn(&LoopGauges) -> u64, want: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let got = get(backend.gauges());
        if got == want {
            return;
        }
        assert!(Instant::now() < deadline, "{name} is {got}, not {want}, after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn paused(g: &LoopGauges) -> u64 {
    g.serve.paused.load(Relaxed) as u64
}

/// KV blocks held by sequences (used, less what only the prefix cache holds).
fn blocks_in_sequences(backend: &EngineBackend) -> usize {
    let kv = backend.kv_stats().expect("the model is loaded");
    kv.blocks_used - kv.blocks_cached
}

/// Tenant acme's long stream, read for one event and then left until its request pauses.
async fn paused_stream(backend: &EngineBackend, max_tokens: u32) -> EventStream {
    let mut events = backend.complete(&long_stream(max_tokens), &ctx("acme")).await.unwrap().events;
    assert!(matches!(events.next().await, Some(Ok(BackendEvent::Delta(_)))));
    wait_gauge(backend, "paused requests", paused, 1, Duration::from_secs(60)).await;
    events
}

#[tokio::test]
async fn a_client_that_stops_reading_pauses_then_loses_its_sequence() {
    let backend = engine_backend("stream_stall_ms = 2000").await;
    let max_tokens = 300;
    let mut events = paused_stream(&backend, max_tokens).await;
    assert!(blocks_in_sequences(&backend) > 0, "the paused sequence keeps its blocks");
    // The stall bound counts from the last pause: a cancel means it stayed paused that long.
    wait_gauge(&backend, "stall cancels", |g| g.serve.stall_cancels.load(Relaxed), 1, Duration::from_secs(30)).await;
    // The loop counts the cancel, releases the blocks, then stores the paused gauge at the end
    // of the same pass: a read in between saw 1 (a busy CI host did). Wait for that pass.
    wait_gauge(&backend, "paused requests", paused, 0, Duration::from_secs(5)).await;
    assert_eq!(blocks_in_sequences(&backend), 0, "the cancelled sequence's blocks are back in the pool");
    let generated = backend.gauges().serve.tokens.load(Relaxed);
    assert!(
        generated <= 16,
        "the engine generated {generated} of {max_tokens} tokens for a client that read one event (buffer: 4)"
    );
    // Reading again, the client gets what was buffered, then the reason its stream ended.
    let mut rest = Vec::new();
    while let Some(event) = events.next().await {
        rest.push(event);
    }
    assert!(rest.len() <= 6, "{rest:?}");
    assert!(matches!(rest.last(), Some(Err(ApiError::StreamStalled { stall_ms: 2000 }))), "{rest:?}");
}

#[tokio::test]
async fn a_paused_client_takes_no_slot_and_frees_its_blocks_when_it_leaves() {
    // One sequence per step, and a stall bound far beyond this test: only pausing lets
    // the other tenant in, and only the disconnect frees the blocks.
    let backend = engine_backend("max_batch = 1\nstream_stall_ms = 600000").await;
    let slow = paused_stream(&backend, 300).await;
    let short = json!({"model": "m", "temperature": 0, "max_tokens": 8, "logit_bias": no_end(), "messages": [{"role": "user", "content": "What is 2 + 2?"}]});
    let short = ChatRequest::parse(short.to_string().as_bytes()).unwrap();
    let other = backend.complete(&short, &ctx("globex")).await.unwrap().events;
    let other: Vec<_> = tokio::time::timeout(Duration::from_secs(60), other.collect::<Vec<_>>())
        .await
        .expect("another tenant is served while a paused stream holds the only batch slot");
    assert!(matches!(other.last(), Some(Ok(BackendEvent::Usage(u))) if u.completion_tokens == 8), "{other:?}");
    assert_eq!(paused(backend.gauges()), 1, "still paused");
    assert!(blocks_in_sequences(&backend) > 0);
    drop(slow);
    wait_gauge(&backend, "disconnect cancels", |g| g.serve.disconnects.load(Relaxed), 1, Duration::from_secs(30)).await;
    assert_eq!(blocks_in_sequences(&backend), 0, "the departed client's blocks are back in the pool");
    assert_eq!(paused(backend.gauges()), 0);
    assert_eq!(backend.gauges().serve.stall_cancels.load(Relaxed), 0);
}

#[tokio::test]
async fn a_huge_prompt_does_not_stall_the_async_workers() {
    let gw = TestGateway::start(&config(""), &[]).await;
    gw.wait_ready(Duration::from_secs(240)).await;
    // This test's runtime has one thread, shared by the gateway and this client: a prompt
    // tokenised on it would hold every other request until it is done.
    let prompt = crossguard_e2e::Words::new(29).sentence(700_000);
    let prompt = &prompt[..4 * 1024 * 1024];
    let body = json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": prompt}]});
    let huge = tokio::spawn(
        reqwest::Client::new().post(gw.url("/v1/chat/completions")).bearer_auth("sk-acme-key").json(&body).send(),
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
    assert_eq!(answer.status(), 400, "a prompt this long exceeds the context");
    let answer: Value = answer.json().await.unwrap();
    assert_eq!(answer["error"]["code"], "context_length_exceeded", "{answer}");
    assert!(polls > 1, "the prompt was tokenised before /healthz could be asked");
    assert!(slowest < Duration::from_secs(2), "/healthz took {slowest:?} while a huge prompt was tokenised");
}
