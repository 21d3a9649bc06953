//! Generation sessions against the CPU reference: greedy tokens identical for 32 tokens on every test
//! adapter configuration, stop tokens, max tokens, and clear errors for bad prompts.

use domino_engine::testing::test_gpus;
use domino_engine::{HostDType, WeightFormat};
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use domino_runtime::{GenerateOptions, RuntimeError, Session, StopReason};
use pollster::block_on;

fn load(spec: &TinySpec) -> (tempfile::TempDir, Qwen3Config, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), spec).unwrap();
    let config = Qwen3Config::from_file(&dir.path().join("config.json")).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, config, ckpt)
}

#[test]
fn greedy_generation_matches_reference_for_32_tokens() {
    let gpus = test_gpus();
    let specs = [
        // A larger embedding scale widens logit margins so f32 rounding cannot flip a greedy choice.
        TinySpec { embed_scale: 4.0, ..TinySpec::default() },
        TinySpec { head_dim: 16, heads: 8, kv_heads: 2, tied: true, dtype: HostDType::F32, embed_scale: 4.0, seed: 21, ..TinySpec::default() },
        TinySpec { head_dim: 128, heads: 2, kv_heads: 1, hidden: 96, shards: 2, embed_scale: 4.0, seed: 22, ..TinySpec::default() },
    ];
    for spec in specs {
        let (_dir, config, ckpt) = load(&spec);
        let prompts: [&[u32]; 2] = [&[1, 2, 3, 4, 5], &[200, 17, 300, 299, 42, 42, 42, 8, 9, 10, 11, 12, 13, 70]];
        for format in [WeightFormat::F32, WeightFormat::F16] {
            let reference = ReferenceModel::load(config.clone(), &ckpt, format == WeightFormat::F16).unwrap();
            let want: Vec<Vec<u32>> = prompts.iter().map(|p| reference.greedy(p, 32)).collect();
            for (name, gpu) in &gpus {
                let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, format, &mut |_, _, _| {}).unwrap();
                let mut session = Session::new(&model, 64).unwrap();
                for (p, w) in prompts.iter().zip(&want) {
                    let opts = GenerateOptions { max_tokens: 32, ignore_eos: true, ..Default::default() };
                    let mut streamed = Vec::new();
                    let g = block_on(session.generate(p, &opts, &mut |t| {
                        streamed.push(t);
                        true
                    }))
                    .unwrap();
                    assert_eq!(&g.output_ids, w, "{name} {format:?} head_dim {}: greedy tokens differ from the CPU reference", spec.head_dim);
                    assert_eq!(streamed, g.output_ids);
                    assert_eq!(g.stop_reason, StopReason::MaxTokens);
                    assert!(g.stats.decode_tokens_per_s > 0.0 && g.stats.prefill_tokens_per_s > 0.0);
                }
            }
        }
    }
}

#[test]
fn stops_on_stop_tokens_and_cancellation() {
    let (_dir, config, ckpt) = load(&TinySpec { embed_scale: 4.0, ..TinySpec::default() });
    let (_, gpu) = &test_gpus()[0];
    let model = Qwen3Model::load(gpu.clone(), config, &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let mut session = Session::new(&model, 64).unwrap();
    let prompt = [5u32, 6, 7];
    let free = block_on(session.generate(&prompt, &GenerateOptions { max_tokens: 20, ignore_eos: true, ..Default::default() }, &mut |_| true)).unwrap();
    // Declare the 4th generated token a stop token: generation ends there, including it.
    let stop = free.output_ids[3];
    let first = free.output_ids.iter().position(|&t| t == stop).unwrap();
    let opts = GenerateOptions { max_tokens: 20, stop_ids: vec![stop], ..Default::default() };
    let g = block_on(session.generate(&prompt, &opts, &mut |_| true)).unwrap();
    assert_eq!(g.output_ids, free.output_ids[..=first]);
    assert_eq!(g.stop_reason, StopReason::Eos);
    // ignore_eos runs past it.
    let opts = GenerateOptions { ignore_eos: true, ..opts };
    assert_eq!(block_on(session.generate(&prompt, &opts, &mut |_| true)).unwrap().output_ids, free.output_ids);
    // The callback can cancel.
    let mut n = 0;
    let g = block_on(session.generate(&prompt, &GenerateOptions { max_tokens: 20, ignore_eos: true, ..Default::default() }, &mut |_| {
        n += 1;
        n < 5
    }))
    .unwrap();
    assert_eq!(g.output_ids.len(), 5);
    assert_eq!(g.stop_reason, StopReason::Cancelled);
}

#[test]
fn bad_prompts_give_clear_errors() {
    let (_dir, config, ckpt) = load(&TinySpec { max_position: 40, ..TinySpec::default() });
    let (_, gpu) = &test_gpus()[0];
    let model = Qwen3Model::load(gpu.clone(), config, &ckpt, WeightFormat::F16, &mut |_, _, _| {}).unwrap();
    assert!(matches!(Session::new(&model, 41), Err(RuntimeError::ContextOverflow { .. })));
    let mut session = Session::new(&model, 40).unwrap();
    let opts = GenerateOptions { max_tokens: 10, ..Default::default() };
    let long: Vec<u32> = vec![1; 35];
    let e = block_on(session.generate(&long, &opts, &mut |_| true)).unwrap_err();
    assert!(e.to_string().contains("35 tokens + 10 new tokens exceeds the context of 40"), "{e}");
    let e = block_on(session.generate(&[1, 384, 2], &opts, &mut |_| true)).unwrap_err();
    assert!(e.to_string().contains("token id 384 at index 1 is outside the vocabulary (vocab_size 384)"), "{e}");
    assert!(matches!(block_on(session.generate(&[], &opts, &mut |_| true)), Err(RuntimeError::EmptyPrompt)));
    // The session still works after the errors.
    assert_eq!(block_on(session.generate(&[1, 2], &opts, &mut |_| true)).unwrap().output_ids.len(), 10);
}

#[test]
fn prefix_reuse_keeps_the_common_prefix_and_matches_the_reference() {
    let spec = TinySpec { embed_scale: 4.0, seed: 23, ..TinySpec::default() };
    let (_dir, config, ckpt) = load(&spec);
    let reference = ReferenceModel::load(config.clone(), &ckpt, false).unwrap();
    let first: Vec<u32> = vec![5, 6, 7, 8, 9, 10];
    for (name, gpu) in &test_gpus() {
        let model = Qwen3Model::load(gpu.clone(), config.clone(), &ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let mut session = Session::new(&model, 96).unwrap();
        session.set_prefix_reuse(true);
        let opts = GenerateOptions { max_tokens: 12, ignore_eos: true, ..Default::default() };
        let g = block_on(session.generate(&first, &opts, &mut |_| true)).unwrap();
        assert_eq!((g.output_ids.clone(), g.stats.cached_prompt_tokens), (reference.greedy(&first, 12), 0), "{name}: cold");
        // A second turn: the first prompt, the reply, more tokens; all but the reply's last token cached.
        let turn2: Vec<u32> = first.iter().chain(&g.output_ids).copied().chain([40, 41, 42]).collect();
        let g2 = block_on(session.generate(&turn2, &opts, &mut |_| true)).unwrap();
        assert_eq!(g2.stats.cached_prompt_tokens, first.len() + 12 - 1, "{name}");
        assert_eq!(g2.output_ids, reference.greedy(&turn2, 12), "{name}: second turn");
        // A cancelled generation keeps only what it fed; a diverging prompt reuses the shared head.
        let mut n = 0;
        let g3 = block_on(session.generate(&turn2[..10], &opts, &mut |_| {
            n += 1;
            n < 3
        }))
        .unwrap();
        assert_eq!(g3.stop_reason, StopReason::Cancelled);
        let branch: Vec<u32> = turn2[..8].iter().copied().chain([1, 2]).collect();
        let g4 = block_on(session.generate(&branch, &opts, &mut |_| true)).unwrap();
        assert_eq!((g4.output_ids, g4.stats.cached_prompt_tokens), (reference.greedy(&branch, 12), 8), "{name}: branch");
        // Off (the default): a whole prefill.
        session.set_prefix_reuse(false);
        let g5 = block_on(session.generate(&turn2, &opts, &mut |_| true)).unwrap();
        assert_eq!((g5.output_ids, g5.stats.cached_prompt_tokens), (g2.output_ids, 0), "{name}: off");
    }
}
