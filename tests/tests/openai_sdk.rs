//! The official `openai` Python SDK against the gateway, unchanged: create, streaming,
//! models, and the SDK's exception types for 400/401/404; its Responses API
//! (`tests/python/responses_upstream.py`). The test command creates the
//! virtualenv (`.venv`, or `CROSSGUARD_PYTHON` names the interpreter).

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{run_python, upstream_config, TestGateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_python_sdk_works_unchanged() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    let stdout = run_python("sdk_compat.py", &[&gw.url("/v1"), "sk-acme-1", "mock"]).await;
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok")).count(), 10, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_works_unchanged_against_an_upstream() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    let stdout = run_python("responses_upstream.py", &[&gw.url("/v1"), "sk-acme-1", "sk-globex-1", "mock"]).await;
    println!("{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("ok")).count(), 7, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_completions_for_an_upstream_model_are_refused_by_name() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/completions"))
        .bearer_auth("sk-acme-1")
        .json(&serde_json::json!({"model": "mock", "prompt": "hi"}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 400);
    let body: serde_json::Value = resp.json().await.expect("JSON");
    assert_eq!(body["error"]["param"], "model", "{body}");
}
