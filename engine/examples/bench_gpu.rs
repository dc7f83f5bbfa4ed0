//! Serving speed of the engine on one device, for `scripts/gpu-check.sh`: single-stream
//! decode and time to first token, aggregate tokens/s of the continuous-batching scheduler
//! at several batch sizes, and what the isolation defences cost (the same batch with the
//! zero-fill and the in-kernel owner and bounds checks switched off), and what CUDA graphs
//! bring (the same engine launching every kernel itself). Prints one JSON object per
//! measurement; it measures, it does not judge.
//!
//! `cargo run --release -p crossguard-engine --example bench_gpu -- MODEL [cuda|cpu|auto] [PROMPT_TOKENS] [DECODE_TOKENS] [BATCHES] [profile]`
//! (`BATCHES` comma-separated, default `1,16,64,256`). With `profile` it measures nothing
//! itself: it runs one decode step per batch size, un-graphed, between CUDA profiler start
//! and stop, for `ncu --profile-from-start off` (scripts/gpu-check.sh does this).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use engine::backend::Device;
use engine::engine::{Engine, EngineOptions, GenerateRequest, KvOptions, SamplingParams};
use engine::fault::FaultConfig;
use engine::kv::Owner;
use engine::sched::{Scheduler, SchedulerConfig};

/// Rounds of each measurement (the report takes medians).
const ROUNDS: usize = 3;

/// Context window of the benchmark engines.
const CTX: usize = 2048;

/// HBM bandwidth of an H200, bytes/s (the bound the batch-1 decode is compared with).
const H200_BYTES_PER_S: f64 = 4.8e12;

fn arg(n: usize) -> Option<String> {
    std::env::args().nth(n)
}

fn load(
    model: &Path,
    device: Device,
    fault: FaultConfig,
    pool_tokens: usize,
    cuda_graphs: bool,
) -> Result<Engine, engine::Error> {
    let kv = KvOptions { fault, pool_tokens, ..KvOptions::default() };
    Engine::load_with(model, EngineOptions { ctx_tokens: CTX, device, cuda_graphs, ..EngineOptions::default() }, kv)
}

/// `n` prompts of `len` tokens that share no leading block with each other nor with the
/// prompts of another `round` (so no prefix reuse: every run prefills in full).
fn prompts(engine: &Engine, n: usize, len: usize, round: usize) -> Result<Vec<Vec<u32>>, engine::Error> {
    let text = "The quick brown fox jumps over the lazy dog while the engine counts tokens. ".repeat(len / 8 + 2);
    let base = engine.tokenizer().encode(&text, false)?;
    let first = |i: usize| ((round * n + i) % 20_000) as u32 + 100;
    Ok((0..n).map(|i| std::iter::once(first(i)).chain(base.iter().copied()).take(len).collect()).collect())
}

fn request(engine: &Engine, prompt: Vec<u32>, decode: usize) -> GenerateRequest {
    // Suppress end tokens so every request decodes its full length.
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    GenerateRequest {
        prompt,
        max_tokens: decode,
        stop: Vec::new(),
        sampling: SamplingParams { logit_bias, ..SamplingParams::greedy() },
        top_logprobs: 0,
        grammar: None,
    }
}

/// Single stream: time to first token and decode tokens/s of one request.
fn single_stream(
    engine: &Engine,
    label: &str,
    round: usize,
    prompt_tokens: usize,
    decode: usize,
) -> Result<String, engine::Error> {
    let prompt = prompts(engine, 1, prompt_tokens, round)?.remove(0);
    let req = request(engine, prompt, decode + 1);
    let start = Instant::now();
    let (mut first, mut count) = (None, 0usize);
    engine.generate(&req, &mut |_| {
        count += 1;
        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
        ControlFlow::Continue(())
    })?;
    let total = start.elapsed().as_secs_f64();
    let ttft = first.unwrap_or(total);
    let decode_tok_s = count.saturating_sub(1) as f64 / (total - ttft).max(1e-9);
    let hbm_fraction = engine.bytes_per_token() as f64 * decode_tok_s / H200_BYTES_PER_S;
    Ok(format!("{{\"kind\":\"single_stream\",\"variant\":\"{label}\",\"prompt_tokens\":{prompt_tokens},\"decode_tokens\":{},\"ttft_ms\":{:.2},\"decode_tok_s\":{decode_tok_s:.1},\"weight_bytes_per_token\":{},\"hbm_bound_fraction\":{hbm_fraction:.4}}}", count.saturating_sub(1), ttft * 1e3, engine.bytes_per_token()))
}

/// `batch` requests through the scheduler at once: generated tokens per second of wall.
fn aggregate(
    engine: &Engine,
    label: &str,
    round: usize,
    batch: usize,
    prompt_tokens: usize,
    decode: usize,
) -> Result<String, engine::Error> {
    let counter = std::cell::Cell::new(0usize);
    let config = SchedulerConfig {
        step_tokens: (batch * 2).max(512),
        max_running: batch,
        max_queued: batch,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(engine, config);
    let mut generated = 0usize;
    for (i, p) in prompts(engine, batch, prompt_tokens, round)?.into_iter().enumerate() {
        let counter = &counter;
        sched.submit(
            Owner::new(&format!("tenant-{}", i % 8), "bench"),
            request(engine, p, decode),
            Box::new(move |_| {
                counter.set(counter.get() + 1);
                ControlFlow::Continue(())
            }),
        )?;
    }
    let start = Instant::now();
    let mut steps = 0usize;
    while !sched.is_idle() {
        for (_, outcome) in sched.step()? {
            generated += outcome?.completion_tokens;
        }
        steps += 1;
    }
    let wall = start.elapsed().as_secs_f64();
    Ok(format!("{{\"kind\":\"aggregate\",\"variant\":\"{label}\",\"batch\":{batch},\"prompt_tokens\":{prompt_tokens},\"decode_tokens\":{decode},\"generated\":{generated},\"events\":{},\"steps\":{steps},\"wall_s\":{wall:.3},\"tok_s\":{:.1}}}", counter.get(), generated as f64 / wall))
}

/// For a profiler (`ncu --profile-from-start off`): one decode step of `batch` sequences
/// at `prompt_tokens` of context, launch by launch, between profiler start and stop.
fn profile_one_decode_step(
    engine: &Engine,
    batch: usize,
    prompt_tokens: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let firsts = std::cell::Cell::new(0usize);
    let config = SchedulerConfig {
        step_tokens: (batch * 2).max(512),
        max_running: batch,
        max_queued: batch,
        ..SchedulerConfig::default()
    };
    let mut sched = Scheduler::new(engine, config);
    for (i, p) in prompts(engine, batch, prompt_tokens, 1_000 + batch)?.into_iter().enumerate() {
        let (firsts, mut seen) = (&firsts, false);
        // Long enough that the first sequences still decode when the last one starts.
        sched.submit(
            Owner::new(&format!("tenant-{}", i % 8), "profile"),
            request(engine, p, 64),
            Box::new(move |_| {
                if !std::mem::replace(&mut seen, true) {
                    firsts.set(firsts.get() + 1);
                }
                ControlFlow::Continue(())
            }),
        )?;
    }
    // Until every sequence has its first token, i.e. all of them decode from here on.
    while firsts.get() < batch {
        sched.step()?;
    }
    cudarc::driver::profiler_start()?;
    sched.step()?;
    cudarc::driver::profiler_stop()?;
    while !sched.is_idle() {
        sched.step()?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(arg(1).ok_or("usage: bench_gpu MODEL [cuda|cpu|auto] [PROMPT] [DECODE] [BATCHES]")?);
    let device: Device = arg(2).unwrap_or_else(|| "cuda".into()).parse()?;
    let prompt_tokens = arg(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let decode = arg(4).and_then(|s| s.parse().ok()).unwrap_or(128);
    let batches: Vec<usize> =
        arg(5).unwrap_or_else(|| "1,16,64,256".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let largest = batches.iter().copied().max().unwrap_or(1);
    // Room for every sequence of the largest batch: prompt, decode and a spare block each.
    let pool = largest * (prompt_tokens + decode + 32);
    if arg(6).as_deref() == Some("profile") {
        let engine = load(&model, device, FaultConfig::default(), pool, false)?;
        aggregate(&engine, "warm-up", 0, 2, 16, 4)?;
        for &b in &batches {
            profile_one_decode_step(&engine, b, prompt_tokens)?;
        }
        return Ok(());
    }
    let defended = load(&model, device, FaultConfig::default(), pool, true)?;
    println!("{{\"kind\":\"device\",\"device\":\"{device}\",\"gpu\":{:?}}}", defended.gpu().unwrap_or("none"));
    // Warm-up: compiles the kernels (NVRTC, first use) and sizes the workspaces.
    aggregate(&defended, "warm-up", 0, 2, 16, 4)?;
    // The defences' cost: the same runs with zero-fill and the in-kernel checks off; and
    // what CUDA graphs bring: the defended engine launching every kernel itself.
    let open =
        FaultConfig { skip_zero_fill: true, skip_owner_check: true, skip_bounds_check: true, ..FaultConfig::default() };
    let undefended = load(&model, device, open, pool, true)?;
    aggregate(&undefended, "warm-up", 0, 2, 16, 4)?;
    let ungraphed = load(&model, device, FaultConfig::default(), pool, false)?;
    aggregate(&ungraphed, "warm-up", 0, 2, 16, 4)?;
    // Interleaved rounds: a median per variant, each variant as often before as after.
    // Each run has prompts of its own (`round`), so none is served from the prefix cache.
    let mut round = 1;
    for _ in 0..ROUNDS {
        println!("{}", single_stream(&defended, "defended", round, prompt_tokens, decode)?);
        println!("{}", single_stream(&ungraphed, "no_graphs", round + 1, prompt_tokens, decode)?);
        round += 2;
    }
    for &b in &batches {
        for _ in 0..ROUNDS {
            println!("{}", aggregate(&defended, "defended", round, b, prompt_tokens, decode)?);
            println!("{}", aggregate(&undefended, "no_zero_fill_no_checks", round + 1, b, prompt_tokens, decode)?);
            println!("{}", aggregate(&ungraphed, "no_graphs", round + 2, b, prompt_tokens, decode)?);
            round += 3;
        }
    }
    Ok(())
}
