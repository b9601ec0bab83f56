//! Outcome classes of one executed action: the `outcome` label of
//! `bigfleet_shard_action_execute_outcomes_total` and of `Done.outcome`.

use std::fmt;

use tonic::Code;

/// How an action ended. The label strings are the original system's, so
/// dashboards and alerts carry over unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// The action did what it set out to do, or found it already done, or
    /// handed an accepted asynchronous transition over to decide's reconcile.
    Success,
    /// Bootstrap: the destination cluster has no live session; rolled back.
    NoSession,
    /// Decide refused a transition as illegal or malformed.
    TransitionError,
    /// Bootstrap: no blob (gateway timeout or failure, operator error); rolled back.
    BlobError,
    /// The provider's Configure failed or acknowledged garbage; machine Failed.
    ConfigureError,
    /// The provider's Create, Drain or Delete failed or acknowledged garbage; machine Failed.
    ProviderError,
    /// The action ran out of time or its stream went away.
    CtxCanceled,
    /// The provider refused our fencing token: a newer incarnation of the shard exists.
    Fenced,
    /// The machine is not in the state the action needs (decide moved on).
    StaleState,
    /// Decide does not know the machine.
    InventoryMiss,
    /// A Bootstrap or Provision without the need it serves.
    MissingProfile,
    /// Anything else (malformed work item, sequence window exhausted, decide unreachable).
    Other,
}

impl Outcome {
    pub const ALL: [Outcome; 12] = [
        Outcome::Success,
        Outcome::NoSession,
        Outcome::TransitionError,
        Outcome::BlobError,
        Outcome::ConfigureError,
        Outcome::ProviderError,
        Outcome::CtxCanceled,
        Outcome::Fenced,
        Outcome::StaleState,
        Outcome::InventoryMiss,
        Outcome::MissingProfile,
        Outcome::Other,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::NoSession => "no_session",
            Outcome::TransitionError => "transition_error",
            Outcome::BlobError => "blob_error",
            Outcome::ConfigureError => "configure_error",
            Outcome::ProviderError => "provider_error",
            Outcome::CtxCanceled => "ctx_canceled",
            Outcome::Fenced => "fenced",
            Outcome::StaleState => "stale_state",
            Outcome::InventoryMiss => "inventory_miss",
            Outcome::MissingProfile => "missing_profile",
            Outcome::Other => "other",
        }
    }

    /// The outcome for a refused `Decide.Transition`, as `decide.proto`
    /// documents it. Transport failures are not decide's verdict on the
    /// transition, so they are `other`.
    pub fn from_transition_error(code: Code) -> Outcome {
        match code {
            Code::NotFound => Outcome::InventoryMiss,
            Code::Aborted => Outcome::StaleState,
            Code::InvalidArgument => Outcome::TransitionError,
            _ => Outcome::Other,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_the_original_ones_and_unique() {
        let labels: Vec<_> = Outcome::ALL.iter().map(|o| o.as_str()).collect();
        assert_eq!(
            labels,
            [
                "success",
                "no_session",
                "transition_error",
                "blob_error",
                "configure_error",
                "provider_error",
                "ctx_canceled",
                "fenced",
                "stale_state",
                "inventory_miss",
                "missing_profile",
                "other"
            ]
        );
        let mut dedup = labels.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), labels.len());
    }

    #[test]
    fn transition_errors_map_per_the_decide_contract() {
        for (code, outcome) in [
            (Code::NotFound, Outcome::InventoryMiss),
            (Code::Aborted, Outcome::StaleState),
            (Code::InvalidArgument, Outcome::TransitionError),
            (Code::Unavailable, Outcome::Other),
        ] {
            assert_eq!(Outcome::from_transition_error(code), outcome, "{code:?}");
        }
    }
}
