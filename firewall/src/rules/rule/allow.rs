//! The exemptions: `allow` patterns that a secret matches, `allow_line` patterns that the
//! line before a match matches (within a bounded look-back that streaming keeps) and
//! `allow_decoded` patterns that a base64 or hex secret's decoding matches. Each field is an
//! [`AllowList`]: compiled once per load (or at first use) and searched as at most two
//! alternations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use regex::Regex;
use regex_automata::{Anchored, Input};
use regex_syntax::hir::{Hir, Look};

use super::compile::compile_regex;
use super::forward::ForwardRegex;
use super::{field, FieldError, Rule};
use crate::detect::encoded::{base64_text, hex_text, unescaped_text};

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
        !self.allow_line.patterns.is_empty()
            && hay.get(line_start(hay, start)..end).is_some_and(|line| self.allow_line.is_match(line))
    }

    /// Whether an `allow` pattern exempts `secret` as written or with its escapes undone
    /// (`p%40ssword` inside a URL is `p@ssword`, JSON's `Contrase\u00f1a` is `Contraseña`,
    /// Jetty's `OBF:1u2u1wml1z7s1z7a1wnl1u2g` is `keypwd`), or an `allow_decoded` pattern
    /// what it says in base64 or in hex.
    pub fn is_allowed(&self, secret: &str) -> bool {
        self.is_allowed_as_written(secret)
            || unescaped_text(secret).is_some_and(|text| self.is_allowed_as_written(&text))
            || self.is_allowed_decoded(secret)
    }

    /// Whether `allow_repeated_user` exempts the secret `start..end` of `hay`: it repeats
    /// the user name written right before it (see [`repeats_user`]).
    pub fn is_repeated_user(&self, hay: &str, start: usize, end: usize) -> bool {
        self.allow_repeated_user
            && hay.get(line_start(hay, start)..start).zip(hay.get(start..end)).is_some_and(|(b, s)| repeats_user(b, s))
    }

    pub(crate) fn is_allowed_as_written(&self, secret: &str) -> bool {
        self.allow.is_match(secret)
    }

    fn is_allowed_decoded(&self, secret: &str) -> bool {
        !self.allow_decoded.patterns.is_empty()
            && [base64_text, hex_text]
                .iter()
                .any(|decode| decode(secret).is_some_and(|text| self.allow_decoded.is_match(&text)))
    }
}

/// How many letters or digits a password may add to the user name it repeats
/// (`kamailio:kamailiorw`, `admin:admin123`), past one separator (`grafana_pw`).
const REPEATED_USER_SUFFIX: usize = 4;

/// Whether `secret` is the user name that ends `before`, past one `:`, `/` or space
/// (`monit:monit`, `-u admin admin`) or past a connection string's password field
/// (`user=sequel_test;password=sequel_test`), or that name and at most
/// [`REPEATED_USER_SUFFIX`] letters or digits, ASCII case aside: a default derived from the
/// name, not a secret. The name must read as one (letters, `_.-` inside, two digits at its
/// end at most), so a random value written twice is not taken for a user and its default.
fn repeats_user(before: &str, secret: &str) -> bool {
    let Some(before) = before_password_field(before).or_else(|| before.strip_suffix([':', ' ', '/'])) else {
        return false;
    };
    let name_chars = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    let user = &before[before.trim_end_matches(name_chars).len()..];
    let letters = user.trim_end_matches(|c: char| c.is_ascii_digit());
    let reads_as_name = (3..=32).contains(&user.len())
        && user.len() - letters.len() <= 2
        && letters.starts_with(|c: char| c.is_ascii_alphabetic())
        && letters.chars().all(|c| c.is_ascii_alphabetic() || matches!(c, '_' | '.' | '-'));
    if !reads_as_name || secret.len() < user.len() || !secret.is_char_boundary(user.len()) {
        return false;
    }
    let (head, rest) = secret.split_at(user.len());
    let rest = rest.strip_prefix(['_', '.', '-', '!', '@', '#']).unwrap_or(rest);
    head.eq_ignore_ascii_case(user)
        && rest.len() <= REPEATED_USER_SUFFIX
        && rest.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The text before a connection string's or query's password field that `before` ends with
/// (`…;user=app;password=`, `…&user=app&pwd = `), the field's separator left out: where a
/// field holding the user ends.
fn before_password_field(before: &str) -> Option<&str> {
    let key = before.trim_end_matches(' ').strip_suffix('=')?.trim_end_matches(' ');
    let name_at = key.trim_end_matches(|c: char| c.is_ascii_alphabetic()).len();
    let is_password = ["password", "passwd", "pwd", "pass"].iter().any(|k| key[name_at..].eq_ignore_ascii_case(k));
    let rest = key[..name_at].trim_end_matches(' ');
    (is_password && rest.ends_with([';', '&'])).then(|| rest[..rest.len() - 1].trim_end_matches(' '))
}

/// A rule's `allow`, `allow_line` or `allow_decoded` patterns, compiled at load or, for
/// rules loaded with [`crate::LoadOptions::defer_regexes`], by the first text they judge
/// (then shared by every rule with the same list).
#[derive(Debug)]
pub(crate) struct AllowList {
    pub(crate) patterns: Vec<String>,
    compiled: OnceLock<AllowCompiled>,
    /// The load's parsed patterns, for a compile put off.
    parsed: Arc<ParsedPatterns>,
}

#[derive(Debug)]
pub(crate) struct AllowCompiled {
    /// Each pattern alone: what is searched where the alternations outgrew the size limit.
    /// A deferred compile that has the alternations leaves it empty.
    pub(crate) each: Vec<Regex>,
    /// [`allow_groups`]; None where they outgrow the size limit that each pattern kept.
    pub(crate) groups: Option<Arc<[AllowGroup]>>,
}

impl AllowList {
    /// Whether one of the patterns matches `hay` (compiling them first, if put off).
    pub(crate) fn is_match(&self, hay: &str) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        let compiled = self.compiled();
        match &compiled.groups {
            Some(groups) => groups.iter().any(|re| re.is_match(hay)),
            None => compiled.each.iter().any(|a| a.is_match(hay)),
        }
    }

    pub(crate) fn compiled(&self) -> &AllowCompiled {
        self.compiled.get_or_init(|| {
            let groups = allow_groups(&self.patterns, &self.parsed).map(Arc::from);
            let each = match groups {
                Some(_) => Vec::new(),
                None => self.patterns.iter().filter_map(|p| compile_regex(p).ok()).collect(),
            };
            AllowCompiled { each, groups }
        })
    }
}

/// Parsed `allow` patterns by their source, shared by one load's lists: the built-in rules'
/// 131 distinct lists repeat 368 patterns 1,692 times (the named lists in most of them), and
/// parsing a pattern (its case folds most of all) cost more than all the searches a scan of
/// a few MB makes with it.
#[derive(Debug, Default)]
pub(crate) struct ParsedPatterns(Mutex<HashMap<String, Hir>>);

impl ParsedPatterns {
    fn parse(&self, pattern: &str) -> Option<Hir> {
        let mut parsed = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(hir) = parsed.get(pattern) {
            return Some(hir.clone());
        }
        let hir = regex_syntax::parse(pattern).ok()?;
        parsed.insert(pattern.to_string(), hir.clone());
        Some(hir)
    }
}

/// Compiled `allow` patterns by their source, for one load: the default rules repeat a few
/// lists (58 distinct patterns among 269, 21 distinct lists among 38 rules), and a clone
/// shares the compiled program.
#[derive(Debug, Default)]
pub(crate) struct AllowCache {
    parsed: Arc<ParsedPatterns>,
    patterns: HashMap<String, Regex>,
    /// [`allow_groups`] by the list's patterns; None where they outgrow the size limit.
    sets: HashMap<Vec<String>, Option<Arc<[AllowGroup]>>>,
    /// Lists whose compiling is put off, by their patterns.
    deferred: HashMap<Vec<String>, Arc<AllowList>>,
}

impl AllowCache {
    pub(super) fn compile(&mut self, pattern: &str) -> Result<Regex, String> {
        if let Some(re) = self.patterns.get(pattern) {
            return Ok(re.clone());
        }
        let re = compile_regex(pattern)?;
        self.patterns.insert(pattern.to_string(), re.clone());
        Ok(re)
    }

    /// Every pattern of the list under `key`; each one that does not compile is an error.
    pub(super) fn compile_all(
        &mut self,
        key: &'static str,
        patterns: &[String],
        errs: &mut Vec<FieldError>,
    ) -> Vec<Regex> {
        let mut out = Vec::with_capacity(patterns.len());
        for p in patterns {
            match self.compile(p) {
                Ok(re) => out.push(re),
                Err(e) => errs.push(field(key, format!("bad {key} regex `{p}`: {e}"))),
            }
        }
        out
    }

    /// A rule's `allow`, `allow_line` or `allow_decoded` list (the field `key`): compiled
    /// now (each pattern that does not compile is an error), or, with `defer`, when it
    /// first judges a secret.
    pub(super) fn allow_list(
        &mut self,
        key: &'static str,
        patterns: &[String],
        defer: bool,
        errs: &mut Vec<FieldError>,
    ) -> Arc<AllowList> {
        if defer {
            let list =
                AllowList { patterns: patterns.to_vec(), compiled: OnceLock::new(), parsed: self.parsed.clone() };
            return self.deferred.entry(patterns.to_vec()).or_insert_with(|| Arc::new(list)).clone();
        }
        let errors_before = errs.len();
        let each = self.compile_all(key, patterns, errs);
        let groups = if errs.len() == errors_before { self.compile_set(patterns) } else { None };
        let compiled = OnceLock::from(AllowCompiled { each, groups });
        Arc::new(AllowList { patterns: patterns.to_vec(), compiled, parsed: self.parsed.clone() })
    }

    /// The alternations of `patterns` (each compiled alone already), built once per list.
    fn compile_set(&mut self, patterns: &[String]) -> Option<Arc<[AllowGroup]>> {
        if patterns.is_empty() {
            return None;
        }
        if let Some(set) = self.sets.get(patterns) {
            return set.clone();
        }
        let set = allow_groups(patterns, &self.parsed).map(Arc::from);
        self.sets.insert(patterns.to_vec(), set.clone());
        set
    }
}

/// An `allow` list as alternations that match wherever one of its patterns matches: one
/// of the patterns anchored at the text's start (`^…`, which fail after a byte or two)
/// and one of the rest. A list of a dozen patterns is judged in two searches instead of
/// twelve. Parsed as `regex::Regex` parses, so each alternative matches what its pattern
/// matches (flags stay inside it).
pub(super) fn allow_groups(patterns: &[String], parsed: &ParsedPatterns) -> Option<Vec<AllowGroup>> {
    let hirs = patterns.iter().map(|p| parsed.parse(p)).collect::<Option<Vec<Hir>>>()?;
    let (anchored, other): (Vec<Hir>, Vec<Hir>) =
        hirs.into_iter().partition(|h| h.properties().look_set_prefix().contains(Look::Start));
    [anchored, other].into_iter().filter(|g| !g.is_empty()).map(|g| AllowGroup::new(&Hir::alternation(g))).collect()
}

/// One alternation of `allow` patterns, built to answer whether it matches and nothing
/// else (see [`ForwardRegex`]): a full regex's reverse NFA, one-pass DFA and literal
/// prefilter, none of which a yes-or-no answer on a short secret uses, were half of what
/// compiling the lists cost a scan.
pub(crate) struct AllowGroup {
    regex: ForwardRegex,
    /// Whether every pattern starts with `^`: then a search tries the text's start only.
    anchored: bool,
}

impl AllowGroup {
    fn new(hir: &Hir) -> Option<AllowGroup> {
        let anchored = hir.properties().look_set_prefix().contains(Look::Start);
        Some(AllowGroup { regex: ForwardRegex::new(hir)?, anchored })
    }

    /// Whether one of the group's patterns matches somewhere in `hay`.
    pub(crate) fn is_match(&self, hay: &str) -> bool {
        let mode = if self.anchored { Anchored::Yes } else { Anchored::No };
        self.regex.match_end(&Input::new(hay).anchored(mode).earliest(true)).is_some()
    }
}

impl std::fmt::Debug for AllowGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AllowGroup").field("anchored", &self.anchored).finish_non_exhaustive()
    }
}
