//! `POST /v1/chat/completions` (and legacy `POST /v1/completions`, the same path with
//! another request and response shape): authenticate, read the body within its size and time
//! limits, validate, check the model's caps, admit the request under the tenant's
//! [`limits`], pick the model's backend, and answer with SSE or one JSON object (with the
//! tenant's `x-ratelimit-*` headers). HTTP only: what the
//! response may carry is the [`ResponseGuard`]'s decision, and what its end means
//! (metrics, logs, audit) the [`Finisher`]'s.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::response::TextCompletion;
use crate::api::ChatRequest;
use crate::auth::TenantId;
use crate::backend::{BackendResponse, RequestContext};
use crate::error::ApiError;
use crate::limits::{self, Ask};
use crate::protection::ResponseRecord;
use crate::relay::{self, ChunkFraming, Framing, ResponseMeta, Shape};
use crate::response_guard::{Finisher, GuardSettings, ResponseGuard};
use crate::router::RequestId;
use crate::state::{unix_now, AppState};

/// The header naming a response's audit record.
pub const AUDIT_ID_HEADER: &str = "x-crossguard-audit-id";

/// `POST /v1/chat/completions`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    serve(state, request_id, headers, body, Shape::Chat).await
}

/// `POST /v1/completions` (legacy text completions): the same path as chat, for engine
/// models, the prompt without the chat template, answered in the `text_completion` shape.
pub async fn create_text(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    serve(state, request_id, headers, body, Shape::Text).await
}

async fn serve(
    state: Arc<AppState>,
    request_id: String,
    headers: HeaderMap,
    body: Body,
    shape: Shape,
) -> Result<Response, ApiError> {
    let tenant = caller(&state, &headers)?;
    let bytes = read_body(&state, &headers, body).await?;
    let mut request = match shape {
        Shape::Chat => ChatRequest::parse(&bytes)?,
        Shape::Text => ChatRequest::parse_completion(&bytes)?,
    };
    if shape == Shape::Text && state.backend(&request.model)?.kind() != "engine" {
        return Err(ApiError::param(
            "model",
            format!("`{}` is served by an upstream: /v1/completions is served for engine models only", request.model),
        ));
    }
    let Started { finisher, response, mut guard, rate_headers } =
        start(&state, &tenant, request_id, &mut request).await?;
    let prefix = match shape {
        Shape::Chat => "chatcmpl",
        Shape::Text => "cmpl",
    };
    let meta = ResponseMeta {
        shape,
        id: format!("{prefix}-{}", uuid::Uuid::now_v7().simple()),
        created: unix_now(),
        model: request.model.clone(),
        include_usage: request.include_usage,
    };
    if request.stream {
        return Ok(event_stream(ChunkFraming::new(meta), response, guard, finisher, rate_headers));
    }
    let collected = relay::collect(meta, response, &mut guard).await;
    let (completion, audited) = finisher.whole(&mut guard, collected).await?;
    let mut response_headers = if audited { audit_header(finisher.record()) } else { HeaderMap::new() };
    response_headers.extend(rate_headers);
    let body = match shape {
        Shape::Chat => Json(completion).into_response(),
        Shape::Text => Json(TextCompletion::from_chat(completion)).into_response(),
    };
    Ok((StatusCode::OK, response_headers, body).into_response())
}

/// The authenticated tenant, if it may be served now (not quarantined, provenance fresh).
pub(crate) fn caller(state: &AppState, headers: &HeaderMap) -> Result<TenantId, ApiError> {
    let tenant = state.auth.authenticate(headers)?;
    if state.protection.quarantined(tenant.as_str()) {
        return Err(ApiError::Quarantined);
    }
    if let Some(reason) = state.protection.refusal_when_stale(tenant.as_str()) {
        return Err(ApiError::ProvenanceUnavailable(reason));
    }
    Ok(tenant)
}

/// The request body, within the configured size and read time.
pub(crate) async fn read_body(state: &AppState, headers: &HeaderMap, body: Body) -> Result<bytes::Bytes, ApiError> {
    let read_timeout = std::time::Duration::from_millis(state.config.server.body_read_timeout_ms);
    tokio::time::timeout(read_timeout, read_limited(body, headers, state.config.max_body_bytes))
        .await
        .map_err(|_| ApiError::RequestTimeout { timeout_ms: state.config.server.body_read_timeout_ms })?
}

/// A completion the backend has started, with what its response needs.
pub(crate) struct Started {
    pub finisher: Finisher,
    pub response: BackendResponse,
    pub guard: ResponseGuard,
    /// The tenant's `x-ratelimit-*` headers.
    pub rate_headers: HeaderMap,
}

/// Checks the model's caps and readiness, admits the request under the tenant's limits,
/// lets the protection pipeline see (and mark) the prompt, and starts the backend.
pub(crate) async fn start(
    state: &Arc<AppState>,
    tenant: &TenantId,
    request_id: String,
    request: &mut ChatRequest,
) -> Result<Started, ApiError> {
    let backend = state.backend(&request.model)?;
    if let Some(model) = state.config.models.iter().find(|m| m.id == request.model) {
        limits::check_caps(&model.caps, request)?;
    }
    if !backend.is_ready() {
        return Err(ApiError::Unavailable(format!("The model `{}` is still loading; retry shortly.", request.model)));
    }
    // Admitted before the prompt is fingerprinted: a refused request leaves no trace. The
    // admission is settled when the backend's events are dropped (end, disconnect, error).
    let admission = state.limits.admit(tenant.as_str(), Ask::of(request))?;
    let mut rate_headers = HeaderMap::new();
    admission.write_headers(&mut rate_headers);
    let rules = state.rules.current();
    state.protection.on_request(tenant.as_str(), request, &rules);
    let record = ResponseRecord {
        audit_id: uuid::Uuid::now_v7(),
        tenant: tenant.as_str().to_owned(),
        model: request.model.clone(),
        request_id: request_id.clone(),
    };
    let finisher = Finisher::new(state.clone(), record);
    let ctx = RequestContext { request_id, tenant: tenant.clone() };
    let mut response = backend.complete(request, &ctx).await.inspect_err(|e| finisher.not_started(e))?;
    response.events = admission.meter(response.events);
    finisher.started();
    let guard = ResponseGuard::new(GuardSettings {
        rules,
        detectors: state.protection.detectors(),
        ctx: state.protection.scan_context(tenant.as_str()),
        fail_mode: state.protection.fail_mode(tenant.as_str()),
        max_holdback_bytes: state.config.firewall.max_holdback_bytes,
        choices: request.n,
    });
    Ok(Started { finisher, response, guard, rate_headers })
}

/// The SSE response for a started completion, written by `framing`.
pub(crate) fn event_stream(
    framing: impl Framing,
    response: BackendResponse,
    guard: ResponseGuard,
    finisher: Finisher,
    rate_headers: HeaderMap,
) -> Response {
    // The id is announced before the first byte; a record exists under it only if the
    // firewall ends up blocking or redacting.
    let audit_id = audit_header(finisher.record());
    let on_end: relay::OnEnd = Box::new(move |guard| finisher.streamed(guard));
    let mut response = Body::from_stream(relay::sse_body(framing, response, guard, on_end)).into_response();
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    h.extend(audit_id);
    h.extend(rate_headers);
    response
}

/// `x-crossguard-audit-id: <id>` for a response.
pub(crate) fn audit_header(record: &ResponseRecord) -> HeaderMap {
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&record.audit_id.to_string()) {
        h.insert(AUDIT_ID_HEADER, v);
    }
    h
}

/// Reads the whole body, refusing (413) anything over `limit` bytes — by its declared
/// length before reading, and by counting while reading when the length is not declared.
async fn read_limited(body: Body, headers: &HeaderMap, limit: usize) -> Result<bytes::Bytes, ApiError> {
    let declared =
        headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
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
