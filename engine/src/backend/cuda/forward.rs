//! The Llama forward pass on the GPU: `model/forward.rs`'s order of operations, with every
//! step a kernel of the `kernels` crate.
//!
//! Per step: admit each segment (the host pool reserves its blocks, exactly as on the
//! CPU), upload one small table describing the batch (token ids, each row's sequence and
//! position, block tables, each sequence's tenant tag and bounds, the owner tags of the
//! blocks touched, the logit adjustments of greedy picks; built on the host by `plan.rs`)
//! into the device buffers every step reuses (`workspace.rs`), run embedding, the layers
//! and the head, then copy back the isolation status of each sequence and what its caller
//! needs of its last row ([`RowNeed`]): the greedy pick made on the device, the whole row
//! of logits, or nothing while it prefills. A sequence whose KV access a kernel refused
//! gets [`Error::Isolation`] and is not committed, as on the CPU; the others proceed.
//!
//! A layer is 10 launches: RMSNorm (to q8_1), Q/K/V as one product, RoPE, the checked KV
//! append, checked attention (to q8_1), Wo (adding into the residual), RMSNorm, gate/up
//! as one product, SwiGLU (to q8_1), W_down. A step whose shape repeats replays as a CUDA
//! graph (`graphs.rs`). Measured on an H200 (BENCHMARKS.md), every kernel of a decode step
//! is latency-bound, 1.8 % of the weight-streaming bound at batch 1; what would go further
//! is fewer, fatter kernels and a real GEMM for prefill, not more bandwidth.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::CudaSlice;

use super::device::{cuda_error, Cuda};
use super::graphs::GraphKey;
use super::kv::{DeviceKv, KvMemory};
use super::launch::{self, AttentionArgs, Heads, KvGeometry, KvStep, Output, Rows};
use super::plan::{Plan, StepOut};
use super::weights::{DeviceLayer, DeviceWeights};
use super::workspace::{Buffers, Picks, Workspace};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv::{KvPool, Violation};
use crate::model::{Llama, LlamaConfig, Segment};
use crate::sample::RowNeed;

/// The model on one GPU, with the device half of the KV pool.
pub(crate) struct GpuModel {
    cuda: Arc<Cuda>,
    weights: DeviceWeights,
    kv: Arc<DeviceKv>,
    /// Positions the RoPE table covers.
    max_pos: usize,
    work: Mutex<Workspace>,
}

impl fmt::Debug for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuModel")
            .field("cuda", &self.cuda)
            .field("kv", &self.kv)
            .field("max_pos", &self.max_pos)
            .finish()
    }
}

impl GpuModel {
    /// Uploads `model` and allocates the device KV pool, which `pool` then mirrors into
    /// (zero-fills and copies happen on the device from here on).
    /// `graphs`: capture repeated decode steps as CUDA graphs (see `graphs.rs`).
    pub fn load(
        cuda: Arc<Cuda>,
        file: &GgufFile,
        model: &Llama,
        pool: &KvPool,
        max_pos: usize,
        graphs: bool,
    ) -> Result<GpuModel> {
        let shape = pool.shape();
        let geometry = KvGeometry {
            layers: shape.layers,
            block_tokens: shape.block_tokens,
            kv_dim: shape.kv_dim,
            total_blocks: pool.total_blocks(),
        };
        let weights = DeviceWeights::upload(&cuda, file, model, max_pos)?;
        let kv = Arc::new(DeviceKv::new(cuda.clone(), geometry)?);
        if !pool.attach_mirror(kv.clone()) {
            return Err(Error::InvalidOptions { reason: "the KV pool already has a device mirror".into() });
        }
        let work = Mutex::new(Workspace::new(cuda.stream(), graphs)?);
        cuda.stream().synchronize().map_err(cuda_error("upload"))?;
        Ok(GpuModel { cuda, weights, kv, max_pos, work })
    }

    pub fn device_name(&self) -> &str {
        self.cuda.name()
    }

    /// `Llama::forward_batch` on the GPU: same admission, same errors per segment, same
    /// `[segments, vocab]` logits (zeros for a failed segment) into `logits`.
    pub fn forward_batch(
        &self,
        model: &Llama,
        pool: &KvPool,
        segments: &mut [Segment<'_, '_>],
        logits: &mut Vec<f32>,
    ) -> Result<()> {
        let c = &model.config;
        for seg in segments.iter_mut() {
            seg.picked = None;
            seg.error = model.admit(seg).err();
            if seg.error.is_none() && seg.kv.len() + seg.tokens.len() > self.max_pos {
                seg.error = Some(Error::ContextOverflow {
                    prompt_tokens: seg.kv.len() + seg.tokens.len(),
                    limit: self.max_pos,
                });
            }
        }
        // Rows only for callers that need them: a batch of greedy picks moves no logits.
        logits.clear();
        if segments.iter().any(|seg| seg.need == RowNeed::Logits) {
            logits.resize(segments.len() * c.vocab, 0.0);
        }
        let live: Vec<usize> = (0..segments.len()).filter(|&i| segments[i].error.is_none()).collect();
        if live.is_empty() {
            return Ok(());
        }
        let plan = Plan::build(&self.kv.tenants, pool, segments, &live);
        let mut out = self.run(c, &plan)?;
        for (k, &i) in live.iter().enumerate() {
            let seg = &mut segments[i];
            match violation(&out.status[k * 3..k * 3 + 3], plan.readable[k]) {
                Some(v) => seg.error = Some(pool.violation(v)),
                None => {
                    seg.kv.commit();
                    seg.kv.set_read_owners(plan.owners[k].clone());
                    if let Some(row) = out.rows[k].take() {
                        logits[i * c.vocab..(i + 1) * c.vocab].copy_from_slice(&row);
                    }
                    seg.picked = out.picks[k].take();
                }
            }
        }
        Ok(())
    }

    /// Runs the planned step: its isolation status words, and per live sequence what its
    /// caller needs of the last row.
    fn run(&self, c: &LlamaConfig, plan: &Plan) -> Result<StepOut> {
        let cuda = &*self.cuda;
        let stream = cuda.stream();
        let mut work = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        let mut memory = self.kv.lock()?;
        let KvMemory { data: kv, tags } = &mut *memory;
        let live = plan.readable.len();
        if work.reserve(stream, c, plan)? {
            work.graphs.invalidate();
        }
        let Workspace { b, meta, picks, graphs } = &mut *work;
        // Everything that changes from step to step goes into device buffers first; the
        // kernels then take the same arguments for every step of this shape.
        stream.memcpy_htod(&plan.meta, &mut meta.slice_mut(0..plan.meta.len())).map_err(cuda_error("step upload"))?;
        stream.memcpy_htod(&plan.tags, &mut tags.slice_mut(0..plan.tags.len())).map_err(cuda_error("tag upload"))?;
        stream.memset_zeros(&mut b.status.slice_mut(0..live * 3)).map_err(cuda_error("status reset"))?;
        if let Some(greedy) = &plan.greedy {
            picks.upload(stream, greedy)?;
        }
        let key = GraphKey {
            rows: plan.rows,
            live,
            max_visible: plan.max_visible,
            picks: plan.greedy.as_ref().map(|g| g.top_k),
        };
        graphs.run(stream, key, &mut || self.launch_step(c, plan, b, meta, picks, kv, tags))?;
        let status = stream.clone_dtoh(&b.status.slice(0..live * 3)).map_err(cuda_error("status download"))?;
        let mut rows = Vec::with_capacity(live);
        for (k, need) in plan.needs.iter().enumerate() {
            let row = match need {
                RowNeed::Logits => Some(
                    stream
                        .clone_dtoh(&b.logits.slice(k * c.vocab..(k + 1) * c.vocab))
                        .map_err(cuda_error("logits download"))?,
                ),
                _ => None,
            };
            rows.push(row);
        }
        let picks = match &plan.greedy {
            Some(greedy) => picks.download(stream, &plan.needs, greedy.top_k)?,
            None => vec![None; live],
        };
        stream.synchronize().map_err(cuda_error("step"))?;
        Ok(StepOut { status, rows, picks })
    }

    /// Every kernel of the step, in order: what a CUDA graph of the step holds.
    #[allow(clippy::too_many_arguments)]
    fn launch_step(
        &self,
        c: &LlamaConfig,
        plan: &Plan,
        b: &mut Buffers,
        meta: &CudaSlice<u32>,
        picks: &mut Picks,
        kv: &mut CudaSlice<u16>,
        tags: &CudaSlice<u32>,
    ) -> Result<()> {
        let cuda = &*self.cuda;
        let live = plan.readable.len();
        let at = &plan.at;
        let kv_step = KvStep {
            tables: meta.slice(at.tables.clone()),
            seqs: meta.slice(at.seqs.clone()),
            row_seq: meta.slice(at.row_seq.clone()),
            row_pos: meta.slice(at.row_pos.clone()),
            tags: tags.slice(0..plan.tags.len()),
            n_seqs: live,
        };
        let step = LayerStep {
            c,
            plan,
            kv_step,
            heads: Heads { n_head: c.n_head, n_head_kv: c.n_head_kv, head_dim: c.head_dim },
        };
        launch::embed(cuda, &self.weights.embed, &meta.slice(at.ids.clone()), &mut b.x)?;
        for (li, l) in self.weights.layers.iter().enumerate() {
            self.attention_block(li, l, &step, b, kv)?;
            self.ffn_block(l, &step, b)?;
        }
        // Head: the last row of each live sequence, normalised, times the output matrix.
        launch::rms_norm_q8_1(
            cuda,
            &b.x,
            Rows::Listed(&meta.slice(at.last.clone())),
            &self.weights.norm,
            c.rms_eps,
            c.n_embd,
            &mut b.a8,
        )?;
        launch::matmul(
            cuda,
            self.weights.head(),
            &b.a8,
            live,
            &mut b.logits,
            Output { ld: c.vocab, col_offset: 0, accumulate: false },
        )?;
        if let Some(greedy) = &plan.greedy {
            picks.launch(cuda, &b.logits, live, c.vocab, greedy)?;
        }
        Ok(())
    }

    /// `x += Wo · attention(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))`, caching K and V;
    /// every cache write and read checked in the kernels.
    fn attention_block(
        &self,
        li: usize,
        l: &DeviceLayer,
        s: &LayerStep<'_>,
        b: &mut Buffers,
        kv: &mut CudaSlice<u16>,
    ) -> Result<()> {
        let (cuda, c, rows, heads) = (&*self.cuda, s.c, s.plan.rows, s.heads);
        launch::rms_norm_q8_1(cuda, &b.x, Rows::All(rows), &l.attn_norm, c.rms_eps, c.n_embd, &mut b.a8)?;
        let mut offset = 0;
        for m in &l.qkv {
            launch::matmul(
                cuda,
                m,
                &b.a8,
                rows,
                &mut b.qkv,
                Output { ld: heads.row(), col_offset: offset, accumulate: false },
            )?;
            offset += m.rows;
        }
        launch::rope(cuda, &mut b.qkv, &self.weights.rope, &s.kv_step.row_pos, heads, c.rope_dims / 2)?;
        let geo = self.kv.geometry;
        launch::kv_append(cuda, &b.qkv, heads, kv, geo, &s.kv_step, &mut b.status, li)?;
        let args = AttentionArgs {
            layer: li,
            heads,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
            max_visible: s.plan.max_visible,
            check_owner: !s.plan.skip_owner_check,
            check_bounds: !s.plan.skip_bounds_check,
        };
        launch::attention(cuda, &b.qkv, &mut b.a8, &mut b.scores, kv, geo, &s.kv_step, &mut b.status, args)?;
        launch::matmul(cuda, &l.wo, &b.a8, rows, &mut b.x, Output { ld: c.n_embd, col_offset: 0, accumulate: true })
    }

    /// `x += W_down · (silu(W_gate · n(x)) * (W_up · n(x)))`.
    fn ffn_block(&self, l: &DeviceLayer, s: &LayerStep<'_>, b: &mut Buffers) -> Result<()> {
        let (cuda, c, rows, ff) = (&*self.cuda, s.c, s.plan.rows, s.c.n_ff);
        launch::rms_norm_q8_1(cuda, &b.x, Rows::All(rows), &l.ffn_norm, c.rms_eps, c.n_embd, &mut b.a8)?;
        let mut offset = 0;
        for m in &l.gate_up {
            launch::matmul(
                cuda,
                m,
                &b.a8,
                rows,
                &mut b.gu,
                Output { ld: 2 * ff, col_offset: offset, accumulate: false },
            )?;
            offset += m.rows;
        }
        launch::swiglu_q8_1(cuda, &b.gu, &mut b.a8, rows, ff)?;
        launch::matmul(cuda, &l.down, &b.a8, rows, &mut b.x, Output { ld: c.n_embd, col_offset: 0, accumulate: true })
    }
}

/// What every layer's kernels of one step share.
struct LayerStep<'s> {
    c: &'s LlamaConfig,
    plan: &'s Plan,
    kv_step: KvStep<'s>,
    heads: Heads,
}

/// The isolation violation a sequence's status words report, if any.
fn violation(status: &[u32], readable: usize) -> Option<Violation> {
    let (block, position) = (status[1] as usize, status[2] as usize);
    match status[0] {
        0 => None,
        1 => Some(Violation::ForeignBlock { block, position }),
        _ => Some(Violation::OutOfBounds { position, readable }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words_become_the_cpus_violations() {
        assert_eq!(violation(&[0, 0, 0], 9), None);
        assert_eq!(violation(&[1, 7, 32], 9), Some(Violation::ForeignBlock { block: 7, position: 32 }));
        assert_eq!(violation(&[2, u32::MAX, 12], 9), Some(Violation::OutOfBounds { position: 12, readable: 9 }));
    }
}
