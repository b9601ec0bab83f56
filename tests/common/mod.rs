//! Fixtures shared by the CLI's integration tests (`cli.rs`, `cli_output.rs`): the shard
//! and coordinator records their doubles answer with.

use bigfleet_proto::v1alpha1 as pb;
use svc_inspect::doubles::ShardDouble;

/// When the shard doubles' last cycle computed its verdicts.
pub const COMPUTED_AT_UNIX_NANOS: i64 = 1_700_000_000_000_000_000;

/// A shard double whose cycle `cycle` judged `needs`.
pub fn shard(id: &str, cycle: i64, needs: Vec<pb::NeedView>) -> ShardDouble {
    ShardDouble {
        shard_id: id.into(),
        header: pb::InspectNeedsHeader {
            cycle,
            computed_at_unix_nanos: COMPUTED_AT_UNIX_NANOS,
            total_needs: 0,
        },
        needs,
        ..Default::default()
    }
}

/// A 256-GPU shortfall at priority 100, unmet for 9 cycles.
pub fn gpu_shortfall() -> pb::Shortfall {
    pb::Shortfall {
        deficit: Some(pb::Resources {
            resources: [("nvidia.com/gpu".to_owned(), "256".to_owned())].into(),
        }),
        priority: 100,
        age_cycles: 9,
        ..Default::default()
    }
}

/// Shard s1's report at its cycle 3, carrying `shortfalls`.
pub fn s1_report(shortfalls: Vec<pb::Shortfall>) -> pb::ShardReportSnapshot {
    pb::ShardReportSnapshot {
        shard_id: "s1".into(),
        cycle: 3,
        received_at_unix_ns: 1,
        summary: None,
        shortfalls,
    }
}
