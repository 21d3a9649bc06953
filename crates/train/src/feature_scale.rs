//! Per-column scaling of the target features during training, folded into `fc` at export.
//!
//! Residual streams are badly scaled inputs: in SmolLM2-135M the feature columns' RMS ranges from
//! about 1 (layer 1) to about 1400 (one massive-activation channel from layer 14 on), with most
//! columns near 5-15. Adam moves every weight of `fc` by about the learning rate, so a weight on a
//! 1400-RMS column changes the context 1000x more per step than one on a 1-RMS column: the large
//! channels swamp the context early on and learning on the rest is slow. Training on features
//! divided by their column RMS (computed once from the training sequences) gives every column the
//! same footing. The exported `fc` is the trained one with column c multiplied by that 1/RMS, so
//! the checkpoint reads raw features exactly as before: inference does not change.

use crate::data::Sequence;
use half::f16;

/// Smallest RMS a column is divided by (a column that is all but zero stays as it is).
const MIN_RMS: f64 = 1e-3;

/// The multiplier of each of the `width` feature columns: 1 / RMS over `seqs`' positions, without
/// position 0 of each sequence (the first token carries massive activations, ~16x its column's
/// RMS elsewhere, that would set the scale of a few channels on their own).
pub fn column_multipliers(seqs: &[&Sequence], width: usize) -> Vec<f32> {
    let mut sum = vec![0.0f64; width];
    let mut rows = 0usize;
    for seq in seqs {
        for row in seq.features.chunks_exact(width).skip(1) {
            for (s, x) in sum.iter_mut().zip(row) {
                let x = x.to_f64();
                *s += x * x;
            }
            rows += 1;
        }
    }
    if rows == 0 {
        return vec![1.0; width];
    }
    sum.iter().map(|&s| (1.0 / (s / rows as f64).sqrt().max(MIN_RMS)) as f32).collect()
}

/// Multiply every feature row of `seq` by `multipliers` in place (f16 keeps its relative precision
/// under scaling; the scaled values stay well inside its range).
pub fn scale_sequence(seq: &mut Sequence, multipliers: &[f32]) {
    for row in seq.features.chunks_exact_mut(multipliers.len()) {
        for (x, &m) in row.iter_mut().zip(multipliers) {
            *x = f16::from_f32(x.to_f32() * m);
        }
    }
}

/// `fc` `[h, width]` trained on scaled features → the `fc` that gives the same output on raw ones.
pub fn fold_into_fc(fc: &mut [f32], multipliers: &[f32]) {
    for row in fc.chunks_exact_mut(multipliers.len()) {
        for (w, &m) in row.iter_mut().zip(multipliers) {
            *w *= m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(rows: &[[f32; 2]]) -> Sequence {
        Sequence { tokens: vec![0; rows.len()], prompt_len: 1, features: rows.iter().flatten().map(|&x| f16::from_f32(x)).collect() }
    }

    #[test]
    fn multipliers_skip_the_first_position_and_fold_back_exactly() {
        // Column 0 has RMS 2 after the first row, column 1 RMS 100; the first row's 1000 is ignored.
        let a = seq(&[[1000.0, 1000.0], [2.0, 100.0], [-2.0, -100.0]]);
        let m = column_multipliers(&[&a], 2);
        assert_eq!(m, vec![0.5, 0.01]);
        let mut scaled = a.clone();
        scale_sequence(&mut scaled, &m);
        assert_eq!(scaled.features[2].to_f32(), 1.0);
        assert_eq!(scaled.features[3].to_f32(), 1.0);
        // fc on scaled features == folded fc on raw features.
        let mut fc = vec![3.0, 5.0, -1.0, 2.0];
        let on_scaled: Vec<f32> = fc.chunks(2).map(|w| w[0] * 1.0 + w[1] * 1.0).collect();
        fold_into_fc(&mut fc, &m);
        let on_raw: Vec<f32> = fc.chunks(2).map(|w| w[0] * 2.0 + w[1] * 100.0).collect();
        for (a, b) in on_scaled.iter().zip(&on_raw) {
            assert!((a - b).abs() < 1e-5 * a.abs(), "{a} vs {b}");
        }
    }
}
