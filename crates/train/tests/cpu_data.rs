//! `train data --device cpu`: the CPU target's batched forward against the f64 reference
//! (`ReferenceModel`: greedy tokens equal, features within float rounding) and against the GPU path
//! (the same tokens and, up to rounding, the same features); Qwen3 (q/k norms, untied) and
//! Llama-style (no q/k norms, tied) targets; sequences that stop at EOS at different lengths while
//! others are still decoding; resuming; bad rows and a target too large for memory refused with a
//! clear error.

mod common;

use domino_engine::testing::test_gpus;
use domino_engine::WeightFormat;
use domino_models::testing::TinySpec;
use domino_models::Qwen3Model;
use domino_train::cpu_target::{CpuTarget, Row};
use domino_train::data::{read_all, shard_path};
use domino_train::distill::{generate_data, generate_data_cpu, DistillOptions};
use domino_train::rng::Rng;

fn prompts(vocab: usize) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(11);
    [5, 1, 40, 3, 17, 8, 2].iter().map(|&n| (0..n).map(|_| rng.below(vocab) as u32).collect()).collect()
}

fn opts(batch: usize, stop_ids: Vec<u32>, ignore_eos: bool) -> DistillOptions {
    DistillOptions { max_new_tokens: 20, shard_size: 3, target_layer_ids: vec![0, 2], stop_ids, ignore_eos, batch }
}

/// Largest |a - b| relative to the largest |b|.
fn rel_diff(a: &[half::f16], b: &[half::f16]) -> f32 {
    let scale = b.iter().map(|x| x.to_f32().abs()).fold(1e-6, f32::max);
    a.iter().zip(b).map(|(x, y)| (x.to_f32() - y.to_f32()).abs()).fold(0.0, f32::max) / scale
}

#[test]
fn cpu_data_matches_the_reference_on_qwen3_and_llama_targets() {
    for (name, spec) in [
        ("qwen3", TinySpec { layers: 3, vocab: 96, seed: 3, ..TinySpec::default() }),
        ("llama", TinySpec { layers: 3, vocab: 96, seed: 4, qk_norm: false, tied: true, ..TinySpec::default() }),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let t = common::tiny_target(&dir.path().join("target"), &spec);
        let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
        let prompts = prompts(96);
        // The reference: each prompt alone, f64 sums, the whole sequence recomputed every token.
        let reference = dir.path().join("reference");
        common::cpu_data(&t.reference, &prompts, 20, &[0, 2], &reference);
        let (_, want) = read_all(&reference).unwrap();
        let out = dir.path().join("cpu");
        let s = generate_data_cpu(&target, &prompts, &out, &opts(4, vec![], true), &mut |_, _| {}).unwrap();
        assert_eq!((s.shards_written, s.sequences, s.generated_tokens), (3, prompts.len(), 20 * prompts.len()), "{name}");
        let (_, got) = read_all(&out).unwrap();
        for (j, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.tokens, b.tokens, "{name}: tokens of prompt {j}");
            assert_eq!(a.features.len(), b.features.len(), "{name}: prompt {j}");
            let diff = rel_diff(&a.features, &b.features);
            assert!(diff < 2e-3, "{name}: prompt {j}: features differ by {diff} (relative)");
        }
    }
}

#[test]
fn cpu_data_equals_the_gpu_path_with_early_stops_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec { layers: 3, vocab: 96, seed: 7, ..TinySpec::default() };
    let t = common::tiny_target(&dir.path().join("target"), &spec);
    let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
    let prompts = prompts(96);
    // Stop ids from the greedy continuations, so that sequences stop early at different lengths.
    let full = dir.path().join("full");
    generate_data_cpu(&target, &prompts, &full, &opts(2, vec![], true), &mut |_, _| {}).unwrap();
    let (_, seqs) = read_all(&full).unwrap();
    let stops = vec![seqs[1].tokens[prompts[1].len() + 4], seqs[4].tokens[prompts[4].len() + 9]];

    let cpu = dir.path().join("cpu");
    let s = generate_data_cpu(&target, &prompts, &cpu, &opts(3, stops.clone(), false), &mut |_, _| {}).unwrap();
    let (_, got) = read_all(&cpu).unwrap();
    let lens: Vec<usize> = got.iter().map(|s| s.tokens.len() - s.prompt_len).collect();
    assert!(lens.iter().any(|&n| n < 20) && lens.contains(&20), "continuation lengths {lens:?}");
    // Batch 1 and batch 7 decode the same text.
    for batch in [1, 7] {
        let other = dir.path().join(format!("cpu{batch}"));
        generate_data_cpu(&target, &prompts, &other, &opts(batch, stops.clone(), false), &mut |_, _| {}).unwrap();
        let (_, b) = read_all(&other).unwrap();
        for (j, (x, y)) in got.iter().zip(&b).enumerate() {
            assert_eq!(x.tokens, y.tokens, "batch {batch}: prompt {j}");
            assert!(rel_diff(&x.features, &y.features) < 1e-3, "batch {batch}: prompt {j}");
        }
    }
    let (gpu_name, gpu) = test_gpus().into_iter().next().expect("a GPU test adapter");
    let model = Qwen3Model::load(gpu, t.config.clone(), &t.ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
    let on_gpu = dir.path().join("gpu");
    let g = generate_data(&model, &prompts, &on_gpu, &opts(3, stops.clone(), false), &mut |_, _| {}).unwrap();
    assert_eq!((g.shards_written, g.sequences, g.generated_tokens), (s.shards_written, s.sequences, s.generated_tokens), "{gpu_name}");
    let (_, want) = read_all(&on_gpu).unwrap();
    for (j, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.tokens, b.tokens, "{gpu_name}: tokens of prompt {j}");
        let diff = rel_diff(&a.features, &b.features);
        assert!(diff < 2e-3, "{gpu_name}: prompt {j}: features differ by {diff} (relative)");
    }

    // A resumed run rewrites only the missing shard, with the same tokens (its steps hold other rows
    // than before, and the CPU GEMM is not bit-invariant to the row count, so the features agree to
    // rounding rather than bit for bit).
    std::fs::remove_file(shard_path(&cpu, 1)).unwrap();
    let r = generate_data_cpu(&target, &prompts, &cpu, &opts(3, stops, false), &mut |_, _| {}).unwrap();
    assert_eq!((r.shards_written, r.shards_skipped), (1, 2));
    let (_, resumed) = read_all(&cpu).unwrap();
    for (j, (a, b)) in resumed.iter().zip(&got).enumerate() {
        assert_eq!(a.tokens, b.tokens, "resumed: prompt {j}");
        assert!(rel_diff(&a.features, &b.features) < 1e-3, "resumed: prompt {j}");
    }
}

#[test]
fn bad_rows_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::tiny_target(&dir.path().join("target"), &TinySpec { layers: 3, vocab: 96, ..TinySpec::default() });
    let target = CpuTarget::load(t.config.clone(), &t.ckpt).unwrap();
    let mut caches = vec![target.new_cache(4)];
    let row = |seq, pos, token| Row { seq, pos, token, logits: true };
    let err = |rows: &[Row], caches: &mut [_]| target.step(rows, caches, &[0]).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err(&[row(0, 0, 96)], &mut caches).contains("outside the vocabulary"));
    assert!(err(&[row(0, 4, 1)], &mut caches).contains("past the cache"));
    assert!(err(&[row(1, 0, 1)], &mut caches).contains("unknown sequence"));
    // A target too large for the host's memory is refused before any weight is read.
    #[cfg(target_os = "linux")]
    {
        let mut huge = t.config.clone();
        huge.num_layers = 100_000;
        huge.intermediate_size = 100_000;
        let e = CpuTarget::load(huge, &t.ckpt).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("GB of f32 weights") && e.contains("--device gpu"), "{e}");
    }
    // A prompt id outside the vocabulary fails the data run, naming the id.
    let out = dir.path().join("bad");
    let e = generate_data_cpu(&target, &[vec![1, 500]], &out, &opts(2, vec![], true), &mut |_, _| {}).unwrap_err();
    assert!(e.to_string().contains("500"), "{e}");
}
