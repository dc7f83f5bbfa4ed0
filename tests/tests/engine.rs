//! The gateway serving the default model from the in-process engine, over real sockets:
//! greedy chat completions equal llama.cpp's token for token (fixture made by
//! `scripts/fixtures/make_model_fixtures.py`) up to the first step where llama.cpp itself
//! stood at a near tie (top-two logit margin under [`NEAR_TIE`]; past it, 8-bit
//! activation rounding may legitimately pick the other token — see
//! engine/tests/model_reference.rs), streaming equals non-streaming, usage is exact, and
//! the sampling fields map onto the engine.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crossguard_e2e::{sse_data, TestGateway, DEFAULT_ENGINE_CONFIG};
use serde_json::{json, Value};

const MODEL: &str = "smollm2-135m-instruct";

/// A reference step whose top two logits are closer than this is a near tie.
const NEAR_TIE: f64 = 0.5;

async fn ready_gateway() -> TestGateway {
    let gw = TestGateway::start(DEFAULT_ENGINE_CONFIG, &[]).await;
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let status = reqwest::get(gw.url("/readyz")).await.map(|r| r.status().as_u16()).unwrap_or(0);
        if status == 200 {
            return gw;
        }
        assert!(Instant::now() < deadline, "the default model did not become ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn complete(gw: &TestGateway, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(gw.url("/v1/chat/completions"))
        .bearer_auth("sk-acme-1")
        .json(&body)
        .send()
        .await
        .expect("gateway answers")
}

fn fixture() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/fixtures/model_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("fixture exists")).expect("fixture is JSON")
}

/// The reference's greedy continuation as bytes (a prefix may end inside a character),
/// up to (not including) the end-of-turn token.
fn reference_bytes(ids: &[u32]) -> Vec<u8> {
    let model = engine::fetch::ensure_default_model(&engine::fetch::default_cache_dir()).expect("default model");
    let file = engine::gguf::GgufFile::open(&model).expect("model opens");
    let tokenizer = engine::tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer builds");
    let end = ids.iter().position(|id| tokenizer.eos_ids().contains(id)).unwrap_or(ids.len());
    ids[..end].iter().flat_map(|id| tokenizer.token_bytes(*id)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_model_serves_greedy_chats_identical_to_llama_cpp() {
    let gw = ready_gateway().await;
    let models: Value = reqwest::Client::new()
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-acme-1")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);

    let fx = fixture();
    let max_tokens = fx["greedy_tokens"].as_u64().unwrap();
    let mut checked = 0;
    for case in fx["cases"].as_array().unwrap().iter().filter(|c| c["messages"].is_array()) {
        let ids: Vec<u32> = case["greedy_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let margins: Vec<f64> =
            case["greedy_margins"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let tie = margins.iter().position(|m| *m < NEAR_TIE).unwrap_or(ids.len());
        let expected = reference_bytes(&ids[..tie]);
        let exact = tie == ids.len();
        let body = json!({"model": MODEL, "messages": case["messages"], "temperature": 0, "max_tokens": max_tokens});
        let v: Value = complete(&gw, body.clone()).await.json().await.unwrap();
        let name = case["name"].as_str().unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        let want = String::from_utf8_lossy(&expected);
        if exact {
            assert_eq!(content.as_bytes(), &expected[..], "{name}: {content:?} vs {want:?}");
        } else {
            assert!(
                content.as_bytes().starts_with(&expected),
                "{name}: {content:?} must start with {want:?} (near tie at step {tie})"
            );
        }
        let prompt_len = case["prompt_ids"].as_array().unwrap().len() as u64;
        assert_eq!(v["usage"]["prompt_tokens"], prompt_len, "{name}: exact prompt token count");
        let stopped = ids.len() < max_tokens as usize || ids.contains(&2);
        if exact {
            let reason = if stopped { "stop" } else { "length" };
            assert_eq!(v["choices"][0]["finish_reason"], reason, "{name}");
        }

        let mut stream = body;
        stream["stream"] = json!(true);
        let frames = sse_data(&complete(&gw, stream).await.text().await.unwrap());
        assert_eq!(frames.last().map(String::as_str), Some("[DONE]"));
        let streamed: String = frames[..frames.len() - 1]
            .iter()
            .map(|f| serde_json::from_str::<Value>(f).unwrap())
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(streamed, content, "{name}: streamed text equals the whole text");
        checked += 1;
    }
    assert!(checked >= 4, "the fixture has chat cases");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_fields_map_onto_the_engine() {
    let gw = ready_gateway().await;
    let messages = json!([{"role": "user", "content": "Write a long story about a cat."}]);

    let v: Value = complete(&gw, json!({"model": MODEL, "messages": messages, "max_tokens": 5, "temperature": 0}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], v["usage"]["prompt_tokens"].as_u64().unwrap() + 5);

    let body = json!({"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3});
    let v: Value = complete(&gw, body).await.json().await.unwrap();
    let entries = v["choices"][0]["logprobs"]["content"].as_array().expect("logprobs returned");
    assert_eq!(entries.len(), 8);
    for e in entries {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 3);
        assert!(e["bytes"].is_array());
    }
    let text: String = entries.iter().map(|e| e["token"].as_str().unwrap()).collect();
    assert_eq!(text, v["choices"][0]["message"]["content"].as_str().unwrap());

    let seeded = json!({"model": MODEL, "messages": messages, "max_tokens": 12, "temperature": 1.0, "seed": 7, "n": 2});
    let a: Value = complete(&gw, seeded.clone()).await.json().await.unwrap();
    let b: Value = complete(&gw, seeded).await.json().await.unwrap();
    assert_eq!(a["choices"].as_array().unwrap().len(), 2);
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"], "same seed, same text");
    assert_eq!(a["choices"][1]["message"]["content"], b["choices"][1]["message"]["content"]);

    let greedy = json!({"model": MODEL, "messages": messages, "max_tokens": 30, "temperature": 0});
    let full: Value = complete(&gw, greedy.clone()).await.json().await.unwrap();
    let full_text = full["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    let word = full_text.split_whitespace().nth(3).expect("a few words").to_owned();
    let mut with_stop = greedy;
    with_stop["stop"] = json!([word.clone()]);
    let cut: Value = complete(&gw, with_stop).await.json().await.unwrap();
    let cut_text = cut["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");
    assert!(!cut_text.contains(&word) && full_text.starts_with(cut_text), "{cut_text:?} vs {full_text:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_request_errors_are_openai_errors() {
    let gw = ready_gateway().await;
    let image = json!({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]});
    let resp = complete(&gw, image).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages[0].content[0]");

    let huge = "word ".repeat(20_000);
    let resp = complete(&gw, json!({"model": MODEL, "messages": [{"role": "user", "content": huge}]})).await;
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded");
}
