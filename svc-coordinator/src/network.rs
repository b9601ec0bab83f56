//! openraft's transport over the internal `bigfleet.mesh.v1.Raft` gRPC service: each openraft
//! RPC is one unary call carrying the serde_json-encoded openraft request, answered with the
//! encoded response or the encoded remote error. One lazily connected channel per peer
//! address, shared by every replication stream to that peer.
//!
//! Under mTLS the Raft port is the process's own TLS config, and a call is accepted only
//! from `bigfleet://coordinator/<id>` whose node id is the request's `from_node_id`, the
//! vote's leader or candidate, and a member or learner of this replica's configuration (or
//! any replica, while this one has no configuration yet and waits to be joined) — ADR-0100.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::{BackoffPolicy, ChannelConfig, Peer, PeerIdentity, Target, peer_of};
use bigfleet_proto::mesh::v1::raft_client::RaftClient;
use bigfleet_proto::mesh::v1::raft_reply::Outcome;
use bigfleet_proto::mesh::v1::raft_server::{Raft as RaftRpc, RaftServer};
use bigfleet_proto::mesh::v1::{RaftReply, RaftRequest};
use openraft::Vote;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::raft_types::{CoordNode, NodeId, Raft, TypeConfig, node_id_of};

/// How long a peer that refused connections is left alone before openraft retries it:
/// 200 ms growing to 1 s, jittered so the other replicas do not knock in step. Short,
/// because on loopback and in a pod network "refused" usually means "restarting".
const UNREACHABLE_BACKOFF: BackoffPolicy =
    BackoffPolicy::new(Duration::from_millis(200), Duration::from_secs(1));

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

/// Creates per-peer clients; channels are cached by peer id and rebuilt when the peer's
/// address changes (a restarted replica that re-joined at a new address).
#[derive(Clone)]
pub struct Network {
    self_id: NodeId,
    tls: Option<Arc<rustls::ClientConfig>>,
    channels: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
}

impl Network {
    /// `tls`: the process's client config (mTLS to peers' Raft ports), `None` in plaintext.
    pub fn new(self_id: NodeId, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            self_id,
            tls,
            channels: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn channel(&self, target: NodeId, addr: &str) -> Result<Channel, String> {
        let mut map = self.channels.lock();
        if let Some((cached, ch)) = map.get(&target)
            && cached == addr
        {
            return Ok(ch.clone());
        }
        // A bare host:port is dialled with the process's transport: https under mTLS.
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let url = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("{scheme}://{addr}")
        };
        let t: Target = url.parse().map_err(|e| format!("{e}"))?;
        let cfg = ChannelConfig {
            tls: self.tls.clone(),
            connect_timeout: Duration::from_secs(1),
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(5),
            ..ChannelConfig::default()
        };
        let ch = bigfleet_mesh::connect_lazy(&t, &cfg).map_err(|e| e.to_string())?;
        map.insert(target, (addr.to_owned(), ch.clone()));
        Ok(ch)
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &CoordNode) -> PeerClient {
        PeerClient {
            self_id: self.self_id,
            target,
            channel: self.channel(target, &node.raft_addr),
        }
    }
}

/// One peer, as seen by one replication stream (or one election).
pub struct PeerClient {
    self_id: NodeId,
    target: NodeId,
    channel: Result<Channel, String>,
}

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: Rpc,
        req: &Req,
        ttl: Duration,
    ) -> Result<Resp, RPCError<NodeId, CoordNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let channel = match &self.channel {
            Ok(c) => c.clone(),
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                    e.clone(),
                ))));
            }
        };
        let payload =
            serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = Request::new(RaftRequest {
            payload,
            from_node_id: self.self_id,
        });
        request.set_timeout(ttl);
        let mut client = bigfleet_mesh::with_message_limits!(RaftClient::new(channel));
        let reply = match rpc {
            Rpc::AppendEntries => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|s| status_to_rpc_error(&s))?.into_inner();
        match reply.outcome {
            Some(Outcome::Payload(p)) => {
                serde_json::from_slice(&p).map_err(|e| RPCError::Network(NetworkError::new(&e)))
            }
            Some(Outcome::Error(e)) => {
                let err: E = serde_json::from_slice(&e)
                    .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
                Err(RPCError::RemoteError(RemoteError::new(self.target, err)))
            }
            None => Err(RPCError::Network(NetworkError::new(&TransportError(
                "empty raft reply".into(),
            )))),
        }
    }
}

/// "Peer not reached" becomes `Unreachable` (openraft backs off) — everything else is a
/// network error retried on the next heartbeat.
fn status_to_rpc_error<E: std::error::Error>(s: &Status) -> RPCError<NodeId, CoordNode, E> {
    let err = TransportError(format!("{}: {}", s.code(), s.message()));
    match s.code() {
        Code::Unavailable | Code::FailedPrecondition => {
            RPCError::Unreachable(Unreachable::new(&err))
        }
        _ => RPCError::Network(NetworkError::new(&err)),
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, CoordNode, RaftError<NodeId>>> {
        self.call(Rpc::AppendEntries, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, CoordNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(Rpc::InstallSnapshot, &rpc, option.hard_ttl())
            .await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, CoordNode, RaftError<NodeId>>> {
        self.call(Rpc::Vote, &rpc, option.hard_ttl()).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(bigfleet_mesh::Backoff::new(UNREACHABLE_BACKOFF))
    }
}

// === server side ===

/// Serves openraft's RPCs from peers.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    pub fn new(raft: Raft) -> Self {
        Self { raft }
    }

    pub fn into_server(self) -> RaftServer<Self> {
        bigfleet_mesh::with_message_limits!(RaftServer::new(self))
    }
}

/// Binds a Raft call to its sender (ADR-0100). `named` is the node id the payload itself
/// names as leader or candidate. Plaintext (loopback-only, or `--insecure-plaintext`)
/// callers skip the certificate checks, as on every other port.
fn authorize(
    raft: &Raft,
    peer: Option<&Peer>,
    from: NodeId,
    named: Option<NodeId>,
) -> Result<(), Status> {
    let name = match peer {
        None | Some(Peer::Plaintext | Peer::Local) => return Ok(()),
        Some(Peer::Verified(PeerIdentity::Coordinator(name))) => name,
        Some(Peer::Verified(id)) => {
            return Err(Status::permission_denied(format!(
                "{id} may not call the raft port (requires bigfleet://coordinator/<id>)"
            )));
        }
        Some(Peer::Invalid(e)) => return Err(Status::permission_denied(e.to_string())),
    };
    if node_id_of(name) != from {
        return Err(Status::permission_denied(format!(
            "bigfleet://coordinator/{name} may not speak for raft node {from}"
        )));
    }
    if named.is_some_and(|n| n != from) {
        return Err(Status::permission_denied(format!(
            "raft node {from} may not send a message for another node"
        )));
    }
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let known = membership.nodes().any(|(id, _)| *id == from);
    // A replica that has never been configured (fresh, waiting to be joined) has no member
    // list to check against; the certificate binding above still holds.
    let unconfigured = membership.nodes().next().is_none();
    if !known && !unconfigured {
        return Err(Status::permission_denied(format!(
            "raft node {from} ({name}) is not a member or learner of this group"
        )));
    }
    Ok(())
}

fn decode<T: DeserializeOwned>(req: &RaftRequest) -> Result<T, Status> {
    serde_json::from_slice(&req.payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft payload: {e}")))
}

/// A reply that cannot be encoded is a bug: logged, answered with a generic INTERNAL.
fn encoding_failed(e: serde_json::Error) -> Status {
    bigfleet_mesh::internal_status(&format_args!("encoding raft reply: {e}"))
}

fn reply<T: Serialize, E: Serialize>(
    res: Result<T, E>,
) -> Result<tonic::Response<RaftReply>, Status> {
    let outcome = match res {
        Ok(v) => Outcome::Payload(serde_json::to_vec(&v).map_err(encoding_failed)?),
        Err(e) => Outcome::Error(serde_json::to_vec(&e).map_err(encoding_failed)?),
    };
    Ok(tonic::Response::new(RaftReply {
        outcome: Some(outcome),
    }))
}

impl RaftService {
    /// Decodes a peer's request and checks that the caller may speak for the
    /// node its vote names (the candidate or the leader).
    fn admit<T: DeserializeOwned>(
        &self,
        request: &Request<RaftRequest>,
        vote: impl FnOnce(&T) -> &Vote<NodeId>,
    ) -> Result<T, Status> {
        let req: T = decode(request.get_ref())?;
        authorize(
            &self.raft,
            peer_of(request),
            request.get_ref().from_node_id,
            vote(&req).leader_id().voted_for(),
        )?;
        Ok(req)
    }
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req = self.admit(&request, |r: &AppendEntriesRequest<TypeConfig>| &r.vote)?;
        reply(self.raft.append_entries(req).await)
    }

    async fn vote(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req = self.admit(&request, |r: &VoteRequest<NodeId>| &r.vote)?;
        reply(self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req = self.admit(&request, |r: &InstallSnapshotRequest<TypeConfig>| &r.vote)?;
        reply(self.raft.install_snapshot(req).await)
    }
}
