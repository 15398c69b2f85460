//! A small seeded generator (SplitMix64): the workloads must be the same on every machine and
//! every Rust version, which a crate's unspecified algorithm would not promise.

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6A09_E667_F3BC_C908)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi` (`lo` when `hi < lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        let Some(span) = (hi - lo).checked_add(1) else {
            return self.next_u64();
        };
        // Multiply-shift: unbiased enough for workload generation, and exact when span is a
        // power of two.
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// True with probability `percent`/100.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.range(0, 99) < percent
    }

    /// One of `items`, weighted by the second field.
    pub fn weighted<T: Copy>(&mut self, items: &[(T, u64)]) -> T {
        let total: u64 = items.iter().map(|i| i.1).sum();
        let mut x = self.range(0, total.saturating_sub(1));
        for &(v, w) in items {
            if x < w {
                return v;
            }
            x -= w;
        }
        items[items.len() - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_in_range() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..100).map(|_| r.range(3, 9)).collect()
        };
        let mut r = Rng::new(7);
        assert!(a.iter().all(|&v| (3..=9).contains(&v)));
        assert_eq!(a, (0..100).map(|_| r.range(3, 9)).collect::<Vec<_>>());
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert_eq!(r.range(5, 5), 5);
        let _ = r.range(0, u64::MAX);
        assert_eq!(r.weighted(&[(1, 0), (2, 5)]), 2);
    }
}
