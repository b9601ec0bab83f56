//! A fake coordinator for the client's tests: ReportShard answered by the test's own
//! `report` method, every other RPC UNIMPLEMENTED (the client only ever calls ReportShard).

/// `impl Coordinator for $ty`, with ReportShard handed to the type's inherent
/// `async fn report(&self, Request<pb::ShardReport>) -> Result<Response<pb::ReportAck>, Status>`.
/// Needs `Coordinator`, `pb` (`bigfleet_proto::v1alpha1`), `Request`, `Response` and
/// `Status` in scope.
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
            async fn assign_domain(
                &self,
                _: Request<pb::AssignDomainRequest>,
            ) -> Result<Response<pb::AssignDomainResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn unassign_domain(
                &self,
                _: Request<pb::UnassignDomainRequest>,
            ) -> Result<Response<pb::UnassignDomainResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn remove_shard(
                &self,
                _: Request<pb::RemoveShardRequest>,
            ) -> Result<Response<pb::RemoveShardResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn list_shards(
                &self,
                _: Request<pb::ListShardsRequest>,
            ) -> Result<Response<pb::ListShardsResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn list_domain_assignments(
                &self,
                _: Request<pb::ListDomainAssignmentsRequest>,
            ) -> Result<Response<pb::ListDomainAssignmentsResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn list_shard_reports(
                &self,
                _: Request<pb::ListShardReportsRequest>,
            ) -> Result<Response<pb::ListShardReportsResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn join_raft_cluster(
                &self,
                _: Request<pb::JoinRaftClusterRequest>,
            ) -> Result<Response<pb::JoinRaftClusterResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            type SnapshotSaveStream = futures::stream::Empty<Result<pb::SnapshotSaveChunk, Status>>;
            async fn snapshot_save(
                &self,
                _: Request<pb::SnapshotSaveRequest>,
            ) -> Result<Response<Self::SnapshotSaveStream>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn list_quotas(
                &self,
                _: Request<pb::ListQuotasRequest>,
            ) -> Result<Response<pb::ListQuotasResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
            async fn list_providers(
                &self,
                _: Request<pb::ListProvidersRequest>,
            ) -> Result<Response<pb::ListProvidersResponse>, Status> {
                Err(Status::unimplemented("test coordinator: reports only"))
            }
        }
    };
}
pub(crate) use coordinator_reporting_to;
