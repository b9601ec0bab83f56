//! `Peer`: the caller of a request as the identity layer established it.

use bigfleet_identity::{IdentityError, PeerIdentity};
use tonic::Status;

/// Who is calling, inserted as a request extension by the identity layer. Handlers read it
/// with [`peer_of`] and bind asserted ids to it with [`Peer::ensure`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Peer {
    /// TCP without TLS: the process runs in plaintext mode and identity checks are skipped
    /// (an explicit, documented mode for local meshes and tests).
    Plaintext,
    /// A Unix socket: a process in the same pod; checks are skipped, file permissions guard
    /// the socket.
    Local,
    /// An mTLS client with exactly one valid `bigfleet://` identity.
    Verified(PeerIdentity),
    /// An mTLS client whose (CA-verified) certificate carries no usable identity. Only
    /// open paths (health, reflection) accept it; everything else answers PERMISSION_DENIED.
    Invalid(IdentityError),
}

impl Peer {
    /// The verified identity, if any.
    pub fn identity(&self) -> Option<&PeerIdentity> {
        match self {
            Peer::Verified(id) => Some(id),
            _ => None,
        }
    }

    /// Whether identity checks apply to this caller (mTLS) or are skipped (plaintext, UDS).
    pub fn checks_apply(&self) -> bool {
        matches!(self, Peer::Verified(_) | Peer::Invalid(_))
    }

    /// Binds an id asserted in a message to the caller: passes when checks are skipped or the
    /// verified identity is exactly `expected`; PERMISSION_DENIED otherwise. E.g. the gateway
    /// calls `peer.ensure(&PeerIdentity::Cluster(hello.cluster_id))`.
    pub fn ensure(&self, expected: &PeerIdentity) -> Result<(), Status> {
        match self {
            Peer::Plaintext | Peer::Local => Ok(()),
            Peer::Verified(id) if id == expected => Ok(()),
            Peer::Verified(id) => Err(Status::permission_denied(format!(
                "peer {id} may not act as {expected}"
            ))),
            Peer::Invalid(e) => Err(Status::permission_denied(e.to_string())),
        }
    }

    /// A stable key for per-caller accounting (rate limits, logs).
    pub fn key(&self, remote: Option<std::net::SocketAddr>) -> String {
        match self {
            Peer::Verified(id) => id.to_string(),
            // No identity to key on: the source address is the budget.
            Peer::Invalid(_) => match remote {
                Some(addr) => format!("invalid:{}", addr.ip()),
                None => "invalid".to_owned(),
            },
            Peer::Local => "local".to_owned(),
            Peer::Plaintext => match remote {
                Some(addr) => format!("plaintext:{}", addr.ip()),
                None => "plaintext".to_owned(),
            },
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Plaintext => f.write_str("plaintext"),
            Peer::Local => f.write_str("local"),
            Peer::Verified(id) => write!(f, "{id}"),
            Peer::Invalid(_) => f.write_str("invalid-identity"),
        }
    }
}

/// The caller of a request served by a mesh server (`None` only if the request did not pass
/// through the mesh stack).
pub fn peer_of<T>(request: &tonic::Request<T>) -> Option<&Peer> {
    request.extensions().get::<Peer>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ensure_binds_asserted_ids_under_mtls_only() {
        let a = PeerIdentity::Cluster("a".into());
        let b = PeerIdentity::Cluster("b".into());
        assert!(Peer::Plaintext.ensure(&a).is_ok());
        assert!(Peer::Local.ensure(&a).is_ok());
        assert!(Peer::Verified(a.clone()).ensure(&a).is_ok());
        let err = Peer::Verified(a.clone()).ensure(&b).unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("bigfleet://cluster/b"));
        // Admin is not a wildcard: a strict binding stays strict.
        assert!(Peer::Verified(PeerIdentity::Admin).ensure(&a).is_err());
        let invalid = Peer::Invalid(IdentityError::SanCount { found: 2 });
        assert_eq!(
            invalid.ensure(&a).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
    }

    #[test]
    fn keys_identify_callers() {
        assert_eq!(
            Peer::Verified(PeerIdentity::Shard("s1".into())).key(None),
            "bigfleet://shard/s1"
        );
        let addr: std::net::SocketAddr = "10.0.0.7:5555".parse().unwrap();
        assert_eq!(Peer::Plaintext.key(Some(addr)), "plaintext:10.0.0.7");
        assert_eq!(Peer::Local.key(None), "local");
    }
}
