//! Disguised leaks: every disguise class (Cyrillic look-alikes, full-width forms, invisible
//! characters, text hidden in tag characters, upper case, JSON escapes, words joined by `_ - .`) is caught by the secret
//! rules, the canaries and the foreign n-grams alike; a foreign run reaches a client for at
//! most three words; secret values are attributed to their owner; and a stream of disguised
//! text agrees with one-shot scanning for any chunking.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{
    fingerprints, secret_fingerprints, Action, Detail, DetectorKind, Detectors, Finding, NgramConfig, NgramKey,
    Ruleset, ScanContext, SecretOwnership, StreamScanner,
};
use proptest::prelude::*;

const KEY: &str = "dbk_Q2w3E4r5T6y7U8i9O0pA";
const CANARY: &str = "GLOBEX-CANARY-51d0e2";
const PASSWORD: &str = "db_password = 'S3cr3t!Pa55w0rd'";
const PROSE: &str = "the merger with initech closes on friday at noon sharp";
const HASH_KEY: NgramKey = NgramKey(*b"fedcba9876543210");

/// n-grams of [`PROSE`] owned by globex, with `n` words.
fn ngram_detectors(n: usize) -> Arc<Detectors> {
    let mut idx = Index::default();
    idx.record(fingerprints(PROSE, &HASH_KEY, n), "globex");
    Arc::new(Detectors {
        ngram: Some(NgramConfig { n, ..NgramConfig::new(HASH_KEY, Arc::new(idx)) }),
        ..Detectors::default()
    })
}

fn acme() -> ScanContext {
    ScanContext::new("acme")
}

/// Cyrillic (and Greek) look-alikes of ASCII letters.
fn homoglyph(c: char) -> Option<char> {
    let pairs = [
        ('a', 'а'),
        ('c', 'с'),
        ('e', 'е'),
        ('o', 'о'),
        ('p', 'р'),
        ('x', 'х'),
        ('y', 'у'),
        ('i', 'і'),
        ('s', 'ѕ'),
        ('A', 'А'),
        ('B', 'В'),
        ('C', 'С'),
        ('E', 'Е'),
        ('H', 'Н'),
        ('K', 'К'),
        ('M', 'М'),
        ('O', 'О'),
        ('P', 'Р'),
        ('T', 'Т'),
        ('X', 'Х'),
        ('I', 'І'),
        ('N', 'Ν'),
    ];
    pairs.iter().find(|p| p.0 == c).map(|p| p.1)
}

fn full_width(c: char) -> char {
    match c {
        '!'..='~' => char::from_u32(c as u32 - 0x21 + 0xFF01).unwrap_or(c),
        _ => c,
    }
}

/// Every char but the first of each word replaced by its look-alike where one exists (a
/// word wholly in another script reads as that script in the rules view).
fn cyrillic(s: &str) -> String {
    let mut out = String::new();
    let mut prev_alnum = false;
    for c in s.chars() {
        out.push(if prev_alnum { homoglyph(c).unwrap_or(c) } else { c });
        prev_alnum = c.is_alphanumeric();
    }
    out
}

fn interleave(s: &str, with: &str) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && c.is_alphanumeric() {
            out.push_str(with);
        }
        out.push(c);
    }
    out
}

/// The disguises of a secret or canary `s`, by name.
fn disguises(s: &str) -> Vec<(&'static str, String)> {
    vec![
        ("cyrillic", cyrillic(s)),
        ("full-width", s.chars().map(full_width).collect()),
        ("zero-width", interleave(s, "\u{200B}")),
        ("soft hyphen", interleave(s, "\u{AD}")),
        ("bidi controls", interleave(s, "\u{202E}\u{202C}")),
        ("word joiner and variation selector", interleave(s, "\u{2060}\u{FE0F}")),
        // "ASCII smuggling": every character as its invisible tag character.
        ("tag characters", s.chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap_or(c)).collect()),
    ]
}

/// Streams `text` one char at a time (JSON mode on request); released text and outcome.
fn stream_chars(
    rules: &Arc<Ruleset>,
    ctx: &ScanContext,
    det: &Arc<Detectors>,
    text: &str,
    json: bool,
) -> (String, bool, Vec<Finding>) {
    let mut s = StreamScanner::new(rules.clone(), ctx.clone(), det.clone());
    if json {
        s = s.decode_json_strings();
    }
    let out = stream_through(s, text, &char_cuts(text));
    (out.released, out.blocked, out.findings)
}

#[test]
fn disguised_secrets_are_blocked_and_never_released() {
    let rules = fixture_rules();
    let none = Arc::new(Detectors::default());
    for (name, key) in disguises(KEY) {
        let text = format!("Here you go: {key} enjoy");
        let whole = rules.scan_with(&text, &acme(), &none);
        assert!(
            whole.iter().any(|f| f.rule_id == "demo-block-key" && f.action == Action::Block),
            "{name}: {text:?} {whole:?}"
        );
        let (released, blocked, _) = stream_chars(&rules, &acme(), &none, &text, false);
        assert!(blocked, "{name}");
        assert_eq!(released, "Here you go: ", "{name}");
        check_chunking(&rules, &acme(), &none, &text, &char_cuts(&text));
    }
}

#[test]
fn a_disguised_password_is_redacted_over_its_raw_span() {
    let rules = fixture_rules();
    let none = Arc::new(Detectors::default());
    for (name, secret) in disguises("S3cr3t!Pa55w0rd") {
        let text = format!("{} ok", PASSWORD.replace("S3cr3t!Pa55w0rd", &secret));
        let (released, blocked, _) = stream_chars(&rules, &acme(), &none, &text, false);
        assert!(!blocked, "{name}");
        assert_eq!(released, "db_password = '[REDACTED:demo-redact-password]' ok", "{name}: {text:?}");
        check_chunking(&rules, &acme(), &none, &text, &char_cuts(&text));
    }
    // The keyword disguised, too.
    let text = "db_раѕѕword = 'S3cr3t!Pa55w0rd' ok";
    assert_eq!(
        stream_chars(&rules, &acme(), &none, text, false).0,
        "db_раѕѕword = '[REDACTED:demo-redact-password]' ok"
    );
}

#[test]
fn disguised_and_upper_cased_canaries_are_blocked() {
    let rules = fixture_rules();
    let none = Arc::new(Detectors::default());
    let mut variants = disguises(CANARY);
    variants.push(("upper case", CANARY.to_uppercase()));
    variants.push(("lower case", CANARY.to_lowercase()));
    for (name, canary) in variants {
        let text = format!("x {canary} y");
        let (released, blocked, found) = stream_chars(&rules, &acme(), &none, &text, false);
        assert!(blocked && found.iter().any(|f| f.kind == DetectorKind::Canary), "{name}: {text:?}");
        assert_eq!(released, "x ", "{name}");
        // The owner may see its own canary, however written.
        assert!(!stream_chars(&rules, &ScanContext::new("globex"), &none, &text, false).1, "{name}");
        check_chunking(&rules, &acme(), &none, &text, &char_cuts(&text));
    }
}

#[test]
fn disguised_foreign_prose_is_blocked() {
    let rules = fixture_rules();
    let det = ngram_detectors(5);
    let words: Vec<&str> = PROSE.split(' ').collect();
    let mut variants: Vec<(&str, String)> = disguises(PROSE);
    variants.push(("all look-alikes", PROSE.chars().map(|c| homoglyph(c).unwrap_or(c)).collect()));
    variants.push(("upper case", PROSE.to_uppercase()));
    variants.push(("full-width spaces", PROSE.replace(' ', "\u{3000}")));
    for sep in ["_", "-", ".", "/", "\\", "\\n", "\\u0020"] {
        variants.push(("joined", words.join(sep)));
    }
    for (name, prose) in variants {
        let text = format!("Sure. {prose} ok");
        let (released, blocked, _) = stream_chars(&rules, &acme(), &det, &text, false);
        assert!(blocked, "{name}: {text:?}");
        assert!(!released.contains("closes") && !released.contains("сlоѕеѕ"), "{name}: {released:?}");
        check_chunking(&rules, &acme(), &det, &text, &char_cuts(&text));
    }
}

/// A token no rule knows is its owner's in every disguise too, however many raw bytes its
/// characters take (a full-width or tag-character token is three or four times as long).
#[test]
fn a_disguised_token_is_still_its_owners() {
    let rules = fixture_rules();
    let token = "7Hq2Lx9Vb4Nz8Kc3Wd5Rf6Tg";
    let mut idx = Index::default();
    idx.record(firewall::token_fingerprints(&format!("relay id {token}"), &HASH_KEY), "globex");
    let det = Arc::new(Detectors { ngram: Some(NgramConfig::new(HASH_KEY, Arc::new(idx))), ..Detectors::default() });
    for (name, disguised) in disguises(token) {
        let text = format!("Use {disguised} now");
        let (released, blocked, found) = stream_chars(&rules, &acme(), &det, &text, false);
        assert!(blocked && found.iter().any(|f| f.rule_id == firewall::FOREIGN_TOKEN_RULE_ID), "{name}: {found:?}");
        assert_eq!(released, "Use ", "{name}");
        check_chunking(&rules, &acme(), &det, &text, &char_cuts(&text));
        let own = rules.scan_with(&text, &ScanContext::new("globex"), &det);
        assert!(own.iter().all(|f| f.action != Action::Block), "{name}: {own:?}");
    }
}

#[test]
fn json_escapes_in_tool_call_arguments_are_read_decoded() {
    let rules = fixture_rules();
    let det = ngram_detectors(5);
    let escaped = |s: &str| {
        s.chars()
            .map(|c| if c.is_ascii_alphanumeric() { format!("\\u{:04x}", c as u32) } else { c.to_string() })
            .collect::<String>()
    };
    let cases = [
        ("secret with \\u00XX", format!(r#"{{"k":"use {}"}}"#, escaped(KEY))),
        (
            "secret split by escapes",
            format!(r#"{{"k":"{}\u00{}"}}"#, &KEY[..10], &format!("{:02x}{}", KEY.as_bytes()[10], &KEY[11..])),
        ),
        ("canary with \\u00XX", format!(r#"{{"k":"{}"}}"#, escaped(CANARY))),
        ("prose with \\n", format!(r#"{{"note":"{}"}}"#, PROSE.replace(' ', "\\n"))),
        ("prose with \\u00XX inside words", format!(r#"{{"note":"{}"}}"#, PROSE.replace('e', "\\u0065"))),
        ("secret escaped twice", format!(r#"{{"k":"{}"}}"#, escaped(KEY).replace('\\', "\\\\"))),
    ];
    for (name, json) in &cases[..5] {
        let (released, blocked, found) = stream_chars(&rules, &acme(), &det, json, true);
        assert!(blocked, "{name}: {json} {found:?}");
        assert!(json.starts_with(&released), "released text is the raw JSON: {released:?}");
        // Without JSON mode the escapes hide the secrets and canaries (not the prose: written
        // escapes separate words).
        if !name.starts_with("prose") {
            assert!(!stream_chars(&rules, &acme(), &det, json, false).1, "{name}");
        }
    }
    // An escaped backslash decodes to a written escape, which is not decoded again.
    assert!(!stream_chars(&rules, &acme(), &det, &cases[5].1, true).1);
}

#[test]
fn a_foreign_run_reaches_the_client_for_at_most_three_words() {
    let rules = fixture_rules();
    let sentence = "our quarterly revenue forecast for the northern region rose by twelve percent this year";
    let mut idx = Index::default();
    idx.record(fingerprints(sentence, &HASH_KEY, 8), "globex");
    let det = Arc::new(Detectors { ngram: Some(NgramConfig::new(HASH_KEY, Arc::new(idx))), ..Detectors::default() });
    let text = format!("Here is what I found: {sentence}. Thanks.");
    let foreign_words = |released: &str| {
        let tail = released.strip_prefix("Here is what I found: ").unwrap_or("");
        tail.split_whitespace().count()
    };
    // Word by word, as a model streams.
    let mut s = StreamScanner::new(rules.clone(), acme(), det.clone());
    let (mut out, mut blocked) = (String::new(), false);
    for piece in text.split_inclusive(' ') {
        let step = s.push(piece);
        out += &step.release;
        blocked |= step.action == Action::Block;
    }
    out += &s.finish().release;
    assert!(blocked);
    assert!(out.starts_with("Here is what I found: "), "{out:?}");
    assert!(foreign_words(&out) <= 3, "{out:?}");
    // In one chunk nothing of it is released.
    let whole = stream(&rules, &acme(), &det, &text, &[]);
    assert!(whole.blocked && whole.released == "Here is what I found: ", "{:?}", whole.released);
    // Char by char, the same bound.
    let (chars, blocked, _) = stream_chars(&rules, &acme(), &det, &text, false);
    assert!(blocked && foreign_words(&chars) <= 3, "{chars:?}");
    // A lead that the text does not follow is released: clean prose flows.
    let diverging = "our quarterly revenue forecast looks fine to me and nothing else matters here at all";
    let (out, blocked, _) = stream_chars(&rules, &acme(), &det, diverging, false);
    assert!(!blocked && out == diverging);
}

#[test]
fn model_native_text_is_never_foreign() {
    let rules = fixture_rules();
    let mut idx = Index::default();
    idx.record(fingerprints(PROSE, &HASH_KEY, 5), "globex");
    idx.0.values_mut().for_each(|o| o.model_native = true);
    let det = Arc::new(Detectors {
        ngram: Some(NgramConfig { n: 5, ..NgramConfig::new(HASH_KEY, Arc::new(idx)) }),
        ..Detectors::default()
    });
    let (out, blocked, _) = stream_chars(&rules, &acme(), &det, PROSE, false);
    assert!(!blocked && out == PROSE);
}

#[test]
fn secrets_are_attributed_to_their_owner() {
    let rules = fixture_rules();
    let mut idx = Index::default();
    idx.record(secret_fingerprints(&rules, &format!("my key is {KEY}"), &HASH_KEY), "acme");
    let pw = "db_password = 'Gl0bex!Secret99'";
    idx.record(secret_fingerprints(&rules, pw, &HASH_KEY), "globex");
    let det = Arc::new(Detectors {
        secrets: Some(SecretOwnership { key: HASH_KEY, owners: Arc::new(idx) }),
        ..Detectors::default()
    });

    // acme's own key, even disguised: logged, released.
    for text in [format!("k {KEY} ok"), format!("k {} ok", cyrillic(KEY))] {
        let (out, blocked, found) = stream_chars(&rules, &acme(), &det, &text, false);
        assert!(!blocked && out == text, "{out:?}");
        assert!(found.iter().any(|f| f.detail == Detail::Own && f.action == Action::Log), "{found:?}");
        check_chunking(&rules, &acme(), &det, &text, &char_cuts(&text));
    }
    // The same key in globex's response: its rule blocks (unknown owner to globex is foreign).
    let text = format!("k {KEY} ok");
    let (out, blocked, found) = stream_chars(&rules, &ScanContext::new("globex"), &det, &text, false);
    assert!(blocked && out == "k ");
    assert!(found.iter().any(|f| matches!(&f.detail, Detail::Foreign { owners, .. } if owners == &["acme"])));
    // globex's password (a redact rule) in acme's response blocks; truncated too.
    for echo in [pw.to_string(), "db_password = 'Gl0bex!Secr".to_string()] {
        let text = format!("{echo} ok");
        let (out, blocked, found) = stream_chars(&rules, &acme(), &det, &text, false);
        assert!(blocked, "{text:?} {found:?}");
        // A block releases only what precedes the whole match.
        assert_eq!(out, "");
    }
    // An unknown password keeps its rule: redacted.
    let (out, blocked, _) = stream_chars(&rules, &acme(), &det, "db_password = 'Unkn0wn!Secret' ok", false);
    assert!(!blocked && out == "db_password = '[REDACTED:demo-redact-password]' ok");
    // An own secret redacted on request.
    let redact = ScanContext { own_secrets: Action::Redact, ..acme() };
    let (out, _, _) = stream_chars(&rules, &redact, &det, &format!("k {KEY} ok"), false);
    assert_eq!(out, "k [REDACTED:demo-block-key] ok");
    // One-shot agrees.
    let found = rules.scan_with(&format!("k {KEY} ok"), &acme(), &det);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].action, &found[0].detail), (Action::Log, &Detail::Own));
}

/// Pieces of planted text; each ends in a separator, so pieces never merge into one token.
/// No `allow_line` word: a disguised exemption does not exempt the raw text's match, which
/// blocks (the safe side) where the plain text would have been let through.
const PIECES: &[&str] = &[
    "hello ",
    "world. ",
    "Привет, мир! ",
    "password = 'S3cr3t!Pa55w0rd' ",
    "dbk_Q2w3E4r5T6y7U8i9O0pA ",
    "GLOBEX-CANARY-51d0e2 ",
    "the merger with initech closes ",
    "on friday at noon sharp ",
    "\n",
    "token ",
    "рос сор ",
    "blob:QUJDREVGR0hJSktMTU5PUFFSU1RV ",
];

/// A disguise applied to one piece, char by char.
#[derive(Debug, Clone)]
struct Disguise {
    // per char: 0 none, 1 look-alike, 2 full-width, 3 upper case (canary only), 4 lower case
    subst: Vec<u8>,
    // per char: an invisible character inserted before it
    insert: Vec<Option<char>>,
}

fn disguise(piece: &str, d: &Disguise) -> String {
    let canary = piece.starts_with("GLOBEX");
    let mut out = String::new();
    let mut first_of_run = true;
    for (i, c) in piece.chars().enumerate() {
        if let Some(z) = d.insert.get(i).copied().flatten().filter(|_| i > 0) {
            out.push(z);
        }
        let kind = d.subst.get(i).copied().unwrap_or(0);
        let replaced = match kind {
            // The first letter of a run stays ASCII: a run wholly in another script reads as
            // that script, by design.
            1 if !first_of_run => homoglyph(c).unwrap_or(c),
            2 => full_width(c),
            3 if canary => c.to_ascii_uppercase(),
            4 if canary => c.to_ascii_lowercase(),
            _ => c,
        };
        first_of_run = !c.is_alphanumeric();
        out.push(replaced);
    }
    out
}

fn disguise_strategy() -> impl Strategy<Value = Disguise> {
    let invisible = prop::sample::select(vec![
        '\u{200B}', '\u{200D}', '\u{AD}', '\u{2060}', '\u{FEFF}', '\u{202E}', '\u{2066}', '\u{FE0F}',
    ]);
    (prop::collection::vec(0u8..5, 48), prop::collection::vec(prop::option::weighted(0.1, invisible), 48))
        .prop_map(|(subst, insert)| Disguise { subst, insert })
}

fn all_detectors() -> Arc<Detectors> {
    let mut idx = Index::default();
    idx.record(fingerprints(PROSE, &HASH_KEY, 5), "globex");
    Arc::new(Detectors {
        ngram: Some(NgramConfig { n: 5, ..NgramConfig::new(HASH_KEY, Arc::new(idx)) }),
        ..Detectors::default()
    })
}

fn blocks(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.action == Action::Block)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any canonical-equivalent variant of a text is blocked exactly when the text is, and
    /// its stream agrees with one-shot scanning, one char at a time and at random cuts.
    #[test]
    fn disguised_variants_are_blocked_exactly_when_the_original_is(
        picks in prop::collection::vec((0..PIECES.len(), disguise_strategy()), 0..10),
        seeds in prop::collection::vec(any::<usize>(), 0..30),
    ) {
        let rules = fixture_rules();
        let det = all_detectors();
        let original: String = picks.iter().map(|(i, _)| PIECES[*i]).collect();
        let variant: String = picks.iter().map(|(i, d)| disguise(PIECES[*i], d)).collect();
        let plain = rules.scan_with(&original, &acme(), &det);
        let disguised = rules.scan_with(&variant, &acme(), &det);
        prop_assert_eq!(blocks(&plain), blocks(&disguised), "{:?} vs {:?}: {:?}", original, variant, disguised);
        let bounds = char_cuts(&variant);
        let mut cuts: Vec<usize> = if bounds.is_empty() { vec![] } else { seeds.iter().map(|s| bounds[s % bounds.len()]).collect() };
        cuts.sort_unstable();
        cuts.dedup();
        check_chunking(&rules, &acme(), &det, &variant, &cuts);
        check_chunking(&rules, &acme(), &det, &variant, &bounds);
    }
}

#[test]
fn disguised_texts_stream_like_one_shot_at_every_split() {
    let rules = fixture_rules();
    let det = all_detectors();
    let texts = [
        format!("k {} and ｄｂｋ_Ｑ2w3E4r5T6y7U8i9O0pA\u{200B}", cyrillic(KEY)),
        format!("{} \u{AD}{}", cyrillic(CANARY), cyrillic(PASSWORD)),
        format!("Sure. {} ok", cyrillic(PROSE)),
        "раѕѕword = 'S3сr3t!Pa55w0rd' рос".to_string(),
        format!("a\u{200B}b {}", "а".repeat(300)),
    ];
    for text in &texts {
        check_chunking(&rules, &acme(), &det, text, &[]);
        check_chunking(&rules, &acme(), &det, text, &char_cuts(text));
        for (i, _) in text.char_indices().skip(1) {
            check_chunking(&rules, &acme(), &det, text, &[i]);
        }
    }
}
