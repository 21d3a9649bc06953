//! Opening a device and loading a model folder with a progress bar on stderr.

use crate::CliError;
use domino_engine::{BackendChoice, DTypeChoice, Gpu, GpuOptions, KernelChoice, WeightFormat};
use domino_models::tokenizer::TextTokenizer;
use domino_models::open_model;
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::{Checkpoint, Qwen3Model};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::sync::Arc;

pub struct Loaded {
    pub model: Qwen3Model,
    pub tokenizer: Option<TextTokenizer>,
    /// eos ids from config.json, generation_config.json and tokenizer_config.json.
    pub stop_ids: Vec<u32>,
}

/// `--dtype`: auto keeps each tensor as stored (GGUF blocks stay quantized, floats become f16);
/// f16 / f32 dequantize or convert everything; q8_0 / q4_0 / q4_1 quantize float weights at load.
pub fn parse_dtype(s: &str) -> Result<DTypeChoice, CliError> {
    DTypeChoice::parse(s).ok_or_else(|| CliError::Usage(format!("--dtype {s}: expected auto, f16, f32, q8_0, q4_0 or q4_1")))
}

/// Drafters are float checkpoints: f32 when asked for, f16 otherwise.
pub fn drafter_format(choice: DTypeChoice) -> WeightFormat {
    if choice == DTypeChoice::Format(WeightFormat::F32) {
        WeightFormat::F32
    } else {
        WeightFormat::F16
    }
}

/// `--weight-storage`: where f16 / f32 weight matrices live. auto = textures on CPU adapters (llvmpipe,
/// SwiftShader), storage buffers elsewhere.
pub fn parse_weight_storage(s: &str) -> Result<Option<bool>, CliError> {
    match s {
        "auto" => Ok(None),
        "textures" => Ok(Some(true)),
        "buffers" => Ok(Some(false)),
        _ => Err(CliError::Usage(format!("--weight-storage {s}: expected auto, buffers or textures"))),
    }
}

/// `--kernels`: auto (GPU kernels on GPUs, CPU-adapter kernels on CPU adapters), cpu or gpu.
pub fn parse_kernels(s: &str) -> Result<KernelChoice, CliError> {
    KernelChoice::parse(s).map_err(|_| CliError::Usage(format!("--kernels {s}: expected auto, cpu or gpu")))
}

pub fn open_gpu(backend: &str, adapter: Option<usize>, weight_storage: &str, kernels: &str) -> Result<Arc<Gpu>, CliError> {
    let backend = BackendChoice::parse(backend)?;
    let weight_textures = parse_weight_storage(weight_storage)?;
    let kernels = parse_kernels(kernels)?;
    Ok(pollster::block_on(Gpu::new(&GpuOptions { backend, adapter, weight_textures, kernels, ..Default::default() }))?)
}

/// Load a model folder (config.json + safetensors) or GGUF file onto `gpu`.
pub fn load_model(gpu: Arc<Gpu>, path: &Path, dtype: DTypeChoice, quiet: bool) -> Result<Loaded, CliError> {
    let files = open_model(path)?;
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(0) };
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message("loading");
    let model = Qwen3Model::load_with(gpu, files.config, files.weights.as_ref(), dtype, &mut |done, total, _name| {
        bar.set_length(total);
        bar.set_position(done);
    })?;
    bar.finish_and_clear();
    Ok(Loaded { model, tokenizer: files.tokenizer, stop_ids: files.stop_ids })
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
