//! The memory check before any upload: what the model's weights (in the chosen `--dtype`), the KV
//! cache for the requested context, the drafter and the scratch buffers need, against the adapter's
//! limits (one storage binding, one buffer) and its memory budget where one is known. A request that
//! cannot fit is refused in one line naming the need, the limit and what to change (`--context`,
//! `--dtype`), before a single byte is uploaded.
//!
//! Sizes are computed from the headers only (shapes and stored byte lengths), in saturating 64-bit
//! arithmetic, so absurd dimensions give a refusal rather than an overflow.

use crate::error::{Result, RuntimeError};
use crate::session::{MAX_LOGIT_ROWS, MAX_ROWS};
use domino_engine::{DTypeChoice, Gpu, HostDType, QuantType, WeightFormat};
use domino_models::checkpoint::WeightSource;
use domino_models::drafter::DrafterConfig;
use domino_models::Qwen3Config;

/// What to check: a target (config and weight headers), how its weights are stored on the GPU, an
/// optional drafter, and the KV capacity in positions.
pub struct MemoryRequest<'a> {
    pub config: &'a Qwen3Config,
    pub weights: &'a dyn WeightSource,
    pub dtype: DTypeChoice,
    /// The drafter's config and the format its float weights get (f16 unless `--dtype f32`).
    pub drafter: Option<(&'a DrafterConfig, WeightFormat)>,
    /// Positions the KV cache holds (prompt + generated tokens).
    pub context: usize,
    /// Sequences that each hold a KV cache of `context` positions (1; `serve --max-batch` slots).
    pub sequences: usize,
}

/// The adapter's limits that the check compares against.
#[derive(Debug, Clone)]
pub struct MemoryLimits {
    pub adapter: String,
    /// max_storage_buffer_binding_size: the KV cache of one layer, the logits, each activation.
    pub max_storage_binding: u64,
    /// max_buffer_size.
    pub max_buffer: u64,
    /// Bytes the whole request may use, where known (`Caps::memory_budget`).
    pub budget: Option<u64>,
}

impl MemoryLimits {
    pub fn of(gpu: &Gpu) -> Self {
        Self {
            adapter: gpu.info.name.clone(),
            max_storage_binding: gpu.caps.max_storage_binding,
            max_buffer: gpu.caps.max_buffer,
            budget: gpu.caps.memory_budget,
        }
    }
}

/// What a request needs, in bytes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MemoryPlan {
    pub context: usize,
    pub weights: u64,
    pub kv_cache: u64,
    pub drafter_weights: u64,
    pub drafter_kv_cache: u64,
    pub scratch: u64,
    pub total: u64,
    /// The largest buffer that must be bound whole, and what it holds.
    pub largest_binding: u64,
    pub largest_binding_what: String,
}

/// "1.5 GiB", "12.0 MiB", "512 B".
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The stored type of a tensor from its element count and byte length (headers only). Types of
/// equal size (Q4_0 and Q4_K, Q5_0 and Q5_K) are interchangeable for this estimate.
fn stored_dtype(elements: u64, len: u64) -> HostDType {
    if len == elements.saturating_mul(4) {
        return HostDType::F32;
    }
    if len == elements.saturating_mul(2) {
        return HostDType::F16;
    }
    QuantType::ALL
        .into_iter()
        .find(|q| len == (elements / q.block_values() as u64).saturating_mul(q.block_bytes() as u64))
        .map(HostDType::Quant)
        .unwrap_or(HostDType::Quant(QuantType::Q4_0))
}

/// Bytes a matrix of `elements` weights takes on the GPU in `format` (K-quants' scales widened to
/// bytes: 148 per 256-value Q4_K block, see quant.rs).
fn format_bytes(format: WeightFormat, elements: u64) -> u64 {
    match format {
        WeightFormat::F32 => elements.saturating_mul(4),
        WeightFormat::F16 => elements.saturating_mul(2),
        WeightFormat::Quant(q) => {
            let bv = q.block_values() as u64;
            let widened = if q.is_k() { 4 } else { 0 };
            elements.div_ceil(bv).saturating_mul(q.block_bytes() as u64 + widened)
        }
    }
}

fn elements(shape: &[usize]) -> u64 {
    shape.iter().fold(1u64, |a, &d| a.saturating_mul(d as u64))
}

/// Bytes of the activation buffers of one sequence state (x, normed, q/k/v, attention, MLP, logits,
/// ids, rope table, attention scratch: `Qwen3Model::new_state`), saturating.
fn scratch_bytes(c: &Qwen3Config, slots: u64) -> u64 {
    let s = |a: u64, b: u64| a.saturating_mul(b);
    let (h, inter, v) = (c.hidden_size as u64, c.intermediate_size as u64, c.vocab_size as u64);
    let (qw, kvw) = (s(c.num_heads as u64, c.head_dim as u64), s(c.num_kv_heads as u64, c.head_dim as u64));
    let widths = [h, h, qw.saturating_add(s(2, kvw)), qw, qw, kvw, qw, inter].iter().fold(0u64, |a, &w| a.saturating_add(w));
    let rows = s(s(MAX_ROWS as u64, widths), 4);
    let logits = s(s(MAX_LOGIT_ROWS as u64, v), 4);
    let rope = s(s(slots, c.head_dim as u64), 4);
    // Attention partials and stats: as many rows as fit 32 MiB (at least one, at most MAX_ROWS).
    let chunks = slots.div_ceil(domino_engine::kernels::ATTENTION_CHUNK as u64);
    let per_row = s(s(c.num_heads as u64, chunks), s(c.head_dim as u64, 4).saturating_add(8));
    let attention = s(((32u64 << 20) / per_row.max(1)).clamp(1, MAX_ROWS as u64), per_row);
    rows.saturating_add(logits).saturating_add(rope).saturating_add(s(slots, 4)).saturating_add(attention)
}

/// Check `req` against `limits` before uploading anything. Errors name the need, the limit and
/// the option to change.
pub fn check_memory(req: &MemoryRequest, limits: &MemoryLimits) -> Result<MemoryPlan> {
    let c = req.config;
    if req.context > c.max_position_embeddings {
        return Err(RuntimeError::Memory(format!(
            "a context of {} positions exceeds the model's max_position_embeddings {}: lower --context",
            req.context, c.max_position_embeddings
        )));
    }
    let mut weights = 0u64;
    for (name, shape) in c.tensor_plan() {
        // The shapes are checked here too (from the headers), so a wrong file fails with the tensor
        // it is wrong about rather than with a size computed from the config.
        let len = domino_models::checkpoint::expect_shape(req.weights, &name, &shape)?;
        let n = elements(&shape);
        let bytes = if shape.len() == 1 { n.saturating_mul(4) } else { format_bytes(req.dtype.format_for(stored_dtype(n, len)), n) };
        weights = weights.saturating_add(bytes);
    }
    // A speculative session keeps a block plus one extra slot past the context (SpeculativeSession::new).
    let slots = match req.drafter {
        Some((d, _)) => (req.context as u64).saturating_add(d.block_size as u64 + 1),
        None => req.context as u64,
    };
    let kv_width = (c.num_kv_heads as u64).saturating_mul(c.head_dim as u64);
    let kv_layer = slots.saturating_mul(kv_width).saturating_mul(4);
    let kv_cache = kv_layer.saturating_mul(2 * c.num_layers as u64).saturating_mul(req.sequences.max(1) as u64);
    let mut largest = (kv_layer, format!("the KV cache of one layer for {} positions", req.context));
    // Attention partials of one row (the scratch shrinks to fewer rows, never below one).
    let chunks = slots.div_ceil(domino_engine::kernels::ATTENTION_CHUNK as u64);
    let partials = chunks.saturating_mul(c.num_heads as u64).saturating_mul(c.head_dim as u64).saturating_mul(4);
    if partials > largest.0 {
        largest = (partials, format!("the attention scratch of one row for {} positions", req.context));
    }
    let logits = (c.vocab_size as u64).saturating_mul(MAX_LOGIT_ROWS as u64 * 4);
    if logits > largest.0 {
        largest = (logits, format!("the logits of {MAX_LOGIT_ROWS} rows of a {}-token vocabulary", c.vocab_size));
    }
    let (mut drafter_weights, mut drafter_kv_cache) = (0u64, 0u64);
    if let Some((d, format)) = req.drafter {
        for (_, shape) in domino_models::drafter::drafter_tensor_plan(d, c) {
            let n = elements(&shape);
            drafter_weights = drafter_weights.saturating_add(if shape.len() == 1 { n.saturating_mul(4) } else { format_bytes(format, n) });
        }
        let d_partials = chunks.saturating_mul(d.block_size as u64).saturating_mul(d.q_width() as u64).saturating_mul(4);
        if d_partials > largest.0 {
            largest = (d_partials, format!("the drafter's attention scratch for {} positions", req.context));
        }
        let d_layer = slots.saturating_mul(d.kv_width() as u64).saturating_mul(4);
        drafter_kv_cache = d_layer.saturating_mul(2 * d.num_layers as u64);
        if d_layer > largest.0 {
            largest = (d_layer, format!("the drafter's KV cache of one layer for {} positions", req.context));
        }
    }
    let scratch = scratch_bytes(c, slots);
    let total = [weights, kv_cache, drafter_weights, drafter_kv_cache, scratch].iter().fold(0u64, |a, &b| a.saturating_add(b));
    let plan = MemoryPlan {
        context: req.context,
        weights,
        kv_cache,
        drafter_weights,
        drafter_kv_cache,
        scratch,
        total,
        largest_binding: largest.0,
        largest_binding_what: largest.1,
    };
    let bind_limit = limits.max_storage_binding.min(limits.max_buffer);
    if plan.largest_binding > bind_limit {
        let name = if limits.max_storage_binding <= limits.max_buffer { "max_storage_buffer_binding_size" } else { "max_buffer_size" };
        return Err(RuntimeError::Memory(format!(
            "{} needs {} but adapter '{}' binds at most {} ({name}): lower --context (now {})",
            plan.largest_binding_what,
            human_bytes(plan.largest_binding),
            limits.adapter,
            human_bytes(bind_limit),
            req.context
        )));
    }
    if let Some(budget) = limits.budget {
        if plan.total > budget {
            let drafter = if req.drafter.is_some() {
                format!(", drafter {} + its KV cache {}", human_bytes(drafter_weights), human_bytes(drafter_kv_cache))
            } else {
                String::new()
            };
            return Err(RuntimeError::Memory(format!(
                "the model needs {} (weights {}, KV cache for {} {}{drafter}, scratch {}) but adapter '{}' has a memory budget of {}: lower --context{} or use a smaller --dtype (q8_0, q4_0)",
                human_bytes(total),
                human_bytes(weights),
                if req.sequences > 1 { format!("{} sequences of {} positions", req.sequences, req.context) } else { format!("{} positions", req.context) },
                human_bytes(kv_cache),
                human_bytes(scratch),
                limits.adapter,
                human_bytes(budget),
                if req.sequences > 1 { " or --max-batch" } else { "" }
            )));
        }
    }
    Ok(plan)
}
