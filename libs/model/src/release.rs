//! Release selectors (ADR-0142): what a donor shard may release, reclaim or drain for
//! another shard's shortfall, written into the `machine_ids` of a release instruction
//! because the coordinator never sees machine ids.
//!
//! Grammar of a token (a `*` can never start a machine id):
//!
//! ```text
//! token = "*" [ "/" instance-type ] [ "?" param *( "&" param ) ]
//! param = "needs=" resource *( "," resource )
//!       / "match=" requirement *( ";" requirement )
//! requirement = key ":" operator [ ":" value *( "|" value ) ]
//! ```
//!
//! `needs` names the resources the shortfall still lacks: a machine with none of one of
//! them cannot place a single pod of that need, so it is never released for it. `match`
//! carries the shortfall's node-selector requirements, which the machine must match.

use std::fmt;
use std::str::FromStr;

use crate::machine::Machine;
use crate::requirement::{Operator, Requirement, matches_machine};

/// One machine a donor may give up: of `instance_type` (any when `None`), matching every
/// requirement and having some of every resource in `resources`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReleaseSelector {
    pub instance_type: Option<String>,
    pub requirements: Vec<Requirement>,
    pub resources: Vec<String>,
}

/// A token that is not a release selector (a machine id, or a malformed one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a release selector: {0}")]
pub struct NotASelector(pub String);

impl ReleaseSelector {
    /// Whether `machine` would serve the shortfall this selector stands for.
    pub fn fits(&self, machine: &Machine) -> bool {
        self.instance_type
            .as_deref()
            .is_none_or(|t| machine.profile.instance_type == t)
            && matches_machine(&self.requirements, machine)
            && self
                .resources
                .iter()
                .all(|r| machine.effective_allocatable().get(r) > 0)
    }
}

fn operator_name(op: Operator) -> &'static str {
    match op {
        Operator::Unspecified => "Unspecified",
        Operator::In => "In",
        Operator::NotIn => "NotIn",
        Operator::Exists => "Exists",
        Operator::DoesNotExist => "DoesNotExist",
        Operator::Same => "Same",
    }
}

fn operator_named(name: &str) -> Option<Operator> {
    Some(match name {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Same" => Operator::Same,
        _ => return None,
    })
}

impl fmt::Display for ReleaseSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("*")?;
        if let Some(t) = &self.instance_type {
            write!(f, "/{t}")?;
        }
        let mut sep = '?';
        if !self.resources.is_empty() {
            write!(f, "{sep}needs={}", self.resources.join(","))?;
            sep = '&';
        }
        if !self.requirements.is_empty() {
            write!(f, "{sep}match=")?;
            for (i, r) in self.requirements.iter().enumerate() {
                if i > 0 {
                    f.write_str(";")?;
                }
                write!(f, "{}:{}", r.key(), operator_name(r.operator()))?;
                if !r.values().is_empty() {
                    write!(f, ":{}", r.values().join("|"))?;
                }
            }
        }
        Ok(())
    }
}

impl FromStr for ReleaseSelector {
    type Err = NotASelector;

    fn from_str(token: &str) -> Result<Self, Self::Err> {
        let bad = || NotASelector(token.to_owned());
        let rest = token.strip_prefix('*').ok_or_else(bad)?;
        let (head, query) = match rest.split_once('?') {
            Some((h, q)) => (h, Some(q)),
            None => (rest, None),
        };
        let instance_type = match head {
            "" => None,
            h => Some(
                h.strip_prefix('/')
                    .filter(|t| !t.is_empty())
                    .ok_or_else(bad)?,
            ),
        };
        let mut sel = ReleaseSelector {
            instance_type: instance_type.map(str::to_owned),
            ..ReleaseSelector::default()
        };
        for param in query.into_iter().flat_map(|q| q.split('&')) {
            if let Some(names) = param.strip_prefix("needs=") {
                sel.resources = names
                    .split(',')
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect();
            } else if let Some(reqs) = param.strip_prefix("match=") {
                for r in reqs.split(';').filter(|r| !r.is_empty()) {
                    let mut parts = r.splitn(3, ':');
                    let key = parts.next().filter(|k| !k.is_empty()).ok_or_else(bad)?;
                    let op = parts.next().and_then(operator_named).ok_or_else(bad)?;
                    let values = parts
                        .next()
                        .map(|v| v.split('|').collect::<Vec<_>>())
                        .unwrap_or_default();
                    sel.requirements.push(Requirement::new(key, op, values));
                }
            } else {
                return Err(bad());
            }
        }
        Ok(sel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::MachineProfile;
    use crate::requirement::{INSTANCE_TYPE_KEY, ZONE_KEY};
    use crate::resources::ResourceVector;
    use proptest::prelude::*;

    fn machine(instance_type: &str, zone: &str, resources: &[(&str, i64)]) -> Machine {
        Machine {
            id: format!("{instance_type}-{zone}"),
            profile: MachineProfile {
                instance_type: instance_type.to_owned(),
                zone: zone.to_owned(),
                resources: ResourceVector::from_milli(resources.iter().copied()),
                ..MachineProfile::default()
            },
            ..Machine::default()
        }
    }

    fn gpu() -> Machine {
        machine(
            "bm.gpu.8",
            "z1",
            &[("cpu", 4000), ("memory", 16_000), ("nvidia.com/gpu", 8000)],
        )
    }

    fn cpu() -> Machine {
        machine("s.small.8", "z2", &[("cpu", 8000), ("memory", 32_000)])
    }

    #[test]
    fn the_old_tokens_still_parse() {
        let any: ReleaseSelector = "*".parse().unwrap();
        assert_eq!(any, ReleaseSelector::default());
        let typed: ReleaseSelector = "*/bm.gpu.8".parse().unwrap();
        assert_eq!(typed.instance_type.as_deref(), Some("bm.gpu.8"));
        assert!(typed.fits(&gpu()) && !typed.fits(&cpu()));
        assert!(any.fits(&gpu()) && any.fits(&cpu()));
    }

    #[test]
    fn a_machine_lacking_a_needed_resource_never_fits() {
        let sel: ReleaseSelector = "*?needs=cpu,nvidia.com/gpu".parse().unwrap();
        assert_eq!(sel.resources, ["cpu", "nvidia.com/gpu"]);
        assert!(sel.fits(&gpu()));
        assert!(!sel.fits(&cpu()), "a CPU machine for a GPU shortfall");
    }

    #[test]
    fn requirements_are_matched() {
        let sel: ReleaseSelector = format!("*?match={ZONE_KEY}:In:z1|z3;gpu-model:DoesNotExist")
            .parse()
            .unwrap();
        assert!(sel.fits(&gpu()));
        assert!(!sel.fits(&cpu()), "zone z2 is not asked for");
        let mut labelled = gpu();
        labelled
            .profile
            .labels
            .insert("gpu-model".into(), "a100".into());
        assert!(!sel.fits(&labelled));
    }

    #[test]
    fn what_is_not_a_selector_is_refused() {
        for token in [
            "m-1",
            "*x",
            "*/",
            "*?size=3",
            "*?match=zone",
            "*?match=zone:Near:a",
            "*?match=:In:a",
        ] {
            assert!(token.parse::<ReleaseSelector>().is_err(), "{token}");
        }
    }

    fn arb_selector() -> impl Strategy<Value = ReleaseSelector> {
        let name = "[a-z][a-z0-9.-]{0,8}(/[a-z0-9]{1,4})?";
        let op = prop_oneof![
            Just(Operator::In),
            Just(Operator::NotIn),
            Just(Operator::Exists),
            Just(Operator::DoesNotExist),
            Just(Operator::Same),
        ];
        let req = (
            name,
            op,
            proptest::collection::vec("[a-z0-9._-]{1,6}", 0..3),
        )
            .prop_map(|(k, o, v)| Requirement::new(k, o, v));
        (
            proptest::option::of("[a-z][a-z0-9.]{0,10}"),
            proptest::collection::vec(req, 0..3),
            proptest::collection::vec(name, 0..3),
        )
            .prop_map(|(instance_type, requirements, resources)| ReleaseSelector {
                instance_type,
                requirements,
                resources,
            })
    }

    proptest! {
        #[test]
        fn a_token_reads_back_as_the_selector_it_was_written_from(sel in arb_selector()) {
            let token = sel.to_string();
            prop_assert!(token.starts_with('*'));
            prop_assert_eq!(token.parse::<ReleaseSelector>().unwrap(), sel);
        }
    }

    #[test]
    fn the_instance_type_pin_reads_like_any_requirement() {
        let sel = ReleaseSelector {
            instance_type: Some("bm.gpu.8".into()),
            requirements: vec![Requirement::new(
                INSTANCE_TYPE_KEY,
                Operator::In,
                ["bm.gpu.8"],
            )],
            resources: vec!["nvidia.com/gpu".into()],
        };
        assert_eq!(
            sel.to_string(),
            "*/bm.gpu.8?needs=nvidia.com/gpu&match=node.kubernetes.io/instance-type:In:bm.gpu.8"
        );
        assert!(sel.fits(&gpu()));
    }
}
