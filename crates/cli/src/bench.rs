//! `domino bench`: on one or every adapter, prefill and decode speed of plain decoding (and with a
//! drafter, of the speculative modes), the decode step's effective weight bandwidth next to the
//! adapter's copy bandwidth measured in the same run, and a `domino-bench/1` report.

use crate::load::{check_memory, context_for, drafter_format, limits_from_env, parse_dtype, upload_model};
use crate::report::{self, AdapterFacts, AdapterReport, BenchReport, ModeReport, Workload};
use crate::{model_dir, CliError};
use clap::Args;
use domino_engine::{list_adapters, BackendChoice, DTypeChoice, Gpu, GpuOptions};
use domino_models::drafter_gpu::DrafterModel;
use domino_models::tokenizer::TextTokenizer;
use domino_models::{Qwen3Config, Qwen3Model};
use domino_runtime::{clock::now, GenerateOptions, Session};
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
    /// Measure the draft / verify / head time split (one extra run per prompt, with syncs) on the
    /// first N prompts only (default: every prompt). Large prompt sets, such as the 164 HumanEval
    /// prompts, need far less time with a small N.
    #[arg(long, requires = "draft")]
    pub split_prompts: Option<usize>,
    /// Drafts verified per round: auto (adaptive) or a fixed number (as `generate --draft-len`).
    #[arg(long, default_value = "auto", value_parser = domino_runtime::DraftLen::parse, requires = "draft")]
    pub draft_len: domino_runtime::DraftLen,
    /// KV cache capacity in positions (default: the longest prompt plus --max-tokens), checked
    /// against each adapter's memory limits before loading.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub context: Option<u64>,
}

/// The built-in prompt set (tokenized with the model's tokenizer).
pub const DEFAULT_PROMPTS: [&str; 4] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a GPU running out of memory.",
    "The capital of France is",
];

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    (v.iter().cloned().fold(f64::INFINITY, f64::min), v.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
}

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

fn matrices_bytes(layers: &[domino_models::qwen3::LayerWeights]) -> u64 {
    layers.iter().map(domino_models::qwen3::LayerWeights::matrix_bytes).sum()
}

/// Target weights (every matrix, the embedding once) + its KV cache: 2 · layers · capacity · kv_width · 4.
fn target_memory(model: &Qwen3Model, capacity: usize) -> u64 {
    let c = &model.config;
    let embed = if c.tie_word_embeddings { 0 } else { model.embed.bytes() };
    model.decode_weight_bytes() + embed + 2 * (c.num_layers * capacity * c.kv_width() * 4) as u64
}

fn drafter_memory(d: &DrafterModel) -> u64 {
    let head = d.head.as_ref().map(|h| h.w_ih.bytes() + h.w_hh.bytes() + h.w1_y.bytes() + h.w1_s.bytes() + h.w2.bytes()).unwrap_or(0);
    d.fc.bytes() + matrices_bytes(&d.layers) + head
}

struct Measured {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    ttft: Vec<f64>,
    acceptance: Vec<usize>,
    draft_lengths: Vec<usize>,
    draft: f64,
    verify: f64,
    head: f64,
    memory: u64,
}

fn mode_report(name: &str, m: &Measured, plain_tps: Option<f64>, weight_bytes: u64, copy: f64) -> ModeReport {
    let tps = median(&m.decode);
    let (lo, hi) = min_max(&m.decode);
    let weight_bw = weight_bytes as f64 * tps;
    let mean_acceptance =
        if m.acceptance.is_empty() { 1.0 } else { m.acceptance.iter().sum::<usize>() as f64 / m.acceptance.len() as f64 };
    let round = m.draft + m.verify;
    ModeReport {
        mode: name.to_string(),
        prefill_tokens_per_s: median(&m.prefill),
        decode_tokens_per_s: tps,
        decode_tokens_per_s_min: lo,
        decode_tokens_per_s_max: hi,
        decode_tokens_per_s_all: m.decode.clone(),
        time_to_first_token_s: median(&m.ttft),
        speedup_over_plain: plain_tps.map(|p| tps / p.max(1e-12)).unwrap_or(1.0),
        mean_acceptance,
        mean_draft_length: if m.draft_lengths.is_empty() { 0.0 } else { m.draft_lengths.iter().sum::<usize>() as f64 / m.draft_lengths.len() as f64 },
        draft_seconds: m.draft,
        verify_seconds: m.verify,
        head_seconds: m.head,
        head_share: if round > 0.0 { m.head / round } else { 0.0 },
        decode_weight_bandwidth_gb_s: weight_bw / 1e9,
        roofline_ratio: weight_bw / copy.max(1e-12),
        read_roofline_ratio: weight_bw / (copy / 2.0).max(1e-12),
        peak_gpu_memory_bytes: m.memory,
        peak_gpu_memory_estimated: true,
    }
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
    let opts = GenerateOptions { max_tokens: args.max_tokens, ignore_eos: true, ..Default::default() };

    // Plain decoding: one warm-up run (pipelines, caches), then --runs runs per prompt.
    bar.set_message(format!("{label}: plain"));
    let mut session = Session::new(model, capacity)?;
    let mut plain = Measured { prefill: vec![], decode: vec![], ttft: vec![], acceptance: vec![], draft_lengths: vec![], draft: 0.0, verify: 0.0, head: 0.0, memory: target_memory(model, capacity) };
    pollster::block_on(session.generate(&prompts[0], &opts, &mut |_| true))?;
    bar.inc(1);
    for p in prompts {
        for _ in 1..=args.runs {
            let g = pollster::block_on(session.generate(p, &opts, &mut |_| true))?;
            plain.prefill.push(g.stats.prefill_tokens_per_s);
            plain.decode.push(g.stats.decode_tokens_per_s);
            plain.ttft.push(g.stats.time_to_first_token_s);
            bar.inc(1);
        }
    }
    drop(session);
    let mut measured = vec![("plain".to_string(), plain)];

    if let Some(draft) = &args.draft {
        bar.set_message(format!("{label}: loading drafter"));
        let drafter = crate::load::load_drafter(model, draft, args.block_size, drafter_format(format))?;
        let mut modes = vec![("backbone (--no-head)", false)];
        if drafter.head.is_some() {
            modes.push(("domino", true));
        } else {
            modes[0].0 = "dflash";
        }
        let spec_capacity = requested.unwrap_or(max_prompt + args.max_tokens);
        let memory = target_memory(model, spec_capacity) + drafter_memory(&drafter);
        let mut spec = domino_runtime::SpeculativeSession::new(model, &drafter, spec_capacity)?;
        for (name, use_head) in modes {
            bar.set_message(format!("{label}: {name}"));
            let mut m = Measured { prefill: vec![], decode: vec![], ttft: vec![], acceptance: vec![], draft_lengths: vec![], draft: 0.0, verify: 0.0, head: 0.0, memory };
            // Run 0 warms up; runs 1..=R per prompt measure throughput without timing syncs; one more
            // run per prompt measures the draft / verify / head split (its syncs would slow the
            // throughput runs).
            let costs = match args.draft_len {
                domino_runtime::DraftLen::Auto => {
                    let key = crate::calibration::CalibrationKey::new(&gpu, dir, Path::new(draft), drafter.config.block_size, use_head, &args.dtype);
                    Some(crate::calibration::round_costs(&mut spec, &key, true)?)
                }
                domino_runtime::DraftLen::Fixed(_) => None,
            };
            let so = domino_runtime::SpeculativeOptions { use_head, timing: false, draft_len: args.draft_len, costs: costs.clone() };
            pollster::block_on(spec.generate(&prompts[0], &opts, &so, &mut |_| true))?;
            bar.inc(1);
            let split_prompts = args.split_prompts.unwrap_or(prompts.len());
            for (i, p) in prompts.iter().enumerate() {
                let runs = args.runs + usize::from(i < split_prompts);
                for run in 1..=runs {
                    let timing = run == args.runs + 1;
                    let so = domino_runtime::SpeculativeOptions { use_head, timing, draft_len: args.draft_len, costs: costs.clone() };
                    let (g, st) = pollster::block_on(spec.generate(p, &opts, &so, &mut |_| true))?;
                    if timing {
                        m.draft += st.draft_seconds;
                        m.verify += st.verify_seconds;
                        m.head += st.head_seconds;
                    } else {
                        // Greedy rounds are deterministic: the timing run would count them twice.
                        m.acceptance.extend(&st.acceptance_lengths);
                        m.draft_lengths.extend(&st.draft_lengths);
                        m.prefill.push(g.stats.prefill_tokens_per_s);
                        m.decode.push(g.stats.decode_tokens_per_s);
                        m.ttft.push(g.stats.time_to_first_token_s);
                    }
                    bar.inc(1);
                }
            }
            measured.push((name.to_string(), m));
        }
    }

    bar.set_message(format!("{label}: copy bandwidth"));
    let copy_bytes = (256u64 << 20).min(gpu.caps.max_storage_binding);
    let copy = pollster::block_on(domino_engine::bandwidth::copy_bandwidth(&gpu, copy_bytes, 5, &now))?;
    bar.inc(1);
    let weight_bytes = model.decode_weight_bytes();
    let plain_tps = median(&measured[0].1.decode);
    let modes = measured
        .iter()
        .enumerate()
        .map(|(i, (name, m))| mode_report(name, m, if i == 0 { None } else { Some(plain_tps) }, weight_bytes, copy))
        .collect();
    let kernels = if gpu.caps.gpu_kernels { "gpu" } else { "cpu" }.to_string();
    Ok(AdapterReport { adapter: AdapterFacts::from(&gpu.info), kernels, copy_bandwidth_gb_s: copy / 1e9, decode_weight_bytes_per_token: weight_bytes, modes })
}

fn print_adapter(a: &AdapterReport, w: &Workload) {
    println!("adapter        {} ({}, {} {})", a.adapter.name, a.adapter.backend, a.adapter.vendor_name, a.adapter.device_type);
    println!("model          {} ({}, {:.1} MB of weights read per token)", w.model, w.dtype, a.decode_weight_bytes_per_token as f64 / 1e6);
    println!("kernels        {}", a.kernels);
    println!("copy bw        {:.2} GB/s (WGSL copy kernel, read + write)", a.copy_bandwidth_gb_s);
    for m in &a.modes {
        println!(
            "{:<20} prefill {:.1} tok/s, decode {:.2} tok/s ({:.2}-{:.2}), TTFT {:.1} ms, {:.2}x plain, mean acceptance {:.2}, mean draft length {:.2}",
            m.mode,
            m.prefill_tokens_per_s,
            m.decode_tokens_per_s,
            m.decode_tokens_per_s_min,
            m.decode_tokens_per_s_max,
            m.time_to_first_token_s * 1e3,
            m.speedup_over_plain,
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
