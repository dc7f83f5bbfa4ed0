//! The rule files: one rule's fields, compiled and checked (`rule`), a folder or the
//! built-in rules loaded into a [`ruleset::Ruleset`] (`ruleset`), the samples `rules test`
//! runs (`samples`), gitleaks configs converted (`gitleaks`) and the running ruleset swapped
//! whole on reload (`reload`).

pub(crate) mod gitleaks;
pub(crate) mod reload;
pub(crate) mod rule;
pub(crate) mod ruleset;
pub(crate) mod samples;
