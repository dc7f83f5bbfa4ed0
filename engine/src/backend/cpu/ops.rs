//! Element-wise and per-row operations of a Llama layer, in f32.
//!
//! Owns RMSNorm, rotary position embedding, SwiGLU and f16 rounding (attention's loops,
//! softmax included, are in `attention.rs`). Each follows the reference implementation's order of
//! operations (llama.cpp's CPU path) where that order changes the rounding: RoPE angles
//! are built by repeated multiplication, attention operands are rounded to f16 as the
//! reference's f16 KV cache stores them.

use half::f16;

/// `out = x / sqrt(mean(x²) + eps) * weight`, one row.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    // The reference accumulates the squares in f64.
    let mean = (x.iter().map(|v| f64::from(v * v)).sum::<f64>() / x.len().max(1) as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
        *o = v * scale * w;
    }
}

/// Rotation angles for one position: `[dims / 2]` pairs of (cos, sin), with
/// `theta_i = freq_scale * pos * base^(-2i / dims) / factors[i]` (no factors: 1), the
/// power built by repeated multiplication and the rest applied in the reference's order.
pub fn rope_table(
    pos: usize,
    dims: usize,
    base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    out: &mut Vec<(f32, f32)>,
) {
    out.clear();
    let step = base.powf(-2.0 / dims as f32);
    let mut theta = pos as f32;
    for i in 0..dims / 2 {
        let factor = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
        let t = freq_scale * (theta / factor);
        out.push((t.cos(), t.sin()));
        theta *= step;
    }
}

/// Rotates adjacent pairs `(x[2i], x[2i+1])` of every head in `x` (`[heads, head_dim]`)
/// — the "normal" RoPE of llama.cpp's LLM_ARCH_LLAMA, whose GGUF Q/K rows are permuted
/// at conversion so that adjacent pairs are the rotated ones.
pub fn rope(x: &mut [f32], head_dim: usize, table: &[(f32, f32)]) {
    for head in x.chunks_exact_mut(head_dim) {
        for (pair, (c, s)) in head.chunks_exact_mut(2).zip(table) {
            let (a, b) = (pair[0], pair[1]);
            pair[0] = a * c - b * s;
            pair[1] = a * s + b * c;
        }
    }
}

/// Rotates the pairs `(x[i], x[i + dims / 2])` of the leading `dims = 2 * table.len()`
/// dimensions of every head in `x` (`[heads, head_dim]`): the NeoX-style RoPE of llama.cpp's
/// LLAMA_ROPE_TYPE_NEOX (Qwen, Gemma).
pub fn rope_halves(x: &mut [f32], head_dim: usize, table: &[(f32, f32)]) {
    let half = table.len();
    for head in x.chunks_exact_mut(head_dim) {
        let (lo, hi) = head[..2 * half].split_at_mut(half);
        for ((a, b), (c, s)) in lo.iter_mut().zip(hi.iter_mut()).zip(table) {
            let (x0, x1) = (*a, *b);
            *a = x0 * c - x1 * s;
            *b = x0 * s + x1 * c;
        }
    }
}

/// `gate[i] = silu(gate[i]) * up[i]`, with the vector `exp` of the softmax (within 2 ulp
/// of libm's) and its AVX2 twin where the CPU has it: libm's scalar `expf` was 2.7 % of a
/// prefill. The twins are bit-identical.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    if !super::ops_simd::swiglu(gate, up) {
        swiglu_portable(gate, up);
    }
}

pub(crate) fn swiglu_portable(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `x / (1 + e^-x)`, from `e = e^-|x|` so that the exponential never overflows: `x / (1 +
/// e)` for `x >= 0`, `x * e / (1 + e)` below. The AVX2 twin does these operations in this
/// order.
#[inline]
/// `gate[i] = gelu(gate[i]) * up[i]` with the tanh form of GELU, as the reference
/// computes it: the input rounded to f16 and the result read at f16 precision (its table
/// of every f16), 0 at or below -10 and the identity at or above 10.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    for (g, u) in gate.iter_mut().zip(up) {
        let x = *g;
        let y = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            f16::from_bits(table[usize::from(f16::from_f32(x).to_bits())]).to_f32()
        };
        *g = y * u;
    }
}

/// GELU of every f16 value, at f16 precision (indexed by the f16's bits): a lookup where
/// a prompt's feed-forward would take millions of `tanh`s.
fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX).map(|bits| f16::from_f32(gelu_tanh(f16::from_bits(bits).to_f32())).to_bits()).collect()
    })
}

/// `0.5 x (1 + tanh(sqrt(2 / pi) x (1 + 0.044715 x^2)))`, in the reference's f32 order.
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

pub(crate) fn silu(x: f32) -> f32 {
    let e = super::attention::exp_nonpositive(-x.abs());
    let s = if x >= 0.0 { 1.0 } else { e };
    x * s / (1.0 + e)
}

/// `x` rounded to the nearest f16 value (ties to even), returned as f32.
#[inline]
pub fn round_f16(x: f32) -> f32 {
    let a = x.abs();
    // Normal f16 range: round the f32 mantissa to 10 bits with integer arithmetic (a
    // software f16 round trip per value cost more than the attention it serves).
    if (6.103_515_6e-5..65504.0).contains(&a) {
        let b = x.to_bits();
        f32::from_bits((b + 0x0fff + ((b >> 13) & 1)) & !0x1fff)
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// Rounds every value to f16 precision in place (the reference's f16 attention operands),
/// with F16C where the CPU has it.
pub fn round_to_f16(x: &mut [f32]) {
    if !super::ops_simd::round_to_f16(x) {
        x.iter_mut().for_each(|v| *v = round_f16(*v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geglu_reads_gelu_at_f16_precision_and_clamps_past_ten() {
        let gelu = |x: f64| 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
        for i in -2400..2400 {
            let x = i as f32 * 0.005 + 0.0013;
            let mut g = [x, -12.0, 12.0];
            geglu(&mut g, &[2.0, 3.0, 0.5]);
            let h = f64::from(round_f16(x));
            // The table holds GELU of the f16 input at f16 precision (half an ulp: 2^-11).
            let want = gelu(h) * 2.0;
            assert!((f64::from(g[0]) - want).abs() <= want.abs() * 1e-3 + 1e-6, "{x}: {} vs {want}", g[0]);
            assert_eq!([g[1], g[2]], [0.0, 6.0]);
        }
    }

    #[test]
    fn silu_matches_f64_and_its_twins_agree() {
        let mut x: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.013).collect();
        x.extend([0.0, -0.0, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0, -1e4, 1e4, f32::INFINITY, f32::NEG_INFINITY]);
        for &v in &x {
            let want = f64::from(v) / (1.0 + (-f64::from(v)).exp());
            let got = f64::from(silu(v));
            let close = if want.is_finite() {
                (got - want).abs() <= 1e-6 * want.abs().max(1e-30)
            } else {
                got == want || got.is_nan() && want.is_nan()
            };
            assert!(close, "silu({v}) = {got}, want {want}");
        }
        let up: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        // Several lengths: whole vectors and tails.
        for n in [x.len(), x.len() - 3, 7, 0] {
            let (mut fast, mut slow) = (x[..n].to_vec(), x[..n].to_vec());
            swiglu(&mut fast, &up[..n]);
            swiglu_portable(&mut slow, &up[..n]);
            assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()), "length {n}");
        }
        let mut nan = [f32::NAN; 9];
        swiglu(&mut nan, &[1.0; 9]);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn rms_norm_unit_weight_gives_unit_rms() {
        let x = [3.0, -4.0, 0.0, 1.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
    }

    #[test]
    fn rope_at_position_zero_is_identity_and_preserves_norm() {
        let mut t = Vec::new();
        rope_table(0, 8, 10000.0, 1.0, None, &mut t);
        let mut x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        rope(&mut x, 8, &t);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        rope_table(17, 8, 10000.0, 1.0, None, &mut t);
        let before: f32 = x.iter().map(|v| v * v).sum();
        rope(&mut x, 8, &t);
        let after: f32 = x.iter().map(|v| v * v).sum();
        assert!((before - after).abs() < 1e-3);
        // The first pair turns by exactly `pos` radians.
        let (c, s) = (17f32.cos(), 17f32.sin());
        assert!((x[0] - (c - 2.0 * s)).abs() < 1e-5);
    }

    #[test]
    fn fast_f16_rounding_matches_the_half_crate() {
        for i in 0..200_000u32 {
            let x = f32::from_bits(0x3000_0000 + i * 9_973) * if i % 2 == 0 { 1.0 } else { -1.0 };
            let (fast, slow) = (round_f16(x), f16::from_f32(x).to_f32());
            assert!(fast == slow || (fast.is_nan() && slow.is_nan()), "{x}: {fast} vs {slow}");
        }
    }

    #[test]
    fn vector_rounding_agrees_with_the_half_crate() {
        // Lengths around the SIMD body's width; values that round up, tie, overflow and
        // underflow in f16.
        for n in [0, 1, 7, 8, 9, 31, 32, 33, 64, 100] {
            let mut r: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 0.37).sin() * 3e-3 + 1.000_488_3)
                .chain([65520.0, 1e-9, -3.1e-5, f32::INFINITY])
                .collect();
            let want: Vec<f32> = r.iter().map(|v| f16::from_f32(*v).to_f32()).collect();
            round_to_f16(&mut r);
            assert_eq!(r, want, "round_to_f16 n={n}");
        }
    }
}
