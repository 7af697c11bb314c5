//! The one error type of `tern-models`: loading, validating and writing weights.
//!
//! Variants name the cause and carry what the caller needs to explain it in one
//! line; the binary turns them into messages, the server into HTTP errors.

use std::path::PathBuf;

/// Everything that can go wrong while loading, running or writing a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The path given for a model does not exist.
    #[error("model file not found: {0}")]
    NotFound(PathBuf),
    /// The file exists but is not a readable GGUF (bad magic, truncated, corrupt).
    #[error("{path} is not a valid GGUF file: {reason}")]
    InvalidGguf { path: PathBuf, reason: String },
    /// A metadata key the architecture needs is missing or has the wrong type.
    #[error("GGUF metadata key `{key}` is missing or invalid")]
    MissingMetadata { key: String },
    /// A tensor the architecture needs is missing or has the wrong shape.
    #[error("GGUF tensor `{name}`: {reason}")]
    BadTensor { name: String, reason: String },
    /// The GGUF declares an architecture Tern does not implement.
    #[error("unsupported architecture `{name}` (supported: {supported})")]
    UnsupportedArchitecture {
        /// What `general.architecture` says.
        name: String,
        /// The architectures Tern runs, comma-separated.
        supported: String,
    },
    /// The GGUF asks for a feature of its architecture Tern does not
    /// implement (a RoPE scaling type, ...): refused rather than run wrong.
    #[error("GGUF metadata `{key}` = `{value}` is not supported ({supported})")]
    UnsupportedFeature {
        /// The metadata key.
        key: String,
        /// Its value.
        value: String,
        /// What Tern does support there.
        supported: String,
    },
    /// A KV cache storage type this model's shape cannot use (block types need
    /// heads of a multiple of 32 values).
    #[error(
        "kv_dtype `{dtype}` stores blocks of 32 values, but this model's heads have {head_dim}"
    )]
    KvDtypeShape {
        /// The storage type asked for.
        dtype: String,
        /// Values per head row.
        head_dim: usize,
    },
    /// An export replacement names a tensor the source file does not have.
    #[error("cannot replace tensor `{name}`: {path} has no such tensor{hint}")]
    UnknownTensor {
        name: String,
        path: PathBuf,
        /// Extra advice, e.g. that the output projection is tied; may be empty.
        hint: String,
    },
    /// An export replacement's shape differs from the tensor it replaces.
    #[error("replacement for tensor `{name}` has shape {found:?}, the source's is {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    /// An export replacement holds NaN or infinity (a diverged run), which no
    /// model file should carry.
    #[error("replacement for tensor `{name}` holds NaN or infinite values")]
    NonFiniteTensor { name: String },
    /// A quantization type name that is not one Tern writes.
    #[error("unknown quantization type `{name}` (valid: {valid})")]
    UnknownExportType {
        /// The name given.
        name: String,
        /// The valid names, comma-separated.
        valid: String,
    },
    /// Writing an output file failed (directory missing or not writable, disk full).
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An I/O error with the path it concerns.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A tensor operation failed inside candle.
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ModelError>;
