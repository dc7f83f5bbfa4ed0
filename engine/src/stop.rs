//! Stop sequences over streamed text.
//!
//! Owns the hold-back rule: text is released only once it can no longer be the start of
//! a stop sequence, so a client never sees any part of a stop string, even when it
//! arrives split across tokens. When a stop string completes, everything before it is
//! released and generation ends.
//!
//! Invariant: the held text is always the longest suffix of the pending text that is a
//! proper prefix of some stop string (so it is short: under the longest stop's length).

/// What one push released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is now safe to release (may be empty).
    pub release: String,
    /// A stop sequence completed; nothing after `release` may be emitted.
    pub stopped: bool,
}

/// Matches a fixed set of stop strings over a stream of text deltas.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops`; empty strings are ignored (they would match everywhere).
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new() }
    }

    /// Adds a delta and returns what may be released now.
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.stops.is_empty() {
            return StopStep { release: delta.to_owned(), stopped: false };
        }
        self.held.push_str(delta);
        // The earliest completed stop string wins.
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            let release = self.held[..at].to_owned();
            self.held.clear();
            return StopStep { release, stopped: true };
        }
        let keep = self.partial_suffix_len();
        let cut = self.held.len() - keep;
        let release = self.held[..cut].to_owned();
        self.held.drain(..cut);
        StopStep { release, stopped: false }
    }

    /// Releases whatever is held (the stream ended without a stop string).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let h = self.held.as_str();
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let from = h.len().saturating_sub(longest.saturating_sub(1));
        (from..h.len())
            .filter(|&i| h.is_char_boundary(i))
            .find(|&i| self.stops.iter().any(|s| s.starts_with(&h[i..])))
            .map_or(0, |i| h.len() - i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces split at `cuts` and returns (released text, stopped).
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let step = m.push(p);
            out.push_str(&step.release);
            if step.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    fn split_everywhere(text: &str) -> Vec<Vec<&str>> {
        let bounds: Vec<usize> = (0..=text.len()).filter(|i| text.is_char_boundary(*i)).collect();
        let mut all = vec![bounds.windows(2).map(|w| &text[w[0]..w[1]]).collect::<Vec<_>>()];
        for &b in &bounds {
            all.push(vec![&text[..b], &text[b..]]);
        }
        all
    }

    #[test]
    fn stop_text_is_never_released_however_the_stream_is_split() {
        let cases = [
            (vec!["</s>", "STOP"], "hello </s> world", "hello ", true),
            (vec!["ab"], "aaab", "aa", true),
            (vec!["стоп"], "привет стоп там", "привет ", true),
            (vec!["x🙂"], "a🙂x🙂b", "a🙂", true),
            (vec!["###"], "no stop ## here #", "no stop ## here #", false),
        ];
        for (stops, text, want, stopped) in cases {
            for pieces in split_everywhere(text) {
                assert_eq!(run(&stops, &pieces), (want.to_string(), stopped), "{text:?} as {pieces:?}");
            }
        }
    }

    #[test]
    fn partial_match_is_held_then_released_when_it_breaks() {
        let mut m = StopMatcher::new(&["STOP".to_string()]);
        assert_eq!(m.push("go ST").release, "go ");
        assert_eq!(m.push("ay").release, "STay");
    }

    #[test]
    fn no_stops_passes_everything_through() {
        let mut m = StopMatcher::new(&[String::new()]);
        assert_eq!(m.push("abc"), StopStep { release: "abc".into(), stopped: false });
    }
}
