//! What can go wrong in decide's operations and cycles; [`crate::service`] is the one
//! place these become gRPC statuses.

use bigfleet_conv::ConvError;

/// Errors of decide's operations; [`crate::service`] maps them to gRPC codes.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("machine {0:?} is not in the inventory")]
    UnknownMachine(String),
    /// The caller's view is out of date (state differs, action not in flight).
    #[error("stale: {0}")]
    Stale(String),
    #[error("invalid: {0}")]
    Invalid(String),
    #[error("roll-up rejected: {0}")]
    Rollup(#[source] ConvError),
    /// Decide cannot judge the request yet (retry later).
    #[error("not ready: {0}")]
    NotReady(String),
    #[error("opening audit log {path}: {source}")]
    AuditLog {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Why a cycle did not decide.
#[derive(Debug, thiserror::Error)]
pub enum CycleError {
    #[error("provider reconcile failed: {0}")]
    Reconcile(#[source] tonic::Status),
    #[error("engine: {0}")]
    Engine(#[from] bigfleet_decision::EngineError),
    #[error("cycle task failed: {0}")]
    Join(String),
}
