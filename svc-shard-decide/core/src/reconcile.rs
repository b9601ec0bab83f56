//! Reconcile: merging the provider's List into the inventory.
//!
//! There is no Watch: every cycle lists the provider before deciding. Full
//! mode lists everything and removes machines the provider stopped reporting;
//! incremental mode pumps the opaque `since_revision` cursor and skips the
//! removal walk (a delta cannot express removal).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::inventory::Inventory;
use bigfleet_conv::{machine_from_proto_owned, node_state_update};
use bigfleet_mesh::MeshChannel;
use bigfleet_model::{Machine, MachineState};
use bigfleet_proto::v1alpha1 as pb;
use bytes::Bytes;
use futures::future::BoxFuture;
use prost::Message as _;
use tonic::codegen::http::uri::PathAndQuery;

/// A List answer with every machine still encoded. Same wire format as
/// `MachineList`; decoding stops at the record boundaries, so the common case
/// (nothing changed) never builds 500K `Machine` messages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawMachineList {
    #[prost(bytes = "bytes", repeated, tag = "1")]
    pub machines: Vec<Bytes>,
    #[prost(bytes = "vec", tag = "2")]
    pub revision: Vec<u8>,
}

impl From<&pb::MachineList> for RawMachineList {
    fn from(l: &pb::MachineList) -> Self {
        RawMachineList {
            machines: l
                .machines
                .iter()
                .map(|m| Bytes::from(m.encode_to_vec()))
                .collect(),
            revision: l.revision.clone(),
        }
    }
}

/// The id (field 1) and state (field 2) of an encoded `Machine`, read without
/// decoding anything else. `None` when the bytes are not a valid message.
pub fn machine_head(raw: &[u8]) -> Option<(&str, i32)> {
    head(raw).map(|h| (h.id, h.state))
}

/// What the merge reads of an encoded `Machine` before deciding whether to
/// decode it: id (field 1), state (field 2) and cluster (field 14).
struct Head<'a> {
    id: &'a str,
    state: i32,
    cluster: &'a str,
}

fn head(raw: &[u8]) -> Option<Head<'_>> {
    let mut id = "";
    let mut state = 0i32;
    let mut cluster = "";
    walk(raw, |field, _, value| {
        match (field, value) {
            (2, Value::Varint(v)) => state = v as i32,
            (1, Value::Len(b)) => id = std::str::from_utf8(b).ok()?,
            (14, Value::Len(b)) => cluster = std::str::from_utf8(b).ok()?,
            _ => {}
        }
        Some(())
    })?;
    Some(Head { id, state, cluster })
}

/// One field's value as the wire carries it.
enum Value<'a> {
    Varint(u64),
    Len(&'a [u8]),
    Fixed,
}

/// Calls `f(field number, the field's whole encoding, its value)` for every top-level
/// field of an encoded message, in order. `None` when the bytes are not well-formed (or
/// use groups), or when `f` says so.
fn walk<'a>(
    raw: &'a [u8],
    mut f: impl FnMut(u64, &'a [u8], Value<'a>) -> Option<()>,
) -> Option<()> {
    use prost::encoding::decode_varint;
    let mut buf = raw;
    while !buf.is_empty() {
        let start = raw.len() - buf.len();
        let key = decode_varint(&mut buf).ok()?;
        let value = match key & 7 {
            0 => Value::Varint(decode_varint(&mut buf).ok()?),
            1 => {
                buf = buf.get(8..)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                let (value, rest) = (buf.get(..len)?, buf.get(len..)?);
                buf = rest;
                Value::Len(value)
            }
            5 => {
                buf = buf.get(4..)?;
                Value::Fixed
            }
            _ => return None,
        };
        let end = raw.len() - buf.len();
        f(key >> 3, &raw[start..end], value)?;
    }
    Some(())
}

/// States in which the machine is bound to a cluster, so a listed binding that
/// differs from ours is a divergence even when the state agrees.
fn bound(state: MachineState) -> bool {
    matches!(
        state,
        MachineState::Configuring | MachineState::Configured | MachineState::Draining
    )
}

/// Where reconcile reads machines from: the provider's `List`.
pub trait MachineSource: Send + Sync + 'static {
    /// `List` with `since_revision` (empty = everything).
    fn list(&self, since_revision: Vec<u8>)
    -> BoxFuture<'_, Result<RawMachineList, tonic::Status>>;
}

/// The real thing: `bigfleet.v1alpha1.CapacityProvider/List` over a mesh channel.
#[derive(Clone)]
pub struct ProviderClient {
    grpc: tonic::client::Grpc<MeshChannel>,
}

impl std::fmt::Debug for ProviderClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderClient").finish_non_exhaustive()
    }
}

impl ProviderClient {
    /// Over a mesh client channel (`bigfleet_mesh::dial_lazy`).
    pub fn new(channel: MeshChannel) -> Self {
        ProviderClient {
            grpc: bigfleet_mesh::with_message_limits!(tonic::client::Grpc::new(channel)),
        }
    }
}

/// Default deadline of a List (the reference's dial-out default).
pub const LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

impl MachineSource for ProviderClient {
    fn list(
        &self,
        since_revision: Vec<u8>,
    ) -> BoxFuture<'_, Result<RawMachineList, tonic::Status>> {
        let mut grpc = self.grpc.clone();
        Box::pin(async move {
            grpc.ready().await.map_err(|e| {
                tonic::Status::unavailable(format!("provider channel not ready: {e}"))
            })?;
            let mut req = tonic::Request::new(pb::ListFilter {
                since_revision,
                ..Default::default()
            });
            req.set_timeout(LIST_TIMEOUT);
            let codec = tonic_prost::ProstCodec::<pb::ListFilter, RawMachineList>::default();
            let path = PathAndQuery::from_static("/bigfleet.v1alpha1.CapacityProvider/List");
            grpc.unary(req, path, codec)
                .await
                .map(tonic::Response::into_inner)
        })
    }
}

/// How many listed records one merge took each way; a reconcile reports them unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeCounts {
    pub listed: usize,
    pub inserted: usize,
    pub updated: usize,
    pub removed: usize,
    pub fast_path: usize,
    pub skipped_in_flight: usize,
}

/// What one merge did.
#[derive(Debug, Default)]
pub struct MergeReport {
    pub counts: MergeCounts,
    /// Metric reasons of rejected records (`price`, `interruption_probability`, `structural`).
    pub rejected: Vec<&'static str>,
    /// NodeStateUpdates for applied changes of cluster-bound machines, keyed
    /// by the cluster to notify (the binding from before the change).
    pub notify: Vec<(String, pb::NodeStateUpdate)>,
    /// Machines that reached Configured: (cluster, need fingerprint).
    pub configured: Vec<(String, String)>,
    /// Machines that reached Idle from Draining (drain completed).
    pub drained: Vec<String>,
    /// Removals the [`RemovalGuard`] held back: why, and how many machines.
    pub held: Option<(HoldReason, usize)>,
}

/// A machine record's fields that describe the machine itself rather than its hardware:
/// id, state, host, last_error, cluster, shard_metadata.
fn per_machine(field: u64) -> bool {
    matches!(field, 1 | 2 | 3 | 12 | 14 | 15)
}

/// Decoded hardware (type, zone, capacity, price, interruption probability, resources,
/// labels, allocatable) of the records one merge has seen, keyed by the exact wire bytes
/// of those fields. A fleet has few distinct hardware descriptions, so a changed
/// record usually decodes only its own few fields; equal bytes decode to equal values,
/// so the result is the full decoder's (a property test holds the two equal).
#[derive(Default)]
struct HardwareMemo {
    map: rustc_hash::FxHashMap<Box<[u8]>, Hardware>,
    mine: Vec<u8>,
    hw: Vec<u8>,
}

struct Hardware {
    profile: bigfleet_model::MachineProfile,
    allocatable: bigfleet_model::ResourceVector,
    price: f64,
    prob: f64,
}

/// Bounds the memo when a provider reports many distinct hardware descriptions.
const MEMO_MAX: usize = 4096;

impl HardwareMemo {
    fn decode(&mut self, raw: &[u8]) -> Result<Machine, bigfleet_conv::ConvError> {
        self.mine.clear();
        self.hw.clear();
        let (mine, hw) = (&mut self.mine, &mut self.hw);
        let split = walk(raw, |field, bytes, _| {
            if per_machine(field) {
                mine.extend_from_slice(bytes);
            } else {
                hw.extend_from_slice(bytes);
            }
            Some(())
        })
        .is_some();
        if split
            && let Some(h) = self.map.get(self.hw.as_slice())
            && let Some(m) = assemble(&self.mine, h)
        {
            return Ok(m);
        }
        // Anything unusual (first sight of this hardware, a field that does not
        // decode, an invariant the record breaks) takes the full path, which decides
        // and reports exactly as always.
        let m = decode(raw)?;
        if split && self.map.len() < MEMO_MAX {
            self.map.insert(
                self.hw.as_slice().into(),
                Hardware {
                    profile: m.profile.clone(),
                    allocatable: m.allocatable.clone(),
                    price: m.price_per_hour,
                    prob: m.interruption_probability,
                },
            );
        }
        Ok(m)
    }
}

/// A machine from its own fields' encoding and known hardware; `None` when anything is
/// off (the caller then decodes the whole record).
fn assemble(mine: &[u8], h: &Hardware) -> Option<Machine> {
    let pm = pb::Machine::decode(mine).ok()?;
    let m = Machine {
        id: pm.id,
        state: bigfleet_conv::machine_state_from_proto(pm.state).ok()?,
        host: pm
            .host
            .map(|h| bigfleet_model::Host {
                provider: h.provider,
                reference: h.r#ref,
            })
            .unwrap_or_default(),
        cluster: pm.cluster,
        profile: h.profile.clone(),
        price_per_hour: h.price,
        interruption_probability: h.prob,
        last_error: pm.last_error,
        allocatable: h.allocatable.clone(),
        shard_metadata: pm.shard_metadata,
        ..Machine::default()
    };
    m.invariant().ok()?;
    Some(m)
}

fn decode(raw: &[u8]) -> Result<Machine, bigfleet_conv::ConvError> {
    let pm = pb::Machine::decode(raw).map_err(|e| bigfleet_conv::ConvError::InvalidMachine {
        id: String::new(),
        source: Box::new(bigfleet_conv::ConvError::MissingField {
            path: format!("wire encoding ({e})"),
        }),
    })?;
    machine_from_proto_owned(pm)
}

/// When a full List may remove machines (issue 16): a provider that restarted empty, a
/// truncated answer or a record nobody can attribute must not make machines vanish —
/// operators would be told their nodes are gone, replacements would be provisioned, and a
/// reclaim wave would follow when the machines reappear.
#[derive(Debug, Clone, PartialEq)]
pub struct RemovalPolicy {
    /// Removals of at most this many machines apply at once...
    pub max_unconfirmed: usize,
    /// ...or of at most this fraction of the inventory, whichever is larger.
    pub max_unconfirmed_fraction: f64,
    /// A larger removal applies only when this many consecutive full Lists leave out
    /// exactly the same machines...
    pub confirmations: u32,
    /// ...over at least this long (so a fast reconcile loop cannot confirm a provider's
    /// restart within seconds).
    pub min_hold: Duration,
}

impl Default for RemovalPolicy {
    fn default() -> Self {
        Self {
            max_unconfirmed: 10,
            max_unconfirmed_fraction: 0.05,
            confirmations: 5,
            min_hold: Duration::from_secs(120),
        }
    }
}

impl RemovalPolicy {
    /// Every removal applies at once (the behaviour before the guard; tests of the merge
    /// itself).
    pub fn immediate() -> Self {
        Self {
            max_unconfirmed: usize::MAX,
            max_unconfirmed_fraction: 1.0,
            confirmations: 1,
            min_hold: Duration::ZERO,
        }
    }
}

/// Why removals were held back in one merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldReason {
    /// The List carried a record whose id could not be read: any unlisted machine might be
    /// that record, so none is removed on this List.
    Unattributable,
    /// A removal wave waiting for `seen` of `needed` agreeing Lists.
    AwaitingConfirmation { seen: u32, needed: u32 },
}

impl HoldReason {
    pub fn label(self) -> &'static str {
        match self {
            HoldReason::Unattributable => "unattributable_record",
            HoldReason::AwaitingConfirmation { .. } => "awaiting_confirmation",
        }
    }
}

#[derive(Debug)]
struct PendingRemoval {
    ids: BTreeSet<String>,
    streak: u32,
    since: Instant,
}

/// The state of [`RemovalPolicy`] across Lists.
#[derive(Debug)]
pub struct RemovalGuard {
    policy: RemovalPolicy,
    pending: Option<PendingRemoval>,
}

impl RemovalGuard {
    pub fn new(policy: RemovalPolicy) -> Self {
        Self {
            policy,
            pending: None,
        }
    }

    /// Decides what to do with the machines a full List left out (`unseen`, out of `total`
    /// known): the ids to remove now, and the reason anything was held.
    fn judge(
        &mut self,
        unseen: Vec<String>,
        total: usize,
        unattributable: bool,
        now: Instant,
    ) -> (Vec<String>, Option<HoldReason>) {
        if unseen.is_empty() {
            self.pending = None;
            return (unseen, None);
        }
        if unattributable {
            // Not a confirmation either: the answer itself is suspect.
            return (Vec::new(), Some(HoldReason::Unattributable));
        }
        let small = (total as f64 * self.policy.max_unconfirmed_fraction).floor() as usize;
        if unseen.len() <= self.policy.max_unconfirmed.max(small) {
            self.pending = None;
            return (unseen, None);
        }
        let ids: BTreeSet<String> = unseen.into_iter().collect();
        let pending = match self.pending.take() {
            Some(mut p) if p.ids == ids => {
                p.streak += 1;
                p
            }
            _ => PendingRemoval {
                ids,
                streak: 1,
                since: now,
            },
        };
        if pending.streak >= self.policy.confirmations
            && now.duration_since(pending.since) >= self.policy.min_hold
        {
            return (pending.ids.into_iter().collect(), None);
        }
        let reason = HoldReason::AwaitingConfirmation {
            seen: pending.streak,
            needed: self.policy.confirmations,
        };
        self.pending = Some(pending);
        (Vec::new(), Some(reason))
    }
}

/// Merges a List answer into `inv`.
///
/// * machines with an action in flight are skipped: the provider's view lags
///   the worker's RPC and would overwrite its transitional state (the
///   Configuring → Idle race);
/// * a machine whose state already matches is left alone (fast path: only
///   its id and state are read from the wire);
/// * a diverged machine takes the provider's record, but keeps the shard's
///   own assignment while it stays bound to the same cluster;
/// * a new machine is inserted with its assignment restored from the
///   provider's `shard_metadata` echo (a restart rebuilds from here);
/// * a record failing validation is counted and ignored: the inventory keeps
///   its last-known-good copy, and the machine is NOT removed;
/// * with `full` set, machines the provider did not list are removed (except
///   those in flight), as far as the [`RemovalGuard`] allows.
///
/// `order` carries the positions of the previous listing, in listing order:
/// providers list in a stable order, so checking the hinted position first
/// (one string compare) replaces most index lookups. It is rewritten here.
// Each argument is a separate piece of the shard's state borrowed for one merge (the
// inventory, its listing hint, the removal guard) or a per-call fact; bundling them would
// only move the list into a struct built at the one call site.
#[allow(clippy::too_many_arguments)]
pub fn merge(
    inv: &mut Inventory,
    list: &[Bytes],
    full: bool,
    generation: u32,
    now_unix_nanos: i64,
    in_flight: impl Fn(&str) -> bool,
    order: &mut Vec<u32>,
    removals: &mut RemovalGuard,
) -> MergeReport {
    let mut r = MergeReport {
        counts: MergeCounts {
            listed: list.len(),
            ..MergeCounts::default()
        },
        ..MergeReport::default()
    };
    let mut fresh: Vec<(&str, &Bytes)> = Vec::new();
    let mut memo = HardwareMemo::default();
    let hint = std::mem::take(order);
    order.reserve(list.len());
    for (i, raw) in list.iter().enumerate() {
        let Some(Head { id, state, cluster }) = head(raw) else {
            tracing::warn!("provider record is not a valid Machine message; rejected");
            r.rejected.push("structural");
            order.push(u32::MAX);
            continue;
        };
        let hinted = hint
            .get(i)
            .map(|&p| p as usize)
            .filter(|&p| inv.id_at(p) == Some(id));
        let Some(pos) = hinted.or_else(|| inv.position(id)) else {
            fresh.push((id, raw));
            order.push(u32::MAX);
            continue;
        };
        order.push(pos as u32);
        // Seen first, so a rejected record never looks like a removal.
        inv.mark_seen(pos, generation);
        if in_flight(id) {
            r.counts.skipped_in_flight += 1;
            continue;
        }
        let local = inv.state_at(pos);
        if i32::from(local.ordinal()) == state
            && (!bound(local) || inv.assignment_at(pos).cluster == cluster)
        {
            r.counts.fast_path += 1;
            continue;
        }
        let m = match memo.decode(raw) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(machine = %id, reason = e.reason(), error = %e, "provider record rejected");
                r.rejected.push(e.reason());
                continue;
            }
        };
        apply_diverged(inv, pos, m, now_unix_nanos, &mut r);
    }
    // New machines in id order: the engine's fleet keeps its machines sorted,
    // and appending in order keeps a cold start linear.
    fresh.sort_unstable_by(|a, b| a.0.cmp(b.0));
    for (_, raw) in fresh {
        let mut m = match memo.decode(raw) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(reason = e.reason(), error = %e, "provider record rejected");
                r.rejected.push(e.reason());
                continue;
            }
        };
        if inv.contains(&m.id) {
            // Listed twice; the first copy won.
            continue;
        }
        if !m.cluster.is_empty() {
            restore_assignment(&mut m);
        }
        let pos = inv.insert(m, now_unix_nanos);
        inv.mark_seen(pos, generation);
        r.counts.inserted += 1;
    }
    if full {
        let unseen = inv.unseen_ids(generation, &in_flight);
        let unattributable = r.rejected.contains(&"structural");
        let (remove, held) =
            removals.judge(unseen.clone(), inv.len(), unattributable, Instant::now());
        if let Some(reason) = held {
            r.held = Some((reason, unseen.len()));
        }
        let ids: Vec<&str> = remove.iter().map(String::as_str).collect();
        let removed = inv.remove(&ids);
        for m in &removed {
            tracing::info!(machine = %m.id, state = %m.state, "machine no longer listed by the provider; removed");
            if !m.cluster.is_empty() {
                // Tell the operator the node is gone rather than leave it Ready.
                let mut gone = m.clone();
                gone.state = MachineState::Speculative;
                gone.host = Default::default();
                r.notify
                    .push((m.cluster.clone(), node_state_update(&gone, &m.cluster)));
            }
        }
        r.counts.removed = removed.len();
    }
    r
}

/// A known machine (at `pos`) whose provider state differs from ours.
fn apply_diverged(inv: &mut Inventory, pos: usize, mut m: Machine, now: i64, r: &mut MergeReport) {
    let local = inv.assignment_at(pos);
    let local_state = local.state;
    if !m.cluster.is_empty() && m.cluster == local.cluster {
        // The provider does not own assignment state.
        m.assigned_priority = local.priority;
        m.assigned_interruption_penalty_dollars = local.interruption_penalty_dollars;
        m.assigned_reclamation_penalty_dollars = local.reclamation_penalty_dollars;
        local
            .need_fingerprint
            .clone_into(&mut m.assigned_need_fingerprint);
        local.group.clone_into(&mut m.assigned_group);
    } else if !m.cluster.is_empty() {
        restore_assignment(&mut m);
    }
    let notify_cluster = if local.cluster.is_empty() {
        m.cluster.clone()
    } else {
        local.cluster.to_owned()
    };
    if m.state == MachineState::Configured && local_state != MachineState::Configured {
        r.configured
            .push((m.cluster.clone(), m.assigned_need_fingerprint.clone()));
    }
    if m.state == MachineState::Idle && local_state == MachineState::Draining {
        r.drained.push(m.id.clone());
    }
    if !notify_cluster.is_empty() && !m.cluster.is_empty() && m.cluster != notify_cluster {
        // The machine moved clusters behind our back. Telling the old cluster
        // the new state would leave its operator believing in a node it no
        // longer has, and the new cluster would never learn of its node: the
        // old one hears the node left (Idle, as a completed drain says), the
        // new one hears its state.
        let mut left = m.clone();
        left.state = MachineState::Idle;
        r.notify.push((
            notify_cluster.clone(),
            node_state_update(&left, &notify_cluster),
        ));
        r.notify
            .push((m.cluster.clone(), node_state_update(&m, &m.cluster)));
    } else if !notify_cluster.is_empty() {
        r.notify.push((
            notify_cluster.clone(),
            node_state_update(&m, &notify_cluster),
        ));
    }
    inv.upsert_at(Some(pos), m, now);
    r.counts.updated += 1;
}

/// Restores the assignment from the provider's `shard_metadata` echo. Each
/// key decodes independently; malformed ones are logged and skipped.
fn restore_assignment(m: &mut Machine) {
    let meta = std::mem::take(&mut m.shard_metadata);
    if let Err(e) = m.apply_shard_metadata(&meta) {
        tracing::warn!(machine = %m.id, error = %e, "ignoring malformed shard_metadata");
    }
    m.shard_metadata = meta;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bigfleet_conv::machine_to_proto;
    use bigfleet_model::machine::{
        META_ASSIGNED_GROUP, META_ASSIGNED_INTERRUPTION_PENALTY, META_ASSIGNED_NEED_FINGERPRINT,
        META_ASSIGNED_PRIORITY, META_ASSIGNED_RECLAMATION_PENALTY,
    };

    fn pm(id: &str, state: MachineState) -> pb::Machine {
        machine_to_proto(&crate::inventory::tests::machine(id, state))
    }

    fn ids(inv: &Inventory) -> Vec<&str> {
        let mut v: Vec<&str> = inv.ids().collect();
        v.sort_unstable();
        v
    }

    /// `merge` over decoded records (encodes them first).
    fn merge(
        inv: &mut Inventory,
        list: &[pb::Machine],
        full: bool,
        generation: u32,
        now: i64,
        in_flight: impl Fn(&str) -> bool,
    ) -> MergeReport {
        let raw: Vec<Bytes> = list
            .iter()
            .map(|m| Bytes::from(m.encode_to_vec()))
            .collect();
        super::merge(
            inv,
            &raw,
            full,
            generation,
            now,
            in_flight,
            &mut Vec::new(),
            &mut RemovalGuard::new(RemovalPolicy::immediate()),
        )
    }

    /// A full List at time 0 with nothing in flight.
    fn full_list(inv: &mut Inventory, list: &[pb::Machine], generation: u32) -> MergeReport {
        merge(inv, list, true, generation, 0, |_| false)
    }

    /// A full-list round at time 0 with nothing in flight, carrying the position hints
    /// and the removal guard from round to round.
    fn full_round(
        inv: &mut Inventory,
        raw: &[Bytes],
        generation: u32,
        order: &mut Vec<u32>,
        guard: &mut RemovalGuard,
    ) -> MergeReport {
        super::merge(inv, raw, true, generation, 0, |_| false, order, guard)
    }

    /// Hardware variants: one ordinary, one with labels and allocatable, one whose price
    /// breaks the invariants (so the full path's rejection must come through unchanged).
    fn hardware(variant: u8) -> pb::Machine {
        let mut m = pb::Machine {
            instance_type: "m5.large".into(),
            zone: "z1".into(),
            capacity_type: 3,
            price_per_hour: 0.25,
            interruption_probability: 0.0,
            resources: Some(pb::Resources {
                resources: [("cpu".to_owned(), "2".to_owned())].into(),
            }),
            ..Default::default()
        };
        match variant {
            0 => {}
            1 => {
                m.labels = [("rack".to_owned(), "r1".to_owned())].into();
                m.allocatable = Some(pb::Resources {
                    resources: [("cpu".to_owned(), "1500m".to_owned())].into(),
                });
                m.capacity_type = 4;
                m.interruption_probability = 0.1;
            }
            _ => m.price_per_hour = f64::NAN,
        }
        m
    }

    proptest::proptest! {
        /// The memoised decode equals the full decode for every record, whatever the
        /// per-machine fields (valid or not) and field order.
        #[test]
        fn memoised_decode_equals_full_decode(
            records in proptest::collection::vec(
                (
                    0u8..3,
                    "[a-z0-9-]{0,6}",
                    -1i32..10,
                    proptest::option::of(("[a-z]{0,3}", "[a-z0-9-]{0,6}")),
                    proptest::sample::select(vec!["", "c1"]),
                    proptest::sample::select(vec!["", "boom"]),
                    proptest::collection::btree_map(
                        proptest::sample::select(vec![
                            "bigfleet.lucy.sh/assigned-priority",
                            "bigfleet.lucy.sh/assigned-need-fingerprint",
                            "other",
                        ]),
                        "[0-9a-z]{0,3}",
                        0..3,
                    ),
                    proptest::bool::ANY,
                ),
                1..24,
            ),
        ) {
            let mut memo = HardwareMemo::default();
            for (variant, id, state, host, cluster, last_error, meta, split) in records {
                let hw = hardware(variant);
                let mine = pb::Machine {
                    id,
                    state,
                    host: host.map(|(provider, r)| pb::HostRef { provider, r#ref: r }),
                    cluster: cluster.to_owned(),
                    last_error: last_error.to_owned(),
                    shard_metadata: meta
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                    ..Default::default()
                };
                // Either one message, or the hardware and the machine's own fields as two
                // concatenated encodings (a decoder merges them; field order differs).
                let raw = if split {
                    let mut b = hw.encode_to_vec();
                    b.extend(mine.encode_to_vec());
                    b
                } else {
                    pb::Machine {
                        id: mine.id.clone(),
                        state: mine.state,
                        host: mine.host.clone(),
                        cluster: mine.cluster.clone(),
                        last_error: mine.last_error.clone(),
                        shard_metadata: mine.shard_metadata.clone(),
                        ..hw
                    }
                    .encode_to_vec()
                };
                // Debug text, not `==`: a rejected NaN price must compare equal too.
                proptest::prop_assert_eq!(
                    format!("{:?}", memo.decode(&raw)),
                    format!("{:?}", decode(&raw))
                );
            }
        }
    }

    #[test]
    fn head_reads_id_and_state_only() {
        let mut m = pm("m-1", MachineState::Configured);
        m.labels.insert("k".into(), "v".into());
        m.price_per_hour = 2.5;
        let raw = m.encode_to_vec();
        assert_eq!(
            machine_head(&raw),
            Some(("m-1", pb::MachineState::Configured as i32))
        );
        assert_eq!(machine_head(&[]), Some(("", 0)));
        assert_eq!(machine_head(&raw[..raw.len() - 1]), None, "truncated");
        assert_eq!(
            machine_head(&[0x0a, 0x05, b'a']),
            None,
            "length past the end"
        );
        assert_eq!(machine_head(&[0x0f]), None, "wire type 7");
    }

    #[test]
    fn position_hints_survive_reorders_and_removals() {
        let mut inv = Inventory::new();
        let all: Vec<pb::Machine> = (0..6)
            .map(|i| pm(&format!("m{i}"), MachineState::Idle))
            .collect();
        let raw: Vec<Bytes> = all.iter().map(|m| Bytes::from(m.encode_to_vec())).collect();
        let mut order = Vec::new();
        let mut guard = RemovalGuard::new(RemovalPolicy::immediate());
        full_round(&mut inv, &raw, 1, &mut order, &mut guard);
        assert_eq!(order.len(), 6);
        let r = full_round(&mut inv, &raw, 2, &mut order, &mut guard);
        assert_eq!(r.counts.fast_path, 6);
        assert!(order.iter().all(|&p| p != u32::MAX));
        // A stale hint (reversed listing, one machine gone) still finds everyone.
        let mut rev: Vec<Bytes> = raw[1..].to_vec();
        rev.reverse();
        let r = full_round(&mut inv, &rev, 3, &mut order, &mut guard);
        assert_eq!(
            (r.counts.fast_path, r.counts.removed, r.counts.inserted),
            (5, 1, 0)
        );
        // The removal moved a record, so a recorded position may be stale:
        // it is only a hint and the next round corrects it.
        let r = full_round(&mut inv, &rev, 4, &mut order, &mut guard);
        assert_eq!((r.counts.fast_path, r.counts.removed), (5, 0));
        for (i, b) in rev.iter().enumerate() {
            let id = machine_head(b).unwrap().0;
            assert_eq!(inv.id_at(order[i] as usize), Some(id));
        }
    }

    #[test]
    fn garbage_records_are_rejected_not_removed() {
        let mut inv = Inventory::new();
        full_list(&mut inv, &[pm("a", MachineState::Idle)], 1);
        let r = full_round(
            &mut inv,
            &[Bytes::from_static(&[0xff, 0xff])],
            2,
            &mut Vec::new(),
            &mut RemovalGuard::new(RemovalPolicy::immediate()),
        );
        assert_eq!(r.rejected, ["structural"]);
        // Unparseable means unknown id: it might be "a", so nothing is removed, however
        // permissive the policy.
        assert_eq!(r.counts.removed, 0);
        assert_eq!(r.held, Some((HoldReason::Unattributable, 1)));
        assert!(inv.contains("a"));
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("m{i}")).collect()
    }

    #[test]
    fn small_removals_apply_at_once_and_waves_wait_for_agreeing_lists() {
        let policy = RemovalPolicy {
            max_unconfirmed: 2,
            max_unconfirmed_fraction: 0.1,
            confirmations: 3,
            min_hold: Duration::from_secs(60),
        };
        let mut g = RemovalGuard::new(policy);
        let t0 = Instant::now();
        // 3 of 40 is within max(2, 10% of 40 = 4): removed now.
        assert_eq!(g.judge(names(3), 40, false, t0), (names(3), None));
        // 40 of 40 (a provider that restarted empty) is held...
        let (now, held) = g.judge(names(40), 40, false, t0);
        assert!(now.is_empty());
        assert_eq!(
            held,
            Some(HoldReason::AwaitingConfirmation { seen: 1, needed: 3 })
        );
        // ...a different answer restarts the count...
        let (now, _) = g.judge(names(39), 40, false, t0 + Duration::from_secs(10));
        assert!(now.is_empty());
        let (now, held) = g.judge(names(39), 40, false, t0 + Duration::from_secs(20));
        assert!(now.is_empty());
        assert_eq!(
            held,
            Some(HoldReason::AwaitingConfirmation { seen: 2, needed: 3 })
        );
        // ...enough agreeing Lists but too soon still holds...
        let (now, held) = g.judge(names(39), 40, false, t0 + Duration::from_secs(30));
        assert!(now.is_empty() && held.is_some());
        // ...and after the hold time the confirmed wave applies.
        let (now, held) = g.judge(names(39), 40, false, t0 + Duration::from_secs(75));
        assert_eq!((now.len(), held), (39, None));
    }

    #[test]
    fn a_list_with_an_unattributable_record_removes_nothing_and_confirms_nothing() {
        let policy = RemovalPolicy {
            confirmations: 2,
            min_hold: Duration::ZERO,
            ..RemovalPolicy::default()
        };
        let mut g = RemovalGuard::new(policy);
        let t = Instant::now();
        let (now, _) = g.judge(names(100), 100, false, t);
        assert!(now.is_empty());
        let (now, held) = g.judge(names(100), 100, true, t);
        assert!(now.is_empty());
        assert_eq!(held, Some(HoldReason::Unattributable));
        // The suspect List did not count: the next agreeing List is the second, and applies.
        let (now, held) = g.judge(names(100), 100, false, t);
        assert_eq!((now.len(), held), (100, None));
    }

    #[test]
    fn full_mode_inserts_updates_and_removes() {
        let mut inv = Inventory::new();
        let r = full_list(
            &mut inv,
            &[
                pm("b", MachineState::Idle),
                pm("a", MachineState::Speculative),
            ],
            1,
        );
        assert_eq!(
            (r.counts.inserted, r.counts.updated, r.counts.removed),
            (2, 0, 0)
        );
        assert_eq!(ids(&inv), ["a", "b"]);
        let r = full_list(&mut inv, &[pm("a", MachineState::Speculative)], 2);
        assert_eq!((r.counts.fast_path, r.counts.removed), (1, 1));
        assert_eq!(ids(&inv), ["a"]);
    }

    /// The inventory after a first full List of two idle machines, "a" and "b".
    fn idle_a_and_b_listed() -> Inventory {
        let mut inv = Inventory::new();
        full_list(
            &mut inv,
            &[pm("a", MachineState::Idle), pm("b", MachineState::Idle)],
            1,
        );
        inv
    }

    #[test]
    fn incremental_mode_never_removes() {
        let mut inv = idle_a_and_b_listed();
        let r = merge(
            &mut inv,
            &[pm("a", MachineState::Speculative)],
            false,
            2,
            0,
            |_| false,
        );
        assert_eq!((r.counts.updated, r.counts.removed), (1, 0));
        assert_eq!(ids(&inv), ["a", "b"]);
        assert_eq!(inv.get("a").unwrap().state, MachineState::Speculative);
    }

    #[test]
    fn in_flight_machines_are_neither_overwritten_nor_removed() {
        let mut inv = idle_a_and_b_listed();
        // A worker moved "a" to Configuring; the provider still lists Idle.
        inv.update("a", 0, |m| {
            m.state = MachineState::Configuring;
            m.cluster = "c1".into();
        });
        let r = merge(&mut inv, &[pm("a", MachineState::Idle)], true, 2, 0, |id| {
            id == "a" || id == "b"
        });
        assert_eq!(r.counts.skipped_in_flight, 1);
        assert_eq!(inv.get("a").unwrap().state, MachineState::Configuring);
        // "b" is unlisted but in flight: kept.
        assert!(inv.get("b").is_some());
        // Once the action is done, the provider's view applies.
        let r = full_list(&mut inv, &[pm("a", MachineState::Idle)], 3);
        assert_eq!((r.counts.updated, r.counts.removed), (1, 1));
        assert_eq!(inv.get("a").unwrap().state, MachineState::Idle);
    }

    #[test]
    fn fast_path_touches_nothing() {
        let mut inv = Inventory::new();
        full_list(&mut inv, &[pm("a", MachineState::Idle)], 1);
        inv.update("a", 0, |m| m.price_per_hour = 7.0);
        let mut listed = pm("a", MachineState::Idle);
        listed.price_per_hour = f64::NAN; // would be rejected if it were read
        let r = full_list(&mut inv, &[listed], 2);
        assert_eq!((r.counts.fast_path, r.rejected.len()), (1, 0));
        assert_eq!(inv.get("a").unwrap().price_per_hour, 7.0);
    }

    #[test]
    fn rejected_records_keep_last_known_good_and_are_not_removed() {
        let mut inv = Inventory::new();
        full_list(&mut inv, &[pm("a", MachineState::Idle)], 1);
        let mut bad = pm("a", MachineState::Configured);
        bad.cluster = "c1".into();
        bad.price_per_hour = -1.0;
        let mut bad_new = pm("n", MachineState::Idle);
        bad_new.interruption_probability = 2.0;
        let mut structural = pm("s", MachineState::Idle);
        structural.host = None;
        let r = full_list(&mut inv, &[bad, bad_new, structural], 2);
        assert_eq!(
            r.rejected,
            ["price", "interruption_probability", "structural"]
        );
        assert_eq!(r.counts.removed, 0);
        assert_eq!(ids(&inv), ["a"]);
        assert_eq!(inv.get("a").unwrap().state, MachineState::Idle);
    }

    #[test]
    fn new_records_restore_assignment_from_shard_metadata() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Configured);
        p.cluster = "c7".into();
        p.shard_metadata = [
            (META_ASSIGNED_PRIORITY, "42"),
            (META_ASSIGNED_INTERRUPTION_PENALTY, "+Inf"),
            (META_ASSIGNED_RECLAMATION_PENALTY, "2.5"),
            (META_ASSIGNED_NEED_FINGERPRINT, "fp-1"),
            (META_ASSIGNED_GROUP, "rack\0g7"),
            ("other/key", "kept"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let r = full_list(&mut inv, &[p], 1);
        let m = inv.get("a").unwrap();
        assert_eq!(r.counts.inserted, 1);
        assert!(
            r.notify.is_empty(),
            "discovery is not a transition; resync covers it"
        );
        assert_eq!(m.assigned_priority, 42);
        assert_eq!(m.assigned_interruption_penalty_dollars, f64::INFINITY);
        assert_eq!(m.assigned_reclamation_penalty_dollars, 2.5);
        assert_eq!(m.assigned_need_fingerprint, "fp-1");
        assert_eq!(m.assigned_group, "rack\0g7");
        assert_eq!(m.shard_metadata["other/key"], "kept");
        assert_eq!(m.shard_metadata[META_ASSIGNED_GROUP], "rack\0g7");
    }

    #[test]
    fn malformed_metadata_keys_are_skipped_individually() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Configured);
        p.shard_metadata = [(META_ASSIGNED_PRIORITY, "high"), (META_ASSIGNED_GROUP, "g")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        full_list(&mut inv, &[p], 1);
        let m = inv.get("a").unwrap();
        assert_eq!((m.assigned_priority, m.assigned_group.as_str()), (0, "g"));
    }

    #[test]
    fn tracked_assignment_is_authoritative_while_bound() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Configuring);
        p.cluster = "c1".into();
        full_list(&mut inv, &[p.clone()], 1);
        inv.update("a", 0, |m| {
            m.assigned_priority = 9;
            m.assigned_need_fingerprint = "mine".into();
        });
        // Provider reports Configured with a metadata echo that disagrees.
        p.state = pb::MachineState::Configured as i32;
        p.shard_metadata
            .insert(META_ASSIGNED_PRIORITY.into(), "1".into());
        let r = full_list(&mut inv, &[p], 2);
        let m = inv.get("a").unwrap();
        assert_eq!(
            (m.assigned_priority, m.assigned_need_fingerprint.as_str()),
            (9, "mine")
        );
        assert_eq!(r.notify[0].0, "c1");
        assert_eq!(r.configured, [("c1".to_owned(), "mine".to_owned())]);
    }

    #[test]
    fn a_machine_that_moved_clusters_leaves_the_old_and_reaches_the_new() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Draining);
        p.cluster = "c5".into();
        full_list(&mut inv, &[p], 1);
        let mut moved = pm("a", MachineState::Configured);
        moved.cluster = "c0".into();
        let r = full_list(&mut inv, &[moved], 2);
        assert_eq!(inv.get("a").unwrap().cluster, "c0");
        let sent: Vec<(&str, i32)> = r
            .notify
            .iter()
            .map(|(c, f)| (c.as_str(), f.state))
            .collect();
        assert_eq!(
            sent,
            [
                ("c5", pb::MachineState::Idle as i32),
                ("c0", pb::MachineState::Configured as i32)
            ],
            "never Configured to the cluster the node left"
        );
        assert!(r.notify.iter().all(|(c, f)| f.cluster_id == *c));
    }

    #[test]
    fn same_state_in_another_cluster_is_a_divergence_not_a_fast_path() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Configured);
        p.cluster = "c5".into();
        full_list(&mut inv, &[p.clone()], 1);
        let r = full_list(&mut inv, &[p.clone()], 2);
        assert_eq!((r.counts.fast_path, r.counts.updated), (1, 0));
        p.cluster = "c0".into();
        let r = full_list(&mut inv, &[p.clone()], 3);
        assert_eq!((r.counts.fast_path, r.counts.updated), (0, 1));
        assert_eq!(inv.get("a").unwrap().cluster, "c0");
        assert_eq!(r.notify.len(), 2);
        // Unbound states carry no binding to compare.
        let mut idle = pm("b", MachineState::Idle);
        full_list(&mut inv, &[p.clone(), idle.clone()], 4);
        idle.cluster = "stale".into();
        let r = full_list(&mut inv, &[p, idle], 5);
        assert_eq!((r.counts.fast_path, r.counts.updated), (2, 0));
    }

    #[test]
    fn drain_completion_notifies_the_old_cluster_and_clears_assignment() {
        let mut inv = Inventory::new();
        let mut p = pm("a", MachineState::Draining);
        p.cluster = "c1".into();
        p.shard_metadata
            .insert(META_ASSIGNED_PRIORITY.into(), "5".into());
        full_list(&mut inv, &[p], 1);
        assert_eq!(inv.get("a").unwrap().assigned_priority, 5);
        let r = merge(
            &mut inv,
            &[pm("a", MachineState::Idle)],
            true,
            2,
            50,
            |_| false,
        );
        let m = inv.get("a").unwrap();
        assert_eq!((m.cluster.as_str(), m.assigned_priority), ("", 0));
        assert_eq!(r.notify.len(), 1);
        assert_eq!(r.notify[0].0, "c1");
        assert_eq!(r.notify[0].1.state, pb::MachineState::Idle as i32);
        assert_eq!(r.drained, ["a"]);
        assert_eq!(inv.idle_since_of("a"), Some(50));
    }
}

/// Provider records are the other trust boundary (the first is the
/// operator's roll-up; both are untrusted input, ADR-0118): whatever bytes a
/// provider sends, merging them never panics, never removes a machine it cannot attribute,
/// and keeps the inventory consistent. A short fixed run in the suite; set
/// `BIGFLEET_FUZZ_CASES` for a long one (docs/benchmarks.md, "fuzzing").
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("BIGFLEET_FUZZ_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(256)
    }

    fn valid(id: &str) -> Bytes {
        let m = pb::Machine {
            id: id.to_owned(),
            state: pb::MachineState::Idle as i32,
            host: Some(pb::HostRef {
                provider: "p".into(),
                r#ref: id.into(),
            }),
            instance_type: "t".into(),
            zone: "z".into(),
            price_per_hour: 1.0,
            resources: Some(pb::Resources {
                resources: [("cpu".to_owned(), "4".to_owned())].into_iter().collect(),
            }),
            ..Default::default()
        };
        Bytes::from(m.encode_to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

        #[test]
        fn hostile_lists_never_panic_or_remove_unattributably(
            garbage in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 0..8),
            flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        ) {
            let mut inv = Inventory::new();
            let base: Vec<Bytes> = (0..4).map(|i| valid(&format!("m{i}"))).collect();
            let mut guard = RemovalGuard::new(RemovalPolicy::immediate());
            merge(&mut inv, &base, true, 1, 0, |_| false, &mut Vec::new(), &mut guard);
            prop_assert_eq!(inv.len(), 4);
            // A second List: the valid records with bytes flipped, plus raw garbage.
            let mut list: Vec<Bytes> = base
                .iter()
                .map(|b| {
                    let mut v = b.to_vec();
                    for (pos, x) in &flips {
                        if !v.is_empty() {
                            let i = pos % v.len();
                            v[i] ^= x;
                        }
                    }
                    Bytes::from(v)
                })
                .collect();
            list.extend(garbage.into_iter().map(Bytes::from));
            let r = merge(&mut inv, &list, true, 2, 0, |_| false, &mut Vec::new(), &mut guard);
            // Whatever happened, a List with a record nobody can read removed nothing.
            if r.rejected.contains(&"structural") {
                prop_assert_eq!(r.counts.removed, 0);
            }
            prop_assert_eq!(inv.len() + r.counts.removed, 4 + r.counts.inserted);
        }
    }
}
