//! A GGUF model as the Qwen3/Llama forward sees it: the architecture from GGUF metadata as a
//! `Qwen3Config`, and the tensors under their Hugging Face names through `WeightSource`.
//!
//! llama.cpp's converter permutes the rows of attn_q / attn_k of Llama models so that RoPE rotates
//! adjacent pairs (GPT-J style); the forward here rotates halves (NeoX, as Hugging Face does), so
//! those rows are put back in Hugging Face order on load. Rows are whole quantized blocks, so the
//! permutation moves blocks and works for every tensor type. Qwen3 GGUFs are not permuted.

use crate::checkpoint::{RawTensor, WeightSource};
use crate::config::Qwen3Config;
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

/// Architectures this build runs from GGUF.
const SUPPORTED: &[&str] = &["llama", "qwen3"];

/// The target config from `{arch}.*` metadata.
pub fn config_from_gguf(g: &GgufFile) -> Result<Qwen3Config> {
    let err = |message: String| ModelError::Gguf { path: g.path.clone(), message };
    let arch = g.opt_str("general.architecture")?.ok_or_else(|| err("metadata key general.architecture is missing".into()))?;
    if !SUPPORTED.contains(&arch) {
        return Err(ModelError::UnknownArchitecture { path: g.path.clone(), arch: format!("'{arch}' (GGUF general.architecture; supported: llama, qwen3)") });
    }
    let key = |k: &str| format!("{arch}.{k}");
    let hidden = g.require_u64(&key("embedding_length"))? as usize;
    let heads = g.require_u64(&key("attention.head_count"))? as usize;
    let kv_heads = g.opt_u64(&key("attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(err(format!("{heads} attention heads are not a multiple of {kv_heads} key/value heads")));
    }
    let head_dim = g.opt_u64(&key("attention.key_length"))?.map(|v| v as usize).unwrap_or(hidden / heads);
    if let Some(vd) = g.opt_u64(&key("attention.value_length"))? {
        if vd as usize != head_dim {
            return Err(err(format!("{} {vd} differs from the key length {head_dim}", key("attention.value_length"))));
        }
    }
    if let Some(rot) = g.opt_u64(&key("rope.dimension_count"))? {
        if rot as usize != head_dim {
            return Err(err(format!("{} {rot}: partial rotary embeddings are not supported (head_dim {head_dim})", key("rope.dimension_count"))));
        }
    }
    if let Some(kind) = g.opt_str(&key("rope.scaling.type"))? {
        if kind != "none" {
            return Err(err(format!("{} '{kind}' is not supported", key("rope.scaling.type"))));
        }
    }
    let tokens = g.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()).map(|a| a.len());
    let embd = g.tensor_info("token_embd.weight").ok_or_else(|| ModelError::MissingTensor { name: "token_embd.weight".into(), where_: g.path.display().to_string() })?;
    let vocab = match g.opt_u64(&key("vocab_size"))? {
        Some(v) => v as usize,
        None => embd.dims.get(1).map(|&v| v as usize).or(tokens).unwrap_or(0),
    };
    let eps = g.opt_f64(&key("attention.layer_norm_rms_epsilon"))?.ok_or_else(|| err(format!("metadata key {} is missing", key("attention.layer_norm_rms_epsilon"))))?;
    let config = Qwen3Config {
        hidden_size: hidden,
        num_layers: g.require_u64(&key("block_count"))? as usize,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        intermediate_size: g.require_u64(&key("feed_forward_length"))? as usize,
        vocab_size: vocab,
        rms_norm_eps: eps as f32,
        rope_theta: g.opt_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0),
        max_position_embeddings: g.require_u64(&key("context_length"))? as usize,
        tie_word_embeddings: g.tensor_info("output.weight").is_none(),
        eos_token_ids: g.opt_u64("tokenizer.ggml.eos_token_id")?.map(|v| vec![v as u32]).unwrap_or_default(),
        qk_norm: arch == "qwen3",
    };
    for (name, v) in [("embedding_length", hidden), ("block_count", config.num_layers), ("feed_forward_length", config.intermediate_size), ("vocab_size", vocab), ("context_length", config.max_position_embeddings)] {
        if v == 0 {
            return Err(err(format!("{} must be positive", key(name))));
        }
    }
    if head_dim % 2 != 0 || head_dim > domino_engine::kernels::MAX_HEAD_DIM {
        return Err(err(format!("head_dim {head_dim} must be even and at most {}", domino_engine::kernels::MAX_HEAD_DIM)));
    }
    config.check_sizes().map_err(err)?;
    Ok(config)
}

/// How a Hugging Face tensor name maps onto the GGUF file.
struct Mapping {
    gguf: String,
    shape: Vec<usize>,
    /// Heads whose rows llama.cpp interleaved (q: attention heads, k: key/value heads).
    unpermute_heads: Option<usize>,
}

/// The GGUF file's tensors under Hugging Face names (`model.layers.N.self_attn.q_proj.weight`, ...).
pub struct GgufWeights {
    pub file: GgufFile,
    map: HashMap<String, Mapping>,
    head_dim: usize,
}

impl GgufWeights {
    pub fn new(file: GgufFile, config: &Qwen3Config) -> Self {
        let permuted = file.get("general.architecture").and_then(|v| v.as_str()) == Some("llama");
        let mut map = HashMap::new();
        let mut add = |hf: String, gguf: String, heads: Option<usize>| {
            if let Some(t) = file.tensor_info(&gguf) {
                map.insert(hf, Mapping { shape: t.shape(), gguf, unpermute_heads: heads.filter(|_| permuted) });
            }
        };
        add("model.embed_tokens.weight".into(), "token_embd.weight".into(), None);
        add("model.norm.weight".into(), "output_norm.weight".into(), None);
        add("lm_head.weight".into(), "output.weight".into(), None);
        let names = [
            ("input_layernorm", "attn_norm", None),
            ("self_attn.q_proj", "attn_q", Some(config.num_heads)),
            ("self_attn.k_proj", "attn_k", Some(config.num_kv_heads)),
            ("self_attn.v_proj", "attn_v", None),
            ("self_attn.o_proj", "attn_output", None),
            ("self_attn.q_norm", "attn_q_norm", None),
            ("self_attn.k_norm", "attn_k_norm", None),
            ("post_attention_layernorm", "ffn_norm", None),
            ("mlp.gate_proj", "ffn_gate", None),
            ("mlp.up_proj", "ffn_up", None),
            ("mlp.down_proj", "ffn_down", None),
        ];
        for l in 0..config.num_layers {
            for (hf, gg, heads) in names {
                add(format!("model.layers.{l}.{hf}.weight"), format!("blk.{l}.{gg}.weight"), heads);
            }
        }
        Self { file, map, head_dim: config.head_dim }
    }

    pub fn path(&self) -> &Path {
        &self.file.path
    }
}

/// Hugging Face row order from llama.cpp's: HF row h·d + s·d/2 + j sits at GGUF row h·d + 2j + s.
fn unpermute_rows(data: &[u8], rows: usize, head_dim: usize) -> Vec<u8> {
    let row_bytes = data.len() / rows.max(1);
    let half = head_dim / 2;
    let mut out = Vec::with_capacity(data.len());
    for r in 0..rows {
        let (h, i) = (r / head_dim, r % head_dim);
        let src = h * head_dim + 2 * (i % half) + i / half;
        out.extend_from_slice(&data[src * row_bytes..(src + 1) * row_bytes]);
    }
    out
}

impl WeightSource for GgufWeights {
    fn tensor(&self, name: &str) -> Result<Option<RawTensor<'_>>> {
        let Some(m) = self.map.get(name) else { return Ok(None) };
        let Some((dtype, bytes)) = self.file.tensor_data(&m.gguf)? else { return Ok(None) };
        let data = match m.unpermute_heads {
            Some(heads) if m.shape.len() == 2 && m.shape[0] == heads * self.head_dim => Cow::Owned(unpermute_rows(&bytes, m.shape[0], self.head_dim)),
            _ => bytes,
        };
        Ok(Some(RawTensor { dtype, shape: &m.shape, data, file: &self.file.path }))
    }

    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.map.keys().cloned().collect();
        v.sort();
        v
    }

    fn describe(&self) -> String {
        self.file.path.file_name().map(|f| f.to_string_lossy().to_string()).unwrap_or_else(|| "GGUF file".into())
    }

    fn tensor_shape(&self, name: &str) -> Result<Option<(Vec<usize>, u64)>> {
        let Some(m) = self.map.get(name) else { return Ok(None) };
        let Some(t) = self.file.tensor_info(&m.gguf) else { return Ok(None) };
        let len = match t.dtype() {
            Ok(d) => d.bytes_for(t.elements() as usize) as u64,
            Err(ty) => return Err(ModelError::DType { name: name.into(), dtype: ty, path: self.file.path.clone() }),
        };
        Ok(Some((m.shape.clone(), len)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2): HF row (h, s, j) -> (h, j, s).
        let (heads, d) = (2usize, 8usize);
        let hf: Vec<u8> = (0..(heads * d) as u8).collect();
        let mut gguf = vec![0u8; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..d / 2 {
                    gguf[h * d + j * 2 + s] = hf[h * d + s * d / 2 + j];
                }
            }
        }
        assert_eq!(unpermute_rows(&gguf, heads * d, d), hf);
    }
}
