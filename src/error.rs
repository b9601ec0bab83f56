//! The CLI's errors, worded so the reader knows what to do next: which address could not be
//! reached, which role a refused call needs, which flag to set.

use std::path::PathBuf;
use std::time::Duration;

use bigfleet_mesh::leader_hint;
use svc_inspect::coordinator::{CoordinatorError, code_name};
use tonic::{Code, Status};

/// A failed call to the coordinator or to svc-inspect.
#[derive(Debug, Clone)]
pub struct RemoteError {
    /// `coordinator` or `inspect`.
    pub service: &'static str,
    pub addr: String,
    pub rpc: &'static str,
    /// Roles the server accepts for this RPC under mTLS, e.g. `readonly or admin`.
    pub roles: &'static str,
    pub status: Status,
    pub timeout: Option<Duration>,
}

impl RemoteError {
    pub fn from_coordinator(e: &CoordinatorError, timeout: Option<Duration>) -> Option<Self> {
        match e {
            CoordinatorError::Call { addr, rpc, status } => Some(Self {
                service: "coordinator",
                addr: addr.clone(),
                rpc: rpc.name(),
                roles: rpc.required_roles(),
                status: status.clone(),
                timeout,
            }),
            CoordinatorError::Address { .. } => None,
        }
    }

    fn flag(&self) -> &'static str {
        if self.service == "inspect" {
            "--inspect / BIGFLEET_INSPECT"
        } else {
            "--coordinator / BIGFLEET_COORDINATOR"
        }
    }
}

fn role_uris(roles: &str) -> String {
    roles
        .split(" or ")
        .map(|r| format!("bigfleet://{r}"))
        .collect::<Vec<_>>()
        .join(" or ")
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (svc, addr, rpc, msg) = (self.service, &self.addr, self.rpc, self.status.message());
        match self.status.code() {
            Code::PermissionDenied => write!(
                f,
                "permission denied: {svc} {addr} refused {rpc}; it needs a client certificate with role {} ({}) — pass one with --tls-cert/--tls-key/--tls-ca (server said: {msg})",
                self.roles,
                role_uris(self.roles)
            ),
            Code::Unauthenticated => write!(
                f,
                "{svc} {addr} requires mTLS for {rpc}: pass --tls-cert, --tls-key and --tls-ca with a {} certificate (server said: {msg})",
                self.roles
            ),
            Code::Unavailable => write!(
                f,
                "cannot reach {svc} at {addr} ({rpc}): {msg}; check {} and that the {svc} is running (and whether it expects mTLS)",
                self.flag()
            ),
            Code::DeadlineExceeded => match self.timeout {
                Some(t) => write!(
                    f,
                    "{svc} {addr} did not answer {rpc} within {} (raise --timeout): {msg}",
                    humantime::format_duration(t)
                ),
                None => write!(f, "{svc} {addr} did not answer {rpc}: {msg}"),
            },
            Code::FailedPrecondition if msg.contains("not leader") => {
                match leader_hint(&self.status) {
                    Some(hint) => write!(
                        f,
                        "{svc} {addr} is not the leader and the hinted leader {hint} did not take {rpc} either; retry shortly (an election may be running)"
                    ),
                    None => write!(
                        f,
                        "{svc} {addr} is not the leader and named no leader; retry shortly or point {} at another replica",
                        self.flag()
                    ),
                }
            }
            code => write!(f, "{svc} {addr}: {rpc} failed ({}): {msg}", code_name(code)),
        }
    }
}

/// Everything a `bigfleet` command can fail with.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Remote(Box<RemoteError>),
    #[error("invalid {what} address {addr:?}: {reason}")]
    Address {
        what: &'static str,
        addr: String,
        reason: String,
    },
    #[error(transparent)]
    Tls(#[from] bigfleet_identity::TlsError),
    #[error(transparent)]
    Context(#[from] crate::context::ContextError),
    /// Every shard was asked and none answered.
    #[error("no shard answered: {0}")]
    NoShardReachable(String),
    #[error("{path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot: {0}")]
    Snapshot(String),
    #[error("pki: {0}")]
    Pki(#[from] crate::pki::PkiError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
    #[error("encoding json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("encoding yaml: {0}")]
    Yaml(String),
}

impl CliError {
    pub fn coordinator(e: CoordinatorError, timeout: Option<Duration>) -> Self {
        match RemoteError::from_coordinator(&e, timeout) {
            Some(r) => CliError::Remote(Box::new(r)),
            None => CliError::Address {
                what: "coordinator",
                addr: e.addr().to_owned(),
                reason: e.to_string(),
            },
        }
    }

    /// The gRPC code behind a remote failure (tests and scripts branch on it).
    pub fn code(&self) -> Option<Code> {
        match self {
            CliError::Remote(r) => Some(r.status.code()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of `status` from a call needing `roles`; it must contain `needle`.
    fn remote_says(status: Status, roles: &'static str, needle: &str) -> String {
        let m = RemoteError {
            service: "coordinator",
            addr: "https://c:7790".into(),
            rpc: "AssignDomain",
            roles,
            status,
            timeout: Some(Duration::from_secs(10)),
        }
        .to_string();
        assert!(m.contains(needle), "{m}");
        m
    }

    #[test]
    fn refusals_name_the_role() {
        remote_says(
            Status::permission_denied("readonly may not call"),
            "admin",
            "needs a client certificate with role admin (bigfleet://admin)",
        );
        remote_says(
            Status::permission_denied("x"),
            "readonly or admin",
            "bigfleet://readonly or bigfleet://admin",
        );
    }

    #[test]
    fn unreachable_addresses_are_named() {
        let m = remote_says(
            Status::unavailable("connection refused"),
            "admin",
            "--coordinator",
        );
        assert!(
            m.starts_with("cannot reach coordinator at https://c:7790"),
            "{m}"
        );
        remote_says(Status::deadline_exceeded("slow"), "admin", "within 10s");
    }
}
