//! Which firewall rules the gateway runs, decided here and nowhere else: what loads (the
//! rule folder, or the rules built into the binary, plus the canaries the gateway injects),
//! when the running rules are swapped for new ones (a reload asked for by the folder watch
//! in [`watch`], the admin API or the dashboard), and what the last reload did.
//!
//! Invariants: reloads run one at a time, so two callers cannot swap in the older files
//! last; a reload that does not load leaves the running rules in place and returns every
//! error; each one is logged, counted (`crossguard_rule_reloads_total`) and kept as the
//! [`ReloadRecord`] the admin API and the dashboard show. Streams keep the rules they
//! started with ([`firewall::ReloadableRuleset`]).

pub mod watch;

use std::sync::{Arc, Mutex, PoisonError};

use firewall::{LoadErrors, ReloadableRuleset, Ruleset};

use crate::config::Config;
use crate::protection::Protection;
use crate::state::AppState;

/// The running rules, the lock reloads take and the last reload's record.
#[derive(Debug)]
pub struct Rules {
    running: ReloadableRuleset,
    /// Held for the whole of a reload: two at once (the folder watch and an admin) could
    /// otherwise swap in the older files last.
    reloading: Mutex<()>,
    /// What the last reload did, whoever asked for it.
    last_reload: Mutex<Option<ReloadRecord>>,
}

/// One reload, kept for the admin API and the dashboard.
#[derive(Debug, Clone, PartialEq)]
pub struct ReloadRecord {
    /// When it finished, Unix ms.
    pub at_ms: u64,
    /// Who asked: "rule folder watch", "admin API" or "dashboard".
    pub via: &'static str,
    /// The generation running after it.
    pub generation: u64,
    /// What it installed, or why nothing was (the running rules stayed).
    pub result: Result<Reloaded, LoadErrors>,
}

/// What a successful rule reload installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    pub rules: usize,
    pub canaries: usize,
    pub generation: u64,
}

/// Compiles the rule files (or the built-in ones) with `protection`'s injected canaries.
fn compile(config: &Config, protection: &Protection) -> Result<Ruleset, LoadErrors> {
    let files = firewall::RuleFiles::folder_or_builtin(config.firewall.rules_dir.as_deref());
    Ruleset::load(&files, &protection.injected_canaries(), firewall::LoadOptions::default())
}

impl Rules {
    /// The rules to start with; the gateway does not start when they do not load.
    pub fn load(config: &Config, protection: &Protection) -> Result<Rules, LoadErrors> {
        let rules = compile(config, protection)?;
        tracing::info!(rules = rules.len(), canaries = rules.canaries().len(), "firewall rules loaded");
        Ok(Rules { running: ReloadableRuleset::new(rules), reloading: Mutex::new(()), last_reload: Mutex::new(None) })
    }

    /// The rules new responses are scanned with.
    pub fn current(&self) -> Arc<Ruleset> {
        self.running.current()
    }

    /// 1 for the rules loaded at start, +1 per reload that loaded.
    pub fn generation(&self) -> u64 {
        self.running.generation()
    }

    /// The last reload since start-up (the rules loaded at start are not one).
    pub fn last_reload(&self) -> Option<ReloadRecord> {
        self.last_reload.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// Recompiles `state`'s rule files (and the injected canaries) and swaps them in; when
/// they do not load, the running rules stay and the errors come back. `via` names the
/// caller in the log line, the metric and the [`ReloadRecord`]. Compiling takes seconds of
/// CPU: async code calls [`reload_on_blocking_pool`].
pub fn reload(state: &AppState, via: &'static str) -> Result<Reloaded, LoadErrors> {
    let rules = &state.rules;
    let _one_at_a_time = rules.reloading.lock().unwrap_or_else(PoisonError::into_inner);
    let result = match compile(&state.config, &state.protection) {
        Ok(compiled) => {
            let (count, canaries) = (compiled.len(), compiled.canaries().len());
            let generation = rules.running.swap(compiled);
            tracing::info!(rules = count, canaries, generation, via, "firewall rules reloaded");
            Ok(Reloaded { rules: count, canaries, generation })
        }
        Err(errors) => {
            tracing::warn!(errors = errors.errors.len(), via, "rule reload rejected; the running rules stay");
            Err(errors)
        }
    };
    state.metrics.observe_rule_reload(via, result.is_ok());
    let record =
        ReloadRecord { at_ms: crate::store::now_ms(), via, generation: rules.generation(), result: result.clone() };
    *rules.last_reload.lock().unwrap_or_else(PoisonError::into_inner) = Some(record);
    result
}

/// [`reload`] on the blocking pool, so that a reload holds up no request.
pub async fn reload_on_blocking_pool(state: &Arc<AppState>, via: &'static str) -> Result<Reloaded, LoadErrors> {
    let state = Arc::clone(state);
    match tokio::task::spawn_blocking(move || reload(&state, via)).await {
        Ok(result) => result,
        // A panic while loading: resume it here, as if the reload had run inline.
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(LoadErrors {
            errors: vec![firewall::LoadError {
                file: String::new(),
                line: 0,
                rule_id: None,
                reason: "the reload was cancelled: the gateway is shutting down".to_owned(),
            }],
        }),
    }
}
