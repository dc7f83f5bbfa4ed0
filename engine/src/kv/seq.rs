//! One sequence's view of the pool: its block table, its length, and the checked reads
//! and writes the forward pass makes through it.
//!
//! Owns the block table (position `p` lives in block `table[p / block_tokens]`, slot
//! `p % block_tokens`), the tokens behind each position (for the prefix cache), and the
//! provenance of the last forward step (whose blocks attention read). The pool owns the
//! memory; the forward pass owns the arithmetic.
//!
//! Invariants:
//! - Positions `0..len` are committed; a forward step reserves `len..len + pending`,
//!   writes every layer's rows there, then commits.
//! - A layer view checks every block once against the sequence's tenant and its length;
//!   a violation is an [`Error::Isolation`](crate::Error::Isolation) and no data.
//! - Writes go only to blocks the sequence holds alone (copy-on-write first) and owns.
//! - Dropping the sequence releases every block (zero-filled before reuse), so aborts and
//!   errors cannot leak blocks.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::owner::{Owner, Tenant};
use super::pool::{BlockId, BlockRead, KvPool};
use super::prefix::ROOT;
use super::Violation;
use crate::error::{Error, Result};

/// Key values converted to f16 per step of [`SequenceKv::write`] (a head of up to this
/// many dimensions in one).
const KEY_CHUNK: usize = 128;

/// The KV cache of one sequence, backed by pool blocks.
#[derive(Debug)]
pub struct SequenceKv<'p> {
    pool: &'p KvPool,
    owner: Owner,
    /// Block of each run of `block_tokens` positions.
    table: Vec<BlockId>,
    /// `[len + pending]` token at each position (placeholders under a stale block).
    tokens: Vec<u32>,
    /// Chained prefix hash of each leading full block registered or found so far.
    chain: Vec<u64>,
    /// False once positions hold data whose tokens are unknown (a stale block).
    cacheable: bool,
    len: usize,
    pending: usize,
    capacity: usize,
    /// Leading prompt tokens whose KV came from the prefix cache.
    cached_prompt: usize,
    /// Tenants whose blocks the last forward step read, sorted, without repeats.
    read_owners: Vec<Tenant>,
}

impl<'p> SequenceKv<'p> {
    /// An empty sequence of at most `capacity` positions.
    pub fn new(pool: &'p KvPool, owner: Owner, capacity: usize) -> SequenceKv<'p> {
        SequenceKv {
            pool,
            owner,
            table: Vec::new(),
            tokens: Vec::new(),
            chain: Vec::new(),
            cacheable: true,
            len: 0,
            pending: 0,
            capacity,
            cached_prompt: 0,
            read_owners: Vec::new(),
        }
    }

    /// A sequence that neither reuses nor offers cached prefixes (tests and benchmarks
    /// that compare ways of computing the same prompt).
    pub fn uncached(pool: &'p KvPool, owner: Owner, capacity: usize) -> SequenceKv<'p> {
        let mut seq = SequenceKv::new(pool, owner, capacity);
        seq.cacheable = false;
        seq
    }

    /// A sequence about to process `prompt`: starts with the tenant's cached blocks for
    /// the prompt's leading full blocks, so `cached_prompt_tokens()` need no computing. At
    /// least the last prompt token is always left to compute (its logits are needed).
    ///
    /// Under the `stale_kv` fault it may instead start with another tenant's released,
    /// unzeroed block as readable context — the production bug, re-created.
    pub fn for_prompt(pool: &'p KvPool, owner: Owner, capacity: usize, prompt: &[u32]) -> SequenceKv<'p> {
        let mut seq = SequenceKv::new(pool, owner, capacity);
        let bt = pool.shape().block_tokens;
        if pool.fault().draw_stale() && capacity > bt + prompt.len() {
            if let Some(id) = pool.take_stale(&seq.owner.tenant) {
                seq.table.push(id);
                seq.tokens.resize(bt, 0);
                seq.len = bt;
                seq.cacheable = false;
                return seq;
            }
        }
        for (id, hash) in pool.lookup_prefix(&seq.owner.tenant, prompt) {
            seq.table.push(id);
            seq.chain.push(hash);
        }
        seq.len = (seq.table.len() * bt).min(prompt.len().saturating_sub(1));
        seq.cached_prompt = seq.len;
        seq.tokens.extend_from_slice(&prompt[..seq.len]);
        seq
    }

    /// How many leading prompt tokens are already in the cache (feed the rest).
    pub fn cached_prompt_tokens(&self) -> usize {
        self.cached_prompt
    }

    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The block ids of the table, in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.table
    }

    /// Tenants whose blocks attention read during the last forward step.
    pub fn read_owners(&self) -> &[Tenant] {
        &self.read_owners
    }

    /// Records whose blocks a step read when the reads happened elsewhere (the CUDA
    /// backend's kernels), sorted and without repeats like [`SequenceKv::layer`] does.
    pub(crate) fn set_read_owners(&mut self, mut owners: Vec<Tenant>) {
        owners.sort();
        owners.dedup();
        self.read_owners = owners;
    }

    /// Makes room for `tokens` at positions `len..`: allocates blocks, copies a shared
    /// block before it is written, and clears the step's provenance.
    pub fn reserve(&mut self, tokens: &[u32]) -> Result<()> {
        let end = self.len + tokens.len();
        if end > self.capacity {
            return Err(Error::ContextOverflow { prompt_tokens: end, limit: self.capacity });
        }
        let shift = self.pool.shape().block_tokens.trailing_zeros();
        let first = self.len >> shift;
        if let Some(id) = self.table.get(first).copied() {
            self.table[first] = self.pool.make_private(&self.owner, id)?;
        }
        while self.table.len() << shift < end {
            self.table.push(self.pool.allocate(&self.owner)?);
        }
        self.tokens.truncate(self.len);
        self.tokens.extend_from_slice(tokens);
        self.pending = tokens.len();
        self.read_owners.clear();
        Ok(())
    }

    /// Writes `layer`'s key and value rows (`[kv_dim]` each) of reserved position `pos`,
    /// as f16 like the reference's cache (keys into the block's transposed layout).
    pub fn write(&self, layer: usize, pos: usize, key: &[f32], value: &[f32]) -> Result<()> {
        let shape = self.pool.shape();
        let readable = self.len + self.pending;
        if pos < self.len || pos >= readable {
            return Err(self.pool.violation(Violation::OutOfBounds { position: pos, readable }));
        }
        let shift = shape.block_tokens.trailing_zeros();
        let Some(&id) = self.table.get(pos >> shift) else {
            return Err(self.pool.violation(Violation::OutOfBounds { position: pos, readable }));
        };
        let mut block = self.pool.write(id);
        if block.owner.as_ref().is_none_or(|o| o.tenant != self.owner.tenant) {
            drop(block);
            return Err(self.pool.violation(Violation::ForeignBlock { block: id, position: pos }));
        }
        let (bt, hd) = (shape.block_tokens, shape.head_dim());
        let slot = pos & (bt - 1);
        // Whole vectors converted at once (F16C where the CPU has it); converting value by
        // value dispatched on the CPU's features at every call.
        let mut key16 = [f16::ZERO; KEY_CHUNK];
        for (head, (key, value)) in key.chunks_exact(hd).zip(value.chunks_exact(hd)).enumerate() {
            // Keys are stored dimension-major (a block's positions side by side).
            let keys = block.keys_mut(layer, head);
            for (c, part) in key.chunks(KEY_CHUNK).enumerate() {
                let converted = &mut key16[..part.len()];
                converted.convert_from_f32_slice(part);
                for (dst, src) in keys.iter_mut().skip((c * KEY_CHUNK) * bt + slot).step_by(bt).zip(converted.iter()) {
                    *dst = *src;
                }
            }
            if let Some(dst) = block.values_mut(layer, head).get_mut(slot * hd..(slot + 1) * hd) {
                dst.convert_from_f32_slice(value);
            }
        }
        Ok(())
    }

    /// `layer`'s keys and values at positions `0..readable`, each block checked once:
    /// it must belong to this sequence's tenant and lie within its length. Records the
    /// tenants read for the step's provenance.
    pub fn layer(&mut self, layer: usize, readable: usize) -> Result<LayerKv<'p>> {
        let shape = self.pool.shape();
        let faults = self.pool.fault();
        let written = self.len + self.pending;
        if readable > written && !faults.skip_bounds_check {
            return Err(self.pool.violation(Violation::OutOfBounds { position: readable - 1, readable: written }));
        }
        let shift = shape.block_tokens.trailing_zeros();
        let blocks = readable.div_ceil(shape.block_tokens);
        let mut guards = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let position = i << shift;
            let id = match self.table.get(i) {
                Some(&id) => id,
                // Fault mode: past the table, read the physically next blocks.
                None if faults.skip_bounds_check => self.neighbour(i),
                None => return Err(self.pool.violation(Violation::OutOfBounds { position, readable: written })),
            };
            let Some(block) = self.pool.try_read(id) else {
                return Err(self.pool.violation(Violation::OutOfBounds { position, readable: written }));
            };
            let holder = block.owner.as_ref().map(|o| &o.tenant);
            if holder != Some(&self.owner.tenant) && !faults.skip_owner_check {
                drop(block);
                return Err(self.pool.violation(Violation::ForeignBlock { block: id, position }));
            }
            // Cloned only when first seen (a decode step visits every block of every layer).
            if let Some(tenant) = holder {
                if let Err(at) = self.read_owners.binary_search(tenant) {
                    self.read_owners.insert(at, tenant.clone());
                }
            }
            guards.push(block);
        }
        Ok(LayerKv {
            guards,
            layer,
            block_tokens: shape.block_tokens,
            kv_heads: shape.kv_heads,
            head_dim: shape.head_dim(),
            readable,
        })
    }

    /// Marks the reserved positions as written and offers newly full blocks to the
    /// tenant's prefix cache.
    pub fn commit(&mut self) {
        self.len += self.pending;
        self.pending = 0;
        if !self.cacheable {
            return;
        }
        let bt = self.pool.shape().block_tokens;
        while (self.chain.len() + 1) * bt <= self.len {
            let i = self.chain.len();
            let parent = self.chain.last().copied().unwrap_or(ROOT);
            let hash = self.pool.register_prefix(
                &self.owner.tenant,
                parent,
                &self.tokens[i * bt..(i + 1) * bt],
                self.table[i],
            );
            self.chain.push(hash);
        }
    }

    /// The block physically after the table's last one (what "reading past its own
    /// blocks" reads in a flat buffer); only under the `skip_bounds_check` fault.
    fn neighbour(&self, i: usize) -> BlockId {
        let last = self.table.last().copied().unwrap_or(0);
        (last + 1 + i - self.table.len()) % self.pool.total_blocks()
    }
}

impl Drop for SequenceKv<'_> {
    fn drop(&mut self) {
        self.pool.release(&self.table);
    }
}

/// One layer's checked keys and values of a sequence, held read-locked while attention
/// runs. Every read goes through [`LayerKv::head_block`], which serves only the checked
/// blocks and, within the last one, only the readable positions.
#[derive(Debug)]
pub struct LayerKv<'p> {
    guards: Vec<BlockRead<'p>>,
    layer: usize,
    block_tokens: usize,
    kv_heads: usize,
    head_dim: usize,
    readable: usize,
}

/// The part of one checked block that attention for one KV head reads.
#[derive(Debug, Clone, Copy)]
pub struct HeadBlock<'a> {
    /// `[head_dim, key_stride]`: the keys of dimension `d` at positions `0..positions`
    /// start at `d * key_stride` (the last row ends at `positions`).
    pub keys: &'a [f16],
    /// `[positions, value_stride]`: position `p`'s values start at `p * value_stride`.
    pub values: &'a [f16],
    /// Readable positions of the block; nothing past them is served.
    pub positions: usize,
    pub key_stride: usize,
    pub value_stride: usize,
}

impl LayerKv<'_> {
    /// Positions readable through this view.
    pub fn readable(&self) -> usize {
        self.readable
    }

    /// Positions per block (block `i` holds positions `i * block_tokens..`).
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// KV head `head` of block `index`'s readable positions; `None` past the checked
    /// range (or when the blocks live on a device).
    pub fn head_block(&self, index: usize, head: usize) -> Option<HeadBlock<'_>> {
        let bt = self.block_tokens;
        let positions = self.readable.checked_sub(index * bt)?.min(bt);
        if positions == 0 || head >= self.kv_heads {
            return None;
        }
        let (block, hd) = (self.guards.get(index)?, self.head_dim);
        // A block on a device has empty pieces here: `get` refuses them.
        let keys = block.keys(self.layer, head).get(..(hd.checked_sub(1)? * bt + positions))?;
        let values = block.values(self.layer, head).get(..positions * hd)?;
        Some(HeadBlock { keys, values, positions, key_stride: bt, value_stride: hd })
    }

    /// The key row (`[kv_dim]`) at `pos` as f32; empty past the checked range.
    pub fn key(&self, pos: usize) -> Vec<f32> {
        self.gather(pos, |b, p| b.keys.iter().skip(p).step_by(b.key_stride).map(|v| v.to_f32()).collect())
    }

    /// The value row (`[kv_dim]`) at `pos` as f32; empty past the checked range.
    pub fn value(&self, pos: usize) -> Vec<f32> {
        self.gather(pos, |b, p| b.values[p * b.value_stride..][..b.value_stride].iter().map(|v| v.to_f32()).collect())
    }

    /// Every head's part of position `pos`'s row, side by side.
    fn gather(&self, pos: usize, read: impl Fn(&HeadBlock<'_>, usize) -> Vec<f32>) -> Vec<f32> {
        let (index, slot) = (pos / self.block_tokens, pos % self.block_tokens);
        (0..self.kv_heads)
            .map_while(|head| self.head_block(index, head).filter(|b| slot < b.positions))
            .flat_map(|b| read(&b, slot))
            .collect()
    }
}
