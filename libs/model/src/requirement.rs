//! Requirements, topology spread and matching against machines.

use crate::machine::{Machine, MachineProfile};
use crate::wire_enum;
use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::fmt;

/// Label key matched against [`MachineProfile::instance_type`].
pub const INSTANCE_TYPE_KEY: &str = "node.kubernetes.io/instance-type";
/// Label key matched against [`MachineProfile::zone`].
pub const ZONE_KEY: &str = "topology.kubernetes.io/zone";

wire_enum! {
    /// Node-selector operator. Discriminants are the wire ordinals.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
    pub enum Operator {
        /// Never matches anything (and conv rejects it at ingest).
        Unspecified = 0,
        In = 1,
        NotIn = 2,
        Exists = 3,
        DoesNotExist = 4,
        /// Wire-only co-location: every machine of the need shares one value of the key.
        /// Per machine it means "present (and in `values` if any are given)".
        Same = 5,
    }
}

wire_enum! {
    /// Capacity type of a machine. Discriminants are the wire ordinals. It only
    /// drives the idle-release hold (Phase 3).
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
    )]
    pub enum CapacityType {
        #[default]
        Unspecified = 0,
        BareMetal = 1,
        Reserved = 2,
        OnDemand = 3,
        Spot = 4,
    }
}

/// One node-selector requirement. `values` are sorted and de-duplicated at
/// construction, so equal requirements compare (and fingerprint) equal.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "RequirementParts")]
pub struct Requirement {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

#[derive(Deserialize)]
struct RequirementParts {
    key: String,
    operator: Operator,
    values: Vec<String>,
}

impl From<RequirementParts> for Requirement {
    fn from(p: RequirementParts) -> Self {
        Requirement::new(p.key, p.operator, p.values)
    }
}

impl Requirement {
    /// Builds a canonical requirement (values sorted, duplicates dropped).
    pub fn new<S: Into<String>>(
        key: impl Into<String>,
        operator: Operator,
        values: impl IntoIterator<Item = S>,
    ) -> Self {
        let mut values: Vec<String> = values.into_iter().map(Into::into).collect();
        values.sort_unstable();
        values.dedup();
        Requirement {
            key: key.into(),
            operator,
            values,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn operator(&self) -> Operator {
        self.operator
    }

    /// Sorted, unique values.
    pub fn values(&self) -> &[String] {
        &self.values
    }

    fn has_value(&self, v: &str) -> bool {
        self.values.binary_search_by(|x| x.as_str().cmp(v)).is_ok()
    }

    /// Whether one machine profile satisfies this requirement on its own.
    pub fn matches(&self, profile: &MachineProfile) -> bool {
        let attr = profile.attribute(&self.key);
        match self.operator {
            Operator::In => attr.is_some_and(|v| self.has_value(v)),
            Operator::NotIn => attr.is_none_or(|v| !self.has_value(v)),
            Operator::Exists => attr.is_some(),
            Operator::DoesNotExist => attr.is_none(),
            Operator::Same => attr.is_some_and(|v| self.values.is_empty() || self.has_value(v)),
            Operator::Unspecified => false,
        }
    }

    /// The canonical total order: key, operator ordinal, then values
    /// (a full sort, so duplicate `(key, operator)` pairs are still stable and two
    /// requests that list the same requirements in another order fingerprint the same).
    pub fn canonical_cmp(&self, other: &Requirement) -> Ordering {
        self.key
            .cmp(&other.key)
            .then(self.operator.cmp(&other.operator))
            .then_with(|| self.values.cmp(&other.values))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.key,
            self.operator.ordinal(),
            self.values.join(",")
        )
    }
}

wire_enum! {
    /// `TopologySpread.WhenUnsatisfiable`. Discriminants are the wire ordinals.
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
    )]
    pub enum WhenUnsatisfiable {
        #[default]
        Unspecified = 0,
        /// The only mode the engine enforces.
        DoNotSchedule = 1,
        ScheduleAnyway = 2,
    }
}

/// A topology spread constraint carried by a profile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TopologySpread {
    pub topology_key: String,
    pub max_skew: i32,
    pub when_unsatisfiable: WhenUnsatisfiable,
}

impl TopologySpread {
    /// Canonical order: topology key, then skew, then mode (a full sort).
    pub fn canonical_cmp(&self, other: &TopologySpread) -> Ordering {
        self.topology_key
            .cmp(&other.topology_key)
            .then(self.max_skew.cmp(&other.max_skew))
            .then(self.when_unsatisfiable.cmp(&other.when_unsatisfiable))
    }
}

impl fmt::Display for TopologySpread {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.topology_key,
            self.max_skew,
            self.when_unsatisfiable.ordinal()
        )
    }
}

/// Every requirement matches the machine's profile. There is no resource check
/// in matching (ADR-0027): resources are supply math, not eligibility.
pub fn matches_requirements(requirements: &[Requirement], profile: &MachineProfile) -> bool {
    requirements.iter().all(|r| r.matches(profile))
}

/// [`matches_requirements`] against a whole machine record.
pub fn matches_machine(requirements: &[Requirement], machine: &Machine) -> bool {
    matches_requirements(requirements, &machine.profile)
}

/// The instance types a requirement list pins: the values of the FIRST
/// instance-type requirement when it is `In` with at least one value.
pub fn pinned_instance_types(requirements: &[Requirement]) -> Option<&[String]> {
    let first = requirements.iter().find(|r| r.key == INSTANCE_TYPE_KEY)?;
    (first.operator == Operator::In && !first.values.is_empty()).then_some(first.values.as_slice())
}

/// The first `Same` requirement (a profile carries at most one that matters).
pub fn same_requirement(requirements: &[Requirement]) -> Option<&Requirement> {
    requirements.iter().find(|r| r.operator == Operator::Same)
}

/// The first spread constraint with `DoNotSchedule` (the only one enforced).
pub fn strict_spread(spread: &[TopologySpread]) -> Option<&TopologySpread> {
    spread
        .iter()
        .find(|s| s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn profile() -> MachineProfile {
        MachineProfile {
            instance_type: "p5.48xlarge".into(),
            zone: "zone-a".into(),
            labels: BTreeMap::from([
                ("rack".to_owned(), "r1".to_owned()),
                (ZONE_KEY.to_owned(), "label-zone".to_owned()),
            ]),
            ..MachineProfile::default()
        }
    }

    fn req(key: &str, op: Operator, values: &[&str]) -> Requirement {
        Requirement::new(key, op, values.iter().copied())
    }

    #[test]
    fn attribute_lookup_prefers_dedicated_fields() {
        let p = profile();
        assert_eq!(p.attribute(INSTANCE_TYPE_KEY), Some("p5.48xlarge"));
        assert_eq!(p.attribute(ZONE_KEY), Some("zone-a"));
        assert_eq!(p.attribute("rack"), Some("r1"));
        assert_eq!(p.attribute("missing"), None);
        let mut empty_zone = profile();
        empty_zone.zone.clear();
        assert_eq!(empty_zone.attribute(ZONE_KEY), Some("label-zone"));
        empty_zone.instance_type.clear();
        assert_eq!(empty_zone.attribute(INSTANCE_TYPE_KEY), None);
    }

    #[test]
    fn operator_semantics() {
        let p = profile();
        let cases = [
            (req("rack", Operator::In, &["r1", "r2"]), true),
            (req("rack", Operator::In, &["r2"]), false),
            (req("missing", Operator::In, &["r1"]), false),
            (req("rack", Operator::NotIn, &["r2"]), true),
            (req("rack", Operator::NotIn, &["r1"]), false),
            (req("missing", Operator::NotIn, &["r1"]), true),
            (req("rack", Operator::Exists, &[]), true),
            (req("missing", Operator::Exists, &[]), false),
            (req("rack", Operator::DoesNotExist, &[]), false),
            (req("missing", Operator::DoesNotExist, &[]), true),
            (req("rack", Operator::Same, &[]), true),
            (req("rack", Operator::Same, &["r1"]), true),
            (req("rack", Operator::Same, &["r9"]), false),
            (req("missing", Operator::Same, &[]), false),
            (req("rack", Operator::Unspecified, &["r1"]), false),
            (req(INSTANCE_TYPE_KEY, Operator::In, &["p5.48xlarge"]), true),
        ];
        for (r, want) in cases {
            assert_eq!(r.matches(&p), want, "{r}");
        }
        assert!(matches_requirements(&[], &p));
        assert!(!matches_requirements(
            &[
                req("rack", Operator::Exists, &[]),
                req("x", Operator::Exists, &[])
            ],
            &p
        ));
    }

    #[test]
    fn values_are_sorted_and_unique() {
        let r = req("k", Operator::In, &["b", "a", "b"]);
        assert_eq!(r.values(), ["a", "b"]);
        assert_eq!(r.to_string(), "k:1:a,b");
        let json = r#"{"key":"k","operator":"In","values":["z","a"]}"#;
        let parsed: Requirement = serde_json::from_str(json).unwrap();
        assert_eq!(parsed.values(), ["a", "z"]);
    }

    #[test]
    fn pinned_types_use_the_first_instance_type_requirement() {
        let pin = req(INSTANCE_TYPE_KEY, Operator::In, &["b", "a"]);
        assert_eq!(
            pinned_instance_types(&[req("x", Operator::Exists, &[]), pin.clone()]),
            Some(&["a".to_owned(), "b".to_owned()][..])
        );
        let not_in = req(INSTANCE_TYPE_KEY, Operator::NotIn, &["a"]);
        assert_eq!(pinned_instance_types(&[not_in, pin.clone()]), None);
        assert_eq!(
            pinned_instance_types(&[req(INSTANCE_TYPE_KEY, Operator::In, &[])]),
            None
        );
        assert_eq!(pinned_instance_types(&[]), None);
    }

    #[test]
    fn same_key_and_strict_spread_take_the_first() {
        let reqs = [
            req("a", Operator::Exists, &[]),
            req("rack", Operator::Same, &[]),
            req("zone", Operator::Same, &[]),
        ];
        assert_eq!(same_requirement(&reqs).map(Requirement::key), Some("rack"));
        assert_eq!(same_requirement(&reqs[..1]), None);
        let spread = [
            TopologySpread {
                topology_key: "z".into(),
                max_skew: 1,
                when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
            },
            TopologySpread {
                topology_key: "r".into(),
                max_skew: 2,
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            },
        ];
        assert_eq!(strict_spread(&spread).map(|s| s.max_skew), Some(2));
        assert_eq!(strict_spread(&spread[..1]), None);
    }

    #[test]
    fn enum_ordinals() {
        for i in 0..6 {
            assert_eq!(
                Operator::from_ordinal(i).map(|o| i32::from(o.ordinal())),
                Some(i)
            );
        }
        assert_eq!(Operator::from_ordinal(6), None);
        for i in 0..5 {
            assert_eq!(
                CapacityType::from_ordinal(i).map(|o| i32::from(o.ordinal())),
                Some(i)
            );
        }
        assert_eq!(CapacityType::from_ordinal(5), None);
        for i in 0..3 {
            assert_eq!(
                WhenUnsatisfiable::from_ordinal(i).map(|o| i32::from(o.ordinal())),
                Some(i)
            );
        }
        assert_eq!(WhenUnsatisfiable::from_ordinal(3), None);
        assert_eq!(CapacityType::from_ordinal(4), Some(CapacityType::Spot));
    }
}
