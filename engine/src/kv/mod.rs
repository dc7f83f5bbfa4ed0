//! The paged KV cache, built for isolation first.
//!
//! Keys and values live in fixed-size blocks of one shared [`KvPool`]; each sequence
//! ([`SequenceKv`]) holds a table of block ids. Every block carries its owner; a block is
//! zero-filled before it is reused; attention reads a layer only through a view whose
//! every block was checked against the sequence's tenant and length ([`LayerKv`]); the
//! prefix cache is salted per tenant. Each defence can be switched off by a
//! [`FaultConfig`](crate::fault::FaultConfig) switch so that its test can fail.
//!
//! - `owner.rs`: tenants and owners;
//! - `arena.rs`: block memory, one slab per (layer, KV head), reached under block locks;
//! - `pool.rs`: reference counts, free list, zero-fill, counters;
//! - `prefix.rs`: the salted, chained prefix index;
//! - `seq.rs`: a sequence's block table, checked reads and writes, provenance;
//! - `mirror.rs`: the hook through which device copies of blocks follow zero-fills.

mod arena;
mod mirror;
mod owner;
mod pool;
mod prefix;
mod seq;
#[cfg(test)]
mod tests;

pub use mirror::BlockMirror;
pub use owner::{Owner, Tenant};
pub use pool::{BlockId, BlockShape, KvPool, KvStats};
pub use seq::{HeadBlock, LayerKv, SequenceKv};

use std::fmt;

/// Positions per block unless configured otherwise.
pub const DEFAULT_BLOCK_TOKENS: usize = 16;

/// An attempted read or write that isolation forbids. Carries block ids and positions,
/// never tenant names (the message may reach a client).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// A block in the sequence's table holds another tenant's data (or none).
    ForeignBlock { block: BlockId, position: usize },
    /// A read or write at or past what the sequence has written, or outside its table.
    OutOfBounds { position: usize, readable: usize },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::ForeignBlock { block, position } => {
                write!(f, "block {block} at position {position} is not the sequence's tenant's")
            }
            Violation::OutOfBounds { position, readable } => {
                write!(f, "position {position} is outside the sequence's {readable} readable positions")
            }
        }
    }
}
