//! The firewall on the response path, end to end: a secret the upstream streams in 40
//! pieces never reaches the client, the choice ends with `content_filter`, and the
//! non-streaming answer is scanned whole before anything is sent.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{sse_data, upstream_config, TestGateway};
use serde_json::{json, Value};

const SECRET: &str = "ghp_kjDyznajEXBur3wR0Ih1u4yxrZaOegtH82Vo";

async fn setup() -> (MockUpstream, TestGateway) {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    (mock, gw)
}

fn leak_request(stream: bool) -> Value {
    let text = format!("#leak Sure! Clone it with GITHUB_TOKEN={SECRET} and then run make. Good luck with the build.");
    json!({"model": "mock", "stream": stream, "messages": [{"role": "user", "content": text}]})
}

async fn post(gw: &TestGateway, body: &Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .json(body)
        .send()
        .await
        .expect("gateway answers")
}

#[tokio::test]
async fn a_secret_streamed_in_40_pieces_never_reaches_the_client() {
    let (_mock, gw) = setup().await;
    let resp = post(&gw, &leak_request(true)).await;
    assert_eq!(resp.status(), 200);
    let body = resp.text().await.unwrap();
    assert!(!body.contains("ghp_"), "no byte of the token prefix onward: {body}");
    assert!(!body.contains(&SECRET[4..12]));
    let frames = sse_data(&body);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert!(text.starts_with("Sure! Clone it with"), "{text}");
    assert!(!text.contains("make"), "nothing after the block: {text}");
    let roles = chunks.iter().filter(|c| c["choices"][0]["delta"].get("role").is_some()).count();
    assert_eq!(roles, 1);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(last["choices"][0]["delta"], json!({}));

    let metrics = reqwest::get(gw.url("/metrics")).await.unwrap().text().await.unwrap();
    let line = "crossguard_firewall_findings_total{tenant=\"acme\",rule=\"github-pat-classic\",action=\"block\"} 1";
    assert!(metrics.contains(line), "{metrics}");
}

#[tokio::test]
async fn a_non_streaming_answer_is_scanned_before_anything_is_sent() {
    let (_mock, gw) = setup().await;
    let resp = post(&gw, &leak_request(false)).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.contains("ghp_") && content.starts_with("Sure! Clone it with"), "{content}");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter");
}

#[tokio::test]
async fn clean_answers_pass_untouched() {
    let (_mock, gw) = setup().await;
    let text = "#leak The build uses make, then runs the tests; commit 3f9a2c1 fixed the flaky one.";
    let body = json!({"model": "mock", "stream": true, "messages": [{"role": "user", "content": text}]});
    let frames = sse_data(&post(&gw, &body).await.text().await.unwrap());
    let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect();
    let got: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(got, text.trim_start_matches("#leak "));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
}
