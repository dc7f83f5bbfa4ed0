//! The admin JSON API, for the security team (admin token only; tenants cannot read it):
//!
//! - `GET /admin/api/audit?tenant=&rule=&action=&since_ms=&until_ms=&limit=&cursor=`:
//!   audit records, newest first, one page (`{"records": [...], "next_cursor": ...}`);
//! - `GET /admin/api/audit/{id}`: one record;
//! - `GET /admin/api/stats`: every tenant's statistics and the global baselines;
//! - `GET /admin/api/health`: store, provenance index and rules;
//! - `POST /admin/api/rules/reload`: recompiles the rule files; the running rules stay
//!   if the new ones do not load, and the errors come back;
//! - `GET /admin/api/rules/reload`: what the last reload did, whoever asked for it (the
//!   rule folder watch, this API, the dashboard): `{"last_reload": null | {...}}`.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::extract::{Path, Query, RawQuery, State};
use axum::http::request::Parts;
use axum::Json;
use serde_json::{json, Value};

use crate::audit::{AuditPage, AuditQuery, AuditRecord};
use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::login_throttle::ClientIp;
use crate::rules::Reloaded;
use crate::state::AppState;

/// A request that bore the admin token (through the login throttle); extracting it
/// refuses every other request.
pub struct Admitted;

impl FromRequestParts<Arc<AppState>> for Admitted {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Admitted, ApiError> {
        let Ok(client) = ClientIp::from_request_parts(parts, state).await;
        Authenticator::authorize_admin(
            &parts.headers,
            state.config.admin_token.as_ref(),
            &state.login_throttle,
            client,
        )?;
        Ok(Admitted)
    }
}

fn store_error(e: crate::store::StoreError) -> ApiError {
    match e {
        crate::store::StoreError::BadCursor(_) => ApiError::param("cursor", e.to_string()),
        other => ApiError::Unavailable(format!("the audit store cannot answer now: {other}")),
    }
}

pub async fn list_audit(
    State(state): State<Arc<AppState>>,
    _: Admitted,
    RawQuery(raw): RawQuery,
) -> Result<Json<AuditPage>, ApiError> {
    // Parsed by hand rather than by the `Query` extractor so that a bad filter is an
    // OpenAI-style 400 naming it, not axum's plain-text rejection.
    let uri: axum::http::Uri = format!("/?{}", raw.unwrap_or_default())
        .parse()
        .map_err(|_| ApiError::param("query", "malformed query string"))?;
    let Query(query): Query<AuditQuery> =
        Query::try_from_uri(&uri).map_err(|e| ApiError::param("query", e.body_text()))?;
    let page = state.protection.store().list_audit(&query).await.map_err(store_error)?;
    Ok(Json(page))
}

pub async fn get_audit(
    State(state): State<Arc<AppState>>,
    _: Admitted,
    Path(id): Path<String>,
) -> Result<Json<AuditRecord>, ApiError> {
    match state.protection.store().get_audit(&id).await.map_err(store_error)? {
        Some(record) => Ok(Json(record)),
        None => Err(ApiError::ResourceNotFound(format!("No audit record with id {id:?}."))),
    }
}

pub async fn stats(State(state): State<Arc<AppState>>, _: Admitted) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({"statistics": state.protection.stats().rows()})))
}

pub async fn health(State(state): State<Arc<AppState>>, _: Admitted) -> Result<Json<Value>, ApiError> {
    let p = &state.protection;
    let size = p.index().size();
    let rules = state.rules.current();
    Ok(Json(json!({
        "store": p.store().health(),
        "audit_evictions": p.store().audit_evictions(),
        "provenance": {"hashes": size.hashes, "tenants": size.tenants, "dropped": size.dropped, "evicted_full": size.evicted_full, "evicted_tenant_share": size.evicted_tenant_share},
        "rules": {"rules": rules.len(), "canaries": rules.canaries().len(), "generation": state.rules.generation()},
        "models": state.models.iter().map(|(id, b)| {
            let kv = b.kv_stats().map(|k| json!({
                "block_tokens": k.block_tokens, "blocks_total": k.blocks_total, "blocks_used": k.blocks_used,
                "blocks_free": k.blocks_free, "blocks_cached": k.blocks_cached, "zero_fills": k.zero_fills,
                "isolation_violations": k.isolation_violations, "prefix_hits": k.prefix_hits, "stale_handouts": k.stale_handouts,
            }));
            json!({"id": id, "backend": b.kind(), "ready": b.is_ready(), "kv": kv})
        }).collect::<Vec<_>>(),
    })))
}

pub async fn reload_rules(State(state): State<Arc<AppState>>, _: Admitted) -> Result<Json<Value>, ApiError> {
    let result = crate::rules::reload_on_blocking_pool(&state, "admin API").await;
    Ok(Json(reload_json(&result, state.rules.generation())))
}

pub async fn last_reload(State(state): State<Arc<AppState>>, _: Admitted) -> Result<Json<Value>, ApiError> {
    let last = state.rules.last_reload().map(|r| {
        let mut v = reload_json(&r.result, r.generation);
        v["at_ms"] = json!(r.at_ms);
        v["via"] = json!(r.via);
        v
    });
    Ok(Json(json!({ "last_reload": last })))
}

/// A reload's outcome: what it loaded, or every error (file, line, rule id, reason) and
/// the generation that kept running.
fn reload_json(result: &Result<Reloaded, firewall::LoadErrors>, generation_after: u64) -> Value {
    match result {
        Ok(r) => json!({"reloaded": true, "rules": r.rules, "canaries": r.canaries, "generation": r.generation}),
        Err(errors) => {
            let list: Vec<Value> = errors
                .errors
                .iter()
                .map(|e| json!({"file": e.file, "line": e.line, "rule_id": e.rule_id, "reason": e.reason}))
                .collect();
            json!({"reloaded": false, "generation": generation_after, "errors": list})
        }
    }
}
