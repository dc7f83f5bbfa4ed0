//! What a regex match of a secret rule must pass to become a finding, the same for one-shot
//! and streaming scans: one of the rule's keywords inside the match, then the secret's
//! `min_entropy`, the `allow`, `allow_line` and `allow_repeated_user` exemptions and, for
//! rules that ask it, the generic-secret judge's least score (`rules/README.md`, "How a
//! rule matches").
//!
//! `min_entropy` and `allow` read the secret alone. `allow_line`, `allow_repeated_user` and
//! the judge also read the words around it, and those are the response's own: whoever
//! steers the response (a prompt injection, another tenant's document in the context)
//! writes them. So a match that only its surroundings turn down is not dropped here but
//! kept as a *candidate* ([`Finding::is_candidate`]): the secret-ownership check still
//! blocks it when the value is another tenant's secret, and drops it otherwise
//! (`detect::secret::settle`). Wording can hide a value from the rules' guess that it is a
//! secret, never from its owner.

use crate::rules::rule::{shannon_entropy, Rule};
use crate::scan::judge::{context_before as judge_context, Judge};
use crate::scan::near_keywords::{Found, Verdict};
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding};

/// How [`accept`] tells whether a match holds one of its rule's keywords.
#[derive(Debug, Clone, Copy)]
pub(crate) enum KeywordCheck<'a> {
    /// Search the match for each keyword.
    Search,
    /// Every occurrence of the rule's keywords in the text, as `(start, end)` sorted by
    /// start (what one-shot scanning has found already): a match holds a keyword exactly
    /// when one of them lies inside it.
    Hits(&'a [(usize, usize)]),
}

impl KeywordCheck<'_> {
    fn holds(self, rule: &Rule, hay: &str, (ms, me): (usize, usize)) -> bool {
        match self {
            KeywordCheck::Search => {
                hay.get(ms..me).is_some_and(|whole| rule.keywords.iter().any(|k| contains_ascii_ci(whole, k)))
            }
            KeywordCheck::Hits(hits) => {
                let first = hits.partition_point(|&(start, _)| start < ms);
                hits[first..].iter().take_while(|&&(start, _)| start < me).any(|&(_, end)| end <= me)
            }
        }
    }
}

/// Decides what a match of `rule` at `found` (offsets into `hay`) counts for: nothing
/// without a keyword inside it; otherwise the walk takes it, and it is a finding unless
/// `min_entropy` or an `allow` regex rules the secret out, or a candidate when only its
/// line (`allow_line`, `allow_repeated_user`, the judge) does.
pub(crate) fn accept(
    rule: &Rule,
    hay: &str,
    base: usize,
    ((ms, me), (ss, se)): Found,
    keywords: KeywordCheck<'_>,
    out: &mut Vec<Finding>,
) -> Verdict {
    let (Some(_), Some(secret)) = (hay.get(ms..me), hay.get(ss..se)) else { return Verdict::Passed };
    if !rule.keywords.is_empty() && !keywords.holds(rule, hay, (ms, me)) {
        return Verdict::Passed;
    }
    if rule.min_entropy.is_some_and(|min| shannon_entropy(secret) < min) || rule.is_allowed(secret) {
        return Verdict::Taken;
    }
    let by_context = rule.is_line_allowed(hay, ms, me)
        || rule.is_repeated_user(hay, ss, se)
        || rule.judge.is_some_and(|min| Judge::builtin().score(judge_context(hay, ms, ss), secret) < min);
    out.push(Finding {
        rule_id: rule.id.clone(),
        start: base + ss,
        end: base + se,
        match_start: base + ms,
        match_end: base + me,
        severity: rule.severity,
        action: if by_context { Action::Allow } else { rule.action },
        excerpt: mask(secret),
        kind: DetectorKind::Secret,
        detail: Detail::None,
        encoding: None,
    });
    Verdict::Taken
}

/// Whether `hay` contains `needle` (lowercase ASCII-folded) ASCII case-insensitively.
fn contains_ascii_ci(hay: &str, needle: &str) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    !n.is_empty() && h.len() >= n.len() && h.windows(n.len()).any(|w| w.eq_ignore_ascii_case(n))
}
