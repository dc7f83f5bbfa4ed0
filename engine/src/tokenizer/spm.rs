//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Gemma, Llama 1-2), encoded
//! as llama.cpp encodes them.
//!
//! Owns the splitting of text around special tokens and the merging of its characters by
//! token score. The steps are llama.cpp's (`llm_tokenizer_spm`), so that ids match it:
//!
//! 1. Partition: every special token's text (control and unknown ones only when special
//!    text is parsed; user-defined ones always), longest first, is cut out of the text
//!    fragments left by the longer ones.
//! 2. Each remaining fragment has its spaces replaced by U+2581 (and one put in front
//!    when the vocabulary asks for a space prefix and the fragment follows a special
//!    token or starts the text), is split into characters, and adjacent symbols are merged
//!    while their concatenation is a token: the pair whose token scores highest first,
//!    the leftmost on a tie.
//! 3. A character left that is no token is spelled in byte tokens (`<0xAB>`), or the
//!    unknown token when the vocabulary has no byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// `tokenizer.ggml.token_type` values this module reads.
const TOKEN_TYPE_UNKNOWN: i32 = 2;
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The whitespace mark SentencePiece writes for a space.
const SPACE: &str = "\u{2581}";

/// A SentencePiece vocabulary ready to encode.
#[derive(Debug)]
pub(crate) struct Spm {
    /// Token text to id (the first id of a text that appears twice).
    ids: HashMap<String, u32>,
    scores: Vec<f32>,
    /// The `<0xAB>` token of each byte.
    bytes: [Option<u32>; 256],
    unknown: Option<u32>,
    /// Special tokens, longest text first: (text, id, whether only parsed as special).
    specials: Vec<(String, u32, bool)>,
    space_prefix: bool,
}

/// A run of text still to encode, or a token already chosen.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

impl Spm {
    /// `tokens`, `scores` and `types` are the vocabulary's parallel arrays.
    pub(crate) fn new(tokens: &[&str], scores: &[f32], types: &[i32], space_prefix: bool, unknown: Option<u32>) -> Spm {
        let mut ids = HashMap::with_capacity(tokens.len());
        for (text, id) in tokens.iter().zip(0u32..) {
            ids.entry((*text).to_owned()).or_insert(id);
        }
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            *slot = ids.get(&format!("<0x{b:02X}>")).copied();
        }
        let mut specials: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(types)
            .zip(0u32..)
            .filter(|((_, t), _)| matches!(**t, TOKEN_TYPE_UNKNOWN | TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED))
            .map(|((text, t), id)| ((*text).to_owned(), id, *t != TOKEN_TYPE_USER_DEFINED))
            .filter(|(text, _, _)| !text.is_empty())
            .collect();
        // Longest first; a stable sort keeps ids in order among equal lengths, as the
        // reference's does.
        specials.sort_by_key(|(text, _, _)| std::cmp::Reverse(text.len()));
        Spm { ids, scores: scores.to_vec(), bytes, unknown, specials, space_prefix }
    }

    /// The ids of `text` (no BOS). With `parse_special`, control-token text becomes the
    /// control token; without, it is encoded as text.
    pub(crate) fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut fragments = vec![Fragment::Text(text)];
        for (special, id, only_special) in &self.specials {
            if *only_special && !parse_special {
                continue;
            }
            if !fragments.iter().any(|f| matches!(f, Fragment::Text(t) if t.contains(special.as_str()))) {
                continue;
            }
            let mut split = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                let Fragment::Text(mut rest) = fragment else {
                    split.push(fragment);
                    continue;
                };
                while let Some(at) = rest.find(special.as_str()) {
                    if at > 0 {
                        split.push(Fragment::Text(&rest[..at]));
                    }
                    split.push(Fragment::Token(*id));
                    rest = &rest[at + special.len()..];
                }
                if !rest.is_empty() {
                    split.push(Fragment::Text(rest));
                }
            }
            fragments = split;
        }
        let mut out = Vec::new();
        let mut after_special = true;
        for fragment in fragments {
            match fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    let prefix = if self.space_prefix && after_special { SPACE } else { "" };
                    self.merge(&format!("{prefix}{}", t.replace(' ', SPACE)), &mut out);
                    after_special = false;
                }
            }
        }
        out
    }

    /// Step 2 and 3 on one escaped fragment.
    fn merge(&self, text: &str, out: &mut Vec<u32>) {
        // Symbols: byte ranges of `text`, linked in order; a merged-away one is empty.
        let mut symbols: Vec<Symbol> = text
            .char_indices()
            .map(|(at, c)| Symbol { start: at, len: c.len_utf8(), prev: None, next: None })
            .collect();
        let n = symbols.len();
        for (i, s) in symbols.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = (i + 1 < n).then_some(i + 1);
        }
        let mut queue = BinaryHeap::new();
        let offer = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else { return };
            let (a, b) = (&symbols[l], &symbols[r]);
            let joined = &text[a.start..b.start + b.len];
            if let Some(&id) = self.ids.get(joined) {
                let score = self.scores.get(id as usize).copied().unwrap_or(0.0);
                queue.push(Bigram { score, left: l, right: r, size: joined.len() });
            }
        };
        for i in 1..n {
            offer(&mut queue, &symbols, Some(i - 1), Some(i));
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (bigram.left, bigram.right);
            // Stale: one side was merged into something else since.
            if symbols[l].len == 0 || symbols[r].len == 0 || symbols[l].len + symbols[r].len != bigram.size {
                continue;
            }
            symbols[l].len += symbols[r].len;
            symbols[r].len = 0;
            symbols[l].next = symbols[r].next;
            if let Some(next) = symbols[r].next {
                symbols[next].prev = Some(l);
            }
            let (prev, next) = (symbols[l].prev, symbols[l].next);
            offer(&mut queue, &symbols, prev, Some(l));
            offer(&mut queue, &symbols, Some(l), next);
        }
        // A merge only ever makes a token, so a symbol is a token or a single character
        // (the reference's re-splitting of merged non-tokens never applies).
        let mut at = (n > 0).then_some(0);
        while let Some(i) = at {
            let s = &symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => out.extend(piece.bytes().filter_map(|b| self.bytes[b as usize].or(self.unknown))),
            }
            at = s.next;
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of symbols `left` and `right` (`size` bytes when offered).
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl Ord for Bigram {
    /// Higher scores first; on a tie, the leftmost.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// The bytes a SentencePiece token stands for: U+2581 as a space, `<0xAB>` byte tokens
/// as their byte (`byte_token`: its type says so), anything else as its text.
pub(crate) fn token_bytes(text: &str, byte_token: bool, out: &mut Vec<u8>) {
    if byte_token {
        if let Some(b) =
            text.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')).and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            return;
        }
    }
    out.extend_from_slice(text.replace(SPACE, " ").as_bytes());
}
