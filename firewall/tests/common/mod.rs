//! Shared helpers for the firewall's integration tests.
// A fixture that does not load fails the test: panicking is how tests fail.
#![allow(dead_code, clippy::panic)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use firewall::{
    secret_fingerprints, Action, DetectorKind, Detectors, Finding, NgramKey, NgramOwners, OwnerSet, Ruleset,
    ScanContext, SecretOwnership, StreamScanner,
};

/// The key the tests' ownership indexes hash with.
pub const HASH_KEY: NgramKey = NgramKey(*b"0123456789abcdef");

/// An in-memory ownership index: fingerprint -> owners.
#[derive(Default)]
pub struct Index(pub HashMap<u64, OwnerSet>);

impl NgramOwners for Index {
    fn owners(&self, hash: u64) -> OwnerSet {
        self.0.get(&hash).cloned().unwrap_or_default()
    }
}

impl Index {
    /// Records `tenant` as an owner of each fingerprint, as the gateway records what a
    /// tenant sends.
    pub fn record(&mut self, hashes: impl IntoIterator<Item = u64>, tenant: &str) {
        for h in hashes {
            let e = self.0.entry(h).or_default();
            if !e.tenants.iter().any(|t| t == tenant) {
                e.tenants.push(tenant.into());
            }
            e.shared_by = e.tenants.len();
        }
    }
}

/// Detectors whose secret-ownership index holds the secrets `rules` find in `tenant`'s
/// `prompt`, recorded as the gateway records a prompt.
pub fn secrets_owned_by(rules: &Ruleset, tenant: &str, prompt: &str) -> Arc<Detectors> {
    let mut idx = Index::default();
    idx.record(secret_fingerprints(rules, prompt, &HASH_KEY), tenant);
    Arc::new(Detectors {
        secrets: Some(SecretOwnership { key: HASH_KEY, owners: Arc::new(idx) }),
        ..Detectors::default()
    })
}

pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("fixtures")
}

/// The rules built into the binary, compiled once per test binary.
pub fn builtin() -> Arc<Ruleset> {
    static RULES: std::sync::OnceLock<Arc<Ruleset>> = std::sync::OnceLock::new();
    RULES
        .get_or_init(|| match Ruleset::builtin() {
            Ok(r) => Arc::new(r),
            Err(e) => panic!("built-in rules: {e}"),
        })
        .clone()
}

/// The fixture ruleset, compiled once per test binary.
pub fn fixture_rules() -> Arc<Ruleset> {
    static RULES: std::sync::OnceLock<Arc<Ruleset>> = std::sync::OnceLock::new();
    RULES
        .get_or_init(|| match Ruleset::load_dir(&fixtures()) {
            Ok(r) => Arc::new(r),
            Err(e) => panic!("fixture rules: {e}"),
        })
        .clone()
}

/// What a stream produced: released text, findings (canonical order), final action.
#[derive(Debug)]
pub struct Streamed {
    pub released: String,
    pub findings: Vec<Finding>,
    pub blocked: bool,
    pub max_held: usize,
}

/// Streams `text` cut at `cuts` (sorted byte offsets on char boundaries).
pub fn stream(rules: &Arc<Ruleset>, ctx: &ScanContext, det: &Arc<Detectors>, text: &str, cuts: &[usize]) -> Streamed {
    stream_through(StreamScanner::new(rules.clone(), ctx.clone(), det.clone()), text, cuts)
}

/// [`stream`] through a scanner set up otherwise (JSON mode, another holdback).
pub fn stream_through(mut s: StreamScanner, text: &str, cuts: &[usize]) -> Streamed {
    let mut out = Streamed { released: String::new(), findings: Vec::new(), blocked: false, max_held: 0 };
    let mut prev = 0;
    for &c in cuts.iter().chain(std::iter::once(&text.len())) {
        let step = s.push(&text[prev..c]);
        out.max_held = out.max_held.max(s.held_bytes());
        out.released.push_str(&step.release);
        out.findings.extend(step.findings);
        out.blocked |= step.action == Action::Block;
        prev = c;
    }
    let step = s.finish();
    out.released.push_str(&step.release);
    out.findings.extend(step.findings);
    out.blocked |= step.action == Action::Block;
    Finding::sort(&mut out.findings);
    out
}

/// Cuts every `size` bytes, less those that fall inside a character.
pub fn cuts_every(text: &str, size: usize) -> Vec<usize> {
    (size..text.len()).step_by(size).filter(|&c| text.is_char_boundary(c)).collect()
}

/// Every char boundary of `text` as a cut: one char per push.
pub fn char_cuts(text: &str) -> Vec<usize> {
    text.char_indices().map(|(i, _)| i).filter(|&i| i > 0).collect()
}

/// Where a block stops `text`: the start of the earliest block match.
pub fn block_cut(findings: &[Finding]) -> Option<usize> {
    findings.iter().filter(|f| f.action == Action::Block).map(|f| f.match_start).min()
}

/// The one-shot findings a stream must report: all of them, or up to the block.
pub fn expected_findings(findings: &[Finding]) -> Vec<Finding> {
    let cut = block_cut(findings).unwrap_or(usize::MAX);
    findings.iter().filter(|f| f.match_start <= cut).cloned().collect()
}

/// What the released text must be: the text with redactions applied, cut at the first
/// block match.
pub fn expected_release(text: &str, findings: &[Finding]) -> String {
    release_until(text, findings, block_cut(findings).unwrap_or(text.len()))
}

/// The text before `cut` with the redactions applied.
pub fn release_until(text: &str, findings: &[Finding], cut: usize) -> String {
    let mut out = String::new();
    let mut at = 0;
    for f in findings.iter().filter(|f| f.action == Action::Redact && f.start < cut) {
        if f.end <= at {
            continue;
        }
        // A redaction that ran past the cut released nothing after it.
        if at >= cut {
            break;
        }
        let a = f.start.max(at);
        out.push_str(&text[at..a]);
        out.push_str(&format!("[REDACTED:{}]", f.rule_id));
        at = f.end;
    }
    if at < cut {
        out.push_str(&text[at..cut]);
    }
    out
}

/// Checks `text` streamed a character at a time and in pieces of each of `sizes` bytes: each
/// chunking agrees with one-shot scanning ([`check_chunking`]), blocks, and releases no byte
/// of `marker` (what must never go out: a secret's start, its row).
pub fn check_blocks_in_every_chunking(
    rules: &Arc<Ruleset>,
    ctx: &ScanContext,
    det: &Arc<Detectors>,
    text: &str,
    sizes: &[usize],
    marker: &str,
) {
    check_chunking(rules, ctx, det, text, &char_cuts(text));
    for &size in sizes {
        let cuts = cuts_every(text, size);
        check_chunking(rules, ctx, det, text, &cuts);
        let s = stream(rules, ctx, det, text, &cuts);
        assert!(s.blocked && !s.released.contains(marker), "{size}: {:?}", s.released);
    }
}

/// Checks one chunking of `text` against one-shot scanning.
pub fn check_chunking(rules: &Arc<Ruleset>, ctx: &ScanContext, det: &Arc<Detectors>, text: &str, cuts: &[usize]) {
    let whole = rules.scan_with(text, ctx, det);
    let s = stream(rules, ctx, det, text, cuts);
    let cut = block_cut(&whole);
    let got: Vec<Finding> = s.findings.iter().filter(|f| cut.is_none_or(|c| f.match_start <= c)).cloned().collect();
    assert_eq!(got, expected_findings(&whole), "findings differ for cuts {cuts:?} of {text:?}");
    assert_eq!(s.blocked, cut.is_some(), "block state for cuts {cuts:?}");
    let first_block = whole.iter().filter(|f| f.action == Action::Block).min_by_key(|f| f.match_start);
    if let Some(f) = first_block.filter(|f| f.encoding.is_some()) {
        // Encoded text is judged when its run, list or groups end, which may be words past
        // the finding, so the stream may release less than one-shot scanning cuts at; and a
        // grouped run's first group goes out before the second shows it is one. Never the
        // whole finding.
        let m = &text[f.match_start..f.match_end];
        assert!(!s.released.contains(m), "released {:?} for cuts {cuts:?} of {text:?}", s.released);
        return;
    }
    if let Some(f) = first_block.filter(|f| f.kind == DetectorKind::Ngram) {
        // An n-gram is judged when its last word completes: earlier words may be out,
        // the last word never is.
        let mut last = f.end - 1;
        while !text.is_char_boundary(last) {
            last -= 1;
        }
        let upper = release_until(text, &whole, last);
        let lower = release_until(text, &whole, f.match_start);
        assert!(
            upper.starts_with(&s.released) && s.released.starts_with(&lower),
            "released {:?} for cuts {cuts:?} of {text:?}",
            s.released
        );
        return;
    }
    assert_eq!(s.released, expected_release(text, &whole), "released text for cuts {cuts:?} of {text:?}");
    // The release equals the text before the first block, so no blocked match is in it;
    // say so directly where the match text is unique.
    for f in whole.iter().filter(|f| f.action == Action::Block) {
        let m = &text[f.match_start..f.match_end];
        if text.matches(m).count() == 1 {
            assert!(!s.released.contains(m), "blocked match released for cuts {cuts:?}");
        }
    }
}
