//! `ApiError`: every way a request can fail, each mapped to one HTTP status and an
//! OpenAI error envelope `{"error":{"message","type","param","code"}}`.
//!
//! Handlers return `Result<_, ApiError>`; the conversion to a response happens here and
//! nowhere else, so no route can answer with a plain-text error. The error is logged once,
//! by the request middleware, from the `ApiErrorLog` extension this module attaches.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::redact;

/// A failed request, as the client will see it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The body is not JSON at all.
    #[error("We could not parse the JSON body of your request: {0}")]
    MalformedJson(String),
    /// A field has the wrong type, is missing, or is out of range.
    #[error("{message}")]
    InvalidParam { param: String, message: String },
    /// The prompt (plus room to answer) does not fit the model's context window.
    #[error("{message}")]
    ContextLengthExceeded { message: String, param: String },
    /// Missing, malformed or unknown API key.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// The tenant is quarantined: it tripped too many blocks for other tenants' data.
    #[error("Requests from this API key are suspended: too many responses were blocked for other tenants' data recently. Contact the gateway's operators.")]
    Quarantined,
    /// Too many wrong admin tokens from this client (or from everyone): every admin login,
    /// a right token included, waits `retry_after_s` seconds (`[admin_throttle]`).
    #[error("Too many failed admin logins; retry after {retry_after_s} s.")]
    AdminThrottled { retry_after_s: u64 },
    /// A streaming client read nothing for `stall_ms` while its engine stream was full:
    /// its generation was stopped to free the engine (sent as the stream's last event).
    #[error("The stream was stopped: the client read nothing for {stall_ms} ms while its buffer was full.")]
    StreamStalled { stall_ms: u64 },
    /// The admin API was called but no admin token is configured.
    #[error("The admin API is disabled: configure admin_token (or CROSSGUARD_ADMIN_TOKEN) to enable it.")]
    AdminDisabled,
    /// A named resource (an audit record) does not exist.
    #[error("{0}")]
    ResourceNotFound(String),
    /// The requested model is not configured.
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// No route matches the path.
    #[error("Unknown request URL: {method} {path}.")]
    RouteNotFound { method: String, path: String },
    /// The route exists but not for this method.
    #[error("Method {method} is not allowed for {path}.")]
    MethodNotAllowed { method: String, path: String },
    /// The body exceeds the configured limit.
    #[error("Request body is larger than the limit of {limit_bytes} bytes.")]
    PayloadTooLarge { limit_bytes: usize },
    /// The upstream answered with a client error that the caller should see as such
    /// (400, 404, 409, 422, 429): its status is kept, and its `code` and `param` when they
    /// are plain identifiers; its message never reaches the client (it could carry anything),
    /// only the log, masked, as `detail`.
    #[error("The upstream rejected the request with HTTP {status} (request {request_id}).")]
    UpstreamRejected { status: u16, code: Option<String>, param: Option<String>, request_id: String, detail: String },
    /// The upstream answered an error: HTTP 5xx, rejected credentials (`status`), or an
    /// error event in the middle of its stream (`status: None`). A fixed message for the
    /// client; the upstream's own text, masked, is `detail`, for the log.
    #[error("{}", upstream_failed_message(*.status, .request_id))]
    UpstreamFailed { status: Option<u16>, request_id: String, detail: String },
    /// The gateway could not get a usable answer: unreachable upstream, a body that is
    /// not JSON, a broken stream. The text is the gateway's own, never the upstream's.
    #[error("{0}")]
    BadGateway(String),
    /// The upstream did not answer in time.
    #[error("{0}")]
    GatewayTimeout(String),
    /// The engine's request queue is full: retry after `retry_after_s` seconds.
    #[error("The engine is at capacity ({queued} requests waiting); retry after {retry_after_s} s.")]
    EngineBusy { queued: usize, retry_after_s: u64 },
    /// The gateway cannot serve yet (model still loading) or is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// Other replicas' fingerprints are stale, so another tenant's text could pass the
    /// firewall unseen: refused (`provenance.provenance_unavailable = "block"`, tenant fail mode closed).
    #[error("Cross-tenant protection is temporarily unavailable ({0}); the request was not sent. Retry shortly.")]
    ProvenanceUnavailable(String),
    /// A bug or an unexpected condition inside the gateway.
    #[error("{0}")]
    Internal(String),
    /// A tenant limit refused the request (429 with `Retry-After` and `x-ratelimit-*`).
    #[error("{0}")]
    RateLimited(Box<crate::limits::RateLimited>),
    /// The request body did not arrive within `[server] body_read_timeout_ms`.
    #[error("The request body did not arrive within {timeout_ms} ms.")]
    RequestTimeout { timeout_ms: u64 },
}

impl ApiError {
    /// A 400 naming the offending parameter.
    pub fn param(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidParam { param: param.into(), message: message.into() }
    }

    /// The prompt does not fit the model's context (`param: "messages"`).
    pub fn context_length(message: impl Into<String>) -> Self {
        ApiError::ContextLengthExceeded { message: message.into(), param: "messages".into() }
    }

    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::MalformedJson(_) | ApiError::InvalidParam { .. } | ApiError::ContextLengthExceeded { .. } => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Quarantined => StatusCode::FORBIDDEN,
            ApiError::StreamStalled { .. } => StatusCode::REQUEST_TIMEOUT,
            ApiError::ModelNotFound(_)
            | ApiError::RouteNotFound { .. }
            | ApiError::AdminDisabled
            | ApiError::ResourceNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UpstreamRejected { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            ApiError::UpstreamFailed { .. } | ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::GatewayTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::EngineBusy { .. } | ApiError::AdminThrottled { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::ProvenanceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// OpenAI's `type` field.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::MalformedJson(_)
            | ApiError::InvalidParam { .. }
            | ApiError::ContextLengthExceeded { .. }
            | ApiError::ModelNotFound(_)
            | ApiError::AdminDisabled
            | ApiError::ResourceNotFound(_)
            | ApiError::RouteNotFound { .. }
            | ApiError::MethodNotAllowed { .. }
            | ApiError::PayloadTooLarge { .. }
            | ApiError::RequestTimeout { .. } => "invalid_request_error",
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::Quarantined => "permission_error",
            ApiError::StreamStalled { .. } => "invalid_request_error",
            ApiError::UpstreamRejected { status: 429, .. }
            | ApiError::EngineBusy { .. }
            | ApiError::AdminThrottled { .. } => "rate_limit_error",
            ApiError::UpstreamRejected { .. } => "invalid_request_error",
            ApiError::UpstreamFailed { .. } | ApiError::BadGateway(_) | ApiError::GatewayTimeout(_) => "upstream_error",
            ApiError::Unavailable(_) | ApiError::ProvenanceUnavailable(_) | ApiError::Internal(_) => "server_error",
            ApiError::RateLimited(r) => r.openai_type(),
        }
    }

    /// OpenAI's `code` field.
    pub fn code(&self) -> Option<String> {
        let code = match self {
            ApiError::MalformedJson(_) => "invalid_json",
            ApiError::InvalidParam { .. } => "invalid_value",
            ApiError::ContextLengthExceeded { .. } => "context_length_exceeded",
            ApiError::Unauthorized(_) => "invalid_api_key",
            ApiError::Quarantined => "tenant_quarantined",
            ApiError::StreamStalled { .. } => "stream_stalled",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::RouteNotFound { .. } => "unknown_url",
            ApiError::AdminDisabled => "admin_disabled",
            ApiError::ResourceNotFound(_) => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::PayloadTooLarge { .. } => "request_too_large",
            ApiError::UpstreamRejected { code, .. } => return code.clone(),
            ApiError::UpstreamFailed { .. } | ApiError::BadGateway(_) => "upstream_error",
            ApiError::GatewayTimeout(_) => "upstream_timeout",
            ApiError::EngineBusy { .. } => "engine_busy",
            ApiError::AdminThrottled { .. } => "admin_login_throttled",
            ApiError::Unavailable(_) => "unavailable",
            ApiError::ProvenanceUnavailable(_) => "provenance_unavailable",
            ApiError::Internal(_) => "internal_error",
            ApiError::RateLimited(_) => "rate_limit_exceeded",
            ApiError::RequestTimeout { .. } => "request_timeout",
        };
        Some(code.to_owned())
    }

    /// The parameter at fault, if any.
    pub fn param_name(&self) -> Option<&str> {
        match self {
            ApiError::InvalidParam { param, .. } => Some(param),
            ApiError::ModelNotFound(_) => Some("model"),
            ApiError::ContextLengthExceeded { param, .. } => Some(param),
            ApiError::UpstreamRejected { param, .. } => param.as_deref(),
            _ => None,
        }
    }

    /// The message for the log: the client's message where the gateway wrote all of it;
    /// where a client chose part of it (a model name, a path, a JSON value quoted by the
    /// parser), a fixed description and the chosen text only as [`redact::text`].
    pub fn log_message(&self) -> String {
        match self {
            ApiError::MalformedJson(m) => format!("the body is not valid JSON {}", redact::text(m)),
            ApiError::InvalidParam { param, message } => {
                format!("invalid parameter {} {}", redact::identifier(param), redact::text(message))
            }
            ApiError::ModelNotFound(model) => format!("unknown model {}", redact::text(model)),
            ApiError::RouteNotFound { method, path } => {
                format!("unknown route {} {}", redact::identifier(method), redact::text(path))
            }
            ApiError::MethodNotAllowed { method, path } => {
                format!("method not allowed {} {}", redact::identifier(method), redact::text(path))
            }
            ApiError::ResourceNotFound(m) => format!("not found {}", redact::text(m)),
            // The client's message names the request id, which the client may have chosen;
            // the log line carries it already, shown safely.
            ApiError::UpstreamRejected { status, .. } => {
                format!("the upstream rejected the request with HTTP {status}")
            }
            ApiError::UpstreamFailed { status: Some(status), .. } => format!("the upstream failed with HTTP {status}"),
            ApiError::UpstreamFailed { status: None, .. } => "the upstream reported an error mid-stream".to_owned(),
            ApiError::ContextLengthExceeded { .. }
            | ApiError::Unauthorized(_)
            | ApiError::Quarantined
            | ApiError::AdminThrottled { .. }
            | ApiError::AdminDisabled
            | ApiError::PayloadTooLarge { .. }
            | ApiError::BadGateway(_)
            | ApiError::GatewayTimeout(_)
            | ApiError::EngineBusy { .. }
            | ApiError::RateLimited(_)
            | ApiError::RequestTimeout { .. }
            | ApiError::StreamStalled { .. }
            | ApiError::Unavailable(_)
            | ApiError::ProvenanceUnavailable(_)
            | ApiError::Internal(_) => self.to_string(),
        }
    }

    /// What the log gets beyond the client's message: an upstream's own error text, masked.
    pub fn log_detail(&self) -> Option<&str> {
        match self {
            ApiError::UpstreamRejected { detail, .. } | ApiError::UpstreamFailed { detail, .. } => Some(detail),
            _ => None,
        }
    }

    /// The OpenAI error envelope for this error.
    pub fn envelope(&self) -> ErrorEnvelope<'_> {
        ErrorEnvelope {
            error: ErrorBody {
                message: self.to_string(),
                kind: self.kind(),
                param: self.param_name(),
                code: self.code(),
            },
        }
    }
}

/// The client's message for [`ApiError::UpstreamFailed`]: the status and the request id,
/// nothing the upstream wrote.
fn upstream_failed_message(status: Option<u16>, request_id: &str) -> String {
    match status {
        Some(s @ (401 | 403)) => {
            format!("The upstream refused the gateway's credentials with HTTP {s} (request {request_id}).")
        }
        Some(s) => format!("The upstream failed with HTTP {s} (request {request_id})."),
        None => format!("The upstream reported an error in the middle of its stream (request {request_id})."),
    }
}

/// `{"error": {...}}`, the body of every error response and of an SSE error event.
#[derive(Debug, Serialize)]
pub struct ErrorEnvelope<'a> {
    pub error: ErrorBody<'a>,
}

/// The inner object of [`ErrorEnvelope`].
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: Option<String>,
}

/// Attached to error responses so the logging middleware can log the error once, with
/// [`ApiError::log_message`] (never a client's or an upstream's text).
#[derive(Debug, Clone)]
pub struct ApiErrorLog {
    pub kind: &'static str,
    pub message: String,
    /// [`ApiError::log_detail`].
    pub detail: Option<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.envelope()).unwrap_or_else(|_| {
            br#"{"error":{"message":"internal error","type":"server_error","param":null,"code":null}}"#.to_vec()
        });
        let mut response = (self.status(), body).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let ApiError::EngineBusy { retry_after_s, .. } | ApiError::AdminThrottled { retry_after_s } = &self {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_s));
        }
        if let ApiError::RateLimited(r) = &self {
            r.write_headers(response.headers_mut());
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response.extensions_mut().insert(ApiErrorLog {
            kind: self.kind(),
            message: self.log_message(),
            detail: self.log_detail().map(str::to_owned),
        });
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_openai_shape() {
        let err = ApiError::param("temperature", "temperature must be between 0 and 2, got 3");
        let v = serde_json::to_value(err.envelope()).unwrap();
        assert_eq!(v["error"]["param"], "temperature");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "invalid_value");
        assert!(v["error"]["message"].as_str().unwrap().contains("got 3"));
        assert_eq!(err.status(), StatusCode::BAD_REQUEST);
    }

    #[test]
    fn statuses_cover_the_contract() {
        assert_eq!(ApiError::Unauthorized("x").status(), 401);
        assert_eq!(ApiError::Quarantined.status(), 403);
        assert_eq!(ApiError::ModelNotFound("m".into()).status(), 404);
        assert_eq!(ApiError::PayloadTooLarge { limit_bytes: 1 }.status(), 413);
        assert_eq!(ApiError::BadGateway("x".into()).status(), 502);
        assert_eq!(ApiError::GatewayTimeout("x".into()).status(), 504);
        let rl = ApiError::UpstreamRejected {
            status: 429,
            code: None,
            param: None,
            request_id: "r1".into(),
            detail: String::new(),
        };
        assert_eq!(rl.status(), 429);
        assert_eq!(rl.kind(), "rate_limit_error");
        let failed = ApiError::UpstreamFailed { status: Some(503), request_id: "r2".into(), detail: "over****".into() };
        assert_eq!(
            (failed.status().as_u16(), failed.to_string()),
            (502, "The upstream failed with HTTP 503 (request r2).".to_owned())
        );
        assert_eq!(failed.log_detail(), Some("over****"));
    }

    #[test]
    fn log_messages_never_carry_client_text() {
        const MARK: &str = "zq-client-marker-91";
        let errors = [
            ApiError::MalformedJson(format!("unknown variant `{MARK}`")),
            ApiError::param(format!("messages[0].{MARK} x"), format!("role must be one of ..., got {MARK}")),
            ApiError::ModelNotFound(MARK.into()),
            ApiError::RouteNotFound { method: "GET".into(), path: format!("/v1/{MARK}") },
            ApiError::MethodNotAllowed { method: format!("{MARK} X"), path: format!("/{MARK}") },
            ApiError::ResourceNotFound(format!("No audit record with id {MARK:?}.")),
        ];
        for e in errors {
            assert!(e.to_string().contains(MARK), "the client's own message keeps it: {e}");
            let logged = e.log_message();
            assert!(!logged.contains(MARK) && !logged.contains("zq-"), "{logged}");
        }
        assert_eq!(ApiError::param("temperature", "x").log_message().split(' ').nth(2), Some("temperature"));
        let throttled = ApiError::AdminThrottled { retry_after_s: 42 }.into_response();
        assert_eq!(
            (throttled.status().as_u16(), throttled.headers()[header::RETRY_AFTER].to_str().ok()),
            (429, Some("42"))
        );
    }
}
