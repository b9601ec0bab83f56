//! Synthetic fleets and demand for the cycle benchmark (`cycle-bench`) and for
//! tests. Deterministic for a seed; machines come out sorted by id, as the
//! shard's inventory hands them over.
//!
//! Rungs (the shapes of the original's scale ladder, whose timings `docs/benchmarks.md`
//! compares against):
//!
//! - `aggregated-500k`: 500,000 machines, 50 clusters, 16 needs per cluster
//!   (800). 10% Configured (1,000 per cluster, one block per need, stamped),
//!   20% Idle (on-demand inside their 10 min hold, or bare metal), 70%
//!   Speculative, over 8 instance types and 3 zones. Each need is pinned to one
//!   type; ~4% of needs are short by 1–3 machines (Bootstraps), ~2% have one
//!   machine too many (Reclaims).
//! - `reprovision-1to1`: 500,000 machines, 50 clusters, 16 needs per cluster;
//!   97% Configured, 3% Idle; demand ≈ inventory: a quarter of the needs are
//!   short by about the whole Idle pool (≈15K Bootstraps per cycle), 10% have
//!   ~2% excess (Reclaims), and 2% are high-priority needs short beyond the Idle
//!   pool (Phase 2 preempts lower-priority machines).
//! - `uber-5k`: 20 clusters × 388 needs (7,760), 93% Same gangs: ~75%
//!   sub-machine co-location gangs (Same(rack), 2–10 pods of 1 cpu/4Gi; folded
//!   by NormalizeDemand), ~18% GPU gangs of 2–4 eight-GPU machines
//!   (Same(rack), pinned), 7% plain needs; bound supply in racks of 40, each
//!   gang's machines stamped with its (fingerprint, group), plus a 700-machine
//!   racked free pool; ~6.1K machines. The fleet is then *settled* (engine
//!   cycles with every action applied instantly until quiet) and *churned*
//!   (2% of needs replaced by new gangs), so each timed cycle is a steady-state
//!   cycle with churn (~60 actions).
//! - `uber-50k`: the same mix at 200 clusters × 213 needs (42,600) with a
//!   194,000-machine racked free pool (25K Idle + 169K Speculative): ~225K
//!   machines, settled and churned the same way (~230 actions per cycle).

use crate::CycleInput;
use bigfleet_model::{
    CapacityType, Host, INSTANCE_TYPE_KEY, Machine, MachineProfile, MachineState, Need, Operator,
    PenaltyBucket, Profile, Requirement, ResourceVector, ZONE_KEY, snapshot_order,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The rung names `cycle-bench` accepts.
pub const RUNGS: [&str; 4] = ["aggregated-500k", "reprovision-1to1", "uber-5k", "uber-50k"];

const MINUTE: i64 = 60_000_000_000;
const NOW: i64 = 1_800_000_000 * 1_000_000_000;

/// One generated inventory + demand.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub machines: Vec<Machine>,
    pub idle_since: Vec<Option<i64>>,
    pub demand: Vec<Need>,
    pub now_unix_nanos: i64,
    pub clusters: usize,
}

impl Scenario {
    /// The cycle input over this scenario's machine slice (every cluster ready).
    pub fn input(&self) -> CycleInput<'_> {
        CycleInput {
            idle_since: &self.idle_since,
            now_unix_nanos: self.now_unix_nanos,
            ..CycleInput::new(&self.machines, &self.demand)
        }
    }

    /// The scenario's inventory as a fleet (what a shard maintains incrementally).
    pub fn fleet(&self) -> Result<crate::Fleet, crate::EngineError> {
        crate::Fleet::from_machines(&self.machines, &self.idle_since)
    }

    /// The cycle input over a fleet of this scenario.
    pub fn fleet_input<'f>(&'f self, fleet: &'f crate::Fleet) -> CycleInput<'f> {
        CycleInput {
            now_unix_nanos: self.now_unix_nanos,
            ..CycleInput::with_fleet(fleet, &self.demand)
        }
    }
}

/// A named rung, or `None`.
pub fn rung(name: &str) -> Option<Scenario> {
    Some(match name {
        "aggregated-500k" => aggregated(500_000, 50, 16, 1),
        "reprovision-1to1" => reprovision(500_000, 50, 16, 2),
        "uber-5k" => {
            let mut s = realistic("uber-5k", 20, 388, 400, 300, 3);
            settle(&mut s, 6);
            churn(&mut s, 0.02, 13);
            s
        }
        "uber-50k" => {
            let mut s = realistic("uber-50k", 200, 213, 25_000, 169_000, 4);
            settle(&mut s, 6);
            churn(&mut s, 0.02, 14);
            s
        }
        _ => return None,
    })
}

/// Applies one action the way a shard with an instant provider would (a new host is
/// `<provider>/h-<id>`); the machine's new idle-since stamp when it became Idle.
pub fn apply_instantly(
    m: &mut Machine,
    a: &bigfleet_model::Action,
    now: i64,
    provider: &str,
) -> Option<i64> {
    use bigfleet_model::Action;
    match a {
        Action::Bootstrap {
            cluster,
            assignment,
            ..
        }
        | Action::Provision {
            cluster,
            assignment,
            ..
        } => {
            if m.host.is_empty() {
                m.host = Host {
                    provider: provider.into(),
                    reference: format!("h-{}", m.id),
                };
            }
            m.state = MachineState::Configured;
            m.cluster = cluster.clone();
            m.assigned_priority = assignment.priority;
            m.assigned_interruption_penalty_dollars = assignment.interruption_penalty_dollars;
            m.assigned_reclamation_penalty_dollars = assignment.reclamation_penalty_dollars;
            m.assigned_need_fingerprint = assignment.need_fingerprint.clone();
            m.assigned_group = assignment.group.clone();
            None
        }
        Action::Reclaim { .. } | Action::Preempt { .. } => {
            m.state = MachineState::Idle;
            m.clear_assignment();
            Some(now)
        }
        Action::Release { .. } => {
            m.state = MachineState::Speculative;
            m.host = Host::default();
            None
        }
    }
}

/// Runs up to `cycles` engine cycles over the scenario, applying every action
/// instantly (a shard with an instant provider), to reach a steady state.
pub fn settle(s: &mut Scenario, cycles: usize) {
    let index: std::collections::HashMap<String, usize> = s
        .machines
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.clone(), i))
        .collect();
    let opts = crate::CycleOptions {
        threads: 0,
        ..crate::CycleOptions::default()
    };
    for _ in 0..cycles {
        let out = match crate::run_cycle(&s.input(), &opts) {
            Ok(o) => o,
            Err(_) => return,
        };
        if out.actions.is_empty() {
            return;
        }
        for a in &out.actions {
            let i = index[a.machine_id()];
            let stamp = apply_instantly(&mut s.machines[i], a, s.now_unix_nanos, "synth");
            s.idle_since[i] = match s.machines[i].state {
                MachineState::Idle => stamp.or(s.idle_since[i]),
                _ => None,
            };
        }
    }
}

/// Steady-state churn: a fraction of the needs go away (their machines become
/// excess) and as many new ones arrive (copies of existing needs under a new
/// group, so they must acquire).
pub fn churn(s: &mut Scenario, fraction: f64, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut kept = Vec::with_capacity(s.demand.len());
    let mut added = Vec::new();
    for n in s.demand.drain(..) {
        if rng.chance(fraction) {
            let mut fresh = n.clone();
            fresh.group = format!("{}-new", n.group);
            fresh.arrival_unix_nanos = NOW;
            added.push(fresh);
        } else {
            kept.push(n);
        }
    }
    kept.extend(added);
    kept.sort_by(snapshot_order);
    s.demand = kept;
}

/// The synthetic fleets' generator, seeded with [`bigfleet_model::SplitMix64::new`].
pub use bigfleet_model::SplitMix64 as Rng;

#[derive(Debug, Clone)]
struct Kind {
    name: &'static str,
    cpu: i64,
    mem_gi: i64,
    gpu: i64,
    price: f64,
    prob: f64,
    cap: CapacityType,
}

impl Kind {
    fn resources(&self) -> ResourceVector {
        let mut v = vec![
            ("cpu", self.cpu * 1000),
            ("memory", self.mem_gi * (1 << 30) * 1000),
        ];
        if self.gpu > 0 {
            v.push(("nvidia.com/gpu", self.gpu * 1000));
        }
        ResourceVector::from_milli(v)
    }
}

const fn kind(
    name: &'static str,
    cpu: i64,
    mem_gi: i64,
    gpu: i64,
    price: f64,
    prob: f64,
    cap: CapacityType,
) -> Kind {
    Kind {
        name,
        cpu,
        mem_gi,
        gpu,
        price,
        prob,
        cap,
    }
}

const AGG_KINDS: [Kind; 8] = [
    kind("gp1-xs", 4, 16, 0, 0.10, 0.0, CapacityType::OnDemand),
    kind("gp1-s", 8, 32, 0, 0.20, 0.0, CapacityType::OnDemand),
    kind("gp1-m", 16, 64, 0, 0.40, 0.0, CapacityType::OnDemand),
    kind("gp1-l", 32, 128, 0, 0.80, 0.0, CapacityType::OnDemand),
    kind("gp1-xl", 48, 256, 0, 1.20, 0.0, CapacityType::OnDemand),
    kind("pro2-s", 16, 64, 0, 0.35, 0.05, CapacityType::Spot),
    kind("pro2-m", 32, 128, 0, 0.70, 0.05, CapacityType::Spot),
    kind("elm-gpu", 8, 64, 1, 1.50, 0.0, CapacityType::BareMetal),
];

fn machine(id: usize, state: MachineState, k: &Kind, zone: &str, rack: Option<&str>) -> Machine {
    let host = matches!(
        state,
        MachineState::Idle | MachineState::Configuring | MachineState::Configured
    )
    .then(|| Host {
        provider: "synth".into(),
        reference: format!("h{id:07}"),
    })
    .unwrap_or_default();
    let mut labels = BTreeMap::new();
    if let Some(r) = rack {
        labels.insert("rack".to_owned(), r.to_owned());
    }
    Machine {
        id: format!("m{id:07}"),
        state,
        host,
        profile: MachineProfile {
            instance_type: k.name.to_owned(),
            zone: zone.to_owned(),
            capacity_type: k.cap,
            resources: k.resources(),
            labels,
        },
        price_per_hour: k.price,
        interruption_probability: k.prob,
        ..Machine::default()
    }
}

fn bind(m: &mut Machine, cluster: &str, need: &Need) {
    m.cluster = cluster.to_owned();
    m.assigned_priority = need.priority();
    m.assigned_interruption_penalty_dollars = need.profile.interruption_penalty_dollars();
    m.assigned_reclamation_penalty_dollars = need.profile.reclamation_penalty_dollars();
    m.assigned_need_fingerprint = need.fingerprint().to_owned();
    m.assigned_group = need.group.clone();
}

fn pin(t: &str) -> Requirement {
    Requirement::new(INSTANCE_TYPE_KEY, Operator::In, [t])
}

fn finish(
    name: &str,
    mut machines: Vec<Machine>,
    mut demand: Vec<Need>,
    clusters: usize,
) -> Scenario {
    // Ids are assigned in generation order; make the id order random-ish with
    // respect to type and cluster by shuffling the numbering, then sort.
    machines.sort_by(|a, b| a.id.cmp(&b.id));
    let idle_since = machines
        .iter()
        .map(|m| (m.state == MachineState::Idle).then_some(NOW - MINUTE / 2))
        .collect();
    demand.sort_by(snapshot_order);
    Scenario {
        name: name.to_owned(),
        machines,
        idle_since,
        demand,
        now_unix_nanos: NOW,
        clusters,
    }
}

/// Permuted machine numbering so ids do not follow generation order.
struct Ids {
    perm_mul: usize,
    n: usize,
    next: usize,
}

impl Ids {
    fn new(n: usize) -> Ids {
        // An odd multiplier coprime with n gives a permutation of 0..n.
        let mut m = 7_919;
        while gcd(m, n.max(1)) != 1 {
            m += 2;
        }
        Ids {
            perm_mul: m,
            n: n.max(1),
            next: 0,
        }
    }
    fn take(&mut self) -> usize {
        let id = (self.next * self.perm_mul) % self.n;
        self.next += 1;
        id
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The aggregated regime: few needs per cluster, pinned instance types.
pub fn aggregated(total: usize, clusters: usize, needs_per_cluster: usize, seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let mut ids = Ids::new(total);
    let zones = ["fr-par-1", "fr-par-2", "nl-ams-1"];
    let bound_per_cluster = total / 10 / clusters;
    let per_need = (bound_per_cluster / needs_per_cluster).max(1);
    let mut machines = Vec::with_capacity(total);
    let mut demand = Vec::new();
    for c in 0..clusters {
        let cluster = format!("cluster-{c:03}");
        for k in 0..needs_per_cluster {
            let kd = &AGG_KINDS[(c + k) % AGG_KINDS.len()];
            let prio = [100, 1000][k % 2];
            let ipb = [PenaltyBucket::B1, PenaltyBucket::B4][(k / 2) % 2];
            let profile = Arc::new(Profile::new(
                vec![pin(kd.name)],
                vec![],
                prio,
                ipb,
                PenaltyBucket::B2,
            ));
            let mut want = per_need as i64;
            if rng.chance(0.04) {
                want += 1 + rng.below(3) as i64;
            } else if rng.chance(0.02) {
                want -= 1;
            }
            let mut n = Need::new(cluster.clone(), profile);
            n.aggregate_resources = kd.resources().scale(want);
            n.min_unit = ResourceVector::from_milli([("cpu", 1000), ("memory", 2i64 << 30)]);
            n.arrival_unix_nanos = NOW - (c * 1000 + k) as i64 * MINUTE;
            for _ in 0..per_need {
                let id = ids.take();
                let mut m = machine(id, MachineState::Configured, kd, zones[id % 3], None);
                bind(&mut m, &cluster, &n);
                machines.push(m);
            }
            demand.push(n);
        }
    }
    while machines.len() < total {
        let id = ids.take();
        let kd = &AGG_KINDS[rng.below(AGG_KINDS.len())];
        let state = if rng.chance(2.0 / 9.0) {
            MachineState::Idle
        } else {
            MachineState::Speculative
        };
        machines.push(machine(id, state, kd, zones[id % 3], None));
    }
    finish("aggregated-500k", machines, demand, clusters)
}

/// The reprovision regime: demand ≈ inventory, heavy churn every cycle.
pub fn reprovision(total: usize, clusters: usize, needs_per_cluster: usize, seed: u64) -> Scenario {
    let mut rng = Rng::new(seed);
    let mut ids = Ids::new(total);
    let zones = ["fr-par-1", "fr-par-2", "nl-ams-1"];
    let idle = total * 3 / 100;
    let bound_per_cluster = (total - idle) / clusters;
    let per_need = bound_per_cluster / needs_per_cluster;
    let n_needs = clusters * needs_per_cluster;
    // A quarter of the needs share the Idle pool as their deficit.
    let short_needs = n_needs / 4;
    let short_each = (idle / short_needs.max(1)) as i64;
    let mut machines = Vec::with_capacity(total);
    let mut demand = Vec::new();
    for c in 0..clusters {
        let cluster = format!("cluster-{c:03}");
        for k in 0..needs_per_cluster {
            let kd = &AGG_KINDS[(c * 3 + k) % AGG_KINDS.len()];
            let prio = [100, 1000, 10_000, 100_000][(c + k) % 4];
            let profile = Arc::new(Profile::new(
                vec![pin(kd.name)],
                vec![],
                prio,
                PenaltyBucket::B4,
                PenaltyBucket::B2,
            ));
            let mut want = per_need as i64;
            let roll = rng.below(100);
            if roll < 25 {
                want += short_each;
            } else if roll < 35 {
                want -= (per_need as i64 / 50).max(1);
            } else if roll < 37 {
                // High priority, short beyond what Idle can give: preempts.
                want += short_each + 20;
            }
            let mut n = Need::new(cluster.clone(), profile);
            n.aggregate_resources = kd.resources().scale(want);
            n.min_unit = ResourceVector::from_milli([("cpu", 1000)]);
            n.arrival_unix_nanos = NOW - (c * 1000 + k) as i64 * MINUTE;
            for _ in 0..per_need {
                let id = ids.take();
                let mut m = machine(id, MachineState::Configured, kd, zones[id % 3], None);
                bind(&mut m, &cluster, &n);
                // Older assignments carry lower stamped priorities (victims).
                if rng.chance(0.1) {
                    m.assigned_priority = 10;
                }
                machines.push(m);
            }
            if (35..37).contains(&roll) {
                n.profile = Arc::new(Profile::new(
                    vec![pin(kd.name)],
                    vec![],
                    1_000_000,
                    PenaltyBucket::B4,
                    PenaltyBucket::B2,
                ));
            }
            demand.push(n);
        }
    }
    while machines.len() < total {
        let id = ids.take();
        let kd = &AGG_KINDS[rng.below(AGG_KINDS.len())];
        machines.push(machine(id, MachineState::Idle, kd, zones[id % 3], None));
    }
    finish("reprovision-1to1", machines, demand, clusters)
}

const CPU96: Kind = kind("cpu-96", 96, 384, 0, 3.0, 0.0, CapacityType::OnDemand);
const GPU8: Kind = kind("gpu-8x", 96, 1024, 8, 24.0, 0.0, CapacityType::BareMetal);
const RACK: usize = 40;

/// The realistic catalog: many needs per cluster, 93% Same co-location gangs.
pub fn realistic(
    name: &str,
    clusters: usize,
    needs_per_cluster: usize,
    free_idle: usize,
    free_spec: usize,
    seed: u64,
) -> Scenario {
    let mut rng = Rng::new(seed);
    let zones = ["zone-a", "zone-b", "zone-c"];
    let plain = (needs_per_cluster * 7).div_ceil(100);
    let gpu_gangs = needs_per_cluster * 18 / 100;
    let sub_gangs = needs_per_cluster - plain - gpu_gangs;
    // Generate per-cluster layouts first (ids assigned at the end).
    let mut machines: Vec<Machine> = Vec::new();
    let mut demand = Vec::new();
    let mut rack_no = 0usize;
    let mut next_rack = |rng: &mut Rng| {
        rack_no += 1;
        let _ = rng;
        (format!("rack-{rack_no:05}"), zones[rack_no % 3])
    };
    let pod_mu = ResourceVector::from_milli([("cpu", 1000), ("memory", 4i64 << 30)]);
    let prios = [1_000, 5_000, 10_000, 50_000];
    for c in 0..clusters {
        let cluster = format!("cluster-{c:03}");
        // GPU gangs: each in one rack of this cluster's GPU racks.
        let (mut rack, mut zone) = next_rack(&mut rng);
        let mut in_rack = 0;
        for g in 0..gpu_gangs {
            let size = 2 + rng.below(3) as i64;
            let prio = prios[rng.below(prios.len())];
            let profile = Arc::new(Profile::new(
                vec![
                    pin(GPU8.name),
                    Requirement::new("rack", Operator::Same, Vec::<String>::new()),
                ],
                vec![],
                prio,
                PenaltyBucket::B1024,
                PenaltyBucket::B256,
            ));
            let mut n = Need::new(cluster.clone(), profile);
            n.aggregate_resources = ResourceVector::from_milli([("nvidia.com/gpu", size * 8000)]);
            n.min_unit = ResourceVector::from_milli([("nvidia.com/gpu", 8000)]);
            n.group = format!("{cluster}/job-{g:04}");
            n.arrival_unix_nanos = NOW - rng.below(10_000) as i64 * MINUTE;
            if !rng.chance(0.03) {
                if in_rack + size as usize > RACK {
                    (rack, zone) = next_rack(&mut rng);
                    in_rack = 0;
                }
                for _ in 0..size {
                    let mut m = machine(0, MachineState::Configured, &GPU8, zone, Some(&rack));
                    bind(&mut m, &cluster, &n);
                    machines.push(m);
                    in_rack += 1;
                }
            }
            demand.push(n);
        }
        // Sub-machine gangs and plain needs share the cluster's CPU machines.
        let mut cpu_milli = 0i64;
        let sub_prio = |rng: &mut Rng| prios[rng.below(2)];
        for g in 0..sub_gangs {
            let pods = 2 + rng.below(9) as i64;
            let profile = Arc::new(Profile::new(
                vec![
                    pin(CPU96.name),
                    Requirement::new("rack", Operator::Same, Vec::<String>::new()),
                ],
                vec![],
                sub_prio(&mut rng),
                PenaltyBucket::B16,
                PenaltyBucket::B16,
            ));
            let mut n = Need::new(cluster.clone(), profile);
            n.aggregate_resources = pod_mu.scale(pods);
            n.min_unit = pod_mu.clone();
            n.group = format!("{cluster}/svc-{g:04}");
            n.arrival_unix_nanos = NOW - rng.below(10_000) as i64 * MINUTE;
            cpu_milli += pods * 1000;
            demand.push(n);
        }
        for k in 0..plain {
            let profile = Arc::new(Profile::new(
                vec![
                    pin(CPU96.name),
                    Requirement::new(ZONE_KEY, Operator::NotIn, ["zone-x"]),
                ],
                vec![],
                prios[k % 2],
                PenaltyBucket::B4,
                PenaltyBucket::B4,
            ));
            let pods = 4 + rng.below(28) as i64;
            let mut n = Need::new(cluster.clone(), profile);
            n.aggregate_resources = pod_mu.scale(pods);
            n.min_unit = pod_mu.clone();
            n.arrival_unix_nanos = NOW - rng.below(10_000) as i64 * MINUTE;
            cpu_milli += pods * 1000;
            demand.push(n);
        }
        // Enough CPU machines for the cluster's CPU demand, in its own racks:
        // every folded class and plain need holds at least one whole machine.
        let cpu_machines = (cpu_milli / (CPU96.cpu * 1000)) as usize + plain + 20;
        let (crack, czone) = next_rack(&mut rng);
        for _ in 0..cpu_machines {
            let mut m = machine(0, MachineState::Configured, &CPU96, czone, Some(&crack));
            m.cluster = cluster.clone();
            m.assigned_priority = prios[0];
            machines.push(m);
        }
    }
    // The shard-wide free pool, racked.
    for (state, count) in [
        (MachineState::Idle, free_idle),
        (MachineState::Speculative, free_spec),
    ] {
        let (mut rack, mut zone) = next_rack(&mut rng);
        for i in 0..count {
            if i > 0 && i % RACK == 0 {
                (rack, zone) = next_rack(&mut rng);
            }
            let k = if rng.chance(0.8) { &GPU8 } else { &CPU96 };
            machines.push(machine(0, state, k, zone, Some(&rack)));
        }
    }
    let mut ids = Ids::new(machines.len());
    for m in &mut machines {
        let id = ids.take();
        m.id = format!("m{id:07}");
        if !m.host.is_empty() {
            m.host.reference = format!("h{id:07}");
        }
    }
    finish(name, machines, demand, clusters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_scenarios_are_valid_and_deterministic() {
        for s in [
            aggregated(2_000, 4, 4, 1),
            reprovision(2_000, 4, 4, 2),
            realistic("r", 3, 40, 50, 50, 3),
        ] {
            for m in &s.machines {
                m.invariant().unwrap();
            }
            assert!(s.machines.windows(2).all(|w| w[0].id < w[1].id));
            assert_eq!(s.idle_since.len(), s.machines.len());
            assert!(!s.demand.is_empty());
        }
        let a = realistic("r", 3, 40, 50, 50, 3);
        let b = realistic("r", 3, 40, 50, 50, 3);
        assert_eq!(a.machines, b.machines);
        assert_eq!(a.demand, b.demand);
    }
}

/// One benchmark run over a scenario.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchResult {
    pub rung: String,
    pub machines: usize,
    pub needs: usize,
    pub clusters: usize,
    pub cycles: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// One plain pass over the same inventory (the physical floor), best of the run.
    pub floor_ms: f64,
    pub snapshot_bytes_per_machine: f64,
    /// Actions of the last cycle.
    pub actions: usize,
    /// Counters of the last cycle.
    pub stats: crate::CycleStats,
    /// Unmet needs of the last cycle by (Same?, reason), when verdicts ran.
    pub unmet: BTreeMap<String, usize>,
    /// One-time cost of building the fleet from the machine slice (not in the cycle).
    pub fleet_build_ms: f64,
}

/// The floor: touch every machine once (state, price, capacity) and nothing more.
pub fn plain_pass(machines: &[Machine]) -> (f64, usize) {
    let mut price = 0.0;
    let mut dims = 0usize;
    let mut states = [0usize; 9];
    for m in machines {
        price += m.price_per_hour;
        dims += m.effective_allocatable().len();
        states[m.state as usize] += 1;
    }
    (price, dims + states[MachineState::Idle as usize])
}

/// Machine `k` of a scenario as a churn step changes it: an Idle machine is
/// configured into a cluster, a bound one goes back to Idle (stamped now),
/// anything else moves to Idle too.
fn churned(s: &Scenario, k: usize) -> (Machine, Option<i64>) {
    let mut m = s.machines[k].clone();
    if m.state == MachineState::Idle {
        m.state = MachineState::Configured;
        m.cluster = format!("cluster-{:03}", k % s.clusters.max(1));
        m.assigned_priority = 100;
        (m, None)
    } else {
        m.state = MachineState::Idle;
        m.cluster.clear();
        m.assigned_priority = 0;
        m.assigned_need_fingerprint.clear();
        m.assigned_group.clear();
        (m, Some(s.now_unix_nanos))
    }
}

/// Runs `cycles` timed cycles (after two warm-up cycles) and one floor pass per cycle.
pub fn measure(
    s: &Scenario,
    cycles: usize,
    opts: &crate::CycleOptions,
    churn: usize,
) -> Result<BenchResult, crate::EngineError> {
    use std::time::Instant;
    let t = Instant::now();
    let mut fleet = s.fleet()?;
    let fleet_build_ms = t.elapsed().as_secs_f64() * 1e3;
    crate::run_cycle(&s.fleet_input(&fleet), opts)?;
    let mut last = crate::run_cycle(&s.fleet_input(&fleet), opts)?;
    let mut times = Vec::with_capacity(cycles);
    let mut floor = f64::INFINITY;
    let mut next = 0usize;
    let mut changed: Vec<usize> = Vec::new();
    for _ in 0..cycles.max(1) {
        // A shard's fleet changes between cycles (actions land, reconcile
        // updates): put back the machines changed last round and change
        // `churn` others, so every timed cycle sees 2 × churn replaced records.
        for k in changed.drain(..) {
            let stamp = s.idle_since.get(k).copied().flatten();
            fleet.upsert_with_idle_since(&s.machines[k], stamp);
        }
        for _ in 0..churn.min(s.machines.len()) {
            let k = next % s.machines.len();
            next += 1;
            let (m, stamp) = churned(s, k);
            fleet.upsert_with_idle_since(&m, stamp);
            changed.push(k);
        }
        let t = Instant::now();
        let out = crate::run_cycle(&s.fleet_input(&fleet), opts)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        last = out;
        let t = Instant::now();
        std::hint::black_box(plain_pass(std::hint::black_box(&s.machines)));
        floor = floor.min(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    let pct = |p: f64| times[((times.len() - 1) as f64 * p).round() as usize];
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    Ok(BenchResult {
        rung: s.name.clone(),
        machines: s.machines.len(),
        needs: s.demand.len(),
        clusters: s.clusters,
        cycles: times.len(),
        p50_ms: round(pct(0.50)),
        p99_ms: round(pct(0.99)),
        max_ms: round(times[times.len() - 1]),
        floor_ms: round(floor),
        snapshot_bytes_per_machine: round(
            last.stats.snapshot_bytes as f64 / s.machines.len().max(1) as f64,
        ),
        actions: last.actions.len(),
        stats: last.stats.clone(),
        unmet: last
            .verdicts
            .iter()
            .filter(|v| !v.satisfied)
            .fold(BTreeMap::new(), |mut m, v| {
                let same = match &v.source {
                    crate::VerdictSource::Demand(i) => {
                        s.demand[*i].profile.same_requirement().is_some()
                    }
                    crate::VerdictSource::Folded { .. } => false,
                };
                *m.entry(format!(
                    "{}/{:?}",
                    if same { "same" } else { "plain" },
                    v.unmet_reason
                ))
                .or_insert(0) += 1;
                m
            }),
        fleet_build_ms: round(fleet_build_ms),
    })
}
