//! The CPU backend: quantized matrix products on a persistent thread pool.
//!
//! Owns: weight matrices ([`Matrix`]: quantized formats repacked at load into the
//! interleaved layout of `packed.rs`, a model's all in one mapping in huge pages
//! (`weight_arena.rs`); float formats kept as rows), quantized activations
//! ([`Activations`]), and the parallel products between them ([`Cpu::matmul`]). One code
//! path serves decode (one token: matrix-vector) and batched prefill (many tokens:
//! matrix-matrix tiles that unpack each weight step once for up to four tokens).
//! [`matmul_reference`] is the plain f32 path the fast one is tested against.
//!
//! Files: `matrix.rs` (weights: shape checks, packing at load), `activations.rs` (token rows
//! quantized for the products), `kernels.rs` (which SIMD family runs), this file (the
//! products, split into tasks over the pool); the layouts and kernels themselves in
//! `packed.rs`, `kquant.rs`, `quant.rs`, `avx2.rs`, `avx512.rs`; attention and the
//! elementwise operations in `attention.rs`, `ops.rs`, `ops_simd.rs`.
//!
//! Invariants: a `Matrix` holds exactly `rows` rows of `cols` elements in `format`;
//! activations are quantized with the reference's `q8_1` rule, once per product, before
//! integer products; SIMD kernels run only when detected at run time ([`Kernels`]), and
//! each is tested against the portable one, itself tested against the ggml reference.

mod activations;
pub mod attention;
mod avx2;
mod avx512;
mod kernels;
pub mod kquant;
mod matrix;
pub mod ops;
mod ops_simd;
pub mod packed;
pub mod pool;
pub mod quant;
mod weight_arena;

pub use activations::Activations;
pub use kernels::Kernels;
pub use matrix::{Matrix, MatrixSource};

use kernels::last_level_cache_bytes;
use matrix::Storage;
pub use pool::ThreadPool;
pub use quant::{Format, Q8Block, QK};

use std::ops::Range;

use crate::error::{Error, Result};
use packed::{ActRows, GROUP};

/// Activation rows one kernel call multiplies against a group of weight rows.
const TILE: usize = packed::MAX_TILE;

/// Tokens per prefill task: the task's weight groups stay in L1 across them.
const PREFILL_TOKEN_STEP: usize = 32;

/// Row tasks per thread and product: enough to balance a busy core, few enough that
/// claiming them (a cache line passed between cores) and the uneven last ones cost
/// little. Per-token alternation at 2 threads against 8: 1.022-1.037 on a Zen 4, 1.006
/// and 1.020 on a Zen 3 (2 tasks: 1.025-1.034 on the Zen 4; 16 and 32 were slower).
const TASKS_PER_THREAD: usize = 4;

/// Tokens per task when a batch's activations are quantized in parallel (one token, as in
/// decode, stays on the caller).
const QUANTIZE_TOKEN_STEP: usize = 16;

/// The CPU backend: its thread pool and the kernel choice made at start-up.
#[derive(Debug)]
pub struct Cpu {
    pub pool: ThreadPool,
    kernels: Kernels,
    /// `kernels`' SIMD kernel, resolved once.
    simd: Option<packed::SimdKernel>,
    /// Whether `simd` is the variant that streams weights past the caches.
    streamed: bool,
    /// Whether attention prefetches KV blocks ahead (see [`Cpu::prefetches_kv`]).
    kv_ahead: bool,
}

impl Cpu {
    /// A backend with `threads` threads, using the fastest kernels the CPU has.
    pub fn new(threads: usize) -> Cpu {
        let kernels = Kernels::best();
        Cpu { pool: ThreadPool::new(threads), kernels, simd: kernels.simd(false), streamed: false, kv_ahead: false }
    }

    /// Same, but never using SIMD (for tests that compare the two).
    pub fn scalar(threads: usize) -> Cpu {
        Cpu { pool: ThreadPool::new(threads), kernels: Kernels::Portable, simd: None, streamed: false, kv_ahead: false }
    }

    /// A backend running `kernels`, or `None` if this CPU cannot.
    pub fn with_kernels(threads: usize, kernels: Kernels) -> Option<Cpu> {
        kernels.available().then(|| Cpu {
            pool: ThreadPool::new(threads),
            kernels,
            simd: kernels.simd(false),
            streamed: false,
            kv_ahead: false,
        })
    }

    /// Sets up the kernels for a model whose products read `weight_bytes` per token:
    /// weights that outgrow the last-level cache are streamed past it (see
    /// `avx2::kernel`), so that they do not evict what is read again (KV, activations).
    /// Per-token alternation on AMD EPYCs with a 32 MiB L3 and the 96.6 MB default
    /// model: decode +1-2 % at 1 thread and 0-2 % at 2 with AVX2 (Zen 3), +1 % and +2 %
    /// with AVX-512 (Zen 4).
    ///
    /// Weights that fit in the cache are read from it, and so is the KV cache: then
    /// attention prefetches KV blocks ahead into L2 (see [`Cpu::prefetches_kv`]).
    pub fn fit_weights(&mut self, weight_bytes: usize) {
        let llc = last_level_cache_bytes();
        self.streamed = llc.is_some_and(|llc| weight_bytes > llc);
        self.kv_ahead = llc.is_some_and(|llc| weight_bytes <= llc);
        self.simd = self.kernels.simd(self.streamed);
    }

    /// Whether attention asks for the KV blocks it reads next ahead of time. A last-level
    /// cache large enough to hold the model (a server's mesh L3) answers with a long
    /// latency: on a Xeon with 300 MiB of L3, prefetching two blocks ahead into L2 made
    /// per-token ABBA decode at 512-900 positions 1.07-1.09x faster at 1 thread and
    /// 1.02-1.05x at 2. On a Zen 4 with 32 MiB (weights streamed) the same prefetch was
    /// slower (0.967-0.991), so it stays off there.
    pub fn prefetches_kv(&self) -> bool {
        self.kv_ahead
    }

    /// Whether weights are streamed past the caches (see [`fit_weights`](Self::fit_weights)).
    pub fn streams_weights(&self) -> bool {
        self.streamed && self.simd.is_some()
    }

    /// Which kernels run: "avx512-vnni", "avx2" or "scalar".
    pub fn kernels(&self) -> &'static str {
        match self.kernels {
            Kernels::Avx512 => "avx512-vnni",
            Kernels::Avx2 => "avx2",
            Kernels::Portable => "scalar",
        }
    }

    /// `out[t, r] = Σ_c a[t, c] * w[r, c]` over the stacked matrices `ws` (their rows
    /// concatenated in order, all with `a.cols` columns) in one parallel step.
    /// `out` is `[tokens, Σ rows]`.
    pub fn matmul(&self, ws: &[&Matrix], a: &Activations, out: &mut [f32]) -> Result<()> {
        let total: usize = ws.iter().map(|w| w.rows).sum();
        if let Some(w) = ws.iter().find(|w| w.cols != a.cols) {
            return Err(Error::Shape {
                tensor: w.name.clone(),
                reason: format!("{} columns, activations have {}", w.cols, a.cols),
            });
        }
        if ws.iter().any(|w| !w.takes_quantized()) && a.x.len() != a.tokens() * a.cols {
            return Err(Error::Shape {
                tensor: "matmul activations".into(),
                reason: "a float matrix needs the f32 activations, which were not kept".into(),
            });
        }
        if out.len() != a.tokens() * total {
            return Err(Error::Shape {
                tensor: "matmul output".into(),
                reason: format!("{} values for {}x{total}", out.len(), a.tokens()),
            });
        }
        // Tasks: runs of whole row groups of one matrix (output column spans) by blocks
        // of tokens.
        let groups: usize = ws.iter().map(|w| w.groups()).sum();
        let per_task = groups.div_ceil(self.pool.threads() * TASKS_PER_THREAD).max(1);
        let (mut spans, mut firsts) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for (k, w) in ws.iter().enumerate() {
            for g in (0..w.groups()).step_by(per_task) {
                spans.push(offset + g * GROUP..offset + ((g + per_task) * GROUP).min(w.rows));
                firsts.push((k, g));
            }
            offset += w.rows;
        }
        let token_step = if a.tokens() > 1 { PREFILL_TOKEN_STEP } else { 1 };
        let ran = self.pool.par_spans(out, total, token_step, &spans, &|tokens, i, tile| {
            let (k, g) = firsts[i];
            self.span_times_tokens(ws[k], g, spans[i].len(), a, tokens, tile);
        });
        if ran {
            Ok(())
        } else {
            Err(Error::Shape { tensor: "matmul output".into(), reason: "column spans out of order".into() })
        }
    }

    /// `out = silu(gate · a) * (up · a)`, quantized for the down product: the feed-
    /// forward's two products, SwiGLU and the quantization of its output in one parallel
    /// job, each task taking whole 32-row blocks of both matrices, so that a batch's
    /// SwiGLU runs on every thread and its sums are quantized while still in cache
    /// (prefill +5-10 % by per-batch alternation; a single token measured 2-3 % slower,
    /// each task then reading two streams of weights, so decode keeps the stacked
    /// product). Bit for bit what `matmul(&[gate, up])` then
    /// [`Activations::set_swiglu`] give: the same kernel calls, then the same operations
    /// per block. `Ok(false)`, computing nothing, unless both matrices are quantized with
    /// the same shape in whole blocks of rows; a shape that does not fit `a` is an error.
    pub fn matmul_swiglu(&self, gate: &Matrix, up: &Matrix, a: &Activations, out: &mut Activations) -> Result<bool> {
        if let Some(w) = [gate, up].into_iter().find(|w| w.cols != a.cols) {
            return Err(Error::Shape {
                tensor: w.name.clone(),
                reason: format!("{} columns, activations have {}", w.cols, a.cols),
            });
        }
        let (Storage::Packed(pg), Storage::Packed(pu)) = (&gate.storage, &up.storage) else { return Ok(false) };
        if gate.rows != up.rows || !gate.rows.is_multiple_of(QK) {
            return Ok(false);
        }
        let (tokens, blocks) = (a.tokens(), gate.rows / QK);
        out.cols = gate.rows;
        out.tokens = tokens;
        out.x.clear();
        out.q8.resize(tokens * blocks, Q8Block::default());
        // As `matmul`: runs of whole blocks (two groups of each matrix) by blocks of tokens.
        let per_task = blocks.div_ceil(self.pool.threads() * TASKS_PER_THREAD).max(1);
        let spans: Vec<Range<usize>> = (0..blocks).step_by(per_task).map(|b| b..(b + per_task).min(blocks)).collect();
        let token_step = if tokens > 1 { PREFILL_TOKEN_STEP } else { 1 };
        let ran = self.pool.par_spans(&mut out.q8, blocks, token_step, &spans, &|tokens, i, tile| {
            let span = spans[i].clone();
            token_tiles(a, tokens, |first, tiles| {
                // Tokens of the chunk, counted from its first.
                let width = tiles.iter().flatten().map(|(t, rows)| t + rows.rows().len() - first).max().unwrap_or(0);
                FUSED_SUMS.with_borrow_mut(|sums| {
                    for chunk in span.clone().step_by(FUSED_BLOCKS) {
                        let chunk = chunk..(chunk + FUSED_BLOCKS).min(span.end);
                        let rows_of = chunk.len() * QK;
                        // `[gate, up][token of the chunk][row of the blocks]`: each matrix's
                        // groups are read in order (the kernels' prefetch runs ahead into
                        // the next), each while it is in L1 for every tile of tokens. Every
                        // sum read below is written first: no clearing needed.
                        sums.resize(sums.len().max(2 * width * rows_of), 0.0);
                        let (gates, ups) = sums[..2 * width * rows_of].split_at_mut(width * rows_of);
                        for (p, out) in [(pg, &mut *gates), (pu, &mut *ups)] {
                            for (gi, g) in (2 * chunk.start..2 * chunk.end).enumerate() {
                                for (t, rows) in tiles.iter().flatten() {
                                    let mut part = [[0.0f32; GROUP]; TILE];
                                    self.dot_group(p.scheme, p.group(g), rows, &mut part);
                                    for (k, row) in part.iter().enumerate().take(rows.rows().len()) {
                                        let at = (t - first + k) * rows_of + gi * GROUP;
                                        out[at..at + GROUP].copy_from_slice(row);
                                    }
                                }
                            }
                        }
                        for (t, rows) in tiles.iter().flatten() {
                            for k in 0..rows.rows().len() {
                                let at = (t - first + k) * rows_of;
                                let (gate, up) = (&mut gates[at..at + rows_of], &ups[at..at + rows_of]);
                                for ((h, u), b) in gate.chunks_exact_mut(QK).zip(up.chunks_exact(QK)).zip(chunk.clone())
                                {
                                    ops::swiglu(h, u);
                                    if let Some(block) = tile.row(t + k).get_mut(b - span.start) {
                                        quant::quantize_q8(h, std::slice::from_mut(block));
                                    }
                                }
                            }
                        }
                    }
                });
            });
        });
        if ran {
            Ok(true)
        } else {
            Err(Error::Shape { tensor: "matmul output".into(), reason: "column spans out of order".into() })
        }
    }

    /// `out[n][lane] = row lane of `group` · acts[n]`, with the portable kernel when
    /// there is no SIMD one (or it declines).
    fn dot_group(&self, s: packed::Scheme, group: &[u8], acts: &ActRows<'_>, out: &mut [[f32; GROUP]; TILE]) {
        if !self.simd.is_some_and(|k| k.call_rows(s, group, acts, out)) {
            for (a, o) in acts.rows().iter().zip(out.iter_mut()) {
                packed::dot_group_scalar(s, group, a, o);
            }
        }
    }

    /// Writes rows `16 * first..16 * first + width` of `w` times every token of `tokens`
    /// into the tile (whose span is those rows).
    fn span_times_tokens(
        &self,
        w: &Matrix,
        first: usize,
        width: usize,
        a: &Activations,
        tokens: Range<usize>,
        tile: &mut pool::Tile<'_>,
    ) {
        let p = match &w.storage {
            Storage::Packed(p) => p,
            Storage::Rows { .. } => {
                for t in tokens {
                    for (j, o) in tile.row(t).iter_mut().enumerate() {
                        *o = quant::dot_float_scalar(w.format, w.float_row(first * GROUP + j), a.x_row(t));
                    }
                }
                return;
            }
        };
        token_tiles(a, tokens, |_, tiles| {
            for (gi, g) in (first..first + width.div_ceil(GROUP)).enumerate() {
                let lanes = (width - gi * GROUP).min(GROUP);
                for (t, rows) in tiles.iter().flatten() {
                    let mut sums = [[0.0f32; GROUP]; TILE];
                    self.dot_group(p.scheme, p.group(g), rows, &mut sums);
                    for (k, s) in sums.iter().enumerate().take(rows.rows().len()) {
                        if let Some(o) = tile.row(t + k).get_mut(gi * GROUP..gi * GROUP + lanes) {
                            o.copy_from_slice(&s[..lanes]);
                        }
                    }
                }
            }
        });
    }
}

/// Blocks of 32 rows of the gate and up products [`Cpu::matmul_swiglu`] holds at once
/// (32 KB of sums for a full prefill chunk of tokens).
const FUSED_BLOCKS: usize = 4;

thread_local! {
    /// [`Cpu::matmul_swiglu`]'s sums of a chunk, kept by each thread for its next tasks.
    static FUSED_SUMS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Token tiles a product task runs against each weight group while it is in L1.
const TILES: usize = PREFILL_TOKEN_STEP / TILE;

/// Calls `each(first token of the chunk, tiles)` for every chunk of up to `TILES * TILE`
/// of `tokens`; its tiles are (first token, its activation rows) of up to [`TILE`]
/// tokens, checked once for every group a task multiplies them with.
fn token_tiles<'a>(
    a: &'a Activations,
    tokens: Range<usize>,
    mut each: impl FnMut(usize, &[Option<(usize, ActRows<'a>)>; TILES]),
) {
    for chunk in tokens.clone().step_by(TILES * TILE) {
        let mut tiles: [Option<(usize, ActRows<'a>)>; TILES] = [None; TILES];
        for (slot, t) in tiles.iter_mut().zip((chunk..tokens.end).step_by(TILE)) {
            let rows: [&[Q8Block]; TILE] = std::array::from_fn(|k| a.q8_row(t + k));
            *slot = ActRows::new(&rows[..(tokens.end - t).min(TILE)]).map(|rows| (t, rows));
        }
        each(chunk, &tiles);
    }
}

/// The plain reference: dequantize each row to f32 and multiply with f32 activations
/// (no activation quantization). `x` is `[tokens, cols]`, `out` `[tokens, rows]`.
pub fn matmul_reference(w: &Matrix, x: &[f32], out: &mut [f32]) {
    let mut row = vec![0.0f32; w.cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row);
        for (t, xt) in x.chunks_exact(w.cols).enumerate() {
            out[t * w.rows + r] = row.iter().zip(xt).map(|(p, q)| p * q).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::packed::tests::{cols_for, magnitude, scale_rounding, TestResult};
    use super::quant::tests::wave;
    use super::*;

    fn ggml(format: Format, rows: usize, cols: usize) -> Vec<u8> {
        (0..rows).flat_map(|r| quant::quantize_row(format, &wave(cols, r as f32 * 0.3))).collect()
    }

    fn matrix(format: Format, rows: usize, cols: usize) -> Result<Matrix> {
        Matrix::new("w", format, rows, cols, ggml(format, rows, cols))
    }

    #[test]
    fn load_all_packs_a_large_matrix_band_by_band_as_one_and_releases_every_source_byte() -> TestResult {
        // Three bands, the last one ending inside a group.
        let rows = 2 * 64 * GROUP + 3 * GROUP + 5;
        for format in [Format::Q4_1, Format::Q8_0, Format::Q6_K] {
            let cols = cols_for(format, 64);
            let data = ggml(format, rows, cols);
            let released = std::cell::RefCell::new(Vec::new());
            let source = MatrixSource { name: "w".into(), format, rows, cols, ggml: &data };
            let banded = Matrix::load_all(&[source], |b: &[u8]| released.borrow_mut().push(b.as_ptr_range()))?;
            let (Storage::Packed(whole), [Matrix { storage: Storage::Packed(banded), .. }]) =
                (matrix(format, rows, cols)?.storage, &banded[..])
            else {
                return Err("not packed".into());
            };
            for g in 0..whole.groups() {
                assert_eq!(whole.group(g), banded.group(g), "{format:?} group {g}");
            }
            // Every byte of the source was handed back, band after band.
            let mut spans = released.into_inner();
            spans.sort_by_key(|r| r.start);
            let covered =
                spans.iter().try_fold(data.as_ptr_range().start, |at, r| (r.start <= at).then_some(r.end.max(at)));
            assert_eq!(covered, Some(data.as_ptr_range().end), "{format:?}");
        }
        Ok(())
    }

    #[test]
    fn the_fused_feed_forward_product_equals_the_stacked_product_then_swiglu() -> TestResult {
        // 37 blocks of rows: tasks of 10 blocks at one thread (chunks of 4, 4, 2) and 5 at
        // two (4, 1), so spans and chunks end unevenly; token counts around a kernel tile
        // and a prefill chunk.
        let (rows, cols) = (37 * QK, 64);
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            let gate = matrix(format, rows, cols)?;
            let up = Matrix::new("up", format, rows, cols, ggml(format, rows, cols).into_iter().rev().collect())?;
            for tokens in [1, 3, 4, 33, 70] {
                let x: Vec<f32> = wave(tokens * cols, tokens as f32);
                for cpu in [Kernels::Avx512, Kernels::Avx2, Kernels::Portable]
                    .iter()
                    .flat_map(|k| [1, 2].map(|t| Cpu::with_kernels(t, *k)))
                    .flatten()
                {
                    let mut a = Activations::default();
                    a.set_quantized(&cpu.pool, &x, cols);
                    let mut gu = vec![0.0; tokens * 2 * rows];
                    cpu.matmul(&[&gate, &up], &a, &mut gu)?;
                    let mut want = Activations::default();
                    want.set_swiglu(&cpu.pool, &gu, rows);
                    let mut got = Activations::default();
                    assert!(cpu.matmul_swiglu(&gate, &up, &a, &mut got)?);
                    let k = cpu.kernels();
                    assert_eq!(
                        (got.cols, got.tokens(), got.x.len()),
                        (rows, tokens, 0),
                        "{format:?} {k} tokens={tokens}"
                    );
                    for (i, (g, w)) in got.q8.iter().zip(&want.q8).enumerate() {
                        assert_eq!(
                            (g.d.to_bits(), g.s.to_bits(), g.isum, g.qs),
                            (w.d.to_bits(), w.s.to_bits(), w.isum, w.qs),
                            "{format:?} {k} tokens={tokens} block {i}"
                        );
                    }
                    assert_eq!(got.q8.len(), want.q8.len());
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_fused_product_declines_what_it_cannot_take_and_refuses_bad_shapes() -> TestResult {
        let cpu = Cpu::new(2);
        let mut a = Activations::default();
        a.set(&wave(2 * 64, 1.0), 64);
        let mut out = Activations::default();
        // Float matrices, and rows that are not whole blocks: not fused.
        assert!(!cpu.matmul_swiglu(&matrix(Format::F32, 64, 64)?, &matrix(Format::F32, 64, 64)?, &a, &mut out)?);
        assert!(!cpu.matmul_swiglu(&matrix(Format::Q4_1, 48, 64)?, &matrix(Format::Q4_1, 48, 64)?, &a, &mut out)?);
        assert!(!cpu.matmul_swiglu(&matrix(Format::Q4_1, 64, 64)?, &matrix(Format::Q4_1, 32, 64)?, &a, &mut out)?);
        // Columns that do not fit the activations: an error naming the matrix.
        let err = cpu.matmul_swiglu(&matrix(Format::Q4_1, 64, 96)?, &matrix(Format::Q4_1, 64, 96)?, &a, &mut out);
        assert!(matches!(err, Err(Error::Shape { ref tensor, .. }) if tensor == "w"), "{err:?}");
        Ok(())
    }

    #[test]
    fn every_kernel_family_agrees_with_the_ggml_rows_and_the_reference() -> TestResult {
        // 37 rows: a partial last group; 35 tokens: a partial token tile and kernel tile.
        let (rows, tokens) = (37, 35);
        let families = [Kernels::Avx512, Kernels::Avx2, Kernels::Portable];
        for f in Format::ALL {
            let cols = cols_for(f, 96);
            let x: Vec<f32> = wave(tokens * cols, 4.0);
            let mut a = Activations::default();
            a.set(&x, cols);
            let data = ggml(f, rows, cols);
            let w = Matrix::new("w", f, rows, cols, data.clone())?;
            let mut want = vec![0.0; tokens * rows];
            matmul_reference(&w, &x, &mut want);
            for cpu in families.iter().filter_map(|k| Cpu::with_kernels(2, *k)) {
                let mut got = vec![0.0; tokens * rows];
                cpu.matmul(&[&w], &a, &mut got)?;
                let row_bytes = f.row_bytes(cols).ok_or("row bytes")?;
                for t in 0..tokens {
                    for r in 0..rows {
                        let row = &data[r * row_bytes..(r + 1) * row_bytes];
                        let (exact, rounding) = if f.uses_q8() {
                            (
                                quant::dot_q8_scalar(f, row, a.q8_row(t)),
                                scale_rounding(f, magnitude(f, row, a.q8_row(t))),
                            )
                        } else {
                            (quant::dot_float_scalar(f, row, a.x_row(t)), 0.0)
                        };
                        let (g, i) = (got[t * rows + r], t * rows + r);
                        let k = cpu.kernels();
                        assert!(
                            (exact - g).abs() <= 1e-4 * exact.abs().max(1.0) + rounding,
                            "{f:?} {k} vs ggml rows at t={t} r={r}: {exact} vs {g}"
                        );
                        // Quantizing an activation moves it by at most half a step (amax / 254
                        // of its block) plus the f16 rounding of the step (< amax / 1024).
                        let mut wr = vec![0.0; cols];
                        w.dequantize_row(r, &mut wr);
                        let bound: f32 = wr
                            .chunks_exact(QK)
                            .zip(a.x_row(t).chunks_exact(QK))
                            .map(|(wb, xb)| {
                                wb.iter().map(|v| v.abs()).sum::<f32>() * xb.iter().fold(0.0f32, |m, v| m.max(v.abs()))
                            })
                            .sum::<f32>()
                            * (1.0 / 254.0 + 1.0 / 1024.0);
                        let err = (want[i] - g).abs();
                        assert!(err <= bound + 1e-4 + rounding, "{f:?} {k} vs reference at {i}: {err} > {bound}");
                    }
                }
            }
        }
        Ok(())
    }

    #[test]
    fn packed_storage_keeps_the_ggml_size_of_nibble_and_q8_formats() -> TestResult {
        for f in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            assert_eq!(Some(matrix(f, 32, 64)?.bytes()), f.row_bytes(64).map(|b| 32 * b), "{f:?}");
        }
        Ok(())
    }

    #[test]
    fn stacked_matrices_fill_consecutive_columns() -> TestResult {
        let (cols, tokens) = (64, 3);
        let (w1, w2) = (matrix(Format::Q4_1, 5, cols)?, matrix(Format::Q8_0, 9, cols)?);
        let mut a = Activations::default();
        a.set(&wave(tokens * cols, 1.0), cols);
        let cpu = Cpu::new(2);
        let mut both = vec![0.0; tokens * 14];
        cpu.matmul(&[&w1, &w2], &a, &mut both)?;
        let mut one = vec![0.0; tokens * 9];
        cpu.matmul(&[&w2], &a, &mut one)?;
        for t in 0..tokens {
            assert_eq!(&both[t * 14 + 5..t * 14 + 14], &one[t * 9..t * 9 + 9]);
        }
        Ok(())
    }

    #[test]
    fn quantized_only_activations_equal_the_kept_ones_in_any_batch() -> TestResult {
        // 35 tokens: two whole parallel steps and a partial one.
        let (cols, tokens) = (96, 35);
        let x = wave(tokens * cols, 2.0);
        let mut kept = Activations::default();
        kept.set(&x, cols);
        for threads in [1, 2] {
            let cpu = Cpu::new(threads);
            let mut quantized = Activations::default();
            quantized.set_quantized(&cpu.pool, &x, cols);
            assert_eq!((quantized.q8.as_slice(), quantized.tokens()), (kept.q8.as_slice(), tokens));
            assert!(quantized.x.is_empty());
            // A float matrix needs the f32 copy: an error, not a product of nothing.
            let w = matrix(Format::F16, 4, cols)?;
            assert!(cpu.matmul(&[&w], &quantized, &mut vec![0.0; tokens * 4]).is_err());
        }
        Ok(())
    }

    #[test]
    fn swiglu_into_blocks_equals_swiglu_then_quantizing() -> TestResult {
        let (cols, tokens) = (64, 35);
        // Gate values around zero and past the exponential's range on both sides.
        let gu: Vec<f32> = wave(tokens * 2 * cols, 3.0)
            .iter()
            .enumerate()
            .map(|(i, v)| if i % 29 == 0 { v * 200.0 } else { v * 4.0 })
            .collect();
        let mut h = Vec::new();
        for row in gu.chunks_exact(2 * cols) {
            let mut gate = row[..cols].to_vec();
            ops::swiglu(&mut gate, &row[cols..]);
            h.extend(gate);
        }
        let mut want = Activations::default();
        want.set(&h, cols);
        for threads in [1, 2] {
            let cpu = Cpu::new(threads);
            let mut got = Activations::default();
            got.set_swiglu(&cpu.pool, &gu, cols);
            assert_eq!((got.q8.as_slice(), got.tokens()), (want.q8.as_slice(), tokens), "{threads} threads");
        }
        // Rows of 40 values are not whole blocks: kept in f32, as `set` keeps them.
        let mut odd = Activations::default();
        odd.set_swiglu(&Cpu::new(2).pool, &gu[..3 * 80], 40);
        let mut h = Vec::new();
        for row in gu[..3 * 80].chunks_exact(80) {
            let mut gate = row[..40].to_vec();
            ops::swiglu(&mut gate, &row[40..]);
            h.extend(gate);
        }
        assert_eq!((odd.x.as_slice(), odd.tokens()), (h.as_slice(), 3));
        Ok(())
    }

    #[test]
    fn a_k_quant_scale_past_the_f16_range_is_refused_at_load() -> TestResult {
        let mut row = quant::quantize_row(Format::Q4_K, &wave(256, 0.0));
        assert!(Matrix::new("w", Format::Q4_K, 1, 256, row.clone()).is_ok());
        // d = 30000: a 6-bit scale of 63 makes 1.9e6, which no f16 holds.
        row[..2].copy_from_slice(&half::f16::from_f32(30000.0).to_le_bytes());
        let err = Matrix::new("w", Format::Q4_K, 1, 256, row);
        assert!(matches!(err, Err(Error::Shape { ref reason, .. }) if reason.contains("f16 range")), "{err:?}");
        Ok(())
    }

    #[test]
    fn shape_errors_are_reported() -> TestResult {
        assert!(Matrix::new("w", Format::Q4_1, 2, 33, vec![0; 40]).is_err());
        assert!(Matrix::new("w", Format::Q4_1, 2, 32, vec![0; 39]).is_err());
        let w = matrix(Format::Q4_1, 2, 32)?;
        let mut a = Activations::default();
        a.set(&[0.0; 64], 64);
        assert!(Cpu::new(1).matmul(&[&w], &a, &mut [0.0; 2]).is_err());
        Ok(())
    }
}
