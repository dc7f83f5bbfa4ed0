//! Every channel of a response, end to end: the real gateway in front of a scripted
//! upstream (`#place <channel> <text>`) that puts tenant acme's canary, or a secret a block
//! rule knows, into one channel of an answer to tenant globex — an upstream HTTP 400 or 500
//! body, an error event mid-stream, a logprob token, a `top_logprobs` token, a tool call's
//! name or id, `system_fingerprint`. The client never sees it, in the raw body bytes nor
//! in any decoded string (`bytes` arrays read as text too), streamed or not. A clean answer
//! comes through byte for byte (its `system_fingerprint` too, when not streamed). And `[firewall] max_holdback_bytes` is the limit the
//! gateway's scanners hold back to.

use crossguard_e2e::mock_upstream::{MockUpstream, PLACED_CALL, PLACED_CONTENT, PLACED_FINGERPRINT, PLACED_TOKENS};
use crossguard_e2e::{sse_data, TestGateway};
use serde_json::{json, Value};

/// A GitHub token: the built-in `github-pat-classic` rule blocks it for every tenant.
const SECRET: &str = "ghp_kjDyznajEXBur3wR0Ih1u4yxrZaOegtH82Vo";

fn config(base_url: &str, extra: &str) -> String {
    format!(
        r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
canary = true
[[tenants]]
id = "globex"
api_keys = ["sk-globex-1"]
[[models]]
id = "mock"
backend = "upstream"
base_url = "{base_url}"
{extra}
"#
    )
}

async fn post(gw: &TestGateway, key: &str, content: &str, stream: bool) -> reqwest::Response {
    let body = json!({"model": "mock", "stream": stream, "logprobs": true, "top_logprobs": 2, "messages": [{"role": "user", "content": content}]});
    reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("gateway answers")
}

/// acme's canary, as the upstream saw it injected into acme's system prompt.
async fn acme_canary(gw: &TestGateway, mock: &MockUpstream) -> String {
    assert_eq!(post(gw, "sk-acme-1", "#leak hello", false).await.status(), 200);
    let system = mock.received()[0].body["messages"][0]["content"].as_str().unwrap_or_default().to_owned();
    let at = system.find("cg-").expect("acme's system prompt carries its canary");
    system[at..at + 27].to_owned()
}

/// Every string in a JSON document; an array of byte values is read as text too.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) if !items.is_empty() && items.iter().all(|i| i.as_u64().is_some_and(|n| n < 256)) => {
            let bytes: Vec<u8> = items.iter().filter_map(Value::as_u64).map(|n| n as u8).collect();
            out.push(String::from_utf8_lossy(&bytes).into_owned());
        }
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| {
            out.push(k.clone());
            strings(v, out);
        }),
        _ => {}
    }
}

/// The JSON documents of a body: each SSE frame's, or the one object.
fn documents(body: &str, stream: bool) -> Vec<Value> {
    if stream {
        sse_data(body)
            .iter()
            .filter(|f| *f != "[DONE]")
            .map(|f| serde_json::from_str(f).expect("every frame is JSON"))
            .collect()
    } else {
        vec![serde_json::from_str(body).expect("the body is JSON")]
    }
}

/// Asserts `leak` is nowhere in what the client got, and returns the status and documents.
async fn received_without(resp: reqwest::Response, leak: &str, stream: bool, what: &str) -> (u16, Vec<Value>) {
    let status = resp.status().as_u16();
    let raw = resp.bytes().await.expect("body");
    let body = String::from_utf8_lossy(&raw).into_owned();
    // A prefix long enough to be the leak's own, short enough to catch a cut-off copy.
    let head = &leak[..12];
    assert!(!body.contains(head), "{what}: the raw body carries it: {body}");
    // An error before the stream started is an HTTP error: one JSON object.
    let docs = documents(&body, stream && status == 200);
    let mut all = Vec::new();
    docs.iter().for_each(|d| strings(d, &mut all));
    assert!(!all.iter().any(|s| s.contains(head)), "{what}: a decoded string carries it: {all:?}");
    (status, docs)
}

#[tokio::test]
async fn another_tenants_canary_or_a_secret_reaches_the_client_in_no_channel() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    let canary = acme_canary(&gw, &mock).await;
    let cases = [
        ("status400", false, 400),
        ("status500", false, 502),
        ("status400", true, 400),
        ("status500", true, 502),
        ("midstream", true, 200),
        ("logprob", false, 200),
        ("logprob", true, 200),
        ("top_logprob", false, 200),
        ("top_logprob", true, 200),
        ("tool_name", false, 200),
        ("tool_name", true, 200),
        ("tool_id", false, 200),
        ("tool_id", true, 200),
        ("fingerprint", false, 200),
        ("fingerprint", true, 200),
    ];
    for leak in [canary.as_str(), SECRET] {
        for (channel, stream, expected) in cases {
            let what = format!("{channel}, stream {stream}, {}", &leak[..3]);
            // Canned, so globex never sends it: its own secret coming back would not be a leak.
            let k = mock.can(leak);
            let resp = post(&gw, "sk-globex-1", &format!("#place {channel} @{k}"), stream).await;
            let request_id = resp.headers()["x-request-id"].to_str().expect("request id").to_owned();
            let (status, docs) = received_without(resp, leak, stream, &what).await;
            assert_eq!(status, expected, "{what}: {docs:?}");
            let last = docs.last().expect("a document");
            match (channel, stream) {
                ("status400" | "status500", _) => {
                    let message = last["error"]["message"].as_str().unwrap_or_default();
                    assert!(
                        message.contains(&request_id)
                            && message.contains(if channel == "status400" { "400" } else { "500" }),
                        "{what}: {message}"
                    );
                    // The upstream's code and param are no plain identifiers here: the gateway's own code, or none.
                    let code = if channel == "status400" { Value::Null } else { json!("upstream_error") };
                    assert_eq!(
                        (&last["error"]["code"], &last["error"]["param"]),
                        (&code, &Value::Null),
                        "{what}: {last}"
                    );
                }
                ("midstream", _) => {
                    assert!(
                        last["error"]["message"].as_str().is_some_and(|m| m.contains(&request_id)),
                        "{what}: {last}"
                    );
                    // What the firewall had released before the error went out; what it held
                    // (the word in progress) was never judged, so it never goes.
                    let sent = docs[0]["choices"][0]["delta"]["content"].as_str().unwrap_or_default();
                    assert!(!sent.is_empty() && PLACED_CONTENT.starts_with(sent), "{what}: {sent:?}");
                }
                ("fingerprint", true) => assert!(docs.iter().all(|d| d.get("system_fingerprint").is_none()), "{what}"),
                ("fingerprint", false) => assert!(last.get("system_fingerprint").is_none(), "{what}: {last}"),
                (_, true) => assert_eq!(last["choices"][0]["finish_reason"], "content_filter", "{what}: {last}"),
                (_, false) => assert_eq!(last["choices"][0]["finish_reason"], "content_filter", "{what}: {last}"),
            }
        }
    }
    let metrics = reqwest::get(gw.url("/metrics")).await.expect("metrics").text().await.expect("text");
    // Per leak: two 500s before the start, and one error event mid-stream, counted too.
    assert!(
        metrics.contains("crossguard_backend_errors_total{model=\"mock\",kind=\"upstream_error\"} 6\n"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_clean_answer_comes_through_unchanged() {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&config(&mock.base_url(), ""), &[]).await;
    for stream in [false, true] {
        let resp = post(&gw, "sk-globex-1", "#place clean -", stream).await;
        assert_eq!(resp.status(), 200);
        let docs = documents(&resp.text().await.expect("body"), stream);
        let (content, id, name, args, tokens, fingerprint) = if stream {
            let delta = |d: &Value, k: &str| d["choices"][0]["delta"][k].clone();
            let call = |d: &Value, k: &str| delta(d, "tool_calls")[0][k].clone();
            let joined = |f: &dyn Fn(&Value) -> Value| {
                docs.iter().filter_map(|d| f(d).as_str().map(str::to_owned)).collect::<String>()
            };
            let tokens: Vec<String> = docs
                .iter()
                .flat_map(|d| d["choices"][0]["logprobs"]["content"].as_array().cloned().unwrap_or_default())
                .map(|e| e["token"].as_str().unwrap_or_default().to_owned())
                .collect();
            (
                joined(&|d| delta(d, "content")),
                joined(&|d| call(d, "id")),
                joined(&|d| call(d, "function")["name"].clone()),
                joined(&|d| call(d, "function")["arguments"].clone()),
                tokens,
                // An upstream's streamed chunks' fingerprint is not relayed (the gateway's
                // chunks carry one only from a whole answer).
                PLACED_FINGERPRINT.to_owned(),
            )
        } else {
            let v = &docs[0];
            let message = &v["choices"][0]["message"];
            let call = &message["tool_calls"][0];
            let text = |x: &Value| x.as_str().unwrap_or_default().to_owned();
            let tokens = v["choices"][0]["logprobs"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .map(|e| text(&e["token"]))
                .collect();
            (
                text(&message["content"]),
                text(&call["id"]),
                text(&call["function"]["name"]),
                text(&call["function"]["arguments"]),
                tokens,
                text(&v["system_fingerprint"]),
            )
        };
        assert_eq!(content, PLACED_CONTENT, "stream {stream}");
        assert_eq!((id.as_str(), name.as_str(), args.as_str()), PLACED_CALL, "stream {stream}");
        assert_eq!(tokens, PLACED_TOKENS, "stream {stream}");
        assert_eq!(fingerprint, PLACED_FINGERPRINT, "stream {stream}");
        let last = docs.last().expect("a document");
        assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "stream {stream}: {last}");
    }
}

/// A rule whose match can stay in progress for a long time: `long_`, letters, then `_end`.
const LONG_RULE: &str = r#"
[[rule]]
id = "long-marker"
description = "a marker whose match only completes at its end"
severity = "critical"
action = "block"
regex = '\b(long_[a-z]{8,}_end)\b'
secret_group = 1
keywords = ["long_"]
must_match = ["x long_abcdefgh_end y"]
must_not_match = ["long_abc_end"]
"#;

/// What a streamed canned answer released, and its finish reason (canned, so the asker
/// never sent the text: its own would not be a leak).
async fn streamed(gw: &TestGateway, mock: &MockUpstream, text: &str) -> (String, String) {
    let resp = post(gw, "sk-globex-1", &format!("#canned {}", mock.can(text)), true).await;
    let docs = documents(&resp.text().await.expect("body"), true);
    let released = docs.iter().filter_map(|d| d["choices"][0]["delta"]["content"].as_str()).collect();
    let finish = docs
        .iter()
        .filter_map(|d| d["choices"][0]["finish_reason"].as_str())
        .next_back()
        .unwrap_or_default()
        .to_owned();
    (released, finish)
}

#[tokio::test]
async fn the_configured_holdback_limit_is_the_scanners() {
    let mock = MockUpstream::start().await;
    let rules = tempfile::tempdir().expect("rule folder");
    std::fs::write(rules.path().join("long.toml"), LONG_RULE).expect("rule file");
    let answer = format!("Marker: long_{}_end and done.", "q".repeat(300));
    let firewall = |limit: &str| format!("[firewall]\nrules_dir = \"{}\"\n{limit}", rules.path().display());

    // The default limit (4096 bytes) holds the whole candidate until `_end` completes it.
    let gw = TestGateway::start(&config(&mock.base_url(), &firewall("")), &[]).await;
    assert_eq!(streamed(&gw, &mock, &answer).await, ("Marker: ".to_owned(), "content_filter".to_owned()));
    gw.stop().await;

    // At 64 bytes the candidate is given up long before its end: its bytes go out, judged
    // on what was seen, and the `_end` that follows completes nothing.
    let gw = TestGateway::start(&config(&mock.base_url(), &firewall("max_holdback_bytes = 64\n")), &[]).await;
    assert_eq!(streamed(&gw, &mock, &answer).await, (answer.clone(), "stop".to_owned()));
}
