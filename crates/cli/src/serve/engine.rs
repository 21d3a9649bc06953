//! The engine thread: owns the model and the `Batcher`, and runs steps while any request is active.
//!
//! HTTP handlers talk to it through a channel of `Command`s and get each request's tokens back on a
//! channel of their own. A handler that goes away (client disconnected, stop sequence reached) drops
//! its receiver; the engine sees the closed channel before the next step and frees the slot, so an
//! abandoned request costs at most one more step.
//!
//! With a drafter, a request that runs alone is decoded speculatively (adaptive draft length). As
//! soon as another request arrives, the speculative one hands over to the batcher: its prompt plus
//! what it generated so far becomes a new prompt (re-prefilled in chunks) and it continues batched.
//! Both paths are exact, so the handover changes nothing in greedy output.

use super::metrics::Metrics;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::Qwen3Model;
use domino_runtime::{BatchEvent, Batcher, GenerateOptions, Generation, SequenceId, SpeculativeOptions, SpeculativeSession, SpeculativeStats};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// What a request receives, in order: tokens, then exactly one `Done` or `Failed`.
#[derive(Debug)]
pub enum JobEvent {
    /// The request's prompt is in its batch slot, this many of its tokens from the prefix cache
    /// (sent just before its first token).
    Prefilled { cached_prompt_tokens: usize },
    Token(u32),
    /// The end, with the speculative rounds' statistics when the request was drafted for.
    Done(Generation, Option<SpeculativeStats>),
    /// The request failed; `status` is the HTTP status to answer with (500 GPU error, 503 shutdown).
    Failed { status: u16, message: String },
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub opts: GenerateOptions,
    pub events: UnboundedSender<JobEvent>,
}

pub enum Command {
    Submit(Job),
    /// Stop admitting: queued jobs fail with 503, running ones finish, then the thread exits.
    Drain,
}

pub struct EngineConfig {
    pub slots: usize,
    pub context: usize,
    pub max_rows: usize,
    /// Reuse cached prompt prefixes (see `Batcher::set_prefix_cache`).
    pub prefix_cache: bool,
}

/// A drafter, and how to calibrate its round costs once the engine's session exists.
pub struct Drafting {
    pub drafter: DrafterModel,
    pub options: SpeculativeOptions,
    pub calibrate: Box<dyn FnOnce(&mut SpeculativeSession) -> Result<domino_runtime::RoundCosts, String> + Send>,
}

/// How a speculative run ended.
enum Solo {
    /// Finished (stop token, max_tokens, or the client left).
    Done,
    /// Another request arrived: continue this one in the batcher from here.
    HandOver { job: Job, stats: SpeculativeStats },
}

/// Opens a new device and loads the model (and drafter) on it again, after a device loss.
pub type Reload = Box<dyn Fn() -> Result<(Qwen3Model, Option<Drafting>), String> + Send>;

type Ready = std::sync::mpsc::Sender<Result<(), String>>;

/// Requests that outlive a device: waiting ones, commands taken early, the drain flag.
#[derive(Default)]
struct Waiting {
    queue: VecDeque<Job>,
    stash: Vec<Command>,
    draining: bool,
}

/// Why `serve_on` returned.
enum Exit {
    Drained,
    DeviceLost,
}

/// Serve commands until drained; when the device is lost (its requests failed with 500), reopen
/// it with `reload` and go on with the queue. `ready` hears whether the first start worked.
pub fn run(first: (Qwen3Model, Option<Drafting>), reload: Reload, cfg: EngineConfig, commands: Receiver<Command>, metrics: Arc<Metrics>, ready: Ready) {
    let mut waiting = Waiting::default();
    let mut next = Some(first);
    let mut ready = Some(ready);
    loop {
        let (model, drafting) = match next.take() {
            Some(m) => m,
            None => match reload() {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("domino serve: cannot reopen the GPU ({e}); retrying in 1 s");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            },
        };
        match serve_on(&model, &cfg, drafting, &commands, &metrics, &mut waiting, ready.take()) {
            Exit::Drained => return,
            Exit::DeviceLost => eprintln!("domino serve: the GPU device was lost ({}); reopening it", model.gpu.lost().unwrap_or_default()),
        }
    }
}

/// Test hook: `DOMINO_SERVE_LOSE_DEVICE_AT_STEP=N` destroys the device after N steps, once, so the
/// tests can check that a lost device fails its requests with 500 and the server recovers.
fn lose_device_for_test(model: &Qwen3Model, steps: u64) {
    static DONE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let at = std::env::var("DOMINO_SERVE_LOSE_DEVICE_AT_STEP").ok().and_then(|v| v.parse::<u64>().ok());
    if at == Some(steps) && !DONE.swap(true, Ordering::SeqCst) {
        model.gpu.destroy();
    }
}

fn serve_on(model: &Qwen3Model, cfg: &EngineConfig, drafting: Option<Drafting>, commands: &Receiver<Command>, metrics: &Metrics, w: &mut Waiting, ready: Option<Ready>) -> Exit {
    let report = |r: Result<(), String>| {
        if let Some(tx) = &ready {
            let _ = tx.send(r);
        }
    };
    let mut batcher = match Batcher::new(model, cfg.slots, cfg.context, cfg.max_rows) {
        Ok(mut b) => {
            b.set_prefix_cache(cfg.prefix_cache);
            b
        }
        Err(e) => {
            report(Err(e.to_string()));
            return Exit::Drained;
        }
    };
    // Kernels compile before the first request, not in its time to first token.
    if let Err(e) = pollster::block_on(batcher.warm_up()) {
        report(Err(format!("warming up the kernels: {e}")));
        return Exit::Drained;
    }
    // The speculative session (its own KV cache) and its options, calibrated once.
    let (drafter, calibrate, options) = match drafting {
        Some(d) => (Some(d.drafter), Some(d.calibrate), Some(d.options)),
        None => (None, None, None),
    };
    let mut solo: Option<(SpeculativeSession, SpeculativeOptions)> = None;
    if let (Some(drafter), Some(mut options)) = (drafter.as_ref(), options) {
        let mut session = match SpeculativeSession::new(model, drafter, cfg.context) {
            Ok(s) => s,
            Err(e) => {
                report(Err(e.to_string()));
                return Exit::Drained;
            }
        };
        if let (Some(calibrate), domino_runtime::DraftLen::Auto) = (calibrate, options.draft_len) {
            match calibrate(&mut session) {
                Ok(costs) => options.costs = Some(costs),
                Err(e) => {
                    report(Err(e));
                    return Exit::Drained;
                }
            }
        }
        solo = Some((session, options));
    }
    report(Ok(()));
    let Waiting { queue, stash, draining } = w;
    let mut running: HashMap<SequenceId, UnboundedSender<JobEvent>> = HashMap::new();
    // Speculative statistics of requests handed over to the batcher, attached when they finish.
    let mut handed: HashMap<SequenceId, SpeculativeStats> = HashMap::new();
    // Admitted sequences without a token yet (their prefix-cache count is sent with the first).
    let mut prefilling: HashSet<SequenceId> = HashSet::new();
    loop {
        // Block only when there is nothing to do; otherwise take what arrived and step.
        let idle = batcher.is_idle() && queue.is_empty() && stash.is_empty();
        if idle && *draining {
            return Exit::Drained;
        }
        let first = if idle {
            match commands.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => Some(c),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Exit::Drained,
            }
        } else {
            None
        };
        let arrived: Vec<Command> = std::mem::take(stash).into_iter().chain(first).chain(commands.try_iter()).collect();
        for cmd in arrived {
            match cmd {
                Command::Submit(job) if *draining => {
                    metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                    let _ = job.events.send(JobEvent::Failed { status: 503, message: "the server is shutting down".into() });
                }
                Command::Submit(job) => queue.push_back(job),
                Command::Drain => {
                    *draining = true;
                    for job in queue.drain(..) {
                        metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                        let _ = job.events.send(JobEvent::Failed { status: 503, message: "the server is shutting down".into() });
                    }
                }
            }
        }
        // Clients that left: drop their queued jobs, free their slots.
        queue.retain(|j| {
            let gone = j.events.is_closed();
            if gone {
                metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            !gone
        });
        running.retain(|&id, tx| {
            if tx.is_closed() {
                batcher.cancel(id);
                prefilling.remove(&id);
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                false
            } else {
                true
            }
        });
        // Alone with a drafter: decode speculatively until done or until another request arrives.
        if let Some((session, options)) = solo.as_mut() {
            let alone = batcher.is_idle() && queue.len() == 1 && !*draining;
            if let Some(job) = if alone { queue.pop_front() } else { None } {
                metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                metrics.active.store(1, Ordering::Relaxed);
                if let Solo::HandOver { job, stats } = run_solo(session, options, job, commands, stash, metrics) {
                    match batcher.admit(job.prompt, job.opts) {
                        Ok(id) => {
                            running.insert(id, job.events);
                            handed.insert(id, stats);
                        }
                        Err(e) => {
                            let _ = job.events.send(JobEvent::Failed { status: 500, message: e.to_string() });
                        }
                    }
                }
                metrics.active.store(batcher.active(), Ordering::Relaxed);
                if model.gpu.lost().is_some() {
                    return Exit::DeviceLost;
                }
                continue;
            }
        }
        while batcher.has_free_slot() {
            let Some(job) = queue.pop_front() else { break };
            metrics.waiting.fetch_sub(1, Ordering::Relaxed);
            match batcher.admit(job.prompt, job.opts) {
                Ok(id) => {
                    running.insert(id, job.events);
                    prefilling.insert(id);
                }
                Err(e) => {
                    let _ = job.events.send(JobEvent::Failed { status: 400, message: e.to_string() });
                }
            }
        }
        metrics.active.store(batcher.active(), Ordering::Relaxed);
        if batcher.is_idle() {
            continue;
        }
        match pollster::block_on(batcher.step()) {
            Ok(events) => {
                let shape = batcher.last_step();
                metrics.record_step(shape.decode_rows, shape.prefill_rows);
                lose_device_for_test(model, metrics.steps.load(Ordering::Relaxed));
                for e in events {
                    match e {
                        BatchEvent::Token { id, token } => {
                            metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
                            // Its prompt is in: how much of it came from the prefix cache is final.
                            if let (true, Some(tx)) = (prefilling.remove(&id), running.get(&id)) {
                                let cached_prompt_tokens = batcher.cached_prompt_tokens(id).unwrap_or(0);
                                let _ = tx.send(JobEvent::Prefilled { cached_prompt_tokens });
                            }
                            if let Some(tx) = running.get(&id) {
                                let _ = tx.send(JobEvent::Token(token));
                            }
                        }
                        BatchEvent::Finished { id, generation } => {
                            prefilling.remove(&id);
                            metrics.prompt_tokens.fetch_add(generation.prompt_ids.len() as u64, Ordering::Relaxed);
                            metrics.cached_prompt_tokens.fetch_add(generation.stats.cached_prompt_tokens as u64, Ordering::Relaxed);
                            let spec = handed.remove(&id);
                            if let Some(tx) = running.remove(&id) {
                                let _ = tx.send(JobEvent::Done(generation, spec));
                            }
                        }
                    }
                }
            }
            Err(e) => {
                // A GPU error fails the requests of this step; the server keeps serving.
                let message = format!("GPU error: {e}");
                prefilling.clear();
                for id in batcher.abort_all() {
                    handed.remove(&id);
                    if let Some(tx) = running.remove(&id) {
                        let _ = tx.send(JobEvent::Failed { status: 500, message: message.clone() });
                    }
                }
                metrics.gpu_errors.fetch_add(1, Ordering::Relaxed);
                metrics.active.store(0, Ordering::Relaxed);
                if model.gpu.lost().is_some() {
                    return Exit::DeviceLost;
                }
            }
        }
        metrics.active.store(batcher.active(), Ordering::Relaxed);
    }
}

/// Decode `job` speculatively while it is the only request. Returns `HandOver` when another request
/// arrives first (its command is stashed for the main loop).
fn run_solo(session: &mut SpeculativeSession, options: &SpeculativeOptions, job: Job, commands: &Receiver<Command>, stash: &mut Vec<Command>, metrics: &Metrics) -> Solo {
    let mut arrived = false;
    let result = {
        let events = &job.events;
        let mut on_token = |t: u32| -> bool {
            metrics.generated_tokens.fetch_add(1, Ordering::Relaxed);
            if events.send(JobEvent::Token(t)).is_err() {
                return false; // the client left
            }
            if let Ok(cmd) = commands.try_recv() {
                stash.push(cmd);
                arrived = true;
            }
            !arrived
        };
        pollster::block_on(session.generate(&job.prompt, &job.opts, options, &mut on_token))
    };
    match result {
        Ok((g, stats)) => {
            metrics.record_rounds(&stats.acceptance_lengths);
            if g.stop_reason == domino_runtime::StopReason::Cancelled {
                if arrived && !job.events.is_closed() {
                    let mut prompt = job.prompt;
                    prompt.extend_from_slice(&g.output_ids);
                    let opts = GenerateOptions { max_tokens: job.opts.max_tokens - g.output_ids.len(), ..job.opts };
                    return Solo::HandOver { job: Job { prompt, opts, events: job.events }, stats };
                }
                metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                return Solo::Done;
            }
            metrics.prompt_tokens.fetch_add(g.prompt_ids.len() as u64, Ordering::Relaxed);
            let _ = job.events.send(JobEvent::Done(g, Some(stats)));
            Solo::Done
        }
        Err(e) => {
            metrics.gpu_errors.fetch_add(1, Ordering::Relaxed);
            let _ = job.events.send(JobEvent::Failed { status: 500, message: format!("GPU error: {e}") });
            Solo::Done
        }
    }
}
