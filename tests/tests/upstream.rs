//! The gateway in front of a scripted upstream, over real sockets: the OpenAI surface,
//! streaming and not, and every error case of the contract.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{sse_data, upstream_config, TestGateway};
use serde_json::{json, Value};

const ENV: &[(&str, &str)] = &[("UPSTREAM_KEY", "upstream-secret")];

async fn setup(extra: &str) -> (MockUpstream, TestGateway) {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), extra), ENV).await;
    (mock, gw)
}

fn client() -> reqwest::Client {
    reqwest::Client::new()
}

async fn post(gw: &TestGateway, key: Option<&str>, body: &Value) -> reqwest::Response {
    let mut req = client().post(gw.url("/v1/chat/completions")).json(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.expect("gateway answers")
}

fn chat(content: &str) -> Value {
    json!({"model": "mock", "messages": [{"role": "user", "content": content}]})
}

async fn error_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    assert_eq!(resp.headers()["content-type"], "application/json", "errors are JSON");
    assert!(resp.headers().contains_key("x-request-id"));
    let body: Value = resp.json().await.expect("error body is JSON");
    for key in ["message", "type", "param", "code"] {
        assert!(body["error"].get(key).is_some(), "error envelope lacks {key}: {body}");
    }
    (status, body)
}

#[tokio::test]
async fn non_streaming_completion_is_relayed() {
    let (mock, gw) = setup("").await;
    let mut body = chat("hello world");
    body["reasoning_effort"] = json!("low");
    body["metadata"] = json!({"k": "v"});
    let resp = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .header("x-request-id", "test-req-42")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "test-req-42");
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "mock");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["choices"][0]["message"]["content"], "Echo: hello world");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["system_fingerprint"], "fp_mock");

    let got = &mock.received()[0];
    assert_eq!(got.body["model"], "mock-upstream", "model renamed for the upstream");
    assert_eq!(got.body["reasoning_effort"], "low", "unknown fields pass through");
    assert_eq!(got.body["metadata"], json!({"k": "v"}));
    assert_eq!(got.headers["authorization"], "Bearer upstream-secret");
    assert_eq!(got.headers["x-request-id"], "test-req-42");
}

#[tokio::test]
async fn streaming_completion_is_relayed_chunk_by_chunk() {
    let (_mock, gw) = setup("").await;
    let mut body = chat("one two three");
    body["stream"] = json!(true);
    let resp = post(&gw, Some("sk-acme-1"), &body).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    assert!(resp.headers().contains_key("x-request-id"));
    let text = resp.text().await.unwrap();
    let frames = sse_data(&text);
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let roles = chunks.iter().filter(|c| c["choices"][0]["delta"].get("role").is_some()).count();
    assert_eq!(roles, 1, "exactly one role chunk");
    let content: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "Echo: one two three");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "mock"));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "no usage unless asked");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn include_usage_adds_a_final_usage_chunk() {
    let (_mock, gw) = setup("").await;
    let mut body = chat("a b");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let frames = sse_data(&post(&gw, Some("sk-acme-1"), &body).await.text().await.unwrap());
    let last: Value = serde_json::from_str(&frames[frames.len() - 2]).unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["total_tokens"], 10);
    let first: Value = serde_json::from_str(&frames[0]).unwrap();
    assert!(first["usage"].is_null() && first.get("usage").is_some());
}

#[tokio::test]
async fn n_choices_streaming_and_not() {
    let (_mock, gw) = setup("").await;
    let mut body = chat("x y");
    body["n"] = json!(2);
    let v: Value = post(&gw, Some("sk-acme-1"), &body).await.json().await.unwrap();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["choices"][1]["index"], 1);
    body["stream"] = json!(true);
    let frames = sse_data(&post(&gw, Some("sk-acme-1"), &body).await.text().await.unwrap());
    let mut text = [String::new(), String::new()];
    let mut roles = [0, 0];
    for f in &frames[..frames.len() - 1] {
        let c: Value = serde_json::from_str(f).unwrap();
        let i = c["choices"][0]["index"].as_u64().unwrap() as usize;
        text[i].push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        roles[i] += c["choices"][0]["delta"].get("role").is_some() as usize;
    }
    assert_eq!(text, ["Echo: x y".to_string(), "Echo: x y".to_string()]);
    assert_eq!(roles, [1, 1]);
}

#[tokio::test]
async fn tool_call_fragments_stream_and_merge() {
    let (_mock, gw) = setup("").await;
    let tools = json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]);
    let mut body = chat("#tools");
    body["tools"] = tools;
    let v: Value = post(&gw, Some("sk-acme-1"), &body).await.json().await.unwrap();
    let call = &v["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    assert_eq!(call["id"], "call_1");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    body["stream"] = json!(true);
    let frames = sse_data(&post(&gw, Some("sk-acme-1"), &body).await.text().await.unwrap());
    let args: String = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str::<Value>(f).unwrap())
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(args, "{\"city\": \"Paris\"}");
}

#[tokio::test]
async fn request_errors_follow_the_contract() {
    let (_mock, gw) = setup("").await;
    let raw = client()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .header("content-type", "application/json")
        .body("{\"model\": \"mock\", ")
        .send()
        .await
        .unwrap();
    let (status, body) = error_of(raw).await;
    assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_json")));

    let cases = [
        (json!({"model": "mock", "messages": []}), "messages"),
        (json!({"model": "mock", "messages": [{"role": "wizard", "content": "x"}]}), "messages[0].role"),
        (json!({"model": "mock", "messages": [{"role": "user", "content": "x"}], "temperature": 9}), "temperature"),
        (json!({"model": "mock", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}), "max_tokens"),
        (json!({"model": 5, "messages": [{"role": "user", "content": "x"}]}), "model"),
    ];
    for (body, param) in cases {
        let (status, err) = error_of(post(&gw, Some("sk-acme-1"), &body).await).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(err["error"]["param"], param, "{body}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }

    for key in [None, Some("sk-wrong-key")] {
        let (status, err) = error_of(post(&gw, key, &chat("x")).await).await;
        assert_eq!(status, 401);
        assert_eq!(err["error"]["code"], "invalid_api_key");
    }

    let mut unknown = chat("x");
    unknown["model"] = json!("gpt-17");
    let (status, err) = error_of(post(&gw, Some("sk-acme-1"), &unknown).await).await;
    assert_eq!((status, err["error"]["code"].as_str()), (404, Some("model_not_found")));

    let huge = json!({"model": "mock", "messages": [{"role": "user", "content": "x".repeat(5 * 1024 * 1024)}]});
    let (status, _) = error_of(post(&gw, Some("sk-acme-1"), &huge).await).await;
    assert_eq!(status, 413);
}

#[tokio::test]
async fn upstream_failures_map_to_gateway_errors() {
    let (_mock, gw) = setup("first_byte_timeout_ms = 300\nidle_timeout_ms = 300").await;
    for (script, expected) in [
        ("#status 500", 502),
        ("#status 503", 502),
        ("#status 401", 502),
        ("#status 400", 400),
        ("#status 429", 429),
        ("#garbage", 502),
        ("#slow 2000", 504),
    ] {
        let (status, err) = error_of(post(&gw, Some("sk-acme-1"), &chat(script)).await).await;
        assert_eq!(status, expected, "{script}: {err}");
    }
    let resp = post(&gw, Some("sk-acme-1"), &chat("#status 400")).await;
    let request_id = resp.headers()["x-request-id"].to_str().unwrap().to_owned();
    let (_, err) = error_of(resp).await;
    let message = err["error"]["message"].as_str().unwrap();
    assert!(!message.contains("mock error"), "the upstream's own message is never relayed: {message}");
    assert!(message.contains("HTTP 400") && message.contains(&request_id), "{message}");
    assert_eq!(err["error"]["code"], "mock_code", "a plain identifier code is kept");
}

#[tokio::test]
async fn unreachable_upstream_is_502() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let gw = TestGateway::start(&upstream_config(&format!("http://127.0.0.1:{port}/v1"), ""), ENV).await;
    let (status, err) = error_of(post(&gw, Some("sk-acme-1"), &chat("x")).await).await;
    assert_eq!(status, 502);
    assert_eq!(err["error"]["type"], "upstream_error");
}

#[tokio::test]
async fn broken_streams_end_with_an_error_event() {
    let (_mock, gw) = setup("idle_timeout_ms = 300").await;
    for script in ["#stall", "#die"] {
        let mut body = chat(script);
        body["stream"] = json!(true);
        let resp = post(&gw, Some("sk-acme-1"), &body).await;
        assert_eq!(resp.status(), 200, "headers were already sent");
        let frames = sse_data(&resp.text().await.unwrap());
        let last: Value = serde_json::from_str(frames.last().unwrap()).unwrap();
        assert!(last["error"]["message"].is_string(), "{script}: {frames:?}");
        assert!(!frames.iter().any(|f| f == "[DONE]"), "{script}: a cut stream must not claim completion");
        assert!(frames.iter().any(|f| f.contains("partial")), "{script}: text before the break was relayed");
    }
}

#[tokio::test]
async fn models_health_metrics_and_fallbacks() {
    let (_mock, gw) = setup("").await;
    let c = client();
    let list: Value =
        c.get(gw.url("/v1/models")).bearer_auth("sk-globex-1").send().await.unwrap().json().await.unwrap();
    assert_eq!(list["object"], "list");
    assert_eq!(list["data"][0]["id"], "mock");
    let one: Value =
        c.get(gw.url("/v1/models/mock")).bearer_auth("sk-globex-1").send().await.unwrap().json().await.unwrap();
    assert_eq!(one["object"], "model");
    let (status, _) = error_of(c.get(gw.url("/v1/models/nope")).bearer_auth("sk-globex-1").send().await.unwrap()).await;
    assert_eq!(status, 404);
    let (status, _) = error_of(c.get(gw.url("/v1/models")).send().await.unwrap()).await;
    assert_eq!(status, 401);

    assert_eq!(c.get(gw.url("/healthz")).send().await.unwrap().status(), 200);
    let ready = c.get(gw.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(ready.headers().contains_key("x-request-id"));

    let (status, _) = error_of(c.get(gw.url("/v2/whatever")).send().await.unwrap()).await;
    assert_eq!(status, 404);
    let (status, _) = error_of(c.get(gw.url("/v1/chat/completions")).send().await.unwrap()).await;
    assert_eq!(status, 405);

    post(&gw, Some("sk-acme-1"), &chat("count me")).await;
    let metrics = c.get(gw.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("crossguard_http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("crossguard_completions_total{model=\"mock\",tenant=\"acme\",outcome=\"ok\"} 1"),
        "{metrics}"
    );
}
