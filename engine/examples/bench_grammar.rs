//! What constrained decoding costs: decode speed of the same model with and without an
//! output grammar, in alternating rounds (the machine is shared: compare medians), plus
//! the grammar compile times. Prints one JSON object per round and grammar, then a
//! summary line per grammar: the median, over rounds that decoded the full length, of its
//! per-token time against free text's in the same round.
//!
//! `cargo run --release -p crossguard-engine --example bench_grammar -- MODEL THREADS [TOKENS] [ROUNDS] [SCHEMA.json]`
//!
//! With a schema file, that schema replaces the built-in list schema (to measure what a
//! hard schema costs a step).

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Instant;

use engine::engine::{Engine, EngineOptions, GenerateRequest, SamplingParams};
use engine::grammar::{CompiledGrammar, Grammar};
use engine::kv::Owner;
use engine::template::ChatMessage;
use serde_json::json;

fn arg(n: usize, default: usize) -> usize {
    std::env::args().nth(n).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(std::env::args().nth(1).ok_or("usage: bench_grammar MODEL THREADS [TOKENS] [ROUNDS]")?);
    let (threads, tokens, rounds) = (arg(2, 1), arg(3, 256), arg(4, 5));
    let engine = Engine::load(&model, EngineOptions { threads, ctx_tokens: 2048, ..EngineOptions::default() })?;
    let prompt = engine
        .chat_prompt(&[ChatMessage::new("user", "List many fruits with their colours and prices, as JSON.")], None)?;

    // Long outputs on purpose, so every round decodes about `tokens` tokens: a list of
    // at least 200 entries, and any JSON object.
    let builtin = json!({"type": "object", "properties": {"fruits": {"type": "array", "minItems": 200, "items": {
        "type": "object", "properties": {"name": {"type": "string", "maxLength": 16}, "colour": {"enum": ["red", "green", "yellow", "orange", "purple"]},
        "price": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["name", "colour", "price"], "additionalProperties": false}}},
        "required": ["fruits"], "additionalProperties": false});
    let list = match std::env::args().nth(5) {
        Some(path) => serde_json::from_str(&std::fs::read_to_string(&path)?)?,
        None => builtin,
    };
    let started = Instant::now();
    let object = engine.compile_grammar(&Grammar::JsonObject)?;
    let first_compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let started = Instant::now();
    let schema = engine.compile_grammar(&Grammar::JsonSchema(list))?;
    let schema_compile_ms = started.elapsed().as_secs_f64() * 1e3;
    println!("{{\"first_compile_ms\":{first_compile_ms:.1},\"schema_compile_ms\":{schema_compile_ms:.1}}}");

    let cases: [(&str, Option<CompiledGrammar>); 3] =
        [("free", None), ("json_object", Some(object)), ("json_schema", Some(schema))];
    // Per round and case: (ms per token, tokens generated).
    let mut per_token_ms: Vec<Vec<(f64, usize)>> = vec![Vec::new(); cases.len()];
    let owner = Owner::new("bench", "grammar");
    for round in 0..rounds {
        for (i, (name, grammar)) in cases.iter().enumerate() {
            // Free text cannot end early; a grammar ends where its output is complete.
            let logit_bias = if grammar.is_none() {
                engine.tokenizer().eos_ids().iter().map(|id| (*id, -100.0)).collect()
            } else {
                Vec::new()
            };
            let sampling =
                SamplingParams { temperature: 0.8, seed: Some(round as u64), logit_bias, ..SamplingParams::default() };
            let request = GenerateRequest {
                prompt: prompt.clone(),
                max_tokens: tokens,
                stop: Vec::new(),
                sampling,
                top_logprobs: 0,
                grammar: grammar.clone(),
            };
            let mut first: Option<Instant> = None;
            let mut count = 0usize;
            engine.generate_for(&owner, &request, &mut |_| {
                count += 1;
                first.get_or_insert_with(Instant::now);
                ControlFlow::Continue(())
            })?;
            let decode_s = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
            let ms = decode_s * 1e3 / count.saturating_sub(1).max(1) as f64;
            per_token_ms[i].push((ms, count));
            println!("{{\"round\":{round},\"case\":\"{name}\",\"threads\":{threads},\"tokens\":{count},\"decode_ms_per_token\":{ms:.3}}}");
        }
    }
    // Paired by round, and only over rounds that reached the full length: a grammar
    // that ended early decoded over a shorter context, which is cheaper per token.
    for (i, (name, _)) in cases.iter().enumerate() {
        let paired: Vec<f64> = per_token_ms[i]
            .iter()
            .zip(&per_token_ms[0])
            .filter(|((_, n), _)| *n == tokens)
            .map(|((ms, _), (free, _))| ms / free - 1.0)
            .collect();
        let overhead = if paired.is_empty() { "null".to_owned() } else { format!("{:.3}", median(paired.clone())) };
        let ms = median(per_token_ms[i].iter().map(|(ms, _)| *ms).collect());
        println!("{{\"summary\":\"{name}\",\"median_ms_per_token\":{ms:.3},\"full_length_rounds\":{},\"median_overhead_vs_free\":{overhead}}}", paired.len());
    }
    Ok(())
}
