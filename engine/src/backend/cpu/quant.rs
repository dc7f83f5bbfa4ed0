//! ggml block formats and their portable (scalar) kernels.
//!
//! Owns: the byte layout of every weight format the CPU backend computes on, the 8-bit
//! activation blocks ([`Q8Block`], llama.cpp's `q8_1` with the integer sum kept), and the
//! scalar dot products and dequantizers. These scalar kernels are the ground truth the
//! SIMD kernels are tested against, and the fallback on CPUs without AVX2.
//!
//! Invariants: a weight row is `cols / block_elems` whole blocks laid out back to back
//! exactly as in the GGUF file (little-endian); `cols` is a multiple of 32 for every
//! quantized format, of 256 for the K-quants (whose superblocks `kquant.rs` decodes). Activations for the integer path are quantized once per row with the
//! same rule as llama.cpp (`d = amax / 127`, `q = round(x / d)`, `d` stored at f16
//! precision), so the products match the reference implementation's rounding.

use half::f16;

use super::kquant::{self, QK_K};

/// Elements per quantized block of the legacy formats, and per activation block (llama.cpp's
/// QK = 32); the K-quants' superblocks hold eight.
pub const QK: usize = 32;

/// A weight storage format the CPU kernels can multiply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's own names, so they match every other tool
pub enum Format {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl Format {
    /// Every format, floats first.
    pub const ALL: [Format; 13] = [
        Format::F32,
        Format::F16,
        Format::BF16,
        Format::Q4_0,
        Format::Q4_1,
        Format::Q5_0,
        Format::Q5_1,
        Format::Q8_0,
        Format::Q2_K,
        Format::Q3_K,
        Format::Q4_K,
        Format::Q5_K,
        Format::Q6_K,
    ];

    /// Elements per block (1 for the float formats).
    pub fn block_elems(self) -> usize {
        match self {
            Format::F32 | Format::F16 | Format::BF16 => 1,
            f if kquant::is_k(f) => QK_K,
            _ => QK,
        }
    }

    /// Whether values are stored as floats, one by one.
    pub fn is_float(self) -> bool {
        matches!(self, Format::F32 | Format::F16 | Format::BF16)
    }

    /// Bytes per block. A `match` rather than the GGUF reader's table because kernels ask
    /// per row; `layouts_agree_with_the_gguf_reader` pins the two together.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::F32 => 4,
            Format::F16 | Format::BF16 => 2,
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q5_0 => 22,
            Format::Q5_1 => 24,
            Format::Q8_0 => 34,
            Format::Q2_K => 84,
            Format::Q3_K => 110,
            Format::Q4_K => 144,
            Format::Q5_K => 176,
            Format::Q6_K => 210,
        }
    }

    /// Bytes one row of `cols` elements occupies, or `None` if `cols` is not a whole
    /// number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        cols.is_multiple_of(self.block_elems()).then(|| cols / self.block_elems() * self.block_bytes())
    }

    /// Whether products with this format use the 8-bit activation blocks.
    pub fn uses_q8(self) -> bool {
        !self.is_float()
    }
}

/// One block of 32 activations quantized to 8 bits (llama.cpp's `q8_1`).
///
/// `d` and `s` are rounded to f16 precision, as the reference stores them; `isum` is the
/// exact integer sum of `qs`, which lets the offset formats (Q4_0, Q5_0) subtract their
/// zero point in integer arithmetic, and `isum_lo` that of its first 16, for the formats
/// with a scale per 16 elements.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C, align(8))]
pub struct Q8Block {
    pub d: f32,
    /// `d * Σ qs` at f16 precision (the `s` of llama.cpp's `q8_1`).
    pub s: f32,
    pub isum: i32,
    pub qs: [i8; QK],
    /// `Σ qs[..16]`
    pub isum_lo: i32,
}

impl Q8Block {
    /// The exact sum of `qs[elems]`, for the whole block or either half of it.
    #[inline]
    pub fn isum_of(&self, elems: std::ops::Range<usize>) -> i32 {
        match (elems.start, elems.end) {
            (0, QK) => self.isum,
            (0, 16) => self.isum_lo,
            (16, QK) => self.isum - self.isum_lo,
            _ => self.qs.get(elems).map_or(0, |q| q.iter().map(|v| i32::from(*v)).sum()),
        }
    }
}

#[inline]
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// Rounds to f16 precision and back (how the reference stores scales).
#[inline]
pub fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// Quantizes `x` (length a multiple of 32) into `out` (`x.len() / 32` blocks). Prefill
/// quantizes every projection's input on one thread before the product, so the AVX2
/// twin (`ops_simd`) takes it where it runs.
pub fn quantize_q8(x: &[f32], out: &mut [Q8Block]) {
    if !super::ops_simd::quantize_q8(x, out) {
        quantize_q8_portable(x, out);
    }
}

/// The portable [`quantize_q8`], which the twin matches bit for bit.
pub(crate) fn quantize_q8_portable(x: &[f32], out: &mut [Q8Block]) {
    for (chunk, block) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let amax = chunk.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        // `127 / amax` rather than `1 / d`: the reference's rounding of `x * id`.
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut isum = 0i32;
        for (j, (q, v)) in block.qs.iter_mut().zip(chunk).enumerate() {
            *q = round_ties_even_small(v * id) as i8;
            isum += i32::from(*q);
            if j == 15 {
                block.isum_lo = isum;
            }
        }
        block.d = round_f16(d);
        block.s = round_f16(d * isum as f32);
        block.isum = isum;
    }
}

/// Rounds half to even, as the reference's AVX2 path (`_mm256_round_ps`) does, for
/// |x| < 2^22: adding and removing 1.5 * 2^23 leaves no fraction bits, so the FPU's own
/// round-to-nearest-even does the work. `f32::round_ties_even` is a libm call on a
/// baseline x86-64 build; this is two additions and vectorises.
#[inline]
fn round_ties_even_small(x: f32) -> f32 {
    (x + ROUNDING_MAGIC) - ROUNDING_MAGIC
}

/// 1.5 * 2^23: see [`round_ties_even_small`].
pub(crate) const ROUNDING_MAGIC: f32 = 12_582_912.0;

/// The 4-bit value of element `j` (0..32) of a block's 16 packed bytes: low nibbles hold
/// elements 0..16, high nibbles 16..32.
#[inline]
fn nibble(qs: &[u8], j: usize) -> i32 {
    if j < 16 {
        i32::from(qs[j] & 0x0f)
    } else {
        i32::from(qs[j - 16] >> 4)
    }
}

/// The 5th bit of element `j` from a Q5 block's `qh` word.
#[inline]
fn high_bit(qh: u32, j: usize) -> i32 {
    ((qh >> j) & 1) as i32
}

#[inline]
fn qh_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Scalar dot product of one quantized weight row with one quantized activation row.
/// `row` holds `a.len()` blocks of `format` (which must use the q8 path).
pub fn dot_q8_scalar(format: Format, row: &[u8], a: &[Q8Block]) -> f32 {
    if kquant::is_k(format) {
        return dot_k_scalar(format, row, a);
    }
    let bb = format.block_bytes();
    let mut acc = 0.0f32;
    for (b, q) in row.chunks_exact(bb).zip(a) {
        let dot = |f: &dyn Fn(usize) -> i32| -> i32 { (0..QK).map(|j| f(j) * i32::from(q.qs[j])).sum() };
        acc += match format {
            Format::Q4_0 => f16_at(b, 0) * q.d * (dot(&|j| nibble(&b[2..], j)) - 8 * q.isum) as f32,
            Format::Q4_1 => f16_at(b, 0) * q.d * dot(&|j| nibble(&b[4..], j)) as f32 + f16_at(b, 2) * q.s,
            Format::Q5_0 => {
                let qh = qh_at(b, 2);
                let sum = dot(&|j| nibble(&b[6..], j) | (high_bit(qh, j) << 4));
                f16_at(b, 0) * q.d * (sum - 16 * q.isum) as f32
            }
            Format::Q5_1 => {
                let qh = qh_at(b, 4);
                let sum = dot(&|j| nibble(&b[8..], j) | (high_bit(qh, j) << 4));
                f16_at(b, 0) * q.d * sum as f32 + f16_at(b, 2) * q.s
            }
            Format::Q8_0 => f16_at(b, 0) * q.d * dot(&|j| i32::from(b[2 + j] as i8)) as f32,
            _ => 0.0,
        };
    }
    acc
}

/// [`dot_q8_scalar`] for a K-quant row: per 16 elements, the integer dot of levels and
/// activation bytes times scale and step, less the minimum times the exact sum of the
/// activations (as llama.cpp's q8_K products take their block sums).
fn dot_k_scalar(format: Format, row: &[u8], a: &[Q8Block]) -> f32 {
    let mut acc = 0.0f32;
    for (b, acts) in row.chunks_exact(format.block_bytes()).zip(a.chunks(QK_K / QK)) {
        let sb = kquant::decode(format, b);
        for (j, q) in acts.iter().enumerate() {
            for h in 0..2 {
                let (at, sub) = (16 * h, 2 * j + h);
                let dot: i32 = (0..16).map(|e| i32::from(sb.q[QK * j + at + e]) * i32::from(q.qs[at + e])).sum();
                let sum: i32 = q.qs[at..at + 16].iter().map(|v| i32::from(*v)).sum();
                acc += sb.scale[sub] * q.d * dot as f32 - sb.min[sub] * q.d * sum as f32;
            }
        }
    }
    acc
}

/// Scalar dot product of an F32 or F16 weight row with f32 activations.
pub fn dot_float_scalar(format: Format, row: &[u8], x: &[f32]) -> f32 {
    match format {
        Format::F32 => row.chunks_exact(4).zip(x).map(|(b, v)| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * v).sum(),
        Format::F16 => row.chunks_exact(2).zip(x).map(|(b, v)| f16_at(b, 0) * v).sum(),
        Format::BF16 => row.chunks_exact(2).zip(x).map(|(b, v)| bf16_at(b, 0) * v).sum(),
        _ => 0.0,
    }
}

/// The bfloat16 at `at`: the top half of an f32.
#[inline]
fn bf16_at(bytes: &[u8], at: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([bytes[at], bytes[at + 1]])) << 16)
}

/// Dequantizes one row of `format` into `out` (`out.len()` elements).
pub fn dequantize_row(format: Format, row: &[u8], out: &mut [f32]) {
    match format {
        Format::F32 => {
            for (b, o) in row.chunks_exact(4).zip(out.iter_mut()) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            return;
        }
        Format::F16 => {
            for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
                *o = f16_at(b, 0);
            }
            return;
        }
        Format::BF16 => {
            for (b, o) in row.chunks_exact(2).zip(out.iter_mut()) {
                *o = bf16_at(b, 0);
            }
            return;
        }
        f if kquant::is_k(f) => return kquant::dequantize(f, row, out),
        _ => {}
    }
    let bb = format.block_bytes();
    for (b, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        for (j, v) in o.iter_mut().enumerate() {
            *v = match format {
                Format::Q4_0 => f16_at(b, 0) * (nibble(&b[2..], j) - 8) as f32,
                Format::Q4_1 => f16_at(b, 0) * nibble(&b[4..], j) as f32 + f16_at(b, 2),
                Format::Q5_0 => {
                    let q = nibble(&b[6..], j) | (high_bit(qh_at(b, 2), j) << 4);
                    f16_at(b, 0) * (q - 16) as f32
                }
                Format::Q5_1 => {
                    let q = nibble(&b[8..], j) | (high_bit(qh_at(b, 4), j) << 4);
                    f16_at(b, 0) * q as f32 + f16_at(b, 2)
                }
                Format::Q8_0 => f16_at(b, 0) * f32::from(b[2 + j] as i8),
                _ => 0.0,
            };
        }
    }
}

/// Quantizes f32 values into `format` (round to nearest; used by tests and benches to
/// build weight rows, not on the inference path).
pub fn quantize_row(format: Format, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(format.row_bytes(x.len()).unwrap_or(0));
    match format {
        Format::F32 => x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        Format::F16 => x.iter().for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_le_bytes())),
        // Truncation (not rounding) is enough for test rows.
        Format::BF16 => x.iter().for_each(|v| out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes())),
        f if kquant::is_k(f) => x.chunks_exact(QK_K).for_each(|c| kquant::quantize(f, c, &mut out)),
        _ => x.chunks_exact(QK).for_each(|c| quantize_block(format, c, &mut out)),
    }
    out
}

fn quantize_block(format: Format, c: &[f32], out: &mut Vec<u8>) {
    let min = c.iter().fold(f32::INFINITY, |m, v| m.min(*v));
    let max = c.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let amax = c.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // The signed value of largest magnitude: the symmetric formats map it to level 0
    // exactly (as ggml does), so no value is clamped.
    let smax = c.iter().fold(0.0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
    let push_f16 = |out: &mut Vec<u8>, v: f32| out.extend_from_slice(&f16::from_f32(v).to_le_bytes());
    let inv = |d: f32| if d != 0.0 { 1.0 / d } else { 0.0 };
    // (scale, offset, zero point, levels) per format; asymmetric formats store the min.
    let (d, m, zero, levels, bits5) = match format {
        Format::Q4_0 => (smax / -8.0, 0.0, 8.0, 15.0, false),
        Format::Q4_1 => ((max - min) / 15.0, min, 0.0, 15.0, false),
        Format::Q5_0 => (smax / -16.0, 0.0, 16.0, 31.0, true),
        Format::Q5_1 => ((max - min) / 31.0, min, 0.0, 31.0, true),
        _ => (amax / 127.0, 0.0, 0.0, 127.0, false),
    };
    let q: Vec<i32> = c
        .iter()
        .map(|v| {
            ((v - m) * inv(d) + zero).round().clamp(if format == Format::Q8_0 { -127.0 } else { 0.0 }, levels) as i32
        })
        .collect();
    push_f16(out, d);
    if matches!(format, Format::Q4_1 | Format::Q5_1) {
        push_f16(out, m);
    }
    if format == Format::Q8_0 {
        out.extend(q.iter().map(|v| *v as i8 as u8));
        return;
    }
    if bits5 {
        let qh = q.iter().enumerate().fold(0u32, |h, (j, v)| h | ((((*v >> 4) & 1) as u32) << j));
        out.extend_from_slice(&qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| ((q[j] & 0xf) | ((q[j + 16] & 0xf) << 4)) as u8));
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn layouts_agree_with_the_gguf_reader() {
        use crate::gguf::GgmlType;
        for format in Format::ALL {
            let ty = (0..64).filter_map(GgmlType::from_id).find(|t| format!("{t:?}") == format!("{format:?}"));
            let layout = ty.map(|t| (t.block_elems(), t.block_bytes()));
            assert_eq!(Some((format.block_elems(), format.block_bytes())), layout, "{format:?}");
        }
    }

    pub(crate) fn wave(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| (i as f32 * 0.37 + seed).sin() * 1.7 + (i as f32 * 0.011).cos() * 0.3).collect()
    }

    const QUANTS: [Format; 5] = [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0];

    #[test]
    fn round_trip_error_is_within_a_step() {
        let x = wave(256, 0.5);
        for f in QUANTS {
            let bytes = quantize_row(f, &x);
            assert_eq!(Some(bytes.len()), f.row_bytes(x.len()));
            let mut back = vec![0.0; x.len()];
            dequantize_row(f, &bytes, &mut back);
            // One quantization step for |x| <= 2 (the symmetric formats may clamp the
            // top level, so allow a whole step rather than half).
            let step = match f {
                Format::Q4_0 | Format::Q4_1 => 2.0 / 8.0,
                Format::Q5_0 | Format::Q5_1 => 2.0 / 16.0,
                _ => 2.0 / 127.0,
            };
            for (a, b) in x.iter().zip(&back) {
                assert!((a - b).abs() <= step, "{f:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn q8_dot_matches_dequantized_dot() {
        let x = wave(512, 0.1);
        let w = wave(512, 2.0);
        let mut a = vec![Q8Block::default(); 512 / QK];
        quantize_q8(&x, &mut a);
        let mut xa = vec![0.0; 512];
        for (blk, o) in a.iter().zip(xa.chunks_exact_mut(QK)) {
            for (q, v) in blk.qs.iter().zip(o) {
                *v = f32::from(*q) * blk.d;
            }
        }
        for f in QUANTS {
            let bytes = quantize_row(f, &w);
            let mut wd = vec![0.0; 512];
            dequantize_row(f, &bytes, &mut wd);
            let want: f32 = wd.iter().zip(&xa).map(|(p, q)| p * q).sum();
            let got = dot_q8_scalar(f, &bytes, &a);
            // Only the f16 rounding of `s` separates the two.
            assert!((want - got).abs() < 1e-2 * want.abs().max(1.0), "{f:?}: {want} vs {got}");
        }
    }

    #[test]
    fn float_formats_dot() {
        let x = wave(64, 0.3);
        let w = wave(64, 1.3);
        let want: f32 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
        for f in [Format::F32, Format::F16] {
            let got = dot_float_scalar(f, &quantize_row(f, &w), &x);
            assert!((want - got).abs() < 1e-2, "{f:?}");
        }
    }

    #[test]
    fn fast_rounding_is_round_half_to_even() {
        for i in -300_000..300_000 {
            let x = i as f32 * 0.000_43 + if i % 7 == 0 { 0.5 } else { 0.0 };
            assert_eq!(round_ties_even_small(x), x.round_ties_even(), "{x}");
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -2.5, 126.5, -127.5, 0.0, -0.0] {
            assert_eq!(round_ties_even_small(x), x.round_ties_even(), "{x}");
        }
    }

    #[test]
    fn q8_quantization_twin_is_bit_identical() {
        // Ordinary activations, a zero block, a NaN, infinities and a denormal maximum
        // (whose inverse overflows): the twin saturates and zeroes as `as i8` does.
        let mut x = wave(32 * 64, 0.7);
        x[32..64].fill(0.0);
        x[70] = f32::NAN;
        x[100] = f32::INFINITY;
        x[140] = f32::NEG_INFINITY;
        x[160..192].fill(0.0);
        x[161] = 1e-45;
        x[162] = -1e-45;
        let (mut fast, mut slow) = (vec![Q8Block::default(); 64], vec![Q8Block::default(); 64]);
        quantize_q8(&x, &mut fast);
        quantize_q8_portable(&x, &mut slow);
        for (i, (f, s)) in fast.iter().zip(&slow).enumerate() {
            assert_eq!(
                (f.d.to_bits(), f.s.to_bits(), f.isum, f.qs),
                (s.d.to_bits(), s.s.to_bits(), s.isum, s.qs),
                "block {i}"
            );
        }
    }

    #[test]
    fn q8_zero_block_is_zero() {
        let mut a = [Q8Block::default(); 1];
        quantize_q8(&[0.0; 32], &mut a);
        assert_eq!(a[0].d, 0.0);
        assert!(a[0].qs.iter().all(|q| *q == 0));
    }
}
