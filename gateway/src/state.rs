//! The shared state behind every route: validated config, authenticator, one backend per
//! model id, the running rules, protection (canaries, provenance, statistics, audit), limits,
//! the admin login throttle, metrics. Built once at start-up; afterwards only what the pieces
//! guard themselves changes: the rules (swapped whole on reload, with the last reload's
//! record), counters, limit windows, backend readiness.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::auth::Authenticator;
use crate::backend::{Backend, EngineBackend, UpstreamBackend};
use crate::config::{Config, ModelBackend};
use crate::error::ApiError;
use crate::login_throttle::LoginThrottle;
use crate::metrics::Metrics;
use crate::protection::{Protection, ProtectionError};
use crate::rules::Rules;

/// Everything a request handler can reach.
pub struct AppState {
    pub config: Arc<Config>,
    pub auth: Authenticator,
    /// Model id -> backend, in id order.
    pub models: BTreeMap<String, Backend>,
    pub metrics: Metrics,
    /// Counts wrong admin tokens; refuses admin logins past `[admin_throttle]`.
    pub login_throttle: LoginThrottle,
    /// The running rules and their reloads.
    pub rules: Rules,
    /// Start-up time, seconds since the epoch (the `created` of listed models).
    pub started_unix: u64,
    /// Provenance index, statistics, store, detectors, canaries.
    pub protection: Arc<Protection>,
    /// Per-tenant concurrency and rate limits.
    pub limits: crate::limits::Limiter,
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
        let rules = Rules::load(&config, &protection).map_err(StartError::Rules)?;
        protection.spawn_background(&config);
        let limits = crate::limits::Limiter::new(config.limits.clone());
        let state = Arc::new(AppState {
            protection,
            rules,
            auth: Authenticator::new(&config.tenants),
            login_throttle: LoginThrottle::new(config.admin_throttle),
            config: Arc::new(config),
            models,
            metrics: Metrics::new(),
            started_unix: unix_now(),
            limits,
        });
        crate::rules::watch::spawn(&state);
        Ok(state)
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
