//! Row operations' vector bodies: softmax (and its moments), the shifted exponential,
//! SwiGLU, q8 quantization and f16 rounding.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::super::attention::{self, EXP_CONSTANTS, LANES};
#[cfg(target_arch = "x86_64")]
use super::super::quant;
use super::super::quant::Q8Block;
use super::available;

/// [`attention::softmax_f16`]; `false` without the features.
#[inline]
pub fn softmax_f16(x: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the body stays inside `x`.
        unsafe { softmax_f16_avx2(x) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = x;
        false
    }
}

/// [`ops::swiglu`](super::super::ops::swiglu); `false` without the features.
#[inline]
pub fn swiglu(gate: &mut [f32], up: &[f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the body stays inside both slices.
        unsafe { swiglu_avx2(gate, up) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (gate, up);
        false
    }
}

/// [`attention::exp_shifted`]; `false` without the features.
#[inline]
pub fn exp_shifted(x: &mut [f32], scale: f32) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the body stays inside `x`.
        unsafe { exp_shifted_avx2(x, scale) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, scale);
        false
    }
}

/// [`attention::softmax_moments`]; `None` without the features.
#[inline]
pub fn softmax_moments(x: &[f32]) -> Option<(f32, f64, f64)> {
    if !available() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the body stays inside `x`.
        Some(unsafe { softmax_moments_avx2(x) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = x;
        None
    }
}

/// [`quant::quantize_q8`] (`x.len()` a multiple of 32); `false` without the features.
#[inline]
pub fn quantize_q8(x: &[f32], out: &mut [Q8Block]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the body reads whole blocks of `x`.
        unsafe { quantize_q8_avx2(x, out) };
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (x, out);
        false
    }
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

/// [`quant::quantize_q8_portable`] block by block, operation for operation: the absolute
/// maximum (NaN ignored, as `f32::max` does), the same scalar scales, then `x * id`
/// rounded by the same two additions. Before the conversion NaN becomes 0 and the rest is
/// clamped to [-128, 127], which is what `as i8` does with them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_q8_avx2(x: &[f32], out: &mut [Q8Block]) {
    let (sign, magic) = (_mm256_set1_ps(-0.0), _mm256_set1_ps(quant::ROUNDING_MAGIC));
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    // Bytes of `packs` come out as dwords 0, 4, 1, 5, ... of the four vectors.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (chunk, block) in x.chunks_exact(quant::QK).zip(out.iter_mut()) {
        // SAFETY: `chunk` holds 32 floats: four loads of 8; `qs` holds 32 bytes.
        unsafe {
            let p = chunk.as_ptr();
            let v = [0, 1, 2, 3].map(|i| _mm256_loadu_ps(p.add(LANES * i)));
            // `max(abs, acc)` keeps `acc` when `abs` is NaN.
            let m = v.iter().fold(_mm256_setzero_ps(), |m, v| _mm256_max_ps(_mm256_andnot_ps(sign, *v), m));
            let mut lanes = [0.0f32; LANES];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let amax = lanes.iter().fold(0.0f32, |a, l| a.max(*l));
            let d = amax / 127.0;
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let vid = _mm256_set1_ps(id);
            let q = v.map(|v| {
                let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, vid), magic), magic);
                let r = _mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r));
                _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi))
            });
            // Elements 0..16 are vectors 0 and 1.
            let (lo, hi) = (_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let mut sums = [[0i32; LANES]; 2];
            _mm256_storeu_si256(sums[0].as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(sums[1].as_mut_ptr().cast(), hi);
            let isum_lo: i32 = sums[0].iter().sum();
            let isum = isum_lo + sums[1].iter().sum::<i32>();
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(bytes, order));
            block.d = quant::round_f16(d);
            block.s = quant::round_f16(d * isum as f32);
            block.isum = isum;
            block.isum_lo = isum_lo;
        }
    }
}

/// `attention::exp_nonpositive` on 8 lanes, operation for operation.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let k = &EXP_CONSTANTS;
    let n =
        _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(k.log2e)));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k.ln2_hi), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k.ln2_lo), r);
    let mut p = _mm256_set1_ps(k.poly[0]);
    for c in &k.poly[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let pow2 =
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    // NaN and everything below the floor (masked positions: -inf) give 0.
    let live = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(attention::EXP_MIN));
    _mm256_and_ps(_mm256_mul_ps(y, pow2), live)
}

/// `ops::silu(gate) * up` on 8 lanes, operation for operation, then the tail portably.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let whole = n / LANES * LANES;
    let (g, u) = (gate.as_mut_ptr(), up.as_ptr());
    // SAFETY (whole body): vector accesses cover `[i, i + 8)` with `i + 8 <= whole <= n`.
    unsafe {
        let (one, sign, zero) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0), _mm256_setzero_ps());
        for i in (0..whole).step_by(LANES) {
            let x = _mm256_loadu_ps(g.add(i));
            // `-|x|`: the sign bit set.
            let e = exp8(_mm256_or_ps(x, sign));
            let s = _mm256_blendv_ps(e, one, _mm256_cmp_ps::<_CMP_GE_OQ>(x, zero));
            let silu = _mm256_div_ps(_mm256_mul_ps(x, s), _mm256_add_ps(one, e));
            _mm256_storeu_ps(g.add(i), _mm256_mul_ps(silu, _mm256_loadu_ps(u.add(i))));
        }
    }
    super::super::ops::swiglu_portable(&mut gate[whole..n], &up[whole..n]);
}

/// Softmax rounded to f16, in the portable twin's order: max, exponentials summed in 8
/// lanes (the tail after them), scaled by the inverse sum, rounded with F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_f16_avx2(x: &mut [f32]) {
    let whole = x.len() / LANES * LANES;
    let ptr = x.as_mut_ptr();
    // SAFETY (whole body): vector accesses cover `[i, i + 8)` with `i + 8 <= whole`.
    unsafe {
        let max = max_avx2(x);
        let mut lanes = [0.0f32; LANES];
        let (vm, mut acc) = (_mm256_set1_ps(max), _mm256_setzero_ps());
        for i in (0..whole).step_by(LANES) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(ptr.add(i)), vm));
            _mm256_storeu_ps(ptr.add(i), e);
            acc = _mm256_add_ps(acc, e);
        }
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        let mut sum = lanes.iter().sum::<f32>();
        for v in &mut x[whole..] {
            *v = attention::exp_nonpositive(*v - max);
            sum += *v;
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        let vinv = _mm256_set1_ps(inv);
        for i in (0..whole).step_by(LANES) {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(_mm256_loadu_ps(ptr.add(i)), vinv));
            _mm256_storeu_ps(ptr.add(i), _mm256_cvtph_ps(h));
        }
        for v in &mut x[whole..] {
            *v = f16::from_f32(*v * inv).to_f32();
        }
    }
}

/// The maximum of `x` (whole vectors, then the lanes and the tail).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn max_avx2(x: &[f32]) -> f32 {
    let whole = x.len() / LANES * LANES;
    // SAFETY: vector loads cover `[i, i + 8)` with `i + 8 <= whole`.
    unsafe {
        let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..whole).step_by(LANES) {
            vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x.as_ptr().add(i)));
        }
        let mut lanes = [0.0f32; LANES];
        _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
        lanes.iter().chain(&x[whole..]).fold(f32::NEG_INFINITY, |m, v| m.max(*v))
    }
}

/// `x = exp((x - max) * scale)`, the portable twin's operations lane by lane.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp_shifted_avx2(x: &mut [f32], scale: f32) {
    let whole = x.len() / LANES * LANES;
    // SAFETY (whole body): vector accesses cover `[i, i + 8)` with `i + 8 <= whole`.
    unsafe {
        let max = max_avx2(x);
        let (vm, vs, ptr) = (_mm256_set1_ps(max), _mm256_set1_ps(scale), x.as_mut_ptr());
        for i in (0..whole).step_by(LANES) {
            let d = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(ptr.add(i)), vm), vs);
            _mm256_storeu_ps(ptr.add(i), exp8(d));
        }
        for v in &mut x[whole..] {
            *v = attention::exp_nonpositive((*v - max) * scale);
        }
    }
}

/// Softmax moments in the portable twin's order: max, then per run of `MOMENT_FLUSH`
/// whole vectors eight lane sums moved into f64 lane after lane, then the tail.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn softmax_moments_avx2(x: &[f32]) -> (f32, f64, f64) {
    let whole = x.len() / LANES * LANES;
    let ptr = x.as_ptr();
    // SAFETY (whole body): vector loads cover `[i, i + 8)` with `i + 8 <= whole`.
    unsafe {
        let max = max_avx2(x);
        let mut lanes = [0.0f32; LANES];
        let (vm, floor) = (_mm256_set1_ps(max), _mm256_set1_ps(attention::EXP_MIN));
        let (mut z, mut zl) = (0.0f64, 0.0f64);
        let mut run = 0;
        while run < whole {
            let end = (run + attention::MOMENT_FLUSH).min(whole);
            let (mut az, mut azl) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in (run..end).step_by(LANES) {
                let d = _mm256_sub_ps(_mm256_loadu_ps(ptr.add(i)), vm);
                let e = exp8(d);
                az = _mm256_add_ps(az, e);
                azl = _mm256_add_ps(azl, _mm256_mul_ps(e, _mm256_max_ps(d, floor)));
            }
            let mut lz = [0.0f32; LANES];
            _mm256_storeu_ps(lz.as_mut_ptr(), az);
            _mm256_storeu_ps(lanes.as_mut_ptr(), azl);
            for l in 0..LANES {
                z += f64::from(lz[l]);
                zl += f64::from(lanes[l]);
            }
            run = end;
        }
        for v in &x[whole..] {
            let d = *v - max;
            let e = attention::exp_nonpositive(d);
            z += f64::from(e);
            zl += f64::from(e * d.max(attention::EXP_MIN));
        }
        (max, z, zl)
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
