//! Every roll-up bound (ADR-0104): a roll-up exactly at the bound is accepted, one item over
//! is rejected whole, and the error names the limit, the count, the bound and where.

use bigfleet_conv::*;
use bigfleet_proto::v1alpha1 as pb;
use proptest::prelude::*;
use std::collections::HashMap;

const CLUSTER: &str = "c-1";

fn exists(key: String) -> pb::NodeSelectorRequirement {
    pb::NodeSelectorRequirement {
        key,
        operator: 3,
        values: vec![],
    }
}

fn in_values(key: &str, values: Vec<String>) -> pb::NodeSelectorRequirement {
    pb::NodeSelectorRequirement {
        key: key.to_owned(),
        operator: 1,
        values,
    }
}

fn spread(key: String) -> pb::TopologySpread {
    pb::TopologySpread {
        topology_key: key,
        max_skew: 1,
        when_unsatisfiable: 1,
    }
}

fn plain_need() -> pb::CapacityNeed {
    pb::CapacityNeed {
        requirements: vec![in_values("rack", vec!["r1".into()])],
        aggregate_resources: HashMap::from([("cpu".into(), "4".into())]),
        priority: 100,
        spread: vec![spread("zone".into())],
        interruption_penalty_bucket: 1,
        reclamation_penalty_bucket: 1,
        min_unit: HashMap::from([("cpu".into(), "1".into())]),
        group: String::new(),
    }
}

fn rollup(needs: Vec<pb::CapacityNeed>) -> pb::ClusterCapacityNeeds {
    pb::ClusterCapacityNeeds {
        cluster_id: CLUSTER.into(),
        timestamp_unix_nanos: 1,
        needs,
    }
}

/// Three plain needs with `edit` applied to need `k` only.
fn with_need(k: usize, edit: impl FnOnce(&mut pb::CapacityNeed)) -> pb::ClusterCapacityNeeds {
    with_needs(k, |_| {}, edit)
}

/// Three plain needs with `base` applied to each (so bounds down to 0 hold for the others)
/// and then `edit` to need `k`.
fn with_needs(
    k: usize,
    base: impl Fn(&mut pb::CapacityNeed),
    edit: impl FnOnce(&mut pb::CapacityNeed),
) -> pb::ClusterCapacityNeeds {
    let mut needs = vec![plain_need(), plain_need(), plain_need()];
    needs.iter_mut().for_each(&base);
    edit(&mut needs[k]);
    rollup(needs)
}

/// `build(max)` passes under `limits`; `build(max + 1)` is rejected with exactly the limit
/// error, naming `path` and the value `max + 1`.
fn assert_bound(
    limits: &RollupLimits,
    build: impl Fn(usize) -> pb::ClusterCapacityNeeds,
    limit: Limit,
    path: &str,
    max: usize,
) -> Result<(), TestCaseError> {
    let value = max + 1;
    if let Err(e) = rollup_from_proto_with(&build(max), limits) {
        return Err(TestCaseError::fail(format!("at the bound: {e}")));
    }
    let err = match rollup_from_proto_with(&build(value), limits) {
        Ok(_) => return Err(TestCaseError::fail("over the bound was accepted")),
        Err(e) => e,
    };
    prop_assert_eq!(
        &err,
        &ConvError::LimitExceeded {
            limit,
            path: path.to_owned(),
            value,
            max,
        }
    );
    prop_assert_eq!(err.reason(), limit.reason());
    let text = err.to_string();
    prop_assert!(text.contains(limit.name()), "{}", text);
    prop_assert!(text.contains(path), "{}", text);
    prop_assert!(
        text.starts_with(&format!("{} = {max} exceeded at ", limit.name())),
        "{}",
        text
    );
    prop_assert!(
        text.ends_with(&format!(
            ": {value} {}",
            match limit {
                Limit::Needs => "needs",
                Limit::Requirements => "requirements",
                Limit::Values => "values",
                Limit::Spreads => "spreads",
                Limit::ResourceEntries => "entries",
                Limit::StringBytes => "bytes",
                Limit::Dimensions | Limit::ShardDimensions => "distinct resource names",
            }
        )),
        "{}",
        text
    );
    Ok(())
}

fn limits(edit: impl FnOnce(&mut RollupLimits)) -> RollupLimits {
    let mut l = RollupLimits::default();
    edit(&mut l);
    l
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn needs_per_rollup(max in 0usize..40) {
        let l = limits(|l| l.max_needs = max);
        assert_bound(&l, |m| rollup(vec![plain_need(); m]), Limit::Needs, "needs", max)?;
    }

    #[test]
    fn requirements_per_need(max in 0usize..24, k in 0usize..3) {
        let l = limits(|l| l.max_requirements = max);
        let reqs = |n: usize| (0..n).map(|i| exists(format!("k{i}"))).collect::<Vec<_>>();
        let build = |m| with_needs(k, |n| n.requirements.clear(), |n| n.requirements = reqs(m));
        assert_bound(&l, build, Limit::Requirements, &format!("needs[{k}].requirements"), max)?;
    }

    #[test]
    fn values_per_requirement(max in 1usize..64, k in 0usize..3) {
        let l = limits(|l| l.max_values = max);
        let vals = |n: usize| (0..n).map(|i| format!("v{i}")).collect::<Vec<_>>();
        let build = |m| with_need(k, |n| n.requirements.push(in_values("model", vals(m))));
        assert_bound(&l, build, Limit::Values, &format!("needs[{k}].requirements[1].values"), max)?;
    }

    #[test]
    fn spreads_per_need(max in 0usize..20, k in 0usize..3) {
        let l = limits(|l| l.max_spreads = max);
        let spreads = |n: usize| (0..n).map(|i| spread(format!("t{i}"))).collect::<Vec<_>>();
        let build = |m| with_needs(k, |n| n.spread.clear(), |n| n.spread = spreads(m));
        assert_bound(&l, build, Limit::Spreads, &format!("needs[{k}].spread"), max)?;
    }

    #[test]
    fn entries_per_resource_map(max in 0usize..40, k in 0usize..3, min_unit in any::<bool>()) {
        let l = limits(|l| {
            l.max_resource_entries = max;
            l.max_dimensions = usize::MAX;
        });
        let map = |n: usize| (0..n).map(|i| (format!("r{i}"), "1".to_owned())).collect::<HashMap<_, _>>();
        let field = if min_unit { "min_unit" } else { "aggregate_resources" };
        let set = |n: &mut pb::CapacityNeed, m| if min_unit { n.min_unit = m } else { n.aggregate_resources = m };
        // Every other map is empty, so even a bound of 0 holds for them.
        let empty = |n: &mut pb::CapacityNeed| {
            n.aggregate_resources.clear();
            n.min_unit.clear();
        };
        let build = |m| with_needs(k, empty, |n| set(n, map(m)));
        assert_bound(&l, build, Limit::ResourceEntries, &format!("needs[{k}].{field}"), max)?;
    }

    /// Every string of a roll-up: cluster id, requirement key and value, topology key,
    /// group, resource name and quantity.
    #[test]
    fn string_bytes(max in 10usize..60, k in 0usize..3, which in 0usize..7) {
        let l = limits(|l| l.max_string_bytes = max);
        let build = |len: usize| -> (pb::ClusterCapacityNeeds, String) {
            let s = |c: &str| c.repeat(len);
            match which {
                0 => {
                    let mut r = rollup(vec![plain_need()]);
                    r.cluster_id = s("c");
                    (r, "cluster_id".to_owned())
                }
                1 => (with_need(k, |n| n.requirements[0].key = s("k")),
                      format!("needs[{k}].requirements[0].key")),
                2 => (with_need(k, |n| n.requirements[0].values = vec![s("v")]),
                      format!("needs[{k}].requirements[0].values[0]")),
                3 => (with_need(k, |n| n.spread[0].topology_key = s("t")),
                      format!("needs[{k}].spread[0].topology_key")),
                4 => (with_need(k, |n| n.group = s("g")),
                      format!("needs[{k}].group")),
                5 => (with_need(k, |n| { n.min_unit.clear(); n.aggregate_resources = HashMap::from([(s("a"), "1".into())]); }),
                      format!("needs[{k}].aggregate_resources[{:?}]", s("a"))),
                _ => (with_need(k, |n| { n.min_unit.insert("cpu".into(), format!("{}1", "0".repeat(len - 1))); }),
                      format!("needs[{k}].min_unit[\"cpu\"]")),
            }
        };
        let (_, path) = build(max + 1);
        assert_bound(&l, |m| build(m).0, Limit::StringBytes, &path, max)?;
    }

    /// Distinct resource names over the whole roll-up: names repeated across needs count
    /// once, and the error names the entry that crossed the bound.
    #[test]
    fn distinct_dimensions_per_rollup(max in 1usize..80, per_need in 1usize..5, repeats in 1usize..4) {
        let l = limits(|l| {
            l.max_dimensions = max;
            l.max_resource_entries = per_need;
        });
        // Zero-padded names: name order is creation order, so the crossing entry is known.
        let name = |i: usize| format!("example.com/d{i:04}");
        let build = |total: usize| {
            let names: Vec<String> = (0..total).map(name).collect();
            let mut needs = Vec::new();
            for _ in 0..repeats {
                for chunk in names.chunks(per_need) {
                    let mut n = plain_need();
                    n.min_unit.clear();
                    n.aggregate_resources = chunk.iter().map(|c| (c.clone(), "1".to_owned())).collect();
                    needs.push(n);
                }
            }
            rollup(needs)
        };
        let path = format!("needs[{}].aggregate_resources[{:?}]", max / per_need, name(max));
        assert_bound(&l, build, Limit::Dimensions, &path, max)?;
    }

    #[test]
    fn priority_ceiling(ceiling in i32::MIN..i32::MAX, k in 0usize..3) {
        let l = limits(|l| l.max_priority = ceiling);
        let all_at = |needs: &mut Vec<pb::CapacityNeed>| {
            for n in needs.iter_mut() {
                n.priority = ceiling;
            }
        };
        let mut at = with_need(k, |_| {});
        all_at(&mut at.needs);
        prop_assert!(rollup_from_proto_with(&at, &l).is_ok());
        let mut over = at.clone();
        over.needs[k].priority = ceiling + 1;
        let err = rollup_from_proto_with(&over, &l).unwrap_err();
        prop_assert_eq!(
            &err,
            &ConvError::PriorityAboveCeiling {
                path: format!("needs[{k}].priority"),
                value: ceiling + 1,
                max: ceiling,
            }
        );
        prop_assert_eq!(err.reason(), "priority_ceiling");
        prop_assert!(err.to_string().contains("max-priority"));
    }

    /// Generated qualified names pass; one disallowed character anywhere in the name part
    /// rejects the roll-up with the `resource_name` reason.
    #[test]
    fn resource_names_are_qualified_names(
        prefix in proptest::option::of("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?){0,3}"),
        name in "[A-Za-z0-9]([A-Za-z0-9_.-]{0,40}[A-Za-z0-9])?",
        bad in "[^A-Za-z0-9_./-]",
        at in any::<prop::sample::Index>(),
    ) {
        let full = |n: &str| match &prefix {
            Some(p) => format!("{p}/{n}"),
            None => n.to_owned(),
        };
        let good = full(&name);
        let r = with_need(1, |n| { n.aggregate_resources.insert(good.clone(), "1".into()); });
        prop_assert!(rollup_from_proto(&r).is_ok(), "{:?}", good);
        let mut chars: Vec<char> = name.chars().collect();
        let i = at.index(chars.len() + 1);
        chars.insert(i, bad.chars().next().unwrap());
        let broken = full(&chars.into_iter().collect::<String>());
        prop_assume!(broken.len() <= RollupLimits::DEFAULT_MAX_STRING_BYTES);
        let r = with_need(1, |n| { n.aggregate_resources.insert(broken.clone(), "1".into()); });
        let err = rollup_from_proto(&r).unwrap_err();
        prop_assert_eq!(err.reason(), "resource_name", "{:?}: {}", broken, err);
        prop_assert_eq!(err.need_index(), Some(1));
    }
}

#[test]
fn the_defaults_admit_a_60k_need_rollup() {
    let needs: Vec<pb::CapacityNeed> = (0..60_000)
        .map(|i| {
            let mut n = plain_need();
            n.requirements
                .push(in_values("team", vec![format!("team-{}", i % 500)]));
            n.aggregate_resources
                .insert("memory".into(), format!("{}Gi", 1 + i % 64));
            n
        })
        .collect();
    let r = rollup_from_proto(&rollup(needs)).unwrap();
    assert_eq!(r.needs.len(), 60_000);
}

/// A hundred thousand distinct resource names are refused however they are packed, and
/// the refusal reads only as far as the first bound it crosses.
#[test]
fn a_rollup_naming_100k_distinct_resources_is_rejected() {
    let names: Vec<String> = (0..100_000).map(|i| format!("example.com/r{i}")).collect();
    let need_of = |chunk: &[String]| pb::CapacityNeed {
        aggregate_resources: chunk.iter().map(|c| (c.clone(), "1".to_owned())).collect(),
        ..plain_need()
    };
    // Spread under the per-map bound: the distinct-dimension bound stops it.
    let per_need = RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES;
    let spread_out = rollup(names.chunks(per_need).map(need_of).collect());
    let err = rollup_from_proto(&spread_out).unwrap_err();
    assert_eq!(err.reason(), "limit_rollup_dimensions", "{err}");
    assert!(
        matches!(err, ConvError::LimitExceeded { value, max, .. }
            if value == RollupLimits::DEFAULT_MAX_DIMENSIONS + 1
                && max == RollupLimits::DEFAULT_MAX_DIMENSIONS),
        "{err}"
    );
    // All in one need: the per-map bound stops it before a single name is read.
    let one = rollup(vec![need_of(&names)]);
    let err = rollup_from_proto(&one).unwrap_err();
    assert_eq!(
        err,
        ConvError::LimitExceeded {
            limit: Limit::ResourceEntries,
            path: "needs[0].aggregate_resources".into(),
            value: 100_000,
            max: RollupLimits::DEFAULT_MAX_RESOURCE_ENTRIES,
        }
    );
    // Even with every per-roll-up bound lifted, the names are still valid input: the
    // shard-wide bound in decide is what stops them there.
    assert!(rollup_from_proto_with(&spread_out, &RollupLimits::UNBOUNDED).is_ok());
}

#[test]
fn long_names_are_cut_in_the_error() {
    let long = "a".repeat(100_000);
    let r = with_need(0, |n| {
        n.aggregate_resources.insert(long.clone(), "1".into());
    });
    let err = rollup_from_proto(&r).unwrap_err();
    assert_eq!(err.reason(), "limit_string_bytes");
    let text = err.to_string();
    assert!(text.len() < 300, "{text}");
    assert!(text.contains("(100000 bytes)"), "{text}");
}

#[test]
fn reasons_are_the_fixed_set() {
    for l in Limit::ALL {
        assert_eq!(ConvError::rollup_reason_label(l.reason()), Some(l.reason()));
    }
    assert_eq!(
        ConvError::rollup_reason_label("resource_name"),
        Some("resource_name")
    );
    assert_eq!(
        ConvError::rollup_reason_label("priority_ceiling"),
        Some("priority_ceiling")
    );
    assert_eq!(ConvError::rollup_reason_label("cluster-a"), None);
    assert_eq!(ConvError::rollup_reason_label(""), None);
}
