//! Per-service authorization: which roles may call which RPC paths.

use std::collections::{HashMap, HashSet};

use bigfleet_identity::Role;

use crate::error::MeshError;
use crate::peer::Peer;

/// The gRPC health service, open to every CA-verified caller so probes and tooling work
/// whatever the caller's role.
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";
/// The reflection services (v1 and the v1alpha grpcurl 1.8 speaks), open like health.
pub const REFLECTION_SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

/// A set of roles (a bit set over [`Role`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoleSet(u8);

impl RoleSet {
    pub const NONE: RoleSet = RoleSet(0);
    pub const ALL: RoleSet = RoleSet(0b11_1111);

    pub fn of(roles: &[Role]) -> Self {
        roles.iter().fold(Self::NONE, |set, r| set.with(*r))
    }

    pub fn with(self, role: Role) -> Self {
        RoleSet(self.0 | Self::bit(role))
    }

    pub fn contains(self, role: Role) -> bool {
        self.0 & Self::bit(role) != 0
    }

    fn bit(role: Role) -> u8 {
        match role {
            Role::Cluster => 1,
            Role::Shard => 2,
            Role::ShardExecute => 4,
            Role::Admin => 8,
            Role::Readonly => 16,
            Role::Coordinator => 32,
        }
    }
}

impl From<&[Role]> for RoleSet {
    fn from(roles: &[Role]) -> Self {
        Self::of(roles)
    }
}

/// Which roles may call what, checked by the authorization layer for mTLS callers
/// (plaintext and Unix-socket callers skip it). Lookup order: the exact method path, then
/// its service, then the default. Binding an asserted id to the caller (cluster `a` may only
/// speak for cluster `a`) is the handler's job — see [`Peer::ensure`].
#[derive(Debug, Clone)]
pub struct AuthzPolicy {
    methods: HashMap<String, RoleSet>,
    services: HashMap<String, RoleSet>,
    open_services: HashSet<String>,
    default: RoleSet,
}

impl AuthzPolicy {
    /// Denies everything not explicitly allowed (health and reflection stay open).
    pub fn deny_by_default() -> Self {
        Self {
            methods: HashMap::new(),
            services: HashMap::new(),
            open_services: [HEALTH_SERVICE]
                .into_iter()
                .chain(REFLECTION_SERVICES)
                .map(str::to_owned)
                .collect(),
            default: RoleSet::NONE,
        }
    }

    /// Any verified identity may call anything not restricted further (internal services
    /// whose callers are all trusted mesh processes).
    pub fn allow_any_identity() -> Self {
        Self {
            default: RoleSet::ALL,
            ..Self::deny_by_default()
        }
    }

    /// Allows `roles` on one method, e.g. `"/bigfleet.v1alpha1.Coordinator/AssignDomain"`.
    pub fn allow_method(mut self, path: &str, roles: &[Role]) -> Self {
        self.methods.insert(path.to_owned(), RoleSet::of(roles));
        self
    }

    /// Allows `roles` on every method of a service, e.g. `"bigfleet.v1alpha1.ShardRead"`.
    pub fn allow_service(mut self, service: &str, roles: &[Role]) -> Self {
        self.services.insert(service.to_owned(), RoleSet::of(roles));
        self
    }

    /// Lets any CA-verified caller use a service, even one whose certificate has no valid
    /// identity (and exempts it from per-identity rate limits).
    pub fn open_service(mut self, service: &str) -> Self {
        self.open_services.insert(service.to_owned());
        self
    }

    /// Whether `path` belongs to an open service.
    pub fn is_open(&self, path: &str) -> bool {
        self.open_services.contains(service_of(path))
    }

    /// The roles allowed on `path`.
    pub fn roles_for(&self, path: &str) -> RoleSet {
        self.methods
            .get(path)
            .or_else(|| self.services.get(service_of(path)))
            .copied()
            .unwrap_or(self.default)
    }

    /// The authorization decision for one request.
    pub fn check(&self, path: &str, peer: &Peer) -> Result<(), MeshError> {
        match peer {
            Peer::Plaintext | Peer::Local => Ok(()),
            _ if self.is_open(path) => Ok(()),
            Peer::Invalid(e) => Err(MeshError::PermissionDenied(e.to_string())),
            Peer::Verified(id) if self.roles_for(path).contains(id.role()) => Ok(()),
            Peer::Verified(id) => Err(MeshError::PermissionDenied(format!(
                "{id} (role {}) may not call {path}",
                id.role()
            ))),
        }
    }
}

impl Default for AuthzPolicy {
    fn default() -> Self {
        Self::deny_by_default()
    }
}

pub(crate) fn service_of(path: &str) -> &str {
    path.trim_start_matches('/')
        .split_once('/')
        .map_or("", |(service, _)| service)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_identity::{IdentityError, PeerIdentity};

    const ASSIGN: &str = "/bigfleet.v1alpha1.Coordinator/AssignDomain";
    const LIST: &str = "/bigfleet.v1alpha1.Coordinator/ListShards";
    const REPORT: &str = "/bigfleet.v1alpha1.Coordinator/ReportShard";

    fn coordinator_policy() -> AuthzPolicy {
        AuthzPolicy::deny_by_default()
            .allow_method(ASSIGN, &[Role::Admin])
            .allow_method(LIST, &[Role::Admin, Role::Readonly])
            .allow_method(REPORT, &[Role::Shard])
    }

    fn verified(id: PeerIdentity) -> Peer {
        Peer::Verified(id)
    }

    #[test]
    fn the_coordinator_matrix() {
        let p = coordinator_policy();
        let shard = verified(PeerIdentity::Shard("s1".into()));
        let admin = verified(PeerIdentity::Admin);
        let ro = verified(PeerIdentity::Readonly);
        assert!(p.check(REPORT, &shard).is_ok());
        assert!(
            p.check(REPORT, &admin).is_err(),
            "admin does not pass ReportShard"
        );
        assert!(p.check(LIST, &shard).is_err());
        assert!(p.check(ASSIGN, &shard).is_err());
        assert!(p.check(LIST, &admin).is_ok());
        assert!(p.check(ASSIGN, &admin).is_ok());
        assert!(p.check(LIST, &ro).is_ok());
        assert!(p.check(ASSIGN, &ro).is_err());
        // Unlisted methods are denied by default.
        assert!(
            p.check("/bigfleet.v1alpha1.Coordinator/Other", &admin)
                .is_err()
        );
    }

    #[test]
    fn plaintext_and_local_skip_checks() {
        let p = coordinator_policy();
        assert!(p.check(ASSIGN, &Peer::Plaintext).is_ok());
        assert!(p.check(ASSIGN, &Peer::Local).is_ok());
    }

    #[test]
    fn invalid_identities_only_reach_open_services() {
        let p = coordinator_policy();
        let invalid = Peer::Invalid(IdentityError::SanCount { found: 0 });
        let err = p.check(LIST, &invalid).unwrap_err();
        assert!(err.to_string().contains("exactly one bigfleet:// URI SAN"));
        assert!(p.check("/grpc.health.v1.Health/Check", &invalid).is_ok());
        assert!(
            p.check(
                "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                &invalid
            )
            .is_ok()
        );
    }

    #[test]
    fn method_rules_override_service_rules_which_override_the_default() {
        let p = AuthzPolicy::allow_any_identity()
            .allow_service("x.Svc", &[Role::Readonly])
            .allow_method("/x.Svc/Write", &[Role::Admin]);
        let ro = verified(PeerIdentity::Readonly);
        let cluster = verified(PeerIdentity::Cluster("a".into()));
        assert!(p.check("/x.Svc/Read", &ro).is_ok());
        assert!(p.check("/x.Svc/Read", &cluster).is_err());
        assert!(p.check("/x.Svc/Write", &ro).is_err());
        assert!(p.check("/y.Other/Any", &cluster).is_ok());
    }

    #[test]
    fn role_sets() {
        let s = RoleSet::of(&[Role::Admin, Role::Readonly]);
        assert!(s.contains(Role::Admin) && s.contains(Role::Readonly));
        assert!(!s.contains(Role::Shard));
        for r in Role::ALL {
            assert!(RoleSet::ALL.contains(r));
            assert!(!RoleSet::NONE.contains(r));
        }
    }
}
