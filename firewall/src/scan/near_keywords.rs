//! One-shot search of one rule near its keyword hits, instead of over the whole text.
//!
//! The matching semantics (see `scan`) are a left-to-right walk over start positions: at
//! each position the rule's regex is tried *anchored*; a match holding a keyword is taken
//! and the walk jumps to its end, anything else moves on by one character. Only positions
//! whose match holds a keyword can yield a finding, so the walk may skip every other
//! position without changing a single result.
//!
//! For a rule whose keyword reach is `P` (every match has a keyword starting at most `P`
//! bytes after its start, see `keyword_reach`), every match starts within `[hit - P, hit]` of a
//! keyword hit. Every byte between such a start and the hit is part of the match, so a
//! region also ends, going back, at the last byte no match of the rule can hold (a newline,
//! for the generic `password = …` rules). Those *regions*, merged, are the only positions
//! tried here. A rule without a bounded reach is walked over the whole text by the caller
//! with an unanchored search, which visits the same positions in one pass. Inside a region, a position where no match
//! can start (by its byte and, for matches opening with `^` or `\b`, the byte before; see
//! `start_filter`) is skipped without a try: the regex would fail there anyway.
//!
//! Invariant: for any text, [`RuleSearch::walk_regions`] reports exactly the matches that
//! the unanchored walk over the whole text (`scan::rule_matches`) reports; the tests of
//! `scan` check it on the labelled corpus with every default rule.

use regex_automata::meta::Regex as MetaRegex;
use regex_automata::util::captures::Captures;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Class, Hir, HirKind};

use crate::rules::rule::RuleRegex;
use crate::scan::secret_span::{SecretScratch, SecretSearch, SecretSplit};
use crate::scan::start_filter::StartFilter;

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
    regex: RuleRegex,
    /// The rule's `scan_group`: the secret's capture group, 0 when the match is the secret.
    group: usize,
    /// Where the group lies when the match alone tells (most rules; see `secret_span`).
    split: Option<SecretSplit>,
    /// The capture search for the group, where the meta regex's would cost more.
    secret: Option<SecretSearch>,
    /// Upper bound on the offset of the first keyword in any match; `None`: unbounded.
    pub(crate) reach: Option<usize>,
    /// Where a match can start (a superset), to skip tries that cannot match.
    starts: StartFilter,
    /// Every byte that can occur inside a match (a superset): a match that starts before a
    /// keyword hit holds every byte between, so a region ends, going back from its hit, at
    /// the first byte outside this set (a newline, for most generic rules).
    inside: [bool; 256],
}

impl RuleSearch {
    /// `regex` is the rule's compiled `hir`; `split`, the rule's [`SecretSplit`] if it has one.
    pub(crate) fn new(
        regex: RuleRegex,
        hir: &Hir,
        group: usize,
        split: Option<SecretSplit>,
        reach: Option<usize>,
        starts: StartFilter,
    ) -> RuleSearch {
        let mut inside = [false; 256];
        add_match_bytes(hir, &mut inside);
        // Only walks with a bounded reach run capture searches here. A split that cannot
        // tell where its secret starts (under 3 % of such matches on the corpus) leaves it
        // to the meta regex: too rare to build a search of its own for.
        let split = if group != 0 { split } else { None };
        let secret = if group != 0 && reach.is_some() && split.is_none() { SecretSearch::new(hir) } else { None };
        RuleSearch { regex, group, reach, starts, inside, split, secret }
    }

    /// Whether the secret's span comes from the match alone ([`SecretSplit`]), always or
    /// where the part before the secret can end in one place only.
    #[cfg(test)]
    pub(crate) fn splits(&self) -> (bool, bool) {
        (self.split.as_ref().is_some_and(SecretSplit::always_splits), self.split.is_some())
    }

    /// Merges the start regions of the keyword hits in `text`, `(start, end)` sorted by
    /// start: `[start - reach, start]`, cut after the last byte before the hit that no
    /// match can hold. Sets `out` to inclusive `(first, last)` start positions; empty
    /// without a bounded reach.
    pub(crate) fn regions(&self, text: &[u8], hits: &[(usize, usize)], out: &mut Vec<(usize, usize)>) {
        out.clear();
        let Some(reach) = self.reach else { return };
        for &(h, _) in hits {
            let furthest = h.saturating_sub(reach);
            let before = text.get(furthest..h).unwrap_or(&[]);
            let a = before.iter().rposition(|&b| !self.inside[usize::from(b)]).map_or(furthest, |i| furthest + i + 1);
            match out.last_mut() {
                Some(last) if a <= last.1 + 1 => last.1 = last.1.max(h),
                _ => out.push((a, h)),
            }
        }
    }

    /// Captures for [`RuleSearch::walk_regions`]; None when the secret is the whole match
    /// (or the regex does not compile).
    fn captures(&self) -> Option<CaptureScratch> {
        let regex = self.regex.get()?;
        (self.group != 0).then(|| CaptureScratch {
            meta: regex.create_captures(),
            secret: self.secret.as_ref().map(SecretSearch::scratch),
        })
    }

    /// Walks the start positions of `regions` (sorted, disjoint) in `text`, trying the
    /// regex anchored at each; `take` judges every match found. `caps` is this rule's
    /// capture scratch, made by its first walk and kept between walks (making it
    /// allocates, and compiles a regex whose compiling was put off).
    pub(crate) fn walk_regions(
        &self,
        text: &str,
        regions: &[(usize, usize)],
        caps: &mut Option<CaptureScratch>,
        mut take: impl FnMut(Found) -> Verdict,
    ) {
        let Some(regex) = self.regex.get() else { return };
        if caps.is_none() {
            *caps = self.captures();
        }
        let bytes = text.as_bytes();
        let mut at = 0;
        for &(first, last) in regions {
            let mut s = first.max(at);
            while s <= last && s < bytes.len() {
                if !self.starts.may_start_at(bytes, s) || !text.is_char_boundary(s) {
                    s += 1;
                    continue;
                }
                let Some(found) = self.anchored_at(regex, text, s, caps.as_mut()) else {
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
    fn anchored_at(&self, regex: &MetaRegex, text: &str, s: usize, caps: Option<&mut CaptureScratch>) -> Option<Found> {
        let input = Input::new(text).span(s..text.len()).anchored(Anchored::Yes);
        match caps {
            None => regex.search(&input).map(|m| ((m.start(), m.end()), (m.start(), m.end()))),
            Some(CaptureScratch { meta, secret }) => {
                // The lazy DFA rules out most tries; captures run on the match it found
                // (an anchored capture search of the whole rest would go by the slower
                // one-pass engine, failures included).
                let end = regex.search_half(&input)?.offset();
                if let Some(secret) = self.split.as_ref().and_then(|split| split.secret(text, (s, end))) {
                    return Some(((s, end), secret));
                }
                if let (Some(search), Some(scratch)) = (&self.secret, secret.as_mut()) {
                    if let Some(caps) = search.captures(text, (s, end), scratch) {
                        return found_in(caps, self.group);
                    }
                }
                regex.search_captures(&input.span(s..end), meta);
                found_in(meta, self.group)
            }
        }
    }
}

/// What a thread keeps between the capture searches of one rule.
#[derive(Debug, Clone)]
pub(crate) struct CaptureScratch {
    meta: Captures,
    secret: Option<SecretScratch>,
}

/// The match in `caps` and its secret (group `secret_group`, or the whole match when that
/// group took no part).
pub(crate) fn found_in(caps: &Captures, secret_group: usize) -> Option<Found> {
    let m = caps.get_match()?;
    let secret = caps.get_group(secret_group).map_or((m.start(), m.end()), |g| (g.start, g.end));
    Some(((m.start(), m.end()), secret))
}

/// Marks every byte that can occur in a match of `hir` (non-ASCII characters as every byte
/// from 0x80: their UTF-8 encodings).
fn add_match_bytes(hir: &Hir, set: &mut [bool; 256]) {
    let mut mark = |lo: u8, hi: u8| set[usize::from(lo)..=usize::from(hi)].iter_mut().for_each(|b| *b = true);
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(lit) => lit.0.iter().for_each(|&b| mark(b, b)),
        HirKind::Class(Class::Bytes(c)) => c.iter().for_each(|r| mark(r.start(), r.end())),
        HirKind::Class(Class::Unicode(c)) => {
            for r in c.iter() {
                let (lo, hi) = (u32::from(r.start()), u32::from(r.end()));
                if lo < 0x80 {
                    mark(lo as u8, hi.min(0x7F) as u8);
                }
                if hi >= 0x80 {
                    mark(0x80, 0xFF);
                }
            }
        }
        HirKind::Repetition(r) => add_match_bytes(&r.sub, set),
        HirKind::Capture(c) => add_match_bytes(&c.sub, set),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => parts.iter().for_each(|p| add_match_bytes(p, set)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(pattern: &str, reach: usize) -> RuleSearch {
        let hir = regex_syntax::parse(pattern).expect("pattern parses");
        let regex = crate::rules::rule::compile_hir(&hir, false).expect("pattern compiles");
        RuleSearch::new(RuleRegex::compiled(regex), &hir, 0, None, Some(reach), StartFilter::of(&hir))
    }

    #[test]
    fn a_region_stops_at_a_byte_no_match_can_hold() {
        let s = search(r"(?m)(?:^|[ \t])[a-z_]{0,40}password[ \t]*=[ \t]*[^\s]{8,}", 64);
        assert!(
            s.inside[usize::from(b'_')]
                && s.inside[usize::from(b' ')]
                && s.inside[0x80]
                && !s.inside[usize::from(b'\n')]
        );
        let text = b"x = 1\n    db_password = hunter2hunter2";
        let hit = 13;
        assert_eq!(&text[hit..hit + 8], b"password");
        // Back from the hit to just after the newline, not 64 bytes (the text's start).
        let regions = |s: &RuleSearch, text: &[u8], hits: &[(usize, usize)]| {
            let mut out = vec![(99, 99)];
            s.regions(text, hits, &mut out);
            out
        };
        assert_eq!(regions(&s, text, &[(hit, hit + 8)]), vec![(6, hit)]);
        // Without a byte outside the set, the reach alone bounds the region.
        assert_eq!(regions(&s, &text[6..], &[(hit - 6, hit + 2)]), vec![(0, hit - 6)]);
        assert_eq!(regions(&search("a[^\n]*password", 4), text, &[(hit, hit + 8)]), vec![(hit - 4, hit)]);
    }
}
