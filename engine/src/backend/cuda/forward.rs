//! The Llama forward pass on the GPU: `model/forward.rs`'s order of operations, with every
//! step a kernel of the `kernels` crate.
//!
//! Per step: admit each segment (the host pool reserves its blocks, exactly as on the
//! CPU), upload one small table describing the batch (token ids, each row's sequence and
//! position, block tables, each sequence's tenant tag and bounds, the owner tags of the
//! blocks touched, the logit adjustments of greedy picks), run embedding, the layers and
//! the head, then copy back the isolation status of each sequence and what its caller
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

use cudarc::driver::{CudaSlice, CudaStream};

use super::device::{cuda_error, Cuda};
use super::graphs::{GraphKey, StepGraphs};
use super::kv::{DeviceKv, KvMemory, TenantTags};
use super::launch::{self, AttentionArgs, Heads, KvGeometry, KvStep, Output, Rows, Q8_1_BYTES, SEQ_FIELDS};
use super::weights::{DeviceLayer, DeviceWeights};
use crate::error::{Error, Result};
use crate::gguf::GgufFile;
use crate::kv::{KvPool, Tenant, Violation};
use crate::model::{Llama, LlamaConfig, Segment};
use crate::sample::{GreedyRow, RowNeed};

/// The attention workspace's row length is a multiple of this, so that a decode step's
/// arguments (and its CUDA graph) stay the same for this many positions.
const VISIBLE_BUCKET: usize = 128;

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

/// Ranges of the step upload (`Plan::meta`) each kernel argument views.
#[derive(Debug, Default)]
struct Layout {
    /// `[rows]` token ids
    ids: std::ops::Range<usize>,
    /// `[rows]` sequence (index among live ones) of each row
    row_seq: std::ops::Range<usize>,
    /// `[rows]` absolute position of each row
    row_pos: std::ops::Range<usize>,
    /// `[live]` row of each sequence's last token
    last: std::ops::Range<usize>,
    /// `[live, SEQ_FIELDS]`
    seqs: std::ops::Range<usize>,
    /// `[Σ blocks]` block tables back to back
    tables: std::ops::Range<usize>,
}

/// One step as the host describes it to the kernels.
#[derive(Debug)]
struct Plan {
    meta: Vec<u32>,
    at: Layout,
    /// `[total_blocks]` owner tags of the blocks this step touches (0 elsewhere)
    tags: Vec<u32>,
    rows: usize,
    max_visible: usize,
    /// `[live]` positions each sequence has written after this step
    readable: Vec<usize>,
    /// `[live]` tenants owning the blocks each sequence's attention reads
    owners: Vec<Vec<Tenant>>,
    skip_owner_check: bool,
    skip_bounds_check: bool,
    /// `[live]` what each sequence's caller needs of its last row
    needs: Vec<RowNeed>,
    /// The greedy picks to make, when any sequence needs one.
    greedy: Option<GreedyPlan>,
}

/// The greedy picks of a step: every live row's adjustments, back to back.
#[derive(Debug, Default)]
struct GreedyPlan {
    /// `[live + 1]` row `k` owns entries `spans[k]..spans[k + 1]`
    spans: Vec<u32>,
    /// Each row's adjusted ids, sorted, equal ids in the order they are added.
    ids: Vec<u32>,
    deltas: Vec<f32>,
    /// The most top logprobs a row asks for.
    top_k: usize,
}

impl GreedyPlan {
    fn build(needs: &[RowNeed]) -> Option<GreedyPlan> {
        if !needs.iter().any(|n| matches!(n, RowNeed::Greedy { .. })) {
            return None;
        }
        let mut g = GreedyPlan { spans: vec![0], ..GreedyPlan::default() };
        for need in needs {
            if let RowNeed::Greedy { top_n, adjust } = need {
                let mut adjust = adjust.clone();
                // Stable: a repeated id keeps the order its deltas are added in.
                adjust.sort_by_key(|a| a.0);
                g.ids.extend(adjust.iter().map(|a| a.0));
                g.deltas.extend(adjust.iter().map(|a| a.1));
                g.top_k = g.top_k.max(*top_n);
            }
            g.spans.push(g.ids.len() as u32);
        }
        Some(g)
    }
}

/// What a step gives back, per live sequence.
struct StepOut {
    /// `[live, 3]` isolation status words
    status: Vec<u32>,
    /// The last row's logits, for sequences that need them.
    rows: Vec<Option<Vec<f32>>>,
    /// The greedy pick, for sequences that asked for one.
    picks: Vec<Option<GreedyRow>>,
}

impl Plan {
    fn build(tenants: &TenantTags, pool: &KvPool, segments: &[Segment<'_, '_>], live: &[usize]) -> Plan {
        let bt = pool.shape().block_tokens;
        let (mut ids, mut row_seq, mut row_pos, mut last, mut seqs, mut tables) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut tags = vec![0u32; pool.total_blocks()];
        let (mut readable, mut owners, mut needs) = (Vec::new(), Vec::new(), Vec::new());
        for (k, &i) in live.iter().enumerate() {
            let seg = &segments[i];
            needs.push(seg.need.clone());
            let start = seg.kv.len();
            let end = start + seg.tokens.len();
            ids.extend_from_slice(seg.tokens);
            row_seq.extend(std::iter::repeat_n(k as u32, seg.tokens.len()));
            row_pos.extend((start..end).map(|p| p as u32));
            last.push((row_pos.len() - 1) as u32);
            let table = seg.kv.blocks();
            seqs.extend_from_slice(&[
                tables.len() as u32,
                table.len() as u32,
                tenants.tag(&seg.kv.owner().tenant),
                start as u32,
                end as u32,
            ]);
            tables.extend(table.iter().map(|&b| b as u32));
            // Whose blocks attention reads: those covering positions 0..end.
            let mut read = Vec::new();
            for &b in table.iter().take(end.div_ceil(bt)) {
                if let Some(tenant) = pool.try_read(b).and_then(|blk| blk.owner.as_ref().map(|o| o.tenant.clone())) {
                    if let Some(t) = tags.get_mut(b) {
                        *t = tenants.tag(&tenant);
                    }
                    read.push(tenant);
                }
            }
            readable.push(end);
            owners.push(read);
        }
        let mut meta = Vec::with_capacity(3 * ids.len() + last.len() + seqs.len() + tables.len());
        let mut put = |part: &[u32]| {
            let at = meta.len()..meta.len() + part.len();
            meta.extend_from_slice(part);
            at
        };
        let at = Layout {
            ids: put(&ids),
            row_seq: put(&row_seq),
            row_pos: put(&row_pos),
            last: put(&last),
            seqs: put(&seqs),
            tables: put(&tables),
        };
        debug_assert_eq!(seqs.len(), live.len() * SEQ_FIELDS);
        let fault = pool.fault();
        let greedy = GreedyPlan::build(&needs);
        Plan {
            meta,
            at,
            tags,
            rows: ids.len(),
            max_visible: readable.iter().copied().max().unwrap_or(0).next_multiple_of(VISIBLE_BUCKET),
            readable,
            owners,
            skip_owner_check: fault.skip_owner_check,
            skip_bounds_check: fault.skip_bounds_check,
            needs,
            greedy,
        }
    }
}

/// Device buffers of a step, grown to the largest step seen.
struct Workspace {
    b: Buffers,
    /// the step upload (`Plan::meta`)
    meta: CudaSlice<u32>,
    picks: Picks,
    /// Captured decode steps; they read and write the buffers above.
    graphs: StepGraphs,
}

/// Device buffers of the greedy picks, `[live]` per statistic unless said otherwise.
struct Picks {
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
    fn upload(&mut self, stream: &Arc<CudaStream>, g: &GreedyPlan) -> Result<()> {
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
    fn launch(
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
    fn download(&self, stream: &Arc<CudaStream>, needs: &[RowNeed], top_k: usize) -> Result<Vec<Option<GreedyRow>>> {
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
struct Buffers {
    /// `[rows, n_embd]` residual stream
    x: CudaSlice<f32>,
    /// `[rows, q_dim + 2 kv_dim]`
    qkv: CudaSlice<f32>,
    /// `[rows, 2 n_ff]` gate and up
    gu: CudaSlice<f32>,
    /// `[rows, max(n_embd, q_dim, n_ff) / 32]` q8_1 blocks: the normalised input of a
    /// product, the attention output or the SwiGLU, whichever the next product reads
    a8: CudaSlice<u8>,
    /// `[rows, n_head, max_visible]` (`Plan::max_visible`, a multiple of `VISIBLE_BUCKET`)
    scores: CudaSlice<f32>,
    /// `[live, vocab]`
    logits: CudaSlice<f32>,
    /// `[live, 3]` (of a buffer grown to the largest step)
    status: CudaSlice<u32>,
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
    fn new(stream: &Arc<CudaStream>, graphs: bool) -> Result<Workspace> {
        let f = || stream.alloc_zeros::<f32>(1).map_err(cuda_error("workspace allocation"));
        let u = || stream.alloc_zeros::<u32>(1).map_err(cuda_error("workspace allocation"));
        let a8 = stream.alloc_zeros::<u8>(1).map_err(cuda_error("workspace allocation"))?;
        let b = Buffers { x: f()?, qkv: f()?, gu: f()?, a8, scores: f()?, logits: f()?, status: u()? };
        Ok(Workspace { b, meta: u()?, picks: Picks::new(stream)?, graphs: StepGraphs::new(graphs) })
    }

    /// Grows the buffers for `plan`; says whether any moved.
    fn reserve(&mut self, stream: &Arc<CudaStream>, c: &LlamaConfig, plan: &Plan) -> Result<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::FaultConfig;
    use crate::kv::{BlockShape, Owner, SequenceKv};

    fn pool() -> KvPool {
        let shape = BlockShape { layers: 2, block_tokens: 4, kv_dim: 8, kv_heads: 2 };
        KvPool::new(shape, 16, FaultConfig::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_plan_describes_each_live_sequence_its_rows_and_the_owner_tags_of_its_blocks() {
        let pool = pool();
        let tenants = TenantTags::default();
        let (mut a, mut b) = (
            SequenceKv::uncached(&pool, Owner::new("alice", "1"), 32),
            SequenceKv::uncached(&pool, Owner::new("bob", "2"), 32),
        );
        // alice: 5 tokens already written, 1 new (decode); bob: 6 new (prefill).
        a.reserve(&[1, 2, 3, 4, 5]).unwrap_or_else(|e| panic!("{e}"));
        a.commit();
        let (ta, tb) = ([6u32], [7u32, 8, 9, 10, 11, 12]);
        let mut segments = [Segment::new(&ta, &mut a), Segment::new(&tb, &mut b)];
        for seg in segments.iter_mut() {
            seg.kv.reserve(seg.tokens).unwrap_or_else(|e| panic!("{e}"));
        }
        let plan = Plan::build(&tenants, &pool, &segments, &[0, 1]);
        let part = |r: &std::ops::Range<usize>| plan.meta[r.clone()].to_vec();
        assert_eq!(plan.rows, 7);
        assert_eq!(part(&plan.at.ids), [6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(part(&plan.at.row_seq), [0, 1, 1, 1, 1, 1, 1]);
        assert_eq!(part(&plan.at.row_pos), [5, 0, 1, 2, 3, 4, 5]);
        assert_eq!(part(&plan.at.last), [0, 6]);
        let (alice, bob) = (tenants.tag(&"alice".into()), tenants.tag(&"bob".into()));
        assert_ne!(alice, bob);
        // [table_at, table_len, tenant, write_from, readable] per sequence.
        assert_eq!(part(&plan.at.seqs), [0, 2, alice, 5, 6, 2, 2, bob, 0, 6]);
        let tables = part(&plan.at.tables);
        assert_eq!(tables.len(), 4);
        for (i, &id) in tables.iter().enumerate() {
            assert_eq!(plan.tags[id as usize], if i < 2 { alice } else { bob }, "block {id}");
        }
        assert_eq!(plan.tags.iter().filter(|t| **t != 0).count(), 4, "untouched blocks carry no tag");
        assert_eq!((plan.max_visible, plan.readable.clone()), (VISIBLE_BUCKET, vec![5 + 1, 6]));
        let names = |k: usize| plan.owners[k].iter().map(|t| t.as_str().to_owned()).collect::<Vec<_>>();
        assert_eq!((names(0), names(1)), (vec!["alice".to_owned(); 2], vec!["bob".to_owned(); 2]));
    }

    #[test]
    fn status_words_become_the_cpus_violations() {
        assert_eq!(violation(&[0, 0, 0], 9), None);
        assert_eq!(violation(&[1, 7, 32], 9), Some(Violation::ForeignBlock { block: 7, position: 32 }));
        assert_eq!(violation(&[2, u32::MAX, 12], 9), Some(Violation::OutOfBounds { position: 12, readable: 9 }));
    }
}
