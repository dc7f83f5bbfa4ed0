//! The HTTP surface: routes, the JSON 404/405 fallbacks, and one middleware that gives
//! every request an `x-request-id`, records metrics, and logs each request once (with the
//! error kind and message when it failed — never the body).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::auth::Authenticator;
use crate::error::{ApiError, ApiErrorLog};
use crate::metrics::{self, Exposition};
use crate::routes;
use crate::routes::chat::AUDIT_ID_HEADER;
use crate::state::AppState;

/// The request's id: the client's `x-request-id` when it is sane, a fresh one otherwise.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The gateway's router, testable without a socket.
pub fn router(state: Arc<AppState>) -> Router {
    let routes = Router::new()
        .route("/v1/chat/completions", post(routes::chat::create))
        .route("/v1/completions", post(routes::chat::create_text))
        .route("/v1/responses", post(routes::responses::create))
        .route("/v1/responses/{id}", get(routes::responses::retrieve).delete(routes::responses::delete))
        .route("/v1/models", get(routes::models::list))
        .route("/v1/models/{*id}", get(routes::models::get))
        .route("/healthz", get(routes::health::healthz))
        .route("/readyz", get(routes::health::readyz))
        .route("/metrics", get(metrics))
        .route("/admin/api/audit", get(routes::admin::list_audit))
        .route("/admin/api/audit/{id}", get(routes::admin::get_audit))
        .route("/admin/api/stats", get(routes::admin::stats))
        .route("/admin/api/health", get(routes::admin::health))
        .route("/admin/api/rules/reload", post(routes::admin::reload_rules).get(routes::admin::last_reload))
        .merge(crate::admin::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), observe));
    // Outermost, so a preflight is answered before routing (which would say 405).
    let routes = match cors(&state.config.server.cors_allowed_origins) {
        Some(layer) => routes.layer(layer),
        None => routes,
    };
    routes.with_state(state)
}

/// CORS for the configured origins (validated by the config); `None` when there are none:
/// no header is added and a preflight gets the usual 405.
fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let any = origins.iter().any(|o| o == "*");
    let listed: Vec<HeaderValue> = origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()).collect();
    // The OpenAI API only: the admin API and the dashboard stay same-origin.
    let allow = AllowOrigin::predicate(move |origin, request| {
        request.uri.path().starts_with("/v1/") && (any || listed.contains(origin))
    });
    let exposed = [
        "x-request-id",
        AUDIT_ID_HEADER,
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-reset-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        "x-ratelimit-reset-tokens",
        "retry-after",
    ];
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            // Bearer keys, not cookies: any request header may be named (the SDKs send
            // their own `x-stainless-*` ones).
            .allow_headers(AllowHeaders::any())
            .expose_headers(exposed.map(HeaderName::from_static))
            .max_age(std::time::Duration::from_secs(600)),
    )
}

/// `GET /metrics`; with a metrics token configured, only for `Authorization: Bearer <it>`
/// (the series name tenants and what was found in their responses).
async fn metrics(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<impl IntoResponse, ApiError> {
    Authenticator::authorize_metrics(&headers, state.config.metrics_token.as_ref())?;
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], metrics_text(&state)))
}

/// Every part's metrics, through one writer, in a fixed order.
fn metrics_text(state: &AppState) -> String {
    let mut out = Exposition::new();
    state.metrics.write_metrics(&mut out);
    metrics::write_rules_generation(&mut out, state.rules.generation());
    state.login_throttle.write_metrics(&mut out);
    state.protection.write_metrics(&mut out);
    metrics::write_kv_pools(&mut out, state.models.iter().filter_map(|(id, b)| Some((id.as_str(), b.kv_stats()?))));
    metrics::write_engine_loops(
        &mut out,
        state.models.iter().filter_map(|(id, b)| Some((id.as_str(), b.loop_gauges()?))),
    );
    state.limits.write_metrics(&mut out);
    out.into_text()
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::RouteNotFound { method: method.to_string(), path: uri.path().to_owned() }
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed { method: method.to_string(), path: uri.path().to_owned() }
}

async fn observe(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map(str::to_owned)
        .unwrap_or_else(|| format!("req_{}", uuid::Uuid::now_v7().simple()));
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = request.method().clone();
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    let elapsed = started.elapsed();
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert("x-request-id", value);
    }
    let status = response.status().as_u16();
    state.metrics.observe_request(&route, status, elapsed);
    // The id may be the client's: logged only when it is a plain identifier.
    let logged_id = crate::redact::identifier(&id);
    let method = crate::redact::identifier(method.as_str());
    match response.extensions().get::<ApiErrorLog>() {
        Some(err) if status >= 500 => {
            tracing::warn!(request_id = %logged_id, %method, route, status, kind = err.kind, error = %err.message, detail = err.detail, "request failed")
        }
        Some(err) => {
            tracing::info!(request_id = %logged_id, %method, route, status, kind = err.kind, error = %err.message, detail = err.detail, "request rejected")
        }
        None => {
            tracing::debug!(request_id = %logged_id, %method, route, status, elapsed_us = elapsed.as_micros() as u64, "request")
        }
    }
    response
}
