//! Effective cost: the price of a machine plus its expected interruption penalty.

use crate::bucket::PenaltyBucket;

/// `price + probability × max(0, penalty_dollars)`, with `0 × ∞ = 0`
/// (ADR-0010): a machine that is never interrupted costs its price even for a
/// Pinned need, so the result is never NaN for valid machines.
pub fn effective_cost_dollars(price_per_hour: f64, probability: f64, penalty_dollars: f64) -> f64 {
    let penalty = penalty_dollars.max(0.0);
    let risk = if probability == 0.0 {
        0.0
    } else {
        probability * penalty
    };
    price_per_hour + risk
}

/// [`effective_cost_dollars`] with the penalty taken as the upper bound of a
/// need's interruption bucket.
pub fn effective_cost(price_per_hour: f64, probability: f64, bucket: PenaltyBucket) -> f64 {
    effective_cost_dollars(price_per_hour, probability, bucket.upper_bound_dollars())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_pins() {
        assert_eq!(effective_cost_dollars(6.0, 0.0, 100.0), 6.0);
        assert!((effective_cost_dollars(1.80, 0.10, 5.0) - 2.30).abs() < 1e-12);
        // The high-penalty flip: spot wins at $5, on-demand wins at $50.
        assert!(effective_cost_dollars(1.80, 0.10, 5.0) < effective_cost_dollars(6.0, 0.0, 5.0));
        assert!(effective_cost_dollars(1.80, 0.10, 50.0) > effective_cost_dollars(6.0, 0.0, 50.0));
        assert!((effective_cost_dollars(1.80, 0.10, 50.0) - 6.80).abs() < 1e-12);
    }

    #[test]
    fn zero_times_infinity_is_zero() {
        assert_eq!(effective_cost(6.0, 0.0, PenaltyBucket::Pinned), 6.0);
        assert_eq!(
            effective_cost(1.8, 0.1, PenaltyBucket::Pinned),
            f64::INFINITY
        );
        assert!(!effective_cost(0.0, 0.0, PenaltyBucket::Pinned).is_nan());
    }

    #[test]
    fn negative_penalty_is_clamped_and_buckets_use_upper_bounds() {
        assert_eq!(effective_cost_dollars(2.0, 0.5, -10.0), 2.0);
        assert_eq!(effective_cost(2.0, 0.5, PenaltyBucket::B8), 6.0);
        assert_eq!(effective_cost(2.0, 0.5, PenaltyBucket::Unspecified), 2.0);
    }
}
