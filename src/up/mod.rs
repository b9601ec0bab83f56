//! `bigfleet up`: the whole mesh on one machine, as separate child processes (ADR-0005).
//!
//! A single-node coordinator, N shards (gateway + decide + execute over Unix sockets),
//! one fake provider per shard seeded from a catalog, svc-inspect, and simulated operators
//! sending realistic demand with churn. `up` waits for every child's `/readyz`, prints a
//! progress line every second and the dashboard URL, reports a crashed child with its last
//! log lines, and on Ctrl-C / SIGTERM (or after `--duration`) stops everything: SIGTERM to
//! each child's process group, SIGKILL after a deadline.
//!
//! * [`local`] — the local mesh harness (also used by the end-to-end tests): plan, start, supervise.
//! * [`child`] — one child process and its log.
//! * [`chaos`] — `--chaos`: seeded kills and the invariants they must not break.
//! * [`demo`] — `--shards` above one: zones per shard and a transfer to watch (ADR-0139).
//! * [`progress`] — the progress view (in place on a terminal) and the `--duration` summary.
//! * [`operators`] — the simulated operators' demand.
//! * [`pki`] — `--tls` certificates.
//! * [`probe`] — `/readyz` and `/metrics` over plain HTTP.

pub mod chaos;
pub mod child;
pub mod demo;
pub mod local;
pub mod operators;
pub mod pki;
pub mod probe;
pub mod progress;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use bigfleet_fake_provider::Catalog;
use bigfleet_loadtest::OperatorHandle;

use self::local::{Crash, FakeSeed, Mesh, MeshSpec, ProviderSpec};
use self::progress::{Snapshot, Summary};

/// Errors of `bigfleet up` and of the mesh harness.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error("{0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {name}: {source}")]
    Spawn {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    ChildFailed(Box<Crash>),
    #[error("not ready after {}: {children}\n{tails}", humantime::format_duration(*.timeout))]
    NotReady {
        children: String,
        timeout: Duration,
        tails: String,
    },
    #[error("tls: {0}")]
    Tls(String),
    #[error("catalog: {0}")]
    Catalog(String),
    #[error("{0}")]
    Rpc(String),
}

/// Flags of `bigfleet up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Shards to run (each: session gateway + decide + execute, and its own fake provider).
    #[arg(long, default_value_t = 1)]
    pub shards: usize,

    /// Coordinator replicas: one Raft cluster (children `coordinator-0` …; `coordinator`
    /// when there is one). Shards, inspect and the CLI context point at the first.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=7))]
    pub coordinators: u16,

    /// Clusters (`cluster-0` …); cluster i is served by shard i mod --shards.
    #[arg(long, default_value_t = 4)]
    pub clusters: usize,

    /// Seed each fake provider with generated machines (this many in total, split over the
    /// shards) instead of the built-in catalog.
    #[arg(long, conflicts_with_all = ["catalog", "provider"])]
    pub machines: Option<u64>,

    /// Seed each fake provider from this catalog file (fake-provider catalog format).
    #[arg(long, value_name = "FILE", conflicts_with = "provider")]
    pub catalog: Option<PathBuf>,

    /// Run every service with mTLS, from a throwaway CA with one certificate per role.
    #[arg(long)]
    pub tls: bool,

    /// Exit after this long (e.g. `60s`), printing one line of JSON on stdout.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,

    /// Once every service is ready, write a JSON document naming each endpoint here.
    #[arg(long, value_name = "PATH")]
    pub ports_file: Option<PathBuf>,

    /// Where to write the CLI context (addresses and, with --tls, the admin certificate), so
    /// `bigfleet shards` and friends find this mesh with no flags. Default:
    /// $XDG_CONFIG_HOME/bigfleet/context.json or ~/.config/bigfleet/context.json. Removed
    /// again when `up` stops.
    #[arg(long, env = "BIGFLEET_CONTEXT", value_name = "PATH")]
    pub context_file: Option<PathBuf>,

    /// Run directory (logs, sockets, data). Default: a fresh temporary directory, removed
    /// after a clean exit and kept when a child crashed.
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Use this capacity provider (`http://host:port`, `unix:///path`) instead of the fake.
    #[arg(long, value_name = "ADDR")]
    pub provider: Option<String>,

    /// Simulated operators to start (default: one per cluster); 0 leaves all demand to
    /// external operators.
    #[arg(long)]
    pub operators: Option<usize>,

    /// Period of each simulated operator's roll-ups.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub rollup_interval: Duration,

    /// Decide's cycle ticker.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub cycle_interval: Duration,

    /// No progress lines on stderr.
    #[arg(long)]
    pub quiet: bool,

    /// Restart a crashed child (jittered backoff: up to 1 s, doubling up to 30 s). Off: a crashed
    /// child stays down and `up` keeps running without it — e.g. to watch the shards keep
    /// provisioning with the coordinator gone. Either way, `up` stops when a child crashes
    /// 5 times within a minute.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub restart: bool,

    /// Session cap of each gateway for external operators (e.g. `gateway-load`). `up` passes
    /// the gateway `--max-sessions` = this + its own simulated operators on that shard, so
    /// they never take slots from a load run.
    #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS)]
    pub max_sessions: usize,

    /// Kill components at random while running — the coordinator, a decide (its restart
    /// bumps the epoch and fences the old one), an execute worker, a gateway (operators
    /// reconnect), a fake provider — and start each again a second later. With
    /// --duration, the last --chaos-settle has no kills, and the JSON summary gets a
    /// `chaos` object proving the invariants: every need met at the end, no machine
    /// actuated twice, no fenced call accepted, no reclaim storm after a restart.
    #[arg(long)]
    pub chaos: bool,

    /// Seed of the victims and the intervals (default: random, printed so the run can be
    /// repeated).
    #[arg(long, requires = "chaos")]
    pub chaos_seed: Option<u64>,

    /// Mean interval between kills (each one uniform in ½..1½ of it).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub chaos_every: Duration,

    /// With --duration: no kills during this last stretch of the run, so the mesh can
    /// recover before the invariants are checked.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    pub chaos_settle: Duration,

    /// What chaos may kill (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = chaos::Component::ALL.to_vec())]
    pub chaos_targets: Vec<chaos::Component>,
}

/// The session gateway's own `--max-sessions` default.
pub const DEFAULT_MAX_SESSIONS: usize = 10_000;

/// Per shard (by id): the gateway's `--max-sessions` — `--max-sessions` for external
/// operators plus `up`'s own simulated operators served by that shard (issue 17: with 2
/// clusters and a 10,000 cap, a 10,000-session load run only got 9,998).
pub fn gateway_session_caps(args: &UpArgs) -> BTreeMap<String, Vec<String>> {
    let shards = args.shards.max(1);
    let ours = args.operators.unwrap_or(args.clusters).min(args.clusters);
    (0..shards)
        .map(|shard| {
            let own = (0..ours)
                .filter(|&i| operators::shard_of(i, shards) == shard)
                .count();
            (
                format!("shard-{shard}"),
                vec![
                    "--max-sessions".to_owned(),
                    args.max_sessions.saturating_add(own).to_string(),
                ],
            )
        })
        .collect()
}

/// The per-shard fake-provider seeds `args` ask for. Built-in and generated catalogs bind
/// their pre-configured machines to the clusters the shard actually serves.
pub fn provider_spec(args: &UpArgs) -> Result<ProviderSpec, UpError> {
    if let Some(addr) = &args.provider {
        return Ok(ProviderSpec::External(addr.clone()));
    }
    if let Some(path) = &args.catalog {
        // Validate up front: a bad file is a clear error here, not a crashed child.
        Catalog::load(path).map_err(|e| UpError::Catalog(format!("{}: {e}", path.display())))?;
        return Ok(ProviderSpec::Fake(vec![FakeSeed::File(path.clone())]));
    }
    let shards = args.shards.max(1);
    let mut seeds = Vec::with_capacity(shards);
    for shard in 0..shards {
        let mut catalog = match args.machines {
            None => Catalog::builtin(),
            Some(total) => {
                let share =
                    total / shards as u64 + u64::from((shard as u64) < total % shards as u64);
                Catalog::generated(share.max(1), shard as u64 + 1)
            }
        };
        let served: Vec<String> = operators::clusters_of(shard, shards, args.clusters)
            .into_iter()
            .map(|i| format!("cluster-{i}"))
            .collect();
        if !served.is_empty() {
            for pool in &mut catalog.pools {
                pool.clusters.clone_from(&served);
            }
        }
        seeds.push(FakeSeed::Catalog(Box::new(catalog)));
    }
    Ok(ProviderSpec::Fake(seeds))
}

/// Entry point of `bigfleet up`.
pub async fn main(args: UpArgs) -> ExitCode {
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("bigfleet up: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the mesh until a signal, `--duration` or a crash; `Ok(false)` after a crash.
pub async fn run(args: UpArgs) -> Result<bool, UpError> {
    if args.shards == 0 {
        return Err(UpError::Config("--shards must be at least 1".into()));
    }
    let exe = std::env::current_exe().map_err(|source| UpError::Io {
        what: "locating the bigfleet executable".into(),
        source,
    })?;
    let (run_dir, temp) = match &args.data_dir {
        Some(d) => (d.clone(), None),
        None => {
            let t = tempfile::Builder::new()
                .prefix("bigfleet-up-")
                .tempdir()
                .map_err(|source| UpError::Io {
                    what: "creating a run directory".into(),
                    source,
                })?;
            (t.path().to_owned(), Some(t))
        }
    };
    let mut spec = MeshSpec::new(exe, &run_dir);
    spec.shards = args.shards;
    spec.coordinators = usize::from(args.coordinators);
    spec.tls = args.tls;
    spec.provider = provider_spec(&args)?;
    let demo = demo::enabled(&args);
    if demo {
        spec.shared_provider = true;
        spec.provider = ProviderSpec::Fake(vec![FakeSeed::Catalog(Box::new(demo::catalog()))]);
        spec.coordinator_flags.extend(demo::coordinator_flags());
    }
    spec.decide_flags = vec![
        "--cycle-interval".into(),
        humantime::format_duration(args.cycle_interval).to_string(),
    ];
    spec.gateway_shard_flags = gateway_session_caps(&args);
    spec.provider_audit = args.chaos;
    // The children log at info to their files unless the user says otherwise.
    if std::env::var_os("RUST_LOG").is_none() {
        spec.env.push(("RUST_LOG".into(), "info".into()));
    }
    let clusters = args.clusters;
    let operator_count = args.operators.unwrap_or(clusters).min(clusters);

    eprintln!(
        "bigfleet up: starting {} coordinator(s), {} shard(s), {} cluster(s), {} simulated operator(s){} in {}",
        args.coordinators,
        args.shards,
        clusters,
        operator_count,
        if args.tls { ", mTLS" } else { "" },
        run_dir.display()
    );
    let started = Instant::now();
    let mut mesh = match Mesh::start(spec).await {
        Ok(m) => m,
        Err(e) => {
            // Keep the logs of a failed start.
            if let Some(t) = temp {
                let kept = t.keep();
                eprintln!("bigfleet up: logs kept in {}", kept.display());
            }
            return Err(e);
        }
    };
    // Before the ports file (what "ready" means to scripts): every shard owns its zone. A
    // signal meanwhile stops the mesh as one during the run would.
    if demo {
        eprintln!(
            "bigfleet up: multi-shard demo: shard-i owns zone fake-z<i>; only shard-1's zone has {} machines, and shard-0's clusters ask for them",
            demo::GPU_TYPE
        );
        tokio::select! {
            r = demo::assign_zones(&mesh, Duration::from_secs(60)) => {
                if let Err(e) = r {
                    eprintln!("bigfleet up: {e}");
                }
            }
            () = bigfleet_mesh::stop_signal() => {
                mesh.shutdown().await;
                drop(temp);
                eprintln!("bigfleet up: stopped");
                return Ok(true);
            }
        }
    }
    // Before the ports file: whoever waits for that one finds the context in place.
    let context_path = args
        .context_file
        .clone()
        .or_else(|| crate::context::default_path(|k| std::env::var(k).ok()));
    if let Some(path) = &context_path {
        match write_context(&mesh, &run_dir, path) {
            Ok(()) => eprintln!(
                "bigfleet up: the CLI now talks to this mesh (context {}); another context: BIGFLEET_CONTEXT=<file> bigfleet ...",
                path.display()
            ),
            Err(e) => eprintln!("bigfleet up: could not write the CLI context: {e}"),
        }
    }
    if let Some(path) = &args.ports_file {
        let json = serde_json::to_string_pretty(mesh.ports()).map_err(|e| UpError::Io {
            what: "encoding the ports file".into(),
            source: std::io::Error::other(e),
        })?;
        write_atomically(path, &json)?;
    }
    let operators = operators::spawn(
        &mesh,
        clusters,
        operator_count,
        &operators::OperatorPlan {
            rollup_interval: args.rollup_interval,
            multi_shard_demo: demo,
            ..operators::OperatorPlan::default()
        },
    )?;
    print_banner(&mesh, started.elapsed());

    let mut chaos = args.chaos.then(|| {
        let seed = args.chaos_seed.unwrap_or_else(chaos::random_seed);
        let plan = chaos::ChaosPlan {
            seed,
            every: args.chaos_every,
            settle: args.chaos_settle,
            targets: args.chaos_targets.clone(),
        };
        eprintln!(
            "bigfleet up: chaos: seed {seed} (repeat with --chaos-seed {seed}), a kill every ~{} among {}{}",
            humantime::format_duration(plan.every),
            plan.targets
                .iter()
                .map(|t| t.as_str())
                .collect::<Vec<_>>()
                .join(","),
            match args.duration {
                Some(d) if d <= plan.settle => format!(
                    "; --duration {} is within --chaos-settle {}: nothing will be killed",
                    humantime::format_duration(d),
                    humantime::format_duration(plan.settle)
                ),
                Some(_) => format!(
                    ", none in the last {}",
                    humantime::format_duration(plan.settle)
                ),
                None => String::new(),
            }
        );
        let now = Instant::now();
        chaos::Chaos::new(plan, now, args.duration.map(|d| now + d))
    });
    let (seen, last) = supervise(
        &mut mesh,
        &operators,
        &args,
        started,
        &run_dir,
        chaos.as_mut(),
    )
    .await;
    let chaos_report = chaos
        .as_ref()
        .map(|c| c.report(last.as_ref(), &mesh.actuation_logs()));
    let operator_errors: u64 = operators.iter().map(|o| o.stats().errors()).sum();
    for o in &operators {
        o.stop();
    }
    for o in operators {
        o.join().await;
    }
    let statuses = mesh.shutdown().await;
    if let Some(path) = &context_path {
        crate::context::remove_if_written_by(path, std::process::id());
    }
    tracing::debug!(?statuses, "children stopped");

    // A child that crashed and came back is not a failed run; one that crash-looped is.
    let clean = seen.gave_up.is_empty();
    let keep_logs = !seen.crashes.is_empty();
    if args.duration.is_some()
        && let Some(snap) = &last
    {
        let summary = Summary {
            configured: snap.configured(),
            shortfalls: snap.shortfalls,
            counts: snap.counts.clone(),
            errors: seen.gave_up.len() as u64 + operator_errors + snap.problems.len() as u64,
            crashed: seen.crashes.iter().map(|c| c.name.clone()).collect(),
            restarts: seen.restarts,
            elapsed_seconds: started.elapsed().as_secs_f64(),
            shards: args.shards,
            clusters,
            operators: operator_count,
            run_dir: run_dir.display().to_string(),
            chaos: chaos_report,
            transfers: snap.transfers.map(|t| t.moved),
            cross_shard_drains: snap.transfers.map(|t| t.drains),
            shortfalls_by_shard: (args.shards > 1).then(|| snap.shortfalls_by_shard.clone()),
        };
        let line = serde_json::to_string(&summary).unwrap_or_else(|_| "{}".into());
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
    match temp {
        Some(t) if !clean || keep_logs => {
            let kept = t.keep();
            eprintln!("bigfleet up: logs kept in {}", kept.display());
        }
        Some(t) => drop(t),
        None => {}
    }
    eprintln!("bigfleet up: stopped");
    Ok(clean)
}

fn write_atomically(path: &std::path::Path, text: &str) -> Result<(), UpError> {
    let tmp = path.with_extension("tmp");
    let io = |source| UpError::Io {
        what: format!("writing {}", path.display()),
        source,
    };
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The CLI context for this mesh: the coordinator and svc-inspect, and with mTLS the admin
/// certificate (the CLI's role).
fn write_context(
    mesh: &Mesh,
    run_dir: &std::path::Path,
    path: &std::path::Path,
) -> Result<(), UpError> {
    let p = mesh.ports();
    let scheme = if mesh.pki().is_some() {
        "https"
    } else {
        "http"
    };
    let Some(coordinator) = &p.coordinator else {
        return Err(UpError::Tls("no coordinator in this mesh".into()));
    };
    let tls = match mesh.pki() {
        None => None,
        Some(pki) => {
            let f = pki.files("admin")?;
            Some(crate::context::ContextTls {
                cert: f.cert,
                key: f.key,
                ca: f.ca,
            })
        }
    };
    let ctx = crate::context::CliContext {
        coordinator: format!("{scheme}://{}", coordinator.grpc),
        inspect: p.inspect.as_ref().map(|i| format!("{scheme}://{}", i.grpc)),
        tls,
        written_by: Some(crate::context::Writer {
            pid: std::process::id(),
            run_dir: run_dir.to_path_buf(),
        }),
    };
    crate::context::save(path, &ctx).map_err(|e| UpError::Io {
        what: "writing the CLI context".into(),
        source: std::io::Error::other(e),
    })
}

fn print_banner(mesh: &Mesh, took: Duration) {
    let p = mesh.ports();
    eprintln!(
        "bigfleet up: ready in {:.1}s — logs in {}",
        took.as_secs_f64(),
        mesh.log_dir().display()
    );
    if let Some(i) = &p.inspect {
        eprintln!("  dashboard     {}", i.dashboard);
        eprintln!("  inspect gRPC  {}", i.grpc);
    }
    if let Some(c) = &p.coordinator {
        eprintln!("  coordinator   {}", c.grpc);
    }
    for s in &p.shards {
        eprintln!(
            "  {}       gateway {} (operators dial this)",
            s.id, s.gateway_grpc
        );
    }
    eprintln!("  provider      {}", p.provider.target);
    eprintln!("  Ctrl-C stops everything.");
}

/// Crashes within [`CRASH_LOOP_WINDOW`] after which `up` gives up on a child and stops.
const CRASH_LOOP_LIMIT: usize = 5;
const CRASH_LOOP_WINDOW: Duration = Duration::from_secs(60);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Restart bookkeeping of one child.
#[derive(Debug, Default)]
struct ChildHistory {
    crashes: std::collections::VecDeque<Instant>,
    /// When the pending restart is due (None: running, or not to be restarted).
    due: Option<Instant>,
    /// Created at the first crash: the workspace's one jittered backoff (ADR-0123).
    backoff: Option<bigfleet_mesh::Backoff>,
}

impl ChildHistory {
    /// Records a crash at `now`; true when the child is crash-looping.
    fn crashed(&mut self, now: Instant) -> bool {
        self.crashes.push_back(now);
        while self
            .crashes
            .front()
            .is_some_and(|t| now.duration_since(*t) > CRASH_LOOP_WINDOW)
        {
            self.crashes.pop_front();
        }
        let next = self
            .backoff
            .get_or_insert_with(|| {
                bigfleet_mesh::Backoff::new(bigfleet_mesh::BackoffPolicy::new(
                    Duration::from_secs(1),
                    RESTART_BACKOFF_MAX,
                ))
            })
            .next_delay();
        self.due = Some(now + next);
        self.crashes.len() >= CRASH_LOOP_LIMIT
    }
}

/// What supervision saw.
#[derive(Debug, Default)]
struct Supervision {
    crashes: Vec<Crash>,
    restarts: u64,
    /// Children given up on (crash loops).
    gave_up: Vec<String>,
}

/// The supervision loop: progress every second, crash detection and restarts with
/// backoff, stop conditions (Ctrl-C, --duration, a crash loop).
async fn supervise(
    mesh: &mut Mesh,
    operators: &[OperatorHandle],
    args: &UpArgs,
    started: Instant,
    run_dir: &std::path::Path,
    mut chaos: Option<&mut chaos::Chaos>,
) -> (Supervision, Option<Snapshot>) {
    let deadline = args.duration.map(|d| Instant::now() + d);
    // Dropped on return: the last progress line stays on screen.
    let view = if args.quiet {
        progress::ProgressView::plain()
    } else {
        progress::ProgressView::new()
    };
    // Messages scroll above the live progress line instead of being drawn over.
    macro_rules! say {
        ($($t:tt)*) => {
            view.println(&format!($($t)*))
        };
    }
    let mut seen = Supervision::default();
    let mut history: std::collections::BTreeMap<String, ChildHistory> = Default::default();
    let mut manual_down: std::collections::BTreeSet<String> = Default::default();
    let mut previous: Option<(Snapshot, Instant)> = None;
    let signal = bigfleet_mesh::stop_signal();
    tokio::pin!(signal);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stop = tokio::select! {
            () = &mut signal => {
                say!("bigfleet up: stopping");
                true
            }
            _ = tick.tick() => false,
        };
        // Failure on demand (`bigfleet lab kill|restart <child>`): a killed child is left
        // down on purpose, so it is neither reported as a crash nor restarted.
        for (path, request) in crate::lab::pending(run_dir) {
            let result = match request {
                None => Err(
                    "not a request (kill <child> | restart <child> | provider-lists ...)"
                        .to_owned(),
                ),
                Some(crate::lab::Request::ProviderLists {
                    shard,
                    fault,
                    lists,
                }) => {
                    let body = crate::lab::Request::list_faults_body(fault, lists);
                    match mesh
                        .provider_admin_post(shard, "/admin/list-faults", &body)
                        .await
                    {
                        Ok(v) => {
                            let what = match fault {
                                None => "Lists are honest again".to_owned(),
                                Some(f) => format!(
                                    "the next {lists} Lists answer {}",
                                    crate::lab::answer_name(Some(f))
                                ),
                            };
                            say!("bigfleet up: provider-{shard}: {what} (on request)");
                            Ok(format!(
                                "provider-{shard}: {what}; {} queued, {} Lists so far\n",
                                v["pending"], v["list_calls"]
                            ))
                        }
                        Err(e) => Err(format!("provider-{shard}: {e}")),
                    }
                }
                Some(crate::lab::Request::Kill(name)) => match mesh.kill(&name).await {
                    Ok(_) => {
                        say!("bigfleet up: {name} killed on request; it stays down");
                        manual_down.insert(name.clone());
                        Ok(format!("killed {name}\n"))
                    }
                    Err(e) => Err(e.to_string()),
                },
                Some(crate::lab::Request::Restart(name)) => match mesh.restart(&name).await {
                    Ok(()) => {
                        say!("bigfleet up: {name} restarted on request");
                        manual_down.remove(&name);
                        history.remove(&name);
                        Ok(format!("restarted {name}\n"))
                    }
                    Err(e) => Err(e.to_string()),
                },
            };
            crate::lab::answer(&path, result);
        }
        let now = Instant::now();
        let mut looping = false;
        for c in mesh.crashes() {
            say!("bigfleet up: {c}");
            let h = history.entry(c.name.clone()).or_default();
            if h.crashed(now) {
                say!(
                    "bigfleet up: {} crashed {CRASH_LOOP_LIMIT} times within {}s; stopping everything",
                    c.name,
                    CRASH_LOOP_WINDOW.as_secs()
                );
                seen.gave_up.push(c.name.clone());
                looping = true;
            } else if args.restart {
                say!(
                    "bigfleet up: restarting {} in {:.1?}",
                    c.name,
                    h.due
                        .map_or(Duration::ZERO, |d| d.saturating_duration_since(now))
                );
            } else {
                h.due = None;
                say!(
                    "bigfleet up: {} stays down (--restart=false); the rest keeps running",
                    c.name
                );
            }
            seen.crashes.push(c);
        }
        if args.restart && !looping {
            for (name, h) in &mut history {
                if h.due.is_some_and(|d| d <= now) {
                    h.due = None;
                    match mesh.restart(name).await {
                        Ok(()) => {
                            seen.restarts += 1;
                            say!("bigfleet up: {name} restarted");
                        }
                        // Counted like a crash: it will be retried with a longer backoff.
                        Err(e) => {
                            say!("bigfleet up: restarting {name} failed: {e}");
                            if h.crashed(Instant::now()) {
                                seen.gave_up.push(name.clone());
                                looping = true;
                            }
                        }
                    }
                }
            }
        }
        if let Some(c) = chaos.as_deref_mut()
            && !looping
            && !stop
        {
            let names = mesh.child_names();
            let running: std::collections::BTreeSet<String> =
                mesh.running_pids().into_iter().map(|(n, _)| n).collect();
            let held = |n: &str| {
                manual_down.contains(n) || history.get(n).is_some_and(|h| h.due.is_some())
            };
            let leader = if c.kill_due(Instant::now()) {
                mesh.coordinator_leader().await
            } else {
                None
            };
            match c.step(
                Instant::now(),
                &names,
                |n| running.contains(n) && !held(n),
                leader.as_deref(),
            ) {
                chaos::Step::Nothing => {}
                chaos::Step::Kill(victim) => match mesh.kill(&victim).await {
                    Ok(_) => {
                        say!("bigfleet up: chaos: killed {victim} (SIGKILL)");
                        let was_leader = leader.as_deref() == Some(victim.as_str());
                        c.killed(
                            &victim,
                            Instant::now(),
                            previous.as_ref().map(|(s, _)| s),
                            was_leader,
                        );
                    }
                    Err(e) => say!("bigfleet up: chaos: killing {victim} failed: {e}"),
                },
                // `lab kill` in the meantime: it stays down as asked.
                chaos::Step::Restart(victim) if manual_down.contains(&victim) => {
                    c.restarted(&victim, Instant::now(), false);
                }
                chaos::Step::Restart(victim) => match mesh.restart(&victim).await {
                    Ok(()) => {
                        c.restarted(&victim, Instant::now(), true);
                        say!("bigfleet up: chaos: {victim} is back");
                    }
                    // Left to supervision, like a crash: retried with backoff.
                    Err(e) => {
                        c.restarted(&victim, Instant::now(), false);
                        say!("bigfleet up: chaos: restarting {victim} failed: {e}");
                        if history
                            .entry(victim.clone())
                            .or_default()
                            .crashed(Instant::now())
                        {
                            seen.gave_up.push(victim);
                            looping = true;
                        }
                    }
                },
            }
        }
        let finished = deadline.is_some_and(|d| Instant::now() >= d);
        if stop || looping || finished || !args.quiet || chaos.is_some() {
            let snap = progress::sample(mesh).await;
            if !args.quiet {
                let connected = operators.iter().filter(|o| o.is_connected()).count();
                let prev = previous.as_ref().map(|(s, at)| (s, at.elapsed()));
                let down: Vec<&str> = history
                    .iter()
                    .filter(|(_, h)| h.due.is_some() || !args.restart)
                    .map(|(n, _)| n.as_str())
                    .chain(manual_down.iter().map(String::as_str))
                    .collect();
                let mut line =
                    progress::render(started.elapsed(), &snap, prev, (connected, operators.len()));
                if !seen.crashes.is_empty() || !down.is_empty() {
                    line.push_str(&format!(
                        " | crashes {} restarts {}{}",
                        seen.crashes.len(),
                        seen.restarts,
                        if down.is_empty() {
                            String::new()
                        } else {
                            format!(" down: {}", down.join(","))
                        }
                    ));
                }
                if let Some(c) = chaos.as_deref() {
                    line.push_str(&format!(" | chaos kills {}", c.kill_count()));
                    if let Some(v) = c.down() {
                        line.push_str(&format!(" ({v} down)"));
                    } else if let Some(v) = c.last_victim() {
                        line.push_str(&format!(" (last {v})"));
                    }
                }
                view.show(&line);
            }
            let last = snap.clone();
            previous = Some((snap, Instant::now()));
            if stop || looping || finished {
                return (seen, Some(last));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(flatten)]
        up: UpArgs,
    }

    fn parse(a: &[&str]) -> Result<UpArgs, clap::Error> {
        T::try_parse_from(std::iter::once("up").chain(a.iter().copied())).map(|t| t.up)
    }

    #[test]
    fn restarts_back_off_with_jitter_up_to_the_cap_and_crash_loops_stop() {
        let mut h = ChildHistory::default();
        let t0 = Instant::now();
        for k in 0..CRASH_LOOP_LIMIT {
            let looping = h.crashed(t0);
            assert_eq!(looping, k + 1 >= CRASH_LOOP_LIMIT, "crash {k}");
            let wait = h.due.expect("a restart is due") - t0;
            let window = Duration::from_secs(1 << k).min(RESTART_BACKOFF_MAX);
            assert!(
                wait <= window && wait >= window / 2,
                "crash {k}: {wait:?} outside [{:?}, {window:?}]",
                window / 2
            );
        }
        // Crashes spread over more than the window never count as a loop.
        let mut h = ChildHistory::default();
        let apart = CRASH_LOOP_WINDOW + Duration::from_secs(1);
        let mut at = t0;
        for _ in 0..2 * CRASH_LOOP_LIMIT {
            at += apart;
            assert!(!h.crashed(at));
        }
        let wait = h.due.expect("due") - at;
        assert!(wait <= RESTART_BACKOFF_MAX, "{wait:?}");
    }

    #[test]
    fn defaults_and_conflicts() {
        let a = parse(&[]).unwrap();
        assert_eq!((a.shards, a.clusters), (1, 4));
        assert_eq!(a.operators, None);
        assert!(!a.tls);
        let a = parse(&["--duration", "60s", "--operators", "0"]).unwrap();
        assert_eq!(a.duration, Some(Duration::from_secs(60)));
        assert_eq!(a.operators, Some(0));
        assert!(parse(&["--machines", "10", "--catalog", "x.json"]).is_err());
        assert!(parse(&["--provider", "http://p:1", "--machines", "10"]).is_err());
    }

    #[test]
    fn builtin_catalogs_bind_machines_to_the_shards_clusters() {
        let a = parse(&["--shards", "2", "--clusters", "3"]).unwrap();
        let ProviderSpec::Fake(seeds) = provider_spec(&a).unwrap() else {
            panic!("fake expected")
        };
        assert_eq!(seeds.len(), 2);
        let clusters = |s: &FakeSeed| match s {
            FakeSeed::Catalog(c) => c.pools[0].clusters.clone(),
            other => panic!("{other:?}"),
        };
        assert_eq!(clusters(&seeds[0]), ["cluster-0", "cluster-2"]);
        assert_eq!(clusters(&seeds[1]), ["cluster-1"]);
    }

    #[test]
    fn generated_machines_are_split_over_shards() {
        let a = parse(&["--shards", "3", "--machines", "100"]).unwrap();
        let ProviderSpec::Fake(seeds) = provider_spec(&a).unwrap() else {
            panic!("fake expected")
        };
        let total: u64 = seeds
            .iter()
            .map(|s| match s {
                FakeSeed::Catalog(c) => c.machine_count(),
                other => panic!("{other:?}"),
            })
            .sum();
        assert_eq!(total, 100);
    }

    /// Issue 17: `up --clusters 2` and a 10,000-session load run against its gateway — all
    /// 10,000 connect, because the gateway's cap is raised by up's own operators.
    #[test]
    fn the_gateway_cap_leaves_room_for_ups_own_operators() {
        let a = parse(&["--clusters", "2"]).unwrap();
        assert_eq!(a.max_sessions, DEFAULT_MAX_SESSIONS);
        let caps = gateway_session_caps(&a);
        assert_eq!(caps["shard-0"], ["--max-sessions", "10002"]);
        // Per shard: 5 clusters over 2 shards are 3 + 2 operators; --operators 3 leaves
        // cluster-3 and cluster-4 to external operators.
        let a = parse(&["--shards", "2", "--clusters", "5", "--max-sessions", "100"]).unwrap();
        let caps = gateway_session_caps(&a);
        assert_eq!(caps["shard-0"][1], "103");
        assert_eq!(caps["shard-1"][1], "102");
        let a = parse(&["--shards", "2", "--clusters", "5", "--operators", "3"]).unwrap();
        let caps = gateway_session_caps(&a);
        assert_eq!(caps["shard-0"][1], "10002");
        assert_eq!(caps["shard-1"][1], "10001");
        let a = parse(&["--operators", "0", "--max-sessions", "7"]).unwrap();
        assert_eq!(gateway_session_caps(&a)["shard-0"][1], "7");
    }

    #[test]
    fn chaos_flags() {
        let a = parse(&[]).unwrap();
        assert!(!a.chaos);
        assert_eq!(a.chaos_targets, chaos::Component::ALL);
        let a = parse(&[
            "--chaos",
            "--chaos-seed",
            "7",
            "--chaos-every",
            "3s",
            "--chaos-targets",
            "decide,provider",
        ])
        .unwrap();
        assert!(a.chaos);
        assert_eq!(a.chaos_seed, Some(7));
        assert_eq!(a.chaos_every, Duration::from_secs(3));
        assert_eq!(
            a.chaos_targets,
            [chaos::Component::Decide, chaos::Component::Provider]
        );
        // A seed without --chaos is a mistake, not silently ignored.
        assert!(parse(&["--chaos-seed", "7"]).is_err());
        assert!(parse(&["--chaos", "--chaos-targets", "inspect"]).is_err());
    }

    #[test]
    fn a_bad_catalog_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.json");
        std::fs::write(&p, "{\"pools\": 3}").unwrap();
        let a = parse(&["--catalog", p.to_str().unwrap()]).unwrap();
        assert!(matches!(provider_spec(&a), Err(UpError::Catalog(_))));
    }
}
