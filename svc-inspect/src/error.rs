//! svc-inspect's errors and their one mapping to gRPC statuses.

use bigfleet_mesh::{ClassifyError, ErrorClass};

/// What can go wrong serving or starting svc-inspect.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The coordinator did not answer and no shard is known from an earlier answer.
    #[error("coordinator unreachable and no shard known yet: {0}")]
    NoShardsKnown(#[source] crate::coordinator::CoordinatorError),
    /// Shards are registered but none answered.
    #[error("no shard reachable: {0}")]
    AllShardsUnreachable(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// A request named a shard the coordinator does not list.
    #[error("unknown shard {0:?}")]
    UnknownShard(String),
    #[error("invalid listen address {addr:?}: {reason}")]
    Listen { addr: String, reason: String },
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error(transparent)]
    Coordinator(#[from] crate::coordinator::CoordinatorError),
    #[error(transparent)]
    Server(#[from] bigfleet_mesh::ServerError),
    #[error(transparent)]
    Telemetry(#[from] bigfleet_telemetry::TelemetryError),
    #[error("http server: {0}")]
    Http(#[source] std::io::Error),
    #[error(
        "refusing to serve the dashboard on {addr} without --http-token-file: anyone who can reach it could read the whole fleet; bind a loopback address (and use kubectl port-forward), give a token file, or pass --insecure-plaintext"
    )]
    HttpExposed { addr: std::net::SocketAddr },
}

impl ClassifyError for InspectError {
    fn class(&self) -> ErrorClass {
        match self {
            InspectError::NoShardsKnown(_) | InspectError::AllShardsUnreachable(_) => {
                ErrorClass::Unavailable
            }
            InspectError::InvalidArgument(_) => ErrorClass::InvalidArgument,
            InspectError::UnknownShard(_) => ErrorClass::NotFound,
            InspectError::Coordinator(e) if e.code() == tonic::Code::PermissionDenied => {
                ErrorClass::PermissionDenied
            }
            InspectError::Coordinator(_) => ErrorClass::Unavailable,
            InspectError::Listen { .. }
            | InspectError::Tls(_)
            | InspectError::Server(_)
            | InspectError::Telemetry(_)
            | InspectError::Http(_)
            | InspectError::HttpExposed { .. } => ErrorClass::Internal,
        }
    }
}

impl From<InspectError> for tonic::Status {
    fn from(e: InspectError) -> Self {
        bigfleet_mesh::status_from(&e)
    }
}
