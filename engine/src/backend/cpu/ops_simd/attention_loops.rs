//! The attention loops' vector bodies: key scores and value sums for the query heads that
//! share a KV head, 8 and 16 lanes.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use half::f16;

#[cfg(target_arch = "x86_64")]
use super::super::attention::{self, LANES};
use super::available;

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

/// 8 f16 values from `at` as f32.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(at: *const u16) -> __m256 {
    // SAFETY: the caller passes a pointer to 8 readable values.
    unsafe { _mm256_cvtph_ps(_mm_loadu_si128(at.cast::<__m128i>())) }
}
