//! `POST /v1/responses` (OpenAI's Responses API), `GET` and `DELETE /v1/responses/{id}`.
//!
//! A Responses request is translated to the chat request both backends serve (an upstream
//! is called through its chat completions API) and takes the chat path from admission on:
//! limits, protection, the response guard, the audit. What the guard released is written as
//! Responses events or one `response` object; a block makes the response `incomplete`
//! (`content_filter`). With `store` (the default) the response and the conversation it ends
//! are kept under the tenant, so `previous_response_id` continues only the tenant's own
//! responses, and only with what was released to it.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::chat::{audit_header, caller, event_stream, read_body, start, Started};
use crate::api::responses::request::is_response_id;
use crate::api::responses::{ResponseObject, ResponsesRequest, StoredResponse};
use crate::error::ApiError;
use crate::relay::{self, Persist, ResponseMeta, ResponsesFraming, Shape};
use crate::router::RequestId;
use crate::state::{unix_now, AppState};
use crate::store::Store;

/// `POST /v1/responses`.
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(request_id)): Extension<RequestId>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let tenant = caller(&state, &headers)?;
    let bytes = read_body(&state, &headers, body).await?;
    let mut request = ResponsesRequest::parse(&bytes)?;
    let settings = &state.config.responses;
    if !settings.store {
        if request.previous_response_id.is_some() {
            return Err(ApiError::param(
                "previous_response_id",
                "stored responses are turned off on this gateway ([responses] store = false)",
            ));
        }
        request.store = false;
        request.echo.store = false;
    }
    let store = state.protection.store().clone();
    let history = match &request.previous_response_id {
        Some(id) => previous_conversation(&store, tenant.as_str(), id).await?,
        None => Vec::new(),
    };
    let mut chat = request.chat_request(&history)?;
    let Started { finisher, response, mut guard, rate_headers } =
        start(&state, &tenant, request_id, &mut chat).await.map_err(|e| request.rename(e, history.len()))?;
    let id = format!("resp_{}", uuid::Uuid::now_v7().simple());
    let object = ResponseObject::started(id.clone(), unix_now(), request.model.clone(), request.echo.clone());
    // The client's own turns (before the gateway marked the prompt) and, appended when the
    // response ends, what it was given.
    let persist = request.store.then(|| {
        let conversation = history.into_iter().chain(request.input.iter().cloned()).collect();
        persister(state.clone(), tenant.as_str().to_owned(), conversation)
    });
    if request.stream {
        return Ok(event_stream(ResponsesFraming::new(object, persist), response, guard, finisher, rate_headers));
    }
    let meta = ResponseMeta {
        id,
        created: object.created_at,
        model: request.model.clone(),
        include_usage: false,
        shape: Shape::Chat,
    };
    let collected = relay::collect(meta, response, &mut guard).await;
    let (completion, audited) = finisher.whole(&mut guard, collected).await?;
    let object = relay::whole_response(object, completion);
    if let Some(persist) = persist {
        persist(&object).await;
    }
    let mut response_headers = if audited { audit_header(finisher.record()) } else { HeaderMap::new() };
    response_headers.extend(rate_headers);
    Ok((StatusCode::OK, response_headers, Json(object)).into_response())
}

/// `GET /v1/responses/{id}`: a response the tenant stored. (Authentication only: a
/// quarantined tenant may still read and delete what it was already given.)
pub async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = state.auth.authenticate(&headers)?;
    let stored = stored(state.protection.store(), tenant.as_str(), &id).await?.ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response))
}

/// `DELETE /v1/responses/{id}`.
pub async fn delete(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let tenant = state.auth.authenticate(&headers)?;
    if !is_response_id(&id) {
        return Err(not_found(&id));
    }
    let deleted = state.protection.store().delete_response(tenant.as_str(), &id).await.map_err(unavailable)?;
    if !deleted {
        return Err(not_found(&id));
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})))
}

/// The conversation the tenant's stored response `id` ends.
async fn previous_conversation(store: &Store, tenant: &str, id: &str) -> Result<Vec<Map<String, Value>>, ApiError> {
    match stored(store, tenant, id).await? {
        Some(stored) => Ok(stored.conversation),
        None => Err(ApiError::param("previous_response_id", format!("Previous response with id '{id}' not found."))),
    }
}

async fn stored(store: &Store, tenant: &str, id: &str) -> Result<Option<StoredResponse>, ApiError> {
    if !is_response_id(id) {
        return Ok(None);
    }
    let Some(json) = store.get_response(tenant, id).await.map_err(unavailable)? else { return Ok(None) };
    serde_json::from_str(&json).map(Some).map_err(|e| {
        // serde's message may quote the record: the log gets its position only.
        tracing::error!(
            tenant,
            response_id = id,
            line = e.line(),
            column = e.column(),
            "a stored response could not be read"
        );
        ApiError::Internal("a stored response could not be read".into())
    })
}

/// Keeps the finished response and its conversation under the tenant; a record over
/// `[responses] max_stored_bytes` is not kept (a conversation continued that long ends
/// there). A response not kept is logged and counted (`crossguard_protection_events_total`,
/// `event="response_not_stored"`).
fn persister(state: Arc<AppState>, tenant: String, conversation: Vec<Map<String, Value>>) -> Persist {
    Box::new(move |response: &ResponseObject| {
        let record = StoredResponse::new(response, conversation);
        let id = response.id.clone();
        Box::pin(async move {
            let (store, settings) = (state.protection.store(), &state.config.responses);
            let (ttl_secs, max_bytes) = (settings.ttl_secs, settings.max_stored_bytes);
            let stored = match serde_json::to_string(&record) {
                Ok(json) if json.len() > max_bytes => {
                    Err(format!("the record is {} bytes, over [responses] max_stored_bytes = {max_bytes}", json.len()))
                }
                Ok(json) => store.put_response(&tenant, &id, json, ttl_secs).await.map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = stored {
                state.metrics.observe_protection_event(&tenant, "response_not_stored");
                tracing::warn!(
                    tenant,
                    response_id = id,
                    error,
                    "the response could not be stored: previous_response_id will not find it"
                );
            }
        })
    })
}

fn not_found(id: &str) -> ApiError {
    ApiError::ResourceNotFound(format!("Response with id '{}' not found.", crate::redact::identifier(id)))
}

/// The store failed: the client gets a fixed message (a store's error can name hosts), the
/// log the detail.
fn unavailable(e: crate::store::StoreError) -> ApiError {
    tracing::warn!(error = %e, "stored responses are unavailable");
    ApiError::Unavailable("Stored responses are unavailable right now; retry shortly.".into())
}
