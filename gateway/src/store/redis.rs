//! The Redis store: fingerprints, statistics and audit records shared between replicas.
//!
//! Layout, every key under `key_prefix`:
//! - `fp`: a stream of fingerprint batches (`t` tenant, `x` expiry in Unix seconds, `r`
//!   replica, `h` the hashes as packed little-endian u64s). Each add trims entries older
//!   than the TTL (`MINID ~`), so the stream holds only live batches (`k` = `r` marks a
//!   batch the tenant only received, see [`Role`]); replicas read it
//!   incrementally (`XREAD` from their cursor).
//! - `stats`: one hash, field `<metric>:<tenant>` = `"<count> <mean> <m2>"`, merged
//!   atomically by a Lua script (Chan's parallel Welford update).
//! - `{audit}:log`: one stream of audit records (field `r`, the JSON), at most
//!   `audit_max_len` entries, evicted per [`retention`](crate::store::retention): each record's entry id is also
//!   in the list `{audit}:class:<severity>:<tenant>`, the sorted set `{audit}:classes`
//!   ranks the classes by size, `{audit}:tracked` counts the listed records and the hash
//!   `{audit}:evicted` counts evictions per class; the append script (atomic) evicts the
//!   oldest entry of the largest class with `XDEL`. Every audit key carries the `{audit}`
//!   hash tag, so the script's keys, including the class lists it names itself, share one
//!   slot. `{audit}:id:<id>` maps a record id to its entry id (expiring with
//!   `audit_id_ttl_secs`); the append script checks it first, so re-sending a record is a
//!   no-op (an evicted one too).
//!
//! - `response:<tenant>:<id>`: a stored Responses API response (JSON), expiring with
//!   `[responses] ttl_secs`; not spooled: while Redis is down, responses are not stored.
//!
//! Degraded mode: any connection failure or timeout marks the store degraded. Audit
//! records and fingerprint batches that cannot reach Redis (or arrive while earlier ones
//! wait) go to a durable `Spool` (`<data_dir>/audit-spool.jsonl`,
//! `<data_dir>/fingerprint-spool.jsonl`); [`RedisStore::upkeep`] reconnects and ships them
//! until Redis acknowledges each. Thanks to the idempotent append, an audit flush cut short
//! is simply repeated: no record is lost, none is doubled (a fingerprint batch sent twice
//! merges to the same owners).
//!
//! Needs Redis >= 6.2 (`MINID`, exclusive ranges).

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::{StreamId, StreamRangeReply, StreamReadReply};
use redis::{RedisError, RedisResult, Script, Value};

use crate::audit::{metric_from_name, metric_name, severity_from_name, AuditPage, AuditQuery, AuditRecord};
use crate::store::retention::{AuditEviction, Class};
use crate::store::spool::Spool;
use crate::store::{
    now_ms, FingerprintBatch, FingerprintCursor, FingerprintPage, Health, Role, StatEntry, StoreError, Welford,
};

/// Connection settings and limits.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub url: String,
    /// Prefix of every key (one per deployment), e.g. `crossguard:`.
    pub key_prefix: String,
    /// Where the audit spool lives (one directory per replica).
    pub data_dir: PathBuf,
    /// Cap of the audit stream (past it, see [`retention`](crate::store::retention)).
    pub audit_max_len: u64,
    /// How long `get` by id works for a record.
    pub audit_id_ttl_secs: u64,
    /// Longest wait for one Redis operation.
    pub op_timeout_ms: u64,
    /// This replica's name in fingerprint batches.
    pub replica_id: String,
    /// How long fingerprints live (the provenance TTL): the stream is trimmed to it and a
    /// fresh reader starts at its horizon.
    pub fingerprint_ttl_secs: u64,
}

impl RedisSettings {
    pub fn new(url: impl Into<String>, data_dir: impl Into<PathBuf>) -> RedisSettings {
        RedisSettings {
            url: url.into(),
            key_prefix: "crossguard:".into(),
            data_dir: data_dir.into(),
            audit_max_len: 100_000,
            audit_id_ttl_secs: 30 * 86_400,
            op_timeout_ms: 1_000,
            replica_id: uuid::Uuid::new_v4().simple().to_string(),
            fingerprint_ttl_secs: 86_400,
        }
    }
}

/// Entries read per round trip when listing or refreshing.
const BATCH: usize = 500;
/// Most audit entries one list call examines (a page may come back short, with a cursor).
const MAX_SCAN: usize = 20_000;
/// Records may be appended to the stream later than their time (spooled, clock skew):
/// a `since_ms` filter starts scanning this much earlier.
const SINCE_SLACK_MS: u64 = 60_000;

/// Appends one record (KEYS: log, id key, classes, evicted, tracked; ARGV: json, cap, id
/// TTL, class key, class list prefix, tie weight) and evicts per [`retention`](crate::store::retention): the oldest
/// record of the class with the highest score (4 per record, plus the tie weight: 3 for
/// low severity .. 0 for critical). Records from before classes existed (the stream holds
/// more than `tracked`) are the oldest and are trimmed first.
const APPEND_AUDIT: &str = r"
local sid = redis.call('GET', KEYS[2])
if sid then return sid end
sid = redis.call('XADD', KEYS[1], '*', 'r', ARGV[1])
redis.call('SET', KEYS[2], sid, 'EX', ARGV[3])
local class, lists = ARGV[4], ARGV[5]
redis.call('RPUSH', lists .. class, sid)
if redis.call('ZSCORE', KEYS[3], class) then
  redis.call('ZINCRBY', KEYS[3], 4, class)
else
  redis.call('ZADD', KEYS[3], 4 + tonumber(ARGV[6]), class)
end
local tracked = redis.call('INCR', KEYS[5])
local max = tonumber(ARGV[2])
local n = redis.call('XLEN', KEYS[1])
if n > max and n > tracked then
  local cut = math.min(n - tracked, n - max)
  redis.call('XTRIM', KEYS[1], 'MAXLEN', n - cut)
  n = n - cut
end
while n > max do
  local top = redis.call('ZREVRANGE', KEYS[3], 0, 0)[1]
  if not top then break end
  local victim = redis.call('LPOP', lists .. top)
  if victim then
    n = n - redis.call('XDEL', KEYS[1], victim)
    redis.call('HINCRBY', KEYS[4], top, 1)
    redis.call('DECR', KEYS[5])
  end
  if redis.call('LLEN', lists .. top) == 0 then
    redis.call('ZREM', KEYS[3], top)
  else
    redis.call('ZINCRBY', KEYS[3], -4, top)
  end
end
return sid";

const MERGE_STATS: &str = r"
for i = 1, #ARGV, 4 do
  local f, n2, mean2, q2 = ARGV[i], tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), tonumber(ARGV[i+3])
  local n1, mean1, q1 = 0, 0, 0
  local cur = redis.call('HGET', KEYS[1], f)
  if cur then
    local a, b, c = string.match(cur, '^(%S+) (%S+) (%S+)$')
    n1, mean1, q1 = tonumber(a) or 0, tonumber(b) or 0, tonumber(c) or 0
  end
  local n = n1 + n2
  if n > 0 then
    local d = mean2 - mean1
    redis.call('HSET', KEYS[1], f, string.format('%d %.17g %.17g', n, mean1 + d * n2 / n, q1 + q2 + d * d * n1 * n2 / n))
  end
end
return 0";

/// The Redis-backed store.
pub struct RedisStore {
    settings: RedisSettings,
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    degraded: AtomicBool,
    reason: Mutex<Option<String>>,
    audit_spool: Spool<AuditRecord>,
    fingerprint_spool: Spool<FingerprintBatch>,
    append_script: Script,
    merge_script: Script,
    /// Audit evictions of every replica, as of the last upkeep.
    evictions: Mutex<Vec<AuditEviction>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("key_prefix", &self.settings.key_prefix).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Opens the store. Redis being down is not an error: the store starts degraded and
    /// [`RedisStore::upkeep`] connects later. Only a bad URL or an unusable data directory fails.
    pub async fn open(settings: RedisSettings) -> Result<RedisStore, StoreError> {
        let client = redis::Client::open(settings.url.as_str()).map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let audit_spool = Spool::open(&settings.data_dir, "audit-spool")?;
        let fingerprint_spool = Spool::open(&settings.data_dir, "fingerprint-spool")?;
        let store = RedisStore {
            client,
            conn: tokio::sync::Mutex::new(None),
            degraded: AtomicBool::new(true),
            reason: Mutex::new(Some("not connected yet".into())),
            audit_spool,
            fingerprint_spool,
            append_script: Script::new(APPEND_AUDIT),
            merge_script: Script::new(MERGE_STATS),
            evictions: Mutex::new(Vec::new()),
            settings,
        };
        store.upkeep().await;
        Ok(store)
    }

    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.settings.key_prefix)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.settings.op_timeout_ms.max(1))
    }

    /// A connection, creating the manager if there is none (it reconnects by itself after).
    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let cfg = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_connection_timeout(self.timeout())
            .set_response_timeout(self.timeout());
        let made =
            tokio::time::timeout(self.timeout() * 2, ConnectionManager::new_with_config(self.client.clone(), cfg))
                .await;
        match made {
            Ok(Ok(c)) => {
                *slot = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => Err(self.failed(StoreError::Unavailable(e.to_string()))),
            Err(_) => Err(self.failed(StoreError::Timeout { ms: self.settings.op_timeout_ms * 2 })),
        }
    }

    /// Runs one Redis operation with the timeout, keeping the degraded flag current.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T, StoreError>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let conn = self.connection().await?;
        match tokio::time::timeout(self.timeout(), op(conn)).await {
            Ok(Ok(v)) => {
                self.degraded.store(false, Ordering::Relaxed);
                Ok(v)
            }
            Ok(Err(e)) if is_outage(&e) => Err(self.failed(StoreError::Unavailable(e.to_string()))),
            Ok(Err(e)) => Err(StoreError::BadReply(e.to_string())),
            Err(_) => Err(self.failed(StoreError::Timeout { ms: self.settings.op_timeout_ms })),
        }
    }

    fn failed(&self, e: StoreError) -> StoreError {
        if !self.degraded.swap(true, Ordering::Relaxed) {
            tracing::warn!(error = %e, "redis store degraded: serving from local state");
        }
        *self.reason.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
        e
    }

    pub fn health(&self) -> Health {
        let degraded = self.degraded.load(Ordering::Relaxed);
        let reason = if degraded { self.reason.lock().unwrap_or_else(|p| p.into_inner()).clone() } else { None };
        Health {
            kind: "redis",
            degraded,
            reason,
            buffered_audit: self.audit_spool.waiting(),
            buffered_fingerprints: self.fingerprint_spool.waiting(),
        }
    }

    // ------------------------------------------------------------ fingerprints

    /// `Ok` once Redis holds the batch, or (Redis down, or earlier batches still waiting)
    /// once the local spool holds it; spooled batches are sent by [`RedisStore::upkeep`].
    pub async fn append_fingerprints(&self, batch: &FingerprintBatch) -> Result<(), StoreError> {
        if batch.hashes.is_empty() {
            return Ok(());
        }
        if self.fingerprint_spool.waiting() == 0 && !self.degraded.load(Ordering::Relaxed) {
            match self.send_fingerprints(batch).await {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(tenant = batch.tenant, error = %e, "fingerprints spooled locally"),
            }
        }
        self.fingerprint_spool.push(batch.clone()).await
    }

    /// Oldest entry id still within the fingerprint TTL.
    fn live_since(&self) -> String {
        format!("{}-0", now_ms().saturating_sub(self.settings.fingerprint_ttl_secs.saturating_mul(1000)))
    }

    async fn send_fingerprints(&self, batch: &FingerprintBatch) -> Result<(), StoreError> {
        // [8 * n] little-endian u64s
        let packed: Vec<u8> = batch.hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        let mut cmd = redis::cmd("XADD");
        // Trimmed by age: entries older than the TTL hold only expired owners.
        cmd.arg(self.key("fp")).arg("MINID").arg("~").arg(self.live_since()).arg("*");
        cmd.arg("t")
            .arg(&batch.tenant)
            .arg("x")
            .arg(batch.expires_at_s)
            .arg("r")
            .arg(&batch.replica)
            .arg("h")
            .arg(packed);
        if batch.role == Role::Received {
            cmd.arg("k").arg("r");
        }
        self.call(|mut c| async move { cmd.query_async::<Value>(&mut c).await }).await.map(drop)
    }

    /// One page (at most `BATCH` entries) of the batches after `cursor` that have not
    /// expired; a fresh cursor starts at the TTL's horizon, never at the stream's start.
    pub async fn read_fingerprints(&self, cursor: &FingerprintCursor) -> Result<FingerprintPage, StoreError> {
        let mut last = if cursor.0.is_empty() { self.live_since() } else { cursor.0.clone() };
        let now_s = now_ms() / 1000;
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT").arg(BATCH).arg("STREAMS").arg(self.key("fp")).arg(&last);
        let reply: Option<StreamReadReply> = self.call(|mut c| async move { cmd.query_async(&mut c).await }).await?;
        let ids: Vec<StreamId> = reply.into_iter().flat_map(|r| r.keys).flat_map(|k| k.ids).collect();
        let more = ids.len() == BATCH;
        let mut batches = Vec::with_capacity(ids.len());
        for entry in ids {
            last = entry.id.clone();
            match parse_batch(&entry) {
                Some(b) if b.expires_at_s > now_s => batches.push(b),
                Some(_) => {}
                None => tracing::warn!(entry = %entry.id, "skipping malformed fingerprint entry"),
            }
        }
        Ok(FingerprintPage { batches, next: FingerprintCursor(last), more })
    }

    // ------------------------------------------------------------ statistics

    pub async fn merge_stats(&self, deltas: &[StatEntry]) -> Result<(), StoreError> {
        let mut inv = self.merge_script.key(self.key("stats"));
        let mut any = false;
        for d in deltas.iter().filter(|d| d.value.count > 0 && d.value.mean.is_finite() && d.value.m2.is_finite()) {
            inv.arg(format!("{}:{}", metric_name(d.metric), d.tenant))
                .arg(d.value.count)
                .arg(d.value.mean)
                .arg(d.value.m2);
            any = true;
        }
        if !any {
            return Ok(());
        }
        self.call(|mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await.map(drop)
    }

    pub async fn load_stats(&self) -> Result<Vec<StatEntry>, StoreError> {
        let key = self.key("stats");
        let all: Vec<(String, String)> =
            self.call(|mut c| async move { redis::cmd("HGETALL").arg(key).query_async(&mut c).await }).await?;
        Ok(all.iter().filter_map(|(f, v)| parse_stat(f, v)).collect())
    }

    // ------------------------------------------------------------ audit

    /// `Ok` once Redis holds the record, or (Redis down, or earlier records still waiting)
    /// once the local spool holds it.
    pub async fn append_audit(&self, record: &AuditRecord) -> Result<(), StoreError> {
        if self.audit_spool.waiting() == 0 && !self.degraded.load(Ordering::Relaxed) {
            match self.send_audit(record).await {
                Ok(()) => return Ok(()),
                Err(e) => tracing::warn!(audit_id = record.id(), error = %e, "audit record spooled locally"),
            }
        }
        self.audit_spool.push(record.clone()).await
    }

    async fn send_audit(&self, record: &AuditRecord) -> Result<(), StoreError> {
        let json = serde_json::to_string(record).map_err(|e| StoreError::BadReply(e.to_string()))?;
        let class = Class::of(record);
        let tie = 3 - severity_rank(class.severity);
        let mut inv = self.append_script.key(self.key("{audit}:log"));
        inv.key(self.key(&format!("{{audit}}:id:{}", record.id())));
        inv.key(self.key("{audit}:classes")).key(self.key("{audit}:evicted")).key(self.key("{audit}:tracked"));
        inv.arg(json).arg(self.settings.audit_max_len).arg(self.settings.audit_id_ttl_secs.max(1));
        inv.arg(class.key()).arg(self.key("{audit}:class:")).arg(tie);
        self.call(|mut c| async move { inv.invoke_async::<Value>(&mut c).await }).await.map(drop)
    }

    /// As of the last [`RedisStore::upkeep`].
    pub fn audit_evictions(&self) -> Vec<AuditEviction> {
        self.evictions.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    async fn load_evictions(&self) -> Result<(), StoreError> {
        let key = self.key("{audit}:evicted");
        let all: Vec<(String, u64)> =
            self.call(|mut c| async move { redis::cmd("HGETALL").arg(key).query_async(&mut c).await }).await?;
        let mut evictions: Vec<AuditEviction> = all
            .into_iter()
            .filter_map(|(class, evicted)| {
                let (severity, tenant) = class.split_once(':')?;
                Some(AuditEviction { tenant: tenant.to_owned(), severity: severity_from_name(severity)?, evicted })
            })
            .collect();
        evictions.sort_by(|a, b| (&a.tenant, a.severity).cmp(&(&b.tenant, b.severity)));
        *self.evictions.lock().unwrap_or_else(|p| p.into_inner()) = evictions;
        Ok(())
    }

    pub async fn get_audit(&self, id: &str) -> Result<Option<AuditRecord>, StoreError> {
        let id_key = self.key(&format!("{{audit}}:id:{id}"));
        let sid: Option<String> =
            self.call(|mut c| async move { redis::cmd("GET").arg(id_key).query_async(&mut c).await }).await?;
        let Some(sid) = sid else { return Ok(None) };
        let log = self.key("{audit}:log");
        let reply: StreamRangeReply = self
            .call(|mut c| async move { redis::cmd("XRANGE").arg(log).arg(&sid).arg(&sid).query_async(&mut c).await })
            .await?;
        Ok(reply.ids.first().and_then(parse_record))
    }

    // ------------------------------------------------------------ stored responses

    /// `response:<tenant>:<id>`: tenant ids hold no `:`, so the tenant is part of the key
    /// and one tenant's lookup can never name another's response.
    fn response_key(&self, tenant: &str, id: &str) -> String {
        self.key(&format!("response:{tenant}:{id}"))
    }

    pub async fn put_response(&self, tenant: &str, id: &str, json: String, ttl_secs: u64) -> Result<(), StoreError> {
        let key = self.response_key(tenant, id);
        self.call(|mut c| async move {
            redis::cmd("SET").arg(key).arg(json).arg("EX").arg(ttl_secs.max(1)).query_async::<Value>(&mut c).await
        })
        .await
        .map(drop)
    }

    pub async fn get_response(&self, tenant: &str, id: &str) -> Result<Option<String>, StoreError> {
        let key = self.response_key(tenant, id);
        self.call(|mut c| async move { redis::cmd("GET").arg(key).query_async(&mut c).await }).await
    }

    pub async fn delete_response(&self, tenant: &str, id: &str) -> Result<bool, StoreError> {
        let key = self.response_key(tenant, id);
        let n: u64 = self.call(|mut c| async move { redis::cmd("DEL").arg(key).query_async(&mut c).await }).await?;
        Ok(n > 0)
    }

    /// Newest first. The cursor is the stream entry id of the last record examined.
    pub async fn list_audit(&self, q: &AuditQuery) -> Result<AuditPage, StoreError> {
        let limit = q.page_size();
        let start = q.since_ms.map_or("-".to_owned(), |s| format!("{}-0", s.saturating_sub(SINCE_SLACK_MS)));
        let mut end = match &q.cursor {
            None => "+".to_owned(),
            Some(c) if valid_entry_id(c) => format!("({c}"),
            Some(c) => return Err(StoreError::BadCursor(c.clone())),
        };
        let mut page = AuditPage::default();
        let mut scanned = 0usize;
        loop {
            let log = self.key("{audit}:log");
            let (s, e) = (start.clone(), end.clone());
            let reply: StreamRangeReply = self
                .call(|mut c| async move {
                    redis::cmd("XREVRANGE").arg(log).arg(e).arg(s).arg("COUNT").arg(BATCH).query_async(&mut c).await
                })
                .await?;
            let n = reply.ids.len();
            for entry in &reply.ids {
                if page.records.len() == limit || scanned == MAX_SCAN {
                    page.next_cursor = end.strip_prefix('(').map(str::to_owned);
                    return Ok(page);
                }
                scanned += 1;
                end = format!("({}", entry.id);
                if let Some(r) = parse_record(entry).filter(|r| q.matches(r)) {
                    page.records.push(r);
                }
            }
            if n < BATCH {
                return Ok(page);
            }
        }
    }

    // ------------------------------------------------------------ upkeep

    /// Connects if needed, checks Redis, and ships spooled audit records and fingerprints.
    pub async fn upkeep(&self) {
        let ping = self.call(|mut c| async move { redis::cmd("PING").query_async::<String>(&mut c).await }).await;
        if ping.is_err() {
            return;
        }
        match self.audit_spool.flush(|r| async move { self.send_audit(&r).await }).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(records = n, "spooled audit records flushed to redis"),
            Err(e) => tracing::warn!(error = %e, buffered = self.audit_spool.waiting(), "audit spool not flushed yet"),
        }
        match self.fingerprint_spool.flush(|b| async move { self.send_fingerprints(&b).await }).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(batches = n, "spooled fingerprints shared through redis"),
            Err(e) => {
                tracing::warn!(error = %e, buffered = self.fingerprint_spool.waiting(), "fingerprint spool not flushed yet")
            }
        }
        if let Err(e) = self.load_evictions().await {
            tracing::debug!(error = %e, "audit eviction counts not read");
        }
    }
}

/// Low 0 .. critical 3.
fn severity_rank(s: firewall::Severity) -> u8 {
    match s {
        firewall::Severity::Low => 0,
        firewall::Severity::Medium => 1,
        firewall::Severity::High => 2,
        firewall::Severity::Critical => 3,
    }
}

/// Whether a Redis error means "unreachable" (degrade) rather than "bad request".
fn is_outage(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout()
}

fn valid_entry_id(id: &str) -> bool {
    let mut parts = id.splitn(2, '-');
    let ok = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok(parts.next()) && ok(parts.next())
}

fn field<T: redis::FromRedisValue>(entry: &StreamId, name: &str) -> Option<T> {
    entry.map.get(name).and_then(|v| redis::from_redis_value(v).ok())
}

fn parse_batch(entry: &StreamId) -> Option<FingerprintBatch> {
    let packed: Vec<u8> = field(entry, "h")?;
    let hashes = packed
        .chunks_exact(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b.copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect();
    // `k` = "r" marks a received-only batch; absent (older entries) = sent.
    let role = if field::<String>(entry, "k").as_deref() == Some("r") { Role::Received } else { Role::Sent };
    Some(FingerprintBatch {
        tenant: field(entry, "t")?,
        expires_at_s: field(entry, "x")?,
        replica: field(entry, "r")?,
        role,
        hashes,
    })
}

fn parse_record(entry: &StreamId) -> Option<AuditRecord> {
    let json: Vec<u8> = field(entry, "r")?;
    match serde_json::from_slice(&json) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(entry = %entry.id, error = %e, "skipping unreadable audit entry");
            None
        }
    }
}

fn parse_stat(field: &str, value: &str) -> Option<StatEntry> {
    let (metric, tenant) = field.split_once(':')?;
    let mut parts = value.split_whitespace();
    let count = parts.next()?.parse::<f64>().ok()? as u64;
    let mean = parts.next()?.parse().ok()?;
    let m2 = parts.next()?.parse().ok()?;
    Some(StatEntry { tenant: tenant.to_owned(), metric: metric_from_name(metric)?, value: Welford { count, mean, m2 } })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stats_fields_and_entry_ids() {
        let s = parse_stat("surprisal:acme:eu", "12 2.5 0.75").unwrap();
        assert_eq!((s.tenant.as_str(), s.metric, s.value.count), ("acme:eu", firewall::Metric::Surprisal, 12));
        assert!(parse_stat("bogus:acme", "1 2 3").is_none() && parse_stat("surprisal:acme", "1 2").is_none());
        assert!(
            valid_entry_id("1700000000000-3")
                && !valid_entry_id("17-")
                && !valid_entry_id("+")
                && !valid_entry_id("1-2 x")
        );
    }
}
