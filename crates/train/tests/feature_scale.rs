//! Training on column-scaled features (`--scale-features`): the scale is folded into the exported
//! `fc`, so the engine's reference drafter, reading raw features, drafts exactly what the trained
//! module drafts on scaled ones; and a whole training run's held-out numbers, computed in memory on
//! scaled features, are those of its export on raw features.

mod common;

use domino_models::checkpoint::Checkpoint;
use domino_models::drafter::{drafter_tensor_plan, DrafterConfig};
use domino_models::drafter_reference::{target_features, ReferenceDrafter};
use domino_models::testing::TinySpec;
use domino_train::data::{read_all, write_shard, Sequence};
use domino_train::draft::draft_block;
use domino_train::feature_scale::{column_multipliers, scale_sequence};
use domino_train::model::Dims;
use domino_train::rng::Rng;
use domino_train::train::{drafter_config, evaluate};
use domino_train::weights::{build_net, load_target, read_f32, Named};
use domino_train::{cpu_device, train, TrainOptions};
use half::f16;

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Feature columns are multiplied by these in turn: real residual streams mix columns of RMS 1 and
/// 1400, and a uniform scale would cancel in hidden_norm and test nothing.
const COLUMN_SCALES: [f32; 5] = [1.0, 30.0, 0.2, 400.0, 5.0];

fn spec() -> TinySpec {
    // embed_scale 3: feature columns far from RMS 1, so a missing fold changes the drafts.
    TinySpec { hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 48, vocab: 80, embed_scale: 3.0, seed: 5, ..TinySpec::default() }
}

#[test]
fn the_exported_fc_reads_raw_features_as_training_read_scaled_ones() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::tiny_target(&dir.path().join("target"), &spec());
    let opts = TrainOptions { layers: 1, block_size: 5, emb_dim: 8, gru_hidden: 12, ..TrainOptions::default() };
    let cfg = drafter_config(&opts, &t.config, vec![0, 2]).unwrap();
    let (net, target, dims) = common::drafter_with_live_head(&cfg, &t);

    let prompt: Vec<u32> = vec![3, 17, 42, 8, 61, 9, 30, 5, 77];
    let fwd = t.reference.forward(&prompt);
    let raw = target_features(&fwd, &cfg.target_layer_ids, t.config.hidden_size, 0..prompt.len());
    let width = raw.len() / prompt.len();
    let raw: Vec<f32> = raw.iter().enumerate().map(|(i, &x)| x * COLUMN_SCALES[(i % width) % 5]).collect();
    let seq = Sequence { tokens: prompt.clone(), prompt_len: prompt.len(), features: raw.iter().map(|&x| f16::from_f32(x)).collect() };
    let m = column_multipliers(&[&seq], width);
    let mut scaled = seq.clone();
    scale_sequence(&mut scaled, &m);
    let scaled: Vec<f32> = scaled.features.iter().map(|x| x.to_f32()).collect();
    let raw16: Vec<f32> = seq.features.iter().map(|x| x.to_f32()).collect();

    let out = dir.path().join("drafter");
    domino_train::export::export(&out, &net, &cfg, &t.config, Some(&m)).unwrap();
    let ecfg = DrafterConfig::from_file(&out.join("config.json")).unwrap();
    let mut reference = ReferenceDrafter::load(ecfg, &Checkpoint::open(&out).unwrap(), &t.reference, false).unwrap();
    let unfolded = dir.path().join("unfolded");
    domino_train::export::export(&unfolded, &net, &cfg, &t.config, None).unwrap();
    let mut wrong = ReferenceDrafter::load(cfg.clone(), &Checkpoint::open(&unfolded).unwrap(), &t.reference, false).unwrap();
    let mut differs = false;
    for anchor in [12u32, 55, 3] {
        reference.reset();
        let want = draft_block(&net, &dims, &target, &scaled, anchor, prompt.len(), true);
        let got = reference.draft_block(&raw16, anchor, prompt.len(), true);
        assert_eq!(got, want.drafts, "anchor {anchor}");
        let d = max_diff(&reference.last_trace().final_logits, &want.final_logits);
        assert!(d < 2e-3, "final logits differ by {d}");
        // Without the fold the same checkpoint drafts from other logits.
        wrong.reset();
        wrong.draft_block(&raw16, anchor, prompt.len(), true);
        differs |= max_diff(&wrong.last_trace().final_logits, &want.final_logits) > 0.05;
    }
    assert!(differs, "the fold changed nothing: this test would not catch a missing one");
}

/// The exported drafter as a burn module again (the checkpoint's f32 tensors by name).
fn load_export(dir: &std::path::Path, cfg: &DrafterConfig, target: &domino_models::Qwen3Config) -> Named {
    let ckpt = Checkpoint::open(dir).unwrap();
    drafter_tensor_plan(cfg, target).into_iter().map(|(name, shape)| {
        let v = read_f32(&ckpt, &name, &shape).unwrap();
        (name, (shape, v))
    }).collect()
}

#[test]
fn a_scaled_run_scores_the_same_held_out_numbers_as_its_export() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::tiny_target(&dir.path().join("target"), &spec());
    let mut rng = Rng::new(1);
    let prompts: Vec<Vec<u32>> = (0..12).map(|_| (0..4).map(|_| rng.below(80) as u32).collect()).collect();
    let data = dir.path().join("data");
    common::cpu_data(&t.reference, &prompts, 20, &[0, 2], &data);
    // Columns of very different scales, as in real residual streams.
    let (meta, mut seqs) = read_all(&data).unwrap();
    let width = meta.feature_width();
    for s in &mut seqs {
        for (i, x) in s.features.iter_mut().enumerate() {
            *x = f16::from_f32(x.to_f32() * COLUMN_SCALES[(i % width) % 5]);
        }
    }
    write_shard(&data, 0, &seqs, width).unwrap();
    let opts = TrainOptions {
        layers: 1, block_size: 4, emb_dim: 8, gru_hidden: 12, steps: 15, lr: 3e-3, batch: 2, anchors: 8, save_every: 15,
        eval_seqs: 3, scale_features: true, ..TrainOptions::default()
    };
    let mut last = None;
    let out = dir.path().join("d");
    train(&t.config, &t.ckpt, &data, &out, &opts, &cpu_device(), None, &mut |s| last = s.eval.clone()).unwrap();
    let in_memory = last.expect("held-out numbers at the end");

    let cfg = DrafterConfig::from_file(&out.join("config.json")).unwrap();
    let device = cpu_device();
    let net = build_net(&cfg, load_export(&out, &cfg, &t.config), &device).unwrap();
    let (_, seqs) = read_all(&data).unwrap();
    let held_out: Vec<&Sequence> = seqs[seqs.len() - 3..].iter().collect();
    let width = held_out[0].features.len() / held_out[0].tokens.len();
    let exported = evaluate(&net, &Dims::new(&cfg, &t.config), &load_target(&t.config, &t.ckpt, &device).unwrap(), &held_out, width, opts.anchors, &device);
    assert_eq!(exported.drafts, in_memory.drafts);
    // f16 rounding of the scaled features is the only difference.
    assert!((exported.nll - in_memory.nll).abs() < 2e-3 * in_memory.nll.abs().max(1.0), "{} vs {}", exported.nll, in_memory.nll);
    assert_eq!(exported.slot_accuracy, in_memory.slot_accuracy);
}
