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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use firewall::{
    Detectors, EntropyConfig, NgramConfig, NgramKey, ProvenanceConfig, Ruleset, ScanContext, SecretOwnership,
};
use sha2::{Digest, Sha256};

use crate::api::ChatRequest;
use crate::audit::AuditRecord;
use crate::config::{CanaryPlacement, Config, FailMode, OwnSecrets, ProvenanceUnavailable, StoreConfig};
use crate::metrics::{Exposition, Kind};
use crate::probing::{is_foreign_block, ProbeSettings, ProbeWatch};
use crate::provenance::{ProvenanceIndex, ProvenanceSettings};
use crate::response_guard::ResponseGuard;
use crate::stats::{Statistics, StatsSettings};
use crate::store::{spawn_upkeep, RedisSettings, Role, Store, StoreError};

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
    /// Tenant id -> its honeytoken, for tenants with `canary = true`.
    canaries: HashMap<String, String>,
    canary_text: String,
    canary_placement: CanaryPlacement,
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

/// How often the embedded store's provenance index is snapshotted (and at shutdown).
const SNAPSHOT_EVERY: Duration = Duration::from_secs(30);

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
        let mut entropy = EntropyConfig::new(stats.clone());
        entropy.z_threshold = config.stats.z_threshold;
        entropy.action = config.stats.action;
        let secrets = SecretOwnership { key: NgramKey(key), owners: index.clone() };
        let detectors = Detectors {
            ngram: Some(ngram),
            entropy: Some(entropy),
            provenance: Some(ProvenanceConfig::default()),
            secrets: Some(secrets),
        };

        let canaries =
            config.tenants.iter().filter(|t| t.canary).map(|t| (t.id.clone(), honeytoken(&key, &t.id))).collect();
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
            canaries,
            canary_text: config.canary.text.clone(),
            canary_placement: config.canary.placement,
            policies,
            probes,
            snapshot,
            max_staleness_ms: p.max_staleness_ms,
            when_stale: p.unavailable,
            written: tokio::sync::broadcast::channel(LIVE_BUFFER).0,
        })
    }

    /// Snapshots the provenance index if this store keeps one and it changed.
    fn save_index(&self) {
        let Some(path) = &self.snapshot else { return };
        if let Err(e) = self.index.save(path) {
            tracing::warn!(path = %path.display(), error = %e, "provenance snapshot not written");
        }
    }

    /// Starts the background work: store upkeep (Redis reconnects, audit spool flushes),
    /// pulling other replicas' fingerprints, merging statistics. The tasks end when the
    /// protection is dropped.
    pub fn spawn_background(self: &Arc<Self>, config: &Config) {
        spawn_upkeep(self.store.clone(), Duration::from_secs(1));
        if matches!(config.store, StoreConfig::Redis(_)) {
            every(Arc::downgrade(self), Duration::from_millis(config.provenance.refresh_interval_ms), |p| async move {
                if let Err(e) = p.index.refresh(&p.store).await {
                    tracing::debug!(error = %e, "fingerprint refresh failed");
                }
            });
        }
        if self.snapshot.is_some() {
            every(Arc::downgrade(self), SNAPSHOT_EVERY, |p| async move {
                let _ = tokio::task::spawn_blocking(move || p.save_index()).await;
            });
        }
        every(Arc::downgrade(self), Duration::from_millis(config.stats.sync_interval_ms), |p| async move {
            if let Err(e) = p.stats.sync(&p.store).await {
                tracing::debug!(error = %e, "statistics sync failed");
            }
        });
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
        let mut tenants: Vec<(&String, &String)> = self.canaries.iter().collect();
        tenants.sort();
        tenants
            .into_iter()
            .enumerate()
            .map(|(i, (tenant, token))| firewall::RawCanary {
                id: format!("injected-canary-{}", i + 1),
                owner: tenant.clone(),
                strings: vec![token.clone()],
                description: Some(format!("the canary injected into {tenant}'s system prompts")),
            })
            .collect()
    }

    /// Before the backend runs: injects the tenant's canary and fingerprints the prompt (its
    /// n-grams, and the secret values `rules` find in it).
    pub fn on_request(self: &Arc<Self>, tenant: &str, request: &mut ChatRequest, rules: &Ruleset) {
        if let Some(token) = self.canaries.get(tenant) {
            let line = self.canary_text.replace("{canary}", token);
            request.add_system_line(&line, self.canary_placement == CanaryPlacement::SystemStart);
        }
        self.record(tenant, Role::Sent, &request.prompt_text(), rules);
    }

    /// Indexes `text` under `tenant` now (n-grams and secret values); shares the new hashes
    /// in the background.
    fn record(self: &Arc<Self>, tenant: &str, role: Role, text: &str, rules: &Ruleset) {
        let key = self.index.settings().key;
        let ngrams = firewall::fingerprints(text, &key, self.index.settings().ngram_words);
        let secrets = firewall::secret_fingerprints(rules, text, &key);
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

/// The tenant's honeytoken: derived from the deployment key, so stable across restarts
/// and replicas, and unguessable without the key.
fn honeytoken(key: &[u8; 16], tenant: &str) -> String {
    let digest =
        Sha256::new().chain_update(b"crossguard canary\0").chain_update(key).chain_update(tenant.as_bytes()).finalize();
    format!("cg-{}", hex::encode(&digest[..12]))
}

/// The embedded deployment's fingerprint key: read from `path`, created (random, owner
/// read-only) on first start.
fn local_key(path: &Path) -> Result<[u8; 16], ProtectionError> {
    let err = |reason: String| ProtectionError::Key { path: path.display().to_string(), reason };
    match std::fs::read_to_string(path) {
        Ok(text) => hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .ok_or_else(|| err("does not hold 32 hexadecimal characters; delete it to make a new key".into())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| err(format!("cannot create its folder: {e}")))?;
            }
            // Two v4 UUIDs hold 244 random bits (OS-seeded); hashing them gives 128 uniform ones.
            let digest = Sha256::new()
                .chain_update(uuid::Uuid::new_v4().as_bytes())
                .chain_update(uuid::Uuid::new_v4().as_bytes())
                .finalize();
            let mut key = [0u8; 16];
            key.copy_from_slice(&digest[..16]);
            write_private(path, &hex::encode(key)).map_err(|e| err(format!("cannot write: {e}")))?;
            Ok(key)
        }
        Err(e) => Err(err(format!("cannot read: {e}"))),
    }
}

impl Drop for Protection {
    /// The last snapshot, at shutdown.
    fn drop(&mut self) {
        self.save_index();
    }
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Runs `work` every `period` while `target` is alive.
pub(crate) fn every<T, F, Fut>(target: Weak<T>, period: Duration, work: F)
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(p) = target.upgrade() else { return };
            work(p).await;
        }
    });
}

/// Spawns on the current runtime; a response dropped outside one (shutdown) records nothing.
fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn honeytokens_are_per_tenant_and_per_key() {
        let a = honeytoken(&[1; 16], "acme");
        assert_eq!(a, honeytoken(&[1; 16], "acme"));
        assert_ne!(a, honeytoken(&[1; 16], "globex"));
        assert_ne!(a, honeytoken(&[2; 16], "acme"));
        assert_eq!(a.len(), 27);
    }

    #[test]
    fn the_local_key_is_made_once_and_kept_private() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/fingerprint.key");
        let first = local_key(&path).unwrap();
        assert_eq!(first, local_key(&path).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        std::fs::write(&path, "nope").unwrap();
        assert!(local_key(&path).unwrap_err().to_string().contains("32 hexadecimal"));
    }
}
