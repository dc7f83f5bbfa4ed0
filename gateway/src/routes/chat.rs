//! `POST /v1/chat/completions`: authenticate, read the body within its limit, validate,
//! pick the model's backend, and relay its events as SSE or as one JSON object.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::response::ChatCompletion;
use crate::api::ChatRequest;
use crate::backend::RequestContext;
use crate::config::FailMode;
use crate::error::ApiError;
use crate::guard::{Guard, CONTENT_FILTER};
use crate::protection::ResponseRecord;
use crate::relay::{self, ResponseMeta};
use crate::router::RequestId;
use crate::state::{unix_now, AppState};

/// The header naming a response's audit record.
pub const AUDIT_ID_HEADER: &str = "x-crossguard-audit-id";

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = state.auth.authenticate(&headers)?;
    if state.protection.quarantined(tenant.as_str()) {
        return Err(ApiError::Quarantined);
    }
    let bytes = read_limited(body, &headers, state.config.max_body_bytes).await?;
    let mut request = ChatRequest::parse(&bytes)?;
    let backend = state.backend(&request.model)?;
    if !backend.is_ready() {
        return Err(ApiError::Unavailable(format!("The model `{}` is still loading; retry shortly.", request.model)));
    }
    let rules = state.rules.current();
    state.protection.on_request(tenant.as_str(), &mut request, &rules);
    let ctx = RequestContext { request_id: request_id.clone(), tenant: tenant.clone() };
    let started = backend.complete(&request, &ctx).await;
    let response = match started {
        Ok(r) => r,
        Err(e) => {
            state.metrics.observe_backend_error(&request.model, e.kind());
            state.metrics.observe_completion(&request.model, tenant.as_str(), "error");
            return Err(e);
        }
    };
    state.metrics.observe_completion(&request.model, tenant.as_str(), "ok");
    let meta = ResponseMeta {
        id: format!("chatcmpl-{}", uuid::Uuid::now_v7().simple()),
        created: unix_now(),
        model: request.model.clone(),
        include_usage: request.include_usage,
    };
    let record = ResponseRecord {
        audit_id: uuid::Uuid::now_v7(),
        tenant: tenant.as_str().to_owned(),
        model: request.model.clone(),
        request_id,
    };
    let mut guard = Guard::with_fail_mode(
        rules,
        state.protection.scan_context(tenant.as_str()),
        state.protection.detectors(),
        request.n,
        state.protection.fail_mode(tenant.as_str()),
    );
    if request.stream {
        // The id is announced before the first byte; a record exists under it only if the
        // firewall ends up blocking or redacting.
        let audit_id = audit_header(&record);
        let on_end = finish_stream(state.clone(), record);
        let mut response = Body::from_stream(relay::sse_body(meta, response, guard, on_end)).into_response();
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        h.extend(audit_id);
        return Ok(response);
    }
    let mut completion = relay::collect(meta, response, &mut guard).await.inspect_err(|e| {
        state.metrics.observe_backend_error(&request.model, e.kind());
    })?;
    report(&state, &record.tenant, &guard);
    let mut response_headers = HeaderMap::new();
    if let Some(audit) = state.protection.on_response(&record, &guard) {
        if let Err(e) = state.protection.audit(&audit).await {
            tracing::error!(error = %e, audit_id = audit.id(), "audit record could not be written");
            state.metrics.observe_protection_event(&record.tenant, "audit_write_failed");
            if state.protection.fail_mode(&record.tenant) == FailMode::Closed {
                // Nothing is sent yet: a response whose audit record is lost is withheld.
                withhold(&mut completion);
                state.metrics.observe_protection_event(&record.tenant, "failed_closed");
            }
        }
        response_headers.extend(audit_header(&record));
    }
    Ok((StatusCode::OK, response_headers, Json(completion)).into_response())
}

/// `x-crossguard-audit-id: <id>` for a response.
fn audit_header(record: &ResponseRecord) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&record.audit_id.to_string()) {
        h.insert(AUDIT_ID_HEADER, v);
    }
    h
}

/// What happens when a stream ends (or its client leaves): metrics, learning, audit.
fn finish_stream(state: Arc<AppState>, record: ResponseRecord) -> relay::OnEnd {
    Box::new(move |guard: &Guard| {
        report(&state, &record.tenant, guard);
        if let Some(audit) = state.protection.on_response(&record, guard) {
            state.protection.audit_later(audit);
        }
    })
}

/// Logs and counts what the firewall found in one response (rule ids and spans only).
fn report(state: &AppState, tenant: &str, guard: &Guard) {
    for f in guard.findings() {
        state.metrics.observe_finding(tenant, &f.finding.rule_id, f.finding.action.as_str());
    }
    if let Some(reason) = guard.failure() {
        let event = match state.protection.fail_mode(tenant) {
            FailMode::Closed => "failed_closed",
            FailMode::Open => "failed_open",
        };
        state.metrics.observe_protection_event(tenant, event);
        tracing::error!(tenant, event, reason, "firewall failure on a response");
    }
    if guard.blocked() {
        let rules: Vec<&str> = guard.findings().iter().map(|f| f.finding.rule_id.as_str()).collect();
        tracing::warn!(tenant, ?rules, released_bytes = guard.released_bytes(), "response blocked by the firewall");
    }
}

/// Empties every choice of a completion that must not be delivered.
fn withhold(completion: &mut ChatCompletion) {
    for choice in &mut completion.choices {
        choice.message.content = None;
        choice.message.refusal = None;
        choice.message.tool_calls.clear();
        choice.logprobs = None;
        choice.finish_reason = Some(CONTENT_FILTER.to_owned());
    }
}

/// Reads the whole body, refusing (413) anything over `limit` bytes — by its declared
/// length before reading, and by counting while reading when the length is not declared.
async fn read_limited(body: Body, headers: &HeaderMap, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::PayloadTooLarge { limit_bytes: limit });
    }
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let too_large = std::iter::successors(Some(&e as &dyn std::error::Error), |e| e.source())
            .any(|e| e.is::<http_body_util::LengthLimitError>());
        if too_large {
            ApiError::PayloadTooLarge { limit_bytes: limit }
        } else {
            ApiError::MalformedJson(format!("could not read the request body: {e}"))
        }
    })
}
