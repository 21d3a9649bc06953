//! Drafter weights by checkpoint name: initialisation (from the target where shapes allow), the
//! burn module built from them, the module read back for export, and the target's frozen tensors.

use crate::error::{Result, TrainError};
use crate::model::{DominoHead, DraftLayer, DrafterNet, Target};
use crate::rng::Rng;
use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};
use domino_engine::HostTensor;
use domino_models::checkpoint::{expect_tensor, WeightSource};
use domino_models::drafter::{drafter_tensor_plan, DrafterConfig, DrafterKind};
use domino_models::Qwen3Config;
use std::collections::HashMap;

/// Named f32 tensors with their shapes, in checkpoint naming (`drafter_tensor_plan`).
pub type Named = HashMap<String, (Vec<usize>, Vec<f32>)>;

/// One tensor of a target checkpoint as f32, shape-checked.
pub fn read_f32(src: &dyn WeightSource, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let t = expect_tensor(src, name, shape)?;
    let n: usize = shape.iter().product();
    Ok(HostTensor::new(name, t.dtype, 1, n, &t.data)?.to_f32())
}

/// Where each drafter tensor's initial value came from, for the log.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct InitReport {
    /// (drafter layer, target layer) pairs copied whole.
    pub copied_layers: Vec<(usize, usize)>,
    pub copied_final_norm: bool,
}

/// Target layer each drafter layer starts from: spread evenly over the target's depth, the last
/// drafter layer on the last target layer (whose output the target's final norm and lm_head read).
pub fn source_layer(l: usize, n: usize, target_layers: usize) -> usize {
    if n <= 1 {
        return target_layers - 1;
    }
    ((l * (target_layers - 1)) as f64 / (n - 1) as f64).round() as usize
}

/// Initial weights: matrices uniform with scale 1/sqrt(fan_in), norms 1, the Domino output
/// projection 0 (so the correction starts at zero and final logits start equal to base logits),
/// and every decoder layer (and the final norm) copied from the target when all its shapes match.
pub fn init_weights(cfg: &DrafterConfig, target_cfg: &Qwen3Config, target: Option<&dyn WeightSource>, seed: u64) -> Result<(Named, InitReport)> {
    let mut rng = Rng::new(seed);
    let mut out = Named::new();
    for (name, shape) in drafter_tensor_plan(cfg, target_cfg) {
        let n: usize = shape.iter().product();
        let v = if shape.len() == 1 {
            vec![1.0; n]
        } else if name.ends_with("embed_proj.2.weight") {
            vec![0.0; n]
        } else {
            rng.vec(n, 1.0 / (shape[1] as f32).sqrt())
        };
        out.insert(name, (shape, v));
    }
    let mut report = InitReport::default();
    let Some(src) = target else { return Ok((out, report)) };
    for l in 0..cfg.num_layers {
        let j = source_layer(l, cfg.num_layers, target_cfg.num_layers);
        let prefix = format!("layers.{l}.");
        let names: Vec<String> = out.keys().filter(|k| k.starts_with(&prefix)).cloned().collect();
        let mut copied = Vec::new();
        let mut complete = true;
        for name in &names {
            let shape = out[name].0.clone();
            let tname = format!("model.layers.{j}.{}", &name[prefix.len()..]);
            match read_f32(src, &tname, &shape) {
                Ok(v) => copied.push((name.clone(), shape, v)),
                // Llama targets have no per-head q/k norms: those stay at 1 (init above).
                Err(_) if is_head_norm(name) && !src.names().contains(&tname) => {}
                Err(_) => {
                    complete = false;
                    break;
                }
            }
        }
        // Whole layers only: a half-copied layer would mix scales.
        if complete {
            for (name, shape, v) in copied {
                out.insert(name, (shape, v));
            }
            report.copied_layers.push((l, j));
        }
    }
    if let Ok(v) = read_f32(src, "model.norm.weight", &[cfg.hidden_size]) {
        out.insert("norm.weight".into(), (vec![cfg.hidden_size], v));
        report.copied_final_norm = true;
    }
    Ok((out, report))
}

fn is_head_norm(name: &str) -> bool {
    name.ends_with("self_attn.q_norm.weight") || name.ends_with("self_attn.k_norm.weight")
}

fn take<const D: usize>(w: &mut Named, name: &str, device: &Device) -> Result<Param<Tensor<D>>> {
    let (shape, v) = w.remove(name).ok_or_else(|| TrainError::Invalid(format!("drafter weights lack '{name}'")))?;
    if shape.len() != D {
        return Err(TrainError::Invalid(format!("'{name}' has shape {shape:?}, expected rank {D}")));
    }
    Ok(Param::from_tensor(Tensor::from_data(TensorData::new(v, shape), device)))
}

/// Build the burn module from named weights (consumed).
pub fn build_net(cfg: &DrafterConfig, mut w: Named, device: &Device) -> Result<DrafterNet> {
    let w = &mut w;
    let mut layers = Vec::with_capacity(cfg.num_layers);
    for l in 0..cfg.num_layers {
        let n = |s: &str| format!("layers.{l}.{s}");
        layers.push(DraftLayer {
            input_layernorm: take(w, &n("input_layernorm.weight"), device)?,
            q_proj: take(w, &n("self_attn.q_proj.weight"), device)?,
            k_proj: take(w, &n("self_attn.k_proj.weight"), device)?,
            v_proj: take(w, &n("self_attn.v_proj.weight"), device)?,
            o_proj: take(w, &n("self_attn.o_proj.weight"), device)?,
            q_norm: take(w, &n("self_attn.q_norm.weight"), device)?,
            k_norm: take(w, &n("self_attn.k_norm.weight"), device)?,
            post_attention_layernorm: take(w, &n("post_attention_layernorm.weight"), device)?,
            gate_proj: take(w, &n("mlp.gate_proj.weight"), device)?,
            up_proj: take(w, &n("mlp.up_proj.weight"), device)?,
            down_proj: take(w, &n("mlp.down_proj.weight"), device)?,
        });
    }
    let head = match cfg.kind {
        DrafterKind::DFlash => None,
        DrafterKind::Domino => {
            let p = cfg.head_prefix.clone();
            Some(DominoHead {
                weight_ih: take(w, &format!("{p}prefix_gru.weight_ih_l0"), device)?,
                weight_hh: take(w, &format!("{p}prefix_gru.weight_hh_l0"), device)?,
                proj_in: take(w, &format!("{p}embed_proj.0.weight"), device)?,
                proj_out: take(w, &format!("{p}embed_proj.2.weight"), device)?,
            })
        }
    };
    Ok(DrafterNet {
        fc: take(w, "fc.weight", device)?,
        hidden_norm: take(w, "hidden_norm.weight", device)?,
        layers,
        norm: take(w, "norm.weight", device)?,
        head,
    })
}

fn values<const D: usize>(p: &Param<Tensor<D>>) -> Result<(Vec<usize>, Vec<f32>)> {
    let t = p.val();
    let shape = t.dims().to_vec();
    let v = t.into_data().convert::<f32>().try_to_vec::<f32>().map_err(|e| TrainError::Invalid(format!("reading a parameter: {e:?}")))?;
    Ok((shape, v))
}

/// The module's weights in checkpoint naming, in `drafter_tensor_plan` order.
pub fn net_tensors(net: &DrafterNet, cfg: &DrafterConfig, target_cfg: &Qwen3Config) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>> {
    let mut by_name: HashMap<String, (Vec<usize>, Vec<f32>)> = HashMap::new();
    by_name.insert("fc.weight".into(), values(&net.fc)?);
    by_name.insert("hidden_norm.weight".into(), values(&net.hidden_norm)?);
    by_name.insert("norm.weight".into(), values(&net.norm)?);
    for (l, layer) in net.layers.iter().enumerate() {
        let n = |s: &str| format!("layers.{l}.{s}");
        by_name.insert(n("input_layernorm.weight"), values(&layer.input_layernorm)?);
        by_name.insert(n("self_attn.q_proj.weight"), values(&layer.q_proj)?);
        by_name.insert(n("self_attn.k_proj.weight"), values(&layer.k_proj)?);
        by_name.insert(n("self_attn.v_proj.weight"), values(&layer.v_proj)?);
        by_name.insert(n("self_attn.o_proj.weight"), values(&layer.o_proj)?);
        by_name.insert(n("self_attn.q_norm.weight"), values(&layer.q_norm)?);
        by_name.insert(n("self_attn.k_norm.weight"), values(&layer.k_norm)?);
        by_name.insert(n("post_attention_layernorm.weight"), values(&layer.post_attention_layernorm)?);
        by_name.insert(n("mlp.gate_proj.weight"), values(&layer.gate_proj)?);
        by_name.insert(n("mlp.up_proj.weight"), values(&layer.up_proj)?);
        by_name.insert(n("mlp.down_proj.weight"), values(&layer.down_proj)?);
    }
    if let Some(h) = &net.head {
        let p = &cfg.head_prefix;
        by_name.insert(format!("{p}prefix_gru.weight_ih_l0"), values(&h.weight_ih)?);
        by_name.insert(format!("{p}prefix_gru.weight_hh_l0"), values(&h.weight_hh)?);
        by_name.insert(format!("{p}embed_proj.0.weight"), values(&h.proj_in)?);
        by_name.insert(format!("{p}embed_proj.2.weight"), values(&h.proj_out)?);
    }
    drafter_tensor_plan(cfg, target_cfg)
        .into_iter()
        .map(|(name, shape)| {
            let (s, v) = by_name.remove(&name).ok_or_else(|| TrainError::Invalid(format!("the module has no '{name}'")))?;
            if s != shape {
                return Err(TrainError::Invalid(format!("'{name}' has shape {s:?}, the format needs {shape:?}")));
            }
            Ok((name, shape, v))
        })
        .collect()
}

/// The target's embedding and lm_head (the embedding when tied) as frozen f32 tensors.
pub fn load_target(target_cfg: &Qwen3Config, src: &dyn WeightSource, device: &Device) -> Result<Target> {
    let (v, h) = (target_cfg.vocab_size, target_cfg.hidden_size);
    let embed = read_f32(src, "model.embed_tokens.weight", &[v, h])?;
    let lm_head = if target_cfg.tie_word_embeddings { embed.clone() } else { read_f32(src, "lm_head.weight", &[v, h])? };
    Ok(Target {
        embed: Tensor::from_data(TensorData::new(embed, [v, h]), device),
        lm_head: Tensor::from_data(TensorData::new(lm_head, [v, h]), device),
    })
}
