//! Model formats and forward passes for Domino: Qwen3/Llama config.json, safetensors (single and
//! sharded, memory-mapped), GGUF (metadata, quantized tensors, tokenizer), the tokenizer and chat
//! template, and the Qwen3/Llama forward built on domino-engine.

pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod drafter;
pub mod drafter_gpu;
pub mod drafter_reference;
pub mod error;
pub mod fuzzing;
pub mod gguf;
pub mod gguf_model;
pub mod gguf_tokenizer;
pub mod gguf_writer;
pub mod ngram_table;
pub mod qwen3;
pub mod reference;
pub mod source;
pub mod testing;
pub mod tokenizer;

pub use checkpoint::{Checkpoint, WeightSource};
pub use config::Qwen3Config;
pub use error::{ModelError, Result};
pub use qwen3::{Forward, ForwardState, Qwen3Model};
pub use source::{gguf_model_files, open_model, ModelFiles};
