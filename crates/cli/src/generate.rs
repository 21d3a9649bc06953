//! `domino generate`: stream text to stdout, or print exactly one JSON object with --json.

use crate::load::{check_memory, context_for, drafter_format, parse_dtype, upload_model, DeviceArgs};
use domino_models::open_model;
use crate::{model_dir, CliError};
use clap::Args;
use domino_engine::SamplingConfig;
use domino_models::tokenizer::{ChatMessage, StreamDecoder};
use domino_runtime::{DraftLen, GenerateOptions, Session, SpeculativeOptions, SpeculativeSession};
use crate::calibration::{self, CalibrationKey};
use crate::load::load_drafter;
use std::path::Path;
use std::io::Write;

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Model folder or Hugging Face repo id (default: the built-in tiny Qwen3).
    #[arg(long)]
    pub model: Option<String>,
    /// Prompt text (tokenized with the model's tokenizer).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// Prompt as comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt as a user message with the model's chat template (thinking disabled).
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 disables top-k.
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Do not stop at end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Print one JSON object with ids, text and statistics instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Drafter folder (DFlash or Domino checkpoint): speculative decoding. Without it, plain decoding.
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
    /// Run a Domino drafter as its DFlash-style backbone only (ablation).
    #[arg(long, requires = "draft")]
    pub no_head: bool,
    /// Time the draft, verify and Domino-head phases of each round apart (GPU syncs between the
    /// phases make rounds slower, and the adaptive draft length then keeps its calibrated costs
    /// instead of refining them from the rounds' times). Without it the whole round counts as verify.
    #[arg(long, requires = "draft")]
    pub timing: bool,
    /// Drafts verified per round: auto (chosen each round from this adapter's measured costs and
    /// the drafter's running acceptance; 0 = a plain step) or a fixed number, at most the drafts a
    /// block yields (B for a Domino drafter with shifted labels, else B − 1; a larger number
    /// verifies the whole block).
    #[arg(long, default_value = "auto", value_parser = DraftLen::parse)]
    pub draft_len: DraftLen,
    /// Also draft by prompt lookup: where the text so far repeats (the longest earlier occurrence of
    /// its last 1-3 tokens), a round may verify the tokens that followed it instead of the
    /// drafter's, with no draft pass, when that is expected to commit more tokens per second.
    /// With --draft-len N: a copy of up to N tokens or the drafter's N drafts, whichever is
    /// expected to commit more tokens per round. Output is unchanged.
    #[arg(long, requires = "draft")]
    pub lookup: bool,
    /// KV cache capacity in positions (prompt + generated tokens). Default: the prompt plus
    /// --max-tokens, within the model's max_position_embeddings. Checked against the adapter's
    /// memory limits before anything is uploaded.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub context: Option<u64>,
}

pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    if !(args.temperature >= 0.0) || !(0.0..=1.0).contains(&args.top_p) || args.top_p == 0.0 {
        return Err(CliError::Usage("--temperature must be >= 0 and --top-p in (0, 1]".into()));
    }
    let format = parse_dtype(&args.device.dtype)?;
    let dir = model_dir::resolve(args.model.as_deref())?;
    // Headers and tokenizer first (a malformed file fails before any device opens); the prompt's
    // length sizes the KV cache, which the memory check weighs before a byte is uploaded.
    let files = open_model(&dir)?;
    let prompt_ids: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tok = files.tokenizer.as_ref().ok_or_else(|| CliError::Usage(format!("{}: no tokenizer.json, use --prompt-ids", dir.display())))?;
            let text = if args.chat { tok.apply_chat_template(&[ChatMessage::new("user", text.as_str())], true, false)? } else { text.clone() };
            tok.encode(&text)?
        }
        (None, None) => return Err(CliError::Usage("give --prompt TEXT or --prompt-ids 1,2,3".into())),
    };
    let requested = args.context.map(|c| usize::try_from(c).unwrap_or(usize::MAX));
    let capacity = context_for(requested, prompt_ids.len(), args.max_tokens, files.config.max_position_embeddings);
    let gpu = args.device.open_gpu()?;
    check_memory(&gpu, &files, format, args.draft.as_deref(), capacity)?;
    let loaded = upload_model(gpu, files, format, false)?;
    let tokenizer = loaded.tokenizer.as_ref();
    let opts = GenerateOptions {
        max_tokens: args.max_tokens,
        sampling: SamplingConfig { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, seed: args.seed },
        ignore_eos: args.ignore_eos,
        stop_ids: loaded.stop_ids.clone(),
    };
    let mut stream = StreamDecoder::new();
    let mut stdout = std::io::stdout();
    let mut stream_error = None;
    // The stop token that ends a generation (`<|im_end|>`, `</s>`) is not printed when streaming, as
    // in `domino chat`; `--json` keeps every id and its text.
    let printed_stop_ids: &[u32] = if args.ignore_eos { &[] } else { &opts.stop_ids };
    let mut on_token = |id: u32| -> bool {
        if !args.json && !printed_stop_ids.contains(&id) {
            if let Some(tok) = tokenizer {
                match stream.push(tok, id) {
                    Ok(text) => {
                        let _ = stdout.write_all(text.as_bytes());
                        let _ = stdout.flush();
                    }
                    Err(e) => {
                        stream_error = Some(e);
                        return false;
                    }
                }
            }
        }
        true
    };
    let (generation, spec_stats) = match &args.draft {
        None => {
            let mut session = Session::new(&loaded.model, capacity)?;
            session.validate(&prompt_ids, args.max_tokens)?;
            (pollster::block_on(session.generate(&prompt_ids, &opts, &mut on_token))?, None)
        }
        Some(draft) => {
            let drafter = load_drafter(&loaded.model, draft, args.block_size, args.draft_vocab.tokens(loaded.model.config.vocab_size, loaded.tokenizer.as_ref().and_then(|t| t.ranked_vocab())), drafter_format(format))?;
            let mut session = SpeculativeSession::new(&loaded.model, &drafter, capacity)?;
            session.validate(&prompt_ids, args.max_tokens)?;
            let use_head = !args.no_head;
            // auto: the cached costs, and the acceptance of earlier greedy runs as the prior.
            let key = CalibrationKey::new(&loaded.model.gpu, &dir, Path::new(draft), &drafter, use_head, &args.device.dtype);
            let costs = match args.draft_len {
                DraftLen::Auto => {
                    let costs = calibration::round_costs(&mut session, &key, args.json)?;
                    calibration::load_acceptance(&mut session, &key);
                    Some(costs)
                }
                DraftLen::Fixed(_) => None,
            };
            let spec = SpeculativeOptions { use_head, timing: args.timing, draft_len: args.draft_len, costs, refine_costs: true, lookup: args.lookup };
            let (g, s) = pollster::block_on(session.generate(&prompt_ids, &opts, &spec, &mut on_token))?;
            if args.draft_len == DraftLen::Auto && opts.sampling.is_greedy() {
                calibration::save_acceptance(&session, &key);
            }
            (g, Some(s))
        }
    };
    if let Some(e) = stream_error {
        return Err(e.into());
    }
    let text = match tokenizer {
        Some(tok) => tok.decode(&generation.output_ids)?,
        None => String::new(),
    };
    if args.json {
        let mut stats = serde_json::to_value(&generation.stats).unwrap_or_default();
        if let (Some(s), Some(obj)) = (&spec_stats, stats.as_object_mut()) {
            if let Ok(serde_json::Value::Object(extra)) = serde_json::to_value(s) {
                obj.extend(extra);
            }
        }
        let out = serde_json::json!({
            "prompt_ids": generation.prompt_ids,
            "output_ids": generation.output_ids,
            "text": text,
            "stop_reason": generation.stop_reason,
            "stats": stats,
        });
        println!("{}", serde_json::to_string(&out).unwrap_or_default());
    } else {
        if let Some(tok) = tokenizer {
            let rest = stream.finish(tok)?;
            print!("{rest}");
        } else {
            print!("{}", generation.output_ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(" "));
        }
        println!();
        let s = &generation.stats;
        eprintln!(
            "{} prompt tokens at {:.1} tok/s, {} generated at {:.1} tok/s ({:?})",
            s.prompt_tokens, s.prefill_tokens_per_s, s.generated_tokens, s.decode_tokens_per_s, generation.stop_reason
        );
        if let Some(sp) = &spec_stats {
            let split = if args.timing {
                format!("draft {:.3}s / verify {:.3}s, Domino head {:.1}% of round time", sp.draft_seconds, sp.verify_seconds, 100.0 * sp.head_share)
            } else {
                format!("rounds {:.3}s (--timing splits draft / verify / head)", sp.verify_seconds)
            };
            let copied = if args.lookup { format!(" ({} of them copies by --lookup, {} from the drafter's n-gram table)", sp.lookup_rounds, sp.table_rounds) } else { String::new() };
            eprintln!("{} rounds{copied}, mean acceptance {:.2}, mean draft length {:.2}, {split}", sp.rounds, sp.mean_acceptance, sp.mean_draft_length);
        }
    }
    Ok(())
}
