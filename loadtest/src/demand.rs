//! Realistic demand for simulated operators: CPU services, GPU jobs and Same-rack gangs,
//! built as domain needs and converted with `bigfleet-conv` (the wire form the real
//! operator's aggregation produces: summed aggregate resources, max min-unit, one need per
//! gang with a `group` and an OPERATOR_SAME requirement).

use bigfleet_conv::Rollup;
use bigfleet_model::{Need, Operator, PenaltyBucket, Profile, Requirement, ResourceVector};
use bigfleet_proto::v1alpha1::ClusterCapacityNeeds;
use rand::Rng;
use rand::rngs::StdRng;

/// Label of a machine's rack (the fake provider's racked pools carry it).
pub const RACK_KEY: &str = "topology.bigfleet/rack";
/// Extended resource name of GPUs.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Label naming the GPU model.
pub const GPU_PRODUCT_KEY: &str = "nvidia.com/gpu.product";

const GIB_MILLI: i64 = 1024 * 1024 * 1024 * 1000;

/// One kind of workload a cluster runs; each becomes one CapacityNeed.
#[derive(Debug, Clone, PartialEq)]
pub enum NeedSpec {
    /// A CPU service: `replicas` pods of `cores` CPU and `memory_gib` memory each.
    Cpu {
        replicas: u32,
        cores: u32,
        memory_gib: u32,
        priority: i32,
        interruption_penalty_dollars: f64,
    },
    /// GPU pods of `gpus_per_pod` each (the min unit), optionally pinned to a GPU model.
    Gpu {
        pods: u32,
        gpus_per_pod: u32,
        priority: i32,
        product: Option<String>,
    },
    /// A gang of `machines` full GPU machines that must share one value of
    /// `topology_key` (one rack): OPERATOR_SAME plus a stable group name.
    Gang {
        name: String,
        machines: u32,
        gpus_per_machine: u32,
        topology_key: String,
        priority: i32,
    },
}

impl NeedSpec {
    pub fn cpu(replicas: u32, cores: u32, memory_gib: u32, priority: i32) -> Self {
        NeedSpec::Cpu {
            replicas,
            cores,
            memory_gib,
            priority,
            interruption_penalty_dollars: 1.0,
        }
    }

    pub fn gpu(pods: u32, gpus_per_pod: u32, priority: i32) -> Self {
        NeedSpec::Gpu {
            pods,
            gpus_per_pod,
            priority,
            product: None,
        }
    }

    /// A gang on one rack ([`RACK_KEY`]).
    pub fn rack_gang(name: &str, machines: u32, gpus_per_machine: u32, priority: i32) -> Self {
        NeedSpec::Gang {
            name: name.to_owned(),
            machines,
            gpus_per_machine,
            topology_key: RACK_KEY.to_owned(),
            priority,
        }
    }

    /// The number of units (replicas, pods or machines) this spec asks for.
    pub fn units(&self) -> u32 {
        match self {
            NeedSpec::Cpu { replicas, .. } => *replicas,
            NeedSpec::Gpu { pods, .. } => *pods,
            NeedSpec::Gang { machines, .. } => *machines,
        }
    }

    /// The same spec with a different unit count.
    pub fn with_units(&self, n: u32) -> Self {
        let mut s = self.clone();
        match &mut s {
            NeedSpec::Cpu { replicas, .. } => *replicas = n,
            NeedSpec::Gpu { pods, .. } => *pods = n,
            NeedSpec::Gang { machines, .. } => *machines = n,
        }
        s
    }

    fn to_need(&self, cluster: &str) -> Option<Need> {
        if self.units() == 0 {
            return None; // withdrawn: absent from the roll-up
        }
        let (requirements, per_unit, priority, ipb, group) = match self {
            NeedSpec::Cpu {
                cores,
                memory_gib,
                priority,
                interruption_penalty_dollars,
                ..
            } => (
                Vec::new(),
                ResourceVector::from_milli([
                    ("cpu", i64::from(*cores) * 1000),
                    ("memory", i64::from(*memory_gib) * GIB_MILLI),
                ]),
                *priority,
                PenaltyBucket::for_dollars(*interruption_penalty_dollars),
                String::new(),
            ),
            NeedSpec::Gpu {
                gpus_per_pod,
                priority,
                product,
                ..
            } => (
                product
                    .iter()
                    .map(|p| Requirement::new(GPU_PRODUCT_KEY, Operator::In, [p.as_str()]))
                    .collect(),
                ResourceVector::from_milli([(GPU_RESOURCE, i64::from(*gpus_per_pod) * 1000)]),
                *priority,
                PenaltyBucket::for_dollars(1000.0),
                String::new(),
            ),
            NeedSpec::Gang {
                name,
                gpus_per_machine,
                topology_key,
                priority,
                ..
            } => (
                vec![Requirement::new(
                    topology_key.as_str(),
                    Operator::Same,
                    Vec::<String>::new(),
                )],
                ResourceVector::from_milli([(GPU_RESOURCE, i64::from(*gpus_per_machine) * 1000)]),
                *priority,
                PenaltyBucket::for_dollars(100_000.0),
                name.clone(),
            ),
        };
        let profile = Profile::new(requirements, Vec::new(), priority, ipb, PenaltyBucket::Zero);
        let mut need = Need::new(cluster, profile);
        need.aggregate_resources = per_unit.scale(i64::from(self.units()));
        need.min_unit = per_unit;
        need.group = group;
        Some(need)
    }
}

/// A cluster's workloads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Demand {
    pub needs: Vec<NeedSpec>,
}

impl Demand {
    pub fn new(needs: Vec<NeedSpec>) -> Self {
        Self { needs }
    }

    /// No demand at all (an empty roll-up: everything withdrawn).
    pub fn empty() -> Self {
        Self::default()
    }

    /// A small mixed cluster: two CPU services and a GPU job.
    pub fn typical() -> Self {
        Self::new(vec![
            NeedSpec::cpu(12, 4, 16, 100),
            NeedSpec::cpu(4, 16, 64, 500),
            NeedSpec::gpu(2, 8, 1000),
        ])
    }

    /// The full-replacement roll-up of this demand.
    pub fn rollup(&self, cluster: &str, timestamp_unix_nanos: i64) -> ClusterCapacityNeeds {
        bigfleet_conv::rollup_to_proto(&Rollup {
            cluster: cluster.to_owned(),
            timestamp_unix_nanos,
            needs: self
                .needs
                .iter()
                .filter_map(|n| n.to_need(cluster))
                .collect(),
        })
    }
}

/// Demand that moves: on each roll-up, with probability `probability`, every need's unit
/// count is redrawn within ±`spread` (a fraction) of its configured value, and may drop to
/// zero (withdrawn) when the draw reaches it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Churn {
    pub probability: f64,
    pub spread: f64,
}

impl Churn {
    /// Applies one churn draw to `base`.
    pub fn apply(&self, base: &Demand, rng: &mut StdRng) -> Demand {
        if !rng.random_bool(self.probability.clamp(0.0, 1.0)) {
            return base.clone();
        }
        let spread = self.spread.max(0.0);
        Demand::new(
            base.needs
                .iter()
                .map(|n| {
                    let f = 1.0 + rng.random_range(-spread..=spread);
                    let units = (f64::from(n.units()) * f).round().max(0.0);
                    n.with_units(units.min(f64::from(u32::MAX)) as u32)
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn typical_demand_is_a_valid_rollup() {
        let r = Demand::typical().rollup("c1", 42);
        assert_eq!(r.cluster_id, "c1");
        assert_eq!(r.needs.len(), 3);
        let parsed = bigfleet_conv::rollup_from_proto(&r).expect("the gateway accepts it");
        assert_eq!(parsed.needs[0].aggregate_resources.get("cpu"), 48_000);
        assert_eq!(parsed.needs[0].min_unit.get("cpu"), 4_000);
        assert_eq!(
            parsed.needs[2].aggregate_resources.get(GPU_RESOURCE),
            16_000
        );
    }

    #[test]
    fn gangs_carry_same_and_a_group() {
        let d = Demand::new(vec![NeedSpec::rack_gang("train-1", 8, 8, 2000)]);
        let r = d.rollup("c1", 1);
        let need = &r.needs[0];
        assert_eq!(need.group, "train-1");
        assert_eq!(need.requirements.len(), 1);
        assert_eq!(need.requirements[0].key, RACK_KEY);
        assert_eq!(
            need.requirements[0].operator,
            bigfleet_proto::v1alpha1::node_selector_requirement::Operator::Same as i32
        );
        assert_eq!(need.aggregate_resources[GPU_RESOURCE], "64");
        assert!(bigfleet_conv::rollup_from_proto(&r).is_ok());
    }

    #[test]
    fn zero_units_withdraw_the_need() {
        let d = Demand::new(vec![NeedSpec::cpu(0, 4, 8, 1), NeedSpec::cpu(1, 4, 8, 1)]);
        assert_eq!(d.rollup("c", 1).needs.len(), 1);
        assert!(Demand::empty().rollup("c", 1).needs.is_empty());
    }

    #[test]
    fn churn_moves_units_within_the_spread() {
        let base = Demand::new(vec![NeedSpec::cpu(100, 1, 1, 1)]);
        let churn = Churn {
            probability: 1.0,
            spread: 0.2,
        };
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen_change = false;
        for _ in 0..50 {
            let d = churn.apply(&base, &mut rng);
            let u = d.needs[0].units();
            assert!((80..=120).contains(&u), "{u}");
            seen_change |= u != 100;
        }
        assert!(seen_change);
        let never = Churn {
            probability: 0.0,
            spread: 0.5,
        };
        assert_eq!(never.apply(&base, &mut rng), base);
    }
}
