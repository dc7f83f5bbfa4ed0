//! Liveness: which positions of a stream could still be the start of a match.
//!
//! For every pattern we build an *anchored* dense DFA of a relaxed version of its regex:
//! look-around assertions are dropped and non-ASCII parts of classes widen to "any
//! non-ASCII character". The relaxed language contains every string the real regex can
//! match, so "no relaxed thread started at `p` is alive" soundly proves "no match can start
//! at `p` and use bytes we have not seen yet". Being relaxed only ever costs holdback.
//! One look-around is kept, outside the automaton: a pattern whose every match opens with
//! `\b` starts threads only where an ASCII word boundary lies (no real match starts
//! elsewhere); without that, most generic rules started a thread at every letter.
//! A pattern whose automaton could not be built (only when building was deferred, see
//! [`Live::build_lenient`]) is followed as "in progress anywhere".
//!
//! [`Threads`] runs one anchored thread per (pattern, start position) over the stream, byte
//! by byte, keeping only live ones. Two threads of one pattern in the same DFA state have
//! the same future, so only the earlier start is kept: the thread set stays small (bounded
//! by the number of DFA states), and the earliest live start is simply the first thread.
//! A thread that passes through a match state reports `(pattern, start)`, which tells the
//! scanner which patterns are worth confirming with the real regex.


use regex_automata::dfa::{dense, Automaton, StartKind};
use regex_automata::nfa::thompson::{self, WhichCaptures};
use regex_automata::util::primitives::StateID;
use regex_automata::{Anchored, Input, MatchKind};
use regex_syntax::hir::{Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Look, Repetition};

use crate::start::is_word_byte;

/// Size limit for one pattern's liveness DFA and for its determinisation (bytes).
pub const LIVE_DFA_LIMIT: usize = 16 << 20;

/// Over-approximates `hir`: same or larger language, no look-around, small classes.
pub(crate) fn relax(hir: &Hir) -> Hir {
    match hir.kind() {
        HirKind::Look(_) => Hir::empty(),
        HirKind::Empty | HirKind::Literal(_) => hir.clone(),
        HirKind::Class(Class::Unicode(c)) => Hir::class(Class::Unicode(widen(c))),
        HirKind::Class(Class::Bytes(_)) => hir.clone(),
        HirKind::Repetition(r) => Hir::repetition(Repetition {
            min: r.min,
            max: r.max,
            greedy: r.greedy,
            sub: Box::new(relax(&r.sub)),
        }),
        HirKind::Capture(c) => relax(&c.sub),
        HirKind::Concat(v) => Hir::concat(v.iter().map(relax).collect()),
        HirKind::Alternation(v) => Hir::alternation(v.iter().map(relax).collect()),
    }
}

/// Keeps the ASCII part of a class and replaces any non-ASCII part by all of non-ASCII.
fn widen(c: &ClassUnicode) -> ClassUnicode {
    if c.ranges().iter().all(|r| (r.end() as u32) < 0x80) {
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

/// Whether every match of `hir` opens with an ASCII word boundary (`\b` as the rules
/// compile it): such a match can only start where the bytes on either side of it differ in
/// being ASCII word characters.
fn opens_with_word_boundary(hir: &Hir) -> bool {
    match hir.kind() {
        HirKind::Look(Look::WordAscii | Look::WordStartAscii) => true,
        HirKind::Capture(c) => opens_with_word_boundary(&c.sub),
        HirKind::Concat(parts) => parts.first().is_some_and(opens_with_word_boundary),
        HirKind::Alternation(alts) => alts.iter().all(opens_with_word_boundary),
        _ => false,
    }
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

/// All patterns' automata plus, per first byte, the patterns a thread can start with.
#[derive(Clone, Debug)]
pub(crate) struct Live {
    // [patterns] None: no automaton could be built; the pattern may be in progress anywhere
    dfas: Vec<Option<LiveDfa>>,
    // [256][patterns that survive this first byte and may start anywhere]
    first: Vec<Vec<u32>>,
    // [256][patterns that survive this first byte, but only where an ASCII word boundary
    // lies just before it: every match of theirs opens with `\b`]
    first_at_boundary: Vec<Vec<u32>>,
}

impl Live {
    /// Determinises every pattern's automaton (the costly part of loading a ruleset); the
    /// errors name the pattern index.
    pub(crate) fn build(patterns: &[Hir]) -> Result<Live, Vec<(usize, String)>> {
        let mut dfas = Vec::with_capacity(patterns.len());
        let mut errors = Vec::new();
        for (p, hir) in patterns.iter().enumerate() {
            match LiveDfa::build(hir) {
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
    pub(crate) fn build_lenient(patterns: &[Hir]) -> Live {
        Live::from_automata(patterns.iter().map(|hir| LiveDfa::build(hir).ok()).collect(), patterns)
    }

    /// `dfas[p]` is the automaton of `patterns[p]`, if it could be built.
    fn from_automata(dfas: Vec<Option<LiveDfa>>, patterns: &[Hir]) -> Live {
        let mut first = vec![Vec::new(); 256];
        let mut first_at_boundary = vec![Vec::new(); 256];
        for (p, d) in dfas.iter().enumerate() {
            // Relaxing drops look-around; an opening `\b` is put back as a spawn condition.
            let table = if patterns.get(p).is_some_and(opens_with_word_boundary) { &mut first_at_boundary } else { &mut first };
            for b in 0..=255u8 {
                if d.as_ref().is_none_or(|d| !d.dfa.is_dead_state(d.dfa.next_state(d.start, b))) {
                    table[b as usize].push(p as u32);
                }
            }
        }
        Live { dfas, first, first_at_boundary }
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
    // (pattern, state) pairs already in `scratch` during one step
    seen: StepSet,
    // the byte stepped last, for word boundaries; None at the start of the stream
    prev: Option<u8>,
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
        let live: Vec<u64> = self.keys.iter().zip(&self.stamps).filter(|(_, &s)| s == self.stamp).map(|(&k, _)| k).collect();
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
        for t in &self.live {
            let Some(Some(LiveDfa { dfa, .. })) = live.dfas.get(t.pattern as usize) else {
                // Followed without an automaton: always a candidate, never finished.
                on_match(t.pattern as usize, t.start);
                push_unique(&mut next, &mut self.seen, *t);
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
                push_unique(&mut next, &mut self.seen, Thread { state, ..*t });
            }
        }
        let at_boundary = self.prev.is_some_and(is_word_byte) != is_word_byte(byte);
        self.prev = Some(byte);
        let anywhere = live.first[byte as usize].iter();
        let opening = if at_boundary { live.first_at_boundary[byte as usize].as_slice() } else { &[] };
        for &p in anywhere.chain(opening) {
            let state = match live.dfas.get(p as usize) {
                Some(Some(d)) => d.dfa.next_state(d.start, byte),
                _ => StateID::ZERO,
            };
            push_unique(&mut next, &mut self.seen, Thread { pattern: p, start: pos, state });
        }
        self.scratch = std::mem::replace(&mut self.live, next);
    }

    /// Ends the stream: reports the matches that end exactly at the end and clears.
    pub(crate) fn finish(&mut self, live: &Live, on_match: &mut impl FnMut(usize, usize)) {
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
        self.live.first().map(|t| t.start)
    }

    /// Abandons threads that started before `pos` (only when the holdback limit forces it).
    pub(crate) fn drop_before(&mut self, pos: usize) {
        self.live.retain(|t| t.start >= pos);
    }
}

/// Whether every byte leads from `state` to the dead state.
fn dies_after(dfa: &dense::DFA<Vec<u32>>, state: StateID) -> bool {
    (0..=255u8).all(|b| dfa.is_dead_state(dfa.next_state(state, b)))
}

/// Appends `t` unless an earlier thread of the same pattern is already in its state.
fn push_unique(v: &mut Vec<Thread>, seen: &mut StepSet, t: Thread) {
    if seen.insert((u64::from(t.pattern) << 32) | u64::from(t.state.as_u32())) {
        v.push(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::start::StartFilter;

    fn live(patterns: &[&str]) -> Live {
        let hirs = patterns.iter().filter_map(|p| regex_syntax::parse(p).ok()).map(|h| crate::rule::ascii_twin(&h)).collect::<Vec<_>>();
        assert_eq!(hirs.len(), patterns.len());
        let built = Live::build(&hirs).map_err(|e| format!("{e:?}"));
        assert!(built.is_ok(), "{built:?}");
        built.unwrap_or_else(|_| Live::build_lenient(&[]))
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
        assert_eq!(l.first_at_boundary[usize::from(b't')], vec![0]);
        assert_eq!(l.first[usize::from(b't')], vec![1]);
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
        for (b, (anywhere, opening)) in l.first.iter().zip(&l.first_at_boundary).enumerate() {
            if anywhere.contains(&(p as u32)) || opening.contains(&(p as u32)) {
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
            assert_eq!(StartFilter::of(&r.hir).any_byte(), automaton_first_bytes(live, p), "{}", r.id);
        }
    }

    #[test]
    fn start_filter_bytes_from_the_syntax_equal_those_of_the_automaton() {
        let patterns = [r"\bAKIA[A-Z0-9]{16}", r"(?i)token|x-api-key", r"(?:ab|[0-9])?c+", r"(?i)\w+ключ", "пароль|q~", r"(?:\b|x*)(?-u:[\x00-\x10])?é{2}"];
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
