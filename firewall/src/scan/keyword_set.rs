//! A rule's keywords grouped by length, for the places that look them up in short strings
//! one rule at a time (keyword reach while rules load, a rule's own samples): one binary
//! search per offset and length instead of one comparison per keyword. A rule with 900
//! keywords (`discord-bot-token-bare`) made both quadratic enough to show in loading; sorted
//! slices rather than hash sets keep the common rule of a few keywords as cheap as before.

pub(crate) struct KeywordSet<'a> {
    /// (length, the keywords of that length, sorted and without duplicates).
    by_len: Vec<(usize, Vec<&'a [u8]>)>,
}

impl<'a> KeywordSet<'a> {
    /// `keywords` as rules store them (ASCII-lowercased); empty ones are left out.
    pub(crate) fn new(keywords: &'a [String]) -> KeywordSet<'a> {
        let mut by_len: Vec<(usize, Vec<&[u8]>)> = Vec::new();
        for word in keywords.iter().map(String::as_bytes).filter(|w| !w.is_empty()) {
            match by_len.iter_mut().find(|(len, _)| *len == word.len()) {
                Some((_, words)) => words.push(word),
                None => by_len.push((word.len(), vec![word])),
            }
        }
        for (_, words) in &mut by_len {
            words.sort_unstable();
            words.dedup();
        }
        KeywordSet { by_len }
    }

    /// Where the first keyword in `s` begins; `s` is folded as keywords are. Byte offsets:
    /// a whole UTF-8 keyword found in UTF-8 text starts at a character boundary.
    pub(crate) fn first_in(&self, s: &[u8]) -> Option<usize> {
        (0..s.len()).find(|&at| {
            self.by_len.iter().any(|(len, words)| s.get(at..at + len).is_some_and(|w| words.binary_search(&w).is_ok()))
        })
    }

    /// Every `(start, end)` where a keyword occurs in `text`, ASCII case-insensitively
    /// (overlapping ones too), grouped by keyword length.
    pub(crate) fn hits(&self, text: &[u8]) -> Vec<(usize, usize)> {
        let mut hits = Vec::new();
        let mut folded = Vec::new();
        for (n, words) in &self.by_len {
            for (at, w) in text.windows(*n).enumerate() {
                folded.clear();
                folded.extend(w.iter().map(u8::to_ascii_lowercase));
                if words.binary_search(&folded.as_slice()).is_ok() {
                    hits.push((at, at + n));
                }
            }
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keywords_of_every_length_in_either_case_and_the_first_one() {
        let words = ["tok".to_string(), "token:".to_string(), "key".to_string(), String::new()];
        let set = KeywordSet::new(&words);
        let mut hits = set.hits(b"my Token: and KEY");
        hits.sort_unstable();
        assert_eq!(hits, [(3, 6), (3, 9), (14, 17)]);
        assert_eq!(set.first_in(b"a key, a token:"), Some(2));
        assert_eq!(set.first_in(b"nothing here"), None);
    }
}
