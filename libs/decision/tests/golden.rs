//! Multi-cycle paper scenarios through a tiny in-memory simulator that applies
//! every action instantly. Each run is rendered to text and compared with
//! `tests/golden/<name>.txt`; `BIGFLEET_BLESS=1 cargo test` rewrites them.

use crate::common;
use bigfleet_decision::{
    CycleInput, CycleOptions, CycleOutput, ParkingLedger, UnmetReason, VerdictSource, run_cycle,
};
use bigfleet_model::{Action, CapacityType, Machine, MachineState, Need, snapshot_order};
use common::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;

const SECOND: i64 = 1_000_000_000;

struct Sim {
    machines: Vec<Machine>,
    idle_since: HashMap<String, i64>,
    demand: BTreeMap<String, Vec<Need>>,
    ready: HashSet<String>,
    ledger: ParkingLedger,
    now: i64,
    cycle: u32,
    log: String,
}

impl Sim {
    fn new(machines: Vec<Machine>) -> Sim {
        let idle_since = machines
            .iter()
            .filter(|m| m.state == MachineState::Idle)
            .map(|m| (m.id.clone(), 0))
            .collect();
        Sim {
            machines,
            idle_since,
            demand: BTreeMap::new(),
            ready: HashSet::new(),
            ledger: ParkingLedger::new(),
            now: 0,
            cycle: 0,
            log: String::new(),
        }
    }

    /// A roll-up: full replacement of one cluster's demand (empty = withdrawal).
    fn rollup(&mut self, cluster: &str, needs: Vec<Need>) {
        self.ready.insert(cluster.to_owned());
        if needs.is_empty() {
            self.demand.remove(cluster);
        } else {
            self.demand.insert(cluster.to_owned(), needs);
        }
        writeln!(
            self.log,
            "-- rollup {cluster}: {} needs",
            self.demand.get(cluster).map_or(0, Vec::len)
        )
        .unwrap();
    }

    fn advance(&mut self, secs: i64) {
        self.now += secs * SECOND;
    }

    fn step(&mut self) -> CycleOutput {
        self.cycle += 1;
        self.machines.sort_by(|a, b| a.id.cmp(&b.id));
        let mut demand: Vec<Need> = self.demand.values().flatten().cloned().collect();
        demand.sort_by(snapshot_order);
        let stamps: Vec<Option<i64>> = self
            .machines
            .iter()
            .map(|m| self.idle_since.get(&m.id).copied())
            .collect();
        let ready = |c: &str| self.ready.contains(c);
        let input = CycleInput {
            idle_since: &stamps,
            now_unix_nanos: self.now,
            parking: Some(&self.ledger),
            cluster_ready: Some(&ready),
            ..CycleInput::new(&self.machines, &demand)
        };
        let out = run_cycle(
            &input,
            &CycleOptions {
                verdicts: true,
                ..CycleOptions::default()
            },
        )
        .expect("cycle");
        self.render(&out);
        self.ledger.observe(&out.parking);
        for a in &out.actions {
            self.apply(a);
        }
        self.now += SECOND;
        out
    }

    fn apply(&mut self, a: &Action) {
        let now = self.now;
        let m = self
            .machines
            .iter_mut()
            .find(|m| m.id == a.machine_id())
            .expect("action for a known machine");
        assert_eq!(m.state, a.kind().from_state(), "{a}");
        match bigfleet_decision::synth::apply_instantly(m, a, now, "sim") {
            Some(idle_since) => self.idle_since.insert(m.id.clone(), idle_since),
            None => self.idle_since.remove(&m.id),
        };
        m.invariant()
            .expect("simulated transition keeps the invariant");
    }

    fn render(&mut self, out: &CycleOutput) {
        let l = &mut self.log;
        writeln!(l, "== cycle {} t={}s", self.cycle, self.now / SECOND).unwrap();
        let mut acts: Vec<String> = out.actions.iter().map(ToString::to_string).collect();
        acts.sort();
        // Long runs of identical lines would drown the file: print counts per
        // (kind, cluster, need) and the first and last machine ids.
        let mut grouped: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for a in &out.actions {
            let key = a.to_string().replacen(a.machine_id(), "*", 1);
            grouped
                .entry(key)
                .or_default()
                .push(a.machine_id().to_owned());
        }
        for (k, mut ids) in grouped {
            ids.sort();
            writeln!(
                l,
                "  {k} x{} [{} .. {}]",
                ids.len(),
                ids[0],
                ids[ids.len() - 1]
            )
            .unwrap();
        }
        for s in &out.shortfalls {
            writeln!(
                l,
                "  shortfall prio={} deficit={}",
                s.profile.priority(),
                s.deficit
            )
            .unwrap();
        }
        for v in &out.verdicts {
            if !v.satisfied {
                // The detail an operator reads next to the reason (ADR-0115):
                // what the need holds, what matches per state, what Phase 2 found.
                let s = v.matching_supply.unwrap_or_default();
                writeln!(
                    l,
                    "  unmet reason={:?} residual={} domain={:?} parked={} claimed={} supply(i/c/s)={}/{}/{} victims={}",
                    v.unmet_reason,
                    v.residual_deficit,
                    v.same_domain,
                    v.acquisition_parked,
                    v.claimed_machine_count,
                    s.idle,
                    s.configured,
                    s.speculative,
                    v.preemption.as_ref().map_or(0, |p| p.victims_found),
                )
                .unwrap();
            }
        }
    }

    fn census(&self) -> BTreeMap<String, usize> {
        let mut c = BTreeMap::new();
        for m in &self.machines {
            let key = if m.cluster.is_empty() {
                m.state.to_string()
            } else {
                format!("{}@{}", m.state, m.cluster)
            };
            *c.entry(key).or_insert(0) += 1;
        }
        c
    }

    fn finish(mut self, name: &str) -> BTreeMap<String, usize> {
        let census = self.census();
        writeln!(self.log, "== final {census:?}").unwrap();
        check_golden(name, &self.log);
        census
    }
}

fn check_golden(name: &str, got: &str) {
    let path = format!("{}/tests/golden/{name}.txt", env!("CARGO_MANIFEST_DIR"));
    if std::env::var_os("BIGFLEET_BLESS").is_some() {
        std::fs::write(&path, got).expect("write golden file");
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run with BIGFLEET_BLESS=1 to create it)"));
    if want != got {
        let diff: Vec<String> = want
            .lines()
            .zip(got.lines())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .take(5)
            .map(|(i, (a, b))| format!("line {}:\n  want {a}\n  got  {b}", i + 1))
            .collect();
        panic!(
            "{name}: output differs from {path} ({} vs {} lines)\n{}\n(BIGFLEET_BLESS=1 regenerates)",
            want.lines().count(),
            got.lines().count(),
            diff.join("\n")
        );
    }
}

fn gpu_machine(id: &str, state: MachineState) -> M {
    machine(id, state)
        .itype("gpu-8x")
        .res(units(GPU, 8))
        .price(30.0)
}

/// A sim over 32 Idle 8-GPU machines, `gpu-00` to `gpu-31`.
fn idle_gpu_sim() -> Sim {
    let ms = (0..32)
        .map(|i| gpu_machine(&format!("gpu-{i:02}"), MachineState::Idle).build())
        .collect();
    Sim::new(ms)
}

#[test]
fn capacity_stockout() {
    let mut sim = idle_gpu_sim();
    sim.rollup(
        "c1",
        vec![need("c1", units(GPU, 512)).mu(units(GPU, 8)).build()],
    );
    let first = sim.step();
    assert_eq!(first.stats.bootstraps, 32);
    assert_eq!(first.shortfalls.len(), 1);
    assert_eq!(first.shortfalls[0].deficit, units(GPU, 256));
    // It holds every matching machine and is still short: supply exists, held
    // by the need itself, so not NO_MATCHING_SUPPLY (ADR-0115).
    assert_eq!(
        first.verdicts[0].unmet_reason,
        bigfleet_decision::UnmetReason::PriorityStarved
    );
    assert_eq!(first.verdicts[0].matching_supply.unwrap().idle, 32);
    let second = sim.step();
    assert!(second.actions.is_empty());
    assert_eq!(second.shortfalls[0].deficit, units(GPU, 256));
    let census = sim.finish("capacity_stockout");
    assert_eq!(census.get("configured@c1"), Some(&32));
}

/// Four GPU machines configured for "batch" (priority 100,000, wanting 32 GPU), and
/// "train" (priority 1,000,000) wanting `train_gpus` more than the shard has free.
fn batch_holds_four_gpus_train_wants(train_gpus: i64) -> Sim {
    let batch = need("batch", units(GPU, 32)).prio(100_000).build();
    let ms = (0..4)
        .map(|i| {
            gpu_machine(&format!("gpu-{i}"), MachineState::Configured)
                .cluster("batch")
                .serving(&batch)
                .build()
        })
        .collect();
    let mut sim = Sim::new(ms);
    sim.rollup("batch", vec![batch]);
    sim.rollup(
        "train",
        vec![
            need("train", units(GPU, train_gpus))
                .prio(1_000_000)
                .build(),
        ],
    );
    sim
}

#[test]
fn priority_inversion() {
    let mut sim = batch_holds_four_gpus_train_wants(32);
    let c1 = sim.step();
    assert_eq!(c1.stats.preempts, 4);
    let c2 = sim.step();
    assert_eq!(c2.stats.bootstraps, 4);
    let c3 = sim.step();
    assert!(c3.actions.is_empty(), "stable: batch cannot preempt back");
    let census = sim.finish("priority_inversion");
    assert_eq!(census.get("configured@train"), Some(&4));
    assert_eq!(census.get("configured@batch"), None);
}

#[test]
fn training_job_topology() {
    let mut ms = Vec::new();
    for (rack, n) in [("r1", 40), ("r2", 64), ("r3", 20)] {
        for i in 0..n {
            ms.push(
                gpu_machine(&format!("{rack}-{i:02}"), MachineState::Idle)
                    .label("rack", rack)
                    .build(),
            );
        }
    }
    let mut sim = Sim::new(ms);
    let gang = need("c1", units(GPU, 512))
        .mu(units(GPU, 8))
        .req(req("rack", bigfleet_model::Operator::Same, &[]))
        .group("job-1")
        .build();
    sim.rollup("c1", vec![gang]);
    let c1 = sim.step();
    assert_eq!(c1.stats.bootstraps, 64);
    assert!(c1.actions.iter().all(|a| a.machine_id().starts_with("r2-")));
    assert!(c1.shortfalls.is_empty());
    let c2 = sim.step();
    assert!(c2.actions.is_empty());
    let census = sim.finish("training_job_topology");
    assert_eq!(census.get("configured@c1"), Some(&64));
}

#[test]
fn withdrawal_then_release() {
    let web = need("c1", units("cpu", 32)).build();
    let ms = (0..32)
        .map(|i| {
            machine(&format!("od-{i:02}"), MachineState::Configured)
                .cluster("c1")
                .cap(CapacityType::OnDemand)
                .price(2.0)
                .serving(&web)
                .build()
        })
        .collect();
    let mut sim = Sim::new(ms);
    sim.rollup("c1", vec![web]);
    assert!(sim.step().actions.is_empty());
    sim.rollup("c1", Vec::new());
    let c2 = sim.step();
    assert_eq!(c2.stats.reclaims, 32);
    assert!(sim.step().actions.is_empty(), "inside the 10 min hold");
    sim.advance(11 * 60);
    let c4 = sim.step();
    assert_eq!(c4.stats.releases, 32);
    let census = sim.finish("withdrawal_then_release");
    assert_eq!(census.get("speculative"), Some(&32));
}

#[test]
fn unsatisfiable_gang_parks_quietly() {
    // Two racks of 3; a gang of 4 can never fit one rack. It concentrates in one
    // rack, then parks after 8 cycles, with a one-cycle re-probe at age 32.
    let mut ms = Vec::new();
    for rack in ["r1", "r2"] {
        for i in 0..3 {
            ms.push(
                machine(&format!("{rack}-{i}"), MachineState::Idle)
                    .label("rack", rack)
                    .build(),
            );
        }
    }
    let mut sim = Sim::new(ms);
    let gang = need("c1", units("cpu", 4))
        .req(req("rack", bigfleet_model::Operator::Same, &[]))
        .group("g")
        .build();
    sim.rollup("c1", vec![gang]);
    let mut churn = 0;
    for _ in 0..40 {
        let out = sim.step();
        churn += out.actions.len();
    }
    assert_eq!(churn, 3, "one concentration, then quiet");
    sim.finish("unsatisfiable_gang_parks_quietly");
}

// ---- unmet reasons (ADR-0115): one scenario per reason of the seed's taxonomy ----

fn reason(out: &CycleOutput, cluster_needs: &[Need], cluster: &str) -> UnmetReason {
    let k = cluster_needs
        .iter()
        .position(|n| n.cluster == cluster)
        .expect("a need of the cluster");
    out.verdicts
        .iter()
        .find(|v| v.source == VerdictSource::Demand(k))
        .expect("a verdict per input need")
        .unmet_reason
}

/// The demand the sim's next step will run on (same order as [`Sim::step`]).
fn demand_of(sim: &Sim) -> Vec<Need> {
    let mut d: Vec<Need> = sim.demand.values().flatten().cloned().collect();
    d.sort_by(snapshot_order);
    d
}

#[test]
fn stockout_claimed_supply() {
    // 32 GPU machines; "train" (high priority) wants 40 of them, "batch" 8.
    // Train takes all 32 and is still short: the matching supply exists (its
    // own `matching_supply.idle` says 32), held by train itself. Batch finds
    // the same 32 held by a more important need. Neither is NO_MATCHING_SUPPLY.
    let mut sim = idle_gpu_sim();
    for (cluster, gpus, prio) in [("train", 320, 1000), ("batch", 64, 10)] {
        let n = need(cluster, units(GPU, gpus)).mu(units(GPU, 8)).prio(prio);
        sim.rollup(cluster, vec![n.build()]);
    }
    for _ in 0..2 {
        let d = demand_of(&sim);
        let out = sim.step();
        assert_eq!(reason(&out, &d, "train"), UnmetReason::PriorityStarved);
        assert_eq!(reason(&out, &d, "batch"), UnmetReason::PriorityStarved);
        let train = &out.verdicts[0];
        assert_eq!(train.claimed_machine_count, 32);
        let s = train.matching_supply.unwrap();
        assert_eq!(s.idle + s.configured, 32);
    }
    let census = sim.finish("stockout_claimed_supply");
    assert_eq!(census.get("configured@train"), Some(&32));
}

#[test]
fn same_gang_unsatisfiable() {
    // The shard owns one zone of 3 machines (domains are assigned to shards);
    // a Same(zone) gang of 4 fits no zone. It concentrates in zone-a, holding
    // every matching machine, and is TOPOLOGY_UNSATISFIABLE every cycle, before
    // and after it parks: the seed's Tier 1 comes before any supply reason.
    let ms = (0..3)
        .map(|i| machine(&format!("a-{i}"), MachineState::Idle).build())
        .collect();
    let mut sim = Sim::new(ms);
    let gang = same_zone_gang("c1", units("cpu", 4), "job-1").build();
    sim.rollup("c1", vec![gang]);
    let mut parked = false;
    for _ in 0..10 {
        let out = sim.step();
        let v = &out.verdicts[0];
        assert_eq!(v.unmet_reason, UnmetReason::TopologyUnsatisfiable);
        assert!(!v.same_satisfiable);
        parked |= v.acquisition_parked;
    }
    assert!(parked, "parks after 8 failing cycles");
    let census = sim.finish("same_gang_unsatisfiable");
    assert_eq!(census.get("configured@c1"), Some(&3));
}

#[test]
fn no_matching_supply() {
    // A CPU-only fleet. A GPU need and a Same(zone) GPU gang: nothing matches
    // either in any state. The plain need is NO_MATCHING_SUPPLY with all-zero
    // counts; the gang has no satisfiable domain, so Tier 1 names it
    // TOPOLOGY_UNSATISFIABLE (no candidates, all-zero counts tell the rest).
    let ms = (0..4)
        .map(|i| {
            machine(&format!("cpu-{i}"), MachineState::Idle)
                .itype("c-16")
                .res(units("cpu", 16))
                .build()
        })
        .collect();
    let mut sim = Sim::new(ms);
    sim.rollup(
        "c1",
        vec![need("c1", units(GPU, 8)).req(pin("gpu-8x")).build()],
    );
    sim.rollup(
        "c2",
        vec![
            need("c2", units(GPU, 16))
                .req(pin("gpu-8x"))
                .req(same_zone())
                .group("g")
                .build(),
        ],
    );
    for _ in 0..2 {
        let d = demand_of(&sim);
        let out = sim.step();
        assert!(out.actions.is_empty());
        assert_eq!(reason(&out, &d, "c1"), UnmetReason::NoMatchingSupply);
        assert_eq!(reason(&out, &d, "c2"), UnmetReason::TopologyUnsatisfiable);
        assert!(
            out.verdicts
                .iter()
                .all(|v| v.matching_supply.unwrap().is_empty())
        );
    }
    let census = sim.finish("no_matching_supply");
    assert_eq!(census.get("idle"), Some(&4));
}

#[test]
fn preemption_fell_short() {
    // "train" (1,000,000) wants 8 GPU machines; the shard has 4, all serving
    // "batch" (100,000). Phase 2 picks all 4 and is still 4 short:
    // PREEMPTION_EXHAUSTED. Next cycle train acquires the freed 4 and holds
    // every matching machine, still short: PRIORITY_STARVED (held, by train
    // itself), never NO_MATCHING_SUPPLY; batch, starved by train, likewise.
    let mut sim = batch_holds_four_gpus_train_wants(64);
    let d = demand_of(&sim);
    let c1 = sim.step();
    assert_eq!(c1.stats.preempts, 4);
    assert_eq!(reason(&c1, &d, "train"), UnmetReason::PreemptionExhausted);
    let p = c1.verdicts[0].preemption.as_ref().unwrap();
    assert_eq!(p.victims_found, 4);
    let c2 = sim.step();
    assert_eq!(c2.stats.bootstraps, 4);
    assert_eq!(reason(&c2, &d, "train"), UnmetReason::PriorityStarved);
    assert_eq!(reason(&c2, &d, "batch"), UnmetReason::PriorityStarved);
    let c3 = sim.step();
    assert!(c3.actions.is_empty());
    assert_eq!(reason(&c3, &d, "train"), UnmetReason::PriorityStarved);
    let census = sim.finish("preemption_fell_short");
    assert_eq!(census.get("configured@train"), Some(&4));
}
