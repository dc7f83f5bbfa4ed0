//! The generic-secret judge: how likely a value a generic rule matched (`password = …`,
//! `api_key: …`) is a credential rather than code, a placeholder or prose.
//!
//! A rule opts in with `judge = <min score>`; its regex finds the candidates, and the
//! judge keeps those scoring at least that. The score is a logistic model over features of
//! the value's own characters (length, classes, entropy, how English- or code-like its
//! letter pairs are, counting and keyboard runs, placeholder words, code and path shapes)
//! and of its line up to the value (which credential word names it, which harmless noun,
//! prose around it). Whether the value is quoted is left out on purpose: the labelled
//! texts quote their secrets more often than people do, and the model learnt that instead
//! of the value's shape. The weights and the letter-pair table are data
//! (`firewall/data/judge.toml`), trained offline by `examples/train_judge.rs` on labelled
//! texts and real source files; the feature code below is the only definition of the
//! features, shared by training and scanning, so the two cannot drift apart.
//!
//! Only the text from the start of the match's line (at most
//! [`crate::rules::rule::ALLOW_LINE_LOOKBACK`] bytes back) to the end of the value is read, the
//! same window `allow_line` sees: a stream scanner holds that much, so streaming and
//! one-shot scans judge alike.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;
use serde::Deserialize;

use crate::rules::rule::shannon_entropy;

/// The model the binary carries.
const BUILTIN: &str = include_str!("../../data/judge.toml");

/// Feature names, in vector order; the model file lists them too, so weights trained for
/// another feature set are refused instead of misread.
pub const FEATURES: [&str; 31] = [
    "len_ln",
    "entropy",
    "lower",
    "upper",
    "digit",
    "symbol",
    "three_classes",
    "class_changes",
    "pair_logp",
    "rare_pairs",
    "counting_run",
    "repeat_run",
    "keyboard_run",
    "placeholder_word",
    "code_punct",
    "member_access",
    "identifier_shape",
    "interpolation",
    "path_or_url",
    "hex_only",
    "digits_only",
    "has_space",
    "name_password",
    "name_secret",
    "name_token",
    "name_key",
    "name_harmless",
    "vowels",
    "prose_line",
    "assign_colon",
    "hex_named_credential",
];

/// Number of features.
pub const N: usize = FEATURES.len();

/// A trained model: standardisation, weights, and the letter-pair table.
#[derive(Debug, Clone)]
pub struct Judge {
    mean: [f32; N],
    scale: [f32; N],
    weights: [f32; N],
    bias: f32,
    /// ln P(b | a) for lowercase ASCII letters, `[a * 26 + b]`.
    pairs: Vec<f32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    features: Vec<String>,
    mean: Vec<f32>,
    scale: Vec<f32>,
    weights: Vec<f32>,
    bias: f32,
    pairs: Vec<f32>,
}

/// Why a model file was refused.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("judge model is not valid TOML: {0}")]
    Syntax(String),
    #[error("judge model was trained for other features (expected {N}: {expected})", expected = FEATURES.join(", "))]
    Features,
    #[error("judge model: `{0}` has the wrong length")]
    Length(&'static str),
}

fn array(v: Vec<f32>, what: &'static str) -> Result<[f32; N], ModelError> {
    v.try_into().map_err(|_| ModelError::Length(what))
}

impl Judge {
    /// Reads a model file (the format `train_judge` writes).
    pub fn from_toml(text: &str) -> Result<Judge, ModelError> {
        let m: ModelFile = toml::from_str(text).map_err(|e| ModelError::Syntax(e.message().to_string()))?;
        if m.features.iter().map(String::as_str).ne(FEATURES) {
            return Err(ModelError::Features);
        }
        if m.pairs.len() != 26 * 26 {
            return Err(ModelError::Length("pairs"));
        }
        Ok(Judge {
            mean: array(m.mean, "mean")?,
            scale: array(m.scale, "scale")?,
            weights: array(m.weights, "weights")?,
            bias: m.bias,
            pairs: m.pairs,
        })
    }

    /// The model built into the binary.
    pub fn builtin() -> &'static Judge {
        static MODEL: OnceLock<Judge> = OnceLock::new();
        // The embedded file is checked by the tests; a bad one must not take scanning
        // down, so it falls back to a model that keeps every candidate.
        MODEL.get_or_init(|| Judge::from_toml(BUILTIN).unwrap_or_else(|_| Judge::keep_all()))
    }

    /// The mean letter-pair log-probability over the pairs of adjacent letters in `s`, and
    /// how many there are: near -2.5 for English words run together, near -4.6 for random
    /// letters (their 99th percentile about -3.3).
    pub(crate) fn letter_pair_mean(&self, s: &str) -> (f32, usize) {
        let (mut sum, mut n) = (0f32, 0usize);
        for w in s.as_bytes().windows(2) {
            if let (Some(a), Some(c)) = (letter(w[0]), letter(w[1])) {
                sum += self.pairs.get(a * 26 + c).copied().unwrap_or(0.0);
                n += 1;
            }
        }
        (if n == 0 { 0.0 } else { sum / n as f32 }, n)
    }

    /// A model that scores every candidate 1: what a rule's regex alone would keep.
    pub fn keep_all() -> Judge {
        Judge { mean: [0.0; N], scale: [1.0; N], weights: [0.0; N], bias: 30.0, pairs: vec![0.0; 26 * 26] }
    }

    /// A model from trained parts (what `train_judge` fits).
    pub fn from_parts(mean: [f32; N], scale: [f32; N], weights: [f32; N], bias: f32, pairs: Vec<f32>) -> Judge {
        let pairs = if pairs.len() == 26 * 26 { pairs } else { vec![0.0; 26 * 26] };
        Judge { mean, scale, weights, bias, pairs }
    }

    /// The model file for these parts.
    pub fn to_toml(&self) -> String {
        let list = |v: &[f32]| v.iter().map(|x| format!("{x:.6}")).collect::<Vec<_>>().join(", ");
        let names = FEATURES.iter().map(|f| format!("\"{f}\"")).collect::<Vec<_>>().join(", ");
        format!(
            "features = [{names}]\nmean = [{}]\nscale = [{}]\nweights = [{}]\nbias = {:.6}\npairs = [{}]\n",
            list(&self.mean),
            list(&self.scale),
            list(&self.weights),
            self.bias,
            list(&self.pairs)
        )
    }

    /// Probability (0..1) that `value` is a credential, `context` being its line up to
    /// the value (the name and operator before it).
    pub fn score(&self, context: &str, value: &str) -> f32 {
        self.score_features(&self.features(context, value))
    }

    /// The score of a feature vector.
    pub fn score_features(&self, x: &[f32; N]) -> f32 {
        let terms = x.iter().zip(&self.mean).zip(&self.scale).zip(&self.weights);
        let z = self.bias + terms.map(|(((x, m), s), w)| w * (x - m) / s).sum::<f32>();
        1.0 / (1.0 + (-z).exp())
    }

    /// The feature vector of a candidate (see [`FEATURES`]).
    pub fn features(&self, context: &str, value: &str) -> [f32; N] {
        value_features(value, &self.pairs, context)
    }
}

/// Letter-pair log-probabilities estimated from `text` (add-one smoothed): what
/// [`Judge`]'s `pair_logp` and `rare_pairs` read.
pub fn letter_pairs(texts: &[&str]) -> Vec<f32> {
    let mut counts = vec![1.0f64; 26 * 26];
    for t in texts {
        let b = t.as_bytes();
        for w in b.windows(2) {
            if let (Some(a), Some(c)) = (letter(w[0]), letter(w[1])) {
                counts[a * 26 + c] += 1.0;
            }
        }
    }
    let mut out = vec![0.0f32; 26 * 26];
    for a in 0..26 {
        let row: f64 = counts[a * 26..a * 26 + 26].iter().sum();
        for c in 0..26 {
            out[a * 26 + c] = (counts[a * 26 + c] / row).ln() as f32;
        }
    }
    out
}

fn letter(b: u8) -> Option<usize> {
    b.is_ascii_alphabetic().then(|| usize::from(b.to_ascii_lowercase() - b'a'))
}

/// A letter pair rarer than this (ln P < -5, about 1 in 150) counts as rare.
const RARE_PAIR: f32 = -5.0;

const KEYBOARD_ROWS: [&[u8]; 4] = [b"1234567890", b"qwertyuiop", b"asdfghjkl", b"zxcvbnm"];

/// Where a byte is on [`KEYBOARD_ROWS`], `row << 4 | column`, either case of a letter alike:
/// one lookup per byte instead of a search of every row.
const KEY_PLACES: [u8; 256] = {
    let mut places = [OFF_THE_ROWS; 256];
    let mut r = 0;
    while r < KEYBOARD_ROWS.len() {
        let row = KEYBOARD_ROWS[r];
        let mut c = 0;
        while c < row.len() {
            let place = (r as u8) << 4 | c as u8;
            places[row[c] as usize] = place;
            places[row[c].to_ascii_uppercase() as usize] = place;
            c += 1;
        }
        r += 1;
    }
    places
};
const OFF_THE_ROWS: u8 = 0xff;

const PLACEHOLDER_WORDS: [&str; 14] = [
    "example",
    "sample",
    "dummy",
    "fake",
    "your",
    "xxx",
    "changeme",
    "placeholder",
    "redacted",
    "todo",
    "test",
    "secret",
    "password",
    "token",
];

/// The credential words a name may hold, by the feature each sets (`name_password`,
/// `name_secret`, `name_token`, `name_key`).
const NAME_WORDS: [&[&str]; 4] = [
    &["pass", "pwd", "пароль", "contraseña"],
    &["secret", "private", "credential", "секрет"],
    &["token", "bearer", "auth", "session", "токен"],
    &["key", "ключ"],
];

const HARMLESS_NAMES: [&str; 17] = [
    "id", "name", "user", "url", "uri", "host", "path", "file", "type", "version", "field", "label", "hash", "salt",
    "public", "format", "length",
];

/// The word lists as automata, built once: a value or a name is read once for all of a
/// list's words. ASCII letters match in either case, other characters as written (what
/// lowercasing the ASCII letters and searching each word did).
struct WordFinders {
    placeholder: Option<AhoCorasick>,
    /// Every word of [`NAME_WORDS`]; a match's pattern is an index into `name_feature`.
    names: Option<AhoCorasick>,
    name_feature: Vec<usize>,
}

fn word_finders() -> &'static WordFinders {
    static FINDERS: OnceLock<WordFinders> = OnceLock::new();
    FINDERS.get_or_init(|| {
        let build = |words: &[&str]| {
            // A handful of short literals: building cannot fail (the tests cover it), and a
            // judge without its word lists reads every value as free of them.
            AhoCorasick::builder().ascii_case_insensitive(true).build(words).ok()
        };
        let name_words: Vec<&str> = NAME_WORDS.iter().flat_map(|w| w.iter().copied()).collect();
        let name_feature = NAME_WORDS.iter().enumerate().flat_map(|(i, w)| std::iter::repeat_n(i, w.len())).collect();
        WordFinders { placeholder: build(&PLACEHOLDER_WORDS), names: build(&name_words), name_feature }
    })
}

/// Which of [`NAME_WORDS`]' lists `name` holds a word of.
fn name_words(name: &str) -> [bool; 4] {
    let finders = word_finders();
    let mut found = [false; 4];
    let Some(names) = &finders.names else { return found };
    for m in names.find_overlapping_iter(name) {
        if let Some(&feature) = finders.name_feature.get(m.pattern().as_usize()) {
            found[feature] = true;
        }
    }
    found
}

fn value_features(v: &str, pairs: &[f32], context: &str) -> [f32; N] {
    let mut x = [0.0f32; N];
    let (mut chars, mut lower, mut upper, mut digit, mut symbol) = (0usize, 0f32, 0f32, 0f32, 0f32);
    let (mut changes, mut whitespace) = (0f32, false);
    let mut last_class = 0u8;
    for c in v.chars() {
        chars += 1;
        whitespace |= c.is_whitespace();
        let class = if c.is_lowercase() {
            lower += 1.0;
            1
        } else if c.is_uppercase() {
            upper += 1.0;
            2
        } else if c.is_numeric() {
            digit += 1.0;
            3
        } else {
            symbol += 1.0;
            4
        };
        if last_class != 0 && class != last_class {
            changes += 1.0;
        }
        last_class = class;
    }
    let n = chars.max(1) as f32;
    let shape = ByteShape::of(v.as_bytes(), pairs);
    let [name_password, name_secret, name_token, name_key] = name_words(context);
    x[0] = n.ln();
    x[1] = shannon_entropy(v) as f32;
    x[2] = lower / n;
    x[3] = upper / n;
    x[4] = digit / n;
    x[5] = symbol / n;
    x[6] = f32::from(u8::from(lower > 0.0 && upper > 0.0 && digit > 0.0));
    x[7] = changes / n;
    x[8] = if shape.npairs > 0.0 { shape.logp / shape.npairs } else { 0.0 };
    x[9] = if shape.npairs > 0.0 { shape.rare / shape.npairs } else { 0.0 };
    let [counting, repeated, keyboard] = shape.runs.map(|run| run.longest as f32 / n);
    (x[10], x[11], x[12]) = (counting, repeated, keyboard);
    x[13] = f32::from(u8::from(word_finders().placeholder.as_ref().is_some_and(|words| words.is_match(v))));
    x[14] = f32::from(u8::from(shape.code_punctuation));
    x[15] = f32::from(u8::from(shape.member_access));
    x[16] = f32::from(u8::from(identifier_shape(v)));
    x[17] = f32::from(u8::from(v.starts_with(['$', '%', '@', '<', ':', '&', '*']) || shape.template));
    x[18] = f32::from(u8::from(shape.scheme || v.starts_with(['/', '.', '~']) || shape.slashes >= 2));
    x[19] = f32::from(u8::from(shape.all_hex && !shape.all_digits));
    x[20] = f32::from(u8::from(shape.all_digits));
    x[21] = f32::from(u8::from(whitespace));
    x[22] = f32::from(u8::from(name_password));
    x[23] = f32::from(u8::from(name_secret));
    x[24] = f32::from(u8::from(name_token));
    x[25] = f32::from(u8::from(name_key));
    x[26] = f32::from(u8::from(name_has_harmless_word(context)));
    x[27] = if shape.letters > 0 { shape.vowels as f32 / shape.letters as f32 } else { 0.0 };
    x[28] = f32::from(u8::from(context.split_whitespace().filter(|w| w.chars().all(char::is_alphabetic)).count() >= 4));
    x[29] = f32::from(u8::from(context.trim_end_matches(['"', '\'', '`', ' ', '\t']).ends_with(':')));
    // Hex is a hash's alphabet as often as a key's: the name tells which (a linear model
    // cannot combine the two features by itself).
    x[30] = x[19] * f32::from(u8::from((x[22] + x[23] + x[24] + x[25]) > 0.0 && x[26] == 0.0));
    x
}

/// What a value's bytes and their neighbours say, read in one pass instead of one per
/// feature.
#[derive(Debug, Default, PartialEq)]
struct ByteShape {
    /// The letter pairs' summed log-probabilities, how many are rare, how many there are.
    logp: f32,
    rare: f32,
    npairs: f32,
    /// Counting (`abc`, `321`), one byte repeated, neighbours on a keyboard row.
    runs: [Run; 3],
    /// One of `()[]{},;`.
    code_punctuation: bool,
    /// A letter, `.` or `:`, a letter: `name.attr`, `name::item`.
    member_access: bool,
    /// `${` or `{{`.
    template: bool,
    /// `://`.
    scheme: bool,
    slashes: usize,
    all_hex: bool,
    all_digits: bool,
    letters: usize,
    vowels: usize,
}

/// The longest run of bytes so far where each follows the one before by some rule.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Run {
    longest: usize,
    current: usize,
}

impl Run {
    fn step(&mut self, follows: bool) {
        self.current = if follows { self.current + 1 } else { 1 };
        self.longest = self.longest.max(self.current);
    }
}

impl ByteShape {
    fn of(b: &[u8], pairs: &[f32]) -> ByteShape {
        let first = Run { longest: usize::from(!b.is_empty()), current: 1 };
        let mut shape = ByteShape { runs: [first; 3], all_hex: true, all_digits: true, ..ByteShape::default() };
        for (i, &c) in b.iter().enumerate() {
            shape.code_punctuation |= matches!(c, b'(' | b')' | b'[' | b']' | b'{' | b'}' | b',' | b';');
            shape.slashes += usize::from(c == b'/');
            shape.all_hex &= c.is_ascii_hexdigit();
            shape.all_digits &= c.is_ascii_digit();
            if c.is_ascii_alphabetic() {
                shape.letters += 1;
                shape.vowels += usize::from(matches!(c.to_ascii_lowercase(), b'a' | b'e' | b'i' | b'o' | b'u'));
            }
            let Some(&p) = i.checked_sub(1).and_then(|j| b.get(j)) else { continue };
            if let (Some(a), Some(l)) = (letter(p), letter(c)) {
                let logp = pairs.get(a * 26 + l).copied().unwrap_or(0.0);
                shape.logp += logp;
                shape.rare += f32::from(u8::from(logp < RARE_PAIR));
                shape.npairs += 1.0;
            }
            let [counting, repeated, keyboard] = &mut shape.runs;
            counting.step(c.is_ascii_alphanumeric() && (c == p.wrapping_add(1) || c.wrapping_add(1) == p));
            repeated.step(c == p);
            keyboard.step(keyboard_neighbours(p, c));
            shape.template |= (p == b'$' || p == b'{') && c == b'{';
            let Some(&q) = i.checked_sub(2).and_then(|j| b.get(j)) else { continue };
            shape.member_access |= q.is_ascii_alphabetic() && (p == b'.' || p == b':') && c.is_ascii_alphabetic();
            shape.scheme |= q == b':' && p == b'/' && c == b'/';
        }
        shape
    }
}

/// Whether `c` is next to `p` on one row of a QWERTY keyboard, in either case.
fn keyboard_neighbours(p: u8, c: u8) -> bool {
    let (p, c) = (KEY_PLACES[usize::from(p)], KEY_PLACES[usize::from(c)]);
    p != OFF_THE_ROWS && c != OFF_THE_ROWS && p >> 4 == c >> 4 && (p & 15).abs_diff(c & 15) == 1
}

/// Letters and underscores only, or camelCase / snake_case words with at most a trailing
/// number: how identifiers look, and random strings rarely do.
fn identifier_shape(v: &str) -> bool {
    let b = v.as_bytes();
    if b.is_empty() || !b[0].is_ascii_alphabetic() {
        return false;
    }
    let body = v.trim_end_matches(|c: char| c.is_ascii_digit());
    body.bytes().all(|c| c.is_ascii_alphabetic() || c == b'_' || c == b'-')
        && body.bytes().filter(u8::is_ascii_uppercase).count() * 3 <= body.len().max(1)
}

/// Whether the name holds a word that names no secret (`user_id`, `file-path`): a whole
/// word between non-alphanumerics, in any case (camelCase parts are not split).
fn name_has_harmless_word(name: &str) -> bool {
    name.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| HARMLESS_NAMES.iter().any(|h| h.eq_ignore_ascii_case(w)))
}

/// What the judge reads before a value: from the start of the match's line (the context
/// `allow_line` sees) to the value, from its last line if the match spans several.
pub fn context_before(hay: &str, match_start: usize, value_start: usize) -> &str {
    let before = hay.get(crate::rules::rule::line_start(hay, match_start)..value_start).unwrap_or("");
    before.rfind('\n').map_or(before, |nl| &before[nl + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_model_loads() {
        let m = Judge::from_toml(BUILTIN);
        assert!(m.is_ok(), "{m:?}");
    }

    #[test]
    fn a_model_for_other_features_is_refused() {
        let m = Judge::keep_all().to_toml().replace("\"len_ln\"", "\"length\"");
        assert!(matches!(Judge::from_toml(&m), Err(ModelError::Features)));
        let round = Judge::from_toml(&Judge::keep_all().to_toml());
        assert!(round.is_ok());
    }

    #[test]
    fn the_builtin_model_tells_credentials_from_code_and_placeholders() {
        let j = Judge::builtin();
        for (ctx, v) in [
            ("DB_PASSWORD=", "1jtOm9UH%Qv4ReA"),
            ("  api_key: \"", "PMWoDrrFbzy9Lz191fAWI3RLU6n80YmH"),
            ("client_secret = '", "45RvwRf4OpCnD4fC1u-vsOP1wIDiV_H3"),
        ] {
            assert!(j.score(ctx, v) > 0.5, "{ctx}{v}: {}", j.score(ctx, v));
        }
        for (ctx, v) in [
            ("  lookerVersion = ", "_messages.StringField(6)"),
            ("password = ", "get_password()"),
            ("api_key = \"", "your-api-key-here"),
            ("SET_PASSWORD = '", "SetPassword"),
            ("token = ", "self.session_token"),
        ] {
            assert!(j.score(ctx, v) < 0.5, "{ctx}{v}: {}", j.score(ctx, v));
        }
    }

    #[test]
    fn context_is_the_line_up_to_the_value_within_the_look_back() {
        let hay = "first line\n  password = hunter2";
        let start = hay.find("password").unwrap_or(0);
        let value = hay.find("hunter2").unwrap_or(0);
        assert_eq!(context_before(hay, start, value), "  password = ");
        let long = format!("{}password = x", "é".repeat(200));
        let start = long.find("password").unwrap_or(0);
        let ctx = context_before(&long, start, start + 11);
        assert!(ctx.len() <= crate::rules::rule::ALLOW_LINE_LOOKBACK + 11 && ctx.ends_with("password = "));
    }

    /// The judge can be steered by the text around a value (prose on the line, a harmless
    /// noun in the name), so it may only gate generic guesses: a provider-format rule
    /// asking it would let a disguised real token through. A built-in rule that asks the
    /// judge must be tagged `generic`, and a provider token in such steered text must
    /// still be found.
    #[test]
    fn only_generic_rules_ask_the_judge_and_provider_tokens_ignore_it() {
        let rules = crate::Ruleset::builtin();
        assert!(rules.is_ok(), "built-in rules do not load");
        let Ok(rules) = rules else { return };
        let asking: Vec<&str> = rules.rules().iter().filter(|r| r.judge.is_some()).map(|r| r.id.as_str()).collect();
        assert!(!asking.is_empty());
        for r in rules.rules().iter().filter(|r| r.judge.is_some()) {
            assert!(r.tags.iter().any(|t| t == "generic"), "{} asks the judge but is not tagged generic", r.id);
        }
        let steered = "the user id name url version of this file path is the example key ghp_8Xz2Qw7Lp4Vn9Rt3Ks6Jm1Hb5Cd0Fg2Ae4Yu";
        let found: Vec<String> = rules.scan(steered).into_iter().map(|f| f.rule_id).collect();
        assert!(found.iter().any(|id| id.starts_with("github")), "{found:?}");
    }

    /// The builtin model's scores, bit for bit, on values and names in every script and
    /// shape the features read (case, Cyrillic and Spanish names, keyboard and counting
    /// runs, paths, hashes): how the features are computed may change, what they are may
    /// not without retraining the model.
    #[test]
    fn scores_do_not_change_between_versions() {
        let j = Judge::builtin();
        for (ctx, v, bits) in [
            ("api_key = \"", "PMWoDrrFbzy9Lz191fAWI3RLU6n80YmH", 0x3f6a3157),
            ("    password: ", "hunter2hunter2", 0x3eca9a42),
            ("TOKEN=", "qwertyuiopasdfgh1234", 0x3f23eb2e),
            ("пароль: ", "Пароль2024секрет", 0x3efa4d3a),
            ("the user_id token is ", "user_profile_v2_1234", 0x3e973fea),
            ("self.secret = ", "settings.SECRET_KEY", 0x3d2f5d18),
            ("Bearer ", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc", 0x3f650478),
            ("db_pass = '", "S3cr3t!Pa$$w0rd", 0x3f0081cb),
            ("hash: ", "5e78f94e542173efcad84273109b4d5a", 0x3f38975c),
            ("ключ = ", "AbCdEfGh12345678ZYXW", 0x3f30ba74),
            ("file path url: ", "/usr/local/share/x.pem", 0x3c8efeb7),
            ("my access token and some prose here: ", "zxcvbnm,./asdf{}[]", 0x3d8339ed),
            ("contraseña=", "ÄÖÜäöüß€xyz", 0x3eb6b859),
        ] {
            assert_eq!(j.score(ctx, v).to_bits(), bits, "{ctx}{v}: {}", j.score(ctx, v));
        }
    }

    #[test]
    fn keyboard_rows_are_read_in_either_case() {
        assert!(keyboard_neighbours(b'q', b'W') && keyboard_neighbours(b'5', b'6') && keyboard_neighbours(b'M', b'n'));
        assert!(
            !keyboard_neighbours(b'p', b'a') && !keyboard_neighbours(b'0', b'q') && !keyboard_neighbours(b'-', b'=')
        );
        assert_eq!(name_words("DB_PASSWORD_Token"), [true, false, true, false]);
        assert_eq!(name_words("секрет ключ"), [false, true, false, true]);
        assert!(name_has_harmless_word("USER_ID") && !name_has_harmless_word("userid"));
    }

    #[test]
    fn runs_are_measured() {
        let longest = |b: &[u8]| ByteShape::of(b, &[]).runs.map(|r| r.longest);
        assert_eq!(longest(b"xabcdy"), [4, 1, 1]);
        assert_eq!(longest(b"qwerty"), [1, 1, 6]);
        assert_eq!(longest(b"a9876aaa"), [4, 3, 4]);
        assert_eq!(longest(b""), [0, 0, 0]);
        let shape = |b: &[u8]| ByteShape::of(b, &[]);
        assert!(shape(b"os.environ").member_access && shape(b"a:b").member_access && !shape(b"1.5").member_access);
        assert!(shape(b"s3://b/k").scheme && shape(b"s3://b/k").slashes == 3 && !shape(b":/ /").scheme);
        assert!(shape(b"${X}").template && shape(b"{{x}}").template && !shape(b"{x}").template);
        assert!(shape(b"f(x)").code_punctuation && !shape(b"fx").code_punctuation);
        assert!(shape(b"").all_hex && shape(b"").all_digits && shape(b"beef").all_hex && !shape(b"beef").all_digits);
        assert_eq!((shape(b"Queue9").letters, shape(b"Queue9").vowels), (5, 4));
        assert!(identifier_shape("get_password") && !identifier_shape("a8Fk29dLq") && !identifier_shape("9abc"));
    }
}
