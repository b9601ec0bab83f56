//! A real etcd server for tests (this crate's and the services'): spawned from the binary
//! in `BIGFLEET_ETCD` (default `etcd` on `PATH`) on free loopback ports with a temporary
//! data dir, health-polled, and killed by PID on drop — it never outlives the test.
//!
//! Without an etcd binary, [`EtcdServer::start_or_skip`] returns `None` so a developer
//! machine without etcd can still run the rest of the suite — unless `CI=true` (or
//! `BIGFLEET_ETCD` names a missing file), where a missing etcd is a failure, never a
//! silent skip.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

use crate::{EtcdConfig, EtcdTls};

/// How long a fresh member may take to answer a linearizable read.
const READY_TIMEOUT: Duration = Duration::from_secs(15);

/// The etcd binary to run: `$BIGFLEET_ETCD`, else `etcd` from `PATH`; `None` if absent.
///
/// # Panics
/// If `BIGFLEET_ETCD` names a file that does not exist: an explicit setting that is wrong
/// is a broken setup, not a machine without etcd.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("BIGFLEET_ETCD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "BIGFLEET_ETCD={} does not exist", p.display());
        return Some(p);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("etcd"))
            .find(|p| p.is_file())
    })
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn free_port() -> u16 {
    bigfleet_testkit::free_tcp_port().expect("reserve a loopback port")
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn client_url(&self, tls: bool) -> String {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }
}

/// TLS for the server side of the client port (PEM files); clients must present a
/// certificate signed by `ca`.
#[derive(Debug, Clone)]
pub struct ServerTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// One etcd member or a small cluster of them, all on loopback.
#[derive(Debug)]
pub struct EtcdServer {
    binary: PathBuf,
    /// Server TLS on the client port, and the client TLS the readiness probe uses.
    tls: Option<(ServerTls, EtcdTls)>,
    members: Vec<Member>,
    initial_cluster: String,
    // Declared last: removed after the processes are gone.
    dir: tempfile::TempDir,
}

impl EtcdServer {
    /// A single-member server, or `None` when there is no etcd binary and `CI` is not
    /// `true`. Panics if etcd exists but does not come up.
    pub async fn start_or_skip() -> Option<Self> {
        Self::cluster_or_skip(1).await
    }

    /// A `size`-member cluster (see [`EtcdServer::start_or_skip`] for `None`).
    pub async fn cluster_or_skip(size: usize) -> Option<Self> {
        Self::start_inner(size, None).await
    }

    /// A single member serving its client port over TLS with client-certificate
    /// authentication; `probe` is what the readiness probe connects with.
    pub async fn start_tls_or_skip(server: ServerTls, probe: EtcdTls) -> Option<Self> {
        Self::start_inner(1, Some((server, probe))).await
    }

    async fn start_inner(size: usize, tls: Option<(ServerTls, EtcdTls)>) -> Option<Self> {
        let Some(binary) = etcd_binary() else {
            assert!(
                !ci(),
                "CI=true but no etcd binary: install etcd-server or set BIGFLEET_ETCD"
            );
            eprintln!("skipping: no etcd binary (set BIGFLEET_ETCD or install etcd-server)");
            return None;
        };
        // A port picked free may be taken by someone else before etcd binds it; that shows
        // up as a member that never becomes ready, so try a few fresh port sets.
        let mut last = String::new();
        for _ in 0..3 {
            match Self::try_start(&binary, size, tls.clone()).await {
                Ok(s) => return Some(s),
                Err(e) => last = e,
            }
        }
        panic!("etcd did not start: {last}");
    }

    async fn try_start(
        binary: &Path,
        size: usize,
        tls: Option<(ServerTls, EtcdTls)>,
    ) -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let members: Vec<Member> = (0..size)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let mut server = Self {
            binary: binary.to_owned(),
            tls,
            members,
            initial_cluster,
            dir,
        };
        for i in 0..size {
            server.spawn_member(i).map_err(|e| e.to_string())?;
        }
        for i in 0..size {
            if let Err(e) = server.wait_ready(i).await {
                return Err(format!("{e}; log:\n{}", server.log_tail(i)));
            }
        }
        Ok(server)
    }

    fn spawn_member(&mut self, i: usize) -> std::io::Result<()> {
        let m = &self.members[i];
        let client_url = m.client_url(self.tls.is_some());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)?;
        let child = Command::new(&self.binary)
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--logger", "zap", "--log-level", "warn"])
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-cluster")
            .arg(&self.initial_cluster)
            .args(["--initial-cluster-state", "new"])
            .args(self.tls.iter().flat_map(|(t, _)| {
                [
                    "--client-cert-auth".into(),
                    "--cert-file".into(),
                    t.cert.clone().into_os_string(),
                    "--key-file".into(),
                    t.key.clone().into_os_string(),
                    "--trusted-ca-file".into(),
                    t.ca.clone().into_os_string(),
                ]
            }))
            .arg("--initial-cluster-token")
            .arg(self.dir.path().file_name().unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.members[i].child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, i: usize) -> Result<(), String> {
        let url = self.endpoint(i);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut opts = ConnectOptions::new().with_connect_timeout(Duration::from_millis(500));
        if let Some((_, probe)) = &self.tls {
            let mut cfg = EtcdConfig::new([url.clone()]);
            cfg.tls = Some(probe.clone());
            opts = cfg
                .connect_options(&cfg.timing().map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        }
        let client = Client::connect([url.as_str()], Some(opts))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("etcd member {i} exited: {status}"));
            }
            let mut c = client.clone();
            // A linearizable read needs a leader: the member is really serving.
            let probe = tokio::time::timeout(Duration::from_millis(500), c.get("health", None));
            if let Ok(Ok(_)) = probe.await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd member {i} not ready within {READY_TIMEOUT:?}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn log_tail(&self, i: usize) -> String {
        let log = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Client URLs of every member (`https://` with TLS).
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Client URL of member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client_url(self.tls.is_some())
    }

    /// PID of member `i` (while running).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].child.as_ref().map(Child::id)
    }

    fn signal(&self, i: usize, sig: &str) {
        let pid = self.pid(i).expect("member is running");
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(pid.to_string())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -{sig} {pid} failed");
    }

    /// Freezes every member (SIGSTOP): sockets stay open, nothing answers — like a hung
    /// or partitioned etcd.
    pub fn pause(&self) {
        for i in 0..self.members.len() {
            self.signal(i, "STOP");
        }
    }

    /// Thaws every member (SIGCONT).
    pub fn resume(&self) {
        for i in 0..self.members.len() {
            self.signal(i, "CONT");
        }
    }

    /// Kills member `i` (SIGKILL) and reaps it; its data dir stays for [`Self::restart`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on the same ports and data dir.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn_member(i).expect("respawn etcd");
        if let Err(e) = self.wait_ready(i).await {
            panic!("{e}; log:\n{}", self.log_tail(i));
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                // SIGKILL also ends a stopped process.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
