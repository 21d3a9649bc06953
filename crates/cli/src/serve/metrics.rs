//! Server counters, shared by the HTTP handlers and the engine thread, in Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

#[derive(Default)]
pub struct Metrics {
    pub slots: usize,
    /// Requests accepted into the queue and not yet given a slot.
    pub waiting: AtomicUsize,
    pub active: AtomicUsize,
    pub requests_ok: AtomicU64,
    pub requests_error: AtomicU64,
    pub rejected_queue_full: AtomicU64,
    pub cancelled: AtomicU64,
    pub gpu_errors: AtomicU64,
    pub prompt_tokens: AtomicU64,
    /// Prompt tokens found in the prefix cache (not prefilled again).
    pub cached_prompt_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub steps: AtomicU64,
    pub decode_rows: AtomicU64,
    pub prefill_rows: AtomicU64,
    /// Speculative rounds run, and the tokens they committed.
    pub spec_rounds: AtomicU64,
    pub spec_committed: AtomicU64,
}

impl Metrics {
    pub fn new(slots: usize) -> Self {
        Self { slots, ..Default::default() }
    }

    pub fn record_step(&self, decode_rows: usize, prefill_rows: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.decode_rows.fetch_add(decode_rows as u64, Ordering::Relaxed);
        self.prefill_rows.fetch_add(prefill_rows as u64, Ordering::Relaxed);
    }

    pub fn record_rounds(&self, acceptance_lengths: &[usize]) {
        self.spec_rounds.fetch_add(acceptance_lengths.len() as u64, Ordering::Relaxed);
        self.spec_committed.fetch_add(acceptance_lengths.iter().sum::<usize>() as u64, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let steps = g(&self.steps);
        // Occupancy: the mean share of slots that decoded a token per step.
        let occupancy = if steps > 0 { g(&self.decode_rows) as f64 / (steps as f64 * self.slots.max(1) as f64) } else { 0.0 };
        let mut s = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(&str, String)]| {
            let _ = writeln!(s, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(s, "{name}{labels} {value}");
            }
        };
        metric("domino_requests_total", "counter", "Finished requests by outcome.", &[
            ("{status=\"ok\"}", g(&self.requests_ok).to_string()),
            ("{status=\"error\"}", g(&self.requests_error).to_string()),
            ("{status=\"rejected_queue_full\"}", g(&self.rejected_queue_full).to_string()),
            ("{status=\"cancelled\"}", g(&self.cancelled).to_string()),
        ]);
        metric("domino_prompt_tokens_total", "counter", "Prompt tokens of finished requests.", &[("", g(&self.prompt_tokens).to_string())]);
        metric("domino_prompt_tokens_cached_total", "counter", "Prompt tokens reused from the prefix cache instead of prefilled.", &[("", g(&self.cached_prompt_tokens).to_string())]);
        metric("domino_generated_tokens_total", "counter", "Tokens generated.", &[("", g(&self.generated_tokens).to_string())]);
        metric("domino_queue_length", "gauge", "Requests waiting for a sequence slot.", &[("", self.waiting.load(Ordering::Relaxed).to_string())]);
        metric("domino_active_sequences", "gauge", "Sequences holding a slot.", &[("", self.active.load(Ordering::Relaxed).to_string())]);
        metric("domino_slots", "gauge", "Sequence slots (--max-batch).", &[("", self.slots.to_string())]);
        metric("domino_steps_total", "counter", "Batched steps run.", &[("", steps.to_string())]);
        metric("domino_step_rows_total", "counter", "Rows run in steps, by kind.", &[
            ("{kind=\"decode\"}", g(&self.decode_rows).to_string()),
            ("{kind=\"prefill\"}", g(&self.prefill_rows).to_string()),
        ]);
        metric("domino_batch_occupancy", "gauge", "Mean decode rows per step over the slots.", &[("", format!("{occupancy:.4}"))]);
        // Tokens committed per target pass of one sequence: a batched decode row commits 1.
        let passes = g(&self.spec_rounds) + g(&self.decode_rows);
        let acceptance = if passes > 0 { (g(&self.spec_committed) + g(&self.decode_rows)) as f64 / passes as f64 } else { 0.0 };
        metric("domino_mean_acceptance", "gauge", "Mean tokens committed per target pass (1 without a drafter).", &[("", format!("{acceptance:.4}"))]);
        metric("domino_gpu_errors_total", "counter", "Steps that failed on the GPU.", &[("", g(&self.gpu_errors).to_string())]);
        s
    }
}
