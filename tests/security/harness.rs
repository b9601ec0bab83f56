//! The adversary suite's harness: a CA the test controls, the real services as separate
//! `bigfleet svc ...` processes with mTLS, and clients that present any identity.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bigfleet_identity::ca::{CertificateAuthority, DEFAULT_CA_VALIDITY, IssuedLeaf, LeafRequest};
use bigfleet_identity::{TlsContext, TlsFiles};
use bigfleet_mesh::{ChannelConfig, Target};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

pub const WAIT: Duration = Duration::from_secs(30);

/// A CA whose key the test holds, so it can mint any identity — the attacker's leaked
/// certificates as well as the services' own.
pub struct Pki {
    pub dir: PathBuf,
    pub ca: CertificateAuthority,
}

impl Pki {
    pub fn new(dir: &Path) -> Self {
        let dir = dir.join("pki");
        std::fs::create_dir_all(&dir).unwrap();
        let ca = CertificateAuthority::create("security-suite", DEFAULT_CA_VALIDITY).unwrap();
        ca.write_ca(&dir).unwrap();
        Self { dir, ca }
    }

    /// Issues `identity` (e.g. `cluster/c1`) for loopback and returns its files.
    pub fn leaf(&self, identity: &str) -> (TlsFiles, IssuedLeaf) {
        let leaf = self
            .ca
            .issue(&LeafRequest::new(identity).unwrap().with_loopback())
            .unwrap();
        let stem = identity.replace('/', "-");
        let files = leaf
            .write_bundle(&self.dir, &stem, self.ca.cert_pem())
            .unwrap();
        (files, leaf)
    }

    pub fn files(&self, identity: &str) -> TlsFiles {
        self.leaf(identity).0
    }

    pub fn flags(&self, identity: &str) -> Vec<String> {
        let f = self.files(identity);
        vec![
            format!("--tls-cert={}", f.cert.display()),
            format!("--tls-key={}", f.key.display()),
            format!("--tls-ca={}", f.ca.display()),
        ]
    }

    pub fn client(&self, identity: &str) -> Arc<rustls::ClientConfig> {
        TlsContext::load(&self.files(identity))
            .unwrap()
            .client_config()
            .unwrap()
    }
}

/// A free loopback port for a child to bind (claimed for this process's life).
pub fn port() -> SocketAddr {
    bigfleet_testkit::reserve_tcp_port().unwrap().release()
}

/// One service process; killed on drop.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    pub child: Child,
}

impl Proc {
    /// `bigfleet svc <service> <args>`, stdout and stderr into `<dir>/<name>.log`.
    pub fn spawn(dir: &Path, name: &str, service: &str, args: &[String]) -> Self {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_bigfleet"))
            .arg("svc")
            .arg(service)
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Self {
            name: name.to_owned(),
            log,
            child,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("running")
    }

    /// Resident set size in KiB, from /proc.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    }

    /// Waits for the process to exit on its own and returns its log.
    pub async fn exits(mut self) -> (std::process::ExitStatus, String) {
        let status = tokio::time::timeout(WAIT, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit:\n{}", self.name, self.log_text()))
            .unwrap();
        let log = self.log_text();
        (status, log)
    }

    /// Fails with the whole log if the process has already exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited ({status}):\n{}", self.name, self.log_text());
        }
    }
}

/// An mTLS (or, with `tls: None`, plaintext) channel to a loopback address.
pub async fn channel(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> Result<Channel, String> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let target: Target = format!("{scheme}://{addr}").parse().unwrap();
    let cfg = ChannelConfig {
        connect_timeout: Duration::from_secs(5),
        ..ChannelConfig::default()
    }
    .with_tls(tls);
    bigfleet_mesh::connect(&target, &cfg)
        .await
        .map_err(|e| e.to_string())
}

/// Waits until `addr` accepts TCP connections, failing with the process's log.
pub async fn wait_listening(proc: &mut Proc, addr: SocketAddr) {
    let what = format!("{} to listen on {addr}", proc.name);
    wait_until(WAIT, &what, async || {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        proc.assert_running();
        Err(proc.log_text())
    })
    .await
}

/// A Prometheus sample from an ops port (`name` may carry labels in exposition order).
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let body = http_get(addr, "/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(k, _)| k == &name)
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

/// The sum of every sample of `family` whose labels contain all of `labels`.
pub async fn metric_sum(addr: SocketAddr, family: &str, labels: &[&str]) -> f64 {
    let body = http_get(addr, "/metrics").await.unwrap_or_default();
    body.lines()
        .filter(|l| l.starts_with(family) && !l.starts_with('#'))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' '))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum()
}

pub async fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    http_request(addr, path, &[]).await.map(|(_, body)| body)
}

pub use bigfleet_testkit::{http_request, wait_until};

/// The gRPC code of a call's outcome (`Ok` for success).
pub fn code<T>(r: &Result<T, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// A shard's gateway + decide (work port on) + fake provider, with mTLS, as real processes.
pub struct Shard {
    /// Held so the process lives as long as the shard (killed on drop).
    #[allow(dead_code)]
    pub provider: Proc,
    #[allow(dead_code)]
    pub decide: Proc,
    pub gateway: Proc,
    pub gateway_addr: SocketAddr,
    pub gateway_metrics: SocketAddr,
    pub work_addr: SocketAddr,
    pub decide_metrics: SocketAddr,
}

impl Shard {
    pub async fn start(dir: &Path, pki: &Pki, gateway_extra: &[&str]) -> Self {
        let sockets = dir.join("sockets");
        let provider_sock = dir.join("provider.sock");
        let mut provider = Proc::spawn(
            dir,
            "provider",
            "fake-provider",
            &[
                format!("--socket={}", provider_sock.display()),
                "--generate=8".into(),
                "--instant".into(),
                "--metrics-addr=0".into(),
            ],
        );
        wait_until(WAIT, "the provider socket", async || {
            provider.assert_running();
            provider_sock.exists()
        })
        .await;
        let work_addr = port();
        let decide_metrics = port();
        let mut decide_args = vec![
            "--shard-id=shard-0".to_owned(),
            format!("--socket-dir={}", sockets.display()),
            format!("--provider-addr=unix://{}", provider_sock.display()),
            format!("--data-dir={}", dir.join("decide-data").display()),
            format!("--work-listen={work_addr}"),
            format!("--metrics-addr={decide_metrics}"),
        ];
        decide_args.extend(pki.flags("shard/shard-0"));
        let mut decide = Proc::spawn(dir, "decide", "shard-decide", &decide_args);
        wait_listening(&mut decide, work_addr).await;

        let gateway_addr = port();
        let gateway_metrics = port();
        let mut gw_args = vec![
            "--shard-id=shard-0".to_owned(),
            format!("--listen={gateway_addr}"),
            format!("--socket-dir={}", sockets.display()),
            format!("--metrics-addr={gateway_metrics}"),
        ];
        gw_args.extend(gateway_extra.iter().map(|s| (*s).to_owned()));
        gw_args.extend(pki.flags("shard/shard-0"));
        let mut gateway = Proc::spawn(dir, "gateway", "session-gateway", &gw_args);
        wait_listening(&mut gateway, gateway_addr).await;
        wait_listening(&mut gateway, gateway_metrics).await;
        Self {
            provider,
            decide,
            gateway,
            gateway_addr,
            gateway_metrics,
            work_addr,
            decide_metrics,
        }
    }
}

/// A single coordinator replica with mTLS (`coordinator/coord-0`).
pub struct Coordinator {
    /// Held so the replica lives as long as the struct (killed on drop).
    #[allow(dead_code)]
    pub proc: Proc,
    pub api: SocketAddr,
    pub raft: SocketAddr,
    pub metrics: SocketAddr,
}

impl Coordinator {
    pub async fn start(dir: &Path, pki: &Pki) -> Self {
        let (api, raft, metrics) = (port(), port(), port());
        let mut args = vec![
            "--id=coord-0".to_owned(),
            format!("--listen={api}"),
            format!("--raft-bind={raft}"),
            format!("--metrics-addr={metrics}"),
            format!("--data-dir={}", dir.join("coord-data").display()),
            "--bootstrap".into(),
        ];
        args.extend(pki.flags("coordinator/coord-0"));
        let mut proc = Proc::spawn(dir, "coordinator", "coordinator", &args);
        wait_listening(&mut proc, api).await;
        wait_listening(&mut proc, raft).await;
        // Leader elected: readiness turns 200.
        wait_until(WAIT, "the coordinator to be ready", async || {
            if let Some((200, _)) = http_request(metrics, "/readyz", &[]).await {
                return Ok(());
            }
            proc.assert_running();
            Err(proc.log_text())
        })
        .await;
        Self {
            proc,
            api,
            raft,
            metrics,
        }
    }
}
