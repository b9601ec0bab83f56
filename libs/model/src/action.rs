//! Engine output: actions on machines.

use crate::machine::{ClusterId, MachineId};
use crate::profile::Profile;
use crate::requirement::Requirement;
use crate::state::MachineState;
use crate::wire_enum;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

wire_enum! {
    /// Action kind. Discriminants are the reference ordinals.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
    pub enum ActionKind {
        /// Phase 1 claim of an Idle machine: Idle → Configuring → Configured.
        Bootstrap = 1,
        /// Phase 1 claim of a Speculative slot: Speculative → Creating → Idle, then Bootstrap.
        Provision = 2,
        /// Phase 3 voluntary reclaim of excess: Configured → Draining → Idle.
        Reclaim = 3,
        /// Phase 2 preemption for a higher-priority need: Configured → Draining → Idle.
        Preempt = 4,
        /// Phase 3 idle release: Idle → Deleting → Speculative (the reference's `Delete`).
        Release = 5,
    }
}

impl ActionKind {
    /// The stable audit/log tag of actions of this kind.
    pub const fn reason(self) -> &'static str {
        match self {
            ActionKind::Bootstrap => "phase1.idle",
            ActionKind::Provision => "phase1.speculative",
            ActionKind::Reclaim => "phase3.excess",
            ActionKind::Preempt => "phase2.inversion",
            ActionKind::Release => "phase3.release",
        }
    }

    /// The (stable) state the machine must be in when the action executes.
    pub const fn from_state(self) -> MachineState {
        match self {
            ActionKind::Bootstrap | ActionKind::Release => MachineState::Idle,
            ActionKind::Provision => MachineState::Speculative,
            ActionKind::Reclaim | ActionKind::Preempt => MachineState::Configured,
        }
    }

    /// The transitional state the shard moves the machine into when it starts the action.
    pub const fn to_state(self) -> MachineState {
        match self {
            ActionKind::Bootstrap => MachineState::Configuring,
            ActionKind::Provision => MachineState::Creating,
            ActionKind::Reclaim | ActionKind::Preempt => MachineState::Draining,
            ActionKind::Release => MachineState::Deleting,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            ActionKind::Bootstrap => "bootstrap",
            ActionKind::Provision => "provision",
            ActionKind::Reclaim => "reclaim",
            ActionKind::Preempt => "preempt",
            ActionKind::Release => "release",
        }
    }
}

impl fmt::Display for ActionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The need an acquisition (Bootstrap/Provision) is for: everything the shard
/// stamps on the machine (fingerprint and group early, priority and penalty
/// dollars at Configured) and the requirements the operator's bootstrap must
/// honour. Plain values rather than the whole [`Profile`], so an action
/// survives the trip to an execute worker and back unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Assignment {
    pub need_fingerprint: String,
    pub group: String,
    pub priority: i32,
    /// Upper bound of the need's interruption bucket.
    pub interruption_penalty_dollars: f64,
    /// Upper bound of the need's reclamation bucket.
    pub reclamation_penalty_dollars: f64,
    /// The need's canonical requirements.
    pub requirements: Vec<Requirement>,
}

impl Assignment {
    /// The assignment for a need with this profile and group. Accepts
    /// `&Profile`, `Arc<Profile>` or `&Arc<Profile>`.
    pub fn new(profile: impl AsRef<Profile>, group: impl Into<String>) -> Self {
        let profile = profile.as_ref();
        Assignment {
            need_fingerprint: profile.fingerprint().to_owned(),
            group: group.into(),
            priority: profile.priority(),
            interruption_penalty_dollars: profile.interruption_penalty_dollars(),
            reclamation_penalty_dollars: profile.reclamation_penalty_dollars(),
            requirements: profile.requirements().to_vec(),
        }
    }
}

/// One decision about one machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Action {
    /// Bind an Idle machine to `cluster` (the destination).
    Bootstrap {
        machine_id: MachineId,
        cluster: ClusterId,
        assignment: Assignment,
    },
    /// Create a Speculative slot for `cluster` (the destination).
    Provision {
        machine_id: MachineId,
        cluster: ClusterId,
        assignment: Assignment,
    },
    /// Drain an excess Configured machine out of `cluster` (its current cluster).
    Reclaim {
        machine_id: MachineId,
        cluster: ClusterId,
        grace: Duration,
    },
    /// Drain a lower-priority Configured machine out of `cluster` (the victim's).
    Preempt {
        machine_id: MachineId,
        cluster: ClusterId,
        grace: Duration,
        preemptor_priority: i32,
    },
    /// Return a long-idle elastic machine to a Speculative slot.
    Release { machine_id: MachineId },
}

impl Action {
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::Bootstrap { .. } => ActionKind::Bootstrap,
            Action::Provision { .. } => ActionKind::Provision,
            Action::Reclaim { .. } => ActionKind::Reclaim,
            Action::Preempt { .. } => ActionKind::Preempt,
            Action::Release { .. } => ActionKind::Release,
        }
    }

    pub fn machine_id(&self) -> &str {
        match self {
            Action::Bootstrap { machine_id, .. }
            | Action::Provision { machine_id, .. }
            | Action::Reclaim { machine_id, .. }
            | Action::Preempt { machine_id, .. }
            | Action::Release { machine_id } => machine_id,
        }
    }

    /// Destination cluster for acquisitions, source cluster for drains, `""` for Release.
    pub fn cluster(&self) -> &str {
        match self {
            Action::Bootstrap { cluster, .. }
            | Action::Provision { cluster, .. }
            | Action::Reclaim { cluster, .. }
            | Action::Preempt { cluster, .. } => cluster,
            Action::Release { .. } => "",
        }
    }

    /// The need an acquisition is for.
    pub fn assignment(&self) -> Option<&Assignment> {
        match self {
            Action::Bootstrap { assignment, .. } | Action::Provision { assignment, .. } => {
                Some(assignment)
            }
            _ => None,
        }
    }

    /// Drain grace for Reclaim/Preempt.
    pub fn grace(&self) -> Option<Duration> {
        match self {
            Action::Reclaim { grace, .. } | Action::Preempt { grace, .. } => Some(*grace),
            _ => None,
        }
    }

    /// The preemptor's priority for Preempt, 0 otherwise (as on the wire).
    pub fn preemptor_priority(&self) -> i32 {
        match self {
            Action::Preempt {
                preemptor_priority, ..
            } => *preemptor_priority,
            _ => 0,
        }
    }

    /// The stable audit tag.
    pub fn reason(&self) -> &'static str {
        self.kind().reason()
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.machine_id())?;
        if !self.cluster().is_empty() {
            write!(f, " cluster={}", self.cluster())?;
        }
        if let Some(a) = self.assignment() {
            write!(f, " need={}", a.need_fingerprint)?;
            if !a.group.is_empty() {
                write!(f, " group={}", a.group)?;
            }
        }
        if let Some(g) = self.grace() {
            write!(f, " grace={}s", g.as_secs())?;
        }
        if let Action::Preempt {
            preemptor_priority, ..
        } = self
        {
            write!(f, " preemptor_priority={preemptor_priority}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::PenaltyBucket;
    use crate::state::check_transition;

    #[test]
    fn kinds_start_in_stable_states_along_legal_edges() {
        for k in ActionKind::ALL {
            assert!(k.from_state().is_stable(), "{k}");
            assert_eq!(
                check_transition(k.from_state(), k.to_state()),
                Ok(()),
                "{k}"
            );
        }
        let ordinals: Vec<_> = ActionKind::ALL.iter().map(|k| k.ordinal()).collect();
        assert_eq!(ordinals, [1, 2, 3, 4, 5]);
    }

    #[test]
    fn accessors() {
        let profile = std::sync::Arc::new(Profile::new(
            vec![],
            vec![],
            9,
            PenaltyBucket::B4,
            PenaltyBucket::B8,
        ));
        let boot = Action::Bootstrap {
            machine_id: "m1".into(),
            cluster: "c1".into(),
            assignment: Assignment::new(profile.clone(), "g"),
        };
        assert_eq!(boot.kind(), ActionKind::Bootstrap);
        assert_eq!(boot.reason(), "phase1.idle");
        let a = boot.assignment().unwrap();
        assert_eq!(a.priority, 9);
        assert_eq!(a.need_fingerprint, profile.fingerprint());
        assert_eq!(a.interruption_penalty_dollars, 4.0);
        assert_eq!(a.reclamation_penalty_dollars, 8.0);
        assert_eq!(a.requirements, profile.requirements());
        assert_eq!(Assignment::new(&*profile, "g"), *a);
        assert_eq!(boot.grace(), None);
        assert_eq!(
            boot.to_string(),
            format!(
                "bootstrap m1 cluster=c1 need={} group=g",
                profile.fingerprint()
            )
        );

        let preempt = Action::Preempt {
            machine_id: "m2".into(),
            cluster: "victim".into(),
            grace: Duration::from_secs(30),
            preemptor_priority: 1_000_000,
        };
        assert_eq!(preempt.reason(), "phase2.inversion");
        assert_eq!(preempt.preemptor_priority(), 1_000_000);
        assert_eq!(preempt.grace(), Some(Duration::from_secs(30)));
        assert!(preempt.assignment().is_none());
        assert_eq!(
            preempt.to_string(),
            "preempt m2 cluster=victim grace=30s preemptor_priority=1000000"
        );

        let release = Action::Release {
            machine_id: "m3".into(),
        };
        assert_eq!(release.cluster(), "");
        assert_eq!(release.machine_id(), "m3");
        assert_eq!(release.reason(), "phase3.release");
        assert_eq!(release.preemptor_priority(), 0);
        let reclaim = Action::Reclaim {
            machine_id: "m4".into(),
            cluster: "c".into(),
            grace: Duration::from_secs(600),
        };
        assert_eq!(
            (reclaim.kind(), reclaim.reason(), reclaim.cluster()),
            (ActionKind::Reclaim, "phase3.excess", "c")
        );
    }
}
