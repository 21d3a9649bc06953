//! Drafter checkpoints: the DFlash block-diffusion backbone (z-lab format) and the Domino head on top of
//! it (Huang2020 format). Both are Qwen3 decoder layers that read target features and reuse the
//! target's embedding and lm_head, so a drafter is only usable against the target it was trained for:
//! [`DrafterConfig::validate_against`] checks that pairing up front.
//!
//! Drafter configs carry many training-only fields, so unknown fields are ignored; the fields the
//! forward uses are parsed strictly, and settings that would change the forward in ways we do not
//! implement (biases, sliding windows, rope scaling, other projectors) are refused by name.

use crate::checkpoint::WeightSource;
use crate::config::{read_file, Qwen3Config};
use crate::error::{ModelError, Result};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// Which drafting head sits on the DFlash backbone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrafterKind {
    /// Backbone only: the target lm_head on the backbone output.
    DFlash,
    /// Backbone plus the GRU-conditioned logit correction (spec §5).
    Domino,
}

/// A drafter's architecture, as read from its config.json.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    pub kind: DrafterKind,
    /// Tokens per draft block: the anchor plus block_size − 1 mask slots.
    pub block_size: usize,
    /// Layer count of the target the drafter was trained against.
    pub num_target_layers: usize,
    /// Target token id whose embedding fills the masked block slots.
    pub mask_token_id: u32,
    /// Target layers whose residual streams are concatenated into the features, in this order.
    pub target_layer_ids: Vec<usize>,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub intermediate_size: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    /// Domino: width of the correction MLP (embed_proj.0 output).
    pub emb_dim: Option<usize>,
    /// Domino: GRU state width.
    pub gru_hidden_dim: Option<usize>,
    /// Domino: leading block slots that get no correction (1 in the published checkpoints).
    pub pure_draft_prefix_len: usize,
    /// Slot i predicts the token at slot i+1 (B drafts) instead of the token at slot i (B−1 drafts).
    pub shift_label: bool,
    /// Prefix of the Domino head tensors: "" for current checkpoints, "logit_head." for older ones.
    /// Config files do not say which; set it from the checkpoint with [`detect_head_prefix`].
    pub head_prefix: String,
}

/// Most layers a drafter (or the target it names) may have.
const MAX_LAYERS: usize = 1 << 16;
/// Most tokens per draft block (a verify pass holds a block; real drafters use 8 to 16).
const MAX_BLOCK_SIZE: usize = 1 << 12;

/// The prefix older Domino checkpoints put before the head tensors.
pub const OLD_HEAD_PREFIX: &str = "logit_head.";

impl DrafterConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = read_file(path)?;
        Self::from_json(&bytes, path)
    }

    pub fn from_json(bytes: &[u8], path: &Path) -> Result<Self> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| ModelError::Json { path: path.into(), message: e.to_string() })?;
        let map = value.as_object().ok_or_else(|| config_error(path, "expected a JSON object".into()))?;
        let root = Fields { map, prefix: "", path };
        let dflash = match root.get("dflash_config") {
            Some(Value::Object(m)) => Fields { map: m, prefix: "dflash_config.", path },
            Some(_) => return Err(root.error("dflash_config", "expected an object")),
            None => {
                return Err(config_error(path, "missing 'dflash_config': this is not a DFlash or Domino drafter config".into()))
            }
        };
        refuse_unsupported(&root)?;
        let kind = match dflash.opt_str("projector_type")? {
            None => DrafterKind::DFlash,
            Some("domino") => DrafterKind::Domino,
            Some(other) => {
                return Err(dflash.error("projector_type", &format!("'{other}' is not supported (expected \"domino\" or absent for DFlash)")))
            }
        };
        let num_layers = root.usize("num_hidden_layers")?;
        let num_heads = root.usize("num_attention_heads")?;
        let hidden_size = root.usize("hidden_size")?;
        let num_target_layers = root.usize("num_target_layers")?;
        // Bounded before anything loops over layers (the default target_layer_ids, the tensor plan).
        for (name, v) in [("num_hidden_layers", num_layers), ("num_target_layers", num_target_layers)] {
            if v > MAX_LAYERS {
                return Err(root.error(name, &format!("{v} is more than {MAX_LAYERS}")));
            }
        }
        let mask_token_id = either(&dflash, &root, "mask_token_id")?.ok_or_else(|| dflash.error("mask_token_id", "missing"))?;
        let mask_token_id = u32::try_from(mask_token_id).map_err(|_| dflash.error("mask_token_id", "does not fit in 32 bits"))?;
        let target_layer_ids = match either_list(&dflash, &root, "target_layer_ids")? {
            Some(ids) => ids,
            None => default_target_layer_ids(num_target_layers, num_layers).ok_or_else(|| {
                dflash.error(
                    "target_layer_ids",
                    &format!("absent, and no default exists for num_target_layers {num_target_layers} with {num_layers} draft layers"),
                )
            })?,
        };
        let config = Self {
            kind,
            block_size: either(&root, &dflash, "block_size")?.ok_or_else(|| root.error("block_size", "missing"))?,
            num_target_layers,
            mask_token_id,
            target_layer_ids,
            hidden_size,
            num_layers,
            num_heads,
            num_kv_heads: root.opt_usize("num_key_value_heads")?.unwrap_or(num_heads),
            head_dim: root.opt_usize("head_dim")?.unwrap_or(hidden_size / num_heads.max(1)),
            intermediate_size: root.usize("intermediate_size")?,
            rms_norm_eps: root.opt_f64("rms_norm_eps")?.ok_or_else(|| root.error("rms_norm_eps", "missing"))? as f32,
            rope_theta: rope_theta(&root)?,
            max_position_embeddings: root.usize("max_position_embeddings")?,
            emb_dim: either(&root, &dflash, "emb_dim")?,
            gru_hidden_dim: either(&dflash, &root, "gru_hidden_dim")?,
            pure_draft_prefix_len: dflash.opt_usize("pure_draft_prefix_len")?.unwrap_or(1),
            // The published Domino checkpoints are trained with shifted labels; DFlash is not.
            shift_label: dflash.opt_bool("shift_label")?.unwrap_or(kind == DrafterKind::Domino),
            head_prefix: String::new(),
        };
        config.check().map_err(|message| config_error(path, message))?;
        Ok(config)
    }

    /// Width of one token's features: one target hidden state per target layer id.
    pub fn num_features(&self) -> usize {
        self.target_layer_ids.len()
    }
    pub fn q_width(&self) -> usize {
        self.num_heads.saturating_mul(self.head_dim)
    }
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads.saturating_mul(self.head_dim)
    }

    /// Drafts one block yields: B with shifted labels (every slot predicts its successor), else B − 1
    /// (slot 0 only repeats the anchor). The Domino head does not change the count.
    pub fn drafts_per_block(&self) -> usize {
        if self.shift_label {
            self.block_size
        } else {
            self.block_size - 1
        }
    }

    /// Internal consistency, independent of the target. Returns the message for a Config error.
    fn check(&self) -> std::result::Result<(), String> {
        let positive = [
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
            ("intermediate_size", self.intermediate_size),
            ("num_target_layers", self.num_target_layers),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if self.block_size == 0 || self.block_size > MAX_BLOCK_SIZE {
            return Err(format!("block_size must be between 1 and {MAX_BLOCK_SIZE} (found {})", self.block_size));
        }
        if !self.shift_label && self.block_size < 2 {
            return Err("block_size 1 yields no drafts without shift_label (slot 0 is the anchor)".into());
        }
        if !self.num_heads.is_multiple_of(self.num_kv_heads) {
            return Err(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_heads, self.num_kv_heads
            ));
        }
        let max_d = domino_engine::kernels::MAX_HEAD_DIM;
        if !self.head_dim.is_multiple_of(2) || self.head_dim > max_d {
            return Err(format!("head_dim {} must be even and at most {max_d}", self.head_dim));
        }
        if self.target_layer_ids.is_empty() {
            return Err("dflash_config.target_layer_ids must not be empty".into());
        }
        if self.kind == DrafterKind::Domino {
            for (name, v) in [("emb_dim", self.emb_dim), ("dflash_config.gru_hidden_dim", self.gru_hidden_dim)] {
                match v {
                    None => return Err(format!("a Domino drafter needs {name}")),
                    Some(0) => return Err(format!("{name} must be positive")),
                    Some(_) => {}
                }
            }
            if !self.shift_label {
                return Err("a Domino drafter with shift_label=false is not supported".into());
            }
        }
        Ok(())
    }

    /// Whether this drafter can run against `target`: the features, mask token and hidden size it
    /// was trained with must exist there. Every message names the drafter's and the target's value.
    pub fn validate_against(&self, target: &Qwen3Config) -> Result<()> {
        let err = |message: String| ModelError::Config { path: PathBuf::from("drafter config.json"), message };
        self.check().map_err(err)?;
        if self.hidden_size != target.hidden_size {
            return Err(err(format!(
                "drafter hidden_size {} differs from the target's hidden_size {}",
                self.hidden_size, target.hidden_size
            )));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return Err(err(format!(
                "drafter mask_token_id {} is outside the target vocabulary (vocab_size {})",
                self.mask_token_id, target.vocab_size
            )));
        }
        if self.num_target_layers != target.num_layers {
            return Err(err(format!(
                "drafter was trained for num_target_layers {} but the target has {} layers",
                self.num_target_layers, target.num_layers
            )));
        }
        if let Some(&id) = self.target_layer_ids.iter().find(|&&id| id >= target.num_layers) {
            return Err(err(format!(
                "drafter target_layer_ids entry {id} is out of range: the target has {} layers (ids 0..{})",
                target.num_layers,
                target.num_layers - 1
            )));
        }
        crate::config::plan_fits(&drafter_tensor_plan(self, target)).map_err(err)?;
        Ok(())
    }
}

/// The z-lab default feature layers when a config omits target_layer_ids, for a target with
/// `num_target_layers` = L layers and a drafter with `num_draft_layers` = k decoder layers (z-lab's
/// `build_target_layer_ids(config.num_target_layers, config.num_hidden_layers)`): one draft layer →
/// [L / 2]; otherwise k ids spread evenly over [1, L − 3], i.e. round(1 + i·(L − 4)/(k − 1)).
/// Python's round is round-half-to-even, reproduced here. None when the formula leaves [0, L).
pub fn default_target_layer_ids(num_target_layers: usize, num_draft_layers: usize) -> Option<Vec<usize>> {
    let l = num_target_layers as f64;
    match num_draft_layers {
        0 => None,
        1 => Some(vec![num_target_layers / 2]),
        k => (0..k)
            .map(|i| {
                let v = (1.0 + (i as f64 * (l - 4.0)) / (k - 1) as f64).round_ties_even();
                (v >= 0.0 && v < l).then_some(v as usize)
            })
            .collect(),
    }
}

/// Every tensor a drafter checkpoint must hold, with its `[out, in]` shape, in load order. `target`
/// supplies the feature width (its hidden size) and the vocabulary of the Domino correction.
pub fn drafter_tensor_plan(cfg: &DrafterConfig, target: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let (h, d, i) = (cfg.hidden_size, cfg.head_dim, cfg.intermediate_size);
    let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
    let mut plan = vec![
        ("fc.weight".to_string(), vec![h, cfg.num_features().saturating_mul(target.hidden_size)]),
        ("hidden_norm.weight".to_string(), vec![h]),
    ];
    for l in 0..cfg.num_layers {
        let layer: [(&str, Vec<usize>); 11] = [
            ("input_layernorm.weight", vec![h]),
            ("self_attn.q_proj.weight", vec![qw, h]),
            ("self_attn.k_proj.weight", vec![kvw, h]),
            ("self_attn.v_proj.weight", vec![kvw, h]),
            ("self_attn.o_proj.weight", vec![h, qw]),
            ("self_attn.q_norm.weight", vec![d]),
            ("self_attn.k_norm.weight", vec![d]),
            ("post_attention_layernorm.weight", vec![h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
        ];
        plan.extend(layer.into_iter().map(|(name, shape)| (format!("layers.{l}.{name}"), shape)));
    }
    plan.push(("norm.weight".to_string(), vec![h]));
    if let (DrafterKind::Domino, Some(e), Some(g)) = (cfg.kind, cfg.emb_dim, cfg.gru_hidden_dim) {
        let p = &cfg.head_prefix;
        // Saturating: validate_against refuses a plan whose sizes overflow.
        plan.push((format!("{p}prefix_gru.weight_ih_l0"), vec![g.saturating_mul(3), h]));
        plan.push((format!("{p}prefix_gru.weight_hh_l0"), vec![g.saturating_mul(3), g]));
        plan.push((format!("{p}embed_proj.0.weight"), vec![e, h.saturating_add(g)]));
        plan.push((format!("{p}embed_proj.2.weight"), vec![target.vocab_size, e]));
    }
    plan
}

/// "logit_head." when the checkpoint stores the Domino head under the older names, else "".
pub fn detect_head_prefix(src: &dyn WeightSource) -> String {
    let old = src.names().iter().any(|n| n.starts_with(OLD_HEAD_PREFIX));
    if old { OLD_HEAD_PREFIX.to_string() } else { String::new() }
}

fn config_error(path: &Path, message: String) -> ModelError {
    ModelError::Config { path: path.into(), message }
}

/// Typed access to one JSON object's fields, with errors that name the field (`prefix` + name).
/// JSON null counts as absent, as transformers writes nulls for unset options.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: &'static str,
    path: &'a Path,
}

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.map.get(name).filter(|v| !v.is_null())
    }
    fn error(&self, name: &str, what: &str) -> ModelError {
        config_error(self.path, format!("field '{}{name}': {what}", self.prefix))
    }
    fn found(&self, name: &str, v: &Value, expected: &str) -> ModelError {
        self.error(name, &format!("expected {expected}, found {v}"))
    }
    fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|v| v.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| self.found(name, v, "a non-negative integer")))
            .transpose()
    }
    fn usize(&self, name: &str) -> Result<usize> {
        self.opt_usize(name)?.ok_or_else(|| self.error(name, "missing"))
    }
    fn opt_f64(&self, name: &str) -> Result<Option<f64>> {
        self.get(name).map(|v| v.as_f64().ok_or_else(|| self.found(name, v, "a number"))).transpose()
    }
    fn opt_bool(&self, name: &str) -> Result<Option<bool>> {
        self.get(name).map(|v| v.as_bool().ok_or_else(|| self.found(name, v, "true or false"))).transpose()
    }
    fn opt_str(&self, name: &str) -> Result<Option<&str>> {
        self.get(name).map(|v| v.as_str().ok_or_else(|| self.found(name, v, "a string"))).transpose()
    }
    fn opt_usize_list(&self, name: &str) -> Result<Option<Vec<usize>>> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let list = v.as_array().ok_or_else(|| self.found(name, v, "a list of non-negative integers"))?;
        list.iter()
            .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| self.found(name, v, "a list of non-negative integers")))
            .collect::<Result<Vec<_>>>()
            .map(Some)
    }
}

/// A field the formats put in either object (block_size is top-level in z-lab's DFlash configs and
/// inside dflash_config in newer ones). Both present and different is an error.
fn either(first: &Fields, second: &Fields, name: &str) -> Result<Option<usize>> {
    match (first.opt_usize(name)?, second.opt_usize(name)?) {
        (Some(a), Some(b)) if a != b => Err(first.error(name, &format!("{a} conflicts with '{}{name}' {b}", second.prefix))),
        (a, b) => Ok(a.or(b)),
    }
}

fn either_list(first: &Fields, second: &Fields, name: &str) -> Result<Option<Vec<usize>>> {
    Ok(match first.opt_usize_list(name)? {
        Some(v) => Some(v),
        None => second.opt_usize_list(name)?,
    })
}

/// rope_theta is top-level in transformers 4.x configs and under rope_parameters in 5.x.
fn rope_theta(root: &Fields) -> Result<f64> {
    if let Some(theta) = root.opt_f64("rope_theta")? {
        return Ok(theta);
    }
    match root.get("rope_parameters") {
        Some(Value::Object(m)) => {
            let rp = Fields { map: m, prefix: "rope_parameters.", path: root.path };
            if let Some(t) = rp.opt_str("rope_type")? {
                if t != "default" {
                    return Err(rp.error("rope_type", &format!("'{t}' is not supported (only default RoPE)")));
                }
            }
            Ok(rp.opt_f64("rope_theta")?.unwrap_or(10_000.0))
        }
        Some(v) => Err(root.found("rope_parameters", v, "an object")),
        None => Ok(10_000.0),
    }
}

/// Settings that would change the draft layers' forward in ways this build does not implement.
fn refuse_unsupported(root: &Fields) -> Result<()> {
    if let Some(t) = root.opt_str("model_type")? {
        if t != "qwen3" {
            return Err(root.error("model_type", &format!("'{t}' is not supported for drafter layers (expected qwen3)")));
        }
    }
    if let Some(act) = root.opt_str("hidden_act")? {
        if act != "silu" {
            return Err(root.error("hidden_act", &format!("'{act}' is not supported (only silu)")));
        }
    }
    for name in ["attention_bias", "mlp_bias", "use_sliding_window"] {
        if root.opt_bool(name)? == Some(true) {
            return Err(root.error(name, "true is not supported"));
        }
    }
    if root.get("rope_scaling").is_some() {
        return Err(root.error("rope_scaling", "RoPE scaling is not supported"));
    }
    if let Some(v) = root.get("layer_types") {
        let types = v.as_array().ok_or_else(|| root.found("layer_types", v, "a list"))?;
        if let Some(t) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
            return Err(root.error("layer_types", &format!("{t} is not supported (only full_attention)")));
        }
    }
    Ok(())
}
