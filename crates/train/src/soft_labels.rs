//! Soft labels: the target's top-k next-token distribution at every continuation position of a
//! training-data folder, for distilling the target's distribution into the drafter instead of
//! only its greedy token (Hinton et al. 2015; DistillSpec, Zhou et al. 2024, for draft models).
//!
//! They come from the stored features, without decoding again: the data keeps the residual stream
//! after the deepest feature layer L for every token, so the target's layers L+1…, its final norm
//! and its lm_head turn those rows back into logits (for SmolLM2 with features up to layer 27 of
//! 30: two layers and the lm_head, about a quarter of a forward).
//!
//! ```text
//! DIR/soft-labels/meta.json                 format, top_k, from_layer, the data's prompts_hash
//! DIR/soft-labels/shard-00000.safetensors   per sequence j of data shard 0: `seq.j.ids` [m, K] U32
//!                                           and `seq.j.logp` [m, K] F32, m = n − prompt_len; row r is
//!                                           the target's distribution over the token at prompt_len + r
//!                                           (computed at position prompt_len − 1 + r), ids by falling
//!                                           log-probability, logp over the whole vocabulary
//! ```
//! Shards are written atomically and skipped when present, so an interrupted run resumes.

use crate::cpu_target::{CpuTarget, Row};
use crate::data::{read_shard, DataMeta, Sequence};
use crate::error::{format_error, io, Result, TrainError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "domino-soft-labels/1";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SoftMeta {
    pub format: String,
    /// Candidates kept per position.
    pub top_k: usize,
    /// The feature layer the logits were continued from.
    pub from_layer: usize,
    /// The data folder's prompts_hash: soft labels belong to exactly that data.
    pub prompts_hash: String,
}

/// One sequence's soft labels.
#[derive(Debug, Clone, PartialEq)]
pub struct SoftRows {
    pub top_k: usize,
    /// Position of the first row (prompt_len − 1): row r is computed at position first_pos + r.
    pub first_pos: usize,
    pub ids: Vec<u32>,
    pub logp: Vec<f32>,
}

impl SoftRows {
    /// The target's top-k (ids, log-probabilities) for the token at position `pos + 1`.
    pub fn at(&self, pos: usize) -> Option<(&[u32], &[f32])> {
        let r = pos.checked_sub(self.first_pos)?;
        let k = self.top_k;
        Some((self.ids.get(r * k..(r + 1) * k)?, self.logp.get(r * k..(r + 1) * k)?))
    }

    fn rows(&self) -> usize {
        self.ids.len() / self.top_k.max(1)
    }
}

#[derive(Debug, Clone, Default)]
pub struct SoftSummary {
    pub shards_written: usize,
    pub shards_skipped: usize,
    /// Positions labelled in this run.
    pub rows: usize,
    /// Of those, how many have the data's next token as their top candidate: a self-distilled
    /// continuation is the target's greedy text, so this should be close to 1 (f16 features and
    /// another summation order flip only near-ties).
    pub top1_agrees: usize,
}

pub fn soft_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("soft-labels")
}

fn shard_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("shard-{index:05}.safetensors"))
}

/// Write soft labels for every shard of `data_dir` that has none yet. `progress(done, total)`
/// counts shards.
pub fn make_soft_labels(target: &CpuTarget, data_dir: &Path, top_k: usize, progress: &mut dyn FnMut(usize, usize)) -> Result<SoftSummary> {
    let meta = DataMeta::read(data_dir)?;
    let c = &target.config;
    if meta.hidden_size != c.hidden_size || meta.num_target_layers != c.num_layers || meta.vocab_size != c.vocab_size {
        return Err(format_error(&data_dir.join("meta.json"), "the data was made by another target (hidden size, layers or vocabulary differ)"));
    }
    if top_k == 0 || top_k > c.vocab_size {
        return Err(TrainError::Invalid(format!("--top-k must lie in 1..={}", c.vocab_size)));
    }
    let (slot, from_layer) = meta.target_layer_ids.iter().copied().enumerate().max_by_key(|&(_, l)| l).ok_or_else(|| TrainError::Invalid("the data has no feature layers".into()))?;
    let dir = soft_dir(data_dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let soft_meta = SoftMeta { format: FORMAT.into(), top_k, from_layer, prompts_hash: meta.prompts_hash.clone() };
    let meta_path = dir.join("meta.json");
    if meta_path.exists() {
        let old = read_meta(&dir)?;
        if old != soft_meta {
            return Err(format_error(&meta_path, format!("soft labels with other settings are here ({old:?}): delete the folder to make them again")));
        }
    } else {
        let text = serde_json::to_vec_pretty(&soft_meta).map_err(|e| format_error(&meta_path, e.to_string()))?;
        crate::export::write_atomic(&meta_path, &text)?;
    }
    let mut summary = SoftSummary::default();
    let total = meta.num_shards();
    for index in 0..total {
        let path = shard_path(&dir, index);
        if path.exists() {
            summary.shards_skipped += 1;
            progress(index + 1, total);
            continue;
        }
        let seqs = read_shard(data_dir, index, &meta)?;
        let mut rows_of = Vec::with_capacity(seqs.len());
        for seq in &seqs {
            let rows = sequence_soft_labels(target, seq, meta.feature_width(), slot, from_layer, top_k)?;
            summary.rows += rows.rows();
            summary.top1_agrees += (0..rows.rows()).filter(|&r| rows.ids[r * top_k] == seq.tokens[rows.first_pos + r + 1]).count();
            rows_of.push(rows);
        }
        write_shard(&path, &rows_of)?;
        summary.shards_written += 1;
        progress(index + 1, total);
    }
    Ok(summary)
}

/// The top-k rows of one sequence, continuing its stored layer-`from_layer` features (feature slot
/// `slot`) through the rest of the target.
fn sequence_soft_labels(target: &CpuTarget, seq: &Sequence, width: usize, slot: usize, from_layer: usize, top_k: usize) -> Result<SoftRows> {
    let h = target.config.hidden_size;
    let n = seq.tokens.len();
    let first_pos = seq.prompt_len - 1;
    let rows: Vec<Row> = (0..n).map(|pos| Row { seq: 0, pos, token: seq.tokens[pos], logits: pos >= first_pos && pos + 1 < n }).collect();
    let x: Vec<f32> = (0..n).flat_map(|p| seq.features[p * width + slot * h..][..h].iter().map(|v| v.to_f32())).collect();
    let mut caches = [target.new_cache(n)];
    let logits = target.logits_after_layer(from_layer, x, &rows, &mut caches)?;
    let vocab = target.config.vocab_size;
    let (mut ids, mut logp) = (Vec::new(), Vec::new());
    for row in logits.chunks_exact(vocab.max(1)) {
        let (i, l) = top_k_log_probs(row, top_k);
        ids.extend(i);
        logp.extend(l);
    }
    Ok(SoftRows { top_k, first_pos, ids, logp })
}

/// The `k` largest entries of `logits` as (ids, log-softmax values), by falling value (ties: lower id).
pub fn top_k_log_probs(logits: &[f32], k: usize) -> (Vec<u32>, Vec<f32>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let log_z = max + logits.iter().map(|&v| ((v - max) as f64).exp()).sum::<f64>().ln() as f32;
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_value = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    let k = k.min(order.len());
    if k < order.len() {
        order.select_nth_unstable_by(k, by_value);
        order.truncate(k);
    }
    order.sort_by(by_value);
    let logp = order.iter().map(|&i| logits[i as usize] - log_z).collect();
    (order, logp)
}

fn read_meta(dir: &Path) -> Result<SoftMeta> {
    let path = dir.join("meta.json");
    let bytes = std::fs::read(&path).map_err(io(&path))?;
    let meta: SoftMeta = serde_json::from_slice(&bytes).map_err(|e| format_error(&path, e.to_string()))?;
    if meta.format != FORMAT {
        return Err(format_error(&path, format!("format '{}' is not {FORMAT}", meta.format)));
    }
    if meta.top_k == 0 {
        return Err(format_error(&path, "top_k must be positive"));
    }
    Ok(meta)
}

fn write_shard(path: &Path, rows: &[SoftRows]) -> Result<()> {
    let mut bufs: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (j, r) in rows.iter().enumerate() {
        let m = r.rows();
        bufs.push((format!("seq.{j}.ids"), safetensors::Dtype::U32, vec![m, r.top_k], bytemuck::cast_slice(&r.ids).to_vec()));
        bufs.push((format!("seq.{j}.logp"), safetensors::Dtype::F32, vec![m, r.top_k], bytemuck::cast_slice(&r.logp).to_vec()));
    }
    let mut views = Vec::new();
    for (name, dtype, shape, bytes) in &bufs {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).map_err(|e| format_error(path, format!("{e:?}")))?;
        views.push((name.clone(), view));
    }
    let bytes = safetensors::serialize(views, None).map_err(|e| format_error(path, format!("{e:?}")))?;
    crate::export::write_atomic(path, &bytes)
}

/// The soft labels of every sequence of the data folder, in the data's order, checked against
/// the sequences (`seqs` as `read_all` returns them).
pub fn read_soft_labels(data_dir: &Path, meta: &DataMeta, seqs: &[Sequence]) -> Result<Vec<SoftRows>> {
    let dir = soft_dir(data_dir);
    if !dir.join("meta.json").exists() {
        return Err(format_error(&dir, "no soft labels here: make them with `domino train soft-labels --data DIR`"));
    }
    let soft = read_meta(&dir)?;
    if soft.prompts_hash != meta.prompts_hash {
        return Err(format_error(&dir.join("meta.json"), "these soft labels were made for other data (prompts_hash differs)"));
    }
    let k = soft.top_k;
    let mut out = Vec::with_capacity(seqs.len());
    for index in 0..meta.num_shards() {
        let path = shard_path(&dir, index);
        if !path.exists() {
            return Err(format_error(&path, "missing: finish the soft labels with `domino train soft-labels` (it resumes)"));
        }
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format_error(&path, format!("{e:?}")))?;
        // As many sequences as this file labels, after those of the files before it.
        let first = out.len();
        let in_shard = st.names().iter().filter(|n| n.ends_with(".ids")).count();
        let shard_seqs = seqs.get(first..first + in_shard).ok_or_else(|| format_error(&path, format!("labels for {} sequences after {first}, the data has {}", in_shard, seqs.len())))?;
        for (j, seq) in shard_seqs.iter().enumerate() {
            let m = seq.tokens.len() - seq.prompt_len;
            let get = |name: String, dtype: safetensors::Dtype| {
                let t = st.tensor(&name).map_err(|e| format_error(&path, format!("{name}: {e:?}")))?;
                if t.dtype() != dtype || t.shape() != [m, k] {
                    return Err(format_error(&path, format!("{name}: {:?} {:?}, expected {dtype:?} [{m}, {k}]", t.dtype(), t.shape())));
                }
                Ok(t.data().to_vec())
            };
            let ids: Vec<u32> = get(format!("seq.{j}.ids"), safetensors::Dtype::U32)?.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= meta.vocab_size) {
                return Err(format_error(&path, format!("sequence {j}: token {bad} outside the vocabulary ({})", meta.vocab_size)));
            }
            let logp: Vec<f32> = get(format!("seq.{j}.logp"), safetensors::Dtype::F32)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if logp.iter().any(|v| !(v.is_finite() && *v <= 1e-3)) {
                return Err(format_error(&path, format!("sequence {j}: a log-probability that is not finite and at most 0")));
            }
            out.push(SoftRows { top_k: k, first_pos: seq.prompt_len - 1, ids, logp });
        }
    }
    if out.len() != seqs.len() {
        return Err(format_error(&dir, format!("soft labels for {} sequences, the data has {}", out.len(), seqs.len())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_sorted_and_normalised_over_the_whole_row() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let (ids, logp) = top_k_log_probs(&logits, 3);
        assert_eq!(ids, vec![1, 3, 2]);
        let z: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        for (&i, &l) in ids.iter().zip(&logp) {
            assert!((l as f64 - ((logits[i as usize] as f64).exp() / z).ln()).abs() < 1e-5);
        }
        assert_eq!(top_k_log_probs(&logits, 9).0.len(), 5);
    }
}
