//! The continuous-batching scheduler on the real model: batched output equals
//! single-request output (greedy), with chunked prefill, preemption under a small KV
//! pool, pausing, cancellation, a bounded queue and tenant-fair admission.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::OnceLock;

use engine::engine::{Engine, EngineOptions, FinishReason, GenerateRequest, KvOptions, SamplingParams};
use engine::kv::Owner;
use engine::sched::{JobId, Scheduler, SchedulerConfig};
use engine::Error;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const CTX: usize = 256;

fn model_path() -> Result<&'static PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        engine::fetch::ensure_default_model(&engine::fetch::default_cache_dir()).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// An engine with a context of `ctx` tokens whose KV pool holds `pool_tokens`
/// positions (0: the default, several contexts).
fn load(ctx: usize, pool_tokens: usize) -> Result<Engine, Box<dyn std::error::Error>> {
    let kv = KvOptions { pool_tokens, ..KvOptions::default() };
    Ok(Engine::load_with(model_path()?, EngineOptions { threads: 2, ctx_tokens: ctx, ..EngineOptions::default() }, kv)?)
}

fn roomy() -> Result<&'static Engine, String> {
    static ENGINE: OnceLock<Result<Engine, String>> = OnceLock::new();
    ENGINE.get_or_init(|| load(CTX, 0).map_err(|e| e.to_string())).as_ref().map_err(Clone::clone)
}

const TEXTS: [&str; 4] = [
    "Name three colours.",
    "Write one sentence about the moon and the tides of the northern sea.",
    "What is 2 + 2?",
    "List the days of the week, please, in order, starting from Monday.",
];

fn request(engine: &Engine, text: &str) -> Result<GenerateRequest, Error> {
    request_of(engine, text, 12)
}

fn request_of(engine: &Engine, text: &str, max_tokens: usize) -> Result<GenerateRequest, Error> {
    let messages = [engine::template::ChatMessage {
        role: "user".into(),
        content: Some(text.into()),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }];
    // End tokens suppressed: every request runs its whole budget.
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

fn tenant(i: usize) -> String {
    format!("tenant-{}", i % 2)
}

/// Each text generated alone, token ids.
fn singles(engine: &Engine, max_tokens: usize) -> Result<Vec<Vec<u32>>, Error> {
    TEXTS
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let mut ids = Vec::new();
            engine.generate_for(
                &Owner::new(&tenant(i), "single"),
                &request_of(engine, text, max_tokens)?,
                &mut |e| {
                    ids.push(e.id);
                    ControlFlow::Continue(())
                },
            )?;
            Ok(ids)
        })
        .collect()
}

/// Token ids per text and the number of preemptions.
type Batched = (Vec<Vec<u32>>, u64);

/// All texts through one scheduler; token ids per text, in `TEXTS` order, and the
/// number of preemptions.
fn batched(engine: &Engine, config: SchedulerConfig, max_tokens: usize) -> Result<Batched, Box<dyn std::error::Error>> {
    let outputs: Vec<RefCell<Vec<u32>>> = TEXTS.iter().map(|_| RefCell::new(Vec::new())).collect();
    let mut sched = Scheduler::new(engine, config);
    let mut jobs: HashMap<JobId, usize> = HashMap::new();
    for (i, text) in TEXTS.iter().enumerate() {
        let out = &outputs[i];
        let id = sched.submit(
            Owner::new(&tenant(i), "batched"),
            request_of(engine, text, max_tokens)?,
            Box::new(move |e| {
                out.borrow_mut().push(e.id);
                ControlFlow::Continue(())
            }),
        )?;
        jobs.insert(id, i);
    }
    for (id, outcome) in sched.run()? {
        let generation = outcome?;
        assert_eq!(generation.completion_tokens, outputs[jobs[&id]].borrow().len());
    }
    let preemptions = sched.preemptions();
    drop(sched);
    Ok((outputs.into_iter().map(RefCell::into_inner).collect(), preemptions))
}

#[test]
fn batched_results_equal_single_request_results() -> TestResult {
    let engine = roomy()?;
    let want = singles(engine, 12)?;
    // Small step budgets force chunked prefill next to other sequences' decode steps.
    for step_tokens in [512, 16] {
        let (got, _) = batched(
            engine,
            SchedulerConfig { step_tokens, max_running: 4, max_queued: 8, ..SchedulerConfig::default() },
            12,
        )?;
        assert_eq!(got, want, "step_tokens {step_tokens}");
    }
    Ok(())
}

#[test]
fn a_full_pool_preempts_and_recomputes_without_changing_the_output() -> TestResult {
    // One context window (128 tokens) of KV for four requests of ~60 tokens each: they
    // cannot all be resident at once.
    let engine = load(128, 128)?;
    let want = singles(&engine, 24)?;
    let (got, preemptions) = batched(
        &engine,
        SchedulerConfig { step_tokens: 512, max_running: 4, max_queued: 8, ..SchedulerConfig::default() },
        24,
    )?;
    assert!(preemptions > 0, "the pool was large enough: nothing was preempted");
    assert_eq!(got, want);
    let stats = engine.kv_stats();
    assert_eq!(stats.blocks_used, stats.blocks_cached, "only the prefix cache holds blocks afterwards");
    engine.kv_pool().audit()?;
    Ok(())
}

#[test]
fn the_queue_is_bounded_and_cancelled_requests_free_their_blocks() -> TestResult {
    let engine = load(CTX, 0)?;
    let mut sched = Scheduler::new(
        &engine,
        SchedulerConfig { step_tokens: 64, max_running: 1, max_queued: 2, ..SchedulerConfig::default() },
    );
    let stop_at_once = |_: &engine::engine::TokenEvent| ControlFlow::Break(());
    sched.submit(Owner::new("a", "1"), request(&engine, TEXTS[0])?, Box::new(stop_at_once))?;
    sched.submit(Owner::new("a", "2"), request(&engine, TEXTS[1])?, Box::new(stop_at_once))?;
    let refused = sched.submit(Owner::new("a", "3"), request(&engine, TEXTS[2])?, Box::new(stop_at_once));
    assert!(matches!(refused, Err(Error::QueueFull { limit: 2 })), "{refused:?}");
    for (_, outcome) in sched.run()? {
        assert_eq!(outcome?.finish, FinishReason::Cancelled);
    }
    let stats = engine.kv_stats();
    assert_eq!(stats.blocks_used, stats.blocks_cached);
    engine.kv_pool().audit()?;
    Ok(())
}

#[test]
fn admission_serves_the_least_served_tenant_first() -> TestResult {
    let engine = roomy()?;
    let order = RefCell::new(Vec::new());
    let mut sched = Scheduler::new(
        engine,
        SchedulerConfig { step_tokens: 512, max_running: 2, max_queued: 8, ..SchedulerConfig::default() },
    );
    for (tenant, request_id) in [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1")] {
        let order = &order;
        let mut first = true;
        let mut req = request(engine, TEXTS[0])?;
        req.max_tokens = 2;
        sched.submit(
            Owner::new(tenant, request_id),
            req,
            Box::new(move |_| {
                if std::mem::take(&mut first) {
                    order.borrow_mut().push(request_id);
                }
                ControlFlow::Continue(())
            }),
        )?;
    }
    sched.run()?;
    drop(sched);
    // b1 was admitted with a1, ahead of a's other requests.
    assert_eq!(order.into_inner(), ["a1", "b1", "a2", "a3"]);
    Ok(())
}

/// Steps `sched` until `out` holds `n` tokens.
fn step_until(sched: &mut Scheduler<'_, '_>, out: &RefCell<Vec<u32>>, n: usize) -> TestResult {
    while out.borrow().len() < n {
        sched.step()?;
    }
    Ok(())
}

/// A sink collecting token ids into `out`.
fn collect(out: &RefCell<Vec<u32>>) -> engine::sched::Sink<'_> {
    Box::new(move |e| {
        out.borrow_mut().push(e.id);
        ControlFlow::Continue(())
    })
}

#[test]
fn a_paused_request_keeps_its_blocks_and_resumes_with_the_same_output() -> TestResult {
    // Its own engine: the block counts below must not see other tests' sequences.
    let engine = load(CTX, 0)?;
    let want = singles(&engine, 16)?;
    let (paused, other) = (RefCell::new(Vec::new()), RefCell::new(Vec::new()));
    let mut sched = Scheduler::new(
        &engine,
        SchedulerConfig { step_tokens: 512, max_running: 4, max_queued: 8, ..SchedulerConfig::default() },
    );
    let id = sched.submit(Owner::new(&tenant(1), "paused"), request_of(&engine, TEXTS[1], 16)?, collect(&paused))?;
    step_until(&mut sched, &paused, 5)?;
    assert!(sched.set_paused(id, true));
    let held = engine.kv_stats();
    // Another request runs to its end meanwhile; the paused one neither advances nor
    // loses a block.
    sched.submit(Owner::new(&tenant(2), "other"), request_of(&engine, TEXTS[2], 16)?, collect(&other))?;
    let mut finished = Vec::new();
    while sched.has_work() {
        finished.extend(sched.step()?);
    }
    assert_eq!(finished.len(), 1, "only the other request finished");
    assert_eq!(*other.borrow(), want[2]);
    assert_eq!(paused.borrow().len(), 5, "a paused request generated nothing");
    // Blocks held by sequences and not by the prefix cache: the paused sequence's own.
    let own = |k: engine::kv::KvStats| k.blocks_used - k.blocks_cached;
    let during = engine.kv_stats();
    assert!(own(held) > 0, "{held:?}");
    assert_eq!(own(during), own(held), "the paused sequence kept its blocks: {held:?} -> {during:?}");
    assert!(sched.set_paused(id, false));
    let finished = sched.run()?;
    assert_eq!(finished.len(), 1);
    assert_eq!(*paused.borrow(), want[1], "resumed, it continues exactly where it stopped");
    Ok(())
}

#[test]
fn cancelling_frees_a_sequences_blocks_at_once() -> TestResult {
    let engine = load(CTX, 0)?;
    let (a, b) = (RefCell::new(Vec::new()), RefCell::new(Vec::new()));
    let mut sched = Scheduler::new(
        &engine,
        SchedulerConfig { step_tokens: 512, max_running: 4, max_queued: 8, ..SchedulerConfig::default() },
    );
    let a_id = sched.submit(Owner::new("a", "1"), request_of(&engine, TEXTS[1], 64)?, collect(&a))?;
    let b_id = sched.submit(Owner::new("b", "1"), request_of(&engine, TEXTS[3], 64)?, collect(&b))?;
    step_until(&mut sched, &a, 40)?;
    assert!(sched.set_paused(a_id, true));
    let before = engine.kv_stats();
    assert!(sched.cancel(a_id), "a paused request can be cancelled");
    assert!(sched.cancel(b_id), "a running request can be cancelled");
    // Before any further step: the generated tokens' blocks are back on the free list,
    // zero-filled; only the prompts' blocks may stay, in the tenants' prefix caches.
    let after = engine.kv_stats();
    assert!(after.blocks_free > before.blocks_free, "{before:?} -> {after:?}");
    assert!(after.zero_fills > before.zero_fills, "{before:?} -> {after:?}");
    assert_eq!(after.blocks_used, after.blocks_cached, "{after:?}");
    engine.kv_pool().audit()?;
    let outcomes: Vec<_> = sched.step()?.into_iter().map(|(_, o)| o.map(|g| g.finish)).collect::<Result<_, _>>()?;
    assert_eq!(outcomes, [FinishReason::Cancelled, FinishReason::Cancelled]);
    assert!(sched.is_idle());
    assert_eq!(a.borrow().len(), 40, "nothing was emitted after the pause");
    Ok(())
}
