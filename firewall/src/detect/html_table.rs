//! Credentials in an HTML table's columns: the header row names a column, the rows below
//! hold its values, a cell a line or a row a line alike.
//!
//! ```text
//! <table>
//!   <tr><th>User</th><th>Password</th></tr>
//!   <tr><td>app_rw</td><td><code>Kq8Wz3Tv6Lx2</code></td></tr>
//! </table>
//! ```
//!
//! The first row of a `<table>` is its header ([`super::table`] decides which of its cells
//! name a credential, as for any table); in the rows after it, each cell under such a
//! header is handed out. Cells are counted by their `<td>` and `<th>` tags; a cell is read
//! on the line its tag opens, its own tags (`<code>`, `<b>`) at either end left out. From
//! its `<table>` tag to its `</table>` a table's lines are held in a stream until each is
//! read, header included (a one-line table holds its cells too). The cells are candidates:
//! the ownership check blocks another tenant's secret in one, and the rules' verdict on an
//! unknown value is not taken (see `TableState::read_ascii_line`).

use super::table::{column_of, Column};

/// The table being read.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct HtmlTable {
    /// the header row's cells so far, while it is being read
    header: Vec<String>,
    /// its credential columns, once the header row has ended
    columns: Option<Vec<Column>>,
    /// the next cell's index in the row
    cell: usize,
}

impl HtmlTable {
    /// Reads `line` with `table` open before it (or None), handing out each credential
    /// cell: its span in the line, its column's label, and whether the label is about a
    /// credential. Returns the table open after the line.
    pub(crate) fn read_line(
        mut table: Option<HtmlTable>,
        line: &str,
        out: &mut impl FnMut((usize, usize), &str, bool),
    ) -> Option<HtmlTable> {
        let bytes = line.as_bytes();
        let mut from = 0;
        while let Some(k) = memchr::memchr(b'<', &bytes[from..]) {
            let at = from + k;
            let (tag, closing, end) = tag_at(line, at);
            from = end;
            match (tag, closing) {
                (Tag::Table, false) => table = Some(HtmlTable::default()),
                (Tag::Table, true) => table = None,
                (Tag::Row, _) => {
                    if let Some(t) = &mut table {
                        t.end_header();
                        t.cell = 0;
                    }
                }
                (Tag::Cell, false) => {
                    let Some(t) = &mut table else { continue };
                    let span = cell_text(line, end);
                    t.take_cell(line, span, out);
                }
                _ => {}
            }
        }
        table
    }

    /// The header row has ended (a row tag after it): its credential columns are known.
    fn end_header(&mut self) {
        if self.columns.is_none() && !self.header.is_empty() {
            let header = std::mem::take(&mut self.header);
            self.columns = Some(header.iter().enumerate().filter_map(|(i, h)| column_of(i, h)).collect());
        }
    }

    fn take_cell(
        &mut self,
        line: &str,
        (start, end): (usize, usize),
        out: &mut impl FnMut((usize, usize), &str, bool),
    ) {
        let i = self.cell;
        self.cell += 1;
        match &self.columns {
            None => self.header.push(line[start..end].to_string()),
            Some(columns) => {
                for (_, label, about) in columns.iter().filter(|c| c.0 == i) {
                    out((start, end), label, *about);
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Tag {
    Table,
    Row,
    Cell,
    Other,
}

/// The tag that opens at `line[at]` (a `<`): which, whether a closing one, and where the
/// text after it starts (after its `>`, or the line's end).
fn tag_at(line: &str, at: usize) -> (Tag, bool, usize) {
    let bytes = line.as_bytes();
    let closing = bytes.get(at + 1) == Some(&b'/');
    let name_start = at + 1 + usize::from(closing);
    let name_len = bytes[name_start.min(bytes.len())..].iter().take_while(|b| b.is_ascii_alphanumeric()).count();
    let name = &line[name_start.min(line.len())..name_start.min(line.len()) + name_len];
    let tag = match name.to_ascii_lowercase().as_str() {
        "table" => Tag::Table,
        "tr" => Tag::Row,
        "td" | "th" => Tag::Cell,
        _ => Tag::Other,
    };
    if tag == Tag::Other || name_len == 0 {
        return (Tag::Other, closing, at + 1);
    }
    let end =
        memchr::memchr(b'>', &bytes[name_start + name_len..]).map_or(line.len(), |k| name_start + name_len + k + 1);
    (tag, closing, end)
}

/// The text of a cell that starts at `from`: up to the next tag that ends it (or the
/// line's end), its own tags at either end and spaces left out.
fn cell_text(line: &str, from: usize) -> (usize, usize) {
    let bytes = line.as_bytes();
    let mut end = line.len();
    let mut at = from;
    while let Some(k) = memchr::memchr(b'<', &bytes[at..]) {
        let (tag, _, after) = tag_at(line, at + k);
        if tag != Tag::Other {
            end = at + k;
            break;
        }
        at = after;
    }
    let (mut start, mut stop) = (from, end);
    loop {
        let text = &line[start..stop];
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return (start, start);
        }
        start += text.len() - text.trim_start().len();
        stop = start + trimmed.len();
        if trimmed.starts_with('<') {
            match trimmed.find('>') {
                Some(k) => start += k + 1,
                None => return (start, stop),
            }
        } else if trimmed.ends_with('>') {
            match trimmed.rfind('<') {
                Some(k) if k > 0 => stop = start + k,
                _ => return (start, stop),
            }
        } else {
            return (start, stop);
        }
    }
}

/// The first `<table` tag (any case) at or after `from`.
pub(crate) fn next_table_tag(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let k = at + memchr::memchr(b'<', bytes.get(at..)?)?;
        let name = bytes.get(k + 1..k + 6)?;
        if name.eq_ignore_ascii_case(b"table") && !bytes.get(k + 6).is_some_and(u8::is_ascii_alphanumeric) {
            return Some(k);
        }
        at = k + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells_of(text: &str) -> Vec<(String, String)> {
        let mut open = None;
        let mut out = Vec::new();
        for line in text.lines() {
            open = HtmlTable::read_line(open, line, &mut |(s, e), label, _| {
                out.push((label.to_string(), line[s..e].to_string()))
            });
        }
        out
    }

    fn cell(label: &str, value: &str) -> (String, String) {
        (label.to_string(), value.to_string())
    }

    #[test]
    fn a_row_a_line_a_cell_a_line_and_one_line() {
        let rows = "<table>\n  <tr><th>User</th><th>Password</th></tr>\n  <tr><td>app</td><td><code>Kq8Wz3Tv6Lx2</code></td></tr>\n</table>";
        assert_eq!(cells_of(rows), vec![cell("Password", "Kq8Wz3Tv6Lx2")]);
        let cells = "<TABLE class=\"x\">\n<thead>\n<tr>\n  <th>Service</th>\n  <th scope=\"col\">API key</th>\n</tr>\n</thead>\n<tbody>\n<tr>\n  <td>stripe</td>\n  <td> Zt7Wq2Kv9Lx4 </td>\n</tr>\n</tbody>\n</TABLE>";
        assert_eq!(cells_of(cells), vec![cell("API key", "Zt7Wq2Kv9Lx4")]);
        let one = "<table><tr><td>User</td><td>Token</td></tr><tr><td>a</td><td>Mv4Kq9Tz2Wx7</td></tr></table> then <td>x</td>";
        assert_eq!(cells_of(one), vec![cell("Token", "Mv4Kq9Tz2Wx7")]);
    }

    #[test]
    fn what_is_no_credential_column_is_not_read() {
        for text in [
            "<table><tr><th>Name</th><th>Notes</th></tr><tr><td>a</td><td>Kq8Wz3Tv6Lx2</td></tr></table>",
            "<tr><th>User</th><th>Password</th></tr><tr><td>a</td><td>Kq8Wz3Tv6Lx2</td></tr>",
            "<table><tr><th>Password</th></tr></table><tr><td>Kq8Wz3Tv6Lx2</td></tr>",
        ] {
            assert_eq!(cells_of(text), vec![], "{text}");
        }
    }

    #[test]
    fn table_tags_are_found_in_any_case_and_only_as_tags() {
        assert_eq!(next_table_tag(b"a <b> <TaBlE>", 0), Some(6));
        assert_eq!(next_table_tag(b"<tables> <tablet", 0), None);
        assert_eq!(next_table_tag(b"x<table", 2), None);
    }
}
