//! The provenance index: which tenants sent or received each n-gram (and each secret
//! value the rules find), by keyed hash.
//!
//! Owns the in-memory map `hash -> {(tenant, expiry)}` that answers the firewall's
//! [`NgramOwners`] synchronously (a read lock and one lookup, no I/O on the token path).
//! The gateway [`record`](ProvenanceIndex::record)s each prompt (all messages) and each
//! released response under its tenant; the batch that returns goes to the store
//! (`Store::append_fingerprints`), and [`refresh`](ProvenanceIndex::refresh) merges what
//! other replicas recorded. Hashing and normalisation are the firewall's
//! ([`firewall::fingerprints`]), so recording and checking always agree.
//!
//! Ownership has a [`Role`]: a tenant *sent* the n-grams of its prompts and *received* those
//! of its responses. Received text is mostly the model's own words — boilerplate that every
//! tenant gets sooner or later — so it never makes text foreign by itself: an n-gram with
//! no sender is answered with no owners (it still counts in `shared_by`), and once it has a
//! sender, a tenant that received it is listed too (it already has that text).
//!
//! Text released to a tenant while nobody had sent it is **model-native**: the model says
//! it on its own. Such an n-gram is marked (an owner entry under `NATIVE`) and answered
//! with `model_native`, which the firewall never takes for a leak — so a tenant that later
//! sends common model phrasing cannot get other tenants' ordinary answers blocked.
//!
//! With the embedded store the index is the only copy, so it is snapshotted to a file
//! ([`ProvenanceIndex::save`], written aside then renamed) and reloaded at start
//! ([`ProvenanceIndex::load`]), expired owners dropped.
//!
//! The index is split into shards by hash, each behind its own lock, so a lookup waits at
//! most for one shard's share of one insert, never for a whole prompt; a text's hashes are
//! inserted shard by shard. Bounds (see `shard`): past `max_hashes` the oldest entries
//! are evicted, one tenant holds at most `max_tenant_share` of the index (past it, its own
//! oldest entries go), and one text records at most `max_hashes_per_text` hashes (an
//! evenly spread sample; the rest are counted as dropped). Nothing is refused silently:
//! evictions and drops are counted for `/metrics`.
//!
//! Invariants: only keyed hashes are held, never text; an owner past its expiry is never
//! reported; memory is bounded by `max_hashes`.

mod shard;
mod snapshot;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use firewall::{NgramKey, NgramOwners, OwnerSet};

use self::shard::{Evicted, Limits, Shard, Upserted, NATIVE, RECEIVED};
use self::snapshot::SnapshotEntry;
use crate::metrics::{Exposition, Kind};
use crate::store::{now_ms, FingerprintBatch, FingerprintCursor, Role, Store, StoreError};

/// How the index fingerprints and how long it remembers.
#[derive(Debug, Clone)]
pub struct ProvenanceSettings {
    /// Words per n-gram (the firewall's `NgramConfig::n` must be the same).
    pub ngram_words: usize,
    pub ttl_secs: u64,
    /// The per-deployment SipHash key (the firewall's `NgramConfig::key` must be the same).
    pub key: NgramKey,
    /// Most distinct hashes held in memory.
    pub max_hashes: usize,
    /// Largest fraction of `max_hashes` one tenant's entries may hold.
    pub max_tenant_share: f64,
    /// Most hashes recorded from one text (a prompt or a response).
    pub max_hashes_per_text: usize,
    /// Most tenants named in one answer (`shared_by` still counts them all).
    pub max_owners_listed: usize,
}

impl ProvenanceSettings {
    pub fn new(key: NgramKey) -> ProvenanceSettings {
        ProvenanceSettings {
            ngram_words: firewall::DEFAULT_NGRAM_WORDS,
            ttl_secs: 86_400,
            key,
            max_hashes: 20_000_000,
            max_tenant_share: 0.5,
            max_hashes_per_text: 100_000,
            max_owners_listed: 8,
        }
    }

    /// Shards: one per 64 Ki hashes of capacity, at most 64, so a small index (tests)
    /// is one shard and its bounds are exact.
    fn shard_count(&self) -> usize {
        (self.max_hashes / 65_536).clamp(1, 64)
    }

    /// One shard's bounds (the index's, spread evenly: hashes are uniform).
    fn shard_limits(&self) -> Limits {
        let n = self.shard_count();
        let per_tenant = (self.max_hashes as f64 * self.max_tenant_share.clamp(0.0, 1.0)) as usize;
        Limits { max_hashes: self.max_hashes.div_ceil(n).max(1), max_per_tenant: per_tenant.div_ceil(n).max(1) }
    }
}

/// Tenant names, interned: index -> name and name -> index.
#[derive(Debug, Default)]
struct Tenants {
    names: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
}

/// The index. Share it as `Arc<ProvenanceIndex>`; it is also the firewall's `NgramOwners`.
#[derive(Debug)]
pub struct ProvenanceIndex {
    settings: ProvenanceSettings,
    limits: Limits,
    replica: String,
    tenants: RwLock<Tenants>,
    shards: Box<[RwLock<Shard>]>,
    cursor: tokio::sync::Mutex<FingerprintCursor>,
    /// Hashes not recorded: past `max_hashes_per_text` in one text.
    dropped: AtomicU64,
    evicted_full: AtomicU64,
    evicted_share: AtomicU64,
    last_prune_s: AtomicU64,
    /// When other replicas' fingerprints were last pulled up to date (ms; 0 = never).
    last_pulled_ms: AtomicU64,
    /// Bumped by every record or merge; `saved` is its value at the last snapshot.
    changes: AtomicU64,
    saved: AtomicU64,
}

/// Sizes for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProvenanceSize {
    pub hashes: usize,
    pub tenants: usize,
    /// Hashes not recorded because their text had more than `max_hashes_per_text`.
    pub dropped: u64,
    /// Owner entries evicted because the index was full.
    pub evicted_full: u64,
    /// Owner entries evicted because their tenant was at its share.
    pub evicted_tenant_share: u64,
}

impl ProvenanceIndex {
    /// `replica` names this process in shared batches (e.g. `RedisSettings::replica_id`).
    pub fn new(settings: ProvenanceSettings, replica: impl Into<String>) -> ProvenanceIndex {
        let shards = (0..settings.shard_count()).map(|_| RwLock::new(Shard::default())).collect();
        ProvenanceIndex {
            limits: settings.shard_limits(),
            settings,
            replica: replica.into(),
            tenants: RwLock::new(Tenants::default()),
            shards,
            cursor: tokio::sync::Mutex::new(FingerprintCursor::default()),
            dropped: AtomicU64::new(0),
            evicted_full: AtomicU64::new(0),
            evicted_share: AtomicU64::new(0),
            last_prune_s: AtomicU64::new(0),
            last_pulled_ms: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            saved: AtomicU64::new(0),
        }
    }

    fn shard_of(&self, hash: u64) -> usize {
        // The hashes are keyed SipHash outputs: uniform, so the low bits spread evenly.
        (hash % self.shards.len() as u64) as usize
    }

    fn tenant_id(&self, tenant: &str) -> u32 {
        if let Some(id) = self.tenants.read().unwrap_or_else(|p| p.into_inner()).ids.get(tenant) {
            return *id;
        }
        let mut t = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        if let Some(id) = t.ids.get(tenant) {
            return *id;
        }
        let id = t.names.len() as u32;
        let name: Arc<str> = Arc::from(tenant);
        t.names.push(name.clone());
        t.ids.insert(name, id);
        id
    }

    /// Writes the live owners to `path` (a temporary file, synced, then renamed over it)
    /// unless nothing changed since the last save. Returns whether it wrote.
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<bool> {
        use std::io::Write as _;
        let changes = self.changes.load(Ordering::Acquire);
        if changes == self.saved.load(Ordering::Acquire) && path.exists() {
            return Ok(false);
        }
        let now = now_ms() / 1000;
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner()).names.clone();
        // Copied one shard at a time under its read lock, written without any.
        let mut entries: Vec<SnapshotEntry> = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.read().unwrap_or_else(|p| p.into_inner());
            entries.extend(
                shard
                    .iter()
                    .flat_map(|(h, o)| o.as_slice().iter().filter(|(_, e)| *e > now).map(move |(w, e)| (*h, *w, *e))),
            );
        }
        let buf = snapshot::encode(&tenants, &entries);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(&buf)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        self.saved.store(changes, Ordering::Release);
        Ok(true)
    }

    /// Merges a snapshot written by [`ProvenanceIndex::save`]; returns the live entries
    /// loaded. A missing file is an empty index; a malformed one is an error (and nothing
    /// of it is loaded).
    pub fn load(&self, path: &std::path::Path) -> std::io::Result<usize> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let (tenants, mut entries) = snapshot::parse(&bytes).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "not a provenance snapshot, or truncated")
        })?;
        let now = now_ms() / 1000;
        let ids: Vec<u32> = tenants.iter().map(|t| self.tenant_id(t)).collect();
        // Oldest first, so that eviction order survives the reload.
        entries.retain(|(_, _, e)| *e > now);
        entries.sort_unstable_by_key(|(_, _, e)| *e);
        let mut evicted = Evicted::default();
        let mut loaded = 0;
        for (h, w, e) in entries {
            let word = match ids.get((w & !RECEIVED) as usize) {
                _ if w == NATIVE => NATIVE,
                Some(id) => id | (w & RECEIVED),
                None => continue,
            };
            let mut shard = self.shards[self.shard_of(h)].write().unwrap_or_else(|p| p.into_inner());
            shard.upsert(h, word, e, self.limits, &mut evicted);
            loaded += 1;
        }
        self.count_evicted(evicted);
        Ok(loaded)
    }

    pub fn settings(&self) -> &ProvenanceSettings {
        &self.settings
    }

    /// Indexes `text`'s n-grams and tokens under `tenant` in `role` and returns the hashes to
    /// share through the store (see [`ProvenanceIndex::record_hashes`]).
    pub fn record(&self, tenant: &str, role: Role, text: &str) -> Option<FingerprintBatch> {
        let (ngrams, tokens) = firewall::fingerprints_and_tokens(text, &self.settings.key, self.settings.ngram_words);
        self.record_hashes(tenant, role, tokens, ngrams)
    }

    /// Indexes one text's hashes made with the index's key: `secrets` (e.g.
    /// [`firewall::secret_fingerprints`] and [`firewall::token_fingerprints`]) first, then
    /// `ngrams` (in text order), together at
    /// most `max_hashes_per_text`: past it, an evenly spread sample of the n-grams is kept
    /// (a copied run longer than the sampling step still hits one) and the rest counted as
    /// dropped. Returns the hashes to share: those new for this tenant (or raised to
    /// sender) or past half their time to live (so a hot n-gram is re-shared about twice per
    /// TTL, not on every request); `None` when there is nothing to share.
    pub fn record_hashes(
        &self,
        tenant: &str,
        role: Role,
        mut secrets: Vec<u64>,
        ngrams: Vec<u64>,
    ) -> Option<FingerprintBatch> {
        let cap = self.settings.max_hashes_per_text.max(1);
        let offered = secrets.len() + ngrams.len();
        secrets.truncate(cap);
        let room = cap - secrets.len();
        secrets.extend(sample_evenly(ngrams, room));
        let mut hashes = secrets;
        self.dropped.fetch_add((offered - hashes.len()) as u64, Ordering::Relaxed);
        let now = now_ms() / 1000;
        let expires = now + self.settings.ttl_secs;
        let word = self.tenant_id(tenant) | role_bit(role);
        let mut to_share = self.upsert_all(&mut hashes, word, expires, now);
        to_share.retain(|(_, up)| up.previous.is_none_or(|old| up.raised || old <= now + self.settings.ttl_secs / 2));
        let hashes: Vec<u64> = to_share.into_iter().map(|(h, _)| h).collect();
        (!hashes.is_empty()).then(|| FingerprintBatch {
            tenant: tenant.to_owned(),
            expires_at_s: expires,
            replica: self.replica.clone(),
            role,
            hashes,
        })
    }

    /// Inserts `hashes` (sorted and deduplicated here) as owned by `word`, one shard lock at
    /// a time; returns what each upsert did. Received text no tenant sent is marked native.
    fn upsert_all(&self, hashes: &mut Vec<u64>, word: u32, expires: u64, now: u64) -> Vec<(u64, Upserted)> {
        let shard_of = |h: &u64| self.shard_of(*h);
        hashes.sort_unstable_by_key(|h| (shard_of(h), *h));
        hashes.dedup();
        self.changes.fetch_add(1, Ordering::AcqRel);
        let mut out = Vec::with_capacity(hashes.len());
        let mut evicted = Evicted::default();
        for group in hashes.chunk_by(|a, b| shard_of(a) == shard_of(b)) {
            let mut shard = self.shards[shard_of(&group[0])].write().unwrap_or_else(|p| p.into_inner());
            for h in group {
                if word & RECEIVED != 0 && !is_sent(&shard, *h, now) {
                    shard.upsert(*h, NATIVE, expires, self.limits, &mut evicted);
                }
                out.push((*h, shard.upsert(*h, word, expires, self.limits, &mut evicted)));
            }
        }
        self.count_evicted(evicted);
        out
    }

    fn count_evicted(&self, evicted: Evicted) {
        self.evicted_full.fetch_add(evicted.full, Ordering::Relaxed);
        self.evicted_share.fetch_add(evicted.tenant_share, Ordering::Relaxed);
    }

    /// Merges a batch recorded elsewhere (another replica, or a reload).
    pub fn merge(&self, batch: &FingerprintBatch) {
        let now = now_ms() / 1000;
        if batch.expires_at_s <= now {
            return;
        }
        let word = self.tenant_id(&batch.tenant) | role_bit(batch.role);
        let mut hashes = batch.hashes.clone();
        self.upsert_all(&mut hashes, word, batch.expires_at_s, now);
    }

    /// Pulls what other replicas recorded since the last refresh, page by page (each
    /// merged before the next is read: a starting replica never holds the whole stream),
    /// and drops expired owners (at most once a minute). Returns how many batches were
    /// merged; on success the index is up to date as of the call.
    pub async fn refresh(&self, store: &Store) -> Result<usize, StoreError> {
        let started = now_ms();
        let mut cursor = self.cursor.lock().await;
        let mut merged = 0;
        loop {
            let page = store.read_fingerprints(&cursor).await?;
            *cursor = page.next;
            for b in page.batches.iter().filter(|b| b.replica != self.replica) {
                self.merge(b);
                merged += 1;
            }
            if !page.more {
                break;
            }
        }
        drop(cursor);
        self.last_pulled_ms.fetch_max(started, Ordering::Relaxed);
        if started / 1000 >= self.last_prune_s.load(Ordering::Relaxed) + 60 {
            self.prune();
        }
        Ok(merged)
    }

    /// When other replicas' fingerprints were last pulled up to date (ms since the epoch),
    /// `None` before the first successful [`ProvenanceIndex::refresh`].
    pub fn last_pulled_ms(&self) -> Option<u64> {
        Some(self.last_pulled_ms.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    /// Drops every expired owner now, one shard at a time.
    pub fn prune(&self) {
        let now = now_ms() / 1000;
        self.last_prune_s.store(now, Ordering::Relaxed);
        for shard in self.shards.iter() {
            shard.write().unwrap_or_else(|p| p.into_inner()).prune(now);
        }
    }

    pub fn size(&self) -> ProvenanceSize {
        let hashes = self.shards.iter().map(|s| s.read().unwrap_or_else(|p| p.into_inner()).len()).sum();
        ProvenanceSize {
            hashes,
            tenants: self.tenants.read().unwrap_or_else(|p| p.into_inner()).names.len(),
            dropped: self.dropped.load(Ordering::Relaxed),
            evicted_full: self.evicted_full.load(Ordering::Relaxed),
            evicted_tenant_share: self.evicted_share.load(Ordering::Relaxed),
        }
    }

    /// `/metrics` families of the index.
    pub fn write_metrics(&self, out: &mut Exposition) {
        let s = self.size();
        out.family("crossguard_provenance_hashes", Kind::Gauge, "N-gram hashes in the provenance index.")
            .sample(&[], s.hashes);
        out.family(
            "crossguard_provenance_dropped_total",
            Kind::Counter,
            "Hashes not indexed: past provenance.max_hashes_per_text in one text.",
        )
        .sample(&[], s.dropped);
        out.family(
            "crossguard_provenance_evicted_total",
            Kind::Counter,
            "Owner entries evicted to make room, by cause.",
        )
        .sample(&[("reason", "full")], s.evicted_full)
        .sample(&[("reason", "tenant_share")], s.evicted_tenant_share);
    }

    fn owners_at(&self, hash: u64, now: u64) -> OwnerSet {
        let mut live: Vec<u32> = {
            let shard = self.shards[self.shard_of(hash)].read().unwrap_or_else(|p| p.into_inner());
            let Some(owners) = shard.get(hash) else { return OwnerSet::default() };
            owners.as_slice().iter().filter(|(_, e)| *e > now).map(|(w, _)| *w).collect()
        };
        let len = live.len();
        live.retain(|w| *w != NATIVE);
        // Senders first (the bit is clear), so a truncated list names them.
        live.sort_unstable_by_key(|w| w & RECEIVED);
        let mut set = OwnerSet { tenants: Vec::new(), shared_by: live.len(), model_native: live.len() < len };
        if live.first().is_none_or(|w| w & RECEIVED != 0) {
            return set;
        }
        let tenants = self.tenants.read().unwrap_or_else(|p| p.into_inner());
        for w in live.into_iter().take(self.settings.max_owners_listed) {
            if let Some(name) = tenants.names.get((w & !RECEIVED) as usize) {
                set.tenants.push(name.to_string());
            }
        }
        set
    }
}

/// Whether a live owner of `hash` sent it (the native mark and receivers do not count).
fn is_sent(shard: &Shard, hash: u64, now: u64) -> bool {
    shard.get(hash).is_some_and(|o| o.as_slice().iter().any(|(w, e)| *e > now && *w & RECEIVED == 0 && *w != NATIVE))
}

/// At most `cap` of `items`, spread evenly over them (all of them when they fit).
fn sample_evenly(items: Vec<u64>, cap: usize) -> Vec<u64> {
    if items.len() <= cap {
        return items;
    }
    let n = items.len();
    (0..cap).map(|i| items[i * n / cap]).collect()
}

fn role_bit(role: Role) -> u32 {
    match role {
        Role::Sent => 0,
        Role::Received => RECEIVED,
    }
}

impl NgramOwners for ProvenanceIndex {
    fn owners(&self, hash: u64) -> OwnerSet {
        self.owners_at(hash, now_ms() / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: NgramKey = NgramKey(*b"0123456789abcdef");
    const TEXT: &str = "the quarterly numbers for project nightingale show a deficit of four million";

    fn index(replica: &str) -> ProvenanceIndex {
        ProvenanceIndex::new(ProvenanceSettings { ngram_words: 4, ..ProvenanceSettings::new(KEY) }, replica)
    }

    fn first_hash(text: &str) -> u64 {
        firewall::fingerprints(text, &KEY, 4)[0]
    }

    #[test]
    fn a_snapshot_restores_owners_and_roles_and_a_corrupt_one_loads_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fingerprints.idx");
        let idx = index("r1");
        idx.record("acme", Role::Sent, TEXT);
        idx.record("globex", Role::Received, TEXT);
        assert!(idx.save(&path).unwrap());
        assert!(!idx.save(&path).unwrap(), "unchanged: not rewritten");
        let back = index("r1");
        assert_eq!(back.load(&path).unwrap(), 2 * firewall::fingerprints(TEXT, &KEY, 4).len());
        assert_eq!(back.owners(first_hash(TEXT)), idx.owners(first_hash(TEXT)));
        let bytes = std::fs::read(&path).unwrap();
        for cut in [0, 9, bytes.len() / 2, bytes.len() - 1] {
            std::fs::write(&path, &bytes[..cut]).unwrap();
            let fresh = index("r1");
            assert!(fresh.load(&path).is_err(), "cut at {cut}");
            assert_eq!(fresh.size().hashes, 0);
        }
        assert_eq!(index("r1").load(&dir.path().join("missing")).unwrap(), 0);
    }

    #[test]
    fn received_text_alone_is_never_foreign_but_counts_as_shared() {
        let idx = index("r1");
        let h = first_hash(TEXT);
        idx.record("globex", Role::Sent, TEXT);
        idx.record("acme", Role::Received, TEXT);
        assert_eq!(
            idx.owners(h),
            OwnerSet { tenants: vec!["globex".into(), "acme".into()], shared_by: 2, model_native: false }
        );
        let other = "a wholly different sentence that acme only ever received";
        idx.record("acme", Role::Received, other);
        assert_eq!(idx.owners(first_hash(other)).tenants, Vec::<String>::new());
        // Receiving it again never lowers a sender; sending it raises a receiver (and is shared).
        assert!(idx.record("globex", Role::Received, TEXT).is_none());
        assert!(idx.record("acme", Role::Sent, TEXT).is_some());
        assert_eq!(idx.owners(h).tenants, vec!["globex".to_owned(), "acme".to_owned()]);
    }

    #[test]
    fn text_the_model_said_before_anyone_sent_it_stays_native() {
        let idx = index("r1");
        let h = first_hash(TEXT);
        idx.record("acme", Role::Received, TEXT);
        assert_eq!(idx.owners(h), OwnerSet { tenants: vec![], shared_by: 1, model_native: true });
        // A tenant sending the model's phrasing later does not make it its own secret.
        idx.record("globex", Role::Sent, TEXT);
        let o = idx.owners(h);
        assert!(o.model_native && o.tenants == ["globex", "acme"] && o.shared_by == 2, "{o:?}");
        // Sent first, received later: not native (the model may be echoing a tenant's text).
        let sent_first = "a sentence that globex typed before any answer quoted it back";
        idx.record("globex", Role::Sent, sent_first);
        idx.record("acme", Role::Received, sent_first);
        assert!(!idx.owners(first_hash(sent_first)).model_native);
        // The mark survives a snapshot and travels in received batches.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fingerprints.idx");
        idx.save(&path).unwrap();
        let back = index("r1");
        back.load(&path).unwrap();
        assert_eq!(back.owners(h), idx.owners(h));
        let peer = index("r2");
        let batch = index("r3").record("initech", Role::Received, TEXT).unwrap();
        peer.merge(&batch);
        assert!(peer.owners(h).model_native);
    }

    #[test]
    fn recorded_text_is_owned_and_shared_counts_tenants() {
        let idx = index("r1");
        let batch = idx.record("acme", Role::Sent, TEXT).unwrap();
        assert_eq!(batch.hashes.len(), firewall::fingerprints(TEXT, &KEY, 4).len());
        let h = first_hash(TEXT);
        assert_eq!(idx.owners(h), OwnerSet { tenants: vec!["acme".into()], shared_by: 1, model_native: false });
        idx.record("globex", Role::Sent, TEXT);
        let o = idx.owners(h);
        assert_eq!((o.shared_by, o.tenants.len()), (2, 2));
        assert_eq!(idx.owners(first_hash("entirely different words go right here")), OwnerSet::default());
    }

    #[test]
    fn recording_again_shares_nothing_new_until_half_the_ttl() {
        let idx = index("r1");
        assert!(idx.record("acme", Role::Sent, TEXT).is_some());
        assert!(idx.record("acme", Role::Sent, TEXT).is_none());
        assert!(idx.record("acme", Role::Sent, "three words only").is_none());
    }

    #[test]
    fn expired_owners_are_not_reported_and_are_pruned() {
        let idx = index("r1");
        let h = first_hash(TEXT);
        let now = now_ms() / 1000;
        idx.merge(&FingerprintBatch {
            tenant: "old".into(),
            expires_at_s: now + 5,
            replica: "r2".into(),
            role: Role::Sent,
            hashes: vec![h],
        });
        idx.record("acme", Role::Sent, TEXT);
        assert_eq!(idx.owners(h).shared_by, 2);
        assert_eq!(idx.owners_at(h, now + 10).tenants, ["acme"]);
        idx.merge(&FingerprintBatch {
            tenant: "gone".into(),
            expires_at_s: now.saturating_sub(1),
            replica: "r2".into(),
            role: Role::Sent,
            hashes: vec![7],
        });
        assert_eq!(idx.size().hashes, firewall::fingerprints(TEXT, &KEY, 4).len());
    }

    fn small(max_hashes: usize, share: f64, per_text: usize) -> ProvenanceIndex {
        let settings = ProvenanceSettings {
            ngram_words: 1,
            max_hashes,
            max_tenant_share: share,
            max_hashes_per_text: per_text,
            ..ProvenanceSettings::new(KEY)
        };
        ProvenanceIndex::new(settings, "r1")
    }

    /// `n` distinct one-word n-grams.
    fn words(prefix: &str, n: usize) -> String {
        (0..n).map(|i| format!("{prefix}{i}")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn a_full_index_evicts_the_oldest_and_keeps_indexing() {
        let idx = small(10, 1.0, 100);
        idx.record("acme", Role::Sent, &words("a", 10));
        idx.record("globex", Role::Sent, &words("b", 4));
        let s = idx.size();
        assert_eq!((s.hashes, s.evicted_full, s.evicted_tenant_share, s.dropped), (10, 4, 0, 0));
        let hash = |w: &str| firewall::fingerprints(w, &KEY, 1)[0];
        assert_eq!(idx.owners(hash("b3")).tenants, ["globex"], "the newest text is indexed");
        let kept = (0..10).filter(|i| !idx.owners(hash(&format!("a{i}"))).tenants.is_empty()).count();
        assert_eq!(kept, 6);
    }

    #[test]
    fn a_flooding_tenant_evicts_only_its_own_entries() {
        let idx = small(10, 0.5, 100);
        idx.record("globex", Role::Sent, &words("g", 3));
        for round in 0..5 {
            idx.record("mallory", Role::Sent, &words(&format!("m{round}x"), 8));
        }
        let hash = |w: &str| firewall::fingerprints(w, &KEY, 1)[0];
        assert!((0..3).all(|i| idx.owners(hash(&format!("g{i}"))).tenants == ["globex"]));
        let newest = (0..8).filter(|i| idx.owners(hash(&format!("m4x{i}"))).tenants == ["mallory"]).count();
        assert_eq!(newest, 5, "the flooder's newest text fills its share");
        let s = idx.size();
        assert_eq!(s.hashes, 8, "globex 3 + mallory at its share of 5");
        assert_eq!(s.evicted_tenant_share, 35);
        // a later prompt of another tenant is indexed too
        idx.record("initech", Role::Sent, &words("i", 2));
        assert!(idx.owners(hash("i1")).tenants == ["initech"]);
    }

    #[test]
    fn one_text_records_an_even_sample_past_its_cap_and_secrets_first() {
        let idx = small(1000, 1.0, 10);
        let ngrams: Vec<u64> = (0..100).collect();
        let batch = idx.record_hashes("acme", Role::Sent, vec![1_000, 1_001], ngrams).unwrap();
        assert_eq!(batch.hashes.len(), 10);
        assert!(batch.hashes.contains(&1_000) && batch.hashes.contains(&1_001));
        let mut kept: Vec<u64> = batch.hashes.iter().copied().filter(|h| *h < 100).collect();
        kept.sort_unstable();
        assert_eq!(kept, [0, 12, 25, 37, 50, 62, 75, 87]);
        assert_eq!(idx.size().dropped, 92);
    }

    #[test]
    fn a_token_in_a_long_text_is_recorded_whatever_the_sample() {
        let idx = small(1000, 1.0, 10);
        let token = "7Hq2Lx9Vb4Nz8Kc3Wd5Rf6Tg";
        idx.record("acme", Role::Sent, &format!("{} {token} {}", words("a", 50), words("b", 50)));
        let hash = firewall::token_fingerprints(token, &KEY)[0];
        assert_eq!(idx.owners(hash).tenants, ["acme"]);
        assert_eq!(idx.size().hashes, 10);
    }

    #[test]
    fn a_big_index_is_sharded_with_even_bounds() {
        let s = ProvenanceSettings::new(KEY);
        assert_eq!(s.shard_count(), 64);
        let l = s.shard_limits();
        assert_eq!((l.max_hashes, l.max_per_tenant), (312_500, 156_250));
        let tiny = ProvenanceSettings { max_hashes: 1000, max_tenant_share: 0.001, ..s };
        assert_eq!((tiny.shard_count(), tiny.shard_limits().max_per_tenant), (1, 1));
    }

    #[test]
    fn owner_lists_are_truncated_but_counted() {
        let idx = ProvenanceIndex::new(
            ProvenanceSettings { ngram_words: 4, max_owners_listed: 2, ..ProvenanceSettings::new(KEY) },
            "r1",
        );
        for t in ["a", "b", "c", "d"] {
            idx.record(t, Role::Sent, TEXT);
        }
        let o = idx.owners(first_hash(TEXT));
        assert_eq!((o.tenants.len(), o.shared_by), (2, 4));
    }

    #[tokio::test]
    async fn refresh_from_the_embedded_store_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::memory(dir.path(), 10, &crate::config::ResponsesConfig::default()).unwrap();
        let idx = index("r1");
        assert_eq!(idx.refresh(&store).await.unwrap(), 0);
    }
}
