//! The embedded store (the default): everything in process memory, made durable where it
//! must survive a restart.
//!
//! - Audit records: in memory (at most `max_records`, for listing, kept per tenant and
//!   severity by [`crate::store::retention`]) and appended to
//!   `<data_dir>/audit.jsonl` (fsync'd per record) before `append_audit` returns; the file is
//!   reloaded at open, so no acknowledged record is lost on restart.
//! - Statistics: in memory, snapshotted to `<data_dir>/stats.json` (write to a temporary
//!   file, then rename) on every merge, reloaded at open.
//! - Stored Responses API responses: in memory only (`store::responses`).
//! - Fingerprints: none here; the local provenance index is the only copy (see
//!   [`crate::store::Store::append_fingerprints`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use serde::{Deserialize, Serialize};

use crate::audit::{metric_from_name, metric_name, AuditPage, AuditQuery, AuditRecord};
use crate::config::ResponsesConfig;
use crate::store::journal::Journal;
use crate::store::responses::ResponseShelf;
use crate::store::retention::{AuditEviction, Class, Retention};
use crate::store::{now_ms, StatEntry, StoreError, Welford};

/// Records kept in memory for listing when none is configured.
pub const DEFAULT_MAX_RECORDS: usize = 100_000;

/// The audit records held for listing, each with a sequence number (the cursor), at most
/// `max_records` of them; past it, [`Retention`] picks which goes.
#[derive(Debug, Default)]
pub(crate) struct AuditLog {
    // seq -> record; seq grows by one per append
    records: BTreeMap<u64, AuditRecord>,
    by_id: HashMap<String, u64>,
    retention: Retention,
    next_seq: u64,
    max_records: usize,
}

impl AuditLog {
    pub(crate) fn new(max_records: usize) -> AuditLog {
        AuditLog { max_records: max_records.max(1), ..AuditLog::default() }
    }

    pub(crate) fn push(&mut self, r: AuditRecord) {
        if self.by_id.contains_key(r.id()) {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.by_id.insert(r.id().to_owned(), seq);
        self.retention.add(Class::of(&r), seq);
        self.records.insert(seq, r);
        while self.records.len() > self.max_records {
            let Some(old) = self.retention.evict().and_then(|seq| self.records.remove(&seq)) else { break };
            self.by_id.remove(old.id());
        }
    }

    pub(crate) fn get(&self, id: &str) -> Option<&AuditRecord> {
        self.records.get(self.by_id.get(id)?)
    }

    /// Newest first, after the cursor (a sequence number from an earlier page).
    pub(crate) fn list(&self, q: &AuditQuery) -> Result<AuditPage, StoreError> {
        let before = match &q.cursor {
            None => u64::MAX,
            Some(c) => c.parse::<u64>().map_err(|_| StoreError::BadCursor(c.clone()))?,
        };
        let limit = q.page_size();
        let mut page = AuditPage::default();
        let mut last_seq = None;
        for (seq, r) in self.records.range(..before).rev() {
            if page.records.len() == limit {
                page.next_cursor = last_seq.map(|s: u64| s.to_string());
                break;
            }
            last_seq = Some(*seq);
            if q.matches(r) {
                page.records.push(r.clone());
            }
        }
        Ok(page)
    }

    pub(crate) fn evictions(&self) -> Vec<AuditEviction> {
        self.retention.evictions()
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }
}

/// One line of `stats.json`.
#[derive(Debug, Serialize, Deserialize)]
struct StatLine {
    tenant: String,
    metric: String,
    #[serde(flatten)]
    value: Welford,
}

/// The embedded store.
#[derive(Debug)]
pub struct MemoryStore {
    journal: Journal,
    audit: RwLock<AuditLog>,
    stats: Mutex<HashMap<(String, firewall::Metric), Welford>>,
    stats_path: PathBuf,
    responses: Mutex<ResponseShelf>,
}

impl MemoryStore {
    /// Opens the store under `data_dir`, reloading the audit log and statistics.
    pub fn open(data_dir: &Path, max_records: usize, responses: &ResponsesConfig) -> Result<MemoryStore, StoreError> {
        let (journal, records) = Journal::open(&data_dir.join("audit.jsonl"))?;
        let mut audit = AuditLog::new(max_records);
        records.into_iter().for_each(|r| audit.push(r));
        let stats_path = data_dir.join("stats.json");
        let stats = load_stats_file(&stats_path)?;
        let responses = Mutex::new(ResponseShelf::new(responses.max_stored, responses.max_stored_bytes));
        Ok(MemoryStore { journal, audit: RwLock::new(audit), stats: Mutex::new(stats), stats_path, responses })
    }

    pub fn put_response(&self, tenant: &str, id: &str, json: String, ttl_secs: u64) {
        let expires_at_ms = now_ms().saturating_add(ttl_secs.saturating_mul(1000));
        // The caller keeps records within the byte bound; one over it is simply not kept.
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).put(tenant, id, json, expires_at_ms);
    }

    pub fn get_response(&self, tenant: &str, id: &str) -> Option<String> {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).get(tenant, id, now_ms())
    }

    pub fn delete_response(&self, tenant: &str, id: &str) -> bool {
        self.responses.lock().unwrap_or_else(|p| p.into_inner()).delete(tenant, id, now_ms())
    }

    pub async fn append_audit(&self, record: &AuditRecord) -> Result<(), StoreError> {
        self.journal.append(vec![record.clone()]).await?;
        self.audit.write().unwrap_or_else(|p| p.into_inner()).push(record.clone());
        Ok(())
    }

    pub fn list_audit(&self, q: &AuditQuery) -> Result<AuditPage, StoreError> {
        self.audit.read().unwrap_or_else(|p| p.into_inner()).list(q)
    }

    pub fn get_audit(&self, id: &str) -> Option<AuditRecord> {
        self.audit.read().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub fn audit_evictions(&self) -> Vec<AuditEviction> {
        self.audit.read().unwrap_or_else(|p| p.into_inner()).evictions()
    }

    pub async fn merge_stats(&self, deltas: &[StatEntry]) -> Result<(), StoreError> {
        let lines: Vec<StatLine> = {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            for d in deltas {
                stats.entry((d.tenant.clone(), d.metric)).or_default().merge(&d.value);
            }
            stats
                .iter()
                .map(|((tenant, metric), value)| StatLine {
                    tenant: tenant.clone(),
                    metric: metric_name(*metric).into(),
                    value: *value,
                })
                .collect()
        };
        let path = self.stats_path.clone();
        tokio::task::spawn_blocking(move || write_stats_file(&path, &lines))
            .await
            .map_err(|e| StoreError::Io { path: self.stats_path.clone(), source: std::io::Error::other(e) })?
    }

    pub fn load_stats(&self) -> Vec<StatEntry> {
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats
            .iter()
            .map(|((tenant, metric), value)| StatEntry { tenant: tenant.clone(), metric: *metric, value: *value })
            .collect()
    }
}

fn load_stats_file(path: &Path) -> Result<HashMap<(String, firewall::Metric), Welford>, StoreError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(source) => return Err(StoreError::Io { path: path.to_owned(), source }),
    };
    let lines: Vec<StatLine> = match serde_json::from_slice(&text) {
        Ok(l) => l,
        Err(e) => {
            // Statistics rebuild themselves from traffic; a bad snapshot is not fatal.
            tracing::warn!(path = %path.display(), error = %e, "ignoring unreadable statistics snapshot");
            Vec::new()
        }
    };
    Ok(lines.into_iter().filter_map(|l| Some(((l.tenant, metric_from_name(&l.metric)?), l.value))).collect())
}

fn write_stats_file(path: &Path, lines: &[StatLine]) -> Result<(), StoreError> {
    let io = |source| StoreError::Io { path: path.to_owned(), source };
    let tmp = path.with_extension("json.tmp");
    let bytes = serde_json::to_vec(lines).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::tests::{ctx, finding};
    use firewall::{Action, Detail, Metric, Severity};

    fn rec(tenant: &str, time_ms: u64, action: Action) -> AuditRecord {
        AuditRecord::at(
            time_ms,
            ctx(tenant),
            action,
            &[finding("aws-access-key", "AKIA******** (20 chars)", Detail::None)],
        )
    }

    #[tokio::test]
    async fn audit_records_and_stats_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = MemoryStore::open(dir.path(), 10, &ResponsesConfig::default()).unwrap();
        let records: Vec<_> = (0..3).map(|i| rec("acme", 1000 + i, Action::Block)).collect();
        for r in &records {
            store.append_audit(r).await.unwrap();
        }
        let delta = StatEntry {
            tenant: "acme".into(),
            metric: Metric::Surprisal,
            value: Welford { count: 3, mean: 2.0, m2: 1.5 },
        };
        store.merge_stats(&[delta.clone(), delta.clone()]).await.unwrap();
        drop(store);

        let store = MemoryStore::open(dir.path(), 10, &ResponsesConfig::default()).unwrap();
        assert_eq!(store.get_audit(records[1].id()).as_ref(), Some(&records[1]));
        let page = store.list_audit(&AuditQuery::default()).unwrap();
        assert_eq!(page.records.iter().map(|r| r.time_ms()).collect::<Vec<_>>(), [1002, 1001, 1000]);
        let stats = store.load_stats();
        assert_eq!(stats.len(), 1);
        assert_eq!((stats[0].value.count, stats[0].value.mean), (6, 2.0));
    }

    #[test]
    fn listing_filters_and_pages_newest_first() {
        let mut log = AuditLog::new(100);
        for i in 0..10u64 {
            let tenant = if i % 2 == 0 { "acme" } else { "globex" };
            log.push(rec(tenant, i, if i < 5 { Action::Block } else { Action::Redact }));
        }
        let q = AuditQuery { tenant: Some("acme".into()), limit: 2, ..Default::default() };
        let mut times = Vec::new();
        let mut cursor = None;
        loop {
            let page = log.list(&AuditQuery { cursor: cursor.clone(), ..q.clone() }).unwrap();
            times.extend(page.records.iter().map(|r| r.time_ms()));
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(times, [8, 6, 4, 2, 0]);
        let q = AuditQuery { action: Some(Action::Block), since_ms: Some(2), ..Default::default() };
        assert_eq!(log.list(&q).unwrap().records.iter().map(|r| r.time_ms()).collect::<Vec<_>>(), [4, 3, 2]);
        assert!(matches!(
            log.list(&AuditQuery { cursor: Some("x".into()), ..Default::default() }),
            Err(StoreError::BadCursor(_))
        ));
    }

    #[test]
    fn memory_is_bounded_and_duplicates_are_ignored() {
        let mut log = AuditLog::new(3);
        let records: Vec<_> = (0..5).map(|i| rec("acme", i, Action::Block)).collect();
        records.iter().for_each(|r| log.push(r.clone()));
        log.push(records[4].clone());
        assert_eq!(log.len(), 3);
        assert!(log.get(records[1].id()).is_none());
        assert_eq!(log.get(records[2].id()), Some(&records[2]));
    }

    fn with_severity(tenant: &str, severity: Severity) -> AuditRecord {
        let mut f = finding("r", "a*** (4 chars)", Detail::None);
        f.severity = severity;
        AuditRecord::at(0, ctx(tenant), Action::Block, &[f])
    }

    #[test]
    fn a_flood_of_low_severity_blocks_evicts_only_its_own_class() {
        let mut log = AuditLog::new(10);
        let kept = [
            with_severity("acme", Severity::High),
            with_severity("acme", Severity::Critical),
            with_severity("mallory", Severity::High),
        ];
        kept.iter().for_each(|r| log.push(r.clone()));
        for _ in 0..1000 {
            log.push(with_severity("mallory", Severity::Low));
        }
        assert_eq!(log.len(), 10);
        assert!(kept.iter().all(|r| log.get(r.id()).is_some()), "no high-severity record was evicted");
        assert_eq!(
            log.evictions(),
            [AuditEviction { tenant: "mallory".into(), severity: Severity::Low, evicted: 993 }]
        );
        // paging still walks every record, newest first
        let q = AuditQuery { limit: 3, ..Default::default() };
        let (mut seen, mut cursor) = (Vec::new(), None);
        loop {
            let page = log.list(&AuditQuery { cursor: cursor.clone(), ..q.clone() }).unwrap();
            seen.extend(page.records.iter().map(|r| r.id().to_owned()));
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        assert_eq!(seen.len(), 10);
        assert_eq!(seen.last().map(String::as_str), Some(kept[0].id()));
    }
}
