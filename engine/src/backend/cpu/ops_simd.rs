//! AVX2/FMA/F16C twins of the attention loops in `attention.rs` (softmax moments
//! included), of `ops::round_to_f16` and of `quant::quantize_q8`, chosen at run time.
//! The key-score and value-sum loops take the query heads that share a KV head together
//! (up to three per pass), so that each f16 key and value is loaded and converted once
//! for all of them; where AVX-512 runs they take 16 lanes per instruction for their whole
//! vectors, and the 8-lane loops finish.
//!
//! Owns only the vector bodies; the portable definitions stay with their callers, which
//! call these when the CPU has the features. Every function here is bit-identical to its
//! portable twin: the same operations per element in the same order (attention's products
//! fused with their sums, `f32::mul_add` in the portable loops), F16C rounding to nearest
//! even like the `half` crate.
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

/// Query heads one pass of the group kernels takes: their sums stay in registers (for
/// scores, a lane sum and a total per head and vector of positions: twelve of AVX2's
/// sixteen registers for three heads and two vectors); larger groups go in chunks of this.
#[cfg(target_arch = "x86_64")]
const MAX_GROUP: usize = 3;

/// [`attention::group_key_scores`] for positions `0..n`, which the caller has checked
/// `keys` holds and every head's row of `out` has room for; `false` without the features.
#[allow(clippy::too_many_arguments)]
#[inline]
pub fn group_key_scores(
    q: &[f32],
    hd: usize,
    keys: &[f16],
    stride: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
    n: usize,
) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let heads = q.len() / hd;
        for h0 in (0..heads).step_by(MAX_GROUP) {
            let (qs, at) = (&q[h0 * hd..(h0 + MAX_GROUP).min(heads) * hd], h0 * out_stride);
            // SAFETY: the features were detected above; the caller checked that `keys`
            // holds `(hd - 1) * stride + n` values, `n <= stride`, and that `out` holds
            // `n` positions at `h * out_stride` for every head.
            unsafe {
                match qs.len() / hd {
                    1 => scores_chunk::<1>(qs, hd, keys, stride, scale, &mut out[at..], out_stride, n),
                    2 => scores_chunk::<2>(qs, hd, keys, stride, scale, &mut out[at..], out_stride, n),
                    _ => scores_chunk::<3>(qs, hd, keys, stride, scale, &mut out[at..], out_stride, n),
                }
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (q, hd, keys, stride, scale, out, out_stride, n);
        false
    }
}

/// The scores of `H` heads: 16 positions at a time (one 16-lane vector with AVX-512, two
/// 8-lane ones without), then 8, then the last partial vector from a zero-padded copy.
/// Safety: as [`group_key_scores`], with `q` holding exactly `H` heads.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_chunk<const H: usize>(
    q: &[f32],
    hd: usize,
    keys: &[f16],
    stride: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
    n: usize,
) {
    let (k, o) = (keys.as_ptr().cast::<u16>(), out.as_mut_ptr());
    let mut p = 0;
    // SAFETY (whole body): every kernel call scores positions `p..p + width <= n`, inside
    // the caller's checked ranges of `keys` and `out`.
    unsafe {
        if wide() {
            while p + WIDE <= n {
                group_scores_avx512::<H>(q.as_ptr(), hd, k.add(p), stride, scale, o.add(p), out_stride);
                p += WIDE;
            }
        }
        while p + 2 * LANES <= n {
            group_scores_avx2::<H, 2>(q.as_ptr(), hd, k.add(p), stride, scale, o.add(p), out_stride);
            p += 2 * LANES;
        }
        if p + LANES <= n {
            group_scores_avx2::<H, 1>(q.as_ptr(), hd, k.add(p), stride, scale, o.add(p), out_stride);
            p += LANES;
        }
    }
    let rest = n - p;
    if rest == 0 {
        return;
    }
    if hd <= MAX_PADDED_HEAD {
        // The last partial vector (decode's newest block): copy its positions into a
        // zero-padded `[hd, 8]` tile, never reading past the readable ones.
        let mut tile = [f16::ZERO; MAX_PADDED_HEAD * LANES];
        for (d, row) in tile.chunks_exact_mut(LANES).take(hd).enumerate() {
            row[..rest].copy_from_slice(&keys[d * stride + p..d * stride + n]);
        }
        let mut scores = [0.0f32; MAX_GROUP * LANES];
        // SAFETY: the tile holds `hd` rows of 8 values (stride 8); `scores` holds 8
        // positions of each of the `H <= MAX_GROUP` heads at stride 8.
        unsafe {
            group_scores_avx2::<H, 1>(
                q.as_ptr(),
                hd,
                tile.as_ptr().cast::<u16>(),
                LANES,
                scale,
                scores.as_mut_ptr(),
                LANES,
            )
        };
        for h in 0..H {
            out[h * out_stride + p..h * out_stride + n].copy_from_slice(&scores[h * LANES..h * LANES + rest]);
        }
    } else {
        for (h, qh) in q.chunks_exact(hd).enumerate() {
            attention::key_scores_portable(qh, keys, stride, scale, &mut out[h * out_stride..h * out_stride + n], p);
        }
    }
}

/// [`attention::group_accumulate_values`] over positions `0..n`, whose rows the caller
/// has checked `values` holds and whose weights every head's row of `probs` holds;
/// `false` without the features.
#[inline]
pub fn group_accumulate_values(
    probs: &[f32],
    probs_stride: usize,
    n: usize,
    values: &[f16],
    stride: usize,
    out: &mut [f32],
    hd: usize,
) -> bool {
    if !available() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let heads = out.len() / hd;
        let vectors = hd / LANES * LANES;
        let v = values.as_ptr().cast::<u16>();
        for h0 in (0..heads).step_by(MAX_GROUP) {
            let count = MAX_GROUP.min(heads - h0);
            let (w, o) = (probs[h0 * probs_stride..].as_ptr(), out[h0 * hd..].as_mut_ptr());
            // SAFETY: the features were detected above; dimensions `d < vectors <= hd` of
            // rows `p < n`, weights `h * probs_stride + p` and outputs `h * hd + d` of
            // heads `h < count`, all inside the caller's checked ranges.
            unsafe {
                match count {
                    1 => values_chunk::<1>(w, probs_stride, n, v, stride, o, hd, vectors),
                    2 => values_chunk::<2>(w, probs_stride, n, v, stride, o, hd, vectors),
                    _ => values_chunk::<3>(w, probs_stride, n, v, stride, o, hd, vectors),
                }
            }
            if vectors < hd {
                // The dimensions past the last whole vector, head by head.
                let rest = values.get(vectors..).unwrap_or(&[]);
                for h in h0..h0 + count {
                    let weights = &probs[h * probs_stride..h * probs_stride + n];
                    attention::accumulate_values_portable(
                        weights,
                        rest,
                        stride,
                        &mut out[h * hd + vectors..(h + 1) * hd],
                    );
                }
            }
        }
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (probs, probs_stride, n, values, stride, out, hd);
        false
    }
}

/// The weighted value sums of `H` heads over dimensions `0..vectors` (a multiple of 8):
/// spans of 64 in 16-lane vectors with AVX-512, then as many 8-lane vectors per pass as
/// the heads' sums leave registers for, then 8 at a time.
/// Safety: as [`group_accumulate_values`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn values_chunk<const H: usize>(
    w: *const f32,
    ws: usize,
    n: usize,
    v: *const u16,
    stride: usize,
    o: *mut f32,
    hd: usize,
    vectors: usize,
) {
    let mut d = 0;
    // SAFETY (whole body): each call covers dimensions `d..d + width <= vectors`.
    unsafe {
        if wide() {
            while d + 4 * WIDE <= vectors {
                group_values_avx512::<H, 4>(w, ws, n, v.add(d), stride, o.add(d), hd);
                d += 4 * WIDE;
            }
        }
        // Eight vectors for one head (its sums and a weight fill half the registers);
        // fewer per head when several share the pass.
        const SPAN: [usize; 4] = [0, 8, 4, 2];
        while d + SPAN[H] * LANES <= vectors {
            match H {
                1 => group_values_avx2::<1, 8>(w, ws, n, v.add(d), stride, o.add(d), hd),
                2 => group_values_avx2::<2, 4>(w, ws, n, v.add(d), stride, o.add(d), hd),
                _ => group_values_avx2::<3, 2>(w, ws, n, v.add(d), stride, o.add(d), hd),
            }
            d += SPAN[H] * LANES;
        }
        while d + LANES <= vectors {
            group_values_avx2::<H, 1>(w, ws, n, v.add(d), stride, o.add(d), hd);
            d += LANES;
        }
    }
}

/// Prefetches every cache line of `data` into L2.
pub fn prefetch_l2<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        let start = data.as_ptr().cast::<i8>();
        for offset in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: a prefetch is a hint that never faults, whatever the address; this
            // one stays inside `data`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
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

/// [`ops::swiglu`](super::ops::swiglu); `false` without the features.
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

/// 8-lane scores of `H` heads at `V` vectors of 8 positions from `keys`, each key vector
/// loaded once for every head. Per head and position the sums are the portable loop's:
/// lane sum `l` over dimensions `l, l + 8, ...` in order, the lane sums added first to
/// last, then the tail dimensions. Taking one lane sum at a time (not all eight side by
/// side) leaves only two registers per head and vector: the lane sum in progress and the
/// running total.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_scores_avx2<const H: usize, const V: usize>(
    q: *const f32,
    hd: usize,
    keys: *const u16,
    stride: usize,
    scale: f32,
    out: *mut f32,
    out_stride: usize,
) {
    let chunks = hd / LANES;
    let mut sum = [[_mm256_setzero_ps(); V]; H];
    // SAFETY (whole body): `q` holds `H * hd` floats; every key load reads
    // `LANES` values at `d * stride + v * LANES` with `d < hd` and `v < V`, and
    // every store writes them at `h * out_stride + v * LANES` with `h < H`, all
    // inside the caller's checked ranges.
    unsafe {
        for l in 0..LANES {
            let mut lane = [[_mm256_setzero_ps(); V]; H];
            for c in 0..chunks {
                let d = LANES * c + l;
                let k: [__m256; V] = std::array::from_fn(|v| load8(keys.add(d * stride + v * LANES)));
                for (h, acc) in lane.iter_mut().enumerate() {
                    let qd = _mm256_set1_ps(*q.add(h * hd + d));
                    for (a, kv) in acc.iter_mut().zip(&k) {
                        *a = _mm256_fmadd_ps(qd, *kv, *a);
                    }
                }
            }
            for (s, a) in sum.iter_mut().zip(&lane) {
                for (sv, av) in s.iter_mut().zip(a) {
                    *sv = if l == 0 { *av } else { _mm256_add_ps(*sv, *av) };
                }
            }
        }
        let vscale = _mm256_set1_ps(scale);
        for (h, s) in sum.iter_mut().enumerate() {
            for (v, sv) in s.iter_mut().enumerate() {
                if chunks * LANES < hd {
                    let mut tail = _mm256_setzero_ps();
                    for d in chunks * LANES..hd {
                        tail = _mm256_add_ps(
                            tail,
                            _mm256_mul_ps(_mm256_set1_ps(*q.add(h * hd + d)), load8(keys.add(d * stride + v * LANES))),
                        );
                    }
                    *sv = _mm256_add_ps(*sv, tail);
                }
                _mm256_storeu_ps(out.add(h * out_stride + v * LANES), _mm256_mul_ps(*sv, vscale));
            }
        }
    }
}

/// Lanes of an AVX-512 vector.
#[cfg(target_arch = "x86_64")]
const WIDE: usize = 16;

/// [`group_scores_avx2`]'s sums for 16 positions, with every lane sum of every head in a
/// register at once (eight per head: 24 of AVX-512's 32 registers for three heads), so
/// the key rows are read in order, each 32-byte row once, and no lane sum waits for the
/// one before it. The 8-lane kernel, short of registers, takes the lanes one at a time:
/// its reads jump 256 bytes and each lane's chain of dependent sums runs alone.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn group_scores_avx512<const H: usize>(
    q: *const f32,
    hd: usize,
    keys: *const u16,
    stride: usize,
    scale: f32,
    out: *mut f32,
    out_stride: usize,
) {
    let chunks = hd / LANES;
    let mut lanes = [[_mm512_setzero_ps(); LANES]; H];
    // SAFETY (whole body): `q` holds `H * hd` floats; every key load reads 16 values at
    // `d * stride` with `d < hd`, and every store writes 16 at `h * out_stride` with
    // `h < H`, all inside the caller's checked ranges.
    unsafe {
        for c in 0..chunks {
            for l in 0..LANES {
                let d = LANES * c + l;
                let k = load16(keys.add(d * stride));
                for (h, lane) in lanes.iter_mut().enumerate() {
                    lane[l] = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(h * hd + d)), k, lane[l]);
                }
            }
        }
        for (h, lane) in lanes.iter().enumerate() {
            let mut sum = lane[0];
            for v in &lane[1..] {
                sum = _mm512_add_ps(sum, *v);
            }
            if chunks * LANES < hd {
                let mut tail = _mm512_setzero_ps();
                for d in chunks * LANES..hd {
                    tail = _mm512_add_ps(
                        tail,
                        _mm512_mul_ps(_mm512_set1_ps(*q.add(h * hd + d)), load16(keys.add(d * stride))),
                    );
                }
                sum = _mm512_add_ps(sum, tail);
            }
            _mm512_storeu_ps(out.add(h * out_stride), _mm512_mul_ps(sum, _mm512_set1_ps(scale)));
        }
    }
}

/// Defines a group value-sum kernel for one vector width: `M` vectors of dimensions of
/// `H` heads' weighted sums held in registers across positions `0..n`, each value
/// vector loaded once for every head; positions in order, one fused multiply-add each, as
/// the portable loop rounds.
#[cfg(target_arch = "x86_64")]
macro_rules! group_values_kernel {
    ($(#[$doc:meta])* $name:ident, $features:literal, $vec:ty, $width:expr, $set1:ident, $fma:ident, $load:ident, $loadf:ident, $store:ident) => {
        $(#[$doc])*
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<const H: usize, const M: usize>(w: *const f32, ws: usize, n: usize, values: *const u16, stride: usize, out: *mut f32, hd: usize) {
            // SAFETY (whole body): head `h < H`'s outputs `h * hd + j * $width` (`j < M`)
            // and weights `h * ws + p`, and rows `p < n` of `M * $width` values from
            // `values`, all inside the caller's checked ranges.
            unsafe {
                let mut acc: [[$vec; M]; H] = std::array::from_fn(|h| std::array::from_fn(|j| $loadf(out.add(h * hd + j * $width))));
                for p in 0..n {
                    let row = values.add(p * stride);
                    let v: [$vec; M] = std::array::from_fn(|j| $load(row.add(j * $width)));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let wh = $set1(*w.add(h * ws + p));
                        for (aj, vj) in a.iter_mut().zip(&v) {
                            *aj = $fma(wh, *vj, *aj);
                        }
                    }
                }
                for (h, a) in acc.iter().enumerate() {
                    for (j, aj) in a.iter().enumerate() {
                        $store(out.add(h * hd + j * $width), *aj);
                    }
                }
            }
        }
    };
}

group_values_kernel!(
    /// 8-lane value sums of `H` heads over `M` vectors of dimensions.
    group_values_avx2, "avx2,fma,f16c", __m256, LANES, _mm256_set1_ps, _mm256_fmadd_ps, load8, _mm256_loadu_ps, _mm256_storeu_ps
);

group_values_kernel!(
    /// [`group_values_avx2`] 16 dimensions per vector.
    group_values_avx512, "avx512f", __m512, WIDE, _mm512_set1_ps, _mm512_fmadd_ps, load16, _mm512_loadu_ps, _mm512_storeu_ps
);

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
    super::ops::swiglu_portable(&mut gate[whole..n], &up[whole..n]);
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
