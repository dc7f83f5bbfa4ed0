//! CORS: a browser page on a configured origin may call the API (preflight answered, the
//! origin echoed, the rate-limit and audit headers exposed); any other origin, and every
//! origin when none is configured (the default), gets no CORS header at all; the admin API
//! never does.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{upstream_config, TestGateway};

const APP: &str = "https://app.example.com";

async fn preflight(gw: &TestGateway, origin: &str) -> reqwest::Response {
    reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, gw.url("/v1/chat/completions"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header("access-control-request-headers", "authorization, content-type, x-stainless-os")
        .send()
        .await
        .expect("gateway answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_origins_get_cors_and_others_do_not() {
    let mock = MockUpstream::start().await;
    let config = format!("{}\n[server]\ncors_allowed_origins = [\"{APP}\"]\n", upstream_config(&mock.base_url(), ""));
    let gw = TestGateway::start(&config, &[("UPSTREAM_KEY", "k")]).await;

    let resp = preflight(&gw, APP).await;
    assert!(resp.status().is_success(), "{}", resp.status());
    assert_eq!(resp.headers()["access-control-allow-origin"], APP);
    let methods = resp.headers()["access-control-allow-methods"].to_str().unwrap_or("").to_ascii_uppercase();
    assert!(methods.contains("POST"), "{methods}");

    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .header("origin", APP)
        .bearer_auth("sk-acme-1")
        .json(&serde_json::json!({"model": "mock", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["access-control-allow-origin"], APP);
    let exposed = resp.headers()["access-control-expose-headers"].to_str().unwrap_or("").to_owned();
    assert!(exposed.contains("x-request-id") && exposed.contains("x-crossguard-audit-id"), "{exposed}");

    let resp = preflight(&gw, "https://evil.example.net").await;
    assert!(!resp.headers().contains_key("access-control-allow-origin"), "{:?}", resp.headers());

    // The admin API stays same-origin, whatever origins the OpenAI API allows.
    let resp = reqwest::Client::new()
        .request(reqwest::Method::OPTIONS, gw.url("/admin/api/audit"))
        .header("origin", APP)
        .header("access-control-request-method", "GET")
        .send()
        .await
        .expect("gateway answers");
    assert!(!resp.headers().contains_key("access-control-allow-origin"), "{:?}", resp.headers());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_origin_is_allowed_by_default() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "k")]).await;
    let resp = preflight(&gw, APP).await;
    assert_eq!(resp.status(), 405);
    assert!(!resp.headers().contains_key("access-control-allow-origin"));
}
