//! Every occurrence of every keyword in a text, ASCII case-insensitively, in one pass that
//! does a few arithmetic operations per byte.
//!
//! One-shot scanning needs the start of each keyword occurrence (overlapping ones too) to
//! pick the rules worth trying. An Aho-Corasick DFA over the default rules' ~470 keywords
//! does that slowly for what it is: its tables outgrow the L1 cache, and every byte is a
//! dependent table walk. [`KeywordFinder`] instead looks at the four bytes from each
//! position independently:
//!
//! * bytes are folded with `| 0x20`, which maps an ASCII capital to its small letter (and
//!   a few other bytes onto each other: the filter only ever lets more through);
//! * a keyword is known by its folded first four bytes (three for three-byte keywords; the
//!   few two-byte keywords are compared with every window directly);
//! * a filter word, chosen by a hash of the first three, holds one bit per value of the
//!   fourth byte's low five bits (all bits for a three-byte keyword), so one load answers
//!   for a position: a gather, in the AVX2 loop, for eight positions (sixteen with
//!   AVX-512);
//! * a position whose prefixes hit the filter (about 1 in 100 on prose, mostly real
//!   keyword prefixes such as `pass` or `serv`) looks the prefix up exactly and compares
//!   the whole keywords, eight bytes at a time.
//!
//! The loop carries no state from one position to the next, so the CPU overlaps them. It
//! reports exactly what an overlapping case-insensitive Aho-Corasick search reports (tests
//! compare the two), several times as fast with AVX2 (figures: BENCHMARKS.md, "Firewall
//! scanning"). Without AVX2 the portable loop is slower than the automaton, so the caller keeps the
//! automaton there (see [`KeywordFinder::is_accelerated`]); the portable loop still does
//! the last bytes of every text and is the twin the SIMD loops are tested against. Where the
//! filter would be too full to skip anything (keyword sets with one-byte words, or many
//! two-byte ones) [`KeywordFinder::build`] declines.

/// The filter has 2^FILTER_BITS 32-bit words (the unit AVX2 gathers): 64 KiB.
/// Measured on prose: 2^13 words (the L1 cache) scan slower, 2^15 no faster.
const FILTER_BITS: u32 = 14;
const FILTER_WORDS: usize = 1 << FILTER_BITS;
type Filter = [u32; FILTER_WORDS];

/// Above this share of filter bits set, too many positions would pass for the filter to
/// beat an automaton.
const MAX_FILL: f64 = 0.05;

/// Keys are folded prefixes: 4 bytes, or 3 or 2 with zero bytes above. A folded byte is
/// never zero (`| 0x20`), so the kinds never collide and 0 marks an empty slot.
type Key = u32;

/// Two-byte keywords are compared with each window rather than filtered (entered in the
/// filter, each would stand for 128 three-byte prefixes); past this many, declining and
/// leaving them to the automaton is cheaper.
const MAX_PAIRS: usize = 4;

/// Folds the four bytes of a window at once.
const FOLD: u32 = 0x2020_2020;

/// Multiplicative hash, FILTER_BITS wide. The xor-shift first lets the key's top byte
/// reach the low bits kept (a product's bit k sees only the key's bits up to k); without
/// it the filter passed several times as many positions of prose. `x86::probe` computes the
/// same.
fn hash(key: Key) -> usize {
    ((key ^ (key >> 11)).wrapping_mul(HASH_MULTIPLIER) >> (32 - FILTER_BITS)) as usize
}
const HASH_MULTIPLIER: u32 = 0x9E37_79B1;

/// Exact prefix -> the keywords it opens, open addressing on the same hash.
#[derive(Debug)]
struct PrefixTable {
    /// (key, start, end) into `heads`; key 0 = empty slot.
    slots: Vec<(Key, u32, u32)>,
    /// Each prefix's keywords, contiguous: a confirmation reads one short run.
    heads: Vec<Head>,
    mask: usize,
}

impl PrefixTable {
    fn build(mut entries: Vec<(Key, u32)>, words: &[Word]) -> PrefixTable {
        entries.sort_unstable();
        entries.dedup();
        let distinct = entries.chunk_by(|a, b| a.0 == b.0).count();
        let capacity = (distinct * 2).next_power_of_two().max(16);
        let mut slots = vec![(0, 0, 0); capacity];
        let mut heads = Vec::with_capacity(entries.len());
        let mask = capacity - 1;
        for group in entries.chunk_by(|a, b| a.0 == b.0) {
            let key = group[0].0;
            let start = heads.len() as u32;
            heads.extend(group.iter().map(|&(_, id)| Head::of(&words[id as usize], id)));
            let mut slot = hash(key) & mask;
            while slots[slot].0 != 0 {
                slot = (slot + 1) & mask;
            }
            slots[slot] = (key, start, heads.len() as u32);
        }
        PrefixTable { slots, heads, mask }
    }

    fn get(&self, key: Key) -> &[Head] {
        let mut slot = hash(key) & self.mask;
        loop {
            let (k, start, end) = self.slots[slot];
            if k == key {
                return &self.heads[start as usize..end as usize];
            }
            if k == 0 {
                return &[];
            }
            slot = (slot + 1) & self.mask;
        }
    }
}

/// A keyword's first eight bytes, compared with the text's in one step (see [`Word`] for
/// the fold); a longer keyword then compares the rest.
#[derive(Debug, Clone, Copy)]
struct Head {
    lower: u64,
    fold: u64,
    /// The bytes the keyword has among the eight.
    care: u64,
    id: u32,
    len: u32,
}

impl Head {
    fn of(word: &Word, id: u32) -> Head {
        let care = if word.len >= 8 { u64::MAX } else { (1u64 << (8 * word.len)) - 1 };
        Head { lower: word.lower[0], fold: word.fold[0], care, id, len: word.len as u32 }
    }
}

/// Finds every (keyword, start) occurrence in a text; see the module docs.
#[derive(Debug)]
pub(crate) struct KeywordFinder {
    /// Keywords by id.
    words: Vec<Word>,
    /// Word `hash(first three bytes)`, bit `fourth byte & 31`, is set for every prefix in
    /// `prefixes`: see [`KeywordFinder::passes`].
    filter: Box<Filter>,
    /// Folded two-byte keywords, compared directly (at most MAX_PAIRS).
    pairs: Vec<Key>,
    /// Bit `hash(prefix)` set for the prefix of each three-byte keyword: most positions
    /// that pass the filter have none to look up.
    threes: Box<[u64; FILTER_WORDS / 64]>,
    prefixes: PrefixTable,
    /// Which twin of the block loop runs (detected once, at build).
    simd: Simd,
}

/// The block loops, slowest first: each level also runs the ones below it on the text's
/// last bytes, which its wider loads cannot reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Simd {
    Portable,
    Avx2,
    Avx512,
}

impl KeywordFinder {
    /// A finder for `words` (ids are their indices), or None when the filter would be too
    /// full to be worth it, or a keyword is shorter than two bytes, or more than MAX_PAIRS
    /// are two bytes long.
    pub(crate) fn build<S: AsRef<str>>(words: &[S]) -> Option<KeywordFinder> {
        let mut entries: Vec<(Key, u32)> = Vec::new();
        let mut pairs = Vec::new();
        for (id, w) in words.iter().enumerate() {
            let w = w.as_ref().as_bytes();
            let id = id as u32;
            let fold = |b: u8| (b | 0x20) as Key;
            match w.len() {
                // A one-byte keyword would pass a quarter of all positions.
                0 | 1 => return None,
                2 => {
                    let key = fold(w[0]) | fold(w[1]) << 8;
                    entries.push((key, id));
                    if !pairs.contains(&key) {
                        pairs.push(key);
                    }
                }
                3 => entries.push((fold(w[0]) | fold(w[1]) << 8 | fold(w[2]) << 16, id)),
                _ => entries.push((fold(w[0]) | fold(w[1]) << 8 | fold(w[2]) << 16 | fold(w[3]) << 24, id)),
            }
        }
        if pairs.len() > MAX_PAIRS {
            return None;
        }
        let mut filter = Box::new([0u32; FILTER_WORDS]);
        for &(key, _) in entries.iter().filter(|(key, _)| key >> 16 != 0) {
            filter[hash(key & 0x00FF_FFFF)] |= fourth_byte_bits(key);
        }
        let set: u32 = filter.iter().map(|w| w.count_ones()).sum();
        if f64::from(set) > MAX_FILL * (32 * FILTER_WORDS) as f64 {
            return None;
        }
        let mut threes = Box::new([0u64; FILTER_WORDS / 64]);
        for &(key, _) in entries.iter().filter(|(key, _)| key >> 16 != 0 && key >> 24 == 0) {
            let h = hash(key);
            threes[h / 64] |= 1 << (h % 64);
        }
        let words: Vec<Word> = words.iter().map(|w| Word::new(w.as_ref().as_bytes())).collect();
        let prefixes = PrefixTable::build(entries, &words);
        Some(KeywordFinder { words, filter, pairs, threes, prefixes, simd: x86::best() })
    }

    /// Whether a SIMD loop runs: only then does the finder beat an automaton.
    pub(crate) fn is_accelerated(&self) -> bool {
        self.simd > Simd::Portable
    }

    /// Calls `found(keyword id, start)` for every occurrence in `text`, in order of start.
    pub(crate) fn for_each(&self, text: &[u8], mut found: impl FnMut(usize, usize)) {
        let mut confirm_block = |at: usize, mut passed: u32| {
            while passed != 0 {
                let j = passed.trailing_zeros() as usize;
                passed &= passed - 1;
                self.confirm(text, at + j, &mut found);
            }
        };
        let at = x86::scan(self.simd, &self.filter, &self.pairs, text, &mut confirm_block);
        let mut at = at;
        while at + BLOCK_BYTES <= text.len() {
            let Some(bytes) = text.get(at..at + BLOCK_BYTES).and_then(|b| b.try_into().ok()) else { break };
            let passed = self.block(bytes);
            if passed != 0 {
                confirm_block(at, passed);
            }
            at += BLOCK;
        }
        for i in at..text.len() {
            if self.passes(window(text, i)) != 0 {
                confirm_block(i, 1);
            }
        }
    }

    /// Bit j set if position j of a block may start a keyword (j < BLOCK). Two 8-byte
    /// loads give the eight windows (1.3x the speed of assembling each window apart).
    #[inline(always)]
    fn block(&self, bytes: &[u8; BLOCK_BYTES]) -> u32 {
        const FOLD64: u64 = 0x2020_2020_2020_2020;
        let lo = u64::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7]])
            | FOLD64;
        let hi = u64::from_le_bytes([bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8], bytes[9], bytes[10]])
            | FOLD64;
        let mut passed = 0;
        for j in 0..5 {
            passed |= self.passes((lo >> (8 * j)) as Key) << j;
        }
        for j in 5..BLOCK {
            passed |= self.passes((hi >> (8 * (j - 3))) as Key) << j;
        }
        passed
    }

    /// 1 if the folded window `w` may start a keyword, else 0.
    #[inline(always)]
    fn passes(&self, w: Key) -> u32 {
        let pair = self.pairs.contains(&(w & 0xFFFF));
        (self.filter[hash(w & 0x00FF_FFFF) % FILTER_WORDS] >> (w >> 24 & 31)) & 1 | u32::from(pair)
    }

    /// Reports the keywords that really start at `at`: those of its four-byte prefix, and
    /// of the three- and two-byte ones where there are such keywords.
    #[cold]
    fn confirm(&self, text: &[u8], at: usize, found: &mut impl FnMut(usize, usize)) {
        let rest = &text[at..];
        let (w, first) = match rest.first_chunk::<8>() {
            Some(eight) => {
                let first = u64::from_le_bytes(*eight);
                (first as Key | FOLD, first)
            }
            None => {
                // Past the text's end zeros stand in (the length check rules them out).
                let mut first = [0u8; 8];
                first[..rest.len()].copy_from_slice(rest);
                (window(text, at), u64::from_le_bytes(first))
            }
        };
        self.check(self.prefixes.get(w), first, rest, at, found);
        let three = hash(w & 0x00FF_FFFF);
        if self.threes[three / 64] >> (three % 64) & 1 != 0 {
            self.check(self.prefixes.get(w & 0x00FF_FFFF), first, rest, at, found);
        }
        if self.pairs.contains(&(w & 0xFFFF)) {
            self.check(self.prefixes.get(w & 0xFFFF), first, rest, at, found);
        }
    }

    /// Reports the keywords of `heads` that `rest` (the text from `at`, whose first eight
    /// bytes are `first`) starts with.
    #[inline(always)]
    fn check(&self, heads: &[Head], first: u64, rest: &[u8], at: usize, found: &mut impl FnMut(usize, usize)) {
        for h in heads {
            if (first | h.fold) & h.care == h.lower
                && rest.len() >= h.len as usize
                && (h.len <= 8 || self.words[h.id as usize].starts(rest))
            {
                found(h.id as usize, at);
            }
        }
    }

    pub(crate) fn memory_usage(&self) -> usize {
        FILTER_WORDS * 4
            + self.prefixes.slots.len() * std::mem::size_of::<(Key, u32, u32)>()
            + self.prefixes.heads.len() * std::mem::size_of::<Head>()
            + FILTER_WORDS / 8
            + self.words.iter().map(|w| 16 * w.lower.len()).sum::<usize>()
    }
}

/// A keyword, ready to be compared eight bytes at a time.
#[derive(Debug)]
struct Word {
    len: usize,
    /// The keyword lowercased, in little-endian 8-byte chunks, zero-padded.
    lower: Box<[u64]>,
    /// 0x20 at each letter's byte: `text | fold == lower` compares a chunk ignoring case
    /// (a byte ORed with 0x20 equals a small letter only if it is that letter, either case).
    fold: Box<[u64]>,
}

impl Word {
    fn new(word: &[u8]) -> Word {
        let chunks = |f: &dyn Fn(u8) -> u8| -> Box<[u64]> {
            word.chunks(8)
                .map(|c| {
                    let mut b = [0u8; 8];
                    for (d, &s) in b.iter_mut().zip(c) {
                        *d = f(s);
                    }
                    u64::from_le_bytes(b)
                })
                .collect()
        };
        Word {
            len: word.len(),
            lower: chunks(&|b| b.to_ascii_lowercase()),
            fold: chunks(&|b| if b.is_ascii_alphabetic() { 0x20 } else { 0 }),
        }
    }

    /// Whether `text` starts with this word, ASCII case-insensitively.
    #[inline]
    fn starts(&self, text: &[u8]) -> bool {
        if text.len() < self.len {
            return false;
        }
        if text.len() < 8 * self.lower.len() {
            // Too close to the end for whole chunks.
            let lower = self.lower.iter().flat_map(|c| c.to_le_bytes());
            return text.iter().zip(lower).take(self.len).all(|(t, l)| t.to_ascii_lowercase() == l);
        }
        let last = self.lower.len() - 1;
        let care = u64::MAX >> (8 * (8 * self.lower.len() - self.len));
        text.chunks_exact(8).zip(self.lower.iter().zip(self.fold.iter())).enumerate().all(
            |(i, (t, (&lower, &fold)))| {
                let t = u64::from_le_bytes([t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]) | fold;
                (if i == last { t & care } else { t }) == lower
            },
        )
    }
}

/// The filter bits a key sets in its word: the fourth byte's, or all for a 3-byte key
/// (any fourth byte may follow).
fn fourth_byte_bits(key: Key) -> u32 {
    if key >> 24 == 0 {
        u32::MAX
    } else {
        1 << (key >> 24 & 31)
    }
}

/// Positions per block; a block reads BLOCK_BYTES (its last window's four bytes).
const BLOCK: usize = 8;
const BLOCK_BYTES: usize = BLOCK + 3;

/// The folded four bytes from `at`; past the text's end a space stands in, which only
/// makes a prefix that the comparison against the real text then rejects.
#[inline(always)]
fn window(text: &[u8], at: usize) -> Key {
    let mut win = [b' '; 4];
    for (k, b) in win.iter_mut().enumerate() {
        if let Some(&t) = text.get(at + k) {
            *b = t;
        }
    }
    u32::from_le_bytes(win) | FOLD
}

/// The block loops with SIMD: windows from one load, the hash in 32-bit lanes, the filter
/// bits fetched by gathers. Same filter, same hash, same passes as the portable loop (a
/// test compares them on random texts).
///
/// * AVX2: eight windows per step, from a 16-byte load.
/// * AVX-512 (with VBMI, for the byte permute): sixteen windows per step, from a 32-byte
///   load, one 16-lane gather. Per-scan ABBA of 1 MiB of the corpus's clean records on an
///   Intel Xeon (family 6, model 207), against the AVX2 loop, medians of 100-200 quads:
///   prose 1.10-1.11x, logs 1.07x, code 1.01-1.07x (four runs), configs 0.96-1.04x
///   (three); on code and configs the time goes to the positions that pass, not to the
///   loop. Not measured on AMD's Zen 4, which runs 512-bit instructions as two halves.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

/// Without x86-64 there is no twin: the portable loop does every block.
#[cfg(not(target_arch = "x86_64"))]
mod x86 {
    use super::{Filter, Key, Simd};

    pub(super) fn best() -> Simd {
        Simd::Portable
    }

    pub(super) fn scan(_: Simd, _: &Filter, _: &[Key], _: &[u8], _: &mut impl FnMut(usize, u32)) -> usize {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aho_corasick::{AhoCorasickBuilder, MatchKind};
    use proptest::prelude::*;

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_simd_setting_only_lowers_the_level() {
        assert_eq!(x86::capped(Simd::Avx512, Some("avx2")), Simd::Avx2);
        assert_eq!(x86::capped(Simd::Avx2, Some("avx2")), Simd::Avx2);
        assert_eq!(x86::capped(Simd::Portable, Some("avx2")), Simd::Portable);
        assert_eq!(x86::capped(Simd::Avx512, Some("portable")), Simd::Portable);
        assert_eq!(x86::capped(Simd::Avx2, Some("avx512")), Simd::Avx2);
        assert_eq!(x86::capped(Simd::Avx512, None), Simd::Avx512);
    }

    fn with_automaton(words: &[&str], text: &str) -> Vec<(usize, usize)> {
        let ac = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::Standard)
            .build(words)
            .unwrap();
        let mut v: Vec<(usize, usize)> =
            ac.find_overlapping_iter(text).map(|m| (m.pattern().as_usize(), m.start())).collect();
        v.sort_unstable();
        v
    }

    fn with_finder(words: &[&str], text: &str) -> Vec<(usize, usize)> {
        let f = KeywordFinder::build(words).expect("filter not too full");
        let mut v = Vec::new();
        f.for_each(text.as_bytes(), |id, at| v.push((id, at)));
        v.sort_unstable();
        v
    }

    #[test]
    fn finds_what_the_automaton_finds_at_every_length_and_at_the_ends() {
        let words = ["q~", "pat", "pass", "password", "AKIA", "sk-", "://", "$2a$"];
        let text = "Q~x PAT pass PassWord akia://sk- $2A$ pat\u{0}q~ é pass";
        assert_eq!(with_finder(&words, text), with_automaton(&words, text));
        for end in 0..=text.len() {
            let t = &text.as_bytes()[..end];
            let Ok(t) = std::str::from_utf8(t) else { continue };
            assert_eq!(with_finder(&words, t), with_automaton(&words, t), "text {t:?}");
        }
    }

    #[test]
    fn bytes_that_fold_alike_are_told_apart() {
        // '\r' | 0x20 == '-' and '?' | 0x20 == '?', '_' | 0x20 == 0x7f: the filter lets such
        // bytes through, the comparison must not.
        let words = ["a-b", "x_y", "key-"];
        let text = "a\rb x\u{7f}y KEY\r key- KEY-";
        assert_eq!(with_finder(&words, text), vec![(2, 13), (2, 18)]);
        assert_eq!(with_finder(&words, text), with_automaton(&words, text));
    }

    #[test]
    fn a_filter_too_full_is_declined() {
        let letters = || (b'a'..=b'z').map(char::from);
        let two: Vec<String> = letters().flat_map(|a| letters().map(move |b| format!("{a}{b}"))).collect();
        assert!(KeywordFinder::build(&two[..MAX_PAIRS]).is_some());
        assert!(KeywordFinder::build(&two[..MAX_PAIRS + 1]).is_none());
        // Three-byte keywords set whole filter words: enough of them fill it.
        let three: Vec<String> = two.iter().flat_map(|p| letters().map(move |c| format!("{p}{c}"))).collect();
        assert!(KeywordFinder::build(&three[..100]).is_some());
        assert!(KeywordFinder::build(&three).is_none());
        assert!(KeywordFinder::build(&["k", "key"]).is_none());
    }

    /// The default rules' keywords (loaded once: a ruleset takes a second to build).
    fn default_keywords() -> &'static [String] {
        static WORDS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        WORDS.get_or_init(|| {
            let rules = crate::Ruleset::builtin().expect("default rules load");
            let mut words: Vec<String> = rules.rules.iter().flat_map(|r| r.keywords.iter().cloned()).collect();
            words.sort();
            words.dedup();
            words
        })
    }

    #[test]
    fn the_default_keywords_are_found_as_the_automaton_finds_them() {
        let words = default_keywords();
        let refs: Vec<&str> = words.iter().map(String::as_str).collect();
        let corpus = ["prose", "code", "configs", "logs", "answers"]
            .iter()
            .map(|f| {
                std::fs::read_to_string(format!("{}/tests/corpus/{f}.jsonl", env!("CARGO_MANIFEST_DIR")))
                    .expect("corpus")
            })
            .collect::<String>();
        let found = with_finder(&refs, &corpus);
        assert!(found.len() > 1000, "{} hits", found.len());
        assert_eq!(found, with_automaton(&refs, &corpus));
    }

    proptest! {
        #[test]
        fn every_simd_loop_agrees_with_the_portable_one(text in "[a-zA-Z0-9_\\-:/~= \n]{0,300}") {
            let words = default_keywords();
            let Some(mut f) = KeywordFinder::build(words) else { panic!("default keywords declined") };
            let best = f.simd;
            let found = |f: &KeywordFinder| {
                let mut v = Vec::new();
                f.for_each(text.as_bytes(), |id, at| v.push((id, at)));
                v
            };
            f.simd = Simd::Portable;
            let portable = found(&f);
            for simd in [Simd::Avx2, Simd::Avx512].into_iter().filter(|&s| s <= best) {
                f.simd = simd;
                prop_assert_eq!(&found(&f), &portable, "{:?}", simd);
            }
        }

        #[test]
        fn agrees_with_the_automaton(
            words in prop::collection::vec("[a-cA-C_\\-]{2,6}", 1..12),
            text in "[a-cA-C_\\-\r\u{7f} é]{0,80}",
        ) {
            let refs: Vec<&str> = words.iter().map(String::as_str).collect();
            let Some(f) = KeywordFinder::build(&refs) else { return Ok(()) };
            let mut v = Vec::new();
            f.for_each(text.as_bytes(), |id, at| v.push((id, at)));
            v.sort_unstable();
            // Duplicate words: the automaton reports one id per (word, start), the finder
            // every id; compare on the words.
            let mut got: Vec<(String, usize)> = v.into_iter().map(|(id, at)| (words[id].to_ascii_lowercase(), at)).collect();
            let mut want: Vec<(String, usize)> = with_automaton(&refs, &text).into_iter().map(|(id, at)| (words[id].to_ascii_lowercase(), at)).collect();
            got.sort_unstable();
            got.dedup();
            want.sort_unstable();
            want.dedup();
            prop_assert_eq!(got, want);
        }
    }
}
