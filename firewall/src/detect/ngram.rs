//! Foreign n-gram detector: does this response repeat word sequences another tenant sent
//! or received?
//!
//! Normalisation (shared by recording and checking, through [`fingerprints`]): the text is
//! read in the words view (see `canon`: NFKC, invisible characters removed, every confusable
//! folded to its ASCII prototype); words are maximal runs between whitespace, `_ - . / \`
//! and JSON-style escapes written out (`\n`, `\"`, `\u00e9`...; in JSON mode the decoder has
//! turned real escapes into characters already, and JSON syntax outside strings separates
//! words too); each word is lowercased and stripped of every character that is not
//! alphanumeric; words that become empty are skipped; a run is cut into pieces of
//! [`MAX_WORD_BYTES`] normalised bytes, or fewer where they take more than
//! [`MAX_WORD_RAW_BYTES`] raw ones (so one endless token cannot force unbounded holdback).
//! Counting what the word reads as, not its raw bytes, cuts a token the same wherever its
//! characters take more bytes than they read as: full-width forms, tag characters,
//! invisible characters between its letters.
//! Each window of `n` consecutive words is hashed with SipHash-1-3 under a per-deployment
//! 128-bit key; only these keyed hashes ever leave the firewall.
//!
//! Leads: when `n` > [`LEAD_WORDS`], [`fingerprints`] also emits a hash of every window of
//! [`LEAD_WORDS`] words, domain-separated from the n-gram hashes, so the index records them
//! with the n-grams. A stream whose last [`LEAD_WORDS`] words form a foreign lead holds its
//! text back from the start of the lead's last word, until the n-gram starting with the
//! lead completes (a foreign one blocks) or the run stops following recorded text (some
//! later window of [`LEAD_WORDS`] words inside that n-gram is unknown to the index). So at
//! most `LEAD_WORDS - 1` words of another tenant's sentence reach a client before a block.
//!
//! Tokens: a word that looks random on its own ([`is_token`]: an internal id, a session
//! token, a key of a provider no rule knows) is fingerprinted by itself too, and a response
//! word that is another tenant's token is a `foreign-token` finding, however few words of
//! context came with it. A secret needs no rule, no keyword and no eight words around it to
//! be its owner's.
//!
//! Readings ([`NgramConfig::rewrites`]): the response's words are also read undoing each
//! rewriting of `rewrite` (backwards: the window from its last word, each word reversed;
//! ROT13, Atbash, Caesar's cipher), with leads followed per reading. Recording stays plain; a window undone is
//! looked up with the plain hashes. A rewritten 8-word window is looked up only once its
//! last 4 words undone are a recorded lead, and only when half its words hold three letters
//! (numbers and single letters rewritten are other numbers and letters, not a disguise).
//!
//! Streaming invariant: a word is complete only when a boundary (or the end) follows it, and
//! the n-gram ending with it (and the word itself, when it is a token) is checked at that
//! moment. The stream holds back the word in progress, so a foreign n-gram or token is found
//! before its last word is released.

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::Arc;

use siphasher::sip::SipHasher13;

use crate::canon::{decode_plain, with_word_fold, words_fold, Decoded, Kind, WordFold};
use crate::detect::rewrite::Rewrite;
use crate::detect::ScanContext;
use crate::rules::rule::shannon_entropy;
use crate::scan::judge::Judge;
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Rule id of n-gram findings.
pub const RULE_ID: &str = "foreign-ngram";

/// Rule id of single-token findings (see `is_token`).
pub const TOKEN_RULE_ID: &str = "foreign-token";

/// Fewest characters of a token's normalised word.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Default window, in words. Measured with `examples/ngram_n.rs` over 259 crate READMEs
/// (one per crate, treated as 259 tenants): the share of a document's n-grams that also
/// occur in one or two other documents (what would alarm after the `common_at` filter)
/// falls from 7.2% (n=3) to 4.0% (n=5) and 3.3% (n=8), then flattens (3.0% at n=12): what
/// remains is copied boilerplate, not chance. 8 words sits past the knee while a leak of a
/// single short sentence is still caught.
pub const DEFAULT_N: usize = 8;

/// Longest word piece, in normalised bytes; longer runs are cut.
pub const MAX_WORD_BYTES: usize = 64;

/// Most raw bytes of one word piece: four times [`MAX_WORD_BYTES`], room for a piece whose
/// every character is four bytes (tag characters) or three bytes and an invisible one.
pub const MAX_WORD_RAW_BYTES: usize = 4 * MAX_WORD_BYTES;

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
    /// The model produced this text before any tenant sent it (the gateway marks it): it is
    /// never foreign.
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
    /// Whether token words (`is_token`) are checked one by one (`foreign-token`).
    pub tokens: bool,
    /// Whether n-grams and tokens are also read undoing each rewriting (backwards, ROT13,
    /// Atbash, Caesar's cipher; see `rewrite`).
    pub rewrites: bool,
}

impl NgramConfig {
    pub fn new(key: NgramKey, owners: Arc<dyn NgramOwners>) -> NgramConfig {
        NgramConfig {
            n: DEFAULT_N,
            key,
            common_at: 3,
            action: Action::Block,
            severity: Severity::High,
            owners,
            tokens: true,
            rewrites: true,
        }
    }
}

/// A normalised word and the byte span of its raw text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Word {
    pub norm: String,
    /// `norm` undone by each of [`Rewrite::ALL`] in turn (each as long as `norm`), when the
    /// n-gram check reads rewritings: worked out once per word rather than once per window.
    pub undone: String,
    /// Whether `norm` holds three letters or more (worked out with `undone`).
    pub worded: bool,
    pub start: usize,
    pub end: usize,
}

impl Word {
    /// The word read as written (`undo` None) or with a rewriting undone.
    fn read(&self, undo: Option<Rewrite>) -> &[u8] {
        let n = self.norm.len();
        let read = match undo.and_then(|u| Rewrite::ALL.iter().position(|&r| r == u)) {
            None => Some(self.norm.as_bytes()),
            Some(i) => self.undone.as_bytes().get(i * n..(i + 1) * n),
        };
        debug_assert!(read.is_some(), "a rewriting read before it was worked out");
        read.unwrap_or_default()
    }

    fn work_out_rewritings(&mut self) {
        if self.undone.is_empty() {
            self.undone.reserve(Rewrite::ALL.len() * self.norm.len());
            for r in Rewrite::ALL {
                r.push_undone(&self.norm, &mut self.undone);
            }
            self.worded = self.norm.chars().filter(|c| c.is_alphabetic()).nth(2).is_some();
        }
    }
}

/// Whether the last `k` words of `window` are read rewritten too: at least half of them hold
/// three letters or more. Numbers and single letters rewritten are numbers and letters
/// again: one changelog's `1.0.2 … 1.0.1 … 1.0` backwards is another's `0.1 … 1.0.1 … 2.0.1`,
/// `a b c d e f g h` in ROT13 is `n o p q r s t u`, and regexes (`\d\d`), chess boards and
/// lists of letters in tests (measured with `examples/rewrite_alarms.rs`) would make every
/// such list foreign somewhere. A word of three letters rewritten is rarely a word.
fn rewritten_readable(window: &VecDeque<Word>, k: usize) -> bool {
    2 * window.iter().rev().take(k).filter(|w| w.worded).count() >= k
}

/// Where the splitter is inside an escape written out in the text.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Escape {
    #[default]
    None,
    /// after `\`
    Backslash,
    /// after `\u` at raw offset `at` and `digits` hex digits (kept in `hex`)
    Unicode { at: usize, digits: u8 },
}

/// Incremental word splitter over decoded characters; feeding a text in any pieces emits
/// the same words.
#[derive(Debug, Default)]
pub(crate) struct WordSplitter {
    norm: String,
    start: Option<usize>,
    raw_len: usize,
    escape: Escape,
    hex: String,
}

impl WordSplitter {
    pub(crate) fn feed_char(&mut self, d: Decoded, emit: &mut impl FnMut(Word)) {
        if d.kind == Kind::Syntax {
            self.escape_ends();
            return self.flush(d.start, emit);
        }
        let len = d.end - d.start;
        if self.full(len) {
            self.flush(d.start, emit);
        }
        if self.escape != Escape::None || d.c == '\\' {
            words_fold(d.c, |f| self.folded(f, d.start, emit));
        } else if d.c.is_ascii() {
            self.ascii(d.c as u8, d.start, emit);
        } else {
            with_word_fold(d.c, |w| match w {
                WordFold::Removed => {}
                WordFold::Boundary => self.flush(d.start, emit),
                WordFold::Skip => {
                    self.start.get_or_insert(d.start);
                }
                WordFold::Letters(s) => {
                    self.start.get_or_insert(d.start);
                    self.norm.push_str(s);
                }
                WordFold::Mixed => words_fold(d.c, |f| self.folded(f, d.start, emit)),
            });
        }
        if self.start.is_some() {
            self.raw_len += len;
        }
    }

    /// Feeds plain ASCII text at raw offset `at`: what [`WordSplitter::feed_char`] does, one
    /// byte at a time without the fold (most of what a model writes).
    pub(crate) fn feed_ascii(&mut self, text: &str, at: usize, emit: &mut impl FnMut(Word)) {
        for (i, &b) in text.as_bytes().iter().enumerate() {
            let pos = at + i;
            if self.escape != Escape::None || b == b'\\' {
                self.feed_char(Decoded { c: char::from(b), start: pos, end: pos + 1, kind: Kind::Text }, emit);
                continue;
            }
            if self.full(1) {
                self.flush(pos, emit);
            }
            self.ascii(b, pos, emit);
            if self.start.is_some() {
                self.raw_len += 1;
            }
        }
    }

    /// Whether the word in progress is a whole piece before a character of `len` raw bytes.
    fn full(&self, len: usize) -> bool {
        self.start.is_some() && (self.norm.len() >= MAX_WORD_BYTES || self.raw_len + len > MAX_WORD_RAW_BYTES)
    }

    /// An ASCII character outside any escape.
    fn ascii(&mut self, b: u8, pos: usize, emit: &mut impl FnMut(Word)) {
        if b.is_ascii_whitespace() || b == 0x0B || matches!(b, b'_' | b'-' | b'.' | b'/') {
            self.flush(pos, emit);
        } else {
            self.start.get_or_insert(pos);
            if b.is_ascii_alphanumeric() {
                self.norm.push(char::from(b.to_ascii_lowercase()));
            }
        }
    }

    /// One character of the words view, from the decoded character at raw offset `pos`.
    fn folded(&mut self, f: char, pos: usize, emit: &mut impl FnMut(Word)) {
        match self.escape {
            Escape::Backslash => {
                self.escape = Escape::None;
                match f {
                    'n' | 't' | 'r' | 'b' | 'f' | '"' | '\\' | '/' => return,
                    'u' => {
                        self.escape = Escape::Unicode { at: pos, digits: 0 };
                        self.hex.clear();
                        return;
                    }
                    _ => {}
                }
            }
            Escape::Unicode { at, digits } if f.is_ascii_hexdigit() && digits < 4 => {
                self.hex.push(f.to_ascii_lowercase());
                self.escape = if digits == 3 { Escape::None } else { Escape::Unicode { at, digits: digits + 1 } };
                return;
            }
            Escape::Unicode { .. } => self.escape_ends(),
            Escape::None => {}
        }
        if f == '\\' {
            self.flush(pos, emit);
            self.escape = Escape::Backslash;
        } else if f.is_whitespace() || matches!(f, '_' | '-' | '.' | '/') {
            self.flush(pos, emit);
        } else {
            self.start.get_or_insert(pos);
            if f.is_alphanumeric() {
                self.norm.extend(f.to_lowercase());
            }
        }
    }

    /// A `\u` not followed by four hex digits was text: its `u` and digits start a word.
    fn escape_ends(&mut self) {
        if let Escape::Unicode { at, .. } = std::mem::take(&mut self.escape) {
            self.start.get_or_insert(at);
            self.norm.push('u');
            self.norm.push_str(&self.hex);
            self.hex.clear();
        }
    }

    pub(crate) fn finish(&mut self, end: usize, emit: &mut impl FnMut(Word)) {
        self.escape_ends();
        self.flush(end, emit);
    }

    /// Start of the word in progress, if any.
    pub(crate) fn pending_start(&self) -> Option<usize> {
        match self.escape {
            Escape::Unicode { at, .. } => Some(self.start.map_or(at, |s| s.min(at))),
            _ => self.start,
        }
    }

    fn flush(&mut self, end: usize, emit: &mut impl FnMut(Word)) {
        if let Some(start) = self.start.take() {
            if !self.norm.is_empty() {
                emit(Word { norm: std::mem::take(&mut self.norm), undone: String::new(), worded: false, start, end });
            }
        }
        self.norm.clear();
        self.raw_len = 0;
    }
}

/// Words per lead window.
pub const LEAD_WORDS: usize = 4;

/// First byte hashed for a lead; 0xfe never occurs in UTF-8, so no n-gram hash (whose
/// input starts with a word) shares an input with a lead.
const LEAD_DOMAIN: u8 = 0xfe;

/// First byte hashed for a token (0xfc never occurs in UTF-8; secret values use 0xfd, leads
/// 0xfe).
const TOKEN_DOMAIN: u8 = 0xfc;

/// Whether a normalised word (lowercase letters and digits) looks random enough to be a
/// secret by itself: at least [`MIN_TOKEN_CHARS`] ASCII characters, at least three digits
/// and two letters, at least four changes between the two and at least 3 bits of entropy
/// per character, and letters that do not read as English. Random strings of that length
/// over letters and digits mostly pass (hex digests, base62 keys, lowercased base64); words
/// fail for want of digits, identifiers with a number or two (`base64encodedstring123`,
/// `version2release3build`, `utf8mb4`) for want of digits, changes or length, and URL
/// queries run together for reading as English.
pub fn is_token(norm: &str) -> bool {
    let b = norm.as_bytes();
    // Base64 of JSON (`eyJ`: every JWT's header, `{"alg":"HS256","typ":"JWT"}` included) and
    // of DER (`MII`: the first bytes of every key of a size) open with text that is the
    // same for everyone; JWTs and keys are the secret rules' to own, whole.
    if b.len() < MIN_TOKEN_CHARS || !norm.is_ascii() || norm.starts_with("eyj") || norm.starts_with("mii") {
        return false;
    }
    let digits = b.iter().filter(|c| c.is_ascii_digit()).count();
    let changes = b.windows(2).filter(|p| p[0].is_ascii_digit() != p[1].is_ascii_digit()).count();
    if digits < 3 || digits + 2 > b.len() || changes < 4 || shannon_entropy(norm) < 3.0 {
        return false;
    }
    // Letters that read as English are words run together (a URL's query once its `%3A`
    // escapes lost their `%`, a badge's `color=fc8d62&logo=rust`), not a random string.
    let (mean, pairs) = Judge::builtin().letter_pair_mean(norm);
    (pairs < MIN_PAIRS_TO_READ || mean <= ENGLISH_PAIR_MEAN) && !PUBLIC_TOKENS.contains(&norm)
}

/// Token-shaped words that are public constants a model says to anyone, in the words view:
/// SHA-256, SHA-1 and MD5 of nothing, Git's empty tree and empty blob, the keys of Stripe's
/// documentation (`sk_test_4eC39…`, `pk_test_TYoo…`), jwt.io's example signature. A tenant
/// that pastes one must not make every other tenant's answer that quotes it foreign.
const PUBLIC_TOKENS: [&str; 8] = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
    "d41d8cd98f00b204e9800998ecf8427e",
    "4b825dc642cb6eb9a060e54bf8d69288fbee4904",
    "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391",
    "4ec39hqlyjwdarjtt1zdp7dc",
    "tyoomqauvdedq54nitphi7jx",
    "sflkxwrjsmekkf2qt4fwpmejf36pok6yjv",
];

/// Fewest letter pairs whose mean log-probability says anything.
const MIN_PAIRS_TO_READ: usize = 8;

/// Mean letter-pair log-probability above which letters read as English (random letters
/// stay below it 99 times in 100).
const ENGLISH_PAIR_MEAN: f32 = -3.3;

/// The keyed hash of `words`, read as written (`undo` None) or undoing a rewriting: ROT13
/// undone word by word, backwards from the last word to the first, each word reversed. The
/// input is gathered in `scratch` and hashed in one write (SipHash gives the same hash however
/// its input is cut, and a write per word cost more than the hashing).
fn hash_words<'a>(
    key: &NgramKey,
    domain: Option<u8>,
    words: impl DoubleEndedIterator<Item = &'a Word>,
    undo: Option<Rewrite>,
    scratch: &mut Vec<u8>,
) -> u64 {
    scratch.clear();
    scratch.extend(domain);
    let mut write = |w: &Word| {
        scratch.extend_from_slice(w.read(undo));
        // 0xff never occurs in UTF-8: an unambiguous separator.
        scratch.push(0xff);
    };
    if undo == Some(Rewrite::Backwards) {
        words.rev().for_each(&mut write);
    } else {
        words.for_each(&mut write);
    }
    let mut h = SipHasher13::new_with_key(&key.0);
    h.write(scratch);
    h.finish()
}

/// The keyed hash of the last `k` words of `window`, read as `undo` says.
fn tail_hash(
    key: &NgramKey,
    domain: Option<u8>,
    window: &VecDeque<Word>,
    k: usize,
    undo: Option<Rewrite>,
    scratch: &mut Vec<u8>,
) -> u64 {
    hash_words(key, domain, window.iter().skip(window.len().saturating_sub(k)), undo, scratch)
}

/// How a response's words are read: as written, then (with [`NgramConfig::rewrites`]) undoing
/// each rewriting. A window is foreign in the first reading that finds it so.
const READINGS: [Option<Rewrite>; 1 + Rewrite::ALL.len()] =
    [None, Some(Rewrite::ALL[0]), Some(Rewrite::ALL[1]), Some(Rewrite::ALL[2]), Some(Rewrite::ALL[3])];

fn readings(cfg: &NgramConfig) -> &'static [Option<Rewrite>] {
    if cfg.rewrites {
        &READINGS
    } else {
        &READINGS[..1]
    }
}

/// The keyed fingerprints of every n-word window of `text` (none if it has fewer words),
/// then, when `n` > `LEAD_WORDS`, of every lead window. The gateway records prompts with
/// this, so recording and checking share one normaliser.
pub fn fingerprints(text: &str, key: &NgramKey, n: usize) -> Vec<u64> {
    fingerprints_and_tokens(text, key, n).0
}

/// The keyed fingerprints of every token word of `text` (`is_token`), in the words view
/// [`fingerprints`] reads. Kept apart from the n-grams: a tenant sends few tokens, and each
/// is worth recording whole, like a secret value, however long the text around it.
pub fn token_fingerprints(text: &str, key: &NgramKey) -> Vec<u64> {
    fingerprints_and_tokens(text, key, 0).1
}

/// [`fingerprints`] and [`token_fingerprints`] of `text`, in one pass over its words.
pub fn fingerprints_and_tokens(text: &str, key: &NgramKey, n: usize) -> (Vec<u64>, Vec<u64>) {
    let mut out = Vec::new();
    let mut leads = Vec::new();
    let mut tokens = Vec::new();
    let mut window: VecDeque<Word> = VecDeque::new();
    let mut scratch = Vec::new();
    let mut on_word = |w: Word| {
        if is_token(&w.norm) {
            tokens.push(hash_words(key, Some(TOKEN_DOMAIN), std::iter::once(&w), None, &mut scratch));
        }
        if n == 0 {
            return;
        }
        window.push_back(w);
        if window.len() > n.max(LEAD_WORDS) {
            window.pop_front();
        }
        if window.len() >= n {
            out.push(tail_hash(key, None, &window, n, None, &mut scratch));
        }
        if n > LEAD_WORDS && window.len() >= LEAD_WORDS {
            leads.push(tail_hash(key, Some(LEAD_DOMAIN), &window, LEAD_WORDS, None, &mut scratch));
        }
    };
    let mut split = WordSplitter::default();
    decode_plain(text, |d| split.feed_char(d, &mut on_word));
    split.finish(text.len(), &mut on_word);
    out.extend(leads);
    (out, tokens)
}

/// A foreign lead being followed: the index of its first word and where its last word
/// starts (the text held back from).
#[derive(Debug, Clone, Copy)]
struct Lead {
    first: u64,
    hold: usize,
}

/// Per-stream state: the splitter, the last `n` words and the foreign leads in progress.
#[derive(Debug)]
pub(crate) struct NgramState {
    split: WordSplitter,
    // the last max(n, LEAD_WORDS) complete words, oldest first
    window: VecDeque<Word>,
    n: usize,
    // words completed so far
    count: u64,
    // per reading (see READINGS), foreign leads whose n-gram has not completed, oldest first
    leads: [Vec<Lead>; READINGS.len()],
    // words completed by the character being fed (kept for its capacity)
    done: Vec<Word>,
    // what a hash reads (kept for its capacity)
    scratch: Vec<u8>,
}

impl NgramState {
    pub(crate) fn new(n: usize) -> NgramState {
        NgramState {
            split: WordSplitter::default(),
            window: VecDeque::new(),
            n,
            count: 0,
            leads: Default::default(),
            done: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Feeds plain ASCII text (not JSON) at raw offset `at`.
    pub(crate) fn feed_ascii(
        &mut self,
        cfg: &NgramConfig,
        ctx: &ScanContext,
        text: &str,
        at: usize,
        out: &mut Vec<Finding>,
    ) {
        let done = &mut self.done;
        self.split.feed_ascii(text, at, &mut |w| done.push(w));
        if !self.done.is_empty() {
            let mut done = std::mem::take(&mut self.done);
            for w in done.drain(..) {
                self.on_word(cfg, ctx, w, out);
            }
            self.done = done;
        }
    }

    /// Feeds one decoded character of the text.
    pub(crate) fn feed_char(&mut self, cfg: &NgramConfig, ctx: &ScanContext, d: Decoded, out: &mut Vec<Finding>) {
        let done = &mut self.done;
        self.split.feed_char(d, &mut |w| done.push(w));
        if !self.done.is_empty() {
            let mut done = std::mem::take(&mut self.done);
            for w in done.drain(..) {
                self.on_word(cfg, ctx, w, out);
            }
            self.done = done;
        }
    }

    pub(crate) fn finish(&mut self, cfg: &NgramConfig, ctx: &ScanContext, end: usize, out: &mut Vec<Finding>) {
        let mut words = Vec::new();
        self.split.finish(end, &mut |w| words.push(w));
        for w in words {
            self.on_word(cfg, ctx, w, out);
        }
        self.leads.iter_mut().for_each(Vec::clear);
    }

    /// Where held-back text starts: the word in progress, or the last word of the oldest
    /// foreign lead still being followed.
    pub(crate) fn hold_from(&self) -> Option<usize> {
        let lead = self.leads.iter().filter_map(|l| l.first().map(|l| l.hold)).min();
        match (self.split.pending_start(), lead) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_word(&mut self, cfg: &NgramConfig, ctx: &ScanContext, mut w: Word, out: &mut Vec<Finding>) {
        if cfg.rewrites {
            w.work_out_rewritings();
        }
        if cfg.tokens && is_token(&w.norm) {
            for &undo in readings(cfg) {
                let hash = hash_words(&cfg.key, Some(TOKEN_DOMAIN), std::iter::once(&w), undo, &mut self.scratch);
                let owners = cfg.owners.owners(hash);
                if let Some(foreign) = foreign(cfg, ctx, &owners) {
                    let detail = Detail::Foreign { owners: foreign, shared_by: owners.shared_by };
                    let verdict = (cfg.severity, cfg.action);
                    out.push(Finding {
                        encoding: undo.map(Rewrite::encoding),
                        ..Finding::over(
                            TOKEN_RULE_ID,
                            (w.start, w.end),
                            DetectorKind::Ngram,
                            verdict,
                            mask(&w.norm),
                            detail,
                        )
                    });
                    break;
                }
            }
        }
        let n = self.n;
        let index = self.count;
        self.count += 1;
        self.window.push_back(w);
        if self.window.len() > n.max(LEAD_WORDS) {
            self.window.pop_front();
        }
        // Whether each reading's last 4 words are recorded text (without leads: unknown).
        let mut recorded = [n <= LEAD_WORDS; READINGS.len()];
        if n > LEAD_WORDS && self.window.len() >= LEAD_WORDS {
            for (reading, &undo) in readings(cfg).iter().enumerate() {
                recorded[reading] = self.follow_leads(cfg, ctx, index, reading, undo);
            }
        }
        if n > 0 && self.window.len() >= n {
            let readable = rewritten_readable(&self.window, n);
            // A rewritten reading's n-gram is looked up only when its last 4 words are a
            // recorded lead: every window of recorded text was recorded as one, and honest
            // text undone is almost never recorded text, so most words cost one lead hash a
            // rewriting instead of two hashes.
            let worth =
                |(reading, undo): &(usize, &Option<Rewrite>)| undo.is_none() || (readable && recorded[*reading]);
            for (_, &undo) in readings(cfg).iter().enumerate().filter(worth) {
                let owners = cfg.owners.owners(tail_hash(&cfg.key, None, &self.window, n, undo, &mut self.scratch));
                if let Some(foreign) = foreign(cfg, ctx, &owners) {
                    let words = || self.window.iter().skip(self.window.len() - n);
                    let (start, end) = (words().next().map_or(0, |w| w.start), self.window.back().map_or(0, |w| w.end));
                    let text: Vec<&str> = words().map(|w| w.norm.as_str()).collect();
                    let detail = Detail::Foreign { owners: foreign, shared_by: owners.shared_by };
                    let (verdict, excerpt) = ((cfg.severity, cfg.action), mask(&text.join(" ")));
                    out.push(Finding {
                        encoding: undo.map(Rewrite::encoding),
                        ..Finding::over(RULE_ID, (start, end), DetectorKind::Ngram, verdict, excerpt, detail)
                    });
                    break;
                }
            }
        }
        // A lead whose n-gram just completed has been judged.
        for leads in &mut self.leads {
            leads.retain(|l| l.first + n as u64 - 1 > index);
        }
    }

    /// The window of the last [`LEAD_WORDS`] words (ending with word `index`), read as
    /// `undo` says: that reading's leads that it does not continue end, and a foreign one
    /// starts being followed. Every window of recorded text is a lead, so text written
    /// backwards finds leads too (the n-gram it completes is recorded text read from its end).
    /// Returns whether the window is recorded text.
    fn follow_leads(
        &mut self,
        cfg: &NgramConfig,
        ctx: &ScanContext,
        index: u64,
        reading: usize,
        undo: Option<Rewrite>,
    ) -> bool {
        let leads = &mut self.leads[reading];
        if undo.is_some() && !rewritten_readable(&self.window, LEAD_WORDS) {
            leads.clear();
            return false;
        }
        let hash = tail_hash(&cfg.key, Some(LEAD_DOMAIN), &self.window, LEAD_WORDS, undo, &mut self.scratch);
        let owners = cfg.owners.owners(hash);
        // Every window of a recorded n-gram was recorded with it: an unknown one means the
        // n-grams of the leads before it cannot be recorded text.
        let recorded = !owners.tenants.is_empty() || owners.shared_by > 0 || owners.model_native;
        if !recorded {
            leads.clear();
        }
        if foreign(cfg, ctx, &owners).is_some() {
            let hold = self.window.back().map_or(0, |w| w.start);
            leads.push(Lead { first: index + 1 - LEAD_WORDS as u64, hold });
        }
        recorded
    }
}

/// The foreign owners of an n-gram or lead, when it counts as foreign here: owned by
/// someone else, not by this tenant, not common language, not something the model says of
/// itself.
fn foreign(cfg: &NgramConfig, ctx: &ScanContext, owners: &OwnerSet) -> Option<Vec<String>> {
    if owners.model_native || owners.shared_by >= cfg.common_at || owners.tenants.iter().any(|t| !ctx.is_foreign(t)) {
        return None;
    }
    let foreign: Vec<String> = owners.tenants.iter().filter(|t| ctx.is_foreign(t)).cloned().collect();
    (!foreign.is_empty()).then_some(foreign)
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
        for h in fingerprints(text, &KEY, n).into_iter().chain(token_fingerprints(text, &KEY)) {
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

    /// Fingerprints are stored (snapshots, the shared store) and compared across versions:
    /// the bytes hashed for a text must never change.
    #[test]
    fn fingerprints_do_not_change_between_versions() {
        let text = "The quick brown fox, Grüße aus Köln! 7Hq2Lx9Vb4Nz8Kc3Wm5Rt1 and then some more words here";
        let (ngrams, tokens) = fingerprints_and_tokens(text, &KEY, 8);
        assert_eq!(ngrams.len(), 18);
        assert_eq!(&ngrams[..2], [16421238493901593525, 10576814603371025214]);
        assert_eq!(ngrams[17], 10332257244078849626, "the last lead");
        assert_eq!(tokens, [10948911167224871138]);
    }

    #[test]
    fn long_runs_are_cut() {
        let long = "x".repeat(150);
        let mut words = Vec::new();
        let mut s = WordSplitter::default();
        decode_plain(&long, |d| s.feed_char(d, &mut |w| words.push(w)));
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
        decode_plain(text, |d| st.feed_char(&cfg, &ctx, d, &mut out));
        st.finish(&cfg, &ctx, text.len(), &mut out);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].start, out[0].end), (4, 21));
        assert!(matches!(&out[0].detail, Detail::Foreign { owners, .. } if owners == &["globex"]));
    }

    #[test]
    fn random_words_are_tokens_and_words_are_not() {
        for token in [
            "3k144a5af729351d0fc58bdrj9a21mkr",
            "0198d844bc5804e5cb1ec0ce28a1304f172f485d",
            "2tm6cdsrvbtl9hrcmr6mrdtpmlfs4i",
            "9fq3kz7wvm2xb8np4hj6ty5d",
        ] {
            assert!(is_token(token), "{token}");
        }
        for word in [
            "internationalization",
            "base64encodedstring123",
            "utf8mb4",
            "2023120112345678",
            "abcdefghijklmnop",
            "version2release3build",
            "issuesqis3aissueis3aopenlabel3a22helpwanted22",
            "badgecolorfc8d62logorust",
            "actionsqueryworkflow3a22test22",
            "eyjhbgcioijiuzi1niisinr5cci6ikpxvcj9",
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "4ec39hqlyjwdarjtt1zdp7dc",
            "miievqibadanbgkqhkig9w0baqefaascbkcwggsjageaaoibaq",
        ] {
            assert!(!is_token(word), "{word}");
        }
    }

    #[test]
    fn another_tenants_token_is_foreign_with_no_words_around_it() {
        let mut map = MapOwners::default();
        record(&mut map, "the staging relay id is 7Hq2Lx9Vb4Nz8Kc3Wd5Rf6Tg", 8, "globex", 1);
        let cfg = NgramConfig::new(KEY, Arc::new(map));
        let text = "Use 7hq2lx9vb4nz8kc3wd5rf6tg.";
        let feed = |tenant: &str| {
            let ctx = ScanContext::new(tenant);
            let mut out = Vec::new();
            let mut st = NgramState::new(DEFAULT_N);
            decode_plain(text, |d| st.feed_char(&cfg, &ctx, d, &mut out));
            st.finish(&cfg, &ctx, text.len(), &mut out);
            out
        };
        let out = feed("acme");
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].rule_id.as_str(), out[0].start, out[0].end), (TOKEN_RULE_ID, 4, 28));
        assert!(matches!(&out[0].detail, Detail::Foreign { owners, .. } if owners == &["globex"]));
        assert!(feed("globex").is_empty(), "its own token");
        let off = NgramConfig { tokens: false, ..cfg.clone() };
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let mut st = NgramState::new(DEFAULT_N);
        decode_plain(text, |d| st.feed_char(&off, &ctx, d, &mut out));
        st.finish(&off, &ctx, text.len(), &mut out);
        assert!(out.is_empty(), "switched off: {out:?}");
    }

    /// Findings of `text` answered to acme, globex owning `recorded`.
    fn foreign_to_acme(recorded: &str, text: &str) -> Vec<Finding> {
        let mut map = MapOwners::default();
        record(&mut map, recorded, DEFAULT_N, "globex", 1);
        let cfg = NgramConfig::new(KEY, Arc::new(map));
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let mut st = NgramState::new(DEFAULT_N);
        decode_plain(text, |d| st.feed_char(&cfg, &ctx, d, &mut out));
        st.finish(&cfg, &ctx, text.len(), &mut out);
        out
    }

    #[test]
    fn words_are_read_backwards_and_in_rot13_but_numbers_and_letters_are_not() {
        let words = "the quarterly numbers stay inside the finance team until the board meets";
        for r in Rewrite::ALL {
            let found = foreign_to_acme(words, &r.apply(words));
            assert!(!found.is_empty() && found.iter().all(|f| f.encoding == Some(r.encoding())), "{r:?}: {found:?}");
        }
        // Rewritten, a list of numbers or single letters is another list, not a disguise.
        let versions = "## 1.0.2 fixed ## 1.0.1 fixed ## 1.0.0 first 0.9.1 0.9.0";
        assert!(foreign_to_acme(versions, &Rewrite::Backwards.apply(versions)).is_empty());
        let letters = "a b c d e f g h i j k l m";
        assert!(foreign_to_acme(letters, &Rewrite::Rot13.apply(letters)).is_empty());
        assert!(foreign_to_acme(letters, &Rewrite::Backwards.apply(letters)).is_empty());
        assert!(!foreign_to_acme(letters, letters).is_empty(), "as written, a copy is a copy");
    }

    #[test]
    fn model_native_text_is_never_foreign() {
        let text = "alpha beta gamma delta epsilon";
        let mut map = MapOwners::default();
        record(&mut map, text, 5, "globex", 1);
        map.0.values_mut().for_each(|o| o.model_native = true);
        let cfg = NgramConfig { n: 5, ..NgramConfig::new(KEY, Arc::new(map)) };
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let mut st = NgramState::new(5);
        decode_plain(text, |d| st.feed_char(&cfg, &ctx, d, &mut out));
        st.finish(&cfg, &ctx, text.len(), &mut out);
        assert!(out.is_empty(), "{out:?}");
    }
}
