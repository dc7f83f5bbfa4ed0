//! Hot reload: the running ruleset, swapped whole for a new one. A caller that compiles
//! its rules with canaries of its own (the gateway's `rules` module) hands the result to
//! [`ReloadableRuleset::swap`]; [`ReloadableRuleset::reload`] loads a folder alone, for a
//! library user without canaries.
//!
//! Invariants: readers always get a complete, validated ruleset (`Arc` swap under a
//! `RwLock`; the lock is held only to clone or replace the `Arc`, never while compiling);
//! a failed reload changes nothing and returns every error; the generation counter
//! increases by one per successful swap, so streams can record which rules judged them.
//! Streams already running keep the `Arc<Ruleset>` they started with.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::rules::ruleset::{LoadErrors, Ruleset};

#[derive(Debug)]
pub struct ReloadableRuleset {
    current: RwLock<Arc<Ruleset>>,
    generation: AtomicU64,
}

impl ReloadableRuleset {
    pub fn new(rules: Ruleset) -> ReloadableRuleset {
        ReloadableRuleset { current: RwLock::new(Arc::new(rules)), generation: AtomicU64::new(1) }
    }

    /// The ruleset new streams should use.
    pub fn current(&self) -> Arc<Ruleset> {
        // A poisoned lock still holds a complete Arc: swapping is a single assignment.
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// 1 for the initial ruleset, +1 per successful reload.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Loads `dir` and swaps it in; on failure the old ruleset stays. Returns the new
    /// generation.
    pub fn reload(&self, dir: &Path) -> Result<u64, LoadErrors> {
        let rules = Ruleset::load_dir(dir)?;
        Ok(self.swap(rules))
    }

    /// Swaps in an already loaded ruleset; returns the new generation.
    pub fn swap(&self, rules: Ruleset) -> u64 {
        let mut guard = self.current.write().unwrap_or_else(|e| e.into_inner());
        *guard = Arc::new(rules);
        self.generation.fetch_add(1, Ordering::AcqRel) + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: &str = "[[rule]]\nid = \"r-ID\"\ndescription = \"d\"\nseverity = \"low\"\naction = \"log\"\nregex = 'tok_[0-9]{6}'\nkeywords = [\"tok_\"]\nmust_match = [\"tok_123456\"]\n";

    #[test]
    fn failed_reload_keeps_the_old_rules() {
        let Ok(dir) = tempfile::tempdir() else { return };
        let write = |id: &str, extra: &str| {
            std::fs::write(dir.path().join("r.toml"), format!("{}{extra}", RULE.replace("ID", id)))
        };
        let _ = write("one", "");
        let r = ReloadableRuleset::new(Ruleset::empty());
        assert_eq!(r.generation(), 1);
        assert_eq!(r.reload(dir.path()), Ok(2));
        let before = r.current();
        assert_eq!(before.rules()[0].id, "r-one");
        let _ = write("two", "bogus = 1\n");
        let err = r.reload(dir.path());
        assert!(matches!(&err, Err(e) if e.errors[0].reason.contains("unknown field `bogus`")), "{err:?}");
        assert_eq!(r.generation(), 2);
        assert!(Arc::ptr_eq(&before, &r.current()));
        let _ = write("two", "");
        assert_eq!(r.reload(dir.path()), Ok(3));
        assert_eq!(r.current().rules()[0].id, "r-two");
    }
}
