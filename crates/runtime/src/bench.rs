//! The measurement behind `domino bench` and the browser's Bench button, once: plain decoding and
//! (with a drafter) its speculative modes on one adapter, warm-up and timed runs per prompt, the
//! draft / verify / head split, the adapter's copy bandwidth, and per mode the figures of a
//! domino-bench/1 report (`ModeReport`: medians, speedups over plain, mean accepted length, mean
//! draft length, weight bandwidth, memory estimate). The callers load the model and drafter, choose
//! prompts and capacities, and wrap the result in their report (native or browser).

use crate::clock::now;
use crate::draft_len::{DraftLen, RoundCosts};
use crate::error::RuntimeError;
use crate::session::{GenerateOptions, Session};
use crate::speculative::{SpeculativeOptions, SpeculativeSession, CALIBRATION_REPS};
use domino_engine::Gpu;
use domino_models::drafter_gpu::DrafterModel;
use domino_models::Qwen3Model;
use serde::{Deserialize, Serialize};

/// One decoding mode on one adapter. Tokens/s figures are medians over every (prompt, run) pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModeReport {
    pub mode: String,
    pub prefill_tokens_per_s: f64,
    pub decode_tokens_per_s: f64,
    pub decode_tokens_per_s_min: f64,
    pub decode_tokens_per_s_max: f64,
    /// Every timed run's decode tokens/s, prompt by prompt.
    pub decode_tokens_per_s_all: Vec<f64>,
    /// Median time from the start of a run to the first generated token.
    pub time_to_first_token_s: f64,
    /// decode_tokens_per_s / the plain mode's decode_tokens_per_s on the same adapter, same run.
    pub speedup_over_plain: f64,
    /// The geometric mean over the timed runs of (this run's decode tokens/s / plain's run of the
    /// same prompt and repetition, made just before it): the prompts' own speeds cancel, and each
    /// ratio compares runs made back to back. Absent in older reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup_over_plain_paired: Option<f64>,
    /// Mean tokens committed per round (1 for plain decoding).
    pub mean_acceptance: f64,
    /// Mean drafts verified per round (`--draft-len`; 0 for plain decoding). Absent in older reports.
    #[serde(default)]
    pub mean_draft_length: f64,
    /// Totals over the timing runs (one per prompt); 0 for plain decoding.
    pub draft_seconds: f64,
    pub verify_seconds: f64,
    pub head_seconds: f64,
    /// head_seconds / (draft_seconds + verify_seconds); 0 without the Domino head.
    pub head_share: f64,
    /// decode_weight_bytes_per_token x decode tokens/s (effective for speculative modes).
    pub decode_weight_bandwidth_gb_s: f64,
    /// decode weight bandwidth / copy bandwidth (STREAM convention).
    pub roofline_ratio: f64,
    /// decode weight bandwidth / (copy bandwidth / 2): against the copy kernel's read rate.
    pub read_roofline_ratio: f64,
    /// Weights + KV cache (+ drafter weights), computed from buffer sizes, not queried from the driver.
    pub peak_gpu_memory_bytes: u64,
    /// Always true: the memory figure is an estimate.
    pub peak_gpu_memory_estimated: bool,
}

/// The built-in prompt set of `domino bench` and the browser's Bench (tokenized by the caller).
pub const DEFAULT_PROMPTS: [&str; 4] = [
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Explain in two sentences why the sky is blue.",
    "Write a haiku about a GPU running out of memory.",
    "The capital of France is",
];

/// What to measure (the model and drafter are given to `measure` beside it).
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// Token ids of every prompt (at least one, none empty).
    pub prompts: Vec<Vec<u32>>,
    /// Tokens generated per run (EOS ignored).
    pub max_tokens: usize,
    /// Timed runs per prompt, after one warm-up run per mode.
    pub runs: usize,
    /// KV capacity of the plain session and of the speculative session.
    pub capacity: usize,
    pub spec_capacity: usize,
    /// One extra run with timing syncs (the draft / verify / head split) on the first N prompts
    /// (None: every prompt).
    pub split_prompts: Option<usize>,
    /// Drafts verified per round in the speculative modes.
    pub draft_len: DraftLen,
    /// Measure the drafter's full mode once more with prompt lookup drafts (`--lookup`), at
    /// the same `draft_len`.
    pub lookup: bool,
    /// Bytes the copy-bandwidth kernel moves (capped by the adapter's binding limit).
    pub copy_bytes: u64,
}

impl BenchPlan {
    /// Progress events `measure` reports: per mode one warm-up and `runs` runs per prompt (+ one
    /// split run for the first `split_prompts` prompts in speculative modes), and the copy bandwidth.
    pub fn progress_steps(&self, speculative_modes: usize) -> usize {
        let per_mode = 1 + self.prompts.len() * self.runs;
        let split = self.split_prompts.unwrap_or(self.prompts.len()).min(self.prompts.len());
        (1 + speculative_modes) * per_mode + speculative_modes * split + 1
    }
}

/// A speculative mode of the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecMode {
    pub name: &'static str,
    pub use_head: bool,
    /// Prompt lookup drafts beside the drafter's (`SpeculativeOptions::lookup`).
    pub lookup: bool,
}

/// The speculative modes measured for a drafter; with `lookup`, its full mode (Domino with its head,
/// or DFlash) once more with prompt lookup drafts.
pub fn speculative_modes(drafter: &DrafterModel, lookup: bool) -> Vec<SpecMode> {
    let mode = |name, use_head, lookup| SpecMode { name, use_head, lookup };
    let mut modes = if drafter.head.is_some() {
        vec![mode("backbone (--no-head)", false, false), mode("domino", true, false)]
    } else {
        vec![mode("dflash", false, false)]
    };
    if lookup {
        modes.push(if drafter.head.is_some() { mode("domino + lookup", true, true) } else { mode("dflash + lookup", false, true) });
    }
    modes
}

/// A progress event: a mode starts, or one run (or the copy-bandwidth measurement) finished.
#[derive(Debug, Clone, Copy)]
pub enum BenchProgress<'a> {
    Mode(&'a str),
    Done(&'a str),
}

/// One adapter's results: `plain` first, then the speculative modes.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// (bytes read + bytes written) / s of the WGSL copy kernel, bytes/s.
    pub copy_bandwidth: f64,
    /// Bytes of target weights one decode step reads.
    pub decode_weight_bytes_per_token: u64,
    pub modes: Vec<ModeReport>,
}

/// Target weights (every matrix, the embedding once) + its KV cache: 2 · layers · capacity · kv_width · 4.
pub fn target_memory(model: &Qwen3Model, capacity: usize) -> u64 {
    let c = &model.config;
    let embed = if c.tie_word_embeddings { 0 } else { model.embed.bytes() };
    model.decode_weight_bytes() + embed + 2 * (c.num_layers * capacity * c.kv_width() * 4) as u64
}

/// Drafter weights: fc, its layers' matrices and the Domino head.
pub fn drafter_memory(d: &DrafterModel) -> u64 {
    let head = d.head.as_ref().map(|h| h.w_ih.bytes() + h.w_hh.bytes() + h.w1_y.bytes() + h.w1_s.bytes() + h.w2.bytes()).unwrap_or(0);
    let layers: u64 = d.layers.iter().map(domino_models::qwen3::LayerWeights::matrix_bytes).sum();
    d.fc.bytes() + layers + head
}

pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn min_max(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    (v.iter().cloned().fold(f64::INFINITY, f64::min), v.iter().cloned().fold(f64::NEG_INFINITY, f64::max))
}

/// Raw measurements of one mode.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub prefill: Vec<f64>,
    pub decode: Vec<f64>,
    pub ttft: Vec<f64>,
    /// Tokens committed per round, over the throughput runs.
    pub acceptance: Vec<usize>,
    /// Drafts verified per round, over the throughput runs.
    pub draft_lengths: Vec<usize>,
    /// Totals over the split runs.
    pub draft: f64,
    pub verify: f64,
    pub head: f64,
    pub memory: u64,
}

/// The geometric mean of `runs[i] / plain[i]` (None unless both hold the same positive number of runs).
pub fn paired_speedup(runs: &[f64], plain: &[f64]) -> Option<f64> {
    let usable = !runs.is_empty() && runs.len() == plain.len() && runs.iter().chain(plain).all(|v| *v > 0.0 && v.is_finite());
    usable.then(|| (runs.iter().zip(plain).map(|(r, p)| (r / p).ln()).sum::<f64>() / runs.len() as f64).exp())
}

/// The report figures of one mode; `plain` is None for plain decoding itself.
pub fn mode_report(name: &str, m: &Measured, plain: Option<&Measured>, weight_bytes: u64, copy: f64) -> ModeReport {
    let plain_tps = plain.map(|p| median(&p.decode));
    let tps = median(&m.decode);
    let (lo, hi) = min_max(&m.decode);
    let weight_bw = weight_bytes as f64 * tps;
    let mean = |v: &[usize], empty: f64| if v.is_empty() { empty } else { v.iter().sum::<usize>() as f64 / v.len() as f64 };
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
        speedup_over_plain_paired: match plain {
            Some(p) => paired_speedup(&m.decode, &p.decode),
            None => Some(1.0),
        },
        mean_acceptance: mean(&m.acceptance, 1.0),
        mean_draft_length: mean(&m.draft_lengths, 0.0),
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

/// `(session, use_head)` -> the round costs `DraftLen::Auto` should use (None: the session's own).
pub type RoundCostsFn<'a, E> = dyn FnMut(&mut SpeculativeSession<'_>, bool) -> Result<Option<RoundCosts>, E> + 'a;

/// Measure plain decoding and (with `drafter`) every speculative mode of it on `model`'s adapter.
/// `round_costs(session, use_head)` gives the measured round costs for `DraftLen::Auto` (the CLI
/// calibrates and caches them on disk; None: measured here, once with and once without the head).
/// `progress` hears which mode runs next and each run end.
///
/// The modes take turns prompt by prompt (each run of a prompt: plain, then every speculative mode),
/// so a speedup compares runs made seconds apart, not a whole mode's runs against another's made a
/// quarter of an hour earlier: on a shared machine the load drifts more than that.
pub async fn measure<E: From<RuntimeError>>(
    gpu: &Gpu,
    model: &Qwen3Model,
    drafter: Option<&DrafterModel>,
    plan: &BenchPlan,
    round_costs: &mut RoundCostsFn<'_, E>,
    progress: &mut dyn FnMut(BenchProgress),
) -> Result<BenchResult, E> {
    let prompts = &plan.prompts;
    if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
        return Err(RuntimeError::EmptyPrompt.into());
    }
    let opts = GenerateOptions { max_tokens: plan.max_tokens, ignore_eos: true, ..Default::default() };
    let modes = drafter.map(|d| speculative_modes(d, plan.lookup)).unwrap_or_default();

    // Warm-up (pipelines, caches): one run per mode, after its round costs are known.
    progress(BenchProgress::Mode("plain"));
    let mut session = Session::new(model, plan.capacity)?;
    let mut plain = Measured { memory: target_memory(model, plan.capacity), ..Default::default() };
    session.generate(&prompts[0], &opts, &mut |_| true).await?;
    progress(BenchProgress::Done("plain"));
    let mut spec = match drafter {
        Some(d) => Some(SpeculativeSession::new(model, d, plan.spec_capacity)?),
        None => None,
    };
    let mut options = Vec::with_capacity(modes.len());
    let mut measured_spec = Vec::with_capacity(modes.len());
    if let (Some(spec), Some(d)) = (spec.as_mut(), drafter) {
        let memory = target_memory(model, plan.spec_capacity) + drafter_memory(d);
        let mut own_costs: [Option<RoundCosts>; 2] = [None, None];
        for &SpecMode { name, use_head, lookup } in &modes {
            progress(BenchProgress::Mode(name));
            // Costs passed explicitly: left to the session, it would calibrate again at every switch
            // between the head and the backbone (it keeps one table).
            let costs = match plan.draft_len {
                DraftLen::Auto => match (round_costs(spec, use_head)?, &own_costs[use_head as usize]) {
                    (Some(c), _) => Some(c),
                    (None, Some(c)) => Some(c.clone()),
                    (None, None) => {
                        let c = spec.calibrate(CALIBRATION_REPS, use_head).await?;
                        own_costs[use_head as usize] = Some(c.clone());
                        Some(c)
                    }
                },
                DraftLen::Fixed(_) => None,
            };
            let so = SpeculativeOptions { use_head, timing: false, draft_len: plan.draft_len, costs, refine_costs: true, lookup };
            spec.generate(&prompts[0], &opts, &so, &mut |_| true).await?;
            progress(BenchProgress::Done(name));
            options.push(so);
            measured_spec.push(Measured { memory, ..Default::default() });
        }
    }

    // Runs 1..=R of a prompt measure throughput without timing syncs; one more run per speculative
    // mode (the first split_prompts prompts) measures the draft / verify / head split (its syncs
    // would slow the throughput runs).
    let split_prompts = plan.split_prompts.unwrap_or(prompts.len());
    for (i, p) in prompts.iter().enumerate() {
        for _ in 0..plan.runs {
            progress(BenchProgress::Mode("plain"));
            let g = session.generate(p, &opts, &mut |_| true).await?;
            plain.prefill.push(g.stats.prefill_tokens_per_s);
            plain.decode.push(g.stats.decode_tokens_per_s);
            plain.ttft.push(g.stats.time_to_first_token_s);
            progress(BenchProgress::Done("plain"));
            if let Some(spec) = spec.as_mut() {
                for ((mode, so), m) in modes.iter().zip(&options).zip(&mut measured_spec) {
                    progress(BenchProgress::Mode(mode.name));
                    let (g, st) = spec.generate(p, &opts, so, &mut |_| true).await?;
                    // Greedy rounds are deterministic: only these runs count them (not the timing run).
                    m.acceptance.extend(&st.acceptance_lengths);
                    m.draft_lengths.extend(&st.draft_lengths);
                    m.prefill.push(g.stats.prefill_tokens_per_s);
                    m.decode.push(g.stats.decode_tokens_per_s);
                    m.ttft.push(g.stats.time_to_first_token_s);
                    progress(BenchProgress::Done(mode.name));
                }
            }
        }
        if let (Some(spec), true) = (spec.as_mut(), i < split_prompts) {
            for ((mode, so), m) in modes.iter().zip(&options).zip(&mut measured_spec) {
                progress(BenchProgress::Mode(mode.name));
                let timed = SpeculativeOptions { timing: true, ..so.clone() };
                let (_, st) = spec.generate(p, &opts, &timed, &mut |_| true).await?;
                m.draft += st.draft_seconds;
                m.verify += st.verify_seconds;
                m.head += st.head_seconds;
                progress(BenchProgress::Done(mode.name));
            }
        }
    }
    drop((session, spec));
    let mut measured = vec![("plain".to_string(), plain)];
    measured.extend(modes.iter().map(|m| m.name.to_string()).zip(measured_spec));

    progress(BenchProgress::Mode("copy bandwidth"));
    let copy = domino_engine::bandwidth::copy_bandwidth(gpu, plan.copy_bytes.min(gpu.caps.max_storage_binding), 5, &now).await.map_err(RuntimeError::from)?;
    progress(BenchProgress::Done("copy bandwidth"));
    let weight_bytes = model.decode_weight_bytes();
    let plain = &measured[0].1;
    let modes = measured
        .iter()
        .enumerate()
        .map(|(i, (name, m))| mode_report(name, m, if i == 0 { None } else { Some(plain) }, weight_bytes, copy))
        .collect();
    Ok(BenchResult { copy_bandwidth: copy, decode_weight_bytes_per_token: weight_bytes, modes })
}

#[cfg(test)]
mod tests {
    use super::paired_speedup;

    #[test]
    fn the_paired_speedup_is_the_geometric_mean_of_run_ratios() {
        // Prompts at 10 and 40 tok/s plain: 2x on one and 0.5x on the other average to 1x (the
        // ratio of medians, 20 / 40 with `median`'s upper middle, says 0.5x).
        let got = paired_speedup(&[20.0, 20.0], &[10.0, 40.0]).unwrap();
        assert!((got - 1.0).abs() < 1e-12, "{got}");
        let got = paired_speedup(&[30.0, 60.0, 12.0], &[10.0, 20.0, 4.0]).unwrap();
        assert!((got - 3.0).abs() < 1e-12, "{got}");
        assert_eq!(paired_speedup(&[], &[]), None);
        assert_eq!(paired_speedup(&[1.0], &[1.0, 2.0]), None, "runs must pair up");
        assert_eq!(paired_speedup(&[1.0, 0.0], &[1.0, 2.0]), None, "a run without tokens/s");
    }
}
