//! AVX2/FMA/F16C versions of the attention loops in `ops.rs`, chosen at run time.
//!
//! Owns only the vector bodies; `ops.rs` keeps the portable definitions and calls these
//! when the CPU has the features. `axpy` and `round_to_f16` give bit-identical results
//! (same operations per element; F16C rounds to nearest even like the `half` crate);
//! so does `dot`, which keeps the portable loop's order of summation.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Whether this CPU runs the functions below.
#[inline]
fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `Σ a[i] * b[i]` over the common length, or `None` without the features.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> Option<f32> {
    if !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let n = a.len().min(b.len());
        // SAFETY: the features were detected above; both slices hold at least `n` values.
        Some(unsafe { dot_avx2(a.as_ptr(), b.as_ptr(), n) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `y += alpha * x` over the common length; `false` without the features.
#[inline]
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let n = x.len().min(y.len());
        // SAFETY: the features were detected above; both slices hold at least `n` values.
        unsafe { axpy_avx2(alpha, x.as_ptr(), y.as_mut_ptr(), n) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Rounds every value to f16 precision in place; `false` without the features.
#[inline]
pub fn round_to_f16(x: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the pointer covers `x.len()` values.
        unsafe { round_to_f16_f16c(x.as_mut_ptr(), x.len()) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: *const f32, b: *const f32, n: usize) -> f32 {
    // The portable loop's exact order: eight lanes, multiply then add, chunk after
    // chunk, lanes summed first to last, the tail last. Attention scores are rounded to
    // f16 next, where any other order can move one across a rounding boundary.
    let mut acc = _mm256_setzero_ps();
    let chunks = n / 8;
    let mut lanes = [0.0f32; 8];
    // SAFETY (whole body): every load reads `[8c, 8c + 8)` with `c < n / 8`, or single
    // values below `n` (caller's contract).
    unsafe {
        for c in 0..chunks {
            acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(a.add(8 * c)), _mm256_loadu_ps(b.add(8 * c))));
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let tail: f32 = (8 * chunks..n).map(|i| *a.add(i) * *b.add(i)).sum();
        lanes.iter().sum::<f32>() + tail
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn axpy_avx2(alpha: f32, x: *const f32, y: *mut f32, n: usize) {
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    // SAFETY (whole body): accesses stay below `n` (caller's contract).
    unsafe {
        while i + 8 <= n {
            // Multiply then add (not fused), as the portable loop rounds.
            let v = _mm256_add_ps(_mm256_loadu_ps(y.add(i)), _mm256_mul_ps(va, _mm256_loadu_ps(x.add(i))));
            _mm256_storeu_ps(y.add(i), v);
            i += 8;
        }
        while i < n {
            *y.add(i) += alpha * *x.add(i);
            i += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn round_to_f16_f16c(x: *mut f32, n: usize) {
    let mut i = 0;
    // SAFETY (whole body): accesses stay below `n` (caller's contract).
    unsafe {
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.add(i)));
            _mm256_storeu_ps(x.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        while i < n {
            *x.add(i) = half::f16::from_f32(*x.add(i)).to_f32();
            i += 1;
        }
    }
}
