//! What the KV cache's isolation defences cost: the same batched workload through the
//! continuous-batching scheduler on two engines loaded from one GGUF, one with every
//! defence on (zero-fill on release, owner check and bounds check on every block read)
//! and one with them switched off through the fault switches. Rounds alternate between
//! the two so that load on a shared machine hits both alike; prints one JSON line per
//! run and the median ratio.
//!
//! `cargo run --release -p crossguard-engine --example bench_defences -- MODEL THREADS [CONCURRENCY] [DECODE_TOKENS] [ROUNDS]`

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use engine::engine::{Engine, EngineOptions, GenerateRequest, KvOptions, SamplingParams};
use engine::fault::FaultConfig;
use engine::kv::Owner;
use engine::sched::{Scheduler, SchedulerConfig};

fn arg(n: usize, default: usize) -> usize {
    std::env::args().nth(n).and_then(|s| s.parse().ok()).unwrap_or(default)
}

const PROMPTS: [&str; 4] = [
    "Name three colours and say one thing about each.",
    "Write a short poem about rain on a tin roof.",
    "Explain what a hash table is to a child.",
    "Describe a lighthouse at night.",
];

/// Runs `concurrency` requests of `decode_tokens` tokens each as one batch; tokens/s.
fn run(engine: &Engine, concurrency: usize, decode_tokens: usize) -> Result<f64, Box<dyn std::error::Error>> {
    // End tokens suppressed so every request generates the full length.
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    let sampling = SamplingParams { logit_bias, ..SamplingParams::greedy() };
    let config = SchedulerConfig { max_running: concurrency, max_queued: concurrency, ..SchedulerConfig::default() };
    let mut sched = Scheduler::new(engine, config);
    let mut tokens = 0usize;
    for i in 0..concurrency {
        let prompt = engine.tokenizer().encode(PROMPTS[i % PROMPTS.len()], false)?;
        let request = GenerateRequest { prompt, max_tokens: decode_tokens, stop: Vec::new(), sampling: sampling.clone(), top_logprobs: 0 };
        // Each tenant its own: the owner check compares tenants on every block read.
        let owner = Owner::new(&format!("tenant-{i}"), &format!("request-{i}"));
        sched.submit(owner, request, Box::new(|_| ControlFlow::Continue(())))?;
    }
    let start = Instant::now();
    for (_, outcome) in sched.run()? {
        tokens += outcome?.completion_tokens;
    }
    let seconds = start.elapsed().as_secs_f64();
    Ok(tokens as f64 / seconds)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(std::env::args().nth(1).ok_or("usage: bench_defences MODEL THREADS [CONCURRENCY] [DECODE_TOKENS] [ROUNDS]")?);
    let (threads, concurrency, decode_tokens, rounds) = (arg(2, 2), arg(3, 16), arg(4, 64), arg(5, 5));
    let options = EngineOptions { threads, ctx_tokens: 2048 };
    let on = Engine::load_with(&model, options.clone(), KvOptions::default())?;
    let fault = FaultConfig { skip_zero_fill: true, skip_owner_check: true, skip_bounds_check: true, ..FaultConfig::default() };
    let off = Engine::load_with(&model, options, KvOptions { fault, ..KvOptions::default() })?;
    run(&on, concurrency.min(2), 4)?; // warm-up
    run(&off, concurrency.min(2), 4)?;
    let mut ratios = Vec::new();
    for round in 0..rounds {
        // Alternate which goes first, so a trend in load does not favour one side.
        let (a, b) = if round % 2 == 0 { (&on, &off) } else { (&off, &on) };
        let (ta, tb) = (run(a, concurrency, decode_tokens)?, run(b, concurrency, decode_tokens)?);
        let (with, without) = if round % 2 == 0 { (ta, tb) } else { (tb, ta) };
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?");
        println!("{{\"round\":{round},\"concurrency\":{concurrency},\"with_defences_tok_s\":{with:.1},\"without_tok_s\":{without:.1},\"ratio\":{:.4},\"loadavg\":{load}}}", with / without);
        ratios.push(with / without);
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!("median throughput with defences / without, over {rounds} rounds: {median:.4} (cost {:.2} %)", (1.0 - median) * 100.0);
    Ok(())
}
