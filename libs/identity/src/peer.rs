//! `PeerIdentity`: who is on the other end, from exactly one `bigfleet://` URI SAN.

use std::fmt;
use std::str::FromStr;

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// The URI scheme of identity SANs (compared case-insensitively, as URI schemes are).
pub const IDENTITY_SCHEME: &str = "bigfleet";

/// The kind of principal, without its id: what authorization policies are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    Cluster,
    Shard,
    ShardExecute,
    Admin,
    Readonly,
    Coordinator,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Cluster,
        Role::Shard,
        Role::ShardExecute,
        Role::Admin,
        Role::Readonly,
        Role::Coordinator,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Cluster => "cluster",
            Role::Shard => "shard",
            Role::ShardExecute => "shard-execute",
            Role::Admin => "admin",
            Role::Readonly => "readonly",
            Role::Coordinator => "coordinator",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verified peer: one of the six identities a bigfleet certificate can carry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerIdentity {
    /// `bigfleet://cluster/<id>` — a cluster operator.
    Cluster(String),
    /// `bigfleet://shard/<id>` — a shard (towards the coordinator and providers).
    Shard(String),
    /// `bigfleet://shard/<id>/execute` — a remote execute worker of that shard.
    ShardExecute(String),
    /// `bigfleet://admin` — operators' CLI and admin tooling.
    Admin,
    /// `bigfleet://readonly` — dashboards, CLIs, alerting.
    Readonly,
    /// `bigfleet://coordinator/<id>` — a coordinator replica (`--id`): the only identity
    /// the Raft port accepts, bound to the Raft sender's node id (ADR-0100).
    Coordinator(String),
}

impl PeerIdentity {
    pub fn role(&self) -> Role {
        match self {
            PeerIdentity::Cluster(_) => Role::Cluster,
            PeerIdentity::Shard(_) => Role::Shard,
            PeerIdentity::ShardExecute(_) => Role::ShardExecute,
            PeerIdentity::Admin => Role::Admin,
            PeerIdentity::Readonly => Role::Readonly,
            PeerIdentity::Coordinator(_) => Role::Coordinator,
        }
    }

    /// The cluster or shard id, if the identity has one.
    pub fn id(&self) -> Option<&str> {
        match self {
            PeerIdentity::Cluster(id)
            | PeerIdentity::Shard(id)
            | PeerIdentity::ShardExecute(id)
            | PeerIdentity::Coordinator(id) => Some(id),
            PeerIdentity::Admin | PeerIdentity::Readonly => None,
        }
    }

    /// Extracts the identity of a DER-encoded leaf certificate. The certificate must already
    /// be verified against the CA (rustls does that during the handshake); this only reads
    /// its SANs. Exactly one `bigfleet://` URI SAN is required — other SANs (DNS names, IPs,
    /// non-bigfleet URIs) are ignored.
    pub fn from_cert_der(der: &[u8]) -> Result<Self, IdentityError> {
        let (_, cert) = X509Certificate::from_der(der)
            .map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
        let san = cert
            .subject_alternative_name()
            .map_err(|e| IdentityError::BadCertificate(e.to_string()))?;
        let mut found = san
            .iter()
            .flat_map(|ext| ext.value.general_names.iter())
            .filter_map(|name| match name {
                GeneralName::URI(uri) if has_identity_scheme(uri) => Some(*uri),
                _ => None,
            });
        let first = found.next();
        let extra = found.count();
        match (first, extra) {
            (Some(uri), 0) => uri.parse(),
            (None, _) => Err(IdentityError::SanCount { found: 0 }),
            (Some(_), n) => Err(IdentityError::SanCount { found: n + 1 }),
        }
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerIdentity::Cluster(id) => write!(f, "{IDENTITY_SCHEME}://cluster/{id}"),
            PeerIdentity::Shard(id) => write!(f, "{IDENTITY_SCHEME}://shard/{id}"),
            PeerIdentity::ShardExecute(id) => write!(f, "{IDENTITY_SCHEME}://shard/{id}/execute"),
            PeerIdentity::Admin => write!(f, "{IDENTITY_SCHEME}://admin"),
            PeerIdentity::Readonly => write!(f, "{IDENTITY_SCHEME}://readonly"),
            PeerIdentity::Coordinator(id) => write!(f, "{IDENTITY_SCHEME}://coordinator/{id}"),
        }
    }
}

impl FromStr for PeerIdentity {
    type Err = IdentityError;

    /// Parses the SAN form, e.g. `bigfleet://shard/s1/execute`.
    fn from_str(uri: &str) -> Result<Self, Self::Err> {
        let unknown = || IdentityError::UnknownIdentity(uri.to_owned());
        if !has_identity_scheme(uri) {
            return Err(unknown());
        }
        let rest = &uri[IDENTITY_SCHEME.len() + 3..];
        let parts: Vec<&str> = rest.split('/').collect();
        let identity = match parts.as_slice() {
            ["admin"] => PeerIdentity::Admin,
            ["readonly"] => PeerIdentity::Readonly,
            ["cluster", id] => PeerIdentity::Cluster(valid_id(id).ok_or_else(unknown)?),
            ["shard", id] => PeerIdentity::Shard(valid_id(id).ok_or_else(unknown)?),
            ["coordinator", id] => PeerIdentity::Coordinator(valid_id(id).ok_or_else(unknown)?),
            ["shard", id, "execute"] => {
                PeerIdentity::ShardExecute(valid_id(id).ok_or_else(unknown)?)
            }
            _ => return Err(unknown()),
        };
        Ok(identity)
    }
}

fn has_identity_scheme(uri: &str) -> bool {
    let n = IDENTITY_SCHEME.len();
    // `get` instead of indexing: a multi-byte character at the boundary must not panic.
    matches!(
        (uri.get(..n), uri.get(n..n + 3)),
        (Some(scheme), Some("://")) if scheme.eq_ignore_ascii_case(IDENTITY_SCHEME)
    ) && uri.len() > n + 3
}

/// Ids are compared byte for byte with ids asserted in messages (Hello.cluster_id,
/// ShardReport.shard_id), so anything that could be encoded two ways — percent escapes,
/// query/fragment markers, whitespace — is refused rather than normalised.
fn valid_id(id: &str) -> Option<String> {
    let ok = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'/' | b'?' | b'#' | b'%'));
    ok.then(|| id.to_owned())
}

/// Why a peer certificate does not yield an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    /// Zero or several `bigfleet://` URI SANs: ambiguous, so refused.
    #[error("client certificate must carry exactly one bigfleet:// URI SAN (found {found})")]
    SanCount { found: usize },
    /// A `bigfleet://` URI that is not one of the six identity forms.
    #[error("unrecognised bigfleet identity {0:?}")]
    UnknownIdentity(String),
    /// The certificate could not be parsed at all.
    #[error("unparseable peer certificate: {0}")]
    BadCertificate(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_identity_form() {
        let cases = [
            ("bigfleet://cluster/a", PeerIdentity::Cluster("a".into())),
            ("bigfleet://shard/s-1", PeerIdentity::Shard("s-1".into())),
            (
                "bigfleet://shard/s-1/execute",
                PeerIdentity::ShardExecute("s-1".into()),
            ),
            ("bigfleet://admin", PeerIdentity::Admin),
            ("bigfleet://readonly", PeerIdentity::Readonly),
            (
                "bigfleet://coordinator/c-0",
                PeerIdentity::Coordinator("c-0".into()),
            ),
            ("BIGFLEET://admin", PeerIdentity::Admin),
        ];
        for (uri, want) in cases {
            assert_eq!(uri.parse::<PeerIdentity>().unwrap(), want, "{uri}");
        }
    }

    #[test]
    fn rejects_malformed_identities() {
        for uri in [
            "bigfleet://",
            "bigfleet://cluster",
            "bigfleet://cluster/",
            "bigfleet://cluster/a/b",
            "bigfleet://shard/s1/read",
            "bigfleet://admin/",
            "bigfleet://root",
            "bigfleet://coordinator",
            "bigfleet://coordinator/a/b",
            "bigfleet://cluster/a%2Fb",
            "bigfleet://cluster/a b",
            "bigfleet://cluster/a?x",
            "spiffe://cluster/a",
            "bigfleet:cluster/a",
            "",
        ] {
            assert!(
                matches!(
                    uri.parse::<PeerIdentity>(),
                    Err(IdentityError::UnknownIdentity(_))
                ),
                "{uri:?} should be rejected"
            );
        }
    }

    #[test]
    fn roles_and_ids() {
        let e = PeerIdentity::ShardExecute("s9".into());
        assert_eq!(e.role(), Role::ShardExecute);
        assert_eq!(e.id(), Some("s9"));
        assert_eq!(PeerIdentity::Admin.id(), None);
        assert_eq!(PeerIdentity::Readonly.role().as_str(), "readonly");
    }

    #[test]
    fn non_certificates_are_bad_certificates() {
        assert!(matches!(
            PeerIdentity::from_cert_der(b"not a certificate"),
            Err(IdentityError::BadCertificate(_))
        ));
    }

    fn any_identity() -> impl Strategy<Value = PeerIdentity> {
        let id = "[A-Za-z0-9._:-]{1,20}";
        prop_oneof![
            id.prop_map(PeerIdentity::Cluster),
            id.prop_map(PeerIdentity::Shard),
            id.prop_map(PeerIdentity::ShardExecute),
            Just(PeerIdentity::Admin),
            Just(PeerIdentity::Readonly),
            id.prop_map(PeerIdentity::Coordinator),
        ]
    }

    proptest! {
        #[test]
        fn display_round_trips(identity in any_identity()) {
            let text = identity.to_string();
            prop_assert_eq!(text.parse::<PeerIdentity>().unwrap(), identity);
        }

        #[test]
        fn parsing_never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<PeerIdentity>();
            let _ = format!("bigfleet://{s}").parse::<PeerIdentity>();
        }
    }
}
