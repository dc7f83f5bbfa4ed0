//! AVX2 + FMA + F16C kernel over the interleaved layout (`packed.rs`), for CPUs without
//! AVX-512: the 16 rows of a group as two halves of 8 lanes.
//!
//! Without VNNI the integer products take two instructions: `maddubs` (unsigned levels
//! times signed activation bytes, pairs summed to i16) and `madd` with ones (to i32).
//! Nibble levels (up to 15) let a whole record's products share one i16 sum, levels up
//! to 63 two steps (5- and 6-bit levels are rebuilt from their nibble and their bit
//! planes, a shuffle and two compares a step and plane); Q8_0's 8-bit levels would overflow it, so that format moves the
//! weights' sign onto the activations instead and multiplies |w| (the zero point then
//! cancels). Up to two tokens, both halves of a group are summed in one pass over its
//! records, with a software prefetch ahead (decode streams the weights from DRAM once);
//! more tokens take a half per pass (prefill, compute-bound), for want of registers.
//! Records with a scale per 16 elements (`Scheme::halves`) keep the integer sums of their
//! two halves apart; the others are compiled without that split.
//!
//! Invariants: reached only through [`kernel`] and `SimdKernel::call`, which check the CPU's
//! features; results equal `packed::dot_group_scalar` up to float summation order.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::packed::SimdKernel;
#[cfg(target_arch = "x86_64")]
use super::packed::{Scheme, GROUP, MAX_TILE};
#[cfg(target_arch = "x86_64")]
use super::quant::Q8Block;
#[cfg(target_arch = "x86_64")]
use super::quant::QK;

/// The kernel, if this CPU has its features. With `streamed`, a decode tile's weights are
/// prefetched non-temporally: for weights larger than the last-level cache, which every
/// token reads once and which would otherwise push the KV cache and activations out of it.
pub fn kernel(streamed: bool) -> Option<SimdKernel> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") {
        let raw = if streamed { dispatch::<true> } else { dispatch::<false> };
        // SAFETY: the features `dispatch` is compiled for were just detected.
        return Some(unsafe { SimdKernel::new(raw) });
    }
    let _ = streamed;
    None
}

/// How far ahead of the record being multiplied a one-pass tile prefetches.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 1024;

/// Level kinds: two per byte; one per byte up to 63; Q8_0's signed bytes stored + 128;
/// nibbles with a plane of fifth bits.
#[cfg(target_arch = "x86_64")]
const NIBBLES: u8 = 0;
#[cfg(target_arch = "x86_64")]
const NIBBLES5: u8 = 3;
#[cfg(target_arch = "x86_64")]
const NIBBLES6: u8 = 4;
#[cfg(target_arch = "x86_64")]
const BYTES: u8 = 1;
#[cfg(target_arch = "x86_64")]
const SIGNED: u8 = 2;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dispatch<const STREAMED: bool>(
    s: Scheme,
    g: *const u8,
    blocks: usize,
    a: [*const Q8Block; MAX_TILE],
    n: usize,
    out: *mut [f32; GROUP],
) {
    // SAFETY (whole body): forwarded from `SimdKernel::call`'s checked contract.
    unsafe {
        // Up to two tokens keep both halves' sums in registers and stream the group once
        // (decode); more take one half per pass.
        macro_rules! by_n {
            ($kind:expr, $min:expr, $halves:expr, $exact:expr) => {
                match n {
                    1 => tile::<{ $kind }, $min, $halves, $exact, 1, 2, STREAMED>(g, blocks, s, [a[0]], out),
                    2 => tile::<{ $kind }, $min, $halves, $exact, 2, 2, STREAMED>(g, blocks, s, [a[0], a[1]], out),
                    3 => {
                        tile::<{ $kind }, $min, $halves, $exact, 3, 1, STREAMED>(g, blocks, s, [a[0], a[1], a[2]], out)
                    }
                    _ => tile::<{ $kind }, $min, $halves, $exact, 4, 1, STREAMED>(g, blocks, s, a, out),
                }
            };
        }
        // The formats with bit planes (Q5_0, Q5_1, Q5_K; Q6_K), the other legacy formats,
        // then the other K-quants (Q4_K; Q2_K, Q3_K).
        match (s.nibbles, s.min, s.zero, s.halves, s.exact_min) {
            _ if s.planes > 0 => match (s.planes, s.min, s.exact_min) {
                (1, true, true) => by_n!(NIBBLES5, true, false, true),
                (1, true, false) => by_n!(NIBBLES5, true, false, false),
                (1, false, _) => by_n!(NIBBLES5, false, false, false),
                // Q6_K, the only format with two planes: no minimums, two sets of scales.
                _ => by_n!(NIBBLES6, false, true, true),
            },
            (true, true, _, false, false) => by_n!(NIBBLES, true, false, false),
            (true, false, _, false, _) => by_n!(NIBBLES, false, false, false),
            (false, true, _, false, false) => by_n!(BYTES, true, false, false),
            (false, false, 128, false, _) => by_n!(SIGNED, false, false, false),
            (false, false, _, false, _) => by_n!(BYTES, false, false, false),
            (true, true, _, false, true) => by_n!(NIBBLES, true, false, true),
            (false, true, _, false, true) => by_n!(BYTES, true, false, true),
            (true, true, _, true, _) => by_n!(NIBBLES, true, true, true),
            (true, false, _, true, _) => by_n!(NIBBLES, false, true, true),
            (false, true, _, true, _) => by_n!(BYTES, true, true, true),
            (false, false, _, true, _) => by_n!(BYTES, false, true, true),
        }
    }
}

/// 4 activation bytes (`qs[4k..4k + 4]`) broadcast to every lane.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quad(q: *const Q8Block, k: usize) -> __m256i {
    // SAFETY: `q` points at a valid block and `k < 8`, so the 4 bytes lie inside `qs`.
    unsafe { _mm256_set1_epi32(std::ptr::read_unaligned((*q).qs.as_ptr().add(4 * k) as *const i32)) }
}

/// The shuffle that copies byte `step` of each 32-bit word to all four of its bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn spread_byte(step: usize) -> __m256i {
    // In each 128-bit lane, byte i takes byte 4 * (i / 4) + step of the lane.
    let bytes: [i8; 32] = std::array::from_fn(|i| (4 * ((i % 16) / 4) + step) as i8);
    // SAFETY: 32 bytes are read from a 32-byte array.
    unsafe { _mm256_loadu_si256(bytes.as_ptr() as *const __m256i) }
}

/// 32 bytes of levels: rows `8h..8h + 8` of step `step` of the record at `r`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn levels(r: *const u8, step: usize, h: usize) -> __m256i {
    // SAFETY: the caller passes a whole record and a step/half inside it.
    unsafe { _mm256_loadu_si256(r.add(64 * step + 32 * h) as *const __m256i) }
}

/// One group against `N` activation rows, `H` halves (of 8 rows) per pass over the
/// records; `HALVES`: two sets of scales per record, `EXACT`: minimums times `d * isum`
/// (see `Scheme`); see `SimdKernel::call` (and [`kernel`] for `STREAMED`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<
    const KIND: u8,
    const MIN: bool,
    const HALVES: bool,
    const EXACT: bool,
    const N: usize,
    const H: usize,
    const STREAMED: bool,
>(
    g: *const u8,
    blocks: usize,
    s: Scheme,
    a: [*const Q8Block; N],
    out: *mut [f32; GROUP],
) {
    let (rec, lb) = (s.record_bytes(), s.levels_bytes());
    // The signed path multiplies w itself, so no zero point is left to subtract.
    let zero = if KIND == SIGNED { 0 } else { s.zero };
    // Sets of scales per record, and the set of each quarter of a record's elements.
    let sets = if HALVES { 2 } else { 1 };
    let set_of_quarter = |k: usize| if HALVES { k / 2 } else { 0 };
    let (low, ones, flip) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi16(1), _mm256_set1_epi8(-128));
    // Byte j of a row's 4 holds the elements whose fifth bits are bits j and 4 + j.
    let (low_bits, high_bits) = (_mm256_set1_epi32(0x0804_0201), _mm256_set1_epi32(0x8040_2010_u32 as i32));
    let (sixteen, thirty_two) = (_mm256_set1_epi8(16), _mm256_set1_epi8(32));
    let spreads = [spread_byte(0), spread_byte(1), spread_byte(2), spread_byte(3)];
    for pass in 0..2 / H {
        let mut res = [[_mm256_setzero_ps(); H]; N];
        for i in 0..blocks {
            // SAFETY: record `i < blocks` lies inside the group and every activation row
            // holds at least `blocks` blocks (caller's contract).
            unsafe {
                let r = g.add(i * rec);
                if H == 2 {
                    // One pass streams the weights from DRAM: ask for them a few records
                    // early (a prefetch never faults, so running past the group is harmless).
                    for line in (0..rec).step_by(64) {
                        let ahead = r.wrapping_add(PREFETCH_BYTES + line) as *const i8;
                        if STREAMED {
                            _mm_prefetch::<_MM_HINT_NTA>(ahead);
                        } else {
                            _mm_prefetch::<_MM_HINT_T0>(ahead);
                        }
                    }
                }
                let q: [*const Q8Block; N] = std::array::from_fn(|n| a[n].add(i));
                // Integer sums per token, half of the rows and set of scales.
                let mut acc = [[[_mm256_setzero_si256(); 2]; H]; N];
                for (hh, h) in (pass * H..pass * H + H).enumerate() {
                    match KIND {
                        NIBBLES => {
                            // Levels <= 15 times |activation| <= 128, two products per
                            // i16 and eight i16 sums per record: at most 30,720, so the
                            // whole record (or each half) sums in i16 before one
                            // widening `madd`. A step holds elements 8 * step..8 * step + 8.
                            let mut p = [[_mm256_setzero_si256(); 2]; N];
                            for step in 0..4 {
                                let e = set_of_quarter(step);
                                let x = levels(r, step, h);
                                let lo = _mm256_and_si256(x, low);
                                let hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low);
                                for n in 0..N {
                                    p[n][e] = _mm256_add_epi16(p[n][e], _mm256_maddubs_epi16(lo, quad(q[n], 2 * step)));
                                    p[n][e] =
                                        _mm256_add_epi16(p[n][e], _mm256_maddubs_epi16(hi, quad(q[n], 2 * step + 1)));
                                }
                            }
                            for n in 0..N {
                                for e in 0..sets {
                                    acc[n][hh][e] = _mm256_madd_epi16(p[n][e], ones);
                                }
                            }
                        }
                        NIBBLES5 | NIBBLES6 => {
                            // A level's bit 4 + k: byte `step` of the row's word in plane k,
                            // spread over the row's 4 bytes and tested against the byte's bit.
                            let planes = if KIND == NIBBLES6 { 2 } else { 1 };
                            let plane = |k: usize| {
                                _mm256_loadu_si256(r.add(GROUP * QK / 2 + GROUP * 4 * k + 32 * h) as *const __m256i)
                            };
                            let bits = [plane(0), if planes == 2 { plane(1) } else { _mm256_setzero_si256() }];
                            let mut p = [_mm256_setzero_si256(); N];
                            for (step, spread) in spreads.iter().enumerate() {
                                let x = levels(r, step, h);
                                let (mut lo, mut hi) =
                                    (_mm256_and_si256(x, low), _mm256_and_si256(_mm256_srli_epi16(x, 4), low));
                                for (k, value) in [sixteen, thirty_two].iter().enumerate().take(planes) {
                                    let spread = _mm256_shuffle_epi8(bits[k], *spread);
                                    let bit = |mask: __m256i| {
                                        _mm256_and_si256(
                                            _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask),
                                            *value,
                                        )
                                    };
                                    lo = _mm256_or_si256(lo, bit(low_bits));
                                    hi = _mm256_or_si256(hi, bit(high_bits));
                                }
                                for n in 0..N {
                                    p[n] = _mm256_add_epi16(p[n], _mm256_maddubs_epi16(lo, quad(q[n], 2 * step)));
                                    p[n] = _mm256_add_epi16(p[n], _mm256_maddubs_epi16(hi, quad(q[n], 2 * step + 1)));
                                }
                                // Levels <= 31: two steps' products fit an i16 sum; <= 63: one.
                                if KIND == NIBBLES6 || step % 2 == 1 {
                                    let e = set_of_quarter(step);
                                    for n in 0..N {
                                        acc[n][hh][e] = _mm256_add_epi32(acc[n][hh][e], _mm256_madd_epi16(p[n], ones));
                                        p[n] = _mm256_setzero_si256();
                                    }
                                }
                            }
                        }
                        BYTES => {
                            // A pair of steps holds elements 8 * pair..8 * pair + 8.
                            for pair in 0..4 {
                                let e = set_of_quarter(pair);
                                let (x0, x1) = (levels(r, 2 * pair, h), levels(r, 2 * pair + 1, h));
                                for n in 0..N {
                                    let p = _mm256_add_epi16(
                                        _mm256_maddubs_epi16(x0, quad(q[n], 2 * pair)),
                                        _mm256_maddubs_epi16(x1, quad(q[n], 2 * pair + 1)),
                                    );
                                    acc[n][hh][e] = _mm256_add_epi32(acc[n][hh][e], _mm256_madd_epi16(p, ones));
                                }
                            }
                        }
                        _ => {
                            for step in 0..8 {
                                let w = _mm256_xor_si256(levels(r, step, h), flip);
                                let wabs = _mm256_abs_epi8(w);
                                for n in 0..N {
                                    let p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(quad(q[n], step), w));
                                    acc[n][hh][0] = _mm256_add_epi32(acc[n][hh][0], _mm256_madd_epi16(p, ones));
                                }
                            }
                        }
                    }
                }
                for (hh, h) in (pass * H..pass * H + H).enumerate() {
                    #[allow(clippy::needless_range_loop)] // `e` also places the set's scales
                    for e in 0..sets {
                        let at = lb + 2 * GROUP * e + 16 * h;
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(r.add(at) as *const __m128i));
                        let m = if MIN {
                            _mm256_cvtph_ps(_mm_loadu_si128(r.add(at + 2 * GROUP * sets) as *const __m128i))
                        } else {
                            d
                        };
                        for n in 0..N {
                            let qb = &*q[n];
                            let isum = if HALVES { qb.isum_of(16 * e..16 * e + 16) } else { qb.isum };
                            let sum = if zero != 0 {
                                _mm256_sub_epi32(acc[n][hh][e], _mm256_set1_epi32(zero * isum))
                            } else {
                                acc[n][hh][e]
                            };
                            res[n][hh] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(sum),
                                _mm256_mul_ps(d, _mm256_set1_ps(qb.d)),
                                res[n][hh],
                            );
                            if MIN {
                                let total = if EXACT { qb.d * isum as f32 } else { qb.s };
                                res[n][hh] = _mm256_fmadd_ps(m, _mm256_set1_ps(total), res[n][hh]);
                            }
                        }
                    }
                }
            }
        }
        for (n, halves) in res.iter().enumerate() {
            for (hh, v) in halves.iter().enumerate() {
                // SAFETY: `out` holds at least `N` rows of GROUP floats (caller's contract).
                unsafe { _mm256_storeu_ps((*out.add(n)).as_mut_ptr().add(8 * (pass * H + hh)), *v) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::packed::tests::{self as packed_tests, activations, TestResult};
    use super::super::packed::{dot_group_scalar, Packed};
    use super::super::quant::Format;
    use super::*;

    #[test]
    fn matches_the_portable_kernel_for_every_format_and_tile_width() -> TestResult {
        packed_tests::agrees_with_the_portable_kernel(kernel(false))?;
        packed_tests::agrees_with_the_portable_kernel(kernel(true))
    }

    #[test]
    fn refuses_mismatched_lengths() -> TestResult {
        packed_tests::refuses_mismatched_lengths(kernel(false))
    }

    #[test]
    fn q8_extremes_do_not_saturate() -> TestResult {
        let Some(kernel) = kernel(false) else { return Ok(()) };
        // Every weight at -128 or 127 and every activation at ±127: the largest i16 pairs.
        let cols = 64;
        let mut ggml = Vec::new();
        for r in 0..GROUP {
            for _ in 0..cols / 32 {
                ggml.extend_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
                ggml.extend((0..32).map(|j| if (j + r) % 2 == 0 { 0x80u8 } else { 0x7f }));
            }
        }
        let p = Packed::pack(Format::Q8_0, GROUP, cols, &ggml).ok_or("pack")?;
        let mut acts = activations(cols, 0.0);
        for b in &mut acts {
            b.qs = std::array::from_fn(|j| if j % 3 == 0 { -127 } else { 127 });
            b.isum = b.qs.iter().map(|v| i32::from(*v)).sum();
            b.isum_lo = b.qs[..16].iter().map(|v| i32::from(*v)).sum();
        }
        let (mut want, mut out) = ([0.0f32; GROUP], [[0.0f32; GROUP]; 1]);
        dot_group_scalar(p.scheme, p.group(0), &acts, &mut want);
        assert!(kernel.call(p.scheme, p.group(0), &[&acts], &mut out));
        assert_eq!(want, out[0]);
        Ok(())
    }
}
