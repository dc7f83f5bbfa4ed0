//! Firewall throughput with the full default ruleset.
//!
//! * one-shot MB/s on clean prose, clean code and secret-dense text (the labelled corpus in
//!   `tests/corpus`);
//! * streaming: time per pushed chunk (≈4-byte tokens, and ≈20-byte SSE-sized chunks) on
//!   clean prose, with and without the n-gram detector, and on secret-dense text;
//! * bytes held back after each push (median, p99), printed once before the timings. A
//!   block ends a stream, so on secret-dense text a fresh stream resumes after each block
//!   (otherwise the figure would be the holdback frozen at the first block).
//!
//! Run: `cargo bench -p crossguard-firewall --bench scan`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use firewall::{
    DecodeConfig, Detectors, NgramConfig, NgramKey, NgramOwners, OwnerSet, Ruleset, ScanContext, StreamScanner,
};

/// Corpus records of `file` joined by blank lines; `clean` keeps only records without
/// planted secrets.
fn corpus(file: &str, clean: bool) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let has_secrets = v.get("secrets").and_then(|s| s.as_array()).is_some_and(|a| !a.is_empty());
        if clean && has_secrets {
            continue;
        }
        if let Some(t) = v.get("text").and_then(|t| t.as_str()) {
            out.push(t.to_string());
        }
    }
    out.join("\n\n")
}

/// Repeats `s` up to at least `bytes`.
fn grow(s: &str, bytes: usize) -> String {
    let mut out = String::with_capacity(bytes + s.len());
    while out.len() < bytes && !s.is_empty() {
        out.push_str(s);
        out.push('\n');
    }
    out
}

/// Chunks of about `size` bytes, on char boundaries (4 ≈ a token, 20 ≈ an SSE delta).
fn chunks(text: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, _) in text.char_indices() {
        if i - start >= size {
            out.push(&text[start..i]);
            start = i;
        }
    }
    out.push(&text[start..]);
    out
}

struct Empty;
impl NgramOwners for Empty {
    fn owners(&self, _: u64) -> OwnerSet {
        OwnerSet::default()
    }
}

fn detectors(ngram: bool) -> Arc<Detectors> {
    let ngram = ngram.then(|| NgramConfig::new(NgramKey([1; 16]), Arc::new(Empty)));
    Arc::new(Detectors { ngram, ..Detectors::default() })
}

/// The gateway's text detectors: n-grams and tokens, and encoded runs read decoded.
fn gateway_detectors() -> Arc<Detectors> {
    let ngram = Some(NgramConfig::new(NgramKey([1; 16]), Arc::new(Empty)));
    Arc::new(Detectors { ngram, decode: Some(DecodeConfig::default()), ..Detectors::default() })
}

/// The first `bytes` of `text` (or all of it), cut on a char boundary.
fn cut(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn percentile(v: &mut [usize], p: f64) -> usize {
    v.sort_unstable();
    v.get(((v.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
}

fn report_holdback(rules: &Arc<Ruleset>, name: &str, text: &str, det: &Arc<Detectors>) {
    let fresh = || StreamScanner::new(rules.clone(), ScanContext::new("acme"), det.clone());
    let mut s = fresh();
    let (mut held, mut blocks) = (Vec::new(), 0);
    for c in chunks(text, 4) {
        s.push(c);
        if s.is_blocked() {
            // A blocked stream holds nothing more: resume with a new one, as a client would.
            blocks += 1;
            s = fresh();
            continue;
        }
        held.push(s.held_bytes());
    }
    let (med, p99, max) =
        (percentile(&mut held, 0.5), percentile(&mut held, 0.99), held.iter().copied().max().unwrap_or(0));
    eprintln!("holdback {name}: median {med} B, p99 {p99} B, max {max} B over {} pushes ({blocks} blocks)", held.len());
}

fn bench(c: &mut Criterion) {
    let rules = match Ruleset::builtin() {
        Ok(r) => Arc::new(r),
        Err(e) => return eprintln!("built-in rules do not load: {e}"),
    };
    eprintln!("{} rules, automata {} KiB", rules.len(), rules.memory_usage() >> 10);
    let prose = grow(&corpus("prose.jsonl", true), 1 << 20);
    let code = grow(&corpus("code.jsonl", true), 1 << 20);
    let dense = grow(&[corpus("answers.jsonl", false), corpus("configs.jsonl", false)].join("\n"), 1 << 20);
    let dense_findings = rules.scan(&dense).len();
    eprintln!("secret-dense text: {} findings per MiB", dense_findings * (1 << 20) / dense.len().max(1));
    for (name, text) in [("prose", &prose), ("code", &code), ("secret-dense", &dense)] {
        report_holdback(&rules, name, text, &detectors(false));
    }
    report_holdback(&rules, "prose+ngram", &prose, &detectors(true));
    report_holdback(&rules, "prose+ngram+decode", &prose, &gateway_detectors());
    report_holdback(&rules, "secret-dense+ngram+decode", &dense, &gateway_detectors());

    let mut g = c.benchmark_group("one-shot");
    g.sample_size(10)
        .measurement_time(std::time::Duration::from_secs(4))
        .warm_up_time(std::time::Duration::from_secs(1));
    for (name, text) in [("prose", &prose), ("code", &code), ("secret-dense", &dense)] {
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), text, |b, t| b.iter(|| rules.scan(t)));
    }
    g.finish();

    let mut g = c.benchmark_group("stream-push");
    g.sample_size(10)
        .measurement_time(std::time::Duration::from_secs(4))
        .warm_up_time(std::time::Duration::from_secs(1));
    let prose_piece = cut(&prose, 64 << 10);
    let dense_piece = cut(&dense, 64 << 10);
    let cases = [
        ("prose", prose_piece, 4, detectors(false)),
        ("prose+ngram", prose_piece, 4, detectors(true)),
        ("prose+ngram+decode", prose_piece, 4, gateway_detectors()),
        ("prose-20B", prose_piece, 20, detectors(false)),
        ("secret-dense-20B", dense_piece, 20, detectors(false)),
        ("secret-dense-20B+ngram+decode", dense_piece, 20, gateway_detectors()),
    ];
    for (name, piece, size, det) in cases {
        let pieces = chunks(piece, size);
        g.throughput(Throughput::Elements(pieces.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| {
                let fresh = || StreamScanner::new(rules.clone(), ScanContext::new("acme"), det.clone());
                let mut s = fresh();
                let mut n = 0;
                for p in &pieces {
                    n += s.push(p).release.len();
                    if s.is_blocked() {
                        s = fresh();
                    }
                }
                n + s.finish().release.len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
