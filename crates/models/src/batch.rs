//! Many sequences in one forward pass: the GPU side of continuous batching.
//!
//! Each sequence owns a slot: its own region of the KV pool and its own token-id buffer. A batched
//! pass concatenates *segments* (one decode row of a sequence, or a chunk of a prompt being
//! prefilled) into one set of activation rows. The matmuls run once over all rows, so every weight is
//! read once per step for the whole batch. Every slot's keys and values live in one pool buffer per
//! layer (K and V; more pools only where one would pass the adapter's binding limit), so RoPE into
//! the caches and attention over each sequence's own keys are also one dispatch per layer for all
//! segments (`kernels::qkv_rope_segments`, `kernels::attention_segments`), not 2 per sequence per
//! layer (480 in a batch-8 step of SmolLM2, each one too small to keep more than one llvmpipe thread
//! busy). The embedding gather from each slot's ids stays one dispatch per segment.
//!
//! Why this keeps outputs exact: every kernel is batch-invariant (a row's arithmetic never depends on
//! how many rows share the pass or where the row sits), and the per-segment kernels see the same
//! positions and key counts as `Qwen3Model::record_forward` on that sequence alone. So a request's
//! logits, and its greedy tokens, are bit-identical whatever runs beside it.

use crate::error::Result;
use crate::qwen3::{Capture, LayerDims, LayerWeights, QkvWeights, Qwen3Model};
use domino_engine::kernels::{self, AttentionScratch, KvSegment, NormInput, QkvRope, SamplingConfig};
use domino_engine::{EngineError, Epilogue, GpuBuffer, Rows, Step};
use std::sync::Arc;

/// One sequence's GPU memory: its region of the KV pool (all layers) and the token id of every
/// position.
pub struct SequenceSlot {
    /// Per layer, the pool buffer holding this slot's keys (shared with other slots of the pool).
    pub k_cache: Vec<Arc<GpuBuffer>>,
    pub v_cache: Vec<Arc<GpuBuffer>>,
    /// Where this slot's position 0 starts in its pool buffers, in floats.
    pub kv_base: u32,
    /// ids[p] is the token at position p (the prompt, then each token fed back by the scheduler).
    pub ids: Arc<GpuBuffer>,
}

/// The slots plus the activations one batched pass needs (shared by all sequences).
pub struct BatchState {
    pub slots: Vec<SequenceSlot>,
    /// Positions per slot (prompt + generated tokens).
    pub capacity: usize,
    /// Activation rows per pass (decode rows + prefill chunk rows).
    pub max_rows: usize,
    rope: Arc<GpuBuffer>,
    scratch: AttentionScratch,
    x: Arc<GpuBuffer>,
    a: Arc<GpuBuffer>,
    qkv: Arc<GpuBuffer>,
    q_raw: Arc<GpuBuffer>,
    q: Arc<GpuBuffer>,
    k_raw: Arc<GpuBuffer>,
    att: Arc<GpuBuffer>,
    mlp: Arc<GpuBuffer>,
    /// The last row of each segment that wants logits, gathered when they are not rows 0.. of `x`.
    last: Arc<GpuBuffer>,
    logits: Arc<GpuBuffer>,
    /// Sampled token of logits row j at index j: the step's only readback.
    pub out_ids: Arc<GpuBuffer>,
}

impl BatchState {
    /// Logit rows (= sequences that can sample in one pass): one per slot.
    pub fn max_logit_rows(&self) -> usize {
        self.slots.len()
    }
}

/// Rows of one sequence in a batched pass: positions [pos0, pos0 + n_rows) of slot `slot`, whose ids
/// are already in that slot's id buffer. With `logits`, the last row's logits are computed (the next
/// token is sampled from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub slot: usize,
    pub pos0: u32,
    pub n_rows: u32,
    pub logits: bool,
}

impl Qwen3Model {
    /// `slots` sequences of `capacity` positions each, passes of up to `max_rows` rows.
    pub fn new_batch_state(&self, slots: usize, capacity: usize, max_rows: usize) -> Result<BatchState> {
        let gpu = &self.gpu;
        let c = &self.config;
        let (slots, capacity, max_rows) = (slots.max(1), capacity.max(1), max_rows.max(1));
        let scope = gpu.begin_allocation_check();
        let slot_floats = (capacity * c.kv_width()) as u64;
        let kv_bytes = slot_floats * 4;
        // Slots per pool: as many as one binding, one buffer and u32 float offsets allow; at least
        // one, whose own size check names the limit if even that does not fit.
        let most = gpu.caps.max_storage_binding.min(gpu.caps.max_buffer).min(u32::MAX as u64);
        let per_pool = (most / kv_bytes.max(1)).clamp(1, slots as u64) as usize;
        let mut seqs = Vec::with_capacity(slots);
        for first in (0..slots).step_by(per_pool) {
            let n = per_pool.min(slots - first);
            let what = |kind: &str, l: usize| format!("KV pool ({kind}, layer {l}, slots {first}..{}, {capacity} positions each)", first + n);
            let mut k_cache = Vec::with_capacity(c.num_layers);
            let mut v_cache = Vec::with_capacity(c.num_layers);
            for l in 0..c.num_layers {
                k_cache.push(gpu.binding_buffer(&what("K", l), kv_bytes * n as u64)?);
                v_cache.push(gpu.binding_buffer(&what("V", l), kv_bytes * n as u64)?);
            }
            for i in 0..n {
                let ids = gpu.binding_buffer(&format!("token ids (slot {})", first + i), (capacity * 4) as u64)?;
                seqs.push(SequenceSlot { k_cache: k_cache.clone(), v_cache: v_cache.clone(), kv_base: (i as u64 * slot_floats) as u32, ids });
            }
        }
        let shape = self.attention_shape();
        let chunks = capacity.div_ceil(kernels::ATTENTION_CHUNK as usize) as u64;
        let per_row = shape.n_heads as u64 * chunks * shape.head_dim as u64 * 4;
        let scratch_rows = ((32u64 << 20) / per_row.max(1)).clamp(1, max_rows as u64) as u32;
        let f = |name: &str, width: usize, rows: usize| gpu.activation_buffer(name, (rows * width * 4) as u64);
        let state = BatchState {
            capacity,
            max_rows,
            rope: kernels::rope_table(gpu, capacity, c.head_dim, c.rope_theta)?,
            scratch: AttentionScratch::new(gpu, shape, scratch_rows, capacity as u32)?,
            x: f("x", c.hidden_size, max_rows)?,
            a: f("normed", c.hidden_size, max_rows)?,
            qkv: f("q/k/v (projected)", c.q_width() + 2 * c.kv_width(), max_rows)?,
            q_raw: f("q (projected)", c.q_width(), max_rows)?,
            q: f("q (rotated)", c.q_width(), max_rows)?,
            k_raw: f("k (projected)", c.kv_width(), max_rows)?,
            att: f("attention out", c.q_width(), max_rows)?,
            mlp: f("mlp", c.intermediate_size, max_rows)?,
            last: f("last rows", c.hidden_size, slots)?,
            logits: f("logits", c.vocab_size, slots)?,
            out_ids: gpu.binding_buffer("sampled ids", (slots * 4) as u64)?,
            slots: seqs,
        };
        gpu.end_allocation_check(scope, &format!("{slots} sequences of {capacity} positions"))?;
        Ok(state)
    }

    /// Record one batched pass over `segments` (rows laid out in the order given). Logits go to
    /// logits rows 0.. in the order of the segments that ask for them; returns how many.
    /// With `capture`, the residual stream after its layers is copied for every row of the pass
    /// (pass row r to `dst` row dst_row + r, as `record_forward` does for one sequence).
    pub fn record_batch(&self, step: &mut Step, state: &BatchState, segments: &[Segment], capture: Option<&Capture>) -> Result<u32> {
        let total: u32 = segments.iter().map(|s| s.n_rows).sum();
        let n_logits = segments.iter().filter(|s| s.logits).count();
        let bad = |msg: String| -> Result<u32> { Err(EngineError::Gpu(msg).into()) };
        if total == 0 || total as usize > state.max_rows {
            return bad(format!("a batched pass of {total} rows (1..={} allowed)", state.max_rows));
        }
        if n_logits > state.max_logit_rows() {
            return bad(format!("{n_logits} logit rows exceed the batch state's {}", state.max_logit_rows()));
        }
        for s in segments {
            if s.slot >= state.slots.len() || s.n_rows == 0 || (s.pos0 + s.n_rows) as usize > state.capacity {
                return bad(format!("segment {s:?} does not fit {} slots of {} positions", state.slots.len(), state.capacity));
            }
        }
        let c = &self.config;
        let h = c.hidden_size as u32;
        let x = Rows::new(&state.x, 0, h);
        let mut offsets = Vec::with_capacity(segments.len());
        let mut row = 0;
        for s in segments {
            offsets.push(row);
            row += s.n_rows;
        }
        step.set_label("embedding");
        for (s, &off) in segments.iter().zip(&offsets) {
            kernels::embedding(step, &self.embed, &state.slots[s.slot].ids, s.pos0, &x.skip(off), s.n_rows)?;
        }
        let dims = self.layer_dims();
        // The same for every layer: which segments share a pool, in the kernels' terms.
        let runs = pool_runs(state, segments, &offsets);
        for (li, layer) in self.layers.iter().enumerate() {
            record_layer(step, layer, state, li, &dims, segments, &offsets, &runs, total)?;
            if let Some(cap) = capture {
                if let Some(slot) = cap.layers.iter().position(|&c| c == li) {
                    let width = cap.layers.len() as u32 * h;
                    if (cap.dst_row + total) as u64 * width as u64 * 4 > cap.dst.size {
                        return bad(format!("feature capture of {total} rows does not fit its buffer"));
                    }
                    step.set_label(&format!("layer {li} feature capture"));
                    kernels::copy_rows(step, &x, &Rows::new(cap.dst, cap.dst_row * width + slot as u32 * h, width), h, total)?;
                }
            }
        }

        // Final norm + lm_head over the last row of each segment that wants logits.
        let lasts: Vec<u32> = segments.iter().zip(&offsets).filter(|(s, _)| s.logits).map(|(s, &off)| off + s.n_rows - 1).collect();
        if lasts.is_empty() {
            return Ok(0);
        }
        step.set_label("final norm + lm_head");
        let src = if lasts.iter().enumerate().all(|(j, &r)| r == j as u32) {
            x.clone()
        } else {
            let last = Rows::new(&state.last, 0, h);
            for (j, &r) in lasts.iter().enumerate() {
                kernels::copy_rows(step, &x.skip(r), &last.skip(j as u32), h, 1)?;
            }
            last
        };
        let n = lasts.len() as u32;
        let v = c.vocab_size as u32;
        let logits = Rows::new(&state.logits, 0, v);
        let a = Rows::new(&state.a, 0, h);
        let head = self.lm_head();
        if head.row_major {
            kernels::matmul_normed(step, head, &NormInput { weight: &self.norm, eps: c.rms_norm_eps, scratch: a }, &src, &logits, n, Epilogue::Store)?;
        } else {
            kernels::rmsnorm(step, &self.norm, h, c.rms_norm_eps, &src, &a, n)?;
            kernels::matmul(step, head, &a, &logits, n, Epilogue::Store)?;
        }
        Ok(n)
    }

    /// Sample logits row `row` into `state.out_ids[row]`; `counter` numbers the draw as a
    /// single-sequence session would (the sampled token's position), so seeds reproduce.
    pub fn record_batch_sample(&self, step: &mut Step, state: &BatchState, row: u32, cfg: &SamplingConfig, counter: u32) -> Result<()> {
        let v = self.config.vocab_size as u32;
        step.set_label("sampling");
        kernels::sample(step, &Rows::new(&state.logits, row * v, v), v, 1, &state.out_ids, row, cfg, counter)?;
        Ok(())
    }

    /// Greedy-pick logits rows [row, row + n_rows) into `state.out_ids[row..]` in one dispatch (one
    /// workgroup per row, each row's argmax independent of the others), where a dispatch per row
    /// would keep one llvmpipe thread busy at a time.
    pub fn record_batch_argmax(&self, step: &mut Step, state: &BatchState, row: u32, n_rows: u32) -> Result<()> {
        let v = self.config.vocab_size as u32;
        step.set_label("sampling");
        kernels::sample(step, &Rows::new(&state.logits, row * v, v), v, n_rows, &state.out_ids, row, &SamplingConfig::greedy(), 0)?;
        Ok(())
    }
}

/// One decoder layer over every row of the pass: shared matmuls, per-segment RoPE and attention.
#[allow(clippy::too_many_arguments)]
fn record_layer(
    step: &mut Step,
    l: &LayerWeights,
    st: &BatchState,
    li: usize,
    d: &LayerDims,
    segments: &[Segment],
    offsets: &[u32],
    runs: &[PoolRun],
    total: u32,
) -> Result<()> {
    let sh = d.attention;
    let (h, qw, kvw) = (d.hidden, sh.n_heads * sh.head_dim, sh.n_kv_heads * sh.head_dim);
    let x = Rows::new(&st.x, 0, h);
    let a = Rows::new(&st.a, 0, h);
    let q_rows = Rows::new(&st.q, 0, qw);
    step.set_label(&format!("layer {li} q/k/v"));
    match &l.qkv {
        QkvWeights::Fused(m) => {
            let qkv_rows = Rows::new(&st.qkv, 0, qw + 2 * kvw);
            let norm = NormInput { weight: &l.input_norm, eps: d.eps, scratch: a.clone() };
            kernels::matmul_normed(step, m, &norm, &x, &qkv_rows, total, Epilogue::Store)?;
            step.set_label(&format!("layer {li} q/k norm + rope"));
            let norms = l.q_norm.as_ref().zip(l.k_norm.as_ref());
            for run in runs {
                let slot = &st.slots[run.slot];
                let (qkv, q) = (qkv_rows.skip(run.first_row), q_rows.skip(run.first_row));
                let io = QkvRope { qkv: &qkv, q: &q, k_cache: &slot.k_cache[li], v_cache: &slot.v_cache[li], norms, rope_table: &st.rope };
                kernels::qkv_rope_segments(step, &io, sh, &run.segments, d.eps)?;
            }
        }
        QkvWeights::Separate { q, k, v } => {
            // v goes through a staging buffer (the qkv buffer is free here) because each segment's
            // rows belong in a different cache; the copy moves the matmul's bits unchanged.
            let v_rows = Rows::new(&st.qkv, 0, kvw);
            kernels::rmsnorm(step, &l.input_norm, h, d.eps, &x, &a, total)?;
            kernels::matmul(step, q, &a, &Rows::new(&st.q_raw, 0, qw), total, Epilogue::Store)?;
            kernels::matmul(step, k, &a, &Rows::new(&st.k_raw, 0, kvw), total, Epilogue::Store)?;
            kernels::matmul(step, v, &a, &v_rows, total, Epilogue::Store)?;
            step.set_label(&format!("layer {li} q/k norm + rope"));
            for (s, &off) in segments.iter().zip(offsets) {
                let slot = &st.slots[s.slot];
                let (n, pos) = (s.n_rows, s.pos0);
                kernels::copy_rows(step, &v_rows.skip(off), &Rows::new(&slot.v_cache[li], slot.kv_base + pos * kvw, kvw), kvw, n)?;
                kernels::norm_rope(step, &Rows::new(&st.q_raw, 0, qw).skip(off), &q_rows.skip(off), l.q_norm.as_ref(), &st.rope, n, sh.n_heads, sh.head_dim, pos, d.eps)?;
                let k_dst = Rows::new(&slot.k_cache[li], slot.kv_base + pos * kvw, kvw);
                kernels::norm_rope(step, &Rows::new(&st.k_raw, 0, kvw).skip(off), &k_dst, l.k_norm.as_ref(), &st.rope, n, sh.n_kv_heads, sh.head_dim, pos, d.eps)?;
            }
        }
    }
    step.set_label(&format!("layer {li} attention"));
    let att = Rows::new(&st.att, 0, qw);
    for run in runs {
        let slot = &st.slots[run.slot];
        // Causal, exactly as the single-sequence forward: row r sees its sequence's keys [0, pos0 + r].
        let (q, out) = (q_rows.skip(run.first_row), att.skip(run.first_row));
        kernels::attention_segments(step, sh, &q, &slot.k_cache[li], &slot.v_cache[li], &out, &st.scratch, &run.segments)?;
    }
    step.set_label(&format!("layer {li} o_proj + residual"));
    kernels::matmul(step, &l.o, &att, &x, total, Epilogue::Accumulate)?;
    step.set_label(&format!("layer {li} gate/up"));
    let norm = NormInput { weight: &l.post_norm, eps: d.eps, scratch: a.clone() };
    kernels::matmul_glu_normed(step, &l.gate, &l.up, &norm, &x, &Rows::new(&st.mlp, 0, d.intermediate), total)?;
    step.set_label(&format!("layer {li} down + residual"));
    kernels::matmul(step, &l.down, &Rows::new(&st.mlp, 0, d.intermediate), &x, total, Epilogue::Accumulate)?;
    Ok(())
}

/// Consecutive segments whose slots share one KV pool: what one `qkv_rope_segments` /
/// `attention_segments` call covers.
struct PoolRun {
    /// A slot of the pool (every segment's slot shares its buffers).
    slot: usize,
    /// The pass row where the run starts.
    first_row: u32,
    /// Its segments, rows counted from `first_row`.
    segments: Vec<KvSegment>,
}

/// The pass's runs of segments by KV pool (one run unless the pool was split).
fn pool_runs(st: &BatchState, segments: &[Segment], offsets: &[u32]) -> Vec<PoolRun> {
    let mut runs: Vec<PoolRun> = Vec::new();
    for (s, &off) in segments.iter().zip(offsets) {
        let same_pool = runs.last().is_some_and(|r| Arc::ptr_eq(&st.slots[r.slot].k_cache[0], &st.slots[s.slot].k_cache[0]));
        if !same_pool {
            runs.push(PoolRun { slot: s.slot, first_row: off, segments: Vec::new() });
        }
        let run = runs.last_mut().expect("a run was just pushed");
        run.segments.push(KvSegment { first_row: off - run.first_row, n_rows: s.n_rows, pos0: s.pos0, kv_base: st.slots[s.slot].kv_base });
    }
    runs
}
