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
//!
//! Files: `attention_loops.rs` (key scores and value sums), `elementwise.rs` (softmax and
//! its moments, the shifted exponential, SwiGLU, q8 quantization, f16 rounding).
#![allow(unsafe_code)]

mod attention_loops;
mod elementwise;

pub use attention_loops::{group_accumulate_values, group_key_scores, prefetch_l2};
pub use elementwise::{exp_shifted, quantize_q8, round_to_f16, softmax_f16, softmax_moments, swiglu};

/// Whether this CPU runs the vector bodies of both files.
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
