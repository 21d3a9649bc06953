//! The training loss over the whole vocabulary (`full`) or over a candidate set of columns
//! (`sampled`), and the held-out evaluation that compares both on the same full-vocabulary metric.
//!
//! `sampled` is a sampled softmax (Bengio & Senécal 2008, "Adaptive importance sampling to
//! accelerate training of a neural probabilistic language model"; Jean et al. 2015, "On using very
//! large target vocabulary for neural machine translation") with a stratified proposal. Per
//! sequence of a step the softmax runs over
//! - the fixed set F: every label of the sequence's blocks plus the `frequent` most frequent target
//!   tokens of the training data (counted once; the frequency-ranked draft vocabulary of EAGLE-3 and
//!   FR-Spec, where most of the probability mass of a drafter's mistakes lies), each included
//!   with probability 1;
//! - `negatives` ids drawn uniformly without replacement from the rest R = V \ F, each included with
//!   probability q = negatives / |R|, whose logits get the log Q correction −log q.
//!
//! exp(s_f) over F plus exp(s_j)/q over the drawn negatives is an unbiased estimate of the
//! partition function Σ_V exp(s_v), so the loss is the usual consistent sampled-softmax estimate of
//! the full cross-entropy. When F ∪ negatives covers V (q = 1) it is the full loss exactly (tested).

use crate::rng::Rng;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Which loss a training step pays for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Log-softmax over the whole vocabulary (the default).
    #[default]
    Full,
    /// Sampled softmax over the labels, the most frequent tokens and uniform negatives.
    Sampled,
}

impl std::str::FromStr for LossKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" => Ok(Self::Full),
            "sampled" => Ok(Self::Sampled),
            other => Err(format!("expected full or sampled, not {other}")),
        }
    }
}

/// The columns one sampled loss runs over and the correction added to each column's logit.
#[derive(Debug, Clone)]
pub struct Candidates {
    /// Token ids, the fixed set (sorted) first, then the drawn negatives.
    pub ids: Vec<u32>,
    /// −log q per column: 0 for the fixed set, ln(|R| / negatives) for a drawn negative.
    pub correction: Vec<f32>,
    index: HashMap<u32, usize>,
}

impl Candidates {
    /// The fixed set `labels ∪ frequent` and `negatives` uniform draws from the rest of [0, vocab).
    pub fn draw(labels: &[u32], frequent: &[u32], negatives: usize, vocab: usize, rng: &mut Rng) -> Self {
        let mut fixed = vec![false; vocab];
        for &t in labels.iter().chain(frequent) {
            fixed[t as usize] = true;
        }
        let mut ids: Vec<u32> = (0..vocab as u32).filter(|&t| fixed[t as usize]).collect();
        let rest: Vec<u32> = (0..vocab as u32).filter(|&t| !fixed[t as usize]).collect();
        let mut correction = vec![0.0f32; ids.len()];
        let k = negatives.min(rest.len());
        if k > 0 {
            let log_inv_q = (rest.len() as f64 / k as f64).ln() as f32;
            for i in rng.distinct(0, rest.len(), k) {
                ids.push(rest[i]);
                correction.push(log_inv_q);
            }
        }
        let index = ids.iter().enumerate().map(|(c, &t)| (t, c)).collect();
        Self { ids, correction, index }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Column of token `t` (every label is a candidate).
    pub fn column(&self, t: u32) -> usize {
        self.index[&t]
    }

    /// Sampled-softmax log-probabilities `[n, C]` of `logits` `[n, C]` (columns = `self.ids`).
    pub fn log_probs(&self, logits: Tensor<2>) -> Tensor<2> {
        let device = logits.device();
        let c = self.ids.len();
        let corr = Tensor::<1>::from_data(TensorData::new(self.correction.clone(), [c]), &device).reshape([1, c]);
        log_softmax(logits.add(corr), 1)
    }

    /// Sampled-softmax NLL per row `[n]` of `logits` `[n, C]` (columns = `self.ids`) for `labels`.
    pub fn nll(&self, logits: Tensor<2>, labels: &[u32]) -> Tensor<1> {
        let device = logits.device();
        let n = labels.len();
        let cols: Vec<i64> = labels.iter().map(|&l| self.column(l) as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(cols, [n]), &device);
        self.log_probs(logits).gather(1, idx.reshape([n, 1])).reshape([n]).neg()
    }
}

/// The `k` most frequent tokens among `labels` (ties: lower id first).
pub fn most_frequent<'a>(labels: impl IntoIterator<Item = &'a [u32]>, vocab: usize, k: usize) -> Vec<u32> {
    let mut count = vec![0u64; vocab];
    for seq in labels {
        for &t in seq {
            count[t as usize] += 1;
        }
    }
    let mut ids: Vec<u32> = (0..vocab as u32).filter(|&t| count[t as usize] > 0).collect();
    ids.sort_by(|&a, &b| count[b as usize].cmp(&count[a as usize]).then(a.cmp(&b)));
    ids.truncate(k);
    ids
}

/// Full-vocabulary numbers of the drafter on the held-out sequences (teacher-forced, as in
/// training; final logits for Domino, base logits for DFlash).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EvalStats {
    /// Mean NLL (nats) over every scored draft.
    pub nll: f64,
    /// Mean NLL of draft k.
    pub slot_nll: Vec<f64>,
    /// Top-1 accuracy of draft k.
    pub slot_accuracy: Vec<f64>,
    /// Drafts scored.
    pub drafts: usize,
}
