//! The Redis store against a real Redis: two handles (two gateway replicas) sharing
//! fingerprints, statistics and audit records through 127.0.0.1:6379 (scripts/test.sh
//! starts it), and a Redis of our own that is stopped and restarted to check degraded mode
//! (records spooled, none lost, none doubled), and audit retention per tenant and severity
//! under a flood. Every test uses its own key prefix and deletes its keys at the end.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crossguard_e2e::own_redis::{free_port, OwnRedis};
use firewall::{Action, Detail, DetectorKind, Finding, Metric, NgramKey, NgramOwners, Severity};
use gateway::audit::{AuditContext, AuditQuery, AuditRecord};
use gateway::provenance::{ProvenanceIndex, ProvenanceSettings};
use gateway::stats::{Statistics, StatsSettings};
use gateway::store::{RedisSettings, Role, Store, StoreError};

const SHARED_URL: &str = "redis://127.0.0.1:6379";
const KEY: NgramKey = NgramKey(*b"test-key-0123456");

fn settings(url: &str, prefix: &str, dir: &Path) -> RedisSettings {
    RedisSettings { key_prefix: prefix.to_owned(), op_timeout_ms: 300, ..RedisSettings::new(url, dir) }
}

fn prefix() -> String {
    format!("crossguard-test-{}:", uuid::Uuid::new_v4().simple())
}

async fn delete_keys(url: &str, prefix: &str) {
    let Ok(client) = redis::Client::open(url) else { return };
    let Ok(mut c) = client.get_multiplexed_async_connection().await else { return };
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query_async(&mut c).await.unwrap_or_default();
    if !keys.is_empty() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query_async(&mut c).await;
    }
}

fn record(tenant: &str, rule: &str, action: Action) -> AuditRecord {
    record_with(tenant, rule, action, Severity::High)
}

fn record_with(tenant: &str, rule: &str, action: Action, severity: Severity) -> AuditRecord {
    let finding = Finding {
        rule_id: rule.into(),
        start: 0,
        end: 20,
        match_start: 0,
        match_end: 20,
        severity,
        action,
        excerpt: firewall::mask("AKIA2NGEVCHPZHKN4IV2"),
        kind: DetectorKind::Ngram,
        detail: Detail::Foreign { owners: vec!["globex".into()], shared_by: 1 },
        encoding: None,
    };
    let ctx = AuditContext { tenant: tenant.into(), model: "mock".into(), request_id: "req_1".into() };
    AuditRecord::new(ctx, action, &[finding], 12)
}

async fn all_ids(store: &Store, q: AuditQuery) -> Vec<String> {
    let mut ids = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.list_audit(&AuditQuery { cursor, ..q.clone() }).await.unwrap();
        ids.extend(page.records.iter().map(|r| r.id().to_owned()));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return ids,
        }
    }
}

#[tokio::test]
async fn two_replicas_share_fingerprints_statistics_and_audit_records() {
    let (p, d1, d2) = (prefix(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::redis(settings(SHARED_URL, &p, d1.path())).await.unwrap();
    let b = Store::redis(settings(SHARED_URL, &p, d2.path())).await.unwrap();
    assert!(!a.health().degraded, "{:?}", a.health());

    // fingerprints: a prompt recorded on replica A is owned by its tenant on replica B
    let pset = ProvenanceSettings { ngram_words: 4, ..ProvenanceSettings::new(KEY) };
    let (ia, ib) = (ProvenanceIndex::new(pset.clone(), "replica-a"), ProvenanceIndex::new(pset, "replica-b"));
    let text = "the launch code for project nightingale is hidden under the blue lamp";
    let batch = ia.record("acme", Role::Sent, text).unwrap();
    a.append_fingerprints(&batch).await.unwrap();
    let h = firewall::fingerprints(text, &KEY, 4)[0];
    assert_eq!(ib.owners(h).shared_by, 0);
    assert_eq!(ib.refresh(&b).await.unwrap(), 1);
    assert_eq!(ib.owners(h).tenants, ["acme"]);
    assert_eq!(ia.refresh(&a).await.unwrap(), 0, "a replica skips its own batches");
    assert_eq!(ib.refresh(&b).await.unwrap(), 0, "the cursor moved on");

    // statistics add up across replicas
    let (sa, sb) =
        (Statistics::new(StatsSettings { min_samples: 2 }), Statistics::new(StatsSettings { min_samples: 2 }));
    [1.0, 2.0, 3.0].into_iter().for_each(|x| sa.observe_value("acme", Metric::Surprisal, x));
    [4.0, 5.0].into_iter().for_each(|x| sb.observe_value("acme", Metric::Surprisal, x));
    sa.sync(&a).await.unwrap();
    sb.sync(&b).await.unwrap();
    sa.sync(&a).await.unwrap();
    for s in [&sa, &sb] {
        let base = firewall::Baselines::baseline(s, "acme", Metric::Surprisal).unwrap();
        assert_eq!((base.count, base.mean), (5, 3.0));
        assert!((base.variance - 2.5).abs() < 1e-9);
    }

    // audit: written on either replica, listed and fetched on both, filters and paging
    let mut written = Vec::new();
    for i in 0..7 {
        let r = record(
            if i % 2 == 0 { "acme" } else { "initech" },
            if i < 3 { "aws-access-key" } else { "foreign-ngram" },
            Action::Block,
        );
        if i % 2 == 0 { &a } else { &b }.append_audit(&r).await.unwrap();
        written.push(r);
    }
    let newest_first: Vec<String> = written.iter().rev().map(|r| r.id().to_owned()).collect();
    assert_eq!(all_ids(&a, AuditQuery { limit: 3, ..Default::default() }).await, newest_first);
    assert_eq!(all_ids(&b, AuditQuery { limit: 2, tenant: Some("acme".into()), ..Default::default() }).await.len(), 4);
    assert_eq!(all_ids(&b, AuditQuery { rule: Some("aws-access-key".into()), ..Default::default() }).await.len(), 3);
    let since = written[5].time_ms();
    assert!(all_ids(&a, AuditQuery { since_ms: Some(since), ..Default::default() }).await.len() >= 2);
    assert_eq!(b.get_audit(written[2].id()).await.unwrap().as_ref(), Some(&written[2]));
    assert_eq!(a.get_audit("no-such-id").await.unwrap(), None);
    assert!(matches!(
        a.list_audit(&AuditQuery { cursor: Some("bogus".into()), ..Default::default() }).await,
        Err(StoreError::BadCursor(_))
    ));
    delete_keys(SHARED_URL, &p).await;
}

/// Runs upkeep until the spool is empty (Redis is up, so this takes one or two rounds).
async fn flush(store: &Store) {
    for _ in 0..50 {
        store.upkeep().await;
        if store.health().buffered_audit == 0 && !store.health().degraded {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("spool not flushed: {:?}", store.health());
}

#[tokio::test]
async fn redis_outage_spools_audit_records_and_flushes_them_on_reconnect() {
    let port = free_port();
    let server = OwnRedis::start(port, tempfile::tempdir().unwrap());
    let (url, p, data) = (server.url(), prefix(), tempfile::tempdir().unwrap());
    let store = Store::redis(settings(&url, &p, data.path())).await.unwrap();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let r = record("acme", "aws-access-key", Action::Block);
        store.append_audit(&r).await.unwrap();
        ids.push(r.id().to_owned());
    }
    assert_eq!(store.health().buffered_audit, 0);

    let kept = server.stop();
    for _ in 0..3 {
        let r = record("acme", "aws-access-key", Action::Redact);
        store.append_audit(&r).await.unwrap();
        ids.push(r.id().to_owned());
    }
    let h = store.health();
    assert!(h.degraded && h.reason.is_some(), "{h:?}");
    assert_eq!(h.buffered_audit, 3);
    assert!(store.list_audit(&AuditQuery::default()).await.is_err(), "listing needs Redis");
    store.upkeep().await;
    assert_eq!(store.health().buffered_audit, 3);

    // the gateway restarts while Redis is still down: the spool is reloaded
    drop(store);
    let store = Store::redis(settings(&url, &p, data.path())).await.unwrap();
    assert_eq!(store.health().buffered_audit, 3);
    let r = record("globex", "foreign-ngram", Action::Block);
    store.append_audit(&r).await.unwrap();
    ids.push(r.id().to_owned());
    assert_eq!(store.health().buffered_audit, 4);

    let server = OwnRedis::start(port, kept);
    flush(&store).await;
    let mut listed = all_ids(&store, AuditQuery::default()).await;
    listed.sort();
    ids.sort();
    assert_eq!(listed, ids, "every record exactly once");
    let r = record("acme", "aws-access-key", Action::Block);
    store.append_audit(&r).await.unwrap();
    assert_eq!(store.health().buffered_audit, 0, "straight to Redis again");
    drop(server);
}

#[tokio::test]
async fn re_sending_a_record_never_doubles_it() {
    let (p, d1, d2) = (prefix(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::redis(settings(SHARED_URL, &p, d1.path())).await.unwrap();
    let r = record("acme", "aws-access-key", Action::Block);
    a.append_audit(&r).await.unwrap();
    // a replica that spooled the same record (its acknowledgement was lost) flushes it again
    std::fs::write(d2.path().join("audit-spool.jsonl"), format!("{}\n", serde_json::to_string(&r).unwrap())).unwrap();
    let b = Store::redis(settings(SHARED_URL, &p, d2.path())).await.unwrap();
    flush(&b).await;
    assert_eq!(all_ids(&b, AuditQuery::default()).await, [r.id().to_owned()]);
    delete_keys(SHARED_URL, &p).await;
}

#[tokio::test]
async fn unreachable_redis_at_start_is_degraded_not_fatal() {
    let (p, data) = (prefix(), tempfile::tempdir().unwrap());
    let url = format!("redis://127.0.0.1:{}", free_port());
    let store = Arc::new(Store::redis(settings(&url, &p, data.path())).await.unwrap());
    assert!(store.health().degraded);
    store.append_audit(&record("acme", "r", Action::Block)).await.unwrap();
    assert_eq!(store.health().buffered_audit, 1);
    assert!(matches!(store.load_stats().await, Err(StoreError::Unavailable(_) | StoreError::Timeout { .. })));
    let spool = std::fs::read_to_string(data.path().join("audit-spool.jsonl")).unwrap();
    assert_eq!(spool.lines().count(), 1);
    assert!(!spool.contains("AKIA2NGEVCHPZHKN4IV2"), "no raw secret on disk");
}

#[tokio::test]
async fn a_flood_of_low_severity_records_evicts_only_its_own_class() {
    let (p, d1, d2) = (prefix(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let capped = |dir: &Path| RedisSettings { audit_max_len: 20, ..settings(SHARED_URL, &p, dir) };
    let (a, b) = (Store::redis(capped(d1.path())).await.unwrap(), Store::redis(capped(d2.path())).await.unwrap());
    let block = |tenant: &str, severity| record_with(tenant, "aws-access-key", Action::Block, severity);
    let kept = [block("acme", Severity::High), block("acme", Severity::Critical), block("mallory", Severity::High)];
    for r in &kept {
        a.append_audit(r).await.unwrap();
    }
    // mallory floods through both replicas
    for i in 0..300 {
        if i % 2 == 0 { &a } else { &b }.append_audit(&block("mallory", Severity::Low)).await.unwrap();
    }
    let ids = all_ids(&a, AuditQuery { limit: 7, ..Default::default() }).await;
    assert_eq!(ids.len(), 20, "the log holds its cap");
    for r in &kept {
        assert!(ids.iter().any(|id| id == r.id()), "{} survived", r.id());
        assert_eq!(a.get_audit(r.id()).await.unwrap().as_ref(), Some(r));
    }
    assert_eq!(ids.last().map(String::as_str), Some(kept[0].id()), "paging reaches the oldest");
    b.upkeep().await;
    let evicted = b.audit_evictions();
    assert_eq!(evicted.len(), 1, "{evicted:?}");
    assert_eq!((evicted[0].tenant.as_str(), evicted[0].severity, evicted[0].evicted), ("mallory", Severity::Low, 283));
    delete_keys(SHARED_URL, &p).await;
}

#[tokio::test]
async fn fingerprints_recorded_during_an_outage_are_spooled_and_shared_once_redis_is_back() {
    let port = free_port();
    let server = OwnRedis::start(port, tempfile::tempdir().unwrap());
    let (url, p, d1, d2) = (server.url(), prefix(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (
        Store::redis(settings(&url, &p, d1.path())).await.unwrap(),
        Store::redis(settings(&url, &p, d2.path())).await.unwrap(),
    );
    let pset = ProvenanceSettings { ngram_words: 4, ..ProvenanceSettings::new(KEY) };
    let (ia, ib) = (ProvenanceIndex::new(pset.clone(), "replica-a"), ProvenanceIndex::new(pset, "replica-b"));

    let kept = server.stop();
    let text = "the vault combination for the osaka office is written inside the red binder";
    let batch = ia.record("acme", Role::Sent, text).unwrap();
    a.append_fingerprints(&batch).await.expect("spooled, not lost");
    assert_eq!(a.health().buffered_fingerprints, 1);
    assert!(ia.record("acme", Role::Sent, text).is_none(), "recorded once: the spool owns the sharing now");
    // the replica restarts while Redis is down: the spool is reloaded from disk
    drop(a);
    let a = Store::redis(settings(&url, &p, d1.path())).await.unwrap();
    assert_eq!(a.health().buffered_fingerprints, 1);

    let _server = OwnRedis::start(port, kept);
    flush(&a).await;
    assert_eq!(a.health().buffered_fingerprints, 0);
    flush(&b).await; // reconnects
    assert_eq!(ib.refresh(&b).await.unwrap(), 1);
    assert_eq!(ib.owners(firewall::fingerprints(text, &KEY, 4)[0]).tenants, ["acme"], "replica B sees the prompt");
    assert!(ib.last_pulled_ms().is_some());
}

#[tokio::test]
async fn a_starting_replica_reads_only_live_entries_in_pages() {
    let (p, d) = (prefix(), tempfile::tempdir().unwrap());
    let store = Store::redis(settings(SHARED_URL, &p, d.path())).await.unwrap();
    let client = redis::Client::open(SHARED_URL).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    // an entry added before the TTL's horizon (its expiry claims otherwise: a skewed clock)
    let old_id = format!("{}-0", (now_s - 2 * 86_400) * 1000);
    let _: String = redis::cmd("XADD")
        .arg(format!("{p}fp"))
        .arg(&old_id)
        .arg("t")
        .arg("old")
        .arg("x")
        .arg(now_s + 3600)
        .arg("r")
        .arg("r9")
        .arg("h")
        .arg(7u64.to_le_bytes().to_vec())
        .query_async(&mut c)
        .await
        .unwrap();
    // 1200 live batches: more than two pages
    for i in 0..1200u64 {
        let batch = gateway::store::FingerprintBatch {
            tenant: format!("t{}", i % 3),
            expires_at_s: now_s + 3600,
            replica: "r9".into(),
            role: Role::Sent,
            hashes: vec![1000 + i],
        };
        store.append_fingerprints(&batch).await.unwrap();
    }
    let idx =
        ProvenanceIndex::new(ProvenanceSettings { ngram_words: 4, ..ProvenanceSettings::new(KEY) }, "replica-new");
    assert_eq!(idx.refresh(&store).await.unwrap(), 1200, "every live batch, none from before the horizon");
    assert_eq!(idx.owners(7).shared_by, 0);
    assert_eq!(idx.owners(1000 + 1199).tenants, ["t2"]);
    delete_keys(SHARED_URL, &p).await;
}

#[tokio::test]
async fn stored_responses_are_shared_by_replicas_and_scoped_to_their_tenant() {
    let (p, d1, d2) = (prefix(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Store::redis(settings(SHARED_URL, &p, d1.path())).await.unwrap();
    let b = Store::redis(settings(SHARED_URL, &p, d2.path())).await.unwrap();
    a.put_response("acme", "resp_1", "{\"k\":1}".into(), 60).await.unwrap();
    assert_eq!(b.get_response("acme", "resp_1").await.unwrap().as_deref(), Some("{\"k\":1}"), "replica B reads it");
    assert_eq!(b.get_response("globex", "resp_1").await.unwrap(), None, "another tenant never finds it");
    assert!(!b.delete_response("globex", "resp_1").await.unwrap());
    assert!(a.get_response("acme", "resp_1").await.unwrap().is_some(), "nor deletes it");
    // It expires with its TTL.
    let client = redis::Client::open(SHARED_URL).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let ttl: i64 = redis::cmd("TTL").arg(format!("{p}response:acme:resp_1")).query_async(&mut c).await.unwrap();
    assert!((1..=60).contains(&ttl), "{ttl}");
    assert!(b.delete_response("acme", "resp_1").await.unwrap());
    assert_eq!(a.get_response("acme", "resp_1").await.unwrap(), None);
    delete_keys(SHARED_URL, &p).await;
}
