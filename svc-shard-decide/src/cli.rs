//! The command line of `bigfleet-shard-decide` (docs/flags.md is the contract).

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_mesh::ServiceFlags;

/// The shard's brain: inventory, reconcile, the decision cycle and the action ledger.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "bigfleet-shard-decide", version, about)]
pub struct Args {
    /// This shard's id (a StatefulSet pod name works).
    #[arg(long, env = "BIGFLEET_SHARD_ID", default_value = "shard-0")]
    pub shard_id: String,

    /// Directory of the shard's Unix sockets: decide.sock (served) and gateway.sock (dialled).
    #[arg(long, env = "BIGFLEET_SOCKET_DIR", default_value = "/run/bigfleet")]
    pub socket_dir: PathBuf,

    /// Also accept Unix-socket peers whose primary gid is this (containers of one pod that
    /// run as different uids but share a group); by default only this process's uid.
    #[arg(long, env = "BIGFLEET_SOCKET_PEER_GID", value_name = "GID")]
    pub socket_peer_gid: Option<u32>,

    /// Optional TCP address for remote execute workers (e.g. `:7782`); under mTLS only
    /// `bigfleet://shard/<id>/execute` may pull work.
    #[arg(long, env = "BIGFLEET_WORK_LISTEN")]
    pub work_listen: Option<String>,

    /// Capacity provider URI (`unix:///path.sock`, `http://host:port`, `https://host:port`).
    #[arg(long, env = "BIGFLEET_PROVIDER_ADDR")]
    pub provider_addr: String,

    /// Where the epoch file lives (`<data-dir>/epoch`).
    #[arg(long, env = "BIGFLEET_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,

    /// Longest time between cycles. Roll-ups that change demand, and workers that go
    /// away, ask for a cycle sooner (see --wake-interval).
    #[arg(long, env = "BIGFLEET_CYCLE_INTERVAL", default_value = "1s", value_parser = humantime::parse_duration)]
    pub cycle_interval: Duration,

    /// Shortest time from one cycle's start to a cycle a wake-up asks for: changed
    /// demand arriving meanwhile is decided together in one cycle. Identical re-sends
    /// never wake a cycle.
    #[arg(long, env = "BIGFLEET_WAKE_INTERVAL", default_value = "250ms", value_parser = humantime::parse_duration)]
    pub wake_interval: Duration,

    /// Leave the first N cycles out of the cycle-duration and per-phase histograms (a cold
    /// start's first full List is not steady-state cost); counters are unaffected.
    #[arg(long, env = "BIGFLEET_METRICS_WARMUP_CYCLES", default_value_t = 0)]
    pub metrics_warmup_cycles: u64,

    /// List with the provider's `since_revision` cursor (only what changed) instead of a
    /// full List every cycle; a full List (with its removal walk) still runs every
    /// --full-list-interval. Worth it from a few thousand machines; until the next full List
    /// a transition decide applied that the provider never made (a refused call) stays in
    /// its view.
    #[arg(long, env = "BIGFLEET_INCREMENTAL_RECONCILE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub incremental_reconcile: bool,

    /// With --incremental-reconcile: how often a full List replaces the incremental one, so
    /// machines the provider stopped reporting are seen (a delta cannot express removal).
    #[arg(long, env = "BIGFLEET_FULL_LIST_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub full_list_interval: Duration,

    /// 0 = unlimited; truncation triggers a follow-up cycle.
    #[arg(long, env = "BIGFLEET_MAX_ACTIONS_PER_CYCLE", default_value_t = 0)]
    pub max_actions_per_cycle: usize,

    /// Recent actions kept for ShardInfo.RecentActions (ADR-0125); 0 keeps none.
    #[arg(long, env = "BIGFLEET_ACTION_HISTORY", default_value_t = svc_shard_decide_core::DEFAULT_ACTION_HISTORY)]
    pub action_history: usize,

    /// Minimum interval between AvailableCapacity hints per (cluster, fingerprint).
    #[arg(long, env = "BIGFLEET_AVAILABLE_CAPACITY_INTERVAL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub available_capacity_interval: Duration,

    /// Smallest relative change of an AvailableCapacity count worth a frame: a count
    /// moving by less than this fraction of the last one sent is held back (confidence
    /// and price changes, and counts below 1/fraction, are always exact). 0 sends every
    /// change, as the original does (ADR-0127).
    #[arg(long, env = "BIGFLEET_AVAILABLE_CAPACITY_MIN_CHANGE", default_value_t = svc_shard_decide_core::DEFAULT_AVAILABLE_CAPACITY_MIN_CHANGE, value_parser = fraction)]
    pub available_capacity_min_change: f64,

    /// Kill switch: decide everything, execute nothing.
    #[arg(long, env = "BIGFLEET_ACTUATION_PAUSED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub actuation_paused: bool,

    /// Shadow mode: decide and log everything, execute nothing.
    #[arg(long, env = "BIGFLEET_DRY_RUN", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub dry_run: bool,

    /// Reclaims started per cluster within any --reclaim-budget-window ≤
    /// max(1, ⌊fraction × (Configured + Draining)⌋), Draining machines counted as
    /// started; 0 disables (ADR-0105).
    #[arg(long, env = "BIGFLEET_RECLAIM_BUDGET_FRACTION", default_value_t = svc_shard_decide_core::rails::DEFAULT_RECLAIM_BUDGET_FRACTION)]
    pub reclaim_budget_fraction: f64,

    /// The wall-clock window of --reclaim-budget-fraction.
    #[arg(long, env = "BIGFLEET_RECLAIM_BUDGET_WINDOW", default_value = "10m", value_parser = humantime::parse_duration)]
    pub reclaim_budget_window: std::time::Duration,

    /// Deprecated: the fraction of --reclaim-budget-fraction (now per window, not per cycle).
    #[arg(
        long,
        env = "BIGFLEET_RECLAIM_CAP_FRACTION",
        conflicts_with = "reclaim_budget_fraction"
    )]
    pub reclaim_cap_fraction: Option<f64>,

    /// Quarantine roll-ups that drop most of a cluster's demand until confirmed.
    #[arg(long, env = "BIGFLEET_EMPTY_ROLLUP_GUARD", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", require_equals = true)]
    pub empty_rollup_guard: bool,

    /// A full provider List may remove at most this many machines at once (or
    /// --removal-hold-fraction of the inventory, whichever is larger); larger removals wait
    /// for --removal-confirmations agreeing Lists over --removal-min-hold.
    #[arg(long, env = "BIGFLEET_REMOVAL_HOLD_COUNT", default_value_t = 10)]
    pub removal_hold_count: usize,

    /// See --removal-hold-count.
    #[arg(long, env = "BIGFLEET_REMOVAL_HOLD_FRACTION", default_value_t = 0.05)]
    pub removal_hold_fraction: f64,

    /// Consecutive full Lists that must leave out exactly the same machines before a held
    /// removal applies.
    #[arg(long, env = "BIGFLEET_REMOVAL_CONFIRMATIONS", default_value_t = 5)]
    pub removal_confirmations: u32,

    /// Phase 2 victim scoring weight of the priority gap (the original's default 1.0).
    #[arg(long, env = "BIGFLEET_VICTIM_WEIGHT_PRIORITY", default_value_t = 1.0)]
    pub victim_weight_priority: f64,

    /// Phase 2 victim scoring weight of drain speed (1 / estimated drain seconds).
    #[arg(
        long,
        env = "BIGFLEET_VICTIM_WEIGHT_DRAIN_SPEED",
        default_value_t = 0.1
    )]
    pub victim_weight_drain_speed: f64,

    /// Phase 2 victim scoring weight of the victim's interruption penalty (reciprocal).
    #[arg(
        long,
        env = "BIGFLEET_VICTIM_WEIGHT_INTERRUPTION",
        default_value_t = 0.1
    )]
    pub victim_weight_interruption: f64,

    /// Phase 2 victim scoring weight of the victim's reclamation penalty (reciprocal).
    #[arg(
        long,
        env = "BIGFLEET_VICTIM_WEIGHT_RECLAMATION",
        default_value_t = 0.1
    )]
    pub victim_weight_reclamation: f64,

    /// Drain time Phase 2 assumes for every victim.
    #[arg(long, env = "BIGFLEET_ESTIMATED_DRAIN", default_value = "30s", value_parser = humantime::parse_duration)]
    pub estimated_drain: std::time::Duration,

    /// Shortest time a held removal waits, however fast Lists come.
    #[arg(long, env = "BIGFLEET_REMOVAL_MIN_HOLD", default_value = "2m", value_parser = humantime::parse_duration)]
    pub removal_min_hold: std::time::Duration,

    /// JSONL decision audit log (one line per executed / suppressed / dry-run action).
    #[arg(long, env = "BIGFLEET_AUDIT_LOG")]
    pub audit_log: Option<PathBuf>,

    /// Roll-up shape bounds and the priority ceiling (ADR-0104), the gateway's flags with
    /// the same defaults: decide validates every roll-up again.
    #[command(flatten)]
    pub rollup_limits: bigfleet_conv::RollupLimitArgs,

    /// Distinct resource names over every cluster's demand in this shard; a roll-up that
    /// would bring the shard above it is rejected whole (ADR-0104).
    #[arg(long, env = "BIGFLEET_MAX_SHARD_RESOURCE_DIMENSIONS", default_value_t = bigfleet_conv::RollupLimits::DEFAULT_MAX_SHARD_DIMENSIONS)]
    pub max_shard_resource_dimensions: usize,

    /// Coordinator URI; unset ⇒ no coordinator reporting at all.
    #[arg(long, env = "BIGFLEET_COORDINATOR_ADDR")]
    pub coordinator_addr: Option<String>,

    /// The address operators dial (reported to the coordinator).
    #[arg(long, env = "BIGFLEET_ADVERTISE_ADDR")]
    pub advertise_addr: Option<String>,

    /// ReportShard period.
    #[arg(long, env = "BIGFLEET_REPORT_INTERVAL", default_value = "30s", value_parser = humantime::parse_duration)]
    pub report_interval: Duration,

    /// etcd endpoints (comma-separated) for the epoch, leader lease and work endpoint.
    #[arg(long, env = "BIGFLEET_ETCD_ENDPOINTS")]
    pub etcd_endpoints: Option<String>,

    /// Leader lease TTL in etcd mode (whole seconds, at least 2s).
    #[arg(long, env = "BIGFLEET_ETCD_LEASE_TTL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub etcd_lease_ttl: Duration,

    /// CA bundle verifying etcd's server certificate (enables TLS towards etcd).
    #[arg(long, env = "BIGFLEET_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,

    /// Client certificate for etcd (with --etcd-key; needs --etcd-ca).
    #[arg(long, env = "BIGFLEET_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,

    /// Client key for etcd (with --etcd-cert).
    #[arg(long, env = "BIGFLEET_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,

    /// Work endpoint URI published in etcd for remote execute workers; default derived
    /// from --work-listen (its host, else $POD_IP, else the hostname; https under mTLS).
    #[arg(long, env = "BIGFLEET_WORK_ADVERTISE")]
    pub work_advertise: Option<String>,

    /// HTTP address of /metrics, /healthz and /readyz; 0 disables.
    #[arg(long, env = "BIGFLEET_METRICS_ADDR", default_value = ":8780")]
    pub metrics_addr: String,

    /// `--drain-timeout`, TLS and log flags, alike in every service.
    #[command(flatten)]
    pub service: ServiceFlags,
}

/// A fraction in [0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("not a number: {e}"))?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("must be between 0 and 1, got {v}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use svc_shard_decide_core::DecideConfig;

    /// Parses `flags` after the one required flag.
    fn parse(flags: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["d", "--provider-addr=x"].iter().chain(flags))
    }

    /// The cycle configuration `flags` give.
    fn config(flags: &[&str]) -> DecideConfig {
        crate::decide_config(&parse(flags).unwrap(), 1)
    }

    #[test]
    fn defaults_match_the_flag_contract() {
        let a = Args::try_parse_from(["d", "--provider-addr", "unix:///p.sock"]).unwrap();
        assert_eq!(a.shard_id, "shard-0");
        assert_eq!(a.socket_dir, PathBuf::from("/run/bigfleet"));
        assert_eq!(a.work_listen, None);
        assert_eq!(a.data_dir, PathBuf::from("./data"));
        assert_eq!(a.cycle_interval, Duration::from_secs(1));
        assert!(!a.incremental_reconcile);
        assert_eq!(a.full_list_interval, Duration::from_secs(60));
        assert_eq!(a.max_actions_per_cycle, 0);
        assert_eq!(a.available_capacity_interval, Duration::from_secs(5));
        assert!((a.available_capacity_min_change - 0.1).abs() < 1e-12);
        assert!(!a.actuation_paused && !a.dry_run);
        assert_eq!(a.reclaim_budget_fraction, 0.05);
        assert_eq!(a.reclaim_budget_window, Duration::from_secs(600));
        assert_eq!(a.reclaim_cap_fraction, None);
        assert!(a.empty_rollup_guard);
        assert_eq!(a.audit_log, None);
        assert_eq!(a.coordinator_addr, None);
        assert_eq!(a.report_interval, Duration::from_secs(30));
        assert_eq!(a.etcd_endpoints, None);
        assert_eq!(a.etcd_lease_ttl, Duration::from_secs(10));
        assert_eq!((a.etcd_ca, a.etcd_cert, a.etcd_key), (None, None, None));
        assert_eq!(a.work_advertise, None);
        assert_eq!(a.metrics_addr, ":8780");
        assert_eq!(a.service.drain_timeout, Duration::from_secs(10));
    }

    #[test]
    fn available_capacity_min_change_is_a_fraction() {
        let c = config(&["--available-capacity-min-change=0"]);
        assert_eq!(c.available_capacity_min_change, 0.0);
        for bad in ["1.5", "-0.1", "ten"] {
            let flag = format!("--available-capacity-min-change={bad}");
            assert!(parse(&[flag.as_str()]).is_err());
        }
    }

    #[test]
    fn rollup_limit_flags() {
        let a = parse(&[]).unwrap();
        assert_eq!(
            a.rollup_limits.limits(),
            bigfleet_conv::RollupLimits::default()
        );
        assert_eq!(a.max_shard_resource_dimensions, 128);
        let c = config(&[
            "--max-priority=1000000000",
            "--max-needs-per-rollup=5",
            "--max-shard-resource-dimensions=9",
        ]);
        assert_eq!(c.rollup_limits.max_priority, 1_000_000_000);
        assert_eq!(c.rollup_limits.max_needs, 5);
        assert_eq!(c.max_shard_dimensions, 9);
    }

    #[test]
    fn reclaim_budget_flags_and_the_deprecated_cap() {
        let c = config(&[
            "--reclaim-budget-fraction=0.1",
            "--reclaim-budget-window=30m",
        ]);
        assert_eq!(c.rails.reclaim_budget_fraction, 0.1);
        assert_eq!(c.rails.reclaim_budget_window, Duration::from_secs(1800));
        // The old flag still sets the fraction (now per window).
        let c = config(&["--reclaim-cap-fraction=0"]);
        assert_eq!(c.rails.reclaim_budget_fraction, 0.0);
        // Both at once are a startup error, not a silent choice.
        assert!(
            parse(&[
                "--reclaim-cap-fraction=0.1",
                "--reclaim-budget-fraction=0.2",
            ])
            .is_err()
        );
    }

    #[test]
    fn provider_addr_is_required() {
        assert!(Args::try_parse_from(["d"]).is_err());
    }

    #[test]
    fn booleans_take_switch_or_value_forms() {
        let a = parse(&[
            "--dry-run",
            "--actuation-paused=true",
            "--empty-rollup-guard=false",
            "--incremental-reconcile=false",
        ])
        .unwrap();
        assert!(a.dry_run && a.actuation_paused);
        assert!(!a.empty_rollup_guard && !a.incremental_reconcile);
        assert!(parse(&["--dry-run=maybe"]).is_err());
    }
}
