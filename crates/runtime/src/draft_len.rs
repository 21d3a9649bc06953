//! How many drafts each speculative round verifies (`--draft-len auto|N`).
//!
//! A Domino/DFlash drafter drafts its whole block in one pass, but a round may verify any prefix of
//! it: k drafts, 0 <= k <= block_size - 1, where k = 0 is a plain decode step (no draft pass). `auto`
//! picks the k that maximises expected committed tokens per second:
//! - cost: `RoundCosts`, seconds of a whole round as a function of k on this adapter, measured by a
//!   calibration (cached per model and adapter by the caller) and refined online from every round;
//! - gain: `AcceptanceModel`, per-position conditional acceptance rates estimated online with a prior
//!   and exponential forgetting, so a drafter that stops matching the text is quickly drafted less;
//!   each position's prior is the position before it, so evidence at shallow positions carries deeper;
//! - climbing: a round that accepted every draft up to the deepest position yet verified is followed
//!   by a deeper one, at most twice as deep, when perfect acceptance there would pay (optimism
//!   under uncertainty, in steps that a weak drafter's lucky hit does not make expensive);
//! - probing: after a run of plain steps the scheduler drafts one token again, so it can return to
//!   drafting when acceptance recovers. Probes are rationed so that what they cost over plain steps
//!   stays within `PROBE_BUDGET` of the time (a useless drafter costs at most that), and back off
//!   while they keep failing;
//! - a prior across sessions: `AcceptanceCounts` gathered over earlier generations of the same
//!   drafter (a `SpeculativeSession` keeps them, the CLI caches them beside the round costs) start a
//!   session's estimates, worth `HISTORY_WEIGHT` rounds, instead of the optimistic default. Without
//!   them a session's first round is a probe.
//!
//! Whatever k is, the output is exactly the plain output (greedy) or the target distribution
//! (sampling): k only decides how much of the block the target verifies.

use serde::{Deserialize, Serialize};

/// `--draft-len`: `auto` or a fixed k.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftLen {
    #[default]
    Auto,
    Fixed(usize),
}

impl DraftLen {
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Self::Auto);
        }
        s.parse().map(Self::Fixed).map_err(|_| format!("--draft-len: expected 'auto' or a number of drafts, got '{s}'"))
    }
}

impl std::fmt::Display for DraftLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => write!(f, "auto"),
            Self::Fixed(k) => write!(f, "{k}"),
        }
    }
}

/// Seconds of one round with k drafts, k = 0..=max_k (`seconds[k]`): draft pass (none for k = 0)
/// plus the (k + 1)-row verify and acceptance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundCosts {
    pub seconds: Vec<f64>,
    /// Seconds of a round that verifies k drafts it did not draft (prompt lookup, `lookup.rs`): the
    /// (k + 1)-row verify and acceptance alone. Empty in tables from before lookup drafts existed
    /// (then `seconds` stands in, which overprices a copy by the draft pass).
    #[serde(default)]
    pub verify_seconds: Vec<f64>,
}

/// Weight of a new round time in the running estimate of its k.
const COST_SMOOTHING: f64 = 0.2;

impl RoundCosts {
    /// A table whose verify-only times are those of whole rounds (no lookup measurements).
    pub fn from_rounds(seconds: Vec<f64>) -> Self {
        Self { seconds, verify_seconds: Vec::new() }
    }

    pub fn max_k(&self) -> usize {
        self.seconds.len().saturating_sub(1)
    }

    /// Whether the table holds a finite positive time for every k = 0..=max_k, verify-only included.
    pub fn is_complete(&self, max_k: usize) -> bool {
        let ok = |v: &[f64]| v.len() == max_k + 1 && v.iter().all(|s| s.is_finite() && *s > 0.0);
        ok(&self.seconds) && ok(&self.verify_seconds)
    }

    /// Seconds of a round verifying k given drafts (k = 0: a plain step).
    pub fn verify_cost(&self, k: usize) -> f64 {
        if k == 0 {
            return self.seconds[0];
        }
        self.verify_seconds.get(k).or(self.seconds.get(k)).copied().unwrap_or(f64::MAX)
    }

    /// Fold in a measured round time for k: every k's estimate moves by the same factor, the one
    /// an exponential moving average of k's own gives (outliers above 3x the estimate, such as a
    /// page fault or another process, are clipped). The calibration's shape (what k drafts cost
    /// relative to a plain step) is kept and its level follows the session: refining only the k
    /// observed would leave the rarely drafted k at the calibration's short-context level while the
    /// plain step's grows with the context, making drafting look cheaper than it is.
    pub fn observe(&mut self, k: usize, seconds: f64) {
        if let Some(&c) = self.seconds.get(k) {
            self.scale_towards(c, seconds);
        }
    }

    /// As `observe`, for a round that verified k given drafts (a lookup round).
    pub fn observe_verify(&mut self, k: usize, seconds: f64) {
        let c = self.verify_cost(k);
        if c.is_finite() {
            self.scale_towards(c, seconds);
        }
    }

    fn scale_towards(&mut self, estimate: f64, seconds: f64) {
        if estimate > 0.0 {
            let s = seconds.min(3.0 * estimate).max(0.0);
            let factor = 1.0 + COST_SMOOTHING * (s / estimate - 1.0);
            self.seconds.iter_mut().chain(self.verify_seconds.iter_mut()).for_each(|x| *x *= factor);
        }
    }
}

/// Counts per draft position i (0-based): how often position i was verified with every earlier draft
/// accepted (`tried`), and how often it was accepted (`accepted`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AcceptanceCounts {
    pub tried: Vec<f64>,
    pub accepted: Vec<f64>,
}

impl AcceptanceCounts {
    pub fn new(max_k: usize) -> Self {
        Self { tried: vec![0.0; max_k], accepted: vec![0.0; max_k] }
    }

    /// Fold in a round that verified k drafts and accepted `accepted` of them.
    pub fn record(&mut self, k: usize, accepted: usize) {
        let observed = k.min(accepted + 1).min(self.tried.len());
        for i in 0..observed {
            self.tried[i] += 1.0;
            if i < accepted {
                self.accepted[i] += 1.0;
            }
        }
    }

    /// Rounds of evidence (position 0 is tried by every drafting round).
    pub fn rounds(&self) -> f64 {
        self.tried.first().copied().unwrap_or(0.0)
    }

    /// The same rates worth at most `weight` rounds.
    fn scaled_to(&self, weight: f64) -> Self {
        let s = if self.rounds() > weight { weight / self.rounds() } else { 1.0 };
        Self { tried: self.tried.iter().map(|t| t * s).collect(), accepted: self.accepted.iter().map(|a| a * s).collect() }
    }

    /// Whether the counts fit a block of `max_k` drafts and are sane (a cache file may be stale).
    pub fn fits(&self, max_k: usize) -> bool {
        self.tried.len() == max_k
            && self.accepted.len() == max_k
            && self.tried.iter().zip(&self.accepted).all(|(t, a)| t.is_finite() && a.is_finite() && *a >= 0.0 && a <= t)
    }
}

/// Rounds of evidence the history of earlier sessions counts for at the start of a session.
pub const HISTORY_WEIGHT: f64 = 10.0;

/// Decayed counts per draft position (`AcceptanceCounts`), over a prior: the session's estimates.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceptanceModel {
    counts: AcceptanceCounts,
    prior_rate: f64,
    prior_weight: f64,
    forgetting: f64,
}

impl AcceptanceModel {
    /// `prior_rate` counts as `prior_weight` observations at each position; each round multiplies the
    /// old counts by `forgetting` (0.9 keeps about the last ten rounds).
    pub fn new(max_k: usize, prior_rate: f64, prior_weight: f64, forgetting: f64) -> Self {
        Self { counts: AcceptanceCounts::new(max_k), prior_rate, prior_weight, forgetting }
    }

    /// Start from earlier sessions' counts, worth at most `HISTORY_WEIGHT` rounds; false (and no
    /// change) when they do not fit this block or hold no round.
    pub fn start_from(&mut self, history: &AcceptanceCounts) -> bool {
        let usable = history.fits(self.counts.tried.len()) && history.rounds() >= 1.0;
        if usable {
            self.counts = history.scaled_to(HISTORY_WEIGHT);
        }
        usable
    }

    /// P(draft i accepted | drafts before it accepted), for every position. Each position's prior is
    /// the estimate of the position before it (position 0: the prior rate), so a position with little
    /// evidence accepts like the shallower ones that have more: a drafter that accepts everything it
    /// is given is trusted deeper, and a useless one is not, while a position's own evidence (a
    /// drafter that is good early and bad late) overrides the chain.
    pub fn rates(&self) -> Vec<f64> {
        let mut prior = self.prior_rate;
        let c = &self.counts;
        (0..c.tried.len())
            .map(|i| {
                prior = (c.accepted[i] + prior * self.prior_weight) / (c.tried[i] + self.prior_weight);
                prior
            })
            .collect()
    }

    pub fn rate(&self, i: usize) -> f64 {
        self.rates()[i]
    }

    /// Expected committed tokens of a round with k drafts: 1 + sum over j <= k of P(first j accepted).
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let by_k = self.expected_tokens_by_k(usize::MAX);
        by_k[k.min(by_k.len() - 1)]
    }

    /// `expected_tokens(k)` for every k = 0..=max_k in one pass. Positions from `optimistic_from` on
    /// are assumed to accept (an upper bound on what drafting deeper than the evidence can give);
    /// `usize::MAX` gives the estimates themselves.
    pub fn expected_tokens_by_k(&self, optimistic_from: usize) -> Vec<f64> {
        let (mut total, mut all) = (1.0, 1.0);
        let mut by_k = vec![total];
        for (i, r) in self.rates().into_iter().enumerate() {
            if i < optimistic_from {
                all *= r;
            }
            total += all;
            by_k.push(total);
        }
        by_k
    }

    /// A round verified k drafts and accepted `accepted` of them. The positions it observed forget
    /// at `forgetting` per round; the others age slowly (`UNSEEN_FORGETTING`), so a position judged
    /// useless is retried now and then rather than at once or never.
    pub fn observe(&mut self, k: usize, accepted: usize) {
        let c = &mut self.counts;
        let observed = k.min(accepted + 1).min(c.tried.len());
        for i in 0..c.tried.len() {
            let f = if i < observed { self.forgetting } else { UNSEEN_FORGETTING };
            c.tried[i] *= f;
            c.accepted[i] *= f;
        }
        c.record(k, accepted);
    }

    /// Forget the evidence, history included (a probe starts again from the prior).
    pub fn reset(&mut self) {
        self.counts = AcceptanceCounts::new(self.counts.tried.len());
    }
}

/// Per-round forgetting of positions a round did not observe.
const UNSEEN_FORGETTING: f64 = 0.98;

/// What a drafting round is charged over its calibrated cost, for the costs a calibration does not
/// see: before the first draft after plain steps, the drafter's context takes in every plain step's
/// features (up to 64 rows), and drafting evicts the target's weights from a CPU adapter's caches.
/// A drafter at break-even on the calibrated costs is therefore not drafted: where it is not
/// clearly better, plain decoding is the safe side (measured on llvmpipe: a weak drafter scheduled
/// at break-even ran at 0.65-0.97x plain on short chat replies).
const DRAFTING_SURCHARGE: f64 = 0.05;

/// Plain steps before the first probe, and the longest wait between probes.
const PROBE_FIRST: usize = 8;
const PROBE_MAX: usize = 128;

/// The share of time probes may cost over the plain steps they replace: a failed probe costs up to
/// `2 * (seconds[1] - seconds[0])` more than plain steps, so probes wait at least that over
/// `PROBE_BUDGET * seconds[0]` plain steps (on a CPU adapter where a round of one draft costs 1.3
/// plain steps, 20 steps; where drafting is almost free, `PROBE_FIRST`).
const PROBE_BUDGET: f64 = 0.03;

/// The per-round choice of k.
#[derive(Debug, Clone)]
pub struct DraftScheduler {
    mode: DraftLen,
    pub costs: RoundCosts,
    pub acceptance: AcceptanceModel,
    plain_streak: usize,
    probe_interval: usize,
    /// The last round was a probe.
    probing: bool,
    /// Positions some round has verified since the session (or the last probe) started.
    explored: usize,
    /// Set when the last round accepted every draft up to `explored`: drafting deeper may pay.
    climb: bool,
}

impl DraftScheduler {
    /// `costs.max_k()` is the block's draft count (block_size - 1).
    pub fn new(mode: DraftLen, costs: RoundCosts) -> Self {
        let max_k = costs.max_k();
        // An optimistic prior (a session starts by drafting and learns), worth one round, and
        // forgetting 0.9 (about the last ten rounds count).
        let acceptance = AcceptanceModel::new(max_k, 0.8, 1.0, 0.9);
        // A fresh session is due for a probe: where the prior does not pay, the first round still
        // drafts (at least one), so a good drafter is found at once instead of after PROBE_FIRST
        // plain steps; a useless one costs one round.
        Self { mode, costs, acceptance, plain_streak: usize::MAX, probe_interval: PROBE_FIRST, probing: false, explored: 0, climb: false }
    }

    /// As `new`, starting from earlier sessions' acceptance (`AcceptanceCounts`): the first round
    /// follows them instead of probing, so a drafter known not to pay here costs nothing up front.
    pub fn with_history(mode: DraftLen, costs: RoundCosts, history: &AcceptanceCounts) -> Self {
        let mut s = Self::new(mode, costs);
        if s.acceptance.start_from(history) {
            s.plain_streak = 0;
        }
        s
    }

    /// Plain steps between probes now: the backoff, and at least what keeps probes within budget.
    /// A failed probe can cost two rounds of one draft: after the probe's reset the optimistic prior
    /// may still pay for one more.
    fn probe_wait(&self) -> usize {
        let c = &self.costs.seconds;
        let extra = 2.0 * c.get(1).map_or(0.0, |c1| (c1 - c[0]).max(0.0));
        // (Rounded down by a hair first: the costs' online refinement scales them by one factor,
        // which must not move the wait by a rounding error; `next_k_after_plain_step` relies on it.)
        let budget = (extra / (PROBE_BUDGET * c[0].max(1e-12)) * (1.0 - 1e-9)).ceil().min(PROBE_MAX as f64) as usize;
        self.probe_interval.max(budget)
    }

    /// Expected tokens per second of a round with k drafts, for every k (see `expected_tokens_by_k`
    /// for `optimistic_from`).
    fn values(&self, optimistic_from: usize) -> Vec<f64> {
        let tokens = self.acceptance.expected_tokens_by_k(optimistic_from);
        let charge = |k: usize| if k == 0 { 1.0 } else { 1.0 + DRAFTING_SURCHARGE };
        tokens.iter().zip(&self.costs.seconds).enumerate().map(|(k, (t, c))| t / (c * charge(k)).max(1e-12)).collect()
    }

    /// The k that maximises expected tokens per second under the current estimates.
    pub fn best_k(&self) -> usize {
        argmax(&self.values(usize::MAX), 0)
    }

    /// The expected tokens per second of the drafter's round (what another source of drafts must
    /// beat): `best_k`'s, or with a fixed draft length that of its k.
    pub fn best_value(&self) -> f64 {
        let values = self.values(usize::MAX);
        match self.mode {
            DraftLen::Fixed(k) => values[k.min(values.len() - 1)],
            DraftLen::Auto => values[argmax(&values, 0)],
        }
    }

    /// Drafts to verify in the next round.
    pub fn next_k(&mut self) -> usize {
        let max_k = self.costs.max_k();
        match self.mode {
            DraftLen::Fixed(k) => k.min(max_k),
            DraftLen::Auto => {
                let values = self.values(usize::MAX);
                let k = argmax(&values, 0);
                if std::mem::take(&mut self.climb) && self.explored < max_k {
                    // The last round accepted everything up to the deepest position yet verified;
                    // nothing is known beyond it. Draft deeper, up to twice as deep, as deep as
                    // pays if every deeper draft were accepted, when that beats the best choice on
                    // what is known (optimism under uncertainty). Doubling reaches a whole block
                    // in a few rounds for a drafter that accepts everything, while a weak one that
                    // happens to hit once does not pay for a full block of drafts on a CPU adapter,
                    // where each verify row costs a quarter of a plain step or more.
                    let optimistic = self.values(self.explored);
                    let reach = (2 * self.explored).max(self.explored + 1).min(max_k);
                    let d = argmax(&optimistic[..=reach], self.explored + 1);
                    if optimistic[d] > values[k] {
                        return d;
                    }
                }
                if k > 0 || max_k == 0 {
                    return k;
                }
                if self.plain_streak < self.probe_wait() {
                    return 0;
                }
                // Probe: forget the evidence that made drafting look useless and draft one token
                // (the opening probe of a fresh session: as the prior suggests, at least one). If
                // it is accepted, climbing takes the next rounds deeper; if it fails, the next probe
                // waits twice as long.
                let opening = self.plain_streak == usize::MAX;
                self.acceptance.reset();
                self.explored = 0;
                self.probing = true;
                if opening {
                    self.best_k().max(1)
                } else {
                    1
                }
            }
        }
    }

    /// What `next_k` will choose after a plain step that is under way now, without changing
    /// anything: observing a plain step does not depend on its token, and its time scales every
    /// cost by one factor, which no choice depends on. Lets a caller queue the next plain step
    /// before reading this one back.
    pub fn next_k_after_plain_step(&self) -> usize {
        let mut peek = self.clone();
        let c0 = peek.costs.seconds[0];
        peek.observe(0, 0, c0);
        peek.next_k()
    }

    /// The round verified k drafts, accepted `accepted` of them, and took `seconds` in all.
    pub fn observe(&mut self, k: usize, accepted: usize, seconds: f64) {
        self.costs.observe(k, seconds);
        self.climb = false;
        if k == 0 {
            self.plain_streak = self.plain_streak.saturating_add(1);
            return;
        }
        self.acceptance.observe(k, accepted);
        self.plain_streak = 0;
        self.climb = accepted == k && k >= self.explored && k < self.costs.max_k();
        self.explored = self.explored.max(k.min(accepted + 1));
        if accepted > 0 {
            // The drafter hits again: probe quickly the next time drafting stops paying.
            self.probe_interval = PROBE_FIRST;
        } else if std::mem::take(&mut self.probing) {
            // A failed probe: the next one waits twice as long.
            self.probe_interval = (self.probe_interval * 2).min(PROBE_MAX);
        }
    }

    /// The session's acceptance evidence so far (decayed), for a caller to keep as history.
    pub fn acceptance(&self) -> &AcceptanceModel {
        &self.acceptance
    }
}

/// The index of the largest of `values[from..]` (the first on ties), or `from` if that is empty.
fn argmax(values: &[f64], from: usize) -> usize {
    let mut best = from;
    for (i, &v) in values.iter().enumerate().skip(from + 1) {
        if v > values[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU-adapter-like cost table: a 1-row pass 1.0, a draft pass 0.5, each extra verify row 0.25.
    fn costs(max_k: usize) -> RoundCosts {
        RoundCosts::from_rounds((0..=max_k).map(|k| if k == 0 { 1.0 } else { 1.5 + 0.25 * k as f64 }).collect())
    }

    fn run(s: &mut DraftScheduler, rounds: usize, accept: impl Fn(usize) -> usize) -> Vec<usize> {
        (0..rounds)
            .map(|_| {
                let k = s.next_k();
                let a = accept(k).min(k);
                let t = s.costs.seconds[k];
                s.observe(k, a, t);
                k
            })
            .collect()
    }

    #[test]
    fn a_useless_drafter_is_drafted_less_until_plain_decoding() {
        let mut s = DraftScheduler::new(DraftLen::Auto, costs(7));
        let ks = run(&mut s, 300, |_| 0);
        assert!(ks[20..].iter().filter(|&&k| k == 0).count() >= 270, "{ks:?}");
        // Probes still happen, ever more rarely.
        let probes: Vec<usize> = ks.iter().enumerate().filter(|(i, &k)| *i > 20 && k > 0).map(|(i, _)| i).collect();
        assert!(!probes.is_empty() && probes.len() <= 6, "{probes:?}");
    }

    #[test]
    fn a_perfect_drafter_gets_the_full_block() {
        let mut s = DraftScheduler::new(DraftLen::Auto, costs(7));
        let ks = run(&mut s, 50, |k| k);
        assert!(ks[5..].iter().all(|&k| k == 7), "{ks:?}");
    }

    #[test]
    fn a_fixed_draft_length_is_valued_at_its_own_k() {
        // What a copy must beat (`best_value`) is the round the drafter will run: its fixed k's.
        let mut fixed = DraftScheduler::new(DraftLen::Fixed(3), costs(7));
        let mut auto = DraftScheduler::new(DraftLen::Auto, costs(7));
        for s in [&mut fixed, &mut auto] {
            (0..30).for_each(|_| s.observe(7, 0, 1.0));
        }
        let values = auto.values(usize::MAX);
        assert_eq!(fixed.best_value(), values[3]);
        assert_eq!(auto.best_value(), values[auto.best_k()]);
        assert!(auto.best_value() > fixed.best_value());
    }

    /// A CPU-adapter-like table of a 17-row block where a full round costs 8.5 plain steps.
    fn long_block_costs() -> RoundCosts {
        RoundCosts::from_rounds((0..=16).map(|k| if k == 0 { 1.0 } else { 1.3 + 0.45 * k as f64 }).collect())
    }

    #[test]
    fn a_perfect_drafter_climbs_to_a_long_block_in_a_few_rounds() {
        let mut s = DraftScheduler::new(DraftLen::Auto, long_block_costs());
        let ks = run(&mut s, 40, |k| k);
        let full = ks.iter().position(|&k| k == 16).unwrap();
        assert!(full <= 4 && ks[full..].iter().all(|&k| k == 16), "{ks:?}");
    }

    #[test]
    fn a_drafter_at_break_even_is_not_drafted() {
        // Known to accept its first draft 47% of the time where a round of one draft costs 1.47
        // plain steps (SmolLM2's drafter on llvmpipe): 1.47 expected tokens for 1.47 steps does not
        // beat plain decoding by the surcharge, so the session decodes plainly until a probe.
        let costs = RoundCosts::from_rounds((0..=7).map(|k| if k == 0 { 1.0 } else { 1.27 + 0.2 * k as f64 }).collect());
        let mut history = AcceptanceCounts::new(7);
        for i in 0..100 {
            history.record(7, usize::from(i % 100 < 47));
        }
        let mut s = DraftScheduler::with_history(DraftLen::Auto, costs.clone(), &history);
        assert_eq!(s.next_k(), 0);
        // A clearly better one (60%) is drafted.
        let mut better = AcceptanceCounts::new(7);
        for i in 0..100 {
            better.record(7, usize::from(i % 100 < 60));
        }
        let mut s = DraftScheduler::with_history(DraftLen::Auto, costs, &better);
        assert!(s.next_k() > 0);
    }

    #[test]
    fn a_weak_drafters_lucky_hit_climbs_one_doubling_at_a_time() {
        // A drafter known to accept its first draft half the time, on a CPU-like table: drafting
        // does not pay, so it decodes plainly until a probe of one draft. That probe hits (and so
        // does every first draft from then on, never a second): the climb goes at most twice as
        // deep (the optimistic prior after the probe's reset may take it to 4 drafts), never to
        // the whole block, which would cost 8.5 plain steps for two tokens.
        let mut history = AcceptanceCounts::new(16);
        for i in 0..20 {
            history.record(1, i % 2);
        }
        let mut s = DraftScheduler::with_history(DraftLen::Auto, long_block_costs(), &history);
        let ks = run(&mut s, 300, |k| k.min(1));
        assert!(ks.contains(&1) && ks.iter().all(|&k| k <= 4), "{ks:?}");
    }

    #[test]
    fn a_successful_probe_keeps_drafting() {
        // Costs on which the prior does not pay but perfect acceptance does: the session's first
        // round is a probe of one draft; once it is accepted, every round drafts the whole block.
        let costs = RoundCosts::from_rounds((0..=7).map(|k| if k == 0 { 1.0 } else { 2.6 + 0.3 * k as f64 }).collect());
        let mut s = DraftScheduler::new(DraftLen::Auto, costs.clone());
        let ks = run(&mut s, 30, |k| k);
        assert!(ks[0] == 1 && ks[1..].iter().all(|&k| k == 7), "{ks:?}");
        // A useless drafter on the same costs: the opening probe fails, then plain steps until the
        // next probe, which waits until it costs at most PROBE_BUDGET of the time since: a probe
        // (up to two rounds of one draft) costs 2 x 1.9 plain steps more than plain steps, so
        // 3.8 / 0.03 = 127 steps.
        let mut s = DraftScheduler::new(DraftLen::Auto, costs);
        let ks = run(&mut s, 140, |_| 0);
        let probes: Vec<usize> = ks.iter().enumerate().filter(|(_, &k)| k > 0).map(|(i, _)| i).collect();
        assert_eq!(probes, vec![0, 128], "{ks:?}");
    }

    /// Seconds of a run of rounds on `costs`.
    fn seconds(costs: &RoundCosts, ks: &[usize]) -> f64 {
        ks.iter().map(|&k| costs.seconds[k]).sum()
    }

    #[test]
    fn the_choice_after_a_plain_step_is_known_before_its_time() {
        // Whatever a plain step turns out to cost, the next choice is the one predicted before it
        // ran (the pipelined plain steps rely on it), through probes, climbs and fallbacks.
        for accept in [0usize, 1, 7] {
            let mut s = DraftScheduler::new(DraftLen::Auto, costs(7));
            let mut plain_rounds = 0;
            for round in 0..400 {
                let k = s.next_k();
                if k == 0 {
                    plain_rounds += 1;
                    let predicted = s.next_k_after_plain_step();
                    // A step slower or faster than the table, as measured times are.
                    s.observe(0, 0, if round % 3 == 0 { 1.7 } else { 0.6 });
                    assert_eq!(s.clone().next_k(), predicted, "accept {accept}, round {round}");
                } else {
                    // A drafter that is right on the first `accept` drafts only in early rounds.
                    let a = if round < 100 { accept.min(k) } else { 0 };
                    s.observe(k, a, s.costs.seconds[k]);
                }
            }
            assert!(plain_rounds > 200, "accept {accept}: {plain_rounds} plain rounds");
        }
        // A fixed k: whatever it is.
        assert_eq!(DraftScheduler::new(DraftLen::Fixed(0), costs(7)).next_k_after_plain_step(), 0);
        assert_eq!(DraftScheduler::new(DraftLen::Fixed(3), costs(7)).next_k_after_plain_step(), 3);
    }

    #[test]
    fn probes_for_a_useless_drafter_stay_within_budget() {
        // From a GPU-like table (a draft almost free) to a CPU-like one (a round of one draft costs
        // three plain steps): after the opening probe, a drafter that is never accepted costs at
        // most PROBE_BUDGET over plain decoding.
        for step in [0.02, 0.1, 0.4, 1.0, 2.0] {
            let costs = RoundCosts::from_rounds((0..=7).map(|k| if k == 0 { 1.0 } else { 1.0 + step + 0.1 * k as f64 }).collect());
            let mut s = DraftScheduler::new(DraftLen::Auto, costs.clone());
            let ks = run(&mut s, 2000, |_| 0);
            let overhead = seconds(&costs, &ks[1..]) / (ks.len() - 1) as f64 - 1.0;
            assert!(overhead <= PROBE_BUDGET, "draft cost {step}: {overhead:.4} over plain");
            assert!(ks.iter().filter(|&&k| k > 0).count() >= 10, "draft cost {step}: probes stop");
        }
    }

    #[test]
    fn history_starts_a_session_where_the_last_ones_ended() {
        let mut useless = AcceptanceCounts::new(7);
        let mut perfect = AcceptanceCounts::new(7);
        for _ in 0..50 {
            useless.record(1, 0);
            perfect.record(7, 7);
        }
        // A drafter known to fail here: no opening probe, plain steps until the first probe is due.
        let mut s = DraftScheduler::with_history(DraftLen::Auto, costs(7), &useless);
        let ks = run(&mut s, 60, |_| 0);
        let wait = (2.0 * 0.75 / PROBE_BUDGET).ceil() as usize;
        assert!(ks[..wait].iter().all(|&k| k == 0) && ks[wait] == 1, "{ks:?}");
        // A drafter known to be perfect: the whole block from the first round.
        let mut s = DraftScheduler::with_history(DraftLen::Auto, costs(7), &perfect);
        assert!(run(&mut s, 10, |k| k).iter().all(|&k| k == 7));
        // The history is a prior, not a verdict: the useless drafter's history yields to a drafter
        // that now accepts everything within a probe or two.
        let mut s = DraftScheduler::with_history(DraftLen::Auto, costs(7), &useless);
        let ks = run(&mut s, 90, |k| k);
        assert!(ks[wait + 5..].iter().all(|&k| k == 7), "{ks:?}");
        // Counts that do not fit the block (another drafter's cache) are ignored: a fresh start.
        let s = DraftScheduler::with_history(DraftLen::Auto, costs(3), &perfect);
        assert_eq!(s.acceptance.rates(), DraftScheduler::new(DraftLen::Auto, costs(3)).acceptance.rates());
    }

    #[test]
    fn drafting_resumes_when_acceptance_recovers() {
        let mut s = DraftScheduler::new(DraftLen::Auto, costs(7));
        run(&mut s, 100, |_| 0);
        let ks = run(&mut s, 400, |k| k);
        let first = ks.iter().position(|&k| k > 0).unwrap();
        assert!(first <= 128, "no probe within 128 rounds: {ks:?}");
        assert!(ks[first + 5..].iter().all(|&k| k == 7), "{ks:?}");
    }

    #[test]
    fn the_choice_follows_costs_and_per_position_rates() {
        // Drafts 1-3 always accepted, never the 4th: with these costs 3 drafts is best.
        let mut s = DraftScheduler::new(DraftLen::Auto, costs(7));
        let ks = run(&mut s, 60, |k| k.min(3));
        // Mostly 3, with a retry of the 4th draft now and then (its evidence ages).
        let threes = ks[30..].iter().filter(|&&k| k == 3).count();
        assert!(threes >= 24 && ks[30..].iter().all(|&k| (3..=4).contains(&k)), "{ks:?}");
        // On a GPU-like table (verify rows almost free) the same drafter is drafted at least as far as
        // it is accepted; longer drafts cost almost nothing there, so the scheduler may keep them.
        let gpu = RoundCosts::from_rounds((0..=7).map(|k| if k == 0 { 1.0 } else { 1.1 + 0.01 * k as f64 }).collect());
        let mut s = DraftScheduler::new(DraftLen::Auto, gpu);
        let ks = run(&mut s, 60, |k| k.min(3));
        assert!(ks[30..].iter().all(|&k| k >= 3), "{ks:?}");
    }

    #[test]
    fn refining_one_draft_length_moves_every_cost_alike() {
        // Plain steps at twice the calibrated time (a longer context than the calibration's): a
        // round of one draft is still 1.75 plain steps, not the 0.875 a per-k refinement would give.
        let mut c = costs(7);
        for _ in 0..60 {
            c.observe(0, 2.0);
        }
        assert!((c.seconds[0] - 2.0).abs() < 0.01, "{:?}", c.seconds);
        assert!((c.seconds[1] / c.seconds[0] - 1.75).abs() < 1e-9, "{:?}", c.seconds);
        // An outlier moves the estimates by at most the clipped 3x.
        let before = c.seconds[0];
        c.observe(0, 1000.0);
        assert!(c.seconds[0] <= before * (1.0 + COST_SMOOTHING * 2.0) + 1e-12);
    }

    #[test]
    fn fixed_lengths_are_kept_and_capped() {
        let mut s = DraftScheduler::new(DraftLen::Fixed(3), costs(7));
        assert!(run(&mut s, 10, |_| 0).iter().all(|&k| k == 3));
        let mut s = DraftScheduler::new(DraftLen::Fixed(99), costs(7));
        assert_eq!(s.next_k(), 7);
        assert_eq!(DraftLen::parse("auto"), Ok(DraftLen::Auto));
        assert_eq!(DraftLen::parse("4"), Ok(DraftLen::Fixed(4)));
        assert!(DraftLen::parse("x").is_err());
    }

    #[test]
    fn expected_tokens_multiply_conditional_rates() {
        let mut m = AcceptanceModel::new(3, 0.5, 0.0001, 1.0);
        for _ in 0..100 {
            m.observe(3, 1); // first accepted, second rejected, third never seen
        }
        assert!((m.rate(0) - 1.0).abs() < 1e-3 && m.rate(1) < 1e-3);
        assert!((m.expected_tokens(3) - 2.0).abs() < 1e-2);
        assert!((m.rate(2) - m.rate(1)).abs() < 1e-9, "an unseen position accepts like the deepest observed one");
    }
}
