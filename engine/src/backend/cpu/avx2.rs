//! AVX2 + FMA (+ F16C) dot products of quantized weight rows with 8-bit activation blocks.
//!
//! Owns the only SIMD code of the CPU backend. Each kernel takes one weight row and up to
//! [`TILE`] activation rows, unpacks every weight block once and multiplies it with all of
//! them, so batched prefill reuses the unpacked weights (matrix-matrix) while decode runs
//! the same code with one activation row (matrix-vector).
//!
//! Invariants: callers reach these functions only through [`dot_tile`], which checks the
//! slice lengths and that the CPU has AVX2 and FMA; the results equal the scalar kernels
//! in `quant.rs` up to float summation order.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::quant::{Format, Q8Block};

/// Most activation rows one call multiplies against a weight row.
pub const TILE: usize = 4;

/// Whether this CPU can run the kernels in this module.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `out[n] = row · acts[n]` for each of `acts.len() <= TILE` activation rows.
///
/// Returns `false` (and leaves `out` alone) when this CPU lacks AVX2/FMA, the format is
/// not a q8-path format, or the lengths disagree, so the caller falls back to scalar.
pub fn dot_tile(format: Format, row: &[u8], acts: &[&[Q8Block]], out: &mut [f32]) -> bool {
    let blocks = row.len() / format.block_bytes().max(1);
    let lengths_ok = format.uses_q8()
        && row.len() == blocks * format.block_bytes()
        && !acts.is_empty()
        && acts.len() <= TILE
        && out.len() >= acts.len()
        && acts.iter().all(|a| a.len() >= blocks);
    if !lengths_ok || !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let mut ptrs = [acts[0].as_ptr(); TILE];
        for (p, a) in ptrs.iter_mut().zip(acts) {
            *p = a.as_ptr();
        }
        // SAFETY: AVX2 and FMA were detected above; `row` holds exactly `blocks` blocks of
        // `format` and every activation row at least `blocks` blocks, checked above.
        let sums = unsafe { dispatch(format, row.as_ptr(), blocks, ptrs, acts.len()) };
        out[..acts.len()].copy_from_slice(&sums[..acts.len()]);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
const F_Q4_0: u8 = 0;
#[cfg(target_arch = "x86_64")]
const F_Q4_1: u8 = 1;
#[cfg(target_arch = "x86_64")]
const F_Q5_0: u8 = 2;
#[cfg(target_arch = "x86_64")]
const F_Q5_1: u8 = 3;
#[cfg(target_arch = "x86_64")]
const F_Q8_0: u8 = 4;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dispatch(f: Format, row: *const u8, blocks: usize, a: [*const Q8Block; TILE], n: usize) -> [f32; TILE] {
    // SAFETY (whole body): forwarded from `dot_tile`'s checked contract.
    unsafe {
        macro_rules! by_n {
            ($F:expr) => {
                match n {
                    1 => widen(tile::<{ $F }, 1>(row, blocks, [a[0]])),
                    2 => widen(tile::<{ $F }, 2>(row, blocks, [a[0], a[1]])),
                    3 => widen(tile::<{ $F }, 3>(row, blocks, [a[0], a[1], a[2]])),
                    _ => tile::<{ $F }, 4>(row, blocks, a),
                }
            };
        }
        match f {
            Format::Q4_0 => by_n!(F_Q4_0),
            Format::Q4_1 => by_n!(F_Q4_1),
            Format::Q5_0 => by_n!(F_Q5_0),
            Format::Q5_1 => by_n!(F_Q5_1),
            _ => by_n!(F_Q8_0),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn widen<const N: usize>(v: [f32; N]) -> [f32; TILE] {
    let mut out = [0.0; TILE];
    out[..N].copy_from_slice(&v);
    out
}

/// Bytes per block of the compile-time format `F`.
#[cfg(target_arch = "x86_64")]
const fn block_bytes<const F: u8>() -> usize {
    match F {
        F_Q4_0 => 18,
        F_Q4_1 => 20,
        F_Q5_0 => 22,
        F_Q5_1 => 24,
        _ => 34,
    }
}

/// 16 packed bytes -> 32 bytes holding 0..15: low nibbles first, then high nibbles.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes at `p`.
    let lo = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let hi = _mm_srli_epi16(lo, 4);
    _mm256_and_si256(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(0x0f))
}

/// Bit `j` of the 32-bit word at `p` -> byte `j` = 0x10 if set, else 0.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fifth_bits(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes at `p`.
    let word = unsafe { std::ptr::read_unaligned(p as *const u32) };
    // Byte j takes byte j/8 of the word, then keeps only bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(word as i32),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
    );
    let select = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The 32 weights of block `b` as bytes: unsigned levels for Q4/Q5, signed for Q8_0.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unpack<const F: u8>(b: *const u8) -> __m256i {
    // SAFETY: `b` points at one whole block of format `F` (caller's contract); the
    // offsets below are that format's field offsets.
    unsafe {
        match F {
            F_Q4_0 => nibbles(b.add(2)),
            F_Q4_1 => nibbles(b.add(4)),
            F_Q5_0 => _mm256_or_si256(nibbles(b.add(6)), fifth_bits(b.add(2))),
            F_Q5_1 => _mm256_or_si256(nibbles(b.add(8)), fifth_bits(b.add(4))),
            _ => _mm256_loadu_si256(b.add(2) as *const __m256i),
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees 2 readable bytes at `p`.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// One weight row against `N` activation rows; see [`dot_tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const F: u8, const N: usize>(row: *const u8, blocks: usize, a: [*const Q8Block; N]) -> [f32; N] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); N];
    // Scalar terms: the `m * s` of offset-min formats, or the zero point of Q4_0/Q5_0.
    let mut extra = [0.0f32; N];
    let zero = match F {
        F_Q4_0 => 8.0f32,
        F_Q5_0 => 16.0,
        _ => 0.0,
    };
    for i in 0..blocks {
        // SAFETY: block `i < blocks` lies inside the row, and every activation row holds
        // at least `blocks` blocks (caller's contract).
        unsafe {
            let b = row.add(i * block_bytes::<F>());
            let w = unpack::<F>(b);
            let dw = half(b);
            // Q8_0 weights are signed: move the sign onto the activations so that
            // `maddubs` (unsigned x signed) sees |w|.
            let wabs = if F == F_Q8_0 { _mm256_sign_epi8(w, w) } else { w };
            for n in 0..N {
                let q = &*a[n].add(i);
                let qa = _mm256_loadu_si256(q.qs.as_ptr() as *const __m256i);
                let qa = if F == F_Q8_0 { _mm256_sign_epi8(qa, w) } else { qa };
                let pairs = _mm256_maddubs_epi16(wabs, qa);
                let sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
                acc[n] = _mm256_fmadd_ps(_mm256_set1_ps(dw * q.d), sums, acc[n]);
                match F {
                    F_Q4_1 | F_Q5_1 => extra[n] += half(b.add(2)) * q.s,
                    F_Q4_0 | F_Q5_0 => extra[n] -= dw * q.d * zero * q.isum as f32,
                    _ => {}
                }
            }
        }
    }
    let mut out = [0.0f32; N];
    for n in 0..N {
        // SAFETY: AVX2 is enabled for this function.
        out[n] = unsafe { hsum(acc[n]) } + extra[n];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::quant::{dot_q8_scalar, quantize_q8, quantize_row, tests::wave, QK};
    use super::*;

    #[test]
    fn simd_matches_scalar_for_every_format_and_tile_width() {
        if !available() {
            return;
        }
        let cols = 576;
        let w = wave(cols, 0.7);
        let acts: Vec<Vec<Q8Block>> = (0..TILE)
            .map(|n| {
                let mut a = vec![Q8Block::default(); cols / QK];
                quantize_q8(&wave(cols, n as f32 * 1.9), &mut a);
                a
            })
            .collect();
        for f in [Format::Q4_0, Format::Q4_1, Format::Q5_0, Format::Q5_1, Format::Q8_0] {
            let row = quantize_row(f, &w);
            for width in 1..=TILE {
                let refs: Vec<&[Q8Block]> = acts[..width].iter().map(|a| a.as_slice()).collect();
                let mut out = [0.0f32; TILE];
                assert!(dot_tile(f, &row, &refs, &mut out));
                for n in 0..width {
                    let want = dot_q8_scalar(f, &row, &acts[n]);
                    assert!((want - out[n]).abs() <= 1e-4 * want.abs().max(1.0), "{f:?} n={n}: {want} vs {}", out[n]);
                }
            }
        }
    }

    #[test]
    fn refuses_mismatched_lengths() {
        let row = vec![0u8; 20 * 3];
        let short = vec![Q8Block::default(); 2];
        let mut out = [0.0f32; TILE];
        assert!(!dot_tile(Format::Q4_1, &row, &[&short], &mut out));
        assert!(!dot_tile(Format::F32, &row, &[&short], &mut out));
    }
}
