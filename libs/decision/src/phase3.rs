//! Phase 3: shrink-only reclaim and idle release.

use crate::context::Ctx;
use crate::intern::NONE;
use crate::phase1::Phase1;
use crate::phase2::Phase2;
use crate::scoring::{RECLAIM_GRACE, ReleasePolicy};
use bigfleet_model::{Action, MachineState};

/// Reclaims every Configured machine Phase 1 left unclaimed, per ready cluster
/// in ascending cluster id, least valuable first (ADR-0023); then releases
/// unclaimed Idle machines whose hold expired, in machine id order. A machine
/// Phase 2 already preempts is not reclaimed again (one action per machine).
pub(crate) fn run(
    ctx: &Ctx<'_>,
    p1: &Phase1,
    p2: &Phase2,
    ready: &(dyn Fn(&str) -> bool + Sync),
    policy: &ReleasePolicy,
    now_unix_nanos: i64,
) -> Vec<Action> {
    let snap = &ctx.snap;
    let mut out = Vec::new();
    let mut clusters: Vec<u32> = (0..snap.bound_clusters())
        .filter(|&c| !snap.bound(c, 0).is_empty())
        .collect();
    clusters.sort_by(|a, b| snap.cluster_name(*a).cmp(snap.cluster_name(*b)));
    for c in clusters {
        let name = snap.cluster_name(c);
        if !ready(name) {
            continue;
        }
        // Keep order is price asc, reclamation penalty desc, id asc, so the
        // kept (claimed) machines are roughly its prefix; emit the excess from
        // the other end so a per-cycle reclaim cap drains the most expensive,
        // least valuable machines first.
        let mut excess: Vec<u32> = snap
            .bound(c, 0)
            .iter()
            .copied()
            .filter(|&r| {
                p1.owner[r as usize] == NONE && !p2.taken[r as usize] && !ctx.is_foreign(r)
            })
            .collect();
        excess.sort_by(|a, b| {
            let (ra, rb) = (snap.rec(*a), snap.rec(*b));
            rb.price
                .total_cmp(&ra.price)
                .then(
                    ra.assigned_reclamation_penalty
                        .total_cmp(&rb.assigned_reclamation_penalty),
                )
                .then(snap.rank(*a).cmp(&snap.rank(*b)))
        });
        for r in excess {
            out.push(Action::Reclaim {
                machine_id: snap.id(r).to_owned(),
                cluster: name.to_owned(),
                grace: RECLAIM_GRACE,
            });
        }
    }
    // The fleet keeps the earliest idle-since per capacity type, so a cycle in
    // which no hold can have expired skips the scan of the Idle machines.
    if !snap.idle_release_due(policy, now_unix_nanos) {
        return out;
    }
    for &r in snap.state_list(MachineState::Idle) {
        if p1.owner[r as usize] != NONE || ctx.is_foreign(r) {
            continue;
        }
        let Some(hold) = policy.hold(snap.rec(r).cap) else {
            continue;
        };
        let Some(since) = snap.idle_since(r) else {
            continue;
        };
        let idle_for = i128::from(now_unix_nanos) - i128::from(since);
        if idle_for < hold.as_nanos() as i128 {
            continue;
        }
        out.push(Action::Release {
            machine_id: snap.id(r).to_owned(),
        });
    }
    out
}
