//! Errors of the browser build. Each becomes a rejected promise with one readable message.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WebError {
    #[error("WebGPU: {0}")]
    Gpu(#[from] domino_engine::EngineError),
    #[error("{0}")]
    Model(#[from] domino_models::ModelError),
    #[error("{0}")]
    Runtime(#[from] domino_runtime::RuntimeError),
    /// A bad option or call from JavaScript (the message names the option).
    #[error("{0}")]
    Usage(String),
    /// A file could not be fetched or read.
    #[error("{0}")]
    Files(String),
    #[error("no model loaded: call load({{ model }}) first")]
    NotLoaded,
    #[error("busy: another load, generate or bench call on this Domino is still running")]
    Busy,
}

impl From<WebError> for wasm_bindgen::JsValue {
    fn from(e: WebError) -> Self {
        js_sys::Error::new(&e.to_string()).into()
    }
}
