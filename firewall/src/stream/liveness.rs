//! Liveness: which positions of a stream could still be the start of a match.
//!
//! For every pattern we build an *anchored* dense DFA of a relaxed version of its regex:
//! look-around assertions are dropped, non-ASCII parts of large classes widen to "any
//! non-ASCII character" (small ones, such as the case pairs of `(?i:пароль)`, are kept:
//! widened, every Cyrillic letter started a thread of such a rule), and a repetition counted
//! past [`LONG_RUN`] loses its upper bound (`[A-Za-z0-9]{20,2048}` was 2,048 states; `{20,}`
//! is 20, and a thread lives on only in a run longer than the bound, up to the holdback
//! limit). The relaxed language contains every string the real regex can
//! match, so "no relaxed thread started at `p` is alive" soundly proves "no match can start
//! at `p` and use bytes we have not seen yet". Being relaxed only ever costs holdback.
//! Opening look-arounds are kept outside the automaton, as conditions on where a thread may
//! start: the pattern's [`StartFilter`] tells, per first byte, under which openings (line
//! start, ASCII word boundary…) a real match can begin with it, and a thread starts only
//! where one of them holds. Without that, a rule opening with `(?:^|[ \t;])` or `\b`
//! started a thread at every letter, and counted repetitions such as `[A-Za-z0-9_.-]{1,64}:`
//! kept one thread per letter of every word alive.
//! A pattern whose automaton could not be built (only when building was deferred, see
//! [`Live::build_lenient`]) is followed as "in progress anywhere".
//!
//! [`Threads`] runs one anchored thread per (pattern, start position) over the stream, byte
//! by byte, keeping only live ones. Most threads die on their second byte (a rule opening
//! with `(?:^|[^A-Za-z0-9])` starts one at every space and every non-ASCII character), so a
//! thread is made only once its first two bytes are known to keep it alive: a table of byte
//! pairs gives, for the two bytes, the patterns that survive them and the state they reach.
//! Until then the last byte is a *pending* start, which counts as live for the holdback. Two threads of one pattern in the same DFA state have
//! the same future, so only the earlier start is kept: the thread set stays small (bounded
//! by the number of DFA states), and the earliest live start is simply the first thread.
//! A thread that passes through a match state reports `(pattern, start)`, which tells the
//! scanner which patterns are worth confirming with the real regex.

use std::borrow::Borrow;

use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::primitives::StateID;
use regex_automata::{Anchored, Input, MatchKind};
use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Repetition};

use crate::scan::start_filter::{Openings, StartFilter};

/// Size limit for one pattern's liveness DFA and for its determinisation (bytes).
pub const LIVE_DFA_LIMIT: usize = 16 << 20;

/// Longest bounded repetition the liveness automata count out; a longer one is relaxed to
/// no upper bound.
const LONG_RUN: u32 = 64;

/// Over-approximates `hir`: same or larger language, no look-around, small classes, no
/// upper bound on long repetitions.
pub(crate) fn relax(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Look(_) => Hir::empty(),
        HirKind::Empty | HirKind::Literal(_) => hir.clone(),
        HirKind::Class(Class::Unicode(c)) => Hir::class(Class::Unicode(widen(c))),
        HirKind::Class(Class::Bytes(_)) => hir.clone(),
        HirKind::Repetition(r) => {
            // A long bounded run is one state per count; its upper bound only ends a thread
            // early, so dropping it loses no match and holds back only runs longer than it.
            let max = r.max.filter(|&m| m <= LONG_RUN);
            Hir::repetition(Repetition { min: r.min, max, greedy: r.greedy, sub: Box::new(relax(&r.sub)) })
        }
        HirKind::Capture(c) => relax(&c.sub),
        HirKind::Concat(v) => Hir::concat(v.iter().map(relax).collect()),
        HirKind::Alternation(v) => Hir::alternation(v.iter().map(relax).collect()),
    }
}

/// The most non-ASCII code points a class may hold and still be followed exactly.
const EXACT_CLASS_MAX: u32 = 64;

/// Whether relaxing keeps `c` as it is: it is ASCII, or its non-ASCII part is small enough
/// to cost the automaton little.
pub(crate) fn keeps_exact(c: &ClassUnicode) -> bool {
    let non_ascii: u32 = c
        .ranges()
        .iter()
        .filter(|r| r.end() as u32 >= 0x80)
        .map(|r| r.end() as u32 - (r.start() as u32).max(0x80) + 1)
        .sum();
    non_ascii <= EXACT_CLASS_MAX
}

/// Keeps the ASCII part of a class and replaces a large non-ASCII part by all of non-ASCII.
fn widen(c: &ClassUnicode) -> ClassUnicode {
    if keeps_exact(c) {
        return c.clone();
    }
    let mut ranges: Vec<ClassUnicodeRange> = c
        .ranges()
        .iter()
        .filter(|r| (r.start() as u32) < 0x80)
        .map(|r| ClassUnicodeRange::new(r.start(), r.end().min('\u{7f}')))
        .collect();
    ranges.push(ClassUnicodeRange::new('\u{80}', '\u{10FFFF}'));
    ClassUnicode::new(ranges)
}

/// One pattern's anchored liveness automaton.
#[derive(Clone, Debug)]
pub(crate) struct LiveDfa {
    dfa: dense::DFA<Vec<u32>>,
    start: StateID,
}

impl LiveDfa {
    pub(crate) fn build(hir: &Hir) -> Result<LiveDfa, String> {
        let nfa = thompson::Compiler::new()
            .configure(thompson::Config::new().which_captures(WhichCaptures::None))
            .build_from_hir(&relax(hir))
            .map_err(|e| format!("streaming automaton: {e}"))?;
        let dfa = dense::Builder::new()
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(LIVE_DFA_LIMIT))
                    .determinize_size_limit(Some(LIVE_DFA_LIMIT)),
            )
            .build_from_nfa(&nfa)
            .map_err(|e| format!("streaming automaton over {} MiB limit or invalid: {e}", LIVE_DFA_LIMIT >> 20))?;
        let start = dfa
            .start_state_forward(&Input::new("").anchored(Anchored::Yes))
            .map_err(|e| format!("streaming automaton start: {e}"))?;
        Ok(LiveDfa { dfa, start })
    }

    pub(crate) fn memory_usage(&self) -> usize {
        self.dfa.memory_usage()
    }
}

/// All patterns' automata plus, per first byte and per pair of first bytes, the patterns a
/// thread can start with.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    // [patterns] None: no automaton could be built; the pattern may be in progress anywhere
    dfas: Vec<Option<LiveDfa>>,
    // [256][patterns that survive this first byte, with the openings under which a match
    // of theirs may begin with it]
    first: Vec<Vec<FirstByte>>,
    // [256] the union of `first[b]`'s openings, patterns with an automaton only: whether a
    // byte is a pending start
    pending_openings: Vec<Openings>,
    // [first byte << 8 | second byte] the range of `pairs` for that pair of bytes
    pair_ranges: Vec<u32>,
    // the patterns (with an automaton) that a first byte starts and a second byte keeps
    // alive or completes
    pairs: Vec<SecondByte>,
}

/// A pattern a thread may start with at some byte, and where.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FirstByte {
    pattern: u32,
    openings: Openings,
    // false: followed without an automaton, spawned at once
    automaton: bool,
}

/// A pattern started by a pair of bytes: where the first may open a match, the state after
/// both, and what the second byte did.
#[derive(Clone, Copy, Debug)]
struct SecondByte {
    pattern: u32,
    openings: Openings,
    state: StateID,
    // the relaxed pattern matched the first byte alone (reported when the second is seen)
    matched: bool,
    // the thread goes on after the second byte
    alive: bool,
}

impl Live {
    /// Determinises every pattern's automaton (the costly part of loading a ruleset); the
    /// errors name the pattern index.
    pub(crate) fn build<H: Borrow<Hir>>(patterns: &[H]) -> Result<Live, Vec<(usize, String)>> {
        let mut dfas = Vec::with_capacity(patterns.len());
        let mut errors = Vec::new();
        for (p, hir) in patterns.iter().enumerate() {
            match LiveDfa::build(hir.borrow()) {
                Ok(d) => dfas.push(Some(d)),
                Err(e) => errors.push((p, e)),
            }
        }
        if errors.is_empty() {
            Ok(Live::from_automata(dfas, patterns))
        } else {
            Err(errors)
        }
    }

    /// Like [`Live::build`], for patterns that were never checked: a pattern whose
    /// automaton cannot be built is followed as "in progress everywhere" (sound, only
    /// slower: its candidates wait for the holdback limit).
    pub(crate) fn build_lenient<H: Borrow<Hir>>(patterns: &[H]) -> Live {
        Live::from_automata(patterns.iter().map(|hir| LiveDfa::build(hir.borrow()).ok()).collect(), patterns)
    }

    /// `dfas[p]` is the automaton of `patterns[p]`, if it could be built.
    fn from_automata<H: Borrow<Hir>>(dfas: Vec<Option<LiveDfa>>, patterns: &[H]) -> Live {
        let mut first = vec![Vec::new(); 256];
        for (p, d) in dfas.iter().enumerate() {
            // Relaxing drops look-around; the opening ones are put back as spawn conditions.
            let filter = patterns.get(p).map(|hir| StartFilter::of(hir.borrow()));
            for b in 0..=255u8 {
                if d.as_ref().is_none_or(|d| !d.dfa.is_dead_state(d.dfa.next_state(d.start, b))) {
                    // The filter's bytes are the automaton's (a test checks it); should they
                    // ever disagree, the automaton's byte starts anywhere.
                    let openings = filter.as_ref().map_or(Openings::ANYWHERE, |f| f.openings(b));
                    let openings = if openings.is_none() { Openings::ANYWHERE } else { openings };
                    first[b as usize].push(FirstByte { pattern: p as u32, openings, automaton: d.is_some() });
                }
            }
        }
        let pending_openings = first
            .iter()
            .map(|starts| starts.iter().filter(|f| f.automaton).fold(Openings::NONE, |all, f| all.or(f.openings)))
            .collect();
        let mut pair_ranges = Vec::with_capacity(1 << 16 | 1);
        let mut pairs = Vec::new();
        pair_ranges.push(0);
        for (b1, starts) in (0..=255u8).zip(&first) {
            for b2 in 0..=255u8 {
                for f in starts.iter().filter(|f| f.automaton) {
                    let Some(Some(d)) = dfas.get(f.pattern as usize) else { continue };
                    let state = d.dfa.next_state(d.dfa.next_state(d.start, b1), b2);
                    let matched = d.dfa.is_match_state(state);
                    let alive = !(d.dfa.is_dead_state(state) || matched && dies_after(&d.dfa, state));
                    if matched || alive {
                        pairs.push(SecondByte { pattern: f.pattern, openings: f.openings, state, matched, alive });
                    }
                }
                pair_ranges.push(pairs.len() as u32);
            }
        }
        Live { dfas, first, pending_openings, pair_ranges, pairs }
    }

    pub(crate) fn memory_usage(&self) -> usize {
        self.dfas.iter().flatten().map(LiveDfa::memory_usage).sum()
    }
}

#[derive(Clone, Copy, Debug)]
struct Thread {
    pattern: u32,
    start: usize,
    state: StateID,
}

/// The live anchored threads of one stream, in increasing start order.
#[derive(Debug, Default, Clone)]
pub(crate) struct Threads {
    live: Vec<Thread>,
    scratch: Vec<Thread>,
    // [patterns] the first state each pattern took during the step `step`: most patterns
    // have one thread at a time, whose uniqueness this settles without hashing
    first_taken: Vec<FirstTaken>,
    step: u32,
    // (pattern, state) pairs already in `scratch` during one step, for the patterns that
    // took a second state
    seen: StepSet,
    // the byte stepped last, for word boundaries; None at the start of the stream
    prev: Option<u8>,
    // the byte before it (None when `prev` is the first)
    prev_prev: Option<u8>,
    // the position of `prev` when a match may start there (its thread, if it lives, is
    // made with the next byte)
    pending: Option<usize>,
}

/// The first state a pattern took during one step.
#[derive(Debug, Default, Clone, Copy)]
struct FirstTaken {
    step: u32,
    state: StateID,
    // the state is also in the step's `StepSet` (the pattern took a second one)
    in_set: bool,
}

/// The (pattern, state) pairs already taken during one step: a small open-addressing set
/// whose slots are stamped with the step that wrote them, so starting a step costs nothing
/// (std's set had to be cleared every byte, and hashing with SipHash cost more than the DFA
/// transitions themselves).
#[derive(Debug, Default, Clone)]
struct StepSet {
    // [slots] (pattern << 32 | state) written at step `stamps[i]`
    keys: Vec<u64>,
    stamps: Vec<u32>,
    stamp: u32,
    len: usize,
}

impl StepSet {
    /// Starts a new step: every slot becomes empty at once.
    fn clear(&mut self) {
        self.stamp = self.stamp.wrapping_add(1);
        self.len = 0;
        if self.stamp == 0 {
            // The stamp wrapped: old stamps could look current again.
            self.stamps.iter_mut().for_each(|s| *s = u32::MAX);
            self.stamp = 1;
        }
    }

    /// Adds `key`; false when it was already there this step.
    fn insert(&mut self, key: u64) -> bool {
        if (self.len + 1) * 2 > self.keys.len() {
            self.grow();
        }
        let mask = self.keys.len() - 1;
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask;
        loop {
            if self.stamps[i] != self.stamp {
                self.keys[i] = key;
                self.stamps[i] = self.stamp;
                self.len += 1;
                return true;
            }
            if self.keys[i] == key {
                return false;
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table (at least 64 slots), re-inserting this step's keys.
    fn grow(&mut self) {
        let live: Vec<u64> =
            self.keys.iter().zip(&self.stamps).filter(|(_, &s)| s == self.stamp).map(|(&k, _)| k).collect();
        let size = (self.keys.len() * 2).max(64);
        self.keys = vec![0; size];
        self.stamps = vec![self.stamp.wrapping_sub(1); size];
        self.len = 0;
        for k in live {
            self.insert(k);
        }
    }
}

impl Threads {
    /// Consumes `byte`, found at absolute position `pos`. `on_match(pattern, start)` is
    /// called for each thread whose relaxed pattern matched `start..pos`.
    pub(crate) fn step(&mut self, live: &Live, byte: u8, pos: usize, on_match: &mut impl FnMut(usize, usize)) {
        let mut next = std::mem::take(&mut self.scratch);
        next.clear();
        self.seen.clear();
        self.next_step(live.dfas.len());
        let mut taken = Taken { first: &mut self.first_taken, step: self.step, seen: &mut self.seen };
        for t in &self.live {
            let Some(Some(LiveDfa { dfa, .. })) = live.dfas.get(t.pattern as usize) else {
                // Followed without an automaton: always a candidate, never finished.
                on_match(t.pattern as usize, t.start);
                taken.push_unique(&mut next, *t);
                continue;
            };
            let state = dfa.next_state(t.state, byte);
            if dfa.is_match_state(state) {
                on_match(t.pattern as usize, t.start);
                // Matches are reported one byte late; a match state with no way forward
                // would otherwise hold its text back for one more byte.
                if dies_after(dfa, state) {
                    continue;
                }
            }
            if !dfa.is_dead_state(state) {
                taken.push_unique(&mut next, Thread { state, ..*t });
            }
        }
        // The threads of the pending start, now that its second byte is here.
        if let (Some(start), Some(first)) = (self.pending, self.prev) {
            let pair = usize::from(first) << 8 | usize::from(byte);
            let range = live.pair_ranges[pair] as usize..live.pair_ranges[pair + 1] as usize;
            for second in &live.pairs[range] {
                if !second.openings.hold(self.prev_prev, first) {
                    continue;
                }
                if second.matched {
                    on_match(second.pattern as usize, start);
                }
                if second.alive {
                    taken.push_unique(&mut next, Thread { pattern: second.pattern, start, state: second.state });
                }
            }
        }
        let before = self.prev;
        (self.prev_prev, self.prev) = (before, Some(byte));
        let openings = live.pending_openings[usize::from(byte)];
        self.pending = openings.hold(before, byte).then_some(pos);
        // Patterns without an automaton start at once (rare: unchecked rules that failed).
        for f in live.first[usize::from(byte)].iter().filter(|f| !f.automaton) {
            if f.openings.hold(before, byte) {
                taken.push_unique(&mut next, Thread { pattern: f.pattern, start: pos, state: StateID::ZERO });
            }
        }
        self.scratch = std::mem::replace(&mut self.live, next);
    }

    /// Starts a step: every pattern's first state is forgotten at once.
    fn next_step(&mut self, patterns: usize) {
        if self.first_taken.len() < patterns {
            self.first_taken.resize(patterns, FirstTaken::default());
        }
        self.step = self.step.wrapping_add(1);
        if self.step == 0 {
            // Wrapped: old stamps could look current again.
            self.first_taken.iter_mut().for_each(|f| f.step = 0);
            self.step = 1;
        }
    }

    /// Ends the stream: reports the matches that end exactly at the end and clears.
    pub(crate) fn finish(&mut self, live: &Live, on_match: &mut impl FnMut(usize, usize)) {
        if let (Some(start), Some(byte)) = (self.pending.take(), self.prev) {
            // The pending start's threads have seen one byte.
            for f in live.first[usize::from(byte)].iter().filter(|f| f.automaton) {
                if !f.openings.hold(self.prev_prev, byte) {
                    continue;
                }
                if let Some(Some(d)) = live.dfas.get(f.pattern as usize) {
                    let state = d.dfa.next_state(d.start, byte);
                    self.live.push(Thread { pattern: f.pattern, start, state });
                }
            }
        }
        for t in self.live.drain(..) {
            let matched = match live.dfas.get(t.pattern as usize) {
                Some(Some(LiveDfa { dfa, .. })) => dfa.is_match_state(dfa.next_eoi_state(t.state)),
                _ => true,
            };
            if matched {
                on_match(t.pattern as usize, t.start);
            }
        }
    }

    /// The earliest position at which a match may be in progress.
    pub(crate) fn earliest(&self) -> Option<usize> {
        self.live.first().map(|t| t.start).or(self.pending)
    }

    /// Abandons threads that started before `pos` (only when the holdback limit forces it).
    pub(crate) fn drop_before(&mut self, pos: usize) {
        self.live.retain(|t| t.start >= pos);
        self.pending = self.pending.filter(|&p| p >= pos);
    }
}

/// Whether every byte leads from `state` to the dead state.
fn dies_after(dfa: &dense::DFA<Vec<u32>>, state: StateID) -> bool {
    (0..=255u8).all(|b| dfa.is_dead_state(dfa.next_state(state, b)))
}

/// What one step has taken so far.
struct Taken<'a> {
    first: &'a mut [FirstTaken],
    step: u32,
    seen: &'a mut StepSet,
}

impl Taken<'_> {
    /// Appends `t` unless an earlier thread of the same pattern is already in its state.
    // Called for every thread at every byte: left to the inliner's cost model, it stopped
    // being inlined into `Threads::step` when unrelated code changed, and streaming prose
    // took a quarter longer.
    #[inline(always)]
    fn push_unique(&mut self, v: &mut Vec<Thread>, t: Thread) {
        let key = |state: StateID| (u64::from(t.pattern) << 32) | u64::from(state.as_u32());
        let Some(first) = self.first.get_mut(t.pattern as usize) else {
            // Patterns past the table (none: it is sized to the automata) use the set.
            if self.seen.insert(key(t.state)) {
                v.push(t);
            }
            return;
        };
        if first.step != self.step {
            *first = FirstTaken { step: self.step, state: t.state, in_set: false };
            return v.push(t);
        }
        if first.state == t.state {
            return;
        }
        if !first.in_set {
            self.seen.insert(key(first.state));
            first.in_set = true;
        }
        if self.seen.insert(key(t.state)) {
            v.push(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scan::start_filter::StartFilter;

    fn live(patterns: &[&str]) -> Live {
        let hirs = patterns
            .iter()
            .filter_map(|p| regex_syntax::parse(p).ok())
            .map(crate::rules::rule::ascii_twin)
            .collect::<Vec<_>>();
        assert_eq!(hirs.len(), patterns.len());
        let built = Live::build(&hirs).map_err(|e| format!("{e:?}"));
        assert!(built.is_ok(), "{built:?}");
        built.unwrap_or_else(|_| Live::build_lenient::<Hir>(&[]))
    }

    fn run(l: &Live, text: &str) -> (Option<usize>, Vec<(usize, usize)>) {
        let mut t = Threads::default();
        let mut hits = Vec::new();
        for (i, b) in text.bytes().enumerate() {
            t.step(l, b, i, &mut |p, s| hits.push((p, s)));
        }
        (t.earliest(), hits)
    }

    #[test]
    fn idle_on_clean_text_and_alive_inside_a_candidate() {
        let l = live(&[r"\bAKIA[A-Z0-9]{16}\b"]);
        assert_eq!(run(&l, "hello world").0, None);
        assert_eq!(run(&l, "key AKIA12").0, Some(4));
        assert_eq!(run(&l, "key AKIA1234567890123456").0, Some(4), "pending match at the end is alive");
        // DFA matches are reported one byte late; a finished match frees its thread then.
        assert_eq!(run(&l, "key AKIA1234567890123456 ").1, vec![(0, 4)]);
        assert_eq!(run(&l, "key AKIA1234567890123456 ").0, None);
    }

    #[test]
    fn an_opening_word_boundary_spawns_threads_only_at_word_starts() {
        let l = live(&[r"(?i:\b(?:token))[a-z_]{0,8}=\S+", r"[a-z_]{0,8}token=\S+"]);
        // (pattern, start) of every relaxed match, once each
        let matches = |text: &str| {
            let mut hits = run(&l, text).1;
            hits.sort_unstable();
            hits.dedup();
            hits
        };
        // "xtoken=" cannot match the first pattern anywhere; the second from "x" on.
        assert_eq!(matches("xtoken=abc "), vec![(1, 0)]);
        assert_eq!(matches("a token=abc "), vec![(0, 2), (1, 2)]);
        let at_t = &l.first[usize::from(b't')];
        assert_eq!(
            at_t.iter().map(|f| (f.pattern, f.openings.is_anywhere())).collect::<Vec<_>>(),
            vec![(0, false), (1, true)]
        );
    }

    #[test]
    fn a_line_start_opening_spawns_threads_only_at_line_starts() {
        // pgpass-like: a counted run of name characters after a line start or a newline.
        let l = live(&[r"(?:^|\n)[A-Za-z0-9_.*-]{1,64}:5432:"]);
        let mut t = Threads::default();
        let mut hits = Vec::new();
        for (i, b) in "host:5432:\nsome.name_of-a.host".bytes().enumerate() {
            t.step(&l, b, i, &mut |p, s| hits.push((p, s)));
        }
        assert_eq!(hits, vec![(0, 0)]);
        // Alive: the thread from the newline (the one from the line's first letter is in the
        // same state, so only the earlier is kept); no letter inside the line started one
        // (unfiltered, each of the 21 would have, each in its own state).
        assert_eq!(t.live.iter().map(|t| t.start).collect::<Vec<_>>(), vec![10]);
    }

    /// The earliest live start after one byte, and the (pattern, start) matches it reported.
    type StepOutcome = (Option<usize>, Vec<(usize, usize)>);

    /// Per byte, what [`StepOutcome`] threads gave before byte pairs (every start spawned at
    /// its first byte, kept unless an earlier thread of its pattern was in its state), then
    /// the matches at the end.
    fn reference_run(l: &Live, text: &[u8]) -> (Vec<StepOutcome>, Vec<(usize, usize)>) {
        let mut live: Vec<Thread> = Vec::new();
        let mut steps = Vec::new();
        let mut prev = None;
        for (pos, &byte) in text.iter().enumerate() {
            let (mut next, mut seen, mut hits) = (Vec::new(), std::collections::HashSet::new(), Vec::new());
            let mut keep = |t: Thread, next: &mut Vec<Thread>| {
                if seen.insert((t.pattern, t.state)) {
                    next.push(t);
                }
            };
            for t in &live {
                let Some(Some(d)) = l.dfas.get(t.pattern as usize) else { continue };
                let state = d.dfa.next_state(t.state, byte);
                if d.dfa.is_match_state(state) {
                    hits.push((t.pattern as usize, t.start));
                    if dies_after(&d.dfa, state) {
                        continue;
                    }
                }
                if !d.dfa.is_dead_state(state) {
                    keep(Thread { state, ..*t }, &mut next);
                }
            }
            for f in &l.first[usize::from(byte)] {
                if f.openings.hold(prev, byte) {
                    if let Some(Some(d)) = l.dfas.get(f.pattern as usize) {
                        keep(
                            Thread { pattern: f.pattern, start: pos, state: d.dfa.next_state(d.start, byte) },
                            &mut next,
                        );
                    }
                }
            }
            prev = Some(byte);
            live = next;
            hits.sort_unstable();
            steps.push((live.first().map(|t| t.start), hits));
        }
        let mut end: Vec<(usize, usize)> = live
            .iter()
            .filter(|t| {
                l.dfas[t.pattern as usize].as_ref().is_some_and(|d| d.dfa.is_match_state(d.dfa.next_eoi_state(t.state)))
            })
            .map(|t| (t.pattern as usize, t.start))
            .collect();
        end.sort_unstable();
        (steps, end)
    }

    #[test]
    fn byte_pairs_change_nothing_but_the_work() {
        let rules = crate::Ruleset::builtin().map_err(|e| e.to_string());
        let Ok(rules) = rules else { return assert_eq!(rules.err(), None) };
        let l = rules.engine.live();
        let samples: Vec<&str> =
            rules.rules.iter().flat_map(|r| r.must_match.iter().chain(&r.must_not_match)).map(String::as_str).collect();
        let prose = "Пароль: hunter2hunter2 — ключ EAAAtoken… the quick brown fox\r\n\tpassword = 's3cr3t!'";
        let texts =
            [samples.join("\n"), samples.join(" "), samples.join(""), samples.concat().to_uppercase(), prose.repeat(8)];
        for text in &texts {
            for text in text.as_bytes().chunks(60_000) {
                let (want_steps, want_end) = reference_run(l, text);
                let mut t = Threads::default();
                for (pos, &byte) in text.iter().enumerate() {
                    let mut hits = Vec::new();
                    t.step(l, byte, pos, &mut |p, s| hits.push((p, s)));
                    hits.sort_unstable();
                    assert_eq!(
                        (t.earliest(), hits),
                        want_steps[pos],
                        "at {pos} of {:?}",
                        String::from_utf8_lossy(&text[pos.saturating_sub(40)..=pos])
                    );
                }
                let mut end = Vec::new();
                t.finish(l, &mut |p, s| end.push((p, s)));
                end.sort_unstable();
                assert_eq!(end, want_end);
            }
        }
    }

    /// A long counted run costs its count in states; relaxed, it costs its minimum, and a
    /// thread still covers every match: alive inside the run, reported once it is long
    /// enough, and alive past the bound only while the run goes on.
    #[test]
    fn a_long_counted_run_is_relaxed_to_its_minimum() {
        let bounded = live(&[r"\bBearer [A-Za-z0-9]{20,2048}"]);
        let short = live(&[r"\bBearer [A-Za-z0-9]{20,64}"]);
        assert!(
            bounded.memory_usage() <= short.memory_usage(),
            "{} > {}",
            bounded.memory_usage(),
            short.memory_usage()
        );
        let token = "x".repeat(30);
        assert_eq!(run(&bounded, &format!("auth: Bearer {token}")).0, Some(6));
        assert!(run(&bounded, &format!("auth: Bearer {token} ok")).1.contains(&(0, 6)));
        assert_eq!(run(&bounded, &format!("auth: Bearer {} ok", "x".repeat(3000))).0, None);
    }

    #[test]
    fn leading_loops_keep_the_earliest_start() {
        // A thread from 0 and one from 1 share a state after "aa": the start 0 is kept.
        let l = live(&["a*b"]);
        assert_eq!(run(&l, "xaaa").0, Some(1));
    }

    #[test]
    fn step_set_forgets_at_each_step_and_grows() {
        let mut set = StepSet::default();
        set.clear();
        for k in 0..500u64 {
            assert!(set.insert(k << 32 | k));
        }
        assert!((0..500u64).all(|k| !set.insert(k << 32 | k)));
        set.clear();
        assert!(set.insert(7 << 32 | 7) && !set.insert(7 << 32 | 7));
    }

    /// The first-byte set of pattern `p` as its automaton sees it.
    fn automaton_first_bytes(l: &Live, p: usize) -> [u64; 4] {
        let mut set = [0u64; 4];
        for (b, starts) in l.first.iter().enumerate() {
            if starts.iter().any(|f| f.pattern == p as u32) {
                set[b >> 6] |= 1u64 << (b & 63);
            }
        }
        set
    }

    #[test]
    fn start_filter_bytes_of_every_default_rule_equal_its_automatons() {
        let rules = crate::Ruleset::builtin().map_err(|e| e.to_string());
        let Ok(rules) = rules else { return assert_eq!(rules.err(), None) };
        let live = rules.engine.live();
        for (p, r) in rules.rules.iter().enumerate() {
            assert_eq!(StartFilter::of(r.hir()).any_byte(), automaton_first_bytes(live, p), "{}", r.id);
        }
    }

    #[test]
    fn start_filter_bytes_from_the_syntax_equal_those_of_the_automaton() {
        let patterns = [
            r"\bAKIA[A-Z0-9]{16}",
            r"(?i)token|x-api-key",
            r"(?:ab|[0-9])?c+",
            r"(?i)\w+ключ",
            "пароль|q~",
            r"(?:\b|x*)(?-u:[\x00-\x10])?é{2}",
        ];
        for pattern in patterns {
            let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string());
            let Ok(hir) = hir else { return assert_eq!(hir.err(), None) };
            let l = Live::build(std::slice::from_ref(&hir)).map_err(|e| format!("{e:?}"));
            let Ok(l) = l else { return assert_eq!(l.err(), None) };
            assert_eq!(StartFilter::of(&hir).any_byte(), automaton_first_bytes(&l, 0), "{pattern}");
        }
    }

    #[test]
    fn unicode_classes_are_widened_not_narrowed() {
        let l = live(&[r"(?i)\w+ключ"]);
        assert_eq!(run(&l, "секретный клю").0, Some(19));
    }
}
