//! Any body as a `POST /v1/chat/completions` request: parsing gives a request or a 400 naming
//! its problem, never a panic. An accepted request re-serialised (what an upstream receives)
//! parses to the same request, stays within OpenAI's ranges, and stays valid after the
//! gateway adds a system line to it (canaries, tenant instructions).
#![no_main]

use gateway::api::request::ChatRequest;
use gateway::error::ApiError;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The request as an upstream would receive it, parsed again.
fn reparsed(r: &ChatRequest) -> ChatRequest {
    let body = match serde_json::to_vec(&r.raw) {
        Ok(body) => body,
        Err(e) => panic!("an accepted request does not serialise: {e}"),
    };
    match ChatRequest::parse(&body) {
        Ok(again) => again,
        Err(e) => panic!("an accepted request is refused once re-serialised: {e:?}"),
    }
}

fn check_ranges(r: &ChatRequest) {
    assert!((1..=128).contains(&r.n));
    assert!(!r.messages.is_empty());
    assert!(r.top_logprobs <= 20 && (r.top_logprobs == 0 || r.logprobs));
    assert!(r.max_tokens.is_none_or(|t| t >= 1));
    assert!(r.temperature.is_none_or(|t| (0.0..=2.0).contains(&t)));
    assert!(r.top_p.is_none_or(|p| (0.0..=1.0).contains(&p)));
    assert!(r.stop.len() <= 4 && r.stop.iter().all(|s| !s.is_empty()));
    assert!(!r.include_usage || r.stream);
}

fuzz_target!(|data: &[u8]| {
    let mut request = match ChatRequest::parse(data) {
        Ok(r) => r,
        Err(e) => {
            assert_eq!(e.status(), 400, "a bad body must be a client error: {e:?}");
            if let ApiError::InvalidParam { param, .. } = &e {
                assert!(!param.is_empty(), "a param error must name its param");
            }
            return;
        }
    };
    check_ranges(&request);
    let again = reparsed(&request);
    assert_eq!(format!("{again:?}"), format!("{request:?}"), "re-serialising changed the request");
    let _ = request.prompt_text();

    let at_start = data.len() % 2 == 0;
    request.add_system_line("fuzz-canary", at_start);
    let messages: Vec<Value> = request.messages.iter().cloned().map(Value::Object).collect();
    assert_eq!(request.raw.get("messages"), Some(&Value::Array(messages)), "messages and raw diverged");
    assert!(request.prompt_text().contains("fuzz-canary"));
    check_ranges(&reparsed(&request));
});
