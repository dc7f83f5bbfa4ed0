//! The stream scanner: text in as it is generated, text out as soon as it is safe.
//!
//! Guarantees, for any chunking of the same text:
//! * the findings are exactly those of [`Ruleset::scan_with`] on the whole text (up to the
//!   point where a block stops the stream), provided no candidate match grows longer than
//!   the holdback limit ([`MAX_HOLDBACK_BYTES`] by default);
//! * no released text contains a complete match of a block rule, in the raw text or in its
//!   canonical view, or a complete foreign n-gram: a block releases only what precedes the
//!   match (mapped back to raw bytes);
//! * at most three words of a foreign sentence reach the client before its n-gram blocks
//!   (see `detect::ngram`, leads);
//! * only what could still become part of a match is held back: text after the earliest
//!   position at which some pattern may be in progress (see `liveness`), the run of look-alikes
//!   whose reading is not decided yet (see `canon`), and, when the n-gram detector runs, the
//!   word in progress. Clean prose flows out at once.
//!
//! How: pushed text goes through `canon`, which decides how each character reads. The
//! decided raw text feeds the raw `Pass` (`pass.rs`); from the first character that reads otherwise,
//! a view pass (a copy of the raw pass at that point) is fed the rules view. In each pass
//! every byte advances the anchored liveness threads; `safe` is the earliest live start of
//! either pass, in raw offsets; no match can start before it and still grow, so matches
//! starting before it are final, and both passes confirm them with the real regexes. A
//! finding both passes make (same rule, same raw span) is reported once, the raw one. Secret
//! findings are then attributed to their owner, and only then is release or block decided,
//! so a tenant's own secret is let through. Redaction and blocking act on raw spans.

pub(crate) mod liveness;
pub(crate) mod pass;

use std::sync::Arc;

use crate::canon::{self, Canon, Decoded, Piece};
use crate::detect::encoded::{judge as judge_decoded, DecodedText, EncodedState, Reader};
use crate::detect::entropy::{EntropyState, Observations};
use crate::detect::ngram::NgramState;
use crate::detect::table::{self, TableState};
use crate::detect::{provenance, secret, Detectors, ScanContext, TokenSignals};
use crate::rules::ruleset::Ruleset;
use crate::stream::pass::{floor_char, merge_findings, Pass, ViewPass};
use crate::verdict::{Action, Finding};

/// Default bound on held-back bytes. A candidate match still growing past it is abandoned:
/// its bytes are released and it is judged on what was seen.
pub const MAX_HOLDBACK_BYTES: usize = 4096;

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
    // raw text in, decided pieces of the rules view out
    canon: Canon,
    // the rule patterns over the raw text [raw.base, raw.end()): everything decided so far
    raw: Pass,
    // the rule patterns over the rules view, from the first character that reads otherwise
    view: Option<ViewPass>,
    // raw text pushed but not yet decided, [raw.end(), pushed), from `undecided[undecided_from..]`
    // (the consumed head is dropped only once it is long, not at every push)
    undecided: String,
    undecided_from: usize,
    pushed: usize,
    // raw offset up to which output has been produced (may jump past a redacted secret)
    released: usize,
    // confirmed redactions not yet passed by `released`: (start, end, rule id), by start
    redactions: Vec<(usize, usize, String)>,
    ngram: Option<NgramState>,
    // the encoded run in progress, when runs are read decoded
    encoded: Option<EncodedState>,
    // the markdown table in progress (none in JSON, whose line breaks are escapes)
    table: Option<TableState>,
    // in JSON, the raw text read for name/value pairs: a tool call's own arguments
    // (`{"name": "DB_PASSWORD", "value": …}`), whose fields the decoded reader sees apart
    raw_pairs: Option<TableState>,
    entropy: EntropyState,
    blocked: bool,
    finished: bool,
}

impl StreamScanner {
    pub fn new(rules: Arc<Ruleset>, ctx: ScanContext, detectors: Arc<Detectors>) -> StreamScanner {
        let patterns = rules.engine.patterns.len();
        let ngram = detectors.ngram.as_ref().map(|c| NgramState::new(c.n));
        let encoded = detectors.decode.as_ref().map(|c| EncodedState::new(c, MAX_HOLDBACK_BYTES));
        StreamScanner {
            rules,
            ctx,
            detectors,
            max_holdback: MAX_HOLDBACK_BYTES,
            canon: Canon::default(),
            raw: Pass::new(patterns),
            view: None,
            undecided: String::new(),
            undecided_from: 0,
            pushed: 0,
            released: 0,
            redactions: Vec::new(),
            ngram,
            encoded,
            table: Some(TableState::new(table::MAX_ROW_BYTES)),
            raw_pairs: None,
            entropy: EntropyState::default(),
            blocked: false,
            finished: false,
        }
    }

    /// Reads the pushed text as JSON (a tool call's arguments as they stream): inside
    /// strings, escapes are decoded before the detectors read them, so they see what the
    /// client sees after `JSON.parse`. Released text stays the raw JSON. Call before any push.
    pub fn decode_json_strings(mut self) -> StreamScanner {
        if self.pushed == 0 {
            self.canon = Canon::json();
            self.table = Some(TableState::decoded(self.max_holdback.min(table::MAX_ROW_BYTES)));
            self.raw_pairs = Some(TableState::pairs_only(self.max_holdback.min(table::MAX_ROW_BYTES)));
        }
        self
    }

    /// Changes the holdback bound (at least 64 bytes). An encoded run is judged a segment
    /// of this many characters at a time, and a table row is read up to this many bytes
    /// (when fewer than the table reader's 1,024).
    pub fn with_max_holdback(mut self, bytes: usize) -> StreamScanner {
        self.max_holdback = bytes.max(64);
        if let (0, Some(st)) = (self.pushed, &self.table) {
            let row_bytes = self.max_holdback.min(table::MAX_ROW_BYTES);
            self.table =
                Some(if st.is_decoded() { TableState::decoded(row_bytes) } else { TableState::new(row_bytes) });
            if self.raw_pairs.is_some() {
                self.raw_pairs = Some(TableState::pairs_only(row_bytes));
            }
        }
        if let (0, Some(cfg)) = (self.pushed, &self.detectors.decode) {
            self.encoded = Some(EncodedState::new(cfg, self.max_holdback));
        }
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
        if let Some(f) = self
            .detectors
            .provenance
            .as_ref()
            .and_then(|c| provenance::check(c, &self.ctx, &signals.owners, text, start))
        {
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
        self.pushed.saturating_sub(self.released)
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
        self.pushed
    }

    fn step(&mut self, delta: &str, mut found: Vec<Finding>, finishing: bool) -> Step {
        let start = self.pushed;
        self.pushed += delta.len();
        self.take_in(delta, start, finishing, &mut found);
        if let Some(cfg) = &self.detectors.entropy {
            self.entropy.feed_text(cfg, &self.ctx, delta, start, &mut found);
        }
        let safe = self.confirm(finishing, &mut found);
        let (raw, json) = (&self.raw, self.canon.is_json());
        secret::settle(self.detectors.secrets.as_ref(), &self.ctx, &mut found, |f| {
            canon::rules_string(raw.slice(f.start, f.end), json)
        });
        Finding::sort(&mut found);

        let mut limit = safe;
        if let Some(h) = self.ngram.as_ref().and_then(NgramState::hold_from) {
            limit = limit.min(h);
        }
        if let Some(h) = self.encoded.as_ref().and_then(EncodedState::hold_from) {
            limit = limit.min(h);
        }
        for h in [&self.table, &self.raw_pairs].into_iter().filter_map(|t| t.as_ref().and_then(TableState::hold_from)) {
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
        self.raw.trim(self.released);
        if let Some(v) = &mut self.view {
            v.trim();
        }
        let action =
            if self.blocked { Action::Block } else { found.iter().map(|f| f.action).max().unwrap_or(Action::Allow) };
        Step { release, findings: found, action }
    }

    /// Decodes and folds `delta` (raw offset `at`): decided pieces go to the raw pass and,
    /// from the first one that reads otherwise, to the view pass; decoded characters go to
    /// the n-gram detector as soon as they are decoded.
    fn take_in(&mut self, delta: &str, at: usize, finishing: bool, found: &mut Vec<Finding>) {
        let StreamScanner {
            rules,
            ctx,
            detectors,
            canon,
            raw,
            view,
            undecided,
            undecided_from,
            ngram,
            encoded,
            table,
            raw_pairs,
            ..
        } = self;
        let live = rules.engine.live();
        for st in [table.as_mut().filter(|st| !st.is_decoded()), raw_pairs.as_mut()].into_iter().flatten() {
            let mut judge = |cell: table::LabelledCell| table::judge(rules, ctx, &cell, found);
            st.feed(delta, at, &mut judge);
            if finishing {
                st.finish(&mut judge);
            }
        }
        let reader = Reader { rules, ctx, detectors, depth: 0 };
        undecided.push_str(delta);
        // Decoded characters go to the n-gram splitter, the encoded-run reader and, in JSON,
        // the table reader.
        let mut decoded_table = table.as_mut().filter(|st| st.is_decoded());
        let has_words = ngram.is_some() || encoded.is_some() || decoded_table.is_some();
        let mut want_words = has_words;
        if want_words && !canon.is_json() && delta.is_ascii() {
            // Plain ASCII reads as itself in the words view: the splitter takes it whole.
            if let (Some(cfg), Some(st)) = (&detectors.ngram, ngram.as_mut()) {
                st.feed_ascii(cfg, ctx, delta, at, found);
            }
            if let Some(st) = encoded.as_mut() {
                st.feed_plain(delta, at, &mut |d: &DecodedText| judge_decoded(reader, d, found));
            }
            want_words = false;
        }
        let mut used = *undecided_from;
        let mut words = |d: Decoded| {
            if let (Some(cfg), Some(st)) = (&detectors.ngram, ngram.as_mut()) {
                st.feed_char(cfg, ctx, d, found);
            }
            if let Some(st) = encoded.as_mut() {
                st.feed_char(d, &mut |d: &DecodedText| judge_decoded(reader, d, found));
            }
            if let Some(st) = decoded_table.as_mut() {
                st.feed_char(d, &mut |cell: table::LabelledCell| table::judge(reader.rules, reader.ctx, &cell, found));
            }
        };
        let mut pieces = |p: Piece<'_>| {
            let (Piece::Same { start, end } | Piece::Changed { start, end, .. }) = p;
            let text = undecided.get(used..used + (end - start)).unwrap_or("");
            used += end - start;
            match p {
                Piece::Same { .. } => {
                    raw.feed(live, text);
                    if let Some(v) = view.as_mut() {
                        v.feed_same(live, text, start);
                    }
                }
                Piece::Changed { view: read, .. } => {
                    let v = view.get_or_insert_with(|| ViewPass::seed(raw));
                    raw.feed(live, text);
                    v.feed_changed(live, read, start, end);
                }
            }
        };
        canon.feed(delta, at, want_words, &mut words, &mut pieces);
        if finishing {
            canon.finish(has_words, &mut words, &mut pieces);
        }
        if used >= undecided.len() {
            undecided.clear();
            used = 0;
        } else if used > 1024 {
            undecided.drain(..used);
            used = 0;
        }
        *undecided_from = used;
        if finishing {
            if let (Some(cfg), Some(st)) = (&detectors.ngram, ngram.as_mut()) {
                st.finish(cfg, ctx, at + delta.len(), found);
            }
            if let Some(st) = encoded.as_mut() {
                st.finish(&mut |d: &DecodedText| judge_decoded(reader, d, found));
            }
            if let Some(st) = decoded_table.as_mut() {
                st.finish(&mut |cell: table::LabelledCell| table::judge(reader.rules, reader.ctx, &cell, found));
            }
        }
    }

    /// Confirms the matches of both passes that start before the common safe position (the
    /// earliest raw position at which a match of either may be in progress), and returns
    /// it. Both passes confirm up to the same raw position, so a match they share is found
    /// in one step and merged.
    fn confirm(&mut self, finishing: bool, found: &mut Vec<Finding>) -> usize {
        let live = self.rules.engine.live();
        let raw_end = self.raw.end();
        let mut safe = raw_end;
        if finishing {
            self.raw.finish(live);
            if let Some(v) = &mut self.view {
                v.pass.finish(live);
            }
        } else {
            safe = self.raw.safe(self.max_holdback);
            if let Some(v) = &mut self.view {
                let vs = v.pass.safe(self.max_holdback);
                safe = safe.min(v.to_raw(vs, raw_end));
            }
        }
        let from = found.len();
        self.raw.confirm(&self.rules, &self.ctx, safe, found);
        if let Some(v) = &mut self.view {
            let mut extra = Vec::new();
            let vs = v.to_view(safe, raw_end);
            v.pass.confirm(&self.rules, &self.ctx, vs, &mut extra);
            v.map_findings(&mut extra);
            merge_findings(found, extra, from);
        }
        safe
    }

    /// Emits raw text up to `limit`, with confirmed redactions applied.
    fn release_to(&mut self, limit: usize) -> String {
        let limit = floor_char(&self.raw.window, self.raw.base, limit);
        let mut out = String::new();
        while self.released < limit {
            let released = self.released;
            self.redactions.retain(|r| r.1 > released);
            match self.redactions.first() {
                Some((a, b, id)) if *a < limit => {
                    let a = (*a).max(released);
                    out.push_str(self.raw.slice(released, a));
                    out.push_str("[REDACTED:");
                    out.push_str(id);
                    out.push(']');
                    self.released = *b;
                    self.redactions.remove(0);
                }
                _ => {
                    out.push_str(self.raw.slice(released, limit));
                    self.released = limit;
                }
            }
        }
        out
    }
}
