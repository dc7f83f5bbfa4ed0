//! Foreign n-gram detector: does this response repeat word sequences another tenant sent
//! or received?
//!
//! Normalisation (shared by recording and checking, through [`fingerprints`]): words are
//! maximal runs of non-whitespace; each is lowercased and stripped of every character that
//! is not alphanumeric; words that become empty are skipped; a run longer than
//! [`MAX_WORD_BYTES`] is cut into pieces of at most that size (so one endless token cannot
//! force unbounded holdback). Each window of `n` consecutive words is hashed with
//! SipHash-1-3 under a per-deployment 128-bit key; only these keyed hashes ever leave the
//! firewall.
//!
//! Streaming invariant: a word is complete only when whitespace (or the end) follows it, and
//! the n-gram ending with it is checked at that moment. The stream holds back the word in
//! progress, so a foreign n-gram is found before its last word is released.

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::Arc;

use siphasher::sip::SipHasher13;

use crate::detect::ScanContext;
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Rule id of n-gram findings.
pub const RULE_ID: &str = "foreign-ngram";

/// Default window, in words. Measured with `examples/ngram_n.rs` over 259 crate READMEs
/// (one per crate, treated as 259 tenants): the share of a document's n-grams that also
/// occur in one or two other documents (what would alarm after the `common_at` filter)
/// falls from 7.2% (n=3) to 4.0% (n=5) and 3.3% (n=8), then flattens (3.0% at n=12): what
/// remains is copied boilerplate, not chance. 8 words sits past the knee while a leak of a
/// single short sentence is still caught.
pub const DEFAULT_N: usize = 8;

/// Longest word piece, in bytes; longer runs are cut.
pub const MAX_WORD_BYTES: usize = 64;

/// The per-deployment SipHash key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NgramKey(pub [u8; 16]);

impl std::fmt::Debug for NgramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NgramKey(..)")
    }
}

/// Who owns an n-gram: the tenants known to have sent or received it (possibly truncated)
/// and how many tenants share it in all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnerSet {
    pub tenants: Vec<String>,
    pub shared_by: usize,
    /// The model produced this text for a tenant before anyone sent it: it is the model's
    /// own phrasing, never a leak, whoever sends it later.
    pub model_native: bool,
}

/// Implemented by the gateway's provenance index; must answer from memory.
pub trait NgramOwners: Send + Sync {
    fn owners(&self, hash: u64) -> OwnerSet;
}

#[derive(Clone)]
pub struct NgramConfig {
    /// Words per n-gram.
    pub n: usize,
    pub key: NgramKey,
    /// An n-gram shared by at least this many tenants is common language, not a leak.
    pub common_at: usize,
    pub action: Action,
    pub severity: Severity,
    pub owners: Arc<dyn NgramOwners>,
}

impl NgramConfig {
    pub fn new(key: NgramKey, owners: Arc<dyn NgramOwners>) -> NgramConfig {
        NgramConfig { n: DEFAULT_N, key, common_at: 3, action: Action::Block, severity: Severity::High, owners }
    }
}

/// A normalised word and the byte span of its raw text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Word {
    pub norm: String,
    pub start: usize,
    pub end: usize,
}

/// Incremental word splitter; feeding a text in any pieces emits the same words.
#[derive(Debug, Default)]
pub(crate) struct WordSplitter {
    norm: String,
    start: Option<usize>,
    raw_len: usize,
}

impl WordSplitter {
    pub(crate) fn feed(&mut self, text: &str, base: usize, emit: &mut impl FnMut(Word)) {
        for (i, c) in text.char_indices() {
            let pos = base + i;
            if c.is_whitespace() {
                self.flush(pos, emit);
                continue;
            }
            if self.raw_len + c.len_utf8() > MAX_WORD_BYTES {
                self.flush(pos, emit);
            }
            self.start.get_or_insert(pos);
            self.raw_len += c.len_utf8();
            if c.is_alphanumeric() {
                self.norm.extend(c.to_lowercase());
            }
        }
    }

    pub(crate) fn finish(&mut self, end: usize, emit: &mut impl FnMut(Word)) {
        self.flush(end, emit);
    }

    /// Start of the word in progress, if any.
    pub(crate) fn pending_start(&self) -> Option<usize> {
        self.start
    }

    fn flush(&mut self, end: usize, emit: &mut impl FnMut(Word)) {
        if let Some(start) = self.start.take() {
            if !self.norm.is_empty() {
                emit(Word { norm: std::mem::take(&mut self.norm), start, end });
            }
        }
        self.norm.clear();
        self.raw_len = 0;
    }
}

fn hash_words<'a>(key: &NgramKey, words: impl Iterator<Item = &'a Word>) -> u64 {
    let mut h = SipHasher13::new_with_key(&key.0);
    for w in words {
        h.write(w.norm.as_bytes());
        // 0xff never occurs in UTF-8: an unambiguous separator.
        h.write_u8(0xff);
    }
    h.finish()
}

/// The keyed fingerprints of every n-word window of `text` (none if it has fewer words).
/// The gateway records prompts with this, so recording and checking share one normaliser.
pub fn fingerprints(text: &str, key: &NgramKey, n: usize) -> Vec<u64> {
    let mut out = Vec::new();
    let mut window: VecDeque<Word> = VecDeque::new();
    let mut on_word = |w: Word| {
        window.push_back(w);
        if window.len() > n {
            window.pop_front();
        }
        if n > 0 && window.len() == n {
            out.push(hash_words(key, window.iter()));
        }
    };
    let mut split = WordSplitter::default();
    split.feed(text, 0, &mut on_word);
    split.finish(text.len(), &mut on_word);
    out
}

/// Per-stream state: the splitter and the last `n` words.
#[derive(Debug)]
pub(crate) struct NgramState {
    split: WordSplitter,
    // the last n complete words, oldest first
    window: VecDeque<Word>,
    n: usize,
}

impl NgramState {
    pub(crate) fn new(n: usize) -> NgramState {
        NgramState { split: WordSplitter::default(), window: VecDeque::new(), n }
    }

    pub(crate) fn feed(&mut self, cfg: &NgramConfig, ctx: &ScanContext, text: &str, base: usize, out: &mut Vec<Finding>) {
        let (window, n) = (&mut self.window, self.n);
        self.split.feed(text, base, &mut |w| on_word(window, n, cfg, ctx, w, out));
    }

    pub(crate) fn finish(&mut self, cfg: &NgramConfig, ctx: &ScanContext, end: usize, out: &mut Vec<Finding>) {
        let (window, n) = (&mut self.window, self.n);
        self.split.finish(end, &mut |w| on_word(window, n, cfg, ctx, w, out));
    }

    /// Where the held-back word in progress starts.
    pub(crate) fn hold_from(&self) -> Option<usize> {
        self.split.pending_start()
    }
}

fn on_word(window: &mut VecDeque<Word>, n: usize, cfg: &NgramConfig, ctx: &ScanContext, w: Word, out: &mut Vec<Finding>) {
    window.push_back(w);
    if window.len() > n {
        window.pop_front();
    }
    if n == 0 || window.len() < n {
        return;
    }
    let owners = cfg.owners.owners(hash_words(&cfg.key, window.iter()));
    let mine = owners.tenants.iter().any(|t| !ctx.is_foreign(t));
    let foreign: Vec<String> = owners.tenants.iter().filter(|t| ctx.is_foreign(t)).cloned().collect();
    if foreign.is_empty() || mine || owners.model_native || owners.shared_by >= cfg.common_at {
        return;
    }
    let (start, end) = (window.front().map_or(0, |w| w.start), window.back().map_or(0, |w| w.end));
    let text: Vec<&str> = window.iter().map(|w| w.norm.as_str()).collect();
    out.push(Finding {
        rule_id: RULE_ID.into(),
        start,
        end,
        match_start: start,
        match_end: end,
        severity: cfg.severity,
        action: cfg.action,
        excerpt: mask(&text.join(" ")),
        kind: DetectorKind::Ngram,
        detail: Detail::Foreign { owners: foreign, shared_by: owners.shared_by },
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An in-memory owner index for tests.
    #[derive(Default)]
    pub(crate) struct MapOwners(pub HashMap<u64, OwnerSet>);

    impl NgramOwners for MapOwners {
        fn owners(&self, hash: u64) -> OwnerSet {
            self.0.get(&hash).cloned().unwrap_or_default()
        }
    }

    pub(crate) const KEY: NgramKey = NgramKey(*b"0123456789abcdef");

    /// Records `text` as owned by `tenant` (shared by `shared_by` tenants).
    pub(crate) fn record(map: &mut MapOwners, text: &str, n: usize, tenant: &str, shared_by: usize) {
        for h in fingerprints(text, &KEY, n) {
            let e = map.0.entry(h).or_default();
            e.tenants.push(tenant.into());
            e.shared_by = shared_by;
        }
    }

    #[test]
    fn normalisation_ignores_case_punctuation_and_spacing() {
        let a = fingerprints("The quick, brown FOX jumps!", &KEY, 3);
        let b = fingerprints("the   quick brown\n fox -- jumps", &KEY, 3);
        assert_eq!(a, b);
        assert_eq!(a.len(), 3);
        assert!(fingerprints("two words", &KEY, 3).is_empty());
        assert_ne!(fingerprints("a b c", &NgramKey([7; 16]), 3), fingerprints("a b c", &KEY, 3));
    }

    #[test]
    fn long_runs_are_cut() {
        let long = "x".repeat(150);
        let mut words = Vec::new();
        let mut s = WordSplitter::default();
        s.feed(&long, 0, &mut |w| words.push(w));
        s.finish(150, &mut |w| words.push(w));
        assert_eq!(words.iter().map(|w| (w.start, w.end)).collect::<Vec<_>>(), [(0, 64), (64, 128), (128, 150)]);
    }

    #[test]
    fn foreign_only_when_not_mine_and_not_common() {
        let mut map = MapOwners::default();
        record(&mut map, "alpha beta gamma delta", 3, "globex", 1);
        record(&mut map, "one two three", 3, "globex", 1);
        record(&mut map, "one two three", 3, "acme", 2);
        record(&mut map, "red green blue", 3, "initech", 5);
        let cfg = NgramConfig { n: 3, ..NgramConfig::new(KEY, Arc::new(map)) };
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let text = "so: Alpha beta GAMMA! one two three red green blue";
        let mut st = NgramState::new(3);
        st.feed(&cfg, &ctx, text, 0, &mut out);
        st.finish(&cfg, &ctx, text.len(), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].start, out[0].end), (4, 21));
        assert!(matches!(&out[0].detail, Detail::Foreign { owners, .. } if owners == &["globex"]));
    }

    #[test]
    fn model_native_text_is_never_foreign() {
        let mut map = MapOwners::default();
        record(&mut map, "alpha beta gamma", 3, "globex", 1);
        for h in fingerprints("alpha beta gamma", &KEY, 3) {
            map.0.entry(h).or_default().model_native = true;
        }
        let cfg = NgramConfig { n: 3, ..NgramConfig::new(KEY, Arc::new(map)) };
        let mut out = Vec::new();
        let mut st = NgramState::new(3);
        st.feed(&cfg, &ScanContext::new("acme"), "alpha beta gamma", 0, &mut out);
        st.finish(&cfg, &ScanContext::new("acme"), 16, &mut out);
        assert!(out.is_empty(), "{out:?}");
    }
}
