//! How long a step takes, learned online, so that prefill can be chunked to keep decoding
//! sequences' inter-token latency near a target.
//!
//! A step's duration is close to linear in the tokens it processes: a fixed part (reading
//! every weight once, sampling, bookkeeping) plus a part per token (the matrix products'
//! arithmetic, attention). [`StepCost`] fits `seconds = fixed + per_token · tokens` by
//! exponentially weighted least squares over recent steps, so it follows the machine's
//! load, and answers "how many tokens fit in this many seconds?".

use std::time::Duration;

/// Weight of the newest step in the fit: about the last 30 steps matter.
const DECAY: f64 = 1.0 / 30.0;

/// Exponentially weighted least-squares fit of step duration against step tokens.
#[derive(Debug, Clone, Copy, Default)]
pub struct StepCost {
    /// Weighted sums of 1, n, t, n², n·t.
    w: f64,
    n: f64,
    t: f64,
    nn: f64,
    nt: f64,
}

impl StepCost {
    /// Records that a step of `tokens` tokens took `elapsed`.
    pub fn observe(&mut self, tokens: usize, elapsed: Duration) {
        let (n, t) = (tokens as f64, elapsed.as_secs_f64());
        let keep = 1.0 - DECAY;
        self.w = self.w * keep + 1.0;
        self.n = self.n * keep + n;
        self.t = self.t * keep + t;
        self.nn = self.nn * keep + n * n;
        self.nt = self.nt * keep + n * t;
    }

    /// The fitted `(fixed seconds, seconds per token)`, or `None` before any step.
    pub fn model(&self) -> Option<(f64, f64)> {
        if self.w <= 0.0 || self.n <= 0.0 {
            return None;
        }
        let (mean_n, mean_t) = (self.n / self.w, self.t / self.w);
        let var_n = self.nn / self.w - mean_n * mean_n;
        let cov = self.nt / self.w - mean_n * mean_t;
        // Steps of (nearly) one size cannot separate the two parts: charge it all per token,
        // which overestimates larger steps, the safe side for a latency target.
        if var_n < 1.0 || cov <= 0.0 {
            return Some((0.0, mean_t / mean_n));
        }
        let per_token = cov / var_n;
        let fixed = (mean_t - per_token * mean_n).max(0.0);
        Some((fixed, per_token))
    }

    /// Tokens a step may process and still finish within `target`; `None` before the
    /// model has seen a step.
    pub fn tokens_within(&self, target: Duration) -> Option<usize> {
        let (fixed, per_token) = self.model()?;
        if per_token <= 0.0 {
            return Some(usize::MAX);
        }
        let room = target.as_secs_f64() - fixed;
        Some(if room <= 0.0 { 0 } else { (room / per_token) as usize })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn recovers_a_linear_cost() {
        let mut c = StepCost::default();
        for i in 0..200 {
            let n = 8 + (i * 37) % 200;
            c.observe(n, ms(5.0 + 0.5 * n as f64));
        }
        let (fixed, per_token) = c.model().unwrap();
        assert!((fixed - 0.005).abs() < 1e-6, "fixed {fixed}");
        assert!((per_token - 0.0005).abs() < 1e-8, "per token {per_token}");
        let fit = c.tokens_within(ms(80.0)).unwrap();
        assert!((149..=150).contains(&fit), "{fit} tokens fit in 80 ms");
    }

    #[test]
    fn one_step_size_charges_everything_per_token() {
        let mut c = StepCost::default();
        for _ in 0..10 {
            c.observe(16, ms(40.0));
        }
        assert_eq!(c.tokens_within(ms(80.0)), Some(32));
    }

    #[test]
    fn follows_a_slowdown() {
        let mut c = StepCost::default();
        for i in 0..100 {
            c.observe(16 + i % 50, ms(1.0 * (16 + i % 50) as f64));
        }
        let before = c.tokens_within(ms(100.0)).unwrap();
        for i in 0..100 {
            c.observe(16 + i % 50, ms(3.0 * (16 + i % 50) as f64));
        }
        let after = c.tokens_within(ms(100.0)).unwrap();
        assert!(before >= 95 && after <= 35, "before {before}, after {after}");
    }

    #[test]
    fn nothing_fits_when_the_fixed_part_exceeds_the_target() {
        let mut c = StepCost::default();
        for n in [10, 20, 30, 40, 10, 20, 30, 40] {
            c.observe(n, ms(100.0 + n as f64));
        }
        assert_eq!(c.tokens_within(ms(50.0)), Some(0));
        assert_eq!(StepCost::default().tokens_within(ms(50.0)), None);
    }
}
