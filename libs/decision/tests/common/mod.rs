//! Builders shared by the engine's integration tests.

use bigfleet_decision::{CycleInput, CycleOptions, CycleOutput, run_cycle};
use bigfleet_model::{
    Action, ActionKind, CapacityType, Host, INSTANCE_TYPE_KEY, Machine, MachineState, Need,
    Operator, PenaltyBucket, Profile, Requirement, ResourceVector, TopologySpread,
    WhenUnsatisfiable, ZONE_KEY,
};
use std::sync::Arc;

pub const GPU: &str = "nvidia.com/gpu";

/// Parses `[("cpu","16"), ("memory","64Gi")]`.
pub fn res(pairs: &[(&str, &str)]) -> ResourceVector {
    ResourceVector::parse(pairs.iter().copied()).expect("valid quantities")
}

/// `n` whole units of one resource.
pub fn units(name: &str, n: i64) -> ResourceVector {
    ResourceVector::from_milli([(name, n * 1000)])
}

pub struct M(pub Machine);

pub fn machine(id: &str, state: MachineState) -> M {
    let needs_host = matches!(
        state,
        MachineState::Idle
            | MachineState::Configuring
            | MachineState::Configured
            | MachineState::Draining
            | MachineState::Deleting
    );
    M(Machine {
        id: id.to_owned(),
        state,
        host: if needs_host {
            Host {
                provider: "fake".into(),
                reference: format!("host-{id}"),
            }
        } else {
            Host::default()
        },
        profile: bigfleet_model::MachineProfile {
            instance_type: "t1".into(),
            zone: "zone-a".into(),
            capacity_type: CapacityType::OnDemand,
            resources: units("cpu", 1),
            ..Default::default()
        },
        ..Default::default()
    })
}

impl M {
    pub fn itype(mut self, t: &str) -> Self {
        self.0.profile.instance_type = t.into();
        self
    }
    pub fn zone(mut self, z: &str) -> Self {
        self.0.profile.zone = z.into();
        self
    }
    pub fn price(mut self, p: f64) -> Self {
        self.0.price_per_hour = p;
        self
    }
    pub fn prob(mut self, p: f64) -> Self {
        self.0.interruption_probability = p;
        self
    }
    pub fn cap(mut self, c: CapacityType) -> Self {
        self.0.profile.capacity_type = c;
        self
    }
    pub fn res(mut self, r: ResourceVector) -> Self {
        self.0.profile.resources = r;
        self
    }
    pub fn alloc(mut self, r: ResourceVector) -> Self {
        self.0.allocatable = r;
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0.profile.labels.insert(k.into(), v.into());
        self
    }
    pub fn cluster(mut self, c: &str) -> Self {
        self.0.cluster = c.into();
        self
    }
    pub fn prio(mut self, p: i32) -> Self {
        self.0.assigned_priority = p;
        self
    }
    pub fn penalties(mut self, ip: f64, rp: f64) -> Self {
        self.0.assigned_interruption_penalty_dollars = ip;
        self.0.assigned_reclamation_penalty_dollars = rp;
        self
    }
    /// Stamps the need this machine serves (fingerprint, group, priority, dollars).
    pub fn serving(mut self, n: &Need) -> Self {
        self.0.assigned_need_fingerprint = n.fingerprint().to_owned();
        self.0.assigned_group = n.group.clone();
        self.0.assigned_priority = n.priority();
        self.0.assigned_interruption_penalty_dollars = n.profile.interruption_penalty_dollars();
        self.0.assigned_reclamation_penalty_dollars = n.profile.reclamation_penalty_dollars();
        self
    }
    pub fn stamp(mut self, fp: &str, group: &str) -> Self {
        self.0.assigned_need_fingerprint = fp.into();
        self.0.assigned_group = group.into();
        self
    }
    pub fn build(self) -> Machine {
        self.0
    }
}

pub fn req(key: &str, op: Operator, vals: &[&str]) -> Requirement {
    Requirement::new(key, op, vals.iter().copied())
}

pub fn pin(t: &str) -> Requirement {
    req(INSTANCE_TYPE_KEY, Operator::In, &[t])
}

pub fn same_zone() -> Requirement {
    req(ZONE_KEY, Operator::Same, &[])
}

/// A Same(zone) gang: a need for `agg` in `cluster`, in `group`, whose machines share a zone.
pub fn same_zone_gang(cluster: &str, agg: ResourceVector, group: &str) -> N {
    need(cluster, agg).req(same_zone()).group(group)
}

pub struct N {
    pub cluster: String,
    pub reqs: Vec<Requirement>,
    pub spread: Vec<TopologySpread>,
    pub prio: i32,
    pub ipb: PenaltyBucket,
    pub rpb: PenaltyBucket,
    pub agg: ResourceVector,
    pub mu: ResourceVector,
    pub group: String,
    pub arrival: i64,
    pub parked: bool,
}

/// A need for `agg` in `cluster`, no requirements, priority 0, buckets Zero.
pub fn need(cluster: &str, agg: ResourceVector) -> N {
    N {
        cluster: cluster.into(),
        reqs: Vec::new(),
        spread: Vec::new(),
        prio: 0,
        ipb: PenaltyBucket::Zero,
        rpb: PenaltyBucket::Zero,
        agg,
        mu: ResourceVector::new(),
        group: String::new(),
        arrival: 0,
        parked: false,
    }
}

impl N {
    pub fn req(mut self, r: Requirement) -> Self {
        self.reqs.push(r);
        self
    }
    pub fn prio(mut self, p: i32) -> Self {
        self.prio = p;
        self
    }
    pub fn ipb(mut self, b: PenaltyBucket) -> Self {
        self.ipb = b;
        self
    }
    pub fn rpb(mut self, b: PenaltyBucket) -> Self {
        self.rpb = b;
        self
    }
    pub fn mu(mut self, m: ResourceVector) -> Self {
        self.mu = m;
        self
    }
    pub fn group(mut self, g: &str) -> Self {
        self.group = g.into();
        self
    }
    pub fn arrival(mut self, a: i64) -> Self {
        self.arrival = a;
        self
    }
    pub fn parked(mut self) -> Self {
        self.parked = true;
        self
    }
    pub fn spread(mut self, key: &str, skew: i32, mode: WhenUnsatisfiable) -> Self {
        self.spread.push(TopologySpread {
            topology_key: key.into(),
            max_skew: skew,
            when_unsatisfiable: mode,
        });
        self
    }
    pub fn profile(&self) -> Arc<Profile> {
        Arc::new(Profile::new(
            self.reqs.clone(),
            self.spread.clone(),
            self.prio,
            self.ipb,
            self.rpb,
        ))
    }
    pub fn build(self) -> Need {
        let profile = self.profile();
        Need {
            cluster: self.cluster,
            profile,
            aggregate_resources: self.agg,
            min_unit: self.mu,
            arrival_unix_nanos: self.arrival,
            group: self.group,
            acquisition_parked: self.parked,
        }
    }
}

pub fn run(machines: &[Machine], demand: &[Need]) -> CycleOutput {
    run_with(CycleInput::new(machines, demand), &CycleOptions::default())
}

pub fn run_verdicts(machines: &[Machine], demand: &[Need]) -> CycleOutput {
    run_with(
        CycleInput::new(machines, demand),
        &CycleOptions {
            verdicts: true,
            ..CycleOptions::default()
        },
    )
}

pub fn run_with(input: CycleInput<'_>, opts: &CycleOptions) -> CycleOutput {
    for m in input.machines {
        m.invariant()
            .expect("test machines must satisfy the invariant");
    }
    run_cycle(&input, opts).expect("cycle runs")
}

/// Machine ids of the actions of one kind, in emission order.
pub fn ids(out: &CycleOutput, kind: ActionKind) -> Vec<String> {
    out.actions
        .iter()
        .filter(|a| a.kind() == kind)
        .map(|a| a.machine_id().to_owned())
        .collect()
}

/// Sorted ids of the actions of one kind.
pub fn id_set(out: &CycleOutput, kind: ActionKind) -> Vec<String> {
    let mut v = ids(out, kind);
    v.sort();
    v
}

pub fn actions_of(out: &CycleOutput, kind: ActionKind) -> Vec<&Action> {
    out.actions.iter().filter(|a| a.kind() == kind).collect()
}

/// `n` machines `prefix-0..n` in one state built by `f`.
pub fn fleet(prefix: &str, n: usize, state: MachineState, f: impl Fn(M) -> M) -> Vec<Machine> {
    (0..n)
        .map(|i| f(machine(&format!("{prefix}-{i}"), state)).build())
        .collect()
}
