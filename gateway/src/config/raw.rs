//! The raw configuration: a `deny_unknown_fields` mirror of the file (and of the
//! `CROSSGUARD_*` overlay), read before anything is checked; [`super::validate`] turns it
//! into a [`super::Config`].

use std::path::PathBuf;

use serde::Deserialize;

use super::{limits, responses, safe_defaults, CanaryPlacement, FailMode, OwnSecrets, ProvenanceUnavailable};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) listen: Option<String>,
    pub(super) admin_token_env: Option<String>,
    pub(super) admin_token: Option<String>,
    pub(super) metrics_token_env: Option<String>,
    pub(super) metrics_token: Option<String>,
    pub(super) allow_open: Option<bool>,
    pub(super) admin_throttle: Option<safe_defaults::RawAdminThrottle>,
    pub(super) max_body_bytes: Option<usize>,
    pub(super) data_dir: Option<PathBuf>,
    #[serde(default)]
    pub(super) tenants: Vec<RawTenant>,
    #[serde(default)]
    pub(super) models: Vec<RawModel>,
    pub(super) store: Option<RawStore>,
    pub(super) firewall: Option<RawFirewall>,
    pub(super) provenance: Option<RawProvenance>,
    pub(super) stats: Option<RawStats>,
    pub(super) canary: Option<RawCanary>,
    pub(super) limits: Option<limits::RawLimits>,
    pub(super) server: Option<limits::RawServer>,
    pub(super) responses: Option<responses::RawResponses>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProvenance {
    pub(super) ngram_words: Option<usize>,
    pub(super) ttl_secs: Option<u64>,
    pub(super) key_env: Option<String>,
    pub(super) max_hashes: Option<usize>,
    pub(super) max_tenant_share: Option<f64>,
    pub(super) max_hashes_per_text: Option<usize>,
    pub(super) common_at: Option<usize>,
    pub(super) refresh_interval_ms: Option<u64>,
    pub(super) max_staleness_ms: Option<u64>,
    pub(super) provenance_unavailable: Option<ProvenanceUnavailable>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStats {
    pub(super) min_samples: Option<u64>,
    pub(super) sync_interval_ms: Option<u64>,
    pub(super) z_threshold: Option<f64>,
    pub(super) action: Option<RawAction>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCanary {
    pub(super) text: Option<String>,
    pub(super) placement: Option<CanaryPlacement>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawAction {
    Log,
    Redact,
    Block,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFirewall {
    pub(super) rules_dir: Option<PathBuf>,
    pub(super) max_holdback_bytes: Option<usize>,
    pub(super) watch_interval_ms: Option<u64>,
    pub(super) probe_alert_blocks: Option<u32>,
    pub(super) probe_window_secs: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub(super) id: String,
    #[serde(default)]
    pub(super) api_keys: Vec<String>,
    #[serde(default)]
    pub(super) api_key_sha256: Vec<String>,
    pub(super) fail_mode: Option<FailMode>,
    pub(super) canary: Option<bool>,
    pub(super) own_secrets: Option<OwnSecrets>,
    pub(super) quarantine_when_probing: Option<bool>,
    pub(super) limits: Option<limits::RawLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    pub(super) id: String,
    pub(super) backend: BackendKind,
    // upstream
    pub(super) base_url: Option<String>,
    pub(super) api_key_env: Option<String>,
    pub(super) upstream_model: Option<String>,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) first_byte_timeout_ms: Option<u64>,
    pub(super) idle_timeout_ms: Option<u64>,
    // engine
    pub(super) path: Option<PathBuf>,
    pub(super) device: Option<String>,
    pub(super) threads: Option<usize>,
    pub(super) context_tokens: Option<usize>,
    pub(super) kv_block_tokens: Option<usize>,
    pub(super) max_batch: Option<usize>,
    pub(super) max_queued: Option<usize>,
    pub(super) step_tokens: Option<usize>,
    pub(super) itl_target_ms: Option<u64>,
    pub(super) fault: Option<RawFault>,
    // both
    pub(super) max_n: Option<u32>,
    pub(super) max_tokens_cap: Option<u32>,
    pub(super) max_stream_event_bytes: Option<usize>,
    pub(super) stream_buffer_events: Option<usize>,
    pub(super) stream_stall_ms: Option<u64>,
}

/// `[models.fault]`: switches that disable one KV isolation defence each (tests only).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFault {
    pub(super) stale_kv: Option<f64>,
    pub(super) skip_zero_fill: Option<bool>,
    pub(super) skip_owner_check: Option<bool>,
    pub(super) skip_bounds_check: Option<bool>,
    pub(super) unsalted_prefix_cache: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum BackendKind {
    Upstream,
    Engine,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    pub(super) kind: StoreKind,
    pub(super) url: Option<String>,
    pub(super) key_prefix: Option<String>,
    pub(super) audit_max_len: Option<usize>,
    pub(super) op_timeout_ms: Option<u64>,
    pub(super) replica_id: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum StoreKind {
    Memory,
    Redis,
}
