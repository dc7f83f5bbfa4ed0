//! The shipped ruleset loads, every rule carries samples, and placeholders stay quiet.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{Detectors, Ruleset, ScanContext};

#[allow(clippy::panic)] // the shipped rules not loading fails every test here
fn builtin() -> Arc<Ruleset> {
    static RULES: std::sync::OnceLock<Arc<Ruleset>> = std::sync::OnceLock::new();
    RULES
        .get_or_init(|| match Ruleset::builtin() {
            Ok(r) => Arc::new(r),
            Err(e) => panic!("built-in rules: {e}"),
        })
        .clone()
}

#[test]
fn builtin_loads_with_samples_on_every_rule() {
    let rules = builtin();
    for (r, o) in rules.rules().iter().zip(rules.origins()) {
        assert!(!r.must_match.is_empty(), "{}:{}: rule `{}` has no must_match sample", o.file, o.line, r.id);
        assert!(!r.must_not_match.is_empty(), "{}:{}: rule `{}` has no must_not_match sample", o.file, o.line, r.id);
    }
    let report = rules.run_samples();
    assert_eq!(report.failed(), 0);
}

#[test]
fn placeholders_do_not_match() {
    let rules = builtin();
    for p in ["AKIAIOSFODNN7EXAMPLE", "sk-...", "your-api-key-here", "api_key = \"your-api-key-here\"", "OPENAI_API_KEY=sk-..."] {
        let f = rules.scan(p);
        assert!(f.is_empty(), "{p:?} matched {:?}", f.iter().map(|f| &f.rule_id).collect::<Vec<_>>());
    }
}

#[test]
fn every_must_match_sample_streams_like_one_shot() {
    let rules = builtin();
    let det = Arc::new(Detectors::default());
    let ctx = ScanContext::new("acme");
    for r in rules.rules() {
        for s in &r.must_match {
            let text = format!("Here you go:\n{s}\nanything else?");
            check_chunking(&rules, &ctx, &det, &text, &char_cuts(&text));
            let thirds: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| i > 0 && i % 7 == 0).collect();
            check_chunking(&rules, &ctx, &det, &text, &thirds);
        }
    }
}
