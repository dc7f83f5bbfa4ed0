//! One audit record (`/admin/audit/{id}`): the request's metadata, a map of the response's
//! bytes with each finding's span, and every finding with its masked excerpt (the shown
//! part highlighted), its provenance and its statistics. Never more text than the record
//! holds: the record has no raw match to show.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::response::Html;
use firewall::DetectorKind;

use super::charts::{span_map, Span};
use super::html::{esc, facts, frame, query, segment, Section};
use super::session::Session;
use super::time::format_ms;
use super::AdminError;
use crate::audit::{AuditFinding, AuditRecord};
use crate::state::AppState;

/// Findings shown open; the rest (a long leak matches many overlapping n-grams) fold
/// away behind a `<details>`, which needs no script.
const OPEN_FINDINGS: usize = 3;

/// `GET /admin/audit/{id}`
pub async fn page(
    session: Session,
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Html<String>, AdminError> {
    let record = state
        .protection
        .store()
        .get_audit(&id)
        .await?
        .ok_or_else(|| AdminError::NotFound(format!("No audit record with id {id:?}.")))?;
    let body = render(&record);
    Ok(Html(frame("Blocked response", Some(Section::Blocked), Some(&session.csrf), &body)))
}

fn render(r: &AuditRecord) -> String {
    let sources =
        if r.source_tenants().is_empty() { "none identified".to_owned() } else { r.source_tenants().join(", ") };
    let mut meta = vec![
        ("Time (UTC)", format_ms(r.time_ms())),
        ("Tenant", r.tenant().to_owned()),
        ("Model", r.model().to_owned()),
        ("Action", r.action().as_str().to_owned()),
        ("Suspected source tenants", sources),
        ("Bytes released before the stop", r.bytes_released().to_string()),
        ("Request id", r.request_id().to_owned()),
        ("Audit id", r.id().to_owned()),
    ];
    if let Some(failure) = r.failure() {
        meta.push(("Failed closed because", failure.to_owned()));
    }
    let mut out = format!(
        "<p><a href=\"/admin?{}\">« All blocked responses of this tenant</a></p>{}",
        esc(&query(&[("tenant", r.tenant())])),
        facts(&meta)
    );
    let spans: Vec<Span> = r
        .findings()
        .iter()
        .map(|f| Span { start: f.span().0, end: f.span().1, label: f.rule_id().to_owned() })
        .collect();
    let _ = write!(
        out,
        "<h2>Where in the response</h2>{}<p class=\"muted legend\"><span class=\"key released\"></span>released to the client \
         <span class=\"key hit\"></span>finding</p>",
        span_map(r.bytes_released(), &spans)
    );
    let _ = write!(out, "<h2>Findings ({})</h2>", r.findings().len());
    if r.unlisted_findings() > 0 {
        let _ = write!(
            out,
            "<p class=\"muted\">and {} more findings of redact or log rules, counted in the metrics but not kept</p>",
            r.unlisted_findings()
        );
    }
    let (first, rest) = r.findings().split_at(r.findings().len().min(OPEN_FINDINGS));
    for f in first {
        out.push_str(&finding(f));
    }
    if !rest.is_empty() {
        let _ = write!(out, "<details class=\"more\"><summary>{} more findings</summary>", rest.len());
        for f in rest {
            out.push_str(&finding(f));
        }
        out.push_str("</details>");
    }
    out
}

fn finding(f: &AuditFinding) -> String {
    let (start, end) = f.span();
    let mut rows = vec![
        ("Detector", detector_name(f.detector(), f.rule_id()).to_owned()),
        ("Severity", f.severity().as_str().to_owned()),
        ("Action", f.action().as_str().to_owned()),
        ("Span (bytes)", format!("{start}–{end} ({} bytes)", end.saturating_sub(start))),
    ];
    if let Some(e) = f.encoding() {
        rows.push(("Written in", format!("{} (found decoded)", e.as_str())));
    }
    if !f.source_tenants().is_empty() {
        let label = match f.detector() {
            DetectorKind::Provenance => "Engine-reported owners",
            DetectorKind::Ngram if f.rule_id() == firewall::FOREIGN_TOKEN_RULE_ID => "Foreign token owners",
            DetectorKind::Ngram => "Foreign n-gram owners",
            DetectorKind::Canary => "Canary owner",
            _ => "Source tenants",
        };
        rows.push((label, f.source_tenants().join(", ")));
    }
    if let Some(n) = shared_by(f) {
        rows.push(("Tenants sharing the text", n.to_string()));
    }
    if let Some(s) = f.statistic() {
        rows.push(("Statistic", s.metric.clone()));
        rows.push(("Value / tenant mean", format!("{:.3} / {:.3}", s.value, s.mean)));
        rows.push(("z-score", format!("{:.2}", s.z_score)));
        rows.push(("p-value", format!("{:.2e}", s.p_value)));
    }
    format!(
        "<section class=\"finding\"><h3><a href=\"/admin/rules/{}\">{}</a> <span class=\"badge {}\">{}</span></h3>\
         <p class=\"excerpt\">{}</p>{}</section>",
        esc(&segment(f.rule_id())),
        esc(f.rule_id()),
        f.action().as_str(),
        f.action().as_str(),
        excerpt(f.excerpt()),
        facts(&rows)
    )
}

/// The masked excerpt (`AKIA******** (20 chars)`) with the masked match highlighted and
/// its length note set apart.
fn excerpt(masked: &str) -> String {
    match masked.rsplit_once(" (") {
        Some((shown, note)) => format!("<mark>{}</mark> <span class=\"muted\">({}</span>", esc(shown), esc(note)),
        None => format!("<mark>{}</mark>", esc(masked)),
    }
}

/// How many tenants share a foreign n-gram. The record keeps it but exposes it only in its
/// serialised form, which is the audit log's stable shape.
fn shared_by(f: &AuditFinding) -> Option<u64> {
    serde_json::to_value(f).ok()?.get("shared_by")?.as_u64()
}

/// The detector, as the page names it; the n-gram detector's single-token findings have
/// their own rule id.
fn detector_name(kind: DetectorKind, rule_id: &str) -> &'static str {
    match kind {
        DetectorKind::Secret => "secret rule",
        DetectorKind::Canary => "canary",
        DetectorKind::Ngram if rule_id == firewall::FOREIGN_TOKEN_RULE_ID => "foreign token",
        DetectorKind::Ngram => "foreign n-gram",
        DetectorKind::Entropy => "entropy anomaly",
        DetectorKind::Provenance => "engine provenance",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::tests::{ctx, finding as raw_finding};
    use firewall::{Action, Detail};

    #[test]
    fn detail_shows_provenance_and_statistics_escaped() {
        let foreign = Detail::Foreign { owners: vec!["<globex>".into()], shared_by: 1 };
        let stat = Detail::Statistic {
            metric: firewall::Metric::Surprisal,
            value: 7.0,
            mean: 2.0,
            z_score: 5.5,
            p_value: 1e-8,
        };
        let mut c = ctx("acme");
        c.request_id = "<script>alert(1)</script>".into();
        let r = AuditRecord::new(
            c,
            Action::Block,
            &[
                raw_finding("foreign-ngram", &firewall::mask("some text"), foreign),
                raw_finding("entropy", "a*** (4 chars)", stat),
            ],
            12,
        );
        let html = render(&r);
        assert!(!html.contains("<script>") && !html.contains("<globex>"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && html.contains("&lt;globex&gt;"));
        assert!(
            html.contains("<mark>so*******</mark> <span class=\"muted\">(9 chars)</span>")
                && html.contains("z-score")
                && html.contains("5.50")
        );
        assert!(html.contains("Tenants sharing the text"));
    }

    #[test]
    fn findings_past_the_listed_ones_are_counted_on_the_page_and_in_the_record() {
        let listed = [raw_finding("test-redact", "rid_******** (12 chars)", Detail::None)];
        let r = AuditRecord::new(ctx("acme"), Action::Redact, &listed, 40);
        assert!(!render(&r).contains("more findings of redact or log rules"));
        assert!(
            !serde_json::to_string(&r).unwrap_or_default().contains("unlisted_findings"),
            "old readers see no change"
        );
        let r = r.with_unlisted_findings(2_000);
        assert!(render(&r).contains("and 2000 more findings of redact or log rules"));
        let json = serde_json::to_string(&r).unwrap_or_default();
        let back: AuditRecord = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
        assert_eq!(back.unlisted_findings(), 2_000);
    }

    #[test]
    fn a_foreign_token_is_named_apart_from_n_grams_and_its_encoding_shown() {
        let foreign = Detail::Foreign { owners: vec!["globex".into()], shared_by: 1 };
        let token = firewall::Finding {
            kind: firewall::DetectorKind::Ngram,
            encoding: Some(firewall::Encoding::Base64),
            ..raw_finding(firewall::FOREIGN_TOKEN_RULE_ID, &firewall::mask("7hq2lx9vb4nz8kc3"), foreign.clone())
        };
        let ngram = firewall::Finding {
            kind: firewall::DetectorKind::Ngram,
            ..raw_finding(firewall::FOREIGN_NGRAM_RULE_ID, &firewall::mask("some text"), foreign)
        };
        let html = render(&AuditRecord::new(ctx("acme"), Action::Block, &[token, ngram], 12));
        assert!(html.contains("<dt>Detector</dt><dd>foreign token</dd>"), "{html}");
        assert!(html.contains("<dt>Detector</dt><dd>foreign n-gram</dd>"), "{html}");
        assert!(html.contains("Foreign token owners") && html.contains("Foreign n-gram owners"), "{html}");
        // The token was written in base64; the n-gram plainly.
        assert_eq!(html.matches("<dt>Written in</dt><dd>base64 (found decoded)</dd>").count(), 1, "{html}");
    }
}
