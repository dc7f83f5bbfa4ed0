//! Any text in any chunking through the built-in ruleset: no panic; the same findings as
//! one-shot scanning up to the first block, and the block reported; unblocked, the same
//! released text as one push of the whole text; and what is released is the input itself,
//! in order, with redacted spans replaced by markers: never a byte more, nothing from a
//! blocking match on, and all of it when nothing blocks or redacts.
#![no_main]

use std::sync::{Arc, OnceLock};

use firewall::{Action, Detectors, Finding, Ruleset, ScanContext, StreamScanner};
use libfuzzer_sys::fuzz_target;

fn rules() -> Arc<Ruleset> {
    static RULES: OnceLock<Arc<Ruleset>> = OnceLock::new();
    RULES.get_or_init(|| Arc::new(Ruleset::builtin().unwrap_or_else(|_| Ruleset::empty()))).clone()
}

/// Feeds `pieces` and finishes: (blocked, findings, released text).
fn stream(rules: Arc<Ruleset>, pieces: &[&str]) -> (bool, Vec<Finding>, String) {
    let mut s = StreamScanner::new(rules, ScanContext::new("fuzz"), Arc::new(Detectors::default()));
    let (mut blocked, mut found, mut released) = (false, Vec::new(), String::new());
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    for piece in pieces {
        let step = s.push(piece);
        blocked |= step.action == Action::Block;
        found.extend(step.findings);
        released.push_str(&step.release);
        assert!(s.held_bytes() <= total, "holds more than was pushed");
    }
    let step = s.finish();
    blocked |= step.action == Action::Block;
    found.extend(step.findings);
    released.push_str(&step.release);
    Finding::sort(&mut found);
    (blocked, found, released)
}

/// Whether `small`'s bytes occur in `big` in order.
fn is_subsequence(small: &str, big: &str) -> bool {
    let mut big = big.bytes();
    small.bytes().all(|b| big.any(|c| c == b))
}

/// Splits `text` at char boundaries into pieces of 1 to 24 bytes (more for a multi-byte
/// character), lengths drawn from `seed` (a small LCG).
fn pieces(text: &str, seed: u8) -> Vec<&str> {
    let mut state = u32::from(seed) | 1;
    let mut out = Vec::new();
    let mut start = 0;
    while start < text.len() {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let mut end = (start + (state >> 24) as usize % 24 + 1).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        out.push(&text[start..end]);
        start = end;
    }
    out
}

// The built-in ruleset is built before the first input: under the fuzzer's instrumentation
// that takes ~30 s, which would otherwise count as the first input's time (a timeout).
fuzz_target!(init: { let _ = rules(); }, |data: &[u8]| {
    let Some((&seed, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let whole = rules().scan_with(text, &ScanContext::new("fuzz"), &Arc::new(Detectors::default()));
    let (blocked, found, released) = stream(rules(), &pieces(text, seed));
    let cut = whole.iter().filter(|f| f.action == Action::Block).map(|f| f.match_start).min();
    let expected: Vec<&Finding> = whole.iter().filter(|f| cut.is_none_or(|c| f.match_start <= c)).collect();
    let got: Vec<&Finding> = found.iter().filter(|f| cut.is_none_or(|c| f.match_start <= c)).collect();
    assert_eq!(got, expected);
    assert_eq!(blocked, cut.is_some());
    if cut.is_none() {
        // A block may stop a stream before text that one push would have let out: holding
        // back more is safe, so only unblocked streams must release the same text.
        let (_, _, released_at_once) = stream(rules(), &[text]);
        assert_eq!(released, released_at_once, "the chunking changed what was released");
    }

    let limit = cut.unwrap_or(text.len());
    let redacted: Vec<&Finding> = found.iter().filter(|f| f.action == Action::Redact).collect();
    if redacted.is_empty() {
        assert!(text.starts_with(&released), "released text is not the input's prefix");
        match cut {
            Some(c) => assert!(released.len() <= c, "released {} bytes, past the block at {c}", released.len()),
            None => assert_eq!(released.len(), text.len(), "an unblocked stream kept text back"),
        }
    } else {
        let raw = redacted.iter().fold(released, |r, f| r.replace(&format!("[REDACTED:{}]", f.rule_id), ""));
        let upto = text.get(..limit).unwrap_or(text);
        assert!(is_subsequence(&raw, upto), "released bytes that are not the input's, or past the block");
    }
});
