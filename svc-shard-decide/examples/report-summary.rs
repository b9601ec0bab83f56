//! What a coordinator report's inventory counts cost once a shard owns domains (issue 21,
//! ADR-0137): the owned summary against the all-machines one, over one shared provider's
//! fleet.
//!
//! ```text
//! cargo run --release -p svc-shard-decide --example report-summary -- \
//!     --machines 100000 --zones 3 --transferred 200 --runs 200
//! ```
//!
//! Prints one JSON object: mean and worst microseconds per summary for the whole fleet
//! (single-shard mode), for one owned zone, and for one owned zone plus `--transferred`
//! released and adopted machines.

use std::collections::BTreeMap;
use std::time::Instant;

use bigfleet_decision::Ownership;
use bigfleet_proto::v1alpha1 as pb;
use clap::Parser;
use svc_shard_decide_core::inventory::Inventory;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 100_000)]
    machines: usize,
    #[arg(long, default_value_t = 3)]
    zones: usize,
    /// Machines released and as many adopted (exceptions looked up by id).
    #[arg(long, default_value_t = 200)]
    transferred: usize,
    #[arg(long, default_value_t = 200)]
    runs: usize,
}

const ZONE_KEY: &str = "topology.kubernetes.io/zone";

fn fleet(args: &Args) -> Inventory {
    let mut inv = Inventory::new();
    for i in 0..args.machines {
        let m = pb::Machine {
            id: format!("m-{i:07}"),
            state: pb::MachineState::Idle as i32,
            host: Some(pb::HostRef {
                provider: "bench".into(),
                r#ref: format!("i-{i}"),
            }),
            instance_type: ["m5.xlarge", "c5.2xlarge", "bm.gpu.8"][i % 3].into(),
            zone: format!("z{}", i % args.zones.max(1)),
            capacity_type: pb::CapacityType::OnDemand as i32,
            price_per_hour: 0.2,
            resources: Some(pb::Resources {
                resources: [("cpu".to_owned(), "4".to_owned())].into_iter().collect(),
            }),
            ..Default::default()
        };
        inv.upsert(
            bigfleet_conv::machine_from_proto(&m).expect("valid machine"),
            0,
        );
    }
    inv
}

/// (mean µs, worst µs) of `runs` summaries under `owned`.
fn time(inv: &Inventory, owned: &Ownership, runs: usize) -> (f64, f64) {
    let mut worst = 0f64;
    let mut total = 0f64;
    let mut seen = 0u64;
    for _ in 0..runs {
        let t = Instant::now();
        let s = inv.summary_owned(owned);
        let us = t.elapsed().as_secs_f64() * 1e6;
        seen = seen.wrapping_add(s.total);
        total += us;
        worst = worst.max(us);
    }
    std::hint::black_box(seen);
    (total / runs.max(1) as f64, worst)
}

fn main() {
    let args = Args::parse();
    let inv = fleet(&args);
    let everything = Ownership::default();
    let mut zone = Ownership::default();
    zone.domains.insert((ZONE_KEY.to_owned(), "z0".to_owned()));
    let mut transferred = zone.clone();
    for i in 0..args.transferred {
        // Released from the owned zone, adopted from the others.
        transferred
            .released
            .insert(format!("m-{:07}", i * args.zones));
        transferred
            .adopted
            .insert(format!("m-{:07}", i * args.zones + 1));
    }
    let mut out = BTreeMap::new();
    for (name, owned) in [
        ("everything", &everything),
        ("one_zone", &zone),
        ("one_zone_with_transfers", &transferred),
    ] {
        let (mean, worst) = time(&inv, owned, args.runs);
        out.insert(
            name,
            serde_json::json!({
                "owned": inv.summary_owned(owned).total,
                "mean_us": (mean * 10.0).round() / 10.0,
                "worst_us": (worst * 10.0).round() / 10.0,
            }),
        );
    }
    println!(
        "{}",
        serde_json::json!({
            "machines": args.machines,
            "zones": args.zones,
            "transferred": args.transferred,
            "runs": args.runs,
            "summaries": out,
        })
    );
}
