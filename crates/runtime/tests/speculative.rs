//! Speculative decoding on the GPU: lossless against target-only greedy decoding, drafts identical to
//! the CPU reference drafter round by round, constructed always-accept pairs, and mismatch errors.

use domino_engine::testing::test_gpus;
use domino_engine::{Gpu, WeightFormat};
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::drafter_gpu::DrafterModel;
use domino_models::drafter_reference::{speculative_greedy, ReferenceDrafter};
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::{GenerateOptions, Session, SpeculativeOptions, SpeculativeSession};
use pollster::block_on;
use std::sync::Arc;

struct Pair {
    _dir: tempfile::TempDir,
    target_cfg: Qwen3Config,
    target_ckpt: Checkpoint,
    drafter_cfg: DrafterConfig,
    drafter_ckpt: Checkpoint,
}

fn pair(target: &TinySpec, drafter: &TinyDrafterSpec) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let (t, d) = (dir.path().join("target"), dir.path().join("drafter"));
    write_tiny_model(&t, target).unwrap();
    write_tiny_drafter(&d, target, drafter).unwrap();
    Pair {
        target_cfg: Qwen3Config::from_file(&t.join("config.json")).unwrap(),
        target_ckpt: Checkpoint::open(&t).unwrap(),
        drafter_cfg: DrafterConfig::from_file(&d.join("config.json")).unwrap(),
        drafter_ckpt: Checkpoint::open(&d).unwrap(),
        _dir: dir,
    }
}

fn target_spec() -> TinySpec {
    TinySpec { embed_scale: 4.0, ..TinySpec::default() }
}

fn load(gpu: &Arc<Gpu>, p: &Pair) -> (Qwen3Model, DrafterModel) {
    let target = Qwen3Model::load(gpu.clone(), p.target_cfg.clone(), &p.target_ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let drafter = DrafterModel::load(p.drafter_cfg.clone(), &p.drafter_ckpt, &target, WeightFormat::F32).unwrap();
    (target, drafter)
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions { max_tokens, ignore_eos: true, ..Default::default() }
}

#[test]
fn speculative_greedy_is_lossless_and_matches_the_cpu_reference() {
    let gpus = test_gpus();
    let prompts: [&[u32]; 3] = [&[1, 2, 3], &[100, 7, 250, 31, 31, 9, 44], &[300]];
    for kind in [DrafterKind::DFlash, DrafterKind::Domino] {
        for block in [2usize, 4, 8, 16] {
            if kind == DrafterKind::DFlash && block < 2 {
                continue;
            }
            let dspec = TinyDrafterSpec { kind, block_size: block, seed: 200 + block as u64, ..TinyDrafterSpec::default() };
            let p = pair(&target_spec(), &dspec);
            let ref_target = ReferenceModel::load(p.target_cfg.clone(), &p.target_ckpt, false).unwrap();
            for use_head in [true, false] {
                if kind == DrafterKind::DFlash && !use_head {
                    continue;
                }
                let mut ref_drafter = ReferenceDrafter::load(p.drafter_cfg.clone(), &p.drafter_ckpt, &ref_target, false).unwrap();
                for (name, gpu) in &gpus {
                    let (target, drafter) = load(gpu, &p);
                    let mut plain = Session::new(&target, 64).unwrap();
                    let mut spec = SpeculativeSession::new(&target, &drafter, 64).unwrap();
                    for prompt in prompts {
                        // Lengths that end mid-round as well as on round boundaries.
                        for max_tokens in [1usize, 7, 20] {
                            let want = block_on(plain.generate(prompt, &greedy(max_tokens), &mut |_| true)).unwrap().output_ids;
                            let opts = SpeculativeOptions { use_head, timing: false };
                            let (got, stats) = block_on(spec.generate(prompt, &greedy(max_tokens), &opts, &mut |_| true)).unwrap();
                            let ctx = format!("{name} {kind:?} B={block} head={use_head} prompt={prompt:?} max={max_tokens}");
                            assert_eq!(got.output_ids, want, "{ctx}: speculative output differs from target-only greedy");
                            let max_len = drafter.drafts_per_block() + 1;
                            assert!(stats.acceptance_lengths.iter().all(|&l| (1..=max_len).contains(&l)), "{ctx}: {:?}", stats.acceptance_lengths);
                            // Drafts identical to the CPU reference round by round => identical accepted counts.
                            let (ref_out, ref_lengths) = speculative_greedy(&ref_target, &mut ref_drafter, prompt, max_tokens, use_head);
                            assert_eq!(ref_out, want, "{ctx}: CPU reference");
                            let full_rounds = stats.acceptance_lengths.len().min(ref_lengths.len()).saturating_sub(1);
                            assert_eq!(stats.acceptance_lengths[..full_rounds], ref_lengths[..full_rounds], "{ctx}: per-round acceptance vs CPU reference");
                        }
                    }
                }
            }
        }
    }
}
