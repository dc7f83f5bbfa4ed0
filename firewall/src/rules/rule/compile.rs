//! Validating one rule or canary and compiling it: the regex under the size limit and in
//! its ASCII twin, the secret group, keywords, entropy and judge bounds, the exemptions.

use std::fmt;
use std::sync::{Arc, LazyLock, OnceLock};

use regex::{Regex, RegexBuilder};
use regex_automata::meta::Regex as MetaRegex;
use regex_automata::Input;
use regex_syntax::hir::{Hir, HirKind};

use super::allow::AllowCache;
use super::forward::{ForwardCaches, ForwardRegex};
use super::{
    field, is_kebab, Canary, FieldError, RawCanary, RawRule, Rule, SecretGroup, MIN_CANARY_LEN, REGEX_SIZE_LIMIT,
};
use crate::scan::keyword_reach::keyword_reach;
use crate::scan::near_keywords::spans_lines;
use crate::scan::secret_span::SecretSplit;

/// Compiles a regex under the size limit, reporting the regex crate's message on one line.
pub(crate) fn compile_regex(pattern: &str) -> Result<Regex, String> {
    RegexBuilder::new(pattern).size_limit(REGEX_SIZE_LIMIT).build().map_err(|e| one_line(&e.to_string()))
}

/// Compiles a parsed pattern under the same size limit. A pattern whose every match
/// starts within a known reach of a keyword hit is tried anchored at chosen positions in
/// one-shot scans, and otherwise only over short windows, so it is built without a literal
/// prefilter (`prefilter: false`): nothing it runs would consult one, and building them
/// is ~9 % of loading the default rules. The exception is a pattern whose matches can span
/// lines: after a few tries the rest of its run is searched unanchored, and its run can be
/// the whole text (a PEM body, a Terraform block), which a prefilter crosses at memchr's
/// pace instead of the lazy DFA's.
pub(crate) fn compile_hir(hir: &Hir, prefilter: bool) -> Result<MetaRegex, String> {
    MetaRegex::builder()
        .configure(MetaRegex::config().nfa_size_limit(Some(REGEX_SIZE_LIMIT)).auto_prefilter(prefilter))
        .build_from_hir(hir)
        .map_err(|e| one_line(&e.to_string()))
}

/// A rule's compiled pattern, shared by every search of the rule (and with it the lazy
/// DFAs' caches). Two engines, each built by the first search that needs it: the meta
/// regex (unanchored searches, captures; compiled at load unless the rules were loaded
/// with [`crate::LoadOptions::defer_regexes`]), and a [`ForwardRegex`] for the tries
/// anchored near keyword hits, which most rules need alone. The pattern's keyword reach
/// is worked out with them, and a deferred pattern is parsed by its first search too: a
/// rule that no text calls for never pays for either (together they were two thirds of
/// loading the built-in rules).
#[derive(Clone)]
pub struct RuleRegex(Arc<RegexCell>);

/// What parsing a rule's pattern gives: the pattern that runs and where its secret lies.
#[derive(Debug)]
pub(crate) struct Parsed {
    /// The ASCII twin of the pattern written (see [`ascii_twin`]).
    hir: Hir,
    /// Capture index of the secret; 0 = the whole match.
    secret_group: usize,
    /// The group scans capture: `secret_group`, or 0 where that group always spans the
    /// whole match (it holds all of the pattern but zero-width assertions, as in
    /// `\b(eyJ…)`), so the match alone gives the secret and no capture search runs.
    scan_group: usize,
    /// Where the secret lies when the match alone tells: a pattern written
    /// `\b(SECRET)(?:[^…]|$)` or `NAME = (VALUE)…`, read without a capture search (see
    /// `scan::secret_span`).
    split: Option<SecretSplit>,
}

impl Parsed {
    /// `hir` (the twin) with its secret in capture group `secret_group`, which exists.
    pub(crate) fn new(hir: Hir, secret_group: usize) -> Parsed {
        let scan_group = if group_is_whole_match(&hir, secret_group) { 0 } else { secret_group };
        let split = if scan_group == 0 { None } else { SecretSplit::new(&hir, scan_group) };
        Parsed { hir, secret_group, scan_group, split }
    }

    /// `pattern` parsed, its twin made and `group` found in it; None where any of that
    /// fails (what a load that checks reports as errors).
    fn of(pattern: &str, group: Option<&SecretGroup>) -> Option<Parsed> {
        let hir = parse_twin(pattern)?;
        let secret_group = resolve_group(&hir, group).ok()?;
        Some(Parsed::new(hir, secret_group))
    }
}

struct RegexCell {
    /// The pattern as written and its secret group, for a parse put off.
    source: Box<str>,
    group: Option<SecretGroup>,
    /// None only for a deferred pattern that does not parse or has no such group (the
    /// built-in rules, the only ones deferred, all do: their tests load them in full); it
    /// then matches nothing.
    parsed: OnceLock<Option<Parsed>>,
    /// The rule's keywords, ASCII-lowercased, for [`RuleRegex::keyword_reach`].
    keywords: Box<[String]>,
    /// [`keyword_reach`] of the pattern and `keywords`, worked out on first use.
    reach: OnceLock<Option<usize>>,
    /// None only for a deferred pattern that does not compile; its unanchored searches then
    /// find nothing.
    meta: OnceLock<Option<MetaRegex>>,
    /// None where the forward engine does not build; the meta regex answers instead.
    forward: OnceLock<Option<ForwardRegex>>,
}

impl RuleRegex {
    /// `parsed`'s meta regex compiled now (an error is the regex crate's message, on one
    /// line). `keywords` are the rule's, checked.
    pub(crate) fn compiled(parsed: Parsed, keywords: &[String]) -> Result<RuleRegex, String> {
        let cell = RegexCell::new("", None, OnceLock::from(Some(parsed)), keywords);
        let meta = compile_hir(cell.hir(), cell.prefilter())?;
        let _ = cell.meta.set(Some(meta));
        Ok(RuleRegex(Arc::new(cell)))
    }

    /// `pattern` (with its secret in `group`), parsed and compiled by its first search.
    pub(crate) fn deferred(pattern: &str, group: Option<SecretGroup>, keywords: &[String]) -> RuleRegex {
        RuleRegex(Arc::new(RegexCell::new(pattern, group, OnceLock::new(), keywords)))
    }

    /// The pattern that runs, parsed (a pattern that matches nothing where a deferred one
    /// does not parse).
    pub(crate) fn hir(&self) -> &Hir {
        self.0.hir()
    }

    /// Capture index of the secret; 0 = the whole match.
    pub(crate) fn secret_group(&self) -> usize {
        self.0.parsed().map_or(0, |p| p.secret_group)
    }

    /// The group scans capture (see [`Parsed`]).
    pub(crate) fn scan_group(&self) -> usize {
        self.0.parsed().map_or(0, |p| p.scan_group)
    }

    /// Where the secret lies when the match alone tells (see [`Parsed`]).
    pub(crate) fn split(&self) -> Option<&SecretSplit> {
        self.0.parsed().and_then(|p| p.split.as_ref())
    }

    /// How far past a match's start its first keyword can begin, at most (see
    /// `scan/keyword_reach.rs`); `None` when unbounded (or without keywords): the rule is
    /// searched over whole texts.
    pub(crate) fn keyword_reach(&self) -> Option<usize> {
        self.0.keyword_reach()
    }

    /// The meta regex; None only for a deferred pattern that does not compile.
    pub fn get(&self) -> Option<&MetaRegex> {
        let cell = &*self.0;
        cell.meta.get_or_init(|| compile_hir(cell.hir(), cell.prefilter()).ok()).as_ref()
    }

    /// Where the leftmost-first match of the anchored `input` ends: what the meta regex's
    /// `search_half` reports, by the forward engine where it builds, with the caller's
    /// caches for it (made by the first search that has none).
    pub(crate) fn anchored_end(&self, input: &Input<'_>, caches: &mut Option<ForwardCaches>) -> Option<usize> {
        let cell = &*self.0;
        match cell.forward.get_or_init(|| ForwardRegex::new(cell.hir())) {
            Some(forward) => forward.match_end_with(caches.get_or_insert_with(|| forward.create_caches()), input),
            None => self.get()?.search_half(input).map(|m| m.offset()),
        }
    }
}

impl RegexCell {
    fn new(source: &str, group: Option<SecretGroup>, parsed: OnceLock<Option<Parsed>>, keywords: &[String]) -> Self {
        RegexCell {
            source: source.into(),
            group,
            parsed,
            keywords: keywords.into(),
            reach: OnceLock::new(),
            meta: OnceLock::new(),
            forward: OnceLock::new(),
        }
    }

    fn parsed(&self) -> Option<&Parsed> {
        self.parsed.get_or_init(|| Parsed::of(&self.source, self.group.as_ref())).as_ref()
    }

    fn hir(&self) -> &Hir {
        static NOTHING: LazyLock<Hir> = LazyLock::new(Hir::fail);
        self.parsed().map_or(&NOTHING, |p| &p.hir)
    }

    fn keyword_reach(&self) -> Option<usize> {
        *self.reach.get_or_init(|| keyword_reach(self.hir(), &self.keywords))
    }

    /// Whether the meta regex gets a literal prefilter (see [`compile_hir`]).
    fn prefilter(&self) -> bool {
        self.keyword_reach().is_none() || spans_lines(self.hir())
    }
}

impl fmt::Debug for RuleRegex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.meta.get() {
            Some(Some(re)) => f.debug_tuple("RuleRegex").field(re).finish(),
            Some(None) => f.write_str("RuleRegex(does not compile)"),
            None => f.write_str("RuleRegex(deferred)"),
        }
    }
}

fn one_line(message: &str) -> String {
    message.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}

impl RawRule {
    /// Validates everything that can be checked on the rule alone; every problem is listed.
    pub fn compile(self) -> Result<Rule, Vec<FieldError>> {
        self.compile_sharing(&mut AllowCache::default(), false)
    }

    /// [`RawRule::compile`], taking `allow` patterns compiled already from `cache`; with
    /// `defer_regex`, the pattern is parsed and compiled by its first search, unchecked.
    pub(crate) fn compile_sharing(self, cache: &mut AllowCache, defer_regex: bool) -> Result<Rule, Vec<FieldError>> {
        let mut errs = Vec::new();
        // Only a rules folder defines lists; a rule compiled on its own cannot name one.
        let named = [
            ("allow_lists", &self.allow_lists),
            ("allow_line_lists", &self.allow_line_lists),
            ("allow_decoded_lists", &self.allow_decoded_lists),
        ];
        for (key, names) in named {
            if !names.is_empty() {
                errs.push(field(key, format!("{key} name lists of a rules folder; this rule is compiled alone")));
            }
        }
        if !is_kebab(&self.id) {
            errs.push(field("id", format!("id `{}` is not kebab-case (a-z, 0-9, single hyphens)", self.id)));
        }
        if self.description.trim().is_empty() {
            errs.push(field("description", "description is empty"));
        }
        let keywords = check_keywords(&self.keywords).map_err(|e| errs.push(e)).ok();
        let regex_keywords = keywords.as_deref().unwrap_or_default();
        let regex = match defer_regex {
            // Parsed and compiled by the first text that runs the rule: the built-in rules,
            // the only ones deferred, are loaded in full, every check made, by their tests.
            true => Some(RuleRegex::deferred(&self.regex, self.secret_group.clone(), regex_keywords)),
            false => self.regex_now(regex_keywords, &mut errs),
        };
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
        // All three compile when first needed where the rules' regexes do (the built-in rules,
        // checked by the test suite): at load they were a seventh of the empty run's work, and
        // most rules never judge a line or a decoding in a text.
        let allow = cache.allow_list("allow", &self.allow, defer_regex, &mut errs);
        let allow_line = cache.allow_list("allow_line", &self.allow_line, defer_regex, &mut errs);
        let allow_decoded = cache.allow_list("allow_decoded", &self.allow_decoded, defer_regex, &mut errs);
        match (regex, keywords) {
            (Some(regex), Some(keywords)) if errs.is_empty() => Ok(Rule {
                id: self.id,
                description: self.description,
                severity: self.severity,
                action: self.action.into(),
                regex,
                keywords,
                min_entropy: self.min_entropy,
                judge: self.judge.map(|j| j as f32),
                allow,
                allow_line,
                allow_repeated_user: self.allow_repeated_user,
                allow_decoded,
                tags: self.tags,
                must_match: self.must_match,
                must_not_match: self.must_not_match,
            }),
            _ => Err(errs),
        }
    }
}

impl RawRule {
    /// The rule's pattern parsed, checked and compiled now; each problem is added to `errs`
    /// (`regex` and `secret_group` keys, in that order).
    fn regex_now(&self, keywords: &[String], errs: &mut Vec<FieldError>) -> Option<RuleRegex> {
        let regex_errors_at = errs.len();
        let hir = parse_twin(&self.regex);
        if let Some(h) = &hir {
            if h.properties().minimum_len() == Some(0) {
                errs.push(field("regex", "regex can match the empty string"));
            }
        }
        let secret_group =
            hir.as_ref().and_then(|h| resolve_group(h, self.secret_group.as_ref()).map_err(|e| errs.push(e)).ok());
        // The regex that runs is the ASCII-boundary twin of the one written (same groups,
        // never larger), so only the twin is compiled; the one written is compiled when
        // the twin fails, to word the error in terms of what the author wrote. Its error
        // is listed first. A group that does not exist is an error already: the pattern
        // still compiles, to report its own.
        let twin = hir.map(|h| RuleRegex::compiled(Parsed::new(h, secret_group.unwrap_or(0)), keywords));
        match twin {
            Some(Ok(re)) => secret_group.map(|_| re),
            twin => {
                let twin_error = twin.and_then(Result::err);
                let e = compile_regex(&self.regex)
                    .err()
                    .or(twin_error)
                    .unwrap_or_else(|| "the pattern does not parse".into());
                errs.insert(regex_errors_at, field("regex", format!("bad regex: {e}")));
                None
            }
        }
    }
}

/// `pattern` parsed as the `regex` crate parses it, in its ASCII twin (see [`ascii_twin`]).
fn parse_twin(pattern: &str) -> Option<Hir> {
    regex_syntax::ParserBuilder::new().build().parse(pattern).ok().map(ascii_twin)
}

/// Whether capture group `group` spans every match of `hir` whole: the pattern is that
/// group, possibly between zero-width assertions (or inside other groups that are).
fn group_is_whole_match(hir: &Hir, group: usize) -> bool {
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
pub(crate) fn ascii_twin(hir: Hir) -> Hir {
    use regex_syntax::hir::{Class, HirKind, Look};
    // Taken apart by value: the tree is rebuilt around its own leaves, not copies of them
    // (copying every class and literal was most of what this cost at each start).
    match hir.into_kind() {
        HirKind::Look(l) => Hir::look(match l {
            Look::WordUnicode => Look::WordAscii,
            Look::WordUnicodeNegate => Look::WordAsciiNegate,
            Look::WordStartUnicode => Look::WordStartAscii,
            Look::WordEndUnicode => Look::WordEndAscii,
            Look::WordStartHalfUnicode => Look::WordStartHalfAscii,
            Look::WordEndHalfUnicode => Look::WordEndHalfAscii,
            other => other,
        }),
        HirKind::Class(Class::Unicode(c)) => Hir::class(Class::Unicode(ascii_letter_pair(&c).unwrap_or(c))),
        HirKind::Class(c) => Hir::class(c),
        HirKind::Empty => Hir::empty(),
        HirKind::Literal(l) => Hir::literal(l.0),
        HirKind::Repetition(r) => {
            Hir::repetition(regex_syntax::hir::Repetition { sub: Box::new(ascii_twin(*r.sub)), ..r })
        }
        HirKind::Capture(c) => Hir::capture(regex_syntax::hir::Capture { sub: Box::new(ascii_twin(*c.sub)), ..c }),
        HirKind::Concat(v) => Hir::concat(v.into_iter().map(ascii_twin).collect()),
        HirKind::Alternation(v) => Hir::alternation(v.into_iter().map(ascii_twin).collect()),
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

fn resolve_group(hir: &Hir, group: Option<&SecretGroup>) -> Result<usize, FieldError> {
    let groups = hir.properties().explicit_captures_len();
    match group {
        None => Ok(0),
        Some(SecretGroup::Index(i)) if *i <= groups => Ok(*i),
        Some(SecretGroup::Index(i)) => Err(field(
            "secret_group",
            format!("secret_group {i} does not exist: the regex has {groups} capture group(s)"),
        )),
        Some(SecretGroup::Name(n)) => group_named(hir, n)
            .ok_or_else(|| field("secret_group", format!("secret_group `{n}` names no capture group of the regex"))),
    }
}

/// The index of the capture group called `name` in `hir`.
fn group_named(hir: &Hir, name: &str) -> Option<usize> {
    match hir.kind() {
        HirKind::Capture(c) if c.name.as_deref() == Some(name) => Some(c.index as usize),
        HirKind::Capture(c) => group_named(&c.sub, name),
        HirKind::Repetition(r) => group_named(&r.sub, name),
        HirKind::Concat(parts) | HirKind::Alternation(parts) => parts.iter().find_map(|p| group_named(p, name)),
        HirKind::Empty | HirKind::Literal(_) | HirKind::Class(_) | HirKind::Look(_) => None,
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
