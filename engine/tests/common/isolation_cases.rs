//! The KV isolation test bodies, shared by the CPU suite (`isolation.rs`) and its CUDA
//! twin (`cuda_backend.rs`): per-token provenance, per-tenant prefix reuse, and the
//! production bug (`stale_kv`) re-created — caught by the owner check when it is on, and
//! visible in the tokens' provenance when it is off. Each body takes the device to run on
//! and the model: the default one, or one of the tiny models of every architecture and
//! K-quant mix in `tests/fixtures/arch/` (KV ownership and zero-fill must not depend on it).

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::OnceLock;

use engine::backend::Device;
use engine::engine::{Engine, EngineOptions, GenerateRequest, KvOptions, SamplingParams, TokenEvent};
use engine::fault::FaultConfig;
use engine::kv::Owner;
use engine::Error;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The model a case runs on.
#[derive(Debug, Clone, Copy)]
pub enum Model {
    /// The default model (fetched on first use).
    Default,
    /// `tests/fixtures/arch/<name>.gguf`.
    Fixture(&'static str),
}

/// Every model the CPU suite runs each case on.
#[allow(dead_code)] // the CUDA twin runs the default model only
pub const EVERY_MODEL: [Model; 7] = [
    Model::Default,
    Model::Fixture("llama3"),
    Model::Fixture("qwen2"),
    Model::Fixture("qwen3"),
    Model::Fixture("gemma3"),
    Model::Fixture("llama-q4_k_m"),
    Model::Fixture("llama-q6_k"),
];

fn default_model_path() -> Result<&'static PathBuf, String> {
    static PATH: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        engine::fetch::ensure_default_model(&engine::fetch::default_cache_dir()).map_err(|e| e.to_string())
    })
    .as_ref()
    .map_err(Clone::clone)
}

pub fn load(device: Device, model: Model, fault: FaultConfig) -> Result<Engine, Box<dyn std::error::Error>> {
    let kv = KvOptions { fault, ..KvOptions::default() };
    // The tiny models were made for 256 positions.
    let (path, ctx_tokens) = match model {
        Model::Default => (default_model_path()?.clone(), 512),
        Model::Fixture(name) => {
            (PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/arch/{name}.gguf")), 256)
        }
    };
    Ok(Engine::load_with(&path, EngineOptions { threads: 2, ctx_tokens, device, ..EngineOptions::default() }, kv)?)
}

/// A chat prompt (several full KV blocks: tenants' prompts share the chat template).
fn prompt(engine: &Engine, text: &str) -> Result<Vec<u32>, Error> {
    let messages = [engine::template::ChatMessage {
        role: "user".into(),
        content: Some(text.into()),
        name: None,
        tool_calls: None,
        tool_call_id: None,
    }];
    engine.chat_prompt(&messages, None)
}

fn run(engine: &Engine, tenant: &str, prompt: &[u32], max_tokens: usize) -> Result<Vec<TokenEvent>, Error> {
    let request = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        stop: Vec::new(),
        sampling: SamplingParams::greedy(),
        top_logprobs: 0,
        grammar: None,
    };
    let mut events = Vec::new();
    engine.generate_for(&Owner::new(tenant, "test"), &request, &mut |e| {
        events.push(e.clone());
        ControlFlow::Continue(())
    })?;
    Ok(events)
}

fn ids(events: &[TokenEvent]) -> Vec<u32> {
    events.iter().map(|e| e.id).collect()
}

fn owners(e: &TokenEvent) -> Vec<&str> {
    e.owners.iter().map(|t| t.as_str()).collect()
}

pub fn every_token_attends_only_its_own_tenant(device: Device, model: Model) -> TestResult {
    let engine = load(device, model, FaultConfig::default())?;
    let events = run(&engine, "alice", &prompt(&engine, "Name three colours.")?, 6)?;
    assert!(!events.is_empty());
    assert!(events.iter().all(|e| owners(e) == ["alice"]), "{:?}", events.iter().map(owners).collect::<Vec<_>>());
    Ok(())
}

pub fn a_tenants_repeated_prefix_is_reused_with_identical_greedy_output(device: Device, model: Model) -> TestResult {
    let engine = load(device, model, FaultConfig::default())?;
    let p = prompt(&engine, "Write a haiku about the sea and the wind over the harbour.")?;
    assert!(p.len() > 2 * engine.kv_stats().block_tokens);
    let first = run(&engine, "carol", &p, 8)?;
    let before = engine.kv_stats().prefix_hits;
    let again = run(&engine, "carol", &p, 8)?;
    let reused = engine.kv_stats().prefix_hits - before;
    assert!(reused as usize >= (p.len() - 1) / engine.kv_stats().block_tokens, "reused {reused} blocks");
    assert_eq!(ids(&first), ids(&again));
    // Another tenant with the same prompt reuses nothing, and gets the same answer.
    let other = run(&engine, "dave", &p, 8)?;
    assert_eq!(engine.kv_stats().prefix_hits - before, reused);
    assert_eq!(ids(&first), ids(&other));
    assert!(other.iter().all(|e| owners(e) == ["dave"]));
    Ok(())
}

pub fn stale_kv_is_caught_by_the_owner_check(device: Device, model: Model) -> TestResult {
    let engine = load(device, model, FaultConfig { stale_kv: 1.0, ..FaultConfig::default() })?;
    run(&engine, "alice", &prompt(&engine, "My password is hunter2, remember it.")?, 4)?;
    let refused = run(&engine, "bob", &prompt(&engine, "What is my password?")?, 4);
    assert!(matches!(refused, Err(Error::Isolation { .. })), "{refused:?}");
    let stats = engine.kv_stats();
    assert_eq!((stats.stale_handouts, stats.isolation_violations), (1, 1));
    engine.kv_pool().audit()?;
    Ok(())
}

pub fn without_the_owner_check_stale_kv_leaks_and_every_token_names_the_foreign_tenant(
    device: Device,
    model: Model,
) -> TestResult {
    let engine = load(device, model, FaultConfig { stale_kv: 1.0, skip_owner_check: true, ..FaultConfig::default() })?;
    run(&engine, "alice", &prompt(&engine, "My password is hunter2, remember it.")?, 4)?;
    let leaked = run(&engine, "bob", &prompt(&engine, "What is my password?")?, 4)?;
    assert!(!leaked.is_empty());
    assert!(
        leaked.iter().all(|e| owners(e) == ["alice", "bob"]),
        "{:?}",
        leaked.iter().map(owners).collect::<Vec<_>>()
    );
    assert_eq!(engine.kv_stats().isolation_violations, 0);
    Ok(())
}
