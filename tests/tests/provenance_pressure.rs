//! The provenance index under a flood, end to end: one tenant sending prompts of random
//! words (every 8-gram new) fills the index, yet another tenant's prompt — sent after the
//! flood or before it — stays indexed, so the firewall still blocks it when it leaks into a
//! third tenant's answer. The index is small here (`max_hashes = 1000`), so a few requests
//! fill it.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{sse_data, TestGateway, Words};
use serde_json::{json, Value};

const TENANTS: [&str; 3] = ["acme", "globex", "mallory"];

/// globex's prompt: a sentence nobody else sends.
const GLOBEX_PROMPT: &str = "the merger with hollow creek partners closes on the ninth of march \
    and the board agreed to keep the purchase price of ninety one million under wraps until then";

fn config(base_url: &str) -> String {
    let mut text = String::new();
    for t in TENANTS {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"));
    }
    // max_tenant_share stays at its default (0.5)
    text.push_str(&format!("[[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{base_url}\"\n[provenance]\nmax_hashes = 1000\n"));
    text
}

/// Sends `messages` as `tenant`, streamed; returns the finish reason.
async fn finish_reason(gw: &TestGateway, tenant: &str, messages: Value) -> String {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": "mock", "stream": true, "messages": messages}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 200);
    let frames = sse_data(&resp.text().await.expect("body"));
    let chunks: Vec<Value> = frames.iter().filter_map(|f| serde_json::from_str(f).ok()).collect();
    chunks.iter().rev().find_map(|c| c["choices"][0]["finish_reason"].as_str()).unwrap_or_default().to_owned()
}

/// `prompt` as the tenant's first message; the upstream only acknowledges it.
async fn send_prompt(gw: &TestGateway, tenant: &str, prompt: &str) {
    let messages = json!([{"role": "user", "content": prompt}, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "#leak Noted."}]);
    assert_eq!(finish_reason(gw, tenant, messages).await, "stop");
}

/// mallory sends 5 prompts of 300 random words: about 1500 new 8-grams, past the index's 1000.
async fn flood(gw: &TestGateway) {
    let mut words = Words::new(99);
    for _ in 0..5 {
        send_prompt(gw, "mallory", &words.sentence(300)).await;
    }
}

/// acme is answered with 16 words of globex's prompt.
async fn leak_to_acme(gw: &TestGateway, mock: &MockUpstream) -> String {
    let fragment: Vec<&str> = GLOBEX_PROMPT.split_whitespace().skip(4).take(16).collect();
    let k = mock.can(format!("From the notes: {} That is all I have.", fragment.join(" ")));
    finish_reason(gw, "acme", json!([{"role": "user", "content": format!("#canned {k}")}])).await
}

async fn metric(gw: &TestGateway, name: &str) -> f64 {
    let text = reqwest::get(gw.url("/metrics")).await.expect("metrics").text().await.expect("body");
    text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0.0)
}

#[tokio::test]
async fn a_flood_cannot_stop_a_later_prompt_from_being_indexed() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url()), &[]).await;
    flood(&gw).await;
    send_prompt(&gw, "globex", GLOBEX_PROMPT).await;
    assert_eq!(leak_to_acme(&gw, &mock).await, "content_filter", "globex's prompt, sent after the flood, is detected");
    assert!(metric(&gw, "crossguard_provenance_evicted_total{reason=\"tenant_share\"}").await > 0.0);
    gw.stop().await;
}

#[tokio::test]
async fn a_flood_cannot_evict_an_earlier_prompt_of_another_tenant() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url()), &[]).await;
    send_prompt(&gw, "globex", GLOBEX_PROMPT).await;
    flood(&gw).await;
    assert_eq!(leak_to_acme(&gw, &mock).await, "content_filter", "globex's prompt, sent before the flood, is detected");
    gw.stop().await;
}
