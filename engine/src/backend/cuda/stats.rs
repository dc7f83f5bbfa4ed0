//! What sampling reports about a distribution, computed by the `sampling` kernels: log Z,
//! entropy, argmax and the top-k logits of each row.
//!
//! The engine samples on the host today (see `forward.rs`); this is the device path the
//! GPU tests check against `sample.rs`, so moving sampling onto the GPU later changes
//! where, not what.

use super::device::{cuda_error, Cuda};
use super::launch;
use crate::error::Result;

/// Statistics of one row of logits.
#[derive(Debug, Clone, PartialEq)]
pub struct RowStats {
    /// `ln Σ e^l`
    pub log_z: f32,
    /// Entropy of the softmax, in nats.
    pub entropy: f32,
    /// Index of the largest logit (lowest on ties).
    pub argmax: u32,
    /// The `k` largest logits as (id, logit), largest first, ties by lower id.
    pub top: Vec<(u32, f32)>,
}

impl Cuda {
    /// [`RowStats`] of every `[vocab]` row of `logits`, with the `k` (at most 32) largest.
    pub fn logits_stats(&self, logits: &[f32], vocab: usize, k: usize) -> Result<Vec<RowStats>> {
        let rows = logits.len().checked_div(vocab).unwrap_or(0);
        let s = self.stream();
        let dev = s.clone_htod(logits).map_err(cuda_error("upload"))?;
        let alloc = |n: usize| s.alloc_zeros::<f32>(n.max(1)).map_err(cuda_error("allocation"));
        let (mut log_z, mut entropy) = (alloc(rows)?, alloc(rows)?);
        let mut argmax = s.alloc_zeros::<u32>(rows.max(1)).map_err(cuda_error("allocation"))?;
        let mut ids = s.alloc_zeros::<u32>((rows * k).max(1)).map_err(cuda_error("allocation"))?;
        let mut values = alloc(rows * k)?;
        launch::logits_stats(self, &dev, rows, vocab, &mut log_z, &mut entropy, &mut argmax)?;
        launch::top_k(self, &dev, rows, vocab, k, &mut ids, &mut values)?;
        let get = |x| s.clone_dtoh(x).map_err(cuda_error("download"));
        let (log_z, entropy, values) = (get(&log_z)?, get(&entropy)?, get(&values)?);
        let (argmax, ids) = (s.clone_dtoh(&argmax).map_err(cuda_error("download"))?, s.clone_dtoh(&ids).map_err(cuda_error("download"))?);
        Ok((0..rows)
            .map(|r| RowStats { log_z: log_z[r], entropy: entropy[r], argmax: argmax[r], top: (0..k).map(|j| (ids[r * k + j], values[r * k + j])).collect() })
            .collect())
    }
}
