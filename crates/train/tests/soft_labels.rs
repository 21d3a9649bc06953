//! Soft labels (`train soft-labels`) and the distillation term of the loss (`--soft-weight`):
//! continuing the stored features through the rest of the target gives the f64 reference's
//! next-token distribution; the labels resume and are refused for other data; the loss is linear
//! in the weight and a one-hot soft label is the greedy label; training with them runs, resumes
//! and lowers the held-out NLL; a missing or mismatched soft-label folder is a clear error.

mod common;

use burn::tensor::Tensor;
use domino_train::cpu_target::CpuTarget;
use domino_train::data::{read_all, DataMeta};
use domino_train::loss::Candidates;
use domino_train::model::Dims;
use domino_train::rng::Rng;
use domino_train::schedule::SPEC_SLOT_DECAY;
use domino_train::soft_labels::{make_soft_labels, read_soft_labels, soft_dir, SoftRows};
use domino_train::train::{drafter_config, sequence_loss};
use domino_train::weights::{build_net, init_weights, load_target};
use domino_train::{cpu_device, train, LossKind, TrainOptions};

const VOCAB: usize = 64;

/// A 3-layer target and 24 sequences with features of layers 0 and 1, so that soft labels
/// continue through layer 2.
fn setup(dir: &std::path::Path) -> common::TinyTarget {
    common::small_target_with_data(dir, 3, 24, 20)
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let z = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&v| v as f64 - z).collect()
}

#[test]
fn soft_labels_are_the_reference_distribution_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
    let s = make_soft_labels(&target, &data, 5, &mut |_, _| {}).unwrap();
    assert_eq!((s.shards_written, s.shards_skipped), (1, 0));
    let (meta, seqs) = read_all(&data).unwrap();
    assert_eq!(s.rows, seqs.iter().map(|q| q.tokens.len() - q.prompt_len).sum::<usize>());
    // The continuations are the target's greedy text, so its top candidate is the next token
    // (f16 features may flip a near-tie).
    assert!(s.top1_agrees as f64 >= 0.95 * s.rows as f64, "{} of {}", s.top1_agrees, s.rows);
    let soft = read_soft_labels(&data, &meta, &seqs).unwrap();
    let mut worst = 0f64;
    for (seq, rows) in seqs.iter().zip(&soft) {
        let logits = t.reference.forward(&seq.tokens).logits;
        for pos in seq.prompt_len - 1..seq.tokens.len() - 1 {
            let want = log_softmax(&logits[pos * VOCAB..][..VOCAB]);
            let (ids, logp) = rows.at(pos).expect("a row for every continuation position");
            assert_eq!(ids.len(), 5);
            for (j, (&id, &l)) in ids.iter().zip(logp).enumerate() {
                worst = worst.max((l as f64 - want[id as usize]).abs());
                // Ordered by falling probability, and nothing left out is more likely than the last kept.
                if j > 0 {
                    assert!(logp[j - 1] >= l);
                }
            }
            let last = want[ids[4] as usize];
            let above = want.iter().filter(|&&w| w > last + 1e-2).count();
            assert!(above <= 4, "position {pos}: {above} tokens more likely than the fifth kept");
        }
    }
    assert!(worst < 2e-2, "log-probabilities differ from the reference by {worst}");
    // A second run finds every shard done; other settings are refused.
    let again = make_soft_labels(&target, &data, 5, &mut |_, _| {}).unwrap();
    assert_eq!((again.shards_written, again.shards_skipped), (0, 1));
    let e = make_soft_labels(&target, &data, 7, &mut |_, _| {}).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("other settings"), "{e}");
}

#[test]
fn a_missing_or_foreign_soft_label_folder_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let opts = TrainOptions { layers: 1, block_size: 4, emb_dim: 8, gru_hidden: 8, steps: 2, soft_weight: 0.5, ..TrainOptions::default() };
    let e = train(&t.config, &t.ckpt, &data, &dir.path().join("d"), &opts, &cpu_device(), None, &mut |_| {}).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("train soft-labels"), "{e}");
    let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
    make_soft_labels(&target, &data, 3, &mut |_, _| {}).unwrap();
    // Labels of other data: the prompts hash differs.
    let mut meta = DataMeta::read(&data).unwrap();
    let hash = std::mem::replace(&mut meta.prompts_hash, "0000000000000000".into());
    meta.write(&data).unwrap();
    let e = train(&t.config, &t.ckpt, &data, &dir.path().join("d"), &opts, &cpu_device(), None, &mut |_| {}).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("other data"), "{e}");
    let bad = TrainOptions { soft_weight: 1.5, ..opts.clone() };
    let e = train(&t.config, &t.ckpt, &data, &dir.path().join("e"), &bad, &cpu_device(), None, &mut |_| {}).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("--soft-weight"), "{e}");
    // A damaged label file is named, never a panic.
    meta.prompts_hash = hash;
    meta.write(&data).unwrap();
    let shard = soft_dir(&data).join("shard-00000.safetensors");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let e = train(&t.config, &t.ckpt, &data, &dir.path().join("f"), &opts, &cpu_device(), None, &mut |_| {}).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("shard-00000"), "{e}");
}

fn scalar(t: Tensor<1>) -> f64 {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()[0] as f64
}

#[test]
fn the_soft_term_is_linear_in_its_weight_and_one_hot_labels_are_the_greedy_loss() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let (_, seqs) = read_all(&dir.path().join("data")).unwrap();
    let seq = &seqs[0];
    let width = seq.features.len() / seq.tokens.len();
    let device = cpu_device();
    for domino in [true, false] {
        let opts = TrainOptions { domino, layers: 1, block_size: 4, emb_dim: 8, gru_hidden: 12, ..TrainOptions::default() };
        let cfg = drafter_config(&opts, &t.config, vec![0, 1]).unwrap();
        let (w, _) = init_weights(&cfg, &t.config, Some(&t.ckpt), 11).unwrap();
        let net = build_net(&cfg, w, &device).unwrap();
        let target = load_target(&t.config, &t.ckpt, &device).unwrap();
        let dims = Dims::new(&cfg, &t.config);
        let anchors: Vec<usize> = (seq.prompt_len..seq.prompt_len + 10).collect();
        let first_pos = seq.prompt_len - 1;
        let positions = first_pos..seq.tokens.len() - 1;
        // One-hot on the data's next token: the soft term is the greedy cross-entropy.
        let one_hot = SoftRows { top_k: 1, first_pos, ids: positions.clone().map(|p| seq.tokens[p + 1]).collect(), logp: vec![0.0; positions.len()] };
        // Three candidates of arbitrary probabilities, the label not always among them.
        let mut rng = Rng::new(4);
        let spread = SoftRows {
            top_k: 3,
            first_pos,
            ids: positions.clone().flat_map(|_| rng.distinct(0, VOCAB, 3)).map(|i| i as u32).collect(),
            logp: positions.clone().flat_map(|_| [-0.5f32, -1.5, -2.0]).collect(),
        };
        let loss = |soft: Option<(&SoftRows, f64)>, sampled: bool| {
            let mut rng = Rng::new(5);
            let mut draw = |fixed: &[u32]| Candidates::draw(fixed, &[], 7, VOCAB, &mut rng);
            let candidates: Option<&mut dyn FnMut(&[u32]) -> Candidates> = if sampled { Some(&mut draw) } else { None };
            scalar(sequence_loss(&net, &dims, &target, seq, width, &anchors, 0.3, candidates, soft, SPEC_SLOT_DECAY, &device).0)
        };
        for sampled in [false, true] {
            let hard = loss(None, sampled);
            let tag = format!("domino {domino}, sampled {sampled}");
            assert!((loss(Some((&one_hot, 0.7)), sampled) - hard).abs() < 1e-5 * hard, "{tag}");
            let (l0, l1, lh) = (loss(Some((&spread, 0.0)), sampled), loss(Some((&spread, 1.0)), sampled), loss(Some((&spread, 0.5)), sampled));
            if !sampled {
                assert!((l0 - hard).abs() < 1e-6 * hard, "{tag}");
            }
            assert!((l1 - l0).abs() > 1e-3, "{tag}: the soft labels changed nothing");
            assert!((lh - (l0 + l1) / 2.0).abs() < 1e-4 * l1.max(l0), "{tag}: {l0} {lh} {l1}");
        }
    }
}

#[test]
fn distilled_training_lowers_the_held_out_nll_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
    make_soft_labels(&target, &data, 8, &mut |_, _| {}).unwrap();
    let device = cpu_device();
    let opts = |loss| TrainOptions {
        layers: 1,
        block_size: 4,
        emb_dim: 16,
        gru_hidden: 16,
        steps: 60,
        lr: 2e-3,
        batch: 2,
        anchors: 8,
        save_every: 10,
        loss,
        frequent_candidates: 4,
        sampled_candidates: 8,
        eval_seqs: 4,
        soft_weight: 0.5,
        ..TrainOptions::default()
    };
    for loss in [LossKind::Full, LossKind::Sampled] {
        let out = dir.path().join(format!("{loss:?}"));
        let mut losses = Vec::new();
        let s = train(&t.config, &t.ckpt, &data, &out, &opts(loss), &device, Some(30), &mut |s| losses.push(s.loss)).unwrap();
        let before = s.initial_eval.expect("held-out numbers before training");
        let s = train(&t.config, &t.ckpt, &data, &out, &opts(loss), &device, None, &mut |s| losses.push(s.loss)).unwrap();
        assert_eq!(s.resumed_from, 30);
        let after = s.last.eval.expect("held-out numbers at the end");
        assert!(after.nll < before.nll - 0.3, "{loss:?}: held-out NLL {:.3} -> {:.3}", before.nll, after.nll);
        // The same run without stopping gives the same losses.
        let mut straight = Vec::new();
        train(&t.config, &t.ckpt, &data, &dir.path().join(format!("{loss:?}-straight")), &opts(loss), &device, None, &mut |s| straight.push(s.loss)).unwrap();
        assert_eq!(straight, losses, "{loss:?}");
    }
}
