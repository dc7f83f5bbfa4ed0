//! The tenants page (`/admin/tenants`): per tenant, completions and blocked responses since
//! start-up, the block rate, blocks per minute over the last hour, and the entropy
//! baselines drawn against the global ones. Request counts come from the metrics (this
//! process, since start-up); blocks from the audit log over the same window, so the rate
//! compares like with like. A tenant flagged for probing (too many responses blocked for
//! other tenants' data in the window, see `probing`) is marked, with its foreign-data
//! blocks and whether it is quarantined.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;
use axum::Extension;
use firewall::Action;

use super::charts::{bars, curves, sparkline, Normal};
use super::html::{esc, frame, query, Section};
use super::session::Session;
use super::time::format_ms;
use super::{now_ms, Admin, AdminError};
use crate::audit::{AuditQuery, AuditRecord, MAX_PAGE};
use crate::probing::ProbeRow;
use crate::state::AppState;
use crate::stats::StatRow;

/// Most audit records read for one page view (the newest ones).
const MAX_SCAN: usize = 4 * MAX_PAGE;
/// The activity charts' bucket and span.
const MINUTE_MS: u64 = 60_000;
const MINUTES: usize = 60;

/// `GET /admin/tenants`
pub async fn page(
    session: Session,
    State(state): State<Arc<AppState>>,
    Extension(admin): Extension<Arc<Admin>>,
) -> Result<Html<String>, AdminError> {
    let now = now_ms();
    let hour_ago = now.saturating_sub(MINUTES as u64 * MINUTE_MS);
    let (records, capped) = recent_records(&state, admin.started_ms.min(hour_ago)).await?;
    let requests = state.metrics.completions_by_tenant();
    let stats = state.protection.stats().rows();
    let probes: BTreeMap<String, ProbeRow> =
        state.protection.probes().rows(now).into_iter().map(|r| (r.tenant.clone(), r)).collect();

    let mut tenants: BTreeSet<&str> = state.config.tenants.iter().map(|t| t.id.as_str()).collect();
    tenants.extend(requests.keys().map(String::as_str));
    tenants.extend(stats.iter().filter_map(|r| r.tenant.as_deref()));
    tenants.extend(records.iter().map(AuditRecord::tenant));
    tenants.extend(probes.keys().map(String::as_str));

    let mut body = format!(
        "<p class=\"muted\">Requests and blocks since this gateway started ({} UTC); activity over the last hour, per minute.{}</p>",
        format_ms(admin.started_ms),
        if capped { format!(" Only the newest {MAX_SCAN} audit records are counted.") } else { String::new() }
    );
    let all_minutes = per_minute(records.iter(), now);
    let _ = write!(
        body,
        "<section class=\"card\"><h2>Blocked or redacted responses per minute, all tenants</h2>{}</section>",
        bars("Blocked or redacted responses per minute, last hour", &all_minutes, "60 min ago", "now")
    );

    body.push_str(
        "<div class=\"table-wrap\"><table class=\"tenants\"><thead><tr><th>Tenant</th><th class=\"num\">Requests</th>\
         <th class=\"num\">Blocked</th><th class=\"num\">Redacted</th><th class=\"num\">Block rate</th><th>Probing</th><th>Last hour</th>\
         <th>Entropy baseline (mean ± sd, n)</th></tr></thead><tbody>",
    );
    for tenant in &tenants {
        let since_start = records.iter().filter(|r| r.tenant() == *tenant && r.time_ms() >= admin.started_ms);
        let (mut blocked, mut redacted) = (0u64, 0u64);
        for r in since_start {
            match r.action() {
                Action::Block => blocked += 1,
                Action::Redact => redacted += 1,
                _ => {}
            }
        }
        let asked = requests.get(*tenant).copied().unwrap_or(0);
        let rate = if asked == 0 { "—".to_owned() } else { format!("{:.1}%", 100.0 * blocked as f64 / asked as f64) };
        let minutes = per_minute(records.iter().filter(|r| r.tenant() == *tenant), now);
        let _ = write!(
            body,
            "<tr><td><a href=\"/admin?{}\">{}</a></td><td class=\"num\">{asked}</td><td class=\"num\">{blocked}</td>\
             <td class=\"num\">{redacted}</td><td class=\"num\">{rate}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&query(&[("tenant", tenant)])),
            esc(tenant),
            probe_cell(probes.get(*tenant), state.protection.quarantined(tenant)),
            sparkline(&format!("{tenant}: blocks per minute, last hour"), &minutes),
            baseline_cell(&stats, Some(tenant)),
        );
    }
    let _ = write!(
        body,
        "<tr class=\"global\"><td>global baseline</td><td class=\"num\">{}</td><td></td><td></td><td></td><td></td><td></td><td>{}</td></tr></tbody></table></div>",
        requests.values().sum::<u64>(),
        baseline_cell(&stats, None)
    );
    body.push_str(&distributions(&stats, &tenants));
    Ok(Html(frame("Tenants", Some(Section::Tenants), Some(&session.csrf), &body)))
}

/// The probing cell: the flag (and quarantine) first, else the foreign-data blocks so far.
fn probe_cell(row: Option<&ProbeRow>, quarantined: bool) -> String {
    match row {
        None => "—".to_owned(),
        Some(r) if r.flagged => format!(
            "<span class=\"badge block\" title=\"{} foreign-data blocks since start-up\">probing{}</span>",
            r.foreign_blocks,
            if quarantined { ", quarantined" } else { "" }
        ),
        Some(r) => format!("{} foreign-data block{}", r.foreign_blocks, if r.foreign_blocks == 1 { "" } else { "s" }),
    }
}

/// Records since `since_ms`, newest first, at most [`MAX_SCAN`]; true when capped.
async fn recent_records(state: &AppState, since_ms: u64) -> Result<(Vec<AuditRecord>, bool), AdminError> {
    let mut q = AuditQuery { since_ms: Some(since_ms), limit: MAX_PAGE, ..Default::default() };
    let mut out = Vec::new();
    loop {
        let page = state.protection.store().list_audit(&q).await?;
        out.extend(page.records);
        match page.next_cursor {
            Some(next) if out.len() < MAX_SCAN => q.cursor = Some(next),
            Some(_) => return Ok((out, true)),
            None => return Ok((out, false)),
        }
    }
}

/// Counts per minute over the last [`MINUTES`] minutes, oldest first.
fn per_minute<'a>(records: impl Iterator<Item = &'a AuditRecord>, now: u64) -> Vec<u64> {
    let mut buckets = vec![0u64; MINUTES];
    for r in records {
        let age = (now.saturating_sub(r.time_ms()) / MINUTE_MS) as usize;
        if age < MINUTES {
            buckets[MINUTES - 1 - age] += 1;
        }
    }
    buckets
}

fn baseline_cell(stats: &[StatRow], tenant: Option<&str>) -> String {
    let rows: Vec<String> = stats
        .iter()
        .filter(|r| r.tenant.as_deref() == tenant && r.count > 0)
        .map(|r| {
            format!(
                "<span class=\"stat\">{}: {:.2} ± {:.2} <small>(n={})</small></span>",
                esc(r.metric),
                r.mean,
                r.stddev,
                r.count
            )
        })
        .collect();
    if rows.is_empty() {
        "<span class=\"muted\">no samples yet</span>".to_owned()
    } else {
        rows.join(" ")
    }
}

/// One chart per tenant and metric with samples: the tenant's curve over the global one.
fn distributions(stats: &[StatRow], tenants: &BTreeSet<&str>) -> String {
    let global: BTreeMap<&str, &StatRow> =
        stats.iter().filter(|r| r.tenant.is_none() && r.count > 0).map(|r| (r.metric, r)).collect();
    let mut out = String::from(
        "<h2>Entropy distributions against the global baseline</h2>\
         <p class=\"muted legend\"><span class=\"key tenant\"></span>tenant <span class=\"key global\"></span>global \
         (normal curves from each mean and standard deviation)</p><div class=\"grid\">",
    );
    let mut any = false;
    for tenant in tenants {
        for row in stats.iter().filter(|r| r.tenant.as_deref() == Some(*tenant) && r.count > 0) {
            let Some(g) = global.get(row.metric) else { continue };
            any = true;
            let title = format!(
                "{tenant}: {} (tenant {:.2} ± {:.2}, global {:.2} ± {:.2})",
                row.metric, row.mean, row.stddev, g.mean, g.stddev
            );
            let _ = write!(
                out,
                "<figure class=\"card\">{}<figcaption>{}</figcaption></figure>",
                curves(
                    &title,
                    Normal { mean: row.mean, stddev: row.stddev },
                    Normal { mean: g.mean, stddev: g.stddev }
                ),
                esc(&title)
            );
        }
    }
    if !any {
        out.push_str("<p class=\"muted\">No entropy samples yet: baselines fill in as responses are scanned.</p>");
    }
    out.push_str("</div>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::tests::ctx;

    #[test]
    fn minutes_count_recent_records_only() {
        let now = 10 * 3_600_000;
        let at = |ms| AuditRecord::at(ms, ctx("acme"), Action::Block, &[]);
        let records =
            [at(now), at(now - 30_000), at(now - 61_000), at(now - 59 * MINUTE_MS - 1), at(now - 61 * MINUTE_MS)];
        let minutes = per_minute(records.iter(), now);
        assert_eq!((minutes[MINUTES - 1], minutes[MINUTES - 2], minutes[0]), (2, 1, 1));
        assert_eq!(minutes.iter().sum::<u64>(), 4);
    }
}
