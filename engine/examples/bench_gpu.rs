//! Serving speed of the engine on one device, for `scripts/gpu-check.sh`: single-stream
//! decode and time to first token, aggregate tokens/s of the continuous-batching scheduler
//! at several batch sizes, and what the isolation defences cost (the same batch with the
//! zero-fill and the in-kernel owner and bounds checks switched off). Prints one JSON
//! object per measurement; it measures, it does not judge.
//!
//! `cargo run --release -p crossguard-engine --example bench_gpu -- MODEL [cuda|cpu|auto] [PROMPT_TOKENS] [DECODE_TOKENS] [BATCHES]`
//! (`BATCHES` comma-separated, default `1,16,64,256`).

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use engine::backend::Device;
use engine::engine::{Engine, EngineOptions, GenerateRequest, KvOptions, SamplingParams};
use engine::fault::FaultConfig;
use engine::kv::Owner;
use engine::sched::{Scheduler, SchedulerConfig};

/// Context window of the benchmark engines.
const CTX: usize = 2048;

/// HBM bandwidth of an H200, bytes/s (the bound the batch-1 decode is compared with).
const H200_BYTES_PER_S: f64 = 4.8e12;

fn arg(n: usize) -> Option<String> {
    std::env::args().nth(n)
}

fn load(model: &Path, device: Device, fault: FaultConfig, pool_tokens: usize) -> Result<Engine, engine::Error> {
    let kv = KvOptions { fault, pool_tokens, ..KvOptions::default() };
    Engine::load_with(model, EngineOptions { ctx_tokens: CTX, device, ..EngineOptions::default() }, kv)
}

/// `n` prompts of `len` tokens that share no leading block (so no prefix reuse).
fn prompts(engine: &Engine, n: usize, len: usize) -> Result<Vec<Vec<u32>>, engine::Error> {
    let text = "The quick brown fox jumps over the lazy dog while the engine counts tokens. ".repeat(len / 8 + 2);
    let base = engine.tokenizer().encode(&text, false)?;
    Ok((0..n).map(|i| std::iter::once((i % 1000) as u32 + 100).chain(base.iter().copied()).take(len).collect()).collect())
}

fn request(engine: &Engine, prompt: Vec<u32>, decode: usize) -> GenerateRequest {
    // Suppress end tokens so every request decodes its full length.
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    GenerateRequest { prompt, max_tokens: decode, stop: Vec::new(), sampling: SamplingParams { logit_bias, ..SamplingParams::greedy() }, top_logprobs: 0 }
}

/// Single stream: time to first token and decode tokens/s of one request.
fn single_stream(engine: &Engine, prompt_tokens: usize, decode: usize) -> Result<String, engine::Error> {
    let prompt = prompts(engine, 1, prompt_tokens)?.remove(0);
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
    Ok(format!("{{\"kind\":\"single_stream\",\"prompt_tokens\":{prompt_tokens},\"decode_tokens\":{},\"ttft_ms\":{:.2},\"decode_tok_s\":{decode_tok_s:.1},\"weight_bytes_per_token\":{},\"hbm_bound_fraction\":{hbm_fraction:.4}}}", count.saturating_sub(1), ttft * 1e3, engine.bytes_per_token()))
}

/// `batch` requests through the scheduler at once: generated tokens per second of wall.
fn aggregate(engine: &Engine, label: &str, batch: usize, prompt_tokens: usize, decode: usize) -> Result<String, engine::Error> {
    let counter = std::cell::Cell::new(0usize);
    let config = SchedulerConfig { step_tokens: (batch * 2).max(512), max_running: batch, max_queued: batch, ..SchedulerConfig::default() };
    let mut sched = Scheduler::new(engine, config);
    let mut generated = 0usize;
    for (i, p) in prompts(engine, batch, prompt_tokens)?.into_iter().enumerate() {
        let counter = &counter;
        sched.submit(Owner::new(&format!("tenant-{}", i % 8), "bench"), request(engine, p, decode), Box::new(move |_| {
            counter.set(counter.get() + 1);
            ControlFlow::Continue(())
        }))?;
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(arg(1).ok_or("usage: bench_gpu MODEL [cuda|cpu|auto] [PROMPT] [DECODE] [BATCHES]")?);
    let device: Device = arg(2).unwrap_or_else(|| "cuda".into()).parse()?;
    let prompt_tokens = arg(3).and_then(|s| s.parse().ok()).unwrap_or(128);
    let decode = arg(4).and_then(|s| s.parse().ok()).unwrap_or(128);
    let batches: Vec<usize> = arg(5).unwrap_or_else(|| "1,16,64,256".into()).split(',').filter_map(|s| s.trim().parse().ok()).collect();
    let largest = batches.iter().copied().max().unwrap_or(1);
    // Room for every sequence of the largest batch: prompt, decode and a spare block each.
    let pool = largest * (prompt_tokens + decode + 32);
    let defended = load(&model, device, FaultConfig::default(), pool)?;
    println!("{{\"kind\":\"device\",\"device\":\"{device}\",\"gpu\":{:?}}}", defended.gpu().unwrap_or("none"));
    // Warm-up: compiles the kernels (NVRTC, first use) and sizes the workspaces.
    aggregate(&defended, "warm-up", 2, 16, 4)?;
    println!("{}", single_stream(&defended, prompt_tokens, decode)?);
    // The defences' cost: the same runs with zero-fill and the in-kernel checks off,
    // interleaved with the defended ones.
    let open = FaultConfig { skip_zero_fill: true, skip_owner_check: true, skip_bounds_check: true, ..FaultConfig::default() };
    let undefended = load(&model, device, open, pool)?;
    aggregate(&undefended, "warm-up", 2, 16, 4)?;
    for &b in &batches {
        println!("{}", aggregate(&defended, "defended", b, prompt_tokens, decode)?);
        println!("{}", aggregate(&undefended, "no_zero_fill_no_checks", b, prompt_tokens, decode)?);
    }
    Ok(())
}
