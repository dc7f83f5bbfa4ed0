//! The detectors inside a stream: n-gram findings agree with one-shot for any chunking and
//! no complete foreign n-gram is released; provenance blocks before the token's text.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{
    fingerprints, Action, Detectors, NgramConfig, NgramKey, ProvenanceConfig, ScanContext, StreamScanner, TokenSignals,
};
use proptest::prelude::*;

const KEY: NgramKey = NgramKey(*b"fedcba9876543210");
const SECRET_PROSE: &str = "the merger with initech closes on friday at noon sharp";

fn detectors(n: usize) -> Arc<Detectors> {
    let mut idx = Index::default();
    idx.record(fingerprints(SECRET_PROSE, &KEY, n), "globex");
    let ngram = NgramConfig { n, ..NgramConfig::new(KEY, Arc::new(idx)) };
    Arc::new(Detectors {
        ngram: Some(ngram),
        entropy: None,
        provenance: Some(ProvenanceConfig::default()),
        secrets: None,
        decode: None,
    })
}

#[test]
fn foreign_ngram_is_blocked_before_its_last_word() {
    let det = detectors(5);
    let text = "Sure. The Merger with Initech, closes on Friday! More later.";
    let s = stream(&fixture_rules(), &ScanContext::new("acme"), &det, text, &char_cuts(text));
    assert!(s.blocked);
    assert_eq!(s.findings.len(), 1);
    assert_eq!(s.findings[0].rule_id, "foreign-ngram");
    // "closes", the fifth word of the first foreign 5-gram, was never released.
    assert!(!s.released.contains("closes"), "{:?}", s.released);
    // With n > 4 the lead "the merger with initech" is foreign: held from its fourth word.
    assert_eq!(s.released, "Sure. The Merger with ");
    // The owner itself may see its own words.
    let own = stream(&fixture_rules(), &ScanContext::new("globex"), &det, text, &char_cuts(text));
    assert!(!own.blocked && own.released == text);
}

#[test]
fn provenance_blocks_before_the_token_is_taken_in() {
    let mut s = StreamScanner::new(fixture_rules(), ScanContext::new("acme"), detectors(5));
    let own = TokenSignals { owners: vec!["acme".into()], ..Default::default() };
    let mut out = s.push_token("Hello ", &own).release;
    let foreign = TokenSignals { owners: vec!["acme".into(), "globex".into()], ..Default::default() };
    let step = s.push_token("leak", &foreign);
    out += &step.release;
    assert_eq!(step.action, Action::Block);
    assert_eq!(step.findings[0].rule_id, "foreign-provenance");
    assert_eq!((step.findings[0].start, step.findings[0].end), (6, 10));
    out += &s.finish().release;
    assert_eq!(out, "Hello ");
}

fn ngram_text() -> impl Strategy<Value = String> {
    let words = prop::sample::select(vec![
        "the ",
        "merger ",
        "with ",
        "initech ",
        "closes ",
        "on ",
        "friday ",
        "at ",
        "noon ",
        "sharp ",
        "Merger, ",
        "\n",
        "and ",
        "FRIDAY! ",
        "hello ",
        "dbk_Q2w3E4r5T6y7U8i9O0pA ",
    ]);
    prop::collection::vec(words, 0..30).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn ngram_chunkings_agree_and_never_release_a_foreign_ngram(text in ngram_text(), seeds in prop::collection::vec(any::<usize>(), 0..20), n in 2usize..6) {
        let det = detectors(n);
        let ctx = ScanContext::new("acme");
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect();
        let mut cuts: Vec<usize> = if bounds.is_empty() { vec![] } else { seeds.iter().map(|s| bounds[s % bounds.len()]).collect() };
        cuts.sort_unstable();
        cuts.dedup();
        check_chunking(&fixture_rules(), &ctx, &det, &text, &cuts);
        check_chunking(&fixture_rules(), &ctx, &det, &text, &bounds);
        // No complete foreign n-gram in what was released.
        let s = stream(&fixture_rules(), &ctx, &det, &text, &cuts);
        let released_hits = fixture_rules().scan_with(&s.released, &ctx, &det);
        prop_assert!(released_hits.iter().all(|f| f.rule_id != "foreign-ngram" || f.end > s.released.trim_end().len()), "{:?}", s.released);
    }
}
