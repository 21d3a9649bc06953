//! Qwen3 config.json: parsed strictly. Fields we use are typed; fields Hugging Face writes that do not
//! change the forward are accepted; anything else is an error naming the field, so a checkpoint we would
//! silently mis-run (rope scaling, sliding windows, biases) is refused instead.

use crate::error::{ModelError, Result};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Fields written by transformers that do not affect inference here.
const IGNORED_FIELDS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "model_type",
    "torch_dtype",
    "dtype",
    "transformers_version",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "bos_token_id",
    "pad_token_id",
    "max_window_layers",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "quantization_config",
    "layer_types",
    "pretraining_tp",
    "mlp_bias",
    "attention_bias",
    "use_sliding_window",
    "sliding_window",
    "rope_scaling",
    "rope_parameters",
    "eos_token_id",
    "tie_word_embeddings",
    "head_dim",
    "hidden_act",
];

#[derive(Debug, Clone, Deserialize)]
struct RawConfig {
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    eos_token_id: Option<serde_json::Value>,
    hidden_act: Option<String>,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    use_sliding_window: bool,
    rope_scaling: Option<serde_json::Value>,
    /// transformers >= 5 moves rope_theta here: {"rope_type": "default", "rope_theta": ...}.
    rope_parameters: Option<serde_json::Value>,
    layer_types: Option<Vec<String>>,
    #[serde(default)]
    mlp_bias: bool,
}

/// The Qwen3 (and Llama-family) target architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
    /// Qwen3 has per-head q_norm / k_norm; Llama does not.
    pub qk_norm: bool,
}

impl Qwen3Config {
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = read_file(path)?;
        Self::from_json(&bytes, path)
    }

    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| ModelError::Json { path: path.into(), message: e.to_string() })?;
        let obj = value.as_object().ok_or_else(|| ModelError::Config { path: path.into(), message: "expected a JSON object".into() })?;
        let cfg_err = |message: String| ModelError::Config { path: path.into(), message };

        let model_type = obj.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
        let arch = obj
            .get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .unwrap_or("")
            .to_string();
        let qk_norm = match (model_type, arch.as_str()) {
            ("qwen3", _) | (_, "Qwen3ForCausalLM") => true,
            ("llama", _) | (_, "LlamaForCausalLM") => false,
            _ => {
                let shown = if arch.is_empty() { format!("model_type '{model_type}'") } else { arch };
                return Err(ModelError::UnknownArchitecture { path: path.into(), arch: shown });
            }
        };
        let known: Vec<&str> = [
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
            "rms_norm_eps",
            "rope_theta",
            "max_position_embeddings",
        ]
        .into_iter()
        .chain(IGNORED_FIELDS.iter().copied())
        .collect();
        for key in obj.keys() {
            if !known.contains(&key.as_str()) {
                return Err(cfg_err(format!("unknown config field '{key}'")));
            }
        }
        let raw: RawConfig = serde_json::from_value(value.clone()).map_err(|e| cfg_err(e.to_string()))?;
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(cfg_err(format!("hidden_act '{act}' is not supported (only silu)")));
            }
        }
        if raw.attention_bias || raw.mlp_bias {
            return Err(cfg_err("attention/MLP biases are not supported (attention_bias / mlp_bias must be false)".into()));
        }
        if raw.use_sliding_window {
            return Err(cfg_err("use_sliding_window=true is not supported".into()));
        }
        if raw.rope_scaling.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(cfg_err("rope_scaling is not supported".into()));
        }
        let mut rope_theta = raw.rope_theta;
        if let Some(rp) = raw.rope_parameters.as_ref().filter(|v| !v.is_null()) {
            let kind = rp.get("rope_type").and_then(|t| t.as_str()).unwrap_or("default");
            if kind != "default" {
                return Err(cfg_err(format!("rope_parameters.rope_type '{kind}' is not supported (only default)")));
            }
            if rope_theta.is_none() {
                rope_theta = rp.get("rope_theta").and_then(|t| t.as_f64());
            }
        }
        if let Some(kind) = raw.layer_types.iter().flatten().find(|t| t.as_str() != "full_attention") {
            return Err(cfg_err(format!("layer_types entry '{kind}' is not supported (only full_attention)")));
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
        let positive = [
            ("hidden_size", raw.hidden_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", num_kv_heads),
            ("head_dim", head_dim),
            ("intermediate_size", raw.intermediate_size),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(cfg_err(format!("{name} must be positive")));
            }
        }
        if !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(cfg_err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {num_kv_heads}",
                raw.num_attention_heads
            )));
        }
        if !head_dim.is_multiple_of(2) || head_dim > domino_engine::kernels::MAX_HEAD_DIM {
            return Err(cfg_err(format!("head_dim {head_dim} must be even and at most {}", domino_engine::kernels::MAX_HEAD_DIM)));
        }
        let eos_token_ids = parse_token_ids(raw.eos_token_id.as_ref());
        let config = Self {
            hidden_size: raw.hidden_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            intermediate_size: raw.intermediate_size,
            vocab_size: raw.vocab_size,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: rope_theta.unwrap_or(10_000.0),
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            eos_token_ids,
            qk_norm,
        };
        config.check_sizes().map_err(cfg_err)?;
        Ok(config)
    }

    /// Every tensor of the model with its `[out, in]` shape, in load order.
    pub fn tensor_plan(&self) -> Vec<(String, Vec<usize>)> {
        let (h, inter, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let (qw, kvw) = (self.num_heads.saturating_mul(self.head_dim), self.num_kv_heads.saturating_mul(self.head_dim));
        let mut plan: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
        for l in 0..self.num_layers {
            let p = format!("model.layers.{l}.");
            plan.push((p.clone() + "input_layernorm.weight", vec![h]));
            plan.push((p.clone() + "self_attn.q_proj.weight", vec![qw, h]));
            plan.push((p.clone() + "self_attn.k_proj.weight", vec![kvw, h]));
            plan.push((p.clone() + "self_attn.v_proj.weight", vec![kvw, h]));
            plan.push((p.clone() + "self_attn.o_proj.weight", vec![h, qw]));
            if self.qk_norm {
                plan.push((p.clone() + "self_attn.q_norm.weight", vec![self.head_dim]));
                plan.push((p.clone() + "self_attn.k_norm.weight", vec![self.head_dim]));
            }
            plan.push((p.clone() + "post_attention_layernorm.weight", vec![h]));
            plan.push((p.clone() + "mlp.gate_proj.weight", vec![inter, h]));
            plan.push((p.clone() + "mlp.up_proj.weight", vec![inter, h]));
            plan.push((p + "mlp.down_proj.weight", vec![h, inter]));
        }
        plan.push(("model.norm.weight".into(), vec![h]));
        if !self.tie_word_embeddings {
            plan.push(("lm_head.weight".into(), vec![v, h]));
        }
        plan
    }

    /// Refuses sizes whose weights could not even be counted: every matrix's f32 byte size, and
    /// the fused q/k/v width, must fit in 64 bits (far above any adapter's limits, which the memory
    /// check compares against later). Also bounds the layer count, which sizes per-layer lists.
    pub(crate) fn check_sizes(&self) -> std::result::Result<(), String> {
        const MAX_LAYERS: usize = 1 << 16;
        if self.num_layers > MAX_LAYERS {
            return Err(format!("{} layers is more than {MAX_LAYERS}", self.num_layers));
        }
        let dims = [self.hidden_size, self.intermediate_size, self.vocab_size, self.num_heads, self.num_kv_heads, self.head_dim];
        let qkv = self
            .num_heads
            .checked_add(self.num_kv_heads.saturating_mul(2))
            .and_then(|n| n.checked_mul(self.head_dim))
            .and_then(|w| w.checked_mul(self.hidden_size.max(1)));
        let fits = |a: usize, b: usize| (a as u64).checked_mul(b as u64).and_then(|n| n.checked_mul(4)).is_some_and(|n| usize::try_from(n).is_ok());
        let ok = qkv.is_some()
            && fits(self.vocab_size, self.hidden_size)
            && fits(self.intermediate_size, self.hidden_size)
            && fits(self.max_position_embeddings, self.num_kv_heads.saturating_mul(self.head_dim));
        if !ok {
            return Err(format!(
                "sizes too large to represent (hidden {}, intermediate {}, vocab {}, heads {}/{} x {})",
                dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
            ));
        }
        Ok(())
    }

    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
}

/// Every tensor of `plan` has an element count whose f32 byte size fits in 64 bits (and usize);
/// else the message names the first tensor that does not.
pub fn plan_fits(plan: &[(String, Vec<usize>)]) -> std::result::Result<(), String> {
    for (name, shape) in plan {
        let bytes = shape.iter().try_fold(4u64, |a, &d| a.checked_mul(d as u64));
        if bytes.is_none_or(|b| usize::try_from(b).is_err()) {
            return Err(format!("tensor {name} of shape {shape:?} is too large to represent"));
        }
    }
    Ok(())
}

/// eos_token_id may be an int or a list of ints.
pub fn parse_token_ids(v: Option<&serde_json::Value>) -> Vec<u32> {
    match v {
        Some(serde_json::Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(serde_json::Value::Array(a)) => a.iter().filter_map(|x| x.as_u64()).map(|n| n as u32).collect(),
        _ => Vec::new(),
    }
}

/// generation_config.json's eos_token_id, when the file exists.
pub fn generation_eos(dir: &Path) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(Vec::new());
    }
    let bytes = read_file(&path)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| ModelError::Json { path: path.clone(), message: e.to_string() })?;
    Ok(parse_token_ids(v.get("eos_token_id")))
}

pub fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            ModelError::Missing { path: PathBuf::from(path) }
        } else {
            ModelError::Io { path: path.into(), source: e }
        }
    })
}
