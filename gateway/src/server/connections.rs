//! The accept loop: HTTP/1 connections served with hyper directly (instead of
//! `axum::serve`) for what `axum::serve` cannot set — a cap on open connections and a
//! header read timeout — keeping what it did: TCP_NODELAY, `ConnectInfo<SocketAddr>` on
//! every request, graceful shutdown.
//!
//! Invariants: at most `max_connections` connections are being served; the next one is not
//! accepted until one closes, so it waits in the kernel's listen backlog (and the client
//! sees a slow connect, not an error). A connection whose request headers have not all
//! arrived `header_read_timeout_ms` after it started waiting for them (a fresh or an idle
//! keep-alive connection) is closed. On shutdown no new connection is accepted, open ones
//! finish their requests in flight, and [`serve_connections`] returns when the last one
//! has closed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::connect_info::ConnectInfo;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

use crate::config::ServerConfig;

/// How long accepting pauses after an error that is not one connection's (out of file
/// descriptors): retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Serves `app` on `listener` under `settings` until `shutdown` resolves and every open
/// connection has closed.
pub async fn serve_connections(
    listener: TcpListener,
    app: Router,
    settings: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(Semaphore::new(settings.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let header_timeout = Duration::from_millis(settings.header_read_timeout_ms);
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            _ = &mut shutdown => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let (tcp, remote) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    pause_after_accept_error(&e).await;
                    continue;
                }
            },
        };
        // Without TCP_NODELAY each SSE frame waits for the client's delayed ACK (~40 ms).
        let _ = tcp.set_nodelay(true);
        tokio::spawn(serve_one(tcp, remote, app.clone(), header_timeout, stop_rx.clone(), slot));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    // Every connection holds one slot until it closes: all slots back = all closed.
    let all = u32::try_from(settings.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Errors of one connection (reset before it was accepted) need no pause; others do.
async fn pause_after_accept_error(e: &std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if !matches!(e.kind(), ConnectionAborted | ConnectionRefused | ConnectionReset) {
        tracing::warn!(error = %e, "accepting a connection failed; pausing before the next");
        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
    }
}

/// Serves one connection until it closes; `_slot` is its place under the connection cap.
async fn serve_one(
    tcp: TcpStream,
    remote: SocketAddr,
    app: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
) {
    let service = app.map_request(move |mut request: Request<Incoming>| {
        request.extensions_mut().insert(ConnectInfo(remote));
        request
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(header_timeout);
    let connection = builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(service));
    tokio::pin!(connection);
    let mut stopping = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection closed with an error");
                }
                return;
            }
            _ = stop.wait_for(|stop| *stop), if !stopping => {
                connection.as_mut().graceful_shutdown();
                stopping = true;
            }
        }
    }
}
