//! An in-repo `bigfleet.v1alpha1.CapacityProvider`: the provider every test, the local
//! mesh and the load tests talk to, plus the conformance suite any provider can be held to.
//!
//! * [`FakeProvider`] is the whole provider as a plain in-memory store, usable in-process
//!   (`Arc<FakeProvider>`) and behind gRPC. It follows the provider contract of `docs/provider-guide.md`: async or
//!   instant transitions ([`TransitionModel`]), idempotency on (machine, operation) with
//!   stable `op-<n>` ids, fencing high-water marks per (shard, machine) checked before
//!   anything else (optionally persisted, [`FakeProvider::open_fence_file`]),
//!   `shard_metadata` stored and echoed verbatim and cleared with `cluster` when a drain
//!   reaches IDLE, revisions with `since_revision` deltas, `max_results` and state
//!   filters, and test hooks (failure injection, staged completion, readiness hold,
//!   removal, shedding, adding or rewriting machines in any state, scripted List faults:
//!   [`ListFault`]).
//! * [`grpc`] adapts it to tonic; [`server`] serves it over TCP or a Unix socket with
//!   health and reflection ([`spawn_tcp`], [`spawn_uds`]) and dials providers
//!   ([`connect`]). List is written straight to the wire from pre-encoded templates so a
//!   500K-machine List stays cheap.
//! * [`admin`] is a small HTTP API over the test hooks for end-to-end tests.
//! * [`conformance`] is the provider conformance suite (`docs/provider-guide.md`) as
//!   async functions over a connected client; the `provider-conformance` binary runs it
//!   against any address.
//! * [`cli`] is the `bigfleet-fake-provider` command line ([`cli::Args`], [`run`]).
//!
//! # In-process use
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use bigfleet_fake_provider::{FakeProvider, spawn_uds, connect};
//!
//! let provider = Arc::new(FakeProvider::builtin());
//! let dir = tempfile::tempdir()?;
//! let server = spawn_uds(&dir.path().join("provider.sock"), provider.clone()).await?;
//! let mut client = connect(&server.target()).await?;
//! // ... drive `client`; steer the fake through `provider` (fail_machine, mark_ready, ...)
//! server.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Catalog format (`--catalog FILE`)
//!
//! A JSON object:
//!
//! ```json
//! {
//!   "provider": "fake",
//!   "instance_types": {
//!     "bm.gpu.h100.8": {
//!       "resources":   {"cpu": "192", "memory": "2048Gi", "nvidia.com/gpu": "8"},
//!       "allocatable": {"cpu": "190", "memory": "2048Gi", "nvidia.com/gpu": "8"},
//!       "labels":      {"nvidia.com/gpu.product": "H100"}
//!     },
//!     "m.xlarge.32": {"resources": {"cpu": "32", "memory": "128Gi"}}
//!   },
//!   "pools": [
//!     {"name": "gpu-h100", "instance_type": "bm.gpu.h100.8", "capacity_type": "bare_metal",
//!      "zones": ["fake-1a", "fake-1b"], "rack_size": 8, "clusters": ["cluster-0"],
//!      "counts": {"idle": 48, "configured": 16}},
//!     {"name": "cpu-spot", "instance_type": "m.xlarge.32", "capacity_type": "spot",
//!      "zones": ["fake-1a", "fake-1b", "fake-1c"], "price_per_hour": 0.46,
//!      "interruption_probability": 0.05, "labels": {"team": "batch"},
//!      "counts": {"speculative": 300, "idle": 12}}
//!   ]
//! }
//! ```
//!
//! * `provider` (default `fake`): `HostRef.provider` of every host; `HostRef.ref` is the
//!   machine id.
//! * `instance_types`: `resources` (required, becomes `Machine.resources`), `allocatable`
//!   (optional; absent ⇒ sent unset, meaning "same as resources"), `labels`.
//! * `pools[]`: `name` (unique; machine ids are `<name>-<index, 6 digits>`),
//!   `instance_type` (a key above), `capacity_type` (`bare_metal`, `reserved`,
//!   `on_demand`, `spot`), `zones` (machines go round-robin by index), `price_per_hour`
//!   (≥ 0, finite), `interruption_probability` ([0, 1]), `labels` (merged over the
//!   instance type's), `rack_size` (machines per rack within a zone; sets
//!   `topology.bigfleet/rack` = `<zone>-<pool>-rack-<n>`), `clusters` (bound machines are
//!   spread over them; default `fake-cluster`), and `counts` per starting state
//!   (`speculative`, `creating`, `idle`, `configuring`, `configured`, `draining`,
//!   `deleting`, `failed`), assigned in that order.
//! * Every machine also carries `topology.kubernetes.io/zone` = its zone. Unknown fields
//!   are errors.
//!
//! Without `--catalog` the binary seeds [`Catalog::builtin`]; `--generate N` seeds
//! [`Catalog::generated`] (deterministic by `--seed`).

pub mod actuation;
pub mod admin;
pub mod catalog;
pub mod cli;
pub mod conformance;
mod error;
mod fence;
pub mod grpc;
pub mod metrics;
pub mod server;
mod store;
mod wire;

pub use catalog::{CapacityKind, Catalog, InstanceType, Pool, RACK_LABEL, StateCounts, ZONE_LABEL};
pub use cli::run;
pub use error::{CatalogError, FenceFileError, ProviderError};
pub use fence::Mark;
pub use grpc::FakeProviderService;
pub use server::{
    ConnectError, ServeOptions, ServerHandle, connect, connect_with, spawn_tcp, spawn_uds,
    spawn_uds_with,
};
pub use store::{
    Completion, FailureRates, FailureStyle, FakeProvider, Injection, ListFault,
    MUTATION_CALLS_KEPT, MutationCall, OpKind, ProviderConfig, ReserveBufMut, Stats, Token,
    TransitionModel,
};

/// Every provider server and client here allows messages this large: the mesh's one
/// limit (full Lists blew the 4 MiB gRPC default in the original).
pub use bigfleet_mesh::MAX_MESSAGE_SIZE;
