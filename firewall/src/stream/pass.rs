//! One streaming pass of the rule patterns over one text: the raw text, or its rules view.
//!
//! A [`Pass`] owns what `stream` used to keep for its one text: the window, the liveness
//! threads, the candidates they reported and where each pattern's next regex search starts.
//! It knows nothing of releasing or redacting; the stream decides up to where each pass
//! confirms, so that both passes confirm the same raw region at the same step (a finding
//! both passes report therefore arrives in one step, and is reported once).
//!
//! A [`ViewPass`] is a pass over the rules view plus the [`SpanMap`] back to raw offsets. It
//! starts as a copy of the raw pass when the first character whose view differs is decided:
//! up to there the view is the raw text, so the copy is exactly the state a view pass run
//! from the start would have. Pure-ASCII streams never pay for it.

use crate::canon::SpanMap;
use crate::detect::ScanContext;
use crate::rules::ruleset::Ruleset;
use crate::stream::liveness::{Live, Threads};
use crate::verdict::Finding;

/// Bytes kept before the earliest search start, for look-behind: `\b` needs one char,
/// `allow_line` patterns the line before a match (up to `ALLOW_LINE_LOOKBACK` bytes, and
/// up to 3 more where that cut falls inside a character).
const LOOKBEHIND_BYTES: usize = crate::rules::rule::ALLOW_LINE_LOOKBACK + 8;

#[derive(Debug, Clone)]
pub(crate) struct Pass {
    // text [base, base + window.len())
    pub(crate) window: String,
    pub(crate) base: usize,
    // [patterns] absolute position where the next regex search starts, unless `floor` is
    // later: every search starts at or after the last confirmed bound
    next: Vec<usize>,
    pub(crate) floor: usize,
    // [patterns] starts of relaxed threads that reached a match, not yet confirmed
    candidates: Vec<Vec<usize>>,
    // patterns with candidates, so a step costs nothing for the others
    pending: Vec<usize>,
    threads: Threads,
}

impl Pass {
    pub(crate) fn new(patterns: usize) -> Pass {
        Pass {
            window: String::new(),
            base: 0,
            next: vec![0; patterns],
            floor: 0,
            candidates: vec![Vec::new(); patterns],
            pending: Vec::new(),
            threads: Threads::default(),
        }
    }

    pub(crate) fn end(&self) -> usize {
        self.base + self.window.len()
    }

    /// Appends `text` and advances the liveness threads over it.
    pub(crate) fn feed(&mut self, live: &Live, text: &str) {
        let start = self.end();
        self.window.push_str(text);
        let (candidates, pending) = (&mut self.candidates, &mut self.pending);
        let mut on_match = |p: usize, s: usize| {
            if candidates[p].is_empty() {
                pending.push(p);
            }
            candidates[p].push(s);
        };
        for (i, &b) in text.as_bytes().iter().enumerate() {
            self.threads.step(live, b, start + i, &mut on_match);
        }
    }

    /// Ends the text: the threads report matches that end exactly at the end.
    pub(crate) fn finish(&mut self, live: &Live) {
        let (candidates, pending) = (&mut self.candidates, &mut self.pending);
        self.threads.finish(live, &mut |p, s| {
            if candidates[p].is_empty() {
                pending.push(p);
            }
            candidates[p].push(s);
        });
    }

    /// The earliest position at which a match may still be in progress, at most
    /// `max_holdback` bytes back from the end (older threads are abandoned).
    pub(crate) fn safe(&mut self, max_holdback: usize) -> usize {
        let end = self.end();
        let mut safe = self.threads.earliest().unwrap_or(end);
        if end - safe > max_holdback {
            safe = floor_char(&self.window, self.base, end - max_holdback);
            self.threads.drop_before(safe);
        }
        safe
    }

    /// Confirms, with the real regexes, every match that starts before `safe`. Patterns
    /// without a candidate there have nothing to find before `safe`: raising `floor` moves
    /// all their searches on at once.
    pub(crate) fn confirm(&mut self, rules: &Ruleset, ctx: &ScanContext, safe: usize, out: &mut Vec<Finding>) {
        // Patterns in the order a whole-pass scan would see them: findings sort later anyway.
        self.pending.sort_unstable();
        let mut k = 0;
        while k < self.pending.len() {
            let p = self.pending[k];
            if self.candidates[p].iter().any(|&s| s < safe) {
                let from = self.next[p].max(self.floor).saturating_sub(self.base);
                let next =
                    rules.pattern_matches(p, &self.window, self.base, from, safe.saturating_sub(self.base), ctx, out);
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

    pub(crate) fn slice(&self, from: usize, to: usize) -> &str {
        self.window.get(from.saturating_sub(self.base)..to.saturating_sub(self.base)).unwrap_or("")
    }

    /// Drops window text that no search or look-behind will read again, and none before
    /// `keep` (what the caller still needs). Returns the new base.
    pub(crate) fn trim(&mut self, keep: usize) -> usize {
        let earliest = self.floor.min(keep);
        let keep = floor_char(&self.window, self.base, earliest.saturating_sub(LOOKBEHIND_BYTES));
        if keep > self.base {
            self.window.drain(..keep - self.base);
            self.base = keep;
        }
        self.base
    }
}

/// A pass over the rules view, with the map of its offsets to raw ones.
#[derive(Debug, Clone)]
pub(crate) struct ViewPass {
    pub(crate) pass: Pass,
    map: SpanMap,
}

impl ViewPass {
    /// Starts from the raw pass, whose text so far is the view.
    pub(crate) fn seed(raw: &Pass) -> ViewPass {
        let mut map = SpanMap::default();
        map.push_same(raw.base, raw.base, raw.window.len());
        ViewPass { pass: raw.clone(), map }
    }

    /// The view goes on as the raw text `raw_start..` does: `text`.
    pub(crate) fn feed_same(&mut self, live: &Live, text: &str, raw_start: usize) {
        self.map.push_same(self.pass.end(), raw_start, text.len());
        self.pass.feed(live, text);
    }

    /// Raw `raw_start..raw_end` reads as `view`.
    pub(crate) fn feed_changed(&mut self, live: &Live, view: &str, raw_start: usize, raw_end: usize) {
        self.map.push_changed(self.pass.end(), raw_start, view.len(), raw_end - raw_start);
        self.pass.feed(live, view);
    }

    /// The raw position of view position `v`; `raw_end` when `v` is the view's end.
    pub(crate) fn to_raw(&self, v: usize, raw_end: usize) -> usize {
        if v >= self.pass.end() {
            raw_end
        } else {
            self.map.raw_start(v)
        }
    }

    /// The view position of raw position `r`, which is at most `raw_end`.
    pub(crate) fn to_view(&self, r: usize, raw_end: usize) -> usize {
        if r >= raw_end {
            self.pass.end()
        } else {
            self.map.to_view(r)
        }
    }

    /// Rewrites the offsets of findings of this pass to raw ones.
    pub(crate) fn map_findings(&self, findings: &mut [Finding]) {
        for f in findings {
            (f.start, f.end) = self.map.raw_span(f.start, f.end);
            (f.match_start, f.match_end) = self.map.raw_span(f.match_start, f.match_end);
        }
    }

    pub(crate) fn trim(&mut self) {
        let floor = self.pass.floor;
        let base = self.pass.trim(floor);
        self.map.trim_before(base);
    }
}

/// The largest char boundary of the window at or below absolute `pos` (and >= `base`).
pub(crate) fn floor_char(window: &str, base: usize, pos: usize) -> usize {
    let mut rel = pos.saturating_sub(base).min(window.len());
    while rel > 0 && !window.is_char_boundary(rel) {
        rel -= 1;
    }
    base + rel
}

/// Adds `extra` (from the view pass, mapped to raw offsets) to `out` (from the raw pass),
/// leaving out a finding of the same rule over the same raw span as one already there,
/// unless that one is only a candidate and this one a finding (the view's words, folded,
/// may not exempt what the raw words did).
pub(crate) fn merge_findings(out: &mut Vec<Finding>, extra: Vec<Finding>, raw_from: usize) {
    for f in extra {
        let same = out[raw_from..].iter().position(|g| g.rule_id == f.rule_id && g.start == f.start && g.end == f.end);
        match same.map(|i| raw_from + i) {
            None => out.push(f),
            Some(i) if out[i].is_candidate() && !f.is_candidate() => out[i] = f,
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{Action, Detail, DetectorKind, Severity};

    fn finding(rule: &str, action: Action) -> Finding {
        Finding {
            rule_id: rule.into(),
            start: 4,
            end: 9,
            match_start: 0,
            match_end: 9,
            severity: Severity::High,
            action,
            excerpt: String::new(),
            kind: DetectorKind::Secret,
            detail: Detail::None,
            encoding: None,
        }
    }

    /// The view's folded words may not exempt what the raw words did, and the reverse: a
    /// finding on either side wins over a candidate on the other, so no disguise of the
    /// words around a secret can drop it.
    #[test]
    fn a_finding_wins_over_a_candidate_of_the_same_rule_and_span() {
        let mut out = vec![finding("r", Action::Allow)];
        merge_findings(&mut out, vec![finding("r", Action::Block)], 0);
        assert_eq!(out, [finding("r", Action::Block)]);
        merge_findings(&mut out, vec![finding("r", Action::Allow)], 0);
        assert_eq!(out, [finding("r", Action::Block)], "a view candidate leaves the raw finding");
        merge_findings(&mut out, vec![finding("s", Action::Allow)], 0);
        assert_eq!(out.len(), 2, "another rule's candidate is kept for the ownership check");
    }
}
