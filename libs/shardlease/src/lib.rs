//! etcd-backed shard epochs, the one-active-decide leader lease, and work-endpoint discovery.
//!
//! With `--etcd-endpoints` a shard needs no volume and no static addresses: everything it
//! must remember across pod rescheduling lives under `/bigfleet/shards/<id>/` on an (HA)
//! etcd cluster ([`ShardKeys`]):
//!
//! * `epoch` — the fencing epoch, a decimal `u64` advanced by a compare-and-swap
//!   transaction ([`EtcdShards::next_epoch`]); etcd linearises every transaction through its
//!   Raft log, so two racing decides can never mint the same value, and the value survives
//!   etcd leader changes and restarts (ADR-0070).
//! * `leader` — the holder of the shard's leader lease. [`EtcdShards::campaign`] returns a
//!   [`LeaderGate`]: only while it reports a [`Term`] may decide hand out work. Each term is
//!   won in ONE transaction that also advances the epoch, so every (re-)acquisition fences
//!   everything any earlier holder — including this process — ever stamped. The gate drops
//!   the term the moment the holder can no longer prove its lease valid on its own
//!   monotonic clock ([`LeaseClock`], ADR-0071).
//! * `work` — the leader's Work endpoint, attached to its lease (it vanishes with the
//!   leader); remote execute workers follow it with a [`WorkEndpointWatcher`].
//!
//! With the `testing` feature, `testing::EtcdServer` starts a real `etcd` for tests (this
//! crate's and the services').

mod clock;
mod config;
mod discovery;
mod epoch;
mod gate;
#[cfg(feature = "testing")]
pub mod testing;

pub use clock::{LeaseClock, LeaseTiming};
pub use config::{DEFAULT_KEY_PREFIX, EtcdConfig, EtcdShards, EtcdTls, ShardKeys};
pub use discovery::WorkEndpointWatcher;
pub use epoch::EpochGrant;
pub use gate::{Campaign, LeaderGate, Term};

use std::time::Duration;

/// Errors of this crate. Transient etcd failures inside the background tasks are retried
/// there (and only logged); these are what a caller sees from a direct call.
#[derive(Debug, thiserror::Error)]
pub enum ShardLeaseError {
    /// The configuration cannot work (no endpoints, a TTL too short for its safety margin,
    /// half a client certificate, ...).
    #[error("invalid etcd configuration: {0}")]
    Config(String),
    /// A TLS file (CA, client certificate or key) could not be read.
    #[error("etcd tls file {path}: {source}")]
    TlsFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An etcd call failed.
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// An etcd call did not answer in time (etcd down, partitioned or without quorum).
    #[error("etcd {what} timed out after {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// The epoch key holds something other than one decimal `u64`. Never guessed around:
    /// a shard that cannot prove its epoch is newer than every earlier one must not act.
    #[error("corrupt epoch at {key}: {value:?} is not a decimal u64")]
    CorruptEpoch { key: String, value: String },
    /// The epoch would overflow `u64`.
    #[error("epoch overflow at {key}")]
    EpochOverflow { key: String },
    /// etcd answered something the protocol rules out (e.g. a failed transaction without
    /// the reads of its else branch).
    #[error("unexpected etcd response: {0}")]
    Protocol(String),
}

/// Runs `fut` with a deadline: every etcd call of this crate is bounded, because an etcd
/// that stopped answering must never stall a lease decision.
pub(crate) async fn bounded<T>(
    what: &'static str,
    after: Duration,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, ShardLeaseError> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r.map_err(ShardLeaseError::Etcd),
        Err(_) => Err(ShardLeaseError::Timeout { what, after }),
    }
}
