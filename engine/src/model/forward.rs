//! The Llama-family forward pass over a batch of consecutive tokens of one or more
//! sequences.
//!
//! Owns the order of operations of a layer — RMSNorm, Q/K/V projections (and their biases),
//! per-head Q/K RMSNorm (Qwen 3), RoPE, grouped-query attention over the KV cache, output
//! projection, RMSNorm, SwiGLU feed-forward, residual adds — following llama.cpp's graphs
//! for each [`Arch`](super::Arch), so that greedy decoding agrees with it token for token. Prefill runs the whole prompt as one batch (matrix-
//! matrix products); decode is the same code with one token.
//!
//! Two paths share everything but the matrix products: `Path::fast` (quantized
//! activations, SIMD, threads) and `Path::reference` (every weight row dequantized to f32
//! and multiplied naively), which tests use as the plain ground truth.

use std::cell::RefCell;

use crate::backend::cpu::{attention, matmul_reference, ops, Activations, Cpu, Matrix};
use crate::error::{Error, Result};
use crate::kv::{HeadBlock, LayerKv, SequenceKv};
use crate::sample::{GreedyRow, RowNeed};

use super::{Arch, Gate, Layer, Llama, RopePairs};

/// Query positions per attention task: enough tasks to balance, few enough to be cheap.
const ATTENTION_TOKEN_STEP: usize = 16;

/// Blocks of positions per score task of a single query (128 positions at the default
/// block size): a 700-token context makes 18 tasks of the default model's 3 KV heads.
const SCORE_TASK_BLOCKS: usize = 8;

/// How many blocks ahead attention prefetches keys and values where it does (see
/// `Cpu::prefetches_kv`).
const KV_PREFETCH_BLOCKS: usize = 2;

thread_local! {
    /// [`Llama::attend_one`]'s per-task buffers, kept by each thread for its next tasks
    /// (an allocation and a free per task were 2 % of 2-thread decode): a score task's
    /// scores of its run of blocks, and a value task's probabilities of its KV head.
    static SCORE_RUN: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static HEAD_PROBS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// How matrix products are computed.
#[derive(Debug, Clone, Copy)]
pub struct Path<'a> {
    cpu: &'a Cpu,
    reference: bool,
}

impl<'a> Path<'a> {
    /// Quantized kernels on the CPU backend's threads.
    pub fn fast(cpu: &'a Cpu) -> Path<'a> {
        Path { cpu, reference: false }
    }

    /// f32 dequantize-and-multiply (slow; for tests).
    pub fn reference(cpu: &'a Cpu) -> Path<'a> {
        Path { cpu, reference: true }
    }

    /// `out[t] = ws (stacked) · input[t]`; `input` is `[tokens, cols]`.
    fn project(
        &self,
        ws: &[&Matrix],
        input: &[f32],
        cols: usize,
        acts: &mut Activations,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let tokens = input.len() / cols.max(1);
        let total: usize = ws.iter().map(|w| w.rows).sum();
        out.resize(tokens * total, 0.0);
        if !self.reference {
            if ws.iter().all(|w| w.takes_quantized()) {
                acts.set_quantized(&self.cpu.pool, input, cols);
            } else {
                acts.set(input, cols);
            }
            return self.cpu.matmul(ws, acts, out);
        }
        let mut offset = 0;
        let mut part = Vec::new();
        for w in ws {
            part.resize(tokens * w.rows, 0.0);
            matmul_reference(w, input, &mut part);
            for t in 0..tokens {
                out[t * total + offset..t * total + offset + w.rows]
                    .copy_from_slice(&part[t * w.rows..(t + 1) * w.rows]);
            }
            offset += w.rows;
        }
        Ok(())
    }
}

/// Buffers of one forward pass, reused across steps of a request.
#[derive(Debug, Default)]
pub struct Scratch {
    /// `[tokens, n_embd]` residual stream
    x: Vec<f32>,
    /// `[tokens, n_embd]` normalised input of a sub-block
    xn: Vec<f32>,
    /// `[tokens, q_dim + 2 * kv_dim]` queries, keys, values
    qkv: Vec<f32>,
    /// `[tokens, q_dim]` attention output
    attn: Vec<f32>,
    /// `[tokens, n_embd]` projection back into the residual stream
    proj: Vec<f32>,
    /// `[tokens, 2 * n_ff]` gate and up projections
    gu: Vec<f32>,
    /// `[tokens, n_ff]` SwiGLU output
    h: Vec<f32>,
    /// A decode step's attention scores, `[n_head, positions]`
    scores: Vec<f32>,
    acts: Activations,
    /// The feed-forward's hidden activations, when SwiGLU goes straight into them
    hidden: Activations,
    /// `[rope_dims / 2]` (cos, sin)
    rope: Vec<(f32, f32)>,
    /// `[segments, vocab]` logits of each sequence's last token in the batch
    pub logits: Vec<f32>,
}

/// One sequence's part of a batched forward step.
#[derive(Debug)]
pub struct Segment<'a, 'p> {
    pub tokens: &'a [u32],
    pub kv: &'a mut SequenceKv<'p>,
    /// Why this sequence dropped out of the step (its KV refused a read or write, it
    /// overflowed, the pool is full); its rows are discarded and nothing is committed.
    pub error: Option<Error>,
    /// What the caller needs of the last row. The CPU leaves every row's logits; the GPU
    /// copies back only rows that need them and makes greedy picks itself.
    pub need: RowNeed,
    /// The pick a backend made for [`RowNeed::Greedy`] (the GPU's); `None` means reduce
    /// the row of logits on the host.
    pub picked: Option<GreedyRow>,
}

impl<'a, 'p> Segment<'a, 'p> {
    /// A segment whose caller needs its last row of logits.
    pub fn new(tokens: &'a [u32], kv: &'a mut SequenceKv<'p>) -> Segment<'a, 'p> {
        Segment { tokens, kv, error: None, need: RowNeed::Logits, picked: None }
    }

    /// The segment with what its caller needs of the last row.
    pub fn needing(self, need: RowNeed) -> Segment<'a, 'p> {
        Segment { need, ..self }
    }
}

impl Llama {
    /// Runs `tokens` at positions `kv.len()..` through the model, appends their keys and
    /// values to `kv`, and leaves the last token's logits in `scratch.logits`. An
    /// isolation violation of the KV cache stops the pass with its error.
    pub fn forward(&self, path: Path<'_>, tokens: &[u32], kv: &mut SequenceKv<'_>, s: &mut Scratch) -> Result<()> {
        let mut segments = [Segment::new(tokens, kv)];
        self.forward_batch(path, &mut segments, s)?;
        segments[0].error.take().map_or(Ok(()), Err)
    }

    /// Runs several sequences' tokens as one batch: the matrix products see every row at
    /// once, attention runs per sequence over its own checked KV. A sequence that fails
    /// (isolation, overflow, full pool) gets its `error`, is not committed, and does not
    /// stop the others. Leaves `[segments, vocab]` logits (each one's last token) in
    /// `scratch.logits`; a failed segment's row is zeros.
    pub fn forward_batch(&self, path: Path<'_>, segments: &mut [Segment<'_, '_>], s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        for seg in segments.iter_mut() {
            seg.error = self.admit(seg).err();
        }
        // `[segments]` first row of each segment in the batch (live ones have rows).
        let mut first = Vec::with_capacity(segments.len());
        let mut rows = 0;
        for seg in segments.iter() {
            first.push(rows);
            rows += if seg.error.is_none() { seg.tokens.len() } else { 0 };
        }
        s.logits.clear();
        if rows == 0 {
            s.logits.resize(segments.len() * c.vocab, 0.0);
            return Ok(());
        }
        s.x.resize(rows * c.n_embd, 0.0);
        let live = segments.iter().filter(|seg| seg.error.is_none());
        for (t, row) in live.flat_map(|seg| seg.tokens).zip(s.x.chunks_exact_mut(c.n_embd)) {
            self.embed.dequantize_row(*t as usize, row);
            if c.arch == Arch::Gemma3 {
                let scale = (c.n_embd as f32).sqrt();
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        for (i, layer) in self.layers.iter().enumerate() {
            self.attention_block(path, i, layer, segments, &first, s)?;
            self.ffn_block(path, layer, s)?;
        }
        // `[segments, n_embd]` normalised last row of each segment
        let mut last = vec![0.0; segments.len() * c.n_embd];
        for ((seg, at), out) in segments.iter_mut().zip(&first).zip(last.chunks_exact_mut(c.n_embd)) {
            if seg.error.is_none() {
                seg.kv.commit();
                let row = (at + seg.tokens.len() - 1) * c.n_embd;
                ops::rms_norm(&s.x[row..row + c.n_embd], &self.norm, c.rms_eps, out);
            }
        }
        path.project(&[self.head()], &last, c.n_embd, &mut s.acts, &mut s.logits)?;
        if let Some(cap) = c.logit_softcap {
            s.logits.iter_mut().for_each(|v| *v = cap * (*v / cap).tanh());
        }
        for (seg, logits) in segments.iter().zip(s.logits.chunks_exact_mut(c.vocab)) {
            if seg.error.is_some() {
                logits.fill(0.0);
            }
        }
        Ok(())
    }

    /// Checks a segment's tokens and reserves their KV positions.
    pub(crate) fn admit(&self, seg: &mut Segment<'_, '_>) -> Result<()> {
        let c = &self.config;
        let start = seg.kv.len();
        if seg.tokens.is_empty() || start + seg.tokens.len() > seg.kv.capacity() {
            return Err(Error::ContextOverflow { prompt_tokens: start + seg.tokens.len(), limit: seg.kv.capacity() });
        }
        if let Some(bad) = seg.tokens.iter().find(|t| **t as usize >= c.vocab) {
            return Err(Error::InvalidRequest {
                reason: format!("token id {bad} is outside the vocabulary of {}", c.vocab),
            });
        }
        seg.kv.reserve(seg.tokens)
    }

    /// `x += Wo · attention(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))` for every segment,
    /// caching K and V; `first[i]` is segment i's first row.
    fn attention_block(
        &self,
        path: Path<'_>,
        li: usize,
        l: &Layer,
        segments: &mut [Segment<'_, '_>],
        first: &[usize],
        s: &mut Scratch,
    ) -> Result<()> {
        let c = &self.config;
        let n = s.x.len() / c.n_embd;
        norm_rows(&s.x, &l.attn_norm, c.rms_eps, c.n_embd, &mut s.xn);
        path.project(&[&l.wq, &l.wk, &l.wv], &s.xn, c.n_embd, &mut s.acts, &mut s.qkv)?;
        let (qd, kd) = (c.q_dim(), c.kv_dim());
        if l.bq.is_some() || l.bk.is_some() || l.bv.is_some() {
            for row in s.qkv.chunks_exact_mut(qd + 2 * kd) {
                let (q, rest) = row.split_at_mut(qd);
                let (k, v) = rest.split_at_mut(kd);
                for (x, b) in [(q, &l.bq), (k, &l.bk), (v, &l.bv)] {
                    if let Some(b) = b {
                        x.iter_mut().zip(b).for_each(|(x, b)| *x += b);
                    }
                }
            }
        }
        s.attn.resize(n * qd, 0.0);
        for (seg, &at) in segments.iter_mut().zip(first) {
            if seg.error.is_some() {
                continue;
            }
            let rows = at..at + seg.tokens.len();
            let qkv = &mut s.qkv[rows.start * (qd + 2 * kd)..rows.end * (qd + 2 * kd)];
            let attn = &mut s.attn[rows.start * qd..rows.end * qd];
            if let Err(e) = self.attend_segment(path.cpu, li, l, seg.kv, qkv, &mut s.rope, &mut s.scores, attn) {
                // Fail closed: this sequence's rows carry nothing read from the cache.
                attn.fill(0.0);
                seg.error = Some(e);
            }
        }
        path.project(&[&l.wo], &s.attn, qd, &mut s.acts, &mut s.proj)?;
        if let Some(bo) = &l.bo {
            for row in s.proj.chunks_exact_mut(c.n_embd) {
                row.iter_mut().zip(bo).for_each(|(x, b)| *x += b);
            }
        }
        if let Some(w) = &l.post_attn_norm {
            norm_in_place(&mut s.proj, w, c.rms_eps, c.n_embd);
        }
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        Ok(())
    }

    /// Per-head norms, RoPE, the cache write and checked attention of one segment's rows
    /// (`qkv`: `[tokens, q_dim + 2 * kv_dim]`, `out`: `[tokens, q_dim]`).
    #[allow(clippy::too_many_arguments)]
    fn attend_segment(
        &self,
        cpu: &Cpu,
        li: usize,
        l: &Layer,
        kv: &mut SequenceKv<'_>,
        qkv: &mut [f32],
        rope: &mut Vec<(f32, f32)>,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let (qd, kd) = (c.q_dim(), c.kv_dim());
        let start = kv.len();
        for (t, row) in qkv.chunks_exact_mut(qd + 2 * kd).enumerate() {
            let (base, scale) = c.rope_of(li);
            ops::rope_table(start + t, c.rope_dims, base, scale, self.rope_freqs.as_deref(), rope);
            let (q, rest) = row.split_at_mut(qd);
            let (k, v) = rest.split_at_mut(kd);
            for (x, norm) in [(&mut *q, &l.q_norm), (&mut *k, &l.k_norm)] {
                if let Some(w) = norm {
                    norm_in_place(x, w, c.rms_eps, c.head_dim);
                }
                match c.arch.rope_pairs() {
                    RopePairs::Adjacent => rope_heads(x, c.head_dim, rope),
                    RopePairs::Halves => ops::rope_halves(x, c.head_dim, rope),
                }
            }
            kv.write(li, start + t, k, v)?;
        }
        // Owner and bounds are checked here, once per block of this layer.
        let view = kv.layer(li, start + out.len() / qd)?;
        self.attend(cpu, start, &view, c.window_of(li), qkv, scores, out);
        Ok(())
    }

    /// `x += n'(W_down · (act(W_gate · n(x)) * (W_up · n(x))))`: SiLU or GELU by the
    /// architecture's [`Gate`], `n'` only where the model has a post-feed-forward norm.
    fn ffn_block(&self, path: Path<'_>, l: &Layer, s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        let n = s.x.len() / c.n_embd;
        norm_rows(&s.x, &l.ffn_norm, c.rms_eps, c.n_embd, &mut s.xn);
        s.proj.resize(n * c.n_embd, 0.0);
        let swiglu = c.arch.gate() == Gate::Silu;
        let quantized = !path.reference && l.down.takes_quantized() && swiglu;
        let mut fused = false;
        if quantized && n > 1 && l.gate.takes_quantized() && l.up.takes_quantized() {
            // A batch's products, SwiGLU and its quantization in one parallel job (one
            // token measured slower so: each task reads two streams of weights).
            s.acts.set_quantized(&path.cpu.pool, &s.xn, c.n_embd);
            fused = path.cpu.matmul_swiglu(&l.gate, &l.up, &s.acts, &mut s.hidden)?;
            if fused {
                path.cpu.matmul(&[&l.down], &s.hidden, &mut s.proj)?;
            }
        }
        if fused {
            // The down product is done.
        } else if quantized && c.n_ff.is_multiple_of(32) {
            path.project(&[&l.gate, &l.up], &s.xn, c.n_embd, &mut s.acts, &mut s.gu)?;
            // The hidden activations are read only quantized: SwiGLU goes straight into
            // the down product's blocks, with no f32 pass in between.
            s.acts.set_swiglu(&path.cpu.pool, &s.gu, c.n_ff);
            path.cpu.matmul(&[&l.down], &s.acts, &mut s.proj)?;
        } else {
            path.project(&[&l.gate, &l.up], &s.xn, c.n_embd, &mut s.acts, &mut s.gu)?;
            s.h.resize(n * c.n_ff, 0.0);
            let gu = &s.gu;
            let ff = c.n_ff;
            path.cpu.pool.par_tiles(&mut s.h, ff, 16, ff, &|rows, _, tile| {
                for t in rows {
                    let out = tile.row(t);
                    out.copy_from_slice(&gu[t * 2 * ff..t * 2 * ff + ff]);
                    let up = &gu[t * 2 * ff + ff..(t + 1) * 2 * ff];
                    if swiglu {
                        ops::swiglu(out, up);
                    } else {
                        ops::geglu(out, up);
                    }
                }
            });
            path.project(&[&l.down], &s.h, c.n_ff, &mut s.acts, &mut s.proj)?;
        }
        if let Some(w) = &l.post_ffn_norm {
            norm_in_place(&mut s.proj, w, c.rms_eps, c.n_embd);
        }
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        Ok(())
    }

    /// Causal grouped-query attention of the batch's queries over cache positions
    /// `0..=start + t`, one task per (KV head, block of queries): the query heads that
    /// share a KV head read its keys and values together. `out` is `[tokens, q_dim]`.
    /// Block by block: scores against the head's f16 keys, softmax, then the probability-
    /// weighted f16 values, all read through the checked view.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        cpu: &Cpu,
        start: usize,
        kv: &LayerKv<'_>,
        window: Option<usize>,
        qkv: &[f32],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, qd, kd) = (c.head_dim, c.q_dim(), c.kv_dim());
        // One thread gains nothing from the split.
        if out.len() == qd && cpu.pool.threads() > 1 {
            return self.attend_one(cpu, start, kv, window, &qkv[..qd], scores, out);
        }
        let (group, bt) = (c.n_head / c.n_head_kv, kv.block_tokens());
        let scale = 1.0 / (hd as f32).sqrt();
        let kv_ahead = cpu.prefetches_kv();
        cpu.pool.par_tiles(out, qd, ATTENTION_TOKEN_STEP, group * hd, &|rows, cols, tile| {
            let kvh = cols.start / (group * hd);
            // `[blocks]` this KV head's part of every block the tile's last query sees.
            let blocks: Vec<Option<HeadBlock<'_>>> =
                (0..(start + rows.end).div_ceil(bt)).map(|i| kv.head_block(i, kvh)).collect();
            let mut q = vec![0.0f32; cols.len()];
            // `[group, row]`: each query head's scores, then its probabilities.
            let row_len = (start + rows.end).next_multiple_of(bt);
            let mut scores = vec![0.0f32; group * row_len];
            for t in rows {
                let row = &qkv[t * (qd + 2 * kd)..];
                q.copy_from_slice(&row[cols.clone()]);
                // The reference multiplies f16 K with Q converted to f16.
                ops::round_to_f16(&mut q);
                let visible = start + t + 1;
                // Whole vectors of positions where the block holds them: the ones past
                // `visible` are this sequence's own later tokens of the batch (read through
                // the same checked view), scored and then left out of the softmax.
                let scored = visible.next_multiple_of(attention::LANES);
                for (i, block) in blocks.iter().enumerate().take(scored.div_ceil(bt)) {
                    let (at, n) = (i * bt, (scored - i * bt).min(bt));
                    if let (true, Some(Some(b))) = (kv_ahead, blocks.get(i + KV_PREFETCH_BLOCKS)) {
                        attention::prefetch_l2(b.keys);
                    }
                    match block {
                        Some(b) => attention::group_key_scores(
                            &q,
                            hd,
                            b.keys,
                            b.key_stride,
                            scale,
                            &mut scores[at..],
                            row_len,
                            n.min(b.positions),
                        ),
                        None => scores.chunks_mut(row_len).for_each(|s| s[at..at + n].fill(f32::NEG_INFINITY)),
                    }
                }
                for probs in scores.chunks_mut(row_len) {
                    outside_window(window, visible, probs);
                    attention::softmax_f16(&mut probs[..visible]);
                }
                let o = tile.row(t);
                o.fill(0.0);
                for (i, block) in blocks.iter().enumerate().take(visible.div_ceil(bt)) {
                    if let (true, Some(Some(b))) = (kv_ahead, blocks.get(i + KV_PREFETCH_BLOCKS)) {
                        attention::prefetch_l2(b.values);
                    }
                    if let Some(b) = block {
                        let (at, n) = (i * bt, (visible - i * bt).min(bt));
                        attention::group_accumulate_values(&scores[at..], row_len, n, b.values, b.value_stride, o, hd);
                    }
                }
            }
        });
    }

    /// [`Llama::attend`] for a single query (a decode step), with the same arithmetic
    /// split so that several threads share the scores evenly: one task per KV head would
    /// give two threads the default model's three heads 2:1. Each score depends on one
    /// position alone, so score tasks take (KV head, run of blocks); then one task per KV
    /// head takes the softmax and the value sums. (Splitting the value sums by dimensions
    /// too was measured slower: the two halves of a value row share cache-line pairs.)
    /// `scores` is scratch, reused across layers and steps.
    #[allow(clippy::too_many_arguments)]
    fn attend_one(
        &self,
        cpu: &Cpu,
        start: usize,
        kv: &LayerKv<'_>,
        window: Option<usize>,
        query: &[f32],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let c = &self.config;
        let (hd, group, bt) = (c.head_dim, c.n_head / c.n_head_kv, kv.block_tokens());
        let scale = 1.0 / (hd as f32).sqrt();
        let kv_ahead = cpu.prefetches_kv();
        let visible = start + 1;
        let blocks = visible.div_ceil(bt);
        let mut q = query.to_vec();
        // The reference multiplies f16 K with Q converted to f16.
        ops::round_to_f16(&mut q);
        // `[n_head, blocks * bt]`: every query head's scores, filled in runs of blocks.
        let row_len = blocks * bt;
        // Cleared although the tiles below cover it: no score of an earlier step (of
        // another tenant, maybe) is ever left in it.
        scores.clear();
        scores.resize(c.n_head * row_len, 0.0);
        cpu.pool.par_tiles(scores, row_len, group, SCORE_TASK_BLOCKS * bt, &|heads, cols, tile| {
            let (kvh, width) = (heads.start / group, cols.len());
            SCORE_RUN.with_borrow_mut(|run| {
                // Zeroed, not only resized: nothing of an earlier task is left in it.
                run.clear();
                run.resize(group * width, 0.0);
                for (j, i) in (cols.start / bt..cols.end / bt).enumerate() {
                    let (at, n) = (j * bt, (visible - i * bt).min(bt));
                    if let Some(b) = kv_ahead.then(|| kv.head_block(i + KV_PREFETCH_BLOCKS, kvh)).flatten() {
                        attention::prefetch_l2(b.keys);
                    }
                    match kv.head_block(i, kvh) {
                        Some(b) => attention::group_key_scores(
                            &q[heads.start * hd..heads.end * hd],
                            hd,
                            b.keys,
                            b.key_stride,
                            scale,
                            &mut run[at..],
                            width,
                            n.min(b.positions),
                        ),
                        None => run.chunks_mut(width).for_each(|s| s[at..at + n].fill(f32::NEG_INFINITY)),
                    }
                }
                for (h, part) in heads.zip(run.chunks_exact(width)) {
                    tile.row(h).copy_from_slice(part);
                }
            });
        });
        let qd = out.len();
        cpu.pool.par_tiles(out, qd, 1, group * hd, &|_, cols, tile| {
            let kvh = cols.start / (group * hd);
            HEAD_PROBS.with_borrow_mut(|probs| {
                probs.clear();
                probs.extend_from_slice(&scores[kvh * group * row_len..(kvh + 1) * group * row_len]);
                for p in probs.chunks_exact_mut(row_len) {
                    outside_window(window, visible, p);
                    attention::softmax_f16(&mut p[..visible]);
                }
                let o = tile.row(0);
                o.fill(0.0);
                for i in 0..blocks {
                    if let Some(b) = kv_ahead.then(|| kv.head_block(i + KV_PREFETCH_BLOCKS, kvh)).flatten() {
                        attention::prefetch_l2(b.values);
                    }
                    if let Some(b) = kv.head_block(i, kvh) {
                        let (at, n) = (i * bt, (visible - i * bt).min(bt));
                        attention::group_accumulate_values(&probs[at..], row_len, n, b.values, b.value_stride, o, hd);
                    }
                }
            });
        });
    }
}

/// Leaves out of the softmax the positions a sliding window of `window` positions ending
/// at the query (the `visible`-th position) does not see.
fn outside_window(window: Option<usize>, visible: usize, scores: &mut [f32]) {
    if let Some(w) = window {
        let first = visible.saturating_sub(w).min(scores.len());
        scores[..first].fill(f32::NEG_INFINITY);
    }
}

/// RMSNorm of every `[width]` row of `x` into `out`, in place when `out` is `None`.
fn norm_in_place(x: &mut [f32], weight: &[f32], eps: f32, width: usize) {
    let mut row = vec![0.0f32; width];
    for r in x.chunks_exact_mut(width) {
        row.copy_from_slice(r);
        ops::rms_norm(&row, weight, eps, r);
    }
}

/// RMSNorm of every `[width]` row of `x` into `out`.
fn norm_rows(x: &[f32], weight: &[f32], eps: f32, width: usize, out: &mut Vec<f32>) {
    out.resize(x.len(), 0.0);
    for (row, o) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        ops::rms_norm(row, weight, eps, o);
    }
}

/// RoPE on the leading `2 * table.len()` dimensions of each head of `x`.
fn rope_heads(x: &mut [f32], head_dim: usize, table: &[(f32, f32)]) {
    for head in x.chunks_exact_mut(head_dim) {
        ops::rope(&mut head[..2 * table.len()], 2 * table.len(), table);
    }
}
