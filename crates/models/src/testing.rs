//! Tiny random Qwen3-architecture models written to disk (config.json, safetensors single or sharded
//! in f32 / f16 / bf16, a byte-level tokenizer and a ChatML template), deterministic from a seed.
//! Tests generate every shape edge case with these; the CLI's built-in default model is one of them.

use crate::error::{ModelError, Result};
use domino_engine::testing::Rng;
use domino_engine::HostDType;
use std::collections::BTreeMap;
use std::path::Path;

#[derive(Debug, Clone)]
pub struct TinySpec {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub tied: bool,
    pub qk_norm: bool,
    pub dtype: HostDType,
    pub shards: usize,
    pub max_position: usize,
    pub rope_theta: f64,
    pub seed: u64,
    /// Scale of the embedding values: larger gives larger logit margins (fewer near-ties).
    pub embed_scale: f32,
}

impl Default for TinySpec {
    /// The built-in default: q width (4 x 32 = 128) differs from hidden (64), GQA 2:1, untied.
    fn default() -> Self {
        Self {
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 32,
            intermediate: 128,
            vocab: 384,
            tied: false,
            qk_norm: true,
            dtype: HostDType::BF16,
            shards: 1,
            max_position: 2048,
            rope_theta: 1_000_000.0,
            seed: 7,
            embed_scale: 1.0,
        }
    }
}

/// Special tokens of the tiny tokenizer (after the 256 byte tokens).
pub const ENDOFTEXT: u32 = 256;
pub const IM_START: u32 = 257;
pub const IM_END: u32 = 258;

pub const CHAT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}";

/// Values in a file dtype (quantized types: rows of whole 32-value blocks).
pub fn encode(dtype: HostDType, v: &[f32]) -> Vec<u8> {
    match dtype {
        HostDType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        HostDType::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        HostDType::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        HostDType::Quant(q) => domino_engine::quant::quantize(q, v),
    }
}

fn st_dtype(d: HostDType, path: &Path) -> Result<safetensors::Dtype> {
    match d {
        HostDType::F32 => Ok(safetensors::Dtype::F32),
        HostDType::F16 => Ok(safetensors::Dtype::F16),
        HostDType::BF16 => Ok(safetensors::Dtype::BF16),
        HostDType::Quant(q) => Err(ModelError::Safetensors { path: path.into(), message: format!("safetensors has no {} dtype (write GGUF instead)", q.name()) }),
    }
}

/// All tensors of the spec, in a stable order: (name, shape, values).
pub fn tiny_tensors(s: &TinySpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Rng::new(s.seed);
    let mut t = Vec::new();
    let (h, qw, kvw, i) = (s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim, s.intermediate);
    let lin = |rng: &mut Rng, name: String, n: usize, k: usize| (name, vec![n, k], rng.vec(n * k, 1.0 / (k as f32).sqrt()));
    let norm = |rng: &mut Rng, name: String, n: usize| (name, vec![n], rng.vec(n, 0.2).into_iter().map(|v| 1.0 + v).collect::<Vec<f32>>());
    t.push(("model.embed_tokens.weight".to_string(), vec![s.vocab, h], rng.vec(s.vocab * h, s.embed_scale)));
    for l in 0..s.layers {
        let p = format!("model.layers.{l}.");
        t.push(norm(&mut rng, p.clone() + "input_layernorm.weight", h));
        t.push(lin(&mut rng, p.clone() + "self_attn.q_proj.weight", qw, h));
        t.push(lin(&mut rng, p.clone() + "self_attn.k_proj.weight", kvw, h));
        t.push(lin(&mut rng, p.clone() + "self_attn.v_proj.weight", kvw, h));
        t.push(lin(&mut rng, p.clone() + "self_attn.o_proj.weight", h, qw));
        if s.qk_norm {
            t.push(norm(&mut rng, p.clone() + "self_attn.q_norm.weight", s.head_dim));
            t.push(norm(&mut rng, p.clone() + "self_attn.k_norm.weight", s.head_dim));
        }
        t.push(norm(&mut rng, p.clone() + "post_attention_layernorm.weight", h));
        t.push(lin(&mut rng, p.clone() + "mlp.gate_proj.weight", i, h));
        t.push(lin(&mut rng, p.clone() + "mlp.up_proj.weight", i, h));
        t.push(lin(&mut rng, p.clone() + "mlp.down_proj.weight", h, i));
    }
    t.push(norm(&mut rng, "model.norm.weight".into(), h));
    if !s.tied {
        t.push(lin(&mut rng, "lm_head.weight".into(), s.vocab, h));
    }
    t
}

pub fn config_json(s: &TinySpec) -> serde_json::Value {
    serde_json::json!({
        "architectures": [if s.qk_norm { "Qwen3ForCausalLM" } else { "LlamaForCausalLM" }],
        "model_type": if s.qk_norm { "qwen3" } else { "llama" },
        "hidden_size": s.hidden,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "head_dim": s.head_dim,
        "intermediate_size": s.intermediate,
        "vocab_size": s.vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": s.rope_theta,
        "max_position_embeddings": s.max_position,
        "tie_word_embeddings": s.tied,
        "hidden_act": "silu",
        "attention_bias": false,
        "eos_token_id": IM_END,
        "bos_token_id": ENDOFTEXT,
        "torch_dtype": "bfloat16",
    })
}

/// GPT-2's byte -> printable character map used by byte-level BPE.
fn byte_to_char() -> Vec<char> {
    let mut bs: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut map = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        map[*b as usize] = char::from_u32(c).unwrap_or('?');
    }
    map
}

/// A byte-level BPE tokenizer with no merges: ids 0..256 are bytes, then the special tokens.
pub fn tokenizer_json() -> serde_json::Value {
    let chars = byte_to_char();
    let vocab: BTreeMap<String, u32> = (0..256u32).map(|b| (chars[b as usize].to_string(), b)).collect();
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"];
    let added: Vec<serde_json::Value> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({"id": 256 + i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| ModelError::Io { path: path.into(), source: e })
}

/// Write the model into `dir` (created if needed).
pub fn write_tiny_model(dir: &Path, s: &TinySpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Io { path: dir.into(), source: e })?;
    let pretty = |v: &serde_json::Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    write(&dir.join("config.json"), &pretty(&config_json(s)))?;
    write(&dir.join("tokenizer.json"), &pretty(&tokenizer_json()))?;
    let tok_cfg = serde_json::json!({"eos_token": "<|im_end|>", "bos_token": null, "add_bos_token": false, "chat_template": CHAT_TEMPLATE});
    write(&dir.join("tokenizer_config.json"), &pretty(&tok_cfg))?;
    write(&dir.join("generation_config.json"), &pretty(&serde_json::json!({"eos_token_id": [IM_END, ENDOFTEXT]})))?;

    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> =
        tiny_tensors(s).into_iter().map(|(n, shape, v)| (n, shape, encode(s.dtype, &v))).collect();
    let shards = s.shards.max(1);
    let per = tensors.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (si, group) in tensors.chunks(per).enumerate() {
        let file = if shards == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{:05}.safetensors", si + 1, shards) };
        let mut views = Vec::new();
        for (name, shape, bytes) in group {
            let view = safetensors::tensor::TensorView::new(st_dtype(s.dtype, &dir.join(&file))?, shape.clone(), bytes)
                .map_err(|e| ModelError::Safetensors { path: dir.join(&file), message: format!("{e:?}") })?;
            views.push((name.clone(), view));
            weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
        }
        let bytes = safetensors::serialize(views, None).map_err(|e| ModelError::Safetensors { path: dir.join(&file), message: format!("{e:?}") })?;
        write(&dir.join(&file), &bytes)?;
    }
    if shards > 1 {
        let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
        write(&dir.join("model.safetensors.index.json"), &pretty(&index))?;
    }
    Ok(())
}

/// A tiny random drafter for a [`TinySpec`] target, written in the public config.json formats
/// (z-lab DFlash, or Domino when `kind` is Domino). Its hidden size, heads, head_dim, intermediate
/// size and rope theta follow the target's.
#[derive(Debug, Clone)]
pub struct TinyDrafterSpec {
    pub kind: crate::drafter::DrafterKind,
    pub block_size: usize,
    pub layers: usize,
    pub target_layer_ids: Vec<usize>,
    pub emb_dim: usize,
    pub gru_hidden: usize,
    pub pure_draft_prefix_len: usize,
    /// Store the Domino head under the older `logit_head.` names.
    pub old_head_names: bool,
    pub seed: u64,
    pub dtype: HostDType,
}

impl Default for TinyDrafterSpec {
    /// A one-layer DFlash drafter with block size 4, reading both layers of the default 2-layer target.
    fn default() -> Self {
        Self {
            kind: crate::drafter::DrafterKind::DFlash,
            block_size: 4,
            layers: 1,
            target_layer_ids: vec![0, 1],
            emb_dim: 16,
            gru_hidden: 24,
            pure_draft_prefix_len: 1,
            old_head_names: false,
            seed: 101,
            dtype: HostDType::F32,
        }
    }
}

/// The drafter's config.json, shaped like z-lab/Qwen3-8B-DFlash-b16's (plus the Domino fields of
/// Huang2020/Qwen3-8B-Domino-b16). The mask token is the target's last id.
pub fn drafter_config_json(target: &TinySpec, s: &TinyDrafterSpec) -> serde_json::Value {
    let mut dflash = serde_json::json!({
        "mask_token_id": target.vocab - 1,
        "target_layer_ids": s.target_layer_ids,
    });
    let mut cfg = serde_json::json!({
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "block_size": s.block_size,
        "bos_token_id": ENDOFTEXT,
        "eos_token_id": IM_END,
        "dtype": "bfloat16",
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "hidden_size": target.hidden,
        "initializer_range": 0.02,
        "intermediate_size": target.intermediate,
        "layer_types": vec!["full_attention"; s.layers],
        "max_position_embeddings": target.max_position,
        "max_window_layers": s.layers,
        "num_attention_heads": target.heads,
        "num_hidden_layers": s.layers,
        "num_key_value_heads": target.kv_heads,
        "num_target_layers": target.layers,
        "rms_norm_eps": 1e-6,
        "rope_scaling": null,
        "rope_theta": target.rope_theta,
        "sliding_window": null,
        "tie_word_embeddings": false,
        "transformers_version": "4.57.1",
        "use_cache": true,
        "use_sliding_window": false,
        "vocab_size": target.vocab,
    });
    if s.kind == crate::drafter::DrafterKind::Domino {
        let extra = serde_json::json!({
            "projector_type": "domino",
            "emb_dim": s.emb_dim,
            "gru_hidden_dim": s.gru_hidden,
            "pure_draft_prefix_len": s.pure_draft_prefix_len,
            "shift_label": true,
        });
        if let (Some(d), Some(e)) = (dflash.as_object_mut(), extra.as_object()) {
            d.extend(e.clone());
        }
        cfg["emb_dim"] = s.emb_dim.into();
    }
    cfg["dflash_config"] = dflash;
    cfg
}

/// All drafter tensors `(name, shape, values)` in plan order, deterministic from `s.seed`. Linear
/// weights are uniform with scale 1/sqrt(fan_in); norm weights are 1 ± 0.2.
pub fn tiny_drafter_tensors(target: &TinySpec, s: &TinyDrafterSpec) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>> {
    let path = Path::new("tiny drafter config.json");
    let json = serde_json::to_vec(&drafter_config_json(target, s)).unwrap_or_default();
    let mut cfg = crate::drafter::DrafterConfig::from_json(&json, path)?;
    if s.old_head_names {
        cfg.head_prefix = crate::drafter::OLD_HEAD_PREFIX.to_string();
    }
    let tjson = serde_json::to_vec(&config_json(target)).unwrap_or_default();
    let tcfg = crate::config::Qwen3Config::from_json(&tjson, Path::new("tiny config.json"))?;
    let mut rng = Rng::new(s.seed);
    Ok(crate::drafter::drafter_tensor_plan(&cfg, &tcfg)
        .into_iter()
        .map(|(name, shape)| {
            let values = match shape.as_slice() {
                [n] => rng.vec(*n, 0.2).into_iter().map(|v| 1.0 + v).collect(),
                [n, k] => rng.vec(n * k, 1.0 / (*k as f32).sqrt()),
                _ => Vec::new(),
            };
            (name, shape, values)
        })
        .collect())
}

/// One safetensors file holding `tensors` in `dtype`.
pub fn safetensors_bytes(dtype: HostDType, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<Vec<u8>> {
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, shape, v)| (n.clone(), shape.clone(), encode(dtype, v))).collect();
    let st_err = |e: safetensors::SafeTensorError| ModelError::Safetensors { path: "model.safetensors".into(), message: format!("{e:?}") };
    let st = st_dtype(dtype, Path::new("model.safetensors"))?;
    let mut views = Vec::new();
    for (name, shape, bytes) in &encoded {
        views.push((name.clone(), safetensors::tensor::TensorView::new(st, shape.clone(), bytes).map_err(st_err)?));
    }
    safetensors::serialize(views, None).map_err(st_err)
}

/// Write the drafter (config.json and model.safetensors) into `dir` (created if needed).
pub fn write_tiny_drafter(dir: &Path, target: &TinySpec, s: &TinyDrafterSpec) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::Io { path: dir.into(), source: e })?;
    let config = serde_json::to_vec_pretty(&drafter_config_json(target, s)).unwrap_or_default();
    write(&dir.join("config.json"), &config)?;
    write(&dir.join("model.safetensors"), &safetensors_bytes(s.dtype, &tiny_drafter_tensors(target, s)?)?)
}

/// Apply `f` to every tensor whose name satisfies `pred` (constructing special models in tests).
pub fn set_tensors(tensors: &mut [(String, Vec<usize>, Vec<f32>)], pred: impl Fn(&str) -> bool, f: impl Fn(&mut Vec<f32>, &[usize])) {
    for (name, shape, v) in tensors.iter_mut() {
        if pred(name) {
            f(v, shape);
        }
    }
}

/// The projections that write into the residual stream.
pub fn is_residual_write(name: &str) -> bool {
    name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight")
}

/// A target whose next token is always `t` (untied spec): no residual writes, so the final state is
/// the token's embedding, whose component 0 is made positive; the final norm keeps only that component
/// and lm_head row t has the largest weight on it. Its compute cost is that of any model of its shape.
pub fn constant_target_tensors(spec: &TinySpec, t: usize) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut tensors = tiny_tensors(spec);
    set_tensors(&mut tensors, is_residual_write, |v, _| v.fill(0.0));
    set_tensors(&mut tensors, |n| n == "model.embed_tokens.weight", |v, s| v.chunks_mut(s[1]).for_each(|row| row[0] = 1.0 + row[0].abs()));
    set_tensors(&mut tensors, |n| n == "model.norm.weight", |v, _| v.iter_mut().enumerate().for_each(|(i, x)| *x = if i == 0 { 1.0 } else { 0.0 }));
    set_tensors(&mut tensors, |n| n == "lm_head.weight", |v, s| v[t * s[1]] = 10.0);
    tensors
}

/// A drafter for `constant_target_tensors` that drafts t in every slot: no residual writes, the final
/// norm keeps component 0 of the slot's embedding, and the Domino correction is zero.
pub fn always_accept_drafter_tensors(target: &TinySpec, s: &TinyDrafterSpec) -> Result<Vec<(String, Vec<usize>, Vec<f32>)>> {
    let mut tensors = tiny_drafter_tensors(target, s)?;
    set_tensors(&mut tensors, is_residual_write, |v, _| v.fill(0.0));
    set_tensors(&mut tensors, |n| n == "norm.weight", |v, _| v.iter_mut().enumerate().for_each(|(i, x)| *x = if i == 0 { 1.0 } else { 0.0 }));
    set_tensors(&mut tensors, |n| n.ends_with("embed_proj.2.weight"), |v, _| v.fill(0.0));
    Ok(tensors)
}

/// Write the always-accept pair: a constant target (next token always `t`) into `target_dir` and a
/// drafter that always drafts `t` into `drafter_dir`. Every round accepts every draft.
pub fn write_always_accept_pair(target_dir: &Path, drafter_dir: &Path, target: &TinySpec, s: &TinyDrafterSpec, t: usize) -> Result<()> {
    let spec = TinySpec { tied: false, shards: 1, ..target.clone() };
    write_tiny_model(target_dir, &spec)?;
    let bytes = safetensors_bytes(spec.dtype, &constant_target_tensors(&spec, t))?;
    write(&target_dir.join("model.safetensors"), &bytes)?;
    write_tiny_drafter(drafter_dir, &spec, s)?;
    let bytes = safetensors_bytes(s.dtype, &always_accept_drafter_tensors(&spec, s)?)?;
    write(&drafter_dir.join("model.safetensors"), &bytes)?;
    Ok(())
}
