//! Credentials written as a name/value pair: the secret's name is one field's value, the
//! secret another field's, in the same record.
//!
//! ```text
//! env:
//!   - name: DB_PASSWORD
//!     value: Kq8Wz3Tv6Lx2
//! {"Name": "/prod/db/password", "Type": "SecureString", "Value": "Kq8Wz3Tv6Lx2"}
//! ```
//!
//! Kubernetes' env lists, AWS SSM parameters, CloudFormation's `ParameterKey` and
//! `ParameterValue`, Terraform's `secret_name` and `plaintext_value`, and the key/value
//! lists of many APIs write secrets so, and no rule reading `name = value` sees the name
//! next to the value. The value is read as its name would say it (`DB_PASSWORD:
//! Kq8Wz3Tv6Lx2`), as a table's cell is read under its header ([`super::table`] reads the
//! lines and judges what this gives), when the name holds a word a credential header
//! holds (`password`, `secret`, `token`, `api key`...).
//!
//! An XML element names its text so too (`<password>Kq8Wz3Tv6Lx2</password>` in Maven's
//! settings.xml, `<entry key="db.password">…</entry>`): its text, when its closing tag is on
//! its line, is read under its name, or under its `key` or `name` attribute's value.
//!
//! Every such format writes the name first, and only then is the value read: a value with
//! no name before it in its record stays as the line rules read it. A record is an object
//! on the name's line (JSON, YAML's flow style, HCL), or the lines from the name's on whose
//! keys start at the name's column or further in (a YAML mapping, an object written a field
//! a line): a value is read at the name's column, over at most [`MAX_LINES_APART`] lines.
//! So each line is read on its own, and a line without a credential's name in it changes
//! nothing while no name waits: a one-shot read skips it.

use super::table::CREDENTIAL_WORDS;
use crate::scan::keywords::KeywordFinder;

/// Field names that name a record (compared lowercased, without `_` and `-`).
const NAME_KEYS: [&str; 9] =
    ["name", "key", "parametername", "parameterkey", "secretname", "variable", "var", "envvar", "setting"];

/// Field names that hold a record's value (compared so too).
const VALUE_KEYS: [&str; 4] = ["value", "parametervalue", "plaintextvalue", "secretvalue"];

/// A credential's name holds one of these (ASCII, any case): a one-shot read looks at
/// lines with one.
const NAME_CORES: [&str; 7] = ["pass", "pwd", "secret", "token", "key", "credential", "auth"];

/// How many lines a name is kept waiting for its value.
pub const MAX_LINES_APART: u8 = 8;

/// The longest name kept.
const MAX_NAME_BYTES: usize = 128;

/// A credential's name waiting for its value.
#[derive(Debug, Clone, PartialEq)]
struct Pending {
    name: String,
    /// brackets open around its field
    depth: u32,
    /// where its key starts in its line (a YAML mapping's column)
    column: usize,
    /// lines read since it
    lines: u8,
}

/// The pair reader, fed whole lines in order (by the table reader, which holds its lines).
#[derive(Debug, Default)]
pub(crate) struct PairState {
    pending: Option<Pending>,
}

/// One `key: value` (or `key = value`) field of a line: its key's and its scalar value's
/// spans (inside quotes when quoted), and the brackets open around it in its line.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Field {
    /// where the key starts, its quote included (its column)
    at: usize,
    key: (usize, usize),
    value: (usize, usize),
    depth: u32,
    /// the value has ended in the line: a closing quote, or a flow collection's `,` `}` `]`
    /// after a bare value (a bare value at the line's end may go on)
    closed: bool,
}

impl PairState {
    /// Whether a name waits for its value.
    pub(crate) fn is_pending(&self) -> bool {
        self.pending.is_some()
    }

    /// Whether a name waits for a value the line in progress (as far as it has come) may
    /// still give: a stream holds the line while one does. A line that shows itself outdented
    /// from the name's column, or comes past the last line the name may wait, ends the wait
    /// as soon as that shows, as reading the whole line would.
    pub(crate) fn waits_on(&self, line: &str) -> bool {
        self.pending.as_ref().is_some_and(|p| p.lines < MAX_LINES_APART && !outdented(line, p.column))
    }

    /// Reads a line, handing out each value that follows a credential's name: the name and
    /// the value's span in `line`.
    pub(crate) fn read_line(&mut self, line: &str, out: &mut impl FnMut(&str, (usize, usize))) {
        // With no name waiting, only a line with a name field or a tag can matter.
        if self.pending.is_none() && name_key_at(line, 0).is_none() && memchr::memchr(b'<', line.as_bytes()).is_none() {
            return;
        }
        elements(line, |e| {
            if let Some(text) = e.text.filter(|t| t.0 < t.1) {
                out(e.name, text);
            }
        });
        if let Some(p) = &mut self.pending {
            p.lines += 1;
            if p.lines > MAX_LINES_APART || outdented(line, p.column) {
                self.pending = None;
            }
        }
        let pending = &mut self.pending;
        fields(line, |event| match event {
            Event::Close(depth) => {
                if pending.as_ref().is_some_and(|p| depth < p.depth) {
                    *pending = None;
                }
            }
            Event::Field(f) => {
                let key = &line[f.key.0..f.key.1];
                let value = &line[f.value.0..f.value.1];
                if key_in(key, &NAME_KEYS) {
                    *pending = names_credential(value).then(|| Pending {
                        name: value.to_string(),
                        depth: f.depth,
                        column: f.at,
                        lines: 0,
                    });
                } else if key_in(key, &VALUE_KEYS) && !value.is_empty() {
                    let in_record = pending.as_ref().is_some_and(|p| match p.lines {
                        0 => p.depth == f.depth,
                        _ => f.depth == 0 && p.column == f.at,
                    });
                    if let Some(p) = pending.take().filter(|_| in_record) {
                        out(&p.name, f.value);
                    }
                }
            }
        });
    }
}

/// Whether `line` (whole, or as far as it has come) starts left of `column`: it closes the
/// record a name at that column opened. A line of blanks so far shows nothing yet.
fn outdented(line: &str, column: usize) -> bool {
    let indent = line.len() - line.trim_start().len();
    indent < line.len() && indent < column
}

/// Where a line first names a credential in a field whose value has ended: the value's end.
/// A stream holds the line from there, as the secret may follow on the line; what comes
/// before is a name, which may go out. Reads the same on a line being written as on the
/// whole line, up to that field.
pub(crate) fn named_at(line: &str) -> Option<usize> {
    let mut at = None;
    fields(line, |event| {
        if let (Event::Field(f), None) = (event, at) {
            let named = key_in(&line[f.key.0..f.key.1], &NAME_KEYS);
            if f.closed && named && names_credential(&line[f.value.0..f.value.1]) {
                at = Some(f.value.1);
            }
        }
    });
    // An element named so holds from its opening tag's end.
    let mut opened = None;
    elements(line, |e| {
        opened = opened.or(Some(e.opened));
    });
    match (at, opened) {
        (Some(a), Some(o)) => Some(a.min(o)),
        (a, o) => a.or(o),
    }
}

/// An element whose name, or `key` or `name` attribute, is a credential's
/// (`<password>Kq8…</password>`, `<entry key="db.password">Kq8…</entry>`).
struct Element<'a> {
    name: &'a str,
    /// where its opening tag ends
    opened: usize,
    /// its text, when a closing tag ends it on the line
    text: Option<(usize, usize)>,
}

/// The elements of a line named as a credential's, whose opening tag ends on the line.
fn elements<'a>(line: &'a str, mut on: impl FnMut(Element<'a>)) {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(k) = memchr::memchr(b'<', &bytes[from..]) {
        let at = from + k;
        from = at + 1;
        if !bytes.get(at + 1).is_some_and(u8::is_ascii_alphabetic) {
            continue;
        }
        let tag_len = bytes[at + 1..].iter().take_while(|&&b| is_key_char(char::from(b)) || b == b':').count();
        let tag_end = at + 1 + tag_len;
        let Some(gt) = memchr::memchr(b'>', &bytes[tag_end..]).map(|g| tag_end + g) else { return };
        from = gt + 1;
        if bytes[gt - 1] == b'/' {
            continue;
        }
        let attributes = &line[tag_end..gt];
        let mut named_by = None;
        fields(attributes, |event| {
            if let Event::Field(f) = event {
                if named_by.is_none() && key_in(&attributes[f.key.0..f.key.1], &NAME_KEYS) {
                    named_by = Some(&attributes[f.value.0..f.value.1]);
                }
            }
        });
        let name = match named_by.filter(|n| names_credential(n)) {
            Some(n) => n,
            None if names_credential(&line[at + 1..tag_end]) => &line[at + 1..tag_end],
            None => continue,
        };
        let text =
            memchr::memchr(b'<', &bytes[gt + 1..]).map(|e| gt + 1 + e).filter(|&e| bytes.get(e + 1) == Some(&b'/'));
        let text = text.map(|end| {
            let raw = &line[gt + 1..end];
            let start = gt + 1 + (raw.len() - raw.trim_start().len());
            (start, start + raw.trim().len())
        });
        on(Element { name, opened: gt + 1, text });
    }
}

/// Where a line being written holds a name field: the separator after its key, the first
/// one at or after `from` (a quick test before [`named_at`] reads the line).
pub(crate) fn name_key_at(line: &str, from: usize) -> Option<usize> {
    let bytes = line.as_bytes();
    let mut at = from;
    while let Some(k) = memchr::memchr2(b':', b'=', bytes.get(at..)?) {
        let sep = at + k;
        let before = line[..sep].trim_end_matches([' ', '\t']);
        let before = before.strip_suffix(['"', '\'']).unwrap_or(before);
        // Key characters are ASCII: the key is the run of them that ends `before`.
        let start = before.len() - before.bytes().rev().take_while(|&b| is_key_char(char::from(b))).count();
        if start < before.len() && key_in(&before[start..], &NAME_KEYS) {
            return Some(sep);
        }
        at = sep + 1;
    }
    None
}

/// Whether a line may name a credential: a one-shot read skips lines without one of
/// [`NAME_CORES`] while no name is pending. The first such place from `from` on (where a
/// match ends first: a place on the same line as the leftmost).
pub(crate) fn next_core(bytes: &[u8], from: usize) -> Option<usize> {
    match core_automaton() {
        Some(ac) => ac.find(bytes.get(from..)?).map(|m| from + m.start()),
        None => Some(from),
    }
}

fn core_automaton() -> Option<&'static aho_corasick::AhoCorasick> {
    static CORES: std::sync::OnceLock<Option<aho_corasick::AhoCorasick>> = std::sync::OnceLock::new();
    CORES
        .get_or_init(|| aho_corasick::AhoCorasick::builder().ascii_case_insensitive(true).build(NAME_CORES).ok())
        .as_ref()
}

/// Every place of a whole text that may name a credential (each start of one of
/// [`NAME_CORES`], ASCII any case), read in order: what a one-shot read asks of [`next_core`]
/// line after line. The automaton walks every byte of source code (its words' first letters
/// are everywhere: `key`, `pass`, `auth`), 13 to 14 instructions a byte, a tenth of a scan of
/// the cargo registry's text; the keyword filter's SIMD loop reads the same text in one or
/// two. It searches [`CORE_WINDOW`] bytes at a time, so that a text of nothing but such
/// words keeps a window's places, not the whole text's.
#[derive(Debug)]
pub(crate) struct CoreStarts<'t> {
    bytes: &'t [u8],
    /// the places found in the last window searched, ascending
    starts: Vec<usize>,
    /// the first of `starts` not yet passed
    next: usize,
    /// where the windows searched so far end
    searched: usize,
}

/// Bytes searched for [`CoreStarts`] at a time.
const CORE_WINDOW: usize = 64 << 10;

impl<'t> CoreStarts<'t> {
    pub(crate) fn of(bytes: &'t [u8]) -> CoreStarts<'t> {
        CoreStarts { bytes, starts: Vec::new(), next: 0, searched: 0 }
    }

    /// The first place at or after `from`; `from` never goes back between calls.
    pub(crate) fn next_from(&mut self, from: usize) -> Option<usize> {
        loop {
            while self.starts.get(self.next).is_some_and(|&at| at < from) {
                self.next += 1;
            }
            if let Some(&at) = self.starts.get(self.next) {
                return Some(at);
            }
            if self.searched >= self.bytes.len() {
                return None;
            }
            if !self.search_window(from) {
                // No finder could be built: every place may name one.
                return Some(from);
            }
        }
    }

    /// Finds the places that start in the window from `from` (or from where the last one
    /// ended); false where no finder could be built.
    fn search_window(&mut self, from: usize) -> bool {
        static FINDER: std::sync::OnceLock<Option<KeywordFinder>> = std::sync::OnceLock::new();
        let finder = FINDER.get_or_init(|| KeywordFinder::build(&NAME_CORES).filter(KeywordFinder::is_accelerated));
        let low = from.max(self.searched);
        let end = low.saturating_add(CORE_WINDOW).min(self.bytes.len());
        // A word that starts before `end` may run past it.
        let longest = NAME_CORES.iter().map(|w| w.len()).max().unwrap_or(1);
        let bytes = self.bytes;
        let window = &bytes[low..end.saturating_add(longest.saturating_sub(1)).min(bytes.len())];
        self.starts.clear();
        self.next = 0;
        self.searched = end;
        let mut keep = |at: usize| {
            if low + at < end {
                self.starts.push(low + at);
            }
        };
        match (finder, core_automaton()) {
            (Some(finder), _) => finder.for_each(window, |_, at| keep(at)),
            (None, Some(ac)) => ac.find_overlapping_iter(window).for_each(|m| keep(m.start())),
            (None, None) => return false,
        }
        self.starts.sort_unstable();
        self.starts.dedup();
        true
    }
}

/// Whether `text` may hold a pair: a value field (a key ending in `value`, then a
/// separator) or a closing tag, and a credential's name.
pub(crate) fn may_hold_pairs(text: &str) -> bool {
    // `alue` in lower case or upper (`value`, `Value`, `VALUE`) is found with SIMD, then the
    // whole key checked.
    static ENDS: std::sync::OnceLock<[memchr::memmem::Finder<'static>; 2]> = std::sync::OnceLock::new();
    let ends = ENDS.get_or_init(|| [memchr::memmem::Finder::new("alue"), memchr::memmem::Finder::new("ALUE")]);
    let bytes = text.as_bytes();
    let value_field = ends.iter().any(|end| {
        end.find_iter(bytes).any(|at| {
            let key_end = at + end.needle().len();
            let key = &text[..key_end];
            let key_start = key.len() - key.bytes().rev().take_while(|&b| is_key_char(char::from(b))).count();
            key_in(&key[key_start..], &VALUE_KEYS) && separator_follows(&bytes[key_end..])
        })
    });
    // An element's text needs a closing tag.
    let element = memchr::memmem::find(bytes, b"</").is_some();
    (value_field || element) && next_core(bytes, 0).is_some()
}

/// Whether a key's closing quote (if any) and a separator come first in `rest`.
fn separator_follows(rest: &[u8]) -> bool {
    let at = rest.iter().position(|b| !matches!(b, b'"' | b'\'' | b' ' | b'\t'));
    at.is_some_and(|k| matches!(rest[k], b':' | b'='))
}

/// Whether a name is a credential's: it holds a word a table's credential header holds
/// (`DB_PASSWORD`, `/prod/api/token`, `AWS_SECRET_ACCESS_KEY`), `_` `-` `.` `/` read as
/// spaces. Those in ASCII only, and one of [`NAME_CORES`] with them, so that a one-shot
/// read skips no line a stream would read.
fn names_credential(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || next_core(name.as_bytes(), 0).is_none() {
        return false;
    }
    let spaced: String =
        name.chars().map(|c| if matches!(c, '_' | '-' | '.' | '/') { ' ' } else { c.to_ascii_lowercase() }).collect();
    CREDENTIAL_WORDS.iter().any(|w| w.is_ascii() && spaced.contains(w))
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Whether `key` is one of `keys`, compared lowercased without `_` and `-`:
/// `ParameterKey`, `secret_name`, `plaintext-value`.
fn key_in(key: &str, keys: &[&str]) -> bool {
    let mut normal = [0u8; 24];
    let mut len = 0;
    for b in key.bytes().filter(|b| !matches!(b, b'_' | b'-')) {
        let Some(slot) = normal.get_mut(len) else { return false };
        *slot = b.to_ascii_lowercase();
        len += 1;
    }
    keys.iter().any(|k| k.as_bytes() == &normal[..len])
}

enum Event {
    Field(Field),
    /// a bracket closed, leaving this many open
    Close(u32),
}

/// The fields of a line, JSON, YAML or HCL alike, and the brackets that close in it. A
/// value that is an object or a list is no field (its brackets count).
fn fields(line: &str, mut on: impl FnMut(Event)) {
    let bytes = line.as_bytes();
    let mut i = 0;
    let mut depth: u32 = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                on(Event::Close(depth));
                i += 1;
            }
            b'"' | b'\'' => {
                let (at, (key, after)) = (i, quoted(bytes, i));
                i = after;
                if let Some(f) = value_after(line, at, key, &mut i, depth) {
                    on(Event::Field(f));
                }
            }
            b if is_key_char(char::from(b)) => {
                let start = i;
                while i < bytes.len() && is_key_char(char::from(bytes[i])) {
                    i += 1;
                }
                if let Some(f) = value_after(line, start, (start, i), &mut i, depth) {
                    on(Event::Field(f));
                }
            }
            _ => i += 1,
        }
    }
}

/// The span inside the quotes that open at `open`, and where the text after the closing
/// quote starts (a backslash escapes in double quotes).
fn quoted(bytes: &[u8], open: usize) -> ((usize, usize), usize) {
    let quote = bytes[open];
    let mut j = open + 1;
    while j < bytes.len() && bytes[j] != quote {
        j += if quote == b'"' && bytes[j] == b'\\' { 2 } else { 1 };
    }
    let end = j.min(bytes.len());
    ((open + 1, end), (end + 1).min(bytes.len()))
}

/// The field whose key is `key`, when a separator and a scalar follow from `*i`: moves `*i`
/// past the value (or past the separator, when the value is an object or a list).
fn value_after(line: &str, at: usize, key: (usize, usize), i: &mut usize, depth: u32) -> Option<Field> {
    let bytes = line.as_bytes();
    let mut j = *i;
    while j < bytes.len() && matches!(bytes[j], b' ' | b'\t') {
        j += 1;
    }
    if !matches!(bytes.get(j), Some(b':' | b'=')) || key.0 == key.1 {
        return None;
    }
    j += 1;
    // `:=`, `=>` and `==` are separators too; a URL's `://` is none.
    if matches!(bytes.get(j), Some(b'=' | b'>')) {
        j += 1;
    } else if bytes.get(j) == Some(&b'/') {
        *i = j;
        return None;
    }
    while j < bytes.len() && matches!(bytes[j], b' ' | b'\t') {
        j += 1;
    }
    *i = j;
    let (value, closed) = match bytes.get(j) {
        Some(b'"' | b'\'') => {
            let (span, after) = quoted(bytes, j);
            *i = after;
            (span, span.1 < bytes.len())
        }
        None | Some(b'{' | b'[') => return None,
        Some(_) => {
            // A bare scalar ends at the line's end, or at a flow collection's `,` `}` `]`
            // when inside one; a ` #` starts a comment.
            let mut end = j;
            while end < bytes.len() && !(depth > 0 && matches!(bytes[end], b',' | b'}' | b']')) {
                if bytes[end] == b'#' && end > j && bytes[end - 1] == b' ' {
                    break;
                }
                end += 1;
            }
            *i = end;
            let trimmed = line[j..end].trim_end();
            ((j, j + trimmed.len()), depth > 0 && end < bytes.len() && bytes[end] != b'#')
        }
    };
    Some(Field { at, key, value, depth, closed })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (name, value) pairs of `text` read line by line.
    fn pairs_of(text: &str) -> Vec<(String, String)> {
        let mut st = PairState::default();
        let mut out = Vec::new();
        for line in text.lines() {
            st.read_line(line, &mut |name, (s, e)| out.push((name.to_string(), line[s..e].to_string())));
        }
        out
    }

    fn pair(name: &str, value: &str) -> (String, String) {
        (name.to_string(), value.to_string())
    }

    #[test]
    fn a_whole_texts_core_places_are_the_lines_next_core_finds() {
        // Overlapping words (`secretoken`), every case, words cut by a line break, and text
        // long enough for the SIMD loop and its tail.
        let text = "x secretoken y\nPASSword: 1\ncredentialkey\nau\nth pwd\tKEY\n".repeat(3)
            + "plain words only here, then Auth at the end";
        let bytes = text.as_bytes();
        let mut cores = CoreStarts::of(bytes);
        for from in 0..=bytes.len() {
            let (whole, alone) = (cores.next_from(from), next_core(bytes, from));
            assert_eq!(whole.is_some(), alone.is_some(), "from {from}");
            if let (Some(w), Some(a)) = (whole, alone) {
                assert!(from <= w && w <= a && !bytes[w..a].contains(&b'\n'), "from {from}: {w} against {a}");
            }
        }
        assert_eq!(CoreStarts::of(b"no such word").next_from(0), None);
    }

    #[test]
    fn core_places_across_search_windows_are_every_place() {
        // Words across each window's end, and a stretch of them only (a start every three
        // bytes), over three windows.
        let mut text = "x".repeat(CORE_WINDOW - 4) + "CREDENTIAL y";
        text += &"z".repeat(CORE_WINDOW - text.len() % CORE_WINDOW - 1);
        text += "token ";
        text += &"key".repeat(CORE_WINDOW / 3);
        text += "pw";
        let lower = text.to_ascii_lowercase();
        let every: Vec<usize> = (0..text.len())
            .filter(|&at| NAME_CORES.iter().any(|w| lower.as_bytes()[at..].starts_with(w.as_bytes())))
            .collect();
        let mut cores = CoreStarts::of(text.as_bytes());
        let mut found = Vec::new();
        let mut from = 0;
        while let Some(at) = cores.next_from(from) {
            found.push(at);
            from = at + 1;
        }
        assert_eq!(found, every);
        assert!(cores.starts.len() <= CORE_WINDOW / 3 + 1);
    }

    #[test]
    fn kubernetes_env_lists_give_their_credentials() {
        let text = "env:\n  - name: LOG_LEVEL\n    value: debug\n  - name: DB_PASSWORD\n    value: Kq8Wz3Tv6Lx2\n  - name: API_TOKEN\n    valueFrom:\n      secretKeyRef:\n        name: api\n        key: token\n  - name: STRIPE_API_KEY\n    value: \"sk_test_x9Kq2Wz7\"  # test mode\n  - name: CACHE_KEY\n    value: Zt7Wq2Kv9Lx4\n";
        assert_eq!(
            pairs_of(text),
            vec![pair("DB_PASSWORD", "Kq8Wz3Tv6Lx2"), pair("STRIPE_API_KEY", "sk_test_x9Kq2Wz7")]
        );
    }

    #[test]
    fn json_records_give_their_credentials_on_one_line_or_many() {
        let ssm = r#"{"Parameter": {"Name": "/prod/db/password", "Type": "SecureString", "Value": "Kq8Wz3Tv6Lx2", "Version": 3}}"#;
        assert_eq!(pairs_of(ssm), vec![pair("/prod/db/password", "Kq8Wz3Tv6Lx2")]);
        let list = "[\n  {\n    \"key\": \"db_password\",\n    \"value\": \"Kq8Wz3Tv6Lx2\"\n  },\n  {\"key\": \"region\", \"value\": \"eu-west-1\"}\n]";
        assert_eq!(pairs_of(list), vec![pair("db_password", "Kq8Wz3Tv6Lx2")]);
        let cfn = r#"[{"ParameterKey": "DBPassword", "ParameterValue": "Kq8Wz3Tv6Lx2"}]"#;
        assert_eq!(pairs_of(cfn), vec![pair("DBPassword", "Kq8Wz3Tv6Lx2")]);
        let terraform = "resource \"github_actions_secret\" \"db\" {\n  repository      = \"app\"\n  secret_name     = \"DB_PASSWORD\"\n  plaintext_value = \"Kq8Wz3Tv6Lx2\"\n}\n";
        assert_eq!(pairs_of(terraform), vec![pair("DB_PASSWORD", "Kq8Wz3Tv6Lx2")]);
    }

    #[test]
    fn elements_named_as_a_credential_give_their_text() {
        let text = "<servers>\n  <server>\n    <id>nexus</id>\n    <username>deploy</username>\n    <password>Kq8Wz3Tv6Lx2</password>\n  </server>\n</servers>\n<entry key=\"db.password\"> Zt7Wq2Kv9Lx4 </entry>\n<clientSecret><![CDATA[x]]></clientSecret><b>Password</b>: <i>see below</i>\n<token>\n  multi-line\n</token>\n<add key=\"ApiSecret\" />";
        assert_eq!(pairs_of(text), vec![pair("password", "Kq8Wz3Tv6Lx2"), pair("db.password", "Zt7Wq2Kv9Lx4")]);
        assert_eq!(named_at("<password>Kq8"), Some(10));
        assert_eq!(named_at("<pass"), None, "an opening tag not yet ended");
        assert_eq!(named_at(r#"{"name": "api_token", "x": 1} <secret>"#), Some(19), "the first of both");
    }

    #[test]
    fn a_value_outside_its_names_record_is_not_read() {
        for text in [
            // Another object's value.
            r#"[{"name": "db_password"}, {"name": "x", "value": "Kq8Wz3Tv6Lx2"}]"#,
            r#"[{"name": "db_password"}, {"value": "Kq8Wz3Tv6Lx2"}]"#,
            // Another list item, and a mapping further out.
            "- name: DB_PASSWORD\n- value: Kq8Wz3Tv6Lx2\n",
            "items:\n  - name: DB_PASSWORD\nvalue: Kq8Wz3Tv6Lx2\n",
            // A value before its name, and one too far below.
            r#"{"value": "Kq8Wz3Tv6Lx2", "name": "db_password"}"#,
            "- name: DB_PASSWORD\n  a: 1\n  b: 2\n  c: 3\n  d: 4\n  e: 5\n  f: 6\n  g: 7\n  h: 8\n  value: Kq8Wz3Tv6Lx2\n",
            // A name that is no credential's.
            "- name: LOG_LEVEL\n  value: Kq8Wz3Tv6Lx2\n",
        ] {
            assert_eq!(pairs_of(text), vec![], "{text}");
        }
    }

    #[test]
    fn a_named_line_is_held_from_the_names_end() {
        let line = r#"{"Name": "/prod/db/password", "Value": "Kq8"#;
        assert_eq!(named_at(line), line.find("\", \"Value"));
        assert_eq!(named_at(r#"{"Name": "/prod/db/pass"#), None, "the name may go on");
        assert_eq!(named_at("{name: db_token, value: x}"), Some(15));
        assert_eq!(named_at("- name: DB_PASSWORD"), None, "a bare name ends with its line");
        assert_eq!(named_at(r#"{"name": "region", "value": "x"}"#), None);
        assert_eq!(named_at(r#"{"key": "x", "name": "api_key"}"#), Some(29));
    }

    #[test]
    fn a_name_key_is_found_as_a_line_is_written() {
        let line = r#"{"Name": "/prod/db/password", "Value": "#;
        assert_eq!(name_key_at(line, 0), Some(7));
        assert_eq!(name_key_at("- name: DB_PASSWORD", 0), Some(6));
        assert_eq!(name_key_at("secret_name = \"x\"", 0), Some(12));
        assert_eq!(name_key_at("url: https://x/?name=1", 4), Some(20));
        assert_eq!(name_key_at("value: 1, other: 2", 0), None);
        let line = "ключ: 1, имя=2, «name»: 3, имяname: 4";
        assert_eq!(name_key_at(line, 0), line.find("name: 4").map(|i| i + 4), "after letters outside ASCII");
    }
}
