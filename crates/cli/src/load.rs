//! Opening a device and loading a model folder with a progress bar on stderr.

use crate::CliError;
use domino_engine::{BackendChoice, DTypeChoice, Gpu, GpuOptions, KernelChoice, WeightFormat};
use domino_models::tokenizer::TextTokenizer;
use domino_models::{open_model, ModelFiles};
use domino_runtime::{MemoryLimits, MemoryPlan, MemoryRequest};
use domino_models::drafter::DrafterConfig;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::ngram_table::NgramTable;
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
/// f16 / f32 dequantize or convert everything; a block type (q8_0 ... q6_k) quantizes at load.
pub fn parse_dtype(s: &str) -> Result<DTypeChoice, CliError> {
    DTypeChoice::parse(s).ok_or_else(|| CliError::Usage(format!("--dtype {s}: expected auto, f16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k")))
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

/// Where and how a model runs: the device flags `generate`, `serve` and `chat` share.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceArgs {
    /// How weights are stored on the GPU: auto (as stored: GGUF blocks stay quantized, floats f16),
    /// f16, f32, or a block type: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k.
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// auto, vulkan, metal, dx12 or gl.
    #[arg(long, default_value = "auto")]
    pub backend: String,
    /// Adapter index as listed by `domino devices`.
    #[arg(long)]
    pub adapter: Option<usize>,
    /// Where f16 / f32 weight matrices live on the GPU: auto (textures on CPU adapters such as
    /// llvmpipe, where they read much faster; storage buffers elsewhere), buffers or textures.
    #[arg(long, default_value = "auto")]
    pub weight_storage: String,
    /// Kernel family: auto (GPU kernels on GPUs, CPU-adapter kernels on CPU adapters), cpu or gpu.
    /// Forcing one runs it anywhere (the GPU kernels are tested on the software adapters too).
    #[arg(long, default_value = "auto")]
    pub kernels: String,
}

impl DeviceArgs {
    pub fn open_gpu(&self) -> Result<Arc<Gpu>, CliError> {
        open_gpu(&self.backend, self.adapter, &self.weight_storage, &self.kernels)
    }
}

pub fn open_gpu(backend: &str, adapter: Option<usize>, weight_storage: &str, kernels: &str) -> Result<Arc<Gpu>, CliError> {
    let backend = BackendChoice::parse(backend)?;
    let weight_textures = parse_weight_storage(weight_storage)?;
    let kernels = parse_kernels(kernels)?;
    let opts = limits_from_env(GpuOptions { backend, adapter, weight_textures, kernels, ..Default::default() })?;
    Ok(pollster::block_on(Gpu::new(&opts))?)
}

/// `DOMINO_MEMORY_BUDGET` (the bytes a model may use on the adapter) and `DOMINO_MAX_BINDING` (a
/// lower max_storage_buffer_binding_size / max_buffer_size requested from the device), both with
/// an optional K/M/G suffix: impose a small adapter on purpose (tests, or a shared device).
pub fn limits_from_env(mut opts: GpuOptions) -> Result<GpuOptions, CliError> {
    for (var, slot) in [("DOMINO_MEMORY_BUDGET", &mut opts.memory_budget), ("DOMINO_MAX_BINDING", &mut opts.max_binding)] {
        if let Ok(v) = std::env::var(var) {
            *slot = Some(parse_size(&v).ok_or_else(|| CliError::Usage(format!("{var}={v}: expected a byte count such as 512M or 2G")))?);
        }
    }
    Ok(opts)
}

/// "4096", "512K", "64M", "2G" (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 10),
        (i, 'm' | 'M') => (&s[..i], 20),
        (i, 'g' | 'G') => (&s[..i], 30),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// `--context N` or, without it, prompt + max_tokens within the model's positions.
pub fn context_for(requested: Option<usize>, prompt: usize, max_tokens: usize, max_position: usize) -> usize {
    requested.unwrap_or_else(|| (prompt + max_tokens).min(max_position)).max(1)
}

/// The memory check before any upload: the model as `files` holds it in `dtype`, an optional
/// drafter folder, and `context` KV positions, against `gpu`'s limits.
pub fn check_memory(gpu: &Gpu, files: &ModelFiles, dtype: DTypeChoice, draft: Option<&str>, context: usize) -> Result<MemoryPlan, CliError> {
    check_memory_for(gpu, files, dtype, draft, context, 1)
}

/// As `check_memory`, for `sequences` KV caches of `context` positions (`serve --max-batch`).
pub fn check_memory_for(gpu: &Gpu, files: &ModelFiles, dtype: DTypeChoice, draft: Option<&str>, context: usize, sequences: usize) -> Result<MemoryPlan, CliError> {
    let drafter = draft.map(|d| DrafterConfig::from_file(&Path::new(d).join("config.json"))).transpose()?;
    if let Some(d) = &drafter {
        // A drafter for another target is refused here, before the target is uploaded.
        d.validate_against(&files.config)?;
    }
    let req = MemoryRequest {
        config: &files.config,
        weights: files.weights.as_ref(),
        dtype,
        drafter: drafter.as_ref().map(|d| (d, drafter_format(dtype))),
        context,
        sequences,
    };
    Ok(domino_runtime::check_memory(&req, &MemoryLimits::of(gpu))?)
}

/// Load a model folder (config.json + safetensors) or GGUF file onto `gpu`.
pub fn load_model(gpu: Arc<Gpu>, path: &Path, dtype: DTypeChoice, quiet: bool) -> Result<Loaded, CliError> {
    upload_model(gpu, open_model(path)?, dtype, quiet)
}

/// Upload a model opened with `open_model` (headers read, weights still mapped).
pub fn upload_model(gpu: Arc<Gpu>, files: ModelFiles, dtype: DTypeChoice, quiet: bool) -> Result<Loaded, CliError> {
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
/// `draft_vocab`: the shortlist of token ids drafts come from (`DraftVocab::tokens`; None: all).
pub fn load_drafter(target: &Qwen3Model, dir: &str, block_size: Option<usize>, draft_vocab: Option<usize>, format: WeightFormat) -> Result<DrafterModel, CliError> {
    let dir = Path::new(dir);
    let mut config = DrafterConfig::from_file(&dir.join("config.json"))?;
    if let Some(b) = block_size {
        config.block_size = b;
    }
    let ckpt = Checkpoint::open(dir)?;
    let mut drafter = DrafterModel::load(config, &ckpt, target, format)?;
    drafter.set_draft_vocab(target, draft_vocab)?;
    drafter.lookup_table = NgramTable::load_beside(dir, target.config.vocab_size)?.map(Arc::new);
    Ok(drafter)
}
