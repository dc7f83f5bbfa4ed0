//! The model's tokenizer, built from the GGUF vocabulary.
//!
//! GPT-2 style byte-level BPE (`tokenizer.ggml.model = "gpt2"`) runs on the `tokenizers`
//! crate: the BPE model comes from `tokenizer.ggml.tokens` and `tokenizer.ggml.merges`, the
//! pre-tokenizer matches llama.cpp's regexes for `tokenizer.ggml.pre`, and control tokens
//! (`tokenizer.ggml.token_type` 3) become special added tokens. SentencePiece vocabularies
//! (`"llama"`: Gemma) are encoded by `spm.rs`, llama.cpp's algorithm on the token scores.
//! Encoding with `parse_special = false` treats control-token text as plain text, like
//! llama.cpp's `special = false`; user-defined tokens (type 4) are always matched, as there.
//!
//! Decoding drops control tokens (llama.cpp's default); [`Tokenizer::token_bytes`] still
//! gives their text. [`StreamDecoder`] releases text only once its UTF-8 is complete, so a
//! character split across tokens (Cyrillic, CJK, emoji) is never emitted broken.
//! Invariant: ids are checked against the vocabulary size before use.

use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::gguf::GgufFile;
use crate::{Error, Result};

mod spm;

/// `tokenizer.ggml.token_type` values (llama.cpp's `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;
const TOKEN_TYPE_BYTE: i32 = 6;

/// Texts llama.cpp treats as end-of-generation whenever they are tokens of the vocabulary.
const END_OF_GENERATION_TEXTS: [&str; 9] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
];

/// llama.cpp's Llama 3 pre-tokenizer regex (`llama-bpe`).
const LLAMA3_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's Qwen 2 pre-tokenizer regex.
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A model's tokenizer: byte-level BPE or SentencePiece.
pub struct Tokenizer {
    encoder: Encoder,
    /// Raw bytes of every token, concatenated: token `i` is `bytes[ends[i-1]..ends[i]]`.
    bytes: Vec<u8>,
    /// [vocab] end offset of each token in `bytes`.
    ends: Vec<usize>,
    /// [vocab] whether the token is a control token (dropped when decoding).
    control: Vec<bool>,
    bos_id: Option<u32>,
    add_bos: bool,
    /// eos, end-of-turn and other end-of-generation ids, sorted, unique.
    eos_ids: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_id", &self.bos_id)
            .field("eos_ids", &self.eos_ids)
            .finish_non_exhaustive()
    }
}

/// How text becomes ids.
enum Encoder {
    Bpe {
        /// Matches control-token text as control tokens.
        special: Box<tokenizers::Tokenizer>,
        /// The same, but control-token text is encoded as plain text.
        plain: Box<tokenizers::Tokenizer>,
    },
    Spm(Box<spm::Spm>),
}

fn err(reason: impl Into<String>) -> Error {
    Error::Tokenizer { reason: reason.into() }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.*` metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        let m = file.metadata();
        let model = m.str("tokenizer.ggml.model")?;
        if model != "gpt2" && model != "llama" {
            return Err(err(format!(
                "tokenizer model {model:?} is not supported (\"gpt2\" byte-level BPE and \"llama\" SentencePiece are)"
            )));
        }
        let tokens = m.string_array("tokenizer.ggml.tokens")?;
        let types = match m.get("tokenizer.ggml.token_type") {
            Some(_) => m.i32_array("tokenizer.ggml.token_type")?,
            None => vec![1; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(err(format!("{} token types for {} tokens", types.len(), tokens.len())));
        }
        let flag = |key: &str, default: bool| -> Result<bool> {
            match m.get(key) {
                Some(_) => m.bool(key),
                None => Ok(default),
            }
        };
        let (encoder, (bytes, ends)) = if model == "llama" {
            let scores = m.f32_array("tokenizer.ggml.scores")?;
            if scores.len() != tokens.len() {
                return Err(err(format!("{} token scores for {} tokens", scores.len(), tokens.len())));
            }
            let unknown = match m.get("tokenizer.ggml.unknown_token_id") {
                Some(_) => Some(m.u32("tokenizer.ggml.unknown_token_id")?).filter(|id| (*id as usize) < tokens.len()),
                None => None,
            };
            let space_prefix = flag("tokenizer.ggml.add_space_prefix", true)?;
            let spm = spm::Spm::new(&tokens, &scores, &types, space_prefix, unknown);
            (Encoder::Spm(Box::new(spm)), spm_byte_table(&tokens, &types))
        } else {
            let pre = match m.get("tokenizer.ggml.pre") {
                Some(_) => m.str("tokenizer.ggml.pre")?,
                None => "gpt-2",
            };
            let special = build_hf(&tokens, &m.string_array("tokenizer.ggml.merges")?, &types, pre)?;
            let mut plain = special.clone();
            plain.set_encode_special_tokens(true);
            (Encoder::Bpe { special: Box::new(special), plain: Box::new(plain) }, token_byte_table(&tokens, &types))
        };

        let control: Vec<bool> = types.iter().map(|&t| t == TOKEN_TYPE_CONTROL).collect();
        let (bos_id, eos_ids) = special_ids(file, &tokens)?;
        // SentencePiece vocabularies start with BOS unless they say otherwise.
        let add_bos = flag("tokenizer.ggml.add_bos_token", model == "llama")?;
        Ok(Tokenizer { encoder, bytes, ends, control, bos_id, add_bos, eos_ids })
    }

    /// Token ids of `text`, without BOS. With `parse_special`, control-token text (such
    /// as `<|im_start|>`) becomes the control token; without, it is ordinary text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let tk = match &self.encoder {
            Encoder::Spm(spm) => return Ok(spm.encode(text, parse_special)),
            Encoder::Bpe { special, .. } if parse_special => special,
            Encoder::Bpe { plain, .. } => plain,
        };
        let encoding = tk.encode_fast(text, false).map_err(|e| err(format!("encoding failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, control tokens dropped; invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.check_ids(ids)?;
        match &self.encoder {
            Encoder::Bpe { special, .. } => special.decode(ids, true).map_err(|e| err(format!("decoding failed: {e}"))),
            Encoder::Spm(_) => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter(|id| !self.is_control(**id))
                    .flat_map(|id| self.token_slice(*id).iter().copied())
                    .collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        match ids.iter().find(|&&id| id as usize >= self.vocab_size()) {
            Some(id) => Err(err(format!("token id {id} is outside the vocabulary ({})", self.vocab_size()))),
            None => Ok(()),
        }
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.ends.len()
    }

    /// End-of-sequence, end-of-turn and other end-of-generation ids.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// Whether `id` ends generation.
    pub fn is_eos(&self, id: u32) -> bool {
        self.eos_ids.binary_search(&id).is_ok()
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `id` is a control token (dropped from decoded text).
    pub fn is_control(&self, id: u32) -> bool {
        self.control.get(id as usize).copied().unwrap_or(false)
    }

    /// The raw bytes of one token (a control token's bytes are its text); empty for an id
    /// outside the vocabulary. Not necessarily valid UTF-8 on its own.
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.token_slice(id).to_vec()
    }

    fn token_slice(&self, id: u32) -> &[u8] {
        let i = id as usize;
        let start = match i.checked_sub(1) {
            Some(prev) => self.ends.get(prev).copied().unwrap_or(0),
            None => 0,
        };
        let end = self.ends.get(i).copied().unwrap_or(start);
        self.bytes.get(start..end).unwrap_or(&[])
    }

    /// A decoder for a stream of generated ids.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder { tokenizer: self, pending: Vec::new() }
    }
}

/// BOS, and the sorted end-of-generation ids: eos/eot/eom from metadata plus any token
/// whose text llama.cpp treats as end-of-generation.
fn special_ids(file: &GgufFile, tokens: &[&str]) -> Result<(Option<u32>, Vec<u32>)> {
    let m = file.metadata();
    let vocab = tokens.len();
    let id = |key: &str| -> Result<Option<u32>> {
        if m.get(key).is_none() {
            return Ok(None);
        }
        let id = m.u32(key)?;
        if id as usize >= vocab {
            return Err(err(format!("{key} {id} is outside the vocabulary ({vocab})")));
        }
        Ok(Some(id))
    };
    let bos_id = id("tokenizer.ggml.bos_token_id")?;
    let mut eos_ids = Vec::new();
    for key in ["eos", "eot", "eom"] {
        eos_ids.extend(id(&format!("tokenizer.ggml.{key}_token_id"))?);
    }
    let by_text = tokens.iter().zip(0u32..);
    eos_ids.extend(by_text.filter_map(|(t, i)| END_OF_GENERATION_TEXTS.contains(t).then_some(i)));
    eos_ids.sort_unstable();
    eos_ids.dedup();
    Ok((bos_id, eos_ids))
}

/// The `tokenizers` pipeline: BPE model, pre-tokenizer for `pre`, byte-level decoder,
/// control and user-defined tokens as added tokens.
fn build_hf(tokens: &[&str], merges: &[&str], types: &[i32], pre: &str) -> Result<tokenizers::Tokenizer> {
    let vocab: Vocab = tokens.iter().zip(0u32..).map(|(t, i)| ((*t).to_owned(), i)).collect();
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or_else(|| err(format!("merge #{i} {m:?} is not two tokens")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| err(format!("cannot build the BPE model: {e}")))?;
    let mut tk = tokenizers::Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    tk.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    let added = |wanted: i32, special: bool| -> Vec<AddedToken> {
        tokens
            .iter()
            .zip(types)
            .filter(|(_, &t)| t == wanted)
            .map(|(text, _)| AddedToken::from(*text, special).normalized(false))
            .collect()
    };
    tk.add_special_tokens(&added(TOKEN_TYPE_CONTROL, true));
    tk.add_tokens(&added(TOKEN_TYPE_USER_DEFINED, false));
    Ok(tk)
}

/// The pre-tokenizer llama.cpp uses for `tokenizer.ggml.pre`.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    // ByteLevel with its own regex is exactly GPT-2's split.
    let gpt2 = || PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, true));
    let split_then_bytes = |regex: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| err(format!("pre-tokenizer regex: {e}")))?;
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
        ])))
    };
    match pre {
        "gpt-2" | "gpt2" => Ok(gpt2()),
        // Every digit on its own, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva" => {
            Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                PreTokenizerWrapper::Digits(Digits::new(true)),
                gpt2(),
            ])))
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => split_then_bytes(LLAMA3_REGEX),
        "qwen2" | "deepseek-r1-qwen" => split_then_bytes(QWEN2_REGEX),
        other => Err(err(format!("pre-tokenizer {other:?} is not supported"))),
    }
}

/// GPT-2's byte-to-character map, inverted: printable bytes stand for themselves, the
/// other 68 bytes are mapped in order to U+0100 onward. `[char code] -> byte`.
fn byte_decoder() -> Vec<Option<u8>> {
    let mut table = vec![None; 0x100 + 68];
    let mut next = 0x100usize;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable { b as usize } else { next };
        if !printable {
            next += 1;
        }
        if let Some(slot) = table.get_mut(code) {
            *slot = Some(b);
        }
    }
    table
}

/// The raw bytes of every token, flat, and each token's end offset.
fn token_byte_table(tokens: &[&str], types: &[i32]) -> (Vec<u8>, Vec<usize>) {
    let table = byte_decoder();
    let mut bytes = Vec::with_capacity(tokens.iter().map(|t| t.len()).sum());
    let mut ends = Vec::with_capacity(tokens.len());
    for (text, &ty) in tokens.iter().zip(types) {
        let verbatim = ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED;
        for ch in text.chars() {
            match table.get(ch as usize).copied().flatten() {
                Some(b) if !verbatim => bytes.push(b),
                // Added tokens are stored as their text; so is any unmapped character.
                _ => bytes.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// [`token_byte_table`] for a SentencePiece vocabulary (see `spm::token_bytes`).
fn spm_byte_table(tokens: &[&str], types: &[i32]) -> (Vec<u8>, Vec<usize>) {
    let mut bytes = Vec::with_capacity(tokens.iter().map(|t| t.len()).sum());
    let mut ends = Vec::with_capacity(tokens.len());
    for (text, &ty) in tokens.iter().zip(types) {
        spm::token_bytes(text, ty == TOKEN_TYPE_BYTE, &mut bytes);
        ends.push(bytes.len());
    }
    (bytes, ends)
}

/// Turns generated ids into text, holding back an incomplete UTF-8 sequence until the
/// token that completes it arrives.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes not yet released: at most an incomplete UTF-8 sequence (< 4 bytes).
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one token; returns the text it completes (possibly empty). Control tokens and
    /// ids outside the vocabulary add nothing.
    pub fn push(&mut self, id: u32) -> String {
        if !self.tokenizer.is_control(id) {
            self.pending.extend_from_slice(self.tokenizer.token_slice(id));
        }
        self.release(false)
    }

    /// Releases whatever is held back (an unfinished sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        self.release(true)
    }

    fn release(&mut self, flush: bool) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // `valid` is valid UTF-8 by construction; lossy never replaces here.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // A byte that can never start or continue a character.
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = tail.get(bad..).unwrap_or(&[]);
                        }
                        // An unfinished character: wait for the next token.
                        None => {
                            rest = tail;
                            break;
                        }
                    }
                }
            }
        }
        if flush && !rest.is_empty() {
            out.push(char::REPLACEMENT_CHARACTER);
            rest = &[];
        }
        self.pending = rest.to_vec();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    fn tokenizer() -> &'static Tokenizer {
        static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
        TOKENIZER.get_or_init(|| {
            let dir = crate::fetch::default_cache_dir();
            let path = crate::fetch::ensure_default_model(&dir).unwrap();
            Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
        })
    }

    /// Feeds `ids` one at a time; returns the pieces released.
    fn stream(ids: &[u32]) -> Vec<String> {
        let mut decoder = tokenizer().stream_decoder();
        let mut pieces: Vec<String> = ids.iter().map(|&id| decoder.push(id)).collect();
        pieces.push(decoder.finish());
        pieces
    }

    #[derive(serde::Deserialize)]
    struct Corpus {
        bos_id: u32,
        eos_id: u32,
        vocab_size: usize,
        cases: Vec<CorpusCase>,
    }

    #[derive(serde::Deserialize)]
    struct CorpusCase {
        text: String,
        ids: Vec<u32>,
        ids_special: Vec<u32>,
    }

    #[test]
    fn ids_match_llama_cpp_on_the_corpus() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tokenizer_corpus.json");
        let corpus: Corpus = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let tk = tokenizer();
        assert_eq!(tk.vocab_size(), corpus.vocab_size);
        assert_eq!(tk.bos_id(), Some(corpus.bos_id));
        assert!(tk.eos_ids().contains(&corpus.eos_id));
        assert!(corpus.cases.len() >= 40);
        for case in &corpus.cases {
            assert_eq!(tk.encode(&case.text, false).unwrap(), case.ids, "{:?}", case.text);
            assert_eq!(tk.encode(&case.text, true).unwrap(), case.ids_special, "{:?}", case.text);
            assert_eq!(tk.decode(&case.ids).unwrap(), case.text);
            assert_eq!(stream(&case.ids).concat(), case.text);
        }
    }

    #[test]
    fn special_tokens_and_ids() {
        let tk = tokenizer();
        assert_eq!(tk.eos_ids(), [0, 2]); // <|endoftext|>, <|im_end|>
        assert_eq!(tk.bos_id(), Some(1));
        assert!(!tk.add_bos());
        assert_eq!(tk.encode("<|im_start|>user", true).unwrap()[0], 1);
        assert!(tk.encode("<|im_start|>", false).unwrap().len() > 1);
        assert_eq!(tk.token_bytes(2), b"<|im_end|>");
        assert_eq!(tk.decode(&[1, 2]).unwrap(), "", "control tokens are dropped");
        let err = tk.decode(&[49_152]).unwrap_err().to_string();
        assert!(err.contains("token id 49152 is outside the vocabulary (49152)"), "{err}");
        assert!(tk.token_bytes(u32::MAX).is_empty());
    }

    #[test]
    fn token_bytes_are_raw_bytes() {
        let tk = tokenizer();
        let ids = tk.encode(" hello\n", false).unwrap();
        let bytes: Vec<u8> = ids.iter().flat_map(|&id| tk.token_bytes(id)).collect();
        assert_eq!(bytes, b" hello\n");
        // A lone emoji is split into byte tokens that are not UTF-8 on their own.
        let ids = tk.encode("🦀", false).unwrap();
        assert!(ids.len() > 1);
        assert!(std::str::from_utf8(&tk.token_bytes(ids[0])).is_err());
    }

    #[test]
    fn stream_never_breaks_a_character() {
        for text in ["Съешь же ещё этих мягких булок", "你好，世界！今天天气很好", "🦀👨‍👩‍👧🇺🇦 ok 😀"]
        {
            let ids = tokenizer().encode(text, false).unwrap();
            let pieces = stream(&ids);
            assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().filter(|p| p.is_empty()).count() > 1, "nothing was held back");
        }
    }

    #[test]
    fn stream_replaces_bytes_that_cannot_be_utf8() {
        let tk = tokenizer();
        let byte = |b: u8| -> u32 { (0..tk.vocab_size() as u32).find(|&id| tk.token_bytes(id) == [b]).unwrap() };
        let mut d = tk.stream_decoder();
        assert_eq!(d.push(byte(0xF0)), ""); // start of a 4-byte sequence
        assert_eq!(d.push(byte(b'a')), "\u{FFFD}a");
        assert_eq!(d.push(byte(0xE4)), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
        assert_send_sync::<GgufFile>();
        assert_send_sync::<crate::template::ChatTemplate>();
    }

    #[test]
    fn byte_decoder_covers_every_byte_once() {
        let table = byte_decoder();
        let mut seen: Vec<u8> = table.iter().flatten().copied().collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..=255).collect::<Vec<u8>>());
        assert_eq!(table['Ġ' as usize], Some(b' '));
        assert_eq!(table['Ċ' as usize], Some(b'\n'));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn round_trips_random_text(text in "\\PC{0,40}|[ \t\n]{0,8}[а-яё😀-🙏一-龥a-z0-9 ]{0,30}") {
            let ids = tokenizer().encode(&text, false).unwrap();
            prop_assert_eq!(tokenizer().decode(&ids).unwrap(), text.clone());
            let pieces = stream(&ids);
            let replaced = pieces.iter().any(|p| p.contains(char::REPLACEMENT_CHARACTER));
            prop_assert!(!replaced || text.contains(char::REPLACEMENT_CHARACTER));
            prop_assert_eq!(pieces.concat(), text);
        }
    }
}
