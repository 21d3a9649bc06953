use std::path::PathBuf;
use thiserror::Error;

/// Errors from reading model files and building forwards. Every message names the file or tensor.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: file not found")]
    Missing { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: malformed JSON: {message}")]
    Json { path: PathBuf, message: String },
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error("{path}: unsupported architecture {arch}: this build runs Qwen3ForCausalLM and LlamaForCausalLM (GGUF: llama, qwen3)")]
    UnknownArchitecture { path: PathBuf, arch: String },
    #[error("{path}: corrupt or truncated safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    #[error("tensor {name}: missing from the checkpoint ({where_})")]
    MissingTensor { name: String, where_: String },
    #[error("tensor {name}: expected shape {expected:?}, found {found:?} (in {path})")]
    Shape { name: String, expected: Vec<usize>, found: Vec<usize>, path: PathBuf },
    #[error("{path}: corrupt or unsupported GGUF file: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("tensor {name}: unsupported dtype {dtype} (in {path}); expected F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K")]
    DType { name: String, dtype: String, path: PathBuf },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("token id {id} is outside the vocabulary (vocab_size {vocab})")]
    TokenOutOfRange { id: u32, vocab: usize },
    #[error("--draft-vocab {requested}: expected a multiple of {group} from {group} to the target's vocabulary ({vocab})")]
    DraftVocab { requested: usize, group: usize, vocab: usize },
    #[error(transparent)]
    Engine(#[from] domino_engine::EngineError),
}

pub type Result<T> = std::result::Result<T, ModelError>;
