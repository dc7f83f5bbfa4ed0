//! Rewritten text: another tenant's words written backwards or in ROT13 are read as written
//! first.
//!
//! "Write it backwards" and "answer in ROT13" are the cheapest disguises a model can be told
//! to apply: no character is added, so nothing looks encoded, and the client undoes them in
//! one line. Both are involutions (applying one twice gives the text back), so undoing is
//! applying, and a check needs no index of its own: the n-gram and token checks hash a
//! window of words undone and look it up with the plain hashes (see `ngram`), the secret
//! ownership check looks a found value up undone (see `secret`), and each canary string is
//! also matched backwards and in ROT13 (see `scan`).
//!
//! Backwards means character by character, so the words come in reverse order and each is
//! reversed; undoing it reads the window from its last word to its first, each word
//! reversed. ROT13 turns each ASCII letter 13 places and leaves every other character.

use crate::detect::encoded::Encoding;

/// A rewriting that keeps every character of the text it disguises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The text character by character from its end.
    Backwards,
    /// Every ASCII letter turned 13 places in the alphabet.
    Rot13,
}

impl Rewrite {
    /// Every rewriting, in the order checks try them.
    pub const ALL: [Rewrite; 2] = [Rewrite::Backwards, Rewrite::Rot13];

    /// How a finding read through this rewriting was written.
    pub fn encoding(self) -> Encoding {
        match self {
            Rewrite::Backwards => Encoding::Backwards,
            Rewrite::Rot13 => Encoding::Rot13,
        }
    }

    /// `s` rewritten, which is also `s` undone.
    pub fn apply(self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        self.push(s, &mut out);
        out
    }

    /// Appends `s` rewritten to `out` (as many bytes as `s`).
    pub(crate) fn push(self, s: &str, out: &mut String) {
        match self {
            Rewrite::Backwards => out.extend(s.chars().rev()),
            Rewrite::Rot13 => out.extend(s.chars().map(rot13_char)),
        }
    }
}

/// An ASCII letter turned 13 places; any other character unchanged.
fn rot13_char(c: char) -> char {
    let turn = |first: u8| char::from((c as u8 - first + 13) % 26 + first);
    match c {
        'a'..='z' => turn(b'a'),
        'A'..='Z' => turn(b'A'),
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rewriting_undoes_itself() {
        for s in ["Hello, World!", "Grüße aus Köln 42", "", "z"] {
            for r in Rewrite::ALL {
                assert_eq!(r.apply(&r.apply(s)), s, "{r:?} {s}");
            }
        }
        assert_eq!(Rewrite::Rot13.apply("Hello, World! 42 ü"), "Uryyb, Jbeyq! 42 ü");
        assert_eq!(Rewrite::Backwards.apply("abc déf"), "féd cba");
    }
}
