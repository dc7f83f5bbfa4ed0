//! Where a match can start, judged from the bytes around a position without running the
//! regex.
//!
//! One-shot scanning tries a rule's regex anchored at every position shortly before each
//! keyword hit (see `near_keywords`); most of those tries fail at once. [`StartFilter`] rejects
//! such positions for the price of a table look-up: a match can start at `s` only if the
//! byte at `s` is one the pattern can begin with, and, where the match opens with a line or
//! word assertion (`(?m)^`, `\b`), only if that assertion can hold at `s`. Without the
//! second part a rule such as `(?m)(?:^|[ \t;])[A-Za-z0-9_.-]{0,40}password…` would be
//! tried at every letter of the 64 bytes before each `password`.
//!
//! The filter is read off the syntax tree and over-approximates: it never rejects a real
//! start. Bytes are those of the relaxed pattern (non-ASCII parts of large classes widened
//! to every UTF-8 lead byte, as in `stream::liveness`); assertions it does not know, and every assertion
//! after the first byte, are simply not used. The union of its byte sets equals the first
//! bytes of the streaming automaton (a test in `stream::liveness` checks it).

use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// A condition an opening assertion puts on the bytes before a match's start. Each one is
/// necessary for the assertions it stands for (so checking it can only let more through).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Opening {
    /// No condition.
    Anywhere,
    /// `\A`, `(?m)^` (either line terminator): at the text's start or after `\n` or `\r`.
    LineStart,
    /// ASCII `\b`: the bytes on either side differ in being ASCII word characters.
    WordBoundary,
    /// ASCII `\b{start}`, `\b{start-half}`: no ASCII word character just before.
    AfterNonWord,
}

impl Opening {
    const ALL: [Opening; 4] = [Opening::Anywhere, Opening::LineStart, Opening::WordBoundary, Opening::AfterNonWord];

    fn of(look: Look) -> Opening {
        match look {
            Look::Start | Look::StartLF | Look::StartCRLF => Opening::LineStart,
            Look::WordAscii => Opening::WordBoundary,
            Look::WordStartAscii | Look::WordStartHalfAscii => Opening::AfterNonWord,
            // Unicode word assertions would need the characters around; end assertions
            // and negations say nothing useful about a start.
            _ => Opening::Anywhere,
        }
    }

    /// The condition's bit in an [`Openings`] set.
    fn bit(self) -> u8 {
        1u8 << Opening::ALL.iter().position(|&o| o == self).unwrap_or(0)
    }

    /// Both conditions must hold: keeping either one is sound; keep the first.
    fn and(self, other: Opening) -> Opening {
        if self == Opening::Anywhere {
            other
        } else {
            self
        }
    }

    /// Either condition may hold.
    fn or(self, other: Opening) -> Opening {
        if self == other {
            self
        } else {
            Opening::Anywhere
        }
    }

    /// Whether the condition holds for a start whose byte is `at` and whose previous byte
    /// (None at the text's start) is `before`.
    fn holds(self, before: Option<u8>, at: u8) -> bool {
        match self {
            Opening::Anywhere => true,
            Opening::LineStart => before.is_none_or(|b| b == b'\n' || b == b'\r'),
            Opening::WordBoundary => before.is_some_and(is_word_byte) != is_word_byte(at),
            Opening::AfterNonWord => !before.is_some_and(is_word_byte),
        }
    }
}

/// The first byte of `c` in UTF-8.
fn utf8_lead(c: char) -> u8 {
    let mut buf = [0u8; 4];
    c.encode_utf8(&mut buf);
    buf[0]
}

/// ASCII word characters, as `(?-u:\b)` sees bytes.
pub(crate) fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The openings under which a match may begin with some byte: a bit set over
/// `Opening::ALL` (bit 0, `Anywhere`, makes the others moot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Openings(u8);

impl Openings {
    /// No condition: a match may begin with the byte wherever it is.
    pub(crate) const ANYWHERE: Openings = Openings(1);
    /// No match begins with the byte.
    pub(crate) const NONE: Openings = Openings(0);

    /// A match may begin under either's openings.
    pub(crate) fn or(self, other: Openings) -> Openings {
        Openings(self.0 | other.0)
    }

    pub(crate) fn is_none(self) -> bool {
        self.0 == 0
    }

    pub(crate) fn is_anywhere(self) -> bool {
        self.0 & 1 != 0
    }

    /// Whether one of the openings holds for a start whose byte is `at` after `before`
    /// (None at the text's start). `Anywhere` settles it without looking.
    #[inline(always)]
    pub(crate) fn hold(self, before: Option<u8>, at: u8) -> bool {
        self.is_anywhere()
            || Opening::ALL.iter().enumerate().skip(1).any(|(i, o)| self.0 & (1 << i) != 0 && o.holds(before, at))
    }
}

/// The positions a pattern's matches can start at (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartFilter {
    /// [256] for each byte, the openings under which a match can begin with it: bit `i`
    /// stands for `Opening::ALL[i]`.
    by_byte: [u8; 256],
}

impl StartFilter {
    pub(crate) fn of(hir: &Hir) -> StartFilter {
        let mut filter = StartFilter { by_byte: [0; 256] };
        if filter.add(hir, Opening::Anywhere).is_some() {
            // An empty match could "begin" anywhere.
            filter.by_byte = [1; 256];
        }
        filter
    }

    /// Whether a match may start at `s` (a position inside `text`).
    #[inline]
    pub(crate) fn may_start_at(&self, text: &[u8], s: usize) -> bool {
        let Some(&at) = text.get(s) else { return false };
        let openings = self.openings(at);
        // Most positions settle here: no match begins with this byte, or one may anywhere.
        if openings.is_anywhere() || openings.is_none() {
            return !openings.is_none();
        }
        let before = s.checked_sub(1).and_then(|p| text.get(p)).copied();
        openings.hold(before, at)
    }

    /// Whether every match starts at a line's start (the pattern opens with `(?m)^` or
    /// `\A` on every branch): then only the line starts near a keyword hit are worth a look.
    pub(crate) fn at_line_starts_only(&self) -> bool {
        let line_start = Opening::LineStart.bit();
        self.by_byte.iter().any(|&o| o != 0) && self.by_byte.iter().all(|&o| o == 0 || o == line_start)
    }

    /// The openings under which a match may begin with the byte `at`.
    #[inline]
    pub(crate) fn openings(&self, at: u8) -> Openings {
        Openings(self.by_byte[usize::from(at)])
    }

    /// Every byte a match can begin with, whatever surrounds it, as a 256-bit set.
    #[cfg(test)]
    pub(crate) fn any_byte(&self) -> [u64; 4] {
        let mut all = [0u64; 4];
        for (b, &openings) in self.by_byte.iter().enumerate() {
            if openings != 0 {
                all[b >> 6] |= 1u64 << (b & 63);
            }
        }
        all
    }

    fn add_range(&mut self, opening: Opening, lo: u8, hi: u8) {
        let bit = opening.bit();
        self.by_byte[usize::from(lo)..=usize::from(hi)].iter_mut().for_each(|b| *b |= bit);
    }

    /// Adds the bytes `hir` can begin with when entered under `opening`. Returns the
    /// condition under which it can match the empty string there (None: it cannot), which
    /// is what the parts after it are entered under.
    fn add(&mut self, hir: &Hir, opening: Opening) -> Option<Opening> {
        match hir.kind() {
            HirKind::Empty => Some(opening),
            HirKind::Look(l) => Some(opening.and(Opening::of(*l))),
            HirKind::Literal(l) => match l.0.first() {
                Some(&b) => {
                    self.add_range(opening, b, b);
                    None
                }
                None => Some(opening),
            },
            HirKind::Class(Class::Bytes(c)) => {
                c.iter().for_each(|r| self.add_range(opening, r.start(), r.end()));
                None
            }
            HirKind::Class(Class::Unicode(c)) => {
                let exact = crate::stream::liveness::keeps_exact(c);
                for r in c.iter() {
                    let (lo, hi) = (r.start() as u32, r.end() as u32);
                    if lo < 0x80 {
                        self.add_range(opening, lo as u8, hi.min(0x7F) as u8);
                    }
                    if hi >= 0x80 && exact {
                        // UTF-8 lead bytes grow with the code point, without gaps.
                        self.add_range(opening, utf8_lead(r.start().max('\u{80}')), utf8_lead(r.end()));
                    } else if hi >= 0x80 {
                        // Relaxed, any non-ASCII character: every UTF-8 lead byte.
                        self.add_range(opening, 0xC2, 0xF4);
                    }
                }
                None
            }
            HirKind::Capture(c) => self.add(&c.sub, opening),
            HirKind::Repetition(r) => {
                let empty_inside = self.add(&r.sub, opening);
                if r.min == 0 {
                    Some(opening)
                } else {
                    empty_inside
                }
            }
            HirKind::Concat(parts) => parts.iter().try_fold(opening, |o, p| self.add(p, o)),
            HirKind::Alternation(alts) => alts.iter().fold(None, |empty, a| match (empty, self.add(a, opening)) {
                (Some(x), Some(y)) => Some(x.or(y)),
                (x, y) => x.or(y),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(pattern: &str) -> StartFilter {
        let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string());
        assert!(hir.is_ok(), "{hir:?}");
        hir.map(|h| StartFilter::of(&crate::rules::rule::ascii_twin(h)))
            .unwrap_or_else(|_| StartFilter::of(&Hir::empty()))
    }

    fn starts(pattern: &str, text: &str) -> Vec<usize> {
        let f = filter(pattern);
        (0..text.len()).filter(|&s| f.may_start_at(text.as_bytes(), s)).collect()
    }

    #[test]
    fn a_line_start_or_separator_opening_admits_only_those() {
        let p = r"(?m)(?:^|[ \t;])[A-Za-z0-9_.-]{0,40}password";
        assert_eq!(starts(p, "ab cd\nef;gh"), [0, 2, 6, 8]);
        assert_eq!(starts(p, "\r\nx y"), [2, 3]);
    }

    #[test]
    fn only_patterns_that_open_with_a_line_start_on_every_branch_start_at_lines_only() {
        assert!(filter(r"(?m)^[ \t]{0,16}[a-z]+ secret").at_line_starts_only());
        assert!(filter(r"(?m)^(?:a|b)").at_line_starts_only());
        assert!(!filter(r"(?m)(?:^|[ \t;])password").at_line_starts_only());
        assert!(!filter(r"(?m)^a|b").at_line_starts_only());
        assert!(!filter(r"\bsecret").at_line_starts_only());
        assert!(!filter(r"secret").at_line_starts_only());
    }

    #[test]
    fn word_boundaries_and_plain_first_bytes() {
        assert_eq!(starts(r"\btoken", "a token-token"), [2, 8]);
        assert_eq!(starts(r"(?i)\btoken", "xToken Tok"), [7]);
        assert_eq!(starts(r"\b-x", "a -x a-x"), [6]);
        assert_eq!(starts(r"\b{start}\w", "ab_c d"), [0, 5]);
        assert_eq!(starts(r"ghp_", "ghp_ xghp_"), [0, 6]);
    }

    #[test]
    fn optional_or_mixed_openings_fall_back_to_the_bytes() {
        // `y` opens a match only after a boundary; `x` anywhere.
        assert_eq!(starts(r"(?:\b|x)y", "ayxy yy"), [2, 5]);
        // Two different assertions on two branches: either may hold, so neither is used.
        assert_eq!(starts(r"(?:\b|^)y", "ayy"), [1, 2]);
        // An assertion after a consuming part is not used.
        assert_eq!(starts(r"a?\bb", "ab b"), [0, 3]);
        assert_eq!(starts(r"ab\b", "abab"), [0, 2]);
        // Unknown assertions put no condition.
        assert_eq!(starts(r"(?u:\b)é", "aé"), [1]);
        assert_eq!(filter(r"x*").any_byte(), [u64::MAX; 4]);
    }

    /// Soundness on the default rules: wherever a rule's regex has a match starting at `s`
    /// in one of its own samples (or a sample with text around it), the filter admits `s`.
    #[test]
    fn every_default_rule_start_in_its_samples_is_admitted() {
        let rules = crate::Ruleset::builtin().map_err(|e| e.to_string());
        let Ok(rules) = rules else { return assert_eq!(rules.err(), None) };
        let mut admitted = 0;
        for r in &rules.rules {
            let filter = StartFilter::of(r.hir());
            for sample in r.must_match.iter().chain(&r.must_not_match) {
                for text in [sample.clone(), format!("x{sample}"), format!("a;\n\t{sample} z")] {
                    for s in (0..text.len()).filter(|&s| text.is_char_boundary(s)) {
                        if r.regex
                            .get()
                            .and_then(|re| re.find(regex_automata::Input::new(&text).span(s..text.len())))
                            .is_some_and(|m| m.start() == s)
                        {
                            assert!(filter.may_start_at(text.as_bytes(), s), "{} at {s} in {text:?}", r.id);
                            admitted += 1;
                        }
                    }
                }
            }
        }
        assert!(admitted > 1000, "{admitted}");
    }
}
