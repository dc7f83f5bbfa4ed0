//! The inner loops of attention over an f16 KV block: the scores of one query against a
//! block's keys, their softmax (rounded to f16, as the reference multiplies f16 values
//! with f16 probabilities), and the probability-weighted sum of a block's values. Also
//! the softmax moments over a whole vocabulary that sampling reports logprobs and
//! entropy from, with the same vector `exp`.
//!
//! Owns the portable definitions; `ops_simd.rs` holds their AVX2 twins, used when the CPU
//! has the features. The layouts are the KV pool's (`kv::HeadBlock`): keys transposed
//! (`[head_dim, stride]`, one dimension's positions contiguous), so a vector holds one
//! dimension of 8 positions and no horizontal sum is needed; values by position.
//!
//! Invariants: the twins are bit-identical (same operations per element: each product
//! fused with its running sum, `f32::mul_add` in the portable loops). Fusing changes no
//! result where the engine calls these: queries and probabilities are rounded to f16
//! first, and a product of two f16 values is exact in f32; it halves the vector kernels'
//! arithmetic instructions. The order of summation is fixed: a score is eight lane sums over the
//! dimensions (lane `l` takes dimensions `l, l + 8, ...` in order), added lane after lane,
//! then the tail; a value sum runs over positions in order. The scores are rounded to f16
//! next, where any other order can move one across a rounding boundary, and the reference
//! fixtures were measured with this one. The softmax uses its own `exp` (a Cephes-style
//! polynomial, within 2 ulp of libm's, fused multiply-adds in both twins) so that it
//! vectorises, and sums in eight lanes. Slices too short for the counts are never read
//! past: the kernels clamp to what they were given.

use half::f16;

/// Dimensions summed lane by lane in a score (the lanes of one AVX2 vector).
pub(crate) const LANES: usize = 8;

/// `out[p] = scale * Σ_d q[d] * keys[d * stride + p]` for `p < out.len()`; `keys` is
/// `[q.len(), stride]` (the last row may end at `out.len()`). Positions the slices cannot
/// hold (a caller bug) score `-inf`: nothing is attended there.
pub fn key_scores(q: &[f32], keys: &[f16], stride: usize, scale: f32, out: &mut [f32]) {
    let n = out.len();
    group_key_scores(q, q.len(), keys, stride, scale, out, n, n);
}

/// [`key_scores`] of every query head of a group that shares one KV head, reading each
/// key once for all of them: `q` is `[heads, head_dim]`, and head `h`'s scores of
/// positions `0..n` go to `out[h * out_stride..][..n]`. Each head's scores are exactly
/// those [`key_scores`] gives it alone. Positions the slices cannot hold score `-inf`;
/// an `out` too short for `n` positions of every head gets fewer.
#[allow(clippy::too_many_arguments)]
pub fn group_key_scores(
    q: &[f32],
    head_dim: usize,
    keys: &[f16],
    stride: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
    n: usize,
) {
    if head_dim == 0 {
        return;
    }
    let heads = q.len() / head_dim;
    let Some(last) = heads.checked_sub(1) else { return };
    let n = n.min(out.len().saturating_sub(last * out_stride));
    let n = if heads > 1 { n.min(out_stride) } else { n };
    let readable = n.min(stride).min(keys.len().saturating_sub((head_dim - 1) * stride));
    for h in 0..heads {
        out[h * out_stride + readable..h * out_stride + n].fill(f32::NEG_INFINITY);
    }
    let q = &q[..heads * head_dim];
    if !super::ops_simd::group_key_scores(q, head_dim, keys, stride, scale, out, out_stride, readable) {
        for (h, qh) in q.chunks_exact(head_dim).enumerate() {
            key_scores_portable(qh, keys, stride, scale, &mut out[h * out_stride..h * out_stride + readable], 0);
        }
    }
}

/// The portable loop from position `from` on (the SIMD twin finishes its tail here).
/// Callers have checked that `keys` holds `(q.len() - 1) * stride + out.len()` values.
pub(crate) fn key_scores_portable(q: &[f32], keys: &[f16], stride: usize, scale: f32, out: &mut [f32], from: usize) {
    let chunks = q.len() / LANES;
    for (p, o) in out.iter_mut().enumerate().skip(from) {
        let key = |d: usize| keys.get(d * stride + p).map_or(0.0, |k| k.to_f32());
        let mut lanes = [0.0f32; LANES];
        for c in 0..chunks {
            for (l, lane) in lanes.iter_mut().enumerate() {
                let d = LANES * c + l;
                *lane = q[d].mul_add(key(d), *lane);
            }
        }
        let tail: f32 = (LANES * chunks..q.len()).map(|d| q[d] * key(d)).sum();
        *o = (lanes.iter().sum::<f32>() + tail) * scale;
    }
}

/// Asks for `kv` (a block's keys or values, read soon) to be brought into L2; no-op
/// without x86-64. See [`super::Cpu::prefetches_kv`].
pub fn prefetch_l2(kv: &[f16]) {
    super::ops_simd::prefetch_l2(kv);
}

/// `out[d] += Σ_p probs[p] * values[p * stride + d]`, positions in order; `values` is
/// `[probs.len(), stride]` (the last row may end at `out.len()`). Positions the slice
/// cannot hold (a caller bug) are skipped.
pub fn accumulate_values(probs: &[f32], values: &[f16], stride: usize, out: &mut [f32]) {
    let hd = out.len();
    group_accumulate_values(probs, probs.len(), probs.len(), values, stride, out, hd);
}

/// [`accumulate_values`] for every query head of a group that shares one KV head,
/// reading each value once for all of them: head `h` weighs positions `0..n` by
/// `probs[h * probs_stride..][..n]` into `out[h * head_dim..][..head_dim]`, exactly as
/// [`accumulate_values`] would for it alone.
pub fn group_accumulate_values(
    probs: &[f32],
    probs_stride: usize,
    n: usize,
    values: &[f16],
    stride: usize,
    out: &mut [f32],
    head_dim: usize,
) {
    if head_dim == 0 || stride == 0 {
        return;
    }
    let heads = out.len() / head_dim;
    let Some(last) = heads.checked_sub(1) else { return };
    let held = (values.len() + stride).saturating_sub(head_dim) / stride;
    let n = n.min(held).min(probs.len().saturating_sub(last * probs_stride));
    let n = if heads > 1 { n.min(probs_stride) } else { n };
    let out = &mut out[..heads * head_dim];
    if !super::ops_simd::group_accumulate_values(probs, probs_stride, n, values, stride, out, head_dim) {
        for (h, o) in out.chunks_exact_mut(head_dim).enumerate() {
            accumulate_values_portable(&probs[h * probs_stride..h * probs_stride + n], values, stride, o);
        }
    }
}

/// The portable loop; callers have checked that `values` holds every position's row.
pub(crate) fn accumulate_values_portable(probs: &[f32], values: &[f16], stride: usize, out: &mut [f32]) {
    for (p, w) in probs.iter().enumerate() {
        let row = values.get(p * stride..).unwrap_or(&[]);
        for (o, v) in out.iter_mut().zip(row) {
            *o = w.mul_add(v.to_f32(), *o);
        }
    }
}

/// Below this, `exp` is 0 (`exp(-87)` is the last value with a normal f32 exponent).
pub(crate) const EXP_MIN: f32 = -87.0;

/// `exp` on `x <= 0` (softmax arguments after the max is taken out): range reduction by
/// `ln 2` in two parts, a degree-7 polynomial, then the power of two. The AVX2 twin runs
/// these same fused operations lane by lane.
pub(crate) fn exp_nonpositive(x: f32) -> f32 {
    if x.is_nan() || x < EXP_MIN {
        return 0.0;
    }
    let n = (x * EXP_CONSTANTS.log2e).round_ties_even();
    let r = n.mul_add(-EXP_CONSTANTS.ln2_hi, x);
    let r = n.mul_add(-EXP_CONSTANTS.ln2_lo, r);
    let mut p = EXP_CONSTANTS.poly[0];
    for c in &EXP_CONSTANTS.poly[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The constants of [`exp_nonpositive`] (Cephes `expf`).
pub(crate) struct ExpConstants {
    pub log2e: f32,
    pub ln2_hi: f32,
    pub ln2_lo: f32,
    /// Coefficients of `(e^r - 1 - r) / r^2`, highest degree first.
    pub poly: [f32; 6],
}

pub(crate) const EXP_CONSTANTS: ExpConstants = ExpConstants {
    log2e: std::f32::consts::LOG2_E,
    ln2_hi: 0.693_359_4,
    ln2_lo: -2.121_944_4e-4,
    poly: [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5],
};

/// In place: `x = round_f16(softmax(x))`. Sums the exponentials in eight lanes (lane `l`
/// takes elements `l, l + 8, ...`), adds the lanes in order, then the tail.
pub fn softmax_f16(x: &mut [f32]) {
    if !super::ops_simd::softmax_f16(x) {
        softmax_f16_portable(x);
    }
}

pub(crate) fn softmax_f16_portable(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let whole = x.len() / LANES * LANES;
    let mut lanes = [0.0f32; LANES];
    for (i, v) in x.iter_mut().enumerate() {
        *v = exp_nonpositive(*v - max);
        if i < whole {
            lanes[i % LANES] += *v;
        }
    }
    let sum = x[whole..].iter().fold(lanes.iter().sum::<f32>(), |s, v| s + v);
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    x.iter_mut().for_each(|v| *v = f16::from_f32(*v * inv).to_f32());
}

/// In place: `x = exp((x - max(x)) * scale)` for `scale > 0`: unnormalised softmax
/// weights (sampling at temperature `1 / scale`), with the vector `exp`.
pub fn exp_shifted(x: &mut [f32], scale: f32) {
    if !super::ops_simd::exp_shifted(x, scale) {
        exp_shifted_portable(x, scale);
    }
}

pub(crate) fn exp_shifted_portable(x: &mut [f32], scale: f32) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    x.iter_mut().for_each(|v| *v = exp_nonpositive((*v - max) * scale));
}

/// Elements summed in f32 lanes before the lane sums move into f64: long enough to stay
/// vectorised, short enough that a 49,152-entry vocabulary loses nothing a logprob shows.
pub(crate) const MOMENT_FLUSH: usize = 512;

/// The softmax's moments about the maximum, for log-probabilities and entropy over a
/// whole vocabulary: `(max, Σ e^(x - max), Σ e^(x - max) · (x - max))`.
///
/// Order: the maximum of `x`; then per run of `MOMENT_FLUSH` elements (whole vectors
/// only) eight f32 lane sums, added lane after lane into f64; then the tail in f64. The
/// exponential is `exp_nonpositive`; `(x - max)` is floored at `EXP_MIN` before the
/// product, where the exponential is already 0 (so `-inf` logits add nothing, not NaN).
pub fn softmax_moments(x: &[f32]) -> (f32, f64, f64) {
    super::ops_simd::softmax_moments(x).unwrap_or_else(|| softmax_moments_portable(x))
}

pub(crate) fn softmax_moments_portable(x: &[f32]) -> (f32, f64, f64) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let whole = x.len() / LANES * LANES;
    let (mut z, mut zl) = (0.0f64, 0.0f64);
    for run in x[..whole].chunks(MOMENT_FLUSH) {
        let (mut lz, mut lzl) = ([0.0f32; LANES], [0.0f32; LANES]);
        for (i, v) in run.iter().enumerate() {
            let d = *v - max;
            let e = exp_nonpositive(d);
            lz[i % LANES] += e;
            lzl[i % LANES] += e * d.max(EXP_MIN);
        }
        for l in 0..LANES {
            z += f64::from(lz[l]);
            zl += f64::from(lzl[l]);
        }
    }
    for v in &x[whole..] {
        let d = *v - max;
        let e = exp_nonpositive(d);
        z += f64::from(e);
        zl += f64::from(e * d.max(EXP_MIN));
    }
    (max, z, zl)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16s(n: usize, seed: f32) -> Vec<f16> {
        (0..n).map(|i| f16::from_f32(((i as f32) * 0.731 + seed).sin() * 2.5)).collect()
    }

    fn floats(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| f16::from_f32(((i as f32) * 0.377 + seed).cos()).to_f32()).collect()
    }

    #[test]
    fn scores_are_scaled_dot_products_in_the_documented_order() {
        let (hd, stride) = (20, 16);
        let (q, keys) = (floats(hd, 0.1), f16s(hd * stride, 0.2));
        let mut out = vec![0.0; 11];
        key_scores(&q, &keys, stride, 0.5, &mut out);
        for (p, got) in out.iter().enumerate() {
            let mut lanes = [0.0f32; LANES];
            for d in 0..16 {
                lanes[d % LANES] += q[d] * keys[d * stride + p].to_f32();
            }
            let tail = q[16] * keys[16 * stride + p].to_f32()
                + q[17] * keys[17 * stride + p].to_f32()
                + q[18] * keys[18 * stride + p].to_f32()
                + q[19] * keys[19 * stride + p].to_f32();
            let want = (lanes.iter().sum::<f32>() + tail) * 0.5;
            assert_eq!(got.to_bits(), want.to_bits(), "position {p}");
        }
    }

    #[test]
    fn simd_twins_are_bit_identical_to_the_portable_loops() {
        // Head sizes around the vector width, position counts around 8 and the stride.
        for hd in [1, 7, 8, 16, 24, 64, 72, 128, 136] {
            for (n, stride) in
                [(1, 16), (7, 16), (8, 16), (9, 16), (16, 16), (3, 4), (32, 32), (24, 32), (31, 32), (47, 64), (64, 64)]
            {
                let (q, keys) = (floats(hd, hd as f32), f16s(hd * stride, n as f32));
                let (mut fast, mut slow) = (vec![0.0; n], vec![0.0; n]);
                key_scores(&q, &keys, stride, 0.125, &mut fast);
                key_scores_portable(&q, &keys, stride, 0.125, &mut slow, 0);
                assert_eq!(fast, slow, "scores hd={hd} n={n} stride={stride}");
                let vstride = hd + 3;
                let (probs, values) = (floats(n, 0.3), f16s(n * vstride, 0.7));
                let (mut fast, mut slow) = (floats(hd, 0.9), floats(hd, 0.9));
                accumulate_values(&probs, &values, vstride, &mut fast);
                accumulate_values_portable(&probs, &values, vstride, &mut slow);
                assert_eq!(fast, slow, "values hd={hd} n={n}");
            }
        }
    }

    #[test]
    fn a_group_gets_exactly_what_each_of_its_heads_gets_alone() {
        // Groups around the kernels' three heads per pass, head sizes around the vector
        // width and past the padded tile, positions around 8, 16 and the stride.
        for heads in 1..=7 {
            for hd in [8, 20, 64, 72, 264] {
                for (n, stride) in [(1, 16), (7, 16), (8, 16), (13, 16), (16, 16), (24, 32), (31, 32), (40, 48)] {
                    let (q, keys) = (floats(heads * hd, hd as f32), f16s(hd * stride, n as f32));
                    let row = n + 5;
                    let mut group = vec![7.0; heads * row];
                    group_key_scores(&q, hd, &keys, stride, 0.125, &mut group, row, n);
                    let vstride = hd + 3;
                    let values = f16s(n * vstride, 0.7);
                    let mut summed = floats(heads * hd, 0.9);
                    let before = summed.clone();
                    group_accumulate_values(&group, row, n, &values, vstride, &mut summed, hd);
                    for h in 0..heads {
                        let mut alone = vec![0.0; n];
                        key_scores(&q[h * hd..(h + 1) * hd], &keys, stride, 0.125, &mut alone);
                        assert_eq!(group[h * row..h * row + n], alone[..], "scores heads={heads} h={h} hd={hd} n={n}");
                        assert!(
                            group[h * row + n..(h + 1) * row].iter().all(|v| *v == 7.0),
                            "wrote past n: heads={heads} h={h}"
                        );
                        let mut o = before[h * hd..(h + 1) * hd].to_vec();
                        accumulate_values_portable(&alone, &values, vstride, &mut o);
                        assert_eq!(summed[h * hd..(h + 1) * hd], o[..], "values heads={heads} h={h} hd={hd} n={n}");
                    }
                }
            }
        }
    }

    #[test]
    fn exp_is_within_two_ulp_of_libm_and_zero_far_below() {
        for i in 0..=200_000 {
            let x = -87.0 * i as f32 / 200_000.0;
            let (got, want) = (exp_nonpositive(x), x.exp());
            assert!((got - want).abs() <= 2.0 * (want * f32::EPSILON), "{x}: {got} vs {want}");
        }
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(
            (exp_nonpositive(-88.0), exp_nonpositive(f32::NEG_INFINITY), exp_nonpositive(f32::NAN)),
            (0.0, 0.0, 0.0)
        );
    }

    #[test]
    fn softmax_sums_to_one_and_its_twins_agree() {
        for n in [1, 5, 8, 9, 16, 17, 100, 513] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.61).sin() * 9.0).collect();
            x.push(f32::NEG_INFINITY);
            let mut slow = x.clone();
            softmax_f16(&mut x);
            softmax_f16_portable(&mut slow);
            assert_eq!(x, slow, "n={n}");
            assert!((x.iter().sum::<f32>() - 1.0).abs() < 2e-3 * (n as f32).sqrt(), "n={n}");
            assert_eq!(x[n], 0.0);
            assert!(x.iter().all(|v| f16::from_f32(*v).to_f32() == *v));
        }
    }

    #[test]
    fn shifted_exponentials_peak_at_one_and_their_twins_agree() {
        for n in [1, 7, 8, 9, 100, 49_152] {
            let x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.29).cos() * 20.0).collect();
            let (mut fast, mut slow) = (x.clone(), x.clone());
            exp_shifted(&mut fast, 1.25);
            exp_shifted_portable(&mut slow, 1.25);
            assert_eq!(fast, slow, "n={n}");
            let max = x.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
            for (v, e) in x.iter().zip(&fast) {
                let want = ((v - max) * 1.25).exp();
                assert!((e - want).abs() <= 2.0 * want * f32::EPSILON + f32::MIN_POSITIVE, "{v}: {e} vs {want}");
            }
        }
    }

    #[test]
    fn softmax_moments_match_f64_and_their_twins_agree() {
        for n in [1, 7, 8, 9, 511, 512, 513, 4099, 49_152] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.173).sin() * 12.0 + (i % 7) as f32).collect();
            x[n / 2] = f32::NEG_INFINITY;
            let (max, z, zl) = softmax_moments(&x);
            assert_eq!((max, z, zl), softmax_moments_portable(&x), "twins n={n}");
            let m = x.iter().fold(f32::NEG_INFINITY, |a, v| a.max(*v));
            let (wz, wzl) = x.iter().filter(|v| v.is_finite()).fold((0.0f64, 0.0f64), |(z, zl), v| {
                let d = f64::from(v - m);
                (z + d.exp(), zl + d.exp() * d)
            });
            assert_eq!(max, m);
            assert!((z - wz).abs() <= 1e-6 * wz, "z n={n}: {z} vs {wz}");
            assert!((zl - wzl).abs() <= 1e-5 * wz, "zl n={n}: {zl} vs {wzl}");
        }
    }

    #[test]
    fn short_slices_are_not_read_past() {
        let (q, keys) = (floats(8, 0.0), f16s(8 * 16 - 10, 0.0));
        let mut out = vec![0.0; 16];
        key_scores(&q, &keys, 16, 1.0, &mut out);
        assert!(out[..6].iter().all(|s| s.is_finite()) && out[6..].iter().all(|s| *s == f32::NEG_INFINITY));
        // Three whole rows of 8 in a stride of 10: the fourth position is skipped.
        let values = f16s(2 * 10 + 8, 0.0);
        let (mut three, mut four) = (vec![0.0; 8], vec![0.0; 8]);
        accumulate_values(&[0.5; 3], &values, 10, &mut three);
        accumulate_values(&[0.5; 4], &values, 10, &mut four);
        assert_eq!(three, four);
        // Two heads whose rows of `out` leave room for 5 positions, asked for 9: none of
        // them is written past its row, and the keys still bound what is read.
        let mut out = vec![1.0; 2 * 5];
        group_key_scores(&floats(16, 0.0), 8, &keys, 16, 1.0, &mut out, 5, 9);
        assert!(out.iter().all(|s| s.is_finite() && *s != 1.0));
        // Room for only 4 positions in the second head's row: 4 for each.
        let mut out = vec![1.0; 16 + 4];
        group_key_scores(&floats(16, 0.0), 8, &keys, 16, 1.0, &mut out, 16, 16);
        assert!(
            out[..4].iter().chain(&out[16..]).all(|s| s.is_finite() && *s != 1.0)
                && out[4..16].iter().all(|s| *s == 1.0)
        );
        // Past the 6 readable positions: -inf in every head's row.
        let mut out = vec![1.0; 2 * 8];
        group_key_scores(&floats(16, 0.0), 8, &keys, 16, 1.0, &mut out, 8, 8);
        assert!(out.chunks(8).all(
            |r| r[..6].iter().all(|s| s.is_finite() && *s != 1.0) && r[6..].iter().all(|s| *s == f32::NEG_INFINITY)
        ));
        // Weights for two heads at a stride of 3 but only 4 of them in all: one position.
        let (mut one, mut two) = (vec![0.0; 16], vec![0.0; 16]);
        group_accumulate_values(&[0.5; 4], 3, 3, &values, 10, &mut one, 8);
        group_accumulate_values(&[0.5; 4], 3, 1, &values, 10, &mut two, 8);
        assert_eq!(one, two);
    }
}
