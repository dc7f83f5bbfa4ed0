//! The protection pipeline's background work: store upkeep, pulling other replicas'
//! fingerprints, merging statistics, snapshotting the embedded store's provenance index
//! (and its last snapshot at shutdown). Each task holds only a weak reference and ends when
//! the protection is dropped; nothing here runs on the token path.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::Protection;
use crate::config::{Config, StoreConfig};
use crate::store::spawn_upkeep;

/// How often the embedded store's provenance index is snapshotted (and at shutdown).
const SNAPSHOT_EVERY: Duration = Duration::from_secs(30);

impl Protection {
    /// Snapshots the provenance index if this store keeps one and it changed.
    fn save_index(&self) {
        let Some(path) = &self.snapshot else { return };
        if let Err(e) = self.index.save(path) {
            tracing::warn!(path = %path.display(), error = %e, "provenance snapshot not written");
        }
    }

    /// Starts the background work: store upkeep (Redis reconnects, audit spool flushes),
    /// pulling other replicas' fingerprints, merging statistics. The tasks end when the
    /// protection is dropped.
    pub fn spawn_background(self: &Arc<Self>, config: &Config) {
        spawn_upkeep(self.store.clone(), Duration::from_secs(1));
        if matches!(config.store, StoreConfig::Redis(_)) {
            every(Arc::downgrade(self), Duration::from_millis(config.provenance.refresh_interval_ms), |p| async move {
                if let Err(e) = p.index.refresh(&p.store).await {
                    tracing::debug!(error = %e, "fingerprint refresh failed");
                }
            });
        }
        if self.snapshot.is_some() {
            every(Arc::downgrade(self), SNAPSHOT_EVERY, |p| async move {
                let _ = tokio::task::spawn_blocking(move || p.save_index()).await;
            });
        }
        every(Arc::downgrade(self), Duration::from_millis(config.stats.sync_interval_ms), |p| async move {
            if let Err(e) = p.stats.sync(&p.store).await {
                tracing::debug!(error = %e, "statistics sync failed");
            }
        });
    }
}

impl Drop for Protection {
    /// The last snapshot, at shutdown.
    fn drop(&mut self) {
        self.save_index();
    }
}

/// Runs `work` every `period` while `target` is alive.
pub(crate) fn every<T, F, Fut>(target: Weak<T>, period: Duration, work: F)
where
    T: Send + Sync + 'static,
    F: Fn(Arc<T>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(p) = target.upgrade() else { return };
            work(p).await;
        }
    });
}

/// Spawns on the current runtime; a response dropped outside one (shutdown) records nothing.
pub(super) fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(task);
    }
}
