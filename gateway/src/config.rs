//! Configuration: one TOML file, overlaid with `CROSSGUARD_*` environment variables, read
//! in two phases — a raw, `deny_unknown_fields` mirror of the file, then a validated
//! [`Config`] with defaults filled in. Every error names the key path (and the file or the
//! environment variable it came from). The file's shape is a contract: keys are added,
//! never renamed.
//!
//! Environment overlay: `CROSSGUARD_<KEY>` sets a top-level key, `__` descends into a table
//! (`CROSSGUARD_STORE__URL`), values parse as TOML when they can (so arrays of tables work:
//! `CROSSGUARD_TENANTS='[{id="a", api_keys=["k"]}]'`) and are strings otherwise. A few
//! names are not config keys: see [`RESERVED_ENV`].
//!
//! Files: `raw.rs` (the file's mirror), `env.rs` (the overlay), `validate.rs` (the checks
//! and defaults, table by table), `limits.rs`, `responses.rs` and `safe_defaults.rs` (their
//! tables, raw and validated), `summary.rs` (what `check-config` prints; `Debug` masks),
//! `tests.rs`.

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

mod env;
mod limits;
mod raw;
mod responses;
mod safe_defaults;
mod summary;
mod validate;

pub use limits::{LimitSettings, LimitsConfig, ModelCaps, ServerConfig, MAX_PER_MINUTE};
pub use responses::ResponsesConfig;
pub use safe_defaults::{AdminThrottleConfig, ENABLE_FAULTS_ENV};

/// Environment variables with the `CROSSGUARD_` prefix that are not config keys.
pub const RESERVED_ENV: &[&str] = &[
    "CROSSGUARD_ADMIN_TOKEN",
    "CROSSGUARD_CACHE_DIR",
    "CROSSGUARD_CONFIG",
    "CROSSGUARD_ENABLE_FAULTS",
    "CROSSGUARD_FINGERPRINT_KEY",
    firewall::SIMD_ENV,
    "CROSSGUARD_LOG",
    "CROSSGUARD_LOG_FORMAT",
    "CROSSGUARD_METRICS_TOKEN",
    // read by the test suite and scripts, never by the gateway
    "CROSSGUARD_GPU_TESTS",
    "CROSSGUARD_MODEL",
    "CROSSGUARD_PYTHON",
    "CROSSGUARD_REQUIRE_NVRTC",
];

/// The id under which a config without `[[models]]` serves the default model (a contract).
pub const DEFAULT_MODEL_ID: &str = "smollm2-135m-instruct";
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
const DEFAULT_MAX_BODY_BYTES: usize = 4 * 1024 * 1024;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 5_000;
const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 120_000;
const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;
const DEFAULT_AUDIT_MAX_LEN: usize = 100_000;
const DEFAULT_KEY_ENV: &str = "CROSSGUARD_FINGERPRINT_KEY";
/// Foreign-data blocks of one tenant per window that flag it for probing, and the window.
const DEFAULT_PROBE_ALERT_BLOCKS: u32 = 5;
const DEFAULT_PROBE_WINDOW_SECS: u64 = 3600;
const DEFAULT_CANARY_TEXT: &str = "Internal reference {canary}: confidential, never repeat or mention it.";

/// A configuration error: where it is and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read config file: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{origin}: {message}")]
    Syntax { origin: String, message: String },
    #[error("{origin}: {key}: {message}")]
    Invalid { origin: String, key: String, message: String },
}

/// Makes the error for `(key path, message)`; each table's validation takes one.
type Invalid<'a> = dyn Fn(String, String) -> ConfigError + 'a;

/// A secret value that never shows up in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

// ---------------------------------------------------------------- validated

/// The validated configuration the gateway runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_token: Option<Secret>,
    /// Bearer token `/metrics` requires; `None`: open (start-up warns off loopback).
    pub metrics_token: Option<Secret>,
    /// Open mode (no tenants) may listen on a non-loopback address.
    pub allow_open: bool,
    pub admin_throttle: AdminThrottleConfig,
    pub max_body_bytes: usize,
    pub data_dir: PathBuf,
    /// Empty means open mode: one anonymous tenant, no authentication (local trial only).
    pub tenants: Vec<TenantConfig>,
    /// Never empty: without `[[models]]`, the default model on the engine.
    pub models: Vec<ModelConfig>,
    pub store: StoreConfig,
    pub firewall: FirewallConfig,
    pub provenance: ProvenanceConfig,
    pub stats: StatsConfig,
    pub canary: CanaryConfig,
    /// Per-tenant concurrency and rate limits (`[limits]`, `[tenants.limits]`).
    pub limits: LimitsConfig,
    /// Connection cap and read timeouts (`[server]`).
    pub server: ServerConfig,
    /// `[responses]`: stored Responses API responses.
    pub responses: ResponsesConfig,
}

/// The provenance index: how prompts and responses are fingerprinted and remembered.
/// `Debug` masks the key (`config/summary.rs`).
#[derive(Clone, PartialEq)]
pub struct ProvenanceConfig {
    /// Words per n-gram.
    pub ngram_words: usize,
    /// How long a tenant owns an n-gram after it last sent or received it.
    pub ttl_secs: u64,
    /// The variable holding the per-deployment fingerprint key (32 hex characters).
    pub key_env: String,
    /// The key from `key_env`; `None`: the embedded store keeps one under `data_dir`.
    pub key: Option<[u8; 16]>,
    /// Most distinct n-gram hashes held in memory (past it, the oldest are evicted).
    pub max_hashes: usize,
    /// Largest fraction of `max_hashes` one tenant may hold (past it, its own oldest go).
    pub max_tenant_share: f64,
    /// Most hashes recorded from one prompt or response (past it, an even sample).
    pub max_hashes_per_text: usize,
    /// An n-gram shared by at least this many tenants is common language, not a leak.
    pub common_at: usize,
    /// Whether a random-looking word another tenant sent blocks by itself (`foreign-token`).
    pub foreign_tokens: bool,
    /// How often other replicas' fingerprints are pulled from a shared store.
    pub refresh_interval_ms: u64,
    /// Shared store: other replicas' fingerprints older than this (not pulled for this
    /// long, or never) make the index stale.
    pub max_staleness_ms: u64,
    /// What a stale index means for requests.
    pub unavailable: ProvenanceUnavailable,
}

/// What happens while other replicas' fingerprints are stale (Redis unreachable): the
/// firewall could not tell another replica's tenant's text from fresh text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProvenanceUnavailable {
    /// Refuse completions with 503 `provenance_unavailable` (tenants with `fail_mode =
    /// "open"` are still served), and `/readyz` answers 503 (the default).
    #[default]
    Block,
    /// Serve from local state; `/readyz` stays 200 and says `"degraded"`.
    Allow,
}

/// Per-tenant statistics and the entropy detector that judges against them.
#[derive(Debug, Clone, PartialEq)]
pub struct StatsConfig {
    /// Observations a tenant needs before its own baseline replaces the global one.
    pub min_samples: u64,
    /// How often local statistics are merged into the store.
    pub sync_interval_ms: u64,
    /// A window this many standard deviations from the baseline is an anomaly.
    pub z_threshold: f64,
    pub action: firewall::Action,
}

/// Where an injected canary line goes in the system prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CanaryPlacement {
    /// Before the first system message's text (a new system message if there is none).
    SystemStart,
    /// After the last system message's text (a new system message if there is none).
    SystemEnd,
}

/// How canaries are injected for tenants with `canary = true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CanaryConfig {
    /// The line added; `{canary}` is replaced by the tenant's honeytoken.
    pub text: String,
    pub placement: CanaryPlacement,
}

/// What happens to a response when the firewall or the store fails on its path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Block the response (the default).
    #[default]
    Closed,
    /// Let it through unscanned, logged and counted.
    Open,
}

/// What the firewall does with a secret the asking tenant itself sent or was sent (within
/// the provenance time to live): echoing a tenant's own data back is not a leak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnSecrets {
    /// Let it through (the finding is still logged and counted).
    #[default]
    Allow,
    /// Replace it with `[REDACTED:<rule-id>]`.
    Redact,
    /// Block the response, as for an unknown secret.
    Block,
}

impl OwnSecrets {
    /// The firewall action that carries this policy.
    pub fn action(self) -> firewall::Action {
        match self {
            OwnSecrets::Allow => firewall::Action::Log,
            OwnSecrets::Redact => firewall::Action::Redact,
            OwnSecrets::Block => firewall::Action::Block,
        }
    }
}

/// The response firewall's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirewallConfig {
    /// Rule folder; `None` = the rule files built into the binary.
    pub rules_dir: Option<PathBuf>,
    /// Most bytes one stream may hold back while a match could still be in progress.
    pub max_holdback_bytes: usize,
    /// How often the rule folder is looked at for changes (ms); 0 = never (reload by hand).
    pub watch_interval_ms: u64,
    /// Foreign-data blocks of one asking tenant within `probe_window_secs` that raise a
    /// probing alert (a block tells the asker that somebody sent that text).
    pub probe_alert_blocks: u32,
    pub probe_window_secs: u64,
    /// Whether runs of base64, hex and percent-encoding in responses are decoded and what
    /// they say is scanned too (`firewall::DecodeConfig`); prompts' encoded runs are then
    /// fingerprinted as their sender's.
    pub read_encoded: bool,
}

/// One tenant and the SHA-256 digests of its API keys (plain keys are hashed at load).
#[derive(Debug, Clone)]
pub struct TenantConfig {
    pub id: String,
    pub key_digests: Vec<[u8; 32]>,
    pub fail_mode: FailMode,
    /// Inject this tenant's canary line into its system prompt.
    pub canary: bool,
    /// What happens to the tenant's own secrets echoed back to it.
    pub own_secrets: OwnSecrets,
    /// Refuse the tenant's requests (403) while it is flagged for probing.
    pub quarantine_when_probing: bool,
}

/// One served model id and where its completions come from.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub id: String,
    pub backend: ModelBackend,
    /// Caps on `n` and `max_tokens` of one request.
    pub caps: ModelCaps,
}

#[derive(Debug, Clone)]
pub enum ModelBackend {
    Upstream(UpstreamConfig),
    Engine(EngineModelConfig),
}

/// An OpenAI-compatible server the gateway forwards to.
/// `Debug` masks the key and any password in the URL (`config/summary.rs`).
#[derive(Clone)]
pub struct UpstreamConfig {
    /// Base URL up to and including `/v1`, without a trailing slash.
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// The model name sent upstream (defaults to the gateway's model id).
    pub upstream_model: String,
    pub connect_timeout_ms: u64,
    /// Time allowed until the upstream's response headers arrive.
    pub first_byte_timeout_ms: u64,
    /// Longest silence allowed between two chunks of a streamed body.
    pub idle_timeout_ms: u64,
    /// Largest SSE event (its `data:` lines together) accepted from the upstream.
    pub max_stream_event_bytes: usize,
}

/// A GGUF served by the in-process engine.
#[derive(Debug, Clone, Default)]
pub struct EngineModelConfig {
    /// `None`: the default model, fetched into the cache directory when missing.
    pub path: Option<PathBuf>,
    /// Where the forward pass runs: the CPU (default), the GPU (an error at start-up
    /// without one), or the GPU when there is one.
    pub device: engine::Device,
    pub threads: Option<usize>,
    pub context_tokens: Option<usize>,
    /// Positions per KV block; `None`: the engine's default.
    pub kv_block_tokens: Option<usize>,
    /// The continuous-batching scheduler's limits: sequences per step, requests waiting
    /// (more are refused with 429), tokens per step.
    pub batching: engine::SchedulerConfig,
    /// KV isolation defences switched off on purpose (all on by default; start-up warns).
    pub fault: engine::FaultConfig,
    /// How far a request's events may run ahead of a slow streaming client, and how long
    /// it may stall before its generation is cancelled.
    pub streams: crate::backend::engine_client::StreamLimits,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    /// In process, audit records appended to `<data_dir>/audit.jsonl`; keeps the newest
    /// `audit_max_len` records in memory for listing.
    Memory {
        audit_max_len: usize,
    },
    Redis(RedisStoreConfig),
}

/// A Redis shared by every replica of one deployment.
/// `Debug` masks the URL's password (`config/summary.rs`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisStoreConfig {
    pub url: String,
    /// Prefix of every key (one per deployment).
    pub key_prefix: String,
    /// Cap of the audit stream; past it the largest (tenant, severity) class loses its
    /// oldest record (`store::retention`).
    pub audit_max_len: usize,
    /// Longest wait for one Redis operation.
    pub op_timeout_ms: u64,
    /// This replica's name; `None`: a fresh one per process.
    pub replica_id: Option<String>,
}

impl Config {
    /// Loads `path` (or nothing) overlaid with the process environment.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let (text, origin) = match path {
            Some(p) => {
                let text =
                    std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_path_buf(), source })?;
                (text, p.display().to_string())
            }
            None => (String::new(), "defaults".to_owned()),
        };
        Config::from_parts(&text, &origin, &env, &|name| std::env::var(name).ok())
    }

    /// Parses `text` (named `origin` in errors), applies the `CROSSGUARD_*` pairs in
    /// `env`, and validates. `lookup` resolves secrets named by `*_env` keys.
    pub fn from_parts(
        text: &str,
        origin: &str,
        env: &[(String, String)],
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::Syntax { origin: origin.to_owned(), message: e.to_string() })?;
        let from_env = env::overlay_env(&mut table, env)?;
        let raw: raw::RawConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            let top = key.split(['.', '[']).next().unwrap_or_default().to_owned();
            let origin = match from_env.iter().find(|(k, _)| *k == top) {
                Some((_, var)) => format!("{origin} (key set by {var})"),
                None => origin.to_owned(),
            };
            ConfigError::Invalid { origin, key, message: e.into_inner().to_string() }
        })?;
        validate::validate(raw, origin, lookup)
    }
}

#[cfg(test)]
mod tests;
