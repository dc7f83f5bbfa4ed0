//! The health page (`/admin/health`): the backends, the store (memory or Redis, degraded
//! or not), audit evictions, the provenance index, the rules, and the KV pool of each model
//! the engine serves (blocks used, free and held by the prefix cache, zero-fills, prefix
//! hits, isolation violations), or that it is not loaded yet.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Html;

use super::html::{esc, facts, frame, Section};
use super::session::Session;
use crate::audit::severity_name;
use crate::state::AppState;
use crate::store::AuditEviction;

/// `GET /admin/health`
pub async fn page(session: Session, State(state): State<Arc<AppState>>) -> Html<String> {
    let p = &state.protection;
    let store = p.store().health();
    let mut body = String::from("<div class=\"grid\">");

    let status = if store.degraded {
        "<span class=\"badge block\">degraded</span>"
    } else {
        "<span class=\"badge ok\">ok</span>"
    };
    let mut store_rows =
        vec![("Kind", store.kind.to_owned()), ("Audit records waiting for Redis", store.buffered_audit.to_string())];
    if let Some(reason) = &store.reason {
        store_rows.push(("Why degraded", reason.clone()));
    }
    let _ = write!(body, "<section class=\"card\"><h2>Store {status}</h2>{}</section>", facts(&store_rows));

    let size = p.index().size();
    let _ = write!(
        body,
        "<section class=\"card\"><h2>Provenance index</h2>{}</section>",
        facts(&[
            ("Fingerprints", size.hashes.to_string()),
            ("Tenants", size.tenants.to_string()),
            ("Dropped (past the per-text cap)", size.dropped.to_string()),
            ("Evicted (index full)", size.evicted_full.to_string()),
            ("Evicted (tenant at its share)", size.evicted_tenant_share.to_string()),
        ])
    );

    body.push_str(&retention_card(&p.store().audit_evictions()));

    let rules = state.rules.current();
    let _ = write!(
        body,
        "<section class=\"card\"><h2>Firewall rules</h2>{}</section>",
        facts(&[
            ("Rules", rules.len().to_string()),
            ("Canary tables", rules.canaries().len().to_string()),
            ("Generation", state.rules.generation().to_string()),
        ])
    );
    body.push_str("</div>");

    body.push_str(
        "<h2>Backends</h2><div class=\"table-wrap\"><table><thead><tr><th>Model</th><th>Backend</th><th>State</th></tr></thead><tbody>",
    );
    for (id, backend) in &state.models {
        let ready = if backend.is_ready() {
            "<span class=\"badge ok\">ready</span>"
        } else {
            "<span class=\"badge redact\">loading or failed</span>"
        };
        let _ = write!(body, "<tr><td>{}</td><td>{}</td><td>{ready}</td></tr>", esc(id), backend.kind());
    }
    body.push_str("</tbody></table></div>");

    body.push_str(
        "<section class=\"card\"><h2>Engine KV pool</h2><p class=\"muted\">Blocks are tagged with their owner, \
         zero-filled on release, and every read is checked against the reading tenant and its length; a refused read \
         is an isolation violation.</p>",
    );
    let engines: Vec<_> = state.models.iter().filter(|(_, b)| b.kind() == "engine").collect();
    for (id, backend) in &engines {
        match backend.kv_stats() {
            Some(k) => {
                let _ = write!(body, "<h3>{}</h3>", esc(id));
                body.push_str(&facts(&[
                    ("Blocks used / total", format!("{} / {}", k.blocks_used, k.blocks_total)),
                    ("Blocks free (zeroed)", k.blocks_free.to_string()),
                    ("Held by the prefix cache", k.blocks_cached.to_string()),
                    ("Zero-fills", k.zero_fills.to_string()),
                    ("Isolation violations", k.isolation_violations.to_string()),
                    ("Prefix-cache hits", k.prefix_hits.to_string()),
                    ("Tokens per block", k.block_tokens.to_string()),
                ]));
            }
            None => {
                let _ = write!(body, "<p>{}: model not loaded yet.</p>", esc(id));
            }
        }
    }
    if engines.is_empty() {
        body.push_str("<p>No model is served by the in-process engine.</p>");
    }
    body.push_str("</section>");
    Html(frame("Health", Some(Section::Health), Some(&session.csrf), &body))
}

/// Audit records evicted to keep the log within `store.audit_max_len`, per tenant and
/// severity: a tenant that floods the log shows up here, and only its own class pays.
fn retention_card(evictions: &[AuditEviction]) -> String {
    let mut card = String::from("<section class=\"card\"><h2>Audit retention</h2>");
    if evictions.is_empty() {
        card.push_str("<p class=\"muted\">No audit record has been evicted.</p></section>");
        return card;
    }
    card.push_str(
        "<p class=\"muted\">When the log is full, the (tenant, severity) class with the most records loses its oldest.</p>\
         <table><thead><tr><th>Tenant</th><th>Severity</th><th>Evicted</th></tr></thead><tbody>",
    );
    for e in evictions {
        let _ = write!(
            card,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&e.tenant),
            severity_name(e.severity),
            e.evicted
        );
    }
    card.push_str("</tbody></table></section>");
    card
}
