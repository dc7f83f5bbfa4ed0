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
//! it on its own. Such an n-gram is marked (an owner entry under [`NATIVE`]) and answered
//! with `model_native`, which the firewall never takes for a leak — so a tenant that later
//! sends common model phrasing cannot get other tenants' ordinary answers blocked.
//!
//! With the embedded store the index is the only copy, so it is snapshotted to a file
//! ([`ProvenanceIndex::save`], written aside then renamed) and reloaded at start
//! ([`ProvenanceIndex::load`]), expired owners dropped.
//!
//! Invariants: only keyed hashes are held, never text; an owner past its expiry is never
//! reported; memory is bounded by `max_hashes` (past it, new hashes are not indexed and are
//! counted in `dropped`, after expired ones have been pruned).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use firewall::{NgramKey, NgramOwners, OwnerSet};

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
    /// Most tenants named in one answer (`shared_by` still counts them all).
    pub max_owners_listed: usize,
}

impl ProvenanceSettings {
    pub fn new(key: NgramKey) -> ProvenanceSettings {
        ProvenanceSettings { ngram_words: firewall::detect::ngram::DEFAULT_N, ttl_secs: 86_400, key, max_hashes: 20_000_000, max_owners_listed: 8 }
    }
}

/// Marks an owner that only received the n-gram (the top bit of its tenant word).
const RECEIVED: u32 = 1 << 31;

/// The tenant word of the model-native mark: no tenant index reaches it (interning stops
/// long before), and it is never listed, shared or counted as a tenant.
const NATIVE: u32 = RECEIVED - 1;

/// Owners of one hash: (tenant word, expiry in Unix seconds), where the tenant word is the
/// tenant index, with [`RECEIVED`] set for a received-only owner. One owner is the common
/// case and needs no allocation.
#[derive(Debug, Clone)]
enum Owners {
    One((u32, u64)),
    Many(Vec<(u32, u64)>),
}

impl Owners {
    fn as_slice(&self) -> &[(u32, u64)] {
        match self {
            Owners::One(pair) => std::slice::from_ref(pair),
            Owners::Many(v) => v,
        }
    }

    /// Sets `tenant`'s expiry to at least `expires` (`word` is its tenant word, so a
    /// sender replaces a received-only owner); returns its previous expiry, or `None` when
    /// it is new or its role was raised to sender (either needs sharing).
    fn upsert(&mut self, word: u32, expires: u64) -> Option<u64> {
        let update = |(w, e): &mut (u32, u64)| {
            let raised = *w & RECEIVED != 0 && word & RECEIVED == 0;
            let old = *e;
            *w &= word | !RECEIVED;
            *e = old.max(expires);
            (!raised).then_some(old)
        };
        let same = |w: u32| w & !RECEIVED == word & !RECEIVED;
        match self {
            Owners::One(pair) if same(pair.0) => update(pair),
            Owners::One(pair) => {
                *self = Owners::Many(vec![*pair, (word, expires)]);
                None
            }
            Owners::Many(v) => match v.iter_mut().find(|(w, _)| same(*w)) {
                Some(pair) => update(pair),
                None => {
                    v.push((word, expires));
                    None
                }
            },
        }
    }

    /// Drops expired owners; false when none is left.
    fn retain_live(&mut self, now: u64) -> bool {
        match self {
            Owners::One((_, e)) => *e > now,
            Owners::Many(v) => {
                v.retain(|(_, e)| *e > now);
                if let [one] = v.as_slice() {
                    *self = Owners::One(*one);
                }
                !self.as_slice().is_empty()
            }
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    // tenant names, interned: index -> name and name -> index
    tenants: Vec<Arc<str>>,
    tenant_ids: HashMap<Arc<str>, u32>,
    map: HashMap<u64, Owners>,
    last_prune_s: u64,
}

impl Inner {
    fn tenant_id(&mut self, tenant: &str) -> u32 {
        if let Some(id) = self.tenant_ids.get(tenant) {
            return *id;
        }
        let id = self.tenants.len() as u32;
        let name: Arc<str> = Arc::from(tenant);
        self.tenants.push(name.clone());
        self.tenant_ids.insert(name, id);
        id
    }

    fn prune(&mut self, now: u64) {
        self.map.retain(|_, o| o.retain_live(now));
        self.last_prune_s = now;
    }
}

/// The index. Share it as `Arc<ProvenanceIndex>`; it is also the firewall's `NgramOwners`.
#[derive(Debug)]
pub struct ProvenanceIndex {
    settings: ProvenanceSettings,
    replica: String,
    inner: RwLock<Inner>,
    cursor: tokio::sync::Mutex<FingerprintCursor>,
    dropped: AtomicU64,
    /// Bumped by every record or merge; `saved` is its value at the last snapshot.
    changes: AtomicU64,
    saved: AtomicU64,
}

/// One snapshot entry: (hash, tenant word, expiry in Unix seconds).
type SnapshotEntry = (u64, u32, u64);

/// First bytes of a snapshot file (format version 1).
const SNAPSHOT_MAGIC: &[u8; 8] = b"CGFPIDX1";

/// Sizes for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProvenanceSize {
    pub hashes: usize,
    pub tenants: usize,
    /// Hashes not indexed because the index was full.
    pub dropped: u64,
}

impl ProvenanceIndex {
    /// `replica` names this process in shared batches (e.g. `RedisSettings::replica_id`).
    pub fn new(settings: ProvenanceSettings, replica: impl Into<String>) -> ProvenanceIndex {
        ProvenanceIndex {
            settings,
            replica: replica.into(),
            inner: RwLock::new(Inner::default()),
            cursor: tokio::sync::Mutex::new(FingerprintCursor::default()),
            dropped: AtomicU64::new(0),
            changes: AtomicU64::new(0),
            saved: AtomicU64::new(0),
        }
    }

    /// Writes the live owners to `path` (a temporary file, synced, then renamed over it)
    /// unless nothing changed since the last save. Returns whether it wrote.
    ///
    /// Layout (little-endian): magic, tenant count u32, each tenant as u16 length + UTF-8,
    /// entry count u64, each entry as hash u64, tenant word u32, expiry u64.
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<bool> {
        use std::io::Write as _;
        let changes = self.changes.load(Ordering::Acquire);
        if changes == self.saved.load(Ordering::Acquire) && path.exists() {
            return Ok(false);
        }
        let now = now_ms() / 1000;
        // Copied under the read lock, written without it.
        let (tenants, entries): (Vec<Arc<str>>, Vec<SnapshotEntry>) = {
            let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
            let entries =
                inner.map.iter().flat_map(|(h, o)| o.as_slice().iter().filter(|(_, e)| *e > now).map(move |(w, e)| (*h, *w, *e))).collect();
            (inner.tenants.clone(), entries)
        };
        let mut buf = Vec::with_capacity(16 + entries.len() * 20);
        buf.extend_from_slice(SNAPSHOT_MAGIC);
        buf.extend_from_slice(&(tenants.len() as u32).to_le_bytes());
        for t in &tenants {
            let bytes = t.as_bytes();
            buf.extend_from_slice(&(bytes.len().min(u16::MAX as usize) as u16).to_le_bytes());
            buf.extend_from_slice(&bytes[..bytes.len().min(u16::MAX as usize)]);
        }
        buf.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for (h, w, e) in &entries {
            buf.extend_from_slice(&h.to_le_bytes());
            buf.extend_from_slice(&w.to_le_bytes());
            buf.extend_from_slice(&e.to_le_bytes());
        }
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
        let (tenants, entries) = parse_snapshot(&bytes)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, "not a provenance snapshot, or truncated"))?;
        let now = now_ms() / 1000;
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let ids: Vec<u32> = tenants.iter().map(|t| inner.tenant_id(t)).collect();
        let mut loaded = 0;
        for (h, w, e) in entries {
            let word = match ids.get((w & !RECEIVED) as usize) {
                _ if w == NATIVE => NATIVE,
                Some(id) => id | (w & RECEIVED),
                None => continue,
            };
            if e > now {
                self.upsert(&mut inner, h, word, e, now);
                loaded += 1;
            }
        }
        Ok(loaded)
    }

    pub fn settings(&self) -> &ProvenanceSettings {
        &self.settings
    }

    /// Indexes `text` under `tenant` in `role` and returns the hashes to share through the
    /// store: those new for this tenant (or raised to sender) or past half their time to
    /// live (so a hot n-gram is re-shared about twice per TTL, not on every request).
    /// `None` when there is nothing to share.
    pub fn record(&self, tenant: &str, role: Role, text: &str) -> Option<FingerprintBatch> {
        self.record_hashes(tenant, role, firewall::fingerprints(text, &self.settings.key, self.settings.ngram_words))
    }

    /// [`ProvenanceIndex::record`] for hashes made elsewhere with the same key (e.g.
    /// [`firewall::secret_fingerprints`]).
    pub fn record_hashes(&self, tenant: &str, role: Role, mut hashes: Vec<u64>) -> Option<FingerprintBatch> {
        hashes.sort_unstable();
        hashes.dedup();
        let now = now_ms() / 1000;
        let expires = now + self.settings.ttl_secs;
        let refresh_before = now + self.settings.ttl_secs / 2;
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let word = inner.tenant_id(tenant) | role_bit(role);
        self.changes.fetch_add(1, Ordering::AcqRel);
        if role == Role::Received {
            self.mark_native(&mut inner, &hashes, expires, now);
        }
        hashes.retain(|h| match self.upsert(&mut inner, *h, word, expires, now) {
            Some(old) => old <= refresh_before,
            None => true,
        });
        drop(inner);
        (!hashes.is_empty())
            .then(|| FingerprintBatch { tenant: tenant.to_owned(), expires_at_s: expires, replica: self.replica.clone(), role, hashes })
    }

    /// Marks as model-native every hash among `hashes` (received text) that no tenant sent.
    fn mark_native(&self, inner: &mut Inner, hashes: &[u64], expires: u64, now: u64) {
        for h in hashes {
            let sent = inner.map.get(h).is_some_and(|o| o.as_slice().iter().any(|(w, e)| *e > now && *w & RECEIVED == 0 && *w != NATIVE));
            if !sent {
                self.upsert(inner, *h, NATIVE, expires, now);
            }
        }
    }

    /// Inserts one owner; returns its previous expiry if it was already there.
    fn upsert(&self, inner: &mut Inner, hash: u64, tenant: u32, expires: u64, now: u64) -> Option<u64> {
        if let Some(o) = inner.map.get_mut(&hash) {
            return o.upsert(tenant, expires);
        }
        if inner.map.len() >= self.settings.max_hashes {
            // Full: prune expired owners, at most once a minute (it walks the whole map).
            if now >= inner.last_prune_s + 60 {
                inner.prune(now);
            }
            if inner.map.len() >= self.settings.max_hashes {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        inner.map.insert(hash, Owners::One((tenant, expires)));
        None
    }

    /// Merges a batch recorded elsewhere (another replica, or a reload).
    pub fn merge(&self, batch: &FingerprintBatch) {
        let now = now_ms() / 1000;
        if batch.expires_at_s <= now {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        let word = inner.tenant_id(&batch.tenant) | role_bit(batch.role);
        self.changes.fetch_add(1, Ordering::AcqRel);
        if batch.role == Role::Received {
            self.mark_native(&mut inner, &batch.hashes, batch.expires_at_s, now);
        }
        for h in &batch.hashes {
            self.upsert(&mut inner, *h, word, batch.expires_at_s, now);
        }
    }

    /// Pulls what other replicas recorded since the last refresh, and drops expired owners
    /// (at most once a minute). Returns how many batches were merged.
    pub async fn refresh(&self, store: &Store) -> Result<usize, StoreError> {
        let mut cursor = self.cursor.lock().await;
        let (batches, next) = store.read_fingerprints(&cursor).await?;
        *cursor = next;
        drop(cursor);
        let foreign: Vec<&FingerprintBatch> = batches.iter().filter(|b| b.replica != self.replica).collect();
        foreign.iter().for_each(|b| self.merge(b));
        let now = now_ms() / 1000;
        let mut inner = self.inner.write().unwrap_or_else(|p| p.into_inner());
        if now >= inner.last_prune_s + 60 {
            inner.prune(now);
        }
        Ok(foreign.len())
    }

    /// Drops every expired owner now.
    pub fn prune(&self) {
        self.inner.write().unwrap_or_else(|p| p.into_inner()).prune(now_ms() / 1000);
    }

    pub fn size(&self) -> ProvenanceSize {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        ProvenanceSize { hashes: inner.map.len(), tenants: inner.tenants.len(), dropped: self.dropped.load(Ordering::Relaxed) }
    }

    /// `/metrics` lines for the index.
    pub fn render_prometheus(&self) -> String {
        let s = self.size();
        format!(
            "# HELP crossguard_provenance_hashes N-gram hashes in the provenance index.\n\
             # TYPE crossguard_provenance_hashes gauge\ncrossguard_provenance_hashes {}\n\
             # HELP crossguard_provenance_dropped_total Hashes not indexed because the index was full.\n\
             # TYPE crossguard_provenance_dropped_total counter\ncrossguard_provenance_dropped_total {}\n",
            s.hashes, s.dropped
        )
    }

    fn owners_at(&self, hash: u64, now: u64) -> OwnerSet {
        let inner = self.inner.read().unwrap_or_else(|p| p.into_inner());
        let Some(owners) = inner.map.get(&hash) else { return OwnerSet::default() };
        let mut live: Vec<u32> = owners.as_slice().iter().filter(|(_, e)| *e > now).map(|(w, _)| *w).collect();
        let len = live.len();
        live.retain(|w| *w != NATIVE);
        // Senders first (the bit is clear), so a truncated list names them.
        live.sort_unstable_by_key(|w| w & RECEIVED);
        let mut set = OwnerSet { tenants: Vec::new(), shared_by: live.len(), model_native: live.len() < len };
        if live.first().is_none_or(|w| w & RECEIVED != 0) {
            return set;
        }
        for w in live.into_iter().take(self.settings.max_owners_listed) {
            if let Some(name) = inner.tenants.get((w & !RECEIVED) as usize) {
                set.tenants.push(name.to_string());
            }
        }
        set
    }
}

/// The tenants and (hash, tenant word, expiry) entries of a snapshot; `None` if malformed.
fn parse_snapshot(bytes: &[u8]) -> Option<(Vec<String>, Vec<SnapshotEntry>)> {
    let mut at = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice())?;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = (at.get(..n)?, at.get(n..)?);
        at = rest;
        Some(head)
    };
    let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
    let mut tenants = Vec::with_capacity(count.min(1 << 16));
    for _ in 0..count {
        let len = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
        tenants.push(String::from_utf8(take(len)?.to_vec()).ok()?);
    }
    let n = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let n = usize::try_from(n).ok()?;
    // Checked against the bytes left before allocating: a corrupt count cannot exhaust memory.
    let body = take(n.checked_mul(20)?)?;
    let entries = body
        .chunks_exact(20)
        .map(|c| {
            let h = u64::from_le_bytes(c[..8].try_into().unwrap_or_default());
            let w = u32::from_le_bytes(c[8..12].try_into().unwrap_or_default());
            let e = u64::from_le_bytes(c[12..].try_into().unwrap_or_default());
            (h, w, e)
        })
        .collect();
    Some((tenants, entries))
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
        assert_eq!(idx.owners(h), OwnerSet { tenants: vec!["globex".into(), "acme".into()], shared_by: 2, model_native: false });
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
        idx.merge(&FingerprintBatch { tenant: "old".into(), expires_at_s: now + 5, replica: "r2".into(), role: Role::Sent, hashes: vec![h] });
        idx.record("acme", Role::Sent, TEXT);
        assert_eq!(idx.owners(h).shared_by, 2);
        assert_eq!(idx.owners_at(h, now + 10).tenants, ["acme"]);
        idx.merge(&FingerprintBatch { tenant: "gone".into(), expires_at_s: now.saturating_sub(1), replica: "r2".into(), role: Role::Sent, hashes: vec![7] });
        assert_eq!(idx.size().hashes, firewall::fingerprints(TEXT, &KEY, 4).len());
    }

    #[test]
    fn the_index_is_bounded() {
        let idx = ProvenanceIndex::new(ProvenanceSettings { ngram_words: 1, max_hashes: 3, ..ProvenanceSettings::new(KEY) }, "r1");
        idx.record("acme", Role::Sent, "a b c d e");
        assert_eq!(idx.size(), ProvenanceSize { hashes: 3, tenants: 1, dropped: 2 });
    }

    #[test]
    fn owner_lists_are_truncated_but_counted() {
        let idx = ProvenanceIndex::new(ProvenanceSettings { ngram_words: 4, max_owners_listed: 2, ..ProvenanceSettings::new(KEY) }, "r1");
        for t in ["a", "b", "c", "d"] {
            idx.record(t, Role::Sent, TEXT);
        }
        let o = idx.owners(first_hash(TEXT));
        assert_eq!((o.tenants.len(), o.shared_by), (2, 4));
    }

    #[tokio::test]
    async fn refresh_from_the_embedded_store_is_a_no_op() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::memory(dir.path(), 10).unwrap();
        let idx = index("r1");
        assert_eq!(idx.refresh(&store).await.unwrap(), 0);
    }
}
