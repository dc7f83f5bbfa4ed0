//! A pattern compiled for forward searches only: where its leftmost-first match ends, or
//! whether it matches at all.
//!
//! A meta regex (what `regex` builds) also compiles a reverse NFA, to find where an
//! unanchored match starts, a one-pass DFA for captures and a literal prefilter. A search
//! anchored where the caller chose, or a yes-or-no answer, uses none of them: building
//! them was more than half of what compiling a rule that is only tried near its keywords
//! cost, and `allow` lists only ever ask yes or no. This is the forward Thompson NFA and
//! its lazy DFA, quitting to the NFA's PikeVM where the meta regex's lazy DFA would (a
//! Unicode `\b` beside a non-ASCII byte, a cache cleared over and over), so it reports
//! what the meta regex's forward search reports.

use std::panic::{RefUnwindSafe, UnwindSafe};
use std::sync::{Arc, Mutex, PoisonError};

use regex_automata::hybrid::dfa::{Cache as DfaCache, DFA};
use regex_automata::nfa::thompson::pikevm::{Cache as PikeCache, PikeVM};
use regex_automata::nfa::thompson::{self, NFA};
use regex_automata::util::pool::Pool;
use regex_automata::Input;
use regex_syntax::hir::Hir;

use super::REGEX_SIZE_LIMIT;

/// See the module docs.
pub(crate) struct ForwardRegex {
    engines: Arc<(DFA, PikeVM)>,
    caches: Pool<ForwardCaches, MakeCaches>,
}

/// What a search needs besides the regex: the lazy DFA's states and the PikeVM's threads.
/// Searches take them from the regex's pool, or from a caller that keeps its own
/// ([`ForwardRegex::match_end_with`]).
#[derive(Debug, Clone)]
pub(crate) struct ForwardCaches {
    dfa: DfaCache,
    pikevm: PikeCache,
}

/// The compiler of every forward NFA. A compiler allocates its UTF-8 caches (some 400 KB)
/// when it first compiles a Unicode class and frees them when dropped: per pattern, a fifth
/// of what building a rule's NFA cost. It resets itself before each pattern.
static COMPILER: Mutex<Option<thompson::Compiler>> = Mutex::new(None);
/// What makes a thread's caches, as the pool keeps it.
type MakeCaches = Box<dyn Fn() -> ForwardCaches + Send + Sync + UnwindSafe + RefUnwindSafe>;

impl ForwardRegex {
    /// None where the NFA outgrows [`REGEX_SIZE_LIMIT`] or the lazy DFA's cache cannot
    /// hold the few states a search needs.
    pub(crate) fn new(hir: &Hir) -> Option<ForwardRegex> {
        // Group 0's slots only: the PikeVM reports where a match ends through them.
        let config = thompson::Config::new()
            .nfa_size_limit(Some(REGEX_SIZE_LIMIT))
            .which_captures(thompson::WhichCaptures::Implicit);
        let nfa: NFA = {
            let mut compiler = COMPILER.lock().unwrap_or_else(PoisonError::into_inner);
            compiler.get_or_insert_with(thompson::Compiler::new).configure(config).build_from_hir(hir).ok()?
        };
        // Give up (to the PikeVM) as the meta regex does.
        let dfa_config = DFA::config()
            .unicode_word_boundary(true)
            .minimum_cache_clear_count(Some(3))
            .minimum_bytes_per_state(Some(10));
        let dfa = DFA::builder().configure(dfa_config).build_from_nfa(nfa.clone()).ok()?;
        let pikevm = PikeVM::new_from_nfa(nfa).ok()?;
        let engines = Arc::new((dfa, pikevm));
        let for_caches = Arc::clone(&engines);
        let create: MakeCaches = Box::new(move || caches_for(&for_caches));
        Some(ForwardRegex { engines, caches: Pool::new(create) })
    }

    /// Where the leftmost-first match in `input` ends (with `input.get_earliest()`, where
    /// the first match seen ends: enough to say whether there is one).
    pub(crate) fn match_end(&self, input: &Input<'_>) -> Option<usize> {
        self.match_end_with(&mut self.caches.get(), input)
    }

    /// [`ForwardRegex::match_end`] with caches the caller keeps (made by
    /// [`ForwardRegex::create_caches`]): a scan that tries a rule at thousands of places
    /// keeps them with its scratch rather than taking them from the pool at every try.
    pub(crate) fn match_end_with(&self, caches: &mut ForwardCaches, input: &Input<'_>) -> Option<usize> {
        let (dfa, pikevm) = &*self.engines;
        match dfa.try_search_fwd(&mut caches.dfa, input) {
            Ok(found) => found.map(|m| m.offset()),
            Err(_) => {
                let mut slots = [None, None];
                pikevm.search_slots(&mut caches.pikevm, input, &mut slots)?;
                slots[1].map(|end| end.get())
            }
        }
    }

    pub(crate) fn create_caches(&self) -> ForwardCaches {
        caches_for(&self.engines)
    }
}

fn caches_for((dfa, pikevm): &(DFA, PikeVM)) -> ForwardCaches {
    ForwardCaches { dfa: dfa.create_cache(), pikevm: pikevm.create_cache() }
}

impl std::fmt::Debug for ForwardRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForwardRegex").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use regex_automata::meta::Regex as MetaRegex;
    use regex_automata::Anchored;

    use super::*;

    /// Every position of every text, anchored and not: the end the meta regex's forward
    /// search reports, including where its lazy DFA gives up (a Unicode `\b` next to
    /// `é`) and where a match could end inside a character.
    #[test]
    fn ends_where_the_meta_regex_ends() {
        let texts = ["token=abc", "éfoo bar", "x\u{e9}\u{e9}y token: é1", "\nkey =\r\nvalue", ""];
        for pattern in [r"\bfoo\b", r"token[=:]\s*\w+", r"(?m)^key\s*=\s*$", r"\w+", r"é|y", r"(?i)KEY"] {
            let hir = regex_syntax::parse(pattern).expect("parses");
            let meta = MetaRegex::new(pattern).expect("compiles");
            let forward = ForwardRegex::new(&hir).expect("builds");
            for text in texts {
                for s in 0..=text.len() {
                    for anchored in [Anchored::No, Anchored::Yes] {
                        let input = Input::new(text).span(s..text.len()).anchored(anchored);
                        let want = meta.search_half(&input).map(|m| m.offset());
                        assert_eq!(forward.match_end(&input), want, "{pattern} on {text:?} from {s}");
                        let any = forward.match_end(&input.clone().earliest(true)).is_some();
                        assert_eq!(any, want.is_some(), "{pattern} on {text:?} from {s}, earliest");
                    }
                }
            }
        }
    }
}
