//! The shipped ruleset loads, every rule carries samples, and placeholders stay quiet.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{Detectors, LoadOptions, RuleFiles, RuleSource, Ruleset, ScanContext};

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
    for p in [
        "AKIAIOSFODNN7EXAMPLE",
        "sk-...",
        "your-api-key-here",
        "api_key = \"your-api-key-here\"",
        "OPENAI_API_KEY=sk-...",
    ] {
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

/// The same with each sample as the whole response: a cut-off token (the `-partial` rules)
/// ends the stream, so its match is only complete at `finish`, and must still be found and
/// never released.
#[test]
fn every_must_match_sample_streams_like_one_shot_when_it_ends_the_text() {
    let rules = builtin();
    let det = Arc::new(Detectors::default());
    let ctx = ScanContext::new("acme");
    for r in rules.rules() {
        for s in &r.must_match {
            assert!(!rules.scan(s).is_empty(), "rule `{}`: {s:?} found nothing", r.id);
            check_chunking(&rules, &ctx, &det, s, &char_cuts(s));
        }
    }
}

/// Texts of the labelled corpus's records with planted secrets (configs and answers).
fn secret_records() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut out = Vec::new();
    for f in ["configs.jsonl", "answers.jsonl", "logs.jsonl"] {
        let body = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        for line in body.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            let planted = v.get("secrets").and_then(|s| s.as_array()).is_some_and(|a| !a.is_empty());
            if let (true, Some(t)) = (planted, v.get("text").and_then(|t| t.as_str())) {
                out.push(t.to_string());
            }
        }
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// The default rules on real secret-bearing records, cut at random: the stream reports
    /// exactly the one-shot findings (windowed one-shot against the stream's whole-text
    /// walk) and releases no blocked match.
    #[test]
    fn corpus_records_stream_like_one_shot_at_random_cuts(pick in proptest::prelude::any::<proptest::sample::Index>(), seeds in proptest::collection::vec(proptest::prelude::any::<usize>(), 1..60)) {
        let records = secret_records();
        proptest::prop_assert!(records.len() > 100, "corpus records missing");
        let text = &records[pick.index(records.len())];
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect();
        let mut cuts: Vec<usize> = seeds.iter().map(|s| bounds[s % bounds.len()]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        check_chunking(&builtin(), &ScanContext::new("acme"), &Arc::new(Detectors::default()), text, &cuts);
    }

    /// Any characters in the user part before a password the rules read against it
    /// (`allow_repeated_user`): scanning never panics, streams as it scans whole, and a
    /// password that repeats the name after a `+` stays exempt.
    #[test]
    fn any_user_name_before_a_url_password_scans(before in "\\PC{0,12}", name in "[a-z]{3,10}") {
        let rules = builtin();
        let text = format!("mysql://{before}+{name}:{name}rw@db/app and postgres://{before}:{before}1@db/x");
        let found = rules.scan(&text);
        let at = text.find(&format!(":{name}rw@")).map_or(0, |i| i + 1);
        proptest::prop_assert!(!found.iter().any(|f| f.start == at), "{text:?}: {found:?}");
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect();
        check_chunking(&rules, &ScanContext::new("acme"), &Arc::new(Detectors::default()), &text, &bounds);
    }
}

/// Every text a batch holds, each read alone and then all together (in batches of every
/// size from one text to all of them): the labelled corpus's records, every peer
/// scanner's sample, and texts that take the other paths (the rules view, encoded text,
/// canaries, nothing at all).
#[test]
fn a_batch_finds_in_each_text_what_scanning_it_alone_finds() {
    let mut texts = Vec::new();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for f in [
        "corpus/answers.jsonl",
        "corpus/code.jsonl",
        "corpus/configs.jsonl",
        "corpus/logs.jsonl",
        "corpus/prose.jsonl",
        "peers/tuning.jsonl",
    ] {
        let body = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        let records = body.lines().filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok());
        texts.extend(records.filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string)));
    }
    assert!(texts.len() > 1500, "{} texts", texts.len());
    let token = "ghp_8Xz2Qw7Lp4Vn9Rt3Ks6Jm1Hb5Cd0Fg2Ae4Yu";
    let full_width: String = token.chars().map(|c| char::from_u32(c as u32 + 0xFEE0).unwrap_or(c)).collect();
    texts.extend([
        String::new(),
        format!("in full-width forms: {full_width}"),
        format!("base64: {}", "Z2hwXzhYejJRdzdMcDRWbjlSdDNLczZKbTFIYjVDZDBGZzJBZTRZdQ=="),
        "canary GLOBEX-CANARY-51d0e2 leaked, and glbx-honeytoken-77aa too".into(),
        format!("{token} twice: {token}"),
    ]);
    let decode = Detectors { decode: Some(firewall::DecodeConfig::default()), ..Detectors::default() };
    // How many texts each ruleset finds something in, at least: the comparison has teeth.
    for (rules, least) in [(builtin(), 500), (fixture_rules(), 3)] {
        for detectors in [Detectors::default(), decode.clone()] {
            let ctx = ScanContext::anonymous();
            let alone: Vec<_> = texts.iter().map(|t| rules.scan_with(t, &ctx, &detectors)).collect();
            assert!(alone.iter().filter(|f| !f.is_empty()).count() >= least);
            for size in [1, 7, 256, texts.len()] {
                for (i, chunk) in texts.chunks(size).enumerate() {
                    let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
                    let together = rules.scan_batch_with(&refs, &ctx, &detectors);
                    assert_eq!(together.len(), chunk.len());
                    for (j, found) in together.iter().enumerate() {
                        assert_eq!(found, &alone[i * size + j], "batches of {size}: text {}", i * size + j);
                    }
                }
            }
        }
    }
}

/// `crossguard scan` loads the built-in rules with their regexes compiled on first use:
/// every one must compile then, and the findings must be those of the rules compiled at
/// load, text by text.
#[test]
fn built_in_rules_find_the_same_with_their_regexes_compiled_on_first_use() {
    let opts = LoadOptions { check_samples: false, defer_streaming: true, defer_regexes: true };
    let deferred = Ruleset::load(&RuleFiles::Builtin, &[], opts).map_err(|e| e.to_string());
    assert!(deferred.is_ok(), "{deferred:?}");
    let Ok(deferred) = deferred else { return };
    let eager = builtin();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut scanned = 0;
    for f in ["corpus/configs.jsonl", "corpus/code.jsonl", "peers/tuning.jsonl"] {
        let body = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        for text in body
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string))
        {
            assert_eq!(deferred.scan(&text), eager.scan(&text), "{text:?}");
            scanned += 1;
        }
    }
    assert!(scanned > 1_000, "{scanned} texts");
    for r in deferred.rules() {
        assert!(r.regex.get().is_some(), "{} does not compile", r.id);
    }
}

/// What deferring costs: a pattern past the size limit is refused at load, but a deferred
/// one loads and its rule finds nothing (no panic, no error at scan time). Why only rules
/// known to compile may be loaded so.
#[test]
fn a_deferred_regex_that_does_not_compile_finds_nothing() {
    let file = r#"
[[rule]]
id = "huge"
description = "too large to compile"
severity = "high"
action = "block"
regex = '''\bhuge_\w{4000}'''
keywords = ["huge_"]
must_match = ["x"]
must_not_match = ["y"]
"#;
    let sources = [RuleSource::new("huge.toml", file)];
    let opts = |defer_regexes| LoadOptions { check_samples: false, defer_streaming: true, defer_regexes };
    let eager = Ruleset::load_sources(&sources, opts(false)).map(|_| ()).map_err(|e| e.to_string());
    assert!(eager.as_ref().is_err_and(|e| e.contains("huge.toml") && e.contains("bad regex")), "{eager:?}");
    let deferred = Ruleset::load_sources(&sources, opts(true));
    assert!(deferred.as_ref().is_ok_and(|r| r.scan(&format!("huge_{}", "a".repeat(4000))).is_empty()));
}
