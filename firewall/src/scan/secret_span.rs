//! Where the secret lies inside a match that one-shot scanning has found already.
//!
//! The lazy DFA gives a try's whole match; a rule whose secret is a group then needs the
//! group's span, which only an NFA engine gives. The meta regex's capture search runs its
//! lazy DFA over the match again before its bounded backtracker, and the backtracker clears
//! a visited set of (NFA states × span) bits first: the generic rules' `{16,256}` and
//! `{20,512}` unroll into 777 and 1,082 states, so one capture of their ~80-byte matches
//! took 1.8-2.0 µs, a third of a secret-dense scan.
//!
//! [`SecretSearch`] runs a bounded backtracker straight on the match, over an NFA whose
//! wide counted repetitions lose their upper bound (`{16,256}` becomes `{16,}`). On a span
//! no longer than the smallest bound removed, that changes nothing: a repetition whose
//! every iteration consumes a byte cannot iterate more often than the span is long, so it
//! never reaches its bound, and below the bound `{m,n}` and `{m,}` prefer the same choices
//! in the same order (greedy: one more; lazy: one fewer). The groups are the same, so the
//! captures are the same; longer spans go the meta regex's way. The tests of `scan` compare
//! every capture on the labelled corpus with the meta regex's unanchored search.
//!
//! Most provider rules need no capture search at all ([`TailSplit`]): written
//! `\b(SECRET)(?:[^…]|$)`, their secret is the match less its closing character, and the
//! match's last character tells whether there is one.

use regex_automata::nfa::thompson::backtrack::{self, BoundedBacktracker};
use regex_automata::nfa::thompson::{self, NFA};
use regex_automata::util::captures::Captures;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Capture, Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Repetition};

use crate::rules::rule::REGEX_SIZE_LIMIT;

/// Counted repetitions with at least this many optional iterations lose their bound: each
/// optional iteration is an NFA state or more, and narrower ones cost little.
const RELAX_OPTIONAL: u32 = 16;

/// A capture search for matches of one rule found by its lazy DFA.
#[derive(Debug, Clone)]
pub(crate) struct SecretSearch {
    backtracker: BoundedBacktracker,
    /// Matches up to this long are searched here (the smallest bound removed).
    max_span: usize,
}

/// A thread's state for one [`SecretSearch`].
#[derive(Debug, Clone)]
pub(crate) struct SecretScratch {
    cache: backtrack::Cache,
    caps: Captures,
}

impl SecretSearch {
    /// The search for `hir`'s captures, or None when it would not be worth one (no wide
    /// repetition to relax) or the NFA does not build.
    pub(crate) fn new(hir: &Hir) -> Option<SecretSearch> {
        let mut bound = usize::MAX;
        let relaxed = relax(hir, &mut bound);
        if bound == usize::MAX {
            return None;
        }
        let nfa = NFA::compiler()
            .configure(thompson::Config::new().nfa_size_limit(Some(REGEX_SIZE_LIMIT)))
            .build_from_hir(&relaxed)
            .ok()?;
        let backtracker = BoundedBacktracker::new_from_nfa(nfa).ok()?;
        Some(SecretSearch { backtracker, max_span: bound })
    }

    pub(crate) fn scratch(&self) -> SecretScratch {
        SecretScratch { cache: self.backtracker.create_cache(), caps: self.backtracker.create_captures() }
    }

    /// The captures of the match `[start, end)` of `text`, which the rule's regex matches
    /// anchored at `start` ending at `end`; None when the span is too long for this search
    /// (the caller then asks the meta regex).
    pub(crate) fn captures<'s>(
        &self,
        text: &str,
        (start, end): (usize, usize),
        scratch: &'s mut SecretScratch,
    ) -> Option<&'s Captures> {
        if end - start > self.max_span.min(self.backtracker.max_haystack_len()) {
            return None;
        }
        let input = Input::new(text).span(start..end).anchored(Anchored::Yes);
        self.backtracker.try_search(&mut scratch.cache, &input, &mut scratch.caps).ok()?;
        Some(&scratch.caps)
    }
}

/// The secret of a rule written `LOOKS (SECRET) CLOSING`: zero-width assertions, the secret's
/// group, then an alternation of one-character classes and zero-width assertions
/// (`\b(sk-ant-api03-[A-Za-z0-9_-]{93}AA)(?:[^A-Za-z0-9_-]|$)`), where no character the
/// secret can end with is one the closing part takes.
///
/// Exact for every match `[start, end)`: the group starts at `start` (the assertions take no
/// text), and ends at `end` less one character when the closing part took one. It took one
/// exactly when the match's last character is one it takes: otherwise the last character
/// is the secret's own, which the closing part cannot take.
#[derive(Debug, Clone)]
pub(crate) struct TailSplit {
    /// The characters the closing part takes.
    closing: ClassUnicode,
}

impl TailSplit {
    /// The split for group `group` of `hir`, when `hir` has that shape.
    pub(crate) fn new(hir: &Hir, group: usize) -> Option<TailSplit> {
        let HirKind::Concat(parts) = hir.kind() else { return None };
        let (closing_part, before) = parts.split_last()?;
        let (secret, looks) = before.split_last()?;
        if !looks.iter().all(|p| matches!(p.kind(), HirKind::Look(_))) {
            return None;
        }
        let HirKind::Capture(c) = secret.kind() else { return None };
        let closing = closing_chars(closing_part)?;
        let (mut ends, may_be_empty) = last_chars(&c.sub)?;
        if c.index as usize != group || may_be_empty {
            return None;
        }
        ends.intersect(&closing);
        ends.ranges().is_empty().then_some(TailSplit { closing })
    }

    /// The secret's span in the match `[start, end)` of `text`.
    pub(crate) fn secret(&self, text: &str, (start, end): (usize, usize)) -> (usize, usize) {
        match text.get(start..end).and_then(|m| m.chars().next_back()) {
            Some(c) if self.closing.ranges().iter().any(|r| r.start() <= c && c <= r.end()) => {
                (start, end - c.len_utf8())
            }
            _ => (start, end),
        }
    }
}

/// The characters a closing part made of one-character alternatives and zero-width
/// assertions takes; None for any other part.
fn closing_chars(hir: &Hir) -> Option<ClassUnicode> {
    let alternatives = match hir.kind() {
        HirKind::Alternation(alts) => alts.as_slice(),
        _ => std::slice::from_ref(hir),
    };
    let mut set = ClassUnicode::empty();
    for a in alternatives {
        match a.kind() {
            HirKind::Look(_) => {}
            _ => set.union(&one_char(a)?),
        }
    }
    Some(set)
}

/// The characters `hir` matches when it always matches exactly one (a class, or a literal
/// of one character).
fn one_char(hir: &Hir) -> Option<ClassUnicode> {
    match hir.kind() {
        HirKind::Class(Class::Unicode(c)) => Some(c.clone()),
        HirKind::Literal(lit) => {
            let mut chars = std::str::from_utf8(&lit.0).ok()?.chars();
            let (Some(c), None) = (chars.next(), chars.next()) else { return None };
            Some(ClassUnicode::new([ClassUnicodeRange::new(c, c)]))
        }
        _ => None,
    }
}

/// Every character a non-empty match of `hir` can end with (a superset), and whether `hir`
/// can match the empty string; None for what this does not read (byte classes).
fn last_chars(hir: &Hir) -> Option<(ClassUnicode, bool)> {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Some((ClassUnicode::empty(), true)),
        HirKind::Literal(lit) => {
            let c = std::str::from_utf8(&lit.0).ok()?.chars().next_back()?;
            Some((ClassUnicode::new([ClassUnicodeRange::new(c, c)]), false))
        }
        HirKind::Class(Class::Unicode(c)) => Some((c.clone(), false)),
        HirKind::Class(Class::Bytes(_)) => None,
        HirKind::Repetition(r) => last_chars(&r.sub).map(|(set, empty)| (set, empty || r.min == 0)),
        HirKind::Capture(c) => last_chars(&c.sub),
        HirKind::Concat(parts) => {
            let mut set = ClassUnicode::empty();
            for p in parts.iter().rev() {
                let (ends, empty) = last_chars(p)?;
                set.union(&ends);
                if !empty {
                    return Some((set, false));
                }
            }
            Some((set, true))
        }
        HirKind::Alternation(alts) => {
            let (mut set, mut empty) = (ClassUnicode::empty(), false);
            for a in alts {
                let (ends, e) = last_chars(a)?;
                set.union(&ends);
                empty |= e;
            }
            Some((set, empty))
        }
    }
}

/// `hir` with the upper bound of every wide counted repetition of a part that always
/// consumes input removed; `bound` becomes the smallest bound removed.
fn relax(hir: &Hir, bound: &mut usize) -> Hir {
    match hir.kind() {
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => hir.clone(),
        HirKind::Repetition(r) => {
            let sub = relax(&r.sub, bound);
            let consumes = r.sub.properties().minimum_len().is_some_and(|n| n >= 1);
            let max = match r.max {
                Some(max) if consumes && max.saturating_sub(r.min) >= RELAX_OPTIONAL => {
                    *bound = (*bound).min(max as usize);
                    None
                }
                max => max,
            };
            Hir::repetition(Repetition { min: r.min, max, greedy: r.greedy, sub: Box::new(sub) })
        }
        HirKind::Capture(c) => {
            Hir::capture(Capture { index: c.index, name: c.name.clone(), sub: Box::new(relax(&c.sub, bound)) })
        }
        HirKind::Concat(parts) => Hir::concat(parts.iter().map(|p| relax(p, bound)).collect()),
        HirKind::Alternation(alts) => Hir::alternation(alts.iter().map(|a| relax(a, bound)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search(pattern: &str) -> (Option<SecretSearch>, regex_automata::meta::Regex) {
        let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string());
        assert!(hir.is_ok(), "{hir:?}");
        let hir = hir.unwrap_or_else(|_| Hir::empty());
        let meta = crate::rules::rule::compile_hir(&hir, false).map_err(|e| e.to_string());
        assert!(meta.is_ok(), "{meta:?}");
        (SecretSearch::new(&hir), meta.unwrap_or_else(|_| regex_automata::meta::Regex::new("x").expect("x compiles")))
    }

    /// Every group's span, None where the group took no part.
    type Groups = Vec<Option<(usize, usize)>>;

    /// Group spans of the anchored match at `start`, by the meta regex and by the search.
    fn both(pattern: &str, text: &str, start: usize) -> (Groups, Option<Groups>) {
        let (secret, meta) = search(pattern);
        let groups = |caps: &Captures| {
            (0..caps.group_len()).map(|g| caps.get_group(g).map(|s| (s.start, s.end))).collect::<Vec<_>>()
        };
        let mut caps = meta.create_captures();
        meta.search_captures(&Input::new(text).span(start..text.len()).anchored(Anchored::Yes), &mut caps);
        let want = groups(&caps);
        let end = caps.get_match().map_or(start, |m| m.end());
        let got = secret.as_ref().and_then(|s| {
            let mut scratch = s.scratch();
            s.captures(text, (start, end), &mut scratch).map(groups)
        });
        (want, got)
    }

    #[test]
    fn relaxed_repetitions_capture_what_the_bounded_ones_capture() {
        let cases = [
            // The group's greed against a bounded tail, lazy and greedy.
            (r"k=([a-z0-9]{2,40})([a-z]{0,3})\b", "k=abc123defgh xyz"),
            (r"k=([a-z0-9]{2,40}?)([a-z]{0,30})$", "k=abcdefghijklmnopqrstuvwxyz"),
            // A wide repetition inside another one, and in an alternation.
            (r"(?:(ab){1,20}|(a){1,30})(b*)", "abababab"),
            (r"x(?:[0-9]{1,20}-){1,20}([a-f]+)", "x12-345-6789-abc"),
        ];
        for (pattern, text) in cases {
            let (want, got) = both(pattern, text, 0);
            assert!(want[0].is_some(), "{pattern} must match {text:?}");
            assert_eq!(got.as_ref(), Some(&want), "{pattern} on {text:?}");
        }
    }

    #[test]
    fn only_wide_repetitions_of_consuming_parts_are_relaxed() {
        let bound = |pattern: &str| {
            let mut b = usize::MAX;
            let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string());
            assert!(hir.is_ok(), "{hir:?}");
            let _ = hir.map(|h| relax(&h, &mut b));
            b
        };
        assert_eq!(bound(r"[a-z]{16,256}"), 256);
        assert_eq!(bound(r"[a-z]{20,512}x{1,40}"), 40);
        // Too narrow, unbounded already, or iterations that may be empty: left alone.
        assert_eq!(bound(r"[a-z]{16,31}"), usize::MAX);
        assert_eq!(bound(r"[a-z]{16,}"), usize::MAX);
        assert_eq!(bound(r"(?:a?){0,64}"), usize::MAX);
        assert!(search(r"[a-z]{8}").0.is_none());
    }

    #[test]
    fn a_span_longer_than_the_bound_is_left_to_the_caller() {
        let (secret, _) = search(r"([a-z]{1,20})");
        let Some(secret) = secret else { panic!("no search built for a repetition of 19 optional iterations") };
        let text = "abcdefghijklmnopqrstuvwxyz";
        let mut scratch = secret.scratch();
        assert!(secret.captures(text, (0, 20), &mut scratch).is_some());
        assert!(secret.captures(text, (0, 21), &mut scratch).is_none());
    }

    /// The split's secret against the meta regex's capture of group 1, at every start of
    /// `text` where the pattern matches.
    fn split_agrees(pattern: &str, text: &str) -> bool {
        let (_, meta) = search(pattern);
        let hir = regex_syntax::parse(pattern).unwrap_or_else(|_| Hir::empty());
        let Some(split) = TailSplit::new(&hir, 1) else { return false };
        let mut caps = meta.create_captures();
        let mut tried = 0;
        for start in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            meta.search_captures(&Input::new(text).span(start..text.len()).anchored(Anchored::Yes), &mut caps);
            let (Some(m), Some(g)) = (caps.get_match(), caps.get_group(1)) else { continue };
            tried += 1;
            if split.secret(text, (m.start(), m.end())) != (g.start, g.end) {
                return false;
            }
        }
        tried > 0
    }

    #[test]
    fn a_secret_closed_by_a_character_it_cannot_end_with_is_the_match_less_that_character() {
        let p = r"\b(sk-[a-z0-9]{4}AA)(?:[^A-Za-z0-9_-]|$)";
        for text in ["sk-ab12AA", "sk-ab12AA ", "x sk-ab12AA\n", "sk-ab12AAé", "(sk-ab12AA)"] {
            assert!(split_agrees(p, text), "{text:?}");
        }
        // Closing parts of literals and several classes, assertions in front.
        assert!(split_agrees(r#"\b(tok_[a-f]{3}9)(?:"|'|[\s,]|$)"#, "x tok_abc9\" and tok_fed9"));
        assert!(split_agrees(r"(?m)^\b(k[0-9]+)(?:[^0-9]|$)", "k123\nk4 k5"));
    }

    #[test]
    fn a_secret_the_closing_part_could_end_is_left_to_the_capture_search() {
        let split = |p: &str| TailSplit::new(&regex_syntax::parse(p).unwrap_or_else(|_| Hir::empty()), 1).is_some();
        // The closing class takes what the secret can end with (`-`), or nothing but an
        // assertion is no split's business, or text comes before the group.
        assert!(!split(r"\b(sk-[a-z]{4}-?)(?:[^a-z]|$)"));
        assert!(!split(r"(?:^|[^a-z])(sk-[a-z]{4})(?:[^a-z]|$)"));
        assert!(!split(r"\b(sk-[a-z]{4})(?:[^a-z]{2}|$)"));
        assert!(!split(r"\b(sk-[a-z]*)(?:[^a-z]|$)"));
        assert!(split(r"\b(sk-[a-z]{4})(?:[^a-z]|$)"));
    }
}
