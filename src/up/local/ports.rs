//! The endpoints of a mesh (the `--ports-file` document), the loopback ports reserved for
//! children until their tier starts, and Unix socket paths within the kernel's limit.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::UpError;

/// Endpoints of the coordinator.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CoordinatorPorts {
    pub grpc: String,
    pub raft_grpc: String,
    pub http: String,
}

/// Endpoints of one shard.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ShardPorts {
    pub id: String,
    /// The public port operators dial (Session, ShardRead, ShardInfo).
    pub gateway_grpc: String,
    pub gateway_http: String,
    /// decide's Unix socket (gRPC, with health and reflection).
    pub decide_unix: String,
    pub decide_http: String,
    pub execute_http: String,
    /// The provider URI this shard's decide and execute use.
    pub provider: String,
    #[serde(skip)]
    pub socket_dir: PathBuf,
    #[serde(skip)]
    pub data_dir: PathBuf,
}

/// Endpoints of svc-inspect.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct InspectPorts {
    pub grpc: String,
    pub http: String,
    pub metrics_http: String,
    pub dashboard: String,
}

/// Endpoints of one fake provider.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProviderPorts {
    /// TCP gRPC address (plaintext meshes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grpc: Option<String>,
    /// Unix socket (under --tls, where TCP edges are mTLS and the fake serves none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix: Option<String>,
    /// Dialable URI.
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_http: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_http: Option<String>,
}

/// Every endpoint of a started mesh (the `--ports-file` document).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Ports {
    pub run_dir: String,
    pub tls: bool,
    /// The first replica (`coord-0`), which every other component is pointed at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coordinator: Option<CoordinatorPorts>,
    /// Every replica (with `--coordinators` above 1).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub coordinators: Vec<CoordinatorPorts>,
    pub shards: Vec<ShardPorts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inspect: Option<InspectPorts>,
    /// The first shard's provider (the only one with one shard).
    pub provider: ProviderPorts,
    pub providers: Vec<ProviderPorts>,
}

/// Ports reserved for children, each held until just before its tier starts: a tier that
/// starts seconds after planning (shards wait for the coordinator) must not find its ports
/// taken in the meantime.
#[derive(Default)]
pub(super) struct PortPool(Vec<(u8, bigfleet_mesh::ports::PortReservation)>);

impl PortPool {
    pub(super) fn take(&mut self, tier: u8) -> Result<SocketAddr, UpError> {
        let r = bigfleet_mesh::ports::reserve_loopback_port().map_err(|source| UpError::Io {
            what: "reserving a loopback port".into(),
            source,
        })?;
        let addr = r.addr();
        self.0.push((tier, r));
        Ok(addr)
    }

    /// Lets tier `tier`'s children bind their ports.
    pub(super) fn release(&mut self, tier: u8) {
        self.0.retain(|(t, _)| *t != tier);
    }
}

/// `dir/name` within the kernel's Unix socket path limit.
pub(super) fn socket_path(dir: &Path, name: &str) -> Result<PathBuf, UpError> {
    bigfleet_mesh::ports::unix_socket_path(dir, name).map_err(|len| {
        UpError::Config(format!(
            "unix socket path {} is {len} bytes, longer than the kernel's limit of 107; \
             pass a shorter --data-dir (Unix sockets live under it)",
            dir.join(name).display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_serialize_with_grpc_keys() {
        let p = Ports {
            run_dir: "/r".into(),
            tls: false,
            coordinator: Some(CoordinatorPorts {
                grpc: "127.0.0.1:1".into(),
                raft_grpc: "127.0.0.1:2".into(),
                http: "127.0.0.1:3".into(),
            }),
            coordinators: vec![],
            shards: vec![],
            inspect: None,
            provider: ProviderPorts {
                grpc: Some("127.0.0.1:4".into()),
                unix: None,
                target: "http://127.0.0.1:4".into(),
                admin_http: None,
                metrics_http: None,
            },
            providers: vec![],
        };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["coordinator"]["grpc"], "127.0.0.1:1");
        assert_eq!(v["provider"]["grpc"], "127.0.0.1:4");
        assert!(v.get("inspect").is_none());
        assert!(
            v.get("coordinators").is_none(),
            "only with several replicas"
        );
    }
}
