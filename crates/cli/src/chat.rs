//! `domino chat`: an interactive terminal chat. Each turn renders the whole conversation with the
//! model's chat template, streams the reply, and prints one line of statistics on stderr.
//! `/reset` starts over (keeping the system prompt), `/exit` (or end of input) quits.

use crate::calibration::{self, CalibrationKey};
use crate::load::{drafter_format, load_drafter, load_model, parse_dtype, DeviceArgs};
use crate::{model_dir, CliError};
use clap::Args;
use domino_engine::SamplingConfig;
use domino_models::tokenizer::{ChatMessage, StreamDecoder};
use domino_runtime::{DraftLen, GenerateOptions, Session, SpeculativeOptions, SpeculativeSession};
use std::io::{BufRead, Write};
use std::path::Path;

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// Model folder, GGUF file or Hugging Face repo id (default: SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<String>,
    /// Drafter folder: replies are decoded speculatively (output unchanged).
    #[arg(long)]
    pub draft: Option<String>,
    /// A system message that starts every conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Longest reply in tokens.
    #[arg(long, default_value_t = 512)]
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
    /// Positions the conversation may use (default: the model's context, at most 4096).
    #[arg(long)]
    pub context: Option<usize>,
    #[command(flatten)]
    pub device: DeviceArgs,
    /// Override the drafter's block size.
    #[arg(long, requires = "draft")]
    pub block_size: Option<usize>,
    /// Token ids a draft may be: auto (the first 8192 of a large vocabulary, a frequency
    /// shortlist that makes the draft's lm_head ~6x cheaper), full, or the first N (a multiple of
    /// 128). Output is unchanged; only acceptance and draft cost move.
    #[arg(long, default_value = "auto", value_parser = domino_models::drafter_gpu::DraftVocab::parse, requires = "draft")]
    pub draft_vocab: domino_models::drafter_gpu::DraftVocab,
    /// Drafts verified per round: auto or a fixed number (as `generate`).
    #[arg(long, default_value = "auto", value_parser = DraftLen::parse)]
    pub draft_len: DraftLen,
    /// Also draft by prompt lookup (as `generate --lookup`).
    #[arg(long, requires = "draft")]
    pub lookup: bool,
}

pub fn run(args: ChatArgs) -> Result<(), CliError> {
    if !(args.temperature >= 0.0) || !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(CliError::Usage("--temperature must be >= 0 and --top-p in (0, 1]".into()));
    }
    let dtype = parse_dtype(&args.device.dtype)?;
    let dir = model_dir::resolve(args.model.as_deref())?;
    let gpu = args.device.open_gpu()?;
    let loaded = load_model(gpu, &dir, dtype, false)?;
    let tok = loaded.tokenizer.as_ref().ok_or_else(|| CliError::Usage(format!("{}: no tokenizer; chat needs one", dir.display())))?;
    if !tok.has_chat_template() {
        return Err(CliError::Usage(format!("{}: the tokenizer has no chat template", dir.display())));
    }
    let max_pos = loaded.model.config.max_position_embeddings;
    let context = args.context.unwrap_or(max_pos.min(4096));
    if context == 0 || context > max_pos {
        return Err(CliError::Usage(format!("--context {context}: expected 1..={max_pos} (the model's max_position_embeddings)")));
    }
    let sampling = SamplingConfig { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, seed: args.seed };
    // Each turn resends the conversation: the plain session keeps its common prefix cached.
    let mut plain = if args.draft.is_none() { Some(Session::new(&loaded.model, context)?) } else { None };
    if let Some(session) = plain.as_mut() {
        session.set_prefix_reuse(true);
    }
    let drafter = match &args.draft {
        Some(d) => Some(load_drafter(&loaded.model, d, args.block_size, args.draft_vocab.tokens(loaded.model.config.vocab_size, tok.ranked_vocab()), drafter_format(dtype))?),
        None => None,
    };
    let mut spec = None;
    if let (Some(drafter), Some(draft)) = (&drafter, &args.draft) {
        let mut session = SpeculativeSession::new(&loaded.model, drafter, context)?;
        let costs = match args.draft_len {
            DraftLen::Auto => {
                let key = CalibrationKey::new(&loaded.model.gpu, &dir, Path::new(draft), drafter, true, &args.device.dtype);
                let costs = calibration::round_costs(&mut session, &key, false)?;
                // Earlier greedy runs' acceptance starts the schedule; later turns add this one's.
                calibration::load_acceptance(&mut session, &key);
                Some(costs)
            }
            DraftLen::Fixed(_) => None,
        };
        spec = Some((session, SpeculativeOptions { use_head: true, timing: false, draft_len: args.draft_len, costs, refine_costs: true, lookup: args.lookup }));
    }
    let system: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
    let mut history = system.clone();
    eprintln!("domino chat: {} ({} positions). /reset starts over, /exit quits.", dir.display(), context);
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        print!("> ");
        let _ = stdout.flush();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).map_err(|e| CliError::Usage(format!("reading stdin: {e}")))? == 0 {
            println!();
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history = system.clone();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        history.push(ChatMessage::new("user", line));
        let prompt = tok.encode(&tok.apply_chat_template(&history, true, false)?)?;
        let room = context.saturating_sub(prompt.len());
        if room == 0 {
            eprintln!("error: the conversation is {} tokens, over the context of {context} positions (--context); /reset to start over", prompt.len());
            history.pop();
            continue;
        }
        let opts = GenerateOptions { max_tokens: args.max_tokens.min(room), sampling, ignore_eos: false, stop_ids: loaded.stop_ids.clone() };
        let mut stream = StreamDecoder::new();
        let mut on_token = |id: u32| -> bool {
            if !opts.stop_ids.contains(&id) {
                if let Ok(text) = stream.push(tok, id) {
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                }
            }
            true
        };
        let (generation, acceptance) = match (&mut plain, &mut spec) {
            (_, Some((session, spec_opts))) => {
                let (g, s) = pollster::block_on(session.generate(&prompt, &opts, spec_opts, &mut on_token))?;
                (g, Some(s.mean_acceptance))
            }
            (Some(session), None) => (pollster::block_on(session.generate(&prompt, &opts, &mut on_token))?, None),
            (None, None) => return Err(CliError::Usage("no session".into())),
        };
        let rest = stream.finish(tok).unwrap_or_default();
        println!("{rest}");
        let reply_ids: Vec<u32> = generation.output_ids.iter().copied().filter(|id| !loaded.stop_ids.contains(id)).collect();
        history.push(ChatMessage::new("assistant", tok.decode(&reply_ids)?));
        eprintln!("{}", stats_line(&generation, acceptance));
    }
    Ok(())
}

fn stats_line(g: &domino_runtime::Generation, acceptance: Option<f64>) -> String {
    let s = &g.stats;
    let mut line = format!("[{} tokens, {:.1} tok/s, prompt {} tokens", s.generated_tokens, s.decode_tokens_per_s, s.prompt_tokens);
    if s.cached_prompt_tokens > 0 {
        line += &format!(" ({} cached)", s.cached_prompt_tokens);
    }
    line += &format!(" at {:.1} tok/s", s.prefill_tokens_per_s);
    if let Some(a) = acceptance {
        line += &format!(", mean acceptance {a:.2}");
    }
    if g.stop_reason == domino_runtime::StopReason::MaxTokens {
        line += ", stopped at --max-tokens";
    }
    line + "]"
}
