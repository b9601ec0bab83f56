//! What the fake provider is seeded with: a JSON catalog of instance types and pools, the
//! built-in default catalog, and a deterministic generator for fleets of any size.
//!
//! The format is described in the crate documentation (`lib.rs`).

use std::collections::BTreeMap;
use std::path::Path;

use bigfleet_proto::v1alpha1::{CapacityType, MachineState};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::CatalogError;

/// Label every machine carries with its zone (also in `Machine.zone`).
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// Label naming the rack of machines from pools with a `rack_size`.
pub const RACK_LABEL: &str = "topology.bigfleet/rack";
/// `HostRef.provider` when the catalog names none.
pub const DEFAULT_PROVIDER_NAME: &str = "fake";
/// Cluster given to machines seeded bound when their pool lists no clusters.
pub const DEFAULT_CLUSTER: &str = "fake-cluster";

/// A whole seeding description.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// `HostRef.provider` of every machine with a host.
    #[serde(default = "default_provider_name")]
    pub provider: String,
    /// Hardware shapes, by instance-type name (`Machine.instance_type`).
    #[serde(default)]
    pub instance_types: BTreeMap<String, InstanceType>,
    /// Groups of identical machines; machine ids are `<pool name>-<index>`.
    #[serde(default)]
    pub pools: Vec<Pool>,
}

fn default_provider_name() -> String {
    DEFAULT_PROVIDER_NAME.to_owned()
}

/// One hardware shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceType {
    /// `Machine.resources`: Kubernetes resource name to quantity string.
    pub resources: BTreeMap<String, String>,
    /// `Machine.allocatable`; absent means "same as resources" (and is sent unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocatable: Option<BTreeMap<String, String>>,
    /// Labels every machine of this type carries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// A group of machines of one instance type and capacity type, spread over zones.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pool {
    /// Prefix of the machine ids; unique within the catalog.
    pub name: String,
    /// A key of `instance_types`.
    pub instance_type: String,
    pub capacity_type: CapacityKind,
    /// Zones the machines are spread over, round-robin by index.
    pub zones: Vec<String>,
    /// USD per hour, finite and not negative.
    #[serde(default)]
    pub price_per_hour: f64,
    /// Hourly interruption probability in [0, 1].
    #[serde(default)]
    pub interruption_probability: f64,
    /// Extra labels (merged over the instance type's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Machines per rack within a zone; when set every machine carries [`RACK_LABEL`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack_size: Option<u32>,
    /// Clusters the bound machines (configuring, configured, draining) are spread over.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// How many machines start in each state.
    pub counts: StateCounts,
}

/// `CapacityType` in catalog spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityKind {
    BareMetal,
    Reserved,
    OnDemand,
    Spot,
}

impl CapacityKind {
    pub fn to_proto(self) -> CapacityType {
        match self {
            CapacityKind::BareMetal => CapacityType::BareMetal,
            CapacityKind::Reserved => CapacityType::Reserved,
            CapacityKind::OnDemand => CapacityType::OnDemand,
            CapacityKind::Spot => CapacityType::Spot,
        }
    }
}

/// Number of machines per starting state. Machines are assigned states in the field order
/// below, so index 0.. are speculative first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StateCounts {
    pub speculative: u32,
    pub creating: u32,
    pub idle: u32,
    pub configuring: u32,
    pub configured: u32,
    pub draining: u32,
    pub deleting: u32,
    pub failed: u32,
}

impl StateCounts {
    pub fn total(&self) -> u64 {
        self.in_order().iter().map(|(_, n)| u64::from(*n)).sum()
    }

    /// (state, count) in assignment order.
    pub fn in_order(&self) -> [(MachineState, u32); 8] {
        [
            (MachineState::Speculative, self.speculative),
            (MachineState::Creating, self.creating),
            (MachineState::Idle, self.idle),
            (MachineState::Configuring, self.configuring),
            (MachineState::Configured, self.configured),
            (MachineState::Draining, self.draining),
            (MachineState::Deleting, self.deleting),
            (MachineState::Failed, self.failed),
        ]
    }
}

impl Catalog {
    /// Parses and validates a catalog document.
    pub fn from_json(text: &str) -> Result<Self, CatalogError> {
        let catalog: Catalog =
            serde_json::from_str(text).map_err(|e| CatalogError::Parse(e.to_string()))?;
        catalog.validate()?;
        Ok(catalog)
    }

    /// Reads, parses and validates a catalog file.
    pub fn load(path: &Path) -> Result<Self, CatalogError> {
        let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json(&text)
    }

    pub fn to_json_pretty(&self) -> String {
        // Serializing plain maps, strings and finite numbers cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Total number of machines the catalog seeds.
    pub fn machine_count(&self) -> u64 {
        self.pools.iter().map(|p| p.counts.total()).sum()
    }

    /// Checks everything a seeded machine must satisfy (the provider obligations of the
    /// wire contract: instance type present, zone present, honest cost fields).
    pub fn validate(&self) -> Result<(), CatalogError> {
        let bad = |what: String| Err(CatalogError::Invalid(what));
        if self.provider.is_empty() {
            return bad("provider name is empty".into());
        }
        for (name, it) in &self.instance_types {
            if name.is_empty() {
                return bad("instance type with an empty name".into());
            }
            if it.resources.is_empty() {
                return bad(format!("instance type {name} has no resources"));
            }
        }
        let mut names = std::collections::BTreeSet::new();
        for pool in &self.pools {
            let p = &pool.name;
            if p.is_empty() {
                return bad("pool with an empty name".into());
            }
            if !names.insert(p.as_str()) {
                return bad(format!("pool {p} is declared twice"));
            }
            if !self.instance_types.contains_key(&pool.instance_type) {
                return bad(format!(
                    "pool {p} uses unknown instance type {}",
                    pool.instance_type
                ));
            }
            if pool.zones.is_empty() || pool.zones.iter().any(String::is_empty) {
                return bad(format!("pool {p} needs at least one non-empty zone"));
            }
            if !(pool.price_per_hour.is_finite() && pool.price_per_hour >= 0.0) {
                return bad(format!("pool {p} price must be finite and not negative"));
            }
            let prob = pool.interruption_probability;
            if !(0.0..=1.0).contains(&prob) {
                return bad(format!(
                    "pool {p} interruption probability must be in [0, 1]"
                ));
            }
            if pool.rack_size == Some(0) {
                return bad(format!("pool {p} rack_size must be positive"));
            }
            if pool.clusters.iter().any(String::is_empty) {
                return bad(format!("pool {p} lists an empty cluster name"));
            }
        }
        Ok(())
    }

    /// The built-in catalog (a little under a thousand machines): bare-metal GPU racks of
    /// 8×GPU machines in two zones plus an A100 rack row in a third, reserved CPU, and
    /// on-demand and spot CPU pools in three zones with plenty of Speculative slots (the
    /// conformance suite needs them).
    pub fn builtin() -> Self {
        let mut instance_types = BTreeMap::new();
        instance_types.insert("bm.gpu.h100.8".into(), gpu_type("192", "2048Gi", "H100"));
        instance_types.insert("bm.gpu.a100.8".into(), gpu_type("128", "1024Gi", "A100"));
        instance_types.insert("c.large.16".into(), cpu_type("16", "64Gi"));
        instance_types.insert("m.xlarge.32".into(), cpu_type("32", "128Gi"));
        let zones3 = || zones(&["fake-1a", "fake-1b", "fake-1c"]);
        let clusters = || (0..4).map(|i| format!("cluster-{i}")).collect::<Vec<_>>();
        // Racks of eight bare-metal GPU machines, bound or idle, at no hourly price.
        let gpu_racks =
            |name: &str, instance_type: &str, in_zones: &[&str], idle, configured| Pool {
                name: name.into(),
                instance_type: instance_type.into(),
                capacity_type: CapacityKind::BareMetal,
                zones: zones(in_zones),
                price_per_hour: 0.0,
                interruption_probability: 0.0,
                labels: BTreeMap::new(),
                rack_size: Some(8),
                clusters: clusters(),
                counts: StateCounts {
                    idle,
                    configured,
                    ..StateCounts::default()
                },
            };
        let pools = vec![
            gpu_racks("gpu-h100", "bm.gpu.h100.8", &["fake-1a", "fake-1b"], 48, 16),
            gpu_racks("gpu-a100", "bm.gpu.a100.8", &["fake-1c"], 24, 8),
            Pool {
                name: "cpu-reserved".into(),
                instance_type: "c.large.16".into(),
                capacity_type: CapacityKind::Reserved,
                zones: zones(&["fake-1a", "fake-1b"]),
                price_per_hour: 0.68,
                interruption_probability: 0.0,
                labels: BTreeMap::new(),
                rack_size: None,
                clusters: clusters(),
                counts: StateCounts {
                    idle: 32,
                    configured: 32,
                    ..StateCounts::default()
                },
            },
            Pool {
                name: "cpu-od".into(),
                instance_type: "m.xlarge.32".into(),
                capacity_type: CapacityKind::OnDemand,
                zones: zones3(),
                price_per_hour: 1.536,
                interruption_probability: 0.0,
                labels: BTreeMap::new(),
                rack_size: None,
                clusters: clusters(),
                counts: StateCounts {
                    speculative: 300,
                    idle: 24,
                    configured: 36,
                    ..StateCounts::default()
                },
            },
            Pool {
                name: "cpu-spot".into(),
                instance_type: "m.xlarge.32".into(),
                capacity_type: CapacityKind::Spot,
                zones: zones3(),
                price_per_hour: 0.46,
                interruption_probability: 0.05,
                labels: BTreeMap::new(),
                rack_size: None,
                clusters: clusters(),
                counts: StateCounts {
                    speculative: 300,
                    idle: 12,
                    ..StateCounts::default()
                },
            },
        ];
        Catalog {
            provider: DEFAULT_PROVIDER_NAME.into(),
            instance_types,
            pools,
        }
    }

    /// A fleet of exactly `n` machines, the same for the same `(n, seed)`: 8% bare-metal
    /// GPU racks, 12% reserved CPU, 45% on-demand and 35% spot CPU (mostly Speculative
    /// slots), over three zones, one cluster per 250 machines. The seed moves prices,
    /// spot interruption probabilities and the GPU model of each zone.
    pub fn generated(n: u64, seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let zone_names = ["fake-1a", "fake-1b", "fake-1c"];
        let cluster_count = n.div_ceil(250).clamp(1, 4000);
        let clusters: Vec<String> = (0..cluster_count).map(|i| format!("cluster-{i}")).collect();

        let mut instance_types = BTreeMap::new();
        instance_types.insert("bm.gpu.h100.8".into(), gpu_type("192", "2048Gi", "H100"));
        instance_types.insert("bm.gpu.a100.8".into(), gpu_type("128", "1024Gi", "A100"));
        instance_types.insert("c.large.16".into(), cpu_type("16", "64Gi"));
        instance_types.insert("m.xlarge.32".into(), cpu_type("32", "128Gi"));

        // (class, share in per-mille, states as per-mille of the class)
        struct Class {
            name: &'static str,
            share: u64,
            kind: CapacityKind,
            spec: u64,
            idle: u64,
        }
        let classes = [
            Class {
                name: "gpu",
                share: 80,
                kind: CapacityKind::BareMetal,
                spec: 0,
                idle: 300,
            },
            Class {
                name: "reserved",
                share: 120,
                kind: CapacityKind::Reserved,
                spec: 0,
                idle: 400,
            },
            Class {
                name: "od",
                share: 450,
                kind: CapacityKind::OnDemand,
                spec: 700,
                idle: 100,
            },
            Class {
                name: "spot",
                share: 350,
                kind: CapacityKind::Spot,
                spec: 800,
                idle: 50,
            },
        ];

        // Split n over (class, zone) cells so the total is exact: every cell gets its
        // floor share and the last cell absorbs the rounding remainder.
        let cells = classes.len() * zone_names.len();
        let mut pools = Vec::with_capacity(cells);
        let mut assigned = 0u64;
        for (ci, class) in classes.iter().enumerate() {
            for (zi, zone) in zone_names.iter().enumerate() {
                let last = ci == classes.len() - 1 && zi == zone_names.len() - 1;
                let size = if last {
                    n - assigned
                } else {
                    n * class.share / 1000 / zone_names.len() as u64
                };
                assigned += size;
                let spec = size * class.spec / 1000;
                let idle = size * class.idle / 1000;
                let configured = size - spec - idle;
                let (instance_type, price, prob, rack_size) = match class.kind {
                    CapacityKind::BareMetal => {
                        let model = if rng.random_bool(0.7) {
                            "bm.gpu.h100.8"
                        } else {
                            "bm.gpu.a100.8"
                        };
                        (model, 0.0, 0.0, Some(8))
                    }
                    CapacityKind::Reserved => (
                        "c.large.16",
                        round4(0.68 * rng.random_range(0.9..1.1)),
                        0.0,
                        None,
                    ),
                    CapacityKind::OnDemand => (
                        "m.xlarge.32",
                        round4(1.536 * rng.random_range(0.9..1.1)),
                        0.0,
                        None,
                    ),
                    CapacityKind::Spot => (
                        "m.xlarge.32",
                        round4(0.46 * rng.random_range(0.7..1.3)),
                        round4(rng.random_range(0.01..0.15)),
                        None,
                    ),
                };
                pools.push(Pool {
                    name: format!("{}-{zone}", class.name),
                    instance_type: instance_type.into(),
                    capacity_type: class.kind,
                    zones: vec![(*zone).into()],
                    price_per_hour: price,
                    interruption_probability: prob,
                    labels: BTreeMap::new(),
                    rack_size,
                    clusters: clusters.clone(),
                    counts: StateCounts {
                        speculative: to_u32(spec),
                        idle: to_u32(idle),
                        configured: to_u32(configured),
                        ..StateCounts::default()
                    },
                });
            }
        }
        Catalog {
            provider: DEFAULT_PROVIDER_NAME.into(),
            instance_types,
            pools,
        }
    }
}

fn to_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

fn zones(names: &[&str]) -> Vec<String> {
    names.iter().map(|z| (*z).to_owned()).collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn gpu_type(cpu: &str, memory: &str, model: &str) -> InstanceType {
    InstanceType {
        resources: map(&[("cpu", cpu), ("memory", memory), ("nvidia.com/gpu", "8")]),
        allocatable: Some(map(&[
            (
                "cpu",
                &format!("{}", cpu.parse::<u32>().unwrap_or(2).saturating_sub(2)),
            ),
            ("memory", memory),
            ("nvidia.com/gpu", "8"),
        ])),
        labels: map(&[("nvidia.com/gpu.product", model)]),
    }
}

fn cpu_type(cpu: &str, memory: &str) -> InstanceType {
    InstanceType {
        resources: map(&[("cpu", cpu), ("memory", memory)]),
        allocatable: None,
        labels: BTreeMap::new(),
    }
}

/// One machine as a catalog describes it, before it becomes a store record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SeedMachine {
    pub id: String,
    pub state: MachineState,
    pub pool: usize,
    pub zone: usize,
    pub rack: Option<u64>,
    pub cluster: Option<usize>,
}

/// Every machine a catalog seeds, in a stable order (pool order, then index).
pub(crate) fn expand(catalog: &Catalog) -> impl Iterator<Item = SeedMachine> + '_ {
    catalog
        .pools
        .iter()
        .enumerate()
        .flat_map(|(pi, pool)| expand_pool(pi, pool))
}

fn expand_pool(pi: usize, pool: &Pool) -> impl Iterator<Item = SeedMachine> + '_ {
    let zones = pool.zones.len().max(1) as u64;
    let states = pool
        .counts
        .in_order()
        .into_iter()
        .flat_map(|(state, n)| std::iter::repeat_n(state, n as usize));
    let mut bound = 0usize;
    states.enumerate().map(move |(k, state)| {
        let k = k as u64;
        let zone = (k % zones) as usize;
        let rack = pool.rack_size.map(|size| (k / zones) / u64::from(size));
        let cluster = matches!(
            state,
            MachineState::Configuring | MachineState::Configured | MachineState::Draining
        )
        .then(|| {
            let c = bound;
            bound += 1;
            c
        });
        SeedMachine {
            id: format!("{}-{k:06}", pool.name),
            state,
            pool: pi,
            zone,
            rack,
            cluster,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_is_valid_and_has_speculative_gpu_and_racks() {
        let c = Catalog::builtin();
        c.validate().unwrap();
        let machines: Vec<_> = expand(&c).collect();
        assert_eq!(machines.len() as u64, c.machine_count());
        assert!(
            machines
                .iter()
                .filter(|m| m.state == MachineState::Speculative)
                .count()
                >= 100
        );
        let racks: std::collections::BTreeSet<_> = machines
            .iter()
            .filter(|m| m.pool == 0)
            .map(|m| (m.zone, m.rack))
            .collect();
        // 64 H100 machines over 2 zones in racks of 8 ⇒ 4 racks per zone.
        assert_eq!(racks.len(), 8);
    }

    #[test]
    fn json_round_trip_and_rejections() {
        let c = Catalog::builtin();
        let back = Catalog::from_json(&c.to_json_pretty()).unwrap();
        assert_eq!(back, c);

        let mut bad = c.clone();
        bad.pools[0].price_per_hour = f64::NAN;
        assert!(matches!(bad.validate(), Err(CatalogError::Invalid(_))));
        let mut bad = c.clone();
        bad.pools[1].interruption_probability = 1.5;
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.pools[1].instance_type = "nope".into();
        assert!(bad.validate().is_err());
        let mut bad = c.clone();
        bad.pools[1].zones.clear();
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.pools[2].name = bad.pools[1].name.clone();
        assert!(bad.validate().is_err());

        assert!(matches!(
            Catalog::from_json(r#"{"pools": [], "bogus": 1}"#),
            Err(CatalogError::Parse(_))
        ));
    }

    #[test]
    fn generated_is_exact_and_deterministic() {
        for n in [0u64, 1, 7, 1000, 12_345] {
            let a = Catalog::generated(n, 42);
            a.validate().unwrap();
            assert_eq!(a.machine_count(), n, "n={n}");
            assert_eq!(a, Catalog::generated(n, 42));
        }
        assert_ne!(Catalog::generated(1000, 1), Catalog::generated(1000, 2));
    }

    #[test]
    fn expansion_assigns_zones_racks_and_clusters() {
        let c = Catalog::from_json(
            r#"{
              "instance_types": {"t": {"resources": {"cpu": "4"}}},
              "pools": [{"name": "p", "instance_type": "t", "capacity_type": "spot",
                         "zones": ["a", "b"], "rack_size": 2, "clusters": ["x", "y"],
                         "counts": {"speculative": 2, "configured": 4}}]
            }"#,
        )
        .unwrap();
        let m: Vec<_> = expand(&c).collect();
        assert_eq!(m.len(), 6);
        assert_eq!(m[0].id, "p-000000");
        assert_eq!(m[0].state, MachineState::Speculative);
        assert_eq!(m[2].state, MachineState::Configured);
        assert_eq!(
            m.iter().map(|s| s.zone).collect::<Vec<_>>(),
            [0, 1, 0, 1, 0, 1]
        );
        // Per zone: indices 0,1 in rack 0, index 2 in rack 1.
        assert_eq!(
            m.iter().map(|s| s.rack.unwrap()).collect::<Vec<_>>(),
            [0, 0, 0, 0, 1, 1]
        );
        assert_eq!(
            m.iter().map(|s| s.cluster).collect::<Vec<_>>(),
            [None, None, Some(0), Some(1), Some(2), Some(3)]
        );
    }
}
