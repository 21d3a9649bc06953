//! Shared helpers: tiny targets and CPU-made training data (the GPU path is tested on its own).
#![allow(dead_code)]

use domino_models::drafter_reference::target_features;
use domino_models::reference::ReferenceModel;
use domino_models::testing::{write_tiny_model, TinySpec};
use domino_models::{Checkpoint, Qwen3Config};
use domino_models::drafter::DrafterConfig;
use domino_train::data::{prompts_hash, write_shard, DataMeta, Sequence, FORMAT};
use domino_train::model::{Dims, DrafterNet, Target};
use domino_train::rng::Rng;
use domino_train::weights::{build_net, init_weights, load_target};
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

/// A small target (hidden 32, vocab 64) of `layers` layers and `seqs` sequences of its data in
/// `dir/data` (4-token random prompts, `max_new` greedy tokens, features of layers 0 and 1).
pub fn small_target_with_data(dir: &Path, layers: usize, seqs: usize, max_new: usize) -> TinyTarget {
    let vocab = 64;
    let spec = TinySpec { hidden: 32, layers, heads: 2, kv_heads: 1, head_dim: 16, intermediate: 48, vocab, embed_scale: 2.0, seed: 9, ..TinySpec::default() };
    let t = tiny_target(&dir.join("target"), &spec);
    let mut rng = domino_train::rng::Rng::new(1);
    let prompts: Vec<Vec<u32>> = (0..seqs).map(|_| (0..4).map(|_| rng.below(vocab) as u32).collect()).collect();
    cpu_data(&t.reference, &prompts, max_new, &[0, 1], &dir.join("data"));
    t
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

/// The drafter `cfg` over `t`, initialised from it (seed 11), with its target and dims. A trained
/// head's output projection is not zero, so this one is made non-zero too: the head's correction
/// then shows in every output.
pub fn drafter_with_live_head(cfg: &DrafterConfig, t: &TinyTarget) -> (DrafterNet, Target, Dims) {
    let (mut w, _) = init_weights(cfg, &t.config, Some(&t.ckpt), 11).unwrap();
    if let Some((shape, v)) = w.get_mut("embed_proj.2.weight") {
        *v = Rng::new(3).vec(shape.iter().product(), 1.5);
    }
    let device = domino_train::cpu_device();
    let net = build_net(cfg, w, &device).unwrap();
    let target = load_target(&t.config, &t.ckpt, &device).unwrap();
    (net, target, Dims::new(cfg, &t.config))
}
