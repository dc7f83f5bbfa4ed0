//! Fault injection: switches that each disable one isolation defence of the KV cache, so
//! that every defence has a test which fails without it, and so that the production bug
//! (a new request handed another tenant's not-yet-cleared KV) can be re-created on purpose.
//!
//! Owns the switches and their validation. The pool and the sequences consult them; the
//! gateway reads them from its configuration and warns loudly at start-up.
//!
//! Invariants: the default is every defence on; `stale_kv` is a probability in `[0, 1]`.

use crate::error::{Error, Result};

/// Which defences to switch off. `FaultConfig::default()` switches none off.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability that a new sequence is handed a recently released block of another
    /// tenant, old contents included, as part of its readable context (the production
    /// bug). Released blocks then wait, unzeroed, in a short queue they can be taken from.
    pub stale_kv: f64,
    /// Released blocks are not zero-filled before they are reused.
    pub skip_zero_fill: bool,
    /// Attention reads blocks whatever tenant they belong to.
    pub skip_owner_check: bool,
    /// Attention reads past the sequence's length and past its own block table (into the
    /// physically next blocks of the pool).
    pub skip_bounds_check: bool,
    /// Prefix-cache hashes carry no tenant salt and lookups do not check the tenant, so
    /// tenants sending the same prefix share blocks.
    pub unsalted_prefix_cache: bool,
}

impl FaultConfig {
    /// Checks `stale_kv` is a probability.
    pub fn validate(&self) -> Result<()> {
        if !(0.0..=1.0).contains(&self.stale_kv) {
            return Err(Error::InvalidOptions {
                reason: format!("fault.stale_kv must be between 0 and 1, got {}", self.stale_kv),
            });
        }
        Ok(())
    }

    /// The names of the switches that are on (empty when every defence is on).
    pub fn active(&self) -> Vec<&'static str> {
        let switches = [
            ("stale_kv", self.stale_kv > 0.0),
            ("skip_zero_fill", self.skip_zero_fill),
            ("skip_owner_check", self.skip_owner_check),
            ("skip_bounds_check", self.skip_bounds_check),
            ("unsalted_prefix_cache", self.unsalted_prefix_cache),
        ];
        switches.iter().filter(|(_, on)| *on).map(|(name, _)| *name).collect()
    }

    /// Draws whether this new sequence gets a stale block (never when `stale_kv` is 0).
    pub(crate) fn draw_stale(&self) -> bool {
        self.stale_kv > 0.0 && (self.stale_kv >= 1.0 || rand::random::<f64>() < self.stale_kv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_switch_nothing_off() {
        let f = FaultConfig::default();
        assert!(f.active().is_empty());
        assert!(!f.draw_stale());
        assert!(f.validate().is_ok());
    }

    #[test]
    fn stale_probability_is_checked_and_one_always_draws() {
        assert!(FaultConfig { stale_kv: 1.5, ..FaultConfig::default() }.validate().is_err());
        assert!(FaultConfig { stale_kv: -0.1, ..FaultConfig::default() }.validate().is_err());
        let always = FaultConfig { stale_kv: 1.0, skip_owner_check: true, ..FaultConfig::default() };
        assert!(always.draw_stale());
        assert_eq!(always.active(), ["stale_kv", "skip_owner_check"]);
    }
}
