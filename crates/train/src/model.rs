//! The drafter as a burn module: the DFlash backbone (spec §3) and the Domino head (spec §5), with the
//! parameter names and `[out, in]` layouts of the published checkpoints, so export is a rename-free
//! copy. The target's embedding and lm_head are frozen inputs ([`Target`]), never parameters.
//!
//! One forward serves training and drafting: a batch of A blocks of B slots, block j anchored at
//! position a_j; its queries see the context positions [0, a_j) and all B slots of their own block.

use burn::module::{Module, Param};
use burn::tensor::activation::{log_softmax, sigmoid, silu, softmax, tanh};
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::Qwen3Config;

#[derive(Module, Debug)]
pub struct DraftLayer {
    pub input_layernorm: Param<Tensor<1>>,
    pub q_proj: Param<Tensor<2>>,
    pub k_proj: Param<Tensor<2>>,
    pub v_proj: Param<Tensor<2>>,
    pub o_proj: Param<Tensor<2>>,
    pub q_norm: Param<Tensor<1>>,
    pub k_norm: Param<Tensor<1>>,
    pub post_attention_layernorm: Param<Tensor<1>>,
    pub gate_proj: Param<Tensor<2>>,
    pub up_proj: Param<Tensor<2>>,
    pub down_proj: Param<Tensor<2>>,
}

/// The Domino correction: GRU (no biases, gates r, z, n) and the two-layer MLP to vocabulary deltas.
#[derive(Module, Debug)]
pub struct DominoHead {
    pub weight_ih: Param<Tensor<2>>,
    pub weight_hh: Param<Tensor<2>>,
    /// embed_proj.0 `[e, h + g]`.
    pub proj_in: Param<Tensor<2>>,
    /// embed_proj.2 `[V, e]`.
    pub proj_out: Param<Tensor<2>>,
}

#[derive(Module, Debug)]
pub struct DrafterNet {
    pub fc: Param<Tensor<2>>,
    pub hidden_norm: Param<Tensor<1>>,
    pub layers: Vec<DraftLayer>,
    pub norm: Param<Tensor<1>>,
    pub head: Option<DominoHead>,
}

/// The target's frozen tensors the drafter reads: embedding and lm_head, `[V, h]`.
#[derive(Clone, Debug)]
pub struct Target {
    pub embed: Tensor<2>,
    pub lm_head: Tensor<2>,
}

/// Shapes and constants of one drafter (from its DrafterConfig), on the forward's side.
#[derive(Clone, Debug)]
pub struct Dims {
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub block: usize,
    pub vocab: usize,
    pub eps: f64,
    pub rope_theta: f64,
    pub mask_token: u32,
    pub prefix_len: usize,
    pub shift_label: bool,
}

impl Dims {
    pub fn new(cfg: &DrafterConfig, target: &Qwen3Config) -> Self {
        Self {
            hidden: cfg.hidden_size,
            heads: cfg.num_heads,
            kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
            block: cfg.block_size,
            vocab: target.vocab_size,
            eps: cfg.rms_norm_eps as f64,
            rope_theta: cfg.rope_theta,
            mask_token: cfg.mask_token_id,
            prefix_len: cfg.pure_draft_prefix_len,
            shift_label: cfg.shift_label,
        }
    }
}

/// What one forward over A blocks produces.
pub struct BlockOutput {
    /// Backbone output after the final norm, `[A, B, h]`.
    pub y: Tensor<3>,
    /// Target lm_head on y, `[A, B, V]`.
    pub base: Tensor<3>,
    /// base plus the Domino correction on slots >= prefix_len (None without a head / with use_head off).
    pub fin: Option<Tensor<3>>,
}

fn rmsnorm<const D: usize>(x: Tensor<D>, w: &Param<Tensor<1>>, eps: f64) -> Tensor<D> {
    let ms = x.clone().powf_scalar(2.0).mean_dim(D - 1);
    let n = w.val().dims()[0];
    let mut shape = [1usize; D];
    shape[D - 1] = n;
    x.div(ms.add_scalar(eps).sqrt()).mul(w.val().reshape(shape))
}

/// x `[rows, in]` · Wᵀ for W `[out, in]`.
fn linear(x: Tensor<2>, w: &Param<Tensor<2>>) -> Tensor<2> {
    x.matmul(w.val().transpose())
}

/// RoPE tables (cos, sin) `[n, d/2]` for the given positions, computed like the engine's
/// `rope_table_values` (f32 angle, f64 trigonometry) so both sides rotate by the same numbers.
pub fn rope_rows(positions: &[usize], head_dim: usize, theta: f64, device: &Device) -> (Tensor<2>, Tensor<2>) {
    let half = head_dim / 2;
    let inv: Vec<f32> = (0..half).map(|i| (1.0 / theta.powf((2 * i) as f64 / head_dim as f64)) as f32).collect();
    let (mut c, mut s) = (Vec::with_capacity(positions.len() * half), Vec::with_capacity(positions.len() * half));
    for &p in positions {
        for f in &inv {
            let a = (p as f32 * f) as f64;
            c.push(a.cos() as f32);
            s.push(a.sin() as f32);
        }
    }
    let n = positions.len();
    (
        Tensor::from_data(TensorData::new(c, [n, half]), device),
        Tensor::from_data(TensorData::new(s, [n, half]), device),
    )
}

/// Per-head RMSNorm then NeoX RoPE: x `[n, heads·d]` → `[n, heads, d]`.
fn norm_rope(x: Tensor<2>, norm: &Param<Tensor<1>>, heads: usize, d: usize, rope: &(Tensor<2>, Tensor<2>), eps: f64) -> Tensor<3> {
    let n = x.dims()[0];
    let x = rmsnorm(x.reshape([n, heads, d]), norm, eps);
    let half = d / 2;
    let x1 = x.clone().narrow(2, 0, half);
    let x2 = x.narrow(2, half, half);
    let c = rope.0.clone().unsqueeze_dim::<3>(1);
    let s = rope.1.clone().unsqueeze_dim::<3>(1);
    let lo = x1.clone().mul(c.clone()).sub(x2.clone().mul(s.clone()));
    let hi = x2.mul(c).add(x1.mul(s));
    Tensor::cat(vec![lo, hi], 2)
}

/// `[groups, kv_heads, n, d]` → `[groups, heads, n, d]`: query head h reads kv head h / (heads / kv_heads).
fn repeat_kv(x: Tensor<4>, heads: usize) -> Tensor<4> {
    let [g, kvh, n, d] = x.dims();
    if kvh == heads {
        return x;
    }
    let rep = heads / kvh;
    x.reshape([g, kvh, 1, n, d]).expand([g, kvh, rep, n, d]).reshape([g, heads, n, d])
}

impl DrafterNet {
    /// Run A blocks. `features` `[T, k·h_t]` are the target features of positions [0, T); block j is
    /// [anchor_tokens[j], MASK, …] at positions anchors[j]… and attends to context positions
    /// [0, anchors[j]). `head_tokens[j]` (B ids: the anchor, then the tokens after it) drive the GRU
    /// of a Domino head when given.
    pub fn forward(
        &self,
        dims: &Dims,
        target: &Target,
        features: Tensor<2>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        head_tokens: Option<&[Vec<u32>]>,
    ) -> BlockOutput {
        self.forward_columns(dims, target, features, anchors, anchor_tokens, head_tokens, None)
    }

    /// [`forward`](Self::forward) with the vocabulary axis restricted to the token ids `columns`
    /// (in that order): `base` and `fin` are `[A, B, C]`, column c the logit of token columns[c].
    /// Only those rows of the lm_head and of the Domino head's output projection are multiplied
    /// (the correction is low-rank, `[V, e]·silu(…)`, so its columns restrict like the lm_head's).
    /// None: the whole vocabulary, as `forward`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_columns(
        &self,
        dims: &Dims,
        target: &Target,
        features: Tensor<2>,
        anchors: &[usize],
        anchor_tokens: &[u32],
        head_tokens: Option<&[Vec<u32>]>,
        columns: Option<&[u32]>,
    ) -> BlockOutput {
        let device = features.device();
        let (a_n, b, h, d) = (anchors.len(), dims.block, dims.hidden, dims.head_dim);
        let (hq, hkv) = (dims.heads, dims.kv_heads);
        let t = features.dims()[0];
        // Context: hidden_norm(fc(F)); no input_layernorm on it.
        let ctx = rmsnorm(linear(features, &self.fc), &self.hidden_norm, dims.eps);
        let ctx_pos: Vec<usize> = (0..t).collect();
        let ctx_rope = rope_rows(&ctx_pos, d, dims.rope_theta, &device);
        let blk_pos: Vec<usize> = anchors.iter().flat_map(|&a| a..a + b).collect();
        let blk_rope = rope_rows(&blk_pos, d, dims.rope_theta, &device);
        let ids: Vec<i64> = anchor_tokens
            .iter()
            .flat_map(|&anchor| std::iter::once(anchor as i64).chain(std::iter::repeat_n(dims.mask_token as i64, b - 1)))
            .collect();
        let mut x = target.embed.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(ids, [a_n * b]), &device));
        // Context column t is visible to block j iff t < a_j; block columns always.
        let mask: Vec<bool> = anchors.iter().flat_map(|&a| (0..t + b).map(move |c| c < t && c >= a)).collect();
        let mask = Tensor::<3, Bool>::from_data(TensorData::new(mask, [a_n, 1, t + b]), &device).unsqueeze_dim::<4>(1).expand([a_n, hq, b, t + b]);
        let scale = 1.0 / (d as f64).sqrt();
        for layer in &self.layers {
            let a = rmsnorm(x.clone(), &layer.input_layernorm, dims.eps);
            let q = norm_rope(linear(a.clone(), &layer.q_proj), &layer.q_norm, hq, d, &blk_rope, dims.eps);
            let q = q.reshape([a_n, b, hq, d]).swap_dims(1, 2);
            let kb = norm_rope(linear(a.clone(), &layer.k_proj), &layer.k_norm, hkv, d, &blk_rope, dims.eps);
            let kb = repeat_kv(kb.reshape([a_n, b, hkv, d]).swap_dims(1, 2), hq);
            let vb = repeat_kv(linear(a, &layer.v_proj).reshape([a_n, b, hkv, d]).swap_dims(1, 2), hq);
            let kc = norm_rope(linear(ctx.clone(), &layer.k_proj), &layer.k_norm, hkv, d, &ctx_rope, dims.eps);
            let kc = repeat_kv(kc.swap_dims(0, 1).unsqueeze_dim::<4>(0).expand([a_n, hkv, t, d]), hq);
            let vc = linear(ctx.clone(), &layer.v_proj).reshape([t, hkv, d]).swap_dims(0, 1);
            let vc = repeat_kv(vc.unsqueeze_dim::<4>(0).expand([a_n, hkv, t, d]), hq);
            let keys = Tensor::cat(vec![kc, kb], 2);
            let values = Tensor::cat(vec![vc, vb], 2);
            let scores = q.matmul(keys.swap_dims(2, 3)).mul_scalar(scale).mask_fill(mask.clone(), -1.0e30);
            let att = softmax(scores, 3).matmul(values).swap_dims(1, 2).reshape([a_n * b, hq * d]);
            x = x.add(linear(att, &layer.o_proj));
            let m = rmsnorm(x.clone(), &layer.post_attention_layernorm, dims.eps);
            let glu = silu(linear(m.clone(), &layer.gate_proj)).mul(linear(m, &layer.up_proj));
            x = x.add(linear(glu, &layer.down_proj));
        }
        let y = rmsnorm(x, &self.norm, dims.eps);
        let cols = columns.map(|c| Tensor::<1, Int>::from_data(TensorData::new(c.iter().map(|&x| x as i64).collect::<Vec<_>>(), [c.len()]), &device));
        let lm_head = match &cols {
            Some(c) => target.lm_head.clone().select(0, c.clone()),
            None => target.lm_head.clone(),
        };
        let width = columns.map_or(dims.vocab, |c| c.len());
        let base = y.clone().matmul(lm_head.transpose()).reshape([a_n, b, width]);
        let y = y.reshape([a_n, b, h]);
        let fin = match (&self.head, head_tokens) {
            (Some(head), Some(tokens)) => Some(base.clone().add(head.teacher_forced_columns(dims, target, y.clone(), tokens, cols))),
            _ => None,
        };
        BlockOutput { y, base, fin }
    }

    pub fn kind(&self) -> DrafterKind {
        if self.head.is_some() {
            DrafterKind::Domino
        } else {
            DrafterKind::DFlash
        }
    }
}

impl DominoHead {
    fn gru(&self, x_proj: Tensor<2>, s: Tensor<2>) -> Tensor<2> {
        let g = s.dims()[1];
        let gh = linear(s.clone(), &self.weight_hh);
        let r = sigmoid(x_proj.clone().narrow(1, 0, g).add(gh.clone().narrow(1, 0, g)));
        let z = sigmoid(x_proj.clone().narrow(1, g, g).add(gh.clone().narrow(1, g, g)));
        let n = tanh(x_proj.narrow(1, 2 * g, g).add(r.mul(gh.narrow(1, 2 * g, g))));
        z.clone().neg().add_scalar(1.0).mul(n).add(z.mul(s))
    }

    /// Correction logits `[A, B, V]`, zero on the first prefix_len slots. Slot i's GRU state has
    /// consumed tokens[j][0..=i] (the anchor and the i tokens after it): the teacher-forced
    /// alignment of training, and of drafting when tokens are the drafts chosen so far.
    pub fn teacher_forced(&self, dims: &Dims, target: &Target, y: Tensor<3>, tokens: &[Vec<u32>]) -> Tensor<3> {
        self.teacher_forced_columns(dims, target, y, tokens, None)
    }

    /// [`teacher_forced`](Self::teacher_forced) on the vocabulary columns `columns` only (`[A, B, C]`).
    pub fn teacher_forced_columns(&self, dims: &Dims, target: &Target, y: Tensor<3>, tokens: &[Vec<u32>], columns: Option<Tensor<1, Int>>) -> Tensor<3> {
        let device = y.device();
        let [a_n, b, h] = y.dims();
        let g = self.weight_hh.val().dims()[1];
        let ids: Vec<i64> = tokens.iter().flat_map(|t| t.iter().take(b).map(|&x| x as i64)).collect();
        let emb = target.embed.clone().select(0, Tensor::<1, Int>::from_data(TensorData::new(ids, [a_n * b]), &device));
        let xp = linear(emb, &self.weight_ih).reshape([a_n, b, 3 * g]);
        let mut s = Tensor::<2>::zeros([a_n, g], &device);
        let mut states = Vec::with_capacity(b);
        for i in 0..b {
            s = self.gru(xp.clone().narrow(1, i, 1).reshape([a_n, 3 * g]), s);
            states.push(s.clone().unsqueeze_dim::<3>(1));
        }
        let states = Tensor::cat(states, 1);
        let z = Tensor::cat(vec![y, states], 2).reshape([a_n * b, h + g]);
        let hidden = silu(linear(z, &self.proj_in));
        let corr = match columns {
            Some(c) => {
                let width = c.dims()[0];
                hidden.matmul(self.proj_out.val().select(0, c).transpose()).reshape([a_n, b, width])
            }
            None => linear(hidden, &self.proj_out).reshape([a_n, b, dims.vocab]),
        };
        let keep: Vec<f32> = (0..b).map(|i| if i >= dims.prefix_len { 1.0 } else { 0.0 }).collect();
        corr.mul(Tensor::<1>::from_data(TensorData::new(keep, [b]), &device).reshape([1, b, 1]))
    }
}

/// Negative log-likelihood of `labels` under `logits` `[n, V]`, per row `[n]`.
pub fn nll(logits: Tensor<2>, labels: &[u32]) -> Tensor<1> {
    nll_of_log_probs(log_softmax(logits, 1), labels)
}

/// −log p of each row's label column, from log-probabilities `[n, C]`.
pub fn nll_of_log_probs(log_probs: Tensor<2>, labels: &[u32]) -> Tensor<1> {
    let device = log_probs.device();
    let n = labels.len();
    let idx = Tensor::<1, Int>::from_data(TensorData::new(labels.iter().map(|&l| l as i64).collect::<Vec<_>>(), [n]), &device);
    log_probs.gather(1, idx.reshape([n, 1])).reshape([n]).neg()
}
