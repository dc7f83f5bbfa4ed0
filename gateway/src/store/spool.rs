//! A durable spool: what Redis has not acknowledged yet, on local disk, shipped until it is.
//!
//! Used by the Redis store for audit records and for fingerprint batches. A record is
//! appended to `<name>.jsonl` (fsync'd) and counted; [`Spool::flush`] moves the file aside
//! to `<name>.flushing.jsonl` (so appends go on), sends each record, and deletes the file
//! only after every record is acknowledged. A flush cut short (Redis gone again, the process
//! killed) is simply repeated, so the sender must be idempotent or harmless to repeat.
//! Memory holds no spooled record, only their count: the spool is bounded by the disk.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::journal::{self, Entry, Journal};
use crate::store::StoreError;

pub(crate) struct Spool<T: Entry> {
    journal: Journal<T>,
    flushing_path: PathBuf,
    /// Records in the spool files, waiting for Redis.
    waiting: AtomicU64,
    flush_lock: tokio::sync::Mutex<()>,
}

impl<T: Entry> Spool<T> {
    /// Opens `<dir>/<name>.jsonl`, counting what an earlier process left in it.
    pub(crate) fn open(dir: &Path, name: &str) -> Result<Spool<T>, StoreError> {
        let (journal, spooled) = Journal::<T>::open(&dir.join(format!("{name}.jsonl")))?;
        let flushing_path = dir.join(format!("{name}.flushing.jsonl"));
        let in_flight = if flushing_path.exists() { journal::read_path::<T>(&flushing_path)?.len() } else { 0 };
        Ok(Spool {
            journal,
            flushing_path,
            waiting: AtomicU64::new((spooled.len() + in_flight) as u64),
            flush_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// Records waiting for Redis.
    pub(crate) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Appends `record`; `Ok` once it is on disk.
    pub(crate) async fn push(&self, record: T) -> Result<(), StoreError> {
        self.journal.append(vec![record]).await?;
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Sends every spooled record with `send`, oldest first; stops at the first error (the
    /// rest stays spooled). Returns how many records were acknowledged.
    pub(crate) async fn flush<F, Fut>(&self, send: F) -> Result<u64, StoreError>
    where
        F: Fn(T) -> Fut,
        Fut: Future<Output = Result<(), StoreError>>,
    {
        let _one_at_a_time = self.flush_lock.lock().await;
        let mut sent = 0;
        loop {
            if !self.flushing_path.exists() {
                if self.journal.is_empty_blocking() {
                    self.waiting.store(0, Ordering::Relaxed);
                    return Ok(sent);
                }
                self.journal.rotate_blocking(&self.flushing_path)?;
            }
            let records = journal::read_path::<T>(&self.flushing_path)?;
            let n = records.len() as u64;
            for r in records {
                send(r).await?;
            }
            std::fs::remove_file(&self.flushing_path)
                .map_err(|source| StoreError::Io { path: self.flushing_path.clone(), source })?;
            let _ = self.waiting.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| Some(b.saturating_sub(n)));
            sent += n;
        }
    }
}
