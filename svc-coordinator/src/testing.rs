//! Test support shared with other crates' tests (feature `testing`): small, valid coordinator
//! artefacts, so a test outside this crate never rebuilds them from the state machine's parts.

use crate::dr::SnapshotArchive;
use crate::fsm::{Command, DomainKey, State};
use crate::raft_types::{SnapshotMeta, StoredMembership};

/// A snapshot archive at term 7 and log `index`: one shard `s1` at `shard_address`, owning
/// topology domain `rack=r1`. Index 0 is what a restore must refuse.
pub fn snapshot_archive(shard_address: &str, index: u64) -> SnapshotArchive {
    let mut st = State::new();
    for command in [
        Command::AddShard {
            shard_id: "s1".into(),
            address: shard_address.into(),
            registered_at_unix_ns: 1,
        },
        Command::AssignDomain {
            domain: DomainKey::new("rack", "r1"),
            shard_id: "s1".into(),
        },
    ] {
        st.apply(&command)
            .expect("a fresh state takes the fixture's commands");
    }
    let last = openraft::LogId::new(openraft::CommittedLeaderId::new(7, 3), index);
    SnapshotArchive {
        meta: SnapshotMeta {
            last_log_id: Some(last),
            last_membership: StoredMembership::default(),
            snapshot_id: format!("fixture-{index}"),
        },
        state: st.to_snapshot_json(),
    }
}
