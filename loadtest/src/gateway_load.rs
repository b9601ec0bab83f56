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
use crate::operator::{Operator, OperatorConfig, OperatorHandle, SessionErrors, Totals};

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
    /// over the whole run, and their sum.
    #[serde(flatten)]
    pub errors: SessionErrors,
    /// Gateway resident memory at the end of the window, under roll-up load (needs
    /// `--gateway-pid`).
    pub rss_mb_gateway: Option<f64>,
    /// Gateway resident memory before any operator connected.
    pub rss_mb_gateway_baseline: Option<f64>,
    /// Gateway resident memory once every operator is connected and has had its first
    /// roll-up acknowledged: every session has done its Hello and a roll-up and sits
    /// between roll-ups.
    pub rss_mb_gateway_idle: Option<f64>,
    /// (idle − baseline) / sessions, in KiB: the memory one idle session costs the gateway.
    pub rss_kb_per_idle_session: Option<f64>,
    /// (end of window − baseline) / sessions, in KiB: the same after the measurement
    /// window's roll-up load (includes what the allocator kept from that churn).
    pub rss_kb_per_session_under_load: Option<f64>,
    /// Gateway CPU time (user + system) spent during the measurement window, in seconds.
    pub cpu_s_gateway: Option<f64>,
    /// This load generator's own CPU time during the measurement window, in seconds.
    pub cpu_s_load: Option<f64>,
    pub ramp_s: f64,
    pub measure_s: f64,
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
    vm_rss_mb(&status)
}

/// `VmRSS` of a `/proc/<pid>/status` text, in MiB.
fn vm_rss_mb(status: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU time (user + system) `pid` has used, in seconds, from `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_cpu_ticks(&stat).map(|ticks| ticks as f64 / CLOCK_TICKS_PER_SECOND)
}

/// `USER_HZ`: the unit of `/proc/<pid>/stat` times, 100 on every Linux ABI we run on.
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command name (field
/// 2) may contain spaces and parentheses, so fields are counted after its closing `)`.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 3 is the first after `)`
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// Memory per session in KiB: `(now − baseline) / sessions`, both in MiB.
pub fn kb_per_session(
    baseline_mb: Option<f64>,
    now_mb: Option<f64>,
    sessions: usize,
) -> Option<f64> {
    match (baseline_mb, now_mb) {
        (Some(b), Some(n)) if sessions > 0 => Some((n - b) * 1024.0 / sessions as f64),
        _ => None,
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
    // Idle memory is measured only once every session has done its Hello and its first
    // roll-up (sent right after the Hello ack), so nothing is counted before the session
    // did real work.
    loop {
        let t = Totals::of(&ops);
        if t.connected_and_acked >= cfg.sessions || ramp_start.elapsed() >= cfg.ramp_timeout {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ramp_s = ramp_start.elapsed().as_secs_f64();
    let idle_rss = rss(());
    let cpu_gw = |_: ()| cfg.gateway_pid.and_then(cpu_seconds);
    let cpu_self = |_: ()| cpu_seconds(std::process::id());
    let (gw_cpu_start, load_cpu_start) = (cpu_gw(()), cpu_self(()));

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
    let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| b - a);
    let cpu_s_gateway = delta(gw_cpu_start, cpu_gw(()));
    let cpu_s_load = delta(load_cpu_start, cpu_self(()));

    for op in &ops {
        op.stop();
    }
    for op in ops {
        op.join().await;
    }

    let acks = end.acks - start_totals.acks;
    Ok(LoadReport {
        sessions: cfg.sessions,
        connected: end.connected,
        rollups_sent: end.rollups_sent - start_totals.rollups_sent,
        acks,
        rollups_per_s: acks as f64 / measure_s.max(1e-6),
        ack_p50_ms: latency.quantile_ms(0.5),
        ack_p99_ms: latency.quantile_ms(0.99),
        errors: end.errors,
        rss_mb_gateway: end_rss,
        rss_mb_gateway_baseline: baseline,
        rss_mb_gateway_idle: idle_rss,
        rss_kb_per_idle_session: kb_per_session(baseline, idle_rss, cfg.sessions),
        rss_kb_per_session_under_load: kb_per_session(baseline, end_rss, cfg.sessions),
        cpu_s_gateway,
        cpu_s_load,
        ramp_s,
        measure_s,
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
    fn per_session_memory_is_the_growth_over_the_baseline() {
        assert_eq!(kb_per_session(Some(10.0), Some(30.0), 1024), Some(20.0));
        assert_eq!(kb_per_session(Some(10.0), Some(30.0), 0), None);
        assert_eq!(kb_per_session(None, Some(30.0), 10), None);
        assert_eq!(kb_per_session(Some(10.0), None, 10), None);
    }

    #[test]
    fn status_and_stat_parsing() {
        let status = "Name:\tgw\nVmHWM:\t  9000 kB\nVmRSS:\t  2048 kB\nThreads:\t3\n";
        assert_eq!(vm_rss_mb(status), Some(2.0));
        assert_eq!(vm_rss_mb("Name:\tgw\n"), None);
        // A command name with spaces and parentheses must not shift the fields.
        let stat = "42 (gw (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_cpu_ticks("42 (gw) S 1"), None);
    }

    #[test]
    fn own_cpu_is_readable() {
        // Burn CPU until the kernel has charged at least one tick (10 ms) to this process.
        // A fixed wall-clock burn is not enough: on a loaded machine 30 ms of wall time can
        // come with less than a tick of CPU time. The deadline only bounds a broken reader.
        let me = std::process::id();
        let start = std::time::Instant::now();
        let mut x = 0u64;
        let mut seen = cpu_seconds(me).expect("own /proc stat");
        while seen <= 0.0 && start.elapsed() < Duration::from_secs(30) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            seen = cpu_seconds(me).expect("own /proc stat");
        }
        assert!(
            seen > 0.0,
            "no CPU time charged after {:?}",
            start.elapsed()
        );
        assert!(cpu_seconds(u32::MAX).is_none());
    }

    #[test]
    fn own_rss_is_readable() {
        let mb = rss_mb(std::process::id()).unwrap();
        assert!(mb > 0.0);
        assert!(rss_mb(u32::MAX).is_none());
    }
}
