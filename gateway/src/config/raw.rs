//! The raw configuration: a `deny_unknown_fields` mirror of the file (and of the
//! `CROSSGUARD_*` overlay), read before anything is checked; [`super::validate`] turns it
//! into a [`super::Config`].

use std::path::PathBuf;

use serde::de::DeserializeOwned;
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
    /// Each read as a [`RawModel`] once its `backend` is known (see [`RawModel::from_table`]).
    #[serde(default)]
    pub(super) models: Vec<toml::Table>,
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
    pub(super) foreign_tokens: Option<bool>,
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
    pub(super) read_encoded: Option<bool>,
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

/// A `[[models]]` table, by its `backend`: each kind has the keys it may hold, and a key of
/// the other kind is an error that says which backend allows it.
#[derive(Debug)]
pub(super) enum RawModel {
    Upstream(RawUpstreamModel),
    Engine(RawEngineModel),
}

/// `backend = "upstream"`: an OpenAI-compatible server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstreamModel {
    pub(super) id: String,
    pub(super) base_url: Option<String>,
    pub(super) api_key_env: Option<String>,
    pub(super) upstream_model: Option<String>,
    pub(super) connect_timeout_ms: Option<u64>,
    pub(super) first_byte_timeout_ms: Option<u64>,
    pub(super) idle_timeout_ms: Option<u64>,
    pub(super) max_n: Option<u32>,
    pub(super) max_tokens_cap: Option<u32>,
    pub(super) max_stream_event_bytes: Option<usize>,
}

/// `backend = "engine"`: the in-process engine.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEngineModel {
    pub(super) id: String,
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
    pub(super) max_n: Option<u32>,
    pub(super) stream_buffer_events: Option<usize>,
    pub(super) stream_stall_ms: Option<u64>,
}

/// Where a model table went wrong: the key path under `models[i]` and why.
pub(super) type ModelError = (String, String);

impl RawModel {
    /// Reads one `[[models]]` table; `at` turns a key into its path (`models[0].fault`).
    pub(super) fn from_table(mut table: toml::Table, at: &dyn Fn(&str) -> String) -> Result<RawModel, ModelError> {
        let backend = match table.remove("backend") {
            Some(toml::Value::String(b)) => b,
            Some(other) => return Err((at("backend"), format!("expected \"upstream\" or \"engine\", got {other}"))),
            None => return Err((at("backend"), "missing: \"upstream\" or \"engine\"".to_owned())),
        };
        match backend.as_str() {
            "upstream" => read_kind::<RawUpstreamModel, RawEngineModel>(table, "engine", at).map(RawModel::Upstream),
            "engine" => read_kind::<RawEngineModel, RawUpstreamModel>(table, "upstream", at).map(RawModel::Engine),
            other => Err((at("backend"), format!("unknown variant `{other}`, expected `upstream` or `engine`"))),
        }
    }

    pub(super) fn id(&self) -> &str {
        match self {
            RawModel::Upstream(m) => &m.id,
            RawModel::Engine(m) => &m.id,
        }
    }
}

/// Reads `table` as a model of kind `T`; a key that only kind `Other` (`other`) has is
/// reported as belonging to it, the rest as serde reports them, at their path.
fn read_kind<T: DeserializeOwned, Other: DeserializeOwned>(
    table: toml::Table,
    other: &str,
    at: &dyn Fn(&str) -> String,
) -> Result<T, ModelError> {
    let (own, theirs) = (field_names::<T>(), field_names::<Other>());
    if let Some(key) = table.keys().find(|k| !own.contains(&k.as_str()) && theirs.contains(&k.as_str())) {
        return Err((at(key), format!("only allowed with backend = \"{other}\"")));
    }
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let path = e.path().to_string();
        let key = if path == "." { at("").trim_end_matches('.').to_owned() } else { at(&path) };
        (key, e.into_inner().to_string())
    })
}

/// The field names of struct `T`, as its `Deserialize` implementation lists them (asked of
/// a deserializer that only records them), so the two model kinds' keys are written once:
/// in their structs.
fn field_names<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error as _, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Self::Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Self::Error::custom("fields recorded"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
            unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
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
