//! Calls into a running mesh, as its tests and `up`'s progress view make them: gRPC
//! channels presenting a role, the providers' `List`, the shards' `InspectNeeds` and
//! `Describe`, inspect's `FleetSummary`, the fake providers' admin API and `/metrics`.

use std::net::SocketAddr;
use std::time::Duration;

use bigfleet_mesh::{ChannelConfig, ClientStackConfig, MeshChannel, RetryPolicy};
use bigfleet_proto::mesh::v1 as meshpb;
use bigfleet_proto::v1alpha1 as pb;

use super::{Mesh, UpError};
use crate::up::probe::{self, Sample};

impl Mesh {
    /// A channel to `target` presenting `role` under TLS.
    pub async fn channel(&self, target: &str, role: &str) -> Result<MeshChannel, UpError> {
        let cfg = ChannelConfig {
            connect_timeout: Duration::from_secs(5),
            ..ChannelConfig::default()
        }
        .with_tls(self.client_tls(role)?);
        let stack = ClientStackConfig {
            metrics: None,
            retry: RetryPolicy::none(),
            attempt_timeout: Some(Duration::from_secs(10)),
        };
        bigfleet_mesh::dial(target, &cfg, &stack)
            .await
            .map_err(|e| UpError::Rpc(format!("dialling {target}: {e}")))
    }

    /// The gateway URI of shard `i` (what operators dial).
    pub fn gateway_target(&self, i: usize) -> String {
        self.tcp_target(&self.ports.shards[i].gateway_grpc)
    }

    /// Every machine of shard `i`'s provider.
    pub async fn list_machines(&self, i: usize) -> Result<Vec<pb::Machine>, UpError> {
        let target = self.ports.shards[i].provider.clone();
        list_machines(&self.channel(&target, &format!("shard/shard-{i}")).await?).await
    }

    /// `ShardRead.InspectNeeds` on shard `i`'s public port (`cluster` empty: all).
    pub async fn inspect_needs(
        &self,
        i: usize,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let ch = self.channel(&self.gateway_target(i), "readonly").await?;
        inspect_needs(ch, cluster).await
    }

    /// `ShardRead.InspectNeeds` on any gateway's public port (`host:port`), e.g. a second
    /// incarnation's.
    pub async fn inspect_needs_at(
        &self,
        gateway_grpc: &str,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let ch = self
            .channel(&self.tcp_target(gateway_grpc), "readonly")
            .await?;
        inspect_needs(ch, cluster).await
    }

    /// A read-only channel to svc-inspect's gRPC port.
    async fn inspect_channel(&self) -> Result<MeshChannel, UpError> {
        let p = self
            .ports
            .inspect
            .as_ref()
            .ok_or_else(|| UpError::Config("no inspect in this mesh".into()))?;
        self.channel(&self.tcp_target(&p.grpc), "readonly").await
    }

    /// `ShardRead.InspectNeeds` fleet-wide through svc-inspect.
    pub async fn fleet_inspect_needs(
        &self,
        cluster: &str,
    ) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
        let ch = self.inspect_channel().await?;
        inspect_needs(ch, cluster).await
    }

    /// `Inspect.FleetSummary` through svc-inspect.
    pub async fn fleet_summary(&self) -> Result<meshpb::FleetSummaryResponse, UpError> {
        let ch = self.inspect_channel().await?;
        let mut c =
            bigfleet_mesh::with_message_limits!(meshpb::inspect_client::InspectClient::new(ch));
        c.fleet_summary(meshpb::FleetSummaryRequest { max_shortfalls: 0 })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| UpError::Rpc(format!("FleetSummary: {e}")))
    }

    /// `ShardInfo.Describe` of shard `i`.
    pub async fn describe(&self, i: usize) -> Result<meshpb::ShardDescription, UpError> {
        let ch = self.channel(&self.gateway_target(i), "readonly").await?;
        let mut c = bigfleet_mesh::with_message_limits!(
            meshpb::shard_info_client::ShardInfoClient::new(ch)
        );
        c.describe(meshpb::DescribeShardRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|e| UpError::Rpc(format!("Describe: {e}")))
    }

    /// Shard `i`'s fake provider admin address (failure injection).
    pub fn provider_admin(&self, i: usize) -> Option<SocketAddr> {
        self.ports
            .providers
            .get(i)
            .and_then(|p| p.admin_http.as_deref())
            .and_then(|a| a.parse().ok())
    }

    /// `POST` a JSON body to shard `i`'s fake provider admin API; returns the response body.
    pub async fn provider_admin_post(
        &self,
        i: usize,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<serde_json::Value, UpError> {
        let addr = self
            .provider_admin(i)
            .ok_or_else(|| UpError::Config("no fake provider admin api".into()))?;
        let (code, text) = probe::http_request(addr, "POST", path, Some(&body.to_string()))
            .await
            .map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))?;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or(serde_json::Value::Null);
        if code != 200 {
            return Err(UpError::Rpc(format!("admin {path}: {code} {text}")));
        }
        Ok(v)
    }

    /// `GET` from shard `i`'s fake provider admin API.
    pub async fn provider_admin_get(
        &self,
        i: usize,
        path: &str,
    ) -> Result<serde_json::Value, UpError> {
        let addr = self
            .provider_admin(i)
            .ok_or_else(|| UpError::Config("no fake provider admin api".into()))?;
        let (code, text) = probe::http_request(addr, "GET", path, None)
            .await
            .map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))?;
        if code != 200 {
            return Err(UpError::Rpc(format!("admin {path}: {code} {text}")));
        }
        serde_json::from_str(&text).map_err(|e| UpError::Rpc(format!("admin {path}: {e}")))
    }

    /// `/metrics` of a child (by name: `shard-0-decide`, `shard-0-execute`, ...).
    pub async fn metrics(&self, name: &str) -> Result<Vec<Sample>, UpError> {
        let i = self.index(name)?;
        let addr = self.children[i]
            .ready
            .ok_or_else(|| UpError::Config(format!("{name} has no ops port")))?;
        let (code, body) = probe::http_get(addr, "/metrics", Duration::from_secs(3))
            .await
            .map_err(|e| UpError::Rpc(format!("{name} /metrics: {e}")))?;
        if code != 200 {
            return Err(UpError::Rpc(format!("{name} /metrics: {code}")));
        }
        Ok(probe::parse_metrics(&body))
    }

    /// The coordinator replica that is the Raft leader now (`bigfleet_coordinator_is_leader`
    /// on its ops port), by child name.
    pub async fn coordinator_leader(&self) -> Option<String> {
        for name in self.child_names() {
            if (name == "coordinator" || name.starts_with("coordinator-"))
                && let Ok(m) = self.metrics(&name).await
                && probe::sum(&m, "bigfleet_coordinator_is_leader", &[]) >= 1.0
            {
                return Some(name);
            }
        }
        None
    }
}

/// Every machine a provider lists.
pub async fn list_machines(ch: &MeshChannel) -> Result<Vec<pb::Machine>, UpError> {
    let mut c = bigfleet_mesh::with_message_limits!(
        pb::capacity_provider_client::CapacityProviderClient::new(ch.clone())
    );
    c.list(pb::ListFilter::default())
        .await
        .map(|r| r.into_inner().machines)
        .map_err(|e| UpError::Rpc(format!("provider List: {e}")))
}

/// Reads a whole `InspectNeeds` stream.
pub async fn inspect_needs(
    ch: MeshChannel,
    cluster: &str,
) -> Result<(pb::InspectNeedsHeader, Vec<pb::NeedView>), UpError> {
    let mut c =
        bigfleet_mesh::with_message_limits!(pb::shard_read_client::ShardReadClient::new(ch));
    let mut stream = c
        .inspect_needs(pb::InspectNeedsRequest {
            cluster_id: cluster.to_owned(),
            limit: 0,
        })
        .await
        .map_err(|e| UpError::Rpc(format!("InspectNeeds: {e}")))?
        .into_inner();
    let mut header = pb::InspectNeedsHeader::default();
    let mut needs = Vec::new();
    while let Some(frame) = stream
        .message()
        .await
        .map_err(|e| UpError::Rpc(format!("InspectNeeds: {e}")))?
    {
        match frame.frame {
            Some(pb::inspect_needs_response::Frame::Header(h)) => header = h,
            Some(pb::inspect_needs_response::Frame::Need(n)) => needs.push(n),
            None => {}
        }
    }
    Ok((header, needs))
}
