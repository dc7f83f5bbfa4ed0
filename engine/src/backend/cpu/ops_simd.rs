//! AVX2/FMA/F16C twins of the attention loops in `attention.rs` (softmax moments
//! included), of `ops::round_to_f16` and of `quant::quantize_q8`, chosen at run time.
//! Where AVX-512 runs, the two loops that dominate prefill's attention (key scores, value
//! sums) take 16 lanes per instruction for their whole vectors, and the 8-lane loops
//! finish.
//!
//! Owns only the vector bodies; the portable definitions stay with their callers, which
//! call these when the CPU has the features. Every function here is bit-identical to its
//! portable twin: the same operations per element in the same order (multiply then add,
//! never fused), F16C rounding to nearest even like the `half` crate.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::attention::{self, EXP_CONSTANTS, LANES};
#[cfg(target_arch = "x86_64")]
use super::quant;
use super::quant::Q8Block;

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

/// Whether the 16-lane loops run too.
#[cfg(target_arch = "x86_64")]
#[inline]
fn wide() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// Head sizes up to which the last partial vector of scores is padded on the stack.
#[cfg(target_arch = "x86_64")]
const MAX_PADDED_HEAD: usize = 256;

/// [`attention::key_scores`] for the positions of `out`, which the caller has checked
/// `keys` holds; `false` without the features.
#[inline]
pub fn key_scores(q: &[f32], keys: &[f16], stride: usize, scale: f32, out: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: the features were detected above; the caller checked that `keys` holds
        // `(q.len() - 1) * stride + out.len()` values and `out.len() <= stride`.
        let keys_at = keys.as_ptr().cast::<u16>();
        // SAFETY: AVX-512F was detected; the same checked range as below.
        let wide = if wide() { unsafe { key_scores_avx512(q, keys_at, stride, scale, out) } } else { 0 };
        // SAFETY: as above, from position `wide` on (`out[wide..]` is within `stride`).
        let whole = wide + unsafe { key_scores_avx2(q, keys_at.add(wide), stride, scale, &mut out[wide..]) };
        let rest = out.len() - whole;
        if rest > 0 && q.len() <= MAX_PADDED_HEAD {
            // The last partial vector (decode's newest block): copy its positions into a
            // zero-padded `[head_dim, 8]` tile, never reading past the readable ones.
            let mut tile = [f16::ZERO; MAX_PADDED_HEAD * LANES];
            for (d, row) in tile.chunks_exact_mut(LANES).take(q.len()).enumerate() {
                row[..rest].copy_from_slice(&keys[d * stride + whole..d * stride + whole + rest]);
            }
            let mut scores = [0.0f32; LANES];
            // SAFETY: as above; the tile holds `q.len()` rows of 8 values (stride 8).
            unsafe { key_scores_avx2(q, tile.as_ptr().cast::<u16>(), LANES, scale, &mut scores) };
            out[whole..].copy_from_slice(&scores[..rest]);
        } else {
            attention::key_scores_portable(q, keys, stride, scale, out, whole);
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (q, keys, stride, scale, out);
        false
    }
}

/// [`attention::accumulate_values`] over rows the caller has checked `values` holds;
/// `false` without the features.
#[inline]
pub fn accumulate_values(probs: &[f32], values: &[f16], stride: usize, out: &mut [f32]) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let vectors = out.len() / LANES * LANES;
        let (head, tail) = out.split_at_mut(vectors);
        // SAFETY: the features were detected above; the caller checked that `values`
        // holds `(probs.len() - 1) * stride + out.len()` values.
        unsafe {
            let values_at = values.as_ptr().cast::<u16>();
            // The 16-lane loop takes whole spans of 64 dimensions, the 8-lane one the rest.
            let wide = if wide() { head.len() / (4 * WIDE) * (4 * WIDE) } else { 0 };
            let (spans, rest) = head.split_at_mut(wide);
            if !spans.is_empty() {
                accumulate_values_avx512(probs, values_at, stride, spans);
            }
            accumulate_values_avx2(probs, values_at.add(wide), stride, rest);
        }
        if !tail.is_empty() {
            let rest = values.get(vectors..).unwrap_or(&[]);
            attention::accumulate_values_portable(probs, rest, stride, tail);
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (probs, values, stride, out);
        false
    }
}

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

/// Defines a key-score loop over whole vectors of `$width` positions, one function per
/// vector width with its intrinsics: each position gets the same eight lane sums over the
/// dimensions, added in the same order, whatever the width.
#[cfg(target_arch = "x86_64")]
macro_rules! key_scores_loop {
    ($(#[$doc:meta])* $name:ident, $features:literal, $width:expr, $zero:ident, $set1:ident, $add:ident, $mul:ident, $load:ident, $store:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(q: &[f32], keys: *const u16, stride: usize, scale: f32, out: &mut [f32]) -> usize {
            let hd = q.len();
            let chunks = hd / LANES;
            let whole = out.len() / $width * $width;
            let vscale = $set1(scale);
            for p0 in (0..whole).step_by($width) {
                let mut acc = [$zero(); LANES];
                // SAFETY (whole body): every load reads `$width` keys from
                // `d * stride + p0` with `d < hd` and `p0 + $width <= out.len()`, inside
                // the caller's checked range.
                unsafe {
                    let at = keys.add(p0);
                    for c in 0..chunks {
                        for (l, a) in acc.iter_mut().enumerate() {
                            let d = LANES * c + l;
                            *a = $add(*a, $mul($set1(q[d]), $load(at.add(d * stride))));
                        }
                    }
                    // Lane sums added first to last, then the tail dimensions in order.
                    let mut sum = acc[0];
                    for a in &acc[1..] {
                        sum = $add(sum, *a);
                    }
                    let mut tail = $zero();
                    for (d, qd) in q.iter().enumerate().skip(LANES * chunks) {
                        tail = $add(tail, $mul($set1(*qd), $load(at.add(d * stride))));
                    }
                    if chunks * LANES < hd {
                        sum = $add(sum, tail);
                    }
                    $store(out.as_mut_ptr().add(p0), $mul(sum, vscale));
                }
            }
            whole
        }
    };
}

key_scores_loop!(
    /// Scores of the leading positions of `out` in whole vectors of 8; returns how many
    /// positions it scored (the caller finishes the rest with the portable loop).
    key_scores_avx2, "avx2,fma,f16c", LANES, _mm256_setzero_ps, _mm256_set1_ps, _mm256_add_ps, _mm256_mul_ps, load8, _mm256_storeu_ps
);

/// Lanes of an AVX-512 vector.
#[cfg(target_arch = "x86_64")]
const WIDE: usize = 16;

key_scores_loop!(
    /// [`key_scores_avx2`] 16 positions at a time. Returns how many positions it scored.
    key_scores_avx512, "avx512f", WIDE, _mm512_setzero_ps, _mm512_set1_ps, _mm512_add_ps, _mm512_mul_ps, load16, _mm512_storeu_ps
);

/// [`accumulate_values_avx2`] for `out.len()` a multiple of 64: four 16-lane vectors of
/// dimensions held in registers across all positions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn accumulate_values_avx512(probs: &[f32], values: *const u16, stride: usize, out: &mut [f32]) {
    const M: usize = 4;
    let mut d0 = 0;
    // SAFETY (whole body): dimensions `d0..d0 + 64 <= out.len()` of rows `p <
    // probs.len()`, inside the caller's checked range.
    unsafe {
        while d0 + M * WIDE <= out.len() {
            let (row0, o) = (values.add(d0), out.as_mut_ptr().add(d0));
            let mut acc: [__m512; M] = std::array::from_fn(|j| _mm512_loadu_ps(o.add(WIDE * j)));
            for (p, w) in probs.iter().enumerate() {
                let w = _mm512_set1_ps(*w);
                let row = row0.add(p * stride);
                for (j, a) in acc.iter_mut().enumerate() {
                    // Multiply then add (not fused), as the portable loop rounds.
                    *a = _mm512_add_ps(*a, _mm512_mul_ps(w, load16(row.add(WIDE * j))));
                }
            }
            for (j, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(o.add(WIDE * j), *a);
            }
            d0 += M * WIDE;
        }
    }
}

/// 16 f16 values from `at` as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load16(at: *const u16) -> __m512 {
    // SAFETY: the caller passes a pointer to 16 readable values.
    unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(at.cast::<__m256i>())) }
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
            let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
            let mut sums = [0i32; LANES];
            _mm256_storeu_si256(sums.as_mut_ptr().cast(), sum);
            let isum: i32 = sums.iter().sum();
            let bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            _mm256_storeu_si256(block.qs.as_mut_ptr().cast(), _mm256_permutevar8x32_epi32(bytes, order));
            block.d = quant::round_f16(d);
            block.s = quant::round_f16(d * isum as f32);
            block.isum = isum;
        }
    }
}

/// `out[d] += Σ_p probs[p] * values[p * stride + d]` with `out.len()` a multiple of 8:
/// 64 dimensions at a time held in registers across all positions, then 8 at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate_values_avx2(probs: &[f32], values: *const u16, stride: usize, out: &mut [f32]) {
    let mut d0 = 0;
    // SAFETY: dimensions `d0..d0 + 8 * M <= out.len()` of rows `p < probs.len()`, inside
    // the caller's checked range.
    unsafe {
        while d0 + 8 * LANES <= out.len() {
            values_span::<LANES>(probs, values.add(d0), stride, out.as_mut_ptr().add(d0));
            d0 += 8 * LANES;
        }
        while d0 + LANES <= out.len() {
            values_span::<1>(probs, values.add(d0), stride, out.as_mut_ptr().add(d0));
            d0 += LANES;
        }
    }
}

/// `attention::exp_nonpositive` on 8 lanes, operation for operation.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let k = &EXP_CONSTANTS;
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(x, _mm256_set1_ps(k.log2e)));
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k.ln2_hi), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-k.ln2_lo), r);
    let mut p = _mm256_set1_ps(k.poly[0]);
    for c in &k.poly[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
    }
    let y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0));
    let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
    // NaN and everything below the floor (masked positions: -inf) give 0.
    let live = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(attention::EXP_MIN));
    _mm256_and_ps(_mm256_mul_ps(y, pow2), live)
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

/// 8 f16 values from `at` as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(at: *const u16) -> __m256 {
    // SAFETY: the caller passes a pointer to 8 readable values.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast::<__m128i>())) }
}

/// `M` vectors of 8 dimensions of the weighted value sum, kept in registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_span<const M: usize>(probs: &[f32], values: *const u16, stride: usize, out: *mut f32) {
    // SAFETY (whole body): `out` holds `8 * M` floats and `values` rows `p < probs.len()`
    // hold `8 * M` values from here (caller's contract).
    unsafe {
        let mut acc: [__m256; M] = std::array::from_fn(|j| _mm256_loadu_ps(out.add(LANES * j)));
        for (p, w) in probs.iter().enumerate() {
            let w = _mm256_set1_ps(*w);
            let row = values.add(p * stride);
            for (j, a) in acc.iter_mut().enumerate() {
                let v = load8(row.add(LANES * j));
                // Multiply then add (not fused), as the portable loop rounds.
                *a = _mm256_add_ps(*a, _mm256_mul_ps(w, v));
            }
        }
        for (j, a) in acc.iter().enumerate() {
            _mm256_storeu_ps(out.add(LANES * j), *a);
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
