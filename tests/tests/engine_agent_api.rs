//! The API agent frameworks use, against the default model on the engine, driven by the
//! official `openai` Python SDK (`tests/python/agent_api.py`): structured outputs on
//! twenty Pydantic models, streamed and not, every one parsed; `json_object`; a schema
//! the engine cannot enforce refused with its parameter; a tool-calling conversation's
//! second turn; the Responses API (`tests/python/responses_api.py`): create, streamed
//! events, `parse`, function-tool loops stateless and through `previous_response_id`; and
//! an agent of the OpenAI Agents SDK (`tests/python/agents_sdk.py`) running its tool loop.
//! Raw HTTP covers what the SDK validates before sending.

use std::time::Duration;

use crossguard_e2e::{run_python, TestGateway, DEFAULT_ENGINE_CONFIG};
use serde_json::{json, Value};

const MODEL: &str = "smollm2-135m-instruct";

async fn ready_gateway() -> TestGateway {
    let gw = TestGateway::start(DEFAULT_ENGINE_CONFIG, &[]).await;
    gw.wait_ready(Duration::from_secs(180)).await;
    gw
}

async fn complete(gw: &TestGateway, body: Value) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .json(&body)
        .send()
        .await
        .expect("gateway answers");
    (resp.status().as_u16(), resp.json().await.expect("JSON body"))
}

/// Runs `tests/python/<script>` against a fresh gateway; it exits non-zero on a failed
/// check, and must pass at least `checks` of them.
async fn sdk_script(script: &str, checks: usize) {
    let gw = ready_gateway().await;
    let stdout = run_python(script, &[&gw.url("/v1"), "sk-acme-1", MODEL]).await;
    println!("{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("ok")).count() >= checks, "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_structured_outputs_and_tool_conversations_through_the_sdk() {
    sdk_script("agent_api.py", 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_get_the_responses_api_through_the_sdk() {
    sdk_script("responses_api.py", 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_agents_sdk_agent_completes_its_tool_loop() {
    sdk_script("agents_sdk.py", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_format_errors_name_their_parameter() {
    let gw = ready_gateway().await;
    let ask = |format: Value| json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "response_format": format, "max_tokens": 4});
    let cases = [
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}}),
            "response_format.json_schema.schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {"required": ["a"]}, "then": {"required": ["b"]}}}}),
            "response_format.json_schema.schema",
        ),
        (json!({"type": "xml"}), "response_format.type"),
    ];
    for (format, param) in cases {
        let (status, body) = complete(&gw, ask(format.clone())).await;
        assert_eq!(status, 400, "{format}: {body}");
        assert_eq!(body["error"]["param"], param, "{format}: {body}");
    }
    let resp = reqwest::Client::new()
        .post(gw.url("/v1/completions"))
        .bearer_auth("sk-acme-1")
        .json(&json!({"model": MODEL, "prompt": "x", "suffix": "y"}))
        .send()
        .await
        .expect("gateway answers");
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.expect("JSON");
    assert_eq!(body["error"]["param"], "suffix", "{body}");
    let (status, body) = complete(
        &gw,
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"999999": 5}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["param"], "logit_bias", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_constrained_answer_is_valid_and_streams_like_any_other() {
    let gw = ready_gateway().await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "population": {"type": "integer", "minimum": 0}},
                        "required": ["city", "population"], "additionalProperties": false});
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Name a big city."}], "temperature": 1.5, "seed": 7, "max_tokens": 100,
                      "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}}});
    let (status, v) = complete(&gw, body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let content: Value = serde_json::from_str(v["choices"][0]["message"]["content"].as_str().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(content["city"].is_string() && content["population"].is_u64(), "{content}");
    assert_eq!(content.as_object().map(|o| o.len()), Some(2), "{content}");
}

/// A token the secret rules recognise (GitHub's format, checksum included).
const SECRET: &str = "ghp_kjDyznajEXBur3wR0Ih1u4yxrZaOegtH82Vo";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_inside_an_engine_tool_call_is_blocked_before_release() {
    // The schema forces the model to write the secret into the call's arguments: the
    // firewall must judge the arguments as it judges content, streamed and not. The schema
    // is acme's own request, so the secret is acme's: it comes back by default
    // (`own_secrets = "allow"`, checked last), and acme here asks for its own secrets to be
    // blocked too.
    let cfg = DEFAULT_ENGINE_CONFIG
        .replace("api_keys = [\"sk-acme-1\"]\n", "api_keys = [\"sk-acme-1\"]\nown_secrets = \"block\"\n");
    assert_ne!(cfg, DEFAULT_ENGINE_CONFIG);
    let gw = TestGateway::start(&cfg, &[]).await;
    gw.wait_ready(Duration::from_secs(180)).await;
    let tools = json!([{"type": "function", "function": {"name": "deploy", "parameters": {"type": "object",
        "properties": {"token": {"const": SECRET}}, "required": ["token"], "additionalProperties": false}}}]);
    let body = |stream: bool| {
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Deploy."}], "tools": tools, "stream": stream, "max_tokens": 80,
               "tool_choice": {"type": "function", "function": {"name": "deploy"}}})
    };
    let (status, v) = complete(&gw, body(false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "content_filter", "{v}");
    assert!(!v.to_string().contains(&SECRET[..12]), "{v}");

    let resp = reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .json(&body(true))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(!text.contains(&SECRET[..12]), "{text}");
    assert!(text.contains("\"content_filter\""), "{text}");
    // Without the secret the same call goes through, as a tool call.
    let plain = json!([{"type": "function", "function": {"name": "deploy", "parameters": {"type": "object",
        "properties": {"env": {"enum": ["staging", "production"]}}, "required": ["env"], "additionalProperties": false}}}]);
    // One call (parallel calls off): sampled freely, a small model may call until the limit.
    let (status, v) = complete(&gw, json!({"model": MODEL, "messages": [{"role": "user", "content": "Deploy."}], "tools": plain, "tool_choice": "required",
                                           "parallel_tool_calls": false, "max_tokens": 80})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    let args: Value = serde_json::from_str(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().unwrap_or(""),
    )
    .unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(args["env"] == "staging" || args["env"] == "production", "{args}");
    // With the default policy acme's own secret, from its own schema, is no leak.
    let (status, v) = complete(&ready_gateway().await, body(false)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert!(v.to_string().contains(SECRET), "{v}");
}
