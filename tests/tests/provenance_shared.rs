//! A replica that cannot pull the other replicas' fingerprints is blind to their tenants'
//! text: with `provenance.provenance_unavailable = "block"` (the default) it answers `/readyz` 503 with
//! the reason and refuses completions with 503 `provenance_unavailable` (a tenant with
//! `fail_mode = "open"` is still served), until Redis is back; with `"allow"` it serves,
//! degraded. Redis here is a private one on its own port, started late (never the shared one).

use std::time::{Duration, Instant};

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::own_redis::{free_port, OwnRedis};
use crossguard_e2e::TestGateway;
use serde_json::{json, Value};

const FP_KEY: &str = "00112233445566778899aabbccddeeff";

fn config(base_url: &str, redis_port: u16, unavailable: &str) -> String {
    format!(
        r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-key"]
[[tenants]]
id = "globex"
api_keys = ["sk-globex-key"]
fail_mode = "open"
[[models]]
id = "mock"
backend = "upstream"
base_url = "{base_url}"
[store]
kind = "redis"
url = "redis://127.0.0.1:{redis_port}"
op_timeout_ms = 300
[provenance]
refresh_interval_ms = 50
max_staleness_ms = 1000
provenance_unavailable = "{unavailable}"
"#
    )
}

async fn chat(gw: &TestGateway, tenant: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": "mock", "messages": [{"role": "user", "content": "hello there"}]}))
        .send()
        .await
        .expect("gateway answers");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn readyz(gw: &TestGateway) -> (u16, Value) {
    let resp = reqwest::get(gw.url("/readyz")).await.expect("readyz answers");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_replica_blind_to_the_others_fails_closed_until_redis_is_back() {
    let mock = MockUpstream::start().await;
    let port = free_port();
    let gw =
        TestGateway::start(&config(&mock.base_url(), port, "block"), &[("CROSSGUARD_FINGERPRINT_KEY", FP_KEY)]).await;

    let (status, body) = readyz(&gw).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["status"], "provenance_unavailable");
    assert!(body["reason"].as_str().unwrap_or_default().contains("fingerprints"), "{body}");
    let (status, body) = chat(&gw, "acme").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "provenance_unavailable");
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(chat(&gw, "globex").await.0, 200, "a fail-open tenant is served");

    let _redis = OwnRedis::start(port, tempfile::tempdir().expect("redis dir"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while readyz(&gw).await.0 != 200 {
        assert!(Instant::now() < deadline, "not ready 30 s after Redis came up: {}", readyz(&gw).await.1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(chat(&gw, "acme").await.0, 200);
    gw.stop().await;
}

#[tokio::test]
async fn allow_serves_without_the_other_replicas_and_says_degraded() {
    let mock = MockUpstream::start().await;
    let gw =
        TestGateway::start(&config(&mock.base_url(), free_port(), "allow"), &[("CROSSGUARD_FINGERPRINT_KEY", FP_KEY)])
            .await;
    let (status, body) = readyz(&gw).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("degraded")), "{body}");
    assert!(body["reason"].is_string(), "{body}");
    assert_eq!(chat(&gw, "acme").await.0, 200);
    gw.stop().await;
}
