//! The KV pool's blocks in device memory, and the owner tags the kernels check.
//!
//! Owns the device copy of every block (`[total_blocks, 2, layers, block_tokens, kv_dim]`
//! f16, one plain allocation) and the per-block tag array. The host [`KvPool`] stays the
//! authority on who holds which block: it calls [`BlockMirror::zero`] where it would
//! clear its own memory, and this launches the zero-fill kernel on the engine's stream
//! right there, before the block is back on the free list — stream order puts the clear
//! ahead of any later kernel that could touch the block. Each step the forward pass
//! uploads the tags of the blocks it touches (interned tenant ids, 0 for nobody) from the
//! pool's truth; the kernels compare them with each sequence's tenant.
//!
//! Invariants: lock order is the pool's state lock, then `memory` (the pool calls
//! `zero` under its lock; the forward pass reserves blocks before taking `memory`). A
//! zero-fill that failed to launch poisons the mirror: every later step fails, so no
//! block is read after a clear that may not have happened.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::CudaSlice;

use super::device::{cuda_error, Cuda};
use super::launch::{self, KvGeometry};
use crate::error::{Error, Result};
use crate::kv::{BlockId, BlockMirror, Tenant};

/// Device memory of the pool.
pub(crate) struct KvMemory {
    /// `[total_blocks, 2, layers, block_tokens, kv_dim]` f16 bits
    pub data: CudaSlice<u16>,
    /// `[total_blocks]` tag of the block's owner as last uploaded (0: nobody)
    pub tags: CudaSlice<u32>,
}

/// Tenants as the kernels see them: small integers, 0 for nobody.
#[derive(Debug, Default)]
pub(crate) struct TenantTags(Mutex<HashMap<Tenant, u32>>);

impl TenantTags {
    /// The tag of `tenant` (1, 2, ... in order of first sight).
    pub fn tag(&self, tenant: &Tenant) -> u32 {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let next = u32::try_from(map.len() + 1).unwrap_or(u32::MAX);
        *map.entry(tenant.clone()).or_insert(next)
    }
}

/// The device half of the KV pool.
pub(crate) struct DeviceKv {
    cuda: Arc<Cuda>,
    pub geometry: KvGeometry,
    memory: Mutex<KvMemory>,
    pub tenants: TenantTags,
    /// Set when a zero-fill or copy could not be issued.
    poisoned: Mutex<Option<String>>,
}

impl fmt::Debug for DeviceKv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceKv").field("geometry", &self.geometry).finish()
    }
}

impl DeviceKv {
    /// Allocates the whole pool, zeroed.
    pub fn new(cuda: Arc<Cuda>, geometry: KvGeometry) -> Result<DeviceKv> {
        let stream = cuda.stream().clone();
        let data = stream
            .alloc_zeros::<u16>(geometry.total_blocks * geometry.block_halves())
            .map_err(cuda_error("KV pool allocation"))?;
        let tags = stream.alloc_zeros::<u32>(geometry.total_blocks).map_err(cuda_error("KV tag allocation"))?;
        Ok(DeviceKv {
            cuda,
            geometry,
            memory: Mutex::new(KvMemory { data, tags }),
            tenants: TenantTags::default(),
            poisoned: Mutex::default(),
        })
    }

    /// The device memory, for one step's kernels; fails if a clear was lost.
    pub fn lock(&self) -> Result<MutexGuard<'_, KvMemory>> {
        if let Some(reason) = self.poisoned.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Err(Error::Cuda { op: "KV zero-fill", reason });
        }
        Ok(self.memory.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn poison(&self, e: &Error) {
        tracing::error!(error = %e, "device KV zero-fill or copy failed; the GPU engine refuses further steps");
        *self.poisoned.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
    }

    fn copy_block(&self, from: BlockId, to: BlockId) -> Result<()> {
        let n = self.geometry.block_halves();
        if from.max(to) >= self.geometry.total_blocks {
            return Err(Error::Cuda {
                op: "KV block copy",
                reason: format!("block {} outside the pool", from.max(to)),
            });
        }
        if from == to {
            return Ok(());
        }
        let mut m = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        // Two disjoint views of the one allocation: split between the blocks.
        let (mut low, mut high) = m.data.split_at_mut(from.max(to) * n);
        let (src, mut dst) = if from < to {
            (low.slice(from * n..(from + 1) * n), high.slice_mut(0..n))
        } else {
            (high.slice(0..n), low.slice_mut(to * n..(to + 1) * n))
        };
        self.cuda.stream().memcpy_dtod(&src, &mut dst).map_err(cuda_error("KV block copy"))
    }
}

impl BlockMirror for DeviceKv {
    fn zero(&self, id: BlockId) {
        let mut m = self.memory.lock().unwrap_or_else(PoisonError::into_inner);
        let KvMemory { data, tags } = &mut *m;
        if let Err(e) = launch::zero_fill(&self.cuda, data, tags, self.geometry, id) {
            drop(m);
            self.poison(&e);
        }
    }

    fn copy(&self, from: BlockId, to: BlockId) {
        if let Err(e) = self.copy_block(from, to) {
            self.poison(&e);
        }
    }
}

/// On the GPU (with `CROSSGUARD_GPU_TESTS=1`, run by scripts/gpu-check.sh): the zero-fill
/// kernel through the pool, and the `skip_zero_fill` fault leaving blocks as they were.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultConfig;
    use crate::kv::{BlockShape, KvPool, Owner};

    type TestResult = std::result::Result<(), Box<dyn std::error::Error>>;

    const GEO: KvGeometry = KvGeometry { layers: 2, block_tokens: 4, kv_dim: 8, total_blocks: 3 };

    fn gpu() -> Option<Arc<Cuda>> {
        if std::env::var_os("CROSSGUARD_GPU_TESTS").is_none_or(|v| v != "1") {
            eprintln!("skipped: set CROSSGUARD_GPU_TESTS=1 on a machine with a GPU");
            return None;
        }
        Some(Cuda::open(0).unwrap_or_else(|e| panic!("CROSSGUARD_GPU_TESTS=1 but no usable GPU: {e}")))
    }

    /// A pool mirrored on the device, every device block and tag filled with a pattern.
    fn filled(
        cuda: &Arc<Cuda>,
        fault: FaultConfig,
    ) -> std::result::Result<(KvPool, Arc<DeviceKv>), Box<dyn std::error::Error>> {
        let pool = KvPool::new(
            BlockShape { layers: GEO.layers, block_tokens: GEO.block_tokens, kv_dim: GEO.kv_dim, kv_heads: 1 },
            GEO.total_blocks,
            fault,
        )?;
        let kv = Arc::new(DeviceKv::new(cuda.clone(), GEO)?);
        assert!(pool.attach_mirror(kv.clone()));
        {
            let mut m = kv.lock()?;
            let n = m.data.len();
            cuda.stream().memcpy_htod(&vec![0x3c00u16; n], &mut m.data)?; // 1.0 in f16
            cuda.stream().memcpy_htod(&[7u32; 3], &mut m.tags)?;
        }
        Ok((pool, kv))
    }

    fn download(cuda: &Cuda, kv: &DeviceKv) -> std::result::Result<(Vec<u16>, Vec<u32>), Box<dyn std::error::Error>> {
        let m = kv.lock()?;
        Ok((cuda.stream().clone_dtoh(&m.data)?, cuda.stream().clone_dtoh(&m.tags)?))
    }

    #[test]
    fn a_released_block_is_zeroed_on_the_device_and_loses_its_tag_and_no_other_block_changes() -> TestResult {
        let Some(cuda) = gpu() else { return Ok(()) };
        let (pool, kv) = filled(&cuda, FaultConfig::default())?;
        let id = pool.allocate(&Owner::new("alice", "1"))?;
        pool.release(&[id]);
        let (data, tags) = download(&cuda, &kv)?;
        let n = GEO.block_halves();
        for (b, block) in data.chunks_exact(n).enumerate() {
            let want = if b == id { 0 } else { 0x3c00 };
            assert!(block.iter().all(|v| *v == want), "block {b}");
            assert_eq!(tags[b], if b == id { 0 } else { 7 }, "tag {b}");
        }
        Ok(())
    }

    #[test]
    fn with_skip_zero_fill_a_released_block_keeps_its_contents() -> TestResult {
        let Some(cuda) = gpu() else { return Ok(()) };
        let (pool, kv) = filled(&cuda, FaultConfig { skip_zero_fill: true, ..FaultConfig::default() })?;
        let id = pool.allocate(&Owner::new("alice", "1"))?;
        pool.release(&[id]);
        let (data, _) = download(&cuda, &kv)?;
        assert!(data.iter().all(|v| *v == 0x3c00), "the fault must leave the old contents");
        Ok(())
    }

    #[test]
    fn copy_on_write_copies_the_device_block() -> TestResult {
        let Some(cuda) = gpu() else { return Ok(()) };
        let (_pool, kv) = filled(&cuda, FaultConfig::default())?;
        kv.zero(2);
        kv.copy(2, 0);
        let (data, _) = download(&cuda, &kv)?;
        let n = GEO.block_halves();
        assert!(data[..n].iter().all(|v| *v == 0), "block 0 is block 2's copy");
        assert!(data[n..2 * n].iter().all(|v| *v == 0x3c00), "block 1 untouched");
        Ok(())
    }
}
