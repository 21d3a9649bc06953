//! Writing GGUF v3 files: the tests' tiny Llama/Qwen3 models in any tensor type (F32, F16, BF16,
//! Q8_0, Q4_0, Q4_1), laid out the way llama.cpp's converter lays them out, including its
//! permutation of the attn_q / attn_k rows for Llama.

use crate::error::{ModelError, Result};
use crate::gguf::GgufValue;
use crate::testing::{encode, tiny_tensors, TinySpec, IM_END, ENDOFTEXT};
use domino_engine::{HostDType, QuantType};
use std::path::Path;

const ALIGNMENT: usize = 32;

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn value_type(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.push(*x as u8),
        GgufValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(a) => {
            let item = a.first().map(value_type).unwrap_or(4);
            out.extend_from_slice(&item.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
    }
}

/// The GGML type id of a dtype.
pub fn ggml_type(d: HostDType) -> u32 {
    match d {
        HostDType::F32 => 0,
        HostDType::F16 => 1,
        HostDType::Quant(QuantType::Q4_0) => 2,
        HostDType::Quant(QuantType::Q4_1) => 3,
        HostDType::Quant(QuantType::Q8_0) => 8,
        HostDType::Quant(QuantType::Q5_0) => 6,
        HostDType::Quant(QuantType::Q5_1) => 7,
        HostDType::Quant(QuantType::Q4_K) => 12,
        HostDType::Quant(QuantType::Q5_K) => 13,
        HostDType::Quant(QuantType::Q6_K) => 14,
        HostDType::BF16 => 30,
    }
}

/// A tensor to write: GGUF name, row-major shape, GGML type id and its bytes.
pub struct GgufTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub ggml_type: u32,
    pub data: Vec<u8>,
}

/// A whole GGUF v3 file.
pub fn gguf_bytes(metadata: &[(String, GgufValue)], tensors: &[GgufTensor]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut out, k);
        out.extend_from_slice(&value_type(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend_from_slice(&(t.shape.len() as u32).to_le_bytes());
        for d in t.shape.iter().rev() {
            out.extend_from_slice(&(*d as u64).to_le_bytes());
        }
        out.extend_from_slice(&t.ggml_type.to_le_bytes());
        out.extend_from_slice(&(offset as u64).to_le_bytes());
        offset += t.data.len().div_ceil(ALIGNMENT) * ALIGNMENT;
    }
    out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
    for t in tensors {
        out.extend_from_slice(&t.data);
        out.resize(out.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
    }
    out
}

/// llama.cpp's `permute`: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2).reshape(w.shape).
pub fn llama_cpp_permute(values: &[f32], heads: usize, cols: usize) -> Vec<f32> {
    let rows = values.len() / cols;
    let d = rows / heads;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for two in 0..2 {
            for j in 0..d / 2 {
                let src = h * d + two * (d / 2) + j;
                let dst = h * d + j * 2 + two;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&values[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// GGUF name of a Hugging Face tensor name.
fn gguf_name(hf: &str) -> String {
    let map = [
        ("input_layernorm", "attn_norm"),
        ("self_attn.q_proj", "attn_q"),
        ("self_attn.k_proj", "attn_k"),
        ("self_attn.v_proj", "attn_v"),
        ("self_attn.o_proj", "attn_output"),
        ("self_attn.q_norm", "attn_q_norm"),
        ("self_attn.k_norm", "attn_k_norm"),
        ("post_attention_layernorm", "ffn_norm"),
        ("mlp.gate_proj", "ffn_gate"),
        ("mlp.up_proj", "ffn_up"),
        ("mlp.down_proj", "ffn_down"),
    ];
    match hf {
        "model.embed_tokens.weight" => "token_embd.weight".into(),
        "model.norm.weight" => "output_norm.weight".into(),
        "lm_head.weight" => "output.weight".into(),
        _ => {
            let rest = hf.strip_prefix("model.layers.").unwrap_or(hf);
            let (layer, name) = rest.split_once('.').unwrap_or(("0", rest));
            let name = name.strip_suffix(".weight").unwrap_or(name);
            let g = map.iter().find(|(h, _)| *h == name).map(|(_, g)| *g).unwrap_or(name);
            format!("blk.{layer}.{g}.weight")
        }
    }
}

/// The tiny model of `spec` as a GGUF file (architecture llama without q/k norms, qwen3 with them),
/// matrices in `matrix_dtype`, norms in F32, with the tiny byte-level tokenizer in the metadata.
pub fn write_tiny_gguf(path: &Path, spec: &TinySpec, matrix_dtype: HostDType) -> Result<()> {
    write_tiny_gguf_with(path, spec, &|_| matrix_dtype)
}

/// As `write_tiny_gguf`, with each matrix's type chosen by its Hugging Face name (mixed-type files
/// such as llama.cpp's Q4_K_M, which keeps some tensors in a wider type).
pub fn write_tiny_gguf_with(path: &Path, spec: &TinySpec, matrix_dtype: &dyn Fn(&str) -> HostDType) -> Result<()> {
    write_tiny_gguf_shaped(path, spec, &|name, _| matrix_dtype(name))
}

/// As `write_tiny_gguf_with`, the type chosen from the name and the `[rows, cols]` shape.
pub fn write_tiny_gguf_shaped(path: &Path, spec: &TinySpec, matrix_dtype: &dyn Fn(&str, &[usize]) -> HostDType) -> Result<()> {
    let arch = if spec.qk_norm { "qwen3" } else { "llama" };
    let s = |v: &str| GgufValue::String(v.into());
    let u = |v: usize| GgufValue::U32(v as u32);
    let tok = crate::testing::tokenizer_json();
    let mut tokens: Vec<(u32, String)> = tok["model"]["vocab"].as_object().map(|m| m.iter().map(|(k, v)| (v.as_u64().unwrap_or(0) as u32, k.clone())).collect()).unwrap_or_default();
    for a in tok["added_tokens"].as_array().into_iter().flatten() {
        tokens.push((a["id"].as_u64().unwrap_or(0) as u32, a["content"].as_str().unwrap_or("").to_string()));
    }
    tokens.sort();
    let types: Vec<GgufValue> = tokens.iter().map(|(id, _)| GgufValue::I32(if *id >= 256 { 3 } else { 1 })).collect();
    let metadata: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), s(arch)),
        ("general.name".into(), s("tiny")),
        (format!("{arch}.block_count"), u(spec.layers)),
        (format!("{arch}.context_length"), u(spec.max_position)),
        (format!("{arch}.embedding_length"), u(spec.hidden)),
        (format!("{arch}.feed_forward_length"), u(spec.intermediate)),
        (format!("{arch}.attention.head_count"), u(spec.heads)),
        (format!("{arch}.attention.head_count_kv"), u(spec.kv_heads)),
        (format!("{arch}.attention.key_length"), u(spec.head_dim)),
        (format!("{arch}.attention.value_length"), u(spec.head_dim)),
        (format!("{arch}.rope.freq_base"), GgufValue::F32(spec.rope_theta as f32)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-6)),
        (format!("{arch}.vocab_size"), u(spec.vocab)),
        ("general.file_type".into(), GgufValue::U32(1)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("default")),
        ("tokenizer.ggml.tokens".into(), GgufValue::Array(tokens.iter().map(|(_, t)| s(t)).collect())),
        ("tokenizer.ggml.token_type".into(), GgufValue::Array(types)),
        ("tokenizer.ggml.merges".into(), GgufValue::Array(vec![])),
        ("tokenizer.ggml.bos_token_id".into(), GgufValue::U32(ENDOFTEXT)),
        ("tokenizer.ggml.eos_token_id".into(), GgufValue::U32(IM_END)),
        ("tokenizer.ggml.add_bos_token".into(), GgufValue::Bool(false)),
        ("tokenizer.chat_template".into(), s(crate::testing::CHAT_TEMPLATE)),
    ];
    let mut tensors = Vec::new();
    for (name, shape, mut values) in tiny_tensors(spec) {
        if !spec.qk_norm {
            if name.ends_with("self_attn.q_proj.weight") {
                values = llama_cpp_permute(&values, spec.heads, shape[1]);
            } else if name.ends_with("self_attn.k_proj.weight") {
                values = llama_cpp_permute(&values, spec.kv_heads, shape[1]);
            }
        }
        let dtype = if shape.len() == 1 { HostDType::F32 } else { matrix_dtype(&name, &shape) };
        tensors.push(GgufTensor { name: gguf_name(&name), ggml_type: ggml_type(dtype), data: encode(dtype, &values), shape });
    }
    std::fs::write(path, gguf_bytes(&metadata, &tensors)).map_err(|e| ModelError::Io { path: path.into(), source: e })
}

/// What a GGUF's matrices are stored as: one type for all, or one of llama.cpp's K-quant mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Uniform(HostDType),
    /// llama.cpp's Q4_K_M: Q4_K, with Q6_K for the output matrix and for attn_v and ffn_down in the
    /// layers `use_more_bits` picks.
    Q4KM,
    /// llama.cpp's Q5_K_M: the same rule over Q5_K.
    Q5KM,
}

impl FileType {
    /// f32, f16, bf16, a block type (q8_0 ... q6_k), q4_k_m or q5_k_m.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Some(Self::Uniform(HostDType::F32)),
            "f16" => Some(Self::Uniform(HostDType::F16)),
            "bf16" => Some(Self::Uniform(HostDType::BF16)),
            "q4_k_m" => Some(Self::Q4KM),
            "q5_k_m" => Some(Self::Q5KM),
            other => QuantType::parse(other).map(|q| Self::Uniform(HostDType::Quant(q))),
        }
    }

    /// The type of Hugging Face matrix `name` of shape `[rows, cols]` in a model of `layers` layers,
    /// by llama.cpp's rules (llama_tensor_get_type), including its fallbacks for rows that are not
    /// whole super-blocks (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0) or whole 32-value blocks (f16).
    pub fn matrix_type(self, name: &str, shape: &[usize], layers: usize) -> HostDType {
        let more_bits = |i: usize| i < layers / 8 || i >= 7 * layers / 8 || (i as isize - (layers / 8) as isize).rem_euclid(3) == 2;
        let layer = name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()).and_then(|l| l.parse::<usize>().ok());
        let base = match self {
            Self::Uniform(d) => d,
            Self::Q4KM | Self::Q5KM => {
                let base = if self == Self::Q4KM { QuantType::Q4_K } else { QuantType::Q5_K };
                let wide = name == "lm_head.weight"
                    || ((name.contains("self_attn.v_proj") || name.contains("mlp.down_proj")) && layer.is_some_and(more_bits));
                HostDType::Quant(if wide { QuantType::Q6_K } else { base })
            }
        };
        let cols = shape.last().copied().unwrap_or(0);
        match base {
            HostDType::Quant(q) if cols % q.block_values() != 0 => {
                let fallback = match q {
                    QuantType::Q4_K => QuantType::Q5_0,
                    QuantType::Q5_K => QuantType::Q5_1,
                    QuantType::Q6_K => QuantType::Q8_0,
                    other => other,
                };
                if cols % fallback.block_values() == 0 {
                    HostDType::Quant(fallback)
                } else {
                    HostDType::F16
                }
            }
            other => other,
        }
    }
}

/// The tiny model of `spec` as a GGUF of file type `ftype` (see `write_tiny_gguf`).
pub fn write_tiny_gguf_as(path: &Path, spec: &TinySpec, ftype: FileType) -> Result<()> {
    write_tiny_gguf_shaped(path, spec, &|name, shape| ftype.matrix_type(name, shape, spec.layers))
}
