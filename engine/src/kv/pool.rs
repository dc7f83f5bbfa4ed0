//! The block pool: every KV block of the engine, who holds each, and the free list.
//!
//! Owns the block memory, the reference counts, the O(1) free list, the prefix index and
//! the counters behind [`KvStats`]. Sequences (`seq.rs`) hold block ids and go through
//! the pool for every allocation and release; attention reads blocks through the
//! per-block locks, never through the pool's state lock.
//!
//! Invariants:
//! - A block's `owner` says whose data it holds. A block is (re)tagged only when it is
//!   handed out zeroed (or fresh); it loses its tag when it is zero-filled.
//! - `release` zero-fills a block *before* it re-enters the free list (unless a fault
//!   switch says otherwise), so no later allocation can observe old contents.
//! - Accounting is exact: every block is in exactly one of free (on the free list),
//!   used (reference count > 0; prefix-cache entries hold one reference) or pending
//!   (released, zero-fill deferred: only with the `stale_kv` fault on).
//! - Lock order: the state mutex, then a block's lock. Readers of block data take only
//!   block locks, so a reader never waits on the state mutex while holding a block.
//! - Block memory (`arena.rs`) is reached only through the block's lock.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, RwLock};

pub(crate) use super::arena::BlockRead;
pub use super::arena::BlockShape;
use super::arena::{Arena, Block, BlockWrite};
use super::mirror::BlockMirror;
use super::owner::{Owner, Tenant};
use super::prefix::PrefixIndex;
use crate::error::{Error, Result};
use crate::fault::FaultConfig;

/// Index of a block in the pool.
pub type BlockId = usize;

/// Released blocks kept unzeroed for the `stale_kv` fault (the "asynchronous clear"
/// window of the production bug).
const STALE_WINDOW_BLOCKS: usize = 8;

/// A snapshot of the pool's counters (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    pub block_tokens: usize,
    pub blocks_total: usize,
    pub blocks_free: usize,
    /// Blocks with a reference (sequences or the prefix cache).
    pub blocks_used: usize,
    /// Of the used blocks, those held by the prefix cache.
    pub blocks_cached: usize,
    /// Released, zero-fill deferred (only with the `stale_kv` fault on).
    pub blocks_pending_zero: usize,
    pub zero_fills: u64,
    pub isolation_violations: u64,
    /// Prompt blocks served from the prefix cache instead of being computed.
    pub prefix_hits: u64,
    /// Blocks handed to a sequence with another tenant's old contents (fault mode).
    pub stale_handouts: u64,
}

/// What the state mutex guards.
#[derive(Debug)]
struct PoolState {
    /// `[blocks]` references per block.
    refs: Vec<u32>,
    free: Vec<BlockId>,
    /// Released, not yet zeroed, oldest first (only with the `stale_kv` fault on).
    pending: VecDeque<BlockId>,
    prefix: PrefixIndex,
}

#[derive(Debug, Default)]
struct Counters {
    zero_fills: AtomicU64,
    violations: AtomicU64,
    prefix_hits: AtomicU64,
    stale_handouts: AtomicU64,
}

/// All KV blocks of one engine. `Sync`: sequences on several threads share it.
pub struct KvPool {
    shape: BlockShape,
    blocks: Vec<RwLock<Block>>,
    state: Mutex<PoolState>,
    fault: FaultConfig,
    counters: Counters,
    /// Device copies of the blocks (CUDA backend); the host arena is then never made.
    mirror: OnceLock<Arc<dyn BlockMirror>>,
    /// Host block memory, made when the first block is handed out without a mirror.
    arena: OnceLock<Arena>,
}

impl fmt::Debug for KvPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvPool")
            .field("shape", &self.shape)
            .field("blocks", &self.blocks.len())
            .field("fault", &self.fault)
            .finish()
    }
}

impl KvPool {
    /// A pool of `blocks` zeroed blocks of `shape`.
    pub fn new(shape: BlockShape, blocks: usize, fault: FaultConfig) -> Result<KvPool> {
        if !shape.block_tokens.is_power_of_two() {
            return Err(Error::InvalidOptions {
                reason: format!("kv block_tokens must be a power of two, got {}", shape.block_tokens),
            });
        }
        if shape.kv_heads == 0 || !shape.kv_dim.is_multiple_of(shape.kv_heads) {
            return Err(Error::InvalidOptions {
                reason: format!("a KV row of {} values does not split into {} heads", shape.kv_dim, shape.kv_heads),
            });
        }
        if blocks == 0 {
            return Err(Error::InvalidOptions { reason: "the KV pool needs at least one block".into() });
        }
        fault.validate()?;
        let memory = (0..blocks).map(|_| RwLock::new(Block { owner: None })).collect();
        let state = PoolState {
            refs: vec![0; blocks],
            // Popped from the back: low ids first.
            free: (0..blocks).rev().collect(),
            pending: VecDeque::new(),
            prefix: PrefixIndex::new(!fault.unsalted_prefix_cache),
        };
        Ok(KvPool {
            shape,
            blocks: memory,
            state: Mutex::new(state),
            fault,
            counters: Counters::default(),
            mirror: OnceLock::new(),
            arena: OnceLock::new(),
        })
    }

    pub fn shape(&self) -> BlockShape {
        self.shape
    }

    pub fn fault(&self) -> &FaultConfig {
        &self.fault
    }

    /// Hands block contents to `mirror` (before any block is used): zero-fills and copies
    /// are then done there, and host blocks get no memory. False if one is attached.
    pub fn attach_mirror(&self, mirror: Arc<dyn BlockMirror>) -> bool {
        self.mirror.set(mirror).is_ok()
    }

    pub fn total_blocks(&self) -> usize {
        self.blocks.len()
    }

    pub fn stats(&self) -> KvStats {
        let st = self.lock();
        let used = st.refs.iter().filter(|r| **r > 0).count();
        KvStats {
            block_tokens: self.shape.block_tokens,
            blocks_total: self.blocks.len(),
            blocks_free: st.free.len(),
            blocks_used: used,
            blocks_cached: st.prefix.len(),
            blocks_pending_zero: st.pending.len(),
            zero_fills: self.counters.zero_fills.load(Ordering::Relaxed),
            isolation_violations: self.counters.violations.load(Ordering::Relaxed),
            prefix_hits: self.counters.prefix_hits.load(Ordering::Relaxed),
            stale_handouts: self.counters.stale_handouts.load(Ordering::Relaxed),
        }
    }

    /// Checks the accounting invariants; `Err` names the first one broken. For tests.
    pub fn audit(&self) -> Result<(), String> {
        let st = self.lock();
        let mut seen = vec![0u8; self.blocks.len()];
        for &id in st.free.iter().chain(&st.pending) {
            match seen.get_mut(id) {
                Some(s) if *s == 0 => *s = 1,
                _ => return Err(format!("block {id} is listed twice or out of range")),
            }
            if st.refs[id] != 0 {
                return Err(format!("block {id} is free or pending with {} references", st.refs[id]));
            }
        }
        if let Some(id) = st.prefix.blocks().find(|&b| st.refs[b] == 0) {
            return Err(format!("cached block {id} has no reference"));
        }
        let used = st.refs.iter().filter(|r| **r > 0).count();
        let (free, pending, total) = (st.free.len(), st.pending.len(), self.blocks.len());
        if free + used + pending != total {
            return Err(format!("free {free} + used {used} + pending {pending} != total {total}"));
        }
        if let Some(id) = st.free.iter().find(|&&id| self.read(id).owner.is_some()) {
            return Err(format!("free block {id} still has an owner"));
        }
        Ok(())
    }

    /// A zeroed block for `owner` (reclaiming pending or cached blocks when none is free).
    pub(crate) fn allocate(&self, owner: &Owner) -> Result<BlockId> {
        let mut st = self.lock();
        self.materialize()?;
        let id = self.take_free(&mut st)?;
        st.refs[id] = 1;
        self.write(id).owner = Some(owner.clone());
        Ok(id)
    }

    /// A block of another tenant, released but not yet zeroed, with its old contents and
    /// its old tag: the production bug, handed out only under the `stale_kv` fault.
    pub(crate) fn take_stale(&self, reader: &Tenant) -> Option<BlockId> {
        let mut st = self.lock();
        let at = st.pending.iter().position(|&id| self.read(id).owner.as_ref().is_some_and(|o| o.tenant != *reader))?;
        let id = st.pending.remove(at)?;
        st.refs[id] = 1;
        self.counters.stale_handouts.fetch_add(1, Ordering::Relaxed);
        Some(id)
    }

    /// Drops one reference to each of `ids`; a block nobody holds any more is zero-filled
    /// and returned to the free list.
    pub(crate) fn release(&self, ids: &[BlockId]) {
        let mut st = self.lock();
        // Last first: the free list hands out its top first, so the next sequence gets
        // these blocks in ascending order, one contiguous run per slab of the arena.
        for &id in ids.iter().rev() {
            self.release_one(&mut st, id);
        }
    }

    /// `id` itself when the caller holds it alone, else a private copy of it for `owner`
    /// (copy-on-write before a sequence writes into a shared prefix block).
    pub(crate) fn make_private(&self, owner: &Owner, id: BlockId) -> Result<BlockId> {
        let mut st = self.lock();
        if st.refs.get(id).copied().unwrap_or(0) <= 1 {
            return Ok(id);
        }
        let copy = self.take_free(&mut st)?;
        st.refs[copy] = 1;
        {
            let src = self.read(id);
            let mut dst = self.write(copy);
            dst.copy_from(&src);
            if let Some(m) = self.mirror.get() {
                m.copy(id, copy);
            }
            dst.owner = Some(owner.clone());
        }
        self.release_one(&mut st, id);
        Ok(copy)
    }

    /// The cached blocks for the leading full blocks of `tokens` for `tenant`, each with
    /// a reference taken, and their chained hashes. Stops at the first miss.
    pub(crate) fn lookup_prefix(&self, tenant: &Tenant, tokens: &[u32]) -> Vec<(BlockId, u64)> {
        let mut st = self.lock();
        let mut found = Vec::new();
        let mut parent = super::prefix::ROOT;
        for chunk in tokens.chunks_exact(self.shape.block_tokens) {
            let hash = st.prefix.chain_hash(tenant, parent, chunk);
            let Some(id) = st.prefix.lookup(hash, tenant, parent, chunk) else { break };
            st.refs[id] += 1;
            found.push((id, hash));
            parent = hash;
        }
        self.counters.prefix_hits.fetch_add(found.len() as u64, Ordering::Relaxed);
        found
    }

    /// Offers the full block `id` (holding `tokens` after `parent`) to the prefix cache;
    /// returns its chained hash. The cache takes a reference if it keeps the block.
    pub(crate) fn register_prefix(&self, tenant: &Tenant, parent: u64, tokens: &[u32], id: BlockId) -> u64 {
        let mut st = self.lock();
        let hash = st.prefix.chain_hash(tenant, parent, tokens);
        if st.prefix.insert(hash, tenant, parent, tokens, id) {
            st.refs[id] += 1;
        }
        hash
    }

    /// Counts an isolation violation and returns it as the error that stops the request.
    pub(crate) fn violation(&self, violation: super::Violation) -> Error {
        self.counters.violations.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(%violation, "KV isolation violation; request stopped");
        Error::Isolation { violation }
    }

    pub(crate) fn read(&self, id: BlockId) -> BlockRead<'_> {
        BlockRead::lock(&self.blocks, self.arena.get(), id)
    }

    /// The block's lock, or `None` when `id` is outside the pool.
    pub(crate) fn try_read(&self, id: BlockId) -> Option<BlockRead<'_>> {
        (id < self.blocks.len()).then(|| self.read(id))
    }

    pub(crate) fn write(&self, id: BlockId) -> BlockWrite<'_> {
        BlockWrite::lock(&self.blocks, self.arena.get(), id)
    }

    fn lock(&self) -> MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Pops a free block; when none is, zero-fills the oldest pending block or evicts the
    /// oldest prefix-cache block nobody else holds.
    fn take_free(&self, st: &mut PoolState) -> Result<BlockId> {
        if let Some(id) = st.free.pop() {
            return Ok(id);
        }
        if let Some(id) = st.pending.pop_front() {
            self.scrub(id);
            return Ok(id);
        }
        let refs = &st.refs;
        if let Some(id) = st.prefix.evict(|b| refs[b] > 1) {
            st.refs[id] = 0;
            self.scrub(id);
            return Ok(id);
        }
        Err(Error::KvExhausted { blocks: self.blocks.len() })
    }

    fn release_one(&self, st: &mut PoolState, id: BlockId) {
        let Some(refs) = st.refs.get_mut(id) else { return };
        *refs = refs.saturating_sub(1);
        if *refs > 0 {
            return;
        }
        if self.fault.stale_kv > 0.0 {
            // Fault mode: the clear is "asynchronous"; the block waits unzeroed.
            st.pending.push_back(id);
            while st.pending.len() > STALE_WINDOW_BLOCKS {
                if let Some(old) = st.pending.pop_front() {
                    self.scrub(old);
                    st.free.push(old);
                }
            }
            return;
        }
        self.scrub(id);
        st.free.push(id);
    }

    /// Makes the host arena when the first block is handed out (unless a mirror holds
    /// the blocks). Called with the state lock held, so only one thread makes it.
    fn materialize(&self) -> Result<()> {
        if self.mirror.get().is_some() || self.arena.get().is_some() {
            return Ok(());
        }
        let blocks = self.blocks.len();
        let arena = Arena::zeroed(self.shape, blocks).ok_or_else(|| {
            let mib = (blocks * 2 * self.shape.layers * self.shape.block_tokens * self.shape.kv_dim * 2) >> 20;
            Error::InvalidOptions { reason: format!("the KV pool's {blocks} blocks ({mib} MiB) could not be allocated: lower `context_tokens` (the pool holds four contexts) or the pool size") }
        })?;
        // Cannot fail: the state lock is held, and nothing else sets the arena.
        let _ = self.arena.set(arena);
        Ok(())
    }

    /// Zero-fills a block (unless the fault says not to) and removes its tag.
    fn scrub(&self, id: BlockId) {
        let mut block = self.write(id);
        if !self.fault.skip_zero_fill {
            block.zero();
            if let Some(m) = self.mirror.get() {
                m.zero(id);
            }
            self.counters.zero_fills.fetch_add(1, Ordering::Relaxed);
        }
        block.owner = None;
    }
}
