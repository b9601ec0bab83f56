//! The replica's disk: Raft log, vote, state machine and latest snapshot in one redb file
//! (`<data-dir>/raft.redb`, layout in docs/adr/0060). Every write transaction commits with
//! redb's default `Durability::Immediate`, i.e. fsync before openraft is told it is done.

use std::io::Cursor;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{AnyError, EntryPayload, RaftLogReader, RaftSnapshotBuilder, StorageIOError};
use parking_lot::RwLock;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::fsm::{Command, DomainKey, Effect, ShardEntry, State};
use crate::raft_types::{
    Entry, LogId, Response, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    Vote,
};

/// The single database file inside `--data-dir`.
pub const DB_FILE: &str = "raft.redb";

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");
const SM_SHARDS: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_shards");
const SM_CLUSTERS: TableDefinition<&str, &str> = TableDefinition::new("sm_clusters");
const SM_DOMAINS: TableDefinition<&str, &str> = TableDefinition::new("sm_domains");
/// One row, [`K_TRANSFERS`]: the transfers document (ADR-0130; small and bounded).
const SM_TRANSFERS: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_transfers");
const K_TRANSFERS: &str = "transfers";
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

const K_VOTE: &str = "vote";
const K_PURGED: &str = "last_purged";
const K_APPLIED: &str = "applied";
const K_MEMBERSHIP: &str = "membership";
const K_SNAP_META: &str = "meta";
const K_SNAP_DATA: &str = "data";

/// Errors opening or rebuilding a data directory (outside openraft's own error type).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("data dir {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("redb: {0}")]
    Db(#[from] redb::Error),
    #[error("corrupt {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self {
                StoreError::Db(e.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

fn sto<E: std::error::Error + 'static>(e: E) -> StorageError {
    StorageIOError::write(AnyError::new(&e)).into()
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Decode { what, source })
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Our types are plain data with string map keys: serialising them cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn domain_row_key(d: &DomainKey) -> String {
    encode_str(&(&d.key, &d.value))
}

fn encode_str<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// Runs redb work off the async workers (commits fsync).
async fn blocking<T, F>(f: F) -> Result<T, StorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, StoreError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(sto)?
        .map_err(sto)
}

fn write<T>(
    db: &Database,
    f: impl FnOnce(&WriteTransaction) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let txn = db.begin_write()?;
    let out = f(&txn)?;
    txn.commit()?;
    Ok(out)
}

/// What the state machine holds in memory; shared with the gRPC service for reads.
#[derive(Debug, Clone, Default)]
pub struct SmData {
    pub state: State,
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
}

/// Shared handle on the in-memory state machine.
pub type SharedState = Arc<RwLock<SmData>>;

/// An opened data directory.
#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    shared: SharedState,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) `<dir>/raft.redb` and loads the state machine into memory.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir).map_err(|source| StoreError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let db = Database::create(dir.join(DB_FILE))?;
        write(&db, |txn| {
            txn.open_table(LOG)?;
            txn.open_table(META)?;
            txn.open_table(SM_META)?;
            txn.open_table(SM_SHARDS)?;
            txn.open_table(SM_CLUSTERS)?;
            txn.open_table(SM_DOMAINS)?;
            txn.open_table(SM_TRANSFERS)?;
            txn.open_table(SNAPSHOT)?;
            Ok(())
        })?;
        let data = load_sm(&db)?;
        Ok(Self {
            db: Arc::new(db),
            shared: Arc::new(RwLock::new(data)),
        })
    }

    /// Whether this replica has ever been part of a cluster (a vote, a log entry or an
    /// applied state): bootstrap must never run over existing state.
    pub fn has_state(&self) -> Result<bool, StoreError> {
        let r = self.db.begin_read()?;
        let vote = r.open_table(META)?.get(K_VOTE)?.is_some();
        let log = r.open_table(LOG)?.last()?.is_some();
        Ok(vote || log || self.shared.read().last_applied.is_some())
    }

    pub fn shared(&self) -> SharedState {
        Arc::clone(&self.shared)
    }

    pub fn log_store(&self) -> LogStore {
        LogStore {
            db: Arc::clone(&self.db),
        }
    }

    pub fn state_machine(&self) -> StateMachine {
        StateMachine {
            db: Arc::clone(&self.db),
            shared: Arc::clone(&self.shared),
            builds: Arc::new(AtomicU64::new(0)),
        }
    }

    /// The stored snapshot (meta, state bytes), if one was built or installed.
    pub fn current_snapshot(&self) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError> {
        read_snapshot(&self.db)
    }

    /// Writes a whole replica image: used by offline restore. Replaces every table.
    pub(crate) fn write_image(
        &self,
        state: &State,
        meta: &SnapshotMeta,
        state_bytes: &[u8],
        vote: &Vote,
    ) -> Result<(), StoreError> {
        write(&self.db, |txn| {
            txn.delete_table(LOG)?;
            txn.open_table(LOG)?;
            let mut m = txn.open_table(META)?;
            m.insert(K_VOTE, encode(vote).as_slice())?;
            if let Some(last) = &meta.last_log_id {
                m.insert(K_PURGED, encode(last).as_slice())?;
            }
            drop(m);
            replace_sm_tables(txn, state, &meta.last_log_id, &meta.last_membership)?;
            let mut s = txn.open_table(SNAPSHOT)?;
            s.insert(K_SNAP_META, encode(meta).as_slice())?;
            s.insert(K_SNAP_DATA, state_bytes)?;
            Ok(())
        })?;
        *self.shared.write() = SmData {
            state: state.clone(),
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        Ok(())
    }
}

fn load_sm(db: &Database) -> Result<SmData, StoreError> {
    let r = db.begin_read()?;
    let meta = r.open_table(SM_META)?;
    let last_applied = match meta.get(K_APPLIED)? {
        Some(v) => decode("applied log id", v.value())?,
        None => None,
    };
    let membership = match meta.get(K_MEMBERSHIP)? {
        Some(v) => decode("membership", v.value())?,
        None => StoredMembership::default(),
    };
    // Rebuild through the snapshot path so the table is validated like a snapshot.
    let mut doc = SnapshotRows::default();
    for row in r.open_table(SM_SHARDS)?.iter()? {
        let (_, v) = row?;
        doc.shards.push(decode("shard row", v.value())?);
    }
    for row in r.open_table(SM_CLUSTERS)?.iter()? {
        let (k, v) = row?;
        doc.clusters
            .push((k.value().to_owned(), v.value().to_owned()));
    }
    for row in r.open_table(SM_DOMAINS)?.iter()? {
        let (k, v) = row?;
        let (key, value): (String, String) = decode("domain row", k.value().as_bytes())?;
        doc.domains
            .push((DomainKey::new(key, value), v.value().to_owned()));
    }
    let mut state = doc.into_state();
    if let Some(v) = r.open_table(SM_TRANSFERS)?.get(K_TRANSFERS)? {
        state
            .load_transfers_json(v.value())
            .map_err(|e| StoreError::Decode {
                what: "transfers row",
                source: e,
            })?;
    }
    Ok(SmData {
        state,
        last_applied,
        membership,
    })
}

#[derive(Default)]
struct SnapshotRows {
    shards: Vec<ShardEntry>,
    clusters: Vec<(String, String)>,
    domains: Vec<(DomainKey, String)>,
}

impl SnapshotRows {
    fn into_state(self) -> State {
        let mut st = State::new();
        for s in self.shards {
            let cmd = Command::AddShard {
                shard_id: s.id.clone(),
                address: s.address,
                registered_at_unix_ns: s.registered_at_unix_ns,
            };
            if st.apply(&cmd).is_ok() {
                st.mark_heartbeat(&s.id, s.last_heartbeat_unix_ns);
            }
        }
        for (cluster_id, shard_id) in self.clusters {
            let _ = st.apply(&Command::BindCluster {
                cluster_id,
                shard_id,
            });
        }
        for (domain, shard_id) in self.domains {
            let _ = st.apply(&Command::AssignDomain { domain, shard_id });
        }
        st
    }
}

fn replace_sm_tables(
    txn: &WriteTransaction,
    state: &State,
    applied: &Option<LogId>,
    membership: &StoredMembership,
) -> Result<(), StoreError> {
    txn.delete_table(SM_SHARDS)?;
    txn.delete_table(SM_CLUSTERS)?;
    txn.delete_table(SM_DOMAINS)?;
    let mut shards = txn.open_table(SM_SHARDS)?;
    for s in state.shards() {
        shards.insert(s.id.as_str(), encode(&s).as_slice())?;
    }
    let mut clusters = txn.open_table(SM_CLUSTERS)?;
    for (c, s) in state.cluster_bindings() {
        clusters.insert(c.as_str(), s.as_str())?;
    }
    let mut domains = txn.open_table(SM_DOMAINS)?;
    for a in state.domain_assignments() {
        domains.insert(domain_row_key(&a.domain).as_str(), a.shard_id.as_str())?;
    }
    txn.open_table(SM_TRANSFERS)?
        .insert(K_TRANSFERS, state.transfers_json().as_slice())?;
    let mut meta = txn.open_table(SM_META)?;
    meta.insert(K_APPLIED, encode(applied).as_slice())?;
    meta.insert(K_MEMBERSHIP, encode(membership).as_slice())?;
    Ok(())
}

fn read_snapshot(db: &Database) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StoreError> {
    let r = db.begin_read()?;
    let t = r.open_table(SNAPSHOT)?;
    let (Some(meta), Some(data)) = (t.get(K_SNAP_META)?, t.get(K_SNAP_DATA)?) else {
        return Ok(None);
    };
    Ok(Some((
        decode("snapshot meta", meta.value())?,
        data.value().to_vec(),
    )))
}

// === log ===

/// Raft log + vote. Cloned as the log reader (redb allows concurrent readers).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
}

fn read_meta<T: serde::de::DeserializeOwned>(
    db: &Database,
    key: &str,
) -> Result<Option<T>, StoreError> {
    let r = db.begin_read()?;
    let t = r.open_table(META)?;
    match t.get(key)? {
        Some(v) => Ok(Some(decode("raft meta", v.value())?)),
        None => Ok(None),
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + std::fmt::Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let db = Arc::clone(&self.db);
        let bounds: (Bound<u64>, Bound<u64>) =
            (range.start_bound().cloned(), range.end_bound().cloned());
        blocking(move || {
            let r = db.begin_read()?;
            let t = r.open_table(LOG)?;
            let mut out = Vec::new();
            for row in t.range::<u64>(bounds)? {
                let (_, v) = row?;
                out.push(decode::<Entry>("log entry", v.value())?);
            }
            Ok(out)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let last_purged: Option<LogId> = read_meta(&db, K_PURGED)?;
            let r = db.begin_read()?;
            let t = r.open_table(LOG)?;
            let last = match t.last()? {
                Some((_, v)) => Some(decode::<Entry>("log entry", v.value())?.log_id),
                None => last_purged,
            };
            Ok(LogState {
                last_purged_log_id: last_purged,
                last_log_id: last,
            })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        let db = Arc::clone(&self.db);
        let bytes = encode(vote);
        blocking(move || {
            write(&db, |txn| {
                txn.open_table(META)?.insert(K_VOTE, bytes.as_slice())?;
                Ok(())
            })
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let db = Arc::clone(&self.db);
        blocking(move || read_meta(&db, K_VOTE)).await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let rows: Vec<(u64, Vec<u8>)> = entries
            .into_iter()
            .map(|e| (e.log_id.index, encode(&e)))
            .collect();
        let db = Arc::clone(&self.db);
        let res = blocking(move || {
            write(&db, |txn| {
                let mut t = txn.open_table(LOG)?;
                for (i, bytes) in &rows {
                    t.insert(*i, bytes.as_slice())?;
                }
                Ok(())
            })
        })
        .await;
        // The commit above fsynced, so the entries are durable when we report them flushed.
        callback.log_io_completed(
            res.as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            write(&db, |txn| {
                let mut t = txn.open_table(LOG)?;
                t.retain_in::<u64, _>(log_id.index.., |_, _| false)?;
                Ok(())
            })
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            write(&db, |txn| {
                txn.open_table(META)?
                    .insert(K_PURGED, encode(&Some(log_id)).as_slice())?;
                let mut t = txn.open_table(LOG)?;
                t.retain_in::<u64, _>(..=log_id.index, |_, _| false)?;
                Ok(())
            })
        })
        .await
    }
}

// === state machine ===

/// The state machine: applies commands to the in-memory [`State`] and persists the touched
/// rows plus the applied log id in the same commit.
pub struct StateMachine {
    db: Arc<Database>,
    shared: SharedState,
    builds: Arc<AtomicU64>,
}

/// Rows a batch of entries touched, captured after applying.
#[derive(Default)]
struct Touched {
    shards: Vec<(String, Option<ShardEntry>)>,
    clusters: Vec<(String, Option<String>)>,
    domains: Vec<(DomainKey, Option<String>)>,
    /// The whole transfers document after the last command that changed it.
    transfers: Option<Vec<u8>>,
}

impl Touched {
    fn record(&mut self, state: &State, cmd: &Command, effect: &Effect) {
        match cmd {
            Command::AddShard { shard_id, .. } | Command::RemoveShard { shard_id } => {
                self.shards.push((shard_id.clone(), state.shard(shard_id)));
            }
            Command::BindCluster { cluster_id, .. } => {
                self.clusters
                    .push((cluster_id.clone(), state.cluster_shard(cluster_id)));
            }
            Command::AssignDomain { domain, .. } | Command::UnassignDomain { domain } => {
                self.domains
                    .push((domain.clone(), state.domain_owner(domain)));
            }
            Command::StartTransfer { .. } | Command::AckTransfer { .. } => {}
            Command::Legacy => {}
        }
        if matches!(
            cmd,
            Command::StartTransfer { .. }
                | Command::AckTransfer { .. }
                | Command::RemoveShard { .. }
        ) {
            self.transfers = Some(state.transfers_json());
        }
        if let Effect::ShardRemoved { clusters, domains } = effect {
            self.clusters
                .extend(clusters.iter().map(|c| (c.clone(), None)));
            self.domains
                .extend(domains.iter().map(|d| (d.clone(), None)));
        }
    }

    fn persist(
        &self,
        txn: &WriteTransaction,
        applied: &Option<LogId>,
        membership: &StoredMembership,
    ) -> Result<(), StoreError> {
        let mut shards = txn.open_table(SM_SHARDS)?;
        for (id, row) in &self.shards {
            match row {
                Some(s) => {
                    shards.insert(id.as_str(), encode(s).as_slice())?;
                }
                None => {
                    shards.remove(id.as_str())?;
                }
            }
        }
        let mut clusters = txn.open_table(SM_CLUSTERS)?;
        for (c, row) in &self.clusters {
            match row {
                Some(s) => {
                    clusters.insert(c.as_str(), s.as_str())?;
                }
                None => {
                    clusters.remove(c.as_str())?;
                }
            }
        }
        let mut domains = txn.open_table(SM_DOMAINS)?;
        for (d, row) in &self.domains {
            let k = domain_row_key(d);
            match row {
                Some(s) => {
                    domains.insert(k.as_str(), s.as_str())?;
                }
                None => {
                    domains.remove(k.as_str())?;
                }
            }
        }
        if let Some(doc) = &self.transfers {
            txn.open_table(SM_TRANSFERS)?
                .insert(K_TRANSFERS, doc.as_slice())?;
        }
        let mut meta = txn.open_table(SM_META)?;
        meta.insert(K_APPLIED, encode(applied).as_slice())?;
        meta.insert(K_MEMBERSHIP, encode(membership).as_slice())?;
        Ok(())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let d = self.shared.read();
        Ok((d.last_applied, d.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut touched = Touched::default();
        let mut out = Vec::new();
        let (applied, membership) = {
            let mut d = self.shared.write();
            for entry in entries {
                d.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => out.push(Response(None)),
                    EntryPayload::Normal(cmd) => {
                        let res = d.state.apply(&cmd);
                        if let Ok(effect) = &res {
                            touched.record(&d.state, &cmd, effect);
                        }
                        out.push(Response(Some(res)));
                    }
                    EntryPayload::Membership(m) => {
                        d.membership = StoredMembership::new(Some(entry.log_id), m);
                        out.push(Response(None));
                    }
                }
            }
            (d.last_applied, d.membership.clone())
        };
        let db = Arc::clone(&self.db);
        blocking(move || write(&db, |txn| touched.persist(txn, &applied, &membership))).await?;
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: Arc::clone(&self.db),
            shared: Arc::clone(&self.shared),
            builds: Arc::clone(&self.builds),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let state = State::from_snapshot_json(&bytes).map_err(|e| {
            StorageError::from(StorageIOError::read_snapshot(
                Some(meta.signature()),
                AnyError::new(&e),
            ))
        })?;
        let db = Arc::clone(&self.db);
        let meta2 = meta.clone();
        let st2 = state.clone();
        blocking(move || {
            write(&db, |txn| {
                replace_sm_tables(txn, &st2, &meta2.last_log_id, &meta2.last_membership)?;
                let mut s = txn.open_table(SNAPSHOT)?;
                s.insert(K_SNAP_META, encode(&meta2).as_slice())?;
                s.insert(K_SNAP_DATA, bytes.as_slice())?;
                Ok(())
            })
        })
        .await?;
        *self.shared.write() = SmData {
            state,
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
        };
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let db = Arc::clone(&self.db);
        let snap = blocking(move || read_snapshot(&db)).await?;
        Ok(snap.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// Serialises the whole table (a few MB at the original's largest scale) into one blob.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    shared: SharedState,
    builds: Arc<AtomicU64>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (data, last_log_id, membership) = {
            let d = self.shared.read();
            (
                d.state.to_snapshot_json(),
                d.last_applied,
                d.membership.clone(),
            )
        };
        let n = self.builds.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = match &last_log_id {
            Some(l) => format!("{}-{}-{n}", l.leader_id.term, l.index),
            None => format!("0-0-{n}"),
        };
        let meta = SnapshotMeta {
            last_log_id,
            last_membership: membership,
            snapshot_id,
        };
        let db = Arc::clone(&self.db);
        let (meta2, data2) = (meta.clone(), data.clone());
        blocking(move || {
            write(&db, |txn| {
                let mut s = txn.open_table(SNAPSHOT)?;
                s.insert(K_SNAP_META, encode(&meta2).as_slice())?;
                s.insert(K_SNAP_DATA, data2.as_slice())?;
                Ok(())
            })
        })
        .await?;
        tracing::debug!(snapshot = %meta.snapshot_id, bytes = data.len(), "snapshot built");
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, Membership};
    use std::collections::{BTreeMap, BTreeSet};

    use crate::raft_types::CoordNode;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn entry(term: u64, index: u64, cmd: Command) -> Entry {
        Entry {
            log_id: log_id(term, index),
            payload: EntryPayload::Normal(cmd),
        }
    }

    fn add(id: &str) -> Command {
        Command::AddShard {
            shard_id: id.into(),
            address: "a:1".into(),
            registered_at_unix_ns: 7,
        }
    }

    fn membership() -> openraft::Membership<u64, CoordNode> {
        Membership::new(
            vec![BTreeSet::from([1])],
            BTreeMap::from([(
                1,
                CoordNode {
                    name: "coord-0".into(),
                    raft_addr: "127.0.0.1:1".into(),
                    api_addr: "127.0.0.1:2".into(),
                },
            )]),
        )
    }

    #[tokio::test]
    async fn state_machine_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert!(!store.has_state().unwrap());
            let mut sm = store.state_machine();
            let res = sm
                .apply(vec![
                    Entry {
                        log_id: log_id(1, 1),
                        payload: EntryPayload::Membership(membership()),
                    },
                    entry(1, 2, add("s1")),
                    entry(1, 3, add("s2")),
                    entry(
                        1,
                        4,
                        Command::AssignDomain {
                            domain: DomainKey::new("rack", "r1"),
                            shard_id: "s2".into(),
                        },
                    ),
                    entry(1, 5, add("s1")),
                    entry(
                        1,
                        6,
                        Command::RemoveShard {
                            shard_id: "s1".into(),
                        },
                    ),
                ])
                .await
                .unwrap();
            assert_eq!(res[0], Response(None));
            assert_eq!(res[2], Response(Some(Ok(Effect::None))));
            assert!(matches!(res[4], Response(Some(Err(_)))));
        }
        let store = Store::open(dir.path()).unwrap();
        assert!(store.has_state().unwrap());
        let mut sm = store.state_machine();
        let (applied, m) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(log_id(1, 6)));
        assert_eq!(m.voter_ids().collect::<Vec<_>>(), vec![1]);
        let d = store.shared();
        let d = d.read();
        assert_eq!(d.state.shards().len(), 1);
        assert_eq!(
            d.state
                .domain_owner(&DomainKey::new("rack", "r1"))
                .as_deref(),
            Some("s2")
        );
    }

    /// A transfer in flight is replicated state: a restarted replica (a new leader after
    /// a failover) resumes it in the phase it had reached.
    #[tokio::test]
    async fn transfers_survive_reopen() {
        use crate::transfers::{AckVerdict, Phase, Transfer, TransferKind};
        let dir = tempfile::tempdir().unwrap();
        let t = Transfer {
            id: "t1".into(),
            kind: TransferKind::Idle,
            donor: "s1".into(),
            recipient: "s2".into(),
            instance_type: "gpu".into(),
            count: 1,
            priority: 5,
            phase: Phase::Release,
            instruction_id: "r1".into(),
            machine_ids: Vec::new(),
            started_at_unix_ns: 1,
            updated_at_unix_ns: 1,
            reason: String::new(),
            selectors: Vec::new(),
        };
        {
            let store = Store::open(dir.path()).unwrap();
            let mut sm = store.state_machine();
            sm.apply(vec![
                entry(1, 1, add("s1")),
                entry(1, 2, add("s2")),
                entry(1, 3, Command::StartTransfer { transfer: t }),
                entry(
                    1,
                    4,
                    Command::AckTransfer {
                        transfer_id: "t1".into(),
                        instruction_id: "r1".into(),
                        verdict: AckVerdict::Accepted,
                        machine_ids: vec!["m1".into()],
                        next_instruction_id: "a1".into(),
                        reason: String::new(),
                        at_unix_ns: 2,
                    },
                ),
            ])
            .await
            .unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let d = store.shared();
        let got = d.read().state.active_transfers();
        assert_eq!(got.len(), 1);
        assert_eq!(
            (
                got[0].phase,
                got[0].instruction_id.as_str(),
                got[0].machine_ids.as_slice()
            ),
            (Phase::Adopt, "a1", ["m1".to_owned()].as_slice())
        );
    }

    #[tokio::test]
    async fn snapshot_build_and_install_round_trip() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let src = Store::open(a.path()).unwrap();
        let mut sm = src.state_machine();
        sm.apply(vec![entry(2, 1, add("s1")), entry(2, 2, add("s2"))])
            .await
            .unwrap();
        let mut builder = sm.get_snapshot_builder().await;
        let snap = builder.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id, Some(log_id(2, 2)));

        let dst = Store::open(b.path()).unwrap();
        let mut sm2 = dst.state_machine();
        sm2.install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(dst.shared().read().state, src.shared().read().state);
        let cur = sm2.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(cur.meta, snap.meta);
        // Survives a reopen too.
        drop((sm2, dst));
        let again = Store::open(b.path()).unwrap();
        assert_eq!(again.shared().read().state, src.shared().read().state);
    }

    #[tokio::test]
    async fn log_append_truncate_purge_and_vote() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut log = store.log_store();
        assert_eq!(log.read_vote().await.unwrap(), None);
        let v = Vote::new(3, 9);
        log.save_vote(&v).await.unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(v));

        let rows: Vec<(u64, Vec<u8>)> = (1..=5)
            .map(|i| (i, encode(&entry(1, i, add(&format!("s{i}"))))))
            .collect();
        write(&store.db, |txn| {
            let mut t = txn.open_table(LOG)?;
            for (i, b) in &rows {
                t.insert(*i, b.as_slice())?;
            }
            Ok(())
        })
        .unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_log_id, Some(log_id(1, 5)));
        assert_eq!(log.try_get_log_entries(2..4).await.unwrap().len(), 2);

        log.truncate(log_id(1, 4)).await.unwrap();
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(log_id(1, 3))
        );
        log.purge(log_id(1, 2)).await.unwrap();
        let st = log.get_log_state().await.unwrap();
        assert_eq!(st.last_purged_log_id, Some(log_id(1, 2)));
        let left: Vec<u64> = log
            .try_get_log_entries(0..)
            .await
            .unwrap()
            .iter()
            .map(|e| e.log_id.index)
            .collect();
        assert_eq!(left, vec![3]);
        log.purge(log_id(1, 3)).await.unwrap();
        // Everything purged: the last log id falls back to the purge point.
        assert_eq!(
            log.get_log_state().await.unwrap().last_log_id,
            Some(log_id(1, 3))
        );
    }
}
