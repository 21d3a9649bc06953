//! A small seeded generator (splitmix64): initial weights and anchor sampling are the same on every
//! backend and machine, and its state is one integer, so a resumed run continues the same stream.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rng {
    pub state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed ^ 0x9e37_79b9_7f4a_7c15 }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    /// Uniform in [-1, 1).
    pub fn signed(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in [-scale, scale).
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.signed() * scale).collect()
    }

    /// `k` distinct values from [lo, hi), in increasing order (all of them when the range is small).
    pub fn distinct(&mut self, lo: usize, hi: usize, k: usize) -> Vec<usize> {
        let n = hi.saturating_sub(lo);
        if k >= n {
            return (lo..hi).collect();
        }
        // Floyd's algorithm: k draws, no rejection loop.
        let mut chosen = std::collections::BTreeSet::new();
        for j in n - k..n {
            let t = self.below(j + 1);
            if !chosen.insert(t) {
                chosen.insert(j);
            }
        }
        chosen.into_iter().map(|v| v + lo).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_draws_are_distinct_sorted_and_in_range() {
        let mut r = Rng::new(3);
        for _ in 0..50 {
            let v = r.distinct(5, 40, 10);
            assert_eq!(v.len(), 10);
            assert!(v.windows(2).all(|w| w[0] < w[1]));
            assert!(v.iter().all(|&x| (5..40).contains(&x)));
        }
        assert_eq!(r.distinct(2, 5, 10), vec![2, 3, 4]);
        let x = r.vec(1000, 0.5);
        assert!(x.iter().all(|v| (-0.5..0.5).contains(v)));
    }
}
