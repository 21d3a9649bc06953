//! `train data --batch N` (prompts decoded together through the continuous batcher, features captured
//! as they go) writes the same folder, byte for byte, as `--batch 1` (one prompt at a time through
//! `Session`, then a separate capture forward), on every GPU test adapter: the same tokens, the same
//! feature bits, the same shards; with sequences stopping at EOS at different lengths, prompts longer
//! than one step's rows, shards that straddle batches, and a resumed batched run.

mod common;

use domino_engine::testing::test_gpus;
use domino_engine::WeightFormat;
use domino_models::testing::TinySpec;
use domino_models::Qwen3Model;
use domino_train::data::{read_all, shard_path};
use domino_train::distill::{generate_data, DistillOptions};
use domino_train::rng::Rng;
use std::path::Path;

fn spec() -> TinySpec {
    TinySpec { layers: 3, vocab: 96, seed: 7, ..TinySpec::default() }
}

/// Prompts of 1 to 90 tokens (longer than a batched step's 64 rows, so prefill is chunked).
fn prompts() -> Vec<Vec<u32>> {
    let mut rng = Rng::new(5);
    let lens = [3, 1, 90, 7, 12, 2, 70, 5, 9, 4, 33];
    lens.iter().map(|&n| (0..n).map(|_| rng.below(96) as u32).collect()).collect()
}

fn files(dir: &Path, shards: usize) -> Vec<Vec<u8>> {
    (0..shards).map(|i| std::fs::read(shard_path(dir, i)).unwrap()).collect()
}

#[test]
fn batched_data_equals_one_prompt_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::tiny_target(&dir.path().join("target"), &spec());
    let prompts = prompts();
    let max_new = 24;
    for (name, gpu) in test_gpus() {
        let model = Qwen3Model::load(gpu, t.config.clone(), &t.ckpt, WeightFormat::F32, &mut |_, _, _| {}).unwrap();
        let run = |sub: &str, batch: usize, stop_ids: &[u32], ignore_eos: bool| {
            let out = dir.path().join(format!("{name}-{sub}"));
            let opts = DistillOptions { max_new_tokens: max_new, shard_size: 4, target_layer_ids: vec![0, 2], stop_ids: stop_ids.to_vec(), ignore_eos, batch };
            let s = generate_data(&model, &prompts, &out, &opts, &mut |_, _| {}).unwrap();
            (out, s)
        };
        // Stop ids taken from the greedy continuations, so that some sequences stop early and at
        // different lengths (an independent check: the first continuation is the CPU reference's).
        let (full, _) = run("full", 1, &[], true);
        let (_, seqs) = read_all(&full).unwrap();
        assert_eq!(seqs[0].tokens[prompts[0].len()..], t.reference.greedy(&prompts[0], max_new)[..], "{name}");
        let stops = vec![seqs[1].tokens[prompts[1].len() + 5], seqs[4].tokens[prompts[4].len() + 11]];

        let (single, s1) = run("single", 1, &stops, false);
        let (_, reference) = read_all(&single).unwrap();
        let lens: Vec<usize> = reference.iter().map(|s| s.tokens.len() - s.prompt_len).collect();
        assert!(lens.iter().any(|&n| n < max_new) && lens.contains(&max_new), "{name}: continuation lengths {lens:?}");
        assert_eq!(s1.shards_written, 3);

        for batch in [3, 16] {
            let (batched, s) = run(&format!("batch{batch}"), batch, &stops, false);
            assert_eq!((s.shards_written, s.sequences, s.generated_tokens), (3, prompts.len(), s1.generated_tokens), "{name} batch {batch}");
            let (_, got) = read_all(&batched).unwrap();
            for (j, (a, b)) in got.iter().zip(&reference).enumerate() {
                assert_eq!(a.tokens, b.tokens, "{name} batch {batch}: tokens of prompt {j}");
                assert_eq!(a.prompt_len, b.prompt_len);
                let differ = a.features.iter().zip(&b.features).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
                assert!(a.features.len() == b.features.len() && differ == 0, "{name} batch {batch}: prompt {j}: {differ} feature values differ");
            }
            assert_eq!(files(&batched, 3), files(&single, 3), "{name} batch {batch}: shard files differ");
        }

        // A resumed batched run rewrites only the missing shard, identically.
        let (batched, _) = run("batch3", 3, &stops, false);
        std::fs::remove_file(shard_path(&batched, 1)).unwrap();
        let (_, s) = run("batch3", 3, &stops, false);
        assert_eq!((s.shards_written, s.shards_skipped), (1, 2), "{name}");
        assert_eq!(files(&batched, 3), files(&single, 3), "{name}: resumed shard differs");
    }
}
