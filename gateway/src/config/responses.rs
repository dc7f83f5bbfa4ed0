//! The `[responses]` table: how long stored Responses API responses live, and how many the
//! embedded store keeps in memory.

use serde::Deserialize;

use super::{ConfigError, Invalid};

/// OpenAI keeps stored responses 30 days.
const DEFAULT_TTL_SECS: u64 = 30 * 86_400;
const DEFAULT_MAX_STORED: usize = 10_000;
const DEFAULT_MAX_STORED_BYTES: usize = 256 << 20;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawResponses {
    store: Option<bool>,
    ttl_secs: Option<u64>,
    max_stored: Option<usize>,
    max_stored_bytes: Option<usize>,
}

/// Stored responses (`store: true`, the default of `POST /v1/responses`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponsesConfig {
    /// Whether responses are stored at all (`false`: `store` is answered `false`, and
    /// `previous_response_id` finds nothing).
    pub store: bool,
    /// How long a stored response can be continued or fetched.
    pub ttl_secs: u64,
    /// Embedded store: most responses kept (the oldest of the tenant holding the most go first).
    pub max_stored: usize,
    /// Most bytes of stored responses kept (embedded store; the oldest of the tenant holding
    /// the most go first); also the largest one record may be, in either store.
    pub max_stored_bytes: usize,
}

impl Default for ResponsesConfig {
    fn default() -> ResponsesConfig {
        ResponsesConfig {
            store: true,
            ttl_secs: DEFAULT_TTL_SECS,
            max_stored: DEFAULT_MAX_STORED,
            max_stored_bytes: DEFAULT_MAX_STORED_BYTES,
        }
    }
}

pub(super) fn validate_responses(
    raw: Option<RawResponses>,
    invalid: &Invalid<'_>,
) -> Result<ResponsesConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let ttl_secs = raw.ttl_secs.unwrap_or(DEFAULT_TTL_SECS);
    if !(1..=365 * 86_400).contains(&ttl_secs) {
        return Err(invalid("responses.ttl_secs".into(), format!("must be between 1 and 31536000, got {ttl_secs}")));
    }
    let max_stored = raw.max_stored.unwrap_or(DEFAULT_MAX_STORED);
    if max_stored == 0 {
        return Err(invalid(
            "responses.max_stored".into(),
            "must be at least 1 (to store none, set responses.store = false)".into(),
        ));
    }
    let max_stored_bytes = raw.max_stored_bytes.unwrap_or(DEFAULT_MAX_STORED_BYTES);
    if max_stored_bytes < 1024 {
        return Err(invalid(
            "responses.max_stored_bytes".into(),
            format!("must be at least 1024, got {max_stored_bytes}"),
        ));
    }
    Ok(ResponsesConfig { store: raw.store.unwrap_or(true), ttl_secs, max_stored, max_stored_bytes })
}
