//! openraft's transport over the internal `bigfleet.mesh.v1.Raft` gRPC service: each openraft
//! RPC is one unary call carrying the serde_json-encoded openraft request, answered with the
//! encoded response or the encoded remote error. One lazily connected channel per peer
//! address, shared by every replication stream to that peer.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_mesh::{ChannelConfig, Target};
use bigfleet_proto::mesh::v1::raft_client::RaftClient;
use bigfleet_proto::mesh::v1::raft_reply::Outcome;
use bigfleet_proto::mesh::v1::raft_server::{Raft as RaftRpc, RaftServer};
use bigfleet_proto::mesh::v1::{RaftReply, RaftRequest};
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

use crate::raft_types::{CoordNode, NodeId, Raft, TypeConfig};

/// How long a peer that refused connections is left alone before openraft retries it.
/// Short, because on loopback and in a pod network "refused" usually means "restarting".
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

/// Creates per-peer clients; channels are cached by peer id and rebuilt when the peer's
/// address changes (a restarted replica that re-joined at a new address).
#[derive(Clone)]
pub struct Network {
    self_id: NodeId,
    channels: Arc<Mutex<HashMap<NodeId, (String, Channel)>>>,
}

impl Network {
    pub fn new(self_id: NodeId) -> Self {
        Self {
            self_id,
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
        let t: Target = addr.parse().map_err(|e| format!("{e}"))?;
        let cfg = ChannelConfig {
            // Raft's port is plaintext by design (ADR-0048 scope); peers are replicas.
            tls: None,
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
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
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

fn decode<T: DeserializeOwned>(req: &RaftRequest) -> Result<T, Status> {
    serde_json::from_slice(&req.payload)
        .map_err(|e| Status::invalid_argument(format!("undecodable raft payload: {e}")))
}

fn reply<T: Serialize, E: Serialize>(
    res: Result<T, E>,
) -> Result<tonic::Response<RaftReply>, Status> {
    let outcome = match res {
        Ok(v) => {
            Outcome::Payload(serde_json::to_vec(&v).map_err(|e| Status::internal(e.to_string()))?)
        }
        Err(e) => {
            Outcome::Error(serde_json::to_vec(&e).map_err(|e| Status::internal(e.to_string()))?)
        }
    };
    Ok(tonic::Response::new(RaftReply {
        outcome: Some(outcome),
    }))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req: AppendEntriesRequest<TypeConfig> = decode(request.get_ref())?;
        reply(self.raft.append_entries(req).await)
    }

    async fn vote(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req: VoteRequest<NodeId> = decode(request.get_ref())?;
        reply(self.raft.vote(req).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let req: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        reply(self.raft.install_snapshot(req).await)
    }

    /// Leader forwarding for an encoded command. Our public RPCs are leader-only (callers
    /// re-dial the hinted leader), so nothing in the coordinator uses this yet; it is served
    /// for tooling that prefers forwarding.
    async fn client_write(
        &self,
        request: Request<RaftRequest>,
    ) -> Result<tonic::Response<RaftReply>, Status> {
        let cmd: crate::fsm::Command = decode(request.get_ref())?;
        reply(self.raft.client_write(cmd).await)
    }
}
