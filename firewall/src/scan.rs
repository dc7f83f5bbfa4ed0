//! The compiled matcher behind a [`Ruleset`] and one-shot scanning.
//!
//! A scan has three stages: an aho-corasick automaton over every keyword (ASCII
//! case-insensitive) selects candidate rules; each candidate's regex runs leftmost-first over
//! the text; each match is confirmed (a keyword inside the match, `min_entropy` over the
//! secret, no `allow` regex matching the secret). Rules without keywords are always
//! candidates. Canary strings form one extra pattern, an alternation of their literals.
//!
//! [`Ruleset::pattern_matches`] is the single place where a pattern's matches are found and
//! confirmed; the stream scanner calls it on its window with a start bound, which is why
//! streaming and one-shot results cannot drift apart.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use regex::{Regex, RegexBuilder};

use crate::detect::{self, Detectors, ScanContext};
use crate::live::{Live, LiveDfa};
use crate::rule::{shannon_entropy, Canary, Rule};
use crate::ruleset::{LoadError, Ruleset};
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Size limit of the compiled canary alternation (bytes); canary tables can be long.
const CANARY_REGEX_LIMIT: usize = 16 << 20;

/// What a pattern id stands for: a rule (by index) or the canary alternation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PatternKind {
    Rule(usize),
    Canary,
}

#[derive(Debug)]
pub(crate) struct CanaryMatcher {
    regex: Regex,
    /// canary string -> indices of the canaries that list it
    by_string: HashMap<String, Vec<usize>>,
}

#[derive(Debug)]
pub(crate) struct Engine {
    /// Pattern ids: rules first, in rule order, then the canary pattern if any.
    pub(crate) patterns: Vec<PatternKind>,
    canary: Option<CanaryMatcher>,
    prefilter: Option<AhoCorasick>,
    /// prefilter pattern id -> rules that list this keyword
    keyword_rules: Vec<Vec<u32>>,
    /// rules without keywords
    always: Vec<u32>,
    pub(crate) live: Live,
}

impl Default for Engine {
    fn default() -> Self {
        Engine { patterns: Vec::new(), canary: None, prefilter: None, keyword_rules: Vec::new(), always: Vec::new(), live: Live::new(Vec::new()) }
    }
}

/// Engine build errors: the rule index (None = the canary pattern) and why.
pub(crate) type EngineErrors = Vec<(Option<usize>, String)>;

impl Engine {
    pub(crate) fn build(rules: &[Rule], canaries: &[Canary]) -> Result<Engine, EngineErrors> {
        let mut errors = Vec::new();
        let mut dfas = Vec::new();
        let mut patterns = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            match LiveDfa::build(&r.hir) {
                Ok(d) => dfas.push(d),
                Err(e) => errors.push((Some(i), e)),
            }
            patterns.push(PatternKind::Rule(i));
        }
        let canary = if canaries.is_empty() {
            None
        } else {
            match build_canaries(canaries) {
                Ok((m, d)) => {
                    dfas.push(d);
                    patterns.push(PatternKind::Canary);
                    Some(m)
                }
                Err(e) => {
                    errors.push((None, e));
                    None
                }
            }
        };
        if !errors.is_empty() {
            return Err(errors);
        }
        let (prefilter, keyword_rules, always) = build_prefilter(rules).map_err(|e| vec![(None, e)])?;
        Ok(Engine { patterns, canary, prefilter, keyword_rules, always, live: Live::new(dfas) })
    }

    pub(crate) fn memory_usage(&self) -> usize {
        self.live.memory_usage() + self.prefilter.as_ref().map_or(0, AhoCorasick::memory_usage)
    }
}

type Prefilter = (Option<AhoCorasick>, Vec<Vec<u32>>, Vec<u32>);

fn build_prefilter(rules: &[Rule]) -> Result<Prefilter, String> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut keyword_rules: Vec<Vec<u32>> = Vec::new();
    let mut always = Vec::new();
    for (i, r) in rules.iter().enumerate() {
        if r.keywords.is_empty() {
            always.push(i as u32);
        }
        for k in &r.keywords {
            let id = *ids.entry(k.as_str()).or_insert_with(|| {
                keyword_rules.push(Vec::new());
                keyword_rules.len() - 1
            });
            if !keyword_rules[id].contains(&(i as u32)) {
                keyword_rules[id].push(i as u32);
            }
        }
    }
    if keyword_rules.is_empty() {
        return Ok((None, keyword_rules, always));
    }
    let mut words: Vec<(&str, usize)> = ids.into_iter().collect();
    words.sort_by_key(|&(_, id)| id);
    let ac = AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::Standard)
        .build(words.iter().map(|(w, _)| w))
        .map_err(|e| format!("keyword automaton: {e}"))?;
    Ok((Some(ac), keyword_rules, always))
}

fn build_canaries(canaries: &[Canary]) -> Result<(CanaryMatcher, LiveDfa), String> {
    let mut by_string: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, c) in canaries.iter().enumerate() {
        for s in &c.strings {
            by_string.entry(s.clone()).or_default().push(i);
        }
    }
    // Longest first, so that a canary containing another is reported whole.
    let mut strings: Vec<&String> = by_string.keys().collect();
    strings.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    let pattern = strings.iter().map(|s| regex::escape(s)).collect::<Vec<_>>().join("|");
    let regex = RegexBuilder::new(&pattern).size_limit(CANARY_REGEX_LIMIT).build().map_err(|e| format!("canary strings: {e}"))?;
    let hir = regex_syntax::parse(&pattern).map_err(|e| format!("canary strings: {e}"))?;
    Ok((CanaryMatcher { regex, by_string }, LiveDfa::build(&hir)?))
}

impl Ruleset {
    /// One-shot scan of a complete text with the secret rules and canaries (every canary
    /// counts as foreign: there is no responding tenant). Findings in canonical order.
    pub fn scan(&self, text: &str) -> Vec<Finding> {
        self.scan_with(text, &ScanContext::anonymous(), &Detectors::default())
    }

    /// One-shot scan with a tenant context and detectors; a [`crate::StreamScanner`] fed the
    /// same text in any chunking reports exactly these findings (token-signal detectors
    /// aside, which need a stream).
    pub fn scan_with(&self, text: &str, ctx: &ScanContext, detectors: &Detectors) -> Vec<Finding> {
        let mut out = Vec::new();
        for p in self.candidate_patterns(text) {
            self.pattern_matches(p, text, 0, 0, usize::MAX, ctx, &mut out);
        }
        detect::scan_text(text, ctx, detectors, &mut out);
        Finding::sort(&mut out);
        out
    }

    /// Pattern ids worth running on `text`: rules with a keyword in it, rules without
    /// keywords, and the canary pattern.
    fn candidate_patterns(&self, text: &str) -> Vec<usize> {
        let e = &self.engine;
        let mut hit = vec![false; self.rules.len()];
        for &r in &e.always {
            hit[r as usize] = true;
        }
        if let Some(ac) = &e.prefilter {
            for m in ac.find_overlapping_iter(text) {
                for &r in &e.keyword_rules[m.pattern().as_usize()] {
                    hit[r as usize] = true;
                }
            }
        }
        let mut out: Vec<usize> = (0..hit.len()).filter(|&i| hit[i]).collect();
        if e.canary.is_some() {
            out.push(self.rules.len());
        }
        out
    }

    /// Finds and confirms the matches of pattern `p` in `hay` that start at or after `from`
    /// and before `until` (leftmost-first, non-overlapping, like `captures_iter`). Offsets in
    /// findings are `base + offset in hay`. Returns where the next search must begin.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn pattern_matches(
        &self,
        p: usize,
        hay: &str,
        base: usize,
        from: usize,
        until: usize,
        ctx: &ScanContext,
        out: &mut Vec<Finding>,
    ) -> usize {
        match self.engine.patterns.get(p) {
            Some(PatternKind::Rule(i)) => rule_matches(&self.rules[*i], hay, base, from, until, out),
            Some(PatternKind::Canary) => self.canary_matches(hay, base, from, until, ctx, out),
            None => from.max(until),
        }
    }

    fn canary_matches(&self, hay: &str, base: usize, from: usize, until: usize, ctx: &ScanContext, out: &mut Vec<Finding>) -> usize {
        let Some(cm) = &self.engine.canary else { return from.max(until) };
        let mut at = from;
        while at <= hay.len() {
            let Some(m) = cm.regex.find_at(hay, at) else { break };
            if m.start() >= until {
                break;
            }
            let owners: Vec<&Canary> = cm.by_string.get(m.as_str()).into_iter().flatten().filter_map(|&i| self.canaries.get(i)).collect();
            let foreign: Vec<String> = owners.iter().filter(|c| ctx.is_foreign(&c.owner)).map(|c| c.owner.clone()).collect();
            if let (Some(first), false) = (owners.iter().find(|c| ctx.is_foreign(&c.owner)), owners.iter().any(|c| !ctx.is_foreign(&c.owner))) {
                out.push(Finding {
                    rule_id: first.id.clone(),
                    start: base + m.start(),
                    end: base + m.end(),
                    match_start: base + m.start(),
                    match_end: base + m.end(),
                    severity: Severity::Critical,
                    action: Action::Block,
                    excerpt: mask(m.as_str()),
                    kind: DetectorKind::Canary,
                    detail: Detail::Foreign { shared_by: foreign.len(), owners: foreign },
                });
            }
            at = m.end().max(m.start() + 1);
        }
        at.max(until)
    }

    /// Runs every rule's samples and reports per rule.
    pub fn run_samples(&self) -> SampleReport {
        let rules = self
            .rules
            .iter()
            .zip(&self.origins)
            .map(|(rule, origin)| {
                let mut failures = Vec::new();
                let count = |text: &str| {
                    let mut v = Vec::new();
                    rule_matches(rule, text, 0, 0, usize::MAX, &mut v);
                    v.len()
                };
                for (k, s) in rule.must_match.iter().enumerate() {
                    if count(s) == 0 {
                        let line = origin.must_match_lines.get(k).copied().unwrap_or(origin.line);
                        failures.push(SampleFailure { line, index: k + 1, sample: s.clone(), expect_match: true, found: 0 });
                    }
                }
                for (k, s) in rule.must_not_match.iter().enumerate() {
                    let found = count(s);
                    if found > 0 {
                        let line = origin.must_not_match_lines.get(k).copied().unwrap_or(origin.line);
                        failures.push(SampleFailure { line, index: k + 1, sample: s.clone(), expect_match: false, found });
                    }
                }
                let total = rule.must_match.len() + rule.must_not_match.len();
                RuleSamples { rule_id: rule.id.clone(), file: origin.file.clone(), line: origin.line, passed: total - failures.len(), failures }
            })
            .collect();
        SampleReport { rules }
    }
}

/// The confirmed matches of one rule; see [`Ruleset::pattern_matches`].
fn rule_matches(rule: &Rule, hay: &str, base: usize, from: usize, until: usize, out: &mut Vec<Finding>) -> usize {
    let mut at = from;
    let mut locs = rule.regex.capture_locations();
    while at <= hay.len() {
        let found = if rule.secret_group == 0 {
            rule.regex.find_at(hay, at).map(|m| (m.start(), m.end(), m.start(), m.end()))
        } else {
            rule.regex.captures_read_at(&mut locs, hay, at).map(|m| {
                let (s, e) = locs.get(rule.secret_group).unwrap_or((m.start(), m.end()));
                (m.start(), m.end(), s, e)
            })
        };
        let Some((ms, me, ss, se)) = found else { break };
        if ms >= until {
            break;
        }
        if let Some(f) = confirm(rule, hay, base, (ms, me), (ss, se)) {
            out.push(f);
        }
        // Rules cannot match the empty string (the loader rejects them), so this advances.
        at = me.max(ms + 1);
    }
    at.max(until)
}

/// Keyword inside the match, entropy and allowlist over the secret.
fn confirm(rule: &Rule, hay: &str, base: usize, (ms, me): (usize, usize), (ss, se): (usize, usize)) -> Option<Finding> {
    let whole = hay.get(ms..me)?;
    let secret = hay.get(ss..se)?;
    if !rule.keywords.is_empty() {
        let lower = whole.to_ascii_lowercase();
        if !rule.keywords.iter().any(|k| lower.contains(k.as_str())) {
            return None;
        }
    }
    if rule.min_entropy.is_some_and(|min| shannon_entropy(secret) < min) {
        return None;
    }
    if rule.allow.iter().any(|a| a.is_match(secret)) {
        return None;
    }
    Some(Finding {
        rule_id: rule.id.clone(),
        start: base + ss,
        end: base + se,
        match_start: base + ms,
        match_end: base + me,
        severity: rule.severity,
        action: rule.action,
        excerpt: mask(secret),
        kind: DetectorKind::Secret,
        detail: Detail::None,
    })
}

/// Per-rule outcome of `rules test`.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleReport {
    pub rules: Vec<RuleSamples>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RuleSamples {
    pub rule_id: String,
    pub file: String,
    pub line: usize,
    pub passed: usize,
    pub failures: Vec<SampleFailure>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SampleFailure {
    pub line: usize,
    /// 1-based position in its list.
    pub index: usize,
    pub sample: String,
    /// true: a `must_match` sample that found nothing; false: a `must_not_match` that matched.
    pub expect_match: bool,
    pub found: usize,
}

impl SampleFailure {
    pub fn reason(&self) -> String {
        if self.expect_match {
            format!("must_match sample {} found nothing: {:?}", self.index, self.sample)
        } else {
            format!("must_not_match sample {} matched ({} finding(s)): {:?}", self.index, self.found, self.sample)
        }
    }
}

impl SampleReport {
    pub fn failed(&self) -> usize {
        self.rules.iter().map(|r| r.failures.len()).sum()
    }

    pub fn passed(&self) -> usize {
        self.rules.iter().map(|r| r.passed).sum()
    }

    /// The failures as loader errors (file:line, rule id, reason).
    pub fn into_errors(self) -> Vec<LoadError> {
        self.rules
            .into_iter()
            .flat_map(|r| {
                let (file, id) = (r.file, r.rule_id);
                r.failures.into_iter().map(move |f| LoadError { file: file.clone(), line: f.line, rule_id: Some(id.clone()), reason: f.reason() })
            })
            .collect()
    }
}
