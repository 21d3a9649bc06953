//! Speculative decoding rounds on the GPU (spec §4): draft -> verify -> accept, with the accept step
//! on the GPU too, so a round reads back only [accepted count, committed tokens].
//!
//! Positions: the anchor (last committed token, not yet run through the target) sits at `start`; the
//! target KV covers [0, start) and so does the draft context. Rollback of rejected drafts is a length
//! reset: the next verify simply writes from the new `start` on.

use crate::clock::now;
use crate::draft_len::{AcceptanceCounts, DraftLen, DraftScheduler, RoundCosts};
use crate::error::{Result, RuntimeError};
use crate::lookup::{Candidate, LookupScheduler, NgramIndex, MAX_NGRAM};
use crate::session::{validate_prompt, GenerateOptions, Generation, GenerationStats, StopReason, MAX_LOGIT_ROWS, MAX_ROWS};
use domino_engine::step::finish;
use domino_engine::step::PendingRead;
use domino_engine::{kernels, GpuBuffer, Rows, SamplingConfig, Step};
use domino_models::drafter_gpu::{DraftState, DrafterModel};
use domino_models::qwen3::{Capture, Forward};
use domino_models::{ForwardState, Qwen3Model};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What the speculative statistics add to a generation.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SpeculativeStats {
    /// Tokens committed per round: accepted drafts + 1 (the target's bonus token).
    pub acceptance_lengths: Vec<usize>,
    /// Drafts verified per round (k; 0 is a plain decode step).
    pub draft_lengths: Vec<usize>,
    /// The mean of `draft_lengths`.
    pub mean_draft_length: f64,
    /// Rounds whose drafts were copied by prompt lookup (`SpeculativeOptions::lookup`) instead of
    /// drafted; they are in `acceptance_lengths` and `draft_lengths` too.
    #[serde(default)]
    pub lookup_rounds: usize,
    /// Of `lookup_rounds`, those whose tokens came from the drafter's static n-gram table
    /// (`DrafterModel::lookup_table`) rather than from earlier in the text.
    #[serde(default)]
    pub table_rounds: usize,
    pub mean_acceptance: f64,
    pub rounds: usize,
    pub block_size: usize,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    /// Time in the Domino head's sequential loop (0 for DFlash / --no-head).
    pub head_seconds: f64,
    /// head_seconds / (draft_seconds + verify_seconds).
    pub head_share: f64,
}

#[derive(Debug, Clone)]
pub struct SpeculativeOptions {
    /// Run the Domino head (false: the backbone alone, the --no-head ablation).
    pub use_head: bool,
    /// Measure the draft / verify / head split (adds GPU syncs between the phases of a round).
    pub timing: bool,
    /// Drafts verified per round: adaptive, or fixed.
    pub draft_len: DraftLen,
    /// Round costs for `DraftLen::Auto` (from `calibrate`, or a cache of it); None: calibrate at the
    /// start of `generate`.
    pub costs: Option<RoundCosts>,
    /// Refine the costs online from each greedy round's measured time (false: schedule with the
    /// costs as given, so a given table makes the schedule a function of the tokens alone).
    pub refine_costs: bool,
    /// Also draft by prompt lookup (`lookup.rs`): where the text so far repeats, a round may verify
    /// copied tokens instead of the drafter's, whichever is expected to commit more tokens per
    /// second (with a fixed draft length n: a copy of up to n tokens against the drafter's n drafts,
    /// per round where no costs are given).
    pub lookup: bool,
}

impl Default for SpeculativeOptions {
    fn default() -> Self {
        Self { use_head: true, timing: true, draft_len: DraftLen::Auto, costs: None, refine_costs: true, lookup: false }
    }
}

pub struct SpeculativeSession<'m> {
    target: &'m Qwen3Model,
    drafter: &'m DrafterModel,
    state: ForwardState,
    draft: DraftState,
    /// Target features `[row][k·h]` captured by the last pass (prefill chunk or verify).
    features: Arc<GpuBuffer>,
    result: Arc<GpuBuffer>,
    /// This session's calibration (`calibrate`) and the `use_head` it was made with, once made.
    costs: Option<(bool, RoundCosts)>,
    /// Acceptance counts of every greedy round so far, without and with the Domino head
    /// (`use_head` as index): the next greedy generation's prior (`DraftScheduler::with_history`).
    history: [AcceptanceCounts; 2],
    /// Acceptance counts of every greedy copy round so far, per match length (n - 1 as index): the
    /// next greedy generation's prior for copies (`LookupScheduler::with_history`).
    lookup_history: Vec<AcceptanceCounts>,
}

/// Timed rounds per draft length in a calibration (the fastest counts).
pub const CALIBRATION_REPS: usize = 2;

impl<'m> SpeculativeSession<'m> {
    /// `capacity`: prompt + generated tokens this session must hold.
    pub fn new(target: &'m Qwen3Model, drafter: &'m DrafterModel, capacity: usize) -> Result<Self> {
        let b = drafter.config.block_size;
        let k = drafter.drafts_per_block();
        if k + 1 > MAX_LOGIT_ROWS {
            return Err(RuntimeError::Unsupported(format!("block size {b}: a verify pass of {} rows exceeds {MAX_LOGIT_ROWS}", k + 1)));
        }
        // Room for the last round's drafts past the final committed token.
        let slots = capacity + b + 1;
        let max_pos = target.config.max_position_embeddings;
        if capacity > max_pos {
            return Err(RuntimeError::ContextOverflow { prompt: capacity, max_tokens: 0, context: max_pos, limit: "max_position_embeddings" });
        }
        let state = target.new_state(slots, MAX_ROWS, MAX_LOGIT_ROWS)?;
        let draft = drafter.new_state(target, slots, MAX_ROWS)?;
        let width = drafter.config.num_features() * target.config.hidden_size;
        let gpu = &target.gpu;
        // Feature rows of committed positions not yet in the draft context (up to MAX_ROWS after
        // plain steps), then room for a verify pass's k + 1 rows.
        let features = gpu.activation_buffer("target features", ((MAX_ROWS + k + 1) * width * 4) as u64)?;
        let result = gpu.binding_buffer("round result", ((k + 2) * 4) as u64)?;
        let history = [AcceptanceCounts::new(k), AcceptanceCounts::new(k)];
        let lookup_history = LookupScheduler::empty_history(k);
        Ok(Self { target, drafter, state, draft, features, result, costs: None, history, lookup_history })
    }

    pub fn capacity(&self) -> usize {
        self.state.capacity - self.drafter.config.block_size - 1
    }

    pub fn validate(&self, prompt: &[u32], max_tokens: usize) -> Result<()> {
        validate_prompt(self.target, prompt, max_tokens, self.capacity())
    }

    fn capture<'a>(&'a self, layers: &'a [usize], dst_row: u32) -> Capture<'a> {
        Capture { layers, dst: &self.features, dst_row }
    }

    /// The costs `generate` schedules with: the caller's, else this session's calibration (made once,
    /// so a seed reproduces its sampled output within a session).
    async fn round_costs(&mut self, spec: &SpeculativeOptions) -> Result<RoundCosts> {
        let max_k = self.max_draft_len();
        if let Some(c) = spec.costs.as_ref().filter(|c| c.max_k() == max_k) {
            return Ok(c.clone());
        }
        if let DraftLen::Fixed(_) = spec.draft_len {
            // A fixed k never consults the costs.
            return Ok(RoundCosts::from_rounds(vec![1.0; max_k + 1]));
        }
        match &self.costs {
            Some((head, c)) if *head == spec.use_head => Ok(c.clone()),
            _ => {
                let c = self.calibrate(CALIBRATION_REPS, spec.use_head).await?;
                self.costs = Some((spec.use_head, c.clone()));
                Ok(c)
            }
        }
    }

    pub fn drafter(&self) -> &'m DrafterModel {
        self.drafter
    }

    /// Acceptance counts of this session's greedy rounds (plus any history it was given), with or
    /// without the Domino head: what a caller keeps to start later sessions from.
    pub fn acceptance_history(&self, use_head: bool) -> &AcceptanceCounts {
        &self.history[use_head as usize]
    }

    /// Start from acceptance counts gathered earlier (ignored unless they fit this drafter's block).
    pub fn set_acceptance_history(&mut self, use_head: bool, counts: AcceptanceCounts) {
        if counts.fits(self.max_draft_len()) {
            self.history[use_head as usize] = counts;
        }
    }

    /// Acceptance counts of this session's greedy copy rounds (`SpeculativeOptions::lookup`) per
    /// match length, plus any history it was given: what a caller keeps to start later sessions from.
    pub fn lookup_history(&self) -> &[AcceptanceCounts] {
        &self.lookup_history
    }

    /// Start copies from counts gathered earlier (ignored unless there is one per match length and
    /// each fits this drafter's block).
    pub fn set_lookup_history(&mut self, counts: Vec<AcceptanceCounts>) {
        if counts.len() == self.lookup_history.len() && counts.iter().all(|c| c.fits(self.max_draft_len())) {
            self.lookup_history = counts;
        }
    }

    /// Drafts a block yields (the largest k).
    pub fn max_draft_len(&self) -> usize {
        self.drafter.drafts_per_block()
    }

    /// Measure the seconds of a round with k drafts, k = 0..=max_draft_len(), on this adapter: `reps`
    /// timed rounds per k (the fastest counts) on dummy tokens. It overwrites the KV caches, so run it
    /// before `generate` (which starts with a prefill); callers cache the result per model and adapter.
    pub async fn calibrate(&mut self, reps: usize, use_head: bool) -> Result<RoundCosts> {
        let (target, drafter) = (self.target, self.drafter);
        let gpu = &target.gpu;
        let max_k = self.max_draft_len();
        let layers = drafter.config.target_layer_ids.clone();
        let ctx = 16u32.min((self.capacity() as u32).saturating_sub(max_k as u32 + 2)).max(1);
        gpu.write(&self.state.ids, 0, &vec![0u32; ctx as usize + max_k + 2]);
        // A context for the drafter's attention to cover, as after a short prompt.
        let mut step = Step::new(gpu);
        let fwd = Forward { pos0: 0, n_rows: ctx, logits_from: ctx, capture: Some(self.capture(&layers, 0)) };
        target.record_forward(&mut step, &self.state, &fwd)?;
        drafter.record_context(&mut step, &self.draft, &self.feature_rows(), 0, ctx)?;
        step.submit()?;
        finish(gpu).await?;
        let mut seconds = vec![f64::MAX; max_k + 1];
        let mut verify_seconds = vec![f64::MAX; max_k + 1];
        let greedy = SamplingConfig::greedy();
        for _ in 0..reps.max(1) + 1 {
            for k in 0..=max_k {
                for (best, drafted) in [(&mut seconds[k], true), (&mut verify_seconds[k], false)] {
                    let t0 = now();
                    let mut step = Step::new(gpu);
                    if drafted {
                        self.record_round(&mut step, ctx, k as u32, 1, &greedy, use_head)?;
                    } else {
                        // A lookup round: the verify alone, its feature rows queued like a plain step's.
                        self.record_verify(&mut step, ctx, k as u32, 1, &layers, &greedy)?;
                    }
                    step.submit_and_read(&self.result, 0, 8).await?;
                    *best = best.min(now() - t0);
                }
            }
        }
        Ok(RoundCosts { seconds, verify_seconds })
    }

    /// Record one round at anchor position `start` into `step`: with k > 0 the draft (`record_draft`,
    /// then k drafts), then the (k + 1)-row verify and acceptance into `result`.
    fn record_round(&self, step: &mut Step, start: u32, k: u32, pending: u32, sampling: &SamplingConfig, use_head: bool) -> Result<()> {
        let layers = &self.drafter.config.target_layer_ids;
        if k > 0 {
            self.record_draft(step, start, k, pending)?;
            self.drafter.record_drafts(step, &self.draft, self.target, &self.state.ids, start, use_head, k)?;
        }
        self.record_verify(step, start, k, if k == 0 { pending } else { 0 }, layers, sampling)
    }

    /// Compile the pipelines of every round this generation may run (k = 0..=max_draft_len(), with a
    /// context append), by recording them at anchor `start` into steps that are never submitted:
    /// shader compilation belongs to the time to first token, not inside the decode, where a weak
    /// drafter's first drafting round of a process would otherwise pay for it (recording costs only
    /// CPU time, every call).
    fn compile_rounds(&self, start: u32, sampling: &SamplingConfig, use_head: bool) -> Result<()> {
        for k in 0..=self.max_draft_len() as u32 {
            let mut step = Step::new(&self.target.gpu);
            self.record_round(&mut step, start, k, if k == 0 { 1 } else { 2 }.min(start), sampling, use_head)?;
        }
        Ok(())
    }

    /// The draft pass up to the drafts: the `pending` context rows, then the block through the
    /// backbone with base logits for k drafts.
    fn record_draft(&self, step: &mut Step, start: u32, k: u32, pending: u32) -> Result<()> {
        let drafter = self.drafter;
        if pending > 0 {
            drafter.record_context(step, &self.draft, &self.feature_rows(), start - pending, pending)?;
        }
        drafter.reset_head_state(&self.draft);
        Ok(drafter.record_backbone(step, &self.draft, self.target, &self.state.ids, start, k)?)
    }

    /// The verify pass over [anchor, d1..dk] with feature capture from feature row `dst_row` (plain
    /// steps queue their row after the pending ones), then acceptance on the GPU.
    fn record_verify(&self, step: &mut Step, start: u32, k: u32, dst_row: u32, layers: &[usize], sampling: &SamplingConfig) -> Result<()> {
        let target = self.target;
        let fwd = Forward { pos0: start, n_rows: k + 1, logits_from: 0, capture: Some(self.capture(layers, dst_row)) };
        target.record_forward(step, &self.state, &fwd)?;
        let v = target.config.vocab_size as u32;
        let logits = Rows::new(&self.state.logits, 0, v);
        if sampling.is_greedy() {
            kernels::sample(step, &logits, v, k + 1, &self.state.out_ids, 0, &SamplingConfig::greedy(), 0)?;
            kernels::accept_greedy(step, &self.state.out_ids, &self.state.ids, &self.result, start, k)?;
        } else {
            // Draws are numbered by position so a seed gives one reproducible stream.
            let counter = start.wrapping_mul(2 * MAX_LOGIT_ROWS as u32);
            kernels::accept_sampled(step, &logits, v, k, &self.state.ids, start, &self.result, 0, sampling, counter)?;
        }
        Ok(())
    }

    fn feature_rows(&self) -> Rows<'_> {
        let width = (self.drafter.config.num_features() * self.target.config.hidden_size) as u32;
        Rows::new(&self.features, 0, width)
    }

    pub async fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        spec: &SpeculativeOptions,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<(Generation, SpeculativeStats)> {
        self.validate(prompt, opts.max_tokens)?;
        let (target, drafter) = (self.target, self.drafter);
        let gpu = &target.gpu;
        let layers = drafter.config.target_layer_ids.clone();
        let n = prompt.len();
        let mut stats = GenerationStats { prompt_tokens: n, ..Default::default() };
        let mut spec_stats = SpeculativeStats { block_size: drafter.config.block_size, ..Default::default() };
        let mut output = Vec::new();
        let mut stop_reason = StopReason::MaxTokens;
        if opts.max_tokens == 0 {
            return Ok((Generation { prompt_ids: prompt.to_vec(), output_ids: output, stop_reason, stats }, spec_stats));
        }
        let costs = self.round_costs(spec).await?;
        gpu.write(&self.state.ids, 0, prompt);

        // Prefill in chunks: target rows with feature capture, then the drafter's context from them.
        let t0 = now();
        if opts.max_tokens > 1 {
            self.compile_rounds(n as u32, &opts.sampling, spec.use_head)?;
        }
        let mut step = Step::new(gpu);
        let mut r0 = 0;
        while r0 < n {
            let nb = (n - r0).min(MAX_ROWS);
            let last = r0 + nb == n;
            let fwd = Forward { pos0: r0 as u32, n_rows: nb as u32, logits_from: if last { nb as u32 - 1 } else { nb as u32 }, capture: Some(self.capture(&layers, 0)) };
            target.record_forward(&mut step, &self.state, &fwd)?;
            drafter.record_context(&mut step, &self.draft, &self.feature_rows(), r0 as u32, nb as u32)?;
            r0 += nb;
        }
        target.record_sample(&mut step, &self.state, 1, &opts.sampling, n as u32, &self.state.ids, n as u32)?;
        let bytes = step.submit_and_read(&self.state.ids, n as u64 * 4, 4).await?;
        let first = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let t1 = now();
        stats.prefill_seconds = t1 - t0;
        stats.time_to_first_token_s = t1 - t0;

        let mut emit = |tok: u32, output: &mut Vec<u32>| -> Option<StopReason> {
            output.push(tok);
            let keep_going = on_token(tok);
            if !opts.ignore_eos && opts.stop_ids.contains(&tok) {
                return Some(StopReason::Eos);
            }
            if !keep_going {
                return Some(StopReason::Cancelled);
            }
            if output.len() >= opts.max_tokens {
                return Some(StopReason::MaxTokens);
            }
            None
        };
        let mut start = n as u32;
        // Feature rows [0, pending) hold committed positions [start - pending, start) that the
        // draft context does not have yet (the prefill's last chunk was appended above).
        let mut pending = 0u32;
        let mut done = emit(first, &mut output);
        // Sampled output must be reproducible from its seed, so its k may depend on the drafter's
        // acceptance in this generation (a function of its tokens) but not on wall-clock times or
        // on earlier generations: costs stay as given and no history is used or gathered.
        let greedy = opts.sampling.is_greedy();
        let history = &self.history[spec.use_head as usize];
        let mut scheduler = if greedy { DraftScheduler::with_history(spec.draft_len, costs, history) } else { DraftScheduler::new(spec.draft_len, costs) };
        let refine_costs = spec.refine_costs && greedy;
        let max_k = self.max_draft_len();
        // Prompt lookup: every committed token so far, and how far copies of each match length pay.
        let mut lookup = spec.lookup.then(|| {
            let mut index = NgramIndex::new();
            index.extend(prompt);
            index.extend(&output);
            let chooser = if greedy { LookupScheduler::with_history(max_k, &self.lookup_history) } else { LookupScheduler::new(max_k) }.with_draft_len(spec.draft_len);
            (index, chooser)
        });
        let table = drafter.lookup_table.as_deref();
        // A plain round already submitted behind the one being read (see `queue_plain`), and when
        // the last readback finished (a queued round's time runs from there).
        let mut queued_plain: Option<PendingRead> = None;
        let mut last_read = now();
        while done.is_none() {
            let (copied, k, read, ta, tb) = match queued_plain.take() {
                Some(read) => {
                    // The match this round would have declined ages as a declined one does.
                    if let Some((index, chooser)) = &mut lookup {
                        index.candidates(table, max_k).iter().for_each(|c| chooser.pass(c.class));
                    }
                    (None, 0, read, last_read, last_read)
                }
                None => {
                    // Copied drafts (from the text or the table) where they are expected to beat
                    // the drafter's best round (plain steps included); else the drafter's schedule decides.
                    let copied = match &mut lookup {
                        Some((index, chooser)) => chooser.pick(index.candidates(table, max_k), &scheduler.costs, scheduler.best_value()),
                        None => None,
                    };
                    let k = match &copied {
                        Some(c) => c.tokens.len() as u32,
                        None => scheduler.next_k() as u32,
                    };
                    // Rounds without a draft pass (plain steps, copies) queue their feature rows after
                    // the pending ones; the draft context takes them in at the next draft pass.
                    let queued = k == 0 || copied.is_some();
                    if queued && pending + k + 1 > MAX_ROWS as u32 {
                        // The queue of feature rows would overflow: append it to the draft context.
                        let mut step = Step::new(gpu);
                        drafter.record_context(&mut step, &self.draft, &self.feature_rows(), start - pending, pending)?;
                        step.submit()?;
                        pending = 0;
                    }
                    let ta = now();
                    let mut step = Step::new(gpu);
                    if let Some(c) = &copied {
                        // Written before the step's submission runs (queue writes precede it).
                        gpu.write(&self.state.ids, start as u64 + 1, &c.tokens);
                    } else if k > 0 {
                        self.record_draft(&mut step, start, k, pending)?;
                        let head_apart = spec.timing && drafter.runs_head(spec.use_head);
                        let mut head_start = 0.0;
                        if head_apart {
                            // Timing only: the head's loop in a submission of its own, to measure its share.
                            step.submit()?;
                            finish(gpu).await?;
                            head_start = now();
                            step = Step::new(gpu);
                        }
                        drafter.record_drafts(&mut step, &self.draft, target, &self.state.ids, start, spec.use_head, k)?;
                        if spec.timing {
                            step.submit()?;
                            finish(gpu).await?;
                            step = Step::new(gpu);
                        }
                        if head_apart {
                            spec_stats.head_seconds += now() - head_start;
                        }
                    }
                    let tb = now();
                    self.record_verify(&mut step, start, k, if queued { pending } else { 0 }, &layers, &opts.sampling)?;
                    (copied, k, step.submit_with_read(&self.result, 0, (k as u64 + 2) * 4)?, ta, tb)
                }
            };
            // Pipelining, as `Session` decodes: where this round is a plain step and the schedule
            // will make the next one a plain step too whatever token this one commits, the next is
            // submitted before this one is read, so the GPU does not idle while the CPU reads back
            // and records. With lookup, the next round's match depends on this round's token, so
            // only where no match it can find would be copied. Not with timing syncs, nor where
            // the queued round's feature row would not fit.
            let queue_plain = k == 0
                && copied.is_none()
                && lookup.as_ref().is_none_or(|(index, chooser)| chooser.declines_every_match(index.next_match_reach(), table.is_some(), &scheduler.costs, scheduler.best_value()))
                && !spec.timing
                && pending + 2 <= MAX_ROWS as u32
                && output.len() + 1 < opts.max_tokens
                && scheduler.next_k_after_plain_step() == 0;
            if queue_plain {
                let mut step = Step::new(gpu);
                self.record_verify(&mut step, start + 1, 0, pending + 1, &layers, &opts.sampling)?;
                queued_plain = Some(step.submit_with_read(&self.result, 0, 8)?);
            }
            let bytes = read.wait(gpu).await?;
            let tc = now();
            last_read = tc;
            let queued = k == 0 || copied.is_some();
            if spec.timing {
                spec_stats.draft_seconds += tb - ta;
                spec_stats.verify_seconds += tc - tb;
            } else {
                spec_stats.verify_seconds += tc - ta;
            }
            let words: Vec<u32> = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            let a = words[0].min(k) as usize;
            let committed = &words[1..a + 2];
            if let Some(Candidate { class, .. }) = copied {
                if let Some((_, chooser)) = &mut lookup {
                    chooser.observe(class, k as usize, a);
                }
                if greedy {
                    self.lookup_history[class].record(k as usize, a);
                }
                spec_stats.table_rounds += (class >= MAX_NGRAM) as usize;
                if refine_costs && !spec.timing {
                    scheduler.costs.observe_verify(k as usize, tc - ta);
                }
                spec_stats.lookup_rounds += 1;
            } else {
                scheduler.observe(k as usize, a, if refine_costs && !spec.timing { tc - ta } else { scheduler.costs.seconds[k as usize] });
                if greedy {
                    self.history[spec.use_head as usize].record(k as usize, a);
                }
            }
            if let Some((index, _)) = &mut lookup {
                index.extend(committed);
            }
            spec_stats.acceptance_lengths.push(a + 1);
            spec_stats.draft_lengths.push(k as usize);
            for &tok in committed {
                done = emit(tok, &mut output);
                if done.is_some() {
                    break;
                }
            }
            start += a as u32 + 1;
            pending = if queued { pending + a as u32 + 1 } else { a as u32 + 1 };
        }
        stop_reason = done.unwrap_or(stop_reason);
        stats.decode_seconds = now() - t1;
        stats.generated_tokens = output.len();
        stats.prefill_tokens_per_s = n as f64 / stats.prefill_seconds.max(1e-9);
        let decoded = output.len().saturating_sub(1);
        stats.decode_tokens_per_s = if decoded > 0 { decoded as f64 / stats.decode_seconds.max(1e-9) } else { 0.0 };
        spec_stats.rounds = spec_stats.acceptance_lengths.len();
        spec_stats.mean_draft_length = if spec_stats.rounds > 0 {
            spec_stats.draft_lengths.iter().sum::<usize>() as f64 / spec_stats.rounds as f64
        } else {
            0.0
        };
        spec_stats.mean_acceptance = if spec_stats.rounds > 0 {
            spec_stats.acceptance_lengths.iter().sum::<usize>() as f64 / spec_stats.rounds as f64
        } else {
            0.0
        };
        let round_time = spec_stats.draft_seconds + spec_stats.verify_seconds;
        spec_stats.head_share = if round_time > 0.0 { spec_stats.head_seconds / round_time } else { 0.0 };
        Ok((Generation { prompt_ids: prompt.to_vec(), output_ids: output, stop_reason, stats }, spec_stats))
    }
}

impl Drop for SpeculativeSession<'_> {
    /// Cached bind groups hold this session's buffers alive; forget them with the session.
    fn drop(&mut self) {
        self.target.gpu.clear_bind_groups();
    }
}
