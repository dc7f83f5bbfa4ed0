//! JSON mode of the canonical view: the raw text is JSON (a tool call's arguments as they
//! stream); inside strings, escapes (`\n \t \r \" \\ \/ \b \f \uXXXX`, surrogate pairs
//! included) are decoded, so the detectors read what a client reads after `JSON.parse`.
//! Outside strings, text is syntax (a boundary between words). An escape split across
//! pushes waits, raw bytes buffered, until its last character; a broken one reads as
//! written, a lone surrogate as U+FFFD.

use super::{Decoded, Kind};

/// JSON string decoder state.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Json {
    #[default]
    Outside,
    InString,
    /// after `\`
    Escape,
    /// inside `\uXXXX`
    Hex,
    /// a high surrogate was read; its pair must follow: `\`, `u`, then four digits
    PairBackslash,
    PairU,
    PairHex,
}

/// Decodes JSON text: string contents with their escapes, the rest as syntax.
#[derive(Debug, Clone, Default)]
pub(super) struct JsonDecoder {
    state: Json,
    // raw text of the escape in progress (ASCII), from `esc_start`
    esc: String,
    esc_start: usize,
}

impl JsonDecoder {
    pub(super) fn in_string() -> JsonDecoder {
        JsonDecoder { state: Json::InString, ..JsonDecoder::default() }
    }

    pub(super) fn feed(&mut self, text: &str, at: usize, emit: &mut impl FnMut(Decoded)) {
        for (i, c) in text.char_indices() {
            self.char(c, at + i, emit);
        }
    }

    fn char(&mut self, c: char, pos: usize, emit: &mut impl FnMut(Decoded)) {
        let end = pos + c.len_utf8();
        match self.state {
            Json::Outside | Json::InString if c == '"' => {
                self.state = if self.state == Json::Outside { Json::InString } else { Json::Outside };
                emit(Decoded { c, start: pos, end, kind: Kind::Syntax });
            }
            Json::Outside => emit(Decoded { c, start: pos, end, kind: Kind::Syntax }),
            Json::InString if c == '\\' => {
                self.esc.clear();
                self.esc.push(c);
                self.esc_start = pos;
                self.state = Json::Escape;
            }
            Json::InString => emit(Decoded { c, start: pos, end, kind: Kind::Text }),
            Json::Escape => {
                let decoded = match c {
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    '"' | '\\' | '/' => c,
                    'u' => {
                        self.esc.push(c);
                        self.state = Json::Hex;
                        return;
                    }
                    _ => return self.invalid(c, pos, emit),
                };
                self.state = Json::InString;
                emit(Decoded { c: decoded, start: self.esc_start, end, kind: Kind::Escape });
            }
            Json::Hex | Json::PairHex if c.is_ascii_hexdigit() => {
                self.esc.push(c);
                if self.esc.len() == 6 || self.esc.len() == 12 {
                    self.unicode_escape(end, emit);
                }
            }
            Json::PairBackslash if c == '\\' => {
                self.esc.push(c);
                self.state = Json::PairU;
            }
            Json::PairU if c == 'u' => {
                self.esc.push(c);
                self.state = Json::PairHex;
            }
            Json::Hex | Json::PairHex | Json::PairBackslash | Json::PairU => self.invalid(c, pos, emit),
        }
    }

    /// A complete `\uXXXX` (or a high surrogate's escape followed by a second one) is in `esc`.
    fn unicode_escape(&mut self, end: usize, emit: &mut impl FnMut(Decoded)) {
        let unit = |s: &str| u32::from_str_radix(s, 16).unwrap_or(0xFFFD);
        if self.esc.len() == 6 {
            let u = unit(&self.esc[2..6]);
            if (0xD800..0xDC00).contains(&u) {
                self.state = Json::PairBackslash;
                return;
            }
            self.state = Json::InString;
            let c = char::from_u32(u).unwrap_or('\u{FFFD}');
            return emit(Decoded { c, start: self.esc_start, end, kind: Kind::Escape });
        }
        let (hi, lo) = (unit(&self.esc[2..6]), unit(&self.esc[8..12]));
        if (0xDC00..0xE000).contains(&lo) {
            self.state = Json::InString;
            let c = char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)).unwrap_or('\u{FFFD}');
            return emit(Decoded { c, start: self.esc_start, end, kind: Kind::Escape });
        }
        // A lone high surrogate, then an escape of its own.
        emit(Decoded { c: '\u{FFFD}', start: self.esc_start, end: self.esc_start + 6, kind: Kind::Escape });
        let rest = self.esc.split_off(6);
        self.esc_start += 6;
        self.esc = rest;
        self.unicode_escape(end, emit);
    }

    /// `c` cannot continue the escape in `esc`: a lone high surrogate reads as U+FFFD, the
    /// other buffered characters as themselves, and `c` is read afresh.
    fn invalid(&mut self, c: char, pos: usize, emit: &mut impl FnMut(Decoded)) {
        self.flush(emit);
        self.char(c, pos, emit);
    }

    /// Emits the escape in progress as it reads unfinished.
    pub(super) fn flush(&mut self, emit: &mut impl FnMut(Decoded)) {
        let mut from = 0;
        if matches!(self.state, Json::PairBackslash | Json::PairU | Json::PairHex) {
            emit(Decoded { c: '\u{FFFD}', start: self.esc_start, end: self.esc_start + 6, kind: Kind::Escape });
            from = 6;
        }
        if !matches!(self.state, Json::Outside | Json::InString) {
            self.state = Json::InString;
            for (i, c) in self.esc.char_indices().skip_while(|&(i, _)| i < from) {
                emit(Decoded {
                    c,
                    start: self.esc_start + i,
                    end: self.esc_start + i + c.len_utf8(),
                    kind: Kind::Text,
                });
            }
        }
        self.esc.clear();
    }
}
