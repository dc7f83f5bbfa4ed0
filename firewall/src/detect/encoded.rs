//! Encoded text: what a response says in base64, hex, binary, percent-encoding, character
//! codes or spelled out one character at a time is read decoded.
//!
//! A model told to "write it in base64" or "put a space between the letters" turns another
//! tenant's secret, canary or paragraph into characters no rule and no fingerprint knows,
//! and a client undoes it in one line. Three readers follow the text:
//!
//! * **Runs**: a maximal stretch of characters from the encodings' alphabets (letters,
//!   digits, `+ / = - _ %`) of at least [`DecodeConfig::min_chars`]. One holding `%XX`
//!   escapes is percent-decoded; one of `0` and `1` only, of a length a multiple of eight,
//!   is binary if that reads as text; one of hex digits only, of even length, is hex if that
//!   does; any other is base64, standard or URL-safe, padded or not, or, where that is no
//!   text, Jetty's `OBF:` obfuscation (lower-case base-36, four digits a character). A run
//!   is cut after `=` that something follows (`token=SGVsbG8…`: padding ends a base64
//!   value), each part decoded on its own.
//! * **Unit lists**: at least [`MIN_UNITS`] whitespace-separated words in a row that are
//!   each one character (`7 H q 2 …`, `['7', 'H', …]`, or joined by one separator:
//!   `7-H-q-2`, `7.H.q.2`), or each a byte in hex (`48 65 6c`,
//!   `0x48, 0x65`, `\x48\x65…`) or a decimal character code (`72, 101, 108`), list
//!   punctuation (brackets, quotes, a trailing comma) aside, or joined without spaces
//!   (`72,101,108`, `0x48,0x65`, `48-65-6c`, `48:65:6c`), or each a letter in Morse code
//!   (`.... ..`, words apart by `/` or a wider gap). Their concatenation is the text.
//! * **Grouped runs**: two or more whitespace-separated words of run characters, all of one
//!   length of at least [`MIN_GROUP`] but the last, which may be shorter (`SGVs bG8s IHdv`,
//!   `4865 6c6c`, `01001000 01101001`, base64 wrapped into lines): read as the run they make
//!   together.
//!
//! Decoded bytes count as text only when they are UTF-8 without control characters (tab
//! and line breaks aside), whole or in a prefix of at least 12 bytes (a run may end with a
//! word of the same alphabet): random bytes pass with a chance of about (95/256)^n, so keys,
//! hashes and binary blobs, which honest answers carry all the time, are left alone at no
//! cost beyond the decode. That text is scanned like a response of its own: secret rules
//! and canaries, secret ownership, foreign n-grams and tokens, and encodings inside it, down
//! to [`MAX_DEPTH`] layers (a `.dockerconfigjson` is base64 of JSON holding base64). A
//! finding there becomes a finding over the characters that encode it, with its rule,
//! verdict and owners, and [`Finding::encoding`] saying how the client sees it written.
//!
//! Streaming: the open run and the open unit list (with the word in progress) are held
//! back, so no prefix of an encoded leak reaches the client before it is judged; a run
//! longer than the segment bound (the stream's holdback, a multiple of four characters) is
//! judged a segment at a time, each aligned to whole base64 quanta, and a unit list past
//! that many units likewise. Judging a list or groups waits for the word after them, so a
//! block there may release less than one-shot scanning would cut at. The first group of a
//! grouped run is not held (prose words would wait for the next word): it goes out before
//! the second shows it was one, so what a grouped finding covers may have begun, never
//! whole.

use serde::{Deserialize, Serialize};

use crate::canon::{Decoded, Kind};
use crate::detect::{Detectors, ScanContext};
use crate::rules::ruleset::Ruleset;
use crate::verdict::Finding;

/// Layers of encoding read through (base64 of JSON holding base64 is two).
pub const MAX_DEPTH: usize = 2;

/// Fewest units of a unit list that are decoded (eight spelled characters, eight bytes).
pub const MIN_UNITS: usize = 8;

/// How a finding's text was written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    Base64,
    /// A hex string, or a list of hex bytes.
    Hex,
    Percent,
    /// A list of decimal character codes.
    CharCodes,
    /// Eight binary digits a byte.
    Binary,
    /// Dots and dashes, a letter a word.
    Morse,
    /// One character at a time, separated by whitespace.
    Spelled,
    /// Character by character from the end (see `rewrite`).
    Backwards,
    /// Letters turned 13 places (see `rewrite`).
    Rot13,
    /// Letters mirrored in the alphabet (see `rewrite`).
    Atbash,
    /// Letters turned 3 places (see `rewrite`).
    Caesar,
    /// Jetty's `OBF:` obfuscation of a password, four base-36 digits a character.
    JettyObf,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Base64 => "base64",
            Encoding::Hex => "hex",
            Encoding::Percent => "percent-encoding",
            Encoding::CharCodes => "character codes",
            Encoding::Binary => "binary",
            Encoding::Morse => "Morse code",
            Encoding::Spelled => "spelled out",
            Encoding::Backwards => "reverse",
            Encoding::Rot13 => "ROT13",
            Encoding::Atbash => "Atbash",
            Encoding::Caesar => "Caesar's cipher",
            Encoding::JettyObf => "Jetty's OBF obfuscation",
        }
    }
}

/// The decoding detector's settings ([`Detectors::decode`]).
#[derive(Debug, Clone, PartialEq)]
pub struct DecodeConfig {
    /// Shortest run decoded, in characters (16 base64 characters are 12 bytes).
    pub min_chars: usize,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        DecodeConfig { min_chars: 16 }
    }
}

/// Longest segment of one run judged at once in a one-shot scan (the stream's default
/// holdback), in characters: a multiple of four, so segments stay whole base64 quanta.
pub(crate) const SEGMENT_CHARS: usize = 4096;

const fn in_alphabet(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '+' | '/' | '=' | '-' | '_' | '%')
}

/// [`in_alphabet`] by byte.
const ALPHABET: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 128 {
        table[b] = in_alphabet(b as u8 as char);
        b += 1;
    }
    table
};

/// What decoded text is scanned with, and how deep the scan already is.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub rules: &'a Ruleset,
    pub ctx: &'a ScanContext,
    pub detectors: &'a Detectors,
    pub depth: usize,
}

/// Where the readers hand each decoded text (the scan, or a collection of prompt texts).
pub(crate) type Sink<'s> = dyn FnMut(&DecodedText) + 's;

/// Both readers over a text, fed its characters in order.
#[derive(Debug)]
pub(crate) struct EncodedState {
    /// the open run's characters (ASCII) and the raw byte span of each
    run: Vec<u8>,
    run_spans: Spans,
    /// the word in progress: its characters and their raw spans
    word: Vec<char>,
    word_spans: Vec<(usize, usize)>,
    /// whitespace characters since the last word
    gap: usize,
    /// the word in progress can no longer be a unit (and is not held back)
    not_unit: bool,
    list: UnitList,
    chunks: Chunks,
    segment: usize,
    min_chars: usize,
}

impl EncodedState {
    /// `segment`: the longest stretch of a run (in characters) or of a unit list (in
    /// units) held and judged at once.
    pub(crate) fn new(cfg: &DecodeConfig, segment: usize) -> EncodedState {
        EncodedState {
            min_chars: cfg.min_chars,
            run: Vec::new(),
            run_spans: Spans::default(),
            word: Vec::new(),
            word_spans: Vec::new(),
            gap: 0,
            not_unit: false,
            list: UnitList::default(),
            chunks: Chunks::default(),
            segment: (segment / 4 * 4).max(4),
        }
    }

    /// Feeds plain text (not JSON) at raw offset `at`: as [`Self::feed`] one character
    /// at a time would, with the stretches [`Self::feed_stretch`] can take in bulk.
    pub(crate) fn feed_plain(&mut self, text: &str, at: usize, sink: &mut Sink<'_>) {
        let bytes = text.as_bytes();
        let mut i = 0;
        while let Some(&b) = bytes.get(i) {
            if self.not_unit && self.chunks.in_word && ALPHABET[usize::from(b)] {
                let stretch = bytes[i..].iter().take_while(|&&b| ALPHABET[usize::from(b)]).count();
                i += self.feed_stretch(&bytes[i..i + stretch], at + i, sink);
                continue;
            }
            let c = text.get(i..).and_then(|rest| rest.chars().next()).unwrap_or(char::REPLACEMENT_CHARACTER);
            self.feed(c, false, (at + i, at + i + c.len_utf8()), sink);
            i += c.len_utf8();
        }
    }

    /// Feeds the first characters of `stretch` (alphabet characters, one byte each, at raw
    /// offset `at`, inside a word already known to be no unit) and returns how many: in
    /// bulk as many as [`Self::feed`] would only append, one by one otherwise. Within
    /// such a stretch nothing is judged until the run reaches the segment, or the word
    /// reaches its groups' length (or `%`, or the longest group) while it may be one.
    fn feed_stretch(&mut self, stretch: &[u8], at: usize, sink: &mut Sink<'_>) -> usize {
        let run_room = (self.segment - 1).saturating_sub(self.run.len());
        let ch = &self.chunks;
        let chunk_room = if ch.word_ok {
            let n = ch.chars.len() - ch.word_at;
            let before_restart = match (ch.count, ch.ended) {
                (0, _) => usize::MAX,
                (_, true) => 0,
                (_, false) => ch.len.saturating_sub(n),
            };
            let before_percent = stretch.iter().position(|&b| b == b'%').unwrap_or(usize::MAX);
            before_restart.min(before_percent).min(SEGMENT_CHARS.saturating_sub(n))
        } else {
            usize::MAX
        };
        let k = stretch.len().min(run_room).min(chunk_room);
        if k == 0 {
            self.feed(char::from(stretch[0]), false, (at, at + 1), sink);
            return 1;
        }
        self.run.extend_from_slice(&stretch[..k]);
        self.run_spans.push_bytes(at, k);
        if self.chunks.word_ok {
            self.chunks.chars.extend_from_slice(&stretch[..k]);
            self.chunks.spans.push_bytes(at, k);
        }
        k
    }

    /// Feeds one decoded character (JSON syntax ends runs and words: quotes delimit its
    /// strings).
    pub(crate) fn feed_char(&mut self, d: Decoded, sink: &mut Sink<'_>) {
        self.feed(d.c, d.kind == Kind::Syntax, (d.start, d.end), sink);
    }

    fn feed(&mut self, c: char, syntax: bool, span: (usize, usize), sink: &mut Sink<'_>) {
        if !syntax && in_alphabet(c) {
            self.run.push(c as u8);
            self.run_spans.push(span);
            if self.run.len() >= self.segment {
                self.close_run(sink);
            }
        } else {
            self.close_run(sink);
        }
        if syntax || c.is_whitespace() {
            self.chunks.end_word(self.min_chars, self.segment, sink);
            self.end_word(sink);
            self.gap += 1;
            return;
        }
        self.chunks.feed(c, span, self.min_chars, sink);
        if !self.not_unit {
            self.word.push(c);
            self.word_spans.push(span);
            if self.word.len() > self.segment || !may_become_unit(&self.word) {
                // The word ends the list, and nothing of it needs holding back.
                self.list.close(sink);
                self.word.clear();
                self.word_spans.clear();
                self.gap = 0;
                self.not_unit = true;
            }
        }
    }

    /// Judges what is open (the text has ended).
    pub(crate) fn finish(&mut self, sink: &mut Sink<'_>) {
        self.close_run(sink);
        self.chunks.end_word(self.min_chars, self.segment, sink);
        self.chunks.close(self.min_chars, sink);
        self.end_word(sink);
        self.list.close(sink);
    }

    /// Where held-back text starts: the open run, unit list or word, whichever began first.
    pub(crate) fn hold_from(&self) -> Option<usize> {
        let lists = [self.list.spans.first().map(|s| s.0), self.chunks.hold_from()];
        [self.run_spans.first(), self.word_spans.first().map(|s| s.0)].into_iter().chain(lists).flatten().min()
    }

    fn close_run(&mut self, sink: &mut Sink<'_>) {
        if self.run.len() >= self.min_chars {
            for (from, to) in parts(&self.run) {
                let spans = |i: usize| self.run_spans.get(from + i);
                if let Some(d) = decode_run(&self.run[from..to], spans, self.min_chars) {
                    sink(&d);
                }
            }
        }
        self.run.clear();
        self.run_spans.clear();
    }

    fn end_word(&mut self, sink: &mut Sink<'_>) {
        if std::mem::take(&mut self.not_unit) || self.word.is_empty() {
            return;
        }
        let (from, to) = trim_list(&self.word);
        // A bracket opens a list and closes it: `[55,72,…]` and the `[55,72,…]` on the next
        // line are two values, not one (read as one, a token written twice, or after any
        // other list, decoded as a longer word that no token matched).
        let opens = self.word[..from].iter().any(|c| matches!(c, '[' | '(' | '{'));
        let closes = self.word[to..].iter().any(|c| matches!(c, ']' | ')' | '}'));
        if opens {
            self.list.close(sink);
        }
        let text: String = self.word[from..to].iter().collect();
        match unit_word(&text) {
            Some(kind) => {
                if !self.list.accepts(kind) {
                    self.list.close(sink);
                }
                self.list.push(kind, text, &self.word_spans[from..to], self.gap >= 2);
                if self.list.size >= self.segment {
                    self.list.close(sink);
                }
            }
            None if separated_chars(&self.word[from..to]).is_some() => {
                // Each character between the separators is a spelled-out unit.
                if !self.list.accepts(UnitWord::Char) {
                    self.list.close(sink);
                }
                let spaced = self.gap >= 2;
                for i in (from..to).step_by(2) {
                    let unit = self.word[i].to_string();
                    self.list.push(UnitWord::Char, unit, &self.word_spans[i..=i], spaced && i == from);
                }
                if self.list.size >= self.segment {
                    self.list.close(sink);
                }
            }
            None => match joined_units(&self.word[from..to]) {
                // Each part is a unit: a byte in hex or a decimal code.
                Some(parts) => {
                    let spaced = self.gap >= 2;
                    for (i, (a, b)) in parts.into_iter().enumerate() {
                        let unit: String = self.word[from + a..from + b].iter().collect();
                        let Some(kind) = unit_word(&unit) else { continue };
                        if !self.list.accepts(kind) {
                            self.list.close(sink);
                        }
                        self.list.push(kind, unit, &self.word_spans[from + a..from + b], spaced && i == 0);
                    }
                    if self.list.size >= self.segment {
                        self.list.close(sink);
                    }
                }
                None => self.list.close(sink),
            },
        }
        if closes {
            self.list.close(sink);
        }
        self.word.clear();
        self.word_spans.clear();
        self.gap = 0;
    }
}

/// Shortest group of a grouped run (`SGVs bG8s`, `4865 6c6c`): shorter words in a row are
/// unit lists or prose.
const MIN_GROUP: usize = 4;

/// Whitespace-separated groups of one length, the last one maybe shorter (base64 or hex
/// written in groups of four, or wrapped into lines), read as one run. `chars` holds the
/// groups so far and the word in progress, which starts at `word_at` while it may be one.
#[derive(Debug, Default)]
struct Chunks {
    chars: Vec<u8>,
    spans: Spans,
    in_word: bool,
    word_at: usize,
    /// the word in progress holds only alphabet characters
    word_ok: bool,
    /// the groups' length, and how many so far
    len: usize,
    count: usize,
    /// a shorter group came: it was the last one
    ended: bool,
}

impl Chunks {
    /// One character of a word.
    fn feed(&mut self, c: char, span: (usize, usize), min: usize, sink: &mut Sink<'_>) {
        if !self.in_word {
            (self.in_word, self.word_at, self.word_ok) = (true, self.chars.len(), true);
        }
        if !self.word_ok {
            return;
        }
        let n = self.chars.len() - self.word_at;
        // A word longer than the groups cannot continue them; nor can any word after a
        // shorter group. Judge them now, not when the word ends.
        if self.count > 0 && (self.ended || n >= self.len) {
            self.restart(min, sink);
        }
        // Percent escapes are not written in groups: a `%` word is no group.
        if in_alphabet(c) && c != '%' && n < SEGMENT_CHARS {
            self.chars.push(c as u8);
            self.spans.push(span);
        } else {
            self.word_ok = false;
            self.restart(min, sink);
            self.drop_front(self.chars.len());
        }
    }

    /// Where held-back text starts. A first group goes out unjudged (a prose word must not
    /// wait for the next one): from the second, the groups and the word after them are held.
    /// What a first group shorter than a run can carry out is under 12 decoded bytes.
    fn hold_from(&self) -> Option<usize> {
        match self.count {
            0 => None,
            1 => (self.in_word && self.word_ok && self.chars.len() > self.word_at)
                .then(|| self.spans.get(self.word_at).0),
            _ => self.spans.first(),
        }
    }

    /// Judges the groups before the word in progress and keeps only that word.
    fn restart(&mut self, min: usize, sink: &mut Sink<'_>) {
        self.judge(self.word_at, min, sink);
        self.drop_front(self.word_at);
        (self.count, self.ended) = (0, false);
    }

    fn drop_front(&mut self, n: usize) {
        self.chars.drain(..n);
        self.spans.drop_front(n);
        self.word_at = self.word_at.saturating_sub(n);
    }

    /// The word in progress ended.
    fn end_word(&mut self, min: usize, segment: usize, sink: &mut Sink<'_>) {
        if !std::mem::take(&mut self.in_word) {
            return;
        }
        let n = self.chars.len() - self.word_at;
        if !self.word_ok || n < MIN_GROUP {
            self.judge(self.word_at, min, sink);
            self.drop_front(self.chars.len());
            (self.count, self.ended) = (0, false);
            return;
        }
        if self.count > 0 && (self.ended || n > self.len) {
            self.restart(min, sink);
        }
        if self.count == 0 {
            self.len = n;
        } else if n < self.len {
            self.ended = true;
        }
        self.count += 1;
        self.word_at = self.chars.len();
        if self.chars.len() >= segment {
            self.close(min, sink);
        }
    }

    /// Judges every group and empties the list.
    fn close(&mut self, min: usize, sink: &mut Sink<'_>) {
        self.judge(self.word_at, min, sink);
        self.drop_front(self.word_at);
        (self.count, self.ended) = (0, false);
    }

    /// Decodes the first `upto` characters as one run, when two or more groups hold them.
    fn judge(&self, upto: usize, min: usize, sink: &mut Sink<'_>) {
        if self.count < 2 || upto < min {
            return;
        }
        let chars = &self.chars[..upto];
        for (from, to) in parts(chars) {
            if let Some(d) = decode_run(&chars[from..to], |i| self.spans.get(from + i), min) {
                sink(&d);
            }
        }
    }
}

/// The raw spans of a run's characters: a start offset while they are one byte each and
/// back to back (plain ASCII, nearly every run), a list otherwise.
#[derive(Debug, Default)]
struct Spans {
    start: usize,
    len: usize,
    listed: bool,
    list: Vec<(usize, usize)>,
}

impl Spans {
    fn push(&mut self, span: (usize, usize)) {
        if !self.listed {
            if self.len == 0 {
                self.start = span.0;
            }
            if span == (self.start + self.len, self.start + self.len + 1) {
                self.len += 1;
                return;
            }
            self.listed = true;
            self.list.clear();
            self.list.extend((self.start..self.start + self.len).map(|a| (a, a + 1)));
        }
        self.list.push(span);
        self.len += 1;
    }

    /// Pushes the spans of `n` one-byte characters from raw offset `at` on.
    fn push_bytes(&mut self, at: usize, n: usize) {
        if !self.listed && (self.len == 0 || self.start + self.len == at) {
            if self.len == 0 {
                self.start = at;
            }
            self.len += n;
        } else {
            (at..at + n).for_each(|a| self.push((a, a + 1)));
        }
    }

    fn get(&self, i: usize) -> (usize, usize) {
        if self.listed {
            self.list.get(i).copied().unwrap_or_default()
        } else {
            (self.start + i, self.start + i + 1)
        }
    }

    fn first(&self) -> Option<usize> {
        (self.len > 0).then(|| self.get(0).0)
    }

    fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len);
        if self.listed {
            self.list.drain(..n);
        } else {
            self.start += n;
        }
        self.len -= n;
        if self.len == 0 {
            self.listed = false;
        }
    }

    fn clear(&mut self) {
        self.len = 0;
        self.listed = false;
    }
}

/// The stretches of a run decoded on their own: it is cut after every `=` that something
/// other than `=` follows.
fn parts(run: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    for i in 1..run.len() {
        if run[i - 1] == b'=' && run[i] != b'=' {
            out.push((from, i));
            from = i;
        }
    }
    out.push((from, run.len()));
    out
}

/// Decoded bytes and, for each, the raw span of the characters it was decoded from.
pub(crate) struct DecodedText {
    encoding: Encoding,
    bytes: Vec<u8>,
    raw: Vec<(usize, usize)>,
}

impl DecodedText {
    /// The decoded bytes as text, when they read as text.
    fn text(&self) -> Option<&str> {
        std::str::from_utf8(&self.bytes).ok().filter(|t| reads_as_text(t))
    }

    /// The raw span of the characters that encode decoded bytes `start..end`.
    fn raw_span(&self, start: usize, end: usize) -> Option<(usize, usize)> {
        let first = self.raw.get(start)?.0;
        let last = self.raw.get(end.checked_sub(1)?.max(start))?.1;
        Some((first, last))
    }
}

/// When `d` reads as text, scans it and adds its findings over the characters that
/// encode them.
pub(crate) fn judge(reader: Reader<'_>, d: &DecodedText, out: &mut Vec<Finding>) {
    let Some(text) = d.text() else { return };
    for mut f in reader.rules.scan_layer(text, reader.ctx, reader.detectors, reader.depth + 1) {
        let Some((start, end)) = d.raw_span(f.start, f.end) else { continue };
        let (match_start, match_end) = d.raw_span(f.match_start, f.match_end).unwrap_or((start, end));
        (f.start, f.end, f.match_start, f.match_end) = (start, end, match_start, match_end);
        // The outermost layer is what the client sees.
        f.encoding = Some(d.encoding);
        // A group of a grouped run can also be a run of its own: one finding, not two.
        let same =
            |g: &Finding| (g.start, g.end, g.match_start, &g.rule_id) == (f.start, f.end, f.match_start, &f.rule_id);
        if !out.iter().any(same) {
            out.push(f);
        }
    }
}

/// Text, not bytes that happen to be UTF-8: no control characters but tab and line breaks.
fn reads_as_text(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
}

/// Decodes one part of a run (`span`: each character's raw span), at least `min` long,
/// when it reads as text.
fn decode_run(chars: &[u8], span: impl Fn(usize) -> (usize, usize), min: usize) -> Option<DecodedText> {
    if chars.len() < min {
        return None;
    }
    let (encoding, mut bytes, from, whole) = if chars.contains(&b'%') {
        percent(chars)?
    } else {
        let bits = chars.len().is_multiple_of(8) && chars.iter().all(|&c| c == b'0' || c == b'1');
        let hex = (chars.len().is_multiple_of(2) && chars.iter().all(u8::is_ascii_hexdigit)).then(|| hex(chars));
        let reads = |d: &Decoding| text_prefix(&d.1, d.3).is_some();
        match (bits.then(|| binary(chars)), hex.flatten()) {
            (Some(b), _) if reads(&b) => b,
            (_, Some(h)) if reads(&h) => h,
            // Jetty's obfuscation is all lower-case digits and letters, which base64 reads as
            // bytes that are no text.
            _ => match base64(chars) {
                Some(b) if reads(&b) => b,
                b => jetty_obfuscated(chars).filter(reads).or(b)?,
            },
        }
    };
    let mut end = text_prefix(&bytes, whole)?;
    if encoding == Encoding::Base64 && end < bytes.len() {
        // What follows the text in the run (a word of the same alphabet) starts at a whole
        // quantum of three bytes, as a run's groups do; a byte before the cut is not text.
        end = end / 3 * 3;
        if end < MIN_TEXT_PREFIX {
            return None;
        }
    }
    bytes.truncate(end);
    let raw = (0..bytes.len()).map(|i| from.of(i)).map(|(a, b)| (span(a).0, span(b).1)).collect();
    Some(DecodedText { encoding, bytes, raw })
}

/// Shortest text worth reading that decoded bytes may end early with: past it, whatever
/// came next in the run (a word of the same alphabet, a second value) is left out.
const MIN_TEXT_PREFIX: usize = 12;

/// How many of `bytes` read as text: all of them (when they are the `whole` decoding), or
/// the longest prefix of at least [`MIN_TEXT_PREFIX`] that is UTF-8 without control
/// characters; `None` if neither. Random bytes pass the prefix test with a chance of about
/// (95/256)^12, one in 150,000.
fn text_prefix(bytes: &[u8], whole: bool) -> Option<usize> {
    let valid = std::str::from_utf8(bytes).map_or_else(|e| e.valid_up_to(), str::len);
    let text = std::str::from_utf8(&bytes[..valid]).unwrap_or("");
    let end = text
        .char_indices()
        .find(|&(_, c)| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))
        .map_or(valid, |(i, _)| i);
    (end > 0 && ((whole && end == bytes.len()) || end >= MIN_TEXT_PREFIX)).then_some(end)
}

/// An encoding's output: the bytes, where each came from, and whether they are the whole
/// decoding (not cut at a control byte).
type Decoding = (Encoding, Vec<u8>, Sources, bool);

/// The first and last character each decoded byte came from.
enum Sources {
    /// Byte `i` from characters `2i` and `2i + 1`.
    Hex,
    /// Byte `3q + k` from characters `4q + k` and `4q + k + 1`.
    Base64,
    /// Byte `i` from characters `8i` to `8i + 7`.
    Binary,
    /// Byte `i` from characters `4i` to `4i + 3`.
    Jetty,
    Listed(Vec<(usize, usize)>),
}

impl Sources {
    fn of(&self, i: usize) -> (usize, usize) {
        match self {
            Sources::Hex => (2 * i, 2 * i + 1),
            Sources::Base64 => (4 * (i / 3) + i % 3, 4 * (i / 3) + i % 3 + 1),
            Sources::Binary => (8 * i, 8 * i + 7),
            Sources::Jetty => (4 * i, 4 * i + 3),
            Sources::Listed(from) => from.get(i).copied().unwrap_or_default(),
        }
    }
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn hex_byte(hi: u8, lo: u8) -> Option<u8> {
    Some(hex_value(hi)? << 4 | hex_value(lo)?)
}

/// A byte no text holds: an ASCII control character other than tab and line breaks.
/// Decoders stop at the first one (random bytes show one within a few bytes); what came
/// before may still be a text prefix.
fn is_control_byte(b: u8) -> bool {
    (b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r')) || b == 0x7f
}

fn hex(chars: &[u8]) -> Option<Decoding> {
    let bytes: Vec<u8> = chars
        .chunks_exact(2)
        .map(|pair| hex_byte(pair[0], pair[1]))
        .take_while(|b| b.is_some_and(|b| !is_control_byte(b)))
        .collect::<Option<_>>()?;
    let whole = bytes.len() == chars.len() / 2;
    Some((Encoding::Hex, bytes, Sources::Hex, whole))
}

/// Bytes written as eight binary digits each (`01001000 01101001`, in groups or not).
fn binary(chars: &[u8]) -> Decoding {
    let bytes: Vec<u8> = chars
        .chunks_exact(8)
        .map(|bits| bits.iter().fold(0u8, |acc, &b| acc << 1 | (b - b'0')))
        .take_while(|&b| !is_control_byte(b))
        .collect();
    let whole = bytes.len() == chars.len() / 8;
    (Encoding::Binary, bytes, Sources::Binary, whole)
}

/// Percent-decoding; needs at least two escapes (one `%` in a word is no encoding).
fn percent(chars: &[u8]) -> Option<Decoding> {
    let (mut bytes, mut from, mut escapes) = (Vec::new(), Vec::new(), 0);
    if chars.iter().filter(|&&c| c == b'%').count() < 2 {
        return None;
    }
    let mut i = 0;
    while i < chars.len() {
        let escape = (chars[i] == b'%').then(|| hex_byte(*chars.get(i + 1)?, *chars.get(i + 2)?)).flatten();
        match escape {
            Some(b) => {
                bytes.push(b);
                from.push((i, i + 2));
                escapes += 1;
                i += 3;
            }
            None => {
                bytes.push(chars[i]);
                from.push((i, i));
                i += 1;
            }
        }
    }
    (escapes >= 2).then_some((Encoding::Percent, bytes, Sources::Listed(from), true))
}

fn base64_value(b: u8, url_safe: bool) -> Option<u32> {
    match b {
        b'A'..=b'Z' => Some(u32::from(b - b'A')),
        b'a'..=b'z' => Some(u32::from(b - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(b - b'0') + 52),
        b'+' if !url_safe => Some(62),
        b'/' if !url_safe => Some(63),
        b'-' if url_safe => Some(62),
        b'_' if url_safe => Some(63),
        _ => None,
    }
}

/// `s` read as base64 (standard or URL-safe, padded or not) when it decodes to text
/// throughout, no control character in it: what a rule's `allow_decoded` patterns read.
pub(crate) fn base64_text(s: &str) -> Option<String> {
    match base64(s.as_bytes())? {
        (_, bytes, _, true) => String::from_utf8(bytes).ok(),
        _ => None,
    }
}

/// `s` read as hex (an even number of hex digits) when it decodes to text throughout: what
/// `allow_decoded` patterns read of a hex value (`6368616e676520…` is `change this password
/// to a secret`). A random key decodes to bytes no text holds within a few of them.
pub(crate) fn hex_text(s: &str) -> Option<String> {
    if s.is_empty() || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    match hex(s.as_bytes())? {
        (_, bytes, _, true) => String::from_utf8(bytes).ok(),
        _ => None,
    }
}

/// What a value says with its escapes undone, when it has some: percent escapes inside a
/// URL (`p%40ssword`), a string's byte escapes (`r\xe4ksm\xf6rg\xe5s`), JSON's `\uXXXX`
/// (`"password": "Contrase\u00f1a"`, as Python's `json.dumps` writes any text outside
/// ASCII), or Jetty's obfuscation (`OBF:…`).
pub(crate) fn unescaped_text(s: &str) -> Option<String> {
    if let Some(obfuscated) = s.strip_prefix("OBF:") {
        jetty_obfuscated_text(obfuscated)
    } else if s.contains('%') {
        byte_escaped_text(s, "%")
    } else if s.contains("\\x") {
        byte_escaped_text(s, "\\x")
    } else if s.contains("\\u") {
        json_unicode_text(s)
    } else {
        None
    }
}

/// What `s` says with its JSON `\uXXXX` escapes decoded (a surrogate pair as one
/// character), when it has one and every one decodes.
fn json_unicode_text(s: &str) -> Option<String> {
    let (mut out, mut rest, mut escaped) = (String::with_capacity(s.len()), s, false);
    while let Some(at) = rest.find("\\u") {
        out.push_str(&rest[..at]);
        let unit = |r: &str| {
            r.get(2..6)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u16::from_str_radix(h, 16).ok())
        };
        let high = unit(&rest[at..])?;
        rest = &rest[at + 6..];
        let c = match high {
            0xD800..=0xDBFF => {
                let low = rest.strip_prefix("\\u").and(unit(rest)).filter(|l| (0xDC00..=0xDFFF).contains(l))?;
                rest = &rest[6..];
                char::decode_utf16([high, low]).next()?.ok()?
            }
            _ => char::from_u32(u32::from(high))?,
        };
        out.push(c);
        escaped = true;
    }
    out.push_str(rest);
    (escaped && !out.chars().any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r'))).then_some(out)
}

/// What the body of a Jetty `OBF:` password says. Jetty's `Password.obfuscate` writes each
/// byte `b` with its mirror `m` (the byte as far from the end) as four base-36 digits of
/// `(127 + b + m) * 256 + (127 + b - m)`, or, where either is outside ASCII, as `U` and four
/// digits of `b * 256 + m`; anyone can undo it, so the value is the password itself.
fn jetty_obfuscated_text(body: &str) -> Option<String> {
    let (mut bytes, mut rest) = (Vec::with_capacity(body.len() / 4), body.as_bytes());
    while !rest.is_empty() {
        let byte = match rest {
            [b'U', group @ ..] if group.len() >= 4 => {
                rest = &group[4..];
                base36(&group[..4])? / 256
            }
            _ if rest.len() >= 4 => {
                let group = &rest[..4];
                rest = &rest[4..];
                u32::from(jetty_ascii_byte(group)?)
            }
            _ => return None,
        };
        bytes.push(u8::try_from(byte).ok()?);
    }
    if bytes.is_empty() || bytes.iter().any(|&b| is_control_byte(b)) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// Four lower-case base-36 digits as a number.
fn base36(group: &[u8]) -> Option<u32> {
    if !group.iter().all(|c| c.is_ascii_digit() || c.is_ascii_lowercase()) {
        return None;
    }
    u32::from_str_radix(std::str::from_utf8(group).ok()?, 36).ok()
}

/// The byte of one four-digit group of Jetty's obfuscation of ASCII text.
fn jetty_ascii_byte(group: &[u8]) -> Option<u8> {
    let value = base36(group)?;
    let (high, low) = (value / 256, value % 256);
    u8::try_from((high + low).checked_sub(254)? / 2).ok()
}

/// A run read as Jetty's obfuscation of ASCII text (the body after `OBF:`, which a run does
/// not hold): four lower-case base-36 digits a byte.
fn jetty_obfuscated(chars: &[u8]) -> Option<Decoding> {
    if !chars.len().is_multiple_of(4) {
        return None;
    }
    let bytes: Vec<u8> = chars
        .chunks_exact(4)
        .map(jetty_ascii_byte)
        .take_while(|b| b.is_some_and(|b| !is_control_byte(b)))
        .collect::<Option<_>>()?;
    let whole = bytes.len() == chars.len() / 4;
    Some((Encoding::JettyObf, bytes, Sources::Jetty, whole))
}

/// What `s` says with its byte escapes decoded, `marker` and two hex digits each (`%40` in
/// a URL: `p%40ssword` is `p@ssword`; `\xe4` in a C, Go or Python string), when it has one:
/// UTF-8 text where the bytes are, else each escaped byte read as Latin-1 (Go's test of an
/// ISO-8859-1 password, `r\xe4ksm\xf6rg\xe5s`, is `räksmörgås`).
fn byte_escaped_text(s: &str, marker: &str) -> Option<String> {
    let (mut bytes, mut latin1) = (Vec::with_capacity(s.len()), String::with_capacity(s.len()));
    let (mut escaped, mut rest) = (false, s);
    while let Some(at) = rest.find(marker) {
        let (before, from) = rest.split_at(at);
        bytes.extend_from_slice(before.as_bytes());
        latin1.push_str(before);
        let digits = from.as_bytes().get(marker.len()..marker.len() + 2);
        match digits.and_then(|d| hex_byte(d[0], d[1])) {
            Some(b) => {
                bytes.push(b);
                latin1.push(char::from(b));
                escaped = true;
                rest = &from[marker.len() + 2..];
            }
            None => {
                bytes.extend_from_slice(marker.as_bytes());
                latin1.push_str(marker);
                rest = &from[marker.len()..];
            }
        }
    }
    bytes.extend_from_slice(rest.as_bytes());
    latin1.push_str(rest);
    if !escaped || bytes.iter().any(|&b| is_control_byte(b)) {
        return None;
    }
    Some(String::from_utf8(bytes).unwrap_or(latin1))
}

/// Base64, standard or URL-safe (whichever the characters allow), padded or not.
fn base64(chars: &[u8]) -> Option<Decoding> {
    let data = chars.strip_suffix(b"==").or_else(|| chars.strip_suffix(b"=")).unwrap_or(chars);
    let padded = data.len() < chars.len();
    if data.len() % 4 == 1 || (padded && !chars.len().is_multiple_of(4)) {
        return None;
    }
    let url_safe = data.iter().any(|&b| b == b'-' || b == b'_');
    let mut bytes = Vec::with_capacity(data.len() * 3 / 4);
    for quantum in data.chunks(4) {
        let mut acc = 0u32;
        for &b in quantum {
            acc = acc << 6 | base64_value(b, url_safe)?;
        }
        // A quantum of n characters carries n - 1 bytes; byte k comes from characters k, k + 1.
        let n = quantum.len();
        acc <<= 6 * (4 - n as u32);
        for k in 0..n - 1 {
            let b = (acc >> (16 - 8 * k)) as u8;
            if is_control_byte(b) {
                return Some((Encoding::Base64, bytes, Sources::Base64, false));
            }
            bytes.push(b);
        }
    }
    Some((Encoding::Base64, bytes, Sources::Base64, true))
}

/// What one whitespace-separated word can be in a unit list.
#[derive(Debug, Clone, Copy, PartialEq)]
enum UnitWord {
    /// One character: a letter of a spelled-out text.
    Char,
    /// Hex bytes only (`6c`, `0x48`, `\x48\x65…`).
    Hex,
    /// A decimal character code only (`101`).
    Decimal,
    /// Two decimal digits: either (`48`).
    Either,
    /// Dots and dashes of two or more (`.-`, `-...`): a letter in Morse code.
    Morse,
    /// `.`, `-` or `/`: a spelled-out character, or Morse code's `E`, `T` or word gap.
    MorseOrChar,
}

/// The readings of a unit list, a bit each: what its words so far can all be.
const SPELLED: u8 = 1;
const HEX: u8 = 2;
const DECIMAL: u8 = 4;
const MORSE: u8 = 8;

impl UnitWord {
    fn readings(self) -> u8 {
        match self {
            UnitWord::Char => SPELLED,
            UnitWord::Hex => HEX,
            UnitWord::Decimal => DECIMAL,
            UnitWord::Either => HEX | DECIMAL,
            UnitWord::Morse => MORSE,
            UnitWord::MorseOrChar => MORSE | SPELLED,
        }
    }
}

/// Longest letter of Morse code read (digits and punctuation take five or six symbols).
const MAX_MORSE: usize = 7;

/// Whether `word` is dots and dashes only, as long as a Morse letter may be.
fn is_morse(word: &[char]) -> bool {
    (1..=MAX_MORSE).contains(&word.len()) && word.iter().all(|&c| c == '.' || c == '-')
}

/// Morse code's letters, digits and punctuation (ITU).
const MORSE_CODE: [(&str, u8); 54] = [
    (".-", b'A'),
    ("-...", b'B'),
    ("-.-.", b'C'),
    ("-..", b'D'),
    (".", b'E'),
    ("..-.", b'F'),
    ("--.", b'G'),
    ("....", b'H'),
    ("..", b'I'),
    (".---", b'J'),
    ("-.-", b'K'),
    (".-..", b'L'),
    ("--", b'M'),
    ("-.", b'N'),
    ("---", b'O'),
    (".--.", b'P'),
    ("--.-", b'Q'),
    (".-.", b'R'),
    ("...", b'S'),
    ("-", b'T'),
    ("..-", b'U'),
    ("...-", b'V'),
    (".--", b'W'),
    ("-..-", b'X'),
    ("-.--", b'Y'),
    ("--..", b'Z'),
    ("-----", b'0'),
    (".----", b'1'),
    ("..---", b'2'),
    ("...--", b'3'),
    ("....-", b'4'),
    (".....", b'5'),
    ("-....", b'6'),
    ("--...", b'7'),
    ("---..", b'8'),
    ("----.", b'9'),
    (".-.-.-", b'.'),
    ("--..--", b','),
    ("..--..", b'?'),
    (".----.", b'\''),
    ("-.-.--", b'!'),
    ("-..-.", b'/'),
    ("-.--.", b'('),
    ("-.--.-", b')'),
    (".-...", b'&'),
    ("---...", b':'),
    ("-.-.-.", b';'),
    ("-...-", b'='),
    (".-.-.", b'+'),
    ("-....-", b'-'),
    ("..--.-", b'_'),
    (".-..-.", b'"'),
    ("...-..-", b'$'),
    (".--.-.", b'@'),
];

fn morse_letter(code: &str) -> Option<u8> {
    MORSE_CODE.iter().find(|(c, _)| *c == code).map(|&(_, b)| b)
}

/// Classifies a word, its list punctuation already trimmed.
fn unit_word(word: &str) -> Option<UnitWord> {
    if word == "/" || word == "." || word == "-" {
        return Some(UnitWord::MorseOrChar);
    }
    if is_morse(&word.chars().collect::<Vec<_>>()) {
        return Some(UnitWord::Morse);
    }
    let mut chars = word.chars();
    if let (Some(_), None) = (chars.next(), chars.next()) {
        return Some(UnitWord::Char);
    }
    let b = word.as_bytes();
    if b.iter().all(u8::is_ascii_digit) {
        return match b.len() {
            2 => Some(UnitWord::Either),
            3 => Some(UnitWord::Decimal),
            _ => None,
        };
    }
    hex_word(word).map(|_| UnitWord::Hex)
}

/// The bytes of a hex word (`6c`, `0x6c`, `\x48\x65…`), each with its first character.
fn hex_word(word: &str) -> Option<Vec<(u8, usize)>> {
    let b = word.as_bytes();
    match b {
        [hi, lo] => Some(vec![(hex_byte(*hi, *lo)?, 0)]),
        [b'0', b'x' | b'X', hi, lo] => Some(vec![(hex_byte(*hi, *lo)?, 0)]),
        _ if !b.is_empty() && b.len().is_multiple_of(4) => b
            .chunks(4)
            .enumerate()
            .map(|(i, c)| match c {
                [b'\\', b'x', hi, lo] => Some((hex_byte(*hi, *lo)?, 4 * i)),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

/// Whether a word in progress may still turn out a unit once it ends: a character, a
/// number of up to three digits, a hex byte (`6c`, `0x6c`), or `\x` escapes, within list
/// punctuation. Most words of prose fail by their second or third character.
fn may_become_unit(word: &[char]) -> bool {
    if word.len() <= 1 {
        return true;
    }
    let (from, _) = trim_list(word);
    let core = &word[from..];
    let end = core.len() - core.iter().rev().take_while(|&&c| closes_list(c)).count();
    let body = &core[..end];
    let hex = |s: &[char]| s.iter().all(char::is_ascii_hexdigit);
    match body {
        [] | [_] => true,
        _ if body.iter().all(char::is_ascii_digit) => body.len() <= 3,
        ['\\', ..] => {
            body.chunks(4).all(|c| c[0] == '\\' && c.get(1).is_none_or(|&x| x == 'x') && hex(c.get(2..).unwrap_or(&[])))
        }
        _ if is_morse(body) || separated_chars(body).is_some() || joined_units_so_far(body) => true,
        [a, b] => hex(&[*a, *b]) || (*a == '0' && matches!(b, 'x' | 'X')),
        ['0', 'x' | 'X', rest @ ..] => rest.len() <= 2 && hex(rest),
        _ => false,
    }
}

/// The separator of a word of single characters joined by one separator (`4-R-t-8`,
/// `g.h.p`, maybe ending with it), if the word is one.
fn separated_chars(word: &[char]) -> Option<char> {
    let sep = *word.get(1)?;
    if !matches!(sep, '-' | '.' | '|' | '/' | ':' | '*' | '+') {
        return None;
    }
    let fits = |(i, &c): (usize, &char)| if i % 2 == 1 { c == sep } else { c != sep && !c.is_whitespace() };
    word.iter().enumerate().all(fits).then_some(sep)
}

/// Separators of units written without spaces (`72,101,108`, `48-65-6c`, `48:65:6c`).
fn joins_units(c: char) -> bool {
    matches!(c, ',' | '-' | ':' | ';')
}

/// Whether `part` is a byte of a joined list: a decimal code of two or three digits, or a
/// hex byte (`6c`, `0x6c`).
fn unit_part(part: &[char]) -> bool {
    let hex = |s: &[char]| s.len() == 2 && s.iter().all(char::is_ascii_hexdigit);
    match part {
        ['0', 'x' | 'X', rest @ ..] => hex(rest),
        _ => hex(part) || (part.len() == 3 && part.iter().all(char::is_ascii_digit)),
    }
}

/// The parts of a word of units joined by one separator without spaces (`72,101,108`,
/// `0x48,0x65`, `48-65-6c`), each a character range, if the word is one (two parts or more).
fn joined_units(word: &[char]) -> Option<Vec<(usize, usize)>> {
    let sep = *word.iter().find(|&&c| joins_units(c))?;
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, &c) in word.iter().enumerate().chain(std::iter::once((word.len(), &sep))) {
        if c == sep {
            parts.push((start, i));
            start = i + 1;
        }
    }
    (parts.len() >= 2 && parts.iter().all(|&(a, b)| unit_part(&word[a..b]))).then_some(parts)
}

/// Whether a word in progress may still become [`joined_units`]: whole parts so far, and a
/// last one that may still become one.
fn joined_units_so_far(word: &[char]) -> bool {
    let Some(&sep) = word.iter().find(|&&c| joins_units(c)) else { return false };
    let mut parts = word.split(|&c| c == sep);
    let last = parts.next_back().unwrap_or_default();
    let may_become = last.len() <= 4
        && last.iter().enumerate().all(|(i, c)| c.is_ascii_hexdigit() || (i == 1 && matches!(c, 'x' | 'X')));
    parts.all(unit_part) && may_become
}

/// Punctuation that may follow a list item: a closing bracket or quote, `,` or `;`.
fn closes_list(c: char) -> bool {
    matches!(c, ',' | ';' | ']' | ')' | '}' | '"' | '\'')
}

/// The word without list punctuation around it (opening brackets and quotes; closing ones,
/// quotes and a trailing `,` or `;`), as a character range. A word that is one such
/// character is kept: it may be a spelled-out character.
fn trim_list(word: &[char]) -> (usize, usize) {
    if word.len() == 1 {
        return (0, 1);
    }
    // A byte string's prefix (`b'\x48…'`) opens it like a quote.
    let prefix = usize::from(word.len() > 2 && word[0] == 'b' && matches!(word[1], '"' | '\''));
    let from = prefix + word[prefix..].iter().take_while(|c| matches!(c, '[' | '(' | '{' | '"' | '\'')).count();
    let to = word.len() - word[from..].iter().rev().take_while(|&&c| closes_list(c)).count();
    (from, to.max(from))
}

/// The unit list in progress.
#[derive(Debug, Default)]
struct UnitList {
    /// each unit word (trimmed) and the raw spans of its characters
    units: Vec<String>,
    unit_spans: Vec<Vec<(usize, usize)>>,
    /// the raw span of each unit word, for holding back
    spans: Vec<(usize, usize)>,
    /// units so far (a `\x48\x65…` word holds several)
    size: usize,
    /// per unit word: whether a wider gap (two or more whitespace characters) came before
    /// it, which a spelled-out text reads as a space between words
    spaced: Vec<bool>,
    /// what the words so far can all be read as ([`SPELLED`], [`HEX`], ...)
    readings: u8,
}

impl UnitList {
    fn accepts(&self, kind: UnitWord) -> bool {
        self.units.is_empty() || self.readings & kind.readings() != 0
    }

    /// Adds a word [`UnitList::accepts`]; `spaced`: a wider gap came before it.
    fn push(&mut self, kind: UnitWord, word: String, spans: &[(usize, usize)], spaced: bool) {
        self.readings = if self.units.is_empty() { kind.readings() } else { self.readings & kind.readings() };
        let whole = (spans.first().map_or(0, |s| s.0), spans.last().map_or(0, |s| s.1));
        self.size += hex_word(&word).filter(|_| kind == UnitWord::Hex).map_or(1, |b| b.len());
        self.spaced.push(spaced && !self.units.is_empty());
        self.units.push(word);
        self.unit_spans.push(spans.to_vec());
        self.spans.push(whole);
    }

    /// Judges the list, if long enough, in each reading its words allow, and empties it.
    fn close(&mut self, sink: &mut Sink<'_>) {
        if self.size >= MIN_UNITS {
            let readings = [
                (SPELLED, Encoding::Spelled),
                (HEX, Encoding::Hex),
                (DECIMAL, Encoding::CharCodes),
                (MORSE, Encoding::Morse),
            ];
            for (_, encoding) in readings.into_iter().filter(|r| self.readings & r.0 != 0) {
                if let Some(d) = self.decode(encoding) {
                    sink(&d);
                }
            }
        }
        self.units.clear();
        self.unit_spans.clear();
        self.spans.clear();
        self.spaced.clear();
        self.size = 0;
    }

    fn decode(&self, encoding: Encoding) -> Option<DecodedText> {
        let mut d = DecodedText { encoding, bytes: Vec::new(), raw: Vec::new() };
        let units = self.units.iter().zip(&self.unit_spans).zip(&self.spans).zip(&self.spaced);
        for (((word, spans), whole), &spaced) in units {
            match encoding {
                Encoding::Spelled => {
                    if spaced {
                        d.bytes.push(b' ');
                        d.raw.push(*whole);
                    }
                    d.bytes.extend_from_slice(word.as_bytes());
                    d.raw.extend(std::iter::repeat_n(*whole, word.len()));
                }
                Encoding::Hex => {
                    let bytes = hex_word(word)?;
                    let n = bytes.len();
                    for (b, at) in bytes {
                        // A `\x48\x65…` word: each byte spans its own escape.
                        let last = if n == 1 { spans.len() - 1 } else { at + 3 };
                        d.bytes.push(b);
                        d.raw.push((spans.get(at)?.0, spans.get(last)?.1));
                    }
                }
                Encoding::Morse => {
                    if spaced && d.bytes.last().is_some_and(|&b| b != b' ') {
                        d.bytes.push(b' ');
                        d.raw.push(*whole);
                    }
                    d.bytes.push(if word == "/" { b' ' } else { morse_letter(word)? });
                    d.raw.push(*whole);
                }
                _ => {
                    d.bytes.push(word.parse::<u8>().ok()?);
                    d.raw.push(*whole);
                }
            }
        }
        Some(d)
    }
}

/// Every text the encoded runs and unit lists of `text` say, to `MAX_DEPTH` layers: what
/// a prompt holds encoded is its sender's as much as what it holds in plain words.
pub fn decoded_texts(text: &str, cfg: &DecodeConfig) -> Vec<String> {
    let mut out = Vec::new();
    collect_decoded(text, cfg, 1, &mut out);
    out
}

fn collect_decoded(text: &str, cfg: &DecodeConfig, depth: usize, out: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    let mut found = Vec::new();
    let mut st = EncodedState::new(cfg, SEGMENT_CHARS);
    let mut sink = |d: &DecodedText| found.extend(d.text().map(str::to_owned));
    st.feed_plain(text, 0, &mut sink);
    st.finish(&mut sink);
    for inner in found {
        collect_decoded(&inner, cfg, depth + 1, out);
        out.push(inner);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(s: &str) -> Option<(Encoding, String)> {
        let d = decode_run(s.as_bytes(), |i| (i, i + 1), 1)?;
        Some((d.encoding, String::from_utf8(d.bytes).ok()?))
    }

    fn texts(s: &str) -> Vec<String> {
        decoded_texts(s, &DecodeConfig::default())
    }

    /// A decoded text as its sink got it: encoding, bytes, raw spans.
    type SinkCall = (Encoding, Vec<u8>, Vec<(usize, usize)>);

    /// Every decoded text a state hands its sink.
    fn sink_calls(text: &str, segment: usize, bulk: bool) -> Vec<SinkCall> {
        let mut calls = Vec::new();
        let mut st = EncodedState::new(&DecodeConfig::default(), segment);
        let mut sink = |d: &DecodedText| calls.push((d.encoding, d.bytes.clone(), d.raw.clone()));
        if bulk {
            st.feed_plain(text, 3, &mut sink);
        } else {
            for (i, c) in text.char_indices() {
                st.feed(c, false, (3 + i, 3 + i + c.len_utf8()), &mut sink);
            }
        }
        st.finish(&mut sink);
        calls
    }

    #[test]
    fn plain_text_fed_in_bulk_is_read_as_one_character_at_a_time() {
        const PIECES: [&str; 37] = [
            "dXNl cjpz M2Ny ZXRw ",
            "7573 6572 3a73 3363 ",
            "01110101 01110011 ",
            "SGVsbG8sIHdvcmxkIQ==",
            "dXNl",
            "cjpz",
            "M2Ny",
            "ZA==",
            "48",
            "65",
            "6c",
            "0x48,",
            "[72,",
            "101,",
            "7",
            "H",
            "-",
            ".",
            "%41%42%43",
            "the",
            "merger",
            "password",
            " ",
            " ",
            "  ",
            "\n",
            "\t",
            "[",
            "]",
            "é",
            "01001000",
            "01101001",
            "aGVsbG8gd29ybGQgaGVsbG8gd29ybGQ",
            "7-H-q-2",
            ".... .",
            "=",
            "токен",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut texts: Vec<String> = (0..3_000)
            .map(|_| {
                let n = 1 + next() % 60;
                (0..n).map(|_| PIECES[(next() % PIECES.len() as u64) as usize]).collect()
            })
            .collect();
        texts.push("SGVsbG8sIHdvcmxkIQ".repeat(600));
        texts.push(format!("x {} y", "dXNlcjpz".repeat(1_100)));
        for text in &texts {
            for segment in [SEGMENT_CHARS, 64, 16] {
                assert_eq!(sink_calls(text, segment, true), sink_calls(text, segment, false), "{segment}: {text:?}");
            }
        }
    }

    #[test]
    fn each_encoding_of_a_run_decodes() {
        assert_eq!(decoded("SGVsbG8sIHdvcmxkIQ=="), Some((Encoding::Base64, "Hello, world!".into())));
        assert_eq!(decoded("SGVsbG8sIHdvcmxkIQ"), Some((Encoding::Base64, "Hello, world!".into())));
        assert_eq!(decoded("PDw_Pz4-"), Some((Encoding::Base64, "<<??>>".into())));
        assert_eq!(decoded("48656c6c6f2c20776f726c6421"), Some((Encoding::Hex, "Hello, world!".into())));
        assert_eq!(decoded("Hello%2C%20world%21"), Some((Encoding::Percent, "Hello, world!".into())));
        assert_eq!(decoded("0100100001101001001000010010000100100001"), Some((Encoding::Binary, "Hi!!!".into())));
        let jetty = "19ye1sw01vun1x151x1b1lbo11tr1lfu1x1b1x1h1vun1svy19w8";
        assert_eq!(decoded(jetty), Some((Encoding::JettyObf, "Hello, world!".into())));
        assert_eq!(decoded("0123456789abcdefghijklmnopqrstuv"), None, "base-36 digits that say nothing");
        assert_eq!(decoded("100%"), None);
        assert_eq!(decoded("abcde"), None, "five characters are no base64");
        assert_eq!(decoded("ab+c-d"), None, "both alphabets at once");
    }

    #[test]
    fn a_json_escaped_value_reads_as_text() {
        assert_eq!(unescaped_text("Contrase\\u00f1a").as_deref(), Some("Contraseña"));
        assert_eq!(unescaped_text("\\u5bc6\\u7801").as_deref(), Some("密码"));
        assert_eq!(unescaped_text("\\ud83d\\udd11 key").as_deref(), Some("🔑 key"), "a surrogate pair");
        assert_eq!(unescaped_text("\\ud83d alone"), None, "half a pair");
        assert_eq!(unescaped_text("C:\\users\\x"), None, "no escape");
        assert_eq!(unescaped_text("\\u00zz"), None, "not hex");
        assert_eq!(unescaped_text("\\u+041"), None, "not hex either");
        assert_eq!(unescaped_text("a\\u0000b"), None, "not text");
        assert_eq!(unescaped_text("Tq9Wz4Kv7Lx2"), None);
    }

    #[test]
    fn a_byte_escaped_value_reads_as_text() {
        assert_eq!(
            unescaped_text("r\\xc3\\xa4ksm\\xc3\\xb6rg\\xc3\\xa5s").as_deref(),
            Some("räksmörgås"),
            "UTF-8 bytes"
        );
        assert_eq!(unescaped_text("r\\xe4ksm\\xf6rg\\xe5s").as_deref(), Some("räksmörgås"), "Latin-1 bytes");
        assert_eq!(unescaped_text("caf%E9").as_deref(), Some("café"), "Latin-1 in a URL");
        assert_eq!(unescaped_text("a\\x00b"), None, "not text");
        assert_eq!(unescaped_text("\\xzz"), None, "not hex");
    }

    #[test]
    fn a_hex_value_reads_as_text_only_when_it_is_text() {
        assert_eq!(hex_text("48656c6c6f2c20776f726c6421").as_deref(), Some("Hello, world!"));
        assert_eq!(hex_text("6d7920736563726574").as_deref(), Some("my secret"));
        assert_eq!(hex_text("9f86d081884c7d659a2feaa0c55ad015"), None, "a digest is no text");
        assert_eq!(hex_text("48656c6c6f2"), None, "an odd number of digits");
        assert_eq!(hex_text("Hello"), None);
    }

    #[test]
    fn a_jetty_obfuscated_password_reads_as_text() {
        // Jetty's documented keystore and key passwords, and a password outside ASCII.
        assert_eq!(unescaped_text("OBF:1vny1zlo1x8e1vnw1vn61x8g1zlu1vn4").as_deref(), Some("storepwd"));
        assert_eq!(unescaped_text("OBF:1u2u1wml1z7s1z7a1wnl1u2g").as_deref(), Some("keypwd"));
        assert_eq!(unescaped_text("OBF:1xmk1w261z0f1w1c1xmq").as_deref(), Some("otter"));
        assert_eq!(unescaped_text("OBF:U12ndU0xj7").as_deref(), Some("é"), "bytes outside ASCII");
        assert_eq!(unescaped_text("OBF:1vny1zl"), None, "a cut group");
        assert_eq!(unescaped_text("OBF:1VNY1ZLO"), None, "Jetty writes lower case");
        assert_eq!(unescaped_text("OBF:"), None, "nothing");
        assert_eq!(unescaped_text("OBF:0000"), None, "no byte");
    }

    #[test]
    fn a_percent_escaped_value_reads_as_text() {
        assert_eq!(unescaped_text("p%40ssword").as_deref(), Some("p@ssword"), "one escape is enough in a value");
        assert_eq!(unescaped_text("P%40ssw%25rd").as_deref(), Some("P@ssw%rd"));
        assert_eq!(unescaped_text("caf%C3%A9").as_deref(), Some("café"));
        assert_eq!(unescaped_text("100%"), None, "no escape");
        assert_eq!(unescaped_text("Tq9Wz4Kv7Lx2"), None, "no escape");
        assert_eq!(unescaped_text("a%FFb").as_deref(), Some("aÿb"), "Latin-1 where the bytes are no UTF-8");
        assert_eq!(unescaped_text("a%00b"), None, "not text");
    }

    #[test]
    fn each_unit_list_decodes() {
        assert_eq!(texts("id: 7 H q 2 L x 9 V b 4 ok"), ["7Hq2Lx9Vb4"]);
        assert_eq!(texts("t h e   m e r g e r   w i t h"), ["the merger with"]);
        assert_eq!(texts("['7', 'H', 'q', '2', 'L', 'x', '9', 'V']"), ["7Hq2Lx9V"]);
        assert_eq!(texts("48 65 6c 6c 6f 20 77 6f 72 6c 64"), ["Hello world"]);
        assert_eq!(texts("{0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x20, 0x77, 0x6f}"), ["Hello wo"]);
        assert_eq!(texts(r"b'\x48\x65\x6c\x6c\x6f\x20\x77\x6f'"), ["Hello wo"]);
        assert_eq!(texts("[72, 101, 108, 108, 111, 32, 119, 111]"), ["Hello wo"]);
        assert_eq!(texts("I am a cat and a dog, said I."), Vec::<String>::new());
        assert_eq!(texts("id 7-H-q-2-L-x-9-V-b-4 ok"), ["7Hq2Lx9Vb4"]);
        assert_eq!(texts("7.H.q.2. L.x.9.V"), ["7Hq2Lx9V"]);
        assert_eq!(texts("an e-mail, a re-run, a-b test, x-ray"), Vec::<String>::new());
        assert_eq!(texts(".... . .-.. .-.. --- / .-- --- .-. .-.. -.."), ["HELLO WORLD"]);
        assert_eq!(texts(".... . .-.. .-.. ---   .-- --- .-. .-.. -.. -.-.--"), ["HELLO WORLD!"]);
        assert_eq!(texts("Well... I think -- maybe - not ... or . at all -- ok"), Vec::<String>::new());
        assert_eq!(texts("[72,101,108,108,111,32,119,111]"), ["Hello wo"]);
        assert_eq!(texts("{0x48,0x65,0x6c,0x6c,0x6f,0x20,0x77,0x6f}"), ["Hello wo"]);
        assert_eq!(texts("48-65-6c-6c 6f:20:77:6f"), ["Hello wo"]);
        // Dates, times, versions, addresses and identifiers are no lists of bytes.
        for s in ["2023-01-01 12:30:45 1.2.3-rc1 00:1a:2b:3c:4d:5e:6f:70 555-123-4567", "ab-cd-ef-01-23-45-67-89"] {
            assert_eq!(texts(s), Vec::<String>::new(), "{s}");
        }
    }

    #[test]
    fn runs_written_in_groups_or_lines_are_read_whole() {
        // base64 of `user:s3cretpassw0rd`, in groups of four and wrapped at eight.
        assert_eq!(texts("dXNl cjpz M2Ny ZXRw YXNz dzBy ZA== ok"), ["user:s3cretpassw0rd"]);
        assert_eq!(texts("dXNlcjpz\nM2NyZXRw\nYXNzdzBy\nZA==\n"), ["user:s3cretpassw0rd"]);
        assert_eq!(texts("7573 6572 3a73 3363 7265 7470"), ["user:s3cretp"]);
        assert_eq!(texts("01110101 01110011 01100101 01110010 00111010 01110000"), ["user:p"]);
        // Prose of equal-length words decodes to nothing.
        assert_eq!(texts("This text uses many words with four or five chars each"), Vec::<String>::new());
    }

    #[test]
    fn decoded_bytes_map_back_to_the_characters_that_encode_them() {
        // "Hello, world!": bytes 7..12 are "world".
        let d = decode_run(b"SGVsbG8sIHdvcmxkIQ==", |i| (i, i + 1), 1).map(|d| d.raw_span(7, 12));
        assert_eq!(d, Some(Some((9, 16))));
        let h = decode_run(b"48656c6c6f", |i| (i, i + 1), 1).map(|d| d.raw);
        assert_eq!(h, Some(vec![(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]));
    }

    #[test]
    fn a_run_is_cut_after_padding_that_something_follows() {
        assert_eq!(parts(b"token=SGVsbG8="), vec![(0, 6), (6, 14)]);
        assert_eq!(parts(b"SGVsbA==SGVsbA=="), vec![(0, 8), (8, 16)]);
        assert_eq!(parts(b"SGVsbG8"), vec![(0, 7)]);
    }

    #[test]
    fn keys_hashes_and_identifiers_do_not_read_as_text() {
        for s in [
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "AKIAIOSFODNN7EXAMPLEwJalrXUtnFEMIK7MDENGbPxRfiCY",
            "ghp_R7dkQ2w9ZpLx4VbN8cT1sYhM3fJ6uE0aKq5W",
            "getUserAccountSettingsForTenant",
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
            "de ad be ef ca fe ba be 00 01 02 03",
        ] {
            assert_eq!(texts(s), Vec::<String>::new(), "{s}");
        }
    }

    #[test]
    fn layers_are_read_down_to_the_limit() {
        // base64 of `{"auth":"<base64 of user:s3cretpassw0rd>"}`
        assert_eq!(texts("dXNlcjpzM2NyZXRwYXNzdzByZA=="), ["user:s3cretpassw0rd"]);
        let got = texts("eyJhdXRoIjoiZFhObGNqcHpNMk55WlhSd1lYTnpkekJ5WkE9PSJ9");
        assert!(got.contains(&"user:s3cretpassw0rd".to_string()), "{got:?}");
        assert!(got.iter().any(|t| t.starts_with("{\"auth\"")), "{got:?}");
        // Spelled-out base64.
        let spelled: String = "dXNlcjpzM2NyZXRwYXNzdzByZA==".chars().map(|c| format!("{c} ")).collect();
        assert!(texts(&spelled).contains(&"user:s3cretpassw0rd".to_string()));
    }
}
