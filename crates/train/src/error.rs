//! One error type for the crate: every message names the file, the field or the limit involved.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] domino_models::ModelError),
    #[error(transparent)]
    Runtime(#[from] domino_runtime::RuntimeError),
    #[error(transparent)]
    Engine(#[from] domino_engine::EngineError),
}

pub type Result<T> = std::result::Result<T, TrainError>;

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io { path: path.to_path_buf(), source }
}

pub(crate) fn format_error(path: &std::path::Path, message: impl Into<String>) -> TrainError {
    TrainError::Format { path: path.to_path_buf(), message: message.into() }
}
