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

use std::collections::HashMap;
use std::sync::Arc;

use regex::{Regex, RegexBuilder};
use regex_automata::meta::Regex as MetaRegex;
use regex_syntax::hir::{Hir, Look};
use serde::{Deserialize, Serialize};

use crate::scan::keyword_reach::keyword_reach;
use crate::verdict::{Action, Severity};

/// Compiled-program size limit for every rule and allow regex (bytes).
pub const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The actions a rule file may name (`allow` is not one of them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuleAction {
    Block,
    Redact,
    Log,
}

impl From<RuleAction> for Action {
    fn from(a: RuleAction) -> Action {
        match a {
            RuleAction::Block => Action::Block,
            RuleAction::Redact => Action::Redact,
            RuleAction::Log => Action::Log,
        }
    }
}

/// `secret_group` is a capture index or a capture name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum SecretGroup {
    Index(usize),
    Name(String),
}

/// A `[[rule]]` table exactly as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRule {
    pub id: String,
    pub description: String,
    pub severity: Severity,
    pub action: RuleAction,
    pub regex: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_group: Option<SecretGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keywords: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_entropy: Option<f64>,
    /// The generic-secret judge's least score (0..1) for a match to count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow_line: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    #[serde(default)]
    pub must_match: Vec<String>,
    #[serde(default)]
    pub must_not_match: Vec<String>,
}

/// A `[[canary]]` table exactly as written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCanary {
    pub id: String,
    pub owner: String,
    pub strings: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Shortest canary string accepted: shorter ones would fire on ordinary text.
pub const MIN_CANARY_LEN: usize = 8;

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
    pub regex: Arc<MetaRegex>,
    /// Capture index of the secret; 0 = the whole match.
    pub secret_group: usize,
    /// The group scans capture: `secret_group`, or 0 where that group always spans the
    /// whole match (it holds all of the pattern but zero-width assertions, as in
    /// `\b(eyJ…)`), so the match alone gives the secret and no capture search runs.
    pub(crate) scan_group: usize,
    /// ASCII-lowercased keywords; empty = the rule runs on every text.
    pub keywords: Vec<String>,
    /// How far past a match's start its first keyword can begin, at most (see
    /// `scan/keyword_reach.rs`); `None` when unbounded (or no keywords): the rule is searched over
    /// whole texts.
    pub(crate) reach: Option<usize>,
    pub min_entropy: Option<f64>,
    /// The least score of the generic-secret judge ([`crate::Judge`]) for a match to
    /// count; None: the rule does not ask the judge.
    pub judge: Option<f32>,
    pub allow: Vec<Regex>,
    /// `allow` as at most two alternations (see [`allow_groups`]), searched instead of
    /// the patterns one by one; None without patterns, or where an alternation outgrows
    /// the size limit that each pattern alone kept.
    allow_set: Option<Arc<[MetaRegex]>>,
    /// Patterns that exempt a match by its line: searched in the text from the start of
    /// the match's line (at most `ALLOW_LINE_LOOKBACK` bytes before the match) to the
    /// match's end. They see what `allow` cannot: the name before a keyword
    /// (`NextToken` for a rule whose match starts at `token`), an ARN around it.
    pub allow_line: Vec<Regex>,
    pub tags: Vec<String>,
    pub must_match: Vec<String>,
    pub must_not_match: Vec<String>,
    /// The parsed pattern, kept for building the streaming automaton.
    pub(crate) hir: Hir,
}

/// How far before a match `allow_line` patterns see, at most. Bounded so that a stream
/// scanner keeps only this much released text to judge by the same context as a
/// one-shot scan of the whole text.
pub const ALLOW_LINE_LOOKBACK: usize = 128;

/// Where the line holding `start` begins in `hay`, looking back at most
/// [`ALLOW_LINE_LOOKBACK`] bytes: the context `allow_line` and the judge read.
pub(crate) fn line_start(hay: &str, start: usize) -> usize {
    let mut from = start.saturating_sub(ALLOW_LINE_LOOKBACK).min(hay.len());
    while !hay.is_char_boundary(from) {
        from -= 1;
    }
    let before = hay.get(from..start).unwrap_or("");
    before.rfind('\n').map_or(from, |nl| from + nl + 1)
}

impl Rule {
    /// Whether an `allow_line` pattern exempts the match `start..end` of `hay`, judged on
    /// the line before it (see [`Rule::allow_line`]); `hay` must hold the
    /// `ALLOW_LINE_LOOKBACK` bytes before `start` where the text has them.
    pub fn is_line_allowed(&self, hay: &str, start: usize, end: usize) -> bool {
        if self.allow_line.is_empty() {
            return false;
        }
        hay.get(line_start(hay, start)..end).is_some_and(|line| self.allow_line.iter().any(|re| re.is_match(line)))
    }

    /// Whether an `allow` pattern exempts `secret`.
    pub fn is_allowed(&self, secret: &str) -> bool {
        match &self.allow_set {
            Some(groups) => groups.iter().any(|re| re.is_match(secret)),
            None => self.allow.iter().any(|a| a.is_match(secret)),
        }
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

/// Compiles a regex under the size limit, reporting the regex crate's message on one line.
pub(crate) fn compile_regex(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern).size_limit(REGEX_SIZE_LIMIT).build().map_err(|e| one_line(&e.to_string()))
}

/// Compiles a parsed pattern under the same size limit. A pattern whose every match
/// starts within a known reach of a keyword hit is tried anchored at chosen positions in
/// one-shot scans, and otherwise only over short windows, so it is built without a literal
/// prefilter (`prefilter: false`): nothing it runs would consult one, and building them
/// is ~9 % of loading the default rules.
pub(crate) fn compile_hir(hir: &Hir, prefilter: bool) -> Result<MetaRegex, String> {
    MetaRegex::builder()
        .configure(MetaRegex::config().nfa_size_limit(Some(REGEX_SIZE_LIMIT)).auto_prefilter(prefilter))
        .build_from_hir(hir)
        .map_err(|e| one_line(&e.to_string()))
}

fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Compiled `allow` patterns by their source, for one load: the default rules repeat a few
/// lists (58 distinct patterns among 269, 21 distinct lists among 38 rules), and a clone
/// shares the compiled program.
#[derive(Debug, Default)]
pub(crate) struct AllowCache {
    patterns: HashMap<String, Regex>,
    /// [`allow_groups`] by the list's patterns; None where they outgrow the size limit.
    sets: HashMap<Vec<String>, Option<Arc<[MetaRegex]>>>,
}

impl AllowCache {
    fn compile(&mut self, pattern: &str) -> Result<Regex, String> {
        if let Some(re) = self.patterns.get(pattern) {
            return Ok(re.clone());
        }
        let re = compile_regex(pattern)?;
        self.patterns.insert(pattern.to_string(), re.clone());
        Ok(re)
    }

    /// Every pattern of the list under `key`; each one that does not compile is an error.
    fn compile_all(&mut self, key: &'static str, patterns: &[String], errs: &mut Vec<FieldError>) -> Vec<Regex> {
        let mut out = Vec::with_capacity(patterns.len());
        for p in patterns {
            match self.compile(p) {
                Ok(re) => out.push(re),
                Err(e) => errs.push(field(key, format!("bad {key} regex `{p}`: {e}"))),
            }
        }
        out
    }

    /// The alternations of `patterns` (each compiled alone already), built once per list.
    fn compile_set(&mut self, patterns: &[String]) -> Option<Arc<[MetaRegex]>> {
        if patterns.is_empty() {
            return None;
        }
        if let Some(set) = self.sets.get(patterns) {
            return set.clone();
        }
        let set = allow_groups(patterns).map(Arc::from);
        self.sets.insert(patterns.to_vec(), set.clone());
        set
    }
}

/// An `allow` list as alternations that match wherever one of its patterns matches: one
/// of the patterns anchored at the text's start (`^…`, which fail after a byte or two)
/// and one of the rest (whose literals the regex engine then finds with one prefilter).
/// A list of a dozen patterns is judged in two searches instead of twelve; one
/// alternation of all twelve cost more than the twelve on long secrets (a lazy DFA over
/// every byte instead of prefilters that skip them). Parsed as `regex::Regex` parses,
/// so each alternative matches what its pattern matches (flags stay inside it).
fn allow_groups(patterns: &[String]) -> Option<Vec<MetaRegex>> {
    let hirs = patterns.iter().map(|p| regex_syntax::parse(p).ok()).collect::<Option<Vec<Hir>>>()?;
    let (anchored, other): (Vec<Hir>, Vec<Hir>) =
        hirs.into_iter().partition(|h| h.properties().look_set_prefix().contains(Look::Start));
    [anchored, other]
        .into_iter()
        .filter(|g| !g.is_empty())
        .map(|g| compile_hir(&Hir::alternation(g), true).ok())
        .collect()
}

impl RawRule {
    /// Validates everything that can be checked on the rule alone; every problem is listed.
    pub fn compile(self) -> Result<Rule, Vec<FieldError>> {
        self.compile_sharing(&mut AllowCache::default())
    }

    /// [`RawRule::compile`], taking `allow` patterns compiled already from `cache`.
    pub(crate) fn compile_sharing(self, cache: &mut AllowCache) -> Result<Rule, Vec<FieldError>> {
        let mut errs = Vec::new();
        if !is_kebab(&self.id) {
            errs.push(field("id", format!("id `{}` is not kebab-case (a-z, 0-9, single hyphens)", self.id)));
        }
        if self.description.trim().is_empty() {
            errs.push(field("description", "description is empty"));
        }
        let hir = regex_syntax::ParserBuilder::new().build().parse(&self.regex).ok().map(|h| ascii_twin(&h));
        let keywords = check_keywords(&self.keywords).map_err(|e| errs.push(e)).ok();
        let reach = match (&hir, &keywords) {
            (Some(h), Some(k)) => keyword_reach(h, k),
            _ => None,
        };
        // The regex that runs is the ASCII-boundary twin of the one written (same groups,
        // never larger), so only the twin is compiled; the one written is compiled when
        // the twin fails, to word the error in terms of what the author wrote.
        let regex = match hir.as_ref().map(|h| compile_hir(h, reach.is_none())) {
            Some(Ok(re)) => Some(Arc::new(re)),
            twin => {
                let twin_error = twin.and_then(Result::err);
                let e = compile_regex(&self.regex)
                    .err()
                    .or(twin_error)
                    .unwrap_or_else(|| "the pattern does not parse".into());
                errs.push(field("regex", format!("bad regex: {e}")));
                None
            }
        };
        if let Some(h) = &hir {
            if h.properties().minimum_len() == Some(0) {
                errs.push(field("regex", "regex can match the empty string"));
            }
        }
        let secret_group =
            regex.as_ref().and_then(|re| resolve_group(re, self.secret_group.as_ref()).map_err(|e| errs.push(e)).ok());
        if let Some(e) = self.min_entropy {
            if !(0.0..=8.0).contains(&e) {
                errs.push(field(
                    "min_entropy",
                    format!("min_entropy must be within 0..=8 bits per character, got {e}"),
                ));
            }
        }
        if let Some(j) = self.judge {
            if !(0.0..=1.0).contains(&j) {
                errs.push(field("judge", format!("judge is the least score for a match, within 0..=1, got {j}")));
            }
        }
        let allow = cache.compile_all("allow", &self.allow, &mut errs);
        let allow_line = cache.compile_all("allow_line", &self.allow_line, &mut errs);
        let allow_set = if errs.is_empty() { cache.compile_set(&self.allow) } else { None };
        match (regex, hir, secret_group, keywords) {
            (Some(regex), Some(hir), Some(secret_group), Some(keywords)) if errs.is_empty() => Ok(Rule {
                id: self.id,
                description: self.description,
                severity: self.severity,
                action: self.action.into(),
                regex,
                secret_group,
                scan_group: if group_is_whole_match(&hir, secret_group) { 0 } else { secret_group },
                keywords,
                reach,
                min_entropy: self.min_entropy,
                judge: self.judge.map(|j| j as f32),
                allow,
                allow_set,
                allow_line,
                tags: self.tags,
                must_match: self.must_match,
                must_not_match: self.must_not_match,
                hir,
            }),
            _ => Err(errs),
        }
    }
}

/// Whether capture group `group` spans every match of `hir` whole: the pattern is that
/// group, possibly between zero-width assertions (or inside other groups that are).
fn group_is_whole_match(hir: &Hir, group: usize) -> bool {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Capture(c) => c.index as usize == group || group_is_whole_match(&c.sub, group),
        HirKind::Concat(parts) => {
            let mut wide = parts.iter().filter(|p| !matches!(p.kind(), HirKind::Look(_) | HirKind::Empty));
            matches!((wide.next(), wide.next()), (Some(p), None) if group_is_whole_match(p, group))
        }
        _ => false,
    }
}

/// The regex that runs: the one written, with two ASCII narrowings (same groups).
///
/// * Unicode word-boundary assertions (`\b`, `\B`, `\b{start}`, ...) become their ASCII
///   forms. Secrets are ASCII, and a Unicode `\b` makes the regex engine abandon its DFA on
///   the first non-ASCII byte (Russian prose ran ~100x slower); with ASCII boundaries a
///   non-ASCII letter next to a token counts as a boundary, which can only add findings.
/// * A case-insensitive ASCII letter (`(?i)k` = `k`, `K` and the Kelvin sign) matches only
///   its two ASCII cases. Keywords are ASCII case-insensitive, so a match spelled with the
///   Kelvin sign or the long s could never count through that word anyway; without them a
///   `(?i)` word is a plain keyword, which is what lets `keyword_reach` bound where matches start.
pub(crate) fn ascii_twin(hir: &Hir) -> Hir {
    use regex_syntax::hir::{HirKind, Look};
    match hir.kind() {
        HirKind::Look(l) => Hir::look(match l {
            Look::WordUnicode => Look::WordAscii,
            Look::WordUnicodeNegate => Look::WordAsciiNegate,
            Look::WordStartUnicode => Look::WordStartAscii,
            Look::WordEndUnicode => Look::WordEndAscii,
            Look::WordStartHalfUnicode => Look::WordStartHalfAscii,
            Look::WordEndHalfUnicode => Look::WordEndHalfAscii,
            other => *other,
        }),
        HirKind::Class(regex_syntax::hir::Class::Unicode(c)) => {
            ascii_letter_pair(c).map_or_else(|| hir.clone(), |pair| Hir::class(regex_syntax::hir::Class::Unicode(pair)))
        }
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) => hir.clone(),
        HirKind::Repetition(r) => {
            Hir::repetition(regex_syntax::hir::Repetition { sub: Box::new(ascii_twin(&r.sub)), ..r.clone() })
        }
        HirKind::Capture(c) => {
            Hir::capture(regex_syntax::hir::Capture { sub: Box::new(ascii_twin(&c.sub)), ..c.clone() })
        }
        HirKind::Concat(v) => Hir::concat(v.iter().map(ascii_twin).collect()),
        HirKind::Alternation(v) => Hir::alternation(v.iter().map(ascii_twin).collect()),
    }
}

/// `Some([xX])` when `c` is exactly the case fold of one ASCII letter: both ASCII cases,
/// plus only the non-ASCII simple folds `K` (U+212A) and `ſ` (U+017F).
fn ascii_letter_pair(c: &regex_syntax::hir::ClassUnicode) -> Option<regex_syntax::hir::ClassUnicode> {
    use regex_syntax::hir::{ClassUnicode, ClassUnicodeRange};
    let mut ascii = Vec::new();
    for r in c.iter() {
        for ch in r.start()..=r.end() {
            if ch.is_ascii() {
                ascii.push(ch);
            } else if ch != '\u{212A}' && ch != '\u{17F}' {
                return None;
            }
            if ascii.len() > 2 {
                return None;
            }
        }
    }
    let [a, b] = ascii[..] else { return None };
    let pair = a.is_ascii_alphabetic() && a.eq_ignore_ascii_case(&b) && a != b;
    pair.then(|| ClassUnicode::new([ClassUnicodeRange::new(a, a), ClassUnicodeRange::new(b, b)]))
}

fn resolve_group(re: &MetaRegex, group: Option<&SecretGroup>) -> Result<usize, FieldError> {
    match group {
        None => Ok(0),
        Some(SecretGroup::Index(i)) if *i < re.captures_len() => Ok(*i),
        Some(SecretGroup::Index(i)) => Err(field(
            "secret_group",
            format!("secret_group {i} does not exist: the regex has {} capture group(s)", re.captures_len() - 1),
        )),
        Some(SecretGroup::Name(n)) => re
            .group_info()
            .pattern_names(regex_automata::PatternID::ZERO)
            .position(|c| c == Some(n.as_str()))
            .ok_or_else(|| field("secret_group", format!("secret_group `{n}` names no capture group of the regex"))),
    }
}

fn check_keywords(keywords: &[String]) -> Result<Vec<String>, FieldError> {
    if let Some(k) = keywords.iter().find(|k| k.trim().is_empty()) {
        return Err(field("keywords", format!("empty keyword `{k}`")));
    }
    Ok(keywords.iter().map(|k| k.to_ascii_lowercase()).collect())
}

impl RawCanary {
    pub fn compile(self) -> Result<Canary, Vec<FieldError>> {
        let mut errs = Vec::new();
        if !is_kebab(&self.id) {
            errs.push(field("id", format!("id `{}` is not kebab-case (a-z, 0-9, single hyphens)", self.id)));
        }
        if self.owner.trim().is_empty() {
            errs.push(field("owner", "owner (a tenant id) is empty"));
        }
        if self.strings.is_empty() {
            errs.push(field("strings", "a canary needs at least one string"));
        }
        for s in &self.strings {
            if s.chars().count() < MIN_CANARY_LEN {
                errs.push(field(
                    "strings",
                    format!("canary string of {} chars is shorter than {MIN_CANARY_LEN}", s.chars().count()),
                ));
            }
        }
        if errs.is_empty() {
            Ok(Canary { id: self.id, owner: self.owner, strings: self.strings })
        } else {
            Err(errs)
        }
    }
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

    /// The alternations judge every candidate as the patterns one by one do: on the
    /// default rules' samples (each whole, and each of its suffixes and prefixes), with
    /// case flags that must not leak from one pattern into the next.
    #[test]
    fn allow_groups_match_where_some_pattern_matches() {
        let one_by_one = |patterns: &[Regex], text: &str| patterns.iter().any(|re| re.is_match(text));
        let own = ["(?i)^abc".to_string(), "XYZ$".to_string(), "(?m)^x-".to_string(), r"\$\{".to_string()];
        let compiled: Vec<Regex> = own.iter().filter_map(|p| compile_regex(p).ok()).collect();
        let groups = allow_groups(&own).unwrap_or_default();
        assert_eq!(groups.len(), 2);
        for text in ["ABCd", "dabc", "xyz", "aXYZ", "XYZa", "q\nx-1", "a${b}", "${", "", "é${"] {
            assert_eq!(groups.iter().any(|g| g.is_match(text)), one_by_one(&compiled, text), "{text:?}");
        }
        let rules = crate::Ruleset::builtin().map_err(|e| e.to_string());
        let Ok(rules) = rules else { return assert_eq!(rules.err(), None) };
        let mut judged = 0;
        for r in rules.rules.iter().filter(|r| !r.allow.is_empty()) {
            assert!(r.allow_set.is_some(), "{}: no alternations", r.id);
            for sample in r.must_match.iter().chain(&r.must_not_match) {
                let cuts = (0..=sample.len()).filter(|&i| sample.is_char_boundary(i));
                for text in cuts.flat_map(|i| [&sample[i..], &sample[..i]]) {
                    assert_eq!(r.is_allowed(text), one_by_one(&r.allow, text), "{} on {text:?}", r.id);
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
            allow: vec![],
            allow_line: vec![],
            tags: vec![],
            must_match: vec![],
            must_not_match: vec![],
        }
    }

    #[test]
    fn allow_line_sees_the_line_up_to_the_match_end_within_the_lookback() {
        let mut r = raw(r"(?i:tok)=([a-z]+)");
        r.allow_line = vec!["(?i)next".into(), "qq$".into(), "ж".into()];
        let rule = r.compile();
        assert!(rule.is_ok(), "{rule:?}");
        let Ok(rule) = rule else { return };
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
        assert!(matches!(&r, Ok(rule) if rule.keywords == ["tok"] && rule.secret_group == 0), "{r:?}");
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
        assert!(matches!(r.compile(), Ok(rule) if rule.secret_group == 1));
    }

    #[test]
    fn a_secret_group_that_is_the_whole_match_needs_no_capture_search() {
        let scan_group = |pattern: &str| {
            let mut r = raw(pattern);
            r.secret_group = Some(SecretGroup::Index(1));
            r.compile().map(|rule| (rule.secret_group, rule.scan_group)).map_err(|e| format!("{e:?}"))
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
        let compiled = r.compile();
        assert!(compiled.is_ok(), "{compiled:?}");
        let Ok(rule) = compiled else { return };
        assert_eq!(rule.secret_group, 1);
        // A Cyrillic letter is not an ASCII word character, so it is a boundary.
        assert!(rule.regex.is_match("ключtok_abcd"));
        assert!(!rule.regex.is_match("xtok_abcd"));
    }

    #[test]
    fn entropy() {
        assert_eq!(shannon_entropy("aaaa"), 0.0);
        assert!((shannon_entropy("abcd") - 2.0).abs() < 1e-12);
    }
}
