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
    /// A drafter: also measure its DFlash-style backbone alone and (Domino checkpoints) full Domino.
    #[arg(long)]
    pub draft: Option<String>,
    /// Override the drafter's block size.
    #[arg(long, requires = "draft")]
    pub block_size: Option<usize>,
}

/// One speculative mode measured in the same run as plain decoding.
#[derive(Debug, Serialize)]
pub struct ModeReport {
    pub mode: String,
    pub decode_tokens_per_s: f64,
    pub speedup_over_plain: f64,
    pub mean_acceptance: f64,
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    pub head_share: f64,
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
    /// (bytes read + bytes written) / s of the copy kernel: the STREAM convention.
    pub copy_bandwidth_gb_s: f64,
    /// decode weight bandwidth / copy bandwidth (STREAM convention).
    pub roofline_ratio: f64,
    /// decode weight bandwidth / the copy kernel's read rate (half its read + write rate): a
    /// decode step only reads weights, so this compares like with like.
    pub read_roofline_ratio: f64,
    pub speculative: Vec<ModeReport>,
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
    drop(session);
    let mut speculative = Vec::new();
    if let Some(draft) = &args.draft {
        let drafter = crate::load::load_drafter(model, draft, args.block_size, format)?;
        let plain_tps = median(&mut decode.clone());
        let mut modes = vec![("backbone (--no-head)", false)];
        if drafter.head.is_some() {
            modes.push(("domino", true));
        } else {
            modes[0].0 = "dflash";
        }
        let mut spec = domino_runtime::SpeculativeSession::new(model, &drafter, args.prompt_len + args.max_tokens)?;
        for (name, use_head) in modes {
            let mut tps = Vec::new();
            let mut last = None;
            // Run 0 warms up; runs 1..=R measure throughput without timing syncs; one more run
            // measures the draft / verify / head split (its syncs would slow the throughput runs).
            for run in 0..=args.runs + 1 {
                let timing = run == args.runs + 1;
                let so = domino_runtime::SpeculativeOptions { use_head, timing };
                let (g, st) = pollster::block_on(spec.generate(&prompt, &opts, &so, &mut |_| true))?;
                if run > 0 && !timing {
                    tps.push(g.stats.decode_tokens_per_s);
                }
                if timing {
                    last = Some(st);
                }
            }
            if tps.is_empty() {
                tps.push(0.0);
            }
            let st = last.unwrap_or_default();
            let t = median(&mut tps);
            speculative.push(ModeReport {
                mode: name.to_string(),
                decode_tokens_per_s: t,
                speedup_over_plain: t / plain_tps.max(1e-9),
                mean_acceptance: st.mean_acceptance,
                draft_seconds: st.draft_seconds,
                verify_seconds: st.verify_seconds,
                head_share: st.head_share,
            });
        }
    }
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
        read_roofline_ratio: weight_bw / (copy / 2.0),
        speculative,
    };
    println!("adapter        {} ({})", report.adapter.name, report.adapter.backend);
    println!("model          {} ({}, {:.1} MB of weights read per token)", report.model, report.dtype, bytes as f64 / 1e6);
    println!("prefill        {:.1} tok/s ({} tokens)", report.prefill_tokens_per_s, args.prompt_len);
    println!("decode         {:.2} tok/s (median of {} runs, {} tokens each)", report.decode_tokens_per_s, args.runs, args.max_tokens);
    println!("weight bw      {:.2} GB/s", report.decode_weight_bandwidth_gb_s);
    println!("copy bw        {:.2} GB/s (WGSL copy kernel, read + write)", report.copy_bandwidth_gb_s);
    println!("roofline ratio {:.2} of copy bandwidth ({:.2} of the copy kernel's read rate)", report.roofline_ratio, report.read_roofline_ratio);
    for m in &report.speculative {
        println!(
            "{:<14} {:.2} tok/s, {:.2}x plain, mean acceptance {:.2}, draft {:.3}s / verify {:.3}s, head {:.1}% of round time",
            m.mode, m.decode_tokens_per_s, m.speedup_over_plain, m.mean_acceptance, m.draft_seconds, m.verify_seconds, 100.0 * m.head_share
        );
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).unwrap_or_default();
        std::fs::write(path, text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
    }
    Ok(())
}
