//! The firewall on the response path, end to end: a secret the upstream streams in 40
//! pieces never reaches the client, the choice ends with `content_filter`, and the
//! non-streaming answer is scanned whole before anything is sent; a rule file dropped into
//! the watched rule folder stops the next matching response, and a broken one changes
//! nothing.

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

/// A password named away from its value, in a table's header or in another field (a
/// manifest's env list), ends the choice before the line that holds it, streamed and not.
#[tokio::test]
async fn a_password_named_away_from_its_value_ends_the_choice_before_its_line() {
    let (_mock, gw) = setup().await;
    // (what goes out, the rest)
    let cases = [
        (
            "Here are the accounts:\n\n| Service | User | Password |\n|---|---|---|\n",
            "| Postgres | app_rw | Kq8Wz3Tv6Lx2 |\n\nRotate them.",
        ),
        (
            "┌──────┬──────────────┐\n│ user │   password   │\n├──────┼──────────────┤\n",
            "│ app  │ Kq8Wz3Tv6Lx2 │\n└──────┴──────────────┘\n",
        ),
        ("env:\n  - name: DB_PASSWORD\n", "    value: Kq8Wz3Tv6Lx2\n  - name: PORT\n    value: \"8080\"\n"),
    ];
    for (head, rest) in cases {
        for stream in [true, false] {
            let content = format!("#leak {head}{rest}");
            let request =
                json!({"model": "mock", "stream": stream, "messages": [{"role": "user", "content": content}]});
            let resp = post(&gw, &request).await;
            assert_eq!(resp.status(), 200);
            let (text, finish) = if stream {
                let frames = sse_data(&resp.text().await.unwrap());
                let chunks: Vec<Value> =
                    frames.iter().filter(|f| *f != "[DONE]").map(|f| serde_json::from_str(f).unwrap()).collect();
                let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
                let finish = chunks
                    .iter()
                    .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
                    .next_back()
                    .map(String::from);
                (text, finish)
            } else {
                let v: Value = resp.json().await.unwrap();
                let text = v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string();
                (text, v["choices"][0]["finish_reason"].as_str().map(String::from))
            };
            assert_eq!(text, head, "stream: {stream}");
            assert_eq!(finish.as_deref(), Some("content_filter"), "stream: {stream}");
        }
    }
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

/// A rule of the kind a security team writes for its own keys, with its samples.
const ACME_RULE: &str = r#"
[[rule]]
id = "acmecorp-api-key"
description = "ACME Corp internal API key"
severity = "critical"
action = "block"
regex = '\b(acmecorp-key-[A-Za-z0-9]{20})\b'
secret_group = 1
keywords = ["acmecorp-key-"]
min_entropy = 3.0
must_match = ["token acmecorp-key-Ab12Cd34Ef56Gh78Ij90 here"]
must_not_match = ["acmecorp-key-EXAMPLE", "acmecorp-key-aaaaaaaaaaaaaaaaaaaa"]
"#;

const ACME_KEY: &str = "acmecorp-key-Zq81LmN4pR7tVx29KdW3";

/// The text one streamed answer released, and its finish reason.
async fn streamed(gw: &TestGateway, text: &str) -> (String, String) {
    let body =
        json!({"model": "mock", "stream": true, "messages": [{"role": "user", "content": format!("#leak {text}")}]});
    let frames = sse_data(&post(gw, &body).await.text().await.unwrap());
    let chunks: Vec<Value> = frames.iter().filter_map(|f| serde_json::from_str(f).ok()).collect();
    let released = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let finish = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .next_back()
        .unwrap_or_default()
        .to_owned();
    (released, finish)
}

/// Streams `answer` until its finish reason is `finish`, and returns what it released;
/// polled, not timed: the deadline only keeps a broken watch from hanging the test.
async fn once_it_finishes(gw: &TestGateway, answer: &str, finish: &str) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (released, got) = streamed(gw, answer).await;
        if got == finish {
            return released;
        }
        assert!(std::time::Instant::now() < deadline, "still {got:?}, not {finish:?}, after 60 s: {released}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_rule_file_dropped_into_the_watched_folder_stops_the_next_response() {
    let mock = MockUpstream::start().await;
    let rules = tempfile::tempdir().unwrap();
    for file in ["code-hosting.toml", "allow-lists.toml"] {
        let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../rules").join(file);
        std::fs::copy(shipped, rules.path().join(file)).unwrap();
    }
    let config = format!(
        "admin_token = \"{ADMIN}\"\n{}[firewall]\nrules_dir = \"{}\"\nwatch_interval_ms = 100\n",
        upstream_config(&mock.base_url(), ""),
        rules.path().display()
    );
    let gw = TestGateway::start(&config, &[("UPSTREAM_KEY", "k")]).await;
    let answer = format!("Here is the config: api token {ACME_KEY} and that is all.");
    assert_eq!(streamed(&gw, &answer).await, (answer.clone(), "stop".to_owned()), "no rule knows the key yet");

    assert_eq!(last_reload(&gw).await, Value::Null, "the rules loaded at start are no reload");
    std::fs::write(rules.path().join("acme.toml"), ACME_RULE).unwrap();
    let released = once_it_finishes(&gw, &answer, "content_filter").await;
    assert_eq!(released, "Here is the config: api token ", "everything before the key, nothing of it");
    let generation = rules_generation(&gw).await;
    let last = last_reload(&gw).await;
    assert_eq!(
        (&last["via"], &last["reloaded"], &last["generation"]),
        (&json!("rule folder watch"), &json!(true), &json!(generation)),
        "{last}"
    );

    // The rule removed and a broken file added in its place: the folder does not load, so
    // nothing of it does (a half-load would drop the rule), and the running rules stay. The
    // admin API says why, with the file and line.
    std::fs::remove_file(rules.path().join("acme.toml")).unwrap();
    std::fs::write(rules.path().join("broken.toml"), "[[rule]]\nid = \"Not Kebab\"\n").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let rejected = loop {
        let last = last_reload(&gw).await;
        if last["reloaded"] == json!(false) {
            break last;
        }
        assert!(std::time::Instant::now() < deadline, "no rejected reload after 60 s: {last}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        (&rejected["via"], &rejected["generation"]),
        (&json!("rule folder watch"), &json!(generation)),
        "{rejected}"
    );
    let errors = rejected["errors"].as_array().cloned().unwrap_or_default();
    assert!(
        errors.iter().any(|e| e["file"].as_str().is_some_and(|f| f.ends_with("broken.toml")) && e["line"] == json!(1)),
        "the error names broken.toml:1: {rejected}"
    );
    // And /metrics counts it, for an alert to catch.
    let metrics = reqwest::get(gw.url("/metrics")).await.unwrap().text().await.unwrap();
    assert!(
        metrics.contains("crossguard_rule_reloads_total{via=\"rule folder watch\",result=\"rejected\"} "),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("crossguard_rules_generation {generation}\n")), "{metrics}");
    assert_eq!(streamed(&gw, &answer).await.1, "content_filter");
    assert_eq!(rules_generation(&gw).await, generation);

    // Mended, the folder loads again: the watch did not give up after the failure.
    std::fs::remove_file(rules.path().join("broken.toml")).unwrap();
    assert_eq!(once_it_finishes(&gw, &answer, "stop").await, answer);
    assert!(rules_generation(&gw).await > generation);
}

const ADMIN: &str = "admin-token-for-the-watch-test";

/// What the admin API says the last rule reload did (`null`: none since start).
async fn last_reload(gw: &TestGateway) -> Value {
    admin_get(gw, "/admin/api/rules/reload").await["last_reload"].clone()
}

/// The running rules' generation, from the admin API.
async fn rules_generation(gw: &TestGateway) -> u64 {
    admin_get(gw, "/admin/api/health").await["rules"]["generation"].as_u64().expect("a generation")
}

async fn admin_get(gw: &TestGateway, path: &str) -> Value {
    let resp = reqwest::Client::new().get(gw.url(path)).bearer_auth(ADMIN).send().await.expect("gateway answers");
    resp.json().await.expect("the admin API answers JSON")
}
