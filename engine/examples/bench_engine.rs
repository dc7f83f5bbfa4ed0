//! End-to-end speed of the engine on one GGUF: prefill and decode (per second of wall
//! time and per CPU-second), time to first token, peak memory. Prints one JSON object per repetition; `scripts/bench/engine_vs_llamacpp.py`
//! runs it next to llama.cpp and tabulates both.
//!
//! `cargo run --release -p crossguard-engine --example bench_engine -- MODEL THREADS [PROMPT_TOKENS] [DECODE_TOKENS] [REPEATS]`

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use engine::engine::{Engine, EngineOptions, GenerateRequest, SamplingParams};

fn arg(n: usize, default: usize) -> usize {
    std::env::args().nth(n).and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// Peak resident set size of this process, in MiB (Linux).
fn peak_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU time this process's threads have run so far, in seconds (Linux schedstat, ns
/// resolution): on a shared machine, a rate per CPU-second is what load does not halve.
fn cpu_seconds() -> f64 {
    let tasks = std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten();
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()))
        .sum();
    ns as f64 / 1e9
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model =
        PathBuf::from(std::env::args().nth(1).ok_or("usage: bench_engine MODEL THREADS [PROMPT] [DECODE] [REPEATS]")?);
    let (threads, prompt_tokens, decode_tokens, repeats) = (arg(2, 1), arg(3, 512), arg(4, 128), arg(5, 3));
    let engine = Engine::load(&model, EngineOptions { threads, ctx_tokens: 2048, ..EngineOptions::default() })?;
    // A natural-text prompt, repeated to length: token ids as the tokenizer makes them.
    let text =
        "The quick brown fox jumps over the lazy dog while the engine counts tokens. ".repeat(prompt_tokens / 8 + 1);
    let mut prompt = engine.tokenizer().encode(&text, false)?;
    prompt.truncate(prompt_tokens);
    // Suppress end tokens so decode always runs the full length.
    let logit_bias = engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect();
    let sampling = SamplingParams { logit_bias, ..SamplingParams::greedy() };
    for _ in 0..repeats {
        let (start, cpu_start) = (Instant::now(), cpu_seconds());
        engine.prompt_logits(&prompt, 0, false)?;
        let (prefill_s, prefill_cpu_s) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
        let request = GenerateRequest {
            prompt: prompt.clone(),
            max_tokens: decode_tokens + 1,
            stop: Vec::new(),
            sampling: sampling.clone(),
            top_logprobs: 0,
            grammar: None,
        };
        let start = Instant::now();
        let mut first: Option<(f64, f64)> = None;
        let mut count = 0usize;
        engine.generate(&request, &mut |_| {
            count += 1;
            first.get_or_insert_with(|| (start.elapsed().as_secs_f64(), cpu_seconds()));
            ControlFlow::Continue(())
        })?;
        let total = start.elapsed().as_secs_f64();
        let (ttft, decode_cpu_start) = first.unwrap_or((total, cpu_seconds()));
        let decode_cpu_s = cpu_seconds() - decode_cpu_start;
        println!(
            "{{\"engine\":\"crossguard\",\"threads\":{threads},\"prompt_tokens\":{},\"prefill_tok_s\":{:.1},\"prefill_cpu_tok_s\":{:.1},\"decode_tok_s\":{:.1},\"decode_cpu_tok_s\":{:.1},\"ttft_ms\":{:.1},\"peak_rss_mib\":{:.1}}}",
            prompt.len(),
            prompt.len() as f64 / prefill_s,
            prompt.len() as f64 / prefill_cpu_s,
            (count.saturating_sub(1)) as f64 / (total - ttft),
            (count.saturating_sub(1)) as f64 / decode_cpu_s,
            ttft * 1000.0,
            peak_rss_mib()
        );
    }
    Ok(())
}
