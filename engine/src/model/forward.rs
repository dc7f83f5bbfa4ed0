//! The Llama forward pass over a batch of consecutive tokens of one sequence.
//!
//! Owns the order of operations of a layer — RMSNorm, Q/K/V projections, RoPE, grouped-
//! query attention over the KV cache, output projection, RMSNorm, SwiGLU feed-forward,
//! residual adds — following llama.cpp's LLM_ARCH_LLAMA graph, so that greedy decoding
//! agrees with it token for token. Prefill runs the whole prompt as one batch (matrix-
//! matrix products); decode is the same code with one token.
//!
//! Two paths share everything but the matrix products: `Path::fast` (quantized
//! activations, SIMD, threads) and `Path::reference` (every weight row dequantized to f32
//! and multiplied naively), which tests use as the plain ground truth.

use crate::backend::cpu::{matmul_reference, ops, Activations, Cpu, Matrix};
use crate::error::{Error, Result};
use crate::kv::{LayerKv, SequenceKv};

use super::{Layer, Llama};

/// Query positions per attention task: enough tasks to balance, few enough to be cheap.
const ATTENTION_TOKEN_STEP: usize = 16;

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
    fn project(&self, ws: &[&Matrix], input: &[f32], cols: usize, acts: &mut Activations, out: &mut Vec<f32>) -> Result<()> {
        let tokens = input.len() / cols.max(1);
        let total: usize = ws.iter().map(|w| w.rows).sum();
        out.resize(tokens * total, 0.0);
        if !self.reference {
            acts.set(input, cols);
            return self.cpu.matmul(ws, acts, out);
        }
        let mut offset = 0;
        let mut part = Vec::new();
        for w in ws {
            part.resize(tokens * w.rows, 0.0);
            matmul_reference(w, input, &mut part);
            for t in 0..tokens {
                out[t * total + offset..t * total + offset + w.rows].copy_from_slice(&part[t * w.rows..(t + 1) * w.rows]);
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
    acts: Activations,
    /// `[rope_dims / 2]` (cos, sin)
    rope: Vec<(f32, f32)>,
    /// `[vocab]` logits of the batch's last token
    pub logits: Vec<f32>,
}

impl Llama {
    /// Runs `tokens` at positions `kv.len()..` through the model, appends their keys and
    /// values to `kv`, and leaves the last token's logits in `scratch.logits`. An
    /// isolation violation of the KV cache stops the pass with its error.
    pub fn forward(&self, path: Path<'_>, tokens: &[u32], kv: &mut SequenceKv<'_>, s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        let start = kv.len();
        if tokens.is_empty() || start + tokens.len() > kv.capacity() {
            return Err(Error::ContextOverflow { prompt_tokens: start + tokens.len(), limit: kv.capacity() });
        }
        if let Some(bad) = tokens.iter().find(|t| **t as usize >= c.vocab) {
            return Err(Error::InvalidRequest { reason: format!("token id {bad} is outside the vocabulary of {}", c.vocab) });
        }
        kv.reserve(tokens)?;
        s.x.resize(tokens.len() * c.n_embd, 0.0);
        for (t, row) in tokens.iter().zip(s.x.chunks_exact_mut(c.n_embd)) {
            self.embed.dequantize_row(*t as usize, row);
        }
        for (i, layer) in self.layers.iter().enumerate() {
            self.attention_block(path, i, layer, start, kv, s)?;
            self.ffn_block(path, layer, s)?;
        }
        kv.commit();
        let last = &s.x[(tokens.len() - 1) * c.n_embd..];
        s.xn.resize(c.n_embd, 0.0);
        ops::rms_norm(last, &self.norm, c.rms_eps, &mut s.xn);
        path.project(&[self.head()], &s.xn, c.n_embd, &mut s.acts, &mut s.logits)
    }

    /// `x += Wo · attention(rope(Wq·n(x)), rope(Wk·n(x)), Wv·n(x))`, caching K and V.
    fn attention_block(&self, path: Path<'_>, li: usize, l: &Layer, start: usize, kv: &mut SequenceKv<'_>, s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        let n = s.x.len() / c.n_embd;
        norm_rows(&s.x, &l.attn_norm, c.rms_eps, c.n_embd, &mut s.xn);
        path.project(&[&l.wq, &l.wk, &l.wv], &s.xn, c.n_embd, &mut s.acts, &mut s.qkv)?;
        let (qd, kd) = (c.q_dim(), c.kv_dim());
        for (t, row) in s.qkv.chunks_exact_mut(qd + 2 * kd).enumerate() {
            ops::rope_table(start + t, c.rope_dims, c.rope_base, &mut s.rope);
            let (q, rest) = row.split_at_mut(qd);
            let (k, v) = rest.split_at_mut(kd);
            rope_heads(q, c.head_dim, &s.rope);
            rope_heads(k, c.head_dim, &s.rope);
            kv.write(li, start + t, k, v)?;
        }
        // Owner and bounds are checked here, once per block of this layer.
        let view = kv.layer(li, start + n)?;
        s.attn.resize(n * qd, 0.0);
        self.attend(path.cpu, start, &view, &s.qkv, &mut s.attn);
        drop(view);
        path.project(&[&l.wo], &s.attn, qd, &mut s.acts, &mut s.proj)?;
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        Ok(())
    }

    /// `x += W_down · (silu(W_gate · n(x)) * (W_up · n(x)))`.
    fn ffn_block(&self, path: Path<'_>, l: &Layer, s: &mut Scratch) -> Result<()> {
        let c = &self.config;
        let n = s.x.len() / c.n_embd;
        norm_rows(&s.x, &l.ffn_norm, c.rms_eps, c.n_embd, &mut s.xn);
        path.project(&[&l.gate, &l.up], &s.xn, c.n_embd, &mut s.acts, &mut s.gu)?;
        s.h.resize(n * c.n_ff, 0.0);
        let gu = &s.gu;
        let ff = c.n_ff;
        path.cpu.pool.par_tiles(&mut s.h, ff, 16, ff, &|rows, _, tile| {
            for t in rows {
                let out = tile.row(t);
                out.copy_from_slice(&gu[t * 2 * ff..t * 2 * ff + ff]);
                ops::swiglu(out, &gu[t * 2 * ff + ff..(t + 1) * 2 * ff]);
            }
        });
        path.project(&[&l.down], &s.h, c.n_ff, &mut s.acts, &mut s.proj)?;
        s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        Ok(())
    }

    /// Causal grouped-query attention of the batch's queries over cache positions
    /// `0..=start + t`, one task per (head, block of queries). `out` is `[tokens, q_dim]`.
    fn attend(&self, cpu: &Cpu, start: usize, kv: &LayerKv<'_>, qkv: &[f32], out: &mut [f32]) {
        let c = &self.config;
        let (hd, qd, kd) = (c.head_dim, c.q_dim(), c.kv_dim());
        let group = c.n_head / c.n_head_kv;
        let scale = 1.0 / (hd as f32).sqrt();
        cpu.pool.par_tiles(out, qd, ATTENTION_TOKEN_STEP, hd, &|rows, cols, tile| {
            let head = cols.start / hd;
            let kvh = head / group;
            let mut q = vec![0.0f32; hd];
            let mut scores = Vec::with_capacity(start + rows.end);
            for t in rows {
                let row = &qkv[t * (qd + 2 * kd)..];
                q.copy_from_slice(&row[head * hd..(head + 1) * hd]);
                // The reference multiplies f16 K with Q converted to f16.
                ops::round_to_f16(&mut q);
                let visible = start + t + 1;
                scores.clear();
                scores.extend((0..visible).map(|p| ops::dot(&q, head_of(kv.key(p), kvh, hd)) * scale));
                ops::softmax(&mut scores);
                ops::round_to_f16(&mut scores);
                let o = tile.row(t);
                o.fill(0.0);
                for (p, w) in scores.iter().enumerate() {
                    ops::axpy(*w, head_of(kv.value(p), kvh, hd), o);
                }
            }
        });
    }
}

/// KV head `kvh` (`[head_dim]`) of a cache row (`[kv_dim]`); empty if out of range.
fn head_of(row: &[f32], kvh: usize, head_dim: usize) -> &[f32] {
    row.get(kvh * head_dim..(kvh + 1) * head_dim).unwrap_or(&[])
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
