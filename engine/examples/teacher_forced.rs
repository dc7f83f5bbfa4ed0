//! Teacher-forced logits of a model for token sequences, for fidelity measurements
//! (`scripts/bench/fidelity.py` compares them with llama.cpp's on the same file).
//!
//! Reads sequences of token ids from stdin, one per line (space-separated), and writes
//! for each token of each the logits after it: `vocab` little-endian f32 per row, rows
//! back to back, nothing else on stdout.
//!
//! `cargo run --release -p crossguard-engine --example teacher_forced -- MODEL [THREADS]`

use std::io::{BufRead, Write};
use std::path::PathBuf;

use engine::engine::{Engine, EngineOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = PathBuf::from(std::env::args().nth(1).ok_or("usage: teacher_forced MODEL [THREADS] < token lines")?);
    let threads = std::env::args().nth(2).map(|t| t.parse()).transpose()?.unwrap_or(1);
    let lines: Vec<Vec<u32>> = std::io::stdin()
        .lock()
        .lines()
        .map(|line| Ok(line?.split_whitespace().map(str::parse).collect::<Result<Vec<u32>, _>>()?))
        .collect::<Result<_, Box<dyn std::error::Error>>>()?;
    let longest = lines.iter().map(Vec::len).max().unwrap_or(0);
    let engine =
        Engine::load(&model, EngineOptions { threads, ctx_tokens: longest.max(16), ..EngineOptions::default() })?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut failed = None;
    for tokens in &lines {
        engine.teacher_forced(tokens, &mut |row| {
            let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
            if let Err(e) = out.write_all(&bytes) {
                failed.get_or_insert(e);
            }
        })?;
        if let Some(e) = failed.take() {
            return Err(e.into());
        }
    }
    out.flush()?;
    Ok(())
}
