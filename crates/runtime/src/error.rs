use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("prompt of {prompt} tokens + {max_tokens} new tokens exceeds the context of {context} positions ({limit})")]
    ContextOverflow { prompt: usize, max_tokens: usize, context: usize, limit: &'static str },
    #[error("{0}")]
    Unsupported(String),
    /// The memory check refused a request before any upload (the message names need and limit).
    #[error("{0}")]
    Memory(String),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("prompt token id {id} at index {index} is outside the vocabulary (vocab_size {vocab})")]
    TokenOutOfRange { id: u32, index: usize, vocab: usize },
    #[error(transparent)]
    Model(#[from] domino_models::ModelError),
    #[error(transparent)]
    Engine(#[from] domino_engine::EngineError),
}

pub type Result<T> = std::result::Result<T, RuntimeError>;
