//! The rules pages: `/admin/rules` lists the loaded files, rules and canary tables with
//! their hit counts (metrics, since start-up), the last reload (whoever asked for it: the
//! folder watch, the JSON API, this page) and its errors, and a reload button;
//! `/admin/rules/{id}` shows one rule's samples and its recent hits.
//! `POST /admin/rules/reload` recompiles the rule files like the JSON API does: the running
//! rules stay when the new ones do not load.
//!
//! Canary strings are honeytokens: they are never shown, only their table's id and owner.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Form;
use firewall::Ruleset;

use super::blocked::table;
use super::html::{esc, facts, frame, query, segment, Section};
use super::session::{CsrfForm, Session};
use super::time::format_ms;
use super::AdminError;
use crate::audit::AuditQuery;
use crate::metrics::FindingCount;
use crate::rules::ReloadRecord;
use crate::state::AppState;

/// Hits per rule id: (total, per action).
fn hits(counts: &[FindingCount]) -> BTreeMap<&str, (u64, BTreeMap<&'static str, u64>)> {
    let mut out: BTreeMap<&str, (u64, BTreeMap<&'static str, u64>)> = BTreeMap::new();
    for c in counts {
        let entry = out.entry(c.rule_id.as_str()).or_default();
        entry.0 += c.count;
        *entry.1.entry(c.action).or_default() += c.count;
    }
    out
}

fn hits_cell(h: Option<&(u64, BTreeMap<&'static str, u64>)>) -> String {
    match h {
        None => "0".to_owned(),
        Some((total, by_action)) => {
            let split: Vec<String> = by_action.iter().map(|(a, n)| format!("{a} {n}")).collect();
            format!("{total} <small class=\"muted\">({})</small>", split.join(", "))
        }
    }
}

/// `GET /admin/rules`
pub async fn page(session: Session, State(state): State<Arc<AppState>>) -> Html<String> {
    let rules = state.rules.current();
    let generation = state.rules.generation();
    let counts = state.metrics.finding_counts();
    let hits = hits(&counts);
    let last = state.rules.last_reload();

    let mut body = reload_section(&session, generation, rules.len(), rules.canaries().len(), last.as_ref());
    body.push_str(&files_table(&rules));
    body.push_str(
        "<h2>Rules</h2><div class=\"table-wrap\"><table><thead><tr><th>Rule</th><th>Description</th><th>Severity</th>\
         <th>Action</th><th>Defined at</th><th class=\"num\">Hits since start-up</th></tr></thead><tbody>",
    );
    for (rule, origin) in rules.rules().iter().zip(rules.origins()) {
        let _ = write!(
            body,
            "<tr><td><a href=\"/admin/rules/{}\">{}</a></td><td>{}</td><td>{}</td><td><span class=\"badge {}\">{}</span></td>\
             <td>{}:{}</td><td class=\"num\">{}</td></tr>",
            esc(&segment(&rule.id)),
            esc(&rule.id),
            esc(&rule.description),
            rule.severity.as_str(),
            rule.action.as_str(),
            rule.action.as_str(),
            esc(&origin.file),
            origin.line,
            hits_cell(hits.get(rule.id.as_str()))
        );
    }
    body.push_str("</tbody></table></div>");

    let known: std::collections::HashSet<&str> = rules.rules().iter().map(|r| r.id.as_str()).collect();
    let others: Vec<_> = hits.iter().filter(|(id, _)| !known.contains(*id)).collect();
    if !others.is_empty() {
        body.push_str(
            "<h2>Other detectors and canaries</h2><div class=\"table-wrap\"><table><thead><tr><th>Finding id</th>\
             <th class=\"num\">Hits since start-up</th></tr></thead><tbody>",
        );
        for (id, h) in others {
            let _ = write!(
                body,
                "<tr><td><a href=\"/admin/rules/{}\">{}</a></td><td class=\"num\">{}</td></tr>",
                esc(&segment(id)),
                esc(id),
                hits_cell(Some(h))
            );
        }
        body.push_str("</tbody></table></div>");
    }
    body.push_str("<h2>Canary tables</h2><p class=\"muted\">The strings are honeytokens and are never shown.</p>");
    body.push_str("<div class=\"table-wrap\"><table><thead><tr><th>Id</th><th>Owner</th><th class=\"num\">Strings</th></tr></thead><tbody>");
    for c in rules.canaries() {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td class=\"num\">{}</td></tr>",
            esc(&c.id),
            esc(&c.owner),
            c.strings.len()
        );
    }
    if rules.canaries().is_empty() {
        body.push_str("<tr class=\"empty\"><td colspan=\"3\">No canary tables.</td></tr>");
    }
    body.push_str("</tbody></table></div>");
    Html(frame("Rules", Some(Section::Rules), Some(&session.csrf), &body))
}

fn reload_section(
    session: &Session,
    generation: u64,
    rules: usize,
    canaries: usize,
    last: Option<&ReloadRecord>,
) -> String {
    let mut out = facts(&[
        ("Rules loaded", rules.to_string()),
        ("Canary tables", canaries.to_string()),
        ("Generation", generation.to_string()),
    ]);
    match last {
        None => out.push_str("<p class=\"muted\">No reload since start-up.</p>"),
        Some(r) => {
            let _ = write!(
                out,
                "<div class=\"card reload\"><h2>Last reload: {} UTC, by the {}</h2>",
                format_ms(r.at_ms),
                esc(r.via)
            );
            match &r.result {
                Ok(done) => {
                    let _ = write!(
                        out,
                        "<p class=\"ok\">Loaded {} rules and {} canary tables (generation {}).</p>",
                        done.rules, done.canaries, r.generation
                    );
                }
                Err(errors) => {
                    let errors = &errors.errors;
                    let _ = write!(out, "<p class=\"error\">Rejected: {} error(s); the running rules stay (generation {}).</p><ul class=\"errors\">", errors.len(), r.generation);
                    for e in errors {
                        let _ = write!(out, "<li><code>{}</code></li>", esc(&e.to_string()));
                    }
                    out.push_str("</ul>");
                }
            }
            out.push_str("</div>");
        }
    }
    let _ = write!(
        out,
        "<form method=\"post\" action=\"/admin/rules/reload\" class=\"inline\"><input type=\"hidden\" name=\"csrf\" value=\"{}\">\
         <button type=\"submit\">Reload rule files</button></form>",
        esc(&session.csrf)
    );
    out
}

fn files_table(rules: &Ruleset) -> String {
    let mut files: BTreeMap<&str, usize> = BTreeMap::new();
    for o in rules.origins() {
        *files.entry(o.file.as_str()).or_default() += 1;
    }
    let mut out = String::from("<h2>Files</h2><div class=\"table-wrap\"><table><thead><tr><th>File</th><th class=\"num\">Rules</th></tr></thead><tbody>");
    for (file, n) in files {
        let _ = write!(out, "<tr><td>{}</td><td class=\"num\">{n}</td></tr>", esc(file));
    }
    out.push_str("</tbody></table></div>");
    out
}

/// `POST /admin/rules/reload`: reloads (the state keeps the outcome) and goes back to the
/// list.
pub async fn reload(
    session: Session,
    State(state): State<Arc<AppState>>,
    Form(form): Form<CsrfForm>,
) -> Result<Response, AdminError> {
    session.verify_csrf(&form.csrf)?;
    // Rejected files are shown on the list, from the record of this reload.
    let _ = crate::rules::reload_on_blocking_pool(&state, "dashboard").await;
    Ok((StatusCode::SEE_OTHER, [(header::LOCATION, "/admin/rules")]).into_response())
}

/// Recent hits listed on a rule's page.
const RECENT: usize = 20;

/// `GET /admin/rules/{id}`: a rule file's rule, or any other finding id (detectors, canary
/// tables) with its recent hits.
pub async fn rule_page(
    session: Session,
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Html<String>, AdminError> {
    let rules = state.rules.current();
    let q = AuditQuery { rule: Some(id.clone()), limit: RECENT, ..Default::default() };
    let recent = state.protection.store().list_audit(&q).await?.records;
    let counts = state.metrics.finding_counts();
    let hits = hits(&counts);
    let found = rules.rules().iter().zip(rules.origins()).find(|(r, _)| r.id == id);
    let canary = rules.canaries().iter().find(|c| c.id == id);
    if found.is_none() && canary.is_none() && recent.is_empty() && !hits.contains_key(id.as_str()) {
        return Err(AdminError::NotFound(format!("No rule, canary table or finding with id {id:?}.")));
    }
    let mut body = String::new();
    if let Some((rule, origin)) = found {
        let mut rows = vec![
            ("Description", rule.description.clone()),
            ("Severity", rule.severity.as_str().to_owned()),
            ("Action", rule.action.as_str().to_owned()),
            ("Defined at", format!("{}:{}", origin.file, origin.line)),
            (
                "Keywords",
                if rule.keywords.is_empty() {
                    "none (runs on every text)".to_owned()
                } else {
                    rule.keywords.join(", ")
                },
            ),
        ];
        if let Some(e) = rule.min_entropy {
            rows.push(("Minimum entropy", format!("{e:.2} bits/char")));
        }
        if let Some(j) = rule.judge {
            rows.push(("Judge", format!("keeps secrets the generic-secret judge scores {j:.2} or more")));
        }
        if !rule.tags.is_empty() {
            rows.push(("Tags", rule.tags.join(", ")));
        }
        body.push_str(&facts(&rows));
        body.push_str(&samples("Samples that must match", &rule.must_match));
        body.push_str(&samples("Samples that must not match", &rule.must_not_match));
    } else if let Some(c) = canary {
        body.push_str(&facts(&[
            ("Kind", "canary table".to_owned()),
            ("Owner", c.owner.clone()),
            ("Strings", format!("{} (never shown)", c.strings.len())),
        ]));
    } else {
        body.push_str("<p class=\"muted\">Not a rule from the rule files: a detector's finding id.</p>");
    }
    let _ = write!(body, "<h2>Hits since start-up: {}</h2>", hits_cell(hits.get(id.as_str())));
    let _ = write!(
        body,
        "<h2>Recent hits</h2><p><a href=\"/admin?{}\">All blocked responses with this rule »</a></p>",
        esc(&query(&[("rule", &id)]))
    );
    body.push_str(&table(&recent, None));
    Ok(Html(frame(&format!("Rule {id}"), Some(Section::Rules), Some(&session.csrf), &body)))
}

fn samples(title: &str, list: &[String]) -> String {
    let mut out = format!("<h2>{}</h2>", esc(title));
    if list.is_empty() {
        out.push_str("<p class=\"muted\">none</p>");
        return out;
    }
    out.push_str("<ul class=\"samples\">");
    for s in list {
        let _ = write!(out, "<li><code>{}</code></li>", esc(s));
    }
    out.push_str("</ul>");
    out
}
