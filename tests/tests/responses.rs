//! `/v1/responses` in front of a scripted upstream: the request reaches the upstream as a
//! chat request; the answer comes back as Responses events or one `response` object; the
//! firewall blocks a leak in it as it does in chat (the response ends `incomplete`,
//! `content_filter`, without the leaked bytes); stored responses are the tenant's alone,
//! and hold only what was released.

use crossguard_e2e::mock_upstream::MockUpstream;
use crossguard_e2e::{upstream_config, TestGateway};
use serde_json::{json, Value};

/// A GitHub token: the built-in `github-pat-classic` rule blocks it for every tenant.
const SECRET: &str = "ghp_kjDyznajEXBur3wR0Ih1u4yxrZaOegtH82Vo";

async fn start() -> (MockUpstream, TestGateway) {
    let mock = MockUpstream::start().await;
    let gw = TestGateway::start(&upstream_config(&mock.base_url(), ""), &[("UPSTREAM_KEY", "sk-up")]).await;
    (mock, gw)
}

async fn create(gw: &TestGateway, key: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(gw.url("/v1/responses"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("gateway answers")
}

async fn json_of(resp: reqwest::Response) -> (u16, Value) {
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("a JSON body"))
}

/// (event, data) of every frame of a Responses stream, checking its framing.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|frame| {
            let (event, data) = frame.split_once('\n').unwrap_or_else(|| panic!("a frame without data: {frame:?}"));
            let kind = event.strip_prefix("event: ").unwrap_or_else(|| panic!("no event line: {frame:?}")).to_owned();
            let data: Value =
                serde_json::from_str(data.strip_prefix("data: ").expect("a data line")).expect("JSON data");
            assert_eq!(data["type"], kind.as_str(), "{frame}");
            (kind, data)
        })
        .collect()
}

#[tokio::test]
async fn a_response_is_served_through_the_upstreams_chat_api_streamed_and_not() {
    let (mock, gw) = start().await;
    let body = json!({"model": "mock", "input": "hello there", "instructions": "Be brief.", "max_output_tokens": 50, "metadata": {"run": "1"}});
    let (status, v) = json_of(create(&gw, "sk-acme-1", body.clone()).await).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!((v["object"].as_str(), v["status"].as_str()), (Some("response"), Some("completed")), "{v}");
    assert!(v["id"].as_str().is_some_and(|id| id.starts_with("resp_")), "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "Echo: hello there", "{v}");
    assert_eq!(
        (v["instructions"].as_str(), v["metadata"]["run"].as_str(), v["max_output_tokens"].as_u64()),
        (Some("Be brief."), Some("1"), Some(50))
    );
    let sent = &mock.received()[0].body;
    assert_eq!(sent["messages"][0], json!({"role": "system", "content": "Be brief."}), "{sent}");
    assert_eq!(sent["messages"][1], json!({"role": "user", "content": "hello there"}), "{sent}");
    assert_eq!(sent["max_completion_tokens"], 50, "{sent}");

    let mut stream_body = body;
    stream_body["stream"] = json!(true);
    let resp = create(&gw, "sk-acme-1", stream_body).await;
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let frames = events(&resp.text().await.expect("body"));
    let kinds: Vec<&str> = frames.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds.first(), Some(&"response.created"));
    assert_eq!(kinds.last(), Some(&"response.completed"), "{kinds:?}");
    let deltas: String = frames
        .iter()
        .filter(|(k, _)| k == "response.output_text.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(deltas, "Echo: hello there");
    let seq: Vec<u64> = frames.iter().filter_map(|(_, d)| d["sequence_number"].as_u64()).collect();
    assert_eq!(seq, (0..frames.len() as u64).collect::<Vec<_>>());
    assert_eq!(frames.last().map(|(_, d)| d["response"]["usage"]["total_tokens"].is_u64()), Some(true), "{frames:?}");
}

#[tokio::test]
async fn tool_calls_become_function_call_items_and_results_go_back_as_tool_turns() {
    let (mock, gw) = start().await;
    let tools = json!([{"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let (status, v) =
        json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": "#tools", "tools": tools})).await).await;
    assert_eq!(status, 200, "{v}");
    let call = v["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .unwrap_or_else(|| panic!("{v}"))
        .clone();
    assert!(serde_json::from_str::<Value>(call["arguments"].as_str().unwrap_or("")).is_ok(), "{call}");
    let sent = &mock.received()[0].body;
    assert_eq!(sent["tools"][0]["function"]["name"], "get_weather", "{sent}");

    // The stateless follow-up: the call item and its output, as agent SDKs send them.
    let input = json!([
        {"role": "user", "content": "#tools"},
        call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
        {"role": "user", "content": "thanks"}
    ]);
    let (status, v) = json_of(
        create(&gw, "sk-acme-1", json!({"model": "mock", "input": input, "tools": tools, "store": false})).await,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let sent = &mock.received()[1].body;
    let roles: Vec<&str> = sent["messages"].as_array().unwrap().iter().filter_map(|m| m["role"].as_str()).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "user"], "{sent}");
    assert_eq!(sent["messages"][1]["tool_calls"][0]["id"], call["call_id"], "{sent}");
    assert_eq!(sent["messages"][2]["tool_call_id"], call["call_id"], "{sent}");

    let resp =
        create(&gw, "sk-acme-1", json!({"model": "mock", "input": "#tools", "tools": tools, "stream": true})).await;
    let frames = events(&resp.text().await.expect("body"));
    let args: String = frames
        .iter()
        .filter(|(k, _)| k == "response.function_call_arguments.delta")
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    let done =
        frames.iter().find(|(k, _)| k == "response.function_call_arguments.done").map(|(_, d)| d["arguments"].clone());
    assert_eq!(done, Some(json!(args)), "{frames:?}");
    assert!(
        frames.iter().filter(|(k, _)| k == "response.function_call_arguments.delta").count() > 1,
        "streamed in fragments"
    );
}

#[tokio::test]
async fn a_leak_in_a_responses_stream_is_blocked_and_the_response_is_incomplete() {
    let (mock, gw) = start().await;
    // acme's words, then an upstream that answers globex with them (the production bug),
    // and one that answers globex with a secret globex never sent.
    let acme_text = "the quarterly merger memo names falcon ridge partners as the buyer of our northern shipping unit for four hundred million";
    let (status, _) = json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": acme_text})).await).await;
    assert_eq!(status, 200);
    let k = mock.can(format!("Sure, the token is {SECRET} as requested."));
    for (script, leak) in
        [("#splice 0 0 20".to_owned(), "northern shipping unit"), (format!("#canned {k}"), &SECRET[..12])]
    {
        for stream in [true, false] {
            let resp = create(&gw, "sk-globex-1", json!({"model": "mock", "input": script, "stream": stream})).await;
            assert_eq!(resp.status(), 200);
            assert!(resp.headers().contains_key("x-crossguard-audit-id"), "a blocked response names its audit record");
            let text = resp.text().await.expect("body");
            assert!(!text.contains(leak), "{script}, stream {stream}: {text}");
            let last = if stream {
                let frames = events(&text);
                let (kind, data) = frames.last().expect("frames").clone();
                assert_eq!(kind, "response.incomplete", "{text}");
                data["response"].clone()
            } else {
                serde_json::from_str::<Value>(&text).expect("JSON")
            };
            assert_eq!(last["status"], "incomplete", "{script}: {last}");
            assert_eq!(last["incomplete_details"]["reason"], "content_filter", "{script}: {last}");
        }
    }
}

#[tokio::test]
async fn stored_responses_belong_to_their_tenant_and_hold_only_what_was_released() {
    let (mock, gw) = start().await;
    let (_, first) = json_of(
        create(&gw, "sk-acme-1", json!({"model": "mock", "input": "my name is Ada", "instructions": "Be kind."})).await,
    )
    .await;
    let id = first["id"].as_str().expect("an id").to_owned();

    // Another tenant cannot continue, read or delete it.
    let (status, v) = json_of(
        create(&gw, "sk-globex-1", json!({"model": "mock", "input": "go on", "previous_response_id": id})).await,
    )
    .await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("previous_response_id")), "{v}");
    let client = reqwest::Client::new();
    let url = gw.url(&format!("/v1/responses/{id}"));
    assert_eq!(client.get(&url).bearer_auth("sk-globex-1").send().await.unwrap().status(), 404);
    assert_eq!(client.delete(&url).bearer_auth("sk-globex-1").send().await.unwrap().status(), 404);
    assert_eq!(
        client.get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(),
        200,
        "still there for its owner"
    );

    // Its owner continues it: the upstream sees the stored turns, not the old instructions.
    let (status, v) = json_of(
        create(&gw, "sk-acme-1", json!({"model": "mock", "input": "what is my name?", "previous_response_id": id}))
            .await,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["previous_response_id"], id.as_str());
    let received = mock.received();
    let sent = &received.last().expect("a request").body;
    let turns: Vec<(&str, &str)> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(
        turns,
        [("user", "my name is Ada"), ("assistant", "Echo: my name is Ada"), ("user", "what is my name?")],
        "{sent}"
    );

    // A blocked response is stored as released, streamed or not: the continuation never
    // carries the secret.
    let k = mock.can(format!("The deploy token is {SECRET} and it works."));
    for stream in [false, true] {
        let text =
            create(&gw, "sk-acme-1", json!({"model": "mock", "input": format!("#canned {k}"), "stream": stream}))
                .await
                .text()
                .await
                .expect("body");
        let blocked = if stream {
            events(&text).last().expect("frames").1["response"].clone()
        } else {
            serde_json::from_str(&text).expect("JSON")
        };
        assert_eq!(blocked["status"], "incomplete", "{blocked}");
        let (status, _) = json_of(
            create(
                &gw,
                "sk-acme-1",
                json!({"model": "mock", "input": "repeat it", "previous_response_id": blocked["id"]}),
            )
            .await,
        )
        .await;
        assert_eq!(status, 200, "stream {stream}");
        let sent = mock.received().last().expect("a request").body.to_string();
        assert!(sent.contains("The deploy") && !sent.contains(&SECRET[..12]), "stream {stream}: {sent}");
    }

    // Deleted, or never stored: gone.
    assert_eq!(client.delete(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 200);
    assert_eq!(client.get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 404);
    let (_, unstored) =
        json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": "x", "store": false})).await).await;
    let url = gw.url(&format!("/v1/responses/{}", unstored["id"].as_str().unwrap()));
    assert_eq!(client.get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn what_the_responses_path_cannot_do_is_refused_by_name() {
    let (mock, gw) = start().await;
    let cases = [
        (json!({"model": "mock", "input": "x", "tools": [{"type": "web_search"}]}), "tools[0].type"),
        (json!({"model": "mock", "input": "x", "background": true}), "background"),
        (json!({"model": "mock", "input": "x", "truncation": "auto"}), "truncation"),
        (json!({"model": "mock", "input": "x", "n": 2}), "n"),
        (json!({"model": "mock", "input": [{"type": "item_reference", "id": "msg_1"}]}), "input[0].type"),
        (
            json!({"model": "mock", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}}),
            "text.format.name",
        ),
        (json!({"model": "nope", "input": "x"}), "model"),
    ];
    for (body, param) in cases {
        let (status, v) = json_of(create(&gw, "sk-acme-1", body.clone()).await).await;
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (if param == "model" { 404 } else { 400 }, Some(param)),
            "{body}: {v}"
        );
    }
    assert!(mock.received().is_empty(), "nothing refused reached the upstream");
}

#[tokio::test]
async fn with_storing_turned_off_nothing_is_kept() {
    let mock = MockUpstream::start().await;
    let config = upstream_config(&mock.base_url(), "\n[responses]\nstore = false\n");
    let gw = TestGateway::start(&config, &[("UPSTREAM_KEY", "sk-up")]).await;
    let (status, v) = json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": "hello"})).await).await;
    assert_eq!((status, v["store"].as_bool()), (200, Some(false)), "{v}");
    let url = gw.url(&format!("/v1/responses/{}", v["id"].as_str().unwrap()));
    assert_eq!(reqwest::Client::new().get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 404);
    let (status, v) = json_of(
        create(&gw, "sk-acme-1", json!({"model": "mock", "input": "x", "previous_response_id": v["id"]})).await,
    )
    .await;
    assert_eq!((status, v["error"]["param"].as_str()), (400, Some("previous_response_id")), "{v}");
}

#[tokio::test]
async fn a_response_over_the_record_bound_is_not_stored_and_is_counted() {
    let mock = MockUpstream::start().await;
    let config = upstream_config(&mock.base_url(), "\n[responses]\nmax_stored_bytes = 2048\n");
    let gw = TestGateway::start(&config, &[("UPSTREAM_KEY", "sk-up")]).await;
    let long = "word ".repeat(600);
    let (status, v) = json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": long})).await).await;
    assert_eq!(status, 200, "{v}");
    let url = gw.url(&format!("/v1/responses/{}", v["id"].as_str().unwrap()));
    assert_eq!(reqwest::Client::new().get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 404);
    let (_, short) = json_of(create(&gw, "sk-acme-1", json!({"model": "mock", "input": "short"})).await).await;
    let url = gw.url(&format!("/v1/responses/{}", short["id"].as_str().unwrap()));
    assert_eq!(reqwest::Client::new().get(&url).bearer_auth("sk-acme-1").send().await.unwrap().status(), 200);
    let metrics = reqwest::get(gw.url("/metrics")).await.expect("metrics").text().await.expect("text");
    assert!(
        metrics.contains("crossguard_protection_events_total{tenant=\"acme\",event=\"response_not_stored\"} 1"),
        "{metrics}"
    );
}
