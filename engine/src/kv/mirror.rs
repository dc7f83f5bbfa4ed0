//! A second home for block contents: the CUDA backend keeps KV blocks in device memory,
//! and the pool (the authority on who holds which block) tells it of every zero-fill and
//! copy through this trait, in the same places it clears or copies its own memory.
//!
//! Invariant: `zero` is called before the block can be handed out again (the mirror
//! orders the clear before any later use of the block on the device).

use std::fmt;

use super::pool::BlockId;

/// Where a block's contents live when not in host memory.
pub trait BlockMirror: Send + Sync + fmt::Debug {
    /// Zero-fills block `id` and clears its owner tag.
    fn zero(&self, id: BlockId);
    /// Copies block `from` into block `to` (copy-on-write of a shared prefix block).
    fn copy(&self, from: BlockId, to: BlockId);
}
