//! The `domino` command-line tool.

mod bench;
mod calibration;
mod chat;
mod devices;
mod generate;
mod load;
mod loadtest;
mod model_dir;
mod plan;
mod report;
mod serve;
mod train;

use clap::{Args, Parser, Subcommand};
use domino_engine::HostDType;
use domino_models::drafter::DrafterKind;
use domino_models::testing::{write_always_accept_pair, write_tiny_drafter, write_tiny_model, TinyDrafterSpec, TinySpec};
use std::process::ExitCode;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Engine(#[from] domino_engine::EngineError),
    #[error(transparent)]
    Model(#[from] domino_models::ModelError),
    #[error(transparent)]
    Runtime(#[from] domino_runtime::RuntimeError),
}

#[derive(Debug, Parser)]
#[command(name = "domino", version, about = "Portable WebGPU inference for Qwen3 with Domino speculative decoding")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List GPU adapters with backend, type, features and key limits.
    Devices(devices::DevicesArgs),
    /// Generate text with a model.
    Generate(generate::GenerateArgs),
    /// Measure prefill / decode speed and the decode step's weight bandwidth vs copy bandwidth.
    Bench(bench::BenchArgs),
    /// Record, run once and print one decode step (or R-row verify pass): every dispatch's kernel,
    /// variant, workgroups, invocations and weight bytes.
    Plan(plan::PlanArgs),
    /// Merge `domino bench --json` reports into a Markdown table and a self-contained HTML page.
    Report(ReportArgs),
    /// Write a random Qwen3-architecture model (for tests and benchmarks).
    RandomModel(RandomModelArgs),
    /// Chat with a model in the terminal (its chat template, the whole conversation as context).
    Chat(chat::ChatArgs),
    /// Load-test a running `domino serve` (requests/s, tok/s, time to first token, latency).
    Loadtest(loadtest::LoadtestArgs),
    /// Serve the OpenAI API (chat/completions, completions, models) with continuous batching.
    Serve(serve::ServeArgs),
    /// Train drafters: `train data` (self-distillation), `train drafter` (burn).
    Train(train::TrainArgs),
}

#[derive(Debug, Args)]
struct ReportArgs {
    /// Reports written by `domino bench --json` (schema domino-bench/1).
    #[arg(required = true)]
    reports: Vec<std::path::PathBuf>,
    /// Also write the Markdown table to this file.
    #[arg(long)]
    markdown: Option<std::path::PathBuf>,
    /// Write a self-contained HTML page (inline CSS and SVG charts, no scripts) to this file.
    #[arg(long)]
    html: Option<std::path::PathBuf>,
}

fn report_cmd(a: ReportArgs) -> Result<(), CliError> {
    let reports = a.reports.iter().map(|p| report::load(p)).collect::<Result<Vec<_>, _>>().map_err(CliError::Usage)?;
    let table = report::markdown(&report::merge(&reports));
    print!("{table}");
    let write = |path: &std::path::Path, text: &str| std::fs::write(path, text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())));
    if let Some(p) = &a.markdown {
        write(p, &table)?;
    }
    if let Some(p) = &a.html {
        write(p, &report::html(&reports))?;
    }
    Ok(())
}

#[derive(Debug, Args)]
struct RandomModelArgs {
    #[arg(long)]
    out: std::path::PathBuf,
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    #[arg(long, default_value_t = 2)]
    layers: usize,
    #[arg(long, default_value_t = 4)]
    heads: usize,
    #[arg(long, default_value_t = 2)]
    kv_heads: usize,
    #[arg(long, default_value_t = 32)]
    head_dim: usize,
    #[arg(long, default_value_t = 128)]
    intermediate: usize,
    #[arg(long, default_value_t = 384)]
    vocab: usize,
    /// max_position_embeddings (Qwen3's 40960 by default, so long-context plans and runs fit).
    #[arg(long, default_value_t = 40960)]
    max_position: usize,
    #[arg(long)]
    tied: bool,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Also write a drafter here, and make the pair always-accepting: the target's next token is
    /// always the same and the drafter always drafts it (measures speed at full acceptance).
    #[arg(long)]
    always_accept_drafter: Option<std::path::PathBuf>,
    /// Also write a random drafter here (random weights, so it accepts like an untrained drafter).
    #[arg(long, conflicts_with = "always_accept_drafter")]
    drafter: Option<std::path::PathBuf>,
    /// dflash or domino (with --always-accept-drafter or --drafter).
    #[arg(long, default_value = "domino")]
    drafter_kind: String,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    #[arg(long, default_value_t = 1)]
    drafter_layers: usize,
    /// Domino head sizes; default: scaled from Qwen3-8B's (emb 256, GRU 1024 at hidden 4096), so the
    /// head keeps the paper's size relative to the target.
    #[arg(long)]
    emb_dim: Option<usize>,
    #[arg(long)]
    gru_hidden: Option<usize>,
    /// Write one GGUF file at --out instead of a safetensors folder, its matrices in this type:
    /// f32, f16, bf16, a block type (q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k) or one of
    /// llama.cpp's mixes, q4_k_m or q5_k_m (its per-tensor rules and fallbacks, llama.cpp's
    /// reference rounding).
    #[arg(long, conflicts_with_all = ["always_accept_drafter", "drafter"])]
    gguf: Option<String>,
}

fn random_model(a: RandomModelArgs) -> Result<(), CliError> {
    let spec = TinySpec {
        hidden: a.hidden,
        layers: a.layers,
        heads: a.heads,
        kv_heads: a.kv_heads,
        head_dim: a.head_dim,
        intermediate: a.intermediate,
        vocab: a.vocab,
        max_position: a.max_position,
        tied: a.tied,
        seed: a.seed,
        dtype: HostDType::BF16,
        ..TinySpec::default()
    };
    let drafter_spec = || -> Result<TinyDrafterSpec, CliError> {
        let kind = match a.drafter_kind.as_str() {
            "dflash" => DrafterKind::DFlash,
            "domino" => DrafterKind::Domino,
            other => return Err(CliError::Usage(format!("--drafter-kind {other}: expected dflash or domino"))),
        };
        let layers = (0..a.layers).collect::<Vec<_>>();
        let ids = vec![layers[0], layers[layers.len() / 2], layers[layers.len() - 1]];
        Ok(TinyDrafterSpec {
            kind,
            block_size: a.block_size,
            layers: a.drafter_layers,
            target_layer_ids: ids,
            emb_dim: a.emb_dim.unwrap_or((256 * a.hidden / 4096).max(8)),
            gru_hidden: a.gru_hidden.unwrap_or((a.hidden / 4).max(8)),
            dtype: HostDType::BF16,
            ..TinyDrafterSpec::default()
        })
    };
    if let Some(t) = &a.gguf {
        let ftype = domino_models::gguf_writer::FileType::parse(t)
            .ok_or_else(|| CliError::Usage(format!("--gguf {t}: expected f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k, q4_k_m or q5_k_m")))?;
        if let Some(parent) = a.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| CliError::Usage(format!("--out {}: {e}", a.out.display())))?;
        }
        domino_models::gguf_writer::write_tiny_gguf_as(&a.out, &spec, ftype)?;
        eprintln!("wrote {}", a.out.display());
        return Ok(());
    }
    match (&a.always_accept_drafter, &a.drafter) {
        (Some(dir), _) => {
            write_always_accept_pair(&a.out, dir, &spec, &drafter_spec()?, a.vocab / 2)?;
            eprintln!("wrote drafter {}", dir.display());
        }
        (None, Some(dir)) => {
            let dspec = drafter_spec()?;
            write_tiny_model(&a.out, &spec)?;
            write_tiny_drafter(dir, &spec, &dspec)?;
            eprintln!("wrote drafter {}", dir.display());
        }
        (None, None) => write_tiny_model(&a.out, &spec)?,
    }
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// EGL (wgpu probes its GL backend in every command) prints "error: XDG_RUNTIME_DIR is invalid or not
/// set in the environment." twice where no desktop session set one. Give it a private runtime folder
/// (mode 0700, as the XDG spec asks) before any thread starts, so a successful run prints no error.
#[cfg(target_os = "linux")]
fn ensure_xdg_runtime_dir() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir()) {
        return;
    }
    let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
    let dir = std::env::temp_dir().join(format!("domino-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    // Only a folder of our own, private to us, will do.
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0 => std::env::set_var("XDG_RUNTIME_DIR", &dir),
        _ => {}
    }
}

#[cfg(not(target_os = "linux"))]
fn ensure_xdg_runtime_dir() {}

fn main() -> ExitCode {
    ensure_xdg_runtime_dir();
    domino_engine::cpu_threads::oversubscribe_cpu_adapter();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(a) => devices::run(a),
        Command::Generate(a) => generate::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Report(a) => report_cmd(a),
        Command::RandomModel(a) => random_model(a),
        Command::Train(a) => train::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Loadtest(a) => loadtest::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
