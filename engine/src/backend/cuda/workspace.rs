//! The device memory a GPU step reuses: the activations and outputs (`Buffers`), the step
//! upload, the greedy picks' buffers (`Picks`) and the captured step graphs. Buffers only
//! grow, to the largest step seen, and `Workspace::reserve` says when one moved, since a
//! captured graph holds their addresses and must then be captured again.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{cuda_error, Cuda};
use super::graphs::StepGraphs;
use super::launch::{self, Q8_1_BYTES};
use super::plan::{GreedyPlan, Plan};
use crate::error::Result;
use crate::model::LlamaConfig;
use crate::sample::{GreedyRow, RowNeed};

/// Device buffers of a step, grown to the largest step seen.
pub(super) struct Workspace {
    pub(super) b: Buffers,
    /// the step upload (`Plan::meta`)
    pub(super) meta: CudaSlice<u32>,
    pub(super) picks: Picks,
    /// Captured decode steps; they read and write the buffers above.
    pub(super) graphs: StepGraphs,
}

/// Device buffers of the greedy picks, `[live]` per statistic unless said otherwise.
pub(super) struct Picks {
    spans: CudaSlice<u32>,
    ids: CudaSlice<u32>,
    deltas: CudaSlice<f32>,
    /// `[live, chunks, PICK_PARTS]` first-stage results
    part: CudaSlice<f64>,
    log_z: CudaSlice<f32>,
    entropy: CudaSlice<f32>,
    argmax: CudaSlice<u32>,
    pick_logit: CudaSlice<f32>,
    /// `[live, top_k]`
    top_ids: CudaSlice<u32>,
    top_logits: CudaSlice<f32>,
}

impl Picks {
    fn new(stream: &Arc<CudaStream>) -> Result<Picks> {
        let f = || stream.alloc_zeros::<f32>(1).map_err(cuda_error("workspace allocation"));
        let u = || stream.alloc_zeros::<u32>(1).map_err(cuda_error("workspace allocation"));
        let part = stream.alloc_zeros::<f64>(1).map_err(cuda_error("workspace allocation"))?;
        Ok(Picks {
            spans: u()?,
            ids: u()?,
            deltas: f()?,
            part,
            log_z: f()?,
            entropy: f()?,
            argmax: u()?,
            pick_logit: f()?,
            top_ids: u()?,
            top_logits: f()?,
        })
    }

    /// Grows the buffers for a step; says whether any moved.
    fn reserve(&mut self, stream: &Arc<CudaStream>, live: usize, vocab: usize, g: &GreedyPlan) -> Result<bool> {
        let mut moved = grow(stream, &mut self.spans, g.spans.len())?;
        moved |= grow(stream, &mut self.ids, g.ids.len())?;
        moved |= grow(stream, &mut self.deltas, g.deltas.len())?;
        moved |= grow(stream, &mut self.part, live * vocab.div_ceil(launch::PICK_CHUNK) * launch::PICK_PARTS)?;
        for buf in [&mut self.log_z, &mut self.entropy, &mut self.pick_logit] {
            moved |= grow(stream, buf, live)?;
        }
        moved |= grow(stream, &mut self.argmax, live)?;
        moved |= grow(stream, &mut self.top_ids, live * g.top_k)?;
        moved |= grow(stream, &mut self.top_logits, live * g.top_k)?;
        Ok(moved)
    }

    /// The step's adjustments, into the buffers [`Picks::launch`] reads.
    pub(super) fn upload(&mut self, stream: &Arc<CudaStream>, g: &GreedyPlan) -> Result<()> {
        stream.memcpy_htod(&g.spans, &mut self.spans.slice_mut(0..g.spans.len())).map_err(cuda_error("pick upload"))?;
        if !g.ids.is_empty() {
            stream.memcpy_htod(&g.ids, &mut self.ids.slice_mut(0..g.ids.len())).map_err(cuda_error("pick upload"))?;
            stream
                .memcpy_htod(&g.deltas, &mut self.deltas.slice_mut(0..g.deltas.len()))
                .map_err(cuda_error("pick upload"))?;
        }
        Ok(())
    }

    /// Adjusts every live row of `logits`, then takes each row's statistics, pick and top
    /// logits, all on the device.
    pub(super) fn launch(
        &mut self,
        cuda: &Cuda,
        logits: &CudaSlice<f32>,
        live: usize,
        vocab: usize,
        g: &GreedyPlan,
    ) -> Result<()> {
        // Views of the whole buffers: their addresses, all a kernel takes, stay the same
        // from step to step (the spans bound what each row reads).
        let adjust = launch::Adjustments {
            spans: self.spans.slice(0..live + 1),
            ids: self.ids.as_view(),
            deltas: self.deltas.as_view(),
        };
        let out = launch::RowStatsOut {
            log_z: &mut self.log_z,
            entropy: &mut self.entropy,
            argmax: &mut self.argmax,
            pick_logit: &mut self.pick_logit,
        };
        launch::pick(cuda, logits, live, vocab, &adjust, &mut self.part, out)?;
        if g.top_k > 0 {
            launch::top_k(cuda, logits, live, vocab, g.top_k, &mut self.top_ids, &mut self.top_logits)?;
        }
        Ok(())
    }

    /// The picks of the rows that asked for one.
    pub(super) fn download(
        &self,
        stream: &Arc<CudaStream>,
        needs: &[RowNeed],
        top_k: usize,
    ) -> Result<Vec<Option<GreedyRow>>> {
        let live = needs.len();
        let get = |x: &CudaSlice<f32>, n: usize| stream.clone_dtoh(&x.slice(0..n)).map_err(cuda_error("pick download"));
        let (log_z, entropy, pick_logit) =
            (get(&self.log_z, live)?, get(&self.entropy, live)?, get(&self.pick_logit, live)?);
        let argmax = stream.clone_dtoh(&self.argmax.slice(0..live)).map_err(cuda_error("pick download"))?;
        let (top_ids, top_logits) = if top_k > 0 {
            (
                stream.clone_dtoh(&self.top_ids.slice(0..live * top_k)).map_err(cuda_error("pick download"))?,
                get(&self.top_logits, live * top_k)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        Ok(needs
            .iter()
            .enumerate()
            .map(|(k, need)| match need {
                RowNeed::Greedy { top_n, .. } => {
                    let top =
                        (0..(*top_n).min(top_k)).map(|j| (top_ids[k * top_k + j], top_logits[k * top_k + j])).collect();
                    Some(GreedyRow {
                        id: argmax[k],
                        id_logit: pick_logit[k],
                        log_z: log_z[k],
                        entropy: entropy[k],
                        top,
                    })
                }
                _ => None,
            })
            .collect())
    }
}

/// The activations and outputs of a step.
pub(super) struct Buffers {
    /// `[rows, n_embd]` residual stream
    pub(super) x: CudaSlice<f32>,
    /// `[rows, q_dim + 2 kv_dim]`
    pub(super) qkv: CudaSlice<f32>,
    /// `[rows, 2 n_ff]` gate and up
    pub(super) gu: CudaSlice<f32>,
    /// `[rows, max(n_embd, q_dim, n_ff) / 32]` q8_1 blocks: the normalised input of a
    /// product, the attention output or the SwiGLU, whichever the next product reads
    pub(super) a8: CudaSlice<u8>,
    /// `[rows, n_head, max_visible]` (`Plan::max_visible`, a multiple of `VISIBLE_BUCKET`)
    pub(super) scores: CudaSlice<f32>,
    /// `[live, vocab]`
    pub(super) logits: CudaSlice<f32>,
    /// `[live, 3]` (of a buffer grown to the largest step)
    pub(super) status: CudaSlice<u32>,
}

/// Replaces `buf` by a zeroed allocation of `len` when it is smaller; says whether it did
/// (the buffer moved).
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    buf: &mut CudaSlice<T>,
    len: usize,
) -> Result<bool> {
    if buf.len() >= len {
        return Ok(false);
    }
    *buf = stream.alloc_zeros::<T>(len).map_err(cuda_error("workspace allocation"))?;
    Ok(true)
}

impl Workspace {
    pub(super) fn new(stream: &Arc<CudaStream>, graphs: bool) -> Result<Workspace> {
        let f = || stream.alloc_zeros::<f32>(1).map_err(cuda_error("workspace allocation"));
        let u = || stream.alloc_zeros::<u32>(1).map_err(cuda_error("workspace allocation"));
        let a8 = stream.alloc_zeros::<u8>(1).map_err(cuda_error("workspace allocation"))?;
        let b = Buffers { x: f()?, qkv: f()?, gu: f()?, a8, scores: f()?, logits: f()?, status: u()? };
        Ok(Workspace { b, meta: u()?, picks: Picks::new(stream)?, graphs: StepGraphs::new(graphs) })
    }

    /// Grows the buffers for `plan`; says whether any moved.
    pub(super) fn reserve(&mut self, stream: &Arc<CudaStream>, c: &LlamaConfig, plan: &Plan) -> Result<bool> {
        let (rows, live, max_visible, meta) = (plan.rows, plan.readable.len(), plan.max_visible, plan.meta.len());
        let mut moved = false;
        if let Some(g) = &plan.greedy {
            moved |= self.picks.reserve(stream, live, c.vocab, g)?;
        }
        let b = &mut self.b;
        let (width, a8_blocks) = (c.q_dim() + 2 * c.kv_dim(), c.n_embd.max(c.q_dim()).max(c.n_ff) / 32);
        for (buf, len) in [
            (&mut b.x, rows * c.n_embd),
            (&mut b.qkv, rows * width),
            (&mut b.gu, rows * 2 * c.n_ff),
            (&mut b.scores, rows * c.n_head * max_visible),
            (&mut b.logits, live * c.vocab),
        ] {
            moved |= grow(stream, buf, len)?;
        }
        moved |= grow(stream, &mut b.a8, rows * a8_blocks * Q8_1_BYTES)?;
        moved |= grow(stream, &mut b.status, live * 3)?;
        moved |= grow(stream, &mut self.meta, meta)?;
        Ok(moved)
    }
}
