//! Constrained decoding on the real model: whatever the sampling settings — a hot
//! temperature, a logit bias pushing a token the grammar forbids — the output is valid
//! under its grammar, through the one-request loop and the batching scheduler alike; a
//! schema the compiler cannot enforce is refused with its keyword named.
#![allow(clippy::panic, clippy::unwrap_used)] // a test: a missing model or a wrong output should stop it loudly

use std::ops::ControlFlow;
use std::sync::OnceLock;

use engine::engine::{Engine, EngineOptions, FinishReason, GenerateRequest, SamplingParams};
use engine::grammar::Grammar;
use engine::kv::Owner;
use engine::sched::{Scheduler, SchedulerConfig};
use engine::template::ChatMessage;
use serde_json::{json, Value};

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let path = engine::fetch::ensure_default_model(&engine::fetch::default_cache_dir())
            .unwrap_or_else(|e| panic!("default model: {e}"));
        Engine::load(&path, EngineOptions { threads: 2, ctx_tokens: 2048, ..EngineOptions::default() })
            .unwrap_or_else(|e| panic!("load: {e}"))
    })
}

fn request(question: &str, grammar: &Grammar, sampling: SamplingParams, max_tokens: usize) -> GenerateRequest {
    let engine = engine();
    let prompt = engine.chat_prompt(&[ChatMessage::new("user", question)], None).unwrap();
    let grammar = Some(engine.compile_grammar(grammar).unwrap_or_else(|e| panic!("compile: {e}")));
    GenerateRequest { prompt, max_tokens, stop: Vec::new(), sampling, top_logprobs: 0, grammar }
}

/// The whole text of one generation, and how it ended.
fn generate(request: &GenerateRequest) -> (String, FinishReason) {
    let mut text = String::new();
    let owner = Owner::new("acme", "structured");
    let done = engine()
        .generate_for(&owner, request, &mut |ev| {
            text.push_str(&ev.text);
            ControlFlow::Continue(())
        })
        .unwrap();
    (text, done.finish)
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "role": {"enum": ["admin", "user", "guest"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "role", "tags"],
        "additionalProperties": false
    })
}

fn assert_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    let o = v.as_object().unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["age", "name", "role", "tags"], "{text}");
    assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 40), "{text}");
    assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    assert!(["admin", "user", "guest"].contains(&o["role"].as_str().unwrap_or("")), "{text}");
    let tags = o["tags"].as_array().unwrap_or_else(|| panic!("tags: {text}"));
    assert!(tags.len() <= 3 && tags.iter().all(|t| t.as_str().is_some_and(|s| s.chars().count() <= 12)), "{text}");
}

#[test]
fn sampled_output_follows_the_schema_at_any_temperature() {
    for (seed, temperature) in [(1, 0.0), (2, 1.0), (3, 1.6), (4, 2.0)] {
        let sampling = SamplingParams { temperature, seed: Some(seed), ..SamplingParams::default() };
        let (text, finish) = generate(&request(
            "Describe a user of our system as JSON.",
            &Grammar::JsonSchema(person_schema()),
            sampling,
            200,
        ));
        assert_eq!(finish, FinishReason::Stop, "T={temperature}: {text}");
        assert_person(&text);
    }
}

#[test]
fn a_logit_bias_cannot_push_a_token_the_grammar_forbids() {
    // Every sampler knob a client holds, turned against the grammar: the largest bias on
    // a token that can never start a JSON object.
    let hello = engine().tokenizer().encode("Hello", false).unwrap()[0];
    let sampling = SamplingParams { temperature: 0.0, logit_bias: vec![(hello, 100.0)], ..SamplingParams::default() };
    let (text, finish) = generate(&request("Say hello.", &Grammar::JsonObject, sampling, 120));
    assert!(!text.starts_with("Hello"), "{text}");
    if finish == FinishReason::Stop {
        assert!(serde_json::from_str::<Value>(&text).is_ok_and(|v| v.is_object()), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
}

#[test]
fn the_batching_scheduler_enforces_each_requests_grammar() {
    let enum_only = Grammar::JsonSchema(
        json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"], "additionalProperties": false}),
    );
    let mut scheduler = Scheduler::new(engine(), SchedulerConfig::default());
    let texts: Vec<std::sync::Arc<std::sync::Mutex<String>>> = (0..4).map(|_| Default::default()).collect();
    for (i, text) in texts.iter().enumerate() {
        let grammar = if i % 2 == 0 { Grammar::JsonSchema(person_schema()) } else { enum_only.clone() };
        let sampling = SamplingParams { temperature: 1.0, seed: Some(i as u64), ..SamplingParams::default() };
        let req = request("Is the sky blue? Answer in JSON.", &grammar, sampling, 200);
        let sink_text = text.clone();
        let sink = Box::new(move |ev: &engine::engine::TokenEvent| {
            sink_text.lock().unwrap().push_str(&ev.text);
            ControlFlow::Continue(())
        });
        scheduler.submit(Owner::new(&format!("tenant-{i}"), "r"), req, sink).unwrap();
    }
    let finished = scheduler.run().unwrap();
    assert_eq!(finished.len(), 4);
    for (_, outcome) in finished {
        assert_eq!(outcome.unwrap().finish, FinishReason::Stop);
    }
    for (i, text) in texts.iter().enumerate() {
        let text = text.lock().unwrap();
        if i % 2 == 0 {
            assert_person(&text);
        } else {
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert!(v == json!({"answer": "yes"}) || v == json!({"answer": "no"}), "{text}");
        }
    }
}

#[test]
fn choices_sharing_one_compiled_grammar_each_follow_it_on_their_own() {
    // `n` choices of one request start from one compiled grammar: each must carry its own
    // parser state, or one choice's tokens would steer another's mask.
    let compiled = engine().compile_grammar(&Grammar::JsonSchema(person_schema())).unwrap();
    let prompt =
        engine().chat_prompt(&[ChatMessage::new("user", "Describe three different users as JSON.")], None).unwrap();
    let mut scheduler = Scheduler::new(engine(), SchedulerConfig::default());
    let texts: Vec<std::sync::Arc<std::sync::Mutex<String>>> = (0..3).map(|_| Default::default()).collect();
    for (i, text) in texts.iter().enumerate() {
        let sampling = SamplingParams { temperature: 1.2, seed: Some(40 + i as u64), ..SamplingParams::default() };
        let req = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: 200,
            stop: Vec::new(),
            sampling,
            top_logprobs: 0,
            grammar: Some(compiled.clone()),
        };
        let sink_text = text.clone();
        let sink = Box::new(move |ev: &engine::engine::TokenEvent| {
            sink_text.lock().unwrap().push_str(&ev.text);
            ControlFlow::Continue(())
        });
        scheduler.submit(Owner::new("acme", "n3"), req, sink).unwrap();
    }
    for (_, outcome) in scheduler.run().unwrap() {
        assert_eq!(outcome.unwrap().finish, FinishReason::Stop);
    }
    let texts: Vec<String> = texts.iter().map(|t| t.lock().unwrap().clone()).collect();
    for text in &texts {
        assert_person(text);
    }
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "three seeds, one answer: {texts:?}");
}

#[test]
fn a_schema_the_compiler_cannot_enforce_is_refused_by_name() {
    // Keywords JSON Schema defines but the compiler does not enforce: refused, never
    // silently dropped (unknown keywords are annotations, as the specification says).
    let unenforced =
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": true}}}));
    let err = engine().compile_grammar(&unenforced).unwrap_err();
    assert!(matches!(err, engine::Error::Grammar { .. }), "{err}");
    assert!(err.to_string().contains("uniqueItems"), "{err}");
    let annotated =
        Grammar::JsonSchema(json!({"type": "object", "properties": {"a": {"type": "string", "x-made-up": 3}}}));
    assert!(engine().compile_grammar(&annotated).is_ok());
    let malformed = Grammar::JsonSchema(json!({"type": "no-such-type"}));
    assert!(matches!(engine().compile_grammar(&malformed), Err(engine::Error::Grammar { .. })));
}

#[test]
fn schemas_from_a_hostile_client_are_refused_or_served_never_fetched() {
    // A `$ref` to a remote document: refused (nothing is fetched), not followed.
    let remote = Grammar::JsonSchema(json!({"$ref": "https://example.invalid/schema.json"}));
    assert!(matches!(engine().compile_grammar(&remote), Err(engine::Error::Grammar { .. })));
    // A local `$ref` works; `true` is any JSON value; `false` admits nothing and is refused.
    let local = json!({"$defs": {"n": {"type": "integer"}}, "type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, "required": ["a"]});
    assert!(engine().compile_grammar(&Grammar::JsonSchema(local)).is_ok());
    assert!(engine().compile_grammar(&Grammar::JsonSchema(json!(true))).is_ok());
    assert!(matches!(engine().compile_grammar(&Grammar::JsonSchema(json!(false))), Err(engine::Error::Grammar { .. })));
    // Nesting as deep as a request body can carry (serde_json stops at 128 levels).
    let mut deep = json!({"type": "integer"});
    for _ in 0..60 {
        deep = json!({"type": "object", "properties": {"x": deep}, "required": ["x"]});
    }
    assert!(engine().compile_grammar(&Grammar::JsonSchema(deep)).is_ok());
    // A grammar that is not Lark at all.
    assert!(matches!(engine().compile_grammar(&Grammar::Lark("start: (".into())), Err(engine::Error::Grammar { .. })));
}
