//! Admin sessions: log in with the admin token, get an HttpOnly, SameSite=Strict cookie
//! holding a random session id; every form carries the session's CSRF token.
//!
//! Invariants: the admin token is only ever read from a POST body, compared by
//! [`Authenticator::authorize_admin`] (constant time, through the login throttle) and
//! dropped; it is never put in a URL, a cookie, a page or a log line. Sessions live in memory only (a restart logs
//! everyone out), keyed by the SHA-256 of their id, and expire after [`IDLE`] without use
//! or [`LIFETIME`] after login, whichever comes first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Form};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::html::{esc, frame};
use super::{Admin, AdminError};
use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::login_throttle::ClientIp;
use crate::state::AppState;

/// The session cookie's name.
pub const COOKIE: &str = "crossguard_admin";
/// A session unused for this long is gone.
pub const IDLE: Duration = Duration::from_secs(30 * 60);
/// A session is gone this long after login, used or not.
pub const LIFETIME: Duration = Duration::from_secs(8 * 3600);
/// Most sessions held at once; the least recently used one makes room for a new login.
const MAX_SESSIONS: usize = 256;

struct Entry {
    csrf: String,
    created: Instant,
    last_seen: Instant,
}

impl Entry {
    fn expired(&self, now: Instant) -> bool {
        now.duration_since(self.last_seen) >= IDLE || now.duration_since(self.created) >= LIFETIME
    }
}

/// The logged-in sessions.
#[derive(Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Entry>>,
}

impl Sessions {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<[u8; 32], Entry>) -> R) -> R {
        // A poisoned lock only means a panic elsewhere mid-update; the map stays consistent.
        let mut guard = self.by_digest.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Opens a session; returns its id (the cookie value) and its CSRF token.
    pub fn open(&self) -> (String, String) {
        let (id, csrf) = (random_token(), random_token());
        let now = Instant::now();
        self.with(|map| {
            map.retain(|_, e| !e.expired(now));
            if map.len() >= MAX_SESSIONS {
                if let Some(oldest) = map.iter().min_by_key(|(_, e)| e.last_seen).map(|(k, _)| *k) {
                    map.remove(&oldest);
                }
            }
            map.insert(digest(&id), Entry { csrf: csrf.clone(), created: now, last_seen: now });
        });
        (id, csrf)
    }

    /// The CSRF token of the live session `id`, marking it used; `None` if unknown or expired.
    pub fn touch(&self, id: &str) -> Option<String> {
        let now = Instant::now();
        let key = digest(id);
        self.with(|map| match map.get_mut(&key) {
            Some(e) if !e.expired(now) => {
                e.last_seen = now;
                Some(e.csrf.clone())
            }
            Some(_) => {
                map.remove(&key);
                None
            }
            None => None,
        })
    }

    /// Whether `id` is still a live session (without marking it used: live feeds ask this).
    pub fn is_live(&self, id: &str) -> bool {
        let now = Instant::now();
        self.with(|map| map.get(&digest(id)).is_some_and(|e| !e.expired(now)))
    }

    pub fn close(&self, id: &str) {
        self.with(|map| map.remove(&digest(id)));
    }
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

/// 64 hex characters carrying 244 random bits: two v4 UUIDs, drawn from the uuid crate's
/// cryptographically secure generator (the gateway already depends on it).
fn random_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

/// A request from a logged-in admin. Extracting it refuses (redirect to the login page)
/// requests without a live session.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub csrf: String,
}

impl Session {
    /// Refuses a form whose CSRF token is not this session's.
    pub fn verify_csrf(&self, presented: &str) -> Result<(), AdminError> {
        if bool::from(presented.as_bytes().ct_eq(self.csrf.as_bytes())) {
            Ok(())
        } else {
            Err(AdminError::Csrf)
        }
    }
}

impl FromRequestParts<Arc<AppState>> for Session {
    type Rejection = AdminError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Session, AdminError> {
        if state.config.admin_token.is_none() {
            return Err(AdminError::Disabled);
        }
        let admin = parts.extensions.get::<Arc<Admin>>().ok_or(AdminError::Unmounted)?;
        let id = cookie(&parts.headers, COOKIE).ok_or(AdminError::LoginRequired)?;
        let csrf = admin.sessions.touch(id).ok_or(AdminError::LoginRequired)?;
        Ok(Session { id: id.to_owned(), csrf })
    }
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The session cookie. `Secure` when the request reached a TLS-terminating proxy in front
/// of the gateway (`X-Forwarded-Proto: https`): trusting the header can only add the flag.
fn set_cookie(value: &str, max_age_s: u64, request: &HeaderMap) -> (header::HeaderName, String) {
    let behind_tls =
        request.get("x-forwarded-proto").and_then(|v| v.to_str().ok()).is_some_and(|p| p.eq_ignore_ascii_case("https"));
    let secure = if behind_tls { "; Secure" } else { "" };
    (
        header::SET_COOKIE,
        format!("{COOKIE}={value}; Path=/admin; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"),
    )
}

fn login_page(message: Option<&str>) -> String {
    let note = message.map(|m| format!("<p class=\"error\" role=\"alert\">{}</p>", esc(m))).unwrap_or_default();
    let body = format!(
        "{note}<form method=\"post\" action=\"/admin/login\" class=\"login\" autocomplete=\"off\">\
         <label for=\"token\">Admin token</label>\
         <input type=\"password\" id=\"token\" name=\"token\" required autofocus>\
         <button type=\"submit\">Log in</button></form>\
         <p class=\"muted\">The token is the gateway's <code>admin_token</code>. It is sent once, in the body of this form; \
         the session lives in an HttpOnly cookie.</p>"
    );
    frame("Log in", None, None, &body)
}

/// `GET /admin/login`
pub async fn login_form(State(state): State<Arc<AppState>>) -> Result<Response, AdminError> {
    if state.config.admin_token.is_none() {
        return Err(AdminError::Disabled);
    }
    Ok(axum::response::Html(login_page(None)).into_response())
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    token: String,
}

/// `POST /admin/login`: a right token opens a session and goes to the blocked list; a
/// wrong one gets the form again with 401.
pub async fn login(
    State(state): State<Arc<AppState>>,
    Extension(admin): Extension<Arc<Admin>>,
    client: ClientIp,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, AdminError> {
    // A token that cannot be a header value cannot be the admin token either: it is
    // checked as an empty one, so that it still counts as a wrong guess.
    let mut presented = HeaderMap::new();
    let value = HeaderValue::from_str(&format!("Bearer {}", form.token)).unwrap_or(HeaderValue::from_static("Bearer "));
    presented.insert(header::AUTHORIZATION, value);
    match Authenticator::authorize_admin(&presented, state.config.admin_token.as_ref(), &state.login_throttle, client) {
        Ok(()) => {
            let (id, _) = admin.sessions.open();
            tracing::info!("admin dashboard login");
            Ok((
                StatusCode::SEE_OTHER,
                [set_cookie(&id, LIFETIME.as_secs(), &headers), (header::LOCATION, "/admin".to_owned())],
            )
                .into_response())
        }
        Err(ApiError::AdminDisabled) => Err(AdminError::Disabled),
        Err(ApiError::AdminThrottled { retry_after_s }) => {
            tracing::warn!(retry_after_s, "admin dashboard login throttled");
            let page = login_page(Some(&format!("Too many failed logins; try again in {retry_after_s} s.")));
            Ok((
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_after_s.to_string())],
                axum::response::Html(page),
            )
                .into_response())
        }
        Err(_) => {
            tracing::info!("admin dashboard login refused: wrong token");
            Ok((StatusCode::UNAUTHORIZED, axum::response::Html(login_page(Some("Incorrect admin token."))))
                .into_response())
        }
    }
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    pub csrf: String,
}

/// `POST /admin/logout`
pub async fn logout(
    session: Session,
    Extension(admin): Extension<Arc<Admin>>,
    headers: HeaderMap,
    Form(form): Form<CsrfForm>,
) -> Result<Response, AdminError> {
    session.verify_csrf(&form.csrf)?;
    admin.sessions.close(&session.id);
    Ok((StatusCode::SEE_OTHER, [set_cookie("", 0, &headers), (header::LOCATION, "/admin/login".to_owned())])
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_open_touch_and_close() {
        let s = Sessions::default();
        let (id, csrf) = s.open();
        assert_eq!((id.len(), csrf.len()), (64, 64));
        assert_ne!(id, csrf);
        assert_eq!(s.touch(&id), Some(csrf));
        assert!(s.is_live(&id) && !s.is_live("nope"));
        s.close(&id);
        assert_eq!(s.touch(&id), None);
    }

    #[test]
    fn expired_sessions_are_refused() {
        let s = Sessions::default();
        let (id, _) = s.open();
        let long_ago = Instant::now().checked_sub(IDLE + Duration::from_secs(1));
        if let Some(then) = long_ago {
            s.with(|map| map.values_mut().for_each(|e| e.last_seen = then));
            assert!(!s.is_live(&id));
            assert_eq!(s.touch(&id), None);
        }
    }

    #[test]
    fn csrf_must_match() {
        let session = Session { id: "i".into(), csrf: "abc".into() };
        assert!(session.verify_csrf("abc").is_ok());
        assert!(matches!(session.verify_csrf("abd"), Err(AdminError::Csrf)));
        assert!(matches!(session.verify_csrf(""), Err(AdminError::Csrf)));
    }

    #[test]
    fn the_cookie_is_strict_http_only_and_secure_behind_tls() {
        let (_, plain) = set_cookie("abc", 60, &HeaderMap::new());
        assert_eq!(plain, "crossguard_admin=abc; Path=/admin; HttpOnly; SameSite=Strict; Max-Age=60");
        let mut proxied = HeaderMap::new();
        proxied.insert("x-forwarded-proto", HeaderValue::from_static("https"));
        assert!(set_cookie("abc", 60, &proxied).1.ends_with("; Secure"));
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut h = HeaderMap::new();
        h.append(header::COOKIE, HeaderValue::from_static("a=1; crossguard_admin=xyz"));
        assert_eq!(cookie(&h, COOKIE), Some("xyz"));
        assert_eq!(cookie(&h, "b"), None);
    }
}
