//! The original's published end-to-end scenarios (`docs/compatibility.md` lists where we differ) through
//! the real binaries: a coordinator, a shard (gateway + decide + execute), a fake provider
//! and svc-inspect as separate processes, simulated operators in the test. Every assertion
//! reads provider state (`List`) or `InspectNeeds`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bigfleet_loadtest::{Demand, NeedSpec};
use bigfleet_proto::v1alpha1 as pb;
use pb::MachineState as S;
use serde_json::json;

use crate::harness::*;

const GPU: &str = "nvidia.com/gpu";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_stockout_configures_what_exists_and_reports_one_shortfall() {
    let mut sc = Scenario::start("stockout.json", |_| {}).await;
    sc.operator("cluster-a", gpu_units(64, 1000));

    sc.wait_for(32, S::Configured, "cluster-a", Duration::from_secs(30))
        .await;
    let need = wait_until(
        Duration::from_secs(15),
        "one unmet need of 256 GPU",
        || async {
            let needs = sc.needs("cluster-a").await;
            match needs.as_slice() {
                [n] if !n.satisfied && quantity(&n.residual_deficit, GPU) == "256" => Ok(n.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(need.claimed_machine_count, 32, "{need:?}");
    assert_ne!(
        need.unmet_reason,
        pb::UnmetReason::Unspecified as i32,
        "{need:?}"
    );

    // Fleet-wide through svc-inspect (coordinator reports + fan-out): exactly one shortfall.
    let summary = wait_until(Duration::from_secs(20), "the fleet shortfall", || async {
        let s = sc.mesh().fleet_summary().await.map_err(|e| e.to_string())?;
        if s.shortfalls.len() == 1 {
            Ok(s)
        } else {
            Err(format!("{:?}", s.shortfalls))
        }
    })
    .await;
    assert_eq!(
        quantity(&summary.shortfalls[0].deficit, GPU),
        "256",
        "{summary:?}"
    );
    let (_, fleet_needs) = sc.mesh().fleet_inspect_needs("cluster-a").await.unwrap();
    assert_eq!(fleet_needs.len(), 1);
    assert!(!fleet_needs[0].satisfied);

    // Nothing more can be had: still 32, nothing else moved.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let machines = sc.machines().await;
    let by = bigfleet::up::local::count_by_state(&machines);
    assert_eq!((by["CONFIGURED"], by["IDLE"]), (32, 0), "{by:?}");
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_inversion_hands_the_machines_to_the_higher_priority_cluster() {
    let mut sc = Scenario::start("priority.json", |_| {}).await;
    sc.operator("batch", gpu_units(4, 100_000));
    sc.wait_for(4, S::Configured, "batch", Duration::from_secs(30))
        .await;

    sc.operator("train", gpu_units(4, 1_000_000));
    wait_until(
        Duration::from_secs(45),
        "train holds all 4, batch none",
        || async {
            let m = sc.machines().await;
            let train = in_state(&m, S::Configured, "train").len();
            let batch = m.iter().filter(|x| x.cluster == "batch").count();
            if train == 4 && batch == 0 {
                Ok(())
            } else {
                Err(format!("{:?}", states(&m)))
            }
        },
    )
    .await;
    let train = sc.needs("train").await;
    assert!(train.len() == 1 && train[0].satisfied, "{train:?}");
    let batch = sc.needs("batch").await;
    assert!(batch.len() == 1 && !batch[0].satisfied, "{batch:?}");
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_job_gang_lands_in_one_rack() {
    let mut sc = Scenario::start("topology.json", |_| {}).await;
    sc.operator(
        "train",
        Demand::new(vec![NeedSpec::rack_gang("gang-1", 64, 8, 5000)]),
    );
    let racks = wait_until(Duration::from_secs(40), "64 configured", || async {
        let m = sc.machines().await;
        let mine: Vec<_> = m
            .iter()
            .filter(|x| x.state == S::Configured as i32 && x.cluster == "train")
            .collect();
        if mine.len() == 64 {
            Ok(mine
                .iter()
                .map(|x| {
                    x.labels
                        .get("topology.bigfleet/rack")
                        .cloned()
                        .unwrap_or_default()
                })
                .collect::<BTreeSet<_>>())
        } else {
            Err(format!("{} configured", mine.len()))
        }
    })
    .await;
    assert_eq!(racks.len(), 1, "one rack: {racks:?}");
    let rack = racks.into_iter().next().unwrap();
    // Only the first 64-machine rack of fake-1a can hold the whole gang.
    assert_eq!(rack, "fake-1a-gpu-rack-0");
    let needs = sc.needs("train").await;
    assert!(needs.len() == 1 && needs[0].satisfied, "{needs:?}");
    assert!(needs[0].same_domain.contains("rack-0"), "{needs:?}");
    assert_eq!(
        sc.count(S::Configured, "").await,
        64,
        "nothing outside the gang"
    );
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawal_drains_back_to_idle_within_the_reclaim_cap() {
    let mut sc = Scenario::start("stockout.json", |spec| {
        // Windows short enough to watch within the test: max(1, ⌊0.25 × 32⌋) = 8
        // reclaims per 1 s window, Draining machines counted (ADR-0105).
        spec.decide_flags = vec![
            "--cycle-interval".into(),
            "100ms".into(),
            "--reclaim-budget-fraction=0.25".into(),
            "--reclaim-budget-window=1s".into(),
        ];
    })
    .await;
    let op = sc.operator("cluster-w", gpu_units(32, 1000));
    sc.wait_for(32, S::Configured, "cluster-w", Duration::from_secs(30))
        .await;
    let t0 = Instant::now();
    sc.operators[op].set_demand(Demand::empty());

    // The withdrawal is quarantined for two roll-ups, then drains under the budget: never
    // more than 8 started per window, however many cycles ran.
    let mut seen = BTreeSet::new();
    wait_until(
        Duration::from_secs(60),
        "every machine reclaimed",
        async || {
            let configured = sc.count(S::Configured, "cluster-w").await as i64;
            seen.insert(configured);
            let reclaimed = 32 - configured;
            let windows = t0.elapsed().as_secs() as i64 + 1;
            assert!(
                reclaimed <= 8 * windows,
                "{reclaimed} reclaimed within {windows} windows: the budget is 8 per window"
            );
            if configured == 0 {
                Ok(())
            } else {
                Err(format!("still {configured} configured"))
            }
        },
    )
    .await;
    assert!(seen.len() >= 4, "reclaim was gradual, saw {seen:?}");
    sc.wait_for(32, S::Idle, "", Duration::from_secs(10)).await;
    assert!(
        sc.metric(
            "shard-0-decide",
            "bigfleet_shard_reclaims_capped_total",
            &[]
        )
        .await
            > 0.0,
        "the budget held reclaims back"
    );
    assert!(sc.needs("cluster-w").await.is_empty());
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_failures_fail_only_the_machines_they_hit() {
    let mut sc = Scenario::start("failures.json", |spec| {
        // The drn cluster's three reclaims are this test's subject, not the reclaim
        // budget's pace (ADR-0105: one per 10 minutes for a 3-machine cluster by default).
        spec.decide_flags = vec!["--reclaim-budget-window=1s".into()];
    })
    .await;
    for (id, op) in [
        ("gpu-000001", "configure"),
        ("spot-000002", "create"),
        ("drn-000001", "drain"),
    ] {
        sc.mesh()
            .provider_admin_post(
                0,
                "/admin/fail-next",
                &json!({"id": id, "op": op, "style": "fail"}),
            )
            .await
            .unwrap();
    }
    sc.operator("cfg", gpu_units(4, 1000));
    sc.operator("new", Demand::new(vec![NeedSpec::cpu(4, 32, 128, 1000)]));
    sc.operator("drn", Demand::empty());

    let expected: BTreeMap<&str, (&str, &str)> = [
        ("gpu-000000", ("CONFIGURED", "cfg")),
        ("gpu-000001", ("FAILED", "")),
        ("gpu-000002", ("CONFIGURED", "cfg")),
        ("gpu-000003", ("CONFIGURED", "cfg")),
        ("spot-000000", ("CONFIGURED", "new")),
        ("spot-000001", ("CONFIGURED", "new")),
        ("spot-000002", ("FAILED", "")),
        ("spot-000003", ("CONFIGURED", "new")),
        ("drn-000000", ("IDLE", "")),
        ("drn-000001", ("FAILED", "")),
        ("drn-000002", ("IDLE", "")),
    ]
    .into_iter()
    .collect();
    let machines = wait_until(Duration::from_secs(45), "failures confined", || async {
        let m = sc.machines().await;
        let st = states(&m);
        let ok = expected.iter().all(|(id, (state, cluster))| {
            st.get(*id)
                .is_some_and(|(s, c)| s == state && (*state == "FAILED" || c == cluster))
        });
        if ok { Ok(m) } else { Err(format!("{st:?}")) }
    })
    .await;
    for m in machines.iter().filter(|m| m.state == S::Failed as i32) {
        assert!(
            !m.last_error.is_empty(),
            "{} failed without last_error",
            m.id
        );
    }
    // The bystanders (another cluster, no operator) never moved.
    let st = states(&machines);
    assert_eq!(st["bystander-000002"].0, "CONFIGURED");
    assert_eq!(st["bystander-000003"].0, "CONFIGURED");
    assert_eq!(st["bystander-000000"].0, "IDLE");
    // The GPU cluster is one machine short and says so.
    let cfg = sc.needs("cfg").await;
    assert!(cfg.len() == 1 && !cfg[0].satisfied, "{cfg:?}");
    assert_eq!(quantity(&cfg[0].residual_deficit, GPU), "8", "{cfg:?}");
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_restart_rebuilds_assignments_and_reclaims_nothing_before_the_first_rollup() {
    let mut sc = Scenario::start("small-gpu.json", |_| {}).await;
    let op = sc.operator("cluster-a", gpu_units(4, 1000));
    let before = sc
        .wait_for(4, S::Configured, "cluster-a", Duration::from_secs(30))
        .await;
    let op = sc.operators.remove(op);
    op.shutdown().await;

    // The whole shard crashes and comes back (decide with a higher epoch).
    for c in ["shard-0-execute", "shard-0-gateway", "shard-0-decide"] {
        sc.mesh_mut().kill(c).await.unwrap();
    }
    for c in ["shard-0-decide", "shard-0-gateway", "shard-0-execute"] {
        sc.mesh_mut().restart(c).await.unwrap();
    }
    // Cycles run, but no roll-up has arrived: nothing may be reclaimed.
    let c0 = sc
        .metric("shard-0-decide", "bigfleet_shard_cycles_total", &[])
        .await;
    wait_until(
        Duration::from_secs(20),
        "10 cycles without a roll-up",
        || async {
            let c = sc
                .metric("shard-0-decide", "bigfleet_shard_cycles_total", &[])
                .await;
            if c >= c0 + 10.0 {
                Ok(())
            } else {
                Err(format!("{c}"))
            }
        },
    )
    .await;
    let m = sc.machines().await;
    let still = in_state(&m, S::Configured, "cluster-a");
    assert_eq!(
        still,
        before,
        "no reclaim before the first roll-up: {:?}",
        states(&m)
    );
    assert!(sc.needs("cluster-a").await.is_empty());

    // The operator returns: the same machines are credited, nothing new is bootstrapped.
    sc.operator("cluster-a", gpu_units(4, 1000));
    let need = wait_until(
        Duration::from_secs(20),
        "the need satisfied again",
        || async {
            match sc.needs("cluster-a").await.as_slice() {
                [n] if n.satisfied => Ok(n.clone()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(need.claimed_machine_count, 4, "{need:?}");
    assert_eq!(
        (need.bootstrap_count, need.provision_count),
        (0, 0),
        "{need:?}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let m = sc.machines().await;
    let after = in_state(&m, S::Configured, "");
    assert_eq!(after, before, "{:?}", states(&m));
    sc.finish().await;
}

/// Issue 16 through the real processes: the provider comes back empty for seconds on end,
/// then truncated, then with every record invalid. The shard holds the removals (metric)
/// and moves nothing: no machine is released, none provisioned in replacement, and the
/// operator is told of no node change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lying_provider_moves_no_machine() {
    let mut sc = Scenario::start("small-gpu.json", |_| {}).await;
    let op = sc.operator("cluster-l", gpu_units(8, 1000));
    let configured = sc
        .wait_for(8, S::Configured, "cluster-l", Duration::from_secs(30))
        .await;
    let idle = sc.wait_for(8, S::Idle, "", Duration::from_secs(10)).await;
    // The operator hears of a machine after decide lists it: count node updates only once
    // every configured machine has reached it as configured (the stream is ordered, so
    // every earlier update has too).
    let told_configured = bigfleet_model::MachineState::from_ordinal(S::Configured as i32);
    wait_until(
        Duration::from_secs(10),
        "the operator told of every configured machine",
        async || {
            let told: BTreeSet<String> = sc.operators[op]
                .nodes()
                .into_iter()
                .filter(|(_, v)| v.state == told_configured)
                .map(|(id, _)| id)
                .collect();
            if configured.is_subset(&told) {
                Ok(())
            } else {
                Err(format!("told of {told:?}"))
            }
        },
    )
    .await;
    let node_updates = sc.operators[op].stats().node_updates;

    // The test's own Lists would eat the lies: until they are all answered it reads only
    // the admin API and decide's metrics.
    let mut lies = vec![json!("empty"); 25];
    lies.extend([json!({"truncated": 3}), json!("invalid")]);
    let queued = list_faults(&sc, json!({ "faults": lies })).await;
    assert_eq!(queued["pending"], 27, "{queued}");
    wait_until(
        Duration::from_secs(10),
        "decide holding every removal",
        async || {
            let held = sc
                .metric("shard-0-decide", "bigfleet_shard_removals_held", &[])
                .await;
            if held == 16.0 {
                Ok(())
            } else {
                Err(format!("{held} held"))
            }
        },
    )
    .await;
    wait_until(Duration::from_secs(30), "every lie answered", async || {
        let left = list_faults(&sc, json!({})).await["pending"].clone();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} left"))
        }
    })
    .await;

    // Some cycles on the truth again, then: the same machines where they were.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sc.ids(S::Configured, "cluster-l").await, configured);
    assert_eq!(sc.ids(S::Idle, "").await, idle);
    assert_eq!(
        sc.operators[op].stats().node_updates,
        node_updates,
        "the operator was told of a node change"
    );
    let needs = sc.needs("cluster-l").await;
    assert!(needs.len() == 1 && needs[0].satisfied, "{needs:?}");
    sc.finish().await;
}

/// `POST /admin/list-faults` on shard 0's fake provider.
async fn list_faults(sc: &Scenario, body: serde_json::Value) -> serde_json::Value {
    sc.mesh()
        .provider_admin_post(0, "/admin/list-faults", &body)
        .await
        .expect("admin list-faults")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_continues_while_the_coordinator_is_down() {
    let mut sc = Scenario::start("small-gpu.json", |_| {}).await;
    let op = sc.operator("cluster-a", gpu_units(2, 1000));
    sc.wait_for(2, S::Configured, "cluster-a", Duration::from_secs(30))
        .await;
    sc.mesh_mut().kill("coordinator").await.unwrap();
    sc.operators[op].set_demand(gpu_units(6, 1000));
    sc.wait_for(6, S::Configured, "cluster-a", Duration::from_secs(30))
        .await;
    let needs = sc.needs("cluster-a").await;
    assert!(needs.len() == 1 && needs[0].satisfied, "{needs:?}");
    let decide = sc.mesh().ports().shards[0].decide_http.parse().unwrap();
    assert!(
        bigfleet::up::probe::is_ready(decide).await,
        "decide stays ready"
    );
    sc.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zombie_shards_old_epoch_execute_is_fenced() {
    let mut sc = Scenario::start("priority.json", |spec| {
        spec.coordinator = false;
        spec.inspect = false;
        // Rails off so the new incarnation reclaims everything at once.
        spec.decide_flags.extend([
            "--reclaim-cap-fraction".into(),
            "0".into(),
            "--empty-rollup-guard=false".into(),
        ]);
    })
    .await;
    sc.operator("cluster-a", gpu_units(4, 1000));
    let ids = sc
        .wait_for(4, S::Configured, "cluster-a", Duration::from_secs(30))
        .await;

    // A second incarnation of shard-0 (same data dir ⇒ a higher epoch) while the first
    // keeps running: the first is now a zombie. The cluster withdraws its demand at the new
    // one, which drains every machine under the new epoch.
    let second = sc.mesh_mut().start_shard_incarnation(0, "b").await.unwrap();
    let target = sc.mesh().gateway_target(0).replace(
        &sc.mesh().ports().shards[0].gateway_grpc,
        &second.gateway_grpc,
    );
    sc.operator_at("cluster-a", &target, Demand::empty());
    // The new incarnation drains all 4.
    sc.wait_for(4, S::Idle, "", Duration::from_secs(30)).await;

    // The zombie still wants 4 machines and keeps trying: every attempt is fenced.
    wait_until(
        Duration::from_secs(30),
        "the zombie's execute fenced",
        || async {
            let fenced = sc
                .metric(
                    "shard-0-execute",
                    "bigfleet_shard_action_execute_outcomes_total",
                    &[("outcome", "fenced")],
                )
                .await;
            if fenced > 0.0 {
                Ok(())
            } else {
                Err(format!("{fenced} fenced"))
            }
        },
    )
    .await;
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        let m = sc.machines().await;
        for x in &m {
            assert!(
                ids.contains(&x.id) && x.state == S::Idle as i32,
                "zombie changed {}: {:?}",
                x.id,
                states(&m)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The zombie still plans bootstraps for the need; the provider refuses every one. Polled:
    // right after a fenced attempt the zombie's own inventory may still show the machine in
    // the transition it started (a local change newer than its last List), so a single read
    // can catch the need momentarily counted as claimed.
    wait_until(
        Duration::from_secs(20),
        "the zombie plans bootstraps",
        || async {
            let zombie = sc.needs("cluster-a").await;
            if zombie.len() == 1 && zombie[0].bootstrap_count > 0 {
                Ok(())
            } else {
                Err(format!("{zombie:?}"))
            }
        },
    )
    .await;
    let (_, fresh) = sc
        .mesh()
        .inspect_needs_at(&second.gateway_grpc, "cluster-a")
        .await
        .unwrap();
    assert!(fresh.is_empty(), "{fresh:?}");
    sc.finish().await;
}
