//! Keyword reach: how far past a match's start the first keyword can begin.
//!
//! If every string a rule's regex matches contains one of the rule's keywords starting at
//! most `reach` bytes after the match's start, then every match starts within `reach` bytes
//! before a keyword hit. One-shot scanning uses that to try the regex, anchored, only at
//! those few positions instead of running it over the whole text (see `scan`).
//!
//! The analysis is sound and deliberately simple: it walks the regex's syntax tree and
//! recognises keywords spelled out by literals, by ASCII case-insensitive letters (what
//! `(?i)` makes of a literal) and by alternations or `+` repetitions of such parts, behind
//! a prefix of bounded length. Anything it cannot prove yields `None`, and the caller falls
//! back to searching the whole text. It never over-claims: a keyword split across an
//! optional part, or one behind an unbounded prefix, is simply not found.

use std::collections::HashMap;
use std::rc::Rc;

use regex_syntax::hir::{Class, Hir, HirKind};

use super::keyword_set::KeywordSet;

/// An upper bound on where the first keyword of any match of `hir` starts, counted in
/// bytes from the match's start; `None` when some match may hold no keyword within a
/// bounded distance. `keywords` are lowercase ASCII-folded, as rules store them.
pub(crate) fn keyword_reach(hir: &Hir, keywords: &[String]) -> Option<usize> {
    if keywords.is_empty() || keywords.iter().any(String::is_empty) {
        return None;
    }
    reach(hir, &KeywordSet::new(keywords), &mut Memo::default())
}

/// Most strings a small finite part may stand for before the analysis gives up on it.
const MAX_STRINGS: usize = 256;

/// A product of short strings may hold more: up to this many while they total at most
/// [`SHORT_BYTES`] (alternations and repetitions keep [`MAX_STRINGS`]).
/// `discord-bot-token-bare` opens with 900 of 4 bytes (the first group of every bot id in
/// base64), each one of its keywords. Raising [`MAX_STRINGS`] itself to 1,024 cost 8 ms
/// of every start (the products of other rules grew before they gave up).
const MAX_SHORT_STRINGS: usize = 1024;
const SHORT_BYTES: usize = 4096;

/// Whether `count` strings of `bytes` in all are still a small finite part.
fn small(count: usize, bytes: usize) -> bool {
    count <= MAX_STRINGS || (count <= MAX_SHORT_STRINGS && bytes <= SHORT_BYTES)
}

/// What a part of a regex begins with: every match starts with one of `set` (lowercase,
/// ASCII-folded); when `complete`, every match *is* one of them.
struct Starts {
    set: Vec<String>,
    complete: bool,
}

impl Starts {
    fn exactly(set: Vec<String>) -> Starts {
        Starts { set, complete: true }
    }

    fn unknown() -> Starts {
        Starts { set: vec![String::new()], complete: false }
    }
}

/// What each node of one tree begins with, by the node's address: `reach` and
/// `concat_reach` ask again for the same subtrees at every level of the walk. Lives only
/// while the tree is borrowed, so an address stands for one node.
#[derive(Default)]
struct Memo(HashMap<*const Hir, Rc<Starts>>);

fn reach(hir: &Hir, keywords: &KeywordSet<'_>, memo: &mut Memo) -> Option<usize> {
    let starts = starts(hir, memo);
    let by_start = strings_reach(&starts.set, keywords);
    if starts.complete {
        return by_start;
    }
    let by_parts = match hir.kind() {
        HirKind::Concat(parts) => concat_reach(parts, keywords, memo),
        HirKind::Capture(c) => reach(&c.sub, keywords, memo),
        // The first repetition holds the keyword; with `min == 0` there may be none.
        HirKind::Repetition(r) if r.min >= 1 => reach(&r.sub, keywords, memo),
        HirKind::Alternation(alts) => {
            alts.iter().map(|a| reach(a, keywords, memo)).try_fold(0, |m, r| r.map(|r| m.max(r)))
        }
        _ => None,
    };
    min_some(by_start, by_parts)
}

fn min_some(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Every string holds a keyword: the latest first-keyword offset among them.
fn strings_reach(strings: &[String], keywords: &KeywordSet<'_>) -> Option<usize> {
    strings.iter().map(|s| keywords.first_in(s.as_bytes())).try_fold(0, |m, r| r.map(|r| m.max(r)))
}

fn longest(strings: &[String]) -> usize {
    strings.iter().map(String::len).max().unwrap_or(0)
}

/// Walks a concatenation left to right, tracking the longest the prefix so far can be.
/// Consecutive small finite parts are joined into one set of strings, and so is what the
/// next part begins with, so `(?i:to)ken`, `sk-ant-o[ar]t01-`, `api[_-]?key` and the
/// factored `r(?:azorpay|zp)` are searched for keywords whole.
fn concat_reach(parts: &[Hir], keywords: &KeywordSet<'_>, memo: &mut Memo) -> Option<usize> {
    let mut best: Option<usize> = None;
    let mut prefix_max = 0usize;
    let mut run: Vec<String> = vec![String::new()];
    for part in parts {
        let st = starts(part, memo);
        match product(&run, &st.set) {
            Some(joined) if st.complete => {
                run = joined;
                continue;
            }
            Some(joined) => best = min_some(best, strings_reach(&joined, keywords).map(|o| prefix_max + o)),
            None => {}
        }
        best = min_some(best, strings_reach(&run, keywords).map(|o| prefix_max + o));
        prefix_max += longest(&run);
        if st.complete {
            // Too many strings to join: this part starts a new run.
            run = st.set.clone();
            continue;
        }
        run = vec![String::new()];
        best = min_some(best, reach(part, keywords, memo).map(|o| prefix_max + o));
        match part.properties().maximum_len().and_then(|m| prefix_max.checked_add(m)) {
            Some(p) => prefix_max = p,
            // Nothing after an unbounded part has a bounded offset.
            None => return best,
        }
    }
    min_some(best, strings_reach(&run, keywords).map(|o| prefix_max + o))
}

/// Every pairing of `a` then `b`, unless there would be more than [`small`] allows.
fn product(a: &[String], b: &[String]) -> Option<Vec<String>> {
    let count = a.len().checked_mul(b.len())?;
    let bytes = longest(a).saturating_add(longest(b)).saturating_mul(count);
    if !small(count, bytes) {
        return None;
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            let mut joined = String::with_capacity(x.len() + y.len());
            joined.push_str(x);
            joined.push_str(y);
            out.push(joined);
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// What `hir` begins with (see [`Starts`]); sound whatever the regex, precise for small
/// finite parts. Each node is analysed once per tree (`memo`).
fn starts(hir: &Hir, memo: &mut Memo) -> Rc<Starts> {
    if let HirKind::Capture(c) = hir.kind() {
        return starts(&c.sub, memo);
    }
    let key = std::ptr::from_ref(hir);
    if let Some(known) = memo.0.get(&key) {
        return Rc::clone(known);
    }
    let found = Rc::new(node_starts(hir, memo));
    memo.0.insert(key, Rc::clone(&found));
    found
}

fn node_starts(hir: &Hir, memo: &mut Memo) -> Starts {
    match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => Starts::exactly(vec![String::new()]),
        HirKind::Literal(l) => std::str::from_utf8(&l.0)
            .map_or_else(|_| Starts::unknown(), |t| Starts::exactly(vec![t.to_ascii_lowercase()])),
        HirKind::Class(Class::Unicode(c)) => match bounded(c.iter().flat_map(|r| r.start()..=r.end())) {
            Some(chars) => {
                Starts::exactly(sorted(chars.into_iter().map(|ch| ch.to_ascii_lowercase().to_string()).collect()))
            }
            None => Starts::unknown(),
        },
        HirKind::Class(Class::Bytes(c)) => match bounded(c.iter().flat_map(|r| r.start()..=r.end())) {
            // A non-ASCII byte alone is not a string: give up rather than guess.
            Some(bytes) if bytes.iter().all(u8::is_ascii) => Starts::exactly(sorted(
                bytes.into_iter().map(|b| char::from(b.to_ascii_lowercase()).to_string()).collect(),
            )),
            _ => Starts::unknown(),
        },
        // `starts` passes captures through before asking here.
        HirKind::Capture(c) => node_starts(&c.sub, memo),
        HirKind::Repetition(r) => repetition_starts(r, memo),
        HirKind::Concat(parts) => {
            let mut acc = vec![String::new()];
            for p in parts {
                let st = starts(p, memo);
                let Some(joined) = product(&acc, &st.set) else { return Starts { set: acc, complete: false } };
                acc = joined;
                if !st.complete {
                    return Starts { set: acc, complete: false };
                }
            }
            Starts::exactly(acc)
        }
        HirKind::Alternation(alts) => {
            let mut set = Vec::new();
            let mut complete = true;
            for a in alts {
                let st = starts(a, memo);
                complete &= st.complete;
                set.extend(st.set.iter().cloned());
                if set.len() > MAX_STRINGS {
                    return Starts::unknown();
                }
            }
            Starts { set: sorted(set), complete }
        }
    }
}

fn repetition_starts(r: &regex_syntax::hir::Repetition, memo: &mut Memo) -> Starts {
    let sub = starts(&r.sub, memo);
    if !sub.complete {
        return if r.min >= 1 { Starts { set: sub.set.clone(), complete: false } } else { Starts::unknown() };
    }
    // `sub` repeated `min` times opens every match.
    let mut power = vec![String::new()];
    for _ in 0..r.min {
        match product(&power, &sub.set) {
            Some(p) => power = p,
            None => return Starts { set: power, complete: false },
        }
    }
    let Some(max) = r.max else { return Starts { set: power, complete: false } };
    let opening = power.clone();
    let mut all = power.clone();
    for _ in r.min..max {
        match product(&power, &sub.set) {
            Some(p) => power = p,
            None => return Starts { set: opening, complete: false },
        }
        all.extend(power.iter().cloned());
        if all.len() > MAX_STRINGS {
            return Starts { set: opening, complete: false };
        }
    }
    Starts::exactly(sorted(all))
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Collects an iterator of at most 16 items (a class that small is worth expanding).
fn bounded<T>(items: impl Iterator<Item = T>) -> Option<Vec<T>> {
    let v: Vec<T> = items.take(17).collect();
    (v.len() <= 16).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach_of(pattern: &str, keywords: &[&str]) -> Option<usize> {
        let hir = regex_syntax::parse(pattern).map_err(|e| e.to_string());
        let kws: Vec<String> = keywords.iter().map(|k| k.to_string()).collect();
        hir.ok().and_then(|h| keyword_reach(&crate::rules::rule::ascii_twin(h), &kws))
    }

    #[test]
    fn literal_prefixes_and_case_insensitive_words() {
        assert_eq!(reach_of(r"\b(ghp_[A-Za-z0-9]{36})\b", &["ghp_"]), Some(0));
        assert_eq!(reach_of(r"(?i:token)[ \t]*=[ \t]*(\S{20,})", &["token"]), Some(0));
        assert_eq!(reach_of(r"(?i)\bx-(?:api|auth)-token", &["token"]), Some(7));
        assert_eq!(reach_of(r"[a-z_]{0,8}(?i:password)\s*=", &["password", "pass"]), Some(8));
    }

    #[test]
    fn keywords_across_small_classes_and_optional_parts() {
        let ant = &["sk-ant-oat01-", "sk-ant-ort01-"];
        let razorpay = r"(?i:\b(?:razorpay[A-Za-z0-9_.-]{0,16}secret|rzp[A-Za-z0-9_.-]{0,16}secret))\s*=";
        assert_eq!(reach_of(razorpay, &["razorpay", "rzp"]), Some(0));
        assert_eq!(reach_of(r"(?:ab|cd)[a-z]+xy", &["xy"]), None);
        assert_eq!(reach_of(r"\$2[abxy]\$[0-9]{2}\$", &["$2a$", "$2b$", "$2x$", "$2y$"]), Some(0));
        assert_eq!(reach_of(r"\b(sk-ant-o[ar]t01-[A-Za-z0-9_-]{80,120})(?:[^A-Za-z0-9_-]|$)", ant), Some(0));
        assert_eq!(reach_of(r"(?i)\b(?:api[_-]?key|apikey)\s*=", &["api_key", "api-key", "apikey"]), Some(0));
        assert_eq!(reach_of(r"(?i)\b(?:api[_-]?key|apikey)\s*=", &["api_key", "apikey"]), None);
        assert_eq!(reach_of(r"(?i)\b(?:cohere|co_api_key)[\w.-]{0,24}\s*=", &["cohere", "co_api_key"]), Some(0));
    }

    #[test]
    fn alternations_take_the_worst_branch() {
        assert_eq!(reach_of(r"(?:AKIA|ASIA|xxA3T)[A-Z0-9]{16}", &["akia", "asia", "a3t"]), Some(2));
        assert_eq!(reach_of(r"(?:AKIA|BOGUS)[A-Z0-9]{16}", &["akia"]), None);
    }

    #[test]
    fn unbounded_or_optional_prefixes_give_up() {
        assert_eq!(reach_of(r"[a-z]+token", &["token"]), None);
        assert_eq!(reach_of(r"(?:token)?[a-z]{8}", &["token"]), None);
        assert_eq!(reach_of(r"[a-z]{8}", &["token"]), None);
        // A keyword split over an optional part is not recognised (sound, not clever).
        assert_eq!(reach_of(r"to(?:x)?ken", &["token"]), None);
    }

    #[test]
    fn a_keyword_after_a_bounded_run_of_blanks_is_found() {
        // sql-password-clause, whose `[ \t]+` once sent it over the whole text.
        let sql = r"(?i:\b(?:(?:with|encrypted|unencrypted|login)[ \t]{1,16}password(?:[ \t]*=)?|password[ \t]*\()[ \t]*)'([^'\s]{6,64})'";
        assert_eq!(reach_of(sql, &["password"]), Some("unencrypted".len() + 16));
    }

    #[test]
    fn a_keyword_after_an_unbounded_part_is_not_trusted() {
        assert_eq!(reach_of(r"ab[ \t]*token", &["token"]), None);
        assert_eq!(reach_of(r"token[ \t]*secret", &["secret"]), None);
        assert_eq!(reach_of(r"token[ \t]*secret", &["secret", "token"]), Some(0));
    }
}
