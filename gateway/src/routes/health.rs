//! `GET /healthz` (the process answers) and `GET /readyz` (every backend can serve, and
//! other replicas' fingerprints are fresh unless `provenance.provenance_unavailable = "allow"`; the
//! body also says whether the store is degraded, and why not ready).

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
    let backends: serde_json::Map<String, Value> =
        state.models.iter().map(|(id, b)| (id.clone(), json!({"backend": b.kind(), "ready": b.is_ready()}))).collect();
    let models_ready = state.models.values().all(|b| b.is_ready());
    // A degraded store (Redis unreachable) does not stop serving from local state: still
    // ready, but said so, for operators and the dashboard. Stale fingerprints do, unless
    // the config allows serving without them.
    let store = state.protection.store().health();
    let stale = state.protection.provenance_stale();
    let blind = stale.is_some() && state.protection.blocks_when_stale();
    let ready = models_ready && !blind;
    let status = if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let word = match (models_ready, blind, store.degraded || stale.is_some()) {
        (false, _, _) => "starting",
        (true, true, _) => "provenance_unavailable",
        (true, false, true) => "degraded",
        (true, false, false) => "ready",
    };
    let mut body = json!({"status": word, "models": backends, "store": store});
    if let Some(reason) = stale {
        body["reason"] = json!(reason);
    }
    (status, Json(body))
}
