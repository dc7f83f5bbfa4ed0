//! Provenance detector: the engine reports, per token, whose KV data the token attended
//! to. Any owner other than the responding tenant (or a trusted owner) means the token was
//! computed from someone else's data: an immediate finding, blocking by default, raised
//! before the token's text is appended, so none of it is ever released.

use crate::detect::ScanContext;
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Rule id of provenance findings.
pub const RULE_ID: &str = "foreign-provenance";

#[derive(Debug, Clone, PartialEq)]
pub struct ProvenanceConfig {
    pub action: Action,
}

impl Default for ProvenanceConfig {
    fn default() -> Self {
        ProvenanceConfig { action: Action::Block }
    }
}

/// A finding when `owners` names anyone foreign to `ctx`; `start..end` is the token's span.
pub(crate) fn check(
    cfg: &ProvenanceConfig,
    ctx: &ScanContext,
    owners: &[String],
    token: &str,
    start: usize,
) -> Option<Finding> {
    let mut foreign: Vec<String> = owners.iter().filter(|o| ctx.is_foreign(o)).cloned().collect();
    if foreign.is_empty() {
        return None;
    }
    foreign.sort();
    foreign.dedup();
    let end = start + token.len();
    let detail = Detail::Foreign { shared_by: foreign.len(), owners: foreign };
    let verdict = (Severity::Critical, cfg.action);
    Some(Finding::over(RULE_ID, (start, end), DetectorKind::Provenance, verdict, mask(token), detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_and_trusted_owners_are_not_foreign() {
        let mut ctx = ScanContext::new("acme");
        ctx.trusted_owners.push("system".into());
        let cfg = ProvenanceConfig::default();
        assert!(check(&cfg, &ctx, &["acme".into(), "system".into()], "hi", 0).is_none());
        let f = check(&cfg, &ctx, &["acme".into(), "globex".into(), "globex".into()], "hi", 5);
        assert!(
            matches!(f, Some(Finding { start: 5, end: 7, action: Action::Block, detail: Detail::Foreign { ref owners, .. }, .. }) if owners == &["globex"])
        );
    }
}
