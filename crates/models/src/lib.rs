//! Model formats and forward passes for Domino: Qwen3 config.json, safetensors (single and sharded,
//! memory-mapped), the tokenizer and chat template, and the Qwen3 forward built on domino-engine.

pub mod checkpoint;
pub mod config;
pub mod drafter;
pub mod drafter_gpu;
pub mod drafter_reference;
pub mod error;
pub mod qwen3;
pub mod reference;
pub mod testing;
pub mod tokenizer;

pub use checkpoint::{Checkpoint, WeightSource};
pub use config::Qwen3Config;
pub use error::{ModelError, Result};
pub use qwen3::{Forward, ForwardState, Qwen3Model};
