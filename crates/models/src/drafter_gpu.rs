//! DFlash / Domino drafters on the GPU (spec §3, §5), recorded into the runtime's steps.
//!
//! The drafter reads the TARGET's embedding and lm_head, and writes its drafts straight into the
//! target's id buffer at positions start+1…, where the verify pass reads them: a round moves no
//! token through the CPU until the verification result.

use crate::checkpoint::{expect_shape, expect_tensor, WeightSource};
use crate::drafter::{detect_head_prefix, DrafterConfig, DrafterKind};
use crate::error::Result;
use crate::qwen3::{LayerDims, LayerIo, LayerWeights, QkvWeights, Qwen3Model};
use crate::ngram_table::NgramTable;
use domino_engine::kernels::{self, AttentionScratch, AttentionShape, SamplingConfig};
use domino_engine::{Epilogue, Gpu, GpuBuffer, HostTensor, Matrix, Rows, Step, WeightFormat};
use std::sync::Arc;

/// The Domino head: GRU over drafted tokens plus the low-rank logit correction.
pub struct DominoHead {
    pub w_ih: Matrix,
    pub w_hh: Matrix,
    /// embed_proj.0 split by input: the first h columns read the backbone state y, the rest the GRU state.
    pub w1_y: Matrix,
    pub w1_s: Matrix,
    pub w2: Matrix,
    pub emb_dim: usize,
    pub gru_hidden: usize,
}

pub struct DrafterModel {
    pub gpu: Arc<Gpu>,
    pub config: DrafterConfig,
    pub fc: Matrix,
    pub hidden_norm: Arc<GpuBuffer>,
    pub layers: Vec<LayerWeights>,
    pub norm: Arc<GpuBuffer>,
    pub head: Option<DominoHead>,
    /// Tokens a draft may be (`set_draft_vocab`): the first `draft_vocab` ids of the target's
    /// vocabulary. The full vocabulary unless shortlisted.
    draft_vocab: usize,
    /// With a shortlist: the views of the target's lm_head and the head's correction restricted to
    /// it, made once (`Matrix::leading_outputs` shares the weights).
    shortlist: Option<Shortlist>,
    /// The static n-gram table shipped beside the drafter (`ngram_table::FILE_NAME`), which prompt
    /// lookup consults where the text itself has no earlier occurrence to copy; None without one.
    pub lookup_table: Option<Arc<NgramTable>>,
}

struct Shortlist {
    lm_head: Matrix,
    w2: Option<Matrix>,
}

fn mat(gpu: &Gpu, src: &dyn WeightSource, name: &str, n: usize, k: usize, format: WeightFormat) -> Result<Matrix> {
    let t = expect_tensor(src, name, &[n, k])?;
    Ok(Matrix::upload(gpu, &HostTensor::new(name, t.dtype, n, k, &t.data)?, format, &mut |_| {})?)
}

fn vector(gpu: &Gpu, src: &dyn WeightSource, name: &str, n: usize) -> Result<Arc<GpuBuffer>> {
    let t = expect_tensor(src, name, &[n])?;
    Ok(domino_engine::tensor::upload_vector(gpu, &HostTensor::new(name, t.dtype, 1, n, &t.data)?)?)
}

impl DrafterModel {
    /// Load a drafter checkpoint for `target`, validating every shape against it.
    pub fn load(mut config: DrafterConfig, src: &dyn WeightSource, target: &Qwen3Model, format: WeightFormat) -> Result<Self> {
        config.head_prefix = detect_head_prefix(src);
        config.validate_against(&target.config)?;
        // Check the whole plan first so a wrong checkpoint fails before anything is uploaded.
        for (name, shape) in crate::drafter::drafter_tensor_plan(&config, &target.config) {
            expect_shape(src, &name, &shape)?;
        }
        let gpu = target.gpu.clone();
        let c = &config;
        let (h, qw, kvw, inter, d) = (c.hidden_size, c.q_width(), c.kv_width(), c.intermediate_size, c.head_dim);
        let fc = mat(&gpu, src, "fc.weight", h, c.num_features() * target.config.hidden_size, format)?;
        let hidden_norm = vector(&gpu, src, "hidden_norm.weight", h)?;
        let mut layers = Vec::new();
        for l in 0..c.num_layers {
            let p = format!("layers.{l}.");
            let m = |n: &str, rows, cols| mat(&gpu, src, &(p.clone() + n), rows, cols, format);
            let v = |n: &str, len| vector(&gpu, src, &(p.clone() + n), len);
            layers.push(LayerWeights {
                input_norm: v("input_layernorm.weight", h)?,
                qkv: QkvWeights::Separate {
                    q: m("self_attn.q_proj.weight", qw, h)?,
                    k: m("self_attn.k_proj.weight", kvw, h)?,
                    v: m("self_attn.v_proj.weight", kvw, h)?,
                },
                o: m("self_attn.o_proj.weight", h, qw)?,
                q_norm: Some(v("self_attn.q_norm.weight", d)?),
                k_norm: Some(v("self_attn.k_norm.weight", d)?),
                post_norm: v("post_attention_layernorm.weight", h)?,
                gate: m("mlp.gate_proj.weight", inter, h)?,
                up: m("mlp.up_proj.weight", inter, h)?,
                down: m("mlp.down_proj.weight", h, inter)?,
            });
        }
        let norm = vector(&gpu, src, "norm.weight", h)?;
        let head = match (c.kind, c.emb_dim, c.gru_hidden_dim) {
            (DrafterKind::Domino, Some(e), Some(g)) => Some(Self::load_head(&gpu, src, &c.head_prefix, h, e, g, target.config.vocab_size, format)?),
            _ => None,
        };
        let draft_vocab = target.config.vocab_size;
        Ok(Self { gpu, config, fc, hidden_norm, layers, norm, head, draft_vocab, shortlist: None, lookup_table: None })
    }

    /// Draft only among the first `n` token ids of the target's vocabulary (None: all of them).
    ///
    /// A byte-level BPE vocabulary is ordered by merge rank, which follows token frequency in the
    /// tokenizer's corpus, so a prefix of it is a frequency shortlist (FR-Spec, arXiv 2502.14856,
    /// ranks by counted frequency): the draft's lm_head, the Domino correction and the argmax read
    /// n rows instead of the whole vocabulary. With SmolLM2 the first 8192 ids cover 90% of greedy
    /// HumanEval tokens and the lm_head is most of a draft pass on CPU adapters. A token outside the
    /// shortlist is never drafted and so never accepted early; the target's verify still reads the
    /// whole vocabulary, so output is unchanged. `n` must be a multiple of 128 (whole weight groups).
    pub fn set_draft_vocab(&mut self, target: &Qwen3Model, n: Option<usize>) -> Result<()> {
        let vocab = target.config.vocab_size;
        let n = n.unwrap_or(vocab);
        let group = domino_engine::tensor::TEXTURE_GROUP_COLS;
        let invalid = || crate::error::ModelError::DraftVocab { requested: n, group, vocab };
        self.shortlist = if n == vocab {
            None
        } else {
            let lm_head = target.lm_head().leading_outputs(n).ok_or_else(invalid)?;
            let w2 = match &self.head {
                Some(h) => Some(h.w2.leading_outputs(n).ok_or_else(invalid)?),
                None => None,
            };
            Some(Shortlist { lm_head, w2 })
        };
        self.draft_vocab = n;
        Ok(())
    }

    pub fn draft_vocab(&self) -> usize {
        self.draft_vocab
    }


    #[allow(clippy::too_many_arguments)]
    fn load_head(gpu: &Gpu, src: &dyn WeightSource, p: &str, h: usize, e: usize, g: usize, vocab: usize, format: WeightFormat) -> Result<DominoHead> {
        let w_ih = mat(gpu, src, &format!("{p}prefix_gru.weight_ih_l0"), 3 * g, h, format)?;
        let w_hh = mat(gpu, src, &format!("{p}prefix_gru.weight_hh_l0"), 3 * g, g, format)?;
        let name = format!("{p}embed_proj.0.weight");
        let t = expect_tensor(src, &name, &[e, h + g])?;
        let w1 = HostTensor::new(&name, t.dtype, e, h + g, &t.data)?.to_f32();
        let (mut y_part, mut s_part) = (Vec::with_capacity(e * h), Vec::with_capacity(e * g));
        for row in w1.chunks(h + g) {
            y_part.extend_from_slice(&row[..h]);
            s_part.extend_from_slice(&row[h..]);
        }
        let w1_y = Matrix::from_f32(gpu, &format!("{name}[:, :h]"), e, h, &y_part, format)?;
        let w1_s = Matrix::from_f32(gpu, &format!("{name}[:, h:]"), e, g, &s_part, format)?;
        let w2 = mat(gpu, src, &format!("{p}embed_proj.2.weight"), vocab, e, format)?;
        Ok(DominoHead { w_ih, w_hh, w1_y, w1_s, w2, emb_dim: e, gru_hidden: g })
    }

    pub fn attention_shape(&self) -> AttentionShape {
        let c = &self.config;
        AttentionShape { n_heads: c.num_heads as u32, n_kv_heads: c.num_kv_heads as u32, head_dim: c.head_dim as u32 }
    }

    /// Drafts one block produces: B − 1 (DFlash), B with shifted labels (Domino).
    pub fn drafts_per_block(&self) -> usize {
        self.config.drafts_per_block()
    }

    /// Per-sequence state for `capacity` target positions, context appended up to `max_ctx_rows` at a time.
    pub fn new_state(&self, target: &Qwen3Model, capacity: usize, max_ctx_rows: usize) -> Result<DraftState> {
        let gpu = &self.gpu;
        let c = &self.config;
        let b = c.block_size;
        let rows = b.max(max_ctx_rows);
        let f = |name: &str, width: usize, rows: usize| gpu.activation_buffer(name, (rows * width * 4) as u64);
        let kv_bytes = (capacity * c.kv_width() * 4) as u64;
        let mut k_cache = Vec::new();
        let mut v_cache = Vec::new();
        for l in 0..c.num_layers {
            k_cache.push(gpu.binding_buffer(&format!("draft KV cache (K, layer {l}, {capacity} positions)"), kv_bytes)?);
            v_cache.push(gpu.binding_buffer(&format!("draft KV cache (V, layer {l}, {capacity} positions)"), kv_bytes)?);
        }
        let (e, g) = self.head.as_ref().map(|h| (h.emb_dim, h.gru_hidden)).unwrap_or((1, 1));
        let mask_ids = gpu.binding_buffer("mask ids", (b * 4) as u64)?;
        gpu.write(&mask_ids, 0, &vec![c.mask_token_id; b]);
        Ok(DraftState {
            k_cache,
            v_cache,
            rope: kernels::rope_table(gpu, capacity, c.head_dim, c.rope_theta)?,
            scratch: AttentionScratch::new(gpu, self.attention_shape(), b as u32, capacity as u32)?,
            fc_out: f("draft fc", c.hidden_size, rows)?,
            ctx: f("draft context", c.hidden_size, rows)?,
            x: f("draft x", c.hidden_size, b)?,
            a: f("draft normed", c.hidden_size, b)?,
            q_raw: f("draft q (projected)", c.q_width(), b)?,
            q: f("draft q", c.q_width(), b)?,
            k_raw: f("draft k (projected)", c.kv_width(), rows)?,
            att: f("draft attention out", c.q_width(), b)?,
            mlp: f("draft mlp", c.intermediate_size, b)?,
            logits: f("draft logits", target.config.vocab_size, b)?,
            mask_ids,
            zw: f("domino zW", e, b)?,
            zs: f("domino W1s·s", e, 1)?,
            act: f("domino act", e, 1)?,
            s: f("domino GRU state", g, 1)?,
            gi: f("domino GRU gi", 3 * g, 1)?,
            gh: f("domino GRU gh", 3 * g, 1)?,
            xe: f("domino token embedding", target.config.hidden_size, 1)?,
            capacity,
            max_ctx_rows: rows,
        })
    }

    /// Append context rows: features `[n][k·h]` (rows of `features`) of target positions
    /// [pos0, pos0 + n) become permanent draft K/V at those positions (spec §3 step 1 and 3).
    pub fn record_context(&self, step: &mut Step, st: &DraftState, features: &Rows, pos0: u32, n: u32) -> Result<()> {
        let c = &self.config;
        let (h, kvw) = (c.hidden_size as u32, c.kv_width() as u32);
        let (hd, hkv) = (c.head_dim as u32, c.num_kv_heads as u32);
        let mut r0 = 0;
        while r0 < n {
            let nb = (n - r0).min(st.max_ctx_rows as u32);
            let pos = pos0 + r0;
            let ctx = Rows::new(&st.ctx, 0, h);
            kernels::matmul(step, &self.fc, &features.skip(r0), &Rows::new(&st.fc_out, 0, h), nb, Epilogue::Store)?;
            kernels::rmsnorm(step, &self.hidden_norm, h, c.rms_norm_eps, &Rows::new(&st.fc_out, 0, h), &ctx, nb)?;
            for (li, l) in self.layers.iter().enumerate() {
                let QkvWeights::Separate { k, v, .. } = &l.qkv else {
                    return Err(domino_engine::EngineError::Gpu("drafter layers keep separate q/k/v projections".into()).into());
                };
                step.set_label(&format!("draft layer {li} context k/v"));
                kernels::matmul(step, k, &ctx, &Rows::new(&st.k_raw, 0, kvw), nb, Epilogue::Store)?;
                kernels::matmul(step, v, &ctx, &Rows::new(&st.v_cache[li], pos * kvw, kvw), nb, Epilogue::Store)?;
                let dst = Rows::new(&st.k_cache[li], pos * kvw, kvw);
                kernels::norm_rope(step, &Rows::new(&st.k_raw, 0, kvw), &dst, l.k_norm.as_ref(), &st.rope, nb, hkv, hd, pos, c.rms_norm_eps)?;
            }
            r0 += nb;
        }
        Ok(())
    }

    /// Draft one block for the anchor at `ids[start]` (target positions; the context must cover
    /// [0, start)). Drafts go to ids[start + 1 ..]. `use_head` = false runs a Domino checkpoint as its
    /// backbone alone (the --no-head ablation).
    pub fn record_block(&self, step: &mut Step, st: &DraftState, target: &Qwen3Model, ids: &Arc<GpuBuffer>, start: u32, use_head: bool) -> Result<()> {
        let n = self.drafts_per_block() as u32;
        self.record_backbone(step, st, target, ids, start, n)?;
        self.record_drafts(step, st, target, ids, start, use_head, n)
    }

    /// Block rows whose logits the first `n_drafts` drafts need (slot 0 repeats the anchor unless
    /// labels are shifted).
    fn logit_rows(&self, n_drafts: u32) -> u32 {
        (n_drafts + !self.config.shift_label as u32).min(self.config.block_size as u32)
    }

    /// Whether `record_drafts` runs the sequential Domino loop.
    pub fn runs_head(&self, use_head: bool) -> bool {
        self.head.is_some() && use_head && self.config.shift_label
    }

    /// The parallel part: the backbone over [anchor, MASK…] and the base logits of every slot.
    /// The backbone over the whole block (its attention is unmasked, so every draft depends on the
    /// whole block), then base logits for the rows the first `n_drafts` drafts need.
    pub fn record_backbone(&self, step: &mut Step, st: &DraftState, target: &Qwen3Model, ids: &Arc<GpuBuffer>, start: u32, n_drafts: u32) -> Result<()> {
        let c = &self.config;
        let b = c.block_size as u32;
        let h = c.hidden_size as u32;
        let eps = c.rms_norm_eps;
        let x = Rows::new(&st.x, 0, h);
        let a = Rows::new(&st.a, 0, h);
        // x = embed([anchor, MASK, …, MASK]) with the target's embedding.
        kernels::embedding(step, &target.embed, ids, start, &x, 1)?;
        if b > 1 {
            kernels::embedding(step, &target.embed, &st.mask_ids, 0, &x.skip(1), b - 1)?;
        }
        let dims = LayerDims { hidden: h, intermediate: c.intermediate_size as u32, attention: self.attention_shape(), eps };
        for (li, l) in self.layers.iter().enumerate() {
            let label = format!("draft layer {li}");
            let io = LayerIo {
                label: &label,
                qkv: None,
                x: &st.x,
                a: &st.a,
                q_raw: &st.q_raw,
                q: &st.q,
                k_raw: &st.k_raw,
                att: &st.att,
                mlp: &st.mlp,
                k_cache: &st.k_cache[li],
                v_cache: &st.v_cache[li],
                rope: &st.rope,
                scratch: &st.scratch,
            };
            // The block's K/V sit right after the context and serve this forward only; every block
            // query sees the whole context and the whole block (unmasked).
            l.record(step, &io, &dims, b, start, start + b, false)?;
        }
        // y = norm(x) (kept in `a`), base logits through the target's lm_head.
        let rows = self.logit_rows(n_drafts);
        kernels::rmsnorm(step, &self.norm, h, eps, &x, &a, rows)?;
        let v = target.config.vocab_size as u32;
        let logits = Rows::new(&st.logits, 0, v);
        let lm_head = self.shortlist.as_ref().map_or(target.lm_head(), |s| &s.lm_head);
        kernels::matmul(step, lm_head, &a, &logits, rows, Epilogue::Store)?;
        Ok(())
    }

    /// Choose the first `n_drafts` drafts from the base logits (DFlash, --no-head) or through the
    /// Domino loop (which then runs only `n_drafts` steps).
    #[allow(clippy::too_many_arguments)]
    pub fn record_drafts(&self, step: &mut Step, st: &DraftState, target: &Qwen3Model, ids: &Arc<GpuBuffer>, start: u32, use_head: bool, n_drafts: u32) -> Result<()> {
        let c = &self.config;
        let n = n_drafts.min(self.drafts_per_block() as u32);
        let v = target.config.vocab_size as u32;
        let logits = Rows::new(&st.logits, 0, v);
        let greedy = SamplingConfig::greedy();
        let dv = self.draft_vocab as u32;
        match (&self.head, use_head && c.shift_label) {
            (Some(head), true) => self.record_refinement(step, st, target, head, ids, start, n)?,
            // Shifted labels: slot i drafts the token at start + 1 + i. Otherwise slot 0 is the anchor.
            _ if c.shift_label => kernels::sample(step, &logits, dv, n, ids, start + 1, &greedy, 0)?,
            _ => kernels::sample(step, &logits.skip(1), dv, n, ids, start + 1, &greedy, 0)?,
        }
        Ok(())
    }

    /// The sequential Domino loop (spec §5), entirely on the GPU: per slot a few small dispatches.
    #[allow(clippy::too_many_arguments)]
    fn record_refinement(&self, step: &mut Step, st: &DraftState, target: &Qwen3Model, head: &DominoHead, ids: &Arc<GpuBuffer>, start: u32, b: u32) -> Result<()> {
        let c = &self.config;
        let (h, v) = (c.hidden_size as u32, target.config.vocab_size as u32);
        let (e, g) = (head.emb_dim as u32, head.gru_hidden as u32);
        let greedy = SamplingConfig::greedy();
        let w2 = self.shortlist.as_ref().and_then(|s| s.w2.as_ref()).unwrap_or(&head.w2);
        kernels::matmul(step, &head.w1_y, &Rows::new(&st.a, 0, h), &Rows::new(&st.zw, 0, e), b, Epilogue::Store)?;
        // s = GRU(embed(token at `pos`), s)
        let gru = |step: &mut Step, pos: u32| -> Result<()> {
            let th = target.config.hidden_size as u32;
            kernels::embedding(step, &target.embed, ids, pos, &Rows::new(&st.xe, 0, th), 1)?;
            kernels::matmul(step, &head.w_ih, &Rows::new(&st.xe, 0, th), &Rows::new(&st.gi, 0, 3 * g), 1, Epilogue::Store)?;
            kernels::matmul(step, &head.w_hh, &Rows::new(&st.s, 0, g), &Rows::new(&st.gh, 0, 3 * g), 1, Epilogue::Store)?;
            kernels::gru_cell(step, &st.gi, &st.gh, &st.s, g)?;
            Ok(())
        };
        gru(step, start)?;
        for i in 0..b {
            let row = Rows::new(&st.logits, i * v, v);
            if i as usize >= c.pure_draft_prefix_len {
                kernels::matmul(step, &head.w1_s, &Rows::new(&st.s, 0, g), &Rows::new(&st.zs, 0, e), 1, Epilogue::Store)?;
                kernels::silu_add(step, &Rows::new(&st.zw, i * e, e), &Rows::new(&st.zs, 0, e), &st.act, e)?;
                kernels::matmul(step, w2, &Rows::new(&st.act, 0, e), &row, 1, Epilogue::Accumulate)?;
            }
            kernels::sample(step, &row, self.draft_vocab as u32, 1, ids, start + 1 + i, &greedy, 0)?;
            if i + 1 < b {
                gru(step, start + 1 + i)?;
            }
        }
        Ok(())
    }

    /// Zero the GRU state before a block (queue write, ordered before the next submission).
    pub fn reset_head_state(&self, st: &DraftState) {
        if let Some(head) = &self.head {
            self.gpu.write(&st.s, 0, &vec![0f32; head.gru_hidden]);
        }
    }
}

/// Per-sequence drafter state: the draft context KV cache and the block's activations.
pub struct DraftState {
    pub k_cache: Vec<Arc<GpuBuffer>>,
    pub v_cache: Vec<Arc<GpuBuffer>>,
    pub rope: Arc<GpuBuffer>,
    pub scratch: AttentionScratch,
    pub fc_out: Arc<GpuBuffer>,
    pub ctx: Arc<GpuBuffer>,
    pub x: Arc<GpuBuffer>,
    pub a: Arc<GpuBuffer>,
    pub q_raw: Arc<GpuBuffer>,
    pub q: Arc<GpuBuffer>,
    pub k_raw: Arc<GpuBuffer>,
    pub att: Arc<GpuBuffer>,
    pub mlp: Arc<GpuBuffer>,
    pub logits: Arc<GpuBuffer>,
    pub mask_ids: Arc<GpuBuffer>,
    pub zw: Arc<GpuBuffer>,
    pub zs: Arc<GpuBuffer>,
    pub act: Arc<GpuBuffer>,
    pub s: Arc<GpuBuffer>,
    pub gi: Arc<GpuBuffer>,
    pub gh: Arc<GpuBuffer>,
    pub xe: Arc<GpuBuffer>,
    pub capacity: usize,
    pub max_ctx_rows: usize,
}

/// `--draft-vocab`: which token ids a draft may be. `auto`: the first `AUTO_DRAFT_VOCAB` ids (a
/// frequency shortlist, `DrafterModel::set_draft_vocab`) where the target's ids are BPE merge ranks
/// (its tokenizer is BPE and names at least twice that many ids, as does the target), else all (a
/// random model's ids past its small test tokenizer carry no frequency order); `full`: all; N: the
/// first N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftVocab {
    #[default]
    Auto,
    Full,
    First(usize),
}

/// The shortlist `--draft-vocab auto` keeps.
pub const AUTO_DRAFT_VOCAB: usize = 8192;

impl DraftVocab {
    pub fn parse(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "full" => Ok(Self::Full),
            _ => s.parse().map(Self::First).map_err(|_| format!("expected 'auto', 'full' or a number of token ids, got '{s}'")),
        }
    }

    /// The shortlist for a target of `vocab` ids (None: all of them); `ranked`: how many of its ids
    /// are BPE merge ranks (`TextTokenizer::ranked_vocab`).
    pub fn tokens(self, vocab: usize, ranked: Option<usize>) -> Option<usize> {
        let shortlist_pays = vocab >= 2 * AUTO_DRAFT_VOCAB && ranked.is_some_and(|r| r >= 2 * AUTO_DRAFT_VOCAB);
        match self {
            Self::Auto if shortlist_pays => Some(AUTO_DRAFT_VOCAB),
            Self::Auto | Self::Full => None,
            Self::First(n) => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_shortlists_only_large_merge_ranked_vocabularies() {
        // SmolLM2 (49152 BPE ids), Qwen3 (151936 in the model, 151669 in the tokenizer).
        assert_eq!(DraftVocab::Auto.tokens(49152, Some(49152)), Some(AUTO_DRAFT_VOCAB));
        assert_eq!(DraftVocab::Auto.tokens(151936, Some(151669)), Some(AUTO_DRAFT_VOCAB));
        // A random model: 32000 ids but a 256-token test tokenizer, or none; a small vocabulary.
        assert_eq!(DraftVocab::Auto.tokens(32000, Some(256)), None);
        assert_eq!(DraftVocab::Auto.tokens(32000, None), None);
        assert_eq!(DraftVocab::Auto.tokens(12000, Some(12000)), None);
        assert_eq!(DraftVocab::Full.tokens(49152, Some(49152)), None);
        assert_eq!(DraftVocab::First(4096).tokens(32000, None), Some(4096));
        assert_eq!(DraftVocab::parse("auto"), Ok(DraftVocab::Auto));
        assert_eq!(DraftVocab::parse("full"), Ok(DraftVocab::Full));
        assert_eq!(DraftVocab::parse("1024"), Ok(DraftVocab::First(1024)));
        assert!(DraftVocab::parse("most").unwrap_err().contains("'most'"));
    }
}
