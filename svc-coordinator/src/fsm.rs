//! The replicated state: shards, cluster→shard and domain→shard, and the commands that change
//! them. Pure (no I/O, no clock): every replica applying the same commands in the same order
//! ends with the same state, so timestamps travel inside the commands.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::transfers::{self, AckVerdict, Phase, Transfer};

/// A registered shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub id: String,
    /// The advertise address the shard reported on first sight (never rewritten; an address
    /// change takes RemoveShard + a fresh report).
    pub address: String,
    pub registered_at_unix_ns: i64,
    /// Bumped by the leader on every report. Leader-local (not replicated through Raft, like
    /// the original): a new leader starts from whatever its copy holds.
    pub last_heartbeat_unix_ns: i64,
}

/// A topology domain: a (label key, label value) pair such as `rack=r17`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DomainKey {
    pub key: String,
    pub value: String,
}

impl DomainKey {
    pub fn new(key: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            value: value.into(),
        }
    }
}

impl std::fmt::Display for DomainKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// One pinned domain, as reads return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainAssignment {
    pub domain: DomainKey,
    pub shard_id: String,
}

/// A state-changing command, JSON-encoded in the Raft log (the volumes are tiny).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Command {
    /// Registers a shard; fails if the id is taken.
    AddShard {
        shard_id: String,
        address: String,
        registered_at_unix_ns: i64,
    },
    /// Forgets a shard and every cluster and domain bound to it.
    RemoveShard { shard_id: String },
    /// First contact wins: rebinding to the same shard is a no-op, to another an error.
    BindCluster {
        cluster_id: String,
        shard_id: String,
    },
    /// Pins a domain to a registered shard; same shard is a no-op, another an error.
    AssignDomain { domain: DomainKey, shard_id: String },
    /// Unpins a domain; a domain that was not pinned is fine.
    UnassignDomain { domain: DomainKey },
    /// Records a transfer the rebalancer decided (ADR-0130), in its release phase.
    StartTransfer { transfer: Transfer },
    /// A shard acknowledged a transfer's current instruction; `next_instruction_id` names
    /// the next phase's instruction. Acks of finished transfers or of other phases are
    /// no-ops, so redelivered acks are harmless.
    AckTransfer {
        transfer_id: String,
        instruction_id: String,
        verdict: AckVerdict,
        #[serde(default)]
        machine_ids: Vec<String>,
        next_instruction_id: String,
        #[serde(default)]
        reason: String,
        at_unix_ns: i64,
    },
    /// Commands of older revisions (quotas, provider registry). Their entries may still sit
    /// in a log written by an older binary; applying them changes nothing.
    #[serde(other)]
    Legacy,
}

/// Why a command was refused. Refusals are deterministic, so every replica refuses alike.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum FsmError {
    #[error("shard {0} already registered")]
    ShardExists(String),
    #[error("shard {0} not found")]
    ShardNotFound(String),
    #[error("cluster {cluster} already bound to shard {bound_to}")]
    ClusterAlreadyBound { cluster: String, bound_to: String },
    #[error("domain {domain} already assigned to shard {owner}")]
    DomainAlreadyAssigned { domain: DomainKey, owner: String },
    #[error("invalid command: {0}")]
    Invalid(String),
}

/// What a successful command did beyond its own key, for persistence and for instructions.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Effect {
    #[default]
    None,
    /// RemoveShard's cascade.
    ShardRemoved {
        clusters: Vec<String>,
        domains: Vec<DomainKey>,
    },
    /// UnassignDomain: who owned it before (`None`: it was not pinned).
    DomainUnassigned { previous_owner: Option<String> },
    /// StartTransfer/AckTransfer: the transfer as it stands now.
    Transfer(Transfer),
}

/// The outcome of applying one log entry (openraft's `R`).
pub type ApplyResult = Result<Effect, FsmError>;

/// The whole replicated table. Maps are ordered, so every read is sorted for free.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    shards: BTreeMap<String, ShardEntry>,
    cluster_to_shard: BTreeMap<String, String>,
    domain_to_shard: BTreeMap<DomainKey, String>,
    /// Transfers in flight, by transfer id.
    transfers: BTreeMap<String, Transfer>,
    /// Finished transfers, oldest first, at most [`transfers::MAX_RECENT`].
    recent_transfers: VecDeque<Transfer>,
}

fn require(field: &str, value: &str) -> Result<(), FsmError> {
    if value.is_empty() {
        Err(FsmError::Invalid(format!("{field} is required")))
    } else {
        Ok(())
    }
}

/// Pins `key` to `shard`: a no-op when it is already there, `Err(owner)` when another shard
/// holds it.
fn pin<K: Ord>(map: &mut BTreeMap<K, String>, key: K, shard: &str) -> Result<(), String> {
    match map.entry(key) {
        Entry::Occupied(e) if e.get() == shard => Ok(()),
        Entry::Occupied(e) => Err(e.get().clone()),
        Entry::Vacant(e) => {
            e.insert(shard.to_owned());
            Ok(())
        }
    }
}

/// Unpins everything pinned to `shard` and returns those keys, sorted.
fn unpin_all<K: Ord + Clone>(map: &mut BTreeMap<K, String>, shard: &str) -> Vec<K> {
    let keys: Vec<K> = map
        .iter()
        .filter(|(_, s)| s.as_str() == shard)
        .map(|(k, _)| k.clone())
        .collect();
    for k in &keys {
        map.remove(k);
    }
    keys
}

impl State {
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one command. The only mutation entry point besides [`State::mark_heartbeat`].
    pub fn apply(&mut self, cmd: &Command) -> ApplyResult {
        match cmd {
            Command::AddShard {
                shard_id,
                address,
                registered_at_unix_ns,
            } => self
                .add_shard(shard_id, address, *registered_at_unix_ns)
                .map(|()| Effect::None),
            Command::RemoveShard { shard_id } => self.remove_shard(shard_id),
            Command::BindCluster {
                cluster_id,
                shard_id,
            } => self
                .bind_cluster(cluster_id, shard_id)
                .map(|()| Effect::None),
            Command::AssignDomain { domain, shard_id } => {
                self.assign_domain(domain, shard_id).map(|()| Effect::None)
            }
            Command::UnassignDomain { domain } => Ok(Effect::DomainUnassigned {
                previous_owner: self.unassign_domain(domain)?,
            }),
            Command::StartTransfer { transfer } => self.start_transfer(transfer),
            Command::AckTransfer {
                transfer_id,
                instruction_id,
                verdict,
                machine_ids,
                next_instruction_id,
                reason,
                at_unix_ns,
            } => Ok(self.ack_transfer(
                transfer_id,
                &transfers::Ack {
                    instruction_id,
                    verdict: *verdict,
                    machine_ids,
                    next_instruction_id,
                    reason,
                    at_unix_ns: *at_unix_ns,
                },
            )),
            Command::Legacy => Ok(Effect::None),
        }
    }

    fn start_transfer(&mut self, t: &Transfer) -> ApplyResult {
        require("transfer id", &t.id)?;
        require("instruction_id", &t.instruction_id)?;
        require("donor", &t.donor)?;
        require("recipient", &t.recipient)?;
        self.registered(&t.donor)?;
        self.registered(&t.recipient)?;
        if t.donor == t.recipient {
            return Err(FsmError::Invalid("a transfer needs two shards".into()));
        }
        if t.phase != Phase::Release || t.count == 0 || !t.machine_ids.is_empty() {
            return Err(FsmError::Invalid(
                "a transfer starts in its release phase with a count and no machines".into(),
            ));
        }
        if self.transfers.contains_key(&t.id) {
            return Err(FsmError::Invalid(format!("transfer {} exists", t.id)));
        }
        // Never both directions between a pair: the reverse one must finish first.
        if let Some(rev) = self
            .transfers
            .values()
            .find(|o| o.donor == t.recipient && o.recipient == t.donor)
        {
            return Err(FsmError::Invalid(format!(
                "transfer {} already moves {} to {}",
                rev.id, rev.donor, rev.recipient
            )));
        }
        self.transfers.insert(t.id.clone(), t.clone());
        Ok(Effect::Transfer(t.clone()))
    }

    fn ack_transfer(&mut self, id: &str, ack: &transfers::Ack<'_>) -> Effect {
        // A machine already moving in another transfer is never named twice.
        let busy: BTreeSet<&String> = self
            .transfers
            .values()
            .filter(|o| o.id != id)
            .flat_map(|o| o.machine_ids.iter())
            .collect();
        let ids: Vec<String> = ack
            .machine_ids
            .iter()
            .filter(|m| !busy.contains(m))
            .cloned()
            .collect();
        let Some(t) = self.transfers.get_mut(id) else {
            return Effect::None;
        };
        let ack = transfers::Ack {
            machine_ids: &ids,
            ..*ack
        };
        if !transfers::advance(t, &ack) {
            return Effect::None;
        }
        let t = t.clone();
        if !t.phase.is_active() {
            self.transfers.remove(id);
            self.push_recent(t.clone());
        }
        Effect::Transfer(t)
    }

    fn push_recent(&mut self, t: Transfer) {
        self.recent_transfers.push_back(t);
        while self.recent_transfers.len() > transfers::MAX_RECENT {
            self.recent_transfers.pop_front();
        }
    }

    fn add_shard(&mut self, id: &str, address: &str, now: i64) -> Result<(), FsmError> {
        require("shard_id", id)?;
        if self.shards.contains_key(id) {
            return Err(FsmError::ShardExists(id.to_owned()));
        }
        self.shards.insert(
            id.to_owned(),
            ShardEntry {
                id: id.to_owned(),
                address: address.to_owned(),
                registered_at_unix_ns: now,
                last_heartbeat_unix_ns: now,
            },
        );
        Ok(())
    }

    fn remove_shard(&mut self, id: &str) -> ApplyResult {
        if self.shards.remove(id).is_none() {
            return Err(FsmError::ShardNotFound(id.to_owned()));
        }
        let clusters = unpin_all(&mut self.cluster_to_shard, id);
        let domains = unpin_all(&mut self.domain_to_shard, id);
        // Transfers involving the shard end here; its machines are nobody's to move now.
        let ended: Vec<String> = self
            .transfers
            .values()
            .filter(|t| t.donor == id || t.recipient == id)
            .map(|t| t.id.clone())
            .collect();
        for tid in ended {
            if let Some(mut t) = self.transfers.remove(&tid) {
                t.phase = Phase::Failed;
                t.reason = format!("shard {id} removed");
                self.push_recent(t);
            }
        }
        Ok(Effect::ShardRemoved { clusters, domains })
    }

    fn bind_cluster(&mut self, cluster: &str, shard: &str) -> Result<(), FsmError> {
        require("cluster_id", cluster)?;
        require("shard_id", shard)?;
        self.registered(shard)?;
        pin(&mut self.cluster_to_shard, cluster.to_owned(), shard).map_err(|bound_to| {
            FsmError::ClusterAlreadyBound {
                cluster: cluster.to_owned(),
                bound_to,
            }
        })
    }

    fn assign_domain(&mut self, domain: &DomainKey, shard: &str) -> Result<(), FsmError> {
        require("topology_key", &domain.key)?;
        require("topology_value", &domain.value)?;
        require("shard_id", shard)?;
        self.registered(shard)?;
        pin(&mut self.domain_to_shard, domain.clone(), shard).map_err(|owner| {
            FsmError::DomainAlreadyAssigned {
                domain: domain.clone(),
                owner,
            }
        })
    }

    fn registered(&self, shard: &str) -> Result<(), FsmError> {
        if self.shards.contains_key(shard) {
            Ok(())
        } else {
            Err(FsmError::ShardNotFound(shard.to_owned()))
        }
    }

    fn unassign_domain(&mut self, domain: &DomainKey) -> Result<Option<String>, FsmError> {
        require("topology_key", &domain.key)?;
        require("topology_value", &domain.value)?;
        Ok(self.domain_to_shard.remove(domain))
    }

    /// Leader-local heartbeat; unknown shards are ignored (a report racing a RemoveShard).
    pub fn mark_heartbeat(&mut self, id: &str, now: i64) {
        if let Some(s) = self.shards.get_mut(id) {
            s.last_heartbeat_unix_ns = now;
        }
    }

    // --- reads: copies, sorted ---

    pub fn shard(&self, id: &str) -> Option<ShardEntry> {
        self.shards.get(id).cloned()
    }

    pub fn has_shard(&self, id: &str) -> bool {
        self.shards.contains_key(id)
    }

    /// Every shard, sorted by id.
    pub fn shards(&self) -> Vec<ShardEntry> {
        self.shards.values().cloned().collect()
    }

    pub fn cluster_shard(&self, cluster: &str) -> Option<String> {
        self.cluster_to_shard.get(cluster).cloned()
    }

    /// Every cluster binding, sorted by cluster id.
    pub fn cluster_bindings(&self) -> Vec<(String, String)> {
        self.cluster_to_shard
            .iter()
            .map(|(c, s)| (c.clone(), s.clone()))
            .collect()
    }

    pub fn domain_owner(&self, domain: &DomainKey) -> Option<String> {
        self.domain_to_shard.get(domain).cloned()
    }

    /// A shard's domains, sorted by (key, value).
    pub fn domains_for_shard(&self, shard: &str) -> Vec<DomainKey> {
        self.domain_to_shard
            .iter()
            .filter(|(_, s)| s.as_str() == shard)
            .map(|(d, _)| d.clone())
            .collect()
    }

    /// Every pinned domain ordered by shard id, then (key, value).
    pub fn domain_assignments(&self) -> Vec<DomainAssignment> {
        let mut out: Vec<DomainAssignment> = self
            .domain_to_shard
            .iter()
            .map(|(d, s)| DomainAssignment {
                domain: d.clone(),
                shard_id: s.clone(),
            })
            .collect();
        out.sort_by(|a, b| (&a.shard_id, &a.domain).cmp(&(&b.shard_id, &b.domain)));
        out
    }

    /// Transfers in flight, by id.
    pub fn active_transfers(&self) -> Vec<Transfer> {
        self.transfers.values().cloned().collect()
    }

    /// Finished transfers, oldest first.
    pub fn recent_transfers(&self) -> Vec<Transfer> {
        self.recent_transfers.iter().cloned().collect()
    }

    /// The transfer whose current instruction is `instruction_id`.
    pub fn transfer_by_instruction(&self, instruction_id: &str) -> Option<Transfer> {
        self.transfers
            .values()
            .find(|t| t.instruction_id == instruction_id)
            .cloned()
    }

    /// (shards, cluster bindings, domain assignments): for gauges and logs.
    pub fn sizes(&self) -> (usize, usize, usize) {
        (
            self.shards.len(),
            self.cluster_to_shard.len(),
            self.domain_to_shard.len(),
        )
    }

    // --- snapshots ---

    /// The snapshot document: one JSON blob of the whole table.
    pub fn to_snapshot_json(&self) -> Vec<u8> {
        let doc = SnapshotDoc {
            shards: self.shards(),
            cluster_to_shard: self.cluster_to_shard.clone(),
            domain_to_shard: self
                .domain_to_shard
                .iter()
                .map(|(d, s)| DomainPair {
                    key: d.key.clone(),
                    value: d.value.clone(),
                    shard: s.clone(),
                })
                .collect(),
            transfers: self.transfers.values().cloned().collect(),
            recent_transfers: self.recent_transfers.iter().cloned().collect(),
        };
        // Serialising plain strings, integers and string-keyed maps cannot fail.
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// The transfers (in flight and recent) as one JSON document: the store's
    /// `sm_transfers` row.
    pub fn transfers_json(&self) -> Vec<u8> {
        let doc = TransfersDoc {
            transfers: self.transfers.values().cloned().collect(),
            recent_transfers: self.recent_transfers.iter().cloned().collect(),
        };
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// Replaces the transfers from a [`State::transfers_json`] document; transfers naming
    /// an unregistered shard are dropped (as a snapshot restore would).
    pub fn load_transfers_json(&mut self, bytes: &[u8]) -> Result<(), serde_json::Error> {
        let doc: TransfersDoc = serde_json::from_slice(bytes)?;
        self.transfers.clear();
        self.recent_transfers.clear();
        self.insert_transfers(doc);
        Ok(())
    }

    fn insert_transfers(&mut self, doc: TransfersDoc) {
        for t in doc.transfers {
            if t.phase.is_active() && self.has_shard(&t.donor) && self.has_shard(&t.recipient) {
                self.transfers.insert(t.id.clone(), t);
            }
        }
        for t in doc.recent_transfers {
            self.push_recent(t);
        }
    }

    /// Rebuilds a state from a snapshot document. Entries are replayed through the same
    /// mutators as live commands, so a snapshot cannot produce a table the live path would
    /// refuse; unknown keys (the older revisions' `quotas` and `providers`) are ignored.
    pub fn from_snapshot_json(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        let doc: SnapshotDoc = serde_json::from_slice(bytes)?;
        let mut state = State::new();
        for s in doc.shards {
            if state
                .add_shard(&s.id, &s.address, s.registered_at_unix_ns)
                .is_ok()
            {
                state.mark_heartbeat(&s.id, s.last_heartbeat_unix_ns);
            }
        }
        for (cluster, shard) in &doc.cluster_to_shard {
            let _ = state.bind_cluster(cluster, shard);
        }
        for d in doc.domain_to_shard {
            let _ = state.assign_domain(&DomainKey::new(d.key, d.value), &d.shard);
        }
        state.insert_transfers(TransfersDoc {
            transfers: doc.transfers,
            recent_transfers: doc.recent_transfers,
        });
        Ok(state)
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotDoc {
    #[serde(default)]
    shards: Vec<ShardEntry>,
    #[serde(default)]
    cluster_to_shard: BTreeMap<String, String>,
    #[serde(default)]
    domain_to_shard: Vec<DomainPair>,
    #[serde(default)]
    transfers: Vec<Transfer>,
    #[serde(default)]
    recent_transfers: Vec<Transfer>,
}

#[derive(Serialize, Deserialize)]
struct TransfersDoc {
    #[serde(default)]
    transfers: Vec<Transfer>,
    #[serde(default)]
    recent_transfers: Vec<Transfer>,
}

#[derive(Serialize, Deserialize)]
struct DomainPair {
    key: String,
    value: String,
    shard: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn add(id: &str) -> Command {
        Command::AddShard {
            shard_id: id.into(),
            address: format!("{id}.svc:7780"),
            registered_at_unix_ns: 10,
        }
    }

    fn assign(k: &str, v: &str, shard: &str) -> Command {
        Command::AssignDomain {
            domain: DomainKey::new(k, v),
            shard_id: shard.into(),
        }
    }

    fn bind(c: &str, s: &str) -> Command {
        Command::BindCluster {
            cluster_id: c.into(),
            shard_id: s.into(),
        }
    }

    #[test]
    fn add_shard_registers_once() {
        let mut st = State::new();
        assert_eq!(st.apply(&add("s1")), Ok(Effect::None));
        let e = st.shard("s1").unwrap();
        assert_eq!(e.address, "s1.svc:7780");
        assert_eq!(
            (e.registered_at_unix_ns, e.last_heartbeat_unix_ns),
            (10, 10)
        );
        assert_eq!(
            st.apply(&add("s1")),
            Err(FsmError::ShardExists("s1".into()))
        );
        assert!(matches!(st.apply(&add("")), Err(FsmError::Invalid(_))));
    }

    #[test]
    fn remove_shard_cascades_and_unknown_is_not_found() {
        let mut st = State::new();
        for c in [add("s1"), add("s2"), bind("c1", "s1"), bind("c2", "s2")] {
            st.apply(&c).unwrap();
        }
        st.apply(&assign("rack", "r1", "s1")).unwrap();
        st.apply(&assign("rack", "r2", "s2")).unwrap();
        let eff = st
            .apply(&Command::RemoveShard {
                shard_id: "s1".into(),
            })
            .unwrap();
        assert_eq!(
            eff,
            Effect::ShardRemoved {
                clusters: vec!["c1".into()],
                domains: vec![DomainKey::new("rack", "r1")],
            }
        );
        assert!(!st.has_shard("s1"));
        assert_eq!(st.cluster_shard("c1"), None);
        assert_eq!(st.cluster_shard("c2").as_deref(), Some("s2"));
        assert_eq!(st.domain_owner(&DomainKey::new("rack", "r1")), None);
        assert_eq!(
            st.apply(&Command::RemoveShard {
                shard_id: "s1".into()
            }),
            Err(FsmError::ShardNotFound("s1".into()))
        );
    }

    #[test]
    fn bind_cluster_first_contact_wins() {
        let mut st = State::new();
        st.apply(&add("s1")).unwrap();
        st.apply(&add("s2")).unwrap();
        st.apply(&bind("c1", "s1")).unwrap();
        // Same shard again: idempotent.
        st.apply(&bind("c1", "s1")).unwrap();
        assert_eq!(
            st.apply(&bind("c1", "s2")),
            Err(FsmError::ClusterAlreadyBound {
                cluster: "c1".into(),
                bound_to: "s1".into()
            })
        );
        assert_eq!(
            st.apply(&bind("c2", "nope")),
            Err(FsmError::ShardNotFound("nope".into()))
        );
        assert!(matches!(
            st.apply(&bind("", "s1")),
            Err(FsmError::Invalid(_))
        ));
        assert_eq!(st.cluster_bindings(), vec![("c1".into(), "s1".into())]);
    }

    #[test]
    fn assign_domain_is_idempotent_and_conflicts_are_refused() {
        let mut st = State::new();
        st.apply(&add("s1")).unwrap();
        st.apply(&add("s2")).unwrap();
        st.apply(&assign("rack", "r1", "s1")).unwrap();
        st.apply(&assign("rack", "r1", "s1")).unwrap();
        assert_eq!(
            st.apply(&assign("rack", "r1", "s2")),
            Err(FsmError::DomainAlreadyAssigned {
                domain: DomainKey::new("rack", "r1"),
                owner: "s1".into()
            })
        );
        assert_eq!(
            st.apply(&assign("rack", "r9", "ghost")),
            Err(FsmError::ShardNotFound("ghost".into()))
        );
        for bad in [
            assign("", "r", "s1"),
            assign("k", "", "s1"),
            assign("k", "v", ""),
        ] {
            assert!(
                matches!(st.apply(&bad), Err(FsmError::Invalid(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unassign_domain_reports_previous_owner_and_is_idempotent() {
        let mut st = State::new();
        st.apply(&add("s1")).unwrap();
        st.apply(&assign("rack", "r1", "s1")).unwrap();
        let un = Command::UnassignDomain {
            domain: DomainKey::new("rack", "r1"),
        };
        assert_eq!(
            st.apply(&un),
            Ok(Effect::DomainUnassigned {
                previous_owner: Some("s1".into())
            })
        );
        assert_eq!(
            st.apply(&un),
            Ok(Effect::DomainUnassigned {
                previous_owner: None
            })
        );
        assert!(matches!(
            st.apply(&Command::UnassignDomain {
                domain: DomainKey::new("", "x")
            }),
            Err(FsmError::Invalid(_))
        ));
    }

    #[test]
    fn reads_are_sorted() {
        let mut st = State::new();
        for id in ["s3", "s1", "s2"] {
            st.apply(&add(id)).unwrap();
        }
        st.apply(&assign("zone", "b", "s1")).unwrap();
        st.apply(&assign("rack", "r2", "s2")).unwrap();
        st.apply(&assign("rack", "r1", "s1")).unwrap();
        st.apply(&assign("zone", "a", "s1")).unwrap();
        let ids: Vec<_> = st.shards().into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["s1", "s2", "s3"]);
        let got: Vec<_> = st
            .domain_assignments()
            .into_iter()
            .map(|a| format!("{}:{}", a.shard_id, a.domain))
            .collect();
        assert_eq!(got, ["s1:rack=r1", "s1:zone=a", "s1:zone=b", "s2:rack=r2"]);
        assert_eq!(
            st.domains_for_shard("s1"),
            vec![
                DomainKey::new("rack", "r1"),
                DomainKey::new("zone", "a"),
                DomainKey::new("zone", "b")
            ]
        );
    }

    #[test]
    fn heartbeat_is_a_noop_for_unknown_shards() {
        let mut st = State::new();
        st.apply(&add("s1")).unwrap();
        st.mark_heartbeat("s1", 99);
        st.mark_heartbeat("ghost", 99);
        assert_eq!(st.shard("s1").unwrap().last_heartbeat_unix_ns, 99);
        assert_eq!(st.sizes(), (1, 0, 0));
    }

    #[test]
    fn commands_round_trip_and_legacy_kinds_are_noops() {
        let cmd = assign("rack", "r1", "s1");
        let json = serde_json::to_string(&cmd).unwrap();
        assert!(json.contains("\"kind\":\"assign_domain\""), "{json}");
        assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), cmd);
        let legacy: Command = serde_json::from_str(
            r#"{"kind":"set_quota","provider":"p","region":"r","per_shard":{"s1":3}}"#,
        )
        .unwrap();
        assert_eq!(legacy, Command::Legacy);
        let mut st = State::new();
        assert_eq!(st.apply(&legacy), Ok(Effect::None));
        assert_eq!(st, State::new());
    }

    #[test]
    fn snapshot_round_trip_equals_live_state() {
        let mut st = State::new();
        for c in [
            add("s1"),
            add("s2"),
            bind("c1", "s1"),
            bind("c2", "s2"),
            assign("rack", "r1", "s1"),
            assign("zone", "z", "s2"),
        ] {
            st.apply(&c).unwrap();
        }
        st.mark_heartbeat("s2", 1234);
        let back = State::from_snapshot_json(&st.to_snapshot_json()).unwrap();
        assert_eq!(back, st);
        assert_eq!(back.shard("s2").unwrap().last_heartbeat_unix_ns, 1234);
    }

    #[test]
    fn old_snapshots_with_quotas_and_providers_restore() {
        let old = br#"{
            "shards":[{"id":"s1","address":"a:1","registered_at_unix_ns":5,"last_heartbeat_unix_ns":6}],
            "cluster_to_shard":{"c1":"s1","orphan":"gone"},
            "domain_to_shard":[{"key":"rack","value":"r1","shard":"s1"}],
            "quotas":[{"provider":"p","region":"r","per_shard":{"s1":4}}],
            "providers":{"p":{"name":"p","address":"x:1","region":"r"}}
        }"#;
        let st = State::from_snapshot_json(old).unwrap();
        assert_eq!(st.sizes(), (1, 1, 1));
        // A binding to a shard that is not in the snapshot is dropped, as the live path would.
        assert_eq!(st.cluster_shard("orphan"), None);
        assert_eq!(st.shard("s1").unwrap().last_heartbeat_unix_ns, 6);
    }

    fn arb_cmd() -> impl Strategy<Value = Command> {
        let id = prop::sample::select(vec!["s1", "s2", "s3"]);
        let dom = prop::sample::select(vec!["r1", "r2", "r3", "r4"]);
        let cl = prop::sample::select(vec!["c1", "c2"]);
        prop_oneof![
            id.clone().prop_map(add),
            id.clone()
                .prop_map(|s| Command::RemoveShard { shard_id: s.into() }),
            (cl, id.clone()).prop_map(|(c, s)| bind(c, s)),
            (dom.clone(), id).prop_map(|(d, s)| assign("rack", d, s)),
            dom.prop_map(|d| Command::UnassignDomain {
                domain: DomainKey::new("rack", d)
            }),
        ]
    }

    proptest! {
        /// Whatever sequence of commands ran, no binding points at an unregistered shard,
        /// and a snapshot restores to the same table.
        #[test]
        fn bindings_only_point_at_registered_shards(cmds in prop::collection::vec(arb_cmd(), 0..60)) {
            let mut st = State::new();
            for c in &cmds {
                let _ = st.apply(c);
            }
            for (_, s) in st.cluster_bindings() {
                prop_assert!(st.has_shard(&s));
            }
            for a in st.domain_assignments() {
                prop_assert!(st.has_shard(&a.shard_id));
            }
            prop_assert_eq!(State::from_snapshot_json(&st.to_snapshot_json()).unwrap(), st);
        }
    }
}

#[cfg(test)]
mod transfer_tests {
    use super::*;
    use crate::transfers::TransferKind;

    fn state() -> State {
        let mut st = State::new();
        for id in ["s1", "s2", "s3"] {
            st.apply(&Command::AddShard {
                shard_id: id.into(),
                address: String::new(),
                registered_at_unix_ns: 1,
            })
            .unwrap();
        }
        st
    }

    fn start(id: &str, donor: &str, recipient: &str) -> Command {
        Command::StartTransfer {
            transfer: Transfer {
                id: id.into(),
                kind: TransferKind::Idle,
                donor: donor.into(),
                recipient: recipient.into(),
                instance_type: "m5".into(),
                count: 2,
                priority: 10,
                phase: Phase::Release,
                instruction_id: format!("{id}-r"),
                machine_ids: Vec::new(),
                started_at_unix_ns: 1,
                updated_at_unix_ns: 1,
                reason: String::new(),
                selectors: Vec::new(),
            },
        }
    }

    fn ack(id: &str, ins: &str, verdict: AckVerdict, ids: &[&str], next: &str) -> Command {
        Command::AckTransfer {
            transfer_id: id.into(),
            instruction_id: ins.into(),
            verdict,
            machine_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            next_instruction_id: next.into(),
            reason: String::new(),
            at_unix_ns: 9,
        }
    }

    /// The donor accepts `id`'s release (instruction `<id>-r`) naming `machines`; the adopt
    /// instruction is `<id>-a`.
    fn release(st: &mut State, id: &str, machines: &[&str]) -> Result<Effect, FsmError> {
        let (ins, next) = (format!("{id}-r"), format!("{id}-a"));
        st.apply(&ack(id, &ins, AckVerdict::Accepted, machines, &next))
    }

    #[test]
    fn start_is_validated_and_never_both_directions() {
        let mut st = state();
        st.apply(&start("t1", "s1", "s2")).unwrap();
        assert!(matches!(
            st.apply(&start("t1", "s1", "s3")),
            Err(FsmError::Invalid(_))
        ));
        assert!(matches!(
            st.apply(&start("t2", "s2", "s1")),
            Err(FsmError::Invalid(_))
        ));
        assert!(matches!(
            st.apply(&start("t3", "s1", "s1")),
            Err(FsmError::Invalid(_))
        ));
        assert_eq!(
            st.apply(&start("t4", "s1", "ghost")),
            Err(FsmError::ShardNotFound("ghost".into()))
        );
        // Same direction again (a second transfer to the same pair) is the policy's call.
        st.apply(&start("t5", "s1", "s2")).unwrap();
        assert_eq!(st.active_transfers().len(), 2);
    }

    #[test]
    fn acks_walk_the_phases_and_finish_into_recent() {
        let mut st = state();
        st.apply(&start("t1", "s1", "s2")).unwrap();
        let eff = release(&mut st, "t1", &["m1", "m2"]).unwrap();
        let Effect::Transfer(t) = eff else {
            panic!("{eff:?}")
        };
        assert_eq!((t.phase, t.machine_ids.len()), (Phase::Adopt, 2));
        assert_eq!(st.transfer_by_instruction("t1-a").unwrap().id, "t1");
        // A redelivered release ack changes nothing.
        assert_eq!(
            st.apply(&ack("t1", "t1-r", AckVerdict::Accepted, &["m7"], "x")),
            Ok(Effect::None)
        );
        st.apply(&ack("t1", "t1-a", AckVerdict::Accepted, &[], "t1-z"))
            .unwrap();
        assert!(st.active_transfers().is_empty());
        let recent = st.recent_transfers();
        assert_eq!((recent[0].phase, recent[0].moved()), (Phase::Done, 2));
        // Acks after the end are no-ops.
        assert_eq!(
            st.apply(&ack("t1", "t1-a", AckVerdict::Refused, &[], "y")),
            Ok(Effect::None)
        );
    }

    #[test]
    fn a_machine_in_flight_is_never_named_by_a_second_transfer() {
        let mut st = state();
        st.apply(&start("t1", "s1", "s2")).unwrap();
        st.apply(&start("t2", "s1", "s3")).unwrap();
        release(&mut st, "t1", &["m1"]).unwrap();
        let Ok(Effect::Transfer(t2)) = release(&mut st, "t2", &["m1", "m2"]) else {
            panic!()
        };
        assert_eq!(t2.machine_ids, ["m2"]);
    }

    #[test]
    fn removing_a_shard_fails_its_transfers_and_snapshots_keep_them() {
        let mut st = state();
        st.apply(&start("t1", "s1", "s2")).unwrap();
        st.apply(&start("t2", "s3", "s2")).unwrap();
        release(&mut st, "t2", &["m1"]).unwrap();
        let back = State::from_snapshot_json(&st.to_snapshot_json()).unwrap();
        assert_eq!(back, st);
        st.apply(&Command::RemoveShard {
            shard_id: "s1".into(),
        })
        .unwrap();
        assert_eq!(st.active_transfers().len(), 1);
        let recent = st.recent_transfers();
        assert_eq!(
            (recent[0].id.as_str(), recent[0].phase),
            ("t1", Phase::Failed)
        );
        assert!(recent[0].reason.contains("removed"));
    }

    #[test]
    fn recent_is_bounded() {
        let mut st = state();
        for i in 0..(transfers::MAX_RECENT + 5) {
            let id = format!("t{i}");
            st.apply(&start(&id, "s1", "s2")).unwrap();
            st.apply(&ack(&id, &format!("{id}-r"), AckVerdict::Refused, &[], "n"))
                .unwrap();
        }
        let recent = st.recent_transfers();
        assert_eq!(recent.len(), transfers::MAX_RECENT);
        assert_eq!(recent[0].id, "t5");
    }
}
