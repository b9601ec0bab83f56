//! The conformance suite against the fake over TCP and over a Unix socket (the CI
//! self-test), against an asynchronous fake, against a deliberately broken provider (the
//! suite must be able to fail), and — `#[ignore]`d — against an external provider named
//! by `BIGFLEET_PROVIDER_TARGET`.

use std::sync::Arc;
use std::time::Duration;

use bigfleet_fake_provider::conformance::{self, Report};
use bigfleet_fake_provider::{
    Completion, FakeProvider, ProviderConfig, ServerHandle, TransitionModel, connect, spawn_tcp,
    spawn_uds,
};
use bigfleet_proto::v1alpha1::capacity_provider_server::{
    CapacityProvider, CapacityProviderServer,
};
use bigfleet_proto::v1alpha1::{
    ConfigureRequest, CreateRequest, DeleteRequest, DrainRequest, ListFilter, Machine, MachineList,
    MachineRef, TransitionAck,
};
use tonic::{Request, Response, Status};

async fn run_all(target: &str) -> Report {
    let client = connect(target).await.expect("connect");
    conformance::run_suite(&client, &conformance::cases(), |r| {
        eprintln!("{}", r.line())
    })
    .await
}

fn assert_all_passed(report: &Report) {
    let failures: Vec<String> = report.failures().iter().map(|r| r.line()).collect();
    assert!(
        failures.is_empty(),
        "{}\n{}",
        report.summary(),
        failures.join("\n")
    );
    assert_eq!(report.results.len(), conformance::cases().len());
}

/// The whole suite, then the fake-only readiness case (ADR-0056), against `server`.
async fn suite_and_readiness_pass(server: &ServerHandle, provider: &FakeProvider) {
    let report = run_all(&server.target()).await;
    assert_all_passed(&report);

    let client = connect(&server.target()).await.unwrap();
    let readiness = conformance::node_readiness_adr0056(client, provider).await;
    assert!(readiness.is_ok(), "{readiness:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_passes_against_the_fake_over_tcp() {
    let provider = Arc::new(FakeProvider::builtin());
    let server = spawn_tcp("127.0.0.1:0".parse().unwrap(), provider.clone())
        .await
        .unwrap();
    suite_and_readiness_pass(&server, &provider).await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_passes_against_the_fake_over_uds() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Arc::new(FakeProvider::builtin());
    let server = spawn_uds(&dir.path().join("provider.sock"), provider.clone())
        .await
        .unwrap();
    assert!(server.target().starts_with("unix://"));
    suite_and_readiness_pass(&server, &provider).await;
    server.shutdown().await;
}

/// An asynchronous provider (every transition takes 150 ms, Delete unimplemented) must
/// pass too: the suite waits for states instead of assuming instant answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_passes_against_an_async_fake_without_delete() {
    let provider = Arc::new(
        FakeProvider::from_catalog(
            &bigfleet_fake_provider::Catalog::builtin(),
            ProviderConfig {
                transitions: TransitionModel::all(Completion::After(Duration::from_millis(150))),
                delete_supported: false,
                ..ProviderConfig::default()
            },
        )
        .unwrap(),
    );
    let server = spawn_tcp("127.0.0.1:0".parse().unwrap(), provider)
        .await
        .unwrap();
    let report = run_all(&server.target()).await;
    assert_all_passed(&report);
    let lifecycle = report
        .results
        .iter()
        .find(|r| r.name == "FullLifecycle")
        .unwrap();
    assert_eq!(
        lifecycle.outcome,
        Ok(Some("Delete is unimplemented (allowed)".into()))
    );
    server.shutdown().await;
}

/// A provider that forgets fencing (it strips the token before the store sees it) and
/// answers invalid transitions with FAILED_PRECONDITION: the fencing and invalid-transition
/// tests must fail, everything else must still pass.
struct Broken(Arc<FakeProvider>);

fn unfenced<T>(r: Result<T, bigfleet_fake_provider::ProviderError>) -> Result<Response<T>, Status> {
    r.map(Response::new).map_err(|e| {
        let code = if e.code() == tonic::Code::Internal {
            tonic::Code::FailedPrecondition
        } else {
            e.code()
        };
        Status::new(code, e.to_string())
    })
}

#[tonic::async_trait]
impl CapacityProvider for Broken {
    async fn create(&self, r: Request<CreateRequest>) -> Result<Response<TransitionAck>, Status> {
        let mut r = r.into_inner();
        (r.shard_id, r.shard_epoch, r.sequence_number) = (String::new(), 0, 0);
        unfenced(self.0.create(&r))
    }
    async fn configure(
        &self,
        r: Request<ConfigureRequest>,
    ) -> Result<Response<TransitionAck>, Status> {
        let mut r = r.into_inner();
        (r.shard_id, r.shard_epoch, r.sequence_number) = (String::new(), 0, 0);
        unfenced(self.0.configure(&r))
    }
    async fn drain(&self, r: Request<DrainRequest>) -> Result<Response<TransitionAck>, Status> {
        let mut r = r.into_inner();
        (r.shard_id, r.shard_epoch, r.sequence_number) = (String::new(), 0, 0);
        unfenced(self.0.drain(&r))
    }
    async fn delete(&self, r: Request<DeleteRequest>) -> Result<Response<TransitionAck>, Status> {
        let mut r = r.into_inner();
        (r.shard_id, r.shard_epoch, r.sequence_number) = (String::new(), 0, 0);
        unfenced(self.0.delete(&r))
    }
    async fn get(&self, r: Request<MachineRef>) -> Result<Response<Machine>, Status> {
        unfenced(self.0.get(&r.get_ref().id))
    }
    async fn list(&self, r: Request<ListFilter>) -> Result<Response<MachineList>, Status> {
        Ok(Response::new(self.0.list(r.get_ref())))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suite_fails_against_a_provider_that_ignores_fencing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let svc = CapacityProviderServer::new(Broken(Arc::new(FakeProvider::builtin())));
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let report = run_all(&format!("http://{addr}")).await;
    let mut failed: Vec<&str> = report.failures().iter().map(|r| r.name).collect();
    failed.sort_unstable();
    let mut expected = vec![
        "DeleteOnConfigured",
        "DrainOnSpeculative",
        "FencingCheckedBeforeNotFound",
        "FencingPerMachineIsolation",
        "FencingReadsUnaffected",
        "FencingStaleEpochRejected",
        "FencingStaleSequenceRejected",
        "FencingUnknownShardAccepted",
    ];
    expected.sort_unstable();
    assert_eq!(failed, expected, "{}", report.summary());
    server.abort();
}

/// `BIGFLEET_PROVIDER_TARGET=unix:///run/p.sock cargo test -p bigfleet-fake-provider
/// --test it conformance_fake -- --ignored`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs BIGFLEET_PROVIDER_TARGET pointing at a running provider"]
async fn suite_passes_against_external_provider() {
    let target = std::env::var("BIGFLEET_PROVIDER_TARGET")
        .expect("set BIGFLEET_PROVIDER_TARGET to the provider's address");
    let report = run_all(&target).await;
    eprintln!("{}", report.summary());
    assert_all_passed(&report);
}
