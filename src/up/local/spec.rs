//! What to start: the provider, how many shards and coordinators, which services, extra
//! flags and environment, and the time bounds of readiness and stopping.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use bigfleet_fake_provider::Catalog;

/// How the mesh gets its capacity provider.
#[derive(Debug, Clone)]
pub enum ProviderSpec {
    /// One fake provider per shard. One seed applies to every shard; otherwise one seed
    /// per shard.
    Fake(Vec<FakeSeed>),
    /// Every shard uses this provider URI (`http://host:port`, `unix:///path`).
    External(String),
}

/// What a fake provider starts with.
#[derive(Debug, Clone)]
pub enum FakeSeed {
    /// `Catalog::builtin()`.
    Builtin,
    /// A catalog file (fake-provider catalog format).
    File(PathBuf),
    /// A catalog written into the provider's directory.
    Catalog(Box<Catalog>),
    /// `--generate N --seed S`.
    Generate { machines: u64, seed: u64 },
}

/// Everything needed to start a mesh.
#[derive(Debug, Clone)]
pub struct MeshSpec {
    /// The `bigfleet` executable (`std::env::current_exe()` in `up`,
    /// `env!("CARGO_BIN_EXE_bigfleet")` in tests).
    pub exe: PathBuf,
    pub run_dir: PathBuf,
    pub shards: usize,
    pub provider: ProviderSpec,
    /// With a fake provider: one provider for every shard (the first seed), as a
    /// multi-shard fleet over one cloud account has, so machines can move between shards'
    /// ownership (ADR-0128); otherwise one provider per shard.
    pub shared_provider: bool,
    /// Start a single-node coordinator (and report to it).
    pub coordinator: bool,
    /// Coordinator replicas (one Raft cluster: `coord-0` bootstraps, the others join).
    /// One is named `coordinator`; several are `coordinator-<i>`.
    pub coordinators: usize,
    /// Start svc-inspect (needs the coordinator).
    pub inspect: bool,
    /// mTLS everywhere with a throwaway CA.
    pub tls: bool,
    /// Extra flags appended per service.
    pub decide_flags: Vec<String>,
    pub gateway_flags: Vec<String>,
    pub execute_flags: Vec<String>,
    pub provider_flags: Vec<String>,
    pub coordinator_flags: Vec<String>,
    pub inspect_flags: Vec<String>,
    /// Extra gateway flags of one shard (by shard id), after `gateway_flags`.
    pub gateway_shard_flags: BTreeMap<String, Vec<String>>,
    /// Each fake provider persists its fencing marks (`provider-<i>/fence.jsonl`, so a
    /// restarted provider still refuses a zombie) and logs every accepted mutating call
    /// (`provider-<i>/actuations.jsonl`), for `up --chaos`'s audit.
    pub provider_audit: bool,
    /// Extra environment of every child (e.g. `OTEL_EXPORTER_OTLP_ENDPOINT`, `RUST_LOG`).
    pub env: Vec<(String, String)>,
    /// Bound on each tier's readiness wait.
    pub ready_timeout: Duration,
    /// SIGTERM → SIGKILL deadline per child.
    pub stop_timeout: Duration,
}

impl MeshSpec {
    /// One shard, built-in fake provider, coordinator and inspect, plaintext.
    pub fn new(exe: impl Into<PathBuf>, run_dir: impl Into<PathBuf>) -> Self {
        Self {
            exe: exe.into(),
            run_dir: run_dir.into(),
            shards: 1,
            provider: ProviderSpec::Fake(vec![FakeSeed::Builtin]),
            shared_provider: false,
            coordinator: true,
            coordinators: 1,
            inspect: true,
            tls: false,
            decide_flags: Vec::new(),
            gateway_flags: Vec::new(),
            execute_flags: Vec::new(),
            provider_flags: Vec::new(),
            coordinator_flags: Vec::new(),
            inspect_flags: Vec::new(),
            gateway_shard_flags: BTreeMap::new(),
            provider_audit: false,
            env: Vec::new(),
            ready_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
        }
    }
}

/// A fake provider's fence file, in its directory (with [`MeshSpec::provider_audit`]).
pub const FENCE_FILE: &str = "fence.jsonl";
/// A fake provider's actuation log, in its directory (with [`MeshSpec::provider_audit`]).
pub const ACTUATION_LOG: &str = "actuations.jsonl";
