use thiserror::Error;

/// Everything that can go wrong in the engine, with messages that name the adapter, limit or tensor.
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("no GPU adapter found for backend {backend} (is a Vulkan/Metal/DX12/GL driver installed? for software Vulkan install mesa-vulkan-drivers)")]
    NoAdapter { backend: String },
    #[error("adapter index {index} is out of range: {count} adapter(s) available for backend {backend} (see `domino devices`)")]
    AdapterIndex { index: usize, count: usize, backend: String },
    #[error("unknown backend '{0}' (expected auto, vulkan, metal, dx12, gl or all)")]
    UnknownBackend(String),
    #[error("could not open a device on adapter '{adapter}': {message}")]
    RequestDevice { adapter: String, message: String },
    #[error("{what} needs {needed} bytes but adapter '{adapter}' allows at most {limit} ({limit_name})")]
    LimitTooSmall { what: String, needed: u64, limit: u64, limit_name: &'static str, adapter: String },
    #[error("adapter '{adapter}' ran out of memory while allocating {what}: {message}")]
    OutOfMemory { what: String, message: String, adapter: String },
    #[error("shader {name}: {message}")]
    Shader { name: String, message: String },
    #[error("tensor {name}: {message}")]
    Tensor { name: String, message: String },
    #[error("the GPU device of adapter '{adapter}' was lost ({reason}); loading the model again opens a new device")]
    DeviceLost { adapter: String, reason: String },
    #[error("GPU error: {0}")]
    Gpu(String),
    #[error("reading back from the GPU failed: {0}")]
    Readback(String),
}

pub type Result<T> = std::result::Result<T, EngineError>;
