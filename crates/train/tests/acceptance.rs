//! End to end on a tiny target: `train data` through the GPU engine (checked against the CPU
//! reference), a short CPU training run, then speculative decoding with the exported drafter in the
//! engine on held-out prompts: mean acceptance above 1.5, and above the same drafter untrained.
//!
//! The target is a tiny random Qwen3 whose large embedding scale makes its greedy continuation a
//! near-deterministic walk on a random map of the current token (so it is learnable in minutes);
//! what this shows is that the pipeline (data, curriculum, export, engine) trains a drafter that
//! predicts the target, not how well a real drafter does on real text.

mod common;

use domino_engine::testing::test_gpus;
use domino_engine::WeightFormat;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::testing::TinySpec;
use domino_models::{Checkpoint, Qwen3Model};
use domino_runtime::{DraftLen, GenerateOptions, SpeculativeOptions, SpeculativeSession};
use domino_train::distill::{generate_data, DistillOptions};
use domino_train::rng::Rng;
use domino_train::train::drafter_config;
use domino_train::weights::{build_net, init_weights};
use domino_train::{cpu_device, train, TrainOptions};
use std::path::Path;

fn spec() -> TinySpec {
    TinySpec { hidden: 64, layers: 2, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 128, vocab: 128, embed_scale: 4.0, seed: 21, ..TinySpec::default() }
}

fn prompts(seed: u64, n: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(seed);
    (0..n).map(|_| (0..3 + rng.below(4)).map(|_| rng.below(128) as u32).collect()).collect()
}

fn mean_acceptance(target: &Qwen3Model, drafter_dir: &Path, prompts: &[Vec<u32>]) -> f64 {
    let cfg = DrafterConfig::from_file(&drafter_dir.join("config.json")).unwrap();
    let drafter = DrafterModel::load(cfg, &Checkpoint::open(drafter_dir).unwrap(), target, WeightFormat::F32).unwrap();
    let mut session = SpeculativeSession::new(target, &drafter, 128).unwrap();
    let opts = GenerateOptions { max_tokens: 48, ignore_eos: true, ..Default::default() };
    let spec = SpeculativeOptions { use_head: true, timing: false, draft_len: DraftLen::Fixed(usize::MAX), costs: None, refine_costs: true, lookup: false };
    let (mut sum, mut rounds) = (0usize, 0usize);
    for p in prompts {
        let (_, stats) = pollster::block_on(session.generate(p, &opts, &spec, &mut |_| true)).unwrap();
        sum += stats.acceptance_lengths.iter().sum::<usize>();
        rounds += stats.rounds;
    }
    sum as f64 / rounds as f64
}

#[test]
fn a_short_cpu_training_run_gives_mean_acceptance_above_1_5() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::tiny_target(&dir.path().join("target"), &spec());
    let (_, gpu) = test_gpus().into_iter().next().expect("a GPU test adapter");
    let target = Qwen3Model::load(gpu, t.config.clone(), &t.ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();

    // Data through the engine; the first sequence checked against the CPU reference.
    let data = dir.path().join("data");
    let train_prompts = prompts(1, 24);
    let dopts = DistillOptions { max_new_tokens: 64, shard_size: 8, target_layer_ids: vec![0, 1], stop_ids: vec![], ignore_eos: true, batch: 1 };
    let s = generate_data(&target, &train_prompts, &data, &dopts, &mut |_, _| {}).unwrap();
    assert_eq!((s.shards_written, s.shards_skipped, s.generated_tokens), (3, 0, 24 * 64));
    let (meta, seqs) = domino_train::data::read_all(&data).unwrap();
    let p0 = &train_prompts[0];
    assert_eq!(seqs[0].tokens[p0.len()..], t.reference.greedy(p0, 64)[..]);
    let fwd = t.reference.forward(&seqs[0].tokens);
    let want = domino_models::drafter_reference::target_features(&fwd, &[0, 1], meta.hidden_size, 0..seqs[0].tokens.len());
    let worst = seqs[0].features.iter().zip(&want).map(|(a, b)| (a.to_f32() - b).abs() / (1.0 + b.abs())).fold(0.0, f32::max);
    assert!(worst < 2e-3, "captured features differ from the reference by {worst}");
    // A second run finds every shard complete.
    let again = generate_data(&target, &train_prompts, &data, &dopts, &mut |_, _| {}).unwrap();
    assert_eq!((again.shards_written, again.shards_skipped), (0, 3));

    let opts = TrainOptions { layers: 1, block_size: 8, emb_dim: 32, gru_hidden: 64, steps: 150, lr: 2e-3, batch: 2, anchors: 24, save_every: 150, ..TrainOptions::default() };
    let drafter = dir.path().join("drafter");
    let summary = train(&t.config, &t.ckpt, &data, &drafter, &opts, &cpu_device(), None, &mut |_| {}).unwrap();

    // The same drafter before training, for comparison.
    let untrained = dir.path().join("untrained");
    let cfg = drafter_config(&opts, &t.config, vec![0, 1]).unwrap();
    let (w, _) = init_weights(&cfg, &t.config, Some(&t.ckpt), opts.seed).unwrap();
    domino_train::export::export(&untrained, &build_net(&cfg, w, &cpu_device()).unwrap(), &cfg, &t.config, None).unwrap();

    let held_out = prompts(99, 6);
    let before = mean_acceptance(&target, &untrained, &held_out);
    let after = mean_acceptance(&target, &drafter, &held_out);
    eprintln!("mean acceptance: untrained {before:.2}, trained {after:.2}; last step {:?}", summary.last);
    assert!(after > 1.5, "mean acceptance {after:.2} after training");
    assert!(after > before + 0.25, "training did not help: {before:.2} -> {after:.2}");
}
