//! The training-data folder written by `domino train data` and read by `domino train drafter`.
//!
//! ```text
//! DIR/meta.json                  what the data was made from (format, target shape, feature layers, prompts hash)
//! DIR/shard-00000.safetensors    sequences [0, shard_size): per sequence j, `seq.j.tokens` [n] U32 (prompt +
//!                                greedy continuation), `seq.j.features` [n, k·h] F16 (the target's residual
//!                                streams after each target layer id, concatenated), metadata `prompt_lens`
//! ```
//! A shard is written to a temporary name and renamed when complete, so an interrupted run leaves
//! only whole shards and resumes after the last one.

use crate::error::{format_error, io, Result, TrainError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "domino-train-data/1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DataMeta {
    pub format: String,
    /// Target architecture the features come from.
    pub hidden_size: usize,
    pub num_target_layers: usize,
    pub vocab_size: usize,
    pub target_layer_ids: Vec<usize>,
    /// Continuation length per prompt (fewer when the target stopped at EOS).
    pub max_new_tokens: usize,
    pub shard_size: usize,
    pub num_prompts: usize,
    /// FNV-1a of the prompts' token ids: a resumed run must continue the same prompts.
    pub prompts_hash: String,
}

/// One training sequence: token ids and per-token features `[n][k·h]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub features: Vec<half::f16>,
}

pub fn shard_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("shard-{index:05}.safetensors"))
}

pub fn prompts_hash(prompts: &[Vec<u32>]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in prompts {
        for &t in p.iter().chain(std::iter::once(&u32::MAX)) {
            for b in t.to_le_bytes() {
                h ^= b as u64;
                h = h.wrapping_mul(0x100000001b3);
            }
        }
    }
    format!("{h:016x}")
}

impl DataMeta {
    pub fn read(dir: &Path) -> Result<Self> {
        let path = dir.join("meta.json");
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let meta: Self = serde_json::from_slice(&bytes).map_err(|e| format_error(&path, e.to_string()))?;
        if meta.format != FORMAT {
            return Err(format_error(&path, format!("format '{}' is not {FORMAT}", meta.format)));
        }
        if meta.shard_size == 0 || meta.target_layer_ids.is_empty() {
            return Err(format_error(&path, "shard_size and target_layer_ids must be non-empty"));
        }
        Ok(meta)
    }

    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join("meta.json");
        let text = serde_json::to_vec_pretty(self).map_err(|e| format_error(&path, e.to_string()))?;
        std::fs::write(&path, text).map_err(io(&path))
    }

    pub fn feature_width(&self) -> usize {
        self.target_layer_ids.len() * self.hidden_size
    }

    pub fn num_shards(&self) -> usize {
        self.num_prompts.div_ceil(self.shard_size)
    }
}

/// Write one shard atomically (temporary file, then rename).
pub fn write_shard(dir: &Path, index: usize, seqs: &[Sequence], width: usize) -> Result<()> {
    let path = shard_path(dir, index);
    let mut bufs: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (j, s) in seqs.iter().enumerate() {
        let n = s.tokens.len();
        if s.features.len() != n * width {
            return Err(TrainError::Invalid(format!("sequence {j}: {} feature values for {n} tokens of width {width}", s.features.len())));
        }
        bufs.push((format!("seq.{j}.tokens"), safetensors::Dtype::U32, vec![n], bytemuck::cast_slice(&s.tokens).to_vec()));
        let f: Vec<u8> = s.features.iter().flat_map(|x| x.to_le_bytes()).collect();
        bufs.push((format!("seq.{j}.features"), safetensors::Dtype::F16, vec![n, width], f));
    }
    let mut views = Vec::new();
    for (name, dtype, shape, bytes) in &bufs {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).map_err(|e| format_error(&path, format!("{e:?}")))?;
        views.push((name.clone(), view));
    }
    let lens: Vec<String> = seqs.iter().map(|s| s.prompt_len.to_string()).collect();
    let metadata = HashMap::from([("prompt_lens".to_string(), lens.join(","))]);
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| format_error(&path, format!("{e:?}")))?;
    let tmp = path.with_extension("safetensors.partial");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

/// Read every sequence of one shard, checking shapes against `meta`.
pub fn read_shard(dir: &Path, index: usize, meta: &DataMeta) -> Result<Vec<Sequence>> {
    let path = shard_path(dir, index);
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| format_error(&path, format!("{e:?}")))?;
    let lens: Vec<usize> = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("prompt_lens"))
        .ok_or_else(|| format_error(&path, "missing metadata 'prompt_lens'"))?
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|e| format_error(&path, format!("prompt_lens: {e}"))))
        .collect::<Result<_>>()?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format_error(&path, format!("{e:?}")))?;
    let width = meta.feature_width();
    let mut out = Vec::with_capacity(lens.len());
    for (j, &prompt_len) in lens.iter().enumerate() {
        let get = |name: String, dtype: safetensors::Dtype| {
            let t = st.tensor(&name).map_err(|e| format_error(&path, format!("{name}: {e:?}")))?;
            if t.dtype() != dtype {
                return Err(format_error(&path, format!("{name}: dtype {:?}, expected {dtype:?}", t.dtype())));
            }
            Ok((t.shape().to_vec(), t.data().to_vec()))
        };
        let (tshape, tbytes) = get(format!("seq.{j}.tokens"), safetensors::Dtype::U32)?;
        let (fshape, fbytes) = get(format!("seq.{j}.features"), safetensors::Dtype::F16)?;
        let n = tshape.first().copied().unwrap_or(0);
        if tshape.len() != 1 || fshape != [n, width] || prompt_len == 0 || prompt_len > n {
            return Err(format_error(&path, format!("sequence {j}: tokens {tshape:?}, features {fshape:?}, prompt length {prompt_len}; expected features [{n}, {width}]")));
        }
        let tokens: Vec<u32> = tbytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= meta.vocab_size) {
            return Err(format_error(&path, format!("sequence {j}: token {bad} outside the vocabulary ({})", meta.vocab_size)));
        }
        let features = fbytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]])).collect();
        out.push(Sequence { tokens, prompt_len, features });
    }
    Ok(out)
}

/// Every sequence of the folder (all shards must be complete).
pub fn read_all(dir: &Path) -> Result<(DataMeta, Vec<Sequence>)> {
    let meta = DataMeta::read(dir)?;
    let mut seqs = Vec::new();
    for i in 0..meta.num_shards() {
        if !shard_path(dir, i).exists() {
            return Err(format_error(dir, format!("shard {i} of {} is missing: finish it with `domino train data` (it resumes)", meta.num_shards())));
        }
        seqs.extend(read_shard(dir, i, &meta)?);
    }
    Ok((meta, seqs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_round_trip_and_reject_bad_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let meta = DataMeta {
            format: FORMAT.into(),
            hidden_size: 2,
            num_target_layers: 3,
            vocab_size: 10,
            target_layer_ids: vec![0, 2],
            max_new_tokens: 4,
            shard_size: 2,
            num_prompts: 2,
            prompts_hash: prompts_hash(&[vec![1], vec![2, 3]]),
        };
        meta.write(dir.path()).unwrap();
        let f = |n: usize| (0..n * 4).map(|i| half::f16::from_f32(i as f32 * 0.5)).collect();
        let seqs = vec![
            Sequence { tokens: vec![1, 4, 5], prompt_len: 1, features: f(3) },
            Sequence { tokens: vec![2, 3, 9, 9], prompt_len: 2, features: f(4) },
        ];
        write_shard(dir.path(), 0, &seqs, meta.feature_width()).unwrap();
        let (m, back) = read_all(dir.path()).unwrap();
        assert_eq!(m, meta);
        assert_eq!(back, seqs);
        // A token outside the vocabulary is an error naming the sequence.
        let bad = vec![Sequence { tokens: vec![11], prompt_len: 1, features: f(1) }];
        write_shard(dir.path(), 0, &bad, 4).unwrap();
        let e = read_all(dir.path()).unwrap_err().to_string();
        assert!(e.contains("token 11"), "{e}");
        // Feature rows that do not match the tokens are refused when writing.
        assert!(write_shard(dir.path(), 0, &[Sequence { tokens: vec![1, 2], prompt_len: 1, features: f(1) }], 4).is_err());
    }
}
