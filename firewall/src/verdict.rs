//! The words every detector answers in: [`Severity`], [`Action`], [`Finding`].
//!
//! Invariant: a [`Finding`] never carries the raw matched text. Its `excerpt` is produced by
//! [`mask`], which keeps at most a short prefix and the length, so findings can be logged,
//! audited and shown in a dashboard without re-leaking the secret they describe.

use serde::{Deserialize, Serialize};

use crate::detect::encoded::Encoding;
use crate::detect::entropy::Metric;

/// How bad a finding is, as the rule author judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Low,
    Medium,
    High,
    Critical,
}

/// What the stream does about a finding. Ordered by strength, so the action of a step is
/// the maximum over its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Nothing found: let the text through.
    Allow,
    /// Record the finding, let the text through unchanged.
    Log,
    /// Replace the secret with `[REDACTED:<rule-id>]` and go on.
    Redact,
    /// Stop the stream; release only what precedes the match.
    Block,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
            Severity::Critical => "critical",
        }
    }
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Log => "log",
            Action::Redact => "redact",
            Action::Block => "block",
        }
    }
}

/// Which detector raised a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DetectorKind {
    /// A secret rule from the rule files.
    Secret,
    /// A `[[canary]]` string owned by another tenant.
    Canary,
    /// A word n-gram that another tenant sent or received.
    Ngram,
    /// An entropy or surprisal excursion from the tenant's baseline.
    Entropy,
    /// The backend reported that a token attended to another tenant's data.
    Provenance,
}

/// Detector-specific evidence attached to a finding.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Detail {
    /// Pattern rules carry no more than the span.
    None,
    /// Canary, n-gram, provenance or an owned secret: the tenants the text belongs to
    /// (never the responder).
    Foreign { owners: Vec<String>, shared_by: usize },
    /// A secret the responding tenant owns itself (see `detect::secret`).
    Own,
    /// Entropy detector: the observed value against the tenant's baseline.
    Statistic { metric: Metric, value: f64, mean: f64, z_score: f64, p_value: f64 },
}

/// One thing a detector found in a response.
///
/// `start..end` is the byte span of the secret (the rule's `secret_group`, or the whole
/// match); `match_start..match_end` is the whole regex match, which is what a block cuts at.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub rule_id: String,
    pub start: usize,
    pub end: usize,
    pub match_start: usize,
    pub match_end: usize,
    pub severity: Severity,
    pub action: Action,
    /// Masked view of the secret: a short prefix, asterisks and the length.
    pub excerpt: String,
    pub kind: DetectorKind,
    pub detail: Detail,
    /// How the response wrote what was found, when not in plain text (see
    /// `detect::encoded`): the spans cover the encoded characters, the excerpt and the
    /// verdict are those of the decoded text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

impl Finding {
    /// A detector's finding whose span is its whole match (no secret group inside a wider
    /// match), in plain text: what every detector but the secret rules reports.
    pub(crate) fn over(
        rule_id: impl Into<String>,
        (start, end): (usize, usize),
        kind: DetectorKind,
        (severity, action): (Severity, Action),
        excerpt: String,
        detail: Detail,
    ) -> Finding {
        Finding {
            rule_id: rule_id.into(),
            start,
            end,
            match_start: start,
            match_end: end,
            severity,
            action,
            excerpt,
            kind,
            detail,
            encoding: None,
        }
    }

    /// A secret rule's match that only the words around it turned down (`allow_line`, the
    /// judge): kept, with `Action::Allow`, until the secret-ownership check has seen it; it
    /// never leaves the crate (see `scan::accept`).
    pub(crate) fn is_candidate(&self) -> bool {
        self.kind == DetectorKind::Secret && self.action == Action::Allow
    }

    /// The canonical order of findings: by span, then rule id. One-shot and streaming
    /// results are compared in this order.
    pub fn sort(findings: &mut [Finding]) {
        findings.sort_by(|a, b| {
            (a.start, a.end, a.match_start, &a.rule_id).cmp(&(b.start, b.end, b.match_start, &b.rule_id))
        });
    }
}

/// Masks `secret` for display: at most 4 leading characters (fewer for short secrets, so
/// that at least three quarters stay hidden), up to 8 asterisks, and the character count.
pub fn mask(secret: &str) -> String {
    let len = secret.chars().count();
    let shown = (len / 4).min(4);
    let prefix = secret.char_indices().nth(shown).map_or(secret, |(end, _)| &secret[..end]);
    let stars = (len - shown).min(8);
    // One allocation: every finding gets an excerpt, and secret-dense text has thousands.
    let mut out = String::with_capacity(prefix.len() + stars + 20);
    out.push_str(prefix);
    out.extend(std::iter::repeat_n('*', stars));
    // By hand: `write!` took half of this function's time.
    out.push_str(" (");
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = len;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    out.extend(digits[at..].iter().map(|&d| char::from(d)));
    out.push_str(" chars)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_hides_most_of_the_secret() {
        assert_eq!(mask("AKIA2NGEVCHPZHKN4IV2"), "AKIA******** (20 chars)");
        assert_eq!(mask("abc"), "*** (3 chars)");
        assert_eq!(mask(""), " (0 chars)");
        assert_eq!(mask("ééééé"), "é**** (5 chars)");
        assert_eq!(mask(&"x".repeat(100)), "xxxx******** (100 chars)");
        assert!(!mask("ghp_0123456789abcdefghijklmnopqrstuvwxyzAB").contains("0123"));
    }

    #[test]
    fn details_serialise_with_their_type() {
        assert_eq!(serde_json::to_string(&Detail::Own).unwrap_or_default(), r#"{"type":"own"}"#);
        let foreign = Detail::Foreign { owners: vec!["globex".into()], shared_by: 1 };
        assert_eq!(
            serde_json::to_string(&foreign).unwrap_or_default(),
            r#"{"type":"foreign","owners":["globex"],"shared_by":1}"#
        );
    }

    #[test]
    fn actions_order_by_strength() {
        assert!(Action::Block > Action::Redact && Action::Redact > Action::Log && Action::Log > Action::Allow);
    }
}
