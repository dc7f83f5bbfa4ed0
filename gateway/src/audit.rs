//! Audit records: one per blocked or redacted response, for the security team.
//!
//! Owns the [`AuditRecord`] type, its JSON shape (the file line, the Redis stream entry and
//! the admin API body are the same object) and the [`AuditQuery`] filters. Storage lives in
//! [`crate::store`].
//!
//! Invariant: a record never carries a raw secret or prompt text. Records are built only
//! from firewall [`Finding`]s through [`AuditRecord::new`], which keeps the finding's
//! masked excerpt and re-masks any excerpt that does not have [`firewall::mask`]'s shape,
//! so a detector bug cannot write matched bytes into the log.

use firewall::{Action, Detail, DetectorKind, Encoding, Finding, Severity};
use serde::{Deserialize, Serialize};

/// Who, what and where a record is about (the parts the firewall does not know).
#[derive(Debug, Clone, Default)]
pub struct AuditContext {
    pub tenant: String,
    pub model: String,
    pub request_id: String,
}

/// One finding as the audit log keeps it: no span text, only a masked excerpt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditFinding {
    rule_id: String,
    detector: DetectorKind,
    severity: Severity,
    action: Action,
    /// Byte span of the finding in the response text.
    start: usize,
    end: usize,
    excerpt: String,
    /// Tenants the text belongs to (canary, n-gram, provenance findings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    source_tenants: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shared_by: Option<usize>,
    /// Entropy findings: which statistic and how far from the tenant's baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    statistic: Option<AuditStatistic>,
    /// How the response wrote the finding's text when not plainly (base64, hex, percent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encoding: Option<Encoding>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditStatistic {
    pub metric: String,
    pub value: f64,
    pub mean: f64,
    pub z_score: f64,
    pub p_value: f64,
}

impl AuditFinding {
    fn from_finding(f: &Finding) -> AuditFinding {
        let (source_tenants, shared_by, statistic) = match &f.detail {
            Detail::None => (Vec::new(), None, None),
            Detail::Foreign { owners, shared_by } => (owners.clone(), Some(*shared_by), None),
            Detail::Own => (Vec::new(), None, None),
            Detail::Statistic { metric, value, mean, z_score, p_value } => (
                Vec::new(),
                None,
                Some(AuditStatistic {
                    metric: metric_name(*metric).to_owned(),
                    value: *value,
                    mean: *mean,
                    z_score: *z_score,
                    p_value: *p_value,
                }),
            ),
        };
        let excerpt = if looks_masked(&f.excerpt) { f.excerpt.clone() } else { firewall::mask(&f.excerpt) };
        AuditFinding {
            rule_id: f.rule_id.clone(),
            detector: f.kind,
            severity: f.severity,
            action: f.action,
            start: f.start,
            end: f.end,
            excerpt,
            source_tenants,
            shared_by,
            statistic,
            encoding: f.encoding,
        }
    }

    pub fn rule_id(&self) -> &str {
        &self.rule_id
    }
    pub fn detector(&self) -> DetectorKind {
        self.detector
    }
    pub fn severity(&self) -> Severity {
        self.severity
    }
    pub fn action(&self) -> Action {
        self.action
    }
    pub fn span(&self) -> (usize, usize) {
        (self.start, self.end)
    }
    pub fn excerpt(&self) -> &str {
        &self.excerpt
    }
    pub fn source_tenants(&self) -> &[String] {
        &self.source_tenants
    }
    pub fn statistic(&self) -> Option<&AuditStatistic> {
        self.statistic.as_ref()
    }
    pub fn encoding(&self) -> Option<Encoding> {
        self.encoding
    }
}

/// The stable name of a severity (as in rule files and `/metrics` labels).
pub fn severity_name(severity: Severity) -> &'static str {
    match severity {
        Severity::Low => "low",
        Severity::Medium => "medium",
        Severity::High => "high",
        Severity::Critical => "critical",
    }
}

/// The severity named by [`severity_name`].
pub fn severity_from_name(name: &str) -> Option<Severity> {
    [Severity::Low, Severity::Medium, Severity::High, Severity::Critical]
        .into_iter()
        .find(|s| severity_name(*s) == name)
}

/// The stable name of an entropy metric (as in `/metrics` labels).
pub fn metric_name(metric: firewall::Metric) -> &'static str {
    match metric {
        firewall::Metric::CharEntropy => "char_entropy",
        firewall::Metric::Surprisal => "surprisal",
        firewall::Metric::PredictiveEntropy => "predictive_entropy",
    }
}

/// The metric named by [`metric_name`].
pub fn metric_from_name(name: &str) -> Option<firewall::Metric> {
    [firewall::Metric::CharEntropy, firewall::Metric::Surprisal, firewall::Metric::PredictiveEntropy]
        .into_iter()
        .find(|m| metric_name(*m) == name)
}

/// Whether `s` has the shape [`firewall::mask`] produces: at most 4 shown characters, at
/// most 8 asterisks, ` (<n> chars)`, with the shown part at most a quarter of n.
fn looks_masked(s: &str) -> bool {
    let Some(head) = s.strip_suffix(" chars)") else { return false };
    let Some((shown, count)) = head.rsplit_once(" (") else { return false };
    let Ok(len) = count.parse::<usize>() else { return false };
    let visible = shown.trim_end_matches('*');
    let stars = shown.len() - visible.len();
    let n_visible = visible.chars().count();
    n_visible <= 4 && n_visible <= len / 4 && stars <= 8 && stars == (len - n_visible).min(8)
}

/// One blocked or redacted response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// UUIDv7, so ids sort by creation time.
    id: String,
    /// Milliseconds since the Unix epoch.
    time_ms: u64,
    tenant: String,
    model: String,
    request_id: String,
    action: Action,
    findings: Vec<AuditFinding>,
    /// Union of the findings' source tenants, sorted.
    source_tenants: Vec<String>,
    /// Response bytes the client received before the block (or in all, for a redaction).
    bytes_released: u64,
    /// Why the response failed closed (a firewall or store error), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure: Option<String>,
    /// Findings the response made beyond those listed (see
    /// [`crate::response_guard::MAX_LISTED_FINDINGS`]): counted in the metrics, not kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    unlisted_findings: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AuditRecord {
    /// The only way to build a record: from the firewall's findings, never from text.
    /// `action` is what the response suffered (block or redact; a store or firewall error
    /// that failed closed is a block with whatever findings there were).
    pub fn new(ctx: AuditContext, action: Action, findings: &[Finding], bytes_released: u64) -> AuditRecord {
        AuditRecord::with_id(uuid::Uuid::now_v7(), ctx, action, findings, bytes_released)
    }

    /// As [`AuditRecord::new`], under an id reserved earlier (a streamed response announces
    /// its audit id in a header before it knows whether it will need a record).
    pub fn with_id(
        id: uuid::Uuid,
        ctx: AuditContext,
        action: Action,
        findings: &[Finding],
        bytes_released: u64,
    ) -> AuditRecord {
        let time_ms = id
            .get_timestamp()
            .map(|t| {
                let (s, ns) = t.to_unix();
                s * 1000 + u64::from(ns) / 1_000_000
            })
            .unwrap_or(0);
        AuditRecord::build(id.to_string(), time_ms, ctx, action, findings, bytes_released)
    }

    fn build(
        id: String,
        time_ms: u64,
        ctx: AuditContext,
        action: Action,
        findings: &[Finding],
        bytes_released: u64,
    ) -> AuditRecord {
        let findings: Vec<AuditFinding> = findings.iter().map(AuditFinding::from_finding).collect();
        let mut source_tenants: Vec<String> = findings.iter().flat_map(|f| f.source_tenants.iter().cloned()).collect();
        source_tenants.sort();
        source_tenants.dedup();
        AuditRecord {
            id,
            time_ms,
            tenant: ctx.tenant,
            model: ctx.model,
            request_id: ctx.request_id,
            action,
            findings,
            source_tenants,
            bytes_released,
            failure: None,
            unlisted_findings: 0,
        }
    }

    /// Notes that the response made `n` findings more than `findings` lists.
    pub fn with_unlisted_findings(mut self, n: u64) -> AuditRecord {
        self.unlisted_findings = n;
        self
    }

    /// Findings the response made beyond those the record lists.
    pub fn unlisted_findings(&self) -> u64 {
        self.unlisted_findings
    }

    /// Marks the record as a fail-closed block caused by `reason`.
    pub fn failed_closed(mut self, reason: impl Into<String>) -> AuditRecord {
        self.action = Action::Block;
        self.failure = Some(reason.into());
        self
    }

    pub fn failure(&self) -> Option<&str> {
        self.failure.as_deref()
    }

    pub fn id(&self) -> &str {
        &self.id
    }
    pub fn time_ms(&self) -> u64 {
        self.time_ms
    }
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
    pub fn model(&self) -> &str {
        &self.model
    }
    pub fn request_id(&self) -> &str {
        &self.request_id
    }
    pub fn action(&self) -> Action {
        self.action
    }
    pub fn findings(&self) -> &[AuditFinding] {
        &self.findings
    }
    pub fn source_tenants(&self) -> &[String] {
        &self.source_tenants
    }
    pub fn bytes_released(&self) -> u64 {
        self.bytes_released
    }

    /// How serious the record is, for retention: its most severe finding's severity; a
    /// fail-closed record without findings counts as high (it may hide anything).
    pub fn severity(&self) -> Severity {
        match self.findings.iter().map(|f| f.severity).max() {
            Some(s) => s,
            None if self.failure.is_some() => Severity::High,
            None => Severity::Low,
        }
    }

    /// Test helper: a record at a chosen time (ids stay unique).
    #[cfg(test)]
    pub(crate) fn at(time_ms: u64, ctx: AuditContext, action: Action, findings: &[Finding]) -> AuditRecord {
        AuditRecord::build(uuid::Uuid::now_v7().to_string(), time_ms, ctx, action, findings, 0)
    }
}

/// Largest page the admin API may ask for.
pub const MAX_PAGE: usize = 500;
/// Page size when none is asked for.
pub const DEFAULT_PAGE: usize = 50;

/// Filters and paging for listing records, newest first. Every filter is optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditQuery {
    pub tenant: Option<String>,
    /// A record matches when any of its findings has this rule id.
    pub rule: Option<String>,
    pub action: Option<Action>,
    /// Inclusive lower bound on `time_ms`.
    pub since_ms: Option<u64>,
    /// Exclusive upper bound on `time_ms`.
    pub until_ms: Option<u64>,
    /// Page size, clamped to 1..=[`MAX_PAGE`]; 0 = [`DEFAULT_PAGE`].
    pub limit: usize,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

impl AuditQuery {
    pub fn matches(&self, r: &AuditRecord) -> bool {
        self.tenant.as_deref().is_none_or(|t| r.tenant == t)
            && self.rule.as_deref().is_none_or(|rule| r.findings.iter().any(|f| f.rule_id == rule))
            && self.action.is_none_or(|a| r.action == a)
            && self.since_ms.is_none_or(|s| r.time_ms >= s)
            && self.until_ms.is_none_or(|u| r.time_ms < u)
    }

    pub fn page_size(&self) -> usize {
        match self.limit {
            0 => DEFAULT_PAGE,
            n => n.min(MAX_PAGE),
        }
    }
}

/// One page of records, newest first; `next_cursor` is absent on the last page.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AuditPage {
    pub records: Vec<AuditRecord>,
    pub next_cursor: Option<String>,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn finding(rule: &str, excerpt: &str, detail: Detail) -> Finding {
        Finding {
            rule_id: rule.into(),
            start: 3,
            end: 23,
            match_start: 3,
            match_end: 23,
            severity: Severity::High,
            action: Action::Block,
            excerpt: excerpt.into(),
            kind: DetectorKind::Secret,
            detail,
            encoding: None,
        }
    }

    pub(crate) fn ctx(tenant: &str) -> AuditContext {
        AuditContext { tenant: tenant.into(), model: "mock".into(), request_id: "req_1".into() }
    }

    #[test]
    fn records_keep_masked_excerpts_and_source_tenants() {
        let foreign = Detail::Foreign { owners: vec!["globex".into(), "initech".into()], shared_by: 2 };
        let findings = [
            finding("aws-access-key", &firewall::mask("AKIA2NGEVCHPZHKN4IV2"), Detail::None),
            finding("foreign-ngram", &firewall::mask("some words"), foreign),
        ];
        let r = AuditRecord::new(ctx("acme"), Action::Block, &findings, 17);
        assert_eq!(r.findings()[0].excerpt(), "AKIA******** (20 chars)");
        assert_eq!(r.source_tenants(), ["globex", "initech"]);
        assert_eq!((r.tenant(), r.action(), r.bytes_released()), ("acme", Action::Block, 17));
        assert!(r.time_ms() > 1_600_000_000_000);
        let json = serde_json::to_string(&r).unwrap_or_default();
        let back: AuditRecord = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(back, r);
    }

    #[test]
    fn raw_text_in_an_excerpt_is_masked_again() {
        let secret = "ghp_0123456789abcdefghijklmnopqrstuvwxyzAB";
        for raw in [secret, "AKIA (20 chars)", "abcdefgh******** (9 chars)"] {
            let r = AuditRecord::new(ctx("acme"), Action::Block, &[finding("x", raw, Detail::None)], 0);
            let ex = r.findings()[0].excerpt();
            assert!(!ex.contains("0123") && !ex.contains("abcdefgh") && ex != raw, "{ex}");
        }
        assert!(looks_masked(&firewall::mask("")) && looks_masked(&firewall::mask("abc")));
    }

    #[test]
    fn statistic_details_carry_z_scores() {
        let d = Detail::Statistic {
            metric: firewall::Metric::Surprisal,
            value: 7.0,
            mean: 2.0,
            z_score: 5.5,
            p_value: 1e-8,
        };
        let r = AuditRecord::new(ctx("acme"), Action::Log, &[finding("entropy-anomaly", &firewall::mask("tok"), d)], 0);
        let s = r.findings()[0].statistic().cloned();
        assert_eq!(s.map(|s| (s.metric, s.z_score)), Some(("surprisal".to_owned(), 5.5)));
    }

    #[test]
    fn query_filters() {
        let r = AuditRecord::at(
            1_000,
            ctx("acme"),
            Action::Redact,
            &[finding("slack-token", "x*** (4 chars)", Detail::None)],
        );
        let q = |f: fn(&mut AuditQuery)| {
            let mut q = AuditQuery::default();
            f(&mut q);
            q.matches(&r)
        };
        assert!(q(|_| {}));
        assert!(q(|q| q.tenant = Some("acme".into())) && !q(|q| q.tenant = Some("globex".into())));
        assert!(q(|q| q.rule = Some("slack-token".into())) && !q(|q| q.rule = Some("aws".into())));
        assert!(q(|q| q.action = Some(Action::Redact)) && !q(|q| q.action = Some(Action::Block)));
        assert!(q(|q| q.since_ms = Some(1_000)) && !q(|q| q.since_ms = Some(1_001)));
        assert!(q(|q| q.until_ms = Some(1_001)) && !q(|q| q.until_ms = Some(1_000)));
        assert_eq!(AuditQuery { limit: 10_000, ..Default::default() }.page_size(), MAX_PAGE);
    }
}
