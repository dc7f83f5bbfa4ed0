//! Per-tenant limits and per-model caps, end to end against the scripted upstream: 429s
//! with OpenAI's headers, slots held by streams and given back, budgets per tenant, the
//! caps on `n` and `max_tokens`, and the cap on one upstream SSE event.

use std::time::{Duration, Instant};

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{sse_data, upstream_config, TestGateway};
use serde_json::{json, Value};

const ENV: &[(&str, &str)] = &[("UPSTREAM_KEY", "upstream-secret")];
const ACME: &str = "sk-acme-1";
const GLOBEX: &str = "sk-globex-1";

/// The usual two tenants and model `mock` (with `model_keys`), then `tables` (`[limits]`...).
async fn setup(model_keys: &str, tables: &str) -> (MockUpstream, TestGateway) {
    let mock = MockUpstream::start().await;
    let config = format!("{}\n{tables}", upstream_config(&mock.base_url(), model_keys));
    let gw = TestGateway::start(&config, ENV).await;
    (mock, gw)
}

fn chat(content: &str) -> Value {
    json!({"model": "mock", "messages": [{"role": "user", "content": content}]})
}

fn streamed(content: &str) -> Value {
    let mut body = chat(content);
    body["stream"] = json!(true);
    body
}

async fn post(gw: &TestGateway, key: &str, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(body)
        .send()
        .await
        .expect("gateway answers")
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn header_u64(resp: &reqwest::Response, name: &str) -> u64 {
    header(resp, name).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} missing or not a number"))
}

/// Asserts a 429 in OpenAI's shape and returns its body.
async fn rate_limited(resp: reqwest::Response, kind: &str) -> Value {
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body: Value = resp.json().await.expect("JSON error body");
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
    body
}

/// A streaming request that stays open: its status and first bytes have arrived.
async fn open_stream(gw: &TestGateway, key: &str) -> reqwest::Response {
    let mut resp = post(gw, key, &streamed("#stall")).await;
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.expect("stream readable").expect("a first chunk");
    assert!(!first.is_empty());
    resp
}

/// Sends `body` as `key` until it is answered 200, for at most 10 s (a freed slot is
/// visible at once; the margin is for a loaded CI machine).
async fn eventually_admitted(gw: &TestGateway, key: &str, body: &Value) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = post(gw, key, body).await.status();
        if status == 200 {
            return;
        }
        assert_eq!(status, 429);
        assert!(Instant::now() < deadline, "the slot was never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metrics(gw: &TestGateway) -> String {
    reqwest::get(gw.url("/metrics")).await.expect("metrics answer").text().await.expect("metrics text")
}

#[tokio::test]
async fn concurrent_streams_over_the_limit_get_429_until_a_slot_is_freed() {
    let (_mock, gw) = setup("idle_timeout_ms = 600000", "[limits]\nmax_concurrent_requests = 2\n").await;
    let first = open_stream(&gw, ACME).await;
    let _second = open_stream(&gw, ACME).await;

    let resp = post(&gw, ACME, &streamed("one more")).await;
    assert_eq!(header(&resp, "retry-after"), Some("1"));
    let body = rate_limited(resp, "requests").await;
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("limit 2 in flight"), "{body}");
    // Another tenant has its own slots.
    assert_eq!(post(&gw, GLOBEX, &chat("hello")).await.status(), 200);

    // A client that goes away gives its slot back, though the upstream never ends.
    drop(first);
    eventually_admitted(&gw, ACME, &chat("after a disconnect")).await;
    // Streams that end give theirs back before their last bytes: with one slot held by
    // `_second`, each of these needs the slot the previous one had.
    for i in 0..3 {
        let resp = post(&gw, ACME, &streamed(&format!("stream {i}"))).await;
        assert_eq!(resp.status(), 200, "stream {i}");
        let frames = sse_data(&resp.text().await.expect("stream body"));
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        assert_eq!(post(&gw, ACME, &chat("whole")).await.status(), 200, "after stream {i}");
    }
    let text = metrics(&gw).await;
    assert!(text.contains("crossguard_rate_limited_total{tenant=\"acme\",limit=\"concurrent_requests\"} 1"), "{text}");
    assert!(!text.contains("tenant=\"globex\",limit="), "{text}");
}

#[tokio::test]
async fn requests_per_minute_run_out_with_consistent_headers() {
    let (mock, gw) = setup("", "[limits]\nrequests_per_minute = 3\n").await;
    for left in [2, 1, 0] {
        let resp = post(&gw, ACME, &chat("hi")).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header_u64(&resp, "x-ratelimit-limit-requests"), 3);
        assert_eq!(header_u64(&resp, "x-ratelimit-remaining-requests"), left);
        assert!(header(&resp, "x-ratelimit-reset-requests").is_some_and(|r| r.ends_with('s')));
        assert!(header(&resp, "x-ratelimit-limit-tokens").is_none(), "no token budget configured");
    }
    let resp = post(&gw, ACME, &streamed("hi")).await;
    // Three a minute: the next one is due within 20 s.
    let retry = header_u64(&resp, "retry-after");
    assert!((1..=20).contains(&retry), "retry-after {retry}");
    assert_eq!(header_u64(&resp, "x-ratelimit-remaining-requests"), 0);
    assert_eq!(header_u64(&resp, "x-ratelimit-limit-requests"), 3);
    let body = rate_limited(resp, "requests").await;
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("Limit 3, Used 3"), "{body}");
    assert_eq!(mock.received().len(), 3, "a refused request never reaches the upstream");
    // One tenant's exhaustion leaves the other's budget whole.
    let resp = post(&gw, GLOBEX, &chat("hi")).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header_u64(&resp, "x-ratelimit-remaining-requests"), 2);
    let text = metrics(&gw).await;
    assert!(text.contains("crossguard_rate_limited_total{tenant=\"acme\",limit=\"requests_per_minute\"} 1"), "{text}");
}

#[tokio::test]
async fn tokens_per_minute_reserve_max_tokens_and_refund_unused_ones() {
    let (_mock, gw) = setup("idle_timeout_ms = 600000", "[limits]\ntokens_per_minute = 1000\n").await;
    let mut big = chat("hi");
    big["max_tokens"] = json!(900);
    let resp = post(&gw, ACME, &big).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header_u64(&resp, "x-ratelimit-limit-tokens"), 1000);
    // Reserved at admission: 900 for the completion plus the prompt's estimate.
    assert!(header_u64(&resp, "x-ratelimit-remaining-tokens") < 100);
    let used = resp.json::<Value>().await.expect("completion")["usage"]["total_tokens"].as_u64().unwrap_or(0);
    assert!(used > 0 && used < 50, "the mock reports a small usage: {used}");

    // The answer used a few tokens: the rest came back, so the same request fits again.
    let resp = post(&gw, ACME, &big).await;
    assert_eq!(resp.status(), 200, "the unused reservation was refunded");
    drop(resp);

    // A stream that has not ended holds its reservation.
    let mut held = big.clone();
    held["stream"] = json!(true);
    held["messages"][0]["content"] = json!("#stall");
    let stalled = post(&gw, ACME, &held).await;
    assert_eq!(stalled.status(), 200);
    let resp = post(&gw, ACME, &big).await;
    assert!(header(&resp, "retry-after").is_some());
    assert!(header_u64(&resp, "x-ratelimit-remaining-tokens") < 900);
    rate_limited(resp, "tokens").await;
    // Another tenant's tokens are its own.
    assert_eq!(post(&gw, GLOBEX, &big).await.status(), 200);

    // Larger than a whole minute's budget: waiting would not help, so no Retry-After.
    let mut huge = chat("hi");
    huge["max_tokens"] = json!(5000);
    let resp = post(&gw, GLOBEX, &huge).await;
    assert!(header(&resp, "retry-after").is_none());
    let body = rate_limited(resp, "tokens").await;
    assert!(body["error"]["message"].as_str().unwrap_or("").contains("Request too large"), "{body}");
    drop(stalled);
}

#[tokio::test]
async fn a_tenant_table_overrides_the_global_limits() {
    let mock = MockUpstream::start().await;
    let config = format!(
        r#"
[limits]
requests_per_minute = 1

[[tenants]]
id = "acme"
api_keys = ["{ACME}"]

[[tenants]]
id = "globex"
api_keys = ["{GLOBEX}"]
[tenants.limits]
requests_per_minute = 3

[[models]]
id = "mock"
backend = "upstream"
base_url = "{}"
"#,
        mock.base_url()
    );
    let gw = TestGateway::start(&config, &[]).await;
    assert_eq!(post(&gw, ACME, &chat("hi")).await.status(), 200);
    rate_limited(post(&gw, ACME, &chat("hi")).await, "requests").await;
    for left in [2, 1, 0] {
        let resp = post(&gw, GLOBEX, &chat("hi")).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(header_u64(&resp, "x-ratelimit-limit-requests"), 3);
        assert_eq!(header_u64(&resp, "x-ratelimit-remaining-requests"), left);
    }
    rate_limited(post(&gw, GLOBEX, &chat("hi")).await, "requests").await;
}

/// Asserts a 400 naming `param` whose message states `cap`.
async fn over_cap(resp: reqwest::Response, param: &str, cap: &str) {
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("JSON error body");
    assert_eq!(body["error"]["param"], param, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains(&format!("at most {cap}")), "{body}");
}

#[tokio::test]
async fn n_and_max_tokens_over_the_model_caps_are_refused_naming_the_param() {
    let (mock, gw) = setup("max_n = 2\nmax_tokens_cap = 100", "").await;
    let with = |key: &str, value: u64| {
        let mut body = chat("hi");
        body[key] = json!(value);
        body
    };
    over_cap(post(&gw, ACME, &with("n", 3)).await, "n", "2").await;
    over_cap(post(&gw, ACME, &with("max_tokens", 101)).await, "max_tokens", "100").await;
    over_cap(post(&gw, ACME, &with("max_completion_tokens", 101)).await, "max_completion_tokens", "100").await;
    assert!(mock.received().is_empty(), "nothing over a cap reaches the upstream");
    assert_eq!(post(&gw, ACME, &with("n", 2)).await.status(), 200);
    assert_eq!(post(&gw, ACME, &with("max_tokens", 100)).await.status(), 200);
}

#[tokio::test]
async fn upstream_models_have_default_caps() {
    let (mock, gw) = setup("", "").await;
    let mut body = chat("hi");
    body["n"] = json!(9);
    over_cap(post(&gw, ACME, &body).await, "n", "8").await;
    let mut body = chat("hi");
    body["max_tokens"] = json!(40_000);
    over_cap(post(&gw, ACME, &body).await, "max_tokens", "32768").await;
    assert!(mock.received().is_empty());
}

#[tokio::test]
async fn an_upstream_event_past_the_cap_ends_the_stream_with_an_error() {
    let (_mock, gw) = setup("", "").await;
    let resp = post(&gw, ACME, &streamed("#bigevent 20")).await;
    assert_eq!(resp.status(), 200);
    let frames = sse_data(&resp.text().await.expect("stream body"));
    assert_ne!(frames.last().map(String::as_str), Some("[DONE]"), "an error stream ends without [DONE]");
    let last: Value = serde_json::from_str(frames.last().expect("frames")).expect("an error event");
    assert_eq!(last["error"]["type"], "upstream_error", "{last}");
    let message = last["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("larger than 8388608 bytes"), "{last}");
    let text = metrics(&gw).await;
    assert!(text.contains("crossguard_backend_errors_total{model=\"mock\",kind=\"upstream_error\"} 1"), "{text}");
}
