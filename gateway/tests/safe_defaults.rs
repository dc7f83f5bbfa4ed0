//! Safe defaults, checked on the real binary as an attacker or a careless operator would
//! meet them: `/metrics` behind its token, open mode refused off loopback, fault switches
//! refused without `CROSSGUARD_ENABLE_FAULTS=1`, `check-config` without secrets, logs
//! without any text a client or an upstream chose, admin-token guessing throttled.

#![allow(clippy::expect_used, clippy::panic)] // a test: a failed set-up step should stop it loudly

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use common::{write_config, Served, BIN};
use serde_json::{json, Value};

/// A config with one tenant and an upstream model at `upstream` (never loads a GGUF).
fn tenant_config(upstream: &str, extra: &str) -> String {
    let data = tempfile::tempdir().expect("data dir").keep();
    format!(
        "listen = \"127.0.0.1:0\"\ndata_dir = \"{}\"\n{extra}\n[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-key-1\"]\n\
         [[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"{upstream}\"\n",
        data.display()
    )
}

fn run(args: &[&str], config: &str, env: &[(&str, &str)]) -> std::process::Output {
    let file = write_config(config);
    Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(file.path())
        .env_clear()
        .envs(env.iter().copied())
        .output()
        .expect("binary runs")
}

#[tokio::test]
async fn metrics_needs_its_token_when_one_is_set() {
    const TOKEN: &str = "metrics-token-0123456789";
    let served = Served::start(&tenant_config("http://127.0.0.1:1/v1", ""), &[("CROSSGUARD_METRICS_TOKEN", TOKEN)]);
    let http = reqwest::Client::new();
    let scrape = |auth: Option<&str>| {
        let mut request = http.get(served.url("/metrics"));
        if let Some(a) = auth {
            request = request.header("authorization", a);
        }
        request.send()
    };
    for auth in
        [None, Some("Bearer wrong-token-0123456789"), Some(TOKEN), Some("Bearer "), Some("Bearer sk-acme-key-1")]
    {
        let response = scrape(auth).await.expect("answers");
        assert_eq!(response.status(), 401, "{auth:?}");
        let body = response.text().await.expect("body");
        assert!(!body.contains("crossguard_") && body.contains("authentication_error"), "{body}");
    }
    let response = scrape(Some(&format!("Bearer {TOKEN}"))).await.expect("answers");
    assert_eq!(response.status(), 200);
    assert!(response.text().await.expect("body").contains("crossguard_http_requests_total"));

    // Without a token /metrics stays open, as before.
    let open = Served::start(&tenant_config("http://127.0.0.1:1/v1", ""), &[]);
    assert_eq!(reqwest::get(open.url("/metrics")).await.expect("answers").status(), 200);
}

#[tokio::test]
async fn open_mode_is_refused_off_loopback_unless_allowed() {
    let data = tempfile::tempdir().expect("data dir");
    let config = format!(
        "listen = \"0.0.0.0:0\"\ndata_dir = \"{}\"\n[[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\n",
        data.path().display()
    );
    let refused = run(&["serve"], &config, &[]);
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("allow_open") && err.contains("0.0.0.0:0") && err.contains("[[tenants]]"), "{err}");
    assert_eq!(run(&["check-config"], &config, &[]).status.code(), Some(2), "check-config says the same");

    let allowed = Served::start(&format!("allow_open = true\n{config}"), &[]);
    let answer = reqwest::get(allowed.url("/v1/models")).await.expect("answers");
    assert_eq!(answer.status(), 200, "served without a key, as asked");
    let log = allowed.stop().join("\n");
    assert!(log.contains("no [[tenants]] configured") && log.contains("/metrics is open"), "{log}");
}

#[test]
fn fault_tables_need_the_enabling_variable() {
    let data = tempfile::tempdir().expect("data dir");
    let config = format!(
        "data_dir = \"{}\"\n[[tenants]]\nid = \"acme\"\napi_keys = [\"sk-acme-key-1\"]\n\
         [[models]]\nid = \"m\"\nbackend = \"engine\"\npath = \"/nonexistent.gguf\"\n[models.fault]\nskip_zero_fill = true\n",
        data.path().display()
    );
    for command in ["serve", "check-config"] {
        let out = run(&[command], &config, &[]);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("models[0].fault") && err.contains("CROSSGUARD_ENABLE_FAULTS=1"), "{command}: {err}");
        let set_wrong = run(&[command], &config, &[("CROSSGUARD_ENABLE_FAULTS", "yes")]);
        assert_eq!(set_wrong.status.code(), Some(2), "{command}: only 1 enables");
    }
    let enabled = run(&["check-config"], &config, &[("CROSSGUARD_ENABLE_FAULTS", "1")]);
    assert!(enabled.status.success(), "{}", String::from_utf8_lossy(&enabled.stderr));
    assert!(String::from_utf8_lossy(&enabled.stdout).contains("faults = [\"skip_zero_fill\"]"));
}

#[test]
fn check_config_shows_no_secret() {
    // Every secret field holds a distinctive value; none of it may be printed.
    let fingerprint_key = "a1b2c3d4e5f60718293a4b5c6d7e8f90";
    let config = "metrics_token = \"zqsecret-metrics-token\"\n\
                  [[tenants]]\nid = \"acme\"\napi_keys = [\"zqsecret-tenant-key\"]\n\
                  [[models]]\nid = \"mock\"\nbackend = \"upstream\"\nbase_url = \"https://user:zqsecret-basepass@upstream.internal/v1?key=zqsecret-query\"\n\
                  api_key_env = \"UPSTREAM_KEY\"\n\
                  [store]\nkind = \"redis\"\nurl = \"redis://default:zqsecret-redis-pass@127.0.0.1:6379/0\"\n";
    let env = [
        ("CROSSGUARD_ADMIN_TOKEN", "zqsecret-admin-token"),
        ("UPSTREAM_KEY", "zqsecret-upstream-key"),
        ("CROSSGUARD_FINGERPRINT_KEY", fingerprint_key),
    ];
    let out = run(&["check-config"], config, &env);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    for secret in ["zqsecret", "a1b2c3", "161, 178"] {
        assert!(!stdout.contains(secret) && !stderr.contains(secret), "{secret} printed:\n{stdout}{stderr}");
    }
    // The summary is there, secrets as ***, the rest as configured.
    for shown in [
        "1 tenant(s)",
        "admin_token = ***",
        "metrics_token = ***",
        "api_keys = *** (1 key(s))",
        "api_key = ***",
        "key = ***",
        "redis://default:***@127.0.0.1:6379/0",
        "https://user:***@upstream.internal/v1?***",
        "[admin_throttle] client_failures = 5, global_failures = 50",
    ] {
        assert!(stdout.contains(shown), "{shown} missing:\n{stdout}");
    }
}

const MARK: &str = "zq7marker";

/// An upstream whose errors quote the request back: 400 for model `mock`, 500 for `mock5`.
async fn quoting_upstream() -> SocketAddr {
    async fn answer(Json(body): Json<Value>) -> (StatusCode, Json<Value>) {
        let status = if body["model"] == "mock5" { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::BAD_REQUEST };
        let message = format!("{MARK}: you sent {body}");
        (status, Json(json!({"error": {"message": message, "type": MARK, "code": MARK, "param": MARK}})))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind upstream");
    let addr = listener.local_addr().expect("upstream address");
    tokio::spawn(async move { axum::serve(listener, Router::new().route("/v1/chat/completions", post(answer))).await });
    addr
}

#[tokio::test]
async fn logs_carry_no_client_or_upstream_text() {
    let upstream = quoting_upstream().await;
    let base = format!("http://{upstream}/v1");
    let config = format!(
        "{}[[models]]\nid = \"mock5\"\nbackend = \"upstream\"\nbase_url = \"{base}\"\n",
        tenant_config(&base, "")
    );
    let served = Served::start(&config, &[]);
    let http = reqwest::Client::new();
    let chat = |model: &str, request_id: &str, key: &str| {
        http.post(served.url("/v1/chat/completions"))
            .bearer_auth(key)
            .header("x-request-id", request_id)
            .header("user-agent", format!("agent-{MARK}"))
            .header("x-custom", MARK)
            .json(&json!({"model": model, "user": MARK, "messages": [{"role": "user", "content": format!("hello {MARK}")}]}))
    };
    let cases = [
        (chat("mock", &format!("id/{MARK}"), "sk-acme-key-1"), 400),
        (chat("mock5", &format!("{MARK}?"), "sk-acme-key-1"), 502),
        (chat(&format!("model-{MARK}"), "req-1", "sk-acme-key-1"), 404),
        (chat("mock", "req-2", &format!("sk-{MARK}")), 401),
        (
            http.post(served.url("/v1/chat/completions"))
                .bearer_auth("sk-acme-key-1")
                .body(format!("{{\"model\": {MARK}")),
            400,
        ),
        (
            http.post(served.url("/v1/chat/completions"))
                .bearer_auth("sk-acme-key-1")
                .json(&json!({"model": "mock", "messages": [{"role": MARK, "content": "x"}]})),
            400,
        ),
        (http.get(served.url(&format!("/v1/{MARK}"))), 404),
        (http.delete(served.url(&format!("/v1/models/{MARK}"))), 405),
    ];
    for (i, (request, status)) in cases.into_iter().enumerate() {
        let response = request.send().await.expect("gateway answers");
        assert_eq!(response.status().as_u16(), status, "case {i}");
    }
    let lines = served.stop();
    let log = lines.join("\n");
    // The log does report every one of them (else this test would prove nothing) ...
    let rejected = lines.iter().filter(|l| l.contains("request rejected") || l.contains("request failed")).count();
    assert!(rejected >= 8, "{log}");
    for expected in
        ["upstream message [", "unknown model [", "invalid parameter messages[0].role [", "unknown route GET ["]
    {
        assert!(log.contains(expected), "{expected} not logged:\n{log}");
    }
    // ... and none of the text the client or the upstream chose.
    assert!(!log.to_ascii_lowercase().contains(MARK), "{log}");
}

/// A client whose connections come from `ip` (any 127.0.0.0/8 address is this host).
fn client_from(ip: &str) -> reqwest::Client {
    let ip: IpAddr = ip.parse().expect("address");
    reqwest::Client::builder()
        .local_address(ip)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("http client")
}

#[tokio::test]
async fn admin_guessing_is_throttled_per_client_then_for_everyone() {
    const ADMIN: &str = "admin-token-0123456789";
    let throttle = "[admin_throttle]\nclient_failures = 3\nglobal_failures = 5\n";
    let served =
        Served::start(&tenant_config("http://127.0.0.1:1/v1", &format!("admin_token = \"{ADMIN}\"\n{throttle}")), &[]);
    let api =
        |client: &reqwest::Client, token: &str| client.get(served.url("/admin/api/stats")).bearer_auth(token).send();
    let login = |client: &reqwest::Client, token: &str| {
        client.post(served.url("/admin/login")).form(&[("token", token)]).send()
    };
    let (guesser, admin, other) = (client_from("127.0.0.1"), client_from("127.0.0.2"), client_from("127.0.0.3"));

    assert_eq!(api(&guesser, "wrong-guess-1").await.expect("answers").status(), 401);
    assert_eq!(login(&guesser, "wrong-guess-2").await.expect("answers").status(), 401);
    assert_eq!(api(&guesser, "wrong-guess-3").await.expect("answers").status(), 401);
    // Three wrong: the right token no longer helps this client, on either door.
    let locked = api(&guesser, ADMIN).await.expect("answers");
    assert_eq!(locked.status(), 429);
    let retry_after: u64 = locked.headers()["retry-after"].to_str().expect("ascii").parse().expect("seconds");
    assert!((1..=300).contains(&retry_after), "{retry_after}");
    assert_eq!(locked.json::<Value>().await.expect("json")["error"]["code"], "admin_login_throttled");
    let page = login(&guesser, ADMIN).await.expect("answers");
    assert_eq!(page.status(), 429);
    assert!(page.headers().contains_key("retry-after"));

    // Another address is not locked out by someone else's guesses.
    assert_eq!(api(&admin, ADMIN).await.expect("answers").status(), 200);
    assert_eq!(login(&admin, ADMIN).await.expect("answers").status(), 303);
    // Until everyone's failures reach global_failures: then nobody gets in for the cooldown.
    assert_eq!(api(&admin, "wrong-guess-4").await.expect("answers").status(), 401);
    assert_eq!(api(&admin, "wrong-guess-5").await.expect("answers").status(), 401);
    for client in [&admin, &other] {
        assert_eq!(api(client, ADMIN).await.expect("answers").status(), 429);
    }

    let metrics = reqwest::get(served.url("/metrics")).await.expect("answers").text().await.expect("body");
    for line in [
        "crossguard_admin_login_failures_total 5",
        "crossguard_admin_login_throttled_total{scope=\"client\"} 2",
        "crossguard_admin_login_throttled_total{scope=\"global\"} 2",
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}
