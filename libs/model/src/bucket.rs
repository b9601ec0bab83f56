//! Penalty buckets: the dollar ladder both penalties use.

use crate::wire_enum;
use serde::{Deserialize, Serialize};
use std::fmt;

wire_enum! {
    /// A penalty bucket. Discriminants are the wire ordinals
    /// (`bigfleet.v1alpha1.PenaltyBucket`). Ordinal `b` in `3..=26` covers
    /// `(2^(b-4), 2^(b-3)]` dollars.
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
    )]
    pub enum PenaltyBucket {
        /// Not produced by [`PenaltyBucket::for_dollars`]; on the wire it means $0,
        /// the same as [`PenaltyBucket::Zero`].
        #[default]
        Unspecified = 0,
        Zero = 1,
        HalfDollar = 2,
        B1 = 3,
        B2 = 4,
        B4 = 5,
        B8 = 6,
        B16 = 7,
        B32 = 8,
        B64 = 9,
        B128 = 10,
        B256 = 11,
        B512 = 12,
        B1024 = 13,
        B2048 = 14,
        B4096 = 15,
        B8192 = 16,
        B16384 = 17,
        B32768 = 18,
        B65536 = 19,
        B131072 = 20,
        B262144 = 21,
        B524288 = 22,
        B1048576 = 23,
        B2097152 = 24,
        B4194304 = 25,
        B8388608 = 26,
        /// More than $8,388,608: effectively never interrupt/reclaim.
        Pinned = 27,
    }
}

impl PenaltyBucket {
    /// The largest finite upper bound on the ladder.
    pub const MAX_FINITE_DOLLARS: f64 = 8_388_608.0;

    /// The dollars the engine assumes for this bucket: the bucket's upper bound
    /// (a deliberate over-estimate). Unspecified and Zero are 0, Pinned is +∞.
    pub fn upper_bound_dollars(self) -> f64 {
        match self {
            PenaltyBucket::Unspecified | PenaltyBucket::Zero => 0.0,
            PenaltyBucket::HalfDollar => 0.5,
            PenaltyBucket::Pinned => f64::INFINITY,
            b => f64::from(1u32 << (b.ordinal() - 3)),
        }
    }

    /// Round-up mapping: the smallest bucket whose upper bound is `>= dollars`.
    /// Never yields Unspecified. NaN maps to Pinned, the safe over-estimate.
    pub fn for_dollars(dollars: f64) -> PenaltyBucket {
        if dollars.is_nan() || dollars > Self::MAX_FINITE_DOLLARS {
            return PenaltyBucket::Pinned;
        }
        if dollars <= 0.0 {
            return PenaltyBucket::Zero;
        }
        if dollars <= 0.5 {
            return PenaltyBucket::HalfDollar;
        }
        // Walk the 24 power-of-two rungs; exact and branch-cheap enough.
        Self::ALL[3..=26]
            .iter()
            .copied()
            .find(|b| dollars <= b.upper_bound_dollars())
            .unwrap_or(PenaltyBucket::Pinned)
    }
}

/// Free-function spelling of [`PenaltyBucket::for_dollars`] (the reference's `BucketForDollars`).
pub fn bucket_for_dollars(dollars: f64) -> PenaltyBucket {
    PenaltyBucket::for_dollars(dollars)
}

impl fmt::Display for PenaltyBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PenaltyBucket::Unspecified => f.write_str("unspecified"),
            PenaltyBucket::Zero => f.write_str("$0"),
            PenaltyBucket::HalfDollar => f.write_str("$0.50"),
            PenaltyBucket::Pinned => f.write_str("pinned"),
            b => write!(f, "${}", b.upper_bound_dollars()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PenaltyBucket::*;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pinned_mappings() {
        assert_eq!(bucket_for_dollars(0.51), B1);
        assert_eq!(bucket_for_dollars(1.01), B2);
        assert_eq!(bucket_for_dollars(8000.0), B8192);
        assert_eq!(bucket_for_dollars(20_000_000.0), Pinned);
        assert_eq!(bucket_for_dollars(0.0), Zero);
        assert_eq!(bucket_for_dollars(-3.0), Zero);
        assert_eq!(bucket_for_dollars(0.5), HalfDollar);
        assert_eq!(bucket_for_dollars(0.01), HalfDollar);
        assert_eq!(bucket_for_dollars(1.0), B1);
        assert_eq!(bucket_for_dollars(8_388_608.0), B8388608);
        assert_eq!(bucket_for_dollars(8_388_608.5), Pinned);
        assert_eq!(bucket_for_dollars(f64::INFINITY), Pinned);
        assert_eq!(bucket_for_dollars(f64::NAN), Pinned);
    }

    #[test]
    fn upper_bounds() {
        assert_eq!(Unspecified.upper_bound_dollars(), 0.0);
        assert_eq!(Zero.upper_bound_dollars(), 0.0);
        assert_eq!(HalfDollar.upper_bound_dollars(), 0.5);
        assert_eq!(B1.upper_bound_dollars(), 1.0);
        assert_eq!(B2.upper_bound_dollars(), 2.0);
        assert_eq!(B8192.upper_bound_dollars(), 8192.0);
        assert_eq!(B1048576.upper_bound_dollars(), 1_048_576.0);
        assert_eq!(B8388608.upper_bound_dollars(), 8_388_608.0);
        assert_eq!(Pinned.upper_bound_dollars(), f64::INFINITY);
        for b in 3..=26u8 {
            let bucket = PenaltyBucket::from_ordinal(i32::from(b)).unwrap();
            assert_eq!(bucket.upper_bound_dollars(), 2f64.powi(i32::from(b) - 3));
        }
    }

    #[test]
    fn ordinals_round_trip() {
        for (i, b) in PenaltyBucket::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(b.ordinal()), i);
            assert_eq!(PenaltyBucket::from_ordinal(i as i32), Some(b));
        }
        assert_eq!(PenaltyBucket::from_ordinal(28), None);
        assert_eq!(PenaltyBucket::from_ordinal(-1), None);
    }

    #[test]
    fn upper_bound_maps_to_its_own_bucket() {
        for b in &PenaltyBucket::ALL[1..] {
            assert_eq!(bucket_for_dollars(b.upper_bound_dollars()), *b);
        }
    }

    proptest! {
        #[test]
        fn round_up_is_tight(d in -10.0f64..2.0e7) {
            let b = bucket_for_dollars(d);
            prop_assert_ne!(b, Unspecified);
            prop_assert!(b.upper_bound_dollars() >= d);
            // The next bucket down would not cover d (round UP, smallest bucket).
            if b.ordinal() > 1 {
                let below = PenaltyBucket::from_ordinal(i32::from(b.ordinal()) - 1).unwrap();
                prop_assert!(below.upper_bound_dollars() < d);
            }
        }

        #[test]
        fn monotone(a in 0.0f64..1.0e7, b in 0.0f64..1.0e7) {
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            prop_assert!(bucket_for_dollars(lo) <= bucket_for_dollars(hi));
        }
    }
}
