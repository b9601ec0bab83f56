//! Read services on the public port, answered by decide: `ShardRead.InspectNeeds` (the
//! original shard serves it next to `Shard`) and `ShardInfo` (for svc-inspect): `Describe`,
//! where the gateway adds its own session count, and `RecentActions` / `ListMachines`,
//! passed through as they are.

use std::pin::Pin;
use std::sync::Arc;

use bigfleet_proto::mesh::v1::shard_info_server::ShardInfo;
use bigfleet_proto::mesh::v1::{
    DescribeShardRequest, ListMachinesRequest, ListMachinesResponse, RecentActionsRequest,
    RecentActionsResponse, ShardDescription,
};
use bigfleet_proto::v1alpha1::shard_read_server::ShardRead;
use bigfleet_proto::v1alpha1::{InspectNeedsRequest, InspectNeedsResponse};
use futures::Stream;
use tonic::{Code, Request, Response, Status};

use crate::state::GatewayState;

/// Proxies ShardRead and ShardInfo to decide. Role checks (readonly or admin under mTLS)
/// happen in the server stack's authorization layer.
#[derive(Debug, Clone)]
pub struct ReadProxy {
    gw: Arc<GatewayState>,
}

impl ReadProxy {
    pub fn new(gw: Arc<GatewayState>) -> Self {
        Self { gw }
    }
}

/// Decide's answer without decide's response metadata: the caller talks to the gateway.
fn body_only<T>(resp: Response<T>) -> Response<T> {
    Response::new(resp.into_inner())
}

type NeedsStream = Pin<Box<dyn Stream<Item = Result<InspectNeedsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ShardRead for ReadProxy {
    type InspectNeedsStream = NeedsStream;

    async fn inspect_needs(
        &self,
        request: Request<InspectNeedsRequest>,
    ) -> Result<Response<NeedsStream>, Status> {
        let forward = Request::new(request.into_inner());
        let upstream = self
            .gw
            .decide
            .shard_read()
            .inspect_needs(forward)
            .await?
            .into_inner();
        Ok(Response::new(Box::pin(upstream)))
    }
}

#[tonic::async_trait]
impl ShardInfo for ReadProxy {
    async fn describe(
        &self,
        request: Request<DescribeShardRequest>,
    ) -> Result<Response<ShardDescription>, Status> {
        let gw = &self.gw;
        let sessions = u32::try_from(gw.registry.count()).unwrap_or(u32::MAX);
        let mut desc = match gw.decide.shard_info().describe(request.into_inner()).await {
            Ok(resp) => resp.into_inner(),
            // A decide that does not serve ShardInfo: what the gateway knows alone.
            Err(status) if status.code() == Code::Unimplemented => ShardDescription {
                shard_epoch: gw.decide.epoch_term().0,
                ..ShardDescription::default()
            },
            Err(status) => return Err(status),
        };
        if desc.shard_id.is_empty() {
            desc.shard_id.clone_from(&gw.settings.shard_id);
        }
        desc.sessions = sessions;
        Ok(Response::new(desc))
    }

    async fn recent_actions(
        &self,
        request: Request<RecentActionsRequest>,
    ) -> Result<Response<RecentActionsResponse>, Status> {
        let mut decide = self.gw.decide.shard_info();
        decide
            .recent_actions(request.into_inner())
            .await
            .map(body_only)
    }

    async fn list_machines(
        &self,
        request: Request<ListMachinesRequest>,
    ) -> Result<Response<ListMachinesResponse>, Status> {
        let mut decide = self.gw.decide.shard_info();
        decide
            .list_machines(request.into_inner())
            .await
            .map(body_only)
    }
}
