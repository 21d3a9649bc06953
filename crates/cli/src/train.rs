//! `domino train data` (self-distillation through the engine) and `domino train drafter` (burn
//! training with the base-anchored curriculum, export in the DFlash / Domino formats).

use crate::load::{load_model, open_gpu, parse_dtype};
use crate::{model_dir, CliError};
use clap::{Args, Subcommand};
use domino_models::drafter::default_target_layer_ids;
use domino_models::tokenizer::{ChatMessage, TextTokenizer};
use domino_models::open_model;
use domino_models::ngram_table::NgramTable;
use domino_train::data::{read_shard, DataMeta};
use domino_train::distill::{generate_data, generate_data_cpu, DistillOptions};
use domino_train::{EvalStats, LossKind, TrainError, TrainOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(subcommand)]
    command: TrainCommand,
}

#[derive(Debug, Subcommand)]
enum TrainCommand {
    /// Generate self-distillation data: the target's greedy continuations and its features.
    Data(DataArgs),
    /// Train a Domino drafter (or a DFlash backbone with --no-head) on such data.
    Drafter(DrafterArgs),
    /// Build the static n-gram table that `--lookup` consults (the drafter folder's
    /// lookup-ngrams.safetensors) from such data.
    Ngrams(NgramArgs),
    /// Store the target's top-k next-token distribution at every continuation position of such
    /// data (in DIR/soft-labels/), for `train drafter --soft-weight`.
    SoftLabels(SoftLabelArgs),
}

#[derive(Debug, Args)]
struct SoftLabelArgs {
    /// The target the data was made with.
    #[arg(long)]
    model: Option<String>,
    /// A folder written by `domino train data`; the labels go into its soft-labels/ folder
    /// (resumable, one file per data shard).
    #[arg(long)]
    data: PathBuf,
    /// Candidates kept per position, by falling probability.
    #[arg(long, default_value_t = 16)]
    top_k: usize,
}

#[derive(Debug, Args)]
struct NgramArgs {
    /// Folders written by `domino train data` (repeatable; all of one tokenizer).
    #[arg(long, required = true)]
    data: Vec<PathBuf>,
    /// The table file; `--lookup` reads it as lookup-ngrams.safetensors in the drafter folder.
    #[arg(long)]
    out: PathBuf,
    /// Keep a context only where its most frequent successor followed it at least N times.
    #[arg(long, default_value_t = 2)]
    min_count: u32,
    /// Count the prompts' tokens too, not only the target's own continuations (what lookup is
    /// asked to predict; prompts add little and double the table).
    #[arg(long)]
    with_prompts: bool,
}

#[derive(Debug, Args)]
struct DataArgs {
    /// Target model folder or Hugging Face repo id (default: the built-in tiny Qwen3).
    #[arg(long)]
    model: Option<String>,
    /// Prompts: a .jsonl file of {"prompt": "..."} or {"prompt_ids": [...]} objects (a text prompt
    /// may add "chat": true or false, overriding --chat), or any other file with one prompt per line.
    #[arg(long)]
    prompts: PathBuf,
    #[arg(long)]
    out: PathBuf,
    /// Wrap each text prompt as a user message with the model's chat template (thinking disabled).
    #[arg(long)]
    chat: bool,
    /// Tokens generated per prompt (fewer when the target stops at EOS).
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    #[arg(long)]
    ignore_eos: bool,
    /// Target layers whose features are stored (default: z-lab's spacing for 5 layers, or the middle
    /// layer of targets with fewer than 5 layers).
    #[arg(long, value_delimiter = ',')]
    target_layer_ids: Option<Vec<usize>>,
    /// Prompts per shard (the unit of resuming).
    #[arg(long, default_value_t = 32)]
    shard_size: usize,
    /// Prompts decoded at once through the continuous batcher (one submission per step for all of
    /// them; the same tokens and features as --batch 1, which decodes one prompt at a time).
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Weight storage on the GPU (`--device gpu`).
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// Where the target runs: `gpu` (the engine, on --backend/--adapter) or `cpu` (a native f32
    /// forward with GEMMs over all rows of a step, far faster where the only adapter is a CPU
    /// rasterizer; the same greedy text up to float rounding).
    #[arg(long, default_value = "gpu")]
    device: String,
    #[arg(long, default_value = "auto")]
    backend: String,
    #[arg(long)]
    adapter: Option<usize>,
}

#[derive(Debug, Args)]
struct DrafterArgs {
    /// The target the data was made with.
    #[arg(long)]
    model: Option<String>,
    /// A folder written by `domino train data`.
    #[arg(long)]
    data: PathBuf,
    /// Where the drafter (config.json, model.safetensors) and the resumable state (train-state/) go.
    #[arg(long)]
    out: PathBuf,
    /// Draft decoder layers.
    #[arg(long, default_value_t = 1)]
    layers: usize,
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Domino head: width of the correction MLP.
    #[arg(long, default_value_t = 64)]
    emb_dim: usize,
    /// Domino head: GRU state width.
    #[arg(long, default_value_t = 128)]
    gru_hidden: usize,
    /// Must equal the data's (the default).
    #[arg(long, value_delimiter = ',')]
    target_layer_ids: Option<Vec<usize>>,
    /// Target token id whose embedding fills the masked slots (default: vocab_size − 1).
    #[arg(long)]
    mask_token_id: Option<u32>,
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    #[arg(long, default_value_t = 6e-4)]
    lr: f64,
    /// λ (weight of the base-logit loss) falls from 1 to 0 over this share of the steps.
    #[arg(long, default_value_t = 1.0)]
    decay_ratio: f64,
    #[arg(long, default_value_t = 0.04)]
    warmup_ratio: f64,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Random anchors per sequence.
    #[arg(long, default_value_t = 64)]
    anchors: usize,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Save the resumable state and export the drafter every N steps.
    #[arg(long, default_value_t = 100)]
    save_every: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Train a DFlash backbone (no Domino head, unshifted labels) and export the DFlash format.
    #[arg(long)]
    no_head: bool,
    /// Run at most N steps now and save; running the same command again resumes.
    #[arg(long)]
    stop_after: Option<usize>,
    /// Start the draft layers from random weights instead of the target's.
    #[arg(long)]
    no_target_init: bool,
    /// Train on target features divided by their column RMS (folded into `fc` at export, so the
    /// checkpoint is unchanged in format): residual streams mix columns of RMS 1 and 1400.
    #[arg(long)]
    scale_features: bool,
    /// cpu (burn's Flex backend) or wgpu (needs a build with the `wgpu` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// full: cross-entropy over the whole vocabulary; sampled: a sampled softmax over the labels,
    /// the most frequent target tokens and uniform negatives (log Q corrected).
    #[arg(long, default_value = "full")]
    loss: LossKind,
    /// Sampled loss: the N most frequent target tokens of the training data are always candidates.
    #[arg(long, default_value_t = 1024)]
    frequent_candidates: usize,
    /// Sampled loss: uniform negative candidates per sequence.
    #[arg(long, default_value_t = 1024)]
    sampled_candidates: usize,
    /// Hold the last N sequences of the data out of training and report their full-vocabulary NLL
    /// and per-draft accuracy (before the first step, every --eval-every steps and at the end).
    #[arg(long, default_value_t = 0)]
    eval_seqs: usize,
    /// Evaluate the held-out sequences every N steps (0: at the end only).
    #[arg(long, default_value_t = 0)]
    eval_every: usize,
    /// Distil the target's distribution: each draft's loss is (1 − W)·CE(greedy token) +
    /// W·CE(the target's top-k distribution, renormalised), from `train soft-labels` (0: off).
    #[arg(long, default_value_t = 0.0)]
    soft_weight: f64,
    /// γ of the per-draft loss weight exp(−k/γ) (draft k = 0 first): the spec's 7 by default;
    /// smaller values put more of the loss on the first drafts.
    #[arg(long, default_value_t = domino_train::schedule::SPEC_SLOT_DECAY)]
    slot_decay: f64,
}

pub fn run(args: TrainArgs) -> Result<(), CliError> {
    match args.command {
        TrainCommand::Data(a) => data(a),
        TrainCommand::Drafter(a) => drafter(a),
        TrainCommand::Ngrams(a) => ngrams(a),
        TrainCommand::SoftLabels(a) => soft_labels(a),
    }
}

fn soft_labels(a: SoftLabelArgs) -> Result<(), CliError> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    let files = open_model(&dir)?;
    // The rest of the target after the deepest feature layer runs on the CPU: a quarter of a
    // forward for SmolLM2, where the rasterizer would be far slower.
    let target = domino_train::cpu_target::CpuTarget::load(files.config.clone(), files.weights.as_ref()).map_err(train_error)?;
    let shards = DataMeta::read(&a.data).map_err(train_error)?.num_shards();
    let pb = bar(shards as u64, "{msg:>10} [{bar:40}] {pos}/{len} shards ({elapsed}, eta {eta})");
    pb.set_message("labelling");
    let logged_to_terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let summary = domino_train::soft_labels::make_soft_labels(&target, &a.data, a.top_k, &mut |done, total| {
        if !logged_to_terminal && (done.is_multiple_of(10) || done == total) {
            eprintln!("{done}/{total} shards labelled");
        }
        pb.set_position(done as u64)
    })
    .map_err(train_error)?;
    pb.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "wrote {}: top {} of {} positions in {} shards ({} already complete) in {seconds:.1} s; the data's next token is the top candidate at {:.2}% of them",
        domino_train::soft_labels::soft_dir(&a.data).display(),
        a.top_k,
        summary.rows,
        summary.shards_written,
        summary.shards_skipped,
        100.0 * summary.top1_agrees as f64 / summary.rows.max(1) as f64
    );
    Ok(())
}

fn ngrams(args: NgramArgs) -> Result<(), CliError> {
    let mut texts = Vec::new();
    let mut vocab = None;
    for dir in &args.data {
        let meta = DataMeta::read(dir).map_err(train_error)?;
        if vocab.is_some_and(|v| v != meta.vocab_size) {
            return Err(CliError::Usage(format!("{}: a vocabulary of {}, the data before it has {}", dir.display(), meta.vocab_size, vocab.unwrap_or(0))));
        }
        vocab = Some(meta.vocab_size);
        for i in 0..meta.num_shards() {
            // Tokens only: the features are what a drafter trains on, not this table.
            for seq in read_shard(dir, i, &meta).map_err(train_error)? {
                let from = if args.with_prompts { 0 } else { seq.prompt_len };
                texts.push(seq.tokens[from.min(seq.tokens.len())..].to_vec());
            }
        }
    }
    let vocab = vocab.unwrap_or(0);
    let table = NgramTable::build(texts.iter().map(|t| t.as_slice()), vocab, args.min_count);
    table.save(&args.out)?;
    let tokens: usize = texts.iter().map(|t| t.len()).sum();
    eprintln!("wrote {}: {} contexts from {tokens} tokens of {} sequences (min count {})", args.out.display(), table.len(), texts.len(), args.min_count);
    Ok(())
}

fn train_error(e: TrainError) -> CliError {
    CliError::Usage(e.to_string())
}

fn bar(len: u64, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()).progress_chars("=> "));
    bar
}

/// Prompts as token ids: jsonl objects with "prompt" (text) or "prompt_ids", or one text per line.
fn read_prompts(path: &Path, tok: Option<&TextTokenizer>, chat: bool) -> Result<Vec<Vec<u32>>, CliError> {
    let p = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| CliError::Usage(format!("--prompts {p}: {e}")))?;
    let jsonl = path.extension().is_some_and(|e| e == "jsonl");
    let encode = |s: &str, line: usize, chat: bool| -> Result<Vec<u32>, CliError> {
        let tok = tok.ok_or_else(|| CliError::Usage(format!("--prompts {p}: line {line}: text prompts need the model's tokenizer.json (or use prompt_ids)")))?;
        let s = if chat { tok.apply_chat_template(&[ChatMessage::new("user", s)], true, false)? } else { s.to_string() };
        Ok(tok.encode(&s)?)
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if !jsonl {
            out.push(encode(line, line_no, chat)?);
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| CliError::Usage(format!("--prompts {p}: line {line_no}: malformed JSON: {e}")))?;
        // A line's own "chat": true/false overrides --chat (one file can mix completions and chats).
        let chat = match v.get("chat") {
            None => chat,
            Some(c) => c.as_bool().ok_or_else(|| CliError::Usage(format!("--prompts {p}: line {line_no}: \"chat\" must be true or false")))?,
        };
        let ids = if let Some(s) = v.get("prompt").and_then(|s| s.as_str()) {
            encode(s, line_no, chat)?
        } else if let Some(a) = v.get("prompt_ids").and_then(|a| a.as_array()) {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| CliError::Usage(format!("--prompts {p}: line {line_no}: prompt_ids must be token ids")))?
        } else {
            return Err(CliError::Usage(format!("--prompts {p}: line {line_no}: expected a string \"prompt\" or a list \"prompt_ids\"")));
        };
        if ids.is_empty() {
            return Err(CliError::Usage(format!("--prompts {p}: line {line_no}: empty prompt")));
        }
        out.push(ids);
    }
    if out.is_empty() {
        return Err(CliError::Usage(format!("--prompts {p}: no prompts")));
    }
    Ok(out)
}

fn data(a: DataArgs) -> Result<(), CliError> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    enum Target {
        Gpu(crate::load::Loaded),
        Cpu(domino_train::cpu_target::CpuTarget),
    }
    let (target, tokenizer, stop_ids, layers) = match a.device.as_str() {
        "gpu" => {
            let format = parse_dtype(&a.dtype)?;
            let gpu = open_gpu(&a.backend, a.adapter, "auto", "auto")?;
            let loaded = load_model(gpu, &dir, format, false)?;
            let (tok, stops, layers) = (loaded.tokenizer.clone(), loaded.stop_ids.clone(), loaded.model.config.num_layers);
            (Target::Gpu(loaded), tok, stops, layers)
        }
        "cpu" => {
            let files = open_model(&dir)?;
            let target = domino_train::cpu_target::CpuTarget::load(files.config.clone(), files.weights.as_ref()).map_err(train_error)?;
            (Target::Cpu(target), files.tokenizer, files.stop_ids, files.config.num_layers)
        }
        other => return Err(CliError::Usage(format!("--device {other}: expected gpu or cpu"))),
    };
    let prompts = read_prompts(&a.prompts, tokenizer.as_ref(), a.chat)?;
    let ids = match a.target_layer_ids {
        Some(ids) => ids,
        None => default_target_layer_ids(layers, 5.min(layers)).filter(|_| layers >= 5).unwrap_or(vec![layers / 2]),
    };
    let opts = DistillOptions {
        max_new_tokens: a.max_new_tokens,
        shard_size: a.shard_size,
        target_layer_ids: ids.clone(),
        stop_ids,
        ignore_eos: a.ignore_eos,
        batch: a.batch,
    };
    let pb = bar(prompts.len() as u64, "{msg:>10} [{bar:40}] {pos}/{len} prompts ({elapsed}, eta {eta})");
    pb.set_message("distilling");
    let logged_to_terminal = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let mut progress = |done: usize, total: usize| {
        if !logged_to_terminal && (done.is_multiple_of(a.shard_size) || done == total) {
            eprintln!("{done}/{total} prompts distilled");
        }
        pb.set_position(done as u64)
    };
    let summary = match &target {
        Target::Gpu(loaded) => generate_data(&loaded.model, &prompts, &a.out, &opts, &mut progress),
        Target::Cpu(cpu) => generate_data_cpu(cpu, &prompts, &a.out, &opts, &mut progress),
    }
    .map_err(train_error)?;
    pb.finish_and_clear();
    let seconds = started.elapsed().as_secs_f64();
    eprintln!(
        "wrote {}: {} prompts, features of target layers {ids:?}; {} shards written, {} already complete, {} tokens generated in {seconds:.1} s ({:.2} tok/s, --device {} --batch {})",
        a.out.display(),
        prompts.len(),
        summary.shards_written,
        summary.shards_skipped,
        summary.generated_tokens,
        summary.generated_tokens as f64 / seconds.max(1e-9),
        a.device,
        a.batch
    );
    Ok(())
}

fn drafter(a: DrafterArgs) -> Result<(), CliError> {
    let dir = model_dir::resolve(a.model.as_deref())?;
    // Safetensors folder or GGUF alike; quantized target tensors are dequantized to f32 as read.
    let target = open_model(&dir)?;
    let device = match a.device.as_str() {
        "cpu" => domino_train::cpu_device(),
        #[cfg(feature = "wgpu")]
        "wgpu" => domino_train::wgpu_device(),
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => return Err(CliError::Usage("--device wgpu: this build has no burn wgpu backend (build with `--features wgpu`)".into())),
        other => return Err(CliError::Usage(format!("--device {other}: expected cpu or wgpu"))),
    };
    let opts = TrainOptions {
        domino: !a.no_head,
        layers: a.layers,
        block_size: a.block_size,
        emb_dim: a.emb_dim,
        gru_hidden: a.gru_hidden,
        target_layer_ids: a.target_layer_ids,
        mask_token_id: a.mask_token_id,
        steps: a.steps,
        lr: a.lr,
        decay_ratio: a.decay_ratio,
        warmup_ratio: a.warmup_ratio,
        weight_decay: a.weight_decay,
        batch: a.batch,
        anchors: a.anchors,
        save_every: a.save_every,
        seed: a.seed,
        init_from_target: !a.no_target_init,
        loss: a.loss,
        frequent_candidates: a.frequent_candidates,
        sampled_candidates: a.sampled_candidates,
        eval_seqs: a.eval_seqs,
        eval_every: a.eval_every,
        scale_features: a.scale_features,
        soft_weight: a.soft_weight,
        slot_decay: a.slot_decay,
        ..TrainOptions::default()
    };
    let pb = bar(a.steps as u64, "[{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})");
    let logged_to_terminal = std::io::stderr().is_terminal();
    let (mut step_seconds, mut steps_run) = (0.0f64, 0usize);
    let summary = domino_train::train(&target.config, target.weights.as_ref(), &a.data, &a.out, &opts, &device, a.stop_after, &mut |s: &domino_train::StepStats| {
        step_seconds += s.seconds;
        steps_run += 1;
        let acc: Vec<String> = s.slot_accuracy.iter().take(6).map(|x| format!("{x:.2}")).collect();
        let msg = format!("loss {:.3} λ {:.2} lr {:.1e} acc {} ({:.2} s/step, {:.0} columns)", s.loss, s.lambda, s.lr, acc.join(" "), s.seconds, s.columns);
        if !logged_to_terminal && (s.step.is_multiple_of(25) || s.step == s.total) {
            // No progress bar without a terminal (nohup, CI logs): a line every 25 steps instead.
            eprintln!("step {}/{} {msg}", s.step, s.total);
        }
        if let Some(e) = &s.eval {
            pb.suspend(|| eprintln!("{}", eval_line(s.step, e)));
        }
        pb.set_position(s.step as u64);
        pb.set_message(msg);
    })
    .map_err(train_error)?;
    pb.finish_and_clear();
    if let Some(e) = &summary.initial_eval {
        eprintln!("{} (before training)", eval_line(0, e));
    }
    let acc: Vec<String> = summary.last.slot_accuracy.iter().map(|x| format!("{x:.2}")).collect();
    if summary.resumed_from > 0 {
        eprintln!("resumed at step {}", summary.resumed_from);
    }
    eprintln!(
        "wrote {} ({:?}, {} layers, block {}, layers copied from the target {:?}): step {} loss {:.4}, per-draft top-1 accuracy {}",
        a.out.display(),
        summary.config.kind,
        summary.config.num_layers,
        summary.config.block_size,
        summary.init.copied_layers,
        summary.last.step,
        summary.last.loss,
        acc.join(" ")
    );
    if steps_run > 0 {
        eprintln!(
            "{steps_run} steps in {step_seconds:.1} s: {:.3} s/step mean (forward, backward, optimizer; {:?} loss over {:.0} vocabulary columns)",
            step_seconds / steps_run as f64,
            a.loss,
            summary.last.columns
        );
    }
    Ok(())
}

fn eval_line(step: usize, e: &EvalStats) -> String {
    let acc: Vec<String> = e.slot_accuracy.iter().map(|x| format!("{x:.3}")).collect();
    let nll: Vec<String> = e.slot_nll.iter().map(|x| format!("{x:.3}")).collect();
    format!("held-out step {step}: full-vocabulary NLL {:.4} over {} drafts; per-draft NLL {}; per-draft top-1 accuracy {}", e.nll, e.drafts, nll.join(" "), acc.join(" "))
}
