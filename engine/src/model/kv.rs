//! The key/value cache of one sequence.
//!
//! Owns the f16 keys and values of every position a sequence has processed. Attention
//! reads it only through [`KvCache::key`] and [`KvCache::value`] — one position of one
//! layer at a time — so that the paged, owner-checked block pool of the next engine
//! stage can replace this contiguous buffer without touching the forward pass.
//!
//! Invariants: positions `0..len()` hold written data; reads at or past `len()` (or past
//! the capacity) return an empty slice rather than stale memory. Values are rounded to
//! f16 precision, like the reference implementation's default f16 cache, but kept as f32
//! so attention reads them without a conversion per read (it dominated decode time).

use crate::backend::cpu::ops::round_f16;

/// Per-sequence KV storage: `[layers, capacity, kv_dim]` for keys and for values.
#[derive(Debug, Clone)]
pub struct KvCache {
    layers: usize,
    capacity: usize,
    kv_dim: usize,
    len: usize,
    /// `[layers, capacity, kv_dim]`
    k: Vec<f32>,
    /// `[layers, capacity, kv_dim]`
    v: Vec<f32>,
}

impl KvCache {
    /// An empty cache for up to `capacity` positions.
    pub fn new(layers: usize, kv_dim: usize, capacity: usize) -> KvCache {
        let n = layers * capacity * kv_dim;
        KvCache { layers, capacity, kv_dim, len: 0, k: vec![0.0; n], v: vec![0.0; n] }
    }

    /// Positions written and committed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Writes one position's key and value rows (`[kv_dim]` each) for `layer`.
    /// Returns `false` if the position is beyond the capacity.
    pub fn write(&mut self, layer: usize, pos: usize, key: &[f32], value: &[f32]) -> bool {
        let Some(at) = self.offset(layer, pos, self.capacity) else { return false };
        for (dst, src) in self.k[at..at + self.kv_dim].iter_mut().zip(key) {
            *dst = round_f16(*src);
        }
        for (dst, src) in self.v[at..at + self.kv_dim].iter_mut().zip(value) {
            *dst = round_f16(*src);
        }
        true
    }

    /// Marks positions `0..len` as valid (after every layer wrote them).
    pub fn commit(&mut self, len: usize) {
        self.len = len.min(self.capacity);
    }

    /// The key row (`[kv_dim]`) at `pos` of `layer`; empty if `pos` is not readable.
    /// `readable` is the exclusive upper bound the caller may see (the committed length,
    /// or the positions of the batch being processed).
    pub fn key(&self, layer: usize, pos: usize, readable: usize) -> &[f32] {
        self.offset(layer, pos, readable).map_or(&[], |at| &self.k[at..at + self.kv_dim])
    }

    /// The value row at `pos` of `layer`; see [`KvCache::key`].
    pub fn value(&self, layer: usize, pos: usize, readable: usize) -> &[f32] {
        self.offset(layer, pos, readable).map_or(&[], |at| &self.v[at..at + self.kv_dim])
    }

    fn offset(&self, layer: usize, pos: usize, limit: usize) -> Option<usize> {
        (layer < self.layers && pos < limit.min(self.capacity)).then(|| (layer * self.capacity + pos) * self.kv_dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_readable_bound_and_capacity() {
        let mut kv = KvCache::new(2, 4, 3);
        assert!(kv.write(1, 2, &[1.0; 4], &[2.0; 4]));
        assert!(!kv.write(1, 3, &[1.0; 4], &[2.0; 4]));
        assert!(kv.key(1, 2, 2).is_empty());
        assert_eq!(kv.key(1, 2, 3)[0], 1.0);
        assert_eq!(kv.value(1, 2, 9)[3], 2.0);
        assert!(kv.key(2, 0, 3).is_empty());
        kv.commit(9);
        assert_eq!(kv.len(), 3);
    }
}
