//! How the validated config is shown: the effective-config summary `check-config` prints,
//! and `Debug` for the structs that hold secrets. Both go through [`crate::redact`], so a
//! token, a key, an API key or a password in a URL is never printed, only whether it is set.

use std::fmt::{self, Display, Write as _};

use super::{Config, ModelBackend, ProvenanceConfig, RedisStoreConfig, StoreConfig, UpstreamConfig};
use crate::redact::{self, MASK};

/// The effective config, one `key = value` line per setting, grouped by table; secrets `***`.
pub struct Summary<'a>(&'a Config);

impl Config {
    /// What `crossguard check-config` prints after its `ok:` line.
    pub fn summary(&self) -> Summary<'_> {
        Summary(self)
    }
}

impl Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        let mut out = String::new();
        let _ = writeln!(out, "listen = \"{}\"", c.listen);
        let _ = writeln!(out, "allow_open = {}", c.allow_open);
        let _ = writeln!(out, "admin_token = {}", redact::presence(c.admin_token.as_ref()));
        let _ = writeln!(out, "metrics_token = {}", redact::presence(c.metrics_token.as_ref()));
        let _ = writeln!(out, "max_body_bytes = {}", c.max_body_bytes);
        let _ = writeln!(out, "data_dir = {:?}", c.data_dir.display().to_string());
        let t = &c.admin_throttle;
        let _ = writeln!(
            out,
            "[admin_throttle] client_failures = {}, global_failures = {}, window_secs = {}, cooldown_secs = {}",
            t.client_failures, t.global_failures, t.window_secs, t.cooldown_secs
        );
        for tenant in &c.tenants {
            let _ = writeln!(
                out,
                "[[tenants]] id = {:?}, api_keys = {MASK} ({} key(s)), fail_mode = {:?}, canary = {}, own_secrets = {:?}, quarantine_when_probing = {}",
                tenant.id,
                tenant.key_digests.len(),
                tenant.fail_mode,
                tenant.canary,
                tenant.own_secrets,
                tenant.quarantine_when_probing
            );
        }
        for model in &c.models {
            let _ = match &model.backend {
                ModelBackend::Upstream(up) => writeln!(out, "[[models]] id = {:?}, backend = \"upstream\", {}", model.id, upstream_fields(up)),
                ModelBackend::Engine(e) => writeln!(
                    out,
                    "[[models]] id = {:?}, backend = \"engine\", path = {:?}, device = \"{}\", threads = {:?}, context_tokens = {:?}, \
                     kv_block_tokens = {:?}, max_batch = {}, max_queued = {}, step_tokens = {}, itl_target_ms = {}, faults = {:?}",
                    model.id,
                    e.path.as_ref().map(|p| p.display().to_string()),
                    e.device,
                    e.threads,
                    e.context_tokens,
                    e.kv_block_tokens,
                    e.batching.max_running,
                    e.batching.max_queued,
                    e.batching.step_tokens,
                    e.batching.itl_target.map_or(0, |d| d.as_millis()),
                    e.fault.active()
                ),
            };
        }
        let _ = match &c.store {
            StoreConfig::Memory { audit_max_len } => {
                writeln!(out, "[store] kind = \"memory\", audit_max_len = {audit_max_len}")
            }
            StoreConfig::Redis(r) => writeln!(out, "[store] kind = \"redis\", {}", redis_fields(r)),
        };
        let fw = &c.firewall;
        let _ = writeln!(
            out,
            "[firewall] rules_dir = {:?}, max_holdback_bytes = {}, watch_interval_ms = {}, probe_alert_blocks = {}, probe_window_secs = {}, read_encoded = {}",
            fw.rules_dir.as_ref().map(|p| p.display().to_string()),
            fw.max_holdback_bytes,
            fw.watch_interval_ms,
            fw.probe_alert_blocks,
            fw.probe_window_secs,
            fw.read_encoded
        );
        let _ = writeln!(out, "[provenance] {}", provenance_fields(&c.provenance));
        let s = &c.stats;
        let _ = writeln!(
            out,
            "[stats] min_samples = {}, sync_interval_ms = {}, z_threshold = {}, action = \"{}\"",
            s.min_samples,
            s.sync_interval_ms,
            s.z_threshold,
            s.action.as_str()
        );
        let r = &c.responses;
        let _ = writeln!(
            out,
            "[responses] store = {}, ttl_secs = {}, max_stored = {}, max_stored_bytes = {}",
            r.store, r.ttl_secs, r.max_stored, r.max_stored_bytes
        );
        let _ = write!(out, "[canary] placement = {:?}", c.canary.placement);
        f.write_str(&out)
    }
}

fn upstream_fields(up: &UpstreamConfig) -> String {
    format!(
        "base_url = {:?}, api_key = {}, upstream_model = {:?}, connect_timeout_ms = {}, first_byte_timeout_ms = {}, idle_timeout_ms = {}",
        redact::url(&up.base_url),
        redact::presence(up.api_key.as_ref()),
        up.upstream_model,
        up.connect_timeout_ms,
        up.first_byte_timeout_ms,
        up.idle_timeout_ms
    )
}

fn redis_fields(r: &RedisStoreConfig) -> String {
    format!(
        "url = {:?}, key_prefix = {:?}, audit_max_len = {}, op_timeout_ms = {}, replica_id = {:?}",
        redact::url(&r.url),
        r.key_prefix,
        r.audit_max_len,
        r.op_timeout_ms,
        r.replica_id
    )
}

fn provenance_fields(p: &ProvenanceConfig) -> String {
    format!(
        "ngram_words = {}, ttl_secs = {}, key_env = {:?}, key = {}, max_hashes = {}, max_tenant_share = {}, max_hashes_per_text = {}, \
         common_at = {}, foreign_tokens = {}, refresh_interval_ms = {}, max_staleness_ms = {}, provenance_unavailable = {:?}",
        p.ngram_words,
        p.ttl_secs,
        p.key_env,
        redact::presence(p.key.as_ref()),
        p.max_hashes,
        p.max_tenant_share,
        p.max_hashes_per_text,
        p.common_at,
        p.foreign_tokens,
        p.refresh_interval_ms,
        p.max_staleness_ms,
        p.unavailable
    )
}

// `Debug` of the secret-holding structs prints the same masked fields as the summary.

impl fmt::Debug for UpstreamConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UpstreamConfig {{ {} }}", upstream_fields(self))
    }
}

impl fmt::Debug for RedisStoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisStoreConfig {{ {} }}", redis_fields(self))
    }
}

impl fmt::Debug for ProvenanceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProvenanceConfig {{ {} }}", provenance_fields(self))
    }
}
