//! The schedules of the base-anchored curriculum (spec §6): the weight λ of the base loss, the
//! learning rate (linear warmup, then cosine decay) and the per-slot loss weights.

/// λ at `step` of `total` (0-based): falls linearly from 1 to 0 over the first `decay_ratio` of the
/// steps and stays 0 after. `decay_ratio` 0 means no base loss at all.
pub fn lambda(step: usize, total: usize, decay_ratio: f64) -> f64 {
    let span = decay_ratio.clamp(0.0, 1.0) * total as f64;
    if span <= 0.0 {
        return 0.0;
    }
    (1.0 - step as f64 / span).clamp(0.0, 1.0)
}

/// Learning rate at `step` of `total`: linear warmup over `warmup` steps to `peak`, then a cosine
/// from `peak` down to `peak * min_ratio` at the last step.
pub fn learning_rate(step: usize, total: usize, warmup: usize, peak: f64, min_ratio: f64) -> f64 {
    if step < warmup {
        return peak * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1) as f64;
    let progress = ((step - warmup) as f64 / span).min(1.0);
    let floor = peak * min_ratio;
    floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// The spec's decay γ of the per-slot loss weight exp(−k/γ).
pub const SPEC_SLOT_DECAY: f64 = 7.0;

/// Loss weight of draft slot `k` (0 = the first draft): exp(−k/γ), so the first drafts, which
/// decide most of the acceptance length, count most (γ = [`SPEC_SLOT_DECAY`] in the spec).
pub fn slot_weight(k: usize, decay: f64) -> f64 {
    (-(k as f64) / decay).exp()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lambda_falls_linearly_then_stays_zero() {
        assert_eq!(lambda(0, 100, 0.5), 1.0);
        assert!((lambda(25, 100, 0.5) - 0.5).abs() < 1e-12);
        assert_eq!(lambda(50, 100, 0.5), 0.0);
        assert_eq!(lambda(99, 100, 0.5), 0.0);
        // The published recipe: decay over the whole run.
        assert!((lambda(75, 100, 1.0) - 0.25).abs() < 1e-12);
        // No decay span: pure final-logit loss from the start.
        assert_eq!(lambda(0, 100, 0.0), 0.0);
        // Monotone non-increasing.
        let l: Vec<f64> = (0..100).map(|s| lambda(s, 100, 0.7)).collect();
        assert!(l.windows(2).all(|w| w[1] <= w[0]));
    }

    #[test]
    fn learning_rate_warms_up_then_decays_by_cosine() {
        let lr = |s| learning_rate(s, 110, 10, 1e-3, 0.1);
        assert!((lr(0) - 1e-4).abs() < 1e-12);
        assert!((lr(9) - 1e-3).abs() < 1e-12);
        assert!((lr(10) - 1e-3).abs() < 1e-12);
        assert!((lr(60) - 0.55e-3).abs() < 1e-9);
        assert!((lr(110) - 1e-4).abs() < 1e-12);
        assert!((1..100).all(|s| lr(s + 10) <= lr(s + 9)));
    }

    #[test]
    fn slot_weights_are_exp_minus_k_over_gamma() {
        assert_eq!(slot_weight(0, SPEC_SLOT_DECAY), 1.0);
        assert!((slot_weight(7, SPEC_SLOT_DECAY) - (-1.0f64).exp()).abs() < 1e-12);
        assert!(slot_weight(3, SPEC_SLOT_DECAY) > slot_weight(4, SPEC_SLOT_DECAY));
        assert!((slot_weight(2, 2.0) - (-1.0f64).exp()).abs() < 1e-12);
    }
}
