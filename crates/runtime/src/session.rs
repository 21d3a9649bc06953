//! A generation session: one sequence's KV cache and the prefill -> decode loop.
//!
//! Each decode step is ONE submission: the forward for the newest token and the sampler, which writes
//! the next token id straight into the GPU-side id buffer; the CPU reads back just that id (4 bytes)
//! to stream it and check stop tokens. Async with no blocking of its own: natively the readback polls
//! the device, in the browser the event loop drives it.

use crate::clock::now;
use crate::error::{Result, RuntimeError};
use domino_engine::step::PendingRead;
use domino_engine::{SamplingConfig, Step};
use domino_models::qwen3::Forward;
use domino_models::{ForwardState, Qwen3Model};
use serde::{Deserialize, Serialize};

/// Rows per forward pass (prefill runs in sub-batches of this many rows).
pub const MAX_ROWS: usize = 64;
/// Logit rows one pass can produce (a speculative verify needs block_size + 1).
pub const MAX_LOGIT_ROWS: usize = 33;

#[derive(Debug, Clone)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingConfig,
    /// Keep going past stop tokens.
    pub ignore_eos: bool,
    /// Token ids that end generation (eos from config, generation_config and tokenizer_config).
    pub stop_ids: Vec<u32>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        Self { max_tokens: 128, sampling: SamplingConfig::greedy(), ignore_eos: false, stop_ids: Vec::new() }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GenerationStats {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub time_to_first_token_s: f64,
    /// Prompt tokens whose keys and values were reused from an earlier request (prefix cache).
    #[serde(default)]
    pub cached_prompt_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    Eos,
    MaxTokens,
    Cancelled,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generation {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    pub stop_reason: StopReason,
    pub stats: GenerationStats,
}

/// A prompt must be non-empty, inside the vocabulary, and fit with `max_tokens` new tokens in both
/// the model's context and the session's `capacity`.
pub fn validate_prompt(model: &Qwen3Model, prompt: &[u32], max_tokens: usize, capacity: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(RuntimeError::EmptyPrompt);
    }
    let vocab = model.config.vocab_size;
    if let Some((index, &id)) = prompt.iter().enumerate().find(|(_, &id)| id as usize >= vocab) {
        return Err(RuntimeError::TokenOutOfRange { id, index, vocab });
    }
    let max_pos = model.config.max_position_embeddings;
    if prompt.len() + max_tokens > max_pos {
        return Err(RuntimeError::ContextOverflow { prompt: prompt.len(), max_tokens, context: max_pos, limit: "max_position_embeddings" });
    }
    if prompt.len() + max_tokens > capacity {
        return Err(RuntimeError::ContextOverflow { prompt: prompt.len(), max_tokens, context: capacity, limit: "session capacity" });
    }
    Ok(())
}

pub struct Session<'m> {
    model: &'m Qwen3Model,
    state: ForwardState,
    /// The tokens whose keys and values the cache holds after the last generation.
    kept: Vec<u32>,
    reuse_prefix: bool,
}

impl<'m> Session<'m> {
    /// A session able to hold `capacity` positions (prompt + generated tokens).
    pub fn new(model: &'m Qwen3Model, capacity: usize) -> Result<Self> {
        let max_pos = model.config.max_position_embeddings;
        if capacity > max_pos {
            return Err(RuntimeError::ContextOverflow { prompt: capacity, max_tokens: 0, context: max_pos, limit: "max_position_embeddings" });
        }
        let state = model.new_state(capacity.max(1), MAX_ROWS, MAX_LOGIT_ROWS)?;
        Ok(Self { model, state, kept: Vec::new(), reuse_prefix: false })
    }

    pub fn capacity(&self) -> usize {
        self.state.capacity
    }

    pub fn model(&self) -> &'m Qwen3Model {
        self.model
    }

    pub fn state(&self) -> &ForwardState {
        &self.state
    }

    /// Let `generate` keep the keys and values of the previous prompt's longest common prefix with
    /// the new one and prefill only the rest (a chat resends the whole conversation every turn).
    /// Exact: a position's keys and values depend only on the tokens up to it. Off by default, so
    /// repeated runs of one prompt (benchmarks) measure a whole prefill.
    pub fn set_prefix_reuse(&mut self, on: bool) {
        self.reuse_prefix = on;
        self.kept.clear();
    }

    /// Check a prompt against the vocabulary and the context before touching the GPU.
    pub fn validate(&self, prompt: &[u32], max_tokens: usize) -> Result<()> {
        validate_prompt(self.model, prompt, max_tokens, self.capacity())
    }

    /// Generate from scratch (the KV cache is reset: a length reset, nothing is cleared; with
    /// `set_prefix_reuse`, the common prefix with the previous prompt and output is kept).
    /// `on_token` sees every new token and returns false to stop early.
    pub async fn generate(&mut self, prompt: &[u32], opts: &GenerateOptions, on_token: &mut dyn FnMut(u32) -> bool) -> Result<Generation> {
        self.validate(prompt, opts.max_tokens)?;
        let model = self.model;
        let gpu = &model.gpu;
        let n = prompt.len();
        let mut stats = GenerationStats { prompt_tokens: n, ..Default::default() };
        let mut output = Vec::new();
        let mut stop_reason = StopReason::MaxTokens;
        if opts.max_tokens == 0 {
            return Ok(Generation { prompt_ids: prompt.to_vec(), output_ids: output, stop_reason, stats });
        }
        // Never the whole prompt: its last row gives the first token's logits.
        let reuse = if self.reuse_prefix { crate::batch::common_prefix(self.kept.iter(), prompt).min(n - 1) } else { 0 };
        stats.cached_prompt_tokens = reuse;
        // Until this generation ends well, the cache holds nothing known.
        self.kept.clear();
        gpu.write(&self.state.ids, 0, prompt);

        // Prefill: the prompt rows not cached, logits of the last one, the first token sampled into ids[n].
        let t0 = now();
        if opts.max_tokens > 1 {
            // Compile the decode step's pipelines now (recorded, never submitted): shader
            // compilation belongs to the time to first token, not to the decode rate.
            drop(self.record_step(n as u32, 1, &opts.sampling)?);
        }
        let first = read_token(self.submit_step(reuse as u32, (n - reuse) as u32, &opts.sampling)?.wait(gpu).await?);
        let t1 = now();
        stats.prefill_seconds = t1 - t0;
        stats.time_to_first_token_s = t1 - t0;
        let mut token = first;
        let mut pos = n as u32;
        // Pipelining: the step after the one being waited for is already queued, so the GPU never
        // idles while the CPU reads a token back and streams it. The sampler writes each token into
        // the id buffer on the GPU, so a queued step needs nothing from the CPU.
        let mut queued: Option<PendingRead> = None;
        loop {
            output.push(token);
            let keep_going = on_token(token);
            if !opts.ignore_eos && opts.stop_ids.contains(&token) {
                stop_reason = StopReason::Eos;
                break;
            }
            if !keep_going {
                stop_reason = StopReason::Cancelled;
                break;
            }
            if output.len() >= opts.max_tokens {
                break;
            }
            let next = match queued.take() {
                Some(p) => p,
                None => self.submit_step(pos, 1, &opts.sampling)?,
            };
            if output.len() + 1 < opts.max_tokens {
                queued = Some(self.submit_step(pos + 1, 1, &opts.sampling)?);
            }
            token = read_token(next.wait(gpu).await?);
            pos += 1;
        }
        // A step queued past a stop is simply dropped; its writes lie beyond the committed tokens.
        drop(queued);
        // Every output token but the last was fed back.
        self.kept = prompt.iter().chain(&output[..output.len().saturating_sub(1)]).copied().collect();
        stats.decode_seconds = now() - t1;
        stats.generated_tokens = output.len();
        stats.prefill_tokens_per_s = n as f64 / stats.prefill_seconds.max(1e-9);
        let decoded = output.len().saturating_sub(1);
        stats.decode_tokens_per_s = if decoded > 0 { decoded as f64 / stats.decode_seconds.max(1e-9) } else { 0.0 };
        Ok(Generation { prompt_ids: prompt.to_vec(), output_ids: output, stop_reason, stats })
    }

    /// One submission: forward rows [pos0, pos0 + rows), sample the token after them into
    /// ids[pos0 + rows], and copy that id (4 bytes) out for reading.
    fn submit_step(&self, pos0: u32, rows: u32, sampling: &SamplingConfig) -> Result<PendingRead> {
        let next = pos0 + rows;
        Ok(self.record_step(pos0, rows, sampling)?.submit_with_read(&self.state.ids, next as u64 * 4, 4)?)
    }

    /// `submit_step`'s work, recorded.
    fn record_step(&self, pos0: u32, rows: u32, sampling: &SamplingConfig) -> Result<Step<'m>> {
        let model = self.model;
        let mut step = Step::new(&model.gpu);
        model.record_forward(&mut step, &self.state, &Forward { pos0, n_rows: rows, logits_from: rows - 1, capture: None })?;
        let next = pos0 + rows;
        model.record_sample(&mut step, &self.state, 1, sampling, next, &self.state.ids, next)?;
        Ok(step)
    }
}

impl Drop for Session<'_> {
    /// Cached bind groups hold this session's buffers alive; forget them with the session.
    fn drop(&mut self) {
        self.model.gpu.clear_bind_groups();
    }
}

fn read_token(bytes: Vec<u8>) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}
