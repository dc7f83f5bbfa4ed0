//! Probing the firewall: a tenant that keeps getting responses blocked for another
//! tenant's data learns, block by block, what others sent. Past the configured number of
//! foreign-data blocks in the window it is flagged (metrics, dashboard) and, when its
//! config says so, refused with 403 `tenant_quarantined`; a tenant without quarantine is
//! flagged and still served.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::TestGateway;
use serde_json::{json, Value};

const ADMIN: &str = "admin-token-0123456789";
const NOTES: &str =
    "the board agreed to close the rotterdam warehouse before the winter audit and move inventory north";

fn config(base_url: &str) -> String {
    format!(
        "admin_token = \"{ADMIN}\"\n\
         [[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-key\"]\n\
         [[tenants]]\nid = \"mallory\"\napi_keys = [\"sk-mallory-key\"]\nquarantine_when_probing = true\n\
         [[tenants]]\nid = \"curious\"\napi_keys = [\"sk-curious-key\"]\n\
         [[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{base_url}\"\n\
         [firewall]\nprobe_alert_blocks = 2\nprobe_window_secs = 600\n"
    )
}

async fn ask(gw: &TestGateway, tenant: &str, content: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(format!("sk-{tenant}-key"))
        .json(&json!({"model": "mock", "messages": [{"role": "user", "content": content}]}))
        .send()
        .await
        .expect("gateway answers");
    (resp.status().as_u16(), resp.json().await.unwrap_or(Value::Null))
}

async fn tenants_page(gw: &TestGateway) -> String {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let login = client.post(gw.url("/admin/login")).form(&[("token", ADMIN)]).send().await.expect("login");
    let cookie = login
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|c| c.split(';').next())
        .expect("session cookie")
        .to_owned();
    client
        .get(gw.url("/admin/tenants"))
        .header("cookie", cookie)
        .send()
        .await
        .expect("tenants page")
        .text()
        .await
        .expect("html")
}

#[tokio::test]
async fn repeated_foreign_blocks_flag_the_asker_and_quarantine_it_when_configured() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url()), &[]).await;
    let ok = mock.can("Noted.");
    let (status, _) = ask(&gw, "acme", &format!("{NOTES}\n#canned {ok}")).await;
    assert_eq!(status, 200);
    // The answer quotes acme's notes; acme's own prompt line is the script, not the notes.
    let leak = mock.can(format!("I recall that {NOTES}."));

    for tenant in ["mallory", "curious"] {
        for _ in 0..2 {
            let (status, body) = ask(&gw, tenant, &format!("#canned {leak}")).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["choices"][0]["finish_reason"], "content_filter", "{body}");
        }
    }
    // Flagged: mallory is refused, curious (no quarantine) is still served.
    let (status, body) = ask(&gw, "mallory", &format!("#canned {ok}")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "tenant_quarantined");
    assert_eq!(body["error"]["type"], "permission_error");
    let (status, body) = ask(&gw, "curious", &format!("#canned {ok}")).await;
    assert_eq!((status, body["choices"][0]["message"]["content"].as_str()), (200, Some("Noted.")));
    // acme, whose data it was, is untouched.
    assert_eq!(ask(&gw, "acme", &format!("#canned {ok}")).await.0, 200);

    let metrics = reqwest::get(gw.url("/metrics")).await.expect("metrics").text().await.expect("text");
    for line in [
        "crossguard_tenant_probing{tenant=\"mallory\"} 1",
        "crossguard_tenant_probing{tenant=\"curious\"} 1",
        "crossguard_probing_alerts_total{tenant=\"mallory\"} 1",
        "crossguard_foreign_blocks_total{tenant=\"curious\"} 2",
    ] {
        assert!(metrics.contains(line), "missing {line}");
    }
    assert!(!metrics.contains("crossguard_tenant_probing{tenant=\"acme\"}"));

    let page = tenants_page(&gw).await;
    assert!(page.contains("probing, quarantined"), "mallory's row shows the quarantine");
    assert_eq!(page.matches(">probing").count(), 2, "both probing tenants are flagged");
}
