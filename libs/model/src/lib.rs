//! Domain types: machines, states and transitions, resources, penalty buckets,
//! requirements, profiles, needs, actions, release selectors.
//!
//! This crate is the shared vocabulary of the shard:
//! plain owned types with their invariants, no I/O and no proto types (those
//! conversions live in `bigfleet-conv`). The decision engine builds its compact
//! per-cycle forms on top of these.

pub mod action;
pub mod bucket;
pub mod cost;
pub mod machine;
pub mod need;
pub mod profile;
pub mod quantity;
pub mod release;
pub mod requirement;
pub mod resources;
pub mod rng;
pub mod state;
mod wire;

pub use action::{Action, ActionKind, Assignment};
pub use bucket::{PenaltyBucket, bucket_for_dollars};
pub use cost::{effective_cost, effective_cost_dollars};
pub use machine::{
    ClusterId, Host, InvariantError, Machine, MachineId, MachineProfile, MetadataFieldError,
    ShardMetadataError, StructuralViolation,
};
pub use need::{Need, aggregate, snapshot_order};
pub use profile::{Precedence, Profile};
pub use quantity::{Milli, QuantityError, format_for_people, format_milli, parse_quantity};
pub use release::{NotASelector, ReleaseSelector};
pub use requirement::{
    CapacityType, INSTANCE_TYPE_KEY, Operator, Requirement, TopologySpread, WhenUnsatisfiable,
    ZONE_KEY, matches_machine, matches_requirements, pinned_instance_types, same_requirement,
    strict_spread,
};
pub use resources::{ResourceError, ResourceVector, distinct_names};
pub use rng::SplitMix64;
pub use state::{MachineState, TransitionError, check_transition};
