//! What sampling reports about a distribution, computed by the `sampling` kernels: log Z,
//! entropy, argmax and the top-k logits of each row.
//!
//! The forward pass makes greedy picks with the same kernels (`forward.rs`); this entry
//! point is what the GPU tests check against `sample.rs` on the same logits.

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
        if rows == 0 {
            return Ok(Vec::new());
        }
        let s = self.stream();
        let dev = s.clone_htod(logits).map_err(cuda_error("upload"))?;
        let alloc = |n: usize| s.alloc_zeros::<f32>(n.max(1)).map_err(cuda_error("allocation"));
        let (mut log_z, mut entropy) = (alloc(rows)?, alloc(rows)?);
        let (mut argmax, mut pick_logit) =
            (s.alloc_zeros::<u32>(rows.max(1)).map_err(cuda_error("allocation"))?, alloc(rows)?);
        let mut ids = s.alloc_zeros::<u32>((rows * k).max(1)).map_err(cuda_error("allocation"))?;
        let mut values = alloc(rows * k)?;
        // No adjustments: every span empty.
        let spans = s.alloc_zeros::<u32>(rows + 1).map_err(cuda_error("allocation"))?;
        let (none_ids, none_deltas) = (s.alloc_zeros::<u32>(1).map_err(cuda_error("allocation"))?, alloc(1)?);
        let adjust =
            launch::Adjustments { spans: spans.as_view(), ids: none_ids.as_view(), deltas: none_deltas.as_view() };
        let mut part = s
            .alloc_zeros::<f64>(rows * vocab.div_ceil(launch::PICK_CHUNK) * launch::PICK_PARTS)
            .map_err(cuda_error("allocation"))?;
        let out = launch::RowStatsOut {
            log_z: &mut log_z,
            entropy: &mut entropy,
            argmax: &mut argmax,
            pick_logit: &mut pick_logit,
        };
        launch::pick(self, &dev, rows, vocab, &adjust, &mut part, out)?;
        launch::top_k(self, &dev, rows, vocab, k, &mut ids, &mut values)?;
        let get = |x| s.clone_dtoh(x).map_err(cuda_error("download"));
        let (log_z, entropy, values) = (get(&log_z)?, get(&entropy)?, get(&values)?);
        let (argmax, ids) = (
            s.clone_dtoh(&argmax).map_err(cuda_error("download"))?,
            s.clone_dtoh(&ids).map_err(cuda_error("download"))?,
        );
        Ok((0..rows)
            .map(|r| RowStats {
                log_z: log_z[r],
                entropy: entropy[r],
                argmax: argmax[r],
                top: (0..k).map(|j| (ids[r * k + j], values[r * k + j])).collect(),
            })
            .collect())
    }
}
