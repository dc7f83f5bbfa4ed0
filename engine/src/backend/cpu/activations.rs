//! Activations: a batch of token rows in 8-bit blocks for the integer products (and in f32
//! where a float matrix reads them), quantized once per product.

use std::ops::Range;

use super::{ops, pool, quant, Q8Block, ThreadPool, QK, QUANTIZE_TOKEN_STEP};

/// Activations for a batch of tokens, in 8-bit blocks (for integer products) and, when a
/// float matrix will read them, in f32.
#[derive(Debug, Default, Clone)]
pub struct Activations {
    pub cols: usize,
    pub(super) tokens: usize,
    /// `[tokens, cols]`, or empty when only quantized products read these activations
    pub x: Vec<f32>,
    /// `[tokens, cols / 32]`
    pub q8: Vec<Q8Block>,
}

impl Activations {
    /// Loads `x` (`[tokens, cols]`) and quantizes it; reuses the buffers.
    pub fn set(&mut self, x: &[f32], cols: usize) {
        self.load(x, cols, None);
    }

    /// [`set`](Self::set) without the f32 copy, for products whose matrices are all
    /// quantized (a prompt's activations are megabytes: the copy is not free), with the
    /// pool's threads quantizing rows of a batch.
    pub fn set_quantized(&mut self, pool: &ThreadPool, x: &[f32], cols: usize) {
        self.load(x, cols, Some(pool));
    }

    /// Keeps the f32 copy when there is no `pool` (then quantizes on the caller).
    pub(super) fn load(&mut self, x: &[f32], cols: usize, pool: Option<&ThreadPool>) {
        self.cols = cols;
        self.tokens = x.len().checked_div(cols).unwrap_or(0);
        self.x.clear();
        self.q8.resize(self.tokens * cols / QK, Q8Block::default());
        if !cols.is_multiple_of(QK) {
            self.x.extend_from_slice(x);
            return;
        }
        let quantize = |rows: Range<usize>, tile: &mut pool::Tile<'_, Q8Block>| {
            for t in rows {
                quant::quantize_q8(&x[t * cols..(t + 1) * cols], tile.row(t));
            }
        };
        match pool {
            Some(pool) => pool.par_tiles(&mut self.q8, cols / QK, QUANTIZE_TOKEN_STEP, cols / QK, &|rows, _, tile| {
                quantize(rows, tile)
            }),
            None => {
                self.x.extend_from_slice(x);
                for (row, q) in x.chunks_exact(cols).zip(self.q8.chunks_exact_mut(cols / QK)) {
                    quant::quantize_q8(row, q);
                }
            }
        }
    }

    /// Quantizes `silu(gate) * up` of each `[2 * cols]` row of `gu` (gate, then up) block
    /// by block as it is made: the feed-forward's hidden activations without an f32 pass.
    /// The blocks equal [`ops::swiglu`] then [`set_quantized`](Self::set_quantized), bit
    /// for bit (both work element by element, then per block of 32). Rows that are not
    /// whole blocks (which no quantized matrix takes) are kept in f32 instead, as `set`
    /// would keep them.
    pub fn set_swiglu(&mut self, pool: &ThreadPool, gu: &[f32], cols: usize) {
        self.cols = cols;
        self.tokens = gu.len().checked_div(2 * cols).unwrap_or(0);
        self.x.clear();
        self.q8.resize(self.tokens * cols / QK, Q8Block::default());
        if !cols.is_multiple_of(QK) {
            for row in gu.chunks_exact(2 * cols) {
                let (gate, up) = row.split_at(cols);
                let at = self.x.len();
                self.x.extend_from_slice(gate);
                ops::swiglu(&mut self.x[at..], up);
            }
            return;
        }
        pool.par_tiles(&mut self.q8, cols / QK, QUANTIZE_TOKEN_STEP, cols / QK, &|rows, _, tile| {
            let mut h = [0.0f32; QK];
            for t in rows {
                let (gate, up) = gu[2 * t * cols..2 * (t + 1) * cols].split_at(cols);
                for ((g, u), block) in gate.chunks_exact(QK).zip(up.chunks_exact(QK)).zip(tile.row(t).iter_mut()) {
                    h.copy_from_slice(g);
                    ops::swiglu(&mut h, u);
                    quant::quantize_q8(&h, std::slice::from_mut(block));
                }
            }
        });
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub(super) fn q8_row(&self, t: usize) -> &[Q8Block] {
        let per = self.cols / QK;
        self.q8.get(t * per..(t + 1) * per).unwrap_or(&[])
    }

    pub(super) fn x_row(&self, t: usize) -> &[f32] {
        self.x.get(t * self.cols..(t + 1) * self.cols).unwrap_or(&[])
    }
}
