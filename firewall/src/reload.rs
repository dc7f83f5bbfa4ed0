//! Hot reload (placeholder).
pub struct ReloadableRuleset;
