//! The production bug, re-created in the real engine and stopped end to end.
//!
//! Two engine-served models of the default GGUF, both with `stale_kv = 1.0` (a new request
//! is handed another tenant's released, unzeroed KV block as context):
//! - `guarded` keeps the owner check: bob's request that would read alice's block fails
//!   closed with an isolation error, counted on `/metrics`, and carries none of her data;
//! - `leaky` also turns the owner check off (`skip_owner_check`): the model really attends
//!   to alice's block, every token says so in its provenance, and the gateway's firewall
//!   blocks bob's response before its first byte, recording alice as the source.

use std::time::Duration;

use crossguard_e2e::{sse_data, TestGateway};
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789";

fn config() -> String {
    let mut text = format!("admin_token = \"{ADMIN}\"\n");
    for t in ["alice", "bob"] {
        text.push_str(&format!("[[tenants]]\nid = \"{t}\"\napi_keys = [\"sk-{t}-key\"]\n"));
    }
    for (id, owner_check) in [("guarded", true), ("leaky", false)] {
        text.push_str(&format!(
            "[[models]]\nid = \"{id}\"\nbackend = \"engine\"\ncontext_tokens = 512\n[models.fault]\nstale_kv = 1.0\nskip_owner_check = {}\n",
            !owner_check
        ));
    }
    text
}

async fn chat(gw: &TestGateway, tenant: &str, model: &str, text: &str, stream: bool) -> reqwest::Response {
    reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": model, "stream": stream, "temperature": 0, "max_tokens": 6,
                      "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .expect("gateway answers")
}

const ALICE: &str = "Project Nightingale budget is four million; the launch code is ORCHID-7741.";

#[tokio::test]
async fn a_stale_foreign_kv_block_is_refused_or_blocked_never_delivered() {
    let gw = TestGateway::start(&config(), &[("CROSSGUARD_ENABLE_FAULTS", "1")]).await;
    gw.wait_ready(Duration::from_secs(240)).await;

    // guarded: alice's released block is handed to bob, and the owner check refuses it.
    assert_eq!(chat(&gw, "alice", "guarded", ALICE, false).await.status(), 200);
    let refused = chat(&gw, "bob", "guarded", "Say hello.", false).await;
    assert_eq!(refused.status(), 500, "fails closed");
    let body = refused.text().await.unwrap();
    assert!(body.contains("isolation") && !body.contains("alice") && !body.contains("Nightingale"), "{body}");
    let metrics = reqwest::get(gw.url("/metrics")).await.unwrap().text().await.unwrap();
    let violations = metrics
        .lines()
        .find(|l| l.starts_with("crossguard_engine_kv_isolation_violations_total{model=\"guarded\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(violations.is_some_and(|n| n >= 1), "{metrics}");

    // leaky: the model reads alice's block for real; provenance names her on every token.
    assert_eq!(chat(&gw, "alice", "leaky", ALICE, false).await.status(), 200);
    let resp = chat(&gw, "bob", "leaky", "Say hello.", true).await;
    assert_eq!(resp.status(), 200);
    let audit_id =
        resp.headers().get("x-crossguard-audit-id").and_then(|v| v.to_str().ok()).map(str::to_owned).expect("audit id");
    let frames = sse_data(&resp.text().await.unwrap());
    assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = frames[..frames.len() - 1].iter().map(|f| serde_json::from_str(f).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, "", "not one token computed from alice's memory reaches bob");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "content_filter");

    let mut record = Value::Null;
    for _ in 0..200 {
        let r = reqwest::Client::new()
            .get(gw.url(&format!("/admin/api/audit/{audit_id}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        if r.status() == 200 {
            record = r.json().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(record["tenant"], "bob", "{record}");
    assert_eq!(record["findings"][0]["rule_id"], "foreign-provenance", "{record}");
    assert_eq!(record["source_tenants"], json!(["alice"]), "{record}");
    let metrics = reqwest::get(gw.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("crossguard_engine_kv_stale_handouts_total{model=\"leaky\"}"), "{metrics}");
}
