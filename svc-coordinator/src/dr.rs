//! Disaster recovery: snapshot archives (export directories and single files), the leader's
//! periodic export, and the offline single-voter restore `bigfleet admin snapshot restore`
//! runs against a stopped replica's data directory.
//!
//! Layouts:
//! * export directory `<export-dir>/<unix-millis>-<replica>/{meta.json,state}`, with
//!   `<export-dir>/latest` a symlink to the newest, swapped atomically by rename;
//! * single file (what `snapshot save <file>` writes): the metadata JSON on the first line,
//!   then the raw state bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use openraft::{Membership, Vote};

use crate::fsm::State;
use crate::raft_types::{CoordNode, SnapshotMeta, StoredMembership, node_id_of};
use crate::store::{DB_FILE, Store, StoreError};

pub const META_FILE: &str = "meta.json";
pub const STATE_FILE: &str = "state";
pub const LATEST_LINK: &str = "latest";

#[derive(Debug, thiserror::Error)]
pub enum DrError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("snapshot metadata: {0}")]
    Meta(#[source] serde_json::Error),
    #[error("snapshot state: {0}")]
    State(#[source] serde_json::Error),
    #[error("not a coordinator snapshot: {0}")]
    Invalid(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DrError + '_ {
    move |source| DrError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A snapshot outside the replica: the Raft metadata plus the state document.
#[derive(Debug, Clone, PartialEq)]
pub struct SnapshotArchive {
    pub meta: SnapshotMeta,
    pub state: Vec<u8>,
}

impl SnapshotArchive {
    /// Validates the parts of a snapshot (as SnapshotSave streams them).
    pub fn from_parts(meta_json: &[u8], state: Vec<u8>) -> Result<Self, DrError> {
        let meta: SnapshotMeta = serde_json::from_slice(meta_json).map_err(DrError::Meta)?;
        match &meta.last_log_id {
            Some(l) if l.index > 0 => {}
            // An index-0 snapshot holds nothing a cluster ever committed.
            _ => return Err(DrError::Invalid("snapshot has no log index")),
        }
        State::from_snapshot_json(&state).map_err(DrError::State)?;
        Ok(Self { meta, state })
    }

    pub fn meta_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.meta).unwrap_or_default()
    }

    /// Reads an export directory (or its `latest` link, or the export root, which means its
    /// `latest`) or a single snapshot file.
    pub fn read(path: &Path) -> Result<Self, DrError> {
        let meta_md = std::fs::metadata(path).map_err(io(path))?;
        if meta_md.is_dir() {
            let dir = if path.join(META_FILE).exists() {
                path.to_owned()
            } else {
                path.join(LATEST_LINK)
            };
            let meta_path = dir.join(META_FILE);
            let state_path = dir.join(STATE_FILE);
            let meta = std::fs::read(&meta_path).map_err(io(&meta_path))?;
            let state = std::fs::read(&state_path).map_err(io(&state_path))?;
            return Self::from_parts(&meta, state);
        }
        let bytes = std::fs::read(path).map_err(io(path))?;
        let nl = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or(DrError::Invalid("missing metadata line"))?;
        Self::from_parts(&bytes[..nl], bytes[nl + 1..].to_vec())
    }

    /// Writes the single-file form (temp file + rename, so a crash leaves no half file).
    pub fn write_file(&self, path: &Path) -> Result<(), DrError> {
        let tmp = path.with_extension("tmp");
        {
            let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&self.meta_json()).map_err(io(&tmp))?;
            f.write_all(b"\n").map_err(io(&tmp))?;
            f.write_all(&self.state).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, path).map_err(io(path))
    }

    /// Writes `<root>/<unix-millis>-<replica>/{meta.json,state}` and points `latest` at it.
    /// Returns the new directory.
    pub fn export_to(&self, root: &Path, replica: &str) -> Result<PathBuf, DrError> {
        std::fs::create_dir_all(root).map_err(io(root))?;
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let name = format!("{millis:013}-{replica}");
        let dir = root.join(&name);
        let staging = root.join(format!(".{name}.partial"));
        std::fs::create_dir_all(&staging).map_err(io(&staging))?;
        for (file, bytes) in [
            (META_FILE, self.meta_json()),
            (STATE_FILE, self.state.clone()),
        ] {
            let p = staging.join(file);
            let mut f = std::fs::File::create(&p).map_err(io(&p))?;
            f.write_all(&bytes).map_err(io(&p))?;
            f.sync_all().map_err(io(&p))?;
        }
        std::fs::rename(&staging, &dir).map_err(io(&dir))?;
        // Readers never see a missing or dangling `latest`: the new link is renamed over
        // the old one.
        let tmp_link = root.join(format!(".{LATEST_LINK}.tmp"));
        let _ = std::fs::remove_file(&tmp_link);
        std::os::unix::fs::symlink(&name, &tmp_link).map_err(io(&tmp_link))?;
        std::fs::rename(&tmp_link, root.join(LATEST_LINK)).map_err(io(root))?;
        Ok(dir)
    }
}

/// What an offline restore produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    pub term: u64,
    pub index: u64,
    pub shards: usize,
    pub domains: usize,
}

/// Rebuilds a stopped replica's data directory from a snapshot as a single-voter cluster of
/// just this replica (`node_id` is its `--id`, `raft_advertise` its Raft address), with
/// the current term seeded to the snapshot's term so post-restore entries never regress in
/// term. Start this replica first; the others start with empty data directories and join.
/// Restore the ordinal-0 replica: it is the one that would otherwise bootstrap an empty
/// cluster.
pub fn restore_snapshot(
    data_dir: &Path,
    node_id: &str,
    raft_advertise: &str,
    snapshot_path: &Path,
) -> Result<RestoreReport, DrError> {
    let archive = SnapshotArchive::read(snapshot_path)?;
    let state = State::from_snapshot_json(&archive.state).map_err(DrError::State)?;
    let last = archive
        .meta
        .last_log_id
        .ok_or(DrError::Invalid("snapshot has no log index"))?;

    // A snapshot at index N next to an unrelated log is undefined: start from nothing.
    let db = data_dir.join(DB_FILE);
    if db.exists() {
        std::fs::remove_file(&db).map_err(io(&db))?;
    }
    let store = Store::open(data_dir)?;
    let id = node_id_of(node_id);
    let node = CoordNode {
        name: node_id.to_owned(),
        raft_addr: raft_advertise.to_owned(),
        // Filled in by the replica itself on start (it fixes its own entry as leader).
        api_addr: String::new(),
    };
    let membership = Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, node)]));
    let meta = SnapshotMeta {
        last_log_id: Some(last),
        last_membership: StoredMembership::new(Some(last), membership),
        snapshot_id: format!("restored-{}-{}", last.leader_id.term, last.index),
    };
    let vote = Vote::new(last.leader_id.term, id);
    store.write_image(&state, &meta, &archive.state, &vote)?;
    let (shards, _, domains) = state.sizes();
    tracing::info!(
        data_dir = %data_dir.display(),
        node = node_id,
        term = last.leader_id.term,
        index = last.index,
        "restored snapshot as a single-voter cluster"
    );
    Ok(RestoreReport {
        term: last.leader_id.term,
        index: last.index,
        shards,
        domains,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::storage::RaftLogStorage;

    fn archive(index: u64) -> SnapshotArchive {
        crate::testing::snapshot_archive("a:1", index)
    }

    #[test]
    fn single_file_and_export_dir_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let a = archive(12);
        let f = dir.path().join("snap.bin");
        a.write_file(&f).unwrap();
        assert_eq!(SnapshotArchive::read(&f).unwrap(), a);

        let root = dir.path().join("exports");
        let first = a.export_to(&root, "coord-0").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = archive(13);
        let second = b.export_to(&root, "coord-0").unwrap();
        assert_ne!(first, second);
        // The root and `latest` both resolve to the newest export.
        assert_eq!(SnapshotArchive::read(&root).unwrap(), b);
        assert_eq!(SnapshotArchive::read(&root.join(LATEST_LINK)).unwrap(), b);
        assert_eq!(SnapshotArchive::read(&first).unwrap(), a);
    }

    #[test]
    fn index_zero_and_garbage_are_refused() {
        let a = archive(0);
        assert!(matches!(
            SnapshotArchive::from_parts(&a.meta_json(), a.state.clone()),
            Err(DrError::Invalid(_))
        ));
        let ok = archive(1);
        assert!(SnapshotArchive::from_parts(b"{", ok.state.clone()).is_err());
        assert!(SnapshotArchive::from_parts(&ok.meta_json(), b"nope".to_vec()).is_err());
    }

    #[tokio::test]
    async fn restore_builds_a_single_voter_image_with_the_snapshot_term() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("snap.bin");
        archive(12).write_file(&f).unwrap();
        let data = dir.path().join("data");
        // Stale content of the replica is replaced.
        {
            let s = Store::open(&data).unwrap();
            s.log_store().save_vote(&Vote::new(99, 5)).await.unwrap();
        }
        let rep = restore_snapshot(&data, "coord-0", "127.0.0.1:7791", &f).unwrap();
        assert_eq!(
            rep,
            RestoreReport {
                term: 7,
                index: 12,
                shards: 1,
                domains: 1
            }
        );
        let store = Store::open(&data).unwrap();
        let mut log = store.log_store();
        let vote = log.read_vote().await.unwrap().unwrap();
        assert_eq!(vote.leader_id().term, 7);
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id.unwrap().index, 12);
        let shared = store.shared();
        let d = shared.read();
        let voters: Vec<_> = d.membership.voter_ids().collect();
        assert_eq!(voters, vec![node_id_of("coord-0")]);
        assert_eq!(d.state.shards().len(), 1);
        assert_eq!(d.last_applied.unwrap().index, 12);
    }
}
