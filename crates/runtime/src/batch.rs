//! Continuous batching: many sequences share each step.
//!
//! A `Batcher` owns a fixed number of slots (one KV cache each). Every `step` is one submission:
//! one decode row for each sequence that is generating, plus prompt chunks of newly admitted
//! sequences in the rows left over (prefill happens between and beside other sequences' decode
//! steps, never blocking them for a whole prompt). A finished or cancelled sequence frees its slot
//! at once; the next admitted one reuses it (a length reset, nothing cleared).
//!
//! Prefix cache (`set_prefix_cache`): a freed slot remembers the tokens whose keys and values it
//! holds. A new request takes the free slot sharing the longest prefix with its prompt and prefills
//! only the rest (at least its last token, whose logits it needs). Chat clients resend the whole
//! conversation every turn and share system prompts, so most of their prompt is often there already.
//! Sequences in flight share as well (`share_prefixes`): a prompt copies the rows it has in common
//! with another sequence's computed rows, or waits for an older one still prefilling them.
//! It stays exact: a position's keys and values depend only on the tokens up to it, computed the same
//! way in any pass (batch invariance), so reused rows equal recomputed ones bit for bit.
//!
//! Output is exact: the batched pass is batch-invariant (see `domino_models::batch`), the draws are
//! numbered by position as in `Session`, so a request's tokens are those `Session::generate` gives
//! for it alone, greedy or seeded, whatever else is running.
//!
//! Optionally (`capture_features`) every step also copies the residual stream after some layers for
//! each of its rows, so a finished sequence comes with the features of every position of prompt +
//! output (what `domino train data` stores): a sequence that stops runs one more row, without
//! logits, for its last token. Batch invariance makes those rows equal to a single-sequence forward's.

use crate::clock::now;
use crate::error::{Result, RuntimeError};
use crate::session::{validate_prompt, GenerateOptions, Generation, GenerationStats, StopReason};
use domino_engine::{GpuBuffer, Rows, Step};
use domino_models::batch::{BatchState, Segment};
use domino_models::qwen3::Capture;
use domino_models::Qwen3Model;
use std::collections::HashMap;
use std::sync::Arc;

/// Names a sequence for its whole life (slots are reused; ids are not).
pub type SequenceId = u64;

/// Default activation rows per step (decode rows + prefill chunk rows).
pub const BATCH_MAX_ROWS: usize = 64;

/// What a step produced for one sequence.
#[derive(Debug, Clone)]
pub enum BatchEvent {
    /// A new token of sequence `id` (streamed in order; the last one may be a stop token).
    Token { id: SequenceId, token: u32 },
    /// Sequence `id` is done and its slot is free.
    Finished { id: SequenceId, generation: Generation },
}

struct Active {
    id: SequenceId,
    prompt: Vec<u32>,
    opts: GenerateOptions,
    /// Prompt rows already in the KV cache.
    prefilled: usize,
    /// Of those, the rows found in the slot's prefix cache at admission.
    cached: usize,
    output: Vec<u32>,
    admitted_at: f64,
    first_token_at: Option<f64>,
    /// With feature capture: the features of positions [0, features.len() / width), f32.
    features: Vec<f32>,
    /// With feature capture, a sequence that stopped waits one more step for its last token's row.
    stopping: Option<StopReason>,
}

impl Active {
    fn prefilling(&self) -> bool {
        self.prefilled < self.prompt.len()
    }

    /// The tokens whose keys and values are in the slot now: the prefilled prompt, then every
    /// output token fed back (all but the newest, which the next step feeds).
    fn computed(&self) -> impl Iterator<Item = &u32> {
        let fed = if self.prefilling() { 0 } else if self.stopping.is_some() { self.output.len() } else { self.output.len().saturating_sub(1) };
        self.prompt[..self.prefilled].iter().chain(&self.output[..fed])
    }

    fn finish(self, stop_reason: StopReason) -> BatchEvent {
        let end = now();
        let first = self.first_token_at.unwrap_or(end);
        let prefill_seconds = first - self.admitted_at;
        let decode_seconds = end - first;
        let decoded = self.output.len().saturating_sub(1);
        let stats = GenerationStats {
            prompt_tokens: self.prompt.len(),
            generated_tokens: self.output.len(),
            prefill_seconds,
            decode_seconds,
            prefill_tokens_per_s: self.prompt.len() as f64 / prefill_seconds.max(1e-9),
            decode_tokens_per_s: if decoded > 0 { decoded as f64 / decode_seconds.max(1e-9) } else { 0.0 },
            time_to_first_token_s: prefill_seconds,
            cached_prompt_tokens: self.cached,
        };
        BatchEvent::Finished { id: self.id, generation: Generation { prompt_ids: self.prompt, output_ids: self.output, stop_reason, stats } }
    }
}

/// What one step ran, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    pub decode_rows: usize,
    pub prefill_rows: usize,
}

pub struct Batcher<'m> {
    model: &'m Qwen3Model,
    state: BatchState,
    slots: Vec<Option<Active>>,
    next_id: SequenceId,
    /// Sequences admitted with max_tokens = 0: finished at the next step without GPU work.
    empty: Vec<Active>,
    last_shape: StepShape,
    capture: Option<FeatureCapture>,
    /// Features of finished sequences, until `take_features`.
    finished_features: HashMap<SequenceId, Vec<f32>>,
    /// Per slot, the tokens whose keys and values it holds (kept while the slot is free).
    kept: Vec<Vec<u32>>,
    /// Per slot, when it was last freed (a step count): among equal prefixes the oldest is reused.
    freed_at: Vec<u64>,
    frees: u64,
    prefix_cache: bool,
}

struct FeatureCapture {
    layers: Vec<usize>,
    /// Values per row: layers × hidden.
    width: usize,
    /// `[max_rows][width]` f32, row r = activation row r of the step.
    dst: Arc<GpuBuffer>,
}

impl<'m> Batcher<'m> {
    /// `slots` concurrent sequences of up to `capacity` positions each, steps of up to `max_rows` rows.
    pub fn new(model: &'m Qwen3Model, slots: usize, capacity: usize, max_rows: usize) -> Result<Self> {
        let max_pos = model.config.max_position_embeddings;
        if capacity > max_pos {
            return Err(RuntimeError::ContextOverflow { prompt: capacity, max_tokens: 0, context: max_pos, limit: "max_position_embeddings" });
        }
        if slots == 0 || max_rows < slots {
            return Err(RuntimeError::Unsupported(format!("a batch of {slots} sequences needs 1..={max_rows} slots (rows per step)")));
        }
        let state = model.new_batch_state(slots, capacity, max_rows)?;
        Ok(Self {
            model,
            state,
            slots: (0..slots).map(|_| None).collect(),
            next_id: 0,
            empty: Vec::new(),
            last_shape: StepShape::default(),
            capture: None,
            finished_features: HashMap::new(),
            kept: vec![Vec::new(); slots],
            freed_at: vec![0; slots],
            frees: 0,
            prefix_cache: false,
        })
    }

    /// Capture the residual stream after `layers` (target layer ids) for every position of every
    /// sequence admitted from now on: `take_features(id)` returns them once it has finished,
    /// `[prompt + output][layers.len() × hidden]` f32, equal to a single-sequence
    /// `record_forward` capture over prompt + output. Call before admitting anything.
    pub fn capture_features(&mut self, layers: &[usize]) -> Result<()> {
        let c = &self.model.config;
        if layers.is_empty() {
            return Err(RuntimeError::Unsupported("feature capture needs at least one layer".into()));
        }
        if let Some(&l) = layers.iter().find(|&&l| l >= c.num_layers) {
            return Err(RuntimeError::Unsupported(format!("capture layer {l} is out of range: the model has {} layers", c.num_layers)));
        }
        if !self.is_idle() {
            return Err(RuntimeError::Unsupported("feature capture must be enabled before sequences are admitted".into()));
        }
        let width = layers.len() * c.hidden_size;
        let dst = self.model.gpu.activation_buffer("captured features (batch)", (self.state.max_rows * width * 4) as u64)?;
        self.capture = Some(FeatureCapture { layers: layers.to_vec(), width, dst });
        Ok(())
    }

    /// Reuse the keys and values a free slot holds for a new prompt's common prefix (off by
    /// default; feature capture ignores it, since it must see every row).
    pub fn set_prefix_cache(&mut self, on: bool) {
        self.prefix_cache = on;
    }

    /// The captured features of a finished sequence (see `capture_features`), once.
    pub fn take_features(&mut self, id: SequenceId) -> Option<Vec<f32>> {
        self.finished_features.remove(&id)
    }

    pub fn model(&self) -> &'m Qwen3Model {
        self.model
    }

    /// Positions per sequence (prompt + generated tokens).
    pub fn capacity(&self) -> usize {
        self.state.capacity
    }

    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    /// Sequences holding a slot (prefilling or generating).
    pub fn active(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    pub fn has_free_slot(&self) -> bool {
        self.slots.iter().any(Option::is_none)
    }

    /// Whether a step would do anything.
    pub fn is_idle(&self) -> bool {
        self.active() == 0 && self.empty.is_empty()
    }

    pub fn last_step(&self) -> StepShape {
        self.last_shape
    }

    /// Check a request against the vocabulary and the context before it takes a slot.
    pub fn validate(&self, prompt: &[u32], max_tokens: usize) -> Result<()> {
        validate_prompt(self.model, prompt, max_tokens, self.capacity())
    }

    /// Give a request a slot; its prompt is prefilled by the next steps. Errors when the request is
    /// invalid or no slot is free (the caller queues it).
    pub fn admit(&mut self, prompt: Vec<u32>, opts: GenerateOptions) -> Result<SequenceId> {
        self.validate(&prompt, opts.max_tokens)?;
        if self.capture.is_some() && opts.max_tokens == 0 {
            return Err(RuntimeError::Unsupported("feature capture needs max_tokens > 0 (the prompt is captured as it is prefilled)".into()));
        }
        let id = self.next_id;
        let active = Active { id, prompt, opts, prefilled: 0, cached: 0, output: Vec::new(), admitted_at: now(), first_token_at: None, features: Vec::new(), stopping: None };
        if active.opts.max_tokens == 0 {
            self.next_id += 1;
            self.empty.push(active);
            return Ok(id);
        }
        let (slot, reuse) = self.pick_slot(&active.prompt).ok_or_else(|| RuntimeError::Unsupported(format!("all {} sequence slots are busy", self.slots.len())))?;
        let mut active = active;
        active.prefilled = reuse;
        active.cached = reuse;
        self.kept[slot].clear();
        self.model.gpu.write(&self.state.slots[slot].ids, 0, &active.prompt);
        self.next_id += 1;
        self.slots[slot] = Some(active);
        Ok(id)
    }

    /// Compile the kernels of every step shape before the first request. Adapters compile a
    /// pipeline on its first use (llvmpipe about a second each), which would otherwise land in the
    /// first requests' time to first token. A prompt of 1 to 8 rows alone picks each multi-row
    /// variant (longer passes reuse them), 2 to 8 sequences at once each logits variant, and a
    /// sampled request the sampling kernels. Runs only on an idle batcher and leaves nothing cached.
    pub async fn warm_up(&mut self) -> Result<()> {
        if !self.is_idle() {
            return Err(RuntimeError::Unsupported("warm_up needs an idle batcher".into()));
        }
        let cache = std::mem::replace(&mut self.prefix_cache, false);
        let widest = domino_engine::kernels::MATMUL_QUANT_ROWS.max(domino_engine::kernels::MATMUL_ROWS) as usize;
        let most = widest.min(self.state.max_rows).min(self.capacity().saturating_sub(2));
        let greedy = GenerateOptions { max_tokens: 2, ignore_eos: true, ..Default::default() };
        let sampled = GenerateOptions { sampling: domino_engine::kernels::SamplingConfig { temperature: 0.7, top_k: 40, top_p: 0.9, seed: 1 }, ..greedy.clone() };
        let alone = (1..=most).map(|n| vec![(n, greedy.clone())]);
        let together = (2..=most.min(self.slots.len())).map(|n| vec![(1, greedy.clone()); n]);
        let batches: Vec<Vec<(usize, GenerateOptions)>> = alone.chain(together).chain([vec![(1, sampled)]]).collect();
        let result = self.run_to_end(batches).await;
        if result.is_err() {
            self.abort_all();
        }
        self.kept.iter_mut().for_each(Vec::clear);
        self.prefix_cache = cache;
        result
    }

    /// Run each batch of (prompt length, options) requests until all finish (outputs dropped).
    async fn run_to_end(&mut self, batches: Vec<Vec<(usize, GenerateOptions)>>) -> Result<()> {
        for batch in batches {
            for (rows, opts) in batch {
                self.admit(vec![0; rows], opts)?;
            }
            while !self.is_idle() {
                self.step().await?;
            }
        }
        Ok(())
    }

    /// The free slot for `prompt` and how many of its leading positions are already cached there:
    /// the longest common prefix (never the whole prompt: its last row gives the first logits), the
    /// least recently freed slot among equals.
    fn pick_slot(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let use_cache = self.prefix_cache && self.capture.is_none();
        (0..self.slots.len())
            .filter(|&s| self.slots[s].is_none())
            .map(|s| {
                let common = if use_cache { common_prefix(self.kept[s].iter(), prompt) } else { 0 };
                (s, common.min(prompt.len() - 1))
            })
            .max_by_key(|&(s, reuse)| (reuse, std::cmp::Reverse(self.freed_at[s])))
    }

    /// Free `slot`, remembering which tokens' keys and values it holds: the prefilled prompt, then
    /// every output token that was fed back (all but the last, unless capture fed it too).
    fn release(&mut self, slot: usize) -> Option<Active> {
        let a = self.slots[slot].take()?;
        self.kept[slot] = a.computed().copied().collect();
        self.frees += 1;
        self.freed_at[slot] = self.frees;
        Some(a)
    }

    /// Prompt tokens of sequence `id` found in the prefix cache when it was admitted.
    pub fn cached_prompt_tokens(&self, id: SequenceId) -> Option<usize> {
        self.slots.iter().flatten().find(|a| a.id == id).map(|a| a.cached)
    }

    /// Stop a sequence now and free its slot; returns what it generated (stop reason `Cancelled`).
    pub fn cancel(&mut self, id: SequenceId) -> Option<Generation> {
        let slot = self.slots.iter().position(|s| s.as_ref().is_some_and(|a| a.id == id))?;
        let mut a = self.release(slot)?;
        // A sequence cancelled while waiting for its last feature row had already finished.
        let reason = a.stopping.unwrap_or(StopReason::Cancelled);
        a.features = Vec::new();
        match a.finish(reason) {
            BatchEvent::Finished { generation, .. } => Some(generation),
            BatchEvent::Token { .. } => None,
        }
    }

    /// Drop every sequence (after a GPU error): returns their ids so the caller can fail them.
    pub fn abort_all(&mut self) -> Vec<SequenceId> {
        // What the cache held is unknown after a failed submission.
        self.kept.iter_mut().for_each(Vec::clear);
        let mut ids: Vec<SequenceId> = self.slots.iter_mut().filter_map(|s| s.take().map(|a| a.id)).collect();
        ids.extend(self.empty.drain(..).map(|a| a.id));
        self.finished_features.clear();
        ids
    }

    /// One submission: a decode row per generating sequence, then prompt chunks in the rows left.
    /// Returns the new tokens and the sequences that finished, in slot order.
    pub async fn step(&mut self) -> Result<Vec<BatchEvent>> {
        let mut events: Vec<BatchEvent> = self.empty.drain(..).map(|a| a.finish(StopReason::MaxTokens)).collect();
        let (copies, held) = self.share_prefixes();
        let segments = self.plan(&held);
        self.last_shape = StepShape {
            decode_rows: segments.iter().filter(|s| !s.prefill).count(),
            prefill_rows: segments.iter().filter(|s| s.prefill).map(|s| s.seg.n_rows as usize).sum(),
        };
        if segments.is_empty() && copies.is_empty() {
            return Ok(events);
        }
        let gpu = &self.model.gpu;
        let mut step = Step::new(gpu);
        // Shared prefixes first: the pass below may overwrite a donor's later rows, never these.
        for c in &copies {
            self.record_kv_copy(&mut step, c)?;
        }
        if segments.is_empty() {
            step.submit()?;
            return Ok(events);
        }
        let segs: Vec<Segment> = segments.iter().map(|s| s.seg).collect();
        let capture = self.capture.as_ref().map(|c| Capture { layers: &c.layers, dst: &c.dst, dst_row: 0 });
        let n_logits = self.model.record_batch(&mut step, &self.state, &segs, capture.as_ref())?;
        // Runs of greedy rows share one argmax dispatch; sampled rows keep their own (seed counters).
        let mut greedy_run: Option<(u32, u32)> = None;
        for (row, s) in segments.iter().filter(|s| s.seg.logits).enumerate() {
            let row = row as u32;
            if s.sampling.is_greedy() {
                greedy_run = Some(greedy_run.map_or((row, 1), |(first, n)| (first, n + 1)));
                continue;
            }
            if let Some((first, n)) = greedy_run.take() {
                self.model.record_batch_argmax(&mut step, &self.state, first, n)?;
            }
            self.model.record_batch_sample(&mut step, &self.state, row, &s.sampling, s.seg.pos0 + s.seg.n_rows)?;
        }
        if let Some((first, n)) = greedy_run {
            self.model.record_batch_argmax(&mut step, &self.state, first, n)?;
        }
        let tokens: Vec<u32> = bytemuck_u32(&step.submit_and_read(&self.state.out_ids, 0, n_logits as u64 * 4).await?);
        // The captured rows of this step, in row order (segments laid out as planned).
        let mut rows: Option<std::vec::IntoIter<f32>> = None;
        if let Some(c) = &self.capture {
            let total: usize = segments.iter().map(|s| s.seg.n_rows as usize).sum();
            let bytes = domino_engine::step::read_buffer(gpu, &c.dst, 0, (total * c.width * 4) as u64).await?;
            rows = Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect::<Vec<f32>>().into_iter());
        }
        let width = self.capture.as_ref().map_or(0, |c| c.width);
        let mut next_token = tokens.into_iter();
        let t = now();
        for s in segments {
            let slot = s.seg.slot;
            // This segment's captured rows (taken first, so later segments stay aligned).
            let features: Vec<f32> = rows.as_mut().map(|r| r.by_ref().take(s.seg.n_rows as usize * width).collect()).unwrap_or_default();
            // Every planned slot is active: nothing frees a slot between plan() and here.
            let Some(a) = self.slots[slot].as_mut() else { continue };
            a.features.extend(features);
            if s.prefill {
                a.prefilled += s.seg.n_rows as usize;
            }
            if let Some(reason) = a.stopping {
                // Its last token's row is captured: now it is done.
                events.extend(self.finish_slot(slot, reason));
                continue;
            }
            if !s.seg.logits {
                continue;
            }
            let token = next_token.next().unwrap_or(0);
            let pos = (s.seg.pos0 + s.seg.n_rows) as usize;
            a.first_token_at.get_or_insert(t);
            a.output.push(token);
            events.push(BatchEvent::Token { id: a.id, token });
            let stop = if !a.opts.ignore_eos && a.opts.stop_ids.contains(&token) {
                Some(StopReason::Eos)
            } else if a.output.len() >= a.opts.max_tokens {
                Some(StopReason::MaxTokens)
            } else {
                None
            };
            match stop {
                // With capture, the last token still needs its row: it is fed like any other token
                // and the sequence finishes after the next step.
                Some(reason) if self.capture.is_some() => {
                    a.stopping = Some(reason);
                    self.model.gpu.write(&self.state.slots[slot].ids, pos as u64, &[token]);
                }
                Some(reason) => events.extend(self.finish_slot(slot, reason)),
                // The sampled token is the next step's input: it lives at its position in the slot's ids.
                None => self.model.gpu.write(&self.state.slots[slot].ids, pos as u64, &[token]),
            }
        }
        Ok(events)
    }

    /// Free `slot`, keeping its captured features for `take_features`.
    fn finish_slot(&mut self, slot: usize, reason: StopReason) -> Option<BatchEvent> {
        let mut a = self.release(slot)?;
        if self.capture.is_some() {
            self.finished_features.insert(a.id, std::mem::take(&mut a.features));
        }
        Some(a.finish(reason))
    }

    /// Prompts that share a prefix with another sequence in flight (prefix cache on, no capture):
    /// - a prefilling sequence copies the keys and values of its longest common prefix with any
    ///   other sequence's computed rows, instead of computing them (`KvCopy`, recorded before the pass);
    /// - one whose prefix an older prefilling sequence has yet to compute waits for it (`held`):
    ///   requests that arrive together with one system prompt compute it once, not once each.
    ///
    /// The oldest prefilling sequence is never held, so prefill always progresses.
    fn share_prefixes(&mut self) -> (Vec<KvCopy>, Vec<bool>) {
        let mut held = vec![false; self.slots.len()];
        let mut copies = Vec::new();
        if !self.prefix_cache || self.capture.is_some() {
            return (copies, held);
        }
        let mut order: Vec<usize> = (0..self.slots.len()).filter(|&s| self.slots[s].as_ref().is_some_and(Active::prefilling)).collect();
        order.sort_by_key(|&s| self.slots[s].as_ref().map_or(0, |a| a.id));
        for &b in &order {
            let Some(seq) = self.slots[b].as_ref() else { continue };
            let (prompt, id, mut prefilled) = (&seq.prompt, seq.id, seq.prefilled);
            let limit = prompt.len() - 1;
            let mut donor = None;
            for (d, other) in self.slots.iter().enumerate() {
                let Some(other) = other.as_ref().filter(|_| d != b) else { continue };
                let common = common_prefix(other.computed(), prompt).min(limit);
                if common > prefilled {
                    donor = Some(d);
                    prefilled = common;
                }
            }
            // An older sequence still prefilling this prompt's head: wait for its rows.
            held[b] = order.iter().any(|&a| {
                self.slots[a].as_ref().is_some_and(|older| older.id < id && {
                    let shared = common_prefix(older.prompt.iter(), prompt).min(limit);
                    shared > prefilled && older.prefilled < shared
                })
            });
            if let (Some(src), Some(seq)) = (donor, self.slots[b].as_mut()) {
                copies.push(KvCopy { src, dst: b, from: seq.prefilled, to: prefilled });
                seq.cached += prefilled - seq.prefilled;
                seq.prefilled = prefilled;
            }
        }
        (copies, held)
    }

    /// Copy positions [from, to) of every layer's keys and values from slot `src` to slot `dst`.
    fn record_kv_copy(&self, step: &mut Step, c: &KvCopy) -> Result<()> {
        let width = self.model.config.kv_width() as u32;
        let (src, dst) = (&self.state.slots[c.src], &self.state.slots[c.dst]);
        let rows = (c.to - c.from) as u32;
        let at = c.from as u32 * width;
        let (from, to) = (src.kv_base + at, dst.kv_base + at);
        for (s, d) in src.k_cache.iter().zip(&dst.k_cache).chain(src.v_cache.iter().zip(&dst.v_cache)) {
            // Slots of one KV pool share its buffers: a copy within one buffer has its own kernel.
            if Arc::ptr_eq(s, d) {
                domino_engine::kernels::copy_rows_within(step, s, from, to, width, width, rows)?;
            } else {
                domino_engine::kernels::copy_rows(step, &Rows::new(s, from, width), &Rows::new(d, to, width), width, rows)?;
            }
        }
        Ok(())
    }

    /// This step's segments: decode rows first (so their logits rows are x rows 0.., no gather), then
    /// prompt chunks, oldest request first, while rows remain; `held` slots wait.
    fn plan(&self, held: &[bool]) -> Vec<Planned> {
        let mut out = Vec::new();
        for (slot, a) in self.slots.iter().enumerate() {
            if let Some(a) = a.as_ref().filter(|a| !a.prefilling()) {
                let pos = (a.prompt.len() + a.output.len() - 1) as u32;
                // A stopping sequence's row only captures features (its output is complete).
                let logits = a.stopping.is_none();
                out.push(Planned { seg: Segment { slot, pos0: pos, n_rows: 1, logits }, prefill: false, sampling: a.opts.sampling });
            }
        }
        let mut budget = self.state.max_rows - out.len();
        let mut waiting: Vec<(usize, &Active)> = self.slots.iter().enumerate().filter(|(i, _)| !held[*i]).filter_map(|(i, a)| a.as_ref().filter(|a| a.prefilling()).map(|a| (i, a))).collect();
        waiting.sort_by_key(|(_, a)| a.id);
        for (slot, a) in waiting {
            if budget == 0 {
                break;
            }
            let n = (a.prompt.len() - a.prefilled).min(budget);
            let last = a.prefilled + n == a.prompt.len();
            out.push(Planned { seg: Segment { slot, pos0: a.prefilled as u32, n_rows: n as u32, logits: last }, prefill: true, sampling: a.opts.sampling });
            budget -= n;
        }
        out
    }
}

/// Rows [from, to) of slot `src`'s keys and values, copied into slot `dst` (a shared prefix).
struct KvCopy {
    src: usize,
    dst: usize,
    from: usize,
    to: usize,
}

/// How many leading tokens two sequences share.
pub(crate) fn common_prefix<'a>(a: impl Iterator<Item = &'a u32>, b: &[u32]) -> usize {
    a.zip(b).take_while(|(x, y)| x == y).count()
}

struct Planned {
    seg: Segment,
    prefill: bool,
    sampling: domino_engine::SamplingConfig,
}

fn bytemuck_u32(bytes: &[u8]) -> Vec<u32> {
    bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

impl Drop for Batcher<'_> {
    /// Cached bind groups hold the slots' buffers alive; forget them with the batcher.
    fn drop(&mut self) {
        self.model.gpu.clear_bind_groups();
    }
}
