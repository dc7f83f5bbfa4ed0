//! The CPU backend: quantized matrix products on a persistent thread pool.
//!
//! Owns: weight matrices in ggml block layouts ([`Matrix`]), quantized activations
//! ([`Activations`]), and the parallel products between them ([`Cpu::matmul`]). One code
//! path serves decode (one token: matrix-vector) and batched prefill (many tokens:
//! matrix-matrix tiles that unpack each weight block once for up to four tokens).
//! [`matmul_reference`] is the plain f32 path the fast one is tested against.
//!
//! Invariants: `Matrix::data` holds exactly `rows` rows of `cols` elements in `format`;
//! activations are quantized with the reference's `q8_1` rule before integer products;
//! SIMD is used only when detected at run time (`Cpu::simd`), else the scalar kernels.

mod avx2;
pub mod ops;
pub mod pool;
pub mod quant;

pub use pool::ThreadPool;
pub use quant::{Format, Q8Block, QK};

use crate::error::{Error, Result};

/// A weight matrix `[rows, cols]` (row-major; one output per row) in a ggml format.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub name: String,
    pub format: Format,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    /// `[rows, row_bytes]`
    data: Vec<u8>,
}

impl Matrix {
    /// Wraps `data` after checking it holds exactly `rows x cols` elements of `format`.
    pub fn new(name: &str, format: Format, rows: usize, cols: usize, data: Vec<u8>) -> Result<Matrix> {
        let row_bytes = format.row_bytes(cols).ok_or_else(|| Error::Shape {
            tensor: name.to_owned(),
            reason: format!("{cols} columns is not a whole number of {format:?} blocks"),
        })?;
        if data.len() != row_bytes * rows {
            return Err(Error::Shape {
                tensor: name.to_owned(),
                reason: format!("{} bytes for {rows}x{cols} {format:?}, expected {}", data.len(), row_bytes * rows),
            });
        }
        Ok(Matrix { name: name.to_owned(), format, rows, cols, row_bytes, data })
    }

    /// The packed bytes of row `r` (empty if out of range).
    pub fn row(&self, r: usize) -> &[u8] {
        self.data.get(r * self.row_bytes..(r + 1) * self.row_bytes).unwrap_or(&[])
    }

    /// Row `r` as f32 values (`out.len() == cols`).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        quant::dequantize_row(self.format, self.row(r), out);
    }

    /// Bytes of weight data (what one full pass over the matrix reads).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }
}

/// Activations for a batch of tokens, in f32 and (for integer products) 8-bit blocks.
#[derive(Debug, Default, Clone)]
pub struct Activations {
    pub cols: usize,
    /// `[tokens, cols]`
    pub x: Vec<f32>,
    /// `[tokens, cols / 32]`
    pub q8: Vec<Q8Block>,
}

impl Activations {
    /// Loads `x` (`[tokens, cols]`) and quantizes it; reuses the buffers.
    pub fn set(&mut self, x: &[f32], cols: usize) {
        self.cols = cols;
        self.x.clear();
        self.x.extend_from_slice(x);
        let tokens = if cols == 0 { 0 } else { x.len() / cols };
        self.q8.resize(tokens * cols / QK, Q8Block::default());
        if cols % QK == 0 {
            for (row, q) in x.chunks_exact(cols).zip(self.q8.chunks_exact_mut(cols / QK)) {
                quant::quantize_q8(row, q);
            }
        }
    }

    pub fn tokens(&self) -> usize {
        if self.cols == 0 {
            0
        } else {
            self.x.len() / self.cols
        }
    }

    fn q8_row(&self, t: usize) -> &[Q8Block] {
        let per = self.cols / QK;
        self.q8.get(t * per..(t + 1) * per).unwrap_or(&[])
    }

    fn x_row(&self, t: usize) -> &[f32] {
        self.x.get(t * self.cols..(t + 1) * self.cols).unwrap_or(&[])
    }
}

/// The CPU backend: its thread pool and the kernel choice made at start-up.
#[derive(Debug)]
pub struct Cpu {
    pub pool: ThreadPool,
    simd: bool,
}

impl Cpu {
    /// A backend with `threads` threads, using SIMD kernels when the CPU has them.
    pub fn new(threads: usize) -> Cpu {
        Cpu { pool: ThreadPool::new(threads), simd: avx2::available() }
    }

    /// Same, but never using SIMD (for tests that compare the two).
    pub fn scalar(threads: usize) -> Cpu {
        Cpu { pool: ThreadPool::new(threads), simd: false }
    }

    /// Which kernels run: "avx2" or "scalar".
    pub fn kernels(&self) -> &'static str {
        if self.simd {
            "avx2"
        } else {
            "scalar"
        }
    }

    /// `out[t, r] = Σ_c a[t, c] * w[r, c]` over the stacked matrices `ws` (their rows
    /// concatenated in order, all with `a.cols` columns) in one parallel step.
    /// `out` is `[tokens, Σ rows]`.
    pub fn matmul(&self, ws: &[&Matrix], a: &Activations, out: &mut [f32]) -> Result<()> {
        let total: usize = ws.iter().map(|w| w.rows).sum();
        if let Some(w) = ws.iter().find(|w| w.cols != a.cols) {
            return Err(Error::Shape { tensor: w.name.clone(), reason: format!("{} columns, activations have {}", w.cols, a.cols) });
        }
        if out.len() != a.tokens() * total {
            return Err(Error::Shape { tensor: "matmul output".into(), reason: format!("{} values for {}x{total}", out.len(), a.tokens()) });
        }
        // Row tiles: enough tasks to balance across threads, few enough to keep the
        // per-task overhead negligible. Token tiles keep weights and activations in cache.
        let per_task = (total / (self.pool.threads() * 8)).clamp(16, 256);
        let token_step = 32;
        self.pool.par_tiles(out, total, token_step, per_task, &|tokens, span, tile| {
            for r in span.clone() {
                let (w, local) = locate(ws, r);
                self.rows_times_tokens(w, local, a, tokens.clone(), r - span.start, tile);
            }
        });
        Ok(())
    }

    /// Writes `w[row] · a[t]` into column `col` of `tile` for every token `t`.
    fn rows_times_tokens(&self, w: &Matrix, row: usize, a: &Activations, tokens: std::ops::Range<usize>, col: usize, tile: &mut pool::Tile<'_>) {
        let bytes = w.row(row);
        if !w.format.uses_q8() {
            for t in tokens {
                let v = quant::dot_float_scalar(w.format, bytes, a.x_row(t));
                if let Some(o) = tile.row(t).get_mut(col) {
                    *o = v;
                }
            }
            return;
        }
        let mut t = tokens.start;
        while t < tokens.end {
            let n = (tokens.end - t).min(avx2::TILE);
            let mut sums = [0.0f32; avx2::TILE];
            let mut acts: [&[Q8Block]; avx2::TILE] = [&[]; avx2::TILE];
            for (k, slot) in acts.iter_mut().enumerate().take(n) {
                *slot = a.q8_row(t + k);
            }
            if !(self.simd && avx2::dot_tile(w.format, bytes, &acts[..n], &mut sums)) {
                for k in 0..n {
                    sums[k] = quant::dot_q8_scalar(w.format, bytes, acts[k]);
                }
            }
            for (k, s) in sums.iter().enumerate().take(n) {
                if let Some(o) = tile.row(t + k).get_mut(col) {
                    *o = *s;
                }
            }
            t += n;
        }
    }
}

/// The matrix of a stack that holds stacked row `r`, and the row's index inside it.
fn locate<'m>(ws: &[&'m Matrix], mut r: usize) -> (&'m Matrix, usize) {
    for w in ws {
        if r < w.rows {
            return (w, r);
        }
        r -= w.rows;
    }
    // Unreachable for r < Σ rows (checked by the caller); an empty stack has no rows.
    (ws[ws.len() - 1], 0)
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
    use super::quant::tests::wave;
    use super::*;

    fn matrix(format: Format, rows: usize, cols: usize) -> Matrix {
        let data: Vec<u8> = (0..rows).flat_map(|r| quant::quantize_row(format, &wave(cols, r as f32 * 0.3))).collect();
        Matrix::new("w", format, rows, cols, data).unwrap()
    }

    #[test]
    fn simd_and_scalar_and_reference_agree_for_batches() {
        let (rows, cols, tokens) = (37, 96, 7);
        let x: Vec<f32> = wave(tokens * cols, 4.0);
        let mut a = Activations::default();
        a.set(&x, cols);
        for f in [Format::F32, Format::F16, Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0] {
            let w = matrix(f, rows, cols);
            let mut want = vec![0.0; tokens * rows];
            matmul_reference(&w, &x, &mut want);
            let mut fast = vec![0.0; tokens * rows];
            Cpu::new(2).matmul(&[&w], &a, &mut fast).unwrap();
            let mut slow = vec![0.0; tokens * rows];
            Cpu::scalar(1).matmul(&[&w], &a, &mut slow).unwrap();
            for i in 0..want.len() {
                assert!((fast[i] - slow[i]).abs() < 1e-3, "{f:?} simd vs scalar at {i}");
                // Activation quantization costs up to ~1 % of the row's magnitude.
                assert!((want[i] - slow[i]).abs() < 0.05 * want[i].abs().max(1.0), "{f:?} vs reference at {i}");
            }
        }
    }

    #[test]
    fn stacked_matrices_fill_consecutive_columns() {
        let (cols, tokens) = (64, 3);
        let (w1, w2) = (matrix(Format::Q4_1, 5, cols), matrix(Format::Q8_0, 9, cols));
        let mut a = Activations::default();
        a.set(&wave(tokens * cols, 1.0), cols);
        let cpu = Cpu::new(2);
        let mut both = vec![0.0; tokens * 14];
        cpu.matmul(&[&w1, &w2], &a, &mut both).unwrap();
        let mut one = vec![0.0; tokens * 9];
        cpu.matmul(&[&w2], &a, &mut one).unwrap();
        for t in 0..tokens {
            assert_eq!(&both[t * 14 + 5..t * 14 + 14], &one[t * 9..t * 9 + 9]);
        }
    }

    #[test]
    fn shape_errors_are_reported() {
        assert!(Matrix::new("w", Format::Q4_1, 2, 33, vec![0; 40]).is_err());
        assert!(Matrix::new("w", Format::Q4_1, 2, 32, vec![0; 39]).is_err());
        let w = matrix(Format::Q4_1, 2, 32);
        let mut a = Activations::default();
        a.set(&[0.0; 64], 64);
        assert!(Cpu::new(1).matmul(&[&w], &a, &mut [0.0; 2]).is_err());
    }
}
