//! Stored Responses API responses, in the embedded store: in process memory, bounded by
//! count and bytes, each until its expiry. Keyed by (tenant, id), so one tenant's lookup can
//! never reach another's response. Past a bound, the tenant holding the most bytes loses its
//! oldest response: a busy tenant evicts its own, not everyone's. Not kept across
//! restarts: a deployment that needs that, or several replicas, uses the Redis store.

use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
struct Entry {
    json: String,
    expires_at_ms: u64,
    /// Its place in its tenant's `order` (entries replaced or deleted leave stale places).
    seq: u64,
}

/// One tenant's responses.
#[derive(Debug, Default)]
struct Shelf {
    entries: HashMap<String, Entry>,
    /// Ids oldest first, with the sequence number they were stored under.
    order: VecDeque<(u64, String)>,
    bytes: usize,
}

impl Shelf {
    fn remove(&mut self, id: &str) -> Option<Entry> {
        let entry = self.entries.remove(id)?;
        self.bytes -= entry.json.len();
        Some(entry)
    }

    /// Removes the oldest live entry; its size, or None when there is none.
    fn evict_oldest(&mut self) -> Option<usize> {
        while let Some((seq, id)) = self.order.pop_front() {
            if self.entries.get(&id).is_some_and(|e| e.seq == seq) {
                return self.remove(&id).map(|e| e.json.len());
            }
        }
        None
    }
}

/// The responses held in memory, per tenant.
#[derive(Debug)]
pub struct ResponseShelf {
    tenants: HashMap<String, Shelf>,
    next_seq: u64,
    entries: usize,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl ResponseShelf {
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseShelf {
        ResponseShelf { tenants: HashMap::new(), next_seq: 0, entries: 0, bytes: 0, max_entries, max_bytes }
    }

    /// Stores `json` under (tenant, id) until `expires_at_ms`, evicting past the bounds.
    /// Returns false, keeping nothing, for a response larger than the byte bound.
    pub fn put(&mut self, tenant: &str, id: &str, json: String, expires_at_ms: u64) -> bool {
        self.delete(tenant, id, 0);
        if json.len() > self.max_bytes || self.max_entries == 0 {
            return false;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries += 1;
        self.bytes += json.len();
        let shelf = self.tenants.entry(tenant.to_owned()).or_default();
        shelf.bytes += json.len();
        shelf.entries.insert(id.to_owned(), Entry { json, expires_at_ms, seq });
        shelf.order.push_back((seq, id.to_owned()));
        // Stale places are dropped as they reach the front; bound them too.
        if shelf.order.len() > 2 * shelf.entries.len() + 64 {
            let entries = &shelf.entries;
            shelf.order.retain(|(seq, id)| entries.get(id).is_some_and(|e| e.seq == *seq));
        }
        while self.entries > self.max_entries || self.bytes > self.max_bytes {
            let Some(largest) = self.tenants.values_mut().max_by_key(|s| s.bytes) else { break };
            let Some(freed) = largest.evict_oldest() else { break };
            self.entries -= 1;
            self.bytes -= freed;
        }
        self.tenants.retain(|_, s| !s.entries.is_empty());
        true
    }

    /// The response stored under (tenant, id), if it has not expired.
    pub fn get(&self, tenant: &str, id: &str, now_ms: u64) -> Option<String> {
        let entry = self.tenants.get(tenant)?.entries.get(id)?;
        (entry.expires_at_ms > now_ms).then(|| entry.json.clone())
    }

    /// Deletes (tenant, id); whether a live response was there.
    pub fn delete(&mut self, tenant: &str, id: &str, now_ms: u64) -> bool {
        let Some(shelf) = self.tenants.get_mut(tenant) else { return false };
        let Some(entry) = shelf.remove(id) else { return false };
        self.entries -= 1;
        self.bytes -= entry.json.len();
        entry.expires_at_ms > now_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_only_reach_their_own_responses() {
        let mut shelf = ResponseShelf::new(10, 1 << 20);
        assert!(shelf.put("a", "resp_1", "{\"x\":1}".into(), 1_000));
        assert_eq!(shelf.get("a", "resp_1", 0).as_deref(), Some("{\"x\":1}"));
        assert_eq!(shelf.get("b", "resp_1", 0), None);
        assert!(!shelf.delete("b", "resp_1", 0));
        assert!(shelf.get("a", "resp_1", 0).is_some());
        assert!(shelf.delete("a", "resp_1", 0));
        assert_eq!(shelf.get("a", "resp_1", 0), None);
    }

    #[test]
    fn expired_and_oldest_responses_go() {
        let mut shelf = ResponseShelf::new(2, 1 << 20);
        shelf.put("a", "1", "x".into(), 100);
        assert_eq!(shelf.get("a", "1", 100), None, "expired");
        shelf.put("a", "2", "y".into(), 1_000);
        shelf.put("a", "3", "z".into(), 1_000);
        assert_eq!(shelf.get("a", "1", 0), None, "the oldest went past two");
        assert!(shelf.get("a", "2", 0).is_some() && shelf.get("a", "3", 0).is_some());
        let mut shelf = ResponseShelf::new(100, 10);
        shelf.put("a", "1", "123456".into(), 1_000);
        shelf.put("a", "2", "123456".into(), 1_000);
        assert_eq!((shelf.get("a", "1", 0), shelf.bytes), (None, 6));
        assert!(!shelf.put("a", "3", "x".repeat(11), 1_000), "larger than the bound");
        for i in 0..1_000 {
            shelf.put("a", "same", "v".into(), 1_000 + i);
        }
        assert!(shelf.tenants["a"].order.len() < 200, "replacing one key does not grow the order without bound");
    }

    #[test]
    fn a_busy_tenant_evicts_its_own_responses_not_the_others() {
        let mut shelf = ResponseShelf::new(10, 1 << 20);
        shelf.put("quiet", "q1", "keep me".into(), 1_000);
        for i in 0..100 {
            shelf.put("busy", &format!("b{i}"), "flood".into(), 1_000);
        }
        assert!(shelf.get("quiet", "q1", 0).is_some(), "the quiet tenant's response survives the flood");
        assert!(shelf.get("busy", "b99", 0).is_some() && shelf.get("busy", "b0", 0).is_none());
        assert_eq!(shelf.entries, 10);
    }
}
