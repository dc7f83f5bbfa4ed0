//! Binding the listener and serving until shutdown. Start-up problems are [`StartError`]s
//! with a message fit for the terminal. How connections are accepted and read (the
//! connection cap, the header read timeout) is [`connections`]'s.

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
    if state.auth.is_open() {
        tracing::warn!("no [[tenants]] configured: every request is served as tenant \"anonymous\" without authentication; configure tenants before exposing this gateway");
    }
    tracing::info!(addr = %local, models = state.models.len(), "listening");
    let settings = state.config.server;
    connections::serve_connections(listener, router(state), settings, shutdown).await;
    Ok(())
}
