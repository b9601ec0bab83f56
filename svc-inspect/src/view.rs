//! The JSON shapes of the HTTP API (and of the CLI's `-o json`), built from the wire
//! messages. Presentation only: enum values become their names without the prefix, resource
//! maps are sorted, requirements are rendered as `key Op [values]`.

use std::collections::BTreeMap;
use std::collections::HashMap;

use bigfleet_proto::mesh::v1 as mesh;
use bigfleet_proto::v1alpha1 as pb;
use serde::{Deserialize, Serialize};

/// One page of a longer list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Page<T> {
    /// 1-based page number actually served (clamped to the last page).
    pub page: usize,
    pub page_size: usize,
    /// Items over all pages.
    pub total: usize,
    pub pages: usize,
    pub items: Vec<T>,
}

impl<T: Clone> Page<T> {
    /// The `page`-th (1-based) slice of `items`; out-of-range pages clamp to the last one.
    pub fn of(items: &[T], page: usize, page_size: usize) -> Self {
        let page_size = page_size.max(1);
        let total = items.len();
        let pages = total.div_ceil(page_size).max(1);
        let page = page.clamp(1, pages);
        let start = (page - 1) * page_size;
        let end = (start + page_size).min(total);
        Page {
            page,
            page_size,
            total,
            pages,
            items: items.get(start..end).unwrap_or_default().to_vec(),
        }
    }
}

impl<T> Page<T> {
    /// The same page with each item converted (only the served page is, not the whole list).
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            page: self.page,
            page_size: self.page_size,
            total: self.total,
            pages: self.pages,
            items: self.items.into_iter().map(f).collect(),
        }
    }
}

/// One shard in the fleet overview.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardView {
    pub shard_id: String,
    pub address: String,
    /// Whether the shard answered this round.
    pub reachable: bool,
    /// Why it did not; empty when reachable.
    pub error: String,
    /// Registration time (Unix nanoseconds; 0 when unknown).
    pub registered_at_unix_ns: i64,
    /// Milliseconds since the coordinator last heard a report; negative when never.
    pub last_report_age_ms: i64,
    /// Latest decision cycle (0 before the first).
    pub cycle: i64,
    /// Machines per state, keyed by the MachineState name (`MACHINE_STATE_IDLE`).
    pub machines_by_state: BTreeMap<String, i32>,
    pub sessions: u32,
    pub needs: i32,
    /// Unmet rows; negative when the shard could not say (no ShardInfo service).
    pub unmet_needs: i32,
    pub shard_epoch: i64,
    pub actions_in_flight: i32,
    /// From the shard's last report to the coordinator (available even when the shard is
    /// not reachable from here).
    pub reported_total_machines: Option<i32>,
    pub reported_free_machines: Option<i32>,
    /// Where the live numbers came from: `shard-info`, `inspect-needs` (a shard without
    /// the ShardInfo service: no machine counts) or empty when unreachable.
    pub source: String,
    /// The shard decides on stale inventory: its provider List fails (ADR-0118).
    #[serde(default)]
    pub inventory_stale: bool,
    /// When the shard's inventory was last listed (Unix nanoseconds; 0 when unknown).
    #[serde(default)]
    pub inventory_listed_at_unix_ns: i64,
    /// Known machines whose removal the shard holds (its provider's Lists left them out).
    #[serde(default)]
    pub removals_held: i32,
}

impl ShardView {
    pub fn to_proto(&self) -> mesh::ShardOverview {
        mesh::ShardOverview {
            shard_id: self.shard_id.clone(),
            address: self.address.clone(),
            reachable: self.reachable,
            error: self.error.clone(),
            machines_by_state: self
                .machines_by_state
                .iter()
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            sessions: self.sessions,
            last_report_age_ms: self.last_report_age_ms,
            needs: self.needs,
            unmet_needs: self.unmet_needs.max(0),
            cycle: self.cycle,
            inventory_stale: self.inventory_stale,
            inventory_listed_at_unix_nanos: self.inventory_listed_at_unix_ns,
            removals_held: self.removals_held,
        }
    }
}

/// Fleet totals and the coordinator's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SummaryView {
    pub computed_at_unix_nanos: i64,
    pub coordinator_reachable: bool,
    pub coordinator_error: String,
    pub shards_total: usize,
    pub shards_reachable: usize,
    pub machines_by_state: BTreeMap<String, i64>,
    pub sessions: u64,
    pub needs: i64,
    pub unmet_needs: i64,
    pub shortfalls: usize,
    pub domains: usize,
}

/// An unmet need somewhere in the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShortfallView {
    pub shard_id: String,
    /// Empty when unknown (the coordinator's copy carries no cluster).
    pub cluster_id: String,
    pub requirements: Vec<String>,
    pub deficit: BTreeMap<String, String>,
    pub priority: i32,
    pub age_cycles: i32,
    pub interruption_penalty_bucket: String,
}

impl ShortfallView {
    pub fn from_proto(s: &mesh::FleetShortfall) -> Self {
        ShortfallView {
            shard_id: s.shard_id.clone(),
            cluster_id: s.cluster_id.clone(),
            requirements: s.requirements.iter().map(requirement_text).collect(),
            deficit: resources_of(s.deficit.as_ref()),
            priority: s.priority,
            age_cycles: s.age_cycles,
            interruption_penalty_bucket: bucket_name(s.interruption_penalty_bucket),
        }
    }
}

/// One topology domain pinned to a shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainView {
    pub topology_key: String,
    pub topology_value: String,
    pub shard_id: String,
}

impl DomainView {
    pub fn from_proto(d: &pb::DomainAssignment) -> Self {
        DomainView {
            topology_key: d.topology_key.clone(),
            topology_value: d.topology_value.clone(),
            shard_id: d.shard_id.clone(),
        }
    }
}

/// One cross-shard transfer as the coordinator holds it (ADR-0130, ADR-0139).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferView {
    pub transfer_id: String,
    /// `idle`, `speculative` or `drain`.
    pub kind: String,
    /// `release`, `adopt`, `return`, `done` or `failed`.
    pub phase: String,
    pub donor_shard_id: String,
    pub recipient_shard_id: String,
    /// Empty: any instance type.
    pub instance_type: String,
    pub count: u32,
    pub priority: i32,
    pub machine_ids: Vec<String>,
    pub moved: u32,
    /// Empty once finished.
    pub pending_instruction_id: String,
    /// Empty once finished.
    pub pending_shard_id: String,
    pub started_at_unix_ns: i64,
    pub updated_at_unix_ns: i64,
    pub reason: String,
}

impl TransferView {
    pub fn from_proto(t: &mesh::TransferInfo) -> Self {
        TransferView {
            transfer_id: t.transfer_id.clone(),
            kind: t.kind.clone(),
            phase: t.phase.clone(),
            donor_shard_id: t.donor_shard_id.clone(),
            recipient_shard_id: t.recipient_shard_id.clone(),
            instance_type: t.instance_type.clone(),
            count: t.count,
            priority: t.priority,
            machine_ids: t.machine_ids.clone(),
            moved: t.moved,
            pending_instruction_id: t.pending_instruction_id.clone(),
            pending_shard_id: t.pending_shard_id.clone(),
            started_at_unix_ns: t.started_at_unix_ns,
            updated_at_unix_ns: t.updated_at_unix_ns,
            reason: t.reason.clone(),
        }
    }

    /// `2 x gpu` / `2 x any`: what the release asked for.
    pub fn selector_text(&self) -> String {
        let ty = if self.instance_type.is_empty() {
            "any"
        } else {
            self.instance_type.as_str()
        };
        format!("{} x {ty}", self.count)
    }

    pub fn is_active(&self) -> bool {
        !self.pending_instruction_id.is_empty()
    }
}

/// One shard's topology domains and unacknowledged instructions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardOwnershipView {
    pub shard_id: String,
    /// `key=value`, sorted.
    pub domains: Vec<String>,
    pub pending_instruction_ids: Vec<String>,
}

/// The coordinator's transfer picture: active transfers, recent ones (newest first) and
/// each shard's domains.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransfersView {
    pub active: Vec<TransferView>,
    pub recent: Vec<TransferView>,
    pub shards: Vec<ShardOwnershipView>,
}

impl TransfersView {
    pub fn from_proto(r: &mesh::ListTransfersResponse) -> Self {
        TransfersView {
            active: r.active.iter().map(TransferView::from_proto).collect(),
            recent: r.recent.iter().map(TransferView::from_proto).collect(),
            shards: r
                .shards
                .iter()
                .map(|s| ShardOwnershipView {
                    shard_id: s.shard_id.clone(),
                    domains: s
                        .domains
                        .iter()
                        .map(|d| format!("{}={}", d.topology_key, d.topology_value))
                        .collect(),
                    pending_instruction_ids: s.pending_instruction_ids.clone(),
                })
                .collect(),
        }
    }

    /// Finished transfers that moved machines (`done` with `moved > 0`), and finished
    /// drains — what `bigfleet up` counts.
    pub fn counts(&self) -> (usize, usize) {
        let done = |t: &&TransferView| t.phase == "done";
        let moved = self
            .recent
            .iter()
            .filter(done)
            .filter(|t| t.moved > 0)
            .count();
        let drains = self
            .recent
            .iter()
            .filter(done)
            .filter(|t| t.kind == "drain")
            .count();
        (moved, drains)
    }
}

/// One cluster found on the shards, with its demand counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster_id: String,
    /// Shards holding demand of this cluster (normally exactly one).
    pub shards: Vec<String>,
    pub needs: u32,
    pub unmet_needs: u32,
    /// Highest priority among its needs.
    pub max_priority: i32,
    /// Longest consecutive unmet streak among its needs, in cycles.
    pub max_age_cycles_unmet: i32,
}

/// How one shard answered a fan-out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFetchView {
    pub shard_id: String,
    pub address: String,
    pub reachable: bool,
    pub error: String,
    /// The shard's header (zeros when unreachable).
    pub cycle: i64,
    pub computed_at_unix_nanos: i64,
    pub total_needs: i32,
}

/// A cluster's needs page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterNeedsView {
    pub cluster_id: String,
    pub unmet_only: bool,
    pub computed_at_unix_nanos: i64,
    pub coordinator_error: String,
    pub shards: Vec<ShardFetchView>,
    /// Satisfied and unmet counts over all of the cluster's rows (before the unmet filter).
    pub satisfied: usize,
    pub unmet: usize,
    pub needs: Page<NeedRow>,
}

/// A need with its last-cycle verdict.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NeedRow {
    /// The shard that holds the row (absent when read through a fleet-wide ShardRead, which
    /// does not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_id: Option<String>,
    pub cluster_id: String,
    pub priority: i32,
    pub arrival_unix_nanos: i64,
    pub profile_fingerprint: String,
    pub satisfied: bool,
    /// `PRIORITY_STARVED`, `NO_MATCHING_SUPPLY`, `TOPOLOGY_UNSATISFIABLE`,
    /// `PREEMPTION_EXHAUSTED`; empty when satisfied or unclassified.
    pub unmet_reason: String,
    pub requirements: Vec<String>,
    pub aggregate_resources: BTreeMap<String, String>,
    pub min_unit: BTreeMap<String, String>,
    pub residual_deficit: BTreeMap<String, String>,
    pub spread: Vec<String>,
    pub group: String,
    pub interruption_penalty_bucket: String,
    pub reclamation_penalty_bucket: String,
    pub claimed_machine_count: i32,
    pub bootstrap_count: i32,
    pub provision_count: i32,
    pub same_domain: String,
    pub same_satisfiable: bool,
    pub acquisition_parked: bool,
    pub parked_age_cycles: i32,
    pub age_cycles_unmet: i32,
    pub matching_supply: Option<SupplyView>,
    pub preemption: Option<PreemptionView>,
    pub same_candidates: Vec<CandidateView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SupplyView {
    pub idle: i32,
    pub configured: i32,
    pub speculative: i32,
    pub capped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionView {
    pub victims_found: i32,
    pub capacity_freed: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CandidateView {
    pub domain: String,
    pub coverage_per_mille: i32,
    pub satisfiable: bool,
}

impl NeedRow {
    pub fn from_proto(shard_id: Option<&str>, v: &pb::NeedView) -> Self {
        let need = v.need.clone().unwrap_or_default();
        NeedRow {
            shard_id: shard_id.map(str::to_owned),
            cluster_id: v.cluster_id.clone(),
            priority: need.priority,
            arrival_unix_nanos: v.arrival_unix_nanos,
            profile_fingerprint: v.profile_fingerprint.clone(),
            satisfied: v.satisfied,
            unmet_reason: reason_name(v.unmet_reason),
            requirements: need.requirements.iter().map(requirement_text).collect(),
            aggregate_resources: sorted(&need.aggregate_resources),
            min_unit: sorted(&need.min_unit),
            residual_deficit: resources_of(v.residual_deficit.as_ref()),
            spread: need.spread.iter().map(spread_text).collect(),
            group: need.group.clone(),
            interruption_penalty_bucket: bucket_name(need.interruption_penalty_bucket),
            reclamation_penalty_bucket: bucket_name(need.reclamation_penalty_bucket),
            claimed_machine_count: v.claimed_machine_count,
            bootstrap_count: v.bootstrap_count,
            provision_count: v.provision_count,
            same_domain: v.same_domain.clone(),
            same_satisfiable: v.same_satisfiable,
            acquisition_parked: v.acquisition_parked,
            parked_age_cycles: v.parked_age_cycles,
            age_cycles_unmet: v.age_cycles_unmet,
            matching_supply: v.matching_supply.as_ref().map(|m| SupplyView {
                idle: m.idle,
                configured: m.configured,
                speculative: m.speculative,
                capped: m.capped,
            }),
            preemption: v.preemption.as_ref().map(|p| PreemptionView {
                victims_found: p.victims_found,
                capacity_freed: resources_of(p.capacity_freed.as_ref()),
            }),
            same_candidates: v
                .same_candidates
                .iter()
                .map(|c| CandidateView {
                    domain: c.domain.clone(),
                    coverage_per_mille: c.coverage_per_mille,
                    satisfiable: c.satisfiable,
                })
                .collect(),
        }
    }
}

/// Machine states in lifecycle order, for stable columns.
pub const MACHINE_STATES: [pb::MachineState; 8] = [
    pb::MachineState::Speculative,
    pb::MachineState::Creating,
    pb::MachineState::Idle,
    pb::MachineState::Configuring,
    pb::MachineState::Configured,
    pb::MachineState::Draining,
    pb::MachineState::Deleting,
    pb::MachineState::Failed,
];

/// `MACHINE_STATE_IDLE` ⇒ `IDLE`.
pub fn short_state(key: &str) -> &str {
    key.strip_prefix("MACHINE_STATE_").unwrap_or(key)
}

/// `UNMET_REASON_PRIORITY_STARVED` ⇒ `PRIORITY_STARVED`; unspecified ⇒ empty.
pub fn reason_name(value: i32) -> String {
    match pb::UnmetReason::try_from(value) {
        Ok(pb::UnmetReason::Unspecified) => String::new(),
        Ok(r) => r
            .as_str_name()
            .trim_start_matches("UNMET_REASON_")
            .to_owned(),
        Err(_) => format!("UNKNOWN({value})"),
    }
}

/// `PENALTY_BUCKET_1024` ⇒ `1024`; unspecified ⇒ empty.
pub fn bucket_name(value: i32) -> String {
    match pb::PenaltyBucket::try_from(value) {
        Ok(pb::PenaltyBucket::Unspecified) => String::new(),
        Ok(b) => b
            .as_str_name()
            .trim_start_matches("PENALTY_BUCKET_")
            .to_owned(),
        Err(_) => format!("UNKNOWN({value})"),
    }
}

/// `zone In [a, b]`, `rack Same`, `gpu Exists`.
pub fn requirement_text(r: &pb::NodeSelectorRequirement) -> String {
    use pb::node_selector_requirement::Operator;
    let op = match Operator::try_from(r.operator) {
        Ok(Operator::In) => "In",
        Ok(Operator::NotIn) => "NotIn",
        Ok(Operator::Exists) => "Exists",
        Ok(Operator::DoesNotExist) => "DoesNotExist",
        Ok(Operator::Same) => "Same",
        Ok(Operator::Unspecified) | Err(_) => "?",
    };
    if r.values.is_empty() {
        format!("{} {op}", r.key)
    } else {
        format!("{} {op} [{}]", r.key, r.values.join(", "))
    }
}

/// `zone skew 1 (hard)`.
pub fn spread_text(s: &pb::TopologySpread) -> String {
    use pb::topology_spread::WhenUnsatisfiable;
    let mode = match WhenUnsatisfiable::try_from(s.when_unsatisfiable) {
        Ok(WhenUnsatisfiable::DoNotSchedule) => "hard",
        Ok(WhenUnsatisfiable::ScheduleAnyway) => "soft",
        _ => "?",
    };
    format!("{} skew {} ({mode})", s.topology_key, s.max_skew)
}

/// `cpu=96, memory=768Gi` (sorted by name, quantities the way people write them — the wire
/// carries canonical integers such as `memory=824633720832`); empty map ⇒ empty string.
pub fn resources_text(map: &BTreeMap<String, String>) -> String {
    map.iter()
        .map(|(k, v)| match bigfleet_model::parse_quantity(v) {
            Ok(milli) => format!("{k}={}", bigfleet_model::format_for_people(milli)),
            Err(_) => format!("{k}={v}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn sorted(map: &HashMap<String, String>) -> BTreeMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn resources_of(r: Option<&pb::Resources>) -> BTreeMap<String, String> {
    r.map(|r| r.resources.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transfer(kind: &str, phase: &str, moved: u32) -> mesh::TransferInfo {
        mesh::TransferInfo {
            transfer_id: format!("{kind}-{phase}-{moved}"),
            kind: kind.into(),
            phase: phase.into(),
            moved,
            count: 2,
            ..Default::default()
        }
    }

    #[test]
    fn transfers_count_what_moved_and_the_drains() {
        let v = TransfersView::from_proto(&mesh::ListTransfersResponse {
            active: vec![mesh::TransferInfo {
                pending_instruction_id: "i1".into(),
                ..transfer("idle", "release", 0)
            }],
            recent: vec![
                transfer("idle", "done", 2),
                // Done without moving anything (the donor had nothing to release).
                transfer("idle", "done", 0),
                transfer("idle", "failed", 0),
                transfer("drain", "done", 0),
            ],
            shards: vec![mesh::ShardOwnership {
                shard_id: "s1".into(),
                domains: vec![mesh::OwnedDomain {
                    topology_key: "zone".into(),
                    topology_value: "z1".into(),
                }],
                pending_instruction_ids: vec!["i1".into()],
            }],
        });
        assert_eq!(v.counts(), (1, 1));
        assert!(v.active[0].is_active() && !v.recent[0].is_active());
        assert_eq!(v.shards[0].domains, ["zone=z1"]);
        assert_eq!(v.active[0].selector_text(), "2 x any");
    }

    #[test]
    fn pages_slice_and_clamp() {
        let items: Vec<u32> = (0..7).collect();
        let p = Page::of(&items, 1, 3);
        assert_eq!((p.items.clone(), p.pages, p.total), (vec![0, 1, 2], 3, 7));
        assert_eq!(Page::of(&items, 3, 3).items, vec![6]);
        let clamped = Page::of(&items, 99, 3);
        assert_eq!((clamped.page, clamped.items), (3, vec![6]));
        let empty = Page::<u32>::of(&[], 5, 50);
        assert_eq!((empty.page, empty.pages, empty.items.len()), (1, 1, 0));
        assert_eq!(
            Page::of(&items, 0, 0).items,
            vec![0],
            "page size 0 acts as 1"
        );
    }

    #[test]
    fn names_drop_their_prefixes() {
        assert_eq!(
            reason_name(pb::UnmetReason::PriorityStarved as i32),
            "PRIORITY_STARVED"
        );
        assert_eq!(reason_name(0), "");
        assert_eq!(reason_name(99), "UNKNOWN(99)");
        assert_eq!(bucket_name(pb::PenaltyBucket::Pinned as i32), "PINNED");
        assert_eq!(short_state("MACHINE_STATE_CONFIGURED"), "CONFIGURED");
    }

    #[test]
    fn requirements_render_readably() {
        let r = pb::NodeSelectorRequirement {
            key: "zone".into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec!["a".into(), "b".into()],
        };
        assert_eq!(requirement_text(&r), "zone In [a, b]");
        let same = pb::NodeSelectorRequirement {
            key: "rack".into(),
            operator: pb::node_selector_requirement::Operator::Same as i32,
            values: vec![],
        };
        assert_eq!(requirement_text(&same), "rack Same");
    }

    #[test]
    fn need_rows_carry_the_verdict() {
        let v = pb::NeedView {
            need: Some(pb::CapacityNeed {
                priority: 7,
                aggregate_resources: [("nvidia.com/gpu".to_owned(), "256".to_owned())].into(),
                ..Default::default()
            }),
            cluster_id: "c1".into(),
            satisfied: false,
            unmet_reason: pb::UnmetReason::NoMatchingSupply as i32,
            residual_deficit: Some(pb::Resources {
                resources: [("nvidia.com/gpu".to_owned(), "64".to_owned())].into(),
            }),
            matching_supply: Some(pb::MatchingSupply {
                idle: 0,
                configured: 0,
                speculative: 0,
                capped: false,
            }),
            ..Default::default()
        };
        let row = NeedRow::from_proto(Some("s1"), &v);
        assert_eq!(row.priority, 7);
        assert_eq!(row.unmet_reason, "NO_MATCHING_SUPPLY");
        assert_eq!(resources_text(&row.residual_deficit), "nvidia.com/gpu=64");
        let raw: BTreeMap<String, String> = [
            ("cpu".to_owned(), "96".to_owned()),
            ("memory".to_owned(), "274877906944".to_owned()),
            ("example.com/odd".to_owned(), "lots".to_owned()),
        ]
        .into();
        assert_eq!(
            resources_text(&raw),
            "cpu=96, example.com/odd=lots, memory=256Gi"
        );
        assert_eq!(row.shard_id.as_deref(), Some("s1"));
        let json = serde_json::to_string(&row).unwrap();
        let back: NeedRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back, row);
        let anonymous = serde_json::to_value(NeedRow::from_proto(None, &v)).unwrap();
        assert!(anonymous.get("shard_id").is_none());
    }
}

/// One action and what became of it (`GET /api/v1/actions`), as in
/// `bigfleet.mesh.v1.ActionRecord`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionView {
    pub shard_id: String,
    pub seq: u64,
    pub cycle: i64,
    pub kind: String,
    pub reason: String,
    pub machine_id: String,
    pub cluster_id: String,
    pub need_fingerprint: String,
    pub group: String,
    pub priority: i32,
    pub grace_seconds: f64,
    pub action_id: String,
    pub outcome: String,
    pub decided_at_unix_nanos: i64,
    pub started_at_unix_nanos: i64,
    pub finished_at_unix_nanos: i64,
    pub run_nanos: i64,
}

impl ActionView {
    pub fn from_proto(a: &mesh::ActionRecord) -> Self {
        ActionView {
            shard_id: a.shard_id.clone(),
            seq: a.seq,
            cycle: a.cycle,
            kind: a.kind.clone(),
            reason: a.reason.clone(),
            machine_id: a.machine_id.clone(),
            cluster_id: a.cluster_id.clone(),
            need_fingerprint: a.need_fingerprint.clone(),
            group: a.group.clone(),
            priority: a.priority,
            grace_seconds: a.grace_seconds,
            action_id: a.action_id.clone(),
            outcome: a.outcome.clone(),
            decided_at_unix_nanos: a.decided_at_unix_nanos,
            started_at_unix_nanos: a.started_at_unix_nanos,
            finished_at_unix_nanos: a.finished_at_unix_nanos,
            run_nanos: a.run_nanos,
        }
    }
}

/// One machine (`GET /api/v1/machines`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineView {
    pub shard_id: String,
    pub id: String,
    /// MachineState value name, e.g. `MACHINE_STATE_IDLE`.
    pub state: String,
    pub cluster: String,
    pub instance_type: String,
    pub zone: String,
    /// CapacityType value name.
    pub capacity_type: String,
    pub price_per_hour: f64,
    pub labels: BTreeMap<String, String>,
    pub last_error: String,
    /// Zero unless Idle.
    pub idle_since_unix_nanos: i64,
}

impl MachineView {
    pub fn from_proto(row: &mesh::MachineRow) -> Self {
        let m = row.machine.clone().unwrap_or_default();
        MachineView {
            shard_id: row.shard_id.clone(),
            state: pb::MachineState::try_from(m.state)
                .map_or("MACHINE_STATE_UNSPECIFIED", |s| s.as_str_name())
                .to_owned(),
            capacity_type: pb::CapacityType::try_from(m.capacity_type)
                .map_or("CAPACITY_TYPE_UNSPECIFIED", |c| c.as_str_name())
                .to_owned(),
            id: m.id,
            cluster: m.cluster,
            instance_type: m.instance_type,
            zone: m.zone,
            price_per_hour: m.price_per_hour,
            labels: m.labels.into_iter().collect(),
            last_error: m.last_error,
            idle_since_unix_nanos: row.idle_since_unix_nanos,
        }
    }
}

/// Shards that did not answer a fan-out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardErrorView {
    pub shard_id: String,
    pub error: String,
}

impl ShardErrorView {
    pub fn from_proto(e: &mesh::ShardError) -> Self {
        ShardErrorView {
            shard_id: e.shard_id.clone(),
            error: e.error.clone(),
        }
    }
}
