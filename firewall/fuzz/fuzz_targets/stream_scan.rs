//! Any text in any chunking through the built-in ruleset: no panic, the same findings as
//! one-shot scanning up to the first block, and the block reported.
#![no_main]

use std::sync::{Arc, OnceLock};

use firewall::{Action, Detectors, Finding, Ruleset, ScanContext, StreamScanner};
use libfuzzer_sys::fuzz_target;

fn rules() -> Arc<Ruleset> {
    static RULES: OnceLock<Arc<Ruleset>> = OnceLock::new();
    RULES.get_or_init(|| Arc::new(Ruleset::builtin().unwrap_or_else(|_| Ruleset::empty()))).clone()
}

// The built-in ruleset is built before the first input: under the fuzzer's instrumentation
// that takes ~30 s, which would otherwise count as the first input's time (a timeout).
fuzz_target!(init: { let _ = rules(); }, |data: &[u8]| {
    let Some((&seed, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let rules = rules();
    let det = Arc::new(Detectors::default());
    let ctx = ScanContext::new("fuzz");
    let whole = rules.scan_with(text, &ctx, &det);
    let mut s = StreamScanner::new(rules, ctx, det);
    let (mut blocked, mut found) = (false, Vec::new());
    let step_len = usize::from(seed % 17) + 1;
    let mut start = 0;
    while start < text.len() {
        let mut end = (start + step_len).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let step = s.push(&text[start..end]);
        blocked |= step.action == Action::Block;
        found.extend(step.findings);
        start = end;
    }
    let step = s.finish();
    blocked |= step.action == Action::Block;
    found.extend(step.findings);
    Finding::sort(&mut found);
    let cut = whole.iter().filter(|f| f.action == Action::Block).map(|f| f.match_start).min();
    let expected: Vec<&Finding> = whole.iter().filter(|f| cut.is_none_or(|c| f.match_start <= c)).collect();
    let got: Vec<&Finding> = found.iter().filter(|f| cut.is_none_or(|c| f.match_start <= c)).collect();
    assert_eq!(got, expected);
    assert_eq!(blocked, cut.is_some());
});
