//! One shard of the provenance index: the owners of the hashes that fall in it, and each
//! tenant's owner entries in the order they were recorded, so that the oldest can go.
//!
//! Owns the bounds: a shard holds at most `max_hashes` distinct hashes and at most
//! `max_per_tenant` owner entries of any one tenant. A new entry past a bound evicts the
//! oldest entry first — the tenant's own oldest when the tenant is at its share, the
//! shard's oldest (over all tenants) when the shard is full — so the index never refuses
//! new text: a flooding tenant pushes out its own old text, never everyone's new text.
//!
//! "Oldest" is by expiry (recorded time plus the TTL): each tenant's queue holds
//! `(hash, expiry)` in record order, and a heap holds each queue's front. Both are lazy:
//! an entry whose owner was since refreshed (a later expiry) or removed is *stale* and is
//! skipped when met; both are compacted when stale entries outnumber live ones.
//!
//! Invariants: every live owner entry has exactly one non-stale queue entry; `live` counts
//! them per tenant; every non-empty queue's front has an entry in `fronts`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

/// Marks an owner that only received the n-gram (the top bit of its tenant word).
pub(super) const RECEIVED: u32 = 1 << 31;

/// The tenant word of the model-native mark: no tenant index reaches it (interning stops
/// long before), and it is never listed, shared or counted as a tenant.
pub(super) const NATIVE: u32 = RECEIVED - 1;

/// The tenant of a tenant word (its role bit cleared; the native mark is its own tenant).
fn tenant_of(word: u32) -> u32 {
    word & !RECEIVED
}

/// Owners of one hash: (tenant word, expiry in Unix seconds), where the tenant word is the
/// tenant index, with [`RECEIVED`] set for a received-only owner. One owner is the common
/// case and needs no allocation.
#[derive(Debug, Clone)]
pub(super) enum Owners {
    One((u32, u64)),
    Many(Vec<(u32, u64)>),
}

impl Owners {
    pub(super) fn as_slice(&self) -> &[(u32, u64)] {
        match self {
            Owners::One(pair) => std::slice::from_ref(pair),
            Owners::Many(v) => v,
        }
    }

    fn expiry_of(&self, tenant: u32) -> Option<u64> {
        self.as_slice().iter().find(|(w, _)| tenant_of(*w) == tenant).map(|(_, e)| *e)
    }

    /// Sets `word`'s tenant's expiry to at least `expires` (a sender replaces a
    /// received-only owner). The tenant must already be an owner.
    fn raise(&mut self, word: u32, expires: u64) -> Upserted {
        let v: &mut [(u32, u64)] = match self {
            Owners::One(pair) => std::slice::from_mut(pair),
            Owners::Many(v) => v,
        };
        let mut out = Upserted { previous: None, raised: false, expiry: expires };
        if let Some((w, e)) = v.iter_mut().find(|(w, _)| tenant_of(*w) == tenant_of(word)) {
            out = Upserted {
                previous: Some(*e),
                raised: *w & RECEIVED != 0 && word & RECEIVED == 0,
                expiry: (*e).max(expires),
            };
            *w &= word | !RECEIVED;
            *e = out.expiry;
        }
        out
    }

    fn push(&mut self, word: u32, expires: u64) {
        match self {
            Owners::One(pair) => *self = Owners::Many(vec![*pair, (word, expires)]),
            Owners::Many(v) => v.push((word, expires)),
        }
    }

    /// Removes `tenant`; false when no owner is left.
    fn remove(&mut self, tenant: u32) -> bool {
        match self {
            Owners::One((w, _)) => tenant_of(*w) != tenant,
            Owners::Many(v) => {
                v.retain(|(w, _)| tenant_of(*w) != tenant);
                if let [one] = v.as_slice() {
                    *self = Owners::One(*one);
                }
                !self.as_slice().is_empty()
            }
        }
    }
}

/// What one upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Upserted {
    /// The tenant's expiry before, `None` when it was not an owner.
    pub previous: Option<u64>,
    /// A received-only owner became a sender.
    pub raised: bool,
    /// The tenant's expiry now.
    pub expiry: u64,
}

/// A shard's bounds.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub max_hashes: usize,
    pub max_per_tenant: usize,
}

/// Owner entries evicted by one operation, by cause.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Evicted {
    /// The shard was full.
    pub full: u64,
    /// The tenant was at its share.
    pub tenant_share: u64,
}

/// One tenant's owner entries in this shard, oldest first (some may be stale).
#[derive(Debug, Default)]
struct TenantQueue {
    // (hash, expiry), in record order
    entries: VecDeque<(u64, u64)>,
    /// Non-stale entries (= this tenant's owner entries in the shard).
    live: usize,
}

#[derive(Debug, Default)]
pub(super) struct Shard {
    map: HashMap<u64, Owners>,
    queues: HashMap<u32, TenantQueue>,
    // Reverse((front expiry, tenant)): the queue whose front is oldest on top; may be stale
    fronts: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Shard {
    pub(super) fn get(&self, hash: u64) -> Option<&Owners> {
        self.map.get(&hash)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &Owners)> {
        self.map.iter()
    }

    /// Sets the owner `word` of `hash` to expire at least at `expires`, evicting first
    /// what the bounds require.
    pub(super) fn upsert(
        &mut self,
        hash: u64,
        word: u32,
        expires: u64,
        limits: Limits,
        evicted: &mut Evicted,
    ) -> Upserted {
        let tenant = tenant_of(word);
        if let Some(owners) = self.map.get_mut(&hash) {
            if owners.expiry_of(tenant).is_some() {
                let up = owners.raise(word, expires);
                if up.previous.is_some_and(|old| up.expiry > old) {
                    self.enqueue(tenant, hash, up.expiry);
                }
                return up;
            }
        }
        if self.queues.get(&tenant).is_some_and(|q| q.live >= limits.max_per_tenant.max(1))
            && self.evict_oldest_of(tenant)
        {
            evicted.tenant_share += 1;
        }
        if !self.map.contains_key(&hash) {
            while self.map.len() >= limits.max_hashes.max(1) && self.evict_oldest() {
                evicted.full += 1;
            }
        }
        match self.map.get_mut(&hash) {
            Some(owners) => owners.push(word, expires),
            None => {
                self.map.insert(hash, Owners::One((word, expires)));
            }
        }
        self.queues.entry(tenant).or_default().live += 1;
        self.enqueue(tenant, hash, expires);
        Upserted { previous: None, raised: false, expiry: expires }
    }

    fn enqueue(&mut self, tenant: u32, hash: u64, expiry: u64) {
        let q = self.queues.entry(tenant).or_default();
        if q.entries.is_empty() {
            self.fronts.push(Reverse((expiry, tenant)));
        }
        q.entries.push_back((hash, expiry));
        if q.entries.len() > 2 * q.live + 64 {
            self.compact_queue(tenant);
        }
    }

    /// Whether a queue entry still stands for a live owner entry.
    fn is_current(map: &HashMap<u64, Owners>, tenant: u32, (hash, expiry): (u64, u64)) -> bool {
        map.get(&hash).and_then(|o| o.expiry_of(tenant)) == Some(expiry)
    }

    fn compact_queue(&mut self, tenant: u32) {
        let Some(q) = self.queues.get_mut(&tenant) else { return };
        let map = &self.map;
        q.entries.retain(|e| Shard::is_current(map, tenant, *e));
        if let Some((_, front)) = q.entries.front() {
            self.fronts.push(Reverse((*front, tenant)));
        }
    }

    /// Removes the tenant's oldest live owner entry; false when it has none.
    fn evict_oldest_of(&mut self, tenant: u32) -> bool {
        let Some(q) = self.queues.get_mut(&tenant) else { return false };
        let mut removed = false;
        while let Some(entry) = q.entries.pop_front() {
            if Shard::is_current(&self.map, tenant, entry) {
                let keep = self.map.get_mut(&entry.0).is_some_and(|o| o.remove(tenant));
                if !keep {
                    self.map.remove(&entry.0);
                }
                q.live -= 1;
                removed = true;
                break;
            }
        }
        let (front, live) = (q.entries.front().map(|(_, e)| *e), q.live);
        match front {
            Some(front) => self.fronts.push(Reverse((front, tenant))),
            None if live == 0 => {
                self.queues.remove(&tenant);
            }
            None => {}
        }
        if self.fronts.len() > 2 * self.queues.len() + 64 {
            self.rebuild_fronts();
        }
        removed
    }

    /// Removes the oldest live owner entry of any tenant; false when the shard is empty.
    fn evict_oldest(&mut self) -> bool {
        while let Some(Reverse((expiry, tenant))) = self.fronts.pop() {
            let front = self.queues.get(&tenant).and_then(|q| q.entries.front()).map(|(_, e)| *e);
            if front == Some(expiry) && self.evict_oldest_of(tenant) {
                return true;
            }
        }
        // Only stale heap entries were left (cannot happen while the invariant holds).
        self.rebuild_fronts();
        let oldest = self.fronts.peek().map(|Reverse((_, t))| *t);
        oldest.is_some_and(|t| self.evict_oldest_of(t))
    }

    fn rebuild_fronts(&mut self) {
        self.fronts =
            self.queues.iter().filter_map(|(t, q)| q.entries.front().map(|(_, e)| Reverse((*e, *t)))).collect();
    }

    /// Drops owner entries that expired by `now`, oldest first (recorded out of order, a
    /// few may wait for a later pass; they are never reported meanwhile).
    pub(super) fn prune(&mut self, now: u64) {
        let tenants: Vec<u32> = self.queues.keys().copied().collect();
        for tenant in tenants {
            while self.queues.get(&tenant).and_then(|q| q.entries.front()).is_some_and(|(_, e)| *e <= now) {
                if !self.evict_oldest_of(tenant) {
                    break;
                }
            }
        }
    }

    /// Owner entries of `tenant` (tests).
    #[cfg(test)]
    pub(super) fn live_of(&self, tenant: u32) -> usize {
        self.queues.get(&tenant).map_or(0, |q| q.live)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_hashes: 4, max_per_tenant: 3 };

    fn owners(shard: &Shard, hash: u64) -> Vec<u32> {
        shard.get(hash).map(|o| o.as_slice().iter().map(|(w, _)| *w).collect()).unwrap_or_default()
    }

    #[test]
    fn a_full_shard_evicts_its_oldest_entry_and_a_tenant_at_its_share_its_own() {
        let mut s = Shard::default();
        let mut ev = Evicted::default();
        // tenant 0 records hashes 1..=3 (its share), tenant 1 records hash 10
        for (h, e) in [(1, 100), (2, 101), (3, 102)] {
            s.upsert(h, 0, e, LIMITS, &mut ev);
        }
        s.upsert(10, 1, 103, LIMITS, &mut ev);
        assert_eq!((s.len(), ev), (4, Evicted::default()));
        // tenant 0 over its share: its own oldest (hash 1) goes, tenant 1 keeps hash 10
        s.upsert(4, 0, 104, LIMITS, &mut ev);
        assert_eq!(ev, Evicted { full: 0, tenant_share: 1 });
        assert!(s.get(1).is_none() && owners(&s, 10) == [1] && s.live_of(0) == 3);
        // full, a new tenant: the oldest entry of all (hash 2, tenant 0) goes
        s.upsert(20, 2, 105, LIMITS, &mut ev);
        assert_eq!(ev, Evicted { full: 1, tenant_share: 1 });
        assert!(s.get(2).is_none() && s.get(20).is_some() && s.len() == 4);
    }

    #[test]
    fn a_refreshed_entry_is_young_again() {
        let mut s = Shard::default();
        let mut ev = Evicted::default();
        let limits = Limits { max_hashes: 2, max_per_tenant: 10 };
        s.upsert(1, 0, 100, limits, &mut ev);
        s.upsert(2, 0, 101, limits, &mut ev);
        let up = s.upsert(1, 0, 200, limits, &mut ev);
        assert_eq!(up, Upserted { previous: Some(100), raised: false, expiry: 200 });
        s.upsert(3, 1, 201, limits, &mut ev);
        assert!(s.get(1).is_some() && s.get(2).is_none(), "hash 2 was the oldest");
        assert_eq!(ev.full, 1);
    }

    #[test]
    fn roles_share_one_entry_and_a_sender_raises_a_receiver() {
        let mut s = Shard::default();
        let mut ev = Evicted::default();
        s.upsert(1, RECEIVED, 100, LIMITS, &mut ev);
        let up = s.upsert(1, 0, 100, LIMITS, &mut ev);
        assert!(up.raised && up.previous == Some(100));
        assert_eq!((owners(&s, 1), s.live_of(0)), (vec![0], 1));
        s.upsert(1, NATIVE, 100, LIMITS, &mut ev);
        assert_eq!(owners(&s, 1), [0, NATIVE]);
    }

    #[test]
    fn pruning_drops_expired_entries_and_stale_queue_entries_stay_bounded() {
        let mut s = Shard::default();
        let mut ev = Evicted::default();
        let limits = Limits { max_hashes: 1000, max_per_tenant: 1000 };
        for e in 0..500 {
            s.upsert(7, 0, 100 + e, limits, &mut ev);
        }
        assert!(s.queues[&0].entries.len() <= 2 + 64, "stale entries are compacted (one live entry)");
        s.upsert(8, 1, 50, limits, &mut ev);
        s.prune(60);
        assert!(s.get(8).is_none() && s.get(7).is_some());
        s.prune(10_000);
        assert_eq!((s.len(), s.queues.len()), (0, 0));
    }
}
