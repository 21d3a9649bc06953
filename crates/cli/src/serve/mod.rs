//! `domino serve`: an OpenAI-compatible HTTP server (axum) over the continuous batcher.
//!
//! Handlers parse and check a request, tokenize it, and queue it for the engine thread
//! (`engine.rs`), which owns the GPU and steps every active sequence together. Tokens come back on
//! a per-request channel and become text (`text.rs`), sent whole or as Server-Sent Events.

mod engine;
mod metrics;
pub mod openai;
pub mod text;

use crate::calibration::{self, CalibrationKey};
use crate::load::{check_memory_for, drafter_format, load_drafter, parse_dtype, upload_model, DeviceArgs};
use crate::{model_dir, CliError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use domino_engine::SamplingConfig;
use domino_models::tokenizer::{ChatMessage, TextTokenizer};
use domino_runtime::{DraftLen, GenerateOptions, Generation, SpeculativeOptions, SpeculativeStats, StopReason, BATCH_MAX_ROWS};
use engine::{Command, EngineConfig, Job, JobEvent};
use metrics::Metrics;
use openai::{ApiError, Sampling};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use text::TextStream;
use tokio::sync::mpsc::UnboundedReceiver;

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Model folder, GGUF file or Hugging Face repo id (default: SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<String>,
    /// Drafter folder (DFlash or Domino): a request running alone is decoded speculatively and
    /// hands over to the batch when others arrive (outputs unchanged).
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
    /// Drafts verified per round: auto or a fixed number (as `generate`).
    #[arg(long, default_value = "auto", value_parser = DraftLen::parse)]
    pub draft_len: DraftLen,
    /// Also draft by prompt lookup in the speculative rounds (as `generate --lookup`: where the
    /// conversation repeats, a round may verify the tokens that followed the earlier occurrence,
    /// with no draft pass). Output is unchanged.
    #[arg(long, requires = "draft")]
    pub lookup: bool,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// 0 picks a free port (printed on stderr).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Sequences decoded together in each step (each holds a KV cache of --context positions).
    #[arg(long, default_value_t = 8)]
    pub max_batch: usize,
    /// Requests waiting for a sequence slot before new ones get 429.
    #[arg(long, default_value_t = 64)]
    pub max_queue: usize,
    /// Positions per sequence (prompt + completion); longer requests get 400. Default: the model's
    /// context, at most 2048.
    #[arg(long)]
    pub context: Option<usize>,
    /// Prefill every prompt in full instead of reusing the keys and values of its longest common
    /// prefix with an earlier request (a free slot's cache) or one in flight (a shared system
    /// prompt, the earlier turns of a chat).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Require `Authorization: Bearer KEY` on /v1/ routes.
    #[arg(long)]
    pub api_key: Option<String>,
    #[command(flatten)]
    pub device: DeviceArgs,
}

/// Shared by every handler.
struct App {
    tokenizer: Arc<TextTokenizer>,
    stop_ids: Vec<u32>,
    model_id: String,
    context: usize,
    max_queue: usize,
    api_key: Option<String>,
    commands: Mutex<mpsc::Sender<Command>>,
    metrics: Arc<Metrics>,
    shutting_down: AtomicBool,
    created: u64,
    next_id: AtomicU64,
}

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    if args.max_batch == 0 || args.max_batch > BATCH_MAX_ROWS {
        return Err(CliError::Usage(format!("--max-batch {}: expected 1..={BATCH_MAX_ROWS}", args.max_batch)));
    }
    let dtype = parse_dtype(&args.device.dtype)?;
    let path = model_dir::resolve(args.model.as_deref())?;
    let files = domino_models::open_model(&path)?;
    let max_pos = files.config.max_position_embeddings;
    let context = args.context.unwrap_or(max_pos.min(2048));
    if context == 0 || context > max_pos {
        return Err(CliError::Usage(format!("--context {context}: expected 1..={max_pos} (the model's max_position_embeddings)")));
    }
    if files.tokenizer.is_none() {
        return Err(CliError::Usage(format!("{}: no tokenizer (tokenizer.json or GGUF metadata); serve needs one", path.display())));
    }
    let gpu = args.device.open_gpu()?;
    // Every slot's KV cache (and the speculative session's) before anything is uploaded.
    let sequences = args.max_batch + usize::from(args.draft.is_some());
    check_memory_for(&gpu, &files, dtype, args.draft.as_deref(), context, sequences)?;
    let loaded = upload_model(gpu, files, dtype, false)?;
    let tokenizer = loaded.tokenizer.ok_or_else(|| CliError::Usage(format!("{}: no tokenizer", path.display())))?;
    let model_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "domino".into());
    let metrics = Arc::new(Metrics::new(args.max_batch));
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready_rx) = mpsc::channel();
    let cfg = EngineConfig { slots: args.max_batch, context, max_rows: BATCH_MAX_ROWS, prefix_cache: !args.no_prefix_cache };
    let draft_vocab = args.draft_vocab.tokens(loaded.model.config.vocab_size, tokenizer.ranked_vocab());
    let drafting = load_drafting(&loaded.model, &args, draft_vocab, &path, dtype)?;
    let engine_metrics = metrics.clone();
    let model = loaded.model;
    // After a device loss the engine opens a new device and uploads everything again.
    let reload: engine::Reload = {
        let device = args.device.clone();
        let (path, draft, block_size, draft_len, lookup, dtype_name) = (path.clone(), args.draft.clone(), args.block_size, args.draft_len, args.lookup, args.device.dtype.clone());
        Box::new(move || {
            let gpu = device.open_gpu().map_err(|e| e.to_string())?;
            let files = domino_models::open_model(&path).map_err(|e| e.to_string())?;
            let model = upload_model(gpu, files, dtype, true).map_err(|e| e.to_string())?.model;
            let again = ReloadArgs { draft: draft.clone(), block_size, draft_vocab, draft_len, lookup, dtype: dtype_name.clone() };
            let drafting = drafting_for(&model, &again, &path, dtype).map_err(|e| e.to_string())?;
            Ok((model, drafting))
        })
    };
    let engine = std::thread::Builder::new()
        .name("domino-engine".into())
        .spawn(move || engine::run((model, drafting), reload, cfg, rx, engine_metrics, ready_tx))
        .map_err(|e| CliError::Usage(format!("cannot start the engine thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(CliError::Usage(format!("cannot allocate {} sequences of {context} positions: {e} (try a smaller --max-batch or --context)", args.max_batch))),
        Err(_) => return Err(CliError::Usage("the engine thread stopped while starting".into())),
    }
    let app = Arc::new(App {
        tokenizer: Arc::new(tokenizer),
        stop_ids: loaded.stop_ids,
        model_id,
        context,
        max_queue: args.max_queue,
        api_key: args.api_key.clone(),
        commands: Mutex::new(tx),
        metrics,
        shutting_down: AtomicBool::new(false),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
        next_id: AtomicU64::new(0),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| CliError::Usage(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(serve(app.clone(), &args.host, args.port, args.max_batch))?;
    // Stop the engine once the server has finished its last response.
    let _ = app.commands.lock().map(|c| c.send(Command::Drain));
    let _ = engine.join();
    eprintln!("domino serve: stopped");
    Ok(())
}

/// What a drafter needs to be loaded (again, after a device loss).
struct ReloadArgs {
    draft: Option<String>,
    block_size: Option<usize>,
    /// The resolved `--draft-vocab` shortlist (None: every id).
    draft_vocab: Option<usize>,
    draft_len: DraftLen,
    lookup: bool,
    dtype: String,
}

fn load_drafting(model: &domino_models::Qwen3Model, args: &ServeArgs, draft_vocab: Option<usize>, path: &std::path::Path, dtype: domino_engine::DTypeChoice) -> Result<Option<engine::Drafting>, CliError> {
    drafting_for(model, &ReloadArgs { draft: args.draft.clone(), block_size: args.block_size, draft_vocab, draft_len: args.draft_len, lookup: args.lookup, dtype: args.device.dtype.clone() }, path, dtype)
}

/// The drafter for `model` and how to calibrate its round costs (cached per adapter, with the
/// acceptance of earlier greedy runs as the schedule's starting point).
fn drafting_for(model: &domino_models::Qwen3Model, a: &ReloadArgs, path: &std::path::Path, dtype: domino_engine::DTypeChoice) -> Result<Option<engine::Drafting>, CliError> {
    let Some(draft) = &a.draft else { return Ok(None) };
    let drafter = load_drafter(model, draft, a.block_size, a.draft_vocab, drafter_format(dtype))?;
    let key = CalibrationKey::new(&model.gpu, path, std::path::Path::new(draft), &drafter, true, &a.dtype);
    let calibrate = Box::new(move |session: &mut domino_runtime::SpeculativeSession| {
        let costs = calibration::round_costs(session, &key, false).map_err(|e| e.to_string())?;
        calibration::load_acceptance(session, &key);
        Ok(costs)
    });
    Ok(Some(engine::Drafting { drafter, options: SpeculativeOptions { use_head: true, timing: false, draft_len: a.draft_len, costs: None, refine_costs: true, lookup: a.lookup }, calibrate }))
}

async fn serve(app: Arc<App>, host: &str, port: u16, slots: usize) -> Result<(), CliError> {
    let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| CliError::Usage(format!("cannot listen on {host}:{port}: {e}")))?;
    let addr = listener.local_addr().map_err(|e| CliError::Usage(e.to_string()))?;
    let router = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .with_state(app.clone());
    eprintln!("domino serve: listening on http://{addr} (model {}, {slots} sequences of {} positions)", app.model_id, app.context);
    let shutdown_app = app.clone();
    axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            shutdown_signal().await;
            eprintln!("domino serve: shutting down (finishing running requests)");
            shutdown_app.shutting_down.store(true, Ordering::SeqCst);
            let _ = shutdown_app.commands.lock().map(|c| c.send(Command::Drain));
        })
        .await
        .map_err(|e| CliError::Usage(format!("server error: {e}")))
}

/// SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

impl App {
    /// The API key (where one is set) and the shutdown state, before any work.
    fn admit(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        if let Some(key) = &self.api_key {
            let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
            if given != Some(key.as_str()) {
                return Err(ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key (Authorization: Bearer KEY)"));
            }
        }
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"));
        }
        Ok(())
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{:x}{:06x}", self.created, self.next_id.fetch_add(1, Ordering::Relaxed))
    }

    /// Queue a tokenized request; refuse it before any work when it cannot fit or the queue is full.
    fn submit(&self, prompt: Vec<u32>, s: &Sampling) -> Result<(UnboundedReceiver<JobEvent>, usize), ApiError> {
        let n = prompt.len();
        if n == 0 {
            return Err(ApiError::bad_request("the prompt is empty", Some("messages")));
        }
        if n >= self.context {
            return Err(ApiError::bad_request(format!("the prompt is {n} tokens; the context is {} positions (--context)", self.context), Some("messages")));
        }
        let max_tokens = s.max_tokens.unwrap_or(self.context - n);
        if n + max_tokens > self.context {
            return Err(ApiError::bad_request(
                format!("the prompt of {n} tokens + max_tokens {max_tokens} exceeds the context of {} positions (--context)", self.context),
                Some("max_tokens"),
            ));
        }
        if self.metrics.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_queue {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            self.metrics.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, format!("the queue is full ({} requests waiting, --max-queue)", self.max_queue)));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let opts = GenerateOptions {
            max_tokens,
            sampling: SamplingConfig { temperature: s.temperature, top_k: s.top_k, top_p: s.top_p, seed: s.seed },
            ignore_eos: s.ignore_eos,
            stop_ids: self.stop_ids.clone(),
        };
        let sent = self.commands.lock().map(|c| c.send(Command::Submit(Job { prompt, opts, events: tx })).is_ok()).unwrap_or(false);
        if !sent {
            self.metrics.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped"));
        }
        Ok((rx, n))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, ApiError> {
        self.tokenizer.encode(text).map_err(|e| ApiError::bad_request(format!("cannot tokenize the prompt: {e}"), None))
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Completion,
}

/// Everything one response needs to name itself.
struct Reply {
    endpoint: Endpoint,
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "system_fingerprint": "domino", "choices": choices})
    }

    /// A streamed piece: text (or, for chat, the role announcement), and a finish reason at the end.
    fn chunk(&self, text: Option<&str>, role: bool, finish: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(t) = text {
                    delta.insert("content".into(), json!(t));
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Endpoint::Completion => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        };
        self.envelope(true, json!([choice]))
    }

    fn whole(&self, text: &str, finish: &str, completion_tokens: usize, cached: usize, extra: Value) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null, "finish_reason": finish}),
            Endpoint::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = openai::usage(self.prompt_tokens, completion_tokens, cached);
        v["domino"] = extra;
        v
    }
}

/// A finished request: its generation (the last part, after a handover) and speculative statistics.
type Finished = (Generation, Option<SpeculativeStats>);

/// The `domino` extension object of a finished request: acceptance and draft lengths per round when
/// it was decoded speculatively.
fn extension(f: Option<&Finished>) -> Value {
    let Some((g, spec)) = f else { return json!({"stop_reason": "stop_sequence"}) };
    let mut v = json!({
        "stop_reason": g.stop_reason,
        "speculative": spec.is_some(),
        "time_to_first_token_s": g.stats.time_to_first_token_s,
        "decode_tokens_per_s": g.stats.decode_tokens_per_s,
    });
    if let Some(s) = spec {
        v["acceptance_lengths"] = json!(s.acceptance_lengths);
        v["draft_lengths"] = json!(s.draft_lengths);
        v["mean_acceptance"] = json!(s.mean_acceptance);
        v["mean_draft_length"] = json!(s.mean_draft_length);
        v["lookup_rounds"] = json!(s.lookup_rounds);
    }
    v
}

fn finish_reason(stopped_by_text: bool, f: Option<&Finished>) -> &'static str {
    match (stopped_by_text, f.map(|(g, _)| g.stop_reason)) {
        (true, _) | (_, Some(StopReason::Eos)) => "stop",
        _ => "length",
    }
}

/// Follows one request's events, turning tokens into final text.
struct Progress {
    rx: UnboundedReceiver<JobEvent>,
    text: TextStream,
    stop_ids: Vec<u32>,
    tokens: usize,
    /// Prompt tokens the engine found in its prefix cache.
    cached: usize,
}

enum Next {
    Text(String),
    /// Done: the remaining text, whether a stop sequence ended it, and the generation (None when a
    /// stop sequence ended it before the engine finished).
    End(String, bool, Option<Finished>),
    Failed(ApiError),
}

impl Progress {
    async fn next(&mut self) -> Next {
        loop {
            match self.rx.recv().await {
                Some(JobEvent::Prefilled { cached_prompt_tokens }) => self.cached = cached_prompt_tokens,
                Some(JobEvent::Token(t)) => {
                    self.tokens += 1;
                    if self.stop_ids.contains(&t) {
                        continue; // the end marker is not text
                    }
                    match self.text.push(t) {
                        Ok(s) if self.text.stopped() => return Next::End(s, true, None),
                        Ok(s) if s.is_empty() => continue,
                        Ok(s) => return Next::Text(s),
                        Err(e) => return Next::Failed(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
                    }
                }
                Some(JobEvent::Done(g, spec)) => {
                    self.cached = g.stats.cached_prompt_tokens;
                    return match self.text.finish() {
                        Ok(s) => {
                            let stopped = self.text.stopped();
                            Next::End(s, stopped, Some((g, spec)))
                        }
                        Err(e) => Next::Failed(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
                    };
                }
                Some(JobEvent::Failed { status, message }) => {
                    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    return Next::Failed(ApiError::new(status, message));
                }
                None => return Next::Failed(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the engine stopped")),
            }
        }
    }
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        app.admit(&headers)?;
        let req: openai::ChatRequest = openai::parse(&body)?;
        let sampling = req.common.sampling()?;
        if req.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty", Some("messages")));
        }
        let messages = req.messages.iter().map(|m| Ok(ChatMessage::new(m.chat_role()?, m.text()?))).collect::<Result<Vec<_>, ApiError>>()?;
        let text = app
            .tokenizer
            .apply_chat_template(&messages, true, false)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, format!("chat template: {e}")))?;
        let prompt = app.encode(&text)?;
        Ok((prompt, sampling))
    }
    .await;
    match result {
        Ok((prompt, sampling)) => respond(app, Endpoint::Chat, prompt, sampling).await,
        Err(e) => fail(&app, e),
    }
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    let result = async {
        app.admit(&headers)?;
        let req: openai::CompletionRequest = openai::parse(&body)?;
        let sampling = req.common.sampling()?;
        let prompt = app.encode(&openai::completion_prompt(&req.prompt)?)?;
        Ok((prompt, sampling))
    }
    .await;
    match result {
        Ok((prompt, sampling)) => respond(app, Endpoint::Completion, prompt, sampling).await,
        Err(e) => fail(&app, e),
    }
}

fn fail(app: &App, e: ApiError) -> Response {
    app.metrics.requests_error.fetch_add(1, Ordering::Relaxed);
    e.into_response()
}

async fn respond(app: Arc<App>, endpoint: Endpoint, prompt: Vec<u32>, sampling: Sampling) -> Response {
    let (rx, prompt_tokens) = match app.submit(prompt, &sampling) {
        Ok(r) => r,
        Err(e) => return fail(&app, e),
    };
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    let reply = Reply { endpoint, id: app.id(prefix), created: now_secs(), model: app.model_id.clone(), prompt_tokens };
    let mut progress = Progress { rx, text: TextStream::new(app.tokenizer.clone(), sampling.stops.clone()), stop_ids: app.stop_ids.clone(), tokens: 0, cached: 0 };
    // Wait for the first event before answering, so a request that fails before its first token
    // (a GPU error, shutdown) gets a real error status even when streamed.
    let first = progress.next().await;
    if let Next::Failed(e) = first {
        return fail(&app, e);
    }
    if !sampling.stream {
        let mut text = String::new();
        let mut next = first;
        loop {
            match next {
                Next::Text(s) => text.push_str(&s),
                Next::End(s, stopped, g) => {
                    text.push_str(&s);
                    app.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
                    return Json(reply.whole(&text, finish_reason(stopped, g.as_ref()), progress.tokens, progress.cached, extension(g.as_ref()))).into_response();
                }
                Next::Failed(e) => return fail(&app, e),
            }
            next = progress.next().await;
        }
    }
    stream(app, reply, progress, first, sampling.include_usage)
}

/// Server-Sent Events: (chat) the role, then text deltas, then the finish reason, then the usage
/// chunk when asked, then `[DONE]`. A task produces the events; when the client goes away the SSE
/// body is dropped, the task's next send fails and it drops the request's receiver, which frees the
/// sequence at the engine's next step.
fn stream(app: Arc<App>, reply: Reply, mut progress: Progress, first: Next, include_usage: bool) -> Response {
    let (out, events) = tokio::sync::mpsc::unbounded_channel::<Event>();
    tokio::spawn(async move {
        let send = |v: Value| out.send(Event::default().data(v.to_string())).is_ok();
        if reply.endpoint == Endpoint::Chat && !send(reply.chunk(Some(""), true, None)) {
            return;
        }
        let mut next = first;
        loop {
            match next {
                Next::Text(s) => {
                    if !send(reply.chunk(Some(&s), false, None)) {
                        return;
                    }
                }
                Next::End(s, stopped, g) => {
                    if !s.is_empty() {
                        send(reply.chunk(Some(&s), false, None));
                    }
                    let mut last = reply.chunk(None, false, Some(finish_reason(stopped, g.as_ref())));
                    last["domino"] = extension(g.as_ref());
                    send(last);
                    if include_usage {
                        let mut usage = reply.envelope(true, json!([]));
                        usage["usage"] = openai::usage(reply.prompt_tokens, progress.tokens, progress.cached);
                        send(usage);
                    }
                    let _ = out.send(Event::default().data("[DONE]"));
                    app.metrics.requests_ok.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Next::Failed(e) => {
                    send(e.body());
                    let _ = out.send(Event::default().data("[DONE]"));
                    app.metrics.requests_error.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
            next = progress.next().await;
        }
    });
    let stream = futures_util::stream::unfold(events, |mut rx| async move { rx.recv().await.map(|e| (Ok::<Event, std::convert::Infallible>(e), rx)) });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if let Err(e) = app.admit(&headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [{"id": app.model_id, "object": "model", "created": app.created, "owned_by": "domino"}]})).into_response()
}

async fn health(State(app): State<Arc<App>>) -> Response {
    if app.shutting_down.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "shutting_down"}))).into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

async fn metrics_text(State(app): State<Arc<App>>) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], app.metrics.render()).into_response()
}

async fn not_found() -> Response {
    ApiError::new(StatusCode::NOT_FOUND, "no such route (POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health, GET /metrics)").into_response()
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}
