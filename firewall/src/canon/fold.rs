//! How each non-ASCII character reads in the two views (see the module above): its NFKC
//! form with default-ignorables removed, its TS #39 prototype, and the word splitter's
//! fold, computed once per character and kept in lazily filled tables of 256 blocks.

use std::sync::OnceLock;

use unicode_normalization::UnicodeNormalization;

/// How one character reads in a view.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Fold {
    /// As itself.
    Same,
    /// As this text (empty: removed).
    To(Box<str>),
}

/// The two folds of one non-ASCII character, and what the rules fold asks of it (kept
/// here so that a character costs one table look-up).
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// NFKC, default-ignorables removed.
    pub(super) plain: Fold,
    /// `plain` with confusables replaced by their ASCII prototypes.
    pub(super) full: Fold,
    pub(super) class: Class,
    /// How the word splitter reads `full`.
    word: WordFold,
}

/// What a character of the words view does to the word in progress (outside an escape).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum WordFold {
    /// Nothing (an invisible character).
    Removed,
    /// Ends it (whitespace, `_ - . /`).
    Boundary,
    /// Belongs to it but adds no letters (punctuation).
    Skip,
    /// Adds these lowercase letters and digits.
    Letters(Box<str>),
    /// Anything else (a fold with several kinds of characters): read char by char.
    Mixed,
}

impl WordFold {
    fn of(full: &str) -> WordFold {
        let boundary = |f: char| f.is_whitespace() || matches!(f, '_' | '-' | '.' | '/');
        let mut chars = full.chars();
        match (chars.next(), chars.next()) {
            (None, _) => WordFold::Removed,
            (Some(f), None) if boundary(f) => WordFold::Boundary,
            _ if full.chars().all(char::is_alphanumeric) => {
                WordFold::Letters(full.chars().flat_map(char::to_lowercase).collect())
            }
            _ if full.chars().all(|f| !f.is_alphanumeric() && !boundary(f) && f != '\\') => WordFold::Skip,
            _ => WordFold::Mixed,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Class {
    /// default-ignorable: removed from both views
    pub(super) removed: bool,
    /// a letter or digit: part of a run
    pub(super) alnum: bool,
    /// its plain fold holds an ASCII letter or digit (full-width `Ａ`)
    pub(super) ascii_alnum: bool,
    /// a look-alike: `full` differs from `plain`
    pub(super) candidate: bool,
}

/// Unicode's tag characters U+E0020..=U+E007E: an invisible copy of printable ASCII. Emoji
/// subdivision flags use a few (🏴 then `gbeng`), and "ASCII smuggling" uses them to hide a
/// whole text that renders as nothing and decodes in one line; both views read them as the
/// ASCII they stand for. The language tag U+E0001 and the cancel tag U+E007F stay removed.
fn tag_ascii(c: char) -> Option<char> {
    let cp = c as u32;
    (0xE0020..=0xE007E).contains(&cp).then(|| char::from((cp - 0xE0000) as u8))
}

impl Entry {
    fn of(c: char) -> Entry {
        if let Some(a) = tag_ascii(c) {
            let to = Fold::To(a.to_string().into_boxed_str());
            let class =
                Class { alnum: a.is_ascii_alphanumeric(), ascii_alnum: a.is_ascii_alphanumeric(), ..Class::default() };
            return Entry { plain: to.clone(), full: to, class, word: WordFold::of(&a.to_string()) };
        }
        let mut plain = String::new();
        let mut full = String::new();
        for d in std::iter::once(c).nfkc() {
            if d.is_ascii() {
                plain.push(d);
                full.push(d);
                continue;
            }
            let skeleton: String = unicode_security::skeleton(d.encode_utf8(&mut [0; 4])).collect();
            if skeleton.is_empty() {
                // Only default-ignorable code points vanish from a skeleton.
                continue;
            }
            plain.push(d);
            if d.is_alphanumeric() && skeleton.is_ascii() {
                full.push_str(&keep_case(d, skeleton));
            } else {
                full.push(d);
            }
        }
        let class = Class {
            removed: plain.is_empty(),
            alnum: c.is_alphanumeric(),
            ascii_alnum: plain.bytes().any(|b| b.is_ascii_alphanumeric()),
            candidate: plain != full,
        };
        let word = WordFold::of(&full);
        let fold = |s: String| if s.chars().eq(std::iter::once(c)) { Fold::Same } else { Fold::To(s.into_boxed_str()) };
        Entry { plain: fold(plain), full: fold(full), class, word }
    }
}

/// TS #39 picks `l` as the prototype of `I`, `l` and `1` alike; an upper-case look-alike
/// (Cyrillic `І`, Greek `Ι`) reads as the upper-case letter, so `АКІА` reads `AKIA`.
fn keep_case(c: char, prototype: String) -> String {
    let mut chars = prototype.chars();
    match (chars.next(), chars.next()) {
        (Some('l'), None) if c.is_uppercase() => "I".to_string(),
        _ => prototype,
    }
}

/// [256 blocks of the Basic Multilingual Plane][256 characters], filled on first use.
static BLOCKS: [OnceLock<Box<[Entry]>>; 256] = [const { OnceLock::new() }; 256];

/// Calls `f` with the entry of non-ASCII `c` (cached for the BMP; computed for the rest,
/// which is rare in text).
pub(super) fn with_entry<R>(c: char, f: impl FnOnce(&Entry) -> R) -> R {
    let cp = c as u32;
    if cp > 0xFFFF {
        return f(&Entry::of(c));
    }
    let block = BLOCKS[(cp >> 8) as usize].get_or_init(|| {
        (0..256u32)
            .map(|low| {
                char::from_u32((cp & !0xFF) | low).map_or(
                    Entry { plain: Fold::Same, full: Fold::Same, class: Class::default(), word: WordFold::Mixed },
                    Entry::of,
                )
            })
            .collect()
    });
    f(&block[(cp & 0xFF) as usize])
}

/// The words-view fold of `c` (before lowercasing), char by char, to `out`.
pub(crate) fn words_fold(c: char, mut out: impl FnMut(char)) {
    if c.is_ascii() {
        return out(c);
    }
    with_entry(c, |e| match &e.full {
        Fold::Same => out(c),
        Fold::To(s) => s.chars().for_each(out),
    });
}

/// Calls `f` with how the word splitter reads non-ASCII `c`.
pub(crate) fn with_word_fold<R>(c: char, f: impl FnOnce(&WordFold) -> R) -> R {
    with_entry(c, |e| f(&e.word))
}
