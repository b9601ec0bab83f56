//! SplitMix64, the one small seeded generator of the repository: `bigfleet-decision`'s
//! synthetic fleets and `bigfleet up --chaos`'s victims and jitter both draw from it, so a
//! seed means the same sequence everywhere. Deterministic and reproducible, not for secrets.

/// SplitMix64's increment (the 64-bit golden ratio), also used to spread seeds apart.
const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed`, mixed so that neighbouring seeds start far apart.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64::from_state(seed ^ GOLDEN_GAMMA)
    }

    /// A generator whose raw SplitMix64 state is `state` (no seed mixing).
    pub fn from_state(state: u64) -> SplitMix64 {
        SplitMix64(state)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() > 1.0 - p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_is_splitmix64_over_its_state() {
        // SplitMix64's published first output from state 0.
        assert_eq!(SplitMix64::from_state(0).next_u64(), 0xE220_A839_7B1D_CDAF);
        let mut seeded = SplitMix64::new(7);
        let mut raw = SplitMix64::from_state(7 ^ GOLDEN_GAMMA);
        for _ in 0..4 {
            assert_eq!(seeded.next_u64(), raw.next_u64());
        }
        let mut a = SplitMix64::from_state(42);
        let mut b = SplitMix64::from_state(42);
        for _ in 0..1000 {
            let u = a.unit();
            assert!((0.0..1.0).contains(&u), "{u}");
            assert_eq!(b.chance(0.25), u > 0.75);
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_sequence() {
        let mut a = SplitMix64::new(5);
        let mut b = SplitMix64::new(5);
        assert_eq!(
            (0..10).map(|_| a.next_u64()).collect::<Vec<_>>(),
            (0..10).map(|_| b.next_u64()).collect::<Vec<_>>()
        );
    }
}
