//! The prefix index: which cached block holds the keys and values of a given run of
//! tokens, after a given parent chain, for a given tenant.
//!
//! Owns the chained block hashes (tenant salt, parent hash, the block's tokens) and the
//! map from hash to block, with the insertion order used to evict. Reference counts and
//! the blocks themselves stay with the pool.
//!
//! Invariants: a lookup returns a block only when the stored tenant, parent hash and
//! tokens equal the asked ones exactly (a hash collision is a miss, never a share); with
//! salting on, tenants never share an entry.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

use super::owner::Tenant;
use super::pool::BlockId;

/// The parent hash of a sequence's first block.
pub(crate) const ROOT: u64 = 0;

/// One cached full block.
#[derive(Debug)]
struct Entry {
    block: BlockId,
    /// `None` when the index is unsalted (fault mode): any tenant matches.
    tenant: Option<Tenant>,
    parent: u64,
    /// `[block_tokens]`
    tokens: Box<[u32]>,
}

/// Hash -> cached block, per tenant (salted) unless the `unsalted_prefix_cache` fault is on.
#[derive(Debug)]
pub(crate) struct PrefixIndex {
    salted: bool,
    entries: HashMap<u64, Entry>,
    /// Hashes in insertion order; eviction takes the oldest unused one.
    order: VecDeque<u64>,
}

impl PrefixIndex {
    pub(crate) fn new(salted: bool) -> PrefixIndex {
        PrefixIndex { salted, entries: HashMap::new(), order: VecDeque::new() }
    }

    /// The chained hash of a block: (tenant salt, parent hash, tokens).
    pub(crate) fn chain_hash(&self, tenant: &Tenant, parent: u64, tokens: &[u32]) -> u64 {
        let mut h = DefaultHasher::new();
        if self.salted {
            tenant.as_str().hash(&mut h);
        }
        parent.hash(&mut h);
        tokens.hash(&mut h);
        // ROOT is reserved for "no parent".
        h.finish().max(1)
    }

    /// The cached block for exactly these tokens after `parent`, for `tenant`.
    pub(crate) fn lookup(&self, hash: u64, tenant: &Tenant, parent: u64, tokens: &[u32]) -> Option<BlockId> {
        let e = self.entries.get(&hash)?;
        let tenant_ok = e.tenant.as_ref().is_none_or(|t| t == tenant);
        (tenant_ok && e.parent == parent && *e.tokens == *tokens).then_some(e.block)
    }

    /// Caches `block` under `hash`; false when the hash is taken (the caller then keeps
    /// its block private).
    pub(crate) fn insert(&mut self, hash: u64, tenant: &Tenant, parent: u64, tokens: &[u32], block: BlockId) -> bool {
        if self.entries.contains_key(&hash) {
            return false;
        }
        let tenant = self.salted.then(|| tenant.clone());
        self.entries.insert(hash, Entry { block, tenant, parent, tokens: tokens.into() });
        self.order.push_back(hash);
        true
    }

    /// Removes the oldest entry whose block nobody but the index holds
    /// (`in_use(block)` false) and returns its block.
    pub(crate) fn evict(&mut self, in_use: impl Fn(BlockId) -> bool) -> Option<BlockId> {
        let at = self.order.iter().position(|h| self.entries.get(h).is_some_and(|e| !in_use(e.block)))?;
        let hash = self.order.remove(at)?;
        self.entries.remove(&hash).map(|e| e.block)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Every cached block (for accounting checks).
    pub(crate) fn blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.entries.values().map(|e| e.block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salted_hashes_differ_per_tenant_and_lookups_check_everything() {
        let mut index = PrefixIndex::new(true);
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let ha = index.chain_hash(&a, ROOT, &[1, 2]);
        assert_ne!(ha, index.chain_hash(&b, ROOT, &[1, 2]));
        assert!(index.insert(ha, &a, ROOT, &[1, 2], 7));
        assert_eq!(index.lookup(ha, &a, ROOT, &[1, 2]), Some(7));
        // The same hash asked with another tenant, parent or tokens is a miss.
        assert_eq!(index.lookup(ha, &b, ROOT, &[1, 2]), None);
        assert_eq!(index.lookup(ha, &a, 5, &[1, 2]), None);
        assert_eq!(index.lookup(ha, &a, ROOT, &[1, 3]), None);
    }

    #[test]
    fn unsalted_index_shares_across_tenants() {
        let mut index = PrefixIndex::new(false);
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let h = index.chain_hash(&a, ROOT, &[1, 2]);
        assert_eq!(h, index.chain_hash(&b, ROOT, &[1, 2]));
        assert!(index.insert(h, &a, ROOT, &[1, 2], 3));
        assert_eq!(index.lookup(h, &b, ROOT, &[1, 2]), Some(3));
    }

    #[test]
    fn eviction_takes_the_oldest_unused_block() {
        let mut index = PrefixIndex::new(true);
        let t = Tenant::new("a");
        for (i, block) in [10, 11, 12].into_iter().enumerate() {
            let h = index.chain_hash(&t, ROOT, &[i as u32]);
            index.insert(h, &t, ROOT, &[i as u32], block);
        }
        assert_eq!(index.evict(|b| b == 10), Some(11));
        assert_eq!(index.evict(|_| false), Some(10));
        assert_eq!(index.evict(|_| true), None);
        assert_eq!(index.len(), 1);
    }
}
