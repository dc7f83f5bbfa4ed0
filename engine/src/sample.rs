//! Choosing the next token from the model's logits, and describing the distribution.
//!
//! Owns: the request's sampling parameters and their validation, the seeded random
//! generator of one request (same seed + same logits -> same tokens), OpenAI's
//! presence/frequency penalties over the tokens generated so far, logit bias, and the
//! per-step statistics the firewall consumes.
//!
//! Statistics (`logprob`, `entropy`, `top`) describe the model's own distribution — the
//! softmax of the raw logits — before bias, penalties and temperature: they measure what
//! the model believes, and a client cannot hide an anomaly from the entropy statistics by
//! tuning its sampling knobs. The token is chosen from the adjusted distribution.

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::cpu::attention;
use crate::error::{Error, Result};

/// Most alternatives a step may report (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Candidates sorted before falling back to a full sort for nucleus sampling.
const NUCLEUS_FIRST_PASS: usize = 256;

/// How one request samples. `temperature == 0` is greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Keep only the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Seeds the request's generator; `None` draws a seed from the OS.
    pub seed: Option<u64>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// Added to the logit of each listed token id.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> SamplingParams {
        SamplingParams { temperature: 0.0, ..SamplingParams::default() }
    }

    /// Checks ranges against OpenAI's documented limits and the vocabulary size.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidRequest { reason });
        if !(self.temperature.is_finite() && (0.0..=2.0).contains(&self.temperature)) {
            return bad(format!("temperature must be in [0, 2], got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
                return bad(format!("{name} must be in [-2, 2], got {v}"));
            }
        }
        for &(id, bias) in &self.logit_bias {
            if id as usize >= vocab || !(bias.is_finite() && (-100.0..=100.0).contains(&bias)) {
                return bad(format!("logit_bias entry {id}: {bias} (ids below {vocab}, bias in [-100, 100])"));
            }
        }
        Ok(())
    }
}

/// One sampling step's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub id: u32,
    /// log p(id) under the model's distribution.
    pub logprob: f32,
    /// Predictive entropy of the model's distribution, in nats.
    pub entropy: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// What a step's caller needs from a sequence's last row of logits, so that a backend
/// holding the logits elsewhere (the GPU) computes and moves only that.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum RowNeed {
    /// The whole row (sampling with a temperature draws on the host).
    #[default]
    Logits,
    /// Nothing: the sequence is still reading its prompt.
    Nothing,
    /// A greedy pick: the argmax after `adjust` (added in order to the logits of their
    /// ids: logit bias, then penalties, as [`Sampler`] applies them) and the statistics
    /// of the raw row with its `top_n` most likely tokens.
    Greedy { top_n: usize, adjust: Vec<(u32, f32)> },
}

/// A [`RowNeed::Greedy`] step computed where the logits are.
#[derive(Debug, Clone, PartialEq)]
pub struct GreedyRow {
    /// The pick: the first largest adjusted logit.
    pub id: u32,
    /// The raw logit of `id`.
    pub id_logit: f32,
    /// `ln Σ e^l` of the raw row.
    pub log_z: f32,
    /// Entropy of the raw row's softmax, in nats.
    pub entropy: f32,
    /// The `top_n` largest raw logits as (id, logit), largest first, ties by lower id.
    pub top: Vec<(u32, f32)>,
}

/// The sampling state of one request.
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// Times each token id was generated so far (for the penalties).
    counts: HashMap<u32, u32>,
    /// `[vocab]` adjusted logits, reused across steps.
    work: Vec<f32>,
}

impl Sampler {
    pub fn new(params: &SamplingParams) -> Sampler {
        let rng = match params.seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        Sampler { params: params.clone(), rng, counts: HashMap::new(), work: Vec::new() }
    }

    /// Picks the next token from `logits` (`[vocab]`), reports the statistics with the
    /// `top_n` (at most 20) most likely alternatives, and counts the pick for penalties.
    pub fn sample(&mut self, logits: &[f32], top_n: usize) -> Sampled {
        self.sample_where(logits, top_n, None)
    }

    /// [`Sampler::sample`] choosing only among the ids `allowed` accepts (at least one
    /// must be); the statistics still describe the model's whole distribution.
    pub fn sample_allowed(&mut self, logits: &[f32], top_n: usize, allowed: impl Fn(u32) -> bool) -> Sampled {
        self.sample_where(logits, top_n, Some(&allowed))
    }

    fn sample_where(&mut self, logits: &[f32], top_n: usize, allowed: Option<&dyn Fn(u32) -> bool>) -> Sampled {
        let (log_z, entropy) = log_partition_and_entropy(logits);
        self.adjust(logits);
        if let Some(allowed) = allowed {
            for (id, v) in self.work.iter_mut().enumerate() {
                if !allowed(id as u32) {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let id = if self.params.temperature <= 0.0 { argmax(&self.work) } else { self.draw() };
        *self.counts.entry(id).or_insert(0) += 1;
        let logprob = logits.get(id as usize).map_or(f32::NEG_INFINITY, |l| l - log_z);
        let top = top_n_ids(logits, top_n.min(MAX_TOP_LOGPROBS))
            .into_iter()
            .map(|i| (i, logits[i as usize] - log_z))
            .collect();
        Sampled { id, logprob, entropy, top }
    }

    /// What the next step needs from its row: for a greedy request the pick can be made
    /// where the logits are ([`RowNeed::Greedy`]); a draw needs the whole row.
    pub fn need(&self, top_n: usize) -> RowNeed {
        if self.params.temperature > 0.0 {
            return RowNeed::Logits;
        }
        RowNeed::Greedy { top_n: top_n.min(MAX_TOP_LOGPROBS), adjust: self.adjustments().collect() }
    }

    /// [`Sampler::sample`] for a greedy request whose row was reduced elsewhere to `row`
    /// (asked for with [`Sampler::need`]): the same token and statistics.
    pub fn accept(&mut self, row: &GreedyRow, top_n: usize) -> Sampled {
        *self.counts.entry(row.id).or_insert(0) += 1;
        let top = row.top.iter().take(top_n.min(MAX_TOP_LOGPROBS)).map(|&(id, l)| (id, l - row.log_z)).collect();
        Sampled { id: row.id, logprob: row.id_logit - row.log_z, entropy: row.entropy, top }
    }

    /// `(id, delta)` in the order `adjust` adds them: each bias, then each penalty
    /// (negated: `v - p` and `v + (-p)` round alike). Without penalties there are no
    /// penalty entries: adding -0.0 would change no logit, and a greedy pick on the GPU
    /// would search a list that grows with every token.
    fn adjustments(&self) -> impl Iterator<Item = (u32, f32)> + '_ {
        let (presence, frequency) = (self.params.presence_penalty, self.params.frequency_penalty);
        let penalized = presence != 0.0 || frequency != 0.0;
        let penalties = self
            .counts
            .iter()
            .filter(move |_| penalized)
            .map(move |(&id, &n)| (id, -(presence + frequency * n as f32)));
        self.params.logit_bias.iter().copied().chain(penalties)
    }

    /// `work = logits + bias - penalties`.
    fn adjust(&mut self, logits: &[f32]) {
        let mut work = std::mem::take(&mut self.work);
        work.clear();
        work.extend_from_slice(logits);
        for (id, delta) in self.adjustments() {
            if let Some(v) = work.get_mut(id as usize) {
                *v += delta;
            }
        }
        self.work = work;
    }

    /// Temperature, top-k, top-p, then a draw from what is left.
    fn draw(&mut self) -> u32 {
        // Unnormalised probabilities; normalising is unnecessary for a draw.
        attention::exp_shifted(&mut self.work, 1.0 / self.params.temperature);
        let n = self.work.len();
        let k = if self.params.top_k == 0 { n } else { self.params.top_k.min(n) };
        if k == n && self.params.top_p >= 1.0 {
            let weights = self.work.iter().enumerate().map(|(i, p)| (i as u32, *p));
            return pick(&mut self.rng, weights);
        }
        let mut cand: Vec<(u32, f32)> = self.work.iter().enumerate().map(|(i, p)| (i as u32, *p)).collect();
        if k < cand.len() {
            keep_largest(&mut cand, k);
        }
        if self.params.top_p < 1.0 {
            nucleus(&mut cand, self.params.top_p);
        }
        pick(&mut self.rng, cand.into_iter())
    }
}

/// Draws an id with probability proportional to its weight (the last one if rounding
/// leaves the draw past the end; id 0 when there are none).
fn pick(rng: &mut StdRng, weights: impl Iterator<Item = (u32, f32)> + Clone) -> u32 {
    let total: f32 = weights.clone().map(|c| c.1).sum();
    let mut r = rng.gen::<f32>() * total;
    let mut last = 0;
    for (id, p) in weights {
        if r < p {
            return id;
        }
        r -= p;
        last = id;
    }
    last
}

/// Keeps the `k` largest candidates, sorted by probability (descending, then id).
fn keep_largest(cand: &mut Vec<(u32, f32)>, k: usize) {
    let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    if k > 0 && k < cand.len() {
        cand.select_nth_unstable_by(k - 1, order);
        cand.truncate(k);
    }
    cand.sort_unstable_by(order);
}

/// Keeps the smallest prefix (by descending probability) whose mass reaches `p`.
fn nucleus(cand: &mut Vec<(u32, f32)>, p: f32) {
    let total: f32 = cand.iter().map(|c| c.1).sum();
    let target = p * total;
    // Most mass sits in few tokens: try a short sorted prefix before sorting everything.
    let mut sorted = cand.clone();
    let first = NUCLEUS_FIRST_PASS.min(sorted.len());
    keep_largest(&mut sorted, first);
    if sorted.iter().map(|c| c.1).sum::<f32>() < target {
        sorted = std::mem::take(cand);
        keep_largest(&mut sorted, 0);
    }
    let mut acc = 0.0;
    let cut = sorted.iter().position(|c| {
        acc += c.1;
        acc >= target
    });
    sorted.truncate(cut.map_or(sorted.len(), |i| i + 1));
    *cand = sorted;
}

/// The first index of the largest value (ties go to the lowest id, as in the reference).
fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// `(log Σ exp(l), -Σ p log p)` of the softmax of `logits` (vectorised; sums in f64).
fn log_partition_and_entropy(logits: &[f32]) -> (f32, f32) {
    let (max, z, zl) = attention::softmax_moments(logits);
    let log_z = z.ln();
    // H = log Z - E[l - max]
    (max + log_z as f32, (log_z - zl / z) as f32)
}

/// Ids of the `n` largest logits, largest first (ties by lower id), in one pass that
/// keeps only the best `n` (a step asks for at most 20 of a whole vocabulary).
fn top_n_ids(logits: &[f32], n: usize) -> Vec<u32> {
    if n == 0 {
        return Vec::new();
    }
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    for (i, &l) in logits.iter().enumerate() {
        if best.len() == n && best.last().is_some_and(|worst| l.total_cmp(&worst.1).is_le()) {
            continue;
        }
        // After every kept value at least as large: equal values stay in id order.
        let at = best.partition_point(|b| b.1.total_cmp(&l).is_ge());
        best.insert(at, (i as u32, l));
        best.truncate(n);
    }
    best.into_iter().map(|b| b.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        (0..100).map(|i| ((i * 37 % 100) as f32) * 0.05).collect()
    }

    #[test]
    fn greedy_takes_the_argmax_and_reports_statistics() {
        let l = logits();
        let mut s = Sampler::new(&SamplingParams::greedy());
        let out = s.sample(&l, 5);
        assert_eq!(out.id, argmax(&l));
        assert_eq!(out.top.len(), 5);
        assert_eq!(out.top[0].0, out.id);
        assert!((out.top[0].1 - out.logprob).abs() < 1e-6);
        assert!(out.top.windows(2).all(|w| w[0].1 >= w[1].1));
        let p: f64 = l.iter().map(|v| f64::from(v - l.iter().cloned().fold(f32::MIN, f32::max)).exp()).sum();
        assert!(out.logprob < 0.0 && out.logprob > -(p.ln() as f32) - 1e-3);
    }

    #[test]
    fn top_n_agrees_with_a_full_sort_ties_by_id() {
        let mut l = logits();
        l.extend([4.95, 4.95, f32::NEG_INFINITY, 4.95]);
        let mut sorted: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, v)| (i as u32, *v)).collect();
        sorted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        for n in [0, 1, 3, 20, l.len()] {
            let want: Vec<u32> = sorted.iter().take(n).map(|c| c.0).collect();
            assert_eq!(top_n_ids(&l, n), want, "n={n}");
        }
    }

    #[test]
    fn entropy_of_uniform_is_log_n() {
        let (_, h) = log_partition_and_entropy(&[0.5; 64]);
        assert!((h - 64f32.ln()).abs() < 1e-5);
    }

    #[test]
    fn same_seed_same_tokens() {
        let l = logits();
        let p = SamplingParams { temperature: 1.0, seed: Some(7), ..SamplingParams::default() };
        let run = || {
            let mut s = Sampler::new(&p);
            (0..50).map(|_| s.sample(&l, 0).id).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|id| *id != a[0]), "temperature 1 should vary");
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_tiny_is_greedy() {
        let l = logits();
        for p in [
            SamplingParams { top_k: 1, seed: Some(1), ..SamplingParams::default() },
            SamplingParams { top_p: 1e-6, seed: Some(1), ..SamplingParams::default() },
        ] {
            let mut s = Sampler::new(&p);
            assert!((0..20).all(|_| s.sample(&l, 0).id == argmax(&l)));
        }
    }

    #[test]
    fn logit_bias_and_penalties_steer_greedy() {
        let l = logits();
        let mut s = Sampler::new(&SamplingParams { logit_bias: vec![(3, 100.0)], ..SamplingParams::greedy() });
        assert_eq!(s.sample(&l, 0).id, 3);
        // With a strong frequency penalty greedy never repeats a token twice in a row.
        let mut s =
            Sampler::new(&SamplingParams { frequency_penalty: 2.0, presence_penalty: 2.0, ..SamplingParams::greedy() });
        let ids: Vec<u32> = (0..5).map(|_| s.sample(&l, 0).id).collect();
        assert!(ids.windows(2).all(|w| w[0] != w[1]), "{ids:?}");
    }

    /// What a device computes for a greedy row, done here from the logits.
    fn reduce(logits: &[f32], need: &RowNeed) -> GreedyRow {
        let RowNeed::Greedy { top_n, adjust } = need else { panic!("not greedy: {need:?}") };
        let mut adjusted = logits.to_vec();
        for &(id, delta) in adjust {
            adjusted[id as usize] += delta;
        }
        let id = argmax(&adjusted);
        let (log_z, entropy) = log_partition_and_entropy(logits);
        let top = top_n_ids(logits, *top_n).into_iter().map(|i| (i, logits[i as usize])).collect();
        GreedyRow { id, id_logit: logits[id as usize], log_z, entropy, top }
    }

    #[test]
    fn a_greedy_step_reduced_elsewhere_equals_sampling_the_row_here() {
        let l = logits();
        let params = SamplingParams {
            logit_bias: vec![(3, 2.5), (71, -100.0), (3, 0.25)],
            frequency_penalty: 0.7,
            presence_penalty: 0.3,
            ..SamplingParams::greedy()
        };
        let (mut here, mut there) = (Sampler::new(&params), Sampler::new(&params));
        for step in 0..12 {
            let need = there.need(4);
            let want = here.sample(&l, 4);
            assert_eq!(there.accept(&reduce(&l, &need), 4), want, "step {step}");
        }
        assert_eq!(Sampler::new(&SamplingParams::default()).need(4), RowNeed::Logits, "a draw needs the row");
        // Without penalties only the biases are sent, however many tokens came before.
        let mut plain = Sampler::new(&SamplingParams { logit_bias: vec![(5, 1.0)], ..SamplingParams::greedy() });
        for _ in 0..5 {
            plain.sample(&l, 0);
        }
        assert_eq!(plain.need(0), RowNeed::Greedy { top_n: 0, adjust: vec![(5, 1.0)] });
    }

    #[test]
    fn validation_rejects_out_of_range() {
        assert!(SamplingParams::default().validate(10).is_ok());
        assert!(SamplingParams { temperature: -1.0, ..SamplingParams::default() }.validate(10).is_err());
        assert!(SamplingParams { top_p: 0.0, ..SamplingParams::default() }.validate(10).is_err());
        assert!(SamplingParams { logit_bias: vec![(10, 1.0)], ..SamplingParams::default() }.validate(10).is_err());
        assert!(SamplingParams { frequency_penalty: f32::NAN, ..SamplingParams::default() }.validate(10).is_err());
    }
}
