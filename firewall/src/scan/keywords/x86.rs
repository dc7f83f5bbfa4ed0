//! The AVX2 and AVX-512 loops of [`super::KeywordFinder`] (see the declaration in
//! `keywords.rs` for what each measured).

use std::arch::x86_64::*;

use super::{Filter, Key, Simd, BLOCK, FILTER_BITS, FOLD, HASH_MULTIPLIER};

/// Evaluates `$call` with `$fixed` bound to `$pairs` as an array of its length (up to
/// MAX_PAIRS, more than `KeywordFinder::build` accepts); `$otherwise` past that.
macro_rules! with_fixed_pairs {
    ($pairs:expr, $otherwise:expr, |$fixed:ident| $call:expr) => {
        match *$pairs {
            [] => {
                let $fixed: [Key; 0] = [];
                $call
            }
            [a] => {
                let $fixed = [a];
                $call
            }
            [a, b] => {
                let $fixed = [a, b];
                $call
            }
            [a, b, c] => {
                let $fixed = [a, b, c];
                $call
            }
            [a, b, c, d] => {
                let $fixed = [a, b, c, d];
                $call
            }
            _ => $otherwise,
        }
    };
}

/// The widest loop this CPU runs, capped by `CROSSGUARD_FIREWALL_SIMD=avx2` (or
/// `portable`): how a host with AVX-512 measures the loops an AVX2-only host runs.
pub(super) fn best() -> Simd {
    *BEST
}

static BEST: std::sync::LazyLock<Simd> =
    std::sync::LazyLock::new(|| capped(widest(), std::env::var(crate::SIMD_ENV).ok().as_deref()));

/// `cpu`, lowered to what `setting` names; an unknown setting changes nothing.
pub(super) fn capped(cpu: Simd, setting: Option<&str>) -> Simd {
    match setting {
        Some("avx2") => cpu.min(Simd::Avx2),
        Some("portable") => Simd::Portable,
        _ => cpu,
    }
}

fn widest() -> Simd {
    if is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vbmi")
    {
        Simd::Avx512
    } else if is_x86_feature_detected!("avx2") {
        Simd::Avx2
    } else {
        Simd::Portable
    }
}

/// Calls `each(at, passed)` for the steps that have a bit set (bit j: position at + j),
/// with the loop `simd` and then the narrower ones while their loads stay inside
/// `text`; returns where the portable loop goes on.
pub(super) fn scan(
    simd: Simd,
    filter: &Filter,
    pairs: &[Key],
    text: &[u8],
    each: &mut impl FnMut(usize, u32),
) -> usize {
    // A level above what the CPU has runs the loops it has (tests lower it, never raise it).
    let simd = simd.min(best());
    let mut at = 0;
    // The two-byte keywords go in as a fixed-size array, so that their compares
    // unroll: a loop over the slice cost eight instructions per AVX2 step for the
    // default rules' one such keyword, a sixth of a one-shot scan of clean prose.
    if simd >= Simd::Avx512 {
        // SAFETY: the AVX-512 features `best` checks are present.
        at = with_fixed_pairs!(pairs, at, |fixed| unsafe { scan_avx512(filter, fixed, text, at, each) });
    }
    if simd >= Simd::Avx2 {
        // SAFETY: AVX2 is present.
        at = with_fixed_pairs!(pairs, at, |fixed| unsafe { scan_avx2(filter, fixed, text, at, each) });
    }
    at
}

#[target_feature(enable = "avx2")]
unsafe fn scan_avx2<const PAIRS: usize>(
    filter: &Filter,
    pairs: [Key; PAIRS],
    text: &[u8],
    from: usize,
    each: &mut impl FnMut(usize, u32),
) -> usize {
    // Lane j (dword) gets bytes j..j+4 of the 16 loaded; the upper half of the
    // register holds a copy of the load, so its indices are the same bytes.
    let windows = _mm256_setr_epi8(
        0, 1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3, 4, 5, 6, 4, 5, 6, 7, 5, 6, 7, 8, 6, 7, 8, 9, 7, 8, 9, 10,
    );
    let fold = _mm256_set1_epi32(FOLD as i32);
    let low3 = _mm256_set1_epi32(0x00FF_FFFF);
    let low2 = _mm256_set1_epi32(0xFFFF);
    let mut at = from;
    while at + 16 <= text.len() {
        // SAFETY: at + 16 <= len: the unaligned 16-byte load stays inside `text`.
        let bytes = unsafe { _mm_loadu_si128(text.as_ptr().add(at).cast()) };
        let w = _mm256_or_si256(_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(bytes), windows), fold);
        // SAFETY: probe indexes the filter below FILTER_WORDS (see probe).
        let mut hit = unsafe { probe(filter, w, low3) };
        for p in pairs {
            hit = _mm256_or_si256(hit, _mm256_cmpeq_epi32(_mm256_and_si256(w, low2), _mm256_set1_epi32(p as i32)));
        }
        let passed = _mm256_movemask_ps(_mm256_castsi256_ps(hit)) as u32;
        if passed != 0 {
            each(at, passed);
        }
        at += BLOCK;
    }
    at
}

/// The filter bit of each lane's window, moved to the lane's sign bit.
///
/// SAFETY (caller: AVX2 present): the hash has FILTER_BITS bits, so the word index is
/// below `FILTER_WORDS`, the filter's length.
#[target_feature(enable = "avx2")]
unsafe fn probe(filter: &Filter, w: __m256i, low3: __m256i) -> __m256i {
    let key = _mm256_and_si256(w, low3);
    let mixed = _mm256_xor_si256(key, _mm256_srli_epi32::<11>(key));
    let h = _mm256_srli_epi32::<{ 32 - FILTER_BITS as i32 }>(_mm256_mullo_epi32(
        mixed,
        _mm256_set1_epi32(HASH_MULTIPLIER as i32),
    ));
    // SAFETY: see above; the gather reads 4-byte words of `filter` at those indices.
    let words = unsafe { _mm256_i32gather_epi32::<4>(filter.as_ptr().cast(), h) };
    // Bit (fourth byte & 31) to the sign: shift left by 31 - it.
    let bit = _mm256_and_si256(_mm256_srli_epi32::<24>(w), _mm256_set1_epi32(31));
    _mm256_sllv_epi32(words, _mm256_sub_epi32(_mm256_set1_epi32(31), bit))
}

/// Lane j (dword) of the permute takes bytes j..j+4 of the 32 loaded.
const WINDOWS_16: [u8; 64] = {
    let mut idx = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        idx[j] = (j / 4 + j % 4) as u8;
        j += 1;
    }
    idx
};

#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vbmi")]
unsafe fn scan_avx512<const PAIRS: usize>(
    filter: &Filter,
    pairs: [Key; PAIRS],
    text: &[u8],
    from: usize,
    each: &mut impl FnMut(usize, u32),
) -> usize {
    // SAFETY: WINDOWS_16 holds 64 bytes.
    let windows = unsafe { _mm512_loadu_si512(WINDOWS_16.as_ptr().cast()) };
    let fold = _mm512_set1_epi32(FOLD as i32);
    let low3 = _mm512_set1_epi32(0x00FF_FFFF);
    let low2 = _mm512_set1_epi32(0xFFFF);
    let multiplier = _mm512_set1_epi32(HASH_MULTIPLIER as i32);
    let bits = _mm512_set1_epi32(31);
    let mut at = from;
    while at + 32 <= text.len() {
        // SAFETY: at + 32 <= len: the unaligned 32-byte load stays inside `text`.
        let bytes = _mm512_castsi256_si512(unsafe { _mm256_loadu_si256(text.as_ptr().add(at).cast()) });
        let w = _mm512_or_si512(_mm512_permutexvar_epi8(windows, bytes), fold);
        // The hash of `probe`, sixteen lanes wide.
        let key = _mm512_and_si512(w, low3);
        let mixed = _mm512_xor_si512(key, _mm512_srli_epi32::<11>(key));
        let h = _mm512_srli_epi32::<{ 32 - FILTER_BITS }>(_mm512_mullo_epi32(mixed, multiplier));
        // SAFETY: the hash has FILTER_BITS bits: every index is inside the filter.
        let words = unsafe { _mm512_i32gather_epi32::<4>(h, filter.as_ptr().cast()) };
        let bit = _mm512_and_si512(_mm512_srli_epi32::<24>(w), bits);
        let mut passed = u32::from(_mm512_movepi32_mask(_mm512_sllv_epi32(words, _mm512_sub_epi32(bits, bit))));
        for p in pairs {
            passed |= u32::from(_mm512_cmpeq_epi32_mask(_mm512_and_si512(w, low2), _mm512_set1_epi32(p as i32)));
        }
        if passed != 0 {
            each(at, passed);
        }
        at += 2 * BLOCK;
    }
    at
}
