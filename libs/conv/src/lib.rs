//! Proto <-> domain conversion and validation: the trust-boundary gate.
//!
//! Everything that arrives from outside the shard (operator roll-ups,
//! provider machine records, actions handed to execute workers) is converted
//! here from generated `bigfleet-proto` types into `bigfleet-model` types, and
//! validated on the way: a roll-up with one bad field, or bigger than a bound of
//! [`RollupLimits`] (ADR-0104), is rejected whole, a
//! provider record that breaks the machine invariants is rejected with its
//! metric reason. The other direction builds the frames the services send.
//! No I/O; every function is pure and must never panic on any input.

pub mod capacity;
pub mod error;
pub mod fingerprint;
pub mod limits;
pub mod mesh;
pub mod provider;
pub mod shard;

pub use capacity::{
    Rollup, need_from_proto, need_to_proto, penalty_bucket_from_proto, release_selector,
    requirements_from_proto, requirements_to_proto, resources_to_map, rollup_from_proto,
    rollup_from_proto_with, rollup_to_proto,
};
pub use error::{ConvError, REJECT_REASON_METADATA};
pub use fingerprint::{RollupFingerprint, rollup_fingerprint};
#[cfg(feature = "cli")]
pub use limits::RollupLimitArgs;
pub use limits::{Limit, RollupLimits, qualified_name_problem};
pub use mesh::{action_from_proto, action_kind_from_proto, action_kind_to_proto, action_to_proto};
pub use provider::{
    machine_from_proto, machine_from_proto_owned, machine_state_from_proto, machine_state_to_proto,
    machine_to_proto, resources_message,
};
pub use shard::{bootstrap_request, node_state_update, node_supersedes_key, reclaim_instruction};
