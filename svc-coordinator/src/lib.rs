//! bigfleet-coordinator: the openraft-replicated fleet coordinator — the keeper of fleet-wide
//! facts (which shards exist, which cluster and which topology domain belongs to which
//! shard) and nothing else. It is never on a shard's provisioning path: shards pull
//! instructions with their periodic `ReportShard`, and keep working while it is away.
//!
//! * [`fsm`] — the replicated table and its commands (pure, deterministic).
//! * [`store`] — Raft log, vote, state machine and snapshot in one redb file, fsynced.
//! * [`network`] — openraft over the internal `bigfleet.mesh.v1.Raft` gRPC service.
//! * [`service`] — the public `bigfleet.v1alpha1.Coordinator` service, leader-only, with
//!   leader hints (`x-bigfleet-leader`) on FAILED_PRECONDITION.
//! * [`info`] — the internal `bigfleet.mesh.v1.CoordinatorInfo` transfer read (ADR-0139).
//! * [`soft`] — leader-local soft state: latest reports and fenced instruction queues.
//! * [`node`] — [`start`] a replica (ordinal bootstrap, join reconciler, probes, export).
//! * [`rebalance`] — the rebalancer's policy, a pure function (ADR-0130).
//! * [`rebalancer`] — the leader-local loop that runs it and proposes transfers.
//! * [`transfers`] — cross-shard transfers as replicated state: phases and instructions.
//! * [`dr`] — snapshot archives, periodic export and the offline [`restore_snapshot`].

pub mod args;
pub mod dr;
pub mod fsm;
pub mod info;
pub mod metrics;
pub mod network;
pub mod node;
pub mod raft_types;
pub mod rebalance;
pub mod rebalancer;
pub mod replica;
pub mod service;
pub mod soft;
pub mod store;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod transfers;

pub use args::Args;
pub use dr::{DrError, RestoreReport, SnapshotArchive, restore_snapshot};
pub use node::{NO_LEADER, Running, StartError, start, start_with};
pub use raft_types::{node_id_of, ordinal_of};
pub use replica::JOIN_API_ADDR_KEY;

/// Runs a replica until SIGTERM/SIGINT, then drains and stops: not ready, the loops stop,
/// the Coordinator server drains, Raft stops, the ops endpoint stops.
pub async fn run(args: Args) -> anyhow::Result<()> {
    let ops = bigfleet_mesh::binary::Ops::start(&args.metrics_addr, NO_LEADER).await?;
    let running = start_with(args, ops.registry.clone(), ops.readiness.clone()).await?;
    ops.drain_on_signal(running.shutdown()).await
}
