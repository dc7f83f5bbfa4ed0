//! An append-only JSON-lines file of records (audit records, fingerprint batches), fsync'd
//! per append.
//!
//! Used three times: the embedded store's audit log (`audit.jsonl`) and the Redis store's
//! spools of what Redis has not acknowledged yet (`audit-spool.jsonl`,
//! `fingerprint-spool.jsonl`).
//!
//! Invariants: `append` returns only after the line is on disk (`sync_data`). Reading never
//! panics: a line that does not parse (a torn write at a crash, a hand edit) is skipped
//! with a warning naming its line number, and a file that does not end in a newline gets
//! one before the next append, so a torn line never swallows the record after it.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::audit::AuditRecord;
use crate::store::StoreError;

/// What a journal holds: one JSON line per record.
pub trait Entry: Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T: Serialize + DeserializeOwned + Send + Sync + 'static> Entry for T {}

/// One journal file of `T`s. Appends are serialised by the mutex; each runs on a blocking
/// thread.
#[derive(Debug)]
pub struct Journal<T = AuditRecord> {
    path: PathBuf,
    file: Arc<Mutex<File>>,
    _holds: PhantomData<fn() -> T>,
}

impl<T> Clone for Journal<T> {
    fn clone(&self) -> Self {
        Journal { path: self.path.clone(), file: self.file.clone(), _holds: PhantomData }
    }
}

impl<T: Entry> Journal<T> {
    /// Opens (creating) `path` and its directory, and returns the records already in it.
    pub fn open(path: &Path) -> Result<(Journal<T>, Vec<T>), StoreError> {
        let io = |source| StoreError::Io { path: path.to_owned(), source };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(path).map_err(io)?;
        let records = read_records(path, &mut file)?;
        if !ends_with_newline(&mut file).map_err(io)? {
            file.write_all(b"\n").and_then(|()| file.sync_data()).map_err(io)?;
        }
        Ok((Journal { path: path.to_owned(), file: Arc::new(Mutex::new(file)), _holds: PhantomData }, records))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `records` as lines and syncs them to disk before returning.
    pub async fn append(&self, records: Vec<T>) -> Result<(), StoreError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.append_blocking(&records))
            .await
            .map_err(|e| StoreError::Io { path: self.path.clone(), source: std::io::Error::other(e) })?
    }

    pub fn append_blocking(&self, records: &[T]) -> Result<(), StoreError> {
        let mut buf = Vec::with_capacity(512 * records.len());
        for r in records {
            serde_json::to_writer(&mut buf, r)
                .map_err(|e| StoreError::Io { path: self.path.clone(), source: std::io::Error::other(e) })?;
            buf.push(b'\n');
        }
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(&buf)
            .and_then(|()| file.sync_data())
            .map_err(|source| StoreError::Io { path: self.path.clone(), source })
    }

    /// Empties the file (after its records reached Redis).
    pub fn truncate_blocking(&self) -> Result<(), StoreError> {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.set_len(0)
            .and_then(|()| file.sync_data())
            .map_err(|source| StoreError::Io { path: self.path.clone(), source })
    }

    /// Moves the file's contents to `to` (which must not exist) and starts an empty file,
    /// so that records can be shipped from `to` while appends go on here.
    pub fn rotate_blocking(&self, to: &Path) -> Result<(), StoreError> {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let io = |source| StoreError::Io { path: self.path.clone(), source };
        std::fs::rename(&self.path, to).map_err(io)?;
        *file = OpenOptions::new().read(true).append(true).create(true).open(&self.path).map_err(io)?;
        Ok(())
    }

    /// Whether the file holds anything.
    pub fn is_empty_blocking(&self) -> bool {
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        file.metadata().is_ok_and(|m| m.len() == 0)
    }

    /// Re-reads every record in the file.
    pub fn read_all_blocking(&self) -> Result<Vec<T>, StoreError> {
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        read_records(&self.path, &mut file)
    }
}

/// The records of the file at `path` (which must exist), without opening it for appends.
pub fn read_path<T: Entry>(path: &Path) -> Result<Vec<T>, StoreError> {
    let mut file = File::open(path).map_err(|source| StoreError::Io { path: path.to_owned(), source })?;
    read_records(path, &mut file)
}

fn read_records<T: Entry>(path: &Path, file: &mut File) -> Result<Vec<T>, StoreError> {
    let io = |source| StoreError::Io { path: path.to_owned(), source };
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut records = Vec::new();
    let mut reader = BufReader::new(&mut *file);
    let mut line = Vec::new();
    let mut number = 0usize;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(io)? == 0 {
            break;
        }
        number += 1;
        let text = line.trim_ascii();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_slice::<T>(text) {
            Ok(r) => records.push(r),
            Err(e) => {
                tracing::warn!(path = %path.display(), line = number, error = %e, "skipping unreadable journal line")
            }
        }
    }
    Ok(records)
}

fn ends_with_newline(file: &mut File) -> std::io::Result<bool> {
    let len = file.seek(SeekFrom::End(0))?;
    if len == 0 {
        return Ok(true);
    }
    file.seek(SeekFrom::Start(len - 1))?;
    let mut last = [0u8; 1];
    file.read_exact(&mut last)?;
    Ok(last[0] == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::tests::{ctx, finding};
    use firewall::{Action, Detail};

    fn record(tenant: &str) -> AuditRecord {
        AuditRecord::new(ctx(tenant), Action::Block, &[finding("r", "a*** (4 chars)", Detail::None)], 1)
    }

    #[test]
    fn torn_and_corrupt_lines_are_skipped_and_never_swallow_the_next_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let (j, none) = Journal::<AuditRecord>::open(&path).unwrap();
        assert!(none.is_empty());
        let (a, b) = (record("a"), record("b"));
        j.append_blocking(std::slice::from_ref(&a)).unwrap();
        drop(j);
        // a hand-edited bad line, then a torn write without its newline
        std::fs::write(&path, format!("{}\nnot json\n{{\"id\":\"x", serde_json::to_string(&a).unwrap())).unwrap();
        let (j, got) = Journal::<AuditRecord>::open(&path).unwrap();
        assert_eq!(got, std::slice::from_ref(&a));
        j.append_blocking(std::slice::from_ref(&b)).unwrap();
        drop(j);
        let (j, got) = Journal::<AuditRecord>::open(&path).unwrap();
        assert_eq!(got, [a, b]);
        j.truncate_blocking().unwrap();
        assert!(j.read_all_blocking().unwrap().is_empty());
    }
}
