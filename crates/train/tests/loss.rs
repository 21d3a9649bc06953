//! The sampled (candidate-restricted) loss: over the whole vocabulary it is the full loss, with the
//! same gradients; over fewer columns gradients still reach every trained tensor; a short training
//! run with it lowers the held-out full-vocabulary NLL; it is deterministic and resumable; and a
//! state saved before these options existed still resumes. The per-draft weights exp(−k/γ) weigh
//! the drafts' own NLLs for any γ.

mod common;

use burn::tensor::Tensor;
use domino_train::data::{read_all, Sequence};
use domino_train::loss::{most_frequent, Candidates};
use domino_train::model::{Dims, DrafterNet, Target};
use domino_train::rng::Rng;
use domino_train::schedule::SPEC_SLOT_DECAY;
use domino_train::train::{drafter_config, evaluate, sequence_loss};
use domino_train::{cpu_device, train, LossKind, StepStats, TrainOptions};

const VOCAB: usize = 64;

/// A tiny target and 32 sequences of its data (enough that the held-out ones are like the rest).
fn setup(dir: &std::path::Path) -> common::TinyTarget {
    common::small_target_with_data(dir, 2, 32, 24)
}

fn to_vec<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// A tiny Domino (or DFlash) drafter over the tiny target, on the first sequence of its data.
struct Fixture {
    _dir: tempfile::TempDir,
    data: std::path::PathBuf,
    t: common::TinyTarget,
    opts: TrainOptions,
    seq: Sequence,
    net: DrafterNet,
    target: Target,
    dims: Dims,
}

impl Fixture {
    fn new(domino: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let t = setup(dir.path());
        let data = dir.path().join("data");
        let (_, mut seqs) = read_all(&data).unwrap();
        let opts = TrainOptions { domino, layers: 1, block_size: 4, emb_dim: 8, gru_hidden: 12, ..TrainOptions::default() };
        let cfg = drafter_config(&opts, &t.config, vec![0, 1]).unwrap();
        let (net, target, dims) = common::drafter_with_live_head(&cfg, &t);
        Self { _dir: dir, data, opts, seq: seqs.swap_remove(0), net, target, dims, t }
    }

    /// Feature columns per position.
    fn width(&self) -> usize {
        self.seq.features.len() / self.seq.tokens.len()
    }
}

/// Loss value and the gradients of fc, the draft layer's q_proj and the head's output projection.
fn loss_and_grads(domino: bool, candidates: Option<&mut dyn FnMut(&[u32]) -> Candidates>) -> (f32, Vec<Vec<f32>>) {
    let f = Fixture::new(domino);
    let (net, seq) = (&f.net, &f.seq);
    let anchors: Vec<usize> = (seq.prompt_len..seq.prompt_len + 10).collect();
    let (loss, acc, _) = sequence_loss(net, &f.dims, &f.target, seq, f.width(), &anchors, 0.3, candidates, None, SPEC_SLOT_DECAY, &cpu_device());
    assert!(acc.iter().all(|&(_, n)| n == anchors.len()));
    let value = to_vec(loss.clone().detach())[0];
    let grads = loss.backward();
    let mut g = vec![to_vec(net.fc.val().grad(&grads).expect("fc has a gradient")), to_vec(net.layers[0].q_proj.val().grad(&grads).expect("q_proj has a gradient"))];
    if let Some(head) = &net.head {
        g.push(to_vec(head.proj_out.val().grad(&grads).expect("proj_out has a gradient")));
        g.push(to_vec(head.weight_ih.val().grad(&grads).expect("the GRU has a gradient")));
    }
    (value, g)
}

/// With λ = 0 (final logits only), the full loss over every anchor of a sequence is the mean of the
/// per-draft NLLs that the held-out evaluation computes, weighted by exp(−k/γ): for the spec's γ = 7,
/// a γ that leans on the first drafts, and one so small that only the first draft counts.
#[test]
fn slot_decay_weighs_each_drafts_nll_by_exp_minus_k_over_gamma() {
    let f = Fixture::new(true);
    let (seq, dims, device) = (&f.seq, &f.dims, cpu_device());
    // Every anchor with a full block of labels (shifted labels: a + B + 1 <= len).
    let anchors: Vec<usize> = (seq.prompt_len..seq.tokens.len() - dims.block).collect();
    let per_draft = evaluate(&f.net, dims, &f.target, &[seq], f.width(), usize::MAX, &device).slot_nll;
    assert_eq!(per_draft.len(), dims.block);
    for gamma in [SPEC_SLOT_DECAY, 2.0, 1e-3] {
        let (loss, _, _) = sequence_loss(&f.net, dims, &f.target, seq, f.width(), &anchors, 0.0, None, None, gamma, &device);
        let weights: Vec<f64> = (0..per_draft.len()).map(|k| (-(k as f64) / gamma).exp()).collect();
        let expected = weights.iter().zip(&per_draft).map(|(w, x)| w * x).sum::<f64>() / weights.iter().sum::<f64>();
        let got = to_vec(loss)[0] as f64;
        assert!((got - expected).abs() < 1e-4 * expected.max(1.0), "γ {gamma}: loss {got}, weighted per-draft NLL {expected}");
    }
    assert!((per_draft[0] - per_draft[1]).abs() > 1e-3, "the drafts' NLLs must differ for the weights to show");
    for gamma in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let bad = TrainOptions { steps: 2, slot_decay: gamma, ..f.opts.clone() };
        let out = f.data.with_file_name("d");
        let e = train(&f.t.config, &f.t.ckpt, &f.data, &out, &bad, &device, None, &mut |_| {}).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("--slot-decay"), "γ {gamma}: {e}");
    }
}

#[test]
fn the_sampled_loss_over_the_whole_vocabulary_is_the_full_loss() {
    for domino in [true, false] {
        let (full, gf) = loss_and_grads(domino, None);
        // Whole vocabulary as the fixed set (frequent = every id) and as uniform negatives (q = 1).
        let all: Vec<u32> = (0..VOCAB as u32).collect();
        let mut rng = Rng::new(5);
        let mut by_frequent = |labels: &[u32]| Candidates::draw(labels, &all, 0, VOCAB, &mut rng);
        let (a, ga) = loss_and_grads(domino, Some(&mut by_frequent));
        let mut rng = Rng::new(5);
        let mut by_negatives = |labels: &[u32]| {
            let c = Candidates::draw(labels, &[], VOCAB, VOCAB, &mut rng);
            assert_eq!(c.len(), VOCAB);
            assert!(c.correction.iter().all(|&x| x == 0.0), "q = 1: no correction");
            c
        };
        let (b, gb) = loss_and_grads(domino, Some(&mut by_negatives));
        for (name, x, g) in [("frequent", a, &ga), ("negatives", b, &gb)] {
            assert!((x - full).abs() < 1e-4 * full.abs().max(1.0), "domino {domino}, {name}: {x} vs full {full}");
            assert_eq!(g.len(), gf.len());
            for (i, (p, q)) in g.iter().zip(&gf).enumerate() {
                let scale = q.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                assert!(scale > 0.0, "gradient {i} is zero");
                let d = max_diff(p, q);
                assert!(d < 1e-4 * scale.max(1e-3), "domino {domino}, {name}: gradient {i} differs by {d} (scale {scale})");
            }
        }
    }
}

#[test]
fn a_restricted_loss_still_trains_every_tensor() {
    let mut rng = Rng::new(7);
    let mut sizes = Vec::new();
    let mut draw = |labels: &[u32]| {
        let c = Candidates::draw(labels, &[], 4, VOCAB, &mut rng);
        sizes.push((c.len(), labels.iter().collect::<std::collections::BTreeSet<_>>().len()));
        // The drawn negatives carry −log q > 0.
        assert!(c.correction.iter().any(|&x| x > 0.0));
        c
    };
    let (full, _) = loss_and_grads(true, None);
    let (sampled, g) = loss_and_grads(true, Some(&mut draw));
    let (columns, unique_labels) = sizes[0];
    assert_eq!(columns, unique_labels + 4, "labels plus 4 negatives");
    assert!(columns < VOCAB);
    assert!(sampled.is_finite() && (sampled - full).abs() > 1e-6, "the restricted loss is another number: {sampled} vs {full}");
    for (i, x) in g.iter().enumerate() {
        assert!(x.iter().all(|v| v.is_finite()) && x.iter().any(|&v| v != 0.0), "gradient {i} does not flow");
    }
}

#[test]
fn candidates_hold_the_labels_and_the_frequent_tokens_and_are_seeded() {
    let labels = [5u32, 9, 5, 60];
    let frequent = most_frequent([&[1u32, 2, 2, 3, 3, 3][..], &[2, 3][..]], VOCAB, 2);
    assert_eq!(frequent, vec![3, 2]);
    let a = Candidates::draw(&labels, &frequent, 10, VOCAB, &mut Rng::new(1));
    assert_eq!(&a.ids[..5], &[2, 3, 5, 9, 60]);
    assert_eq!(a.len(), 15);
    let q = 10.0 / (VOCAB - 5) as f64;
    assert!((a.correction[5] as f64 - (1.0 / q).ln()).abs() < 1e-6);
    assert!(a.ids[5..].iter().all(|t| ![2, 3, 5, 9, 60].contains(t)));
    let b = Candidates::draw(&labels, &frequent, 10, VOCAB, &mut Rng::new(1));
    assert_eq!(a.ids, b.ids);
    let c = Candidates::draw(&labels, &frequent, 10, VOCAB, &mut Rng::new(2));
    assert_ne!(a.ids, c.ids);
    for l in labels {
        assert_eq!(a.ids[a.column(l)], l);
    }
}

fn sampled(steps: usize) -> TrainOptions {
    TrainOptions {
        layers: 1,
        block_size: 4,
        emb_dim: 16,
        gru_hidden: 16,
        steps,
        lr: 1e-3,
        batch: 2,
        anchors: 8,
        save_every: 10,
        loss: LossKind::Sampled,
        frequent_candidates: 4,
        sampled_candidates: 8,
        eval_seqs: 4,
        eval_every: 20,
        ..TrainOptions::default()
    }
}

#[test]
fn training_with_the_sampled_loss_lowers_the_held_out_full_nll() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let mut log: Vec<StepStats> = Vec::new();
    let s = train(&t.config, &t.ckpt, &data, &dir.path().join("d"), &sampled(100), &cpu_device(), None, &mut |s| log.push(s.clone())).unwrap();
    let before = s.initial_eval.expect("held-out numbers before training");
    let after = log[99].eval.clone().expect("held-out numbers at the end");
    assert_eq!(log.iter().filter(|s| s.eval.is_some()).count(), 5, "every 20 steps");
    assert!(before.drafts > 0 && before.drafts == after.drafts);
    // 3.95 -> 3.24 nats when written (the full loss: 3.14).
    assert!(after.nll < before.nll - 0.4, "held-out full NLL {:.3} -> {:.3}", before.nll, after.nll);
    assert!(after.slot_accuracy[0] > before.slot_accuracy[0], "held-out first-draft accuracy did not rise");
    // The loss ran over fewer columns than the vocabulary.
    assert!(log.iter().all(|s| s.columns < VOCAB as f64), "{}", log[0].columns);
    // Same seed, same run.
    let mut again = Vec::new();
    train(&t.config, &t.ckpt, &data, &dir.path().join("e"), &sampled(100), &cpu_device(), Some(30), &mut |s| again.push(s.loss)).unwrap();
    for (i, (a, b)) in again.iter().zip(&log).enumerate() {
        assert_eq!(*a, b.loss, "step {i}");
    }
}

#[test]
fn a_sampled_run_resumes_and_old_states_load() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let device = cpu_device();
    let mut full = Vec::new();
    train(&t.config, &t.ckpt, &data, &dir.path().join("a"), &sampled(20), &device, None, &mut |s| full.push(s.loss)).unwrap();
    let b = dir.path().join("b");
    let mut parts = Vec::new();
    train(&t.config, &t.ckpt, &data, &b, &sampled(20), &device, Some(10), &mut |s| parts.push(s.loss)).unwrap();
    // eval_every is not part of the run's identity.
    let resumed = TrainOptions { eval_every: 3, ..sampled(20) };
    let second = train(&t.config, &t.ckpt, &data, &b, &resumed, &device, None, &mut |s| parts.push(s.loss)).unwrap();
    assert_eq!(second.resumed_from, 10);
    assert_eq!(parts.len(), 20);
    for (i, (x, y)) in full.iter().zip(&parts).enumerate() {
        assert!((x - y).abs() < 1e-4 * x.abs().max(1.0), "step {i}: {x} vs {y}");
    }
    // Another loss on the same folder is refused.
    let other = TrainOptions { loss: LossKind::Full, ..sampled(20) };
    let e = train(&t.config, &t.ckpt, &data, &b, &other, &device, None, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("other options"), "{e}");

    // A state saved before the loss / eval / feature-scale options existed resumes as the full loss
    // without eval or scaling.
    let old = TrainOptions { layers: 1, block_size: 4, emb_dim: 16, gru_hidden: 16, steps: 12, lr: 3e-3, batch: 2, anchors: 8, save_every: 5, ..TrainOptions::default() };
    let c = dir.path().join("c");
    train(&t.config, &t.ckpt, &data, &c, &old, &device, Some(5), &mut |_| {}).unwrap();
    let state = c.join("train-state/state.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let o = v["options"].as_object_mut().unwrap();
    for k in ["loss", "frequent_candidates", "sampled_candidates", "eval_seqs", "eval_every", "scale_features"] {
        assert!(o.remove(k).is_some(), "{k} is saved");
    }
    std::fs::write(&state, serde_json::to_vec(&v).unwrap()).unwrap();
    let s = train(&t.config, &t.ckpt, &data, &c, &old, &device, None, &mut |_| {}).unwrap();
    assert_eq!((s.resumed_from, s.steps), (5, 12));
}


#[test]
fn the_log_q_correction_makes_the_partition_estimate_unbiased() {
    // One row of logits over the vocabulary; label 7. exp(sampled NLL) = Ẑ / exp(s_label), whose
    // mean over draws is Z / exp(s_label) = exp(full NLL) when the negatives carry −log q.
    let device = cpu_device();
    let logits: Vec<f32> = Rng::new(4).vec(VOCAB, 3.0);
    let full = burn::tensor::Tensor::<2>::from_data(burn::tensor::TensorData::new(logits.clone(), [1, VOCAB]), &device);
    let want = (to_vec(domino_train::model::nll(full, &[7]))[0] as f64).exp();
    let mut rng = Rng::new(8);
    let (draws, mut sum, mut uncorrected) = (3000, 0.0f64, 0.0f64);
    for _ in 0..draws {
        let c = Candidates::draw(&[7], &[], 8, VOCAB, &mut rng);
        let row: Vec<f32> = c.ids.iter().map(|&t| logits[t as usize]).collect();
        let t = burn::tensor::Tensor::<2>::from_data(burn::tensor::TensorData::new(row, [1, c.len()]), &device);
        sum += (to_vec(c.nll(t, &[7]))[0] as f64).exp();
        // Without the correction the same columns underestimate Z by far.
        let z: f64 = c.ids.iter().map(|&t| (logits[t as usize] as f64).exp()).sum();
        uncorrected += z / (logits[7] as f64).exp();
    }
    let (got, plain) = (sum / draws as f64, uncorrected / draws as f64);
    assert!((got / want - 1.0).abs() < 0.05, "mean exp(sampled NLL) {got:.4} vs exp(full NLL) {want:.4}");
    assert!(plain < 0.5 * want, "uncorrected {plain:.4} vs {want:.4}: the test cannot tell");
}
