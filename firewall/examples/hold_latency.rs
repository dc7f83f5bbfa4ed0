//! How long the streaming firewall holds honest text back: each clean record of a JSONL
//! corpus (`{"text": …, "secrets": []}`, as in `tests/corpus/`) is pushed a few bytes at a
//! time, as a model emits tokens, and every byte's wait is counted in pushes, from the push
//! that brought it to the one that released it. A rule that can start a match anywhere in
//! ordinary prose holds bytes until the text rules it out; this puts a number on that.
//!
//! ```sh
//! cargo run --release -p crossguard-firewall --example hold_latency -- CORPUS.jsonl... [--rules DIR]
//! ```
use std::process::ExitCode;
use std::sync::Arc;

use firewall::{Detectors, Ruleset, ScanContext, StreamScanner};

/// Bytes per push: about a model token's worth of text.
const PIECE: usize = 4;

/// Waits of every byte, in pushes, and how many pushes were made.
#[derive(Default)]
struct Waits {
    per_byte: Vec<u32>,
    pushes: usize,
    streams: usize,
}

impl Waits {
    /// Streams `text` and records each byte's wait; a stream a finding stops is left out
    /// (the corpus's clean records should have none).
    fn stream(&mut self, rules: &Arc<Ruleset>, text: &str) {
        let mut scanner = StreamScanner::new(Arc::clone(rules), ScanContext::new("t"), Arc::new(Detectors::default()));
        let mut bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).step_by(PIECE).collect();
        bounds.push(text.len());
        // arrived[p]: bytes pushed by push p; released after each push, in bytes.
        let (mut waits, mut released, mut arrived_at) = (Vec::with_capacity(text.len()), 0usize, Vec::new());
        for (push, w) in bounds.windows(2).enumerate() {
            arrived_at.extend(std::iter::repeat_n(push, w[1] - w[0]));
            let step = scanner.push(&text[w[0]..w[1]]);
            if scanner.is_blocked() {
                return;
            }
            for &at in &arrived_at[released..released + step.release.len()] {
                waits.push(u32::try_from(push - at).unwrap_or(u32::MAX));
            }
            released += step.release.len();
        }
        let last = bounds.len().saturating_sub(1);
        let step = scanner.finish();
        if scanner.is_blocked() {
            return;
        }
        for &at in &arrived_at[released..released + step.release.len()] {
            waits.push(u32::try_from(last - at).unwrap_or(u32::MAX));
        }
        self.per_byte.extend(waits);
        self.pushes += last;
        self.streams += 1;
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut files, mut rules_dir) = (Vec::new(), None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--rules" => rules_dir = it.next(),
            _ => files.push(a),
        }
    }
    let loaded = rules_dir.map_or_else(Ruleset::builtin, |d| Ruleset::load_dir(std::path::Path::new(d)));
    let rules = match loaded {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprint!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut waits = Waits::default();
    for path in files {
        let corpus = match std::fs::read_to_string(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{path}: {e}");
                return ExitCode::from(2);
            }
        };
        for (n, line) in corpus.lines().enumerate() {
            let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
                eprintln!("{path}:{}: not a JSON record", n + 1);
                return ExitCode::from(2);
            };
            let clean = record["secrets"].as_array().is_none_or(Vec::is_empty);
            if let (true, Some(text)) = (clean, record["text"].as_str()) {
                waits.stream(&rules, text);
            }
        }
    }
    let mut w = waits.per_byte;
    if w.is_empty() {
        eprintln!("no clean record streamed");
        return ExitCode::from(2);
    }
    w.sort_unstable();
    let at = |q: f64| w[((w.len() - 1) as f64 * q) as usize];
    let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / w.len() as f64;
    let held = w.iter().filter(|&&x| x > 0).count() as f64 / w.len() as f64;
    println!(
        "{} streams, {} bytes, {} pushes of {PIECE} bytes: a byte waits {mean:.3} pushes on average; \
         {:.1} % of bytes wait at all; p50 {}, p90 {}, p99 {}, p99.9 {}, most {}",
        waits.streams,
        w.len(),
        waits.pushes,
        held * 100.0,
        at(0.5),
        at(0.9),
        at(0.99),
        at(0.999),
        w[w.len() - 1]
    );
    ExitCode::SUCCESS
}
