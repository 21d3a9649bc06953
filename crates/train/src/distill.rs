//! Self-distillation data (`domino train data`): the engine generates the target's greedy
//! continuation of every prompt, then one more forward over prompt + continuation captures the
//! target features at the drafter's target_layer_ids (the residual stream after those layers, as
//! the speculative session feeds them to the drafter). Stored f16 in shards; resumable.
//!
//! With `batch > 1` the prompts are decoded many at once through the continuous batcher
//! (`domino_runtime::Batcher`: one submission per step for every sequence), which captures the same
//! features as it goes (each position's row in the step that fed it, plus one row for the last
//! token), so no second forward is needed. Batch invariance makes the tokens and feature bits equal
//! to the one-prompt-at-a-time path (`batch = 1`, kept as the reference; tested).

use crate::data::{prompts_hash, read_shard, shard_path, write_shard, DataMeta, Sequence, FORMAT};
use crate::error::{Result, TrainError};
use domino_engine::Step;
use domino_models::qwen3::{Capture, Forward};
use domino_models::Qwen3Model;
use crate::cpu_target::{CpuTarget, Row};
use domino_runtime::{BatchEvent, Batcher, GenerateOptions, Session, BATCH_MAX_ROWS};
use std::collections::{HashMap, VecDeque};
use std::path::Path;

/// Rows per capture pass: one submission and one readback each.
const CAPTURE_ROWS: usize = 64;

#[derive(Debug, Clone)]
pub struct DistillOptions {
    pub max_new_tokens: usize,
    pub shard_size: usize,
    pub target_layer_ids: Vec<usize>,
    /// Stop a continuation at these ids (the model's eos), unless `ignore_eos`.
    pub stop_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Prompts decoded at once (1: one at a time through `Session`, then a capture pass).
    pub batch: usize,
}

impl DistillOptions {
    /// Greedy decoding to `max_new_tokens`, stopping at `stop_ids` unless `ignore_eos`.
    fn generate_options(&self) -> GenerateOptions {
        GenerateOptions { max_tokens: self.max_new_tokens, ignore_eos: self.ignore_eos, stop_ids: self.stop_ids.clone(), ..GenerateOptions::default() }
    }
}

/// What a run did: shards found complete from an earlier run, shards written now, tokens generated now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DistillSummary {
    pub shards_skipped: usize,
    pub shards_written: usize,
    pub sequences: usize,
    pub generated_tokens: usize,
}

/// Generate the data folder `out` for `prompts` (token ids). `progress(done, total)` counts prompts.
pub fn generate_data(
    model: &Qwen3Model,
    prompts: &[Vec<u32>],
    out: &Path,
    opts: &DistillOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DistillSummary> {
    let c = &model.config;
    let meta = prepare(c, prompts, out, opts)?;
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let capacity = longest + opts.max_new_tokens;
    if opts.batch > 1 {
        return generate_batched(model, prompts, out, opts, &meta, capacity, progress);
    }
    let mut session = Session::new(model, capacity)?;
    let state = model.new_state(capacity, CAPTURE_ROWS, 1)?;
    let width = opts.target_layer_ids.len() * c.hidden_size;
    let captured = model.gpu.binding_buffer("captured features", (CAPTURE_ROWS * width * 4) as u64)?;
    let gen = opts.generate_options();
    let mut summary = DistillSummary::default();
    for (index, chunk) in prompts.chunks(opts.shard_size).enumerate() {
        let first = index * opts.shard_size;
        if shard_path(out, index).exists() && read_shard(out, index, &meta).is_ok() {
            summary.shards_skipped += 1;
            progress(first + chunk.len(), prompts.len());
            continue;
        }
        let mut seqs = Vec::with_capacity(chunk.len());
        for (j, prompt) in chunk.iter().enumerate() {
            let g = pollster::block_on(session.generate(prompt, &gen, &mut |_| true))?;
            let tokens: Vec<u32> = prompt.iter().chain(&g.output_ids).copied().collect();
            summary.generated_tokens += g.output_ids.len();
            let features = capture(model, &state, &captured, &tokens, &opts.target_layer_ids)?;
            seqs.push(Sequence { tokens, prompt_len: prompt.len(), features });
            progress(first + j + 1, prompts.len());
        }
        write_shard(out, index, &seqs, width)?;
        summary.shards_written += 1;
        summary.sequences += seqs.len();
    }
    Ok(summary)
}

/// Check the options and prompts, and write (or check against an earlier run's) `meta.json`.
fn prepare(c: &domino_models::Qwen3Config, prompts: &[Vec<u32>], out: &Path, opts: &DistillOptions) -> Result<DataMeta> {
    if prompts.is_empty() {
        return Err(TrainError::Invalid("no prompts".into()));
    }
    if opts.shard_size == 0 || opts.max_new_tokens == 0 || opts.batch == 0 {
        return Err(TrainError::Invalid("--shard-size, --max-new-tokens and --batch must be positive".into()));
    }
    if opts.target_layer_ids.is_empty() {
        return Err(TrainError::Invalid("target_layer_ids must not be empty".into()));
    }
    if let Some(&l) = opts.target_layer_ids.iter().find(|&&l| l >= c.num_layers) {
        return Err(TrainError::Invalid(format!("target layer id {l} is out of range: the target has {} layers", c.num_layers)));
    }
    if let Some((i, _)) = prompts.iter().enumerate().find(|(_, p)| p.is_empty()) {
        return Err(TrainError::Invalid(format!("prompt {i} is empty")));
    }
    let meta = DataMeta {
        format: FORMAT.into(),
        hidden_size: c.hidden_size,
        num_target_layers: c.num_layers,
        vocab_size: c.vocab_size,
        target_layer_ids: opts.target_layer_ids.clone(),
        max_new_tokens: opts.max_new_tokens,
        shard_size: opts.shard_size,
        num_prompts: prompts.len(),
        prompts_hash: prompts_hash(prompts),
    };
    std::fs::create_dir_all(out).map_err(crate::error::io(out))?;
    if out.join("meta.json").exists() {
        let old = DataMeta::read(out)?;
        if old != meta {
            return Err(TrainError::Invalid(format!(
                "{} holds data made with other settings or prompts ({old:?}); use a new --out folder",
                out.display()
            )));
        }
    }
    meta.write(out)?;

    Ok(meta)
}

/// A decoder of many prompts at once (the GPU batcher, or the CPU target): greedy continuations
/// with the features of every position, each prompt reported when it finishes.
trait BatchDecoder {
    fn has_free_slot(&self) -> bool;
    /// Start decoding prompt number `index`.
    fn admit(&mut self, index: usize, prompt: &[u32]) -> Result<()>;
    fn is_idle(&self) -> bool;
    /// One step for every admitted prompt; the prompts finished in it.
    fn step(&mut self) -> Result<Vec<Finished>>;
}

struct Finished {
    index: usize,
    output_ids: Vec<u32>,
    /// `[prompt + output tokens][layers · hidden]`.
    features: Vec<f32>,
}

/// The engine's continuous batcher with feature capture.
struct GpuDecoder<'a> {
    batcher: Batcher<'a>,
    gen: GenerateOptions,
    prompt_of: HashMap<domino_runtime::SequenceId, usize>,
}

impl BatchDecoder for GpuDecoder<'_> {
    fn has_free_slot(&self) -> bool {
        self.batcher.has_free_slot()
    }
    fn admit(&mut self, index: usize, prompt: &[u32]) -> Result<()> {
        let id = self.batcher.admit(prompt.to_vec(), self.gen.clone())?;
        self.prompt_of.insert(id, index);
        Ok(())
    }
    fn is_idle(&self) -> bool {
        self.batcher.is_idle()
    }
    fn step(&mut self) -> Result<Vec<Finished>> {
        let mut done = Vec::new();
        for event in pollster::block_on(self.batcher.step())? {
            let BatchEvent::Finished { id, generation } = event else { continue };
            let index = self.prompt_of.remove(&id).ok_or_else(|| TrainError::Invalid(format!("the batcher finished an unknown sequence {id}")))?;
            let features = self.batcher.take_features(id).unwrap_or_default();
            done.push(Finished { index, output_ids: generation.output_ids, features });
        }
        Ok(done)
    }
}

/// The batched path: up to `opts.batch` prompts decode together (in prompt order, a finished one's
/// slot going to the next prompt at once, across shard boundaries); a shard is written as soon as
/// all its sequences are done.
fn generate_batched(
    model: &Qwen3Model,
    prompts: &[Vec<u32>],
    out: &Path,
    opts: &DistillOptions,
    meta: &DataMeta,
    capacity: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DistillSummary> {
    let gen = opts.generate_options();
    let slots = opts.batch.min(prompts.len());
    let make = || -> Result<GpuDecoder<'_>> {
        let mut batcher = Batcher::new(model, slots, capacity, BATCH_MAX_ROWS.max(slots))?;
        batcher.capture_features(&opts.target_layer_ids)?;
        Ok(GpuDecoder { batcher, gen, prompt_of: HashMap::new() })
    };
    run_batched(make, prompts, out, opts, meta, progress)
}

/// Self-distillation data through the CPU target (`train data --device cpu`): the same folder
/// format and resuming as [`generate_data`], `opts.batch` prompts decoded at once.
pub fn generate_data_cpu(
    target: &CpuTarget,
    prompts: &[Vec<u32>],
    out: &Path,
    opts: &DistillOptions,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DistillSummary> {
    let meta = prepare(&target.config, prompts, out, opts)?;
    let make = || -> Result<CpuDecoder<'_>> { Ok(CpuDecoder::new(target, opts)) };
    run_batched(make, prompts, out, opts, &meta, progress)
}

/// The shard bookkeeping shared by both decoders; `make` builds the decoder once there is work.
fn run_batched<'a, D: BatchDecoder>(
    make: impl FnOnce() -> Result<D>,
    prompts: &[Vec<u32>],
    out: &Path,
    opts: &DistillOptions,
    meta: &DataMeta,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DistillSummary> {
    let width = meta.feature_width();
    let mut summary = DistillSummary::default();
    let mut done = 0;
    // Shards still to write: their sequences so far, and how many are missing.
    let mut pending: HashMap<usize, (Vec<Option<Sequence>>, usize)> = HashMap::new();
    let mut queue = VecDeque::new();
    for (index, chunk) in prompts.chunks(opts.shard_size).enumerate() {
        if shard_path(out, index).exists() && read_shard(out, index, meta).is_ok() {
            summary.shards_skipped += 1;
            done += chunk.len();
            progress(done, prompts.len());
            continue;
        }
        pending.insert(index, (vec![None; chunk.len()], chunk.len()));
        queue.extend(index * opts.shard_size..index * opts.shard_size + chunk.len());
    }
    if queue.is_empty() {
        return Ok(summary);
    }
    let mut decoder = make()?;
    loop {
        while decoder.has_free_slot() {
            let Some(i) = queue.pop_front() else { break };
            decoder.admit(i, &prompts[i])?;
        }
        if decoder.is_idle() {
            break;
        }
        for Finished { index: i, output_ids, features } in decoder.step()? {
            let prompt = &prompts[i];
            let tokens: Vec<u32> = prompt.iter().chain(&output_ids).copied().collect();
            if features.len() != tokens.len() * width {
                return Err(TrainError::Invalid(format!("prompt {i}: {} feature values captured for {} tokens", features.len(), tokens.len())));
            }
            summary.generated_tokens += output_ids.len();
            let features = features.into_iter().map(half::f16::from_f32).collect();
            let (index, j) = (i / opts.shard_size, i % opts.shard_size);
            let Some((seqs, missing)) = pending.get_mut(&index) else { continue };
            seqs[j] = Some(Sequence { tokens, prompt_len: prompt.len(), features });
            *missing -= 1;
            if *missing == 0 {
                if let Some((seqs, _)) = pending.remove(&index) {
                    let seqs: Vec<Sequence> = seqs.into_iter().flatten().collect();
                    write_shard(out, index, &seqs, width)?;
                    summary.shards_written += 1;
                    summary.sequences += seqs.len();
                }
            }
            done += 1;
            progress(done, prompts.len());
        }
    }
    Ok(summary)
}

/// A prompt being decoded by the CPU target.
struct CpuSlot {
    index: usize,
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Positions whose row has been fed (their keys are in the cache, their features below).
    fed: usize,
    features: Vec<f32>,
    /// The continuation is complete; its last token still needs its feature row.
    stopping: bool,
}

struct CpuDecoder<'a> {
    target: &'a CpuTarget,
    opts: &'a DistillOptions,
    slots: Vec<Option<CpuSlot>>,
    caches: Vec<crate::cpu_target::KvCache>,
}

impl<'a> CpuDecoder<'a> {
    fn new(target: &'a CpuTarget, opts: &'a DistillOptions) -> Self {
        Self { target, opts, slots: (0..opts.batch).map(|_| None).collect(), caches: Vec::new() }
    }
}

impl BatchDecoder for CpuDecoder<'_> {
    fn has_free_slot(&self) -> bool {
        self.slots.iter().any(Option::is_none)
    }
    fn admit(&mut self, index: usize, prompt: &[u32]) -> Result<()> {
        let free = self.slots.iter().position(Option::is_none).ok_or_else(|| TrainError::Invalid("no free slot".into()))?;
        let capacity = prompt.len() + self.opts.max_new_tokens;
        if self.caches.len() <= free {
            self.caches.resize_with(free + 1, || self.target.new_cache(0));
        }
        self.caches[free] = self.target.new_cache(capacity);
        self.slots[free] = Some(CpuSlot { index, tokens: prompt.to_vec(), prompt_len: prompt.len(), fed: 0, features: Vec::new(), stopping: false });
        Ok(())
    }
    fn is_idle(&self) -> bool {
        self.slots.iter().all(Option::is_none)
    }
    fn step(&mut self) -> Result<Vec<Finished>> {
        // Every slot feeds all its unfed positions: a new prompt whole, a decoding one its last token.
        let mut rows = Vec::new();
        for (seq, slot) in self.slots.iter().enumerate() {
            let Some(s) = slot else { continue };
            let last = s.tokens.len() - 1;
            for pos in s.fed..s.tokens.len() {
                rows.push(Row { seq, pos, token: s.tokens[pos], logits: pos == last && !s.stopping });
            }
        }
        let width = self.opts.target_layer_ids.len() * self.target.config.hidden_size;
        let out = self.target.step(&rows, &mut self.caches, &self.opts.target_layer_ids)?;
        let mut next = out.next_tokens.into_iter();
        for (r, row) in rows.iter().enumerate() {
            let Some(s) = self.slots[row.seq].as_mut() else { continue };
            s.features.extend_from_slice(&out.features[r * width..][..width]);
            s.fed = row.pos + 1;
            if !row.logits {
                continue;
            }
            let token = next.next().ok_or_else(|| TrainError::Invalid("the CPU target returned too few tokens".into()))?;
            s.tokens.push(token);
            let generated = s.tokens.len() - s.prompt_len;
            let eos = !self.opts.ignore_eos && self.opts.stop_ids.contains(&token);
            s.stopping = eos || generated >= self.opts.max_new_tokens;
        }
        let mut done = Vec::new();
        for slot in &mut self.slots {
            if slot.as_ref().is_some_and(|s| s.stopping && s.fed == s.tokens.len()) {
                if let Some(s) = slot.take() {
                    done.push(Finished { index: s.index, output_ids: s.tokens[s.prompt_len..].to_vec(), features: s.features });
                }
            }
        }
        Ok(done)
    }
}

/// Features of every position of `tokens` `[n][k·h]` (f16), in passes of CAPTURE_ROWS rows.
fn capture(
    model: &Qwen3Model,
    state: &domino_models::ForwardState,
    dst: &std::sync::Arc<domino_engine::GpuBuffer>,
    tokens: &[u32],
    layers: &[usize],
) -> Result<Vec<half::f16>> {
    let gpu = &model.gpu;
    gpu.write(&state.ids, 0, tokens);
    let width = layers.len() * model.config.hidden_size;
    let mut out = Vec::with_capacity(tokens.len() * width);
    let mut r0 = 0;
    while r0 < tokens.len() {
        let nb = (tokens.len() - r0).min(CAPTURE_ROWS);
        let mut step = Step::new(gpu);
        let fwd = Forward {
            pos0: r0 as u32,
            n_rows: nb as u32,
            logits_from: nb as u32,
            capture: Some(Capture { layers, dst, dst_row: 0 }),
        };
        model.record_forward(&mut step, state, &fwd)?;
        let bytes = pollster::block_on(step.submit_and_read(dst, 0, (nb * width * 4) as u64))?;
        out.extend(bytes.chunks_exact(4).map(|b| half::f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))));
        r0 += nb;
    }
    Ok(out)
}
