//! The `bigfleet` read and admin commands against a coordinator double that enforces the
//! identity matrix, shard doubles and a real svc-inspect.

use std::net::SocketAddr;
use std::time::Duration;

use bigfleet::CliError;
use bigfleet::cli::Cli;
use bigfleet::read::{NeedsOutput, ShardsOutput};
use bigfleet_identity::TlsFiles;
use bigfleet_mesh::RunningServer;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::UnmetReason;
use bigfleet_testkit::TestCa;
use clap::Parser;
use svc_inspect::doubles::{
    CoordinatorDouble, CoordinatorState, ShardDouble, need, registry_entry,
};
use svc_inspect::view::DomainView;
use tonic::Code;

use crate::common;

struct Pki {
    dir: tempfile::TempDir,
    ca: TestCa,
}

impl Pki {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            ca: TestCa::new("cli-test-ca").unwrap(),
        }
    }

    fn files(&self, role: &str) -> TlsFiles {
        let p = self.ca.write_role_bundle(self.dir.path(), role).unwrap();
        TlsFiles::new(p.cert, p.key, p.ca)
    }

    fn server(&self, role: &str) -> std::sync::Arc<rustls::ServerConfig> {
        bigfleet_identity::TlsContext::load(&self.files(role))
            .unwrap()
            .server_config()
            .unwrap()
    }

    /// `--tls-cert X --tls-key Y --tls-ca Z` for a role.
    fn flags(&self, role: &str) -> Vec<String> {
        bigfleet::up::pki::tls_flags(&self.files(role))
    }
}

/// A TCP address nothing listens on: outside the ephemeral range, where no other test's
/// `:0` listener can appear.
fn dead_addr() -> SocketAddr {
    bigfleet_testkit::reserve_tcp_port().unwrap().release()
}

struct Fleet {
    pki: Option<Pki>,
    coordinator: CoordinatorDouble,
    coordinator_server: RunningServer,
    shards: Vec<RunningServer>,
    inspect: svc_inspect::Running,
}

impl Fleet {
    async fn start(tls: bool) -> Self {
        let pki = tls.then(Pki::new);
        let s1 = ShardDouble {
            description: Some(mesh::ShardDescription {
                shard_id: "s1".into(),
                cycle: 12,
                machines_by_state: [("MACHINE_STATE_CONFIGURED".to_owned(), 4)].into(),
                sessions: 1,
                needs: 3,
                unmet_needs: 2,
                // Its provider List fails and its last full List left machines out.
                inventory_stale: true,
                inventory_listed_at_unix_nanos: svc_inspect::fleet::now_unix_nanos()
                    - 90_000_000_000,
                removals_held: 4,
                ..Default::default()
            }),
            ..common::shard(
                "s1",
                12,
                vec![
                    need("c-a", 100, 1, Some(UnmetReason::PriorityStarved)),
                    need("c-a", 5, 2, None),
                    need("c-b", 1, 1, Some(UnmetReason::NoMatchingSupply)),
                ],
            )
        };
        let s2 = common::shard(
            "s2",
            30,
            vec![need("c-a", 50, 1, Some(UnmetReason::TopologyUnsatisfiable))],
        );
        let mut shards = Vec::new();
        let mut registry = Vec::new();
        for s in [s1, s2] {
            let id = s.shard_id.clone();
            let server = s
                .serve(pki.as_ref().map(|p| p.server(&format!("shard/{id}"))))
                .await
                .unwrap();
            registry.push(registry_entry(&id, server.tcp_addr().unwrap()));
            shards.push(server);
        }
        registry.push(registry_entry("s3", dead_addr()));
        let coordinator = CoordinatorDouble::new(CoordinatorState {
            shards: registry,
            reports: vec![common::s1_report(vec![common::gpu_shortfall()])],
            domains: vec![pb::DomainAssignment {
                topology_key: "rack".into(),
                topology_value: "r1".into(),
                shard_id: "s1".into(),
            }],
            snapshot: Some(snapshot_parts()),
            ..Default::default()
        });
        let coordinator_server = coordinator
            .serve(pki.as_ref().map(|p| p.server("admin")))
            .await
            .unwrap();
        let mut cfg = svc_inspect::Config::local(&format!(
            "http://{}",
            coordinator_server.tcp_addr().unwrap()
        ));
        cfg.cache_ttl = Duration::ZERO;
        cfg.tls = pki.as_ref().map(|p| p.files("readonly"));
        let inspect = svc_inspect::start(cfg).await.unwrap();
        Self {
            pki,
            coordinator,
            coordinator_server,
            shards,
            inspect,
        }
    }

    fn coordinator_uri(&self) -> String {
        format!("http://{}", self.coordinator_server.tcp_addr().unwrap())
    }

    fn inspect_uri(&self) -> String {
        format!("http://{}", self.inspect.grpc_addr())
    }

    /// Runs `bigfleet <args>` with this fleet's coordinator and, if given, a role's
    /// certificate: (result, stdout, stderr).
    async fn run(
        &self,
        role: Option<&str>,
        args: &[&str],
    ) -> (Result<(), CliError>, String, String) {
        let mut argv: Vec<String> = vec!["bigfleet".into()];
        argv.extend(args.iter().map(|a| (*a).to_owned()));
        argv.extend([
            "--coordinator".to_owned(),
            self.coordinator_uri(),
            "--timeout".into(),
            "3s".into(),
        ]);
        if let (Some(pki), Some(role)) = (&self.pki, role) {
            argv.extend(pki.flags(role));
        }
        run_cli(argv).await
    }

    async fn shutdown(self) {
        self.inspect.shutdown().await.unwrap();
        self.coordinator_server.shutdown().await.unwrap();
        for s in self.shards {
            s.shutdown().await.unwrap();
        }
    }
}

/// `bigfleet admin assign-domain` of rack `value` to `shard`.
fn assign_rack<'a>(value: &'a str, shard: &'a str) -> [&'a str; 8] {
    [
        "admin",
        "assign-domain",
        "--key",
        "rack",
        "--value",
        value,
        "--shard",
        shard,
    ]
}

async fn run_cli<I, T>(argv: I) -> (Result<(), CliError>, String, String)
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(argv).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = bigfleet::run(cli, &mut out, &mut err).await;
    (
        r,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn snapshot_parts() -> (Vec<u8>, Vec<u8>) {
    let archive = svc_coordinator::testing::snapshot_archive("127.0.0.1:7780", 12);
    (archive.meta_json(), archive.state)
}

/// s1's double stamps its last List 90 s before the fleet starts; the CLI renders the age
/// at the time of the call, which a loaded machine reaches seconds later.
#[track_caller]
fn assert_listed_90s_ago(out: &str) {
    let ages: Vec<u64> = out
        .split("listed ")
        .skip(1)
        .filter_map(|rest| {
            let (m, rest) = rest.split_once("m ")?;
            let (s, _) = rest.split_once("s ago")?;
            Some(m.parse::<u64>().ok()? * 60 + s.parse::<u64>().ok()?)
        })
        .collect();
    assert!(
        !ages.is_empty() && ages.iter().all(|a| (90..120).contains(a)),
        "list ages {ages:?} in:\n{out}"
    );
}

fn refused(r: &Result<(), CliError>) -> String {
    let e = r.as_ref().expect_err("the call must be refused");
    assert_eq!(e.code(), Some(Code::PermissionDenied), "{e}");
    e.to_string()
}

#[tokio::test]
async fn readonly_reads_everything_and_mutates_nothing() {
    let f = Fleet::start(true).await;
    let ro = Some("readonly");

    let (r, out, _) = f.run(ro, &["shards"]).await;
    r.unwrap();
    assert!(out.lines().next().unwrap().starts_with("SHARD"), "{out}");
    assert!(out.contains("s3 is unreachable:"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("s1 ") && l.contains(" INVENTORY STALE ")),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("s2 ") && l.contains(" ok ")),
        "{out}"
    );
    assert!(
        out.contains("s1 decides on stale inventory: its provider List fails (listed 1m ")
            && out.contains("s1 holds the removal of 4 machines"),
        "{out}"
    );
    assert_listed_90s_ago(&out);
    let (r, out, _) = f.run(ro, &["shards", "-o", "wide"]).await;
    r.unwrap();
    assert!(out.contains("s ago; 4 removals held"), "{out}");
    assert_listed_90s_ago(&out);

    let inspect = f.inspect_uri();
    let (r, out, _) = f
        .run(ro, &["shards", "-o", "json", "--inspect", &inspect])
        .await;
    r.unwrap();
    let shards: ShardsOutput = serde_json::from_str(&out).unwrap();
    let ids: Vec<_> = shards
        .shards
        .iter()
        .map(|s| (s.shard_id.as_str(), s.reachable))
        .collect();
    assert_eq!(ids, vec![("s1", true), ("s2", true), ("s3", false)]);
    // Through svc-inspect too: the staleness and the held removals reach the CLI.
    let s1 = &shards.shards[0];
    assert!(
        s1.inventory_stale && s1.inventory_listed_at_unix_ns > 0,
        "{s1:?}"
    );
    assert_eq!(s1.removals_held, 4);

    for via in [None, Some(inspect.as_str())] {
        let mut args = vec!["needs", "--cluster", "c-a", "-o", "json"];
        if let Some(i) = via {
            args.extend(["--inspect", i]);
        }
        let (r, out, err) = f.run(ro, &args).await;
        r.unwrap();
        let n: NeedsOutput = serde_json::from_str(&out).unwrap();
        let prios: Vec<_> = n.needs.iter().map(|n| n.priority).collect();
        assert_eq!(prios, vec![100, 50, 5], "via {via:?}");
        assert_eq!((n.total_needs, n.cycle), (3, 12));
        assert!(
            err.contains("warning: shard s3 did not answer"),
            "via {via:?}: {err}"
        );
        assert_eq!(
            n.needs[0].shard_id.is_some(),
            via.is_none(),
            "only the direct path knows shards"
        );

        args.push("--unmet");
        let (r, out, _) = f.run(ro, &args).await;
        r.unwrap();
        let n: NeedsOutput = serde_json::from_str(&out).unwrap();
        assert!(
            n.needs.iter().all(|n| !n.satisfied) && n.needs.len() == 2,
            "via {via:?}"
        );
    }

    let (r, out, _) = f
        .run(ro, &["needs", "--cluster", "c-a", "--limit", "1"])
        .await;
    r.unwrap();
    assert!(out.contains("priority-starved"), "{out}");
    assert!(!out.contains("topology-unsatisfiable"), "limit 1: {out}");

    let (r, out, _) = f.run(ro, &["shortfalls"]).await;
    r.unwrap();
    assert!(out.contains("nvidia.com/gpu=256"), "{out}");
    let (r, out, _) = f.run(ro, &["domains", "-o", "json"]).await;
    r.unwrap();
    let d: Vec<DomainView> = serde_json::from_str(&out).unwrap();
    assert_eq!(d.len(), 1);

    for args in [
        assign_rack("r2", "s1").to_vec(),
        vec!["admin", "unassign-domain", "--key", "rack", "--value", "r1"],
        vec!["admin", "remove-shard", "--shard", "s1"],
    ] {
        let (r, _, _) = f.run(ro, &args).await;
        let msg = refused(&r);
        assert!(
            msg.contains("needs a client certificate with role admin (bigfleet://admin)"),
            "{msg}"
        );
    }
    let file = f.pki.as_ref().unwrap().dir.path().join("snap.bin");
    let (r, _, _) = f
        .run(ro, &["admin", "snapshot", "save", file.to_str().unwrap()])
        .await;
    refused(&r);
    assert!(!file.exists());

    {
        let st = f.coordinator.state();
        assert_eq!(st.domains.len(), 1, "nothing changed");
        assert_eq!(st.shards.len(), 3);
        assert!(
            st.calls.iter().all(|c| c.starts_with("List")),
            "{:?}",
            st.calls
        );
    }
    f.shutdown().await;
}

#[tokio::test]
async fn shard_and_cluster_certificates_are_refused() {
    let f = Fleet::start(true).await;
    let inspect = f.inspect_uri();
    for role in ["shard/s1", "cluster/c-a"] {
        for args in [
            vec!["shards"],
            vec!["domains"],
            vec!["shortfalls"],
            vec!["needs", "--cluster", "c-a"],
        ] {
            let (r, _, _) = f.run(Some(role), &args).await;
            let msg = refused(&r);
            assert!(
                msg.contains("role readonly or admin (bigfleet://readonly or bigfleet://admin)"),
                "{role} {args:?}: {msg}"
            );
            assert!(msg.contains("coordinator"), "{msg}");
        }
        let (r, _, _) = f
            .run(
                Some(role),
                &["needs", "--cluster", "c-a", "--inspect", &inspect],
            )
            .await;
        let msg = refused(&r);
        assert!(msg.starts_with("permission denied: inspect"), "{msg}");
        let (r, _, _) = f
            .run(Some(role), &["admin", "remove-shard", "--shard", "s1"])
            .await;
        assert!(refused(&r).contains("role admin"));
    }
    assert!(
        f.coordinator.state().calls.is_empty(),
        "every call stopped at the identity check"
    );
    f.shutdown().await;
}

#[tokio::test]
async fn admin_changes_the_fleet() {
    let f = Fleet::start(true).await;
    let admin = Some("admin");
    let (r, out, _) = f.run(admin, &assign_rack("r2", "s2")).await;
    r.unwrap();
    assert_eq!(out, "domain rack=r2 assigned to shard s2\n");
    let (r, out, _) = f.run(admin, &["domains"]).await;
    r.unwrap();
    assert!(out.contains("rack  r2     s2"), "{out}");

    let (r, _, _) = f.run(admin, &assign_rack("r2", "s1")).await;
    let e = r.unwrap_err();
    assert_eq!(e.code(), Some(Code::AlreadyExists));
    assert!(e.to_string().contains("assigned to shard s2"), "{e}");

    let (r, out, _) = f
        .run(
            admin,
            &[
                "admin",
                "unassign-domain",
                "--key",
                "rack",
                "--value",
                "r2",
                "-o",
                "json",
            ],
        )
        .await;
    r.unwrap();
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["action"], "unassign-domain");

    let (r, _, _) = f
        .run(admin, &["admin", "remove-shard", "--shard", "s2"])
        .await;
    r.unwrap();
    let (r, _, _) = f
        .run(admin, &["admin", "remove-shard", "--shard", "s2"])
        .await;
    assert_eq!(r.unwrap_err().code(), Some(Code::NotFound));
    {
        let st = f.coordinator.state();
        assert!(!st.shards.iter().any(|s| s.shard_id == "s2"));
        assert_eq!(st.domains.len(), 1);
    }
    f.shutdown().await;
}

#[tokio::test]
async fn snapshot_save_then_offline_restore() {
    let f = Fleet::start(true).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("coord.snap");
    let (r, out, _) = f
        .run(
            Some("admin"),
            &["admin", "snapshot", "save", file.to_str().unwrap()],
        )
        .await;
    r.unwrap();
    assert!(out.contains("term 7, index 12"), "{out}");
    let saved = svc_coordinator::SnapshotArchive::read(&file).unwrap();
    let (meta, state) = snapshot_parts();
    assert_eq!(
        saved,
        svc_coordinator::SnapshotArchive::from_parts(&meta, state).unwrap()
    );

    let data = dir.path().join("replica-0");
    let (r, out, _) = run_cli([
        "bigfleet",
        "admin",
        "snapshot",
        "restore",
        "--data-dir",
        data.to_str().unwrap(),
        "--node-id",
        "coord-0",
        "--raft-advertise",
        "127.0.0.1:7791",
        file.to_str().unwrap(),
    ])
    .await;
    r.unwrap();
    assert!(
        out.contains("term 7, index 12: 1 shards, 1 domains"),
        "{out}"
    );
    assert!(data.join(svc_coordinator::store::DB_FILE).exists());

    let (r, _, _) = run_cli([
        "bigfleet",
        "admin",
        "snapshot",
        "restore",
        "--data-dir",
        "/nonexistent/x",
        "--node-id",
        "n",
        "--raft-advertise",
        "h:1",
        "/no/such/file",
    ])
    .await;
    assert!(r.unwrap_err().to_string().contains("/no/such/file"));
    f.shutdown().await;
}

#[tokio::test]
async fn not_leader_is_retried_once_against_the_hint() {
    let f = Fleet::start(false).await;
    let follower = CoordinatorDouble::new(CoordinatorState {
        follower_of: Some(f.coordinator_server.tcp_addr().unwrap().to_string()),
        ..Default::default()
    });
    let follower_server = follower.serve(None).await.unwrap();
    let via_follower = format!("http://{}", follower_server.tcp_addr().unwrap());
    let (r, out, _) = run_cli(["bigfleet", "domains", "--coordinator", &via_follower]).await;
    r.unwrap();
    assert!(out.contains("rack  r1     s1"), "{out}");
    assert_eq!(f.coordinator.state().calls, vec!["ListDomainAssignments"]);

    // No hint: a clear error instead of a loop.
    let lost = CoordinatorDouble::new(CoordinatorState {
        follower_of: Some(String::new()),
        ..Default::default()
    });
    let lost_server = lost.serve(None).await.unwrap();
    let (r, _, _) = run_cli([
        "bigfleet",
        "domains",
        "--coordinator",
        &format!("http://{}", lost_server.tcp_addr().unwrap()),
    ])
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.code(), Some(Code::FailedPrecondition));
    assert!(
        e.to_string()
            .contains("is not the leader and named no leader"),
        "{e}"
    );
    follower_server.shutdown().await.unwrap();
    lost_server.shutdown().await.unwrap();
    f.shutdown().await;
}

#[tokio::test]
async fn unreachable_servers_are_named() {
    let dead = format!("http://{}", dead_addr());
    let (r, _, _) = run_cli(["bigfleet", "shards", "--coordinator", &dead]).await;
    let e = r.unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable));
    assert!(
        e.to_string()
            .starts_with(&format!("cannot reach coordinator at {dead} (ListShards)")),
        "{e}"
    );

    let (r, _, _) = run_cli(["bigfleet", "needs", "--cluster", "c", "--inspect", &dead]).await;
    let e = r.unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("cannot reach inspect at {dead} (InspectNeeds)")),
        "{e}"
    );
    assert!(e.to_string().contains("--inspect"), "{e}");
}

#[test]
fn the_binary_exits_non_zero_with_the_reason() {
    let dead = format!("http://{}", dead_addr());
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
        .args(["domains", "--timeout", "2s"])
        .env("BIGFLEET_COORDINATOR", &dead)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("bigfleet: cannot reach coordinator at {dead}")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
