//! Credentials in a table's columns: the name of a secret is in the header row, its values
//! in the rows below, out of reach of any rule that reads a line.
//!
//! ```text
//! | Service  | User   | Password     |
//! |----------|--------|--------------|
//! | Postgres | app_rw | Kq8Wz3Tv6Lx2 |
//! ```
//!
//! Answers lay out accounts this way all the time, as markdown, as a database client's
//! result (`+----+` or `----+----` delimiter rows, or drawn with box-drawing characters as
//! DuckDB, `sqlite3 -box`, psql's unicode style and Python's rich print them) or as CSV,
//! TSV and semicolon-separated values (a header line of short names, then lines with as
//! many fields). Each cell under a header that names a credential
//! (`Password`, `API key`, `Token`, `Пароль`...) is read as the header would say it,
//! `Password: Kq8Wz3Tv6Lx2`, and that text is scanned with the rules: the rules, their allow
//! lists and the generic-secret judge decide, as for any `name: value` the response wrote
//! itself, and findings lie over the cell. What the rules find in the cell alone (a provider
//! token) the scan of the line finds already and is not reported twice.
//!
//! Rows are read whole, so a stream holds a row of such a table (and the line after a CSV
//! header) from its first byte until its line ends; only [`MAX_ROW_BYTES`] of a row are
//! read, one-shot as streaming, which bounds the hold. The one-shot reader gives what the
//! stream's gives, faster: it skips the lines that cannot change anything.
//!
//! The same lines feed two more readers of values named away from them: name/value pairs
//! and XML elements ([`super::pairs`]), and HTML tables ([`super::html_table`]), whose
//! cells are candidates only.

use std::borrow::Cow;

use crate::canon::{Decoded, Kind};
use crate::rules::ruleset::Ruleset;
use crate::stream::pass::merge_findings;
use crate::verdict::{Action, DetectorKind, Finding};

use super::html_table::{self, HtmlTable};
use super::pairs::{self, PairState};
use super::ScanContext;

/// The longest stretch of a row that is read (and held back while it streams).
pub const MAX_ROW_BYTES: usize = 1024;

/// `<table`'s length.
const TABLE_TAG_LEN: usize = 6;

/// Columns past this are not read.
const MAX_COLUMNS: usize = 32;

/// A header naming a credential column holds one of these (lowercased).
pub(super) const CREDENTIAL_WORDS: [&str; 24] = [
    "password",
    "passwd",
    "passphrase",
    "pwd",
    "secret",
    "token",
    "api key",
    "api_key",
    "apikey",
    "api-key",
    "access key",
    "private key",
    "credential",
    "пароль",
    "токен",
    "ключ api",
    "секрет",
    "contraseña",
    "passwort",
    "kennwort",
    "mot de passe",
    "密码",
    "口令",
    "密钥",
];

/// ... and when it also holds one of these, it names something about the credential
/// rather than the credential (`Token name`, `Password policy`, `Secret ID`): its cells are
/// only candidates, which a tenant's known secret still blocks (the header is the
/// response's own words, and wording must not hide another tenant's secret).
const ABOUT_WORDS: [&str; 16] = [
    "name",
    "id",
    "type",
    "hash",
    "policy",
    "length",
    "expir",
    "rotation",
    "scope",
    "description",
    "format",
    "location",
    "path",
    "url",
    "required",
    "usage",
];

/// A cell under a credential header, labelled with it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LabelledCell {
    /// `header: cell`
    text: String,
    /// where the cell starts in `text`
    label_len: usize,
    /// where the cell starts in the raw text
    raw_start: usize,
    /// where its row starts in the raw text: a finding's match starts there, as a rule's
    /// match starts at the name before the value
    row_start: usize,
    /// the header names something about a credential: findings are candidates
    about: bool,
    /// the raw span of each byte of the cell, where the text was decoded (JSON strings);
    /// None where the cell is the raw text from `raw_start` on
    raw: Option<Vec<(usize, usize)>>,
}

impl LabelledCell {
    /// The raw span of cell bytes `start..end`.
    fn raw_span(&self, start: usize, end: usize) -> (usize, usize) {
        match &self.raw {
            None => (self.raw_start + start, self.raw_start + end),
            Some(spans) => {
                let first = spans.get(start).map_or(self.raw_start, |s| s.0);
                let last = end.checked_sub(1).and_then(|e| spans.get(e.max(start))).map_or(first, |s| s.1);
                (first, last.max(first))
            }
        }
    }
}

/// A credential column: its index, its header, and whether the header is about one.
pub(super) type Column = (usize, String, bool);

/// How a table separates its cells.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Layout {
    /// Markdown (and database clients): `|` between cells, a delimiter row under the header.
    Pipes,
    /// CSV, TSV or semicolon-separated: `,`, a tab or `;` between cells, a header line and
    /// then rows with as many.
    Separated(u8),
}

impl Layout {
    fn cells(self, line: &str) -> Vec<(usize, usize)> {
        match self {
            Layout::Pipes => cell_spans(line),
            Layout::Separated(sep) => separated_spans(line, sep),
        }
    }
}

/// A line that can head a table: its layout, how many cells it has, and its credential
/// columns.
#[derive(Debug, Clone, PartialEq)]
struct Head {
    layout: Layout,
    cells: usize,
    columns: Vec<Column>,
    /// a line came between it and its delimiter row (the column types DuckDB prints under
    /// the names): one may, no more
    waited: bool,
}

/// The reader of labelled cells, fed a text in order (the whole of it one-shot, deltas when
/// streaming): tables' columns, and on the same lines name/value pairs
/// ([`super::pairs`]) and HTML tables ([`super::html_table`]).
#[derive(Debug)]
pub(crate) struct TableState {
    /// the line in progress, up to `row_bytes`
    line: String,
    row_bytes: usize,
    line_start: usize,
    /// the line reached the limit and was read; the rest of it is skipped
    line_read: bool,
    /// the line before, in each layout it can head a table in (with credential columns, or
    /// any row of pipes)
    heads: Vec<Head>,
    /// the table being read; one without credential columns is read only to its end
    table: Option<Head>,
    /// which layouts a line is tried as a header in (a one-shot scan leaves out those the
    /// text cannot hold)
    pipes: bool,
    separated: bool,
    /// fed decoded characters ([`TableState::feed_char`]): the raw span of each byte of
    /// `line`
    decoded: Option<Vec<(usize, usize)>>,
    /// name/value pairs ([`super::pairs`]), read from the same lines unless the text
    /// holds none
    pairs: PairState,
    pairs_on: bool,
    /// the line in progress has a name field's key or a tag, and a credential word: each
    /// value or tag that ends in it may name a credential
    names_in_line: bool,
    credential_in_line: bool,
    /// how far the line in progress was looked at for a credential word
    words_read_to: usize,
    /// where the line in progress names a credential (raw offset): its secret may follow
    /// on the line
    pair_hold: Option<usize>,
    /// the HTML table open ([`super::html_table`]), read unless the text holds none
    html: Option<HtmlTable>,
    html_on: bool,
    /// where the line in progress opens an HTML table (raw offset)
    html_hold: Option<usize>,
}

impl TableState {
    /// A reader that reads `row_bytes` of each row.
    pub(crate) fn new(row_bytes: usize) -> TableState {
        TableState {
            line: String::new(),
            row_bytes,
            line_start: 0,
            line_read: false,
            heads: Vec::new(),
            table: None,
            pipes: true,
            separated: true,
            decoded: None,
            pairs: PairState::default(),
            pairs_on: true,
            names_in_line: false,
            credential_in_line: false,
            words_read_to: 0,
            pair_hold: None,
            html: None,
            html_on: true,
            html_hold: None,
        }
    }

    /// A reader of name/value pairs only, fed raw JSON: a tool call's own arguments.
    pub(crate) fn pairs_only(row_bytes: usize) -> TableState {
        TableState { pipes: false, separated: false, html_on: false, ..TableState::new(row_bytes) }
    }

    /// A reader fed decoded characters (JSON strings, whose line breaks are escapes): a
    /// string's quotes and the JSON around strings end a line too.
    pub(crate) fn decoded(row_bytes: usize) -> TableState {
        TableState { decoded: Some(Vec::new()), ..TableState::new(row_bytes) }
    }

    pub(crate) fn is_decoded(&self) -> bool {
        self.decoded.is_some()
    }

    /// Reads one decoded character.
    pub(crate) fn feed_char(&mut self, d: Decoded, cells: &mut impl FnMut(LabelledCell)) {
        if d.kind == Kind::Syntax || d.c == '\n' {
            if !self.line_read {
                let line = std::mem::take(&mut self.line);
                self.read_line(&line, cells);
                self.line = line;
            }
            self.line.clear();
            if let Some(spans) = &mut self.decoded {
                spans.clear();
            }
            self.line_read = false;
            self.line_start = d.end;
            self.end_line_in_progress();
            return;
        }
        if self.line_read {
            return;
        }
        if self.line.is_empty() {
            self.line_start = d.start;
        }
        // As `feed` cuts a line: what does not fit is not read, and a full line is read.
        let fits = self.line.len() + d.c.len_utf8() <= self.row_bytes;
        if fits {
            self.line.push(d.c);
            if let Some(spans) = &mut self.decoded {
                spans.extend(std::iter::repeat_n((d.start, d.end), d.c.len_utf8()));
            }
            if matches!(d.c, ':' | '=' | '"' | '\'' | ',' | '}' | ']' | '<' | '>') {
                self.look_for_names(self.line.len() - d.c.len_utf8());
            }
            if !d.c.is_ascii_alphanumeric() {
                self.look_for_table(self.line.len().saturating_sub(7 + d.c.len_utf8()));
            }
        }
        if !fits || self.line.len() >= self.row_bytes {
            let line = std::mem::take(&mut self.line);
            self.read_line(&line, cells);
            self.line = line;
            self.line_read = true;
        }
    }

    /// Reads `text`, found at raw offset `at`, handing out each credential cell of a
    /// completed row.
    pub(crate) fn feed(&mut self, text: &str, at: usize, cells: &mut impl FnMut(LabelledCell)) {
        let mut from = 0;
        while from < text.len() {
            let rest = &text[from..];
            let (part, ends_line) = match memchr::memchr(b'\n', rest.as_bytes()) {
                Some(nl) => (&rest[..nl], true),
                None => (rest, false),
            };
            if !self.line_read {
                let room = self.row_bytes.saturating_sub(self.line.len());
                let take = floor_boundary(part, part.len().min(room));
                let from = self.line.len();
                self.line.push_str(&part[..take]);
                self.look_for_names(from);
                self.look_for_table(from.saturating_sub(6));
                if take < part.len() || self.line.len() >= self.row_bytes {
                    let line = std::mem::take(&mut self.line);
                    self.read_line(&line, cells);
                    self.line = line;
                    self.line_read = true;
                }
            }
            from += part.len();
            if ends_line {
                if !self.line_read {
                    let line = std::mem::take(&mut self.line);
                    self.read_line(&line, cells);
                    self.line = line;
                }
                from += 1;
                self.line.clear();
                self.line_read = false;
                self.line_start = at + from;
                self.end_line_in_progress();
            }
        }
    }

    /// Reads a whole text from its start: what [`TableState::feed`] then
    /// [`TableState::finish`] read, without copying each line.
    pub(crate) fn read_all(&mut self, text: &str, cells: &mut impl FnMut(LabelledCell)) {
        // A box-drawn table's lines hold no `|` for the skip below to find. Its ASCII twin
        // has the same length and line breaks; a row is cut where the text's characters
        // allow, as `feed` cuts it.
        let raw = text;
        let boxed = box_ascii(text);
        let text = boxed.as_ref();
        let bytes = text.as_bytes();
        let mut start = 0;
        // The next `;` at or after `start` that can separate fields, kept between lines: code
        // has one on most lines, and searching for it again from each would read them twice.
        let mut semicolon: Option<usize> = None;
        let mut semicolons_left = self.separated;
        // The next place that may name a credential for a pair, and the next `<table`, kept
        // so too.
        let mut core: Option<usize> = None;
        let mut cores_left = self.pairs_on;
        let mut cores = self.pairs_on.then(|| pairs::CoreStarts::of(bytes));
        let mut html: Option<usize> = None;
        let mut html_left = self.html_on;
        loop {
            if self.table.is_none() && self.heads.is_empty() && !self.pairs.is_pending() && self.html.is_none() {
                // Outside a table, a line without a separator changes nothing: go straight
                // to the line of the next one (most of a text is skipped so).
                let mut next = memchr::memchr3(b'|', b',', b'\t', &bytes[start..]).map(|k| start + k);
                if semicolons_left {
                    if semicolon.is_none_or(|at| at < start) {
                        semicolon = next_field_semicolon(bytes, start);
                        semicolons_left = semicolon.is_some();
                    }
                    next = earliest(next, semicolon);
                }
                if cores_left {
                    if core.is_none_or(|at| at < start) {
                        core = cores.as_mut().and_then(|c| c.next_from(start));
                        cores_left = core.is_some();
                    }
                    next = earliest(next, core);
                }
                if html_left {
                    if html.is_none_or(|at| at < start) {
                        html = html_table::next_table_tag(bytes, start);
                        html_left = html.is_some();
                    }
                    next = earliest(next, html);
                }
                let Some(at) = next else { break };
                start = memchr::memrchr(b'\n', &bytes[start..at]).map_or(start, |nl| start + nl + 1);
            }
            let end = memchr::memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |k| start + k);
            let line = &text[start..end];
            self.line_start = start;
            // A last line that is empty is no line (`finish` reads none).
            if end < bytes.len() || !line.is_empty() {
                let cut = floor_boundary(&raw[start..end], line.len().min(self.row_bytes));
                self.read_ascii_line(&line[..cut], cells);
            }
            if end >= bytes.len() {
                break;
            }
            start = end + 1;
        }
        self.line_start = text.len();
        self.line_read = true;
    }

    /// Ends the text: the last line is read as it stands.
    pub(crate) fn finish(&mut self, cells: &mut impl FnMut(LabelledCell)) {
        if !self.line_read && !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.read_line(&line, cells);
        }
        self.line_read = true;
    }

    /// Where a stream must hold back from: the start of a row in progress of a table with
    /// credential columns, of the line after a CSV header (its first row) or of a line
    /// while a credential's name waits for its value, or a name field's key in the line.
    pub(crate) fn hold_from(&self) -> Option<usize> {
        if self.line_read {
            return None;
        }
        let pending = self.heads.iter().any(|h| h.layout != Layout::Pipes);
        let credential_table = self.table.as_ref().is_some_and(|t| !t.columns.is_empty());
        let waits = credential_table || pending || self.pairs.waits_on(&self.line) || self.html.is_some();
        let line = waits.then_some(self.line_start);
        line.into_iter().chain(self.pair_hold).chain(self.html_hold).min()
    }

    /// Notes where the line in progress opens an HTML table, looking from byte `from` on
    /// (a `<table` whose next character has come, which shows it a tag): the hold starts
    /// after the tag's name, which may have gone out before.
    fn look_for_table(&mut self, from: usize) {
        if !self.html_on || self.html_hold.is_some() || self.html.is_some() {
            return;
        }
        let bytes = self.line.as_bytes();
        if let Some(k) = html_table::next_table_tag(bytes, from).filter(|&k| k + 6 < bytes.len()) {
            self.html_hold = Some(self.raw_offset(k + TABLE_TAG_LEN));
        }
    }

    /// Notes where the line in progress first names a credential ([`pairs::named_at`]),
    /// once bytes from `from` on have come.
    ///
    /// The line is read again only when a character that can end a name came (a quote, a
    /// flow collection's `,` `}` `]`, a tag's `>`), and only once it holds both a name field
    /// (or a tag) and a credential word, so that a long line is not read once a push.
    fn look_for_names(&mut self, from: usize) {
        if !self.pairs_on || self.pair_hold.is_some() {
            return;
        }
        let bytes = self.line.as_bytes();
        let new = bytes.get(from..).unwrap_or_default();
        if !self.names_in_line {
            self.names_in_line = pairs::name_key_at(&self.line, from).is_some() || memchr::memchr(b'<', new).is_some();
        }
        let ends_a_name = new.iter().any(|b| matches!(b, b'"' | b'\'' | b',' | b'}' | b']' | b'>'));
        if !self.names_in_line || !ends_a_name {
            return;
        }
        // A credential word may have begun in the bytes before (`credential` is 10 long).
        if !self.credential_in_line {
            self.credential_in_line = pairs::next_core(bytes, self.words_read_to.saturating_sub(9)).is_some();
            self.words_read_to = bytes.len();
        }
        if self.credential_in_line {
            if let Some(k) = pairs::named_at(&self.line) {
                self.pair_hold = Some(self.raw_offset(k));
            }
        }
    }

    /// Forgets what the line in progress held: a new line starts.
    fn end_line_in_progress(&mut self) {
        (self.names_in_line, self.credential_in_line, self.words_read_to) = (false, false, 0);
        (self.pair_hold, self.html_hold) = (None, None);
    }

    /// The raw offset of byte `k` of the line in progress.
    fn raw_offset(&self, k: usize) -> usize {
        let decoded = self.decoded.as_ref().map(|spans| spans.get(k).map_or(self.line_start, |s| s.0));
        decoded.unwrap_or(self.line_start + k)
    }

    /// Reads a line as fed (box-drawing characters and all).
    fn read_line(&mut self, line: &str, out: &mut impl FnMut(LabelledCell)) {
        self.read_ascii_line(&box_ascii(line), out);
    }

    /// Reads a line whose box-drawing characters are ASCII already ([`box_ascii`]).
    fn read_ascii_line(&mut self, line: &str, out: &mut impl FnMut(LabelledCell)) {
        let line = line.strip_suffix('\r').unwrap_or(line);
        // A stream holds an open table's lines from their start, and a line that opens one
        // from after its `<table`: a finding's match starts there.
        let html_held = match (self.html_on, &self.html) {
            (false, _) => None,
            (true, Some(_)) => Some(0),
            (true, None) => html_table::next_table_tag(line.as_bytes(), 0).map(|k| k + TABLE_TAG_LEN),
        };
        if let Some(held) = html_held {
            let mut cells = Vec::new();
            self.html = HtmlTable::read_line(self.html.take(), line, &mut |span, label, about| {
                cells.push((span, label.to_string(), about))
            });
            // Its cells are candidates only, as under a header about a credential: another
            // tenant's known secret blocks, an unknown value passes. Blocking unknown values
            // flagged 28 of one peer's negative samples on the held-back split and found
            // nothing more (BENCHMARKS.md): HTML tables hold prose where markdown's hold values.
            for (span, label, _) in cells {
                self.emit_cell(line, held, span, &label, true, out);
            }
        }
        if self.pairs_on {
            // A stream holds the line from its start while a name waits, else from its first
            // name field: a finding's match starts there, so that a block releases what a
            // stream released.
            let pending = self.pairs.is_pending();
            let mut values = Vec::new();
            self.pairs.read_line(line, &mut |name, span| values.push((name.to_string(), span)));
            let held = match pending || values.is_empty() {
                true => 0,
                false => pairs::named_at(line).unwrap_or(0),
            };
            for (name, span) in values {
                // A name about a credential (`token_type`, `password_policy`) makes its
                // value a candidate only, as a table's header does.
                let about = credential_header(&name).is_some_and(|(about, _)| about);
                self.emit_cell(line, held, span, &name, about, out);
            }
        }
        if let Some(table) = self.table.take() {
            let plain = table.columns.is_empty();
            if table.layout == Layout::Pipes && is_delimiter_row(line, table.cells) {
                // A grid's rule between two rows (`+----+`, `├────┼────┤`) goes on with the
                // table; a markdown delimiter row in a table without credential columns opens
                // a table of its own under the row above it, when that row names one.
                let head = std::mem::take(&mut self.heads).into_iter().find(|h| !h.columns.is_empty());
                self.table = match head {
                    Some(head) if plain && !line.trim_start().starts_with('+') => Some(head),
                    _ => Some(table),
                };
                return;
            }
            let spans = table.layout.cells(line);
            let continues = match table.layout {
                Layout::Pipes => !spans.is_empty(),
                Layout::Separated(_) => spans.len() == table.cells,
            };
            if continues {
                self.emit(line, &spans, &table.columns, out);
                if plain {
                    self.heads = head_of(line, Layout::Pipes).filter(|h| !h.columns.is_empty()).into_iter().collect();
                }
                self.table = Some(table);
                return;
            }
        }
        let heads = std::mem::take(&mut self.heads);
        let mut waiting = Vec::new();
        for head in heads {
            match head.layout {
                Layout::Pipes if is_delimiter_row(line, head.cells) => {
                    self.table = Some(head);
                    return;
                }
                Layout::Separated(sep) => {
                    let spans = separated_spans(line, sep);
                    if spans.len() == head.cells {
                        self.emit(line, &spans, &head.columns, out);
                        self.table = Some(head);
                        return;
                    }
                }
                Layout::Pipes if !head.waited && cell_spans(line).len() == head.cells => {
                    waiting.push(Head { waited: true, ..head });
                }
                Layout::Pipes => {}
            }
        }
        // Most lines hold no separator: one pass that the compiler vectorises says so.
        let (mut pipe, mut comma, mut tab, mut semicolon) = (false, false, false, false);
        for &b in line.as_bytes() {
            pipe |= b == b'|';
            comma |= b == b',';
            tab |= b == b'\t';
            semicolon |= b == b';';
        }
        let layouts = [
            (pipe && self.pipes, Layout::Pipes),
            (comma && self.separated, Layout::Separated(b',')),
            (tab && self.separated, Layout::Separated(b'\t')),
            (semicolon && self.separated, Layout::Separated(b';')),
        ];
        for (_, layout) in layouts.into_iter().filter(|(present, _)| *present) {
            if let Some(head) = head_of(line, layout) {
                self.heads.push(head);
            }
        }
        // A header right above the delimiter row is the table's, before one a line up, and
        // one that names a credential before a plain row (DuckDB's column types).
        self.heads.append(&mut waiting);
        self.heads.sort_by_key(|h| h.columns.is_empty());
    }

    fn emit(&self, line: &str, spans: &[(usize, usize)], columns: &[Column], out: &mut impl FnMut(LabelledCell)) {
        for (column, label, about) in columns {
            if let Some(&span) = spans.get(*column) {
                self.emit_cell(line, 0, span, label, *about, out);
            }
        }
    }

    /// Hands out `line[start..end]` labelled `label`, unless it is empty; its findings'
    /// matches start at `line[row..]`.
    fn emit_cell(
        &self,
        line: &str,
        row: usize,
        (start, end): (usize, usize),
        label: &str,
        about: bool,
        out: &mut impl FnMut(LabelledCell),
    ) {
        let cell = &line[start..end];
        if cell.is_empty() {
            return;
        }
        let raw = self.decoded.as_ref().map(|spans| spans.get(start..end).unwrap_or_default().to_vec());
        let raw_start = raw.as_ref().and_then(|r| r.first()).map_or(self.line_start + start, |r| r.0);
        let row_start = self.raw_offset(row);
        out(LabelledCell {
            text: format!("{label}: {cell}"),
            label_len: label.len() + 2,
            raw_start,
            row_start,
            about,
            raw,
        });
    }
}

fn earliest(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The first `;` from `from` on that is not the last character of its line: a line's only
/// `;` at its end (a statement's, in code) leaves its last field empty, and a line with an
/// empty field heads no table.
fn next_field_semicolon(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let k = at + memchr::memchr(b';', &bytes[at..])?;
        match bytes.get(k + 1..) {
            Some([] | [b'\n', ..] | [b'\r', b'\n', ..] | [b'\r']) => at = k + 1,
            _ => return Some(k),
        }
    }
}

/// `text` with its box-drawing characters (U+2500 to U+257F) written in ASCII of the same
/// length, each padded with spaces to its three bytes: a vertical as `|`, a horizontal as
/// `---`, a corner, tee or cross as `+`. A table drawn in them (DuckDB, `sqlite3 -box`, psql's
/// unicode style, Python's rich) then reads as the ASCII grid it draws, at the same offsets.
fn box_ascii(text: &str) -> Cow<'_, str> {
    if !has_box_drawing(text.as_bytes()) {
        return Cow::Borrowed(text);
    }
    let mut ascii = String::with_capacity(text.len());
    // Box-drawing characters all start with byte E2, which only ever starts a character: the
    // text between them is copied whole (a file of source with one table in it is mostly
    // such runs).
    let mut copied = 0;
    for at in memchr::memchr_iter(0xe2, text.as_bytes()) {
        let Some(c) = text.get(at..).and_then(|rest| rest.chars().next()) else { continue };
        let drawn = match c {
            '│' | '┃' | '║' | '┆' | '┇' | '┊' | '┋' | '╎' | '╏' => "|  ",
            '─' | '━' | '═' | '┄' | '┅' | '┈' | '┉' | '╌' | '╍' => "---",
            '\u{2500}'..='\u{257f}' => "+  ",
            _ => continue,
        };
        ascii.push_str(&text[copied..at]);
        ascii.push_str(drawn);
        copied = at + c.len_utf8();
    }
    ascii.push_str(&text[copied..]);
    Cow::Owned(ascii)
}

/// Whether `bytes` hold a box-drawing character (`E2 94 xx` or `E2 95 xx` in UTF-8).
fn has_box_drawing(bytes: &[u8]) -> bool {
    memchr::memchr_iter(0xe2, bytes).any(|i| matches!(bytes.get(i + 1), Some(0x94 | 0x95)))
}

/// The longest prefix of `s` of at most `at` bytes that ends on a character boundary.
fn floor_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// `line` as the header of a table laid out so, when it names a credential column; with
/// pipes, any row of cells heads a table, read to its end without a credential column: a
/// grid draws the same rule under each row as under its header (`+----+`), and a row of
/// a table whose header names no credential (`| %w | password | plaintext password |`)
/// heads nothing.
fn head_of(line: &str, layout: Layout) -> Option<Head> {
    let spans = match layout {
        Layout::Pipes => cell_spans(line),
        Layout::Separated(sep) => header_names(line, sep)?,
    };
    let columns: Vec<Column> = spans.iter().enumerate().filter_map(|(i, &(s, e))| column_of(i, &line[s..e])).collect();
    let grid_row = layout == Layout::Pipes && spans.len() >= 2;
    (!columns.is_empty() || grid_row).then_some(Head { layout, cells: spans.len(), columns, waited: false })
}

/// Column `i` under `header`, when the header names a credential.
pub(super) fn column_of(i: usize, header: &str) -> Option<Column> {
    let header = header.trim_matches(['*', '_', '`']);
    // A header about a credential is read as the credential's word, so that the rules
    // find the value for the ownership check to judge.
    credential_header(header).map(|(about, word)| match about {
        true => (i, word.to_string(), true),
        false => (i, header.to_string(), false),
    })
}

/// The fields of a CSV (or TSV) header line: at least two, each a few short words (a
/// sentence with commas in it is none) and none a number (a data line is no header:
/// `ATTRIBUTE\tAuth-Server-Secret\t54\tstring` in a RADIUS dictionary). Gives up at the
/// first field that is not a name, so prose costs a look at its first words.
fn header_names(line: &str, sep: u8) -> Option<Vec<(usize, usize)>> {
    let mut spans = Vec::new();
    let mut at = 0;
    for field in line.split(char::from(sep)).take(MAX_COLUMNS) {
        let lead = field.len() - field.trim_start_matches(' ').len();
        let name = field.trim_matches(' ');
        let (quote, name) = match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
            Some(inner) => (1, inner),
            None => (0, name),
        };
        let named = !name.is_empty()
            && name.len() <= 40
            && name.bytes().filter(|&b| b == b' ').count() <= 2
            && name.chars().all(|c| c.is_alphanumeric() || matches!(c, ' ' | '_' | '-'))
            && !name.bytes().all(|b| b.is_ascii_digit());
        if !named {
            return None;
        }
        let start = at + lead + quote;
        spans.push((start, start + name.len()));
        at += field.len() + 1;
    }
    (spans.len() >= 2).then_some(spans)
}

/// The byte span of each field of a CSV (or TSV) line, trimmed, and inside its quotes when
/// quoted (`"a,b"` is one field, `""` a quote in it).
fn separated_spans(line: &str, sep: u8) -> Vec<(usize, usize)> {
    let bytes = line.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    loop {
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        let (start, mut end);
        if bytes.get(i) == Some(&b'"') {
            start = i + 1;
            let mut j = start;
            while j < bytes.len() && !(bytes[j] == b'"' && bytes.get(j + 1) != Some(&b'"')) {
                j += if bytes[j] == b'"' { 2 } else { 1 };
            }
            end = j.min(bytes.len());
            i = bytes[end..].iter().position(|&b| b == sep).map_or(bytes.len(), |k| end + k);
        } else {
            start = i;
            i = bytes[i..].iter().position(|&b| b == sep).map_or(bytes.len(), |k| i + k);
            end = i;
            while end > start && bytes[end - 1] == b' ' {
                end -= 1;
            }
        }
        spans.push((start, end));
        if i >= bytes.len() || spans.len() == MAX_COLUMNS {
            return spans;
        }
        i += 1;
    }
}

/// The trimmed byte span of each cell of a table line: cells are separated by `|` (not
/// `\|`), and a pipe at either end of the line opens or closes the row. A line without a
/// pipe has none.
fn cell_spans(line: &str) -> Vec<(usize, usize)> {
    cells_between(line, |b| b == b'|')
}

/// [`cell_spans`] with separators `sep`.
fn cells_between(line: &str, sep: impl Fn(u8) -> bool) -> Vec<(usize, usize)> {
    let bytes = line.as_bytes();
    let mut pipes = Vec::new();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        if sep(b) && !escaped {
            pipes.push(i);
        }
        escaped = b == b'\\' && !escaped;
    }
    if pipes.is_empty() {
        return Vec::new();
    }
    let first = line.len() - line.trim_start().len();
    let last = line.trim_end().len();
    let mut bounds = Vec::with_capacity(pipes.len() + 2);
    if pipes[0] != first {
        bounds.push(first.wrapping_sub(1));
    }
    bounds.extend_from_slice(&pipes);
    if pipes.last().is_some_and(|&p| p + 1 != last) {
        bounds.push(last);
    }
    bounds
        .windows(2)
        .take(MAX_COLUMNS)
        .map(|w| {
            let (s, e) = (w[0].wrapping_add(1), w[1]);
            let cell = &line[s..e];
            let lead = cell.len() - cell.trim_start().len();
            (s + lead, s + lead + cell.trim().len())
        })
        .collect()
}

/// A delimiter row of `cells` cells: each dashes with optional colons at its ends, between
/// pipes (`|---|:--:|`) or, in what database clients print, plus signs (`+----+----+`,
/// psql's `-----+-----`).
fn is_delimiter_row(line: &str, cells: usize) -> bool {
    delimiter_cells(line) == Some(cells)
}

/// How many cells `line` has as a delimiter row, if it is one.
fn delimiter_cells(line: &str) -> Option<usize> {
    let spans = cells_between(line, |b| b == b'|' || b == b'+');
    let dashes = |&(s, e): &(usize, usize)| {
        let cell = line[s..e].trim_start_matches(':').trim_end_matches(':');
        !cell.is_empty() && cell.bytes().all(|b| b == b'-')
    };
    (!spans.is_empty() && spans.iter().all(dashes)).then_some(spans.len())
}

/// Whether a header cell names a credential, read through the rules view (so `Pаss\u{200b}word`
/// reads `Password`): None when it holds no credential word, else whether it also holds a
/// word about one, and the credential word.
fn credential_header(header: &str) -> Option<(bool, &'static str)> {
    if header.is_empty() || header.len() > 64 {
        return None;
    }
    // ASCII is its own rules view: one automaton pass turns down the many cells that name
    // no credential (code between pipes or commas, a tenth of a scan of the cargo
    // registry's text) before the view and its lowercase are built.
    if header.is_ascii() && ascii_credential_words().is_some_and(|words| !words.is_match(header)) {
        return None;
    }
    let lower = crate::canon::rules_string(header, false).to_lowercase();
    let word = CREDENTIAL_WORDS.iter().find(|w| lower.contains(*w))?;
    let about = lower.split(|c: char| !c.is_alphanumeric()).any(|word| ABOUT_WORDS.iter().any(|a| word.starts_with(a)));
    Some((about, word))
}

/// The ASCII words of [`CREDENTIAL_WORDS`], any case, in one automaton.
fn ascii_credential_words() -> Option<&'static aho_corasick::AhoCorasick> {
    static WORDS: std::sync::OnceLock<Option<aho_corasick::AhoCorasick>> = std::sync::OnceLock::new();
    WORDS
        .get_or_init(|| {
            let ascii = CREDENTIAL_WORDS.iter().filter(|w| w.is_ascii());
            aho_corasick::AhoCorasick::builder().ascii_case_insensitive(true).build(ascii).ok()
        })
        .as_ref()
}

/// Whether some line of `text` is a delimiter row (`|---|:--:|`) as the reader reads it:
/// the quick check that lets the many texts without one skip the reader. Only lines with
/// a dash are looked at.
fn has_delimiter_row(text: &str) -> bool {
    let bytes = text.as_bytes();
    let mut from = 0;
    while let Some(k) = memchr::memchr(b'-', &bytes[from..]) {
        let at = from + k;
        let start = memchr::memrchr(b'\n', &bytes[from..at]).map_or(from, |nl| from + nl + 1);
        let end = memchr::memchr(b'\n', &bytes[at..]).map_or(bytes.len(), |nl| at + nl);
        let line = &text[start..end];
        let line = &line[..floor_boundary(line, line.len().min(MAX_ROW_BYTES))];
        // Dashes, colons, separators and spaces only (or characters outside ASCII, which
        // may be spaces): a line of prose fails at its first letter.
        let may_be = line
            .bytes()
            .all(|b| matches!(b, b'|' | b'+' | b'-' | b':' | b' ' | b'\t' | b'\r' | 0x0b | 0x0c) || b >= 0x80);
        if may_be && delimiter_cells(line.strip_suffix('\r').unwrap_or(line)).is_some() {
            return true;
        }
        from = end;
    }
    false
}

/// Whether `text` could hold a CSV, TSV or `;` table with a credential column: a separator, and
/// a credential word's ASCII core or a character outside ASCII (words in other scripts,
/// and disguised letters, which only the rules view reads as credential words).
fn may_hold_separated_table(text: &str) -> bool {
    static WORDS: std::sync::OnceLock<Option<aho_corasick::AhoCorasick>> = std::sync::OnceLock::new();
    let words = WORDS.get_or_init(|| {
        let cores = ["pass", "pwd", "secret", "token", "key", "credential", "kennwort"];
        aho_corasick::AhoCorasick::builder().ascii_case_insensitive(true).build(cores).ok()
    });
    memchr::memchr3(b',', b'\t', b';', text.as_bytes()).is_some()
        && (!text.is_ascii() || words.as_ref().is_none_or(|w| w.is_match(text)))
}

/// Scans a labelled cell with the rules and adds to `out` the findings the label makes,
/// over the cell: what the cell alone gives the rules is the line's scan's to report.
pub(crate) fn judge(rules: &Ruleset, ctx: &ScanContext, cell: &LabelledCell, out: &mut Vec<Finding>) {
    let Some(bare) = cell.text.get(cell.label_len..) else { return };
    let alone = rules.matches(bare, ctx);
    let mut found = Vec::new();
    for mut f in rules.matches(&cell.text, ctx) {
        let Some(start) = f.start.checked_sub(cell.label_len) else { continue };
        let end = f.end - cell.label_len;
        if alone.iter().any(|g| g.rule_id == f.rule_id && (g.start, g.end) == (start, end)) {
            continue;
        }
        if cell.about && f.kind == DetectorKind::Secret {
            f.action = Action::Allow;
        }
        let match_end = cell.raw_span(start, f.match_end.saturating_sub(cell.label_len).max(start)).1;
        (f.start, f.end) = cell.raw_span(start, end);
        (f.match_start, f.match_end) = (cell.row_start, match_end.max(f.end));
        found.push(f);
    }
    merge_findings(out, found, 0);
}

/// The credential cells of `text`'s tables, scanned (the one-shot reader).
pub(crate) fn scan(rules: &Ruleset, text: &str, ctx: &ScanContext, out: &mut Vec<Finding>) {
    // A box-drawn table's delimiter rows hold no `-`: look at its ASCII twin.
    let boxed = box_ascii(text);
    let text = boxed.as_ref();
    let (pipes, separated) = (has_delimiter_row(text), may_hold_separated_table(text));
    let pairs_on = pairs::may_hold_pairs(text);
    let html_on = html_table::next_table_tag(text.as_bytes(), 0).is_some();
    if !pipes && !separated && !pairs_on && !html_on {
        return;
    }
    // A layout the text holds no table in needs no header looked for: the cells read are
    // the same (a pipe table's header holds nothing back either).
    let mut st = TableState { pipes, separated, pairs_on, html_on, ..TableState::new(MAX_ROW_BYTES) };
    let mut cells = Vec::new();
    st.read_all(text, &mut |c| cells.push(c));
    for cell in &cells {
        judge(rules, ctx, cell, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cells `text` gives fed whole, which must be what reading it whole gives.
    fn cells_of(text: &str) -> Vec<(String, usize)> {
        let mut st = TableState::new(MAX_ROW_BYTES);
        let mut out = Vec::new();
        st.feed(text, 0, &mut |c| out.push((c.text.clone(), c.raw_start)));
        st.finish(&mut |c| out.push((c.text.clone(), c.raw_start)));
        let mut whole = Vec::new();
        TableState::new(MAX_ROW_BYTES).read_all(text, &mut |c| whole.push((c.text.clone(), c.raw_start)));
        assert_eq!(out, whole, "{text:?}");
        out
    }

    #[test]
    fn a_cell_under_a_credential_header_is_read_with_its_header() {
        let text = "| Service | User | Password |\n|---|:---:|---:|\n| db | app | Kq8Wz3Tv6Lx2 |\n| cache | x |  |\n";
        let at = text.find("Kq8").unwrap_or(0);
        assert_eq!(cells_of(text), vec![("Password: Kq8Wz3Tv6Lx2".to_string(), at)]);
        // Without the outer pipes, and with CRLF.
        let text = "Service | Password\r\n--- | ---\r\ndb | Kq8Wz3Tv6Lx2\r\n";
        let at = text.find("Kq8").unwrap_or(0);
        assert_eq!(cells_of(text), vec![("Password: Kq8Wz3Tv6Lx2".to_string(), at)]);
    }

    #[test]
    fn what_is_not_a_credential_table_is_not_read() {
        for text in [
            // No delimiter row.
            "| User | Password |\n| app | Kq8Wz3Tv6Lx2 |\n",
            // The header does not name a credential, or names something about one.
            "| Field | Value |\n|---|---|\n| Password | Kq8Wz3Tv6Lx2 |\n",
            "| Notes | Scope |\n|---|---|\n| ci-deploy | repo |\n",
            // Cell counts differ between header and delimiter.
            "| User | Password |\n|---|---|---|\n| app | Kq8Wz3Tv6Lx2 |\n",
            // A line without a pipe ends the table.
            "| User | Password |\n|---|---|\nthen prose\napp | Kq8Wz3Tv6Lx2\n",
        ] {
            assert_eq!(cells_of(text), vec![], "{text:?}");
        }
    }

    #[test]
    fn only_a_text_with_a_delimiter_row_is_read() {
        assert!(has_delimiter_row("a | b\n--- | ---\n1 | 2"));
        assert!(has_delimiter_row("x\n|:--|--:|\r\n"));
        assert!(has_delimiter_row("|-|-|"), "one dash makes a delimiter cell");
        assert!(!has_delimiter_row("a -- b | c\n---\n| x |"));
        assert!(!has_delimiter_row(""));
    }

    #[test]
    fn database_client_output_is_a_table_too() {
        let mysql = "+-------+--------------+\n| user  | password     |\n+-------+--------------+\n| app   | Kq8Wz3Tv6Lx2 |\n+-------+--------------+\n";
        let psql = " usename | passwd\n---------+--------------\n app     | Kq8Wz3Tv6Lx2\n(1 row)\n";
        for (text, label) in [(mysql, "password"), (psql, "passwd")] {
            let at = text.find("Kq8").unwrap_or(0);
            assert_eq!(cells_of(text), vec![(format!("{label}: Kq8Wz3Tv6Lx2"), at)], "{text:?}");
            assert!(has_delimiter_row(text));
        }
    }

    #[test]
    fn tables_drawn_with_box_drawing_characters_are_read() {
        // DuckDB (a type row under the names), psql's unicode style without and with a
        // border, Python's rich (heavy header), tabulate's fancy_grid (a rule between rows).
        let duckdb = "┌─────────┬──────────────┐\n│  user   │   password   │\n│ varchar │   varchar    │\n├─────────┼──────────────┤\n│ app     │ Kq8Wz3Tv6Lx2 │\n└─────────┴──────────────┘\n";
        let psql = " usename │    passwd\n─────────┼──────────────\n app     │ Kq8Wz3Tv6Lx2\n(1 row)\n";
        let psql_border = "┌─────────┬──────────────┐\n│ usename │    passwd    │\n├─────────┼──────────────┤\n│ app     │ Kq8Wz3Tv6Lx2 │\n└─────────┴──────────────┘\n";
        let rich = "┏━━━━━━━━━┳━━━━━━━━━━━━━━┓\n┃ Service ┃ Token        ┃\n┡━━━━━━━━━╇━━━━━━━━━━━━━━┩\n│ app     │ Kq8Wz3Tv6Lx2 │\n└─────────┴──────────────┘\n";
        let fancy = "╒═════════╤══════════════╕\n│ user    │ Password     │\n╞═════════╪══════════════╡\n│ app     │ Kq8Wz3Tv6Lx2 │\n├─────────┼──────────────┤\n│ ops     │ Zt7Wq2Kv9Lx4 │\n╘═════════╧══════════════╛\n";
        for (text, label) in [(duckdb, "password"), (psql, "passwd"), (psql_border, "passwd"), (rich, "Token")] {
            let at = text.find("Kq8").unwrap_or(0);
            assert_eq!(cells_of(text), vec![(format!("{label}: Kq8Wz3Tv6Lx2"), at)], "{text}");
            assert!(has_delimiter_row(&box_ascii(text)), "{text}");
        }
        let at = |s: &str| fancy.find(s).unwrap_or(0);
        assert_eq!(
            cells_of(fancy),
            vec![("Password: Kq8Wz3Tv6Lx2".to_string(), at("Kq8")), ("Password: Zt7Wq2Kv9Lx4".to_string(), at("Zt7"))]
        );
        // Box-drawing characters keep their byte length, so offsets hold.
        for text in [duckdb, rich, fancy, "a ─ b ║ c ╳"] {
            let ascii = box_ascii(text);
            assert_eq!(ascii.len(), text.len());
            assert!(ascii.is_ascii() || !text.is_ascii());
        }
        assert!(matches!(box_ascii("no boxes — “quoted”"), Cow::Borrowed(_)));
        // Other characters, those that start with the same byte (— “ ”) among them, stay.
        assert_eq!(box_ascii("é — │ “x” ┼ 日本 ═"), "é — |   “x” +   日本 ---");
    }

    #[test]
    fn a_grid_row_under_a_header_without_credentials_heads_nothing() {
        // Dovecot's documentation: a grid draws the same rule under each row as under the
        // header, and a row that says `password` is a row, not a header.
        let grid = "+----+----------+-------------+\n| Variable | Long name | Description |\n+----+----------+-------------+\n| %w | password | plaintext password |\n+----+----------+-------------+\n|    | passdb:<name> | extra field |\n+----+----------+-------------+\n";
        assert_eq!(cells_of(grid), vec![]);
        // Under a header that names a credential, each row between the rules is read.
        let creds = "+------+--------------+\n| user | password     |\n+------+--------------+\n| app  | Kq8Wz3Tv6Lx2 |\n+------+--------------+\n| ops  | Zt7Wq2Kv9Lx4 |\n+------+--------------+\n";
        assert_eq!(cells_of(creds).len(), 2);
        // A table ends at the first line without a pipe; the next one is read anew, and so is
        // one whose markdown delimiter row follows a plain table's row without a blank line.
        let two = "| a | b |\n|---|---|\n| 1 | 2 |\n\n| user | password |\n|---|---|\n| app | Kq8Wz3Tv6Lx2 |\n";
        let glued = two.replace("\n\n", "\n");
        for text in [two, glued.as_str()] {
            assert_eq!(cells_of(text), vec![("password: Kq8Wz3Tv6Lx2".to_string(), text.find("Kq8").unwrap_or(0))]);
        }
    }

    #[test]
    fn one_line_may_come_between_a_header_and_its_delimiter_row_but_not_two() {
        let two = "| user | password |\n| text | text |\n| a | b |\n|---|---|\n| app | Kq8Wz3Tv6Lx2 |\n";
        assert_eq!(cells_of(two), vec![]);
        // The line right above the delimiter row heads the table when it names a credential.
        let later = "| user | password |\n| name | token |\n|---|---|\n| app | Kq8Wz3Tv6Lx2 |\n";
        assert_eq!(cells_of(later), vec![("token: Kq8Wz3Tv6Lx2".to_string(), later.find("Kq8").unwrap_or(0))]);
    }

    #[test]
    fn semicolon_separated_values_are_read_like_csv() {
        // Spreadsheets write `;` where a decimal comma is the locale's.
        let text = "Benutzer;Kennwort;Server\nadmin;Kq8Wz3Tv6Lx2;db1\n";
        assert_eq!(cells_of(text), vec![("Kennwort: Kq8Wz3Tv6Lx2".to_string(), text.find("Kq8").unwrap_or(0))]);
        // Code ends its statements with `;`: no header.
        assert_eq!(cells_of("String password; String user;\nx; y; z;\n"), vec![]);
        assert_eq!(next_field_semicolon(b"a;\nb;\r\nc;d;", 0), Some(8), "a statement's `;` is skipped");
        assert_eq!(next_field_semicolon(b"a;\nb;", 0), None);
        assert_eq!(cells_of("return user; // token\nadmin; Kq8Wz3Tv6Lx2\n"), vec![]);
    }

    #[test]
    fn csv_and_tsv_tables_are_read_from_their_header_line() {
        let csv = "username,password,host\nadmin,Kq8Wz3Tv6Lx2,db1\n\"ops, team\",\"Zt7\"\"Wq2\",db2\nnot a row\nx,Mv4Kq9Tz2Wx7,y\n";
        let cells = cells_of(csv);
        let at = |s: &str| csv.find(s).unwrap_or(0);
        assert_eq!(
            cells,
            vec![("password: Kq8Wz3Tv6Lx2".to_string(), at("Kq8")), ("password: Zt7\"\"Wq2".to_string(), at("Zt7"))],
            "a row with other than the header's count of fields ends the table"
        );
        let tsv = "Service\tAPI Key\nstripe\tsk_test_x9Kq2Wz7Tv4Lx8\n";
        assert_eq!(cells_of(tsv), vec![("API Key: sk_test_x9Kq2Wz7Tv4Lx8".to_string(), tsv.find("sk_").unwrap_or(0))]);
        // Prose with commas heads no table, nor does a sentence naming a password, nor a data
        // line (a number among its fields) naming a secret.
        for text in [
            "Well, if you forget your password, reset it here, then log in.\nYes, I did, thanks, bye.\n",
            "Remember: user, password.\nadmin, hunter2.\n",
            "ATTRIBUTE\tCVPN3000-User-Auth-Server-Secret\t54\tstring\nATTRIBUTE\tCVPN3000-IPSec-Split-Tunneling-Policy\t55\tinteger\n",
        ] {
            assert_eq!(cells_of(text), vec![], "{text:?}");
        }
    }

    #[test]
    fn a_csv_header_holds_the_line_after_it() {
        let mut st = TableState::new(MAX_ROW_BYTES);
        st.feed("user,password\nadm", 0, &mut |_| {});
        assert_eq!(st.hold_from(), Some(14));
        st.feed("in,Kq8Wz3Tv6Lx2\nthe end", 17, &mut |_| {});
        assert_eq!(st.hold_from(), Some(33), "in the table, the next line may be a row");
        st.feed("\nplain prose\n", 40, &mut |_| {});
        assert_eq!(st.hold_from(), None);
    }

    #[test]
    fn headers_about_a_credential_and_disguised_headers() {
        assert_eq!(credential_header("Password"), Some((false, "password")));
        assert_eq!(credential_header("Pa\u{200b}ssword"), Some((false, "password")));
        assert_eq!(credential_header("Раssword"), Some((false, "password")), "a Cyrillic Р among ASCII letters");
        assert_eq!(credential_header("Token name"), Some((true, "token")));
        assert_eq!(credential_header("Password policy"), Some((true, "password")));
        assert_eq!(credential_header("Notes"), None);
    }

    #[test]
    fn escaped_pipes_stay_in_their_cell() {
        let text = "| User | Password |\n|---|---|\n| a\\|b | Kq8\\|Wz3Tv6Lx2 |\n";
        assert_eq!(cells_of(text).first().map(|c| c.0.as_str()), Some("Password: Kq8\\|Wz3Tv6Lx2"));
    }

    /// Fed in pieces of any size, the reader hands out the same cells at the same offsets
    /// as fed whole, and holds a row back from its first byte until it is read.
    #[test]
    fn a_table_streamed_in_pieces_reads_as_whole_and_holds_each_row() {
        let text = "Here:\n\n| Service | Пароль | API key |\n|---|---|---|\n| db | Kq8Wz3Tv6Lx2 | sk-9Xq2 |\n| долгий | Zt7Wq2Kv9Lx4 | – |\n\nDone.";
        let whole = cells_of(text);
        assert_eq!(whole.len(), 4);
        for size in 1..12 {
            let mut st = TableState::new(MAX_ROW_BYTES);
            let mut got = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let mut end = (at + size).min(text.len());
                while !text.is_char_boundary(end) {
                    end += 1;
                }
                st.feed(&text[at..end], at, &mut |c| got.push((c.text.clone(), c.raw_start)));
                if let Some(h) = st.hold_from() {
                    // Everything of the current row is held; nothing before it need be.
                    assert!(h <= end && !text[h..end].contains('\n'), "{size} {h} {end}");
                    assert!(h == 0 || text.as_bytes()[h - 1] == b'\n');
                }
                at = end;
            }
            st.finish(&mut |c| got.push((c.text.clone(), c.raw_start)));
            assert_eq!(got, whole, "pieces of {size}");
        }
    }

    /// Fed decoded characters (as a JSON string's are), the reader reads what it reads fed
    /// the text, at the same offsets when the characters are the raw text.
    #[test]
    fn characters_fed_one_by_one_read_as_the_text() {
        let text = "| User | Пароль |\n|---|---|\n| a | Kq8Wz3Tv6Lx2 |\nuser,password\nb,Zt7Wq2Kv9Lx4\n";
        for row_bytes in [MAX_ROW_BYTES, 20, 7] {
            let mut fed = Vec::new();
            let mut st = TableState::new(row_bytes);
            st.feed(text, 0, &mut |c| {
                fed.push((c.text.clone(), c.raw_start, c.raw_span(0, c.text.len() - c.label_len)))
            });
            st.finish(&mut |c| fed.push((c.text.clone(), c.raw_start, c.raw_span(0, c.text.len() - c.label_len))));
            let mut chars = Vec::new();
            let mut st = TableState::decoded(row_bytes);
            for (i, c) in text.char_indices() {
                let d = Decoded { c, start: i, end: i + c.len_utf8(), kind: Kind::Text };
                st.feed_char(d, &mut |c| {
                    chars.push((c.text.clone(), c.raw_start, c.raw_span(0, c.text.len() - c.label_len)))
                });
            }
            st.finish(&mut |c| chars.push((c.text.clone(), c.raw_start, c.raw_span(0, c.text.len() - c.label_len))));
            assert_eq!(chars, fed, "rows of {row_bytes} bytes");
        }
    }

    #[test]
    fn a_row_is_read_up_to_the_limit_and_the_hold_ends_there() {
        let head = "| User | Password |\n|---|---|\n";
        let mut st = TableState::new(MAX_ROW_BYTES);
        let mut got = Vec::new();
        st.feed(head, 0, &mut |c| got.push(c));
        st.feed("| a | ", head.len(), &mut |c| got.push(c));
        assert_eq!(st.hold_from(), Some(head.len()));
        st.feed(&"x".repeat(2 * MAX_ROW_BYTES), head.len() + 6, &mut |c| got.push(c));
        // Read at the limit: the row's cell so far is judged, and nothing more is held.
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].text.len(), MAX_ROW_BYTES - 6 + "Password: ".len());
        assert_eq!(st.hold_from(), None);
        st.feed(" |\n| b | Kq8Wz3Tv6Lx2 |", 0, &mut |c| got.push(c));
        assert_eq!(got.len(), 1, "the rest of the long row is skipped");
        st.finish(&mut |c| got.push(c));
        assert_eq!(got.last().map(|c| c.text.as_str()), Some("Password: Kq8Wz3Tv6Lx2"));
    }
}
