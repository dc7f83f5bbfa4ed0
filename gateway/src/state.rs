//! The shared state behind every route: validated config, authenticator, one backend per
//! model id, the running rules, protection (canaries, provenance, statistics, audit), limits,
//! the admin login throttle, metrics. Built once at start-up; afterwards only what the pieces
//! guard themselves changes: the rules (swapped whole on reload, with the last reload's
//! record), counters, limit windows, backend readiness.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use firewall::ReloadableRuleset;

use crate::auth::Authenticator;
use crate::backend::{Backend, EngineBackend, UpstreamBackend};
use crate::config::{Config, ModelBackend};
use crate::error::ApiError;
use crate::login_throttle::LoginThrottle;
use crate::metrics::Metrics;
use crate::protection::{self, Protection, ProtectionError};

/// Everything a request handler can reach.
pub struct AppState {
    pub config: Arc<Config>,
    pub auth: Authenticator,
    /// Model id -> backend, in id order.
    pub models: BTreeMap<String, Backend>,
    pub metrics: Metrics,
    /// Counts wrong admin tokens; refuses admin logins past `[admin_throttle]`.
    pub login_throttle: LoginThrottle,
    /// The compiled rule files; swapped whole on reload.
    pub rules: ReloadableRuleset,
    /// Start-up time, seconds since the epoch (the `created` of listed models).
    pub started_unix: u64,
    /// Provenance index, statistics, store, detectors, canaries.
    pub protection: Arc<Protection>,
    /// Held for the whole of a reload: two at once (the folder watch and an admin) could
    /// otherwise swap in the older files last.
    reloading: Mutex<()>,
    /// What the last reload did, whoever asked for it.
    last_reload: Mutex<Option<ReloadRecord>>,
    /// Per-tenant concurrency and rate limits.
    pub limits: crate::limits::Limiter,
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
    pub result: Result<Reloaded, firewall::LoadErrors>,
}

/// What a successful rule reload installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloaded {
    pub rules: usize,
    pub canaries: usize,
    pub generation: u64,
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("rule files:\n{0}")]
    Rules(firewall::LoadErrors),
    #[error("{0}")]
    Protection(#[from] ProtectionError),
    #[error("model {model}: {reason}")]
    Model { model: String, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("{0}")]
    Serve(std::io::Error),
}

impl AppState {
    /// Opens the store and builds the backends named in `config`; starts the background
    /// tasks (store upkeep, fingerprint and statistics sharing, the rule folder watch), so
    /// call it inside the runtime that serves.
    pub async fn build(config: Config) -> Result<Arc<AppState>, StartError> {
        let mut models = BTreeMap::new();
        for model in &config.models {
            let backend = match &model.backend {
                ModelBackend::Upstream(up) => Backend::Upstream(
                    UpstreamBackend::new(up.clone())
                        .map_err(|e| StartError::Model { model: model.id.clone(), reason: e.to_string() })?,
                ),
                ModelBackend::Engine(e) => Backend::Engine(EngineBackend::spawn_load(&model.id, e)),
            };
            models.insert(model.id.clone(), backend);
        }
        let protection = Arc::new(Protection::open(&config).await?);
        let rules = protection::load_rules(&config, &protection).map_err(StartError::Rules)?;
        tracing::info!(rules = rules.len(), canaries = rules.canaries().len(), "firewall rules loaded");
        protection.spawn_background(&config);
        let limits = crate::limits::Limiter::new(config.limits.clone());
        let state = Arc::new(AppState {
            protection,
            rules: ReloadableRuleset::new(rules),
            auth: Authenticator::new(&config.tenants),
            login_throttle: LoginThrottle::new(config.admin_throttle),
            config: Arc::new(config),
            models,
            metrics: Metrics::new(),
            started_unix: unix_now(),
            reloading: Mutex::new(()),
            last_reload: Mutex::new(None),
            limits,
        });
        crate::rules_watch::spawn(&state);
        Ok(state)
    }

    /// Recompiles the rule files (and the injected canaries) and swaps them in; when they
    /// do not load, the running rules stay and the errors come back. `via` names the caller
    /// in the log line and the [`ReloadRecord`]. Compiling takes seconds of CPU: async code
    /// calls [`AppState::reload_rules_blocking_pool`].
    pub fn reload_rules(&self, via: &'static str) -> Result<Reloaded, firewall::LoadErrors> {
        let _one_at_a_time = self.reloading.lock().unwrap_or_else(PoisonError::into_inner);
        let result = match protection::load_rules(&self.config, &self.protection) {
            Ok(rules) => {
                let (count, canaries) = (rules.len(), rules.canaries().len());
                let generation = self.rules.swap(rules);
                tracing::info!(rules = count, canaries, generation, via, "firewall rules reloaded");
                Ok(Reloaded { rules: count, canaries, generation })
            }
            Err(errors) => {
                tracing::warn!(errors = errors.errors.len(), via, "rule reload rejected; the running rules stay");
                Err(errors)
            }
        };
        self.metrics.observe_rule_reload(via, result.is_ok());
        let record = ReloadRecord {
            at_ms: crate::store::now_ms(),
            via,
            generation: self.rules.generation(),
            result: result.clone(),
        };
        *self.last_reload.lock().unwrap_or_else(PoisonError::into_inner) = Some(record);
        result
    }

    /// [`AppState::reload_rules`] on the blocking pool, so that a reload holds up no
    /// request.
    pub async fn reload_rules_blocking_pool(
        self: &Arc<Self>,
        via: &'static str,
    ) -> Result<Reloaded, firewall::LoadErrors> {
        let state = Arc::clone(self);
        match tokio::task::spawn_blocking(move || state.reload_rules(via)).await {
            Ok(result) => result,
            // A panic while loading: resume it here, as if the reload had run inline.
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(firewall::LoadErrors {
                errors: vec![firewall::LoadError {
                    file: String::new(),
                    line: 0,
                    rule_id: None,
                    reason: "the reload was cancelled: the gateway is shutting down".to_owned(),
                }],
            }),
        }
    }

    /// The last reload since start-up (the rules loaded at start are not one).
    pub fn last_reload(&self) -> Option<ReloadRecord> {
        self.last_reload.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The backend serving `model`, or the OpenAI 404.
    pub fn backend(&self, model: &str) -> Result<&Backend, ApiError> {
        self.models.get(model).ok_or_else(|| ApiError::ModelNotFound(model.to_owned()))
    }
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
