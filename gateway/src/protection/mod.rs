//! The protection pipeline around every completion: what the gateway learns from each
//! request and response, and what it records when the firewall acts.
//!
//! Before the backend runs: the tenant's canary line is injected (when configured) and the
//! prompt is fingerprinted into the provenance index under the tenant. After the response
//! (streamed or not, finished or abandoned): the released text is fingerprinted under the
//! tenant too, the scanners' observations feed the tenant's statistics, and a block or a
//! redaction becomes an audit record in the store (built by `response_guard::finish`,
//! written here). Sharing with other replicas (the fingerprints, the statistics) happens in
//! background tasks; nothing here does I/O on the token path.
//!
//! Invariants: the firewall's n-gram detector and the index hash with the same key and
//! window; a tenant's canary is derived from the deployment key, so every replica injects
//! and recognises the same one; an audit record is written for every response whose
//! findings include a block or a redaction, or that failed closed.

mod canary;
mod keys;
mod tasks;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use firewall::{
    DecodeConfig, Detectors, EntropyConfig, NgramConfig, NgramKey, ProvenanceConfig, Ruleset, ScanContext,
    SecretOwnership,
};

use crate::api::ChatRequest;
use crate::audit::AuditRecord;
use crate::config::{Config, FailMode, OwnSecrets, ProvenanceUnavailable, StoreConfig};
use crate::metrics::{Exposition, Kind};
use crate::probing::{is_foreign_block, ProbeSettings, ProbeWatch};
use crate::provenance::{ProvenanceIndex, ProvenanceSettings};
use crate::response_guard::ResponseGuard;
use crate::stats::{Statistics, StatsSettings};
use crate::store::{RedisSettings, Role, Store, StoreError};

use canary::Canaries;
use keys::local_key;
pub(crate) use tasks::every;
use tasks::spawn;

/// Why protection could not start.
#[derive(Debug, thiserror::Error)]
pub enum ProtectionError {
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("fingerprint key {path}: {reason}")]
    Key { path: String, reason: String },
}

/// Everything the pipeline shares between requests.
pub struct Protection {
    store: Arc<Store>,
    index: Arc<ProvenanceIndex>,
    stats: Arc<Statistics>,
    detectors: Arc<Detectors>,
    canaries: Canaries,
    policies: HashMap<String, TenantPolicy>,
    /// Foreign-data blocks per asking tenant: the probing flag and quarantine.
    probes: ProbeWatch,
    /// Embedded store only: where the provenance index is snapshotted.
    snapshot: Option<PathBuf>,
    /// Shared store only: how old other replicas' fingerprints may get, and what then.
    max_staleness_ms: u64,
    when_stale: ProvenanceUnavailable,
    /// Every audit record written by this replica, as it is written (live views).
    written: tokio::sync::broadcast::Sender<Arc<AuditRecord>>,
}

/// What the tenant's config says about its responses.
#[derive(Debug, Clone, Copy, Default)]
struct TenantPolicy {
    fail_mode: FailMode,
    own_secrets: OwnSecrets,
    quarantine_when_probing: bool,
}

/// Audit records a slow live subscriber may fall behind by before it misses some.
const LIVE_BUFFER: usize = 256;

/// Identity of one response, for its audit record.
#[derive(Debug, Clone)]
pub struct ResponseRecord {
    pub audit_id: uuid::Uuid,
    pub tenant: String,
    pub model: String,
    pub request_id: String,
}

impl Protection {
    /// Opens the store, loads the statistics and builds the detectors.
    pub async fn open(config: &Config) -> Result<Protection, ProtectionError> {
        let p = &config.provenance;
        let key = match p.key {
            Some(k) => k,
            None => local_key(&config.data_dir.join("fingerprint.key"))?,
        };
        let (store, replica) = match &config.store {
            StoreConfig::Memory { audit_max_len } => {
                (Store::memory(&config.data_dir, *audit_max_len, &config.responses)?, "local".to_owned())
            }
            StoreConfig::Redis(r) => {
                let mut settings = RedisSettings::new(r.url.clone(), config.data_dir.clone());
                settings.key_prefix = r.key_prefix.clone();
                settings.audit_max_len = r.audit_max_len as u64;
                settings.op_timeout_ms = r.op_timeout_ms;
                settings.fingerprint_ttl_secs = p.ttl_secs;
                if let Some(id) = &r.replica_id {
                    settings.replica_id = id.clone();
                }
                let replica = settings.replica_id.clone();
                (Store::redis(settings).await?, replica)
            }
        };
        let mut settings = ProvenanceSettings::new(NgramKey(key));
        settings.ngram_words = p.ngram_words;
        settings.ttl_secs = p.ttl_secs;
        settings.max_hashes = p.max_hashes;
        settings.max_tenant_share = p.max_tenant_share;
        settings.max_hashes_per_text = p.max_hashes_per_text;
        let index = Arc::new(ProvenanceIndex::new(settings, replica));
        let snapshot =
            matches!(config.store, StoreConfig::Memory { .. }).then(|| config.data_dir.join("fingerprints.idx"));
        if let Some(path) = &snapshot {
            match index.load(path) {
                Ok(n) => tracing::info!(entries = n, "provenance index reloaded"),
                // Not fatal: the index refills from new traffic; the bad file is overwritten.
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "provenance snapshot not loaded; starting empty")
                }
            }
        }
        let stats = Arc::new(Statistics::new(StatsSettings { min_samples: config.stats.min_samples }));
        let store = Arc::new(store);
        if let Err(e) = stats.sync(&store).await {
            tracing::warn!(error = %e, "statistics not loaded from the store yet; starting from local state");
        }
        if let Err(e) = index.refresh(&store).await {
            tracing::warn!(error = %e, "fingerprints not loaded from the store yet; starting from local state");
        }

        let mut ngram = NgramConfig::new(NgramKey(key), index.clone());
        ngram.n = p.ngram_words;
        ngram.common_at = p.common_at;
        ngram.tokens = p.foreign_tokens;
        ngram.rewrites = config.firewall.read_encoded;
        let mut entropy = EntropyConfig::new(stats.clone());
        entropy.z_threshold = config.stats.z_threshold;
        entropy.action = config.stats.action;
        let secrets = SecretOwnership { key: NgramKey(key), owners: index.clone() };
        let detectors = Detectors {
            ngram: Some(ngram),
            entropy: Some(entropy),
            provenance: Some(ProvenanceConfig::default()),
            secrets: Some(secrets),
            decode: config.firewall.read_encoded.then(DecodeConfig::default),
        };

        let policies = config
            .tenants
            .iter()
            .map(|t| {
                (
                    t.id.clone(),
                    TenantPolicy {
                        fail_mode: t.fail_mode,
                        own_secrets: t.own_secrets,
                        quarantine_when_probing: t.quarantine_when_probing,
                    },
                )
            })
            .collect();
        let probes = ProbeWatch::new(ProbeSettings {
            alert_blocks: config.firewall.probe_alert_blocks,
            window_ms: config.firewall.probe_window_secs.saturating_mul(1000),
        });
        Ok(Protection {
            store,
            index,
            stats,
            detectors: Arc::new(detectors),
            canaries: Canaries::new(config, &key),
            policies,
            probes,
            snapshot,
            max_staleness_ms: p.max_staleness_ms,
            when_stale: p.unavailable,
            written: tokio::sync::broadcast::channel(LIVE_BUFFER).0,
        })
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    pub fn index(&self) -> &ProvenanceIndex {
        &self.index
    }

    pub fn stats(&self) -> &Statistics {
        &self.stats
    }

    /// `/metrics` families of the index, the statistics, the probing watch and the store.
    pub fn write_metrics(&self, out: &mut Exposition) {
        self.index.write_metrics(out);
        crate::store::retention::write_metrics(out, &self.store.audit_evictions());
        self.stats.write_metrics(out);
        self.probes.write_metrics(out, crate::store::now_ms());
        let h = self.store.health();
        out.family(
            "crossguard_store_degraded",
            Kind::Gauge,
            "1 while the shared store is unreachable (serving from local state).",
        )
        .sample(&[("kind", h.kind)], u8::from(h.degraded));
        out.family("crossguard_audit_buffered", Kind::Gauge, "Audit records held locally, waiting for the store.")
            .sample(&[], h.buffered_audit);
        out.family(
            "crossguard_fingerprints_buffered",
            Kind::Gauge,
            "Fingerprint batches held locally, waiting for the store.",
        )
        .sample(&[], h.buffered_fingerprints);
        out.family(
            "crossguard_provenance_stale",
            Kind::Gauge,
            "1 while other replicas' fingerprints are older than provenance.max_staleness_ms.",
        )
        .sample(&[], u8::from(self.provenance_stale().is_some()));
    }

    /// Why other replicas' fingerprints cannot be trusted now: not pulled for longer than
    /// `provenance.max_staleness_ms`, or never since start. `None` with the embedded store
    /// (there are no other replicas) and while they are fresh.
    pub fn provenance_stale(&self) -> Option<String> {
        if matches!(*self.store, Store::Memory(_)) {
            return None;
        }
        match self.index.last_pulled_ms() {
            None => Some("other replicas' fingerprints have not been loaded from the shared store yet".to_owned()),
            Some(at) => {
                let age = crate::store::now_ms().saturating_sub(at);
                (age > self.max_staleness_ms)
                    .then(|| format!("other replicas' fingerprints were last pulled {age} ms ago, past provenance.max_staleness_ms ({})", self.max_staleness_ms))
            }
        }
    }

    /// Whether a stale index refuses requests (and makes the replica not ready).
    pub fn blocks_when_stale(&self) -> bool {
        self.when_stale == ProvenanceUnavailable::Block
    }

    /// Why `tenant`'s completion must be refused before it starts: the index is stale,
    /// `provenance.provenance_unavailable = "block"`, and the tenant fails closed (a tenant with
    /// `fail_mode = "open"` chose availability over scanning and is served).
    pub fn refusal_when_stale(&self, tenant: &str) -> Option<String> {
        if !self.blocks_when_stale() || self.fail_mode(tenant) == FailMode::Open {
            return None;
        }
        self.provenance_stale()
    }

    pub fn detectors(&self) -> Arc<Detectors> {
        self.detectors.clone()
    }

    pub fn fail_mode(&self, tenant: &str) -> FailMode {
        self.policy(tenant).fail_mode
    }

    /// What happens to `tenant`'s own secrets echoed back to it.
    pub fn own_secrets(&self, tenant: &str) -> OwnSecrets {
        self.policy(tenant).own_secrets
    }

    /// Whose response the firewall scans, with the tenant's verdict on its own secrets.
    pub fn scan_context(&self, tenant: &str) -> ScanContext {
        ScanContext { own_secrets: self.own_secrets(tenant).action(), ..ScanContext::new(tenant) }
    }

    fn policy(&self, tenant: &str) -> TenantPolicy {
        self.policies.get(tenant).copied().unwrap_or_default()
    }

    /// Whether `tenant`'s requests are refused now: it is flagged for probing and its config
    /// quarantines it then.
    pub fn quarantined(&self, tenant: &str) -> bool {
        self.policy(tenant).quarantine_when_probing && self.probes.is_flagged(tenant, crate::store::now_ms())
    }

    /// Per-tenant foreign-data blocks and probing flags (this replica).
    pub fn probes(&self) -> &ProbeWatch {
        &self.probes
    }

    /// The injected canaries, one per tenant that has one (sorted by tenant), to load with
    /// the rules.
    pub fn injected_canaries(&self) -> Vec<firewall::RawCanary> {
        self.canaries.as_rule_canaries()
    }

    /// Before the backend runs: injects the tenant's canary and fingerprints the prompt (its
    /// n-grams, and the secret values `rules` find in it).
    pub fn on_request(self: &Arc<Self>, tenant: &str, request: &mut ChatRequest, rules: &Ruleset) {
        self.canaries.inject(tenant, request);
        self.record(tenant, Role::Sent, &request.prompt_text(), rules);
    }

    /// Indexes `text` under `tenant` now (n-grams, and whole: secret values and tokens),
    /// with what its encoded runs say when responses are read decoded; shares the new
    /// hashes in the background.
    fn record(self: &Arc<Self>, tenant: &str, role: Role, text: &str, rules: &Ruleset) {
        let key = self.index.settings().key;
        let decoded = match &self.detectors.decode {
            Some(cfg) => firewall::decoded_texts(text, cfg),
            None => Vec::new(),
        };
        let (mut secrets, mut ngrams) = (Vec::new(), Vec::new());
        for text in std::iter::once(text).chain(decoded.iter().map(String::as_str)) {
            let (words, tokens) = firewall::fingerprints_and_tokens(text, &key, self.index.settings().ngram_words);
            secrets.extend(firewall::secret_fingerprints(rules, text, &key));
            secrets.extend(tokens);
            ngrams.extend(words);
        }
        let Some(batch) = self.index.record_hashes(tenant, role, secrets, ngrams) else { return };
        if matches!(*self.store, Store::Memory(_)) {
            return;
        }
        let store = self.store.clone();
        spawn(async move {
            // Shared now or spooled durably (sent until acknowledged); only a disk failure lands here.
            if let Err(e) = store.append_fingerprints(&batch).await {
                tracing::error!(error = %e, tenant = batch.tenant, hashes = batch.hashes.len(), "fingerprints neither shared nor spooled");
            }
        });
    }

    /// After the response: learns from what was released (its audit record is the
    /// response guard's to build).
    pub fn on_response(self: &Arc<Self>, tenant: &str, guard: &ResponseGuard) {
        for text in guard.released_texts() {
            self.record(tenant, Role::Received, text, guard.rules());
        }
        for obs in guard.observations() {
            self.stats.observe(tenant, &obs);
        }
        if guard.findings().iter().any(|f| is_foreign_block(&f.finding))
            && self.probes.observe_foreign_block(tenant, crate::store::now_ms())
        {
            tracing::warn!(
                tenant,
                quarantined = self.policy(tenant).quarantine_when_probing,
                "tenant flagged for probing: too many responses blocked for other tenants' data"
            );
        }
    }

    /// Writes `record` to the audit log; `Ok` once it is durable (and then announced to
    /// [`Protection::subscribe`]rs).
    pub async fn audit(&self, record: &AuditRecord) -> Result<(), StoreError> {
        self.store.append_audit(record).await?;
        // No subscriber is not an error.
        let _ = self.written.send(Arc::new(record.clone()));
        Ok(())
    }

    /// Audit records as this replica writes them, from now on (a lagging receiver is told
    /// how many it missed).
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<AuditRecord>> {
        self.written.subscribe()
    }

    /// Writes `record` in the background (a stream that already ended cannot wait).
    pub fn audit_later(self: &Arc<Self>, record: AuditRecord) {
        let me = self.clone();
        spawn(async move {
            if let Err(e) = me.audit(&record).await {
                tracing::error!(error = %e, audit_id = record.id(), "audit record could not be written");
            }
        });
    }
}
