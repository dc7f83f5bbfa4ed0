//! Validation: every table of a [`RawConfig`] checked, defaults filled in, secrets looked up,
//! into the [`Config`] the gateway runs with. Every error names its key path.

use super::raw::*;
use super::*;

pub(super) fn validate(
    raw: RawConfig,
    origin: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
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
        read_encoded: raw_fw.read_encoded.unwrap_or(true),
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
    let ngram_words = raw.ngram_words.unwrap_or(firewall::DEFAULT_NGRAM_WORDS);
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
        foreign_tokens: raw.foreign_tokens.unwrap_or(true),
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
    raw: Vec<toml::Table>,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ModelConfig>, ConfigError> {
    let mut ids = HashSet::new();
    let mut models = Vec::with_capacity(raw.len());
    for (i, table) in raw.into_iter().enumerate() {
        let at = |k: &str| format!("models[{i}].{k}");
        let m = RawModel::from_table(table, &at).map_err(|(key, message)| invalid(key, message))?;
        check_model_id(m.id(), &at("id"), invalid)?;
        if !ids.insert(m.id().to_owned()) {
            return Err(invalid(at("id"), format!("duplicate model id {:?}", m.id())));
        }
        models.push(match m {
            RawModel::Upstream(m) => validate_upstream_model(m, &at, invalid, lookup)?,
            RawModel::Engine(m) => validate_engine_model(m, &at, invalid, lookup)?,
        });
    }
    Ok(models)
}

fn validate_upstream_model(
    m: RawUpstreamModel,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ModelConfig, ConfigError> {
    let raw_caps = limits::RawModelCaps {
        max_n: m.max_n,
        max_tokens_cap: m.max_tokens_cap,
        max_stream_event_bytes: m.max_stream_event_bytes,
    };
    let (caps, event_bytes) = limits::model_caps(raw_caps, true, at, invalid)?;
    let up = validate_upstream(&m, at, invalid, lookup)?;
    let backend = ModelBackend::Upstream(UpstreamConfig {
        max_stream_event_bytes: event_bytes.unwrap_or(up.max_stream_event_bytes),
        ..up
    });
    Ok(ModelConfig { id: m.id, backend, caps })
}

fn validate_engine_model(
    m: RawEngineModel,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<ModelConfig, ConfigError> {
    let raw_caps = limits::RawModelCaps { max_n: m.max_n, max_tokens_cap: None, max_stream_event_bytes: None };
    let (caps, _) = limits::model_caps(raw_caps, false, at, invalid)?;
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
            return Err(invalid(at("kv_block_tokens"), format!("must be a power of two between 1 and 1024, got {n}")));
        }
    }
    if m.fault.is_some() {
        safe_defaults::check_faults_enabled(at("fault"), invalid, lookup)?;
    }
    let streams = validate_streams(&m, at, invalid)?;
    let fault = validate_fault(m.fault.unwrap_or_default(), at, invalid)?;
    let mut batching = engine::SchedulerConfig::default();
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
            return Err(invalid(at("itl_target_ms"), format!("must be between 0 (off) and 60000, got {ms}")))
        }
        Some(0) => batching.itl_target = None,
        Some(ms) => batching.itl_target = Some(Duration::from_millis(ms)),
        None => {}
    }
    let backend = ModelBackend::Engine(EngineModelConfig {
        path: m.path,
        device,
        threads: m.threads,
        context_tokens: m.context_tokens,
        kv_block_tokens: m.kv_block_tokens,
        batching,
        fault,
        streams,
    });
    Ok(ModelConfig { id: m.id, backend, caps })
}

fn validate_streams(
    m: &RawEngineModel,
    at: &dyn Fn(&str) -> String,
    invalid: &Invalid<'_>,
) -> Result<crate::backend::engine_client::StreamLimits, ConfigError> {
    let mut streams = crate::backend::engine_client::StreamLimits::default();
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
) -> Result<engine::FaultConfig, ConfigError> {
    let stale_kv = raw.stale_kv.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&stale_kv) {
        return Err(invalid(at("fault.stale_kv"), format!("must be a probability between 0 and 1, got {stale_kv}")));
    }
    Ok(engine::FaultConfig {
        stale_kv,
        skip_zero_fill: raw.skip_zero_fill.unwrap_or(false),
        skip_owner_check: raw.skip_owner_check.unwrap_or(false),
        skip_bounds_check: raw.skip_bounds_check.unwrap_or(false),
        unsalted_prefix_cache: raw.unsalted_prefix_cache.unwrap_or(false),
    })
}

fn validate_upstream(
    m: &RawUpstreamModel,
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
