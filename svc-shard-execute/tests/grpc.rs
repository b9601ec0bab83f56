//! The worker over real gRPC: Decide and Gateway doubles and the in-repo fake
//! provider on Unix sockets, the worker started in-process with [`start`].

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use bigfleet_fake_provider::{Completion, Injection, Mark, OpKind, ProviderConfig};
use bigfleet_model::MachineState::*;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_testkit::{http_request, wait_until};
use common::*;
use svc_shard_execute::doubles::BlobScript;
use svc_shard_execute::{Config, Running, StartError, start};
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;

/// Runs the queued actions through one worker and returns the Done records.
async fn run_all(m: &Mesh, n: usize) -> Vec<svc_shard_execute::doubles::DoneRecord> {
    let running = start(m.config("w1", 8)).await.unwrap();
    m.wait_dones(n).await;
    running.shutdown().await;
    m.decide.dones()
}

/// Seeds `idle-1` and queues its bootstrap for `c1`.
fn queue_bootstrap(m: &Mesh) {
    m.seed(machine("idle-1", Idle, ""));
    m.decide.enqueue(bootstrap("idle-1", "c1"));
}

/// Starts a worker on the queued bootstrap of `idle-1`, whose blob the operator hands over
/// only after `delay`, and returns once the blob was asked for: the action is mid-flight.
async fn start_mid_bootstrap(m: &Mesh, cfg: Config, delay: Duration) -> Running {
    m.gateway.script(
        "c1",
        BlobScript::Blob {
            data: b"late".to_vec(),
            delay,
        },
    );
    let running = start(cfg).await.unwrap();
    wait_until(WAIT, "the bootstrap call", async || {
        m.gateway.bootstraps().len() == 1
    })
    .await;
    running
}

#[tokio::test]
async fn every_flow_reaches_its_target_at_the_provider() {
    let m = mesh(ProviderConfig::default()).await;
    m.seed(machine("spec-1", Speculative, ""));
    m.seed(machine("idle-1", Idle, ""));
    m.seed(machine("conf-1", Configured, "c1"));
    m.seed(machine("conf-2", Configured, "c2"));
    m.seed(machine("idle-2", Idle, ""));
    m.decide.enqueue(provision("spec-1", "c1"));
    m.decide.enqueue(bootstrap("idle-1", "c1"));
    m.decide
        .enqueue(drain(mesh::ActionKind::Reclaim, "conf-1", "c1", 0));
    m.decide
        .enqueue(drain(mesh::ActionKind::Preempt, "conf-2", "c2", 900_000));
    m.decide.enqueue(release("idle-2"));
    let dones = run_all(&m, 5).await;
    for d in &dones {
        assert_eq!(d.outcome, "success", "{d:?}");
        assert!(!d.late, "{d:?}");
    }
    for (id, provider, decide) in [
        ("spec-1", pb::MachineState::Configured, Configured),
        ("idle-1", pb::MachineState::Configured, Configured),
        ("conf-1", pb::MachineState::Idle, Idle),
        ("conf-2", pb::MachineState::Idle, Idle),
        ("idle-2", pb::MachineState::Speculative, Speculative),
    ] {
        assert_eq!(m.provider_state(id), provider, "{id} at the provider");
        assert_eq!(m.decide_state(id), decide, "{id} at decide");
    }
    // The provider stored the five metadata keys and the cluster.
    let p = m.provider.get("spec-1").unwrap();
    assert_eq!(p.cluster, "c1");
    assert_eq!(p.shard_metadata.len(), 5);
    assert_eq!(
        p.shard_metadata["bigfleet.lucy.sh/assigned-priority"],
        "500"
    );
    // Reclaim instructions went out first, with the preemptor's priority.
    let reclaims = m.gateway.reclaims();
    assert_eq!(reclaims.len(), 2);
    assert!(
        reclaims
            .iter()
            .any(|r| r.request.machine_id == "conf-2" && r.request.preemptor_priority == 900_000)
    );
    // Every provider mutation was fenced with our shard and epoch.
    for id in ["spec-1", "idle-1", "conf-1", "conf-2", "idle-2"] {
        let mark = m.provider.fence_mark(SHARD, id).unwrap();
        assert_eq!(mark.epoch, EPOCH, "{id}");
    }
}

/// A provider refusing the first call of an action fails the machine; its last error
/// names the step.
#[tokio::test]
async fn a_refused_provider_call_fails_the_machine() {
    let cases = [
        (
            "create",
            machine("spec-1", Speculative, ""),
            OpKind::Create,
            provision("spec-1", "c1"),
            "provider_error",
            "no capacity in zone",
        ),
        (
            "configure",
            machine("idle-1", Idle, ""),
            OpKind::Configure,
            bootstrap("idle-1", "c1"),
            "configure_error",
            "join failed",
        ),
    ];
    for (step, seed, kind, action, outcome, refusal) in cases {
        let m = mesh(ProviderConfig::default()).await;
        let id = seed.id.clone();
        m.seed(seed);
        let message = refusal.into();
        let reject = Injection::Reject {
            code: Code::Internal,
            message,
        };
        m.provider.fail_next(&id, kind, reject);
        m.decide.enqueue(action);
        let dones = run_all(&m, 1).await;
        assert_eq!(dones[0].outcome, outcome, "{step}");
        assert_eq!(m.decide_state(&id), Failed, "{step}");
        let err = m.decide.machine(&id).unwrap().last_error;
        assert!(
            err.starts_with(&format!("{step}: ")) && err.contains(refusal),
            "{step}: {err}"
        );
    }
}

/// No blob (the operator does not answer, or the cluster has no session) rolls the machine
/// back to Idle without touching the provider.
#[tokio::test]
async fn a_missing_blob_rolls_back_to_idle() {
    for (script, outcome) in [
        (BlobScript::Timeout, "blob_error"),
        (BlobScript::NoSession, "no_session"),
    ] {
        let m = mesh(ProviderConfig::default()).await;
        m.gateway.script("c1", script);
        queue_bootstrap(&m);
        let dones = run_all(&m, 1).await;
        assert_eq!(dones[0].outcome, outcome, "{:?}", dones[0]);
        assert_eq!(m.decide_state("idle-1"), Idle, "{outcome}");
        let edges: Vec<_> = m.decide.transitions().iter().map(|t| t.edge()).collect();
        assert_eq!(
            edges,
            [(Idle, Configuring), (Configuring, Idle)],
            "{outcome}"
        );
        assert_eq!(
            m.provider_state("idle-1"),
            pb::MachineState::Idle,
            "{outcome}"
        );
        assert!(
            m.provider.fence_mark(SHARD, "idle-1").is_none(),
            "{outcome}: provider untouched"
        );
    }
}

#[tokio::test]
async fn an_asynchronous_drain_is_finished_by_the_provider_not_the_worker() {
    let mut cfg = ProviderConfig::default();
    cfg.transitions.drain = Completion::Staged;
    let m = mesh(cfg).await;
    m.seed(machine("conf-1", Configured, "c1"));
    m.decide
        .enqueue(drain(mesh::ActionKind::Reclaim, "conf-1", "c1", 0));
    let dones = run_all(&m, 1).await;
    assert_eq!(dones[0].outcome, "success");
    assert!(dones[0].detail.contains("reconcile"), "{:?}", dones[0]);
    // The worker left it Draining (binding kept until Idle is observed).
    assert_eq!(m.decide_state("conf-1"), Draining);
    assert_eq!(m.decide.machine("conf-1").unwrap().cluster, "c1");
    assert_eq!(m.provider_state("conf-1"), pb::MachineState::Draining);
    m.provider.complete_staged("conf-1").unwrap();
    assert_eq!(m.provider_state("conf-1"), pb::MachineState::Idle);
}

#[tokio::test]
async fn delete_unsupported_fails_the_machine() {
    let cfg = ProviderConfig {
        delete_supported: false,
        ..ProviderConfig::default()
    };
    let m = mesh(cfg).await;
    m.seed(machine("idle-1", Idle, ""));
    m.decide.enqueue(release("idle-1"));
    let dones = run_all(&m, 1).await;
    assert_eq!(dones[0].outcome, "provider_error");
    assert_eq!(m.decide_state("idle-1"), Failed);
    let err = m.decide.machine("idle-1").unwrap().last_error;
    assert!(err.contains("contract violation"), "{err}");
}

#[tokio::test]
async fn a_zombie_epoch_is_fenced() {
    let m = mesh(ProviderConfig::default()).await;
    m.seed(machine("spec-1", Speculative, ""));
    // A newer incarnation of the shard (epoch 9) already acted on the
    // machine: its failed Drain still advanced the fence.
    let newer = m.provider.drain(&pb::DrainRequest {
        machine_id: "spec-1".into(),
        grace_period_seconds: 0,
        shard_id: SHARD.into(),
        shard_epoch: 9,
        sequence_number: 1,
    });
    assert!(newer.is_err(), "drain of a speculative machine must fail");
    m.decide.enqueue(provision("spec-1", "c1"));
    let dones = run_all(&m, 1).await;
    assert_eq!(dones[0].outcome, "fenced", "{:?}", dones[0]);
    assert_eq!(m.decide_state("spec-1"), Failed);
    assert!(
        m.decide
            .machine("spec-1")
            .unwrap()
            .last_error
            .starts_with("create: fenced")
    );
    assert_eq!(m.provider_state("spec-1"), pb::MachineState::Speculative);
    assert_eq!(
        m.provider.fence_mark(SHARD, "spec-1"),
        Some(Mark {
            epoch: 9,
            sequence: 1
        })
    );
}

#[tokio::test]
async fn a_retry_is_restamped_so_the_provider_accepts_it() {
    let m = mesh(ProviderConfig::default()).await;
    m.seed(machine("spec-1", Speculative, ""));
    m.provider.fail_next(
        "spec-1",
        OpKind::Create,
        Injection::Reject {
            code: Code::Unavailable,
            message: "try again".into(),
        },
    );
    m.decide.enqueue(provision("spec-1", "c1"));
    let dones = run_all(&m, 1).await;
    // Reusing the first number would have been refused as a replay.
    assert_eq!(dones[0].outcome, "success", "{:?}", dones[0]);
    let base = 65_536;
    assert_eq!(
        m.provider.fence_mark(SHARD, "spec-1"),
        Some(Mark {
            epoch: EPOCH,
            sequence: base + 2
        }),
        "create attempts at base and base+1, configure at base+2"
    );
}

#[tokio::test]
async fn two_pools_on_one_decide_do_every_action_exactly_once() {
    let m = mesh(ProviderConfig::default()).await;
    let n = 200;
    for i in 0..n {
        let id = format!("spec-{i:03}");
        m.seed(machine(&id, Speculative, ""));
        m.decide.enqueue(provision(&id, "c1"));
    }
    let a = start(m.config("pool-a", 8)).await.unwrap();
    let b = start(m.config("pool-b", 8)).await.unwrap();
    m.wait_dones(n).await;
    a.shutdown().await;
    b.shutdown().await;
    let dones = m.decide.dones();
    assert_eq!(dones.len(), n);
    let actions: HashSet<_> = dones.iter().map(|d| d.action_id.clone()).collect();
    assert_eq!(actions.len(), n, "no action reported twice");
    assert!(dones.iter().all(|d| d.outcome == "success" && !d.late));
    let per_worker = |w: &str| dones.iter().filter(|d| d.worker_id == w).count();
    assert!(
        per_worker("pool-a") > 0 && per_worker("pool-b") > 0,
        "both pools worked"
    );
    for i in 0..n {
        let id = format!("spec-{i:03}");
        assert_eq!(m.provider_state(&id), pb::MachineState::Configured, "{id}");
    }
    // Exactly one Speculative→Creating per machine: nothing ran twice.
    let creates = m
        .decide
        .transitions()
        .iter()
        .filter(|t| t.edge() == (Speculative, Creating) && t.result.is_ok())
        .count();
    assert_eq!(creates, n);
}

#[tokio::test]
async fn a_restarted_worker_picks_up_abandoned_work() {
    let m = mesh(ProviderConfig::default()).await;
    m.decide.set_reissue_abandoned(true);
    queue_bootstrap(&m);
    // The operator is slow: the action is mid-flight when the worker dies.
    let first = start_mid_bootstrap(&m, m.config("w-old", 4), Duration::from_secs(30)).await;
    first.abort().await;
    // Decide sees the stream end and abandons the action.
    wait_until(WAIT, "the stream to end", async || {
        m.decide.streams().first().is_some_and(|s| !s.open)
    })
    .await;
    let old = &m.decide.streams()[0];
    assert_eq!(old.abandoned, ["act-1"]);
    assert!(
        m.decide.dones().is_empty(),
        "a crashed worker reports nothing"
    );

    m.gateway.script("c1", BlobScript::blob(b"fast"));
    let second = start(m.config("w-new", 4)).await.unwrap();
    m.wait_dones(1).await;
    second.shutdown().await;
    let done = &m.decide.dones()[0];
    assert_eq!(
        (
            done.action_id.as_str(),
            done.worker_id.as_str(),
            done.outcome.as_str()
        ),
        ("act-2", "w-new", "success")
    );
    assert_eq!(m.provider_state("idle-1"), pb::MachineState::Configured);
}

#[tokio::test]
async fn the_worker_reconnects_when_decide_goes_away_and_comes_back() {
    let mut m = mesh(ProviderConfig::default()).await;
    // Decide is not there when the worker starts.
    m.decide_srv.take().unwrap().stop().await;
    let running = start(m.config("w1", 4)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(m.decide.streams().is_empty());
    let srv = m
        .decide
        .serve_uds(&m.dir.path().join("decide.sock"))
        .unwrap();
    queue_bootstrap(&m);
    m.wait_dones(1).await;

    // Decide ends the stream (e.g. restarting): the worker re-opens it.
    m.decide.end_streams();
    wait_until(WAIT, "a second open stream", async || {
        let streams = m.decide.streams();
        if streams.len() == 2 && streams[1].open {
            Ok(())
        } else {
            Err(format!("{streams:?}"))
        }
    })
    .await;
    m.seed(machine("idle-2", Idle, ""));
    m.decide.enqueue(bootstrap("idle-2", "c1"));
    m.wait_dones(2).await;
    assert!(m.decide.dones().iter().all(|d| d.outcome == "success"));
    assert!(running.metrics().stream_reconnects.get() >= 2);
    running.shutdown().await;
    m.decide.end_streams();
    srv.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_and_reports_running_actions() {
    let m = mesh(ProviderConfig::default()).await;
    queue_bootstrap(&m);
    // Well under the bootstrap timeout: with the test config's 300 ms, a loaded machine
    // timed the 150 ms blob out.
    let mut cfg = m.config("w1", 4);
    cfg.exec.bootstrap_timeout = Duration::from_secs(30);
    let running = start_mid_bootstrap(&m, cfg, Duration::from_millis(500)).await;
    running.shutdown().await;
    let dones = m.decide.dones();
    assert_eq!(dones.len(), 1);
    assert_eq!(dones[0].outcome, "success");
    assert!(!dones[0].late);
    wait_until(WAIT, "every stream to close", async || {
        m.decide.streams().iter().all(|s| !s.open)
    })
    .await;
    assert!(m.decide.streams()[0].abandoned.is_empty());
    assert_eq!(m.decide_state("idle-1"), Configured);
}

#[tokio::test]
async fn metrics_endpoint_reports_outcomes_and_readiness() {
    let m = mesh(ProviderConfig::default()).await;
    queue_bootstrap(&m);
    // As the binary does: the ops endpoint first, the worker on its registry and readiness.
    let ops = bigfleet_mesh::binary::Ops::start("127.0.0.1:0", "starting")
        .await
        .unwrap();
    let mut cfg = m.config("w1", 4);
    cfg.registry = ops.registry.clone();
    cfg.readiness = ops.readiness.clone();
    let running = start(cfg).await.unwrap();
    m.wait_dones(1).await;
    let addr = ops.addr().unwrap();
    let (code, text) = http_request(addr, "/metrics", &[]).await.unwrap();
    assert_eq!(code, 200, "{text}");
    assert!(
        text.contains(
            "bigfleet_shard_action_execute_outcomes_total{kind=\"Bootstrap\",outcome=\"success\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains("bigfleet_shard_execute_configure_phase_seconds_count 1"));
    assert!(text.contains("bigfleet_shard_request_bootstrap_seconds_count 1"));
    assert!(text.contains("bigfleet_shard_execute_pool_inflight 0"));
    // All three connections go through the mesh client stack: decide's Work stream (Pull) and
    // Transition, the gateway's RequestBootstrap and the provider's Configure.
    let client_calls: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("grpc_client_started_total{"))
        .collect();
    for method in ["Pull", "Transition", "RequestBootstrap", "Configure"] {
        let label = format!("grpc_method=\"{method}\"");
        assert!(
            client_calls.iter().any(|l| l.contains(&label)),
            "{method}: {client_calls:#?}"
        );
    }
    let ready = http_request(addr, "/readyz", &[]).await;
    assert_eq!(ready.map(|(code, _)| code), Some(200));
    // Stopping: not ready before the pool drains, so no traffic is routed to a worker that is
    // going away; the endpoint itself stops last.
    ops.drain_after(async {}, async {
        let (code, body) = http_request(addr, "/readyz", &[]).await.unwrap();
        assert_eq!((code, body.contains("draining")), (503, true), "{body}");
        running.shutdown().await;
        anyhow::Ok(())
    })
    .await
    .unwrap();
    assert!(http_request(addr, "/readyz", &[]).await.is_none());
}

#[tokio::test]
async fn remote_worker_reaches_decide_over_mtls_as_shard_execute() {
    let m = mesh(ProviderConfig::default()).await;
    let ca = bigfleet_testkit::TestCa::new("test ca").unwrap();
    let server = ca.issue_role(&format!("shard/{SHARD}")).unwrap();
    let tls_dir = m.dir.path().join("tls");
    std::fs::create_dir_all(&tls_dir).unwrap();
    let worker_paths = ca
        .write_role_bundle(&tls_dir, &format!("shard/{SHARD}/execute"))
        .unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            &server.cert_pem,
            &server.key_pem,
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(ca.ca_pem()));
    let srv = bigfleet_mesh::BareServer::spawn(
        tonic::transport::Server::builder()
            .tls_config(tls)
            .unwrap()
            .add_service(m.decide.service()),
        TcpListenerStream::new(listener),
    );

    let files =
        bigfleet_identity::TlsFiles::new(&worker_paths.cert, &worker_paths.key, &worker_paths.ca);
    let mut cfg = m.config("remote", 4);
    cfg.decide_addr = format!("https://{addr}");
    cfg.tls = Some(bigfleet_identity::TlsContext::load(&files).unwrap());
    queue_bootstrap(&m);
    let running = start(cfg.clone()).await.unwrap();
    m.wait_dones(1).await;
    assert_eq!(m.decide.dones()[0].outcome, "success");
    running.shutdown().await;

    // A certificate for another shard is refused before dialling anything.
    let other = ca
        .write_role_bundle(&tls_dir, "shard/shard-b/execute")
        .unwrap();
    cfg.tls = Some(
        bigfleet_identity::TlsContext::load(&bigfleet_identity::TlsFiles::new(
            &other.cert,
            &other.key,
            &other.ca,
        ))
        .unwrap(),
    );
    assert!(matches!(
        start(cfg).await,
        Err(StartError::WrongIdentity { .. })
    ));
    m.decide.end_streams();
    srv.stop().await.unwrap();
}
