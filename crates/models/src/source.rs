//! Opening a model from a path: a Hugging Face folder (config.json, *.safetensors, tokenizer files)
//! or a GGUF file (or a folder holding exactly one .gguf file), giving the config, the weights under
//! Hugging Face names, the tokenizer and the stop ids either way.

use crate::checkpoint::{Checkpoint, WeightSource};
use crate::config::{generation_eos, Qwen3Config};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::gguf_model::{config_from_gguf, GgufWeights};
use crate::gguf_tokenizer::tokenizer_from_gguf;
use crate::tokenizer::TextTokenizer;
use std::path::{Path, PathBuf};

pub struct ModelFiles {
    pub config: Qwen3Config,
    pub weights: Box<dyn WeightSource>,
    pub tokenizer: Option<TextTokenizer>,
    /// eos ids from every place a format keeps them, sorted and deduplicated.
    pub stop_ids: Vec<u32>,
    /// The file or folder the weights came from.
    pub path: PathBuf,
}

/// The GGUF file a path names: the path itself, or the only .gguf in a folder without config.json.
pub fn gguf_path(path: &Path) -> Result<Option<PathBuf>> {
    if path.is_file() {
        return Ok(path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")).then(|| path.to_path_buf()));
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let rd = std::fs::read_dir(path).map_err(|e| ModelError::Io { path: path.into(), source: e })?;
    let mut found: Vec<PathBuf> = rd.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))).collect();
    found.sort();
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        _ => Err(ModelError::Config {
            path: path.into(),
            message: format!(
                "holds {} .gguf files ({}); pass the one to use",
                found.len(),
                found.iter().filter_map(|p| p.file_name()).map(|f| f.to_string_lossy().to_string()).collect::<Vec<_>>().join(", ")
            ),
        }),
    }
}

/// A parsed GGUF file as a model: config, tokenizer and chat template from its metadata, stop ids,
/// and its tensors under Hugging Face names. Natively the file is mapped (`open_model`); the browser
/// build passes a `GgufFile` read from a Blob (`GgufFile::from_source`), so both share this.
pub fn gguf_model_files(g: GgufFile) -> Result<ModelFiles> {
    let config = config_from_gguf(&g)?;
    let tokenizer = if g.get("tokenizer.ggml.tokens").is_some() { Some(tokenizer_from_gguf(&g)?) } else { None };
    let mut stop_ids = config.eos_token_ids.clone();
    if let Some(eot) = g.opt_u64("tokenizer.ggml.eot_token_id")? {
        stop_ids.push(eot as u32);
    }
    stop_ids.sort();
    stop_ids.dedup();
    let path = g.path.clone();
    let weights = Box::new(GgufWeights::new(g, &config));
    Ok(ModelFiles { config, weights, tokenizer, stop_ids, path })
}

/// Open a model folder or GGUF file (headers only: weights stay mapped until uploaded).
pub fn open_model(path: &Path) -> Result<ModelFiles> {
    if !path.exists() {
        return Err(ModelError::Missing { path: path.into() });
    }
    if let Some(file) = gguf_path(path)? {
        return gguf_model_files(GgufFile::open(&file)?);
    }
    let config = Qwen3Config::from_file(&path.join("config.json"))?;
    let tokenizer = if path.join("tokenizer.json").exists() { Some(TextTokenizer::from_dir(path)?) } else { None };
    let weights = Box::new(Checkpoint::open(path)?);
    let mut stop_ids = config.eos_token_ids.clone();
    stop_ids.extend(generation_eos(path)?);
    if let Some(t) = &tokenizer {
        stop_ids.extend(t.eos_token_ids());
    }
    stop_ids.sort();
    stop_ids.dedup();
    Ok(ModelFiles { config, weights, tokenizer, stop_ids, path: path.into() })
}
