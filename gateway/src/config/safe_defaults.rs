//! The settings that decide what a deployment exposes by default, validated in one place:
//! bearer tokens (`admin_token`, `metrics_token`), open mode (`allow_open`), the engine's
//! fault switches (only with [`ENABLE_FAULTS_ENV`]) and the admin login throttle
//! (`[admin_throttle]`).
//!
//! Invariant: each refusal names the key and says how to get what was asked for.

use std::net::SocketAddr;

use serde::Deserialize;

use super::{ConfigError, Invalid, Secret};

/// The reserved variable that lets `[models.fault]` tables load (tests and benchmarks).
pub const ENABLE_FAULTS_ENV: &str = "CROSSGUARD_ENABLE_FAULTS";
pub(super) const DEFAULT_ADMIN_TOKEN_ENV: &str = "CROSSGUARD_ADMIN_TOKEN";
pub(super) const DEFAULT_METRICS_TOKEN_ENV: &str = "CROSSGUARD_METRICS_TOKEN";
/// Shortest token accepted: shorter ones fall to guessing even when throttled.
const MIN_TOKEN_CHARS: usize = 16;

/// `[admin_throttle]` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAdminThrottle {
    client_failures: Option<u32>,
    global_failures: Option<u32>,
    window_secs: Option<u64>,
    cooldown_secs: Option<u64>,
}

/// Failed admin-token attempts allowed before every attempt (right token included) is
/// answered 429 for `cooldown_secs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminThrottleConfig {
    /// Per client address (IPv6: per /64) within `window_secs`.
    pub client_failures: u32,
    /// From all clients together within `window_secs`.
    pub global_failures: u32,
    pub window_secs: u64,
    pub cooldown_secs: u64,
}

impl Default for AdminThrottleConfig {
    fn default() -> Self {
        AdminThrottleConfig { client_failures: 5, global_failures: 50, window_secs: 300, cooldown_secs: 300 }
    }
}

pub(super) fn admin_throttle(
    raw: Option<RawAdminThrottle>,
    invalid: &Invalid<'_>,
) -> Result<AdminThrottleConfig, ConfigError> {
    let raw = raw.unwrap_or_default();
    let defaults = AdminThrottleConfig::default();
    let config = AdminThrottleConfig {
        client_failures: raw.client_failures.unwrap_or(defaults.client_failures),
        global_failures: raw.global_failures.unwrap_or(defaults.global_failures),
        window_secs: raw.window_secs.unwrap_or(defaults.window_secs),
        cooldown_secs: raw.cooldown_secs.unwrap_or(defaults.cooldown_secs),
    };
    for (key, value, max) in [
        ("client_failures", u64::from(config.client_failures), 10_000),
        ("global_failures", u64::from(config.global_failures), 1_000_000),
        ("window_secs", config.window_secs, 86_400),
        ("cooldown_secs", config.cooldown_secs, 86_400),
    ] {
        if !(1..=max).contains(&value) {
            return Err(invalid(format!("admin_throttle.{key}"), format!("must be between 1 and {max}, got {value}")));
        }
    }
    if config.global_failures < config.client_failures {
        return Err(invalid(
            "admin_throttle.global_failures".into(),
            format!(
                "must be at least admin_throttle.client_failures ({}), got {}",
                config.client_failures, config.global_failures
            ),
        ));
    }
    Ok(config)
}

/// A bearer token set literally (`<key>`, discouraged: it sits in the file) or through a
/// variable (`<key>_env`, default `default_env`); `None` when neither is set.
pub(super) fn token(
    key: &str,
    literal: Option<&str>,
    env_name: Option<&str>,
    default_env: &str,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Secret>, ConfigError> {
    let token = match (literal, env_name) {
        (Some(_), Some(_)) => return Err(invalid(key.to_owned(), format!("set {key} or {key}_env, not both"))),
        (Some(token), None) => Some(Secret(token.to_owned())),
        (None, env_name) => lookup(env_name.unwrap_or(default_env)).filter(|t| !t.is_empty()).map(Secret),
    };
    match token {
        Some(t) if t.expose().chars().count() < MIN_TOKEN_CHARS => {
            Err(invalid(key.to_owned(), format!("must be at least {MIN_TOKEN_CHARS} characters long")))
        }
        other => Ok(other),
    }
}

/// Open mode (no `[[tenants]]`) serves anyone without a key: only on a loopback address,
/// unless `allow_open = true` says the exposure is meant.
pub(super) fn check_open_mode(
    listen: SocketAddr,
    no_tenants: bool,
    allow_open: bool,
    invalid: &Invalid<'_>,
) -> Result<(), ConfigError> {
    if no_tenants && !allow_open && !listen.ip().is_loopback() {
        return Err(invalid(
            "allow_open".into(),
            format!(
                "no [[tenants]] are configured and listen = \"{listen}\" is not a loopback address: anyone who reaches it \
                 would be served without an API key. Configure [[tenants]], listen on 127.0.0.1, or set allow_open = true \
                 to serve everyone on purpose"
            ),
        ));
    }
    Ok(())
}

/// `[models.fault]` switches KV isolation defences off: refused unless the process runs
/// with `CROSSGUARD_ENABLE_FAULTS=1`, so that no production config can carry one.
pub(super) fn check_faults_enabled(
    key: String,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    if lookup(ENABLE_FAULTS_ENV).as_deref() == Some("1") {
        return Ok(());
    }
    Err(invalid(
        key,
        format!(
            "fault switches turn KV isolation defences off and are for tests and benchmarks only; \
             run the process with {ENABLE_FAULTS_ENV}=1 to allow them, or remove the table"
        ),
    ))
}
