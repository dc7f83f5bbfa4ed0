//! Offsets of the rules view back to the raw text. The view is built from pieces that each
//! cover whole raw characters, so every view byte has one raw character (or JSON escape)
//! that produced it, and a view span maps to the raw span of every character that
//! contributed to it.

use std::collections::VecDeque;

/// Offsets of a view back to the raw text: runs where they are equal, and changed units.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpanMap {
    // in view (and raw) order, contiguous in both
    segs: VecDeque<Seg>,
}

#[derive(Debug, Clone, Copy)]
struct Seg {
    view: usize,
    raw: usize,
    view_len: usize,
    raw_len: usize,
    same: bool,
}

impl SpanMap {
    /// View `view..view+len` is raw `raw..raw+len`.
    pub(crate) fn push_same(&mut self, view: usize, raw: usize, len: usize) {
        if let Some(last) = self.segs.back_mut() {
            if last.same && last.view + last.view_len == view && last.raw + last.raw_len == raw {
                last.view_len += len;
                last.raw_len += len;
                return;
            }
        }
        self.segs.push_back(Seg { view, raw, view_len: len, raw_len: len, same: true });
    }

    /// View `view..view+view_len` came from raw `raw..raw+raw_len` as one unit.
    pub(crate) fn push_changed(&mut self, view: usize, raw: usize, view_len: usize, raw_len: usize) {
        self.segs.push_back(Seg { view, raw, view_len, raw_len, same: false });
    }

    /// The raw offset where the character holding view byte `v` starts.
    pub(crate) fn raw_start(&self, v: usize) -> usize {
        let i = self.segs.partition_point(|s| s.view + s.view_len <= v);
        match self.segs.get(i) {
            Some(s) if s.same => s.raw + v.saturating_sub(s.view),
            Some(s) => s.raw,
            None => self.segs.back().map_or(v, |s| s.raw + s.raw_len),
        }
    }

    /// The raw offset where the character holding view byte `v - 1` ends (`v` is an end).
    pub(crate) fn raw_end(&self, v: usize) -> usize {
        let Some(last) = v.checked_sub(1) else { return self.raw_start(v) };
        let i = self.segs.partition_point(|s| s.view + s.view_len <= last);
        match self.segs.get(i) {
            Some(s) if s.same => s.raw + (v - s.view),
            Some(s) => s.raw + s.raw_len,
            None => self.segs.back().map_or(v, |s| s.raw + s.raw_len),
        }
    }

    /// The first view offset whose character starts at raw offset `r` or later.
    pub(crate) fn to_view(&self, r: usize) -> usize {
        let i = self.segs.partition_point(|s| s.raw + s.raw_len <= r);
        match self.segs.get(i) {
            Some(s) if s.same => s.view + r.saturating_sub(s.raw),
            Some(s) if r <= s.raw => s.view,
            Some(s) => s.view + s.view_len,
            None => self.segs.back().map_or(r, |s| s.view + s.view_len),
        }
    }

    /// Forgets the units that end at or before view offset `v`.
    pub(crate) fn trim_before(&mut self, v: usize) {
        while self.segs.len() > 1 && self.segs.front().is_some_and(|s| s.view + s.view_len <= v) {
            self.segs.pop_front();
        }
    }

    /// Maps a view span to the raw span of every character that contributed to it.
    pub(crate) fn raw_span(&self, start: usize, end: usize) -> (usize, usize) {
        let s = self.raw_start(start);
        (s, if end > start { self.raw_end(end) } else { s })
    }
}
