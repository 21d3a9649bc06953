//! Prompt-lookup drafts (`--lookup`): the tokens that followed the latest earlier occurrence of the
//! sequence's last n tokens (n = 3, else 2, else 1), verified by the target like a drafter's drafts
//! but with no draft pass at all.
//!
//! Small models repeat their prompt and themselves (identifiers, docstring examples, list items), so
//! copying is often right where a drafter is not, and a round that only verifies costs less than
//! one that drafts first. The copy is a deterministic function of the committed tokens, so greedy
//! output stays the plain output and sampled acceptance (a point-mass proposal, as for the drafter's
//! argmax drafts) stays exact.
//!
//! Where the text has no earlier occurrence to copy, the drafter's static n-gram table
//! (`domino_models::ngram_table`, what followed the same 2-4 tokens in other generations of the
//! same model) may propose instead.
//!
//! `LookupScheduler` decides how many copied tokens a round verifies: one `AcceptanceModel` per
//! class of proposal (a 3-gram match in the text is a far better bet than a 1-gram one; a table
//! proposal's class is its context length and confidence), and the k that maximises
//! expected tokens per second on the verify-only costs (`RoundCosts::verify_seconds`). The session
//! compares that with the drafter's best round and runs the better one. With a fixed draft length
//! N (`--draft-len N`) a copy is verified up to N tokens (all of them where it is shorter) and is
//! compared with the drafter's round of N drafts; N = 0 copies nothing. Greedy generations start
//! from the copies' acceptance in earlier ones (`LookupScheduler::with_history`): how often copies
//! match is a property of the model and the kind of text, which a 64-token answer is too short to
//! learn again from the optimistic prior.

use crate::draft_len::{AcceptanceCounts, AcceptanceModel, DraftLen, RoundCosts};
use domino_models::ngram_table::{NgramTable, StaticProposal, CONFIDENCE_CLASSES, MAX_CONTEXT, MIN_CONTEXT};
use std::collections::HashMap;

/// The longest suffix matched.
pub const MAX_NGRAM: usize = 3;

/// Acceptance classes: a match of n = 1..=MAX_NGRAM tokens in the text (`text_class`), then the
/// static table's proposals by context length and confidence (`table_class`).
pub const CLASSES: usize = MAX_NGRAM + (MAX_CONTEXT - MIN_CONTEXT + 1) * CONFIDENCE_CLASSES;

pub fn text_class(ngram: usize) -> usize {
    ngram - 1
}

pub fn table_class(context: usize, confidence: usize) -> usize {
    MAX_NGRAM + (context - MIN_CONTEXT) * CONFIDENCE_CLASSES + confidence
}

/// A match: the suffix length n it was found with and the tokens it proposes (at least one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    pub ngram: usize,
    pub tokens: Vec<u32>,
}

/// Tokens a round may verify with no draft pass, and the class whose acceptance judges them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub class: usize,
    pub tokens: Vec<u32>,
}

impl From<Proposal> for Candidate {
    fn from(p: Proposal) -> Self {
        Self { class: text_class(p.ngram), tokens: p.tokens }
    }
}

impl From<StaticProposal> for Candidate {
    fn from(p: StaticProposal) -> Self {
        Self { class: table_class(p.context, p.confidence), tokens: p.tokens }
    }
}

/// The committed tokens and, for every n-gram (n = 1..=MAX_NGRAM) that has a continuation, where
/// its latest occurrence is followed. Appending a token is O(MAX_NGRAM), a proposal O(MAX_NGRAM + k).
#[derive(Debug, Clone, Default)]
pub struct NgramIndex {
    tokens: Vec<u32>,
    /// (n, the n-gram padded with u32::MAX) -> index of the token after its latest occurrence.
    next: HashMap<(usize, [u32; MAX_NGRAM]), usize>,
}

fn key(gram: &[u32]) -> (usize, [u32; MAX_NGRAM]) {
    let mut k = [u32::MAX; MAX_NGRAM];
    k[..gram.len()].copy_from_slice(gram);
    (gram.len(), k)
}

impl NgramIndex {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// What the next round may copy: this text's match and the table's proposal after it.
    pub fn candidates(&self, table: Option<&NgramTable>, max_len: usize) -> Vec<Candidate> {
        let text = self.propose(max_len).map(Candidate::from);
        let table = table.and_then(|t| t.propose(&self.tokens, max_len)).map(Candidate::from);
        text.into_iter().chain(table).collect()
    }

    pub fn push(&mut self, token: u32) {
        let i = self.tokens.len();
        for n in 1..=MAX_NGRAM.min(i) {
            self.next.insert(key(&self.tokens[i - n..i]), i);
        }
        self.tokens.push(token);
    }

    pub fn extend(&mut self, tokens: &[u32]) {
        tokens.iter().for_each(|&t| self.push(t));
    }

    /// The longest match (suffix length n) a proposal can find once one more token is pushed,
    /// whatever that token is: an n-gram ending in it occurred before only where the n - 1 tokens
    /// ending the sequence now did, so one more than the longest suffix seen before (capped at
    /// MAX_NGRAM; 1 when even the last token is new, as the next one may not be).
    pub fn next_match_reach(&self) -> usize {
        (self.propose(1).map_or(0, |p| p.ngram) + 1).min(MAX_NGRAM)
    }

    /// Up to `max_len` tokens that followed the latest earlier occurrence of the longest suffix
    /// (n <= MAX_NGRAM) that occurred before; None when even the last token is new.
    pub fn propose(&self, max_len: usize) -> Option<Proposal> {
        let len = self.tokens.len();
        if max_len == 0 {
            return None;
        }
        (1..=MAX_NGRAM.min(len)).rev().find_map(|n| {
            let start = *self.next.get(&key(&self.tokens[len - n..]))?;
            // The continuation may run into the suffix itself (a repeating run copies itself).
            Some(Proposal { ngram: n, tokens: self.tokens[start..len.min(start + max_len)].to_vec() })
        })
    }
}

/// Optimistic prior per position (a copy is tried early and learned), worth one round, and the
/// drafter scheduler's forgetting (about the last ten rounds count).
const PRIOR_RATE: f64 = 0.8;
const PRIOR_WEIGHT: f64 = 1.0;
const FORGETTING: f64 = 0.9;

/// How many copied tokens a round verifies, from per-class acceptance.
#[derive(Debug, Clone)]
pub struct LookupScheduler {
    /// One per class (`CLASSES`).
    models: Vec<AcceptanceModel>,
    /// `--draft-len N`: a copy's k is fixed at N (or its length, where shorter) instead of chosen.
    fixed: Option<usize>,
}

impl LookupScheduler {
    /// `max_k`: the most drafts a round may verify (the drafter's block).
    pub fn new(max_k: usize) -> Self {
        Self { models: (0..CLASSES).map(|_| AcceptanceModel::new(max_k, PRIOR_RATE, PRIOR_WEIGHT, FORGETTING)).collect(), fixed: None }
    }

    /// Follow the session's draft length: `Fixed(n)` verifies copies up to n tokens, never choosing
    /// fewer (n = 0: no copies); `Auto` chooses k per copy.
    pub fn with_draft_len(mut self, mode: DraftLen) -> Self {
        self.fixed = match mode {
            DraftLen::Fixed(n) => Some(n),
            DraftLen::Auto => None,
        };
        self
    }

    /// The k a round may verify of a candidate of `len` tokens: 1..=len, or exactly min(n, len)
    /// with a fixed draft length n.
    fn allowed_ks(&self, len: usize) -> std::ops::RangeInclusive<usize> {
        match self.fixed {
            // Empty where min(n, len) = 0: nothing may be verified.
            Some(n) => n.min(len).max(1)..=n.min(len),
            None => 1..=len,
        }
    }

    /// Start each class from its counts in earlier generations (`history[class]`, worth at most
    /// `HISTORY_WEIGHT` rounds, as the drafter's); a class without usable counts keeps the prior.
    pub fn with_history(max_k: usize, history: &[AcceptanceCounts]) -> Self {
        let mut s = Self::new(max_k);
        for (model, counts) in s.models.iter_mut().zip(history) {
            model.start_from(counts);
        }
        s
    }

    /// Empty counts for every class: a session's history before its first copy.
    pub fn empty_history(max_k: usize) -> Vec<AcceptanceCounts> {
        (0..CLASSES).map(|_| AcceptanceCounts::new(max_k)).collect()
    }

    /// The number of the candidate's tokens to verify (0: not worth a round) and its expected tokens
    /// per second on `costs`' verify-only times. With a fixed draft length the k is not chosen, only
    /// whether the copy beats a plain step.
    pub fn choose(&self, p: &Candidate, costs: &RoundCosts) -> (usize, f64) {
        let values = self.values(p.class, costs);
        let mut best = (0, values[0]);
        for k in self.allowed_ks(p.tokens.len().min(values.len() - 1)) {
            if values[k] > best.1 {
                best = (k, values[k]);
            }
        }
        best
    }

    /// The candidate a round verifies, cut to the k chosen for it: the one worth most tokens per
    /// second, where that beats `drafter_best` (the drafter's best round, plain steps included).
    /// Every class not used passes (`pass`).
    pub fn pick(&mut self, candidates: Vec<Candidate>, costs: &RoundCosts, drafter_best: f64) -> Option<Candidate> {
        let chosen = candidates.iter().enumerate().map(|(i, c)| (i, self.choose(c, costs))).filter(|&(_, (k, v))| k > 0 && v > drafter_best).max_by(|a, b| a.1 .1.total_cmp(&b.1 .1));
        let mut picked = None;
        for (i, mut c) in candidates.into_iter().enumerate() {
            match chosen {
                Some((j, (k, _))) if i == j => {
                    c.tokens.truncate(k);
                    picked = Some(c);
                }
                _ => self.pass(c.class),
            }
        }
        picked
    }

    /// Expected tokens per second of a round verifying k tokens of a candidate of this class, for
    /// every k (k = 0: a plain step).
    fn values(&self, class: usize, costs: &RoundCosts) -> Vec<f64> {
        let tokens = self.models[class].expected_tokens_by_k(usize::MAX);
        tokens.iter().enumerate().map(|(k, t)| t / costs.verify_cost(k).max(1e-12)).collect()
    }

    /// Whether every text match of length n <= `reach` and, `with_table`, every table proposal,
    /// however many tokens it proposes, would be declined against a drafter whose best round is
    /// worth `drafter_best` tokens per second on `costs`: then the round after a plain step is a
    /// plain step too, whatever token that step commits (`NgramIndex::next_match_reach` bounds its
    /// text match length; a table proposal could be of any class), and can be queued before it is
    /// read back. Each class's best round over every k bounds what `choose` can find in a shorter
    /// candidate. The margin keeps a near-tie from deciding: the next round compares on costs
    /// rescaled by the plain step's time, which may move the last bit.
    pub fn declines_every_match(&self, reach: usize, with_table: bool, costs: &RoundCosts, drafter_best: f64) -> bool {
        let text = (1..=reach.min(MAX_NGRAM)).map(text_class);
        let table = (MAX_NGRAM..CLASSES).filter(|_| with_table);
        text.chain(table).all(|c| {
            let values = self.values(c, costs);
            // A copy's length can be anything up to the block, so every k it may verify (with a
            // fixed draft length n, a shorter copy is verified whole: every k up to n).
            let deepest = self.fixed.unwrap_or(usize::MAX).min(values.len() - 1);
            values[1..=deepest].iter().all(|&v| v <= drafter_best * (1.0 - 1e-9))
        })
    }

    /// A lookup round on a candidate of this class verified k tokens and accepted `accepted`.
    pub fn observe(&mut self, class: usize, k: usize, accepted: usize) {
        self.models[class].observe(k, accepted);
    }

    /// A candidate of this class was not used this round: its evidence ages a little, so a class
    /// judged useless is tried again after a while (the prior comes back) rather than never.
    pub fn pass(&mut self, class: usize) {
        self.models[class].observe(0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(tokens: &[u32]) -> NgramIndex {
        let mut i = NgramIndex::new();
        i.extend(tokens);
        i
    }

    #[test]
    fn the_longest_suffix_seen_before_proposes_what_followed_its_latest_occurrence() {
        // "1 2 3" occurred twice: the later occurrence (followed by 7 8) wins.
        let i = index(&[1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3]);
        assert_eq!(i.propose(4), Some(Proposal { ngram: 3, tokens: vec![7, 8, 9, 1] }));
        // Capped at max_len, and at the end of the sequence.
        assert_eq!(i.propose(1).unwrap().tokens, vec![7]);
        let i = index(&[5, 6, 5]);
        assert_eq!(i.propose(7), Some(Proposal { ngram: 1, tokens: vec![6, 5] }));
        // No earlier occurrence of the last token: nothing to copy.
        assert_eq!(index(&[1, 2, 3]).propose(7), None);
        assert_eq!(index(&[]).propose(7), None);
        assert_eq!(index(&[1, 1]).propose(0), None);
        // A 2-gram match when the 3-gram is new.
        let i = index(&[9, 2, 3, 4, 8, 2, 3]);
        assert_eq!(i.propose(2), Some(Proposal { ngram: 2, tokens: vec![4, 8] }));
        // A repeating run copies itself.
        let i = index(&[7, 7, 7, 7]);
        assert_eq!(i.propose(5), Some(Proposal { ngram: 3, tokens: vec![7] }));
    }

    #[test]
    fn the_index_matches_a_brute_force_search() {
        let mut rng = 12345u64;
        let mut tokens = Vec::new();
        let mut i = NgramIndex::new();
        for _ in 0..400 {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let t = ((rng >> 33) % 6) as u32;
            tokens.push(t);
            i.push(t);
            let want = (1..=MAX_NGRAM.min(tokens.len())).rev().find_map(|n| {
                let suf = &tokens[tokens.len() - n..];
                (0..tokens.len() - n).rev().find(|&s| &tokens[s..s + n] == suf).map(|s| Proposal { ngram: n, tokens: tokens[s + n..(s + n + 4).min(tokens.len())].to_vec() })
            });
            assert_eq!(i.propose(4), want, "after {tokens:?}");
        }
    }

    #[test]
    fn no_next_token_finds_a_longer_match_than_the_reach() {
        let mut rng = 777u64;
        let mut i = NgramIndex::new();
        let mut reached = [false; MAX_NGRAM + 1];
        for _ in 0..300 {
            let reach = i.next_match_reach();
            for t in 0..5u32 {
                let mut after = i.clone();
                after.push(t);
                let n = after.propose(1).map_or(0, |p| p.ngram);
                assert!(n <= reach, "{:?} + {t}: match {n} beyond reach {reach}", i.tokens);
                reached[n] |= n == reach;
            }
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            i.push(((rng >> 33) % 5) as u32);
        }
        // The bound is tight: every reach is attained by some next token somewhere.
        assert!(reached[1..].iter().all(|&r| r), "{reached:?}");
    }

    fn text(ngram: usize, tokens: Vec<u32>) -> Candidate {
        Proposal { ngram, tokens }.into()
    }

    /// A CPU-adapter-like table: verifying k given tokens costs 1 + 0.3 k plain steps.
    fn costs() -> RoundCosts {
        let seconds: Vec<f64> = (0..=7).map(|k| if k == 0 { 1.0 } else { 1.5 + 0.3 * k as f64 }).collect();
        let verify_seconds = (0..=7).map(|k| 1.0 + 0.3 * k as f64).collect();
        RoundCosts { seconds, verify_seconds }
    }

    #[test]
    fn copies_are_verified_as_far_as_they_pay() {
        let p = text(3, vec![1, 2, 3, 4, 5, 6, 7]);
        let mut s = LookupScheduler::new(7);
        // Always right: the whole proposal.
        for _ in 0..30 {
            s.observe(text_class(3), 7, 7);
        }
        assert_eq!(s.choose(&p, &costs()).0, 7);
        // Never right: no lookup round (plain step value).
        let mut s = LookupScheduler::new(7);
        for _ in 0..30 {
            s.observe(text_class(3), 1, 0);
        }
        let (k, v) = s.choose(&p, &costs());
        assert_eq!((k, v), (0, 1.0));
        // A short proposal caps k; other match lengths keep their own evidence (the prior).
        assert_eq!(s.choose(&text(2, vec![4]), &costs()).0, 1);
        // Evidence ages while a match length is passed over, until it is tried again.
        let passes = (0..500).position(|_| {
            s.pass(text_class(3));
            s.choose(&p, &costs()).0 > 0
        });
        assert!(passes.is_some_and(|n| n > 20), "{passes:?}");
    }

    #[test]
    fn a_plain_step_is_known_to_follow_only_where_every_match_length_would_be_declined() {
        let c = costs();
        // A drafter worth no more than plain steps (one token per plain step's second).
        let plain = 1.0;
        // The optimistic prior copies: a plain step may not be queued.
        assert!(!LookupScheduler::new(7).declines_every_match(MAX_NGRAM, false, &c, plain));
        let mut s = LookupScheduler::new(7);
        for n in 1..=MAX_NGRAM {
            for _ in 0..30 {
                s.observe(text_class(n), 1, 0);
            }
        }
        assert!(s.declines_every_match(MAX_NGRAM, false, &c, plain));
        // ... and it agrees with `choose` on every proposal, whatever its length.
        for n in 1..=MAX_NGRAM {
            for len in 1..=7 {
                let (k, v) = s.choose(&text(n, vec![5; len]), &c);
                assert!(k == 0 || v <= plain, "n {n} len {len}: {k} {v}");
            }
        }
        // One length that still pays is enough to copy.
        for _ in 0..30 {
            s.observe(text_class(2), 7, 7);
        }
        assert!(!s.declines_every_match(MAX_NGRAM, false, &c, plain));
        assert!(s.choose(&text(2, vec![5; 3]), &c).0 > 0);
        // ... unless no match of that length can be found next round,
        assert!(s.declines_every_match(1, false, &c, plain));
        // ... or the drafter's own rounds are worth more than that copy.
        assert!(s.declines_every_match(MAX_NGRAM, false, &c, 100.0));
        // A tie is not a decline: rescaled costs could tip it either way.
        let tie = s.choose(&text(2, vec![5; 7]), &c).1;
        assert!(!s.declines_every_match(MAX_NGRAM, false, &c, tie));
        assert!(s.declines_every_match(MAX_NGRAM, false, &c, tie * 1.001));
        // Table proposals can be of any class after any token: one table class that pays is
        // enough to copy, whatever the text's reach.
        let mut s = LookupScheduler::new(7);
        (0..CLASSES).for_each(|c| (0..30).for_each(|_| s.observe(c, 1, 0)));
        assert!(s.declines_every_match(MAX_NGRAM, true, &c, plain));
        let sure = table_class(MAX_CONTEXT, CONFIDENCE_CLASSES - 1);
        (0..30).for_each(|_| s.observe(sure, 3, 3));
        assert!(s.declines_every_match(1, false, &c, plain));
        assert!(!s.declines_every_match(1, true, &c, plain));
        let p = Candidate::from(StaticProposal { context: MAX_CONTEXT, confidence: CONFIDENCE_CLASSES - 1, tokens: vec![5; 3] });
        assert_eq!(s.choose(&p, &c).0, 3);
    }

    #[test]
    fn a_fixed_draft_length_verifies_copies_up_to_it_and_only_where_they_beat_the_drafter() {
        let c = costs();
        let p = text(3, vec![1, 2, 3, 4, 5, 6, 7]);
        // Copies that hold for two tokens and then fail: auto verifies few, a fixed 5 verifies 5.
        let mut auto = LookupScheduler::new(7);
        (0..30).for_each(|_| auto.observe(text_class(3), 7, 2));
        let mut fixed = auto.clone().with_draft_len(DraftLen::Fixed(5));
        assert!(auto.choose(&p, &c).0 <= 3);
        assert_eq!(fixed.choose(&p, &c).0, 5);
        // A copy shorter than n is verified whole.
        assert_eq!(fixed.choose(&text(3, vec![1, 2]), &c).0, 2);
        // Picked only against a drafter round worth less; cut to n.
        let (_, v) = fixed.choose(&p, &c);
        assert_eq!(fixed.pick(vec![p.clone()], &c, v * 0.99).unwrap().tokens, vec![1, 2, 3, 4, 5]);
        assert_eq!(fixed.pick(vec![p.clone()], &c, v * 1.01), None);
        // A plain step is known to follow only where no copy of length 1..=5 beats the drafter.
        let deepest = (1..=5).map(|k| fixed.choose(&text(3, vec![9; k]), &c).1).fold(0.0, f64::max);
        assert!(!fixed.declines_every_match(MAX_NGRAM, false, &c, deepest * 0.99));
        assert!(fixed.declines_every_match(MAX_NGRAM, false, &c, deepest * 1.01));
        // n = 0: plain decoding, nothing copied or in the way of queueing.
        let mut none = LookupScheduler::new(7).with_draft_len(DraftLen::Fixed(0));
        assert_eq!(none.choose(&p, &c).0, 0);
        assert_eq!(none.pick(vec![p.clone()], &c, 0.0), None);
        assert!(none.declines_every_match(MAX_NGRAM, true, &c, 0.0));
    }

    #[test]
    fn a_round_picks_the_candidate_worth_most_and_the_others_pass() {
        let c = costs();
        let table = Candidate::from(StaticProposal { context: 4, confidence: 2, tokens: vec![1, 2, 3, 4] });
        let mut s = LookupScheduler::new(7);
        // Text 1-gram matches always failed, sure table proposals always held.
        (0..30).for_each(|_| s.observe(text_class(1), 1, 0));
        (0..30).for_each(|_| s.observe(table.class, 4, 4));
        let before = s.clone();
        let picked = s.pick(vec![text(1, vec![9, 9]), table.clone()], &c, 1.0).unwrap();
        assert_eq!(picked, table);
        // The 1-gram class passed (aged toward the prior), the picked one did not.
        assert!(s.models[text_class(1)].rate(0) > before.models[text_class(1)].rate(0));
        assert_eq!(s.models[table.class].rate(0), before.models[table.class].rate(0));
        // Cut to the k chosen for it: a proposal longer than it pays to verify.
        let mut s = LookupScheduler::new(7);
        (0..30).for_each(|_| s.observe(table.class, 4, 1));
        let (k, _) = s.choose(&table, &c);
        assert!(k < 4);
        assert_eq!(s.pick(vec![table.clone()], &c, 0.0).unwrap().tokens.len(), k);
        // Nothing beats a drafter worth more; no candidates, no pick.
        assert_eq!(s.pick(vec![table.clone()], &c, 100.0), None);
        assert_eq!(s.pick(vec![], &c, 0.0), None);
    }

    #[test]
    fn earlier_generations_set_where_copies_start() {
        let p = text(2, vec![1, 2, 3]);
        // The optimistic prior copies at once.
        assert!(LookupScheduler::new(7).choose(&p, &costs()).0 > 0);
        // Copies after a 2-gram always failed before: this generation starts with plain steps.
        let mut history = LookupScheduler::empty_history(7);
        for _ in 0..20 {
            history[1].record(3, 0);
        }
        assert_eq!(LookupScheduler::with_history(7, &history).choose(&p, &costs()).0, 0);
        // The other lengths keep the prior, and a history that does not fit is ignored.
        assert!(LookupScheduler::with_history(7, &history).choose(&Candidate { class: text_class(3), ..p.clone() }, &costs()).0 > 0);
        let mut short = LookupScheduler::empty_history(3);
        (0..20).for_each(|_| short[1].record(3, 0));
        assert!(LookupScheduler::with_history(7, &short).choose(&p, &costs()).0 > 0);
    }
}
