//! Detectors beyond the rule files: canary ownership lives in `scan`; here are the foreign
//! n-gram, entropy and provenance detectors, the ownership of secret values, the
//! responding tenant's [`ScanContext`], and the [`Detectors`] configuration a stream is
//! created with.
//!
//! Everything the detectors need from the outside world (who owns an n-gram, what a
//! tenant's baseline is) comes through small synchronous traits the gateway implements from
//! memory; nothing here does I/O.

pub mod encoded;
pub mod entropy;
pub(crate) mod html_table;
pub mod ngram;
pub(crate) mod pairs;
pub mod provenance;
pub mod rewrite;
pub mod secret;
pub(crate) mod table;

use crate::rules::ruleset::Ruleset;
use crate::verdict::{Action, Finding};

pub use encoded::{decoded_texts, DecodeConfig, Encoding};
pub use entropy::{Baseline, Baselines, EntropyConfig, Metric, Observations, Observed};
pub use ngram::{
    fingerprints, fingerprints_and_tokens, token_fingerprints, NgramConfig, NgramKey, NgramOwners, OwnerSet,
};
pub use provenance::ProvenanceConfig;
pub use rewrite::Rewrite;
pub use secret::{secret_fingerprints, SecretOwnership};

/// Whose response is being scanned.
#[derive(Debug, Clone, PartialEq)]
pub struct ScanContext {
    /// The responding tenant; empty = unknown, in which case every owner is foreign.
    pub tenant: String,
    /// Owners that are never foreign (e.g. the system prompt's owner).
    pub trusted_owners: Vec<String>,
    /// The verdict on a secret this tenant owns coming back to it (see
    /// [`Detectors::secrets`]); `Allow` counts as `Log`: a finding is always recorded.
    pub own_secrets: Action,
}

impl Default for ScanContext {
    fn default() -> Self {
        ScanContext { tenant: String::new(), trusted_owners: Vec::new(), own_secrets: Action::Log }
    }
}

impl ScanContext {
    pub fn new(tenant: impl Into<String>) -> ScanContext {
        ScanContext { tenant: tenant.into(), ..ScanContext::default() }
    }

    /// No responding tenant: used by one-shot CLI scans.
    pub fn anonymous() -> ScanContext {
        ScanContext::default()
    }

    /// Whether data owned by `owner` must not reach this tenant.
    pub fn is_foreign(&self, owner: &str) -> bool {
        owner != self.tenant && !self.trusted_owners.iter().any(|t| t == owner)
    }
}

/// Which optional detectors run, and how. `Default` = none (secret rules and canaries only).
#[derive(Clone, Default)]
pub struct Detectors {
    pub ngram: Option<NgramConfig>,
    pub entropy: Option<EntropyConfig>,
    pub provenance: Option<ProvenanceConfig>,
    /// Who owns the secret values the rules find: a tenant's own secret coming back to it
    /// is not a leak, another tenant's is one whatever its rule says.
    pub secrets: Option<SecretOwnership>,
    /// Whether encoded text (base64, hex, percent-encoding, grouped runs, spelled-out
    /// characters, byte lists) is read decoded (see `encoded`).
    pub decode: Option<DecodeConfig>,
}

/// What an engine reports alongside one token's text.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenSignals {
    /// Natural log of the sampled token's probability.
    pub logprob: Option<f64>,
    /// Entropy of the predictive distribution (nats).
    pub entropy: Option<f64>,
    /// Owners whose KV data this token attended to.
    pub owners: Vec<String>,
}

/// The text-only detectors over a complete text found `depth` layers of encoding deep
/// (one-shot twin of the stream's path).
pub(crate) fn scan_text(
    rules: &Ruleset,
    text: &str,
    ctx: &ScanContext,
    detectors: &Detectors,
    depth: usize,
    out: &mut Vec<Finding>,
) {
    if let Some(cfg) = &detectors.ngram {
        let mut st = ngram::NgramState::new(cfg.n);
        crate::canon::decode_plain(text, |d| st.feed_char(cfg, ctx, d, out));
        st.finish(cfg, ctx, text.len(), out);
    }
    if let (Some(cfg), 0) = (&detectors.entropy, depth) {
        let mut st = entropy::EntropyState::default();
        st.feed_text(cfg, ctx, text, 0, out);
    }
    if let (Some(cfg), true) = (&detectors.decode, depth < encoded::MAX_DEPTH) {
        let reader = encoded::Reader { rules, ctx, detectors, depth };
        let mut st = encoded::EncodedState::new(cfg, encoded::SEGMENT_CHARS);
        let mut judge = |d: &encoded::DecodedText| encoded::judge(reader, d, out);
        st.feed_plain(text, 0, &mut judge);
        st.finish(&mut judge);
    }
}
