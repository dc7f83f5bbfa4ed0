//! AVX-512 VNNI kernel over the interleaved layout (`packed.rs`): 16 weight rows, one per
//! 32-bit lane, against up to `packed::MAX_TILE` activation rows.
//!
//! Each 64-byte load of levels feeds `vpdpbusd` once per activation row (twice for the
//! nibble formats: low and high nibbles), with 4 activation bytes broadcast from memory,
//! so batched prefill unpacks each weight step once for all tokens of the tile and decode
//! runs the same code with one. The 5- and 6-bit formats rebuild their levels from the
//! nibbles and one or two planes of high bits (a shuffle spreads a plane's byte over the
//! row's four, a bit test makes a mask, a masked add puts 16 or 32 in). Records with two
//! sets of scales (`Scheme::halves`) keep the integer sums of their halves apart. Per set
//! of scales, the integer sums become f32 with one multiply-add per token against the 16
//! rows' scales.
//!
//! Invariants: reached only through [`kernel`], which checks that the CPU has the features,
//! and `SimdKernel::call`, which checks the lengths. With AVX-512F/BW and VNNI; results
//! equal `packed::dot_group_scalar` up to float summation order (the integer part is exact).
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::packed::SimdKernel;
#[cfg(target_arch = "x86_64")]
use super::packed::{Scheme, GROUP, MAX_TILE};
#[cfg(target_arch = "x86_64")]
use super::quant::{Q8Block, QK};

/// How far ahead of the record being multiplied the kernel prefetches into L1.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 1024;

/// How far ahead a decode tile prefetches into L1 when the weights stay in the last-level
/// cache. Farther than [`PREFETCH_BYTES`] since they sit in huge pages
/// (`weight_arena`): per-token ABBA on the Xeon against 1 KiB, 1.046x decode at 1 thread
/// (2 KiB: 1.022, 3 KiB: 1.035, 6 KiB: 1.011) and 1.018x at 2.
#[cfg(target_arch = "x86_64")]
const DECODE_PREFETCH_BYTES: usize = 4096;

/// How far ahead a decode tile also prefetches into L2 when the weights stay in the
/// last-level cache (not streamed). A large L3 answers through its mesh with a long
/// latency, and one L1 prefetch per line cannot keep enough requests in flight: on a Xeon
/// whose 300 MiB L3 holds the model, per-token ABBA decode ran 1.16-1.19x faster (1 thread)
/// and 1.15-1.17x (2 threads) with this second prefetch than with the L1 prefetch alone
/// (and 1.07-1.10x, 1.04-1.05x faster than one L1 prefetch moved to 4 KiB); 16 KiB was no
/// better than 8.
#[cfg(target_arch = "x86_64")]
const L2_PREFETCH_BYTES: usize = 8192;

/// The kernel, if this CPU has its features. With `streamed`, a decode tile's weights are
/// prefetched non-temporally, as in `avx2::kernel`: for weights larger than the last-level cache,
/// which every token reads once and which would otherwise push the KV cache out of it.
pub fn kernel(streamed: bool) -> Option<SimdKernel> {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
    {
        let raw = if streamed { dispatch::<true> } else { dispatch::<false> };
        // SAFETY: the features `dispatch` is compiled for were just detected.
        return Some(unsafe { SimdKernel::new(raw) });
    }
    let _ = streamed;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
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
        macro_rules! by_n {
            ($nib:expr, $planes:expr, $halves:expr, $min:expr, $exact:expr) => {
                match n {
                    1 => tile::<$nib, $planes, $halves, $min, $exact, 1, STREAMED>(g, blocks, s.zero, [a[0]], out),
                    2 => {
                        tile::<$nib, $planes, $halves, $min, $exact, 2, STREAMED>(g, blocks, s.zero, [a[0], a[1]], out)
                    }
                    3 => tile::<$nib, $planes, $halves, $min, $exact, 3, STREAMED>(
                        g,
                        blocks,
                        s.zero,
                        [a[0], a[1], a[2]],
                        out,
                    ),
                    _ => tile::<$nib, $planes, $halves, $min, $exact, 4, STREAMED>(g, blocks, s.zero, a, out),
                }
            };
        }
        // The layouts of `Scheme::of`, by (nibbles, planes, halves) and then minimums.
        match (s.nibbles, s.planes, s.halves, s.min, s.exact_min) {
            // Q4_0, Q4_1, Q4_K
            (true, 0, false, false, _) => by_n!(true, 0, false, false, false),
            (true, 0, false, true, false) => by_n!(true, 0, false, true, false),
            (true, 0, false, true, true) => by_n!(true, 0, false, true, true),
            // Q3_K, Q2_K
            (true, 0, true, false, _) => by_n!(true, 0, true, false, false),
            (true, 0, true, true, _) => by_n!(true, 0, true, true, true),
            // Q5_0, Q5_1, Q5_K
            (true, 1, _, false, _) => by_n!(true, 1, false, false, false),
            (true, 1, _, true, false) => by_n!(true, 1, false, true, false),
            (true, 1, _, true, true) => by_n!(true, 1, false, true, true),
            // Q6_K, the only format with two planes: no minimums, two sets of scales.
            (true, _, _, _, _) => by_n!(true, 2, true, false, false),
            // Q8_0 (and byte levels with minimums, which no format has today)
            (false, _, _, false, _) => by_n!(false, 0, false, false, false),
            (false, _, _, true, false) => by_n!(false, 0, false, true, false),
            (false, _, _, true, true) => by_n!(false, 0, false, true, true),
        }
    }
}

/// 4 activation bytes (`qs[4k..4k + 4]`) broadcast to every lane.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn quad(q: *const Q8Block, k: usize) -> __m512i {
    // SAFETY: `q` points at a valid block and `k < 8`, so the 4 bytes lie inside `qs`.
    unsafe { _mm512_set1_epi32(std::ptr::read_unaligned((*q).qs.as_ptr().add(4 * k) as *const i32)) }
}

/// The shuffle that copies byte `step` of each 32-bit word to all four of its bytes.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn spread_byte(step: usize) -> __m512i {
    // In each 128-bit lane, byte i takes byte 4 * (i / 4) + step of the lane.
    let bytes: [i8; 64] = std::array::from_fn(|i| (4 * ((i % 16) / 4) + step) as i8);
    // SAFETY: 64 bytes are read from a 64-byte array.
    unsafe { _mm512_loadu_si512(bytes.as_ptr() as *const _) }
}

/// One group of [`GROUP`] rows against `N` activation rows: `PLANES` planes of high bits
/// after the nibbles, `HALVES`: two sets of scales per record, `EXACT`: minimums times
/// `d * isum` (see `Scheme`); see `SimdKernel::call` (and [`kernel`] for `STREAMED`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<
    const NIB: bool,
    const PLANES: usize,
    const HALVES: bool,
    const MIN: bool,
    const EXACT: bool,
    const N: usize,
    const STREAMED: bool,
>(
    g: *const u8,
    blocks: usize,
    zero: i32,
    a: [*const Q8Block; N],
    out: *mut [f32; GROUP],
) {
    let scheme = Scheme { nibbles: NIB, planes: PLANES, zero, min: MIN, halves: HALVES, exact_min: EXACT };
    let (rec, lb, sets) = (scheme.record_bytes(), scheme.levels_bytes(), scheme.sets());
    // The set of scales of a step of nibbles (elements 8 * step..8 * step + 8) or of a pair
    // of byte steps.
    let set_of = |k: usize| if HALVES { k / 2 } else { 0 };
    let low = _mm512_set1_epi8(0x0f);
    // Byte j of a row's word holds the elements whose high bits are bits j and 4 + j of
    // the plane's byte `step`; a plane adds 16 (fifth bits) or 32 (sixth).
    let (low_bits, high_bits) = (_mm512_set1_epi32(0x0804_0201), _mm512_set1_epi32(0x8040_2010_u32 as i32));
    let values = [_mm512_set1_epi8(16), _mm512_set1_epi8(32)];
    let spreads = [spread_byte(0), spread_byte(1), spread_byte(2), spread_byte(3)];
    let mut res = [_mm512_setzero_ps(); N];
    for i in 0..blocks {
        // SAFETY: record `i < blocks` lies inside the group and every activation row
        // holds at least `blocks` blocks (caller's contract); offsets stay inside a record.
        unsafe {
            let r = g.add(i * rec);
            // Decode reads every weight once per token, from DRAM or the last-level
            // cache: ask for them records early (a prefetch never faults, so running
            // past the group is harmless).
            for line in (0..rec).step_by(64) {
                let at = |distance: usize| r.wrapping_add(distance + line) as *const i8;
                // Prefill's wider tiles read a group again for the next tokens: only
                // decode's stream past the caches.
                match (STREAMED, N <= 2) {
                    (true, true) => _mm_prefetch::<_MM_HINT_NTA>(at(PREFETCH_BYTES)),
                    (false, true) => {
                        _mm_prefetch::<_MM_HINT_T0>(at(DECODE_PREFETCH_BYTES));
                        _mm_prefetch::<_MM_HINT_T1>(at(L2_PREFETCH_BYTES));
                    }
                    (_, false) => _mm_prefetch::<_MM_HINT_T0>(at(PREFETCH_BYTES)),
                }
            }
            let q: [*const Q8Block; N] = std::array::from_fn(|n| a[n].add(i));
            // Two accumulators per token and set halve the chain of dependent `vpdpbusd`s.
            let mut acc = [[_mm512_setzero_si512(); 2]; N];
            let mut acc2 = [[_mm512_setzero_si512(); 2]; N];
            if NIB {
                let planes: [__m512i; PLANES] =
                    std::array::from_fn(|k| _mm512_loadu_si512(r.add(GROUP * QK / 2 + 64 * k) as *const _));
                for (step, spread) in spreads.iter().enumerate() {
                    let x = _mm512_loadu_si512(r.add(64 * step) as *const _);
                    let mut lo = _mm512_and_si512(x, low);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
                    for (plane, value) in planes.iter().zip(values) {
                        let bits = _mm512_shuffle_epi8(*plane, *spread);
                        lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(bits, low_bits), lo, value);
                        hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(bits, high_bits), hi, value);
                    }
                    let e = set_of(step);
                    for n in 0..N {
                        acc[n][e] = _mm512_dpbusd_epi32(acc[n][e], lo, quad(q[n], 2 * step));
                        acc2[n][e] = _mm512_dpbusd_epi32(acc2[n][e], hi, quad(q[n], 2 * step + 1));
                    }
                }
            } else {
                for pair in 0..4 {
                    let x0 = _mm512_loadu_si512(r.add(128 * pair) as *const _);
                    let x1 = _mm512_loadu_si512(r.add(128 * pair + 64) as *const _);
                    let e = set_of(pair);
                    for n in 0..N {
                        acc[n][e] = _mm512_dpbusd_epi32(acc[n][e], x0, quad(q[n], 2 * pair));
                        acc2[n][e] = _mm512_dpbusd_epi32(acc2[n][e], x1, quad(q[n], 2 * pair + 1));
                    }
                }
            }
            for e in 0..sets {
                let at = lb + 2 * GROUP * e;
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(r.add(at) as *const __m256i));
                let m = if MIN {
                    _mm512_cvtph_ps(_mm256_loadu_si256(r.add(at + 2 * GROUP * sets) as *const __m256i))
                } else {
                    d
                };
                for n in 0..N {
                    let qb = &*q[n];
                    let isum = if HALVES { qb.isum_of(16 * e..16 * e + 16) } else { qb.isum };
                    let sum = _mm512_add_epi32(acc[n][e], acc2[n][e]);
                    let sum = if zero != 0 { _mm512_sub_epi32(sum, _mm512_set1_epi32(zero * isum)) } else { sum };
                    res[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(qb.d)), res[n]);
                    if MIN {
                        let total = if EXACT { qb.d * isum as f32 } else { qb.s };
                        res[n] = _mm512_fmadd_ps(m, _mm512_set1_ps(total), res[n]);
                    }
                }
            }
        }
    }
    for (n, v) in res.iter().enumerate() {
        // SAFETY: `out` holds at least `N` rows of GROUP floats (caller's contract).
        unsafe { _mm512_storeu_ps((*out.add(n)).as_mut_ptr(), *v) };
    }
}

#[cfg(test)]
mod tests {
    use super::super::packed::tests::{self as packed_tests, TestResult};
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
}
