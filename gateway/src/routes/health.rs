//! `GET /healthz` (the process answers) and `GET /readyz` (every backend can serve; the
//! body also says whether the store is degraded).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

use crate::state::AppState;

pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    let backends: serde_json::Map<String, Value> = state
        .models
        .iter()
        .map(|(id, b)| (id.clone(), json!({"backend": b.kind(), "ready": b.is_ready()})))
        .collect();
    let ready = state.models.values().all(|b| b.is_ready());
    // A degraded store (Redis unreachable) does not stop serving from local state: still
    // ready, but said so, for operators and the dashboard.
    let store = state.protection.store().health();
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let word = match (ready, store.degraded) {
        (false, _) => "starting",
        (true, true) => "degraded",
        (true, false) => "ready",
    };
    (status, Json(json!({"status": word, "models": backends, "store": store})))
}
