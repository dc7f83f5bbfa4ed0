//! One rule or canary: its on-disk shape ([`RawRule`], [`RawCanary`]) and its compiled,
//! validated form ([`Rule`], [`Canary`]).
//!
//! Invariants of a compiled [`Rule`]: its regex compiled under [`REGEX_SIZE_LIMIT`], cannot
//! match the empty string, its `secret_group` exists, its keywords are lowercase ASCII-folded
//! and non-empty, and `min_entropy` lies in 0..=8. Whether its samples pass is checked by the
//! loader (it needs the whole matching pipeline, which lives in `scan`).
//!
//! Matching semantics a rule author must know: a match counts only if one of the rule's
//! `keywords` occurs (ASCII case-insensitively) *inside the whole match*; then the secret
//! (the `secret_group`, or the whole match) must reach `min_entropy` bits per character and
//! must not be matched by any `allow` regex. Keeping keywords inside the match is what makes
//! a finding depend only on the text around it, so streaming agrees with one-shot scanning.
//!
//! The file's shape is in `raw`, validation and compiling in `compile`, the exemptions
//! (`allow`, `allow_line`, `allow_decoded`, `allow_repeated_user`) in `allow`.

mod allow;
mod compile;
mod forward;
mod raw;

use std::sync::Arc;

use regex_syntax::hir::Hir;

use crate::scan::secret_span::SecretSplit;

use crate::verdict::{Action, Severity};

#[cfg(test)]
use allow::allow_groups;
pub(crate) use allow::{line_start, AllowCache, AllowList, ALLOW_LINE_LOOKBACK};
pub use compile::RuleRegex;
#[cfg(test)]
pub(crate) use compile::{ascii_twin, compile_hir, compile_regex, Parsed};
pub(crate) use forward::ForwardCaches;
pub use raw::{RawCanary, RawRule, RuleAction, SecretGroup, MIN_CANARY_LEN};

/// Compiled-program size limit for every rule and allow regex (bytes).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// A validated secret rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub description: String,
    pub severity: Severity,
    pub action: Action,
    /// The pattern that runs (the ASCII twin of the one written: ASCII word boundaries,
    /// ASCII-only case folds), shared by every search of the rule. Shared by `Arc`, not
    /// cloned: a clone of a meta regex starts a pool of search caches of its own, and the
    /// lazy DFA states that checking the samples builds at load are worth keeping for
    /// the scans that follow.
    pub regex: RuleRegex,
    /// ASCII-lowercased keywords; empty = the rule runs on every text.
    pub keywords: Vec<String>,
    pub min_entropy: Option<f64>,
    /// The least score of the generic-secret judge ([`crate::Judge`]) for a match to
    /// count; None: the rule does not ask the judge.
    pub judge: Option<f32>,
    /// Exemptions by the secret alone: a secret that one of these patterns matches is no
    /// finding (see [`Rule::is_allowed`]).
    pub(crate) allow: Arc<AllowList>,
    /// Patterns that exempt a match by its line: searched in the text from the start of
    /// the match's line (at most `ALLOW_LINE_LOOKBACK` bytes before the match) to the
    /// match's end. They see what `allow` cannot: the name before a keyword
    /// (`NextToken` for a rule whose match starts at `token`), an ARN around it.
    pub(crate) allow_line: Arc<AllowList>,
    /// Whether a secret that repeats the user name right before it (`monit:monit`,
    /// `kamailio:kamailiorw`) is turned down by that context (see
    /// [`Rule::is_repeated_user`]).
    pub allow_repeated_user: bool,
    /// Exemptions by what a base64 secret says (`Authorization: Basic dXNlcjpwYXNz` is
    /// `user:pass`): searched in the secret's decoding when it decodes to text throughout
    /// (see [`Rule::is_allowed`]); a secret that does not is judged as written.
    pub(crate) allow_decoded: Arc<AllowList>,
    pub tags: Vec<String>,
    pub must_match: Vec<String>,
    pub must_not_match: Vec<String>,
}

impl Rule {
    /// The parsed pattern that runs (the regex's), for the streaming automaton and the
    /// searches near keywords.
    pub(crate) fn hir(&self) -> &Hir {
        self.regex.hir()
    }

    /// Capture index of the secret; 0 = the whole match.
    pub fn secret_group(&self) -> usize {
        self.regex.secret_group()
    }

    /// The group scans capture: `secret_group`, or 0 where that group always spans the
    /// whole match (it holds all of the pattern but zero-width assertions, as in
    /// `\b(eyJ…)`), so the match alone gives the secret and no capture search runs.
    pub(crate) fn scan_group(&self) -> usize {
        self.regex.scan_group()
    }

    /// Where the secret lies when the match alone tells: a pattern written
    /// `\b(SECRET)(?:[^…]|$)` or `NAME = (VALUE)…`, read without a capture search (see
    /// `scan::secret_span`).
    pub(crate) fn split(&self) -> Option<&SecretSplit> {
        self.regex.split()
    }
}

/// A validated canary table.
#[derive(Debug, Clone)]
pub struct Canary {
    pub id: String,
    pub owner: String,
    pub strings: Vec<String>,
}

/// A problem with one field of one rule: the key to point at and why.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub key: &'static str,
    pub reason: String,
}

fn field(key: &'static str, reason: impl Into<String>) -> FieldError {
    FieldError { key, reason: reason.into() }
}

/// Rule ids are kebab-case: lowercase ASCII letters and digits joined by single hyphens.
pub fn is_kebab(id: &str) -> bool {
    !id.is_empty()
        && id
            .split('-')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
}

/// Shannon entropy of `s` in bits per character.
///
/// Runs on every 64-character window of every response (the entropy detector) and on
/// every candidate secret: ASCII is counted in a table, other characters in a short list
/// (a hash map here cost ~6 % of the gateway's CPU per streamed chunk).
pub fn shannon_entropy(s: &str) -> f64 {
    let mut ascii = [0u32; 128];
    // Which ASCII characters occur: the sum visits only those, in ascending order (the
    // order a pass over the whole table takes), so a secret of 40 characters does not pay
    // for 128 entries.
    let mut present = [0u64; 2];
    let mut other: Vec<(char, u32)> = Vec::new();
    let mut count_ascii = |b: usize| {
        ascii[b] += 1;
        present[b >> 6] |= 1 << (b & 63);
    };
    let total = if s.is_ascii() {
        // Secrets and most windows: bytes are characters, nothing to decode.
        s.bytes().for_each(|b| count_ascii(usize::from(b)));
        u32::try_from(s.len()).unwrap_or(u32::MAX)
    } else {
        let mut total = 0u32;
        for c in s.chars() {
            total += 1;
            if c.is_ascii() {
                count_ascii(c as usize);
            } else if let Some(slot) = other.iter_mut().find(|(o, _)| *o == c) {
                slot.1 += 1;
            } else {
                other.push((c, 1));
            }
        }
        total
    };
    if total == 0 {
        return 0.0;
    }
    let n = f64::from(total);
    // Most characters of a secret share a handful of counts (1, 2, 3): each count's
    // logarithm is computed once, the same value the call would give each time.
    let mut logs = [f64::NAN; 16];
    let mut term = |k: u32| {
        let p = f64::from(k) / n;
        let log = match logs.get_mut(k as usize) {
            Some(l) if !l.is_nan() => *l,
            Some(l) => {
                *l = p.log2();
                *l
            }
            None => p.log2(),
        };
        -p * log
    };
    // From -0.0, as `Iterator::sum` starts: a one-character text's entropy stays -0.0.
    let mut sum = -0.0;
    for (half, mut bits) in present.into_iter().enumerate() {
        while bits != 0 {
            let b = 64 * half + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            sum += term(ascii[b]);
        }
    }
    for &(_, k) in &other {
        sum += term(k);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    /// The alternations judge every candidate as the patterns one by one do: on the
    /// default rules' samples (each whole, and each of its suffixes and prefixes), with
    /// case flags that must not leak from one pattern into the next.
    #[test]
    fn allow_groups_match_where_some_pattern_matches() {
        let one_by_one = |patterns: &[Regex], text: &str| patterns.iter().any(|re| re.is_match(text));
        // `\bfoo\b` is a Unicode word boundary: beside a non-ASCII letter the lazy DFA gives
        // up, and the answer comes from the NFA's PikeVM.
        let own = [
            "(?i)^abc".to_string(),
            "XYZ$".to_string(),
            "(?m)^x-".to_string(),
            r"\$\{".to_string(),
            r"\bfoo\b".to_string(),
        ];
        let compiled: Vec<Regex> = own.iter().filter_map(|p| compile_regex(p).ok()).collect();
        let groups = allow_groups(&own, &Default::default()).unwrap_or_default();
        assert_eq!(groups.len(), 2);
        for text in
            ["ABCd", "dabc", "xyz", "aXYZ", "XYZa", "q\nx-1", "a${b}", "${", "", "é${", "éfoo", "é foo é", "a foo"]
        {
            assert_eq!(groups.iter().any(|g| g.is_match(text)), one_by_one(&compiled, text), "{text:?}");
        }
        let rules = crate::Ruleset::builtin().map_err(|e| e.to_string());
        let Ok(rules) = rules else { return assert_eq!(rules.err(), None) };
        let mut judged = 0;
        for r in rules.rules.iter().filter(|r| !r.allow.patterns.is_empty()) {
            let compiled = r.allow.compiled();
            assert!(compiled.groups.is_some(), "{}: no alternations", r.id);
            for sample in r.must_match.iter().chain(&r.must_not_match) {
                let cuts = (0..=sample.len()).filter(|&i| sample.is_char_boundary(i));
                for text in cuts.flat_map(|i| [&sample[i..], &sample[..i]]) {
                    assert_eq!(r.is_allowed_as_written(text), one_by_one(&compiled.each, text), "{} on {text:?}", r.id);
                    judged += 1;
                }
            }
        }
        assert!(judged > 10_000, "{judged}");
    }

    #[test]
    fn entropy_is_bit_for_bit_the_plain_sum() {
        // The plain definition, a logarithm per character kind, in the same order; the
        // long string has a count past the memo (20 of one letter).
        let plain = |s: &str| -> f64 {
            if s.is_empty() {
                return 0.0;
            }
            let mut kinds: Vec<(char, u32)> = Vec::new();
            for c in s.chars() {
                match kinds.iter_mut().find(|(k, _)| *k == c) {
                    Some(slot) => slot.1 += 1,
                    None => kinds.push((c, 1)),
                }
            }
            let (ascii, other): (Vec<_>, Vec<_>) = kinds.into_iter().partition(|(c, _)| c.is_ascii());
            let mut ascii = ascii;
            ascii.sort_unstable();
            let n = f64::from(s.chars().count() as u32);
            ascii.iter().chain(&other).map(|(_, k)| f64::from(*k) / n).map(|p| -p * p.log2()).sum()
        };
        let long: String = (0..60).map(|i| if i % 3 == 0 { 'a' } else { char::from(b'b' + (i % 7) as u8) }).collect();
        for s in [
            "",
            "a",
            "aaaa",
            "abcdefgh",
            "Passw0rd!",
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "ключ-ключ-秘密🔑",
            long.as_str(),
        ] {
            assert_eq!(shannon_entropy(s).to_bits(), plain(s).to_bits(), "{s:?}");
        }
    }

    /// `r` compiled; a rule that does not compile fails the test.
    fn compiled(r: RawRule) -> Option<Rule> {
        let rule = r.compile();
        assert!(rule.is_ok(), "{rule:?}");
        rule.ok()
    }

    fn raw(regex: &str) -> RawRule {
        RawRule {
            id: "test-rule".into(),
            description: "d".into(),
            severity: Severity::High,
            action: RuleAction::Block,
            regex: regex.into(),
            secret_group: None,
            keywords: vec!["Tok".into()],
            min_entropy: None,
            judge: None,
            allow_lists: vec![],
            allow_line_lists: vec![],
            allow: vec![],
            allow_line: vec![],
            allow_repeated_user: false,
            allow_decoded_lists: vec![],
            allow_decoded: vec![],
            tags: vec![],
            must_match: vec![],
            must_not_match: vec![],
        }
    }

    #[test]
    fn allow_decoded_reads_what_a_base64_secret_says() {
        let mut r = raw(r"(?i:tok)=([A-Za-z0-9+/_=-]+)");
        r.allow_decoded = vec!["^[^:]*:pass$".into()];
        let Some(rule) = compiled(r) else { return };
        assert!(rule.is_allowed("dXNlcjpwYXNz"), "user:pass");
        assert!(rule.is_allowed("bG9naW46cGFzcw=="), "login:pass, padded");
        assert!(rule.is_allowed("bG9naW46cGFzcw"), "padding is optional");
        assert!(!rule.is_allowed("dXNlcjpUcTlXejRLdjdMeDI="), "user:Tq9Wz4Kv7Lx2 says something else");
        // Written, not decoded: the pattern reads only decodings.
        assert!(!rule.is_allowed("user:pass"));
        // What does not decode to text is judged as written: no exemption by accident.
        assert!(!rule.is_allowed("3q2-7w"), "bytes, not text");
        assert!(!rule.is_allowed("abcde"), "not base64 (5 characters)");
    }

    #[test]
    fn an_escaped_secret_is_judged_by_what_it_says_too() {
        let mut r = raw(r"(?i:tok)=([^\s@]+)");
        r.allow = vec!["(?i)^p@ssw[o0]rd$".into()];
        let Some(rule) = compiled(r) else { return };
        assert!(rule.is_allowed("p@ssword"));
        assert!(rule.is_allowed("p%40ssword"), "the same password inside a URL");
        assert!(rule.is_allowed("P%40ssw%30rd"));
        assert!(rule.is_allowed("p\\u0040ssword"), "the same password in JSON's escapes");
        assert!(!rule.is_allowed("p%40ssword%21Tq9Wz4"), "more than the allowed word");
        assert!(!rule.is_allowed("Tq9%2FWz4Kv7Lx2"));
    }

    #[test]
    fn allow_repeated_user_turns_down_a_password_made_of_the_user_name() {
        let mut r = raw(r"(?i:tok)://[^\s:/@]*:([^\s:/@]{3,})@");
        r.allow_repeated_user = true;
        let Some(rule) = compiled(r) else { return };
        let repeats = |hay: &str| {
            let start = hay.rfind(':').map_or(0, |i| i + 1);
            let end = hay.rfind('@').unwrap_or(hay.len());
            rule.is_repeated_user(hay, start, end)
        };
        assert!(repeats("tok://monit:monit@"));
        assert!(repeats("tok://kamailio:kamailiorw@"), "the name and a role");
        assert!(repeats("tok://Admin:admin123@"), "case aside, and a number");
        assert!(repeats("tok://grafana:grafana_pw@"), "past one separator");
        assert!(repeats("tok://app01:app01@"), "two digits end a name");
        assert!(!repeats("tok://monit:monitS3cr3tPass@"), "more than a short suffix");
        assert!(!repeats("tok://kamailio:Tq9Wz4Kv@"), "a password of its own");
        assert!(!repeats("tok://Tq9W4Kv7Lx2s:Tq9W4Kv7Lx2s@"), "a random value written twice is no name");
        assert!(!repeats("tok://ab:abcd@"), "a two-letter name says too little");
        assert!(!repeats("tok://:monit@"), "no user");
        assert!(repeats("tok://ñmonit:monit@"), "a letter outside ASCII ends the name");
        assert!(!repeats("tok://пароль:пароль@"), "a name outside ASCII is none");
        // A connection string's fields.
        let field = |hay: &str| {
            let start = hay.rfind(['=', ' ']).map_or(0, |i| i + 1);
            rule.is_repeated_user(hay, start, hay.len())
        };
        assert!(field("tok://db;user=sequel_test;password=sequel_test"));
        assert!(field("tok://db?user=root&PWD = root1"), "case and spaces aside");
        assert!(field("tok://db;User ID=app_rw; Password=app_rw"));
        assert!(!field("tok://db;user=sequel_test;password=Tq9Wz4Kv7Lx2"), "a password of its own");
        assert!(!field("tok://db;user=sequel_test;secret=sequel_test"), "no password field");
        assert!(!field("tok://db;user=sequel_test password=sequel_test"), "no field separator");
        assert!(!field("password=sequel_test"), "no field before");
        // Another rule keeps such a password a finding.
        let Some(plain) = compiled(raw(r"(?i:tok)=(\S+)")) else { return };
        assert!(!plain.is_repeated_user("tok://monit:monit@", 12, 17));
    }

    #[test]
    fn allow_line_sees_the_line_up_to_the_match_end_within_the_lookback() {
        let mut r = raw(r"(?i:tok)=([a-z]+)");
        r.allow_line = vec!["(?i)next".into(), "qq$".into(), "ж".into()];
        let Some(rule) = compiled(r) else { return };
        let at = |hay: &str| hay.find("Tok=").map(|s| (s, s + "Tok=abcqq".len())).unwrap_or((0, 0));
        let judged = |hay: &str| {
            let (s, e) = at(hay);
            rule.is_line_allowed(hay, s, e)
        };
        assert!(judged("x NextTok=abcqq"), "the name before the keyword");
        assert!(judged("Tok=abcqq"), "the match itself, to its end");
        assert!(!judged("next\nTok=abcqz"), "another line does not count");
        assert!(!judged(&format!("next{}Tok=abcqz", "a".repeat(ALLOW_LINE_LOOKBACK))), "beyond the lookback");
        assert!(judged(&format!("next{}Tok=abcqz", "a".repeat(ALLOW_LINE_LOOKBACK - 4))), "just within it");
        // A cut inside a character moves back to its start instead of failing.
        assert!(judged(&format!("ж{}Tok=abcqz", "a".repeat(ALLOW_LINE_LOOKBACK - 1))));
    }

    #[test]
    fn kebab_ids() {
        assert!(is_kebab("aws-access-key-id"));
        assert!(is_kebab("gcp2"));
        for bad in ["", "Aws", "a--b", "-a", "a-", "a_b", "a b"] {
            assert!(!is_kebab(bad), "{bad}");
        }
    }

    #[test]
    fn compiles_and_lowercases_keywords() {
        let r = raw(r"tok_[a-z]{8}").compile().map_err(|e| format!("{e:?}"));
        assert!(matches!(&r, Ok(rule) if rule.keywords == ["tok"] && rule.secret_group() == 0), "{r:?}");
    }

    #[test]
    fn lists_every_problem() {
        let mut r = raw(r"(a");
        r.id = "Bad_Id".into();
        r.min_entropy = Some(9.0);
        r.allow = vec!["[".into()];
        let errs = r.compile().err().unwrap_or_default();
        let keys: Vec<_> = errs.iter().map(|e| e.key).collect();
        assert_eq!(keys, ["id", "regex", "min_entropy", "allow"]);
    }

    #[test]
    fn rejects_empty_matches_and_missing_groups() {
        assert_eq!(raw("a*").compile().err().map(|e| e[0].key), Some("regex"));
        let mut r = raw("tok(x)");
        r.secret_group = Some(SecretGroup::Index(2));
        assert_eq!(r.compile().err().map(|e| e[0].key), Some("secret_group"));
        let mut r = raw("tok(?P<s>x)");
        r.secret_group = Some(SecretGroup::Name("s".into()));
        assert!(matches!(r.compile(), Ok(rule) if rule.secret_group() == 1));
    }

    #[test]
    fn a_secret_group_that_is_the_whole_match_needs_no_capture_search() {
        let scan_group = |pattern: &str| {
            let mut r = raw(pattern);
            r.secret_group = Some(SecretGroup::Index(1));
            r.compile().map(|rule| (rule.secret_group(), rule.scan_group())).map_err(|e| format!("{e:?}"))
        };
        // The group between zero-width assertions, or inside another group: the match.
        assert_eq!(scan_group(r"\b(tok_[a-z]{8})\b"), Ok((1, 0)));
        assert_eq!(scan_group(r"(?m)^(tok_[a-z]{8})$"), Ok((1, 0)));
        assert_eq!(scan_group(r"((tok_[a-z]{8}))"), Ok((1, 0)));
        // Anything else around it, optional or not: captured.
        assert_eq!(scan_group(r"tok=(tok_[a-z]{8})"), Ok((1, 1)));
        assert_eq!(scan_group(r"(?:x=)?(tok_[a-z]{8})"), Ok((1, 1)));
        assert_eq!(scan_group(r"(tok_[a-z]{8})|tik_[a-z]{8}"), Ok((1, 1)));
        assert_eq!(scan_group(r"(tok_[a-z]{8})+"), Ok((1, 1)));
    }

    #[test]
    fn regex_size_limit_applies() {
        let errs = raw(r"\w{1000}\w{1000}").compile().err().unwrap_or_default();
        assert!(errs.iter().any(|e| e.key == "regex" && e.reason.contains("size limit")), "{errs:?}");
    }

    #[test]
    fn word_boundaries_become_ascii_and_groups_survive() {
        let mut r = raw(r"\btok_(?P<s>[a-z]{4})\b");
        r.secret_group = Some(SecretGroup::Name("s".into()));
        let Some(rule) = compiled(r) else { return };
        assert_eq!(rule.secret_group(), 1);
        // A Cyrillic letter is not an ASCII word character, so it is a boundary.
        assert!(rule.regex.get().is_some_and(|re| re.is_match("ключtok_abcd")));
        assert!(!rule.regex.get().is_some_and(|re| re.is_match("xtok_abcd")));
    }

    #[test]
    fn entropy() {
        assert_eq!(shannon_entropy("aaaa"), 0.0);
        assert!((shannon_entropy("abcd") - 2.0).abs() < 1e-12);
    }
}
