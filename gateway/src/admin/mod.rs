//! The admin dashboard at `/admin`: server-rendered pages over the audit log, the tenants'
//! statistics, the rules and the gateway's health, for the security team during an
//! incident.
//!
//! Owns the page routes, the login session ([`session`]), the live feed of new audit
//! records (`live`) and the embedded assets (one stylesheet, one small script; no Node
//! toolchain, nothing from a CDN). Reads what the rest of the gateway already keeps: the
//! store, the statistics, the metrics, the rules. The JSON API in
//! [`crate::routes::admin`] stays the machine interface.
//!
//! Invariants: every page needs a live session, every POST its CSRF token; everything a
//! page shows is escaped (`html`); responses carry a Content-Security-Policy that allows
//! no inline script, and the pages use none. Lists render fully without JavaScript.

mod blocked;
mod charts;
mod detail;
mod health;
mod html;
mod live;
mod rules;
pub mod session;
mod tenants;
mod time;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::state::AppState;
use crate::store::{now_ms, StoreError};

/// The dashboard's own state, shared by its routes.
pub struct Admin {
    sessions: session::Sessions,
    /// When this router was built (the window of "since start-up" figures), Unix ms.
    started_ms: u64,
}

/// The dashboard's routes, to merge into the gateway's router.
pub fn router() -> Router<Arc<AppState>> {
    let admin = Arc::new(Admin { sessions: Default::default(), started_ms: now_ms() });
    Router::new()
        .route("/admin", get(blocked::page))
        .route("/admin/login", get(session::login_form).post(session::login))
        .route("/admin/logout", post(session::logout))
        .route("/admin/events", get(live::events))
        .route("/admin/audit/{id}", get(detail::page))
        .route("/admin/tenants", get(tenants::page))
        .route("/admin/rules", get(rules::page))
        .route("/admin/rules/reload", post(rules::reload))
        .route("/admin/rules/{id}", get(rules::rule_page))
        .route("/admin/health", get(health::page))
        .route("/admin/assets/admin.css", get(stylesheet))
        .route("/admin/assets/admin.js", get(script))
        .layer(middleware::from_fn(security_headers))
        .layer(Extension(admin))
}

/// The Content-Security-Policy of every dashboard response: only same-origin scripts,
/// styles and live feeds; no inline script or style, no framing, forms post only here.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                       form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn stylesheet() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], include_str!("assets/admin.css"))
}

async fn script() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], include_str!("assets/admin.js"))
}

/// Why a dashboard request got no page.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("The dashboard is off: no admin token is configured.")]
    Disabled,
    #[error("Log in first.")]
    LoginRequired,
    #[error(
        "The form is stale or forged (its CSRF token does not match this session). Reload the page and try again."
    )]
    Csrf,
    #[error("{0}")]
    NotFound(String),
    #[error("The audit store cannot answer now: {0}")]
    Store(#[from] StoreError),
    #[error("The dashboard router was built without its state.")]
    Unmounted,
}

impl AdminError {
    fn status(&self) -> StatusCode {
        match self {
            AdminError::Disabled | AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::LoginRequired => StatusCode::SEE_OTHER,
            AdminError::Csrf => StatusCode::FORBIDDEN,
            AdminError::Store(StoreError::BadCursor(_)) => StatusCode::BAD_REQUEST,
            AdminError::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
            AdminError::Unmounted => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response {
        let status = self.status();
        match &self {
            AdminError::LoginRequired => return (status, [(header::LOCATION, "/admin/login")]).into_response(),
            AdminError::Csrf => tracing::warn!("admin form refused: CSRF token mismatch"),
            AdminError::Store(e) => tracing::warn!(error = %e, "admin page failed: store"),
            AdminError::Unmounted => tracing::error!("admin router state missing"),
            AdminError::Disabled | AdminError::NotFound(_) => {}
        }
        let body = format!(
            "<p class=\"error\">{}</p><p><a href=\"/admin\">Back to the dashboard</a></p>",
            html::esc(&self.to_string())
        );
        let title = status.canonical_reason().unwrap_or("Error");
        (status, axum::response::Html(html::frame(title, None, None, &body))).into_response()
    }
}
