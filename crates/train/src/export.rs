//! Export in the public formats: config.json (z-lab DFlash keys, plus the Domino head's keys unless
//! the drafter is a plain backbone) and model.safetensors with the published tensor names, in f32.
//! The config is parsed back with the engine's own `DrafterConfig` parser before anything is written.

use crate::error::{format_error, io, Result, TrainError};
use crate::feature_scale::fold_into_fc;
use crate::model::DrafterNet;
use crate::weights::net_tensors;
use domino_models::drafter::{DrafterConfig, DrafterKind};
use domino_models::Qwen3Config;
use serde_json::json;
use std::path::Path;

pub fn config_json(cfg: &DrafterConfig, target: &Qwen3Config) -> serde_json::Value {
    let mut dflash = json!({
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": cfg.target_layer_ids,
    });
    let mut root = json!({
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "hidden_act": "silu",
        "attention_bias": false,
        "tie_word_embeddings": false,
        "torch_dtype": "float32",
        "block_size": cfg.block_size,
        "num_target_layers": cfg.num_target_layers,
    });
    if cfg.kind == DrafterKind::Domino {
        dflash["projector_type"] = json!("domino");
        dflash["emb_dim"] = json!(cfg.emb_dim);
        dflash["gru_hidden_dim"] = json!(cfg.gru_hidden_dim);
        dflash["pure_draft_prefix_len"] = json!(cfg.pure_draft_prefix_len);
        dflash["shift_label"] = json!(true);
        root["emb_dim"] = json!(cfg.emb_dim);
    } else {
        dflash["shift_label"] = json!(cfg.shift_label);
    }
    root["dflash_config"] = dflash;
    root
}

/// Check that `cfg` survives the engine's parser and pairs with `target`.
pub fn validate(cfg: &DrafterConfig, target: &Qwen3Config) -> Result<DrafterConfig> {
    let text = serde_json::to_vec_pretty(&config_json(cfg, target)).map_err(|e| TrainError::Invalid(e.to_string()))?;
    let parsed = DrafterConfig::from_json(&text, Path::new("config.json"))?;
    parsed.validate_against(target)?;
    Ok(parsed)
}

/// Write `dir`/config.json and `dir`/model.safetensors (each through a temporary file and a rename,
/// so a reader never sees half a checkpoint). `fc_multipliers`: the feature scale the module was
/// trained with ([`crate::feature_scale`]), folded into `fc` so the checkpoint reads raw features.
pub fn export(dir: &Path, net: &DrafterNet, cfg: &DrafterConfig, target: &Qwen3Config, fc_multipliers: Option<&[f32]>) -> Result<()> {
    validate(cfg, target)?;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut tensors = net_tensors(net, cfg, target)?;
    if let Some(m) = fc_multipliers {
        for (name, _, v) in tensors.iter_mut().filter(|(name, _, _)| name == "fc.weight") {
            if v.len() % m.len() != 0 {
                return Err(TrainError::Invalid(format!("{name} has {} values, not a multiple of the {} feature columns", v.len(), m.len())));
            }
            fold_into_fc(v, m);
        }
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.into_iter().map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect())).collect();
    let path = dir.join("model.safetensors");
    let mut views = Vec::new();
    for (name, shape, data) in &bytes {
        let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).map_err(|e| format_error(&path, format!("{e:?}")))?;
        views.push((name.clone(), view));
    }
    let st = safetensors::serialize(views, None).map_err(|e| format_error(&path, format!("{e:?}")))?;
    write_atomic(&path, &st)?;
    let cpath = dir.join("config.json");
    let text = serde_json::to_vec_pretty(&config_json(cfg, target)).map_err(|e| format_error(&cpath, e.to_string()))?;
    write_atomic(&cpath, &text)
}

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}
