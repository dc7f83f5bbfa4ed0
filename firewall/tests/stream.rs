//! Streaming agrees with one-shot scanning whatever the chunking, and never releases a
//! blocked match.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{Action, Detectors, LoadOptions, RuleSource, Ruleset, ScanContext, StreamScanner};
use proptest::prelude::*;

const KEY: &str = "dbk_Q2w3E4r5T6y7U8i9O0pA";

fn corpus() -> Vec<String> {
    vec![
        "Plain prose with nothing to find, just words and punctuation.".into(),
        format!("Here is the key you asked for: {KEY} — keep it safe."),
        "config:\n  db_password = 'S3cr3t!Pa55w0rd'\n  host: db.internal\n".into(),
        "Вот пароль: password=Xy9#kLm2$Vb7 и больше ничего.".into(),
        format!("blob:QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo= then {KEY}"),
        "canary GLOBEX-CANARY-51d0e2 leaked, and glbx-honeytoken-77aa too".into(),
        "password = short; dbk_EXAMPLEexampleEXAMPLE is a placeholder".into(),
        "a_password: 'first-Secret-99' b_password: 'second-Secret-77'".into(),
        format!("{KEY}"),
        "blob:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA".into(),
        // `allow_line`: the line before the key exempts it within the lookback, not beyond.
        format!("sandbox key: {KEY} and again {KEY}\nprod key: {KEY}"),
        format!("sandbox {} {KEY}", "ж".repeat(60)),
        format!("sandbox {} {KEY}", "ж".repeat(62)),
        format!("sandbox {} {KEY}", "a".repeat(120)),
        format!("sandbox {} {KEY}", "a".repeat(121)),
        // Disguises: the rules view finds what the raw text hides.
        "раѕѕword = 'S3cr3t!Pa55w0rd' and ｄｂｋ_Ｑ2w3E4r5T6y7U8i9O0pA".into(),
        "key: d\u{200B}bk_Q2w3E4r5T6y7U8i9O0pA\u{AD} and рос".into(),
        "canary glоbex-canary-51D0E2 leaked, ＧＬＯＢＥＸ-CANARY-51d0e2 too".into(),
        format!("sandbox\u{200B} {KEY} and ѕandbox {KEY}"),
    ]
}

fn ctx() -> ScanContext {
    ScanContext::new("acme")
}

fn none() -> Arc<Detectors> {
    Arc::new(Detectors::default())
}

#[test]
fn whole_one_byte_and_every_split_point() {
    let rules = fixture_rules();
    for text in corpus() {
        check_chunking(&rules, &ctx(), &none(), &text, &[]);
        check_chunking(&rules, &ctx(), &none(), &text, &char_cuts(&text));
        for (i, _) in text.char_indices().skip(1) {
            check_chunking(&rules, &ctx(), &none(), &text, &[i]);
        }
    }
}

#[test]
fn secret_split_across_forty_chunks_is_blocked_before_release() {
    let rules = fixture_rules();
    let text = format!("Sure! The key is {KEY}. Use it wisely.");
    let start = text.find(KEY).unwrap_or(0);
    // 40 cuts spread through the key and its surroundings.
    let cuts: Vec<usize> = (0..40).map(|i| start - 10 + i).collect();
    let s = stream(&rules, &ctx(), &none(), &text, &cuts);
    assert!(s.blocked);
    assert_eq!(s.released, &text[..start]);
    assert_eq!(s.findings.len(), 1);
    assert_eq!((s.findings[0].start, s.findings[0].end), (start, start + KEY.len()));
    assert!(!s.findings[0].excerpt.contains("Q2w3E4"));
}

#[test]
fn redaction_replaces_only_the_secret_group() {
    let rules = fixture_rules();
    let s = stream(&rules, &ctx(), &none(), "db_password = 'S3cr3t!Pa55w0rd' ok", &[5, 17, 20]);
    assert_eq!(s.released, "db_password = '[REDACTED:demo-redact-password]' ok");
    assert!(!s.blocked);
}

#[test]
fn canaries_are_foreign_only_to_other_tenants() {
    let rules = fixture_rules();
    let text = "x GLOBEX-CANARY-51d0e2 y";
    let mine = stream(&rules, &ScanContext::new("globex"), &none(), text, &char_cuts(text));
    assert!(mine.findings.is_empty() && mine.released == text);
    let theirs = stream(&rules, &ctx(), &none(), text, &char_cuts(text));
    assert!(theirs.blocked && theirs.released == "x ");
}

#[test]
fn clean_prose_is_released_at_once_except_the_word_in_progress() {
    let rules = fixture_rules();
    let mut s = StreamScanner::new(rules, ctx(), none());
    let step = s.push("The weather is nice tod");
    assert_eq!(step.action, Action::Allow);
    assert!(s.held_bytes() <= 3, "held {}", s.held_bytes());
    let step = s.push("ay. ");
    assert!(step.release.ends_with("ay. ") || s.held_bytes() <= 1, "{step:?}");
}

#[test]
fn holdback_is_bounded() {
    let rules = fixture_rules();
    let mut s = StreamScanner::new(rules, ctx(), none()).with_max_holdback(256);
    s.push("blob:");
    for _ in 0..100 {
        s.push("QUJDREVGR0hJSktMTU5PUFFSU1RV");
        assert!(s.held_bytes() <= 256 + 28);
    }
    let end = s.finish();
    assert!(end.findings.iter().all(|f| f.rule_id == "demo-log-long"));
}

#[test]
fn after_a_block_nothing_more_is_released() {
    let rules = fixture_rules();
    let mut s = StreamScanner::new(rules, ctx(), none());
    let step = s.push(&format!("k {KEY} "));
    assert_eq!(step.action, Action::Block);
    assert_eq!(step.release, "k ");
    assert_eq!(s.push("more text").release, "");
    assert_eq!(s.finish().action, Action::Block);
}

fn planted_text() -> impl Strategy<Value = String> {
    let pieces = prop::sample::select(vec![
        "hello ",
        "world. ",
        "Привет, мир! ",
        "password",
        " = ",
        "'S3cr3t!Pa55w0rd' ",
        KEY,
        " ",
        "dbk_",
        "blob:",
        "QUJDREVGR0hJSktMTU5PUFFSU1RV",
        "GLOBEX-CANARY-51d0e2",
        "\n",
        "x",
        "_",
        "token ",
        "EXAMPLE",
        "sandbox ",
        "filler filler filler filler filler filler filler ",
        // Disguised and non-ASCII pieces: look-alikes, full-width forms, invisible characters.
        "раѕѕ",
        "ｄｂｋ_",
        "\u{200B}",
        "\u{AD}",
        "ＡＫ",
        "а",
        "рос ",
        "Ｑ2w3E4r5T6y7U8i9O0pA",
        "glоbex-canary-51d0e2",
        "\u{202E}",
    ]);
    prop::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
}

fn cuts_for(text: &str, seeds: &[usize]) -> Vec<usize> {
    let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect();
    if bounds.is_empty() {
        return vec![];
    }
    let mut cuts: Vec<usize> = seeds.iter().map(|s| bounds[s % bounds.len()]).collect();
    cuts.sort_unstable();
    cuts.dedup();
    cuts
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_chunkings_agree_with_one_shot(text in planted_text(), seeds in prop::collection::vec(any::<usize>(), 0..40)) {
        let rules = fixture_rules();
        let cuts = cuts_for(&text, &seeds);
        check_chunking(&rules, &ctx(), &none(), &text, &cuts);
    }

    #[test]
    fn one_byte_chunks_agree_with_one_shot(text in planted_text()) {
        let rules = fixture_rules();
        check_chunking(&rules, &ctx(), &none(), &text, &char_cuts(&text));
    }
}

/// A rule whose streaming automaton blows past the size limit: after "key", the 16th
/// character from the end must be `a` (2^16 DFA states), while its NFA stays small.
const EXPLODING_RULE: &str = r#"
[[rule]]
id = "exploding-automaton"
description = "streaming automaton too large to determinise"
severity = "high"
action = "block"
regex = 'key[a-z]*a[a-z]{16}'
keywords = ["key"]
must_match = ["keyaaaaaaaaaaaaaaaaa"]
must_not_match = ["keybbbbbbbbbbbbbbbbb"]
"#;

#[test]
fn deferred_automata_are_checked_only_when_eager() {
    let sources = [RuleSource::new("exploding.toml", EXPLODING_RULE)];
    let eager = Ruleset::load_sources(&sources, LoadOptions::default());
    let reason = eager.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(reason.contains("exploding-automaton") && reason.contains("streaming automaton"), "{reason}");
    let deferred = Ruleset::load_sources(&sources, LoadOptions { defer_streaming: true, ..LoadOptions::default() });
    assert!(deferred.is_ok_and(|r| r.scan("the keyzzzzzzazzzzzzzzzzzzzzzz").len() == 1));
}

#[test]
fn a_pattern_without_an_automaton_streams_held_back_but_exact() {
    let sources = [RuleSource::new("exploding.toml", EXPLODING_RULE)];
    let loaded = Ruleset::load_sources(&sources, LoadOptions { defer_streaming: true, ..LoadOptions::default() });
    assert!(loaded.is_ok(), "deferred load failed: {loaded:?}");
    let Ok(rules) = loaded else { return };
    let rules = Arc::new(rules);
    let text = "some words, then keyqqqqqqqqqqqqqqqqqqqqaqqqqqqqqqqqqqqqq and more words after it";
    assert_eq!(rules.scan(text).len(), 1);
    check_chunking(&rules, &ctx(), &none(), text, &[]);
    check_chunking(&rules, &ctx(), &none(), text, &char_cuts(text));
    for (i, _) in text.char_indices().skip(1) {
        check_chunking(&rules, &ctx(), &none(), text, &[i]);
    }
}
