//! `POST /v1/chat/completions`: authenticate, read the body within its limit, validate,
//! pick the model's backend, and relay its events as SSE or as one JSON object.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::api::ChatRequest;
use crate::backend::RequestContext;
use crate::error::ApiError;
use crate::guard::Guard;
use firewall::{Detectors, ScanContext};
use crate::relay::{self, ResponseMeta};
use crate::router::RequestId;
use crate::state::{unix_now, AppState};

pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = state.auth.authenticate(&headers)?;
    let bytes = read_limited(body, &headers, state.config.max_body_bytes).await?;
    let request = ChatRequest::parse(&bytes)?;
    let backend = state.backend(&request.model)?;
    if !backend.is_ready() {
        return Err(ApiError::Unavailable(format!("The model `{}` is still loading; retry shortly.", request.model)));
    }
    let ctx = RequestContext { request_id, tenant: tenant.clone() };
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
    let guard = Guard::new(
        state.rules.current(),
        ScanContext::new(tenant.as_str()),
        Arc::new(Detectors::default()),
        request.n,
    );
    if request.stream {
        let on_end = report_findings(state.clone(), meta.id.clone(), tenant.as_str().to_owned());
        let mut response = Body::from_stream(relay::sse_body(meta, response, guard, on_end)).into_response();
        let h = response.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert("x-accel-buffering", HeaderValue::from_static("no"));
        return Ok(response);
    }
    let mut guard = guard;
    let id = meta.id.clone();
    let completion = relay::collect(meta, response, &mut guard).await.inspect_err(|e| {
        state.metrics.observe_backend_error(&request.model, e.kind());
    })?;
    report_findings(state.clone(), id, tenant.as_str().to_owned())(&guard);
    Ok((StatusCode::OK, Json(completion)).into_response())
}

/// Logs and counts what the firewall found in one response (rule ids and spans only).
fn report_findings(state: Arc<AppState>, response_id: String, tenant: String) -> relay::OnEnd {
    Box::new(move |guard: &Guard| {
        for f in guard.findings() {
            state.metrics.observe_finding(&tenant, &f.finding.rule_id, f.finding.action.as_str());
        }
        if guard.blocked() {
            let rules: Vec<&str> = guard.findings().iter().map(|f| f.finding.rule_id.as_str()).collect();
            tracing::warn!(response_id, tenant, ?rules, released_bytes = guard.released_bytes(), "response blocked by the firewall");
        }
    })
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
