//! The target model on the CPU, for self-distillation (`domino train data --device cpu`): a batched
//! forward with a KV cache per sequence, f32 weights (quantized files dequantized as read), and every
//! matmul one native GEMM over all rows of a step (the `gemm` crate, output columns split across the
//! cores). On a machine whose only adapter is a CPU rasterizer this decodes many prompts about ten
//! times faster than the engine's multi-row kernels can, which is what makes a 150k-token data set
//! fit in a session. Greedy tokens and features are checked against `ReferenceModel` (f64) and the
//! GPU path (`tests/cpu_data.rs`); sums run in another order than the GPU's, so a near-tie between
//! two logits may resolve differently: the data is the target's greedy text up to float rounding.

use crate::error::{Result, TrainError};
use crate::weights::read_f32;
use domino_engine::kernels::rope_table_values;
use domino_engine::reference::{argmax, silu};
use domino_models::checkpoint::WeightSource;
use domino_models::Qwen3Config;

struct Layer {
    input_norm: Vec<f32>,
    /// q, k and v stacked: `[q_width + 2 kv_width][hidden]`, one GEMM for the three.
    qkv: Vec<f32>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: Vec<f32>,
    post_norm: Vec<f32>,
    /// gate and up stacked: `[2 intermediate][hidden]`.
    gate_up: Vec<f32>,
    down: Vec<f32>,
}

pub struct CpuTarget {
    pub config: Qwen3Config,
    embed: Vec<f32>,
    lm_head: Option<Vec<f32>>,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    threads: usize,
}

/// One sequence's keys and values, per layer `[capacity][kv_width]`.
pub struct KvCache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    capacity: usize,
}

/// One row of a step: `token` at position `pos` of sequence `seq` (an index into the caches).
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub seq: usize,
    pub pos: usize,
    pub token: u32,
    /// Whether this row's greedy next token is wanted (the lm_head runs only for these rows).
    pub logits: bool,
}

/// What one step gives back: the residual stream after each capture layer for every row
/// `[rows][layers · hidden]`, and the greedy next token of each row that asked for logits, in row order.
pub struct StepOutput {
    pub features: Vec<f32>,
    pub next_tokens: Vec<u32>,
}

impl CpuTarget {
    /// Load the target's weights as f32 (shape-checked, by Hugging Face name).
    pub fn load(config: Qwen3Config, src: &dyn WeightSource) -> Result<Self> {
        let c = &config;
        let (h, qw, kvw, i, vocab) = (c.hidden_size, c.q_width(), c.kv_width(), c.intermediate_size, c.vocab_size);
        // Refuse before reading: an 8B target would need 32 GB of f32 weights.
        let per_layer = (qw + 2 * kvw) * h + h * qw + 3 * i * h + 2 * h + 2 * c.head_dim;
        let heads = if c.tie_word_embeddings { 1 } else { 2 };
        let bytes = 4 * (c.num_layers * per_layer + heads * vocab * h + h) as u64;
        if let Some(free) = domino_engine::host_available_memory().filter(|&free| bytes > free) {
            return Err(TrainError::Invalid(format!(
                "the target needs {:.1} GB of f32 weights on the CPU but only {:.1} GB of memory is available: use --device gpu",
                bytes as f64 / 1e9,
                free as f64 / 1e9
            )));
        }
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in 0..c.num_layers {
            let get = |n: &str, s: &[usize]| read_f32(src, &format!("model.layers.{l}.{n}"), s);
            let mut qkv = get("self_attn.q_proj.weight", &[qw, h])?;
            qkv.extend(get("self_attn.k_proj.weight", &[kvw, h])?);
            qkv.extend(get("self_attn.v_proj.weight", &[kvw, h])?);
            let mut gate_up = get("mlp.gate_proj.weight", &[i, h])?;
            gate_up.extend(get("mlp.up_proj.weight", &[i, h])?);
            let head_norm = |n: &str| if c.qk_norm { get(n, &[c.head_dim]).map(Some) } else { Ok(None) };
            layers.push(Layer {
                input_norm: get("input_layernorm.weight", &[h])?,
                qkv,
                q_norm: head_norm("self_attn.q_norm.weight")?,
                k_norm: head_norm("self_attn.k_norm.weight")?,
                o: get("self_attn.o_proj.weight", &[h, qw])?,
                post_norm: get("post_attention_layernorm.weight", &[h])?,
                gate_up,
                down: get("mlp.down_proj.weight", &[h, i])?,
            });
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            embed: read_f32(src, "model.embed_tokens.weight", &[vocab, h])?,
            lm_head: if c.tie_word_embeddings { None } else { Some(read_f32(src, "lm_head.weight", &[vocab, h])?) },
            norm: read_f32(src, "model.norm.weight", &[h])?,
            layers,
            config,
            threads,
        })
    }

    /// An empty cache for a sequence of up to `capacity` positions.
    pub fn new_cache(&self, capacity: usize) -> KvCache {
        let n = capacity * self.config.kv_width();
        let layers = self.config.num_layers;
        KvCache { k: vec![vec![0.0; n]; layers], v: vec![vec![0.0; n]; layers], capacity }
    }

    /// One forward over `rows` (any mix of sequences and positions; a sequence's rows in increasing
    /// position, its earlier positions already in its cache), writing each row's keys and values
    /// into its sequence's cache. `capture` lists the layers whose output is returned.
    pub fn step(&self, rows: &[Row], caches: &mut [KvCache], capture: &[usize]) -> Result<StepOutput> {
        let h = self.config.hidden_size;
        self.check_rows(rows, caches)?;
        let x: Vec<f32> = rows.iter().flat_map(|r| self.embed[r.token as usize * h..][..h].iter().copied()).collect();
        let (x, features) = self.layers_from(0, x, rows, caches, capture);
        let next_tokens = self.head_logits(&x, rows).chunks_exact(self.config.vocab_size.max(1)).map(argmax).collect();
        Ok(StepOutput { features, next_tokens })
    }

    /// The final logits `[wanted rows][vocab]` of the rows that ask for logits, starting from the
    /// residual stream `x` `[rows][hidden]` after layer `after_layer` (Hugging Face
    /// `hidden_states[after_layer + 1]`): the remaining layers, the final norm and the lm_head.
    /// This is how soft labels come from stored features without decoding again.
    pub fn logits_after_layer(&self, after_layer: usize, x: Vec<f32>, rows: &[Row], caches: &mut [KvCache]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        if after_layer >= self.config.num_layers {
            return Err(TrainError::Invalid(format!("layer {after_layer} is past the target's {} layers", self.config.num_layers)));
        }
        if x.len() != rows.len() * h {
            return Err(TrainError::Invalid(format!("{} residual values for {} rows of width {h}", x.len(), rows.len())));
        }
        self.check_rows(rows, caches)?;
        let (x, _) = self.layers_from(after_layer + 1, x, rows, caches, &[]);
        Ok(self.head_logits(&x, rows))
    }

    fn check_rows(&self, rows: &[Row], caches: &[KvCache]) -> Result<()> {
        let c = &self.config;
        for r in rows {
            let cache = caches.get(r.seq).ok_or_else(|| TrainError::Invalid(format!("row of unknown sequence {}", r.seq)))?;
            if r.pos >= cache.capacity {
                return Err(TrainError::Invalid(format!("position {} is past the cache's {} positions", r.pos, cache.capacity)));
            }
            if r.token as usize >= c.vocab_size {
                return Err(TrainError::Invalid(format!("token id {} is outside the vocabulary ({})", r.token, c.vocab_size)));
            }
        }
        Ok(())
    }

    /// Layers `first..` over the residual stream `x` `[rows][hidden]`; returns the stream after the
    /// last layer and the captured layers' outputs `[rows][capture.len() · hidden]`.
    fn layers_from(&self, first: usize, mut x: Vec<f32>, rows: &[Row], caches: &mut [KvCache], capture: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let c = &self.config;
        let (h, d, m) = (c.hidden_size, c.head_dim, rows.len());
        let (qw, kvw) = (c.q_width(), c.kv_width());
        let max_pos = rows.iter().map(|r| r.pos + 1).max().unwrap_or(0);
        let rope = rope_table_values(max_pos, d, c.rope_theta);
        let width = capture.len() * h;
        let mut features = vec![0f32; m * width];
        for (l, layer) in self.layers.iter().enumerate().skip(first) {
            let a = rmsnorm(&x, &layer.input_norm, c.rms_norm_eps);
            let mut qkv = self.matmul(&a, &layer.qkv, m, h, qw + 2 * kvw);
            for (r, row) in rows.iter().enumerate() {
                let line = &mut qkv[r * (qw + 2 * kvw)..][..qw + 2 * kvw];
                let (q, kv) = line.split_at_mut(qw);
                let (k, v) = kv.split_at_mut(kvw);
                norm_rope(q, layer.q_norm.as_deref(), d, row.pos, &rope, c.rms_norm_eps);
                norm_rope(k, layer.k_norm.as_deref(), d, row.pos, &rope, c.rms_norm_eps);
                let cache = &mut caches[row.seq];
                cache.k[l][row.pos * kvw..][..kvw].copy_from_slice(k);
                cache.v[l][row.pos * kvw..][..kvw].copy_from_slice(v);
            }
            let att = self.attention(&qkv, rows, caches, l);
            let o = self.matmul(&att, &layer.o, m, qw, h);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let b = rmsnorm(&x, &layer.post_norm, c.rms_norm_eps);
            let i = c.intermediate_size;
            let gu = self.matmul(&b, &layer.gate_up, m, h, 2 * i);
            let act: Vec<f32> = gu.chunks_exact(2 * i).flat_map(|g| g[..i].iter().zip(&g[i..]).map(|(g, u)| silu(*g) * u)).collect();
            let dn = self.matmul(&act, &layer.down, m, i, h);
            x.iter_mut().zip(&dn).for_each(|(a, b)| *a += b);
            for (slot, _) in capture.iter().enumerate().filter(|(_, &c)| c == l) {
                for r in 0..m {
                    features[r * width + slot * h..][..h].copy_from_slice(&x[r * h..][..h]);
                }
            }
        }
        (x, features)
    }

    /// Final norm and lm_head over the rows that ask for logits: `[wanted rows][vocab]`.
    fn head_logits(&self, x: &[f32], rows: &[Row]) -> Vec<f32> {
        let c = &self.config;
        let h = c.hidden_size;
        let wanted: Vec<usize> = (0..rows.len()).filter(|&r| rows[r].logits).collect();
        let y: Vec<f32> = wanted.iter().flat_map(|&r| x[r * h..][..h].iter().copied()).collect();
        let y = rmsnorm(&y, &self.norm, c.rms_norm_eps);
        let head = self.lm_head.as_deref().unwrap_or(&self.embed);
        self.matmul(&y, head, wanted.len(), h, c.vocab_size)
    }

    /// Causal attention of every row over its own sequence's cache (positions 0..=pos), rows split
    /// across the cores. `qkv` holds each row's roped queries first.
    fn attention(&self, qkv: &[f32], rows: &[Row], caches: &[KvCache], layer: usize) -> Vec<f32> {
        let c = &self.config;
        let (d, hq, hkv) = (c.head_dim, c.num_heads, c.num_kv_heads);
        let (qw, kvw, stride) = (c.q_width(), c.kv_width(), c.q_width() + 2 * c.kv_width());
        let scale = 1.0 / (d as f32).sqrt();
        let mut out = vec![0f32; rows.len() * qw];
        let per = rows.len().div_ceil(self.threads).max(1);
        std::thread::scope(|s| {
            for (part, (chunk, out)) in rows.chunks(per).zip(out.chunks_mut(per * qw)).enumerate() {
                let first = part * per;
                s.spawn(move || {
                    let mut scores = Vec::new();
                    for (j, row) in chunk.iter().enumerate() {
                        let q = &qkv[(first + j) * stride..][..qw];
                        let (k, v) = (&caches[row.seq].k[layer], &caches[row.seq].v[layer]);
                        for head in 0..hq {
                            let kvh = head / (hq / hkv);
                            let qh = &q[head * d..][..d];
                            scores.clear();
                            scores.extend((0..=row.pos).map(|p| dot(qh, &k[p * kvw + kvh * d..][..d]) * scale));
                            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                            let mut sum = 0f32;
                            scores.iter_mut().for_each(|s| {
                                *s = (*s - max).exp();
                                sum += *s;
                            });
                            let o = &mut out[j * qw + head * d..][..d];
                            o.fill(0.0);
                            for (p, w) in scores.iter().enumerate() {
                                let vp = &v[p * kvw + kvh * d..][..d];
                                o.iter_mut().zip(vp).for_each(|(o, v)| *o += w * v);
                            }
                            o.iter_mut().for_each(|o| *o /= sum);
                        }
                    }
                });
            }
        });
        out
    }

    /// y[r][j] = Σ_k x[r][k] · w[j][k] (w in Linear layout `[n][k]`), output columns split across the cores.
    fn matmul(&self, x: &[f32], w: &[f32], rows: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * n];
        if rows == 0 || n == 0 {
            return y;
        }
        let parts = self.threads.min(n.div_ceil(64)).max(1);
        let cols = n.div_ceil(parts);
        // Each part writes its own column range of y: disjoint, so the raw pointer is shared safely.
        let y_ptr = y.as_mut_ptr() as usize;
        std::thread::scope(|s| {
            for p in 0..parts {
                let (j0, j1) = (p * cols, ((p + 1) * cols).min(n));
                if j0 >= j1 {
                    continue;
                }
                let wp = &w[j0 * k..j1 * k];
                s.spawn(move || {
                    // SAFETY: x is rows×k row-major, wp is (j1-j0)×k row-major (read as its transpose,
                    // k×(j1-j0)), and the destination block starts at column j0 of the rows×n y with
                    // row stride n: all in bounds, and no other part writes these columns.
                    unsafe {
                        gemm::gemm(
                            rows,
                            j1 - j0,
                            k,
                            (y_ptr as *mut f32).add(j0),
                            1,
                            n as isize,
                            false,
                            x.as_ptr(),
                            1,
                            k as isize,
                            wp.as_ptr(),
                            k as isize,
                            1,
                            0.0,
                            1.0,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        );
                    }
                });
            }
        });
        y
    }
}

/// Dot product in 8 independent lanes, so that it vectorizes (a single running f32 sum cannot be
/// reordered by the compiler, and attention spends most of its time here).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(a, b)| a * b).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

fn rmsnorm(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    let n = w.len();
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(n) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        out.extend(row.iter().zip(w).map(|(v, w)| v * inv * w));
    }
    out
}

/// Per-head RMSNorm (Qwen3's q/k norms; none for Llama) then NeoX RoPE at `pos`, in place.
fn norm_rope(x: &mut [f32], norm: Option<&[f32]>, d: usize, pos: usize, table: &[[f32; 2]], eps: f32) {
    let half = d / 2;
    for head in x.chunks_exact_mut(d) {
        if let Some(w) = norm {
            let normed = rmsnorm(head, w, eps);
            head.copy_from_slice(&normed);
        }
        for i in 0..half {
            let [c, s] = table[pos * half + i];
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * c - b * s;
            head[i + half] = b * c + a * s;
        }
    }
}
