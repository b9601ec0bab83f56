//! The fixed formulas: victim score, drain grace, idle-release holds.

use bigfleet_model::CapacityType;
use std::time::Duration;

/// Grace of a voluntary Phase 3 reclaim (no preemptor).
pub const RECLAIM_GRACE: Duration = Duration::from_secs(600);

/// The drain estimate applied to every victim (the reference has no per-workload estimate).
pub const DEFAULT_DRAIN_ESTIMATE: Duration = Duration::from_secs(30);

/// Phase 2 weights. The formula is fixed; only the weights are configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VictimWeights {
    pub priority: f64,
    pub drain_speed: f64,
    pub interruption: f64,
    pub reclamation: f64,
}

impl Default for VictimWeights {
    fn default() -> Self {
        VictimWeights {
            priority: 1.0,
            drain_speed: 0.1,
            interruption: 0.1,
            reclamation: 0.1,
        }
    }
}

/// Phase 2 options.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase2Options {
    pub weights: VictimWeights,
    pub estimated_drain: Duration,
}

impl Default for Phase2Options {
    fn default() -> Self {
        Phase2Options {
            weights: VictimWeights::default(),
            estimated_drain: DEFAULT_DRAIN_ESTIMATE,
        }
    }
}

/// How good a victim a Configured machine is for a preemptor; HIGHER is better.
///
/// `gap·wP + (1/drain_s)·wD + (1/ip)·wI + (1/rp)·wR` with the gap clamped at 0,
/// `drain_s >= 1` and both penalties floored at $0.01 (a Pinned penalty is
/// +Inf and contributes 0). Computed in f64, so extreme priorities cannot overflow.
pub fn victim_score(
    preemptor_priority: i32,
    victim_priority: i32,
    victim_interruption_dollars: f64,
    victim_reclamation_dollars: f64,
    estimated_drain: Duration,
    w: &VictimWeights,
) -> f64 {
    let gap = (f64::from(preemptor_priority) - f64::from(victim_priority)).max(0.0);
    let drain_s = estimated_drain.as_secs_f64().max(1.0);
    let ip = floor_penalty(victim_interruption_dollars);
    let rp = floor_penalty(victim_reclamation_dollars);
    gap * w.priority
        + (1.0 / drain_s) * w.drain_speed
        + (1.0 / ip) * w.interruption
        + (1.0 / rp) * w.reclamation
}

fn floor_penalty(d: f64) -> f64 {
    // NaN cannot pass ingest validation; treat it like the floor anyway so the
    // score stays a number.
    if d.is_nan() { 0.01 } else { d.max(0.01) }
}

/// Drain grace a victim gets, by priority gap: the larger the gap, the
/// sooner the victim must go: an urgent need does not wait out a
/// low-priority drain. The gap is
/// computed in i64, so it cannot overflow for any pair of i32 priorities.
pub fn drain_grace(preemptor_priority: i32, victim_priority: i32) -> Duration {
    let gap = i64::from(preemptor_priority) - i64::from(victim_priority);
    let secs = if gap > 900_000 {
        10
    } else if gap > 500_000 {
        30
    } else if gap > 100_000 {
        120
    } else {
        600
    };
    Duration::from_secs(secs)
}

/// How long an Idle machine of each capacity type is held before Phase 3 may
/// release it. `None` (or a zero duration) means never.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleasePolicy {
    pub on_demand: Option<Duration>,
    pub spot: Option<Duration>,
    pub bare_metal: Option<Duration>,
    pub reserved: Option<Duration>,
    pub unspecified: Option<Duration>,
}

impl ReleasePolicy {
    /// Releases nothing.
    pub const NEVER: ReleasePolicy = ReleasePolicy {
        on_demand: None,
        spot: None,
        bare_metal: None,
        reserved: None,
        unspecified: None,
    };

    /// The hold for a capacity type; `None` when machines of it are never released.
    pub fn hold(&self, capacity_type: CapacityType) -> Option<Duration> {
        let h = match capacity_type {
            CapacityType::OnDemand => self.on_demand,
            CapacityType::Spot => self.spot,
            CapacityType::BareMetal => self.bare_metal,
            CapacityType::Reserved => self.reserved,
            CapacityType::Unspecified => self.unspecified,
        };
        h.filter(|d| !d.is_zero())
    }
}

impl Default for ReleasePolicy {
    /// The reference constants: on-demand 10 min, spot 1 min, everything else never.
    fn default() -> Self {
        ReleasePolicy {
            on_demand: Some(Duration::from_secs(600)),
            spot: Some(Duration::from_secs(60)),
            ..ReleasePolicy::NEVER
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = DEFAULT_DRAIN_ESTIMATE;

    #[test]
    fn drain_grace_locked_table() {
        let cases = [
            (1_000_000, 10),
            (900_001, 10),
            (900_000, 30),
            (899_999, 30),
            (500_001, 30),
            (500_000, 120),
            (499_999, 120),
            (100_001, 120),
            (100_000, 600),
            (99_999, 600),
            (0, 600),
            (-5, 600),
        ];
        for (gap, secs) in cases {
            assert_eq!(drain_grace(gap, 0), Duration::from_secs(secs), "gap {gap}");
        }
        // No overflow at the extremes (the reference's i32 subtraction could wrap).
        assert_eq!(drain_grace(i32::MAX, i32::MIN), Duration::from_secs(10));
        assert_eq!(drain_grace(i32::MIN, i32::MAX), Duration::from_secs(600));
    }

    #[test]
    fn victim_score_prefers_lower_priority_victim() {
        let w = VictimWeights::default();
        let low = victim_score(1_000_000, 100, 1.0, 1.0, D, &w);
        let high = victim_score(1_000_000, 500_000, 1.0, 1.0, D, &w);
        assert!(low > high);
    }

    #[test]
    fn victim_score_prefers_faster_drain() {
        let w = VictimWeights::default();
        let fast = victim_score(1000, 0, 1.0, 1.0, Duration::from_secs(5), &w);
        let slow = victim_score(1000, 0, 1.0, 1.0, Duration::from_secs(300), &w);
        assert!(fast > slow);
    }

    #[test]
    fn victim_score_prefers_low_penalty() {
        let w = VictimWeights::default();
        let cheap = victim_score(1000, 0, 1.0, 1.0, D, &w);
        let dear_interrupt = victim_score(1000, 0, 8192.0, 1.0, D, &w);
        let dear_reclaim = victim_score(1000, 0, 1.0, 8192.0, D, &w);
        assert!(cheap > dear_interrupt);
        assert!(cheap > dear_reclaim);
        // Pinned (+Inf) contributes nothing, still finite.
        let pinned = victim_score(1000, 0, f64::INFINITY, f64::INFINITY, D, &w);
        assert!(pinned.is_finite() && pinned < dear_reclaim);
    }

    #[test]
    fn victim_score_floors_avoid_div_by_zero() {
        let w = VictimWeights::default();
        let s = victim_score(0, 0, 0.0, 0.0, Duration::ZERO, &w);
        assert!(s.is_finite());
        // gap 0; 1/1·0.1 + 1/0.01·0.1 + 1/0.01·0.1 = 0.1 + 10 + 10
        assert!((s - 20.1).abs() < 1e-9, "{s}");
        // A higher preemptor never lowers the score (gap clamps at 0 below).
        assert_eq!(
            victim_score(-10, 0, 0.0, 0.0, D, &w),
            victim_score(0, 0, 0.0, 0.0, D, &w)
        );
    }

    #[test]
    fn release_hold_table() {
        let p = ReleasePolicy::default();
        assert_eq!(
            p.hold(CapacityType::OnDemand),
            Some(Duration::from_secs(600))
        );
        assert_eq!(p.hold(CapacityType::Spot), Some(Duration::from_secs(60)));
        assert_eq!(p.hold(CapacityType::BareMetal), None);
        assert_eq!(p.hold(CapacityType::Reserved), None);
        assert_eq!(p.hold(CapacityType::Unspecified), None);
        let zero = ReleasePolicy {
            on_demand: Some(Duration::ZERO),
            ..ReleasePolicy::default()
        };
        assert_eq!(zero.hold(CapacityType::OnDemand), None);
        assert_eq!(ReleasePolicy::NEVER.hold(CapacityType::Spot), None);
    }
}
