//! A small fleet of doubles (coordinator + shards) with svc-inspect in front of it.

pub mod cdp;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_mesh::RunningServer;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use bigfleet_proto::v1alpha1::UnmetReason;
use bigfleet_testkit::TestCa;
use svc_inspect::doubles::{
    CoordinatorDouble, CoordinatorState, ShardDouble, need, registry_entry,
};
use svc_inspect::{Config, Running};

/// A throwaway CA writing one bundle per role into a temp dir.
pub struct Pki {
    pub dir: tempfile::TempDir,
    pub ca: TestCa,
}

impl Pki {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            ca: TestCa::new("inspect-test-ca").unwrap(),
        }
    }

    pub fn files(&self, role: &str) -> TlsFiles {
        let p = self.ca.write_role_bundle(self.dir.path(), role).unwrap();
        TlsFiles::new(p.cert, p.key, p.ca)
    }

    pub fn server(&self, role: &str) -> Arc<rustls::ServerConfig> {
        TlsContext::load(&self.files(role))
            .unwrap()
            .server_config()
            .unwrap()
    }

    pub fn client(&self, role: &str) -> Arc<rustls::ClientConfig> {
        TlsContext::load(&self.files(role))
            .unwrap()
            .client_config()
            .unwrap()
    }
}

/// A TCP address nothing listens on: outside the ephemeral range, where no other test's
/// `:0` listener can appear.
pub fn dead_addr() -> SocketAddr {
    bigfleet_testkit::reserve_tcp_port().unwrap().release()
}

/// svc-inspect pointed at a coordinator that never answers, with no shard known.
pub async fn start_without_coordinator() -> Running {
    svc_inspect::start(Config::local(&format!("http://{}", dead_addr())))
        .await
        .unwrap()
}

/// Shard s1: clusters c-a and c-b; s2: c-a and c-c (with every unmet reason); s3: down.
pub fn shard_doubles() -> Vec<ShardDouble> {
    let desc = |id: &str, configured: i32, idle: i32, sessions: u32, needs: i32, unmet: i32| {
        mesh::ShardDescription {
            shard_id: id.into(),
            shard_epoch: 3,
            cycle: 40,
            machines_by_state: [
                ("MACHINE_STATE_CONFIGURED".to_owned(), configured),
                ("MACHINE_STATE_IDLE".to_owned(), idle),
            ]
            .into(),
            sessions,
            needs,
            unmet_needs: unmet,
            actions_in_flight: 0,
            ..Default::default()
        }
    };
    vec![
        ShardDouble {
            description: Some(desc("s1", 7, 2, 2, 3, 1)),
            delay: None,
            ..ShardDouble::with_verdicts(
                "s1",
                41,
                2_000,
                vec![
                    need("c-a", 10, 5, None),
                    need("c-b", 1, 1, Some(UnmetReason::NoMatchingSupply)),
                    need("c-a", 100, 7, Some(UnmetReason::PriorityStarved)),
                ],
            )
        },
        ShardDouble {
            // A gateway without ShardInfo: only the InspectNeeds header is known.
            description: None,
            delay: None,
            ..ShardDouble::with_verdicts(
                "s2",
                17,
                1_000,
                vec![
                    need("c-c", 50, 9, Some(UnmetReason::TopologyUnsatisfiable)),
                    need("c-a", 10, 2, Some(UnmetReason::PreemptionExhausted)),
                    need("c-c", 10, 5, None),
                ],
            )
        },
    ]
}

pub struct Harness {
    pub coordinator: CoordinatorDouble,
    pub coordinator_server: Option<RunningServer>,
    pub shards: Vec<RunningServer>,
    pub inspect: Option<Running>,
    pub pki: Option<Pki>,
}

pub struct Options {
    /// mTLS everywhere; svc-inspect presents this role.
    pub tls_role: Option<&'static str>,
    pub shards: Vec<ShardDouble>,
    /// Also register a shard nobody answers for.
    pub with_dead_shard: bool,
    pub cache_ttl: Duration,
    pub shard_timeout: Duration,
    /// History sampling (zero: off, as in `Config::local`).
    pub sample_interval: Duration,
    /// In-place refresh of live pages.
    pub page_refresh: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            tls_role: None,
            shards: shard_doubles(),
            with_dead_shard: true,
            cache_ttl: Duration::ZERO,
            shard_timeout: Duration::from_secs(2),
            sample_interval: Duration::ZERO,
            page_refresh: Duration::from_secs(5),
        }
    }
}

impl Harness {
    pub async fn start(opts: Options) -> Self {
        let pki = opts.tls_role.map(|_| Pki::new());
        let mut shards = Vec::new();
        let mut registry = Vec::new();
        for s in opts.shards {
            let id = s.shard_id.clone();
            let tls = pki.as_ref().map(|p| p.server(&format!("shard/{id}")));
            let server = s.serve(tls).await.unwrap();
            registry.push(registry_entry(&id, server.tcp_addr().unwrap()));
            shards.push(server);
        }
        if opts.with_dead_shard {
            registry.push(registry_entry("s3", dead_addr()));
        }
        let report = |shard_id: &str, cycle, (total, free), shortfalls| pb::ShardReportSnapshot {
            shard_id: shard_id.into(),
            cycle,
            received_at_unix_ns: 1,
            summary: Some(pb::ShardSummary {
                total_machines: total,
                free_machines: free,
                ..Default::default()
            }),
            shortfalls,
        };
        let reports = vec![
            report(
                "s1",
                9,
                (9, 2),
                vec![shortfall(1, 100, 3), shortfall(1, 5, 40)],
            ),
            report("s3", 4, (11, 0), vec![shortfall(3, 50, 12)]),
        ];
        let coordinator = CoordinatorDouble::new(CoordinatorState {
            shards: registry,
            reports,
            domains: vec![pb::DomainAssignment {
                topology_key: "rack".into(),
                topology_value: "r1".into(),
                shard_id: "s1".into(),
            }],
            ..Default::default()
        });
        let coordinator_server = coordinator
            .serve(pki.as_ref().map(|p| p.server("admin")))
            .await
            .unwrap();
        let coordinator_addr = format!("http://{}", coordinator_server.tcp_addr().unwrap());
        let mut config = Config::local(&coordinator_addr);
        config.cache_ttl = opts.cache_ttl;
        config.shard_timeout = opts.shard_timeout;
        config.sample_interval = opts.sample_interval;
        config.page_refresh = opts.page_refresh;
        config.drain_timeout = Duration::from_secs(1);
        config.tls = match (&pki, opts.tls_role) {
            (Some(p), Some(role)) => Some(p.files(role)),
            _ => None,
        };
        let inspect = svc_inspect::start(config).await.unwrap();
        Self {
            coordinator,
            coordinator_server: Some(coordinator_server),
            shards,
            inspect: Some(inspect),
            pki,
        }
    }

    pub fn inspect(&self) -> &Running {
        self.inspect.as_ref().unwrap()
    }

    pub fn grpc_uri(&self) -> String {
        format!("http://{}", self.inspect().grpc_addr())
    }

    pub async fn stop_coordinator(&mut self) {
        if let Some(s) = self.coordinator_server.take() {
            s.shutdown().await.unwrap();
        }
    }

    pub async fn shutdown(mut self) {
        if let Some(i) = self.inspect.take() {
            i.shutdown().await.unwrap();
        }
        self.stop_coordinator().await;
        for s in self.shards.drain(..) {
            s.shutdown().await.unwrap();
        }
    }
}

pub fn shortfall(cpu: i32, priority: i32, age: i32) -> pb::Shortfall {
    pb::Shortfall {
        requirements: vec![],
        deficit: Some(pb::Resources {
            resources: [("cpu".to_owned(), cpu.to_string())].into(),
        }),
        priority,
        age_cycles: age,
        interruption_penalty_bucket: 0,
    }
}

/// A GET of inspect's JSON API: (status, decoded body); fails unless the answer is JSON.
pub async fn get_json<T: serde::de::DeserializeOwned>(h: &Harness, path: &str) -> (u16, T) {
    let (status, headers, body) = http_get(h.inspect().http_addr(), path).await;
    assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v.starts_with("application/json")),
        "{path}: {headers:?}"
    );
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}")),
    )
}

/// A raw HTTP/1.1 GET: (status, headers lowercased, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let mut lines = head.lines();
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, headers, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// Renders `url` in headless Chromium (`bin`), saves a screenshot as `shot` in the target
/// directory, and returns the page's DOM; fails unless it contains every one of `expected`.
pub async fn shoot_and_expect(bin: &Path, url: &str, shot: &str, expected: &[&str]) -> String {
    let target = target_dir();
    std::fs::create_dir_all(&target).unwrap();
    let dom = bigfleet_testkit::tools::dump_and_shoot(bin, url, &target.join(shot)).await;
    for e in expected {
        assert!(dom.contains(e), "{url} lacks {e:?}: {dom}");
    }
    dom
}

/// The workspace's target directory (screenshots go there).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join("target")
        })
}
