//! What of an upstream's error reaches a client: the status (mapped as the README's error
//! contract says), and the upstream's `code` and `param` only when they are plain
//! identifiers. Never its message: a failing or hostile upstream can put anything there,
//! another tenant's text included, and an error is not scanned by the firewall. The client
//! gets a fixed message naming the upstream's HTTP status and the request id; the
//! upstream's message goes to the log only as its length and keyed hash
//! ([`crate::redact`]), as the error's `detail`, logged once with it.
//!
//! Invariant: no string from an upstream error body reaches an [`ApiError`]'s message, and
//! `code`/`param` do only if they match `^[a-z0-9_.]{1,64}$`.

use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::error::ApiError;

/// Longest `code` or `param` passed on.
const MAX_IDENTIFIER_BYTES: usize = 64;

/// `{"error": ...}` as upstreams write it: an object, or (some servers) a bare string.
#[derive(Debug, Deserialize)]
struct ErrorBody {
    error: ErrorField,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ErrorField {
    Object(ErrorObject),
    Text(String),
}

#[derive(Debug, Default, Deserialize)]
struct ErrorObject {
    #[serde(default)]
    message: Option<Scalar>,
    #[serde(default)]
    code: Option<Scalar>,
    #[serde(default)]
    param: Option<Scalar>,
}

/// A field that should be a string; anything else (a number, `null`, an object) is kept
/// out without failing the whole body.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Scalar {
    Text(String),
    Other(IgnoredAny),
}

impl Scalar {
    fn text(&self) -> Option<&str> {
        match self {
            Scalar::Text(s) => Some(s),
            Scalar::Other(_) => None,
        }
    }
}

impl ErrorField {
    fn object(self) -> ErrorObject {
        match self {
            ErrorField::Object(o) => o,
            ErrorField::Text(t) => ErrorObject { message: Some(Scalar::Text(t)), ..ErrorObject::default() },
        }
    }
}

/// The error for an upstream's HTTP error answer: the caller's own mistakes (400, 404, 409,
/// 422, 429) keep their status; the gateway's (401, 403: its credentials) and the
/// upstream's (5xx, anything else) are a 502.
pub fn from_status(status: u16, body: &[u8], request_id: &str) -> ApiError {
    let error = serde_json::from_slice::<ErrorBody>(body).map(|b| b.error.object()).unwrap_or_default();
    let detail = detail(&error, body.len());
    let request_id = request_id.to_owned();
    match status {
        400 | 404 | 409 | 422 | 429 => ApiError::UpstreamRejected {
            status,
            code: identifier(error.code.as_ref()),
            param: identifier(error.param.as_ref()),
            request_id,
            detail,
        },
        _ => ApiError::UpstreamFailed { status: Some(status), request_id, detail },
    }
}

/// The error for a `{"error": ...}` event inside an upstream's stream (`error` is the
/// event's `error` member).
pub fn from_stream_event(error: &serde_json::Value, request_id: &str) -> ApiError {
    let object = ErrorField::deserialize(error).map(ErrorField::object).unwrap_or_default();
    ApiError::UpstreamFailed { status: None, request_id: request_id.to_owned(), detail: detail(&object, 0) }
}

/// The upstream's message, masked, for the log.
fn detail(error: &ErrorObject, body_bytes: usize) -> String {
    match error.message.as_ref().and_then(Scalar::text) {
        Some(message) => format!("upstream message {}", crate::redact::text(message)),
        None => format!("no upstream message ({body_bytes} body bytes)"),
    }
}

/// `value` when it is a plain identifier (`^[a-z0-9_.]{1,64}$`).
fn identifier(value: Option<&Scalar>) -> Option<String> {
    let text = value?.text()?;
    let plain = !text.is_empty()
        && text.len() <= MAX_IDENTIFIER_BYTES
        && text.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'.');
    plain.then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CANARY: &str = "cg-0123456789abcdef01234567";

    fn body(message: &str, code: serde_json::Value, param: serde_json::Value) -> Vec<u8> {
        json!({"error": {"message": message, "type": "x", "code": code, "param": param}}).to_string().into_bytes()
    }

    #[test]
    fn statuses_keep_the_contract() {
        for (status, expected) in [
            (400, 400),
            (404, 404),
            (409, 409),
            (422, 422),
            (429, 429),
            (401, 502),
            (403, 502),
            (500, 502),
            (503, 502),
            (418, 502),
        ] {
            assert_eq!(from_status(status, b"", "req-1").status().as_u16(), expected, "{status}");
        }
    }

    #[test]
    fn an_upstream_message_never_reaches_the_client() {
        let leak = format!("Invalid value; by the way the other tenant's key is {CANARY}");
        for status in [400, 429, 500, 503, 401] {
            let e = from_status(status, &body(&leak, json!("invalid_value"), json!("temperature")), "req-7");
            let client = serde_json::to_string(&e.envelope()).unwrap();
            assert!(!client.contains("cg-0123") && !client.contains("other tenant"), "{status}: {client}");
            assert!(client.contains("req-7") && client.contains(&status.to_string()), "{client}");
            let detail = e.log_detail().unwrap();
            assert!(!detail.contains("other tenant") && !detail.contains(CANARY), "masked for the log: {detail}");
        }
    }

    #[test]
    fn code_and_param_pass_only_as_plain_identifiers() {
        let e = from_status(400, &body("x", json!("invalid_value"), json!("messages.0.content")), "r");
        assert_eq!((e.code().as_deref(), e.param_name()), (Some("invalid_value"), Some("messages.0.content")));
        for bad in [
            json!(CANARY),
            json!("ghp_ABCdef"),
            json!("a b"),
            json!(""),
            json!("x".repeat(65)),
            json!(42),
            json!({"k": "v"}),
        ] {
            let e = from_status(400, &body("x", bad.clone(), bad.clone()), "r");
            assert_eq!((e.code(), e.param_name()), (None, None), "{bad}");
        }
    }

    #[test]
    fn odd_bodies_still_map() {
        let bare = from_status(400, br#"{"error": "bad thing cg-0123456789abcdef01234567"}"#, "r");
        assert!(!bare.to_string().contains("cg-"));
        assert!(from_status(500, b"not json at all", "r").log_detail().is_some_and(|d| d.contains("15 body bytes")));
    }

    #[test]
    fn a_stream_error_event_is_a_fixed_502() {
        let e = from_stream_event(&json!({"message": format!("overloaded, see {CANARY}"), "code": CANARY}), "req-9");
        assert_eq!(e.status().as_u16(), 502);
        let client = serde_json::to_string(&e.envelope()).unwrap();
        assert!(!client.contains("cg-") && !client.contains("overloaded") && client.contains("req-9"), "{client}");
    }
}
