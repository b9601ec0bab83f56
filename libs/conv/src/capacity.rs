//! `capacity.proto` ↔ model: requirements, spread, penalty buckets, needs and roll-ups.

use crate::error::ConvError;
use crate::limits::{Limit, RollupLimits, key_path, qualified_name_problem};
use bigfleet_model::{
    ClusterId, INSTANCE_TYPE_KEY, Need, Operator, PenaltyBucket, Profile, ReleaseSelector,
    Requirement, ResourceVector, TopologySpread, WhenUnsatisfiable, parse_quantity,
};
use bigfleet_proto::v1alpha1 as pb;
use std::collections::HashSet;

/// Characters that separate fields inside a profile fingerprint. Kubernetes
/// label keys and values never contain them; rejecting them keeps "equal
/// fingerprints ⇔ equal profiles" true for everything that gets in.
const RESERVED: [char; 4] = ['|', ';', ':', ','];

fn check_token(path: impl FnOnce() -> String, value: &str) -> Result<(), ConvError> {
    if value.contains(RESERVED) {
        return Err(ConvError::ReservedCharacter {
            path: path(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

/// The limits of one conversion plus what it has counted so far across needs.
struct Gate<'a> {
    limits: RollupLimits,
    /// Distinct resource names seen so far. SipHash (std's randomly keyed default), not a
    /// fast unkeyed hash: the names are chosen by the sender.
    dims: HashSet<&'a str>,
}

impl<'a> Gate<'a> {
    fn new(limits: &RollupLimits) -> Self {
        Gate {
            limits: *limits,
            dims: HashSet::new(),
        }
    }

    /// `count` items at `path` against `max`.
    fn count(
        &self,
        limit: Limit,
        max: usize,
        path: impl FnOnce() -> String,
        count: usize,
    ) -> Result<(), ConvError> {
        if count > max {
            return Err(ConvError::LimitExceeded {
                limit,
                path: path(),
                value: count,
                max,
            });
        }
        Ok(())
    }

    /// The byte length of one string. Checked before anything else reads the string, so
    /// every later error that echoes a value echoes at most `max_string_bytes`.
    fn string(&self, path: impl FnOnce() -> String, value: &str) -> Result<(), ConvError> {
        self.count(
            Limit::StringBytes,
            self.limits.max_string_bytes,
            path,
            value.len(),
        )
    }

    /// Counts a resource name towards the roll-up's distinct dimensions.
    fn dimension(&mut self, path: impl FnOnce() -> String, name: &'a str) -> Result<(), ConvError> {
        if self.dims.insert(name) {
            self.count(
                Limit::Dimensions,
                self.limits.max_dimensions,
                path,
                self.dims.len(),
            )?;
        }
        Ok(())
    }
}

/// One full-replacement demand roll-up, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Rollup {
    pub cluster: ClusterId,
    /// The operator's wall clock when it built the roll-up.
    pub timestamp_unix_nanos: i64,
    /// In wire order, not re-aggregated. `arrival_unix_nanos` is 0 (unknown):
    /// the shard stamps first-seen times when it applies the roll-up.
    pub needs: Vec<Need>,
}

/// [`rollup_from_proto_with`] under the default [`RollupLimits`].
pub fn rollup_from_proto(msg: &pb::ClusterCapacityNeeds) -> Result<Rollup, ConvError> {
    rollup_from_proto_with(msg, &RollupLimits::default())
}

/// Validates and converts a roll-up. Any bad field or broken limit rejects the WHOLE
/// roll-up (the shard keeps the previous demand); the error names the need, the field and
/// the value (or the limit, the count and the bound). Needs are checked in wire order and
/// the first problem wins; counts are checked before the items they count are read.
pub fn rollup_from_proto_with(
    msg: &pb::ClusterCapacityNeeds,
    limits: &RollupLimits,
) -> Result<Rollup, ConvError> {
    if msg.cluster_id.is_empty() {
        return Err(ConvError::EmptyClusterId);
    }
    let mut gate = Gate::new(limits);
    gate.string(|| "cluster_id".to_owned(), &msg.cluster_id)?;
    gate.count(
        Limit::Needs,
        limits.max_needs,
        || "needs".to_owned(),
        msg.needs.len(),
    )?;
    let mut needs = Vec::with_capacity(msg.needs.len());
    for (i, n) in msg.needs.iter().enumerate() {
        needs.push(need_at(
            &format!("needs[{i}]"),
            &msg.cluster_id,
            n,
            &mut gate,
        )?);
    }
    Ok(Rollup {
        cluster: msg.cluster_id.clone(),
        timestamp_unix_nanos: msg.timestamp_unix_nanos,
        needs,
    })
}

/// The wire form of a roll-up (canonical order of requirements and values).
pub fn rollup_to_proto(rollup: &Rollup) -> pb::ClusterCapacityNeeds {
    pb::ClusterCapacityNeeds {
        cluster_id: rollup.cluster.clone(),
        timestamp_unix_nanos: rollup.timestamp_unix_nanos,
        needs: rollup.needs.iter().map(need_to_proto).collect(),
    }
}

/// Validates one `CapacityNeed` of `cluster` (paths start with `need`) under the default
/// [`RollupLimits`].
pub fn need_from_proto(cluster: &str, need: &pb::CapacityNeed) -> Result<Need, ConvError> {
    need_at(
        "need",
        cluster,
        need,
        &mut Gate::new(&RollupLimits::default()),
    )
}

fn need_at<'a>(
    path: &str,
    cluster: &str,
    n: &'a pb::CapacityNeed,
    gate: &mut Gate<'a>,
) -> Result<Need, ConvError> {
    // Every count of the need first: nothing below walks a list longer than its bound.
    let l = gate.limits;
    for (limit, max, field, len) in [
        (
            Limit::Requirements,
            l.max_requirements,
            "requirements",
            n.requirements.len(),
        ),
        (Limit::Spreads, l.max_spreads, "spread", n.spread.len()),
        (
            Limit::ResourceEntries,
            l.max_resource_entries,
            "aggregate_resources",
            n.aggregate_resources.len(),
        ),
        (
            Limit::ResourceEntries,
            l.max_resource_entries,
            "min_unit",
            n.min_unit.len(),
        ),
    ] {
        gate.count(limit, max, || format!("{path}.{field}"), len)?;
    }
    if n.priority > l.max_priority {
        return Err(ConvError::PriorityAboveCeiling {
            path: format!("{path}.priority"),
            value: n.priority,
            max: l.max_priority,
        });
    }
    gate.string(|| format!("{path}.group"), &n.group)?;
    let requirements = requirements_in(&format!("{path}.requirements"), &n.requirements, gate)?;
    let spread = n
        .spread
        .iter()
        .enumerate()
        .map(|(i, s)| spread_at(&format!("{path}.spread[{i}]"), s, gate))
        .collect::<Result<Vec<_>, _>>()?;
    let ipb = bucket_at(
        || format!("{path}.interruption_penalty_bucket"),
        n.interruption_penalty_bucket,
    )?;
    let rpb = bucket_at(
        || format!("{path}.reclamation_penalty_bucket"),
        n.reclamation_penalty_bucket,
    )?;
    let aggregate_resources = demand_resources_at(
        &format!("{path}.aggregate_resources"),
        &n.aggregate_resources,
        gate,
    )?;
    let min_unit = demand_resources_at(&format!("{path}.min_unit"), &n.min_unit, gate)?;
    Ok(Need {
        aggregate_resources,
        min_unit,
        group: n.group.clone(),
        ..Need::new(
            cluster,
            Profile::new(requirements, spread, n.priority, ipb, rpb),
        )
    })
}

/// The wire form of a need (cluster and arrival are not part of it).
pub fn need_to_proto(need: &Need) -> pb::CapacityNeed {
    let p = &need.profile;
    pb::CapacityNeed {
        requirements: requirements_to_proto(p.requirements()),
        aggregate_resources: resources_to_map(&need.aggregate_resources),
        priority: p.priority(),
        spread: p.spread().iter().map(spread_to_proto).collect(),
        interruption_penalty_bucket: i32::from(p.interruption_bucket().ordinal()),
        reclamation_penalty_bucket: i32::from(p.reclamation_bucket().ordinal()),
        min_unit: resources_to_map(&need.min_unit),
        group: need.group.clone(),
    }
}

/// Validates a requirement list (paths start with `requirements`), e.g. the
/// one in a `BootstrapRequest`. Not bounded: these lists come from the shard itself,
/// built from demand that already passed [`rollup_from_proto_with`].
pub fn requirements_from_proto(
    reqs: &[pb::NodeSelectorRequirement],
) -> Result<Vec<Requirement>, ConvError> {
    requirements_at("requirements", reqs)
}

/// Unbounded requirement validation (actions and bootstrap requests the shard built).
pub(crate) fn requirements_at(
    path: &str,
    reqs: &[pb::NodeSelectorRequirement],
) -> Result<Vec<Requirement>, ConvError> {
    requirements_in(path, reqs, &mut Gate::new(&RollupLimits::UNBOUNDED))
}

fn requirements_in(
    path: &str,
    reqs: &[pb::NodeSelectorRequirement],
    gate: &mut Gate<'_>,
) -> Result<Vec<Requirement>, ConvError> {
    reqs.iter()
        .enumerate()
        .map(|(i, r)| requirement_at(&format!("{path}[{i}]"), r, gate))
        .collect()
}

/// A key field (a requirement's key, a spread's topology key): present, within the string
/// bound, and a token.
fn required_token(path: &str, value: &str, gate: &Gate<'_>) -> Result<(), ConvError> {
    if value.is_empty() {
        return Err(ConvError::EmptyField {
            path: path.to_owned(),
        });
    }
    gate.string(|| path.to_owned(), value)?;
    check_token(|| path.to_owned(), value)
}

fn requirement_at(
    path: &str,
    r: &pb::NodeSelectorRequirement,
    gate: &Gate<'_>,
) -> Result<Requirement, ConvError> {
    required_token(&format!("{path}.key"), &r.key, gate)?;
    let operator = Operator::from_ordinal(r.operator).ok_or_else(|| ConvError::EnumOutOfRange {
        path: format!("{path}.operator"),
        enum_name: "NodeSelectorRequirement.Operator",
        value: r.operator,
    })?;
    gate.count(
        Limit::Values,
        gate.limits.max_values,
        || format!("{path}.values"),
        r.values.len(),
    )?;
    // Kubernetes node-selector rules: In/NotIn need values (an empty In can
    // never match, so the need could never be served), Exists/DoesNotExist take none.
    let rule = match operator {
        Operator::Unspecified => {
            return Err(ConvError::UnspecifiedOperator {
                path: format!("{path}.operator"),
            });
        }
        Operator::In | Operator::NotIn if r.values.is_empty() => {
            Some("requires at least one value")
        }
        Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
            Some("takes no values")
        }
        _ => None,
    };
    if let Some(rule) = rule {
        return Err(ConvError::OperatorValues {
            path: format!("{path}.values"),
            operator,
            rule,
        });
    }
    for (i, v) in r.values.iter().enumerate() {
        gate.string(|| format!("{path}.values[{i}]"), v)?;
        check_token(|| format!("{path}.values[{i}]"), v)?;
    }
    Ok(Requirement::new(
        r.key.clone(),
        operator,
        r.values.iter().cloned(),
    ))
}

/// The wire form of requirements (already canonical in the model).
pub fn requirements_to_proto(reqs: &[Requirement]) -> Vec<pb::NodeSelectorRequirement> {
    reqs.iter()
        .map(|r| pb::NodeSelectorRequirement {
            key: r.key().to_owned(),
            operator: i32::from(r.operator().ordinal()),
            values: r.values().to_vec(),
        })
        .collect()
}

fn spread_at(
    path: &str,
    s: &pb::TopologySpread,
    gate: &Gate<'_>,
) -> Result<TopologySpread, ConvError> {
    required_token(&format!("{path}.topology_key"), &s.topology_key, gate)?;
    let when = WhenUnsatisfiable::from_ordinal(s.when_unsatisfiable).ok_or_else(|| {
        ConvError::EnumOutOfRange {
            path: format!("{path}.when_unsatisfiable"),
            enum_name: "TopologySpread.WhenUnsatisfiable",
            value: s.when_unsatisfiable,
        }
    })?;
    if s.max_skew < 1 {
        return Err(ConvError::InvalidMaxSkew {
            path: format!("{path}.max_skew"),
            value: s.max_skew,
        });
    }
    Ok(TopologySpread {
        topology_key: s.topology_key.clone(),
        max_skew: s.max_skew,
        when_unsatisfiable: when,
    })
}

fn spread_to_proto(s: &TopologySpread) -> pb::TopologySpread {
    pb::TopologySpread {
        topology_key: s.topology_key.clone(),
        max_skew: s.max_skew,
        when_unsatisfiable: i32::from(s.when_unsatisfiable.ordinal()),
    }
}

/// A wire penalty bucket (`PenaltyBucket` ordinal); Unspecified is accepted and means $0.
pub fn penalty_bucket_from_proto(value: i32) -> Result<PenaltyBucket, ConvError> {
    bucket_at(|| "penalty_bucket".to_owned(), value)
}

fn bucket_at(path: impl FnOnce() -> String, value: i32) -> Result<PenaltyBucket, ConvError> {
    PenaltyBucket::from_ordinal(value).ok_or_else(|| ConvError::EnumOutOfRange {
        path: path(),
        enum_name: "PenaltyBucket",
        value,
    })
}

/// A wire quantity map's entries in name order, so the first error reported does not
/// depend on hash-map order.
fn sorted_entries<'a>(
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<(&'a String, &'a String)> {
    let mut entries: Vec<(&String, &String)> = map.into_iter().collect();
    entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
    entries
}

/// One quantity, non-negative.
fn quantity_at(path: impl Fn() -> String, value: &str) -> Result<i64, ConvError> {
    let milli = parse_quantity(value).map_err(|source| ConvError::Quantity {
        path: path(),
        source,
    })?;
    if milli < 0 {
        return Err(ConvError::NegativeQuantity {
            path: path(),
            value: value.to_owned(),
        });
    }
    Ok(milli)
}

/// Parses a wire quantity map at `path` (`{"cpu": "500m"}`). Unparseable or negative
/// quantities are errors; the reported dimension is the first bad one by name,
/// so the error does not depend on hash-map order.
pub(crate) fn resources_at<'a>(
    path: &str,
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<ResourceVector, ConvError> {
    dims_at(path, map, |_, _, _| Ok(()))
}

/// [`resources_at`] for a need's map: names must be Kubernetes qualified names, strings
/// are bounded and every name counts towards the roll-up's distinct dimensions (the
/// caller has already bounded the number of entries).
fn demand_resources_at<'a>(
    path: &str,
    map: &'a std::collections::HashMap<String, String>,
    gate: &mut Gate<'a>,
) -> Result<ResourceVector, ConvError> {
    dims_at(path, map, |dim_path, name, value| {
        gate.string(dim_path, name)?;
        if let Some(rule) = qualified_name_problem(name) {
            return Err(ConvError::InvalidResourceName {
                path: dim_path(),
                rule,
            });
        }
        gate.string(dim_path, value)?;
        gate.dimension(dim_path, name)
    })
}

/// The entries of a quantity map by name, each named, passed through `check` (with its
/// path, name and value) and parsed.
fn dims_at<'a>(
    path: &str,
    map: impl IntoIterator<Item = (&'a String, &'a String)>,
    mut check: impl FnMut(&dyn Fn() -> String, &'a String, &'a String) -> Result<(), ConvError>,
) -> Result<ResourceVector, ConvError> {
    let entries = sorted_entries(map);
    let mut dims = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        let dim_path = || key_path(path, name);
        if name.is_empty() {
            return Err(ConvError::EmptyField { path: dim_path() });
        }
        check(&dim_path, name, value)?;
        dims.push((name.clone(), quantity_at(dim_path, value)?));
    }
    Ok(ResourceVector::from_milli(dims))
}

/// The release selector (ADR-0142) for a shortfall reported with these requirements and
/// this deficit, pinned to `instance_type` when the shortfall pins one: the resources it
/// still lacks (positive in the deficit) and its requirements. A part that does not
/// validate is left out, which only widens what a donor may give.
pub fn release_selector(
    instance_type: &str,
    requirements: &[pb::NodeSelectorRequirement],
    deficit: Option<&pb::Resources>,
) -> ReleaseSelector {
    let lacking = deficit
        .and_then(|d| resources_at("deficit", &d.resources).ok())
        .map(|v| {
            v.iter()
                .filter(|(_, milli)| *milli > 0)
                .map(|(name, _)| name.to_owned())
                .collect()
        })
        .unwrap_or_default();
    let pinned = (!instance_type.is_empty()).then(|| instance_type.to_owned());
    // The pin itself is the `/<type>` part: no need to say it twice.
    let pin = |r: &Requirement| {
        r.key() == INSTANCE_TYPE_KEY
            && r.operator() == Operator::In
            && pinned
                .as_deref()
                .is_some_and(|t| r.values().iter().any(|v| v == t))
    };
    ReleaseSelector {
        requirements: requirements_from_proto(requirements)
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !pin(r))
            .collect(),
        instance_type: pinned,
        resources: lacking,
    }
}

/// Canonical quantity strings for the wire (into whichever map the message uses).
pub fn resources_to_map<M: FromIterator<(String, String)>>(v: &ResourceVector) -> M {
    v.to_quantity_map().into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::QuantityError;

    fn good_need() -> pb::CapacityNeed {
        pb::CapacityNeed {
            requirements: vec![
                pb::NodeSelectorRequirement {
                    key: "node.kubernetes.io/instance-type".into(),
                    operator: 1,
                    values: vec!["p5".into(), "a100".into()],
                },
                pb::NodeSelectorRequirement {
                    key: "rack".into(),
                    operator: 5,
                    values: vec![],
                },
            ],
            aggregate_resources: std::collections::HashMap::from([
                ("nvidia.com/gpu".into(), "64".into()),
                ("memory".into(), "512Gi".into()),
            ]),
            priority: 1_000_000,
            spread: vec![pb::TopologySpread {
                topology_key: "topology.kubernetes.io/zone".into(),
                max_skew: 1,
                when_unsatisfiable: 1,
            }],
            interruption_penalty_bucket: 16,
            reclamation_penalty_bucket: 0,
            min_unit: std::collections::HashMap::from([("nvidia.com/gpu".into(), "8".into())]),
            group: "rack\0gang-7".into(),
        }
    }

    fn rollup(needs: Vec<pb::CapacityNeed>) -> pb::ClusterCapacityNeeds {
        pb::ClusterCapacityNeeds {
            cluster_id: "cluster-a".into(),
            timestamp_unix_nanos: 42,
            needs,
        }
    }

    /// Applies `edit` to the second need of a two-need roll-up and returns the rejection.
    fn reject(edit: impl FnOnce(&mut pb::CapacityNeed)) -> ConvError {
        let mut bad = good_need();
        edit(&mut bad);
        let err = rollup_from_proto(&rollup(vec![good_need(), bad])).unwrap_err();
        assert_eq!(err.need_index(), Some(1), "{err}");
        err
    }

    #[test]
    fn accepts_a_good_rollup() {
        let r = rollup_from_proto(&rollup(vec![good_need(), good_need()])).unwrap();
        assert_eq!(r.cluster, "cluster-a");
        assert_eq!(r.timestamp_unix_nanos, 42);
        assert_eq!(r.needs.len(), 2);
        let n = &r.needs[0];
        assert_eq!(n.cluster, "cluster-a");
        assert_eq!(n.aggregate_resources.get("nvidia.com/gpu"), 64_000);
        assert_eq!(n.aggregate_resources.get("memory"), 512 * 1_073_741_824_000);
        assert_eq!(n.min_unit.get("nvidia.com/gpu"), 8_000);
        assert_eq!(n.group, "rack\0gang-7");
        assert_eq!(n.arrival_unix_nanos, 0);
        assert!(!n.acquisition_parked);
        assert_eq!(
            n.fingerprint(),
            "p=1000000|ipb=16|rpb=0|reqs=node.kubernetes.io/instance-type:1:a100,p5;rack:5:;\
             |spr=topology.kubernetes.io/zone:1:1;"
        );
        assert_eq!(n.profile.same_requirement_key(), Some("rack"));
    }

    #[test]
    fn empty_rollup_is_a_withdrawal_not_an_error() {
        let r = rollup_from_proto(&rollup(vec![])).unwrap();
        assert!(r.needs.is_empty());
    }

    #[test]
    fn empty_cluster_id() {
        let mut msg = rollup(vec![good_need()]);
        msg.cluster_id.clear();
        let err = rollup_from_proto(&msg).unwrap_err();
        assert_eq!(err, ConvError::EmptyClusterId);
        assert_eq!(err.reason(), "empty_cluster_id");
    }

    #[test]
    fn operator_out_of_range_and_unspecified() {
        for value in [6, -1, i32::MAX] {
            let err = reject(|n| n.requirements[1].operator = value);
            assert_eq!(
                err,
                ConvError::EnumOutOfRange {
                    path: "needs[1].requirements[1].operator".into(),
                    enum_name: "NodeSelectorRequirement.Operator",
                    value
                }
            );
            assert_eq!(err.reason(), "enum_out_of_range");
            assert!(err.to_string().contains(&value.to_string()));
        }
        let err = reject(|n| n.requirements[0].operator = 0);
        assert_eq!(
            err,
            ConvError::UnspecifiedOperator {
                path: "needs[1].requirements[0].operator".into()
            }
        );
        assert_eq!(err.reason(), "unspecified_operator");
    }

    #[test]
    fn operator_value_rules() {
        for (op, values, rule) in [
            (1, vec![], "requires at least one value"),
            (2, vec![], "requires at least one value"),
            (3, vec!["x".to_owned()], "takes no values"),
            (4, vec!["x".to_owned()], "takes no values"),
        ] {
            let err = reject(|n| {
                n.requirements[1].operator = op;
                n.requirements[1].values = values;
            });
            assert!(
                matches!(&err, ConvError::OperatorValues { path, rule: r, .. }
                    if path == "needs[1].requirements[1].values" && *r == rule),
                "{err:?}"
            );
            assert_eq!(err.reason(), "operator_values");
        }
    }

    #[test]
    fn empty_and_reserved_tokens() {
        let err = reject(|n| n.requirements[0].key.clear());
        assert_eq!(
            err,
            ConvError::EmptyField {
                path: "needs[1].requirements[0].key".into()
            }
        );
        for bad in ["a|b", "a;b", "a:b", "a,b"] {
            let err = reject(|n| n.requirements[1].key = bad.into());
            assert_eq!(err.path(), Some("needs[1].requirements[1].key"));
            assert_eq!(err.reason(), "reserved_character");
            let err = reject(|n| n.requirements[0].values[1] = bad.into());
            assert_eq!(err.path(), Some("needs[1].requirements[0].values[1]"));
            let err = reject(|n| n.spread[0].topology_key = bad.into());
            assert_eq!(err.path(), Some("needs[1].spread[0].topology_key"));
        }
        let err = reject(|n| n.spread[0].topology_key.clear());
        assert_eq!(err.path(), Some("needs[1].spread[0].topology_key"));
        assert_eq!(err.reason(), "empty_field");
    }

    #[test]
    fn spread_rules() {
        let err = reject(|n| n.spread[0].when_unsatisfiable = 3);
        assert_eq!(err.path(), Some("needs[1].spread[0].when_unsatisfiable"));
        assert_eq!(err.reason(), "enum_out_of_range");
        for skew in [0, -1] {
            let err = reject(|n| n.spread[0].max_skew = skew);
            assert_eq!(
                err,
                ConvError::InvalidMaxSkew {
                    path: "needs[1].spread[0].max_skew".into(),
                    value: skew
                }
            );
            assert_eq!(err.reason(), "spread");
        }
    }

    #[test]
    fn bucket_out_of_range() {
        for value in [28, -1] {
            let err = reject(|n| n.interruption_penalty_bucket = value);
            assert_eq!(
                err,
                ConvError::EnumOutOfRange {
                    path: "needs[1].interruption_penalty_bucket".into(),
                    enum_name: "PenaltyBucket",
                    value
                }
            );
            let err = reject(|n| n.reclamation_penalty_bucket = value);
            assert_eq!(err.path(), Some("needs[1].reclamation_penalty_bucket"));
        }
        assert_eq!(penalty_bucket_from_proto(27), Ok(PenaltyBucket::Pinned));
        assert_eq!(penalty_bucket_from_proto(0), Ok(PenaltyBucket::Unspecified));
        assert!(penalty_bucket_from_proto(99).is_err());
    }

    #[test]
    fn bad_quantities() {
        let err = reject(|n| {
            n.aggregate_resources.insert("cpu".into(), "lots".into());
            n.aggregate_resources.insert("zzz".into(), "1x".into());
        });
        assert_eq!(
            err,
            ConvError::Quantity {
                path: "needs[1].aggregate_resources[\"cpu\"]".into(),
                source: QuantityError::NoDigits {
                    input: "lots".into()
                }
            }
        );
        assert_eq!(err.reason(), "quantity");
        assert!(err.to_string().contains("lots"));
        let err = reject(|n| {
            n.min_unit.insert("memory".into(), "1Qi".into());
        });
        assert_eq!(err.path(), Some("needs[1].min_unit[\"memory\"]"));
        let err = reject(|n| {
            n.min_unit.insert("cpu".into(), "-1".into());
        });
        assert_eq!(
            err,
            ConvError::NegativeQuantity {
                path: "needs[1].min_unit[\"cpu\"]".into(),
                value: "-1".into()
            }
        );
        let err = reject(|n| {
            n.aggregate_resources.insert(String::new(), "1".into());
        });
        assert_eq!(err.reason(), "empty_field");
    }

    #[test]
    fn first_bad_need_is_reported() {
        let mut a = good_need();
        a.priority = 1;
        let mut b = good_need();
        b.interruption_penalty_bucket = 99;
        let mut c = good_need();
        c.requirements[0].operator = 0;
        let err = rollup_from_proto(&rollup(vec![a, b, c])).unwrap_err();
        assert_eq!(err.need_index(), Some(1));
    }

    #[test]
    fn need_from_proto_uses_a_relative_path() {
        let mut n = good_need();
        n.requirements[0].operator = 0;
        let err = need_from_proto("c", &n).unwrap_err();
        assert_eq!(err.path(), Some("need.requirements[0].operator"));
        assert_eq!(err.need_index(), None);
        assert!(need_from_proto("c", &good_need()).is_ok());
    }

    #[test]
    fn requirements_from_proto_validates() {
        let reqs = good_need().requirements;
        let parsed = requirements_from_proto(&reqs).unwrap();
        assert_eq!(parsed[0].values(), ["a100", "p5"]);
        let mut bad = reqs.clone();
        bad[1].operator = 42;
        assert_eq!(
            requirements_from_proto(&bad).unwrap_err().path(),
            Some("requirements[1].operator")
        );
    }

    #[test]
    fn to_proto_is_canonical() {
        let r = rollup_from_proto(&rollup(vec![good_need()])).unwrap();
        let back = rollup_to_proto(&r);
        let n = &back.needs[0];
        assert_eq!(n.requirements[0].values, ["a100", "p5"]);
        assert_eq!(n.aggregate_resources["memory"], "549755813888");
        assert_eq!(n.interruption_penalty_bucket, 16);
        assert_eq!(rollup_from_proto(&back).unwrap(), r);
    }

    #[test]
    fn a_shortfalls_release_selector_names_what_it_lacks_and_must_match() {
        let reqs = vec![pb::NodeSelectorRequirement {
            key: "topology.kubernetes.io/zone".into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec!["z1".into()],
        }];
        let deficit = pb::Resources {
            resources: [
                ("nvidia.com/gpu".to_owned(), "2".to_owned()),
                ("cpu".to_owned(), "0".to_owned()),
                ("memory".to_owned(), "1Gi".to_owned()),
            ]
            .into(),
        };
        let sel = release_selector("", &reqs, Some(&deficit));
        assert_eq!(
            sel.to_string(),
            "*?needs=memory,nvidia.com/gpu&match=topology.kubernetes.io/zone:In:z1"
        );
        // Pinned type, no deficit on record: the old token (the pin is not said twice).
        let pin = pb::NodeSelectorRequirement {
            key: INSTANCE_TYPE_KEY.into(),
            operator: pb::node_selector_requirement::Operator::In as i32,
            values: vec!["bm.gpu.8".into(), "bm.gpu.4".into()],
        };
        assert_eq!(
            release_selector("bm.gpu.8", &[pin], None).to_string(),
            "*/bm.gpu.8"
        );
        // A deficit that does not parse only widens the choice.
        let bad = pb::Resources {
            resources: [("cpu".to_owned(), "lots".to_owned())].into(),
        };
        assert_eq!(release_selector("", &[], Some(&bad)).to_string(), "*");
    }
}
