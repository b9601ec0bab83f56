//! The gRPC surface: the public `bigfleet.v1alpha1.ShardRead` answered fleet-wide, and the
//! internal `bigfleet.mesh.v1.Inspect` overview. Under mTLS only readonly and admin callers
//! get through ([`authz_policy`]); health and reflection stay open.

use std::pin::Pin;
use std::sync::Arc;

use bigfleet_mesh::{AuthzPolicy, Role};
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::mesh::v1::inspect_server::Inspect;
use bigfleet_proto::service_names;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::shard_read_server::ShardRead;
use futures::Stream;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use crate::error::InspectError;
use crate::fleet::Fleet;

/// Response metadata listing the shards (`id=error`, `;`-separated) that did not answer a
/// fleet-wide InspectNeeds; absent when all did.
pub const UNREACHABLE_SHARDS_METADATA_KEY: &str = "x-bigfleet-unreachable-shards";
/// Response metadata set when the shard list came from an earlier coordinator answer.
pub const COORDINATOR_ERROR_METADATA_KEY: &str = "x-bigfleet-coordinator-error";

/// Shortfalls in a FleetSummary when the request says 0.
const DEFAULT_MAX_SHORTFALLS: usize = 100;

/// The roles that may read fleet state (ADR-0060).
pub(crate) const READERS: &[Role] = &[Role::Readonly, Role::Admin];

/// Who may call svc-inspect under mTLS: readonly and admin, on both services (ADR-0060).
pub fn authz_policy() -> AuthzPolicy {
    AuthzPolicy::deny_by_default()
        .allow_service(service_names::SHARD_READ, READERS)
        .allow_service(service_names::INSPECT, READERS)
}

/// Both gRPC services over one [`Fleet`].
#[derive(Debug, Clone)]
pub struct InspectGrpc {
    fleet: Arc<Fleet>,
}

impl InspectGrpc {
    pub fn new(fleet: Arc<Fleet>) -> Self {
        Self { fleet }
    }
}

/// What `ShardRead.InspectNeeds` streams back.
pub(crate) type NeedsStream =
    Pin<Box<dyn Stream<Item = Result<pb::InspectNeedsResponse, Status>> + Send>>;

/// An InspectNeeds answer as a shard sends it: the header frame, then one frame per row in
/// the order given.
pub(crate) fn needs_stream(
    header: pb::InspectNeedsHeader,
    rows: impl IntoIterator<Item = pb::NeedView>,
) -> NeedsStream {
    let frames: Vec<_> = std::iter::once(pb::inspect_needs_response::Frame::Header(header))
        .chain(
            rows.into_iter()
                .map(pb::inspect_needs_response::Frame::Need),
        )
        .map(|f| Ok(pb::InspectNeedsResponse { frame: Some(f) }))
        .collect();
    Box::pin(tokio_stream::iter(frames))
}

#[tonic::async_trait]
impl ShardRead for InspectGrpc {
    type InspectNeedsStream = NeedsStream;

    async fn inspect_needs(
        &self,
        request: Request<pb::InspectNeedsRequest>,
    ) -> Result<Response<Self::InspectNeedsStream>, Status> {
        let req = request.into_inner();
        let limit = usize::try_from(req.limit).map_err(|_| {
            Status::from(InspectError::InvalidArgument(format!(
                "limit must not be negative (got {})",
                req.limit
            )))
        })?;
        let needs = self.fleet.needs(&req.cluster_id, limit).await?;
        let unreachable: Vec<String> = needs
            .unreachable()
            .map(|s| format!("{}={}", s.shard_id, s.error))
            .collect();
        if !needs.shards.is_empty() && unreachable.len() == needs.shards.len() {
            return Err(InspectError::AllShardsUnreachable(unreachable.join("; ")).into());
        }
        let mut response = Response::new(needs_stream(
            needs.header(),
            needs.rows.iter().map(|r| r.view.clone()),
        ));
        if !unreachable.is_empty() {
            insert_metadata(
                &mut response,
                UNREACHABLE_SHARDS_METADATA_KEY,
                &unreachable.join("; "),
            );
        }
        if !needs.coordinator_error.is_empty() {
            insert_metadata(
                &mut response,
                COORDINATOR_ERROR_METADATA_KEY,
                &needs.coordinator_error,
            );
        }
        Ok(response)
    }
}

#[tonic::async_trait]
impl Inspect for InspectGrpc {
    async fn fleet_summary(
        &self,
        request: Request<mesh::FleetSummaryRequest>,
    ) -> Result<Response<mesh::FleetSummaryResponse>, Status> {
        let max = match request.into_inner().max_shortfalls {
            0 => DEFAULT_MAX_SHORTFALLS,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Ok(Response::new(self.fleet.overview().await.to_proto(max)))
    }

    async fn recent_actions(
        &self,
        request: Request<mesh::RecentActionsRequest>,
    ) -> Result<Response<mesh::RecentActionsResponse>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.fleet.recent_actions(&req).await?))
    }

    async fn list_machines(
        &self,
        request: Request<mesh::ListMachinesRequest>,
    ) -> Result<Response<mesh::ListMachinesResponse>, Status> {
        let req = request.into_inner();
        Ok(Response::new(self.fleet.list_machines(&req).await?))
    }
}

/// Metadata values must be visible ASCII; anything else is replaced so a strange error text
/// can never break the response.
fn insert_metadata<T>(response: &mut Response<T>, key: &'static str, value: &str) {
    let clean: String = value
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(2048)
        .collect();
    if let Ok(v) = MetadataValue::try_from(clean.as_str()) {
        response.metadata_mut().insert(key, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_mesh::{Peer, PeerIdentity};

    #[test]
    fn only_readonly_and_admin_may_read() {
        let p = authz_policy();
        let read = "/bigfleet.v1alpha1.ShardRead/InspectNeeds";
        let summary = "/bigfleet.mesh.v1.Inspect/FleetSummary";
        let actions = "/bigfleet.mesh.v1.Inspect/RecentActions";
        let machines = "/bigfleet.mesh.v1.Inspect/ListMachines";
        for path in [read, summary, actions, machines] {
            assert!(
                p.check(path, &Peer::Verified(PeerIdentity::Readonly))
                    .is_ok()
            );
            assert!(p.check(path, &Peer::Verified(PeerIdentity::Admin)).is_ok());
            assert!(
                p.check(path, &Peer::Verified(PeerIdentity::Shard("s1".into())))
                    .is_err()
            );
            assert!(
                p.check(path, &Peer::Verified(PeerIdentity::Cluster("c".into())))
                    .is_err()
            );
            assert!(
                p.check(
                    path,
                    &Peer::Verified(PeerIdentity::ShardExecute("s1".into()))
                )
                .is_err()
            );
        }
        assert!(
            p.check(
                "/grpc.health.v1.Health/Check",
                &Peer::Verified(PeerIdentity::Cluster("c".into()))
            )
            .is_ok()
        );
    }

    #[test]
    fn metadata_values_are_sanitised() {
        let mut r = Response::new(());
        insert_metadata(
            &mut r,
            UNREACHABLE_SHARDS_METADATA_KEY,
            "s1=unavailable: naïve\nline",
        );
        let v = r.metadata().get(UNREACHABLE_SHARDS_METADATA_KEY).unwrap();
        assert_eq!(v.to_str().unwrap(), "s1=unavailable: na?ve?line");
    }
}
