//! A coordinator client that follows the leader.
//!
//! Every coordinator RPC is served by the Raft leader only; a follower answers
//! FAILED_PRECONDITION "not leader" and names the leader's client address in the
//! [`bigfleet_mesh::LEADER_HINT_METADATA`] metadata entry (read with [`leader_hint`]). This
//! client retries such a call once against the hinted leader and keeps talking to it
//! afterwards, so a Kubernetes Service that lands on a follower costs one extra round trip,
//! not an error. svc-inspect and the `bigfleet` CLI (reads and admin commands) share it.

use std::time::Duration;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy, leader_hint};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::coordinator_info_client::CoordinatorInfoClient as InfoClient;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_client::CoordinatorClient as RawClient;
use parking_lot::Mutex;
use tonic::{Code, Status};

/// Which RPC failed, for error messages that tell people what to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorRpc {
    ListShards,
    ListShardReports,
    ListDomainAssignments,
    AssignDomain,
    UnassignDomain,
    RemoveShard,
    SnapshotSave,
    /// The internal `bigfleet.mesh.v1.CoordinatorInfo/ListTransfers` (ADR-0139).
    ListTransfers,
}

impl CoordinatorRpc {
    pub fn name(self) -> &'static str {
        match self {
            CoordinatorRpc::ListShards => "ListShards",
            CoordinatorRpc::ListShardReports => "ListShardReports",
            CoordinatorRpc::ListDomainAssignments => "ListDomainAssignments",
            CoordinatorRpc::AssignDomain => "AssignDomain",
            CoordinatorRpc::UnassignDomain => "UnassignDomain",
            CoordinatorRpc::RemoveShard => "RemoveShard",
            CoordinatorRpc::SnapshotSave => "SnapshotSave",
            CoordinatorRpc::ListTransfers => "ListTransfers",
        }
    }

    /// The roles the coordinator accepts for this RPC under mTLS (ADR-0060 matrix).
    pub fn required_roles(self) -> &'static str {
        match self {
            CoordinatorRpc::ListShards
            | CoordinatorRpc::ListShardReports
            | CoordinatorRpc::ListDomainAssignments
            | CoordinatorRpc::ListTransfers => "readonly or admin",
            CoordinatorRpc::AssignDomain
            | CoordinatorRpc::UnassignDomain
            | CoordinatorRpc::RemoveShard
            | CoordinatorRpc::SnapshotSave => "admin",
        }
    }
}

/// A failed coordinator call: which address, which RPC, what status.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CoordinatorError {
    #[error("invalid coordinator address {addr:?}: {reason}")]
    Address { addr: String, reason: String },
    #[error("coordinator {addr}: {} failed: {} ({})", rpc.name(), status.message(), code_name(status.code()))]
    Call {
        addr: String,
        rpc: CoordinatorRpc,
        status: Status,
    },
}

impl CoordinatorError {
    /// The gRPC code behind the failure (`Unavailable` for an unusable address).
    pub fn code(&self) -> Code {
        match self {
            CoordinatorError::Address { .. } => Code::InvalidArgument,
            CoordinatorError::Call { status, .. } => status.code(),
        }
    }

    /// The address that failed.
    pub fn addr(&self) -> &str {
        match self {
            CoordinatorError::Address { addr, .. } | CoordinatorError::Call { addr, .. } => addr,
        }
    }
}

/// Lowercase gRPC code name for messages (`unavailable`, `permission denied`).
pub fn code_name(code: Code) -> String {
    format!("{code:?}")
        .chars()
        .enumerate()
        .fold(String::new(), |mut s, (i, c)| {
            if c.is_uppercase() && i > 0 {
                s.push(' ');
            }
            s.extend(c.to_lowercase());
            s
        })
}

/// How to reach the coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// `http://host:port`, `https://host:port`, bare `host:port` or `unix:///path`.
    pub addr: String,
    /// mTLS client config (`None`: plaintext).
    pub tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// Bound on each call (the connect attempt included); `None`: no bound (snapshot
    /// downloads).
    pub timeout: Option<Duration>,
    /// Retries of UNAVAILABLE / DEADLINE_EXCEEDED inside one call.
    pub retry: RetryPolicy,
}

/// The leader-following client. Cheap to share (`&self` methods; the current channel sits
/// behind a mutex and is cloned per call).
pub struct CoordinatorClient {
    cfg: CoordinatorConfig,
    current: Mutex<(String, MeshChannel)>,
}

impl std::fmt::Debug for CoordinatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorClient")
            .field("addr", &self.current.lock().0)
            .finish_non_exhaustive()
    }
}

impl CoordinatorClient {
    /// Builds a lazily connecting client (must run inside the tokio runtime); nothing is
    /// dialled until the first call.
    pub fn new(cfg: CoordinatorConfig) -> Result<Self, CoordinatorError> {
        let channel = Self::dial(&cfg, &cfg.addr)?;
        let addr = cfg.addr.clone();
        Ok(Self {
            cfg,
            current: Mutex::new((addr, channel)),
        })
    }

    /// The address calls currently go to (the configured one, or the last leader hint).
    pub fn current_addr(&self) -> String {
        self.current.lock().0.clone()
    }

    fn dial(cfg: &CoordinatorConfig, addr: &str) -> Result<MeshChannel, CoordinatorError> {
        let mut channel = ChannelConfig::default().with_tls(cfg.tls.clone());
        if let Some(t) = cfg.timeout {
            channel.connect_timeout = t;
        }
        let stack = ClientStackConfig {
            metrics: None,
            retry: cfg.retry.clone(),
            attempt_timeout: cfg.timeout,
        };
        bigfleet_mesh::dial_lazy(addr, &channel, &stack).map_err(|e| CoordinatorError::Address {
            addr: addr.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Runs `call` against the current address; on "not leader" with a hint, once more
    /// against the hinted leader (which becomes the current address).
    pub async fn call<T, F, Fut>(&self, rpc: CoordinatorRpc, call: F) -> Result<T, CoordinatorError>
    where
        F: Fn(RawClient<MeshChannel>) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        self.call_channel(rpc, |ch| {
            call(bigfleet_mesh::with_message_limits!(RawClient::new(ch)))
        })
        .await
    }

    /// [`CoordinatorClient::call`] for any service on the coordinator's listener: `call`
    /// gets the channel and builds its own client.
    pub async fn call_channel<T, F, Fut>(
        &self,
        rpc: CoordinatorRpc,
        call: F,
    ) -> Result<T, CoordinatorError>
    where
        F: Fn(MeshChannel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let (addr, channel) = self.current.lock().clone();
        let status = match self.attempt(&call, channel).await {
            Ok(v) => return Ok(v),
            Err(status) => status,
        };
        let Some(hint) = leader_hint(&status).filter(|h| !same_endpoint(h, &addr)) else {
            return Err(CoordinatorError::Call { addr, rpc, status });
        };
        let leader = with_scheme_of(&addr, &hint);
        tracing::info!(from = %addr, leader = %leader, rpc = rpc.name(), "coordinator is not leader; following the hint");
        let channel = Self::dial(&self.cfg, &leader)?;
        match self.attempt(&call, channel.clone()).await {
            Ok(v) => {
                *self.current.lock() = (leader, channel);
                Ok(v)
            }
            Err(status) => Err(CoordinatorError::Call {
                addr: leader,
                rpc,
                status,
            }),
        }
    }

    async fn attempt<T, F, Fut>(&self, call: &F, channel: MeshChannel) -> Result<T, Status>
    where
        F: Fn(MeshChannel) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        match self.cfg.timeout {
            // The stack bounds each attempt; this bounds the whole call (connect included).
            Some(t) => tokio::time::timeout(t, call(channel))
                .await
                .unwrap_or_else(|_| {
                    Err(Status::deadline_exceeded(format!(
                        "no answer within {}",
                        humantime::format_duration(t)
                    )))
                }),
            None => call(channel).await,
        }
    }

    /// A write RPC: each attempt sends its own copy of `req` (a retry against the hinted
    /// leader resends it) and the empty answer is dropped.
    async fn write<R, U, F, Fut>(
        &self,
        rpc: CoordinatorRpc,
        req: R,
        send: F,
    ) -> Result<(), CoordinatorError>
    where
        R: Clone,
        F: Fn(RawClient<MeshChannel>, R) -> Fut,
        Fut: Future<Output = Result<tonic::Response<U>, Status>>,
    {
        self.call(rpc, |c| {
            let sent = send(c, req.clone());
            async move { sent.await.map(|_| ()) }
        })
        .await
    }

    pub async fn list_shards(&self) -> Result<Vec<pb::ShardRegistryEntry>, CoordinatorError> {
        self.call(CoordinatorRpc::ListShards, |mut c| async move {
            Ok(c.list_shards(pb::ListShardsRequest {})
                .await?
                .into_inner()
                .shards)
        })
        .await
    }

    pub async fn list_shard_reports(
        &self,
    ) -> Result<Vec<pb::ShardReportSnapshot>, CoordinatorError> {
        self.call(CoordinatorRpc::ListShardReports, |mut c| async move {
            Ok(c.list_shard_reports(pb::ListShardReportsRequest::default())
                .await?
                .into_inner()
                .reports)
        })
        .await
    }

    /// Transfers in flight and recently finished, and each shard's domains and pending
    /// instructions (`shard`: only those involving it; empty: all).
    pub async fn list_transfers(
        &self,
        shard: &str,
    ) -> Result<mesh::ListTransfersResponse, CoordinatorError> {
        let req = mesh::ListTransfersRequest {
            shard_id: shard.to_owned(),
        };
        self.call_channel(CoordinatorRpc::ListTransfers, |ch| {
            let req = req.clone();
            async move {
                let mut c = bigfleet_mesh::with_message_limits!(InfoClient::new(ch));
                Ok(c.list_transfers(req).await?.into_inner())
            }
        })
        .await
    }

    pub async fn list_domain_assignments(
        &self,
    ) -> Result<Vec<pb::DomainAssignment>, CoordinatorError> {
        self.call(CoordinatorRpc::ListDomainAssignments, |mut c| async move {
            Ok(
                c.list_domain_assignments(pb::ListDomainAssignmentsRequest {})
                    .await?
                    .into_inner()
                    .assignments,
            )
        })
        .await
    }

    pub async fn assign_domain(
        &self,
        key: &str,
        value: &str,
        shard: &str,
    ) -> Result<(), CoordinatorError> {
        let req = pb::AssignDomainRequest {
            topology_key: key.to_owned(),
            topology_value: value.to_owned(),
            shard_id: shard.to_owned(),
        };
        self.write(CoordinatorRpc::AssignDomain, req, |mut c, req| async move {
            c.assign_domain(req).await
        })
        .await
    }

    pub async fn unassign_domain(&self, key: &str, value: &str) -> Result<(), CoordinatorError> {
        let req = pb::UnassignDomainRequest {
            topology_key: key.to_owned(),
            topology_value: value.to_owned(),
        };
        self.write(
            CoordinatorRpc::UnassignDomain,
            req,
            |mut c, req| async move { c.unassign_domain(req).await },
        )
        .await
    }

    pub async fn remove_shard(&self, shard: &str) -> Result<(), CoordinatorError> {
        let req = pb::RemoveShardRequest {
            shard_id: shard.to_owned(),
        };
        self.write(CoordinatorRpc::RemoveShard, req, |mut c, req| async move {
            c.remove_shard(req).await
        })
        .await
    }

    /// Downloads the leader's latest snapshot: `(meta_json, state)`.
    pub async fn snapshot_save(&self) -> Result<(Vec<u8>, Vec<u8>), CoordinatorError> {
        self.call(CoordinatorRpc::SnapshotSave, |mut c| async move {
            let mut stream = c
                .snapshot_save(pb::SnapshotSaveRequest {})
                .await?
                .into_inner();
            let mut meta = None;
            let mut state = Vec::new();
            while let Some(chunk) = stream.message().await? {
                match chunk.payload {
                    Some(pb::snapshot_save_chunk::Payload::MetaJson(m)) if meta.is_none() => {
                        meta = Some(m);
                    }
                    Some(pb::snapshot_save_chunk::Payload::Data(d)) if meta.is_some() => {
                        state.extend_from_slice(&d);
                    }
                    _ => {
                        return Err(Status::data_loss(
                            "snapshot stream out of order: expected meta_json first, then data",
                        ));
                    }
                }
            }
            let meta = meta
                .ok_or_else(|| Status::data_loss("snapshot stream carried no meta_json frame"))?;
            Ok((meta, state))
        })
        .await
    }
}

/// Whether a leader hint names the endpoint we already talk to (so retrying is pointless).
fn same_endpoint(hint: &str, current: &str) -> bool {
    strip_scheme(hint) == strip_scheme(current)
}

fn strip_scheme(addr: &str) -> &str {
    addr.split_once("://")
        .map_or(addr, |(_, rest)| rest)
        .trim_end_matches('/')
}

/// The hint is `host:port`; keep the scheme the user chose (https means "insist on TLS").
fn with_scheme_of(current: &str, hint: &str) -> String {
    if hint.contains("://") {
        return hint.to_owned();
    }
    match current.split_once("://") {
        Some((scheme, _)) if scheme == "http" || scheme == "https" => format!("{scheme}://{hint}"),
        _ => hint.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_keep_the_scheme_the_user_chose() {
        assert_eq!(with_scheme_of("https://a:1", "b:2"), "https://b:2");
        assert_eq!(with_scheme_of("http://a:1", "b:2"), "http://b:2");
        assert_eq!(with_scheme_of("a:1", "b:2"), "b:2");
        assert_eq!(with_scheme_of("https://a:1", "http://b:2"), "http://b:2");
        assert!(same_endpoint("a:1", "http://a:1/"));
        assert!(!same_endpoint("a:2", "http://a:1"));
    }

    #[test]
    fn code_names_read_like_words() {
        assert_eq!(code_name(Code::PermissionDenied), "permission denied");
        assert_eq!(code_name(Code::Unavailable), "unavailable");
        assert_eq!(code_name(Code::FailedPrecondition), "failed precondition");
    }

    #[test]
    fn read_and_admin_rpcs_name_their_roles() {
        assert_eq!(
            CoordinatorRpc::ListShards.required_roles(),
            "readonly or admin"
        );
        assert_eq!(CoordinatorRpc::AssignDomain.required_roles(), "admin");
        assert_eq!(CoordinatorRpc::SnapshotSave.required_roles(), "admin");
    }
}
