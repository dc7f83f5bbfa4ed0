//! Binding the listener and serving until shutdown. Start-up problems are [`StartError`]s
//! with a message fit for the terminal. How connections are accepted and read (the
//! connection cap, the header read timeout) is `connections`'s.

mod connections;

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::router::router;
use crate::state::{AppState, StartError};

/// Builds the state from `config`, binds `config.listen`, and serves until `shutdown`.
pub async fn run(config: Config, shutdown: impl Future<Output = ()> + Send + 'static) -> Result<(), StartError> {
    let addr = config.listen;
    let state = AppState::build(config).await?;
    let listener = TcpListener::bind(addr).await.map_err(|source| StartError::Bind { addr, source })?;
    serve(state, listener, shutdown).await
}

/// Serves `state` on an already bound listener (tests bind port 0 themselves).
pub async fn serve(
    state: Arc<AppState>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let local = listener.local_addr().map_err(StartError::Serve)?;
    warn_about_exposure(&state, local);
    tracing::info!(addr = %local, models = state.models.len(), "listening");
    let settings = state.config.server.clone();
    connections::serve_connections(listener, router(state), settings, shutdown).await;
    Ok(())
}

/// Start-up warnings for what config validation lets through on purpose: open mode (only
/// on loopback, or with `allow_open`) and an open `/metrics` off loopback.
fn warn_about_exposure(state: &AppState, local: std::net::SocketAddr) {
    if state.auth.is_open() {
        tracing::warn!("no [[tenants]] configured: every request is served as tenant \"anonymous\" without authentication; configure tenants before exposing this gateway");
    }
    if state.config.metrics_token.is_none() && !local.ip().is_loopback() {
        tracing::warn!(addr = %local, "/metrics is open to anyone who reaches this address and names tenants and their findings; set metrics_token_env (default CROSSGUARD_METRICS_TOKEN)");
    }
}
