//! burn's forward of an exported checkpoint against the engine's CPU reference drafter
//! (`drafter_reference.rs`, itself tested against the GPU drafter): same drafts, same logits, for a
//! Domino drafter (with and without its head) and a DFlash backbone; and the training forward,
//! teacher-forced on the drafts, reproduces the reference's final logits.

mod common;

use domino_models::checkpoint::Checkpoint;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_reference::{target_features, ReferenceDrafter};
use domino_models::testing::TinySpec;
use domino_train::draft::draft_block;
use domino_train::train::drafter_config;
use domino_train::{cpu_device, TrainOptions};

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn check(domino: bool) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec { hidden: 32, layers: 3, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 48, vocab: 80, embed_scale: 2.0, seed: 5, ..TinySpec::default() };
    let t = common::tiny_target(&dir.path().join("target"), &spec);
    let opts = TrainOptions { domino, layers: 2, block_size: 5, emb_dim: 8, gru_hidden: 12, ..TrainOptions::default() };
    let cfg = drafter_config(&opts, &t.config, vec![0, 2]).unwrap();
    let (net, target, dims) = common::drafter_with_live_head(&cfg, &t);
    let device = cpu_device();
    let out = dir.path().join("drafter");
    domino_train::export::export(&out, &net, &cfg, &t.config, None).unwrap();

    // The engine reads the export back with its own parser and loader.
    let ecfg = DrafterConfig::from_file(&out.join("config.json")).unwrap();
    assert_eq!(ecfg, cfg);
    let ckpt = Checkpoint::open(&out).unwrap();
    let mut reference = ReferenceDrafter::load(ecfg, &ckpt, &t.reference, false).unwrap();

    let prompt: Vec<u32> = vec![3, 17, 42, 8, 61, 9, 30];
    let fwd = t.reference.forward(&prompt);
    let features = target_features(&fwd, &cfg.target_layer_ids, t.config.hidden_size, 0..prompt.len());
    for (anchor, use_head) in [(12u32, true), (55, true), (12, false)] {
        reference.reset();
        let want = reference.draft_block(&features, anchor, prompt.len(), use_head);
        let trace = reference.last_trace().clone();
        let got = draft_block(&net, &dims, &target, &features, anchor, prompt.len(), use_head);
        assert_eq!(got.drafts, want, "drafts (domino {domino}, anchor {anchor}, head {use_head})");
        let d = max_diff(&got.base_logits, &trace.base_logits);
        assert!(d < 2e-3, "base logits differ by {d}");
        let d = max_diff(&got.final_logits, &trace.final_logits);
        assert!(d < 2e-3, "final logits differ by {d}");
        if domino && use_head {
            // The head changed something, or this test would not test it.
            assert!(max_diff(&trace.final_logits, &trace.base_logits) > 0.1);
            // Training's teacher-forced forward on [anchor, d1, …] gives the same final logits.
            let tokens: Vec<u32> = std::iter::once(anchor).chain(want.iter().copied()).take(cfg.block_size).collect();
            let f = burn::tensor::Tensor::<2>::from_data(
                burn::tensor::TensorData::new(features.clone(), [prompt.len(), features.len() / prompt.len()]),
                &device,
            );
            let out = net.forward(&dims, &target, f, &[prompt.len()], &[anchor], Some(&[tokens]));
            let fin: Vec<f32> = out.fin.unwrap().into_data().convert::<f32>().try_to_vec::<f32>().unwrap();
            let d = max_diff(&fin, &trace.final_logits);
            assert!(d < 2e-3, "teacher-forced final logits differ by {d}");
        }
    }
}

#[test]
fn burn_domino_drafter_matches_the_engine_reference() {
    check(true);
}

#[test]
fn burn_dflash_backbone_matches_the_engine_reference() {
    check(false);
}
