//! The shared state behind every route: validated config, authenticator, one backend per
//! model id, metrics. Built once at start-up; immutable afterwards except for what the
//! pieces guard themselves (metrics counters, backend readiness).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use firewall::ReloadableRuleset;

use crate::auth::Authenticator;
use crate::backend::{Backend, EngineBackend, UpstreamBackend};
use crate::config::{Config, ModelBackend};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protection::{self, Protection, ProtectionError};

/// Everything a request handler can reach.
pub struct AppState {
    pub config: Arc<Config>,
    pub auth: Authenticator,
    /// Model id -> backend, in id order.
    pub models: BTreeMap<String, Backend>,
    pub metrics: Metrics,
    /// The compiled rule files; swapped whole on reload.
    pub rules: ReloadableRuleset,
    /// Start-up time, seconds since the epoch (the `created` of listed models).
    pub started_unix: u64,
    /// Provenance index, statistics, store, detectors, canaries.
    pub protection: Arc<Protection>,
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
        let state = Arc::new(AppState {
            protection,
            rules: ReloadableRuleset::new(rules),
            auth: Authenticator::new(&config.tenants),
            config: Arc::new(config),
            models,
            metrics: Metrics::new(),
            started_unix: unix_now(),
        });
        crate::rules_watch::spawn(&state);
        Ok(state)
    }

    /// Recompiles the rule files (and the injected canaries) and swaps them in; when they
    /// do not load, the running rules stay and the errors come back. `via` names the caller
    /// in the log line.
    pub fn reload_rules(&self, via: &'static str) -> Result<Reloaded, firewall::LoadErrors> {
        match protection::load_rules(&self.config, &self.protection) {
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
        }
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
