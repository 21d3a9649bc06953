//! Opening a device and loading a model folder with a progress bar on stderr.

use crate::CliError;
use domino_engine::{BackendChoice, Gpu, GpuOptions, WeightFormat};
use domino_models::config::generation_eos;
use domino_models::tokenizer::TextTokenizer;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::{Checkpoint, Qwen3Config, Qwen3Model};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::sync::Arc;

pub struct Loaded {
    pub model: Qwen3Model,
    pub tokenizer: Option<TextTokenizer>,
    /// eos ids from config.json, generation_config.json and tokenizer_config.json.
    pub stop_ids: Vec<u32>,
}

pub fn parse_dtype(s: &str) -> Result<WeightFormat, CliError> {
    match s {
        "f16" => Ok(WeightFormat::F16),
        "f32" => Ok(WeightFormat::F32),
        other => Err(CliError::Usage(format!("--dtype {other}: expected f16 or f32"))),
    }
}

pub fn open_gpu(backend: &str, adapter: Option<usize>) -> Result<Arc<Gpu>, CliError> {
    let backend = BackendChoice::parse(backend)?;
    Ok(pollster::block_on(Gpu::new(&GpuOptions { backend, adapter, ..Default::default() }))?)
}

pub fn load_model(gpu: Arc<Gpu>, dir: &Path, format: WeightFormat, quiet: bool) -> Result<Loaded, CliError> {
    let config = Qwen3Config::from_file(&dir.join("config.json"))?;
    let tokenizer = if dir.join("tokenizer.json").exists() { Some(TextTokenizer::from_dir(dir)?) } else { None };
    let ckpt = Checkpoint::open(dir)?;
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("loading");
    let model = Qwen3Model::load(gpu, config, &ckpt, format, &mut |done, total, _name| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    let mut stop_ids = model.config.eos_token_ids.clone();
    stop_ids.extend(generation_eos(dir)?);
    if let Some(t) = &tokenizer {
        stop_ids.extend(t.eos_token_ids());
    }
    stop_ids.sort();
    stop_ids.dedup();
    Ok(Loaded { model, tokenizer, stop_ids })
}

/// Load a DFlash / Domino drafter folder for `target`, optionally with another block size.
pub fn load_drafter(target: &Qwen3Model, dir: &str, block_size: Option<usize>, format: WeightFormat) -> Result<DrafterModel, CliError> {
    let dir = Path::new(dir);
    let mut config = DrafterConfig::from_file(&dir.join("config.json"))?;
    if let Some(b) = block_size {
        config.block_size = b;
    }
    let ckpt = Checkpoint::open(dir)?;
    Ok(DrafterModel::load(config, &ckpt, target, format)?)
}
