//! The canonical view: what the detectors read instead of the raw text, so that a disguise
//! (homoglyphs, full-width forms, invisible characters, JSON escapes) changes nothing.
//!
//! Two folds, both per character, both streaming:
//! * the **rules view**, read by the secret rules and canaries: NFKC of each character,
//!   default-ignorable code points removed (zero-width characters, bidi controls, soft
//!   hyphen, variation selectors...) except tag characters, which read as the ASCII they
//!   are an invisible copy of ("ASCII smuggling"), and a non-ASCII letter or digit whose
//!   TS #39 confusable prototype is pure ASCII replaced by that prototype, when its run of
//!   letters and digits also holds an ASCII one (`раѕѕword` reads `password`). A run written
//!   wholly in another script keeps its letters: Russian `рос` stays Russian, or every
//!   Cyrillic `а` in prose would make the view differ from the raw text and double the rules'
//!   cost. ASCII is never changed, so `0`/`O` and `1`/`l` stay distinct and the rules'
//!   regexes keep their meaning; for pure-ASCII input the view is the raw text.
//! * the **words view**, read by the foreign n-gram detector: the same, with every
//!   confusable folded whatever its run (a sentence retyped in Cyrillic look-alikes is the
//!   sentence), then lowercased by the word splitter.
//!
//! Unicode data comes from `unicode-normalization` (NFKC) and `unicode-security` (the
//! TS #39 skeleton; a character whose skeleton is empty is default-ignorable, the one
//! property that crate does not export by name). Folds are computed once per character and
//! kept in lazily filled tables.
//!
//! In JSON mode (tool-call arguments) the raw text is JSON: inside strings, escapes are
//! decoded before the fold, so the detectors read what a client reads after `JSON.parse`.
//!
//! [`Canon`] turns raw text into [`Piece`]s: runs whose view equals the raw bytes, and units
//! whose view differs (with the raw span that produced them). Every raw byte lands in exactly
//! one piece, in order, so a [`SpanMap`] built from them maps view offsets back to raw ones;
//! a view span covers every raw character that contributed to it. Pieces are emitted only
//! once decided: a run of look-alikes waits for its run to show an ASCII character or end
//! (bounded by [`MAX_PENDING_BYTES`]), a JSON escape for its last character.

mod fold;
mod json;
mod map;

use fold::{with_entry, Fold};
pub(crate) use fold::{with_word_fold, words_fold, WordFold};
use json::JsonDecoder;
pub(crate) use map::SpanMap;

/// Longest run of undecided look-alikes (raw bytes) before it is decided as not folded: a
/// run that long without an ASCII letter or digit is text in its own script.
pub(crate) const MAX_PENDING_BYTES: usize = 256;

/// What one raw character decoded to, and from where.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Decoded {
    pub c: char,
    /// raw byte span
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    /// Text that reads as itself: the raw bytes are the character.
    Text,
    /// A JSON escape: the raw bytes spell it.
    Escape,
    /// JSON syntax outside strings, or a string's quotes: a boundary between words.
    Syntax,
}

/// A decided stretch of the stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Piece<'a> {
    /// The view is the raw text `start..end`.
    Same { start: usize, end: usize },
    /// The raw text `start..end` reads as `view` (empty: removed).
    Changed { start: usize, end: usize, view: &'a str },
}

/// The rules-view fold over decoded characters: decides each run of look-alikes and emits
/// pieces in raw order.
#[derive(Debug, Default)]
struct RulesFold {
    // the last character was a letter or digit (a run is open)
    run_open: bool,
    // the open run holds an ASCII letter or digit
    run_ascii: bool,
    // characters since the first undecided look-alike of the open run
    pending: Vec<Decoded>,
    pending_bytes: usize,
    // every pending character reads as itself in the plain fold (the common case: a word
    // in another script), so deciding "not folded" emits them as one `Piece::Same`
    pending_plain_same: bool,
    // a decided run of `Piece::Same` not yet emitted
    same: Option<(usize, usize)>,
    // the view of one changed piece
    view: String,
}

impl RulesFold {
    fn char(&mut self, d: Decoded, out: &mut impl FnMut(Piece<'_>)) {
        if d.c.is_ascii() {
            let alnum = d.c.is_ascii_alphanumeric();
            if alnum {
                self.run_open = true;
                self.run_ascii = true;
                self.flush_pending(true, out);
            } else {
                self.end_run(out);
            }
            return self.emit(d, true, out);
        }
        let (class, plain_same) = with_entry(d.c, |e| (e.class, e.plain == Fold::Same));
        if class.removed {
            // Invisible: neither ends nor extends a run.
            if self.pending.is_empty() {
                return self.emit(d, false, out);
            }
            return self.hold(d, false, out);
        }
        if !class.alnum {
            self.end_run(out);
            return self.emit(d, false, out);
        }
        if !self.run_open {
            self.run_open = true;
            self.run_ascii = false;
        }
        if class.ascii_alnum {
            self.run_ascii = true;
            self.flush_pending(true, out);
            return self.emit(d, true, out);
        }
        if (class.candidate && !self.run_ascii) || !self.pending.is_empty() {
            return self.hold(d, plain_same, out);
        }
        self.emit(d, self.run_ascii, out);
    }

    /// Raw `start..end`, all ASCII text, read with nothing pending: what [`RulesFold::char`]
    /// does to each of its characters in turn, at once. ASCII reads as itself, a letter or
    /// digit opens an ASCII run and anything else ends the run, so only the last character
    /// (`last`) leaves a trace in the run state.
    fn ascii_stretch(&mut self, start: usize, end: usize, last: u8, out: &mut impl FnMut(Piece<'_>)) {
        debug_assert!(self.pending.is_empty());
        self.run_open = last.is_ascii_alphanumeric();
        self.run_ascii = self.run_open;
        self.extend_same(start, end, out);
    }

    fn hold(&mut self, d: Decoded, plain_same: bool, out: &mut impl FnMut(Piece<'_>)) {
        if self.pending.is_empty() {
            self.pending_plain_same = true;
        }
        self.pending_plain_same &= plain_same && d.kind == Kind::Text;
        self.pending.push(d);
        self.pending_bytes += d.end - d.start;
        if self.pending_bytes >= MAX_PENDING_BYTES {
            self.flush_pending(false, out);
        }
    }

    fn end_run(&mut self, out: &mut impl FnMut(Piece<'_>)) {
        self.flush_pending(false, out);
        self.run_open = false;
        self.run_ascii = false;
    }

    fn flush_pending(&mut self, confusables: bool, out: &mut impl FnMut(Piece<'_>)) {
        let (Some(first), Some(last)) = (self.pending.first().copied(), self.pending.last().copied()) else { return };
        if !confusables && self.pending_plain_same {
            self.extend_same(first.start, last.end, out);
        } else {
            let pending = std::mem::take(&mut self.pending);
            for d in &pending {
                self.emit(*d, confusables, out);
            }
            self.pending = pending;
        }
        self.pending.clear();
        self.pending_bytes = 0;
    }

    /// Emits `d` read with confusables replaced or not.
    fn emit(&mut self, d: Decoded, confusables: bool, out: &mut impl FnMut(Piece<'_>)) {
        let fold = if d.c.is_ascii() {
            None
        } else {
            with_entry(d.c, |e| match if confusables { &e.full } else { &e.plain } {
                Fold::Same => None,
                Fold::To(s) => Some(s.clone()),
            })
        };
        if fold.is_none() && d.kind != Kind::Escape {
            return self.extend_same(d.start, d.end, out);
        }
        self.flush_same(out);
        self.view.clear();
        match fold {
            Some(s) => self.view.push_str(&s),
            None => self.view.push(d.c),
        }
        out(Piece::Changed { start: d.start, end: d.end, view: &self.view });
    }

    /// The view goes on as the raw text `start..end`.
    fn extend_same(&mut self, start: usize, end: usize, out: &mut impl FnMut(Piece<'_>)) {
        match &mut self.same {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.flush_same(out);
                self.same = Some((start, end));
            }
        }
    }

    fn flush_same(&mut self, out: &mut impl FnMut(Piece<'_>)) {
        if let Some((start, end)) = self.same.take() {
            out(Piece::Same { start, end });
        }
    }
}

/// Raw text in, decided pieces of the rules view (and decoded characters for the words
/// view) out.
#[derive(Debug, Default)]
pub(crate) struct Canon {
    json: Option<JsonDecoder>,
    rules: RulesFold,
}

impl Canon {
    /// Reads the raw text as JSON, decoding the escapes inside strings.
    pub(crate) fn json() -> Canon {
        Canon { json: Some(JsonDecoder::default()), ..Canon::default() }
    }

    pub(crate) fn is_json(&self) -> bool {
        self.json.is_some()
    }

    /// Feeds `text`, found at raw offset `at`. `words` gets every decoded character as soon
    /// as it is decoded (when `want_words`); `out` gets the decided pieces.
    pub(crate) fn feed(
        &mut self,
        text: &str,
        at: usize,
        want_words: bool,
        words: &mut impl FnMut(Decoded),
        out: &mut impl FnMut(Piece<'_>),
    ) {
        let rules = &mut self.rules;
        match &mut self.json {
            None if rules.pending.is_empty() && text.is_ascii() => {
                // The common case: the view is the text, and only the run state moves on.
                if want_words {
                    text.char_indices()
                        .for_each(|(i, c)| words(Decoded { c, start: at + i, end: at + i + 1, kind: Kind::Text }));
                }
                if let Some(&last) = text.as_bytes().last() {
                    rules.flush_same(out);
                    rules.run_open = last.is_ascii_alphanumeric();
                    rules.run_ascii = rules.run_open;
                    out(Piece::Same { start: at, end: at + text.len() });
                }
            }
            None => {
                // Char by char where a character may fold or decide a pending run; a stretch
                // of ASCII with nothing pending goes in one step (one em dash makes a whole
                // text take this branch, and most of it is still ASCII).
                let bytes = text.as_bytes();
                let mut i = 0;
                while let Some(&b) = bytes.get(i) {
                    if b.is_ascii() && rules.pending.is_empty() {
                        let j = bytes[i..].iter().position(|b| !b.is_ascii()).map_or(bytes.len(), |k| i + k);
                        if want_words {
                            for (k, &c) in bytes[i..j].iter().enumerate() {
                                words(Decoded {
                                    c: char::from(c),
                                    start: at + i + k,
                                    end: at + i + k + 1,
                                    kind: Kind::Text,
                                });
                            }
                        }
                        rules.ascii_stretch(at + i, at + j, bytes[j - 1], out);
                        i = j;
                        continue;
                    }
                    let Some(c) = text.get(i..).and_then(|rest| rest.chars().next()) else { break };
                    let d = Decoded { c, start: at + i, end: at + i + c.len_utf8(), kind: Kind::Text };
                    if want_words {
                        words(d);
                    }
                    rules.char(d, out);
                    i += c.len_utf8();
                }
            }
            Some(json) => json.feed(text, at, &mut |d| {
                if want_words {
                    words(d);
                }
                rules.char(d, out);
            }),
        }
        self.rules.flush_same(out);
    }

    /// Ends the text: whatever waits is decided as it reads now.
    pub(crate) fn finish(
        &mut self,
        want_words: bool,
        words: &mut impl FnMut(Decoded),
        out: &mut impl FnMut(Piece<'_>),
    ) {
        let rules = &mut self.rules;
        if let Some(json) = &mut self.json {
            json.flush(&mut |d| {
                if want_words {
                    words(d);
                }
                rules.char(d, out);
            });
        }
        self.rules.end_run(out);
        self.rules.flush_same(out);
    }
}

/// Whether the rules view of `text` may differ from it. Cheap and conservative: false
/// proves the view is the text. Outside ASCII, only Cyrillic (lead bytes 0xD0 to 0xD3) is
/// let through, and only where no ASCII letter or digit touches a non-ASCII byte: such text
/// has neither NFKC changes nor invisible characters (a test checks the whole block against
/// the Unicode data), nor a run mixing ASCII with look-alikes.
pub(crate) fn may_differ(text: &str) -> bool {
    wide::may_differ(text)
}

/// `may_differ` compiled for the widest vectors the host has: every prose text pays for the
/// check, and the default target allows only SSE2 (AVX-512 makes it a quarter as costly).
#[allow(unsafe_code)]
mod wide {
    pub(super) fn may_differ(text: &str) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512bw") {
                // SAFETY: the host has the features the function is compiled for.
                return unsafe { may_differ_avx512(text) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: as above.
                return unsafe { may_differ_avx2(text) };
            }
        }
        super::may_differ_any(text)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn may_differ_avx512(text: &str) -> bool {
        super::may_differ_any(text)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn may_differ_avx2(text: &str) -> bool {
        super::may_differ_any(text)
    }
}

#[inline(always)]
fn may_differ_any(text: &str) -> bool {
    // Blocks of 128 bytes, each folded branch-free (the compiler vectorises these loops):
    // ASCII blocks cost one fold; only blocks holding both an ASCII letter or digit and a
    // non-ASCII byte look at neighbours.
    const BLOCK: usize = 128;
    let (blocks, rest) = text.as_bytes().as_chunks::<BLOCK>();
    let mut prev = 0u8;
    for block in blocks {
        let high = block.iter().fold(0u8, |acc, &c| acc | c);
        if high >= 0x80 {
            if block.iter().fold(0u8, |acc, &c| acc | odd_lead(c)) != 0 {
                return true;
            }
            let alnum = block.iter().fold(ascii_alnum(prev), |acc, &c| acc | ascii_alnum(c));
            if alnum != 0 && touching(prev, block) {
                return true;
            }
        } else if prev >= 0x80 && ascii_alnum(block[0]) != 0 {
            return true;
        }
        prev = block[BLOCK - 1];
    }
    rest.iter().any(|&c| odd_lead(c) != 0) || touching(prev, rest)
}

/// 1 for an ASCII letter or digit.
#[inline(always)]
fn ascii_alnum(c: u8) -> u8 {
    u8::from(c.wrapping_sub(b'0') < 10) | u8::from((c | 0x20).wrapping_sub(b'a') < 26)
}

/// 1 for a UTF-8 lead byte outside the Cyrillic block (0xD0 to 0xD3).
#[inline(always)]
fn odd_lead(c: u8) -> u8 {
    u8::from(c >= 0xC0) & u8::from(c & 0xFC != 0xD0)
}

/// Whether an ASCII letter or digit touches a non-ASCII byte in `prev` then `bytes`.
#[inline(always)]
fn touching(prev: u8, bytes: &[u8]) -> bool {
    let (mut p, mut hit) = (prev, 0u8);
    for &c in bytes {
        hit |= (ascii_alnum(p) & (c >> 7)) | ((p >> 7) & ascii_alnum(c));
        p = c;
    }
    hit != 0
}

/// The rules view of a complete `text`, with its map; `None` when it equals the text.
pub(crate) fn rules_view(text: &str) -> Option<(String, SpanMap)> {
    if !may_differ(text) {
        return None;
    }
    let mut canon = Canon::default();
    let (mut view, mut map, mut changed) = (String::with_capacity(text.len()), SpanMap::default(), false);
    let mut take = |p: Piece<'_>| match p {
        Piece::Same { start, end } => {
            map.push_same(view.len(), start, end - start);
            view.push_str(text.get(start..end).unwrap_or(""));
        }
        Piece::Changed { start, end, view: v } => {
            changed = true;
            map.push_changed(view.len(), start, v.len(), end - start);
            view.push_str(v);
        }
    };
    canon.feed(text, 0, false, &mut |_| {}, &mut take);
    canon.finish(false, &mut |_| {}, &mut take);
    changed.then_some((view, map))
}

/// The rules view of a short `text` (a secret), standalone; `json`: it is the inside of a
/// JSON string.
pub(crate) fn rules_string(text: &str, json: bool) -> String {
    let mut canon = Canon { json: json.then(JsonDecoder::in_string), ..Canon::default() };
    let mut view = String::with_capacity(text.len());
    let mut take = |p: Piece<'_>| match p {
        Piece::Same { start, end } => view.push_str(text.get(start..end).unwrap_or("")),
        Piece::Changed { view: v, .. } => view.push_str(v),
    };
    canon.feed(text, 0, false, &mut |_| {}, &mut take);
    canon.finish(false, &mut |_| {}, &mut take);
    view
}

/// Calls `f` with each decoded character of plain (not JSON) `text`: the words view's input
/// for one-shot scanning and recording.
pub(crate) fn decode_plain(text: &str, mut f: impl FnMut(Decoded)) {
    for (i, c) in text.char_indices() {
        f(Decoded { c, start: i, end: i + c.len_utf8(), kind: Kind::Text });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(text: &str) -> String {
        rules_view(text).map_or_else(|| text.to_string(), |(v, _)| v)
    }

    fn words(text: &str) -> String {
        let mut out = String::new();
        for c in text.chars() {
            words_fold(c, |f| out.push(f));
        }
        out
    }

    /// Rebuilds the view and its changed units from `canon` fed by `feed`, then finished.
    fn rebuilt(
        text: &str,
        mut canon: Canon,
        feed: impl FnOnce(&mut Canon, &mut dyn FnMut(Piece<'_>)),
    ) -> (String, Vec<(usize, usize, String)>) {
        let (mut out, mut units) = (String::new(), Vec::new());
        let mut take = |p: Piece<'_>| match p {
            Piece::Same { start, end } => out.push_str(&text[start..end]),
            Piece::Changed { start, end, view } => {
                units.push((start, end, view.to_string()));
                out.push_str(view);
            }
        };
        feed(&mut canon, &mut take);
        canon.finish(false, &mut |_| {}, &mut take);
        (out, units)
    }

    /// Streams `text` one char at a time through a canon and rebuilds the view.
    fn streamed(text: &str, json: bool) -> (String, Vec<(usize, usize, String)>) {
        let canon = if json { Canon::json() } else { Canon::default() };
        rebuilt(text, canon, |canon, mut take| {
            for (i, c) in text.char_indices() {
                canon.feed(&text[i..i + c.len_utf8()], i, false, &mut |_| {}, &mut take);
            }
        })
    }

    #[test]
    fn ascii_text_is_its_own_rules_string() {
        // The table reader turns down ASCII headers on this (`detect::table`'s
        // `credential_header`).
        for text in ["Password", "API-KEY (prod)", "a\\u0070wd", "p&#97;ss", "x%41y", " tab\tend ", "|", ""] {
            assert_eq!(rules_string(text, false), text);
        }
    }

    #[test]
    fn the_quick_check_finds_every_difference_at_block_edges() {
        for at in [0, 1, 126, 127, 128, 129, 255, 256, 300] {
            let mut text = "x".repeat(at);
            text.push('\u{200B}');
            text.push_str(&" ".repeat(300 - at));
            assert!(may_differ(&text), "invisible at {at}");
            let mut text = " ".repeat(at);
            text.push_str("aа");
            text.push_str(&" ".repeat(300 - at));
            assert!(may_differ(&text), "mixed run at {at}");
            let mut text = " ".repeat(at);
            text.push_str("аa");
            assert!(may_differ(&text), "mixed run at {at}");
            let mut text = " ".repeat(at);
            text.push_str("а a");
            assert!(!may_differ(&text), "separate runs at {at}");
        }
    }

    #[test]
    fn ascii_is_never_changed() {
        let ascii: String = (0u8..128).map(char::from).collect();
        assert_eq!(view(&ascii), ascii);
        assert!(!may_differ(&ascii));
        assert_eq!(view("0O1lI"), "0O1lI");
    }

    #[test]
    fn disguises_fold_to_ascii_in_mixed_runs() {
        assert_eq!(view("раѕѕword"), "password", "Cyrillic look-alikes next to ASCII");
        assert_eq!(view("ＡＫＩＡ１２３"), "AKIA123", "full-width forms");
        assert_eq!(view("АКІА1234"), "AKIA1234", "upper-case I look-alike keeps its case");
        assert_eq!(view("pass\u{200B}word"), "password", "zero-width space");
        assert_eq!(view("pass\u{AD}wo\u{2060}rd\u{FEFF}"), "password", "soft hyphen, word joiner, BOM");
        assert_eq!(view("\u{202E}dbk_\u{202C}x"), "dbk_x", "bidi controls");
        assert_eq!(view("a\u{FE0F}b"), "ab", "variation selector");
        assert_eq!(view("x\u{E0001}y\u{E007F}"), "xy", "language and cancel tags");
    }

    #[test]
    fn tag_characters_read_as_the_ascii_they_stand_for() {
        let smuggled: String =
            "pw: Hunter2".chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap_or('?')).collect();
        assert_eq!(view(&format!("ok{smuggled}.")), "okpw: Hunter2.");
        assert_eq!(words(&smuggled), "pw: Hunter2");
        // An emoji subdivision flag (England) reads as its region code.
        assert_eq!(view("\u{1F3F4}\u{E0067}\u{E0062}\u{E0065}\u{E006E}\u{E0067}\u{E007F}"), "\u{1F3F4}gbeng");
    }

    #[test]
    fn text_in_its_own_script_stays() {
        assert!(!may_differ("Привет, мир! рос сор"));
        assert_eq!(view("Привет, мир! рос"), "Привет, мир! рос");
        assert_eq!(view("café déjà"), "café déjà");
        // But the words view folds every look-alike.
        assert_eq!(words("рос"), "poc");
    }

    #[test]
    fn every_cyrillic_character_is_stable_under_the_plain_fold() {
        // `may_differ` lets lead bytes 0xD0..=0xD3 (U+0400..=U+04FF) through unchecked.
        for cp in 0x400..0x500 {
            let c = char::from_u32(cp).unwrap_or('x');
            with_entry(c, |e| assert_eq!(e.plain, Fold::Same, "U+{cp:04X}"));
        }
    }

    /// Feeds `text` whole (ASCII stretches go in one step) and rebuilds view and units.
    fn whole(text: &str) -> (String, Vec<(usize, usize, String)>) {
        rebuilt(text, Canon::default(), |canon, mut take| canon.feed(text, 0, false, &mut |_| {}, &mut take))
    }

    /// ASCII stretches taken in one step leave the view, its changed units and the run
    /// state exactly as character by character does: every three-fragment text of
    /// look-alike runs, invisible characters, full-width forms, own-script words, dashes
    /// and ASCII around them.
    #[test]
    fn ascii_stretches_fold_as_character_by_character() {
        let fragments =
            ["pass", " ", "раѕѕ", "word", "\u{200B}", "рос", "ＡＢ", "\u{2014}", "=x9", "ѕ", "\n", "Привет", "_key"];
        for a in fragments {
            for b in fragments {
                for c in fragments {
                    let text = format!("{a}{b}{c}");
                    assert_eq!(whole(&text), streamed(&text, false), "{text:?}");
                }
            }
        }
    }

    #[test]
    fn streaming_one_char_at_a_time_equals_one_shot() {
        for text in ["раѕѕword = 'x'", "рос ѕѕ", "a\u{200B}b ＡＢ", "Привет pass\u{AD}word рос"] {
            assert_eq!(streamed(text, false).0, view(text), "{text:?}");
        }
    }

    #[test]
    fn json_escapes_decode_inside_strings_only() {
        let (v, units) = streamed(r#"{"k\u0065y":"a\nb\"c\\d\/e\u00e9\ud83d\ude00","n":1}"#, true);
        assert_eq!(v, "{\"key\":\"a\nb\"c\\d/eé😀\",\"n\":1}");
        assert!(units.contains(&(3, 9, "e".into())), "{units:?}");
        assert_eq!(streamed(r"\u0041 outside", true).0, r"\u0041 outside");
        // Broken escapes read as written; a lone high surrogate as U+FFFD.
        assert_eq!(streamed(r#""\q \u12x \ud83dz""#, true).0, "\"\\q \\u12x \u{FFFD}z\"");
        assert_eq!(streamed(r#""\ud83d\u0041""#, true).0, "\"\u{FFFD}A\"");
        assert_eq!(streamed(r#""end\u00"#, true).0, r#""end\u00"#);
    }

    #[test]
    fn spans_cover_every_contributing_character() {
        let text = "key: ра\u{200B}ѕѕ9";
        assert!(rules_view(text).is_some());
        let Some((v, map)) = rules_view(text) else { return };
        assert_eq!(v, "key: pass9");
        let at = v.find("pass").unwrap_or(0);
        let (s, e) = map.raw_span(at, v.len());
        assert_eq!(&text[s..e], "ра\u{200B}ѕѕ9");
        assert_eq!(map.to_view(s), at);
        assert_eq!(map.to_view(text.len()), v.len());
    }

    #[test]
    fn long_runs_without_ascii_are_decided_as_written() {
        let run = "а".repeat(200);
        let text = format!("{run}x");
        let v = view(&text);
        assert!(v.starts_with("ааа") && v.ends_with("aaax"), "the tail past the limit folds");
        assert_eq!(streamed(&text, false).0, v);
    }

    #[test]
    fn a_secret_folds_standalone() {
        assert_eq!(rules_string("ｄｂｋ_Ｑ2ж", false), "dbk_Q2ж");
        assert_eq!(rules_string(r"ab\u0063\n", true), "abc\n");
    }
}
