//! One-shot search of one rule near its keyword hits, instead of over the whole text.
//!
//! The matching semantics (see `scan`) are a left-to-right walk over start positions: at
//! each position the rule's regex is tried *anchored*; a match holding a keyword is taken
//! and the walk jumps to its end, anything else moves on by one character. Only positions
//! whose match holds a keyword can yield a finding, so the walk may skip every other
//! position without changing a single result.
//!
//! For a rule whose keyword reach is `P` (every match has a keyword starting at most `P`
//! bytes after its start, see `reach`), every match starts within `[hit - P, hit]` of a
//! keyword hit. Those *regions*, merged, are the only positions tried here. A rule without
//! a bounded reach is walked over the whole text by the caller with an unanchored search,
//! which visits the same positions in one pass. Inside a region, a position where no match
//! can start (by its byte and, for matches opening with `^` or `\b`, the byte before; see
//! `start`) is skipped without a try: the regex would fail there anyway.
//!
//! Invariant: for any text, [`RuleSearch::walk_regions`] reports exactly the matches that
//! the unanchored walk over the whole text (`scan::rule_matches`) reports; the tests of
//! `scan` check it on the labelled corpus with every default rule.

use regex_automata::meta::Regex as MetaRegex;
use regex_automata::util::captures::Captures;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::Hir;

use crate::rule::REGEX_SIZE_LIMIT;
use crate::start::StartFilter;

/// A match: whole-match span and secret span, byte offsets into the text.
pub(crate) type Found = ((usize, usize), (usize, usize));

/// What the caller made of a match: take it (the walk jumps past it) or not (one step on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Verdict {
    Taken,
    Passed,
}

/// Everything needed to try one rule anchored at chosen positions.
#[derive(Debug, Clone)]
pub(crate) struct RuleSearch {
    regex: MetaRegex,
    secret_group: usize,
    /// Upper bound on the offset of the first keyword in any match; `None`: unbounded.
    pub(crate) reach: Option<usize>,
    /// Where a match can start (a superset), to skip tries that cannot match.
    starts: StartFilter,
}

impl RuleSearch {
    pub(crate) fn build(hir: &Hir, secret_group: usize, reach: Option<usize>, starts: StartFilter) -> Result<RuleSearch, String> {
        let regex = MetaRegex::builder()
            .configure(MetaRegex::config().nfa_size_limit(Some(REGEX_SIZE_LIMIT)))
            .build_from_hir(hir)
            .map_err(|e| format!("anchored search: {e}"))?;
        Ok(RuleSearch { regex, secret_group, reach, starts })
    }

    /// Merges the start regions `[hit - reach, hit]` of the sorted keyword hit starts.
    /// Returns inclusive `(first, last)` start positions; empty without a bounded reach.
    pub(crate) fn regions(&self, hit_starts: &[usize]) -> Vec<(usize, usize)> {
        let Some(reach) = self.reach else { return Vec::new() };
        let mut out: Vec<(usize, usize)> = Vec::new();
        for &h in hit_starts {
            let a = h.saturating_sub(reach);
            match out.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(h),
                _ => out.push((a, h)),
            }
        }
        out
    }

    /// Walks the start positions of `regions` (sorted, disjoint) in `text`, trying the
    /// regex anchored at each; `take` judges every match found.
    pub(crate) fn walk_regions(&self, text: &str, regions: &[(usize, usize)], mut take: impl FnMut(Found) -> Verdict) {
        let bytes = text.as_bytes();
        let mut caps = (self.secret_group != 0).then(|| self.regex.create_captures());
        let mut at = 0;
        for &(first, last) in regions {
            let mut s = first.max(at);
            while s <= last && s < bytes.len() {
                if !self.starts.may_start_at(bytes, s) || !text.is_char_boundary(s) {
                    s += 1;
                    continue;
                }
                let Some(found) = self.anchored_at(text, s, caps.as_mut()) else {
                    s += 1;
                    continue;
                };
                match take(found) {
                    // Rules never match the empty string (the loader rejects them).
                    Verdict::Taken => s = found.0 .1.max(s + 1),
                    Verdict::Passed => s += 1,
                }
            }
            at = at.max(s);
        }
    }

    /// The leftmost-first match starting exactly at `s`, seeing the whole text around it.
    fn anchored_at(&self, text: &str, s: usize, caps: Option<&mut Captures>) -> Option<Found> {
        let input = Input::new(text).span(s..text.len()).anchored(Anchored::Yes);
        match caps {
            None => self.regex.search(&input).map(|m| ((m.start(), m.end()), (m.start(), m.end()))),
            Some(caps) => {
                self.regex.search_captures(&input, caps);
                let m = caps.get_match()?;
                let secret = caps.get_group(self.secret_group).map_or((m.start(), m.end()), |g| (g.start, g.end));
                Some(((m.start(), m.end()), secret))
            }
        }
    }
}
