//! Times the roll-up gate (ADR-0104, docs/benchmarks.md): refusing a roll-up that names
//! 100,000 distinct resources, and validating a 60,000-need roll-up that passes.
//!
//! `cargo run --release -p bigfleet-conv --example rollup-limits-bench -- [--runs N]`
//!
//! Prints one JSON object; every figure is the median / min / max over the runs, in ms.

use bigfleet_conv::{RollupLimits, rollup_from_proto, rollup_from_proto_with};
use bigfleet_proto::v1alpha1 as pb;
use prost::Message;
use std::collections::HashMap;
use std::time::Instant;

fn requirement(key: &str, operator: i32, values: &[String]) -> pb::NodeSelectorRequirement {
    pb::NodeSelectorRequirement {
        key: key.to_owned(),
        operator,
        values: values.to_vec(),
    }
}

/// A need shaped like the loadtest's CPU services: instance types, a zone spread, a team
/// label, cpu and memory aggregates and a min unit.
fn service_need(i: usize) -> pb::CapacityNeed {
    pb::CapacityNeed {
        requirements: vec![
            requirement(
                "node.kubernetes.io/instance-type",
                1,
                &["m5.xlarge".into(), "m5.2xlarge".into(), "m6i.xlarge".into()],
            ),
            requirement("team", 1, &[format!("team-{}", i % 500)]),
            requirement("topology.bigfleet/rack", 3, &[]),
        ],
        aggregate_resources: HashMap::from([
            ("cpu".to_owned(), format!("{}", 4 * (1 + i % 32))),
            ("memory".to_owned(), format!("{}Gi", 16 * (1 + i % 32))),
        ]),
        priority: [100, 500, 1_000, 1_000_000][i % 4],
        spread: vec![pb::TopologySpread {
            topology_key: "topology.kubernetes.io/zone".into(),
            max_skew: 1,
            when_unsatisfiable: 1,
        }],
        interruption_penalty_bucket: 1 + (i % 27) as i32,
        reclamation_penalty_bucket: 1,
        min_unit: HashMap::from([
            ("cpu".to_owned(), "4".to_owned()),
            ("memory".to_owned(), "16Gi".to_owned()),
        ]),
        group: String::new(),
    }
}

fn rollup(needs: Vec<pb::CapacityNeed>) -> pb::ClusterCapacityNeeds {
    pb::ClusterCapacityNeeds {
        cluster_id: "cluster-0".into(),
        timestamp_unix_nanos: 1,
        needs,
    }
}

/// 100,000 distinct resource names, `per_need` to a need.
fn names_rollup(per_need: usize) -> pb::ClusterCapacityNeeds {
    let names: Vec<String> = (0..100_000).map(|i| format!("example.com/r{i}")).collect();
    rollup(
        names
            .chunks(per_need)
            .enumerate()
            .map(|(i, chunk)| pb::CapacityNeed {
                aggregate_resources: chunk.iter().map(|c| (c.clone(), "1".to_owned())).collect(),
                min_unit: HashMap::new(),
                ..service_need(i)
            })
            .collect(),
    )
}

fn time(runs: usize, mut f: impl FnMut()) -> serde_like::Stats {
    let mut ms: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    serde_like::Stats {
        median: ms[ms.len() / 2],
        min: ms[0],
        max: ms[ms.len() - 1],
    }
}

/// The few lines of JSON this prints, without a serde dependency for one example.
mod serde_like {
    pub struct Stats {
        pub median: f64,
        pub min: f64,
        pub max: f64,
    }

    impl std::fmt::Display for Stats {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "{{\"median_ms\": {:.4}, \"min_ms\": {:.4}, \"max_ms\": {:.4}}}",
                self.median, self.min, self.max
            )
        }
    }
}

fn main() {
    let mut runs = 21;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(runs),
            other => {
                eprintln!("unknown argument {other:?}; usage: rollup-limits-bench [--runs N]");
                std::process::exit(2);
            }
        }
    }
    let runs = runs.max(1);

    let spread_out = names_rollup(RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES);
    let one_need = names_rollup(100_000);
    let big = rollup((0..60_000).map(service_need).collect());

    // Every shape is checked once for the answer the timing relies on.
    let reason = |r: &pb::ClusterCapacityNeeds, l: &RollupLimits| {
        rollup_from_proto_with(r, l).err().map(|e| e.reason())
    };
    assert_eq!(
        reason(&spread_out, &RollupLimits::default()),
        Some("limit_rollup_dimensions")
    );
    assert_eq!(
        reason(&one_need, &RollupLimits::default()),
        Some("limit_resource_entries")
    );
    assert_eq!(reason(&spread_out, &RollupLimits::UNBOUNDED), None);
    assert_eq!(reason(&big, &RollupLimits::default()), None);

    let reject_spread = time(runs, || {
        std::hint::black_box(rollup_from_proto(&spread_out).unwrap_err());
    });
    let reject_one = time(runs, || {
        std::hint::black_box(rollup_from_proto(&one_need).unwrap_err());
    });
    let unbounded = time(runs.min(5), || {
        std::hint::black_box(
            rollup_from_proto_with(&spread_out, &RollupLimits::UNBOUNDED).unwrap(),
        );
    });
    let accept_big = time(runs.min(11), || {
        std::hint::black_box(rollup_from_proto(&big).unwrap());
    });
    let accept_big_unbounded = time(runs.min(11), || {
        std::hint::black_box(rollup_from_proto_with(&big, &RollupLimits::UNBOUNDED).unwrap());
    });
    let decode_big = {
        let bytes = big.encode_to_vec();
        time(runs.min(11), || {
            std::hint::black_box(pb::ClusterCapacityNeeds::decode(bytes.as_slice()).unwrap());
        })
    };

    println!("{{");
    println!("  \"benchmark\": \"bigfleet-conv roll-up gate (ADR-0104)\",");
    println!(
        "  \"command\": \"cargo run --release -p bigfleet-conv --example rollup-limits-bench -- --runs {runs}\","
    );
    println!(
        "  \"reject_100k_names_32_per_need\": {{\"needs\": {}, \"bytes\": {}, \"time\": {reject_spread}}},",
        spread_out.needs.len(),
        spread_out.encoded_len()
    );
    println!(
        "  \"reject_100k_names_one_need\": {{\"needs\": 1, \"bytes\": {}, \"time\": {reject_one}}},",
        one_need.encoded_len()
    );
    println!(
        "  \"accept_100k_names_unbounded\": {{\"needs\": {}, \"time\": {unbounded}}},",
        spread_out.needs.len()
    );
    println!(
        "  \"validate_60k_needs\": {{\"needs\": {}, \"bytes\": {}, \"time\": {accept_big}}},",
        big.needs.len(),
        big.encoded_len()
    );
    println!("  \"validate_60k_needs_unbounded\": {{\"time\": {accept_big_unbounded}}},");
    println!("  \"prost_decode_60k_needs\": {{\"time\": {decode_big}}}");
    println!("}}");
}
