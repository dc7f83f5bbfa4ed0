//! Incremental Server-Sent Events parser (the subset OpenAI-compatible servers use): bytes
//! arrive in arbitrary pieces, events come out whole. Lines end in `\n`, `\r\n` or `\r`;
//! `data:` lines accumulate until a blank line dispatches the event; comments (`:`) and
//! other fields are ignored. A line longer than [`MAX_LINE_BYTES`] and an event whose
//! `data:` lines together pass the parser's event cap are errors, so a hostile upstream
//! cannot make the gateway buffer without bound: one stream holds at most a line and an
//! event.

/// One dispatched event's data (its `data:` lines joined with `\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub data: String,
}

/// The longest line the parser accepts, in bytes.
pub const MAX_LINE_BYTES: usize = 8 * 1024 * 1024;

/// The event cap of [`SseParser::new`] (`[[models]] max_stream_event_bytes`'s default).
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    #[error("event stream line longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("event stream is not valid UTF-8")]
    NotUtf8,
    #[error("event stream event larger than {limit_bytes} bytes")]
    EventTooLarge { limit_bytes: usize },
}

/// Feeds on byte pieces, yields complete events.
#[derive(Debug)]
pub struct SseParser {
    /// Bytes of the line in progress.
    line: Vec<u8>,
    /// Data lines of the event in progress.
    data: Option<String>,
    /// The previous byte was `\r`, so a following `\n` belongs to the same line end.
    after_cr: bool,
    /// Most bytes of `data` (lines and the `\n`s joining them) one event may hold.
    max_event_bytes: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        SseParser::with_max_event_bytes(DEFAULT_MAX_EVENT_BYTES)
    }
}

impl SseParser {
    pub fn new() -> Self {
        SseParser::default()
    }

    /// A parser refusing events whose data passes `max_event_bytes`.
    pub fn with_max_event_bytes(max_event_bytes: usize) -> Self {
        SseParser { line: Vec::new(), data: None, after_cr: false, max_event_bytes }
    }

    /// Consumes `bytes`, appending every event they complete to `out`.
    pub fn push(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.after_cr && rest[0] == b'\n' {
                rest = &rest[1..];
                self.after_cr = false;
                continue;
            }
            self.after_cr = false;
            match rest.iter().position(|&b| b == b'\n' || b == b'\r') {
                Some(end) => {
                    self.append(&rest[..end])?;
                    self.after_cr = rest[end] == b'\r';
                    rest = &rest[end + 1..];
                    self.end_line(out)?;
                }
                None => {
                    self.append(rest)?;
                    rest = &[];
                }
            }
        }
        Ok(())
    }

    /// Dispatches an event left open by a stream that ended without a blank line.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if !self.line.is_empty() {
            self.end_line(out)?;
        }
        if let Some(data) = self.data.take() {
            out.push(SseEvent { data });
        }
        Ok(())
    }

    fn append(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_LINE_BYTES {
            return Err(SseError::LineTooLong);
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn end_line(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent { data });
            }
            return Ok(());
        }
        let line = String::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_str(), ""),
        };
        if field == "data" {
            let held = self.data.as_ref().map_or(0, |d| d.len() + 1);
            if held + value.len() > self.max_event_bytes {
                self.data = None;
                return Err(SseError::EventTooLarge { limit_bytes: self.max_event_bytes });
            }
            match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &[u8], piece: usize) -> Vec<SseEvent> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in input.chunks(piece.max(1)) {
            p.push(chunk, &mut out).unwrap();
        }
        p.finish(&mut out).unwrap();
        out
    }

    #[test]
    fn events_are_the_same_for_every_chunking() {
        let input = b": keep-alive\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata: line2\n\ndata:[DONE]\n\n";
        let expected = vec![
            SseEvent { data: "{\"a\":1}".into() },
            SseEvent { data: "line1\nline2".into() },
            SseEvent { data: "[DONE]".into() },
        ];
        for piece in 1..=input.len() {
            assert_eq!(parse_in_pieces(input, piece), expected, "piece size {piece}");
        }
    }

    #[test]
    fn bare_cr_line_endings_work() {
        assert_eq!(parse_in_pieces(b"data: x\r\rdata: y\r\r", 1).len(), 2);
    }

    #[test]
    fn an_unterminated_last_event_is_dispatched_at_finish() {
        assert_eq!(parse_in_pieces(b"data: tail", 3), vec![SseEvent { data: "tail".into() }]);
    }

    #[test]
    fn an_event_past_the_cap_is_an_error_however_its_lines_are_split() {
        // 16 lines of 100 bytes: 1615 bytes of data joined, over a 1 KiB cap, while no
        // line comes near the line cap.
        let line = format!("data: {}\n", "x".repeat(100));
        let event = line.repeat(16) + "\n";
        for piece in [1, 7, 100, event.len()] {
            let mut p = SseParser::with_max_event_bytes(1024);
            let mut out = Vec::new();
            let result = event.as_bytes().chunks(piece).try_for_each(|c| p.push(c, &mut out));
            assert_eq!(result, Err(SseError::EventTooLarge { limit_bytes: 1024 }), "piece size {piece}");
            assert!(out.is_empty());
        }
        // The same lines in events under the cap pass.
        let small = line.repeat(8) + "\n";
        let mut p = SseParser::with_max_event_bytes(1024);
        let mut out = Vec::new();
        p.push(small.repeat(3).as_bytes(), &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(out[0].data.len(), 8 * 100 + 7);
    }

    #[test]
    fn invalid_utf8_is_an_error_not_a_panic() {
        let mut p = SseParser::new();
        assert_eq!(p.push(b"data: \xff\xfe\n", &mut Vec::new()), Err(SseError::NotUtf8));
    }
}
