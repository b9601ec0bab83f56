//! A fake coordinator for the client's tests: ReportShard answered by the test's own
//! `report` method, every other RPC UNIMPLEMENTED (the client only ever calls ReportShard),
//! served on a loopback port. Also the one shard-side double, [`View`].

use bigfleet_coordclient::ShardView;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::coordinator_server::{Coordinator, CoordinatorServer};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::net::SocketAddr;

/// `impl Coordinator for $ty`, with ReportShard handed to the type's inherent
/// `async fn report(&self, Request<pb::ShardReport>) -> Result<Response<pb::ReportAck>, Status>`.
/// Needs `Coordinator`, `pb` (`bigfleet_proto::v1alpha1`), `Request`, `Response` and
/// `Status` in scope, and this module mounted as `common`.
macro_rules! coordinator_reporting_to {
    ($ty:ty) => {
        #[tonic::async_trait]
        impl Coordinator for $ty {
            async fn report_shard(
                &self,
                request: Request<pb::ShardReport>,
            ) -> Result<Response<pb::ReportAck>, Status> {
                self.report(request).await
            }
            type SnapshotSaveStream = futures::stream::Empty<Result<pb::SnapshotSaveChunk, Status>>;
            common::unimplemented_rpcs! {
                assign_domain(AssignDomainRequest) -> pb::AssignDomainResponse;
                unassign_domain(UnassignDomainRequest) -> pb::UnassignDomainResponse;
                remove_shard(RemoveShardRequest) -> pb::RemoveShardResponse;
                list_shards(ListShardsRequest) -> pb::ListShardsResponse;
                list_domain_assignments(ListDomainAssignmentsRequest) -> pb::ListDomainAssignmentsResponse;
                list_shard_reports(ListShardReportsRequest) -> pb::ListShardReportsResponse;
                join_raft_cluster(JoinRaftClusterRequest) -> pb::JoinRaftClusterResponse;
                snapshot_save(SnapshotSaveRequest) -> Self::SnapshotSaveStream;
                list_quotas(ListQuotasRequest) -> pb::ListQuotasResponse;
                list_providers(ListProvidersRequest) -> pb::ListProvidersResponse;
            }
        }
    };
}

/// The Coordinator RPCs the test coordinator refuses with UNIMPLEMENTED, written in the
/// shape `#[tonic::async_trait]` gives trait methods (the attribute runs before this macro
/// expands, so the items must already be in that shape).
macro_rules! unimplemented_rpcs {
    ($($method:ident($request:ident) -> $response:ty;)+) => {
        $(
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                _: Request<pb::$request>,
            ) -> ::std::pin::Pin<
                Box<
                    dyn ::std::future::Future<Output = Result<Response<$response>, Status>>
                        + Send
                        + 'async_trait,
                >,
            >
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async { Err(Status::unimplemented("test coordinator: reports only")) })
            }
        )+
    };
}
pub(crate) use unimplemented_rpcs;

pub(crate) use coordinator_reporting_to;

/// Serves `coordinator` on a fresh loopback port in the background and returns the address.
pub async fn serve<C: Coordinator>(coordinator: C) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(CoordinatorServer::new(coordinator))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    addr
}

/// The shard side of the client: a fixed summary and three shortfalls; it records the
/// domains it is told to own, how many domain instructions it applied, and the last term.
#[derive(Default)]
pub struct View {
    pub domains: Mutex<BTreeSet<(String, String)>>,
    pub applied: Mutex<u32>,
    pub term: Mutex<i64>,
}

impl ShardView for View {
    fn summary(&self) -> BoxFuture<'_, pb::ShardSummary> {
        Box::pin(async {
            pb::ShardSummary {
                total_machines: 10,
                free_machines: 4,
                provider_address: "unix:///p.sock".into(),
                ..Default::default()
            }
        })
    }
    fn shortfalls(&self, limit: usize) -> Vec<pb::Shortfall> {
        (0..3)
            .map(|i| pb::Shortfall {
                priority: 10 - i,
                age_cycles: 1,
                ..Default::default()
            })
            .take(limit)
            .collect()
    }
    fn observe_term(&self, term: i64) {
        *self.term.lock() = term;
    }
    fn assign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        *self.applied.lock() += 1;
        self.domains.lock().insert((key.into(), value.into()));
        Ok(())
    }
    fn unassign_domain(&self, key: &str, value: &str) -> Result<(), String> {
        *self.applied.lock() += 1;
        self.domains.lock().remove(&(key.into(), value.into()));
        Ok(())
    }
}
