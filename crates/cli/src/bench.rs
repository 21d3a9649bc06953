//! `domino bench`: on one or every adapter, prefill and decode speed of plain decoding (and with a
//! drafter, of the speculative modes), the decode step's effective weight bandwidth next to the
//! adapter's copy bandwidth measured in the same run, and a `domino-bench/1` report.

use crate::load::{check_memory, context_for, drafter_format, limits_from_env, parse_dtype, upload_model};
use crate::report::{self, AdapterFacts, AdapterReport, BenchReport, Workload};
use crate::{model_dir, CliError};
use clap::Args;
use domino_engine::{list_adapters, BackendChoice, DTypeChoice, Gpu, GpuOptions};
use domino_models::tokenizer::TextTokenizer;
use domino_models::Qwen3Config;
use domino_runtime::bench::{self, BenchPlan, BenchProgress};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long)]
    pub model: Option<String>,
    /// Use one synthetic prompt of this many token ids instead of text prompts (the default when the
    /// model has no tokenizer: 128).
    #[arg(long, conflicts_with = "prompts")]
    pub prompt_len: Option<usize>,
    /// A jsonl file of prompts, one {"prompt": "..."} per line.
    #[arg(long)]
    pub prompts: Option<PathBuf>,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Timed runs per prompt (after one warm-up run).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// auto (as stored), f16, f32 or a block type: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (see `domino generate --help`).
    #[arg(long, default_value = "auto")]
    pub dtype: String,
    /// all (every adapter, one after another), auto, vulkan, metal, dx12 or gl.
    #[arg(long, default_value = "auto")]
    pub backend: String,
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
    /// Write the report (schema domino-bench/1) as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the report as a self-contained HTML page with SVG charts.
    #[arg(long)]
    pub html: Option<PathBuf>,
    /// A drafter: also measure its DFlash-style backbone alone and (Domino checkpoints) full Domino.
    #[arg(long)]
    pub draft: Option<String>,
    /// Override the drafter's block size.
    #[arg(long, requires = "draft")]
    pub block_size: Option<usize>,
    /// Token ids a draft may be: auto (the first 8192 of a large vocabulary, a frequency
    /// shortlist that makes the draft's lm_head ~6x cheaper), full, or the first N (a multiple of
    /// 128). Output is unchanged; only acceptance and draft cost move.
    #[arg(long, default_value = "auto", value_parser = domino_models::drafter_gpu::DraftVocab::parse, requires = "draft")]
    pub draft_vocab: domino_models::drafter_gpu::DraftVocab,
    /// Measure the draft / verify / head time split (one extra run per prompt, with syncs) on the
    /// first N prompts only (default: every prompt). Large prompt sets, such as the 164 HumanEval
    /// prompts, need far less time with a small N.
    #[arg(long, requires = "draft")]
    pub split_prompts: Option<usize>,
    /// Drafts verified per round: auto (adaptive) or a fixed number (as `generate --draft-len`).
    #[arg(long, default_value = "auto", value_parser = domino_runtime::DraftLen::parse, requires = "draft")]
    pub draft_len: domino_runtime::DraftLen,
    /// Also draft by prompt lookup: where the text so far repeats (the longest earlier occurrence of
    /// its last 1-3 tokens), a round may verify the tokens that followed it instead of the
    /// drafter's, with no draft pass, when that is expected to commit more tokens per second.
    /// Measured as one more mode ("domino + lookup"), with --draft-len as the other modes.
    #[arg(long, requires = "draft")]
    pub lookup: bool,
    /// KV cache capacity in positions (default: the longest prompt plus --max-tokens), checked
    /// against each adapter's memory limits before loading.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub context: Option<u64>,
}

/// The built-in prompt set (tokenized with the model's tokenizer), shared with the browser's Bench.
pub use domino_runtime::bench::DEFAULT_PROMPTS;

/// Read a jsonl prompt file: one `{"prompt": "..."}` object per non-blank line.
pub fn read_prompt_file(path: &Path) -> Result<Vec<String>, CliError> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CliError::Usage(format!("--prompts {p}: file not found")),
        _ => CliError::Usage(format!("--prompts {p}: {e}")),
    })?;
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| CliError::Usage(format!("--prompts {p}: line {}: malformed JSON: {e}", i + 1)))?;
        match v.get("prompt").and_then(|s| s.as_str()) {
            Some(s) if !s.is_empty() => prompts.push(s.to_string()),
            Some(_) => return Err(CliError::Usage(format!("--prompts {p}: line {}: empty \"prompt\"", i + 1))),
            None => return Err(CliError::Usage(format!("--prompts {p}: line {}: expected an object with a string \"prompt\" field", i + 1))),
        }
    }
    if prompts.is_empty() {
        return Err(CliError::Usage(format!("--prompts {p}: no prompts")));
    }
    Ok(prompts)
}

/// (source, token ids of every prompt).
fn prompt_set(args: &BenchArgs, config: &Qwen3Config, tokenizer: Option<TextTokenizer>) -> Result<(String, Vec<Vec<u32>>), CliError> {
    let (source, texts) = match &args.prompts {
        Some(path) => {
            let texts = read_prompt_file(path)?;
            if tokenizer.is_none() {
                return Err(CliError::Usage(format!("--prompts {}: the model has no tokenizer", path.display())));
            }
            (path.display().to_string(), texts)
        }
        None if tokenizer.is_some() && args.prompt_len.is_none() => ("builtin".to_string(), DEFAULT_PROMPTS.iter().map(|s| s.to_string()).collect()),
        None => {
            let vocab = config.vocab_size as u32;
            let ids = (0..args.prompt_len.unwrap_or(128) as u32).map(|i| (i * 7919 + 13) % vocab).collect();
            return Ok(("synthetic".to_string(), vec![ids]));
        }
    };
    let tok = tokenizer.as_ref().ok_or_else(|| CliError::Usage("no tokenizer".into()))?;
    let mut prompts = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        let ids = tok.encode(t)?;
        if ids.is_empty() {
            return Err(CliError::Usage(format!("{source}: prompt {} tokenizes to no tokens", i + 1)));
        }
        prompts.push(ids);
    }
    Ok((source, prompts))
}

fn bench_adapter(
    gpu: Arc<Gpu>,
    dir: &Path,
    format: DTypeChoice,
    prompts: &[Vec<u32>],
    args: &BenchArgs,
    bar: &ProgressBar,
) -> Result<AdapterReport, CliError> {
    let label = format!("{} ({})", gpu.info.name, gpu.info.backend);
    bar.set_message(format!("{label}: loading"));
    let files = domino_models::open_model(dir)?;
    let max_prompt = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let requested = args.context.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
    let capacity = context_for(requested, max_prompt, args.max_tokens, files.config.max_position_embeddings);
    check_memory(&gpu, &files, format, args.draft.as_deref(), requested.unwrap_or(max_prompt + args.max_tokens))?;
    let loaded = upload_model(gpu.clone(), files, format, true)?;
    let model = &loaded.model;
    let drafter = match &args.draft {
        Some(draft) => {
            bar.set_message(format!("{label}: loading drafter"));
            Some(crate::load::load_drafter(model, draft, args.block_size, args.draft_vocab.tokens(model.config.vocab_size, loaded.tokenizer.as_ref().and_then(|t| t.ranked_vocab())), drafter_format(format))?)
        }
        None => None,
    };
    let plan = BenchPlan {
        prompts: prompts.to_vec(),
        max_tokens: args.max_tokens,
        runs: args.runs,
        capacity,
        spec_capacity: requested.unwrap_or(max_prompt + args.max_tokens),
        split_prompts: args.split_prompts,
        draft_len: args.draft_len,
        lookup: args.lookup,
        copy_bytes: 256u64 << 20,
    };
    // --draft-len auto: round costs calibrated once per (model, drafter, adapter, ...) and cached on disk.
    let mut round_costs = |spec: &mut domino_runtime::SpeculativeSession<'_>, use_head: bool| -> Result<_, CliError> {
        let draft = args.draft.as_deref().unwrap_or_default();
        let key = crate::calibration::CalibrationKey::new(&gpu, dir, Path::new(draft), spec.drafter(), use_head, &args.dtype);
        Ok(Some(crate::calibration::round_costs(spec, &key, true)?))
    };
    let mut progress = |p: BenchProgress| match p {
        BenchProgress::Mode(name) => bar.set_message(format!("{label}: {name}")),
        BenchProgress::Done(_) => bar.inc(1),
    };
    let result = pollster::block_on(bench::measure(&gpu, model, drafter.as_ref(), &plan, &mut round_costs, &mut progress))?;
    let kernels = if gpu.caps.gpu_kernels { "gpu" } else { "cpu" }.to_string();
    Ok(AdapterReport {
        adapter: AdapterFacts::from(&gpu.info),
        kernels,
        copy_bandwidth_gb_s: result.copy_bandwidth / 1e9,
        decode_weight_bytes_per_token: result.decode_weight_bytes_per_token,
        modes: result.modes,
    })
}

fn print_adapter(a: &AdapterReport, w: &Workload) {
    println!("adapter        {} ({}, {} {})", a.adapter.name, a.adapter.backend, a.adapter.vendor_name, a.adapter.device_type);
    println!("model          {} ({}, {:.1} MB of weights read per token)", w.model, w.dtype, a.decode_weight_bytes_per_token as f64 / 1e6);
    println!("kernels        {}", a.kernels);
    println!("copy bw        {:.2} GB/s (WGSL copy kernel, read + write)", a.copy_bandwidth_gb_s);
    for m in &a.modes {
        println!(
            "{:<20} prefill {:.1} tok/s, decode {:.2} tok/s ({:.2}-{:.2}), TTFT {:.1} ms, {:.2}x plain ({} paired), mean acceptance {:.2}, mean draft length {:.2}",
            m.mode,
            m.prefill_tokens_per_s,
            m.decode_tokens_per_s,
            m.decode_tokens_per_s_min,
            m.decode_tokens_per_s_max,
            m.time_to_first_token_s * 1e3,
            m.speedup_over_plain,
            m.speedup_over_plain_paired.map_or("n/a".to_string(), |s| format!("{s:.2}x")),
            m.mean_acceptance,
            m.mean_draft_length
        );
        println!(
            "{:<20} weight bw {:.2} GB/s, roofline ratio {:.3} ({:.3} of the copy kernel's read rate), draft {:.3}s / verify {:.3}s, head {:.1}%, est. GPU memory {:.1} MiB",
            "",
            m.decode_weight_bandwidth_gb_s,
            m.roofline_ratio,
            m.read_roofline_ratio,
            m.draft_seconds,
            m.verify_seconds,
            100.0 * m.head_share,
            m.peak_gpu_memory_bytes as f64 / (1u64 << 20) as f64
        );
    }
}

fn write(path: &Path, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let format = parse_dtype(&args.dtype)?;
    let choice = BackendChoice::parse(&args.backend)?;
    let dir = model_dir::resolve(args.model.as_deref())?;
    let files = domino_models::open_model(&dir)?;
    let (prompt_source, prompts) = prompt_set(&args, &files.config, files.tokenizer)?;

    let mut adapters = pollster::block_on(list_adapters(choice));
    if adapters.is_empty() {
        return Err(domino_engine::EngineError::NoAdapter { backend: args.backend.clone() }.into());
    }
    let selected = match args.adapter {
        Some(i) if i >= adapters.len() => {
            return Err(domino_engine::EngineError::AdapterIndex { index: i, count: adapters.len(), backend: args.backend.clone() }.into())
        }
        Some(i) => vec![adapters.swap_remove(i)],
        None if choice == BackendChoice::All => adapters,
        None => vec![adapters.swap_remove(0)],
    };

    let modes = 1 + if args.draft.is_some() { 2 } else { 0 };
    let split_prompts = if args.draft.is_some() { args.split_prompts.unwrap_or(prompts.len()).min(prompts.len()) } else { 0 };
    let steps_per_mode = 1 + prompts.len() * args.runs;
    let bar = ProgressBar::new((selected.len() * (modes * steps_per_mode + (modes - 1) * split_prompts + 1)) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let workload = Workload {
        model: args.model.clone().unwrap_or_else(|| dir.display().to_string()),
        drafter: args.draft.clone(),
        dtype: args.dtype.clone(),
        prompt_source,
        prompt_tokens: prompts.iter().map(Vec::len).collect(),
        max_tokens: args.max_tokens,
        runs: args.runs,
    };
    let mut reports = Vec::new();
    let weight_textures = crate::load::parse_weight_storage(&args.weight_storage)?;
    let kernels = crate::load::parse_kernels(&args.kernels)?;
    for (adapter, summary) in selected {
        let opts = limits_from_env(GpuOptions { weight_textures, kernels, ..Default::default() })?;
        let gpu = pollster::block_on(Gpu::from_adapter(adapter, summary, &opts))?;
        reports.push(bench_adapter(gpu, &dir, format, &prompts, &args, &bar)?);
    }
    bar.finish_and_clear();

    let report = BenchReport {
        schema: report::SCHEMA.to_string(),
        runner: "native".to_string(),
        domino_version: env!("CARGO_PKG_VERSION").to_string(),
        created_unix_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        machine: report::machine_facts(),
        workload,
        adapters: reports,
    };
    println!(
        "machine        {} {} ({}), cpu {}",
        report.machine.hostname.as_deref().unwrap_or("unknown host"),
        report.machine.os,
        report.machine.arch,
        report.machine.cpu.as_deref().unwrap_or("unknown")
    );
    println!(
        "prompts        {} ({} prompt(s), {:?} tokens), {} tokens per run, {} run(s)",
        report.workload.prompt_source, prompts.len(), report.workload.prompt_tokens, args.max_tokens, args.runs
    );
    for a in &report.adapters {
        print_adapter(a, &report.workload);
    }
    if let Some(path) = &args.json {
        write(path, &serde_json::to_string_pretty(&report).unwrap_or_default())?;
    }
    if let Some(path) = &args.html {
        write(path, &report::html(std::slice::from_ref(&report)))?;
    }
    Ok(())
}
