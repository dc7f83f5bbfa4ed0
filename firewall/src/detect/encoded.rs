//! Encoded runs: what a response says in base64, hex or percent-encoding is read decoded.
//!
//! A model told to "write it in base64" turns another tenant's secret, canary or paragraph
//! into characters no rule and no fingerprint knows, and a client decodes them in one line.
//! So every *run* of the text (a maximal stretch of characters from the encodings'
//! alphabets: letters, digits, `+ / = - _ %`) of at least [`DecodeConfig::min_chars`] is
//! decoded when it ends, and if it reads as text, that text is scanned like a response of
//! its own: secret rules and canaries, secret ownership, foreign n-grams and tokens, and
//! runs encoded inside it, down to [`MAX_DEPTH`] layers (a `.dockerconfigjson` is base64
//! of JSON holding base64). A finding there becomes a finding over the characters that
//! encode it, with its rule, verdict and owners, and [`Finding::encoding`] saying how it
//! was written.
//!
//! Which decoding: a run holding `%XX` escapes is percent-decoded; one of hex digits only,
//! of even length, is hex; any other is base64, standard or URL-safe, padded or not. A run
//! is cut after `=` that something follows (`token=SGVsbG8…`: padding ends a base64 value),
//! and each part is decoded on its own. Decoded bytes count as text only when they are
//! UTF-8 without control characters (tab and line breaks aside): random bytes pass with a
//! chance of about (95/256)^n, so keys, hashes and binary blobs, which honest answers carry
//! all the time, are left alone at no cost beyond the decode.
//!
//! Streaming: the open run is held back (it is one word of prose, or the blob), so no
//! prefix of an encoded leak reaches the client before it is judged; a run longer than the
//! segment bound (the stream's holdback, a multiple of four characters) is judged a
//! segment at a time, each aligned to whole base64 quanta. Line-wrapped base64 is decoded
//! line by line (a 76-character line is 19 whole quanta): a value cut by a line break is
//! not seen whole.

use serde::{Deserialize, Serialize};

use crate::canon::{Decoded, Kind};
use crate::detect::{Detectors, ScanContext};
use crate::rules::ruleset::Ruleset;
use crate::verdict::Finding;

/// Layers of encoding read through (base64 of JSON holding base64 is two).
pub const MAX_DEPTH: usize = 2;

/// How a finding's text was written in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    Base64,
    Hex,
    Percent,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::Base64 => "base64",
            Encoding::Hex => "hex",
            Encoding::Percent => "percent-encoding",
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

fn in_alphabet(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'-' | b'_' | b'%')
}

/// What a run's findings are scanned with, and how deep the scan already is.
#[derive(Clone, Copy)]
pub(crate) struct Reader<'a> {
    pub rules: &'a Ruleset,
    pub ctx: &'a ScanContext,
    pub detectors: &'a Detectors,
    pub depth: usize,
}

/// The run in progress over a text, fed its characters in order.
#[derive(Debug)]
pub(crate) struct EncodedState {
    /// the open run's characters (ASCII)
    chars: Vec<u8>,
    /// the raw byte span of each of them
    spans: Vec<(usize, usize)>,
    segment: usize,
}

impl EncodedState {
    /// `segment`: the longest stretch of a run held and judged at once, in characters.
    pub(crate) fn new(segment: usize) -> EncodedState {
        EncodedState { chars: Vec::new(), spans: Vec::new(), segment: (segment / 4 * 4).max(4) }
    }

    /// Feeds plain text (not JSON) at raw offset `at`.
    pub(crate) fn feed_plain(&mut self, reader: Reader<'_>, text: &str, at: usize, out: &mut Vec<Finding>) {
        for (i, &b) in text.as_bytes().iter().enumerate() {
            self.feed_byte(reader, b, (at + i, at + i + 1), out);
        }
    }

    /// Feeds one decoded character (JSON syntax ends a run: quotes delimit its strings).
    pub(crate) fn feed_char(&mut self, reader: Reader<'_>, d: Decoded, out: &mut Vec<Finding>) {
        let b = if d.kind != Kind::Syntax && d.c.is_ascii() { d.c as u8 } else { 0 };
        self.feed_byte(reader, b, (d.start, d.end), out);
    }

    fn feed_byte(&mut self, reader: Reader<'_>, b: u8, span: (usize, usize), out: &mut Vec<Finding>) {
        if !in_alphabet(b) {
            self.close(reader, out);
            return;
        }
        self.chars.push(b);
        self.spans.push(span);
        if self.chars.len() >= self.segment {
            self.close(reader, out);
        }
    }

    /// Judges the open run (the text has ended).
    pub(crate) fn finish(&mut self, reader: Reader<'_>, out: &mut Vec<Finding>) {
        self.close(reader, out);
    }

    /// Where held-back text starts: the open run's first byte.
    pub(crate) fn hold_from(&self) -> Option<usize> {
        self.spans.first().map(|s| s.0)
    }

    fn close(&mut self, reader: Reader<'_>, out: &mut Vec<Finding>) {
        if self.chars.len() >= reader.detectors.decode.as_ref().map_or(usize::MAX, |c| c.min_chars) {
            for (from, to) in parts(&self.chars) {
                judge(reader, &self.chars[from..to], &self.spans[from..to], out);
            }
        }
        self.chars.clear();
        self.spans.clear();
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

/// Decodes one part of a run and, when it reads as text, scans that text and adds its
/// findings over the characters that encode them.
fn judge(reader: Reader<'_>, chars: &[u8], spans: &[(usize, usize)], out: &mut Vec<Finding>) {
    let min = reader.detectors.decode.as_ref().map_or(usize::MAX, |c| c.min_chars);
    if chars.len() < min {
        return;
    }
    let Some(decoded) = decode(chars) else { return };
    let Ok(text) = std::str::from_utf8(&decoded.bytes) else { return };
    if !reads_as_text(text) {
        return;
    }
    let inner = reader.rules.scan_layer(text, reader.ctx, reader.detectors, reader.depth + 1);
    for mut f in inner {
        let Some((start, end)) = decoded.raw_span(f.start, f.end, spans) else { continue };
        let (match_start, match_end) = decoded.raw_span(f.match_start, f.match_end, spans).unwrap_or((start, end));
        (f.start, f.end, f.match_start, f.match_end) = (start, end, match_start, match_end);
        // The outermost layer is what the client sees.
        f.encoding = Some(decoded.encoding);
        out.push(f);
    }
}

/// Text, not bytes that happen to be UTF-8: no control characters but tab and line breaks.
fn reads_as_text(text: &str) -> bool {
    !text.is_empty() && text.chars().all(|c| !c.is_control() || matches!(c, '\t' | '\n' | '\r'))
}

/// A decoded part: its bytes, and for each byte the first and last character (indices in
/// the part) it was decoded from.
struct DecodedPart {
    encoding: Encoding,
    bytes: Vec<u8>,
    from: Vec<(u32, u32)>,
}

impl DecodedPart {
    /// The raw span of the characters that encode decoded bytes `start..end`.
    fn raw_span(&self, start: usize, end: usize, spans: &[(usize, usize)]) -> Option<(usize, usize)> {
        let first = self.from.get(start)?.0 as usize;
        let last = self.from.get(end.checked_sub(1)?.max(start))?.1 as usize;
        Some((spans.get(first)?.0, spans.get(last)?.1))
    }
}

fn decode(chars: &[u8]) -> Option<DecodedPart> {
    if chars.contains(&b'%') {
        return percent(chars);
    }
    if chars.len().is_multiple_of(2) && chars.iter().all(u8::is_ascii_hexdigit) {
        if let Some(d) = hex(chars) {
            return Some(d);
        }
    }
    base64(chars)
}

fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn hex(chars: &[u8]) -> Option<DecodedPart> {
    let mut bytes = Vec::with_capacity(chars.len() / 2);
    let mut from = Vec::with_capacity(chars.len() / 2);
    for (i, pair) in chars.chunks_exact(2).enumerate() {
        bytes.push(hex_value(pair[0])? << 4 | hex_value(pair[1])?);
        from.push((2 * i as u32, 2 * i as u32 + 1));
    }
    Some(DecodedPart { encoding: Encoding::Hex, bytes, from })
}

/// Percent-decoding; needs at least two escapes (one `%` in a word is no encoding).
fn percent(chars: &[u8]) -> Option<DecodedPart> {
    let (mut bytes, mut from, mut escapes) = (Vec::new(), Vec::new(), 0);
    let mut i = 0;
    while i < chars.len() {
        let escape = (chars[i] == b'%')
            .then(|| Some(hex_value(*chars.get(i + 1)?)? << 4 | hex_value(*chars.get(i + 2)?)?))
            .flatten();
        match escape {
            Some(b) => {
                bytes.push(b);
                from.push((i as u32, i as u32 + 2));
                escapes += 1;
                i += 3;
            }
            None => {
                bytes.push(chars[i]);
                from.push((i as u32, i as u32));
                i += 1;
            }
        }
    }
    (escapes >= 2).then_some(DecodedPart { encoding: Encoding::Percent, bytes, from })
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

/// Base64, standard or URL-safe (whichever the characters allow), padded or not.
fn base64(chars: &[u8]) -> Option<DecodedPart> {
    let data = chars.strip_suffix(b"==").or_else(|| chars.strip_suffix(b"=")).unwrap_or(chars);
    let padded = data.len() < chars.len();
    if data.len() % 4 == 1 || (padded && !chars.len().is_multiple_of(4)) {
        return None;
    }
    let url_safe = data.iter().any(|&b| b == b'-' || b == b'_');
    let mut bytes = Vec::with_capacity(data.len() * 3 / 4);
    let mut from = Vec::with_capacity(data.len() * 3 / 4);
    for (q, quantum) in data.chunks(4).enumerate() {
        let mut acc = 0u32;
        for &b in quantum {
            acc = acc << 6 | base64_value(b, url_safe)?;
        }
        let base = 4 * q as u32;
        // A quantum of n characters carries n - 1 bytes; byte k comes from characters k, k + 1.
        let n = quantum.len();
        acc <<= 6 * (4 - n as u32);
        for k in 0..n - 1 {
            bytes.push((acc >> (16 - 8 * k)) as u8);
            from.push((base + k as u32, base + k as u32 + 1));
        }
    }
    Some(DecodedPart { encoding: Encoding::Base64, bytes, from })
}

/// Every text the encoded runs of `text` say, to [`MAX_DEPTH`] layers: what a prompt holds
/// encoded is its sender's as much as what it holds in plain words.
pub fn decoded_texts(text: &str, cfg: &DecodeConfig) -> Vec<String> {
    let mut out = Vec::new();
    collect_decoded(text, cfg, 1, &mut out);
    out
}

fn collect_decoded(text: &str, cfg: &DecodeConfig, depth: usize, out: &mut Vec<String>) {
    if depth > MAX_DEPTH {
        return;
    }
    for run in text.as_bytes().split(|&b| !in_alphabet(b)) {
        for chunk in run.chunks(SEGMENT_CHARS) {
            for (from, to) in parts(chunk) {
                let part = &chunk[from..to];
                if part.len() < cfg.min_chars {
                    continue;
                }
                let Some(d) = decode(part) else { continue };
                let Ok(inner) = String::from_utf8(d.bytes) else { continue };
                if reads_as_text(&inner) {
                    collect_decoded(&inner, cfg, depth + 1, out);
                    out.push(inner);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(s: &str) -> Option<(Encoding, String)> {
        let d = decode(s.as_bytes())?;
        Some((d.encoding, String::from_utf8(d.bytes).ok()?))
    }

    #[test]
    fn each_encoding_decodes() {
        assert_eq!(decoded("SGVsbG8sIHdvcmxkIQ=="), Some((Encoding::Base64, "Hello, world!".into())));
        assert_eq!(decoded("SGVsbG8sIHdvcmxkIQ"), Some((Encoding::Base64, "Hello, world!".into())));
        assert_eq!(decoded("PDw_Pz4-"), Some((Encoding::Base64, "<<??>>".into())));
        assert_eq!(decoded("48656c6c6f2c20776f726c6421"), Some((Encoding::Hex, "Hello, world!".into())));
        assert_eq!(decoded("Hello%2C%20world%21"), Some((Encoding::Percent, "Hello, world!".into())));
        assert_eq!(decoded("100%"), None);
        assert_eq!(decoded("abcde"), None, "five characters are no base64");
        assert_eq!(decoded("ab+c-d"), None, "both alphabets at once");
    }

    #[test]
    fn decoded_bytes_map_back_to_the_characters_that_encode_them() {
        // "Hello, world!": bytes 7..12 are "world".
        let d = decode(b"SGVsbG8sIHdvcmxkIQ==").map(|d| d.from[7..12].to_vec());
        assert_eq!(d, Some(vec![(9, 10), (10, 11), (12, 13), (13, 14), (14, 15)]));
        let h = decode(b"48656c6c6f").map(|d| d.from);
        assert_eq!(h, Some(vec![(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]));
    }

    #[test]
    fn a_run_is_cut_after_padding_that_something_follows() {
        assert_eq!(parts(b"token=SGVsbG8="), vec![(0, 6), (6, 14)]);
        assert_eq!(parts(b"SGVsbA==SGVsbA=="), vec![(0, 8), (8, 16)]);
        assert_eq!(parts(b"SGVsbG8"), vec![(0, 7)]);
    }

    #[test]
    fn keys_hashes_and_identifiers_do_not_read_as_text() {
        let cfg = DecodeConfig::default();
        for s in [
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
            "AKIAIOSFODNN7EXAMPLEwJalrXUtnFEMIK7MDENGbPxRfiCY",
            "ghp_R7dkQ2w9ZpLx4VbN8cT1sYhM3fJ6uE0aKq5W",
            "getUserAccountSettingsForTenant",
            "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        ] {
            assert_eq!(decoded_texts(s, &cfg), Vec::<String>::new(), "{s}");
        }
    }

    #[test]
    fn layers_are_read_down_to_the_limit() {
        let cfg = DecodeConfig::default();
        // base64 of `{"auth":"<base64 of user:s3cretpassw0rd>"}`
        let inner = "dXNlcjpzM2NyZXRwYXNzdzByZA==";
        assert_eq!(decoded_texts(inner, &cfg), vec!["user:s3cretpassw0rd".to_string()]);
        let outer = "eyJhdXRoIjoiZFhObGNqcHpNMk55WlhSd1lYTnpkekJ5WkE9PSJ9";
        let got = decoded_texts(outer, &cfg);
        assert!(got.contains(&"user:s3cretpassw0rd".to_string()), "{got:?}");
        assert!(got.iter().any(|t| t.starts_with("{\"auth\"")), "{got:?}");
    }
}
