//! Domino's GPU engine: device and adapter choice, weights in GPU memory, the WGSL kernels and
//! command recording. It knows nothing about models; `domino-models` builds forwards from it.

pub mod bandwidth;
pub mod context;
pub mod cpu_threads;
pub mod error;
pub mod kernels;
pub mod quant;
pub mod reference;
pub mod row_major;
pub mod shader;
pub mod step;
pub mod tensor;
pub mod testing;

pub use context::{host_available_memory, list_adapters, AdapterSummary, BackendChoice, Caps, Gpu, GpuBuffer, GpuOptions, GpuTexture, KernelChoice, Resource};
pub use error::{EngineError, Result};
pub use kernels::{Epilogue, Rows, SamplingConfig};
pub use step::Step;
pub use quant::QuantType;
pub use tensor::{DTypeChoice, HostDType, HostTensor, Matrix, WeightFormat};
