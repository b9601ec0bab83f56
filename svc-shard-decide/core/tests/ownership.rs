//! Owned domains and transfers drive the cycle (ADR-0128, ADR-0129): a shard
//! acts only on what it owns, an Assign/Unassign or a transfer half takes
//! effect on the next cycle, and a release is all-or-nothing and never races
//! an action already decided.

use crate::common;

use bigfleet_model::ZONE_KEY;
use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use common::*;
use std::time::Duration;
use svc_shard_decide_core::{TransferVerdict, edge};

const LONG: Duration = Duration::from_secs(10);

fn idle(id: &str, zone: &str, price: f64) -> pb::Machine {
    let mut m = pm(id, pb::MachineState::Idle, "");
    m.zone = zone.to_owned();
    m.price_per_hour = price;
    m
}

/// Idle `cheap` in zone za and `dear` in zone zb, rails off, no demand yet.
async fn two_zones() -> Harness {
    let h = Harness::listing(
        cfg_rails_off(),
        [idle("cheap", "za", 0.1), idle("dear", "zb", 0.5)],
    )
    .await;
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 0);
    h
}

fn machine_of(item: &mesh::WorkItem) -> String {
    item.action.as_ref().unwrap().machine_id.clone()
}

async fn next_machine(h: &Harness) -> String {
    let mut client = h.client();
    let mut w = TestWorker::connect(&mut client, "w", "").await;
    w.credit(1).await;
    machine_of(&w.next(LONG).await.expect("a work item"))
}

#[tokio::test]
async fn an_assigned_domain_limits_the_next_cycle() {
    let h = two_zones().await;
    assert!(h.decide.assign_domain(ZONE_KEY, "zb"));
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 10)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    // The cheaper machine is another shard's: the owned one is bootstrapped.
    assert_eq!(next_machine(&h).await, "dear");
}

#[tokio::test]
async fn unassigning_the_last_domain_owns_everything_again() {
    let h = two_zones().await;
    h.decide.assign_domain(ZONE_KEY, "zc");
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 10)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 0, "nothing in zc: nothing to act on");
    assert!(h.decide.unassign_domain(ZONE_KEY, "zc"));
    assert!(h.decide.owned_domains().is_empty());
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    assert_eq!(next_machine(&h).await, "cheap");
}

#[tokio::test]
async fn a_released_machine_is_never_acted_on_and_an_adopted_one_is() {
    let h = two_zones().await;
    assert_eq!(
        h.decide.release_machines(&["cheap".to_owned()]),
        TransferVerdict::Done
    );
    // Redelivery after a lost ack: still done, nothing changes.
    assert_eq!(
        h.decide.release_machines(&["cheap".to_owned()]),
        TransferVerdict::Done
    );
    assert!(h.decide.ownership().released.contains("cheap"));
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 10)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    assert_eq!(next_machine(&h).await, "dear");
    // Adopting it back (the coordinator's second phase on this shard).
    h.decide.assign_domain(ZONE_KEY, "zb");
    assert_eq!(
        h.decide.adopt_machines(&["cheap".to_owned()]),
        TransferVerdict::Done
    );
    let o = h.decide.ownership();
    assert!(o.adopted.contains("cheap") && !o.released.contains("cheap"));
}

#[tokio::test]
async fn a_release_is_all_or_nothing() {
    let h = Harness::listing(
        cfg_rails_off(),
        [
            idle("free", "za", 0.1),
            pm("busy", pb::MachineState::Configured, "c1"),
        ],
    )
    .await;
    h.decide.run_cycle().await.unwrap();
    let both = ["free".to_owned(), "busy".to_owned()];
    let TransferVerdict::Refused(why) = h.decide.release_machines(&both) else {
        panic!("a Configured machine cannot be released");
    };
    assert!(why.contains("busy"), "{why}");
    assert!(h.decide.ownership().released.is_empty());
    assert!(matches!(
        h.decide.release_machines(&["ghost".to_owned()]),
        TransferVerdict::Refused(_)
    ));
    // Not owned here (another shard's domain): refused too.
    h.decide.assign_domain(ZONE_KEY, "zb");
    assert!(matches!(
        h.decide.release_machines(&["free".to_owned()]),
        TransferVerdict::Refused(_)
    ));
    assert!(matches!(
        h.decide.release_machines(&[]),
        TransferVerdict::Refused(_)
    ));
}

#[tokio::test]
async fn a_machine_with_a_decided_action_is_busy_until_it_settles() {
    let h = two_zones().await;
    edge::apply_rollup(&h.decide, &rollup("c1", vec![need(4, 10)])).unwrap();
    let r = h.decide.run_cycle().await.unwrap();
    assert_eq!(r.enqueued, 1);
    // Queued: releasing it now would race the Bootstrap.
    assert!(matches!(
        h.decide.release_machines(&["cheap".to_owned()]),
        TransferVerdict::Busy(_)
    ));
    // Handed out (in flight): still busy.
    assert_eq!(next_machine(&h).await, "cheap");
    assert!(matches!(
        h.decide.release_machines(&["cheap".to_owned()]),
        TransferVerdict::Busy(_)
    ));
    assert!(h.decide.ownership().released.is_empty());
}

#[tokio::test]
async fn a_selector_release_chooses_owned_idle_machines_of_the_type() {
    let p = provider();
    p.add_machine(idle("a", "za", 0.1)).unwrap();
    p.add_machine(idle("b", "za", 0.1)).unwrap();
    let mut other = idle("c", "za", 0.1);
    other.instance_type = "c5.large".into();
    p.add_machine(other).unwrap();
    p.add_machine(idle("d-foreign", "zb", 0.1)).unwrap();
    let h = Harness::start_with(cfg_rails_off(), p).await;
    h.decide.run_cycle().await.unwrap();
    h.decide.assign_domain(ZONE_KEY, "za");
    let want = |t: &str, n: usize| vec![t.to_owned(); n];
    // Three m5.xlarge asked, two owned: both, in id order; c and d stay.
    assert_eq!(
        h.decide.release_machines(&want("*/m5.xlarge", 3)),
        TransferVerdict::Released(vec!["a".into(), "b".into()])
    );
    // Nothing left of that type: an empty release, not an error.
    assert_eq!(
        h.decide.release_machines(&want("*/m5.xlarge", 1)),
        TransferVerdict::Released(vec![])
    );
    // "*" takes any type; the foreign machine is never chosen.
    assert_eq!(
        h.decide.release_machines(&want("*", 5)),
        TransferVerdict::Released(vec!["c".into()])
    );
    assert!(matches!(
        h.decide.release_machines(&["*".to_owned(), "a".to_owned()]),
        TransferVerdict::Refused(_)
    ));
    let released = h.decide.ownership().released;
    assert_eq!(released.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
}

/// ADR-0142: a selector names what the shortfall lacks and must match, and the donor
/// releases only machines that have it — never a CPU machine for a GPU shortfall.
#[tokio::test]
async fn a_selector_release_gives_only_machines_that_fit_the_shortfall() {
    let p = provider();
    let mut gpu = idle("g-gpu", "za", 0.1);
    gpu.instance_type = "bm.gpu.8".into();
    gpu.resources
        .get_or_insert_with(Default::default)
        .resources
        .insert("nvidia.com/gpu".into(), "8".into());
    p.add_machine(gpu).unwrap();
    p.add_machine(idle("a-cpu", "za", 0.1)).unwrap();
    p.add_machine(idle("b-cpu", "za", 0.1)).unwrap();
    let h = Harness::start_with(cfg_rails_off(), p).await;
    h.decide.run_cycle().await.unwrap();
    h.decide.assign_domain(ZONE_KEY, "za");
    // Two asked for an untyped GPU shortfall: the one GPU machine, not the CPU ones that
    // come first in id order.
    assert_eq!(
        h.decide.release_machines(&[
            "*?needs=cpu,nvidia.com/gpu".to_owned(),
            "*?needs=nvidia.com/gpu".to_owned()
        ]),
        TransferVerdict::Released(vec!["g-gpu".into()])
    );
    // The shortfall's requirements are matched too.
    assert_eq!(
        h.decide
            .release_machines(&[format!("*?match={ZONE_KEY}:In:zb")]),
        TransferVerdict::Released(vec![])
    );
    assert_eq!(
        h.decide
            .release_machines(&[format!("*/m5.xlarge?match={ZONE_KEY}:In:za")]),
        TransferVerdict::Released(vec!["a-cpu".into()])
    );
    // A token that starts like a selector but is not one is refused whole.
    assert!(matches!(
        h.decide.release_machines(&["*?size=big".to_owned()]),
        TransferVerdict::Refused(_)
    ));
    let released = h.decide.ownership().released;
    assert_eq!(released.into_iter().collect::<Vec<_>>(), ["a-cpu", "g-gpu"]);
}
