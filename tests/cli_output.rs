//! The CLI's output contract (ADR-0122): byte-exact goldens for every `-o` format and
//! `--no-headers` against a real coordinator double, a real shard double and svc-inspect's
//! fan-out; shards (whose addresses and ages vary) through the output layer with fixed
//! records; `--watch`, completions, `--help` examples and `--version` of the binary.
//!
//! Regenerate the goldens after a deliberate format change with
//! `BIGFLEET_BLESS=1 cargo nextest run -p bigfleet --test it cli_output::` and review the diff.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bigfleet::cli::{Cli, OutputFormat};
use bigfleet::output::{OutputOptions, render};
use bigfleet::read::{NeedsOutput, ShardsOutput};
use bigfleet_mesh::RunningServer;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::UnmetReason;
use clap::Parser;
use svc_inspect::doubles::{
    CoordinatorDouble, CoordinatorState, need, records_shard, registry_entry, sample_transfers,
};
use svc_inspect::view::ShardView;

use crate::common;

const FORMATS: &[(&str, &[&str])] = &[
    ("table", &[]),
    ("table-no-headers", &["--no-headers"]),
    ("wide", &["-o", "wide"]),
    ("wide-no-headers", &["-o", "wide", "--no-headers"]),
    ("json", &["-o", "json"]),
    ("yaml", &["-o", "yaml"]),
    ("name", &["-o", "name"]),
];

fn golden_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden/cli")
        .join(name)
}

/// Compares `actual` with the golden file byte for byte (or writes it when blessing).
fn golden(name: &str, actual: &str) {
    let path = golden_path(name);
    if std::env::var_os("BIGFLEET_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with BIGFLEET_BLESS=1)", path.display()));
    assert!(
        want == actual,
        "{name} differs from {}\n--- want\n{want}--- got\n{actual}---",
        path.display()
    );
}

/// `bigfleet <args> --coordinator <coordinator> --timeout 5s`.
fn argv_against(coordinator: &RunningServer, args: &[&str]) -> Vec<String> {
    let mut argv: Vec<String> = vec!["bigfleet".into()];
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    argv.extend([
        "--coordinator".to_owned(),
        format!("http://{}", coordinator.tcp_addr().unwrap()),
        "--timeout".into(),
        "5s".into(),
    ]);
    argv
}

/// (stdout, stderr) of a command that must succeed.
async fn run_ok(argv: Vec<String>) -> (String, String) {
    let cli = Cli::try_parse_from(&argv).unwrap();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    bigfleet::run(cli, &mut out, &mut err)
        .await
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    (
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

/// One shard double and a coordinator double with a shortfall report and two domains.
struct Fleet {
    coordinator: CoordinatorDouble,
    coordinator_server: RunningServer,
    shard: RunningServer,
}

impl Fleet {
    async fn start() -> Self {
        let s1 = common::shard(
            "s1",
            12,
            vec![
                need(
                    "c-a",
                    100,
                    1_690_000_000_000_000_000,
                    Some(UnmetReason::PriorityStarved),
                ),
                need("c-a", 5, 1_690_000_060_000_000_000, None),
                need("c-b", 1, 1, Some(UnmetReason::NoMatchingSupply)),
            ],
        );
        let shard = s1.serve(None).await.unwrap();
        let coordinator = CoordinatorDouble::new(CoordinatorState {
            shards: vec![registry_entry("s1", shard.tcp_addr().unwrap())],
            reports: vec![common::s1_report(vec![
                common::gpu_shortfall(),
                pb::Shortfall {
                    deficit: Some(pb::Resources {
                        resources: [
                            ("cpu".to_owned(), "64".to_owned()),
                            ("memory".to_owned(), "256Gi".to_owned()),
                        ]
                        .into(),
                    }),
                    priority: 7,
                    age_cycles: 2,
                    ..Default::default()
                },
            ])],
            domains: vec![
                domain("rack", "r1", "s1"),
                domain("topology.kubernetes.io/zone", "eu-west-1a", "s1"),
            ],
            transfers: sample_transfers(),
            ..Default::default()
        });
        let coordinator_server = coordinator.serve(None).await.unwrap();
        Self {
            coordinator,
            coordinator_server,
            shard,
        }
    }

    fn argv(&self, args: &[&str]) -> Vec<String> {
        argv_against(&self.coordinator_server, args)
    }

    async fn run(&self, args: &[&str]) -> String {
        run_ok(self.argv(args)).await.0
    }

    async fn shutdown(self) {
        self.coordinator_server.shutdown().await.unwrap();
        self.shard.shutdown().await.unwrap();
    }
}

fn domain(key: &str, value: &str, shard: &str) -> pb::DomainAssignment {
    pb::DomainAssignment {
        topology_key: key.into(),
        topology_value: value.into(),
        shard_id: shard.into(),
    }
}

#[tokio::test]
async fn read_commands_match_their_goldens_in_every_format() {
    let f = Fleet::start().await;
    let commands: &[(&str, &[&str])] = &[
        ("domains", &["domains"]),
        ("transfers", &["transfers"]),
        ("shortfalls", &["shortfalls"]),
        ("needs", &["needs", "--cluster", "c-a"]),
    ];
    for (name, cmd) in commands {
        for (format, flags) in FORMATS {
            let mut args = cmd.to_vec();
            args.extend_from_slice(flags);
            let out = f.run(&args).await;
            golden(&format!("{name}.{format}"), &out);
        }
    }

    // The YAML is the JSON document, field for field.
    let json = f.run(&["needs", "--cluster", "c-a", "-o", "json"]).await;
    let yaml = f.run(&["needs", "--cluster", "c-a", "-o", "yaml"]).await;
    let from_json: NeedsOutput = serde_json::from_str(&json).unwrap();
    let from_yaml: NeedsOutput = serde_norway::from_str(&yaml).unwrap();
    assert_eq!(from_json, from_yaml);
    assert_eq!(from_json.needs.len(), 2);
    f.shutdown().await;
}

#[tokio::test]
async fn transfers_filter_by_shard_and_say_when_there_are_none() {
    let f = Fleet::start().await;
    let out = f.run(&["transfers", "--shard", "s2", "-o", "json"]).await;
    let v: bigfleet::read::Transfers = serde_json::from_str(&out).unwrap();
    // Both transfers involve s2; only its ownership line is kept.
    assert_eq!((v.0.active.len(), v.0.recent.len()), (1, 1));
    assert_eq!(
        v.0.shards
            .iter()
            .map(|s| s.shard_id.as_str())
            .collect::<Vec<_>>(),
        ["s2"]
    );
    let out = f.run(&["transfers", "--shard", "s9"]).await;
    assert_eq!(out, "no transfer in flight or recently finished\n");
    f.shutdown().await;
}

#[tokio::test]
async fn no_headers_drops_the_header_line_and_keeps_every_row() {
    let f = Fleet::start().await;
    for (cmd, header) in [
        (&["domains"][..], "KEY"),
        (&["transfers"][..], "TRANSFER"),
        (&["shortfalls"][..], "AGE (CYCLES)"),
        (&["needs", "--cluster", "c-a"][..], "#"),
    ] {
        for wide in [false, true] {
            let mut args = cmd.to_vec();
            if wide {
                args.extend(["-o", "wide"]);
            }
            let with = f.run(&args).await;
            args.push("--no-headers");
            let without = f.run(&args).await;
            let header_lines = |s: &str| {
                s.lines()
                    .filter(|l| l.trim_start().starts_with(header))
                    .count()
            };
            assert_eq!(header_lines(&with), 1, "{cmd:?}: {with}");
            assert_eq!(header_lines(&without), 0, "{cmd:?}: {without}");
            // Data rows only: as many lines as `-o name` has records.
            let names = f.run(&[cmd, &["-o", "name"][..]].concat()).await;
            assert_eq!(without.lines().count(), names.lines().count(), "{without}");
            assert!(names.lines().count() >= 2, "{names}");
        }
    }
    f.shutdown().await;
}

fn shard(id: &str, reachable: bool) -> ShardView {
    ShardView {
        shard_id: id.into(),
        address: format!("{id}.bigfleet:7780"),
        reachable,
        error: if reachable {
            String::new()
        } else {
            "unavailable: connection refused".into()
        },
        registered_at_unix_ns: 1,
        last_report_age_ms: if reachable { 2_500 } else { -1 },
        cycle: if reachable { 41 } else { 0 },
        machines_by_state: if reachable {
            [
                ("MACHINE_STATE_CONFIGURED".to_owned(), 120),
                ("MACHINE_STATE_IDLE".to_owned(), 7),
                ("MACHINE_STATE_FAILED".to_owned(), 1),
            ]
            .into()
        } else {
            Default::default()
        },
        sessions: if reachable { 12 } else { 0 },
        needs: if reachable { 30 } else { 0 },
        unmet_needs: if reachable { 2 } else { 0 },
        shard_epoch: 3,
        actions_in_flight: 0,
        reported_total_machines: Some(130),
        reported_free_machines: if reachable { Some(7) } else { None },
        source: if reachable {
            "shard-info".into()
        } else {
            String::new()
        },
        // Times relative to now would not make a golden; staleness is tested in tests/cli.rs.
        inventory_stale: false,
        inventory_listed_at_unix_ns: 0,
        removals_held: 0,
    }
}

#[test]
fn shards_match_their_goldens_in_every_format() {
    let doc = ShardsOutput {
        coordinator_reachable: true,
        coordinator_error: String::new(),
        shards: vec![shard("shard-0", true), shard("shard-1", false)],
    };
    for (format, flags) in FORMATS {
        let cli = Cli::try_parse_from([&["bigfleet", "shards"][..], flags].concat()).unwrap();
        let out = render(&doc, cli.global.output_options()).unwrap();
        golden(&format!("shards.{format}"), &out);
    }
    let empty = ShardsOutput {
        shards: vec![],
        ..doc
    };
    let opts = OutputOptions::new(OutputFormat::Table);
    golden("shards-empty.table", &render(&empty, opts).unwrap());
}

/// A `Write` the test can read while the command still runs.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// A command running in the background until it is stopped.
struct Running {
    stop_tx: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), bigfleet::CliError>>,
}

impl Running {
    /// Stops the command and waits for it, which must have succeeded.
    async fn stop(self) {
        self.stop_tx.send(()).unwrap();
        self.task.await.unwrap().unwrap();
    }

    /// Stops the watch, which must have printed exactly `printed` and `warning` only once
    /// (a warning is repeated only when it changes).
    async fn stop_having_printed(self, out: &Shared, printed: &str, err: &Shared, warning: &str) {
        self.stop().await;
        assert_eq!(out.text(), printed);
        let err = err.text();
        assert_eq!(
            err.matches(warning).count(),
            1,
            "{warning:?} not once: {err}"
        );
    }
}

/// Starts `cli` (a `--watch`) in the background; its output and error streams stay
/// readable while it runs.
fn watch(cli: Cli) -> (Shared, Shared, Running) {
    let (out, err) = (Shared::default(), Shared::default());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let (mut out, mut err) = (out.clone(), err.clone());
        tokio::spawn(async move {
            bigfleet::run_until(cli, &mut out, &mut err, async {
                let _ = stop_rx.await;
            })
            .await
        })
    };
    (out, err, Running { stop_tx, task })
}

/// Waits until the coordinator double has answered five more calls.
async fn five_more_polls(c: &CoordinatorDouble) {
    let calls = || c.state().calls.len();
    let before = calls();
    eventually("five more polls", || calls() >= before + 5).await;
}

/// The suite's one wait, with the bound these watch tests always had.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    bigfleet_testkit::wait_until(Duration::from_secs(30), what, async || cond()).await;
}

#[tokio::test]
async fn watch_reprints_only_changes_and_stops_cleanly() {
    let f = Fleet::start().await;
    let cli = Cli::try_parse_from(f.argv(&[
        "domains",
        "--watch",
        "--watch-interval",
        "20ms",
        "-o",
        "name",
    ]))
    .unwrap();
    let (out, err, running) = watch(cli);
    let first = "domain/rack=r1\ndomain/topology.kubernetes.io/zone=eu-west-1a\n";
    eventually("the first answer", || out.text() == first).await;

    // Unchanged answers are not printed again, however many polls run.
    five_more_polls(&f.coordinator).await;
    assert_eq!(out.text(), first);

    f.coordinator
        .state()
        .domains
        .push(domain("rack", "r2", "s1"));
    let second = format!(
        "{first}domain/rack=r1\ndomain/rack=r2\ndomain/topology.kubernetes.io/zone=eu-west-1a\n"
    );
    eventually("the changed answer", || out.text() == second).await;

    // A failing poll is a warning, not the end of the watch.
    f.coordinator.state().follower_of = Some(String::new());
    eventually("a warning", || err.text().contains("(still watching)")).await;
    f.coordinator.state().follower_of = None;

    running
        .stop_having_printed(&out, &second, &err, "(still watching)")
        .await;
    f.shutdown().await;
}

fn bigfleet(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
        .args(args)
        .env_remove("BIGFLEET_OUTPUT")
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    (
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn the_binary_watches_until_ctrl_c_and_exits_zero() {
    let f = Fleet::start().await;
    let argv = f.argv(&["domains", "--watch", "--watch-interval", "50ms"]);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_bigfleet"))
        .args(&argv[1..])
        .env_remove("BIGFLEET_OUTPUT")
        .env("BIGFLEET_CONTEXT", "/nonexistent/context.json")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let header = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    })
    .await
    .unwrap();
    assert!(header.starts_with("KEY"), "{header}");
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C ends a watch cleanly");
    f.shutdown().await;
}

#[test]
fn completion_scripts_name_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let (script, _) = bigfleet(&["completion", shell]);
        assert!(script.len() > 1000, "{shell}: {script}");
        for sub in [
            "shards",
            "needs",
            "shortfalls",
            "domains",
            "actions",
            "machines",
            "chunk-size",
            "admin",
            "assign-domain",
            "completion",
            // Flags without their dashes: fish spells them `-l no-headers`.
            "no-headers",
            "watch-interval",
        ] {
            assert!(script.contains(sub), "{shell} completion lacks {sub}");
        }
        // The output formats are offered as values of -o.
        assert!(
            script.contains("yaml") && script.contains("wide"),
            "{shell}"
        );
    }
    let (bash, _) = bigfleet(&["completion", "bash"]);
    assert!(bash.contains("complete -F _bigfleet"), "{bash}");
}

#[test]
fn version_carries_the_git_commit() {
    let (v, _) = bigfleet(&["--version"]);
    let v = v.trim_end();
    let rest = v
        .strip_prefix(concat!("bigfleet ", env!("CARGO_PKG_VERSION"), " (git "))
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{v}"));
    let sha = rest.strip_suffix(", dirty tree").unwrap_or(rest);
    assert!(
        sha == "unknown"
            || ((7..=40).contains(&sha.len()) && sha.bytes().all(|b| b.is_ascii_hexdigit())),
        "{v}"
    );
    // Subcommands report the same version.
    let (sub, _) = bigfleet(&["shards", "--version"]);
    assert_eq!(sub.trim_end(), v.replacen("bigfleet", "bigfleet-shards", 1));
}

#[test]
fn help_shows_examples() {
    for args in [
        &["--help"][..],
        &["shards", "--help"],
        &["needs", "--help"],
        &["actions", "--help"],
        &["machines", "--help"],
        &["admin", "snapshot", "restore", "--help"],
        &["pki", "issue", "--help"],
        &["completion", "--help"],
    ] {
        let (help, _) = bigfleet(args);
        let examples = help
            .split("Examples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{args:?}: {help}"));
        assert!(examples.contains("  bigfleet "), "{args:?}: {help}");
    }
}

// --- actions and machines: a real svc-inspect over shard doubles with fixed records ---

use bigfleet_proto::mesh::v1 as mesh;

const T0: i64 = 1_700_000_000_000_000_000;
const SEC: i64 = 1_000_000_000;

#[allow(clippy::too_many_arguments)]
fn action(
    shard: &str,
    seq: u64,
    kind: &str,
    reason: &str,
    machine: &str,
    cluster: &str,
    outcome: &str,
    finished: i64,
) -> mesh::ActionRecord {
    mesh::ActionRecord {
        shard_id: shard.into(),
        seq,
        cycle: 40 + i64::try_from(seq).unwrap(),
        kind: kind.into(),
        reason: reason.into(),
        machine_id: machine.into(),
        cluster_id: cluster.into(),
        outcome: outcome.into(),
        decided_at_unix_nanos: finished - 5 * SEC,
        finished_at_unix_nanos: finished,
        ..Default::default()
    }
}

fn machine(id: &str, state: pb::MachineState, cluster: &str, idle_since: i64) -> mesh::MachineRow {
    mesh::MachineRow {
        shard_id: String::new(),
        machine: Some(pb::Machine {
            id: id.into(),
            state: state as i32,
            instance_type: "m5.large".into(),
            zone: "eu-west-1a".into(),
            price_per_hour: 0.096,
            cluster: cluster.into(),
            capacity_type: pb::CapacityType::OnDemand as i32,
            ..Default::default()
        }),
        idle_since_unix_nanos: idle_since,
    }
}

/// s1 and s2 serve actions and machines, s3 is registered but down; `late` is served but
/// registered only when a test says so.
struct History {
    coordinator: CoordinatorDouble,
    coordinator_server: RunningServer,
    shards: Vec<RunningServer>,
    late: RunningServer,
    inspect: svc_inspect::Running,
    /// When m-003 became idle (it shows as idle for 3d2h).
    idle_since: i64,
}

impl History {
    async fn start(recent: Vec<mesh::ActionRecord>) -> Self {
        let now = svc_inspect::fleet::now_unix_nanos();
        let idle_since = now - (3 * 86_400 + 2 * 3600 + 30) * SEC;
        let mut provision = action(
            "s1",
            1,
            "provision",
            "phase1.idle",
            "m-001",
            "c-a",
            "succeeded",
            T0 + 60 * SEC,
        );
        provision.need_fingerprint = "fp-9a1c".into();
        provision.group = "train".into();
        provision.priority = 100;
        provision.action_id = "act-17".into();
        provision.started_at_unix_nanos = T0 + 57 * SEC;
        provision.run_nanos = 3 * SEC + 500_000_000;
        let mut reclaim = action(
            "s1",
            2,
            "reclaim",
            "phase3.excess",
            "m-002",
            "c-b",
            "failed",
            T0 + 120 * SEC,
        );
        reclaim.grace_seconds = 30.0;
        reclaim.started_at_unix_nanos = T0 + 116 * SEC;
        reclaim.run_nanos = 4 * SEC;
        let mut s2_actions = vec![
            action(
                "s2",
                7,
                "bootstrap",
                "phase1.speculative",
                "m-101",
                "c-a",
                "succeeded",
                T0 + 90 * SEC,
            ),
            action(
                "s2",
                8,
                "release",
                "phase3.release",
                "m-102",
                "",
                "dryrun",
                T0 + 150 * SEC,
            ),
        ];
        s2_actions.extend(recent);
        let mut failed = machine("m-005", pb::MachineState::Failed, "", 0);
        failed.machine.as_mut().unwrap().last_error = "configure timed out".into();
        let mut idle = machine("m-003", pb::MachineState::Idle, "", idle_since);
        {
            let m = idle.machine.as_mut().unwrap();
            m.capacity_type = pb::CapacityType::Spot as i32;
            m.price_per_hour = 0.031;
            m.labels = [("pool".to_owned(), "gpu".to_owned())].into();
        }
        let mut spec = machine("m-004", pb::MachineState::Speculative, "", 0);
        spec.machine.as_mut().unwrap().zone = String::new();
        let doubles = [
            records_shard(
                "s1",
                vec![provision, reclaim],
                vec![
                    machine("m-001", pb::MachineState::Configured, "c-a", 0),
                    idle,
                    failed,
                ],
            ),
            records_shard(
                "s2",
                s2_actions,
                vec![
                    machine("m-002", pb::MachineState::Configured, "c-b", 0),
                    spec,
                ],
            ),
        ];
        let mut shards = Vec::new();
        let mut registry = Vec::new();
        for d in doubles {
            let id = d.shard_id.clone();
            let server = d.serve(None).await.unwrap();
            registry.push(registry_entry(&id, server.tcp_addr().unwrap()));
            shards.push(server);
        }
        registry.push(registry_entry(
            "s3",
            bigfleet_testkit::reserve_tcp_port().unwrap().release(),
        ));
        let late = records_shard(
            "s4",
            vec![
                // Finished with the newest already printed, after it, and before it.
                action(
                    "s4",
                    1,
                    "provision",
                    "phase1.idle",
                    "m-401",
                    "c-a",
                    "succeeded",
                    T0 + 150 * SEC,
                ),
                action(
                    "s4",
                    2,
                    "preempt",
                    "phase2.inversion",
                    "m-402",
                    "c-a",
                    "succeeded",
                    T0 + 200 * SEC,
                ),
                action(
                    "s4",
                    3,
                    "provision",
                    "phase1.idle",
                    "m-403",
                    "c-a",
                    "succeeded",
                    T0 + 100 * SEC,
                ),
            ],
            vec![],
        )
        .serve(None)
        .await
        .unwrap();
        let coordinator = CoordinatorDouble::new(CoordinatorState {
            shards: registry,
            ..Default::default()
        });
        let coordinator_server = coordinator.serve(None).await.unwrap();
        let mut cfg = svc_inspect::Config::local(&format!(
            "http://{}",
            coordinator_server.tcp_addr().unwrap()
        ));
        cfg.cache_ttl = Duration::ZERO;
        let inspect = svc_inspect::start(cfg).await.unwrap();
        Self {
            coordinator,
            coordinator_server,
            shards,
            late,
            inspect,
            idle_since,
        }
    }

    fn argv(&self, args: &[&str], via_inspect: bool) -> Vec<String> {
        let mut argv = argv_against(&self.coordinator_server, args);
        if via_inspect {
            argv.extend([
                "--inspect".to_owned(),
                format!("http://{}", self.inspect.grpc_addr()),
            ]);
        }
        argv
    }

    /// (stdout, stderr) of a successful command.
    async fn run(&self, args: &[&str], via_inspect: bool) -> (String, String) {
        run_ok(self.argv(args, via_inspect)).await
    }

    async fn shutdown(self) {
        self.inspect.shutdown().await.unwrap();
        self.coordinator_server.shutdown().await.unwrap();
        self.late.shutdown().await.unwrap();
        for s in self.shards {
            s.shutdown().await.unwrap();
        }
    }
}

#[tokio::test]
async fn actions_and_machines_match_their_goldens_in_every_format() {
    let f = History::start(vec![]).await;
    for (name, cmd) in [("actions", &["actions"][..]), ("machines", &["machines"])] {
        for (format, flags) in FORMATS {
            let mut args = cmd.to_vec();
            args.extend_from_slice(flags);
            let (out, err) = f.run(&args, true).await;
            // The only value that depends on the clock: m-003's idle start.
            let out = out.replace(&f.idle_since.to_string(), "IDLE_SINCE");
            golden(&format!("{name}.{format}"), &out);
            // Shards that did not answer are named on stderr, never in the data.
            assert!(
                err.starts_with("warning: shard s3 did not answer (")
                    && err.ends_with(&format!("); its {name} are missing\n"))
                    && err.lines().count() == 1,
                "{args:?}: {err}"
            );
            assert!(!out.contains("s3"), "{args:?}: {out}");
        }
        // Without --inspect the CLI fans out itself, with the same answer.
        let (direct, _) = f.run(&[cmd, &["-o", "json"][..]].concat(), false).await;
        let (via, _) = f.run(&[cmd, &["-o", "json"][..]].concat(), true).await;
        assert_eq!(direct, via, "{cmd:?}");
    }
    f.shutdown().await;
}

#[tokio::test]
async fn actions_filter_by_time_cluster_shard_and_limit() {
    let now = svc_inspect::fleet::now_unix_nanos();
    let recent = action(
        "s2",
        9,
        "provision",
        "phase1.idle",
        "m-103",
        "c-a",
        "succeeded",
        now - 600 * SEC,
    );
    let f = History::start(vec![recent]).await;
    let names = |s: String| s.lines().map(str::to_owned).collect::<Vec<_>>();
    for via in [true, false] {
        let (all, _) = f.run(&["actions", "-o", "name"], via).await;
        assert_eq!(
            names(all),
            [
                "action/s2/9",
                "action/s2/8",
                "action/s1/2",
                "action/s2/7",
                "action/s1/1"
            ],
            "newest first"
        );
        let (hour, _) = f
            .run(&["actions", "--since", "1h", "-o", "name"], via)
            .await;
        assert_eq!(names(hour), ["action/s2/9"]);
        let (five, _) = f
            .run(&["actions", "--since", "5m", "-o", "name"], via)
            .await;
        assert_eq!(five, "");
        let (c, _) = f
            .run(&["actions", "--cluster", "c-a", "-o", "name"], via)
            .await;
        assert_eq!(names(c), ["action/s2/9", "action/s2/7", "action/s1/1"]);
        let (s, err) = f
            .run(&["actions", "--shard", "s1", "-o", "name"], via)
            .await;
        assert_eq!(names(s), ["action/s1/2", "action/s1/1"]);
        assert_eq!(err, "", "only s1 was asked");
        let (l, _) = f.run(&["actions", "--limit", "2", "-o", "name"], via).await;
        assert_eq!(names(l), ["action/s2/9", "action/s2/8"]);
    }
    let (empty, _) = f.run(&["actions", "--since", "5m"], true).await;
    assert_eq!(empty, "no recorded action matches\n");
    f.shutdown().await;
}

#[tokio::test]
async fn machines_page_and_filter() {
    let f = History::start(vec![]).await;
    let all = "machine/m-001\nmachine/m-002\nmachine/m-003\nmachine/m-004\nmachine/m-005\n";
    for via in [true, false] {
        let run = |args: &'static [&'static str]| f.run(args, via);
        assert_eq!(run(&["machines", "-o", "name"]).await.0, all);
        // Two at a time: three pages make the same list.
        assert_eq!(
            run(&["machines", "--chunk-size", "2", "-o", "name"])
                .await
                .0,
            all
        );
        assert_eq!(
            run(&[
                "machines",
                "--chunk-size",
                "2",
                "--limit",
                "3",
                "-o",
                "name"
            ])
            .await
            .0,
            "machine/m-001\nmachine/m-002\nmachine/m-003\n"
        );
        let (table, _) = run(&["machines", "--chunk-size", "2", "--limit", "3"]).await;
        assert!(table.starts_with("3 of 5 matching machines\n"), "{table}");
        assert_eq!(
            run(&["machines", "--state", "idle,configured", "-o", "name"])
                .await
                .0,
            "machine/m-001\nmachine/m-002\nmachine/m-003\n"
        );
        assert_eq!(
            run(&["machines", "--cluster", "c-b", "-o", "name"]).await.0,
            "machine/m-002\n"
        );
        let (s2, err) = run(&["machines", "--shard", "s2", "-o", "name"]).await;
        assert_eq!(
            (s2.as_str(), err.as_str()),
            ("machine/m-002\nmachine/m-004\n", "")
        );
    }
    f.shutdown().await;
}

#[tokio::test]
async fn watching_actions_appends_only_new_ones() {
    let f = History::start(vec![]).await;
    let cli = Cli::try_parse_from(f.argv(
        &[
            "actions",
            "--watch",
            "--watch-interval",
            "20ms",
            "-o",
            "name",
        ],
        true,
    ))
    .unwrap();
    let (out, err, running) = watch(cli);
    // Oldest first, so later ones follow.
    let first = "action/s1/1\naction/s2/7\naction/s1/2\naction/s2/8\n";
    eventually("the first answer", || out.text() == first).await;
    five_more_polls(&f.coordinator).await;
    assert_eq!(
        out.text(),
        first,
        "the newest action is asked for again, not printed again"
    );

    f.coordinator
        .state()
        .shards
        .push(registry_entry("s4", f.late.tcp_addr().unwrap()));
    let second = format!("{first}action/s4/1\naction/s4/2\n");
    eventually("the new actions", || out.text() == second).await;
    five_more_polls(&f.coordinator).await;
    // s4's action that finished before the newest printed one never shows.
    running
        .stop_having_printed(&out, &second, &err, "shard s3 did not answer")
        .await;
    f.shutdown().await;
}
