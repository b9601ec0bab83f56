//! The rebalancer's policy (ADR-0130) as a pure function: the latest reports, the transfers
//! in flight, what finished recently and the clock in; the transfers to start, and why, out.
//! No Raft, no I/O, no hidden clock — the leader task in `rebalancer` feeds it and carries
//! out its decisions, and the tests here drive it directly.
//!
//! A need is a (recipient shard, instance type) with a persistent shortfall. For each need,
//! highest priority first, the policy picks one donor:
//! 1. **Hysteresis** — the shortfall has stayed unmet for `min_age_cycles` of the
//!    recipient's cycles and the coordinator has seen it for `min_persist`.
//! 2. **Already being met** — a transfer to the recipient for that type is in flight (or was
//!    decided earlier in this round), or one delivered machines within `settle`: nothing
//!    more until the recipient has had time to use them.
//! 3. **Rate limits** — at most `max_per_window` transfers started per `window`, and at most
//!    `max_in_flight_per_pair` in flight per (donor, recipient).
//! 4. **Donor** — another shard with free supply of the type not already promised to a
//!    transfer; never a shard the recipient is itself giving to (never both directions
//!    between a pair), never the shard the same type was moved *from
//!    the recipient to* within `cooldown` (no flapping), nor one whose last transfer to the
//!    recipient failed within `cooldown`. Idle first (`TransferOwnership`);
//!    when the last idle transfer from that donor of that type found nothing idle (the
//!    donor's free supply is speculative), `ReassignSpeculative`.
//! 5. **Drain** — no free supply anywhere, and the need's priority is at least
//!    `drain_min_priority`: a donor holding machines of the type whose own shortfalls are all
//!    below that priority gets a `CrossShardDrain` (it picks lower-priority victims with its
//!    own Phase 2 rules). The drained machines come back as its Idle supply for step 4.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bigfleet_proto::v1alpha1::{self as pb, node_selector_requirement::Operator};

use crate::transfers::{Phase, Transfer, TransferKind, type_selector};

/// The label a shortfall pins its instance type with.
pub const INSTANCE_TYPE_LABEL: &str = "node.kubernetes.io/instance-type";

/// Tunables (`--rebalance-*` flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub min_age_cycles: i32,
    pub min_persist: Duration,
    pub max_in_flight_per_pair: usize,
    pub max_per_window: usize,
    pub window: Duration,
    pub cooldown: Duration,
    pub drain_min_priority: i32,
    pub max_machines_per_transfer: u32,
    /// After a transfer to a (shard, type) finished with machines, the need is left alone
    /// this long: the recipient's next cycles still report it until it has used them.
    pub settle: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_age_cycles: 3,
            min_persist: Duration::from_secs(60),
            max_in_flight_per_pair: 1,
            max_per_window: 4,
            window: Duration::from_secs(300),
            cooldown: Duration::from_secs(600),
            drain_min_priority: 1_000_000,
            max_machines_per_transfer: 4,
            settle: Duration::from_secs(120),
        }
    }
}

/// One unmet need of a shard, as its report states it.
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    /// Empty: the shortfall pins no instance type (its selector says what will do).
    pub instance_type: String,
    pub priority: i32,
    pub age_cycles: i32,
    /// How long the coordinator has seen this (shard, type) short (see [`Persistence`]).
    pub persisted_for: Duration,
    /// The release token for one machine of this shortfall (ADR-0142): what it lacks and
    /// must match, so a donor never gives a machine it cannot use. `*/<type>` when empty.
    pub selector: String,
}

/// What the coordinator keeps of one reported shortfall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shortage {
    /// The pinned instance type, or empty.
    pub instance_type: String,
    pub priority: i32,
    pub age_cycles: i32,
    /// Its release token (see [`Need::selector`]).
    pub selector: String,
}

impl Shortage {
    /// What the rebalancer keeps of `s`.
    pub fn of(s: &pb::Shortfall) -> Shortage {
        let instance_type = instance_type_of(&s.requirements);
        let selector =
            bigfleet_conv::release_selector(&instance_type, &s.requirements, s.deficit.as_ref())
                .to_string();
        Shortage {
            instance_type,
            priority: s.priority,
            age_cycles: s.age_cycles,
            selector,
        }
    }
}

/// What the policy knows about one shard.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ShardView {
    pub shard: String,
    /// Free (Idle or Speculative) machines per instance type.
    pub free_by_type: BTreeMap<String, u32>,
    /// Machines in any state per instance type (what a drain could reclaim).
    pub total_by_type: BTreeMap<String, u32>,
    pub needs: Vec<Need>,
}

impl ShardView {
    fn free(&self, instance_type: &str) -> u32 {
        if instance_type.is_empty() {
            self.free_by_type.values().sum()
        } else {
            self.free_by_type.get(instance_type).copied().unwrap_or(0)
        }
    }
    fn total(&self, instance_type: &str) -> u32 {
        if instance_type.is_empty() {
            self.total_by_type.values().sum()
        } else {
            self.total_by_type.get(instance_type).copied().unwrap_or(0)
        }
    }
}

/// Everything a decision reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub shards: &'a [ShardView],
    /// Transfers in flight (FSM).
    pub active: &'a [Transfer],
    /// Finished transfers (FSM), for cool-downs, the window and the idle/speculative call.
    pub recent: &'a [Transfer],
    pub now_unix_ns: i64,
}

/// Why a need got no transfer this round (the metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SkipReason {
    Hysteresis,
    InFlight,
    RateLimited,
    NoSupply,
}

impl SkipReason {
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::Hysteresis => "hysteresis",
            SkipReason::InFlight => "in_flight",
            SkipReason::RateLimited => "rate_limited",
            SkipReason::NoSupply => "no_supply",
        }
    }
}

/// A need left alone, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip {
    pub recipient: String,
    pub instance_type: String,
    pub reason: SkipReason,
    pub detail: String,
}

/// One round's output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Round {
    /// The transfers to start, in their release phase from the round's clock, `reason`
    /// saying why. Their `id` (`planned-<n>`) and empty `instruction_id` are placeholders
    /// the leader replaces when it starts them.
    pub decisions: Vec<Transfer>,
    pub skips: Vec<Skip>,
}

fn ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Machines of `instance_type` promised away from `donor` by transfers in flight.
fn promised(active: &[Transfer], donor: &str, instance_type: &str) -> u32 {
    active
        .iter()
        .filter(|t| t.donor == donor && t.kind != TransferKind::Drain)
        .filter(|t| {
            instance_type.is_empty()
                || t.instance_type.is_empty()
                || t.instance_type == instance_type
        })
        .map(|t| t.count)
        .sum()
}

/// (recipient shard, instance type): one need of the round.
type NeedKey = (String, String);

/// The decision: pure and deterministic (ties break by shard id and type).
pub fn decide(policy: &Policy, inputs: Inputs<'_>) -> Round {
    let now = inputs.now_unix_ns;
    let mut round = Round::default();

    // The strongest need per (recipient, type): its highest priority and oldest age; the
    // count asked is one machine per shortfall of that type, capped.
    let mut needs: BTreeMap<NeedKey, (Need, Vec<String>)> = BTreeMap::new();
    for s in inputs.shards {
        for n in &s.needs {
            let e = needs
                .entry((s.shard.clone(), n.instance_type.clone()))
                .or_insert_with(|| (n.clone(), Vec::new()));
            e.1.push(n.selector.clone());
            if n.priority > e.0.priority {
                e.0.priority = n.priority;
            }
            e.0.age_cycles = e.0.age_cycles.max(n.age_cycles);
            e.0.persisted_for = e.0.persisted_for.max(n.persisted_for);
        }
    }
    let mut order: Vec<(NeedKey, (Need, Vec<String>))> = needs.into_iter().collect();
    order.sort_by(|a, b| {
        (b.1.0.priority, b.1.0.age_cycles)
            .cmp(&(a.1.0.priority, a.1.0.age_cycles))
            .then_with(|| a.0.cmp(&b.0))
    });

    let window_start = now.saturating_sub(ns(policy.window));
    // A transfer that finished having moved (or drained) nothing does not count: it
    // disturbed nothing, and a fleet of donors that fit nothing (ADR-0142) would otherwise
    // spend the window on empty answers and starve the donor that fits.
    let mut started_in_window = inputs
        .active
        .iter()
        .chain(inputs.recent)
        .filter(|t| t.started_at_unix_ns >= window_start)
        .filter(|t| !(t.phase == Phase::Done && t.machine_ids.is_empty()))
        .count();
    // What this round adds on top of the transfers in flight.
    let mut planned: Vec<Transfer> = Vec::new();

    for ((recipient, itype), (need, tokens)) in order {
        let asked = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
        let skip = |reason, detail: String| Skip {
            recipient: recipient.clone(),
            instance_type: itype.clone(),
            reason,
            detail,
        };
        if need.age_cycles < policy.min_age_cycles || need.persisted_for < policy.min_persist {
            round.skips.push(skip(
                SkipReason::Hysteresis,
                format!(
                    "short for {} cycles / {:?}",
                    need.age_cycles, need.persisted_for
                ),
            ));
            continue;
        }
        let all: Vec<&Transfer> = inputs.active.iter().chain(planned.iter()).collect();
        if let Some(t) = all
            .iter()
            .find(|t| t.recipient == recipient && t.instance_type == itype)
        {
            round.skips.push(skip(
                SkipReason::InFlight,
                format!("transfer {} from {} is in flight", t.id, t.donor),
            ));
            continue;
        }
        if let Some(t) = inputs.recent.iter().find(|t| {
            t.recipient == recipient
                && t.instance_type == itype
                && t.phase == Phase::Done
                && (t.kind == TransferKind::Drain || !t.machine_ids.is_empty())
                && t.updated_at_unix_ns >= now.saturating_sub(ns(policy.settle))
        }) {
            round.skips.push(skip(
                SkipReason::InFlight,
                format!("transfer {} from {} finished; settling", t.id, t.donor),
            ));
            continue;
        }
        if started_in_window >= policy.max_per_window {
            round.skips.push(skip(
                SkipReason::RateLimited,
                format!(
                    "{started_in_window} transfers started in the last {:?}",
                    policy.window
                ),
            ));
            continue;
        }
        let pair_ok = |donor: &str| {
            let same = all
                .iter()
                .filter(|t| t.donor == donor && t.recipient == recipient)
                .count();
            let reverse = all
                .iter()
                .any(|t| t.donor == recipient && t.recipient == donor);
            // Moved from the recipient to this donor recently: moving it back would flap.
            // Or a transfer of this type between the two failed recently (a shard that
            // refuses will refuse again): back off for the cool-down.
            // So does a donor that had neither an idle machine nor a speculative slot that
            // fits (its speculative transfer, tried after an empty idle one, came back
            // empty too): asking again would only spend the window's starts.
            let cooling = inputs.recent.iter().any(|t| {
                let back = t.donor == recipient && t.recipient == donor;
                let ours = t.donor == donor && t.recipient == recipient;
                let failed = ours && t.phase == Phase::Failed;
                let found_nothing = ours
                    && t.kind == TransferKind::Speculative
                    && t.phase == Phase::Done
                    && t.machine_ids.is_empty();
                (back || failed || found_nothing)
                    && t.instance_type == itype
                    && t.updated_at_unix_ns >= now.saturating_sub(ns(policy.cooldown))
            });
            same < policy.max_in_flight_per_pair && !reverse && !cooling
        };
        let planned_active: Vec<Transfer> = inputs
            .active
            .iter()
            .cloned()
            .chain(planned.iter().cloned())
            .collect();
        // Donors with unpromised free supply, most first.
        let mut donors: Vec<(&ShardView, u32)> = inputs
            .shards
            .iter()
            .filter(|s| s.shard != recipient && pair_ok(&s.shard))
            .map(|s| {
                let free =
                    s.free(&itype)
                        .saturating_sub(promised(&planned_active, &s.shard, &itype));
                (s, free)
            })
            .filter(|(_, free)| *free > 0)
            .collect();
        donors.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.shard.cmp(&b.0.shard)));
        let decision = if let Some((donor, free)) = donors.first() {
            let count = asked
                .min(*free)
                .min(policy.max_machines_per_transfer)
                .max(1);
            // The donor's last idle transfer of this type found nothing idle: its free
            // supply is speculative.
            let last_idle = inputs.recent.iter().rev().find(|t| {
                t.donor == donor.shard && t.instance_type == itype && t.kind != TransferKind::Drain
            });
            let speculative = last_idle.is_some_and(|t| {
                t.kind == TransferKind::Idle && t.phase == Phase::Done && t.machine_ids.is_empty()
            });
            let kind = if speculative {
                TransferKind::Speculative
            } else {
                TransferKind::Idle
            };
            let why = format!(
                "{recipient} short of {} for {} cycles at priority {}; {} has {free} free",
                type_label(&itype),
                need.age_cycles,
                need.priority,
                donor.shard
            );
            Some((kind, *donor, count, why))
        } else if need.priority >= policy.drain_min_priority {
            let cooling_drain = |donor: &str| {
                inputs.recent.iter().any(|t| {
                    t.kind == TransferKind::Drain
                        && t.donor == donor
                        && t.recipient == recipient
                        && t.instance_type == itype
                        && t.updated_at_unix_ns >= now.saturating_sub(ns(policy.cooldown))
                })
            };
            let mut victims: Vec<(&ShardView, u32)> = inputs
                .shards
                .iter()
                .filter(|s| s.shard != recipient && pair_ok(&s.shard) && !cooling_drain(&s.shard))
                // A donor short at this priority itself has nothing lower to give.
                .filter(|s| s.needs.iter().all(|n| n.priority < need.priority))
                .map(|s| (s, s.total(&itype)))
                .filter(|(_, total)| *total > 0)
                .collect();
            victims.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.shard.cmp(&b.0.shard)));
            victims.first().map(|(donor, total)| {
                let why = format!(
                    "{recipient} short of {} at priority {} (drain threshold {}) and no free supply; {} holds {total} at lower priority",
                    type_label(&itype),
                    need.priority,
                    policy.drain_min_priority,
                    donor.shard
                );
                let count = asked.min(*total).min(policy.max_machines_per_transfer).max(1);
                (TransferKind::Drain, *donor, count, why)
            })
        } else {
            None
        };
        match decision {
            Some((kind, donor, count, why)) => {
                started_in_window += 1;
                let t = Transfer {
                    id: format!("planned-{}", planned.len()),
                    kind,
                    donor: donor.shard.clone(),
                    recipient: recipient.clone(),
                    instance_type: itype.clone(),
                    count,
                    priority: need.priority,
                    phase: Phase::Release,
                    instruction_id: String::new(),
                    machine_ids: Vec::new(),
                    started_at_unix_ns: now,
                    updated_at_unix_ns: now,
                    reason: why,
                    selectors: tokens
                        .iter()
                        .take(count as usize)
                        .map(|t| {
                            if t.is_empty() {
                                type_selector(&itype)
                            } else {
                                t.clone()
                            }
                        })
                        .collect(),
                };
                planned.push(t.clone());
                round.decisions.push(t);
            }
            None => round.skips.push(skip(
                SkipReason::NoSupply,
                "no other shard has free supply an eligible donor can give".into(),
            )),
        }
    }
    round
}

fn type_label(t: &str) -> &str {
    if t.is_empty() { "any type" } else { t }
}

/// The instance type a shortfall pins (`In` on [`INSTANCE_TYPE_LABEL`], first value), or
/// empty.
pub fn instance_type_of(requirements: &[pb::NodeSelectorRequirement]) -> String {
    requirements
        .iter()
        .find(|r| r.key == INSTANCE_TYPE_LABEL && r.operator == Operator::In as i32)
        .and_then(|r| r.values.first().cloned())
        .unwrap_or_default()
}

/// Tracks since when the coordinator has seen each (shard, instance type) short, so the
/// hysteresis holds in wall time too, not only in the shard's cycle count. Leader-local;
/// a new leader starts from zero (the conservative direction).
#[derive(Debug, Default, Clone)]
pub struct Persistence {
    since: BTreeMap<(String, String), i64>,
}

impl Persistence {
    /// Records the needs seen now and forgets the ones that cleared; returns, per need, how
    /// long it has persisted.
    pub fn observe(
        &mut self,
        seen: impl IntoIterator<Item = (String, String)>,
        now_unix_ns: i64,
    ) -> BTreeMap<(String, String), Duration> {
        let seen: BTreeSet<(String, String)> = seen.into_iter().collect();
        self.since.retain(|k, _| seen.contains(k));
        seen.into_iter()
            .map(|k| {
                let since = *self.since.entry(k.clone()).or_insert(now_unix_ns);
                let d = u64::try_from(now_unix_ns.saturating_sub(since)).unwrap_or(0);
                (k, Duration::from_nanos(d))
            })
            .collect()
    }

    pub fn clear(&mut self) {
        self.since.clear();
    }
}

/// A shard's view from its latest report: free supply per type is the type's count capped
/// by the shard's free total (the summary does not split free machines by type), needs from
/// its shortfalls.
pub fn view_of(
    shard: &str,
    summary: Option<&pb::ShardSummary>,
    shortfalls: &[Shortage],
    persisted: &BTreeMap<(String, String), Duration>,
) -> ShardView {
    let mut v = ShardView {
        shard: shard.to_owned(),
        ..ShardView::default()
    };
    if let Some(s) = summary {
        let free = u32::try_from(s.free_machines).unwrap_or(0);
        for (t, n) in &s.per_instance_type_counts {
            let n = u32::try_from(*n).unwrap_or(0);
            v.total_by_type.insert(t.clone(), n);
            if n.min(free) > 0 {
                v.free_by_type.insert(t.clone(), n.min(free));
            }
        }
    }
    v.needs = shortfalls
        .iter()
        .map(|s| Need {
            instance_type: s.instance_type.clone(),
            priority: s.priority,
            age_cycles: s.age_cycles,
            persisted_for: persisted
                .get(&(shard.to_owned(), s.instance_type.clone()))
                .copied()
                .unwrap_or_default(),
            selector: s.selector.clone(),
        })
        .collect();
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIN: i64 = 60_000_000_000;

    fn need(t: &str, priority: i32) -> Need {
        Need {
            instance_type: t.into(),
            priority,
            age_cycles: 10,
            persisted_for: Duration::from_secs(3600),
            selector: String::new(),
        }
    }

    fn shard(id: &str, free: &[(&str, u32)], needs: Vec<Need>) -> ShardView {
        ShardView {
            shard: id.into(),
            free_by_type: free.iter().map(|(t, n)| ((*t).into(), *n)).collect(),
            total_by_type: free.iter().map(|(t, n)| ((*t).into(), *n)).collect(),
            needs,
        }
    }

    /// The plainest need: s0 short of gpu at priority 100, s1 with 5 gpus free.
    fn gpu_short_and_free() -> [ShardView; 2] {
        [
            shard("s0", &[], vec![need("gpu", 100)]),
            shard("s1", &[("gpu", 5)], vec![]),
        ]
    }

    fn in_flight(d: &Transfer, id: &str, started: i64) -> Transfer {
        d.transfer(id.into(), format!("{id}-i"), started)
    }

    /// `d` carried out as transfer `id` from `started`, ended in `phase` having moved
    /// `machines`.
    fn ended(d: &Transfer, id: &str, started: i64, phase: Phase, machines: &[&str]) -> Transfer {
        Transfer {
            phase,
            machine_ids: machines.iter().map(|m| (*m).to_owned()).collect(),
            ..in_flight(d, id, started)
        }
    }

    fn run(
        p: &Policy,
        shards: &[ShardView],
        active: &[Transfer],
        recent: &[Transfer],
        now: i64,
    ) -> Round {
        decide(
            p,
            Inputs {
                shards,
                active,
                recent,
                now_unix_ns: now,
            },
        )
    }

    /// Finished transfer `past` keeps every need of `shards` undecided at `held` (the first
    /// skipped for `reason`), and no longer at `free`.
    fn holds_back(
        p: &Policy,
        shards: &[ShardView],
        past: Transfer,
        reason: SkipReason,
        held: i64,
        free: i64,
    ) {
        let r = run(p, shards, &[], std::slice::from_ref(&past), held);
        assert!(r.decisions.is_empty());
        assert_eq!(r.skips[0].reason, reason);
        assert_eq!(run(p, shards, &[], &[past], free).decisions.len(), 1);
    }

    #[test]
    fn a_shortfall_is_met_from_another_shards_idle_supply() {
        let shards = [
            shard("s0", &[], vec![need("gpu", 100), need("gpu", 90)]),
            shard("s1", &[("gpu", 5)], vec![]),
            shard("s2", &[("gpu", 1)], vec![]),
        ];
        let r = run(&Policy::default(), &shards, &[], &[], 10 * MIN);
        assert_eq!(r.decisions.len(), 1);
        let d = &r.decisions[0];
        assert_eq!(
            (
                d.kind,
                d.donor.as_str(),
                d.recipient.as_str(),
                d.count,
                d.priority
            ),
            (TransferKind::Idle, "s1", "s0", 2, 100)
        );
        assert!(d.reason.contains("s0 short of gpu"), "{}", d.reason);
    }

    #[test]
    fn hysteresis_holds_young_shortfalls() {
        let mut young = need("gpu", 100);
        young.age_cycles = 1;
        let mut fresh = need("cpu", 100);
        fresh.persisted_for = Duration::from_secs(5);
        let shards = [
            shard("s0", &[], vec![young, fresh]),
            shard("s1", &[("gpu", 5), ("cpu", 5)], vec![]),
        ];
        let r = run(&Policy::default(), &shards, &[], &[], 10 * MIN);
        assert!(r.decisions.is_empty());
        assert!(r.skips.iter().all(|s| s.reason == SkipReason::Hysteresis));
        assert_eq!(r.skips.len(), 2);
    }

    #[test]
    fn a_need_being_met_is_not_decided_again() {
        let shards = gpu_short_and_free();
        let p = Policy::default();
        let first = run(&p, &shards, &[], &[], 10 * MIN);
        let t = in_flight(&first.decisions[0], "t1", 10 * MIN);
        let second = run(&p, &shards, &[t], &[], 11 * MIN);
        assert!(second.decisions.is_empty());
        assert_eq!(second.skips[0].reason, SkipReason::InFlight);
    }

    #[test]
    fn a_met_need_settles_before_it_is_decided_again() {
        let shards = gpu_short_and_free();
        let p = Policy::default();
        let d = run(&p, &shards, &[], &[], 10 * MIN).decisions[0].clone();
        let done = ended(&d, "t1", 10 * MIN, Phase::Done, &["m1"]);
        // Still short after the settle time: decided again.
        holds_back(&p, &shards, done, SkipReason::InFlight, 11 * MIN, 13 * MIN);
    }

    #[test]
    fn the_window_limits_starts() {
        let p = Policy {
            max_per_window: 1,
            settle: Duration::ZERO,
            ..Policy::default()
        };
        let shards = [
            shard("s0", &[], vec![need("gpu", 100), need("cpu", 50)]),
            shard("s1", &[("gpu", 5)], vec![]),
            shard("s2", &[("cpu", 5)], vec![]),
        ];
        let r = run(&p, &shards, &[], &[], 10 * MIN);
        assert_eq!(r.decisions.len(), 1);
        assert_eq!(r.decisions[0].instance_type, "gpu");
        assert_eq!(r.skips[0].reason, SkipReason::RateLimited);
        // A finished transfer inside the window still counts; outside it does not.
        let done = ended(&r.decisions[0], "t1", 10 * MIN, Phase::Done, &["m1"]);
        holds_back(
            &p,
            &shards,
            done,
            SkipReason::RateLimited,
            12 * MIN,
            20 * MIN,
        );
        // One that moved nothing (a donor with nothing that fits) does not count at all:
        // the window's one start is still there to spend.
        let empty = ended(&r.decisions[0], "t1", 10 * MIN, Phase::Done, &[]);
        assert_eq!(run(&p, &shards, &[], &[empty], 12 * MIN).decisions.len(), 1);
    }

    #[test]
    fn no_flapping_within_the_cooldown() {
        // gpu moved s1 -> s0 a minute ago; now s1 is short and s0 has gpus free.
        let before = [
            shard("s0", &[], vec![need("gpu", 1)]),
            shard("s1", &[("gpu", 1)], vec![]),
        ];
        let back = run(&Policy::default(), &before, &[], &[], 9 * MIN).decisions[0].clone();
        assert_eq!((back.donor.as_str(), back.recipient.as_str()), ("s1", "s0"));
        let moved = ended(&back, "t1", 9 * MIN, Phase::Done, &["m1"]);
        let shards = [
            shard("s0", &[("gpu", 3)], vec![]),
            shard("s1", &[], vec![need("gpu", 100)]),
        ];
        let p = Policy::default();
        // After the cool-down it may move back.
        holds_back(&p, &shards, moved, SkipReason::NoSupply, 10 * MIN, 30 * MIN);
    }

    #[test]
    fn a_failed_pair_backs_off_for_the_cooldown() {
        let shards = [
            shard("s0", &[], vec![need("gpu", 100)]),
            shard("s1", &[("gpu", 5)], vec![]),
            shard("s2", &[("gpu", 1)], vec![]),
        ];
        let p = Policy::default();
        let d = run(&p, &shards, &[], &[], 10 * MIN).decisions[0].clone();
        assert_eq!(d.donor, "s1");
        let failed = ended(&d, "t1", 10 * MIN, Phase::Failed, &[]);
        // The next donor is tried instead; after the cool-down s1 again.
        let r = run(&p, &shards, &[], std::slice::from_ref(&failed), 11 * MIN);
        assert_eq!(r.decisions[0].donor, "s2");
        let r = run(&p, &shards, &[], &[failed], 30 * MIN);
        assert_eq!(r.decisions[0].donor, "s1");
    }

    #[test]
    fn an_empty_idle_transfer_switches_the_donor_to_speculative() {
        let shards = gpu_short_and_free();
        let d = run(&Policy::default(), &shards, &[], &[], 10 * MIN).decisions[0].clone();
        let empty = ended(&d, "t1", 10 * MIN, Phase::Done, &[]);
        let r = run(&Policy::default(), &shards, &[], &[empty], 60 * MIN);
        assert_eq!(r.decisions[0].kind, TransferKind::Speculative);
    }

    /// ADR-0142: each token names what its shortfall lacks and must match, so the donor
    /// can refuse to give a machine the recipient cannot use (an untyped GPU shortfall and
    /// a shard of CPU machines).
    #[test]
    fn the_release_names_what_each_shortfall_lacks() {
        let untyped = |priority, selector: &str| Need {
            selector: selector.into(),
            ..need("", priority)
        };
        let shards = [
            shard(
                "s0",
                &[],
                vec![
                    untyped(100, "*?needs=nvidia.com/gpu"),
                    untyped(90, "*?needs=cpu"),
                ],
            ),
            shard("s1", &[("cpu-type", 3)], vec![]),
        ];
        let r = run(&Policy::default(), &shards, &[], &[], 10 * MIN);
        let t = r.decisions[0].transfer("t1".into(), "i1".into(), 10 * MIN);
        assert_eq!(t.selectors, ["*?needs=nvidia.com/gpu", "*?needs=cpu"]);
        let Some(pb::coordinator_instruction::Payload::TransferOwnership(o)) = t.payload() else {
            panic!("{t:?}");
        };
        assert_eq!(o.machine_ids, t.selectors);
        // A shortfall known by its type only keeps the old token.
        let r = run(
            &Policy::default(),
            &gpu_short_and_free(),
            &[],
            &[],
            10 * MIN,
        );
        assert_eq!(r.decisions[0].selectors, ["*/gpu"]);
    }

    /// A donor that found neither an idle machine nor a speculative slot that fits is not
    /// asked again within the cool-down: the next donor is, though it has less free.
    #[test]
    fn a_donor_with_nothing_that_fits_is_left_alone_for_the_cooldown() {
        let p = Policy::default();
        let shards = [
            shard("s0", &[], vec![need("", 100)]),
            shard("s1", &[("cpu-type", 8)], vec![]),
            shard("s2", &[("gpu", 2)], vec![]),
        ];
        let idle = run(&p, &shards, &[], &[], 10 * MIN).decisions[0].clone();
        assert_eq!(idle.donor, "s1", "the most free first");
        let idle = ended(&idle, "t1", 10 * MIN, Phase::Done, &[]);
        let spec =
            run(&p, &shards, &[], std::slice::from_ref(&idle), 11 * MIN).decisions[0].clone();
        assert_eq!(
            (spec.kind, spec.donor.as_str()),
            (TransferKind::Speculative, "s1")
        );
        let spec = ended(&spec, "t2", 11 * MIN, Phase::Done, &[]);
        let recent = [idle, spec];
        let next = run(&p, &shards, &[], &recent, 12 * MIN).decisions[0].clone();
        assert_eq!((next.kind, next.donor.as_str()), (TransferKind::Idle, "s2"));
        // After the cool-down s1 may be asked again.
        let later = run(&p, &shards, &[], &recent, 11 * MIN + 11 * MIN).decisions[0].clone();
        assert_eq!(later.donor, "s1");
    }

    #[test]
    fn a_high_priority_need_drains_a_donor_without_free_supply() {
        let p = Policy {
            drain_min_priority: 1000,
            ..Policy::default()
        };
        let mut busy = shard("s1", &[], vec![need("cpu", 10)]);
        busy.total_by_type.insert("gpu".into(), 8);
        let mut pressed = shard("s2", &[], vec![need("gpu", 5000)]);
        pressed.total_by_type.insert("gpu".into(), 20);
        let shards = [
            shard("s0", &[], vec![need("gpu", 2000)]),
            busy.clone(),
            pressed,
        ];
        let r = run(&p, &shards, &[], &[], 10 * MIN);
        let d = r.decisions.iter().find(|d| d.recipient == "s0").unwrap();
        // s2 is short at a higher priority itself; s1 only at a lower one.
        assert_eq!(
            (d.kind, d.donor.as_str(), d.priority),
            (TransferKind::Drain, "s1", 2000)
        );
        // Below the threshold nothing is drained.
        let shards = [shard("s0", &[], vec![need("gpu", 999)]), busy];
        let r = run(&p, &shards, &[], &[], 10 * MIN);
        assert!(r.decisions.is_empty());
    }

    #[test]
    fn views_cap_free_by_the_free_total_and_read_the_type() {
        let summary = pb::ShardSummary {
            total_machines: 10,
            free_machines: 3,
            per_instance_type_counts: [("a".to_owned(), 8), ("b".to_owned(), 2)].into(),
            ..Default::default()
        };
        let v = view_of(
            "s1",
            Some(&summary),
            &[Shortage {
                instance_type: "a".into(),
                priority: 5,
                age_cycles: 4,
                selector: "*/a".into(),
            }],
            &BTreeMap::new(),
        );
        assert_eq!(
            v.free_by_type,
            [("a".to_owned(), 3), ("b".to_owned(), 2)].into()
        );
        assert_eq!(v.total("a"), 8);
        assert_eq!(v.needs[0].persisted_for, Duration::ZERO);
        let req = |key: &str, op: Operator| pb::NodeSelectorRequirement {
            key: key.into(),
            operator: op as i32,
            values: vec!["m5".into(), "m6".into()],
        };
        assert_eq!(
            instance_type_of(&[
                req("zone", Operator::In),
                req(INSTANCE_TYPE_LABEL, Operator::In)
            ]),
            "m5"
        );
        assert_eq!(
            instance_type_of(&[req(INSTANCE_TYPE_LABEL, Operator::NotIn)]),
            ""
        );
    }

    #[test]
    fn persistence_restarts_when_a_need_clears() {
        let mut p = Persistence::default();
        let k = ("s0".to_owned(), "gpu".to_owned());
        p.observe([k.clone()], 0);
        assert_eq!(p.observe([k.clone()], 5)[&k], Duration::from_nanos(5));
        p.observe([], 6);
        assert_eq!(p.observe([k.clone()], 7)[&k], Duration::ZERO);
    }

    fn arb_shards() -> impl Strategy<Value = Vec<ShardView>> {
        let types = prop::sample::select(vec!["", "a", "b"]);
        let one = (
            prop::collection::btree_map(prop::sample::select(vec!["a", "b"]), 0u32..4, 0..3),
            prop::collection::vec((types, 0i32..3000, 0i32..8, 0u64..200), 0..4),
        );
        prop::collection::vec(one, 1..5).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (free, needs))| ShardView {
                    shard: format!("s{i}"),
                    free_by_type: free.iter().map(|(t, n)| ((*t).to_owned(), *n)).collect(),
                    total_by_type: free.iter().map(|(t, n)| ((*t).to_owned(), n + 2)).collect(),
                    needs: needs
                        .into_iter()
                        .map(|(t, priority, age_cycles, secs)| Need {
                            instance_type: t.to_owned(),
                            priority,
                            age_cycles,
                            persisted_for: Duration::from_secs(secs),
                            selector: String::new(),
                        })
                        .collect(),
                })
                .collect()
        })
    }

    fn arb_policy() -> impl Strategy<Value = Policy> {
        (1usize..3, 1usize..5, 1u32..4, 0i32..3000).prop_map(|(pair, window, machines, drain)| {
            Policy {
                min_age_cycles: 2,
                min_persist: Duration::from_secs(30),
                max_in_flight_per_pair: pair,
                max_per_window: window,
                window: Duration::from_secs(600),
                cooldown: Duration::from_secs(600),
                drain_min_priority: drain,
                max_machines_per_transfer: machines,
                settle: Duration::from_secs(60),
            }
        })
    }

    proptest! {
        /// Rounds of decide-then-mark-in-flight: the invariants hold in every round.
        #[test]
        fn rounds_respect_every_invariant(
            shards in arb_shards(),
            policy in arb_policy(),
            rounds in 1usize..5,
        ) {
            let mut active: Vec<Transfer> = Vec::new();
            let mut now = 100 * MIN;
            for round in 0..rounds {
                let before = active.clone();
                let r = run(&policy, &shards, &active, &[], now);
                // Rate limit: starts in the window never exceed the budget.
                prop_assert!(before.len() + r.decisions.len() <= policy.max_per_window.max(before.len()));
                for (i, d) in r.decisions.iter().enumerate() {
                    prop_assert_ne!(&d.donor, &d.recipient);
                    prop_assert!(d.count >= 1 && d.count <= policy.max_machines_per_transfer);
                    // One release token per machine asked for.
                    prop_assert_eq!(d.selectors.len(), d.count as usize);
                    // A deficit already being met is never decided again.
                    prop_assert!(!before.iter().any(|t| t.recipient == d.recipient && t.instance_type == d.instance_type));
                    active.push(in_flight(d, &format!("r{round}-{i}"), now));
                }
                // Never both directions between a pair; per-pair cap.
                for t in &active {
                    prop_assert!(!active.iter().any(|o| o.donor == t.recipient && o.recipient == t.donor));
                    let same = active.iter().filter(|o| o.donor == t.donor && o.recipient == t.recipient).count();
                    prop_assert!(same <= policy.max_in_flight_per_pair);
                }
                // Never promises more free machines than a donor reported.
                for s in &shards {
                    for (t, free) in &s.free_by_type {
                        let promised_of_type: u32 = active
                            .iter()
                            .filter(|a| a.donor == s.shard && a.kind != TransferKind::Drain && a.instance_type == *t)
                            .map(|a| a.count)
                            .sum();
                        prop_assert!(promised_of_type <= *free, "{} promised {} of {} free {}", s.shard, promised_of_type, t, free);
                    }
                }
                now += MIN;
            }
        }

        /// Deterministic: the same inputs give the same decisions.
        #[test]
        fn decisions_are_deterministic(shards in arb_shards(), policy in arb_policy()) {
            let a = run(&policy, &shards, &[], &[], 100 * MIN);
            let b = run(&policy, &shards, &[], &[], 100 * MIN);
            prop_assert_eq!(a, b);
        }
    }
}
