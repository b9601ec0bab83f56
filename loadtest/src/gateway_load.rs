//! The gateway load test: N simulated operators against one session gateway.
//!
//! Phases: connect every operator (bounded concurrent set-ups), then measure for the
//! configured duration (roll-ups every interval per operator, acknowledgement latency from
//! send to ack), then stop everything. Loopback targets only; the run always ends by itself.

use std::net::{IpAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::certs::{CertError, DirCa};
use crate::demand::{Churn, Demand};
use crate::latency::LatencyRecorder;
use crate::operator::{Operator, OperatorConfig, OperatorHandle, OperatorStats};

/// A load-test run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    /// The gateway's public address (`host:port`, `http://…`, `https://…`); loopback only.
    pub target: String,
    pub sessions: usize,
    pub rollup_interval: Duration,
    /// Length of the measurement window (after every operator connected).
    pub duration: Duration,
    /// mTLS: directory with `ca.crt` and cluster certificates or `ca.key` (see
    /// [`crate::certs`]).
    pub tls_dir: Option<PathBuf>,
    /// Server name for certificate verification (default: the target host).
    pub server_name: Option<String>,
    /// The gateway's process id, to report its resident memory.
    pub gateway_pid: Option<u32>,
    /// Connection set-ups in flight at once during the ramp.
    pub connect_concurrency: usize,
    /// Give up waiting for all operators to connect after this long and measure anyway.
    pub ramp_timeout: Duration,
    /// Cluster ids are `<prefix><index>`.
    pub cluster_prefix: String,
    pub demand: Demand,
    pub churn: Option<Churn>,
}

impl LoadConfig {
    pub fn new(target: &str, sessions: usize) -> Self {
        Self {
            target: target.to_owned(),
            sessions,
            rollup_interval: Duration::from_secs(2),
            duration: Duration::from_secs(30),
            tls_dir: None,
            server_name: None,
            gateway_pid: None,
            connect_concurrency: 256,
            ramp_timeout: Duration::from_secs(180),
            cluster_prefix: "load-".to_owned(),
            demand: Demand::typical(),
            churn: Some(Churn {
                probability: 0.2,
                spread: 0.25,
            }),
        }
    }
}

/// The result (`--json` prints it as one line).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadReport {
    pub sessions: usize,
    /// Operators connected at the end of the measurement window.
    pub connected: usize,
    /// Roll-ups sent during the measurement window.
    pub rollups_sent: u64,
    /// Roll-up acknowledgements received during the measurement window.
    pub acks: u64,
    pub rollups_per_s: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    /// Failed connects, lost sessions, rejected or unapplied roll-ups and dropped responses
    /// over the whole run.
    pub errors: u64,
    /// Gateway resident memory at the end of the window (needs `--gateway-pid`).
    pub rss_mb_gateway: Option<f64>,
    /// Gateway resident memory before any operator connected.
    pub rss_mb_gateway_baseline: Option<f64>,
    /// Gateway resident memory right after every operator connected (each has sent one
    /// roll-up and is otherwise idle).
    pub rss_mb_gateway_connected: Option<f64>,
    /// (connected − baseline) / sessions, in KiB.
    pub rss_kb_per_session: Option<f64>,
    pub ramp_s: f64,
    pub measure_s: f64,
    pub connect_failures: u64,
    pub disconnects: u64,
    pub rollups_rejected: u64,
    pub rollups_not_applied: u64,
    pub rollups_coalesced: u64,
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("target {0:?} is not a loopback address; load tests only run against this machine")]
    NotLoopback(String),
    #[error("target {0:?} cannot be resolved")]
    Unresolvable(String),
    #[error(transparent)]
    Certs(#[from] CertError),
    #[error("preparing certificates: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Checks that `target` resolves to loopback addresses only.
pub fn ensure_loopback(target: &str) -> Result<(), LoadError> {
    let hostport = target
        .strip_prefix("https://")
        .or_else(|| target.strip_prefix("http://"))
        .unwrap_or(target)
        .trim_end_matches('/');
    let addrs: Vec<_> = hostport
        .to_socket_addrs()
        .map_err(|_| LoadError::Unresolvable(target.to_owned()))?
        .collect();
    if addrs.is_empty() {
        return Err(LoadError::Unresolvable(target.to_owned()));
    }
    if addrs.iter().all(|a| is_loopback(a.ip())) {
        Ok(())
    } else {
        Err(LoadError::NotLoopback(target.to_owned()))
    }
}

fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => {
            v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Resident memory of `pid` in MiB, from `/proc/<pid>/status`.
pub fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    connected: usize,
    rollups_sent: u64,
    acks: u64,
    connect_failures: u64,
    disconnects: u64,
    rejected: u64,
    not_applied: u64,
    dropped: u64,
    coalesced: u64,
}

impl Totals {
    fn of(ops: &[OperatorHandle]) -> Self {
        let mut t = Totals::default();
        for op in ops {
            let s: OperatorStats = op.stats();
            t.connected += usize::from(s.connected);
            t.rollups_sent += s.rollups_sent;
            t.acks += s.rollup_acks;
            t.connect_failures += s.connect_failures;
            t.disconnects += s.disconnects;
            t.rejected += s.rollups_rejected;
            t.not_applied += s.rollups_not_applied;
            t.dropped += s.responses_dropped;
            t.coalesced += s.rollups_coalesced;
        }
        t
    }

    fn errors(&self) -> u64 {
        self.connect_failures + self.disconnects + self.rejected + self.not_applied + self.dropped
    }
}

/// Runs the load test; `progress` receives one human-readable line about every second.
pub async fn run(cfg: LoadConfig, mut progress: impl FnMut(&str)) -> Result<LoadReport, LoadError> {
    ensure_loopback(&cfg.target)?;
    let rss = |_: ()| cfg.gateway_pid.and_then(rss_mb);
    let baseline = rss(());
    let target = if cfg.target.contains("://") {
        cfg.target.clone()
    } else if cfg.tls_dir.is_some() {
        format!("https://{}", cfg.target)
    } else {
        format!("http://{}", cfg.target)
    };
    let names: Vec<String> = (0..cfg.sessions)
        .map(|i| format!("{}{i}", cfg.cluster_prefix))
        .collect();

    let tls = match &cfg.tls_dir {
        None => None,
        Some(dir) => {
            progress(&format!(
                "preparing {} cluster certificates in {}",
                names.len(),
                dir.display()
            ));
            let dir = dir.clone();
            let names = names.clone();
            let configs = tokio::task::spawn_blocking(move || {
                let ca = DirCa::open(&dir)?;
                names
                    .iter()
                    .map(|n| ca.cluster_client_config(n))
                    .collect::<Result<Vec<_>, CertError>>()
            })
            .await??;
            Some(configs)
        }
    };

    let latency = LatencyRecorder::new();
    let gate = Arc::new(Semaphore::new(cfg.connect_concurrency.max(1)));
    let ops: Vec<OperatorHandle> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut oc = OperatorConfig::new(name, &target);
            oc.tls = tls.as_ref().map(|t| Arc::clone(&t[i]));
            oc.server_name.clone_from(&cfg.server_name);
            oc.rollup_interval = cfg.rollup_interval;
            oc.demand = cfg.demand.clone();
            oc.churn = cfg.churn;
            oc.latency = Some(latency.clone());
            oc.connect_gate = Some(Arc::clone(&gate));
            Operator::spawn(oc)
        })
        .collect();

    // Ramp: until everyone is connected or the ramp times out.
    let ramp_start = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let t = Totals::of(&ops);
        progress(&format!(
            "ramp t={:.0}s connected={}/{} acks={} errors={}",
            ramp_start.elapsed().as_secs_f64(),
            t.connected,
            cfg.sessions,
            t.acks,
            t.errors()
        ));
        if t.connected >= cfg.sessions || ramp_start.elapsed() >= cfg.ramp_timeout {
            break;
        }
    }
    let ramp_s = ramp_start.elapsed().as_secs_f64();
    let connected_rss = rss(());

    // Measurement window.
    latency.reset();
    let start_totals = Totals::of(&ops);
    let window_start = Instant::now();
    let mut last = start_totals;
    let mut last_at = window_start;
    while window_start.elapsed() < cfg.duration {
        let left = cfg.duration.saturating_sub(window_start.elapsed());
        tokio::time::sleep(left.min(Duration::from_secs(1))).await;
        let t = Totals::of(&ops);
        let dt = last_at.elapsed().as_secs_f64().max(1e-6);
        progress(&format!(
            "measure t={:.0}s connected={}/{} acks/s={:.0} p99={:.1}ms errors={}",
            window_start.elapsed().as_secs_f64(),
            t.connected,
            cfg.sessions,
            (t.acks - last.acks) as f64 / dt,
            latency.quantile_ms(0.99),
            t.errors()
        ));
        last = t;
        last_at = Instant::now();
    }
    let measure_s = window_start.elapsed().as_secs_f64();
    let end = Totals::of(&ops);
    let end_rss = rss(());

    for op in &ops {
        op.stop();
    }
    for op in ops {
        op.join().await;
    }

    let acks = end.acks - start_totals.acks;
    let per_session = match (baseline, connected_rss) {
        (Some(b), Some(c)) if cfg.sessions > 0 => Some((c - b) * 1024.0 / cfg.sessions as f64),
        _ => None,
    };
    Ok(LoadReport {
        sessions: cfg.sessions,
        connected: end.connected,
        rollups_sent: end.rollups_sent - start_totals.rollups_sent,
        acks,
        rollups_per_s: acks as f64 / measure_s.max(1e-6),
        ack_p50_ms: latency.quantile_ms(0.5),
        ack_p99_ms: latency.quantile_ms(0.99),
        errors: end.errors(),
        rss_mb_gateway: end_rss,
        rss_mb_gateway_baseline: baseline,
        rss_mb_gateway_connected: connected_rss,
        rss_kb_per_session: per_session,
        ramp_s,
        measure_s,
        connect_failures: end.connect_failures,
        disconnects: end.disconnects,
        rollups_rejected: end.rejected,
        rollups_not_applied: end.not_applied,
        rollups_coalesced: end.coalesced,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_targets() {
        assert!(ensure_loopback("127.0.0.1:7780").is_ok());
        assert!(ensure_loopback("http://127.0.0.1:7780").is_ok());
        assert!(ensure_loopback("https://[::1]:7780").is_ok());
        assert!(ensure_loopback("localhost:7780").is_ok());
        assert!(matches!(
            ensure_loopback("10.1.2.3:7780"),
            Err(LoadError::NotLoopback(_))
        ));
        assert!(ensure_loopback("no-port").is_err());
    }

    #[test]
    fn own_rss_is_readable() {
        let mb = rss_mb(std::process::id()).unwrap();
        assert!(mb > 0.0);
        assert!(rss_mb(u32::MAX).is_none());
    }
}
