//! `GET /v1/models` and `GET /v1/models/{id}`: the configured model ids.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;

use crate::api::response::{ModelList, ModelObject};
use crate::error::ApiError;
use crate::state::AppState;

pub async fn list(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<Json<serde_json::Value>, ApiError> {
    state.auth.authenticate(&headers)?;
    let data = state.models.keys().map(|id| model_object(&state, id)).collect();
    to_json(&ModelList { object: "list", data })
}

pub async fn get(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ApiError> {
    state.auth.authenticate(&headers)?;
    let (id, _) = state.models.get_key_value(&id).ok_or_else(|| ApiError::ModelNotFound(id.clone()))?;
    to_json(&model_object(&state, id))
}

fn model_object<'a>(state: &AppState, id: &'a str) -> ModelObject<'a> {
    ModelObject { id, object: "model", created: state.started_unix, owned_by: "crossguard" }
}

fn to_json(value: &impl serde::Serialize) -> Result<Json<serde_json::Value>, ApiError> {
    serde_json::to_value(value).map(Json).map_err(|e| ApiError::Internal(e.to_string()))
}
