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
//! Within one *run* (the bytes from a start up to the first byte that no match can hold
//! anywhere but at its very end, see [`RuleSearch::new`]'s `inner` set, or up to the first
//! byte after the start that a match can hold only as its first, the `after_first` set: the
//! newline of `(?:^|\n)…`) every try may read to the run's end. A text made of keyword hits
//! whose match never completes (`token=` a hundred thousand times, then `<`) would make each
//! try read the rest of the run, and the walk quadratic in the text. So after [`TRIES_PER_RUN`] tries in one run, the rest of the
//! run is searched unanchored, in one pass over it: its leftmost match is the first
//! position's anchored match that the walk would find (leftmost-first), and the positions
//! before it have none. The walk reads every byte at most `TRIES_PER_RUN + 1` times, plus
//! the matches it steps back into after passing them.
//!
//! Invariant: for any text, [`RuleSearch::walk_regions`] reports exactly the matches that
//! the unanchored walk over the whole text (`scan::rule_matches`) reports; the tests of
//! `scan` check it on the labelled corpus with every default rule, and on texts built from
//! every rule's samples to make the walk read as much as it can.

use std::sync::OnceLock;

use regex_automata::util::captures::Captures;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Class, Hir, HirKind};

use crate::rules::rule::{ForwardCaches, Rule, RuleRegex};
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
    /// The capture search for the group where the match alone does not tell it, built by
    /// the first such match; None where it does not build (the meta regex captures then).
    secret: OnceLock<Option<SecretSearch>>,
    /// Upper bound on the offset of the first keyword in any match; `None`: unbounded.
    pub(crate) reach: Option<usize>,
    /// Where a match can start (a superset), to skip tries that cannot match.
    starts: StartFilter,
    /// Every match starts at a line's start (`(?m)^…`): a region is the line starts before
    /// its hit, not every byte between (most hits have one, and the rest would each be
    /// looked up in `starts` to be turned down).
    line_starts_only: bool,
    /// Every byte that can occur inside a match (a superset): a match that starts before a
    /// keyword hit holds every byte between, so a region ends, going back from its hit, at
    /// the first byte outside this set (a newline, for most generic rules).
    inside: [bool; 256],
    /// Every byte that can occur in a match before its last byte (a superset): a match
    /// ends at the latest just after the first byte outside this set. Narrower than
    /// `inside` for rules that close with a class such as `[^A-Za-z0-9]`.
    inner: [bool; 256],
    /// Every byte that can occur in a match after its first byte (a superset): a match
    /// that starts before such a byte's position cannot hold it. Narrower than `inner` for
    /// rules that open with a class such as `(?:^|[\s>*(])`, whose newline would otherwise
    /// make the whole text one run.
    after_first: [bool; 256],
    /// The bytes outside `inner` or `after_first`, the ones that can end a run, when few.
    enders: RunEnders,
}

/// Anchored tries in one run before the rest of the run is searched in one unanchored pass
/// (see the module docs). Most runs see one or two; a handful keeps the tries' early exits
/// for ordinary text.
pub(crate) const TRIES_PER_RUN: usize = 8;

// What the tests bound: the bytes each search of the current walk may read (a try, to its
// run's end; a pass, to the end of the match it found or of the run), and the most any walk
// read per byte of its text.
#[cfg(test)]
thread_local! {
    static WALK_READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(crate) static MOST_READ_PER_BYTE: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

#[cfg(test)]
fn may_read(n: usize) {
    WALK_READ.with(|c| c.set(c.get() + n));
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
        let (mut inside, mut inner, mut after_first) = ([false; 256], [false; 256], [false; 256]);
        add_match_bytes(hir, &mut inside);
        add_bytes_off_edge(hir, Edge::Last, &mut inner);
        add_bytes_off_edge(hir, Edge::First, &mut after_first);
        let split = if group != 0 { split } else { None };
        let secret = OnceLock::new();
        let enders = RunEnders::of(&inner, &after_first);
        let line_starts_only = starts.at_line_starts_only();
        RuleSearch { regex, group, reach, starts, line_starts_only, inside, inner, after_first, enders, split, secret }
    }

    /// `rule`'s search: its regex, secret group and split, keyword reach and start filter.
    pub(crate) fn for_rule(rule: &Rule) -> RuleSearch {
        let hir = rule.hir();
        let reach = rule.regex.keyword_reach();
        RuleSearch::new(rule.regex.clone(), hir, rule.scan_group(), rule.split().cloned(), reach, StartFilter::of(hir))
    }

    /// The byte sets that bound this rule's runs.
    fn run_bytes(&self) -> RunBytes<'_> {
        RunBytes { inner: &self.inner, after_first: &self.after_first, enders: &self.enders }
    }

    /// Whether the secret's span comes from the match alone ([`SecretSplit`]), always or
    /// where the part before the secret can end in one place only.
    #[cfg(test)]
    pub(crate) fn splits(&self) -> (bool, bool) {
        (self.split.as_ref().is_some_and(SecretSplit::always_splits), self.split.is_some())
    }

    /// Merges the start regions of the keyword hits in `text`, `(start, end)` sorted by
    /// start: `[start - reach, start]`, cut after the last byte before the hit that no
    /// match can hold, and for a rule whose matches start at lines only, just the line
    /// starts in it. Sets `out` to inclusive `(first, last)` start positions; empty
    /// without a bounded reach.
    pub(crate) fn regions(&self, text: &[u8], hits: &[(usize, usize)], out: &mut Vec<(usize, usize)>) {
        out.clear();
        let Some(reach) = self.reach else { return };
        for &(h, _) in hits {
            let furthest = h.saturating_sub(reach);
            let before = text.get(furthest..h).unwrap_or(&[]);
            let a = before.iter().rposition(|&b| !self.inside[usize::from(b)]).map_or(furthest, |i| furthest + i + 1);
            if self.line_starts_only {
                let line_start = |s: usize| s == 0 || matches!(text.get(s - 1), Some(b'\n' | b'\r'));
                let breaks = memchr::memchr2_iter(b'\n', b'\r', text.get(a..h).unwrap_or(&[])).map(|i| a + i + 1);
                for s in std::iter::once(a).filter(|&s| line_start(s)).chain(breaks) {
                    push_region(out, (s, s));
                }
            } else {
                push_region(out, (a, h));
            }
        }
    }

    /// Walks the start positions of `regions` (sorted, disjoint) in `text`, trying the
    /// regex anchored at each; `take` judges every match found. `scratch` is this rule's,
    /// filled by its first walk and kept between walks (making its parts allocates, and a
    /// capture search compiles a regex whose compiling was put off).
    pub(crate) fn walk_regions(
        &self,
        text: &str,
        regions: &[(usize, usize)],
        scratch: &mut RuleScratch,
        mut take: impl FnMut(Found) -> Verdict,
    ) {
        #[cfg(test)]
        WALK_READ.with(|c| c.set(0));
        let bytes = text.as_bytes();
        let mut run = Run::default();
        let mut at = 0;
        for &(first, last) in regions {
            let mut s = first.max(at);
            while s <= last && s < bytes.len() {
                let next = match run.ahead {
                    // A pass over this run found no match starting before `until`.
                    Some(Ahead { from, until, .. }) if from <= s && s < until => Next::From(until),
                    Some(Ahead { from, until, next: Some(found) }) if from <= s && s == until => Next::Match(found),
                    _ => match run.pass_end(s, bytes, self.run_bytes(), text) {
                        Some(end) => {
                            let ahead = self.leftmost_in(text, (s, end), scratch);
                            run.ahead = Some(ahead);
                            match ahead.next {
                                Some(found) if found.0 .0 == s => Next::Match(found),
                                _ => Next::From(ahead.until),
                            }
                        }
                        None => {
                            if !self.starts.may_start_at(bytes, s) || !text.is_char_boundary(s) {
                                s += 1;
                                continue;
                            }
                            run.tried(s);
                            #[cfg(test)]
                            may_read(run_end(s, bytes, self.run_bytes(), text) - s);
                            match self.anchored_at(text, s, scratch) {
                                Some(found) => Next::Match(found),
                                None => Next::From(s + 1),
                            }
                        }
                    },
                };
                s = match next {
                    Next::From(p) => p,
                    // Rules never match the empty string (the loader rejects them).
                    Next::Match(found) => match take(found) {
                        Verdict::Taken => found.0 .1.max(s + 1),
                        Verdict::Passed => s + 1,
                    },
                };
            }
            at = at.max(s);
        }
        #[cfg(test)]
        MOST_READ_PER_BYTE.with(|most| {
            let per_byte = WALK_READ.with(std::cell::Cell::get) as f64 / text.len().max(1) as f64;
            most.set(most.get().max(per_byte));
        });
    }

    /// The leftmost match starting in `[s, end)`, found by one unanchored search of that
    /// span, `end` the end of the run that holds `s` (no match starting there reads past
    /// it). A match that starts inside a character is skipped, as the walk skips such
    /// positions.
    fn leftmost_in(&self, text: &str, (mut s, end): (usize, usize), scratch: &mut RuleScratch) -> Ahead {
        let from = s;
        let Some(regex) = self.regex.get() else { return Ahead { from, until: end, next: None } };
        while s < end {
            let input = Input::new(text).span(s..end);
            let Some(m) = regex.search(&input) else {
                break;
            };
            if !text.is_char_boundary(m.start()) {
                s = m.start() + 1;
                continue;
            }
            #[cfg(test)]
            may_read(m.end() - from);
            let found = self.secret_of(text, (m.start(), m.end()), scratch);
            return Ahead { from, until: m.start(), next: found };
        }
        #[cfg(test)]
        may_read(end - from);
        Ahead { from, until: end, next: None }
    }

    /// The leftmost-first match starting exactly at `s`, seeing the whole text around it.
    fn anchored_at(&self, text: &str, s: usize, scratch: &mut RuleScratch) -> Option<Found> {
        // The forward search rules out most tries; captures, where the match alone does not
        // tell the secret, run on the match it found.
        let input = Input::new(text).span(s..text.len()).anchored(Anchored::Yes);
        let end = self.regex.anchored_end(&input, &mut scratch.forward)?;
        self.secret_of(text, (s, end), scratch)
    }

    /// The match `(s, end)` with its secret's span: the whole match, or the group read
    /// from the match alone ([`SecretSplit`]), or by a capture search of just the match.
    fn secret_of(&self, text: &str, (s, end): (usize, usize), scratch: &mut RuleScratch) -> Option<Found> {
        if self.group == 0 {
            return Some(((s, end), (s, end)));
        }
        let RuleScratch { meta, secret, .. } = scratch;
        if let Some(secret) = self.split.as_ref().and_then(|split| split.secret(text, (s, end))) {
            return Some(((s, end), secret));
        }
        if let Some(search) = self.secret.get_or_init(|| SecretSearch::new(self.regex.hir())) {
            let scratch = secret.get_or_insert_with(|| search.scratch());
            if let Some(caps) = search.captures(text, (s, end), scratch) {
                return found_in(caps, self.group);
            }
        }
        let regex = self.regex.get()?;
        let meta = meta.get_or_insert_with(|| regex.create_captures());
        regex.search_captures(&Input::new(text).span(s..end).anchored(Anchored::Yes), meta);
        found_in(meta, self.group)
    }
}

/// Adds `(first, last)` to sorted regions, merged with the last one where they touch.
fn push_region(out: &mut Vec<(usize, usize)>, (first, last): (usize, usize)) {
    match out.last_mut() {
        Some(prev) if first <= prev.1 + 1 => prev.1 = prev.1.max(last),
        _ => out.push((first, last)),
    }
}

/// What the walk does at a position: go on from a later one, or judge a match there.
enum Next {
    From(usize),
    Match(Found),
}

/// The run the walk is in (see the module docs): where its tries began, how many there
/// were, its end once asked for, and what an unanchored pass over its rest found.
#[derive(Default)]
struct Run {
    start: usize,
    tries: usize,
    end: Option<usize>,
    ahead: Option<Ahead>,
}

/// An unanchored pass's result: no match starts in `[from, until)`; `next`, the match at
/// `until` (none: the pass reached the run's end, `until`).
#[derive(Clone, Copy)]
struct Ahead {
    from: usize,
    until: usize,
    next: Option<Found>,
}

impl Run {
    /// Counts a try at `s`.
    fn tried(&mut self, s: usize) {
        if self.tries == 0 {
            self.start = s;
        }
        self.tries += 1;
    }

    /// Where a pass from `s` must end, once the run holding `s` has had its
    /// [`TRIES_PER_RUN`] tries; `None`: try `s` anchored. The end is looked for only then
    /// (most rules never get there), from the first try's position, and tries made in an
    /// earlier run start the count again.
    fn pass_end(&mut self, s: usize, bytes: &[u8], run_bytes: RunBytes<'_>, text: &str) -> Option<usize> {
        if self.tries < TRIES_PER_RUN {
            return None;
        }
        let end = *self.end.get_or_insert_with(|| run_end(self.start, bytes, run_bytes, text));
        if s < end {
            return Some(end);
        }
        *self = Run::default();
        None
    }
}

/// The byte sets that bound a run: `inner` and `after_first` of [`RuleSearch`].
#[derive(Clone, Copy)]
struct RunBytes<'a> {
    inner: &'a [bool; 256],
    after_first: &'a [bool; 256],
    enders: &'a RunEnders,
}

/// The bytes that can end a run, when there are at most three: those are looked for with
/// `memchr` rather than a table look-up per byte. A rule whose matches hold every byte but
/// a newline, or every byte, has runs as long as a file's lines or as the file: a byte at a
/// time, those runs cost a fifth of a scan of one large source file.
#[derive(Debug, Clone, PartialEq)]
enum RunEnders {
    /// No byte ends a run: it ends with the text.
    None,
    Few(Vec<u8>),
    Many,
}

impl RunEnders {
    fn of(inner: &[bool; 256], after_first: &[bool; 256]) -> RunEnders {
        let enders: Vec<u8> =
            (0..=u8::MAX).filter(|&b| !inner[usize::from(b)] || !after_first[usize::from(b)]).collect();
        match enders.len() {
            0 => RunEnders::None,
            1..=3 => RunEnders::Few(enders),
            _ => RunEnders::Many,
        }
    }
}

/// The end of the run holding `s`: just after the first byte at or after `s` outside
/// `inner` (at the next character boundary), or at the first byte after `s` outside
/// `after_first` (a match that starts before it cannot hold it), or the text's end. No
/// match starting in `[s, end)` reads past it.
fn run_end(s: usize, bytes: &[u8], sets: RunBytes<'_>, text: &str) -> usize {
    let rest = bytes.get(s..).unwrap_or_default();
    let ends = |i: usize, b: u8| !sets.inner[usize::from(b)] || i > 0 && !sets.after_first[usize::from(b)];
    let first_end = match sets.enders {
        RunEnders::None => None,
        RunEnders::Many => rest.iter().enumerate().position(|(i, &b)| ends(i, b)),
        // Every ender ends a run past its first byte; at the first, one that only
        // `after_first` leaves out does not.
        RunEnders::Few(enders) => {
            let find = |from: usize| {
                let hay = rest.get(from..).unwrap_or_default();
                let found = match enders[..] {
                    [a] => memchr::memchr(a, hay),
                    [a, b] => memchr::memchr2(a, b, hay),
                    [a, b, c, ..] => memchr::memchr3(a, b, c, hay),
                    [] => None,
                };
                found.map(|i| from + i)
            };
            find(0).and_then(|i| if ends(i, rest[i]) { Some(i) } else { find(i + 1) })
        }
    };
    match first_end {
        // A byte only a first byte can be is ASCII (`add_bytes_off_edge` keeps every byte
        // from 0x80), so its position is a character boundary; the run ends before it.
        Some(i) if i > 0 && !sets.after_first[usize::from(rest[i])] => s + i,
        Some(i) => (s + i + 1..=text.len()).find(|&e| text.is_char_boundary(e)).unwrap_or(text.len()),
        None => text.len(),
    }
}

/// What a thread keeps between the searches of one rule.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleScratch {
    /// The anchored tries' caches, kept here: taking them from the regex's pool at each of
    /// some 30,000 tries per MB of a secret-dense scan cost 0.8 % of its instructions.
    forward: Option<ForwardCaches>,
    /// Made by the first capture search of the meta regex (most rules never run one).
    meta: Option<Captures>,
    /// Made with the rule's [`SecretSearch`].
    secret: Option<SecretScratch>,
}

/// The match in `caps` and its secret (group `secret_group`, or the whole match when that
/// group took no part).
pub(crate) fn found_in(caps: &Captures, secret_group: usize) -> Option<Found> {
    let m = caps.get_match()?;
    let secret = caps.get_group(secret_group).map_or((m.start(), m.end()), |g| (g.start, g.end));
    Some(((m.start(), m.end()), secret))
}

/// The end of a match whose byte [`add_bytes_off_edge`] leaves out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Edge {
    First,
    Last,
}

/// Marks every byte that can occur in a match of `hir` other than as its `edge` byte (a
/// superset): every byte of the parts on the far side of the part that holds the edge,
/// and what that part holds besides its own edge byte. With [`Edge::Last`], the bytes a
/// match holds before its last (`inner`); with [`Edge::First`], those after its first
/// (`after_first`): a one-byte opening class such as `(?:^|[\s>*(])` holds only the first.
/// A class of non-ASCII characters marks every byte from 0x80 (their other UTF-8 bytes).
fn add_bytes_off_edge(hir: &Hir, edge: Edge, set: &mut [bool; 256]) {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => {}
        HirKind::Literal(lit) => {
            let rest = match edge {
                Edge::First => lit.0.get(1..),
                Edge::Last => lit.0.split_last().map(|(_, before)| before),
            };
            rest.unwrap_or_default().iter().for_each(|&b| set[usize::from(b)] = true);
        }
        HirKind::Class(_) => {
            if hir.properties().maximum_len() != Some(1) {
                set[0x80..].iter_mut().for_each(|b| *b = true);
            }
        }
        HirKind::Repetition(r) if r.max == Some(1) => add_bytes_off_edge(&r.sub, edge, set),
        HirKind::Repetition(r) if r.max == Some(0) => {}
        HirKind::Repetition(r) => add_match_bytes(&r.sub, set),
        HirKind::Capture(c) => add_bytes_off_edge(&c.sub, edge, set),
        HirKind::Alternation(parts) => parts.iter().for_each(|p| add_bytes_off_edge(p, edge, set)),
        HirKind::Concat(parts) => {
            // Zero-width parts at the edge (`^`, `$`, `\b`) hold no byte: the part next to
            // them holds the edge byte.
            let holds = |p: &Hir| p.properties().maximum_len() != Some(0);
            let at = match edge {
                Edge::First => parts.iter().position(holds),
                Edge::Last => parts.iter().rposition(holds),
            };
            for (i, p) in parts.iter().enumerate() {
                match at {
                    Some(e) if i == e => add_bytes_off_edge(p, edge, set),
                    Some(e) if (edge == Edge::First) == (i > e) => add_match_bytes(p, set),
                    _ => {}
                }
            }
        }
    }
}

/// Whether a match of `hir` can hold a newline after its first byte: its runs can be the
/// whole text, so an unanchored pass over one reads to the text's end unless a literal
/// prefilter skips ahead.
pub(crate) fn spans_lines(hir: &Hir) -> bool {
    let mut after_first = [false; 256];
    add_bytes_off_edge(hir, Edge::First, &mut after_first);
    after_first[usize::from(b'\n')]
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
    use crate::rules::rule::Parsed;

    fn search(pattern: &str, reach: usize) -> RuleSearch {
        let hir = regex_syntax::parse(pattern).expect("pattern parses");
        let regex = RuleRegex::compiled(Parsed::new(hir.clone(), 0), &[]).expect("pattern compiles");
        RuleSearch::new(regex, &hir, 0, None, Some(reach), StartFilter::of(&hir))
    }

    /// A pass searches only its run, `[s, end)`, and must find there what a search of the
    /// whole rest would: assertions at the span's end see the text after it.
    #[test]
    fn assertions_at_a_spans_end_see_the_text_after_it() {
        let text = "ab abc";
        for (pattern, matches) in [("ab$", false), (r"ab\b", false), ("ab", true), (r"(?m)ab(?:[^a-z]|$)", false)] {
            let hir = regex_syntax::parse(pattern).expect("pattern parses");
            let regex = crate::rules::rule::compile_hir(&hir, false).expect("pattern compiles");
            let found = regex.search(&Input::new(text).span(3..5));
            assert_eq!(found.is_some(), matches, "{pattern}");
        }
    }

    #[test]
    fn a_match_ends_at_the_latest_just_after_the_first_byte_only_its_end_can_hold() {
        let inner = |pattern: &str| {
            let mut set = [false; 256];
            add_bytes_off_edge(&regex_syntax::parse(pattern).expect("pattern parses"), Edge::Last, &mut set);
            set
        };
        // The closing class holds `,` and `\n`, but only as the last byte.
        let token = inner(r"token[ \t]*[:=][ \t]*([A-Za-z0-9_=]{20,})(?:[^A-Za-z0-9_=<(]|$)");
        for b in *b"tokenTOK_=az09 \t:" {
            assert!(token[usize::from(b)], "{}", b as char);
        }
        for b in *b",\n<(;\"" {
            assert!(!token[usize::from(b)], "{}", b as char);
        }
        // A literal's last byte, and a trailing assertion that holds no byte.
        let lit = inner(r"\bkey\b");
        assert!(lit[usize::from(b'k')] && lit[usize::from(b'e')] && !lit[usize::from(b'y')]);
        // Non-ASCII characters' leading bytes; a repeated class's every byte.
        let cyr = inner("[а-я]x");
        assert!(cyr[0xD0] && cyr[0xB0] && !cyr[usize::from(b'x')]);
    }

    #[test]
    fn a_run_ends_before_a_byte_only_a_first_byte_can_be() {
        let s = search(r"(?:^|[\s>*(])(?i:login)[ \t]*:[ \t]*[A-Za-z0-9_.@-]{1,64}[ \t]*/[ \t]*([^\s/]{6,})", 8);
        // The opening class holds a newline, but only as a match's first byte.
        assert!(s.inner[usize::from(b'\n')] && !s.after_first[usize::from(b'\n')]);
        assert!(s.after_first[usize::from(b'/')] && s.after_first[usize::from(b'l')]);
        let text = "\nLogin: admin / Tq9Wz4Kv7Lx2\nsecond line, no pair\n";
        // From the first newline, the run is that line: a match starting in it cannot hold
        // the next newline, though one starting at that newline may.
        assert_eq!(run_end(0, text.as_bytes(), s.run_bytes(), text), text[1..].find('\n').map_or(0, |i| i + 1));
        // A pattern whose matches hold newlines anywhere runs to the text's end.
        let pem = search(r"-----BEGIN PRIVATE KEY-----(?:\s|\\n)+([A-Za-z0-9+/=]{40,})", 0);
        assert!(pem.after_first[usize::from(b'\n')]);
        assert!(spans_lines(&regex_syntax::parse(r"variable[ \t]+\{[^}]*default").expect("parses")));
        assert!(!spans_lines(&regex_syntax::parse(r"(?:^|\n)login: ([^\s]{6,})").expect("parses")));
    }

    #[test]
    fn runs_end_where_a_byte_at_a_time_would_end_them() {
        let text = "key: a\r\nb é\tc\n\nopen \"quoted\" (x) / y\nlast";
        for (pattern, enders) in [
            (r"(?s)-----BEGIN PRIVATE KEY-----.{0,64}END", "none"),
            (r"(?m)(?:^|[ \t])key:[^\n]*", "few"),
            (r"(?:^|[\s>*(])(?i:key)[ \t]*:[ \t]*([^\s/]{6,})", "many"),
            (r"\nkey[^\n]{0,8}", "few"),
        ] {
            let s = search(pattern, 8);
            let kind = match s.enders {
                RunEnders::None => "none",
                RunEnders::Few(_) => "few",
                RunEnders::Many => "many",
            };
            assert_eq!(kind, enders, "{pattern}");
            let byte_at_a_time = RunEnders::Many;
            let slow = RunBytes { enders: &byte_at_a_time, ..s.run_bytes() };
            for at in (0..text.len()).filter(|&at| text.is_char_boundary(at)) {
                let (fast, slow) =
                    (run_end(at, text.as_bytes(), s.run_bytes(), text), run_end(at, text.as_bytes(), slow, text));
                assert_eq!(fast, slow, "{pattern} from {at}");
            }
        }
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

    #[test]
    fn a_rule_that_starts_at_lines_tries_only_the_line_starts_before_its_hits() {
        let s = search(r"(?m)^[ \t]{0,16}(?:[a-z]{1,24}[ \t._-]?)?secret[ \t]+[A-Za-z0-9]{8,}\r?$", 48);
        assert!(s.line_starts_only);
        let text = b"x\n  app secret Tq9Wz4Kv7Lx2\r\nsecret Wq7Kz2Tv9Lx4\nno secret here";
        let hits: Vec<(usize, usize)> =
            (0..text.len() - 6).filter(|&i| &text[i..i + 6] == b"secret").map(|i| (i, i + 6)).collect();
        let mut out = Vec::new();
        s.regions(text, &hits, &mut out);
        // The line of each hit, once each; a line that starts past the reach has none.
        assert_eq!(out, vec![(2, 2), (29, 29), (49, 49)]);
        let mut found = Vec::new();
        s.walk_regions(std::str::from_utf8(text).unwrap_or(""), &out, &mut RuleScratch::default(), |f| {
            found.push(f.0);
            Verdict::Taken
        });
        assert_eq!(found, vec![(2, 28), (29, 48)]);
        // At the text's start, and past the reach: nothing before the line's start is tried.
        s.regions(b"secret Tq9Wz4Kv7Lx2", &[(0, 6)], &mut out);
        assert_eq!(out, vec![(0, 0)]);
        let far = [b"x".repeat(60), b" secret Tq9Wz4Kv7Lx2".to_vec()].concat();
        s.regions(&far, &[(61, 67)], &mut out);
        assert_eq!(out, vec![]);
    }
}
