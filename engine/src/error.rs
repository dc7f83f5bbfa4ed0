//! The engine's one error type. Variants carry the data needed to say what broke.

use std::path::PathBuf;

/// Everything that can go wrong inside the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Reading a file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
