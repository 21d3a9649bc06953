//! The Domino scheduler: generation sessions, KV-cache bookkeeping, sampling and statistics.
//! Async and thread-free, so the same code runs natively (driven by pollster) and in the browser.

pub mod batch;
pub mod bench;
pub mod clock;
pub mod draft_len;
pub mod error;
pub mod lookup;
pub mod memory;
pub mod session;
pub mod speculative;

pub use batch::{BatchEvent, Batcher, SequenceId, BATCH_MAX_ROWS};
pub use draft_len::{AcceptanceCounts, DraftLen, DraftScheduler, RoundCosts};
pub use error::{Result, RuntimeError};
pub use memory::{check_memory, MemoryLimits, MemoryPlan, MemoryRequest};
pub use speculative::{SpeculativeOptions, SpeculativeSession, SpeculativeStats};
pub use session::{GenerateOptions, Generation, GenerationStats, Session, StopReason};
