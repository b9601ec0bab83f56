//! The gateway's errors and the one place they become gRPC statuses.

use bigfleet_mesh::{ClassifyError, ErrorClass};

/// Why a session was refused or ended, or a Gateway call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("the first frame of a session must be a Hello (got {got})")]
    NotHello { got: &'static str },
    #[error("hello has an empty cluster_id")]
    EmptyClusterId,
    /// The Hello's cluster id is too long or has characters an id may not carry; it would
    /// end up in metric labels and logs.
    #[error(
        "cluster_id must be 1-253 printable ascii characters without '/', '?', '#', '%' or spaces"
    )]
    BadClusterId,
    #[error("the stream ended before a Hello arrived")]
    NoHello,
    #[error("no Hello within {0:?} of opening the session")]
    HelloTimeout(std::time::Duration),
    /// The client certificate does not name the Hello's cluster (or names none, or several).
    #[error("{0}")]
    Identity(String),
    #[error(
        "session limit reached: {max_sessions} sessions are open at this gateway (--max-sessions); retry later or use another shard"
    )]
    AtCapacity { max_sessions: usize },
    #[error("decide is unavailable: {0}")]
    DecideUnavailable(String),
    #[error("the gateway is shutting down; reconnect")]
    ShuttingDown,
    #[error("session replaced by a newer session for cluster {cluster}")]
    Replaced { cluster: String },
    #[error(
        "hello for cluster {got:?} on a session of cluster {session:?}; open a new session to change cluster"
    )]
    ClusterChanged { session: String, got: String },
    #[error("session of cluster {0} is not reading its frames (send queue full)")]
    NotReading(String),
}

impl ClassifyError for SessionError {
    fn class(&self) -> ErrorClass {
        match self {
            SessionError::NotHello { .. }
            | SessionError::EmptyClusterId
            | SessionError::BadClusterId
            | SessionError::NoHello
            | SessionError::HelloTimeout(_)
            | SessionError::ClusterChanged { .. } => ErrorClass::InvalidArgument,
            SessionError::Identity(_) => ErrorClass::PermissionDenied,
            SessionError::AtCapacity { .. } | SessionError::NotReading(_) => {
                ErrorClass::ResourceExhausted
            }
            SessionError::DecideUnavailable(_) | SessionError::ShuttingDown => {
                ErrorClass::Unavailable
            }
            SessionError::Replaced { .. } => ErrorClass::Aborted,
        }
    }
}

/// Errors starting the gateway.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error(transparent)]
    Channel(#[from] bigfleet_mesh::ChannelError),
    #[error(transparent)]
    Server(#[from] bigfleet_mesh::ServerError),
    #[error(transparent)]
    Telemetry(#[from] bigfleet_telemetry::TelemetryError),
    #[error("invalid address {addr:?}: {reason}")]
    Address { addr: String, reason: String },
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_mesh::IntoStatus;
    use tonic::Code;

    #[test]
    fn codes() {
        let cases = [
            (
                SessionError::NotHello { got: "rollup" },
                Code::InvalidArgument,
            ),
            (SessionError::EmptyClusterId, Code::InvalidArgument),
            (SessionError::Identity("x".into()), Code::PermissionDenied),
            (
                SessionError::AtCapacity { max_sessions: 3 },
                Code::ResourceExhausted,
            ),
            (
                SessionError::DecideUnavailable("down".into()),
                Code::Unavailable,
            ),
            (SessionError::ShuttingDown, Code::Unavailable),
            (
                SessionError::Replaced {
                    cluster: "a".into(),
                },
                Code::Aborted,
            ),
        ];
        for (err, code) in cases {
            let msg = err.to_string();
            let status = err.into_status();
            assert_eq!(status.code(), code, "{msg}");
            assert_eq!(status.message(), msg);
        }
    }
}
