//! Pausing and cancelling, on the real default model: what the scheduler itself promises
//! (admission, emptiness, unknown ids). Output equality across a pause is in
//! `engine/tests/batching.rs`.

use std::cell::RefCell;
use std::ops::ControlFlow;

use super::*;
use crate::engine::{EngineOptions, KvOptions, SamplingParams};
use crate::template::ChatMessage;

type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

fn engine() -> std::result::Result<Engine, Box<dyn std::error::Error>> {
    let path = crate::fetch::ensure_default_model(&crate::fetch::default_cache_dir())?;
    Ok(Engine::load_with(
        &path,
        EngineOptions { threads: 2, ctx_tokens: 256, ..EngineOptions::default() },
        KvOptions::default(),
    )?)
}

/// A greedy request that runs its whole budget (end tokens suppressed).
fn request(engine: &Engine, text: &str, max_tokens: usize) -> Result<GenerateRequest> {
    let messages = [ChatMessage {
        role: "user".into(),
        content: Some(text.into()),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }];
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    let sampling = SamplingParams { logit_bias, ..SamplingParams::greedy() };
    Ok(GenerateRequest {
        prompt: engine.chat_prompt(&messages, None)?,
        max_tokens,
        stop: Vec::new(),
        sampling,
        top_logprobs: 0,
        grammar: None,
    })
}

/// A sink counting its events into `count`.
fn counting(count: &RefCell<usize>) -> Sink<'_> {
    Box::new(move |_| {
        *count.borrow_mut() += 1;
        ControlFlow::Continue(())
    })
}

/// A scheduler that runs one sequence at a time, with tenant a's request of `max_tokens`
/// submitted.
fn single_slot_with_a<'e, 's>(
    engine: &'e Engine,
    a_tokens: &'s RefCell<usize>,
    max_tokens: usize,
) -> std::result::Result<(Scheduler<'e, 's>, JobId), Box<dyn std::error::Error>> {
    let mut sched = Scheduler::new(engine, SchedulerConfig { max_running: 1, ..SchedulerConfig::default() });
    let a =
        sched.submit(Owner::new("a", "1"), request(engine, "Name three colours.", max_tokens)?, counting(a_tokens))?;
    Ok((sched, a))
}

#[test]
fn a_paused_sequence_holds_no_place_in_the_batch() -> TestResult {
    let engine = engine()?;
    let (a_tokens, b_tokens) = (RefCell::new(0), RefCell::new(0));
    let (mut sched, a) = single_slot_with_a(&engine, &a_tokens, 40)?;
    while *a_tokens.borrow() < 2 {
        sched.step()?;
    }
    assert!(sched.set_paused(a, true));
    let b = sched.submit(Owner::new("b", "1"), request(&engine, "What is 2 + 2?", 4)?, counting(&b_tokens))?;
    // With `a` counted against max_running = 1, `b` would never be admitted.
    let mut finished = Vec::new();
    for _ in 0..100 {
        finished.extend(
            sched.step()?.into_iter().map(|(id, outcome)| (id, outcome.map(|g| g.finish).map_err(|e| e.to_string()))),
        );
        if !finished.is_empty() {
            break;
        }
    }
    assert_eq!(finished, [(b, Ok(FinishReason::Length))], "b ran to its end while a was paused");
    assert_eq!((*a_tokens.borrow(), *b_tokens.borrow()), (2, 4));
    assert_eq!((sched.running(), sched.paused()), (1, 1));
    assert!(!sched.has_work(), "only a paused request is left: a step has nothing to do");
    assert!(sched.set_paused(a, false) && sched.has_work());
    assert_eq!(sched.run()?.len(), 1);
    assert_eq!(*a_tokens.borrow(), 40);
    Ok(())
}

#[test]
fn a_queued_request_can_be_paused_and_cancelled_before_it_starts() -> TestResult {
    let engine = engine()?;
    let (a_tokens, b_tokens) = (RefCell::new(0), RefCell::new(0));
    let (mut sched, a) = single_slot_with_a(&engine, &a_tokens, 3)?;
    let b = sched.submit(Owner::new("b", "1"), request(&engine, "What is 2 + 2?", 3)?, counting(&b_tokens))?;
    assert!(sched.set_paused(a, true), "a waiting request can be paused");
    sched.step()?;
    assert_eq!((sched.running(), sched.queued()), (1, 1), "the paused request stays in the queue; b started");
    assert!(sched.cancel(a));
    assert_eq!(sched.queued(), 0);
    let mut outcomes: Vec<_> = sched
        .run()?
        .into_iter()
        .map(|(id, o)| (id, o.map(|g| (g.finish, g.completion_tokens)).map_err(|e| e.to_string())))
        .collect();
    outcomes.sort_by_key(|(id, _)| *id);
    assert_eq!(outcomes, [(a, Ok((FinishReason::Cancelled, 0))), (b, Ok((FinishReason::Length, 3)))]);
    assert_eq!(*a_tokens.borrow(), 0, "a cancelled request never emits");
    Ok(())
}

#[test]
fn unknown_and_finished_requests_cannot_be_paused_or_cancelled() -> TestResult {
    let engine = engine()?;
    let tokens = RefCell::new(0);
    let mut sched = Scheduler::new(&engine, SchedulerConfig::default());
    assert!(!sched.set_paused(41, true) && !sched.cancel(41));
    let id = sched.submit(Owner::new("a", "1"), request(&engine, "What is 2 + 2?", 2)?, counting(&tokens))?;
    sched.run()?;
    assert!(!sched.set_paused(id, true) && !sched.cancel(id), "a finished request is gone");
    assert!(sched.is_idle());
    Ok(())
}
