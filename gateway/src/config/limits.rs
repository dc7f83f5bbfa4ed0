//! The `[limits]`, `[tenants.limits]` and `[server]` tables: raw mirrors and their
//! validated forms. What the numbers mean at run time is [`crate::limits`]'s business;
//! here they are only read, bounded and given defaults. Per-model caps (`max_n`,
//! `max_tokens_cap`, `max_stream_event_bytes`) are `[[models]]` keys and are validated by
//! [`model_caps`].

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{ConfigError, Invalid};

const DEFAULT_MAX_CONCURRENT_REQUESTS: u32 = 64;
const DEFAULT_MAX_CONNECTIONS: usize = 4096;
const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
const DEFAULT_BODY_READ_TIMEOUT_MS: u64 = 30_000;
const DEFAULT_MAX_N: u32 = 8;
const DEFAULT_UPSTREAM_MAX_TOKENS_CAP: u32 = 32_768;
/// Per-minute budgets are kept in fixed point (`budget * 60_000` per minute), so the
/// largest one must leave room in an `i64`.
pub const MAX_PER_MINUTE: u64 = 1_000_000_000_000;

/// `[limits]` and `[tenants.limits]`: every key optional; a tenant's table overrides the
/// global one key by key.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    max_concurrent_requests: Option<u32>,
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
}

/// `[server]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    max_connections: Option<usize>,
    header_read_timeout_ms: Option<u64>,
    body_read_timeout_ms: Option<u64>,
    cors_allowed_origins: Option<Vec<String>>,
}

/// One tenant's effective limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitSettings {
    /// Requests of the tenant in flight at once (a stream counts until it ends).
    pub max_concurrent_requests: u32,
    /// `None`: unlimited.
    pub requests_per_minute: Option<u64>,
    /// `None`: unlimited. Counted as [`crate::limits`] explains.
    pub tokens_per_minute: Option<u64>,
}

/// The global limits and each tenant's overrides, already merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsConfig {
    /// What a tenant without `[tenants.limits]` (and open mode's anonymous tenant) gets.
    pub default: LimitSettings,
    /// Tenant id -> its limits, for tenants with a `[tenants.limits]` table.
    pub tenants: BTreeMap<String, LimitSettings>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            default: LimitSettings {
                max_concurrent_requests: DEFAULT_MAX_CONCURRENT_REQUESTS,
                requests_per_minute: None,
                tokens_per_minute: None,
            },
            tenants: BTreeMap::new(),
        }
    }
}

impl LimitsConfig {
    /// The limits `tenant` runs under.
    pub fn for_tenant(&self, tenant: &str) -> LimitSettings {
        self.tenants.get(tenant).copied().unwrap_or(self.default)
    }
}

/// How connections are accepted and read, and which browser origins may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Open connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Time allowed for a request's headers to arrive, counted from when the connection
    /// starts waiting for them (so an idle keep-alive connection is closed after it too).
    pub header_read_timeout_ms: u64,
    /// Time allowed for a whole request body to arrive once the handler starts reading it.
    pub body_read_timeout_ms: u64,
    /// Origins (`https://app.example.com`, or `*` for any) whose browser pages may call the
    /// API (CORS); empty, the default: none.
    pub cors_allowed_origins: Vec<String>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            body_read_timeout_ms: DEFAULT_BODY_READ_TIMEOUT_MS,
            cors_allowed_origins: Vec::new(),
        }
    }
}

/// Per-model caps on what one request may ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelCaps {
    /// Largest `n` (choices per request).
    pub max_n: u32,
    /// Largest `max_tokens` / `max_completion_tokens`; `None` for engine models, whose
    /// context length bounds a completion already.
    pub max_tokens_cap: Option<u32>,
}

impl Default for ModelCaps {
    /// An engine model's caps (the default model's).
    fn default() -> Self {
        ModelCaps { max_n: DEFAULT_MAX_N, max_tokens_cap: None }
    }
}

/// The `[[models]]` keys of this module, as written.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RawModelCaps {
    pub max_n: Option<u32>,
    pub max_tokens_cap: Option<u32>,
    pub max_stream_event_bytes: Option<usize>,
}

/// Validates `[limits]` and the `[tenants.limits]` tables (`(index, id, table)` each).
pub(super) fn validate_limits(
    global: Option<RawLimits>,
    tenants: Vec<(usize, String, RawLimits)>,
    invalid: &Invalid<'_>,
) -> Result<LimitsConfig, ConfigError> {
    let base = LimitsConfig::default().default;
    let default = merge(base, global.unwrap_or_default(), "limits", invalid)?;
    let mut by_tenant = BTreeMap::new();
    for (i, id, raw) in tenants {
        by_tenant.insert(id, merge(default, raw, &format!("tenants[{i}].limits"), invalid)?);
    }
    Ok(LimitsConfig { default, tenants: by_tenant })
}

/// `base` with the keys `raw` sets replaced, each checked; `at` is the table's key path.
fn merge(base: LimitSettings, raw: RawLimits, at: &str, invalid: &Invalid<'_>) -> Result<LimitSettings, ConfigError> {
    if let Some(n) = raw.max_concurrent_requests {
        if !(1..=1_000_000).contains(&n) {
            return Err(invalid(
                format!("{at}.max_concurrent_requests"),
                format!("must be between 1 and 1000000, got {n}"),
            ));
        }
    }
    let per_minute = |key: &str, value: Option<u64>, base: Option<u64>| match value {
        Some(n) if !(1..=MAX_PER_MINUTE).contains(&n) => {
            Err(invalid(format!("{at}.{key}"), format!("must be between 1 and {MAX_PER_MINUTE}, got {n}")))
        }
        Some(n) => Ok(Some(n)),
        None => Ok(base),
    };
    Ok(LimitSettings {
        max_concurrent_requests: raw.max_concurrent_requests.unwrap_or(base.max_concurrent_requests),
        requests_per_minute: per_minute("requests_per_minute", raw.requests_per_minute, base.requests_per_minute)?,
        tokens_per_minute: per_minute("tokens_per_minute", raw.tokens_per_minute, base.tokens_per_minute)?,
    })
}

/// Validates `[server]`.
pub(super) fn validate_server(raw: Option<RawServer>, invalid: &Invalid<'_>) -> Result<ServerConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let d = ServerConfig::default();
    let max_connections = raw.max_connections.unwrap_or(d.max_connections);
    if !(1..=1_000_000).contains(&max_connections) {
        return Err(invalid(
            "server.max_connections".into(),
            format!("must be between 1 and 1000000, got {max_connections}"),
        ));
    }
    let timeout = |key: &str, value: Option<u64>, default: u64| match value.unwrap_or(default) {
        ms if (1..=3_600_000).contains(&ms) => Ok(ms),
        ms => Err(invalid(format!("server.{key}"), format!("must be between 1 and 3600000, got {ms}"))),
    };
    let cors_allowed_origins = raw.cors_allowed_origins.unwrap_or_default();
    for (i, origin) in cors_allowed_origins.iter().enumerate() {
        if !is_origin(origin) {
            return Err(invalid(
                format!("server.cors_allowed_origins[{i}]"),
                format!("{origin:?} is not an origin: write scheme://host[:port] (http or https, no path), or \"*\" for any"),
            ));
        }
    }
    Ok(ServerConfig {
        cors_allowed_origins,
        max_connections,
        header_read_timeout_ms: timeout(
            "header_read_timeout_ms",
            raw.header_read_timeout_ms,
            d.header_read_timeout_ms,
        )?,
        body_read_timeout_ms: timeout("body_read_timeout_ms", raw.body_read_timeout_ms, d.body_read_timeout_ms)?,
    })
}

/// `*`, or `http(s)://host[:port]` as a browser sends it in `Origin`.
fn is_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some(rest) = origin.strip_prefix("https://").or_else(|| origin.strip_prefix("http://")) else { return false };
    let (host, port) = match rest.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || rest.starts_with('[') => (host, Some(port)),
        _ => (rest, None),
    };
    let host_ok = !host.is_empty() && host.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b));
    host_ok && port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// Validates a model's caps; `upstream` says which defaults apply and which keys are
/// allowed (`max_tokens_cap` and `max_stream_event_bytes` are upstream keys). Returns the
/// caps and the SSE event cap (upstream models only).
pub(super) fn model_caps(
    raw: RawModelCaps,
    upstream: bool,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
) -> Result<(ModelCaps, Option<usize>), ConfigError> {
    let max_n = raw.max_n.unwrap_or(ModelCaps::default().max_n);
    if !(1..=128).contains(&max_n) {
        return Err(invalid(at("max_n"), format!("must be between 1 and 128, got {max_n}")));
    }
    if !upstream {
        // An engine model's context length bounds its completions; its table has no caps
        // of the upstream kind (see `RawEngineModel`).
        return Ok((ModelCaps { max_n, max_tokens_cap: None }, None));
    }
    let max_tokens_cap = raw.max_tokens_cap.unwrap_or(DEFAULT_UPSTREAM_MAX_TOKENS_CAP);
    if max_tokens_cap == 0 {
        return Err(invalid(at("max_tokens_cap"), "must be at least 1".into()));
    }
    let event_bytes = raw.max_stream_event_bytes.unwrap_or(crate::backend::sse::DEFAULT_MAX_EVENT_BYTES);
    if !(1024..=1 << 30).contains(&event_bytes) {
        return Err(invalid(
            at("max_stream_event_bytes"),
            format!("must be between 1024 and 1073741824, got {event_bytes}"),
        ));
    }
    Ok((ModelCaps { max_n, max_tokens_cap: Some(max_tokens_cap) }, Some(event_bytes)))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, String> {
        Config::from_parts(text, "test.toml", &[], &|_| None).map_err(|e| e.to_string())
    }

    const TENANTS: &str =
        "[[tenants]]\nid = \"a\"\napi_keys = [\"key-one-1\"]\n[[tenants]]\nid = \"b\"\napi_keys = [\"key-two-2\"]\n";

    #[test]
    fn defaults_apply_without_tables() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg.limits.default.max_concurrent_requests, 64);
        assert_eq!((cfg.limits.default.requests_per_minute, cfg.limits.default.tokens_per_minute), (None, None));
        assert_eq!(
            (cfg.server.max_connections, cfg.server.header_read_timeout_ms, cfg.server.body_read_timeout_ms),
            (4096, 10_000, 30_000)
        );
        assert_eq!(cfg.models[0].caps.max_n, 8);
        assert_eq!(cfg.models[0].caps.max_tokens_cap, None, "engine models are bounded by their context");
    }

    #[test]
    fn a_tenant_table_overrides_the_global_one_key_by_key() {
        let text = format!("[limits]\nrequests_per_minute = 10\ntokens_per_minute = 1000\n{TENANTS}[tenants.limits]\nrequests_per_minute = 99\n");
        let cfg = parse(&text).unwrap();
        let b = cfg.limits.for_tenant("b");
        assert_eq!((b.requests_per_minute, b.tokens_per_minute, b.max_concurrent_requests), (Some(99), Some(1000), 64));
        assert_eq!(cfg.limits.for_tenant("a").requests_per_minute, Some(10));
        assert_eq!(cfg.limits.for_tenant("anonymous"), cfg.limits.default);
    }

    #[test]
    fn bad_values_name_their_key() {
        let err = parse("[limits]\nmax_concurrent_requests = 0\n").unwrap_err();
        assert!(err.contains("limits.max_concurrent_requests: must be between 1"), "{err}");
        let err = parse(&format!("{TENANTS}[tenants.limits]\ntokens_per_minute = 0\n")).unwrap_err();
        assert!(err.contains("tenants[1].limits.tokens_per_minute"), "{err}");
        let err = parse("[limits]\nrequests_per_mintue = 3\n").unwrap_err();
        assert!(err.contains("requests_per_mintue"), "{err}");
        let err = parse("[server]\nheader_read_timeout_ms = 0\n").unwrap_err();
        assert!(err.contains("server.header_read_timeout_ms"), "{err}");
        let err = parse("[server]\nmax_connections = 0\n").unwrap_err();
        assert!(err.contains("server.max_connections"), "{err}");
    }

    #[test]
    fn model_caps_load_and_engine_models_refuse_upstream_keys() {
        let up = "[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";
        let cfg = parse(up).unwrap();
        assert_eq!(cfg.models[0].caps.max_tokens_cap, Some(32_768));
        let crate::config::ModelBackend::Upstream(u) = &cfg.models[0].backend else { panic!("upstream expected") };
        assert_eq!(u.max_stream_event_bytes, 8 * 1024 * 1024);
        let cfg = parse(&format!("{up}max_n = 2\nmax_tokens_cap = 100\nmax_stream_event_bytes = 4096\n")).unwrap();
        assert_eq!((cfg.models[0].caps.max_n, cfg.models[0].caps.max_tokens_cap), (2, Some(100)));
        let err = parse("[[models]]\nid = \"e\"\nbackend = \"engine\"\nmax_tokens_cap = 10\n").unwrap_err();
        assert!(err.contains("models[0].max_tokens_cap: only allowed with backend = \"upstream\""), "{err}");
        let err = parse(&format!("{up}max_n = 129\n")).unwrap_err();
        assert!(err.contains("models[0].max_n"), "{err}");
    }
}

#[cfg(test)]
mod origin_tests {
    use super::is_origin;

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        for ok in
            ["*", "https://app.example.com", "http://localhost:3000", "http://127.0.0.1:8080", "http://[::1]:5173"]
        {
            assert!(is_origin(ok), "{ok}");
        }
        for bad in [
            "",
            "app.example.com",
            "https://app.example.com/",
            "https://a.com/path",
            "ftp://a.com",
            "https://a.com:",
            "https://a.com:99999x",
            "https://",
        ] {
            assert!(!is_origin(bad), "{bad}");
        }
    }
}
