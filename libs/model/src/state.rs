//! Machine lifecycle states and the legal-transition table.

use crate::wire_enum;
use serde::{Deserialize, Serialize};
use std::fmt;

wire_enum! {
    /// Lifecycle state of a machine. The discriminants are the wire ordinals
    /// (`bigfleet.v1alpha1.MachineState`) and also the sort/bucket key order.
    #[derive(
        Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
    )]
    pub enum MachineState {
        /// Guard value: never legal at rest ([`crate::Machine::invariant`] rejects it).
        #[default]
        Unspecified = 0,
        /// A quota slot: no host, no cluster.
        Speculative = 1,
        /// Provider `Create` in progress (Speculative → Idle).
        Creating = 2,
        /// Real hardware, unbound.
        Idle = 3,
        /// Being joined to a cluster (Idle → Configured).
        Configuring = 4,
        /// Joined to a cluster.
        Configured = 5,
        /// Leaving a cluster (Configured → Idle).
        Draining = 6,
        /// Returning hardware to the provider (Idle → Speculative, cloud only).
        Deleting = 7,
        /// The last transition failed; waits for cleanup. `last_error` is set.
        Failed = 8,
    }
}

impl MachineState {
    /// Stable states are the only ones the engine allocates from and the only
    /// ones its actions start in. Failed is deliberately not stable.
    pub const fn is_stable(self) -> bool {
        matches!(
            self,
            MachineState::Speculative | MachineState::Idle | MachineState::Configured
        )
    }

    /// States with a provider operation in flight; exactly these may fail.
    pub const fn is_transitional(self) -> bool {
        matches!(
            self,
            MachineState::Creating
                | MachineState::Configuring
                | MachineState::Draining
                | MachineState::Deleting
        )
    }

    /// Lower-case name, as used in logs and metric labels.
    pub const fn as_str(self) -> &'static str {
        match self {
            MachineState::Unspecified => "unspecified",
            MachineState::Speculative => "speculative",
            MachineState::Creating => "creating",
            MachineState::Idle => "idle",
            MachineState::Configuring => "configuring",
            MachineState::Configured => "configured",
            MachineState::Draining => "draining",
            MachineState::Deleting => "deleting",
            MachineState::Failed => "failed",
        }
    }

    /// Whether `self → to` is one of the 13 legal edges.
    pub const fn can_transition_to(self, to: MachineState) -> bool {
        use MachineState::*;
        // "→ Failed" is computed from the transitional set rather than listed,
        // so a new transitional state cannot forget its failure edge.
        if matches!(to, Failed) {
            return self.is_transitional();
        }
        matches!(
            (self, to),
            (Speculative, Creating)
                | (Creating, Idle)
                | (Idle, Configuring)
                | (Idle, Deleting)
                | (Configuring, Configured)
                | (Configuring, Idle)
                | (Configured, Draining)
                | (Draining, Idle)
                | (Deleting, Speculative)
        )
    }
}

impl fmt::Display for MachineState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A state change that is not in the legal-transition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal machine transition {from} -> {to}")]
pub struct TransitionError {
    pub from: MachineState,
    pub to: MachineState,
}

/// Checks one edge against the table. Same-state updates are not edges: the
/// inventory skips this check for them, so `check_transition(s, s)` is an error.
pub fn check_transition(from: MachineState, to: MachineState) -> Result<(), TransitionError> {
    if from.can_transition_to(to) {
        Ok(())
    } else {
        Err(TransitionError { from, to })
    }
}

#[cfg(test)]
mod tests {
    use super::MachineState::*;
    use super::*;

    const ALLOWED: [(MachineState, MachineState); 13] = [
        (Speculative, Creating),
        (Creating, Idle),
        (Creating, Failed),
        (Idle, Configuring),
        (Idle, Deleting),
        (Configuring, Configured),
        (Configuring, Failed),
        (Configuring, Idle),
        (Configured, Draining),
        (Draining, Idle),
        (Draining, Failed),
        (Deleting, Speculative),
        (Deleting, Failed),
    ];

    #[test]
    fn every_listed_edge_is_allowed() {
        for (from, to) in ALLOWED {
            assert_eq!(check_transition(from, to), Ok(()), "{from} -> {to}");
        }
    }

    #[test]
    fn exhaustive_grid_allows_exactly_the_listed_edges() {
        let mut allowed = 0;
        for from in MachineState::ALL {
            for to in MachineState::ALL {
                let ok = check_transition(from, to).is_ok();
                assert_eq!(ok, ALLOWED.contains(&(from, to)), "{from} -> {to}");
                allowed += usize::from(ok);
            }
        }
        assert_eq!(allowed, 13);
    }

    #[test]
    fn pinned_forbidden_edges() {
        for (from, to) in [
            (Speculative, Idle),
            (Configured, Configuring),
            (Idle, Speculative),
            (Failed, Idle),
            (Idle, Idle),
            (Unspecified, Speculative),
            (Speculative, Failed),
            (Configured, Failed),
        ] {
            let err = check_transition(from, to).unwrap_err();
            assert_eq!(err, TransitionError { from, to });
            assert!(err.to_string().contains(from.as_str()));
        }
    }

    #[test]
    fn failed_has_no_outgoing_edges() {
        assert!(
            MachineState::ALL
                .iter()
                .all(|&to| !Failed.can_transition_to(to))
        );
    }

    #[test]
    fn to_failed_exactly_from_transitional_states() {
        let sources: Vec<_> = MachineState::ALL
            .into_iter()
            .filter(|s| s.can_transition_to(Failed))
            .collect();
        assert_eq!(sources, vec![Creating, Configuring, Draining, Deleting]);
    }

    #[test]
    fn stable_set() {
        let stable: Vec<_> = MachineState::ALL
            .into_iter()
            .filter(|s| s.is_stable())
            .collect();
        assert_eq!(stable, vec![Speculative, Idle, Configured]);
    }

    #[test]
    fn ordinals_round_trip() {
        for (i, s) in MachineState::ALL.into_iter().enumerate() {
            assert_eq!(s.ordinal() as usize, i);
            assert_eq!(MachineState::from_ordinal(i as i32), Some(s));
        }
        assert_eq!(MachineState::from_ordinal(9), None);
        assert_eq!(MachineState::from_ordinal(-1), None);
    }
}
