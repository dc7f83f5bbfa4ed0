//! Encoded leaks: another tenant's secret, canary, token or paragraph written in base64,
//! hex, binary, percent-encoding, character codes, Morse code, Jetty's OBF, in groups or
//! lines, spelled out, backwards or in ROT13 is blocked as if written plainly, through two layers; the
//! responding tenant's own data comes back; keys, hashes and binary blobs in honest answers
//! stay quiet; and a stream holds an encoded run until it is judged, agreeing with one-shot
//! scanning for any chunking.

mod common;

use std::sync::Arc;

use common::*;
use firewall::{
    fingerprints_and_tokens, secret_fingerprints, Action, DecodeConfig, Detail, DetectorKind, Detectors, Encoding,
    Finding, NgramConfig, NgramKey, Rewrite, ScanContext, SecretOwnership,
};
use proptest::prelude::*;

const KEY: NgramKey = NgramKey(*b"0123456789abcdef");
/// A value no rule knows: globex's only through the token check.
const TOKEN: &str = "7Hq2Lx9Vb4Nz8Kc3Wm5Rt1";
const PASSWORD: &str = "db_password = 'Gl0bex!Secret99'";
const PROSE: &str = "the merger with initech closes on friday at noon sharp";
const CANARY: &str = "GLOBEX-CANARY-51d0e2";

/// Everything on (`decode`: reading encoded and rewritten text, as `read_encoded` does in the
/// gateway), with globex owning a password, a token and a paragraph.
fn detectors(decode: bool) -> Arc<Detectors> {
    let rules = fixture_rules();
    let mut idx = Index::default();
    let sent = format!("{PASSWORD}\nrelay id {TOKEN}\n{PROSE}");
    let (ngrams, tokens) = fingerprints_and_tokens(&sent, &KEY, 6);
    let secrets = secret_fingerprints(&rules, &sent, &KEY);
    idx.record(ngrams.into_iter().chain(tokens).chain(secrets), "globex");
    let idx = Arc::new(idx);
    Arc::new(Detectors {
        ngram: Some(NgramConfig { n: 6, rewrites: decode, ..NgramConfig::new(KEY, idx.clone()) }),
        secrets: Some(SecretOwnership { key: KEY, owners: idx }),
        decode: decode.then(DecodeConfig::default),
        ..Detectors::default()
    })
}

/// RFC 4648 base64 of `s` in `alphabet`, padded or not.
fn base64_with(s: &str, alphabet: &[u8; 64], pad: bool) -> String {
    let mut out = String::new();
    for chunk in s.as_bytes().chunks(3) {
        let n = u32::from(chunk[0]) << 16
            | u32::from(*chunk.get(1).unwrap_or(&0)) << 8
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..=chunk.len() {
            out.push(char::from(alphabet[(n >> (18 - 6 * k) & 63) as usize]));
        }
        if pad {
            out.push_str(&"=".repeat(3 - chunk.len()));
        }
    }
    out
}

fn b64(s: &str) -> String {
    base64_with(s, b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", true)
}

fn b64url(s: &str) -> String {
    base64_with(s, b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", false)
}

/// `s` cut into groups of `n` characters joined by `sep`.
fn groups(s: &str, n: usize, sep: &str) -> String {
    s.as_bytes().chunks(n).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join(sep)
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn percent(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// ASCII `plain` as Jetty's `Password.obfuscate` writes it (without its `OBF:`): each byte `b`
/// with its mirror `m` as four base-36 digits of `(127 + b + m) * 256 + (127 + b - m)`.
fn jetty_obf(plain: &str) -> String {
    let b = plain.as_bytes();
    let mut out = String::new();
    for (i, &c) in b.iter().enumerate() {
        let m = u32::from(b[b.len() - 1 - i]);
        let mut n = (127 + u32::from(c) + m) * 256 + (127 + u32::from(c) - m);
        let mut digits = Vec::new();
        while n > 0 {
            digits.push(char::from_digit(n % 36, 36).unwrap_or('0'));
            n /= 36;
        }
        digits.resize(4, '0');
        out.extend(digits.iter().rev());
    }
    out
}

/// Every way a response may write `plain`, named.
fn encodings(plain: &str) -> Vec<(&'static str, String)> {
    let mut forms = vec![
        ("base64", b64(plain)),
        ("base64url", b64url(plain)),
        ("hex", hex(plain)),
        ("HEX", hex(plain).to_uppercase()),
        ("percent", percent(plain)),
        ("base64 of JSON holding base64", b64(&format!("{{\"data\":\"{}\"}}", b64(plain)))),
        ("hex of base64", hex(&b64(plain))),
        // Followed by a word of the same length, which joins the groups.
        ("base64 in groups of four", groups(&b64(plain), 4, " ") + " done"),
        ("base64 wrapped at 12", groups(&b64(plain), 12, "\n")),
        ("hex in groups of four", groups(&hex(plain), 4, " ")),
        ("spelled out", plain.chars().map(|c| c.to_string()).collect::<Vec<_>>().join(" ")),
        ("hex bytes", plain.bytes().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")),
        ("a C array", format!("{{{}}}", plain.bytes().map(|b| format!("0x{b:02X}")).collect::<Vec<_>>().join(", "))),
        ("a byte string", format!("b'{}'", plain.bytes().map(|b| format!("\\x{b:02x}")).collect::<String>())),
        ("character codes", format!("{:?}", plain.bytes().collect::<Vec<_>>())),
        (
            "character codes without spaces",
            format!("[{}]", plain.bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(",")),
        ),
        ("a C array without spaces", plain.bytes().map(|b| format!("0x{b:02x}")).collect::<Vec<_>>().join(",")),
        ("hex bytes joined by dashes", plain.bytes().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join("-")),
        ("binary", plain.bytes().map(|b| format!("{b:08b}")).collect::<Vec<_>>().join(" ")),
        ("binary run", plain.bytes().map(|b| format!("{b:08b}")).collect()),
        ("Jetty's OBF", format!("OBF:{}", jetty_obf(plain))),
    ];
    // A list of quoted characters, or characters joined by a separator, cannot hold a quote,
    // a space or the separator unambiguously.
    if !plain.contains([' ', '\'', '"', '-']) {
        forms.push(("a list of characters", format!("{:?}", plain.chars().map(|c| c.to_string()).collect::<Vec<_>>())));
        forms.push(("dashed", plain.chars().map(|c| c.to_string()).collect::<Vec<_>>().join("-")));
    }
    forms
}

fn acme() -> ScanContext {
    ScanContext::new("acme")
}

fn blocked_by(findings: &[Finding], kind: DetectorKind) -> bool {
    findings.iter().any(|f| f.action == Action::Block && f.kind == kind && f.encoding.is_some())
}

#[test]
fn another_tenants_data_is_blocked_in_every_encoding() {
    let rules = fixture_rules();
    let on = detectors(true);
    let off = detectors(false);
    let leaks: [(&str, &str, DetectorKind); 4] = [
        ("password", PASSWORD, DetectorKind::Secret),
        ("token", TOKEN, DetectorKind::Ngram),
        ("paragraph", PROSE, DetectorKind::Ngram),
        ("canary", CANARY, DetectorKind::Canary),
    ];
    for (what, plain, kind) in leaks {
        for (how, encoded) in encodings(plain) {
            let text = format!("Here it is: {encoded} as asked.");
            let found = rules.scan_with(&text, &acme(), &on);
            assert!(blocked_by(&found, kind), "{what} in {how}: {text:?} {found:?}");
            let f = found.iter().find(|f| f.action == Action::Block).map(|f| (f.match_start, f.match_end));
            let (a, b) = f.unwrap_or_default();
            assert!(a >= "Here it is: ".len() && b <= text.len() - " as asked.".len(), "{what} in {how}: span");
            // The test means something: without decoding, the leak goes through.
            let plain_scan = rules.scan_with(&text, &acme(), &off);
            assert!(plain_scan.iter().all(|f| f.action != Action::Block), "{what} in {how} without decoding");
            check_chunking(&rules, &acme(), &on, &text, &char_cuts(&text));
        }
    }
}

/// A list in brackets is a value of its own: written twice, or after another list, the
/// token's character codes were read as one list with their neighbour, a longer word no
/// token matched, and nothing was blocked (found by `encoded_texts_stream_like_one_shot`).
#[test]
fn a_token_in_brackets_is_blocked_next_to_other_lists() {
    let (rules, det) = (fixture_rules(), detectors(true));
    let other = format!("[{}]", "Hello, world".bytes().map(|b| b.to_string()).collect::<Vec<_>>().join(","));
    for (name, form) in encodings(TOKEN).into_iter().filter(|(_, f)| f.starts_with(['[', '{'])) {
        for (layout, text) in [
            ("written twice", format!("{form}\n{form}")),
            ("after another list", format!("{other}\n{form}")),
            ("before another list", format!("{form} {other}")),
        ] {
            let found = rules.scan_with(&text, &acme(), &det);
            let first = found.iter().filter(|f| f.action == Action::Block).min_by_key(|f| f.match_start);
            let at = text.find(&form).unwrap_or(0);
            assert!(
                first.is_some_and(|f| f.match_start >= at && f.match_end <= at + form.len()),
                "{name}, {layout}: {found:?}"
            );
        }
    }
}

#[test]
fn the_finding_names_the_encoding_the_client_sees_and_the_owner() {
    let rules = fixture_rules();
    let text = format!("token: {}", hex(&b64(TOKEN)));
    let found = rules.scan_with(&text, &acme(), &detectors(true));
    let f = found.iter().find(|f| f.action == Action::Block);
    assert!(f.is_some(), "{found:?}");
    let Some(f) = f else { return };
    assert_eq!(f.encoding, Some(Encoding::Hex));
    assert_eq!(f.rule_id, firewall::FOREIGN_TOKEN_RULE_ID);
    assert!(matches!(&f.detail, Detail::Foreign { owners, .. } if owners == &["globex"]), "{f:?}");
    assert!(!f.excerpt.contains(&TOKEN[4..]), "the excerpt is masked: {}", f.excerpt);
    let json = serde_json::to_value(f).unwrap_or_default();
    assert_eq!(json["encoding"], "hex");
}

#[test]
fn a_tenants_own_data_comes_back_encoded() {
    let rules = fixture_rules();
    let det = detectors(true);
    for (_, encoded) in encodings(PROSE).into_iter().chain(encodings(PASSWORD)).chain(encodings(TOKEN)) {
        let text = format!("Encoded: {encoded}");
        let found = rules.scan_with(&text, &ScanContext::new("globex"), &det);
        assert!(found.iter().all(|f| f.action != Action::Block), "{text:?} {found:?}");
    }
}

#[test]
fn an_encoded_secret_is_held_until_judged_and_never_released() {
    let rules = fixture_rules();
    let det = detectors(true);
    let encoded = b64(&format!("user=svc {PASSWORD}"));
    let text = format!("Sure: {encoded}\n");
    for cuts in [char_cuts(&text), vec![], vec![10, 11, 30]] {
        let s = stream(&rules, &acme(), &det, &text, &cuts);
        assert!(s.blocked, "{cuts:?}");
        // What precedes the value may go out (it decodes to `user=svc db_password = '`);
        // not one character that encodes the value.
        let value_at = encoded.len() * "user=svc db_password = '".len() / (encoded.len() / 4 * 3);
        assert!(s.released.len() <= "Sure: ".len() + value_at, "{:?}", s.released);
        assert!(s.released.starts_with("Sure: "));
    }
}

#[test]
fn honest_encoded_text_keys_and_blobs_stay_quiet() {
    let rules = fixture_rules();
    let det = detectors(true);
    let texts = [
        // A 1x1 PNG, a SHA-256, a UUID, an AWS example key, a JWT of jwt.io's example.
        "![px](data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==)".to_string(),
        "sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".to_string(),
        "id 123e4567-e89b-12d3-a456-426614174000 AKIAIOSFODNN7EXAMPLE".to_string(),
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c".to_string(),
        // Base64 of ordinary text, and a URL with escapes.
        format!("echo {} | base64 -d", b64("Hello from the deployment script, all good.")),
        "https://example.com/search?q=caf%C3%A9%20au%20lait&lang=fr".to_string(),
    ];
    for text in &texts {
        let found = rules.scan_with(text, &acme(), &det);
        assert!(found.is_empty(), "{text:?}: {found:?}");
        check_chunking(&rules, &acme(), &det, text, &char_cuts(text));
    }
}

#[test]
fn long_runs_are_judged_a_segment_at_a_time_in_step_with_one_shot() {
    let rules = fixture_rules();
    let det = detectors(true);
    // Padding of whole quanta puts the leak past the first 4,096-character segment.
    let filler = "All quiet on the cluster today. ".repeat(120);
    let encoded = b64(&format!("{filler}{PROSE}"));
    assert!(encoded.len() > 4096);
    let text = format!("blob {encoded} end");
    let found = rules.scan_with(&text, &acme(), &det);
    assert!(blocked_by(&found, DetectorKind::Ngram), "{found:?}");
    let cuts: Vec<usize> = (1..text.len()).step_by(97).collect();
    check_chunking(&rules, &acme(), &det, &text, &cuts);
    let s = stream(&rules, &acme(), &det, &text, &cuts);
    assert!(s.max_held <= 4096 + 97, "held {} bytes", s.max_held);
}

/// Pieces of responses, each a word or more: plain and encoded leaks, honest text and
/// blobs, and the characters that end or split runs. They are joined by whitespace: with
/// n-grams on, a block in the middle of a word releases only up to the word's start, short
/// of what one-shot scanning cuts at (the stream's word hold, before this detector).
fn pieces() -> Vec<String> {
    let mut out: Vec<String> = ["Sure,", "the merger", "with initech", "\n", "=", "\"", "token", "%", "ok."]
        .iter()
        .map(|s| s.to_string())
        .collect();
    out.push(b64("Hello from the deployment script."));
    out.push("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into());
    for plain in [TOKEN, PASSWORD, PROSE, CANARY] {
        out.extend(encodings(plain).into_iter().map(|(_, e)| e));
    }
    for plain in [TOKEN, PROSE, CANARY] {
        out.extend(Rewrite::ALL.map(|r| r.apply(plain)));
        out.push(morse(plain));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Any mix of encoded leaks and honest text streams exactly like one-shot scanning, at
    /// random cuts and one character at a time.
    #[test]
    fn encoded_texts_stream_like_one_shot(
        picks in prop::collection::vec(0usize..64, 1..8),
        seeds in prop::collection::vec(any::<usize>(), 0..24),
    ) {
        let rules = fixture_rules();
        let det = detectors(true);
        let all = pieces();
        let words: Vec<&str> = picks.iter().map(|&i| all[i % all.len()].as_str()).collect();
        let text = words.join(if seeds.len() % 2 == 0 { " " } else { "\n" });
        let bounds = char_cuts(&text);
        let mut cuts: Vec<usize> =
            if bounds.is_empty() { vec![] } else { seeds.iter().map(|s| bounds[s % bounds.len()]).collect() };
        cuts.sort_unstable();
        cuts.dedup();
        check_chunking(&rules, &acme(), &det, &text, &cuts);
        check_chunking(&rules, &acme(), &det, &text, &bounds);
    }
}

/// "Spell the id in reverse": a token written backwards is still its owner's, plainly or
/// in any encoding; its owner gets it back.
#[test]
fn a_token_written_backwards_is_blocked() {
    let rules = fixture_rules();
    let det = detectors(true);
    let backwards: String = TOKEN.chars().rev().collect();
    for text in [format!("id: {backwards} ok"), format!("id: {} ok", b64(&backwards))] {
        let found = rules.scan_with(&text, &acme(), &det);
        let f = found.iter().find(|f| f.action == Action::Block);
        assert!(f.is_some_and(|f| f.rule_id == firewall::FOREIGN_TOKEN_RULE_ID), "{text}: {found:?}");
        check_chunking(&rules, &acme(), &det, &text, &char_cuts(&text));
        let own = rules.scan_with(&text, &ScanContext::new("globex"), &det);
        assert!(own.iter().all(|f| f.action != Action::Block), "{text}: {own:?}");
    }
}

/// globex's password value written backwards or in ROT13 where a password goes.
fn rewritten_password(r: Rewrite) -> String {
    format!("db_password = '{}'", r.apply("Gl0bex!Secret99"))
}

/// "Answer backwards", "reply in ROT13" (or Atbash, or Caesar's cipher): globex's token,
/// paragraph and canary rewritten whole, and its password value rewritten in place, are
/// blocked for acme, and the finding names the rewriting (or the encoding around it); globex
/// gets every one back.
#[test]
fn another_tenants_data_is_blocked_backwards_and_in_ciphers() {
    let rules = fixture_rules();
    let on = detectors(true);
    let off = detectors(false);
    let mut leaks: Vec<(String, DetectorKind, Encoding)> = Vec::new();
    for r in Rewrite::ALL {
        for (plain, kind) in
            [(TOKEN, DetectorKind::Ngram), (PROSE, DetectorKind::Ngram), (CANARY, DetectorKind::Canary)]
        {
            leaks.push((r.apply(plain), kind, r.encoding()));
        }
        leaks.push((rewritten_password(r), DetectorKind::Secret, r.encoding()));
        leaks.push((b64(&r.apply(PROSE)), DetectorKind::Ngram, Encoding::Base64));
    }
    for (leak, kind, encoding) in leaks {
        let text = format!("Here it is: {leak} as asked.");
        let found = rules.scan_with(&text, &acme(), &on);
        let block = found.iter().find(|f| f.action == Action::Block && f.kind == kind);
        assert_eq!(block.and_then(|f| f.encoding), Some(encoding), "{text:?}: {found:?}");
        assert!(block.is_some_and(|f| matches!(&f.detail, Detail::Foreign { owners, .. } if owners == &["globex"])));
        check_chunking(&rules, &acme(), &on, &text, &char_cuts(&text));
        let own = rules.scan_with(&text, &ScanContext::new("globex"), &on);
        assert!(own.iter().all(|f| f.action != Action::Block), "{text:?}: {own:?}");
        // The test means something: read only as written, words and tokens go through.
        if kind == DetectorKind::Ngram {
            let plain_scan = rules.scan_with(&text, &acme(), &off);
            assert!(plain_scan.iter().all(|f| f.action != Action::Block), "{text:?} without rewrites");
        }
    }
}

/// Text written backwards finds another tenant's leads as plain text does, so a stream
/// gives out at most three words of a rewritten paragraph before it blocks.
#[test]
fn at_most_three_words_of_a_rewritten_paragraph_go_out() {
    let rules = fixture_rules();
    let det = detectors(true);
    for r in Rewrite::ALL {
        let text = format!("Sure: {} done", r.apply(PROSE));
        let s = stream(&rules, &acme(), &det, &text, &char_cuts(&text));
        assert!(s.blocked, "{r:?}");
        let words = s.released.strip_prefix("Sure:").map_or(0, |rest| rest.split_whitespace().count());
        assert!(words <= 3, "{r:?}: {:?}", s.released);
    }
}

/// Honest text in ROT13 or backwards, and rewritten keys and hashes, stay quiet.
#[test]
fn honest_rewritten_text_stays_quiet() {
    let rules = fixture_rules();
    let det = detectors(true);
    for plain in [
        "The deployment finished at noon and every health check passed on the first try.",
        "sha256 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 of nothing",
        "GLOBEX-CANARY is the name of the field, not a value",
    ] {
        for r in Rewrite::ALL {
            let text = r.apply(plain);
            let found = rules.scan_with(&text, &acme(), &det);
            assert!(found.is_empty(), "{text:?}: {found:?}");
        }
    }
}

/// `plain` in Morse code (letters, digits, `-` and spaces; words apart by ` / `), as a
/// model writes it: case is lost.
fn morse(plain: &str) -> String {
    const LETTERS: [&str; 26] = [
        ".-", "-...", "-.-.", "-..", ".", "..-.", "--.", "....", "..", ".---", "-.-", ".-..", "--", "-.", "---",
        ".--.", "--.-", ".-.", "...", "-", "..-", "...-", ".--", "-..-", "-.--", "--..",
    ];
    const DIGITS: [&str; 10] =
        ["-----", ".----", "..---", "...--", "....-", ".....", "-....", "--...", "---..", "----."];
    let letter = |c: char| match c.to_ascii_lowercase() {
        l @ 'a'..='z' => LETTERS[l as usize - 'a' as usize],
        d @ '0'..='9' => DIGITS[d as usize - '0' as usize],
        '-' => "-....-",
        _ => "/",
    };
    plain.chars().map(letter).collect::<Vec<_>>().join(" ")
}

/// "Answer in Morse code": globex's token, paragraph and canary are blocked for acme even
/// though Morse code has no case; globex gets them back.
#[test]
fn another_tenants_data_in_morse_code_is_blocked() {
    let rules = fixture_rules();
    let on = detectors(true);
    for (plain, kind) in [(TOKEN, DetectorKind::Ngram), (PROSE, DetectorKind::Ngram), (CANARY, DetectorKind::Canary)] {
        let text = format!("In Morse: {} (decode it yourself)", morse(plain));
        let found = rules.scan_with(&text, &acme(), &on);
        let block = found.iter().find(|f| f.action == Action::Block && f.kind == kind);
        assert_eq!(block.and_then(|f| f.encoding), Some(Encoding::Morse), "{text:?}: {found:?}");
        check_chunking(&rules, &acme(), &on, &text, &char_cuts(&text));
        let own = rules.scan_with(&text, &ScanContext::new("globex"), &on);
        assert!(own.iter().all(|f| f.action != Action::Block), "{text:?}: {own:?}");
        let off = rules.scan_with(&text, &acme(), &detectors(false));
        assert!(off.iter().all(|f| f.action != Action::Block), "{text:?} without decoding");
    }
}
