//! The crate's error type: every failure a user can cause ends here, with a message that names
//! what was wrong (a path, a tensor, a parameter) so the CLI can print it and exit non-zero.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A model file is malformed: truncated, bad magic, out-of-bounds tensor data, bad JSON.
    #[error("corrupt model file {path}: {msg}")]
    Corrupt { path: PathBuf, msg: String },
    /// A well-formed model that this engine does not run (architecture, tensor type).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The checkpoint disagrees with its own config (tensor shape, missing tensor).
    #[error("model mismatch: {0}")]
    Mismatch(String),
    /// A user-supplied parameter out of range (sampling parameters, context length, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    /// No adapter, device creation failed, out of GPU memory, validation errors.
    #[error("gpu: {0}")]
    Gpu(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn corrupt(path: impl Into<PathBuf>, msg: impl Into<String>) -> Self {
        Error::Corrupt { path: path.into(), msg: msg.into() }
    }
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
}
