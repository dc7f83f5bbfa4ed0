//! Stored Responses API responses, in the embedded store: in process memory, bounded by
//! count and bytes (the oldest go first), each until its expiry. Keyed by (tenant, id), so
//! one tenant's lookup can never reach another's response. Not kept across restarts: a
//! deployment that needs that, or several replicas, uses the Redis store.

use std::collections::{HashMap, VecDeque};

/// One tenant's response id.
type Key = (String, String);

#[derive(Debug)]
struct Entry {
    json: String,
    expires_at_ms: u64,
    /// Its place in `order` (entries replaced or deleted leave stale places behind).
    seq: u64,
}

/// The responses held in memory.
#[derive(Debug)]
pub struct ResponseShelf {
    entries: HashMap<Key, Entry>,
    /// Keys oldest first, with the sequence number they were stored under.
    order: VecDeque<(u64, Key)>,
    next_seq: u64,
    bytes: usize,
    max_entries: usize,
    max_bytes: usize,
}

impl ResponseShelf {
    pub fn new(max_entries: usize, max_bytes: usize) -> ResponseShelf {
        ResponseShelf { entries: HashMap::new(), order: VecDeque::new(), next_seq: 0, bytes: 0, max_entries, max_bytes }
    }

    /// Stores `json` under (tenant, id) until `expires_at_ms`, evicting the oldest entries
    /// past the bounds. A response larger than the byte bound is not kept.
    pub fn put(&mut self, tenant: &str, id: &str, json: String, expires_at_ms: u64) {
        let key = (tenant.to_owned(), id.to_owned());
        self.remove(&key);
        if json.len() > self.max_bytes || self.max_entries == 0 {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += json.len();
        self.entries.insert(key.clone(), Entry { json, expires_at_ms, seq });
        self.order.push_back((seq, key));
        while self.entries.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some((seq, key)) = self.order.pop_front() else { break };
            if self.entries.get(&key).is_some_and(|e| e.seq == seq) {
                self.remove(&key);
            }
        }
        // Stale places are dropped as they reach the front; bound them too.
        if self.order.len() > 2 * self.entries.len() + 64 {
            let entries = &self.entries;
            self.order.retain(|(seq, key)| entries.get(key).is_some_and(|e| e.seq == *seq));
        }
    }

    /// The response stored under (tenant, id), if it has not expired.
    pub fn get(&self, tenant: &str, id: &str, now_ms: u64) -> Option<String> {
        let entry = self.entries.get(&(tenant.to_owned(), id.to_owned()))?;
        (entry.expires_at_ms > now_ms).then(|| entry.json.clone())
    }

    /// Deletes (tenant, id); whether a live response was there.
    pub fn delete(&mut self, tenant: &str, id: &str, now_ms: u64) -> bool {
        self.remove(&(tenant.to_owned(), id.to_owned())).is_some_and(|e| e.expires_at_ms > now_ms)
    }

    fn remove(&mut self, key: &Key) -> Option<Entry> {
        let entry = self.entries.remove(key)?;
        self.bytes -= entry.json.len();
        Some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_only_reach_their_own_responses() {
        let mut shelf = ResponseShelf::new(10, 1 << 20);
        shelf.put("a", "resp_1", "{\"x\":1}".into(), 1_000);
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
        shelf.put("a", "3", "x".repeat(11), 1_000);
        assert_eq!(shelf.get("a", "3", 0), None, "larger than the bound");
        for i in 0..1_000 {
            shelf.put("a", "same", "v".into(), 1_000 + i);
        }
        assert!(shelf.order.len() < 200, "replacing one key does not grow the order without bound");
    }
}
