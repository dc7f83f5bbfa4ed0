//! Rewritten text: another tenant's words written backwards, in ROT13, in Atbash or in
//! Caesar's cipher are read as written first.
//!
//! "Write it backwards" and "answer in ROT13" are the cheapest disguises a model can be told
//! to apply: no character is added, so nothing looks encoded, and the client undoes them in
//! one line. Cipher jailbreaks use the same few (ROT13, Caesar's shift of three, Atbash,
//! Morse code, which `encoded` reads). A check needs no index of its own: the n-gram and
//! token checks hash a window of words undone and look it up with the plain hashes (see
//! `ngram`), the secret ownership check looks a found value up undone (see `secret`), and
//! each canary string is also matched as each rewriting writes it (see `scan`).
//!
//! Backwards means character by character, so the words come in reverse order and each is
//! reversed; undoing it reads the window from its last word to its first, each word
//! reversed. The ciphers turn each ASCII letter and leave every other character: ROT13 13
//! places, Caesar's 3 places on (undone 3 back), Atbash to the letter as far from the other
//! end of the alphabet (`a` and `z`). All but Caesar's are their own inverse.

use crate::detect::encoded::Encoding;

/// A rewriting that keeps every character of the text it disguises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rewrite {
    /// The text character by character from its end.
    Backwards,
    /// Every ASCII letter turned 13 places in the alphabet.
    Rot13,
    /// Every ASCII letter mirrored in the alphabet (`a` to `z`, `b` to `y`).
    Atbash,
    /// Every ASCII letter turned 3 places on (`a` to `d`), as Caesar wrote.
    Caesar,
}

impl Rewrite {
    /// Every rewriting, in the order checks try them.
    pub const ALL: [Rewrite; 4] = [Rewrite::Backwards, Rewrite::Rot13, Rewrite::Atbash, Rewrite::Caesar];

    /// How a finding read through this rewriting was written.
    pub fn encoding(self) -> Encoding {
        match self {
            Rewrite::Backwards => Encoding::Backwards,
            Rewrite::Rot13 => Encoding::Rot13,
            Rewrite::Atbash => Encoding::Atbash,
            Rewrite::Caesar => Encoding::Caesar,
        }
    }

    /// `s` rewritten, as a client receives it.
    pub fn apply(self, s: &str) -> String {
        match self {
            Rewrite::Caesar => s.chars().map(|c| turn(c, 3)).collect(),
            _ => self.undo(s),
        }
    }

    /// `s` undone: the text a client reads out of it.
    pub fn undo(self, s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        self.push_undone(s, &mut out);
        out
    }

    /// Appends `s` undone to `out` (as many bytes as `s`).
    pub(crate) fn push_undone(self, s: &str, out: &mut String) {
        match self {
            Rewrite::Backwards => out.extend(s.chars().rev()),
            Rewrite::Rot13 => out.extend(s.chars().map(|c| turn(c, 13))),
            Rewrite::Atbash => out.extend(s.chars().map(mirror)),
            Rewrite::Caesar => out.extend(s.chars().map(|c| turn(c, 23))),
        }
    }
}

/// An ASCII letter turned `by` places on; any other character unchanged.
fn turn(c: char, by: u8) -> char {
    let turn = |first: u8| char::from((c as u8 - first + by) % 26 + first);
    match c {
        'a'..='z' => turn(b'a'),
        'A'..='Z' => turn(b'A'),
        _ => c,
    }
}

/// An ASCII letter mirrored in the alphabet; any other character unchanged.
fn mirror(c: char) -> char {
    match c {
        'a'..='z' => char::from(b'z' - (c as u8 - b'a')),
        'A'..='Z' => char::from(b'Z' - (c as u8 - b'A')),
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rewriting_is_undone() {
        for s in ["Hello, World!", "Grüße aus Köln 42", "", "z"] {
            for r in Rewrite::ALL {
                assert_eq!(r.undo(&r.apply(s)), s, "{r:?} {s}");
                assert_eq!(r.undo(s).len(), s.len(), "{r:?} {s}");
            }
        }
        assert_eq!(Rewrite::Rot13.apply("Hello, World! 42 ü"), "Uryyb, Jbeyq! 42 ü");
        assert_eq!(Rewrite::Backwards.apply("abc déf"), "féd cba");
        assert_eq!(Rewrite::Atbash.apply("Hello, xyz"), "Svool, cba");
        assert_eq!(Rewrite::Caesar.apply("Hello, xyz"), "Khoor, abc");
    }
}
