//! The stream scanner: text in as it is generated, text out as soon as it is safe.
//!
//! Guarantees, for any chunking of the same text:
//! * the findings are exactly those of [`Ruleset::scan_with`] on the whole text (up to the
//!   point where a block stops the stream), provided no candidate match grows longer than
//!   the holdback limit ([`MAX_HOLDBACK_BYTES`] by default);
//! * no released text contains a complete match of a block rule or a complete foreign
//!   n-gram: a block releases only what precedes the match;
//! * only what could still become part of a match is held back: text after the earliest
//!   position at which some pattern may be in progress (see `live`), and, when the n-gram
//!   detector runs, the word in progress. Clean prose flows out at once.
//!
//! How: every pushed byte advances the anchored liveness threads. `safe` is the earliest
//! live start; no match can start before it and still grow, so matches starting before
//! `safe` are final and confirmed with the real regexes (only for patterns whose relaxed
//! automaton reported a match). Each pattern keeps where its next leftmost-first search
//! starts, exactly as `captures_iter` would over the whole text. The window keeps the
//! bytes before the earliest search that look-behind needs (`\b` and `^` one character,
//! `allow_line` up to 128 bytes), so a match is judged on the same context as one-shot.

use std::sync::Arc;

use crate::detect::entropy::{EntropyState, Observations};
use crate::detect::ngram::NgramState;
use crate::detect::{provenance, Detectors, ScanContext, TokenSignals};
use crate::live::Threads;
use crate::ruleset::Ruleset;
use crate::verdict::{Action, Finding};

/// Default bound on held-back bytes. A candidate match still growing past it is abandoned:
/// its bytes are released and it is judged on what was seen.
pub const MAX_HOLDBACK_BYTES: usize = 4096;

/// Bytes kept before the earliest search start, for look-behind: `\b` needs one char,
/// `allow_line` patterns the line before a match (up to `ALLOW_LINE_LOOKBACK` bytes, and
/// up to 3 more where that cut falls inside a character).
const LOOKBEHIND_BYTES: usize = crate::rule::ALLOW_LINE_LOOKBACK + 8;

/// The result of one push: text now safe to send, new findings, and what to do.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub release: String,
    pub findings: Vec<Finding>,
    /// The strongest action of this step's findings; `Block` once the stream is stopped.
    pub action: Action,
}

impl Step {
    fn blocked() -> Step {
        Step { release: String::new(), findings: Vec::new(), action: Action::Block }
    }
}

/// Scans one channel (message content, or one tool call's arguments) of one response.
pub struct StreamScanner {
    rules: Arc<Ruleset>,
    ctx: ScanContext,
    detectors: Arc<Detectors>,
    max_holdback: usize,
    // raw text [base, base + window.len())
    window: String,
    base: usize,
    // raw offset up to which output has been produced (may jump past a redacted secret)
    released: usize,
    // [patterns] absolute position where the next regex search starts, unless `floor` is
    // later: every search starts at or after the last `safe` position
    next: Vec<usize>,
    floor: usize,
    // [patterns] starts of relaxed threads that reached a match, not yet confirmed
    candidates: Vec<Vec<usize>>,
    // patterns with candidates, so a push costs nothing for the others
    pending: Vec<usize>,
    threads: Threads,
    // confirmed redactions not yet passed by `released`: (start, end, rule id), by start
    redactions: Vec<(usize, usize, String)>,
    ngram: Option<NgramState>,
    entropy: EntropyState,
    blocked: bool,
    finished: bool,
}

impl StreamScanner {
    pub fn new(rules: Arc<Ruleset>, ctx: ScanContext, detectors: Arc<Detectors>) -> StreamScanner {
        let patterns = rules.engine.patterns.len();
        let ngram = detectors.ngram.as_ref().map(|c| NgramState::new(c.n));
        StreamScanner {
            rules,
            ctx,
            detectors,
            max_holdback: MAX_HOLDBACK_BYTES,
            window: String::new(),
            base: 0,
            released: 0,
            next: vec![0; patterns],
            floor: 0,
            candidates: vec![Vec::new(); patterns],
            pending: Vec::new(),
            threads: Threads::default(),
            redactions: Vec::new(),
            ngram,
            entropy: EntropyState::default(),
            blocked: false,
            finished: false,
        }
    }

    /// Changes the holdback bound (at least 64 bytes).
    pub fn with_max_holdback(mut self, bytes: usize) -> StreamScanner {
        self.max_holdback = bytes.max(64);
        self
    }

    /// Feeds generated text.
    pub fn push(&mut self, delta: &str) -> Step {
        if self.blocked {
            return Step::blocked();
        }
        self.step(delta, Vec::new(), false)
    }

    /// Feeds one token with the engine's signals. A foreign provenance owner blocks before
    /// any of the token's text is taken in.
    pub fn push_token(&mut self, text: &str, signals: &TokenSignals) -> Step {
        if self.blocked {
            return Step::blocked();
        }
        let start = self.end();
        let mut extra = Vec::new();
        if let Some(f) = self.detectors.provenance.as_ref().and_then(|c| provenance::check(c, &self.ctx, &signals.owners, text, start)) {
            if f.action == Action::Block {
                self.blocked = true;
                return Step { release: String::new(), findings: vec![f], action: Action::Block };
            }
            extra.push(f);
        }
        if let Some(cfg) = &self.detectors.entropy {
            self.entropy.feed_token(cfg, &self.ctx, signals, text, start, &mut extra);
        }
        self.step(text, extra, false)
    }

    /// Ends the stream: everything left is judged and, unless blocked, released.
    pub fn finish(&mut self) -> Step {
        if self.blocked {
            return Step::blocked();
        }
        if self.finished {
            return Step { release: String::new(), findings: Vec::new(), action: Action::Allow };
        }
        self.step("", Vec::new(), true)
    }

    /// Raw bytes taken in but not yet released.
    pub fn held_bytes(&self) -> usize {
        self.end().saturating_sub(self.released)
    }

    /// Whether a block stopped the stream.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// Entropy observations so far, for the gateway's per-tenant statistics.
    pub fn observations(&self) -> Observations {
        self.entropy.observed
    }

    fn end(&self) -> usize {
        self.base + self.window.len()
    }

    fn step(&mut self, delta: &str, mut found: Vec<Finding>, finishing: bool) -> Step {
        let start = self.end();
        self.window.push_str(delta);
        let safe = self.advance_threads(delta.as_bytes(), start, finishing);
        self.confirm(safe, &mut found);
        self.run_text_detectors(delta, start, finishing, &mut found);
        Finding::sort(&mut found);

        let mut limit = safe;
        if let Some(h) = self.ngram.as_ref().and_then(NgramState::hold_from) {
            limit = limit.min(h);
        }
        let block_at = found.iter().filter(|f| f.action == Action::Block).map(|f| f.match_start).min();
        if let Some(b) = block_at {
            limit = limit.min(b);
        }
        for f in found.iter().filter(|f| f.action == Action::Redact) {
            let at = self.redactions.partition_point(|r| r.0 <= f.start);
            self.redactions.insert(at, (f.start, f.end, f.rule_id.clone()));
        }
        let release = self.release_to(limit);
        self.blocked = block_at.is_some();
        self.finished = finishing;
        self.trim();
        let action = if self.blocked { Action::Block } else { found.iter().map(|f| f.action).max().unwrap_or(Action::Allow) };
        Step { release, findings: found, action }
    }

    /// Advances the liveness threads over `bytes` (starting at absolute `start`) and
    /// returns the earliest position at which a match may still be in progress.
    fn advance_threads(&mut self, bytes: &[u8], start: usize, finishing: bool) -> usize {
        let live = self.rules.engine.live();
        let (candidates, pending) = (&mut self.candidates, &mut self.pending);
        let mut on_match = |p: usize, s: usize| {
            if candidates[p].is_empty() {
                pending.push(p);
            }
            candidates[p].push(s);
        };
        for (i, &b) in bytes.iter().enumerate() {
            self.threads.step(live, b, start + i, &mut on_match);
        }
        let end = self.base + self.window.len();
        if finishing {
            self.threads.finish(live, &mut on_match);
            return end;
        }
        let mut safe = self.threads.earliest().unwrap_or(end);
        if end - safe > self.max_holdback {
            safe = floor_char(&self.window, self.base, end - self.max_holdback);
            self.threads.drop_before(safe);
        }
        safe
    }

    /// Confirms, with the real regexes, every match that starts before `safe`. Patterns
    /// without a candidate there have nothing to find before `safe`: raising `floor` moves
    /// all their searches on at once.
    fn confirm(&mut self, safe: usize, out: &mut Vec<Finding>) {
        // Patterns in the order a whole-pass scan would see them: findings sort later anyway.
        self.pending.sort_unstable();
        let mut k = 0;
        while k < self.pending.len() {
            let p = self.pending[k];
            if self.candidates[p].iter().any(|&s| s < safe) {
                let from = self.next[p].max(self.floor).saturating_sub(self.base);
                let next = self.rules.pattern_matches(p, &self.window, self.base, from, safe - self.base, &self.ctx, out);
                self.next[p] = self.base + next;
                self.candidates[p].retain(|&s| s >= safe);
            }
            if self.candidates[p].is_empty() {
                self.pending.swap_remove(k);
            } else {
                k += 1;
            }
        }
        self.floor = self.floor.max(safe);
    }

    fn run_text_detectors(&mut self, delta: &str, start: usize, finishing: bool, out: &mut Vec<Finding>) {
        if let (Some(cfg), Some(st)) = (&self.detectors.ngram, &mut self.ngram) {
            st.feed(cfg, &self.ctx, delta, start, out);
            if finishing {
                st.finish(cfg, &self.ctx, start + delta.len(), out);
            }
        }
        if let Some(cfg) = &self.detectors.entropy {
            self.entropy.feed_text(cfg, &self.ctx, delta, start, out);
        }
    }

    /// Emits raw text up to `limit`, with confirmed redactions applied.
    fn release_to(&mut self, limit: usize) -> String {
        let limit = floor_char(&self.window, self.base, limit);
        let mut out = String::new();
        while self.released < limit {
            let released = self.released;
            self.redactions.retain(|r| r.1 > released);
            match self.redactions.first() {
                Some((a, b, id)) if *a < limit => {
                    let a = (*a).max(released);
                    out.push_str(self.slice(released, a));
                    out.push_str("[REDACTED:");
                    out.push_str(id);
                    out.push(']');
                    self.released = *b;
                    self.redactions.remove(0);
                }
                _ => {
                    out.push_str(self.slice(released, limit));
                    self.released = limit;
                }
            }
        }
        out
    }

    fn slice(&self, from: usize, to: usize) -> &str {
        self.window.get(from.saturating_sub(self.base)..to.saturating_sub(self.base)).unwrap_or("")
    }

    /// Drops window text that no search, look-behind or release will read again (every
    /// search starts at or after `floor`).
    fn trim(&mut self) {
        let earliest = self.floor.min(self.released);
        let keep = floor_char(&self.window, self.base, earliest.saturating_sub(LOOKBEHIND_BYTES));
        if keep > self.base {
            self.window.drain(..keep - self.base);
            self.base = keep;
        }
    }
}

/// The largest char boundary of the window at or below absolute `pos` (and >= `base`).
fn floor_char(window: &str, base: usize, pos: usize) -> usize {
    let mut rel = pos.saturating_sub(base).min(window.len());
    while rel > 0 && !window.is_char_boundary(rel) {
        rel -= 1;
    }
    base + rel
}
