//! Shared helpers: tiny targets and CPU-made training data (the GPU path is tested on its own).
#![allow(dead_code)]

use domino_models::drafter_reference::target_features;
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config};
use domino_train::data::{prompts_hash, write_shard, DataMeta, Sequence, FORMAT};
use std::path::Path;

pub struct TinyTarget {
    pub config: Qwen3Config,
    pub ckpt: Checkpoint,
    pub reference: ReferenceModel,
}

pub fn tiny_target(dir: &Path, spec: &TinySpec) -> TinyTarget {
    write_tiny_model(dir, spec).unwrap();
    let config = Qwen3Config::from_file(&dir.join("config.json")).unwrap();
    let ckpt = Checkpoint::open(dir).unwrap();
    let reference = ReferenceModel::load(config.clone(), &ckpt, false).unwrap();
    TinyTarget { config, ckpt, reference }
}

/// Self-distillation data made with the CPU reference: greedy continuations and their features.
pub fn cpu_data(model: &ReferenceModel, prompts: &[Vec<u32>], max_new: usize, ids: &[usize], out: &Path) {
    let c = model.config();
    let meta = DataMeta {
        format: FORMAT.into(),
        hidden_size: c.hidden_size,
        num_target_layers: c.num_layers,
        vocab_size: c.vocab_size,
        target_layer_ids: ids.to_vec(),
        max_new_tokens: max_new,
        shard_size: prompts.len(),
        num_prompts: prompts.len(),
        prompts_hash: prompts_hash(prompts),
    };
    std::fs::create_dir_all(out).unwrap();
    meta.write(out).unwrap();
    let seqs: Vec<Sequence> = prompts
        .iter()
        .map(|p| {
            let tokens: Vec<u32> = p.iter().copied().chain(model.greedy(p, max_new)).collect();
            let fwd = model.forward(&tokens);
            let f = target_features(&fwd, ids, c.hidden_size, 0..tokens.len());
            Sequence { prompt_len: p.len(), features: f.iter().map(|&x| half::f16::from_f32(x)).collect(), tokens }
        })
        .collect();
    write_shard(out, 0, &seqs, meta.feature_width()).unwrap();
}
