//! The store: where fingerprints, statistics, audit records and stored Responses API
//! responses live beyond one request.
//!
//! One interface ([`Store`]), two implementations: [`memory::MemoryStore`] (embedded, the
//! default: in process, audit log appended to `<data_dir>/audit.jsonl`) and
//! [`redis::RedisStore`] (shared between gateway replicas). Nothing here is on the token
//! path: the provenance index and the statistics answer the firewall from memory and use
//! the store only to persist and to share, asynchronously.
//!
//! Invariants: every audit record accepted by [`Store::append_audit`] is durable (fsync'd
//! to a local file or acknowledged by Redis) before the call returns `Ok`; fingerprints are
//! keyed hashes, never text.

pub mod journal;
pub mod memory;
pub mod redis;
pub mod responses;
pub mod retention;
mod spool;

use std::path::PathBuf;
use std::time::Duration;

use serde::Serialize;

use crate::audit::{AuditPage, AuditQuery, AuditRecord};

pub use self::memory::MemoryStore;
pub use self::redis::{RedisSettings, RedisStore};
pub use self::retention::AuditEviction;

/// What can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("redis unavailable: {0}")]
    Unavailable(String),
    #[error("redis operation timed out after {ms} ms")]
    Timeout { ms: u64 },
    #[error("redis returned an unexpected reply: {0}")]
    BadReply(String),
    #[error("audit cursor {0:?} is not one this store issued")]
    BadCursor(String),
}

/// Keyed n-gram hashes one tenant sent or received, valid until `expires_at_s`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct FingerprintBatch {
    pub tenant: String,
    /// Seconds since the Unix epoch.
    pub expires_at_s: u64,
    /// The replica that recorded it (lets a replica skip its own batches on refresh).
    pub replica: String,
    /// How the tenant came to own these n-grams.
    pub role: Role,
    pub hashes: Vec<u64>,
}

/// How a tenant owns an n-gram.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// It was in a prompt the tenant sent: the tenant's own data.
    #[default]
    Sent,
    /// It was only in a response the tenant received: the model's words, which may be
    /// everyone's boilerplate; never enough on its own to call text foreign.
    Received,
}

/// Where a fingerprint reader stopped; opaque. `Default` = from the oldest live batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FingerprintCursor(pub(crate) String);

/// One bounded page of fingerprint batches.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FingerprintPage {
    /// Live batches, oldest first.
    pub batches: Vec<FingerprintBatch>,
    /// Where the next page starts.
    pub next: FingerprintCursor,
    /// Whether more may follow right away (the page was full).
    pub more: bool,
}

/// A running count, mean and sum of squared deviations (Welford), mergeable (Chan et al.).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Welford {
    pub count: u64,
    pub mean: f64,
    /// Sum of squared deviations from the mean.
    pub m2: f64,
}

impl Welford {
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Folds `other` in, as if its observations had been added here.
    pub fn merge(&mut self, other: &Welford) {
        if other.count == 0 {
            return;
        }
        let n = self.count + other.count;
        let d = other.mean - self.mean;
        let (n1, n2, nf) = (self.count as f64, other.count as f64, n as f64);
        self.mean += d * n2 / nf;
        self.m2 += other.m2 + d * d * n1 * n2 / nf;
        self.count = n;
    }

    /// Sample variance (0 with fewer than two observations).
    pub fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.m2 / (self.count - 1) as f64
        }
    }

    /// From the firewall's per-stream accumulator (which exposes the variance, not m2).
    pub fn from_observed(o: &firewall::Observed) -> Welford {
        Welford { count: o.count, mean: o.mean, m2: o.variance() * o.count.saturating_sub(1) as f64 }
    }
}

/// One tenant's running statistic for one metric.
#[derive(Debug, Clone, PartialEq)]
pub struct StatEntry {
    pub tenant: String,
    pub metric: firewall::Metric,
    pub value: Welford,
}

/// Whether the store is fully working.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Health {
    /// `memory` or `redis`.
    pub kind: &'static str,
    /// True when the gateway runs from local state only (Redis unreachable).
    pub degraded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Audit records held locally, waiting for Redis.
    pub buffered_audit: u64,
    /// Fingerprint batches held locally, waiting for Redis.
    pub buffered_fingerprints: u64,
}

/// The gateway's store. An enum rather than a trait object: two implementations, known
/// at compile time, with async methods. One per process, so variant sizes do not matter.
#[allow(clippy::large_enum_variant)]
pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// The embedded store under `data_dir`, keeping the newest `max_records` audit records
    /// in memory for listing (all of them stay in the file).
    pub fn memory(
        data_dir: &std::path::Path,
        max_records: usize,
        responses: &crate::config::ResponsesConfig,
    ) -> Result<Store, StoreError> {
        MemoryStore::open(data_dir, max_records, responses).map(Store::Memory)
    }

    /// The Redis store; starts degraded (not failed) when Redis is unreachable.
    pub async fn redis(settings: RedisSettings) -> Result<Store, StoreError> {
        RedisStore::open(settings).await.map(Store::Redis)
    }

    /// Saves fingerprints so other replicas see them; `Ok` once Redis acknowledged them or
    /// the local spool holds them (sent later, until acknowledged). The embedded store keeps
    /// none: the local provenance index is the only copy.
    pub async fn append_fingerprints(&self, batch: &FingerprintBatch) -> Result<(), StoreError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.append_fingerprints(batch).await,
        }
    }

    /// One bounded page of the batches recorded after `cursor` that have not expired. The
    /// embedded store has none.
    pub async fn read_fingerprints(&self, cursor: &FingerprintCursor) -> Result<FingerprintPage, StoreError> {
        match self {
            Store::Memory(_) => Ok(FingerprintPage { next: cursor.clone(), ..FingerprintPage::default() }),
            Store::Redis(r) => r.read_fingerprints(cursor).await,
        }
    }

    /// Folds per-tenant deltas into the stored statistics.
    pub async fn merge_stats(&self, deltas: &[StatEntry]) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => m.merge_stats(deltas).await,
            Store::Redis(r) => r.merge_stats(deltas).await,
        }
    }

    /// Every tenant's stored statistics.
    pub async fn load_stats(&self) -> Result<Vec<StatEntry>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.load_stats()),
            Store::Redis(r) => r.load_stats().await,
        }
    }

    /// Appends one record; `Ok` means it is durable (locally or in Redis).
    pub async fn append_audit(&self, record: &AuditRecord) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => m.append_audit(record).await,
            Store::Redis(r) => r.append_audit(record).await,
        }
    }

    /// Records matching `query`, newest first.
    pub async fn list_audit(&self, query: &AuditQuery) -> Result<AuditPage, StoreError> {
        match self {
            Store::Memory(m) => m.list_audit(query),
            Store::Redis(r) => r.list_audit(query).await,
        }
    }

    pub async fn get_audit(&self, id: &str) -> Result<Option<AuditRecord>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.get_audit(id)),
            Store::Redis(r) => r.get_audit(id).await,
        }
    }

    /// Keeps a Responses API response (its JSON) for `ttl_secs`, under (tenant, id).
    pub async fn put_response(&self, tenant: &str, id: &str, json: String, ttl_secs: u64) -> Result<(), StoreError> {
        match self {
            Store::Memory(m) => {
                m.put_response(tenant, id, json, ttl_secs);
                Ok(())
            }
            Store::Redis(r) => r.put_response(tenant, id, json, ttl_secs).await,
        }
    }

    /// The response `tenant` stored under `id`; another tenant's is never found.
    pub async fn get_response(&self, tenant: &str, id: &str) -> Result<Option<String>, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.get_response(tenant, id)),
            Store::Redis(r) => r.get_response(tenant, id).await,
        }
    }

    /// Deletes the response `tenant` stored under `id`; whether there was one.
    pub async fn delete_response(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        match self {
            Store::Memory(m) => Ok(m.delete_response(tenant, id)),
            Store::Redis(r) => r.delete_response(tenant, id).await,
        }
    }

    /// Audit records evicted to keep the log within its cap, per tenant and severity (Redis:
    /// every replica's, as of the last upkeep).
    pub fn audit_evictions(&self) -> Vec<AuditEviction> {
        match self {
            Store::Memory(m) => m.audit_evictions(),
            Store::Redis(r) => r.audit_evictions(),
        }
    }

    pub fn health(&self) -> Health {
        match self {
            Store::Memory(_) => {
                Health { kind: "memory", degraded: false, reason: None, buffered_audit: 0, buffered_fingerprints: 0 }
            }
            Store::Redis(r) => r.health(),
        }
    }

    /// Background upkeep: reconnects to Redis and flushes buffered audit records. Call
    /// every second or so (see [`spawn_upkeep`]); cheap when there is nothing to do.
    pub async fn upkeep(&self) {
        if let Store::Redis(r) = self {
            r.upkeep().await;
        }
    }
}

/// Runs [`Store::upkeep`] every `every` until the store is dropped everywhere else.
pub fn spawn_upkeep(store: std::sync::Arc<Store>, every: Duration) -> tokio::task::JoinHandle<()> {
    let weak = std::sync::Arc::downgrade(&store);
    drop(store);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(store) = weak.upgrade() else { return };
            store.upkeep().await;
        }
    })
}

/// Milliseconds since the Unix epoch (0 before it).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn welford_merge_equals_one_pass() {
        let xs: Vec<f64> = (0..50).map(|i| ((i * 37) % 11) as f64 * 0.7 + 1.0).collect();
        let mut all = Welford::default();
        xs.iter().for_each(|&x| all.add(x));
        let (mut a, mut b) = (Welford::default(), Welford::default());
        xs[..13].iter().for_each(|&x| a.add(x));
        xs[13..].iter().for_each(|&x| b.add(x));
        a.merge(&b);
        assert_eq!(a.count, all.count);
        assert!((a.mean - all.mean).abs() < 1e-12 && (a.variance() - all.variance()).abs() < 1e-9);
        let mut empty = Welford::default();
        empty.merge(&all);
        assert_eq!(empty, all);
    }

    #[test]
    fn welford_from_the_firewalls_accumulator() {
        let mut o = firewall::Observed::default();
        let mut w = Welford::default();
        for x in [1.0, 2.0, 4.0, 8.0] {
            o.add(x);
            w.add(x);
        }
        let c = Welford::from_observed(&o);
        assert_eq!(c.count, 4);
        assert!((c.mean - w.mean).abs() < 1e-12 && (c.m2 - w.m2).abs() < 1e-9);
    }
}
