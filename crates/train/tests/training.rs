//! Training on a tiny problem: the loss falls, per-draft accuracy rises, the export loads in the
//! engine, and a run interrupted by `stop_after` resumes to exactly the uninterrupted run.

mod common;

use domino_models::drafter::DrafterConfig;
use domino_models::testing::TinySpec;
use domino_train::rng::Rng;
use domino_train::{cpu_device, train, StepStats, TrainOptions};

fn setup(dir: &std::path::Path) -> common::TinyTarget {
    let spec = TinySpec { hidden: 32, layers: 2, heads: 2, kv_heads: 1, head_dim: 16, intermediate: 48, vocab: 64, embed_scale: 2.0, seed: 9, ..TinySpec::default() };
    let t = common::tiny_target(&dir.join("target"), &spec);
    let mut rng = Rng::new(1);
    let prompts: Vec<Vec<u32>> = (0..6).map(|_| (0..4).map(|_| rng.below(64) as u32).collect()).collect();
    common::cpu_data(&t.reference, &prompts, 24, &[0, 1], &dir.join("data"));
    t
}

fn opts(steps: usize) -> TrainOptions {
    TrainOptions { layers: 1, block_size: 4, emb_dim: 16, gru_hidden: 16, steps, lr: 3e-3, batch: 2, anchors: 8, save_every: 10, ..TrainOptions::default() }
}

#[test]
fn loss_falls_and_the_export_loads() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let mut log: Vec<StepStats> = Vec::new();
    let out = dir.path().join("drafter");
    let s = train(&t.config, &t.ckpt, &dir.path().join("data"), &out, &opts(120), &cpu_device(), None, &mut |s| log.push(s.clone())).unwrap();
    assert_eq!(log.len(), 120);
    assert_eq!(s.steps, 120);
    let mean = |xs: &[StepStats]| xs.iter().map(|s| s.loss).sum::<f64>() / xs.len() as f64;
    let (first, last) = (mean(&log[..4]), mean(&log[110..]));
    assert!(last < 0.7 * first, "loss {first:.3} -> {last:.3}");
    // λ falls from 1 to 0 over the run (decay_ratio 1).
    assert_eq!(log[0].lambda, 1.0);
    assert!(log[119].lambda < 0.01);
    let acc = |xs: &[StepStats]| xs.iter().map(|s| s.slot_accuracy[0]).sum::<f64>() / xs.len() as f64;
    assert!(acc(&log[110..]) > acc(&log[..4]), "first-draft accuracy did not rise");
    let cfg = DrafterConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!((cfg.block_size, cfg.num_layers, cfg.emb_dim), (4, 1, Some(16)));
    cfg.validate_against(&t.config).unwrap();
}

#[test]
fn an_interrupted_run_resumes_to_the_same_result() {
    let dir = tempfile::tempdir().unwrap();
    let t = setup(dir.path());
    let data = dir.path().join("data");
    let device = cpu_device();
    let mut full = Vec::new();
    train(&t.config, &t.ckpt, &data, &dir.path().join("a"), &opts(20), &device, None, &mut |s| full.push(s.loss)).unwrap();
    let mut parts = Vec::new();
    let b = dir.path().join("b");
    let first = train(&t.config, &t.ckpt, &data, &b, &opts(20), &device, Some(10), &mut |s| parts.push(s.loss)).unwrap();
    assert_eq!((first.resumed_from, first.steps), (0, 10));
    let second = train(&t.config, &t.ckpt, &data, &b, &opts(20), &device, None, &mut |s| parts.push(s.loss)).unwrap();
    assert_eq!((second.resumed_from, second.steps), (10, 20));
    assert_eq!(parts.len(), 20);
    for (i, (a, b)) in full.iter().zip(&parts).enumerate() {
        assert!((a - b).abs() < 1e-4 * a.abs().max(1.0), "step {i}: {a} vs {b}");
    }
    let wa = std::fs::read(dir.path().join("a/model.safetensors")).unwrap();
    let wb = std::fs::read(b.join("model.safetensors")).unwrap();
    assert_eq!(wa.len(), wb.len());
    // Other options on the same folder are refused, naming the saved run.
    let e = train(&t.config, &t.ckpt, &data, &b, &opts(30), &device, None, &mut |_| {}).unwrap_err().to_string();
    assert!(e.contains("other options"), "{e}");
}
