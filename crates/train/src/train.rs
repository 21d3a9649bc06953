//! The training loop of the base-anchored curriculum (spec §6).
//!
//! Each step draws `batch` sequences and, in each, up to `anchors` random anchor positions among the
//! target-generated tokens. Block j is [x_a, MASK…] at positions a…a+B−1 and sees the context
//! [0, a) through the target features; the Domino GRU is teacher-forced on x_a, x_{a+1}, …. Slot k
//! of a shifted-label (Domino) drafter is labelled x_{a+k+1}; a DFlash backbone's slot k ≥ 1 is
//! labelled x_{a+k}. Draft k is weighted exp(−k/7). loss = (1−λ)·CE(final) + λ·CE(base), λ falling
//! linearly 1 → 0 over decay_ratio of the steps (a DFlash backbone has only CE(base)).
//! AdamW, linear warmup then cosine decay; the state is saved every `save_every` steps and a run
//! resumes from it. The cross-entropies run over the whole vocabulary or, with [`LossKind::Sampled`],
//! over a sampled candidate set ([`crate::loss`]); `eval_seqs` sequences can be held out and scored
//! with the full-vocabulary NLL every `eval_every` steps.

use crate::data::{read_all, Sequence};
use crate::error::{format_error, io, Result, TrainError};
use crate::export::{export, validate, write_atomic};
use crate::feature_scale::{column_multipliers, scale_sequence};
use crate::loss::{most_frequent, Candidates, EvalStats, LossKind};
use crate::model::{nll, nll_of_log_probs, Dims, DrafterNet, Target};
use crate::rng::Rng;
use crate::schedule::{lambda, learning_rate, slot_weight, SPEC_SLOT_DECAY};
use crate::soft_labels::{read_soft_labels, SoftRows};
use burn::tensor::activation::log_softmax;
use crate::weights::{build_net, init_weights, load_target, InitReport};
use burn::module::Module;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer};
use burn::optim::grad_clipping::GradientClippingConfig;
use burn::tensor::{Device, Tensor, TensorData};
use domino_models::checkpoint::WeightSource;
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::Qwen3Config;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Everything that defines a training run (a resumed run must match it exactly).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainOptions {
    /// false: a DFlash backbone (no head, unshifted labels), the --no-head ablation.
    pub domino: bool,
    pub layers: usize,
    pub block_size: usize,
    pub emb_dim: usize,
    pub gru_hidden: usize,
    /// None: the data's own target_layer_ids.
    pub target_layer_ids: Option<Vec<usize>>,
    /// None: vocab_size − 1.
    pub mask_token_id: Option<u32>,
    pub steps: usize,
    pub lr: f64,
    pub decay_ratio: f64,
    pub warmup_ratio: f64,
    pub min_lr_ratio: f64,
    pub weight_decay: f64,
    pub grad_clip: f64,
    /// Sequences per step.
    pub batch: usize,
    /// Anchors per sequence.
    pub anchors: usize,
    pub save_every: usize,
    pub seed: u64,
    /// Initialise the decoder layers from the target's where shapes allow.
    pub init_from_target: bool,
    /// The loss's vocabulary: all of it, or sampled candidates (absent in states saved before it
    /// existed: full).
    #[serde(default)]
    pub loss: LossKind,
    /// Sampled loss: the most frequent target tokens of the training data always in the candidates.
    #[serde(default = "default_frequent")]
    pub frequent_candidates: usize,
    /// Sampled loss: uniform negatives per sequence (with the log Q correction).
    #[serde(default = "default_negatives")]
    pub sampled_candidates: usize,
    /// The last N sequences of the data are held out of training and scored with the
    /// full-vocabulary NLL (0: none).
    #[serde(default)]
    pub eval_seqs: usize,
    /// Score the held-out sequences every N steps (0: at the end of each run only). Not part of the
    /// run's identity: a resumed run may change it.
    #[serde(default)]
    pub eval_every: usize,
    /// Train on features divided by their column RMS, folded into `fc` at export
    /// ([`crate::feature_scale`]); absent in states saved before it existed: off.
    #[serde(default)]
    pub scale_features: bool,
    /// Weight W of the distillation term: each draft's loss is (1 − W)·CE(greedy token) +
    /// W·CE(the target's top-k distribution) from the data's soft labels
    /// ([`crate::soft_labels`]); 0 (and absent in older states): the greedy token alone.
    #[serde(default)]
    pub soft_weight: f64,
    /// γ of the per-slot loss weight exp(−k/γ): the spec's 7 (also in older states); smaller
    /// values put more of the loss on the first drafts.
    #[serde(default = "default_slot_decay")]
    pub slot_decay: f64,
}

fn default_slot_decay() -> f64 {
    SPEC_SLOT_DECAY
}

fn default_frequent() -> usize {
    1024
}

fn default_negatives() -> usize {
    1024
}

impl TrainOptions {
    /// The options that define the trained weights (what a resumed run must match).
    fn identity(&self) -> Self {
        Self { eval_every: 0, ..self.clone() }
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        Self {
            domino: true,
            layers: 1,
            block_size: 16,
            emb_dim: 64,
            gru_hidden: 128,
            target_layer_ids: None,
            mask_token_id: None,
            steps: 1000,
            lr: 6e-4,
            decay_ratio: 1.0,
            warmup_ratio: 0.04,
            min_lr_ratio: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            batch: 4,
            anchors: 64,
            save_every: 100,
            seed: 0,
            init_from_target: true,
            loss: LossKind::Full,
            frequent_candidates: default_frequent(),
            sampled_candidates: default_negatives(),
            eval_seqs: 0,
            eval_every: 0,
            scale_features: false,
            soft_weight: 0.0,
            slot_decay: SPEC_SLOT_DECAY,
        }
    }
}

/// One step's numbers, for the progress bar.
#[derive(Debug, Clone, Default)]
pub struct StepStats {
    pub step: usize,
    pub total: usize,
    pub loss: f64,
    pub lambda: f64,
    pub lr: f64,
    /// Top-1 accuracy of draft k (final logits for Domino, base for DFlash) over this step's blocks
    /// (with the sampled loss: among the candidates).
    pub slot_accuracy: Vec<f64>,
    /// Vocabulary columns the loss ran over (mean per sequence; the vocabulary size for the full loss).
    pub columns: f64,
    /// Wall time of the step (forward, backward, optimizer), without saving or evaluating.
    pub seconds: f64,
    /// Held-out full-vocabulary numbers, on the steps that evaluate.
    pub eval: Option<EvalStats>,
}

#[derive(Debug, Clone)]
pub struct TrainSummary {
    pub resumed_from: usize,
    pub steps: usize,
    pub last: StepStats,
    pub init: InitReport,
    pub config: DrafterConfig,
    /// Held-out numbers before the first step (a run that starts at step 0 with eval_seqs > 0).
    pub initial_eval: Option<EvalStats>,
}

#[derive(Debug, Serialize, Deserialize)]
struct TrainState {
    step: usize,
    rng: u64,
    options: TrainOptions,
}

/// The drafter architecture the options describe, for `target`, reading `target_layer_ids` features.
pub fn drafter_config(opts: &TrainOptions, target: &Qwen3Config, target_layer_ids: Vec<usize>) -> Result<DrafterConfig> {
    let kind = if opts.domino { DrafterKind::Domino } else { DrafterKind::DFlash };
    let cfg = DrafterConfig {
        kind,
        block_size: opts.block_size,
        num_target_layers: target.num_layers,
        mask_token_id: opts.mask_token_id.unwrap_or(target.vocab_size.saturating_sub(1) as u32),
        target_layer_ids,
        hidden_size: target.hidden_size,
        num_layers: opts.layers,
        num_heads: target.num_heads,
        num_kv_heads: target.num_kv_heads,
        head_dim: target.head_dim,
        intermediate_size: target.intermediate_size,
        rms_norm_eps: target.rms_norm_eps,
        rope_theta: target.rope_theta,
        max_position_embeddings: target.max_position_embeddings,
        emb_dim: opts.domino.then_some(opts.emb_dim),
        gru_hidden_dim: opts.domino.then_some(opts.gru_hidden),
        pure_draft_prefix_len: 1,
        shift_label: opts.domino,
        head_prefix: String::new(),
    };
    validate(&cfg, target)
}

/// One sequence's share of a step: the loss tensor, (correct, counted) per draft slot and the
/// number of vocabulary columns the loss ran over. `candidates`: None for the full-vocabulary loss,
/// else a function of the fixed ids (the labels, and the soft labels' candidates) giving the
/// sampled loss's columns. `soft`: the sequence's soft labels and the weight W of their term.
/// `slot_decay`: γ of the per-slot weight exp(−k/γ).
#[allow(clippy::too_many_arguments)]
pub fn sequence_loss(
    net: &DrafterNet,
    dims: &Dims,
    target: &Target,
    seq: &Sequence,
    width: usize,
    anchors: &[usize],
    lam: f64,
    candidates: Option<&mut dyn FnMut(&[u32]) -> Candidates>,
    soft: Option<(&SoftRows, f64)>,
    slot_decay: f64,
    device: &Device,
) -> (Tensor<1>, Vec<(usize, usize)>, usize) {
    let b = dims.block;
    let shift = usize::from(dims.shift_label);
    // Slot i is draft k = i + shift − 1 with label x_{a+i+shift}; slot 0 of a DFlash block is the anchor.
    let first = 1 - shift;
    let slots: Vec<usize> = (first..b).collect();
    let labels: Vec<u32> = anchors.iter().flat_map(|&a| slots.iter().map(move |&i| seq.tokens[a + i + shift])).collect();
    // The target's distribution over each label comes from the position just before it.
    let soft_rows: Vec<(&[u32], &[f32])> = match soft {
        Some((rows, _)) => anchors.iter().flat_map(|&a| slots.iter().map(move |&i| a + i + shift - 1)).filter_map(|p| rows.at(p)).collect(),
        None => Vec::new(),
    };
    // read_soft_labels checks that every sequence has a row for each position from prompt_len − 1
    // on, and anchors start at prompt_len, so every label has its row.
    debug_assert!(soft.is_none() || soft_rows.len() == labels.len(), "soft labels missing for some labels");
    let soft_weight = if soft_rows.len() == labels.len() { soft.map_or(0.0, |(_, w)| w) } else { 0.0 };
    let fixed: Vec<u32> = labels.iter().copied().chain(soft_rows.iter().flat_map(|(ids, _)| ids.iter().copied())).collect();
    let cand = candidates.map(|f| f(&fixed));
    let out = block_forward(net, dims, target, seq, width, anchors, cand.as_ref().map(|c| c.ids.as_slice()), device);
    let weights: Vec<f32> = anchors.iter().flat_map(|_| slots.iter().map(|&i| slot_weight(i + shift - 1, slot_decay) as f32)).collect();
    let norm: f32 = weights.iter().sum();
    let n = labels.len();
    let w = Tensor::<1>::from_data(TensorData::new(weights, [n]), device).div_scalar(norm);
    let columns = cand.as_ref().map_or(dims.vocab, |c| c.len());
    let pick = |logits: Tensor<3>| logits.narrow(1, first, b - first).reshape([n, columns]);
    let column = |t: u32| cand.as_ref().map_or(t as usize, |c| c.column(t));
    let label_columns: Vec<u32> = labels.iter().map(|&l| column(l) as u32).collect();
    let soft_target = (soft_weight > 0.0).then(|| {
        let mut t = vec![0f32; n * columns];
        for (r, (ids, logp)) in soft_rows.iter().enumerate() {
            // Renormalised over the kept candidates: the target's relative preferences among them.
            let max = logp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f32 = logp.iter().map(|l| (l - max).exp()).sum();
            for (&id, &l) in ids.iter().zip(logp.iter()) {
                t[r * columns + column(id)] += (l - max).exp() / z;
            }
        }
        Tensor::<2>::from_data(TensorData::new(t, [n, columns]), device)
    });
    let loss_of = |logits: Tensor<2>| {
        let log_probs = match &cand {
            Some(c) => c.log_probs(logits),
            None => log_softmax(logits, 1),
        };
        let hard = nll_of_log_probs(log_probs.clone(), &label_columns);
        match &soft_target {
            Some(t) => hard.mul_scalar(1.0 - soft_weight).add(log_probs.mul(t.clone()).sum_dim(1).reshape([n]).neg().mul_scalar(soft_weight)),
            None => hard,
        }
    };
    let base = pick(out.base);
    let (loss, scored) = match out.fin {
        Some(fin) => {
            let fin = pick(fin);
            let l_fin = loss_of(fin.clone()).mul(w.clone()).sum();
            let l_base = loss_of(base).mul(w).sum();
            (l_fin.mul_scalar(1.0 - lam).add(l_base.mul_scalar(lam)), fin)
        }
        None => (loss_of(base.clone()).mul(w).sum(), base),
    };
    let pred: Vec<i64> = scored.detach().argmax(1).into_data().convert::<i64>().try_to_vec::<i64>().unwrap_or_default();
    let label_cols: Vec<i64> = label_columns.iter().map(|&c| c as i64).collect();
    let mut acc = vec![(0usize, 0usize); slots.len()];
    for (r, (&p, &l)) in pred.iter().zip(&label_cols).enumerate() {
        let k = r % slots.len();
        acc[k].0 += usize::from(p == l);
        acc[k].1 += 1;
    }
    (loss, acc, columns)
}

/// The teacher-forced forward of the blocks anchored at `anchors` in `seq` (on `columns` only when given).
#[allow(clippy::too_many_arguments)]
fn block_forward(net: &DrafterNet, dims: &Dims, target: &Target, seq: &Sequence, width: usize, anchors: &[usize], columns: Option<&[u32]>, device: &Device) -> crate::model::BlockOutput {
    let b = dims.block;
    // Context rows needed: positions before the last anchor.
    let t = *anchors.iter().max().unwrap_or(&1);
    let f: Vec<f32> = seq.features[..t * width].iter().map(|x| x.to_f32()).collect();
    let features = Tensor::<2>::from_data(TensorData::new(f, [t, width]), device);
    let anchor_tokens: Vec<u32> = anchors.iter().map(|&a| seq.tokens[a]).collect();
    let head_tokens: Vec<Vec<u32>> = anchors.iter().map(|&a| seq.tokens[a..a + b].to_vec()).collect();
    net.forward_columns(dims, target, features, anchors, &anchor_tokens, Some(&head_tokens), columns)
}

/// Anchors of the held-out evaluation: up to `k` evenly spaced positions of the anchor range.
fn eval_anchors(lo: usize, hi: usize, k: usize) -> Vec<usize> {
    let n = hi - lo;
    if k >= n {
        return (lo..hi).collect();
    }
    (0..k).map(|i| lo + i * n / k).collect()
}

/// Full-vocabulary NLL and top-1 accuracy per draft slot on `seqs` (teacher-forced; final logits for
/// Domino, base for DFlash), on up to `anchors` evenly spaced anchors per sequence. Deterministic,
/// and it draws nothing from the training sampler.
pub fn evaluate(net: &DrafterNet, dims: &Dims, target: &Target, seqs: &[&Sequence], width: usize, anchors: usize, device: &Device) -> EvalStats {
    let b = dims.block;
    let shift = usize::from(dims.shift_label);
    let first = 1 - shift;
    let slots = b - first;
    let (mut sum, mut correct, mut count) = (vec![0.0f64; slots], vec![0usize; slots], vec![0usize; slots]);
    for seq in seqs {
        let (lo, hi) = anchor_range(seq, b, shift);
        let anchors = eval_anchors(lo, hi, anchors);
        let labels: Vec<u32> = anchors.iter().flat_map(|&a| (first..b).map(move |i| seq.tokens[a + i + shift])).collect();
        let out = block_forward(net, dims, target, seq, width, &anchors, None, device);
        let n = labels.len();
        let logits = out.fin.unwrap_or(out.base).detach().narrow(1, first, slots).reshape([n, dims.vocab]);
        let pred: Vec<i64> = logits.clone().argmax(1).into_data().convert::<i64>().try_to_vec::<i64>().unwrap_or_default();
        let rows: Vec<f32> = nll(logits, &labels).into_data().convert::<f32>().try_to_vec::<f32>().unwrap_or_default();
        for (r, ((&x, &p), &l)) in rows.iter().zip(&pred).zip(&labels).enumerate() {
            let k = r % slots;
            sum[k] += x as f64;
            correct[k] += usize::from(p == l as i64);
            count[k] += 1;
        }
    }
    let drafts: usize = count.iter().sum();
    EvalStats {
        nll: sum.iter().sum::<f64>() / drafts.max(1) as f64,
        slot_nll: sum.iter().zip(&count).map(|(s, &c)| s / c.max(1) as f64).collect(),
        slot_accuracy: correct.iter().zip(&count).map(|(&x, &c)| x as f64 / c.max(1) as f64).collect(),
        drafts,
    }
}

/// Anchor positions of `seq` that have a full block of labels: a in [prompt_len, n − B − shift].
fn anchor_range(seq: &Sequence, b: usize, shift: usize) -> (usize, usize) {
    let hi = (seq.tokens.len() + 1).saturating_sub(b + shift);
    (seq.prompt_len.max(1), hi)
}

/// Train a drafter for the target (`target_cfg`, weights in `target_src`) on the data folder and
/// export it to `out`, resuming from `out`/train-state when a run with the same options is saved
/// there. `stop_after`: run at most this many steps now (the rest on a later, resumed run).
/// `on_step` sees every step's numbers.
#[allow(clippy::too_many_arguments)]
pub fn train(
    target_cfg: &Qwen3Config,
    target_src: &dyn WeightSource,
    data_dir: &Path,
    out: &Path,
    opts: &TrainOptions,
    device: &Device,
    stop_after: Option<usize>,
    on_step: &mut dyn FnMut(&StepStats),
) -> Result<TrainSummary> {
    if opts.steps == 0 || opts.batch == 0 || opts.anchors == 0 || opts.save_every == 0 {
        return Err(TrainError::Invalid("--steps, --batch, --anchors and --save-every must be positive".into()));
    }
    if !(opts.lr > 0.0) || !(0.0..=1.0).contains(&opts.decay_ratio) || !(0.0..=1.0).contains(&opts.warmup_ratio) {
        return Err(TrainError::Invalid("--lr must be positive; --decay-ratio and --warmup-ratio must lie in [0, 1]".into()));
    }
    if !(0.0..=1.0).contains(&opts.soft_weight) {
        return Err(TrainError::Invalid("--soft-weight must lie in [0, 1]".into()));
    }
    if !(opts.slot_decay > 0.0) || !opts.slot_decay.is_finite() {
        return Err(TrainError::Invalid("--slot-decay must be a positive number".into()));
    }
    let (meta, mut seqs) = read_all(data_dir)?;
    let soft = if opts.soft_weight > 0.0 { Some(read_soft_labels(data_dir, &meta, &seqs)?) } else { None };
    if meta.hidden_size != target_cfg.hidden_size || meta.num_target_layers != target_cfg.num_layers || meta.vocab_size != target_cfg.vocab_size {
        return Err(format_error(
            &data_dir.join("meta.json"),
            format!(
                "the data was made by a target with hidden {}, {} layers, vocab {}; this target has hidden {}, {} layers, vocab {}",
                meta.hidden_size, meta.num_target_layers, meta.vocab_size, target_cfg.hidden_size, target_cfg.num_layers, target_cfg.vocab_size
            ),
        ));
    }
    let ids = opts.target_layer_ids.clone().unwrap_or_else(|| meta.target_layer_ids.clone());
    if ids != meta.target_layer_ids {
        return Err(TrainError::Invalid(format!(
            "--target-layer-ids {ids:?} differ from the data's {:?}: regenerate the data with these layers",
            meta.target_layer_ids
        )));
    }
    let cfg = drafter_config(opts, target_cfg, ids)?;
    let dims = Dims::new(&cfg, target_cfg);
    let shift = usize::from(cfg.shift_label);
    let usable_ids: Vec<usize> = (0..seqs.len())
        .filter(|&i| {
            let (lo, hi) = anchor_range(&seqs[i], cfg.block_size, shift);
            lo < hi
        })
        .collect();
    if opts.eval_seqs > 0 && opts.eval_seqs >= usable_ids.len() {
        return Err(TrainError::Invalid(format!(
            "--eval-seqs {} would hold out all of the {} usable sequences in {}",
            opts.eval_seqs,
            usable_ids.len(),
            data_dir.display()
        )));
    }
    let width = meta.feature_width();
    // The scale comes from the training sequences only; the held-out ones are scaled by it too.
    let multipliers = opts.scale_features.then(|| {
        let train_seqs: Vec<&Sequence> = usable_ids[..usable_ids.len().saturating_sub(opts.eval_seqs)].iter().map(|&i| &seqs[i]).collect();
        column_multipliers(&train_seqs, width)
    });
    if let Some(m) = &multipliers {
        seqs.iter_mut().for_each(|s| scale_sequence(s, m));
    }
    let mut usable: Vec<&Sequence> = usable_ids.iter().map(|&i| &seqs[i]).collect();
    let held_out: Vec<&Sequence> = usable.split_off(usable.len() - opts.eval_seqs);
    let usable_soft: Vec<Option<(&SoftRows, f64)>> = usable_ids[..usable.len()].iter().map(|&i| soft.as_ref().map(|s| (&s[i], opts.soft_weight))).collect();
    if usable.is_empty() {
        return Err(TrainError::Invalid(format!(
            "no sequence in {} has a continuation longer than the block size {} (+{shift}): generate longer continuations or use a smaller --block-size",
            data_dir.display(),
            cfg.block_size
        )));
    }
    let frequent = match opts.loss {
        LossKind::Full => Vec::new(),
        LossKind::Sampled => most_frequent(usable.iter().map(|s| &s.tokens[s.prompt_len..]), target_cfg.vocab_size, opts.frequent_candidates),
    };
    let target = load_target(target_cfg, target_src, device)?;
    let (weights, init) = init_weights(&cfg, target_cfg, opts.init_from_target.then_some(target_src), opts.seed)?;
    let mut net = build_net(&cfg, weights, device)?;
    let clip = (opts.grad_clip > 0.0).then_some(GradientClippingConfig::Norm(opts.grad_clip as f32));
    let mut optim: ModuleOptimizer = AdamWConfig::new().with_weight_decay(opts.weight_decay as f32).with_grad_clipping(clip).init();
    let state_dir = out.join("train-state");
    let mut rng = Rng::new(opts.seed.wrapping_add(1));
    let mut start = 0;
    let state_path = state_dir.join("state.json");
    if state_path.exists() {
        let bytes = std::fs::read(&state_path).map_err(io(&state_path))?;
        let st: TrainState = serde_json::from_slice(&bytes).map_err(|e| format_error(&state_path, e.to_string()))?;
        if st.options.identity() != opts.identity() {
            return Err(format_error(&state_path, format!("a run with other options is saved here ({:?}); use a new --out folder", st.options)));
        }
        let mp = state_dir.join("model.bpk");
        net = net.try_load_file(&mp).map_err(|e| format_error(&mp, e.to_string()))?;
        let op = state_dir.join("optim.bpk");
        optim = optim.load(&op).map_err(|e| format_error(&op, e.to_string()))?;
        start = st.step;
        rng.state = st.rng;
    }
    let warmup = (opts.warmup_ratio * opts.steps as f64).round() as usize;
    let mut last = StepStats::default();
    let end = stop_after.map_or(opts.steps, |n| (start + n).min(opts.steps));
    let eval = |net: &DrafterNet| (!held_out.is_empty()).then(|| evaluate(net, &dims, &target, &held_out, width, opts.anchors, device));
    let initial_eval = if start == 0 && start < end { eval(&net) } else { None };
    for step in start..end {
        let started = std::time::Instant::now();
        let lam = if opts.domino { lambda(step, opts.steps, opts.decay_ratio) } else { 1.0 };
        let lr = learning_rate(step, opts.steps, warmup, opts.lr, opts.min_lr_ratio);
        let mut total: Option<Tensor<1>> = None;
        let mut acc: Vec<(usize, usize)> = Vec::new();
        let mut columns = 0usize;
        for _ in 0..opts.batch {
            let pick = rng.below(usable.len());
            let seq = usable[pick];
            let (lo, hi) = anchor_range(seq, cfg.block_size, shift);
            let anchors = rng.distinct(lo, hi, opts.anchors);
            let mut draw = |labels: &[u32]| Candidates::draw(labels, &frequent, opts.sampled_candidates, dims.vocab, &mut rng);
            let candidates: Option<&mut dyn FnMut(&[u32]) -> Candidates> = match opts.loss {
                LossKind::Full => None,
                LossKind::Sampled => Some(&mut draw),
            };
            let (loss, a, cols) = sequence_loss(&net, &dims, &target, seq, width, &anchors, lam, candidates, usable_soft[pick], opts.slot_decay, device);
            columns += cols;
            total = Some(match total {
                Some(t) => t.add(loss),
                None => loss,
            });
            acc.resize(a.len(), (0, 0));
            acc.iter_mut().zip(a).for_each(|(x, y)| {
                x.0 += y.0;
                x.1 += y.1;
            });
        }
        let loss = total.ok_or_else(|| TrainError::Invalid("--batch must be at least 1".into()))?.div_scalar(opts.batch as f64);
        let loss_value: f64 = loss.clone().detach().into_scalar::<f32>() as f64;
        if !loss_value.is_finite() {
            return Err(TrainError::Invalid(format!("the loss became {loss_value} at step {step}: try a lower --lr")));
        }
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(lr, net, grads);
        let seconds = started.elapsed().as_secs_f64();
        let evaluate_now = step + 1 == end || (opts.eval_every > 0 && (step + 1) % opts.eval_every == 0);
        last = StepStats {
            step: step + 1,
            total: opts.steps,
            loss: loss_value,
            lambda: if opts.domino { lam } else { 0.0 },
            lr,
            slot_accuracy: acc.iter().map(|&(c, n)| c as f64 / n.max(1) as f64).collect(),
            columns: columns as f64 / opts.batch as f64,
            seconds,
            eval: if evaluate_now { eval(&net) } else { None },
        };
        on_step(&last);
        if (step + 1) % opts.save_every == 0 || step + 1 == end {
            save(&state_dir, &net, &optim, step + 1, &rng, opts)?;
            export(out, &net, &cfg, target_cfg, multipliers.as_deref())?;
        }
    }
    if start >= opts.steps {
        export(out, &net, &cfg, target_cfg, multipliers.as_deref())?;
    }
    Ok(TrainSummary { resumed_from: start, steps: end, last, init, config: cfg, initial_eval })
}

fn save(dir: &Path, net: &DrafterNet, optim: &ModuleOptimizer, step: usize, rng: &Rng, opts: &TrainOptions) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    // Each file through a temporary name, so an interrupted save leaves the previous one whole.
    let (mp, mt) = (dir.join("model.bpk"), dir.join("model.next.bpk"));
    net.clone().save_file(&mt).map_err(|e| format_error(&mt, e.to_string()))?;
    std::fs::rename(&mt, &mp).map_err(io(&mp))?;
    let (op, ot) = (dir.join("optim.bpk"), dir.join("optim.next.bpk"));
    optim.save(&ot).map_err(|e| format_error(&ot, e.to_string()))?;
    std::fs::rename(&ot, &op).map_err(io(&op))?;
    let st = TrainState { step, rng: rng.state, options: opts.clone() };
    let path = dir.join("state.json");
    let text = serde_json::to_vec_pretty(&st).map_err(|e| format_error(&path, e.to_string()))?;
    // state.json last: it names a step only once the module and optimizer files of that step exist.
    write_atomic(&path, &text)
}
