//! The compiled matcher behind a [`Ruleset`] and one-shot scanning.
//!
//! What a rule finds in a text (the definition both scanners implement): walk the start
//! positions left to right; at each, take the regex's leftmost-first match starting there,
//! if any. A match that holds one of the rule's keywords (ASCII case-insensitively) counts:
//! it becomes a finding unless the secret is below `min_entropy` or an `allow` regex
//! matches it, and the walk jumps past it. A match without a keyword does not count and
//! hides nothing: the walk moves on by one character. Rules without keywords count every
//! match. Canary strings form one extra pattern, an alternation of their literals.
//!
//! One-shot scanning finds every keyword occurrence first (with `keywords::KeywordFinder`
//! where AVX2 runs it, else an aho-corasick automaton); a rule with no hit cannot count any
//! match and is skipped, and a rule whose keyword reach is bounded (see
//! `keyword_reach`) is tried only in the regions before its hits (see `near_keywords`). The others, and
//! rules without keywords, take one unanchored pass over the text, which visits the same
//! positions (`Ruleset::pattern_matches`). The stream scanner calls that pass on its
//! window with a start bound, which is why streaming and one-shot results cannot drift.
//!
//! Every pattern runs on the raw text and, when it differs, on its rules view (see `canon`):
//! view findings are mapped back to raw spans, and one with the same rule and raw span as a
//! raw finding is left out. Canary strings are matched case-insensitively in their
//! rules-view form.

pub(crate) mod accept;
pub(crate) mod judge;
pub(crate) mod keyword_reach;
pub(crate) mod keyword_set;
pub(crate) mod keywords;
pub(crate) mod near_keywords;
pub(crate) mod secret_span;
pub(crate) mod start_filter;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, AhoCorasickKind, MatchKind};
use regex::{Regex, RegexBuilder};
use regex_automata::{Anchored, Input};
use regex_syntax::hir::Hir;

use crate::canon;
use crate::detect::{self, Detectors, Encoding, Rewrite, ScanContext};
use crate::rules::rule::{Canary, Rule, RuleRegex};
use crate::rules::ruleset::Ruleset;
use crate::scan::accept::{accept, KeywordCheck};
use crate::scan::keyword_set::KeywordSet;
use crate::scan::keywords::KeywordFinder;
use crate::scan::near_keywords::{found_in, RuleScratch, RuleSearch, Verdict};
use crate::stream::liveness::Live;
use crate::stream::pass::merge_findings;
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Size limit of the compiled canary alternation (bytes); canary tables can be long.
const CANARY_REGEX_LIMIT: usize = 16 << 20;

/// What a liveness automaton is built from: a rule's pattern (its regex's, shared, not
/// copied) or the canary alternation's.
#[derive(Debug)]
enum LivePattern {
    Rule(RuleRegex),
    Canary(Hir),
}

impl std::borrow::Borrow<Hir> for LivePattern {
    fn borrow(&self) -> &Hir {
        match self {
            LivePattern::Rule(regex) => regex.hir(),
            LivePattern::Canary(hir) => hir,
        }
    }
}

/// What a pattern id stands for: a rule (by index) or the canary alternation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum PatternKind {
    Rule(usize),
    Canary,
}

#[derive(Debug)]
pub(crate) struct CanaryMatcher {
    regex: Regex,
    /// canary string, as written or rewritten -> whose it is
    by_string: HashMap<String, CanaryString>,
}

/// The canaries that list a string, and how the string matched writes it.
#[derive(Debug, Default)]
struct CanaryString {
    canaries: Vec<usize>,
    /// None as listed; else the rewriting (backwards, ROT13) of a listed string.
    written: Option<Encoding>,
}

#[derive(Debug)]
pub(crate) struct Engine {
    /// Pattern ids: rules first, in rule order, then the canary pattern if any.
    pub(crate) patterns: Vec<PatternKind>,
    canary: Option<CanaryMatcher>,
    prefilter: Option<KeywordSearch>,
    /// prefilter pattern id -> rules that list this keyword
    keyword_rules: Vec<Vec<u32>>,
    /// prefilter pattern id -> the keyword's length in bytes
    keyword_lens: Vec<usize>,
    /// [rules] anchored searches for one-shot scanning near keyword hits, each made by the
    /// first text that runs its rule: most rules never run on a given input, and making
    /// one works out the rule's keyword reach and byte tables (a third of loading the
    /// built-in rules, when every search was made at load).
    searches: Vec<OnceLock<RuleSearch>>,
    /// Rules without keywords, which every one-shot scan runs (ascending).
    unkeyed: Vec<u32>,
    /// [patterns] the syntax the liveness automata are built from
    live_patterns: Vec<LivePattern>,
    /// The streaming liveness automata: determinising them is most of a ruleset's build
    /// time, and one-shot scanning never uses them, so they may be built on first use.
    live: OnceLock<Live>,
    /// Buffers of finished one-shot scans, for the next ones.
    scratch: Mutex<Vec<Scratch>>,
}

/// What a one-shot scan allocates, kept for the next scan: records of a few KB spent about
/// a tenth of their scanning time allocating these.
#[derive(Debug, Default)]
struct Scratch {
    /// [rules] keyword hits; empty between scans
    hits: Vec<Vec<(usize, usize)>>,
    /// The rules this scan runs: those with a keyword hit, then the unkeyed ones. A text
    /// hits a few dozen of several hundred rules, and a pass over every rule's state per
    /// text (a cache line each) cost about 3 % of a scan of LLM-style records.
    run: Vec<u32>,
    /// Entries `hits` has room for, all rules together.
    held: usize,
    /// one rule's start regions at a time
    regions: Vec<(usize, usize)>,
    /// [rules] what each rule's searches keep between texts
    rules: Vec<RuleScratch>,
}

/// Asks for the cache lines around `text[at]` ahead of their use: the rule pass reads the
/// bytes before a keyword hit in a text the keyword pass read long before, and those first
/// reads were most of the pass's own time once the batches grew. A hint that changes no
/// result and cannot fault; on an AVX2-only host it took 3-7 % off a scan of the
/// secret-dense corpus.
#[inline]
#[allow(unsafe_code)]
fn prefetch(text: &[u8], at: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in [at.saturating_sub(64), at] {
            if let Some(byte) = text.get(line) {
                // SAFETY: a prefetch reads nothing architecturally; the address is in `text`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(byte).cast()) };
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (text, at);
}

/// One rule's keyword hits in a batch of texts.
#[derive(Debug, Default)]
struct BatchHits {
    /// Every text's hits, one text after another.
    hits: Vec<(usize, usize)>,
    /// Each text that runs the rule (by index), and its range of `hits`.
    texts: Vec<(u32, usize, usize)>,
}

/// Scratch buffers kept at most: one per thread scanning at once, within reason.
const MAX_SCRATCH: usize = 64;

/// Hits and regions a kept scratch may hold room for (16 bytes each: 1 MiB).
const MAX_SCRATCH_ENTRIES: usize = 1 << 16;

impl Default for Engine {
    fn default() -> Self {
        Engine {
            patterns: Vec::new(),
            canary: None,
            prefilter: None,
            keyword_rules: Vec::new(),
            keyword_lens: Vec::new(),
            searches: Vec::new(),
            unkeyed: Vec::new(),
            live_patterns: Vec::new(),
            live: OnceLock::new(),
            scratch: Mutex::default(),
        }
    }
}

/// How one-shot scanning finds keyword occurrences.
#[derive(Debug)]
enum KeywordSearch {
    Filter(KeywordFinder),
    /// For keyword sets the filter declines.
    Automaton(AhoCorasick),
}

impl KeywordSearch {
    fn memory_usage(&self) -> usize {
        match self {
            KeywordSearch::Filter(f) => f.memory_usage(),
            KeywordSearch::Automaton(ac) => ac.memory_usage(),
        }
    }
}

/// Engine build errors: the rule index (None = the canary pattern) and why.
pub(crate) type EngineErrors = Vec<(Option<usize>, String)>;

/// When the streaming automata are built (see [`crate::LoadOptions::defer_streaming`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum LiveBuild {
    /// Now, every error reported against its rule.
    Now,
    /// On first use; a pattern whose automaton fails then is followed without one.
    OnFirstUse,
}

impl Engine {
    pub(crate) fn build(rules: &[Rule], canaries: &[Canary], when: LiveBuild) -> Result<Engine, EngineErrors> {
        let mut errors = Vec::new();
        let mut patterns: Vec<PatternKind> = (0..rules.len()).map(PatternKind::Rule).collect();
        let mut live_patterns: Vec<LivePattern> = rules.iter().map(|r| LivePattern::Rule(r.regex.clone())).collect();
        let canary = if canaries.is_empty() {
            None
        } else {
            match build_canaries(canaries) {
                Ok((m, hir)) => {
                    live_patterns.push(LivePattern::Canary(hir));
                    patterns.push(PatternKind::Canary);
                    Some(m)
                }
                Err(e) => {
                    errors.push((None, e));
                    None
                }
            }
        };
        let live = OnceLock::new();
        if when == LiveBuild::Now {
            match Live::build(&live_patterns) {
                Ok(l) => {
                    let _ = live.set(l);
                }
                Err(errs) => errors.extend(errs.into_iter().map(|(p, e)| (Some(p).filter(|&p| p < rules.len()), e))),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let (prefilter, keyword_rules, keyword_lens) = build_prefilter(rules).map_err(|e| vec![(None, e)])?;
        let searches = rules.iter().map(|_| OnceLock::new()).collect();
        let unkeyed = (0..rules.len()).filter(|&i| rules[i].keywords.is_empty()).map(|i| i as u32).collect();
        Ok(Engine {
            patterns,
            canary,
            prefilter,
            keyword_rules,
            keyword_lens,
            searches,
            unkeyed,
            live_patterns,
            live,
            scratch: Mutex::default(),
        })
    }

    /// Rule `i`'s search near keyword hits (`rule` is rule `i`), made on first use.
    fn search(&self, i: usize, rule: &Rule) -> Option<&RuleSearch> {
        self.searches.get(i).map(|search| search.get_or_init(|| RuleSearch::for_rule(rule)))
    }

    fn take_scratch(&self) -> Scratch {
        let kept = self.scratch.lock().unwrap_or_else(PoisonError::into_inner).pop();
        kept.unwrap_or_else(|| Scratch {
            hits: vec![Vec::new(); self.searches.len()],
            rules: self.searches.iter().map(|_| RuleScratch::default()).collect(),
            ..Scratch::default()
        })
    }

    fn give_back(&self, scratch: Scratch) {
        // A huge text's hit lists are not worth keeping for the small ones that follow.
        if scratch.held + scratch.regions.capacity() > MAX_SCRATCH_ENTRIES {
            return;
        }
        let mut kept = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < MAX_SCRATCH {
            kept.push(scratch);
        }
    }

    /// The streaming liveness automata, built now if they were deferred.
    pub(crate) fn live(&self) -> &Live {
        self.live.get_or_init(|| Live::build_lenient(&self.live_patterns))
    }

    /// Bytes held by the compiled automata (streaming DFAs once built, keyword prefilter).
    pub(crate) fn memory_usage(&self) -> usize {
        self.live.get().map_or(0, Live::memory_usage) + self.prefilter.as_ref().map_or(0, KeywordSearch::memory_usage)
    }
}

/// The keyword search, then per keyword id the rules that list it and its length.
type Prefilter = (Option<KeywordSearch>, Vec<Vec<u32>>, Vec<usize>);

fn build_prefilter(rules: &[Rule]) -> Result<Prefilter, String> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut keyword_rules: Vec<Vec<u32>> = Vec::new();
    for (i, r) in rules.iter().enumerate() {
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
        return Ok((None, keyword_rules, Vec::new()));
    }
    let mut words: Vec<(&str, usize)> = ids.into_iter().collect();
    words.sort_by_key(|&(_, id)| id);
    let words: Vec<&str> = words.into_iter().map(|(w, _)| w).collect();
    let lens = words.iter().map(|w| w.len()).collect();
    if let Some(finder) = KeywordFinder::build(&words).filter(KeywordFinder::is_accelerated) {
        return Ok((Some(KeywordSearch::Filter(finder)), keyword_rules, lens));
    }
    let ac = AhoCorasickBuilder::new()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::Standard)
        // A DFA walks prose about four times faster than the default NFA here (a few
        // hundred keywords); it costs memory once per ruleset.
        .kind(Some(AhoCorasickKind::DFA))
        .build(&words)
        .map_err(|e| format!("keyword automaton: {e}"))?;
    Ok((Some(KeywordSearch::Automaton(ac)), keyword_rules, lens))
}

/// Canary strings match case-insensitively, in their rules-view form: the pattern runs on
/// the raw text and on its rules view, so a canary that is upper-cased, spelt with
/// look-alikes or full-width forms, or cut by invisible characters is still found. Each is
/// also matched as each rewriting writes it (backwards, ROT13, Atbash, Caesar's cipher: see
/// `detect::rewrite`), unless that spells a listed string.
fn build_canaries(canaries: &[Canary]) -> Result<(CanaryMatcher, Hir), String> {
    let mut by_string: HashMap<String, CanaryString> = HashMap::new();
    for (i, c) in canaries.iter().enumerate() {
        for s in &c.strings {
            let folded = canon::rules_string(s, false).to_lowercase();
            let owners = &mut by_string.entry(folded).or_default().canaries;
            if !owners.contains(&i) {
                owners.push(i);
            }
        }
    }
    let listed: Vec<(String, Vec<usize>)> = by_string.iter().map(|(s, c)| (s.clone(), c.canaries.clone())).collect();
    for (s, owners) in listed {
        for r in Rewrite::ALL {
            let rewritten = r.apply(&s);
            let entry = by_string
                .entry(rewritten)
                .or_insert_with(|| CanaryString { written: Some(r.encoding()), ..CanaryString::default() });
            if entry.written.is_some() {
                for &i in &owners {
                    if !entry.canaries.contains(&i) {
                        entry.canaries.push(i);
                    }
                }
            }
        }
    }
    // Longest first, so that a canary containing another is reported whole.
    let mut strings: Vec<&String> = by_string.keys().filter(|s| !s.is_empty()).collect();
    strings.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    let pattern = format!("(?i:{})", strings.iter().map(|s| regex::escape(s)).collect::<Vec<_>>().join("|"));
    let regex = RegexBuilder::new(&pattern)
        .size_limit(CANARY_REGEX_LIMIT)
        .build()
        .map_err(|e| format!("canary strings: {e}"))?;
    let hir = regex_syntax::parse(&pattern).map_err(|e| format!("canary strings: {e}"))?;
    Ok((CanaryMatcher { regex, by_string }, hir))
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
        self.scan_layer(text, ctx, detectors, 0)
    }

    /// [`Ruleset::scan_with`] on a text found `depth` layers of encoding deep (see
    /// `detect::encoded`): below the surface, the entropy detector, which judges how the
    /// model generated the response, has nothing to read.
    pub(crate) fn scan_layer(
        &self,
        text: &str,
        ctx: &ScanContext,
        detectors: &Detectors,
        depth: usize,
    ) -> Vec<Finding> {
        self.finish_layer(text, ctx, detectors, depth, self.matches(text, ctx))
    }

    /// [`Ruleset::scan_with`] over many texts: each text's findings are exactly those
    /// `scan_with` gives it alone. The rules run rule by rule over the texts instead of
    /// text by text, so that a rule's automata and scratch stay in the processor's caches
    /// across every text that hits it: one text at a time visits a few dozen of several
    /// hundred rules, each time from memory.
    pub fn scan_batch_with(&self, texts: &[&str], ctx: &ScanContext, detectors: &Detectors) -> Vec<Vec<Finding>> {
        let raw = self.pattern_findings_batch(texts, ctx);
        texts
            .iter()
            .zip(raw)
            .map(|(text, mut out)| {
                self.view_findings(text, ctx, &mut out);
                self.finish_layer(text, ctx, detectors, 0, out)
            })
            .collect()
    }

    /// What [`Ruleset::scan_layer`] adds to the rules' and canaries' matches `out` in
    /// `text`: ownership settled, the detectors' findings, canonical order.
    fn finish_layer(
        &self,
        text: &str,
        ctx: &ScanContext,
        detectors: &Detectors,
        depth: usize,
        mut out: Vec<Finding>,
    ) -> Vec<Finding> {
        detect::table::scan(self, text, ctx, &mut out);
        detect::secret::settle(detectors.secrets.as_ref(), ctx, &mut out, |f| {
            canon::rules_string(text.get(f.start..f.end).unwrap_or(""), false)
        });
        detect::scan_text(self, text, ctx, detectors, depth, &mut out);
        Finding::sort(&mut out);
        out
    }

    /// The rules' and canaries' matches in `text` and in its rules view, candidates
    /// ([`Finding::is_candidate`]) included, before ownership has settled them.
    pub(crate) fn matches(&self, text: &str, ctx: &ScanContext) -> Vec<Finding> {
        let mut out = Vec::new();
        self.pattern_findings(text, ctx, &mut out);
        self.view_findings(text, ctx, &mut out);
        out
    }

    /// Adds the findings of the rules view of `text` (when it differs) that the raw pass did
    /// not make, at raw offsets.
    // Kept out of line: the raw pass is the hot path, and inlined as it was before the view.
    #[inline(never)]
    fn view_findings(&self, text: &str, ctx: &ScanContext, out: &mut Vec<Finding>) {
        let Some((view, map)) = canon::rules_view(text) else { return };
        let mut extra = Vec::new();
        self.pattern_findings(&view, ctx, &mut extra);
        for f in &mut extra {
            (f.start, f.end) = map.raw_span(f.start, f.end);
            (f.match_start, f.match_end) = map.raw_span(f.match_start, f.match_end);
        }
        merge_findings(out, extra, 0);
    }

    /// The secret rules' and canaries' findings in `text` (one pass, the raw text or a view).
    fn pattern_findings(&self, text: &str, ctx: &ScanContext, out: &mut Vec<Finding>) {
        let e = &self.engine;
        let mut scratch = e.take_scratch();
        let Scratch { hits, run, held, regions, rules } = &mut scratch;
        let held_before = self.rules_to_run(text, hits, run);
        for &i in run.iter() {
            let i = i as usize;
            self.rule_one_shot(i, text, &mut hits[i], regions, &mut rules[i], out);
            hits[i].clear();
        }
        *held = room_after(*held, held_before, hits, run);
        run.clear();
        e.give_back(scratch);
        if e.canary.is_some() {
            self.canary_matches(text, 0, 0, usize::MAX, ctx, out);
        }
    }

    /// Sets `run` to the rules `text` must run, in rule order (those with a keyword hit,
    /// whose hits are added to `hits`, and the unkeyed ones); returns what
    /// [`Ruleset::keyword_hits`] returns.
    fn rules_to_run(&self, text: &str, hits: &mut [Vec<(usize, usize)>], run: &mut Vec<u32>) -> usize {
        let held_before = self.keyword_hits(text, hits, run);
        run.extend_from_slice(&self.engine.unkeyed);
        // In rule order, as a pass over every rule would run them.
        run.sort_unstable();
        held_before
    }

    /// [`Ruleset::pattern_findings`] of each raw text, rule by rule over all of them.
    fn pattern_findings_batch(&self, texts: &[&str], ctx: &ScanContext) -> Vec<Vec<Finding>> {
        let e = &self.engine;
        let mut scratch = e.take_scratch();
        let Scratch { hits, run, held, regions, rules } = &mut scratch;
        // Gathered rule by rule, the pass below reads each rule's hits in one sequence:
        // kept with their texts, loading them missed the caches in a third of the pass's
        // own time.
        let mut by_rule: Vec<BatchHits> = self.rules.iter().map(|_| BatchHits::default()).collect();
        for (t, text) in texts.iter().enumerate() {
            let held_before = self.rules_to_run(text, hits, run);
            for &r in run.iter() {
                let (Some(batch), Some(list)) = (by_rule.get_mut(r as usize), hits.get_mut(r as usize)) else {
                    continue;
                };
                batch.texts.push((t as u32, batch.hits.len(), batch.hits.len() + list.len()));
                batch.hits.append(list);
            }
            *held = room_after(*held, held_before, hits, run);
            run.clear();
        }
        // Rule by rule; within a rule, text by text. Each text still sees its rules in rule
        // order, so its findings come out in the order `pattern_findings` gives them.
        let mut outs: Vec<Vec<Finding>> = texts.iter().map(|_| Vec::new()).collect();
        for (r, batch) in by_rule.iter_mut().enumerate() {
            for (k, &(t, from, to)) in batch.texts.iter().enumerate() {
                // The next text's first hit (an unkeyed rule's texts have none).
                if let Some(&(next, first, _)) = batch.texts.get(k + 1).filter(|&&(_, first, end)| first < end) {
                    if let (Some(text), Some(&(at, _))) = (texts.get(next as usize), batch.hits.get(first)) {
                        prefetch(text.as_bytes(), at);
                    }
                }
                let t = t as usize;
                if let (Some(text), Some(out), Some(hits)) =
                    (texts.get(t), outs.get_mut(t), batch.hits.get_mut(from..to))
                {
                    self.rule_one_shot(r, text, hits, regions, &mut rules[r], out);
                }
            }
        }
        e.give_back(scratch);
        if e.canary.is_some() {
            for (text, out) in texts.iter().zip(&mut outs) {
                self.canary_matches(text, 0, 0, usize::MAX, ctx, out);
            }
        }
        outs
    }

    /// Rule `i`'s one-shot findings in `text`, given every hit of its keywords there
    /// (`hits`, any order; sorted here). `regions` and `scratch` are scratch.
    fn rule_one_shot(
        &self,
        i: usize,
        text: &str,
        hits: &mut [(usize, usize)],
        regions: &mut Vec<(usize, usize)>,
        scratch: &mut RuleScratch,
        out: &mut Vec<Finding>,
    ) {
        let Some(rule) = self.rules.get(i) else { return };
        if hits.is_empty() && !rule.keywords.is_empty() {
            return;
        }
        let Some(search) = self.engine.search(i, rule) else { return };
        if search.reach.is_none() {
            rule_matches(rule, text, 0, 0, usize::MAX, out);
            return;
        }
        // By start only: what reads them (regions, the containment check) needs no order
        // among hits at one start, and the keyword filter reports them in order of start,
        // so this is a pass over them, not a sort (the automaton reports by end).
        if !hits.is_sorted_by_key(|&(start, _)| start) {
            hits.sort_unstable_by_key(|&(start, _)| start);
        }
        search.regions(text.as_bytes(), hits, regions);
        search
            .walk_regions(text, regions, scratch, |found| accept(rule, text, 0, found, KeywordCheck::Hits(hits), out));
    }

    /// How many findings rule `i` alone makes in `text`, found the way one-shot scanning
    /// finds them: what `rules test` counts per sample.
    pub(crate) fn rule_finding_count(&self, i: usize, text: &str) -> usize {
        let Some(rule) = self.rules.get(i) else { return 0 };
        let (mut hits, mut regions, mut out) = (own_keyword_hits(rule, text), Vec::new(), Vec::new());
        self.rule_one_shot(i, text, &mut hits, &mut regions, &mut RuleScratch::default(), &mut out);
        out.iter().filter(|f| !f.is_candidate()).count()
    }

    /// Adds to `hits` (`[rules]`, empty on entry) the `(start, end)` of each rule's keyword
    /// hits in text (unsorted), and to `touched` every rule that got one. Returns the room
    /// the touched rules' lists had before.
    fn keyword_hits(&self, text: &str, hits: &mut [Vec<(usize, usize)>], touched: &mut Vec<u32>) -> usize {
        let e = &self.engine;
        let mut room_before = 0;
        let mut add = |keyword: usize, start: usize| {
            let end = start + e.keyword_lens[keyword];
            for &r in &e.keyword_rules[keyword] {
                let rule_hits = &mut hits[r as usize];
                if rule_hits.is_empty() {
                    touched.push(r);
                    room_before += rule_hits.capacity();
                }
                rule_hits.push((start, end));
            }
        };
        match &e.prefilter {
            Some(KeywordSearch::Filter(f)) => f.for_each(text.as_bytes(), add),
            Some(KeywordSearch::Automaton(ac)) => {
                ac.find_overlapping_iter(text).for_each(|m| add(m.pattern().as_usize(), m.start()))
            }
            None => {}
        }
        room_before
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

    fn canary_matches(
        &self,
        hay: &str,
        base: usize,
        from: usize,
        until: usize,
        ctx: &ScanContext,
        out: &mut Vec<Finding>,
    ) -> usize {
        let Some(cm) = &self.engine.canary else { return from.max(until) };
        let mut at = from;
        while at <= hay.len() {
            let Some(m) = cm.regex.find_at(hay, at) else { break };
            if m.start() >= until {
                break;
            }
            let listed = cm.by_string.get(&m.as_str().to_lowercase());
            let owners: Vec<&Canary> =
                listed.into_iter().flat_map(|l| &l.canaries).filter_map(|&i| self.canaries.get(i)).collect();
            let foreign: Vec<String> =
                owners.iter().filter(|c| ctx.is_foreign(&c.owner)).map(|c| c.owner.clone()).collect();
            if let (Some(first), false) =
                (owners.iter().find(|c| ctx.is_foreign(&c.owner)), owners.iter().any(|c| !ctx.is_foreign(&c.owner)))
            {
                let detail = Detail::Foreign { shared_by: foreign.len(), owners: foreign };
                let (span, verdict) = ((base + m.start(), base + m.end()), (Severity::Critical, Action::Block));
                out.push(Finding {
                    encoding: listed.and_then(|l| l.written),
                    ..Finding::over(first.id.clone(), span, DetectorKind::Canary, verdict, mask(m.as_str()), detail)
                });
            }
            at = m.end().max(m.start() + 1);
        }
        at.max(until)
    }
}

/// The matches of one rule whose start lies in `[from, until)`, walked with one unanchored
/// pass; see [`Ruleset::pattern_matches`] and the module docs for what counts.
fn rule_matches(rule: &Rule, hay: &str, base: usize, from: usize, until: usize, out: &mut Vec<Finding>) -> usize {
    let mut at = from;
    let Some(regex) = rule.regex.get() else { return from.max(until) };
    // Made on first need: most rules with a group read their secret from the match alone.
    let mut caps = None;
    while at <= hay.len() {
        let input = Input::new(hay).span(at..hay.len());
        let found = match (rule.scan_group(), rule.split()) {
            (0, _) => regex.search(&input).map(|m| ((m.start(), m.end()), (m.start(), m.end()))),
            (_, Some(split)) => regex.search(&input).and_then(|m| {
                let whole = (m.start(), m.end());
                match split.secret(hay, whole) {
                    Some(secret) => Some((whole, secret)),
                    // The same match's captures: anchored where it starts, ending where it ends.
                    None => {
                        let caps = caps.get_or_insert_with(|| regex.create_captures());
                        regex.search_captures(&input.clone().span(m.range()).anchored(Anchored::Yes), caps);
                        found_in(caps, rule.scan_group())
                    }
                }
            }),
            (_, None) => {
                let caps = caps.get_or_insert_with(|| regex.create_captures());
                regex.search_captures(&input, caps);
                found_in(caps, rule.scan_group())
            }
        };
        let Some(found) = found else { break };
        let (ms, me) = found.0;
        if ms >= until {
            break;
        }
        at = match accept(rule, hay, base, found, KeywordCheck::Search, out) {
            // Rules cannot match the empty string (the loader rejects them), so this advances.
            Verdict::Taken => me.max(ms + 1),
            Verdict::Passed => next_char(hay, ms),
        };
    }
    at.max(until)
}

/// The room `hits` holds after a text ran the rules `run`, given `held` before it and
/// `held_before`, the room those rules' lists had then: only the lists of rules that ran
/// can have grown.
fn room_after(held: usize, held_before: usize, hits: &[Vec<(usize, usize)>], run: &[u32]) -> usize {
    (held + run.iter().map(|&r| hits[r as usize].capacity()).sum::<usize>()).saturating_sub(held_before)
}

/// Every occurrence of `rule`'s keywords in `text`, overlapping ones too, as `(start,
/// end)`: what the keyword pass reports for the rule, found directly in a short text.
fn own_keyword_hits(rule: &Rule, text: &str) -> Vec<(usize, usize)> {
    KeywordSet::new(&rule.keywords).hits(text.as_bytes())
}

/// The position of the character after the one starting at `at`.
fn next_char(hay: &str, at: usize) -> usize {
    hay.get(at..).and_then(|rest| rest.chars().next()).map_or(at + 1, |c| at + c.len_utf8())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition itself: one unanchored walk per rule over the whole text.
    fn reference(rules: &Ruleset, text: &str) -> Vec<Finding> {
        let mut out = Vec::new();
        for r in &rules.rules {
            rule_matches(r, text, 0, 0, usize::MAX, &mut out);
        }
        rules.canary_matches(text, 0, 0, usize::MAX, &ScanContext::anonymous(), &mut out);
        // What scanning without an ownership index does with candidates.
        out.retain(|f| !f.is_candidate());
        Finding::sort(&mut out);
        out
    }

    fn builtin() -> Option<Ruleset> {
        Ruleset::builtin().map_err(|e| eprintln!("{e}")).ok()
    }

    /// Every rule's search near keywords, made now where no scan made it yet.
    fn every_search(rules: &Ruleset) -> impl Iterator<Item = &RuleSearch> {
        rules.rules.iter().enumerate().filter_map(|(i, r)| rules.engine.search(i, r))
    }

    fn corpus_texts() -> Vec<String> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
        let mut texts = Vec::new();
        for f in ["answers.jsonl", "code.jsonl", "configs.jsonl", "logs.jsonl", "prose.jsonl"] {
            let body = std::fs::read_to_string(dir.join(f)).unwrap_or_default();
            let records: Vec<String> = body
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string))
                .collect();
            texts.push(records.join("\n\n"));
        }
        texts
    }

    /// A rule whose matches cannot be bounded near a keyword is searched over the whole
    /// text, which one such rule can make cost more than all the others together (the
    /// prose rule with `(?i:пароль)` took a quarter of a one-shot scan). None may be.
    #[test]
    fn every_builtin_rule_is_searched_near_its_keywords() {
        let Some(rules) = builtin() else { panic!("built-in rules do not load") };
        let unbounded: Vec<&str> =
            rules.rules().iter().filter(|r| r.regex.keyword_reach().is_none()).map(|r| r.id.as_str()).collect();
        assert_eq!(unbounded, Vec::<&str>::new());
    }

    /// Every stream of every tenant walks these automata, so their size is cache misses
    /// on the hot path. A bounded run of a broad class is a chain of states in the relaxed
    /// automaton; past 64 the relaxation drops its upper bound (`liveness::LONG_RUN`,
    /// which took the automata from 38.7 to 28.7 MiB), but a shorter one still costs, most
    /// around words: a name's `[A-Za-z0-9_.-]{0,24}(?:secret|key|token)` once took 7.9 MiB,
    /// a PEM key's `(?:Header: …){0,4}` 0.8 for each of eight rules, a provider's
    /// `paypal[A-Za-z0-9_.-]{0,16}secret[A-Za-z0-9_.-]{0,24}` 0.5 (4.4 over 56 such runs, which
    /// unbounded cost next to nothing), and a lazy broad class
    /// between a name and a copula (`password[^\n:=.;,]*?[ \t]ist`) 1.45. A rule that
    /// needs such a span should bound it tightly or lean on its keyword: left unbounded
    /// after a keyword, a run costs almost nothing. A run before a keyword that must stay
    /// bounded (keyword reach) can be bounded past 64 instead: `[A-Za-z0-9_.-]{0,40}password`
    /// as `{0,65}` took 2.9 MiB down to next to nothing (30.1 → 26.7 MiB with three more).
    #[test]
    fn the_builtin_streaming_automata_stay_within_their_budget() {
        let Some(rules) = builtin() else { panic!("built-in rules do not load") };
        let mib = rules.memory_usage() as f64 / f64::from(1 << 20);
        assert!(mib < 32.0, "built-in rules' automata take {mib:.1} MiB (budget 32 MiB; 29.9 MiB at 498 rules)");
    }

    /// Scans run only the rules their text hits, so a kept scratch must come back with
    /// every hit list empty and its room counted exactly: the bound on what is kept has
    /// to hold however many scans grew which rules' lists.
    /// The capture search is the oracle for every rule that reads its secret from the match
    /// alone: on the corpus, other scanners' samples (the peers' tuning split) and the
    /// rules' own samples, each match's secret is the group the regex engine captures.
    #[test]
    fn secrets_read_from_the_match_are_the_groups_the_regex_captures() {
        let Some(rules) = builtin() else { return };
        let peers = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/peers/tuning.jsonl");
        let peers = std::fs::read_to_string(peers).unwrap_or_default();
        let mut corpus = corpus_texts();
        corpus.extend(
            peers
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter_map(|v| v.get("text").and_then(|t| t.as_str()).map(str::to_string)),
        );
        assert!(corpus.len() > 1_000, "the peers' tuning split is missing");
        let mut checked = 0;
        let (mut after_text, mut left) = (0, 0);
        for r in &rules.rules {
            let Some(split) = r.split() else { continue };
            for text in corpus.iter().chain(&r.must_match) {
                let Some(regex) = r.regex.get() else { panic!("{} does not compile", r.id) };
                for caps in regex.captures_iter(text.as_str()) {
                    let (Some(m), Some(g)) = (caps.get_match(), caps.get_group(r.scan_group())) else { continue };
                    match split.secret(text, (m.start(), m.end())) {
                        Some(secret) => assert_eq!(secret, (g.start, g.end), "{}: {text:?}", r.id),
                        None => left += 1,
                    }
                    checked += 1;
                    after_text += usize::from(!split.always_splits());
                }
            }
        }
        eprintln!("{checked} matches, {after_text} with text before the secret, {left} left to the capture search");
        assert!(checked > 2_000 && after_text > 1_500, "{checked} matches, {after_text} with text before the secret");
        // What the split cannot tell comes from values that begin with a character the
        // separator can end with, or hold one: few.
        assert!(left * 20 < after_text, "{left} of {after_text} left to the capture search");
    }

    /// Most provider rules' secrets come from the match alone, without a capture search.
    #[test]
    fn most_provider_rules_read_their_secret_from_the_match() {
        let Some(rules) = builtin() else { return };
        let splits: Vec<(bool, bool)> = every_search(&rules).map(RuleSearch::splits).collect();
        let always = splits.iter().filter(|s| s.0).count();
        let mostly = splits.iter().filter(|s| s.1).count();
        eprintln!("{always} of {} rules always split, {mostly} mostly", rules.rules.len());
        assert!(always >= 150, "{always} rules split by their closing character");
        assert!(mostly >= always + 75, "{} rules with text before the secret split", mostly - always);
    }

    #[test]
    fn kept_scratch_is_empty_and_its_room_is_counted() {
        let Some(rules) = builtin() else { panic!("built-in rules do not load") };
        let kept = |rules: &Ruleset| rules.engine.scratch.lock().map(|k| k.len()).unwrap_or(0);
        for text in corpus_texts() {
            for part in text.split("\n\n").take(200) {
                rules.scan(part);
            }
        }
        assert_eq!(kept(&rules), 1);
        if let Ok(k) = rules.engine.scratch.lock() {
            for s in k.iter() {
                assert!(s.hits.iter().all(Vec::is_empty) && s.run.is_empty());
                assert_eq!(s.held, s.hits.iter().map(Vec::capacity).sum::<usize>());
            }
        }
        // 70,000 hits of one keyword: more room than a kept scratch may hold.
        rules.scan(&"token ".repeat(MAX_SCRATCH_ENTRIES + 5_000));
        assert_eq!(kept(&rules), 0, "a scratch grown past the bound was kept");
        rules.scan("api_key = 'x'");
        assert_eq!(kept(&rules), 1);
    }

    /// Texts made to keep the walk busy: each built-in rule's samples cut short of a
    /// match (the last character dropped, or replaced by a byte that closes no match), over
    /// and over. A walk that tried each keyword hit anchored read the rest of the run from
    /// each (`token=` 80,000 times, then `<`: 29 s for 480 KB), quadratic in the text; now
    /// no walk reads a byte more than a few times (see `near_keywords`), and the findings
    /// stay those of the whole-text walk.
    #[test]
    fn no_text_makes_a_walk_read_its_bytes_more_than_a_bounded_number_of_times() {
        let Some(rules) = builtin() else { panic!("built-in rules do not load") };
        let mut fragments = vec!["token=".to_owned(), "password=".to_owned()];
        for rule in rules.rules() {
            for sample in rule.must_match.iter().take(2) {
                let mut cut = sample.trim().to_owned();
                cut.pop();
                if cut.len() >= 4 {
                    fragments.extend(["", "<", "(", "[", ",", " "].map(|end| format!("{cut}{end}")));
                }
            }
        }
        // TRIES_PER_RUN + 2 today (a try or a pass per byte more than the tries), with room
        // for the tries to grow to 16; the unbounded walk read 236 times per byte here.
        let bound = 18.0;
        const { assert!(near_keywords::TRIES_PER_RUN + 2 <= 18) };
        let mut worst = (0.0, String::new());
        for fragment in &fragments {
            // Ended by a byte that closes none of them: `$` cannot end the last one either.
            let text = fragment.repeat(2048 / fragment.len() + 1) + "<";
            near_keywords::MOST_READ_PER_BYTE.with(|m| m.set(0.0));
            // The raw text's pass alone: the rules view (Cyrillic read as Latin
            // look-alikes) adds matches of its own, which the reference does not look for.
            let mut found = Vec::new();
            rules.pattern_findings(&text, &ScanContext::anonymous(), &mut found);
            found.retain(|f| !f.is_candidate());
            Finding::sort(&mut found);
            let per_byte = near_keywords::MOST_READ_PER_BYTE.with(std::cell::Cell::get);
            if per_byte > worst.0 {
                worst = (per_byte, fragment.clone());
            }
            assert!(per_byte <= bound, "{per_byte:.1} reads per byte (bound {bound}) on {fragment:?} repeated");
            assert_eq!(found, reference(&rules, &text), "{fragment:?} repeated");
        }
        eprintln!("{} texts; most reads per byte {:.1}, on {:?} repeated", fragments.len(), worst.0, worst.1);
    }

    #[test]
    fn windowed_one_shot_equals_the_whole_text_walk_on_the_corpus() {
        let rules = builtin();
        assert!(rules.is_some(), "built-in rules do not load");
        let Some(rules) = rules else { return };
        let bounded = every_search(&rules).filter(|s| s.reach.is_some()).count();
        eprintln!("{bounded} of {} rules have a bounded keyword reach", rules.len());
        let texts = corpus_texts();
        assert!(texts.iter().all(|t| t.len() > 100_000), "corpus files missing");
        for text in &texts {
            let got = rules.scan(text);
            assert!(!got.is_empty());
            assert_eq!(got, reference(&rules, text));
        }
    }
}
