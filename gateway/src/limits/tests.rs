//! The limiter's arithmetic on an injected clock: no sleeps.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::StreamExt;

use super::*;
use crate::api::Usage;
use crate::backend::{BackendEvent, ChoiceDelta, EventStream};

#[derive(Default)]
struct ManualClock(AtomicU64);

impl ManualClock {
    fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn settings(concurrent: u32, rpm: Option<u64>, tpm: Option<u64>) -> LimitSettings {
    LimitSettings { max_concurrent_requests: concurrent, requests_per_minute: rpm, tokens_per_minute: tpm }
}

fn limiter(default: LimitSettings, tenants: &[(&str, LimitSettings)]) -> (Limiter, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::default());
    let tenants: BTreeMap<String, LimitSettings> = tenants.iter().map(|(id, s)| (id.to_string(), *s)).collect();
    (Limiter::with_clock(LimitsConfig { default, tenants }, clock.clone()), clock)
}

const ONE: Ask = Ask { prompt_tokens: 1, completion_tokens: 0 };

fn tokens(n: u64) -> Ask {
    Ask { prompt_tokens: n, completion_tokens: 0 }
}

/// Runs `admission` over a backend stream of `events` to its end.
fn finish(admission: Admission, events: Vec<BackendEvent>) {
    let stream: EventStream = Box::pin(futures::stream::iter(events.into_iter().map(Ok)));
    let metered = admission.meter(stream);
    let _ = futures::executor::block_on(metered.collect::<Vec<_>>());
}

#[test]
fn concurrency_slots_come_back_when_admissions_drop() {
    let (l, _) = limiter(settings(2, None, None), &[]);
    let a = l.admit("acme", ONE).unwrap();
    let _b = l.admit("acme", ONE).unwrap();
    let refused = l.admit("acme", ONE).unwrap_err();
    assert_eq!(refused.limit, LimitKind::ConcurrentRequests);
    assert_eq!(refused.retry_after_ms, Some(1000));
    assert_eq!(refused.openai_type(), "requests");
    assert_eq!(l.in_flight("acme"), 2);
    drop(a);
    assert_eq!(l.in_flight("acme"), 1);
    assert!(l.admit("acme", ONE).is_ok());
}

#[test]
fn a_metered_stream_holds_its_slot_until_dropped() {
    let (l, _) = limiter(settings(1, None, None), &[]);
    let stream: EventStream = Box::pin(futures::stream::pending());
    let metered = l.admit("acme", ONE).unwrap().meter(stream);
    assert!(l.admit("acme", ONE).is_err(), "the stream still holds the slot");
    drop(metered);
    assert!(l.admit("acme", ONE).is_ok());
}

#[test]
fn requests_per_minute_refill_one_by_one() {
    let (l, clock) = limiter(settings(100, Some(3), None), &[]);
    for left in [2, 1, 0] {
        let a = l.admit("acme", ONE).unwrap();
        let mut h = HeaderMap::new();
        a.write_headers(&mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "3");
        assert_eq!(h["x-ratelimit-remaining-requests"], left.to_string().as_str());
    }
    let refused = l.admit("acme", ONE).unwrap_err();
    assert_eq!(refused.limit, LimitKind::RequestsPerMinute);
    // Three per minute: one every 20 s.
    assert_eq!(refused.retry_after_ms, Some(20_000));
    assert_eq!(refused.headers.requests.map(|q| (q.remaining, q.reset_ms)), Some((0, 60_000)));
    assert!(refused.to_string().contains("Limit 3, Used 3, Requested 1"), "{refused}");
    clock.advance(19_999);
    assert!(l.admit("acme", ONE).is_err());
    clock.advance(1);
    assert!(l.admit("acme", ONE).is_ok());
    assert!(l.admit("acme", ONE).is_err());
}

#[test]
fn tokens_are_reserved_then_reconciled_with_reported_usage() {
    let (l, _) = limiter(settings(100, None, Some(1000)), &[]);
    let first = l.admit("acme", Ask { prompt_tokens: 100, completion_tokens: 500 }).unwrap();
    let refused = l.admit("acme", tokens(600)).unwrap_err();
    assert_eq!((refused.limit, refused.openai_type()), (LimitKind::TokensPerMinute, "tokens"));
    assert_eq!(refused.headers.tokens.map(|q| q.remaining), Some(400));
    // The answer used 150 tokens of the 600 reserved: 450 come back.
    finish(first, vec![BackendEvent::Usage(Usage { prompt_tokens: 100, completion_tokens: 50, total_tokens: 150 })]);
    let second = l.admit("acme", tokens(600)).unwrap();
    let mut h = HeaderMap::new();
    second.write_headers(&mut h);
    assert_eq!(h["x-ratelimit-remaining-tokens"], "250");
    assert!(!h.contains_key("x-ratelimit-limit-requests"), "no requests budget configured");
}

#[test]
fn without_reported_usage_the_streamed_text_is_charged() {
    let (l, _) = limiter(settings(100, None, Some(1000)), &[]);
    let a = l.admit("acme", Ask { prompt_tokens: 10, completion_tokens: 0 }).unwrap();
    // 400 bytes of completion: 100 tokens, beyond the 10 reserved.
    let delta = |s: &str| BackendEvent::Delta(ChoiceDelta { content: Some(s.to_owned()), ..ChoiceDelta::default() });
    finish(a, vec![delta(&"x".repeat(150)), delta(&"y".repeat(250))]);
    let refused = l.admit("acme", tokens(1000)).unwrap_err();
    assert_eq!(refused.headers.tokens.map(|q| q.remaining), Some(890));
}

#[test]
fn a_refused_request_takes_nothing() {
    let (l, _) = limiter(settings(100, Some(2), Some(100)), &[]);
    assert!(l.admit("acme", tokens(101)).is_err());
    assert!(l.admit("acme", tokens(90)).is_ok());
    assert!(l.admit("acme", tokens(20)).is_err(), "tokens refuse");
    // The request refused for tokens did not spend the last request of the minute.
    assert!(l.admit("acme", tokens(10)).is_ok());
}

#[test]
fn a_request_larger_than_a_minute_of_tokens_has_no_retry_after() {
    let (l, _) = limiter(settings(100, None, Some(100)), &[]);
    let refused = l.admit("acme", Ask { prompt_tokens: 10, completion_tokens: 200 }).unwrap_err();
    assert_eq!(refused.retry_after_ms, None);
    assert!(refused.to_string().contains("Request too large"), "{refused}");
    let mut h = HeaderMap::new();
    refused.write_headers(&mut h);
    assert!(!h.contains_key("retry-after"));
    assert_eq!(h["x-ratelimit-remaining-tokens"], "100");
}

#[test]
fn tenants_are_independent_and_overrides_win() {
    let (l, _) = limiter(settings(100, Some(1), None), &[("big", settings(100, Some(5), None))]);
    assert!(l.admit("acme", ONE).is_ok());
    assert!(l.admit("acme", ONE).is_err());
    assert!(l.admit("globex", ONE).is_ok(), "another tenant's budget is untouched");
    for _ in 0..5 {
        assert!(l.admit("big", ONE).is_ok());
    }
    assert!(l.admit("big", ONE).is_err());
}

#[test]
fn refusals_are_counted_per_tenant_and_limit() {
    let (l, _) = limiter(settings(1, Some(1), None), &[]);
    let _held = l.admit("acme", ONE).unwrap();
    let _ = l.admit("acme", ONE);
    let _ = l.admit("acme", ONE);
    let globex = l.admit("globex", ONE).unwrap();
    drop(globex);
    let _ = l.admit("globex", ONE);
    let text = crate::metrics::Exposition::text_of(|out| l.write_metrics(out));
    assert!(text.contains("crossguard_rate_limited_total{tenant=\"acme\",limit=\"concurrent_requests\"} 2"), "{text}");
    assert!(
        text.contains("crossguard_rate_limited_total{tenant=\"globex\",limit=\"requests_per_minute\"} 1"),
        "{text}"
    );
}
