//! Model ↔ `bigfleet.mesh.v1` internal messages (decide ↔ execute).

use crate::capacity::{requirements_at, requirements_to_proto};
use crate::error::ConvError;
use bigfleet_model::{Action, ActionKind, Assignment};
use bigfleet_proto::mesh::v1 as mesh;
use std::time::Duration;

/// The wire ordinal of an action kind (`bigfleet.mesh.v1.ActionKind`).
pub fn action_kind_to_proto(kind: ActionKind) -> i32 {
    i32::from(kind.ordinal())
}

/// A wire action kind; Unspecified and unknown values are errors.
pub fn action_kind_from_proto(value: i32) -> Result<ActionKind, ConvError> {
    ActionKind::ALL
        .into_iter()
        .find(|k| i32::from(k.ordinal()) == value)
        .ok_or_else(|| ConvError::EnumOutOfRange {
            path: "action.kind".to_owned(),
            enum_name: "ActionKind",
            value,
        })
}

/// The wire form of an action. Fields that do not apply to the kind stay at
/// their zero values.
pub fn action_to_proto(action: &Action) -> mesh::Action {
    let mut out = mesh::Action {
        kind: action_kind_to_proto(action.kind()),
        machine_id: action.machine_id().to_owned(),
        cluster_id: action.cluster().to_owned(),
        grace_seconds: action
            .grace()
            .map_or(0, |g| i64::try_from(g.as_secs()).unwrap_or(i64::MAX)),
        preemptor_priority: action.preemptor_priority(),
        reason: action.reason().to_owned(),
        ..mesh::Action::default()
    };
    if let Some(a) = action.assignment() {
        out.need_fingerprint = a.need_fingerprint.clone();
        out.group = a.group.clone();
        out.priority = a.priority;
        out.interruption_penalty_dollars = a.interruption_penalty_dollars;
        out.reclamation_penalty_dollars = a.reclamation_penalty_dollars;
        out.requirements = requirements_to_proto(&a.requirements);
    }
    out
}

/// Validates an action received from decide. The `reason` field is not
/// trusted: it is derived from the kind.
pub fn action_from_proto(a: &mesh::Action) -> Result<Action, ConvError> {
    let kind = action_kind_from_proto(a.kind)?;
    if a.machine_id.is_empty() {
        return Err(ConvError::EmptyField {
            path: "action.machine_id".to_owned(),
        });
    }
    let machine_id = a.machine_id.clone();
    let cluster = || {
        if a.cluster_id.is_empty() {
            Err(ConvError::EmptyField {
                path: "action.cluster_id".to_owned(),
            })
        } else {
            Ok(a.cluster_id.clone())
        }
    };
    let grace = || {
        u64::try_from(a.grace_seconds)
            .map(Duration::from_secs)
            .map_err(|_| ConvError::NegativeDuration {
                path: "action.grace_seconds".to_owned(),
                value: a.grace_seconds,
            })
    };
    Ok(match kind {
        ActionKind::Bootstrap => Action::Bootstrap {
            machine_id,
            cluster: cluster()?,
            assignment: assignment(a)?,
        },
        ActionKind::Provision => Action::Provision {
            machine_id,
            cluster: cluster()?,
            assignment: assignment(a)?,
        },
        ActionKind::Reclaim => Action::Reclaim {
            machine_id,
            cluster: cluster()?,
            grace: grace()?,
        },
        ActionKind::Preempt => Action::Preempt {
            machine_id,
            cluster: cluster()?,
            grace: grace()?,
            preemptor_priority: a.preemptor_priority,
        },
        ActionKind::Release => Action::Release { machine_id },
    })
}

fn assignment(a: &mesh::Action) -> Result<Assignment, ConvError> {
    if a.need_fingerprint.is_empty() {
        return Err(ConvError::EmptyField {
            path: "action.need_fingerprint".to_owned(),
        });
    }
    for (path, value) in [
        (
            "action.interruption_penalty_dollars",
            a.interruption_penalty_dollars,
        ),
        (
            "action.reclamation_penalty_dollars",
            a.reclamation_penalty_dollars,
        ),
    ] {
        // +∞ is legal (Pinned); NaN and negatives are not dollars.
        if value.is_nan() || value < 0.0 {
            return Err(ConvError::InvalidDollars {
                path: path.to_owned(),
                value,
            });
        }
    }
    Ok(Assignment {
        need_fingerprint: a.need_fingerprint.clone(),
        group: a.group.clone(),
        priority: a.priority,
        interruption_penalty_dollars: a.interruption_penalty_dollars,
        reclamation_penalty_dollars: a.reclamation_penalty_dollars,
        requirements: requirements_at("action.requirements", &a.requirements)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_model::{PenaltyBucket, Profile};
    use bigfleet_proto::v1alpha1 as pb;

    fn bootstrap() -> Action {
        let profile = Profile::new(
            vec![bigfleet_model::Requirement::new(
                "rack",
                bigfleet_model::Operator::Same,
                Vec::<String>::new(),
            )],
            vec![],
            5000,
            PenaltyBucket::Pinned,
            PenaltyBucket::B2,
        );
        Action::Bootstrap {
            machine_id: "m-1".into(),
            cluster: "c1".into(),
            assignment: Assignment::new(&profile, "gang"),
        }
    }

    #[test]
    fn round_trips_every_kind() {
        let actions = [
            bootstrap(),
            Action::Provision {
                machine_id: "s-1".into(),
                cluster: "c2".into(),
                assignment: bootstrap().assignment().unwrap().clone(),
            },
            Action::Reclaim {
                machine_id: "m-2".into(),
                cluster: "c1".into(),
                grace: Duration::from_secs(600),
            },
            Action::Preempt {
                machine_id: "m-3".into(),
                cluster: "c3".into(),
                grace: Duration::from_secs(10),
                preemptor_priority: 1_000_000,
            },
            Action::Release {
                machine_id: "m-4".into(),
            },
        ];
        for a in actions {
            let wire = action_to_proto(&a);
            assert_eq!(wire.reason, a.reason());
            assert_eq!(action_from_proto(&wire), Ok(a));
        }
        let wire = action_to_proto(&bootstrap());
        assert_eq!(wire.interruption_penalty_dollars, f64::INFINITY);
        assert_eq!(wire.reclamation_penalty_dollars, 2.0);
        assert_eq!(wire.priority, 5000);
        assert_eq!(wire.requirements[0].operator, 5);
    }

    fn reject(edit: impl FnOnce(&mut mesh::Action)) -> ConvError {
        let mut wire = action_to_proto(&bootstrap());
        edit(&mut wire);
        action_from_proto(&wire).unwrap_err()
    }

    #[test]
    fn rejections() {
        assert_eq!(reject(|a| a.kind = 0).path(), Some("action.kind"));
        assert_eq!(reject(|a| a.kind = 6).reason(), "enum_out_of_range");
        assert_eq!(
            reject(|a| a.machine_id.clear()).path(),
            Some("action.machine_id")
        );
        assert_eq!(
            reject(|a| a.cluster_id.clear()).path(),
            Some("action.cluster_id")
        );
        assert_eq!(
            reject(|a| a.need_fingerprint.clear()).path(),
            Some("action.need_fingerprint")
        );
        let err = reject(|a| a.interruption_penalty_dollars = f64::NAN);
        assert_eq!(err.reason(), "dollars");
        assert_eq!(
            reject(|a| a.reclamation_penalty_dollars = -1.0).path(),
            Some("action.reclamation_penalty_dollars")
        );
        let err = reject(|a| a.requirements.push(pb::NodeSelectorRequirement::default()));
        assert_eq!(err.path(), Some("action.requirements[1].key"));
        let err = reject(|a| {
            a.kind = 3;
            a.grace_seconds = -5;
        });
        assert_eq!(
            err,
            ConvError::NegativeDuration {
                path: "action.grace_seconds".into(),
                value: -5
            }
        );
        // Release needs no cluster; reason on the wire is ignored.
        let ok = action_from_proto(&mesh::Action {
            kind: 5,
            machine_id: "m".into(),
            reason: "spoofed".into(),
            ..mesh::Action::default()
        })
        .unwrap();
        assert_eq!(ok.reason(), "phase3.release");
    }
}
