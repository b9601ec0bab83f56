//! Canned fleet data shared by the unit tests of the modules that render or sample it.

use crate::fleet::FleetOverview;
use crate::view::ShardView;

/// A shard with seven configured machines; an unreachable one carries an error that needs
/// HTML escaping.
pub(crate) fn shard(id: &str, reachable: bool) -> ShardView {
    ShardView {
        shard_id: id.into(),
        address: "127.0.0.1:1".into(),
        reachable,
        error: if reachable {
            String::new()
        } else {
            "unavailable: <refused>".into()
        },
        registered_at_unix_ns: 0,
        last_report_age_ms: 1500,
        cycle: 42,
        machines_by_state: [("MACHINE_STATE_CONFIGURED".to_owned(), 7)].into(),
        sessions: 3,
        needs: 5,
        unmet_needs: 1,
        shard_epoch: 1,
        actions_in_flight: 0,
        reported_total_machines: None,
        reported_free_machines: None,
        source: "shard-info".into(),
        inventory_stale: false,
        inventory_listed_at_unix_ns: 0,
        removals_held: 0,
    }
}

/// An overview of `shards` with the coordinator reachable and no shortfalls or domains.
pub(crate) fn overview(shards: Vec<ShardView>) -> FleetOverview {
    FleetOverview {
        computed_at_unix_nanos: 1,
        coordinator_reachable: true,
        coordinator_error: String::new(),
        coordinator_failure: None,
        shards,
        shortfalls: vec![],
        domains: vec![],
    }
}
