//! A plain CPU reference of the drafters (spec §3 and §5) and of the greedy speculative round (§4),
//! in the style of `reference.rs`: f32 storage, f64 accumulation, no batching tricks. It is the
//! independent implementation the GPU drafter and the runtime's speculative loop are tested against,
//! so it favours obviousness over speed (the verify pass recomputes the target from position 0).

use crate::checkpoint::{expect_tensor, WeightSource};
use crate::drafter::{drafter_tensor_plan, DrafterConfig, DrafterKind};
use crate::error::Result;
use crate::reference::{RefOutput, ReferenceModel};
use domino_engine::reference as k;
use domino_engine::HostTensor;
use std::collections::HashMap;
use std::ops::Range;

/// One PyTorch `nn.GRUCell` step without biases: gates in (r, z, n) order, `w_ih` `[3g, in]`,
/// `w_hh` `[3g, g]`, state `s` `[g]`; returns the next state.
pub fn gru_cell(w_ih: &[f32], w_hh: &[f32], x: &[f32], s: &[f32], g: usize) -> Vec<f32> {
    assert_eq!(w_ih.len(), 3 * g * x.len(), "gru_cell: w_ih must be [3g, in]");
    assert_eq!(w_hh.len(), 3 * g * g, "gru_cell: w_hh must be [3g, g]");
    assert_eq!(s.len(), g, "gru_cell: state must have g entries");
    let gi = k::matmul(x, w_ih, 1, x.len(), 3 * g);
    let gh = k::matmul(s, w_hh, 1, g, 3 * g);
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    (0..g)
        .map(|j| {
            let r = sigmoid(gi[j] as f64 + gh[j] as f64);
            let z = sigmoid(gi[g + j] as f64 + gh[g + j] as f64);
            let n = (gi[2 * g + j] as f64 + r * gh[2 * g + j] as f64).tanh();
            ((1.0 - z) * n + z * s[j] as f64) as f32
        })
        .collect()
}

/// Features of `rows` for the drafter: per token, the residual stream after each of `layer_ids`
/// (`RefOutput::hidden[l]`), concatenated in `layer_ids` order → `[rows.len()][ids.len()·h]`.
pub fn target_features(out: &RefOutput, layer_ids: &[usize], hidden: usize, rows: Range<usize>) -> Vec<f32> {
    rows.flat_map(|r| layer_ids.iter().flat_map(move |&l| out.hidden[l][r * hidden..(r + 1) * hidden].iter().copied()))
        .collect()
}

struct DraftLayer {
    input_norm: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    post_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// The Domino correction: a GRU over the block's tokens and a two-layer MLP to vocabulary deltas.
/// `w1` (embed_proj.0, `[e, h+g]`) is split by input columns into the part applied to the backbone
/// state y (`w1_y`, parallel over slots) and the part applied to the GRU state (`w1_s`, sequential).
struct DominoHead {
    g: usize,
    e: usize,
    w_ih: Vec<f32>,
    w_hh: Vec<f32>,
    w1_y: Vec<f32>,
    w1_s: Vec<f32>,
    w2: Vec<f32>,
}

/// Per-layer K/V of the draft context positions [0, ctx_len), `[pos][kv_width]`, RoPE applied.
#[derive(Default, Clone)]
struct ContextCache {
    k: Vec<f32>,
    v: Vec<f32>,
}

/// What the last `draft_block` computed, for comparing a GPU drafter within tolerance.
#[derive(Debug, Clone, Default)]
pub struct BlockTrace {
    /// Position of the anchor (block slot 0).
    pub start: usize,
    /// Backbone output after the final norm, `[B][hidden]`.
    pub backbone: Vec<f32>,
    /// Target lm_head on `backbone`, `[B][vocab]`.
    pub base_logits: Vec<f32>,
    /// The logits the drafts are the argmax of, `[B][vocab]`: base plus the Domino correction on the
    /// corrected slots, equal to `base_logits` everywhere else (including unused slots).
    pub final_logits: Vec<f32>,
    pub drafts: Vec<u32>,
}

/// A DFlash or Domino drafter with its draft-context KV cache.
pub struct ReferenceDrafter {
    pub config: DrafterConfig,
    target_hidden: usize,
    vocab: usize,
    embed: Vec<f32>,
    lm_head: Vec<f32>,
    fc: Vec<f32>,
    hidden_norm: Vec<f32>,
    norm: Vec<f32>,
    layers: Vec<DraftLayer>,
    head: Option<DominoHead>,
    cache: Vec<ContextCache>,
    ctx_len: usize,
    last: BlockTrace,
}

impl ReferenceDrafter {
    /// Load the drafter's weights as f32 (matrices rounded through f16 when `round_f16`, as
    /// `ReferenceModel::load` does) and copy the target's embedding and lm_head, which drafters share.
    /// Tensor names come from `drafter_tensor_plan`, so `config.head_prefix` must already match the
    /// checkpoint (see `detect_head_prefix`).
    pub fn load(config: DrafterConfig, src: &dyn WeightSource, target: &ReferenceModel, round_f16: bool) -> Result<Self> {
        let tc = target.config();
        config.validate_against(tc)?;
        let mut w = load_plan(src, &drafter_tensor_plan(&config, tc), round_f16)?;
        let mut take = |name: &str| w.remove(name).unwrap_or_default();
        let layers = (0..config.num_layers)
            .map(|l| {
                let mut t = |n: &str| take(&format!("layers.{l}.{n}"));
                DraftLayer {
                    input_norm: t("input_layernorm.weight"),
                    q: t("self_attn.q_proj.weight"),
                    k: t("self_attn.k_proj.weight"),
                    v: t("self_attn.v_proj.weight"),
                    o: t("self_attn.o_proj.weight"),
                    q_norm: t("self_attn.q_norm.weight"),
                    k_norm: t("self_attn.k_norm.weight"),
                    post_norm: t("post_attention_layernorm.weight"),
                    gate: t("mlp.gate_proj.weight"),
                    up: t("mlp.up_proj.weight"),
                    down: t("mlp.down_proj.weight"),
                }
            })
            .collect();
        let head = match (config.kind, config.emb_dim, config.gru_hidden_dim) {
            (DrafterKind::Domino, Some(e), Some(g)) => {
                let p = config.head_prefix.clone();
                let w1 = take(&format!("{p}embed_proj.0.weight"));
                let (w1_y, w1_s) = split_columns(&w1, e, config.hidden_size);
                Some(DominoHead {
                    g,
                    e,
                    w_ih: take(&format!("{p}prefix_gru.weight_ih_l0")),
                    w_hh: take(&format!("{p}prefix_gru.weight_hh_l0")),
                    w1_y,
                    w1_s,
                    w2: take(&format!("{p}embed_proj.2.weight")),
                })
            }
            _ => None,
        };
        Ok(Self {
            target_hidden: tc.hidden_size,
            vocab: tc.vocab_size,
            embed: target.embed().to_vec(),
            lm_head: target.lm_head().to_vec(),
            fc: take("fc.weight"),
            hidden_norm: take("hidden_norm.weight"),
            norm: take("norm.weight"),
            cache: vec![ContextCache::default(); config.num_layers],
            layers,
            head,
            ctx_len: 0,
            last: BlockTrace::default(),
            config,
        })
    }

    /// Positions [0, ctx_len) whose context K/V are cached.
    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Forget the draft context (a new sequence).
    pub fn reset(&mut self) {
        self.cache.iter_mut().for_each(|c| *c = ContextCache::default());
        self.ctx_len = 0;
        self.last = BlockTrace::default();
    }

    pub fn last_trace(&self) -> &BlockTrace {
        &self.last
    }
    pub fn last_base_logits(&self) -> &[f32] {
        &self.last.base_logits
    }
    pub fn last_final_logits(&self) -> &[f32] {
        &self.last.final_logits
    }

    /// Draft one block for the anchor at position `start` (spec §3). `new_features` `[n_new][k·h]`
    /// are the target features of positions [ctx_len, start); their context K/V join the cache for
    /// good. Returns B − 1 drafts (DFlash), or B with shifted labels (Domino; `use_head` = false
    /// drops the correction, the "--no-head" ablation).
    pub fn draft_block(&mut self, new_features: &[f32], anchor: u32, start: usize, use_head: bool) -> Vec<u32> {
        let width = self.config.num_features() * self.target_hidden;
        assert_eq!(new_features.len() % width, 0, "draft_block: features must be rows of {width}");
        let n_new = new_features.len() / width;
        assert_eq!(self.ctx_len + n_new, start, "draft_block: features must cover [ctx_len, start)");
        let y = self.backbone(new_features, n_new, anchor, start);
        let b = self.config.block_size;
        let base = k::matmul(&y, &self.lm_head, b, self.config.hidden_size, self.vocab);
        let (final_logits, drafts) = match (&self.head, use_head && self.config.shift_label) {
            (Some(head), true) => self.refine(head, &y, &base, anchor),
            _ => (base.clone(), self.plain_drafts(&base)),
        };
        self.last = BlockTrace { start, backbone: y, base_logits: base, final_logits, drafts: drafts.clone() };
        drafts
    }

    /// The backbone over one block: returns y = norm(x) `[B][h]` and appends the new context K/V.
    fn backbone(&mut self, features: &[f32], n_new: usize, anchor: u32, start: usize) -> Vec<f32> {
        let c = &self.config;
        let (h, b) = (c.hidden_size, c.block_size);
        // No input_layernorm on the context: k_proj/v_proj read hidden_norm(fc(F)) directly.
        let fc = k::matmul(features, &self.fc, n_new, self.config.num_features() * self.target_hidden, h);
        let ctx = k::rmsnorm(&fc, &self.hidden_norm, c.rms_norm_eps);
        let block: Vec<u32> = std::iter::once(anchor).chain(std::iter::repeat_n(c.mask_token_id, b - 1)).collect();
        let mut x = k::embedding(&self.embed, h, &block);
        let ctx_pos = self.ctx_len;
        for l in 0..self.layers.len() {
            self.append_context(l, &ctx, n_new, ctx_pos);
            x = self.layer(l, x, start);
        }
        self.ctx_len += n_new;
        k::rmsnorm(&x, &self.norm, self.config.rms_norm_eps)
    }

    /// Project the new context rows with layer `l`'s k/v (k_norm, RoPE at their absolute positions
    /// pos0…) and append them to its cache.
    fn append_context(&mut self, l: usize, ctx: &[f32], n: usize, pos0: usize) {
        let c = &self.config;
        let layer = &self.layers[l];
        let kk = k::matmul(ctx, &layer.k, n, c.hidden_size, c.kv_width());
        let kk = k::norm_rope(&kk, Some(&layer.k_norm), n, c.num_kv_heads, c.head_dim, pos0, c.rope_theta, c.rms_norm_eps);
        let v = k::matmul(ctx, &layer.v, n, c.hidden_size, c.kv_width());
        self.cache[l].k.extend_from_slice(&kk);
        self.cache[l].v.extend_from_slice(&v);
    }

    /// One decoder layer on the block rows at positions start…: non-causal attention over the whole
    /// cached context followed by the block's own K/V (which are not cached), then the MLP.
    fn layer(&self, l: usize, mut x: Vec<f32>, start: usize) -> Vec<f32> {
        let c = &self.config;
        let (h, b, d) = (c.hidden_size, c.block_size, c.head_dim);
        let (layer, cache) = (&self.layers[l], &self.cache[l]);
        let a = k::rmsnorm(&x, &layer.input_norm, c.rms_norm_eps);
        let q = k::matmul(&a, &layer.q, b, h, c.q_width());
        let q = k::norm_rope(&q, Some(&layer.q_norm), b, c.num_heads, d, start, c.rope_theta, c.rms_norm_eps);
        let kb = k::matmul(&a, &layer.k, b, h, c.kv_width());
        let kb = k::norm_rope(&kb, Some(&layer.k_norm), b, c.num_kv_heads, d, start, c.rope_theta, c.rms_norm_eps);
        let vb = k::matmul(&a, &layer.v, b, h, c.kv_width());
        let keys = [cache.k.as_slice(), &kb].concat();
        let values = [cache.v.as_slice(), &vb].concat();
        let n_keys = keys.len() / c.kv_width();
        let att = k::attention(&q, &keys, &values, b, c.num_heads, c.num_kv_heads, d, n_keys, 0, false);
        let o = k::matmul(&att, &layer.o, b, c.q_width(), h);
        x.iter_mut().zip(&o).for_each(|(x, o)| *x += o);
        let m = k::rmsnorm(&x, &layer.post_norm, c.rms_norm_eps);
        let m = k::glu(&m, &layer.gate, &layer.up, b, h, c.intermediate_size);
        let down = k::matmul(&m, &layer.down, b, c.intermediate_size, h);
        x.iter_mut().zip(&down).for_each(|(x, d)| *x += d);
        x
    }

    /// Drafts straight from the base logits: with shifted labels every slot's argmax is the next
    /// token's draft; otherwise slot i predicts the token at slot i, so slot 0 (the anchor) is dropped.
    fn plain_drafts(&self, base: &[f32]) -> Vec<u32> {
        let skip = if self.config.shift_label { 0 } else { 1 };
        base.chunks(self.vocab).skip(skip).map(k::argmax).collect()
    }

    /// The Domino refinement (spec §5): slots from pure_draft_prefix_len on add a correction that
    /// depends, through the GRU state, on the anchor and every draft chosen before them. Slot i's state
    /// has consumed [anchor, d1, …, d_i]; that is the teacher-forced alignment of training.
    fn refine(&self, head: &DominoHead, y: &[f32], base: &[f32], anchor: u32) -> (Vec<f32>, Vec<u32>) {
        let (h, b, v) = (self.config.hidden_size, self.config.block_size, self.vocab);
        let zw = k::matmul(y, &head.w1_y, b, h, head.e);
        let mut s = self.gru_step(head, anchor, &vec![0.0; head.g]);
        let mut logits = base.to_vec();
        let mut drafts = Vec::with_capacity(b);
        for i in 0..b {
            let row = &mut logits[i * v..(i + 1) * v];
            if i >= self.config.pure_draft_prefix_len {
                let corr = self.correction(head, &zw[i * head.e..(i + 1) * head.e], &s);
                row.iter_mut().zip(&corr).for_each(|(l, c)| *l += c);
            }
            let d = k::argmax(row);
            drafts.push(d);
            if i + 1 < b {
                s = self.gru_step(head, d, &s);
            }
        }
        (logits, drafts)
    }

    fn gru_step(&self, head: &DominoHead, token: u32, s: &[f32]) -> Vec<f32> {
        let h = self.config.hidden_size;
        let x = &self.embed[token as usize * h..(token as usize + 1) * h];
        gru_cell(&head.w_ih, &head.w_hh, x, s, head.g)
    }

    /// W2 · silu(W1_y·y + W1_s·s): a delta for every vocabulary entry.
    fn correction(&self, head: &DominoHead, zw: &[f32], s: &[f32]) -> Vec<f32> {
        let zs = k::matmul(s, &head.w1_s, 1, head.g, head.e);
        let act: Vec<f32> = zw.iter().zip(&zs).map(|(a, b)| k::silu(a + b)).collect();
        k::matmul(&act, &head.w2, 1, head.e, self.vocab)
    }
}

/// Every planned tensor as f32, shape-checked; matrices optionally rounded through f16.
fn load_plan(src: &dyn WeightSource, plan: &[(String, Vec<usize>)], round_f16: bool) -> Result<HashMap<String, Vec<f32>>> {
    plan.iter()
        .map(|(name, shape)| {
            let t = expect_tensor(src, name, shape)?;
            let n: usize = shape.iter().product();
            let v = HostTensor::new(name, t.dtype, 1, n, &t.data)?.to_f32();
            let round = round_f16 && shape.len() == 2;
            let v = if round { v.into_iter().map(|x| half::f16::from_f32(x).to_f32()).collect() } else { v };
            Ok((name.clone(), v))
        })
        .collect()
}

/// Split a row-major `[rows, cols]` matrix into its first `left` columns and the rest.
fn split_columns(m: &[f32], rows: usize, left: usize) -> (Vec<f32>, Vec<f32>) {
    let cols = m.len() / rows.max(1);
    let mut a = Vec::with_capacity(rows * left);
    let mut b = Vec::with_capacity(rows * (cols - left));
    for row in m.chunks(cols.max(1)) {
        a.extend_from_slice(&row[..left]);
        b.extend_from_slice(&row[left..]);
    }
    (a, b)
}

/// Greedy speculative decoding, exactly the round of spec §4, on the CPU references: returns the
/// output ids (identical to `target.greedy(prompt, max_tokens)`) and the acceptance length of every
/// round.
///
/// Accounting follows z-lab's `spec_generate`: a round emits its anchor and the a accepted drafts
/// (a + 1 tokens, its acceptance length) and the target's bonus token becomes the next round's anchor.
/// So lengths lie in 1..=K+1 (K = drafts per block: B − 1 for DFlash, B for Domino), they sum to the
/// output length, and the last round is truncated to end exactly at `max_tokens`. The verify pass
/// recomputes the target from position 0; its rows are bit-identical to an incremental pass because
/// every row of the CPU reference is computed independently.
pub fn speculative_greedy(
    target: &ReferenceModel,
    drafter: &mut ReferenceDrafter,
    prompt: &[u32],
    max_tokens: usize,
    use_head: bool,
) -> (Vec<u32>, Vec<usize>) {
    assert!(!prompt.is_empty(), "speculative_greedy: the prompt must not be empty");
    let (v, h) = (target.config().vocab_size, target.config().hidden_size);
    let ids = drafter.config.target_layer_ids.clone();
    drafter.reset();
    let (mut output, mut lengths) = (Vec::new(), Vec::new());
    if max_tokens == 0 {
        return (output, lengths);
    }
    // Prefill: the first anchor and the features of every prompt position.
    let prefill = target.forward(prompt);
    let mut anchor = k::argmax(&prefill.logits[(prompt.len() - 1) * v..prompt.len() * v]);
    let mut features = target_features(&prefill, &ids, h, 0..prompt.len());
    // Tokens at positions [0, start): the anchor sits at start = committed.len().
    let mut committed = prompt.to_vec();
    while output.len() < max_tokens {
        let start = committed.len();
        let drafts = drafter.draft_block(&features, anchor, start, use_head);
        let round: Vec<u32> = std::iter::once(anchor).chain(drafts.iter().copied()).collect();
        let verify = target.forward(&[committed.as_slice(), &round].concat());
        let posterior: Vec<u32> = (start..start + round.len()).map(|p| k::argmax(&verify.logits[p * v..(p + 1) * v])).collect();
        let accepted = drafts.iter().zip(&posterior).take_while(|(d, t)| d == t).count();
        let emitted = &round[..accepted + 1];
        let take = emitted.len().min(max_tokens - output.len());
        output.extend_from_slice(&emitted[..take]);
        lengths.push(take);
        committed.extend_from_slice(emitted);
        features = target_features(&verify, &ids, h, start..start + accepted + 1);
        anchor = posterior[accepted];
    }
    (output, lengths)
}
