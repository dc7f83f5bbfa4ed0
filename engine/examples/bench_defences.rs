//! What the KV cache's isolation defences cost: the same batched workload through the
//! continuous-batching scheduler on two engines loaded from one GGUF, one with every
//! defence on (zero-fill on release, owner check and bounds check on every block read)
//! and one with them switched off through the fault switches. Rounds alternate between
//! the two so that load on a shared machine hits both alike; prints one JSON line per
//! run and the median ratios, of wall-clock throughput and of tokens per CPU-second (the
//! process's own user + system time, which other processes' load disturbs far less).
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

/// CPU time of this process (all threads), user + system, in seconds (Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|f| f.parse::<u64>().ok()).sum();
    ticks as f64 / 100.0 // USER_HZ
}

/// Tokens per wall second and per CPU second of one run.
struct Rate {
    wall: f64,
    cpu: f64,
}

/// Runs `concurrency` requests of `decode_tokens` tokens each as one batch.
fn run(engine: &Engine, concurrency: usize, decode_tokens: usize) -> Result<Rate, Box<dyn std::error::Error>> {
    // End tokens suppressed so every request generates the full length.
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    let sampling = SamplingParams { logit_bias, ..SamplingParams::greedy() };
    let config = SchedulerConfig { max_running: concurrency, max_queued: concurrency, ..SchedulerConfig::default() };
    let mut sched = Scheduler::new(engine, config);
    let mut tokens = 0usize;
    for i in 0..concurrency {
        let prompt = engine.tokenizer().encode(PROMPTS[i % PROMPTS.len()], false)?;
        let request = GenerateRequest {
            prompt,
            max_tokens: decode_tokens,
            stop: Vec::new(),
            sampling: sampling.clone(),
            top_logprobs: 0,
            grammar: None,
        };
        // Each tenant its own: the owner check compares tenants on every block read.
        let owner = Owner::new(&format!("tenant-{i}"), &format!("request-{i}"));
        sched.submit(owner, request, Box::new(|_| ControlFlow::Continue(())))?;
    }
    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    for (_, outcome) in sched.run()? {
        tokens += outcome?.completion_tokens;
    }
    let (seconds, cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    Ok(Rate { wall: tokens as f64 / seconds, cpu: tokens as f64 / cpu.max(0.01) })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(
        std::env::args().nth(1).ok_or("usage: bench_defences MODEL THREADS [CONCURRENCY] [DECODE_TOKENS] [ROUNDS]")?,
    );
    let (threads, concurrency, decode_tokens, rounds) = (arg(2, 2), arg(3, 16), arg(4, 64), arg(5, 5));
    let options = EngineOptions { threads, ctx_tokens: 2048, ..EngineOptions::default() };
    let on = Engine::load_with(&model, options.clone(), KvOptions::default())?;
    let fault =
        FaultConfig { skip_zero_fill: true, skip_owner_check: true, skip_bounds_check: true, ..FaultConfig::default() };
    let off = Engine::load_with(&model, options, KvOptions { fault, ..KvOptions::default() })?;
    run(&on, concurrency.min(2), 4)?; // warm-up
    run(&off, concurrency.min(2), 4)?;
    let (mut wall_ratios, mut cpu_ratios) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        // Alternate which goes first, so a trend in load does not favour one side.
        let (a, b) = if round % 2 == 0 { (&on, &off) } else { (&off, &on) };
        let (ra, rb) = (run(a, concurrency, decode_tokens)?, run(b, concurrency, decode_tokens)?);
        let (with, without) = if round % 2 == 0 { (ra, rb) } else { (rb, ra) };
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let load = load.split_whitespace().next().unwrap_or("?");
        println!(
            "{{\"round\":{round},\"concurrency\":{concurrency},\"with_tok_s\":{:.1},\"without_tok_s\":{:.1},\"with_tok_per_cpu_s\":{:.1},\"without_tok_per_cpu_s\":{:.1},\"loadavg\":{load}}}",
            with.wall, without.wall, with.cpu, without.cpu
        );
        wall_ratios.push(with.wall / without.wall);
        cpu_ratios.push(with.cpu / without.cpu);
    }
    for (what, ratios) in [("throughput", &mut wall_ratios), ("tokens per CPU-second", &mut cpu_ratios)] {
        ratios.sort_by(f64::total_cmp);
        let median = ratios[ratios.len() / 2];
        println!(
            "median {what} with defences / without, over {rounds} rounds: {median:.4} (cost {:.2} %)",
            (1.0 - median) * 100.0
        );
    }
    Ok(())
}
