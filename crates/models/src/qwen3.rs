//! The Qwen3 target on the GPU (and the Llama family: the same layer without q_norm / k_norm).
//!
//! A forward is recorded into a `Step`, never submitted here: the runtime decides what goes into one
//! submission (a decode step, a verify pass, a whole prefill) and reads back only token ids.

use crate::checkpoint::{expect_shape, expect_tensor, RawTensor, WeightSource};
use crate::config::Qwen3Config;
use crate::error::Result;
use domino_engine::kernels::{self, AttentionScratch, AttentionShape, NormInput, SamplingConfig};
use domino_engine::{DTypeChoice, Epilogue, Gpu, GpuBuffer, HostTensor, Matrix, Rows, Step, WeightFormat};
use std::sync::Arc;

/// The attention's input projections: three matrices, or one fused `[q | k | v]` matrix (the target,
/// when the three share a storage format: one matmul and one rope pass instead of three and two).
pub enum QkvWeights {
    Separate { q: Matrix, k: Matrix, v: Matrix },
    Fused(Matrix),
}

impl QkvWeights {
    pub fn bytes(&self) -> u64 {
        match self {
            Self::Separate { q, k, v } => q.bytes() + k.bytes() + v.bytes(),
            Self::Fused(m) => m.bytes(),
        }
    }
}

pub struct LayerWeights {
    pub input_norm: Arc<GpuBuffer>,
    pub qkv: QkvWeights,
    pub o: Matrix,
    pub q_norm: Option<Arc<GpuBuffer>>,
    pub k_norm: Option<Arc<GpuBuffer>>,
    pub post_norm: Arc<GpuBuffer>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// The buffers one decoder layer reads and writes (the target's and the drafter's states both hold them).
pub struct LayerIo<'a> {
    /// Prefix of the dispatch labels `domino plan` shows ("layer 3").
    pub label: &'a str,
    pub x: &'a Arc<GpuBuffer>,
    /// The fused projection's output rows (needed with `QkvWeights::Fused`).
    pub qkv: Option<&'a Arc<GpuBuffer>>,
    pub a: &'a Arc<GpuBuffer>,
    pub q_raw: &'a Arc<GpuBuffer>,
    pub q: &'a Arc<GpuBuffer>,
    pub k_raw: &'a Arc<GpuBuffer>,
    pub att: &'a Arc<GpuBuffer>,
    pub mlp: &'a Arc<GpuBuffer>,
    pub k_cache: &'a Arc<GpuBuffer>,
    pub v_cache: &'a Arc<GpuBuffer>,
    pub rope: &'a Arc<GpuBuffer>,
    pub scratch: &'a AttentionScratch,
}

/// Widths of one decoder layer.
#[derive(Debug, Clone, Copy)]
pub struct LayerDims {
    pub hidden: u32,
    pub intermediate: u32,
    pub attention: AttentionShape,
    pub eps: f32,
}

/// One `[q | k | v]` matrix from three tensors of one dtype (their rows concatenated).
fn qkv_fused(names: &[String; 3], t: &[RawTensor<'_>; 3], rows: usize, cols: usize, upload: &mut dyn FnMut(&str, &RawTensor<'_>) -> Result<Matrix>) -> Result<QkvWeights> {
    let mut data = Vec::with_capacity(t.iter().map(|t| t.data.len()).sum());
    for part in t {
        data.extend_from_slice(&part.data);
    }
    let name = names[0].replace("q_proj", "qkv_proj (fused q/k/v)");
    let shape = [rows, cols];
    let fused = RawTensor { dtype: t[0].dtype, shape: &shape, data: std::borrow::Cow::Owned(data), file: t[0].file };
    Ok(QkvWeights::Fused(upload(&name, &fused)?))
}

impl LayerWeights {
    /// Bytes of the layer's matrices (what one decode step reads of them).
    pub fn matrix_bytes(&self) -> u64 {
        self.qkv.bytes() + self.o.bytes() + self.gate.bytes() + self.up.bytes() + self.down.bytes()
    }

    /// Record one Qwen3 decoder layer over `rows` rows at positions pos..: K/V are written into the
    /// cache at those positions, then attention over `kv_len` keys (causal: row r sees kv_len + r + 1;
    /// unmasked: all kv_len, the drafter's [context ++ block]).
    #[allow(clippy::too_many_arguments)]
    pub fn record(&self, step: &mut Step, io: &LayerIo, d: &LayerDims, rows: u32, pos: u32, kv_len: u32, causal: bool) -> Result<()> {
        let sh = d.attention;
        let (h, qw, kvw) = (d.hidden, sh.n_heads * sh.head_dim, sh.n_kv_heads * sh.head_dim);
        let x = Rows::new(io.x, 0, h);
        let a = Rows::new(io.a, 0, h);
        let label = |step: &mut Step, what: &str| step.set_label(&format!("{} {what}", io.label));
        let q_rows = Rows::new(io.q, 0, qw);
        label(step, "q/k/v");
        match &self.qkv {
            QkvWeights::Fused(qkv) => {
                let buf = io.qkv.ok_or_else(|| domino_engine::EngineError::Gpu("a fused q/k/v layer needs a qkv buffer".into()))?;
                let qkv_rows = Rows::new(buf, 0, qw + 2 * kvw);
                let norm = NormInput { weight: &self.input_norm, eps: d.eps, scratch: a.clone() };
                kernels::matmul_normed(step, qkv, &norm, &x, &qkv_rows, rows, Epilogue::Store)?;
                label(step, "q/k norm + rope");
                let norms = self.q_norm.as_ref().zip(self.k_norm.as_ref());
                let rope = kernels::QkvRope { qkv: &qkv_rows, q: &q_rows, k_cache: io.k_cache, v_cache: io.v_cache, norms, rope_table: io.rope };
                kernels::qkv_rope(step, &rope, sh, rows, pos, d.eps)?;
            }
            QkvWeights::Separate { q, k, v } => {
                kernels::rmsnorm(step, &self.input_norm, h, d.eps, &x, &a, rows)?;
                kernels::matmul(step, q, &a, &Rows::new(io.q_raw, 0, qw), rows, Epilogue::Store)?;
                kernels::matmul(step, k, &a, &Rows::new(io.k_raw, 0, kvw), rows, Epilogue::Store)?;
                kernels::matmul(step, v, &a, &Rows::new(io.v_cache, pos * kvw, kvw), rows, Epilogue::Store)?;
                label(step, "q/k norm + rope");
                kernels::norm_rope(step, &Rows::new(io.q_raw, 0, qw), &q_rows, self.q_norm.as_ref(), io.rope, rows, sh.n_heads, sh.head_dim, pos, d.eps)?;
                let k_dst = Rows::new(io.k_cache, pos * kvw, kvw);
                kernels::norm_rope(step, &Rows::new(io.k_raw, 0, kvw), &k_dst, self.k_norm.as_ref(), io.rope, rows, sh.n_kv_heads, sh.head_dim, pos, d.eps)?;
            }
        }
        label(step, "attention");
        kernels::attention(step, sh, &q_rows, io.k_cache, io.v_cache, &Rows::new(io.att, 0, qw), io.scratch, rows, kv_len, causal)?;
        label(step, "o_proj + residual");
        kernels::matmul(step, &self.o, &Rows::new(io.att, 0, qw), &x, rows, Epilogue::Accumulate)?;
        label(step, "gate/up");
        let norm = NormInput { weight: &self.post_norm, eps: d.eps, scratch: a.clone() };
        kernels::matmul_glu_normed(step, &self.gate, &self.up, &norm, &x, &Rows::new(io.mlp, 0, d.intermediate), rows)?;
        label(step, "down + residual");
        kernels::matmul(step, &self.down, &Rows::new(io.mlp, 0, d.intermediate), &x, rows, Epilogue::Accumulate)?;
        Ok(())
    }
}

pub struct Qwen3Model {
    pub gpu: Arc<Gpu>,
    pub config: Qwen3Config,
    pub format: WeightFormat,
    /// The embedding as a `[hidden -> vocab]` matrix; it is also the lm_head when tied.
    pub embed: Matrix,
    lm_head: Option<Matrix>,
    pub layers: Vec<LayerWeights>,
    pub norm: Arc<GpuBuffer>,
}

/// Loading progress: (bytes done, bytes total, tensor name).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64, &str);

fn host<'a>(name: &'a str, t: &'a RawTensor<'_>) -> Result<HostTensor<'a>> {
    let (rows, cols) = match t.shape {
        [n] => (1, *n),
        [r, c] => (*r, *c),
        _ => (t.shape.iter().product(), 1),
    };
    Ok(HostTensor::new(name, t.dtype, rows, cols, &t.data)?)
}

impl Qwen3Model {
    /// Load and upload every weight, validating names and shapes against `config`.
    pub fn load(gpu: Arc<Gpu>, config: Qwen3Config, src: &dyn WeightSource, format: WeightFormat, progress: Progress) -> Result<Self> {
        Self::load_with(gpu, config, src, DTypeChoice::Format(format), progress)
    }

    /// As `load`, with `DTypeChoice::AsStored` keeping quantized tensors (GGUF) quantized.
    pub fn load_with(gpu: Arc<Gpu>, config: Qwen3Config, src: &dyn WeightSource, dtype: DTypeChoice, progress: Progress) -> Result<Self> {
        let c = &config;
        let (h, qw, kvw, inter, v) = (c.hidden_size, c.q_width(), c.kv_width(), c.intermediate_size, c.vocab_size);
        let untied = !c.tie_word_embeddings;
        // Plan: every tensor with its expected shape, so totals are known and shapes checked up front.
        let plan = c.tensor_plan();
        let mut total = 0u64;
        for (name, shape) in &plan {
            total += expect_shape(src, name, shape)?;
        }

        let scope = gpu.begin_allocation_check();
        let mut done = 0u64;
        let mut formats = Vec::new();
        let mut mat_from = |name: &str, t: &RawTensor<'_>| -> Result<Matrix> {
            let format = dtype.format_for(t.dtype);
            formats.push(format);
            let m = Matrix::upload(&gpu, &host(name, t)?, format, &mut |b| {
                done += b;
                progress(done, total, name);
            })?;
            Ok(m)
        };
        let embed = mat_from("model.embed_tokens.weight", &expect_tensor(src, "model.embed_tokens.weight", &[v, h])?)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}.");
            let vecw = |name: &str, n: usize| -> Result<Arc<GpuBuffer>> {
                let full = p.clone() + name;
                let t = expect_tensor(src, &full, &[n])?;
                Ok(domino_engine::tensor::upload_vector(&gpu, &host(&full, &t)?)?)
            };
            let input_norm = vecw("input_layernorm.weight", h)?;
            let (q_norm, k_norm) =
                if c.qk_norm { (Some(vecw("self_attn.q_norm.weight", c.head_dim)?), Some(vecw("self_attn.k_norm.weight", c.head_dim)?)) } else { (None, None) };
            let post_norm = vecw("post_attention_layernorm.weight", h)?;
            let qkv = {
                let names = ["q_proj", "k_proj", "v_proj"].map(|n| format!("{p}self_attn.{n}.weight"));
                let t = [expect_tensor(src, &names[0], &[qw, h])?, expect_tensor(src, &names[1], &[kvw, h])?, expect_tensor(src, &names[2], &[kvw, h])?];
                if t.iter().all(|x| x.dtype == t[0].dtype) {
                    qkv_fused(&names, &t, qw + 2 * kvw, h, &mut mat_from)?
                } else {
                    QkvWeights::Separate { q: mat_from(&names[0], &t[0])?, k: mat_from(&names[1], &t[1])?, v: mat_from(&names[2], &t[2])? }
                }
            };
            layers.push(LayerWeights {
                input_norm,
                qkv,
                o: { let n = p.clone() + "self_attn.o_proj.weight"; mat_from(&n, &expect_tensor(src, &n, &[h, qw])?)? },
                q_norm,
                k_norm,
                post_norm,
                gate: { let n = p.clone() + "mlp.gate_proj.weight"; mat_from(&n, &expect_tensor(src, &n, &[inter, h])?)? },
                up: { let n = p.clone() + "mlp.up_proj.weight"; mat_from(&n, &expect_tensor(src, &n, &[inter, h])?)? },
                down: { let n = p.clone() + "mlp.down_proj.weight"; mat_from(&n, &expect_tensor(src, &n, &[h, inter])?)? },
            });
        }
        let lm_head = if untied { Some(mat_from("lm_head.weight", &expect_tensor(src, "lm_head.weight", &[v, h])?)?) } else { None };
        let t = expect_tensor(src, "model.norm.weight", &[h])?;
        let norm = domino_engine::tensor::upload_vector(&gpu, &host("model.norm.weight", &t)?)?;
        gpu.end_allocation_check(scope, "the model weights")?;
        // Reported as the format of the layers' matrices (the embedding may differ, as in GGUF files).
        let format = formats.get(1).or(formats.first()).copied().unwrap_or(WeightFormat::F16);
        Ok(Self { gpu, config, format, embed, lm_head, layers, norm })
    }

    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of weights one decode step reads (every matrix but the gathered embedding rows).
    pub fn decode_weight_bytes(&self) -> u64 {
        let layers: u64 = self.layers.iter().map(LayerWeights::matrix_bytes).sum();
        layers + self.lm_head().bytes()
    }

    pub fn layer_dims(&self) -> LayerDims {
        let c = &self.config;
        LayerDims { hidden: c.hidden_size as u32, intermediate: c.intermediate_size as u32, attention: self.attention_shape(), eps: c.rms_norm_eps }
    }

    pub fn attention_shape(&self) -> AttentionShape {
        AttentionShape { n_heads: self.config.num_heads as u32, n_kv_heads: self.config.num_kv_heads as u32, head_dim: self.config.head_dim as u32 }
    }

    /// GPU state of one sequence: KV cache for `capacity` positions and activations for `max_rows`
    /// rows per pass, `max_logit_rows` rows of logits.
    pub fn new_state(&self, capacity: usize, max_rows: usize, max_logit_rows: usize) -> Result<ForwardState> {
        let gpu = &self.gpu;
        let c = &self.config;
        let scope = gpu.begin_allocation_check();
        let kv_bytes = (capacity * c.kv_width() * 4) as u64;
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for l in 0..c.num_layers {
            k_cache.push(gpu.binding_buffer(&format!("KV cache (K, layer {l}, {capacity} positions)"), kv_bytes)?);
            v_cache.push(gpu.binding_buffer(&format!("KV cache (V, layer {l}, {capacity} positions)"), kv_bytes)?);
        }
        let shape = self.attention_shape();
        let chunks = capacity.div_ceil(kernels::ATTENTION_CHUNK as usize) as u64;
        let per_row = shape.n_heads as u64 * chunks * shape.head_dim as u64 * 4;
        // At most 32 MiB, and one storage binding: passes of fewer rows share a smaller scratch.
        let scratch_budget = (32u64 << 20).min(gpu.caps.max_storage_binding);
        let scratch_rows = (scratch_budget / per_row.max(1)).clamp(1, max_rows as u64) as u32;
        let scratch = AttentionScratch::new(gpu, shape, scratch_rows, capacity as u32)?;
        let f = |name: &str, width: usize, rows: usize| gpu.activation_buffer(name, (rows * width * 4) as u64);
        let state = ForwardState {
            rope: kernels::rope_table(gpu, capacity, c.head_dim, c.rope_theta)?,
            scratch,
            x: f("x", c.hidden_size, max_rows)?,
            a: f("normed", c.hidden_size, max_rows)?,
            qkv: f("q/k/v (projected)", c.q_width() + 2 * c.kv_width(), max_rows)?,
            q_raw: f("q (projected)", c.q_width(), max_rows)?,
            q: f("q (rotated)", c.q_width(), max_rows)?,
            k_raw: f("k (projected)", c.kv_width(), max_rows)?,
            att: f("attention out", c.q_width(), max_rows)?,
            mlp: f("mlp", c.intermediate_size, max_rows)?,
            logits: f("logits", c.vocab_size, max_logit_rows)?,
            ids: gpu.binding_buffer("token ids", (capacity * 4) as u64)?,
            out_ids: gpu.binding_buffer("sampled ids", (max_logit_rows.max(1) * 4) as u64)?,
            k_cache,
            v_cache,
            capacity,
            max_rows,
            max_logit_rows,
        };
        gpu.end_allocation_check(scope, &format!("a KV cache of {capacity} positions"))?;
        Ok(state)
    }

    /// Record a forward over rows at positions [pos0, pos0 + n_rows) whose token ids are already in
    /// `state.ids` at those positions. K/V are written into the cache; logits are computed for rows
    /// [logits_from, n_rows) into `state.logits` rows 0...
    pub fn record_forward(&self, step: &mut Step, state: &ForwardState, fwd: &Forward) -> Result<()> {
        let c = &self.config;
        let h = c.hidden_size as u32;
        let eps = c.rms_norm_eps;
        let n_logits = fwd.n_rows.saturating_sub(fwd.logits_from);
        if n_logits as usize > state.max_logit_rows || (fwd.pos0 + fwd.n_rows) as usize > state.capacity {
            return Err(domino_engine::EngineError::Gpu(format!(
                "forward of {} rows at position {} exceeds the session state ({} positions, {} logit rows)",
                fwd.n_rows, fwd.pos0, state.capacity, state.max_logit_rows
            ))
            .into());
        }
        let x = Rows::new(&state.x, 0, h);
        let a = Rows::new(&state.a, 0, h);
        let mut r0 = 0;
        while r0 < fwd.n_rows {
            let nb = (fwd.n_rows - r0).min(state.max_rows as u32);
            let pos = fwd.pos0 + r0;
            step.set_label("embedding");
            kernels::embedding(step, &self.embed, &state.ids, pos, &x, nb)?;
            for (li, l) in self.layers.iter().enumerate() {
                let label = format!("layer {li}");
                let io = LayerIo {
                    label: &label,
                    qkv: Some(&state.qkv),
                    x: &state.x,
                    a: &state.a,
                    q_raw: &state.q_raw,
                    q: &state.q,
                    k_raw: &state.k_raw,
                    att: &state.att,
                    mlp: &state.mlp,
                    k_cache: &state.k_cache[li],
                    v_cache: &state.v_cache[li],
                    rope: &state.rope,
                    scratch: &state.scratch,
                };
                // Causal: row r sees the cache up to its own position.
                l.record(step, &io, &self.layer_dims(), nb, pos, pos, true)?;
                if let Some(cap) = &fwd.capture {
                    if let Some(slot) = cap.layers.iter().position(|&c| c == li) {
                        let width = cap.layers.len() as u32 * h;
                        let dst = Rows::new(cap.dst, (cap.dst_row + r0) * width + slot as u32 * h, width);
                        step.set_label(&format!("layer {li} feature capture"));
                        kernels::copy_rows(step, &x, &dst, h, nb)?;
                    }
                }
            }
            // Final norm + lm_head for the rows of this sub-batch that need logits.
            let s = fwd.logits_from.max(r0);
            let e = r0 + nb;
            if s < e {
                let local = s - r0;
                let v = c.vocab_size as u32;
                step.set_label("final norm + lm_head");
                let logits = Rows::new(&state.logits, (s - fwd.logits_from) * v, v);
                let head = self.lm_head();
                if head.row_major {
                    kernels::matmul_normed(step, head, &NormInput { weight: &self.norm, eps, scratch: a.skip(local) }, &x.skip(local), &logits, e - s, Epilogue::Store)?;
                } else {
                    // CPU family: a folded norm costs each invocation k extra fma (1/16 of its matmul
                    // work), which on the vocabulary-wide lm_head outweighs one rmsnorm dispatch.
                    kernels::rmsnorm(step, &self.norm, h, eps, &x.skip(local), &a, e - s)?;
                    kernels::matmul(step, head, &a, &logits, e - s, Epilogue::Store)?;
                }
            }
            r0 += nb;
        }
        Ok(())
    }

    /// Record sampling of logits rows [0, n) into out[out_offset..out_offset + n]. Sampling straight
    /// into `state.ids` at the next position keeps the decode loop on the GPU.
    #[allow(clippy::too_many_arguments)]
    pub fn record_sample(&self, step: &mut Step, state: &ForwardState, n: u32, cfg: &SamplingConfig, counter: u32, out: &Arc<GpuBuffer>, out_offset: u32) -> Result<()> {
        let v = self.config.vocab_size as u32;
        step.set_label("sampling");
        kernels::sample(step, &Rows::new(&state.logits, 0, v), v, n, out, out_offset, cfg, counter)?;
        Ok(())
    }
}

/// Capture the residual stream after `layers` into `dst`, row-major `[row][layers.len() * hidden]`,
/// forward row r going to dst row dst_row + r.
pub struct Capture<'a> {
    pub layers: &'a [usize],
    pub dst: &'a Arc<GpuBuffer>,
    pub dst_row: u32,
}

pub struct Forward<'a> {
    pub pos0: u32,
    pub n_rows: u32,
    pub logits_from: u32,
    pub capture: Option<Capture<'a>>,
}

/// Per-sequence GPU state: the KV cache (a length reset is a rollback), activations, logits, ids.
pub struct ForwardState {
    pub k_cache: Vec<Arc<GpuBuffer>>,
    pub v_cache: Vec<Arc<GpuBuffer>>,
    pub rope: Arc<GpuBuffer>,
    pub scratch: AttentionScratch,
    pub x: Arc<GpuBuffer>,
    pub a: Arc<GpuBuffer>,
    pub qkv: Arc<GpuBuffer>,
    pub q_raw: Arc<GpuBuffer>,
    pub q: Arc<GpuBuffer>,
    pub k_raw: Arc<GpuBuffer>,
    pub att: Arc<GpuBuffer>,
    pub mlp: Arc<GpuBuffer>,
    pub logits: Arc<GpuBuffer>,
    /// Token id of every position (row r of a forward reads ids[pos0 + r]).
    pub ids: Arc<GpuBuffer>,
    pub out_ids: Arc<GpuBuffer>,
    pub capacity: usize,
    pub max_rows: usize,
    pub max_logit_rows: usize,
}
