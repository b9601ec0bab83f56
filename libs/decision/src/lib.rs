//! The pure decision engine of a shard: from an inventory snapshot and the
//! demand rows to actions, per-need verdicts and shortfall seeds.
//!
//! A shard keeps a [`Fleet`] (the compact, incrementally maintained
//! inventory, ADR-0021) and calls [`run_cycle`] with it and the NeedsTable
//! snapshot. One cycle gathers a [`Snapshot`], normalizes demand (ADR-0041
//! folding), stamps parked gangs from the [`ParkingLedger`], runs Phase 1
//! (credit bound supply, acquire Idle then Speculative, in precedence order),
//! Phase 2 (preempt strictly lower priority) and Phase 3 (shrink-only reclaim,
//! idle release), sums unresolved residuals into shortfall seeds and, on
//! request, builds per-need verdicts (ADR-0061). No I/O, no async, no clocks
//! (`now` is an input), and the output is identical for every thread count
//! (ADR-0020). `synth` (feature `synth`) generates the benchmark fleets used by
//! `cycle-bench` and the scale tests.

mod context;
mod cycle;
mod demand;
mod fleet;
mod intern;
mod normalize;
mod ownership;
mod parking;
mod phase1;
mod phase2;
mod phase3;
mod qty;
mod same;
mod scoring;
mod snapshot;
#[cfg(feature = "synth")]
pub mod synth;
mod verdict;

pub use cycle::{
    Claim, CycleInput, CycleOptions, CycleOutput, CycleStats, MATCHING_SUPPLY_CAP,
    SAME_CANDIDATE_CAP, ShortfallSeed, normalize_demand, run_cycle,
};
pub use fleet::Fleet;
pub use ownership::Ownership;
pub use parking::{
    PARK_AFTER, PARK_AFTER_CYCLES, ParkingLedger, ParkingObservation, ParkingTiming, REPROBE_EVERY,
    REPROBE_EVERY_CYCLES, is_parked_at, parking_key,
};
pub use scoring::{
    DEFAULT_DRAIN_ESTIMATE, Phase2Options, RECLAIM_GRACE, ReleasePolicy, VictimWeights,
    drain_grace, victim_score,
};
pub use snapshot::Snapshot;
pub use verdict::{
    DomainCoverage, MatchingSupply, NeedVerdict, PreemptionSummary, UnmetReason, VerdictSource,
};

/// Why a cycle could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("duplicate machine id {0:?} in the inventory")]
    DuplicateMachineId(String),
    #[error("idle-since stamps for {stamps} machines, inventory has {machines}")]
    IdleSinceLength { machines: usize, stamps: usize },
    #[error("inventory of {0} machines exceeds the engine's 2^32 limit")]
    TooManyMachines(usize),
    #[error("cycle input has both a fleet and a machine slice")]
    TwoInventories,
}
