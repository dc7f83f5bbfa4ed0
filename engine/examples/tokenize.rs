//! Token ids of texts, for comparing tokenizers (`scripts/bench/tokenizer_vs_llamacpp.py`).
//!
//! Reads one JSON string per line from stdin and writes the ids of each (no BOS, special
//! text as text) as a JSON array per line.
//!
//! `cargo run --release -p crossguard-engine --example tokenize -- MODEL < texts.jsonl`

use std::io::{BufRead, Write};

use engine::gguf::GgufFile;
use engine::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = std::env::args().nth(1).ok_or("usage: tokenize MODEL < texts.jsonl")?;
    let tokenizer = Tokenizer::from_gguf(&GgufFile::open(std::path::Path::new(&model))?)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in std::io::stdin().lock().lines() {
        let text: String = serde_json::from_str(&line?)?;
        writeln!(out, "{}", serde_json::to_string(&tokenizer.encode(&text, false)?)?)?;
    }
    out.flush()?;
    Ok(())
}
