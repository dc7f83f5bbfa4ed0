//! Where the secret lies inside a match that one-shot scanning has found already.
//!
//! The lazy DFA gives a try's whole match; a rule whose secret is a group then needs the
//! group's span, which only an NFA engine gives. The meta regex's capture search runs its
//! lazy DFA over the match again before its bounded backtracker, and the backtracker clears
//! a visited set of (NFA states × span) bits first: the generic rules' `{16,256}` and
//! `{20,512}` unroll into 777 and 1,082 states, so one capture of their ~80-byte matches
//! took 1.8-2.0 µs, a third of a secret-dense scan.
//!
//! [`SecretSearch`] runs a bounded backtracker straight on the match (for a rule that needs
//! one: building it costs a fraction of the meta regex most rules then never compile), over
//! an NFA whose wide counted repetitions lose their upper bound (`{16,256}` becomes `{16,}`). On a span
//! no longer than the smallest bound removed, that changes nothing: a repetition whose
//! every iteration consumes a byte cannot iterate more often than the span is long, so it
//! never reaches its bound, and below the bound `{m,n}` and `{m,}` prefer the same choices
//! in the same order (greedy: one more; lazy: one fewer). The groups are the same, so the
//! captures are the same; longer spans go the meta regex's way. The tests of `scan` compare
//! every capture on the labelled corpus with the meta regex's unanchored search.
//!
//! Most rules need no capture search at all ([`SecretSplit`]). Provider rules written
//! `\b(SECRET)(?:[^…]|$)` have as secret the match less its closing character, and the
//! match's last character tells whether there is one. Rules written `NAME = (VALUE)…`
//! (the generic ones, URLs with a password, `Bearer …`) end their secret the same way, or
//! at the match's end, and start it at the one place where the name and separator can end
//! and only value characters follow; where there are two such places (`token==abc`), the
//! capture search decides.

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
    /// The search for `hir`'s captures (relaxed where it has a wide repetition), or None
    /// when the NFA does not build.
    pub(crate) fn new(hir: &Hir) -> Option<SecretSearch> {
        let mut bound = usize::MAX;
        let relaxed = relax(hir, &mut bound);
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

/// The secret of a rule written `BEFORE (SECRET) CLOSING`, where no character the secret
/// can end with is one the closing part can hold
/// (`\b(sk-ant-api03-[A-Za-z0-9_-]{93}AA)(?:[^A-Za-z0-9_-]|$)`, `bearer\s+([A-Za-z0-9._~+/-]+=*)`
/// with no closing part at all, `pass=(\S+)[ \t]*$`).
///
/// The group ends where the match's longest tail of characters the closing part can hold
/// begins: the closing part's text is such a tail, and the character before it is the
/// secret's last, which it cannot hold.
///
/// Where it starts:
/// - When only zero-width assertions come before the group, at the match's start.
/// - Otherwise ([`Head`]), at the one place the part before it can end: a place no further
///   from the group's end than the secret's length allows, with only characters the secret
///   can hold between, and just after a character the part before can end with (or at the
///   match's start, when that part can match nothing). The group's true start is such a
///   place. When there are several (`token==abc`, where `=` both ends the separator and may
///   begin the value), the split does not choose and the capture search does.
#[derive(Debug, Clone)]
pub(crate) struct SecretSplit {
    /// Every character the closing part can hold.
    closing: CharSet,
    /// What comes before the group, when more than assertions.
    head: Option<Head>,
}

/// What tells where a group starts that text comes before.
#[derive(Debug, Clone)]
struct Head {
    /// Every character the secret can hold.
    secret_chars: CharSet,
    /// Every character the part before the secret can end with.
    before_ends: CharSet,
    /// Whether the part before the secret can match the empty string.
    before_may_be_empty: bool,
    /// The secret's least and greatest length, in bytes.
    min_len: usize,
    max_len: Option<usize>,
}

impl SecretSplit {
    /// The split for group `group` of `hir`, when `hir` has that shape.
    pub(crate) fn new(hir: &Hir, group: usize) -> Option<SecretSplit> {
        let HirKind::Concat(parts) = hir.kind() else { return None };
        let at = parts.iter().position(|p| matches!(p.kind(), HirKind::Capture(c) if c.index as usize == group))?;
        let (before, rest) = parts.split_at(at);
        let (secret, after) = rest.split_first()?;
        let HirKind::Capture(c) = secret.kind() else { return None };
        let mut closing = ClassUnicode::empty();
        for part in after {
            closing.union(&all_chars(part)?);
        }
        let (mut ends, may_be_empty) = last_chars(&c.sub)?;
        if may_be_empty {
            return None;
        }
        ends.intersect(&closing);
        if !ends.ranges().is_empty() {
            return None;
        }
        let closing = CharSet::new(closing);
        let head = match before.iter().all(|p| matches!(p.kind(), HirKind::Look(_))) {
            true => None,
            false => Some(Head::new(before, &c.sub)?),
        };
        Some(SecretSplit { closing, head })
    }

    /// Whether [`SecretSplit::secret`] always tells (nothing but assertions before the group).
    #[cfg(test)]
    pub(crate) fn always_splits(&self) -> bool {
        self.head.is_none()
    }

    /// The secret's span in the match `[start, end)` of `text`; None when the group's start
    /// is not the only place the part before it can end (ask the capture search).
    pub(crate) fn secret(&self, text: &str, (start, end): (usize, usize)) -> Option<(usize, usize)> {
        let closed = text.get(start..end)?.chars().rev().take_while(|&c| self.closing.has(c));
        let secret_end = end - closed.map(char::len_utf8).sum::<usize>();
        match &self.head {
            None => Some((start, secret_end)),
            Some(head) => head.secret_start(text, start, secret_end).map(|s| (s, secret_end)),
        }
    }
}

impl Head {
    fn new(before: &[Hir], secret: &Hir) -> Option<Head> {
        let (before_ends, before_may_be_empty) = last_chars(&Hir::concat(before.to_vec()))?;
        let props = secret.properties();
        Some(Head {
            secret_chars: CharSet::new(all_chars(secret)?),
            before_ends: CharSet::new(before_ends),
            before_may_be_empty,
            min_len: props.minimum_len()?,
            max_len: props.maximum_len(),
        })
    }

    /// Where the secret ending at `secret_end` starts, in a match starting at `start`: the
    /// only place the part before it can end, or None when there are several.
    fn secret_start(&self, text: &str, start: usize, secret_end: usize) -> Option<usize> {
        let latest = secret_end.checked_sub(self.min_len)?;
        let earliest = self.max_len.map_or(start, |n| secret_end.saturating_sub(n).max(start));
        let mut found = None;
        let mut at = secret_end;
        loop {
            let before = text.get(..at)?.chars().next_back();
            if at <= latest {
                let ends_before = match before {
                    _ if at == start => self.before_may_be_empty,
                    Some(c) => self.before_ends.has(c),
                    None => false,
                };
                if ends_before {
                    if found.is_some() {
                        return None;
                    }
                    found = Some(at);
                }
            }
            match before {
                Some(c) if at > earliest && self.secret_chars.has(c) => at -= c.len_utf8(),
                _ => return found,
            }
        }
    }
}

/// A set of characters that answers for ASCII without a search.
#[derive(Debug, Clone)]
struct CharSet {
    ascii: u128,
    class: ClassUnicode,
}

impl CharSet {
    fn new(class: ClassUnicode) -> CharSet {
        let ascii = (0u8..128).filter(|&b| class_has(&class, char::from(b))).fold(0u128, |m, b| m | 1 << b);
        CharSet { ascii, class }
    }

    fn has(&self, c: char) -> bool {
        match u32::from(c) {
            b @ 0..=127 => self.ascii >> b & 1 == 1,
            _ => class_has(&self.class, c),
        }
    }
}

fn class_has(class: &ClassUnicode, c: char) -> bool {
    class.ranges().iter().any(|r| r.start() <= c && c <= r.end())
}

/// Every character a match of `hir` can hold (a superset); None for what this does not
/// read (byte classes).
fn all_chars(hir: &Hir) -> Option<ClassUnicode> {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Some(ClassUnicode::empty()),
        HirKind::Literal(lit) => {
            let text = std::str::from_utf8(&lit.0).ok()?;
            Some(ClassUnicode::new(text.chars().map(|c| ClassUnicodeRange::new(c, c))))
        }
        HirKind::Class(Class::Unicode(c)) => Some(c.clone()),
        HirKind::Class(Class::Bytes(_)) => None,
        HirKind::Repetition(r) => all_chars(&r.sub),
        HirKind::Capture(c) => all_chars(&c.sub),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => {
            let mut set = ClassUnicode::empty();
            for p in parts {
                set.union(&all_chars(p)?);
            }
            Some(set)
        }
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
        assert_eq!(bound(r"[a-z]{8}"), usize::MAX);
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
    /// `text` where the pattern matches: `(matches, matches the split left to the capture
    /// search)`, or None when there is no split or it gives another span.
    fn split_against_captures(pattern: &str, text: &str) -> Option<(usize, usize)> {
        let (_, meta) = search(pattern);
        let hir = regex_syntax::parse(pattern).unwrap_or_else(|_| Hir::empty());
        let split = SecretSplit::new(&hir, 1)?;
        let mut caps = meta.create_captures();
        let (mut tried, mut left) = (0, 0);
        for start in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            meta.search_captures(&Input::new(text).span(start..text.len()).anchored(Anchored::Yes), &mut caps);
            let (Some(m), Some(g)) = (caps.get_match(), caps.get_group(1)) else { continue };
            tried += 1;
            match split.secret(text, (m.start(), m.end())) {
                Some(secret) if secret != (g.start, g.end) => return None,
                Some(_) => {}
                None => left += 1,
            }
        }
        Some((tried, left))
    }

    /// Whether the split gives the captured secret at every start where the pattern matches
    /// (at least one), never leaving one to the capture search.
    fn split_agrees(pattern: &str, text: &str) -> bool {
        split_against_captures(pattern, text).is_some_and(|(tried, left)| tried > 0 && left == 0)
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
        // Closing parts of several characters, and none.
        assert!(split_agrees(r"\b(sk-[a-z]{4})(?:[^a-z]{2}|$)", "sk-abcd, sk-efgh"));
        assert!(split_agrees(r"(?m)^p=(\S+)[ \t]*\r?$", "p=ab1 \t\r\np=cd2\np=é"));
        assert!(split_agrees(r"\b(sk-[a-z]{4,})", "sk-abcdef sk-ghij"));
    }

    /// A `name = value` rule in the generic rules' shape: the separator can end with `=`,
    /// which the value can hold too.
    const ASSIGNED: &str =
        r#"(?i:token|key)["']?[ \t]*(?:[:=]{1,2}>?|=>)[ \t]*["'`]?([A-Za-z0-9_=+/.-]{4,40})(?:[^A-Za-z0-9_=+/.-]|$)"#;

    #[test]
    fn a_secret_after_a_name_starts_where_the_name_and_separator_can_end() {
        for text in [
            "token=abcd1234",
            "API_TOKEN=abcd1234 x",
            "token = \"abcd1234\"",
            "key: 'ab/cd+ef=='",
            "token=>abcd",
            "key =\tabcdef\n",
            "Token: ab.cd-ef_gh",
            // Non-ASCII around the match.
            "ключ token=abcdé",
        ] {
            assert!(split_agrees(ASSIGNED, text), "{text:?}");
        }
        // Text before the group whose last character the secret cannot hold, or nothing.
        let p = r"(?:^|[^a-z])(sk-[a-z]{4})(?:[^a-z]|$)";
        for text in ["sk-abcd", "x sk-abcd y", "-sk-abcd", "é sk-abcd"] {
            assert!(split_agrees(p, text), "{text:?}");
        }
    }

    #[test]
    fn a_secret_the_separator_could_also_begin_is_left_to_the_capture_search() {
        // `==` may be a two-character separator or `=` then a value starting with `=`; `:=`
        // likewise. The split leaves them to the capture search, and never says otherwise.
        for text in ["token==abcd", "token:=abcd", "token= =abcd", "key=ab=cdefgh"] {
            assert_eq!(split_against_captures(ASSIGNED, text), Some((1, 1)), "{text:?}");
        }
    }

    #[test]
    fn a_secret_the_closing_part_could_end_is_left_to_the_capture_search() {
        let split = |p: &str| SecretSplit::new(&regex_syntax::parse(p).unwrap_or_else(|_| Hir::empty()), 1).is_some();
        // The closing part can hold what the secret can end with (`-`, ` `), the secret may
        // be empty, or a part is made of bytes, not characters.
        assert!(!split(r"\b(sk-[a-z]{4}-?)(?:[^a-z]|$)"));
        assert!(!split(r"\b(sk-[a-z]{4})(?:[^a-z]|$)x?[a-z]"));
        assert!(!split(r"p=(\S+ ?)[ \t]*$"));
        assert!(!split(r"\b(sk-[a-z]*)(?:[^a-z]|$)"));
        assert!(!split(r"k=(?-u:[\x00-\xff]{4})(?:[^a-z]|$)"));
        assert!(!split(r"k=([a-z]{4})(?-u:[\x00-\x2f])"));
        assert!(split(r"\b(sk-[a-z]{4})(?:[^a-z]|$)"));
    }

    proptest::proptest! {
        /// On texts made of the characters that make splitting hard (separators the value
        /// can hold, quotes, spaces, names), the split gives the captured secret or none.
        #[test]
        fn the_split_never_gives_a_span_the_capture_search_would_not(
            text in r#"(?:token|key|bearer|[ab=:>"' \t\r\n.\-]){0,24}"#,
        ) {
            for pattern in [
                ASSIGNED,
                r#"[a-b](?:[_.-](?i:key)|KEY)["']?[ \t]*(?:=>|:=|=|:)[ \t]*["'`]?([ab=.\-]{3,12})(?:[^ab=.\-]|$)"#,
                r"(?:^|[ \t])(?:a|ab)?[:=]?(=[ab]{2,}|[ab=]{2,3})(?:[^ab=]|$)",
                // A closing part of several characters, and none.
                r#"(?m)(?:^|[ \t])(?:key|token)?[ \t]*[:=][ \t]*([^\s"']+?)[ \t]*\r?$"#,
                r"(?i:bearer)[ \t]+([a-z=.]{2,}=?)",
            ] {
                proptest::prop_assert!(split_against_captures(pattern, &text).is_some(), "{pattern} on {text:?}");
            }
        }
    }
}
