//! The shard cycle: inventory, NeedsTable, reconcile, engine invocation,
//! rails, action ledger and the Decide service. Never depends on the
//! coordinator (hard rule 1): nothing here links the coordinator client or the
//! coordinator proto module, which `tests/static_stability.rs` proves over
//! `cargo metadata`. What the coordinator client needs (summary, shortfalls,
//! owned domains, term high-water mark) is exposed as plain data on
//! [`Decide`]; the binary adapts it.
//!
//! * [`Decide`] holds the shard's state and runs the cycle ([`Decide::run`]):
//!   reconcile against the provider ([`reconcile`]) → the demand that changed
//!   since the last cycle, patched into the cycle's [`demand`] view →
//!   `bigfleet_decision::run_cycle` → ledgers and AvailableCapacity hints →
//!   [`rails`] → the bounded action queue ([`actions`]). Its state is split into
//!   rooms by job (ingest, cycle, work hand-out, provider sync), locked in the
//!   order [`locks`] writes down and checks in debug builds.
//! * [`DecideService`] serves `bigfleet.mesh.v1.Ingest` and `bigfleet.mesh.v1.Work` (roll-up ingest,
//!   session events, the credit-based Work stream, Transition),
//!   `bigfleet.v1alpha1.ShardRead` and `bigfleet.mesh.v1.ShardInfo`.
//! * [`EpochSource`] says under which epoch work is handed out and whether it
//!   may be at all ([`actuation`]): fixed (the epoch file) or leased (the
//!   binary's etcd leader lease); only the hand-out pauses between terms.
//! * Session frames leave through a [`Publisher`] to the gateway's `Publish`
//!   stream ([`publish::forward_to_gateway`]).
//! * `testing` (feature `testing`, dev-dependencies only): a valid provider record
//!   and a Work-stream worker, shared by this crate's tests and the decide binary's.

pub mod actions;
pub mod actuation;
mod cycle;
pub mod demand;
pub mod drain;
pub mod edge;
mod errors;
pub mod history;
#[cfg(test)]
mod incremental_tests;
mod intake;
pub mod inventory;
pub mod ledgers;
pub mod locks;
pub mod metrics;
pub mod needs;
pub mod ownership;
pub mod publish;
pub mod rails;
pub mod reconcile;
pub mod service;
pub mod shard;
mod sync;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod trace;
mod work;

pub use actuation::EpochSource;
pub use history::{ActionRecord, DEFAULT_ACTION_HISTORY, HistoryQuery};
pub use intake::RollupVerdict;
pub use metrics::{CyclePhase, ShardMetrics};
pub use ownership::TransferVerdict;
pub use publish::{Events, Publisher, SessionSink, forward_to_gateway};
pub use rails::RailsConfig;
pub use reconcile::{MachineSource, MergeCounts, ProviderClient};
pub use service::DecideService;
pub use shard::{
    CycleError, CycleReport, DEFAULT_AVAILABLE_CAPACITY_MIN_CHANGE, DEFAULT_WAKE_INTERVAL_MS,
    Decide, DecideConfig, DecideError, ReconcileStats, SummaryView, machine_view,
};
pub use work::{MachinePatch, Transition, WorkGrant};

/// gRPC message limit on every client and server (full-replacement roll-ups
/// and 500K-machine Lists blow the 4 MiB default).
pub use bigfleet_mesh::MAX_MESSAGE_SIZE;
