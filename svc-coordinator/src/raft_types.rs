//! openraft type configuration, the node record, and how replica names become Raft ids.

// `declare_raft_types!` names `Cursor<Vec<u8>>` unqualified for the default snapshot data.
use std::io::Cursor;

use serde::{Deserialize, Serialize};

use crate::fsm::{ApplyResult, Command};

/// What every membership entry records about a replica.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CoordNode {
    /// The replica's `--id` (a StatefulSet pod name in Kubernetes).
    pub name: String,
    /// Where peers reach its Raft service (`host:port`).
    pub raft_addr: String,
    /// Where clients reach its Coordinator service (`host:port`): the leader hint followers
    /// hand out.
    pub api_addr: String,
}

/// The result of applying one entry; membership and blank entries answer `Ok(None)`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response(pub Option<ApplyResult>);

openraft::declare_raft_types!(
    /// The coordinator's openraft types: JSON commands, u64 node ids, tokio runtime.
    pub TypeConfig:
        D = Command,
        R = Response,
        NodeId = u64,
        Node = CoordNode,
);

pub type NodeId = u64;
pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, CoordNode>;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, CoordNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, CoordNode>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type StorageError = openraft::StorageError<NodeId>;

/// Raft node id of a replica name: FNV-1a 64 of the name. Stable across restarts and
/// identical on every replica without coordination, so `JoinRaftCluster` can carry the
/// name (as the original does) while openraft keeps integer ids. Zero is avoided because
/// some tooling treats it as "unset".
pub fn node_id_of(name: &str) -> NodeId {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// The StatefulSet ordinal of a replica name: the number after the last `-`
/// (`bigfleet-coordinator-2` ⇒ 2). `None` when the name has no such suffix.
pub fn ordinal_of(name: &str) -> Option<u32> {
    let (_, tail) = name.rsplit_once('-')?;
    if tail.is_empty() || !tail.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    tail.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinals_come_from_the_trailing_number() {
        assert_eq!(ordinal_of("bigfleet-coordinator-0"), Some(0));
        assert_eq!(ordinal_of("coord-12"), Some(12));
        assert_eq!(ordinal_of("node-1"), Some(1));
        assert_eq!(ordinal_of("node"), None);
        assert_eq!(ordinal_of("node-"), None);
        assert_eq!(ordinal_of("node-1a"), None);
        assert_eq!(ordinal_of("a-+1"), None);
    }

    #[test]
    fn node_ids_are_stable_and_distinct() {
        assert_eq!(node_id_of("coord-0"), node_id_of("coord-0"));
        let ids: std::collections::HashSet<_> = (0..1000)
            .map(|i| node_id_of(&format!("coord-{i}")))
            .collect();
        assert_eq!(ids.len(), 1000);
        assert_ne!(node_id_of(""), 0);
    }
}
