//! AVX-512 VNNI kernel over the interleaved layout (`packed.rs`): 16 weight rows, one per
//! 32-bit lane, against up to `packed::MAX_TILE` activation rows.
//!
//! Each 64-byte load of levels feeds `vpdpbusd` once per activation row (twice for the
//! nibble formats: low and high nibbles), with 4 activation bytes broadcast from memory,
//! so batched prefill unpacks each weight step once for all tokens of the tile and decode
//! runs the same code with one. Per block, the integer sums become f32 with one
//! multiply-add per token against the 16 rows' scales. It reads the plain layouts; the
//! extended ones (`Scheme::extended`: two sets of scales, fifth-bit planes) are sent to the
//! AVX2 body, which every AVX-512 host also runs.
//!
//! Invariants: reached only through [`kernel`], which checks that the CPU has the features, and
//! `SimdKernel::call`, which checks the lengths. With AVX-512F/BW and VNNI; results equal `packed::dot_group_scalar` up to float
//! summation order (the integer part is exact).
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::packed::{Scheme, GROUP, MAX_TILE};
use super::packed::SimdKernel;
#[cfg(target_arch = "x86_64")]
use super::quant::Q8Block;

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
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni") {
        let raw = if streamed { dispatch::<true> } else { dispatch::<false> };
        // SAFETY: the features `dispatch` is compiled for were just detected. The extended
        // layouts (two sets of scales: Q2_K, Q3_K, Q6_K; fifth-bit planes: Q5_0, Q5_1,
        // Q5_K) take the AVX2 kernel.
        return Some(unsafe { SimdKernel::new(raw) }.with_extended_from(super::avx2::kernel(streamed)));
    }
    let _ = streamed;
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dispatch<const STREAMED: bool>(s: Scheme, g: *const u8, blocks: usize, a: [*const Q8Block; MAX_TILE], n: usize, out: *mut [f32; GROUP]) {
    // SAFETY (whole body): forwarded from `SimdKernel::call`'s checked contract.
    unsafe {
        macro_rules! by_n {
            ($nib:expr, $min:expr, $exact:expr) => {
                match n {
                    1 => tile::<$nib, $min, $exact, 1, STREAMED>(g, blocks, s.zero, [a[0]], out),
                    2 => tile::<$nib, $min, $exact, 2, STREAMED>(g, blocks, s.zero, [a[0], a[1]], out),
                    3 => tile::<$nib, $min, $exact, 3, STREAMED>(g, blocks, s.zero, [a[0], a[1], a[2]], out),
                    _ => tile::<$nib, $min, $exact, 4, STREAMED>(g, blocks, s.zero, a, out),
                }
            };
        }
        // One set of scales per record (`SimdKernel::call_rows` sends no other here).
        match (s.nibbles, s.min, s.exact_min) {
            (true, true, false) => by_n!(true, true, false),
            (true, true, true) => by_n!(true, true, true),
            (true, false, _) => by_n!(true, false, false),
            (false, true, false) => by_n!(false, true, false),
            (false, true, true) => by_n!(false, true, true),
            (false, false, _) => by_n!(false, false, false),
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

/// One group of [`GROUP`] rows against `N` activation rows, `EXACT`: minimums times
/// `d * isum` (see `Scheme`); see `SimdKernel::call` (and [`kernel`] for `STREAMED`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const NIB: bool, const MIN: bool, const EXACT: bool, const N: usize, const STREAMED: bool>(
    g: *const u8,
    blocks: usize,
    zero: i32,
    a: [*const Q8Block; N],
    out: *mut [f32; GROUP],
) {
    let scheme = Scheme { nibbles: NIB, planes: 0, zero, min: MIN, halves: false, exact_min: EXACT };
    let (rec, lb) = (scheme.record_bytes(), scheme.levels_bytes());
    let low = _mm512_set1_epi8(0x0f);
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
            // Two accumulators per token halve the chain of dependent `vpdpbusd`s.
            let mut acc = [_mm512_setzero_si512(); N];
            let mut acc2 = [_mm512_setzero_si512(); N];
            if NIB {
                for step in 0..4 {
                    let x = _mm512_loadu_si512(r.add(64 * step) as *const _);
                    let lo = _mm512_and_si512(x, low);
                    let hi = _mm512_and_si512(_mm512_srli_epi16(x, 4), low);
                    for n in 0..N {
                        acc[n] = _mm512_dpbusd_epi32(acc[n], lo, quad(q[n], 2 * step));
                        acc2[n] = _mm512_dpbusd_epi32(acc2[n], hi, quad(q[n], 2 * step + 1));
                    }
                }
            } else {
                for pair in 0..4 {
                    let x0 = _mm512_loadu_si512(r.add(128 * pair) as *const _);
                    let x1 = _mm512_loadu_si512(r.add(128 * pair + 64) as *const _);
                    for n in 0..N {
                        acc[n] = _mm512_dpbusd_epi32(acc[n], x0, quad(q[n], 2 * pair));
                        acc2[n] = _mm512_dpbusd_epi32(acc2[n], x1, quad(q[n], 2 * pair + 1));
                    }
                }
            }
            for n in 0..N {
                acc[n] = _mm512_add_epi32(acc[n], acc2[n]);
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(r.add(lb) as *const __m256i));
            let m = if MIN { _mm512_cvtph_ps(_mm256_loadu_si256(r.add(lb + 2 * GROUP) as *const __m256i)) } else { d };
            for n in 0..N {
                let qb = &*q[n];
                let sum = if zero != 0 { _mm512_sub_epi32(acc[n], _mm512_set1_epi32(zero * qb.isum)) } else { acc[n] };
                res[n] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, _mm512_set1_ps(qb.d)), res[n]);
                if MIN {
                    let total = if EXACT { qb.d * qb.isum as f32 } else { qb.s };
                    res[n] = _mm512_fmadd_ps(m, _mm512_set1_ps(total), res[n]);
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
