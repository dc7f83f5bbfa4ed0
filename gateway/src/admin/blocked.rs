//! The blocked-responses page (`/admin`): audit records newest first, filtered by tenant,
//! rule, action and time range, one page at a time, with new records streamed in by
//! [`super::live`] when the first page is shown. Also owns the table row every record list
//! uses, so rows streamed live look exactly like rows rendered here.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::response::Html;
use firewall::Action;
use serde::Deserialize;

use super::html::{esc, frame, query, segment, Section};
use super::session::Session;
use super::time::{format_input, format_ms, parse_input};
use super::AdminError;
use crate::audit::{AuditQuery, AuditRecord};
use crate::state::AppState;

/// The filter form's fields as they come in; empty means "any".
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct Filters {
    pub tenant: String,
    pub rule: String,
    pub action: String,
    /// `datetime-local` values, UTC.
    pub since: String,
    pub until: String,
    pub cursor: String,
}

const ACTIONS: [Action; 3] = [Action::Block, Action::Redact, Action::Log];

impl Filters {
    /// The store query, and a message for each field that could not be understood (that
    /// filter is then not applied, and the page says so).
    pub fn to_query(&self) -> (AuditQuery, Vec<String>) {
        let mut problems = Vec::new();
        let text = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        let mut time = |name: &str, s: &str| {
            let value = text(s)?;
            let parsed = parse_input(&value);
            if parsed.is_none() {
                problems.push(format!("{name}: expected YYYY-MM-DDTHH:MM (UTC), got {value:?}"));
            }
            parsed
        };
        let since_ms = time("from", &self.since);
        let until_ms = time("to", &self.until);
        let action = text(&self.action).and_then(|a| {
            let found = ACTIONS.into_iter().find(|x| x.as_str() == a);
            if found.is_none() {
                problems.push(format!("action: expected block, redact or log, got {a:?}"));
            }
            found
        });
        let q = AuditQuery {
            tenant: text(&self.tenant),
            rule: text(&self.rule),
            action,
            since_ms,
            until_ms,
            limit: PAGE,
            cursor: text(&self.cursor),
        };
        (q, problems)
    }

    /// The filters (not the cursor) as query-string pairs, for links and the live feed.
    fn pairs(&self) -> [(&'static str, &str); 5] {
        [
            ("tenant", &self.tenant),
            ("rule", &self.rule),
            ("action", &self.action),
            ("since", &self.since),
            ("until", &self.until),
        ]
    }
}

/// Records per page.
const PAGE: usize = 25;

/// The columns of every record table.
pub const HEAD: &str = "<thead><tr><th>Time (UTC)</th><th>Tenant</th><th>Model</th><th>Action</th>\
                        <th>Rules</th><th>Suspected source</th><th class=\"num\">Bytes released</th></tr></thead>";
const COLUMNS: usize = 7;

/// One record as a table row; the time links to its detail page.
pub fn row(r: &AuditRecord) -> String {
    let mut rules: Vec<&str> = r.findings().iter().map(|f| f.rule_id()).collect();
    rules.sort_unstable();
    rules.dedup();
    let rules = rules
        .iter()
        .map(|id| format!("<a href=\"/admin/rules/{}\">{}</a>", esc(&segment(id)), esc(id)))
        .collect::<Vec<_>>();
    let sources = if r.source_tenants().is_empty() { "—".to_owned() } else { esc(&r.source_tenants().join(", ")) };
    let action = r.action().as_str();
    format!(
        "<tr data-id=\"{id}\"><td><a class=\"open\" href=\"/admin/audit/{seg}\">{time}</a></td><td>{tenant}</td><td>{model}</td>\
         <td><span class=\"badge {action}\">{action}</span></td><td>{rules}</td><td>{sources}</td><td class=\"num\">{bytes}</td></tr>",
        id = esc(r.id()),
        seg = esc(&segment(r.id())),
        time = format_ms(r.time_ms()),
        tenant = esc(r.tenant()),
        model = esc(r.model()),
        rules = rules.join(", "),
        bytes = r.bytes_released(),
    )
}

/// A whole record table; `live` is the feed URL for new rows, if this table takes them.
pub fn table(records: &[AuditRecord], live: Option<&str>) -> String {
    let live = live.map(|url| format!(" data-live=\"{}\"", esc(url))).unwrap_or_default();
    let mut out = format!("<div class=\"table-wrap\"><table class=\"records\">{HEAD}<tbody id=\"rows\"{live}>");
    for r in records {
        out.push_str(&row(r));
    }
    if records.is_empty() {
        let _ = write!(
            out,
            "<tr class=\"empty\"><td colspan=\"{COLUMNS}\">No blocked or redacted responses match.</td></tr>"
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// `GET /admin`
pub async fn page(
    session: Session,
    State(state): State<Arc<AppState>>,
    Query(filters): Query<Filters>,
) -> Result<Html<String>, AdminError> {
    let (q, problems) = filters.to_query();
    let page = state.protection.store().list_audit(&q).await?;
    let mut body = filter_form(&state, &filters);
    for p in &problems {
        let _ = write!(body, "<p class=\"error\">Filter ignored — {}</p>", esc(p));
    }
    body.push_str(&at_a_glance(&page.records, &filters));
    let live = filters.cursor.is_empty().then(|| format!("/admin/events?{}", query(&filters.pairs())));
    if live.is_some() {
        body.push_str("<p id=\"live\" class=\"live\" hidden></p>");
    }
    body.push_str(&table(&page.records, live.as_deref()));
    body.push_str("<nav class=\"pager\">");
    if !filters.cursor.is_empty() {
        let _ = write!(body, "<a href=\"/admin?{}\">« Newest</a>", esc(&query(&filters.pairs())));
    }
    if let Some(next) = &page.next_cursor {
        let mut pairs = filters.pairs().to_vec();
        pairs.push(("cursor", next));
        let _ = write!(body, "<a href=\"/admin?{}\" rel=\"next\">Older »</a>", esc(&query(&pairs)));
    }
    body.push_str("</nav>");
    Ok(Html(frame("Blocked responses", Some(Section::Blocked), Some(&session.csrf), &body)))
}

fn filter_form(state: &AppState, f: &Filters) -> String {
    let mut tenants: Vec<&str> = state.config.tenants.iter().map(|t| t.id.as_str()).collect();
    if !f.tenant.is_empty() && !tenants.contains(&f.tenant.as_str()) {
        tenants.push(&f.tenant);
    }
    let option = |value: &str, label: &str, selected: bool| {
        format!("<option value=\"{}\"{}>{}</option>", esc(value), if selected { " selected" } else { "" }, esc(label))
    };
    let tenant_options: String = std::iter::once(option("", "any tenant", f.tenant.is_empty()))
        .chain(tenants.iter().map(|t| option(t, t, f.tenant == *t)))
        .collect();
    let action_options: String = std::iter::once(option("", "any action", f.action.is_empty()))
        .chain(ACTIONS.iter().map(|a| option(a.as_str(), a.as_str(), f.action == a.as_str())))
        .collect();
    let rules = state.rules.current();
    let rule_ids: String = rules.rules().iter().map(|r| format!("<option value=\"{}\">", esc(&r.id))).collect();
    let tidy = |s: &str| parse_input(s).map(format_input).unwrap_or_else(|| s.to_owned());
    format!(
        "<form method=\"get\" action=\"/admin\" class=\"filters\">\
         <label>Tenant <select name=\"tenant\">{tenant_options}</select></label>\
         <label>Rule <input name=\"rule\" list=\"rule-ids\" value=\"{rule}\" placeholder=\"any rule\"></label>\
         <datalist id=\"rule-ids\">{rule_ids}</datalist>\
         <label>Action <select name=\"action\">{action_options}</select></label>\
         <label>From (UTC) <input type=\"datetime-local\" name=\"since\" value=\"{since}\"></label>\
         <label>To (UTC) <input type=\"datetime-local\" name=\"until\" value=\"{until}\"></label>\
         <div class=\"buttons\"><button type=\"submit\">Filter</button><a href=\"/admin\">Clear</a></div></form>",
        rule = esc(&f.rule),
        since = esc(&tidy(&f.since)),
        until = esc(&tidy(&f.until)),
    )
}

/// Which tenants and rules this page's records involve, most frequent first, each a
/// link that filters by it.
fn at_a_glance(records: &[AuditRecord], f: &Filters) -> String {
    if records.is_empty() {
        return String::new();
    }
    let mut tenants: BTreeMap<&str, usize> = BTreeMap::new();
    let mut rules: BTreeMap<&str, usize> = BTreeMap::new();
    for r in records {
        *tenants.entry(r.tenant()).or_default() += 1;
        let mut ids: Vec<&str> = r.findings().iter().map(|x| x.rule_id()).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            *rules.entry(id).or_default() += 1;
        }
    }
    let chips = |counts: BTreeMap<&str, usize>, key: &'static str| {
        let mut counts: Vec<(&str, usize)> = counts.into_iter().collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        counts
            .iter()
            .map(|(value, n)| {
                let mut pairs = f.pairs().to_vec();
                pairs.retain(|(k, _)| *k != key);
                pairs.push((key, value));
                format!("<a class=\"chip\" href=\"/admin?{}\">{} <b>{n}</b></a>", esc(&query(&pairs)), esc(value))
            })
            .collect::<String>()
    };
    format!(
        "<div class=\"glance\"><div><h2>Tenants on this page</h2>{}</div><div><h2>Rules on this page</h2>{}</div></div>",
        chips(tenants, "tenant"),
        chips(rules, "rule")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_become_a_store_query() {
        let f = Filters {
            tenant: " acme ".into(),
            action: "redact".into(),
            since: "2026-11-30T09:00".into(),
            ..Default::default()
        };
        let (q, problems) = f.to_query();
        assert!(problems.is_empty());
        assert_eq!(
            (q.tenant.as_deref(), q.action, q.since_ms, q.until_ms),
            (Some("acme"), Some(Action::Redact), Some(1_796_029_200_000), None)
        );
        assert_eq!(q.limit, PAGE);
    }

    #[test]
    fn bad_filters_are_reported_not_applied() {
        let f = Filters { action: "nuke".into(), until: "yesterday".into(), ..Default::default() };
        let (q, problems) = f.to_query();
        assert_eq!((q.action, q.until_ms, problems.len()), (None, None, 2));
    }

    #[test]
    fn rows_escape_every_field() {
        let ctx =
            crate::audit::AuditContext { tenant: "<t>".into(), model: "m\"".into(), request_id: "<script>".into() };
        let finding =
            crate::audit::tests::finding("<img src=x onerror=alert(1)>", "x*** (4 chars)", firewall::Detail::None);
        let r = AuditRecord::new(ctx, Action::Block, &[finding], 3);
        let html = row(&r);
        assert!(!html.contains("<t>") && !html.contains("<img"), "{html}");
        assert!(html.contains("<td>m&quot;</td>"), "{html}");
        assert!(
            html.contains("&lt;img src=x onerror=alert(1)&gt;")
                && html.contains("/admin/rules/%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E")
        );
    }
}
