//! Entropy detector: is this response statistically unlike what this tenant usually gets?
//!
//! Three metrics, each compared with the tenant's baseline (mean, variance, count) from the
//! [`Baselines`] trait: the Shannon entropy of consecutive fixed windows of
//! `window_chars` characters (counted from the start of the response, so any chunking
//! sees the same windows; a trailing partial window is not judged), and — when the engine
//! supplies them — the mean per-token surprisal (−logprob) and mean predictive entropy
//! over consecutive blocks of `token_window` tokens. The z-score of an observation is
//! `(x − mean) / sd`, with `sd = sqrt(variance / k)` for a mean of k tokens; the p-value is
//! the upper normal tail (statrs). Only unusually *high* values are findings: leaked keys,
//! ciphertext and foreign text raise entropy and surprisal.
//!
//! These findings are evidence, not a gate: the default action is log, and the text they
//! describe is not held back for them.

use std::sync::Arc;

use serde::Serialize;
use statrs::distribution::{ContinuousCDF, Normal};

use crate::detect::{ScanContext, TokenSignals};
use crate::rules::rule::shannon_entropy;
use crate::verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// Rule id of entropy findings.
pub const RULE_ID: &str = "entropy-anomaly";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    CharEntropy,
    Surprisal,
    PredictiveEntropy,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    pub mean: f64,
    pub variance: f64,
    pub count: u64,
}

/// Implemented by the gateway's statistics; must answer from memory.
pub trait Baselines: Send + Sync {
    fn baseline(&self, tenant: &str, metric: Metric) -> Option<Baseline>;
}

#[derive(Clone)]
pub struct EntropyConfig {
    pub window_chars: usize,
    pub token_window: usize,
    /// A finding needs z >= this.
    pub z_threshold: f64,
    /// Baselines with fewer observations are not trusted.
    pub min_count: u64,
    pub action: Action,
    pub baselines: Arc<dyn Baselines>,
}

impl EntropyConfig {
    pub fn new(baselines: Arc<dyn Baselines>) -> EntropyConfig {
        EntropyConfig {
            window_chars: 64,
            token_window: 16,
            z_threshold: 4.0,
            min_count: 30,
            action: Action::Log,
            baselines,
        }
    }
}

/// Running mean and variance (Welford) of one metric over a stream.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observed {
    pub count: u64,
    pub mean: f64,
    m2: f64,
}

impl Observed {
    pub fn add(&mut self, x: f64) {
        self.count += 1;
        let d = x - self.mean;
        self.mean += d / self.count as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Sample variance (0 with fewer than two observations).
    pub fn variance(&self) -> f64 {
        if self.count < 2 {
            0.0
        } else {
            self.m2 / (self.count - 1) as f64
        }
    }
}

/// What one stream observed, for the gateway to fold into the tenant's baselines.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Observations {
    pub char_entropy: Observed,
    pub surprisal: Observed,
    pub predictive_entropy: Observed,
}

/// Per-stream state.
#[derive(Debug, Default)]
pub(crate) struct EntropyState {
    // the current character window: text and where it starts
    window: String,
    window_start: usize,
    window_chars: usize,
    // the current token block: sums, count and span
    surprisal_sum: f64,
    entropy_sum: f64,
    surprisal_n: usize,
    entropy_n: usize,
    block_tokens: usize,
    block_start: usize,
    pub(crate) observed: Observations,
}

impl EntropyState {
    pub(crate) fn feed_text(
        &mut self,
        cfg: &EntropyConfig,
        ctx: &ScanContext,
        text: &str,
        base: usize,
        out: &mut Vec<Finding>,
    ) {
        if cfg.window_chars == 0 {
            return;
        }
        for (i, c) in text.char_indices() {
            if self.window_chars == 0 {
                self.window_start = base + i;
            }
            self.window.push(c);
            self.window_chars += 1;
            if self.window_chars == cfg.window_chars {
                let h = shannon_entropy(&self.window);
                self.observed.char_entropy.add(h);
                let span = (self.window_start, base + i + c.len_utf8());
                judge(cfg, ctx, Metric::CharEntropy, h, 1, span, &self.window, out);
                self.window.clear();
                self.window_chars = 0;
            }
        }
    }

    /// One token's signals; `start..end` is its text's span.
    pub(crate) fn feed_token(
        &mut self,
        cfg: &EntropyConfig,
        ctx: &ScanContext,
        sig: &TokenSignals,
        token: &str,
        start: usize,
        out: &mut Vec<Finding>,
    ) {
        if cfg.token_window == 0 {
            return;
        }
        if self.block_tokens == 0 {
            self.block_start = start;
        }
        if let Some(lp) = sig.logprob {
            self.observed.surprisal.add(-lp);
            self.surprisal_sum += -lp;
            self.surprisal_n += 1;
        }
        if let Some(e) = sig.entropy {
            self.observed.predictive_entropy.add(e);
            self.entropy_sum += e;
            self.entropy_n += 1;
        }
        self.block_tokens += 1;
        if self.block_tokens < cfg.token_window {
            return;
        }
        let span = (self.block_start, start + token.len());
        if self.surprisal_n > 0 {
            let mean = self.surprisal_sum / self.surprisal_n as f64;
            judge(cfg, ctx, Metric::Surprisal, mean, self.surprisal_n, span, token, out);
        }
        if self.entropy_n > 0 {
            let mean = self.entropy_sum / self.entropy_n as f64;
            judge(cfg, ctx, Metric::PredictiveEntropy, mean, self.entropy_n, span, token, out);
        }
        (self.surprisal_sum, self.entropy_sum, self.surprisal_n, self.entropy_n, self.block_tokens) =
            (0.0, 0.0, 0, 0, 0);
    }
}

/// z-score of a mean of `k` observations against `b`, and its upper-tail p-value.
pub fn z_and_p(b: &Baseline, x: f64, k: usize) -> Option<(f64, f64)> {
    if b.variance <= 0.0 || !b.variance.is_finite() || k == 0 {
        return None;
    }
    let sd = (b.variance / k as f64).sqrt();
    let z = (x - b.mean) / sd;
    let normal = Normal::new(0.0, 1.0).ok()?;
    Some((z, normal.sf(z)))
}

#[allow(clippy::too_many_arguments)]
fn judge(
    cfg: &EntropyConfig,
    ctx: &ScanContext,
    metric: Metric,
    x: f64,
    k: usize,
    (start, end): (usize, usize),
    text: &str,
    out: &mut Vec<Finding>,
) {
    let Some(b) = cfg.baselines.baseline(&ctx.tenant, metric) else { return };
    if b.count < cfg.min_count {
        return;
    }
    let Some((z, p)) = z_and_p(&b, x, k) else { return };
    if z < cfg.z_threshold {
        return;
    }
    let detail = Detail::Statistic { metric, value: x, mean: b.mean, z_score: z, p_value: p };
    let verdict = (Severity::Medium, cfg.action);
    out.push(Finding::over(RULE_ID, (start, end), DetectorKind::Entropy, verdict, mask(text), detail));
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl Baselines for Fixed {
        fn baseline(&self, tenant: &str, metric: Metric) -> Option<Baseline> {
            (tenant == "acme").then_some(match metric {
                Metric::CharEntropy => Baseline { mean: 4.0, variance: 0.04, count: 100 },
                _ => Baseline { mean: 1.0, variance: 1.0, count: 100 },
            })
        }
    }

    fn cfg() -> EntropyConfig {
        EntropyConfig { window_chars: 32, token_window: 4, ..EntropyConfig::new(Arc::new(Fixed)) }
    }

    #[test]
    fn z_and_p_values() {
        let b = Baseline { mean: 0.0, variance: 4.0, count: 10 };
        let (z, p) = z_and_p(&b, 4.0, 1).unwrap_or_default();
        assert!((z - 2.0).abs() < 1e-12 && (p - 0.02275).abs() < 1e-4);
        assert_eq!(z_and_p(&Baseline { variance: 0.0, ..b }, 1.0, 1), None);
    }

    #[test]
    fn random_window_is_flagged_prose_is_not() {
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let mut st = EntropyState::default();
        st.feed_text(
            &cfg(),
            &ctx,
            "aaaa aaaa aaaa aaaa aaaa aaaa aaaqX9#kLm2$Vb7@Wq4!zR8&Tn5^Hy3*Jp6(Gd1)Fs0",
            0,
            &mut out,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].start, out[0].end, out[0].action), (32, 64, Action::Log));
        assert_eq!(st.observed.char_entropy.count, 2);
        let mut other = Vec::new();
        EntropyState::default().feed_text(
            &cfg(),
            &ScanContext::new("nobody"),
            "qX9#kLm2$Vb7@Wq4!zR8&Tn5^Hy3*Jp6",
            0,
            &mut other,
        );
        assert!(other.is_empty(), "no baseline, no finding");
    }

    #[test]
    fn token_blocks_use_the_standard_error_of_the_mean() {
        let ctx = ScanContext::new("acme");
        let mut out = Vec::new();
        let mut st = EntropyState::default();
        for i in 0..4 {
            let sig = TokenSignals { logprob: Some(-4.0), entropy: Some(1.0), owners: vec![] };
            st.feed_token(&cfg(), &ctx, &sig, "tok", i * 3, &mut out);
        }
        // surprisal mean 4 vs 1 with sd 1/sqrt(4): z = 6; predictive entropy at its mean.
        assert_eq!(out.len(), 1);
        assert!(
            matches!(out[0].detail, Detail::Statistic { metric: Metric::Surprisal, z_score, .. } if (z_score - 6.0).abs() < 1e-9)
        );
        assert_eq!((out[0].start, out[0].end), (0, 12));
    }
}
