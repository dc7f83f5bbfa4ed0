//! The crossguard firewall: rule files, a streaming scanner that never releases a complete
//! match of a block rule, and the detectors that keep one tenant's data out of another's
//! responses (secret rules, canaries, foreign n-grams and tokens, entropy, provenance), also
//! when a response writes them in base64, hex or percent-encoding.
//!
//! The detectors read a canonical view of the text as well as the text itself (`canon`):
//! Unicode-folded (NFKC, look-alikes to their ASCII prototypes), invisible characters
//! removed, JSON escapes decoded in tool-call arguments
//! ([`StreamScanner::decode_json_strings`]), so a disguised leak is caught like a plain one.
//! Ownership decides the verdict: a tenant's own text and secrets coming back to it are not
//! a leak ([`OwnerSet`], [`SecretOwnership`], [`secret_fingerprints`]); another tenant's are.
//!
//! This crate is synchronous and does no I/O except reading a rule folder
//! ([`Ruleset::dir_sources`], behind [`Ruleset::load_dir`]). What it needs from the gateway (n-gram owners, tenant baselines) it asks through
//! two traits, [`NgramOwners`] and [`Baselines`].
//!
//! Typical use:
//! ```
//! use std::sync::Arc;
//! use firewall::{Detectors, Ruleset, ScanContext, StreamScanner};
//! let rules = Arc::new(Ruleset::builtin().unwrap_or_else(|_| Ruleset::empty()));
//! let mut s = StreamScanner::new(rules, ScanContext::new("acme"), Arc::new(Detectors::default()));
//! let mut out = s.push("Hello, ").release;
//! out += &s.push("world").release;
//! out += &s.finish().release;
//! assert_eq!(out, "Hello, world");
//! ```
// `unsafe` is allowed in three places: the AVX2 and AVX-512 keyword filter loops
// (`scan::keywords::x86`), the wide check for text the canonical view may change
// (`canon::wide`) and a cache prefetch hint in one-shot batches (`scan::prefetch`).
#![deny(unsafe_code)]

mod canon;
mod detect;
mod rules;
mod scan;
mod stream;
mod verdict;

pub use detect::ngram::{
    DEFAULT_N as DEFAULT_NGRAM_WORDS, RULE_ID as FOREIGN_NGRAM_RULE_ID, TOKEN_RULE_ID as FOREIGN_TOKEN_RULE_ID,
};
pub use detect::{
    decoded_texts, fingerprints, fingerprints_and_tokens, secret_fingerprints, token_fingerprints, Baseline, Baselines,
    DecodeConfig, Detectors, Encoding, EntropyConfig, Metric, NgramConfig, NgramKey, NgramOwners, Observations,
    Observed, OwnerSet, ProvenanceConfig, Rewrite, ScanContext, SecretOwnership, TokenSignals,
};
pub use rules::gitleaks::{import as import_gitleaks, Import as GitleaksImport, ImportNote as GitleaksImportNote};
pub use rules::reload::ReloadableRuleset;
pub use rules::rule::{shannon_entropy, Canary, RawCanary, Rule};
pub use rules::ruleset::{
    LoadError, LoadErrors, LoadOptions, Origin, RuleFiles, RuleSource, Ruleset, INJECTED_CANARIES,
};
pub use rules::samples::{RuleSamples, SampleFailure, SampleReport};
pub use scan::judge::{
    context_before as judge_context, letter_pairs, Judge, ModelError as JudgeModelError, FEATURES as JUDGE_FEATURES,
};
pub use stream::{Step, StreamScanner, MAX_HOLDBACK_BYTES};
pub use verdict::{mask, Action, Detail, DetectorKind, Finding, Severity};

/// The environment variable that caps the keyword loops' SIMD level (`avx2` or `portable`),
/// so that a host with AVX-512 measures what an AVX2-only host runs.
pub const SIMD_ENV: &str = "CROSSGUARD_FIREWALL_SIMD";

/// Errors of this crate outside rule loading (which reports [`LoadErrors`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("rule files: {0}")]
    Load(#[from] LoadErrors),
    #[error("gitleaks config is not valid TOML at line {line}: {reason}")]
    GitleaksSyntax { line: usize, reason: String },
}
