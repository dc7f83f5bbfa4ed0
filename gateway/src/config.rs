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

use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sha2::{Digest, Sha256};

mod limits;
mod responses;
mod safe_defaults;
mod summary;

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

// ---------------------------------------------------------------- raw (the file's mirror)

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<String>,
    admin_token_env: Option<String>,
    admin_token: Option<String>,
    metrics_token_env: Option<String>,
    metrics_token: Option<String>,
    allow_open: Option<bool>,
    admin_throttle: Option<safe_defaults::RawAdminThrottle>,
    max_body_bytes: Option<usize>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    tenants: Vec<RawTenant>,
    #[serde(default)]
    models: Vec<RawModel>,
    store: Option<RawStore>,
    firewall: Option<RawFirewall>,
    provenance: Option<RawProvenance>,
    stats: Option<RawStats>,
    canary: Option<RawCanary>,
    limits: Option<limits::RawLimits>,
    server: Option<limits::RawServer>,
    responses: Option<responses::RawResponses>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvenance {
    ngram_words: Option<usize>,
    ttl_secs: Option<u64>,
    key_env: Option<String>,
    max_hashes: Option<usize>,
    max_tenant_share: Option<f64>,
    max_hashes_per_text: Option<usize>,
    common_at: Option<usize>,
    refresh_interval_ms: Option<u64>,
    max_staleness_ms: Option<u64>,
    provenance_unavailable: Option<ProvenanceUnavailable>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStats {
    min_samples: Option<u64>,
    sync_interval_ms: Option<u64>,
    z_threshold: Option<f64>,
    action: Option<RawAction>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCanary {
    text: Option<String>,
    placement: Option<CanaryPlacement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawAction {
    Log,
    Redact,
    Block,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFirewall {
    rules_dir: Option<PathBuf>,
    max_holdback_bytes: Option<usize>,
    watch_interval_ms: Option<u64>,
    probe_alert_blocks: Option<u32>,
    probe_window_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    id: String,
    #[serde(default)]
    api_keys: Vec<String>,
    #[serde(default)]
    api_key_sha256: Vec<String>,
    fail_mode: Option<FailMode>,
    canary: Option<bool>,
    own_secrets: Option<OwnSecrets>,
    quarantine_when_probing: Option<bool>,
    limits: Option<limits::RawLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    backend: BackendKind,
    // upstream
    base_url: Option<String>,
    api_key_env: Option<String>,
    upstream_model: Option<String>,
    connect_timeout_ms: Option<u64>,
    first_byte_timeout_ms: Option<u64>,
    idle_timeout_ms: Option<u64>,
    // engine
    path: Option<PathBuf>,
    device: Option<String>,
    threads: Option<usize>,
    context_tokens: Option<usize>,
    kv_block_tokens: Option<usize>,
    max_batch: Option<usize>,
    max_queued: Option<usize>,
    step_tokens: Option<usize>,
    itl_target_ms: Option<u64>,
    fault: Option<RawFault>,
    // both
    max_n: Option<u32>,
    max_tokens_cap: Option<u32>,
    max_stream_event_bytes: Option<usize>,
    stream_buffer_events: Option<usize>,
    stream_stall_ms: Option<u64>,
}

/// `[models.fault]`: switches that disable one KV isolation defence each (tests only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFault {
    stale_kv: Option<f64>,
    skip_zero_fill: Option<bool>,
    skip_owner_check: Option<bool>,
    skip_bounds_check: Option<bool>,
    unsalted_prefix_cache: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum BackendKind {
    Upstream,
    Engine,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: StoreKind,
    url: Option<String>,
    key_prefix: Option<String>,
    audit_max_len: Option<usize>,
    op_timeout_ms: Option<u64>,
    replica_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum StoreKind {
    Memory,
    Redis,
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
    pub device: engine::backend::Device,
    pub threads: Option<usize>,
    pub context_tokens: Option<usize>,
    /// Positions per KV block; `None`: the engine's default.
    pub kv_block_tokens: Option<usize>,
    /// The continuous-batching scheduler's limits: sequences per step, requests waiting
    /// (more are refused with 429), tokens per step.
    pub batching: engine::sched::SchedulerConfig,
    /// KV isolation defences switched off on purpose (all on by default; start-up warns).
    pub fault: engine::fault::FaultConfig,
    /// How far a request's events may run ahead of a slow streaming client, and how long
    /// it may stall before its generation is cancelled.
    pub streams: crate::backend::engine_loop::StreamLimits,
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
        let from_env = overlay_env(&mut table, env)?;
        let raw: RawConfig = serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
            let key = e.path().to_string();
            let top = key.split(['.', '[']).next().unwrap_or_default().to_owned();
            let origin = match from_env.iter().find(|(k, _)| *k == top) {
                Some((_, var)) => format!("{origin} (key set by {var})"),
                None => origin.to_owned(),
            };
            ConfigError::Invalid { origin, key, message: e.into_inner().to_string() }
        })?;
        validate(raw, origin, lookup)
    }
}

/// Applies `CROSSGUARD_*` variables onto `table`; returns (top-level key, variable) pairs.
fn overlay_env(table: &mut toml::Table, env: &[(String, String)]) -> Result<Vec<(String, String)>, ConfigError> {
    let mut applied = Vec::new();
    for (name, value) in env {
        let Some(rest) = name.strip_prefix("CROSSGUARD_") else { continue };
        if RESERVED_ENV.contains(&name.as_str()) || rest.is_empty() {
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let parsed = format!("v = {value}")
            .parse::<toml::Table>()
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(value.clone()));
        let mut cursor = &mut *table;
        for (i, key) in path.iter().enumerate() {
            if i + 1 == path.len() {
                cursor.insert(key.clone(), parsed.clone());
                break;
            }
            let entry = cursor.entry(key.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            cursor = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(ConfigError::Invalid {
                        origin: name.clone(),
                        key: path[..=i].join("."),
                        message: "is not a table, cannot set a key inside it".into(),
                    })
                }
            };
        }
        applied.push((path[0].clone(), name.clone()));
    }
    Ok(applied)
}

fn validate(raw: RawConfig, origin: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
    let invalid = |key: String, message: String| ConfigError::Invalid { origin: origin.to_owned(), key, message };
    let listen_text = raw.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
    let listen: SocketAddr = listen_text.parse().map_err(|_| {
        invalid("listen".into(), format!("expected an address like \"127.0.0.1:8080\", got {listen_text:?}"))
    })?;

    let admin_token = safe_defaults::token(
        "admin_token",
        raw.admin_token.as_deref(),
        raw.admin_token_env.as_deref(),
        safe_defaults::DEFAULT_ADMIN_TOKEN_ENV,
        &invalid,
        lookup,
    )?;
    let metrics_token = safe_defaults::token(
        "metrics_token",
        raw.metrics_token.as_deref(),
        raw.metrics_token_env.as_deref(),
        safe_defaults::DEFAULT_METRICS_TOKEN_ENV,
        &invalid,
        lookup,
    )?;
    let allow_open = raw.allow_open.unwrap_or(false);
    let admin_throttle = safe_defaults::admin_throttle(raw.admin_throttle, &invalid)?;

    let max_body_bytes = raw.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes < 1024 {
        return Err(invalid("max_body_bytes".into(), format!("must be at least 1024, got {max_body_bytes}")));
    }

    let mut raw_tenants = raw.tenants;
    let tenant_limits: Vec<_> =
        raw_tenants.iter_mut().enumerate().filter_map(|(i, t)| Some((i, t.id.clone(), t.limits.take()?))).collect();
    let tenants = validate_tenants(raw_tenants, &invalid)?;
    safe_defaults::check_open_mode(listen, tenants.is_empty(), allow_open, &invalid)?;
    let limits = limits::validate_limits(raw.limits, tenant_limits, &invalid)?;
    let server = limits::validate_server(raw.server, &invalid)?;
    let responses = responses::validate_responses(raw.responses, &invalid)?;
    let mut models = validate_models(raw.models, &invalid, lookup)?;
    if models.is_empty() {
        models.push(ModelConfig {
            id: DEFAULT_MODEL_ID.to_owned(),
            backend: ModelBackend::Engine(EngineModelConfig::default()),
            caps: ModelCaps::default(),
        });
    }
    let store = validate_store(raw.store, &invalid)?;
    let provenance = validate_provenance(raw.provenance.unwrap_or_default(), &store, &invalid, lookup)?;
    let stats = validate_stats(raw.stats.unwrap_or_default(), &invalid)?;
    let raw_canary = raw.canary.unwrap_or_default();
    let canary = CanaryConfig {
        text: raw_canary.text.unwrap_or_else(|| DEFAULT_CANARY_TEXT.to_owned()),
        placement: raw_canary.placement.unwrap_or(CanaryPlacement::SystemEnd),
    };
    if !canary.text.contains("{canary}") {
        return Err(invalid("canary.text".into(), "must contain the placeholder {canary}".into()));
    }
    let data_dir = raw.data_dir.unwrap_or_else(default_data_dir);
    let raw_fw = raw.firewall.unwrap_or_default();
    let max_holdback_bytes = raw_fw.max_holdback_bytes.unwrap_or(4096);
    if !(64..=1 << 20).contains(&max_holdback_bytes) {
        return Err(invalid(
            "firewall.max_holdback_bytes".into(),
            format!("must be between 64 and 1048576, got {max_holdback_bytes}"),
        ));
    }
    let watch_interval_ms = raw_fw.watch_interval_ms.unwrap_or(1000);
    if watch_interval_ms != 0 && !(100..=3_600_000).contains(&watch_interval_ms) {
        return Err(invalid(
            "firewall.watch_interval_ms".into(),
            format!("must be 0 (off) or between 100 and 3600000, got {watch_interval_ms}"),
        ));
    }
    let probe_alert_blocks = raw_fw.probe_alert_blocks.unwrap_or(DEFAULT_PROBE_ALERT_BLOCKS);
    if probe_alert_blocks == 0 {
        return Err(invalid("firewall.probe_alert_blocks".into(), "must be at least 1".into()));
    }
    let probe_window_secs = raw_fw.probe_window_secs.unwrap_or(DEFAULT_PROBE_WINDOW_SECS);
    if !(1..=7 * 86_400).contains(&probe_window_secs) {
        return Err(invalid(
            "firewall.probe_window_secs".into(),
            format!("must be between 1 and 604800, got {probe_window_secs}"),
        ));
    }
    let firewall = FirewallConfig {
        rules_dir: raw_fw.rules_dir,
        max_holdback_bytes,
        watch_interval_ms,
        probe_alert_blocks,
        probe_window_secs,
    };
    Ok(Config {
        listen,
        admin_token,
        metrics_token,
        allow_open,
        admin_throttle,
        max_body_bytes,
        data_dir,
        tenants,
        models,
        store,
        firewall,
        provenance,
        stats,
        canary,
        limits,
        server,
        responses,
    })
}

fn validate_store(raw: Option<RawStore>, invalid: &Invalid<'_>) -> Result<StoreConfig, ConfigError> {
    let Some(raw) = raw else { return Ok(StoreConfig::Memory { audit_max_len: DEFAULT_AUDIT_MAX_LEN }) };
    let audit_max_len = raw.audit_max_len.unwrap_or(DEFAULT_AUDIT_MAX_LEN);
    if audit_max_len == 0 {
        return Err(invalid("store.audit_max_len".into(), "must be at least 1".into()));
    }
    match raw.kind {
        StoreKind::Memory => {
            for (key, set) in [
                ("url", raw.url.is_some()),
                ("key_prefix", raw.key_prefix.is_some()),
                ("op_timeout_ms", raw.op_timeout_ms.is_some()),
                ("replica_id", raw.replica_id.is_some()),
            ] {
                if set {
                    return Err(invalid(format!("store.{key}"), "only allowed with kind = \"redis\"".into()));
                }
            }
            Ok(StoreConfig::Memory { audit_max_len })
        }
        StoreKind::Redis => {
            let url = raw.url.unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
            if !(url.starts_with("redis://") || url.starts_with("rediss://")) {
                return Err(invalid("store.url".into(), format!("must start with redis:// or rediss://, got {url:?}")));
            }
            let key_prefix = raw.key_prefix.unwrap_or_else(|| "crossguard:".to_owned());
            if key_prefix.is_empty()
                || key_prefix.len() > 64
                || key_prefix.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(invalid("store.key_prefix".into(), "must be 1-64 characters without whitespace".into()));
            }
            let op_timeout_ms = raw.op_timeout_ms.unwrap_or(1_000);
            if op_timeout_ms == 0 {
                return Err(invalid("store.op_timeout_ms".into(), "must be greater than 0".into()));
            }
            if let Some(id) = &raw.replica_id {
                check_id(id, "store.replica_id", invalid)?;
            }
            Ok(StoreConfig::Redis(RedisStoreConfig {
                url,
                key_prefix,
                audit_max_len,
                op_timeout_ms,
                replica_id: raw.replica_id,
            }))
        }
    }
}

fn validate_provenance(
    raw: RawProvenance,
    store: &StoreConfig,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ProvenanceConfig, ConfigError> {
    let ngram_words = raw.ngram_words.unwrap_or(firewall::detect::ngram::DEFAULT_N);
    if !(3..=64).contains(&ngram_words) {
        return Err(invalid("provenance.ngram_words".into(), format!("must be between 3 and 64, got {ngram_words}")));
    }
    let ttl_secs = raw.ttl_secs.unwrap_or(86_400);
    if ttl_secs < 60 {
        return Err(invalid("provenance.ttl_secs".into(), format!("must be at least 60, got {ttl_secs}")));
    }
    let max_hashes = raw.max_hashes.unwrap_or(20_000_000);
    if max_hashes < 1_000 {
        return Err(invalid("provenance.max_hashes".into(), format!("must be at least 1000, got {max_hashes}")));
    }
    let max_tenant_share = raw.max_tenant_share.unwrap_or(0.5);
    if !(max_tenant_share > 0.0 && max_tenant_share <= 1.0) {
        return Err(invalid(
            "provenance.max_tenant_share".into(),
            format!("must be a fraction in (0, 1], got {max_tenant_share}"),
        ));
    }
    let max_hashes_per_text = raw.max_hashes_per_text.unwrap_or(100_000.min(max_hashes));
    if !(100..=max_hashes).contains(&max_hashes_per_text) {
        return Err(invalid(
            "provenance.max_hashes_per_text".into(),
            format!("must be between 100 and provenance.max_hashes ({max_hashes}), got {max_hashes_per_text}"),
        ));
    }
    let common_at = raw.common_at.unwrap_or(3);
    if common_at < 2 {
        return Err(invalid("provenance.common_at".into(), format!("must be at least 2, got {common_at}")));
    }
    let refresh_interval_ms = raw.refresh_interval_ms.unwrap_or(250);
    if refresh_interval_ms == 0 {
        return Err(invalid("provenance.refresh_interval_ms".into(), "must be greater than 0".into()));
    }
    let max_staleness_ms = raw.max_staleness_ms.unwrap_or(30_000);
    if max_staleness_ms <= refresh_interval_ms {
        return Err(invalid(
            "provenance.max_staleness_ms".into(),
            format!(
                "must be greater than provenance.refresh_interval_ms ({refresh_interval_ms}), got {max_staleness_ms}"
            ),
        ));
    }
    let unavailable = raw.provenance_unavailable.unwrap_or_default();
    let key_env = raw.key_env.unwrap_or_else(|| DEFAULT_KEY_ENV.to_owned());
    let key = match lookup(&key_env).filter(|v| !v.is_empty()) {
        Some(text) => Some(
            hex::decode(text.trim())
                .ok()
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .ok_or_else(|| invalid("provenance.key_env".into(), format!("{key_env} must hold 32 hexadecimal characters (a 128-bit key)")))?,
        ),
        None if matches!(store, StoreConfig::Redis(_)) => {
            return Err(invalid(
                "provenance.key_env".into(),
                format!("{key_env} must be set with store.kind = \"redis\": every replica needs the same fingerprint key (32 hexadecimal characters)"),
            ))
        }
        None => None,
    };
    Ok(ProvenanceConfig {
        ngram_words,
        ttl_secs,
        key_env,
        key,
        max_hashes,
        max_tenant_share,
        max_hashes_per_text,
        common_at,
        refresh_interval_ms,
        max_staleness_ms,
        unavailable,
    })
}

fn validate_stats(raw: RawStats, invalid: &Invalid<'_>) -> Result<StatsConfig, ConfigError> {
    let min_samples = raw.min_samples.unwrap_or(200);
    let sync_interval_ms = raw.sync_interval_ms.unwrap_or(5_000);
    if sync_interval_ms == 0 {
        return Err(invalid("stats.sync_interval_ms".into(), "must be greater than 0".into()));
    }
    let z_threshold = raw.z_threshold.unwrap_or(4.0);
    if !(z_threshold.is_finite() && z_threshold >= 1.0) {
        return Err(invalid("stats.z_threshold".into(), format!("must be a number of at least 1, got {z_threshold}")));
    }
    let action = match raw.action.unwrap_or(RawAction::Log) {
        RawAction::Log => firewall::Action::Log,
        RawAction::Redact => firewall::Action::Redact,
        RawAction::Block => firewall::Action::Block,
    };
    Ok(StatsConfig { min_samples, sync_interval_ms, z_threshold, action })
}

type Invalid<'a> = dyn Fn(String, String) -> ConfigError + 'a;

fn validate_tenants(raw: Vec<RawTenant>, invalid: &Invalid<'_>) -> Result<Vec<TenantConfig>, ConfigError> {
    let mut ids = HashSet::new();
    let mut digests_seen = HashSet::new();
    let mut tenants = Vec::with_capacity(raw.len());
    for (i, t) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("tenants[{i}].{k}");
        check_id(&t.id, &at("id"), invalid)?;
        if !ids.insert(t.id.clone()) {
            return Err(invalid(at("id"), format!("duplicate tenant id {:?}", t.id)));
        }
        if t.api_keys.is_empty() && t.api_key_sha256.is_empty() {
            return Err(invalid(at("api_keys"), "a tenant needs api_keys or api_key_sha256".into()));
        }
        let mut key_digests = Vec::new();
        for (j, key) in t.api_keys.iter().enumerate() {
            if key.len() < 8 || key.chars().any(char::is_whitespace) {
                return Err(invalid(
                    format!("tenants[{i}].api_keys[{j}]"),
                    "must be at least 8 characters, without whitespace".into(),
                ));
            }
            key_digests.push(Sha256::digest(key.as_bytes()).into());
        }
        for (j, hex_digest) in t.api_key_sha256.iter().enumerate() {
            let digest = parse_sha256(hex_digest).ok_or_else(|| {
                invalid(format!("tenants[{i}].api_key_sha256[{j}]"), "must be 64 hexadecimal characters".into())
            })?;
            key_digests.push(digest);
        }
        for d in &key_digests {
            if !digests_seen.insert(*d) {
                return Err(invalid(at("api_keys"), "an API key is used by more than one tenant or twice".into()));
            }
        }
        tenants.push(TenantConfig {
            id: t.id,
            key_digests,
            fail_mode: t.fail_mode.unwrap_or_default(),
            canary: t.canary.unwrap_or(false),
            own_secrets: t.own_secrets.unwrap_or_default(),
            quarantine_when_probing: t.quarantine_when_probing.unwrap_or(false),
        });
    }
    Ok(tenants)
}

fn validate_models(
    raw: Vec<RawModel>,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ModelConfig>, ConfigError> {
    let mut ids = HashSet::new();
    let mut models = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("models[{i}].{k}");
        check_model_id(&m.id, &at("id"), invalid)?;
        if !ids.insert(m.id.clone()) {
            return Err(invalid(at("id"), format!("duplicate model id {:?}", m.id)));
        }
        let raw_caps = limits::RawModelCaps {
            max_n: m.max_n,
            max_tokens_cap: m.max_tokens_cap,
            max_stream_event_bytes: m.max_stream_event_bytes,
        };
        let (caps, event_bytes) = limits::model_caps(raw_caps, m.backend == BackendKind::Upstream, &at, invalid)?;
        let backend = match m.backend {
            BackendKind::Upstream => {
                let engine_keys = [
                    ("path", m.path.is_some()),
                    ("device", m.device.is_some()),
                    ("threads", m.threads.is_some()),
                    ("context_tokens", m.context_tokens.is_some()),
                    ("kv_block_tokens", m.kv_block_tokens.is_some()),
                    ("max_batch", m.max_batch.is_some()),
                    ("max_queued", m.max_queued.is_some()),
                    ("step_tokens", m.step_tokens.is_some()),
                    ("itl_target_ms", m.itl_target_ms.is_some()),
                    ("fault", m.fault.is_some()),
                    ("stream_buffer_events", m.stream_buffer_events.is_some()),
                    ("stream_stall_ms", m.stream_stall_ms.is_some()),
                ];
                for (key, set) in engine_keys {
                    if set {
                        return Err(invalid(at(key), "only allowed with backend = \"engine\"".into()));
                    }
                }
                let up = validate_upstream(&m, &at, invalid, lookup)?;
                ModelBackend::Upstream(UpstreamConfig {
                    max_stream_event_bytes: event_bytes.unwrap_or(up.max_stream_event_bytes),
                    ..up
                })
            }
            BackendKind::Engine => {
                for (key, set) in [
                    ("base_url", m.base_url.is_some()),
                    ("api_key_env", m.api_key_env.is_some()),
                    ("upstream_model", m.upstream_model.is_some()),
                ] {
                    if set {
                        return Err(invalid(at(key), "only allowed with backend = \"upstream\"".into()));
                    }
                }
                if m.threads == Some(0) {
                    return Err(invalid(at("threads"), "must be at least 1".into()));
                }
                let device = m
                    .device
                    .as_deref()
                    .map(str::parse)
                    .transpose()
                    .map_err(|e: String| invalid(at("device"), e))?
                    .unwrap_or_default();
                if let Some(n) = m.context_tokens {
                    if !(64..=1 << 20).contains(&n) {
                        return Err(invalid(at("context_tokens"), format!("must be between 64 and 1048576, got {n}")));
                    }
                }
                if let Some(n) = m.kv_block_tokens {
                    if !n.is_power_of_two() || n > 1024 {
                        return Err(invalid(
                            at("kv_block_tokens"),
                            format!("must be a power of two between 1 and 1024, got {n}"),
                        ));
                    }
                }
                if m.fault.is_some() {
                    safe_defaults::check_faults_enabled(at("fault"), invalid, lookup)?;
                }
                let streams = validate_streams(&m, &at, invalid)?;
                let fault = validate_fault(m.fault.unwrap_or_default(), &at, invalid)?;
                let defaults = engine::sched::SchedulerConfig::default();
                let mut batching = defaults;
                for (key, value, slot) in [
                    ("max_batch", m.max_batch, &mut batching.max_running),
                    ("max_queued", m.max_queued, &mut batching.max_queued),
                    ("step_tokens", m.step_tokens, &mut batching.step_tokens),
                ] {
                    match value {
                        Some(n) if !(1..=1 << 20).contains(&n) => {
                            return Err(invalid(at(key), format!("must be between 1 and 1048576, got {n}")))
                        }
                        Some(n) => *slot = n,
                        None => {}
                    }
                }
                match m.itl_target_ms {
                    Some(ms) if ms > 60_000 => {
                        return Err(invalid(
                            at("itl_target_ms"),
                            format!("must be between 0 (off) and 60000, got {ms}"),
                        ))
                    }
                    Some(0) => batching.itl_target = None,
                    Some(ms) => batching.itl_target = Some(Duration::from_millis(ms)),
                    None => {}
                }
                ModelBackend::Engine(EngineModelConfig {
                    path: m.path,
                    device,
                    threads: m.threads,
                    context_tokens: m.context_tokens,
                    kv_block_tokens: m.kv_block_tokens,
                    batching,
                    fault,
                    streams,
                })
            }
        };
        models.push(ModelConfig { id: m.id, backend, caps });
    }
    Ok(models)
}

fn validate_streams(
    m: &RawModel,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
) -> Result<crate::backend::engine_loop::StreamLimits, ConfigError> {
    let mut streams = crate::backend::engine_loop::StreamLimits::default();
    match m.stream_buffer_events {
        Some(n) if !(1..=65_536).contains(&n) => {
            return Err(invalid(at("stream_buffer_events"), format!("must be between 1 and 65536, got {n}")))
        }
        Some(n) => streams.buffer_events = n,
        None => {}
    }
    match m.stream_stall_ms {
        Some(ms) if !(1..=3_600_000).contains(&ms) => {
            return Err(invalid(at("stream_stall_ms"), format!("must be between 1 and 3600000, got {ms}")))
        }
        Some(ms) => streams.stall = Duration::from_millis(ms),
        None => {}
    }
    Ok(streams)
}

fn validate_fault(
    raw: RawFault,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
) -> Result<engine::fault::FaultConfig, ConfigError> {
    let stale_kv = raw.stale_kv.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&stale_kv) {
        return Err(invalid(at("fault.stale_kv"), format!("must be a probability between 0 and 1, got {stale_kv}")));
    }
    Ok(engine::fault::FaultConfig {
        stale_kv,
        skip_zero_fill: raw.skip_zero_fill.unwrap_or(false),
        skip_owner_check: raw.skip_owner_check.unwrap_or(false),
        skip_bounds_check: raw.skip_bounds_check.unwrap_or(false),
        unsalted_prefix_cache: raw.unsalted_prefix_cache.unwrap_or(false),
    })
}

fn validate_upstream(
    m: &RawModel,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<UpstreamConfig, ConfigError> {
    let base_url =
        m.base_url.as_deref().ok_or_else(|| invalid(at("base_url"), "required for backend = \"upstream\"".into()))?;
    let parsed =
        reqwest::Url::parse(base_url).map_err(|e| invalid(at("base_url"), format!("not a URL ({e}): {base_url:?}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(invalid(at("base_url"), format!("must be an http:// or https:// URL, got {base_url:?}")));
    }
    let api_key = match &m.api_key_env {
        None => None,
        Some(var) => Some(Secret(
            lookup(var)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| invalid(at("api_key_env"), format!("environment variable {var} is not set")))?,
        )),
    };
    let timeout = |key: &str, value: Option<u64>, default: u64| -> Result<u64, ConfigError> {
        match value.unwrap_or(default) {
            0 => Err(invalid(at(key), "must be greater than 0".into())),
            v => Ok(v),
        }
    };
    Ok(UpstreamConfig {
        base_url: base_url.trim_end_matches('/').to_owned(),
        api_key,
        upstream_model: m.upstream_model.clone().unwrap_or_else(|| m.id.clone()),
        connect_timeout_ms: timeout("connect_timeout_ms", m.connect_timeout_ms, DEFAULT_CONNECT_TIMEOUT_MS)?,
        first_byte_timeout_ms: timeout(
            "first_byte_timeout_ms",
            m.first_byte_timeout_ms,
            DEFAULT_FIRST_BYTE_TIMEOUT_MS,
        )?,
        idle_timeout_ms: timeout("idle_timeout_ms", m.idle_timeout_ms, DEFAULT_IDLE_TIMEOUT_MS)?,
        max_stream_event_bytes: crate::backend::sse::DEFAULT_MAX_EVENT_BYTES,
    })
}

/// Tenant ids: short, printable, safe in logs, metrics labels and Redis keys.
fn check_id(id: &str, key: &str, invalid: &Invalid<'_>) -> Result<(), ConfigError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(invalid(key.to_owned(), format!("must be 1-64 characters of [A-Za-z0-9._-], got {id:?}")))
    }
}

/// Model ids additionally allow `/` and `:` (`org/model:tag`).
fn check_model_id(id: &str, key: &str, invalid: &Invalid<'_>) -> Result<(), ConfigError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':'));
    if ok {
        Ok(())
    } else {
        Err(invalid(key.to_owned(), format!("must be 1-128 characters of [A-Za-z0-9._/:-], got {id:?}")))
    }
}

fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    let bytes = hex::decode(text.trim()).ok()?;
    bytes.try_into().ok()
}

fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("crossguard");
    }
    match std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/crossguard"),
        None => PathBuf::from(".crossguard"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::from_parts(text, "test.toml", &[], &|_| None)
    }

    fn parse_env(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::from_parts(text, "test.toml", &env, &|name| match name {
            "UPSTREAM_KEY" => Some("upstream-secret".into()),
            "CROSSGUARD_FINGERPRINT_KEY" => Some("000102030405060708090a0b0c0d0e0f".into()),
            _ => None,
        })
    }

    const CONTRACT: &str = r#"
listen = "127.0.0.1:8080"
admin_token_env = "CROSSGUARD_ADMIN_TOKEN"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
[[models]]
id = "mock"
backend = "upstream"
base_url = "http://127.0.0.1:9000/v1"
api_key_env = "UPSTREAM_KEY"
[store]
kind = "memory"
"#;

    #[test]
    fn the_contract_example_loads() {
        let cfg = parse_env(CONTRACT, &[]).unwrap();
        assert_eq!(cfg.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(cfg.tenants[0].id, "acme");
        assert_eq!(cfg.tenants[0].key_digests[0], <[u8; 32]>::from(Sha256::digest(b"sk-acme-1")));
        let ModelBackend::Upstream(up) = &cfg.models[0].backend else { panic!("upstream expected") };
        assert_eq!(up.api_key.as_ref().unwrap().expose(), "upstream-secret");
        assert_eq!(up.upstream_model, "mock");
        assert_eq!(cfg.store, StoreConfig::Memory { audit_max_len: 100_000 });
    }

    #[test]
    fn no_file_gives_defaults() {
        let cfg = parse("").unwrap();
        assert_eq!(cfg.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(cfg.max_body_bytes, 4 * 1024 * 1024);
        assert!(cfg.tenants.is_empty());
        assert_eq!(cfg.models.len(), 1);
        assert_eq!(cfg.models[0].id, DEFAULT_MODEL_ID);
        assert!(matches!(&cfg.models[0].backend, ModelBackend::Engine(e) if e.path.is_none()));
    }

    #[test]
    fn unknown_keys_name_their_path() {
        let err = parse("[[tenants]]\nid = \"a\"\napi_keys = [\"12345678\"]\napi_kyes = []\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("tenants[0]") && msg.contains("api_kyes"), "{msg}");
        let err = parse("lisen = \"x\"").unwrap_err().to_string();
        assert!(err.contains("lisen"), "{err}");
    }

    #[test]
    fn wrong_types_and_values_name_their_path() {
        let err = parse("max_body_bytes = \"big\"").unwrap_err().to_string();
        assert!(err.starts_with("test.toml: max_body_bytes:"), "{err}");
        let err = parse("[[models]]\nid = \"m\"\nbackend = \"cloud\"\n").unwrap_err().to_string();
        assert!(err.contains("models[0].backend"), "{err}");
        let err = parse("[[models]]\nid = \"m\"\nbackend = \"upstream\"\n").unwrap_err().to_string();
        assert!(err.contains("models[0].base_url: required"), "{err}");
        let err = parse("listen = \"nowhere\"").unwrap_err().to_string();
        assert!(err.contains("listen: expected an address"), "{err}");
        let err = parse("[store]\nkind = \"redis\"\nurl = \"http://x\"").unwrap_err().to_string();
        assert!(err.contains("store.url"), "{err}");
    }

    #[test]
    fn duplicates_are_rejected() {
        let two = "[[tenants]]\nid = \"a\"\napi_keys = [\"key-one-1\"]\n[[tenants]]\nid = \"a\"\napi_keys = [\"key-two-2\"]\n";
        assert!(parse(two).unwrap_err().to_string().contains("tenants[1].id: duplicate"));
        let shared = "[[tenants]]\nid = \"a\"\napi_keys = [\"key-one-1\"]\n[[tenants]]\nid = \"b\"\napi_keys = [\"key-one-1\"]\n";
        assert!(parse(shared).unwrap_err().to_string().contains("more than one tenant"));
    }

    #[test]
    fn missing_upstream_key_variable_is_an_error() {
        let err = parse(CONTRACT).unwrap_err().to_string();
        assert!(err.contains("models[0].api_key_env: environment variable UPSTREAM_KEY is not set"), "{err}");
    }

    #[test]
    fn hashed_keys_are_accepted_and_checked() {
        let digest = hex::encode(Sha256::digest(b"sk-hashed-key"));
        let cfg = parse(&format!("[[tenants]]\nid = \"h\"\napi_key_sha256 = [\"{digest}\"]\n")).unwrap();
        assert_eq!(hex::encode(cfg.tenants[0].key_digests[0]), digest);
        let err = parse("[[tenants]]\nid = \"h\"\napi_key_sha256 = [\"abc\"]\n").unwrap_err().to_string();
        assert!(err.contains("tenants[0].api_key_sha256[0]"), "{err}");
    }

    #[test]
    fn environment_overrides_the_file() {
        let cfg = parse_env(
            CONTRACT,
            &[
                ("CROSSGUARD_LISTEN", "0.0.0.0:9999"),
                ("CROSSGUARD_STORE__KIND", "redis"),
                ("CROSSGUARD_STORE__URL", "redis://127.0.0.1:6380"),
                ("CROSSGUARD_MAX_BODY_BYTES", "2048"),
                ("CROSSGUARD_ADMIN_TOKEN", "ignored-here-it-is-a-secret"),
            ],
        )
        .unwrap();
        assert_eq!(cfg.listen.port(), 9999);
        let StoreConfig::Redis(redis) = &cfg.store else { panic!("redis expected") };
        assert_eq!(redis.url, "redis://127.0.0.1:6380");
        assert_eq!(redis.key_prefix, "crossguard:");
        assert_eq!(cfg.provenance.key, Some([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]));
        assert_eq!(cfg.max_body_bytes, 2048);
        let tenants = parse_env("", &[("CROSSGUARD_TENANTS", r#"[{id="t1", api_keys=["sk-t1-key-1"]}]"#)]).unwrap();
        assert_eq!(tenants.tenants[0].id, "t1");
        let err = parse_env("", &[("CROSSGUARD_LISTN", "x")]).unwrap_err().to_string();
        assert!(err.contains("CROSSGUARD_LISTN") && err.contains("listn"), "{err}");
    }

    #[test]
    fn protection_keys_load_and_are_checked() {
        let text = r#"
[[tenants]]
id = "acme"
api_keys = ["sk-acme-1"]
fail_mode = "open"
canary = true
[provenance]
ngram_words = 6
ttl_secs = 3600
common_at = 4
[stats]
min_samples = 50
action = "block"
[canary]
text = "ref {canary} (secret)"
placement = "system_start"
"#;
        let cfg = parse(text).unwrap();
        assert_eq!(cfg.tenants[0].fail_mode, FailMode::Open);
        assert!(cfg.tenants[0].canary);
        assert_eq!((cfg.provenance.ngram_words, cfg.provenance.ttl_secs, cfg.provenance.common_at), (6, 3600, 4));
        assert_eq!(cfg.provenance.key, None);
        assert_eq!(cfg.stats.action, firewall::Action::Block);
        assert_eq!(cfg.canary.placement, CanaryPlacement::SystemStart);
        let defaults = parse("").unwrap();
        assert_eq!(defaults.provenance.ngram_words, 8);
        assert_eq!(defaults.stats.action, firewall::Action::Log);
        for (bad, key) in [
            ("[canary]\ntext = \"no placeholder\"", "canary.text"),
            ("[provenance]\nngram_words = 2", "provenance.ngram_words"),
            ("[provenance]\nmax_tenant_share = 0.0", "provenance.max_tenant_share"),
            ("[provenance]\nrefresh_interval_ms = 500\nmax_staleness_ms = 500", "provenance.max_staleness_ms"),
            ("[provenance]\nprovenance_unavailable = \"maybe\"", "provenance.provenance_unavailable"),
            ("[provenance]\nmax_tenant_share = 1.5", "provenance.max_tenant_share"),
            ("[provenance]\nmax_hashes = 1000\nmax_hashes_per_text = 2000", "provenance.max_hashes_per_text"),
            ("[responses]\nttl_secs = 0", "responses.ttl_secs"),
            ("[responses]\nmax_stored_bytes = 10", "responses.max_stored_bytes"),
            ("[responses]\nttl = 5", "responses"),
            ("[responses]\nmax_stored = 0", "responses.max_stored"),
            ("[store]\nkind = \"memory\"\nkey_prefix = \"x\"", "store.key_prefix"),
            ("[store]\nkind = \"redis\"", "provenance.key_env"),
            ("[stats]\nz_threshold = 0.5", "stats.z_threshold"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
        let err = Config::from_parts("", "t", &[], &|n| (n == "CROSSGUARD_FINGERPRINT_KEY").then(|| "zz".to_owned()))
            .unwrap_err();
        assert!(err.to_string().contains("32 hexadecimal"), "{err}");
    }

    #[test]
    fn the_rule_folder_watch_defaults_on_and_zero_turns_it_off() {
        assert_eq!(parse("").unwrap().firewall.watch_interval_ms, 1000);
        assert_eq!(parse("[firewall]\nwatch_interval_ms = 0").unwrap().firewall.watch_interval_ms, 0);
        assert_eq!(parse("[firewall]\nwatch_interval_ms = 250").unwrap().firewall.watch_interval_ms, 250);
        for bad in ["[firewall]\nwatch_interval_ms = 10", "[firewall]\nwatch_interval_ms = 86400000"] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains("firewall.watch_interval_ms"), "{bad}: {err}");
        }
    }

    /// As the process would see it with `CROSSGUARD_ENABLE_FAULTS=1`.
    fn parse_with_faults(text: &str) -> Result<Config, ConfigError> {
        Config::from_parts(text, "test.toml", &[], &|name| (name == ENABLE_FAULTS_ENV).then(|| "1".to_owned()))
    }

    #[test]
    fn engine_kv_keys_and_fault_switches_load_and_are_checked() {
        let text = "[[models]]\nid = \"m\"\nbackend = \"engine\"\ndevice = \"auto\"\nkv_block_tokens = 32\n[models.fault]\nstale_kv = 0.5\nskip_owner_check = true\n";
        let cfg = parse_with_faults(text).unwrap();
        let ModelBackend::Engine(e) = &cfg.models[0].backend else { panic!("engine expected") };
        assert_eq!(e.kv_block_tokens, Some(32));
        assert_eq!(e.device, engine::backend::Device::Auto);
        let err = parse_with_faults(&text.replace("\"auto\"", "\"gpu\"")).unwrap_err().to_string();
        assert!(err.contains("models[0].device: \"gpu\" is not a device"), "{err}");
        assert_eq!(e.fault.active(), ["stale_kv", "skip_owner_check"]);
        let defaults = parse("").unwrap();
        let ModelBackend::Engine(e) = &defaults.models[0].backend else { panic!("engine expected") };
        assert!(e.fault.active().is_empty(), "every defence is on by default");
        assert_eq!(e.device, engine::backend::Device::Cpu);
        let err = parse_with_faults(&text.replace("0.5", "2.0")).unwrap_err().to_string();
        assert!(err.contains("models[0].fault.stale_kv: must be a probability"), "{err}");
        let err = parse_with_faults(&text.replace("32", "12")).unwrap_err().to_string();
        assert!(err.contains("models[0].kv_block_tokens: must be a power of two"), "{err}");
        let err = parse_with_faults(&text.replace("skip_owner_check", "skip_owner_chek")).unwrap_err().to_string();
        assert!(err.contains("skip_owner_chek"), "{err}");
        let upstream = "[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\n[models.fault]\nskip_zero_fill = true\n";
        let err = parse(upstream).unwrap_err().to_string();
        assert!(err.contains("models[0].fault: only allowed with backend = \"engine\""), "{err}");
    }

    #[test]
    fn itl_target_defaults_on_and_zero_turns_it_off() {
        let engine = |text: &str| match parse(text).map(|c| c.models.into_iter().next().map(|m| m.backend)) {
            Ok(Some(ModelBackend::Engine(e))) => Ok(e.batching.itl_target),
            Ok(_) => panic!("engine expected"),
            Err(e) => Err(e.to_string()),
        };
        let model = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n";
        assert_eq!(engine(model), Ok(engine::sched::SchedulerConfig::default().itl_target));
        assert_eq!(engine(&format!("{model}itl_target_ms = 50\n")), Ok(Some(Duration::from_millis(50))));
        assert_eq!(engine(&format!("{model}itl_target_ms = 0\n")), Ok(None));
        let err = engine(&format!("{model}itl_target_ms = 90000\n")).unwrap_err();
        assert!(err.contains("models[0].itl_target_ms: must be between 0 (off) and 60000"), "{err}");
        let err = parse("[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\nitl_target_ms = 50\n").unwrap_err().to_string();
        assert!(err.contains("models[0].itl_target_ms: only allowed with backend = \"engine\""), "{err}");
    }

    #[test]
    fn stream_limits_default_and_are_checked() {
        let streams = |text: &str| match parse(text).map(|c| c.models.into_iter().next().map(|m| m.backend)) {
            Ok(Some(ModelBackend::Engine(e))) => Ok(e.streams),
            Ok(_) => panic!("engine expected"),
            Err(e) => Err(e.to_string()),
        };
        let model = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n";
        let defaults = crate::backend::engine_loop::StreamLimits::default();
        assert_eq!(streams(model), Ok(defaults));
        assert_eq!((defaults.buffer_events, defaults.stall), (256, Duration::from_secs(30)));
        let set = streams(&format!("{model}stream_buffer_events = 8\nstream_stall_ms = 500\n")).unwrap();
        assert_eq!((set.buffer_events, set.stall), (8, Duration::from_millis(500)));
        let err = streams(&format!("{model}stream_buffer_events = 0\n")).unwrap_err();
        assert!(err.contains("models[0].stream_buffer_events: must be between 1 and 65536, got 0"), "{err}");
        let err = streams(&format!("{model}stream_stall_ms = 0\n")).unwrap_err();
        assert!(err.contains("models[0].stream_stall_ms: must be between 1 and 3600000, got 0"), "{err}");
        let err = parse("[[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://127.0.0.1:1/v1\"\nstream_stall_ms = 50\n").unwrap_err().to_string();
        assert!(err.contains("models[0].stream_stall_ms: only allowed with backend = \"engine\""), "{err}");
    }

    #[test]
    fn secrets_do_not_debug_print() {
        let cfg = parse("admin_token = \"0123456789abcdef-admin\"").unwrap();
        assert!(!format!("{cfg:?}").contains("0123456789abcdef"));
        assert!(parse("admin_token = \"short\"").is_err());
        let text = "metrics_token = \"metrics-zq81-token\"\n[store]\nkind = \"redis\"\nurl = \"redis://:pw-zq81-redis@127.0.0.1:6379\"\n\
                    [[models]]\nid = \"m\"\nbackend = \"upstream\"\nbase_url = \"http://u:pw-zq81-base@127.0.0.1:1/v1\"\napi_key_env = \"UPSTREAM_KEY\"\n";
        let cfg = parse_env(text, &[]).unwrap();
        let shown = format!("{cfg:?}");
        // The fingerprint key is 00 01 02 ...: as bytes in Debug it would read "[0, 1, 2".
        for secret in ["zq81", "upstream-secret", "[0, 1, 2", "000102"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }

    #[test]
    fn the_firewall_simd_cap_is_not_a_config_key() {
        // The firewall reads it itself; the overlay must not take it for `firewall_simd`.
        assert!(parse_env("", &[(firewall::SIMD_ENV, "avx2")]).is_ok());
    }

    #[test]
    fn faults_need_the_enabling_variable() {
        let text = "[[models]]\nid = \"m\"\nbackend = \"engine\"\n[models.fault]\nskip_zero_fill = true\n";
        let err = parse(text).unwrap_err().to_string();
        assert!(err.contains("models[0].fault:") && err.contains("CROSSGUARD_ENABLE_FAULTS=1"), "{err}");
        let empty_table =
            parse("[[models]]\nid = \"m\"\nbackend = \"engine\"\n[models.fault]\n").unwrap_err().to_string();
        assert!(empty_table.contains("CROSSGUARD_ENABLE_FAULTS=1"), "{empty_table}");
        let other_value = Config::from_parts(text, "t", &[], &|n| (n == ENABLE_FAULTS_ENV).then(|| "true".to_owned()));
        assert!(other_value.is_err(), "only 1 enables");
        assert!(parse_with_faults(text).is_ok());
        // A config key of the same name does not enable them: the variable is reserved.
        let err = parse_env(text, &[("CROSSGUARD_ENABLE_FAULTS", "1")]).unwrap_err().to_string();
        assert!(err.contains("models[0].fault:"), "{err}");
        assert!(parse(&format!("enable_faults = true\n{text}")).is_err());
    }

    #[test]
    fn open_mode_off_loopback_needs_allow_open() {
        for listen in ["0.0.0.0:8080", "192.0.2.10:8080", "[::]:8080"] {
            let err = parse(&format!("listen = \"{listen}\"")).unwrap_err().to_string();
            assert!(err.contains("allow_open") && err.contains(listen), "{err}");
            assert!(parse(&format!("listen = \"{listen}\"\nallow_open = true")).unwrap().allow_open);
            let with_tenant = format!("listen = \"{listen}\"\n[[tenants]]\nid = \"a\"\napi_keys = [\"sk-key-123\"]\n");
            assert!(parse(&with_tenant).is_ok());
        }
        for listen in ["127.0.0.1:8080", "127.0.0.2:1", "[::1]:8080"] {
            assert!(parse(&format!("listen = \"{listen}\"")).is_ok(), "{listen}");
        }
    }

    #[test]
    fn metrics_token_comes_from_the_file_or_a_variable() {
        assert_eq!(parse("").unwrap().metrics_token, None);
        let literal = parse("metrics_token = \"0123456789abcdef-metrics\"").unwrap();
        assert_eq!(literal.metrics_token.as_ref().map(Secret::expose), Some("0123456789abcdef-metrics"));
        let from_env = |text: &str| {
            Config::from_parts(text, "t", &[], &|n| match n {
                "CROSSGUARD_METRICS_TOKEN" => Some("default-variable-token".to_owned()),
                "MY_METRICS" => Some("named-variable-token".to_owned()),
                _ => None,
            })
        };
        assert_eq!(
            from_env("").unwrap().metrics_token.map(|s| s.expose().to_owned()).as_deref(),
            Some("default-variable-token")
        );
        let named = from_env("metrics_token_env = \"MY_METRICS\"").unwrap().metrics_token;
        assert_eq!(named.as_ref().map(Secret::expose), Some("named-variable-token"));
        for (bad, message) in [
            ("metrics_token = \"short\"", "metrics_token: must be at least 16"),
            (
                "metrics_token = \"0123456789abcdef-m\"\nmetrics_token_env = \"X\"",
                "metrics_token: set metrics_token or metrics_token_env, not both",
            ),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        }
    }

    #[test]
    fn admin_throttle_defaults_and_bounds() {
        assert_eq!(
            parse("").unwrap().admin_throttle,
            AdminThrottleConfig { client_failures: 5, global_failures: 50, window_secs: 300, cooldown_secs: 300 }
        );
        let set =
            parse("[admin_throttle]\nclient_failures = 3\nglobal_failures = 9\nwindow_secs = 60\ncooldown_secs = 30\n")
                .unwrap();
        assert_eq!((set.admin_throttle.client_failures, set.admin_throttle.cooldown_secs), (3, 30));
        for (bad, key) in [
            ("[admin_throttle]\nclient_failures = 0", "admin_throttle.client_failures"),
            ("[admin_throttle]\nwindow_secs = 0", "admin_throttle.window_secs"),
            ("[admin_throttle]\nclient_failures = 10\nglobal_failures = 5", "admin_throttle.global_failures"),
            ("[admin_throttle]\ncooldown_secs = 100000", "admin_throttle.cooldown_secs"),
            ("[admin_throttle]\nclient_failure = 3", "client_failure"),
        ] {
            let err = parse(bad).unwrap_err().to_string();
            assert!(err.contains(key), "{bad}: {err}");
        }
    }
}
