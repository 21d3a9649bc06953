//! `domino bench`: prefill and decode speed, and the decode step's effective weight bandwidth next to
//! the adapter's copy bandwidth measured in the same run (their ratio is the roofline fraction).

use crate::load::{load_model, open_gpu, parse_dtype};
use crate::{model_dir, CliError};
use clap::Args;
use domino_runtime::{clock::now, GenerateOptions, Session};
use serde::Serialize;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(long)]
    pub model: Option<String>,
    /// Prompt length in tokens (synthetic ids).
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    /// Tokens generated per run.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    #[arg(long, default_value = "auto")]
    pub backend: String,
    #[arg(long)]
    pub adapter: Option<usize>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub adapter: domino_engine::AdapterSummary,
    pub model: String,
    pub dtype: String,
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub runs: usize,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub decode_tokens_per_s_all: Vec<f64>,
    pub decode_weight_bytes_per_token: u64,
    pub decode_weight_bandwidth_gb_s: f64,
    pub copy_bandwidth_gb_s: f64,
    pub roofline_ratio: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

pub fn run(args: BenchArgs) -> Result<(), CliError> {
    let format = parse_dtype(&args.dtype)?;
    let dir = model_dir::resolve(args.model.as_deref())?;
    let gpu = open_gpu(&args.backend, args.adapter)?;
    let loaded = load_model(gpu.clone(), &dir, format, false)?;
    let model = &loaded.model;
    let vocab = model.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..args.prompt_len as u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let mut session = Session::new(model, (args.prompt_len + args.max_tokens).min(model.config.max_position_embeddings))?;
    let opts = GenerateOptions { max_tokens: args.max_tokens, ignore_eos: true, ..Default::default() };
    let bar = indicatif::ProgressBar::new((args.runs + 1) as u64);
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    for run in 0..=args.runs {
        let g = pollster::block_on(session.generate(&prompt, &opts, &mut |_| true))?;
        bar.inc(1);
        if run > 0 {
            // Run 0 warms up pipelines and caches.
            prefill.push(g.stats.prefill_tokens_per_s);
            decode.push(g.stats.decode_tokens_per_s);
        }
    }
    bar.finish_and_clear();
    let copy_bytes = (256u64 << 20).min(gpu.caps.max_storage_binding);
    let copy = pollster::block_on(domino_engine::bandwidth::copy_bandwidth(&gpu, copy_bytes, 5, &now))?;
    let all = decode.clone();
    let decode_tps = median(&mut decode);
    let bytes = model.decode_weight_bytes();
    let weight_bw = bytes as f64 * decode_tps;
    let report = BenchReport {
        adapter: gpu.info.clone(),
        model: dir.display().to_string(),
        dtype: args.dtype.clone(),
        prompt_tokens: args.prompt_len,
        generated_tokens: args.max_tokens,
        runs: args.runs,
        prefill_tokens_per_s: median(&mut prefill),
        decode_tokens_per_s: decode_tps,
        decode_tokens_per_s_all: all,
        decode_weight_bytes_per_token: bytes,
        decode_weight_bandwidth_gb_s: weight_bw / 1e9,
        copy_bandwidth_gb_s: copy / 1e9,
        roofline_ratio: weight_bw / copy,
    };
    println!("adapter        {} ({})", report.adapter.name, report.adapter.backend);
    println!("model          {} ({}, {:.1} MB of weights read per token)", report.model, report.dtype, bytes as f64 / 1e6);
    println!("prefill        {:.1} tok/s ({} tokens)", report.prefill_tokens_per_s, args.prompt_len);
    println!("decode         {:.2} tok/s (median of {} runs, {} tokens each)", report.decode_tokens_per_s, args.runs, args.max_tokens);
    println!("weight bw      {:.2} GB/s", report.decode_weight_bandwidth_gb_s);
    println!("copy bw        {:.2} GB/s (WGSL copy kernel, read + write)", report.copy_bandwidth_gb_s);
    println!("roofline ratio {:.2}", report.roofline_ratio);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path, text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
